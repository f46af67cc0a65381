#!/usr/bin/env bash
# layering_test.sh — the parts depend on each other in one direction: the graph of
# `#include "<part>/..."` lines between parts (sources, private headers and programs of each
# part) has no cycle, and agent/ and controller/ stand side by side on proto/ and route/ without
# including each other. Run from the repository root (make test does); prints the graph.
# Prints the harness tally.
parts="common proto route matcher planner quant ckpt transport agent controller bcast"
pass=0 fail=0
edges=$(for p in $parts; do
    find "$p" -name '*.[ch]' -o -name '*.cu' -o -name '*.cuh' | while read -r f; do
        sed -n 's|^#include "\([a-z_]*\)/.*"|\1|p' "$f" | while read -r q; do
            [ "$q" != "$p" ] && [[ " $parts " == *" $q "* ]] && echo "$p $q"
        done
    done
done | sort -u)
echo "include graph between parts ..."
sed 's/^/    /; s/ \([a-z_]*\)$/ -> \1/' <<<"$edges"
if err=$(tsort <<<"$edges" 2>&1 >/dev/null) && [ -z "$err" ]; then
    echo "ok include graph between parts has no cycle"
    pass=$((pass + 1))
else
    echo "    $err"
    echo "FAIL include graph between parts has no cycle"
    fail=$((fail + 1))
fi
echo "agent and controller apart ..."
cross=$(grep -E '^(agent controller|controller agent)$' <<<"$edges")
if [ -z "$cross" ]; then
    echo "ok agent and controller apart"
    pass=$((pass + 1))
else
    echo "    $cross"
    echo "FAIL agent and controller apart"
    fail=$((fail + 1))
fi
echo "$pass passed, $fail failed, 0 skipped"
[ "$fail" -eq 0 ]
