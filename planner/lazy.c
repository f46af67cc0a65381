/* lazy.c — tables of a lazily built plan (wb_plan_opts.lazy): items stamped from a template
 * keep only a segment (struct pl_seg: where the representative's rows are and how they are
 * renumbered) in place of their ops and write records, which at 1024 GPUs are 95% of the ops
 * and two thirds of the records. wb_plan_table() expands a table when it is read; stamp.c
 * expands with the same two functions when it builds a plan in full, so both give the same
 * rows. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "planner/plan_int.h"

/* The new value of `old` in sorted (old, new) pairs. */
static uint32_t pair_find(const uint32_t *pair, uint32_t n, uint32_t old)
{
    uint32_t lo = 0, hi = n;
    while (lo < hi) {
        uint32_t mid = (lo + hi) / 2;
        if (pair[2 * mid] < old)
            lo = mid + 1;
        else
            hi = mid;
    }
    return pair[2 * lo + 1];
}

struct maps {
    const uint32_t *tm, *bx, *sh;
    uint32_t ntm, nbx, nsh;
    bool same;
    uint32_t last_from, last_to; /* ops of a task mostly concern one tensor */
};

static struct maps maps_of(const struct pl_seg *sg, const uint32_t *pool)
{
    const uint32_t *tm = pool + sg->map0;
    return (struct maps){tm,       tm + 2 * sg->ntm, tm + 2 * sg->ntm + 2 * sg->nbx,
                         sg->ntm,  sg->nbx,          sg->nsh,
                         sg->same, UINT32_MAX,       0};
}

static uint32_t tmap(struct maps *m, uint32_t t)
{
    if (t != m->last_from) {
        m->last_from = t;
        m->last_to = pair_find(m->tm, m->ntm, t);
    }
    return m->last_to;
}

static uint32_t box_of(const struct maps *m, uint32_t b)
{
    return m->same ? b : pair_find(m->bx, m->nbx, b);
}

void pl_seg_apeers(const struct pl_seg *sg, const uint32_t *pool, const struct wb_rt_amax_peer *src,
                   uint32_t n, struct wb_rt_amax_peer *out)
{
    const uint32_t *dp = pool + sg->dpos0;
    uint32_t last = UINT32_MAX;
    uint64_t shift = 0;
    for (uint32_t k = 0; k < n; k++) {
        struct wb_rt_amax_peer pe = src[k];
        if (pe.rank != last) { /* the peer's inbox moved as its own segment's did */
            last = pe.rank;
            shift = 0;
            for (uint32_t i = 0; i < sg->ndpos; i++)
                if (dp[3 * i] == pe.rank) {
                    shift = dp[3 * i + 1] | (uint64_t)dp[3 * i + 2] << 32;
                    break;
                }
        }
        pe.peer_inbox_off += shift;
        pe.inbox_off += sg->inbox_shift;
        pe.rank = (uint32_t)((int64_t)pe.rank + sg->dr);
        pe.tag += sg->tag_shift;
        out[k] = pe;
    }
}

void pl_seg_amax(const struct pl_seg *sg, const struct wb_rt_expect *src, uint32_t n,
                 struct wb_rt_expect *out)
{
    for (uint32_t k = 0; k < n; k++) {
        out[k] = src[k];
        out[k].tag += sg->tag_shift;
    }
}

uint32_t pl_seg_box(const struct pl_seg *sg, const uint32_t *pool, uint32_t b)
{
    struct maps m = maps_of(sg, pool);
    return box_of(&m, b);
}

static void view_map(struct wb_rt_view *v, struct maps *m)
{
    if (v->kind == WB_BUF_PARAM)
        v->tensor = tmap(m, v->tensor);
    if (!m->same)
        v->shape = pair_find(m->sh, m->nsh, v->shape);
}

void pl_seg_ops(const struct pl_seg *sg, const uint32_t *pool, const struct wb_rt_op *src,
                uint32_t n, struct wb_rt_op *out)
{
    struct maps m = maps_of(sg, pool);
    for (uint32_t k = 0; k < n; k++) {
        struct wb_rt_op op = src[k];
        op.tensor = tmap(&m, op.tensor);
        switch (op.kind) {
        case WB_OP_H2D:
            break;
        case WB_OP_GATHER:
            view_map(&op.gather.src, &m);
            view_map(&op.gather.dst, &m);
            op.gather.peer0 += sg->pshift;
            op.gather.mesh = sg->mesh;
            op.gather.seq += sg->seq_shift;
            break;
        case WB_OP_AMAX:
            op.amax.peer0 += sg->xshift;
            view_map(&op.amax.src, &m);
            op.amax.src_box = box_of(&m, op.amax.src_box);
            op.amax.region = box_of(&m, op.amax.region);
            op.amax.blocks = box_of(&m, op.amax.blocks);
            op.amax.grid = box_of(&m, op.amax.grid);
            break;
        case WB_OP_COPY:
        case WB_OP_CAST:
            view_map(&op.copy.src, &m);
            view_map(&op.copy.dst, &m);
            op.copy.src_box = box_of(&m, op.copy.src_box);
            op.copy.dst_box = box_of(&m, op.copy.dst_box);
            break;
        case WB_OP_PERMUTE:
            view_map(&op.permute.src, &m);
            view_map(&op.permute.dst, &m);
            op.permute.src_box = box_of(&m, op.permute.src_box);
            op.permute.dst_box = box_of(&m, op.permute.dst_box);
            break;
        case WB_OP_QUANT:
            view_map(&op.quant.src, &m);
            view_map(&op.quant.dst, &m);
            op.quant.src_box = box_of(&m, op.quant.src_box);
            op.quant.region = box_of(&m, op.quant.region);
            op.quant.grid = box_of(&m, op.quant.grid);
            break;
        }
        out[k] = op;
    }
}

void pl_seg_writes(const struct pl_seg *sg, const uint32_t *pool, const struct wb_rt_write *src,
                   uint32_t n, struct wb_rt_write *out)
{
    struct maps m = maps_of(sg, pool);
    for (uint32_t k = 0; k < n; k++) {
        struct wb_rt_write w = src[k];
        if (w.src_tensor != (uint32_t)WB_RT_TMP_SRC)
            w.src_tensor = tmap(&m, w.src_tensor);
        w.dst_rank = (uint32_t)((int64_t)w.dst_rank + sg->dl);
        w.dst_tensor = w.dst_tensor == sg->vx ? sg->vy : sg->sy;
        w.tag = w.dst_tensor + 1;
        out[k] = w;
    }
}

void pl_task_rows(const struct wb_plan *p, uint32_t r, uint32_t k, struct pl_cursor *cu,
                  struct pl_rows *out)
{
    const struct wb_route_table *t = &pl_tables(p)[r];
    const struct wb_rt_task *T = &t->tasks[k];
    const struct pl_lazy_table *lz = pl_lazy_of(p) ? &pl_lazy_of(p)->t[r] : NULL;
    while (lz && cu->seg < lz->nseg && lz->seg[cu->seg].at_task + lz->seg[cu->seg].ntask <= k) {
        const struct pl_seg *sg = &lz->seg[cu->seg++];
        cu->vops += sg->op1 - sg->op0;
        cu->vwrites += sg->w1 - sg->w0;
        cu->vapeers += sg->x1 - sg->x0;
    }
    const struct pl_seg *sg = lz && cu->seg < lz->nseg ? &lz->seg[cu->seg] : NULL;
    if (sg && sg->at_task <= k) {
        const struct wb_route_table *src = &pl_tables(p)[sg->src];
        const struct wb_rt_task *X = &src->tasks[sg->task0 + (k - sg->at_task)];
        const struct wb_rt_task *X0 = &src->tasks[sg->task0];
        *out = (struct pl_rows){src, src->ops + sg->op0 + (X->op0 - X0->op0),
                                src->writes + sg->w0 + (X->write0 - X0->write0), sg, sg->xsrc};
        return;
    }
    *out = (struct pl_rows){t, t->ops + (T->op0 - cu->vops), t->writes + (T->write0 - cu->vwrites),
                            NULL, cu->vapeers};
}

uint32_t pl_table_nops(const struct wb_plan *p, uint32_t r)
{
    return pl_lazy_of(p) ? pl_lazy_of(p)->t[r].nops : pl_tables(p)[r].nops;
}

uint32_t pl_table_napeers(const struct wb_plan *p, uint32_t r)
{
    return pl_lazy_of(p) ? pl_lazy_of(p)->t[r].napeers : pl_tables(p)[r].namax_peers;
}

static int room(void **a, size_t *cap, size_t n, size_t elem)
{
    if (n <= *cap)
        return 0;
    void *x = realloc(*a, n * elem);
    if (!x)
        return -ENOMEM;
    *a = x;
    *cap = n;
    return 0;
}

const struct wb_route_table *pl_plan_table(const struct wb_plan *p, uint32_t r,
                                           struct wb_plan_tbuf *buf, bool ops)
{
    const struct wb_route_table *t = &pl_tables(p)[r];
    if (!pl_lazy_of(p))
        return t;
    const struct pl_lazy_table *lz = &pl_lazy_of(p)->t[r];
    if ((ops &&
         (room((void **)&buf->ops, &buf->cops, lz->nops + 1, sizeof(struct wb_rt_op)) ||
          room((void **)&buf->amax, &buf->camax, lz->namax + 1, sizeof(struct wb_rt_expect)) ||
          room((void **)&buf->apeers, &buf->capeers, lz->napeers + 1,
               sizeof(struct wb_rt_amax_peer)))) ||
        room((void **)&buf->writes, &buf->cwrites, lz->nwrites + 1, sizeof(struct wb_rt_write)))
        return NULL;
        /* rows [from, to) of a table's own array (NULL when it has none) after n rows of dst */
#define OWN(dst, n, src, from, to)                                                                 \
    do {                                                                                           \
        if ((to) > (from))                                                                         \
            memcpy((dst) + (n), (src) + (from), ((to) - (from)) * sizeof(*(dst)));                 \
        (n) += (to) - (from);                                                                      \
        (from) = (to);                                                                             \
    } while (0)
    uint32_t lo = 0, lw = 0, la = 0, lx = 0, no = 0, nw = 0, na = 0, nx = 0;
    for (uint32_t k = 0; k < lz->nseg; k++) {
        const struct pl_seg *sg = &lz->seg[k];
        const struct wb_route_table *src = &pl_tables(p)[sg->src];
        if (ops) {
            OWN(buf->ops, no, t->ops, lo, sg->at_op);
            if (sg->op1 > sg->op0)
                pl_seg_ops(sg, lz->pool, src->ops + sg->op0, sg->op1 - sg->op0, buf->ops + no);
            no += sg->op1 - sg->op0;
            OWN(buf->amax, na, t->amax, la, sg->at_a);
            if (sg->a1 > sg->a0)
                pl_seg_amax(sg, src->amax + sg->a0, sg->a1 - sg->a0, buf->amax + na);
            na += sg->a1 - sg->a0;
            OWN(buf->apeers, nx, t->amax_peers, lx, sg->at_x);
            if (sg->x1 > sg->x0)
                pl_seg_apeers(sg, lz->pool, src->amax_peers + sg->x0, sg->x1 - sg->x0,
                              buf->apeers + nx);
            nx += sg->x1 - sg->x0;
        }
        OWN(buf->writes, nw, t->writes, lw, sg->at_w);
        if (sg->w1 > sg->w0)
            pl_seg_writes(sg, lz->pool, src->writes + sg->w0, sg->w1 - sg->w0, buf->writes + nw);
        nw += sg->w1 - sg->w0;
    }
    if (ops) {
        OWN(buf->ops, no, t->ops, lo, t->nops);
        OWN(buf->amax, na, t->amax, la, t->namax);
        OWN(buf->apeers, nx, t->amax_peers, lx, t->namax_peers);
    }
    OWN(buf->writes, nw, t->writes, lw, t->nwrites);
#undef OWN
    buf->t = *t;
    buf->t.ops = ops ? buf->ops : NULL;
    buf->t.nops = ops ? no : 0;
    buf->t.writes = buf->writes;
    buf->t.nwrites = nw;
    buf->t.amax = ops ? buf->amax : NULL;
    buf->t.namax = ops ? na : 0;
    buf->t.amax_peers = ops ? buf->apeers : NULL;
    buf->t.namax_peers = ops ? nx : 0;
    return &buf->t;
}

const struct wb_route_table *wb_plan_table(const struct wb_plan *p, uint32_t r,
                                           struct wb_plan_tbuf *buf)
{
    return pl_plan_table(p, r, buf, true);
}

void wb_plan_tbuf_free(struct wb_plan_tbuf *buf)
{
    free(buf->ops);
    free(buf->writes);
    free(buf->amax);
    free(buf->apeers);
    memset(buf, 0, sizeof(*buf));
}

void pl_lazy_free(struct pl_lazy *lz, uint32_t ntables)
{
    if (!lz)
        return;
    for (uint32_t r = 0; lz->t && r < ntables; r++) {
        free(lz->t[r].seg);
        free(lz->t[r].pool);
    }
    free(lz->t);
    free(lz);
}
