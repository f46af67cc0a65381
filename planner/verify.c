/* verify.c — wb_plan_verify(): checks a plan's invariants without data, so that it runs on
 * 1T-parameter plans in seconds:
 *  - destinations: every byte of every rollout rank's local tensors is written exactly once
 *    (but for the padding rows of a vocab-padded tensor, which nothing writes), and every
 *    write lies inside its local tensor;
 *  - sources: a write reads the rank's own shard (PARAM, GPU residence, inside the shard) or
 *    bytes of its task's TMP that an earlier op of the task produced; every op reads only
 *    such bytes; H2D reads the rank's own shard; a GATHER's peers are owners holding exactly
 *    the boxes listed, which tile the tensor;
 *  - order: mesh groups are disjoint; tasks are in phase order; every member of a mesh has the
 *    same GATHER sequence; every AMAX op has its mirror (same tag, blocks, crossed inboxes).
 * The data itself (values after fuse/quantize) is checked by the CPU execution test on small
 * cases (tests/unit/planner_sim.h). */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "planner/plan_int.h"

struct vctx {
    const struct wb_plan *p;
    const struct wb_plan_input *in;
    struct wb_placement_map *pm;
    struct pl_problems pr; /* the first PL_KEEP violations kept, every one counted */
};

#define verr(v, ...) pl_problem(&(v)->pr, __VA_ARGS__)

/* Rank r's shard box of tensor t, or false. */
static bool shard_of(struct vctx *v, uint32_t t, uint32_t r, struct wb_box *box)
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

static int push_range(struct vec *pr, uint64_t a, uint64_t n)
{
    struct range x = {a, a + n};
    return pl_vec_push(pr, &x) ? 0 : -ENOMEM;
}

static int check_task(struct vctx *v, const struct wb_route_table *t, const struct wb_rt_task *k,
                      struct vec *pr)
{
    const struct wb_inventory *ti = v->in->trainer;
    pr->n = 0;
    for (uint32_t o = k->op0; o < k->op0 + k->nops; o++) {
        const struct wb_rt_op *op = &t->ops[o];
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
            const struct wb_shape *full = &ti->p[op->tensor].shape;
            uint64_t sum = 0;
            for (uint32_t i = 0; i < g->npeers && ok; i++) {
                const struct wb_rt_peer *pe = &t->peers[g->peer0 + i];
                struct wb_box B;
                ok = shard_of(v, op->tensor, pe->rank, &B) && wb_box_eq(&B, &t->boxes[pe->box]);
                sum += wb_box_numel(&t->boxes[pe->box]);
            }
            struct wb_box own;
            ok = ok && sum == wb_shape_numel(full) && wb_shape_eq(&t->shapes[g->dst.shape], full) &&
                 g->dst.kind == WB_BUF_TMP && shard_of(v, op->tensor, t->rank, &own) &&
                 (wb_box_numel(&own) == 0 || view_readable(v, t, pr, &g->src)) &&
                 g->dst.off + view_bytes(t, &g->dst) <= k->tmp_bytes;
            r = push_range(pr, g->dst.off, view_bytes(t, &g->dst));
            break;
        }
        case WB_OP_AMAX:
            ok = view_readable(v, t, pr, &op->amax.src);
            break;
        case WB_OP_COPY:
        case WB_OP_CAST:
            ok = view_readable(v, t, pr, &op->copy.src) && op->copy.dst.kind == WB_BUF_TMP &&
                 op->copy.dst.off + view_bytes(t, &op->copy.dst) <= k->tmp_bytes;
            r = push_range(pr, op->copy.dst.off, view_bytes(t, &op->copy.dst));
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
    for (uint32_t w = k->write0; w < k->write0 + k->nwrites; w++) {
        const struct wb_rt_write *x = &t->writes[w];
        bool ok;
        if (x->src_tensor == (uint32_t)WB_RT_TMP_SRC) {
            ok = produced(pr, x->src_off, x->len);
        } else {
            struct wb_box B;
            ok =
                t->residence == WB_RESIDE_GPU && shard_of(v, x->src_tensor, t->rank, &B) &&
                x->src_off + x->len <= wb_box_numel(&B) * wb_dtype_size(ti->p[x->src_tensor].dtype);
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

/* The bytes of rollout rank g's local tensor `tensor` that the plan must write: all of it,
 * except for a mapping whose rollout pieces cover less than its local shape (vocab padding
 * rows, or a tensor only tp rank 0 holds); those pieces start at local byte 0 (padding rows
 * come last along dim 0), so the written bytes are a prefix. */
static uint64_t bytes_written(struct vctx *v, const uint32_t *map_of, uint32_t g,
                              const struct wb_rt_local *lo)
{
    uint32_t mi = map_of[lo->tensor];
    if (mi == UINT32_MAX)
        return lo->bytes;
    const struct wb_mapping *m = &v->in->match->map[mi];
    if (!m->shard.pad && m->shard.ep1_tp_dim != WB_SHARD_RANK0)
        return lo->bytes;
    const struct wb_recv_list *rv = &v->p->recv[g];
    struct wb_shape ls;
    struct wb_local_piece pc[WB_MAX_PIECES];
    uint32_t np = 0;
    struct wb_errlist el;
    wb_errlist_init(&el);
    int r = wb_mapping_local(v->in->match, v->in->rollout, m, rv->tp_rank, v->in->rl->tp,
                             rv->ep_rank, v->in->rl->ep, &ls, pc, &np, &el);
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

static int check_destinations(struct vctx *v)
{
    const struct wb_plan *p = v->p;
    /* rollout tensor -> the mapping that builds it (value or scale), for bytes_written() */
    uint32_t *map_of = malloc((v->in->rollout->n + 1) * sizeof(uint32_t));
    if (!map_of)
        return -ENOMEM;
    for (size_t t = 0; t < v->in->rollout->n; t++)
        map_of[t] = UINT32_MAX;
    for (size_t m = 0; m < v->in->match->n; m++) {
        const struct wb_mapping *mp = &v->in->match->map[m];
        map_of[mp->rollout] = (uint32_t)m;
        if (mp->scale >= 0)
            map_of[mp->scale] = (uint32_t)m;
    }
    /* CSR index of writes by destination rank: (table, write) pairs */
    uint64_t *start = calloc(p->nrollouts + 1, sizeof(uint64_t));
    if (!start) {
        free(map_of);
        return -ENOMEM;
    }
    for (uint32_t r = 0; r < p->ntrainers; r++)
        for (uint32_t w = 0; w < p->tables[r].nwrites; w++) {
            uint32_t g = p->tables[r].writes[w].dst_rank;
            if (g >= p->nrollouts) {
                verr(v, "rank %u: write %u to rollout rank %u of %u", r, w, g, p->nrollouts);
                continue;
            }
            start[g + 1]++;
        }
    for (uint32_t g = 0; g < p->nrollouts; g++)
        start[g + 1] += start[g];
    uint32_t(*refs)[2] = malloc((start[p->nrollouts] + 1) * sizeof(*refs));
    uint64_t *fill = malloc((p->nrollouts + 1) * sizeof(uint64_t));
    if (!refs || !fill) {
        free(start);
        free(refs);
        free(fill);
        free(map_of);
        return -ENOMEM;
    }
    memcpy(fill, start, p->nrollouts * sizeof(uint64_t));
    uint64_t maxn = 0;
    for (uint32_t r = 0; r < p->ntrainers; r++)
        for (uint32_t w = 0; w < p->tables[r].nwrites; w++) {
            uint32_t g = p->tables[r].writes[w].dst_rank;
            if (g < p->nrollouts) {
                refs[fill[g]][0] = r;
                refs[fill[g]++][1] = w;
            }
        }
    for (uint32_t g = 0; g < p->nrollouts; g++)
        if (start[g + 1] - start[g] > maxn)
            maxn = start[g + 1] - start[g];
    struct wref *W = malloc((maxn + 1) * sizeof(*W));
    int rc = W ? 0 : -ENOMEM;
    for (uint32_t g = 0; g < p->nrollouts && !rc; g++) {
        const struct wb_recv_list *rv = &p->recv[g];
        size_t n = 0;
        for (uint64_t i = start[g]; i < start[g + 1]; i++) {
            const struct wb_rt_write *x = &p->tables[refs[i][0]].writes[refs[i][1]];
            W[n++] = (struct wref){x->dst_tensor, x->dst_off, x->len};
        }
        qsort(W, n, sizeof(*W), cmp_wref);
        size_t j = 0;
        for (uint32_t li = 0; li < rv->nlocal; li++) {
            const struct wb_rt_local *lo = &rv->local[li];
            const char *name = v->in->rollout->p[lo->tensor].name;
            while (j < n && W[j].tensor < lo->tensor)
                j++;
            uint64_t at = 0;
            for (; j < n && W[j].tensor == lo->tensor; j++) {
                if (W[j].off != at) {
                    verr(v, "rollout rank %u %s: bytes [%" PRIu64 ", %" PRIu64 ") %s", g, name,
                         W[j].off < at ? W[j].off : at, W[j].off < at ? at : W[j].off,
                         W[j].off < at ? "written twice" : "never written");
                }
                at = W[j].off + W[j].len > at ? W[j].off + W[j].len : at;
            }
            uint64_t want = bytes_written(v, map_of, g, lo);
            if (at != want)
                verr(v, "rollout rank %u %s: %s at byte %" PRIu64 " of %" PRIu64, g, name,
                     at < want ? "writes end" : "writes run past the end", at, want);
        }
    }
    free(map_of);
    free(W);
    free(refs);
    free(fill);
    free(start);
    return rc;
}

/* ---------------------------------------------------------------- order */

/* Every AMAX op has exactly one mirror: same tag on its peer, pointing back, same tensor and
 * blocks, inboxes crossed. Tags are plan-wide, so an index by tag finds the pair. */
static void check_amax(struct vctx *v)
{
    const struct wb_plan *p = v->p;
    uint32_t maxtag = 0;
    for (uint32_t r = 0; r < p->ntrainers; r++)
        for (uint32_t o = 0; o < p->tables[r].nops; o++)
            if (p->tables[r].ops[o].kind == WB_OP_AMAX && p->tables[r].ops[o].amax.tag > maxtag)
                maxtag = p->tables[r].ops[o].amax.tag;
    if (maxtag == 0)
        return;
    uint32_t(*at)[4] = calloc((size_t)maxtag + 1, sizeof(*at)); /* rank+1, op, rank+1, op */
    if (!at) {
        verr(v, "verify: out of memory indexing %u amax tags", maxtag);
        return;
    }
    for (uint32_t r = 0; r < p->ntrainers; r++)
        for (uint32_t o = 0; o < p->tables[r].nops; o++) {
            const struct wb_rt_op *op = &p->tables[r].ops[o];
            if (op->kind != WB_OP_AMAX)
                continue;
            uint32_t *e = at[op->amax.tag];
            if (!e[0]) {
                e[0] = r + 1;
                e[1] = o;
            } else if (!e[2]) {
                e[2] = r + 1;
                e[3] = o;
            } else {
                verr(v, "amax tag %u used by more than two ops (rank %u)", op->amax.tag, r);
            }
        }
    for (uint32_t tag = 1; tag <= maxtag; tag++) {
        const uint32_t *e = at[tag];
        if (!e[0])
            continue;
        if (!e[2]) {
            verr(v, "rank %u: amax exchange tag %u has no mirror", e[0] - 1, tag);
            continue;
        }
        const struct wb_route_table *ta = &p->tables[e[0] - 1], *tb = &p->tables[e[2] - 1];
        const struct wb_rt_op *a = &ta->ops[e[1]], *b = &tb->ops[e[3]];
        if (a->amax.peer != tb->rank || b->amax.peer != ta->rank || a->tensor != b->tensor ||
            !wb_box_eq(&ta->boxes[a->amax.blocks], &tb->boxes[b->amax.blocks]) ||
            a->amax.inbox_off != b->amax.peer_inbox_off ||
            a->amax.peer_inbox_off != b->amax.inbox_off)
            verr(v, "amax exchange tag %u: ranks %u and %u do not mirror each other", tag, ta->rank,
                 tb->rank);
    }
    free(at);
}

static void check_order(struct vctx *v)
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
    /* gather sequences: per mesh, every member's (seq, tensor) list equals the first's */
    for (uint32_t m = 0; m < p->nmeshes; m++) {
        const struct wb_plan_mesh *ms = &p->meshes[m];
        const struct wb_route_table *ref = NULL;
        struct vec rs;
        pl_vec_init(&rs, 2 * sizeof(uint32_t));
        for (uint32_t k = 0; k < ms->n; k++) {
            const struct wb_route_table *t = &p->tables[ms->ranks[k]];
            size_t pos = 0;
            bool bad = false;
            for (uint32_t o = 0; o < t->nops && !bad; o++) {
                const struct wb_rt_op *op = &t->ops[o];
                if (op->kind != WB_OP_GATHER || op->gather.mesh != m)
                    continue;
                uint32_t e[2] = {op->gather.seq, op->tensor};
                if (!ref) {
                    if (!pl_vec_push(&rs, e))
                        break;
                } else if (pos >= rs.n || memcmp(VEC_AT(&rs, uint32_t, 2 * pos), e, sizeof(e))) {
                    bad = true;
                }
                pos++;
            }
            if (ref && (bad || pos != rs.n))
                verr(v, "mesh %u: rank %u's gathers differ from rank %u's", m, t->rank, ref->rank);
            if (!ref)
                ref = t;
        }
        pl_vec_free(&rs);
    }
    for (uint32_t r = 0; r < p->ntrainers; r++) {
        const struct wb_route_table *t = &p->tables[r];
        for (uint32_t k = 1; k < t->ntasks; k++)
            if (t->tasks[k].phase < t->tasks[k - 1].phase)
                verr(v, "rank %u: task %u of phase %u after a task of phase %u", r, k,
                     t->tasks[k].phase, t->tasks[k - 1].phase);
    }
    check_amax(v);
}

int wb_plan_verify(const struct wb_plan *p, const struct wb_plan_input *in, struct wb_errlist *el)
{
    struct vctx v = {.p = p, .in = in, .pr = {el, 0}};
    /* tensors no mapping uses may match no rule: place only the used ones */
    bool *used = calloc(in->trainer->n + 1, sizeof(bool));
    if (!used)
        return -ENOMEM;
    for (size_t m = 0; m < in->match->n; m++)
        for (uint32_t k = 0; k < in->match->map[m].ncomp; k++)
            used[in->match->map[m].comp[k].trainer] = true;
    int r = wb_placement_map_build(in->tl, in->trainer, used, &v.pm, el);
    free(used);
    if (r)
        return r;
    struct vec pr;
    pl_vec_init(&pr, sizeof(struct range));
    for (uint32_t rk = 0; rk < p->ntrainers && !r; rk++) {
        const struct wb_route_table *t = &p->tables[rk];
        for (uint32_t k = 0; k < t->ntasks && !r; k++)
            r = check_task(&v, t, &t->tasks[k], &pr);
    }
    pl_vec_free(&pr);
    if (!r)
        r = check_destinations(&v);
    if (!r)
        check_order(&v);
    wb_placement_map_free(v.pm);
    if (r)
        return r;
    return v.pr.n ? -WB_E_PLAN : 0;
}
