#!/usr/bin/env bash
# plan_audit_test.sh — the plan's JSON (wb-plan --json --tables) audited on its own by
# tests/sh/plan_audit.py (Python 3 standard library, none of the planner's code): every rollout
# byte written exactly once, every write's and op's source held by its rank, the sizes
# consistent, every amax exchange mirrored, and every write carrying what the match puts where
# it lands (the component map and the rollout side's global boxes in the JSON). On the demo in
# both modes, on broken copies of the demo's JSON -- 11 kinds of planted error, each of which
# must fail the check it breaks, naming the problem: 7 that break where bytes go or come from,
# and 4 that keep every byte counted once and mean the wrong thing (two writes' destinations
# swapped, layer 1's q_proj written into layer 0's qkv_proj, a quantization ignoring the amax
# its owners exchanged, TP rank 0's slab written to rank 1 and back) --, on gpt-oss's
# transposed experts (permute ops, FSDP shards of the moved dims, gather mode) and a copy of
# one of its plans whose permute op keeps the dims in order, and on Kimi-K2 256 -> 128 (10.5M
# writes).
# Run from the repository root (make test does); wb-plan from $WB_BIN (default build/bin).
# Prints the harness tally.
bin=${WB_BIN:-build/bin}/wb-plan
audit=tests/sh/plan_audit.py
pass=0 fail=0 skip=0
ok() { echo "ok $1"; pass=$((pass + 1)); }
bad() { echo "FAIL $1"; fail=$((fail + 1)); }
if [ ! -x "$bin" ] || [ ! -f "$audit" ] || ! command -v python3 >/dev/null; then
    echo "skipped: needs $bin, $audit and python3"
    echo "0 passed, 0 failed, 1 skipped"
    exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
demo=(--model configs/models/qwen3_moe.yaml --config configs/jobs/demo/config.json
      --trainer configs/jobs/demo/trainer.yaml --rollout configs/jobs/demo/rollout.yaml
      --mem-cap 4MiB)

# a plan the auditor must pass
audits_clean() { # name, wb-plan arguments...
    local name=$1
    shift
    echo "$name ..."
    if ! "$bin" "$@" --json "$tmp/$name.json" --tables >"$tmp/$name.out" 2>&1; then
        sed 's/^/    /' "$tmp/$name.out"
        bad "$name"
        return
    fi
    if python3 "$audit" "$tmp/$name.json" >"$tmp/$name.audit" 2>&1 &&
        [ "$(tail -n 1 "$tmp/$name.audit")" = "6 passed, 0 failed, 0 skipped" ]; then
        ok "$name"
    else
        sed 's/^/    /' "$tmp/$name.audit"
        bad "$name"
    fi
}

# a broken copy of the demo's JSON: the auditor must fail, with this check and this line
catches() { # name, expected FAIL line, expected problem line, python mutating `d` ($src: the plan)
    local name=$1 want=$2 line=$3 code=$4
    echo "$name ..."
    python3 - "$tmp/${src:-demo_auto}.json" "$tmp/$name.json" <<EOF
import json, sys
d = json.load(open(sys.argv[1]))
$code
json.dump(d, open(sys.argv[2], "w"))
EOF
    python3 "$audit" "$tmp/$name.json" >"$tmp/$name.audit" 2>&1
    rc=$?
    if [ $rc -eq 1 ] && grep -qxF "$want" "$tmp/$name.audit" && grep -qxF "    $line" "$tmp/$name.audit"; then
        ok "$name"
    else
        echo "    exit $rc; expected the lines '$want' and '    $line' in:"
        sed 's/^/    /' "$tmp/$name.audit"
        bad "$name"
    fi
}

audits_clean demo_auto "${demo[@]}"
audits_clean demo_gather "${demo[@]}" --mode gather
if [ -f "$tmp/demo_auto.json" ]; then
    # rank 0's first write past the start of its tensor lands one byte early: one byte written
    # twice, one never
    catches write_overlaps "FAIL coverage (2 problems)" \
        "rollout rank 0 model.layers.0.self_attn.qkv_proj.weight: bytes [65535, 65536) written twice" '
W = d["tables"][0]["writes"]
i = next(i for i in range(0, len(W), 9) if W[i + 4] > 0)
W[i + 4] -= 1'
    # a write reads TMP bytes no op of its task produced
    catches write_source "FAIL sources (1 problem)" \
        "rank 1 write 0 (to rank 0 model.embed_tokens.weight +131072) reads bytes it does not hold" '
d["tables"][1]["writes"][1] += 1 << 30'
    # an op reads the shard of a tensor its rank holds none of (expert 2 lives on ep rank 1)
    catches param_not_owned "FAIL sources (1 problem)" \
        "rank 0 op 0 (quant of model.layers.0.self_attn.q_proj.weight) reads bytes the rank does not hold" '
names = [x[0] for x in d["trainer_tensors"]]
d["tables"][0]["ops"][0][2][1] = names.index("model.layers.0.mlp.experts.2.gate_proj.weight")'
    # a task says it writes one byte more than its writes do
    catches task_bytes "FAIL sizes (1 problem)" \
        "rank 2 task 0: writes sum to 131072 bytes, write_bytes says 131073" '
d["tables"][2]["tasks"][0][6] += 1'
    # rank 0's first amax exchange says its partial lands 16 bytes further in rank 1's inbox
    # than rank 1 expects it, then an exchange whose mirror lost its tag
    catches amax_inbox "FAIL amax (1 problem)" "tag 1: ranks 0 and 1 do not mirror each other" '
op = next(o for o in d["tables"][0]["ops"] if o[0] == "amax")
op[8][3] += 16'
    catches amax_no_mirror "FAIL amax (2 problems)" "tag 1: 1 exchanges carry it, not 2 (ranks [0])" '
op = next(o for o in d["tables"][1]["ops"] if o[0] == "amax")
op[8][1] = 1 << 20'
    # two shards of a class overlap
    catches shards_overlap "FAIL shards (2 problems)" "shard class 0: shards 0 and 1 overlap" '
c = d["shard_classes"][0]
c[1][0][0] -= 1'
    # what shapes and counts cannot see. Rank 0's task for layer 0's qkv_proj writes q, k
    # and v (FP8) at +0, +65536 and +98304: k's and v's destinations swapped
    catches swapped_destinations "FAIL meaning (2 problems)" \
        "rank 0 write 22 (to rank 0 model.layers.0.self_attn.qkv_proj.weight +98304): holds model.layers.0.self_attn.k_proj.weight [0, 0], the mapping puts model.layers.0.self_attn.v_proj.weight [0, 0] there" '
W = d["tables"][0]["writes"]
W[9 * 22 + 4], W[9 * 24 + 4] = W[9 * 24 + 4], W[9 * 22 + 4]'
    # that task quantizes layer 1's q_proj (rank 0 holds the same shard of it) into layer 0's
    catches wrong_layer "FAIL meaning (2 problems)" \
        "rank 0 write 20 (to rank 0 model.layers.0.self_attn.qkv_proj.weight +0): holds model.layers.1.self_attn.q_proj.weight [0, 0], the mapping puts model.layers.0.self_attn.q_proj.weight [0, 0] there" '
names = [x[0] for x in d["trainer_tensors"]]
op = d["tables"][0]["ops"][0]
op[1] = op[2][1] = names.index("model.layers.1.self_attn.q_proj.weight")'
    # k_proj's 128-row block is cut by the FSDP shards: its quantization drops the shared amax
    catches amax_ignored "FAIL meaning (1 problem)" \
        "rank 0 op 2 (quant of model.layers.0.self_attn.k_proj.weight [[0, 64], [0, 256]]): covers part of FP8 block row 0 of dim 0 and quantizes it with no shared amax (amax_off -1)" '
d["tables"][0]["ops"][2][8] = -1'
    # o_proj's column slabs of TP ranks 0 and 1 (same local offset and length) go to the
    # other rank
    catches wrong_rank "FAIL meaning (2 problems)" \
        "rank 0 write 26 (to rank 1 model.layers.0.self_attn.o_proj.weight +0): holds model.layers.0.self_attn.o_proj.weight [0, 0], the mapping puts model.layers.0.self_attn.o_proj.weight [0, 256] there" '
W = d["tables"][0]["writes"]
W[9 * 26 + 2], W[9 * 28 + 2] = 1, 0'
else
    for n in write_overlaps write_source param_not_owned task_bytes amax_inbox amax_no_mirror \
        shards_overlap swapped_destinations wrong_layer amax_ignored wrong_rank; do bad $n; done
fi
# gpt-oss's transposed experts (a 1-layer config with hidden = intermediate = 256): 3 FSDP
# trainers cutting the dims the transpose moves, and 2 cutting the experts, into TP 2
python3 - "$tmp" <<'EOF'
import json, sys
c = json.load(open("configs/hf/gpt-oss-20b.json"))
c.pop("quantization_config")
c.update(num_hidden_layers=1, hidden_size=256, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2,
         head_dim=64, vocab_size=512, num_local_experts=4, experts_per_token=2, layer_types=["sliding_attention"],
         rope_scaling=None)
json.dump(c, open(sys.argv[1] + "/oss.json", "w"))
mesh = "world_size: %d\nmesh:\n  - {name: d0, size: %d}\nplacements:\n"
moved = '  - match: "*.gate_up_proj"\n    place: {d0: shard(2)}\n  - match: "*.down_proj"\n    place: {d0: shard(1)}\n'
rest = '  - match: "*"\n    place: {d0: shard(0)}\n'
open(sys.argv[1] + "/oss_moved.yaml", "w").write(mesh % (3, 3) + moved + rest)
open(sys.argv[1] + "/oss_experts.yaml", "w").write(mesh % (2, 2) + rest)
open(sys.argv[1] + "/oss_tp2.yaml", "w").write("replicas: 1\ngpus_per_replica: 2\ntp: 2\n")
EOF
oss=(--model configs/models/gpt_oss.yaml --config "$tmp/oss.json" --rollout "$tmp/oss_tp2.yaml")
audits_clean gpt_oss_moved_direct "${oss[@]}" --trainer "$tmp/oss_moved.yaml" --mode direct
audits_clean gpt_oss_moved_gather "${oss[@]}" --trainer "$tmp/oss_moved.yaml" --mode gather
audits_clean gpt_oss_experts "${oss[@]}" --trainer "$tmp/oss_experts.yaml" --mode direct
if [ -f "$tmp/gpt_oss_experts.json" ]; then
    # rank 0's shard of down_proj is 2 square experts: a permute op that keeps the dims in
    # order fits every extent, and what it writes is down_proj untransposed
    src=gpt_oss_experts catches permute_untransposed "FAIL meaning (2 problems)" \
        "rank 0 write 26 (to rank 0 model.layers.0.mlp.experts.w2_weight +0): holds model.layers.0.mlp.experts.down_proj [0, 0, 0] permuted [0, 1, 2], the mapping puts model.layers.0.mlp.experts.down_proj [0, 0, 0] permuted [0, 2, 1] there" '
names = [x[0] for x in d["trainer_tensors"]]
op = next(o for o in d["tables"][0]["ops"] if o[0] == "permute" and names[o[1]].endswith(".down_proj"))
op[6] = [0, 1, 2]'
else
    bad permute_untransposed
fi
# the shipped Kimi-K2 scenario, the default mode
audits_clean kimi_k2_256_128 --model configs/models/deepseek_v3.yaml \
    --config configs/hf/Kimi-K2-Instruct.json --trainer configs/clusters/kimi-k2-trainer-256.yaml \
    --rollout configs/clusters/kimi-k2-rollout-128.yaml
echo "$pass passed, $fail failed, $skip skipped"
[ "$fail" -eq 0 ]
