/* emit.c — turns one item's assignments (which rank sends which trainer box to which rollout
 * box) into routing-table tasks: stage ops and writes.
 *
 * Per rank and component the task gets: an H2D of the rows it needs (host residence), then
 * either a GATHER (gather mode) or nothing (direct), then the transform — writes straight from
 * the source when the bytes already match (BF16 -> BF16), a CAST, or a QUANT preceded by AMAX
 * exchanges for blocks that straddle its shard — and finally the writes: each maximal run that
 * is contiguous on both sides becomes one write; when the source runs are much shorter than
 * the destination's, the box is first packed (COPY) so that writes follow the destination.
 *
 * Pass 3 (emit_threads.c) calls it per item; it uses only geometry.c of the builder. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "planner/build.h"

enum { TMP_ALIGN = 256, AMAX_ALIGN = 16 };

/* A view under construction (its shape inline) plus the tensor box it covers. */
struct sview {
    enum wb_rt_buf_kind kind;
    uint32_t tensor;
    uint64_t off;
    enum wb_dtype dtype;
    struct wb_shape shape;
    struct wb_box cover;
};

struct tstate {
    struct plan_ctx *c;
    struct rank_out *ro;
    uint32_t rank;
    uint64_t tmp;
    uint64_t write_bytes;
    bool coll;
    /* the trainer tensors this task gathered, and where: a split rule's components are boxes
     * of one tensor, gathered once for all of them (every mesh member skips the same ones) */
    uint32_t ngathered;
    uint32_t gathered_t[WB_MAX_PIECES];
    struct sview gathered[WB_MAX_PIECES];
};

/* Interns a box or shape in the rank's table (each distinct value stored once). */
static uint32_t bx(struct tstate *ts, const struct wb_box *b)
{
    return pl_intern_box(&ts->ro->boxes, b);
}

/* The gather peers of this rank for component ic (made on first use; NULL: no memory). */
static const struct wb_rt_peer *peers_of(struct tstate *ts, const struct icomp *ic, uint32_t q)
{
    struct peer_ids *pc = &ts->ro->pcache[ic->cls % PEER_CACHE];
    if (pc->n == ic->nk && pc->cls == ic->cls)
        return pc->pe;
    struct wb_rt_peer *pe = realloc(pc->pe, (ic->nk ? ic->nk : 1) * sizeof(*pe));
    if (!pe)
        return NULL;
    pc->pe = pe;
    pc->n = 0;
    const struct wb_box *B = VEC_AT(&ts->c->ibox, struct wb_box, ic->b0);
    for (uint32_t s = 0; s < ic->nk; s++) {
        /* a gather moves the shards as the trainers hold them: in the trainer's dim order */
        struct wb_box b = ic->permuted ? pl_unperm_box(&B[s], ic->perm) : B[s];
        pe[s] = (struct wb_rt_peer){pl_place_shard_rank(ts->c->pm, ic->tp, s, q), bx(ts, &b)};
    }
    if (ts->ro->boxes.err)
        return NULL;
    pc->cls = ic->cls;
    pc->n = ic->nk;
    return pe;
}

static struct wb_rt_view rtv(struct tstate *ts, const struct sview *v)
{
    struct wb_rt_view r = {v->kind, v->tensor, v->off, v->dtype,
                           pl_intern_shape(&ts->ro->shapes, &v->shape)};
    return r;
}

static struct sview sview_tmp(enum wb_dtype dt, const struct wb_box *cover)
{
    struct sview v = {WB_BUF_TMP, 0, 0, dt, wb_box_shape(cover), *cover};
    return v;
}

static uint64_t tmp_alloc(struct tstate *ts, uint64_t bytes)
{
    uint64_t off = ts->tmp;
    ts->tmp += (bytes + TMP_ALIGN - 1) / TMP_ALIGN * TMP_ALIGN;
    return off;
}

static struct wb_box box_rel(const struct wb_box *b, const struct wb_box *cover)
{
    struct wb_box r = *b;
    for (uint32_t d = 0; d < b->ndim; d++)
        r.off[d] = b->off[d] - cover->off[d];
    return r;
}

static struct wb_box box_bbox(const struct wb_box *a, const struct wb_box *b)
{
    if (wb_box_empty(a) && a->ndim)
        return *b;
    if (wb_box_empty(b) && b->ndim)
        return *a;
    struct wb_box r = {.ndim = a->ndim};
    for (uint32_t d = 0; d < a->ndim; d++) {
        uint64_t lo = a->off[d] < b->off[d] ? a->off[d] : b->off[d];
        uint64_t ha = a->off[d] + a->ext[d], hb = b->off[d] + b->ext[d];
        r.off[d] = lo;
        r.ext[d] = (ha > hb ? ha : hb) - lo;
    }
    return r;
}

static struct wb_rt_op *push_op(struct tstate *ts, enum wb_rt_op_kind kind, uint32_t tensor)
{
    struct wb_rt_op *op = pl_vec_push(&ts->ro->ops, NULL);
    if (op) {
        op->kind = kind;
        op->tensor = tensor;
    }
    return op;
}

/* The contiguous byte runs of a box in a row-major tensor (what common's wb_ranges does,
 * without its checks: boxes here are known to lie inside their shapes; this is the planner's
 * innermost loop). Trailing dims the box spans whole merge into one run. */
struct runs {
    uint32_t outer;
    uint64_t run, count, base;
    uint64_t stride[WB_MAX_DIMS], ext[WB_MAX_DIMS], idx[WB_MAX_DIMS];
};

static void runs_init(struct runs *r, const struct wb_shape *s, const struct wb_box *b, size_t elem)
{
    uint32_t n = b->ndim;
    uint64_t st = elem;
    for (uint32_t d = n; d-- > 0;) {
        r->stride[d] = st;
        st *= s->dim[d];
    }
    r->base = 0;
    r->count = 1;
    if (n == 0) {
        r->outer = 0;
        r->run = elem;
        return;
    }
    uint32_t k = n - 1;
    while (k > 0 && b->off[k] == 0 && b->ext[k] == s->dim[k])
        k--;
    r->outer = k;
    r->run = b->ext[k] * r->stride[k];
    for (uint32_t d = 0; d < n; d++) {
        r->base += b->off[d] * r->stride[d];
        if (d < k) {
            r->count *= b->ext[d];
            r->ext[d] = b->ext[d];
            r->idx[d] = 0;
        }
    }
    if (r->run == 0)
        r->count = 0;
}

/* Offset of the next run; false when done. */
static bool runs_next(struct runs *r, uint64_t *off)
{
    if (r->count == 0)
        return false;
    uint64_t o = r->base;
    for (uint32_t d = 0; d < r->outer; d++)
        o += r->idx[d] * r->stride[d];
    *off = o;
    r->count--;
    for (uint32_t d = r->outer; d-- > 0;) {
        if (++r->idx[d] < r->ext[d])
            break;
        r->idx[d] = 0;
    }
    return true;
}

/* Writes for tensor box S of view sv to box D of a rollout local tensor. */
static int emit_writes(struct tstate *ts, const struct sview *sv, const struct wb_box *S,
                       uint32_t g, uint32_t dst_tensor, const struct wb_shape *dshape,
                       const struct wb_box *D, uint32_t tensor)
{
    struct plan_ctx *c = ts->c;
    size_t elem = wb_dtype_size(sv->dtype);
    struct wb_box Sv = box_rel(S, &sv->cover);
    if (Sv.ndim != sv->shape.ndim || D->ndim != dshape->ndim) {
        char a[160], b[160];
        wb_errlist_add(c->el, "internal: write box %s of %s outside its view or destination %s",
                       wb_box_str(S, a, sizeof(a)), c->in->trainer->p[tensor].name,
                       wb_box_str(D, b, sizeof(b)));
        return -WB_E_PLAN;
    }
    struct runs rs, rd;
    runs_init(&rs, &sv->shape, &Sv, elem);
    runs_init(&rd, dshape, D, elem);
    uint64_t ns = rs.count, nd = rd.count;
    if (ns == 0)
        return 0;
    if (ns > 16 && ns > 4 * nd) { /* pack first so that writes follow the destination */
        struct sview pk = sview_tmp(sv->dtype, S);
        pk.off = tmp_alloc(ts, wb_box_numel(S) * elem);
        struct wb_box pf = wb_box_full(&pk.shape);
        struct wb_rt_op *op = push_op(ts, WB_OP_COPY, tensor);
        if (!op)
            return -ENOMEM;
        op->copy.src = rtv(ts, sv);
        op->copy.src_box = bx(ts, &Sv);
        op->copy.dst = rtv(ts, &pk);
        op->copy.dst_box = bx(ts, &pf);
        return emit_writes(ts, &pk, S, g, dst_tensor, dshape, D, tensor);
    }
    uint64_t so = 0, sl = 0, dof = 0, dl = 0;
    bool param = sv->kind == WB_BUF_PARAM;
    if (pl_vec_reserve(&ts->ro->writes, ns > nd ? ns : nd))
        return -ENOMEM;
    for (;;) {
        if (sl == 0) {
            if (!runs_next(&rs, &so))
                break;
            sl = rs.run;
        }
        if (dl == 0) {
            if (!runs_next(&rd, &dof))
                break;
            dl = rd.run;
        }
        uint64_t len = sl < dl ? sl : dl;
        struct wb_rt_write w = {
            .src_off = sv->off + so,
            .dst_off = dof,
            .len = len,
            .src_tensor = param ? sv->tensor : (uint32_t)WB_RT_TMP_SRC,
            .dst_rank = g,
            .dst_tensor = dst_tensor,
            .tag = dst_tensor + 1,
        };
        if (!pl_vec_push(&ts->ro->writes, &w))
            return -ENOMEM;
        ts->write_bytes += len;
        ts->ro->send += len;
        ts->ro->nwrites++;
        size_t ri = (size_t)g * c->in->rollout->n + dst_tensor;
        c->recv[ri].bytes += len;
        c->recv[ri].writes++;
        so += len;
        sl -= len;
        dof += len;
        dl -= len;
    }
    return 0;
}

/* Scale blocks of trainer box S, and where they go in the local scale tensor of box D. */
static bool scale_boxes(const struct wb_box *S, const struct wb_box *D, struct wb_box *Sb,
                        struct wb_box *Db)
{
    *Sb = pl_origin_blocks(S);
    if (wb_box_empty(Sb))
        return false;
    int shift = (int)D->ndim - (int)S->ndim;
    *Db = *D;
    for (uint32_t jd = 0; jd < D->ndim; jd++) {
        int j = (int)jd - shift;
        if (j < 0) {
            Db->ext[jd] = 1;
            continue;
        }
        int64_t q = (int64_t)qblock(D->ndim, jd);
        int64_t delta = (int64_t)D->off[jd] - (int64_t)S->off[j]; /* a multiple of q */
        Db->off[jd] = (uint64_t)((int64_t)Sb->off[j] + delta / q);
        Db->ext[jd] = Sb->ext[j];
    }
    return true;
}

/* Checks that trainer block edges land on local block edges (dst_off - src_off multiple of
 * 128 along block dims). */
static bool blocks_aligned(const struct wb_box *S, const struct wb_box *D)
{
    int shift = (int)D->ndim - (int)S->ndim;
    for (uint32_t jd = 0; jd < D->ndim; jd++) {
        int j = (int)jd - shift;
        if (j < 0)
            continue;
        uint64_t q = qblock(D->ndim, jd);
        if (q != qblock(S->ndim, (uint32_t)j))
            return false;
        if ((D->off[jd] + q * (1ull << 40) - S->off[j]) % q)
            return false;
    }
    return true;
}

/* Whether piece S of a shard (view cover) is quantized on its own, straight into a packed
 * buffer, rather than sharing the shard's one quantization: when it is narrower than the
 * shard along a trailing dim (the column slab a column-parallel TP split cuts), which from the
 * shared output would take a COPY to pack and one scale write per block row, and it covers
 * whole blocks (block edges or the tensor's end on every side), so that quantizing it alone
 * gives the same values and scales. The caller keeps pieces whose blocks other owners share
 * (amax exchanges) on the shared quantization, whose grid the exchanges fill. */
static bool own_quant(const struct wb_box *S, const struct wb_box *cover, const struct wb_shape *sh)
{
    bool slab = false;
    for (uint32_t d = 1; d < S->ndim; d++)
        slab |= S->off[d] != cover->off[d] || S->ext[d] != cover->ext[d];
    if (!slab)
        return false;
    for (uint32_t d = 0; d < S->ndim; d++) {
        uint64_t q = qblock(S->ndim, d), end = S->off[d] + S->ext[d];
        if (S->off[d] % q || (end % q && end != sh->dim[d]))
            return false;
    }
    return true;
}

/* A QUANT of region W (tensor coordinates, inside view sv's cover) of tensor t into the FP8
 * view qv, its scales (grid = the blocks of W) at TMP scale_off. */
static int push_quant(struct tstate *ts, uint32_t t, const struct sview *sv, const struct sview *qv,
                      const struct wb_box *W, const struct wb_box *grid, uint64_t scale_off,
                      uint64_t amax_off)
{
    struct wb_box rel = box_rel(W, &sv->cover);
    struct wb_rt_op *op = push_op(ts, WB_OP_QUANT, t);
    if (!op)
        return -ENOMEM;
    op->quant.src = rtv(ts, sv);
    op->quant.dst = rtv(ts, qv);
    op->quant.src_box = bx(ts, &rel);
    op->quant.region = bx(ts, W);
    op->quant.grid = bx(ts, grid);
    op->quant.scale_off = scale_off;
    op->quant.amax_off = amax_off;
    return 0;
}

/* The packed quantization of an own_quant piece: one per distinct box in a task's component
 * (several rollout GPUs often take the same slab). */
struct own_q {
    struct wb_box S;
    struct sview qv, sc;
};
enum { OWN_Q_CACHE = 16 };

static int own_quant_view(struct tstate *ts, const struct sview *sv, uint32_t t,
                          const struct wb_box *S, struct own_q *cache, size_t *n,
                          const struct own_q **out)
{
    for (size_t i = 0; i < *n && i < OWN_Q_CACHE; i++)
        if (wb_box_eq(&cache[i].S, S)) {
            *out = &cache[i];
            return 0;
        }
    struct own_q *o = &cache[*n % OWN_Q_CACHE];
    (*n)++;
    struct wb_box grid = pl_box_blocks(S);
    o->S = *S;
    o->qv = sview_tmp(WB_DTYPE_FP8_E4M3, S);
    o->qv.off = tmp_alloc(ts, wb_box_numel(S));
    o->sc = sview_tmp(WB_DTYPE_FP32, &grid);
    o->sc.off = tmp_alloc(ts, wb_box_numel(&grid) * 4);
    *out = o;
    return push_quant(ts, t, sv, &o->qv, S, &grid, o->sc.off, (uint64_t)WB_RT_NONE);
}

static bool same_piece(const struct assign *a, const struct assign *b)
{
    return a->sub == b->sub && a->k == b->k && a->u0 == b->u0 && a->u1 == b->u1;
}

static int cmp_asg(const void *a, const void *b)
{
    const struct assign *x = a, *y = b;
    uint32_t kx[6] = {x->rank, x->ci, x->sub, x->k, x->u0, x->g};
    uint32_t ky[6] = {y->rank, y->ci, y->sub, y->k, y->u0, y->g};
    for (int i = 0; i < 6; i++)
        if (kx[i] != ky[i])
            return kx[i] < ky[i] ? -1 : 1;
    return 0;
}

/* Sorts the item's assignments by rank (counting sort), then within a rank by component,
 * piece and replica, so that the replicas of one piece are adjacent. */
static int sort_asg(struct plan_ctx *c)
{
    size_t n = c->asg.n;
    if (n < 2)
        return 0;
    uint32_t *cnt = calloc(c->nt + 1, sizeof(uint32_t));
    struct assign *tmp = malloc(n * sizeof(struct assign));
    if (!cnt || !tmp) {
        free(cnt);
        free(tmp);
        return -ENOMEM;
    }
    struct assign *A = c->asg.p;
    for (size_t i = 0; i < n; i++)
        cnt[A[i].rank + 1]++;
    for (uint32_t r = 0; r < c->nt; r++)
        cnt[r + 1] += cnt[r];
    for (size_t i = 0; i < n; i++)
        tmp[cnt[A[i].rank]++] = A[i];
    memcpy(A, tmp, n * sizeof(struct assign));
    for (size_t a = 0; a < n;) {
        size_t z = a;
        bool sorted = true; /* often: the walk makes a rank's pieces in order */
        while (z < n && A[z].rank == A[a].rank) {
            sorted = sorted && (z == a || cmp_asg(&A[z - 1], &A[z]) <= 0);
            z++;
        }
        if (!sorted)
            qsort(A + a, z - a, sizeof(struct assign), cmp_asg);
        a = z;
    }
    free(cnt);
    free(tmp);
    return 0;
}

static int cmp_xchg(const void *a, const void *b)
{
    const struct xchg *x = a, *y = b;
    if (x->ci != y->ci)
        return x->ci < y->ci ? -1 : 1;
    return x->tag < y->tag ? -1 : x->tag > y->tag;
}

/* Amax exchanges of a direct FP8 item: for every (component, replica) in which some writer's
 * blocks straddle its shard, every pair of shards sharing blocks swaps partial amax. */
static int plan_exchanges(struct plan_ctx *c, const struct item *it)
{
    c->xc.n = 0;
    const struct wb_mapping *mp = pl_ctx_map(c, it->mapping);
    if (it->mode == WB_MODE_GATHER || mp->xform != WB_XFORM_FP8_BLOCK)
        return 0;
    struct vec need; /* uint32_t pairs (ci, q) */
    pl_vec_init(&need, 2 * sizeof(uint32_t));
    const struct assign *A = c->asg.p;
    for (size_t i = 0; i < c->asg.n; i++) {
        const struct icomp *ic = VEC_AT(&c->icomp, struct icomp, A[i].ci);
        if (ic->aligned || (i > 0 && A[i].rank == A[i - 1].rank && same_piece(&A[i], &A[i - 1])))
            continue;
        uint32_t t = ic->t;
        uint32_t k, q;
        if (!pl_rank_shard(c, t, A[i].rank, &k, &q))
            continue;
        uint32_t key[2] = {A[i].ci, q};
        bool dup = false; /* known already: its boxes need not be worked out */
        for (size_t j = need.n; j-- > 0 && !dup;)
            dup = memcmp(VEC_AT(&need, uint32_t, 2 * j), key, sizeof(key)) == 0;
        if (dup)
            continue;
        const struct wb_box B = *VEC_AT(&c->ibox, struct wb_box, ic->b0 + k);
        struct sd x;
        pl_asg_boxes(c, it, &A[i], &x);
        struct wb_box bl = pl_box_blocks(&x.S);
        struct wb_box e = pl_blocks_elems(&bl, ic->sh);
        if (wb_box_contains(&B, &e))
            continue;
        if (!pl_vec_push(&need, key)) {
            pl_vec_free(&need);
            return -ENOMEM;
        }
    }
    for (size_t j = 0; j < need.n; j++) {
        uint32_t ci = *VEC_AT(&need, uint32_t, 2 * j), q = *VEC_AT(&need, uint32_t, 2 * j + 1);
        const struct icomp *ic = VEC_AT(&c->icomp, struct icomp, ci);
        const struct tplace *tp = ic->tp;
        uint32_t nk = ic->nk;
        const struct wb_box *IB = VEC_AT(&c->ibox, struct wb_box, ic->b0);
        for (uint32_t a = 0; a < nk; a++) {
            if (wb_box_empty(&IB[a]))
                continue;
            struct wb_box ga = pl_box_blocks(&IB[a]);
            for (uint32_t b = a + 1; b < nk; b++) {
                struct wb_box X;
                if (wb_box_empty(&IB[b]))
                    continue;
                struct wb_box gb = pl_box_blocks(&IB[b]);
                if (!wb_box_intersect(&ga, &gb, &X))
                    continue;
                struct xchg x = {.ci = ci, .blocks = X, .tag = ++c->next_tag};
                x.a = pl_place_shard_rank(c->pm, tp, a, q);
                x.b = pl_place_shard_rank(c->pm, tp, b, q);
                uint64_t bytes = wb_box_numel(&X) * 4;
                uint64_t al = (bytes + AMAX_ALIGN - 1) / AMAX_ALIGN * AMAX_ALIGN;
                x.slot_a = c->inbox[x.a];
                c->inbox[x.a] += al;
                x.slot_b = c->inbox[x.b];
                c->inbox[x.b] += al;
                struct wb_rt_expect ea = {x.tag, UINT32_MAX, bytes, 1};
                if (!pl_vec_push(&c->xc, &x) ||
                    (owns(c, x.a) && !pl_vec_push(&c->ro[x.a].amax, &ea)) ||
                    (owns(c, x.b) && !pl_vec_push(&c->ro[x.b].amax, &ea))) {
                    pl_vec_free(&need);
                    return -ENOMEM;
                }
            }
        }
    }
    pl_vec_free(&need);
    if (c->xc.n > 1)
        qsort(c->xc.p, c->xc.n, sizeof(struct xchg), cmp_xchg);
    return 0;
}

/* The source view of rank ts->rank's shard B of tensor t covering at least region R. */
static int source_view(struct tstate *ts, uint32_t t, const struct wb_box *B,
                       const struct wb_box *R, struct sview *out)
{
    const struct wb_param *p = &ts->c->in->trainer->p[t];
    size_t elem = wb_dtype_size(p->dtype);
    *out = (struct sview){WB_BUF_PARAM, t, 0, p->dtype, wb_box_shape(B), *B};
    if (ts->c->in->tl->residence != WB_RESIDE_HOST)
        return 0;
    uint64_t row = 1, a = 0, n = 1;
    if (B->ndim) {
        row = wb_box_numel(B) / (B->ext[0] ? B->ext[0] : 1) * elem;
        a = R->off[0] - B->off[0];
        n = R->ext[0];
        out->cover.off[0] = R->off[0];
        out->cover.ext[0] = R->ext[0];
        out->shape.dim[0] = R->ext[0];
    } else {
        row = elem;
    }
    struct wb_rt_op *op = push_op(ts, WB_OP_H2D, t);
    if (!op)
        return -ENOMEM;
    op->h2d.src_off = a * row;
    op->h2d.bytes = n * row;
    op->h2d.dst_off = tmp_alloc(ts, n * row);
    ts->ro->h2d += n * row;
    out->kind = WB_BUF_TMP;
    out->tensor = 0;
    out->off = op->h2d.dst_off;
    return 0;
}

/* A transposed component's data in the permuted tensor's order: box R (permuted coordinates)
 * of view raw, which holds the tensor in the trainer's order (its shard, an H2D copy of rows
 * of it, or the gathered tensor), transposed into TMP by a PERMUTE op. Every op and write
 * after it reads the returned view, whose cover is R: the planner works in permuted
 * coordinates throughout, and this is the one place where the trainer's order meets them. */
static int permuted_view(struct tstate *ts, const struct icomp *ic, uint32_t t,
                         const struct sview *raw, const struct wb_box *R, struct sview *out)
{
    struct wb_box Rt = pl_unperm_box(R, ic->perm), src = box_rel(&Rt, &raw->cover);
    struct sview pv = sview_tmp(raw->dtype, R);
    pv.off = tmp_alloc(ts, wb_box_numel(R) * wb_dtype_size(raw->dtype));
    struct wb_box pf = wb_box_full(&pv.shape);
    struct wb_rt_op *op = push_op(ts, WB_OP_PERMUTE, t);
    if (!op)
        return -ENOMEM;
    op->permute.src = rtv(ts, raw);
    op->permute.src_box = bx(ts, &src);
    op->permute.dst = rtv(ts, &pv);
    op->permute.dst_box = bx(ts, &pf);
    op->permute.perm = pl_perm_pack(ic->perm, R->ndim);
    *out = pv;
    return 0;
}

/* The same piece for another replica, rollout rank g: the records [w0, w1) the piece's first
 * replica got fan out one copy further when g continues their rank progression (replicas come
 * in rising order, so a piece one rank writes to every replica is one record per write), else
 * they are copied with destination g. */
static int clone_writes(struct tstate *ts, size_t w0, size_t w1, uint32_t g)
{
    struct plan_ctx *c = ts->c;
    if (w0 == w1)
        return 0;
    struct wb_rt_write *first = VEC_AT(&ts->ro->writes, struct wb_rt_write, w0);
    uint32_t step = first->more ? first->rank_step : g - first->dst_rank;
    bool fan = g > first->dst_rank && (uint64_t)first->dst_rank + (first->more + 1ull) * step == g;
    if (!fan && pl_vec_reserve(&ts->ro->writes, w1 - w0))
        return -ENOMEM;
    for (size_t i = w0; i < w1; i++) {
        struct wb_rt_write *x = VEC_AT(&ts->ro->writes, struct wb_rt_write, i);
        if (fan) {
            x->more++;
            x->rank_step = step;
        } else {
            struct wb_rt_write w = *x;
            w.dst_rank = g;
            w.more = w.rank_step = 0;
            *VEC_AT(&ts->ro->writes, struct wb_rt_write, ts->ro->writes.n++) = w;
        }
        ts->write_bytes += x->len;
        ts->ro->send += x->len;
        ts->ro->nwrites++;
        size_t ri = (size_t)g * c->in->rollout->n + x->dst_tensor;
        c->recv[ri].bytes += x->len;
        c->recv[ri].writes++;
    }
    return 0;
}

/* The GATHER of trainer tensor t (this rank's shard Bt, the trainer's dim order) into a TMP
 * view of the whole tensor, *out. */
static int gather_view(struct tstate *ts, const struct item *it, const struct icomp *ic, uint32_t q,
                       const struct wb_box *Bt, uint32_t gather_seq, struct sview *out)
{
    struct plan_ctx *c = ts->c;
    uint32_t t = ic->t;
    const struct wb_param *p = &c->in->trainer->p[t];
    struct sview sv;
    int r;
    struct sview own;
    if (!wb_box_empty(Bt) || Bt->ndim == 0) {
        r = source_view(ts, t, Bt, Bt, &own);
    } else {
        own = (struct sview){WB_BUF_PARAM, t, 0, p->dtype, wb_box_shape(Bt), *Bt};
        r = 0;
    }
    if (r)
        return r;
    size_t elem = wb_dtype_size(p->dtype);
    struct wb_box full = wb_box_full(&p->shape);
    sv = sview_tmp(p->dtype, &full);
    sv.off = tmp_alloc(ts, wb_shape_numel(&p->shape) * elem);
    struct wb_rt_op *op = push_op(ts, WB_OP_GATHER, t);
    if (!op)
        return -ENOMEM;
    const struct tplace *tp = &c->pm->place[t];
    uint32_t nk = pl_place_nshards(c->pm, tp);
    op->gather.src = rtv(ts, &own);
    op->gather.dst = rtv(ts, &sv);
    op->gather.peer0 = (uint32_t)ts->ro->peers.n;
    op->gather.npeers = nk;
    op->gather.mesh = it->mesh;
    op->gather.seq = gather_seq;
    op->gather.bytes_in = (wb_shape_numel(&p->shape) - wb_box_numel(Bt)) * elem;
    ts->ro->gather_in += op->gather.bytes_in;
    const struct wb_rt_peer *pe = peers_of(ts, ic, q);
    if (!pe || pl_vec_reserve(&ts->ro->peers, nk))
        return -ENOMEM;
    memcpy(VEC_AT(&ts->ro->peers, struct wb_rt_peer, ts->ro->peers.n), pe, nk * sizeof(*pe));
    ts->ro->peers.n += nk;
    c->gathers++;
    ts->coll = true;
    if (ts->ngathered < WB_MAX_PIECES) {
        ts->gathered_t[ts->ngathered] = t;
        ts->gathered[ts->ngathered++] = sv;
    }
    *out = sv;
    return 0;
}

/* The view a component's pieces are read from: with gather, the whole tensor all-gathered
 * into temporary memory (a GATHER op); otherwise this rank's shard B, cut to the bounding box
 * R of what its pieces (SD[0..na)) and its amax exchanges (XM[0..nx)) need. */
static int component_source(struct tstate *ts, const struct item *it, uint32_t ci, uint32_t q,
                            const struct wb_box *Bp, const struct assign *A, const struct sd *SD,
                            size_t na, const uint32_t *XM, size_t nx, uint32_t gather_seq,
                            struct sview *out)
{
    struct plan_ctx *c = ts->c;
    const struct wb_mapping *mp = pl_ctx_map(c, it->mapping);
    uint32_t t = pl_item_comp(c, it, ci)->trainer;
    const struct icomp *ic = VEC_AT(&c->icomp, struct icomp, ci);
    const struct wb_shape *sh = ic->sh; /* permuted for a transposed component */
    bool gather = it->mode == WB_MODE_GATHER, fp8 = mp->xform == WB_XFORM_FP8_BLOCK;
    const struct wb_box B = *Bp;
    /* the shard as the trainer holds it (B is in permuted coordinates when transposed) */
    const struct wb_box Bt = ic->permuted ? pl_unperm_box(&B, ic->perm) : B;
    struct sview sv;
    int r;
    if (gather) {
        bool have = false;
        for (uint32_t k = 0; k < ts->ngathered && !have; k++)
            if (ts->gathered_t[k] == t) {
                sv = ts->gathered[k];
                have = true;
            }
        if (!have && (r = gather_view(ts, it, ic, q, &Bt, gather_seq, &sv)))
            return r;
        if (ic->permuted && na > 0) {
            /* the box its pieces need (whole FP8 blocks), transposed from the gathered
             * tensor: not all of it, which would double the task's memory */
            struct wb_box R = {.ndim = sh->ndim}, full = wb_box_full(sh);
            for (size_t i = 0; i < na; i++) {
                if (i > 0 && same_piece(&A[i], &A[i - 1]))
                    continue;
                struct wb_box need = SD[i].S;
                if (fp8) {
                    struct wb_box bl = pl_box_blocks(&SD[i].S), e = pl_blocks_elems(&bl, sh);
                    wb_box_intersect(&e, &full, &need);
                }
                R = box_bbox(&R, &need);
            }
            struct sview raw = sv;
            if ((r = permuted_view(ts, ic, t, &raw, &R, &sv)))
                return r;
        }
    } else {
        struct wb_box R = {.ndim = B.ndim};
        for (size_t i = 0; i < na; i++) {
            if (i > 0 && same_piece(&A[i], &A[i - 1]))
                continue;
            struct wb_box need = SD[i].S;
            if (fp8) {
                struct wb_box bl = pl_box_blocks(&SD[i].S), e = pl_blocks_elems(&bl, sh);
                wb_box_intersect(&e, &B, &need);
            }
            R = box_bbox(&R, &need);
        }
        for (size_t i = 0; i < nx; i++) {
            const struct xchg *x = VEC_AT(&c->xc, struct xchg, XM[i]);
            struct wb_box e = pl_blocks_elems(&x->blocks, sh), need;
            wb_box_intersect(&e, &B, &need);
            R = box_bbox(&R, &need);
        }
        if (ic->permuted) {
            struct wb_box Rt = pl_unperm_box(&R, ic->perm);
            struct sview raw;
            r = source_view(ts, t, &Bt, &Rt, &raw);
            if (!r)
                r = permuted_view(ts, ic, t, &raw, &R, &sv);
        } else {
            r = source_view(ts, t, &B, &R, &sv);
        }
        if (r)
            return r;
    }

    *out = sv;
    return 0;
}

/* A BF16 (or cast) component's writes: each distinct piece written from sv (through a CAST
 * into a packed buffer where the dtypes differ), a piece repeated for another rollout rank
 * cloned from the last one's writes. */
static int component_writes(struct tstate *ts, const struct item *it, uint32_t t,
                            const struct sview *svp, const struct assign *A, const struct sd *SD,
                            size_t na)
{
    struct plan_ctx *c = ts->c;
    const struct wb_mapping *mp = pl_ctx_map(c, it->mapping);
    const struct wb_param *p = &c->in->trainer->p[t];
    const struct wb_shape *lshape;
    const struct sview sv = *svp;
    int r;
    size_t pw0 = 0, pw1 = 0;
    for (size_t i = 0; i < na; i++) {
        if (i > 0 && same_piece(&A[i], &A[i - 1])) {
            if ((r = clone_writes(ts, pw0, pw1, A[i].g)))
                return r;
            continue;
        }
        pw0 = ts->ro->writes.n;
        lshape = &c->rloc[it->mapping * c->gpr + A[i].g % c->gpr].shape;
        struct sview src = sv;
        if (p->dtype != mp->dst_dtype) { /* CAST into a packed buffer */
            size_t de = wb_dtype_size(mp->dst_dtype);
            src = sview_tmp(mp->dst_dtype, &SD[i].S);
            src.off = tmp_alloc(ts, wb_box_numel(&SD[i].S) * de);
            struct wb_box sb = box_rel(&SD[i].S, &sv.cover), db = wb_box_full(&src.shape);
            struct wb_rt_op *op = push_op(ts, WB_OP_CAST, t);
            if (!op)
                return -ENOMEM;
            op->copy.src = rtv(ts, &sv);
            op->copy.src_box = bx(ts, &sb);
            op->copy.dst = rtv(ts, &src);
            op->copy.dst_box = bx(ts, &db);
        }
        r = emit_writes(ts, &src, &SD[i].S, A[i].g, mp->rollout, lshape, &SD[i].D, t);
        if (r)
            return r;
        pw1 = ts->ro->writes.n;
    }
    return 0;
}

/* An FP8 component: the amax exchanges, the shared quantization, each piece's own where it
 * needs none, and the writes of values and scales. */
static int component_fp8(struct tstate *ts, const struct item *it, const struct icomp *ic,
                         const struct wb_box *Bp, const struct sview *svp, const struct assign *A,
                         const struct sd *SD, size_t na, const uint32_t *XM, size_t nx)
{
    struct plan_ctx *c = ts->c;
    const struct wb_mapping *mp = pl_ctx_map(c, it->mapping);
    uint32_t t = ic->t;
    const struct wb_shape *sh = ic->sh; /* permuted for a transposed component */
    const struct wb_inventory *ri = c->in->rollout;
    const struct wb_shape *lshape, *lscale;
    const struct wb_box B = *Bp;
    const struct sview sv = *svp;
    int r;

    /* FP8: after the amax exchanges, one quantization over the blocks of the pieces that
     * share it, and one of each distinct piece quantized on its own (own_quant). */
    struct wb_box W = {.ndim = sh->ndim};
    size_t nshared = 0;
    for (size_t i = 0; i < na; i++) {
        if (i > 0 && same_piece(&A[i], &A[i - 1]))
            continue;
        if (nx == 0 && own_quant(&SD[i].S, &sv.cover, sh))
            continue;
        struct wb_box bl = pl_box_blocks(&SD[i].S), e = pl_blocks_elems(&bl, sh), w;
        wb_box_intersect(&e, &sv.cover, &w);
        W = box_bbox(&W, &w);
        nshared++;
    }
    struct wb_box grid = pl_box_blocks(&W);
    if (nshared == 0) {
        memset(&grid, 0, sizeof(grid));
        grid.ndim = sh->ndim;
    }
    uint64_t amax_off = (uint64_t)WB_RT_NONE;
    if (nx && na)
        amax_off = tmp_alloc(ts, wb_box_numel(&grid) * 4);
    /* one AMAX op per distinct block box, with every peer that shares exactly those blocks
     * (an expert's 64-way FSDP shard: its 3 fellow owners of a 128-row block row) */
    for (size_t i = 0; i < nx; i++) {
        const struct xchg *x = VEC_AT(&c->xc, struct xchg, XM[i]);
        bool first = true;
        for (size_t j = 0; j < i && first; j++)
            first = !wb_box_eq(&VEC_AT(&c->xc, struct xchg, XM[j])->blocks, &x->blocks);
        if (!first)
            continue;
        struct wb_rt_op *op = push_op(ts, WB_OP_AMAX, t);
        if (!op)
            return -ENOMEM;
        struct wb_box e = pl_blocks_elems(&x->blocks, sh), reg;
        wb_box_intersect(&e, &B, &reg);
        struct wb_box rel = box_rel(&reg, &sv.cover);
        uint32_t x0 = (uint32_t)ts->ro->apeers.n; /* own rows; peer0 counts a lazy plan's */
        op->amax.peer0 = x0 + ts->ro->vapeers;    /* segments' too, as the table expanded */
        op->amax.src = rtv(ts, &sv);
        op->amax.src_box = bx(ts, &rel);
        op->amax.region = bx(ts, &reg);
        op->amax.blocks = bx(ts, &x->blocks);
        op->amax.amax_off = amax_off;
        op->amax.grid = bx(ts, &grid);
        for (size_t j = i; j < nx; j++) {
            const struct xchg *y = VEC_AT(&c->xc, struct xchg, XM[j]);
            if (j > i && !wb_box_eq(&y->blocks, &x->blocks))
                continue;
            bool me_a = y->a == ts->rank;
            struct wb_rt_amax_peer pe = {me_a ? y->b : y->a, y->tag, me_a ? y->slot_b : y->slot_a,
                                         me_a ? y->slot_a : y->slot_b};
            if (!pl_vec_push(&ts->ro->apeers, &pe))
                return -ENOMEM;
        }
        op->amax.npeers = (uint32_t)ts->ro->apeers.n - x0;
        c->amax_ops++;
        ts->coll = true;
    }
    if (na == 0)
        return 0;
    struct sview qv = sview_tmp(WB_DTYPE_FP8_E4M3, &W), sc = sview_tmp(WB_DTYPE_FP32, &grid);
    if (nshared) {
        qv.off = tmp_alloc(ts, wb_box_numel(&W));
        sc.off = tmp_alloc(ts, wb_box_numel(&grid) * 4);
        if ((r = push_quant(ts, t, &sv, &qv, &W, &grid, sc.off, amax_off)))
            return r;
    }
    struct own_q own[OWN_Q_CACHE];
    size_t nown = 0;
    size_t pw0 = 0, pw1 = 0;
    for (size_t i = 0; i < na; i++) {
        if (i > 0 && same_piece(&A[i], &A[i - 1])) {
            if ((r = clone_writes(ts, pw0, pw1, A[i].g)))
                return r;
            continue;
        }
        pw0 = ts->ro->writes.n;
        const struct rlocal *lo = &c->rloc[it->mapping * c->gpr + A[i].g % c->gpr];
        lshape = &lo->shape;
        lscale = &lo->scale_shape;
        if (!blocks_aligned(&SD[i].S, &SD[i].D)) {
            char a[160], b[160];
            wb_errlist_add(c->el,
                           "%s: FP8 blocks of trainer box %s do not fall on 128 block edges of "
                           "rollout rank %u's local box %s",
                           ri->p[mp->rollout].name, wb_box_str(&SD[i].S, a, sizeof(a)), A[i].g,
                           wb_box_str(&SD[i].D, b, sizeof(b)));
            return -WB_E_PLAN;
        }
        const struct sview *vq = &qv, *vs = &sc;
        if (nx == 0 && own_quant(&SD[i].S, &sv.cover, sh)) {
            const struct own_q *o;
            if ((r = own_quant_view(ts, &sv, t, &SD[i].S, own, &nown, &o)))
                return r;
            vq = &o->qv;
            vs = &o->sc;
        }
        r = emit_writes(ts, vq, &SD[i].S, A[i].g, mp->rollout, lshape, &SD[i].D, t);
        struct wb_box Sb, Db;
        if (!r && scale_boxes(&SD[i].S, &SD[i].D, &Sb, &Db))
            r = emit_writes(ts, vs, &Sb, A[i].g, (uint32_t)mp->scale, lscale, &Db, t);
        if (r)
            return r;
        pw1 = ts->ro->writes.n;
    }
    return 0;
}

static int emit_component(struct tstate *ts, const struct item *it, uint32_t ci,
                          const struct assign *A, const struct sd *SD, size_t na,
                          uint32_t gather_seq)
{
    struct plan_ctx *c = ts->c;
    const struct wb_mapping *mp = pl_ctx_map(c, it->mapping);
    const struct wb_component *cp = pl_item_comp(c, it, ci);
    uint32_t t = cp->trainer;
    bool gather = it->mode == WB_MODE_GATHER, fp8 = mp->xform == WB_XFORM_FP8_BLOCK;
    uint32_t k, q;
    if (!pl_rank_shard(c, t, ts->rank, &k, &q))
        return 0;
    const struct icomp *ic = VEC_AT(&c->icomp, struct icomp, ci);
    const struct wb_box B = *VEC_AT(&c->ibox, struct wb_box, ic->b0 + k);
    /* exchanges this rank takes part in for this component (xc is sorted by component) */
    size_t x0 = 0;
    while (x0 < c->xc.n && VEC_AT(&c->xc, struct xchg, x0)->ci < ci)
        x0++;
    c->xmine.n = 0;
    for (size_t i = x0; i < c->xc.n && VEC_AT(&c->xc, struct xchg, i)->ci == ci; i++) {
        const struct xchg *x = VEC_AT(&c->xc, struct xchg, i);
        uint32_t xi = (uint32_t)i;
        if ((x->a == ts->rank || x->b == ts->rank) && !pl_vec_push(&c->xmine, &xi))
            return -ENOMEM;
    }
    size_t nx = c->xmine.n;
    const uint32_t *XM = c->xmine.p;
    if (!gather && na == 0 && nx == 0)
        return 0;

    struct sview sv;
    int r = component_source(ts, it, ci, q, &B, A, SD, na, XM, nx, gather_seq, &sv);
    if (r)
        return r;
    if (!fp8)
        return component_writes(ts, it, t, &sv, A, SD, na);
    return component_fp8(ts, it, ic, &B, &sv, A, SD, na, XM, nx);
}

int pl_emit_item(struct plan_ctx *c, uint32_t ii)
{
    const struct item *it = VEC_AT(&c->items, struct item, ii);
    int r = sort_asg(c);
    if (r)
        return r;
    r = plan_exchanges(c, it);
    if (r)
        return r;
    /* ranks with a task: mesh members (gather), else writers and exchange partners */
    const struct mesh_int *mesh = VEC_AT(&c->meshes, struct mesh_int, it->mesh);
    uint64_t *want = calloc(c->words, sizeof(uint64_t));
    if (!want)
        return -ENOMEM;
    if (it->mode == WB_MODE_GATHER) {
        memcpy(want, mesh->bits, c->words * sizeof(uint64_t));
    } else {
        for (size_t i = 0; i < c->asg.n; i++) {
            uint32_t rk = VEC_AT(&c->asg, struct assign, i)->rank;
            want[rk / 64] |= 1ull << (rk % 64);
        }
        for (size_t i = 0; i < c->xc.n; i++) {
            const struct xchg *x = VEC_AT(&c->xc, struct xchg, i);
            want[x->a / 64] |= 1ull << (x->a % 64);
            want[x->b / 64] |= 1ull << (x->b % 64);
        }
    }
    uint32_t seq0 = c->gather_seq[it->mesh];
    if (it->mode == WB_MODE_GATHER)
        c->gather_seq[it->mesh] += it->nc;
    const struct assign *A = c->asg.p;
    size_t ai = 0;
    for (uint32_t rank = 0; rank < c->nt && !r; rank++) {
        if (!(want[rank / 64] >> (rank % 64) & 1) || !owns(c, rank))
            continue;
        while (ai < c->asg.n && A[ai].rank < rank)
            ai++;
        struct rank_out *ro = &c->ro[rank];
        struct tstate ts = {.c = c, .ro = ro, .rank = rank};
        struct wb_rt_task task = {
            .mapping = it->mapping,
            .item = ii,
            .phase = it->phase,
            .mesh = it->mesh,
            .mode = it->mode,
        };
        uint32_t op0 = (uint32_t)ro->ops.n, w0 = (uint32_t)ro->writes.n; /* own rows */
        size_t a = ai;
        for (uint32_t ci = 0; ci < it->nc && !r; ci++) {
            size_t z = a;
            while (z < c->asg.n && A[z].rank == rank && A[z].ci == ci)
                z++;
            c->sd.n = 0;
            if (pl_vec_reserve(&c->sd, z - a)) {
                r = -ENOMEM;
                break;
            }
            for (size_t k = a; k < z; k++, c->sd.n++) {
                struct sd *x = VEC_AT(&c->sd, struct sd, c->sd.n);
                if (k > a && same_piece(&A[k], &A[k - 1]))
                    *x = x[-1]; /* another replica of the same piece */
                else
                    pl_asg_boxes(c, it, &A[k], x);
            }
            r = emit_component(&ts, it, ci, A + a, c->sd.p, z - a, seq0 + ci);
            a = z;
        }
        if (r)
            break;
        task.op0 = op0 + ro->vops; /* as in the table expanded (lazy segments before it) */
        task.write0 = w0 + ro->vwrites;
        task.nops = (uint32_t)ro->ops.n - op0;
        task.nwrites = (uint32_t)ro->writes.n - w0;
        if (task.nops == 0 && task.nwrites == 0)
            continue;
        for (uint32_t o = op0; o < ro->ops.n; o++)
            if (VEC_AT(&ro->ops, struct wb_rt_op, o)->kind == WB_OP_AMAX)
                task.mode = WB_MODE_AMAX;
        task.tmp_bytes = ts.tmp;
        task.write_bytes = ts.write_bytes;
        if (ts.coll)
            c->phase_coll[it->phase] = true;
        if (!pl_vec_push(&ro->tasks, &task))
            r = -ENOMEM;
    }
    free(want);
    return r;
}
