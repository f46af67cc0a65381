/* planner_sim.h — executes a plan's routing tables on the CPU with real values and checks
 * every rollout byte against an independently computed reference (header-only, for tests).
 *
 * Trainer tensor t holds BF16 values f(t, i) (small multiples of 1/16, exact in BF16), or, for
 * another dtype (an FP8 checkpoint's values and scales: copied, never converted), bytes of a
 * pattern of (t, byte index). Each
 * rank's PARAM shard is cut from the full tensor by the layout's owners. Ops run per rank in
 * table order: H2D/COPY/CAST/QUANT on the task's TMP (filled with a poison pattern first),
 * GATHER from the peers' boxes only (the rest stays poisoned), AMAX from the mirror op found by
 * tag in the peer's table. Writes land in rollout buffers allocated from the receive lists and
 * count how often each byte is written. The reference: each component's values converted
 * (FP8 per 128x128 block of the component, as DeepGEMM's per_block_cast_to_fp8), placed at
 * its dst box, and sliced per rollout rank by wb_mapping_local. */
#ifndef WB_PLANNER_SIM_H
#define WB_PLANNER_SIM_H

#include <math.h>

#define BOX(i)  wb_rt_box(tb, (i))
#define PBOX(i) wb_rt_box(pt, (i))

#include "tests/unit/planner_fx.h"

static inline float sim_bf16_to_f(uint16_t b)
{
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t sim_f_to_bf16(float f) /* exact inputs only */
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)(u >> 16);
}

/* e4m3fn: round to nearest, ties to even code; |v| <= 448 here. */
static inline uint8_t sim_f_to_e4m3(float v)
{
    static float tab[127];
    static int init;
    if (!init) {
        for (int c = 0; c < 127; c++) {
            int e = c >> 3, m = c & 7;
            tab[c] = e ? ldexpf(1.0f + m / 8.0f, e - 7) : ldexpf(m / 8.0f, -6);
        }
        init = 1;
    }
    uint8_t sign = signbit(v) ? 0x80 : 0;
    float a = fabsf(v);
    int lo = 0, hi = 126;
    while (hi - lo > 1) {
        int mid = (lo + hi) / 2;
        if (tab[mid] <= a)
            lo = mid;
        else
            hi = mid;
    }
    int c;
    if (a <= tab[lo])
        c = lo;
    else if (a >= tab[hi])
        c = hi;
    else {
        float dl = a - tab[lo], dh = tab[hi] - a;
        c = dl < dh ? lo : dh < dl ? hi : ((lo & 1) ? hi : lo);
    }
    return (uint8_t)(sign | c);
}

static inline uint16_t sim_value(uint32_t t, uint64_t i)
{
    int v = (int)((i * 7 + t * 13 + (i / 5) * 3) % 97) - 48;
    return sim_f_to_bf16((float)v / 16.0f);
}

/* Byte offset of element coordinates c in a row-major shape. */
static inline uint64_t sim_lin(const struct wb_shape *s, const uint64_t *c)
{
    uint64_t o = 0;
    for (uint32_t d = 0; d < s->ndim; d++)
        o = o * s->dim[d] + c[d];
    return o;
}

/* Iterates the coordinates of a box: returns false when done. */
static inline bool sim_next(const struct wb_box *b, uint64_t *c)
{
    for (uint32_t d = b->ndim; d-- > 0;) {
        if (++c[d] < b->off[d] + b->ext[d])
            return true;
        c[d] = b->off[d];
    }
    return false;
}

static inline void sim_start(const struct wb_box *b, uint64_t *c)
{
    for (uint32_t d = 0; d < b->ndim; d++)
        c[d] = b->off[d];
}

/* Copies box sb of (src, sshape) to box db of (dst, dshape), converting dtypes. */
static inline void sim_boxcopy(const uint8_t *src, const struct wb_shape *ss, enum wb_dtype sdt,
                               const struct wb_box *sb, uint8_t *dst, const struct wb_shape *ds,
                               enum wb_dtype ddt, const struct wb_box *db)
{
    uint64_t cs[WB_MAX_DIMS], cd[WB_MAX_DIMS];
    size_t se = wb_dtype_size(sdt), de = wb_dtype_size(ddt);
    if (wb_box_numel(sb) == 0)
        return;
    sim_start(sb, cs);
    sim_start(db, cd);
    do {
        const uint8_t *s = src + sim_lin(ss, cs) * se;
        uint8_t *d = dst + sim_lin(ds, cd) * de;
        if (sdt == ddt) {
            memcpy(d, s, se);
        } else {
            CHECK(sdt == WB_DTYPE_BF16 && ddt == WB_DTYPE_FP32);
            uint16_t b;
            memcpy(&b, s, 2);
            float f = sim_bf16_to_f(b);
            memcpy(d, &f, 4);
        }
        sim_next(db, cd);
    } while (sim_next(sb, cs));
}

struct sim_rank {
    uint8_t **shard; /* per trainer tensor: the rank's PARAM data or NULL */
    struct wb_box *box;
};

struct sim {
    struct fx *f;
    const struct wb_plan *p;
    uint8_t **full; /* per trainer tensor */
    struct sim_rank *rk;
    uint8_t ***dst; /* [rollout rank][rollout tensor] local buffers */
    uint8_t ***cnt; /* write counts per byte */
    uint8_t **tmp;  /* per rank, the current task's TMP */
};

static inline void sim_setup(struct sim *s, struct fx *f, const struct wb_plan *p)
{
    memset(s, 0, sizeof(*s));
    s->f = f;
    s->p = p;
    size_t nt = f->in.trainer->n, nrt = f->in.rollout->n;
    s->full = calloc(nt, sizeof(uint8_t *));
    for (size_t t = 0; t < nt; t++) {
        uint64_t n = wb_shape_numel(&f->in.trainer->p[t].shape);
        size_t es = wb_dtype_size(f->in.trainer->p[t].dtype);
        s->full[t] = malloc(n * es + 1);
        for (uint64_t i = 0; i < n; i++) {
            uint16_t v = sim_value((uint32_t)t, i);
            if (f->in.trainer->p[t].dtype == WB_DTYPE_BF16)
                memcpy(s->full[t] + 2 * i, &v, 2);
            else
                for (size_t b = 0; b < es; b++)
                    s->full[t][i * es + b] = (uint8_t)(v >> (b % 2 * 8)) ^ (uint8_t)(b * 31 + t);
        }
    }
    s->rk = calloc(p->ntrainers, sizeof(*s->rk));
    for (uint32_t r = 0; r < p->ntrainers; r++) {
        s->rk[r].shard = calloc(nt, sizeof(uint8_t *));
        s->rk[r].box = calloc(nt, sizeof(struct wb_box));
    }
    for (size_t t = 0; t < nt; t++) {
        struct wb_owner *o;
        uint32_t n;
        struct wb_errlist el;
        wb_errlist_init(&el);
        if (wb_trainer_owners(f->in.tl, f->in.trainer, (uint32_t)t, &o, &n, &el)) {
            wb_errlist_free(&el);
            continue;
        }
        wb_errlist_free(&el);
        const struct wb_shape *sh = &f->in.trainer->p[t].shape;
        for (uint32_t k = 0; k < n; k++) {
            struct wb_shape bs = wb_box_shape(&o[k].box);
            enum wb_dtype dt = f->in.trainer->p[t].dtype;
            uint8_t *b = malloc(wb_box_numel(&o[k].box) * wb_dtype_size(dt) + 1);
            struct wb_box fb = wb_box_full(&bs);
            sim_boxcopy(s->full[t], sh, dt, &o[k].box, b, &bs, dt, &fb);
            s->rk[o[k].rank].shard[t] = b;
            s->rk[o[k].rank].box[t] = o[k].box;
        }
        free(o);
    }
    s->dst = calloc(p->nrollouts, sizeof(uint8_t **));
    s->cnt = calloc(p->nrollouts, sizeof(uint8_t **));
    for (uint32_t g = 0; g < p->nrollouts; g++) {
        s->dst[g] = calloc(nrt, sizeof(uint8_t *));
        s->cnt[g] = calloc(nrt, sizeof(uint8_t *));
        const struct wb_recv_list *rv = &p->recv[g];
        for (uint32_t i = 0; i < rv->nlocal; i++) {
            uint32_t t = rv->local[i].tensor;
            s->dst[g][t] = malloc(rv->local[i].bytes + 1);
            memset(s->dst[g][t], 0xEE, rv->local[i].bytes);
            s->cnt[g][t] = calloc(rv->local[i].bytes + 1, 1);
        }
    }
    s->tmp = calloc(p->ntrainers, sizeof(uint8_t *));
}

static inline void sim_free(struct sim *s)
{
    for (size_t t = 0; t < s->f->in.trainer->n; t++)
        free(s->full[t]);
    free(s->full);
    for (uint32_t r = 0; r < s->p->ntrainers; r++) {
        for (size_t t = 0; t < s->f->in.trainer->n; t++)
            free(s->rk[r].shard[t]);
        free(s->rk[r].shard);
        free(s->rk[r].box);
        free(s->tmp[r]);
    }
    free(s->rk);
    for (uint32_t g = 0; g < s->p->nrollouts; g++) {
        for (size_t t = 0; t < s->f->in.rollout->n; t++) {
            free(s->dst[g][t]);
            free(s->cnt[g][t]);
        }
        free(s->dst[g]);
        free(s->cnt[g]);
    }
    free(s->dst);
    free(s->cnt);
    free(s->tmp);
}

static inline uint8_t *sim_view(struct sim *s, uint32_t r, const struct wb_rt_view *v)
{
    if (v->kind == WB_BUF_PARAM) {
        CHECK(s->rk[r].shard[v->tensor] != NULL);
        return s->rk[r].shard[v->tensor] + v->off;
    }
    return s->tmp[r] + v->off;
}

/* Partial amax over region (tensor coords; data at src_box of a buffer of shape vshape) per
 * block of `blocks`. */
static inline void sim_partial(const uint8_t *base, const struct wb_shape *vshape,
                               const struct wb_box *src_box, const struct wb_box *region,
                               const struct wb_box *blocks, float *out)
{
    uint64_t nb = wb_box_numel(blocks);
    for (uint64_t i = 0; i < nb; i++)
        out[i] = 0;
    if (wb_box_numel(region) == 0)
        return;
    uint64_t c[WB_MAX_DIMS], cs[WB_MAX_DIMS];
    sim_start(region, c);
    sim_start(src_box, cs);
    struct wb_shape bs = wb_box_shape(blocks);
    do {
        uint16_t b;
        memcpy(&b, base + sim_lin(vshape, cs) * 2, 2);
        uint64_t bc[WB_MAX_DIMS];
        bool in = true;
        for (uint32_t d = 0; d < region->ndim; d++) {
            uint64_t q = (d + 2 >= region->ndim) ? 128 : 1;
            uint64_t blk = c[d] / q;
            in &= blk >= blocks->off[d] && blk < blocks->off[d] + blocks->ext[d];
            bc[d] = blk - blocks->off[d];
        }
        if (in) {
            float a = fabsf(sim_bf16_to_f(b));
            uint64_t k = sim_lin(&bs, bc);
            if (a > out[k])
                out[k] = a;
        }
        sim_next(src_box, cs);
    } while (sim_next(region, c));
}

/* The component that uses trainer tensor t transposed, or NULL. */
static inline const struct wb_component *sim_permuted_use(const struct sim *s, uint32_t t)
{
    const struct wb_match *mt = s->f->in.match;
    for (size_t m = 0; m < mt->n; m++)
        for (uint32_t k = 0; k < mt->map[m].ncomp; k++)
            if (mt->map[m].comp[k].trainer == t && mt->map[m].comp[k].permuted)
                return &mt->map[m].comp[k];
    return NULL;
}

/* The op on rank `peer` whose exchange with tag `tag` mirrors one of ours, and that
 * exchange's entry. */
static inline const struct wb_rt_op *sim_mirror(const struct wb_plan *p, uint32_t peer,
                                                uint32_t tag, const struct wb_rt_amax_peer **pe)
{
    const struct wb_route_table *t = &pl_tables(p)[peer];
    for (uint32_t i = 0; i < t->nops; i++)
        for (uint32_t k = 0; t->ops[i].kind == WB_OP_AMAX && k < t->ops[i].amax.npeers; k++)
            if (t->amax_peers[t->ops[i].amax.peer0 + k].tag == tag) {
                *pe = &t->amax_peers[t->ops[i].amax.peer0 + k];
                return &t->ops[i];
            }
    return NULL;
}

/* One exchange of an AMAX op on rank r: the peer's partial over its mirror op's region,
 * merged into r's amax grid. */
static inline void sim_amax(struct sim *s, uint32_t r, const struct wb_rt_op *op,
                            const struct wb_rt_amax_peer *pe)
{
    const struct wb_route_table *tb = &pl_tables(s->p)[r];
    const struct wb_rt_amax_peer *back = NULL;
    const struct wb_rt_op *m = sim_mirror(s->p, pe->rank, pe->tag, &back);
    const struct wb_route_table *pt = &pl_tables(s->p)[pe->rank];
    CHECK(m != NULL);
    CHECK(back->rank == r);
    CHECK(back->inbox_off == pe->peer_inbox_off && back->peer_inbox_off == pe->inbox_off);
    CHECK(wb_box_eq(PBOX(m->amax.blocks), BOX(op->amax.blocks)));
    uint64_t nb = wb_box_numel(BOX(op->amax.blocks));
    float *pa = calloc(nb + 1, sizeof(float));
    /* the peer's partial, computed from the peer's own shard (its PARAM data; an H2D copy
     * holds the same rows); for a tensor used transposed, whose regions are in the permuted
     * tensor's coordinates, from the whole tensor transposed here (the region lies in the
     * peer's shard: its exchange says so) */
    const struct wb_component *pc = sim_permuted_use(s, op->tensor);
    if (pc) {
        const struct wb_shape *ts = &s->f->in.trainer->p[op->tensor].shape;
        struct wb_shape pts = {.ndim = ts->ndim};
        for (uint32_t d = 0; d < ts->ndim; d++)
            pts.dim[d] = ts->dim[pc->perm[d]];
        uint8_t *pf = malloc(wb_shape_numel(ts) * 2 + 1);
        struct wb_box pb = wb_box_full(&pts);
        uint64_t i[WB_MAX_DIMS], j[WB_MAX_DIMS];
        sim_start(&pb, i);
        do {
            for (uint32_t d = 0; d < pts.ndim; d++)
                j[pc->perm[d]] = i[d];
            memcpy(pf + sim_lin(&pts, i) * 2, s->full[op->tensor] + sim_lin(ts, j) * 2, 2);
        } while (sim_next(&pb, i));
        sim_partial(pf, &pts, PBOX(m->amax.region), PBOX(m->amax.region), PBOX(m->amax.blocks), pa);
        free(pf);
    } else {
        const struct wb_box *pb = &s->rk[pe->rank].box[op->tensor];
        struct wb_shape ps = wb_box_shape(pb);
        struct wb_box sb = *PBOX(m->amax.region);
        for (uint32_t d = 0; d < sb.ndim; d++)
            sb.off[d] -= pb->off[d];
        CHECK(s->rk[pe->rank].shard[op->tensor] != NULL);
        sim_partial(s->rk[pe->rank].shard[op->tensor], &ps, &sb, PBOX(m->amax.region),
                    PBOX(m->amax.blocks), pa);
    }
    if (op->amax.amax_off != (uint64_t)WB_RT_NONE) {
        float *g = (float *)(s->tmp[r] + op->amax.amax_off);
        struct wb_shape gs = wb_box_shape(BOX(op->amax.grid));
        uint64_t c[WB_MAX_DIMS];
        sim_start(BOX(op->amax.blocks), c);
        uint64_t i = 0;
        do {
            bool in = true;
            uint64_t gc[WB_MAX_DIMS];
            for (uint32_t d = 0; d < gs.ndim; d++) {
                in &= c[d] >= BOX(op->amax.grid)->off[d] &&
                      c[d] < BOX(op->amax.grid)->off[d] + BOX(op->amax.grid)->ext[d];
                gc[d] = c[d] - BOX(op->amax.grid)->off[d];
            }
            if (in) {
                float *x = &g[sim_lin(&gs, gc)];
                if (pa[i] > *x)
                    *x = pa[i];
            }
            i++;
        } while (sim_next(BOX(op->amax.blocks), c));
    }
    free(pa);
}

static inline void sim_op(struct sim *s, uint32_t r, const struct wb_rt_op *op)
{
    const struct wb_route_table *tb = &pl_tables(s->p)[r];
    switch (op->kind) {
    case WB_OP_H2D:
        CHECK(s->rk[r].shard[op->tensor] != NULL);
        memcpy(s->tmp[r] + op->h2d.dst_off, s->rk[r].shard[op->tensor] + op->h2d.src_off,
               op->h2d.bytes);
        break;
    case WB_OP_GATHER: {
        uint8_t *d = sim_view(s, r, &op->gather.dst);
        const struct wb_shape *sh = wb_rt_shape(tb, op->gather.dst.shape);
        for (uint32_t k = 0; k < op->gather.npeers; k++) {
            const struct wb_rt_peer *pe = &tb->peers[op->gather.peer0 + k];
            if (wb_box_numel(BOX(pe->box)) == 0)
                continue;
            /* the peer must hold that box */
            CHECK(s->rk[pe->rank].shard[op->tensor] != NULL);
            CHECK(wb_box_eq(&s->rk[pe->rank].box[op->tensor], BOX(pe->box)));
            struct wb_shape ps = wb_box_shape(BOX(pe->box));
            struct wb_box pf = wb_box_full(&ps);
            sim_boxcopy(s->rk[pe->rank].shard[op->tensor], &ps, op->gather.dst.dtype, &pf, d, sh,
                        op->gather.dst.dtype, BOX(pe->box));
        }
        break;
    }
    case WB_OP_COPY:
    case WB_OP_CAST:
        sim_boxcopy(sim_view(s, r, &op->copy.src), wb_rt_shape(tb, op->copy.src.shape),
                    op->copy.src.dtype, BOX(op->copy.src_box), sim_view(s, r, &op->copy.dst),
                    wb_rt_shape(tb, op->copy.dst.shape), op->copy.dst.dtype, BOX(op->copy.dst_box));
        break;
    case WB_OP_PERMUTE: { /* element by element: dst (i) = src (j), j[perm k] = i[k] */
        const struct wb_rt_permute *pm = &op->permute;
        const struct wb_box *sb = BOX(pm->src_box), *db = BOX(pm->dst_box);
        const uint8_t *sv = sim_view(s, r, &pm->src);
        uint8_t *dv = sim_view(s, r, &pm->dst);
        size_t el = wb_dtype_size(pm->src.dtype);
        CHECK_INT(pm->src.dtype, pm->dst.dtype);
        CHECK_INT(sb->ndim, db->ndim);
        if (wb_box_numel(db) == 0)
            break;
        uint64_t i[WB_MAX_DIMS], j[WB_MAX_DIMS];
        sim_start(db, i);
        do {
            for (uint32_t k = 0; k < db->ndim; k++) {
                uint32_t q = wb_rt_perm_dim(pm->perm, k);
                j[q] = i[k] - db->off[k] + sb->off[q];
            }
            memcpy(dv + sim_lin(wb_rt_shape(tb, pm->dst.shape), i) * el,
                   sv + sim_lin(wb_rt_shape(tb, pm->src.shape), j) * el, el);
        } while (sim_next(db, i));
        break;
    }
    case WB_OP_AMAX:
        for (uint32_t k = 0; k < op->amax.npeers; k++)
            sim_amax(s, r, op, &tb->amax_peers[op->amax.peer0 + k]);
        break;
    case WB_OP_QUANT: {
        const struct wb_rt_quant *q = &op->quant;
        uint64_t nb = wb_box_numel(BOX(q->grid));
        float *am = calloc(nb + 1, sizeof(float));
        sim_partial(sim_view(s, r, &q->src), wb_rt_shape(tb, q->src.shape), BOX(q->src_box),
                    BOX(q->region), BOX(q->grid), am);
        if (q->amax_off != (uint64_t)WB_RT_NONE)
            for (uint64_t i = 0; i < nb; i++) {
                float e = ((float *)(s->tmp[r] + q->amax_off))[i];
                if (e > am[i])
                    am[i] = e;
            }
        for (uint64_t i = 0; i < nb; i++) {
            if (am[i] < 1e-4f)
                am[i] = 1e-4f;
            float sc = am[i] / 448.0f;
            memcpy(s->tmp[r] + q->scale_off + 4 * i, &sc, 4);
        }
        const uint8_t *base = sim_view(s, r, &q->src);
        uint8_t *out = sim_view(s, r, &q->dst);
        struct wb_shape gs = wb_box_shape(BOX(q->grid));
        uint64_t c[WB_MAX_DIMS], cs[WB_MAX_DIMS];
        sim_start(BOX(q->region), c);
        sim_start(BOX(q->src_box), cs);
        uint64_t i = 0;
        do {
            uint16_t b;
            memcpy(&b, base + sim_lin(wb_rt_shape(tb, q->src.shape), cs) * 2, 2);
            uint64_t gc[WB_MAX_DIMS];
            for (uint32_t d = 0; d < BOX(q->region)->ndim; d++)
                gc[d] = c[d] / ((d + 2 >= BOX(q->region)->ndim) ? 128 : 1) - BOX(q->grid)->off[d];
            float a = am[sim_lin(&gs, gc)];
            out[i++] = sim_f_to_e4m3(sim_bf16_to_f(b) * (448.0f / a));
            sim_next(BOX(q->src_box), cs);
        } while (sim_next(BOX(q->region), c));
        free(am);
        break;
    }
    }
}

/* Runs every table, phase by phase (AMAX mirrors read the peer's data directly). */
static inline void sim_run(struct sim *s)
{
    const struct wb_plan *p = s->p;
    for (uint32_t ph = 0; ph < p->nphases; ph++)
        for (uint32_t r = 0; r < p->ntrainers; r++) {
            const struct wb_route_table *t = &pl_tables(p)[r], *tb = t;
            const struct wb_rt_phase *P = &t->phases[ph];
            for (uint32_t k = P->task0; k < P->task0 + P->ntasks; k++) {
                const struct wb_rt_task *T = &t->tasks[k];
                CHECK_INT(T->phase, ph);
                free(s->tmp[r]);
                s->tmp[r] = malloc(T->tmp_bytes + 1);
                memset(s->tmp[r], 0xCD, T->tmp_bytes);
                for (uint32_t o = T->op0; o < T->op0 + T->nops; o++) {
                    const struct wb_rt_op *op = &t->ops[o];
                    if (op->kind == WB_OP_AMAX && op->amax.amax_off != (uint64_t)WB_RT_NONE)
                        memset(s->tmp[r] + op->amax.amax_off, 0,
                               wb_box_numel(BOX(op->amax.grid)) * 4);
                }
                for (uint32_t o = T->op0; o < T->op0 + T->nops; o++)
                    sim_op(s, r, &t->ops[o]);
                for (uint32_t w = T->write0; w < T->write0 + T->nwrites; w++) {
                    const struct wb_rt_write *x = &t->writes[w];
                    const uint8_t *src = x->src_tensor == (uint32_t)WB_RT_TMP_SRC
                                             ? s->tmp[r] + x->src_off
                                             : s->rk[r].shard[x->src_tensor] + x->src_off;
                    CHECK(x->src_tensor == (uint32_t)WB_RT_TMP_SRC ||
                          t->residence == WB_RESIDE_GPU);
                    CHECK(x->src_tensor == (uint32_t)WB_RT_TMP_SRC ||
                          x->src_off + x->len <= wb_box_numel(&s->rk[r].box[x->src_tensor]) * 2);
                    CHECK(x->src_tensor != (uint32_t)WB_RT_TMP_SRC ||
                          x->src_off + x->len <= T->tmp_bytes);
                    CHECK_INT(x->tag, x->dst_tensor + 1);
                    for (uint32_t k = 0; k < wb_rt_copies(x); k++) { /* replica fan-out */
                        uint32_t g = wb_rt_copy_rank(x, k);
                        uint8_t *d = s->dst[g][x->dst_tensor];
                        CHECK(d != NULL);
                        memcpy(d + x->dst_off, src, x->len);
                        for (uint64_t b = 0; b < x->len; b++)
                            s->cnt[g][x->dst_tensor][x->dst_off + b]++;
                    }
                }
            }
        }
}

/* The reference rollout tensors (global), then each rank's local slices compared. */
static inline void sim_check(struct sim *s)
{
    struct fx *f = s->f;
    const struct wb_plan *p = s->p;
    size_t nrt = f->in.rollout->n;
    uint8_t **ref = calloc(nrt, sizeof(uint8_t *));
    for (size_t t = 0; t < nrt; t++) {
        uint64_t n =
            wb_shape_numel(&f->in.rollout->p[t].shape) * wb_dtype_size(f->in.rollout->p[t].dtype);
        ref[t] = calloc(n + 1, 1);
    }
    for (size_t m = 0; m < f->in.match->n; m++) {
        const struct wb_mapping *mp = &f->in.match->map[m];
        const struct wb_shape *rs = &f->in.rollout->p[mp->rollout].shape;
        for (uint32_t k = 0; k < mp->ncomp; k++) {
            const struct wb_component *c = &mp->comp[k];
            const struct wb_shape *ts = &f->in.trainer->p[c->trainer].shape;
            const uint8_t *full = s->full[c->trainer];
            /* a transposed component: the reference transposes the whole trainer tensor
             * (element by element) and goes on as for a rename of the transposed tensor */
            struct wb_component pc;
            struct wb_shape pts;
            uint8_t *pfull = NULL;
            if (c->permuted) {
                size_t el = wb_dtype_size(f->in.trainer->p[c->trainer].dtype);
                pts.ndim = ts->ndim;
                for (uint32_t d = 0; d < ts->ndim; d++)
                    pts.dim[d] = ts->dim[c->perm[d]];
                pfull = malloc(wb_shape_numel(ts) * el + 1);
                struct wb_box pb = wb_box_full(&pts);
                uint64_t i[WB_MAX_DIMS], j[WB_MAX_DIMS];
                sim_start(&pb, i);
                do {
                    for (uint32_t d = 0; d < pts.ndim; d++)
                        j[c->perm[d]] = i[d];
                    memcpy(pfull + sim_lin(&pts, i) * el, full + sim_lin(ts, j) * el, el);
                } while (sim_next(&pb, i));
                pc = *c;
                pc.src = pb;
                c = &pc;
                ts = &pts;
                full = pfull;
            }
            if (mp->xform != WB_XFORM_FP8_BLOCK) {
                sim_boxcopy(full, ts, f->in.trainer->p[c->trainer].dtype, &c->src, ref[mp->rollout],
                            rs, mp->dst_dtype, &c->dst);
                free(pfull);
                continue;
            }
            /* FP8 per block of the component (blocks from the trainer tensor origin) */
            struct wb_box gb = {.ndim = c->src.ndim};
            for (uint32_t d = 0; d < gb.ndim; d++) {
                uint64_t q = (d + 2 >= gb.ndim) ? 128 : 1;
                gb.off[d] = c->src.off[d] / q;
                gb.ext[d] = (c->src.off[d] + c->src.ext[d] + q - 1) / q - gb.off[d];
            }
            uint64_t bc[WB_MAX_DIMS];
            sim_start(&gb, bc);
            const struct wb_shape *ss = &f->in.rollout->p[mp->scale].shape;
            do {
                struct wb_box blk = {.ndim = gb.ndim};
                for (uint32_t d = 0; d < gb.ndim; d++) {
                    uint64_t q = (d + 2 >= gb.ndim) ? 128 : 1;
                    uint64_t a = bc[d] * q, z = a + q;
                    if (z > c->src.off[d] + c->src.ext[d])
                        z = c->src.off[d] + c->src.ext[d];
                    blk.off[d] = a;
                    blk.ext[d] = z - a;
                }
                float am = 0;
                uint64_t e[WB_MAX_DIMS];
                sim_start(&blk, e);
                do {
                    uint16_t b;
                    memcpy(&b, full + sim_lin(ts, e) * 2, 2);
                    float a = fabsf(sim_bf16_to_f(b));
                    am = a > am ? a : am;
                } while (sim_next(&blk, e));
                if (am < 1e-4f)
                    am = 1e-4f;
                /* values */
                sim_start(&blk, e);
                do {
                    uint16_t b;
                    memcpy(&b, full + sim_lin(ts, e) * 2, 2);
                    uint64_t dc[WB_MAX_DIMS];
                    int shift = (int)c->dst.ndim - (int)c->src.ndim;
                    for (uint32_t jd = 0; jd < c->dst.ndim; jd++) {
                        int j = (int)jd - shift;
                        dc[jd] = j < 0 ? c->dst.off[jd] : e[j] - c->src.off[j] + c->dst.off[jd];
                    }
                    ref[mp->rollout][sim_lin(rs, dc)] =
                        sim_f_to_e4m3(sim_bf16_to_f(b) * (448.0f / am));
                } while (sim_next(&blk, e));
                /* scale at the block's dst position / 128 */
                uint64_t sc[WB_MAX_DIMS];
                int shift = (int)c->dst.ndim - (int)c->src.ndim;
                for (uint32_t jd = 0; jd < c->dst.ndim; jd++) {
                    int j = (int)jd - shift;
                    uint64_t q = (jd + 2 >= c->dst.ndim) ? 128 : 1;
                    sc[jd] =
                        j < 0 ? c->dst.off[jd] : (blk.off[j] - c->src.off[j] + c->dst.off[jd]) / q;
                }
                float scv = am / 448.0f;
                memcpy(ref[mp->scale] + sim_lin(ss, sc) * 4, &scv, 4);
            } while (sim_next(&gb, bc));
            free(pfull);
        }
    }
    /* compare every rollout rank's local tensors */
    for (uint32_t g = 0; g < p->nrollouts; g++) {
        uint32_t l = g % f->in.rl->gpus_per_replica;
        for (size_t m = 0; m < f->in.match->n; m++) {
            const struct wb_mapping *mp = &f->in.match->map[m];
            struct wb_shape ls;
            struct wb_local_piece pcs[WB_MAX_PIECES];
            uint32_t np;
            CHECK_INT(wb_mapping_local(f->in.match, f->in.rollout, mp, l % f->in.rl->tp,
                                       f->in.rl->tp, l % f->in.rl->ep, f->in.rl->ep, &ls, pcs, &np,
                                       &f->el),
                      0);
            if (np == 0) { /* holds only rows nothing writes: not in its receive list */
                CHECK(s->dst[g][mp->rollout] == NULL);
                continue;
            }
            uint64_t vb = wb_shape_numel(&ls) * wb_dtype_size(mp->dst_dtype);
            uint8_t *exp = calloc(vb + 1, 1), *mine = calloc(vb + 1, 1);
            for (uint32_t k = 0; k < np; k++) {
                sim_boxcopy(ref[mp->rollout], &f->in.rollout->p[mp->rollout].shape, mp->dst_dtype,
                            &pcs[k].global, exp, &ls, mp->dst_dtype, &pcs[k].local);
                struct wb_ranges it;
                uint64_t off, len;
                CHECK_INT(wb_ranges_init(&it, &ls, &pcs[k].local, wb_dtype_size(mp->dst_dtype)), 0);
                while (wb_ranges_next(&it, &off, &len))
                    memset(mine + off, 1, len);
            }
            CHECK(s->dst[g][mp->rollout] != NULL);
            for (uint64_t b = 0; b < vb; b++) {
                /* bytes no piece covers (vocab padding) are never written: still poisoned */
                uint8_t want = mine[b] ? exp[b] : 0xEE;
                if (s->cnt[g][mp->rollout][b] != mine[b] || s->dst[g][mp->rollout][b] != want)
                    wb_test_fail(__FILE__, __LINE__,
                                 "rollout %u %s byte %llu: written %u times, got %02x want %02x", g,
                                 f->in.rollout->p[mp->rollout].name, (unsigned long long)b,
                                 s->cnt[g][mp->rollout][b], s->dst[g][mp->rollout][b], want);
            }
            free(exp);
            free(mine);
            if (mp->scale < 0)
                continue;
            struct wb_shape lss = {.ndim = ls.ndim};
            for (uint32_t d = 0; d < ls.ndim; d++)
                lss.dim[d] = (d + 2 >= ls.ndim) ? (ls.dim[d] + 127) / 128 : ls.dim[d];
            uint64_t sb = wb_shape_numel(&lss) * 4;
            uint8_t *exps = calloc(sb + 1, 1);
            for (uint32_t k = 0; k < np; k++) {
                struct wb_box G, L;
                CHECK_INT(wb_scale_box(&pcs[k].global, 128, &G), 0);
                CHECK_INT(wb_scale_box(&pcs[k].local, 128, &L), 0);
                sim_boxcopy(ref[mp->scale], &f->in.rollout->p[mp->scale].shape, WB_DTYPE_FP32, &G,
                            exps, &lss, WB_DTYPE_FP32, &L);
            }
            CHECK(s->dst[g][mp->scale] != NULL);
            for (uint64_t b = 0; b < sb; b++)
                if (s->cnt[g][mp->scale][b] != 1 || s->dst[g][mp->scale][b] != exps[b])
                    wb_test_fail(__FILE__, __LINE__,
                                 "rollout %u %s byte %llu: written %u times, got %02x want %02x", g,
                                 f->in.rollout->p[mp->scale].name, (unsigned long long)b,
                                 s->cnt[g][mp->scale][b], s->dst[g][mp->scale][b], exps[b]);
            free(exps);
        }
    }
    for (size_t t = 0; t < nrt; t++)
        free(ref[t]);
    free(ref);
}

/* Builds the plan in `mode`, runs it and checks every byte; returns the plan for more checks
 * (NULL when build failed: the errors are in f->el). */
static inline struct wb_plan *sim_plan_check(struct fx *f, enum wb_plan_mode mode)
{
    struct wb_plan_opts o = {mode, 0};
    struct wb_plan *p;
    if (wb_plan_build(&f->in, &o, &p, &f->el))
        wb_test_fail(__FILE__, __LINE__, "plan: %s", fx_errors(&f->el));
    struct sim s;
    sim_setup(&s, f, p);
    sim_run(&s);
    sim_check(&s);
    sim_free(&s);
    return p;
}

#endif /* WB_PLANNER_SIM_H */
