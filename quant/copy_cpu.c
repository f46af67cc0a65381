/* copy_cpu.c — the CPU reference of pack/unpack (a box of a row-major tensor to or from a
 * contiguous buffer, by the byte runs wb_ranges yields) and of the bf16/fp16/fp32 casts (one
 * element at a time through fpbits.h, the code the CUDA cast kernel runs too). */
#include "quant/quant_int.h"

#include "common/fpbits.h"

void qt_cpu_copy(const struct wb_quant_copy *c)
{
    struct wb_ranges r = c->ranges;
    uint64_t off, len, packed = 0;
    while (wb_ranges_next(&r, &off, &len)) {
        if (c->unpack)
            memcpy((char *)c->dst + off, (const char *)c->src + packed, len);
        else
            memcpy((char *)c->dst + packed, (const char *)c->src + off, len);
        packed += len;
    }
}

static float load_f32(enum wb_dtype dt, const void *src, uint64_t i)
{
    switch (dt) {
    case WB_DTYPE_BF16:
        return wb_bf16_to_f32(((const uint16_t *)src)[i]);
    case WB_DTYPE_FP16:
        return wb_fp16_to_f32(((const uint16_t *)src)[i]);
    default: {
        uint32_t u = wb_f32_bits(((const float *)src)[i]);
        return wb_f32_from_bits((u & WB_F32_ABS) > WB_F32_INF ? WB_F32_QNAN : u);
    }
    }
}

void qt_cpu_cast(enum wb_dtype from, const void *src, enum wb_dtype to, void *dst, uint64_t n)
{
    if (from == to) {
        memcpy(dst, src, n * wb_dtype_size(from));
        return;
    }
    /* Every source value is exact in FP32, so going through FP32 rounds once. */
    switch (to) {
    case WB_DTYPE_BF16:
        for (uint64_t i = 0; i < n; i++)
            ((uint16_t *)dst)[i] = wb_f32_to_bf16(load_f32(from, src, i));
        break;
    case WB_DTYPE_FP16:
        for (uint64_t i = 0; i < n; i++)
            ((uint16_t *)dst)[i] = wb_f32_to_fp16(load_f32(from, src, i));
        break;
    default:
        for (uint64_t i = 0; i < n; i++)
            ((float *)dst)[i] = load_f32(from, src, i);
        break;
    }
}
