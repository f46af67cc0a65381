#!/usr/bin/env bash
# python_test.sh — runs the Python package's tests (tests/python/*.py, each a harness of its own
# that prints "N passed, N failed, N skipped") against this build's libweightbridge.so and
# programs, with a python3 that has numpy (Debian's python3-numpy; scripts/deps.sh installs it).
# A sanitizer build's library needs its runtime loaded first: it is preloaded, and leak
# checking is off (the interpreter itself leaks by design). Prints the summed tally.
build=$(cd "$(dirname "$0")/.." && pwd)
root=$(pwd)
so=$build/lib/libweightbridge.so
py=""
for p in /usr/bin/python3 python3; do
    if command -v "$p" >/dev/null && "$p" -c 'import numpy' 2>/dev/null; then
        py=$p
        break
    fi
done
if [ -z "$py" ]; then
    echo "python_endpoint ..."
    echo "SKIP python_endpoint: skipped: no python3 with numpy (install python3-numpy)"
    echo "0 passed, 0 failed, 1 skipped"
    exit 0
fi
export WB_LIBRARY=$so WB_BIN=$build/bin
asan=$(ldd "$so" 2>/dev/null | awk '/libasan/ {print $3}')
if [ -n "$asan" ]; then
    export LD_PRELOAD=$asan
    export ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0
fi
passed=0 failed=0 skipped=0
for t in "$root"/tests/python/*.py; do
    case "$(basename "$t")" in _*) continue ;; esac # modules the tests share, not tests
    out=$("$py" "$t" 2>&1)
    rc=$?
    printf '%s\n' "$out"
    line=$(grep -E '^[0-9]+ passed, [0-9]+ failed, [0-9]+ skipped$' <<<"$out" | tail -n 1)
    if [ -z "$line" ]; then
        echo "FAIL $(basename "$t"): exited $rc without a tally"
        failed=$((failed + 1))
        continue
    fi
    read -r p _ f _ s _ <<<"${line//,/}"
    passed=$((passed + p)) failed=$((failed + f)) skipped=$((skipped + s))
done
echo "$passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
