/* gpu_cuda_test.c — the optional-GPU helpers against real CUDA allocations, and the synthetic
 * source's kernel against the CPU reference, byte for byte (CUDA builds only; skipped on
 * machines without a GPU). */
#include "common/common.h"
#include "tests/wbtest.h"

#include <cuda_runtime.h>
#include <errno.h>
#include <stdlib.h>

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

/* wb_synth_fill_async writes the very bytes wb_synth_fill computes: every dtype, whole tensors
 * and boxes of 1 to 4 dims (odd extents and offsets), two versions and seeds. */
static void test_synth_fill_device(void)
{
    if (wb_gpu_count() == 0)
        wb_test_skip("no GPU on this machine");
    static const struct {
        uint32_t ndim;
        uint64_t dim[4], off[4], ext[4];
    } cases[] = {
        {1, {1000003}, {0}, {1000003}},
        {1, {4097}, {129}, {3001}},
        {2, {768, 2048}, {0, 0}, {768, 2048}},
        {2, {1531, 777}, {128, 5}, {1000, 771}},
        {3, {16, 1536, 256}, {3, 100, 0}, {9, 1436, 256}},
        {4, {3, 5, 7, 129}, {1, 2, 3, 4}, {2, 3, 4, 125}},
    };
    static const enum wb_dtype dts[] = {WB_DTYPE_BF16, WB_DTYPE_FP16, WB_DTYPE_FP32};
    void *stream = NULL;
    CHECK_INT(cudaStreamCreate((cudaStream_t *)&stream), cudaSuccess);
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        struct wb_shape sh = {.ndim = cases[c].ndim};
        struct wb_box b = {.ndim = cases[c].ndim};
        for (uint32_t d = 0; d < sh.ndim; d++) {
            sh.dim[d] = cases[c].dim[d];
            b.off[d] = cases[c].off[d];
            b.ext[d] = cases[c].ext[d];
        }
        for (size_t k = 0; k < 3; k++) {
            uint64_t bytes = wb_box_numel(&b) * wb_dtype_size(dts[k]);
            uint8_t *want = malloc(bytes), *got = malloc(bytes);
            void *dev = NULL;
            CHECK(want && got);
            CHECK_INT(cudaMalloc(&dev, bytes), cudaSuccess);
            uint64_t version = 1 + c, seed = 42 + k;
            CHECK_INT(wb_synth_fill("model.layers.7.mlp.experts.3.up_proj.weight", seed, version,
                                    dts[k], &sh, &b, want),
                      0);
            CHECK_INT(wb_synth_fill_async("model.layers.7.mlp.experts.3.up_proj.weight", seed,
                                          version, dts[k], &sh, &b, dev, stream),
                      0);
            CHECK_INT(cudaStreamSynchronize((cudaStream_t)stream), cudaSuccess);
            CHECK_INT(cudaMemcpy(got, dev, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
            CHECK_MEM(got, want, bytes);
            CHECK_INT(cudaFree(dev), cudaSuccess);
            free(want);
            free(got);
        }
    }
    struct wb_shape sh = {.ndim = 2, .dim = {4, 4}};
    struct wb_box out = {.ndim = 2, .off = {2, 0}, .ext = {3, 4}};
    CHECK_INT(wb_synth_fill_async("t", 1, 1, WB_DTYPE_BF16, &sh, &out, NULL, stream), -EINVAL);
    struct wb_box in = {.ndim = 2, .off = {0, 0}, .ext = {4, 4}};
    CHECK_INT(wb_synth_fill_async("t", 1, 1, WB_DTYPE_FP8_E4M3, &sh, &in, NULL, stream), -EINVAL);
    CHECK_INT(cudaStreamDestroy((cudaStream_t)stream), cudaSuccess);
}

const struct wb_test wb_tests[] = {
    {"pointer_kinds", test_pointer_kinds, 0},
    {"synth_fill_device", test_synth_fill_device, 0},
    {0},
};
