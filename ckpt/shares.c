/* shares.c — the checkpoint's bytes cut into one share per reader.
 *
 * The tensors in reading order form one byte sequence of `total` bytes; reader k's ideal range
 * is [floor(k total / n), floor((k+1) total / n)). Each inner cut is moved to the nearest row
 * boundary (along dim 0) of the tensor it falls in, so a reader reads contiguous stretches of
 * the files (sequential I/O) and a large tensor is split by whole rows over the readers that
 * its bytes span: no file or tensor can make one reader the bottleneck. A cut moves by at most
 * half a row, so every share is within one row of total / n. FP8 2-D tensors are cut at
 * 128-row block edges, so every reader holds whole quantization blocks of what it reads. */
#include "ckpt/ckpriv.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* Bytes of the unit a cut may fall on inside tensor t: a row (a block of 128 rows for 2-D FP8),
 * the whole tensor for a 0-d one. */
static uint64_t unit_bytes(const struct wb_ckpt *ck, size_t t, uint64_t *unit_rows)
{
    const struct wb_param *p = &ck->inv.p[t];
    uint64_t rows = p->shape.ndim ? p->shape.dim[0] : 1;
    uint64_t bytes = ck->loc[t].bytes;
    uint64_t row = rows ? bytes / rows : bytes;
    uint64_t g = p->dtype == WB_DTYPE_FP8_E4M3 && p->shape.ndim == 2 ? WB_FP8_BLOCK : 1;
    *unit_rows = g;
    return row * g;
}

static int add_piece(struct wb_ckpt_share *s, size_t *cap, const struct wb_ckpt_piece *p)
{
    if (s->n == *cap && wb_grow(&s->piece, cap, 16, sizeof(*s->piece)))
        return -ENOMEM;
    s->piece[s->n++] = *p;
    s->bytes += p->bytes;
    return 0;
}

void wb_ckpt_shares_free(struct wb_ckpt_shares *s)
{
    for (uint32_t k = 0; s->share && k < s->n; k++)
        free(s->share[k].piece);
    free(s->share);
    memset(s, 0, sizeof(*s));
}

int wb_ckpt_shares_make(const struct wb_ckpt *ck, uint32_t readers, struct wb_ckpt_shares *out)
{
    if (readers == 0 || readers > WB_CKPT_MAX_READERS)
        return -EINVAL;
    struct wb_ckpt_shares s = {.n = readers, .total = ck->bytes};
    uint64_t *cut = calloc((size_t)readers + 1, sizeof(*cut));
    size_t *cap = calloc(readers, sizeof(*cap));
    s.share = calloc(readers, sizeof(*s.share));
    int err = cut && cap && s.share ? 0 : -ENOMEM;
    /* the cuts: cut[k] is where reader k starts; total < 2^48 * tensors and readers <= 2^16
     * keep k * total below 2^64 for any checkpoint that fits on a disk */
    if (!err)
        cut[readers] = s.total;
    size_t t = 0;
    uint64_t start = 0; /* of tensor t in the sequence */
    for (uint32_t k = 1; !err && k < readers; k++) {
        uint64_t x = (uint64_t)((unsigned __int128)s.total * k / readers);
        while (t < ck->inv.n && start + ck->loc[t].bytes <= x) {
            start += ck->loc[t].bytes;
            t++;
        }
        if (t == ck->inv.n || x == start) {
            cut[k] = x;
            continue;
        }
        uint64_t g, u = unit_bytes(ck, t, &g);
        uint64_t in = x - start, lo = in / u * u;
        uint64_t hi = lo + u < ck->loc[t].bytes ? lo + u : ck->loc[t].bytes;
        cut[k] = start + (in - lo <= hi - in ? lo : hi);
        if (u > s.slack)
            s.slack = u;
    }
    /* the pieces */
    uint32_t k = 0;
    start = 0;
    for (t = 0; !err && t < ck->inv.n; t++) {
        const struct wb_param *p = &ck->inv.p[t];
        uint64_t bytes = ck->loc[t].bytes, end = start + bytes;
        uint64_t rows = p->shape.ndim ? p->shape.dim[0] : 1;
        uint64_t row = rows ? bytes / rows : 0;
        while (k + 1 < readers && cut[k + 1] <= start && (bytes || cut[k + 1] < s.total))
            k++;
        if (bytes == 0) {
            struct wb_ckpt_piece pc = {(uint32_t)t, 0, rows, 0, 0};
            err = add_piece(&s.share[k], &cap[k], &pc);
            continue;
        }
        uint32_t first = k;
        for (uint32_t j = k; !err && j < readers && cut[j] < end; j++) {
            uint64_t a = cut[j] > start ? cut[j] : start;
            uint64_t b = cut[j + 1] < end ? cut[j + 1] : end;
            if (a >= b)
                continue;
            struct wb_ckpt_piece pc = {(uint32_t)t, (a - start) / row, (b - a) / row, a - start,
                                       b - a};
            err = add_piece(&s.share[j], &cap[j], &pc);
            k = j;
        }
        if (k != first)
            s.nsplit++;
        start = end;
    }
    s.min = UINT64_MAX;
    for (uint32_t j = 0; !err && j < readers; j++) {
        if (s.share[j].bytes > s.max)
            s.max = s.share[j].bytes;
        if (s.share[j].bytes < s.min)
            s.min = s.share[j].bytes;
    }
    free(cut);
    free(cap);
    if (err) {
        wb_ckpt_shares_free(&s);
        return err;
    }
    *out = s;
    return 0;
}

struct wb_box wb_ckpt_piece_box(const struct wb_ckpt *ck, const struct wb_ckpt_piece *p)
{
    struct wb_box b = wb_box_full(&ck->inv.p[p->tensor].shape);
    if (b.ndim) {
        b.off[0] = p->row0;
        b.ext[0] = p->rows;
    }
    return b;
}
