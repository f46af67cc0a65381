#!/usr/bin/env bash
# relay_replicas.sh — the update time as the rollout fleet grows, without and with relay
# (issue #30): Kimi-K2, the shipped 256-GPU trainer layout, rollout replicas of 32 GPUs (EP 32,
# TP 8, as the shipped kimi-k2-rollout-128.yaml) at 4, 8, 16 and 32 replicas. For each size it
# runs `wb-plan --estimate --verify` with --relay off and with --relay auto (N times each,
# interleaved, under /usr/bin/time -v) and prints the estimate of each, its ratio to the
# 4-replica time without relay (the baseline, from the same run), the shape relay auto chose,
# and the planning wall and CPU seconds (medians) of each.
#   bench/relay_replicas.sh WB_PLAN [N]   (run from the repository root; N default 3)
# Every run must succeed and verify, and the N runs of one size and setting must print the same
# estimate (the simulation is deterministic), or the script says which and exits 1.
set -u
[ $# -ge 1 ] || { sed -n '2,12p' "$0"; exit 2; }
bin=$1
n=${2:-3}
[ -x /usr/bin/time ] || { echo "skipped: needs /usr/bin/time (GNU time)"; exit 0; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
c=$PWD/configs
sizes=(4 8 16 32)
for r in "${sizes[@]}"; do
    cat >"$tmp/rollout-$r.yaml" <<YAML
replicas: $r
gpus_per_replica: 32
tp: 8
ep: 32
gpus_per_node: 8
world_size: $((r * 32))
hardware: $c/hw/h100-cx7-400g.yaml
YAML
done
median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
rc=0
modes=(off auto)
for r in "${sizes[@]}"; do
    for k in $(seq "$n"); do
        for m in "${modes[@]}"; do
            /usr/bin/time -v -o "$tmp/time" "$bin" --model "$c/models/deepseek_v3.yaml" \
                --config "$c/hf/Kimi-K2-Instruct.json" \
                --trainer "$c/clusters/kimi-k2-trainer-256.yaml" \
                --rollout "$tmp/rollout-$r.yaml" --estimate --verify --relay "$m" \
                >"$tmp/out" 2>&1 ||
                { echo "wb-plan --relay $m failed at $r replicas:"; tail -n 5 "$tmp/out"; exit 1; }
            grep -q '^  verify: ok' "$tmp/out" ||
                { echo "wb-plan --relay $m at $r replicas did not verify"; exit 1; }
            est=$(awk '/^estimate: / { print $2 }' "$tmp/out")
            shape=$(sed -n 's/^  relay: \([^;(]*\).*/\1/p' "$tmp/out" | sed 's/ *$//')
            [ -n "$shape" ] || shape=off
            if [ "$k" -gt 1 ] && [ "$est ($shape)" != "$(cat "$tmp/est.$r.$m")" ]; then
                echo "$r replicas, relay $m: run $k estimated $est s ($shape), run 1 $(cat "$tmp/est.$r.$m")"
                rc=1
            fi
            echo "$est ($shape)" >"$tmp/est.$r.$m"
            awk -F': ' '/Elapsed \(wall clock\)/ { n = split($2, t, ":"); s = 0;
                    for (j = 1; j <= n; j++) s = s * 60 + t[j]; print s }' "$tmp/time" >>"$tmp/wall.$r.$m"
            awk -F': ' '/User time/ { u = $2 } /System time/ { s = $2 } END { print u + s }' \
                "$tmp/time" >>"$tmp/cpu.$r.$m"
        done
    done
done
base=$(cut -d' ' -f1 <"$tmp/est.4.off")
shape_of() { sed 's/^[^(]*(\(.*\))$/\1/' "$1"; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }
printf '%-8s %-5s | %-20s %-8s %-9s | %-24s %-9s %-8s %-9s\n' replicas GPUs \
    "off: estimate (x4)" "wall" "CPU" "relay auto: shape" "estimate" "(x4)" "wall/CPU"
for r in "${sizes[@]}"; do
    read -r eo _ <"$tmp/est.$r.off"
    read -r ea _ <"$tmp/est.$r.auto"
    sa=$(shape_of "$tmp/est.$r.auto")
    printf '%-8s %-5s | %-20s %-8s %-9s | %-24s %-9s %-8s %-9s\n' "$r" "$((r * 32))" \
        "$eo s ($(ratio "$eo" "$base"))" "$(median <"$tmp/wall.$r.off") s" \
        "$(median <"$tmp/cpu.$r.off") s" "$sa" "$ea s" \
        "($(ratio "$ea" "$base"))" "$(median <"$tmp/wall.$r.auto")/$(median <"$tmp/cpu.$r.auto") s"
done
echo "(x4: the estimate over the 4-replica estimate without relay, $base s, from this run; wall and"
echo " CPU (user + system) seconds of wb-plan --estimate --verify, medians of $n runs each,"
echo " interleaved, from /usr/bin/time -v; on a loaded machine CPU seconds are the steadier)"
exit $rc
