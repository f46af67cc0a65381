/* quant_bench.c — throughput of FP8 128x128 block quantization against a plain copy measured in
 * the same run.
 *
 * With a GPU: a 7168x18432 BF16 tensor -> FP8 + FP32 scales (the kernel at each CTA size it
 * can be built with; 256 is the default), against a device-to-device cudaMemcpy of the input,
 * and the same for a 1 MiB tensor (512x1024, launch-bound). GB/s counts bytes read + written:
 * 2 + 1 per element plus 4 per block for quantization, 2 x the input size for the copy.
 * Without a GPU (or with --cpu): the CPU reference on one thread against memcpy, for BF16, FP16
 * and FP32 input and for the split form (partial amax, then apply), printing GB/s of input and
 * of bytes read + written. The PyTorch eager and torch.compile figures come from
 * scripts/gpu/quant_bench.py, which reads the --tsv output and prints one table.
 */
#include "quant/quant.h"
#include "quant/quant_int.h" /* qt_dev_pass: CTA-size variants */

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct opts {
    bool cpu;
    uint64_t rows, cols;
    unsigned reps;
    const char *tsv;
};

struct result {
    const char *name;
    uint64_t rows, cols;
    uint64_t bytes;    /* read + written per run */
    double sec;        /* best time per run */
    uint64_t in_bytes; /* input bytes per run, when printed (CPU) */
};

static void usage(FILE *f)
{
    fprintf(f, "usage: quant_bench [--cpu] [--rows N --cols N] [--reps N] [--tsv FILE]\n"
               "  Times FP8 128x128 block quantization against a copy of the input measured in\n"
               "  the same run: on the GPU when one is usable (7168x18432 and 1 MiB BF16),\n"
               "  else (or with --cpu) the CPU reference on one thread against memcpy\n"
               "  (default 2048x7168).\n"
               "  --rows/--cols  tensor shape (the GPU run adds the 1 MiB case)\n"
               "  --reps N       timed repetitions, the best is reported (default 5)\n"
               "  --tsv FILE     also write name, shape, bytes, seconds, GB/s per line\n");
}

static int parse(int argc, char **argv, struct opts *o)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        uint64_t v;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            exit(0);
        } else if (strcmp(a, "--cpu") == 0) {
            o->cpu = true;
        } else if (i + 1 < argc && (strcmp(a, "--rows") == 0 || strcmp(a, "--cols") == 0 ||
                                    strcmp(a, "--reps") == 0)) {
            if (wb_parse_u64(argv[++i], &v) != 0 || v == 0 || v > (1u << 24)) {
                fprintf(stderr, "quant_bench: %s: '%s' is not a number in 1..16777216\n", a,
                        argv[i]);
                return -EINVAL;
            }
            if (a[2] == 'r' && a[3] == 'o')
                o->rows = v;
            else if (a[2] == 'c')
                o->cols = v;
            else
                o->reps = (unsigned)v;
        } else if (i + 1 < argc && strcmp(a, "--tsv") == 0) {
            o->tsv = argv[++i];
        } else {
            fprintf(stderr, "quant_bench: unknown or incomplete argument '%s'\n", a);
            usage(stderr);
            return -EINVAL;
        }
    }
    return 0;
}

static uint64_t rng_next(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* BF16 values of varied sign and magnitude (about N(0,1) scaled per row), never NaN/inf. */
static void fill_bf16(uint16_t *x, uint64_t n, uint64_t seed)
{
    for (uint64_t i = 0; i < n; i++) {
        uint64_t r = rng_next(&seed);
        uint16_t exp = (uint16_t)(120 + (r & 7));
        x[i] = (uint16_t)(((r >> 8) & 0x8000) | (exp << 7) | ((r >> 20) & 0x7f));
    }
}

static double gbps(const struct result *r)
{
    return (double)r->bytes / r->sec / 1e9;
}

static void print_row(const struct result *r, const struct result *base, FILE *tsv)
{
    char shape[64];
    snprintf(shape, sizeof(shape), "%llux%llu", (unsigned long long)r->rows,
             (unsigned long long)r->cols);
    printf("  %-30s %-11s %10.1f us %8.2f GB/s", r->name, shape, r->sec * 1e6, gbps(r));
    if (r->in_bytes)
        printf("  input %6.2f GB/s", (double)r->in_bytes / r->sec / 1e9);
    if (base && base != r)
        printf("  %5.2fx %s", gbps(r) / gbps(base), base->name);
    printf("\n");
    if (tsv)
        fprintf(tsv, "%s\t%s\t%llu\t%.9f\t%.3f\n", r->name, shape, (unsigned long long)r->bytes,
                r->sec, gbps(r));
}

/* ---------------------------------------------------------------- GPU */

enum gpu_op { OP_COPY, OP_QUANT };

struct gpu_case {
    enum gpu_op op;
    unsigned threads; /* 0: through the public API */
    uint64_t rows, cols;
    void *x, *y;
    uint8_t *q;
    float *s;
};

static int gpu_run(const struct gpu_case *c)
{
    if (c->op == OP_COPY)
        return wb_quant_gpu_copy(c->y, c->x, c->rows * c->cols * 2, NULL);
    if (c->threads == 0) {
        struct wb_quant_exec dev = {WB_QUANT_DEVICE, NULL};
        return wb_quant_fp8_block(&dev, WB_DTYPE_BF16, c->x, c->rows, c->cols, c->q, c->s);
    }
    struct wb_quant_pass p = {
        .mode = WB_QUANT_MODE_FUSED,
        .tile = {WB_DTYPE_BF16, c->rows, c->cols, 0, 0},
        .r0 = 0,
        .r1 = c->rows,
        .src = c->x,
        .q = c->q,
        .scale_inv = c->s,
    };
    if (wb_quant_fp8_grid(&p.tile, 0, c->rows, &p.grid) != 0)
        return -EINVAL;
    return qt_dev_pass(&p, NULL, c->threads);
}

/* Best time per run over reps batches, each batch sized to take about 50 ms. */
static int gpu_time(const struct gpu_case *c, unsigned reps, double *best)
{
    int rc = 0;
    for (int i = 0; i < 3 && !rc; i++)
        rc = gpu_run(c);
    if (rc || (rc = wb_quant_gpu_sync(NULL)))
        return rc;
    uint64_t t0 = wb_now_ns();
    rc = gpu_run(c);
    if (rc || (rc = wb_quant_gpu_sync(NULL)))
        return rc;
    uint64_t one = wb_now_ns() - t0;
    unsigned iters = (unsigned)(50000000ull / (one ? one : 1));
    iters = iters < 5 ? 5 : iters > 20000 ? 20000 : iters;
    *best = 1e30;
    for (unsigned r = 0; r < reps; r++) {
        t0 = wb_now_ns();
        for (unsigned i = 0; i < iters && !rc; i++)
            rc = gpu_run(c);
        if (rc || (rc = wb_quant_gpu_sync(NULL)))
            return rc;
        double t = (double)(wb_now_ns() - t0) / 1e9 / iters;
        *best = t < *best ? t : *best;
    }
    return 0;
}

static int gpu_shape(uint64_t rows, uint64_t cols, const struct opts *o, FILE *tsv)
{
    uint64_t n = rows * cols, nb = wb_quant_blocks(rows) * wb_quant_blocks(cols);
    struct gpu_case c = {.rows = rows, .cols = cols};
    uint16_t *h = malloc(n * 2);
    int rc = h ? 0 : -ENOMEM;
    if (!rc)
        rc = wb_quant_gpu_alloc(n * 2, &c.x);
    if (!rc)
        rc = wb_quant_gpu_alloc(n * 2, &c.y);
    if (!rc)
        rc = wb_quant_gpu_alloc(n, (void **)&c.q);
    if (!rc)
        rc = wb_quant_gpu_alloc(nb * 4, (void **)&c.s);
    if (rc)
        goto out;
    fill_bf16(h, n, 42);
    if ((rc = wb_quant_gpu_copy(c.x, h, n * 2, NULL)) || (rc = wb_quant_gpu_sync(NULL)))
        goto out;
    static const struct {
        const char *name;
        enum gpu_op op;
        unsigned threads;
    } cases[] = {
        {"copy D2D (cudaMemcpy)", OP_COPY, 0},       {"fp8 block, 256 threads (API)", OP_QUANT, 0},
        {"fp8 block, 128 threads", OP_QUANT, 128},   {"fp8 block, 512 threads", OP_QUANT, 512},
        {"fp8 block, 1024 threads", OP_QUANT, 1024},
    };
    struct result res[WB_ARRAY_LEN(cases)];
    for (size_t i = 0; i < WB_ARRAY_LEN(cases); i++) {
        c.op = cases[i].op;
        c.threads = cases[i].threads;
        res[i] =
            (struct result){cases[i].name, rows, cols, c.op == OP_COPY ? 4 * n : 3 * n + 4 * nb, 0};
        if ((rc = gpu_time(&c, o->reps, &res[i].sec)))
            goto out;
        print_row(&res[i], &res[0], tsv);
    }
out:
    if (rc)
        fprintf(stderr, "quant_bench: GPU %llux%llu: %s\n", (unsigned long long)rows,
                (unsigned long long)cols, wb_strerror(rc));
    wb_quant_gpu_free(c.x);
    wb_quant_gpu_free(c.y);
    wb_quant_gpu_free(c.q);
    wb_quant_gpu_free(c.s);
    free(h);
    return rc;
}

/* ---------------------------------------------------------------- CPU */

static double cpu_best(unsigned reps, int (*fn)(void *), void *arg)
{
    double best = 1e30;
    for (unsigned r = 0; r < reps; r++) {
        uint64_t t0 = wb_now_ns();
        if (fn(arg) != 0)
            return -1;
        double t = (double)(wb_now_ns() - t0) / 1e9;
        best = t < best ? t : best;
    }
    return best;
}

struct cpu_case {
    enum wb_dtype dt;
    uint64_t rows, cols;
    const void *x;
    void *y;
    uint8_t *q;
    float *s, *amax;
};

static int cpu_memcpy(void *arg)
{
    const struct cpu_case *c = arg;
    memcpy(c->y, c->x, c->rows * c->cols * wb_dtype_size(c->dt));
    return 0;
}

static const struct wb_quant_exec HOST = {WB_QUANT_HOST, NULL};

static int cpu_block(void *arg)
{
    const struct cpu_case *c = arg;
    return wb_quant_fp8_block(&HOST, c->dt, c->x, c->rows, c->cols, c->q, c->s);
}

static int cpu_split(void *arg)
{
    const struct cpu_case *c = arg;
    struct wb_quant_tile t = {c->dt, c->rows, c->cols, 0, 0};
    int rc = wb_quant_fp8_amax(&HOST, &t, c->x, 0, c->rows, c->amax);
    return rc ? rc : wb_quant_fp8_apply(&HOST, &t, c->x, 0, c->rows, c->amax, c->q, c->s);
}

static int cpu_bench(const struct opts *o, FILE *tsv)
{
    uint64_t rows = o->rows ? o->rows : 2048, cols = o->cols ? o->cols : 7168;
    uint64_t n = rows * cols, nb = wb_quant_blocks(rows) * wb_quant_blocks(cols);
    struct cpu_case c = {.rows = rows, .cols = cols};
    void *x = malloc(n * 4), *y = malloc(n * 4);
    c.q = malloc(n);
    c.s = malloc(nb * 4);
    c.amax = malloc(nb * 4);
    if (!x || !y || !c.q || !c.s || !c.amax) {
        fprintf(stderr, "quant_bench: out of memory for %llux%llu\n", (unsigned long long)rows,
                (unsigned long long)cols);
        return 1;
    }
    c.x = x;
    c.y = y;
    memset(y, 1, n * 4); /* touch every page before timing */
    memset(c.q, 1, n);
    printf("quant_bench: CPU reference, one thread, %llux%llu (no GPU in use)\n",
           (unsigned long long)rows, (unsigned long long)cols);
    printf("  GB/s: bytes read + written; input: bytes of the source tensor; ratio: GB/s to "
           "memcpy's\n");
    static const enum wb_dtype dts[] = {WB_DTYPE_BF16, WB_DTYPE_FP16, WB_DTYPE_FP32};
    int rc = 0;
    for (size_t d = 0; d < WB_ARRAY_LEN(dts) && !rc; d++) {
        c.dt = dts[d];
        size_t es = wb_dtype_size(c.dt);
        if (c.dt == WB_DTYPE_BF16 || c.dt == WB_DTYPE_FP16) {
            fill_bf16(x, n, 7 + d);
            if (c.dt == WB_DTYPE_FP16) /* the same bits read as fp16: finite, varied */
                for (uint64_t i = 0; i < n; i++)
                    ((uint16_t *)x)[i] &= 0xbbff;
        } else {
            fill_bf16(y, n, 9);
            wb_quant_cast(&HOST, WB_DTYPE_BF16, y, WB_DTYPE_FP32, x, n);
        }
        char name[3][64];
        snprintf(name[0], sizeof(name[0]), "memcpy %s input", wb_dtype_name(c.dt));
        snprintf(name[1], sizeof(name[1]), "fp8 block from %s", wb_dtype_name(c.dt));
        snprintf(name[2], sizeof(name[2]), "fp8 amax + apply from %s", wb_dtype_name(c.dt));
        int (*fns[3])(void *) = {cpu_memcpy, cpu_block, cpu_split};
        struct result r[3];
        for (int k = 0; k < 3; k++) {
            double t = cpu_best(o->reps, fns[k], &c);
            if (t < 0) {
                rc = 1;
                break;
            }
            r[k] = (struct result){
                name[k], rows, cols, k == 0 ? 2 * n * es : n * (es + 1) + nb * 4, t, n * es};
            print_row(&r[k], &r[0], tsv);
        }
    }
    free(x);
    free(y);
    free(c.q);
    free(c.s);
    free(c.amax);
    return rc;
}

int main(int argc, char **argv)
{
    struct opts o = {.reps = 5};
    if (parse(argc, argv, &o) != 0)
        return 2;
    FILE *tsv = NULL;
    if (o.tsv && !(tsv = fopen(o.tsv, "w"))) {
        fprintf(stderr, "quant_bench: cannot write %s: %s\n", o.tsv, strerror(errno));
        return 1;
    }
    int rc;
    if (!o.cpu && wb_gpu_count() > 0) {
        printf("quant_bench: GPU, BF16 -> FP8 e4m3 + FP32 scales; GB/s = bytes read + written;"
               " ratio: to the copy's GB/s\n");
        rc = gpu_shape(o.rows ? o.rows : 7168, o.cols ? o.cols : 18432, &o, tsv);
        if (!rc && !o.rows && !o.cols)
            rc = gpu_shape(512, 1024, &o, tsv); /* 1 MiB of BF16: launch-bound */
    } else {
        if (!o.cpu)
            printf("quant_bench: %s\n", wb_gpu_built() ? "no usable GPU" : "built without CUDA");
        rc = cpu_bench(&o, tsv);
    }
    if (tsv && fclose(tsv) != 0) {
        fprintf(stderr, "quant_bench: writing %s failed\n", o.tsv);
        rc = 1;
    }
    return rc ? 1 : 0;
}
