/* ops.c — the routing table's local ops (planner/planner.h: COPY, CAST, QUANT, the compute
 * halves of AMAX and GATHER) on the agent's buffers, through quant/'s calls: the CPU reference
 * on host memory, the CUDA kernels enqueued on the executor's stream on GPU memory. Nothing
 * here waits: on a GPU the caller records an event after the ops it issued and polls it.
 *
 * Views are row-major arrays inside the PARAM arena (a shard) or the task's TMP allocation.
 * A box of a view that is the whole view is used in place; otherwise it is packed into the
 * scratch space first (one scratch per executor: ops run one after another on one stream). */
#include "agent/xfer.h"
#include "quant/quant.h"

#include <errno.h>
#include <string.h>

static struct wb_quant_exec ex_of(const struct data *d)
{
    if (d->gpu)
        return (struct wb_quant_exec){WB_QUANT_DEVICE, d->stream};
    return (struct wb_quant_exec){WB_QUANT_HOST, NULL};
}

void *ag_ops_view_ptr(const struct opctx *c, const struct wb_rt_view *v)
{
    const struct data *d = c->d;
    if (v->kind == WB_BUF_TMP)
        return c->tmp + v->off;
    uint32_t s = v->tensor < d->ntensors ? d->shard_of[v->tensor] : 0;
    if (!s)
        return NULL;
    return d->shards[s - 1].ptr + v->off;
}

static bool box_is_full(const struct wb_box *b, const struct wb_shape *s)
{
    if (b->ndim != s->ndim)
        return false;
    for (uint32_t i = 0; i < b->ndim; i++)
        if (b->off[i] != 0 || b->ext[i] != s->dim[i])
            return false;
    return true;
}

/* The box's elements of view v as one contiguous array: in place, or packed into scratch. */
static int packed_src(const struct opctx *c, const struct wb_rt_view *v, uint32_t box,
                      void *scratch, const void **out)
{
    const struct wb_route_table *t = &c->d->table;
    struct wb_quant_exec ex = ex_of(c->d);
    const void *p = ag_ops_view_ptr(c, v);
    if (!p)
        return -EINVAL;
    const struct wb_shape *sh = wb_rt_shape(t, v->shape);
    const struct wb_box *b = wb_rt_box(t, box);
    if (box_is_full(b, sh)) {
        *out = p;
        return 0;
    }
    int rc = wb_quant_pack(&ex, v->dtype, sh, b, p, scratch);
    if (!rc)
        *out = scratch;
    return rc;
}

int ag_ops_copy(const struct opctx *c, const struct wb_rt_op *op)
{
    const struct wb_route_table *t = &c->d->table;
    const struct wb_rt_copy *cp = &op->copy;
    struct wb_quant_exec ex = ex_of(c->d);
    const void *src;
    int rc = packed_src(c, &cp->src, cp->src_box, c->d->scratch[0], &src);
    if (rc)
        return rc;
    uint64_t n = wb_box_numel(wb_rt_box(t, cp->src_box));
    if (op->kind == WB_OP_CAST && cp->src.dtype != cp->dst.dtype) {
        rc = wb_quant_cast(&ex, cp->src.dtype, src, cp->dst.dtype, c->d->scratch[1], n);
        if (rc)
            return rc;
        src = c->d->scratch[1];
    }
    void *dst = ag_ops_view_ptr(c, &cp->dst);
    if (!dst)
        return -EINVAL;
    return wb_quant_unpack(&ex, cp->dst.dtype, wb_rt_shape(t, cp->dst.shape),
                           wb_rt_box(t, cp->dst_box), src, dst);
}

/* PERMUTE: the src box packed (in place when it is the whole view), transposed into dst (in
 * place when dst_box is the whole view, as the planner emits it, else through scratch 1 and
 * an unpack). The GPU path does on the stream what wb_permute() does on the host. */
int ag_ops_permute(const struct opctx *c, const struct wb_rt_op *op)
{
    const struct wb_route_table *t = &c->d->table;
    const struct wb_rt_permute *pm = &op->permute;
    struct wb_quant_exec ex = ex_of(c->d);
    const void *src;
    int rc = packed_src(c, &pm->src, pm->src_box, c->d->scratch[0], &src);
    if (rc)
        return rc;
    void *dst = ag_ops_view_ptr(c, &pm->dst);
    if (!dst)
        return -EINVAL;
    const struct wb_box *sb = wb_rt_box(t, pm->src_box), *db = wb_rt_box(t, pm->dst_box);
    const struct wb_shape *dsh = wb_rt_shape(t, pm->dst.shape);
    bool whole = box_is_full(db, dsh);
    void *out = whole ? dst : c->d->scratch[1];
    size_t elem = wb_dtype_size(pm->src.dtype);
    if (c->d->gpu) {
        rc = ag_permute_async(out, src, elem, sb->ndim, sb->ext, pm->perm, c->d->stream);
    } else {
        uint8_t perm[WB_MAX_DIMS];
        for (uint32_t k = 0; k < sb->ndim; k++)
            perm[k] = (uint8_t)wb_rt_perm_dim(pm->perm, k);
        rc = wb_permute(out, src, elem, sb->ndim, sb->ext, perm);
    }
    if (rc || whole)
        return rc;
    return wb_quant_unpack(&ex, pm->dst.dtype, dsh, db, out, dst);
}

/* The 2-D tile of a region (its last two dims) and the number of leading slices. */
static void region_tile(const struct wb_box *r, enum wb_dtype dt, struct wb_quant_tile *tile,
                        uint64_t *lead)
{
    uint32_t nd = r->ndim;
    tile->dtype = dt;
    tile->rows = nd >= 2 ? r->ext[nd - 2] : 1;
    tile->cols = nd >= 1 ? r->ext[nd - 1] : 1;
    tile->row0 = nd >= 2 ? r->off[nd - 2] : 0;
    tile->col0 = nd >= 1 ? r->off[nd - 1] : 0;
    uint64_t l = 1;
    for (uint32_t i = 0; i + 2 < nd; i++)
        l *= r->ext[i];
    *lead = l;
}

/* Where the BF16 cast of an FP32 quantization source of n elements sits in scratch 0: after
 * its packed FP32 copy, 256-byte aligned (the kernels' vector path wants 16). */
static uint64_t fp32_cast_off(uint64_t n)
{
    return (n * 4 + 255) & ~(uint64_t)255;
}

/* The source of a quantization as the quant calls read it: an FP32 source is first rounded to
 * BF16 (round to nearest even, torch's tensor.to(torch.bfloat16)), behind the packed FP32
 * copy in scratch 0 (ag_ops_scratch_need counts both). A trainer holding FP32 masters thus
 * sends exactly what it would send holding their BF16 cast — what a BF16 trainer's rollout
 * receives, what an engine loading the BF16 model quantizes — not a quantization of the FP32
 * values, which differs from it in about 2-3% of the bytes (double rounding). BF16 and FP16
 * sources are quantized as they are. */
static int quant_src(const struct opctx *c, const struct wb_rt_view *v, uint32_t src_box,
                     const void **out, enum wb_dtype *dt)
{
    const void *src;
    int rc = packed_src(c, v, src_box, c->d->scratch[0], &src);
    if (rc)
        return rc;
    *dt = v->dtype;
    if (v->dtype == WB_DTYPE_FP32) {
        struct wb_quant_exec ex = ex_of(c->d);
        uint64_t n = wb_box_numel(wb_rt_box(&c->d->table, src_box));
        uint8_t *bf = (uint8_t *)c->d->scratch[0] + fp32_cast_off(n);
        rc = wb_quant_cast(&ex, WB_DTYPE_FP32, src, WB_DTYPE_BF16, bf, n);
        src = bf;
        *dt = WB_DTYPE_BF16;
    }
    if (!rc)
        *out = src;
    return rc;
}

/* Raw partial amax of every block the region touches: lead x grid, into amax (device or host
 * memory, as the executor's buffers). */
static int region_amax(const struct opctx *c, const struct wb_rt_view *v, uint32_t src_box,
                       const struct wb_box *region, float *amax, const void **packed_out,
                       enum wb_dtype *dt_out, struct wb_quant_grid *g, uint64_t *lead)
{
    struct wb_quant_exec ex = ex_of(c->d);
    const void *src;
    enum wb_dtype dt;
    int rc = quant_src(c, v, src_box, &src, &dt);
    if (rc)
        return rc;
    struct wb_quant_tile tile;
    region_tile(region, dt, &tile, lead);
    if ((rc = wb_quant_fp8_grid(&tile, 0, tile.rows, g)) != 0)
        return rc;
    uint64_t esz = wb_dtype_size(dt), gsz = g->rows * g->cols;
    for (uint64_t l = 0; l < *lead; l++) {
        rc = wb_quant_fp8_amax(&ex, &tile, (const uint8_t *)src + l * tile.rows * tile.cols * esz,
                               0, tile.rows, amax + l * gsz);
        if (rc)
            return rc;
    }
    if (packed_out)
        *packed_out = src;
    if (dt_out)
        *dt_out = dt;
    return 0;
}

int ag_ops_quant(const struct opctx *c, const struct wb_rt_op *op)
{
    const struct wb_route_table *t = &c->d->table;
    const struct wb_rt_quant *q = &op->quant;
    struct wb_quant_exec ex = ex_of(c->d);
    const struct wb_box *region = wb_rt_box(t, q->region);
    float *amax = c->d->scratch[1];
    const void *src;
    struct wb_quant_grid g;
    uint64_t lead;
    struct wb_quant_tile tile;
    region_tile(region, q->src.dtype, &tile, &lead);
    if (q->amax_off == (uint64_t)WB_RT_NONE && tile.row0 % WB_FP8_BLOCK == 0 &&
        tile.col0 % WB_FP8_BLOCK == 0) { /* nothing to merge, blocks from the tile's origin:
                                          * one fused pass (the same bytes, one read) */
        enum wb_dtype dt;
        int rc = quant_src(c, &q->src, q->src_box, &src, &dt);
        uint8_t *dst = ag_ops_view_ptr(c, &q->dst);
        float *scale = (float *)(c->tmp + q->scale_off);
        uint64_t esz = wb_dtype_size(dt), per = tile.rows * tile.cols;
        uint64_t gsz = wb_quant_blocks(tile.rows) * wb_quant_blocks(tile.cols);
        if (!rc && wb_box_numel(wb_rt_box(t, q->grid)) != lead * gsz)
            rc = -EINVAL;
        for (uint64_t l = 0; !rc && l < lead; l++)
            rc = wb_quant_fp8_block(&ex, dt, (const uint8_t *)src + l * per * esz, tile.rows,
                                    tile.cols, dst + l * per, scale + l * gsz);
        return rc;
    }
    enum wb_dtype dt;
    int rc = region_amax(c, &q->src, q->src_box, region, amax, &src, &dt, &g, &lead);
    if (rc)
        return rc;
    uint64_t gsz = g.rows * g.cols;
    if (wb_box_numel(wb_rt_box(t, q->grid)) != lead * gsz)
        return -EINVAL;
    if (q->amax_off != (uint64_t)WB_RT_NONE) { /* the peers' partials, merged by AMAX ops */
        float *peer = (float *)(c->tmp + q->amax_off);
        if (c->d->gpu)
            rc = ag_amax_merge_async(amax, peer, lead * gsz, c->d->stream);
        else
            wb_quant_fp8_amax_merge(amax, peer, lead * gsz);
        if (rc)
            return rc;
    }
    uint8_t *dst = ag_ops_view_ptr(c, &q->dst);
    float *scale = (float *)(c->tmp + q->scale_off);
    tile.dtype = dt;
    uint64_t esz = wb_dtype_size(dt), per = tile.rows * tile.cols;
    for (uint64_t l = 0; !rc && l < lead; l++)
        rc = wb_quant_fp8_apply(&ex, &tile, (const uint8_t *)src + l * per * esz, 0, tile.rows,
                                amax + l * gsz, dst + l * per, scale + l * gsz);
    return rc;
}

/* ---------------------------------------------------------------- amax exchange */

/* The block-coordinate box of every block a region touches. */
static struct wb_box region_grid_box(const struct wb_box *region)
{
    struct wb_box b = *region;
    uint32_t nd = region->ndim;
    for (uint32_t i = nd >= 2 ? nd - 2 : 0; i < nd; i++) {
        b.off[i] = region->off[i] / WB_FP8_BLOCK;
        b.ext[i] = region->ext[i]
                       ? (region->off[i] + region->ext[i] - 1) / WB_FP8_BLOCK - b.off[i] + 1
                       : 0;
    }
    return b;
}

uint64_t ag_ops_amax_bytes(const struct wb_route_table *t, const struct wb_rt_op *op)
{
    return wb_box_numel(wb_rt_box(t, op->amax.blocks)) * sizeof(float);
}

int ag_ops_amax_partial(const struct opctx *c, const struct wb_rt_op *op, float *dev_part,
                        float *host_part)
{
    const struct wb_route_table *t = &c->d->table;
    const struct wb_rt_amax *a = &op->amax;
    struct wb_quant_grid g;
    uint64_t lead;
    const struct wb_box *region = wb_rt_box(t, a->region);
    int rc = region_amax(c, &a->src, a->src_box, region, c->d->gpu ? dev_part : host_part, NULL,
                         NULL, &g, &lead);
    if (!rc && c->d->gpu && host_part)
        rc = ag_copy_async(host_part, dev_part, lead * g.rows * g.cols * sizeof(float),
                           c->d->stream);
    return rc;
}

/* Walks the elements of `inner` (a box inside both outer boxes' index spaces) and calls fn with
 * the row-major index of the element in box a and in box b. */
static void walk2(const struct wb_box *inner, const struct wb_box *a, const struct wb_box *b,
                  void (*fn)(void *arg, uint64_t ia, uint64_t ib), void *arg)
{
    uint32_t nd = inner->ndim;
    uint64_t idx[WB_MAX_DIMS] = {0};
    if (wb_box_empty(inner))
        return;
    for (;;) {
        uint64_t ia = 0, ib = 0;
        for (uint32_t i = 0; i < nd; i++) {
            uint64_t g = inner->off[i] + idx[i];
            ia = ia * a->ext[i] + (g - a->off[i]);
            ib = ib * b->ext[i] + (g - b->off[i]);
        }
        fn(arg, ia, ib);
        uint32_t i = nd;
        while (i > 0) {
            i--;
            if (++idx[i] < inner->ext[i])
                break;
            idx[i] = 0;
            if (i == 0)
                return;
        }
        if (nd == 0)
            return;
    }
}

struct mv {
    float *dst;
    const float *src;
};

static void put_b_from_a(void *arg, uint64_t ia, uint64_t ib)
{
    struct mv *m = arg;
    m->dst[ib] = m->src[ia];
}

int ag_ops_amax_blocks(const struct opctx *c, const struct wb_rt_op *op, const float *part,
                       float *blocks)
{
    const struct wb_route_table *t = &c->d->table;
    const struct wb_box *bl = wb_rt_box(t, op->amax.blocks);
    struct wb_box rg = region_grid_box(wb_rt_box(t, op->amax.region)), in;
    uint64_t nb = wb_box_numel(bl) * sizeof(float);
    bool any = wb_box_intersect(&rg, bl, &in);
    if (c->d->gpu) {
        int rc = ag_memset_async(blocks, 0, nb, c->d->stream);
        return rc || !any ? rc : ag_box_move_async(blocks, bl, part, &rg, &in, 0, c->d->stream);
    }
    memset(blocks, 0, nb);
    if (any) {
        struct mv m = {blocks, part};
        walk2(&in, &rg, bl, put_b_from_a, &m);
    }
    return 0;
}

static void put_a_from_b(void *arg, uint64_t ia, uint64_t ib)
{
    struct mv *m = arg;
    m->dst[ia] = m->src[ib];
}

int ag_ops_amax_into_grid(const struct opctx *c, const struct wb_rt_op *op, const float *peer,
                          float *grid)
{
    const struct wb_route_table *t = &c->d->table;
    const struct wb_box *bl = wb_rt_box(t, op->amax.blocks);
    const struct wb_box *gr = wb_rt_box(t, op->amax.grid);
    struct wb_box in;
    if (!wb_box_intersect(gr, bl, &in))
        return 0;
    if (c->d->gpu)
        return ag_box_move_async(grid, gr, peer, bl, &in, 1, c->d->stream);
    /* Spread the peer's values over the grid's layout, then merge (zero is neutral: amax >= 0,
     * and a NaN still wins). */
    uint64_t n = wb_box_numel(gr);
    float *spread = c->d->hscratch;
    memset(spread, 0, n * sizeof(float));
    struct mv m = {spread, peer};
    walk2(&in, gr, bl, put_a_from_b, &m);
    wb_quant_fp8_amax_merge(grid, spread, n);
    return 0;
}

int ag_ops_unpack_member(const struct opctx *c, const struct wb_rt_op *op, uint32_t member,
                         const void *packed)
{
    const struct wb_route_table *t = &c->d->table;
    const struct wb_rt_gather *g = &op->gather;
    struct wb_quant_exec ex = ex_of(c->d);
    void *dst = ag_ops_view_ptr(c, &g->dst);
    const struct wb_rt_peer *p = &t->peers[g->peer0 + member];
    return wb_quant_unpack(&ex, g->dst.dtype, wb_rt_shape(t, g->dst.shape), wb_rt_box(t, p->box),
                           packed, dst);
}

/* Scratch 0 for a quantization source of n elements: packed (FP32 at most), and an FP32
 * source's BF16 cast behind it. */
static uint64_t quant_scratch(uint64_t n, enum wb_dtype dt)
{
    return dt == WB_DTYPE_FP32 ? fp32_cast_off(n) + n * 2 : n * 4;
}

uint64_t ag_ops_scratch_need(const struct wb_route_table *t)
{
    uint64_t need = 4096;
    for (uint32_t i = 0; i < t->nops; i++) {
        const struct wb_rt_op *op = &t->ops[i];
        uint64_t n = 0;
        if (op->kind == WB_OP_COPY || op->kind == WB_OP_CAST)
            n = wb_box_numel(wb_rt_box(t, op->copy.src_box)) * 4;
        else if (op->kind == WB_OP_PERMUTE)
            n = wb_box_numel(wb_rt_box(t, op->permute.src_box)) * 8;
        else if (op->kind == WB_OP_QUANT)
            n = quant_scratch(wb_box_numel(wb_rt_box(t, op->quant.src_box)), op->quant.src.dtype);
        else if (op->kind == WB_OP_AMAX)
            n = quant_scratch(wb_box_numel(wb_rt_box(t, op->amax.src_box)), op->amax.src.dtype);
        if (n > need)
            need = n;
    }
    return need;
}
