/* cuda_util.cuh — what the CUDA files of quant/ share: the C headers with C linkage, and the
 * conversion of CUDA runtime errors into the project's codes at the API boundary.
 * Private to quant/ (C++, CUDA builds only). */
#ifndef WB_QUANT_CUDA_UTIL_CUH
#define WB_QUANT_CUDA_UTIL_CUH

extern "C" {
#include "common/common.h"
}
#include "quant/quant_int.h"

#include <cuda_runtime.h>
#include <errno.h>

/* 0 for cudaSuccess; -WB_E_NOGPU when there is no usable device or driver; -WB_E_CUDA (logged
 * with the call's name) for any other failure. */
static inline int wb_quant_cuda_err(cudaError_t e, const char *what)
{
    if (e == cudaSuccess)
        return 0;
    (void)cudaGetLastError(); /* clear a non-sticky error so later calls are not blamed */
    if (e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver ||
        e == cudaErrorInitializationError || e == cudaErrorStubLibrary)
        return -WB_E_NOGPU;
    wb_log(WB_LOG_ERROR, "quant", "%s: %s", what, cudaGetErrorString(e));
    return -WB_E_CUDA;
}

/* The last item whose `first` is <= p, among n items sorted by `first` (the batch kernels:
 * which item CTA p works on). */
template <class T>
__device__ __forceinline__ uint32_t wb_quant_dev_find(const T *__restrict__ items, uint32_t n,
                                                      uint64_t p)
{
    uint32_t lo = 0, hi = n - 1;
    while (lo < hi) {
        uint32_t mid = (lo + hi + 1) / 2;
        if (items[mid].first <= p)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

#endif /* WB_QUANT_CUDA_UTIL_CUH */
