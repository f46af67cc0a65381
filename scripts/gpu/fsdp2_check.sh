#!/usr/bin/env bash
# fsdp2_check.sh — issue #35's case on a lent GPU machine: builds with CUDA, then runs
# scripts/gpu/fsdp2_check.py (torchrun --nproc_per_node 2 FSDP2 trainers of a transformers Qwen3,
# fully_shard per layer then the model, the layout derived from their DTensor placements -> one
# rollout process on GPU 1 over CUDA IPC; BF16 and FP8 rollouts, 4 layers, 5 versions, every
# rollout byte of every version against the trainers' full parameters). With one GPU the two
# trainer processes and the rollout share it (gloo; the trainers perturb their shards in place
# instead of a training step: fsdp2_check.py says why). Prints "case X: 0 of N bytes differ" per case and
# exits non-zero on any difference or failure.
# Usage: . scripts/gpu/env.sh; scripts/gpu/fsdp2_check.sh [--build DIR] [--case bf16|fp8|all]
#        [--layers N] [--versions N] [--timeout S] [--mesh 2|RxS]
#   --mesh RxS: HSDP, R replicas each FSDP2-sharded over S ranks (R*S trainer processes; more
#   processes than GPUs share them over gloo); every trainer rank must write some bytes (the
#   balancer takes sources from every replica).
#   --build DIR: run another build's library and programs (DIR/lib, DIR/bin; e.g. a checkout of
#   the code before the fix, built with make CUDA=1) instead of building this checkout.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
build=""
if [ "${1:-}" = "--build" ]; then
    build=${2:?--build needs a directory}
    shift 2
fi
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader 2>/dev/null || true
if [ -z "$build" ]; then
    jobs=$(nproc 2>/dev/null || echo 8)
    if ! make -j"$jobs" CUDA=1 all >/tmp/fsdp2_check_build.log 2>&1; then
        tail -n 40 /tmp/fsdp2_check_build.log
        echo "fsdp2_check: build failed"
        exit 1
    fi
    build=$PWD/build
fi
build=$(cd "$build" && pwd)
if [ ! -f "$build/lib/libweightbridge.so" ] || [ ! -x "$build/bin/wb-controller" ]; then
    echo "fsdp2_check: $build has no lib/libweightbridge.so and bin/wb-controller"
    exit 1
fi
export WB_LIBRARY=$build/lib/libweightbridge.so WB_BIN=$build/bin NCCL_NVLS_ENABLE=0
exec python3 scripts/gpu/fsdp2_check.py "$@"
