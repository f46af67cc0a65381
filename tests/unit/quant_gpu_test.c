/* quant_gpu_test.c — every CUDA kernel of quant/ against the CPU reference, byte for byte: block
 * quantization (16-byte and element-wise paths, ragged shapes, NaN/inf blocks), partial amax +
 * apply on tiles with column origins, pack/unpack of random boxes, casts of every 16-bit
 * pattern, and the choice of host or device by pointer. Needs a GPU; skips without one. */
#include "quant/quant.h"
#include "tests/wbtest.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>

static const struct wb_quant_exec HOST = {WB_QUANT_HOST, NULL};
static const struct wb_quant_exec DEV = {WB_QUANT_DEVICE, NULL};

static void need_gpu(void)
{
    if (!wb_gpu_built())
        wb_test_skip("built without CUDA");
    if (wb_gpu_count() == 0)
        wb_test_skip("no usable GPU on this machine");
}

static uint64_t rng_next(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* A device copy of n host bytes (extra bytes allocated so offset views stay inside). */
static void *to_dev(const void *h, size_t n)
{
    void *d = NULL;
    CHECK_INT(wb_quant_gpu_alloc(n + 64, &d), 0);
    if (h)
        CHECK_INT(wb_quant_gpu_copy(d, h, n, NULL), 0);
    CHECK_INT(wb_quant_gpu_sync(NULL), 0);
    return d;
}

static void from_dev(void *h, const void *d, size_t n)
{
    CHECK_INT(wb_quant_gpu_sync(NULL), 0);
    CHECK_INT(wb_quant_gpu_copy(h, d, n, NULL), 0);
    CHECK_INT(wb_quant_gpu_sync(NULL), 0);
}

/* Random values with per-block magnitudes (see quant_test.c), plus a few specials. */
static void *random_tensor(enum wb_dtype dt, uint64_t rows, uint64_t cols, uint64_t seed,
                           bool specials)
{
    size_t es = wb_dtype_size(dt);
    char *p = malloc(rows * cols * es + 64);
    CHECK(p);
    for (uint64_t i = 0; i < rows * cols; i++) {
        uint64_t r = i / cols, c = i % cols, blk = (r / 128) * 7 + (c / 128) * 3;
        int e = (int)(blk % 13) * 3 - 24;
        float v = ldexpf((float)((rng_next(&seed) >> 40) & 0xffffff) / 16777216.0f, e);
        if (rng_next(&seed) & 1)
            v = -v;
        if (dt == WB_DTYPE_FP32) {
            memcpy(p + i * 4, &v, 4);
        } else {
            uint32_t u;
            memcpy(&u, &v, 4);
            uint16_t h =
                dt == WB_DTYPE_BF16 ? (uint16_t)(u >> 16) : (uint16_t)(rng_next(&seed) & 0xfbff);
            memcpy(p + i * 2, &h, 2);
        }
    }
    if (specials && rows * cols > 1000) {
        static const uint32_t f32[] = {0x7fc00000, 0xff800000, 0x00000001, 0x80000000};
        static const uint16_t f16[] = {0x7e00, 0xfc00, 0x0001, 0x8000};
        for (int k = 0; k < 4; k++) {
            uint64_t at = (rng_next(&seed) % (rows * cols));
            if (dt == WB_DTYPE_FP32)
                memcpy(p + at * 4, &f32[k], 4);
            else
                memcpy(p + at * 2, dt == WB_DTYPE_BF16 ? (const uint16_t *)&f32[k] + 1 : &f16[k],
                       2);
        }
    }
    return p;
}

static const enum wb_dtype DTYPES[] = {WB_DTYPE_BF16, WB_DTYPE_FP16, WB_DTYPE_FP32};

static void test_gpu_block(void)
{
    need_gpu();
    static const uint64_t shapes[][2] = {{1, 1},     {7, 5},     {128, 128}, {129, 130},
                                         {300, 256}, {256, 384}, {17, 1000}, {1024, 2048},
                                         {260, 16},  {513, 4112}};
    for (size_t d = 0; d < WB_ARRAY_LEN(DTYPES); d++)
        for (size_t i = 0; i < WB_ARRAY_LEN(shapes); i++)
            for (int shift = 0; shift < 2; shift++) { /* 1: misaligned, element-wise path */
                uint64_t rows = shapes[i][0], cols = shapes[i][1], n = rows * cols;
                size_t es = wb_dtype_size(DTYPES[d]);
                uint64_t ns = wb_quant_blocks(rows) * wb_quant_blocks(cols);
                void *x = random_tensor(DTYPES[d], rows, cols, 3 + i, i % 2 == 1);
                uint8_t *q = malloc(n), *qd = malloc(n);
                float *s = malloc(ns * 4), *sd = malloc(ns * 4);
                CHECK(q && qd && s && sd);
                CHECK_INT(wb_quant_fp8_block(&HOST, DTYPES[d], x, rows, cols, q, s), 0);
                char *dx = to_dev(NULL, n * es), *dq = to_dev(NULL, n);
                float *ds = to_dev(NULL, ns * 4);
                CHECK_INT(wb_quant_gpu_copy(dx + shift * es, x, n * es, NULL), 0);
                CHECK_INT(wb_quant_fp8_block(&DEV, DTYPES[d], dx + shift * es, rows, cols,
                                             (uint8_t *)dq + shift, ds),
                          0);
                from_dev(qd, dq + shift, n);
                from_dev(sd, ds, ns * 4);
                for (uint64_t k = 0; k < n; k++)
                    if (q[k] != qd[k])
                        wb_test_fail(__FILE__, __LINE__,
                                     "%s [%llu,%llu] shift %d element %llu: GPU 0x%02x, CPU "
                                     "0x%02x",
                                     wb_dtype_name(DTYPES[d]), (unsigned long long)rows,
                                     (unsigned long long)cols, shift, (unsigned long long)k, qd[k],
                                     q[k]);
                CHECK_MEM(sd, s, ns * 4);
                wb_quant_gpu_free(dx);
                wb_quant_gpu_free(dq);
                wb_quant_gpu_free(ds);
                free(x);
                free(q);
                free(qd);
                free(s);
                free(sd);
            }
}

/* Owners hold tiles of a 390 x 300 tensor (column origins on and off 16-element boundaries);
 * partial amax on the GPU, merged on the host, apply on the GPU == one-shot on the CPU. */
static void test_gpu_split(void)
{
    need_gpu();
    enum { R = 390, C = 304 };
    static const uint64_t rcut[] = {0, 100, 128, 300, R};
    static const uint64_t ccuts[][4] = {{0, 16, 144, C}, {0, 7, 129, C}, {0, 128, 256, C}};
    for (size_t d = 0; d < WB_ARRAY_LEN(DTYPES); d++) {
        enum wb_dtype dt = DTYPES[d];
        size_t es = wb_dtype_size(dt);
        char *x = random_tensor(dt, R, C, 17 + d, false);
        uint8_t q1[R * C], q[R * C], tq[R * C];
        float s1[4 * 3], amax[4 * 3], part[4 * 3], si[4 * 3];
        char *tile = malloc(R * C * es);
        CHECK(tile);
        CHECK_INT(wb_quant_fp8_block(&HOST, dt, x, R, C, q1, s1), 0);
        for (size_t cc = 0; cc < WB_ARRAY_LEN(ccuts); cc++) {
            const uint64_t *ccut = ccuts[cc];
            for (int k = 0; k < 12; k++)
                amax[k] = 0;
            for (int phase = 0; phase < 2; phase++)
                for (int a = 0; a < 4; a++)
                    for (int b = 0; b < 3; b++) {
                        struct wb_quant_tile t = {dt, rcut[a + 1] - rcut[a], ccut[b + 1] - ccut[b],
                                                  rcut[a], ccut[b]};
                        for (uint64_t r = 0; r < t.rows; r++)
                            memcpy(tile + r * t.cols * es, x + ((t.row0 + r) * C + t.col0) * es,
                                   t.cols * es);
                        void *dt_src = to_dev(tile, t.rows * t.cols * es);
                        uint8_t *dq = to_dev(NULL, t.rows * t.cols);
                        float *dp = to_dev(NULL, sizeof(part)), *dsi = to_dev(NULL, sizeof(si));
                        struct wb_quant_grid g;
                        CHECK_INT(wb_quant_fp8_grid(&t, 0, t.rows, &g), 0);
                        if (phase == 0) {
                            CHECK_INT(wb_quant_fp8_amax(&DEV, &t, dt_src, 0, t.rows, dp), 0);
                            from_dev(part, dp, g.rows * g.cols * 4);
                            for (uint64_t i = 0; i < g.rows; i++)
                                wb_quant_fp8_amax_merge(amax + (g.row + i) * 3 + g.col,
                                                        part + i * g.cols, g.cols);
                        } else {
                            for (uint64_t i = 0; i < g.rows; i++)
                                memcpy(part + i * g.cols, amax + (g.row + i) * 3 + g.col,
                                       g.cols * 4);
                            CHECK_INT(wb_quant_gpu_copy(dp, part, g.rows * g.cols * 4, NULL), 0);
                            uint64_t mid = t.rows / 2; /* two calls, as a pipeline would */
                            struct wb_quant_grid g0, g1;
                            CHECK_INT(wb_quant_fp8_grid(&t, 0, mid, &g0), 0);
                            CHECK_INT(wb_quant_fp8_grid(&t, mid, t.rows, &g1), 0);
                            CHECK_INT(wb_quant_fp8_apply(&DEV, &t, dt_src, 0, mid, dp, dq, dsi), 0);
                            CHECK_INT(wb_quant_fp8_apply(&DEV, &t, dt_src, mid, t.rows,
                                                         dp + (g1.row - g.row) * g.cols, dq, NULL),
                                      0);
                            from_dev(tq, dq, t.rows * t.cols);
                            from_dev(si, dsi, g0.rows * g0.cols * 4);
                            for (uint64_t i = 0; i < g0.rows * g0.cols; i++)
                                CHECK_MEM(&si[i],
                                          &s1[(g0.row + i / g0.cols) * 3 + g0.col + i % g0.cols],
                                          4);
                            for (uint64_t r = 0; r < t.rows; r++)
                                memcpy(q + (t.row0 + r) * C + t.col0, tq + r * t.cols, t.cols);
                        }
                        wb_quant_gpu_free(dt_src);
                        wb_quant_gpu_free(dq);
                        wb_quant_gpu_free(dp);
                        wb_quant_gpu_free(dsi);
                    }
            CHECK_MEM(q, q1, sizeof(q));
        }
        free(x);
        free(tile);
    }
}

static void test_gpu_pack(void)
{
    need_gpu();
    static const enum wb_dtype dts[] = {WB_DTYPE_FP8_E4M3, WB_DTYPE_BF16, WB_DTYPE_FP32,
                                        WB_DTYPE_I64};
    uint64_t seed = 5;
    for (int iter = 0; iter < 200; iter++) {
        enum wb_dtype dt = dts[iter % 4];
        size_t es = wb_dtype_size(dt);
        struct wb_shape s = {.ndim = 1 + (uint32_t)(rng_next(&seed) % 5)};
        struct wb_box b = {.ndim = s.ndim};
        for (uint32_t d = 0; d < s.ndim; d++) {
            s.dim[d] = 1 + rng_next(&seed) % (d + 1 == s.ndim ? 700 : 9);
            uint64_t kind = rng_next(&seed) % 3;
            b.off[d] = kind == 0 ? 0 : rng_next(&seed) % s.dim[d];
            b.ext[d] = kind == 0 ? s.dim[d] : 1 + rng_next(&seed) % (s.dim[d] - b.off[d]);
        }
        uint64_t n = wb_shape_numel(&s), m = wb_box_numel(&b);
        uint8_t *x = malloc(n * es), *p = malloc(m * es), *pd = malloc(m * es);
        uint8_t *y = malloc(n * es), *yd = malloc(n * es);
        CHECK(x && p && pd && y && yd);
        for (uint64_t i = 0; i < n * es; i++)
            x[i] = (uint8_t)rng_next(&seed);
        CHECK_INT(wb_quant_pack(&HOST, dt, &s, &b, x, p), 0);
        void *dx = to_dev(x, n * es), *dp = to_dev(NULL, m * es), *dy = to_dev(NULL, n * es);
        CHECK_INT(wb_quant_pack(&DEV, dt, &s, &b, dx, dp), 0);
        from_dev(pd, dp, m * es);
        CHECK_MEM(pd, p, m * es);
        memset(y, 0x33, n * es);
        CHECK_INT(wb_quant_gpu_copy(dy, y, n * es, NULL), 0);
        CHECK_INT(wb_quant_unpack(&HOST, dt, &s, &b, p, y), 0);
        CHECK_INT(wb_quant_unpack(&DEV, dt, &s, &b, dp, dy), 0);
        from_dev(yd, dy, n * es);
        CHECK_MEM(yd, y, n * es);
        wb_quant_gpu_free(dx);
        wb_quant_gpu_free(dp);
        wb_quant_gpu_free(dy);
        free(x);
        free(p);
        free(pd);
        free(y);
        free(yd);
    }
    /* a large contiguous-run case (16-byte units, long runs split into chunks) */
    enum { R = 64, C = 70000 };
    struct wb_shape s = {2, {R, C}};
    struct wb_box b = {2, {3, 16}, {50, 60000}};
    uint16_t *x = malloc(R * C * 2), *p = malloc(50 * 60000 * 2), *pd = malloc(50 * 60000 * 2);
    CHECK(x && p && pd);
    for (uint64_t i = 0; i < (uint64_t)R * C; i++)
        x[i] = (uint16_t)(i * 31);
    void *dx = to_dev(x, R * C * 2), *dp = to_dev(NULL, 50 * 60000 * 2);
    CHECK_INT(wb_quant_pack(&HOST, WB_DTYPE_BF16, &s, &b, x, p), 0);
    CHECK_INT(wb_quant_pack(&DEV, WB_DTYPE_BF16, &s, &b, dx, dp), 0);
    from_dev(pd, dp, 50 * 60000 * 2);
    CHECK_MEM(pd, p, 50 * 60000 * 2);
    wb_quant_gpu_free(dx);
    wb_quant_gpu_free(dp);
    free(x);
    free(p);
    free(pd);
}

static void test_gpu_cast(void)
{
    need_gpu();
    enum { N = 65536 + 13 };
    uint16_t *h = malloc(N * 2);
    float *f = malloc(N * 4);
    void *out = malloc(N * 4), *outd = malloc(N * 4);
    CHECK(h && f && out && outd);
    uint64_t seed = 3;
    for (uint32_t i = 0; i < N; i++) {
        h[i] = (uint16_t)i;
        uint32_t u = (uint32_t)rng_next(&seed);
        memcpy(&f[i], &u, 4);
    }
    static const enum wb_dtype all[] = {WB_DTYPE_BF16, WB_DTYPE_FP16, WB_DTYPE_FP32};
    for (size_t a = 0; a < 3; a++)
        for (size_t b = 0; b < 3; b++)
            for (int shift = 0; shift < 2; shift++) {
                enum wb_dtype from = all[a], to = all[b];
                size_t sb = wb_dtype_size(from), db = wb_dtype_size(to);
                const void *src = from == WB_DTYPE_FP32 ? (const void *)f : (const void *)h;
                uint64_t n = N - (uint64_t)shift;
                char *ds = to_dev(NULL, N * sb), *dd = to_dev(NULL, N * db);
                CHECK_INT(wb_quant_gpu_copy(ds + shift * sb, src, n * sb, NULL), 0);
                CHECK_INT(wb_quant_cast(&HOST, from, src, to, out, n), 0);
                CHECK_INT(wb_quant_cast(&DEV, from, ds + shift * sb, to, dd, n), 0);
                from_dev(outd, dd, n * db);
                if (memcmp(out, outd, n * db) != 0)
                    wb_test_fail(__FILE__, __LINE__, "cast %s -> %s (shift %d): GPU != CPU",
                                 wb_dtype_name(from), wb_dtype_name(to), shift);
                wb_quant_gpu_free(ds);
                wb_quant_gpu_free(dd);
            }
    free(h);
    free(f);
    free(out);
    free(outd);
}

/* The GPU's e4m3 conversion (cvt.rn.satfinite.e4m3x2.f32) against the CPU encoder over a sweep
 * of FP32 patterns (scripts/gpu/quant_check.sh runs all 2^32). */
static void test_gpu_encoder_sweep(void)
{
    need_gpu();
    enum { N = 1 << 22 };
    uint32_t *u = malloc(N * 4);
    uint8_t *qd = malloc(N);
    CHECK(u && qd);
    for (uint64_t i = 0; i < N; i++)
        u[i] = (uint32_t)(i * 1021);
    struct wb_quant_tile t = {WB_DTYPE_FP32, N / 1024, 1024, 0, 0};
    float amax[(N / 1024 / 128) * 8];
    for (size_t i = 0; i < WB_ARRAY_LEN(amax); i++)
        amax[i] = 448.0f;
    void *du = to_dev(u, N * 4), *dq = to_dev(NULL, N), *da = to_dev(amax, sizeof(amax));
    CHECK_INT(wb_quant_fp8_apply(&DEV, &t, du, 0, t.rows, da, dq, NULL), 0);
    from_dev(qd, dq, N);
    for (uint64_t i = 0; i < N; i++) {
        float x;
        memcpy(&x, &u[i], 4);
        if (qd[i] != wb_quant_fp8_encode(x))
            wb_test_fail(__FILE__, __LINE__, "GPU encode(%a) == 0x%02x, CPU 0x%02x", x, qd[i],
                         wb_quant_fp8_encode(x));
    }
    wb_quant_gpu_free(du);
    wb_quant_gpu_free(dq);
    wb_quant_gpu_free(da);
    free(u);
    free(qd);
}

static void test_gpu_auto(void)
{
    need_gpu();
    uint16_t x[256];
    for (int i = 0; i < 256; i++)
        x[i] = (uint16_t)(0x3f00 + i);
    uint8_t q[256], qd[256];
    float s, sd;
    CHECK_INT(wb_quant_fp8_block(&HOST, WB_DTYPE_BF16, x, 16, 16, q, &s), 0);
    void *dx = to_dev(x, sizeof(x)), *dq = to_dev(NULL, 256), *ds = to_dev(NULL, 4);
    CHECK_INT(wb_quant_fp8_block(NULL, WB_DTYPE_BF16, dx, 16, 16, dq, ds), 0); /* AUTO */
    from_dev(qd, dq, 256);
    from_dev(&sd, ds, 4);
    CHECK_MEM(qd, q, 256);
    CHECK_MEM(&sd, &s, 4);
    CHECK_INT(wb_quant_fp8_block(NULL, WB_DTYPE_BF16, dx, 16, 16, q, ds), -EINVAL); /* mixed */
    wb_quant_gpu_free(dx);
    wb_quant_gpu_free(dq);
    wb_quant_gpu_free(ds);
}

/* Batches: strided tiles of a source arena (every dtype; 16-byte and element-wise classes;
 * block origins inside blocks; rows ending mid-block) and 2-D copies, run by the batch kernels
 * and by the host path into arenas filled with the same pattern: every byte of the arenas,
 * written or not, equal. */
static void test_gpu_batch(void)
{
    need_gpu();
    enum { SR = 1200, SC = 1040, QA = 4 << 20, SA = 64 << 10, CA = 1 << 20 };
    static const struct {
        int dt;
        uint64_t r, c, row0, col0, src_ld, q_ld, scale_ld, at_r, at_c, q_at, s_at;
    } T[] = {
        {0, 768, 1024, 0, 0, SC, 1024, 8, 0, 0, 0, 0},                /* whole blocks */
        {0, 300, 256, 128, 0, SC, 256, 2, 100, 512, 1 << 20, 4096},   /* ragged rows */
        {0, 129, 130, 0, 0, SC, 144, 2, 7, 3, 1572864, 8192},         /* element-wise */
        {0, 256, 512, 256, 512, SC, 1024, 16, 5, 16, 2 << 20, 12288}, /* strided dst */
        {1, 200, 160, 64, 48, SC, 160, 3, 900, 800, 3 << 20, 20000},  /* fp16, mid-block */
        {2, 140, 272, 0, 16, SC, 272, 4, 400, 0, 3407872, 24000},     /* fp32 */
    };
    const enum wb_dtype dts[3] = {WB_DTYPE_BF16, WB_DTYPE_FP16, WB_DTYPE_FP32};
    void *src[3], *dsrc[3];
    for (int d = 0; d < 3; d++) {
        src[d] = random_tensor(dts[d], SR, SC, 11 + d, true);
        dsrc[d] = to_dev(src[d], (size_t)SR * SC * wb_dtype_size(dts[d]));
    }
    uint8_t *hq = malloc(QA), *hs = malloc(SA), *hc = malloc(CA), *got = malloc(QA);
    CHECK(hq && hs && hc && got);
    memset(hq, 0x5a, QA);
    memset(hs, 0x5a, SA);
    memset(hc, 0x5a, CA);
    uint8_t *dq = to_dev(hq, QA), *ds = to_dev(hs, SA), *dc = to_dev(hc, CA);
    struct wb_quant_item hi[WB_ARRAY_LEN(T)], di[WB_ARRAY_LEN(T)];
    for (size_t i = 0; i < WB_ARRAY_LEN(T); i++) {
        enum wb_dtype dt = dts[T[i].dt];
        size_t off = (T[i].at_r * SC + T[i].at_c) * wb_dtype_size(dt);
        hi[i] = (struct wb_quant_item){dt,
                                       (uint8_t *)src[T[i].dt] + off,
                                       T[i].src_ld,
                                       hq + T[i].q_at,
                                       T[i].q_ld,
                                       (float *)(hs + T[i].s_at),
                                       T[i].scale_ld,
                                       T[i].r,
                                       T[i].c,
                                       T[i].row0,
                                       T[i].col0};
        di[i] = hi[i];
        di[i].src = (uint8_t *)dsrc[T[i].dt] + off;
        di[i].q = dq + T[i].q_at;
        di[i].scale = (float *)(ds + T[i].s_at);
    }
    /* copies: one contiguous, one 2-D aligned, one 2-D odd; the last reads quantized bytes */
    struct wb_copy_item hcp[3] = {{hq, hc, 1, 300000, 300000, 300000},
                                  {hq + (1 << 20), hc + 400000, 64, 512, 1024, 768},
                                  {hq + 3, hc + 500001, 33, 77, 101, 99}};
    struct wb_copy_item dcp[3];
    for (int i = 0; i < 3; i++) {
        dcp[i] = hcp[i];
        dcp[i].src = dq + ((const uint8_t *)hcp[i].src - hq);
        dcp[i].dst = dc + ((uint8_t *)hcp[i].dst - hc);
    }
    struct wb_quant_batch *hb, *db;
    CHECK_INT(wb_quant_batch_create(&HOST, hi, WB_ARRAY_LEN(T), hcp, 3, &hb), 0);
    CHECK_INT(wb_quant_batch_create(&DEV, di, WB_ARRAY_LEN(T), dcp, 3, &db), 0);
    CHECK_INT(wb_quant_batch_run(hb, NULL), 0);
    for (int rep = 0; rep < 2; rep++) /* a batch runs again with the same result */
        CHECK_INT(wb_quant_batch_run(db, NULL), 0);
    from_dev(got, dq, QA);
    CHECK_MEM(got, hq, QA);
    from_dev(got, ds, SA);
    CHECK_MEM(got, hs, SA);
    from_dev(got, dc, CA);
    CHECK_MEM(got, hc, CA);
    /* and the whole-block tile equals the one-tile kernel's output */
    uint8_t *q1 = malloc(768 * 1024);
    float s1[6 * 8];
    uint16_t *packed = malloc(768 * 1024 * 2);
    for (int r = 0; r < 768; r++)
        memcpy(packed + r * 1024, (uint16_t *)src[0] + (size_t)r * SC, 1024 * 2);
    CHECK_INT(wb_quant_fp8_block(&HOST, WB_DTYPE_BF16, packed, 768, 1024, q1, s1), 0);
    CHECK_MEM(hq, q1, 768 * 1024);
    CHECK_MEM(hs, s1, sizeof(s1));
    wb_quant_batch_free(hb);
    wb_quant_batch_free(db);
    free(q1);
    free(packed);
    for (int d = 0; d < 3; d++) {
        free(src[d]);
        wb_quant_gpu_free(dsrc[d]);
    }
    wb_quant_gpu_free(dq);
    wb_quant_gpu_free(ds);
    wb_quant_gpu_free(dc);
    free(hq);
    free(hs);
    free(hc);
    free(got);
}

/* Changed-only stores on the device (wb_quant_batch_run_delta) against the host path, which
 * quant_test's batch_delta checks independently: tiles of every class (16-byte BF16, an
 * element-wise tile whose origin is inside a block, FP32) and copies (16-byte, odd) with shadows,
 * seeded by a full run, then a delta run after a small change of the sources, then one after
 * none: destinations, shadows and the bytes stored equal the host's at each step. */
static void test_gpu_batch_delta(void)
{
    need_gpu();
    enum { SR = 600, SC = 640, QA = 1 << 20, SA = 4096, CA = 1 << 18, HA = 1 << 20 };
    const enum wb_dtype dts[2] = {WB_DTYPE_BF16, WB_DTYPE_FP32};
    void *src[2], *dsrc[2];
    for (int d = 0; d < 2; d++)
        src[d] = random_tensor(dts[d], SR, SC, 21 + d, false);
    uint8_t *hq = calloc(1, QA), *hs = calloc(1, SA), *hc = calloc(1, CA), *hh = calloc(1, HA);
    uint8_t *got = malloc(QA);
    CHECK(hq && hs && hc && hh && got);
    uint8_t *dq = to_dev(hq, QA), *ds = to_dev(hs, SA), *dc = to_dev(hc, CA), *dh = to_dev(hh, HA);
    /* {dtype, rows, cols, row0, col0, q at, scales at, shadow at, shadow scales at} */
    static const struct {
        int dt;
        uint64_t r, c, row0, col0, q_at, s_at, h_at, hs_at;
    } T[] = {
        {0, 256, 512, 0, 0, 0, 0, 0, 900000},               /* 16-byte class */
        {0, 130, 200, 50, 70, 200000, 256, 200000, 900400}, /* element-wise, mid-block */
        {1, 140, 272, 0, 16, 300000, 512, 300000, 900800},  /* fp32 */
    };
    struct wb_quant_item hi[3], di[3];
    for (int i = 0; i < 3; i++) {
        enum wb_dtype dt = dts[T[i].dt];
        uint64_t gc = wb_quant_blocks(T[i].col0 % WB_FP8_BLOCK + T[i].c);
        hi[i] = (struct wb_quant_item){dt,
                                       src[T[i].dt],
                                       SC,
                                       hq + T[i].q_at,
                                       T[i].c,
                                       (float *)(hs + T[i].s_at),
                                       gc,
                                       T[i].r,
                                       T[i].c,
                                       T[i].row0,
                                       T[i].col0,
                                       hh + T[i].h_at,
                                       (float *)(hh + T[i].hs_at)};
        di[i] = hi[i];
        di[i].q = dq + T[i].q_at;
        di[i].scale = (float *)(ds + T[i].s_at);
        di[i].shadow = dh + T[i].h_at;
        di[i].shadow_scale = (float *)(dh + T[i].hs_at);
    }
    struct wb_copy_item hcp[2] = {{hq, hc, 1, 65536, 65536, 65536, hh + 500000},
                                  {hq + 3, hc + 70001, 33, 77, 101, 99, hh + 600000}};
    struct wb_copy_item dcp[2];
    for (int i = 0; i < 2; i++) {
        dcp[i] = hcp[i];
        dcp[i].src = dq + ((const uint8_t *)hcp[i].src - hq);
        dcp[i].dst = dc + ((uint8_t *)hcp[i].dst - hc);
        dcp[i].shadow = dh + ((uint8_t *)hcp[i].shadow - hh);
    }
    uint64_t *dn = NULL;
    CHECK_INT(wb_quant_gpu_alloc(sizeof(uint64_t), (void **)&dn), 0);
    struct wb_quant_batch *hb, *db;
    CHECK_INT(wb_quant_batch_create(&HOST, hi, 3, hcp, 2, &hb), 0);
    CHECK_INT(wb_quant_batch_create(&DEV, di, 3, dcp, 2, &db), 0);
    uint64_t seed = 77;
    for (int step = 0; step < 3; step++) {
        if (step == 1) /* a small step: 2000 elements move by 1/8 of their exponent's step */
            for (int k = 0; k < 2000; k++) {
                uint64_t e = rng_next(&seed) % ((uint64_t)SR * SC);
                if (k % 2)
                    ((uint32_t *)src[1])[e] ^= 1u << 20;
                else
                    ((uint16_t *)src[0])[e] ^= 1u << 4;
            }
        for (int d = 0; d < 2; d++) {
            if (step < 2) {
                if (step)
                    wb_quant_gpu_free(dsrc[d]);
                dsrc[d] = to_dev(src[d], (size_t)SR * SC * wb_dtype_size(dts[d]));
            }
        }
        if (step < 2) { /* the device items read the new copies */
            wb_quant_batch_free(db);
            for (int i = 0; i < 3; i++)
                di[i].src = dsrc[T[i].dt];
            CHECK_INT(wb_quant_batch_create(&DEV, di, 3, dcp, 2, &db), 0);
        }
        uint64_t hn = 0, zero = 0, dnh = 0;
        CHECK_INT(wb_quant_gpu_copy(dn, &zero, sizeof(zero), NULL), 0);
        CHECK_INT(wb_quant_batch_run_delta(hb, NULL, step > 0, &hn), 0);
        CHECK_INT(wb_quant_batch_run_delta(db, NULL, step > 0, dn), 0);
        CHECK_INT(wb_quant_gpu_sync(NULL), 0);
        CHECK_INT(wb_quant_gpu_copy(&dnh, dn, sizeof(dnh), NULL), 0);
        CHECK_INT(wb_quant_gpu_sync(NULL), 0);
        CHECK_INT(dnh, hn);
        if (step == 2)
            CHECK_INT(hn, 0);
        if (step == 1)
            CHECK(hn > 0);
        from_dev(got, dq, QA);
        CHECK_MEM(got, hq, QA);
        from_dev(got, ds, SA);
        CHECK_MEM(got, hs, SA);
        from_dev(got, dc, CA);
        CHECK_MEM(got, hc, CA);
        from_dev(got, dh, HA);
        CHECK_MEM(got, hh, HA);
    }
    wb_quant_batch_free(hb);
    wb_quant_batch_free(db);
    for (int d = 0; d < 2; d++) {
        free(src[d]);
        wb_quant_gpu_free(dsrc[d]);
    }
    wb_quant_gpu_free(dn);
    wb_quant_gpu_free(dq);
    wb_quant_gpu_free(ds);
    wb_quant_gpu_free(dc);
    wb_quant_gpu_free(dh);
    free(hq);
    free(hs);
    free(hc);
    free(hh);
    free(got);
}

const struct wb_test wb_tests[] = {
    {"gpu_batch", test_gpu_batch, 0},
    {"gpu_batch_delta", test_gpu_batch_delta, 0},
    {"gpu_block", test_gpu_block, 120},
    {"gpu_split", test_gpu_split, 0},
    {"gpu_pack", test_gpu_pack, 0},
    {"gpu_cast", test_gpu_cast, 0},
    {"gpu_encoder_sweep", test_gpu_encoder_sweep, 0},
    {"gpu_auto", test_gpu_auto, 0},
    {0},
};
