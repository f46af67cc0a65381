#!/usr/bin/env bash
# cxx_test.sh — a C++ program can use the library (issue #31 item 6): it includes every public
# header (<part>/<part>.h, plus common/fpbits.h: what `make install` puts under
# include/weightbridge/), calls the API, links against this build's libweightbridge.so, and runs.
# Without extern "C" in the headers the link fails (`wb_endpoint_close(wb_endpoint*)` undefined).
# Run from the repository root (make test does). g++, else clang++; none: skipped.
build=$(cd "$(dirname "$0")/.." && pwd)
root=$(pwd)
so=$build/lib/libweightbridge.so
echo "cxx link_and_run ..."
cxx=""
for c in g++ clang++; do
    command -v "$c" >/dev/null && cxx=$c && break
done
if [ -z "$cxx" ]; then
    echo "SKIP cxx link_and_run: skipped: no C++ compiler (g++ or clang++)"
    echo "0 passed, 0 failed, 1 skipped"
    exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
headers=$(cd "$root" && for h in */*.h; do [ "$(dirname "$h")" = "$(basename "$h" .h)" ] && echo "$h"; done)
{
    for h in $headers common/fpbits.h; do echo "#include \"$h\""; done
    cat <<'CXX'
#include <cstdio>
#include <cstring>
#include <string>

int main()
{
    // an endpoint made, a tensor added, closed: nothing is sent before wb_endpoint_start
    wb_endpoint_opts o;
    std::memset(&o, 0, sizeof(o));
    o.role = WB_ROLE_TRAINER;
    o.device = -1;
    o.controller = "tcp://127.0.0.1:9";
    o.token = "cxx";
    wb_endpoint *ep = nullptr;
    int rc = wb_endpoint_open(&o, &ep);
    if (rc != 0) {
        std::printf("wb_endpoint_open: %s\n", wb_strerror(rc));
        return 1;
    }
    static unsigned short w[8];
    const uint64_t shape[1] = {8}, off[1] = {0}, ext[1] = {8};
    rc = wb_endpoint_add_args(ep, "w", "bf16", 1, shape, off, ext, nullptr, w, nullptr);
    std::printf("add: %d\n", rc);
    wb_endpoint_close(ep);
    enum wb_dtype d;
    rc = wb_dtype_parse("fp8_e4m3", &d);
    std::printf("dtype: %d %s\n", rc, wb_dtype_name(d));
    std::printf("ended: %s\n", std::string(wb_strerror(-WB_E_ENDED)).c_str());
    std::printf("role: %s\n", wb_role_name(WB_ROLE_ROLLOUT));
    return 0;
}
CXX
} >"$tmp/prog.cpp"
# the library's soname is libweightbridge.so.0 (make install makes the link; here, tmp does)
mkdir "$tmp/lib" && ln -s "$so" "$tmp/lib/libweightbridge.so.0"
san=""
ldd "$so" 2>/dev/null | grep -q libasan && san="-fsanitize=address,undefined"
if ! out=$("$cxx" -std=c++11 -Wall -Wextra -Werror $san -I"$root" "$tmp/prog.cpp" -o "$tmp/prog" \
    "$so" -Wl,-rpath,"$tmp/lib" 2>&1); then
    echo "$out" | head -40 | sed 's/^/    /'
    echo "FAIL cxx link_and_run: $cxx could not build it"
    echo "0 passed, 1 failed, 0 skipped"
    exit 1
fi
got=$(ASAN_OPTIONS=detect_leaks=0 "$tmp/prog" 2>&1)
want="add: 0
dtype: 0 fp8_e4m3
ended: the job was shut down
role: rollout"
if [ "$got" != "$want" ]; then
    printf 'got:\n%s\nexpected:\n%s\n' "$got" "$want" | sed 's/^/    /'
    echo "FAIL cxx link_and_run"
    echo "0 passed, 1 failed, 0 skipped"
    exit 1
fi
echo "ok cxx link_and_run ($cxx, $(echo $headers common/fpbits.h | wc -w) headers)"
echo "1 passed, 0 failed, 0 skipped"
