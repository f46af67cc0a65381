#!/usr/bin/env bash
# fuzz_test.sh — a short run of every fuzz target (scripts/fuzz.sh: the message decoder, the
# controller's message handlers, job and layout files, Hugging Face configs through the model
# rules, model-family files, safetensors headers; clang's libFuzzer with ASan and UBSan), 5 s
# each; a crash or sanitizer report fails it. Skipped where clang cannot build libFuzzer targets. The long run:
# WB_FUZZ_JOBS=16 scripts/fuzz.sh 300.
root=$(pwd)
if ! command -v clang >/dev/null ||
    ! printf 'int LLVMFuzzerTestOneInput(const char *d, long n){return 0;}\n' |
    clang -fsanitize=fuzzer -x c - -o /dev/null 2>/dev/null; then
    echo "fuzz ..."
    echo "SKIP fuzz: skipped: no clang with libFuzzer (scripts/deps.sh installs clang and its" \
        "runtime, libclang-rt-N-dev)"
    echo "0 passed, 0 failed, 1 skipped"
    exit 0
fi
dir=$(mktemp -d /tmp/wb-fuzz.XXXXXX)
out=$(WB_FUZZ_DIR=$dir "$root/scripts/fuzz.sh" "${WB_FUZZ_SECONDS:-5}" 2>&1)
passed=0 failed=0
while IFS= read -r line; do
    case "$line" in
    "fuzz "*": "*"no crash")
        t=${line#fuzz }
        echo "fuzz ${t%%:*} ..."
        echo "ok $line"
        passed=$((passed + 1))
        ;;
    "fuzz "*"FAILED"*)
        t=${line#fuzz }
        echo "fuzz ${t%%:*} ..."
        echo "FAIL $line"
        failed=$((failed + 1))
        ;;
    *) echo "    $line" ;;
    esac
done <<<"$out"
[ $((passed + failed)) -gt 0 ] || { echo "FAIL fuzz: no target ran"; failed=1; }
# the corpora and the build log go; a failure keeps them, reproducer included
if [ "$failed" -eq 0 ]; then
    rm -rf "$dir" "$dir.build.log"
else
    echo "    kept: $dir (the reproducer) and $dir.build.log"
fi
echo "$passed passed, $failed failed, 0 skipped"
