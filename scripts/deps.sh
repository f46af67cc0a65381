#!/usr/bin/env bash
# Installs the Debian packages weightbridge needs to build and test, and nothing when all are
# present. Uses sudo when not root.
# Usage: scripts/deps.sh [--check | --list]  (--check only reports; --list prints the packages)
set -eu
# libFuzzer's runtime (make fuzz, tests/sh/fuzz_test.sh) is in libclang-rt-N-dev, which clang-N
# only recommends: the --no-install-recommends below leaves it out unless it is named. N is the
# installed clang's major version, or Debian 12's (14) when clang is still to be installed.
clang_major=$(clang -dumpversion 2>/dev/null | cut -d. -f1 || true)
pkgs=(
    build-essential pkg-config
    libfabric-dev libibverbs-dev libnng-dev libmsgpack-dev libyaml-dev libjansson-dev libxxhash-dev
    iproute2 python3 python3-numpy python3-setuptools python3-pip python3-venv python3-torch
    clang "libclang-rt-${clang_major:-14}-dev" bsdutils openssl gdb
)
if [ "${1:-}" = "--list" ]; then
    printf '%s\n' "${pkgs[@]}"
    exit 0
fi
# Fast path, and the one that works where the libraries come from elsewhere (a prefix set up
# by scripts/gpu/env.sh on the lent GPU machines): the headers compile and the libraries link.
probe() {
    printf '%s\n' '#include <rdma/fabric.h>' '#include <infiniband/verbs.h>' '#include <nng/nng.h>' \
        '#include <msgpack.h>' '#include <yaml.h>' '#include <jansson.h>' '#include <xxhash.h>' \
        'int main(void){return 0;}' |
        ${CC:-cc} -x c - -o /dev/null -lfabric -libverbs -lnng -lmsgpackc -lyaml -ljansson -lxxhash 2>/dev/null
}
# iproute2 only serves the network-namespace tests, which skip without it.
# The Python package's tests need numpy in some python3 (Debian's python3-numpy lives in
# /usr/bin/python3's path even where another python3 comes first); the README's install makes a
# venv, which on Debian needs python3-venv (ensurepip).
# tests/sh/delta_rates_test.sh runs scripts/gpu/delta_rates.py on the CPU with Debian's torch.
py_ok() {
    for p in /usr/bin/python3 python3; do
        command -v "$p" >/dev/null && "$p" -c 'import numpy, setuptools, pip, ensurepip, torch' 2>/dev/null &&
            return 0
    done
    return 1
}
# The fuzz targets (make fuzz) need clang with libFuzzer.
fuzz_ok() {
    command -v clang >/dev/null &&
        printf 'int LLVMFuzzerTestOneInput(const char *d, long n){return 0;}\n' |
        clang -fsanitize=fuzzer -x c - -o /dev/null 2>/dev/null
}
# script(1) (bsdutils, essential on Debian) runs wb-broadcast under a terminal in its test;
# openssl makes the certificates of the TLS test; gdb gives a hung process's stacks in the
# fault-injection test's report.
if probe && py_ok && fuzz_ok && command -v script >/dev/null && command -v openssl >/dev/null &&
    command -v gdb >/dev/null; then
    command -v ip >/dev/null || echo "deps: no iproute2 here; network-namespace tests will skip"
    exit 0
fi
missing=()
for p in "${pkgs[@]}"; do
    st=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
    [ "$st" = "install ok installed" ] || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
    exit 0
fi
if [ "${1:-}" = "--check" ]; then
    echo "missing packages: ${missing[*]}"
    exit 1
fi
echo "deps: installing ${missing[*]}"
sudo=""
if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || { echo "deps: not root and no sudo; install: ${missing[*]}" >&2; exit 1; }
    sudo=sudo
fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -q
$sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
