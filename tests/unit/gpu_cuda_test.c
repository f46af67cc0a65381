/* gpu_cuda_test.c — the optional-GPU helpers against real CUDA allocations (CUDA builds only;
 * skipped on machines without a GPU). */
#include "common/common.h"
#include "tests/wbtest.h"

#include <cuda_runtime.h>

static void test_pointer_kinds(void)
{
    if (wb_gpu_count() == 0)
        wb_test_skip("no GPU on this machine");
    void *dev = NULL, *pinned = NULL;
    int stack = 0;
    CHECK_INT(cudaMalloc(&dev, 4096), cudaSuccess);
    CHECK_INT(cudaMallocHost(&pinned, 4096), cudaSuccess);
    CHECK(wb_gpu_is_device_ptr(dev));
    CHECK(wb_gpu_is_device_ptr((char *)dev + 4095));
    CHECK(!wb_gpu_is_device_ptr(pinned));
    CHECK(!wb_gpu_is_device_ptr(&stack));
    CHECK_INT(cudaFree(dev), cudaSuccess);
    CHECK_INT(cudaFreeHost(pinned), cudaSuccess);
}

const struct wb_test wb_tests[] = {
    {"pointer_kinds", test_pointer_kinds, 0},
    {0},
};
