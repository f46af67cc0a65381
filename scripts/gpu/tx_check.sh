#!/usr/bin/env bash
# tx_check.sh — transport/ on a lent GPU machine (2 GPUs, NVLink): builds, runs the transport
# unit tests and the conformance suite (the cudaipc rows and the bounce/staging rows with GPU
# memory over tcp and shm run here; they are skipped on machines without GPUs), then measures
#   1. CUDA IPC writes GPU0 -> GPU1 against plain cudaMemcpyPeerAsync copies, same run;
#   2. the bounce path: device memory over tcp and shm against a raw fi_writedata loop on host
#      memory, same run.
# Self-contained: sources scripts/gpu/env.sh when the carried Debian packages (.deb/) are there.
# Usage (from the repository root): scripts/gpu/tx_check.sh [--quick]
# Exit status: non-zero when a build or a test failed (benchmarks never decide it).
set -u
cd "$(dirname "$0")/../.."
quick=0
[ "${1:-}" = "--quick" ] && quick=1
if [ -d .deb ] && ls .deb/*.deb >/dev/null 2>&1; then
    # shellcheck disable=SC1091
    . scripts/gpu/env.sh
fi
export PATH=/usr/local/cuda/bin:$PATH
jobs=$(nproc 2>/dev/null || echo 8)
status=0

section() { printf '\n==== %s\n' "$*"; }

section "machine"
nvidia-smi -L 2>&1 || echo "nvidia-smi not available"
nvidia-smi topo -m 2>/dev/null | head -5
nvcc --version 2>/dev/null | tail -1

section "build (CUDA=1)"
mkdir -p build
if ! make -j"$jobs" CUDA=1 tests bench >build/tx-check.log 2>&1; then
    tail -40 build/tx-check.log
    echo "tx_check: build failed (full log: build/tx-check.log)"
    exit 1
fi
echo "built: build/tests/transport build/tests/transport_conf build/bench/tx_bench"

section "unit tests (build/tests/transport)"
build/tests/transport || status=1

section "conformance suite (build/tests/transport_conf): every backend this machine can run"
build/tests/transport_conf || status=1

section "conformance rows that need GPUs (repeated for the summary)"
build/tests/transport_conf ipc_sizes ipc_imm ipc_zero ipc_bounds ipc_eagain ipc_killed \
    tcpgpu_sizes tcpgpu_imm tcpgpu_zero tcpgpu_bounds tcpgpu_eagain tcpgpu_killed \
    shmgpu_sizes shmgpu_imm shmgpu_zero shmgpu_bounds shmgpu_eagain shmgpu_killed \
    2>&1 | grep -E '^(ok|FAIL|SKIP)|passed,' || true

reps=7
sizes=4KiB,64KiB,1MiB,4MiB,16MiB,64MiB
if [ $quick = 1 ]; then
    reps=3
    sizes=64KiB,1MiB,16MiB
fi

section "bandwidth: CUDA IPC GPU0 -> GPU1 vs plain cudaMemcpyPeerAsync (same run)"
build/bench/tx_bench --backend cudaipc --rails 2 --sizes "$sizes" --reps "$reps" --bytes 1GiB ||
    echo "tx_bench cudaipc failed"

section "bandwidth: device memory through the bounce path vs raw fi_writedata on host memory"
build/bench/tx_bench --provider tcp --mem cuda --no-hmem --sizes "$sizes" --reps "$reps" ||
    echo "tx_bench tcp --mem cuda failed"
build/bench/tx_bench --provider shm --mem cuda --no-hmem --sizes "$sizes" --reps "$reps" ||
    echo "tx_bench shm --mem cuda failed"

section "bandwidth: host memory, ours vs raw fi_writedata (tcp, shm) and tcp 2 rails vs 1"
build/bench/tx_bench --sizes "$sizes" --reps "$reps" || echo "tx_bench suite failed"

section "result"
if [ $status = 0 ]; then
    echo "tx_check: all transport tests passed (see SKIP lines above for rows this machine cannot run)"
else
    echo "tx_check: FAILURES above"
fi
exit $status
