/* quant_int.h — what quant/'s files share privately: the CPU reference entry points (fp8_cpu.c,
 * copy_cpu.c) and the device backend (fp8.cu and copy.cu in CUDA builds, dev_nocuda.c
 * otherwise), called by the public API in quant.c after it has checked the arguments.
 *
 * The device functions take already-validated arguments, enqueue on `stream` and return 0,
 * -WB_E_NOGPU (no device/driver, or no CUDA in this build) or -WB_E_CUDA.
 */
#ifndef WB_QUANT_INT_H
#define WB_QUANT_INT_H

#include "quant/quant.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What a block-quantization pass does with each block piece it visits. */
enum wb_quant_mode {
    WB_QUANT_MODE_AMAX,  /* write the raw partial amax */
    WB_QUANT_MODE_APPLY, /* quantize with the given amax, optionally write scale_inv */
    WB_QUANT_MODE_FUSED, /* compute the amax, quantize, write scale_inv (one pass) */
};

/* One block-quantization pass over local rows [r0, r1) of a tile; g is its block grid.
 * amax: output (AMAX) or input (APPLY); unused (FUSED). scale_inv may be NULL (APPLY). */
struct wb_quant_pass {
    enum wb_quant_mode mode;
    struct wb_quant_tile tile;
    struct wb_quant_grid grid;
    uint64_t r0, r1;
    const void *src;
    uint8_t *q;
    const float *amax_in;
    float *amax_out;
    float *scale_inv;
};

/* One pack/unpack: the byte runs of a box inside a tensor (from wb_ranges_init) and the two
 * buffers. `unpack` copies from the contiguous buffer into the tensor. */
struct wb_quant_copy {
    struct wb_ranges ranges;
    bool unpack;
    const void *src;
    void *dst;
};

/* CPU reference. */
void qt_cpu_pass(const struct wb_quant_pass *p);
void qt_cpu_copy(const struct wb_quant_copy *c);
void qt_cpu_cast(enum wb_dtype from, const void *src, enum wb_dtype to, void *dst, uint64_t n);

/* Device backend. `threads` selects the CTA size of the block-quantization kernel (0 = the
 * default; 128, 256, 512 or 1024 for tuning, see bench/quant_bench.c). */
int qt_dev_pass(const struct wb_quant_pass *p, void *stream, unsigned threads);
int qt_dev_copy(const struct wb_quant_copy *c, void *stream);
int qt_dev_cast(enum wb_dtype from, const void *src, enum wb_dtype to, void *dst, uint64_t n,
                void *stream);

/* Batches on the device (batch.cu): the prepared descriptor arrays of one batch. A launch of
 * fp8.cu's batch kernel covers items of one source dtype and alignment class, one CTA per
 * block piece; item i's pieces are [first, first + grid rows * grid cols). */
struct wb_quant_dev_qitem {
    const void *src;
    uint8_t *q;
    float *scale;
    uint64_t src_ld, q_ld, scale_ld, rows, cols, row0, col0;
    uint64_t grow, gcol, gcols; /* the item's grid: first global block, block columns */
    uint64_t first;
    uint8_t *shadow; /* wb_quant_item's, NULL: none */
    float *shadow_scale;
};
/* Enqueues the batch kernel over n device-resident items holding `pieces` block pieces. */
int qt_dev_fp8_batch(const struct wb_quant_dev_qitem *items, size_t n, uint64_t pieces,
                     enum wb_dtype dtype, bool vec, bool shadow, bool delta, uint64_t *stored,
                     void *stream);
struct wb_quant_dev_batch;
int qt_dev_batch_create(const struct wb_quant_item *q, size_t nq, const struct wb_copy_item *c,
                        size_t nc, struct wb_quant_dev_batch **out);
int qt_dev_batch_run(struct wb_quant_dev_batch *b, void *stream, bool delta, uint64_t *stored);
void qt_dev_batch_free(struct wb_quant_dev_batch *b);

/* NVIDIA's own host conversion __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3) from
 * cuda_fp8.h, for tests (nvref.cu). Returns 0, or -ENOTSUP in a build without CUDA. */
int qt_nvref_e4m3(float x, uint8_t *out);

#ifdef __cplusplus
}
#endif

#endif /* WB_QUANT_INT_H */
