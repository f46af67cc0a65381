#!/usr/bin/env bash
# trace_cost.sh — what the agents' traces cost the transfers: the demo job (make demo: a
# controller, 4 trainer and 2 rollout wb-agents over tcp on loopback) run without traces and with
# the job's trace: directory (every agent writes its file after each version, trace_keep: 8),
# in alternating rounds, each round V versions back to back (wb-ctl transfer, one after the
# other: a version's trace is being written while the next one runs). Prints the median
# "complete in" time of each, their ratio (with / without), and how long the agents took to
# write their files (their debug lines, from one more run with WB_LOG=debug, not timed).
#   bench/trace_cost.sh [BUILD_DIR] [VERSIONS] [ROUNDS]   (run from the repository root;
#                                                         defaults build, 30, 3)
set -u
build=${1:-build}
versions=${2:-30}
rounds=${3:-3}
bin=$build/bin
tmp=$(mktemp -d)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
    wait 2>/dev/null
    rm -rf "$tmp"
}
trap cleanup EXIT
export WB_TOKEN=bench-$RANDOM
port=$((21000 + RANDOM % 10000))
url=tcp://127.0.0.1:$port

# job FILE [EXTRA...]: the demo job with absolute paths
job() {
    local f=$1
    shift
    sed -e "s|\.\./models/|$PWD/configs/models/|" -e "s|demo/|$PWD/configs/jobs/demo/|" \
        -e "s|^listen:.*|listen: $url|" configs/jobs/demo.yaml >"$f"
    printf '%s\n' "$@" >>"$f"
}

# run LABEL JOB LOGLEVEL: the job, VERSIONS transfers; their times (ms) appended to LABEL.ms
run() {
    local label=$1 jobf=$2 lvl=$3
    pids=()
    WB_LOG=$lvl "$bin/wb-controller" --config "$jobf" >"$tmp/$label.ctl.log" 2>&1 &
    pids+=($!)
    for r in 0 1 2 3; do
        WB_LOG=$lvl "$bin/wb-agent" --role trainer --rank $r --controller "$url" --tx-domain lo \
            >"$tmp/$label.t$r.log" 2>&1 &
        pids+=($!)
    done
    for r in 0 1; do
        WB_LOG=$lvl "$bin/wb-agent" --role rollout --rank $r --controller "$url" --tx-domain lo \
            >"$tmp/$label.r$r.log" 2>&1 &
        pids+=($!)
    done
    local ok=0
    for _ in $(seq 300); do
        "$bin/wb-ctl" -c "$url" --timeout 5s status 2>/dev/null | grep -q ": ready" && { ok=1; break; }
        sleep 0.1
    done
    [ $ok = 1 ] || { echo "$label: the job did not become ready"; cat "$tmp/$label.ctl.log"; exit 1; }
    for v in $(seq "$versions"); do
        out=$("$bin/wb-ctl" -c "$url" --timeout 60s transfer --version "$v") ||
            { echo "$label: transfer $v failed:"; echo "$out"; exit 1; }
        echo "$out" | sed -n 's/^transfer [0-9]*: complete in \([0-9.]*\) ms.*/\1/p' >>"$tmp/$label.ms"
    done
    "$bin/wb-ctl" -c "$url" shutdown >/dev/null
    for p in "${pids[@]}"; do wait "$p"; done
    pids=()
}

med() { sort -g "$1" | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

mkdir -p "$tmp/traces"
job "$tmp/off.yaml"
job "$tmp/on.yaml" "trace: $tmp/traces" "trace_keep: 8"
for i in $(seq "$rounds"); do
    if [ $((i % 2)) = 1 ]; then run off "$tmp/off.yaml" warn; run on "$tmp/on.yaml" warn
    else run on "$tmp/on.yaml" warn; run off "$tmp/off.yaml" warn; fi
done
files=$(ls "$tmp/traces" | wc -l)
rm -rf "$tmp/traces" && mkdir -p "$tmp/traces"
run debug "$tmp/on.yaml" debug
off=$(med "$tmp/off.ms")
on=$(med "$tmp/on.ms")
echo "demo job, $versions versions back to back x $rounds rounds each, $bin"
echo "without traces: median $off ms per transfer ($(wc -l <"$tmp/off.ms") transfers)"
echo "with traces:    median $on ms per transfer ($(wc -l <"$tmp/on.ms") transfers; $files files kept)"
echo "ratio with / without: $(echo "scale=3; $on / $off" | bc)"
cat "$tmp"/debug.[tr]*.log | sed -n 's/.*trace .* written (\([0-9]*\) events) in \([0-9.]*\) ms/\1 \2/p' >"$tmp/w"
echo "trace files written by the writer threads: $(wc -l <"$tmp/w"), median $(awk '{ print $2 }' "$tmp/w" >"$tmp/wms"; med "$tmp/wms") ms each (events: $(awk '{ print $1 }' "$tmp/w" | sort -g | head -1) to $(awk '{ print $1 }' "$tmp/w" | sort -g | tail -1))"
