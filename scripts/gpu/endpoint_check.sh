#!/usr/bin/env bash
# endpoint_check.sh — the Python package with real PyTorch models on a lent GPU machine: builds
# with CUDA, then runs scripts/gpu/endpoint_check.py (an FSDP2-sharded transformers Qwen3-MoE
# trainer pushing into a vLLM-layout FP8 rollout, bytes against PyTorch's reference and logits
# of the dequantized model; in two processes and colocated in one). On one GPU every process
# shares it; with two, the trainers are FSDP2 over both.
# Usage: . scripts/gpu/env.sh; [WB_CHECK_MASTERS=fp32] scripts/gpu/endpoint_check.sh [--case two|one|all|large]
# (WB_CHECK_MASTERS=fp32: FP32 trainer parameters, FSDP2 computing in BF16)
set -uo pipefail
cd "$(dirname "$0")/../.."
jobs=$(nproc 2>/dev/null || echo 8)
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader 2>/dev/null || true
if ! make -j"$jobs" CUDA=1 all >/tmp/endpoint_check_build.log 2>&1; then
    tail -n 40 /tmp/endpoint_check_build.log
    echo "endpoint_check: build failed"
    exit 1
fi
export WB_LIBRARY=$PWD/build/lib/libweightbridge.so NCCL_NVLS_ENABLE=0
exec python3 scripts/gpu/endpoint_check.py "$@"
