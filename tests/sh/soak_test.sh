#!/usr/bin/env bash
# soak_test.sh — the short form of the soak test (tests/sh/soak.sh, issue #27) in make test:
# 200 versions of the demo job with the programs under test (ASan+UBSan in make test), a fault
# every ~12 versions mid-transfer (kill -9 of a trainer, of a rollout, SIGSTOP of either, kill
# -9 of the controller; each kind dealt at least 3 times), every complete version verified byte
# for byte, every rollout's claim checked against its bytes after each fault, a stopped agent
# shown suspect and never dead (stops stay below dead_after). The count decides, never the time:
# the 12-minute bound only ends a hang (a healthy run takes 2-3 minutes here; a slow machine
# must not turn fewer versions in a fixed time into a failure).
# `make soak` runs the long form. Prints the harness tally.
build=$(cd "$(dirname "$0")/.." && pwd)
root=$(pwd)
export WB_BIN=${WB_BIN:-$build/bin}
soak=$root/tests/sh/soak.sh
passed=0 failed=0
check() { # OK NAME [DETAIL]
    if [ "$1" -eq 1 ]; then
        echo "ok soak $2"
        passed=$((passed + 1))
    else
        echo "FAIL soak $2${3:+: $3}"
        failed=$((failed + 1))
    fi
}
if [ ! -x "$soak" ]; then
    echo "FAIL soak: $soak not found (run from the checkout's root)"
    echo "0 passed, 1 failed, 0 skipped"
    exit 1
fi
out=$(mktemp /tmp/wb-soak-test.XXXXXX)
trap 'rm -f "$out"' EXIT
echo "soak 200 versions, faults mid-transfer ..."
"$soak" --versions 200 --fault-every 12 --minutes 12 2>&1 | tee "$out" | sed 's/^/    /'
rc=${PIPESTATUS[0]}
declare -A n=()
line=$(grep '^soak-counts: ' "$out" | tail -n 1)
for kv in ${line#soak-counts: }; do n[${kv%%=*}]=${kv#*=}; done
get() { echo "${n[$1]:--1}"; }
[ "$(get complete)" -ge 150 ] && [ "$(get verified)" -eq "$(get complete)" ] &&
    [ "$(get wrong)" -eq 0 ] && ok=1 || ok=0
check "$ok" "versions: $(get complete) complete, $(get verified) verified, $(get wrong) with a wrong byte" \
    "at least 150 complete, every one verified, none wrong"
[ "$(get hangs)" -eq 0 ] && ok=1 || ok=0
check "$ok" "hangs: $(get hangs)"
ok=1
for k in trainer_kill rollout_kill trainer_stop rollout_stop controller_kill; do
    [ "$(get $k)" -ge 2 ] || ok=0
done
check "$ok" "faults: $(get faults) ($(get mid) mid-transfer), every kind at least twice" \
    "$(grep -o 'trainer_kill.*controller_kill=[0-9]*' <<<"$line")"
[ "$(get checks)" -ge 4 ] && [ "$(get checks_ok)" -eq "$(get checks)" ] &&
    [ "$(get ready_down)" -eq 0 ] && [ "$(get stop_wrong)" -eq 0 ] && ok=1 || ok=0
check "$ok" "state checks: $(get checks_ok) of $(get checks) passed, status ready while an agent was down $(get ready_down) times, not suspect (or dead) while one was stopped $(get stop_wrong) times"
[ "$rc" -eq 0 ] && ok=1 || ok=0
check "$ok" "run: exit $rc (no crash, a clean shutdown, no sanitizer report)"
echo "$passed passed, $failed failed, 0 skipped"
[ "$failed" -eq 0 ]
