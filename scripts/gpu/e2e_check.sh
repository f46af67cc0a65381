#!/usr/bin/env bash
# e2e_check.sh — the whole job on a GPU machine (H100/H200, CUDA 13): builds with CUDA, starts
# wb-controller, 4 trainer agents on GPU 0 and 2 rollout agents on GPU 1 (on GPU 0 too when the
# machine has one GPU) (the demo model: Qwen3-MoE-shaped, BF16 FSDP 2 x EP 2 -> FP8 TP 2;
# parameters, TMP arena, inboxes and rollout weights all in GPU memory; fuse/quantize on the
# CUDA kernels), runs three transfers per configuration, checks every rollout byte against the
# independent CPU reference (wb-ctl verify) after each, and prints the per-stage and total times.
#
# Configurations: cudaipc (CUDA IPC peer copies over NVLink), then fabric/tcp with device
# memory through the transport's bounce/staging buffers (no GPUDirect). Both in auto mode, the
# first also in gather mode; amax3: hidden size 128, so four trainers share each 128-row FP8
# block of o_proj and each AMAX op has three peers; then a larger model of the same shape
# (~0.5 B parameters, 4 layers x 16 experts, hidden 2048) over cudaipc for times that mean
# something, and m9amax: 9.1 GB of BF16 (52 layers x 16 experts, hidden 2048, one KV head, so
# every k_proj/v_proj block has four owners: AMAX ops with three peers) (the large models'
# reference check runs on the last version only: the CPU reference takes a while); last,
# amax3 and m9amax with the trainers' parameters in host memory (residence: host, as the
# Kimi-K2 and Qwen3-235B layouts have it), so every task starts with H2D copies; last, gpt-oss's
# transposed experts (gptoss-*: the CUDA transpose kernel, experts whole and sharded along the
# dim the transpose moves).
#
# Usage: scripts/gpu/e2e_check.sh [--keep] [--no-build] [--bin DIR] [--only NAME,NAME...]
#   --keep: leave the logs directory; --no-build: use the programs already built; --bin: the
#   programs of another build (e.g. an older commit's, for a comparison in the same run);
#   --only: run only these configurations.
# Assumes the build's libraries are reachable (CPATH/LIBRARY_PATH/LD_LIBRARY_PATH, as
# scripts/gpu/env.sh sets them). Exits non-zero when a transfer fails or any byte differs;
# timings never fail it.
set -uo pipefail
cd "$(dirname "$0")/../.."
keep=0 build=1 only=""
root=$(pwd)
bin=$root/build/bin
while [ $# -gt 0 ]; do
    case "$1" in
    --keep) keep=1 ;;
    --no-build) build=0 ;;
    --bin)
        bin=$(cd "$2" && pwd) || exit 2
        build=0
        shift
        ;;
    --only)
        only=",$2,"
        shift
        ;;
    -h | --help)
        sed -n '2,26p' "$0"
        exit 0
        ;;
    *)
        echo "usage: scripts/gpu/e2e_check.sh [--keep] [--no-build] [--bin DIR] [--only NAMES]" >&2
        exit 2
        ;;
    esac
    shift
done
jobs=$(nproc 2>/dev/null || echo 4)
tmp=$(mktemp -d /tmp/e2e_check.XXXXXX)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
    wait 2>/dev/null
    [ $keep -eq 1 ] && echo "logs: $tmp" || rm -rf "$tmp"
}
trap cleanup EXIT
export WB_TOKEN=e2e-check-$RANDOM$RANDOM
export WB_LOG=${WB_LOG:-info}

nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader 2>/dev/null ||
    true
if [ $build -eq 1 ]; then
    echo "== build (make CUDA=1)"
    if ! make -j"$jobs" CUDA=1 all >"$tmp/build.log" 2>&1; then
        tail -n 40 "$tmp/build.log"
        echo "e2e_check: build failed"
        exit 1
    fi
fi
echo "programs: $bin"
ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || echo 0)
if [ "$ngpu" -lt 1 ]; then
    echo "e2e_check: needs a GPU, found none"
    exit 1
fi
rdev=1
[ "$ngpu" -lt 2 ] && rdev=0 # one GPU: the rollouts share it with the trainers
nvidia-smi topo -m 2>/dev/null | head -n 4 || true

failed=()

# run NAME PROVIDER MODE [CONFIG_JSON MEM_CAP VERIFY_LAST RESIDENCE]: one cluster, three
# transfers, verify each (or only the last); RESIDENCE host keeps the trainers' parameters in
# pinned host memory (FSDP CPU offload: every task starts with H2D copies).
run() {
    local name=$1 provider=$2 mode=$3 dir=$tmp/$1
    local config=${4:-$root/configs/jobs/demo/config.json} cap=${5:-4MiB} last=${6:-0}
    local residence=${7:-gpu} trainer=${trainer_file:-$root/configs/jobs/demo/trainer.yaml}
    [ -z "$only" ] || [[ $only == *",$name,"* ]] || return 0
    mkdir -p "$dir/dump" "$dir/traces"
    if [ "$residence" = host ]; then
        { cat "$trainer" && echo "residence: host"; } >"$dir/trainer.yaml"
        trainer=$dir/trainer.yaml
    fi
    local port=$((21000 + RANDOM % 11000))
    local url=tcp://127.0.0.1:$port
    cat >"$dir/job.yaml" <<EOF
name: $name
model:
  rules: ${rules_file:-$root/configs/models/qwen3_moe.yaml}
  hf_config: $config
trainer_layout: $trainer
rollout_layout: ${rollout_file:-$root/configs/jobs/demo/rollout.yaml}
mode: $mode
mem_cap: $cap
seed: 42
provider: $provider
heartbeat: 200ms
dead_after: 3s
${extra_keys:-}
EOF
    echo
    echo "== $name: provider $provider, mode $mode, parameters in $residence memory; trainers on GPU 0, rollouts on GPU $rdev"
    pids=()
    "$bin/wb-controller" --config "$dir/job.yaml" --listen "$url" >"$dir/controller.log" 2>&1 &
    pids+=($!)
    local dom=()
    [ "$provider" = tcp ] && dom=(--tx-domain lo --tx-extra "hmem: off") # the bounce path
    for r in 0 1 2 3; do
        "$bin/wb-agent" --role trainer --rank $r --device 0 --controller "$url" "${dom[@]}" \
            --trace "$dir/traces" >"$dir/trainer$r.log" 2>&1 &
        pids+=($!)
    done
    for r in $(seq 0 $((${nrollouts:-2} - 1))); do # replica 1's ranks on GPU rdev2
        local dev=$rdev
        [ "$r" -ge 2 ] && dev=${rdev2:-$rdev}
        "$bin/wb-agent" --role rollout --rank $r --device $dev --controller "$url" "${dom[@]}" \
            --dump "$dir/dump" >"$dir/rollout$r.log" 2>&1 &
        pids+=($!)
    done
    local ready=0
    for _ in $(seq 1 300); do
        if "$bin/wb-ctl" -c "$url" --timeout 2s status 2>/dev/null | grep -q ": ready"; then
            ready=1
            break
        fi
        sleep 0.1
    done
    local ok=1
    if [ $ready -ne 1 ]; then
        echo "$name: the agents did not become ready"
        tail -n 5 "$dir"/*.log
        ok=0
    fi
    for v in 1 2 3; do
        [ $ok -eq 1 ] || break
        # the synthetic trainers generate version v between transfers (seconds of CPU work when
        # the parameters are in host memory): wait for it, so the times are the transfer's
        for _ in $(seq 1 600); do
            [ -z "$(grep -L "version $v's values ready" "$dir"/trainer?.log)" ] && break
            sleep 0.1
        done
        if ! "$bin/wb-ctl" -c "$url" --timeout 300s transfer --version $v | tee "$dir/result$v.txt"
        then
            ok=0
            break
        fi
        awk '/^all /{ if ($12 > 0) printf "throughput: %.2f GB/s (%d bytes in %.3f ms, slowest trainer)\n", $2 / ($12 * 1e6), $2, $12 }' \
            "$dir/result$v.txt"
        if [ "$last" -eq 0 ] || [ $v -eq 3 ]; then
            "$bin/wb-ctl" verify --config "$dir/job.yaml" --dump "$dir/dump" --version $v || ok=0
        fi
    done
    grep -h "GPU\|error\|failed" "$dir"/trainer0.log "$dir"/rollout0.log | head -n 6
    "$bin/wb-ctl" -c "$url" shutdown >/dev/null 2>&1
    for p in "${pids[@]}"; do
        for _ in $(seq 1 100); do
            kill -0 "$p" 2>/dev/null || break
            sleep 0.1
        done
    done
    for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
    wait 2>/dev/null
    pids=()
    if [ $ok -ne 1 ]; then
        echo "$name: FAILED (logs: $dir)"
        keep=1
        failed+=("$name")
    else
        echo "$name: three transfers, every rollout byte equals the reference"
    fi
}

run cudaipc-auto cudaipc auto
run cudaipc-gather cudaipc gather
run tcp-bounce-auto tcp auto

# The demo's config.json with some sizes changed: NAME KEY=VALUE...
config() {
    python3 - "$root/configs/jobs/demo/config.json" "$tmp/$1.json" "${@:2}" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c.update({k: int(v) for k, v in (a.split("=") for a in sys.argv[3:])})
json.dump(c, open(sys.argv[2], "w"), indent=1)
PY
}
config amax3 hidden_size=128
run amax3-cudaipc-auto cudaipc auto "$tmp/amax3.json"
run amax3-tcp-bounce-auto tcp auto "$tmp/amax3.json"
config large hidden_size=2048 intermediate_size=6144 moe_intermediate_size=768 \
    num_attention_heads=16 num_key_value_heads=4 num_experts=16 num_hidden_layers=4 \
    vocab_size=32768
run large-cudaipc-auto cudaipc auto "$tmp/large.json" 1GiB 1
config m9amax hidden_size=2048 intermediate_size=6144 moe_intermediate_size=768 \
    num_attention_heads=16 num_key_value_heads=1 num_experts=16 num_hidden_layers=52 \
    vocab_size=32768
run m9amax-cudaipc-auto cudaipc auto "$tmp/m9amax.json" 1GiB 1
# relays (#30): two replicas of the demo's TP 2 rollout — replica 0 on the rollouts' GPU, replica 1
# on GPU 0 beside the trainers (with two GPUs: 1 trainer GPU -> a rollout GPU relaying back to
# a second replica) — without relay (the trainers write both) and with relay: chain (they write
# replica 0, which forwards every tensor to replica 1 over CUDA IPC); every byte of both verified
printf 'replicas: 2\ngpus_per_replica: 2\ntp: 2\ngpus_per_node: 2\n' >"$tmp/rollout2.yaml"
rollout_file=$tmp/rollout2.yaml nrollouts=4 rdev2=0
run relay-off-large cudaipc auto "$tmp/large.json" 1GiB
extra_keys="relay: chain" run relay-chain-large cudaipc auto "$tmp/large.json" 1GiB
run relay-off-m9 cudaipc auto "$tmp/m9amax.json" 1GiB 1
extra_keys="relay: chain" run relay-chain-m9 cudaipc auto "$tmp/m9amax.json" 1GiB 1
unset rollout_file nrollouts rdev2

# host residence, as the Kimi-K2 and Qwen3-235B layouts: the AMAX ops read what H2D copies wrote
run amax3-host-cudaipc cudaipc auto "$tmp/amax3.json" 4MiB 0 host
run m9amax-host-cudaipc cudaipc auto "$tmp/m9amax.json" 1GiB 1 host

# gpt-oss's experts as Hugging Face holds them ([E, H, 2I] gate_up_proj), transposed into vLLM's
# [E, 2I, H] w13 by PERMUTE ops on the CUDA kernel; BF16 TP 2 (gpt-oss has no FP8 rules): the
# demo's FSDP 2 x EP 2 sharding (whole experts per trainer), then the experts' hidden dim sharded
# (the dim the transpose moves), direct, gather and over tcp
python3 - "$root/configs/hf/gpt-oss-20b.json" "$tmp/gptoss.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c.pop("quantization_config")  # the rollout holds BF16
c.update(hidden_size=1024, intermediate_size=1024, num_local_experts=32, num_hidden_layers=4,
         num_attention_heads=16, num_key_value_heads=4, vocab_size=32768, layer_types=c["layer_types"][:4])
json.dump(c, open(sys.argv[2], "w"), indent=1)
PY
rules_file=$root/configs/models/gpt_oss.yaml
run gptoss-cudaipc-auto cudaipc auto "$tmp/gptoss.json" 1GiB
cat >"$tmp/gptoss-trainer.yaml" <<EOF
world_size: 4
gpus_per_node: 4
mesh:
  - {name: fsdp, size: 2}
  - {name: ep, size: 2}
placements:
  - match: "*.mlp.experts.*_proj"
    place: {fsdp: shard(1), ep: shard(0)}
  - match: "*"
    place: {fsdp: shard(0), ep: shard(0)}
EOF
trainer_file=$tmp/gptoss-trainer.yaml
run gptoss-h-cudaipc-direct cudaipc direct "$tmp/gptoss.json" 1GiB
run gptoss-h-cudaipc-gather cudaipc gather "$tmp/gptoss.json" 1GiB
run gptoss-h-tcp-bounce-auto tcp auto "$tmp/gptoss.json" 1GiB
unset rules_file trainer_file

echo
if [ ${#failed[@]} -gt 0 ]; then
    echo "e2e_check: FAILED: ${failed[*]}"
    exit 1
fi
echo "e2e_check: all configurations passed"
