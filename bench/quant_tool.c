/* quant_tool.c — quant/'s operations on raw files, for checking them against other
 * implementations (scripts/gpu/quant_check.py compares with PyTorch), and the exhaustive e4m3
 * encoder check over all 2^32 FP32 inputs.
 *
 *   quant_tool quant --dtype D --rows R --cols C --in X --q Q --scale S [--gpu] [--split N]
 *   quant_tool cast --from D --to D --n N --in X --out Y [--gpu]
 *   quant_tool pack --dtype D --shape 4,6,8 --box 1:2,0:6,3:4 --in X --out Y [--gpu]
 *   quant_tool encode-all [--threads N]
 *
 * Files hold raw little-endian elements, row-major. --gpu runs the CUDA kernels (data copied to
 * and from the device), otherwise the CPU reference runs. --split N quantizes as N owners of
 * consecutive row ranges would: partial amax per range, merged, then apply per range.
 * encode-all compares, for every FP32 bit pattern, the GPU conversion (a FP32 apply with amax
 * 448, i.e. s = 1), the CPU encoder and, in CUDA builds, NVIDIA's host conversion, and prints
 * the number of mismatches of each pair. Lives under bench/ to be built by `make bench`.
 */
#include "quant/quant.h"
#include "quant/quant_int.h" /* qt_nvref_e4m3 */

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f)
{
    fprintf(f,
            "usage: quant_tool quant --dtype D --rows R --cols C --in X --q Q --scale S [--gpu]"
            " [--split N]\n"
            "       quant_tool cast --from D --to D --n N --in X --out Y [--gpu]\n"
            "       quant_tool pack --dtype D --shape d0,d1,.. --box off:ext,.. --in X --out Y"
            " [--gpu]\n"
            "       quant_tool encode-all [--threads N]\n"
            "  Runs quant/'s operations on raw little-endian files (CPU reference, or the CUDA\n"
            "  kernels with --gpu); encode-all checks the e4m3 encoders on all 2^32 FP32 inputs.\n"
            "  D is bf16, fp16, fp32 (pack: any dtype name).\n");
}

struct args {
    const char *cmd;
    enum wb_dtype dtype, from, to;
    uint64_t rows, cols, n, split, threads;
    const char *in, *q, *scale, *out, *shape, *box;
    bool gpu;
};

static int bad(const char *what, const char *val)
{
    fprintf(stderr, "quant_tool: %s: bad value '%s'\n", what, val);
    return -EINVAL;
}

static int parse(int argc, char **argv, struct args *a)
{
    if (argc < 2) {
        usage(stderr);
        return -EINVAL;
    }
    a->cmd = argv[1];
    if (strcmp(a->cmd, "--help") == 0 || strcmp(a->cmd, "-h") == 0) {
        usage(stdout);
        exit(0);
    }
    for (int i = 2; i < argc; i++) {
        const char *k = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(k, "--gpu") == 0) {
            a->gpu = true;
            continue;
        }
        if (strcmp(k, "--help") == 0) {
            usage(stdout);
            exit(0);
        }
        if (!v) {
            fprintf(stderr, "quant_tool: %s needs a value\n", k);
            return -EINVAL;
        }
        i++;
        if (strcmp(k, "--dtype") == 0 || strcmp(k, "--from") == 0 || strcmp(k, "--to") == 0) {
            enum wb_dtype *dt = k[2] == 'd' ? &a->dtype : k[2] == 'f' ? &a->from : &a->to;
            if (wb_dtype_parse(v, dt) != 0)
                return bad(k, v);
        } else if (strcmp(k, "--rows") == 0 || strcmp(k, "--cols") == 0 || strcmp(k, "--n") == 0 ||
                   strcmp(k, "--split") == 0 || strcmp(k, "--threads") == 0) {
            uint64_t x;
            if (wb_parse_u64(v, &x) != 0)
                return bad(k, v);
            *(k[2] == 'r'   ? &a->rows
              : k[2] == 'c' ? &a->cols
              : k[2] == 'n' ? &a->n
              : k[2] == 's' ? &a->split
                            : &a->threads) = x;
        } else if (strcmp(k, "--in") == 0) {
            a->in = v;
        } else if (strcmp(k, "--q") == 0) {
            a->q = v;
        } else if (strcmp(k, "--scale") == 0) {
            a->scale = v;
        } else if (strcmp(k, "--out") == 0) {
            a->out = v;
        } else if (strcmp(k, "--shape") == 0) {
            a->shape = v;
        } else if (strcmp(k, "--box") == 0) {
            a->box = v;
        } else {
            fprintf(stderr, "quant_tool: unknown option '%s'\n", k);
            usage(stderr);
            return -EINVAL;
        }
    }
    return 0;
}

/* ---------------------------------------------------------------- files and buffers */

static int read_file(const char *path, void *buf, size_t n)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "quant_tool: cannot open %s: %s\n", path, strerror(errno));
        return -errno;
    }
    size_t got = fread(buf, 1, n, f);
    int extra = fgetc(f);
    fclose(f);
    if (got != n || extra != EOF) {
        fprintf(stderr, "quant_tool: %s: expected exactly %zu bytes\n", path, n);
        return -EINVAL;
    }
    return 0;
}

static int write_file(const char *path, const void *buf, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(buf, 1, n, f) != n || fclose(f) != 0) {
        fprintf(stderr, "quant_tool: cannot write %s\n", path);
        if (f)
            fclose(f);
        return -EIO;
    }
    return 0;
}

/* A buffer on the host, mirrored on the device when working there. */
struct buf {
    void *h, *d;
    size_t n;
};

static int buf_init(struct buf *b, size_t n, bool gpu)
{
    b->n = n;
    b->d = NULL;
    b->h = malloc(n ? n : 1);
    if (!b->h)
        return -ENOMEM;
    return gpu ? wb_quant_gpu_alloc(n, &b->d) : 0;
}

static void *at(const struct buf *b)
{
    return b->d ? b->d : b->h;
}

static int buf_up(struct buf *b)
{
    int rc = b->d ? wb_quant_gpu_copy(b->d, b->h, b->n, NULL) : 0;
    return rc ? rc : b->d ? wb_quant_gpu_sync(NULL) : 0;
}

static int buf_down(struct buf *b)
{
    int rc = b->d ? wb_quant_gpu_sync(NULL) : 0;
    if (!rc && b->d)
        rc = wb_quant_gpu_copy(b->h, b->d, b->n, NULL);
    return rc ? rc : b->d ? wb_quant_gpu_sync(NULL) : 0;
}

static void buf_free(struct buf *b)
{
    free(b->h);
    wb_quant_gpu_free(b->d);
}

/* ---------------------------------------------------------------- commands */

static int cmd_quant(const struct args *a, const struct wb_quant_exec *ex)
{
    if (!a->in || !a->q || !a->scale || !a->rows || !a->cols) {
        fprintf(stderr, "quant_tool quant: needs --dtype --rows --cols --in --q --scale\n");
        return -EINVAL;
    }
    uint64_t n = a->rows * a->cols, nbr = wb_quant_blocks(a->rows), nbc = wb_quant_blocks(a->cols);
    struct buf x = {0}, q = {0}, s = {0}, amax = {0};
    int rc = buf_init(&x, n * wb_dtype_size(a->dtype), a->gpu);
    if (!rc)
        rc = buf_init(&q, n, a->gpu);
    if (!rc)
        rc = buf_init(&s, nbr * nbc * 4, a->gpu);
    if (!rc)
        rc = buf_init(&amax, nbr * nbc * 4, a->gpu);
    if (!rc)
        rc = read_file(a->in, x.h, x.n);
    if (!rc)
        rc = buf_up(&x);
    if (rc)
        goto out;
    if (a->split <= 1) {
        rc = wb_quant_fp8_block(ex, a->dtype, at(&x), a->rows, a->cols, at(&q), at(&s));
    } else {
        /* owners of row ranges [k*rows/N, (k+1)*rows/N): each a tile at its own origin */
        float *merged = calloc(nbr * nbc, 4);
        rc = merged ? 0 : -ENOMEM;
        for (int phase = 0; phase < 2 && !rc; phase++)
            for (uint64_t k = 0; k < a->split && !rc; k++) {
                uint64_t r0 = k * a->rows / a->split, r1 = (k + 1) * a->rows / a->split;
                struct wb_quant_tile t = {a->dtype, r1 - r0, a->cols, r0, 0};
                const char *src = (const char *)at(&x) + r0 * a->cols * wb_dtype_size(a->dtype);
                struct wb_quant_grid g;
                if ((rc = wb_quant_fp8_grid(&t, 0, t.rows, &g)) || g.rows == 0)
                    continue;
                if (phase == 0) {
                    if (!(rc = wb_quant_fp8_amax(ex, &t, src, 0, t.rows, at(&amax))) &&
                        !(rc = buf_down(&amax)))
                        wb_quant_fp8_amax_merge(merged + g.row * nbc, amax.h, g.rows * nbc);
                } else {
                    memcpy(amax.h, merged + g.row * nbc, g.rows * nbc * 4);
                    if (!(rc = buf_up(&amax)))
                        rc = wb_quant_fp8_apply(ex, &t, src, 0, t.rows, at(&amax),
                                                (uint8_t *)at(&q) + r0 * a->cols,
                                                (float *)at(&s) + g.row * nbc);
                    if (!rc && a->gpu) /* amax is reused by the next owner */
                        rc = wb_quant_gpu_sync(NULL);
                }
            }
        free(merged);
    }
    if (!rc)
        rc = buf_down(&q);
    if (!rc)
        rc = buf_down(&s);
    if (!rc)
        rc = write_file(a->q, q.h, q.n);
    if (!rc)
        rc = write_file(a->scale, s.h, s.n);
out:
    buf_free(&x);
    buf_free(&q);
    buf_free(&s);
    buf_free(&amax);
    return rc;
}

static int cmd_cast(const struct args *a, const struct wb_quant_exec *ex)
{
    if (!a->in || !a->out || !a->n) {
        fprintf(stderr, "quant_tool cast: needs --from --to --n --in --out\n");
        return -EINVAL;
    }
    struct buf x = {0}, y = {0};
    int rc = buf_init(&x, a->n * wb_dtype_size(a->from), a->gpu);
    if (!rc)
        rc = buf_init(&y, a->n * wb_dtype_size(a->to), a->gpu);
    if (!rc)
        rc = read_file(a->in, x.h, x.n);
    if (!rc)
        rc = buf_up(&x);
    if (!rc)
        rc = wb_quant_cast(ex, a->from, at(&x), a->to, at(&y), a->n);
    if (!rc)
        rc = buf_down(&y);
    if (!rc)
        rc = write_file(a->out, y.h, y.n);
    buf_free(&x);
    buf_free(&y);
    return rc;
}

/* "4,6,8" -> dims; "1:2,0:6,3:4" -> off:ext pairs. */
static int parse_list(const char *s, bool pairs, uint32_t *ndim, uint64_t *v0, uint64_t *v1)
{
    uint32_t n = 0;
    const char *p = s;
    while (*p) {
        char *end;
        if (n == WB_MAX_DIMS)
            return -EINVAL;
        v0[n] = strtoull(p, &end, 10);
        if (end == p)
            return -EINVAL;
        p = end;
        if (pairs) {
            if (*p++ != ':')
                return -EINVAL;
            v1[n] = strtoull(p, &end, 10);
            if (end == p)
                return -EINVAL;
            p = end;
        }
        n++;
        if (*p == ',')
            p++;
        else if (*p)
            return -EINVAL;
    }
    *ndim = n;
    return 0;
}

static int cmd_pack(const struct args *a, const struct wb_quant_exec *ex)
{
    struct wb_shape s = {0};
    struct wb_box b = {0};
    if (!a->in || !a->out || !a->shape || !a->box || wb_dtype_size(a->dtype) == 0) {
        fprintf(stderr, "quant_tool pack: needs --dtype --shape --box --in --out\n");
        return -EINVAL;
    }
    if (parse_list(a->shape, false, &s.ndim, s.dim, NULL) ||
        parse_list(a->box, true, &b.ndim, b.off, b.ext))
        return bad("--shape/--box", a->box);
    size_t es = wb_dtype_size(a->dtype);
    struct buf x = {0}, y = {0};
    int rc = buf_init(&x, wb_shape_numel(&s) * es, a->gpu);
    if (!rc)
        rc = buf_init(&y, wb_box_numel(&b) * es, a->gpu);
    if (!rc)
        rc = read_file(a->in, x.h, x.n);
    if (!rc)
        rc = buf_up(&x);
    if (!rc)
        rc = wb_quant_pack(ex, a->dtype, &s, &b, at(&x), at(&y));
    if (!rc)
        rc = buf_down(&y);
    if (!rc)
        rc = write_file(a->out, y.h, y.n);
    buf_free(&x);
    buf_free(&y);
    return rc;
}

/* ---- encode-all */

struct nv_job {
    uint64_t from, to, mismatches;
    uint32_t first;
};

static void *nv_worker(void *arg)
{
    struct nv_job *j = arg;
    for (uint64_t u = j->from; u < j->to; u++) {
        float x;
        uint32_t b = (uint32_t)u;
        uint8_t nv;
        memcpy(&x, &b, 4);
        if (qt_nvref_e4m3(x, &nv) != 0 || nv != wb_quant_fp8_encode(x)) {
            if (!j->mismatches++)
                j->first = b;
        }
    }
    return NULL;
}

static int cmd_encode_all(const struct args *a)
{
    uint8_t probe;
    int rc = 0;
    uint64_t threads = a->threads ? a->threads : 16;
    if (threads > 256)
        threads = 256;
    if (qt_nvref_e4m3(1.0f, &probe) == 0) {
        struct nv_job jobs[256];
        pthread_t tid[256];
        uint64_t total = 1ull << 32, bad_n = 0;
        uint32_t first = 0;
        for (uint64_t t = 0; t < threads; t++) {
            jobs[t] = (struct nv_job){total * t / threads, total * (t + 1) / threads, 0, 0};
            if (pthread_create(&tid[t], NULL, nv_worker, &jobs[t]) != 0)
                return -EAGAIN;
        }
        for (uint64_t t = 0; t < threads; t++) {
            pthread_join(tid[t], NULL);
            if (jobs[t].mismatches && !bad_n)
                first = jobs[t].first;
            bad_n += jobs[t].mismatches;
        }
        printf("encode-all: CPU encoder vs NVIDIA host conversion: %llu of 2^32 differ",
               (unsigned long long)bad_n);
        if (bad_n)
            printf(" (first 0x%08x)", first);
        printf("\n");
        rc = bad_n ? 1 : 0;
    } else {
        printf("encode-all: CPU encoder vs NVIDIA host conversion: skipped (built without CUDA)"
               "\n");
    }
    if (wb_gpu_count() == 0) {
        printf("encode-all: GPU vs CPU encoder: skipped (no usable GPU)\n");
        return rc;
    }
    /* GPU: chunks of 2^28 patterns as a 2^18 x 1024 FP32 tile, amax 448 everywhere (s == 1) */
    enum { COLS = 1024, ROWS = 1 << 18 };
    const uint64_t chunk = (uint64_t)ROWS * COLS, nblk = (ROWS / 128) * (COLS / 128);
    uint32_t *u = malloc(chunk * 4);
    uint8_t *q = malloc(chunk);
    float *amax = malloc(nblk * 4);
    void *du = NULL, *dq = NULL, *da = NULL;
    if (!u || !q || !amax)
        rc = -ENOMEM;
    if (!rc)
        rc = wb_quant_gpu_alloc(chunk * 4, &du);
    if (!rc)
        rc = wb_quant_gpu_alloc(chunk, &dq);
    if (!rc)
        rc = wb_quant_gpu_alloc(nblk * 4, &da);
    for (uint64_t i = 0; i < nblk && !rc; i++)
        amax[i] = 448.0f;
    if (!rc)
        rc = wb_quant_gpu_copy(da, amax, nblk * 4, NULL);
    uint64_t bad_n = 0;
    uint32_t first = 0;
    struct wb_quant_exec dev = {WB_QUANT_DEVICE, NULL};
    struct wb_quant_tile t = {WB_DTYPE_FP32, ROWS, COLS, 0, 0};
    for (uint64_t base = 0; base < (1ull << 32) && !rc; base += chunk) {
        for (uint64_t i = 0; i < chunk; i++)
            u[i] = (uint32_t)(base + i);
        if ((rc = wb_quant_gpu_copy(du, u, chunk * 4, NULL)) ||
            (rc = wb_quant_fp8_apply(&dev, &t, du, 0, ROWS, da, dq, NULL)) ||
            (rc = wb_quant_gpu_sync(NULL)) || (rc = wb_quant_gpu_copy(q, dq, chunk, NULL)) ||
            (rc = wb_quant_gpu_sync(NULL)))
            break;
        for (uint64_t i = 0; i < chunk; i++) {
            float x;
            memcpy(&x, &u[i], 4);
            if (q[i] != wb_quant_fp8_encode(x) && !bad_n++)
                first = u[i];
        }
    }
    if (!rc) {
        printf("encode-all: GPU (cvt.rn.satfinite.e4m3x2.f32) vs CPU encoder: %llu of 2^32 "
               "differ",
               (unsigned long long)bad_n);
        if (bad_n)
            printf(" (first 0x%08x)", first);
        printf("\n");
        rc = bad_n ? 1 : 0;
    }
    wb_quant_gpu_free(du);
    wb_quant_gpu_free(dq);
    wb_quant_gpu_free(da);
    free(u);
    free(q);
    free(amax);
    return rc;
}

int main(int argc, char **argv)
{
    struct args a = {.dtype = WB_DTYPE_BF16};
    if (parse(argc, argv, &a) != 0)
        return 2;
    struct wb_quant_exec ex = {a.gpu ? WB_QUANT_DEVICE : WB_QUANT_HOST, NULL};
    int rc;
    if (strcmp(a.cmd, "quant") == 0)
        rc = cmd_quant(&a, &ex);
    else if (strcmp(a.cmd, "cast") == 0)
        rc = cmd_cast(&a, &ex);
    else if (strcmp(a.cmd, "pack") == 0)
        rc = cmd_pack(&a, &ex);
    else if (strcmp(a.cmd, "encode-all") == 0)
        rc = cmd_encode_all(&a);
    else {
        fprintf(stderr, "quant_tool: unknown command '%s'\n", a.cmd);
        usage(stderr);
        return 2;
    }
    if (rc < 0)
        fprintf(stderr, "quant_tool %s: %s\n", a.cmd, wb_strerror(rc));
    return rc ? 1 : 0;
}
