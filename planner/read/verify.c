/* verify.c — wb_plan_verify(): checks a plan's invariants without data, in time linear in the
 * plan and memory far below it (a 1024 -> 512 plan has 10^8 writes; nothing is gathered per
 * destination or sorted but the writes of a destination found wrong):
 *  - destinations: every byte of every rollout rank's local tensors is written exactly once
 *    (but for the padding rows of a vocab-padded tensor, which nothing writes), and every
 *    write lies inside its local tensor;
 *  - sources: a write reads the rank's own shard (PARAM, GPU residence, inside the shard) or
 *    bytes of its task's TMP that an earlier op of the task produced; every op reads only
 *    such bytes; H2D reads the rank's own shard; a GATHER's peers are owners holding exactly
 *    the boxes listed, which tile the tensor;
 *  - order: mesh groups are disjoint; tasks are in phase order; every member of a mesh has the
 *    same GATHER sequence; every AMAX op has its mirror (same tag, blocks, crossed inboxes).
 * A lazy plan's stamped tasks are checked through their segment (lazy.c): congruent to the
 * representative's rows, which are checked with their own table, their amax exchanges noted
 * for the mirror check and their records counted at their destinations (congruent() says
 * why that suffices); a segment that is not congruent is expanded and checked op by op.
 * The data itself (values after fuse/quantize) is checked by the CPU execution test on small
 * cases (tests/unit/planner_sim.h). */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "planner/plan_int.h"

/* AMAX mirrors, noted while the sources are checked: per tag, the two ops' ranks and a
 * fingerprint of what must agree (rank, peer, tensor, blocks, inboxes), computed crossed on
 * the side whose rank is the larger, so that mirrors have equal fingerprints. */
struct amax_slot {
    uint64_t fp[2];   /* side 0: the op whose rank < its peer; side 1: the other */
    uint32_t rank[2]; /* rank + 1; 0: none */
};

/* What check_order needs of the ops. */
struct order_idx {
    struct amax_slot *at; /* by amax tag */
    uint32_t ntag;
    uint64_t *g0;  /* [ntrainers + 1]: rank r's gathers are g[g0[r] .. g0[r + 1]) */
    struct vec g;  /* struct gref, rank by rank */
    bool too_many; /* a tag with two ops on one side */
    uint32_t many_tag, many_rank;
};

struct gref {
    uint32_t mesh, seq, tensor;
};

struct aref {
    uint32_t tag, rank, side;
    uint64_t fp;
};

struct vctx {
    const struct wb_plan *p;
    const struct wb_plan_input *in;
    struct wb_placement_map *pm;
    struct pl_problems pr;    /* the first PL_KEEP violations kept, every one counted */
    struct shard_memo *smemo; /* [1 << SHARD_MEMO_BITS] shard_of's answers */
    uint32_t *tcls;           /* per trainer tensor: its placement and shape class */
    int rc;                   /* the return of the check this context ran on its thread */
    uint32_t rank0, rank1;    /* sources_thread: the tables it checks */
    struct order_idx *ox;     /* what the sources threads note for check_order */
    struct vec gref;          /* sources_thread: its tables' GATHER ops (struct gref) */
    struct vec xtra;          /* AMAX ops whose tag is past ox's array (struct aref) */
    struct peer_seen {
        uint32_t cls, rank, peer0, npeers; /* cls + 1; 0: empty */
    } pseen[64];                           /* gathers' peer lists found right, by class */
};
enum { PEER_SEEN = 64 };

/* A rank's shard of a tensor follows from the tensor's placement and shape: tensors of one
 * class (tcls: a layer's experts) share it, so the answers are kept, direct-mapped by (class,
 * rank). A gather's peers are checked this way too: 1.2M gathers of 16 peers at 256 -> 128. */
enum { SHARD_MEMO_BITS = 14 };
struct shard_memo {
    uint32_t cls, rank; /* cls + 1; 0: empty */
    bool ok;
    struct wb_box box;
};

/* What decides a tensor's shard boxes: its placement (rule, fixed coordinates) and shape. */
struct tcls_key {
    struct tplace tp;
    struct wb_shape shape;
};

#define verr(v, ...) pl_problem(&(v)->pr, __VA_ARGS__)

/* Rank r's shard box of tensor t, or false. */
static bool shard_of_uncached(struct vctx *v, uint32_t t, uint32_t r, struct wb_box *box);

static bool shard_of(struct vctx *v, uint32_t t, uint32_t r, struct wb_box *box)
{
    if (!v->smemo || t >= v->in->trainer->n || v->pm->place[t].rule < 0)
        return shard_of_uncached(v, t, r, box);
    uint32_t c = v->tcls[t];
    uint64_t h = ((uint64_t)c << 32 | r) * 0x9E3779B97F4A7C15ull;
    struct shard_memo *slot = &v->smemo[h >> (64 - SHARD_MEMO_BITS)];
    if (slot->cls != c + 1 || slot->rank != r) {
        slot->cls = c + 1;
        slot->rank = r;
        slot->ok = shard_of_uncached(v, t, r, &slot->box);
    }
    *box = slot->box;
    return slot->ok;
}

static bool shard_of_uncached(struct vctx *v, uint32_t t, uint32_t r, struct wb_box *box)
{
    const struct wb_placement_map *pm = v->pm;
    if (t >= v->in->trainer->n || pm->place[t].rule < 0)
        return false;
    const struct tplace *tp = &pm->place[t];
    const struct wb_trainer_layout *tl = pm->tl;
    uint32_t idx = 0;
    for (uint32_t d = 0; d < tl->ndims; d++) {
        uint32_t coord = (r / pm->stride[d]) % tl->dim[d].size;
        if (tp->sel[d] >= 0) {
            if ((int32_t)coord != tp->sel[d])
                return false;
            continue;
        }
        idx = idx * tl->dim[d].size + coord;
    }
    pl_place_rank(pm, tp, &v->in->trainer->p[t].shape, idx, box, NULL, NULL);
    return true;
}

/* ---------------------------------------------------------------- sources */

struct range {
    uint64_t a, z;
};

/* Whether [a, a+n) lies in one produced range. */
static bool produced(const struct vec *pr, uint64_t a, uint64_t n)
{
    for (size_t i = pr->n; i-- > 0;) {
        const struct range *x = VEC_AT(pr, struct range, i);
        if (a >= x->a && a + n <= x->z)
            return true;
    }
    return false;
}

static uint64_t view_bytes(const struct wb_route_table *t, const struct wb_rt_view *w)
{
    return wb_shape_numel(&t->shapes[w->shape]) * wb_dtype_size(w->dtype);
}

/* A view the op reads: PARAM = own shard of that shape; TMP = produced bytes. */
static bool view_readable(struct vctx *v, const struct wb_route_table *t, const struct vec *pr,
                          const struct wb_rt_view *w)
{
    if (w->kind == WB_BUF_TMP)
        return produced(pr, w->off, view_bytes(t, w));
    struct wb_box B;
    if (t->residence != WB_RESIDE_GPU || !shard_of(v, w->tensor, t->rank, &B))
        return false;
    struct wb_shape bs = wb_box_shape(&B);
    return w->off == 0 && wb_shape_eq(&bs, &t->shapes[w->shape]);
}

static int cmp_range(const void *a, const void *b)
{
    const struct range *x = a, *y = b;
    return x->a < y->a ? -1 : x->a > y->a;
}

static int push_range(struct vec *pr, uint64_t a, uint64_t n)
{
    struct range x = {a, a + n};
    return pl_vec_push(pr, &x) ? 0 : -ENOMEM;
}

static uint64_t fp_mix(uint64_t h, uint64_t x)
{
    h ^= x + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
    return h * 0xff51afd7ed558ccdull;
}

/* Notes one exchange of an AMAX op (its peer entry pe) for the mirror check (check_amax). */
static int note_amax(struct vctx *v, const struct wb_route_table *t, const struct wb_rt_op *op,
                     const struct wb_rt_amax_peer *pe)
{
    const struct wb_rt_amax *a = &op->amax;
    bool hi = t->rank > pe->rank; /* side 1: fields crossed, so that mirrors agree */
    uint64_t h = 0x243F6A8885A308D3ull;
    h = fp_mix(h, hi ? pe->rank : t->rank);
    h = fp_mix(h, hi ? t->rank : pe->rank);
    h = fp_mix(h, op->tensor);
    h = fp_mix(h, hi ? pe->peer_inbox_off : pe->inbox_off);
    h = fp_mix(h, hi ? pe->inbox_off : pe->peer_inbox_off);
    const struct wb_box *b = a->blocks < t->nboxes ? &t->boxes[a->blocks] : NULL;
    h = fp_mix(h, b ? b->ndim : UINT64_MAX);
    for (uint32_t d = 0; b && d < b->ndim && d < WB_MAX_DIMS; d++)
        h = fp_mix(fp_mix(h, b->off[d]), b->ext[d]);
    struct order_idx *x = v->ox;
    if (!x || pe->tag >= x->ntag) { /* past the array sized from the plan's figures */
        struct aref e = {pe->tag, t->rank, hi, h};
        return pl_vec_push(&v->xtra, &e) ? 0 : -ENOMEM;
    }
    struct amax_slot *sl = &x->at[pe->tag];
    uint32_t want = 0;
    if (!__atomic_compare_exchange_n(&sl->rank[hi], &want, t->rank + 1, false, __ATOMIC_RELAXED,
                                     __ATOMIC_RELAXED)) {
        /* two ops of one side: reported once, after the threads */
        __atomic_store_n(&x->many_tag, pe->tag, __ATOMIC_RELAXED);
        __atomic_store_n(&x->many_rank, t->rank, __ATOMIC_RELAXED);
        __atomic_store_n(&x->too_many, true, __ATOMIC_RELAXED);
        return 0;
    }
    sl->fp[hi] = h;
    return 0;
}

/* What a task's ops will touch far away, asked for while the task before it is checked:
 * amax slots (an array by tag, far larger than the caches), tensors' dtypes. R: its rows. */
static void prefetch_task(const struct vctx *v, const struct wb_route_table *t,
                          const struct wb_rt_task *k, const struct pl_rows *R)
{
    const struct wb_inventory *ti = v->in->trainer;
    for (uint32_t o = 0; o < k->nops; o++) {
        const struct wb_rt_op *op = &R->ops[o];
        if (op->kind == WB_OP_AMAX && v->ox) {
            for (uint32_t j = op->amax.peer0 - R->xoff;
                 j - (op->amax.peer0 - R->xoff) < op->amax.npeers; j++)
                if (j < t->namax_peers && t->amax_peers[j].tag < v->ox->ntag)
                    __builtin_prefetch(&v->ox->at[t->amax_peers[j].tag], 1);
        } else if (op->kind == WB_OP_H2D && op->tensor < ti->n)
            __builtin_prefetch(&ti->p[op->tensor].dtype);
    }
}

/* A PERMUTE op's boxes: inside their views, one ndim, extents permuted, dtypes equal (what a
 * decoder checks of a table off the wire; a plan's own tables are checked here). */
static bool permute_fits(const struct wb_route_table *t, const struct wb_rt_permute *p)
{
    if (p->src_box >= t->nboxes || p->dst_box >= t->nboxes || p->src.shape >= t->nshapes ||
        p->dst.shape >= t->nshapes || p->src.dtype != p->dst.dtype)
        return false;
    const struct wb_box *s = &t->boxes[p->src_box], *d = &t->boxes[p->dst_box];
    if (s->ndim != d->ndim || !wb_box_within(&t->shapes[p->src.shape], s) ||
        !wb_box_within(&t->shapes[p->dst.shape], d))
        return false;
    uint32_t seen = 0;
    for (uint32_t k = 0; k < d->ndim; k++) {
        uint32_t j = wb_rt_perm_dim(p->perm, k);
        if (j >= s->ndim || (seen >> j & 1) || d->ext[k] != s->ext[j])
            return false;
        seen |= 1u << j;
    }
    return true;
}

/* Checks task k of table t, whose ops and records are ops[0 .. k->nops) and
 * writes[0 .. k->nwrites) and whose ops' amax peers are t->amax_peers[peer0 - xoff ..] (op and
 * write numbers in messages are the table's; napeers: its amax peers expanded). */
static int check_task(struct vctx *v, const struct wb_route_table *t, const struct wb_rt_task *k,
                      const struct wb_rt_op *ops, const struct wb_rt_write *writes, uint32_t xoff,
                      uint32_t napeers, struct vec *pr)
{
    const struct wb_inventory *ti = v->in->trainer;
    pr->n = 0;
    for (uint32_t o = k->op0; o < k->op0 + k->nops; o++) {
        const struct wb_rt_op *op = &ops[o - k->op0];
        const char *tn = op->tensor < ti->n ? ti->p[op->tensor].name : "?";
        bool ok = true;
        int r = 0;
        switch (op->kind) {
        case WB_OP_H2D: {
            struct wb_box B;
            ok = shard_of(v, op->tensor, t->rank, &B) &&
                 op->h2d.src_off + op->h2d.bytes <=
                     wb_box_numel(&B) * wb_dtype_size(ti->p[op->tensor].dtype) &&
                 op->h2d.dst_off + op->h2d.bytes <= k->tmp_bytes;
            r = push_range(pr, op->h2d.dst_off, op->h2d.bytes);
            break;
        }
        case WB_OP_GATHER: {
            const struct wb_rt_gather *g = &op->gather;
            struct gref ge = {g->mesh, g->seq, op->tensor};
            if (!pl_vec_push(&v->gref, &ge))
                return -ENOMEM;
            const struct wb_shape *full = &ti->p[op->tensor].shape;
            /* a list equal (ranks and box indices) to one found right in this table for a
             * tensor of the same class is right: at 1024 GPUs a rank has 4320 gathers of 64 */
            struct peer_seen *ps = NULL;
            bool seen = false;
            if (v->tcls && op->tensor < ti->n) {
                uint32_t c = v->tcls[op->tensor];
                ps = &v->pseen[c % PEER_SEEN];
                seen = ps->cls == c + 1 && ps->rank == t->rank && ps->npeers == g->npeers &&
                       memcmp(&t->peers[ps->peer0], &t->peers[g->peer0],
                              g->npeers * sizeof(struct wb_rt_peer)) == 0;
            }
            uint64_t sum = 0;
            for (uint32_t i = 0; i < g->npeers && ok && !seen; i++) {
                const struct wb_rt_peer *pe = &t->peers[g->peer0 + i];
                struct wb_box B;
                ok = shard_of(v, op->tensor, pe->rank, &B) && wb_box_eq(&B, &t->boxes[pe->box]);
                sum += wb_box_numel(&t->boxes[pe->box]);
            }
            ok = ok && (seen || sum == wb_shape_numel(full));
            if (ok && !seen && ps)
                *ps = (struct peer_seen){v->tcls[op->tensor] + 1, t->rank, g->peer0, g->npeers};
            struct wb_box own;
            ok = ok && wb_shape_eq(&t->shapes[g->dst.shape], full) && g->dst.kind == WB_BUF_TMP &&
                 shard_of(v, op->tensor, t->rank, &own) &&
                 (wb_box_numel(&own) == 0 || view_readable(v, t, pr, &g->src)) &&
                 g->dst.off + view_bytes(t, &g->dst) <= k->tmp_bytes;
            r = push_range(pr, g->dst.off, view_bytes(t, &g->dst));
            break;
        }
        case WB_OP_AMAX:
            ok = view_readable(v, t, pr, &op->amax.src);
            if (op->amax.npeers == 0 || op->amax.peer0 < xoff ||
                op->amax.peer0 - xoff > t->namax_peers ||
                op->amax.npeers > t->namax_peers - (op->amax.peer0 - xoff)) {
                verr(v, "rank %u: op %u (amax) on %s lists peers [%u, +%u) of its %u", t->rank, o,
                     tn, op->amax.peer0, op->amax.npeers, napeers);
                break;
            }
            for (uint32_t j = 0; j < op->amax.npeers && !r; j++)
                r = note_amax(v, t, op, &t->amax_peers[op->amax.peer0 - xoff + j]);
            break;
        case WB_OP_COPY:
        case WB_OP_CAST:
            ok = view_readable(v, t, pr, &op->copy.src) && op->copy.dst.kind == WB_BUF_TMP &&
                 op->copy.dst.off + view_bytes(t, &op->copy.dst) <= k->tmp_bytes;
            r = push_range(pr, op->copy.dst.off, view_bytes(t, &op->copy.dst));
            break;
        case WB_OP_PERMUTE: /* the shapes were checked when the table was decoded or built */
            ok = view_readable(v, t, pr, &op->permute.src) && op->permute.dst.kind == WB_BUF_TMP &&
                 op->permute.dst.off + view_bytes(t, &op->permute.dst) <= k->tmp_bytes &&
                 permute_fits(t, &op->permute);
            r = push_range(pr, op->permute.dst.off, view_bytes(t, &op->permute.dst));
            break;
        case WB_OP_QUANT: {
            uint64_t grid = wb_box_numel(&t->boxes[op->quant.grid]) * 4;
            ok = view_readable(v, t, pr, &op->quant.src) && op->quant.dst.kind == WB_BUF_TMP &&
                 op->quant.dst.off + view_bytes(t, &op->quant.dst) <= k->tmp_bytes &&
                 op->quant.scale_off + grid <= k->tmp_bytes;
            r = push_range(pr, op->quant.dst.off, view_bytes(t, &op->quant.dst));
            if (!r)
                r = push_range(pr, op->quant.scale_off, grid);
            break;
        }
        }
        if (r)
            return r;
        if (!ok)
            verr(v, "rank %u: op %u (kind %d) on %s reads bytes the rank does not hold", t->rank, o,
                 op->kind, tn);
    }
    /* Writes: what the ops produced, as sorted disjoint ranges (a binary search per write; a
     * task of 48 experts has 100 ops and 1000 writes). PARAM sources: the shard of the last
     * tensor looked up is kept. */
    bool sorted = true; /* usually: a task's TMP is handed out in rising offsets */
    for (size_t i = 1; i < pr->n && sorted; i++)
        sorted = VEC_AT(pr, struct range, i - 1)->a <= VEC_AT(pr, struct range, i)->a;
    if (!sorted)
        qsort(pr->p, pr->n, sizeof(struct range), cmp_range);
    size_t nm = 0;
    struct range *R = pr->p;
    for (size_t i = 0; i < pr->n; i++) {
        if (nm && R[i].a <= R[nm - 1].z) {
            if (R[i].z > R[nm - 1].z)
                R[nm - 1].z = R[i].z;
        } else {
            R[nm++] = R[i];
        }
    }
    uint32_t last_t = UINT32_MAX;
    uint64_t last_bytes = 0;
    bool last_ok = false;
    for (uint32_t w = k->write0; w < k->write0 + k->nwrites; w++) {
        const struct wb_rt_write *x = &writes[w - k->write0];
        bool ok;
        if (x->src_tensor == (uint32_t)WB_RT_TMP_SRC) {
            size_t lo = 0, hi = nm; /* the last range starting at or before src_off */
            while (hi - lo > 1) {
                size_t mid = (lo + hi) / 2;
                if (R[mid].a <= x->src_off)
                    lo = mid;
                else
                    hi = mid;
            }
            ok = nm && R[lo].a <= x->src_off && x->src_off + x->len <= R[lo].z;
        } else {
            if (x->src_tensor != last_t) {
                struct wb_box B;
                last_t = x->src_tensor;
                last_ok = t->residence == WB_RESIDE_GPU && shard_of(v, x->src_tensor, t->rank, &B);
                last_bytes =
                    last_ok ? wb_box_numel(&B) * wb_dtype_size(ti->p[x->src_tensor].dtype) : 0;
            }
            ok = last_ok && x->src_off + x->len <= last_bytes;
        }
        if (!ok)
            verr(v, "rank %u: write %u (to rank %u %s +%" PRIu64 ") reads bytes it does not hold",
                 t->rank, w, x->dst_rank,
                 x->dst_tensor < v->in->rollout->n ? v->in->rollout->p[x->dst_tensor].name : "?",
                 x->dst_off);
    }
    return 0;
}

/* ---------------------------------------------------------------- destinations */

struct wref {
    uint32_t tensor;
    uint64_t off, len;
};

static int cmp_wref(const void *a, const void *b)
{
    const struct wref *x = a, *y = b;
    if (x->tensor != y->tensor)
        return x->tensor < y->tensor ? -1 : 1;
    return x->off < y->off ? -1 : x->off > y->off;
}

uint32_t *pl_rollout_mapping_of(const struct wb_plan_input *in)
{
    uint32_t *map_of = malloc((in->rollout->n + 1) * sizeof(uint32_t));
    if (!map_of)
        return NULL;
    for (size_t t = 0; t < in->rollout->n; t++)
        map_of[t] = UINT32_MAX;
    for (size_t m = 0; m < in->match->n; m++) {
        const struct wb_mapping *mp = &in->match->map[m];
        map_of[mp->rollout] = (uint32_t)m;
        if (mp->scale >= 0)
            map_of[mp->scale] = (uint32_t)m;
    }
    return map_of;
}

uint64_t pl_local_written(const struct wb_plan_input *in, const uint32_t *map_of,
                          const struct wb_recv_list *rv, const struct wb_rt_local *lo)
{
    uint32_t mi = map_of[lo->tensor];
    if (mi == UINT32_MAX)
        return lo->bytes;
    const struct wb_mapping *m = &in->match->map[mi];
    if (!m->shard.pad && m->shard.ep1_tp_dim != WB_SHARD_RANK0)
        return lo->bytes;
    struct wb_shape ls;
    struct wb_local_piece pc[WB_MAX_PIECES];
    uint32_t np = 0;
    struct wb_errlist el;
    wb_errlist_init(&el);
    int r = wb_mapping_local(in->match, in->rollout, m, rv->tp_rank, in->rl->tp, rv->ep_rank,
                             in->rl->ep, &ls, pc, &np, &el);
    wb_errlist_free(&el);
    if (r)
        return lo->bytes; /* the plan could not have been built; report against the whole */
    uint64_t n = 0;
    bool scale = lo->tensor != m->rollout;
    for (uint32_t k = 0; k < np; k++) {
        struct wb_box sb;
        if (!scale)
            n += wb_box_numel(&pc[k].local);
        else if (wb_scale_box(&pc[k].local, m->block, &sb) == 0)
            n += wb_box_numel(&sb);
    }
    return n * wb_dtype_size(lo->dtype);
}

/* Destinations, in time and memory linear in the write records (a 1024 -> 512 plan has 10^8
 * writes in 1.3 * 10^7 records): every (rollout rank, local tensor) is a bucket; the records
 * are checked where they lie in the tables, twice (count, then mark), never gathered or
 * sorted. A bucket keeps a bitmap of its written prefix at the largest power-of-two
 * granularity that divides every write's offset and length (a 900 KB expert row block is one
 * bit), or, where that bitmap would be larger than the writes themselves, their (offset,
 * length) pairs, sorted at the end. Buckets found wrong are reported exactly by a last pass
 * that sorts their writes. */
struct bucket {
    uint64_t want;  /* bytes that must be written: a prefix of the local tensor */
    uint64_t acc;   /* OR of offsets and lengths: the granularity is its lowest set bit */
    uint64_t at;    /* bitmap words or interval slots at this offset of bits / iv */
    uint32_t count; /* writes */
    uint32_t fill;  /* intervals stored */
    uint8_t shift;  /* log2 granularity */
    bool bitmap, bad;
    uint32_t tensor, g;
    /* replica classes (a bucket of replica 0's ranks): full fan-out records counted here */
    uint32_t ccount;
    uint64_t cacc, cend;
    bool cexpand; /* the class is mixed: its records are checked copy by copy */
    int64_t rep;  /* another replica's bucket: its class's first bucket + 1, which stands
                     for it; 0: checked itself */
};

/* (g, tensor) -> bucket + 1 (0: none) for every pair when that table is small enough */
struct bmap {
    uint32_t *dense;
    uint32_t nt;
};

/* The bucket of (g, tensor): base[g] + its index in g's local list (sorted by tensor), or -1. */
static int64_t bucket_search(const struct wb_plan *p, const uint64_t *base, uint32_t g,
                             uint32_t tensor)
{
    const struct wb_recv_list *rv = &p->recv[g];
    uint32_t lo = 0, hi = rv->nlocal;
    while (lo < hi) {
        uint32_t mid = (lo + hi) / 2;
        if (rv->local[mid].tensor < tensor)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < rv->nlocal && rv->local[lo].tensor == tensor ? (int64_t)(base[g] + lo) : -1;
}

static inline int64_t bucket_of(const struct bmap *bm, const struct wb_plan *p,
                                const uint64_t *base, uint32_t g, uint32_t tensor)
{
    if (bm->dense)
        return tensor < bm->nt ? (int64_t)bm->dense[(size_t)g * bm->nt + tensor] - 1 : -1;
    return bucket_search(p, base, g, tensor);
}

/* Sets bits [a, z) of bm; returns true when one of them was set already. */
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

/* The exact report of a wrong bucket, as a sorted walk over its writes would find it. */
static void report_bucket(struct vctx *v, const struct bucket *bk, struct wref *W, size_t n)
{
    qsort(W, n, sizeof(*W), cmp_wref);
    const char *name = v->in->rollout->p[bk->tensor].name;
    uint64_t at = 0;
    for (size_t j = 0; j < n; j++) {
        if (W[j].off != at)
            verr(v, "rollout rank %u %s: bytes [%" PRIu64 ", %" PRIu64 ") %s", bk->g, name,
                 W[j].off < at ? W[j].off : at, W[j].off < at ? at : W[j].off,
                 W[j].off < at ? "written twice" : "never written");
        at = W[j].off + W[j].len > at ? W[j].off + W[j].len : at;
    }
    if (at != bk->want)
        verr(v, "rollout rank %u %s: %s at byte %" PRIu64 " of %" PRIu64, bk->g, name,
             at < bk->want ? "writes end" : "writes run past the end", at, bk->want);
}

/* Replicas: a write record fanned out to one copy per replica at the same local rank ("full")
 * lands in its class, the buckets of that local rank in every replica, which hold the same
 * local tensors. The class is checked once, on the bucket of its first rank, which then
 * stands for the others (a 1024 -> 512 plan: 6.5 * 10^6 such records, 10^8 writes); where some
 * replica's bucket also gets writes of its own, the class is mixed and its records are
 * checked copy by copy like any other. */
struct dctx {
    struct vctx *v;
    const struct wb_plan *p;
    const struct bmap *bm;
    const uint64_t *base;
    struct bucket *B;
    uint32_t gpr, reps; /* GPUs per replica, replicas (1: no classes) */
    int64_t *tg;        /* [nrollouts]: targets() */
};

static bool full_fanout(const struct dctx *d, const struct wb_rt_write *x)
{
    return pl_full_fanout(x, d->gpr, d->reps);
}

static int64_t bucket_at(const struct dctx *d, uint32_t g, uint32_t tensor)
{
    return bucket_of(d->bm, d->p, d->base, g, tensor);
}

static void no_bucket(struct dctx *d, uint32_t r, uint32_t w, uint32_t g, uint32_t tensor)
{
    const struct wb_inventory *ri = d->v->in->rollout;
    verr(d->v, "rank %u: write %u to rollout rank %u %s, which that rank does not hold", r, w, g,
         tensor < ri->n ? ri->p[tensor].name : "?");
}

/* Counts a write into bucket b (pass 1). */
static void count_into(struct bucket *bk, const struct wb_rt_write *x)
{
    bk->count++;
    bk->acc |= x->dst_off | x->len;
    if (x->dst_off + x->len > bk->want || x->dst_off + x->len < x->dst_off)
        bk->bad = true;
}

/* Marks a write in bucket bk (pass 2). */
static void mark_into(struct bucket *bk, uint64_t *bits, struct wref *iv,
                      const struct wb_rt_write *x)
{
    if (bk->bad)
        return;
    if (bk->bitmap) {
        if (mark_bits(bits + bk->at, x->dst_off >> bk->shift, (x->dst_off + x->len) >> bk->shift))
            bk->bad = true;
    } else {
        iv[bk->at + bk->fill++] = (struct wref){x->dst_tensor, x->dst_off, x->len};
    }
}

/* The buckets a record is checked in once the classes are resolved: its class's first bucket,
 * or each copy's own (into d->tg; returns how many). */
static uint32_t targets(struct dctx *d, const struct wb_rt_write *x)
{
    uint32_t n = 0;
    int64_t b;
    if (full_fanout(d, x) && (b = bucket_at(d, x->dst_rank, x->dst_tensor)) >= 0 &&
        !d->B[b].cexpand) {
        d->tg[n++] = b;
        return n;
    }
    for (uint32_t k = 0; k < wb_rt_copies(x); k++) {
        uint32_t g = wb_rt_copy_rank(x, k);
        if (g < d->p->nrollouts && (b = bucket_at(d, g, x->dst_tensor)) >= 0)
            d->tg[n++] = b;
    }
    return n;
}

/* Buckets are far apart in memory and each write touches one: the bucket of the write
 * `ahead` records on is asked for early (and, in pass 2, where it marks). */
enum { AHEAD = 12 };

static void prefetch_bucket(const struct dctx *d, const struct wb_route_table *t, uint32_t w,
                            const uint64_t *bits)
{
    if (w >= t->nwrites)
        return;
    const struct wb_rt_write *x = &t->writes[w];
    if (x->dst_rank >= d->p->nrollouts)
        return;
    int64_t b = bucket_at(d, x->dst_rank, x->dst_tensor);
    if (b < 0)
        return;
    __builtin_prefetch(&d->B[b], 1);
    if (bits && d->B[b].bitmap)
        __builtin_prefetch(&bits[d->B[b].at + ((x->dst_off >> d->B[b].shift) >> 6)], 1);
}

/* A record whose copies run past the last rollout rank or have no rank step (pass 1 reports
 * it; the other passes skip it). */
static bool bad_fanout(const struct wb_plan *p, const struct wb_rt_write *x)
{
    return x->dst_rank + (uint64_t)x->more * x->rank_step >= p->nrollouts ||
           (x->more && !x->rank_step);
}

/* Pass 1 of one table: counts, granularity; writes to no bucket or past the wanted prefix. */
static void count_table(struct dctx *d, const struct wb_route_table *t, uint32_t r)
{
    const struct wb_plan *p = d->p;
    for (uint32_t w = 0; w < t->nwrites; w++) {
        const struct wb_rt_write *x = &t->writes[w];
        prefetch_bucket(d, t, w + AHEAD, NULL);
        uint64_t last = x->dst_rank + (uint64_t)x->more * x->rank_step;
        if (bad_fanout(p, x)) {
            if (x->more && !x->rank_step)
                verr(d->v, "rank %u: write %u fans out to %u more replicas with no rank step", r, w,
                     x->more);
            else
                verr(d->v, "rank %u: write %u to rollout rank %" PRIu64 " of %u", r, w,
                     x->dst_rank >= p->nrollouts ? (uint64_t)x->dst_rank : last, p->nrollouts);
            continue;
        }
        if (full_fanout(d, x)) {
            int64_t b = bucket_at(d, x->dst_rank, x->dst_tensor);
            if (b < 0) {
                no_bucket(d, r, w, x->dst_rank, x->dst_tensor);
                continue;
            }
            struct bucket *bk = &d->B[b];
            bk->ccount++;
            bk->cacc |= x->dst_off | x->len;
            if (x->dst_off + x->len > bk->cend)
                bk->cend = x->dst_off + x->len;
            if (x->dst_off + x->len < x->dst_off)
                bk->cend = UINT64_MAX;
            continue;
        }
        for (uint32_t k = 0; k < wb_rt_copies(x); k++) {
            uint32_t g = wb_rt_copy_rank(x, k);
            int64_t b = bucket_at(d, g, x->dst_tensor);
            if (b < 0)
                no_bucket(d, r, w, g, x->dst_tensor);
            else
                count_into(&d->B[b], x);
        }
    }
}

/* Decides each class: checked once on its first bucket, or copy by copy (mixed). */
static void resolve_classes(struct dctx *d)
{
    const struct wb_plan *p = d->p;
    for (uint32_t l = 0; l < d->gpr && d->reps > 1; l++)
        for (uint32_t li = 0; li < p->recv[l].nlocal; li++) {
            int64_t rep = (int64_t)(d->base[l] + li);
            struct bucket *rb = &d->B[rep];
            if (!rb->ccount)
                continue;
            bool mixed = rb->count > 0;
            for (uint32_t j = 1; j < d->reps && !mixed; j++) {
                int64_t m = bucket_at(d, l + j * d->gpr, rb->tensor);
                mixed = m < 0 || d->B[m].count || d->B[m].want != rb->want;
            }
            for (uint32_t j = 0; j < d->reps; j++) {
                int64_t m = bucket_at(d, l + j * d->gpr, rb->tensor);
                if (m < 0) {
                    verr(d->v, "rollout rank %u: written %s, which that rank does not hold",
                         l + j * d->gpr, d->v->in->rollout->p[rb->tensor].name);
                    continue;
                }
                struct bucket *bk = &d->B[m];
                if (mixed || j == 0) {
                    bk->count += rb->ccount;
                    bk->acc |= rb->cacc;
                    if (rb->cend > bk->want)
                        bk->bad = true;
                } else {
                    bk->rep = rep + 1;
                }
            }
            rb->cexpand = mixed;
        }
}

/* Classes of rollout ranks (a replica's buckets standing for every replica's) only where the
 * receive lists follow replicas rank by rank: d->gpr and d->reps, else left as they are. */
static void replica_classes(struct dctx *d, const struct wb_plan *p)
{
    uint32_t gpr = 0; /* the ranks of replica 0 */
    while (gpr < p->nrollouts && p->recv[gpr].replica == 0)
        gpr++;
    bool regular = gpr && p->nrollouts % gpr == 0;
    for (uint32_t g = 0; g < p->nrollouts && regular; g++)
        regular = p->recv[g].replica == g / gpr;
    if (regular) {
        d->gpr = gpr;
        d->reps = p->nrollouts / gpr;
    }
}

/* Storage of each bucket's marks: a bitmap where it is no larger than the writes' pairs, else
 * the pairs; *nbits words and *niv pairs in all. */
static void place_buckets(struct bucket *B, uint64_t nb, uint64_t *nbits, uint64_t *niv)
{
    for (uint64_t i = 0; i < nb; i++) {
        struct bucket *bk = &B[i];
        if (bk->rep)
            continue; /* its class's first bucket stands for it */
        bk->shift = bk->acc ? (uint8_t)__builtin_ctzll(bk->acc) : 0;
        uint64_t words = ((bk->want >> bk->shift) + 63) / 64;
        bk->bitmap = !bk->bad && words <= 2 * (uint64_t)bk->count + 8;
        if (bk->bitmap) {
            bk->at = *nbits;
            *nbits += words;
        } else if (!bk->bad) {
            bk->at = *niv;
            *niv += bk->count;
        }
    }
}

/* Every bucket's whole prefix written, once: marks bk->bad where not. Returns the wrong
 * buckets; *nbadw their writes. */
static uint64_t judge_buckets(struct bucket *B, uint64_t nb, const uint64_t *bits, struct wref *iv,
                              uint64_t *nbadw)
{
    uint64_t nbad = 0;
    for (uint64_t i = 0; i < nb; i++) {
        struct bucket *bk = &B[i];
        if (bk->rep)
            continue;
        if (!bk->bad && bk->bitmap) {
            uint64_t n = bk->want >> bk->shift;
            const uint64_t *bm = bits + bk->at;
            for (uint64_t w = 0; w < n / 64 && !bk->bad; w++)
                bk->bad = bm[w] != ~0ull;
            if (!bk->bad && n % 64)
                bk->bad = bm[n / 64] != (1ull << (n % 64)) - 1;
        } else if (!bk->bad) {
            struct wref *W = iv + bk->at;
            qsort(W, bk->fill, sizeof(*W), cmp_wref);
            uint64_t at = 0;
            for (uint32_t j = 0; j < bk->fill && !bk->bad; j++) {
                bk->bad = W[j].off != at;
                at = W[j].off + W[j].len;
            }
            bk->bad |= at != bk->want;
        }
        if (bk->bad) {
            nbad++;
            *nbadw += bk->count;
        }
    }
    return nbad;
}

static int check_destinations(struct vctx *v)
{
    const struct wb_plan *p = v->p;
    int rc = pl_verify_dest_fast(p, v->in);
    wb_log(WB_LOG_DEBUG, "planner", "verify: destinations by replica classes: %s",
           rc > 0 ? "shown" : "not shown, checked copy by copy");
    if (rc)
        return rc < 0 ? rc : 0; /* shown, class by class (verify_dest.c) */
    rc = -ENOMEM;
    uint32_t *map_of = pl_rollout_mapping_of(v->in);
    uint64_t *base = malloc((p->nrollouts + 1) * sizeof(uint64_t));
    struct bucket *B = NULL;
    uint64_t *bits = NULL;
    struct wref *iv = NULL, *bad = NULL;
    uint64_t *bad_at = NULL;
    struct bmap bmap = {NULL, (uint32_t)v->in->rollout->n};
    int64_t *tg = NULL;
    struct wb_plan_tbuf tb = {0}; /* a lazy plan's tables, expanded one at a time */
    if (!map_of || !base)
        goto out;
    uint64_t nb = 0;
    for (uint32_t g = 0; g < p->nrollouts; g++) {
        base[g] = nb;
        nb += p->recv[g].nlocal;
    }
    base[p->nrollouts] = nb;
    B = calloc(nb + 1, sizeof(*B));
    if (!B)
        goto out;
    if ((uint64_t)p->nrollouts * bmap.nt <= (64u << 20) && nb < UINT32_MAX) {
        bmap.dense = calloc((size_t)p->nrollouts * bmap.nt + 1, sizeof(uint32_t));
        if (!bmap.dense)
            goto out;
        for (uint32_t g = 0; g < p->nrollouts; g++)
            for (uint32_t li = 0; li < p->recv[g].nlocal; li++)
                if (p->recv[g].local[li].tensor < bmap.nt)
                    bmap.dense[(size_t)g * bmap.nt + p->recv[g].local[li].tensor] =
                        (uint32_t)(base[g] + li + 1);
    }
    for (uint32_t g = 0; g < p->nrollouts; g++)
        for (uint32_t li = 0; li < p->recv[g].nlocal; li++) {
            struct bucket *bk = &B[base[g] + li];
            bk->g = g;
            bk->tensor = p->recv[g].local[li].tensor;
            bk->want = pl_local_written(v->in, map_of, &p->recv[g], &p->recv[g].local[li]);
            bk->acc = bk->want;
        }
    struct dctx d = {
        v, p, &bmap, base, B, p->nrollouts, 1, malloc((p->nrollouts + 1) * sizeof(int64_t))};
    if (!d.tg)
        goto out;
    tg = d.tg;
    replica_classes(&d, p);
    for (uint32_t r = 0; r < p->ntrainers; r++) {
        const struct wb_route_table *t = pl_plan_table(p, r, &tb, false);
        if (!t)
            goto out;
        count_table(&d, t, r);
    }
    resolve_classes(&d);
    uint64_t nbits = 0, niv = 0;
    place_buckets(B, nb, &nbits, &niv);
    bits = pl_zalloc(nbits + 1, sizeof(uint64_t));
    iv = malloc((niv + 1) * sizeof(*iv));
    if (!bits || !iv)
        goto out;
    /* pass 2: mark */
    for (uint32_t r = 0; r < p->ntrainers; r++) {
        const struct wb_route_table *t = pl_plan_table(p, r, &tb, false);
        if (!t)
            goto out;
        for (uint32_t w = 0; w < t->nwrites; w++) {
            const struct wb_rt_write *x = &t->writes[w];
            prefetch_bucket(&d, t, w + 2 * AHEAD, NULL);
            prefetch_bucket(&d, t, w + AHEAD, bits);
            if (bad_fanout(p, x))
                continue;
            for (uint32_t n = targets(&d, x), k = 0; k < n; k++)
                mark_into(&B[d.tg[k]], bits, iv, x);
        }
    }
    uint64_t nbadw = 0, nbad = judge_buckets(B, nb, bits, iv, &nbadw);
    if (nbad) {
        /* the exact report: every wrong bucket's writes, gathered by one more pass (a class
         * is reported on its first rank) */
        bad_at = calloc(nb + 1, sizeof(uint64_t));
        bad = malloc((nbadw + 1) * sizeof(*bad));
        if (!bad_at || !bad)
            goto out;
        uint64_t at = 0;
        for (uint64_t i = 0; i < nb; i++)
            if (B[i].bad && !B[i].rep) {
                bad_at[i] = at;
                at += B[i].count;
                B[i].fill = 0;
            }
        for (uint32_t r = 0; r < p->ntrainers; r++) {
            const struct wb_route_table *t = pl_plan_table(p, r, &tb, false);
            if (!t)
                goto out;
            for (uint32_t w = 0; w < t->nwrites; w++) {
                const struct wb_rt_write *x = &t->writes[w];
                if (bad_fanout(p, x))
                    continue;
                for (uint32_t n = targets(&d, x), k = 0; k < n; k++) {
                    struct bucket *bk = &B[d.tg[k]];
                    if (bk->bad && !bk->rep && bk->fill < bk->count)
                        bad[bad_at[d.tg[k]] + bk->fill++] =
                            (struct wref){x->dst_tensor, x->dst_off, x->len};
                }
            }
        }
        for (uint64_t i = 0; i < nb; i++)
            if (B[i].bad && !B[i].rep)
                report_bucket(v, &B[i], bad + bad_at[i], B[i].fill);
    }
    rc = 0;
out:
    free(tg);
    free(bmap.dense);
    free(map_of);
    free(base);
    free(B);
    free(bits);
    free(iv);
    free(bad);
    free(bad_at);
    wb_plan_tbuf_free(&tb);
    return rc;
}

static void *destinations_thread(void *arg)
{
    struct vctx *d = arg;
    uint64_t t0 = wb_now_ns();
    d->rc = check_destinations(d);
    wb_log(WB_LOG_DEBUG, "planner", "verify: destinations in %.3f s",
           (double)(wb_now_ns() - t0) * 1e-9);
    return NULL;
}

/* Whether a lazy plan's stamped segment reads what its representative's rows read: every
 * trainer tensor pair has one dtype and, at the two ranks, shard boxes of one shape (or no
 * shard at either), and every renumbered box and shape equals the one it stands for. Then each
 * of its ops and records reads held bytes exactly when the representative's does, and those
 * are checked where they are, in the representative's own table; what differs (amax tags and
 * peers, gathers' peers, destinations) is checked for the segment itself. The renumbering is
 * the one wb_plan_table() and an eager build apply (lazy.c); the planner's tests check that
 * both give the same tables. */
static bool congruent(struct vctx *v, const struct wb_route_table *t, const struct pl_seg *sg,
                      const uint32_t *pool)
{
    const struct wb_inventory *ti = v->in->trainer;
    if (sg->src >= v->p->ntrainers)
        return false;
    const struct wb_route_table *src = &pl_tables(v->p)[sg->src];
    if (src->residence != t->residence || (sg->same && sg->src != t->rank))
        return false;
    const uint32_t *tm = pool + sg->map0, *bx = tm + 2 * sg->ntm, *sh = bx + 2 * sg->nbx;
    uint32_t ca = UINT32_MAX, cb = UINT32_MAX; /* a shard follows from (class, rank) */
    for (uint32_t i = 0; i < sg->ntm; i++) {
        uint32_t a = tm[2 * i], b = tm[2 * i + 1];
        if (a >= ti->n || b >= ti->n || ti->p[a].dtype != ti->p[b].dtype)
            return false;
        if (v->tcls && v->pm->place[a].rule >= 0 && v->pm->place[b].rule >= 0 && v->tcls[a] == ca &&
            v->tcls[b] == cb)
            continue; /* the pair before had these classes */
        ca = v->tcls && v->pm->place[a].rule >= 0 ? v->tcls[a] : UINT32_MAX;
        cb = v->tcls && v->pm->place[b].rule >= 0 ? v->tcls[b] : UINT32_MAX;
        struct wb_box A, B;
        bool ha = shard_of(v, a, sg->src, &A), hb = shard_of(v, b, t->rank, &B);
        if (ha != hb || (ha && A.ndim != B.ndim))
            return false;
        for (uint32_t d = 0; ha && d < A.ndim && d < WB_MAX_DIMS; d++)
            if (A.ext[d] != B.ext[d])
                return false;
    }
    for (uint32_t i = 0; i < sg->nbx; i++)
        if (bx[2 * i] >= src->nboxes || bx[2 * i + 1] >= t->nboxes ||
            !wb_box_eq(&src->boxes[bx[2 * i]], &t->boxes[bx[2 * i + 1]]))
            return false;
    for (uint32_t i = 0; i < sg->nsh; i++)
        if (sh[2 * i] >= src->nshapes || sh[2 * i + 1] >= t->nshapes ||
            !wb_shape_eq(&src->shapes[sh[2 * i]], &t->shapes[sh[2 * i + 1]]))
            return false;
    return true;
}

/* A stamped task of a congruent segment: its representative's sizes, and its amax exchanges
 * noted for the mirror check. Returns 1 when it must be checked op by op instead (a gather, or
 * sizes that differ), else 0 or -ENOMEM. */
static int check_stamped(struct vctx *v, const struct wb_route_table *t, const struct wb_rt_task *k,
                         uint32_t ki, const struct pl_rows *R, const uint32_t *pool)
{
    const struct pl_seg *sg = R->seg;
    const struct wb_rt_task *x = &R->rows->tasks[sg->task0 + (ki - sg->at_task)];
    if (sg->gathers || x->nops != k->nops || x->nwrites != k->nwrites ||
        x->tmp_bytes != k->tmp_bytes)
        return 1;
    /* the AMAX ops and their peers renumbered, their slots asked for, then noted */
    const struct wb_route_table *src = R->rows;
    enum { BATCH = 16 };
    struct wb_rt_op amax[BATCH];
    const struct wb_rt_amax_peer *pes[BATCH]; /* the source's peers of each */
    uint32_t n = 0;
    for (uint32_t o = 0; o <= k->nops; o++) {
        if (o < k->nops && R->ops[o].kind != WB_OP_AMAX)
            continue;
        if (o < k->nops) {
            const struct wb_rt_op *xo = &R->ops[o]; /* the representative's */
            struct wb_rt_op *op = &amax[n];
            pl_seg_ops(sg, pool, xo, 1, op);
            if (xo->amax.npeers == 0 || xo->amax.peer0 < sg->xsrc ||
                xo->amax.peer0 - sg->xsrc > src->namax_peers ||
                xo->amax.npeers > src->namax_peers - (xo->amax.peer0 - sg->xsrc)) {
                const struct wb_inventory *ti = v->in->trainer;
                verr(v, "rank %u: op %u (amax) on %s lists peers [%u, +%u) of its %u", t->rank,
                     k->op0 + o, op->tensor < ti->n ? ti->p[op->tensor].name : "?", op->amax.peer0,
                     op->amax.npeers, pl_table_napeers(v->p, t->rank));
                continue;
            }
            pes[n++] = &src->amax_peers[xo->amax.peer0 - sg->xsrc];
            for (uint32_t j = 0; v->ox && j < op->amax.npeers; j++)
                if (pes[n - 1][j].tag + sg->tag_shift < v->ox->ntag)
                    __builtin_prefetch(&v->ox->at[pes[n - 1][j].tag + sg->tag_shift], 1);
            if (n < BATCH)
                continue;
        }
        for (uint32_t i = 0; i < n; i++)
            for (uint32_t j = 0; j < amax[i].amax.npeers; j++) {
                struct wb_rt_amax_peer pe;
                pl_seg_apeers(sg, pool, &pes[i][j], 1, &pe);
                if (note_amax(v, t, &amax[i], &pe))
                    return -ENOMEM;
            }
        n = 0;
    }
    return 0;
}

/* Sources of the tables of ranks [rank0, rank1). A lazy plan's stamped tasks are checked by
 * their segment's congruence (once per segment) where it holds, else expanded. */
static void *sources_thread(void *arg)
{
    struct vctx *v = arg;
    const struct wb_plan *p = v->p;
    struct vec pr;
    pl_vec_init(&pr, sizeof(struct range));
    struct wb_plan_tbuf tb = {0}; /* a table with stamped tasks to check op by op, expanded */
    int r = 0;
    for (uint32_t rk = v->rank0; rk < v->rank1 && !r; rk++) {
        const struct wb_route_table *t = &pl_tables(p)[rk];
        const uint32_t *pool = pl_lazy_of(p) ? pl_lazy_of(p)->t[rk].pool : NULL;
        if (v->ox)
            v->ox->g0[rk] = v->gref.n; /* this thread's; made plan-wide after the join */
        struct pl_cursor cu = {0};
        struct pl_rows R, N;
        const struct pl_seg *seen = NULL; /* the segment whose congruence is known */
        const struct wb_route_table *x = NULL;
        bool cong = false;
        if (t->ntasks)
            pl_task_rows(p, rk, 0, &cu, &N);
        for (uint32_t k = 0; k < t->ntasks && !r; k++) {
            const struct wb_rt_task *T = &t->tasks[k];
            R = N;
            if (k + 1 < t->ntasks) {
                pl_task_rows(p, rk, k + 1, &cu, &N);
                if (!N.seg) /* a stamped task asks for its own */
                    prefetch_task(v, t, &t->tasks[k + 1], &N);
            }
            if (!R.seg) {
                r = check_task(v, t, T, R.ops, R.writes, R.xoff, pl_table_napeers(p, rk), &pr);
                continue;
            }
            if (R.seg != seen) {
                seen = R.seg;
                cong = congruent(v, t, R.seg, pool);
            }
            if (cong && (r = check_stamped(v, t, T, k, &R, pool)) <= 0)
                continue;
            if (!x && !(x = wb_plan_table(p, rk, &tb))) { /* op by op: the table expanded */
                r = -ENOMEM;
                break;
            }
            r = check_task(v, x, T, x->ops + T->op0, x->writes + T->write0, 0, x->namax_peers, &pr);
        }
    }
    pl_vec_free(&pr);
    wb_plan_tbuf_free(&tb);
    v->rc = r;
    return NULL;
}

/* ---------------------------------------------------------------- order */

/* Every exchange of an AMAX op has exactly one mirror: the same tag in an AMAX op of its peer,
 * naming this rank back, same tensor and blocks, inboxes crossed (equal fingerprints, noted by
 * the sources threads). */
static void check_amax(struct vctx *v, struct order_idx *x, const struct vec *xtra)
{
    if (xtra->n) { /* tags past the array: into a larger one (a plan whose figures are off) */
        const struct aref *E = xtra->p;
        uint64_t n = x->ntag;
        for (size_t i = 0; i < xtra->n; i++)
            n = E[i].tag >= n ? (uint64_t)E[i].tag + 1 : n;
        struct amax_slot *na = realloc(x->at, n * sizeof(*na));
        if (!na) {
            verr(v, "verify: out of memory indexing %" PRIu64 " amax tags", n);
            return;
        }
        memset(na + x->ntag, 0, (n - x->ntag) * sizeof(*na));
        x->at = na;
        x->ntag = (uint32_t)n;
        for (size_t i = 0; i < xtra->n; i++) {
            struct amax_slot *sl = &x->at[E[i].tag];
            uint32_t side = E[i].side;
            if (sl->rank[side]) {
                x->too_many = true;
                x->many_tag = E[i].tag;
                x->many_rank = E[i].rank;
                continue;
            }
            sl->rank[side] = E[i].rank + 1;
            sl->fp[side] = E[i].fp;
        }
    }
    if (x->too_many)
        verr(v, "amax tag %u used by more than two exchanges (rank %u)", x->many_tag, x->many_rank);
    for (uint32_t tag = 1; tag < x->ntag; tag++) {
        const struct amax_slot *sl = &x->at[tag];
        if (!sl->rank[0] && !sl->rank[1])
            continue;
        if (!sl->rank[0] || !sl->rank[1]) {
            verr(v, "rank %u: amax exchange tag %u has no mirror",
                 (sl->rank[0] ? sl->rank[0] : sl->rank[1]) - 1, tag);
            continue;
        }
        if (sl->fp[0] != sl->fp[1])
            verr(v, "amax exchange tag %u: ranks %u and %u do not mirror each other", tag,
                 sl->rank[0] - 1, sl->rank[1] - 1);
    }
}

static int check_order(struct vctx *v, struct order_idx *ox, const struct vec *xtra)
{
    const struct wb_plan *p = v->p;
    for (uint32_t i = 0; i < p->nmeshes; i++)
        for (uint32_t j = i + 1; j < p->nmeshes; j++) {
            if (p->meshes[i].phase != p->meshes[j].phase)
                continue;
            const struct wb_plan_mesh *a = &p->meshes[i], *b = &p->meshes[j];
            for (uint32_t x = 0, y = 0; x < a->n && y < b->n;) {
                if (a->ranks[x] == b->ranks[y]) {
                    verr(v, "mesh group %u: meshes %u and %u share rank %u", a->phase, i, j,
                         a->ranks[x]);
                    break;
                }
                if (a->ranks[x] < b->ranks[y])
                    x++;
                else
                    y++;
            }
        }
    struct order_idx x = *ox;
    /* gather sequences: per mesh, every member's (seq, tensor) list equals the first's */
    const struct gref *G = x.g.p;
    for (uint32_t m = 0; m < p->nmeshes; m++) {
        const struct wb_plan_mesh *ms = &p->meshes[m];
        uint32_t ref = UINT32_MAX;
        for (uint32_t k = 0; k < ms->n; k++) {
            uint32_t r = ms->ranks[k];
            if (r >= p->ntrainers)
                continue;
            if (ref == UINT32_MAX) {
                ref = r;
                continue;
            }
            uint64_t i = x.g0[ref], j = x.g0[r];
            bool bad = false;
            for (;;) { /* the two ranks' gathers of mesh m, in order */
                while (i < x.g0[ref + 1] && G[i].mesh != m)
                    i++;
                while (j < x.g0[r + 1] && G[j].mesh != m)
                    j++;
                bool ei = i == x.g0[ref + 1], ej = j == x.g0[r + 1];
                if (ei || ej) {
                    bad = ei != ej;
                    break;
                }
                if (G[i].seq != G[j].seq || G[i].tensor != G[j].tensor) {
                    bad = true;
                    break;
                }
                i++;
                j++;
            }
            if (bad)
                verr(v, "mesh %u: rank %u's gathers differ from rank %u's", m, r, ref);
        }
    }
    for (uint32_t r = 0; r < p->ntrainers; r++) {
        const struct wb_route_table *t = &pl_tables(p)[r];
        for (uint32_t k = 1; k < t->ntasks; k++)
            if (t->tasks[k].phase < t->tasks[k - 1].phase)
                verr(v, "rank %u: task %u of phase %u after a task of phase %u", r, k,
                     t->tasks[k].phase, t->tasks[k - 1].phase);
    }
    check_amax(v, &x, xtra);
    *ox = x;
    return 0;
}

int wb_plan_verify(const struct wb_plan *p, const struct wb_plan_input *in, struct wb_errlist *el)
{
    return pl_verify(p, in, el, sysconf(_SC_NPROCESSORS_ONLN) > 1);
}

int pl_verify(const struct wb_plan *p, const struct wb_plan_input *in, struct wb_errlist *el,
              bool threads)
{
    struct vctx v = {.p = p, .in = in, .pr = {el, 0}};
    v.smemo = calloc(1u << SHARD_MEMO_BITS, sizeof(*v.smemo)); /* NULL: nothing kept */
    /* tensors no mapping uses may match no rule: place only the used ones */
    bool *used = calloc(in->trainer->n + 1, sizeof(bool));
    if (!used)
        return -ENOMEM;
    for (size_t m = 0; m < in->match->n; m++)
        for (uint32_t k = 0; k < in->match->map[m].ncomp; k++)
            used[in->match->map[m].comp[k].trainer] = true;
    int r = wb_placement_map_build(in->tl, in->trainer, used, &v.pm, el);
    free(used);
    if (r) {
        free(v.smemo);
        return r;
    }
    v.tcls = calloc(in->trainer->n + 1, sizeof(uint32_t));
    if (!v.tcls) {
        wb_placement_map_free(v.pm);
        free(v.smemo);
        return -ENOMEM;
    }
    struct intern cls;
    pl_intern_init(&cls, sizeof(struct tcls_key));
    for (size_t t = 0; t < in->trainer->n && !cls.err; t++) {
        struct tcls_key k;
        memset(&k, 0, sizeof(k)); /* interned by its bytes */
        memcpy(&k.tp, &v.pm->place[t], sizeof(k.tp));
        k.shape.ndim = in->trainer->p[t].shape.ndim;
        for (uint32_t d = 0; d < k.shape.ndim && d < WB_MAX_DIMS; d++)
            k.shape.dim[d] = in->trainer->p[t].shape.dim[d];
        v.tcls[t] = pl_intern_bytes(&cls, &k);
    }
    if (cls.err) {
        free(v.smemo); /* shard_of computes every answer */
        v.smemo = NULL;
    }
    pl_intern_free(&cls);
    /* Sources and destinations are independent reads of the plan: the sources of the first
     * half of the tables here, of the second half and the destinations on threads when it may
     * use them, each with its own problems, reported as one walk would: sources in rank
     * order, then destinations. */
    bool many = threads;
    struct order_idx ox;
    memset(&ox, 0, sizeof(ox));
    pl_vec_init(&ox.g, sizeof(struct gref));
    ox.g0 = calloc((size_t)p->ntrainers + 1, sizeof(uint64_t));
    /* every tag is below 2^tag_bits (as the estimate sizes its rendezvous); a tag past that
     * goes the slow way (xtra) */
    uint32_t bits = p->ntrainers ? pl_tables(p)[0].tag_bits : 0;
    ox.ntag = bits >= 1 && bits <= 30 ? 1u << bits : 1;
    ox.at = calloc(ox.ntag, sizeof(*ox.at));
    if (!ox.g0 || !ox.at) {
        free(ox.g0);
        free(ox.at);
        wb_placement_map_free(v.pm);
        free(v.smemo);
        free(v.tcls);
        return -ENOMEM;
    }
    v.ox = &ox;
    pl_vec_init(&v.gref, sizeof(struct gref));
    pl_vec_init(&v.xtra, sizeof(struct aref));
    struct vctx d = v, s2 = v;
    struct wb_errlist del, sel;
    wb_errlist_init(&del);
    wb_errlist_init(&sel);
    d.pr = (struct pl_problems){&del, 0};
    d.smemo = NULL;
    s2.pr = (struct pl_problems){&sel, 0};
    s2.smemo = many ? calloc(1u << SHARD_MEMO_BITS, sizeof(*s2.smemo)) : NULL;
    v.rank0 = 0;
    v.rank1 = s2.rank0 = many ? p->ntrainers / 2 : p->ntrainers;
    s2.rank1 = p->ntrainers;
    uint64_t t0 = wb_now_ns();
    pthread_t th, th2;
    bool two = many && pthread_create(&th, NULL, destinations_thread, &d) == 0;
    bool three = many && pthread_create(&th2, NULL, sources_thread, &s2) == 0;
    sources_thread(&v);
    if (!three)
        sources_thread(&s2);
    if (two)
        pthread_join(th, NULL);
    else
        destinations_thread(&d);
    if (three)
        pthread_join(th2, NULL);
    wb_log(WB_LOG_DEBUG, "planner", "verify: sources and destinations in %.3f s",
           (double)(wb_now_ns() - t0) * 1e-9);
    r = v.rc ? v.rc : s2.rc ? s2.rc : d.rc;
    pl_problems_take(&v.pr, &sel); /* as one walk reports them */
    pl_problems_take(&v.pr, &del);
    free(s2.smemo);
    /* the gathers and the amax ops past the array, in rank order */
    for (uint32_t rk = s2.rank0; rk < s2.rank1; rk++)
        ox.g0[rk] += v.gref.n;
    ox.g0[p->ntrainers] = v.gref.n + s2.gref.n;
    if (!r && (pl_vec_reserve(&v.gref, s2.gref.n) || pl_vec_reserve(&v.xtra, s2.xtra.n)))
        r = -ENOMEM;
    if (!r) {
        for (size_t i = 0; i < s2.gref.n; i++)
            *VEC_AT(&v.gref, struct gref, v.gref.n++) = *VEC_AT(&s2.gref, struct gref, i);
        for (size_t i = 0; i < s2.xtra.n; i++)
            *VEC_AT(&v.xtra, struct aref, v.xtra.n++) = *VEC_AT(&s2.xtra, struct aref, i);
        ox.g = v.gref;
        pl_vec_init(&v.gref, sizeof(struct gref));
        r = check_order(&v, &ox, &v.xtra);
    }
    wb_log(WB_LOG_DEBUG, "planner", "verify: order and amax mirrors, done at %.3f s",
           (double)(wb_now_ns() - t0) * 1e-9);
    pl_vec_free(&v.gref);
    pl_vec_free(&s2.gref);
    pl_vec_free(&v.xtra);
    pl_vec_free(&s2.xtra);
    pl_vec_free(&ox.g);
    free(ox.g0);
    free(ox.at);
    wb_placement_map_free(v.pm);
    free(v.smemo);
    free(v.tcls);
    if (r)
        return r;
    /* under a relay, the replicas the trainers do not write are written by their parents */
    int rr = p->relay.kind != WB_PLAN_RELAY_OFF ? pl_relay_verify_plan(p, el) : 0;
    if (rr == -ENOMEM)
        return rr;
    return v.pr.n || rr ? -WB_E_PLAN : 0;
}
