/* nvref.cu — NVIDIA's own host conversion to e4m3fn, __nv_cvt_float_to_fp8(x, __NV_SATFINITE,
 * __NV_E4M3) from cuda_fp8.h, wrapped for C callers. cuda_fp8.h is C++, so this file exists
 * only to let the C tests check wb_e4m3_encode() and the CPU reference against NVIDIA's
 * definition (built only with CUDA; dev_nocuda.c answers -ENOTSUP otherwise). */
#include "quant/quant_int.h"

#include <cuda_fp8.h>

extern "C" int qt_nvref_e4m3(float x, uint8_t *out)
{
    *out = (uint8_t)__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3);
    return 0;
}
