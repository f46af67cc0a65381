#!/usr/bin/env bash
# gpu_e2e.sh — builds (with CUDA when nvcc is there) and runs the end-to-end GPU benchmark
# bench/gpu_e2e.py (its docstring says what it measures). On a lent GPU machine first:
#   . scripts/gpu/env.sh
# Usage: bench/gpu_e2e.sh [--no-build] [--model m9|qwen3-30b|demo ...] [--versions N]
#        [--skip torch,pipeline,verified,host] [--keep DIR]
# --no-build: use the programs already in build/bin (carried from a CUDA build elsewhere).
# The "verified" run is the same job with verify: true (checksums); the summary prints its time
# against the same pipeline without them and the ratio.
set -uo pipefail
cd "$(dirname "$0")/.."
build=1
case "${1:-}" in
-h | --help)
    sed -n '2,9p' "$0"
    exec python3 bench/gpu_e2e.py --help
    ;;
--no-build)
    build=0
    shift
    ;;
esac
jobs=$(nproc 2>/dev/null || echo 4)
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader 2>/dev/null || true
if [ $build -eq 1 ] && ! make -j"$jobs" all >/tmp/gpu_e2e_build.log 2>&1; then
    tail -n 40 /tmp/gpu_e2e_build.log
    echo "gpu_e2e: build failed"
    exit 1
fi
export NCCL_NVLS_ENABLE=0
exec python3 bench/gpu_e2e.py "$@"
