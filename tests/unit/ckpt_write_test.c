/* ckpt_write_test.c — the checkpoint writer: real safetensors files of the demo model (BF16 and
 * block-FP8), read back by our reader and by an independent Python reader (standard library
 * only: tests/fixtures/ckpt/st_read.py), every byte compared with the synthetic source and, for
 * FP8, with a whole-tensor quantization by the quant CPU reference. */
#include "ckpt/ckpt.h"
#include "quant/quant.h"
#include "tests/wbtest.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define DEMO_RULES  "configs/models/qwen3_moe.yaml"
#define DEMO_CONFIG "configs/jobs/demo/config.json"

enum { SEED = 42, VERSION = 3 };

static char *dir_of(const char *name)
{
    char *d;
    if (asprintf(&d, "%s/%s", wb_test_tmpdir(), name) < 0)
        wb_test_fail(__FILE__, __LINE__, "asprintf");
    return d;
}

static void load_model(struct wb_model *m)
{
    struct wb_errlist el;
    wb_errlist_init(&el);
    struct wb_model_src src = {.rules = DEMO_RULES, .config = DEMO_CONFIG};
    int r = wb_model_load(&src, m, &el);
    wb_errlist_print(&el, "    ", stderr);
    CHECK_INT(r, 0);
    wb_errlist_free(&el);
}

static void write_ckpt(const char *dir, const struct wb_inventory *inv, uint32_t files)
{
    struct wb_errlist el;
    wb_errlist_init(&el);
    struct wb_ckpt_write_opts o = {.seed = SEED, .version = VERSION, .files = files};
    int r = wb_ckpt_write(dir, inv, &o, &el);
    wb_errlist_print(&el, "    ", stderr);
    CHECK_INT(r, 0);
    wb_errlist_free(&el);
}

static struct wb_ckpt *open_ok(const char *dir)
{
    struct wb_errlist el;
    wb_errlist_init(&el);
    struct wb_ckpt *ck = NULL;
    int r = wb_ckpt_open(dir, &ck, &el);
    wb_errlist_print(&el, "    ", stderr);
    CHECK_INT(r, 0);
    wb_errlist_free(&el);
    return ck;
}

/* What tensor `p` of the inventory `inv` must hold, computed without the writer: the synthetic
 * source, and for FP8 a whole-tensor quantization of its BF16 values (scale tensors: the
 * scales of that quantization). Returns a malloc'd buffer. */
static void *expected(const struct wb_inventory *inv, const struct wb_param *p)
{
    uint64_t n = wb_shape_numel(&p->shape);
    size_t bytes = n * wb_dtype_size(p->dtype);
    void *out = malloc(bytes + 1);
    struct wb_box full = wb_box_full(&p->shape);
    size_t len = strlen(p->name);
    const char *vname = p->name;
    char buf[WB_NAME_MAX];
    bool scale = len > 10 && strcmp(p->name + len - 10, "_scale_inv") == 0;
    if (scale) {
        memcpy(buf, p->name, len - 10);
        buf[len - 10] = 0;
        vname = buf;
    }
    ssize_t v = wb_inv_find(inv, vname);
    if (p->dtype == WB_DTYPE_FP8_E4M3 || (scale && v >= 0)) {
        const struct wb_param *vp = &inv->p[v];
        CHECK_INT(vp->dtype, WB_DTYPE_FP8_E4M3);
        CHECK_INT(vp->shape.ndim, 2);
        uint64_t rows = vp->shape.dim[0], cols = vp->shape.dim[1];
        struct wb_box vf = wb_box_full(&vp->shape);
        uint16_t *src = malloc(rows * cols * 2);
        uint8_t *q = malloc(rows * cols);
        float *s = malloc(wb_quant_blocks(rows) * wb_quant_blocks(cols) * 4);
        CHECK_INT(wb_synth_fill(vp->name, SEED, VERSION, WB_DTYPE_BF16, &vp->shape, &vf, src), 0);
        struct wb_quant_exec ex = {WB_QUANT_HOST, NULL};
        CHECK_INT(wb_quant_fp8_block(&ex, WB_DTYPE_BF16, src, rows, cols, q, s), 0);
        memcpy(out, scale ? (void *)s : (void *)q, bytes);
        free(src);
        free(q);
        free(s);
    } else {
        CHECK_INT(wb_synth_fill(p->name, SEED, VERSION, p->dtype, &p->shape, &full, out), 0);
    }
    return out;
}

static double decode(enum wb_dtype dt, const void *p)
{
    switch (dt) {
    case WB_DTYPE_BF16:
        return wb_bf16_to_f32(*(const uint16_t *)p);
    case WB_DTYPE_FP32:
        return *(const float *)p;
    case WB_DTYPE_FP8_E4M3:
        return wb_quant_fp8_decode(*(const uint8_t *)p);
    default:
        wb_test_fail(__FILE__, __LINE__, "dtype %s", wb_dtype_name(dt));
    }
}

static const char *st_name(enum wb_dtype dt)
{
    return dt == WB_DTYPE_BF16 ? "BF16" : dt == WB_DTYPE_FP32 ? "F32" : "F8_E4M3";
}

/* Every tensor of the checkpoint is the inventory's, in order, with the expected bytes; and
 * the Python reader sees the same files, names, dtypes, shapes and values. */
static void check_roundtrip(const char *dir, const struct wb_inventory *inv, size_t files)
{
    struct wb_ckpt *ck = open_ok(dir);
    CHECK_INT(ck->nfiles, files);
    CHECK_INT(ck->inv.n, inv->n);
    struct wb_ckpt_reader *r;
    CHECK_INT(wb_ckpt_reader_open(ck, NULL, &r), 0);
    size_t cap = 1 << 16, len = 0;
    char *want = malloc(cap);
    want[0] = 0;
    uint64_t total = 0;
    for (size_t i = 0; i < inv->n; i++) {
        const struct wb_param *p = &inv->p[i], *q = &ck->inv.p[i];
        CHECK_STR(q->name, p->name);
        CHECK_INT(q->dtype, p->dtype);
        CHECK(wb_shape_eq(&q->shape, &p->shape));
        size_t bytes = ck->loc[i].bytes, es = wb_dtype_size(p->dtype);
        CHECK_U64(bytes, wb_shape_numel(&p->shape) * es);
        void *exp = expected(inv, p), *got = malloc(bytes + 1);
        uint64_t sum = 0;
        CHECK_INT(wb_ckpt_read_tensor(r, i, got, &sum), 0);
        CHECK_MEM(got, exp, bytes);
        CHECK_U64(sum, wb_ckpt_xxh3(exp, bytes));
        char dims[128] = "[";
        for (uint32_t d = 0; d < p->shape.ndim; d++)
            snprintf(dims + strlen(dims), sizeof(dims) - strlen(dims), "%s%llu", d ? "," : "",
                     (unsigned long long)p->shape.dim[d]);
        strcat(dims, "]");
        if (cap - len < 1024)
            want = realloc(want, cap *= 2);
        len += (size_t)snprintf(want + len, cap - len, "%s %s %s %s %.9g %.9g\n", p->name,
                                ck->files[ck->loc[i].file].name, st_name(p->dtype), dims,
                                decode(p->dtype, exp), decode(p->dtype, (char *)exp + bytes - es));
        total += bytes;
        free(exp);
        free(got);
    }
    snprintf(want + len, cap - len, "ok %zu tensors %llu bytes\n", inv->n,
             (unsigned long long)total);
    wb_ckpt_reader_close(r);
    wb_ckpt_close(ck);

    if (system("python3 -c pass >/dev/null 2>&1") != 0)
        wb_test_skip("no python3");
    char cmd[1200];
    snprintf(cmd, sizeof(cmd), "python3 tests/fixtures/ckpt/st_read.py '%s' 2>&1", dir);
    FILE *pp = popen(cmd, "r");
    CHECK(pp != NULL);
    char *out = malloc(cap + 4096);
    size_t n = fread(out, 1, cap + 4095, pp);
    out[n] = 0;
    CHECK_INT(pclose(pp), 0);
    CHECK_STR(out, want);
    free(out);
    free(want);
}

static void test_demo_bf16(void)
{
    struct wb_model m;
    load_model(&m);
    CHECK_INT(m.trainer.n, 45);
    char *d = dir_of("demo");
    write_ckpt(d, &m.trainer, 3);
    struct stat st;
    char path[1200];
    const char *names[] = {"model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors",
                           "model-00003-of-00003.safetensors", WB_CKPT_INDEX};
    for (int i = 0; i < 4; i++) {
        snprintf(path, sizeof(path), "%s/%s", d, names[i]);
        CHECK_INT(stat(path, &st), 0);
    }
    check_roundtrip(d, &m.trainer, 3);
    free(d);
    wb_model_free(&m);
}

static void test_demo_single_file(void)
{
    struct wb_model m;
    load_model(&m);
    char *d = dir_of("single");
    write_ckpt(d, &m.trainer, 1);
    char path[1200];
    snprintf(path, sizeof(path), "%s/%s", d, WB_CKPT_INDEX);
    CHECK(access(path, F_OK) != 0);
    struct wb_ckpt *ck = open_ok(d);
    CHECK_STR(ck->files[0].name, "model.safetensors");
    /* header padded to 8 bytes with spaces, as the safetensors library writes it */
    CHECK_U64(ck->files[0].data % 8, 0);
    CHECK_U64(ck->files[0].size, ck->files[0].data + ck->bytes);
    wb_ckpt_close(ck);
    check_roundtrip(d, &m.trainer, 1);
    free(d);
    wb_model_free(&m);
}

/* The FP8 form of the demo (values fp8_e4m3 + FP32 _scale_inv for every trainer tensor the
 * family quantizes): the writer's strip-by-strip quantization equals a whole-tensor one. */
static void test_demo_fp8(void)
{
    struct wb_model m;
    load_model(&m);
    struct wb_inventory inv;
    wb_inv_init(&inv);
    struct wb_errlist el;
    wb_errlist_init(&el);
    CHECK_INT(wb_ckpt_expected(&m, WB_CKPT_FORM_FP8, &inv, &el), 0);
    CHECK_INT(inv.n, 77);
    char *d = dir_of("fp8");
    write_ckpt(d, &inv, 2);
    check_roundtrip(d, &inv, 2);
    wb_inv_free(&inv);
    wb_errlist_free(&el);
    free(d);
    wb_model_free(&m);
}

/* The writer's split: never an empty file, one file per tensor at most. */
static void test_file_split(void)
{
    struct wb_inventory inv;
    wb_inv_init(&inv);
    struct wb_shape big = {2, {1024, 64}}, small = {1, {4}};
    CHECK_INT(wb_inv_add(&inv, "big", WB_DTYPE_BF16, &big), 0);
    CHECK_INT(wb_inv_add(&inv, "a", WB_DTYPE_FP32, &small), 0);
    CHECK_INT(wb_inv_add(&inv, "b", WB_DTYPE_FP32, &small), 0);
    char *d = dir_of("split");
    write_ckpt(d, &inv, 5);
    struct wb_ckpt *ck = open_ok(d);
    CHECK_INT(ck->nfiles, 3);
    CHECK_STR(ck->files[2].name, "model-00003-of-00003.safetensors");
    for (int i = 0; i < 3; i++) {
        CHECK_INT(ck->files[i].ntensors, 1);
        CHECK_INT(ck->loc[i].file, i);
    }
    wb_ckpt_close(ck);
    wb_inv_free(&inv);
    free(d);
}

const struct wb_test wb_tests[] = {
    {"demo_bf16", test_demo_bf16, 0},
    {"demo_single_file", test_demo_single_file, 0},
    {"demo_fp8", test_demo_fp8, 0},
    {"file_split", test_file_split, 0},
    {0},
};
