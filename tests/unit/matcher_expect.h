/* What the matcher's unit tests share: an exact check of an error list, a formatted string
 * that outlives the next one, and test files written apart. */
#ifndef WB_TESTS_MATCHER_EXPECT_H
#define WB_TESTS_MATCHER_EXPECT_H

#include "matcher/matcher.h"
#include "tests/wbtest.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

/* Checks the error list is exactly `want` (n messages, in order); prints both otherwise. */
static inline void expect(const struct wb_errlist *el, size_t n, const char *const *want, int line)
{
    bool ok = el->n == n;
    for (size_t i = 0; ok && i < n; i++)
        ok = strcmp(el->msgs[i], want[i]) == 0;
    if (ok)
        return;
    for (size_t i = 0; i < el->n; i++)
        fprintf(stderr, "  got:  %s\n", el->msgs[i]);
    for (size_t i = 0; i < n; i++)
        fprintf(stderr, "  want: %s\n", want[i]);
    wb_test_fail(__FILE__, line, "error list differs (%zu messages, %zu expected)", el->n, n);
}
#define EXPECT(el, ...)                                                                            \
    do {                                                                                           \
        const char *const want_[] = {__VA_ARGS__};                                                 \
        expect((el), WB_ARRAY_LEN(want_), want_, __LINE__);                                        \
    } while (0)

/* printf into one of 8 rotating buffers: up to 8 results live at once */
static inline char *fmt(const char *f, ...) __attribute__((format(printf, 1, 2)));
static inline char *fmt(const char *f, ...)
{
    static char bufs[8][1024];
    static int k;
    char *b = bufs[k++ % 8];
    va_list ap;
    va_start(ap, f);
    vsnprintf(b, sizeof(bufs[0]), f, ap);
    va_end(ap);
    return b;
}

/* wb_test_write_file() reuses one buffer for the path; keep a few apart */
static inline const char *put(const char *name, const char *text)
{
    static char paths[8][512];
    static int k;
    char *p = paths[k++ % 8];
    snprintf(p, sizeof(paths[0]), "%s", wb_test_write_file(name, text));
    return p;
}

#endif
