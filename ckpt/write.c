/* write.c — a real safetensors checkpoint of an inventory, values from the synthetic source,
 * for tests and benchmarks: the files a Hugging Face save_pretrained writes (an index and
 * model-0000K-of-0000N.safetensors, or one model.safetensors), tensors contiguous in the data
 * area, the header padded with spaces to 8 bytes as the safetensors library pads it.
 *
 * Values are generated a strip of rows at a time (at most CHUNK bytes, or 128 rows for FP8, one
 * quantization block row), so a checkpoint of any size is written in bounded memory. */
#include "ckpt/ckpriv.h"
#include "quant/quant.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

enum { CHUNK = 16 << 20 };

static const char *const st_names[WB_DTYPE_COUNT] = {
    [WB_DTYPE_BF16] = "BF16",        [WB_DTYPE_FP16] = "F16", [WB_DTYPE_FP32] = "F32",
    [WB_DTYPE_FP8_E4M3] = "F8_E4M3", [WB_DTYPE_I32] = "I32",  [WB_DTYPE_I64] = "I64",
};

const char *ck_st_dtype(enum wb_dtype dt)
{
    return (unsigned)dt < WB_DTYPE_COUNT ? st_names[dt] : NULL;
}

/* An output file with a write buffer. */
struct out {
    int fd;
    char *buf;
    size_t len;
    int err;
};

/* Writes n bytes from p past the buffer (which must be empty). */
static void out_write(struct out *w, const void *p, size_t len)
{
    for (size_t off = 0; !w->err && off < len;) {
        ssize_t n = write(w->fd, (const char *)p + off, len - off);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            w->err = -errno;
        else
            off += (size_t)n;
    }
}

static void out_flush(struct out *w)
{
    out_write(w, w->buf, w->len);
    w->len = 0;
}

/* Room for n more bytes (n <= CHUNK), returned for the caller to fill. */
static void *out_reserve(struct out *w, size_t n)
{
    if (w->len + n > CHUNK)
        out_flush(w);
    void *p = w->buf + w->len;
    w->len += n;
    return p;
}

/* Appends n bytes of any size. */
static void out_put(struct out *w, const void *p, size_t n)
{
    if (n <= CHUNK) {
        memcpy(out_reserve(w, n), p, n);
        return;
    }
    out_flush(w);
    out_write(w, p, n);
}

static const char SCALE_SUFFIX[] = "_scale_inv";

/* The FP8 value tensor (>= 2 dims) whose scales tensor t holds, or -1. */
static ssize_t scale_of(const struct wb_inventory *inv, size_t t)
{
    const struct wb_param *p = &inv->p[t];
    size_t n = strlen(p->name), sn = sizeof(SCALE_SUFFIX) - 1;
    if (p->dtype != WB_DTYPE_FP32 || n <= sn || strcmp(p->name + n - sn, SCALE_SUFFIX) != 0)
        return -1;
    char v[WB_NAME_MAX];
    memcpy(v, p->name, n - sn);
    v[n - sn] = 0;
    ssize_t k = wb_inv_find(inv, v);
    if (k < 0 || inv->p[k].dtype != WB_DTYPE_FP8_E4M3 || inv->p[k].shape.ndim < 2)
        return -1;
    struct wb_box full = wb_box_full(&inv->p[k].shape), sb;
    if (wb_scale_box(&full, WB_FP8_BLOCK, &sb) != 0)
        return -1;
    struct wb_shape ss = wb_box_shape(&sb);
    return wb_shape_eq(&ss, &p->shape) ? k : -1;
}

/* FP8 tensor k quantized strip by strip (128 rows of each matrix over the last two dims):
 * writes the values (scales == false) or the scales. */
static int write_fp8(struct out *w, const struct wb_param *p, const struct wb_ckpt_write_opts *o,
                     bool scales)
{
    uint32_t nd = p->shape.ndim;
    uint64_t rows = p->shape.dim[nd - 2], cols = p->shape.dim[nd - 1], lead = 1;
    for (uint32_t d = 0; d + 2 < nd; d++)
        lead *= p->shape.dim[d];
    uint64_t bcols = wb_quant_blocks(cols);
    uint16_t *src = malloc(WB_FP8_BLOCK * cols * 2 + 1);
    uint8_t *q = malloc(WB_FP8_BLOCK * cols + 1);
    float *s = malloc(bcols * sizeof(float) + 1);
    int err = src && q && s ? 0 : -ENOMEM;
    struct wb_quant_exec ex = {WB_QUANT_HOST, NULL};
    for (uint64_t l = 0; !err && l < lead; l++) {
        for (uint64_t r0 = 0; !err && r0 < rows; r0 += WB_FP8_BLOCK) {
            uint64_t nr = rows - r0 < WB_FP8_BLOCK ? rows - r0 : WB_FP8_BLOCK;
            struct wb_box b = wb_box_full(&p->shape);
            uint64_t rest = l;
            for (uint32_t d = nd - 2; d-- > 0;) {
                b.off[d] = rest % p->shape.dim[d];
                b.ext[d] = 1;
                rest /= p->shape.dim[d];
            }
            b.off[nd - 2] = r0;
            b.ext[nd - 2] = nr;
            err = wb_synth_fill(p->name, o->seed, o->version, WB_DTYPE_BF16, &p->shape, &b, src);
            err = err ? err : wb_quant_fp8_block(&ex, WB_DTYPE_BF16, src, nr, cols, q, s);
            if (err)
                break;
            if (scales)
                out_put(w, s, bcols * sizeof(float));
            else
                out_put(w, q, nr * cols);
        }
    }
    free(src);
    free(q);
    free(s);
    return err;
}

static int write_tensor(struct out *w, const struct wb_inventory *inv, size_t t,
                        const struct wb_ckpt_write_opts *o)
{
    const struct wb_param *p = &inv->p[t];
    if (p->dtype == WB_DTYPE_FP8_E4M3 && p->shape.ndim >= 2)
        return write_fp8(w, p, o, false);
    ssize_t v = scale_of(inv, t);
    if (v >= 0)
        return write_fp8(w, &inv->p[v], o, true);
    size_t es = wb_dtype_size(p->dtype);
    uint64_t numel = wb_shape_numel(&p->shape);
    if (numel == 0)
        return 0;
    uint64_t rows = p->shape.ndim ? p->shape.dim[0] : 1, row = numel / rows;
    /* rows per strip: CHUNK bytes, at least one row (a row above CHUNK, never seen in a model,
     * is generated into its own buffer) */
    uint64_t per = CHUNK / (row * es) ? CHUNK / (row * es) : 1;
    float *f32 = p->dtype == WB_DTYPE_FP8_E4M3 ? malloc(per * row * sizeof(float)) : NULL;
    if (p->dtype == WB_DTYPE_FP8_E4M3 && !f32)
        return -ENOMEM;
    int err = 0;
    for (uint64_t r0 = 0; !err && r0 < rows; r0 += per) {
        uint64_t nr = rows - r0 < per ? rows - r0 : per;
        size_t n = (size_t)(nr * row * es);
        bool big = n > CHUNK;
        if (big)
            out_flush(w);
        void *dst = big ? malloc(n) : out_reserve(w, n);
        if (!dst) {
            err = -ENOMEM;
            break;
        }
        struct wb_box b = wb_box_full(&p->shape);
        if (b.ndim) {
            b.off[0] = r0;
            b.ext[0] = nr;
        }
        switch (p->dtype) {
        case WB_DTYPE_BF16:
        case WB_DTYPE_FP16:
        case WB_DTYPE_FP32:
            err = wb_synth_fill(p->name, o->seed, o->version, p->dtype, &p->shape, &b, dst);
            break;
        case WB_DTYPE_FP8_E4M3: /* 0-d and 1-d: no blocks, each value encoded alone */
            err = wb_synth_fill(p->name, o->seed, o->version, WB_DTYPE_FP32, &p->shape, &b, f32);
            for (uint64_t i = 0; !err && i < nr * row; i++)
                ((uint8_t *)dst)[i] = wb_quant_fp8_encode(f32[i]);
            break;
        default:
            memset(dst, 0, n);
        }
        if (big) {
            out_write(w, dst, n);
            free(dst);
        }
    }
    free(f32);
    return err;
}

static int json_put(json_t *obj, const char *key, json_t *v)
{
    return v && json_object_set_new(obj, key, v) == 0 ? 0 : -ENOMEM;
}

/* The header of tensors [a, b): JSON, padded with spaces to a multiple of 8. */
static char *header(const struct wb_inventory *inv, size_t a, size_t b,
                    const struct wb_ckpt_write_opts *o, size_t *len)
{
    json_t *root = json_object(), *meta = json_object();
    int err = root && meta ? 0 : -ENOMEM;
    if (!err) {
        err = json_put(meta, "format", json_string(o->metadata ? o->metadata : "pt"));
        err = err ? err : json_put(root, "__metadata__", json_incref(meta));
    }
    uint64_t off = 0;
    for (size_t t = a; !err && t < b; t++) {
        const struct wb_param *p = &inv->p[t];
        uint64_t bytes = wb_shape_numel(&p->shape) * wb_dtype_size(p->dtype);
        json_t *e = json_object(), *sh = json_array(), *of = json_array();
        err = e && sh && of ? 0 : -ENOMEM;
        for (uint32_t d = 0; !err && d < p->shape.ndim; d++)
            err = json_array_append_new(sh, json_integer((json_int_t)p->shape.dim[d]));
        err = err ? err : json_array_append_new(of, json_integer((json_int_t)off));
        err = err ? err : json_array_append_new(of, json_integer((json_int_t)(off + bytes)));
        err = err ? err : json_put(e, "dtype", json_string(ck_st_dtype(p->dtype)));
        err = err ? err : json_put(e, "shape", json_incref(sh));
        err = err ? err : json_put(e, "data_offsets", json_incref(of));
        err = err ? err : json_put(root, p->name, json_incref(e));
        json_decref(e);
        json_decref(sh);
        json_decref(of);
        off += bytes;
    }
    char *s = err ? NULL : json_dumps(root, JSON_COMPACT);
    json_decref(meta);
    json_decref(root);
    if (!s)
        return NULL;
    size_t n = strlen(s), pad = (8 - n % 8) % 8;
    char *h = realloc(s, n + pad + 1);
    if (!h) {
        free(s);
        return NULL;
    }
    memset(h + n, ' ', pad);
    h[n + pad] = 0;
    *len = n + pad;
    return h;
}

static int write_file(const char *dir, const char *name, const struct wb_inventory *inv, size_t a,
                      size_t b, const struct wb_ckpt_write_opts *o, char *buf,
                      struct wb_errlist *el)
{
    char path[4096];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    size_t hlen = 0;
    char *h = header(inv, a, b, o, &hlen);
    if (!h)
        return -ENOMEM;
    struct out w = {.fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644), .buf = buf};
    if (w.fd < 0) {
        int e = errno;
        wb_errlist_add(el, "%s: cannot create: %s", path, strerror(e));
        free(h);
        return -e;
    }
    uint8_t *lb = out_reserve(&w, 8);
    for (int i = 0; i < 8; i++)
        lb[i] = (uint8_t)((uint64_t)hlen >> (8 * i));
    for (size_t off = 0; off < hlen; off += CHUNK / 2) {
        size_t n = hlen - off < CHUNK / 2 ? hlen - off : CHUNK / 2;
        memcpy(out_reserve(&w, n), h + off, n);
    }
    free(h);
    int err = 0;
    for (size_t t = a; !err && !w.err && t < b; t++)
        err = write_tensor(&w, inv, t, o);
    out_flush(&w);
    err = err ? err : w.err;
    if (close(w.fd) != 0 && !err)
        err = -errno;
    if (err)
        wb_errlist_add(el, "%s: cannot write: %s", path, wb_strerror(err));
    return err;
}

static int write_index(const char *dir, const struct wb_inventory *inv, const uint32_t *file,
                       char (*names)[64], uint64_t total, struct wb_errlist *el)
{
    json_t *root = json_object(), *meta = json_object(), *wm = json_object();
    int err = root && meta && wm ? 0 : -ENOMEM;
    err = err ? err : json_put(meta, "total_size", json_integer((json_int_t)total));
    for (size_t t = 0; !err && t < inv->n; t++)
        err = json_put(wm, inv->p[t].name, json_string(names[file[t]]));
    err = err ? err : json_put(root, "metadata", json_incref(meta));
    err = err ? err : json_put(root, "weight_map", json_incref(wm));
    char path[4096];
    snprintf(path, sizeof(path), "%s/%s", dir, WB_CKPT_INDEX);
    if (!err && json_dump_file(root, path, JSON_INDENT(2) | JSON_SORT_KEYS) != 0) {
        wb_errlist_add(el, "%s: cannot write", path);
        err = -EIO;
    }
    json_decref(meta);
    json_decref(wm);
    json_decref(root);
    return err;
}

int wb_ckpt_write(const char *dir, const struct wb_inventory *inv,
                  const struct wb_ckpt_write_opts *o, struct wb_errlist *el)
{
    struct wb_ckpt_write_opts def = {0};
    if (!o)
        o = &def;
    for (size_t t = 0; t < inv->n; t++)
        if (!ck_st_dtype(inv->p[t].dtype))
            return -EINVAL;
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
        int e = errno;
        wb_errlist_add(el, "%s: cannot create: %s", dir, strerror(e));
        return -e;
    }
    size_t nf = o->files > 1 ? o->files : 1;
    if (nf > inv->n && inv->n)
        nf = inv->n;
    if (nf > 99999)
        return -EINVAL;
    uint64_t total = 0;
    for (size_t t = 0; t < inv->n; t++)
        total += wb_shape_numel(&inv->p[t].shape) * wb_dtype_size(inv->p[t].dtype);
    /* file of each tensor: by the position of its first byte in the whole, never skipping a
     * file and leaving at least one tensor for every file after it */
    uint32_t *file = calloc(inv->n + 1, sizeof(*file));
    char(*names)[64] = calloc(nf, sizeof(*names));
    char *buf = malloc(CHUNK);
    int err = file && names && buf ? 0 : -ENOMEM;
    uint64_t pos = 0;
    for (size_t t = 0; !err && t < inv->n; t++) {
        uint64_t f = total ? (uint64_t)((unsigned __int128)pos * nf / total) : t * nf / inv->n;
        uint64_t prev = t ? file[t - 1] : 0;
        if (f > nf - 1) /* zero-byte tensors at the very end */
            f = nf - 1;
        if (f < prev)
            f = prev;
        if (f > prev + (t > 0))
            f = prev + (t > 0);
        if (f + (inv->n - t) < nf)
            f = nf - (inv->n - t);
        file[t] = (uint32_t)f;
        pos += wb_shape_numel(&inv->p[t].shape) * wb_dtype_size(inv->p[t].dtype);
    }
    for (size_t f = 0; !err && f < nf; f++)
        if (nf == 1)
            snprintf(names[f], sizeof(names[f]), "model.safetensors");
        else
            snprintf(names[f], sizeof(names[f]), "model-%05zu-of-%05zu.safetensors", f + 1, nf);
    for (size_t a = 0, f = 0; !err && f < nf; f++) {
        size_t b = a;
        while (b < inv->n && file[b] == f)
            b++;
        err = write_file(dir, names[f], inv, a, b, o, buf, el);
        a = b;
    }
    if (!err && nf > 1)
        err = write_index(dir, inv, file, names, total, el);
    free(file);
    free(names);
    free(buf);
    return err;
}
