/* gpu_cuda_test.c — the optional-GPU helpers against real CUDA allocations, the synthetic
 * source's kernel against the CPU reference, byte for byte, and the checksum kernel's batches
 * against wb_sum64 on the host (CUDA builds only; skipped on machines without a GPU). */
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
    int cur = -1;
    CHECK_INT(cudaGetDevice(&cur), cudaSuccess);
    CHECK_INT(wb_gpu_ptr_device(dev), cur);
    CHECK_INT(wb_gpu_ptr_device(pinned), WB_GPU_HOST);
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

static uint64_t rnd(uint64_t *x)
{
    *x = *x * 6364136223846793005ull + 1442695040888963407ull;
    return *x >> 11;
}

/* wb_sum_gpu_run over batches of pieces of one device buffer — random lengths 0..70000 at
 * random (mostly unaligned) offsets, whole aligned chunks, overlapping and empty pieces, one
 * piece of 64 MiB + 3 — gives wb_sum64 of the same bytes on the host; the buffers are reused
 * and grown between batches; an asynchronous launch read after an event gives the same. */
static void test_sum_batch(void)
{
    if (wb_gpu_count() == 0)
        wb_test_skip("no GPU on this machine");
    size_t bytes = (64u << 20) + 4096;
    uint8_t *host = malloc(bytes);
    void *dev = NULL, *stream = NULL;
    CHECK(host);
    uint64_t x = 12345;
    for (size_t i = 0; i < bytes; i += 8) {
        uint64_t v = rnd(&x) ^ (rnd(&x) << 40);
        memcpy(host + i, &v, 8);
    }
    CHECK_INT(cudaMalloc(&dev, bytes), cudaSuccess);
    CHECK_INT(cudaMemcpy(dev, host, bytes, cudaMemcpyHostToDevice), cudaSuccess);
    CHECK_INT(cudaStreamCreate((cudaStream_t *)&stream), cudaSuccess);
    struct wb_sum_gpu *g = NULL;
    CHECK_INT(wb_sum_gpu_new(&g), 0);
    enum { MAXP = 2000 };
    struct wb_sum_piece *pc = calloc(MAXP, sizeof(*pc));
    uint64_t *got = calloc(MAXP, sizeof(uint64_t));
    size_t *off = calloc(MAXP, sizeof(size_t));
    CHECK(pc && got && off);
    static const size_t counts[] = {1, 7, 300, MAXP, 50};
    for (size_t b = 0; b < WB_ARRAY_LEN(counts); b++) {
        size_t n = counts[b];
        for (size_t i = 0; i < n; i++) {
            uint64_t len = rnd(&x) % 70001;
            if (i % 17 == 3)
                len = 0;
            else if (i % 11 == 5)
                len = 4096 * (1 + rnd(&x) % 16); /* whole chunks */
            off[i] = rnd(&x) % (bytes - len);
            if (i % 5 == 0)
                off[i] &= ~(size_t)7; /* word-aligned starts too */
            pc[i] = (struct wb_sum_piece){(uint8_t *)dev + off[i], len};
        }
        if (b == 2) { /* one large piece */
            pc[0] = (struct wb_sum_piece){(uint8_t *)dev + 1, (64u << 20) + 3};
            off[0] = 1;
        }
        CHECK_INT(wb_sum_gpu_run(g, pc, n, stream, got), 0);
        for (size_t i = 0; i < n; i++) {
            uint64_t want = wb_sum64(host + off[i], pc[i].len);
            if (got[i] != want)
                wb_test_fail(__FILE__, __LINE__,
                             "batch %zu piece %zu (%" PRIu64
                             " bytes at offset %zu): GPU %016" PRIx64 ", host %016" PRIx64,
                             b, i, pc[i].len, off[i], got[i], want);
        }
    }
    /* asynchronous: launch, an event, the results */
    cudaEvent_t ev;
    CHECK_INT(cudaEventCreate(&ev), cudaSuccess);
    pc[0] = (struct wb_sum_piece){(uint8_t *)dev + 4096, 70000};
    pc[1] = (struct wb_sum_piece){(uint8_t *)dev + 3, 5};
    CHECK_INT(wb_sum_gpu_launch(g, pc, 2, stream), 0);
    CHECK_INT(cudaEventRecord(ev, (cudaStream_t)stream), cudaSuccess);
    CHECK_INT(cudaEventSynchronize(ev), cudaSuccess);
    CHECK_U64(wb_sum_gpu_result(g, 0), wb_sum64(host + 4096, 70000));
    CHECK_U64(wb_sum_gpu_result(g, 1), wb_sum64(host + 3, 5));
    /* a batch of empty pieces launches nothing and still gives their sums */
    pc[0] = (struct wb_sum_piece){dev, 0};
    CHECK_INT(wb_sum_gpu_run(g, pc, 1, stream, got), 0);
    CHECK_U64(got[0], wb_sum64(NULL, 0));
    CHECK_INT(wb_sum_gpu_run(g, pc, 0, stream, got), 0);
    CHECK_INT(cudaEventDestroy(ev), cudaSuccess);
    wb_sum_gpu_free(g);
    CHECK_INT(cudaStreamDestroy((cudaStream_t)stream), cudaSuccess);
    CHECK_INT(cudaFree(dev), cudaSuccess);
    free(host);
    free(pc);
    free(got);
    free(off);
}

/* A changed byte on the device changes the GPU sum of the piece holding it, and only that one. */
static void test_sum_batch_flip(void)
{
    if (wb_gpu_count() == 0)
        wb_test_skip("no GPU on this machine");
    enum { N = 64, LEN = 9000 };
    uint8_t *host = calloc(N, LEN);
    void *dev = NULL;
    CHECK(host);
    uint64_t x = 7;
    for (size_t i = 0; i < (size_t)N * LEN; i++)
        host[i] = (uint8_t)rnd(&x);
    CHECK_INT(cudaMalloc(&dev, (size_t)N * LEN), cudaSuccess);
    CHECK_INT(cudaMemcpy(dev, host, (size_t)N * LEN, cudaMemcpyHostToDevice), cudaSuccess);
    struct wb_sum_gpu *g = NULL;
    CHECK_INT(wb_sum_gpu_new(&g), 0);
    struct wb_sum_piece pc[N];
    uint64_t before[N], after[N];
    for (size_t i = 0; i < N; i++)
        pc[i] = (struct wb_sum_piece){(uint8_t *)dev + i * LEN, LEN};
    CHECK_INT(wb_sum_gpu_run(g, pc, N, NULL, before), 0);
    for (int k = 0; k < 40; k++) {
        size_t at = (size_t)rnd(&x) % ((size_t)N * LEN);
        uint8_t v = host[at] ^ (uint8_t)(1u << (k % 8));
        CHECK_INT(cudaMemcpy((uint8_t *)dev + at, &v, 1, cudaMemcpyHostToDevice), cudaSuccess);
        CHECK_INT(wb_sum_gpu_run(g, pc, N, NULL, after), 0);
        for (size_t i = 0; i < N; i++)
            CHECK((after[i] != before[i]) == (i == at / LEN));
        CHECK_INT(cudaMemcpy((uint8_t *)dev + at, host + at, 1, cudaMemcpyHostToDevice),
                  cudaSuccess);
    }
    wb_sum_gpu_free(g);
    CHECK_INT(cudaFree(dev), cudaSuccess);
    free(host);
}

const struct wb_test wb_tests[] = {
    {"pointer_kinds", test_pointer_kinds, 0},
    {"synth_fill_device", test_synth_fill_device, 0},
    {"sum_batch", test_sum_batch, 0},
    {"sum_batch_flip", test_sum_batch_flip, 0},
    {0},
};
