#!/usr/bin/env bash
# plan_ab.sh — interleaved timings of two builds of the planner: plan_bench (Kimi-K2 256 ->
# 128, median plan time per mode) and `wb-plan --estimate --verify` on Kimi-K2 1024 -> 512
# (wall time), A, B, A, B ... N times each; prints every run and the medians.
#   scripts/plan_ab.sh BUILD_A BUILD_B [N]     (build dirs holding bin/wb-plan and
#                                              bench/plan_bench; run from the repository root)
a=$1 b=$2 n=${3:-5}
c=configs
big=(--model $c/models/deepseek_v3.yaml --config $c/hf/Kimi-K2-Instruct.json
     --trainer $c/clusters/kimi-k2-trainer-1024.yaml --rollout $c/clusters/kimi-k2-rollout-512.yaml
     --estimate --verify)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
one() { # label build
    local out
    out=$("$2/bench/plan_bench" 2>&1)
    local pa pg
    pa=$(awk '/^mode auto/ { for (i = 1; i <= NF; i++) if ($i == "plan") print $(i + 1) }' <<<"$out")
    pg=$(awk '/^mode gather/ { for (i = 1; i <= NF; i++) if ($i == "plan") print $(i + 1) }' <<<"$out")
    local t0 t1
    t0=$(date +%s.%N)
    "$2/bin/wb-plan" "${big[@]}" >/dev/null 2>&1 || echo "$1: wb-plan failed" >&2
    t1=$(date +%s.%N)
    local w
    w=$(echo "$t1 - $t0" | bc)
    echo "$1 plan_bench_auto $pa plan_bench_gather $pg estimate_verify_1024 $w"
    echo "$pa" >>"$tmp/$1.auto"
    echo "$pg" >>"$tmp/$1.gather"
    echo "$w" >>"$tmp/$1.big"
}
for i in $(seq "$n"); do
    one A "$a"
    one B "$b"
done
med() { sort -g "$1" | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
for k in auto gather big; do
    echo "median $k: A $(med "$tmp/A.$k") s, B $(med "$tmp/B.$k") s"
done
