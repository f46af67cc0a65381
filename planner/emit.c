/* emit.c — turns one item's assignments (which rank sends which trainer box to which rollout
 * box) into routing-table tasks: stage ops and writes.
 *
 * Per rank and component the task gets: an H2D of the rows it needs (host residence), then
 * either a GATHER (gather mode) or nothing (direct), then the transform — writes straight from
 * the source when the bytes already match (BF16 -> BF16), a CAST, or a QUANT preceded by AMAX
 * exchanges for blocks that straddle its shard — and finally the writes: each maximal run that
 * is contiguous on both sides becomes one write; when the source runs are much shorter than
 * the destination's, the box is first packed (COPY) so that writes follow the destination. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "planner/build.h"

enum { TMP_ALIGN = 256, AMAX_ALIGN = 16 };

/* A view plus the tensor box its element (0,..,0) .. shape covers. */
struct sview {
    struct wb_rt_view v;
    struct wb_box cover;
};

struct tstate {
    struct plan_ctx *c;
    struct rank_out *ro;
    uint32_t rank;
    uint64_t tmp;
    uint64_t write_bytes;
    bool coll;
};

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
    struct wb_rt_op *op = vec_push(&ts->ro->ops, NULL);
    if (op) {
        op->kind = kind;
        op->tensor = tensor;
    }
    return op;
}

/* Writes for tensor box S of view sv to box D of a rollout local tensor. */
static int emit_writes(struct tstate *ts, const struct sview *sv, const struct wb_box *S,
                       uint32_t g, uint32_t dst_tensor, const struct wb_shape *dshape,
                       const struct wb_box *D, uint32_t tensor)
{
    struct plan_ctx *c = ts->c;
    size_t elem = wb_dtype_size(sv->v.dtype);
    struct wb_box Sv = box_rel(S, &sv->cover);
    struct wb_ranges rs, rd;
    if (wb_ranges_init(&rs, &sv->v.shape, &Sv, elem) || wb_ranges_init(&rd, dshape, D, elem)) {
        char a[160], b[160];
        wb_errlist_add(c->el, "internal: write box %s of %s outside its view or destination %s",
                       wb_box_str(S, a, sizeof(a)), c->in->trainer->p[tensor].name,
                       wb_box_str(D, b, sizeof(b)));
        return -WB_E_PLAN;
    }
    uint64_t ns = wb_ranges_count(&rs), nd = wb_ranges_count(&rd);
    if (ns == 0)
        return 0;
    if (ns > 16 && ns > 4 * nd) { /* pack first so that writes follow the destination */
        struct sview pk = {.cover = *S};
        pk.v = (struct wb_rt_view){WB_BUF_TMP, 0, 0, sv->v.dtype, wb_box_shape(S)};
        pk.v.off = tmp_alloc(ts, wb_box_numel(S) * elem);
        struct wb_rt_op *op = push_op(ts, WB_OP_COPY, tensor);
        if (!op)
            return -ENOMEM;
        op->copy.src = sv->v;
        op->copy.src_box = Sv;
        op->copy.dst = pk.v;
        op->copy.dst_box = wb_box_full(&pk.v.shape);
        return emit_writes(ts, &pk, S, g, dst_tensor, dshape, D, tensor);
    }
    uint64_t so = 0, sl = 0, dof = 0, dl = 0;
    bool param = sv->v.kind == WB_BUF_PARAM;
    for (;;) {
        if (sl == 0 && !wb_ranges_next(&rs, &so, &sl))
            break;
        if (dl == 0 && !wb_ranges_next(&rd, &dof, &dl))
            break;
        uint64_t len = sl < dl ? sl : dl;
        struct wb_rt_write w = {
            .src_off = sv->v.off + so,
            .dst_off = dof,
            .len = len,
            .src_tensor = param ? sv->v.tensor : (uint32_t)WB_RT_TMP_SRC,
            .dst_rank = g,
            .dst_tensor = dst_tensor,
            .tag = dst_tensor + 1,
        };
        if (!vec_push(&ts->ro->writes, &w))
            return -ENOMEM;
        ts->write_bytes += len;
        ts->ro->send += len;
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
    *Sb = origin_blocks(S);
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
        uint64_t q = qblock(D->ndim, jd);
        uint64_t delta = D->off[jd] - S->off[j]; /* may wrap; only its quotient is used */
        Db->off[jd] = Sb->off[j] + delta / q;
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

static int cmp_asg(const void *a, const void *b)
{
    const struct assign *x = a, *y = b;
    if (x->rank != y->rank)
        return x->rank < y->rank ? -1 : 1;
    if (x->ci != y->ci)
        return x->ci < y->ci ? -1 : 1;
    if (x->g != y->g)
        return x->g < y->g ? -1 : 1;
    for (uint32_t d = 0; d < x->S.ndim; d++)
        if (x->S.off[d] != y->S.off[d])
            return x->S.off[d] < y->S.off[d] ? -1 : 1;
    return 0;
}

/* Amax exchanges of a direct FP8 item: for every (component, replica) in which some writer's
 * blocks straddle its shard, every pair of shards sharing blocks swaps partial amax. */
static int plan_exchanges(struct plan_ctx *c, const struct item *it)
{
    c->xc.n = 0;
    const struct wb_mapping *mp = ctx_map(c, it->mapping);
    if (it->mode == WB_MODE_GATHER || mp->xform != WB_XFORM_FP8_BLOCK)
        return 0;
    struct vec need; /* uint32_t pairs (ci, q) */
    vec_init(&need, 2 * sizeof(uint32_t));
    const struct assign *A = c->asg.p;
    for (size_t i = 0; i < c->asg.n; i++) {
        uint32_t t = item_comp(c, it, A[i].ci)->trainer;
        struct wb_box B;
        uint32_t k, q;
        if (!rank_box(c, t, A[i].rank, &B, &k, &q))
            continue;
        struct wb_box bl = box_blocks(&A[i].S);
        struct wb_box e = blocks_elems(&bl, &c->in->trainer->p[t].shape);
        if (wb_box_contains(&B, &e))
            continue;
        uint32_t key[2] = {A[i].ci, q};
        bool dup = false;
        for (size_t j = 0; j < need.n && !dup; j++)
            dup = memcmp(VEC_AT(&need, uint32_t, 2 * j), key, sizeof(key)) == 0;
        if (!dup && !vec_push(&need, key)) {
            vec_free(&need);
            return -ENOMEM;
        }
    }
    for (size_t j = 0; j < need.n; j++) {
        uint32_t ci = *VEC_AT(&need, uint32_t, 2 * j), q = *VEC_AT(&need, uint32_t, 2 * j + 1);
        uint32_t t = item_comp(c, it, ci)->trainer;
        const struct tplace *tp = &c->pm->place[t];
        const struct wb_shape *sh = &c->in->trainer->p[t].shape;
        uint32_t nk = place_nshards(c->pm, tp);
        for (uint32_t a = 0; a < nk; a++) {
            struct wb_box Ba = place_shard_box(c->pm, tp, sh, a);
            if (wb_box_empty(&Ba))
                continue;
            struct wb_box ga = box_blocks(&Ba);
            for (uint32_t b = a + 1; b < nk; b++) {
                struct wb_box Bb = place_shard_box(c->pm, tp, sh, b), X;
                if (wb_box_empty(&Bb))
                    continue;
                struct wb_box gb = box_blocks(&Bb);
                if (!wb_box_intersect(&ga, &gb, &X))
                    continue;
                struct xchg x = {.ci = ci, .blocks = X, .tag = ++c->next_tag};
                x.a = place_shard_rank(c->pm, tp, a, q);
                x.b = place_shard_rank(c->pm, tp, b, q);
                uint64_t bytes = wb_box_numel(&X) * 4;
                uint64_t al = (bytes + AMAX_ALIGN - 1) / AMAX_ALIGN * AMAX_ALIGN;
                x.slot_a = c->ro[x.a].inbox;
                c->ro[x.a].inbox += al;
                x.slot_b = c->ro[x.b].inbox;
                c->ro[x.b].inbox += al;
                struct wb_rt_expect ea = {x.tag, UINT32_MAX, bytes, 1};
                if (!vec_push(&c->xc, &x) || !vec_push(&c->ro[x.a].amax, &ea) ||
                    !vec_push(&c->ro[x.b].amax, &ea)) {
                    vec_free(&need);
                    return -ENOMEM;
                }
            }
        }
    }
    vec_free(&need);
    return 0;
}

/* The source view of rank ts->rank's shard B of tensor t covering at least region R. */
static int source_view(struct tstate *ts, uint32_t t, const struct wb_box *B,
                       const struct wb_box *R, struct sview *out)
{
    const struct wb_param *p = &ts->c->in->trainer->p[t];
    size_t elem = wb_dtype_size(p->dtype);
    out->cover = *B;
    out->v = (struct wb_rt_view){WB_BUF_PARAM, t, 0, p->dtype, wb_box_shape(B)};
    if (ts->c->in->tl->residence != WB_RESIDE_HOST)
        return 0;
    uint64_t row = 1, a = 0, n = 1;
    if (B->ndim) {
        row = wb_box_numel(B) / (B->ext[0] ? B->ext[0] : 1) * elem;
        a = R->off[0] - B->off[0];
        n = R->ext[0];
        out->cover.off[0] = R->off[0];
        out->cover.ext[0] = R->ext[0];
        out->v.shape.dim[0] = R->ext[0];
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
    out->v.kind = WB_BUF_TMP;
    out->v.tensor = 0;
    out->v.off = op->h2d.dst_off;
    return 0;
}

static int emit_component(struct tstate *ts, const struct item *it, uint32_t ci,
                          const struct assign *A, size_t na, uint32_t gather_seq)
{
    struct plan_ctx *c = ts->c;
    const struct wb_mapping *mp = ctx_map(c, it->mapping);
    const struct wb_component *cp = item_comp(c, it, ci);
    uint32_t t = cp->trainer;
    const struct wb_param *p = &c->in->trainer->p[t];
    const struct wb_shape *sh = &p->shape;
    bool gather = it->mode == WB_MODE_GATHER, fp8 = mp->xform == WB_XFORM_FP8_BLOCK;
    struct wb_box B;
    uint32_t k, q;
    if (!rank_box(c, t, ts->rank, &B, &k, &q))
        return 0;
    /* exchanges this rank takes part in for this component */
    size_t nx = 0;
    for (size_t i = 0; i < c->xc.n; i++) {
        const struct xchg *x = VEC_AT(&c->xc, struct xchg, i);
        nx += x->ci == ci && (x->a == ts->rank || x->b == ts->rank);
    }
    if (!gather && na == 0 && nx == 0)
        return 0;

    struct sview sv;
    int r;
    if (gather) {
        struct sview own;
        if (!wb_box_empty(&B) || B.ndim == 0) {
            r = source_view(ts, t, &B, &B, &own);
        } else {
            own.cover = B;
            own.v = (struct wb_rt_view){WB_BUF_PARAM, t, 0, p->dtype, wb_box_shape(&B)};
            r = 0;
        }
        if (r)
            return r;
        size_t elem = wb_dtype_size(p->dtype);
        sv.cover = wb_box_full(sh);
        sv.v = (struct wb_rt_view){WB_BUF_TMP, 0, 0, p->dtype, *sh};
        sv.v.off = tmp_alloc(ts, wb_shape_numel(sh) * elem);
        struct wb_rt_op *op = push_op(ts, WB_OP_GATHER, t);
        if (!op)
            return -ENOMEM;
        const struct tplace *tp = &c->pm->place[t];
        uint32_t nk = place_nshards(c->pm, tp);
        op->gather.src = own.v;
        op->gather.dst = sv.v;
        op->gather.peer0 = (uint32_t)ts->ro->peers.n;
        op->gather.npeers = nk;
        op->gather.mesh = it->mesh;
        op->gather.seq = gather_seq;
        op->gather.bytes_in = (wb_shape_numel(sh) - wb_box_numel(&B)) * elem;
        ts->ro->gather_in += op->gather.bytes_in;
        for (uint32_t s = 0; s < nk; s++) {
            struct wb_rt_peer pe = {place_shard_rank(c->pm, tp, s, q),
                                    place_shard_box(c->pm, tp, sh, s)};
            if (!vec_push(&ts->ro->peers, &pe))
                return -ENOMEM;
        }
        c->gathers++;
        ts->coll = true;
    } else {
        struct wb_box R = {.ndim = B.ndim};
        for (size_t i = 0; i < na; i++) {
            struct wb_box need = A[i].S;
            if (fp8) {
                struct wb_box bl = box_blocks(&A[i].S), e = blocks_elems(&bl, sh);
                wb_box_intersect(&e, &B, &need);
            }
            R = box_bbox(&R, &need);
        }
        for (size_t i = 0; i < c->xc.n; i++) {
            const struct xchg *x = VEC_AT(&c->xc, struct xchg, i);
            if (x->ci != ci || (x->a != ts->rank && x->b != ts->rank))
                continue;
            struct wb_box e = blocks_elems(&x->blocks, sh), need;
            wb_box_intersect(&e, &B, &need);
            R = box_bbox(&R, &need);
        }
        r = source_view(ts, t, &B, &R, &sv);
        if (r)
            return r;
    }

    const struct wb_inventory *ri = c->in->rollout;
    const struct wb_shape *lshape = NULL, *lscale = NULL;
    if (!fp8) {
        for (size_t i = 0; i < na; i++) {
            lshape = &c->rloc[it->mapping * c->gpr + A[i].g % c->gpr].shape;
            struct sview src = sv;
            if (p->dtype != mp->dst_dtype) { /* CAST into a packed buffer */
                size_t de = wb_dtype_size(mp->dst_dtype);
                src.cover = A[i].S;
                src.v = (struct wb_rt_view){WB_BUF_TMP, 0, 0, mp->dst_dtype, wb_box_shape(&A[i].S)};
                src.v.off = tmp_alloc(ts, wb_box_numel(&A[i].S) * de);
                struct wb_rt_op *op = push_op(ts, WB_OP_CAST, t);
                if (!op)
                    return -ENOMEM;
                op->copy.src = sv.v;
                op->copy.src_box = box_rel(&A[i].S, &sv.cover);
                op->copy.dst = src.v;
                op->copy.dst_box = wb_box_full(&src.v.shape);
            }
            r = emit_writes(ts, &src, &A[i].S, A[i].g, mp->rollout, lshape, &A[i].D, t);
            if (r)
                return r;
        }
        return 0;
    }

    /* FP8: one quantization over the blocks this rank writes, after the amax exchanges. */
    struct wb_box W = {.ndim = sh->ndim};
    for (size_t i = 0; i < na; i++) {
        struct wb_box bl = box_blocks(&A[i].S), e = blocks_elems(&bl, sh), w;
        wb_box_intersect(&e, &sv.cover, &w);
        W = box_bbox(&W, &w);
    }
    struct wb_box grid = box_blocks(&W);
    if (na == 0)
        memset(&grid, 0, sizeof(grid)), grid.ndim = sh->ndim;
    uint64_t amax_off = (uint64_t)WB_RT_NONE;
    if (nx && na)
        amax_off = tmp_alloc(ts, wb_box_numel(&grid) * 4);
    for (size_t i = 0; i < c->xc.n; i++) {
        const struct xchg *x = VEC_AT(&c->xc, struct xchg, i);
        if (x->ci != ci || (x->a != ts->rank && x->b != ts->rank))
            continue;
        bool me_a = x->a == ts->rank;
        struct wb_rt_op *op = push_op(ts, WB_OP_AMAX, t);
        if (!op)
            return -ENOMEM;
        struct wb_box e = blocks_elems(&x->blocks, sh), reg;
        wb_box_intersect(&e, &B, &reg);
        op->amax.peer = me_a ? x->b : x->a;
        op->amax.tag = x->tag;
        op->amax.src = sv.v;
        op->amax.src_box = box_rel(&reg, &sv.cover);
        op->amax.region = reg;
        op->amax.blocks = x->blocks;
        op->amax.inbox_off = me_a ? x->slot_a : x->slot_b;
        op->amax.peer_inbox_off = me_a ? x->slot_b : x->slot_a;
        op->amax.amax_off = amax_off;
        op->amax.grid = grid;
        c->amax_ops++;
        ts->coll = true;
    }
    if (na == 0)
        return 0;
    struct sview qv = {.cover = W}, sc = {.cover = grid};
    qv.v = (struct wb_rt_view){WB_BUF_TMP, 0, 0, WB_DTYPE_FP8_E4M3, wb_box_shape(&W)};
    qv.v.off = tmp_alloc(ts, wb_box_numel(&W));
    sc.v = (struct wb_rt_view){WB_BUF_TMP, 0, 0, WB_DTYPE_FP32, wb_box_shape(&grid)};
    sc.v.off = tmp_alloc(ts, wb_box_numel(&grid) * 4);
    struct wb_rt_op *op = push_op(ts, WB_OP_QUANT, t);
    if (!op)
        return -ENOMEM;
    op->quant.src = sv.v;
    op->quant.dst = qv.v;
    op->quant.src_box = box_rel(&W, &sv.cover);
    op->quant.region = W;
    op->quant.grid = grid;
    op->quant.scale_off = sc.v.off;
    op->quant.amax_off = amax_off;
    for (size_t i = 0; i < na; i++) {
        const struct rlocal *lo = &c->rloc[it->mapping * c->gpr + A[i].g % c->gpr];
        lshape = &lo->shape;
        lscale = &lo->scale_shape;
        if (!blocks_aligned(&A[i].S, &A[i].D)) {
            char a[160], b[160];
            wb_errlist_add(c->el,
                           "%s: FP8 blocks of trainer box %s do not fall on 128 block edges of "
                           "rollout rank %u's local box %s",
                           ri->p[mp->rollout].name, wb_box_str(&A[i].S, a, sizeof(a)), A[i].g,
                           wb_box_str(&A[i].D, b, sizeof(b)));
            return -WB_E_PLAN;
        }
        r = emit_writes(ts, &qv, &A[i].S, A[i].g, mp->rollout, lshape, &A[i].D, t);
        struct wb_box Sb, Db;
        if (!r && scale_boxes(&A[i].S, &A[i].D, &Sb, &Db))
            r = emit_writes(ts, &sc, &Sb, A[i].g, (uint32_t)mp->scale, lscale, &Db, t);
        if (r)
            return r;
    }
    return 0;
}

int emit_item(struct plan_ctx *c, uint32_t ii)
{
    const struct item *it = VEC_AT(&c->items, struct item, ii);
    qsort(c->asg.p, c->asg.n, sizeof(struct assign), cmp_asg);
    int r = plan_exchanges(c, it);
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
        if (!(want[rank / 64] >> (rank % 64) & 1))
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
            .op0 = (uint32_t)ro->ops.n,
            .write0 = (uint32_t)ro->writes.n,
        };
        size_t a = ai;
        for (uint32_t ci = 0; ci < it->nc && !r; ci++) {
            size_t z = a;
            while (z < c->asg.n && A[z].rank == rank && A[z].ci == ci)
                z++;
            r = emit_component(&ts, it, ci, A + a, z - a, seq0 + ci);
            a = z;
        }
        if (r)
            break;
        task.nops = (uint32_t)ro->ops.n - task.op0;
        task.nwrites = (uint32_t)ro->writes.n - task.write0;
        if (task.nops == 0 && task.nwrites == 0)
            continue;
        for (uint32_t o = task.op0; o < ro->ops.n; o++)
            if (VEC_AT(&ro->ops, struct wb_rt_op, o)->kind == WB_OP_AMAX)
                task.mode = WB_MODE_AMAX;
        task.tmp_bytes = ts.tmp;
        task.write_bytes = ts.write_bytes;
        if (ts.coll)
            c->phase_coll[it->phase] = true;
        if (!vec_push(&ro->tasks, &task))
            r = -ENOMEM;
    }
    free(want);
    return r;
}
