#!/usr/bin/env bash
# sum_check.sh — the write checksums (wb_sum64) on a GPU machine, with programs built elsewhere
# (make -j tests bench with CUDA; build/bin build/tests build/bench carried): the host function
# against its definition written out with plain XXH3 (build/tests/sum), the kernel's batches
# against the host function and a flipped device byte (build/tests/gpu_cuda: sum_batch,
# sum_batch_flip, and the rest of the file), then what the kernel costs (build/bench/sum_bench:
# 1 GiB of device memory in pieces of 4 KiB .. 64 MiB, aligned and not, against a D2D copy).
# The end-to-end cost (a job with verify: true against the same job without) is in
# bench/gpu_e2e.sh --no-build --model m9 (the "with checksums" line).
#
# Usage: . scripts/gpu/env.sh; scripts/gpu/sum_check.sh [--reps N]
# Exits non-zero when a test fails or a sum differs; timings never fail it.
set -uo pipefail
cd "$(dirname "$0")/../.."
reps=5
[ "${1:-}" = "--reps" ] && reps=${2:-5}
for f in build/tests/sum build/tests/gpu_cuda build/bench/sum_bench; do
    if [ ! -x "$f" ]; then
        echo "sum_check: $f missing: build with CUDA first (make -j tests bench)"
        exit 1
    fi
done
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader 2>/dev/null || true
failed=()
echo "== wb_sum64 on the host against its definition (build/tests/sum)"
build/tests/sum || failed+=("sum")
echo "== the kernel's batches against wb_sum64 (build/tests/gpu_cuda)"
out=$(build/tests/gpu_cuda 2>&1)
rc=$?
echo "$out"
[ $rc -eq 0 ] || failed+=("gpu_cuda")
if grep -q '^SKIP gpu_cuda sum_batch' <<<"$out"; then
    failed+=("gpu_cuda skipped: no GPU")
fi
echo "== what it costs (build/bench/sum_bench)"
build/bench/sum_bench --reps "$reps" || failed+=("sum_bench")
if [ ${#failed[@]} -gt 0 ]; then
    echo "sum_check: FAILED: ${failed[*]}"
    exit 1
fi
echo "sum_check: PASS"
