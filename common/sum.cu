/* sum.cu — wb_sum64 of pieces of GPU memory, many pieces per launch: one thread per 4 KiB chunk
 * of every piece runs the chunk hash of sum64.h (the code tests/unit/sum_test.c checks against
 * libxxhash on the CPU), the chunk hashes come back to pinned host memory in one copy, and the
 * host combines each piece's (wb_sum64_combine). tests/unit/gpu_cuda_test.c checks a batch
 * against wb_sum64 on a GPU machine. */
extern "C" {
#include "common/common.h"
}
#include "common/sum64.h"

#include <cuda_runtime.h>
#include <errno.h>
#include <stdlib.h>

namespace
{

typedef struct wb_sum_slot Piece;

/* Thread t hashes chunk t of the batch (sum64.h). */
__global__ void sum_kernel(const Piece *pieces, uint32_t n, uint64_t total, uint64_t *out)
{
    uint64_t t = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (t < total)
        out[t] = wb_sum_batch_chunk(pieces, n, t);
}

int cu(cudaError_t e, const char *what)
{
    if (e == cudaSuccess)
        return 0;
    wb_log(WB_LOG_ERROR, "sum", "%s: %s", what, cudaGetErrorString(e));
    return -WB_E_CUDA;
}

} // namespace

struct wb_sum_gpu {
    Piece *hp, *dp;    /* the batch's pieces: pinned host, device */
    uint64_t *hh, *dh; /* chunk hashes: pinned host, device */
    size_t cap_p, cap_c, n;
};

extern "C" int wb_sum_gpu_new(struct wb_sum_gpu **out)
{
    if (wb_gpu_count() <= 0)
        return -WB_E_NOGPU;
    struct wb_sum_gpu *g = (struct wb_sum_gpu *)calloc(1, sizeof(*g));
    if (!g)
        return -ENOMEM;
    *out = g;
    return 0;
}

static void release(struct wb_sum_gpu *g, bool pieces, bool chunks)
{
    if (pieces) {
        cudaFreeHost(g->hp);
        cudaFree(g->dp);
        g->hp = g->dp = NULL;
        g->cap_p = 0;
    }
    if (chunks) {
        cudaFreeHost(g->hh);
        cudaFree(g->dh);
        g->hh = g->dh = NULL;
        g->cap_c = 0;
    }
}

extern "C" void wb_sum_gpu_free(struct wb_sum_gpu *g)
{
    if (!g)
        return;
    release(g, true, true);
    free(g);
}

/* Room for np pieces and nc chunk hashes; grows by doubling, so a steady load allocates once. */
static int reserve(struct wb_sum_gpu *g, size_t np, size_t nc)
{
    if (np > g->cap_p) {
        release(g, true, false);
        size_t cap = np < 64 ? 64 : np * 2;
        if (cu(cudaMallocHost(&g->hp, cap * sizeof(Piece)), "checksum pieces (host)") ||
            cu(cudaMalloc(&g->dp, cap * sizeof(Piece)), "checksum pieces (device)")) {
            release(g, true, false);
            return -ENOMEM;
        }
        g->cap_p = cap;
    }
    if (nc > g->cap_c) {
        release(g, false, true);
        size_t cap = nc < 1024 ? 1024 : nc * 2;
        if (cu(cudaMallocHost(&g->hh, cap * sizeof(uint64_t)), "chunk hashes (host)") ||
            cu(cudaMalloc(&g->dh, cap * sizeof(uint64_t)), "chunk hashes (device)")) {
            release(g, false, true);
            return -ENOMEM;
        }
        g->cap_c = cap;
    }
    return 0;
}

extern "C" int wb_sum_gpu_launch(struct wb_sum_gpu *g, const struct wb_sum_piece *pieces, size_t n,
                                 void *stream)
{
    if (n > UINT32_MAX)
        return -EINVAL;
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++)
        total += wb_sum_nchunks(pieces[i].len);
    g->n = 0;
    int rc = reserve(g, n, total);
    if (rc)
        return rc;
    for (size_t i = 0, c = 0; i < n; i++) {
        g->hp[i] = Piece{(const uint8_t *)pieces[i].p, pieces[i].len, c};
        c += wb_sum_nchunks(pieces[i].len);
    }
    g->n = n;
    if (!total)
        return 0;
    cudaStream_t s = (cudaStream_t)stream;
    rc = cu(cudaMemcpyAsync(g->dp, g->hp, n * sizeof(Piece), cudaMemcpyHostToDevice, s),
            "checksum pieces to the GPU");
    if (rc)
        return rc;
    enum { THREADS = 128 };
    sum_kernel<<<(unsigned)((total + THREADS - 1) / THREADS), THREADS, 0, s>>>(g->dp, (uint32_t)n,
                                                                               total, g->dh);
    rc = cu(cudaGetLastError(), "checksum kernel launch");
    return rc ? rc
              : cu(cudaMemcpyAsync(g->hh, g->dh, total * sizeof(uint64_t), cudaMemcpyDeviceToHost,
                                   s),
                   "chunk hashes to the host");
}

extern "C" uint64_t wb_sum_gpu_result(const struct wb_sum_gpu *g, size_t i)
{
    if (i >= g->n)
        return 0;
    return wb_sum64_combine(g->hh ? g->hh + g->hp[i].chunk0 : NULL, g->hp[i].len);
}

extern "C" int wb_sum_gpu_run(struct wb_sum_gpu *g, const struct wb_sum_piece *pieces, size_t n,
                              void *stream, uint64_t *sums)
{
    int rc = wb_sum_gpu_launch(g, pieces, n, stream);
    rc = rc ? rc : cu(cudaStreamSynchronize((cudaStream_t)stream), "checksum kernel");
    for (size_t i = 0; !rc && i < n; i++)
        sums[i] = wb_sum_gpu_result(g, i);
    return rc;
}
