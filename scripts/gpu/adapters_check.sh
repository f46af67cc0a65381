#!/usr/bin/env bash
# adapters_check.sh — weightbridge.vllm's rollout path with PyTorch on a lent GPU machine (vLLM
# itself is not installable there): builds with CUDA, then runs scripts/gpu/adapters_check.py
# (a torch stand-in of vLLM's MLA model on the GPU, registered through weightbridge.vllm, CUDA
# graphs reading the derived tensors checked after every version, every byte verified).
# Usage: . scripts/gpu/env.sh; scripts/gpu/adapters_check.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
jobs=$(nproc 2>/dev/null || echo 8)
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader 2>/dev/null || true
if ! make -j"$jobs" CUDA=1 all >/tmp/adapters_check_build.log 2>&1; then
    tail -n 40 /tmp/adapters_check_build.log
    echo "adapters_check: build failed"
    exit 1
fi
export WB_LIBRARY=$PWD/build/lib/libweightbridge.so WB_BIN=$PWD/build/bin
exec python3 scripts/gpu/adapters_check.py "$@"
