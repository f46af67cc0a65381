#!/usr/bin/env bash
# setup_test.sh — what a fresh machine goes through before the tests. scripts/deps.sh names
# what the tests need, so that nothing skips for want of a package it could have installed:
# libFuzzer's runtime, which clang only recommends and `apt-get install --no-install-recommends`
# therefore left out (the fuzz test skipped on every fresh machine), is listed for the installed
# clang — the very package that ships libclang_rt.fuzzer — and every listed package is one
# --check verifies. The builds of `make test` and `make demo` use every core (they ran on one),
# and share the job slots of a `make -jN` instead. Run from the repository root (make test
# does). Prints the harness tally.
pass=0 fail=0 skip=0
ok() { echo "ok setup $1"; pass=$((pass + 1)); }
bad() { echo "    $2"; echo "FAIL setup $1"; fail=$((fail + 1)); }
list=$(scripts/deps.sh --list)

echo "setup fuzzer_runtime ..."
if ! command -v clang >/dev/null; then
    grep -qx 'libclang-rt-14-dev' <<<"$list" && ok fuzzer_runtime ||
        bad fuzzer_runtime "no clang here, and the list lacks Debian 12's libclang-rt-14-dev"
else
    want="libclang-rt-$(clang -dumpversion | cut -d. -f1)-dev"
    # the package that ships the runtime, where dpkg knows it (it may come from elsewhere)
    owner=$(dpkg -S 'libclang_rt.fuzzer-*.a' 2>/dev/null | head -n 1 | cut -d: -f1)
    if ! grep -qx "$want" <<<"$list"; then
        bad fuzzer_runtime "scripts/deps.sh --list lacks $want (clang $(clang -dumpversion))"
    elif [ -n "$owner" ] && [ "$owner" != "$want" ]; then
        bad fuzzer_runtime "libclang_rt.fuzzer comes from $owner here, the list names $want"
    else
        ok fuzzer_runtime
    fi
fi

echo "setup check_covers_list ..."
# --check reports exactly the listed packages that are not installed
missing=()
while read -r p; do
    st=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
    [ "$st" = "install ok installed" ] || missing+=("$p")
done <<<"$list"
out=$(scripts/deps.sh --check 2>&1)
rc=$?
if [ ${#missing[@]} -eq 0 ]; then
    [ "$rc" -eq 0 ] && ok check_covers_list || bad check_covers_list "--check exited $rc: $out"
elif [ "$rc" -eq 0 ]; then
    # the fast path: everything builds and links though some package is absent (a prefix of
    # libraries made elsewhere, scripts/gpu/env.sh)
    echo "    (not installed, but the fast path found what it needs: ${missing[*]})"
    echo "SKIP setup check_covers_list: skipped: the libraries come from elsewhere here"
    skip=$((skip + 1))
else
    [ "$out" = "missing packages: ${missing[*]}" ] && ok check_covers_list ||
        bad check_covers_list "--check said: $out (expected missing packages: ${missing[*]})"
fi
echo "setup make_jobs ..."
# the sub-make lines as make -n prints them (-n runs sub-makes, also with -n: nothing is built)
n=$(nproc)
sub() { make -n "$@" BUILD=build/setup-test 2>/dev/null | grep -E '^make --no-print-directory ' | head -n 2; }
want_test="make --no-print-directory -j$n --output-sync=target SAN=1 BUILD=build/setup-test/asan OPT=\"-O1 -g\" tests progs"
want_demo="make --no-print-directory -j$n --output-sync=target all"
got_test=$(sub test | head -n 1) got_demo=$(sub demo | head -n 1) got_j=$(sub -j3 demo | head -n 1)
if [ "$got_test" != "$want_test" ]; then
    bad make_jobs "make test: $got_test (expected $want_test)"
elif [ "$got_demo" != "$want_demo" ]; then
    bad make_jobs "make demo: $got_demo (expected $want_demo)"
elif [ "$got_j" != "make --no-print-directory  --output-sync=target all" ]; then
    bad make_jobs "make -j3 demo: $got_j (its own -j3 should be shared, not overridden)"
else
    ok make_jobs
fi
rm -rf build/setup-test
echo "$pass passed, $fail failed, $skip skipped"
[ "$fail" -eq 0 ]
