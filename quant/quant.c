/* quant.c — the public API of quant/: argument checks, the choice between the CPU reference
 * and the device backend, and the small host helpers of quant.h.
 *
 * Every check happens here, before any work, so both backends receive only valid arguments and
 * a rejected call writes nothing. Messages name the function and the offending argument.
 */
#include "quant/quant_int.h"

#include "common/fpbits.h"

#include <errno.h>

static const char MOD[] = "quant";

static bool is_float_dtype(enum wb_dtype dt)
{
    return dt == WB_DTYPE_BF16 || dt == WB_DTYPE_FP16 || dt == WB_DTYPE_FP32;
}

/* Decides where a call runs. ptrs/names list the call's buffers (NULL entries are ignored). */
static int where(const struct wb_quant_exec *ex, const char *fn, const void *const *ptrs,
                 const char *const *names, size_t n, bool *device)
{
    enum wb_quant_mem mem = ex ? ex->mem : WB_QUANT_AUTO;
    if (mem == WB_QUANT_HOST || mem == WB_QUANT_DEVICE) {
        *device = mem == WB_QUANT_DEVICE;
        return 0;
    }
    if (mem != WB_QUANT_AUTO) {
        wb_log(WB_LOG_ERROR, MOD, "%s: unknown memory kind %d", fn, (int)mem);
        return -EINVAL;
    }
    int first = -1;
    bool first_dev = false;
    for (size_t i = 0; i < n; i++) {
        if (!ptrs[i])
            continue;
        int where = wb_gpu_ptr_device(ptrs[i]);
        if (where == WB_GPU_UNKNOWN) {
            wb_log(WB_LOG_ERROR, MOD, "%s: the CUDA runtime cannot say whether %s is device memory",
                   fn, names[i]);
            return -WB_E_CUDA;
        }
        bool dev = where >= 0;
        if (first < 0) {
            first = (int)i;
            first_dev = dev;
        } else if (dev != first_dev) {
            wb_log(WB_LOG_ERROR, MOD, "%s: %s is %s memory but %s is %s memory", fn, names[first],
                   first_dev ? "device" : "host", names[i], dev ? "device" : "host");
            return -EINVAL;
        }
    }
    *device = first_dev;
    return 0;
}

/* Element accesses need natural alignment on both backends (and 16-byte vectors are used when
 * buffers allow it). */
static int check_align(const char *fn, const void *const *ptrs, const char *const *names,
                       const size_t *align, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (ptrs[i] && (uintptr_t)ptrs[i] % align[i] != 0) {
            wb_log(WB_LOG_ERROR, MOD, "%s: %s is not aligned to its %zu-byte elements", fn,
                   names[i], align[i]);
            return -EINVAL;
        }
    return 0;
}

static void *exec_stream(const struct wb_quant_exec *ex)
{
    return ex ? ex->stream : NULL;
}

/* rows * cols * elem without overflow of size_t (and of the kernels' 64-bit indexing). */
static int check_size(const char *fn, const char *what, uint64_t rows, uint64_t cols, size_t elem)
{
    uint64_t n;
    if (__builtin_mul_overflow(rows, cols, &n) || __builtin_mul_overflow(n, (uint64_t)elem, &n) ||
        n > (uint64_t)SIZE_MAX / 2) {
        wb_log(WB_LOG_ERROR, MOD, "%s: %s of %llu x %llu elements is too large", fn, what,
               (unsigned long long)rows, (unsigned long long)cols);
        return -EINVAL;
    }
    return 0;
}

static int check_tile(const char *fn, const struct wb_quant_tile *t)
{
    if (!t) {
        wb_log(WB_LOG_ERROR, MOD, "%s: tile is NULL", fn);
        return -EINVAL;
    }
    if (!is_float_dtype(t->dtype)) {
        wb_log(WB_LOG_ERROR, MOD, "%s: source dtype %s is not bf16, fp16 or fp32", fn,
               wb_dtype_name(t->dtype));
        return -EINVAL;
    }
    uint64_t end;
    if (__builtin_add_overflow(t->row0, t->rows, &end) ||
        __builtin_add_overflow(t->col0, t->cols, &end)) {
        wb_log(WB_LOG_ERROR, MOD, "%s: tile origin (%llu, %llu) + extents overflow", fn,
               (unsigned long long)t->row0, (unsigned long long)t->col0);
        return -EINVAL;
    }
    return check_size(fn, "tile", t->rows, t->cols, wb_dtype_size(t->dtype));
}

int wb_quant_fp8_grid(const struct wb_quant_tile *t, uint64_t r0, uint64_t r1,
                      struct wb_quant_grid *out)
{
    if (!t || r0 > r1 || r1 > t->rows)
        return -EINVAL;
    struct wb_quant_grid g = {0};
    if (r0 < r1 && t->cols > 0) {
        g.row = (t->row0 + r0) / WB_FP8_BLOCK;
        g.rows = (t->row0 + r1 - 1) / WB_FP8_BLOCK - g.row + 1;
        g.col = t->col0 / WB_FP8_BLOCK;
        g.cols = (t->col0 + t->cols - 1) / WB_FP8_BLOCK - g.col + 1;
    }
    *out = g;
    return 0;
}

/* Checks a pass over rows [r0, r1) of a tile and runs it where its buffers live. */
static int run_pass(const struct wb_quant_exec *ex, const char *fn, struct wb_quant_pass *p)
{
    int rc = check_tile(fn, &p->tile);
    if (rc)
        return rc;
    if (wb_quant_fp8_grid(&p->tile, p->r0, p->r1, &p->grid) != 0) {
        wb_log(WB_LOG_ERROR, MOD, "%s: row range [%llu, %llu) is not inside the tile's %llu rows",
               fn, (unsigned long long)p->r0, (unsigned long long)p->r1,
               (unsigned long long)p->tile.rows);
        return -EINVAL;
    }
    const void *ptrs[] = {p->src, p->q, p->amax_in, p->amax_out, p->scale_inv};
    static const char *const names[] = {"src", "q", "amax", "amax", "scale_inv"};
    bool need_q = p->mode != WB_QUANT_MODE_AMAX;
    if (!p->src || (need_q && !p->q) || (p->mode == WB_QUANT_MODE_AMAX && !p->amax_out) ||
        (p->mode == WB_QUANT_MODE_APPLY && !p->amax_in) ||
        (p->mode == WB_QUANT_MODE_FUSED && !p->scale_inv)) {
        wb_log(WB_LOG_ERROR, MOD, "%s: a required buffer is NULL", fn);
        return -EINVAL;
    }
    const size_t align[] = {wb_dtype_size(p->tile.dtype), 1, 4, 4, 4};
    bool device;
    rc = check_align(fn, ptrs, names, align, WB_ARRAY_LEN(ptrs));
    if (!rc)
        rc = where(ex, fn, ptrs, names, WB_ARRAY_LEN(ptrs), &device);
    if (rc)
        return rc;
    if (p->grid.rows == 0 || p->grid.cols == 0)
        return 0;
    if (device)
        return qt_dev_pass(p, exec_stream(ex), 0);
    qt_cpu_pass(p);
    return 0;
}

int wb_quant_fp8_block(const struct wb_quant_exec *ex, enum wb_dtype dtype, const void *src,
                       uint64_t rows, uint64_t cols, uint8_t *q, float *scale_inv)
{
    struct wb_quant_pass p = {
        .mode = WB_QUANT_MODE_FUSED,
        .tile = {.dtype = dtype, .rows = rows, .cols = cols},
        .r0 = 0,
        .r1 = rows,
        .src = src,
        .q = q,
        .scale_inv = scale_inv,
    };
    return run_pass(ex, "wb_quant_fp8_block", &p);
}

int wb_quant_fp8_amax(const struct wb_quant_exec *ex, const struct wb_quant_tile *t,
                      const void *src, uint64_t r0, uint64_t r1, float *amax)
{
    if (!t)
        return check_tile("wb_quant_fp8_amax", t);
    struct wb_quant_pass p = {
        .mode = WB_QUANT_MODE_AMAX,
        .tile = *t,
        .r0 = r0,
        .r1 = r1,
        .src = src,
        .amax_out = amax,
    };
    return run_pass(ex, "wb_quant_fp8_amax", &p);
}

int wb_quant_fp8_apply(const struct wb_quant_exec *ex, const struct wb_quant_tile *t,
                       const void *src, uint64_t r0, uint64_t r1, const float *amax, uint8_t *q,
                       float *scale_inv)
{
    if (!t)
        return check_tile("wb_quant_fp8_apply", t);
    struct wb_quant_pass p = {
        .mode = WB_QUANT_MODE_APPLY,
        .tile = *t,
        .r0 = r0,
        .r1 = r1,
        .src = src,
        .q = q,
        .amax_in = amax,
        .scale_inv = scale_inv,
    };
    return run_pass(ex, "wb_quant_fp8_apply", &p);
}

void wb_quant_fp8_amax_merge(float *acc, const float *part, size_t n)
{
    /* Partial amax values are non-negative or NaN, so their bit patterns order like the values
     * with every NaN above +inf: an integer max is a NaN-propagating float max. */
    for (size_t i = 0; i < n; i++) {
        uint32_t a = wb_f32_bits(acc[i]) & WB_F32_ABS, b = wb_f32_bits(part[i]) & WB_F32_ABS;
        uint32_t m = a > b ? a : b;
        acc[i] = wb_f32_from_bits(m > WB_F32_INF ? WB_F32_AMAX_NAN : m);
    }
}

float wb_quant_fp8_scale_inv(float amax)
{
    return wb_amax_scale_inv(wb_amax_final(wb_f32_bits(amax) & WB_F32_ABS));
}

uint8_t wb_quant_fp8_encode(float x)
{
    return wb_e4m3_encode(x);
}

float wb_quant_fp8_decode(uint8_t q)
{
    return wb_e4m3_decode(q);
}

/* ---------------------------------------------------------------- copies and casts */

static int run_copy(const struct wb_quant_exec *ex, const char *fn, enum wb_dtype dtype,
                    const struct wb_shape *shape, const struct wb_box *box, const void *src,
                    void *dst, bool unpack)
{
    size_t elem = wb_dtype_size(dtype);
    if (elem == 0) {
        wb_log(WB_LOG_ERROR, MOD, "%s: invalid dtype %d", fn, (int)dtype);
        return -EINVAL;
    }
    if (!shape || !box || !src || !dst) {
        wb_log(WB_LOG_ERROR, MOD, "%s: shape, box, src and dst must not be NULL", fn);
        return -EINVAL;
    }
    struct wb_quant_copy c = {.unpack = unpack, .src = src, .dst = dst};
    if (shape->ndim > WB_MAX_DIMS || box->ndim != shape->ndim ||
        wb_ranges_init(&c.ranges, shape, box, elem) != 0) {
        char sb[160], bb[200];
        wb_log(WB_LOG_ERROR, MOD, "%s: box %s is not inside shape %s", fn,
               box->ndim <= WB_MAX_DIMS ? wb_box_str(box, bb, sizeof(bb)) : "(bad ndim)",
               shape->ndim <= WB_MAX_DIMS ? wb_shape_str(shape, sb, sizeof(sb)) : "(bad ndim)");
        return -EINVAL;
    }
    uint64_t n = wb_shape_numel(shape);
    int rc = check_size(fn, "tensor", n, 1, elem);
    if (rc)
        return rc;
    const void *ptrs[] = {src, dst};
    static const char *const names[] = {"src", "dst"};
    bool device;
    rc = where(ex, fn, ptrs, names, 2, &device);
    if (rc)
        return rc;
    if (wb_ranges_count(&c.ranges) == 0)
        return 0;
    if (device)
        return qt_dev_copy(&c, exec_stream(ex));
    qt_cpu_copy(&c);
    return 0;
}

int wb_quant_pack(const struct wb_quant_exec *ex, enum wb_dtype dtype, const struct wb_shape *shape,
                  const struct wb_box *box, const void *src, void *dst)
{
    return run_copy(ex, "wb_quant_pack", dtype, shape, box, src, dst, false);
}

int wb_quant_unpack(const struct wb_quant_exec *ex, enum wb_dtype dtype,
                    const struct wb_shape *shape, const struct wb_box *box, const void *src,
                    void *dst)
{
    return run_copy(ex, "wb_quant_unpack", dtype, shape, box, src, dst, true);
}

int wb_quant_concat(const struct wb_quant_exec *ex, enum wb_dtype dtype,
                    const struct wb_shape *part_shape, const void *part,
                    const struct wb_shape *whole_shape, uint32_t dim, uint64_t off, void *whole)
{
    static const char fn[] = "wb_quant_concat";
    if (!part_shape || !whole_shape) {
        wb_log(WB_LOG_ERROR, MOD, "%s: shapes must not be NULL", fn);
        return -EINVAL;
    }
    char pb[160], wb[160];
    if (part_shape->ndim != whole_shape->ndim || part_shape->ndim > WB_MAX_DIMS ||
        dim >= part_shape->ndim) {
        wb_log(WB_LOG_ERROR, MOD, "%s: cannot place a %u-d part into a %u-d tensor along dim %u",
               fn, part_shape->ndim, whole_shape->ndim, dim);
        return -EINVAL;
    }
    struct wb_box box = {.ndim = part_shape->ndim};
    for (uint32_t d = 0; d < part_shape->ndim; d++) {
        box.off[d] = d == dim ? off : 0;
        box.ext[d] = part_shape->dim[d];
        uint64_t end;
        if ((d != dim && part_shape->dim[d] != whole_shape->dim[d]) ||
            (d == dim && (__builtin_add_overflow(off, part_shape->dim[d], &end) ||
                          end > whole_shape->dim[d]))) {
            wb_log(WB_LOG_ERROR, MOD, "%s: part %s does not fit whole %s at offset %llu of dim %u",
                   fn, wb_shape_str(part_shape, pb, sizeof(pb)),
                   wb_shape_str(whole_shape, wb, sizeof(wb)), (unsigned long long)off, dim);
            return -EINVAL;
        }
    }
    return run_copy(ex, fn, dtype, whole_shape, &box, part, whole, true);
}

int wb_quant_cast(const struct wb_quant_exec *ex, enum wb_dtype from, const void *src,
                  enum wb_dtype to, void *dst, uint64_t n)
{
    static const char fn[] = "wb_quant_cast";
    if (!is_float_dtype(from) || !is_float_dtype(to)) {
        wb_log(WB_LOG_ERROR, MOD, "%s: cannot cast %s to %s (bf16, fp16 and fp32 only)", fn,
               wb_dtype_name(from), wb_dtype_name(to));
        return -EINVAL;
    }
    if (!src || !dst) {
        wb_log(WB_LOG_ERROR, MOD, "%s: src and dst must not be NULL", fn);
        return -EINVAL;
    }
    int rc = check_size(fn, "tensor", n, 1, 4);
    if (rc)
        return rc;
    const void *ptrs[] = {src, dst};
    static const char *const names[] = {"src", "dst"};
    const size_t align[] = {wb_dtype_size(from), wb_dtype_size(to)};
    bool device;
    rc = check_align(fn, ptrs, names, align, 2);
    if (!rc)
        rc = where(ex, fn, ptrs, names, 2, &device);
    if (rc || n == 0)
        return rc;
    if (device)
        return qt_dev_cast(from, src, to, dst, n, exec_stream(ex));
    qt_cpu_cast(from, src, to, dst, n);
    return 0;
}
