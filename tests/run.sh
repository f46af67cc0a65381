#!/usr/bin/env bash
# Runs every test binary in a directory and prints the project's tally as the last line:
# "N passed, N failed, N skipped". Exit status is non-zero when any test failed or a binary
# could not run. Usage: tests/run.sh BUILD_TEST_DIR [binary-name-filter]
set -u
dir=${1:?usage: tests/run.sh DIR [filter]}
filter=${2:-}
passed=0 failed=0 skipped=0 broken=()
log=$(mktemp)
trap 'rm -f "$log"' EXIT
for t in "$dir"/*; do
    [ -x "$t" ] && [ -f "$t" ] || continue
    name=$(basename "$t")
    [ -n "$filter" ] && [[ "$name" != *"$filter"* ]] && continue
    "$t" 2>&1 | tee "$log"
    rc=${PIPESTATUS[0]}
    line=$(grep -E '^[0-9]+ passed, [0-9]+ failed, [0-9]+ skipped$' "$log" | tail -n 1)
    if [ -z "$line" ]; then
        echo "FAIL $name: exited $rc without a tally"
        broken+=("$name")
        failed=$((failed + 1))
        continue
    fi
    read -r p _ f _ s _ <<<"${line//,/}"
    passed=$((passed + p)) failed=$((failed + f)) skipped=$((skipped + s))
    if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then
        echo "FAIL $name: exited $rc"
        broken+=("$name")
        failed=$((failed + 1))
    fi
done
echo
[ ${#broken[@]} -gt 0 ] && echo "broken binaries: ${broken[*]}"
echo "$passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
