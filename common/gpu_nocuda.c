/* gpu_nocuda.c — the optional-GPU helpers in a build without CUDA: no devices, host memory. */
#include "common/common.h"

int wb_gpu_count(void)
{
    return 0;
}

int wb_gpu_ptr_device(const void *p)
{
    (void)p;
    return WB_GPU_HOST;
}

bool wb_gpu_is_device_ptr(const void *p)
{
    (void)p;
    return false;
}

bool wb_gpu_built(void)
{
    return false;
}
