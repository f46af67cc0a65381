#!/usr/bin/env bash
# install_test.sh — `make install` puts a usable library in place: into a fresh prefix it
# installs the programs, libweightbridge.{a,so}, the headers, the pkg-config file and the
# shipped configs; `pkg-config --cflags --libs weightbridge` then builds a tiny C program that
# links and runs against the installed shared library, and the Python package installs offline
# (Debian's setuptools, no index), loads that library, imports every engine and framework adapter
# without the engines present, and declares vLLM's plugin entry point; the installed wb-match runs
# the semantic check with the forward code make install put beside it. The README's install —
# `make python`, a venv seeing Debian's packages, pip install build/python — gives a package that
# loads the library it carries, from anywhere, with no $WB_LIBRARY, LD_LIBRARY_PATH or `make
# install`, and plans with it. Run from the repository root with the
# build directory this script sits in (its configuration is read from BUILD/config).
build=$(cd "$(dirname "$0")/.." && pwd)
root=$(pwd)
pass=0 fail=0 skip=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cfg=$(cat "$build/config")
san=$(sed -n 's/.*san=\([01]\).*/\1/p' <<<"$cfg")
opt=$(sed -n 's/.*opt=\(.*\) cflags=.*/\1/p' <<<"$cfg")
cuda=$(sed -n 's/.*cuda=\([01]\).*/\1/p' <<<"$cfg")
prefix=$tmp/prefix

t() { echo "install $1 ..."; }
ok() { echo "ok install $1"; pass=$((pass + 1)); }
bad() { echo "    $2"; echo "FAIL install $1"; fail=$((fail + 1)); }

t make_install
if out=$(make -s -C "$root" install PREFIX="$prefix" BUILD="$build" SAN="$san" OPT="$opt" \
    CUDA="$cuda" 2>&1) && [ -x "$prefix/bin/wb-plan" ] && [ -f "$prefix/lib/libweightbridge.so.0" ] &&
    [ -f "$prefix/include/weightbridge/agent/agent.h" ] &&
    [ -f "$prefix/share/weightbridge/configs/models/qwen3_moe.yaml" ]; then
    ok make_install
else
    bad make_install "$(tail -5 <<<"$out")"
fi

t pkg_config_link
export PKG_CONFIG_PATH=$prefix/lib/pkgconfig
cat >"$tmp/hello.c" <<'C'
#include <stdio.h>
#include "common/common.h"
#include "planner/planner.h"

int main(void)
{
    struct wb_shape s = {.ndim = 2, .dim = {128, 256}};
    printf("%s %llu %s\n", wb_strerror(-WB_E_PEER), (unsigned long long)wb_shape_numel(&s),
           wb_plan_mode_name(WB_MODE_GATHER));
    return 0;
}
C
sanflags=""
[ "$san" = 1 ] && sanflags="-fsanitize=address,undefined"
if flags=$(pkg-config --cflags --libs weightbridge 2>&1) &&
    out=$(cc -std=c11 $sanflags "$tmp/hello.c" -o "$tmp/hello" $flags 2>&1) &&
    run=$(LD_LIBRARY_PATH=$prefix/lib ASAN_OPTIONS=detect_leaks=0 "$tmp/hello" 2>&1) &&
    [ "$run" = "peer died or stopped answering 32768 gather" ] &&
    LD_LIBRARY_PATH=$prefix/lib ldd "$tmp/hello" | grep -q "$prefix/lib/libweightbridge.so.0"; then
    ok pkg_config_link
else
    bad pkg_config_link "pkg-config: $flags; cc: $out; ran: $run"
fi

# What the README says a program of a prefix outside the system's folders needs: without
# PKG_CONFIG_PATH pkg-config does not find the library, and without an rpath (or
# LD_LIBRARY_PATH) the program does not start; with -Wl,-rpath it runs as it is.
t pkg_config_prefix_needs
none=$(env -u PKG_CONFIG_PATH pkg-config --libs weightbridge 2>&1)
if [ -f /usr/lib/pkgconfig/weightbridge.pc ] || [ -f /usr/local/lib/pkgconfig/weightbridge.pc ]; then
    echo "SKIP install pkg_config_prefix_needs: skipped: a weightbridge.pc is installed system-wide"
    skip=$((skip + 1))
elif env -u PKG_CONFIG_PATH pkg-config --exists weightbridge; then
    bad pkg_config_prefix_needs "pkg-config found weightbridge without PKG_CONFIG_PATH: $none"
elif ! norpath=$(env -u LD_LIBRARY_PATH ASAN_OPTIONS=detect_leaks=0 "$tmp/hello" 2>&1) &&
    grep -q "libweightbridge.so.0: cannot open shared object file" <<<"$norpath" &&
    cc -std=c11 $sanflags "$tmp/hello.c" -o "$tmp/hello-rpath" $flags -Wl,-rpath,"$prefix/lib" &&
    run=$(env -u LD_LIBRARY_PATH ASAN_OPTIONS=detect_leaks=0 "$tmp/hello-rpath" 2>&1) &&
    [ "$run" = "peer died or stopped answering 32768 gather" ]; then
    ok pkg_config_prefix_needs
else
    bad pkg_config_prefix_needs "without LD_LIBRARY_PATH: $norpath; with an rpath: $run"
fi

# The installed wb-match finds the semantic check's forward code in share/weightbridge/semantic
# (not the checkout's: it runs from a copy of the prefix moved elsewhere) and runs the check
# with the installed wb-broadcast and wb-agent on the installed configs.
t semantic_check
semp=""
for p in "${WB_PYTHON:-}" python3 /usr/bin/python3; do
    [ -n "$p" ] && command -v "$p" >/dev/null && "$p" -c 'import numpy' 2>/dev/null && semp=$p && break
done
if [ -z "$semp" ]; then
    echo "SKIP install semantic_check: skipped: no python3 with numpy"
    skip=$((skip + 1))
elif cp -R "$prefix" "$tmp/moved" && sh=$tmp/moved/share/weightbridge &&
    out=$(cd "$tmp" && env -u WB_SEMANTIC_DIR WB_PYTHON="$semp" "$tmp/moved/bin/wb-match" --check-semantics \
        --family "$sh/configs/models/qwen3.yaml" --config "$sh/configs/hf/Qwen3-8B.json" --dtype bf16 2>&1) &&
    [ "$(tail -n 1 <<<"$out")" = "semantic check passed" ] && [ -f "$sh/semantic/semcheck.py" ]; then
    ok semantic_check
else
    bad semantic_check "$(tail -5 <<<"$out")"
fi

t python_package
py=""
for p in /usr/bin/python3 python3; do
    command -v "$p" >/dev/null && "$p" -c 'import setuptools, pip' 2>/dev/null && py=$p && break
done
if [ -z "$py" ]; then
    echo "SKIP install python_package: skipped: no python3 with setuptools and pip"
    skip=$((skip + 1))
else
    asan=$(ldd "$prefix/lib/libweightbridge.so.0" | awk '/libasan/ {print $3}')
    if out=$("$py" -m pip install -q --no-index --no-build-isolation --target "$tmp/py" \
        "$root/python" 2>&1) &&
        run=$(cd "$tmp" && env -u WB_LIBRARY PYTHONPATH="$tmp/py" LD_LIBRARY_PATH="$prefix/lib" \
            ${asan:+LD_PRELOAD=$asan} ASAN_OPTIONS=detect_leaks=0 \
            "$py" -c 'import weightbridge as wb; print(wb.library_path)
import weightbridge.vllm, weightbridge.sglang, weightbridge.verl, weightbridge.slime, weightbridge.nemo_rl
from importlib.metadata import entry_points
print(*[e.value for e in entry_points(group="vllm.general_plugins") if e.name == "weightbridge"])' 2>&1) &&
        [ "$run" = "libweightbridge.so.0
weightbridge.vllm:register" ]; then
        ok python_package
    else
        bad python_package "pip: $(tail -3 <<<"$out"); import: $run"
    fi
fi
t python_venv
py=""
for p in /usr/bin/python3 python3; do
    command -v "$p" >/dev/null && "$p" -c 'import ensurepip, numpy' 2>/dev/null && py=$p && break
done
if [ -z "$py" ]; then
    echo "SKIP install python_venv: skipped: no python3 with ensurepip (python3-venv) and numpy"
    skip=$((skip + 1))
else
    asan=$(ldd "$build/lib/libweightbridge.so" | awk '/libasan/ {print $3}')
    venv=$tmp/venv
    want="$venv/lib/$("$py" -c 'import sys; print(f"python{sys.version_info[0]}.{sys.version_info[1]}")')/site-packages/weightbridge/libweightbridge.so"
    # a plan of the shipped demo layouts, its totals as wb-plan prints them
    probe='import weightbridge as wb, sys
r = sys.argv[1] + "/configs/"
p = wb.plan(r + "models/qwen3_moe.yaml", r + "jobs/demo/config.json", r + "jobs/demo/trainer.yaml",
            r + "jobs/demo/rollout.yaml")
print(wb.library_path)
print(p["stats"]["total_bytes"], p["ntrainers"], p["nrollouts"])'
    if out=$(make -s -C "$root" python BUILD="$build" SAN="$san" OPT="$opt" CUDA="$cuda" 2>&1) &&
        out=$("$py" -m venv --system-site-packages "$venv" 2>&1) &&
        out=$("$venv/bin/pip" install -q --no-index --no-build-isolation "$build/python" 2>&1) &&
        run=$(cd "$tmp" && env -u WB_LIBRARY -u LD_LIBRARY_PATH -u PYTHONPATH ${asan:+LD_PRELOAD=$asan} \
            ASAN_OPTIONS=detect_leaks=0 "$venv/bin/python" -c "$probe" "$root" 2>&1) &&
        [ "$run" = "$want
3423808 4 2" ]; then
        ok python_venv
    else
        bad python_venv "$(tail -3 <<<"$out"); ran: $run (expected $want)"
    fi
fi
echo "$pass passed, $fail failed, $skip skipped"
[ "$fail" -eq 0 ]
