/* walk.c — an item's subpieces and demands, enumerated in plan order (see build.h for the
 * passes). Pass 1 hands the demands to the balancer; pass 3 walks the same item again and reads
 * each demand's senders back into assignments (c->asg), so nothing per demand is stored in
 * between but the balancer's record of demands with several candidates.
 *
 * A subpiece is one component's part of one rollout local piece; a demand is a subpiece's
 * intersection with one shard (direct mode: its candidates are the shard's replicas) or the
 * whole subpiece (gather mode: the mesh's members), needed by each rollout replica. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "planner/build.h"

int pl_item_subpieces(struct plan_ctx *c, const struct item *it)
{
    const struct wb_mapping *mp = pl_ctx_map(c, it->mapping);
    c->sub.n = 0;
    for (uint32_t l = 0; l < c->gpr; l++) {
        const struct rlocal *lo = &c->rloc[it->mapping * c->gpr + l];
        for (uint32_t p = 0; p < lo->np; p++) {
            const struct wb_local_piece *pc = VEC_AT(&c->pieces, struct wb_local_piece, lo->p0 + p);
            for (uint32_t ci = 0; ci < it->nc; ci++) {
                const struct wb_component *cp = pl_item_comp(c, it, ci);
                struct wb_box I;
                if (cp->dst.ndim && (cp->dst.off[0] >= pc->global.off[0] + pc->global.ext[0] ||
                                     pc->global.off[0] >= cp->dst.off[0] + cp->dst.ext[0]))
                    continue; /* quick reject along dim 0 (experts, fused rows) */
                if (!wb_box_intersect(&pc->global, &cp->dst, &I))
                    continue;
                struct subpiece sp = {.l = l, .ci = ci};
                uint32_t nd = I.ndim, ns = cp->src.ndim;
                /* transposed: S in the permuted tensor's coordinates, dims in order */
                struct wb_box psrc = cp->permuted ? pl_perm_box(&cp->src, cp->perm) : cp->src;
                sp.S.ndim = ns;
                for (uint32_t j = 0; j < ns; j++) {
                    int jd = (int)j + (int)nd - (int)ns;
                    if (jd < 0) {
                        sp.S.off[j] = psrc.off[j];
                        sp.S.ext[j] = psrc.ext[j];
                    } else {
                        sp.S.off[j] = I.off[jd] - cp->dst.off[jd] + psrc.off[j];
                        sp.S.ext[j] = I.ext[jd];
                    }
                }
                sp.D.ndim = nd;
                for (uint32_t j = 0; j < nd; j++) {
                    sp.D.off[j] = I.off[j] - pc->global.off[j] + pc->local.off[j];
                    sp.D.ext[j] = I.ext[j];
                }
                (void)mp;
                if (!pl_vec_push(&c->sub, &sp))
                    return -ENOMEM;
            }
        }
    }
    return 0;
}

/* Whether the blocks X touches reach outside B (FP8 blocks straddling owners). */
static bool straddles(const struct wb_box *X, const struct wb_box *B, const struct wb_shape *sh)
{
    struct wb_box bl = pl_box_blocks(X);
    struct wb_box e = pl_blocks_elems(&bl, sh);
    return !wb_box_contains(B, &e);
}

/* A transposed component's shard boxes and shape in the permuted tensor's coordinates, and
 * whether their edges fall on block edges there (the blocks are the rollout's). */
static void permute_comp(struct icomp *ic, const struct wb_component *cp, struct wb_box *B)
{
    ic->permuted = true;
    memcpy(ic->perm, cp->perm, sizeof(ic->perm));
    ic->psh = pl_perm_shape(ic->sh, cp->perm);
    ic->aligned = true;
    for (uint32_t k = 0; k < ic->nk; k++) {
        B[k] = pl_perm_box(&B[k], cp->perm);
        for (uint32_t d = 0; d < B[k].ndim; d++) {
            uint64_t end = B[k].off[d] + B[k].ext[d];
            if (qblock(B[k].ndim, d) > 1 && B[k].ext[d] &&
                (B[k].off[d] % WB_FP8_BLOCK || (end % WB_FP8_BLOCK && end != ic->psh.dim[d])))
                ic->aligned = false;
        }
    }
}

int pl_item_comps_prepare(struct plan_ctx *c, const struct item *it)
{
    c->icomp.n = c->ibox.n = c->iset.n = 0;
    for (uint32_t ci = 0; ci < it->nc; ci++) {
        const struct wb_component *cp = pl_item_comp(c, it, ci);
        struct icomp ic = {.t = cp->trainer};
        ic.tp = &c->pm->place[ic.t];
        ic.sh = &c->in->trainer->p[ic.t].shape;
        ic.cls = c->tcls[ic.t];
        const struct cls_info *cl = VEC_AT(&c->cinfo, struct cls_info, ic.cls);
        ic.nk = cl->nk;
        ic.b0 = (uint32_t)c->ibox.n;
        ic.aligned = cl->aligned;
        if (pl_vec_reserve(&c->ibox, ic.nk) || pl_vec_reserve(&c->iset, ic.nk))
            return -ENOMEM;
        memcpy(VEC_AT(&c->ibox, struct wb_box, c->ibox.n), VEC_AT(&c->cbox, struct wb_box, cl->b0),
               ic.nk * sizeof(struct wb_box));
        c->ibox.n += ic.nk;
        for (uint32_t k = 0; k < ic.nk; k++)
            *VEC_AT(&c->iset, int64_t, c->iset.n++) = -1;
        if (cp->permuted)
            permute_comp(&ic, cp, VEC_AT(&c->ibox, struct wb_box, ic.b0));
        if (!pl_vec_push(&c->icomp, &ic))
            return -ENOMEM;
    }
    for (size_t i = 0; i < c->icomp.n; i++) { /* the vector has stopped moving */
        struct icomp *ic = VEC_AT(&c->icomp, struct icomp, i);
        if (ic->permuted)
            ic->sh = &ic->psh;
    }
    return 0;
}

/* The candidate set of an item's demands in gather mode: its mesh's members. */
static int64_t mesh_set(struct plan_ctx *c, const struct item *it)
{
    const struct mesh_int *mesh = VEC_AT(&c->meshes, struct mesh_int, it->mesh);
    int64_t id = pl_bal_set(&c->bal, mesh->ranks, mesh->n);
    int r = pl_stamp_log_set(c, id);
    return r ? r : id;
}

/* The candidate set of shard k of component ci: its replicas. */
static int64_t shard_set(struct plan_ctx *c, const struct icomp *ic, uint32_t k)
{
    int64_t *slot = VEC_AT(&c->iset, int64_t, ic->b0 + k);
    if (*slot >= 0)
        return *slot;
    uint32_t nq = pl_place_nreplicas(c->pm, ic->tp);
    uint32_t *ranks = malloc(nq * sizeof(uint32_t));
    if (!ranks)
        return -ENOMEM;
    for (uint32_t q = 0; q < nq; q++)
        ranks[q] = pl_place_shard_rank(c->pm, ic->tp, k, q);
    for (uint32_t i = 1; i < nq; i++) /* ascending ranks */
        for (uint32_t j = i; j > 0 && ranks[j - 1] > ranks[j]; j--) {
            uint32_t t = ranks[j];
            ranks[j] = ranks[j - 1];
            ranks[j - 1] = t;
        }
    *slot = pl_bal_set(&c->bal, ranks, nq);
    free(ranks);
    int r = pl_stamp_log_set(c, *slot);
    return r ? r : *slot;
}

/* The demands of subpieces [a, z) (one local rank), computed once for all replicas. */
static int group_demands(struct plan_ctx *c, const struct item *it, size_t a, size_t z,
                         int64_t mset)
{
    const struct wb_mapping *mp = pl_ctx_map(c, it->mapping);
    bool gather = it->mode == WB_MODE_GATHER, fp8 = mp->xform == WB_XFORM_FP8_BLOCK;
    c->dem.n = 0;
    for (size_t s = a; s < z; s++) {
        const struct subpiece *sp = VEC_AT(&c->sub, struct subpiece, s);
        const struct icomp *ic = VEC_AT(&c->icomp, struct icomp, sp->ci);
        uint32_t nk = gather ? 1 : ic->nk;
        for (uint32_t k = 0; k < nk; k++) {
            struct dem d = {.sub = (uint32_t)s, .k = UINT32_MAX, .set = mset, .X = sp->S};
            if (!gather) {
                const struct wb_box *B = VEC_AT(&c->ibox, struct wb_box, ic->b0 + k);
                if (!wb_box_intersect(&sp->S, B, &d.X))
                    continue;
                d.k = k;
                d.set = shard_set(c, ic, k);
                if (d.set < 0)
                    return (int)d.set;
                d.straddle = fp8 && !ic->aligned && straddles(&d.X, B, ic->sh);
            }
            d.nu = pl_box_units(c, mp, &d.X, &d.dim, &d.gran);
            d.bytes = pl_dst_bytes(mp, &d.X);
            if (!pl_vec_push(&c->dem, &d))
                return -ENOMEM;
        }
    }
    return 0;
}

/* Walks an item's demands in plan order. In pass 1 (emit == false) they go to the balancer;
 * in pass 3 their senders are read back and turned into assignments (c->asg). */
int pl_walk_item(struct plan_ctx *c, const struct item *it, bool emit, uint32_t *group)
{
    const struct wb_rollout_layout *rl = c->in->rl;
    int r = pl_item_subpieces(c, it);
    if (!r)
        r = pl_item_comps_prepare(c, it);
    if (r)
        return r;
    int64_t mset = mesh_set(c, it);
    if (mset < 0)
        return (int)mset;
    bool gather = it->mode == WB_MODE_GATHER;
    if (emit)
        c->asg.n = 0;
    const struct subpiece *SP = c->sub.p;
    for (size_t a = 0; a < c->sub.n && !r;) {
        size_t z = a;
        while (z < c->sub.n && SP[z].l == SP[a].l)
            z++;
        r = group_demands(c, it, a, z, mset);
        const struct dem *DM = c->dem.p;
        for (uint32_t rep = 0; rep < rl->replicas && !r; rep++) {
            uint32_t g = rep * c->gpr + SP[a].l;
            bool any_straddle = false;
            if (gather)
                (*group)++;
            for (size_t i = 0; i < c->dem.n && !r; i++) {
                const struct dem *d = &DM[i];
                if (!gather)
                    (*group)++;
                any_straddle |= d->straddle;
                const struct bal_set *bs = VEC_AT(&c->bal.sets, struct bal_set, d->set);
                if (!emit) {
                    int a2 =
                        pl_bal_add(&c->bal, (uint32_t)d->set, d->bytes, d->nu, *group, it->phase);
                    r = a2 < 0 ? a2 : 0;
                    continue;
                }
                struct bal_part one = {*VEC_AT(&c->bal.set_ranks, uint32_t, bs->r0), 0, d->nu};
                const struct bal_part *parts = &one;
                uint32_t np = 1;
                if (bs->n > 1) {
                    const struct bal_demand *bd =
                        VEC_AT(&c->bal.demands, struct bal_demand, c->demand_cursor++);
                    parts = VEC_AT(&c->bal.parts, struct bal_part, bd->part0);
                    np = bd->nparts;
                }
                uint32_t ci = SP[d->sub].ci;
                for (uint32_t pi = 0; pi < np && !r; pi++) {
                    struct assign as = {parts[pi].rank, g,           ci, d->sub, d->k,
                                        parts[pi].u0,   parts[pi].u1};
                    if (!pl_vec_push(&c->asg, &as))
                        r = -ENOMEM;
                }
            }
            if (!emit)
                c->pieces_by_mode[gather         ? WB_MODE_GATHER
                                  : any_straddle ? WB_MODE_AMAX
                                                 : WB_MODE_DIRECT]++;
        }
        a = z;
    }
    return r;
}
