#!/usr/bin/env bash
# fault_test.sh — the unwind paths, run on purpose: a real small job (a controller, 2 trainer
# agents FSDP 2 and 2 rollout agents TP 2 of the demo model, libfabric tcp on loopback) with the
# fault-injection build (make fault: build/fault, ASan + UBSan), failing one point per run —
# the Nth allocation, data-plane post or CUDA call (common/fault.h) — in one process: the
# controller, trainer rank 0, rollout rank 0 or the wb-ctl that asks for the transfer.
#
# A first run without a failure counts each role's points (WB_FAULT_COUNT). Then, per point,
# the run is clean when: no process died by a signal, no sanitizer report (ASan, LeakSanitizer,
# UBSan) is in any log, nothing hung (every wait has a limit), a process that exited before the
# shutdown exited non-zero with its error on stderr, and the job recovered: the failed process
# is started again without the failure (a failed transfer is asked again) and a transfer
# completes whose every rollout byte equals the reference (wb-ctl verify) — or, where an
# agent's setup or connection failed (it then waits for an operator), wb-ctl status says so;
# then everything shuts down with status 0 within a limit. A point a run never reached (counts
# vary a little with timing) is reported as such.
#
# make test runs an evenly spread sample (WB_FAULT_SAMPLE points per role and kind, default
# below); WB_FAULT_ALL=1 (or the argument --all) runs every point, WB_FAULT_STRIDE=K with it
# every Kth (1, 1+K, ...). WB_FAULT_ONLY="ROLE KIND N[,ROLE KIND N...]" runs those points.
# WB_FAULT_ROLES and WB_FAULT_KINDS narrow the roles and kinds; WB_FAULT_JOBS=N runs N points
# side by side; WB_KEEP=1 keeps every log, WB_FAULT_SAVE=DIR those of the runs not clean;
# WB_FAULT_TRACE=1 shows where each failure hit; WB_FAULT_VERBOSE=1 prints every outcome.
# Prints the harness tally: one test per point.
set -u
root=$(pwd)
fbin=${WB_FAULT_BIN:-$root/build/fault/bin}
all=${WB_FAULT_ALL:-0}
[ "${1:-}" = "--all" ] && all=1
export ASAN_OPTIONS=${ASAN_OPTIONS:-protect_shadow_gap=0:detect_leaks=1:abort_on_error=0:handle_abort=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1}

if [ ! -x "$fbin/wb-controller" ] || [ ! -x "$fbin/wb-agent" ] || [ ! -x "$fbin/wb-ctl" ]; then
    echo "fault ..."
    echo "SKIP fault: skipped: no fault-injection build in $fbin (make fault)"
    echo "0 passed, 0 failed, 1 skipped"
    exit 0
fi

tmp=$(mktemp -d /tmp/wb-fault.XXXXXX)
pids=()
cleanup() {
    for p in "${pids[@]}"; do # still one of ours (its pid may have been reused since)
        { tr '\0' ' ' <"/proc/$p/cmdline"; } 2>/dev/null | grep -q -e "$fbin/" -e "$tmp" &&
            kill -9 "$p" 2>/dev/null
    done
    wait 2>/dev/null
    [ -n "${WB_KEEP:-}" ] && echo "    logs: $tmp" || rm -rf "$tmp"
}
trap cleanup EXIT

# LeakSanitizer: libfabric 1.17's tcp provider keeps ~190 bytes per connection after fi_close
# (see tests/func/transport_suite.h); only allocations made inside libfabric are exempt.
# WB_FAULT_LSAN adds lines (space separated), e.g. the CUDA driver's on a GPU machine.
# libnng 1.5's too: a socket closed while its dial is still under way (an agent that fails at
# once, before its channels connected) has its dialer's objects freed on nng's own threads after
# nng_close returns, and a process exiting at that moment shows them (nng_fini does not wait for
# them). Only here: the other ASan tests of make test check nng messages and sockets for leaks
# without this line.
printf '%s\n' "leak:libfabric.so" "leak:libnng.so" >"$tmp/lsan.supp"
for l in ${WB_FAULT_LSAN:-}; do echo "$l" >>"$tmp/lsan.supp"; done
export LSAN_OPTIONS=suppressions=$tmp/lsan.supp:print_suppressions=0
export WB_TOKEN=fault-$RANDOM$RANDOM

cat >"$tmp/trainer.yaml" <<EOF
world_size: 2
gpus_per_node: 2
mesh:
  - {name: fsdp, size: 2}
placements:
  - match: "*"
    place: {fsdp: shard(0)}
EOF
cp "$root/configs/jobs/demo/rollout.yaml" "$tmp/rollout.yaml"

# Seconds: for the job to become ready, for one transfer, for every process to exit after the
# shutdown. None is near what a healthy run takes (about 2 s, 0.1 s and 0.5 s under ASan).
T_READY=${WB_FAULT_T_READY:-40}
T_XFER=${WB_FAULT_T_XFER:-10}
T_EXIT=${WB_FAULT_T_EXIT:-20}
port_base=$RANDOM

# ---------------------------------------------------------------- one run
# run_one DIR ROLE KIND N — ROLE KIND N empty: the counting run. Writes DIR/verdict ("clean",
# "unreached" or "FAIL: why") and DIR/count.<role>.
declare -A pid cmd
run_one() {
    local d=$1 frole=$2 fkind=$3 fn=$4
    # below the ephemeral ports (32768-); runs side by side get ports of their own
    local url=tcp://127.0.0.1:$((21000 + (port_base + ${run_index:-0}) % 11000))
    mkdir -p "$d/dump"
    sed -e "s|@URL@|$url|" -e "s|@ROOT@|$root|" -e "s|@TMP@|$tmp|" >"$d/job.yaml" <<'EOF'
name: fault
listen: @URL@
model:
  rules: @ROOT@/configs/models/qwen3_moe.yaml
  hf_config: @ROOT@/configs/jobs/demo/config.json
trainer_layout: @TMP@/trainer.yaml
rollout_layout: @TMP@/rollout.yaml
mem_cap: 4MiB
seed: 42
provider: tcp
heartbeat: 200ms
dead_after: 1500ms
EOF
    cmd[controller]="$fbin/wb-controller --config $d/job.yaml"
    cmd[trainer0]="$fbin/wb-agent --role trainer --rank 0 --controller $url --tx-domain lo"
    cmd[trainer1]="$fbin/wb-agent --role trainer --rank 1 --controller $url --tx-domain lo"
    cmd[rollout0]="$fbin/wb-agent --role rollout --rank 0 --controller $url --tx-domain lo --dump $d/dump"
    cmd[rollout1]="$fbin/wb-agent --role rollout --rank 1 --controller $url --tx-domain lo --dump $d/dump"
    local why="" p n restarted="" version=0 out rc
    local procs="controller trainer0 trainer1 rollout0 rollout1"
    declare -A runs=()
    # alive NAME: its process still runs. Not kill -0 alone: with runs side by side the pid
    # space (32768 here) wraps within a run, and a pid that ended may already be another run's
    # process (a false hang here, a SIGKILL there) — it must still be this run's child.
    alive() {
        local s
        { read -r s <"/proc/${pid[$1]}/stat"; } 2>/dev/null || return 1
        set -- ${s##*) } # state ppid ...
        [ "$1" != Z ] && [ "$2" = "$BASHPID" ]
    }
    # start NAME [faulted]: the fault's environment only for the faulted start of its role.
    start() {
        local name=$1 env=() k=${runs[$1]:-0}
        runs[$name]=$((k + 1))
        if [ "${2:-}" = faulted ]; then
            env=(WB_FAULT="$fkind:$fn" WB_FAULT_COUNT="$d/count.$name")
        elif [ -z "$frole" ]; then
            env=(WB_FAULT_COUNT="$d/count.$name")
        fi
        # shellcheck disable=SC2086
        env "${env[@]}" ${cmd[$name]} >"$d/$name.$k.log" 2>&1 &
        pid[$name]=$!
        pids+=($!)
    }
    # the role whose process fails, as its process name
    local fproc=""
    case "$frole" in
    controller) fproc=controller ;; trainer) fproc=trainer0 ;; rollout) fproc=rollout0 ;;
    esac
    for p in $procs; do
        [ "$p" = "$fproc" ] && start "$p" faulted || start "$p"
    done
    # A process that has exited before the shutdown: it must have exited non-zero, not by a
    # signal, with its error on stderr; then it is started again without the failure.
    local runs_again=""
    reap() {
        local p st
        for p in $procs; do
            alive "$p" && continue
            wait "${pid[$p]}"
            st=$?
            local log="$d/$p.$((${runs[$p]} - 1)).log"
            if [ "$st" -gt 128 ]; then
                why="$p died by signal $((st - 128))"
                return 1
            elif [ "$st" -eq 0 ]; then
                why="$p exited 0 before the shutdown"
                return 1
            elif ! grep -v -e '^weightbridge fault' -e '^ *#' "$log" | grep -q .; then
                why="$p exited $st without a message"
                return 1
            elif [ "$p" != "$fproc" ] || [ -n "${runs_again:-}" ]; then
                why="$p exited $st, not the process that failed: $(tail -n 1 "$log")"
                return 1
            fi
            runs_again=$p
            restarted="$p restarted"
            start "$p"
        done
        return 0
    }
    ctl() { "$fbin/wb-ctl" -c "$url" "$@"; }
    # the job ready, for at most T_READY seconds: 0 ready, 3 an agent's setup failed (the
    # controller says so in its status; the agent waits for an operator), 1 not clean
    ready() {
        local t0=$SECONDS st
        while [ $((SECONDS - t0)) -lt "$T_READY" ]; do
            reap || return 1
            st=$(ctl --timeout 2s status 2>/dev/null)
            grep -q ': ready (gen' <<<"$st" && return 0
            if grep -q 'setup failed: ' <<<"$st"; then
                restarted="setup failure reported: $(grep -m1 -o 'setup failed: .*' <<<"$st")"
                return 3
            fi
            sleep 0.2
        done
        why="the job was not ready within ${T_READY}s"
        return 1
    }
    # transfer V [faulted]: 0 complete, 1 failed with a message, 2 a failure that is not clean
    transfer() {
        local env=()
        if [ "${2:-}" = faulted ]; then
            env=(WB_FAULT="$fkind:$fn" WB_FAULT_COUNT="$d/count.ctl")
        elif [ -z "$frole" ]; then
            env=(WB_FAULT_COUNT="$d/count.ctl")
        fi
        out=$(env "${env[@]}" timeout -s KILL $((T_XFER + 10)) "$fbin/wb-ctl" -c "$url" \
            --timeout "${T_XFER}s" transfer --version "$1" 2>&1)
        rc=$?
        echo "$out" >>"$d/ctl.log"
        if [ $rc -eq 0 ] && grep -q "transfer $1: complete in" <<<"$out"; then
            return 0
        fi
        if [ $rc -gt 128 ]; then
            why="wb-ctl transfer died by signal $((rc - 128))$([ $rc -eq 137 ] && echo ' (hung)')"
            return 2
        fi
        if [ $rc -eq 0 ] || ! grep -v '^ *#' <<<"$out" | grep -q .; then
            why="wb-ctl transfer $1: exited $rc without saying the transfer failed"
            return 2
        fi
        return 1
    }
    # verify V: every rollout byte of version V against the reference (into $out)
    verify() {
        for _ in $(seq 1 100); do # the dumps are written on the rollouts' own threads
            [ -f "$d/dump/rollout0.v$1.bin" ] && [ -f "$d/dump/rollout1.v$1.bin" ] && break
            sleep 0.1
        done
        out=$("$fbin/wb-ctl" verify --config "$d/job.yaml" --dump "$d/dump" --version "$1" 2>&1)
    }
    for _ in 1; do
        ready
        rc=$?
        if [ $rc -eq 3 ]; then # reported; the shutdown must still be clean
            [ -n "$frole" ] || why="a setup failed in the run without a failure: $restarted"
            break
        fi
        [ $rc -eq 0 ] || break
        version=1
        transfer 1 $([ "$frole" = ctl ] && echo faulted)
        rc=$?
        [ $rc -eq 2 ] && break
        if [ $rc -eq 1 ]; then # failed with a message: the job must recover and do the next one
            restarted="${restarted:+$restarted, }transfer failed and was asked again"
            ready || { [ $? -eq 3 ] && why="a setup failed after the failure: $restarted"; break; }
            version=2
            transfer 2
            rc=$?
            if [ $rc -eq 1 ]; then # a dead agent is seen only once it is declared dead
                sleep 2
                reap || break
                ready || { [ $? -eq 3 ] && why="a setup failed after the failure: $restarted"; break; }
                version=3
                transfer 3
                rc=$?
            fi
            [ $rc -eq 0 ] || {
                why=${why:-"no transfer completed after the failure: $(head -n 2 <<<"$out")"}
                break
            }
        fi
        verify $version
        # A rollout whose dump of this version failed (a failure in the dump's own copy out of
        # GPU memory) said so in its log: the next version's dump is the one checked.
        if ! grep -q "every byte equals the reference" <<<"$out" &&
            grep -q "rollout.\.v$version\.bin: cannot write the rollout's tensors" "$d"/rollout*.log; then
            restarted="${restarted:+$restarted, }a dump failed and the next version was checked"
            version=$((version + 1))
            transfer $version || {
                why=${why:-"no transfer completed after the dump failed: $(head -n 2 <<<"$out")"}
                break
            }
            verify $version
        fi
        if ! grep -q "every byte equals the reference" <<<"$out"; then
            why="verify version $version: $(head -n 2 <<<"$out")"
            break
        fi
        reap || break
    done
    # shutdown: every process exits within T_EXIT seconds, with status 0
    for _ in 1 2 3; do # asked again while the controller lives (a loaded machine is slow)
        ctl --timeout 5s shutdown >/dev/null 2>&1 && break
        alive controller || break
    done
    local t0=$SECONDS
    for p in $procs; do
        while alive "$p" && [ $((SECONDS - t0)) -lt "$T_EXIT" ]; do
            sleep 0.1
        done
        if alive "$p"; then
            why=${why:-"$p did not exit within ${T_EXIT}s of the shutdown (hung)"}
            # where it hangs, kept with the logs and printed below: every thread's stack (gdb),
            # or without gdb the stack of the thread the abort lands on (ASan's handle_abort)
            if command -v gdb >/dev/null; then
                timeout 30 gdb -p "${pid[$p]}" -batch -ex "thread apply all bt" >"$d/$p.stacks" 2>&1
            else
                kill -ABRT "${pid[$p]}" 2>/dev/null
                sleep 3
            fi
            kill -9 "${pid[$p]}" 2>/dev/null
        fi
        wait "${pid[$p]}" 2>/dev/null
        st=$?
        if [ -z "$why" ] && [ $st -ne 0 ]; then
            why="$p exited $st at the shutdown: $(grep -v '^ *#' "$d/$p.$((${runs[$p]} - 1)).log" |
                tail -n 1)"
        fi
    done
    # no sanitizer report anywhere, whatever else happened
    local rep
    rep=$(grep -l -E 'ERROR: (AddressSanitizer|LeakSanitizer)|runtime error:|SUMMARY: UndefinedBehaviorSanitizer' \
        "$d"/*.log 2>/dev/null | head -n 1)
    if [ -n "$rep" ]; then
        why="sanitizer report in $(basename "$rep"): $(grep -m1 -E 'ERROR: |runtime error:' "$rep")"
    fi
    if [ -n "$why" ]; then
        echo "FAIL: $why"
    elif [ -n "$frole" ] && ! grep -q 'fired=1' "$d/count.${fproc:-ctl}" 2>/dev/null; then
        echo unreached
    else
        echo "clean${restarted:+ ($restarted)}"
    fi >"$d/verdict.tmp"
    mv "$d/verdict.tmp" "$d/verdict" # whole, for a reader running side by side
}

# ---------------------------------------------------------------- count the points
roles=${WB_FAULT_ROLES:-controller trainer rollout ctl}
kinds=${WB_FAULT_KINDS:-alloc post cuda}
declare -A count
if [ -n "${WB_FAULT_ONLY:-}" ]; then
    IFS=, read -r -a plan <<<"$WB_FAULT_ONLY"
else
    echo "fault counting ..."
    run_one "$tmp/count" "" "" ""
    if [ "$(cat "$tmp/count/verdict")" != clean ]; then
        echo "    the run without a failure: $(cat "$tmp/count/verdict")"
        echo "FAIL fault counting"
        echo "0 passed, 1 failed, 0 skipped"
        exit 1
    fi
    for r in $roles; do
        f=$tmp/count/count.$r
        [ $r = controller ] || [ $r = ctl ] || f=$tmp/count/count.${r}0
        for k in $kinds; do
            count[$r.$k]=$(grep -o "$k=[0-9]*" "$f" | tail -n 1 | cut -d= -f2)
        done
        echo "    $r: alloc=${count[$r.alloc]:-} post=${count[$r.post]:-} cuda=${count[$r.cuda]:-}"
    done
    # The points to run: all of them, or per role and kind an evenly spread sample (the first
    # and the last included).
    plan=()
    for r in $roles; do
        for k in $kinds; do
            c=${count[$r.$k]:-0}
            [ "$c" -gt 0 ] || continue
            m=${WB_FAULT_SAMPLE:-10}
            [ $k = alloc ] || m=$((m / 2 > 0 ? m / 2 : 1))
            if [ "$all" = 1 ] || [ "$c" -le "$m" ]; then
                for n in $(seq 1 "${WB_FAULT_STRIDE:-1}" "$c"); do plan+=("$r $k $n"); done
            else
                for i in $(seq 0 $((m - 1))); do
                    plan+=("$r $k $((1 + i * (c - 1) / (m - 1)))")
                done
            fi
        done
    done
fi

# ---------------------------------------------------------------- one run per point
# WB_FAULT_JOBS runs that many points side by side (default 1: the liveness timings of a job
# are the point, and this machine is small).
passed=0 failed=0 unreached=0 recovered=0 reported=0 tallied=0
tally() { # the verdict of plan[$1]
    local r k n d v
    read -r r k n <<<"${plan[$1]}"
    d=$tmp/$r.$k.$n
    v=$(cat "$d/verdict" 2>/dev/null || echo "FAIL: the run left no verdict")
    case "$v" in
    FAIL*)
        echo "fault $r $k:$n ..."
        echo "FAIL fault $r $k:$n: ${v#FAIL: }"
        failed=$((failed + 1))
        [ -n "${WB_FAULT_SAVE:-}" ] && mkdir -p "$WB_FAULT_SAVE" && cp -r "$d" "$WB_FAULT_SAVE/"
        [ -n "${WB_KEEP:-}" ] || mv "$d" "$tmp/failed.$r.$k.$n" # kept for the log listing below
        ;;
    unreached)
        unreached=$((unreached + 1))
        passed=$((passed + 1))
        rm -rf "$d"
        ;;
    *)
        case "$v" in
        *"setup failure reported"*) reported=$((reported + 1)) ;;
        *restarted* | *"asked again"*) recovered=$((recovered + 1)) ;;
        esac
        [ -n "${WB_FAULT_VERBOSE:-}" ] && echo "    $r $k:$n: $v"
        passed=$((passed + 1))
        [ -n "${WB_KEEP:-}" ] || rm -rf "$d"
        ;;
    esac
    tallied=$((tallied + 1))
    [ $((tallied % 20)) -eq 0 ] && echo "    $tallied of ${#plan[@]} points run, $failed not clean"
}
for i in "${!plan[@]}"; do
    read -r r k n <<<"${plan[$i]}"
    run_index=$((i + 1)) run_one "$tmp/$r.$k.$n" "$r" "$k" "$n" &
    pids+=($!)
    while [ "$(jobs -rp | wc -l)" -ge "${WB_FAULT_JOBS:-1}" ]; do wait -n; done
    while [ $tallied -lt ${#plan[@]} ]; do # in order, as far as they are done
        read -r r k n <<<"${plan[$tallied]}"
        [ -f "$tmp/$r.$k.$n/verdict" ] || break
        tally $tallied
    done
done
wait
while [ $tallied -lt ${#plan[@]} ]; do tally $tallied; done
if [ $failed -gt 0 ] && [ -z "${WB_KEEP:-}" ]; then
    for f in "$tmp"/failed.*; do # the first failure's logs, for the record
        echo "    logs of $(basename "$f"):"
        tail -n 5 "$f"/*.log | sed 's/^/    | /'
        for st in "$f"/*.stacks; do # a hang's stacks (gdb), the frames that say where
            [ -f "$st" ] || continue
            echo "    stacks of $(basename "$st" .stacks):"
            grep -E '^(Thread|#)' "$st" | head -n 80 | sed 's/^/    | /'
        done
        grep -h -A 25 'ABRT' "$f"/*.log 2>/dev/null | head -n 60 | sed 's/^/    | /'
        break
    done
fi
echo "fault points run: ${#plan[@]}; clean: $passed (the transfer completed and verified:" \
    "$((passed - recovered - reported - unreached)), after a restart or a retry: $recovered," \
    "a setup failure reported and a clean shutdown: $reported, not reached in their run:" \
    "$unreached); not clean: $failed"
[ $failed -eq 0 ] && echo "ok fault injection (${#plan[@]} points)"
echo "$passed passed, $failed failed, 0 skipped"
[ $failed -eq 0 ]
