/* direct.c — the executor's direct path: where a trainer can address its rollouts' memory
 * (the same GPU, or another GPU of the host through CUDA IPC: wb_tx_peer_ptr), a task that only
 * quantizes or copies its own shards needs neither the TMP arena nor posted writes. Its
 * quantizations store straight into the rollout tensors (the fused destination, the scales'
 * place) and its plain writes become device copies; all such tasks of the table run as one
 * batch — a few kernel launches for the whole transfer instead of thousands of operations —
 * and once the batch's event fired, every write they stand for is announced to its rollout with
 * the write's immediate, so a rollout counts exactly what it would count for posted writes.
 *
 * The lowering is exact or nothing, task by task: a task qualifies when its ops are QUANT ops
 * reading a BF16 or FP16 PARAM shard with no amax exchange, every write's destination is
 * addressable, and the writes tile each quantization's output in whole rows (bytes) and whole block
 * rows (scales), with every cut at a 128-row block boundary, so each piece is a tile of its own
 * with the same blocks, amax and bytes as the one-tile quantization. Anything else (gathers,
 * amax exchanges, repacking copies, host-resident shards, unaligned cuts) runs on the general
 * pipeline, in the same transfer.
 *
 * Delta jobs: every item keeps a shadow in GPU memory of what its destination holds, and where
 * the attempt allows a delta to every rollout the batch stores into, against the version the
 * shadows hold whole, the kernels store only the 4-byte units and scales that changed (quant.h,
 * wb_quant_batch_run_delta). Any other attempt stores everything and refills the shadows. */
#include "agent/xfer.h"
#include "quant/quant.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

/* A trainer's direct path: its plan, the batch built from it, and the batch's run in the
 * attempt. */
struct ag_direct {
    struct ag_direct_plan plan;
    struct wb_quant_batch *batch;
    void *ev;    /* after the batch's kernels */
    int state;   /* 0 none, 1 launched, 2 done: its tasks announce their writes */
    uint64_t t0; /* launch time (its span) */
    /* Delta jobs: every item's shadow (device memory: what its destination holds once the
     * batch ran in an attempt that ended well here) and the bytes-stored counter after it. */
    void *shadow;
    uint64_t shadow_bytes;
    uint64_t *stored_dev;
    uint64_t stored_seen;    /* the counter's value before this attempt's run */
    uint64_t shadow_version; /* the version the shadows hold whole (0: none) */
    uint8_t *writes_to;      /* [nrollouts]: the batch stores into this rollout */
    bool delta;              /* this attempt's run stores changes only */
};

static void direct_clear(struct ag_direct *dr)
{
    ag_event_destroy(dr->ev);
    dr->ev = NULL;
    wb_quant_gpu_free(dr->shadow);
    dr->shadow = NULL;
    dr->stored_dev = NULL;
    dr->shadow_bytes = 0;
    dr->shadow_version = 0;
    free(dr->writes_to);
    dr->writes_to = NULL;
    wb_quant_batch_free(dr->batch);
    dr->batch = NULL;
    ag_direct_plan_free(&dr->plan);
    dr->state = 0;
}

/* growable arrays of items */
struct items {
    struct wb_quant_item *q;
    size_t nq, qcap;
    struct wb_copy_item *c;
    size_t nc, ccap;
};

static int add_q(struct items *it, const struct wb_quant_item *x)
{
    if (it->nq == it->qcap && wb_grow(&it->q, &it->qcap, 64, sizeof(*it->q)))
        return -ENOMEM;
    it->q[it->nq++] = *x;
    return 0;
}

static int add_c(struct items *it, const struct wb_copy_item *x)
{
    if (it->nc == it->ccap && wb_grow(&it->c, &it->ccap, 64, sizeof(*it->c)))
        return -ENOMEM;
    it->c[it->nc++] = *x;
    return 0;
}

/* The task's writes from TMP: a "primary" write is one overlapping no earlier primary (the plan
 * writes each rollout byte once, but the same TMP bytes may go to several rollouts: replicas).
 * Quantizations store through primaries; every other write from TMP copies from them. */
static void mark_primaries(const struct wb_route_table *t, const struct wb_rt_task *tk,
                           uint8_t *prim)
{
    for (uint32_t k = 0; k < tk->nwrites; k++) {
        const struct wb_rt_write *w = &t->writes[tk->write0 + k];
        prim[k] = w->src_tensor == (uint32_t)WB_RT_TMP_SRC;
        for (uint32_t j = 0; prim[k] && j < k; j++) {
            const struct wb_rt_write *v = &t->writes[tk->write0 + j];
            if (prim[j] && v->src_off < w->src_off + w->len && w->src_off < v->src_off + v->len)
                prim[k] = 0;
        }
    }
}

/* The primary write holding [off, off + len), NULL when none does. */
static const struct wb_rt_write *containing(const struct wb_route_table *t,
                                            const struct wb_rt_task *tk, const uint8_t *prim,
                                            uint64_t off, uint64_t len)
{
    for (uint32_t k = 0; k < tk->nwrites; k++) {
        const struct wb_rt_write *w = &t->writes[tk->write0 + k];
        if (prim[k] && w->src_off <= off && off + len <= w->src_off + w->len)
            return w;
    }
    return NULL;
}

/* Whether the task's primary writes inside [lo, hi) tile it exactly, each a multiple of `unit`
 * bytes from lo. A primary straddling the range's edges fails it too. */
static bool tiles(const struct wb_route_table *t, const struct wb_rt_task *tk, const uint8_t *prim,
                  uint64_t lo, uint64_t hi, uint64_t unit)
{
    uint64_t covered = 0;
    for (uint32_t k = 0; k < tk->nwrites; k++) {
        const struct wb_rt_write *w = &t->writes[tk->write0 + k];
        if (!prim[k] || w->src_off + w->len <= lo || w->src_off >= hi)
            continue;
        if (w->src_off < lo || w->src_off + w->len > hi || (w->src_off - lo) % unit ||
            w->len % unit)
            return false;
        covered += w->len;
    }
    return covered == hi - lo;
}

/* One QUANT op's output, in TMP: per lead slice an R x C byte array (q) and a GR x GC FP32 grid
 * (scales), slices back to back. */
struct qshape {
    uint64_t lead, R, C, row0, col0, GR, GC;
    uint64_t qoff, soff;
};

static bool quant_shape(const struct wb_route_table *t, const struct wb_rt_quant *q,
                        struct qshape *s)
{
    const struct wb_box *rg = wb_rt_box(t, q->region);
    uint32_t nd = rg->ndim;
    if (nd == 0 || q->dst.kind != WB_BUF_TMP || q->src.kind != WB_BUF_PARAM ||
        q->amax_off != (uint64_t)WB_RT_NONE)
        return false;
    s->R = nd >= 2 ? rg->ext[nd - 2] : 1;
    s->C = rg->ext[nd - 1];
    s->row0 = nd >= 2 ? rg->off[nd - 2] : 0;
    s->col0 = rg->off[nd - 1];
    s->lead = 1;
    for (uint32_t i = 0; i + 2 < nd; i++)
        s->lead *= rg->ext[i];
    struct wb_quant_tile tile = {q->src.dtype, s->R, s->C, s->row0, s->col0};
    struct wb_quant_grid g;
    if (!s->R || !s->C || wb_quant_fp8_grid(&tile, 0, s->R, &g))
        return false;
    s->GR = g.rows;
    s->GC = g.cols;
    if (wb_box_numel(wb_rt_box(t, q->grid)) != s->lead * s->GR * s->GC)
        return false;
    s->qoff = q->dst.off;
    s->soff = q->scale_off;
    return true;
}

/* The element offset, in the source view, of (lead slice l, row r, column 0) of the region. */
static uint64_t src_elem(const struct wb_route_table *t, const struct wb_rt_quant *q, uint64_t l,
                         uint64_t r)
{
    const struct wb_shape *sh = wb_rt_shape(t, q->src.shape);
    const struct wb_box *b = wb_rt_box(t, q->src_box);
    uint32_t nd = b->ndim;
    uint64_t c[WB_MAX_DIMS] = {0};
    for (uint32_t i = nd >= 2 ? nd - 2 : 0; i-- > 0;) { /* slice l: row-major over lead dims */
        c[i] = l % b->ext[i];
        l /= b->ext[i];
    }
    if (nd >= 2)
        c[nd - 2] = r;
    uint64_t lin = 0;
    for (uint32_t i = 0; i < nd; i++)
        lin = lin * sh->dim[i] + b->off[i] + c[i];
    return lin;
}

/* Lowers one QUANT op into tiles; false (nothing added) when its writes do not allow it. */
static int lower_quant(const struct wb_route_table *t, const struct wb_rt_task *tk,
                       const uint8_t *prim, const struct wb_rt_op *op, const uint8_t *src_base,
                       ag_dst_fn dst, void *arg, struct items *out, bool *ok)
{
    const struct wb_rt_quant *q = &op->quant;
    struct qshape s;
    *ok = false;
    const struct wb_box *vb = wb_rt_box(t, q->src_box);
    const struct wb_box *rg = wb_rt_box(t, q->region);
    if (!src_base || !quant_shape(t, q, &s) || vb->ndim != rg->ndim)
        return 0;
    for (uint32_t i = 0; i < vb->ndim; i++)
        if (vb->ext[i] != rg->ext[i])
            return 0;
    uint64_t qlen = s.lead * s.R * s.C, slen = s.lead * s.GR * s.GC * sizeof(float);
    if (!tiles(t, tk, prim, s.qoff, s.qoff + qlen, s.C) ||
        !tiles(t, tk, prim, s.soff, s.soff + slen, s.GC * sizeof(float)))
        return 0;
    size_t esz = wb_dtype_size(q->src.dtype);
    const struct wb_shape *vsh = wb_rt_shape(t, q->src.shape);
    uint64_t src_ld = vsh->dim[vsh->ndim - 1];
    size_t mark = out->nq;
    for (uint64_t l = 0; l < s.lead; l++) {
        uint64_t r = 0;
        while (r < s.R) {
            /* the piece from row r: as far as the q write and the scale write holding row r's
             * block row both reach, cut at a block boundary */
            uint64_t qat = s.qoff + (l * s.R + r) * s.C;
            uint64_t gi = (s.row0 + r) / WB_FP8_BLOCK - s.row0 / WB_FP8_BLOCK;
            uint64_t sat = s.soff + ((l * s.GR + gi) * s.GC) * sizeof(float);
            const struct wb_rt_write *qw = containing(t, tk, prim, qat, s.C);
            const struct wb_rt_write *sw = containing(t, tk, prim, sat, s.GC * sizeof(float));
            if (!qw || !sw || ((s.row0 + r) % WB_FP8_BLOCK && r != 0))
                goto no;
            uint64_t qend = (qw->src_off + qw->len - s.qoff) / s.C;                  /* flat row */
            uint64_t send = (sw->src_off + sw->len - s.soff) / sizeof(float) / s.GC; /* grid row */
            uint64_t end = qend - l * s.R < s.R ? qend - l * s.R : s.R;
            if (send < (l + 1) * s.GR) { /* the scale write ends at block row send - l*GR */
                uint64_t g_end = send - l * s.GR + s.row0 / WB_FP8_BLOCK; /* global block row */
                uint64_t rend = g_end * WB_FP8_BLOCK - s.row0;
                if (rend < end)
                    end = rend;
            }
            if (end <= r || ((s.row0 + end) % WB_FP8_BLOCK && end != s.R))
                goto no;
            uint8_t *qd = dst(arg, qw), *sd = dst(arg, sw);
            if (!qd || !sd)
                goto no;
            struct wb_quant_item it = {
                .dtype = q->src.dtype,
                .src = src_base + q->src.off + src_elem(t, q, l, r) * esz,
                .src_ld = src_ld,
                .q = qd + (qat - qw->src_off),
                .q_ld = s.C,
                .scale = (float *)(sd + (sat - sw->src_off)),
                .scale_ld = s.GC,
                .rows = end - r,
                .cols = s.C,
                .row0 = s.row0 + r,
                .col0 = s.col0,
            };
            if (add_q(out, &it))
                return -ENOMEM;
            r = end;
        }
    }
    *ok = true;
    return 0;
no:
    out->nq = mark;
    return 0;
}

/* A secondary write: copies, after the quantizations, from the primaries holding its bytes. */
static int lower_secondary(const struct wb_route_table *t, const struct wb_rt_task *tk,
                           const uint8_t *prim, const struct wb_rt_write *w, ag_dst_fn dst,
                           void *arg, struct items *out, bool *ok)
{
    uint8_t *d = dst(arg, w);
    *ok = false;
    if (!d)
        return 0;
    for (uint64_t off = w->src_off; off < w->src_off + w->len;) {
        const struct wb_rt_write *p = containing(t, tk, prim, off, 1);
        uint8_t *pd = p ? dst(arg, p) : NULL;
        if (!pd)
            return 0;
        uint64_t end =
            p->src_off + p->len < w->src_off + w->len ? p->src_off + p->len : w->src_off + w->len;
        struct wb_copy_item c = {
            pd + (off - p->src_off), d + (off - w->src_off), 1, end - off, end - off, end - off};
        if (add_c(out, &c))
            return -ENOMEM;
        off = end;
    }
    *ok = true;
    return 0;
}

/* Lowers one task: every op and write, or nothing. */
static int lower_task(const struct wb_route_table *t, uint32_t ti, uint8_t *const *shard_ptr,
                      uint32_t ntensors, ag_dst_fn dst, void *arg, struct items *out, bool *ok)
{
    const struct wb_rt_task *tk = &t->tasks[ti];
    size_t mq = out->nq, mc = out->nc;
    *ok = false;
    uint8_t *prim = calloc(tk->nwrites ? tk->nwrites : 1, 1);
    if (!prim)
        return -ENOMEM;
    int rc = 0;
    uint64_t primary_bytes = 0, covered = 0;
    mark_primaries(t, tk, prim);
    for (uint32_t k = 0; k < tk->nwrites; k++)
        primary_bytes += prim[k] ? t->writes[tk->write0 + k].len : 0;
    for (uint32_t k = 0; k < tk->nops; k++) {
        const struct wb_rt_op *op = &t->ops[tk->op0 + k];
        /* an FP32 source is rounded to BF16 before it is quantized (ops.c); the batch kernel
         * reads its sources as they are, so such a task runs on the general pipeline */
        if (op->kind != WB_OP_QUANT || op->quant.src.dtype == WB_DTYPE_FP32)
            goto no;
        uint32_t tn = op->quant.src.tensor;
        bool qok;
        rc =
            lower_quant(t, tk, prim, op, tn < ntensors ? shard_ptr[tn] : NULL, dst, arg, out, &qok);
        if (rc || !qok)
            goto no;
        struct qshape s;
        quant_shape(t, &op->quant, &s);
        covered += s.lead * s.R * s.C + s.lead * s.GR * s.GC * sizeof(float);
    }
    if (primary_bytes != covered) /* a write from TMP that no quantization produces */
        goto no;
    for (uint32_t k = 0; k < tk->nwrites; k++) {
        const struct wb_rt_write *w = &t->writes[tk->write0 + k];
        bool wok = true;
        if (w->src_tensor == (uint32_t)WB_RT_TMP_SRC) {
            if (!prim[k])
                rc = lower_secondary(t, tk, prim, w, dst, arg, out, &wok);
        } else {
            uint8_t *d = dst(arg, w);
            const uint8_t *s = w->src_tensor < ntensors ? shard_ptr[w->src_tensor] : NULL;
            wok = d && s;
            struct wb_copy_item c = {s ? s + w->src_off : NULL, d, 1, w->len, w->len, w->len};
            if (wok && w->len)
                rc = add_c(out, &c);
        }
        if (rc || !wok)
            goto no;
    }
    free(prim);
    *ok = true;
    return 0;
no:
    free(prim);
    out->nq = mq;
    out->nc = mc;
    return rc;
}

int ag_direct_lower(const struct wb_route_table *t, uint8_t *const *shard_ptr, uint32_t ntensors,
                    ag_dst_fn dst, void *arg, struct ag_direct_plan *out)
{
    struct items it = {0};
    memset(out, 0, sizeof(*out));
    out->is_direct = calloc(t->ntasks ? t->ntasks : 1, 1);
    if (!out->is_direct)
        return -ENOMEM;
    /* Tasks with exchanges (gathers, amax) stay on the general pipeline; the others take no
     * part in the mesh's ordering or barriers, so lowering them changes nothing for those. */
    for (uint32_t ti = 0; ti < t->ntasks; ti++) {
        bool ok;
        int rc = lower_task(t, ti, shard_ptr, ntensors, dst, arg, &it, &ok);
        if (rc) {
            free(it.q);
            free(it.c);
            ag_direct_plan_free(out);
            return rc;
        }
        if (ok) {
            out->is_direct[ti] = 1;
            out->ntasks++;
            for (uint32_t k = 0; k < t->tasks[ti].nwrites; k++)
                out->bytes += t->writes[t->tasks[ti].write0 + k].len;
        }
    }
    out->q = it.q;
    out->nq = it.nq;
    out->c = it.c;
    out->nc = it.nc;
    return 0;
}

void ag_direct_plan_free(struct ag_direct_plan *p)
{
    free(p->is_direct);
    free(p->q);
    free(p->c);
    memset(p, 0, sizeof(*p));
}

/* ---------------------------------------------------------------- the executor's side */

/* A write's destination through the transport: rollout rank, its tensor's descriptor, mapped. */
static uint8_t *tx_dst(void *arg, const struct wb_rt_write *w)
{
    struct data *d = arg;
    struct peer *p = w->dst_rank < d->table.nrollouts ? &d->rpeer[w->dst_rank] : NULL;
    for (uint32_t i = 0; p && p->present && i < p->nreg; i++) {
        void *ptr;
        if (p->reg_tensor[i] == w->dst_tensor)
            return wb_tx_peer_ptr(d->tx, p->idx, &p->reg[i], w->dst_off, w->len, &ptr) ? NULL : ptr;
    }
    return NULL;
}

/* A delta job's shadows: one device allocation, every item's bytes (and a quantization's
 * scales) at 16-byte aligned places, the stored-bytes counter last; the items point into it. */
static int shadows_make(struct data *d, struct ag_direct *dr)
{
    struct ag_direct_plan *pl = &dr->plan;
    uint64_t n = 0;
    for (size_t i = 0; i < pl->nq; i++) {
        const struct wb_quant_item *it = &pl->q[i];
        struct wb_quant_tile tl = {it->dtype, it->rows, it->cols, it->row0, it->col0};
        struct wb_quant_grid g;
        if (wb_quant_fp8_grid(&tl, 0, it->rows, &g))
            return -EINVAL;
        n += (it->rows * it->cols + 15) / 16 * 16 + (g.rows * g.cols * 4 + 15) / 16 * 16;
    }
    for (size_t i = 0; i < pl->nc; i++)
        n += (pl->c[i].rows * pl->c[i].bytes + 15) / 16 * 16;
    int rc = wb_quant_gpu_alloc(n + 16, &dr->shadow);
    if (rc)
        return rc;
    uint8_t *at = dr->shadow;
    for (size_t i = 0; i < pl->nq; i++) {
        struct wb_quant_item *it = &pl->q[i];
        struct wb_quant_tile tl = {it->dtype, it->rows, it->cols, it->row0, it->col0};
        struct wb_quant_grid g;
        wb_quant_fp8_grid(&tl, 0, it->rows, &g);
        it->shadow = at;
        at += (it->rows * it->cols + 15) / 16 * 16;
        it->shadow_scale = (float *)at;
        at += (g.rows * g.cols * 4 + 15) / 16 * 16;
    }
    for (size_t i = 0; i < pl->nc; i++) {
        pl->c[i].shadow = at;
        at += (pl->c[i].rows * pl->c[i].bytes + 15) / 16 * 16;
    }
    dr->stored_dev = (uint64_t *)at;
    dr->shadow_bytes = n;
    uint64_t zero = 0;
    rc = wb_quant_gpu_copy(dr->stored_dev, &zero, sizeof(zero), d->stream);
    rc = rc ? rc : wb_quant_gpu_sync(d->stream);
    dr->writes_to = calloc(d->table.nrollouts ? d->table.nrollouts : 1, 1);
    if (!rc && !dr->writes_to)
        rc = -ENOMEM;
    for (uint32_t ti = 0; !rc && ti < d->table.ntasks; ti++)
        for (uint32_t k = 0; pl->is_direct[ti] && k < d->table.tasks[ti].nwrites; k++) {
            uint32_t g = d->table.writes[d->table.tasks[ti].write0 + k].dst_rank;
            if (g < d->table.nrollouts)
                dr->writes_to[g] = 1;
        }
    if (!rc)
        wb_log(WB_LOG_INFO, "agent",
               "trainer rank %u: delta updates on the direct path: shadows of %" PRIu64
               " bytes in GPU memory",
               d->rank, n);
    return rc;
}

int ag_direct_prepare(struct data *d)
{
    if (d->direct)
        return 0;
    struct ag_direct *dr = d->direct = calloc(1, sizeof(*d->direct));
    if (!dr)
        return -ENOMEM;
    const char *env = getenv("WB_DIRECT");
    /* Not for a sourced trainer (its values arrive through reads, the pipeline's H2D) nor where
     * the rollouts check each write's checksum (the pipeline computes them as it sends). */
    if (!d->gpu || d->param_host || d->source || d->verify || d->no_direct ||
        (env && strcmp(env, "0") == 0))
        return 0;
    uint8_t **shard_ptr = calloc(d->ntensors ? d->ntensors : 1, sizeof(*shard_ptr));
    if (!shard_ptr)
        return -ENOMEM;
    for (uint32_t i = 0; i < d->nshards; i++)
        shard_ptr[d->shards[i].tensor] = d->shards[i].ptr;
    int rc = ag_direct_lower(&d->table, shard_ptr, d->ntensors, tx_dst, d, &dr->plan);
    free(shard_ptr);
    if (rc)
        return rc;
    if (dr->plan.ntasks && d->delta) {
        rc = shadows_make(d, dr);
        if (rc) {
            direct_clear(dr); /* not again: the tasks take the pipeline */
            return rc;
        }
    }
    if (dr->plan.ntasks) {
        struct wb_quant_exec ex = {WB_QUANT_DEVICE, d->stream};
        rc = wb_quant_batch_create(&ex, dr->plan.q, dr->plan.nq, dr->plan.c, dr->plan.nc,
                                   &dr->batch);
        if (rc) {
            direct_clear(dr); /* not again: the tasks take the pipeline */
            return rc;
        }
    }
    wb_log(WB_LOG_INFO, "agent",
           "trainer rank %u: direct path: %u of %u tasks (%" PRIu64
           " bytes) store into the rollouts' memory: %zu quantization tiles, %zu copies",
           d->rank, dr->plan.ntasks, d->table.ntasks, dr->plan.bytes, dr->plan.nq, dr->plan.nc);
    free(dr->plan.q); /* the batch holds its own copy */
    free(dr->plan.c);
    dr->plan.q = NULL;
    dr->plan.c = NULL;
    return 0;
}

void ag_direct_release(struct data *d)
{
    if (!d->direct)
        return;
    direct_clear(d->direct);
    free(d->direct);
    d->direct = NULL;
}

bool ag_direct_has(const struct data *d, uint32_t ti)
{
    return d->direct && d->direct->batch && d->direct->plan.is_direct[ti];
}

int ag_direct_launch(struct data *d)
{
    struct ag_direct *dr = d->direct;
    if (!dr || !dr->batch || dr->state != 0)
        return 0;
    dr->t0 = wb_now_ns();
    wb_log(WB_LOG_DEBUG, "agent", "trainer rank %u: every rollout ready %.3f ms after the start",
           d->rank, (double)(dr->t0 - d->start_ns) / 1e6);
    /* changes only where this attempt allows every rollout the batch stores into a delta
     * against the version the shadows hold */
    uint64_t base = 0;
    dr->delta = dr->shadow && dr->shadow_version;
    for (uint32_t g = 0; dr->delta && g < d->table.nrollouts; g++)
        if (dr->writes_to[g])
            dr->delta = ag_delta_allowed(d, g, &base) && base == dr->shadow_version;
    dr->shadow_version = 0; /* rewritten from here on */
    int rc = wb_quant_batch_run_delta(dr->batch, d->stream, dr->delta, dr->stored_dev);
    rc = rc ? rc : ag_event_record(d->stream, &dr->ev);
    if (rc)
        return rc;
    dr->state = 1;
    return 0;
}

int ag_direct_poll(struct data *d, uint64_t *t0)
{
    struct ag_direct *dr = d->direct;
    if (!dr || dr->state != 1)
        return 0;
    int r = ag_event_done(dr->ev);
    if (r > 0) {
        dr->state = 2;
        *t0 = dr->t0;
    }
    if (r > 0 && dr->shadow) { /* what the run stored (a full run: every byte) */
        uint64_t now = 0;
        r = wb_quant_gpu_copy(&now, dr->stored_dev, sizeof(now), NULL);
        r = r ? r : wb_quant_gpu_sync(NULL);
        if (r)
            return r;
        if (dr->delta) {
            d->stats.bytes += now - dr->stored_seen;
            d->stats.delta_bytes += now - dr->stored_seen;
        }
        dr->stored_seen = now;
        r = 1;
    }
    return r;
}

bool ag_direct_sent_delta(const struct data *d)
{
    return d->direct && d->direct->state == 2 && d->direct->delta;
}

void ag_direct_end(struct data *d, bool ok)
{
    struct ag_direct *dr = d->direct;
    if (dr && dr->shadow)
        dr->shadow_version = ok && dr->state == 2 ? d->version : 0;
}

bool ag_direct_done(const struct data *d)
{
    return d->direct && d->direct->state == 2;
}

void ag_direct_reset(struct data *d)
{
    if (!d->direct)
        return;
    ag_event_destroy(d->direct->ev);
    d->direct->ev = NULL;
    d->direct->state = 0;
}
