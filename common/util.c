/* util.c — clock, random bits, human-readable sizes, growable arrays, escaped text. */
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

/* Bytes of the well-formed UTF-8 sequence at p (2 to 4), or 0 when the lead byte p[0] (>= 0x80)
 * starts none: a stray continuation byte, an overlong form, a surrogate, past U+10FFFF, cut
 * short (the NUL is no continuation byte, so nothing past the string is read). */
static size_t utf8_len(const unsigned char *p)
{
    unsigned c = p[0];
    unsigned lo = 0x80, hi = 0xbf; /* the second byte's range */
    size_t n;
    if (c >= 0xc2 && c <= 0xdf)
        n = 2;
    else if (c >= 0xe0 && c <= 0xef) {
        n = 3;
        lo = c == 0xe0 ? 0xa0 : 0x80;
        hi = c == 0xed ? 0x9f : 0xbf;
    } else if (c >= 0xf0 && c <= 0xf4) {
        n = 4;
        lo = c == 0xf0 ? 0x90 : 0x80;
        hi = c == 0xf4 ? 0x8f : 0xbf;
    } else
        return 0;
    if (p[1] < lo || p[1] > hi)
        return 0;
    for (size_t i = 2; i < n; i++)
        if (p[i] < 0x80 || p[i] > 0xbf)
            return 0;
    return n;
}

/* The escaped form of the character at p into piece; returns its length, *adv the bytes read. */
static size_t esc_piece(const unsigned char *p, char piece[16], size_t *adv)
{
    unsigned c = p[0];
    size_t u;
    *adv = 1;
    if (c == '\\' || c == '\n' || c == '\t' || c == '\r')
        return (size_t)snprintf(piece, 16, "\\%c",
                                c == '\n'   ? 'n'
                                : c == '\t' ? 't'
                                : c == '\r' ? 'r'
                                            : '\\');
    if (c < 0x20 || c == 0x7f)
        return (size_t)snprintf(piece, 16, "\\x%02x", c);
    if (c < 0x80) {
        piece[0] = (char)c;
        return 1;
    }
    if ((u = utf8_len(p)) == 0)
        return (size_t)snprintf(piece, 16, "\\x%02x", c);
    *adv = u;
    if (u == 2 && c == 0xc2 && p[1] < 0xa0) /* U+0080..U+009F: the C1 controls */
        return (size_t)snprintf(piece, 16, "\\xc2\\x%02x", p[1]);
    memcpy(piece, p, u);
    return u;
}

char *wb_esc_str(const char *s, char *buf, size_t cap)
{
    const unsigned char *text = (const unsigned char *)(s ? s : "(null)"), *p;
    char piece[16];
    size_t adv, total = 0, n = 0;
    if (cap < 4) {
        if (cap)
            buf[0] = 0;
        return buf;
    }
    for (p = text; *p && total < cap; p += adv)
        total += esc_piece(p, piece, &adv);
    bool cut = total >= cap; /* then keep room for "..." after the last piece kept */
    for (p = text; *p; p += adv) {
        size_t k = esc_piece(p, piece, &adv);
        if (cut && n + k + 3 >= cap) {
            memcpy(buf + n, "...", 3);
            n += 3;
            break;
        }
        memcpy(buf + n, piece, k);
        n += k;
    }
    buf[n] = 0;
    return buf;
}

struct wb_esc_buf wb_esc(const char *s)
{
    struct wb_esc_buf o;
    wb_esc_str(s, o.s, sizeof(o.s));
    return o;
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
