/* fp8.cu — the CUDA kernels of FP8 128x128 block quantization: partial amax, quantization with
 * given amax, and the fused one-pass form used for one-shot quantization.
 *
 * The work is memory-bound (2 bytes read, 1 written per BF16 element), so the kernel is built
 * around the memory system: one CTA per block piece (a 128x128 block, or the part of one that a
 * tile or row range holds); each thread loads its 16-element groups with 16-byte loads straight
 * into registers, the CTA reduces the amax with warp max-reductions and one shared-memory step,
 * and the same registers are scaled, converted two at a time with the cvt.rn.satfinite.e4m3x2.f32
 * instruction and stored with 16-byte stores: the input is read from DRAM exactly once. Eight
 * consecutive threads cover one 256-byte block row, so every warp touches four whole rows.
 * With 256 threads a CTA keeps 32 KiB of loads in flight, and several CTAs share an SM, far
 * more than the ~20-40 KiB per SM that hides DRAM latency on an H100.
 *
 * A persistent, software-pipelined variant was considered and left out: with ~8000 CTAs for a
 * 7168x18432 tensor the scheduler already overlaps one CTA's loads with another's stores, and
 * the tail is a fraction of a wave.
 *
 * The 16-byte path needs 16-byte aligned buffers, a row length and column origin that are
 * multiples of 16 elements; anything else takes the element-wise path of the same kernel
 * (same arithmetic, bounds-checked scalar accesses).
 *
 * The arithmetic is that of fpbits.h (shared with the CPU reference): amax over |x| compared as
 * integers (NaN above +inf), wb_amax_final, wb_amax_scale, wb_amax_scale_inv. Default nvcc flags
 * keep FP32 division IEEE-exact and denormals (no --use_fast_math), and no multiply here feeds
 * an add, so nothing is contracted into an FMA.
 */
#include "common/fpbits.h"
#include "quant/cuda_util.cuh"

#include <cuda_fp16.h>
#include <cuda_fp8.h>

namespace
{

enum Kind { K_BF16, K_FP16, K_FP32 };

/* Everything a pass kernel needs, passed by value. */
struct PassArgs {
    const void *src;
    uint8_t *q;
    const float *amax_in;
    float *amax_out;
    float *scale_inv;
    uint64_t cols;       /* local row length, elements */
    uint64_t row0, col0; /* global origin of the tile */
    uint64_t r0, r1;     /* local rows of the pass */
    uint64_t grow, gcol; /* first global block of the grid */
    uint64_t gcols;      /* grid width in blocks */
};

/* 32-bit words per 16-element group: two elements per word for 16-bit types, one for FP32. */
template <int KIND> struct Group {
    static constexpr int WORDS = KIND == K_FP32 ? 16 : 8;
    static constexpr int ELEM = KIND == K_FP32 ? 4 : 2;
};

__device__ __forceinline__ void span(uint64_t b, uint64_t origin, uint64_t from, uint64_t to,
                                     uint64_t *lo, uint64_t *hi)
{
    uint64_t g0 = b * WB_FP8_BLOCK, g1 = g0 + WB_FP8_BLOCK;
    uint64_t l0 = g0 > origin ? g0 - origin : 0, l1 = g1 - origin;
    *lo = l0 > from ? l0 : from;
    *hi = l1 < to ? l1 : to;
}

/* The amax key of a group: for 16-bit types the largest |x| bit pattern (16 bits), for FP32 the
 * largest |x| FP32 pattern; NaN patterns are above infinity in both. */
template <int KIND> __device__ __forceinline__ uint32_t group_key(const uint32_t (&w)[16])
{
    if (KIND == K_FP32) {
        uint32_t m = 0;
#pragma unroll
        for (int j = 0; j < 16; j++)
            m = max(m, w[j] & 0x7fffffffu);
        return m;
    } else {
        uint32_t m = 0;
#pragma unroll
        for (int j = 0; j < 8; j++)
            m = __vmaxu2(m, w[j] & 0x7fff7fffu); /* per-halfword unsigned max */
        return max(m & 0xffffu, m >> 16);
    }
}

/* Key to FP32 bits of |x|. */
template <int KIND> __device__ __forceinline__ uint32_t key_bits(uint32_t key)
{
    if (KIND == K_BF16)
        return key << 16;
    if (KIND == K_FP16)
        return wb_f32_bits(wb_fp16_to_f32((uint16_t)key));
    return key;
}

/* Two elements of word j (16-bit types) or words j, j+1 (FP32) as floats. */
template <int KIND> __device__ __forceinline__ float2 pair(const uint32_t (&w)[16], int p)
{
    if (KIND == K_BF16)
        return make_float2(__uint_as_float(w[p] << 16), __uint_as_float(w[p] & 0xffff0000u));
    if (KIND == K_FP16) /* exact */
        return make_float2(__half2float(__ushort_as_half((unsigned short)(w[p] & 0xffffu))),
                           __half2float(__ushort_as_half((unsigned short)(w[p] >> 16))));
    return make_float2(__uint_as_float(w[2 * p]), __uint_as_float(w[2 * p + 1]));
}

/* Quantizes the 16 elements of a group with scale s into four words of e4m3 bytes. */
template <int KIND> __device__ __forceinline__ uint4 group_quant(const uint32_t (&w)[16], float s)
{
    uint32_t out[4];
#pragma unroll
    for (int k = 0; k < 4; k++) {
        float2 a = pair<KIND>(w, 2 * k), b = pair<KIND>(w, 2 * k + 1);
        a.x = __fmul_rn(a.x, s);
        a.y = __fmul_rn(a.y, s);
        b.x = __fmul_rn(b.x, s);
        b.y = __fmul_rn(b.y, s);
        uint32_t lo = __nv_cvt_float2_to_fp8x2(a, __NV_SATFINITE, __NV_E4M3);
        uint32_t hi = __nv_cvt_float2_to_fp8x2(b, __NV_SATFINITE, __NV_E4M3);
        out[k] = lo | (hi << 16);
    }
    return make_uint4(out[0], out[1], out[2], out[3]);
}

/* The steps of one CTA on one block piece, shared by the kernels below. THREADS threads cover
 * the 128 rows x 8 groups of a block in 1024 / THREADS slots each: slot k of thread t is row
 * (t + k * THREADS) / 8, group t % 8. The piece is rows [r_lo, r_lo + prow) and columns
 * [c_lo, c_lo + pcol) of a tile whose element (r, c) is at src + (r * ld + c) * elem. */
template <int KIND, int THREADS> struct Piece {
    static constexpr int SLOTS = 1024 / THREADS;
    uint32_t w[SLOTS][16];
    bool live[SLOTS];
};

/* Loads every slot's group into registers (zeros outside the piece: they never raise the amax,
 * which is at least 0, and are never stored). */
template <int KIND, bool VEC, int THREADS>
__device__ __forceinline__ void piece_load(Piece<KIND, THREADS> &pc, const char *src, uint64_t ld,
                                           uint64_t r_lo, uint64_t c_lo, uint32_t prow,
                                           uint32_t pcol)
{
    constexpr int ES = Group<KIND>::ELEM;
    const uint32_t grp = threadIdx.x & 7;
#pragma unroll
    for (int k = 0; k < Piece<KIND, THREADS>::SLOTS; k++) {
        const uint32_t row = (threadIdx.x + k * THREADS) >> 3;
        pc.live[k] = row < prow && grp * 16 < pcol;
        const uint64_t e = (r_lo + row) * ld + c_lo + grp * 16;
#pragma unroll
        for (int j = 0; j < 16; j++)
            pc.w[k][j] = 0;
        if (!pc.live[k])
            continue;
        if (VEC) {
            const uint4 *p = reinterpret_cast<const uint4 *>(src + e * ES);
#pragma unroll
            for (int v = 0; v < Group<KIND>::WORDS / 4; v++) {
                uint4 x = __ldg(p + v);
                pc.w[k][4 * v] = x.x;
                pc.w[k][4 * v + 1] = x.y;
                pc.w[k][4 * v + 2] = x.z;
                pc.w[k][4 * v + 3] = x.w;
            }
        } else {
            const uint32_t n = min(16u, pcol - grp * 16);
            for (uint32_t j = 0; j < n; j++) {
                if (KIND == K_FP32) {
                    pc.w[k][j] = reinterpret_cast<const uint32_t *>(src)[e + j];
                } else {
                    uint32_t h = reinterpret_cast<const uint16_t *>(src)[e + j];
                    pc.w[k][j / 2] |= (j & 1) ? h << 16 : h;
                }
            }
        }
    }
}

/* The piece's max |x| as FP32 bits (NaN above infinity), reduced over the CTA. */
template <int KIND, int THREADS>
__device__ __forceinline__ uint32_t piece_amax_bits(const Piece<KIND, THREADS> &pc,
                                                    uint32_t *warp_max)
{
    uint32_t key = 0;
#pragma unroll
    for (int k = 0; k < Piece<KIND, THREADS>::SLOTS; k++)
        key = max(key, group_key<KIND>(pc.w[k]));
    key = __reduce_max_sync(0xffffffffu, key);
    if ((threadIdx.x & 31) == 0)
        warp_max[threadIdx.x >> 5] = key;
    __syncthreads();
#pragma unroll
    for (int i = 0; i < THREADS / 32; i++)
        key = max(key, warp_max[i]);
    return key_bits<KIND>(key);
}

/* Scales the registers by s, converts and stores the piece's e4m3 bytes at q + (r * ld + c). */
template <int KIND, bool VEC, int THREADS>
__device__ __forceinline__ void piece_store(const Piece<KIND, THREADS> &pc, uint8_t *q, uint64_t ld,
                                            uint64_t r_lo, uint64_t c_lo, uint32_t pcol, float s)
{
    const uint32_t grp = threadIdx.x & 7;
#pragma unroll
    for (int k = 0; k < Piece<KIND, THREADS>::SLOTS; k++) {
        if (!pc.live[k])
            continue;
        const uint32_t row = (threadIdx.x + k * THREADS) >> 3;
        const uint64_t e = (r_lo + row) * ld + c_lo + grp * 16;
        const uint4 qv = group_quant<KIND>(pc.w[k], s);
        if (VEC) {
            *reinterpret_cast<uint4 *>(q + e) = qv;
        } else {
            const uint32_t n = min(16u, pcol - grp * 16);
            const uint32_t qw[4] = {qv.x, qv.y, qv.z, qv.w};
            for (uint32_t j = 0; j < n; j++)
                q[e + j] = (uint8_t)(qw[j / 4] >> (8 * (j % 4)));
        }
    }
}

/* One CTA per block piece of a tile (struct wb_quant_pass). */
template <int MODE, int KIND, bool VEC, int THREADS>
__global__ void __launch_bounds__(THREADS) pass_kernel(const PassArgs a)
{
    __shared__ uint32_t warp_max[THREADS / 32];
    const uint64_t piece = blockIdx.x;
    const uint64_t bi = piece / a.gcols, bj = piece % a.gcols;
    uint64_t r_lo, r_hi, c_lo, c_hi;
    span(a.grow + bi, a.row0, a.r0, a.r1, &r_lo, &r_hi);
    span(a.gcol + bj, a.col0, 0, a.cols, &c_lo, &c_hi);
    const uint32_t prow = (uint32_t)(r_hi - r_lo), pcol = (uint32_t)(c_hi - c_lo);
    Piece<KIND, THREADS> pc;
    piece_load<KIND, VEC, THREADS>(pc, static_cast<const char *>(a.src), a.cols, r_lo, c_lo, prow,
                                   pcol);
    float amax;
    if (MODE == WB_QUANT_MODE_APPLY) {
        amax = wb_amax_final(__float_as_uint(a.amax_in[piece]) & WB_F32_ABS);
    } else {
        const uint32_t bits = piece_amax_bits<KIND, THREADS>(pc, warp_max);
        if (MODE == WB_QUANT_MODE_AMAX) {
            if (threadIdx.x == 0)
                a.amax_out[piece] = __uint_as_float(bits > WB_F32_INF ? WB_F32_AMAX_NAN : bits);
            return;
        }
        amax = wb_amax_final(bits);
    }
    const float s = wb_amax_scale(amax);
    if (threadIdx.x == 0 && a.scale_inv)
        a.scale_inv[piece] = wb_amax_scale_inv(amax);
    piece_store<KIND, VEC, THREADS>(pc, a.q, a.cols, r_lo, c_lo, pcol, s);
}

template <int MODE, int KIND, bool VEC, int THREADS>
cudaError_t launch(const PassArgs &a, unsigned pieces, cudaStream_t st)
{
    pass_kernel<MODE, KIND, VEC, THREADS><<<pieces, THREADS, 0, st>>>(a);
    return cudaGetLastError();
}

template <int MODE, int KIND>
cudaError_t launch_kind(const PassArgs &a, unsigned pieces, cudaStream_t st, bool vec,
                        unsigned threads)
{
    if (!vec)
        return launch<MODE, KIND, false, 256>(a, pieces, st);
    /* CTA sizes other than 256 exist for the one case bench/quant_bench.c tunes. */
    if constexpr (MODE == WB_QUANT_MODE_FUSED && KIND == K_BF16) {
        switch (threads) {
        case 128:
            return launch<MODE, KIND, true, 128>(a, pieces, st);
        case 512:
            return launch<MODE, KIND, true, 512>(a, pieces, st);
        case 1024:
            return launch<MODE, KIND, true, 1024>(a, pieces, st);
        default:
            break;
        }
    }
    return launch<MODE, KIND, true, 256>(a, pieces, st);
}

template <int MODE>
cudaError_t launch_mode(const PassArgs &a, unsigned pieces, cudaStream_t st, enum wb_dtype dt,
                        bool vec, unsigned threads)
{
    switch (dt) {
    case WB_DTYPE_BF16:
        return launch_kind<MODE, K_BF16>(a, pieces, st, vec, threads);
    case WB_DTYPE_FP16:
        return launch_kind<MODE, K_FP16>(a, pieces, st, vec, threads);
    default:
        return launch_kind<MODE, K_FP32>(a, pieces, st, vec, threads);
    }
}

bool aligned16(const void *p)
{
    return ((uintptr_t)p & 15) == 0;
}

/* Bytes stored, summed over the CTA's warps into *stored (one atomic per warp that stored). */
__device__ __forceinline__ void count_stored(uint32_t n, uint64_t *stored)
{
    if (!stored)
        return;
    n = __reduce_add_sync(0xffffffffu, n);
    if ((threadIdx.x & 31) == 0 && n)
        atomicAdd(reinterpret_cast<unsigned long long *>(stored), (unsigned long long)n);
}

/* piece_store against a shadow (quant.h, wb_quant_batch_run_delta): each 4-byte unit of a group
 * (16 bytes from the piece's first column, so units start at the piece's edge) is stored, and
 * copied into the shadow at sh + (r * sld + c), when !delta or it differs from the shadow's.
 * Returns the bytes stored. */
template <int KIND, bool VEC, int THREADS>
__device__ __forceinline__ uint32_t piece_store_delta(const Piece<KIND, THREADS> &pc, uint8_t *q,
                                                      uint64_t ld, uint8_t *sh, uint64_t sld,
                                                      uint64_t r_lo, uint64_t c_lo, uint32_t pcol,
                                                      float s, bool delta)
{
    const uint32_t grp = threadIdx.x & 7;
    uint32_t n = 0;
#pragma unroll
    for (int k = 0; k < Piece<KIND, THREADS>::SLOTS; k++) {
        if (!pc.live[k])
            continue;
        const uint32_t row = (threadIdx.x + k * THREADS) >> 3;
        const uint64_t c = c_lo + grp * 16;
        uint8_t *d = q + (r_lo + row) * ld + c, *h = sh + (r_lo + row) * sld + c;
        const uint4 qv = group_quant<KIND>(pc.w[k], s);
        const uint32_t qw[4] = {qv.x, qv.y, qv.z, qv.w};
        if (VEC) {
            const uint4 hv = *reinterpret_cast<const uint4 *>(h);
            const uint32_t hw[4] = {hv.x, hv.y, hv.z, hv.w};
            bool any = false;
#pragma unroll
            for (int j = 0; j < 4; j++)
                if (!delta || qw[j] != hw[j]) {
                    reinterpret_cast<uint32_t *>(d)[j] = qw[j];
                    n += 4;
                    any = true;
                }
            if (any)
                *reinterpret_cast<uint4 *>(h) = qv;
        } else {
            const uint32_t len = min(16u, pcol - grp * 16);
            for (uint32_t u = 0; u < len; u += 4) {
                const uint32_t m = min(4u, len - u);
                bool diff = !delta;
                for (uint32_t j = 0; j < m; j++)
                    diff |= h[u + j] != (uint8_t)(qw[(u + j) / 4] >> (8 * ((u + j) % 4)));
                if (!diff)
                    continue;
                for (uint32_t j = 0; j < m; j++) {
                    const uint8_t v = (uint8_t)(qw[(u + j) / 4] >> (8 * ((u + j) % 4)));
                    d[u + j] = v;
                    h[u + j] = v;
                }
                n += m;
            }
        }
    }
    return n;
}

/* The batch kernel: the fused pass of pass_kernel over many strided tiles. CTA p finds its item
 * (the last whose first piece is <= p) by binary search, then does what pass_kernel does for
 * one block piece, with the item's row strides. Same loads, reduction and conversion, so the
 * bytes are those of the one-tile kernel. SHADOW: the items have shadows (changed-only stores,
 * piece_store_delta; the scale likewise). */
template <int KIND, bool VEC, bool SHADOW>
__global__ void __launch_bounds__(256) batch_kernel(const wb_quant_dev_qitem *__restrict__ items,
                                                    uint32_t n, bool delta, uint64_t *stored)
{
    constexpr int THREADS = 256;
    __shared__ uint32_t warp_max[THREADS / 32];
    const uint64_t p = blockIdx.x;
    const wb_quant_dev_qitem it = items[wb_quant_dev_find(items, n, p)];
    const uint64_t piece = p - it.first;
    const uint64_t bi = piece / it.gcols, bj = piece % it.gcols;
    uint64_t r_lo, r_hi, c_lo, c_hi;
    span(it.grow + bi, it.row0, 0, it.rows, &r_lo, &r_hi);
    span(it.gcol + bj, it.col0, 0, it.cols, &c_lo, &c_hi);
    const uint32_t prow = (uint32_t)(r_hi - r_lo), pcol = (uint32_t)(c_hi - c_lo);
    Piece<KIND, THREADS> pc;
    piece_load<KIND, VEC, THREADS>(pc, static_cast<const char *>(it.src), it.src_ld, r_lo, c_lo,
                                   prow, pcol);
    const float amax = wb_amax_final(piece_amax_bits<KIND, THREADS>(pc, warp_max));
    if (!SHADOW) {
        if (threadIdx.x == 0)
            it.scale[bi * it.scale_ld + bj] = wb_amax_scale_inv(amax);
        piece_store<KIND, VEC, THREADS>(pc, it.q, it.q_ld, r_lo, c_lo, pcol, wb_amax_scale(amax));
        return;
    }
    uint32_t stored_n = 0;
    if (threadIdx.x == 0) {
        const float si = wb_amax_scale_inv(amax);
        float *hs = it.shadow_scale + bi * it.gcols + bj;
        if (!delta || __float_as_uint(*hs) != __float_as_uint(si)) {
            it.scale[bi * it.scale_ld + bj] = si;
            *hs = si;
            stored_n = 4;
        }
    }
    stored_n += piece_store_delta<KIND, VEC, THREADS>(pc, it.q, it.q_ld, it.shadow, it.cols, r_lo,
                                                      c_lo, pcol, wb_amax_scale(amax), delta);
    count_stored(stored_n, stored);
}

template <int KIND>
cudaError_t batch_launch(const wb_quant_dev_qitem *items, uint32_t n, unsigned pieces, bool vec,
                         bool shadow, bool delta, uint64_t *stored, cudaStream_t st)
{
    if (shadow && vec)
        batch_kernel<KIND, true, true><<<pieces, 256, 0, st>>>(items, n, delta, stored);
    else if (shadow)
        batch_kernel<KIND, false, true><<<pieces, 256, 0, st>>>(items, n, delta, stored);
    else if (vec)
        batch_kernel<KIND, true, false><<<pieces, 256, 0, st>>>(items, n, delta, stored);
    else
        batch_kernel<KIND, false, false><<<pieces, 256, 0, st>>>(items, n, delta, stored);
    return cudaGetLastError();
}

} // namespace

extern "C" int qt_dev_fp8_batch(const struct wb_quant_dev_qitem *items, size_t n, uint64_t pieces,
                                enum wb_dtype dtype, bool vec, bool shadow, bool delta,
                                uint64_t *stored, void *stream)
{
    if (!n || !pieces)
        return 0;
    if (pieces > 0x7fffffffu || n > 0xffffffffu) {
        wb_log(WB_LOG_ERROR, "quant", "%llu blocks exceed one kernel launch",
               (unsigned long long)pieces);
        return -EINVAL;
    }
    cudaStream_t st = static_cast<cudaStream_t>(stream);
    cudaError_t e;
    switch (dtype) {
    case WB_DTYPE_BF16:
        e = batch_launch<K_BF16>(items, (uint32_t)n, (unsigned)pieces, vec, shadow, delta, stored,
                                 st);
        break;
    case WB_DTYPE_FP16:
        e = batch_launch<K_FP16>(items, (uint32_t)n, (unsigned)pieces, vec, shadow, delta, stored,
                                 st);
        break;
    default:
        e = batch_launch<K_FP32>(items, (uint32_t)n, (unsigned)pieces, vec, shadow, delta, stored,
                                 st);
        break;
    }
    return wb_quant_cuda_err(e, "batch quantization kernel launch");
}

extern "C" int qt_dev_pass(const struct wb_quant_pass *p, void *stream, unsigned threads)
{
    const uint64_t pieces = p->grid.rows * p->grid.cols;
    if (pieces > 0x7fffffffu) {
        wb_log(WB_LOG_ERROR, "quant", "%llu blocks exceed one kernel launch",
               (unsigned long long)pieces);
        return -EINVAL;
    }
    PassArgs a;
    a.src = p->src;
    a.q = p->q;
    a.amax_in = p->amax_in;
    a.amax_out = p->amax_out;
    a.scale_inv = p->scale_inv;
    a.cols = p->tile.cols;
    a.row0 = p->tile.row0;
    a.col0 = p->tile.col0;
    a.r0 = p->r0;
    a.r1 = p->r1;
    a.grow = p->grid.row;
    a.gcol = p->grid.col;
    a.gcols = p->grid.cols;
    const bool vec = aligned16(p->src) && (p->mode == WB_QUANT_MODE_AMAX || aligned16(p->q)) &&
                     p->tile.cols % 16 == 0 && p->tile.col0 % 16 == 0;
    cudaStream_t st = static_cast<cudaStream_t>(stream);
    cudaError_t e;
    switch (p->mode) {
    case WB_QUANT_MODE_AMAX:
        e = launch_mode<WB_QUANT_MODE_AMAX>(a, (unsigned)pieces, st, p->tile.dtype, vec, threads);
        break;
    case WB_QUANT_MODE_APPLY:
        e = launch_mode<WB_QUANT_MODE_APPLY>(a, (unsigned)pieces, st, p->tile.dtype, vec, threads);
        break;
    default:
        e = launch_mode<WB_QUANT_MODE_FUSED>(a, (unsigned)pieces, st, p->tile.dtype, vec, threads);
        break;
    }
    return wb_quant_cuda_err(e, "quantization kernel launch");
}
