#!/usr/bin/env bash
# symbols_test.sh — the library exports only its API: every global symbol libweightbridge.a and
# libweightbridge.so define starts with wb_ (so linking or loading them into a trainer or an
# inference engine can clash with nothing of theirs) and is declared in a public header — one
# per part, <part>/<part>.h, plus common/fpbits.h which common.h includes. A function shared
# between the files of a part is declared in the part's private header under a private prefix
# (txi_, qt_, mx_, pl_, ag_, ...) and made local when the library is built (see the Makefile);
# a wb_ name in a private header would be exported without being API, and fails here.
# Run from the repository root (make test does). Prints the harness tally.
build=$(cd "$(dirname "$0")/.." && pwd)
root=$(pwd)
lib=$build/lib/libweightbridge.a
so=$build/lib/libweightbridge.so
passed=0 failed=0
fail() {
    echo "$1" | sed 's/^/    /'
    echo "FAIL $2"
    failed=$((failed + 1))
}

echo "symbols exported ..."
if ! syms=$(nm -g --defined-only "$lib" 2>&1 && nm -D --defined-only "$so" 2>&1); then
    fail "$lib: $syms" "symbols exported"
    echo "0 passed, $((failed)) failed, 0 skipped"
    exit 1
fi
all=$(awk 'NF == 3 {print $3}' <<<"$syms" | sort -u)
# DW.ref.*: the compiler's weak, hidden personality references (kept for a static libstdc++)
bad=$(grep -v -e '^wb_' -e '^DW\.ref\.' <<<"$all")
if [ -n "$bad" ] || [ -z "$all" ]; then
    fail "global symbols without the wb_ prefix in $lib or $so:
$(sed 's/^/  /' <<<"${bad:-(no symbols at all)}")" "symbols exported"
else
    echo "ok symbols exported ($(wc -l <<<"$all") wb_ symbols, no others)"
    passed=$((passed + 1))
fi

echo "symbols declared in public headers ..."
headers=$(cd "$root" && for h in */*.h; do [ "$(dirname "$h")" = "$(basename "$h" .h)" ] && echo "$h"; done)
if [ ! -f "$root/common/common.h" ] || [ -z "$headers" ]; then
    fail "run from the repository root: no public headers under $root" "symbols declared in public headers"
else
    # the identifiers the headers' text names, comments removed (a name in a comment declares nothing)
    declared=$(cd "$root" && for h in $headers common/fpbits.h; do
        gcc -w -fpreprocessed -dD -E -P "$h" || echo "cannot read $h" >&2
    done | grep -oE '\bwb_[A-Za-z0-9_]+' | sort -u)
    undeclared=$(grep '^wb_' <<<"$all" | comm -23 - <(echo "$declared"))
    if [ -n "$undeclared" ]; then
        fail "exported from $lib or $so but declared in no public header ($(echo $headers common/fpbits.h)):
$(sed 's/^/  /' <<<"$undeclared")
make each static, or give it its part's private prefix in its private header" \
            "symbols declared in public headers"
    else
        echo "ok symbols declared in public headers ($(grep -c '^wb_' <<<"$all") exported, each in one of $(wc -w <<<"$headers") public headers)"
        passed=$((passed + 1))
    fi
fi
echo "$passed passed, $failed failed, 0 skipped"
[ "$failed" -eq 0 ]
