#!/usr/bin/env bash
# fuzz.sh — runs every fuzz target (tests/fuzz/*_fuzz.c, built by `make fuzz` with clang's
# libFuzzer, ASan and UBSan) for SECONDS each, from seed corpora made of the repository's own
# inputs (job files, layouts, Hugging Face configs, a small safetensors file) and a dictionary of
# the control protocol's keys; prints each target's executions and exits non-zero on the first
# crash, leak or sanitizer report (the reproducer is kept in DIR).
# Usage: scripts/fuzz.sh [SECONDS (60)] [TARGET...]   (env: WB_FUZZ_DIR, default /tmp/wb-fuzz)
set -uo pipefail
cd "$(dirname "$0")/.."
secs=${1:-60}
shift || true
bin=build/fuzz/fuzzers
dir=${WB_FUZZ_DIR:-/tmp/wb-fuzz}
if ! make --no-print-directory fuzz >"$dir.build.log" 2>&1; then
    tail -n 30 "$dir.build.log"
    echo "fuzz: build failed (clang with libFuzzer is needed: scripts/deps.sh installs it)"
    exit 1
fi
mkdir -p "$dir"
seed() { # target files...
    local t=$1
    shift
    mkdir -p "$dir/$t.seed"
    for f in "$@"; do [ -f "$f" ] && cp "$f" "$dir/$t.seed/" 2>/dev/null; done
}
seed job configs/jobs/*.yaml tests/fixtures/*/*.yaml
seed layout configs/clusters/*.yaml configs/jobs/demo/*.yaml
mkdir -p "$dir/hfconfig.seed"
i=0
for f in configs/hf/*.json configs/jobs/demo/config.json; do # first byte: the model family
    { printf "\\x$(printf %02x $((i % 4)))"; cat "$f"; } >"$dir/hfconfig.seed/$(basename "$f").$i"
    i=$((i + 1))
done
mkdir -p "$dir/safetensors.seed" "$dir/msg.seed"
python3 - "$dir/safetensors.seed/one.safetensors" <<'PY'
import json, struct, sys
h = json.dumps({"a": {"dtype": "BF16", "shape": [2, 3], "data_offsets": [0, 12]},
                "b": {"dtype": "F32", "shape": [2], "data_offsets": [12, 20]},
                "__metadata__": {"format": "pt"}}).encode()
open(sys.argv[1], "wb").write(struct.pack("<Q", len(h)) + h + bytes(range(20)))
PY
# the protocol's keys as msgpack strings (fixstr), for the message decoder
{
    for k in $(grep -o 'F(struct [a-z_]*, "[a-z_]*"' proto/msg.c | sed 's/.*"\(.*\)"/\1/' | sort -u) \
        token type v body; do
        printf '"\\x%02x%s"\n' $((0xa0 + ${#k})) "$k"
    done
} >"$dir/msg.dict"
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=($(ls "$bin"))
rc=0
for t in "${targets[@]}"; do
    mkdir -p "$dir/$t.corpus"
    extra=()
    [ -f "$dir/$t.dict" ] && extra+=(-dict="$dir/$t.dict")
    out=$("$bin/$t" "$dir/$t.corpus" "$dir/$t.seed" -max_total_time="$secs" -print_final_stats=1 \
        -rss_limit_mb=4096 -timeout=20 -artifact_prefix="$dir/$t-" "${extra[@]}" 2>&1)
    code=$?
    execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' <<<"$out" | grep -o '[0-9]*$')
    if [ $code -ne 0 ]; then
        grep -E 'ERROR|SUMMARY|Test unit written|runtime error' <<<"$out" | head -n 8
        echo "fuzz $t: FAILED after ${execs:-?} executions (exit $code; reproducer in $dir)"
        rc=1
    else
        echo "fuzz $t: ${execs:-?} executions in ${secs} s, no crash"
    fi
done
exit $rc
