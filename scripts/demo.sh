#!/usr/bin/env bash
# The README's main job on a small built-in example (configs/jobs/demo.yaml): a controller,
# 4 trainer agents (BF16, FSDP 2 x EP 2) and 2 rollout agents (FP8, TP 2) of a small
# Qwen3-MoE-shaped model on loopback (libfabric tcp provider); the plan, three transfers with
# per-GPU bytes and per-stage times, every rollout byte checked against the independent
# reference after each transfer (wb-ctl verify), the rollouts' versions, then a clean shutdown.
# Chrome traces of every agent's versions (trainers' stages and rollouts' arrivals, named by
# tensor) are left in the log's traces/ directory (open in Perfetto).
# Usage: scripts/demo.sh [BUILD_DIR]   (make demo runs it after building)
set -u
build=${1:-build}
bin=$build/bin
here=$(cd "$(dirname "$0")/.." && pwd)
port=$((17420 + RANDOM % 2000))
url=tcp://127.0.0.1:$port
export WB_TOKEN=${WB_TOKEN:-demo-$RANDOM$RANDOM}
logs=$(mktemp -d "${TMPDIR:-/tmp}/wb-demo.XXXXXX")
mkdir -p "$logs/dump" "$logs/traces"
pids=()

cleanup() {
    for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
    wait 2>/dev/null
}
trap cleanup EXIT

echo "== weightbridge demo: $url, logs in $logs"
"$bin/wb-controller" --config "$here/configs/jobs/demo.yaml" --listen "$url" \
    >"$logs/controller.log" 2>&1 &
pids+=($!)
for r in 0 1 2 3; do
    "$bin/wb-agent" --role trainer --rank $r --controller "$url" --tx-domain lo \
        --trace "$logs/traces" >"$logs/trainer$r.log" 2>&1 &
    pids+=($!)
done
for r in 0 1; do
    "$bin/wb-agent" --role rollout --rank $r --controller "$url" --tx-domain lo \
        --dump "$logs/dump" --trace "$logs/traces" >"$logs/rollout$r.log" 2>&1 &
    pids+=($!)
done

ready=0
for _ in $(seq 1 100); do
    if "$bin/wb-ctl" -c "$url" --timeout 2s status 2>/dev/null | grep -q ": ready"; then
        ready=1
        break
    fi
    sleep 0.1
done
if [ $ready -ne 1 ]; then
    echo "demo: the agents did not become ready; controller log:"
    cat "$logs/controller.log"
    exit 1
fi
"$bin/wb-ctl" -c "$url" plan
echo
rc=0
summary=()
for v in 1 2 3; do
    if ! "$bin/wb-ctl" -c "$url" --timeout 60s transfer --version $v | tee "$logs/result$v.txt"; then
        rc=1
        break
    fi
    if ! "$bin/wb-ctl" verify --config "$here/configs/jobs/demo.yaml" --dump "$logs/dump" \
        --version $v; then
        rc=1
        break
    fi
    summary+=("$(awk -v v=$v '/^all /{printf "%-8s %9s %9s %9s %9s %9s %9s %10s %10s", v, $6, $7, $8, $9, $10, $11, $12, $5}' "$logs/result$v.txt")")
    echo
done
if [ $rc -eq 0 ]; then
    echo "== stage spans summed over tasks and trainers (ms; concurrent spans overlap), the slowest"
    echo "   trainer's total (TRANSFER received -> last write completed) and the peak temporary bytes"
    printf "%-8s %9s %9s %9s %9s %9s %9s %10s %10s\n" version h2d gather fuse quant write \
        barrier total_ms peak_tmp
    printf "%s\n" "${summary[@]}"
    echo "traces: $logs/traces/{trainer,rollout}<rank>.v<version>.json (Chrome trace format, open in ui.perfetto.dev)"
    echo
fi
"$bin/wb-ctl" -c "$url" status
"$bin/wb-ctl" -c "$url" shutdown
for p in "${pids[@]}"; do
    for _ in $(seq 1 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
done
pids=()
wait
[ $rc -eq 0 ] && echo "demo: three transfers complete" || echo "demo: transfers failed (see above)"
exit $rc
