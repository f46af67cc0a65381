#!/usr/bin/env bash
# semantic_test.sh — `wb-match --check-semantics` (matcher/semantic/): each shipped family's tiny
# model moved by the real programs (wb-match, wb-broadcast's planner and readers, wb-agent
# rollouts, libfabric tcp) into a rollout of TP 2, and one forward over the trainer's tensors
# read as Hugging Face reads them against the same forward over each rank's tensors read as
# vLLM reads them, into a BF16 and an FP8 rollout; then family files that wb-match accepts but
# that mean the wrong thing -- k and v swapped, gate and up swapped (dense, and the experts'
# w13 halves), q/k/v in another order, a square matrix transposed, Phi-3's fused tensors split
# as wholes -- each failing the check with the tensor named (the exact last line). The trainer
# namings other than hf are checked too (each shipped one passes; a Megatron linear_qkv or
# linear_fc1 split without its groups fails). Run from the repository root (make test does);
# the programs from $WB_BIN (default build/bin). Prints the harness tally.
bin=${WB_BIN:-build/bin}
pass=0 fail=0 skip=0
ok() { echo "ok semantic $1"; pass=$((pass + 1)); }
bad() { echo "FAIL semantic $1"; fail=$((fail + 1)); }
py=
for p in "${WB_PYTHON:-}" python3 /usr/bin/python3; do
    [ -n "$p" ] && command -v "$p" >/dev/null && "$p" -c 'import numpy' 2>/dev/null && py=$p && break
done
if [ ! -x "$bin/wb-match" ] || [ -z "$py" ]; then
    echo "skipped: needs $bin/wb-match and a python3 with numpy (Debian: python3-numpy)"
    echo "0 passed, 0 failed, 1 skipped"
    exit 0
fi
export WB_PYTHON=$py
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# check NAME WANT_LAST_LINE ARGS...: the check's last line must be WANT; a passing check must
# also have compared both rollouts (or said why FP8 was skipped)
check() {
    local name=$1 want=$2
    shift 2
    echo "semantic $name ..."
    "$bin/wb-match" --check-semantics "$@" >"$tmp/$name.out" 2>&1
    local rc=$? last
    last=$(tail -n 1 "$tmp/$name.out")
    local wrc=1
    [ "$want" = "semantic check passed" ] && wrc=0
    if [ "$last" = "$want" ] && [ $rc -eq $wrc ]; then
        ok "$name"
    else
        sed 's/^/    /' "$tmp/$name.out"
        echo "    exit $rc; expected exit $wrc and the last line: $want"
        bad "$name"
    fi
}

passes() { # NAME ARGS...: both rollouts checked, every weight equal (BF16) or within E4M3
    local name=$1
    shift
    check "$name" "semantic check passed" "$@"
    if [ -f "$tmp/$name.out" ] && { ! grep -q "every value equal to the trainer's" "$tmp/$name.out" ||
        ! grep -q "every value within E4M3 rounding of the trainer's" "$tmp/$name.out"; }; then
        echo "    $name: a rollout was not compared weight by weight"
        pass=$((pass - 1))
        bad "$name (both rollouts)"
    fi
}

c=configs
# the shipped families
passes qwen3 --family $c/models/qwen3.yaml --config $c/hf/Qwen3-8B.json
passes qwen3_moe --family $c/models/qwen3_moe.yaml --config $c/hf/Qwen3-30B-A3B.json
passes deepseek_v3_mtp --family $c/models/deepseek_v3.yaml --config $c/hf/DeepSeek-V3.json --var mtp=1
passes llama3 --family $c/models/llama3.yaml --config $c/hf/Llama-3.1-8B.json
# Phi-3 holds qkv_proj and gate_up_proj fused: its family splits them (split rules)
passes phi3 --family $c/models/phi3.yaml --config $c/hf/Phi-3-mini-4k-instruct.json
# gpt-oss's experts are the HF tensors transposed, which the planner does not plan yet: the
# check stops there, naming the tensor
check gpt_oss "semantic check failed: bf16 rollout: model.layers.0.mlp.experts.w13_weight: built from model.layers.0.mlp.experts.gate_up_proj transposed (permute); the planner does not plan transposes yet (rule $PWD/$c/models/gpt_oss.yaml:111); 3 more mappings like it" \
    --family $c/models/gpt_oss.yaml --config $c/hf/gpt-oss-20b.json
# the other trainer namings (configs/models/README.md): the tiny model's Hugging Face values
# written as that naming's framework holds them (matcher/semantic/convert.py: q/k/v interleaved
# per query group, [gate_r; up_r] per trainer TP rank for mesh_tp, the experts fused, the vocab
# padded to 128 x mesh_tp rows), broadcast by the naming's rules, the forward compared with
# Hugging Face's
passes qwen3.megatron --family $c/models/qwen3.yaml --config $c/hf/Qwen3-8B.json --naming megatron --var mesh_tp=2
passes qwen3.megatron_local --family $c/models/qwen3.yaml --config $c/hf/Qwen3-8B.json --naming megatron_local --var mesh_tp=2
passes llama3.megatron --family $c/models/llama3.yaml --config $c/hf/Llama-3.1-8B.json --naming megatron --var mesh_tp=2
passes llama3.megatron_local --family $c/models/llama3.yaml --config $c/hf/Llama-3.1-8B.json --naming megatron_local
passes qwen3_moe.fused --family $c/models/qwen3_moe.yaml --config $c/hf/Qwen3-30B-A3B.json --naming fused
passes qwen3_moe.fused.ep2 --family $c/models/qwen3_moe.yaml --config $c/hf/Qwen3-30B-A3B.json --naming fused --ep 2
passes qwen3_moe.megatron --family $c/models/qwen3_moe.yaml --config $c/hf/Qwen3-30B-A3B.json --naming megatron --var mesh_tp=2
passes qwen3_moe.megatron_local --family $c/models/qwen3_moe.yaml --config $c/hf/Qwen3-30B-A3B.json --naming megatron_local --var mesh_tp=2
# a family file a user might write for Megatron that wb-match accepts and that means the wrong
# thing: linear_qkv split as if it held [all q; all k; all v] (no groups), linear_fc1 as one
# [gate; up] although the trainer's 2 TP ranks each hold [gate_r; up_r] (no groups)
"$py" - "$tmp" <<'EOF'
import sys
d = sys.argv[1]
s = open("configs/models/qwen3.yaml").read()
QKV = """    groups: num_key_value_heads
    split:
      - q: num_attention_heads/num_key_value_heads*head_dim
      - k: head_dim
      - v: head_dim
"""
FC1 = """    groups: mesh_tp
    split: [gate: intermediate_size/mesh_tp, up: intermediate_size/mesh_tp]"""
assert QKV in s and FC1 in s
open(d + "/qkv_ungrouped.yaml", "w").write(s.replace(QKV, """    split:
      - q: num_attention_heads*head_dim
      - k: num_key_value_heads*head_dim
      - v: num_key_value_heads*head_dim
""", 1))
open(d + "/fc1_ungrouped.yaml", "w").write(s.replace(FC1, "    split: [gate: intermediate_size, up: intermediate_size]", 1))
EOF
check qkv_ungrouped "semantic check failed: bf16 rollout: layer 0 q: rollout model.layers.0.self_attn.qkv_proj.weight (rank 1, rows 0:256, as vLLM reads q) differs from trainer model.layers.0.self_attn.q_proj.weight (rows 256:512)" \
    --family "$tmp/qkv_ungrouped.yaml" --config $c/hf/Qwen3-8B.json --naming megatron --var mesh_tp=2 --dtype bf16
check fc1_ungrouped "semantic check failed: bf16 rollout: layer 0 gate: rollout model.layers.0.mlp.gate_up_proj.weight (rank 1, rows 0:256, as vLLM reads gate) differs from trainer model.layers.0.mlp.gate_proj.weight (rows 256:512)" \
    --family "$tmp/fc1_ungrouped.yaml" --config $c/hf/Qwen3-8B.json --naming megatron --var mesh_tp=2 --dtype bf16
# a family written by a user (tests/fixtures: Mixtral), BF16 only: it has no FP8 rules
check mixtral "semantic check passed" --family tests/fixtures/matcher/mixtral.yaml \
    --config tests/fixtures/matcher/Mixtral-8x7B-v0.1.json --dtype bf16

# Phi-3's checkpoint holds qkv_proj and gate_up_proj fused: renamed whole (no split rules), the
# family is right at TP 1 and wrong at TP 2, with every shape vLLM's
f=tests/fixtures/semantic
passes phi3_unsplit_tp1 --family $f/phi3_unsplit.yaml --config $f/Phi-3-mini-4k-instruct.json --tp 1
check phi3_unsplit_tp2 "semantic check failed: bf16 rollout: layer 0 q: rollout model.layers.0.self_attn.qkv_proj.weight (rank 1, rows 0:384, as vLLM reads q) differs from trainer model.layers.0.self_attn.qkv_proj.weight (rows 384:768)" \
    --family $f/phi3_unsplit.yaml --config $f/Phi-3-mini-4k-instruct.json --tp 2 --dtype bf16
# split rules with q and k of different sizes (8 kv heads): the shipped family passes; one whose
# split gives q k's size and k q's (they add up, every shape stays vLLM's) fails at layer 0's q
passes phi3_gqa --family $c/models/phi3.yaml --config $f/phi3-gqa.json
check phi3_split_wrong "semantic check failed: bf16 rollout: layer 0 q: rollout model.layers.0.self_attn.qkv_proj.weight (rank 0, rows 0:768, as vLLM reads q) differs from trainer model.layers.0.self_attn.qkv_proj.weight (rows 0:768)" \
    --family $f/phi3_split_wrong.yaml --config $f/phi3-gqa.json --dtype bf16

# wrong families: the shipped file with one change, accepted by wb-match, every shape as vLLM's
"$py" - "$tmp" <<'EOF'
import sys
d = sys.argv[1]
def rep(src, a, b, out):
    s = open(src).read()
    assert a in s, (src, a)
    open("%s/%s.yaml" % (d, out), "w").write(s.replace(a, b, 1))
q, m, l = "configs/models/qwen3.yaml", "configs/models/qwen3_moe.yaml", "configs/models/llama3.yaml"
Q, K, V = ("      - model.layers.{L}.self_attn.%s_proj.weight\n" % x for x in "qkv")
G, U = ("      - model.layers.{L}.mlp.%s_proj.weight\n" % x for x in ("gate", "up"))
GE, UE = ("      - model.layers.{L}.mlp.experts.{E}.%s_proj.weight\n" % x for x in ("gate", "up"))
rep(q, Q + K + V, Q + V + K, "kv_swap")
rep(q, Q + K + V, K + Q + V, "qkv_order")
rep(q, G + U, U + G, "gate_up_swap")
rep(m, GE + UE, UE + GE, "w13_swap")
O = "    from: model.layers.{L}.self_attn.o_proj.weight\n    shard: {tp: 1}\n"
rep(l, O, O.replace("    shard", "    permute: [1, 0]\n    shard"), "transpose")
EOF
for f in kv_swap qkv_order gate_up_swap w13_swap transpose; do
    cfg=$c/hf/Qwen3-8B.json
    [ $f = w13_swap ] && cfg=$c/hf/Qwen3-30B-A3B.json
    [ $f = transpose ] && cfg=$c/hf/Llama-3.1-8B.json
    if ! "$bin/wb-match" --family "$tmp/$f.yaml" --config $cfg >"$tmp/$f.match" 2>&1; then
        sed 's/^/    /' "$tmp/$f.match"
        bad "$f (wb-match should accept it)"
    fi
done
check kv_swap "semantic check failed: bf16 rollout: layer 0 k: rollout model.layers.0.self_attn.qkv_proj.weight (rank 0, rows 256:384, as vLLM reads k) differs from trainer model.layers.0.self_attn.k_proj.weight (rows 0:128)" \
    --family "$tmp/kv_swap.yaml" --config $c/hf/Qwen3-8B.json --dtype bf16
check qkv_order "semantic check failed: bf16 rollout: layer 0 q: rollout model.layers.0.self_attn.qkv_proj.weight (rank 0, rows 0:256, as vLLM reads q) differs from trainer model.layers.0.self_attn.q_proj.weight (rows 0:256)" \
    --family "$tmp/qkv_order.yaml" --config $c/hf/Qwen3-8B.json --dtype bf16
check gate_up_swap "semantic check failed: bf16 rollout: layer 0 gate: rollout model.layers.0.mlp.gate_up_proj.weight (rank 0, rows 0:256, as vLLM reads gate) differs from trainer model.layers.0.mlp.gate_proj.weight (rows 0:256)" \
    --family "$tmp/gate_up_swap.yaml" --config $c/hf/Qwen3-8B.json --dtype bf16
check w13_swap "semantic check failed: bf16 rollout: layer 0 expert 0 gate: rollout model.layers.0.mlp.experts.w13_weight (rank 0, expert 0, rows 0:128, as vLLM reads expert 0 gate) differs from trainer model.layers.0.mlp.experts.0.gate_proj.weight (rows 0:128)" \
    --family "$tmp/w13_swap.yaml" --config $c/hf/Qwen3-30B-A3B.json --dtype bf16
# the FP8 rollout of a swap fails the same way (the values are outside E4M3's rounding)
check kv_swap_fp8 "semantic check failed: fp8 rollout: layer 0 k: rollout model.layers.0.self_attn.qkv_proj.weight (rank 0, rows 256:384, as vLLM reads k) differs from trainer model.layers.0.self_attn.k_proj.weight (rows 0:128)" \
    --family "$tmp/kv_swap.yaml" --config $c/hf/Qwen3-8B.json --dtype fp8
# a square o_proj transposed: the planner refuses transposes, naming it
check transpose "semantic check failed: bf16 rollout: model.layers.0.self_attn.o_proj.weight: built from model.layers.0.self_attn.o_proj.weight transposed (permute); the planner does not plan transposes yet (rule $tmp/transpose.yaml:112); 1 more mapping like it" \
    --family "$tmp/transpose.yaml" --config $c/hf/Llama-3.1-8B.json --dtype bf16
echo "$pass passed, $fail failed, $skip skipped"
[ "$fail" -eq 0 ]
