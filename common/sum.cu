/* sum.cu — wb_sum64 of pieces of GPU memory, many pieces per launch: eight threads per 4 KiB
 * chunk of every piece run the chunk hash of sum64.h split by accumulator lane (its per-word and
 * fold steps are the code tests/unit/sum_test.c checks against libxxhash on the CPU), the chunk
 * hashes come back to pinned host memory in one copy, and the
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

/* The secret words of sum64.h's wb_sum_key, where a lane can index them. */
__constant__ uint64_t KEYS[40];

/* Eight threads per chunk, thread j holding XXH3's accumulator j: a stripe is one 64-byte load
 * of the eight (coalesced), lane j needs word j and its neighbour's (j ^ 1, a shuffle), the
 * scramble is per lane and the merge pairs lanes 2i and 2i + 1 and sums the four pairs by
 * shuffles. The same XXH3 as wb_sum_chunk_mode, eight times the threads: a task's batch of a
 * few MiB fills the GPU instead of a few SMs, and each warp reads 256 contiguous bytes a step
 * instead of 32 scattered words. gpu_cuda_test checks it against the host's wb_sum64. */
__global__ void sum_kernel(const Piece *pieces, uint32_t n, uint64_t total, uint64_t *out)
{
    uint64_t t = ((uint64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 3;
    unsigned j = threadIdx.x & 7;
    bool live = t < total;
    const uint8_t *p = NULL;
    uint32_t valid = 0;
    if (live)
        p = wb_sum_batch_at(pieces, n, t, &valid);
    int mode = ((uintptr_t)p & 7) ? 0 : 1;
    uint64_t ks[16];
#pragma unroll
    for (unsigned s = 0; s < 16; s++)
        ks[s] = KEYS[s + j];
    const uint64_t init[8] = {0xC2B2AE3Dull,         0x9E3779B185EBCA87ull, 0xC2B2AE3D27D4EB4Full,
                              0x165667B19E3779F9ull, 0x85EBCA77C2B2AE63ull, 0x85EBCA77ull,
                              0x27D4EB2F165667C5ull, 0x9E3779B1ull};
    uint64_t acc = init[j];
    for (uint32_t blk = 0; blk < 4; blk++) {
#pragma unroll
        for (unsigned s = 0; s < 16; s++) {
            if (blk == 3 && s == 15) /* the last block has 15 stripes, then the last stripe */
                break;
            uint64_t w = live ? wb_sum_word(p, blk * 1024 + s * 64 + 8 * j, valid, mode) : 0;
            uint64_t wn = __shfl_xor_sync(0xffffffffu, w, 1);
            uint64_t k = w ^ ks[s];
            acc += wn + (uint64_t)(uint32_t)k * (k >> 32);
        }
        if (blk < 3) { /* scramble */
            acc ^= acc >> 47;
            acc ^= KEYS[16 + j];
            acc *= 0x9E3779B1ull;
        }
    }
    { /* the last stripe */
        uint64_t w = live ? wb_sum_word(p, 4032u + 8 * j, valid, mode) : 0;
        uint64_t wn = __shfl_xor_sync(0xffffffffu, w, 1);
        uint64_t k = w ^ KEYS[24 + j];
        acc += wn + (uint64_t)(uint32_t)k * (k >> 32);
    }
    uint64_t mine = acc ^ KEYS[32 + j];
    uint64_t other = __shfl_xor_sync(0xffffffffu, mine, 1);
    uint64_t f = (j & 1) ? 0 : wb_sum_mul128_fold(mine, other);
    f += __shfl_xor_sync(0xffffffffu, f, 2);
    f += __shfl_xor_sync(0xffffffffu, f, 4);
    if (live && j == 0) {
        uint64_t r = (uint64_t)WB_SUM_CHUNK_BYTES * 0x9E3779B185EBCA87ull + f;
        r ^= r >> 37;
        r *= 0x165667919E3779F9ull;
        out[t] = r ^ (r >> 32);
    }
}

/* KEYS, once per process (and device: a second GPU gets its own copy). */
int keys_ready(void)
{
    static int done[64];
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64)
        return -WB_E_CUDA;
    if (done[dev])
        return 0;
    uint64_t k[40];
    for (unsigned i = 0; i < 40; i++)
        k[i] = wb_sum_key(i);
    if (cudaMemcpyToSymbol(KEYS, k, sizeof(k)) != cudaSuccess)
        return -WB_E_CUDA;
    done[dev] = 1;
    return 0;
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
    if ((rc = keys_ready()) != 0) {
        wb_log(WB_LOG_ERROR, "sum", "checksum keys: cannot reach the GPU's constant memory");
        return rc;
    }
    enum { THREADS = 256 }; /* 32 chunks a block */
    uint64_t threads = total * 8;
    sum_kernel<<<(unsigned)((threads + THREADS - 1) / THREADS), THREADS, 0, s>>>(g->dp, (uint32_t)n,
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
