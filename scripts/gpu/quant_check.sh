#!/usr/bin/env bash
# quant_check.sh — checks quant/ on a GPU machine (H100/H200, CUDA 13, PyTorch): builds with
# CUDA, runs the quant unit tests (CPU reference, and every kernel against it byte for byte),
# the e4m3 encoders on all 2^32 FP32 inputs (GPU, CPU, NVIDIA's host conversion), the kernels
# against PyTorch's reference (scripts/gpu/quant_check.py), and the benchmark table
# (bench/quant_bench + scripts/gpu/quant_bench.py: ours, copy, torch eager, torch.compile).
#
# Usage: scripts/gpu/quant_check.sh [--quick]     (--quick: no 7168x18432 PyTorch comparison)
# Assumes the build's libraries are reachable (CPATH/LIBRARY_PATH/LD_LIBRARY_PATH) and python3
# has torch. Exits non-zero when a test fails or any byte differs; timings never fail it.
set -uo pipefail
cd "$(dirname "$0")/../.."
quick=""
case "${1:-}" in
--quick) quick=--quick ;;
"") ;;
-h | --help)
    sed -n '2,10p' "$0"
    exit 0
    ;;
*)
    echo "usage: scripts/gpu/quant_check.sh [--quick]" >&2
    exit 2
    ;;
esac
export PYTHONUNBUFFERED=1
jobs=$(nproc 2>/dev/null || echo 4)
tmp=$(mktemp -d /tmp/quant_check.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
failed=()

echo "== build (make CUDA=1)"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || true
targets="build/tests/quant build/tests/quant_copy build/tests/quant_gpu build/bench/quant_bench build/bench/quant_tool"
if ! make -j"$jobs" CUDA=1 $targets >"$tmp/build.log" 2>&1; then
    tail -n 40 "$tmp/build.log"
    echo "quant_check: build failed"
    exit 1
fi

echo "== unit tests: CPU reference, and every kernel against it (quant_gpu)"
tests/run.sh build/tests quant || failed+=("unit tests")

echo "== e4m3 encoders on all 2^32 FP32 inputs"
build/bench/quant_tool encode-all --threads "$jobs" || failed+=("encode-all")

echo "== kernels against PyTorch"
python3 scripts/gpu/quant_check.py --tool build/bench/quant_tool $quick || failed+=("PyTorch comparison")

echo "== benchmark"
if build/bench/quant_bench --tsv "$tmp/bench.tsv"; then
    python3 scripts/gpu/quant_bench.py --tsv "$tmp/bench.tsv" || failed+=("benchmark (PyTorch side)")
else
    failed+=("benchmark")
fi

echo
if [ ${#failed[@]} -eq 0 ]; then
    echo "quant_check: PASS"
else
    echo "quant_check: FAIL: ${failed[*]}"
    exit 1
fi
