/* planner_permute_test.c — transposed components (a rule's `permute`), planned and executed:
 * small gpt-oss-shaped models (configs/models/gpt_oss.yaml: the experts' gate_up_proj
 * [E, H, 2I] and down_proj [E, I, H] become w13_weight [E, 2I, H] and w2_weight [E, H, I]) are
 * planned at TP 1 and 2 and EP 2, in every mode, from FSDP shards that cut the trainer's dim 0
 * (experts) or the very dims the transpose moves (inside FP8 blocks of the rollout tensor:
 * amax exchanges), with the parameters on the GPU or in host memory, BF16 and FP8, and run on
 * the CPU (planner_sim.h, which also checks every byte against its own reference built from
 * the mappings and transposed element by element). Then every rank's w13_weight and w2_weight
 * are compared with what vLLM's FusedMoE holds, computed here from the trainer's values and the
 * config alone: expert e's gate_up_proj[e] columns of the rank (TP) or whole (EP) transposed,
 * and for FP8 those quantized per 128x128 block of the rollout tensor with their scales. */
#include "tests/unit/planner_sim.h"

struct tiny_cfg {
    unsigned hidden, inter, experts, layers;
    bool fp8;
};

static const char *write_config(const struct tiny_cfg *c)
{
    char text[1024];
    snprintf(text, sizeof(text),
             "{\"model_type\": \"gpt_oss\", \"hidden_size\": %u, \"num_attention_heads\": 4, "
             "\"num_key_value_heads\": 2, \"head_dim\": 32, \"intermediate_size\": %u, "
             "\"num_local_experts\": %u, \"experts_per_token\": 2, \"num_experts_per_tok\": 2, "
             "\"attention_bias\": true, \"num_hidden_layers\": %u, \"vocab_size\": 256, "
             "\"tie_word_embeddings\": false%s}",
             c->hidden, c->inter, c->experts, c->layers,
             c->fp8 ? ", \"quantization_config\": {\"quant_method\": \"fp8\", "
                      "\"weight_block_size\": [128, 128], \"activation_scheme\": \"dynamic\"}"
                    : "");
    static char path[512];
    snprintf(path, sizeof(path), "%s", wb_test_write_file("config.json", text));
    return path;
}

/* Replaces the one occurrence of a in buf (capacity cap) by b. */
static void replace(char *buf, size_t cap, const char *a, const char *b)
{
    char *p = strstr(buf, a);
    CHECK(p != NULL);
    CHECK(strstr(p + 1, a) == NULL);
    size_t la = strlen(a), lb = strlen(b), tail = strlen(p + la);
    CHECK(strlen(buf) - la + lb < cap);
    memmove(p + lb, p + la, tail + 1);
    memcpy(p, b, lb);
}

/* configs/models/gpt_oss.yaml with FP8 experts (vLLM's gpt-oss holds MXFP4 ones, which
 * weightbridge does not produce; FP8 here exercises block quantization of a transposed source,
 * blocks over the rollout tensor's last two dims). `bad`: w13 without its permute: with H ==
 * 2I it still matches, shapes and all, and is wrong. */
static const char *family(bool fp8, bool unpermuted)
{
    FILE *f = fopen("configs/models/gpt_oss.yaml", "rb");
    CHECK(f != NULL);
    static char buf[1 << 15];
    size_t n = fread(buf, 1, sizeof(buf) - 1024, f);
    fclose(f);
    buf[n] = 0;
    if (fp8) {
        replace(buf, sizeof(buf), "\nchecks:",
                "\nquant:\n  fp8: [\"*.mlp.experts.w13_weight\", \"*.mlp.experts.w2_weight\"]\n"
                "checks:");
        replace(buf, sizeof(buf),
                "      model.layers.{layer}.mlp.experts.w13_weight: [num_local_experts, "
                "2*intermediate_size, hidden_size]\n",
                "");
        replace(
            buf, sizeof(buf),
            "      model.layers.{layer}.mlp.experts.w2_weight: [num_local_experts, hidden_size, "
            "intermediate_size]\n",
            "");
        replace(
            buf, sizeof(buf), "\nrules:",
            "  - for: {layer: num_hidden_layers}\n"
            "    fp8: defined(quantization_config)\n"
            "    tensors:\n"
            "      model.layers.{layer}.mlp.experts.w13_weight: [num_local_experts, "
            "2*intermediate_size, hidden_size]\n"
            "      model.layers.{layer}.mlp.experts.w2_weight: [num_local_experts, hidden_size, "
            "intermediate_size]\n"
            "\nrules:");
    }
    if (unpermuted)
        replace(buf, sizeof(buf),
                "    from: model.layers.{L}.mlp.experts.gate_up_proj\n    permute: [0, 2, 1]\n",
                "    from: model.layers.{L}.mlp.experts.gate_up_proj\n");
    static char path[512];
    snprintf(path, sizeof(path), "%s",
             wb_test_write_file(fp8 ? "gpt_oss_fp8.yaml" : "gpt_oss_t.yaml", buf));
    return path;
}

/* Block amax of an [rows, cols] BF16 matrix, 128x128 from its origin. */
static float *block_amax(const uint16_t *m, uint64_t rows, uint64_t cols)
{
    uint64_t br = (rows + 127) / 128, bc = (cols + 127) / 128;
    float *am = calloc(br * bc + 1, sizeof(float));
    for (uint64_t r = 0; r < rows; r++)
        for (uint64_t k = 0; k < cols; k++) {
            float a = fabsf(sim_bf16_to_f(m[r * cols + k]));
            float *x = &am[r / 128 * bc + k / 128];
            *x = a > *x ? a : *x;
        }
    for (uint64_t i = 0; i < br * bc; i++)
        am[i] = am[i] < 1e-4f ? 1e-4f : am[i];
    return am;
}

/* Compares rank g's local `name` (experts [e0, e0 + ne) of the trainer tensor `tname`
 * [E, A, B], each expert's rows [a0, a0 + na) and columns [b0, b0 + nb) transposed: local
 * [ne, nb, na]) with what it holds; returns the elements (and scales) that differ. */
static uint64_t compare_expert(struct sim *s, uint32_t g, const char *name, const char *tname,
                               uint64_t e0, uint64_t ne, uint64_t a0, uint64_t na, uint64_t b0,
                               uint64_t nb, bool fp8)
{
    const struct wb_inventory *R = s->f->in.rollout, *T = s->f->in.trainer;
    ssize_t ri = wb_inv_find(R, name), ti = wb_inv_find(T, tname);
    CHECK(ri >= 0 && ti >= 0);
    const uint8_t *got = s->dst[g][ri];
    CHECK(got != NULL);
    const struct wb_shape *ts = &T->p[ti].shape;
    uint64_t A = ts->dim[1], B = ts->dim[2], bad = 0;
    uint16_t *want = malloc(nb * na * 2 + 2);
    const float *gs = NULL;
    if (fp8) {
        char sn[WB_NAME_MAX];
        snprintf(sn, sizeof(sn), "%s_scale_inv", name);
        ssize_t si = wb_inv_find(R, sn);
        CHECK(si >= 0);
        gs = (const float *)s->dst[g][si];
        CHECK(gs != NULL);
    }
    uint64_t br = (nb + 127) / 128, bc = (na + 127) / 128;
    for (uint64_t e = 0; e < ne; e++) {
        const uint16_t *src = (const uint16_t *)(const void *)s->full[ti] + (e0 + e) * A * B;
        for (uint64_t i = 0; i < nb; i++) /* rollout row i = trainer column b0 + i */
            for (uint64_t j = 0; j < na; j++)
                want[i * na + j] = src[(a0 + j) * B + b0 + i];
        if (!fp8) {
            bad += memcmp(got + e * nb * na * 2, want, nb * na * 2) != 0 ? 1 : 0;
            continue;
        }
        float *am = block_amax(want, nb, na);
        for (uint64_t i = 0; i < nb; i++)
            for (uint64_t j = 0; j < na; j++) {
                float a = am[i / 128 * bc + j / 128];
                bad += got[e * nb * na + i * na + j] !=
                       sim_f_to_e4m3(sim_bf16_to_f(want[i * na + j]) * (448.0f / a));
            }
        for (uint64_t k = 0; k < br * bc; k++) {
            float sc = am[k] / 448.0f;
            bad += memcmp(&gs[e * br * bc + k], &sc, 4) != 0;
        }
        free(am);
    }
    free(want);
    return bad;
}

static const char FSDP2[] = "world_size: 2\ngpus_per_node: 2\nmesh:\n  - {name: fsdp, size: 2}\n"
                            "placements:\n  - match: \"*\"\n    place: {fsdp: shard(0)}\n";
/* Shard(0) over 3 ranks of 4 experts: 2 | 2 | 0 */
static const char FSDP3[] = "world_size: 3\ngpus_per_node: 3\nmesh:\n  - {name: fsdp, size: 3}\n"
                            "placements:\n  - match: \"*\"\n    place: {fsdp: shard(0)}\n";
/* the experts cut along the dims the transpose moves: gate_up_proj's 2I (the rollout's rows)
 * and down_proj's I (the rollout's columns), 3 ways, inside 128-blocks; host residence */
static const char MOVED3[] = "world_size: 3\ngpus_per_node: 3\nresidence: host\nmesh:\n"
                             "  - {name: fsdp, size: 3}\nplacements:\n"
                             "  - match: \"*.experts.gate_up_proj\"\n    place: {fsdp: shard(2)}\n"
                             "  - match: \"*.experts.down_proj\"\n    place: {fsdp: shard(1)}\n"
                             "  - match: \"*\"\n    place: {fsdp: shard(0)}\n";

/* Plans, executes and checks (planner_sim.h's own reference), then compares every rank's
 * w13_weight and w2_weight of every layer with the independent computation; returns how many
 * experts (BF16) or bytes (FP8) differ. */
static uint64_t run(const char *fam, const struct tiny_cfg *c, const char *trainer_yaml,
                    uint32_t tp, uint32_t ep, enum wb_plan_mode mode, struct wb_plan_stats *stats)
{
    struct fx f;
    struct wb_model md;
    fx_init(&f);
    const char *cfg = write_config(c);
    char tl[512], rl[512], rtext[128];
    snprintf(tl, sizeof(tl), "%s", wb_test_write_file("trainer.yaml", trainer_yaml));
    snprintf(rtext, sizeof(rtext), "replicas: 1\ngpus_per_replica: %u\ntp: %u\nep: %u\n", tp, tp,
             ep);
    snprintf(rl, sizeof(rl), "%s", wb_test_write_file("rollout.yaml", rtext));
    struct wb_model_src src = {
        .rules = fam, .config = cfg, .trainer_layout = tl, .rollout_layout = rl};
    fx_model(&f, &src, &md);
    struct wb_plan *p = sim_plan_check(&f, mode);
    CHECK_INT(wb_plan_verify(p, &f.in, &f.el), 0);
    struct sim s;
    sim_setup(&s, &f, p);
    sim_run(&s);
    uint64_t bad = 0, E = c->experts, H = c->hidden, I = c->inter;
    for (uint32_t g = 0; g < tp; g++)
        for (uint32_t l = 0; l < c->layers; l++) {
            char w13[WB_NAME_MAX], w2[WB_NAME_MAX], gu[WB_NAME_MAX], dn[WB_NAME_MAX];
            snprintf(w13, sizeof(w13), "model.layers.%u.mlp.experts.w13_weight", l);
            snprintf(w2, sizeof(w2), "model.layers.%u.mlp.experts.w2_weight", l);
            snprintf(gu, sizeof(gu), "model.layers.%u.mlp.experts.gate_up_proj", l);
            snprintf(dn, sizeof(dn), "model.layers.%u.mlp.experts.down_proj", l);
            if (ep > 1) { /* rank g holds experts [er E/ep, (er + 1) E/ep) whole */
                uint64_t per = E / ep, e0 = (g % ep) * per;
                bad += compare_expert(&s, g, w13, gu, e0, per, 0, H, 0, 2 * I, c->fp8);
                bad += compare_expert(&s, g, w2, dn, e0, per, 0, I, 0, H, c->fp8);
            } else { /* every expert: its 2I/tp columns of gate_up, I/tp rows of down */
                uint64_t c13 = 2 * I / tp, c2 = I / tp;
                bad += compare_expert(&s, g, w13, gu, 0, E, 0, H, g * c13, c13, c->fp8);
                bad += compare_expert(&s, g, w2, dn, 0, E, g * c2, c2, 0, H, c->fp8);
            }
        }
    sim_free(&s);
    if (stats)
        *stats = p->stats;
    wb_plan_free(p);
    wb_model_free(&md);
    fx_free(&f);
    return bad;
}

static const enum wb_plan_mode MODES[] = {WB_MODE_AUTO, WB_MODE_DIRECT, WB_MODE_GATHER};

static void run_all(const struct tiny_cfg *c)
{
    const char *fam = family(c->fp8, false);
    static const uint32_t TPEP[][2] = {{1, 1}, {2, 1}, {2, 2}};
    const char *layouts[] = {FSDP2, FSDP3, MOVED3};
    for (size_t k = 0; k < WB_ARRAY_LEN(TPEP); k++)
        for (size_t m = 0; m < WB_ARRAY_LEN(MODES); m++)
            for (size_t y = 0; y < WB_ARRAY_LEN(layouts); y++) {
                struct wb_plan_stats st;
                CHECK_U64(run(fam, c, layouts[y], TPEP[k][0], TPEP[k][1], MODES[m], &st), 0);
                if (MODES[m] == WB_MODE_DIRECT)
                    CHECK_U64(st.gathers, 0);
                /* FP8 blocks of the rollout's w13 rows / w2 columns straddle the owners */
                if (MODES[m] == WB_MODE_DIRECT && c->fp8 && layouts[y] == MOVED3)
                    CHECK(st.amax_ops > 0);
                if (MODES[m] == WB_MODE_DIRECT && c->fp8 && layouts[y] != MOVED3)
                    CHECK_U64(st.amax_ops, 0);
            }
}

/* BF16: 4 experts, H 96, I 80 (no dim a multiple of another's tiles). */
static void test_gpt_oss_bf16(void)
{
    struct tiny_cfg c = {.hidden = 96, .inter = 80, .experts = 4, .layers = 2};
    run_all(&c);
}

/* FP8: H 256, I 512 so that TP 2's shares (w13 512 rows, w2 256 columns) are whole blocks. */
static void test_gpt_oss_fp8(void)
{
    struct tiny_cfg c = {.hidden = 256, .inter = 512, .experts = 4, .layers = 1, .fp8 = true};
    run_all(&c);
}

/* w13 without its permute, on a model whose H == 2I: every shape matches, the plan verifies
 * against its own mappings, and every expert is wrong — which only the independent
 * computation sees (w2 keeps its permute and is right). */
static void test_missing_permute_caught(void)
{
    struct tiny_cfg c = {.hidden = 128, .inter = 64, .experts = 4, .layers = 1};
    CHECK_U64(run(family(false, true), &c, FSDP2, 1, 1, WB_MODE_AUTO, NULL), 4);
    CHECK_U64(run(family(false, false), &c, FSDP2, 1, 1, WB_MODE_AUTO, NULL), 0);
}

/* The routing table carries the transpose as a PERMUTE op: after the shard (a TMP view of the
 * rows it needs) comes the transposed copy, dims [0, 2, 1]. */
static void test_permute_op(void)
{
    struct tiny_cfg c = {.hidden = 96, .inter = 80, .experts = 4, .layers = 1};
    struct fx f;
    struct wb_model md;
    fx_init(&f);
    const char *cfg = write_config(&c);
    char tl[512], rl[512];
    snprintf(tl, sizeof(tl), "%s", wb_test_write_file("trainer.yaml", FSDP2));
    snprintf(rl, sizeof(rl), "%s",
             wb_test_write_file("rollout.yaml", "replicas: 1\ngpus_per_replica: 1\ntp: 1\n"));
    struct wb_model_src src = {
        .rules = family(false, false), .config = cfg, .trainer_layout = tl, .rollout_layout = rl};
    fx_model(&f, &src, &md);
    struct wb_plan_opts o = {WB_MODE_DIRECT, 0};
    struct wb_plan *p;
    CHECK_INT(wb_plan_build(&f.in, &o, &p, &f.el), 0);
    const struct wb_route_table *t = &pl_tables(p)[0];
    uint32_t n = 0;
    for (uint32_t i = 0; i < t->nops; i++) {
        const struct wb_rt_op *op = &t->ops[i];
        if (op->kind != WB_OP_PERMUTE)
            continue;
        n++;
        const char *tn = f.in.trainer->p[op->tensor].name;
        CHECK(strstr(tn, ".mlp.experts.gate_up_proj") || strstr(tn, ".mlp.experts.down_proj"));
        CHECK_INT(op->permute.perm, 0 | 2 << 4 | 1 << 8);
        const struct wb_box *sb = wb_rt_box(t, op->permute.src_box),
                            *db = wb_rt_box(t, op->permute.dst_box);
        /* rank 0 holds experts 0 and 1: [2, 96, 160] -> [2, 160, 96], [2, 80, 96] -> [2, 96, 80] */
        bool gu = strstr(tn, "gate_up") != NULL;
        CHECK_U64(sb->ext[0], 2);
        CHECK_U64(sb->ext[1], gu ? 96 : 80);
        CHECK_U64(sb->ext[2], gu ? 160 : 96);
        CHECK_U64(db->ext[1], sb->ext[2]);
        CHECK_U64(db->ext[2], sb->ext[1]);
        CHECK_INT(op->permute.src.kind, WB_BUF_PARAM);
        CHECK_INT(op->permute.dst.kind, WB_BUF_TMP);
    }
    CHECK_INT(n, 2);
    wb_plan_free(p);
    wb_model_free(&md);
    fx_free(&f);
}

const struct wb_test wb_tests[] = {
    {"gpt_oss_bf16", test_gpt_oss_bf16, 300},
    {"gpt_oss_fp8", test_gpt_oss_fp8, 600},
    {"missing_permute_caught", test_missing_permute_caught, 0},
    {"permute_op", test_permute_op, 0},
    {0},
};
