#!/usr/bin/env bash
# fresh_debian_test.sh — scripts/fresh_debian_check.sh (the README's commands as written in a
# Debian 12 root debootstrap makes) in make test, opt-in: with WB_FRESH_CHECK=1 it runs, else it
# skips saying how to run it. Opt-in because it needs root and a reachable Debian mirror,
# downloads about 230 MB of packages and writes about 1.7 GB each run (about 90 s on the 2-core
# dev machine); `make fresh-check` runs it alone. The check itself skips (no root, no mirror) and
# is counted skipped here. Run from the repository root (make test does). Prints the tally.
echo "fresh_debian readme_commands ..."
if [ "${WB_FRESH_CHECK:-0}" != 1 ]; then
    echo "SKIP fresh_debian readme_commands: skipped: opt-in (WB_FRESH_CHECK=1 make test, or make" \
        "fresh-check): root, a Debian mirror, ~230 MB of downloads"
    echo "0 passed, 0 failed, 1 skipped"
    exit 0
fi
out=$(scripts/fresh_debian_check.sh 2>&1)
rc=$?
printf '%s\n' "$out" | sed 's/^/    /'
if reason=$(grep -m1 '^skipped: ' <<<"$out"); then
    echo "SKIP fresh_debian readme_commands: $reason"
    echo "0 passed, 0 failed, 1 skipped"
elif [ $rc -eq 0 ] && grep -q '^fresh-check: PASS' <<<"$out"; then
    echo "ok fresh_debian readme_commands"
    echo "1 passed, 0 failed, 0 skipped"
else
    echo "FAIL fresh_debian readme_commands (exit $rc)"
    echo "0 passed, 1 failed, 0 skipped"
    exit 1
fi
