#!/usr/bin/env bash
# naming_test.sh — the trainer namings of the shipped family files (configs/models/README.md,
# `namings`): every naming of qwen3, llama3 and qwen3_moe matches its shipped configs (the
# counts wb-match prints), and wb-plan --verify plans each with the demo layouts (every
# destination byte written once, every source held), with mesh_tp 2 (Megatron's linear_fc1
# grouped per trainer TP rank); wb-match and wb-plan refuse a naming the file does not list,
# naming the file's namings. Run from the repository root (make test does); the programs from
# $WB_BIN (default build/bin). Prints the harness tally.
bin=${WB_BIN:-build/bin}
pass=0 fail=0
c=configs
if [ ! -x "$bin/wb-match" ] || [ ! -x "$bin/wb-plan" ]; then
    echo "skipped: needs $bin/wb-match and $bin/wb-plan"
    echo "0 passed, 0 failed, 1 skipped"
    exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# match NAME WANT ARGS...: wb-match's second line (the kinds) must be WANT
match() {
    local name=$1 want=$2
    shift 2
    "$bin/wb-match" "$@" >"$tmp/out" 2>&1
    local rc=$? got
    got=$(sed -n 2p "$tmp/out")
    if [ $rc -eq 0 ] && [ "$got" = "$want" ]; then
        echo "ok match $name"
        pass=$((pass + 1))
    else
        sed 's/^/    /' "$tmp/out"
        echo "    exit $rc; expected exit 0 and: $want"
        echo "FAIL match $name"
        fail=$((fail + 1))
    fi
}
match qwen3.megatron "  rename 217, fuse 0, stack 0, unstack 0, tie 0, split 74; copy 291, cast 0, fp8-block 0" \
    --family $c/models/qwen3.yaml --config $c/hf/Qwen3-8B.json --naming megatron --var mesh_tp=2
match qwen3.megatron_local.fp8 "  rename 217, fuse 0, stack 0, unstack 0, tie 0, split 74; copy 147, cast 0, fp8-block 144" \
    --family $c/models/qwen3.yaml --config $c/hf/Qwen3-8B-FP8.json --naming megatron_local --var mesh_tp=4
match llama3.megatron "  rename 129, fuse 0, stack 0, unstack 0, tie 0, split 66; copy 195, cast 0, fp8-block 0" \
    --family $c/models/llama3.yaml --config $c/hf/Llama-3.1-8B.json --naming megatron --var mesh_tp=4
match qwen3_moe.fused "  rename 339, fuse 48, stack 0, unstack 0, tie 0, split 48; copy 435, cast 0, fp8-block 0" \
    --family $c/models/qwen3_moe.yaml --config $c/hf/Qwen3-30B-A3B.json --naming fused
match qwen3_moe.megatron.fp8 "  rename 565, fuse 0, stack 188, unstack 0, tie 0, split 96; copy 473, cast 0, fp8-block 376" \
    --family $c/models/qwen3_moe.yaml --config $c/hf/Qwen3-235B-A22B-FP8.json --naming megatron --var mesh_tp=2
match qwen3_moe.megatron_local "  rename 289, fuse 0, stack 96, unstack 0, tie 0, split 50; copy 435, cast 0, fp8-block 0" \
    --family $c/models/qwen3_moe.yaml --config $c/hf/Qwen3-30B-A3B.json --naming megatron_local --var mesh_tp=2
# the hf naming is the default and unchanged
match qwen3_moe.hf "  rename 291, fuse 48, stack 96, unstack 0, tie 0; copy 435, cast 0, fp8-block 0" \
    --family $c/models/qwen3_moe.yaml --config $c/hf/Qwen3-30B-A3B.json

# plan NAME FAMILY CONFIG NAMING: wb-plan --verify with the demo layouts
plan() {
    local name=$1
    "$bin/wb-plan" --model $c/models/$2.yaml --config "$3" --trainer $c/jobs/demo/trainer.yaml \
        --rollout $c/jobs/demo/rollout.yaml --naming "$4" --var mesh_tp=2 --verify >"$tmp/plan" 2>&1
    local rc=$?
    if [ $rc -eq 0 ] && grep -q "verify: ok (every destination byte written once, every source held)" "$tmp/plan"; then
        echo "ok plan $name"
        pass=$((pass + 1))
    else
        sed 's/^/    /' "$tmp/plan"
        echo "FAIL plan $name (exit $rc)"
        fail=$((fail + 1))
    fi
}
for n in hf fused megatron megatron_local; do
    plan qwen3_moe.$n qwen3_moe $c/jobs/demo/config.json $n
done
for n in hf megatron megatron_local; do
    plan qwen3.$n qwen3 $c/hf/Qwen3-8B-FP8.json $n
    plan llama3.$n llama3 $c/hf/Llama-3.1-8B.json $n
done

# refused: a naming the file does not list (exit 1, one line naming the file's namings)
refused() {
    local name=$1 want=$2
    shift 2
    "$bin/$@" >"$tmp/out" 2>&1
    local rc=$?
    if [ $rc -eq 1 ] && grep -qxF -- "$want" "$tmp/out"; then
        echo "ok refused $name"
        pass=$((pass + 1))
    else
        sed 's/^/    /' "$tmp/out"
        echo "    exit $rc; expected exit 1 and the line: $want"
        echo "FAIL refused $name"
        fail=$((fail + 1))
    fi
}
refused wb-match "wb-match: naming 'megatorn': not one of $c/models/qwen3.yaml's namings (hf, megatron, megatron_local)" \
    wb-match --family $c/models/qwen3.yaml --config $c/hf/Qwen3-8B.json --naming megatorn
refused wb-plan "  naming 'fused': not one of $c/models/qwen3.yaml's namings (hf, megatron, megatron_local)" \
    wb-plan --model $c/models/qwen3.yaml --config $c/hf/Qwen3-8B.json --trainer $c/jobs/demo/trainer.yaml \
    --rollout $c/jobs/demo/rollout.yaml --naming fused
echo "$pass passed, $fail failed, 0 skipped"
[ "$fail" -eq 0 ]
