#!/usr/bin/env bash
# bcast_check.sh — the checkpoint broadcast on a GPU machine (H100/H200, CUDA 13): builds with
# CUDA, then
#  1. correctness: the demo model's checkpoint, BF16 (quantized to FP8 on the readers' GPU) and
#     FP8 (values and scales passed through), read by 2 reader processes that copy their reads
#     to GPU 0, into 4 rollout agents holding GPU memory (GPU 1 when there is one, else GPU 0),
#     over CUDA IPC; every rollout byte checked against the CPU reference (wb-ctl verify) and
#     every write's checksum (wb_sum64) checked at its rollout;
#  2. the benchmark to GPU memory: build/bench/bcast_bench with one reader on GPU 0 and one
#     rollout on the other GPU (or the same one), over CUDA IPC, cold and warm, against a plain
#     sequential read of the same files in the same run (the ratio the README quotes).
#
# Usage: scripts/gpu/bcast_check.sh [--keep] [--reps N] [--no-build] [--config CONFIG.json]
#                                   [--providers "cudaipc tcp"] [--no-host] [--no-bench]
#   --keep: leave the logs directory; --no-build: use the programs already in build/ (carried
#   from a CUDA build elsewhere); --config: the benchmark's Qwen3 checkpoint (default the 1.28 GB
#   tests/fixtures/ckpt/qwen3-1g.json; bench/qwen3-9g.json is 9.13 GB); --providers: the
#   benchmark's transports to GPU memory; --no-host: skip the host-memory comparison;
#   --no-bench: only the correctness part.
# Assumes the build's libraries are reachable (scripts/gpu/env.sh). Exits non-zero when a
# broadcast fails or any byte differs; timings never fail it.
set -uo pipefail
cd "$(dirname "$0")/../.."
keep=0 reps=5 build=1 config=tests/fixtures/ckpt/qwen3-1g.json providers="cudaipc tcp" host=1 bench=1
while [ $# -gt 0 ]; do
    case "$1" in
    --keep) keep=1 ;;
    --reps)
        reps=$2
        shift
        ;;
    --no-build) build=0 ;;
    --config)
        config=$2
        shift
        ;;
    --providers)
        providers=$2
        shift
        ;;
    --no-host) host=0 ;;
    --no-bench) bench=0 ;;
    -h | --help)
        sed -n '2,22p' "$0"
        exit 0
        ;;
    *)
        echo "usage: scripts/gpu/bcast_check.sh [--keep] [--reps N] [--no-build] [--config F]" \
            "[--providers LIST] [--no-host] [--no-bench]" >&2
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

nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader 2>/dev/null ||
    true
[ $build -eq 1 ] && echo "== build (make CUDA=1 all bench)"
if [ $build -eq 1 ] && ! make -j"$jobs" CUDA=1 all bench >"$tmp/build.log" 2>&1; then
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
    local url=tcp://127.0.0.1:$((21000 + RANDOM % 11000))
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

[ $bench -eq 1 ] && echo "== bcast_bench: 1 reader on GPU 0 -> 1 rollout on GPU $rgpu, to GPU memory"
[ $bench -eq 1 ] || providers="" host=0
for prov in $providers; do
    if ! build/bench/bcast_bench --dir "$tmp/bench" --model configs/models/qwen3.yaml \
        --config "$config" --device 0 --rollout-device $rgpu --provider $prov --reps "$reps"; then
        failed+=("bench $prov")
    fi
done
[ $host -eq 0 ] || echo "== bcast_bench: the same from host memory to host memory, for comparison"
[ $host -eq 0 ] || build/bench/bcast_bench --dir "$tmp/bench" --model configs/models/qwen3.yaml \
    --config "$config" --provider shm --reps "$reps" || failed+=("bench shm")

if [ ${#failed[@]} -gt 0 ]; then
    echo "bcast_check: FAILED: ${failed[*]}"
    exit 1
fi
echo "bcast_check: every byte verified"
