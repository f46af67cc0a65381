#!/usr/bin/env bash
# plan_replicas.sh — how `wb-plan --estimate --verify` grows with the rollout fleet: Kimi-K2,
# the shipped 256-GPU trainer layout, rollout replicas of 32 GPUs (EP 32, TP 8, as the shipped
# kimi-k2-rollout-128.yaml) at 4, 8, 16 and 32 replicas (128 to 1,024 rollout GPUs). Runs each
# wb-plan given under /usr/bin/time -v, interleaved N times per size, and prints per size the
# median wall seconds (and their range), CPU seconds and peak RSS of each, and the second's
# medians over the first's (ratio).
#   bench/plan_replicas.sh WB_PLAN_A [WB_PLAN_B] [N]   (run from the repository root; N
#                                                       default 3; extra wb-plan flags in
#                                                       $PLAN_FLAGS, default --estimate --verify)
# Every run must succeed and print the same plan summary and estimate as the first program's
# (the lines naming times aside), or the script says which differ and exits 1.
set -u
[ $# -ge 1 ] || { sed -n '2,12p' "$0"; exit 2; }
bins=("$1")
n=3
[ $# -ge 2 ] && { if [ -x "$2" ]; then bins+=("$2"); n=${3:-3}; else n=$2; fi; }
flags=${PLAN_FLAGS:---estimate --verify}
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
range() { sort -g | awk 'NR == 1 { a = $1 } { z = $1 } END { print a "-" z }'; }
rc=0
printf '%-9s %-6s' replicas GPUs
for i in "${!bins[@]}"; do printf ' | %-8s %-11s %-8s %-9s' "wall[$i]" "(range)" "CPU[$i]" "RSS[$i]"; done
[ ${#bins[@]} -gt 1 ] && printf ' | %-8s %-8s %-8s' "wall 1/0" "CPU 1/0" "RSS 1/0"
echo
for r in "${sizes[@]}"; do
    for _ in $(seq "$n"); do
        for i in "${!bins[@]}"; do
            # shellcheck disable=SC2086 # flags is a word list
            /usr/bin/time -v -o "$tmp/time" "${bins[$i]}" --model "$c/models/deepseek_v3.yaml" \
                --config "$c/hf/Kimi-K2-Instruct.json" \
                --trainer "$c/clusters/kimi-k2-trainer-256.yaml" \
                --rollout "$tmp/rollout-$r.yaml" $flags >"$tmp/out" 2>&1 ||
                { echo "wb-plan ${bins[$i]} failed at $r replicas:"; tail -n 5 "$tmp/out"; exit 1; }
            awk -F': ' '/Elapsed \(wall clock\)/ { n = split($2, t, ":"); s = 0;
                    for (j = 1; j <= n; j++) s = s * 60 + t[j]; print s }' "$tmp/time" >>"$tmp/wall.$r.$i"
            awk -F': ' '/Maximum resident set size/ { print $2 }' "$tmp/time" >>"$tmp/rss.$r.$i"
            awk -F': ' '/User time/ { u = $2 } /System time/ { s = $2 } END { print u + s }' \
                "$tmp/time" >>"$tmp/cpu.$r.$i"
            grep -v -e 'planned in' -e 'in [0-9.]* s)$' -e '(estimate in' -e '(simulated in' \
                -e 'verify: ok' "$tmp/out" >"$tmp/sum.$i"
            if [ "$i" -gt 0 ] && ! cmp -s "$tmp/sum.0" "$tmp/sum.$i"; then
                echo "$r replicas: ${bins[$i]} prints another plan or estimate than ${bins[0]}:"
                diff "$tmp/sum.0" "$tmp/sum.$i" | head -n 10
                rc=1
            fi
        done
    done
    printf '%-9s %-6s' "$r" "$((r * 32))"
    for i in "${!bins[@]}"; do
        w[i]=$(median <"$tmp/wall.$r.$i")
        m[i]=$(median <"$tmp/rss.$r.$i")
        u[i]=$(median <"$tmp/cpu.$r.$i")
        printf ' | %-8s %-11s %-8s %-9s' "${w[i]} s" "($(range <"$tmp/wall.$r.$i"))" "${u[i]} s" \
            "$((m[i] / 1024)) MB"
    done
    ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", a / b }'; }
    [ ${#bins[@]} -gt 1 ] && printf ' | %-8s %-8s %-8s' "$(ratio "${w[1]}" "${w[0]}")" \
        "$(ratio "${u[1]}" "${u[0]}")" "$(ratio "${m[1]}" "${m[0]}")"
    echo
done
echo "(medians of $n runs each, interleaved; wb-plan $flags; wall, CPU (user + system) and peak RSS"
echo " from /usr/bin/time -v; on a loaded machine the CPU seconds are the steadier comparison)"
exit $rc
