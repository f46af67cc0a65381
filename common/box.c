/* box.c — shapes and n-dimensional boxes (slices), and the decomposition of a box into the
 * contiguous byte ranges it covers inside a row-major tensor. The planner builds write lists
 * from these ranges and the agent packs with them, so correctness at the edges (empty boxes,
 * whole tensors, 1-element dims, boxes touching the tensor end) matters more than speed. */
#include "common/common.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

uint64_t wb_shape_numel(const struct wb_shape *s)
{
    uint64_t n = 1;
    for (uint32_t d = 0; d < s->ndim; d++)
        n *= s->dim[d];
    return n;
}

bool wb_shape_eq(const struct wb_shape *a, const struct wb_shape *b)
{
    if (a->ndim != b->ndim)
        return false;
    for (uint32_t d = 0; d < a->ndim; d++)
        if (a->dim[d] != b->dim[d])
            return false;
    return true;
}

/* Appends to buf at *pos, never past cap. */
static void put(char *buf, size_t cap, size_t *pos, const char *fmt, uint64_t a, uint64_t b)
{
    if (*pos >= cap)
        return;
    int n = snprintf(buf + *pos, cap - *pos, fmt, a, b);
    if (n > 0)
        *pos += (size_t)n;
}

char *wb_shape_str(const struct wb_shape *s, char *buf, size_t cap)
{
    size_t pos = 0;
    if (!cap)
        return buf;
    buf[0] = 0;
    put(buf, cap, &pos, "[", 0, 0);
    for (uint32_t d = 0; d < s->ndim; d++)
        put(buf, cap, &pos, d ? ", %llu" : "%llu", s->dim[d], 0);
    put(buf, cap, &pos, "]", 0, 0);
    return buf;
}

struct wb_box wb_box_full(const struct wb_shape *s)
{
    struct wb_box b = {.ndim = s->ndim};
    for (uint32_t d = 0; d < s->ndim; d++)
        b.ext[d] = s->dim[d];
    return b;
}

uint64_t wb_box_numel(const struct wb_box *b)
{
    uint64_t n = 1;
    for (uint32_t d = 0; d < b->ndim; d++)
        n *= b->ext[d];
    return n;
}

bool wb_box_empty(const struct wb_box *b)
{
    return wb_box_numel(b) == 0;
}

bool wb_box_eq(const struct wb_box *a, const struct wb_box *b)
{
    if (a->ndim != b->ndim)
        return false;
    for (uint32_t d = 0; d < a->ndim; d++)
        if (a->off[d] != b->off[d] || a->ext[d] != b->ext[d])
            return false;
    return true;
}

struct wb_shape wb_box_shape(const struct wb_box *b)
{
    struct wb_shape s = {.ndim = b->ndim};
    for (uint32_t d = 0; d < b->ndim; d++)
        s.dim[d] = b->ext[d];
    return s;
}

bool wb_box_intersect(const struct wb_box *a, const struct wb_box *b, struct wb_box *out)
{
    struct wb_box r = {.ndim = a->ndim};
    bool nonempty = a->ndim == b->ndim;
    for (uint32_t d = 0; nonempty && d < a->ndim; d++) {
        uint64_t lo = a->off[d] > b->off[d] ? a->off[d] : b->off[d];
        uint64_t ea = a->off[d] + a->ext[d], eb = b->off[d] + b->ext[d];
        uint64_t hi = ea < eb ? ea : eb;
        if (hi <= lo) {
            nonempty = false;
            break;
        }
        r.off[d] = lo;
        r.ext[d] = hi - lo;
    }
    if (!nonempty) /* canonical empty box: zero offsets and extents */
        memset(r.off, 0, sizeof(r.off)), memset(r.ext, 0, sizeof(r.ext));
    *out = r;
    return nonempty;
}

bool wb_box_contains(const struct wb_box *outer, const struct wb_box *inner)
{
    if (wb_box_empty(inner))
        return true;
    if (outer->ndim != inner->ndim)
        return false;
    for (uint32_t d = 0; d < outer->ndim; d++)
        if (inner->off[d] < outer->off[d] ||
            inner->off[d] + inner->ext[d] > outer->off[d] + outer->ext[d])
            return false;
    return true;
}

bool wb_box_within(const struct wb_shape *s, const struct wb_box *b)
{
    struct wb_box full = wb_box_full(s);
    return s->ndim == b->ndim && wb_box_contains(&full, b);
}

struct wb_box wb_box_relative(const struct wb_box *b, const struct wb_box *origin)
{
    struct wb_box r = *b;
    for (uint32_t d = 0; d < b->ndim; d++)
        r.off[d] -= origin->off[d];
    return r;
}

struct wb_box wb_box_shift(const struct wb_box *b, const uint64_t *delta)
{
    struct wb_box r = *b;
    for (uint32_t d = 0; d < b->ndim; d++)
        r.off[d] += delta[d];
    return r;
}

char *wb_box_str(const struct wb_box *b, char *buf, size_t cap)
{
    size_t pos = 0;
    if (!cap)
        return buf;
    buf[0] = 0;
    put(buf, cap, &pos, "[", 0, 0);
    for (uint32_t d = 0; d < b->ndim; d++)
        put(buf, cap, &pos, d ? ", %llu:%llu" : "%llu:%llu", b->off[d], b->off[d] + b->ext[d]);
    put(buf, cap, &pos, "]", 0, 0);
    return buf;
}

int wb_ranges_init(struct wb_ranges *r, const struct wb_shape *shape, const struct wb_box *box,
                   size_t elem_size)
{
    if (elem_size == 0 || shape->ndim > WB_MAX_DIMS || !wb_box_within(shape, box))
        return -EINVAL;
    memset(r, 0, sizeof(*r));
    r->shape = *shape;
    r->box = *box;
    r->elem = elem_size;
    if (wb_box_empty(box))
        return 0;
    if (shape->ndim == 0) {
        r->run_bytes = elem_size;
        r->count = 1;
        return 0;
    }
    /* Find the outermost dim k such that every dim after k is covered whole: the box's
     * elements in dims [k, ndim) are then one contiguous run. */
    uint32_t k = shape->ndim - 1;
    while (k > 0 && box->off[k] == 0 && box->ext[k] == shape->dim[k])
        k--;
    uint64_t run = box->ext[k];
    for (uint32_t d = k + 1; d < shape->ndim; d++)
        run *= shape->dim[d];
    r->outer = k;
    r->run_bytes = run * elem_size;
    r->count = 1;
    for (uint32_t d = 0; d < k; d++)
        r->count *= box->ext[d];
    return 0;
}

bool wb_ranges_next(struct wb_ranges *r, uint64_t *offset, uint64_t *len)
{
    if (r->index >= r->count)
        return false;
    /* Element offset: outer dims at off+idx, dim `outer` at its box offset, inner dims at 0. */
    uint64_t off = 0;
    for (uint32_t d = 0; d < r->shape.ndim; d++) {
        uint64_t i = d < r->outer ? r->box.off[d] + r->idx[d] : d == r->outer ? r->box.off[d] : 0;
        off = off * r->shape.dim[d] + i;
    }
    *offset = off * r->elem;
    *len = r->run_bytes;
    r->index++;
    for (uint32_t d = r->outer; d-- > 0;) { /* odometer over the outer dims */
        if (++r->idx[d] < r->box.ext[d])
            break;
        r->idx[d] = 0;
    }
    return true;
}

/* ---------------------------------------------------------------- transposes */

enum { PERMUTE_TILE = 32 };

/* One tile of a 2-D transpose: rows [r0, r1) x cols [c0, c1) of dst, whose rows step dstep
 * elements and whose columns are contiguous; src element (r, c) at r + c * sstep. */
static void permute_tile(uint8_t *dst, const uint8_t *src, size_t elem, uint64_t r0, uint64_t r1,
                         uint64_t c0, uint64_t c1, uint64_t dstep, uint64_t sstep)
{
    for (uint64_t r = r0; r < r1; r++) {
        uint64_t di = r * dstep, si = r;
        switch (elem) { /* one loop per size, so that each compiles to plain loads and stores */
        case 1:
            for (uint64_t c = c0; c < c1; c++)
                dst[di + c] = src[si + c * sstep];
            break;
        case 2:
            for (uint64_t c = c0; c < c1; c++)
                ((uint16_t *)(void *)dst)[di + c] =
                    ((const uint16_t *)(const void *)src)[si + c * sstep];
            break;
        case 4:
            for (uint64_t c = c0; c < c1; c++)
                ((uint32_t *)(void *)dst)[di + c] =
                    ((const uint32_t *)(const void *)src)[si + c * sstep];
            break;
        default:
            for (uint64_t c = c0; c < c1; c++)
                ((uint64_t *)(void *)dst)[di + c] =
                    ((const uint64_t *)(const void *)src)[si + c * sstep];
            break;
        }
    }
}

int wb_permute(void *dst, const void *src, size_t elem, uint32_t ndim, const uint64_t *ext,
               const uint8_t *perm)
{
    if ((elem != 1 && elem != 2 && elem != 4 && elem != 8) || ndim > WB_MAX_DIMS)
        return -EINVAL;
    uint32_t seen = 0;
    for (uint32_t k = 0; k < ndim; k++) {
        if (perm[k] >= ndim || (seen >> perm[k] & 1))
            return -EINVAL;
        seen |= 1u << perm[k];
    }
    uint64_t sstr[WB_MAX_DIMS], e[WB_MAX_DIMS], es[WB_MAX_DIMS], dstr[WB_MAX_DIMS], n = 1;
    for (uint32_t d = ndim; d-- > 0;) {
        sstr[d] = n;
        n *= ext[d];
    }
    if (n == 0)
        return 0;
    if (ndim == 0) {
        memcpy(dst, src, elem);
        return 0;
    }
    uint64_t m = 1;
    for (uint32_t k = ndim; k-- > 0;) {
        e[k] = ext[perm[k]];
        es[k] = sstr[perm[k]]; /* src stride along dst dim k */
        dstr[k] = m;
        m *= e[k];
    }
    /* dst's contiguous dim b, and a: the dst dim that is src's contiguous one */
    uint32_t b = ndim - 1, a = 0;
    while (perm[a] != ndim - 1)
        a++;
    uint64_t idx[WB_MAX_DIMS] = {0};
    uint8_t *D = dst;
    const uint8_t *S = src;
    for (;;) {
        uint64_t so = 0, dof = 0;
        for (uint32_t k = 0; k < ndim; k++) {
            so += idx[k] * es[k];
            dof += idx[k] * dstr[k];
        }
        if (a == b) { /* src's rows stay rows: one copy each */
            memcpy(D + dof * elem, S + so * elem, e[b] * elem);
        } else {
            for (uint64_t r0 = 0; r0 < e[a]; r0 += PERMUTE_TILE)
                for (uint64_t c0 = 0; c0 < e[b]; c0 += PERMUTE_TILE)
                    permute_tile(D + dof * elem, S + so * elem, elem, r0,
                                 r0 + PERMUTE_TILE < e[a] ? r0 + PERMUTE_TILE : e[a], c0,
                                 c0 + PERMUTE_TILE < e[b] ? c0 + PERMUTE_TILE : e[b], dstr[a],
                                 es[b]);
        }
        /* the next index over the dims other than a and b (b alone when a == b) */
        uint32_t k = ndim;
        while (k-- > 0) {
            if (k == a || k == b)
                continue;
            if (++idx[k] < e[k])
                break;
            idx[k] = 0;
        }
        if (k == UINT32_MAX)
            return 0;
    }
}
