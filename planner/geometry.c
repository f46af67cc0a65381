/* geometry.c — the plan builder's box and shard arithmetic: which shard of a trainer tensor a
 * rank holds, how a trainer box maps into a rollout local box, its destination bytes and FP8
 * block origins, the units along which a demand may be split, and an assignment's boxes.
 * Pure functions of the context's read-only state (and, for pl_asg_boxes, the current item's
 * subpieces and shard boxes); they call nothing else in the builder, so every other builder
 * file may use them. */
#include "planner/build.h"

const struct wb_mapping *pl_ctx_map(const struct plan_ctx *c, uint32_t m)
{
    return &c->in->match->map[m];
}

const struct wb_component *pl_item_comp(const struct plan_ctx *c, const struct item *it,
                                        uint32_t ci)
{
    return &pl_ctx_map(c, it->mapping)->comp[*VEC_AT(&c->item_comps, uint32_t, it->c0 + ci)];
}

bool pl_rank_shard(const struct plan_ctx *c, uint32_t t, uint32_t r, uint32_t *shard,
                   uint32_t *replica)
{
    const struct wb_placement_map *pm = c->pm;
    const struct tplace *tp = &pm->place[t];
    const struct wb_trainer_layout *tl = pm->tl;
    const struct wb_place_rule *rule = &tl->rules[tp->rule];
    uint32_t s = 0, q = 0;
    for (uint32_t d = 0; d < tl->ndims; d++) {
        uint32_t coord = (r / pm->stride[d]) % tl->dim[d].size;
        if (tp->sel[d] >= 0) {
            if ((int32_t)coord != tp->sel[d])
                return false;
        } else if (pl_place_splits(rule->place[d].kind)) {
            s = s * tl->dim[d].size + coord;
        } else {
            q = q * tl->dim[d].size + coord;
        }
    }
    *shard = s;
    *replica = q;
    return true;
}

bool pl_rank_box(const struct plan_ctx *c, uint32_t t, uint32_t r, struct wb_box *box,
                 uint32_t *shard, uint32_t *replica)
{
    uint32_t s, q;
    if (!pl_rank_shard(c, t, r, &s, &q))
        return false;
    *box = pl_place_shard_box(c->pm, &c->pm->place[t], &c->in->trainer->p[t].shape, s);
    *shard = s;
    *replica = q;
    return true;
}

struct wb_box pl_origin_blocks(const struct wb_box *S)
{
    struct wb_box b = {.ndim = S->ndim};
    for (uint32_t d = 0; d < S->ndim; d++) {
        uint64_t q = qblock(S->ndim, d);
        uint64_t a = ceil_div(S->off[d], q), z = ceil_div(S->off[d] + S->ext[d], q);
        b.off[d] = a;
        b.ext[d] = z > a ? z - a : 0;
    }
    return b;
}

uint32_t pl_perm_pack(const uint8_t *perm, uint32_t ndim)
{
    uint32_t v = 0;
    for (uint32_t k = 0; k < ndim; k++)
        v |= (uint32_t)(perm[k] & 15) << (4 * k);
    return v;
}

struct wb_box pl_perm_box(const struct wb_box *b, const uint8_t *perm)
{
    struct wb_box r = {.ndim = b->ndim};
    for (uint32_t k = 0; k < b->ndim; k++) {
        r.off[k] = b->off[perm[k]];
        r.ext[k] = b->ext[perm[k]];
    }
    return r;
}

struct wb_box pl_unperm_box(const struct wb_box *b, const uint8_t *perm)
{
    struct wb_box r = {.ndim = b->ndim};
    for (uint32_t k = 0; k < b->ndim; k++) {
        r.off[perm[k]] = b->off[k];
        r.ext[perm[k]] = b->ext[k];
    }
    return r;
}

struct wb_shape pl_perm_shape(const struct wb_shape *s, const uint8_t *perm)
{
    struct wb_shape r = {.ndim = s->ndim};
    for (uint32_t k = 0; k < s->ndim; k++)
        r.dim[k] = s->dim[perm[k]];
    return r;
}

uint64_t pl_dst_bytes(const struct wb_mapping *m, const struct wb_box *S)
{
    uint64_t v = wb_box_numel(S) * wb_dtype_size(m->dst_dtype);
    if (m->xform == WB_XFORM_FP8_BLOCK) {
        struct wb_box ob = pl_origin_blocks(S);
        v += wb_box_numel(&ob) * 4;
    }
    return v;
}

uint32_t pl_box_units(const struct plan_ctx *c, const struct wb_mapping *m, const struct wb_box *S,
                      uint32_t *dim, uint64_t *gran)
{
    (void)c;
    uint32_t d = 0;
    while (d < S->ndim && S->ext[d] <= 1)
        d++;
    *dim = d;
    *gran = 1;
    if (d == S->ndim)
        return 1;
    uint64_t g0 =
        (m->xform == WB_XFORM_FP8_BLOCK && qblock(S->ndim, d) == WB_FP8_BLOCK) ? WB_FP8_BLOCK : 1;
    uint64_t row = wb_box_numel(S) / S->ext[d] * wb_dtype_size(m->dst_dtype);
    uint64_t k = row * g0 >= (256u << 10) ? 1 : (256u << 10) / (row * g0);
    uint64_t g = g0 * (k ? k : 1);
    uint64_t a = S->off[d] / g, z = ceil_div(S->off[d] + S->ext[d], g);
    while (z - a > (1u << 20)) {
        g *= 2;
        a = S->off[d] / g;
        z = ceil_div(S->off[d] + S->ext[d], g);
    }
    *gran = g;
    return (uint32_t)(z - a);
}

struct wb_box pl_box_unit_range(const struct wb_box *S, uint32_t dim, uint64_t gran, uint32_t u0,
                                uint32_t u1)
{
    struct wb_box b = *S;
    if (dim >= S->ndim)
        return b;
    uint64_t base = S->off[dim] / gran * gran, end = S->off[dim] + S->ext[dim];
    uint64_t a = base + (uint64_t)u0 * gran, z = base + (uint64_t)u1 * gran;
    if (a < S->off[dim])
        a = S->off[dim];
    if (z > end)
        z = end;
    b.off[dim] = a;
    b.ext[dim] = z > a ? z - a : 0;
    return b;
}

struct wb_box pl_map_to_dst(const struct wb_box *S, const struct wb_box *D, const struct wb_box *Sp)
{
    struct wb_box out = *D;
    int shift = (int)D->ndim - (int)S->ndim;
    for (uint32_t j = 0; j < S->ndim; j++) {
        int jd = (int)j + shift;
        if (jd < 0)
            continue;
        out.off[jd] = D->off[jd] + (Sp->off[j] - S->off[j]);
        out.ext[jd] = Sp->ext[j];
    }
    return out;
}

void pl_asg_boxes(const struct plan_ctx *c, const struct item *it, const struct assign *a,
                  struct sd *out)
{
    const struct subpiece *sp = VEC_AT(&c->sub, struct subpiece, a->sub);
    const struct icomp *ic = VEC_AT(&c->icomp, struct icomp, a->ci);
    struct wb_box X = sp->S;
    if (a->k != UINT32_MAX)
        wb_box_intersect(&sp->S, VEC_AT(&c->ibox, struct wb_box, ic->b0 + a->k), &X);
    uint32_t dim;
    uint64_t gran;
    pl_box_units(c, pl_ctx_map(c, it->mapping), &X, &dim, &gran);
    out->S = pl_box_unit_range(&X, dim, gran, a->u0, a->u1);
    out->D = pl_map_to_dst(&sp->S, &sp->D, &out->S);
}
