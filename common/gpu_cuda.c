/* gpu_cuda.c — the optional-GPU helpers when built with CUDA. Every call tolerates a machine
 * without a GPU or driver: the runtime then reports no devices and pointers are host memory. */
#include "common/common.h"
#include "common/fault.h"

#include <cuda_runtime.h>

int wb_gpu_count(void)
{
    int n = 0;
    if (WB_CUDA(cudaGetDeviceCount(&n)) != cudaSuccess) {
        (void)cudaGetLastError(); /* clear the sticky "no device" error */
        return 0;
    }
    return n;
}

bool wb_gpu_is_device_ptr(const void *p)
{
    if (!p || wb_gpu_count() == 0)
        return false;
    struct cudaPointerAttributes a;
    if (WB_CUDA(cudaPointerGetAttributes(&a, p)) != cudaSuccess) {
        (void)cudaGetLastError();
        return false;
    }
    return a.type == cudaMemoryTypeDevice;
}

bool wb_gpu_built(void)
{
    return true;
}
