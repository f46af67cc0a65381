#!/usr/bin/env bash
# netns_shaped_test.sh — the short form of bench/netns_shaped.sh: 2 nodes (one trainer agent,
# one rollout agent, each in its network namespace behind a veth to a bridge, links shaped to
# 100 Mbit/s by tc tbf), a 4 MiB Qwen3 over libfabric tcp, 2 versions, each transfer complete
# and every rollout byte verified against the reference (wb-ctl verify); never its times. Then
# its cleanup: after a normal end, and after a SIGTERM in the middle of a run of 50 versions,
# no namespace, bridge or process of the run is left. A bad --rate is refused by name.
# Programs from $WB_BIN (make test: build/asan/bin). Run from the repository root. Prints the
# tally; skips (with the script's reason) where namespaces or tc are unavailable.
bin=${WB_BIN:-build/bin}
pass=0 fail=0 skip=0
ok() { echo "ok netns_shaped $1"; pass=$((pass + 1)); }
bad() { printf '%s\n' "$2" | tail -n 30; echo "FAIL netns_shaped $1"; fail=$((fail + 1)); }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
build=$(cd "$bin/.." && pwd)

# leftovers of run PID (its namespaces, bridge, interfaces, processes), or nothing
leftovers() {
    ip netns list 2>/dev/null | grep "^wbs$1-"
    ip link show "wbs${1}b" >/dev/null 2>&1 && echo "bridge wbs${1}b"
    ip -br link 2>/dev/null | awk -v p="wbs$1" 'index($1, p) == 1 { sub(/@.*/, "", $1); print "interface " $1 }'
    for f in "$2"/*/pids; do
        [ -f "$f" ] || continue
        while read -r p; do kill -0 "$p" 2>/dev/null && echo "process $p"; done <"$f"
    done
}

echo "netns_shaped smoke ..."
bench/netns_shaped.sh --smoke --build "$build" --logs "$tmp/a" >"$tmp/out" 2>&1 &
pid=$!
wait $pid
rc=$?
out=$(cat "$tmp/out")
if grep -q '^skipped: ' <<<"$out"; then
    echo "SKIP netns_shaped smoke: $(grep '^skipped: ' <<<"$out")"
    echo "0 passed, 0 failed, 3 skipped"
    exit 0
fi
printf '%s\n' "$out"
if [ $rc -eq 0 ] && grep -q '^  a version 1: verified (verify version 1: 1 rollouts, 4197376 bytes, every byte equals the reference)$' <<<"$out" &&
    grep -q '^  a version 2: verified (verify version 2: 1 rollouts, 4197376 bytes, every byte equals the reference)$' <<<"$out" &&
    grep -q '^netns_shaped: ok$' <<<"$out"; then
    ok smoke
else
    bad smoke "exit $rc"
fi
left=$(leftovers $pid "$tmp/a")
[ -z "$left" ] && ok cleanup_after_end || bad cleanup_after_end "left behind: $left"

echo "netns_shaped killed_mid_run ..."
bench/netns_shaped.sh --smoke --versions 50 --build "$build" --logs "$tmp/b" >"$tmp/out2" 2>&1 &
pid=$!
for ((i = 0; i < 600; i++)); do # until its first version is in (at most 60 s: a hang's limit)
    grep -q '^  a version 1: verified' "$tmp/out2" && break
    kill -0 $pid 2>/dev/null || break
    sleep 0.1
done
if grep -q '^  a version 1: verified' "$tmp/out2"; then
    kill -TERM $pid
    wait $pid
    rc=$?
    left=$(leftovers $pid "$tmp/b")
    [ $rc -eq 130 ] && [ -z "$left" ] && ok killed_mid_run ||
        bad killed_mid_run "exit $rc (expected 130); left behind: $left"
else
    kill -TERM $pid 2>/dev/null
    wait $pid
    bad killed_mid_run "$(cat "$tmp/out2")"
fi

echo "netns_shaped bad_rate ..."
out=$(bench/netns_shaped.sh --rate 1gbps --build "$build" 2>&1)
rc=$?
[ $rc -eq 2 ] && [ "$out" = "netns_shaped: --rate: expected a rate such as 1gbit or 500mbit, got '1gbps'" ] &&
    ok bad_rate || bad bad_rate "exit $rc: $out"
echo "$pass passed, $fail failed, $skip skipped"
[ "$fail" -eq 0 ]
