#!/usr/bin/env bash
# bcast_check.sh — the checkpoint broadcast on a GPU machine (H100/H200, CUDA 13): builds with
# CUDA, then
#  1. correctness: the demo model's checkpoint, BF16 (quantized to FP8 on the readers' GPU) and
#     FP8 (values and scales passed through), read by 2 reader processes that copy their reads
#     to GPU 0, into 4 rollout agents holding GPU memory (GPU 1 when there is one, else GPU 0),
#     over CUDA IPC; every rollout byte checked against the CPU reference (wb-ctl verify) and
#     every write's XXH3 checked at its rollout;
#  2. the benchmark to GPU memory: build/bench/bcast_bench with one reader on GPU 0 and one
#     rollout on the other GPU (or the same one), over CUDA IPC, cold and warm, against a plain
#     sequential read of the same files in the same run (the ratio the README quotes).
#
# Usage: scripts/gpu/bcast_check.sh [--keep] [--reps N]   (--keep: leave the logs directory)
# Assumes the build's libraries are reachable (scripts/gpu/env.sh). Exits non-zero when a
# broadcast fails or any byte differs; timings never fail it.
set -uo pipefail
cd "$(dirname "$0")/../.."
keep=0 reps=5
while [ $# -gt 0 ]; do
    case "$1" in
    --keep) keep=1 ;;
    --reps)
        reps=$2
        shift
        ;;
    -h | --help)
        sed -n '2,16p' "$0"
        exit 0
        ;;
    *)
        echo "usage: scripts/gpu/bcast_check.sh [--keep] [--reps N]" >&2
        exit 2
        ;;
    esac
    shift
done
root=$(pwd)
bin=$root/build/bin
jobs=$(nproc 2>/dev/null || echo 4)
tmp=$(mktemp -d /tmp/bcast_check.XXXXXX)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
    wait 2>/dev/null
    [ $keep -eq 1 ] && echo "logs: $tmp" || rm -rf "$tmp"
}
trap cleanup EXIT
export WB_TOKEN=bcast-check-$RANDOM$RANDOM

echo "== build (make CUDA=1 all bench)"
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader 2>/dev/null ||
    true
if ! make -j"$jobs" CUDA=1 all bench >"$tmp/build.log" 2>&1; then
    tail -n 40 "$tmp/build.log"
    echo "bcast_check: build failed"
    exit 1
fi
ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || echo 0)
if [ "$ngpu" -lt 1 ]; then
    echo "bcast_check: no GPU"
    exit 1
fi
rgpu=$((ngpu > 1 ? 1 : 0))
failed=()

# demo FORM: write the demo checkpoint, broadcast it (2 readers on GPU 0 -> 4 rollouts on GPU
# $rgpu, cudaipc), verify every byte.
demo() {
    local form=$1 dir=$tmp/demo-$1
    mkdir -p "$dir/dump"
    local url=tcp://127.0.0.1:$((21000 + RANDOM % 20000))
    "$bin/wb-ckpt-write" --model configs/models/qwen3_moe.yaml \
        --config configs/jobs/demo/config.json --out "$dir/ckpt" --files 3 --form "$form" \
        >"$dir/write.log" 2>&1 || {
        cat "$dir/write.log"
        failed+=("demo $form: write")
        return
    }
    sed "s|^provider: .*|provider: cudaipc|; s|^listen: .*|listen: $url|; \
s|rules: \.\./|rules: $root/configs/|; s|hf_config: demo/|hf_config: $root/configs/jobs/demo/|; \
s|rollout_layout: broadcast/|rollout_layout: $root/configs/jobs/broadcast/|" \
        configs/jobs/broadcast.yaml >"$dir/job.yaml"
    "$bin/wb-broadcast" --checkpoint "$dir/ckpt" --job "$dir/job.yaml" --progress plain \
        --wait 120s >"$dir/coord.log" 2>&1 &
    local coord=$!
    pids+=($coord)
    local agents=()
    for r in 0 1; do
        "$bin/wb-broadcast" --reader --checkpoint "$dir/ckpt" --controller "$url" --rank $r \
            --readers 2 --device 0 >"$dir/reader$r.log" 2>&1 &
        agents+=($!)
    done
    for r in 0 1 2 3; do
        "$bin/wb-agent" --role rollout --rank $r --controller "$url" --device $rgpu \
            --dump "$dir/dump" >"$dir/rollout$r.log" 2>&1 &
        agents+=($!)
    done
    pids+=("${agents[@]}")
    if ! wait $coord; then
        cat "$dir/coord.log"
        failed+=("demo $form: broadcast")
        return
    fi
    for p in "${agents[@]}"; do wait "$p"; done
    grep -v '^wb-broadcast: \[' "$dir/coord.log"
    if ! "$bin/wb-ctl" verify --config "$dir/job.yaml" --dump "$dir/dump" --version 1; then
        failed+=("demo $form: verify")
    fi
}

echo "== correctness: the demo checkpoint, 2 readers on GPU 0 -> 4 rollouts on GPU $rgpu (cudaipc)"
demo model
demo fp8

echo "== bcast_bench: 1 reader on GPU 0 -> 1 rollout on GPU $rgpu, to GPU memory"
for prov in cudaipc tcp; do
    if ! build/bench/bcast_bench --dir "$tmp/bench" --device 0 --rollout-device $rgpu \
        --provider $prov --reps "$reps"; then
        failed+=("bench $prov")
    fi
done
echo "== bcast_bench: the same from host memory to host memory, for comparison"
build/bench/bcast_bench --dir "$tmp/bench" --provider shm --reps "$reps" || failed+=("bench shm")

if [ ${#failed[@]} -gt 0 ]; then
    echo "bcast_check: FAILED: ${failed[*]}"
    exit 1
fi
echo "bcast_check: every byte verified"
