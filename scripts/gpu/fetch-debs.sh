#!/usr/bin/env bash
# Run here (a Debian machine with the package registry) before using the lent GPU machine:
# downloads the runtime and -dev packages weightbridge links against into .deb/ (git-ignored),
# which the device call carries and scripts/gpu/env.sh unpacks there.
set -eu
cd "$(dirname "$0")/../.."
mkdir -p .deb
cd .deb
apt-get download libfabric1 libfabric-dev libnng1 libnng-dev libmsgpackc2 libmsgpack-dev \
    libyaml-0-2 libyaml-dev libjansson4 libjansson-dev libibverbs1 libibverbs-dev \
    ibverbs-providers libpsm2-2 libpsm-infinipath1 librdmacm1 libnl-3-200 libnl-route-3-200 \
    libnuma1 libmbedtls14 libmbedx509-1 libmbedcrypto7 libxxhash0 libxxhash-dev
