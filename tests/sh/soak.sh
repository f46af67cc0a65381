#!/usr/bin/env bash
# soak.sh — the soak test of issue #27: thousands of versions on the demo job (a controller, 4
# trainer and 2 rollout wb-agents, libfabric tcp on loopback), with a fault injected every few
# dozen versions while `wb-ctl transfer` runs — kill -9 of a trainer or a rollout, SIGSTOP of
# one for a few seconds, kill -9 of the controller — and every version that completes checked
# byte for byte against the independent reference (wb-ctl verify). After each fault, once the
# job is ready again, every rollout's claim (its version and torn flag, SIGUSR1) is checked
# against the bytes it holds. `make soak` runs the long form, tests/sh/soak_test.sh (make test)
# a short one. Run with --help for the options.
set -u

usage() {
    cat <<'EOF'
usage: tests/sh/soak.sh [--versions N] [--fault-every K] [--seed S] [--minutes M] [--build DIR]
                        [--timeout SECONDS] [--keep]

Runs the demo job (configs/jobs/demo.yaml: 4 trainers, 2 rollouts, tcp on loopback) for N
versions. Every K versions on average (uniformly K-K/4 .. K+K/4) one fault is injected while
`wb-ctl transfer` runs, after a random delay of 0 .. (a typical transfer's time) ms; the kinds
are dealt from a shuffled deck so that each comes equally often:
  trainer-kill     kill -9 of a random trainer; restarted (same rank) after 0.3-0.6 s
  rollout-kill     kill -9 of a random rollout; restarted the same way (it starts empty)
  trainer-stop     SIGSTOP of a random trainer for 0.5-4 s, then SIGCONT
  rollout-stop     SIGSTOP of a random rollout for 0.5-4 s, then SIGCONT
  controller-kill  kill -9 of the controller; restarted (same job file and URL) after 0-0.5 s;
                   the agents register again by themselves
Checked:
  - every version that completes: every rollout byte equals the reference (wb-ctl verify);
    a failed attempt is retried (same version, at most 8 attempts) until it completes
  - no `wb-ctl transfer` outlives its --timeout (+ wb-ctl's 5 s + 10 s grace): else a hang
  - after each fault, once `wb-ctl status` says ready with nothing in flight: each rollout's
    claim (SIGUSR1: version V, torn 0|1) — torn 0 must mean its bytes verify exactly as V,
    and V is the controller's last complete version (0 only for a rollout restarted since);
    the controller's version is the last one a client saw complete, or, after a controller
    restart, the one whose attempt the client lost with it
  - `wb-ctl status` never says ready while a killed agent is down; a stopped one (0.5-4 s,
    below the demo job's dead_after of 10 s) is shown suspect once stopped past suspect_after
    (1.5 s, +0.5 s) and never dead: a starved process is not killed mid-job; the attempt it
    was in waits for it (it completes, or fails for a reason, e.g. the transport's timeout)
  - no agent or controller exits by itself; at the end a clean shutdown (exit 0) and, in a
    sanitizer build, no sanitizer report in any log
Prints a summary with the counts; exits 1 on a wrong byte, a hang, a failed state check, a
crash, a job that does not recover within 60 s, or the time bound (--minutes) passing before
the end. Logs are kept (the path is printed) when it fails, removed when it passes.

  --versions N       versions to complete (default 2000)
  --fault-every K    mean versions between faults (default 30; 0: no faults)
  --seed S           seed of the fault schedule, kinds, victims and delays (default: random;
                     printed, so a run can be repeated as far as timing allows)
  --minutes M        hard bound on the whole run (default 10): no version starts in its last
                     60 s, and the run is stopped (and fails) when it passes
  --build DIR        programs in DIR/bin (default $WB_BIN, else build/bin of the checkout)
  --timeout SECONDS  each transfer's --timeout (default 20)
  --kinds LIST       only these fault kinds, comma-separated (default: all five)
  --keep             keep the logs even when it passes
EOF
}

versions=2000 fault_every=30 seed=$((RANDOM * 32768 + RANDOM)) minutes=10 build='' xfer_timeout=20
keep=0 kinds_opt=''
while [ $# -gt 0 ]; do
    opt=$1 val=
    case $opt in
    --*=*) val=${opt#*=} opt=${opt%%=*} ;;
    esac
    case $opt in
    -h | --help)
        usage
        exit 0
        ;;
    --keep) keep=1 ;;
    --versions | --fault-every | --seed | --minutes | --build | --timeout | --kinds)
        if [ -z "$val" ]; then
            [ $# -ge 2 ] || { echo "soak.sh: $opt needs a value" >&2 && exit 2; }
            val=$2
            shift
        fi
        case $opt in
        --build) build=$val ;;
        --kinds) kinds_opt=$val ;;
        *)
            [[ $val =~ ^[0-9]+$ ]] || { echo "soak.sh: $opt: '$val' is not a number" >&2 && exit 2; }
            case $opt in
            --versions) versions=$((10#$val)) ;;
            --fault-every) fault_every=$((10#$val)) ;;
            --seed) seed=$((10#$val)) ;;
            --minutes) minutes=$((10#$val)) ;;
            --timeout) xfer_timeout=$((10#$val)) ;;
            esac
            ;;
        esac
        ;;
    *)
        echo "soak.sh: unknown argument '$1'" >&2
        usage >&2
        exit 2
        ;;
    esac
    shift
done
if [ "$versions" -lt 1 ] || [ "$minutes" -lt 2 ] || [ "$xfer_timeout" -lt 1 ]; then
    echo "soak.sh: needs --versions >= 1, --minutes >= 2, --timeout >= 1" >&2
    exit 2
fi

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
if [ -n "$build" ]; then
    bin=$build/bin
else
    bin=${WB_BIN:-$root/build/bin}
fi
job=$root/configs/jobs/demo.yaml
for p in wb-controller wb-agent wb-ctl; do
    [ -x "$bin/$p" ] || { echo "soak.sh: $bin/$p: not built (make all, or give --build DIR)" >&2 && exit 2; }
done
[ -f "$job" ] || { echo "soak.sh: $job: missing" >&2 && exit 2; }

RANDOM=$seed
NTR=4 NRO=2
SUSPECT_AFTER_MS=1500 # the demo job's suspect_after (a stopped agent is shown suspect) ...
DEAD_AFTER_MS=10000   # ... and dead_after: the stops (0.5-4 s) stay below it
READY_BOUND=60     # seconds a recovery may take
MAX_ATTEMPTS=8     # attempts of one version
tmp=$(mktemp -d "${TMPDIR:-/tmp}/wb-soak.XXXXXX")
logs=$tmp/logs dump=$tmp/dump
mkdir -p "$logs" "$dump"
export WB_TOKEN=soak-$RANDOM$RANDOM$RANDOM
url=tcp://127.0.0.1:$((21000 + RANDOM % 11000)) # below the ephemeral ports (32768-)

# bash reports each child killed by a signal ("line N: PID Killed ...") on its stderr: the
# harness kills on purpose, so those lines are dropped (nothing else is).
exec 2> >(grep --line-buffered -v -E '^.*: line [0-9]+: +[0-9]+ Killed +' >&2)
# A sleep without a process: read on a descriptor that never has data.
exec {snooze_fd}<> <(:)
snooze() { read -r -t "$1" -u "$snooze_fd" _ || :; }
now() { NOW=${EPOCHREALTIME/./}; } # microseconds
now
t_start=$NOW

# ---------------------------------------------------------------- processes
declare -A pid=() nstart=()
cpid=                               # the wb-ctl transfer running, if any
watchdog=
failed=0
cleanup() {
    local p all=("${pid[@]}" ${cpid:+"$cpid"})
    [ -n "$watchdog" ] && kill "$watchdog" 2>/dev/null && wait "$watchdog" 2>/dev/null
    [ -n "$cpid" ] && kill -TERM "$cpid" 2>/dev/null # timeout passes it on to its wb-ctl
    for p in "${pid[@]}"; do kill -9 "$p" 2>/dev/null; done
    for p in "${all[@]}"; do wait "$p" 2>/dev/null; done # not a bare wait: the stderr filter
    if [ "$failed" -ne 0 ] || [ "$keep" -eq 1 ]; then
        rm -rf "$dump"
        echo "soak: logs kept in $tmp"
    else
        rm -rf "$tmp"
    fi
}
trap cleanup EXIT
trap 'fatal "the time bound (--minutes $minutes) passed"' USR1
trap 'fatal "interrupted"' INT TERM

start_controller() {
    local n=${nstart[controller]:-0}
    nstart[controller]=$((n + 1))
    WB_LOG=info "$bin/wb-controller" --config "$job" --listen "$url" >"$logs/controller.$n.log" 2>&1 &
    pid[controller]=$!
}

start_agent() { # ROLE RANK
    local who=$1$2 n=${nstart[$1$2]:-0} extra=()
    nstart[$who]=$((n + 1))
    [ "$1" = rollout ] && extra=(--dump "$dump")
    WB_LOG=info "$bin/wb-agent" --role "$1" --rank "$2" --controller "$url" --tx-domain lo \
        "${extra[@]}" >"$logs/$who.$n.log" 2>&1 &
    pid[$who]=$!
}

reap() { # NAME: waits for a process killed with SIGKILL
    wait "${pid[$1]}" 2>/dev/null
    unset "pid[$1]"
}

# ---------------------------------------------------------------- counters
complete=0 verified=0 wrong=0 by_word=0 attempts=0 failed_attempts=0 refused=0 retries=0
hangs=0 faults=0 mid=0 mid_failed=0 mid_ok=0 mid_refused=0 checks=0 checks_ok=0
stale=0 stale_ms=0 stop_wrong=0 stop_polls=0 stop_ok=0 stop_failed=0 claims_torn=0 claims_whole=0 claims_failed_whole=0 claims_empty=0 ready_down=0 unprovoked=0 status_polls=0
declare -A kind_n=()
KINDS=(trainer-kill rollout-kill trainer-stop rollout-stop controller-kill)
deal=("${KINDS[@]}") # the kinds dealt
if [ -n "$kinds_opt" ]; then
    IFS=, read -r -a deal <<<"$kinds_opt"
    for k in "${deal[@]}"; do
        [[ " ${KINDS[*]} " == *" $k "* ]] || { echo "soak.sh: --kinds: no fault kind '$k' (${KINDS[*]})" >&2 && exit 2; }
    done
fi
deck=()
last_complete=0 # the last version a client saw complete (or the controller said so)
typical_ms=100  # a fault-free transfer's time as wb-ctl sees it (moving average)
declare -A fresh=() # rollouts restarted since the last complete version

summary() {
    now
    local secs=$(((NOW - t_start) / 1000000)) k kinds=""
    for k in "${KINDS[@]}"; do kinds+="${kinds:+, }$k ${kind_n[$k]:-0}"; done
    echo
    echo "== soak summary: the demo job (4 trainers, 2 rollouts, tcp on lo), seed $seed, ${secs} s"
    printf '  %-34s %s\n' \
        "versions complete" "$complete of $versions (each verified against the reference: $verified; complete by a restarted controller's word: $by_word)" \
        "complete with a wrong byte" "$wrong" \
        "transfer attempts" "$attempts (failed $failed_attempts, refused $refused, retries $retries, failed with no fault in them $unprovoked)" \
        "hangs past the timeout" "$hangs" \
        "faults" "$faults ($kinds)" \
        "mid-transfer faults" "$mid (the transfer then failed $mid_failed, succeeded $mid_ok, was refused $mid_refused)" \
        "state checks" "$checks done, $checks_ok passed (claims: torn $claims_torn; whole and verified $claims_whole, $claims_failed_whole of them at a version whose attempt failed after they committed; empty after a restart $claims_empty)" \
        "status ready while an agent down" "$ready_down (of $status_polls polls while one was down; stale answers before the controller had noticed: $stale, the latest $stale_ms ms after its fault)" \
        "status wrong about a stopped agent" "$stop_wrong (of $stop_polls polls while one was stopped past suspect_after: suspect expected, never dead)" \
        "mid-transfer stops" "the attempt waited and completed $stop_ok, failed $stop_failed"
    echo "soak-counts: complete=$complete verified=$verified wrong=$wrong hangs=$hangs faults=$faults" \
        "$(for k in "${KINDS[@]}"; do printf '%s=%s ' "${k/-/_}" "${kind_n[$k]:-0}"; done)mid=$mid" \
        "checks=$checks checks_ok=$checks_ok ready_down=$ready_down stop_wrong=$stop_wrong" \
        "stop_ok=$stop_ok stop_failed=$stop_failed failed=$failed"
}

fatal() {
    failed=1
    echo "soak: FAIL: $1"
    local clog=$logs/controller.$((${nstart[controller]:-1} - 1)).log
    [ -f "$clog" ] && grep -v ' heartbeat' "$clog" | tail -n 15 | sed 's/^/    | /'
    summary
    exit 1
}

problem() { # a failed check that does not stop the run
    failed=1
    echo "soak: FAIL: $1"
    printf '%(%T)T %s\n' -1 "$1" >>"$logs/problems.log"
}

# ---------------------------------------------------------------- the controller's view
STATUS=
status() { # the whole status in STATUS; 0 when the controller answered
    STATUS=$("$bin/wb-ctl" -c "$url" --timeout 2s status 2>&1)
}
is_ready() { [[ ${STATUS%%$'\n'*} == *": ready (gen "*", in flight: none" ]]; }
ctl_version() { # the controller's last complete version, from STATUS
    local l=${STATUS%%$'\n'*}
    [[ $l =~ \),\ version\ ([0-9]+),\ in\ flight ]] && echo "${BASH_REMATCH[1]}"
}

wait_ready() { # WHY: until ready with nothing in flight, at most READY_BOUND s
    now
    local until=$((NOW + READY_BOUND * 1000000))
    while :; do
        status && is_ready && return 0
        now
        [ "$NOW" -ge "$until" ] && fatal "the job did not recover within ${READY_BOUND} s ($1): ${STATUS%%$'\n'*}"
        snooze 0.05
    done
}

# Polls the status for MS milliseconds while an agent is down (killed). The controller learns
# of it asynchronously — a closed connection on nng's thread — so answers of "ready" before its first other answer are
# stale, not wrong (counted, with how late they came); "ready" after it said otherwise, or
# still "ready" LATE ms after the fault, is.
watch_down() { # MS WHO LATE (T_FAULT: when the fault was sent)
    now
    local until=$((NOW + $1 * 1000)) late=$((T_FAULT + $3 * 1000)) t noticed=0 ms
    while [ "$NOW" -lt "$until" ] || { [ $noticed = 0 ] && [ "$NOW" -lt "$late" ]; }; do
        t=$NOW
        if status; then
            status_polls=$((status_polls + 1))
            ms=$(((t - T_FAULT) / 1000))
            if [[ ${STATUS%%$'\n'*} != *": ready (gen "* ]]; then
                noticed=1
            elif [ $noticed = 0 ] && [ "$t" -lt "$late" ]; then
                stale=$((stale + 1))
                [ $ms -gt "$stale_ms" ] && stale_ms=$ms
            else
                ready_down=$((ready_down + 1))
                problem "wb-ctl status (asked $ms ms after the fault) says ready while $2 is down$([ $noticed = 1 ] && echo ", after it said otherwise"): ${STATUS%%$'\n'*}"
                printf '%s\n' "$STATUS" >>"$logs/problems.log"
            fi
        fi
        snooze 0.05
        now
    done
}

# Polls the status for MS milliseconds while WHO is stopped past suspect_after (and below
# dead_after): its row must say "suspect". "alive" before the controller first said so, up to
# LATE ms after the stop, is stale (counted with the others); "alive" after it, or "dead" ever,
# is wrong.
watch_suspect() { # MS WHO LATE (T_FAULT: when the stop was sent)
    now
    local until=$((NOW + $1 * 1000)) late=$((T_FAULT + $3 * 1000)) t noticed=0 ms st
    local role=${2//[0-9]/} rank=${2//[a-z]/}
    while [ "$NOW" -lt "$until" ] || { [ $noticed = 0 ] && [ "$NOW" -lt "$late" ]; }; do
        t=$NOW
        if status; then
            stop_polls=$((stop_polls + 1))
            ms=$(((t - T_FAULT) / 1000))
            st=$(grep -m1 -oE "^$role +$rank +[a-z]+" <<<"$STATUS")
            st=${st##* }
            if [ "$st" = suspect ]; then
                noticed=1
            elif [ "$st" = alive ] && [ $noticed = 0 ] && [ "$t" -lt "$late" ]; then
                stale=$((stale + 1))
                [ $ms -gt "$stale_ms" ] && stale_ms=$ms
            else
                stop_wrong=$((stop_wrong + 1))
                problem "wb-ctl status (asked $ms ms after the stop) says $role $rank is '${st:-absent}' while it is stopped (suspect expected$([ $noticed = 1 ] && echo ", it said so before"))"
                printf '%s\n' "$STATUS" >>"$logs/problems.log"
            fi
        fi
        snooze 0.05
        now
    done
}

check_alive() { # every process the harness started is still there
    local k
    for k in "${!pid[@]}"; do
        if ! kill -0 "${pid[$k]}" 2>/dev/null; then
            wait "${pid[$k]}" 2>/dev/null
            local rc=$?
            fatal "$k (pid ${pid[$k]}) exited by itself with status $rc: see $logs/$k.$((${nstart[$k]} - 1)).log"
        fi
    done
}

# ---------------------------------------------------------------- checks
verify_version() { # V: every rollout's dump of V, then the dumps are removed
    local v=$1 out
    if out=$("$bin/wb-ctl" verify --config "$job" --dump "$dump" --version "$v" 2>&1) &&
        [[ $out == *"every byte equals the reference"* ]]; then
        verified=$((verified + 1))
    else
        wrong=$((wrong + 1))
        mkdir -p "$logs/wrong.v$v"
        cp "$dump"/rollout*.v"$v".bin "$logs/wrong.v$v/" 2>/dev/null
        problem "version $v complete with bytes unlike the reference: $(head -n 3 <<<"$out")"
    fi
    rm -f "$dump"/rollout*.v"$v".bin "$dump"/rollout*.v"$v".bin.tmp*
}

# After a fault, once the job is ready: every rollout's claim against its bytes.
state_check() { # CTLV: the controller's last complete version; FAILED: the failed attempt's
    local ctlv=$1 failedv=${2:-} r claim v t f out
    local sdir=$dump/state
    rm -rf "$sdir"
    for r in $(seq 0 $((NRO - 1))); do kill -USR1 "${pid[rollout$r]}"; done
    for r in $(seq 0 $((NRO - 1))); do
        now
        local until=$((NOW + 10000000))
        while [ ! -f "$sdir/rollout$r.txt" ] && [ "$NOW" -lt "$until" ]; do
            snooze 0.02
            now
        done
        checks=$((checks + 1))
        claim=$(cat "$sdir/rollout$r.txt" 2>/dev/null)
        if ! [[ $claim =~ ^version\ ([0-9]+)\ torn\ ([01])\ in_flight\ ([01])$ ]]; then
            problem "rollout $r: no state claim within 10 s of SIGUSR1 ('$claim')"
            continue
        fi
        v=${BASH_REMATCH[1]} t=${BASH_REMATCH[2]} f=${BASH_REMATCH[3]}
        if [ "$t" = 1 ]; then
            claims_torn=$((claims_torn + 1))
            checks_ok=$((checks_ok + 1))
        elif [ "$f" = 1 ]; then
            problem "rollout $r claims version $v whole while a transfer is in flight at it"
        elif [ "$v" = 0 ] && [ -n "${fresh[$r]:-}" ]; then
            claims_empty=$((claims_empty + 1))
            checks_ok=$((checks_ok + 1))
        elif [ "$v" != "$ctlv" ] && [ "$v" != "$failedv" ]; then
            problem "rollout $r claims version $v whole (torn 0), the controller's last complete is $ctlv"
        else
            # V is the controller's version, or the one whose attempt just failed: a rollout
            # commits when told every rollout counted every byte, and the attempt can still
            # fail before the others committed (one died): then it holds V whole all the same
            if out=$("$bin/wb-ctl" verify --config "$job" --dump "$sdir" --version "$v" \
                --rank "$r" 2>&1) && [[ $out == *"every byte equals the reference"* ]]; then
                claims_whole=$((claims_whole + 1))
                [ "$v" != "$ctlv" ] && claims_failed_whole=$((claims_failed_whole + 1))
                checks_ok=$((checks_ok + 1))
            else
                mkdir -p "$logs/state.$faults"
                cp -r "$sdir"/. "$logs/state.$faults/"
                problem "rollout $r claims version $v whole (torn 0) but holds other bytes: $(head -n 2 <<<"$out")"
            fi
        fi
    done
    rm -rf "$sdir"
}

# ---------------------------------------------------------------- one attempt
next_kind() {
    if [ ${#deck[@]} -eq 0 ]; then
        deck=("${deal[@]}")
        local i j x
        for ((i = ${#deck[@]} - 1; i > 0; i--)); do
            j=$((RANDOM % (i + 1)))
            x=${deck[i]} deck[i]=${deck[j]} deck[j]=$x
        done
    fi
    KIND=${deck[0]}
    deck=("${deck[@]:1}")
}

# Runs `wb-ctl transfer --version V` with fault KIND (or none) injected mid-way; sets A_RC (0
# complete, 1 failed or refused), A_OUT (what wb-ctl said), A_MID (the fault landed while it ran).
attempt() { # V KIND
    local v=$1 kind=$2 out=$tmp/attempt.out t0 wall who delay stop_ms
    attempts=$((attempts + 1))
    now
    t0=$NOW
    timeout -k 5 $((xfer_timeout + 15)) "$bin/wb-ctl" -c "$url" --timeout "${xfer_timeout}s" \
        transfer --version "$v" >"$out" 2>&1 &
    cpid=$!
    A_MID=0
    if [ "$kind" != none ]; then
        faults=$((faults + 1))
        kind_n[$kind]=$((${kind_n[$kind]:-0} + 1))
        delay=$((RANDOM % (typical_ms + 1)))
        snooze "$(printf '%d.%03d' $((delay / 1000)) $((delay % 1000)))"
        case $kind in
        trainer-*) who=trainer$((RANDOM % NTR)) ;;
        rollout-*) who=rollout$((RANDOM % NRO)) ;;
        *) who=controller ;;
        esac
        now
        T_FAULT=$NOW
        case $kind in
        *-kill) kill -9 "${pid[$who]}" ;;
        *-stop) kill -STOP "${pid[$who]}" ;;
        esac
        kill -0 "$cpid" 2>/dev/null && A_MID=1
        [ $A_MID = 1 ] && mid=$((mid + 1))
        FAULT_DESC="$kind $who at +${delay} ms$([ $A_MID = 1 ] && echo ", mid-transfer")"
        case $kind in
        controller-kill)
            reap controller
            snooze "0.$((RANDOM % 500 + 100))"
            start_controller
            ;;
        *-kill)
            reap "$who"
            local rank=${who//[a-z]/} role=${who//[0-9]/}
            watch_down $((200 + RANDOM % 300)) "$who (killed)" 2000
            start_agent "$role" "$rank"
            [ "$role" = rollout ] && fresh[$rank]=1
            ;;
        *-stop)
            stop_ms=$((500 + RANDOM % 3500))
            FAULT_DESC+=" for $stop_ms ms"
            local past=$((SUSPECT_AFTER_MS + 500))
            if [ "$stop_ms" -gt "$past" ]; then
                snooze "$(printf '%d.%03d' $((past / 1000)) $((past % 1000)))"
                watch_suspect $((stop_ms - past)) "$who" $((SUSPECT_AFTER_MS + 2000))
            else
                snooze "$(printf '%d.%03d' $((stop_ms / 1000)) $((stop_ms % 1000)))"
            fi
            kill -CONT "${pid[$who]}"
            ;;
        esac
    fi
    wait "$cpid"
    local rc=$?
    cpid=
    now
    wall=$(((NOW - t0) / 1000))
    A_OUT=$(<"$out")
    if [ $rc -eq 124 ] || [ $rc -eq 137 ] || [[ $A_OUT == *"no answer (timed out)"* ]]; then
        hangs=$((hangs + 1))
        cp "$out" "$logs/hang.v$v.out"
        fatal "transfer $v did not return within its timeout (${xfer_timeout} s + grace; took ${wall} ms): $(head -n 2 <<<"$A_OUT")"
    fi
    if [ $rc -eq 0 ] && [[ $A_OUT == *"transfer $v: complete in"* ]]; then
        A_RC=0
        if [ "$kind" = none ]; then
            typical_ms=$(((typical_ms * 7 + wall) / 8))
        elif [ $A_MID = 1 ]; then
            mid_ok=$((mid_ok + 1))
            [[ $kind == *-stop ]] && stop_ok=$((stop_ok + 1))
        fi
    else
        A_RC=1
        if [[ $A_OUT == *"transfer $v failed"* ]]; then
            failed_attempts=$((failed_attempts + 1))
            [ "$kind" = none ] && unprovoked=$((unprovoked + 1))
            [ $A_MID = 1 ] && mid_failed=$((mid_failed + 1))
            [ $A_MID = 1 ] && [[ $kind == *-stop ]] && stop_failed=$((stop_failed + 1))
        else
            refused=$((refused + 1))
            [ $A_MID = 1 ] && mid_refused=$((mid_refused + 1))
        fi
    fi
    local desc=
    [ "$kind" = none ] || desc=" ($FAULT_DESC)"
    printf '%(%T)T v%s: %s%s rc %s, %s ms: %s\n' -1 "$v" "$kind" "$desc" \
        "$rc" "$wall" "${A_OUT%%$'\n'*}" >>"$logs/attempts.log"
}

# ---------------------------------------------------------------- the run
hard_s=$((minutes * 60))
soft_end=$((t_start + (hard_s - 60) * 1000000))
(
    trap 'kill $sp 2>/dev/null; exit 0' TERM
    sleep "$hard_s" &
    sp=$!
    wait $sp && kill -USR1 $$
) &
watchdog=$!

echo "soak: $versions versions, a fault every ~$fault_every, seed $seed, at most $minutes min;" \
    "programs $bin, controller $url, logs $tmp"
start_controller
for r in $(seq 0 $((NTR - 1))); do start_agent trainer "$r"; done
for r in $(seq 0 $((NRO - 1))); do start_agent rollout "$r"; done
wait_ready "the job's start"

gap() { # versions until the next fault
    if [ "$fault_every" -eq 0 ]; then
        echo $((versions + 1))
    else
        local q=$((fault_every / 4))
        echo $((fault_every - q + RANDOM % (2 * q + 1)))
    fi
}
until_fault=$(gap)
v=0
stopped_early=
while [ "$complete" -lt "$versions" ]; do
    now
    if [ "$NOW" -ge "$soft_end" ]; then
        stopped_early="the time bound: no version starts in the last 60 s of $minutes min"
        break
    fi
    v=$((last_complete + 1))
    check_alive
    kind=none
    until_fault=$((until_fault - 1))
    if [ "$until_fault" -le 0 ]; then
        next_kind
        kind=$KIND
        until_fault=$(gap)
    fi
    n=0
    while :; do
        n=$((n + 1))
        [ $n -gt 1 ] && retries=$((retries + 1))
        attempt "$v" "$kind"
        ctlv=
        if [ "$kind" != none ]; then
            wait_ready "after $FAULT_DESC"
            ctlv=$(ctl_version)
            # the controller goes on from the last version a client saw complete, or, having
            # restarted, from the one whose answer was lost with it
            seen=$last_complete
            [ $A_RC -eq 0 ] && seen=$v
            if [ "$ctlv" != "$seen" ] &&
                ! { [ "$kind" = controller-kill ] && [ "$ctlv" = "$v" ]; }; then
                problem "after $FAULT_DESC the controller's last complete version is $ctlv, the last a client saw complete $seen"
            fi
            rm -f "$dump"/*.tmp* # a killed rollout's unfinished dump
            if [ $A_RC -eq 0 ]; then state_check "$ctlv"; else state_check "$ctlv" "$v"; fi
            if [ $A_RC -eq 0 ]; then
                echo "soak: fault $faults (version $v): $FAULT_DESC; transfer complete"
            else
                echo "soak: fault $faults (version $v): $FAULT_DESC; transfer failed: ${A_OUT%%$'\n'*}"
            fi
        elif [ $A_RC -ne 0 ]; then
            echo "soak: version $v: attempt $n failed with no fault in it: ${A_OUT%%$'\n'*}"
            wait_ready "after attempt $n of version $v failed"
            ctlv=$(ctl_version)
        fi
        if [ $A_RC -eq 0 ]; then
            break
        fi
        if [ "$ctlv" = "$v" ]; then # the controller holds it complete: a retry is refused
            if [ "$kind" = controller-kill ]; then
                by_word=$((by_word + 1))
                echo "soak: version $v: the restarted controller holds it complete (its answer was lost)"
            fi # else reported above: a live controller that failed it must not
            break
        fi
        [ $n -ge $MAX_ATTEMPTS ] && fatal "version $v failed $n attempts: $(head -n 1 <<<"$A_OUT")"
        kind=none
    done
    complete=$((complete + 1))
    last_complete=$v
    fresh=()
    verify_version "$v"
    if [ $((complete % 250)) -eq 0 ]; then
        now
        echo "soak: $complete/$versions versions, $faults faults, $wrong wrong, $hangs hangs," \
            "$(((NOW - t_start) / 1000000)) s"
    fi
done

# A clean end: every process exits 0 after the shutdown; no sanitizer report anywhere.
check_alive
"$bin/wb-ctl" -c "$url" shutdown >/dev/null 2>&1 || problem "wb-ctl shutdown failed"
for k in "${!pid[@]}"; do
    for _ in $(seq 1 300); do
        kill -0 "${pid[$k]}" 2>/dev/null || break
        snooze 0.05
    done
    if kill -0 "${pid[$k]}" 2>/dev/null; then
        problem "$k did not exit within 15 s of the shutdown"
        kill -9 "${pid[$k]}"
    fi
    wait "${pid[$k]}"
    rc=$?
    [ $rc -eq 0 ] || problem "$k exited with status $rc after the shutdown"
    unset "pid[$k]"
done
if grep -l -E 'ERROR: (Address|Leak)Sanitizer|runtime error:' "$logs"/*.log >/dev/null 2>&1; then
    problem "sanitizer reports in: $(grep -l -E 'ERROR: (Address|Leak)Sanitizer|runtime error:' "$logs"/*.log | xargs -n1 basename | tr '\n' ' ')"
fi
[ "$hangs" -eq 0 ] && [ "$wrong" -eq 0 ] && [ "$checks" -eq "$checks_ok" ] || failed=1
summary
[ -n "$stopped_early" ] && echo "soak: stopped early ($stopped_early)"
if [ "$failed" -ne 0 ]; then
    echo "soak: FAIL"
    exit 1
fi
echo "soak: PASS"
