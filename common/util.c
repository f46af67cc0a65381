/* util.c — clock, random bits, human-readable sizes, growable arrays. */
#include "common/common.h"
#include "common/fpbits.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

uint64_t wb_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

uint64_t wb_random_u64(void)
{
    uint64_t v = 0;
    if (getrandom(&v, sizeof(v), 0) != (ssize_t)sizeof(v))
        v = wb_splitmix64(wb_now_ns() ^ (uint64_t)(uintptr_t)&v);
    return v;
}

char *wb_fmt_bytes(uint64_t bytes, char *buf, size_t cap)
{
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
    double v = (double)bytes;
    unsigned u = 0;
    while (v >= 1024.0 && u + 1 < WB_ARRAY_LEN(units)) {
        v /= 1024.0;
        u++;
    }
    if (u == 0)
        snprintf(buf, cap, "%llu B", (unsigned long long)bytes);
    else
        snprintf(buf, cap, "%.2f %s", v, units[u]);
    return buf;
}

int wb_grow(void *arrp, size_t *cap, size_t first, size_t elem)
{
    size_t n = *cap ? *cap : first;
    if (*cap && n > SIZE_MAX / 2 / elem)
        return -ENOMEM;
    n = *cap ? 2 * n : n;
    void *old;
    memcpy(&old, arrp, sizeof(old)); /* arrp is a T **: only its pointer value is used */
    void *p = realloc(old, n * elem);
    if (!p)
        return -ENOMEM;
    memcpy(arrp, &p, sizeof(p));
    *cap = n;
    return 0;
}
