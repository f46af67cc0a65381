#!/usr/bin/env bash
# long_functions.sh — C functions longer than N lines (default 150) under the given folders,
# longest first: "lines file:line name". Universal Ctags' end: field gives each body's extent.
#   scripts/long_functions.sh [-n N] DIR...
max=150
[ "${1:-}" = -n ] && max=$2 && shift 2
find "$@" -name '*.c' | sort | while read -r f; do
    ctags --fields=+ne --c-kinds=f -o - "$f" |
        awk -F'\t' -v f="$f" -v max="$max" '{
            s = e = 0
            for (i = 4; i <= NF; i++) {
                if ($i ~ /^line:/) s = substr($i, 6)
                if ($i ~ /^end:/) e = substr($i, 5)
            }
            if (e - s + 1 > max) printf "%d %s:%d %s\n", e - s + 1, f, s, $1
        }'
done | sort -rn
