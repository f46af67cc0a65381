/* quant_test.c — the CPU reference of FP8 block quantization (quant/quant.h), checked against
 * NVIDIA's host conversion (__nv_cvt_float_to_fp8 with __NV_SATFINITE, __NV_E4M3, built in CUDA
 * builds) and against a plain, element-at-a-time re-statement of the PyTorch reference written
 * here: encoder specials and all BF16 patterns, block scales on ragged shapes, the 1e-4 clamp,
 * NaN/inf blocks, partial amax + apply == one-shot on every row split, and the argument errors.
 */
#include "quant/quant.h"
#include "quant/quant_int.h" /* qt_nvref_e4m3 */
#include "tests/wbtest.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static const struct wb_quant_exec HOST = {WB_QUANT_HOST, NULL};

static uint32_t bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float fbits(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint64_t rng_next(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* NVIDIA's conversion when this build has it; the test using it skips otherwise. */
static bool have_nvref(void)
{
    uint8_t q;
    return qt_nvref_e4m3(1.0f, &q) == 0;
}

static uint8_t nvref(float x)
{
    uint8_t q = 0;
    if (qt_nvref_e4m3(x, &q) != 0)
        wb_test_fail(__FILE__, __LINE__, "NVIDIA reference conversion unavailable");
    return q;
}

/* The encoder the independent reference below uses: NVIDIA's where built, else ours (which
 * encoder_specials pins down with exact values in every build). */
static uint8_t ref_encode(float x)
{
    uint8_t q;
    return qt_nvref_e4m3(x, &q) == 0 ? q : wb_quant_fp8_encode(x);
}

/* Element i of a bf16/fp16/fp32 buffer as float, decoded here independently of quant/. */
static float ref_load(enum wb_dtype dt, const void *p, size_t i)
{
    if (dt == WB_DTYPE_FP32)
        return ((const float *)p)[i];
    uint16_t h = ((const uint16_t *)p)[i];
    if (dt == WB_DTYPE_BF16)
        return fbits((uint32_t)h << 16);
    int e = (h >> 10) & 0x1f, m = h & 0x3ff;
    float v = e == 0    ? ldexpf((float)m, -24)
              : e == 31 ? (m ? NAN : INFINITY)
                        : ldexpf((float)(1024 + m), e - 25);
    return h & 0x8000 ? -v : v;
}

/* The PyTorch reference, one element at a time: amax = max |x| (NaN wins) clamped to 1e-4,
 * s = (1 / amax) * 448, q = e4m3(x * s), scale_inv = amax * (1 / 448). */
static void ref_block(enum wb_dtype dt, const void *src, uint64_t rows, uint64_t cols, uint8_t *q,
                      float *scale_inv)
{
    uint64_t nbc = wb_quant_blocks(cols);
    for (uint64_t br = 0; br < wb_quant_blocks(rows); br++)
        for (uint64_t bc = 0; bc < nbc; bc++) {
            uint64_t r1 = br * 128 + 128 < rows ? br * 128 + 128 : rows;
            uint64_t c1 = bc * 128 + 128 < cols ? bc * 128 + 128 : cols;
            float amax = 0;
            bool nan = false;
            for (uint64_t r = br * 128; r < r1; r++)
                for (uint64_t c = bc * 128; c < c1; c++) {
                    float a = fabsf(ref_load(dt, src, r * cols + c));
                    if (isnan(a))
                        nan = true;
                    else if (a > amax)
                        amax = a;
                }
            if (nan)
                amax = fbits(0x7fffffff);
            else if (amax < 1e-4f)
                amax = 1e-4f;
            float s = (1.0f / amax) * 448.0f;
            for (uint64_t r = br * 128; r < r1; r++)
                for (uint64_t c = bc * 128; c < c1; c++)
                    q[r * cols + c] = ref_encode(ref_load(dt, src, r * cols + c) * s);
            scale_inv[br * nbc + bc] = amax * (1.0f / 448.0f);
        }
}

/* Random values whose magnitude changes from block to block (some blocks entirely below the
 * 1e-4 clamp), so that scales differ and every encoding region is used. */
static void *random_tensor(enum wb_dtype dt, uint64_t rows, uint64_t cols, uint64_t seed)
{
    size_t es = wb_dtype_size(dt);
    char *p = malloc(rows * cols * es + 1);
    CHECK(p);
    for (uint64_t r = 0; r < rows; r++)
        for (uint64_t c = 0; c < cols; c++) {
            uint64_t blk = (r / 128) * 7 + (c / 128) * 3;
            int e = (int)(blk % 13) * 3 - 24; /* 2^-24 .. 2^12 */
            float v = ldexpf((float)((rng_next(&seed) >> 40) & 0xffffff) / 16777216.0f, e);
            if (rng_next(&seed) & 1)
                v = -v;
            size_t i = r * cols + c;
            if (dt == WB_DTYPE_FP32)
                memcpy(p + i * 4, &v, 4);
            else {
                uint16_t h = dt == WB_DTYPE_BF16 ? (uint16_t)(bits(v) >> 16)
                                                 : (uint16_t)(rng_next(&seed) & 0x7bff);
                memcpy(p + i * 2, &h, 2);
            }
        }
    return p;
}

static const enum wb_dtype DTYPES[] = {WB_DTYPE_BF16, WB_DTYPE_FP16, WB_DTYPE_FP32};

/* ---------------------------------------------------------------- the encoder */

static void test_encoder_specials(void)
{
    static const struct {
        float x;
        uint8_t q;
    } cases[] = {
        {0.0f, 0x00},          {-0.0f, 0x80},
        {1.0f, 0x38},          {-1.0f, 0xb8},
        {448.0f, 0x7e},        {-448.0f, 0xfe},
        {447.0f, 0x7e},        {432.0f, 0x7e}, /* tie 416|448 -> even 448 */
        {431.9f, 0x7d},        {416.0f, 0x7d},
        {464.0f, 0x7e}, /* past 448: saturate */
        {464.1f, 0x7e},        {480.0f, 0x7e},
        {1e30f, 0x7e},         {-1e30f, 0xfe},
        {INFINITY, 0x7e},      {-INFINITY, 0xfe},
        {0x1p-6f, 0x08},       /* smallest normal */ {0x1.ep-7f, 0x08},
        {0x1p-9f, 0x01},       /* smallest subnormal */ {0x1p-10f, 0x00}, /* tie -> even 0 */
        {0x1.0001p-10f, 0x01}, {0x1.8p-9f, 0x02},                         /* tie 1|2 -> 2 */
        {0x1.4p-8f, 0x02},     /* 2.5 * 2^-9: tie 2|3 -> 2 */ {0x1.cp-7f, 0x07},
        {0x1p-149f, 0x00},     /* FP32 denormal */ {-0x1p-149f, 0x80},
        {0x1.2p0f, 0x39},      /* 1.125 */ {0x1.1p0f, 0x38}, /* 1.0625: tie -> even 1.0 */
        {0x1.3p0f, 0x3a},      /* 1.1875: tie -> even 1.25 */ {240.0f, 0x77},
    };
    for (size_t i = 0; i < WB_ARRAY_LEN(cases); i++) {
        if (wb_quant_fp8_encode(cases[i].x) != cases[i].q)
            wb_test_fail(__FILE__, __LINE__, "encode(%a) == 0x%02x, expected 0x%02x", cases[i].x,
                         wb_quant_fp8_encode(cases[i].x), cases[i].q);
        if (have_nvref())
            CHECK_INT(nvref(cases[i].x), cases[i].q);
    }
    /* every NaN, whatever its sign or payload, is 0x7f */
    static const uint32_t nans[] = {0x7fc00000, 0xffc00000, 0x7f800001, 0xff800001, 0x7fffffff};
    for (size_t i = 0; i < WB_ARRAY_LEN(nans); i++) {
        CHECK_INT(wb_quant_fp8_encode(fbits(nans[i])), 0x7f);
        if (have_nvref())
            CHECK_INT(nvref(fbits(nans[i])), 0x7f);
    }
    /* decode is exact and encode(decode(q)) == q for every non-NaN byte */
    for (unsigned q = 0; q < 256; q++) {
        float f = wb_quant_fp8_decode((uint8_t)q);
        if ((q & 0x7f) == 0x7f) {
            CHECK(isnan(f));
            continue;
        }
        CHECK_INT(wb_quant_fp8_encode(f), q);
    }
    CHECK(wb_quant_fp8_decode(0x7e) == 448.0f);
    CHECK(wb_quant_fp8_decode(0x01) == 0x1p-9f);
    CHECK(wb_quant_fp8_decode(0xb8) == -1.0f);
}

/* Every BF16 pattern, moved by powers of two (exact) through every exponent from well below the
 * smallest subnormal to well past 448, through the scalar encoder and the 4-lane one (an FP32
 * apply with amax 448, i.e. s == 1), against NVIDIA's conversion. */
static void test_encoder_bf16_all(void)
{
    if (!have_nvref())
        wb_test_skip("NVIDIA's host conversion needs a CUDA build (cuda_fp8.h)");
    CHECK(bits((1.0f / 448.0f) * 448.0f) == bits(1.0f)); /* so amax 448 gives s == 1 */
    enum { SHIFTS = 26, N = 65536 * SHIFTS };
    float *y = malloc(N * sizeof(float));
    uint8_t *q = malloc(N);
    float *amax = malloc((N / 128 / 128 + 1) * sizeof(float));
    CHECK(y && q && amax);
    size_t n = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = fbits(h << 16);
        int e;
        frexpf(f, &e);
        for (int k = 0; k < SHIFTS; k++) /* target exponents -14 .. 11 */
            y[n++] = isfinite(f) && f != 0 ? ldexpf(f, k - 14 - e) : f;
    }
    for (size_t i = 0; i < n; i++) {
        uint8_t want = nvref(y[i]);
        if (wb_quant_fp8_encode(y[i]) != want)
            wb_test_fail(__FILE__, __LINE__, "encode(%a) == 0x%02x, NVIDIA 0x%02x", y[i],
                         wb_quant_fp8_encode(y[i]), want);
    }
    struct wb_quant_tile t = {WB_DTYPE_FP32, n / 128, 128, 0, 0};
    for (size_t i = 0; i < n / 128 / 128 + 1; i++)
        amax[i] = 448.0f;
    CHECK_INT(wb_quant_fp8_apply(&HOST, &t, y, 0, t.rows, amax, q, NULL), 0);
    for (size_t i = 0; i < n; i++)
        if (q[i] != nvref(y[i]))
            wb_test_fail(__FILE__, __LINE__, "vector encode(%a) == 0x%02x, NVIDIA 0x%02x", y[i],
                         q[i], nvref(y[i]));
    free(y);
    free(q);
    free(amax);
}

/* A sweep over the whole FP32 range (every 4099th pattern plus the neighbours of each e4m3
 * rounding boundary) through both encoders; against NVIDIA where built, else scalar == vector. */
static void test_encoder_fp32_sweep(void)
{
    size_t cap = (1ull << 32) / 4099 + 256 * 8 + 16;
    float *y = malloc(cap * sizeof(float));
    uint8_t *q = malloc(cap);
    CHECK(y && q);
    size_t n = 0;
    for (uint64_t u = 0; u < (1ull << 32); u += 4099)
        y[n++] = fbits((uint32_t)u);
    for (unsigned b = 0; b < 126; b++) { /* midpoints between neighbouring e4m3 values */
        float mid = (wb_quant_fp8_decode((uint8_t)b) + wb_quant_fp8_decode((uint8_t)(b + 1))) / 2;
        for (int d = -1; d <= 1; d++) {
            y[n++] = fbits(bits(mid) + d);
            y[n++] = -fbits(bits(mid) + d);
        }
    }
    float amax[1] = {448.0f};
    struct wb_quant_tile t = {WB_DTYPE_FP32, 1, 0, 0, 0};
    for (size_t off = 0; off < n; off += 128) { /* one row of up to 128 per call */
        t.cols = n - off < 128 ? n - off : 128;
        CHECK_INT(wb_quant_fp8_apply(&HOST, &t, y + off, 0, 1, amax, q + off, NULL), 0);
    }
    bool nv = have_nvref();
    for (size_t i = 0; i < n; i++) {
        uint8_t want = nv ? nvref(y[i]) : wb_quant_fp8_encode(y[i]);
        if (q[i] != want || wb_quant_fp8_encode(y[i]) != want)
            wb_test_fail(__FILE__, __LINE__, "encode(%a): vector 0x%02x scalar 0x%02x want 0x%02x",
                         y[i], q[i], wb_quant_fp8_encode(y[i]), want);
    }
    free(y);
    free(q);
}

/* ---------------------------------------------------------------- block quantization */

/* All BF16 patterns of one sign and exponent (128 mantissas) in a block whose amax an anchor
 * element sets to max|x| * 2^j: the scale moves the row through every e4m3 region. */
static void test_block_bf16_patterns(void)
{
    uint16_t x[2 * 128];
    uint8_t q[2 * 128], want[2 * 128];
    float si, want_si;
    for (uint32_t se = 0; se < 512; se++) {
        if ((se & 0xff) == 0xff)
            continue; /* inf/NaN rows: test_block_specials */
        for (int j = 0; j < 25; j++) {
            float top = 0;
            for (uint32_t m = 0; m < 128; m++) {
                x[m] = (uint16_t)((se << 7) | m);
                float a = fabsf(fbits((uint32_t)x[m] << 16));
                top = a > top ? a : top;
            }
            float anchor = ldexpf(top, j);
            if (!isfinite(anchor))
                continue;
            memset(x + 128, 0, 128 * 2);
            x[128 + 5] = (uint16_t)(bits(anchor) >> 16);
            CHECK_INT(wb_quant_fp8_block(&HOST, WB_DTYPE_BF16, x, 2, 128, q, &si), 0);
            ref_block(WB_DTYPE_BF16, x, 2, 128, want, &want_si);
            CHECK_MEM(q, want, sizeof(q));
            CHECK_U64(bits(si), bits(want_si));
        }
    }
}

static void test_block_ragged(void)
{
    static const uint64_t shapes[][2] = {{1, 1},     {7, 5},     {128, 128}, {129, 130},
                                         {300, 257}, {256, 384}, {17, 1000}, {1, 4099},
                                         {260, 16},  {127, 129}};
    for (size_t d = 0; d < WB_ARRAY_LEN(DTYPES); d++)
        for (size_t i = 0; i < WB_ARRAY_LEN(shapes); i++) {
            uint64_t rows = shapes[i][0], cols = shapes[i][1];
            uint64_t ns = wb_quant_blocks(rows) * wb_quant_blocks(cols);
            void *x = random_tensor(DTYPES[d], rows, cols, 99 + i);
            uint8_t *q = malloc(rows * cols), *qr = malloc(rows * cols);
            float *s = malloc(ns * 4), *sr = malloc(ns * 4);
            CHECK(q && qr && s && sr);
            CHECK_INT(wb_quant_fp8_block(&HOST, DTYPES[d], x, rows, cols, q, s), 0);
            ref_block(DTYPES[d], x, rows, cols, qr, sr);
            for (uint64_t k = 0; k < rows * cols; k++)
                if (q[k] != qr[k])
                    wb_test_fail(__FILE__, __LINE__,
                                 "%s [%llu,%llu] element (%llu,%llu): 0x%02x, "
                                 "reference 0x%02x",
                                 wb_dtype_name(DTYPES[d]), (unsigned long long)rows,
                                 (unsigned long long)cols, (unsigned long long)(k / cols),
                                 (unsigned long long)(k % cols), q[k], qr[k]);
            CHECK_MEM(s, sr, ns * 4);
            free(x);
            free(q);
            free(qr);
            free(s);
            free(sr);
        }
}

/* The exact scale values of a few blocks, and the 1e-4 clamp. */
static void test_block_scales_exact(void)
{
    float x[4] = {0};
    uint8_t q[4];
    float s;
    /* all zeros: amax clamps to 1e-4f, every q is 0 */
    CHECK_INT(wb_quant_fp8_block(&HOST, WB_DTYPE_FP32, x, 2, 2, q, &s), 0);
    CHECK_U64(bits(s), bits(1e-4f * (1.0f / 448.0f)));
    CHECK_INT(q[0] | q[1] | q[2] | q[3], 0);
    /* below the clamp: 5e-5 * (1/1e-4f * 448) is about 224 */
    x[1] = 5e-5f;
    CHECK_INT(wb_quant_fp8_block(&HOST, WB_DTYPE_FP32, x, 2, 2, q, &s), 0);
    CHECK_U64(bits(s), bits(1e-4f * (1.0f / 448.0f)));
    CHECK_INT(q[1], 0x76); /* 224 */
    /* exactly the clamp, then just above it */
    x[1] = 1e-4f;
    CHECK_INT(wb_quant_fp8_block(&HOST, WB_DTYPE_FP32, x, 2, 2, q, &s), 0);
    CHECK_U64(bits(s), 0x346facad); /* 1e-4f * fl(1/448) */
    CHECK_INT(q[1], 0x7e);
    x[1] = fbits(bits(1e-4f) + 1);
    CHECK_INT(wb_quant_fp8_block(&HOST, WB_DTYPE_FP32, x, 2, 2, q, &s), 0);
    CHECK_U64(bits(s), bits(x[1] * (1.0f / 448.0f)));
    /* amax 448: s == 1, scale_inv is fl(448 * fl(1/448)) == 1 */
    x[1] = -448.0f;
    x[2] = 3.0f;
    CHECK_INT(wb_quant_fp8_block(&HOST, WB_DTYPE_FP32, x, 2, 2, q, &s), 0);
    CHECK_U64(bits(s), bits(1.0f));
    CHECK_INT(q[1], 0xfe);
    CHECK_INT(q[2], 0x44);
    /* scale_inv is amax * fl(1/448), not amax / 448: 3.0 is a value where the two differ */
    CHECK_U64(bits(3.0f / 448.0f), 0x3bdb6db7);
    CHECK_U64(bits(wb_quant_fp8_scale_inv(3.0f)), 0x3bdb6db8);
    CHECK_U64(bits(wb_quant_fp8_scale_inv(0.0f)), bits(1e-4f * (1.0f / 448.0f)));
    CHECK(isnan(wb_quant_fp8_scale_inv(NAN)));
}

/* NaN and infinities inside blocks behave as the reference: a NaN makes the whole block NaN,
 * an infinity zeroes the finite values. */
static void test_block_specials(void)
{
    enum { R = 130, C = 140 };
    float *x = random_tensor(WB_DTYPE_FP32, R, C, 5);
    x[3 * C + 4] = NAN;                   /* block (0,0) */
    x[10 * C + 130] = -INFINITY;          /* block (0,1) */
    x[129 * C + 7] = fbits(0xffc00001);   /* block (1,0): a negative NaN */
    x[129 * C + 131] = fbits(0x00000003); /* block (1,1): FP32 denormals only */
    for (int c = 128; c < C; c++)
        x[128 * C + c] = x[129 * C + c] = fbits(0x00000003);
    x[129 * C + 131] = -fbits(0x00400000);
    uint8_t q[R * C], qr[R * C];
    float s[4], sr[4];
    CHECK_INT(wb_quant_fp8_block(&HOST, WB_DTYPE_FP32, x, R, C, q, s), 0);
    ref_block(WB_DTYPE_FP32, x, R, C, qr, sr);
    CHECK_MEM(q, qr, sizeof(q));
    CHECK_MEM(s, sr, sizeof(s));
    CHECK_U64(bits(s[0]), 0x7fffffff);
    CHECK_INT(q[0], 0x7f);
    CHECK_INT(q[127 * C + 127], 0x7f);
    CHECK_U64(bits(s[1]), 0x7f800000);
    CHECK_INT(q[10 * C + 130], 0x7f);
    CHECK_INT(q[0 * C + 128], x[128] < 0 ? 0x80 : 0x00);
    CHECK_U64(bits(s[2]), 0x7fffffff);
    CHECK_U64(bits(s[3]), bits(1e-4f * (1.0f / 448.0f)));
    free(x);
}

/* ---------------------------------------------------------------- split == one-shot */

/* Quantizes a rows x cols tensor held by owners whose tiles are the cells of the given row and
 * column cut points, exchanging partial amax through a global grid, and compares with the
 * one-shot result. Each owner also works on its rows in two calls (split at rsplit). */
static void split_check(enum wb_dtype dt, const void *x, uint64_t rows, uint64_t cols,
                        const uint64_t *rcut, size_t nr, const uint64_t *ccut, size_t nc,
                        const uint8_t *q1, const float *s1)
{
    size_t es = wb_dtype_size(dt);
    uint64_t nbr = wb_quant_blocks(rows), nbc = wb_quant_blocks(cols);
    float *amax = malloc(nbr * nbc * 4), *part = malloc(nbr * nbc * 4), *si = malloc(nbr * nbc * 4);
    uint8_t *q = malloc(rows * cols);
    char *tile = malloc(rows * cols * es + 1);
    uint8_t *tq = malloc(rows * cols + 1);
    CHECK(amax && part && si && q && tile && tq);
    for (uint64_t i = 0; i < nbr * nbc; i++)
        amax[i] = 0;
    for (int phase = 0; phase < 2; phase++)
        for (size_t a = 0; a + 1 < nr; a++)
            for (size_t b = 0; b + 1 < nc; b++) {
                struct wb_quant_tile t = {dt, rcut[a + 1] - rcut[a], ccut[b + 1] - ccut[b], rcut[a],
                                          ccut[b]};
                for (uint64_t r = 0; r < t.rows; r++)
                    memcpy(tile + r * t.cols * es,
                           (const char *)x + ((t.row0 + r) * cols + t.col0) * es, t.cols * es);
                uint64_t mid = t.rows / 3;
                for (int h = 0; h < 2; h++) {
                    uint64_t r0 = h ? mid : 0, r1 = h ? t.rows : mid;
                    struct wb_quant_grid g;
                    CHECK_INT(wb_quant_fp8_grid(&t, r0, r1, &g), 0);
                    if (phase == 0) {
                        CHECK_INT(wb_quant_fp8_amax(&HOST, &t, tile, r0, r1, part), 0);
                        for (uint64_t i = 0; i < g.rows; i++)
                            wb_quant_fp8_amax_merge(amax + (g.row + i) * nbc + g.col,
                                                    part + i * g.cols, g.cols);
                        continue;
                    }
                    for (uint64_t i = 0; i < g.rows; i++)
                        memcpy(part + i * g.cols, amax + (g.row + i) * nbc + g.col, g.cols * 4);
                    CHECK_INT(wb_quant_fp8_apply(&HOST, &t, tile, r0, r1, part, tq, si), 0);
                    for (uint64_t i = 0; i < g.rows * g.cols; i++)
                        CHECK_U64(bits(si[i]),
                                  bits(s1[(g.row + i / g.cols) * nbc + g.col + i % g.cols]));
                }
                if (phase == 1)
                    for (uint64_t r = 0; r < t.rows; r++)
                        memcpy(q + (t.row0 + r) * cols + t.col0, tq + r * t.cols, t.cols);
            }
    CHECK_MEM(q, q1, rows * cols);
    free(amax);
    free(part);
    free(si);
    free(q);
    free(tile);
    free(tq);
}

static void test_split_every_row(void)
{
    enum { R = 300, C = 200 };
    for (size_t d = 0; d < WB_ARRAY_LEN(DTYPES); d++) {
        void *x = random_tensor(DTYPES[d], R, C, 7 + d);
        uint8_t *q1 = malloc(R * C);
        float s1[3 * 2];
        CHECK(q1);
        CHECK_INT(wb_quant_fp8_block(&HOST, DTYPES[d], x, R, C, q1, s1), 0);
        uint64_t ccut[] = {0, C};
        for (uint64_t cut = 0; cut <= R; cut++) { /* every split into two row ranges */
            uint64_t rcut[] = {0, cut, R};
            split_check(DTYPES[d], x, R, C, rcut, 3, ccut, 2, q1, s1);
        }
        free(x);
        free(q1);
    }
}

static void test_split_grids(void)
{
    enum { R = 390, C = 300 };
    static const uint64_t rcuts[][5] = {{0, 1, 2, 3, R},
                                        {0, 127, 128, 129, R},
                                        {0, 100, 200, 256, R},
                                        {0, 64, 192, 320, R},
                                        {0, 5, 300, 389, R}};
    static const uint64_t ccuts[][4] = {
        {0, 16, 144, C}, {0, 7, 129, C}, {0, 128, 256, C}, {0, 1, 299, C}, {0, 100, 200, C}};
    for (size_t d = 0; d < WB_ARRAY_LEN(DTYPES); d++) {
        void *x = random_tensor(DTYPES[d], R, C, 11 + d);
        uint8_t *q1 = malloc(R * C);
        float s1[4 * 3];
        CHECK(q1);
        CHECK_INT(wb_quant_fp8_block(&HOST, DTYPES[d], x, R, C, q1, s1), 0);
        for (size_t i = 0; i < WB_ARRAY_LEN(rcuts); i++)
            for (size_t j = 0; j < WB_ARRAY_LEN(ccuts); j++)
                split_check(DTYPES[d], x, R, C, rcuts[i], 5, ccuts[j], 4, q1, s1);
        free(x);
        free(q1);
    }
}

static void test_grid(void)
{
    struct wb_quant_tile t = {WB_DTYPE_BF16, 100, 300, 200, 50};
    struct wb_quant_grid g = {9, 9, 9, 9};
    CHECK_INT(wb_quant_fp8_grid(&t, 0, 100, &g), 0);
    CHECK_U64(g.row, 1); /* global rows 200..299 */
    CHECK_U64(g.rows, 2);
    CHECK_U64(g.col, 0); /* global cols 50..349 */
    CHECK_U64(g.cols, 3);
    CHECK_INT(wb_quant_fp8_grid(&t, 0, 56, &g), 0); /* rows 200..255 */
    CHECK_U64(g.rows, 1);
    CHECK_INT(wb_quant_fp8_grid(&t, 56, 57, &g), 0); /* row 256 */
    CHECK_U64(g.row, 2);
    CHECK_U64(g.rows, 1);
    CHECK_INT(wb_quant_fp8_grid(&t, 7, 7, &g), 0);
    CHECK_U64(g.rows, 0);
    CHECK_U64(g.cols, 0);
    CHECK_INT(wb_quant_fp8_grid(&t, 5, 101, &g), -EINVAL);
    CHECK_INT(wb_quant_fp8_grid(&t, 6, 5, &g), -EINVAL);
    CHECK_U64(g.rows, 0); /* untouched by the failed calls */
}

static void test_amax_merge(void)
{
    float acc[5] = {1.0f, 2.0f, 0.0f, NAN, 3.0f};
    float part[5] = {2.0f, 1.0f, NAN, 1.0f, INFINITY};
    wb_quant_fp8_amax_merge(acc, part, 5);
    CHECK(acc[0] == 2.0f && acc[1] == 2.0f && acc[4] == INFINITY);
    CHECK_U64(bits(acc[2]), 0x7fffffff);
    CHECK_U64(bits(acc[3]), 0x7fffffff);
    /* partial amax of a tile holding a NaN is the canonical NaN */
    float x[6] = {1, 2, 3, -4, fbits(0xffc00000), 5};
    struct wb_quant_tile t = {WB_DTYPE_FP32, 2, 3, 0, 0};
    float a = 0;
    CHECK_INT(wb_quant_fp8_amax(&HOST, &t, x, 0, 1, &a), 0);
    CHECK(a == 3.0f);
    CHECK_INT(wb_quant_fp8_amax(&HOST, &t, x, 1, 2, &a), 0);
    CHECK_U64(bits(a), 0x7fffffff);
}

/* ---------------------------------------------------------------- errors */

static void test_errors(void)
{
    setenv("WB_LOG", "warn", 1);
    uint16_t x[4] = {0x3f80, 0x4000, 0x4040, 0x4080};
    uint8_t q[4] = {0xaa, 0xaa, 0xaa, 0xaa};
    float s = 7.0f, amax[2] = {1, 1};
    char buf[512];
    struct wb_test_stderr c;

    wb_test_stderr_begin(&c);
    CHECK_INT(wb_quant_fp8_block(&HOST, WB_DTYPE_I32, x, 2, 2, q, &s), -EINVAL);
    CHECK_STR(wb_test_stderr_end(&c, buf, sizeof(buf)),
              "wb error quant: wb_quant_fp8_block: source dtype i32 is not bf16, fp16 or fp32\n");

    struct wb_quant_tile t = {WB_DTYPE_BF16, 2, 2, 0, 0};
    wb_test_stderr_begin(&c);
    CHECK_INT(wb_quant_fp8_amax(&HOST, &t, x, 1, 3, amax), -EINVAL);
    CHECK_STR(wb_test_stderr_end(&c, buf, sizeof(buf)),
              "wb error quant: wb_quant_fp8_amax: row range [1, 3) is not inside the tile's 2 "
              "rows\n");

    wb_test_stderr_begin(&c);
    CHECK_INT(wb_quant_fp8_apply(&HOST, &t, x, 0, 2, NULL, q, NULL), -EINVAL);
    CHECK_STR(wb_test_stderr_end(&c, buf, sizeof(buf)),
              "wb error quant: wb_quant_fp8_apply: a required buffer is NULL\n");

    wb_test_stderr_begin(&c);
    CHECK_INT(wb_quant_fp8_block(&HOST, WB_DTYPE_BF16, x, 1ull << 62, 8, q, &s), -EINVAL);
    CHECK_STR(wb_test_stderr_end(&c, buf, sizeof(buf)),
              "wb error quant: wb_quant_fp8_block: tile of 4611686018427387904 x 8 elements is "
              "too large\n");

    t.row0 = UINT64_MAX;
    wb_test_stderr_begin(&c);
    CHECK_INT(wb_quant_fp8_apply(&HOST, &t, x, 0, 2, amax, q, NULL), -EINVAL);
    CHECK_STR(wb_test_stderr_end(&c, buf, sizeof(buf)),
              "wb error quant: wb_quant_fp8_apply: tile origin (18446744073709551615, 0) + "
              "extents overflow\n");
    wb_test_stderr_begin(&c);
    CHECK_INT(wb_quant_fp8_amax(&HOST, NULL, x, 0, 1, amax), -EINVAL);
    CHECK_STR(wb_test_stderr_end(&c, buf, sizeof(buf)),
              "wb error quant: wb_quant_fp8_amax: tile is NULL\n");

    wb_test_stderr_begin(&c);
    CHECK_INT(wb_quant_fp8_block(&HOST, WB_DTYPE_BF16, (const char *)x + 1, 1, 2, q, &s), -EINVAL);
    CHECK_STR(wb_test_stderr_end(&c, buf, sizeof(buf)),
              "wb error quant: wb_quant_fp8_block: src is not aligned to its 2-byte elements\n");

    /* nothing was written by any failed call */
    CHECK_INT(q[0] & q[1] & q[2] & q[3], 0xaa);
    CHECK(s == 7.0f && amax[0] == 1.0f && amax[1] == 1.0f);

    /* empty work is fine and writes nothing */
    CHECK_INT(wb_quant_fp8_block(&HOST, WB_DTYPE_BF16, x, 0, 5, q, &s), 0);
    CHECK_INT(wb_quant_fp8_block(NULL, WB_DTYPE_BF16, x, 5, 0, q, &s), 0);
    CHECK(s == 7.0f && q[0] == 0xaa);

    /* the default (AUTO) runs host memory on the CPU */
    CHECK_INT(wb_quant_fp8_block(NULL, WB_DTYPE_BF16, x, 2, 2, q, &s), 0);
    CHECK_INT(q[3], wb_quant_fp8_encode(4.0f * ((1.0f / 4.0f) * 448.0f)));

    /* device work without a usable GPU */
    if (wb_gpu_count() == 0) {
        struct wb_quant_exec dev = {WB_QUANT_DEVICE, NULL};
        q[0] = 0xaa;
        CHECK_INT(wb_quant_fp8_block(&dev, WB_DTYPE_BF16, x, 2, 2, q, &s), -WB_E_NOGPU);
        CHECK_INT(q[0], 0xaa);
        void *p = NULL;
        CHECK_INT(wb_quant_gpu_alloc(64, &p), -WB_E_NOGPU);
        CHECK(p == NULL);
    }
}

/* Batches on the host: strided tiles equal the one-tile quantization of the same values placed
 * contiguously; copies are 2-D; a bad item is refused by index with nothing run. */
static void test_batch_host(void)
{
    setenv("WB_LOG", "warn", 1);
    enum { R = 300, C = 260, LD = 300 };
    uint16_t *src = malloc(R * LD * 2), *packed = malloc(R * C * 2);
    uint8_t *q = malloc(R * 400), *want = malloc(R * C), *cpy = malloc(4096);
    float s[3 * 5], sw[3 * 3];
    CHECK(src && packed && q && want && cpy);
    uint64_t seed = 5;
    for (int i = 0; i < R * LD; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        src[i] = wb_f32_to_bf16((float)(int32_t)(seed >> 40) / (float)(1 << 20));
    }
    for (int r = 0; r < R; r++)
        memcpy(packed + r * C, src + r * LD + 7, C * 2);
    CHECK_INT(wb_quant_fp8_block(&HOST, WB_DTYPE_BF16, packed, R, C, want, sw), 0);
    memset(q, 0x5a, R * 400);
    memset(s, 0x5a, sizeof(s));
    struct wb_quant_item it = {WB_DTYPE_BF16, src + 7, LD, q, 400, s, 5, R, C, 0, 0};
    struct wb_copy_item cp = {q, cpy, 3, 100, 400, 1000};
    struct wb_quant_batch *b = NULL;
    CHECK_INT(wb_quant_batch_create(&HOST, &it, 1, &cp, 1, &b), 0);
    CHECK_INT(wb_quant_batch_run(b, NULL), 0);
    wb_quant_batch_free(b);
    for (int r = 0; r < R; r++) {
        CHECK_MEM(q + r * 400, want + r * C, C);
        CHECK_INT(q[r * 400 + C], 0x5a); /* the stride's gap untouched */
    }
    for (int i = 0; i < 3; i++)
        CHECK_MEM(s + i * 5, sw + i * 3, 3 * sizeof(float));
    for (int r = 0; r < 3; r++) /* the copy ran after the quantization */
        CHECK_MEM(cpy + r * 1000, want + r * C, 100);

    char buf[512];
    struct wb_test_stderr c;
    struct wb_quant_item bad[2] = {it, it};
    bad[1].q_ld = C - 1;
    wb_test_stderr_begin(&c);
    CHECK_INT(wb_quant_batch_create(&HOST, bad, 2, NULL, 0, &b), -EINVAL);
    CHECK_STR(wb_test_stderr_end(&c, buf, sizeof(buf)),
              "wb error quant: wb_quant_batch_create: quantization 1: a row stride is below the "
              "row length\n");
    bad[1] = it;
    bad[1].scale_ld = 2;
    wb_test_stderr_begin(&c);
    CHECK_INT(wb_quant_batch_create(&HOST, bad, 2, NULL, 0, &b), -EINVAL);
    CHECK_STR(wb_test_stderr_end(&c, buf, sizeof(buf)),
              "wb error quant: wb_quant_batch_create: quantization 1: the scale row stride is "
              "below the block columns\n");
    struct wb_copy_item cbad = {q, NULL, 1, 5, 5, 5};
    wb_test_stderr_begin(&c);
    CHECK_INT(wb_quant_batch_create(&HOST, &it, 1, &cbad, 1, &b), -EINVAL);
    CHECK_STR(wb_test_stderr_end(&c, buf, sizeof(buf)),
              "wb error quant: wb_quant_batch_create: copy 0: a buffer is NULL\n");
    free(src);
    free(packed);
    free(q);
    free(want);
    free(cpy);
}

/* The 4-byte units of a quantized tile's row that differ between a and b (quant.h's units:
 * from column 0 and from every 128-column edge of the global grid), counted independently of
 * batch.c: a unit is [c, next) with next the nearer of c + 4, the next edge and the row end. */
static uint64_t units_differing(const uint8_t *a, const uint8_t *b, uint64_t rows, uint64_t cols,
                                uint64_t col0, uint64_t *first_same)
{
    uint64_t n = 0;
    *first_same = UINT64_MAX;
    for (uint64_t r = 0; r < rows; r++) {
        uint64_t start = 0;
        for (uint64_t c = 1; c <= cols; c++) {
            if (c < cols && c - start < 4 && (col0 + c) % 128 != 0)
                continue;
            if (memcmp(a + r * cols + start, b + r * cols + start, c - start))
                n += c - start;
            else if (*first_same == UINT64_MAX)
                *first_same = r * cols + start;
            start = c;
        }
    }
    return n;
}

/* Changed-only stores on the host (wb_quant_batch_run_delta): a full run seeds the shadows and
 * stores everything; after a few source elements change, a delta run leaves the destination
 * equal to a plain run's output on the new values, stores exactly the differing units (counted
 * independently) and scales, and stores nothing else: a byte of an unchanged unit, flipped in
 * the destination beforehand, stays flipped. Copies likewise, in units from each row's start. */
static void test_batch_delta(void)
{
    setenv("WB_LOG", "warn", 1);
    enum { R = 260, C = 300, LD = 320, COL0 = 100, GR = 3, GC = 4 }; /* cols 100..400: 4 blocks */
    uint16_t *src = malloc(R * LD * 2);
    uint8_t *q = malloc(R * C), *ref0 = malloc(R * C), *ref1 = malloc(R * C), *sh = malloc(R * C);
    float s[GR * GC], s0[GR * GC], s1[GR * GC], ssh[GR * GC];
    CHECK(src && q && ref0 && ref1 && sh);
    uint64_t seed = 9;
    for (int i = 0; i < R * LD; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        src[i] = wb_f32_to_bf16((float)(int32_t)(seed >> 40) / (float)(1 << 20));
    }
    struct wb_quant_item plain = {WB_DTYPE_BF16, src, LD, ref0, C, s0, GC, R, C, 0, COL0};
    struct wb_quant_item it = plain;
    it.q = q;
    it.scale = s;
    it.shadow = sh;
    it.shadow_scale = ssh;
    struct wb_quant_batch *pb = NULL, *db = NULL;
    CHECK_INT(wb_quant_batch_create(&HOST, &plain, 1, NULL, 0, &pb), 0);
    CHECK_INT(wb_quant_batch_create(&HOST, &it, 1, NULL, 0, &db), 0);
    CHECK_INT(wb_quant_batch_run(pb, NULL), 0);
    uint64_t stored = 0;
    CHECK_INT(wb_quant_batch_run_delta(db, NULL, false, &stored), 0);
    CHECK_INT(stored, (uint64_t)R * C + 4 * GR * GC);
    CHECK_MEM(q, ref0, R * C);
    CHECK_MEM(sh, ref0, R * C);
    CHECK_MEM(s, s0, sizeof(s));
    CHECK_MEM(ssh, s0, sizeof(s));
    /* a small step: 40 elements move by a few ulps, one block's largest grows */
    for (int k = 0; k < 40; k++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        uint64_t e = (seed >> 20) % R * LD + (seed >> 44) % C;
        src[e] = (uint16_t)(src[e] + 3);
    }
    src[5 * LD + 50] = wb_f32_to_bf16(4096.0f);
    plain.q = ref1;
    plain.scale = s1;
    wb_quant_batch_free(pb);
    CHECK_INT(wb_quant_batch_create(&HOST, &plain, 1, NULL, 0, &pb), 0);
    CHECK_INT(wb_quant_batch_run(pb, NULL), 0);
    uint64_t same, want = units_differing(ref0, ref1, R, C, COL0, &same);
    uint64_t nscales = 0;
    for (int i = 0; i < GR * GC; i++)
        nscales += memcmp(&s0[i], &s1[i], 4) != 0;
    CHECK(want > 0 && want < (uint64_t)R * C / 3); /* one block rescaled, 40 elements */
    CHECK_INT(nscales, 1);
    CHECK(same != UINT64_MAX);
    q[same] ^= 0xff; /* not the shadow's: a unit that does not change is not stored */
    stored = 0;
    CHECK_INT(wb_quant_batch_run_delta(db, NULL, true, &stored), 0);
    CHECK_INT(stored, want + 4 * nscales);
    CHECK_INT(q[same], ref1[same] ^ 0xff);
    q[same] ^= 0xff;
    CHECK_MEM(q, ref1, R * C);
    CHECK_MEM(sh, ref1, R * C);
    CHECK_MEM(s, s1, sizeof(s));
    CHECK_MEM(ssh, s1, sizeof(s));
    /* nothing changed: nothing stored */
    stored = 0;
    CHECK_INT(wb_quant_batch_run_delta(db, NULL, true, &stored), 0);
    CHECK_INT(stored, 0);
    wb_quant_batch_free(pb);
    wb_quant_batch_free(db);

    /* a 2-D copy: rows of 10 bytes (units 4, 4, 2) */
    uint8_t cs[3 * 16], cd[3 * 12], csh[3 * 10];
    for (int i = 0; i < (int)sizeof(cs); i++)
        cs[i] = (uint8_t)(i * 7);
    memset(cd, 0x5a, sizeof(cd));
    struct wb_copy_item cp = {cs, cd, 3, 10, 16, 12, csh};
    CHECK_INT(wb_quant_batch_create(&HOST, NULL, 0, &cp, 1, &db), 0);
    stored = 0;
    CHECK_INT(wb_quant_batch_run_delta(db, NULL, false, &stored), 0);
    CHECK_INT(stored, 30);
    cs[16 + 9] ^= 1;   /* row 1, the short unit */
    cs[32 + 0] ^= 1;   /* row 2, its first unit */
    cd[24 + 5] = 0x11; /* row 2's second unit does not change: stays */
    stored = 0;
    CHECK_INT(wb_quant_batch_run_delta(db, NULL, true, &stored), 0);
    CHECK_INT(stored, 2 + 4);
    for (int r = 0; r < 3; r++)
        for (int c = 0; c < 10; c++) {
            CHECK_INT(cd[r * 12 + c], r == 2 && c == 5 ? 0x11 : cs[r * 16 + c]);
            CHECK_INT(csh[r * 10 + c], cs[r * 16 + c]);
        }
    CHECK_INT(cd[10], 0x5a); /* the stride's gap untouched */
    wb_quant_batch_free(db);

    char buf[512];
    struct wb_test_stderr c;
    it.shadow_scale = NULL;
    wb_test_stderr_begin(&c);
    CHECK_INT(wb_quant_batch_create(&HOST, &it, 1, NULL, 0, &db), -EINVAL);
    CHECK_STR(wb_test_stderr_end(&c, buf, sizeof(buf)),
              "wb error quant: wb_quant_batch_create: quantization 0: it has a shadow for its "
              "bytes or its scales but not both\n");
    free(src);
    free(q);
    free(ref0);
    free(ref1);
    free(sh);
}

const struct wb_test wb_tests[] = {
    {"batch_host", test_batch_host, 0},
    {"batch_delta", test_batch_delta, 0},
    {"encoder_specials", test_encoder_specials, 0},
    {"encoder_bf16_all", test_encoder_bf16_all, 120},
    {"encoder_fp32_sweep", test_encoder_fp32_sweep, 120},
    {"block_bf16_patterns", test_block_bf16_patterns, 0},
    {"block_ragged", test_block_ragged, 0},
    {"block_scales_exact", test_block_scales_exact, 0},
    {"block_specials", test_block_specials, 0},
    {"split_every_row", test_split_every_row, 120},
    {"split_grids", test_split_grids, 0},
    {"grid", test_grid, 0},
    {"amax_merge", test_amax_merge, 0},
    {"errors", test_errors, 0},
    {0},
};
