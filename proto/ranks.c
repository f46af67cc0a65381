/* ranks.c — naming the agents a job waits for, in one line: "trainer ranks 1-3 (not
 * registered); rollout rank 0 (dead)". The controller says it when a job is not ready (a
 * transfer refused, its log), wb-ctl status prints it, and an endpoint whose wait for the job
 * timed out puts it in its error — every missing rank, not the first, so that a job of 64
 * agents with 3 missing says which 3. */
#include "proto/proto.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Appends to out at *at (snprintf's rules: *at may pass cap, out stays terminated). */
static void add(char *out, size_t cap, size_t *at, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void add(char *out, size_t cap, size_t *at, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(*at < cap ? out + *at : NULL, *at < cap ? cap - *at : 0, fmt, ap);
    va_end(ap);
    if (n > 0)
        *at += (size_t)n;
}

size_t wb_ranks_text(const struct wb_rank_state *v, size_t n, char *out, size_t cap)
{
    size_t at = 0;
    if (cap)
        out[0] = 0;
    for (size_t i = 0; i < n;) {
        size_t j = i; /* the group: entries i..j-1 of one role and state */
        while (j < n && strcmp(v[j].role, v[i].role) == 0 && strcmp(v[j].state, v[i].state) == 0)
            j++;
        add(out, cap, &at, "%s%s rank%s ", i ? "; " : "", v[i].role, j - i > 1 ? "s" : "");
        for (size_t k = i; k < j;) {
            size_t e = k; /* a run of consecutive ranks */
            while (e + 1 < j && v[e + 1].rank == v[e].rank + 1)
                e++;
            add(out, cap, &at, "%s%u", k > i ? ", " : "", v[k].rank);
            if (e > k)
                add(out, cap, &at, "-%u", v[e].rank);
            k = e + 1;
        }
        add(out, cap, &at, " (%s)", v[i].state);
        i = j;
    }
    if (cap && at >= cap && cap > 4)
        memcpy(out + cap - 4, "...", 4);
    return at;
}

int wb_status_missing(const struct wb_body_status *st, char *out, size_t cap)
{
    struct wb_mpr r;
    uint32_t n = 0;
    if (cap)
        out[0] = 0;
    wb_mpr_init(&r, st->agents.p, st->agents.n);
    if (wb_mpr_array(&r, 2 * WB_RANKS_MAX, &n))
        return -EBADMSG;
    struct wb_rank_state *v = calloc(n ? n : 1, sizeof(*v));
    struct wb_body_agent_status *a = calloc(n ? n : 1, sizeof(*a));
    int rc = v && a ? 0 : -ENOMEM;
    size_t k = 0;
    char why[64];
    for (uint32_t i = 0; !rc && i < n; i++) {
        if (wb_body_get(&r, WB_BODY_AGENT_STATUS, &a[k], why, sizeof(why))) {
            rc = -EBADMSG;
            break;
        }
        const char *s = a[k].state; /* present (a failed setup is said on its own) or not */
        if (strcmp(s, "alive") == 0 || strcmp(s, "suspect") == 0 || strcmp(s, "failed") == 0)
            continue;
        v[k] = (struct wb_rank_state){a[k].role, (uint32_t)a[k].rank,
                                      strcmp(s, "absent") == 0 ? "not registered" : s};
        k++;
    }
    if (!rc)
        wb_ranks_text(v, k, out, cap);
    free(v);
    free(a);
    return rc ? rc : (int)k;
}
