#!/usr/bin/env bash
# megatron_check.sh — Megatron-core trainers (megatron's own GPTModel, TP 2 / PP 2 / EP 2, two
# processes) pushing into a vLLM-layout FP8 rollout on a lent GPU machine: builds with CUDA, then
# runs scripts/gpu/megatron_check.py (every rollout byte of every version against a reference
# computed in the script from megatron's tensors). Megatron-core is not part of weightbridge:
# WB_MEGATRON names a directory holding its megatron/core (default .deb/mcore, where
#   mkdir -p .deb/mcore && git -C <megatron-lm clone> archive HEAD megatron/core | tar -x -C .deb/mcore
# puts it; the run here used megatron-core 0.20.0).
# Usage: . scripts/gpu/env.sh; scripts/gpu/megatron_check.sh [--case tp2|pp2|ep2|all] [--versions N]
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
export WB_MEGATRON=${WB_MEGATRON:-$PWD/.deb/mcore}
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader 2>/dev/null || true
jobs=$(nproc 2>/dev/null || echo 8)
if ! make -j"$jobs" CUDA=1 all >/tmp/megatron_check_build.log 2>&1; then
    tail -n 40 /tmp/megatron_check_build.log
    echo "megatron_check: build failed"
    exit 1
fi
export WB_LIBRARY=$PWD/build/lib/libweightbridge.so WB_BIN=$PWD/build/bin NCCL_NVLS_ENABLE=0
exec python3 scripts/gpu/megatron_check.py "$@"
