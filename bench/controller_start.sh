#!/usr/bin/env bash
# controller_start.sh — what a controller of a large job costs before it listens: Kimi-K2,
# 1,024 trainer GPUs -> 512 rollout GPUs (the shipped cluster layouts). Starts wb-controller of
# each build dir given, interleaved N times, waits for its "listening" line and prints the CPU
# seconds it used (user + system) and its peak memory (VmHWM), then the medians.
#   bench/controller_start.sh BUILD_A [BUILD_B] [N]   (dirs holding bin/wb-controller; run from
#                                                     the repository root; N default 3)
set -u
builds=("$1")
n=3
[ $# -ge 2 ] && { if [ -d "$2" ]; then builds+=("$2"); n=${3:-3}; else n=$2; fi; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
port=$((21000 + RANDOM % 10000))
cat >"$tmp/job.yaml" <<YAML
name: big
listen: tcp://127.0.0.1:$port
model:
  rules: $PWD/configs/models/deepseek_v3.yaml
  hf_config: $PWD/configs/hf/Kimi-K2-Instruct.json
trainer_layout: $PWD/configs/clusters/kimi-k2-trainer-1024.yaml
rollout_layout: $PWD/configs/clusters/kimi-k2-rollout-512.yaml
provider: tcp
token: bench
YAML
hz=$(getconf CLK_TCK)
one() { # build label
    "$1/bin/wb-controller" --config "$tmp/job.yaml" >"$tmp/out" 2>&1 &
    local p=$! t0=$SECONDS
    while ! grep -q listening "$tmp/out" 2>/dev/null; do
        kill -0 "$p" 2>/dev/null || { echo "$2: the controller exited:"; cat "$tmp/out"; return 1; }
        [ $((SECONDS - t0)) -gt 900 ] && { echo "$2: not listening after 900 s"; kill "$p"; return 1; }
        sleep 0.05
    done
    local hwm cpu
    hwm=$(awk '/VmHWM/ { print $2 }' "/proc/$p/status")
    read -r -a st <"/proc/$p/stat"
    cpu=$(echo "scale=2; (${st[13]} + ${st[14]}) / $hz" | bc)
    kill "$p"
    wait "$p" 2>/dev/null
    echo "$2 cpu_s $cpu peak_MB $((hwm / 1024))"
    echo "$cpu" >>"$tmp/$2.cpu"
    echo "$((hwm / 1024))" >>"$tmp/$2.mb"
}
for _ in $(seq "$n"); do
    for i in "${!builds[@]}"; do one "${builds[$i]}" "$(printf "\\x$(printf %x $((65 + i)))")" || exit 1; done
done
med() { sort -g "$1" | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
for i in "${!builds[@]}"; do
    l=$(printf "\\x$(printf %x $((65 + i)))")
    echo "median $l (${builds[$i]}): $(med "$tmp/$l.cpu") CPU-s, $(med "$tmp/$l.mb") MB peak"
done
