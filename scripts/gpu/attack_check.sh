#!/usr/bin/env bash
# attack_check.sh — the data-plane attacks of tests/func/e2e_attack_test.c with every agent's
# memory on a GPU (run on a lent GPU machine after `. scripts/gpu/env.sh`): the demo job over
# libfabric tcp, whose device memory takes the staged path (pinned host mirrors; no FI_HMEM
# there), and over CUDA IPC. Each attack asserts its safe outcome against the reference bytes
# (forged notes dropped and counted, a failed attempt torn and its resumed retry exact, a
# departed member's keys dead, writes across a tensor's edges and between transfers refused, a
# million stranger notes bounded). On CUDA IPC the tests that need a window or a key's exact
# range say why they skip: a writer there maps the allocation and stores into it itself.
#
# Usage: scripts/gpu/attack_check.sh [--no-build] [--device D] [--only TEST,TEST...]
# Prints the test harness's lines per provider and exits non-zero when any test failed.
set -uo pipefail
cd "$(dirname "$0")/../.."
build=1 device=0 only=""
while [ $# -gt 0 ]; do
    case "$1" in
    --no-build) build=0 ;;
    --device)
        device=$2
        shift
        ;;
    --only)
        only=${2//,/ }
        shift
        ;;
    -h | --help)
        sed -n '2,12p' "$0"
        exit 0
        ;;
    *)
        echo "usage: scripts/gpu/attack_check.sh [--no-build] [--device D] [--only TESTS]" >&2
        exit 2
        ;;
    esac
    shift
done
jobs=$(nproc 2>/dev/null || echo 4)
nvidia-smi --query-gpu=index,name --format=csv,noheader 2>/dev/null || true
if [ $build -eq 1 ] && ! make -j"$jobs" all tests >/tmp/attack_check_build.log 2>&1; then
    tail -n 40 /tmp/attack_check_build.log
    echo "attack_check: build failed"
    exit 1
fi
export WB_BIN=$(pwd)/build/bin
rc=0
for prov in tcp cudaipc; do
    echo "== rollouts and trainers in GPU $device memory, provider $prov"
    # shellcheck disable=SC2086
    WB_ATTACK_DEVICE=$device WB_ATTACK_PROVIDER=$prov timeout 1800 build/tests/e2e_attack $only
    r=$?
    [ $r -ne 0 ] && rc=1
done
exit $rc
