#!/usr/bin/env bash
# fault_check.sh — the fault-injection runs (tests/sh/fault_test.sh) on a GPU machine, where the
# agents hold GPU memory (device 0, shared by the 2 trainers and 2 rollouts; libfabric tcp with
# bounce buffers), so that the CUDA calls of the data path — allocation, registration, copies,
# kernels' streams and events, the checksum batches — are points (WB_FAULT=cuda:N) as well as
# the allocations and posts. Every point: a clean error, no leak, no hang, and recovery to a
# transfer verified byte for byte (or the reason in wb-ctl status and a clean shutdown).
#
# Usage: . scripts/gpu/env.sh; scripts/gpu/fault_check.sh [--roles "trainer rollout"]
#            [--kinds "cuda"] [--jobs N] [--stride K]
# Needs the fault-injection build with CUDA (make fault with nvcc) in build/fault/bin, or its
# programs carried stripped of debug info in build/faultcarry (wb-agent, wb-controller, wb-ctl).
# Prints fault_test.sh's tally; exits non-zero when a point is not clean.
set -uo pipefail
cd "$(dirname "$0")/../.."
roles="trainer rollout" kinds=cuda jobs=$(($(nproc 2>/dev/null || echo 4) - 2)) stride=1
while [ $# -gt 0 ]; do
    case "$1" in
    --roles) roles=$2; shift ;;
    --kinds) kinds=$2; shift ;;
    --jobs) jobs=$2; shift ;;
    --stride) stride=$2; shift ;;
    -h | --help) sed -n '2,14p' "$0"; exit 0 ;;
    *) echo "usage: scripts/gpu/fault_check.sh [--roles R] [--kinds K] [--jobs N] [--stride K]" >&2; exit 2 ;;
    esac
    shift
done
if [ ! -x build/fault/bin/wb-agent ] && [ -d build/faultcarry ]; then
    mkdir -p build/fault/bin && cp build/faultcarry/* build/fault/bin/
fi
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader 2>/dev/null ||
    echo "fault_check: no GPU: the CUDA points are only the device queries"
[ "$jobs" -lt 1 ] && jobs=1
# The CUDA driver and runtime keep allocations until the process ends; they are not ours.
WB_FAULT_LSAN="leak:libcuda.so leak:libcudart leak:cudart:: leak:libnvidia" \
    WB_FAULT_ALL=1 WB_FAULT_STRIDE=$stride WB_FAULT_ROLES="$roles" WB_FAULT_KINDS="$kinds" \
    WB_FAULT_JOBS=$jobs WB_FAULT_SAVE=${WB_FAULT_SAVE:-/tmp/fault_check.save} \
    tests/sh/fault_test.sh
