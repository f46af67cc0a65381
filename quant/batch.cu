/* batch.cu — device batches (quant.h): the descriptors of a batch laid out once in device
 * memory, grouped by source dtype and alignment class (one fp8.cu batch-kernel launch each),
 * and the batched copy kernel.
 *
 * Copies are cut into units of at most 64 KiB of one row; CTA u finds its copy by binary search
 * over the copies' first units and moves its unit with 16-byte loads and stores when the copy's
 * pointers, strides and row length allow it (bytes otherwise). Memory-bound work, so the
 * descriptor lookup (a few cached loads) costs nothing next to the unit's traffic. */
#include "quant/cuda_util.cuh"

#include <stdlib.h>
#include <string.h>

namespace
{

enum { UNIT = 64 << 10, COPY_THREADS = 256 };

struct CItem {
    const uint8_t *src;
    uint8_t *dst;
    uint8_t *shadow; /* NULL: none; rows x bytes */
    uint64_t bytes, src_ld, dst_ld;
    uint64_t per_row; /* units per row */
    uint64_t first;   /* first unit */
    uint32_t vec;
};

/* A copy unit against its shadow (quant.h): 4-byte units from the row's start (UNIT is a
 * multiple of 4), each stored and copied into the shadow when !delta or it differs from the
 * shadow's. */
__device__ void copy_unit_delta(const uint8_t *s, uint8_t *d, uint8_t *h, uint64_t len, bool vec,
                                bool delta, uint64_t *stored)
{
    uint32_t n = 0;
    if (vec) {
        const uint4 *s4 = reinterpret_cast<const uint4 *>(s);
        uint4 *h4 = reinterpret_cast<uint4 *>(h);
        uint32_t *d1 = reinterpret_cast<uint32_t *>(d);
        for (uint64_t i = threadIdx.x; i < len / 16; i += COPY_THREADS) {
            const uint4 a = s4[i], b = h4[i];
            const uint32_t aw[4] = {a.x, a.y, a.z, a.w}, bw[4] = {b.x, b.y, b.z, b.w};
            bool any = false;
            for (int j = 0; j < 4; j++)
                if (!delta || aw[j] != bw[j]) {
                    d1[4 * i + j] = aw[j];
                    n += 4;
                    any = true;
                }
            if (any)
                h4[i] = a;
        }
    } else {
        for (uint64_t u = threadIdx.x * 4; u < len; u += 4 * COPY_THREADS) {
            const uint64_t m = len - u < 4 ? len - u : 4;
            bool diff = !delta;
            for (uint64_t j = 0; j < m; j++)
                diff |= s[u + j] != h[u + j];
            if (!diff)
                continue;
            for (uint64_t j = 0; j < m; j++) {
                d[u + j] = s[u + j];
                h[u + j] = s[u + j];
            }
            n += (uint32_t)m;
        }
    }
    if (!stored)
        return;
    n = __reduce_add_sync(0xffffffffu, n);
    if ((threadIdx.x & 31) == 0 && n)
        atomicAdd(reinterpret_cast<unsigned long long *>(stored), (unsigned long long)n);
}

__global__ void __launch_bounds__(COPY_THREADS)
    copy_kernel(const CItem *__restrict__ items, uint32_t n, bool delta, uint64_t *stored)
{
    const uint64_t u = blockIdx.x;
    const CItem it = items[wb_quant_dev_find(items, n, u)];
    const uint64_t k = u - it.first, row = k / it.per_row, off = (k % it.per_row) * UNIT;
    const uint64_t len = it.bytes - off < (uint64_t)UNIT ? it.bytes - off : (uint64_t)UNIT;
    const uint8_t *s = it.src + row * it.src_ld + off;
    uint8_t *d = it.dst + row * it.dst_ld + off;
    if (it.shadow) {
        copy_unit_delta(s, d, it.shadow + row * it.bytes + off, len, it.vec, delta, stored);
        return;
    }
    if (it.vec) {
        const uint4 *s4 = reinterpret_cast<const uint4 *>(s);
        uint4 *d4 = reinterpret_cast<uint4 *>(d);
        for (uint64_t i = threadIdx.x; i < len / 16; i += COPY_THREADS)
            d4[i] = s4[i];
    } else {
        for (uint64_t i = threadIdx.x; i < len; i += COPY_THREADS)
            d[i] = s[i];
    }
}

bool al16(const void *p)
{
    return ((uintptr_t)p & 15) == 0;
}

struct Group {
    enum wb_dtype dtype;
    bool vec, shadow;
    size_t first_item, n; /* in the device array */
    uint64_t pieces;
};

} // namespace

struct wb_quant_dev_batch {
    void *mem; /* device: quantization items by group, then copy items */
    Group groups[12];
    int ngroups;
    const CItem *citems;
    size_t nc;
    uint64_t units;
};

extern "C" int qt_dev_batch_create(const struct wb_quant_item *q, size_t nq,
                                   const struct wb_copy_item *c, size_t nc,
                                   struct wb_quant_dev_batch **out)
{
    wb_quant_dev_batch *b = static_cast<wb_quant_dev_batch *>(calloc(1, sizeof(*b)));
    wb_quant_dev_qitem *hq = static_cast<wb_quant_dev_qitem *>(malloc((nq ? nq : 1) * sizeof(*hq)));
    CItem *hc = static_cast<CItem *>(malloc((nc ? nc : 1) * sizeof(*hc)));
    if (!b || !hq || !hc) {
        free(b);
        free(hq);
        free(hc);
        return -ENOMEM;
    }
    /* quantizations, grouped: dtype x alignment class x shadow, in item order within a group */
    static const enum wb_dtype dts[3] = {WB_DTYPE_BF16, WB_DTYPE_FP16, WB_DTYPE_FP32};
    size_t at = 0;
    for (int di = 0; di < 3; di++)
        for (int v = 3; v >= 0; v--) {
            Group g = {dts[di], (v & 1) == 1, (v & 2) == 2, at, 0, 0};
            for (size_t i = 0; i < nq; i++) {
                const wb_quant_item *it = &q[i];
                size_t esz = wb_dtype_size(it->dtype);
                bool vec = al16(it->src) && al16(it->q) && (it->src_ld * esz) % 16 == 0 &&
                           it->q_ld % 16 == 0 && it->cols % 16 == 0 && it->col0 % 16 == 0 &&
                           (!it->shadow || al16(it->shadow));
                if (it->dtype != g.dtype || vec != g.vec || (it->shadow != NULL) != g.shadow)
                    continue;
                wb_quant_tile t = {it->dtype, it->rows, it->cols, it->row0, it->col0};
                wb_quant_grid gr;
                wb_quant_fp8_grid(&t, 0, it->rows, &gr);
                hq[at++] = wb_quant_dev_qitem{it->src,  it->q,        it->scale,  it->src_ld,
                                              it->q_ld, it->scale_ld, it->rows,   it->cols,
                                              it->row0, it->col0,     gr.row,     gr.col,
                                              gr.cols,  g.pieces,     it->shadow, it->shadow_scale};
                g.pieces += gr.rows * gr.cols;
                g.n++;
            }
            if (g.n)
                b->groups[b->ngroups++] = g;
        }
    for (size_t i = 0; i < nc; i++) {
        const wb_copy_item *it = &c[i];
        bool vec = al16(it->src) && al16(it->dst) && it->bytes % 16 == 0 &&
                   (it->rows == 1 || (it->src_ld % 16 == 0 && it->dst_ld % 16 == 0)) &&
                   (!it->shadow || al16(it->shadow));
        uint64_t per_row = (it->bytes + UNIT - 1) / UNIT;
        hc[i] = CItem{static_cast<const uint8_t *>(it->src),
                      static_cast<uint8_t *>(it->dst),
                      static_cast<uint8_t *>(it->shadow),
                      it->bytes,
                      it->src_ld,
                      it->dst_ld,
                      per_row,
                      b->units,
                      vec};
        b->units += it->rows * per_row;
    }
    size_t qbytes = nq * sizeof(*hq), cbytes = nc * sizeof(*hc);
    size_t coff = (qbytes + 255) / 256 * 256;
    int rc = 0;
    if (b->units > 0x7fffffffu) {
        wb_log(WB_LOG_ERROR, "quant", "a batch of %zu copies is too large for one launch", nc);
        rc = -EINVAL;
    }
    if (!rc)
        rc = wb_quant_cuda_err(cudaMalloc(&b->mem, coff + cbytes + 1), "cudaMalloc");
    if (!rc && qbytes)
        rc =
            wb_quant_cuda_err(cudaMemcpy(b->mem, hq, qbytes, cudaMemcpyHostToDevice), "cudaMemcpy");
    if (!rc && cbytes)
        rc = wb_quant_cuda_err(
            cudaMemcpy(static_cast<char *>(b->mem) + coff, hc, cbytes, cudaMemcpyHostToDevice),
            "cudaMemcpy");
    free(hq);
    free(hc);
    if (rc) {
        qt_dev_batch_free(b);
        return rc;
    }
    b->citems = reinterpret_cast<const CItem *>(static_cast<char *>(b->mem) + coff);
    b->nc = nc;
    *out = b;
    return 0;
}

extern "C" int qt_dev_batch_run(struct wb_quant_dev_batch *b, void *stream, bool delta,
                                uint64_t *stored)
{
    const wb_quant_dev_qitem *items = static_cast<const wb_quant_dev_qitem *>(b->mem);
    for (int g = 0; g < b->ngroups; g++) {
        const Group &gr = b->groups[g];
        int rc = qt_dev_fp8_batch(items + gr.first_item, gr.n, gr.pieces, gr.dtype, gr.vec,
                                  gr.shadow, delta, stored, stream);
        if (rc)
            return rc;
    }
    if (!b->nc || !b->units)
        return 0;
    copy_kernel<<<(unsigned)b->units, COPY_THREADS, 0, static_cast<cudaStream_t>(stream)>>>(
        b->citems, (uint32_t)b->nc, delta, stored);
    return wb_quant_cuda_err(cudaGetLastError(), "batch copy kernel launch");
}

extern "C" void qt_dev_batch_free(struct wb_quant_dev_batch *b)
{
    if (!b)
        return;
    if (b->mem)
        cudaFree(b->mem);
    free(b);
}
