#!/usr/bin/env bash
# plan_hash_test.sh — the plans of the shipped layouts stay byte-identical: the SHA-256 of
# `wb-plan --json --tables` for each (scripts/plan_hashes.sh: the demo, Qwen3-235B 128 -> 32,
# Kimi-K2 256 -> 128, auto and gather) equals the one recorded in tests/sh/plan_hashes.txt.
# A change meant to alter plans records the new hashes (scripts/plan_hashes.sh >
# tests/sh/plan_hashes.txt) and says why in its commit. Run from the repository root (make test
# does); wb-plan from $WB_BIN (default build/bin). Prints the harness tally.
bin=${WB_BIN:-build/bin}/wb-plan
want=tests/sh/plan_hashes.txt
if [ ! -x "$bin" ] || [ ! -f "$want" ] || ! command -v sha256sum >/dev/null; then
    echo "skipped: needs $bin, $want and sha256sum"
    echo "0 passed, 0 failed, 1 skipped"
    exit 0
fi
pass=0 fail=0
got=$(scripts/plan_hashes.sh "$bin")
while read -r name mode hash; do
    have=$(awk -v n="$name" -v m="$mode" '$1 == n && $2 == m { print $3 }' <<<"$got")
    if [ "$have" = "$hash" ]; then
        echo "ok $name $mode"
        pass=$((pass + 1))
    else
        echo "    expected $hash, got: $(grep "^$name $mode " <<<"$got")"
        echo "FAIL $name $mode"
        fail=$((fail + 1))
    fi
done <"$want"
echo "$pass passed, $fail failed, 0 skipped"
[ "$fail" -eq 0 ]
