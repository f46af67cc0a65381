#!/usr/bin/env bash
# Source this on a lent GPU machine (no package registry there): unpacks the Debian packages
# carried in .deb/ (fetched here by scripts/gpu/fetch-debs.sh) into a prefix and points the
# compiler, linker and loader at it. Usage: . scripts/gpu/env.sh
wb_prefix=${WB_DEPS_PREFIX:-/tmp/wbdeps}
if [ ! -d "$wb_prefix/usr" ]; then
    mkdir -p "$wb_prefix"
    for f in .deb/*.deb; do dpkg -x "$f" "$wb_prefix"; done
fi
wb_lib=$wb_prefix/usr/lib/x86_64-linux-gnu
export CPATH=$wb_prefix/usr/include${CPATH:+:$CPATH}
export LIBRARY_PATH=$wb_lib${LIBRARY_PATH:+:$LIBRARY_PATH}
export LD_LIBRARY_PATH=$wb_lib:$wb_prefix/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
[ -d "$wb_lib/libfabric" ] && export FI_PROVIDER_PATH=$wb_lib/libfabric
export PATH=/usr/local/cuda/bin:$PATH
export NCCL_NVLS_ENABLE=0
