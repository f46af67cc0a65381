#!/usr/bin/env bash
# sum_check.sh — the write checksums (wb_sum64) on a GPU machine, with programs built elsewhere
# (make -j tests bench with CUDA; build/bin build/tests build/bench carried): the host function
# against its definition written out with plain XXH3 (build/tests/sum), the kernel's batches
# against the host function and a flipped device byte (build/tests/gpu_cuda: sum_batch,
# sum_batch_flip, and the rest of the file), then the agents' use of it on GPU 0 — the demo
# job with verify: true, 4 trainers and 2 rollouts in GPU memory over cudaipc, three versions
# each checked byte for byte (wb-ctl verify), then one with a byte flipped at rollout 0 that
# must fail naming the tensor (the trainers' batches, their records sent from pinned memory, the
# rollouts' batched checks) — then what the kernel costs (build/bench/sum_bench: 1 GiB of device
# memory in pieces of 4 KiB .. 64 MiB, aligned and not, against a D2D copy). The end-to-end cost
# (a job with verify: true against the same job without) is bench/gpu_e2e.sh --no-build
# --model m9 (the "with checksums" line).
#
# Usage: . scripts/gpu/env.sh; scripts/gpu/sum_check.sh [--reps N]
# Without a GPU the job part runs in host memory over tcp (a check of the script) and the
# result is FAILED (the GPU tests were skipped). Exits non-zero when a test fails, a sum differs
# or a job does not do what it must; timings never fail it.
set -uo pipefail
cd "$(dirname "$0")/../.."
reps=5
[ "${1:-}" = "--reps" ] && reps=${2:-5}
for f in build/tests/sum build/tests/gpu_cuda build/bench/sum_bench build/bin/wb-agent \
    build/bin/wb-controller build/bin/wb-ctl; do
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
root=$(pwd)
bin=$root/build/bin
tmp=$(mktemp -d /tmp/sum_check.XXXXXX)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
    wait 2>/dev/null
    rm -rf "$tmp"
}
trap cleanup EXIT
export WB_TOKEN=sum-check-$RANDOM$RANDOM
ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
if [ "${ngpu:-0}" -ge 1 ]; then
    prov=cudaipc dev=(--device 0) dom=()
else
    prov=tcp dev=() dom=(--tx-domain lo)
fi
tensor=model.layers.0.self_attn.qkv_proj.weight

# job NAME CORRUPT(0|1): the demo job with verify: true; 3 versions verified, or (CORRUPT=1) one
# that must fail on the flipped byte.
job() {
    local name=$1 corrupt=$2 dir=$tmp/$1
    mkdir -p "$dir/dump"
    local url=tcp://127.0.0.1:$((21000 + RANDOM % 11000))
    cat >"$dir/job.yaml" <<JOB
name: $name
model:
  rules: $root/configs/models/qwen3_moe.yaml
  hf_config: $root/configs/jobs/demo/config.json
trainer_layout: $root/configs/jobs/demo/trainer.yaml
rollout_layout: $root/configs/jobs/demo/rollout.yaml
mode: auto
mem_cap: 4MiB
seed: 42
provider: $prov
verify: true
heartbeat: 200ms
dead_after: 3s
JOB
    pids=()
    "$bin/wb-controller" --config "$dir/job.yaml" --listen "$url" >"$dir/controller.log" 2>&1 &
    pids+=($!)
    for r in 0 1 2 3; do
        "$bin/wb-agent" --role trainer --rank $r "${dev[@]}" "${dom[@]}" --controller "$url" \
            >"$dir/trainer$r.log" 2>&1 &
        pids+=($!)
    done
    for r in 0 1; do
        local bad=()
        [ "$corrupt" = 1 ] && [ $r = 0 ] && bad=(--corrupt "$tensor")
        "$bin/wb-agent" --role rollout --rank $r "${dev[@]}" "${dom[@]}" --controller "$url" \
            --dump "$dir/dump" "${bad[@]}" >"$dir/rollout$r.log" 2>&1 &
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
    if [ $ready -ne 1 ]; then
        echo "$name: the agents did not become ready"
        tail -n 5 "$dir"/*.log
        failed+=("$name: not ready")
        return
    fi
    if [ "$corrupt" = 1 ]; then
        local out
        out=$("$bin/wb-ctl" -c "$url" --timeout 120s transfer --version 1 2>&1)
        echo "$out" | grep "checksum" | head -n 3
        if ! grep -Eq "rollout rank 0: $tensor: bytes \[[0-9]+, [0-9]+\) written by trainer rank [0-9]+ do not match their checksum: sum64 [0-9a-f]{16} landed, [0-9a-f]{16} sent" <<<"$out"; then
            echo "$out"
            failed+=("$name: the flipped byte went unnoticed")
        fi
    else
        for v in 1 2 3; do
            if ! "$bin/wb-ctl" -c "$url" --timeout 120s transfer --version $v >"$dir/result$v.txt" 2>&1; then
                cat "$dir/result$v.txt"
                failed+=("$name: transfer $v")
                break
            fi
            grep "complete in" "$dir/result$v.txt"
            "$bin/wb-ctl" verify --config "$dir/job.yaml" --dump "$dir/dump" --version $v ||
                failed+=("$name: version $v's bytes")
        done
    fi
    "$bin/wb-ctl" -c "$url" shutdown >/dev/null 2>&1
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null; done
    pids=()
}
echo "== the agents: the demo job with verify: true (provider $prov${dev[*]:+, GPU 0})"
job verified 0
echo "== the same with a byte flipped at rollout 0 after it landed"
job corrupted 1

echo "== what it costs (build/bench/sum_bench)"
build/bench/sum_bench --reps "$reps" || failed+=("sum_bench")
if [ ${#failed[@]} -gt 0 ]; then
    echo "sum_check: FAILED: ${failed[*]}"
    exit 1
fi
echo "sum_check: PASS"
