/* synth.cu — the synthetic source on the GPU: wb_synth_fill_async's kernel. Element k of the
 * box (row-major over the box's extents) gets the value of global element lin(k) from the same
 * element function as the CPU (fpbits.h), converted by the same converters, so the bytes equal
 * wb_synth_fill's (checked by tests/unit/gpu_cuda_test.c on a GPU machine). */
extern "C" {
#include "common/common.h"
}

#include <cuda_runtime.h>

namespace
{

struct FillArgs {
    uint64_t key;
    float scale;
    int dtype;
    uint32_t ndim;
    uint64_t n;
    uint64_t dim[WB_MAX_DIMS], off[WB_MAX_DIMS], ext[WB_MAX_DIMS];
};

__global__ void fill_kernel(const FillArgs a, void *dst)
{
    const uint64_t step = (uint64_t)gridDim.x * blockDim.x;
    for (uint64_t k = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; k < a.n; k += step) {
        /* the box coordinates of k, then the global linear index */
        uint64_t rest = k, lin = 0, mul = 1;
        for (uint32_t d = a.ndim; d-- > 0;) {
            uint64_t c = rest % a.ext[d];
            rest /= a.ext[d];
            lin += (a.off[d] + c) * mul;
            mul *= a.dim[d];
        }
        float v = wb_synth_at(a.key, a.scale, lin);
        if (a.dtype == WB_DTYPE_FP32)
            static_cast<float *>(dst)[k] = v;
        else if (a.dtype == WB_DTYPE_BF16)
            static_cast<uint16_t *>(dst)[k] = wb_f32_to_bf16(v);
        else
            static_cast<uint16_t *>(dst)[k] = wb_f32_to_fp16(v);
    }
}

} // namespace

extern "C" int cm_synth_launch(uint64_t key, float scale, enum wb_dtype dtype,
                               const struct wb_shape *shape, const struct wb_box *box, void *dst,
                               void *stream)
{
    FillArgs a;
    a.key = key;
    a.scale = scale;
    a.dtype = dtype;
    a.ndim = box->ndim;
    a.n = wb_box_numel(box);
    for (uint32_t d = 0; d < box->ndim; d++) {
        a.dim[d] = shape->dim[d];
        a.off[d] = box->off[d];
        a.ext[d] = box->ext[d];
    }
    if (a.n == 0)
        return 0;
    uint64_t blocks = (a.n + 255) / 256;
    if (blocks > 65536)
        blocks = 65536;
    fill_kernel<<<(unsigned)blocks, 256, 0, static_cast<cudaStream_t>(stream)>>>(a, dst);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) {
        wb_log(WB_LOG_ERROR, "synth", "fill kernel launch: %s", cudaGetErrorString(e));
        return -WB_E_CUDA;
    }
    return 0;
}
