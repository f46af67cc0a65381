#!/usr/bin/env bash
# overload_test.sh — 64 agents on this machine with the job's default liveness settings
# (heartbeat 200 ms, suspect after 1.5 s, dead after 10 s): 32 trainers (FSDP 8 x EP 4) and 32
# rollouts (16 FP8 replicas of TP 2) of the demo model, over tcp on loopback, all real
# processes. In order:
#   idle     the job ready and one version complete, the 64 agents' CPU time (utime + stime
#            from /proc) over --idle-seconds: together under 5 % of one core (they sleep)
#   hog      two busy loops (sh -c 'while :; do :; done') for --hog-seconds while versions
#            run back to back: every version completes, every rollout byte of each equals the
#            reference (wb-ctl verify), no agent is declared dead or suspect-then-dead
#   kill     with the busy loops still running, kill -9 of a trainer mid-transfer (stopped
#            before the transfer, so the attempt waits for it; killed once it is in flight):
#            it fails because trainer 7 died: its connection closed, or a write to it failed
#            (not silence); the times from the kill to the controller's failing it and to
#            wb-ctl's answer are printed (--kill-limit-ms asserts a bound on the first: make
#            overload)
#   recover  the trainer restarted, one more version completes and verifies
# make test runs the short form (--hog-seconds 20); `make overload` the issue's held-out case
# (--hog-seconds 60 --kill-limit-ms 1000, release build). Prints the harness tally.
set -u
usage() {
    cat <<'EOF'
usage: tests/sh/overload_test.sh [--hog-seconds N] [--idle-seconds N] [--kill-limit-ms MS]
  --hog-seconds N     how long the two busy loops run while versions run (default 20)
  --idle-seconds N    the idle period whose CPU time is measured (default 10)
  --kill-limit-ms MS  fail when the controller fails the attempt later than MS after kill -9
                      (default: printed, not asserted: the scheduler decides it)
Programs from $WB_BIN (default: the build's bin/). WB_KEEP=1 keeps the logs.
EOF
}
hog_s=20 idle_s=10 kill_limit_ms=0
while [ $# -gt 0 ]; do
    case $1 in
    -h | --help)
        usage
        exit 0
        ;;
    --hog-seconds | --idle-seconds | --kill-limit-ms)
        [[ ${2:-} =~ ^[0-9]+$ ]] || { echo "overload_test.sh: $1: '${2:-}' is not a number" >&2 && exit 2; }
        case $1 in
        --hog-seconds) hog_s=$((10#$2)) ;;
        --idle-seconds) idle_s=$((10#$2)) ;;
        --kill-limit-ms) kill_limit_ms=$((10#$2)) ;;
        esac
        shift
        ;;
    *)
        echo "overload_test.sh: unknown argument '$1'" >&2
        usage >&2
        exit 2
        ;;
    esac
    shift
done
build=$(cd "$(dirname "$0")/.." && pwd)
root=$(pwd)
bin=${WB_BIN:-$build/bin}
name="overload 64 agents: idle cost, ${hog_s} s of two busy loops, kill -9 mid-transfer"
echo "$name ..."
tmp=$(mktemp -d /tmp/wb-overload.XXXXXX)
pids=() hogs=() agents=()
declare -A apid=()
stop_hogs() {
    local p
    for p in "${hogs[@]}"; do kill -9 "$p" 2>/dev/null && wait "$p" 2>/dev/null; done
    hogs=()
}
cleanup() {
    stop_hogs
    for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null; done # not a bare wait: the stderr filter
    [ -n "${WB_KEEP:-}" ] && echo "    logs: $tmp" || rm -rf "$tmp"
}
trap cleanup EXIT
fail() {
    echo "    $1"
    [ -f "$tmp/controller.log" ] && grep -v ' heartbeat' "$tmp/controller.log" | tail -n 20 |
        sed 's/^/    | /'
    echo "FAIL $name"
    echo "0 passed, 1 failed, 0 skipped"
    exit 1
}
export WB_TOKEN=overload-$RANDOM$RANDOM
url=tcp://127.0.0.1:$((21000 + RANDOM % 11000)) # below the ephemeral ports (32768-)
cat >"$tmp/trainer.yaml" <<EOF
world_size: 32
gpus_per_node: 8
mesh:
  - {name: fsdp, size: 8}
  - {name: ep, size: 4}
placements:
  - match: "model.layers.{layer}.mlp.experts.{expert}.*"
    place: {fsdp: shard(0), ep: expert}
  - match: "*"
    place: {fsdp: shard(0), ep: shard(0)}
EOF
cat >"$tmp/rollout.yaml" <<EOF
replicas: 16
gpus_per_replica: 2
tp: 2
gpus_per_node: 8
EOF
cat >"$tmp/job.yaml" <<EOF
name: overload
listen: $url
model:
  rules: $root/configs/models/qwen3_moe.yaml
  hf_config: $root/configs/jobs/demo/config.json
trainer_layout: $tmp/trainer.yaml
rollout_layout: $tmp/rollout.yaml
mem_cap: 4MiB
provider: tcp
EOF
mkdir -p "$tmp/dump"
start_agent() { # ROLE RANK
    local extra=()
    [ "$1" = rollout ] && extra=(--dump "$tmp/dump")
    "$bin/wb-agent" --role "$1" --rank "$2" --controller "$url" --tx-domain lo "${extra[@]}" \
        >>"$tmp/$1$2.log" 2>&1 &
    pids+=($!)
    apid[$1$2]=$!
}
# bash reports each child killed by a signal ("line N: PID Killed ...") on its stderr: the test
# kills trainer 7 on purpose, so those lines are dropped (nothing else is).
exec 2> >(grep --line-buffered -v -E '^.*: line [0-9]+: +[0-9]+ Killed +' >&2)
# The controller's log, each line stamped with when it was read (microseconds, as
# EPOCHREALTIME): when it failed the attempt after the kill.
stamp() { while IFS= read -r l; do printf '%s %s\n' "${EPOCHREALTIME/./}" "$l"; done; }
WB_LOG=info "$bin/wb-controller" --config "$tmp/job.yaml" > >(stamp >"$tmp/controller.log") 2>&1 &
pids+=($!)
for r in $(seq 0 31); do
    start_agent trainer "$r"
    start_agent rollout "$r"
done
wait_ready() {
    for _ in $(seq 1 1500); do
        "$bin/wb-ctl" -c "$url" --timeout 5s status 2>/dev/null | grep -q ': ready (gen.*in flight: none' &&
            return 0
        sleep 0.2
    done
    return 1
}
wait_ready || fail "the job never became ready"

# One version: complete, then every rollout's dump of it equals the reference.
version() { # V
    local v=$1 out
    out=$("$bin/wb-ctl" -c "$url" --timeout 300s transfer --version "$v" 2>&1) ||
        fail "transfer $v: $(head -n 3 <<<"$out")"
    grep -q "transfer $v: complete in" <<<"$out" || fail "transfer $v: $(head -n 3 <<<"$out")"
    LAST=$(grep -o "complete in [0-9.]* [a-z]*" <<<"$out")
    for _ in $(seq 1 600); do # the dumps are written on the rollouts' own threads
        [ "$(ls "$tmp/dump" | grep -c "\.v$v\.bin\$")" -eq 32 ] && break
        sleep 0.1
    done
    out=$("$bin/wb-ctl" verify --config "$tmp/job.yaml" --dump "$tmp/dump" --version "$v" 2>&1) ||
        fail "verify $v: $out"
    grep -q "verify version $v: 32 rollouts, .* every byte equals the reference" <<<"$out" ||
        fail "verify $v: $out"
    rm -f "$tmp/dump"/*.v"$v".bin
}
no_deaths() { # WHEN
    if grep -q ' is dead' "$tmp/controller.log"; then
        fail "an agent was declared dead $1: $(grep -m1 ' is dead' "$tmp/controller.log")"
    fi
}
ticks() { # ARRAY: each agent's utime + stime in clock ticks, from /proc, into ARRAY[name]
    local -n into=$1
    local p f
    for p in "${!apid[@]}"; do
        read -r -a f <"/proc/${apid[$p]}/stat" || fail "$p (pid ${apid[$p]}) is gone"
        # fields after "(comm)": the name holds no spaces here (wb-agent)
        into[$p]=$((f[13] + f[14]))
    done
}

v=1
version $v
echo "    version $v: $LAST (no load)"

# idle: the agents sleep between versions
hz=$(getconf CLK_TCK)
sleep 1 # the last reports and dump threads settle
declare -A tick0 tick1
ticks tick0
w0=${EPOCHREALTIME/./}
sleep "$idle_s"
ticks tick1
w1=${EPOCHREALTIME/./}
t0=0 t1=0 used=()
for p in "${!apid[@]}"; do
    t0=$((t0 + tick0[$p])) t1=$((t1 + tick1[$p]))
    used+=("$p $((tick1[$p] - tick0[$p]))")
done
# percent of one core, two decimals: ticks / hz / wall seconds * 100
pct100=$(((t1 - t0) * 100 * 100 * 1000000 / hz / (w1 - w0)))
# The limit is the product's: 5 % for the release build. A sanitizer build (make test's) pays
# ASan's allocator and checks on every message an idle agent handles (the demo job's idle
# agents, 20 s on a 2-core VM: 2-3 ticks each with ASan, 1-2 in the release build): 8 % there.
limit=5
ldd "$bin/wb-agent" 2>/dev/null | grep -q libasan && limit=8
printf '    idle: 64 agents used %d ticks (%d/s) in %d.%03d s: %d.%02d %% of one core (limit %d %%)\n' \
    $((t1 - t0)) "$hz" $(((w1 - w0) / 1000000)) $(((w1 - w0) / 1000 % 1000)) \
    $((pct100 / 100)) $((pct100 % 100)) "$limit"
echo "    idle: the busiest agents (ticks): $(printf '%s\n' "${used[@]}" | sort -k2,2nr | head -n 4 |
    paste -sd, - | sed 's/,/, /g')"
[ "$pct100" -lt $((limit * 100)) ] ||
    fail "64 idle agents used $((pct100 / 100)).$((pct100 % 100)) % of one core (limit $limit %)"
no_deaths "while idle"

# hog: two busy loops while versions run back to back
for _ in 1 2; do
    sh -c 'while :; do :; done' &
    hogs+=($!)
done
hog_end=$((${EPOCHREALTIME/./} + hog_s * 1000000))
n=0
while [ "${EPOCHREALTIME/./}" -lt "$hog_end" ] || [ $n -eq 0 ]; do
    v=$((v + 1))
    version $v
    n=$((n + 1))
    echo "    version $v: $LAST (two busy loops beside)"
done
no_deaths "under the busy loops"
echo "    busy loops: $n versions complete and verified in ${hog_s}+ s, no agent declared dead"

# kill: a trainer killed mid-transfer (the busy loops still run). It is stopped before the
# transfer starts, so the attempt cannot finish without it whatever the machine's load (a kill
# timed into a running transfer sometimes landed after the trainer's part was done: by design
# that death fails nothing); the kill then comes while the transfer is in flight.
v=$((v + 1))
kill -STOP "${apid[trainer7]}"
"$bin/wb-ctl" -c "$url" --timeout 300s transfer --version "$v" >"$tmp/kill.out" 2>&1 &
client=$!
inflight=0
for _ in $(seq 1 3000); do
    if "$bin/wb-ctl" -c "$url" --timeout 5s status 2>/dev/null | grep -q "in flight: $v\$"; then
        inflight=1
        break
    fi
    kill -0 $client 2>/dev/null || break
done
[ $inflight -eq 1 ] || fail "transfer $v was never seen in flight: $(head -n 3 "$tmp/kill.out")"
k0=${EPOCHREALTIME/./}
kill -9 "${apid[trainer7]}"
wait "$client"
rc=$?
k1=${EPOCHREALTIME/./}
stop_hogs
wait "${apid[trainer7]}" 2>/dev/null
kill_ms=$(((k1 - k0) / 1000))
out=$(<"$tmp/kill.out")
if [ $rc -eq 0 ]; then # it finished before the kill landed: not the case under test
    fail "transfer $v completed before the kill landed ($kill_ms ms): $out"
fi
# The first to notice says why: the controller (trainer 7's connections closed) or a trainer
# whose write to it failed (its data connection closed: "the peer died or failed", "Transport
# endpoint is not connected", ...) — both the crash, not silence.
why_re="trainer rank 7 died \(its connection closed\)|write to trainer rank 7( \([0-9]+ bytes at [0-9]+\))?( failed)?: [^()]+"
grep -qE "^wb-ctl: transfer $v failed: ($why_re|[a-z]+ rank [0-9]+: ($why_re))\$" <<<"$out" ||
    fail "transfer $v after kill -9 of trainer 7: $out"
# when the controller failed it (its log line's stamp) and when wb-ctl had the answer: that
# comes once every trainer drained (no write of the attempt can land after it)
k_ctl=$(grep -m1 -E "transfer $v failed: .*($why_re)" "$tmp/controller.log" | cut -d' ' -f1)
[ -n "$k_ctl" ] || fail "the controller's log does not say transfer $v failed for trainer 7"
fail_ms=$(((k_ctl - k0) / 1000))
echo "    kill -9 of trainer 7 mid-transfer: the controller failed the attempt ${fail_ms} ms later" \
    "($(grep -m1 -oE "$why_re" <<<"$out")); wb-ctl had the answer after ${kill_ms} ms"
if [ "$kill_limit_ms" -gt 0 ] && [ "$fail_ms" -gt "$kill_limit_ms" ]; then
    fail "kill -9 to the failed attempt took $fail_ms ms (limit $kill_limit_ms ms)"
fi
if grep ' is dead' "$tmp/controller.log" | grep -qv 'trainer rank 7 is dead: its connection closed'; then
    fail "another agent was declared dead: $(grep ' is dead' "$tmp/controller.log" | grep -v 'trainer rank 7' | head -n 1)"
fi

# recover: the trainer back, the version again
rm -f "$tmp/dump"/*.v"$v".bin
start_agent trainer 7
wait_ready || fail "the job did not become ready again after trainer 7 restarted"
version $v
echo "    version $v: $LAST (trainer 7 restarted)"
"$bin/wb-ctl" -c "$url" shutdown >/dev/null 2>&1
echo "ok $name"
echo "1 passed, 0 failed, 0 skipped"
