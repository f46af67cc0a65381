/* ckpt_check_test.c — a checkpoint against its model: BF16 and FP8 forms, every missing, extra,
 * dtype- or shape-mismatched tensor with its exact message; and the wb-broadcast program. */
#include "ckpt/ckpt.h"
#include "tests/wbtest.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#define DEMO_RULES  "configs/models/qwen3_moe.yaml"
#define DEMO_CONFIG "configs/jobs/demo/config.json"

static char *dir_of(const char *name)
{
    char *d;
    if (asprintf(&d, "%s/%s", wb_test_tmpdir(), name) < 0)
        wb_test_fail(__FILE__, __LINE__, "asprintf");
    return d;
}

static void load_model(const char *rules, const char *config, struct wb_model *m)
{
    struct wb_errlist el;
    wb_errlist_init(&el);
    struct wb_model_src src = {.rules = rules, .config = config};
    int r = wb_model_load(&src, m, &el);
    wb_errlist_print(&el, "    ", stderr);
    CHECK_INT(r, 0);
    wb_errlist_free(&el);
}

static struct wb_ckpt *write_open(const char *name, const struct wb_inventory *inv, uint32_t files)
{
    char *d = dir_of(name);
    struct wb_errlist el;
    wb_errlist_init(&el);
    struct wb_ckpt_write_opts o = {.seed = 1, .version = 1, .files = files};
    CHECK_INT(wb_ckpt_write(d, inv, &o, &el), 0);
    struct wb_ckpt *ck = NULL;
    int r = wb_ckpt_open(d, &ck, &el);
    wb_errlist_print(&el, "    ", stderr);
    CHECK_INT(r, 0);
    wb_errlist_free(&el);
    free(d);
    return ck;
}

static void expect_list(const struct wb_errlist *el, const char *const *msgs)
{
    size_t n = 0;
    while (msgs[n])
        n++;
    for (size_t i = 0; i < el->n && i < n; i++)
        CHECK_STR(el->msgs[i], msgs[i]);
    if (el->n != n)
        wb_errlist_print(el, "    got: ", stderr);
    CHECK_INT(el->n, n);
}

#define EXPECT_LIST(el, ...) expect_list(el, (const char *const[]){__VA_ARGS__, NULL})

static void test_bf16_ok(void)
{
    struct wb_model m;
    load_model(DEMO_RULES, DEMO_CONFIG, &m);
    struct wb_ckpt *ck = write_open("bf16", &m.trainer, 3);
    struct wb_errlist el;
    wb_errlist_init(&el);
    enum wb_ckpt_form used = WB_CKPT_FORM_FP8;
    CHECK_INT(wb_ckpt_check_model(ck, &m, WB_CKPT_FORM_AUTO, &used, &el), 0);
    CHECK_INT(used, WB_CKPT_FORM_MODEL);
    CHECK_INT(el.n, 0);
    CHECK_INT(wb_ckpt_check(ck, &m.trainer, &el), 0);
    wb_ckpt_close(ck);
    wb_errlist_free(&el);
    wb_model_free(&m);
}

/* One of each problem: all reported together, exactly. */
static void test_bf16_mismatches(void)
{
    struct wb_model m;
    load_model(DEMO_RULES, DEMO_CONFIG, &m);
    struct wb_inventory inv;
    wb_inv_init(&inv);
    for (size_t i = 0; i < m.trainer.n; i++) {
        struct wb_param p = m.trainer.p[i];
        if (strcmp(p.name, "model.norm.weight") == 0)
            continue; /* missing */
        if (strcmp(p.name, "lm_head.weight") == 0)
            p.dtype = WB_DTYPE_FP32;
        if (strcmp(p.name, "model.layers.0.self_attn.q_norm.weight") == 0)
            p.shape.dim[0] = 64;
        if (strcmp(p.name, "model.layers.1.mlp.gate.weight") == 0) {
            p.dtype = WB_DTYPE_FP16;
            p.shape = (struct wb_shape){2, {256, 4}};
        }
        CHECK_INT(wb_inv_add(&inv, p.name, p.dtype, &p.shape), 0);
        if (i == 3) {
            struct wb_shape s = {1, {8}};
            CHECK_INT(wb_inv_add(&inv, "model.extra.bias", WB_DTYPE_BF16, &s), 0);
        }
    }
    struct wb_ckpt *ck = write_open("bad", &inv, 1);
    struct wb_errlist el;
    wb_errlist_init(&el);
    enum wb_ckpt_form used;
    CHECK_INT(wb_ckpt_check_model(ck, &m, WB_CKPT_FORM_AUTO, &used, &el), -WB_E_MATCH);
    CHECK_INT(used, WB_CKPT_FORM_MODEL);
    EXPECT_LIST(&el,
                "tensor \"lm_head.weight\" (in model.safetensors): dtype fp32, the model expects "
                "bf16",
                "extra tensor \"model.extra.bias\" (bf16 [8], in model.safetensors): the model "
                "has no such tensor",
                "tensor \"model.layers.0.self_attn.q_norm.weight\" (in model.safetensors): shape "
                "[64], the model expects [128]",
                "tensor \"model.layers.1.mlp.gate.weight\" (in model.safetensors): fp16 [256, 4], "
                "the model expects bf16 [4, 256]",
                "missing tensor \"model.norm.weight\": the model expects bf16 [256]");
    wb_ckpt_close(ck);
    wb_inv_free(&inv);
    wb_errlist_free(&el);
    wb_model_free(&m);
}

/* The demo's FP8 form: the linear layers a rule quantizes are fp8_e4m3 + FP32 _scale_inv; the
 * router gate, norms and embeddings stay BF16. A checkpoint of that form passes (AUTO finds it),
 * fails as a BF16 one with every difference listed, and matches the rollout as copies. */
static void test_fp8(void)
{
    struct wb_model m;
    load_model(DEMO_RULES, DEMO_CONFIG, &m);
    struct wb_inventory inv;
    wb_inv_init(&inv);
    struct wb_errlist el;
    wb_errlist_init(&el);
    CHECK_INT(wb_ckpt_expected(&m, WB_CKPT_FORM_FP8, &inv, &el), 0);
    CHECK_INT(inv.n, 77);
    CHECK_INT(wb_ckpt_expected(&m, WB_CKPT_FORM_AUTO, &inv, &el), -EINVAL);
    char sb[64];
    struct {
        const char *name;
        enum wb_dtype dt;
        const char *shape;
    } want[] = {
        {"model.embed_tokens.weight", WB_DTYPE_BF16, "[1024, 256]"},
        {"model.layers.0.self_attn.q_proj.weight", WB_DTYPE_FP8_E4M3, "[512, 256]"},
        {"model.layers.0.self_attn.q_proj.weight_scale_inv", WB_DTYPE_FP32, "[4, 2]"},
        {"model.layers.0.self_attn.o_proj.weight_scale_inv", WB_DTYPE_FP32, "[2, 4]"},
        {"model.layers.1.mlp.experts.3.down_proj.weight", WB_DTYPE_FP8_E4M3, "[256, 256]"},
        {"model.layers.1.mlp.experts.3.down_proj.weight_scale_inv", WB_DTYPE_FP32, "[2, 2]"},
        {"model.layers.1.mlp.gate.weight", WB_DTYPE_BF16, "[4, 256]"},
        {"model.layers.1.self_attn.k_norm.weight", WB_DTYPE_BF16, "[128]"},
    };
    for (size_t i = 0; i < WB_ARRAY_LEN(want); i++) {
        ssize_t k = wb_inv_find(&inv, want[i].name);
        CHECK(k >= 0);
        CHECK_INT(inv.p[k].dtype, want[i].dt);
        CHECK_STR(wb_shape_str(&inv.p[k].shape, sb, sizeof(sb)), want[i].shape);
    }
    /* the scale follows its value */
    ssize_t q = wb_inv_find(&inv, "model.layers.0.self_attn.q_proj.weight");
    CHECK_STR(inv.p[q + 1].name, "model.layers.0.self_attn.q_proj.weight_scale_inv");

    struct wb_ckpt *ck = write_open("fp8", &inv, 2);
    enum wb_ckpt_form used;
    CHECK_INT(wb_ckpt_check_model(ck, &m, WB_CKPT_FORM_AUTO, &used, &el), 0);
    CHECK_INT(used, WB_CKPT_FORM_FP8);
    CHECK_INT(wb_ckpt_check_model(ck, &m, WB_CKPT_FORM_MODEL, &used, &el), -WB_E_MATCH);
    CHECK_INT(used, WB_CKPT_FORM_MODEL);
    CHECK_INT(el.n, 64); /* 32 FP8 values, 32 scales */
    CHECK_STR(el.msgs[0], "tensor \"model.layers.0.self_attn.q_proj.weight\" (in "
                          "model-00001-of-00002.safetensors): dtype fp8_e4m3, the model expects "
                          "bf16");
    CHECK_STR(el.msgs[1], "extra tensor \"model.layers.0.self_attn.q_proj.weight_scale_inv\" "
                          "(fp32 [4, 2], in model-00001-of-00002.safetensors): the model has no "
                          "such tensor");

    /* as the trainer inventory, the checkpoint matches the rollout by copies */
    struct wb_match *mt = NULL;
    struct wb_errlist el2;
    wb_errlist_init(&el2);
    int r = wb_match_run(m.rules, &ck->inv, &m.rollout, &mt, &el2);
    wb_errlist_print(&el2, "    ", stderr);
    CHECK_INT(r, 0);
    size_t copies = 0, scaled = 0, scales = 0;
    for (size_t i = 0; i < mt->n; i++) {
        copies += mt->map[i].xform == WB_XFORM_COPY;
        scaled += mt->map[i].block && mt->map[i].comp[0].trainer_scale >= 0;
        scales += mt->map[i].fp8_scales; /* their scales: mappings of their own */
    }
    CHECK_INT(copies, mt->n);
    CHECK_INT(scaled, 8);
    CHECK_INT(scales, 8);
    wb_match_free(mt);
    wb_errlist_free(&el2);

    /* a BF16 checkpoint checked as FP8: values of the wrong dtype and missing scales */
    struct wb_ckpt *ck16 = write_open("fp8_vs_bf16", &m.trainer, 1);
    wb_errlist_free(&el);
    wb_errlist_init(&el);
    CHECK_INT(wb_ckpt_check_model(ck16, &m, WB_CKPT_FORM_FP8, &used, &el), -WB_E_MATCH);
    CHECK_INT(el.n, 64);
    CHECK_STR(el.msgs[32], "missing tensor \"model.layers.0.self_attn.q_proj.weight_scale_inv\": "
                           "the model expects fp32 [4, 2]");
    wb_ckpt_close(ck16);
    wb_ckpt_close(ck);
    wb_inv_free(&inv);
    wb_errlist_free(&el);
    wb_model_free(&m);
}

/* Qwen3-8B-FP8 as published: 36 layers x 7 quantized linear layers, each with its scales;
 * embeddings, norms and lm_head BF16 (checked without writing 8 GB). */
static void test_qwen3_8b_fp8_form(void)
{
    struct wb_model m;
    load_model("configs/models/qwen3.yaml", "configs/hf/Qwen3-8B-FP8.json", &m);
    CHECK_INT(m.trainer.n, 399);
    struct wb_inventory inv;
    wb_inv_init(&inv);
    struct wb_errlist el;
    wb_errlist_init(&el);
    CHECK_INT(wb_ckpt_expected(&m, WB_CKPT_FORM_FP8, &inv, &el), 0);
    CHECK_INT(inv.n, 399 + 36 * 7);
    size_t fp8 = 0, fp32 = 0;
    uint64_t bytes = 0;
    for (size_t i = 0; i < inv.n; i++) {
        fp8 += inv.p[i].dtype == WB_DTYPE_FP8_E4M3;
        fp32 += inv.p[i].dtype == WB_DTYPE_FP32;
        bytes += wb_shape_numel(&inv.p[i].shape) * wb_dtype_size(inv.p[i].dtype);
    }
    CHECK_INT(fp8, 252);
    CHECK_INT(fp32, 252);
    CHECK_U64(bytes, 9437399040ull); /* also computed by hand from the config */
    char sb[64];
    ssize_t k = wb_inv_find(&inv, "model.layers.35.mlp.down_proj.weight_scale_inv");
    CHECK(k >= 0);
    CHECK_STR(wb_shape_str(&inv.p[k].shape, sb, sizeof(sb)), "[32, 96]");
    k = wb_inv_find(&inv, "lm_head.weight");
    CHECK_INT(inv.p[k].dtype, WB_DTYPE_BF16);
    wb_inv_free(&inv);
    wb_errlist_free(&el);
    wb_model_free(&m);
}

/* ---------------------------------------------------------------- wb-broadcast */

static char bin[512];

static char *broadcast_bin(void)
{
    const char *dir = getenv("WB_BIN");
    snprintf(bin, sizeof(bin), "%s/wb-broadcast", dir ? dir : "build/bin");
    if (access(bin, X_OK) != 0)
        wb_test_skip("%s not built", bin);
    return bin;
}

static void run_argv(void *arg)
{
    char **argv = arg;
    execv(argv[0], argv);
    _exit(127);
}

static void test_cli(void)
{
    char *exe = broadcast_bin();
    static char out[1 << 16];
    char *help[] = {exe, "--help", NULL};
    CHECK_INT(wb_test_capture(run_argv, help, out, sizeof(out)), 0);
    CHECK(strncmp(out, "usage: wb-broadcast --checkpoint DIR --dry-run", 46) == 0);
    char *readers[] = {exe, "--checkpoint", "x", "--readers", "0", NULL};
    CHECK_INT(wb_test_capture(run_argv, readers, out, sizeof(out)), 2);
    CHECK_STR(out, "wb-broadcast: --readers: expected a number from 1 to 65536, got '0'\n");

    struct wb_model m;
    load_model(DEMO_RULES, DEMO_CONFIG, &m);
    struct wb_ckpt *ck = write_open("cli", &m.trainer, 3);
    wb_ckpt_close(ck);
    char *d = dir_of("cli");
    /* a training job's file, with a trainer layout: refused before anything listens */
    setenv("WB_TOKEN", "cli-tok", 1);
    char *send[] = {exe, "--checkpoint", d, "--job", "configs/jobs/demo.yaml", NULL};
    CHECK_INT(wb_test_capture(run_argv, send, out, sizeof(out)), 1);
    CHECK_STR(out, "wb-broadcast: 1 problem; nothing was sent\n"
                   "  job demo: names a trainer_layout; a broadcast's readers are laid out from "
                   "the checkpoint\n");

    char *dry[] = {exe,     "--checkpoint",           d,           "--dry-run",
                   "--job", "configs/jobs/demo.yaml", "--readers", "4",
                   NULL};
    CHECK_INT(wb_test_capture(run_argv, dry, out, sizeof(out)), 0);
    char want[4096];
    snprintf(
        want, sizeof(want),
        "checkpoint %s: 3 files, 45 tensors, 5.51 MiB (5774848 B)\n"
        "model configs/jobs/../models/qwen3_moe.yaml (configs/jobs/demo/config.json, form "
        "model): 45 trainer tensors\n"
        "check: every tensor matches the model (name, dtype, shape)\n"
        "4 readers: max 1.38 MiB (1443840 B), mean 1.38 MiB, min 1.38 MiB; max/mean 1.0001; "
        "max - ceil(total/N) = 128 B, one row of a cut tensor <= 512 B\n"
        "  reader           bytes    share  pieces  first piece\n"
        "       0         1443840   25.00%%       8  model.embed_tokens.weight rows [0, 1024)\n"
        "       1         1443328   24.99%%      16  model.layers.0.self_attn.v_proj.weight "
        "rows [1, 256)\n"
        "       2         1443840   25.00%%      12  model.layers.0.mlp.experts.0.up_proj."
        "weight rows [248, 256)\n"
        "       3         1443840   25.00%%      12  model.layers.1.mlp.experts.0.gate_proj."
        "weight rows [252, 256)\n"
        "tensors split over readers: 3\n"
        "  model.layers.0.self_attn.v_proj.weight: rows [0, 1) reader 0; rows [1, 256) "
        "reader 1;\n"
        "  model.layers.0.mlp.experts.0.up_proj.weight: rows [0, 248) reader 1; rows [248, "
        "256) reader 2;\n"
        "  model.layers.1.mlp.experts.0.gate_proj.weight: rows [0, 252) reader 2; rows [252, "
        "256) reader 3;\n"
        "plan for the readers (configs/jobs/demo/rollout.yaml):\n"
        "plan: mode auto, 4 trainer GPUs -> 2 rollout GPUs, memory cap 4.00 MiB\n"
        "  tensors: 45 trainer tensors (5.51 MiB) in 21 mappings, 25 items\n"
        "  rollout dtype: fp8_e4m3 2.25 MiB in 8 tensors (+ 576 B of block scales), bf16 1.01 MiB "
        "in 13 "
        "tensors\n"
        "  meshes: 5 in 2 mesh groups (phases): 1 meshes of <= 4 ranks; 4 meshes of <= 1 "
        "ranks\n"
        "  pieces (item x rollout GPU): 47 direct, 3 amax, 0 gather\n"
        "  entries: 28 tasks, 99 ops (0 gathers, 6 amax ops of 6 exchanges), 157 writes in 157 "
        "records\n"
        "  bytes: 3.27 MiB written, 0 B gathered, 5.51 MiB host-to-device\n"
        "  per sender: min 705.17 KiB, mean 835.89 KiB, max 1.19 MiB (0 of 4 senders idle)\n"
        "  per receiver: min 1.63 MiB, mean 1.63 MiB, max 1.63 MiB\n"
        "  balance: busiest sender 1.19 MiB = 1.0000 x lower bound 1.19 MiB; reference greedy "
        "1.19 MiB = 1.0000 x\n"
        "  largest task: 1.31 MiB of temporary memory\n",
        d);
    CHECK_STR(out, want);

    /* a broken checkpoint and a wrong model: every problem, exit 1 */
    char path[1200];
    snprintf(path, sizeof(path), "%s/model-00002-of-00003.safetensors", d);
    CHECK_INT(truncate(path, 5), 0);
    char *bad[] = {exe,         "--checkpoint", d,        "--dry-run", "--model",
                   "nope.yaml", "--config",     "x.json", NULL};
    CHECK_INT(wb_test_capture(run_argv, bad, out, sizeof(out)), 1);
    CHECK_STR(out, "wb-broadcast: checkpoint and model: 2 problems\n"
                   "  model-00002-of-00003.safetensors: truncated: 5 bytes, shorter than the "
                   "8-byte header length\n"
                   "  nope.yaml: cannot open: No such file or directory\n");
    free(d);
    wb_model_free(&m);
}

const struct wb_test wb_tests[] = {
    {"bf16_ok", test_bf16_ok, 0}, {"bf16_mismatches", test_bf16_mismatches, 0},
    {"fp8", test_fp8, 0},         {"qwen3_8b_fp8_form", test_qwen3_8b_fp8_form, 0},
    {"cli", test_cli, 0},         {0},
};
