/* verify_dest.c — verify's destination check where the rollout replicas are congruent, in work
 * per write record instead of per written copy and bucket.
 *
 * Replicas hold the same local tensors rank by rank (replica j's rank l has replica 0's rank l's
 * receive list), and the balancer sends each replica its bytes from whichever owner it picked,
 * so a record fans out to the same local rank of all replicas (a tensor with one owner per
 * shard) or of a few (a replicated one: at 32 Kimi-K2 replicas 3.4M of the 5.6M records, 7.3M
 * writes). The exact check (verify.c: check_destinations) counts and marks each copy in its own
 * replica's bucket, 1.4M buckets looked up and touched at random. Here a (local rank, local
 * tensor) pair is one class for all replicas, found in a small table: where every record of the
 * class reaches every replica, one bitmap of its written prefix stands for all of them (as the
 * exact check's replica classes do); where some record reaches only some, the class has a
 * bitmap per replica at the class's granularity, and a record marks its copies' bitmaps. A bit
 * set twice is a byte written twice; every bitmap must end full: every byte of every replica
 * written exactly once, inside its local tensor.
 *
 * It only proves. Whatever it cannot show — a record that does not fit the classes (copies at
 * other local ranks, past the last rank, to a tensor the rank does not hold, past the written
 * prefix), receive lists that differ between replicas, more than 32 replicas, bitmaps larger
 * than the records, or any violation — sends verify to the exact check, which names every
 * problem as it always did. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "planner/plan_int.h"

/* One (local rank, local tensor) class: its wanted prefix and its bitmaps. */
struct dclass {
    uint64_t want;  /* bytes every replica's copy must have written: a prefix */
    uint64_t acc;   /* OR of the prefix and every offset and length: granule = lowest bit */
    uint64_t at;    /* its bitmaps at this word of bits */
    uint64_t words; /* of one bitmap: a bit per granule */
    uint32_t count; /* records */
    uint8_t shift;  /* log2 granule */
    bool some;      /* a record reaches only some replicas: a bitmap per replica, else one */
};

struct dfast {
    const struct wb_plan *p;
    uint32_t gpr, reps, nt;
    uint32_t full;     /* every replica's bit */
    uint32_t *cls;     /* [gpr * nt]: class + 1 of (local rank, rollout tensor); 0: none */
    uint32_t *lr, *rp; /* [nrollouts]: each rank's local rank and replica (no divisions) */
    struct dclass *C;  /* classes, local rank by local rank in receive-list order */
    uint32_t *mask;    /* granule masks of the classes with `some` */
    uint64_t *bits;    /* granule bits of the others */
    struct wb_plan_tbuf tb;
};

/* Whether receive list g is replica 0's rank g % gpr's in everything that decides what it must
 * be written (pl_local_written: tp and ep rank, local tensors and their bytes). */
static bool same_recv(const struct wb_recv_list *a, const struct wb_recv_list *b)
{
    if (a->tp_rank != b->tp_rank || a->ep_rank != b->ep_rank || a->nlocal != b->nlocal)
        return false;
    for (uint32_t i = 0; i < a->nlocal; i++)
        if (a->local[i].tensor != b->local[i].tensor || a->local[i].bytes != b->local[i].bytes ||
            a->local[i].dtype != b->local[i].dtype)
            return false;
    return true;
}

/* The record's class (index) and its copies' replica mask; false when it does not fit. */
static bool record_class(const struct dfast *f, const struct wb_rt_write *x, uint32_t *c,
                         uint32_t *m)
{
    uint64_t last = x->dst_rank + (uint64_t)x->more * x->rank_step;
    if (last >= f->p->nrollouts || x->dst_tensor >= f->nt || (x->more && !x->rank_step))
        return false;
    /* a step below the rank count (the last copy is a rank); copies at other local ranks? */
    if (x->more && f->lr[x->rank_step])
        return false;
    uint32_t j = f->rp[x->dst_rank], js = x->more ? f->rp[x->rank_step] : 0;
    uint32_t k = f->cls[(size_t)f->lr[x->dst_rank] * f->nt + x->dst_tensor];
    if (!k)
        return false;
    /* replicas j, j + js, ..., all below reps <= 32 (the last copy is a rank of the plan), and
     * distinct: js >= 1 when there are copies */
    uint32_t mm = 0;
    if (js == 1)
        mm = (x->more == 31 ? ~0u : (1u << (x->more + 1)) - 1) << j;
    else
        for (uint32_t i = 0; i <= x->more; i++)
            mm |= 1u << (j + i * js);
    *c = k - 1;
    *m = mm;
    return true;
}

/* Pass 1: counts and granularity; false when a record does not fit. */
static bool count_pass(struct dfast *f)
{
    for (uint32_t r = 0; r < f->p->ntrainers; r++) {
        const struct wb_route_table *t = pl_plan_table(f->p, r, &f->tb, false);
        if (!t)
            return false;
        for (uint32_t w = 0; w < t->nwrites; w++) {
            const struct wb_rt_write *x = &t->writes[w];
            uint32_t c;
            uint32_t m;
            if (!record_class(f, x, &c, &m))
                return false;
            struct dclass *d = &f->C[c];
            if (x->dst_off + x->len > d->want || x->dst_off + x->len < x->dst_off)
                return false;
            d->count++;
            d->acc |= x->dst_off | x->len;
            d->some |= m != f->full;
        }
    }
    return true;
}

/* Sets bits [a, z) of bm; true when one of them was set already. */
static bool mark_bits(uint64_t *bm, uint64_t a, uint64_t z)
{
    bool twice = false;
    while (a < z) {
        uint64_t w = a / 64, b = a % 64, n = z - a < 64 - b ? z - a : 64 - b;
        uint64_t m = (n == 64 ? ~0ull : ((1ull << n) - 1)) << b;
        twice |= (bm[w] & m) != 0;
        bm[w] |= m;
        a += n;
    }
    return twice;
}

enum { AHEAD = 12 }; /* records on: their granule asked for early */

static void prefetch_mark(const struct dfast *f, const struct wb_route_table *t, uint32_t w)
{
    if (w >= t->nwrites)
        return;
    const struct wb_rt_write *x = &t->writes[w];
    uint32_t c, m;
    if (record_class(f, x, &c, &m)) {
        const struct dclass *d = &f->C[c];
        uint64_t i = (x->dst_off >> d->shift) / 64;
        __builtin_prefetch(&f->bits[d->at + (d->some ? __builtin_ctz(m) * d->words : 0) + i], 1);
    }
}

/* Pass 2: every record's granules marked in its copies' bitmaps (the class's one where no
 * record reaches only some replicas); false at a bit set twice. */
static bool mark_pass(struct dfast *f)
{
    for (uint32_t r = 0; r < f->p->ntrainers; r++) {
        const struct wb_route_table *t = pl_plan_table(f->p, r, &f->tb, false);
        if (!t)
            return false;
        for (uint32_t w = 0; w < t->nwrites; w++) {
            const struct wb_rt_write *x = &t->writes[w];
            prefetch_mark(f, t, w + AHEAD);
            uint32_t c, m;
            if (!record_class(f, x, &c, &m))
                return false;
            const struct dclass *d = &f->C[c];
            uint64_t a = x->dst_off >> d->shift, z = (x->dst_off + x->len) >> d->shift;
            if (!d->some) {
                if (mark_bits(f->bits + d->at, a, z))
                    return false;
                continue;
            }
            for (uint32_t j = 0; m; j++, m >>= 1)
                if ((m & 1) && mark_bits(f->bits + d->at + j * d->words, a, z))
                    return false;
        }
    }
    return true;
}

int pl_verify_dest_fast(const struct wb_plan *p, const struct wb_plan_input *in)
{
    uint32_t gpr = 0; /* the ranks of replica 0 */
    while (gpr < p->nrollouts && p->recv[gpr].replica == 0)
        gpr++;
    if (!gpr || p->nrollouts % gpr || p->nrollouts / gpr > 32)
        return 0;
    struct dfast f = {p, gpr, p->nrollouts / gpr, (uint32_t)in->rollout->n};
    f.full = f.reps == 32 ? ~0u : (1u << f.reps) - 1;
    for (uint32_t g = 0; g < p->nrollouts; g++)
        if (p->recv[g].replica != g / gpr ||
            (g >= gpr && !same_recv(&p->recv[g % gpr], &p->recv[g])))
            return 0;
    int rc = -ENOMEM;
    uint32_t *map_of = pl_rollout_mapping_of(in);
    uint64_t nc = 0;
    for (uint32_t l = 0; l < gpr; l++)
        nc += p->recv[l].nlocal;
    f.cls = calloc((size_t)gpr * f.nt + 1, sizeof(uint32_t));
    f.C = calloc(nc + 1, sizeof(*f.C));
    f.lr = malloc(p->nrollouts * sizeof(uint32_t));
    f.rp = malloc(p->nrollouts * sizeof(uint32_t));
    if (!map_of || !f.cls || !f.C || !f.lr || !f.rp || nc >= UINT32_MAX)
        goto out;
    for (uint32_t g = 0; g < p->nrollouts; g++) {
        f.lr[g] = g % gpr;
        f.rp[g] = g / gpr;
    }
    uint64_t k = 0;
    for (uint32_t l = 0; l < gpr; l++)
        for (uint32_t li = 0; li < p->recv[l].nlocal; li++, k++) {
            const struct wb_rt_local *lo = &p->recv[l].local[li];
            if (lo->tensor >= f.nt || f.cls[(size_t)l * f.nt + lo->tensor]) {
                rc = 0; /* a tensor it cannot hold, or twice in one list */
                goto out;
            }
            f.cls[(size_t)l * f.nt + lo->tensor] = (uint32_t)k + 1;
            f.C[k].want = pl_local_written(in, map_of, &p->recv[l], lo);
            f.C[k].acc = f.C[k].want;
        }
    rc = 0;
    if (!count_pass(&f))
        goto out;
    uint64_t nbits = 0, nrec = 0;
    for (uint64_t c = 0; c < nc; c++) {
        struct dclass *d = &f.C[c];
        d->shift = d->acc ? (uint8_t)__builtin_ctzll(d->acc) : 0;
        d->words = ((d->want >> d->shift) + 63) / 64;
        d->at = nbits;
        nbits += d->words * (d->some ? f.reps : 1);
        nrec += d->count;
    }
    if (nbits > 4 * nrec + (1u << 20))
        goto out; /* bitmaps larger than the records: the exact check keeps intervals */
    f.bits = pl_zalloc(nbits + 1, sizeof(uint64_t));
    if (!f.bits) {
        rc = -ENOMEM;
        goto out;
    }
    if (!mark_pass(&f))
        goto out;
    for (uint64_t c = 0; c < nc; c++) {
        const struct dclass *d = &f.C[c];
        uint64_t n = d->want >> d->shift;
        for (uint32_t j = 0; j < (d->some ? f.reps : 1); j++) {
            const uint64_t *g = f.bits + d->at + j * d->words;
            for (uint64_t w = 0; w < n / 64; w++)
                if (g[w] != ~0ull)
                    goto out;
            if (n % 64 && g[n / 64] != (1ull << (n % 64)) - 1)
                goto out;
        }
    }
    rc = 1;
out:
    free(map_of);
    free(f.cls);
    free(f.lr);
    free(f.rp);
    free(f.C);
    free(f.bits);
    wb_plan_tbuf_free(&f.tb);
    return rc;
}
