/* progress.c — what a person watching a broadcast sees: bytes written of the bytes to write,
 * the rate, the time left and the reader expected to finish last, in decimal units (storage
 * and links are sold in them, so the numbers compare with a disk's or a NIC's rating). */
#include "bcast/bpriv.h"

#include <stdio.h>

char *bc_fmt_dec(uint64_t bytes, char *buf, size_t cap)
{
    static const char *const units[] = {"B", "kB", "MB", "GB", "TB", "PB"};
    double v = (double)bytes;
    unsigned u = 0;
    while (v >= 1000.0 && u + 1 < WB_ARRAY_LEN(units)) {
        v /= 1000.0;
        u++;
    }
    if (u == 0)
        snprintf(buf, cap, "%llu B", (unsigned long long)bytes);
    else
        snprintf(buf, cap, "%.*f %s", v < 10 ? 2 : v < 100 ? 1 : 0, v, units[u]);
    return buf;
}

char *bc_fmt_secs(double s, char *buf, size_t cap)
{
    if (s < 0 || s != s)
        s = 0;
    unsigned long t = (unsigned long)(s + 0.5);
    if (t >= 3600)
        snprintf(buf, cap, "%lu:%02lu:%02lu", t / 3600, t / 60 % 60, t % 60);
    else
        snprintf(buf, cap, "%lu:%02lu", t / 60, t % 60);
    return buf;
}

void wb_bcast_progress_line(const struct wb_bcast_progress_state *s, char *buf, size_t cap)
{
    char a[32], b[32], r[32], e[32];
    double rate = s->elapsed_s > 0 ? (double)s->done / s->elapsed_s : 0;
    double pct = s->total ? 100.0 * (double)s->done / (double)s->total : 100.0;
    int n =
        snprintf(buf, cap, "%s / %s  %5.1f%%  %s/s", bc_fmt_dec(s->done, a, sizeof(a)),
                 bc_fmt_dec(s->total, b, sizeof(b)), pct, bc_fmt_dec((uint64_t)rate, r, sizeof(r)));
    if (n < 0 || (size_t)n >= cap)
        return;
    if (rate > 0 && s->done < s->total)
        n += snprintf(buf + n, cap - (size_t)n, "  ETA %s",
                      bc_fmt_secs((double)(s->total - s->done) / rate, e, sizeof(e)));
    else
        n += snprintf(buf + n, cap - (size_t)n, "  ETA -:--");
    if (n > 0 && (size_t)n < cap && s->have_slowest)
        snprintf(buf + n, cap - (size_t)n, "  slowest reader %u %.1f%%", s->slowest,
                 100.0 * s->slowest_frac);
}
