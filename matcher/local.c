/* local.c — what one rollout rank holds of a mapping's rollout tensor, the way vLLM shards it:
 *  - replicated tensors: everything;
 *  - TP along dim d: the tensor's parts along d (one per fused component, e.g. q/k/v or
 *    gate/up — taken from the components' dst boxes, so a stacked w13 has two parts spanning
 *    all experts) are each split over the tp ranks and concatenated in the rank's local tensor.
 *    A grouped split's pieces (Megatron's linear_qkv: q of each query group) join the part of
 *    the previous piece, so that q, k and v are one part each as vLLM splits them.
 *    A part with a head count (GQA k/v) is split by whole heads; with fewer heads than ranks
 *    it is replicated, rank r holding head r * heads / tp (vLLM's QKVParallelLinear);
 *  - TP with vocab padding (shard.pad, vLLM's VocabParallelEmbedding and ParallelLMHead):
 *    the dim is padded up to a multiple of pad, rank r's local tensor is padded/tp long and
 *    holds the real rows [r*padded/tp, min((r+1)*padded/tp, size)) first, padding after;
 *  - EP over experts: with ep > 1 rank r holds experts [r*E/ep, (r+1)*E/ep) whole (vLLM's
 *    linear expert placement, no tensor parallelism inside experts); with ep == 1 the shard's
 *    ep1_tp_dim is split like TP (FusedMoE without expert parallelism), or the tensor sits
 *    whole on tp rank 0 only (WB_SHARD_RANK0).
 * FP8 block-quantized tensors must not be cut inside a 128x128 block by a TP split: vLLM
 * refuses such a layout, and so does this, with the numbers. */
#include "matcher/mpriv.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int wb_scale_box(const struct wb_box *value, uint32_t block, struct wb_box *scale)
{
    if (value->ndim < 2 || block == 0)
        return -EINVAL;
    struct wb_box s = *value;
    for (uint32_t k = value->ndim - 2; k < value->ndim; k++) {
        if (value->off[k] % block)
            return -EINVAL;
        uint64_t end = value->off[k] + value->ext[k];
        s.off[k] = value->off[k] / block;
        s.ext[k] = (end + block - 1) / block - s.off[k];
    }
    *scale = s;
    return 0;
}

struct part {
    uint64_t off, ext;
    uint32_t heads;
};

/* The distinct [off, off+ext) intervals of the components along dim d, in order. */
static int parts_along(const struct wb_mapping *m, uint32_t d, uint64_t size, struct part *p,
                       size_t cap, size_t *np)
{
    size_t n = 0;
    for (uint32_t i = 0; i < m->ncomp; i++) {
        const struct wb_box *b = &m->comp[i].dst;
        if (d >= b->ndim)
            continue;
        if (m->comp[i].joins_prev) { /* a grouped split's piece: part of the previous one's */
            size_t in = 0, at = 0;
            while (in < n && !(p[in].off <= b->off[d] && b->off[d] < p[in].off + p[in].ext))
                in++;
            if (in < n) /* covered already (another expert's copy of the same piece) */
                continue;
            while (at < n && p[at].off + p[at].ext != b->off[d])
                at++;
            if (at < n) {
                p[at].ext += b->ext[d];
                p[at].heads += m->comp[i].heads;
                continue;
            }
        }
        size_t k = 0;
        while (k < n && p[k].off != b->off[d])
            k++;
        if (k < n)
            continue;
        if (n == cap)
            return -E2BIG;
        p[n++] = (struct part){b->off[d], b->ext[d], m->comp[i].heads};
    }
    /* insertion sort by offset (n is small) */
    for (size_t i = 1; i < n; i++)
        for (size_t k = i; k > 0 && p[k - 1].off > p[k].off; k--) {
            struct part t = p[k];
            p[k] = p[k - 1];
            p[k - 1] = t;
        }
    uint64_t at = 0;
    for (size_t i = 0; i < n; i++) {
        if (p[i].off != at)
            break;
        at += p[i].ext;
    }
    if (n == 0 || at != size) { /* components do not tile the dim: treat it as one part */
        p[0] = (struct part){0, size, 0};
        n = 1;
    }
    *np = n;
    return 0;
}

/* vLLM's vocab-parallel split (vocab_parallel_embedding.py: pad_vocab_size, _get_indices):
 * padded = size rounded up to a multiple of pad, per = padded / tp (which must divide), rank r
 * holds padded rows [r*per, (r+1)*per), of which those below `size` are real. */
static int vocab_split(const struct wb_match *mt, const struct wb_param *R,
                       const struct wb_mapping *m, uint32_t d, uint32_t tp_rank, uint32_t tp,
                       struct wb_shape *ls, struct wb_local_piece *pc, uint32_t *np,
                       struct wb_errlist *el)
{
    const struct wb_shape *S = &R->shape;
    const char *path = mt && mt->rules_path ? mt->rules_path : "?";
    if (d >= S->ndim) {
        wb_errlist_add(el, "%s: shard dim %u outside shape of %u dims (rule %s:%u)", R->name, d,
                       S->ndim, path, m->rule_line);
        return -WB_E_PLAN;
    }
    bool fp8 = m->scale >= 0 || m->block || m->fp8_scales;
    if (m->ncomp != 1 || fp8) {
        wb_errlist_add(el,
                       "%s: vocab padding (shard pad) needs one unquantized component, not %u%s "
                       "(rule %s:%u)",
                       R->name, m->ncomp, fp8 ? " FP8-quantized" : "", path, m->rule_line);
        return -WB_E_PLAN;
    }
    uint64_t size = S->dim[d], pad = m->shard.pad;
    uint64_t padded = (size + pad - 1) / pad * pad; /* size <= 2^48: no overflow */
    if (padded % tp) {
        wb_errlist_add(el,
                       "%s: tp %u does not divide the %llu rows along dim %u padded to a multiple "
                       "of %u (%llu real) (rule %s:%u)",
                       R->name, tp, (unsigned long long)padded, d, m->shard.pad,
                       (unsigned long long)size, path, m->rule_line);
        return -WB_E_PLAN;
    }
    uint64_t per = padded / tp, start = tp_rank * per;
    uint64_t lo = start < size ? start : size, hi = start + per < size ? start + per : size;
    *ls = *S;
    ls->dim[d] = per;
    *np = 0;
    if (hi > lo) { /* a rank past the real rows holds only padding: no piece */
        pc[0].global = wb_box_full(S);
        pc[0].global.off[d] = lo;
        pc[0].global.ext[d] = hi - lo;
        pc[0].local = wb_box_full(ls);
        pc[0].local.ext[d] = hi - lo;
        *np = 1;
    }
    return 0;
}

int wb_mapping_local(const struct wb_match *mt, const struct wb_inventory *rollout,
                     const struct wb_mapping *m, uint32_t tp_rank, uint32_t tp, uint32_t ep_rank,
                     uint32_t ep, struct wb_shape *local_shape, struct wb_local_piece *pieces,
                     uint32_t *npieces, struct wb_errlist *el)
{
    const struct wb_param *R = &rollout->p[m->rollout];
    const struct wb_shape *S = &R->shape;
    const char *path = mt && mt->rules_path ? mt->rules_path : "?";
    if (tp == 0 || tp_rank >= tp || ep == 0 || ep_rank >= ep) {
        wb_errlist_add(el, "%s: bad rank: tp rank %u of %u, ep rank %u of %u", R->name, tp_rank, tp,
                       ep_rank, ep);
        return -EINVAL;
    }
    struct wb_shape ls = *S;
    struct wb_local_piece pc[WB_MAX_PIECES];
    uint32_t np = 0;

    int32_t tdim = -1; /* dim split over tp ranks, or -1 */
    if (m->shard.kind == WB_SHARD_TP && (tp > 1 || m->shard.pad)) /* padded even at tp 1 */
        tdim = (int32_t)m->shard.dim;
    else if (m->shard.kind == WB_SHARD_EP && ep == 1 && tp > 1)
        tdim = m->shard.ep1_tp_dim;

    if (m->shard.kind == WB_SHARD_EP && ep > 1) {
        uint32_t d = m->shard.dim;
        if (d >= S->ndim || S->dim[d] % ep) {
            wb_errlist_add(el,
                           "%s: ep %u does not divide the %llu experts along dim %u "
                           "(rule %s:%u)",
                           R->name, ep, (unsigned long long)(d < S->ndim ? S->dim[d] : 0), d, path,
                           m->rule_line);
            return -WB_E_PLAN;
        }
        uint64_t per = S->dim[d] / ep;
        ls.dim[d] = per;
        pc[0].global = wb_box_full(S);
        pc[0].global.off[d] = ep_rank * per;
        pc[0].global.ext[d] = per;
        pc[0].local = wb_box_full(&ls);
        np = 1;
    } else if (tdim == WB_SHARD_RANK0) {
        if (tp_rank == 0) {
            pc[0].global = wb_box_full(S);
            pc[0].local = wb_box_full(S);
            np = 1;
        }
    } else if (tdim < 0) {
        pc[0].global = wb_box_full(S);
        pc[0].local = wb_box_full(S);
        np = 1;
    } else if (m->shard.kind == WB_SHARD_TP && m->shard.pad) {
        uint32_t d = (uint32_t)tdim;
        int r = vocab_split(mt, R, m, d, tp_rank, tp, &ls, pc, &np, el);
        if (r)
            return r;
    } else {
        uint32_t d = (uint32_t)tdim;
        if (d >= S->ndim) {
            wb_errlist_add(el, "%s: shard dim %u outside shape of %u dims (rule %s:%u)", R->name, d,
                           S->ndim, path, m->rule_line);
            return -WB_E_PLAN;
        }
        struct part parts[WB_MAX_PIECES];
        size_t nparts;
        if (parts_along(m, d, S->dim[d], parts, WB_MAX_PIECES, &nparts)) {
            wb_errlist_add(el, "%s: more than %d components along dim %u (rule %s:%u)", R->name,
                           WB_MAX_PIECES, d, path, m->rule_line);
            return -WB_E_PLAN;
        }
        bool quant_dim = m->block && d + 2 >= S->ndim;
        uint64_t lpos = 0;
        for (size_t i = 0; i < nparts; i++) {
            const struct part *p = &parts[i];
            uint64_t per, goff;
            if (p->heads) {
                uint64_t hs = p->ext / p->heads;
                if (p->heads >= tp) {
                    if (p->heads % tp) {
                        wb_errlist_add(el,
                                       "%s: tp %u does not divide the %u heads of component "
                                       "[%llu, %llu) along dim %u (rule %s:%u)",
                                       R->name, tp, p->heads, (unsigned long long)p->off,
                                       (unsigned long long)(p->off + p->ext), d, path,
                                       m->rule_line);
                        return -WB_E_PLAN;
                    }
                    per = p->ext / tp;
                    goff = p->off + tp_rank * per;
                } else {
                    if (tp % p->heads) {
                        wb_errlist_add(el,
                                       "%s: the %u heads of component [%llu, %llu) along "
                                       "dim %u cannot be replicated evenly over tp %u "
                                       "(rule %s:%u)",
                                       R->name, p->heads, (unsigned long long)p->off,
                                       (unsigned long long)(p->off + p->ext), d, tp, path,
                                       m->rule_line);
                        return -WB_E_PLAN;
                    }
                    per = hs;
                    goff = p->off + (uint64_t)tp_rank * p->heads / tp * hs;
                }
            } else {
                if (p->ext % tp) {
                    wb_errlist_add(el,
                                   "%s: tp %u does not divide component [%llu, %llu) "
                                   "(%llu elements) along dim %u (rule %s:%u)",
                                   R->name, tp, (unsigned long long)p->off,
                                   (unsigned long long)(p->off + p->ext),
                                   (unsigned long long)p->ext, d, path, m->rule_line);
                    return -WB_E_PLAN;
                }
                per = p->ext / tp;
                goff = p->off + tp_rank * per;
            }
            if (quant_dim && (per % m->block || goff % m->block) &&
                !(goff + per == S->dim[d] && goff % m->block == 0)) {
                wb_errlist_add(el,
                               "%s: tp %u cuts component [%llu, %llu) along dim %u into "
                               "%llu-element pieces, not whole %u-element FP8 blocks "
                               "(rule %s:%u)",
                               R->name, tp, (unsigned long long)p->off,
                               (unsigned long long)(p->off + p->ext), d, (unsigned long long)per,
                               m->block, path, m->rule_line);
                return -WB_E_PLAN;
            }
            pc[np].global = wb_box_full(S);
            pc[np].global.off[d] = goff;
            pc[np].global.ext[d] = per;
            pc[np].local.ndim = S->ndim;
            np++;
            lpos += per;
        }
        ls.dim[d] = lpos;
        uint64_t at = 0;
        for (uint32_t i = 0; i < np; i++) {
            pc[i].local = wb_box_full(&ls);
            pc[i].local.off[d] = at;
            pc[i].local.ext[d] = pc[i].global.ext[d];
            at += pc[i].global.ext[d];
        }
    }
    *local_shape = ls;
    memcpy(pieces, pc, np * sizeof(*pc));
    *npieces = np;
    return 0;
}
