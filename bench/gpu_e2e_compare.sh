#!/usr/bin/env bash
# gpu_e2e_compare.sh — bench/gpu_e2e.py for this checkout and for another one (an earlier
# commit's, built there), interleaved on the same machine in one run, so that a change's cost
# is read against a baseline measured beside it: colocated and (with two GPUs) GPU 0 -> GPU 1,
# best of N versions each, every run's last version checked byte for byte.
# On a lent GPU machine first: . scripts/gpu/env.sh
# Usage: bench/gpu_e2e_compare.sh --base DIR [--rounds R] [--model m9] [--versions N] [--no-build]
#   --base DIR: the other checkout (e.g. `git worktree add DIR <commit>`), built here unless
#   --no-build. Prints each round's "complete in" lines and, last, the medians side by side.
set -uo pipefail
cd "$(dirname "$0")/.."
here=$(pwd)
base="" rounds=2 model=m9 versions=5 build=1
while [ $# -gt 0 ]; do
    case "$1" in
    --base)
        base=$(cd "$2" && pwd) || exit 2
        shift
        ;;
    --rounds)
        rounds=$2
        shift
        ;;
    --model)
        model=$2
        shift
        ;;
    --versions)
        versions=$2
        shift
        ;;
    --no-build) build=0 ;;
    -h | --help)
        sed -n '2,10p' "$0"
        exit 0
        ;;
    *)
        echo "usage: bench/gpu_e2e_compare.sh --base DIR [--rounds R] [--model M] [--versions N]" >&2
        exit 2
        ;;
    esac
    shift
done
[ -n "$base" ] || {
    echo "gpu_e2e_compare: --base DIR is required" >&2
    exit 2
}
jobs=$(nproc 2>/dev/null || echo 4)
if [ $build -eq 1 ]; then
    for d in "$here" "$base"; do
        if ! make -C "$d" -j"$jobs" all >"/tmp/gpu_e2e_compare_build.$(basename "$d").log" 2>&1; then
            tail -n 30 "/tmp/gpu_e2e_compare_build.$(basename "$d").log"
            echo "gpu_e2e_compare: build of $d failed"
            exit 1
        fi
    done
fi
export NCCL_NVLS_ENABLE=0
out=$(mktemp -d /tmp/gpu_e2e_compare.XXXXXX)
rc=0
for r in $(seq 1 "$rounds"); do
    for side in base this; do
        d=$here
        [ $side = base ] && d=$base
        echo "== round $r: $side ($d)"
        python3 "$d/bench/gpu_e2e.py" --model "$model" --versions "$versions" \
            --skip torch,pipeline,verified,host 2>&1 | tee "$out/$side.$r.log" |
            grep -E "version [0-9]*: complete in|FAILED|every transfer" || true
        grep -q "every transfer complete" "$out/$side.$r.log" || rc=1
    done
done
# per run, the best version of each configuration ("<model>-direct" colocated, "<model>-2gpu"),
# then the median over the rounds, per side
best() { # file, configuration
    grep -h "  $2 version [0-9]*: complete in" "$1" | sed 's/.*complete in \([0-9.]*\) ms.*/\1/' |
        sort -n | head -n 1
}
median() { sort -n | awk '{a[NR]=$1} END {print (NR ? a[int((NR+1)/2)] : "-")}'; }
for side in base this; do
    colo=$(for f in "$out"/$side.*.log; do best "$f" "$model-direct"; done | median)
    two=$(for f in "$out"/$side.*.log; do best "$f" "$model-2gpu"; done | median)
    echo "$side: colocated ${colo} ms, GPU 0 -> GPU 1 ${two} ms (medians over $rounds rounds of the best of $versions versions)"
done
echo "logs: $out"
exit $rc
