#!/usr/bin/env bash
# relay_test.sh — rollout replicas relaying each version to each other (job key relay:, issue
# #30), with real processes: a controller, the demo's 4 trainer agents (FSDP 2 x EP 2) and 4
# rollout replicas of 2 ranks (TP 2), libfabric tcp on loopback, host memory.
#
#   chain      relay: chain (0 -> 1 -> 2 -> 3), 3 versions: every byte of every replica equals
#              the reference (wb-ctl verify), and the trainers wrote one replica's worth per
#              version (the result's bytes: 2 x 1711904), not four
#   tree       relay: tree (fanout 2) with verify: true (each child checks the trainers' own
#              checksum records, forwarded with the bytes), 2 versions, every byte verified
#   killed     relay: chain with paced trainers; rollout rank 2 (replica 1, the relay of
#              replicas 2 and 3) killed mid-transfer: the attempt fails with exactly the
#              message naming it and the replicas below it; restarted, the next version
#              completes on every replica, every byte verified
#   dropped    the same kill in a tree (0 -> 1, 2; 1 -> 3) with min_replicas: 2: replicas 1 and
#              3 are dropped (exact result line), 0 and 2 complete, each of their ranks
#              verified; the rank restarted, version 3 reaches every replica, verified
#   bad_keys   relay: ring, relay_fanout: 0 and relay_roots past the replicas: refused, named
#
# Bounded waits only end a hang (generous for a loaded 2-core machine under ASan); nothing
# here decides by time. Run from the repository root (make test does). Prints the tally.
set -u
root=$(pwd)
bin=${WB_BIN:-$root/build/asan/bin}
export ASAN_OPTIONS=${ASAN_OPTIONS:-protect_shadow_gap=0:detect_leaks=1:abort_on_error=0}
export WB_TOKEN=relay-$RANDOM$RANDOM
pass=0 fail=0 skip=0
ok() { echo "ok relay $1"; pass=$((pass + 1)); }
bad() { echo "    $2"; echo "FAIL relay $1"; fail=$((fail + 1)); }
tmp=$(mktemp -d /tmp/wb-relay.XXXXXX)
pids=()
cleanup() {
    for p in "${pids[@]}"; do
        { tr '\0' ' ' <"/proc/$p/cmdline"; } 2>/dev/null | grep -q "$bin/" && kill -9 "$p" 2>/dev/null
    done
    wait 2>/dev/null
    [ -n "${WB_KEEP:-}" ] && echo "    logs: $tmp" || rm -rf "$tmp"
}
trap cleanup EXIT

if [ ! -x "$bin/wb-controller" ] || [ ! -x "$bin/wb-agent" ] || [ ! -x "$bin/wb-ctl" ]; then
    echo "SKIP relay: skipped: no programs in $bin"
    echo "0 passed, 0 failed, 1 skipped"
    exit 0
fi

NTR=4 NRO=8 PER_ROLLOUT=1711904 # the demo plan's bytes per rollout rank
cat >"$tmp/rollout.yaml" <<EOF
replicas: 4
gpus_per_replica: 2
tp: 2
gpus_per_node: 2
EOF

# job NAME "EXTRA LINES": the demo model, 4 replicas, a fresh port
job() {
    url=tcp://127.0.0.1:$((21000 + RANDOM % 11000))
    dir=$tmp/$1
    mkdir -p "$dir/dump"
    cat >"$dir/job.yaml" <<EOF
name: relay-$1
listen: $url
model:
  rules: $root/configs/models/qwen3_moe.yaml
  hf_config: $root/configs/jobs/demo/config.json
trainer_layout: $root/configs/jobs/demo/trainer.yaml
rollout_layout: $tmp/rollout.yaml
seed: 7
provider: tcp
heartbeat: 200ms
$2
EOF
}

ctl() { "$bin/wb-ctl" -c "$url" "$@"; }

rollout() { # rollout RANK: started (again) with its dumps in the case's directory
    WB_LOG=info "$bin/wb-agent" --role rollout --rank "$1" --controller "$url" \
        --dump "$dir/dump" >>"$dir/rollout$1.log" 2>&1 &
    pids+=($!)
    rpid[$1]=$!
}

# start "TRAINER ARGS": the controller and every agent; waits until the job is ready
start() {
    WB_LOG=info "$bin/wb-controller" --config "$dir/job.yaml" >"$dir/controller.log" 2>&1 &
    pids+=($!)
    cpid=$!
    for t in $(seq 0 $((NTR - 1))); do
        # shellcheck disable=SC2086
        WB_LOG=info "$bin/wb-agent" --role trainer --rank "$t" --controller "$url" $1 \
            >"$dir/trainer$t.log" 2>&1 &
        pids+=($!)
    done
    for r in $(seq 0 $((NRO - 1))); do rollout "$r"; done
    ready
}

ready() { # up to 120 s (a hang's end, not a measure)
    for _ in $(seq 240); do
        ctl status 2>/dev/null | grep -q '^job [^ ]*: ready ' && return 0
        sleep 0.5
    done
    return 1
}

stop() {
    ctl shutdown >/dev/null 2>&1
    for _ in $(seq 120); do kill -0 "$cpid" 2>/dev/null || break; sleep 0.5; done
    wait 2>/dev/null
    if grep -l -E 'ERROR: (Address|Leak)Sanitizer|runtime error:' "$dir"/*.log >/dev/null 2>&1; then
        why="sanitizer reports in $(grep -l -E 'ERROR: (Address|Leak)Sanitizer|runtime error:' "$dir"/*.log | xargs -n1 basename | tr '\n' ' ')"
        return 1
    fi
    return 0
}

# xfer V: transfer V, every byte of every replica verified, trainer bytes checked; "" or why
xfer() {
    local out all
    out=$(ctl --timeout 120s transfer --version "$1" 2>&1) || {
        why="transfer $1: $out"
        return 1
    }
    all=$(awk '$1 == "all" {print $2}' <<<"$out")
    if [ "$all" != $((2 * PER_ROLLOUT)) ]; then
        why="transfer $1: the trainers wrote $all bytes, not one replica's $((2 * PER_ROLLOUT))"
        return 1
    fi
    for r in $(seq 0 $((NRO - 1))); do
        grep -q "^rollout $r: $PER_ROLLOUT bytes received" <<<"$out" || {
            why="transfer $1: rollout $r did not report $PER_ROLLOUT bytes: $out"
            return 1
        }
    done
    out=$("$bin/wb-ctl" verify --config "$dir/job.yaml" --dump "$dir/dump" --version "$1" 2>&1)
    if [ "$out" != "verify version $1: $NRO rollouts, $((NRO * PER_ROLLOUT)) bytes, every byte equals the reference" ]; then
        why="version $1: $out"
        return 1
    fi
    return 0
}

echo "relay chain ..."
job chain "relay: chain"
why=""
if start "" && xfer 1 && xfer 2 && xfer 3 && stop; then ok chain; else
    bad chain "${why:-the job never became ready}"
    stop
fi

echo "relay tree ..."
job tree $'relay: tree\nrelay_fanout: 2\nverify: true'
why=""
if start "" && xfer 1 && xfer 2 && stop; then ok tree; else
    bad tree "${why:-the job never became ready}"
    stop
fi

echo "relay killed ..."
# Paced trainers (400 ms before each of their 21 tasks): the transfer runs for 8 s at least,
# and the relay is killed as soon as its status says it is in the attempt.
job killed $'relay: chain\ndead_after: 3s'
why=""
killed_ok=0
if start "--pace 400ms" && xfer 1; then
    ctl --timeout 120s transfer --version 2 >"$dir/xfer2.out" 2>&1 &
    xpid=$!
    for _ in $(seq 400); do # until rollout rank 2 is in the attempt
        ctl status 2>/dev/null | awk '$1 == "rollout" && $2 == 2 && $8 == "yes"' | grep -q . && break
        sleep 0.05
    done
    disown "${rpid[2]}" && kill -9 "${rpid[2]}" # (no "Killed" line from bash)
    wait "$xpid"
    got=$(cat "$dir/xfer2.out")
    want="wb-ctl: transfer 2 failed: rollout rank 2 died (its connection closed); it relays to replicas 2, 3, which fail with it"
    if [ "$got" != "$want" ]; then
        why="got: $got
    want: $want"
    else
        rollout 2 # back: the job is ready again, the next version reaches every replica
        if ready && xfer 3; then killed_ok=1; fi
    fi
fi
if [ $killed_ok = 1 ] && stop; then ok killed; else
    bad killed "${why:-the job never became ready}"
    stop
fi

echo "relay dropped ..."
# The same kill in a tree (0 -> 1, 2; 1 -> 3) of a job that needs 2 replicas: the relay's
# replica and the one below it are dropped, the other two complete, every byte of theirs
# verified; the killed rank back, version 3 reaches every replica again.
job dropped $'relay: tree\nrelay_fanout: 2\nmin_replicas: 2\ndead_after: 3s'
why=""
dropped_ok=0
if start "--pace 400ms" && xfer 1; then
    ctl --timeout 120s transfer --version 2 >"$dir/xfer2.out" 2>&1 &
    xpid=$!
    for _ in $(seq 400); do
        ctl status 2>/dev/null | awk '$1 == "rollout" && $2 == 2 && $8 == "yes"' | grep -q . && break
        sleep 0.05
    done
    disown "${rpid[2]}" && kill -9 "${rpid[2]}"
    wait "$xpid"
    got=$(grep 'replicas' "$dir/xfer2.out")
    want="transfer 2: complete on 2 of 4 replicas (replica 1 dropped: rollout rank 2 died (its connection closed); it relays to replica 3, which fails with it; replica 3 dropped: below replica 1, a relay that was lost)"
    if [ "$got" != "$want" ]; then
        why="got: $(cat "$dir/xfer2.out")
    want: $want"
    else
        dropped_ok=1
        for r in 0 1 4 5; do
            out=$("$bin/wb-ctl" verify --config "$dir/job.yaml" --dump "$dir/dump" --version 2 --rank $r 2>&1)
            if [ "$out" != "verify version 2: rollout rank $r, $PER_ROLLOUT bytes, every byte equals the reference" ]; then
                why="version 2, rollout $r: $out"
                dropped_ok=0
            fi
        done
        if [ $dropped_ok = 1 ]; then
            dropped_ok=0
            rollout 2
            for _ in $(seq 240); do # the killed rank set up again and caught up (or not: version 3 is whole)
                ctl status 2>/dev/null | grep -q 'replicas: 4 of 4' && break
                sleep 0.5
            done
            if xfer 3; then dropped_ok=1; fi
        fi
    fi
fi
if [ $dropped_ok = 1 ] && stop; then ok dropped; else
    bad dropped "${why:-the job never became ready}"
    stop
fi

echo "relay bad_keys ..."
refused() { # refused "JOB LINES" "MESSAGE": wb-controller exits 1 saying it
    job bad "$1"
    out=$("$bin/wb-controller" --config "$dir/job.yaml" 2>&1)
    rc=$?
    [ $rc -eq 1 ] && [ "$out" = "$2" ] && return 0
    why="exit $rc: $out
    want: $2"
    return 1
}
if refused "relay: ring" "wb-controller: $tmp/bad/job.yaml:11:8: relay: expected one of off|chain|tree, got 'ring'" &&
    refused $'relay: tree\nrelay_fanout: 0' "wb-controller: $tmp/bad/job.yaml:12:15: relay_fanout: 0 child replicas (1 to 64)" &&
    refused $'relay: tree\nrelay_roots: 5' "wb-controller: job: relay_roots: 5 roots, but the rollout layout has 4 replicas"; then
    ok bad_keys
else
    bad bad_keys "$why"
fi

echo "$pass passed, $fail failed, $skip skipped"
[ $fail -eq 0 ]
