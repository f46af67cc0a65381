#!/usr/bin/env bash
# delta_check.sh — delta updates of a real optimizer's steps on a lent GPU machine
# (scripts/gpu/delta_check.py: a transformers Qwen3 of at least 9 GB BF16 with FP32 masters and
# AdamW on GPU 0 registers its BF16 copies; a rollout process on the last GPU holds FP8 in
# vLLM's layout; every version's bytes checked against PyTorch's reference; delta versions'
# bytes and times against the full updates of the same run). Sets up the environment (the
# Debian packages carried in .deb/: scripts/gpu/env.sh), builds the release programs and
# library with CUDA unless --no-build, then runs the script with the other arguments.
# Usage: scripts/gpu/delta_check.sh [--no-build] [delta_check.py arguments]
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
build=1
case "${1:-}" in
-h | --help)
    sed -n '2,9p' "$0"
    echo
    exec python3 scripts/gpu/delta_check.py --help
    ;;
--no-build)
    build=0
    shift
    ;;
esac
# shellcheck disable=SC1091 # the environment of the lent machines, when its packages are here
if compgen -G ".deb/*.deb" >/dev/null; then . scripts/gpu/env.sh; fi
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
if [ $build -eq 1 ]; then
    make -j"$(nproc)" CUDA=1 all >/tmp/delta_check_build.log 2>&1 || {
        tail -n 20 /tmp/delta_check_build.log
        exit 1
    }
fi
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader 2>/dev/null || true
export WB_LIBRARY=${WB_LIBRARY:-$PWD/build/lib/libweightbridge.so}
exec python3 scripts/gpu/delta_check.py "$@"
