#!/usr/bin/env bash
# semantic_check.sh — the semantic check against transformers' own Qwen3 and Qwen3-MoE classes
# on a lent GPU machine (scripts/gpu/semantic_check.py says what it compares). The programs are
# built without CUDA: the check moves host memory; the GPU runs transformers' forward.
# Usage: . scripts/gpu/env.sh; scripts/gpu/semantic_check.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
jobs=$(nproc 2>/dev/null || echo 8)
if ! make -j"$jobs" CUDA=0 all >/tmp/semantic_check_build.log 2>&1; then
    tail -n 40 /tmp/semantic_check_build.log
    echo "semantic_check: build failed"
    exit 1
fi
exec python3 scripts/gpu/semantic_check.py "$@"
