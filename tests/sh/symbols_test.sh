#!/usr/bin/env bash
# symbols_test.sh — the library exports only its API: every global symbol libweightbridge.a and
# libweightbridge.so define starts with wb_, so linking or loading them into a trainer or an
# inference engine can clash with nothing of theirs. (Internal functions shared between a part's files carry private prefixes
# and are made local when the library is built; see the Makefile.) Prints the harness tally.
build=$(cd "$(dirname "$0")/.." && pwd)
lib=$build/lib/libweightbridge.a
so=$build/lib/libweightbridge.so
echo "symbols exported ..."
if ! syms=$(nm -g --defined-only "$lib" 2>&1 && nm -D --defined-only "$so" 2>&1); then
    echo "    $lib: $syms"
    echo "FAIL symbols exported"
    echo "0 passed, 1 failed, 0 skipped"
    exit 1
fi
all=$(awk 'NF == 3 {print $3}' <<<"$syms" | sort -u)
# DW.ref.*: the compiler's weak, hidden personality references (kept for a static libstdc++)
bad=$(grep -v -e '^wb_' -e '^DW\.ref\.' <<<"$all")
if [ -n "$bad" ] || [ -z "$all" ]; then
    echo "    global symbols without the wb_ prefix in $lib or $so:"
    sed 's/^/      /' <<<"${bad:-(no symbols at all)}"
    echo "FAIL symbols exported"
    echo "0 passed, 1 failed, 0 skipped"
    exit 1
fi
echo "ok symbols exported ($(wc -l <<<"$all") wb_ symbols, no others)"
echo "1 passed, 0 failed, 0 skipped"
