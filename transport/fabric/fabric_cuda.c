/* fabric_cuda.c — the CUDA half of the libfabric backend's bounce/staging path: two streams per
 * transport (stream 0: device-to-host into bounce chunks, stream 1: host mirror to device),
 * pooled events to observe copies without blocking, pinned host memory for chunks and mirrors.
 * One stream per direction keeps each direction's copies in order, so the backend only ever
 * queries the oldest event. Twin of fabric_nocuda.c. */
#include "common/fault.h"
#include "transport/fabric/fabric.h"

#include <cuda_runtime.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

struct fab_gpu {
    int device;
    cudaStream_t s[2];
    cudaEvent_t *spare; /* events ready for reuse */
    size_t nspare, cap;
};

bool fab_gpu_available(void)
{
    return wb_gpu_count() > 0;
}

int fab_gpu_open(int device, struct fab_gpu **out)
{
    struct fab_gpu *g = calloc(1, sizeof(*g));
    if (!g)
        return -ENOMEM;
    g->device = device;
    if (cudaSetDevice(device) != cudaSuccess)
        goto err_free;
    if (cudaStreamCreateWithFlags(&g->s[0], cudaStreamNonBlocking) != cudaSuccess)
        goto err_free;
    if (cudaStreamCreateWithFlags(&g->s[1], cudaStreamNonBlocking) != cudaSuccess)
        goto err_stream0;
    *out = g;
    return 0;

err_stream0:
    cudaStreamDestroy(g->s[0]);
err_free:
    (void)cudaGetLastError();
    free(g);
    return -WB_E_CUDA;
}

void fab_gpu_close(struct fab_gpu *g)
{
    if (!g)
        return;
    cudaStreamSynchronize(g->s[0]);
    cudaStreamSynchronize(g->s[1]);
    for (size_t i = 0; i < g->nspare; i++)
        cudaEventDestroy(g->spare[i]);
    free(g->spare);
    cudaStreamDestroy(g->s[0]);
    cudaStreamDestroy(g->s[1]);
    (void)cudaGetLastError();
    free(g);
}

int fab_gpu_host_alloc(size_t len, bool pinned, void **out)
{
    void *p = NULL;
    if (pinned) {
        if (cudaHostAlloc(&p, len, cudaHostAllocPortable) != cudaSuccess) {
            (void)cudaGetLastError();
            return -ENOMEM;
        }
    } else if (posix_memalign(&p, 4096, len) != 0) {
        return -ENOMEM;
    }
    *out = p;
    return 0;
}

void fab_gpu_host_free(void *p, bool pinned)
{
    if (pinned)
        cudaFreeHost(p);
    else
        free(p);
}

static void event_release(struct fab_gpu *g, cudaEvent_t e)
{
    if (g->nspare == g->cap && wb_grow(&g->spare, &g->cap, 64, sizeof(*g->spare)) != 0) {
        cudaEventDestroy(e);
        return;
    }
    g->spare[g->nspare++] = e;
}

int fab_gpu_copy(struct fab_gpu *g, int stream, void *dst, const void *src, size_t len, void **ev,
                 int *native)
{
    if (!g) { /* no device memory registered: host staging */
        memcpy(dst, src, len);
        *ev = NULL;
        return 0;
    }
    /* The caller's thread may have another current device (PyTorch switches it freely); the
     * streams and events belong to g->device. */
    cudaEvent_t e;
    cudaError_t r = WB_CUDA(cudaSetDevice(g->device));
    if (r != cudaSuccess)
        goto err;
    if (g->nspare)
        e = g->spare[--g->nspare];
    else if ((r = cudaEventCreateWithFlags(&e, cudaEventDisableTiming)) != cudaSuccess)
        goto err;
    r = WB_CUDA(cudaMemcpyAsync(dst, src, len, cudaMemcpyDefault, g->s[stream]));
    if (r == cudaSuccess)
        r = cudaEventRecord(e, g->s[stream]);
    if (r != cudaSuccess) {
        event_release(g, e);
        goto err;
    }
    *ev = e;
    return 0;

err:
    *native = (int)r;
    (void)cudaGetLastError();
    return -WB_E_CUDA;
}

int fab_gpu_done(struct fab_gpu *g, void *ev, int *native)
{
    if (!ev)
        return 1;
    cudaEvent_t e = ev;
    cudaError_t r = WB_CUDA(cudaEventQuery(e));
    if (r == cudaErrorNotReady)
        return 0;
    event_release(g, e);
    if (r == cudaSuccess)
        return 1;
    *native = (int)r;
    (void)cudaGetLastError();
    return -WB_E_CUDA;
}
