#!/usr/bin/env bash
# plan_hashes.sh — one SHA-256 per shipped layout and mode of `wb-plan --json --tables`, to show
# that a change to the planner leaves every plan byte-identical (compare the output before and
# after; tests/sh/plan_hash_test.sh compares it with tests/sh/plan_hashes.txt).
#   scripts/plan_hashes.sh [WB_PLAN] [--big]
# WB_PLAN defaults to ${WB_BIN:-build/bin}/wb-plan; --big adds Kimi-K2 1024 -> 512 (about a
# minute and a few GB of JSON through the hash). Run from the repository root. Prints
# "<name> <mode> <sha256>" per plan; exits 1 when a plan fails.
bin=${1:-${WB_BIN:-build/bin}/wb-plan}
big=0
[ "${2:-}" = --big ] && big=1
c=configs
plans=(
    "demo|--model $c/models/qwen3_moe.yaml --config $c/jobs/demo/config.json --trainer $c/jobs/demo/trainer.yaml --rollout $c/jobs/demo/rollout.yaml --mem-cap 4MiB"
    "demo-1g|--model $c/models/qwen3_moe.yaml --config $c/jobs/demo/config.json --trainer $c/jobs/demo/trainer.yaml --rollout $c/jobs/demo/rollout.yaml"
    "qwen3-235b-128-32|--model $c/models/qwen3_moe.yaml --config $c/hf/Qwen3-235B-A22B-FP8.json --trainer $c/clusters/qwen3-235b-trainer-128.yaml --rollout $c/clusters/qwen3-235b-rollout-32.yaml"
    "kimi-k2-256-128|--model $c/models/deepseek_v3.yaml --config $c/hf/Kimi-K2-Instruct.json --trainer $c/clusters/kimi-k2-trainer-256.yaml --rollout $c/clusters/kimi-k2-rollout-128.yaml"
)
[ $big = 1 ] && plans+=(
    "kimi-k2-1024-512|--model $c/models/deepseek_v3.yaml --config $c/hf/Kimi-K2-Instruct.json --trainer $c/clusters/kimi-k2-trainer-1024.yaml --rollout $c/clusters/kimi-k2-rollout-512.yaml"
)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
rc=0
for p in "${plans[@]}"; do
    name=${p%%|*}
    args=${p#*|}
    for mode in auto gather; do
        extra=
        # a gather of Kimi-K2's embedding or Qwen3's needs more than the default 1 GiB cap
        [ $mode = gather ] && [ "${name#demo}" = "$name" ] && extra="--mem-cap 4GiB"
        # the JSON through a file (the summary on stdout says how long planning took; wb-plan
        # checks its --json path before planning, so a pipe would not do)
        # shellcheck disable=SC2086 # args is a word list
        if ! "$bin" $args $extra --mode $mode --json "$tmp/plan.json" --tables >"$tmp/out" 2>&1; then
            echo "$name $mode FAILED: $(tail -n 1 "$tmp/out")"
            rc=1
            continue
        fi
        h=$(sha256sum <"$tmp/plan.json")
        rm -f "$tmp/plan.json"
        echo "$name $mode ${h%% *}"
    done
done
exit $rc
