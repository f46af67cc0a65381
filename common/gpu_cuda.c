/* gpu_cuda.c — the optional-GPU helpers when built with CUDA. Every call tolerates a machine
 * without a GPU or driver: the runtime then reports no devices and pointers are host memory. */
#include "common/common.h"
#include "common/fault.h"

#include <cuda_runtime.h>

#include <stdatomic.h>

int wb_gpu_count(void)
{
    static atomic_int known = -1; /* the first answer, kept: the devices do not change */
    int n = atomic_load(&known);
    if (n >= 0)
        return n;
    n = 0;
    if (WB_CUDA(cudaGetDeviceCount(&n)) != cudaSuccess) {
        (void)cudaGetLastError(); /* clear the sticky "no device" error */
        n = 0;
    }
    int expect = -1;
    return atomic_compare_exchange_strong(&known, &expect, n) ? n : expect;
}

int wb_gpu_ptr_device(const void *p)
{
    if (!p || wb_gpu_count() == 0)
        return WB_GPU_HOST;
    struct cudaPointerAttributes a;
    if (WB_CUDA(cudaPointerGetAttributes(&a, p)) != cudaSuccess) {
        (void)cudaGetLastError();
        return WB_GPU_UNKNOWN;
    }
    /* Managed memory is host-accessible and treated like host memory. */
    return a.type == cudaMemoryTypeDevice ? a.device : WB_GPU_HOST;
}

bool wb_gpu_is_device_ptr(const void *p)
{
    return wb_gpu_ptr_device(p) >= 0;
}

bool wb_gpu_built(void)
{
    return true;
}
