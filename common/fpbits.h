/* fpbits.h — bit-level float conversions shared, as the same source, by the CPU reference (C)
 * and the CUDA kernels (C++): e4m3fn encode/decode, bf16/fp16 <-> fp32, and the block scale
 * arithmetic. Writing them once with integer operations (rather than compiler intrinsics on one
 * side and library calls on the other) makes host and device results identical by construction;
 * only the e4m3 encode has a faster device twin (the cvt instruction), checked against this one
 * over all 2^32 inputs by scripts/gpu/quant_check.sh.
 *
 * These are the project's only float converters: common.h includes this file, so the synthetic
 * source, the quant CPU reference and kernels, and the reference check all round (and turn NaN
 * into the canonical quiet NaN) the same way, as PyTorch does.
 */
#ifndef WB_COMMON_FPBITS_H
#define WB_COMMON_FPBITS_H

#include <stdint.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

#ifdef __CUDACC__
#define WB_FP_FN static __host__ __device__ __forceinline__
#else
#define WB_FP_FN static inline
#endif

/* Bit patterns used below. */
enum {
    WB_F32_ABS = 0x7fffffff,
    WB_F32_INF = 0x7f800000,
    WB_F32_QNAN = 0x7fc00000,         /* canonical quiet NaN of the casts */
    WB_F32_AMAX_NAN = 0x7fffffff,     /* the NaN CUDA arithmetic produces; amax uses it */
    WB_F32_448 = 0x43e00000,          /* 448.0f, the largest e4m3fn value */
    WB_F32_E4M3_MINNORM = 0x3c800000, /* 2^-6 */
    WB_F32_2P14 = 0x46800000,         /* 2^14: its ulp is 2^-9, the e4m3 subnormal step */
    WB_F32_AMAX_MIN = 0x38d1b717,     /* 1e-4f */
};

WB_FP_FN uint32_t wb_f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof(u));
    return u;
}

WB_FP_FN float wb_f32_from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}

/* |y| to e4m3fn, round to nearest even, saturating; y's sign is added back. NaN -> 0x7f. */
WB_FP_FN uint8_t wb_e4m3_encode(float y)
{
    uint32_t u = wb_f32_bits(y);
    uint32_t sign = (u >> 24) & 0x80;
    uint32_t a = u & WB_F32_ABS;
    if (a > WB_F32_INF)
        return 0x7f;
    if (a > WB_F32_448)
        a = WB_F32_448; /* satfinite: clamp, then 448 rounds to itself */
    uint32_t r;
    if (a < WB_F32_E4M3_MINNORM) /* subnormal: let an FP32 add round to multiples of 2^-9 */
        r = wb_f32_bits(wb_f32_from_bits(a) + 16384.0f) - WB_F32_2P14;
    else /* normal: round the mantissa to 3 bits, then rebias the exponent 127 -> 7 */
        r = ((a + 0x7ffff + ((a >> 20) & 1)) >> 20) - ((127 - 7) << 3);
    return (uint8_t)(r | sign);
}

WB_FP_FN float wb_e4m3_decode(uint8_t q)
{
    uint32_t sign = (uint32_t)(q & 0x80) << 24;
    uint32_t e = (q >> 3) & 0xf, m = q & 7;
    if ((q & 0x7f) == 0x7f)
        return wb_f32_from_bits(sign | WB_F32_QNAN);
    if (e == 0) /* m * 2^-9, exact in FP32 */
        return wb_f32_from_bits(wb_f32_bits((float)m * 0.001953125f) | sign);
    return wb_f32_from_bits(sign | ((e + 127 - 7) << 23) | (m << 20));
}

/* The block amax from the max of |x| as FP32 bits: NaN made canonical, clamped to 1e-4f. */
WB_FP_FN float wb_amax_final(uint32_t abs_bits)
{
    if (abs_bits > WB_F32_INF)
        return wb_f32_from_bits(WB_F32_AMAX_NAN);
    if (abs_bits < WB_F32_AMAX_MIN)
        return wb_f32_from_bits(WB_F32_AMAX_MIN);
    return wb_f32_from_bits(abs_bits);
}

/* s = (1 / amax) * 448 in two FP32 roundings, as torch computes 448 / amax. */
WB_FP_FN float wb_amax_scale(float amax)
{
    float r = 1.0f / amax;
    return r * 448.0f;
}

/* scale_inv = amax * fl(1/448), as torch on CUDA computes amax / 448.0. */
WB_FP_FN float wb_amax_scale_inv(float amax)
{
    return amax * (1.0f / 448.0f);
}

/* ---- bf16 / fp16 / fp32 */

WB_FP_FN float wb_bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    return wb_f32_from_bits((u & WB_F32_ABS) > WB_F32_INF ? (uint32_t)WB_F32_QNAN : u);
}

WB_FP_FN uint16_t wb_f32_to_bf16(float f)
{
    uint32_t u = wb_f32_bits(f);
    if ((u & WB_F32_ABS) > WB_F32_INF)
        return 0x7fc0;
    return (uint16_t)((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}

WB_FP_FN float wb_fp16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t e = (h >> 10) & 0x1f, m = h & 0x3ff;
    if (e == 0x1f)
        return wb_f32_from_bits(m ? (uint32_t)WB_F32_QNAN : (sign | WB_F32_INF));
    if (e == 0) /* subnormal or zero: m * 2^-24, exact in FP32 */
        return wb_f32_from_bits(wb_f32_bits((float)m * 5.9604644775390625e-8f) | sign);
    return wb_f32_from_bits(sign | ((e + 127 - 15) << 23) | (m << 13));
}

WB_FP_FN uint16_t wb_f32_to_fp16(float f)
{
    uint32_t u = wb_f32_bits(f);
    uint32_t sign = (u >> 16) & 0x8000;
    uint32_t a = u & WB_F32_ABS;
    uint32_t r;
    if (a > WB_F32_INF)
        return 0x7e00;
    if (a >= 0x47800000) /* >= 65536: infinity (65520 and up also round there below) */
        r = 0x7c00;
    else if (a < 0x38800000) /* < 2^-14: subnormal; an add to 0.5 rounds to multiples of 2^-24 */
        r = wb_f32_bits(wb_f32_from_bits(a) + 0.5f) - 0x3f000000;
    else
        r = (a + 0xfff + ((a >> 13) & 1) - ((127 - 15) << 23)) >> 13;
    return (uint16_t)(r | sign);
}

/* ---- the synthetic source's element function (common/synth.c, common/synth.cu) */

WB_FP_FN uint64_t wb_splitmix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* Element `index` of the stream (key, scale): 24 random bits -> [-1, 1), exactly representable
 * in FP32, times the stream's power-of-two scale, times 1, 1/2, 1/4 or 1/8 by runs of 2^14
 * elements (every step exact, so host and device agree). The runs make magnitudes differ from
 * one FP8 block to the next and from one FSDP shard to the next, as trained weights' do: with
 * one magnitude everywhere, every shard's partial amax would be the block's, and a lost amax
 * exchange would change no byte. */
WB_FP_FN float wb_synth_at(uint64_t key, float scale, uint64_t index)
{
    uint64_t u = wb_splitmix64(key + index);
    float x = (float)(int32_t)((u >> 40) & 0xffffff) * (1.0f / 8388608.0f) - 1.0f;
    uint32_t run = (uint32_t)(((key ^ (index >> 14)) * 0x9e3779b97f4a7c15ull) >> 62);
    return x * scale * (1.0f / (float)(1u << run));
}

#ifdef __cplusplus
}
#endif

#endif /* WB_COMMON_FPBITS_H */
