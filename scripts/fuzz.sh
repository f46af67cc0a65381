#!/usr/bin/env bash
# fuzz.sh — runs every fuzz target (tests/fuzz/*_fuzz.c, built by `make fuzz` with clang's
# libFuzzer, ASan and UBSan) for SECONDS each, from seed corpora made of the repository's own
# inputs (job files, layouts, Hugging Face configs, a small safetensors file) and a dictionary of
# the control protocol's keys; prints each target's executions and exits non-zero on the first
# crash, leak or sanitizer report (the reproducer is kept in DIR).
# Usage: scripts/fuzz.sh [SECONDS (60)] [TARGET...]
# Env: WB_FUZZ_DIR (default /tmp/wb-fuzz); WB_FUZZ_JOBS=N runs N workers per target at once,
# each from its own copy of the corpus (the executions printed are their sum); WB_FUZZ_NOBUILD=1
# runs the fuzzers already in build/fuzz (a machine without clang, given them prebuilt).
set -uo pipefail
cd "$(dirname "$0")/.."
secs=${1:-60}
shift || true
bin=build/fuzz/fuzzers
dir=${WB_FUZZ_DIR:-/tmp/wb-fuzz}
jobs=${WB_FUZZ_JOBS:-1}
if [ -z "${WB_FUZZ_NOBUILD:-}" ] && ! make --no-print-directory fuzz >"$dir.build.log" 2>&1; then
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
seed family configs/models/*.yaml tests/fixtures/matcher/*.yaml
# Hugging Face configs with their layer and expert counts cut to a few (an execution then takes
# microseconds, not the milliseconds of generating 90,000 tensors; the code paths are the same,
# only loop trip counts differ), each behind a first byte that picks the model family.
mkdir -p "$dir/hfconfig.seed"
python3 - "$dir/hfconfig.seed" configs/hf/*.json configs/jobs/demo/config.json \
    tests/fixtures/matcher/phi3-tiny-fp8.json <<'PY'
import json, os, sys
cut = {"num_hidden_layers": 3, "max_window_layers": 3, "num_experts": 8, "n_routed_experts": 8,
       "num_local_experts": 8, "first_k_dense_replace": 1}
for i, f in enumerate(sys.argv[2:]):
    d = json.load(open(f))
    for k, v in cut.items():
        if isinstance(d.get(k), int):
            d[k] = min(d[k], v)
    out = os.path.join(sys.argv[1], "%s.%d" % (os.path.basename(f), i))
    open(out, "wb").write(bytes([i % 5]) + json.dumps(d, indent=1).encode())
PY
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
    extra=()
    [ -f "$dir/$t.dict" ] && extra+=(-dict="$dir/$t.dict")
    mkdir -p "$dir/$t.seed" # targets that build their inputs from any bytes (ctl) start empty
    pids=()
    for j in $(seq 1 "$jobs"); do
        mkdir -p "$dir/$t.corpus.$j"
        "$bin/$t" "$dir/$t.corpus.$j" "$dir/$t.seed" -max_total_time="$secs" \
            -print_final_stats=1 -rss_limit_mb=4096 -timeout=20 -seed="$((RANDOM * 32768 + RANDOM + j))" \
            -artifact_prefix="$dir/$t-$j-" "${extra[@]}" >"$dir/$t.$j.log" 2>&1 &
        pids+=($!)
    done
    execs=0 failed=0
    for j in $(seq 1 "$jobs"); do
        wait "${pids[$((j - 1))]}"
        code=$?
        n=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$dir/$t.$j.log" | grep -o '[0-9]*$')
        execs=$((execs + ${n:-0}))
        if [ $code -ne 0 ]; then
            grep -E 'ERROR|SUMMARY|Test unit written|runtime error' "$dir/$t.$j.log" | head -n 8
            failed=$((failed + 1))
        fi
    done
    if [ $failed -ne 0 ]; then
        echo "fuzz $t: FAILED in $failed of $jobs workers after $execs executions (reproducer in $dir)"
        rc=1
    else
        echo "fuzz $t: $execs executions in ${secs} s ($jobs worker$([ "$jobs" = 1 ] || echo s)), no crash"
    fi
done
exit $rc
