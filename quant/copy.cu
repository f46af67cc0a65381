/* copy.cu — the CUDA side of pack/unpack and of the bf16/fp16/fp32 casts, and the small device
 * memory helpers of quant.h.
 *
 * Pack/unpack: a box of a row-major tensor is a set of equal byte runs (wb_ranges) at offsets
 * that follow the box's outer dimensions. One kernel serves every box: a warp takes one chunk
 * of one run (up to 256 units), finds the run's offset by decoding the run index over the outer
 * dimensions, and copies with the widest unit (16, 8, 4, 2 or 1 bytes) that divides both
 * pointers, the run length and every stride. Why not cudaMemcpy2D/3D: they cover two or three
 * dimensions and limit pitches; boxes here have up to six.
 *
 * Casts: each thread converts eight consecutive elements with 16-byte accesses (element-wise at
 * the tail or on unaligned buffers), using the same fpbits.h functions as the CPU reference.
 */
#include "common/fpbits.h"
#include "quant/cuda_util.cuh"

namespace
{

enum { CHUNK_UNITS = 256, CAST_PER_THREAD = 8 };

/* A pack/unpack in units of the copy's width. */
struct CopyGeom {
    uint64_t count;  /* runs */
    uint64_t run;    /* units per run */
    uint64_t chunks; /* chunks per run */
    uint64_t base;   /* units from the tensor start to the first run */
    uint32_t nouter; /* outer dimensions iterated */
    uint64_t ext[WB_MAX_DIMS];
    uint64_t stride[WB_MAX_DIMS]; /* units between successive indices of each outer dim */
};

template <typename U, bool UNPACK>
__global__ void __launch_bounds__(256)
    copy_kernel(const U *__restrict__ src, U *__restrict__ dst, const CopyGeom g)
{
    const uint64_t lane = threadIdx.x & 31;
    const uint64_t nwarps = ((uint64_t)gridDim.x * blockDim.x) >> 5;
    const uint64_t items = g.count * g.chunks;
    for (uint64_t it = ((uint64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5; it < items;
         it += nwarps) {
        const uint64_t run = it / g.chunks, chunk = it % g.chunks;
        uint64_t off = g.base, rest = run;
        for (int d = (int)g.nouter - 1; d >= 0; d--) {
            off += (rest % g.ext[d]) * g.stride[d];
            rest /= g.ext[d];
        }
        const uint64_t packed = run * g.run;
        const uint64_t u0 = chunk * CHUNK_UNITS;
        const uint64_t n = min((uint64_t)CHUNK_UNITS, g.run - u0);
        const U *s = src + (UNPACK ? packed : off) + u0;
        U *d = dst + (UNPACK ? off : packed) + u0;
        if (n == CHUNK_UNITS) { /* all loads first, then all stores */
            U v[CHUNK_UNITS / 32];
#pragma unroll
            for (int k = 0; k < CHUNK_UNITS / 32; k++)
                v[k] = s[lane + 32 * k];
#pragma unroll
            for (int k = 0; k < CHUNK_UNITS / 32; k++)
                d[lane + 32 * k] = v[k];
        } else {
            for (uint64_t u = lane; u < n; u += 32)
                d[u] = s[u];
        }
    }
}

template <typename U>
cudaError_t launch_copy(const struct wb_quant_copy *c, CopyGeom g, cudaStream_t st)
{
    const size_t w = sizeof(U);
    g.run /= w;
    g.base /= w;
    for (uint32_t d = 0; d < g.nouter; d++)
        g.stride[d] /= w;
    g.chunks = (g.run + CHUNK_UNITS - 1) / CHUNK_UNITS;
    const uint64_t warps = g.count * g.chunks;
    const unsigned ctas = (unsigned)min((warps + 7) / 8, (uint64_t)8192);
    if (c->unpack)
        copy_kernel<U, true>
            <<<ctas, 256, 0, st>>>(static_cast<const U *>(c->src), static_cast<U *>(c->dst), g);
    else
        copy_kernel<U, false>
            <<<ctas, 256, 0, st>>>(static_cast<const U *>(c->src), static_cast<U *>(c->dst), g);
    return cudaGetLastError();
}

/* ---- casts */

template <int FROM> __device__ __forceinline__ float load_f32(const void *src, uint64_t i)
{
    if (FROM == WB_DTYPE_BF16)
        return wb_bf16_to_f32(static_cast<const uint16_t *>(src)[i]);
    if (FROM == WB_DTYPE_FP16)
        return wb_fp16_to_f32(static_cast<const uint16_t *>(src)[i]);
    const uint32_t u = static_cast<const uint32_t *>(src)[i];
    return wb_f32_from_bits((u & WB_F32_ABS) > WB_F32_INF ? WB_F32_QNAN : u);
}

template <int TO> __device__ __forceinline__ void store_f32(void *dst, uint64_t i, float f)
{
    if (TO == WB_DTYPE_BF16)
        static_cast<uint16_t *>(dst)[i] = wb_f32_to_bf16(f);
    else if (TO == WB_DTYPE_FP16)
        static_cast<uint16_t *>(dst)[i] = wb_f32_to_fp16(f);
    else
        static_cast<float *>(dst)[i] = f;
}

template <int FROM, int TO>
__global__ void __launch_bounds__(256)
    cast_kernel(const void *__restrict__ src, void *__restrict__ dst, uint64_t n, bool vec)
{
    constexpr int SB = FROM == WB_DTYPE_FP32 ? 4 : 2, DB = TO == WB_DTYPE_FP32 ? 4 : 2;
    const uint64_t stride = (uint64_t)gridDim.x * blockDim.x * CAST_PER_THREAD;
    for (uint64_t i = ((uint64_t)blockIdx.x * blockDim.x + threadIdx.x) * CAST_PER_THREAD; i < n;
         i += stride) {
        if (vec && i + CAST_PER_THREAD <= n) {
            uint4 in[SB / 2], out[DB / 2];
            const uint4 *s =
                reinterpret_cast<const uint4 *>(static_cast<const char *>(src) + i * SB);
#pragma unroll
            for (int k = 0; k < SB / 2; k++)
                in[k] = __ldg(s + k);
#pragma unroll
            for (int k = 0; k < CAST_PER_THREAD; k++)
                store_f32<TO>(out, k, load_f32<FROM>(in, k));
            uint4 *d = reinterpret_cast<uint4 *>(static_cast<char *>(dst) + i * DB);
#pragma unroll
            for (int k = 0; k < DB / 2; k++)
                d[k] = out[k];
        } else {
            const uint64_t end = min(i + CAST_PER_THREAD, n);
            for (uint64_t j = i; j < end; j++)
                store_f32<TO>(dst, j, load_f32<FROM>(src, j));
        }
    }
}

template <int FROM, int TO>
cudaError_t launch_cast(const void *src, void *dst, uint64_t n, bool vec, cudaStream_t st)
{
    const uint64_t threads = (n + CAST_PER_THREAD - 1) / CAST_PER_THREAD;
    const unsigned ctas = (unsigned)min((threads + 255) / 256, (uint64_t)16384);
    cast_kernel<FROM, TO><<<ctas, 256, 0, st>>>(src, dst, n, vec);
    return cudaGetLastError();
}

template <int FROM>
cudaError_t launch_cast_to(enum wb_dtype to, const void *src, void *dst, uint64_t n, bool vec,
                           cudaStream_t st)
{
    switch (to) {
    case WB_DTYPE_BF16:
        return launch_cast<FROM, WB_DTYPE_BF16>(src, dst, n, vec, st);
    case WB_DTYPE_FP16:
        return launch_cast<FROM, WB_DTYPE_FP16>(src, dst, n, vec, st);
    default:
        return launch_cast<FROM, WB_DTYPE_FP32>(src, dst, n, vec, st);
    }
}

} // namespace

extern "C" int qt_dev_copy(const struct wb_quant_copy *c, void *stream)
{
    const struct wb_ranges *r = &c->ranges;
    CopyGeom g = {};
    g.count = r->count;
    g.run = r->run_bytes;
    g.nouter = r->shape.ndim ? r->outer : 0;
    /* Byte strides of the dims, then the offset of the first run (as in wb_ranges_next). */
    uint64_t stride[WB_MAX_DIMS];
    uint64_t s = r->elem;
    for (uint32_t d = r->shape.ndim; d-- > 0;) {
        stride[d] = s;
        s *= r->shape.dim[d];
    }
    for (uint32_t d = 0; d < r->shape.ndim && d <= r->outer; d++)
        g.base += r->box.off[d] * stride[d];
    uint64_t align = (uintptr_t)c->src | (uintptr_t)c->dst | g.run | g.base;
    for (uint32_t d = 0; d < g.nouter; d++) {
        g.ext[d] = r->box.ext[d];
        g.stride[d] = stride[d];
        align |= stride[d];
    }
    cudaStream_t st = static_cast<cudaStream_t>(stream);
    cudaError_t e;
    if (align % 16 == 0)
        e = launch_copy<uint4>(c, g, st);
    else if (align % 8 == 0)
        e = launch_copy<uint2>(c, g, st);
    else if (align % 4 == 0)
        e = launch_copy<uint32_t>(c, g, st);
    else if (align % 2 == 0)
        e = launch_copy<uint16_t>(c, g, st);
    else
        e = launch_copy<uint8_t>(c, g, st);
    return wb_quant_cuda_err(e, "pack/unpack kernel launch");
}

extern "C" int qt_dev_cast(enum wb_dtype from, const void *src, enum wb_dtype to, void *dst,
                           uint64_t n, void *stream)
{
    cudaStream_t st = static_cast<cudaStream_t>(stream);
    if (from == to)
        return wb_quant_cuda_err(
            cudaMemcpyAsync(dst, src, n * wb_dtype_size(from), cudaMemcpyDeviceToDevice, st),
            "cast copy");
    const bool vec = ((uintptr_t)src % 16 == 0) && ((uintptr_t)dst % 16 == 0);
    cudaError_t e;
    switch (from) {
    case WB_DTYPE_BF16:
        e = launch_cast_to<WB_DTYPE_BF16>(to, src, dst, n, vec, st);
        break;
    case WB_DTYPE_FP16:
        e = launch_cast_to<WB_DTYPE_FP16>(to, src, dst, n, vec, st);
        break;
    default:
        e = launch_cast_to<WB_DTYPE_FP32>(to, src, dst, n, vec, st);
        break;
    }
    return wb_quant_cuda_err(e, "cast kernel launch");
}

/* ---- device buffers */

extern "C" int wb_quant_gpu_alloc(size_t bytes, void **out)
{
    void *p = NULL;
    int rc = wb_quant_cuda_err(cudaMalloc(&p, bytes ? bytes : 1), "cudaMalloc");
    if (rc)
        return rc;
    *out = p;
    return 0;
}

extern "C" void wb_quant_gpu_free(void *p)
{
    if (p)
        (void)cudaFree(p);
}

extern "C" int wb_quant_gpu_copy(void *dst, const void *src, size_t bytes, void *stream)
{
    return wb_quant_cuda_err(
        cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, static_cast<cudaStream_t>(stream)),
        "cudaMemcpyAsync");
}

extern "C" int wb_quant_gpu_sync(void *stream)
{
    return wb_quant_cuda_err(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)),
                             "cudaStreamSynchronize");
}
