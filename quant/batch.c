/* batch.c — batches of quantizations and copies (quant.h): the checks, the host path (the CPU
 * reference, item by item, through contiguous staging) and the hand-off of device batches to
 * batch.cu. Every item is checked before anything is prepared, so a rejected batch runs
 * nothing. */
#include "quant/quant_int.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static const char MOD[] = "quant";

struct wb_quant_batch {
    bool device;
    struct wb_quant_dev_batch *dev;
    struct wb_quant_item *q; /* host batches keep the items */
    struct wb_copy_item *c;
    size_t nq, nc;
};

static bool mul_ok(uint64_t a, uint64_t b, uint64_t *out)
{
    return !__builtin_mul_overflow(a, b, out) && *out <= (uint64_t)SIZE_MAX / 2;
}

static int check_qitem(size_t i, const struct wb_quant_item *it)
{
    uint64_t n;
    size_t esz = wb_dtype_size(it->dtype);
    const char *bad = NULL;
    if (it->dtype != WB_DTYPE_BF16 && it->dtype != WB_DTYPE_FP16 && it->dtype != WB_DTYPE_FP32)
        bad = "its source dtype is not bf16, fp16 or fp32";
    else if (!it->rows || !it->cols)
        bad = "it is empty";
    else if (!it->src || !it->q || !it->scale)
        bad = "a buffer is NULL";
    else if (!it->shadow != !it->shadow_scale)
        bad = "it has a shadow for its bytes or its scales but not both";
    else if (it->src_ld < it->cols || it->q_ld < it->cols)
        bad = "a row stride is below the row length";
    else if (it->scale_ld < wb_quant_blocks(it->col0 % WB_FP8_BLOCK + it->cols))
        bad = "the scale row stride is below the block columns";
    else if ((uintptr_t)it->src % esz || (uintptr_t)it->scale % 4)
        bad = "a buffer is not aligned to its elements";
    else if (!mul_ok(it->rows, it->src_ld, &n) || !mul_ok(n, esz, &n) ||
             !mul_ok(it->rows, it->q_ld, &n))
        bad = "it is too large";
    if (bad)
        wb_log(WB_LOG_ERROR, MOD, "wb_quant_batch_create: quantization %zu: %s", i, bad);
    return bad ? -EINVAL : 0;
}

static int check_citem(size_t i, const struct wb_copy_item *it)
{
    uint64_t n;
    const char *bad = NULL;
    if (!it->rows || !it->bytes)
        bad = "it is empty";
    else if (!it->src || !it->dst)
        bad = "a buffer is NULL";
    else if (it->rows > 1 && (it->src_ld < it->bytes || it->dst_ld < it->bytes))
        bad = "a row stride is below the row length";
    else if (!mul_ok(it->rows, it->bytes, &n) ||
             (it->rows > 1 &&
              (!mul_ok(it->rows, it->src_ld, &n) || !mul_ok(it->rows, it->dst_ld, &n))))
        bad = "it is too large";
    if (bad)
        wb_log(WB_LOG_ERROR, MOD, "wb_quant_batch_create: copy %zu: %s", i, bad);
    return bad ? -EINVAL : 0;
}

int wb_quant_batch_create(const struct wb_quant_exec *ex, const struct wb_quant_item *q, size_t nq,
                          const struct wb_copy_item *c, size_t nc, struct wb_quant_batch **out)
{
    if ((nq && !q) || (nc && !c) || !out) {
        wb_log(WB_LOG_ERROR, MOD, "wb_quant_batch_create: NULL items or result");
        return -EINVAL;
    }
    for (size_t i = 0; i < nq; i++)
        if (check_qitem(i, &q[i]))
            return -EINVAL;
    for (size_t i = 0; i < nc; i++)
        if (check_citem(i, &c[i]))
            return -EINVAL;
    bool device = ex && ex->mem == WB_QUANT_DEVICE;
    if (ex && ex->mem == WB_QUANT_AUTO) {
        int wq = nq ? wb_gpu_ptr_device(q[0].src) : WB_GPU_HOST;
        int wc = nc ? wb_gpu_ptr_device(c[0].src) : WB_GPU_HOST;
        if (wq == WB_GPU_UNKNOWN || wc == WB_GPU_UNKNOWN)
            return -WB_E_CUDA; /* never a host loop over device memory */
        device = wq >= 0 || wc >= 0;
    }
    struct wb_quant_batch *b = calloc(1, sizeof(*b));
    if (!b)
        return -ENOMEM;
    b->device = device;
    b->nq = nq;
    b->nc = nc;
    int rc = 0;
    if (device) {
        rc = qt_dev_batch_create(q, nq, c, nc, &b->dev);
    } else {
        b->q = malloc((nq ? nq : 1) * sizeof(*q));
        b->c = malloc((nc ? nc : 1) * sizeof(*c));
        if (!b->q || !b->c)
            rc = -ENOMEM;
        else {
            if (nq)
                memcpy(b->q, q, nq * sizeof(*q));
            if (nc)
                memcpy(b->c, c, nc * sizeof(*c));
        }
    }
    if (rc) {
        wb_quant_batch_free(b);
        return rc;
    }
    *out = b;
    return 0;
}

/* Stores n bytes of new values at dst unless delta and the shadow holds them already; the
 * shadow follows. Returns the bytes stored. */
static uint64_t store_unit(uint8_t *dst, uint8_t *shadow, const uint8_t *v, size_t n, bool delta)
{
    if (delta && memcmp(shadow, v, n) == 0)
        return 0;
    memcpy(dst, v, n);
    memcpy(shadow, v, n);
    return n;
}

/* A quantized tile's results into place: unit by unit against the shadow (quant.h), or plainly
 * without one. Returns the bytes stored through the shadow. */
static uint64_t host_scatter(const struct wb_quant_item *it, const uint8_t *qb, const float *sc,
                             const struct wb_quant_grid *g, bool delta)
{
    uint64_t n = 0;
    if (!it->shadow) {
        for (uint64_t r = 0; r < it->rows; r++)
            memcpy(it->q + r * it->q_ld, qb + r * it->cols, it->cols);
        for (uint64_t i = 0; i < g->rows; i++)
            memcpy(it->scale + i * it->scale_ld, sc + i * g->cols, g->cols * sizeof(float));
        return 0;
    }
    for (uint64_t r = 0; r < it->rows; r++)
        for (uint64_t c = 0; c < it->cols;) {
            uint64_t edge = c + WB_FP8_BLOCK - (it->col0 + c) % WB_FP8_BLOCK;
            uint64_t end = c + 4;
            end = end < edge ? end : edge;
            end = end < it->cols ? end : it->cols;
            n += store_unit(it->q + r * it->q_ld + c, it->shadow + r * it->cols + c,
                            qb + r * it->cols + c, end - c, delta);
            c = end;
        }
    for (uint64_t i = 0; i < g->rows; i++)
        for (uint64_t j = 0; j < g->cols; j++)
            n += store_unit((uint8_t *)(it->scale + i * it->scale_ld + j),
                            (uint8_t *)(it->shadow_scale + i * g->cols + j),
                            (const uint8_t *)(sc + i * g->cols + j), sizeof(float), delta);
    return n;
}

/* A copy's rows: 4-byte units from each row's start against the shadow, or plainly. */
static uint64_t host_copy(const struct wb_copy_item *it, bool delta)
{
    uint64_t n = 0;
    for (uint64_t r = 0; r < it->rows; r++) {
        uint8_t *d = (uint8_t *)it->dst + r * it->dst_ld;
        const uint8_t *s = (const uint8_t *)it->src + r * it->src_ld;
        if (!it->shadow) {
            memmove(d, s, it->bytes);
            continue;
        }
        uint8_t *sh = (uint8_t *)it->shadow + r * it->bytes;
        for (uint64_t c = 0; c < it->bytes; c += 4)
            n += store_unit(d + c, sh + c, s + c, it->bytes - c < 4 ? it->bytes - c : 4, delta);
    }
    return n;
}

/* One item on the host: rows staged contiguous, the reference pass, results scattered. */
static int host_quant(const struct wb_quant_item *it, bool delta, uint64_t *stored)
{
    size_t esz = wb_dtype_size(it->dtype);
    struct wb_quant_pass p = {
        .mode = WB_QUANT_MODE_FUSED,
        .tile = {.dtype = it->dtype,
                 .rows = it->rows,
                 .cols = it->cols,
                 .row0 = it->row0,
                 .col0 = it->col0},
        .r0 = 0,
        .r1 = it->rows,
    };
    if (wb_quant_fp8_grid(&p.tile, 0, it->rows, &p.grid))
        return -EINVAL;
    uint8_t *src = malloc(it->rows * it->cols * esz), *qb = malloc(it->rows * it->cols);
    float *sc = malloc(p.grid.rows * p.grid.cols * sizeof(float));
    if (!src || !qb || !sc) {
        free(src);
        free(qb);
        free(sc);
        return -ENOMEM;
    }
    for (uint64_t r = 0; r < it->rows; r++)
        memcpy(src + r * it->cols * esz, (const uint8_t *)it->src + r * it->src_ld * esz,
               it->cols * esz);
    p.src = src;
    p.q = qb;
    p.scale_inv = sc;
    qt_cpu_pass(&p);
    *stored += host_scatter(it, qb, sc, &p.grid, delta);
    free(src);
    free(qb);
    free(sc);
    return 0;
}

int wb_quant_batch_run_delta(struct wb_quant_batch *b, void *stream, bool delta, uint64_t *stored)
{
    if (!b)
        return -EINVAL;
    if (b->device)
        return qt_dev_batch_run(b->dev, stream, delta, stored);
    uint64_t n = 0;
    for (size_t i = 0; i < b->nq; i++) {
        int rc = host_quant(&b->q[i], delta, &n);
        if (rc)
            return rc;
    }
    for (size_t i = 0; i < b->nc; i++)
        n += host_copy(&b->c[i], delta);
    if (stored)
        *stored += n;
    return 0;
}

int wb_quant_batch_run(struct wb_quant_batch *b, void *stream)
{
    return wb_quant_batch_run_delta(b, stream, false, NULL);
}

void wb_quant_batch_free(struct wb_quant_batch *b)
{
    if (!b)
        return;
    qt_dev_batch_free(b->dev);
    free(b->q);
    free(b->c);
    free(b);
}
