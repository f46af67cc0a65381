#!/usr/bin/env bash
# relay_bench.sh — a relay chain of 4 rollout replicas against the trainers writing all 4
# (relay: chain vs relay: off), in the same run, on one machine: the demo model's 4 trainer
# agents (FSDP 2 x EP 2) and 4 replicas of 2 rollout agents (TP 2), host memory, libfabric tcp
# (or shm) on loopback. Each job runs N transfers after a first one (warm-up, not counted);
# prints per job the median transfer time and the trainers' bytes per transfer, the first
# job's median over the second's, and the bytes ratio.
#   bench/relay_bench.sh [N] [PROVIDER]   (run from the repository root; N default 10,
#                                          PROVIDER tcp or shm, default tcp; programs from
#                                          $WB_BIN, else build/bin; a larger model with
#                                          $HF_CONFIG, a config.json the demo's rules take)
# What it says about a fleet: on one host every agent shares the same CPUs and loopback, so a
# relay's hop adds its latency with no NIC to spare; the trainers' bytes show what the relay
# takes off their egress (a quarter here), which is the bound across real hosts.
set -u
n=${1:-10}
prov=${2:-tcp}
root=$PWD
bin=${WB_BIN:-$root/build/bin}
hf=${HF_CONFIG:-$root/configs/jobs/demo/config.json}
for p in wb-controller wb-agent wb-ctl; do
    [ -x "$bin/$p" ] || { echo "skipped: no $bin/$p (make all)"; exit 0; }
done
tmp=$(mktemp -d)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
    wait 2>/dev/null
    rm -rf "$tmp"
}
trap cleanup EXIT
export WB_TOKEN=bench-$RANDOM$RANDOM
cat >"$tmp/rollout.yaml" <<EOF
replicas: 4
gpus_per_replica: 2
tp: 2
gpus_per_node: 2
EOF
median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

# run SHAPE: prints "median_ms trainer_bytes"
run() {
    local url=tcp://127.0.0.1:$((21000 + RANDOM % 11000)) d=$tmp/$1
    mkdir -p "$d"
    cat >"$d/job.yaml" <<EOF
name: relay-bench-$1
listen: $url
model:
  rules: $root/configs/models/qwen3_moe.yaml
  hf_config: $hf
trainer_layout: $root/configs/jobs/demo/trainer.yaml
rollout_layout: $tmp/rollout.yaml
seed: 7
provider: $prov
relay: $1
EOF
    "$bin/wb-controller" --config "$d/job.yaml" >"$d/controller.log" 2>&1 &
    pids+=($!)
    for t in 0 1 2 3; do
        "$bin/wb-agent" --role trainer --rank $t --controller "$url" >"$d/t$t.log" 2>&1 &
        pids+=($!)
    done
    for r in 0 1 2 3 4 5 6 7; do
        "$bin/wb-agent" --role rollout --rank $r --controller "$url" >"$d/r$r.log" 2>&1 &
        pids+=($!)
    done
    for _ in $(seq 240); do
        "$bin/wb-ctl" -c "$url" status 2>/dev/null | grep -q "^job [^ ]*: ready " && break
        sleep 0.5
    done
    local bytes=""
    for v in $(seq 1 $((n + 1))); do
        out=$("$bin/wb-ctl" -c "$url" transfer --version "$v" 2>&1) || {
            echo "relay: $1: transfer $v failed: $out" >&2
            exit 1
        }
        bytes=$(awk '$1 == "all" {print $2}' <<<"$out")
        # "transfer V: complete in 12.345 ms (...)"
        [ "$v" -gt 1 ] && sed -n 's/^transfer [0-9]*: complete in \([0-9.]*\) ms.*/\1/p' <<<"$out" >>"$d/ms"
    done
    "$bin/wb-ctl" -c "$url" shutdown >/dev/null 2>&1
    wait 2>/dev/null
    pids=()
    echo "$(median <"$d/ms") $bytes"
}

read -r off_ms off_b <<<"$(run off)"
read -r chain_ms chain_b <<<"$(run chain)"
printf '%-12s %12s %16s\n' relay "median ms" "trainer bytes"
printf '%-12s %12s %16s\n' off "$off_ms" "$off_b" chain "$chain_ms" "$chain_b"
awk -v a="$chain_ms" -v b="$off_ms" -v x="$chain_b" -v y="$off_b" -v n="$n" -v p="$prov" \
    'BEGIN { printf "chain of 4 / off: time %.2fx, trainer bytes %.2fx (%d transfers each, %s, host memory)\n", a / b, x / y, n, p }'
