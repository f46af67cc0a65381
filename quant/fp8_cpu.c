/* fp8_cpu.c — the CPU reference of FP8 128x128 block quantization: partial amax, quantization
 * with given amax, and the one-pass fused form.
 *
 * It serves host-memory sources (checkpoint broadcast without a GPU), so it has to be fast:
 * the target is >= 1 GB/s of BF16 input per core. The work goes block by block (a 128x128 BF16
 * block is 32 KiB, so the quantizing pass re-reads it from L1/L2 after the amax pass has pulled
 * it from memory), and the inner loops are written with GCC/Clang vector extensions on 16-byte
 * vectors, which every x86-64 (SSE2) and arm64 (NEON) target runs natively — no build flag, no
 * runtime dispatch. The e4m3 encoder below is the 4-lane twin of wb_e4m3_encode() in fpbits.h
 * (same integer steps, branches turned into masks); tests check both against NVIDIA's host
 * conversion, and the scalar one handles row tails.
 */
#include "quant/quant_int.h"

#include "common/fpbits.h"

#ifdef __SSE2__
#include <emmintrin.h>
#endif

typedef int32_t v4i __attribute__((vector_size(16)));
typedef float v4f __attribute__((vector_size(16)));
typedef int16_t v8s __attribute__((vector_size(16)));
typedef uint8_t v4b __attribute__((vector_size(4)));

/* Selects a where mask is all ones, b where it is zero. */
static inline v4i sel(v4i mask, v4i a, v4i b)
{
    return (a & mask) | (b & ~mask);
}

/* Four FP32 values to e4m3fn bytes, one per 32-bit lane (see wb_e4m3_encode). */
static inline v4i encode4(v4f y)
{
    v4i u = (v4i)y;
    v4i sign = (u >> 24) & 0x80;
    v4i a = u & WB_F32_ABS; /* non-negative, so signed compares order it */
    v4i nan = a > WB_F32_INF;
    a = sel(a > WB_F32_448, (v4i){0} + WB_F32_448, a);
    v4i normal = ((a + 0x7ffff + ((a >> 20) & 1)) >> 20) - ((127 - 7) << 3);
    v4i sub = (v4i)((v4f)a + 16384.0f) - WB_F32_2P14;
    v4i r = sel(a < WB_F32_E4M3_MINNORM, sub, normal) | sign;
    return sel(nan, (v4i){0} + 0x7f, r);
}

/* Stores the low bytes of 16 lanes. SSE2's two saturating packs do it in two instructions
 * (every lane holds 0..255); compilers scalarize the generic narrowing conversion on x86. */
static inline void store16(uint8_t *q, v4i a, v4i b, v4i c, v4i d)
{
#ifdef __SSE2__
    __m128i ab = _mm_packs_epi32((__m128i)a, (__m128i)b);
    __m128i cd = _mm_packs_epi32((__m128i)c, (__m128i)d);
    _mm_storeu_si128((__m128i *)q, _mm_packus_epi16(ab, cd));
#else
    v4b x[4] = {__builtin_convertvector(a, v4b), __builtin_convertvector(b, v4b),
                __builtin_convertvector(c, v4b), __builtin_convertvector(d, v4b)};
    memcpy(q, x, 16);
#endif
}

/* Eight 16-bit values to two vectors of four 32-bit lanes: each value in the high half of its
 * lane (high = true: a BF16 value becomes its FP32 value) or zero-extended. */
static inline void widen8(const uint16_t *x, bool high, v4i *lo, v4i *hi)
{
    v8s h, z = {0};
    memcpy(&h, x, sizeof(h));
    if (high) {
        *lo = (v4i)__builtin_shufflevector(z, h, 0, 8, 1, 9, 2, 10, 3, 11);
        *hi = (v4i)__builtin_shufflevector(z, h, 4, 12, 5, 13, 6, 14, 7, 15);
    } else {
        *lo = (v4i)__builtin_shufflevector(h, z, 0, 8, 1, 9, 2, 10, 3, 11);
        *hi = (v4i)__builtin_shufflevector(h, z, 4, 12, 5, 13, 6, 14, 7, 15);
    }
}

/* Four fp16 bit patterns (zero-extended lanes) to FP32, exactly (NaN payloads kept; they end
 * as 0x7f anyway). */
static inline v4f fp16x4(v4i h)
{
    v4i sign = (h & 0x8000) << 16;
    v4i o = (h & 0x7fff) << 13;
    v4i e = o & 0x0f800000;
    v4i special = e == 0x0f800000, sub = e == 0;
    o += 0x38000000 + (special & 0x38000000); /* rebias 15 -> 127; inf/NaN to 255 */
    /* subnormal: 2^-14 * (1 + m/1024) - 2^-14 = m * 2^-24, exactly (computed from the
     * subnormal lanes only: an inf/NaN lane's o + 2^23 would overflow the signed lane) */
    v4i d = (v4i)((v4f)((o & sub) + 0x00800000) - 6.103515625e-05f);
    return (v4f)(sel(sub, d, o) | sign);
}

/* ---- max |x| of one row, as FP32 bits (NaN above +inf) */

static uint32_t amax16(const uint16_t *x, size_t n)
{
    v8s m = {0};
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        v8s v;
        memcpy(&v, x + i, sizeof(v));
        v &= 0x7fff; /* non-negative int16: a signed max orders the magnitudes */
        v8s gt = v > m;
        m = (v & gt) | (m & ~gt);
    }
    uint16_t best = 0;
    for (int k = 0; k < 8; k++)
        best = (uint16_t)m[k] > best ? (uint16_t)m[k] : best;
    for (; i < n; i++)
        best = (uint16_t)(x[i] & 0x7fff) > best ? (uint16_t)(x[i] & 0x7fff) : best;
    return best;
}

static uint32_t amax_bf16(const void *x, size_t n)
{
    return amax16(x, n) << 16;
}

static uint32_t amax_fp16(const void *x, size_t n)
{
    return wb_f32_bits(wb_fp16_to_f32((uint16_t)amax16(x, n)));
}

static uint32_t amax_fp32(const void *px, size_t n)
{
    const float *x = px;
    v4i m = {0};
    size_t i = 0;
    for (; i + 4 <= n; i += 4) {
        v4i v;
        memcpy(&v, x + i, sizeof(v));
        v &= WB_F32_ABS;
        m = sel(v > m, v, m);
    }
    uint32_t best = 0;
    for (int k = 0; k < 4; k++)
        best = (uint32_t)m[k] > best ? (uint32_t)m[k] : best;
    for (; i < n; i++) {
        uint32_t a = wb_f32_bits(x[i]) & WB_F32_ABS;
        best = a > best ? a : best;
    }
    return best;
}

/* ---- q = e4m3(float(x) * s) for one row, 16 elements at a time */

static void apply_bf16(const void *px, size_t n, float s, uint8_t *q)
{
    const uint16_t *x = px;
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        v4i a, b, c, d;
        widen8(x + i, true, &a, &b);
        widen8(x + i + 8, true, &c, &d);
        store16(q + i, encode4((v4f)a * s), encode4((v4f)b * s), encode4((v4f)c * s),
                encode4((v4f)d * s));
    }
    for (; i < n; i++)
        q[i] = wb_e4m3_encode(wb_f32_from_bits((uint32_t)x[i] << 16) * s);
}

static void apply_fp16(const void *px, size_t n, float s, uint8_t *q)
{
    const uint16_t *x = px;
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        v4i a, b, c, d;
        widen8(x + i, false, &a, &b);
        widen8(x + i + 8, false, &c, &d);
        store16(q + i, encode4(fp16x4(a) * s), encode4(fp16x4(b) * s), encode4(fp16x4(c) * s),
                encode4(fp16x4(d) * s));
    }
    for (; i < n; i++)
        q[i] = wb_e4m3_encode(wb_fp16_to_f32(x[i]) * s);
}

static void apply_fp32(const void *px, size_t n, float s, uint8_t *q)
{
    const float *x = px;
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        v4f v[4];
        memcpy(v, x + i, sizeof(v));
        store16(q + i, encode4(v[0] * s), encode4(v[1] * s), encode4(v[2] * s), encode4(v[3] * s));
    }
    for (; i < n; i++)
        q[i] = wb_e4m3_encode(x[i] * s);
}

struct row_ops {
    uint32_t (*amax)(const void *x, size_t n);
    void (*apply)(const void *x, size_t n, float s, uint8_t *q);
};

static const struct row_ops bf16_ops = {amax_bf16, apply_bf16};
static const struct row_ops fp16_ops = {amax_fp16, apply_fp16};
static const struct row_ops fp32_ops = {amax_fp32, apply_fp32};

/* Local bounds [lo, hi) of global block b's span [b*128, b*128+128) in a local range that
 * starts at global `origin` and holds [from, to) locally. */
static void block_span(uint64_t b, uint64_t origin, uint64_t from, uint64_t to, uint64_t *lo,
                       uint64_t *hi)
{
    uint64_t g0 = b * WB_FP8_BLOCK, g1 = g0 + WB_FP8_BLOCK;
    uint64_t l0 = g0 > origin ? g0 - origin : 0, l1 = g1 - origin;
    *lo = l0 > from ? l0 : from;
    *hi = l1 < to ? l1 : to;
}

void qt_cpu_pass(const struct wb_quant_pass *p)
{
    const struct wb_quant_tile *t = &p->tile;
    const struct wb_quant_grid *g = &p->grid;
    const struct row_ops *ops = t->dtype == WB_DTYPE_BF16   ? &bf16_ops
                                : t->dtype == WB_DTYPE_FP16 ? &fp16_ops
                                                            : &fp32_ops;
    size_t es = wb_dtype_size(t->dtype);
    const char *src = p->src;
    for (uint64_t bi = 0; bi < g->rows; bi++) {
        uint64_t r_lo, r_hi;
        block_span(g->row + bi, t->row0, p->r0, p->r1, &r_lo, &r_hi);
        for (uint64_t bj = 0; bj < g->cols; bj++) {
            uint64_t c_lo, c_hi, k = bi * g->cols + bj;
            block_span(g->col + bj, t->col0, 0, t->cols, &c_lo, &c_hi);
            size_t w = (size_t)(c_hi - c_lo);
            const char *x = src + (r_lo * t->cols + c_lo) * es;
            float amax;
            if (p->mode == WB_QUANT_MODE_APPLY) {
                amax = wb_amax_final(wb_f32_bits(p->amax_in[k]) & WB_F32_ABS);
            } else {
                uint32_t m = 0;
                for (uint64_t r = r_lo; r < r_hi; r++, x += t->cols * es) {
                    uint32_t a = ops->amax(x, w);
                    m = a > m ? a : m;
                }
                x = src + (r_lo * t->cols + c_lo) * es;
                if (p->mode == WB_QUANT_MODE_AMAX) {
                    p->amax_out[k] = wb_f32_from_bits(m > WB_F32_INF ? WB_F32_AMAX_NAN : m);
                    continue;
                }
                amax = wb_amax_final(m);
            }
            float s = wb_amax_scale(amax);
            uint8_t *q = p->q + r_lo * t->cols + c_lo;
            for (uint64_t r = r_lo; r < r_hi; r++, x += t->cols * es, q += t->cols)
                ops->apply(x, w, s, q);
            if (p->scale_inv)
                p->scale_inv[k] = wb_amax_scale_inv(amax);
        }
    }
}
