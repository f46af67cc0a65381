#!/usr/bin/env bash
# delta_cost.sh — delta updates against full updates in the same run: the demo job (4 trainers,
# 2 rollouts, tcp on loopback, host memory) with synthetic_change 0.002 and verify off, once
# with delta: false and once with delta: true, ROUNDS times alternating; prints, for the
# versions that go as deltas (2..N but multiples of 16), the bytes written per transfer and
# the median "complete in" time of each, and their ratio. On loopback bytes are cheap, so this
# measures the cost of comparing and applying more than the saving on the wire.
# Usage: scripts/delta_cost.sh [--build DIR] [--versions N] [--rounds R]   (defaults: build, 40, 3)
set -u
build=build versions=40 rounds=3
while [ $# -gt 0 ]; do
    case $1 in
    --build) build=$2; shift 2 ;;
    --versions) versions=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    -h | --help) sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "delta_cost.sh: unknown argument $1 (--help)" >&2; exit 2 ;;
    esac
done
here=$(cd "$(dirname "$0")/.." && pwd)
bin=$build/bin
[ -x "$bin/wb-controller" ] || { echo "delta_cost.sh: no $bin/wb-controller (make all)" >&2; exit 2; }
tmp=$(mktemp -d "${TMPDIR:-/tmp}/wb-delta-cost.XXXXXX")
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
    wait 2>/dev/null
    rm -rf "$tmp"
}
trap cleanup EXIT
export WB_TOKEN=delta-cost-$RANDOM
port=$((18420 + RANDOM % 2000))

run() { # $1: delta true|false; prints "<delta> <version> <ms> <bytes>" per transfer
    local url=tcp://127.0.0.1:$port
    port=$((port + 1))
    sed -e "s#\.\./models/#$here/configs/models/#" -e "s#demo/#$here/configs/jobs/demo/#" \
        "$here/configs/jobs/demo.yaml" >"$tmp/job.yaml"
    printf 'delta: %s\nsynthetic_change: 0.002\n' "$1" >>"$tmp/job.yaml"
    pids=()
    "$bin/wb-controller" --config "$tmp/job.yaml" --listen "$url" >"$tmp/controller.log" 2>&1 &
    pids+=($!)
    for r in 0 1 2 3; do
        "$bin/wb-agent" --role trainer --rank $r --controller "$url" --tx-domain lo >/dev/null 2>&1 &
        pids+=($!)
    done
    for r in 0 1; do
        "$bin/wb-agent" --role rollout --rank $r --controller "$url" --tx-domain lo >/dev/null 2>&1 &
        pids+=($!)
    done
    for _ in $(seq 1 300); do
        "$bin/wb-ctl" -c "$url" --timeout 2s status 2>/dev/null | grep -q ": ready" && break
        sleep 0.1
    done
    for v in $(seq 1 "$versions"); do
        "$bin/wb-ctl" -c "$url" --timeout 60s transfer --version "$v" |
            awk -v v="$v" -v m="$1" '/complete in/ {t = $5} /^all / {b = $2} END {print m, v, t, b}'
    done
    "$bin/wb-ctl" -c "$url" shutdown >/dev/null 2>&1
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null; done
    pids=()
}

for _ in $(seq 1 "$rounds"); do
    run false
    run true
done >"$tmp/times.txt"
echo "delta_cost: the demo job, $versions versions x $rounds rounds each, $(nproc) cores, load $(cut -d' ' -f1 /proc/loadavg)"
for m in false true; do
    awk -v m=$m '$1 == m && $2 > 1 && $2 % 16 != 0 {print $3, $4}' "$tmp/times.txt" | sort -n |
        awk -v m=$m '{t[NR] = $1; b += $2} END {printf "delta %-5s %4d transfers: median %.2f ms, %.0f bytes written on average\n", m, NR, t[int((NR + 1) / 2)], b / NR}'
done | tee "$tmp/summary.txt"
awk '{m[NR] = $6} END {if (m[1] > 0) printf "ratio delta/full: %.2f\n", m[2] / m[1]}' "$tmp/summary.txt"
