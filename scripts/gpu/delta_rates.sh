#!/usr/bin/env bash
# delta_rates.sh — issue #34's table on a lent GPU machine: how much of a rollout's FP8 and BF16
# weights one AdamW step changes (scripts/gpu/delta_rates.py: a transformers Qwen3, 8 layers,
# hidden 1024, random init, FP32 masters, LM loss on random tokens, lr 1e-6 and 1e-5, 5 steps
# each; every 2-D weight cast to BF16 and quantized as DeepGEMM's per_block_cast_to_fp8, compared
# with the previous step). Sets up the environment as the other scripts here do (the Debian
# packages carried in .deb/, when there are any: scripts/gpu/env.sh), then runs the script with
# the arguments given (--size 9 for a model of at least 9 GB BF16; --help lists them).
# Needs python3 with torch and transformers; builds nothing (weightbridge itself is not used).
# Usage: scripts/gpu/delta_rates.sh [delta_rates.py arguments]
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
case "${1:-}" in
-h | --help)
    sed -n '2,10p' "$0"
    echo
    exec python3 scripts/gpu/delta_rates.py --help
    ;;
esac
# shellcheck disable=SC1091 # the environment of the lent machines, when its packages are here
if compgen -G ".deb/*.deb" >/dev/null; then . scripts/gpu/env.sh; fi
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader 2>/dev/null || true
python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers",
    transformers.__version__, "cuda", torch.version.cuda)' || {
    echo "delta_rates: needs python3 with torch and transformers"
    exit 1
}
exec python3 scripts/gpu/delta_rates.py "$@"
