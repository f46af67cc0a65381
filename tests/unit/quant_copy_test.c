/* quant_copy_test.c — the CPU reference of pack/unpack, concatenation and bf16/fp16/fp32 casts
 * (quant/quant.h): boxes of random shapes against index arithmetic done here, round trips, the
 * fused-projection layouts, every 16-bit pattern through the casts against the compiler's own
 * _Float16 conversions and a double-precision rounding written here, and the errors. */
#include "quant/quant.h"
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

/* ---------------------------------------------------------------- pack / unpack */

/* Row-major offset (elements) of the box element with box-relative index k. */
static uint64_t box_elem_offset(const struct wb_shape *s, const struct wb_box *b, uint64_t k)
{
    uint64_t idx[WB_MAX_DIMS], off = 0;
    for (uint32_t d = s->ndim; d-- > 0;) {
        idx[d] = b->off[d] + k % b->ext[d];
        k /= b->ext[d];
    }
    for (uint32_t d = 0; d < s->ndim; d++)
        off = off * s->dim[d] + idx[d];
    return off;
}

static void test_pack_unpack_random(void)
{
    static const enum wb_dtype dts[] = {WB_DTYPE_FP8_E4M3, WB_DTYPE_BF16, WB_DTYPE_FP32,
                                        WB_DTYPE_I64};
    uint64_t seed = 12345;
    for (int iter = 0; iter < 600; iter++) {
        enum wb_dtype dt = dts[iter % 4];
        size_t es = wb_dtype_size(dt);
        struct wb_shape s = {.ndim = (uint32_t)(rng_next(&seed) % 5)};
        struct wb_box b = {.ndim = s.ndim};
        for (uint32_t d = 0; d < s.ndim; d++) {
            s.dim[d] = 1 + rng_next(&seed) % (d + 1 == s.ndim ? 40 : 7);
            uint64_t kind = rng_next(&seed) % 4; /* whole dim, prefix, suffix, middle */
            b.off[d] = kind == 0 || kind == 1 ? 0 : rng_next(&seed) % s.dim[d];
            uint64_t room = s.dim[d] - b.off[d];
            b.ext[d] = kind == 0 ? s.dim[d] : kind == 2 ? room : 1 + rng_next(&seed) % room;
        }
        if (iter % 50 == 7 && s.ndim > 0)
            b.ext[0] = 0; /* an empty box */
        uint64_t n = wb_shape_numel(&s), m = wb_box_numel(&b);
        uint8_t *x = malloc(n * es), *packed = malloc(m * es + 1), *y = malloc(n * es);
        CHECK(x && packed && y);
        for (uint64_t i = 0; i < n * es; i++)
            x[i] = (uint8_t)(i * 7 + 3);
        CHECK_INT(wb_quant_pack(&HOST, dt, &s, &b, x, packed), 0);
        for (uint64_t k = 0; k < m; k++)
            CHECK_MEM(packed + k * es, x + box_elem_offset(&s, &b, k) * es, es);
        memset(y, 0xee, n * es);
        CHECK_INT(wb_quant_unpack(&HOST, dt, &s, &b, packed, y), 0);
        for (uint64_t k = 0; k < m; k++) { /* the box came back ... */
            uint64_t o = box_elem_offset(&s, &b, k);
            CHECK_MEM(y + o * es, x + o * es, es);
            memset(y + o * es, 0xee, es);
        }
        for (uint64_t i = 0; i < n * es; i++) /* ... and nothing else was touched */
            CHECK_INT(y[i], 0xee);
        free(x);
        free(packed);
        free(y);
    }
}

static void test_pack_examples(void)
{
    /* a column slice of a 3 x 4 fp32 matrix, and a whole-rows box (one run) */
    float x[12], p[6];
    for (int i = 0; i < 12; i++)
        x[i] = (float)i;
    struct wb_shape s = {2, {3, 4}};
    struct wb_box cols = {2, {0, 1}, {3, 2}};
    CHECK_INT(wb_quant_pack(&HOST, WB_DTYPE_FP32, &s, &cols, x, p), 0);
    static const float want[6] = {1, 2, 5, 6, 9, 10};
    CHECK_MEM(p, want, sizeof(want));
    struct wb_box rows = {2, {1, 0}, {2, 4}};
    float r[8];
    CHECK_INT(wb_quant_pack(NULL, WB_DTYPE_FP32, &s, &rows, x, r), 0);
    CHECK_MEM(r, x + 4, sizeof(r));
    /* a scalar */
    struct wb_shape s0 = {0};
    struct wb_box b0 = {0};
    float one = 5.0f, got = 0;
    CHECK_INT(wb_quant_pack(&HOST, WB_DTYPE_FP32, &s0, &b0, &one, &got), 0);
    CHECK(got == 5.0f);
}

static void test_pack_errors(void)
{
    setenv("WB_LOG", "warn", 1);
    float x[12] = {0}, p[12];
    for (int i = 0; i < 12; i++)
        p[i] = -1.0f;
    struct wb_shape s = {2, {3, 4}};
    struct wb_box out = {2, {2, 1}, {2, 2}};
    char buf[512];
    struct wb_test_stderr c;
    wb_test_stderr_begin(&c);
    CHECK_INT(wb_quant_pack(&HOST, WB_DTYPE_FP32, &s, &out, x, p), -EINVAL);
    CHECK_STR(wb_test_stderr_end(&c, buf, sizeof(buf)),
              "wb error quant: wb_quant_pack: box [2:4, 1:3] is not inside shape [3, 4]\n");
    struct wb_box nd = {1, {0}, {3}};
    wb_test_stderr_begin(&c);
    CHECK_INT(wb_quant_unpack(&HOST, WB_DTYPE_FP32, &s, &nd, p, x), -EINVAL);
    CHECK_STR(wb_test_stderr_end(&c, buf, sizeof(buf)),
              "wb error quant: wb_quant_unpack: box [0:3] is not inside shape [3, 4]\n");
    struct wb_box ok = {2, {0, 0}, {1, 1}};
    wb_test_stderr_begin(&c);
    CHECK_INT(wb_quant_pack(&HOST, WB_DTYPE_INVALID, &s, &ok, x, p), -EINVAL);
    CHECK_STR(wb_test_stderr_end(&c, buf, sizeof(buf)),
              "wb error quant: wb_quant_pack: invalid dtype 0\n");
    wb_test_stderr_begin(&c);
    CHECK_INT(wb_quant_pack(&HOST, WB_DTYPE_FP32, &s, &ok, NULL, p), -EINVAL);
    CHECK_STR(wb_test_stderr_end(&c, buf, sizeof(buf)),
              "wb error quant: wb_quant_pack: shape, box, src and dst must not be NULL\n");
    for (int i = 0; i < 12; i++)
        CHECK(p[i] == -1.0f && x[i] == 0.0f);
}

/* ---------------------------------------------------------------- concatenation */

static void test_concat_qkv(void)
{
    /* q [4,3], k [2,3], v [2,3] -> qkv [8,3] along dim 0, bf16 */
    uint16_t q[12], k[6], v[6], qkv[24];
    for (int i = 0; i < 12; i++)
        q[i] = (uint16_t)(0x100 + i);
    for (int i = 0; i < 6; i++) {
        k[i] = (uint16_t)(0x200 + i);
        v[i] = (uint16_t)(0x300 + i);
    }
    struct wb_shape sq = {2, {4, 3}}, sk = {2, {2, 3}}, whole = {2, {8, 3}};
    CHECK_INT(wb_quant_concat(&HOST, WB_DTYPE_BF16, &sq, q, &whole, 0, 0, qkv), 0);
    CHECK_INT(wb_quant_concat(&HOST, WB_DTYPE_BF16, &sk, k, &whole, 0, 4, qkv), 0);
    CHECK_INT(wb_quant_concat(&HOST, WB_DTYPE_BF16, &sk, v, &whole, 0, 6, qkv), 0);
    CHECK_MEM(qkv, q, sizeof(q));
    CHECK_MEM(qkv + 12, k, sizeof(k));
    CHECK_MEM(qkv + 18, v, sizeof(v));

    /* gate [2,3] and up [2,2] side by side along dim 1 -> [2,5] */
    uint16_t gate[6] = {1, 2, 3, 4, 5, 6}, up[4] = {7, 8, 9, 10}, gu[10];
    struct wb_shape sg = {2, {2, 3}}, su = {2, {2, 2}}, sgu = {2, {2, 5}};
    CHECK_INT(wb_quant_concat(&HOST, WB_DTYPE_BF16, &sg, gate, &sgu, 1, 0, gu), 0);
    CHECK_INT(wb_quant_concat(&HOST, WB_DTYPE_BF16, &su, up, &sgu, 1, 3, gu), 0);
    static const uint16_t want[10] = {1, 2, 3, 7, 8, 4, 5, 6, 9, 10};
    CHECK_MEM(gu, want, sizeof(want));

    /* stacked experts: 3-d, along dim 0 */
    float e0[4] = {1, 2, 3, 4}, e1[4] = {5, 6, 7, 8}, st[8];
    struct wb_shape se = {3, {1, 2, 2}}, sst = {3, {2, 2, 2}};
    CHECK_INT(wb_quant_concat(&HOST, WB_DTYPE_FP32, &se, e1, &sst, 0, 1, st), 0);
    CHECK_INT(wb_quant_concat(&HOST, WB_DTYPE_FP32, &se, e0, &sst, 0, 0, st), 0);
    static const float wst[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    CHECK_MEM(st, wst, sizeof(wst));
}

static void test_concat_errors(void)
{
    setenv("WB_LOG", "warn", 1);
    uint16_t a[10] = {0}, w[24];
    memset(w, 0x5a, sizeof(w));
    struct wb_shape pa = {2, {2, 5}}, whole = {2, {8, 3}}, p3 = {2, {2, 3}};
    char buf[512];
    struct wb_test_stderr c;
    wb_test_stderr_begin(&c);
    CHECK_INT(wb_quant_concat(&HOST, WB_DTYPE_BF16, &pa, a, &whole, 0, 4, w), -EINVAL);
    CHECK_STR(wb_test_stderr_end(&c, buf, sizeof(buf)),
              "wb error quant: wb_quant_concat: part [2, 5] does not fit whole [8, 3] at "
              "offset 4 of dim 0\n");
    wb_test_stderr_begin(&c);
    CHECK_INT(wb_quant_concat(&HOST, WB_DTYPE_BF16, &p3, a, &whole, 0, 7, w), -EINVAL);
    CHECK_STR(wb_test_stderr_end(&c, buf, sizeof(buf)),
              "wb error quant: wb_quant_concat: part [2, 3] does not fit whole [8, 3] at "
              "offset 7 of dim 0\n");
    wb_test_stderr_begin(&c);
    CHECK_INT(wb_quant_concat(&HOST, WB_DTYPE_BF16, &p3, a, &whole, 2, 0, w), -EINVAL);
    CHECK_STR(wb_test_stderr_end(&c, buf, sizeof(buf)),
              "wb error quant: wb_quant_concat: cannot place a 2-d part into a 2-d tensor along "
              "dim 2\n");
    for (int i = 0; i < 24; i++)
        CHECK_INT(w[i], 0x5a5a);
}

/* ---------------------------------------------------------------- casts */

/* Round-to-nearest-even of a finite double to a format with `mant` stored mantissa bits, the
 * given exponent bias and maximum finite value, by comparing the two neighbours in double. */
static double ref_round(double v, int mant, int emin, double maxf)
{
    double a = fabs(v);
    if (a == 0)
        return v;
    int e;
    frexp(a, &e);                        /* a = f * 2^e, f in [0.5, 1) */
    int q = e - 1 < emin ? emin : e - 1; /* exponent of the unit, subnormals at emin */
    double ulp = ldexp(1.0, q - mant);
    double lo = floor(a / ulp) * ulp, hi = lo + ulp;
    double r = a - lo < hi - a ? lo : hi - a < a - lo ? hi : fmod(lo / ulp, 2) == 0 ? lo : hi;
    if (r > maxf)
        r = INFINITY;
    return v < 0 ? -r : r;
}

static uint16_t ref_bf16(float f)
{
    if (isnan(f))
        return 0x7fc0;
    if (isinf(f))
        return (uint16_t)(bits(f) >> 16);
    float r = (float)ref_round(f, 7, -126, 0x1.fep127); /* the largest bf16 */
    return (uint16_t)(bits(r) >> 16);
}

static void test_cast_bf16_fp32(void)
{
    uint16_t h[65536], back[65536];
    float *f = malloc(65536 * 4);
    CHECK(f);
    for (uint32_t i = 0; i < 65536; i++)
        h[i] = (uint16_t)i;
    CHECK_INT(wb_quant_cast(&HOST, WB_DTYPE_BF16, h, WB_DTYPE_FP32, f, 65536), 0);
    for (uint32_t i = 0; i < 65536; i++) {
        uint32_t want = (i & 0x7fff) > 0x7f80 ? 0x7fc00000 : i << 16;
        CHECK_U64(bits(f[i]), want);
    }
    CHECK_INT(wb_quant_cast(&HOST, WB_DTYPE_FP32, f, WB_DTYPE_BF16, back, 65536), 0);
    for (uint32_t i = 0; i < 65536; i++)
        CHECK_INT(back[i], (i & 0x7fff) > 0x7f80 ? 0x7fc0 : i);
    free(f);

    static const struct {
        uint32_t f;
        uint16_t h;
    } cases[] = {
        {0x3f808000, 0x3f80},                                             /* tie -> even */
        {0x3f818000, 0x3f82},                                             /* tie -> even (up) */
        {0x3f808001, 0x3f81}, {0x3f807fff, 0x3f80}, {0x7f7fffff, 0x7f80}, /* overflow: inf */
        {0x7f7f7fff, 0x7f7f}, {0x00000001, 0x0000},                       /* denormal */
        {0x80018000, 0x8002}, {0xffc00001, 0x7fc0},                       /* NaN */
        {0xff800000, 0xff80},
    };
    for (size_t i = 0; i < WB_ARRAY_LEN(cases); i++) {
        uint16_t r;
        float x = fbits(cases[i].f);
        CHECK_INT(wb_quant_cast(&HOST, WB_DTYPE_FP32, &x, WB_DTYPE_BF16, &r, 1), 0);
        CHECK_INT(r, cases[i].h);
    }
    /* a sweep of FP32 patterns against the double-precision rounding */
    enum { N = 1 << 20 };
    float *xs = malloc(N * 4);
    uint16_t *rs = malloc(N * 2);
    CHECK(xs && rs);
    uint64_t seed = 77;
    for (int i = 0; i < N; i++)
        xs[i] = fbits((uint32_t)rng_next(&seed));
    CHECK_INT(wb_quant_cast(&HOST, WB_DTYPE_FP32, xs, WB_DTYPE_BF16, rs, N), 0);
    for (int i = 0; i < N; i++)
        if (rs[i] != ref_bf16(xs[i]))
            wb_test_fail(__FILE__, __LINE__, "bf16(%a) == 0x%04x, expected 0x%04x", xs[i], rs[i],
                         ref_bf16(xs[i]));
    free(xs);
    free(rs);
}

#ifdef __FLT16_MAX__
static uint16_t cc_fp16(float f) /* the compiler's IEEE conversion */
{
    if (isnan(f))
        return 0x7e00;
    _Float16 h = (_Float16)f;
    uint16_t u;
    memcpy(&u, &h, 2);
    return u;
}

static float cc_fp16_to_f32(uint16_t u)
{
    _Float16 h;
    memcpy(&h, &u, 2);
    return isnan((float)h) ? fbits(0x7fc00000) : (float)h;
}
#endif

static void test_cast_fp16(void)
{
    static const struct {
        uint32_t f;
        uint16_t h;
    } cases[] = {
        {0x477fe000, 0x7bff}, /* 65504 */
        {0x477fefff, 0x7bff}, /* just below 65520 */
        {0x477ff000, 0x7c00}, /* 65520: tie -> inf */
        {0x47800000, 0x7c00}, {0x7f800000, 0x7c00}, {0xff800000, 0xfc00},
        {0x33800000, 0x0001},                       /* 2^-24 */
        {0x33000000, 0x0000},                       /* 2^-25: tie -> 0 */
        {0x33400000, 0x0001},                       /* 1.5 * 2^-25 */
        {0x33c00000, 0x0002},                       /* 3 * 2^-25: tie -> 2 */
        {0x38800000, 0x0400},                       /* 2^-14 */
        {0x387ff000, 0x0400},                       /* rounds up into the normals */
        {0x3f800000, 0x3c00}, {0xbf801000, 0xbc00}, /* tie -> even */
        {0x3f803000, 0x3c02}, {0x7fc00001, 0x7e00}, {0xffffffff, 0x7e00},
        {0x00000001, 0x0000}, {0x80000001, 0x8000},
    };
    for (size_t i = 0; i < WB_ARRAY_LEN(cases); i++) {
        uint16_t r;
        float x = fbits(cases[i].f);
        CHECK_INT(wb_quant_cast(&HOST, WB_DTYPE_FP32, &x, WB_DTYPE_FP16, &r, 1), 0);
        if (r != cases[i].h)
            wb_test_fail(__FILE__, __LINE__, "fp16(%a) == 0x%04x, expected 0x%04x", x, r,
                         cases[i].h);
    }
    /* every fp16 pattern to FP32 and back */
    uint16_t h[65536], back[65536], viabf[65536], bf[65536];
    float *f = malloc(65536 * 4);
    CHECK(f);
    for (uint32_t i = 0; i < 65536; i++)
        h[i] = (uint16_t)i;
    CHECK_INT(wb_quant_cast(&HOST, WB_DTYPE_FP16, h, WB_DTYPE_FP32, f, 65536), 0);
    for (uint32_t i = 0; i < 65536; i++) {
        uint32_t e = (i >> 10) & 0x1f, m = i & 0x3ff;
        double v = e == 0    ? ldexp(m, -24)
                   : e == 31 ? (m ? NAN : INFINITY)
                             : ldexp(1024 + m, (int)e - 25);
        float want = isnan(v) ? fbits(0x7fc00000) : (float)(i & 0x8000 ? -v : v);
        CHECK_U64(bits(f[i]), bits(want));
#ifdef __FLT16_MAX__
        CHECK_U64(bits(f[i]), bits(cc_fp16_to_f32((uint16_t)i)));
#endif
    }
    CHECK_INT(wb_quant_cast(&HOST, WB_DTYPE_FP32, f, WB_DTYPE_FP16, back, 65536), 0);
    for (uint32_t i = 0; i < 65536; i++)
        CHECK_INT(back[i], (i & 0x7fff) > 0x7c00 ? 0x7e00 : i);
    /* fp16 -> bf16 rounds the exact value once; bf16 -> fp16 likewise */
    CHECK_INT(wb_quant_cast(&HOST, WB_DTYPE_FP16, h, WB_DTYPE_BF16, bf, 65536), 0);
    for (uint32_t i = 0; i < 65536; i++)
        CHECK_INT(bf[i], ref_bf16(f[i]));
    CHECK_INT(wb_quant_cast(&HOST, WB_DTYPE_BF16, h, WB_DTYPE_FP16, viabf, 65536), 0);
    CHECK_INT(wb_quant_cast(&HOST, WB_DTYPE_BF16, h, WB_DTYPE_FP32, f, 65536), 0);
    for (uint32_t i = 0; i < 65536; i++) {
        uint16_t r;
        CHECK_INT(wb_quant_cast(&HOST, WB_DTYPE_FP32, &f[i], WB_DTYPE_FP16, &r, 1), 0);
        CHECK_INT(viabf[i], r);
#ifdef __FLT16_MAX__
        CHECK_INT(viabf[i], cc_fp16(f[i]));
#endif
    }
    free(f);
#ifdef __FLT16_MAX__
    /* a sweep of FP32 patterns against the compiler's conversion */
    enum { N = 1 << 20 };
    float *xs = malloc(N * 4);
    uint16_t *rs = malloc(N * 2);
    CHECK(xs && rs);
    uint64_t seed = 99;
    for (int i = 0; i < N; i++) {
        uint32_t u = (uint32_t)rng_next(&seed);
        if (i & 1) /* half of them near the fp16 range */
            u = (u & 0x80ffffff) | ((uint32_t)(100 + (u >> 24) % 48) << 23);
        xs[i] = fbits(u);
    }
    CHECK_INT(wb_quant_cast(&HOST, WB_DTYPE_FP32, xs, WB_DTYPE_FP16, rs, N), 0);
    for (int i = 0; i < N; i++)
        if (rs[i] != cc_fp16(xs[i]))
            wb_test_fail(__FILE__, __LINE__, "fp16(%a) == 0x%04x, expected 0x%04x", xs[i], rs[i],
                         cc_fp16(xs[i]));
    free(xs);
    free(rs);
#endif
}

static void test_cast_same_and_errors(void)
{
    setenv("WB_LOG", "warn", 1);
    float a[3] = {1.0f, fbits(0xffc01234), -2.0f}, b[3] = {0};
    CHECK_INT(wb_quant_cast(&HOST, WB_DTYPE_FP32, a, WB_DTYPE_FP32, b, 3), 0);
    CHECK_MEM(a, b, sizeof(a)); /* a plain copy: the NaN payload stays */
    char buf[512];
    struct wb_test_stderr c;
    wb_test_stderr_begin(&c);
    CHECK_INT(wb_quant_cast(&HOST, WB_DTYPE_I32, a, WB_DTYPE_FP32, b, 3), -EINVAL);
    CHECK_STR(wb_test_stderr_end(&c, buf, sizeof(buf)),
              "wb error quant: wb_quant_cast: cannot cast i32 to fp32 (bf16, fp16 and fp32 "
              "only)\n");
    wb_test_stderr_begin(&c);
    CHECK_INT(wb_quant_cast(&HOST, WB_DTYPE_FP32, a, WB_DTYPE_FP8_E4M3, b, 3), -EINVAL);
    CHECK_INT(wb_quant_cast(&HOST, WB_DTYPE_FP32, a, WB_DTYPE_BF16, NULL, 3), -EINVAL);
    CHECK_INT(wb_quant_cast(&HOST, WB_DTYPE_FP32, (const char *)a + 2, WB_DTYPE_BF16, b, 1),
              -EINVAL);
    CHECK_STR(wb_test_stderr_end(&c, buf, sizeof(buf)),
              "wb error quant: wb_quant_cast: cannot cast fp32 to fp8_e4m3 (bf16, fp16 and fp32 "
              "only)\n"
              "wb error quant: wb_quant_cast: src and dst must not be NULL\n"
              "wb error quant: wb_quant_cast: src is not aligned to its 4-byte elements\n");
    CHECK_INT(wb_quant_cast(&HOST, WB_DTYPE_FP32, a, WB_DTYPE_BF16, b, 0), 0);
    CHECK_MEM(a, b, sizeof(a));
    if (wb_gpu_count() == 0) {
        struct wb_quant_exec dev = {WB_QUANT_DEVICE, NULL};
        CHECK_INT(wb_quant_cast(&dev, WB_DTYPE_FP32, a, WB_DTYPE_BF16, b, 3), -WB_E_NOGPU);
        struct wb_shape s = {1, {3}};
        struct wb_box bx = {1, {0}, {3}};
        CHECK_INT(wb_quant_pack(&dev, WB_DTYPE_FP32, &s, &bx, a, b), -WB_E_NOGPU);
        CHECK_MEM(a, b, sizeof(a));
    }
}

/* What a trainer holding FP32 or FP16 masters sends a BF16 rollout (issue #31): the values a cast
 * gets wrong most easily, each worked out by hand — NaN of every kind to the canonical quiet
 * NaN (a signalling NaN truncated would be inf), overflow past BF16's largest to inf, ties at
 * BF16's largest, subnormal ties, -0, FP16 subnormals and extremes. */
static void test_cast_masters_specials(void)
{
    static const struct {
        uint32_t f;
        uint16_t h;
    } f32[] = {
        {0x7fc00000, 0x7fc0}, {0xffc12345, 0x7fc0}, {0x7f800001, 0x7fc0}, /* NaN */
        {0x7f800000, 0x7f80}, {0xff800000, 0xff80},                       /* inf */
        {0x7f7fffff, 0x7f80}, {0xff7f8000, 0xff80}, {0x7f7f7fff, 0x7f7f}, /* BF16's edge */
        {0x00000001, 0x0000}, {0x00008000, 0x0000}, {0x00018000, 0x0002}, /* subnormals */
        {0x807fffff, 0x8080}, {0x80000000, 0x8000},                       /* -0 */
        {0x3f808000, 0x3f80}, {0x3f818000, 0x3f82}, {0x3f80ffff, 0x3f81}, /* ties */
        {0xbf808001, 0xbf81},
    };
    static const struct {
        uint16_t f, h;
    } f16[] = {
        {0x7e00, 0x7fc0}, {0xfd01, 0x7fc0}, {0x7c00, 0x7f80},
        {0xfc00, 0xff80}, {0x7bff, 0x4780}, /* 65504 rounds up to 65536 */
        {0x0001, 0x3380},                   /* 2^-24 */
        {0x03ff, 0x3880},                   /* the largest subnormal rounds up to 2^-14 */
        {0x8000, 0x8000}, {0x3c01, 0x3f80}, {0x3c03, 0x3f80},
        {0x3c04, 0x3f80}, /* 1 + 2^-8: a tie, even */
        {0x3c0c, 0x3f82}, /* 1 + 3 * 2^-8: a tie, odd */
    };
    float x[WB_ARRAY_LEN(f32)];
    uint16_t h[WB_ARRAY_LEN(f16)], r[WB_ARRAY_LEN(f32)];
    for (size_t i = 0; i < WB_ARRAY_LEN(f32); i++)
        x[i] = fbits(f32[i].f);
    CHECK_INT(wb_quant_cast(&HOST, WB_DTYPE_FP32, x, WB_DTYPE_BF16, r, WB_ARRAY_LEN(f32)), 0);
    for (size_t i = 0; i < WB_ARRAY_LEN(f32); i++)
        if (r[i] != f32[i].h)
            wb_test_fail(__FILE__, __LINE__, "bf16(fp32 0x%08x) == 0x%04x, expected 0x%04x",
                         f32[i].f, r[i], f32[i].h);
    for (size_t i = 0; i < WB_ARRAY_LEN(f16); i++)
        h[i] = f16[i].f;
    CHECK_INT(wb_quant_cast(&HOST, WB_DTYPE_FP16, h, WB_DTYPE_BF16, r, WB_ARRAY_LEN(f16)), 0);
    for (size_t i = 0; i < WB_ARRAY_LEN(f16); i++)
        if (r[i] != f16[i].h)
            wb_test_fail(__FILE__, __LINE__, "bf16(fp16 0x%04x) == 0x%04x, expected 0x%04x",
                         f16[i].f, r[i], f16[i].h);
}

/* FP16 masters with inf or NaN quantized to FP8 (the CPU's vector path: rows of 16): an inf
 * block has scale_inv inf, its finite values become (signed) 0 and the inf 0x7f; a NaN block is
 * all 0x7f with CUDA's NaN 0x7fffffff as its scale. (The vector widening once overflowed a
 * signed lane on inf/NaN: UBSan stopped the trainer.) */
static void test_fp8_fp16_inf_nan(void)
{
    uint16_t a[2 * 16], b[2 * 16];
    uint8_t q[2 * 16];
    float s;
    for (int i = 0; i < 32; i++)
        a[i] = b[i] = i < 16 ? 0x3c00 : 0xc000; /* 1.0, then -2.0 */
    a[5] = 0x7c00;                              /* +inf */
    b[17] = 0xfe01;                             /* a NaN */
    CHECK_INT(wb_quant_fp8_block(&HOST, WB_DTYPE_FP16, a, 2, 16, q, &s), 0);
    CHECK_U64(bits(s), 0x7f800000);
    for (int i = 0; i < 32; i++)
        CHECK_INT(q[i], i == 5 ? 0x7f : i < 16 ? 0x00 : 0x80);
    CHECK_INT(wb_quant_fp8_block(&HOST, WB_DTYPE_FP16, b, 2, 16, q, &s), 0);
    CHECK_U64(bits(s), 0x7fffffff);
    for (int i = 0; i < 32; i++)
        CHECK_INT(q[i], 0x7f);
}

const struct wb_test wb_tests[] = {
    {"pack_unpack_random", test_pack_unpack_random, 0},
    {"pack_examples", test_pack_examples, 0},
    {"pack_errors", test_pack_errors, 0},
    {"concat_qkv", test_concat_qkv, 0},
    {"concat_errors", test_concat_errors, 0},
    {"cast_bf16_fp32", test_cast_bf16_fp32, 0},
    {"cast_fp16", test_cast_fp16, 0},
    {"cast_same_and_errors", test_cast_same_and_errors, 0},
    {"cast_masters_specials", test_cast_masters_specials, 0},
    {"fp8_fp16_inf_nan", test_fp8_fp16_inf_nan, 0},
    {0},
};
