/* quant.h — the one public header of quant/: FP8 E4M3 128x128 block quantization, pack/unpack
 * of tensor boxes, dtype casts and concatenation copies, each with a CPU reference and a CUDA
 * kernel behind the same call.
 *
 * Where the work runs. Every call takes an optional `const struct wb_quant_exec *` (NULL means
 * {WB_QUANT_AUTO, NULL}):
 *  - WB_QUANT_HOST: every pointer is host memory (or CUDA managed memory); the CPU reference
 *    runs on the calling thread and the call returns when the work is done.
 *  - WB_QUANT_DEVICE: every pointer is CUDA device memory of the current device; the kernel is
 *    enqueued on `stream` and the call returns once it is launched (synchronize the stream before
 *    reading the outputs). Launch failures return -WB_E_CUDA; no device, no driver or a build
 *    without CUDA return -WB_E_NOGPU.
 *  - WB_QUANT_AUTO: each non-NULL pointer is classified with wb_gpu_is_device_ptr(); all host
 *    runs as HOST, all device as DEVICE, a mixture is -EINVAL. This costs one
 *    cudaPointerGetAttributes() per pointer, which matters only for tiny tensors: hot paths that
 *    know where their buffers live say so.
 * Bad arguments return -EINVAL (and log the reason at error level) before anything is written.
 * Element buffers must be aligned to their element size (16-byte alignment, a row length and a
 * column origin that are multiples of 16 elements take the kernels' vector path; anything else
 * is still correct, only slower). Outputs may not overlap inputs.
 *
 * The FP8 arithmetic is that of the PyTorch reference used for DeepSeek-V3 / Qwen3-FP8 /
 * Kimi-K2 checkpoints (DeepGEMM's per_block_cast_to_fp8) as it runs on a CUDA tensor, bit for
 * bit. For each 128x128 block counted from the tensor origin (edge blocks are smaller):
 *     amax      = max(max |x| over the block in FP32, 1e-4f)     (a NaN in the block wins)
 *     s         = (1.0f / amax) * 448.0f      two FP32 roundings: torch evaluates `448 / amax`
 *                                             as amax.reciprocal() * 448 (Tensor.__rtruediv__)
 *     q         = e4m3fn(float(x) * s)        round to nearest even, saturating to +-448
 *     scale_inv = amax * (1.0f / 448.0f)      torch on CUDA turns `amax / 448.0` into a
 *                                             multiplication by the FP32 reciprocal
 * Note: the same PyTorch code run on CPU tensors computes scale_inv = amax / 448.0f (a true
 * division), which differs in the last bit for about half of all amax values; we follow the
 * CUDA result because that is what trainers run. q does not depend on that choice.
 * e4m3fn has no infinities: NaN encodes as 0x7f (any sign), |y| > 448 saturates to 0x7e|sign
 * (the `cvt.rn.satfinite.e4m3x2.f32` instruction and __nv_cvt_float_to_fp8(x, __NV_SATFINITE,
 * __NV_E4M3)). A block containing NaN therefore has amax = scale_inv = NaN (0x7fffffff) and
 * every q = 0x7f; a block containing +-inf has scale_inv = inf, q = +-0 for finite x and 0x7f for
 * the infinities — all as in the reference.
 */
#ifndef WB_QUANT_H
#define WB_QUANT_H

#include "common/common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- where the work runs */

enum wb_quant_mem {
    WB_QUANT_AUTO = 0, /* classify the pointers (see above) */
    WB_QUANT_HOST,     /* host memory: the CPU reference, synchronous */
    WB_QUANT_DEVICE,   /* device memory: a CUDA kernel on `stream`, asynchronous */
};

struct wb_quant_exec {
    enum wb_quant_mem mem;
    void *stream; /* cudaStream_t for device work; NULL is the default stream */
};

/* ---------------------------------------------------------------- FP8 block quantization */

/* The block edge, rows and columns, is WB_FP8_BLOCK (common.h), the project's one home of it. */

/* Number of blocks covering n elements: ceil(n / WB_FP8_BLOCK). */
static inline uint64_t wb_quant_blocks(uint64_t n)
{
    return (n + WB_FP8_BLOCK - 1) / WB_FP8_BLOCK;
}

/* One-shot quantization of a row-major rows x cols tensor `src` (dtype bf16, fp16 or fp32,
 * contiguous). Writes q (rows x cols bytes, e4m3fn, contiguous) and scale_inv (FP32,
 * ceil(rows/128) x ceil(cols/128), contiguous). An empty tensor writes nothing. */
int wb_quant_fp8_block(const struct wb_quant_exec *ex, enum wb_dtype dtype, const void *src,
                       uint64_t rows, uint64_t cols, uint8_t *q, float *scale_inv);

/* A locally held, contiguous row-major part of a larger 2-D tensor whose block grid starts at
 * the larger tensor's origin: local element (r, c) is global element (row0 + r, col0 + c) and
 * lies in global block ((row0 + r) / 128, (col0 + c) / 128). */
struct wb_quant_tile {
    enum wb_dtype dtype; /* of the source: bf16, fp16 or fp32 */
    uint64_t rows, cols; /* local extents */
    uint64_t row0, col0; /* global position of local element (0, 0) */
};

/* The global blocks that local rows [r0, r1) of a tile touch: block rows [row, row + rows),
 * block columns [col, col + cols). Per-block arrays of the partial calls below are laid out
 * rows x cols over this grid, row-major. Empty (rows or cols 0) when r0 == r1 or the tile has
 * no columns. */
struct wb_quant_grid {
    uint64_t row, col;
    uint64_t rows, cols;
};

/* Returns 0, or -EINVAL when r0 > r1 or r1 > t->rows. */
int wb_quant_fp8_grid(const struct wb_quant_tile *t, uint64_t r0, uint64_t r1,
                      struct wb_quant_grid *out);

/* First half of a quantization split across owners: for local rows [r0, r1) of the tile at
 * `src` (which points at local row 0), writes per grid block the raw partial amax = max |x| in
 * FP32 over the block's elements inside the rows, not yet clamped (a NaN anywhere makes it
 * 0x7fffffff). Owners combine their partials of a shared block with wb_quant_fp8_amax_merge(). */
int wb_quant_fp8_amax(const struct wb_quant_exec *ex, const struct wb_quant_tile *t,
                      const void *src, uint64_t r0, uint64_t r1, float *amax);

/* Second half: quantizes local rows [r0, r1) with the block amax given per grid block (the
 * merged partials; the 1e-4 clamp is applied here). src and q point at local row 0 of the tile
 * (q is rows x cols bytes; only rows [r0, r1) are written). When scale_inv is not NULL, also
 * writes each grid block's scale_inv (laid out like amax). One-shot quantization of a tensor
 * equals the amax of every piece, merged, then apply on every piece, bit for bit. */
int wb_quant_fp8_apply(const struct wb_quant_exec *ex, const struct wb_quant_tile *t,
                       const void *src, uint64_t r0, uint64_t r1, const float *amax, uint8_t *q,
                       float *scale_inv);

/* Host helpers for the few bytes that travel between owners. */
/* acc[i] = max(acc[i], part[i]) for partial amax values (a NaN wins). */
void wb_quant_fp8_amax_merge(float *acc, const float *part, size_t n);
/* scale_inv of a block from its (merged, unclamped) amax. */
float wb_quant_fp8_scale_inv(float amax);
/* One FP32 value to e4m3fn: round to nearest even, saturate to +-448, NaN -> 0x7f. */
uint8_t wb_quant_fp8_encode(float x);
/* e4m3fn to FP32 (exact); 0x7f and 0xff are NaN. */
float wb_quant_fp8_decode(uint8_t q);

/* ---------------------------------------------------------------- copies and casts */

/* pack: copies the box of a row-major tensor (shape, any dtype) at src into the contiguous
 * buffer dst (wb_box_numel(box) elements, in row-major order of the box).
 * unpack: the reverse, from the contiguous src into the box of the tensor at dst.
 * -EINVAL when the box is not inside the shape. */
int wb_quant_pack(const struct wb_quant_exec *ex, enum wb_dtype dtype, const struct wb_shape *shape,
                  const struct wb_box *box, const void *src, void *dst);
int wb_quant_unpack(const struct wb_quant_exec *ex, enum wb_dtype dtype,
                    const struct wb_shape *shape, const struct wb_box *box, const void *src,
                    void *dst);

/* Concatenation for fused projections (qkv, gate_up): copies the tensor `part` (shape
 * part_shape) into the tensor `whole` (shape whole_shape) at offset `off` along dimension `dim`;
 * every other dimension must be equal. Any dtype; no conversion. */
int wb_quant_concat(const struct wb_quant_exec *ex, enum wb_dtype dtype,
                    const struct wb_shape *part_shape, const void *part,
                    const struct wb_shape *whole_shape, uint32_t dim, uint64_t off, void *whole);

/* Converts n elements between bf16, fp16 and fp32 (the same dtype is a plain copy). Narrowing
 * rounds to nearest even; fp16 overflow gives +-inf; a NaN becomes the positive canonical quiet NaN
 * of the target (bf16 0x7fc0, fp16 0x7e00, fp32 0x7fc00000). */
int wb_quant_cast(const struct wb_quant_exec *ex, enum wb_dtype from, const void *src,
                  enum wb_dtype to, void *dst, uint64_t n);

/* ---------------------------------------------------------------- batches */

/* Many independent quantizations and copies in one kernel launch each: the executor's direct
 * path prepares a whole transfer's work once — every piece's pointers, possibly into another
 * GPU's memory opened by CUDA IPC — and runs it at every version with a handful of launches
 * instead of thousands. Strided: a tile's rows need not be contiguous at either end, so a
 * quantization stores straight into its place in a fused destination tensor. */

/* FP8 block quantization of one 2-D tile (blocks as struct wb_quant_tile counts them from
 * (row0, col0)): element (r, c) is read at src + (r * src_ld + c) * elem, its e4m3 byte
 * written at q + r * q_ld + c, and block (i, j) of the tile's grid (wb_quant_fp8_grid over all
 * rows; i, j counted from its first block) gets its scale_inv at scale[i * scale_ld + j]. Bytes
 * and scales equal wb_quant_fp8_block's on the same values. */
struct wb_quant_item {
    enum wb_dtype dtype; /* of the source: bf16, fp16 or fp32 */
    const void *src;
    uint64_t src_ld; /* elements */
    uint8_t *q;
    uint64_t q_ld; /* bytes */
    float *scale;
    uint64_t scale_ld; /* floats */
    uint64_t rows, cols;
    uint64_t row0, col0;
    /* Optional (wb_quant_batch_run_delta): what the destination holds, kept by the caller —
     * the item's e4m3 bytes, rows x cols with row stride cols, and its scales, the grid's
     * rows x columns (wb_quant_fp8_grid over all rows) with row stride its columns. Both or
     * neither; they must not overlap the destination. */
    uint8_t *shadow;
    float *shadow_scale;
};

/* A 2-D byte copy: rows rows of `bytes` bytes, row r from src + r * src_ld to dst + r * dst_ld
 * (rows 1 is a plain copy). */
struct wb_copy_item {
    const void *src;
    void *dst;
    uint64_t rows, bytes, src_ld, dst_ld;
    void *shadow; /* optional: what dst holds, rows x bytes, row stride bytes (below) */
};

struct wb_quant_batch;

/* Checks and prepares a batch (device: the descriptors are copied to the GPU once). The items
 * of one batch must not overlap in what they write. -EINVAL (logged, naming the item) for a bad
 * item, -ENOMEM, -WB_E_NOGPU / -WB_E_CUDA. */
int wb_quant_batch_create(const struct wb_quant_exec *ex, const struct wb_quant_item *q, size_t nq,
                          const struct wb_copy_item *c, size_t nc, struct wb_quant_batch **out);
/* Runs it: every quantization, then every copy (so a copy may read what a quantization of the
 * batch wrote). Device: enqueued on `stream`, one launch per source dtype and alignment class
 * plus one for the copies. Host: done on return. */
int wb_quant_batch_run(struct wb_quant_batch *b, void *stream);
/* Changed-only stores: the same run, where an item with a shadow stores into its destination
 * only the units whose new value differs from the shadow's, and the shadow follows (delta), or
 * stores every unit and fills the shadow with it (!delta: a full update that seeds the
 * shadow). A unit is 4 bytes: of a quantization's e4m3 bytes, counted in each row from the tile's
 * first column and from every 128-column block edge of the global grid after it (the last unit
 * before an edge or the row's end is shorter); of a copy's bytes, counted from each row's start;
 * and each scale (4 bytes). Items without a shadow store everything. Exact only where the
 * destination holds what the shadow holds: the caller's promise (a destination written by
 * anything else since must get !delta). When stored is not NULL, the bytes of the units stored
 * through items with a shadow are added to *stored (device memory for a device batch, ordered
 * on stream; host memory otherwise). */
int wb_quant_batch_run_delta(struct wb_quant_batch *b, void *stream, bool delta, uint64_t *stored);
void wb_quant_batch_free(struct wb_quant_batch *b);

/* ---------------------------------------------------------------- device buffers */

/* Minimal CUDA memory handling for callers without CUDA code of their own (tests, benchmarks,
 * tools). All return -WB_E_NOGPU without a GPU or in a build without CUDA, -WB_E_CUDA when a
 * CUDA call fails. */
int wb_quant_gpu_alloc(size_t bytes, void **out);
void wb_quant_gpu_free(void *p);
/* Copies bytes between any host and device memory, ordered on stream (returns before the copy
 * is done when both sides are device memory or pinned; synchronize first). */
int wb_quant_gpu_copy(void *dst, const void *src, size_t bytes, void *stream);
/* Waits for everything enqueued on stream. */
int wb_quant_gpu_sync(void *stream);

#ifdef __cplusplus
}
#endif

#endif /* WB_QUANT_H */
