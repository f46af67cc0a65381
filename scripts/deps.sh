#!/usr/bin/env bash
# Installs the Debian packages weightbridge needs to build and test, and nothing when all are
# present. Uses sudo when not root. Usage: scripts/deps.sh [--check]  (--check only reports)
set -eu
pkgs=(
    build-essential pkg-config
    libfabric-dev libibverbs-dev libnng-dev libmsgpack-dev libyaml-dev libjansson-dev
    iproute2 python3
)
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
