/* stamp.c — templates: an item congruent to an earlier one is stamped out from that one's
 * output instead of being walked and emitted again.
 *
 * A 1T-parameter MoE model has tens of thousands of expert tensors that differ only in their
 * index: same shapes, dtypes and placement rule, owners shifted by a constant rank offset (the
 * expert's EP coordinate, the layer's pipeline stage), rollout pieces shifted by a constant
 * local rank (the rollout EP rank). Walking and emitting each one costs box arithmetic per
 * (component, shard, rollout GPU); stamping costs one copy per op and write.
 *
 * Two items X (the representative, first in plan order) and Y are congruent when
 *  - they have the same mode, and their mappings the same transform, destination dtype and
 *    scale presence;
 *  - component by component, the trainer tensors have the same shape, dtype and placement rule,
 *    and the fixed mesh coordinates (layer, expert, index dims) differ by the same rank offset
 *    dr for every component (so Y's owners are X's plus dr, shard for shard);
 *  - their subpieces are equal (component, trainer box S, local box D) with local ranks shifted
 *    by a constant dl, and the rollout local shapes at l and l + dl are equal.
 * Every step of planning is then equivariant: Y's demands are X's with ranks + dr and rollout
 * GPUs + dl. When X has only fixed demands (one candidate each, no balancing: the usual case
 * for FSDP-sharded experts), Y's assignment follows, and Y's pass-1 contribution (base loads,
 * candidate sets, counters) and pass-3 output (tasks, ops, writes, peers, amax exchanges) are
 * X's with ranks, rollout GPUs, trainer tensors, rollout tensors, tags, inbox offsets and
 * interned box/shape indices renumbered. Boxes and shapes are interned into Y's ranks in the
 * order X first used them, so the tables come out identical to an un-stamped build (the unit
 * test planner_stamp_test checks that, and wb_plan_verify checks the shipped scenarios).
 * Items with balanced demands are walked and emitted as before. The renumbering is a segment
 * (lazy.c): an eager build expands it into Y's tables here, a lazy one keeps it as it is.
 *
 * plan.c classifies the items and runs pass 1 through it, walk.c logs candidate sets to it, and
 * emit_threads.c runs pass 3 through it; it uses only balance.c, geometry.c and lazy.c. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "planner/build.h"

/* A representative item and what is recorded of it. */
struct stamp_rep {
    uint32_t item;
    uint64_t sig;
    int32_t next; /* next representative with the same hash slot, or -1 */
    uint32_t sub0, nsub;
    uint32_t tens0; /* nc (tensor, component) pairs sorted by tensor, in st->tens */
    /* pass 1 (valid when p1) */
    bool p1;
    uint32_t set0, nset; /* candidate sets requested, in order (ids in st->p1u32) */
    uint32_t base0;      /* base-load delta per mesh position (st->p1u64) */
    uint32_t groups;
    uint64_t pieces[4];
    /* pass 3 (valid when p3) */
    bool p3, coll;
    uint32_t rk0;         /* per mesh position, st->p3rk */
    uint32_t tag0, ntags; /* amax tags (tag0, tag0 + ntags] */
    uint32_t seq0, nseq;  /* gather ordinals [seq0, seq0 + nseq) of the mesh */
    uint64_t gathers, amax_ops;
};

/* One mesh position of a representative's pass-3 output: ranges in its rank's vectors. */
struct stamp_rank {
    uint32_t task0, task1, op0, op1, w0, w1, p0, p1, a0, a1, x0, x1; /* x: AMAX peers */
    uint32_t box0, nbox, shp0, nshp; /* first-use lists in st->p3u32 */
    uint64_t inbox0, inbox1, send, gin, h2d, nwrites;
    uint32_t vop0, vw0, vx0; /* the rank's unexpanded ops, records, amax peers before */
};

struct tens_pair {
    uint32_t t, ci;
};

static int cmp_tens(const void *a, const void *b)
{
    const struct tens_pair *x = a, *y = b;
    return x->t < y->t ? -1 : x->t > y->t;
}

void pl_stamp_init(struct stamp *st)
{
    memset(st, 0, sizeof(*st));
    pl_vec_init(&st->reps, sizeof(struct stamp_rep));
    pl_vec_init(&st->sub, sizeof(struct subpiece));
    pl_vec_init(&st->tens, sizeof(struct tens_pair));
    pl_vec_init(&st->p1u32, sizeof(uint32_t));
    pl_vec_init(&st->p1u64, sizeof(uint64_t));
    pl_vec_init(&st->p3rk, sizeof(struct stamp_rank));
    pl_vec_init(&st->p3u32, sizeof(uint32_t));
}

void pl_stamp_free(struct stamp *st)
{
    pl_vec_free(&st->reps);
    pl_vec_free(&st->sub);
    pl_vec_free(&st->tens);
    pl_vec_free(&st->p1u32);
    pl_vec_free(&st->p1u64);
    pl_vec_free(&st->p3rk);
    pl_vec_free(&st->p3u32);
    free(st->head);
    free(st->rep_of);
    free(st->dr);
    free(st->dl);
    memset(st, 0, sizeof(*st));
}

int pl_stamp_prepare(struct plan_ctx *c, bool on)
{
    struct stamp *st = &c->st;
    size_t n = c->items.n + 1;
    st->on = on;
    st->hcap = 1024;
    st->head = malloc(st->hcap * sizeof(int32_t));
    st->rep_of = malloc(n * sizeof(int32_t));
    st->dr = calloc(n, sizeof(int32_t));
    st->dl = calloc(n, sizeof(int32_t));
    if (!st->head || !st->rep_of || !st->dr || !st->dl)
        return -ENOMEM;
    memset(st->head, 0xff, st->hcap * sizeof(int32_t));
    memset(st->rep_of, 0xff, n * sizeof(int32_t));
    return 0;
}

/* ---------------------------------------------------------------- congruence */

static uint64_t mix(uint64_t h, uint64_t v)
{
    h = (h ^ v) * 0xff51afd7ed558ccdull;
    return h ^ (h >> 32);
}

static uint64_t mix_box(uint64_t h, const struct wb_box *b)
{
    h = mix(h, b->ndim);
    for (uint32_t d = 0; d < b->ndim; d++)
        h = mix(mix(h, b->off[d]), b->ext[d]);
    return h;
}

/* Hash of everything congruence compares, offsets (dr, dl) left out. c->sub holds the item's
 * subpieces. */
static uint64_t item_sig(const struct plan_ctx *c, const struct item *it)
{
    const struct wb_mapping *mp = pl_ctx_map(c, it->mapping);
    uint64_t h =
        mix(mix(mix(mix(0x9E3779B97F4A7C15ull, it->nc), mp->xform), mp->dst_dtype), mp->scale >= 0);
    h = mix(h, it->mode);
    for (uint32_t ci = 0; ci < it->nc; ci++) {
        const struct wb_component *cp = pl_item_comp(c, it, ci);
        uint32_t t = cp->trainer;
        const struct wb_param *p = &c->in->trainer->p[t];
        h = mix(mix(h, p->dtype), (uint64_t)c->pm->place[t].rule);
        if (cp->permuted) /* mixed in only then: other items' signatures stay as they were */
            h = mix(h, pl_perm_pack(cp->perm, p->shape.ndim) + 1);
        for (uint32_t d = 0; d < p->shape.ndim; d++)
            h = mix(h, p->shape.dim[d]);
    }
    const struct subpiece *S = c->sub.p;
    h = mix(h, c->sub.n);
    for (size_t s = 0; s < c->sub.n; s++)
        h = mix_box(mix_box(mix(mix(h, S[s].ci), S[s].l - S[0].l), &S[s].S), &S[s].D);
    return h;
}

/* Whether item y (subpieces in c->sub) is congruent to representative rp; *dr, *dl: offsets. */
static bool congruent(const struct plan_ctx *c, const struct stamp_rep *rp, const struct item *y,
                      int64_t *dr, int64_t *dl)
{
    const struct item *x = VEC_AT(&c->items, struct item, rp->item);
    const struct wb_mapping *mx = pl_ctx_map(c, x->mapping), *my = pl_ctx_map(c, y->mapping);
    if (x->mode != y->mode || x->nc != y->nc || rp->nsub != c->sub.n || mx->xform != my->xform ||
        mx->dst_dtype != my->dst_dtype || (mx->scale >= 0) != (my->scale >= 0))
        return false;
    const struct wb_placement_map *pm = c->pm;
    int64_t shift = 0;
    for (uint32_t ci = 0; ci < x->nc; ci++) {
        const struct wb_component *cx = pl_item_comp(c, x, ci), *cy = pl_item_comp(c, y, ci);
        uint32_t tx = cx->trainer, ty = cy->trainer;
        if (cx->permuted != cy->permuted ||
            (cx->permuted && memcmp(cx->perm, cy->perm, sizeof(cx->perm))))
            return false;
        const struct wb_param *px = &c->in->trainer->p[tx], *py = &c->in->trainer->p[ty];
        const struct tplace *ax = &pm->place[tx], *ay = &pm->place[ty];
        if (px->dtype != py->dtype || !wb_shape_eq(&px->shape, &py->shape) || ax->rule != ay->rule)
            return false;
        int64_t s = 0;
        for (uint32_t d = 0; d < pm->tl->ndims; d++)
            if (ax->sel[d] >= 0) /* the same rule fixes the same dims */
                s += ((int64_t)ay->sel[d] - ax->sel[d]) * (int64_t)pm->stride[d];
        if (ci > 0 && s != shift)
            return false;
        shift = s;
    }
    const struct subpiece *SX = VEC_AT(&c->st.sub, struct subpiece, rp->sub0), *SY = c->sub.p;
    int64_t lshift = c->sub.n ? (int64_t)SY[0].l - SX[0].l : 0;
    for (size_t s = 0; s < c->sub.n; s++) {
        if (SX[s].ci != SY[s].ci || (int64_t)SY[s].l - SX[s].l != lshift ||
            !wb_box_eq(&SX[s].S, &SY[s].S) || !wb_box_eq(&SX[s].D, &SY[s].D))
            return false;
        if (s > 0 && SX[s].l == SX[s - 1].l)
            continue;
        const struct rlocal *lx = &c->rloc[x->mapping * c->gpr + SX[s].l];
        const struct rlocal *ly = &c->rloc[y->mapping * c->gpr + SY[s].l];
        if (!wb_shape_eq(&lx->shape, &ly->shape) ||
            !wb_shape_eq(&lx->scale_shape, &ly->scale_shape))
            return false;
    }
    *dr = shift;
    *dl = lshift;
    return true;
}

int pl_stamp_classify(struct plan_ctx *c, uint32_t i, int64_t *like)
{
    struct stamp *st = &c->st;
    *like = -1;
    if (!st->on)
        return 0;
    const struct item *y = VEC_AT(&c->items, struct item, i);
    uint64_t sig = item_sig(c, y);
    for (int32_t k = st->head[sig & (st->hcap - 1)]; k >= 0;) {
        const struct stamp_rep *rp = VEC_AT(&st->reps, struct stamp_rep, k);
        int64_t dr, dl;
        if (rp->sig == sig && congruent(c, rp, y, &dr, &dl)) {
            st->rep_of[i] = k;
            st->dr[i] = (int32_t)dr;
            st->dl[i] = (int32_t)dl;
            *like = rp->item;
            return 0;
        }
        k = rp->next;
    }
    /* a new representative; one whose components repeat a trainer tensor cannot be renumbered */
    struct stamp_rep rp = {.item = i, .sig = sig, .sub0 = (uint32_t)st->sub.n};
    rp.nsub = (uint32_t)c->sub.n;
    rp.tens0 = (uint32_t)st->tens.n;
    if (pl_vec_reserve(&st->sub, c->sub.n) || pl_vec_reserve(&st->tens, y->nc))
        return -ENOMEM;
    struct tens_pair *tp = VEC_AT(&st->tens, struct tens_pair, rp.tens0);
    for (uint32_t ci = 0; ci < y->nc; ci++)
        tp[ci] = (struct tens_pair){pl_item_comp(c, y, ci)->trainer, ci};
    qsort(tp, y->nc, sizeof(*tp), cmp_tens);
    for (uint32_t ci = 1; ci < y->nc; ci++)
        if (tp[ci].t == tp[ci - 1].t)
            return 0;
    st->tens.n += y->nc;
    memcpy(VEC_AT(&st->sub, struct subpiece, st->sub.n), c->sub.p,
           c->sub.n * sizeof(struct subpiece));
    st->sub.n += c->sub.n;
    size_t slot = sig & (st->hcap - 1);
    rp.next = st->head[slot];
    if (!pl_vec_push(&st->reps, &rp))
        return -ENOMEM;
    st->head[slot] = (int32_t)st->reps.n - 1;
    st->rep_of[i] = (int32_t)st->reps.n - 1;
    return 0;
}

/* The representative of item i when i is stamped from it (NULL when i is not, or is one). */
static struct stamp_rep *rep_for(struct plan_ctx *c, uint32_t i)
{
    int32_t k = c->st.rep_of[i];
    if (k < 0)
        return NULL;
    struct stamp_rep *rp = VEC_AT(&c->st.reps, struct stamp_rep, k);
    return rp->item == i ? NULL : rp;
}

/* The representative when item i is one (NULL otherwise). */
static struct stamp_rep *rep_self(struct plan_ctx *c, uint32_t i)
{
    int32_t k = c->st.rep_of[i];
    if (k < 0)
        return NULL;
    struct stamp_rep *rp = VEC_AT(&c->st.reps, struct stamp_rep, k);
    return rp->item == i ? rp : NULL;
}

/* Ranks of a mesh, ascending; returns their number. */
static uint32_t mesh_ranks(const struct plan_ctx *c, uint32_t mesh, const uint32_t **out)
{
    const struct mesh_int *m = VEC_AT(&c->meshes, struct mesh_int, mesh);
    *out = m->ranks;
    return m->n;
}

/* Mesh position of rank r in the ascending list R of n ranks. */
static uint32_t rank_pos(const uint32_t *R, uint32_t n, uint32_t r)
{
    uint32_t lo = 0, hi = n;
    while (lo < hi) {
        uint32_t mid = (lo + hi) / 2;
        if (R[mid] < r)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* ---------------------------------------------------------------- pass 1 */

void pl_stamp_pass_reset(struct plan_ctx *c, int pass)
{
    struct stamp *st = &c->st;
    for (size_t k = 0; k < st->reps.n; k++) {
        struct stamp_rep *rp = VEC_AT(&st->reps, struct stamp_rep, k);
        if (pass == 1)
            rp->p1 = false;
        rp->p3 = false;
    }
    if (pass == 1)
        st->p1u32.n = st->p1u64.n = 0;
    st->p3rk.n = st->p3u32.n = 0;
    st->stamped = 0;
}

int pl_stamp_walk_begin(struct plan_ctx *c, uint32_t i, uint32_t group)
{
    struct stamp *st = &c->st;
    struct stamp_rep *rp = rep_self(c, i);
    st->logging = false;
    if (!rp)
        return 0;
    const struct item *it = VEC_AT(&c->items, struct item, i);
    const uint32_t *R;
    uint32_t n = mesh_ranks(c, it->mesh, &R);
    rp->set0 = (uint32_t)st->p1u32.n;
    rp->base0 = (uint32_t)st->p1u64.n;
    if (pl_vec_reserve(&st->p1u64, (size_t)n))
        return -ENOMEM;
    for (uint32_t k = 0; k < n; k++)
        *VEC_AT(&st->p1u64, uint64_t, st->p1u64.n++) = c->bal.base[R[k]];
    st->demands0 = c->bal.demands.n;
    st->group0 = group;
    memcpy(st->pieces0, c->pieces_by_mode, sizeof(st->pieces0));
    st->logging = true;
    return 0;
}

int pl_stamp_log_set(struct plan_ctx *c, int64_t set)
{
    if (!c->st.logging || set < 0)
        return 0;
    uint32_t id = (uint32_t)set;
    return pl_vec_push(&c->st.p1u32, &id) ? 0 : -ENOMEM;
}

int pl_stamp_walk_end(struct plan_ctx *c, uint32_t i, uint32_t group)
{
    struct stamp *st = &c->st;
    struct stamp_rep *rp = rep_self(c, i);
    if (!rp || !st->logging)
        return 0;
    st->logging = false;
    if (c->bal.demands.n != st->demands0) /* balanced demands: members are walked */
        return 0;
    const struct item *it = VEC_AT(&c->items, struct item, i);
    const uint32_t *R;
    uint32_t n = mesh_ranks(c, it->mesh, &R);
    uint64_t *B = VEC_AT(&st->p1u64, uint64_t, rp->base0);
    for (uint32_t k = 0; k < n; k++)
        B[k] = c->bal.base[R[k]] - B[k];
    rp->nset = (uint32_t)st->p1u32.n - rp->set0;
    rp->groups = group - st->group0;
    for (int m = 0; m < 4; m++)
        rp->pieces[m] = c->pieces_by_mode[m] - st->pieces0[m];
    rp->p1 = true;
    return 0;
}

int pl_stamp_walk_apply(struct plan_ctx *c, uint32_t i, uint32_t *group)
{
    struct stamp_rep *rp = rep_for(c, i);
    if (!rp || !rp->p1)
        return 0;
    struct stamp *st = &c->st;
    struct balance *b = &c->bal;
    const struct item *x = VEC_AT(&c->items, struct item, rp->item);
    const struct item *y = VEC_AT(&c->items, struct item, i);
    int64_t dr = st->dr[i];
    uint32_t ranks[256], *heap = NULL;
    for (uint32_t k = 0; k < rp->nset; k++) {
        uint32_t id = *VEC_AT(&st->p1u32, uint32_t, rp->set0 + k);
        const struct bal_set *s = VEC_AT(&b->sets, struct bal_set, id);
        uint32_t *dst = ranks;
        if (s->n > 256) {
            free(heap);
            heap = malloc(s->n * sizeof(uint32_t));
            if (!heap)
                return -ENOMEM;
            dst = heap;
        }
        const uint32_t *src = VEC_AT(&b->set_ranks, uint32_t, s->r0);
        for (uint32_t m = 0; m < s->n; m++)
            dst[m] = (uint32_t)((int64_t)src[m] + dr);
        int64_t id2 = pl_bal_set(b, dst, s->n);
        if (id2 < 0) {
            free(heap);
            return (int)id2;
        }
    }
    free(heap);
    const uint32_t *R;
    uint32_t n = mesh_ranks(c, x->mesh, &R);
    const uint64_t *B = VEC_AT(&st->p1u64, uint64_t, rp->base0);
    size_t ph = y->phase < b->nphases ? y->phase : b->nphases - 1;
    for (uint32_t k = 0; k < n; k++) {
        uint32_t r = (uint32_t)((int64_t)R[k] + dr);
        b->base[r] += B[k];
        b->pbase[ph * b->nranks + r] += B[k];
    }
    *group += rp->groups;
    for (int m = 0; m < 4; m++)
        c->pieces_by_mode[m] += rp->pieces[m];
    return 1;
}

/* ---------------------------------------------------------------- pass 3 */

int pl_stamp_emit_begin(struct plan_ctx *c, uint32_t i)
{
    struct stamp *st = &c->st;
    struct stamp_rep *rp = rep_self(c, i);
    st->recording = false;
    if (!rp)
        return 0;
    const struct item *it = VEC_AT(&c->items, struct item, i);
    const uint32_t *R;
    uint32_t n = mesh_ranks(c, it->mesh, &R);
    rp->rk0 = (uint32_t)st->p3rk.n;
    if (pl_vec_reserve(&st->p3rk, (size_t)n))
        return -ENOMEM;
    for (uint32_t k = 0; k < n; k++) {
        const struct rank_out *ro = &c->ro[R[k]];
        struct stamp_rank *sr = VEC_AT(&st->p3rk, struct stamp_rank, st->p3rk.n++);
        memset(sr, 0, sizeof(*sr));
        sr->inbox0 = c->inbox[R[k]];
        if (!owns(c, R[k]))
            continue; /* another thread's rank: only the inbox cursor is kept */
        sr->task0 = (uint32_t)ro->tasks.n;
        sr->op0 = (uint32_t)ro->ops.n;
        sr->w0 = (uint32_t)ro->writes.n;
        sr->p0 = (uint32_t)ro->peers.n;
        sr->a0 = (uint32_t)ro->amax.n;
        sr->x0 = (uint32_t)ro->apeers.n;
        sr->vop0 = ro->vops;
        sr->vw0 = ro->vwrites;
        sr->vx0 = ro->vapeers;
        sr->send = ro->send;
        sr->gin = ro->gather_in;
        sr->h2d = ro->h2d;
        sr->nwrites = ro->nwrites;
    }
    rp->tag0 = c->next_tag;
    rp->seq0 = c->gather_seq[it->mesh];
    rp->gathers = c->gathers;
    rp->amax_ops = c->amax_ops;
    st->recording = true;
    return 0;
}

/* Appends index v to the first-use list [*n0, ...) unless it is there already. */
static int first_use(struct vec *v, uint32_t n0, uint32_t idx)
{
    for (size_t k = n0; k < v->n; k++)
        if (*VEC_AT(v, uint32_t, k) == idx)
            return 0;
    return pl_vec_push(v, &idx) ? 0 : -ENOMEM;
}

/* Box and shape indices an op uses, in the order emit.c interns them. */
static void op_refs(const struct wb_rt_op *op, uint32_t *box, uint32_t *nbox, uint32_t *shp,
                    uint32_t *nshp)
{
    *nbox = *nshp = 0;
    switch (op->kind) {
    case WB_OP_GATHER:
        shp[(*nshp)++] = op->gather.src.shape;
        shp[(*nshp)++] = op->gather.dst.shape;
        break;
    case WB_OP_AMAX:
        shp[(*nshp)++] = op->amax.src.shape;
        box[(*nbox)++] = op->amax.src_box;
        box[(*nbox)++] = op->amax.region;
        box[(*nbox)++] = op->amax.blocks;
        box[(*nbox)++] = op->amax.grid;
        break;
    case WB_OP_COPY:
    case WB_OP_CAST:
        shp[(*nshp)++] = op->copy.src.shape;
        shp[(*nshp)++] = op->copy.dst.shape;
        box[(*nbox)++] = op->copy.src_box;
        box[(*nbox)++] = op->copy.dst_box;
        break;
    case WB_OP_PERMUTE:
        shp[(*nshp)++] = op->permute.src.shape;
        shp[(*nshp)++] = op->permute.dst.shape;
        box[(*nbox)++] = op->permute.src_box;
        box[(*nbox)++] = op->permute.dst_box;
        break;
    case WB_OP_QUANT:
        shp[(*nshp)++] = op->quant.src.shape;
        shp[(*nshp)++] = op->quant.dst.shape;
        box[(*nbox)++] = op->quant.src_box;
        box[(*nbox)++] = op->quant.region;
        box[(*nbox)++] = op->quant.grid;
        break;
    case WB_OP_H2D:
        break;
    }
}

int pl_stamp_emit_end(struct plan_ctx *c, uint32_t i)
{
    struct stamp *st = &c->st;
    struct stamp_rep *rp = rep_self(c, i);
    if (!rp || !st->recording)
        return 0;
    st->recording = false;
    const struct item *it = VEC_AT(&c->items, struct item, i);
    const uint32_t *R;
    uint32_t n = mesh_ranks(c, it->mesh, &R);
    rp->coll = false;
    for (uint32_t k = 0; k < n; k++) {
        const struct rank_out *ro = &c->ro[R[k]];
        struct stamp_rank *sr = VEC_AT(&st->p3rk, struct stamp_rank, rp->rk0 + k);
        sr->inbox1 = c->inbox[R[k]];
        if (!owns(c, R[k]))
            continue;
        sr->task1 = (uint32_t)ro->tasks.n;
        sr->op1 = (uint32_t)ro->ops.n;
        sr->w1 = (uint32_t)ro->writes.n;
        sr->p1 = (uint32_t)ro->peers.n;
        sr->a1 = (uint32_t)ro->amax.n;
        sr->x1 = (uint32_t)ro->apeers.n;
        sr->send = ro->send - sr->send;
        sr->gin = ro->gather_in - sr->gin;
        sr->h2d = ro->h2d - sr->h2d;
        sr->nwrites = ro->nwrites - sr->nwrites;
        /* first-use order of boxes and shapes (a box first used by a gather's peers comes
         * after the gather op's own shapes, as emit.c interns them) */
        sr->box0 = (uint32_t)st->p3u32.n;
        for (uint32_t o = sr->op0; o < sr->op1; o++) {
            const struct wb_rt_op *op = VEC_AT(&ro->ops, struct wb_rt_op, o);
            uint32_t bb[4], ss[2], nb, ns;
            op_refs(op, bb, &nb, ss, &ns);
            for (uint32_t m = 0; m < nb; m++)
                if (first_use(&st->p3u32, sr->box0, bb[m]))
                    return -ENOMEM;
            if (op->kind == WB_OP_GATHER)
                for (uint32_t pe = 0; pe < op->gather.npeers; pe++)
                    if (first_use(
                            &st->p3u32, sr->box0,
                            VEC_AT(&ro->peers, struct wb_rt_peer, op->gather.peer0 + pe)->box))
                        return -ENOMEM;
            if (op->kind == WB_OP_GATHER || op->kind == WB_OP_AMAX)
                rp->coll = true;
        }
        sr->nbox = (uint32_t)st->p3u32.n - sr->box0;
        sr->shp0 = (uint32_t)st->p3u32.n;
        for (uint32_t o = sr->op0; o < sr->op1; o++) {
            uint32_t bb[4], ss[2], nb, ns;
            op_refs(VEC_AT(&ro->ops, struct wb_rt_op, o), bb, &nb, ss, &ns);
            for (uint32_t m = 0; m < ns; m++)
                if (first_use(&st->p3u32, sr->shp0, ss[m]))
                    return -ENOMEM;
        }
        sr->nshp = (uint32_t)st->p3u32.n - sr->shp0;
    }
    rp->ntags = c->next_tag - rp->tag0;
    rp->nseq = c->gather_seq[it->mesh] - rp->seq0;
    rp->gathers = c->gathers - rp->gathers;
    rp->amax_ops = c->amax_ops - rp->amax_ops;
    rp->p3 = true;
    return 0;
}

static int cmp_pair(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

/* Appends to m the (old, new) pairs renumbering the representative's boxes or shapes (its
 * first-use list) into the target table, interning them there in that order; sorted by old. */
static int renum_build(struct vec *m, struct intern *from, struct intern *to, const uint32_t *list,
                       uint32_t n, bool box)
{
    size_t at = m->n;
    if (pl_vec_reserve(m, 2 * (size_t)n))
        return -ENOMEM;
    uint32_t *pair = VEC_AT(m, uint32_t, at);
    for (uint32_t k = 0; k < n; k++) {
        const void *v = (const char *)from->v.p + (size_t)list[k] * from->v.elem;
        pair[2 * k] = list[k];
        pair[2 * k + 1] = box ? pl_intern_box(to, v) : pl_intern_shape(to, v);
        if (to->err)
            return to->err;
    }
    qsort(pair, n, 2 * sizeof(uint32_t), cmp_pair);
    m->n += 2 * (size_t)n;
    return 0;
}

/* The peers' inbox shifts of a segment: (rank, low, high) in the pool for each peer rank its
 * amax peer rows X name. */
static int seg_inbox_shifts(struct pl_seg *sg, struct vec *pool, const struct wb_rt_amax_peer *X,
                            uint32_t nx, const struct stamp_rank *SR, const uint32_t *R, uint32_t n,
                            const uint64_t *inbox_y)
{
    sg->dpos0 = (uint32_t)pool->n;
    for (uint32_t k = 0; k < nx; k++) {
        const uint32_t *dp = VEC_AT(pool, uint32_t, sg->dpos0);
        bool seen = k && X[k].rank == X[k - 1].rank;
        for (uint32_t i = 0; i < sg->ndpos && !seen; i++)
            seen = dp[3 * i] == X[k].rank;
        if (seen)
            continue;
        uint32_t pp = rank_pos(R, n, X[k].rank);
        uint64_t d = inbox_y[pp] - SR[pp].inbox0;
        uint32_t e[3] = {X[k].rank, (uint32_t)d, (uint32_t)(d >> 32)};
        int err = pl_vec_reserve(pool, 3);
        if (err)
            return err;
        memcpy(VEC_AT(pool, uint32_t, pool->n), e, sizeof(e));
        pool->n += 3;
        sg->ndpos++;
    }
    return 0;
}

/* Receive counts of a stamped segment, from its records as renumbered: WD, the records already
 * written to the table, or (NULL: a lazy plan's) the representative's W renumbered a chunk at
 * a time. */
static void count_received(struct plan_ctx *c, const struct pl_seg *sg, const uint32_t *P,
                           const struct wb_rt_write *W, uint32_t nw, const struct wb_rt_write *WD)
{
    size_t nrt = c->in->rollout->n;
    uint32_t reps = c->gpr ? c->nr / c->gpr : 1;
    struct wb_rt_write chunk[256];
    for (uint32_t k0 = 0; k0 < nw; k0 += 256) {
        uint32_t m = nw - k0 < 256 ? nw - k0 : 256;
        const struct wb_rt_write *D = WD ? WD + k0 : chunk;
        if (!WD)
            pl_seg_writes(sg, P, W + k0, m, chunk);
        for (uint32_t k = 0; k < m; k++) {
            const struct wb_rt_write *w = &D[k];
            if (pl_full_fanout(w, c->gpr, reps)) {
                struct recv_count *rc = &c->rcls[(size_t)w->dst_rank * nrt + w->dst_tensor];
                rc->bytes += w->len; /* every replica's alike: counted once (pl_emit_all) */
                rc->writes++;
                continue;
            }
            for (uint32_t j = 0; j < wb_rt_copies(w); j++) {
                size_t ri = (size_t)wb_rt_copy_rank(w, j) * nrt + w->dst_tensor;
                c->recv[ri].bytes += w->len;
                c->recv[ri].writes++;
            }
        }
    }
}

/* Stamps one mesh position: representative rank r -> rank r + dr. The ops and records are
 * renumbered by a segment (lazy.c), kept as it is in a lazy plan. tm: the representative's
 * trainer tensors -> item y's, (from, to) pairs sorted by from. */
static int stamp_rank(struct plan_ctx *c, const struct stamp_rep *rp, const struct item *y,
                      uint32_t yi, uint32_t me, const uint32_t *R, uint32_t n,
                      const uint64_t *inbox_y, const uint32_t *tm, uint32_t ntm)
{
    struct stamp *st = &c->st;
    const struct stamp_rank *SR = VEC_AT(&st->p3rk, struct stamp_rank, rp->rk0), *sr = &SR[me];
    uint32_t r = R[me], ry = (uint32_t)((int64_t)r + st->dr[yi]);
    struct rank_out *src = &c->ro[r], *dst = &c->ro[ry];
    const struct item *x = VEC_AT(&c->items, struct item, rp->item);
    const struct wb_mapping *mx = pl_ctx_map(c, x->mapping), *my = pl_ctx_map(c, y->mapping);
    int64_t dr = st->dr[yi];
    bool lazy = c->opts->lazy;
    uint32_t nops = sr->op1 - sr->op0, nw = sr->w1 - sr->w0, np = sr->p1 - sr->p0;
    uint32_t nt = sr->task1 - sr->task0, na = sr->a1 - sr->a0, nx = sr->x1 - sr->x0;
    if (pl_vec_reserve(&dst->tasks, nt) || pl_vec_reserve(&dst->ops, lazy ? 0 : nops) ||
        pl_vec_reserve(&dst->writes, lazy ? 0 : nw) || pl_vec_reserve(&dst->peers, np) ||
        pl_vec_reserve(&dst->amax, lazy ? 0 : na) || pl_vec_reserve(&dst->apeers, lazy ? 0 : nx) ||
        pl_vec_reserve(&dst->segs, 1))
        return -ENOMEM;
    /* the renumbering pairs: in the table's pool (lazy), else in scratch */
    struct vec scratch, *pool = lazy ? &dst->pool : &scratch;
    pl_vec_init(&scratch, sizeof(uint32_t));
    struct pl_seg sg = {
        .at_task = (uint32_t)dst->tasks.n,
        .ntask = nt,
        .task0 = sr->task0,
        .at_op = (uint32_t)dst->ops.n,
        .at_w = (uint32_t)dst->writes.n,
        .at_a = (uint32_t)dst->amax.n,
        .a0 = sr->a0,
        .a1 = sr->a1,
        .src = r,
        .op0 = sr->op0,
        .op1 = sr->op1,
        .w0 = sr->w0,
        .w1 = sr->w1,
        .map0 = (uint32_t)pool->n,
        .ntm = ntm,
        .same = r == ry,
        .pshift = (uint32_t)dst->peers.n - sr->p0,
        .xshift = (uint32_t)dst->apeers.n + dst->vapeers - (sr->x0 + sr->vx0),
        .at_x = (uint32_t)dst->apeers.n,
        .x0 = sr->x0,
        .x1 = sr->x1,
        .xsrc = sr->vx0,
        .dr = (int32_t)dr,
        .inbox_shift = inbox_y[me] - sr->inbox0,
        /* the caller has advanced the tag counter and the mesh's gather ordinal past y's */
        .seq_shift = c->gather_seq[y->mesh] - rp->nseq - rp->seq0,
        .mesh = y->mesh,
        .dl = (int32_t)st->dl[yi],
        .vx = mx->rollout,
        .vy = my->rollout,
        .sy = (uint32_t)my->scale,
        .gathers = rp->gathers != 0 || x->mode == WB_MODE_GATHER,
    };
    sg.tag_shift = c->next_tag - rp->ntags - rp->tag0;
    int err = pl_vec_reserve(pool, 2 * (size_t)ntm);
    if (!err) {
        memcpy(VEC_AT(pool, uint32_t, pool->n), tm, 2 * (size_t)ntm * sizeof(uint32_t));
        pool->n += 2 * (size_t)ntm;
    }
    if (!err && !sg.same &&
        !(err = renum_build(pool, &src->boxes, &dst->boxes, VEC_AT(&st->p3u32, uint32_t, sr->box0),
                            sr->nbox, true)) &&
        !(err = renum_build(pool, &src->shapes, &dst->shapes,
                            VEC_AT(&st->p3u32, uint32_t, sr->shp0), sr->nshp, false))) {
        sg.nbx = sr->nbox;
        sg.nsh = sr->nshp;
    }
    const struct wb_rt_amax_peer *X = VEC_AT(&src->apeers, struct wb_rt_amax_peer, sr->x0);
    if (!err)
        err = seg_inbox_shifts(&sg, pool, X, nx, SR, R, n, inbox_y);
    if (err)
        goto out;
    const uint32_t *P = VEC_AT(pool, uint32_t, 0);
    /* task rows count the ops and records before them expanded: the representative's from
     * its rows' start, this table's from its own */
    uint32_t op_from = sr->op0 + sr->vop0, w_from = sr->w0 + sr->vw0;
    uint32_t op_base = (uint32_t)dst->ops.n + dst->vops,
             w_base = (uint32_t)dst->writes.n + dst->vwrites;
    for (uint32_t k = 0; k < nt; k++) {
        struct wb_rt_task t = *VEC_AT(&src->tasks, struct wb_rt_task, sr->task0 + k);
        t.mapping = y->mapping;
        t.item = yi;
        t.phase = y->phase;
        t.mesh = y->mesh;
        t.op0 = t.op0 - op_from + op_base;
        t.write0 = t.write0 - w_from + w_base;
        *VEC_AT(&dst->tasks, struct wb_rt_task, dst->tasks.n++) = t;
    }
    const struct wb_rt_write *W = VEC_AT(&src->writes, struct wb_rt_write, sr->w0);
    if (lazy) {
        *VEC_AT(&dst->segs, struct pl_seg, dst->segs.n++) = sg;
        dst->vops += nops;
        dst->vwrites += nw;
    } else {
        pl_seg_ops(&sg, P, VEC_AT(&src->ops, struct wb_rt_op, sr->op0), nops,
                   VEC_AT(&dst->ops, struct wb_rt_op, dst->ops.n));
        dst->ops.n += nops;
        pl_seg_writes(&sg, P, W, nw, VEC_AT(&dst->writes, struct wb_rt_write, dst->writes.n));
    }
    for (uint32_t k = 0; k < np; k++) {
        struct wb_rt_peer pe = *VEC_AT(&src->peers, struct wb_rt_peer, sr->p0 + k);
        pe.rank = (uint32_t)((int64_t)pe.rank + dr);
        pe.box = sg.same ? pe.box : pl_seg_box(&sg, P, pe.box);
        *VEC_AT(&dst->peers, struct wb_rt_peer, dst->peers.n++) = pe;
    }
    if (lazy) {
        dst->vapeers += nx;
    } else {
        pl_seg_apeers(&sg, P, X, nx, VEC_AT(&dst->apeers, struct wb_rt_amax_peer, dst->apeers.n));
        dst->apeers.n += nx;
    }
    if (lazy)
        dst->vamax += na;
    else
        pl_seg_amax(&sg, VEC_AT(&src->amax, struct wb_rt_expect, sr->a0), na,
                    VEC_AT(&dst->amax, struct wb_rt_expect, dst->amax.n));
    dst->amax.n += lazy ? 0 : na;
    count_received(c, &sg, P, W, nw,
                   lazy || !nw ? NULL : VEC_AT(&dst->writes, struct wb_rt_write, dst->writes.n));
    if (!lazy)
        dst->writes.n += nw;
    dst->nwrites += sr->nwrites;
    c->inbox[ry] += sr->inbox1 - sr->inbox0;
    dst->send += sr->send;
    dst->gather_in += sr->gin;
    dst->h2d += sr->h2d;
out:
    pl_vec_free(&scratch);
    return err;
}

/* Whether the balancer gave item y's demands the senders it gave x's, shifted by y's rank
 * offset (then y's output is x's renumbered, as for fixed demands). */
static bool same_senders(const struct plan_ctx *c, uint32_t x, uint32_t y)
{
    const struct balance *b = &c->bal;
    uint32_t n = c->dem0[x + 1] - c->dem0[x];
    if (c->dem0[y + 1] - c->dem0[y] != n)
        return false;
    const struct bal_demand *DX = VEC_AT(&b->demands, struct bal_demand, c->dem0[x]);
    const struct bal_demand *DY = VEC_AT(&b->demands, struct bal_demand, c->dem0[y]);
    int64_t dr = c->st.dr[y];
    for (uint32_t j = 0; j < n; j++) {
        if (DX[j].nparts != DY[j].nparts)
            return false;
        const struct bal_part *px = VEC_AT(&b->parts, struct bal_part, DX[j].part0);
        const struct bal_part *py = VEC_AT(&b->parts, struct bal_part, DY[j].part0);
        for (uint32_t k = 0; k < DX[j].nparts; k++)
            if ((int64_t)py[k].rank != (int64_t)px[k].rank + dr || py[k].u0 != px[k].u0 ||
                py[k].u1 != px[k].u1)
                return false;
    }
    return true;
}

int pl_stamp_emit_apply(struct plan_ctx *c, uint32_t i)
{
    struct stamp_rep *rp = rep_for(c, i);
    if (!rp || !rp->p3 || !same_senders(c, rp->item, i))
        return 0;
    struct stamp *st = &c->st;
    const struct item *x = VEC_AT(&c->items, struct item, rp->item);
    const struct item *y = VEC_AT(&c->items, struct item, i);
    const uint32_t *R;
    uint32_t n = mesh_ranks(c, x->mesh, &R);
    for (uint32_t k = 0; k < n; k++) /* the representative's output there is another thread's */
        if (owns(c, (uint32_t)((int64_t)R[k] + st->dr[i])) && !owns(c, R[k]))
            return 0;
    /* the target ranks' inbox cursors before any of them moves */
    uint64_t *inbox_y = malloc((size_t)(n ? n : 1) * sizeof(uint64_t));
    if (!inbox_y)
        return -ENOMEM;
    for (uint32_t k = 0; k < n; k++)
        inbox_y[k] = c->inbox[(int64_t)R[k] + st->dr[i]];
    c->next_tag += rp->ntags;
    c->gather_seq[y->mesh] += rp->nseq;
    /* the representative's trainer tensors -> y's: (from, to) pairs sorted by from */
    uint32_t *tm = malloc((size_t)(x->nc ? x->nc : 1) * 2 * sizeof(uint32_t));
    if (!tm) {
        free(inbox_y);
        return -ENOMEM;
    }
    const struct tens_pair *tp = VEC_AT(&st->tens, struct tens_pair, rp->tens0);
    for (uint32_t k = 0; k < x->nc; k++) {
        tm[2 * k] = tp[k].t;
        tm[2 * k + 1] = pl_item_comp(c, y, tp[k].ci)->trainer;
    }
    int r = 0;
    for (uint32_t k = 0; k < n && !r; k++) {
        const struct stamp_rank *sr = VEC_AT(&st->p3rk, struct stamp_rank, rp->rk0 + k);
        uint32_t ry = (uint32_t)((int64_t)R[k] + st->dr[i]);
        if (!owns(c, ry)) /* another thread's: keep the inbox cursor in step */
            c->inbox[ry] += sr->inbox1 - sr->inbox0;
        else if (sr->task1 != sr->task0 || sr->a1 != sr->a0 || sr->inbox1 != sr->inbox0)
            r = stamp_rank(c, rp, y, i, k, R, n, inbox_y, tm, x->nc);
    }
    free(inbox_y);
    free(tm);
    if (r)
        return r;
    c->gathers += rp->gathers;
    c->amax_ops += rp->amax_ops;
    if (rp->coll)
        c->phase_coll[y->phase] = true;
    c->demand_cursor += c->dem0[i + 1] - c->dem0[i];
    st->stamped++;
    return 1;
}

int64_t pl_stamp_rep_of(const struct plan_ctx *c, uint32_t i, int64_t *dr)
{
    int32_t k = c->st.rep_of ? c->st.rep_of[i] : -1;
    if (k < 0)
        return -1;
    *dr = c->st.dr[i];
    return VEC_AT(&c->st.reps, struct stamp_rep, k)->item;
}
