/* gpu.cu — the agent's CUDA helpers: device selection, one stream, events the executor polls
 * (so the CPU loop never blocks on GPU work), asynchronous copies and the partial-amax merge
 * kernel. Built only with CUDA; gpu_nocuda.c has the same calls returning -WB_E_NOGPU. */
extern "C" {
#include "common/common.h"
#include "common/fault.h"
}
#include "agent/gpu.h"

#include <cuda_runtime.h>
#include <errno.h>
#include <stdlib.h>

/* cu(call): 0 or -WB_E_CUDA, logged; make fault can fail the call (WB_CUDA). */
#define cu(call) cu_result(WB_CUDA(call))
static int cu_result(cudaError_t e)
{
    if (e == cudaSuccess)
        return 0;
    wb_log(WB_LOG_ERROR, "agent", "cuda: %s", cudaGetErrorString(e));
    return -WB_E_CUDA;
}

extern "C" int ag_gpu_use(int device)
{
    if (wb_gpu_count() <= 0)
        return -WB_E_NOGPU;
    return cu(cudaSetDevice(device));
}

typedef int (*addr_range_fn)(unsigned long long *base, size_t *size, unsigned long long p);

extern "C" int ag_gpu_addr_range(const void *p, uintptr_t *base, uint64_t *size)
{
    static addr_range_fn fn; /* resolved once; the driver's entry point never changes */
    if (!fn) {
        void *f = NULL;
        cudaDriverEntryPointQueryResult q;
        int e = cu(cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &f, 12000,
                                                    cudaEnableDefault, &q));
        if (e || q != cudaDriverEntryPointSuccess || !f)
            return e ? e : -WB_E_CUDA;
        fn = (addr_range_fn)f;
    }
    unsigned long long b = 0;
    size_t n = 0;
    if (fn(&b, &n, (unsigned long long)(uintptr_t)p) != 0) /* CUDA_SUCCESS */
        return -EINVAL;
    *base = (uintptr_t)b;
    *size = n;
    return 0;
}

extern "C" int ag_stream_create(void **out)
{
    cudaStream_t s;
    int e = cu(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    if (!e)
        *out = (void *)s;
    return e;
}

extern "C" void ag_stream_destroy(void *s)
{
    if (s)
        cudaStreamDestroy((cudaStream_t)s);
}

extern "C" int ag_event_record(void *stream, void **out)
{
    cudaEvent_t ev;
    int e = cu(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    if (e)
        return e;
    e = cu(cudaEventRecord(ev, (cudaStream_t)stream));
    if (e) {
        cudaEventDestroy(ev);
        return e;
    }
    *out = (void *)ev;
    return 0;
}

extern "C" int ag_event_done(void *ev)
{
    cudaError_t e = WB_CUDA(cudaEventQuery((cudaEvent_t)ev));
    if (e == cudaSuccess)
        return 1;
    if (e == cudaErrorNotReady)
        return 0;
    return cu_result(e);
}

extern "C" void ag_event_destroy(void *ev)
{
    if (ev)
        cudaEventDestroy((cudaEvent_t)ev);
}

extern "C" int ag_stream_order(void *from, void *to)
{
    cudaEvent_t ev;
    int e = cu(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    if (e)
        return e;
    e = cu(cudaEventRecord(ev, (cudaStream_t)from));
    e = e ? e : cu(cudaStreamWaitEvent((cudaStream_t)to, ev, 0));
    cudaEventDestroy(ev); /* released once it has fired */
    return e;
}

extern "C" int ag_stream_sync(void *stream)
{
    return cu(cudaStreamSynchronize((cudaStream_t)stream));
}

extern "C" int ag_copy_async(void *dst, const void *src, size_t n, void *stream)
{
    if (!n)
        return 0;
    return cu(cudaMemcpyAsync(dst, src, n, cudaMemcpyDefault, (cudaStream_t)stream));
}

extern "C" int ag_memset_async(void *dst, int v, size_t n, void *stream)
{
    if (!n)
        return 0;
    return cu(cudaMemsetAsync(dst, v, n, (cudaStream_t)stream));
}

static __global__ void amax_merge_kernel(float *acc, const float *part, size_t n)
{
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i >= n)
        return;
    float a = acc[i], p = part[i];
    acc[i] = (isnan(a) || isnan(p)) ? __int_as_float(0x7fffffff) : fmaxf(a, p);
}

extern "C" int ag_amax_merge_async(float *acc, const float *part, size_t n, void *stream)
{
    if (!n)
        return 0;
    unsigned blocks = (unsigned)((n + 255) / 256);
    amax_merge_kernel<<<blocks, 256, 0, (cudaStream_t)stream>>>(acc, part, n);
    return cu(cudaGetLastError());
}

static __global__ void box_move_kernel(float *b_arr, struct wb_box b, const float *a_arr,
                                       struct wb_box a, struct wb_box in, uint64_t n, int merge)
{
    uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x;
    if (i >= n)
        return;
    uint64_t ia = 0, ib = 0, stride_a = 1, stride_b = 1, rest = i;
    for (int d = (int)in.ndim - 1; d >= 0; d--) { /* i's coordinates in `in`, last dim first */
        uint64_t g = in.off[d] + rest % in.ext[d];
        rest /= in.ext[d];
        ia += (g - a.off[d]) * stride_a;
        ib += (g - b.off[d]) * stride_b;
        stride_a *= a.ext[d];
        stride_b *= b.ext[d];
    }
    float v = a_arr[ia];
    if (merge) {
        float x = b_arr[ib];
        v = (isnan(x) || isnan(v)) ? __int_as_float(0x7fffffff) : fmaxf(x, v);
    }
    b_arr[ib] = v;
}

extern "C" int ag_box_move_async(float *b_arr, const struct wb_box *b, const float *a_arr,
                                 const struct wb_box *a, const struct wb_box *in, int merge,
                                 void *stream)
{
    uint64_t n = 1;
    for (uint32_t d = 0; d < in->ndim; d++)
        n *= in->ext[d];
    if (!n)
        return 0;
    unsigned blocks = (unsigned)((n + 255) / 256);
    box_move_kernel<<<blocks, 256, 0, (cudaStream_t)stream>>>(b_arr, *b, a_arr, *a, *in, n, merge);
    return cu(cudaGetLastError());
}

/* The transpose's geometry by value: per dst dim its extent, its stride in dst and the stride
 * in src of the src dim it is. */
struct perm_geo {
    uint32_t ndim;
    uint64_t ext[WB_MAX_DIMS], sstride[WB_MAX_DIMS];
};

/* One thread per dst element, dst written in order (coalesced), src read at the permuted
 * strides: what wb_permute() computes on the host, element for element. */
template <typename T>
static __global__ void permute_kernel(T *dst, const T *src, struct perm_geo g, uint64_t n)
{
    uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x;
    if (i >= n)
        return;
    uint64_t rest = i, si = 0;
    for (int k = (int)g.ndim - 1; k >= 0; k--) { /* i's coordinates in dst, last dim first */
        si += rest % g.ext[k] * g.sstride[k];
        rest /= g.ext[k];
    }
    dst[i] = src[si];
}

extern "C" int ag_permute_async(void *dst, const void *src, size_t elem, uint32_t ndim,
                                const uint64_t *ext, uint32_t perm, void *stream)
{
    if (ndim > WB_MAX_DIMS)
        return -EINVAL;
    uint64_t sstr[WB_MAX_DIMS], n = 1;
    for (uint32_t d = ndim; d-- > 0;) {
        sstr[d] = n;
        n *= ext[d];
    }
    struct perm_geo g = {ndim, {0}, {0}};
    uint32_t seen = 0;
    for (uint32_t k = 0; k < ndim; k++) {
        uint32_t j = (perm >> (4 * k)) & 15;
        if (j >= ndim || (seen >> j & 1))
            return -EINVAL;
        seen |= 1u << j;
        g.ext[k] = ext[j];
        g.sstride[k] = sstr[j];
    }
    if (!n)
        return 0;
    unsigned blocks = (unsigned)((n + 255) / 256);
    cudaStream_t s = (cudaStream_t)stream;
    switch (elem) {
    case 1:
        permute_kernel<<<blocks, 256, 0, s>>>((uint8_t *)dst, (const uint8_t *)src, g, n);
        break;
    case 2:
        permute_kernel<<<blocks, 256, 0, s>>>((uint16_t *)dst, (const uint16_t *)src, g, n);
        break;
    case 4:
        permute_kernel<<<blocks, 256, 0, s>>>((uint32_t *)dst, (const uint32_t *)src, g, n);
        break;
    case 8:
        permute_kernel<<<blocks, 256, 0, s>>>((uint64_t *)dst, (const uint64_t *)src, g, n);
        break;
    default:
        return -EINVAL;
    }
    return cu(cudaGetLastError());
}

extern "C" int ag_host_alloc(size_t n, void **out)
{
    void *p = NULL;
    if (wb_gpu_count() > 0) {
        int e = cu(cudaMallocHost(&p, n ? n : 1));
        if (e)
            return e;
    } else {
        p = calloc(1, n ? n : 1);
        if (!p)
            return -ENOMEM;
    }
    *out = p;
    return 0;
}

extern "C" void ag_host_free(void *p)
{
    if (!p)
        return;
    if (wb_gpu_count() > 0)
        cudaFreeHost(p);
    else
        free(p);
}
