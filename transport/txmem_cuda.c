/* txmem_cuda.c — the memory helpers of transport.h in a CUDA build: host memory as without CUDA,
 * device memory with cudaMalloc, copies with cudaMemcpy(Default) so any pair of kinds works
 * (two GPUs: a peer copy). Without a usable GPU, device requests are -WB_E_NOGPU and host
 * copies never touch the CUDA runtime. Twin of txmem_nocuda.c. */
#include "transport/transport.h"

#include <cuda_runtime.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

int wb_tx_mem_alloc(enum wb_tx_mem kind, int device, size_t len, void **out)
{
    void *p = NULL;
    if (kind == WB_TX_MEM_HOST) {
        if (posix_memalign(&p, 4096, len ? len : 1) != 0)
            return -ENOMEM;
        *out = p;
        return 0;
    }
    if (wb_gpu_count() == 0)
        return -WB_E_NOGPU;
    if (device >= 0 && cudaSetDevice(device) != cudaSuccess)
        return -WB_E_CUDA;
    if (cudaMalloc(&p, len ? len : 1) != cudaSuccess) {
        (void)cudaGetLastError();
        return -ENOMEM;
    }
    *out = p;
    return 0;
}

void wb_tx_mem_free(enum wb_tx_mem kind, void *p)
{
    if (kind == WB_TX_MEM_HOST)
        free(p);
    else if (p)
        cudaFree(p);
}

/* Both host memory (1), a GPU's on either side (0), or the runtime could not say (-WB_E_CUDA:
 * a host copy of device memory would crash). */
static int both_host(const void *dst, const void *src)
{
    int d = wb_gpu_ptr_device(dst), s = wb_gpu_ptr_device(src);
    if (d == WB_GPU_UNKNOWN || s == WB_GPU_UNKNOWN)
        return -WB_E_CUDA;
    return d == WB_GPU_HOST && s == WB_GPU_HOST;
}

int wb_tx_mem_copy(void *dst, const void *src, size_t len)
{
    int host = both_host(dst, src);
    if (host < 0)
        return host;
    if (host) {
        memmove(dst, src, len);
        return 0;
    }
    /* From pageable host memory cudaMemcpy may return before its DMA reached the device: the
     * copy is waited for, so what a caller hands to another stream next (a transport's peer
     * copy of a checksum record) is there. */
    if (cudaMemcpy(dst, src, len, cudaMemcpyDefault) != cudaSuccess ||
        cudaStreamSynchronize(0) != cudaSuccess) {
        (void)cudaGetLastError();
        return -WB_E_CUDA;
    }
    return 0;
}

int wb_tx_mem_copy_reps(void *dst, const void *src, size_t len, size_t reps)
{
    int host = both_host(dst, src);
    if (host < 0)
        return host;
    if (host) {
        for (size_t i = 0; i < reps; i++)
            memcpy(dst, src, len);
        return 0;
    }
    /* Between two GPUs: a plain cudaMemcpyPeerAsync with peer access enabled, i.e. a direct
     * NVLink/PCIe copy, not a trip through host memory. */
    struct cudaPointerAttributes as, ad;
    bool peer = cudaPointerGetAttributes(&as, src) == cudaSuccess &&
                cudaPointerGetAttributes(&ad, dst) == cudaSuccess &&
                as.type == cudaMemoryTypeDevice && ad.type == cudaMemoryTypeDevice &&
                as.device != ad.device;
    if (peer) {
        int can = 0;
        cudaSetDevice(as.device);
        if (cudaDeviceCanAccessPeer(&can, as.device, ad.device) == cudaSuccess && can)
            cudaDeviceEnablePeerAccess(ad.device, 0); /* "already enabled" is fine */
    }
    (void)cudaGetLastError();
    cudaStream_t s;
    if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess)
        return -WB_E_CUDA;
    int r = 0;
    for (size_t i = 0; i < reps && !r; i++) {
        cudaError_t e = peer ? cudaMemcpyPeerAsync(dst, ad.device, src, as.device, len, s)
                             : cudaMemcpyAsync(dst, src, len, cudaMemcpyDefault, s);
        if (e != cudaSuccess)
            r = -WB_E_CUDA;
    }
    if (cudaStreamSynchronize(s) != cudaSuccess)
        r = -WB_E_CUDA;
    cudaStreamDestroy(s);
    if (r)
        (void)cudaGetLastError();
    return r;
}
