/* planner_split_test.c — the phi3 family's split rules, executed: small Phi-3-shaped models
 * (fused qkv_proj and gate_up_proj on the trainer, GQA with fewer kv heads than TP ranks) are
 * planned from configs/models/phi3.yaml at TP 1, 2 and 4 in every mode, from FSDP shards that
 * cut the fused tensors anywhere, and run on the CPU (planner_sim.h, which also checks every
 * byte against its own reference built from the mappings). Then every rollout rank's
 * qkv_proj and gate_up_proj are compared with what vLLM's QKVParallelLinear and
 * MergedColumnParallelLinear hold, computed here from the trainer's values and the config alone
 * (rank r: q heads r*H/tp.., the kv head(s) of its group, then the same for v; gate rows then
 * up rows), in BF16 and as FP8 128x128 blocks with their scales. A family whose split sizes are
 * swapped plans and executes cleanly — its shapes are all right — and is caught only here. */
#include "tests/unit/planner_sim.h"

/* config.json of a small Phi-3-shaped model */
struct tiny_cfg {
    unsigned hidden, heads, kv_heads, head_dim, inter, layers, vocab;
    bool fp8;
};

static const char *write_config(const struct tiny_cfg *c)
{
    char text[1024];
    snprintf(text, sizeof(text),
             "{\"model_type\": \"phi3\", \"hidden_size\": %u, \"num_attention_heads\": %u, "
             "\"num_key_value_heads\": %u, \"head_dim\": %u, \"intermediate_size\": %u, "
             "\"num_hidden_layers\": %u, \"vocab_size\": %u, \"tie_word_embeddings\": false%s}",
             c->hidden, c->heads, c->kv_heads, c->head_dim, c->inter, c->layers, c->vocab,
             c->fp8 ? ", \"quantization_config\": {\"quant_method\": \"fp8\", "
                      "\"weight_block_size\": [128, 128], \"activation_scheme\": \"dynamic\"}"
                    : "");
    static char path[512];
    snprintf(path, sizeof(path), "%s", wb_test_write_file("config.json", text));
    return path;
}

/* configs/models/phi3.yaml with its qkv split's q and k sizes swapped */
static const char *swapped_family(void)
{
    FILE *f = fopen("configs/models/phi3.yaml", "rb");
    CHECK(f != NULL);
    static char buf[1 << 15];
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = 0;
    char *q = strstr(buf, "      - q: num_attention_heads*head_dim\n");
    char *k = strstr(buf, "      - k: num_key_value_heads*head_dim\n");
    CHECK(q != NULL && k != NULL && k > q);
    memcpy(q, "      - q: num_key_value_heads*head_dim\n", 40);
    memcpy(k, "      - k: num_attention_heads*head_dim\n", 40);
    static char path[512];
    snprintf(path, sizeof(path), "%s", wb_test_write_file("phi3_swapped.yaml", buf));
    return path;
}

/* The rows of the fused trainer tensor that rollout rank `rank` of `tp` holds, in its order:
 * vLLM's per-rank shares, from the config alone. */
static uint32_t qkv_rows(const struct tiny_cfg *c, uint32_t rank, uint32_t tp, uint64_t *start,
                         uint64_t *len)
{
    uint64_t hd = c->head_dim, q = (uint64_t)c->heads * hd, kv = (uint64_t)c->kv_heads * hd;
    uint64_t qh = c->heads / tp;
    /* kv heads: split when there are at least tp, else each replicated over tp/kv ranks */
    uint64_t kvh = c->kv_heads >= tp ? c->kv_heads / tp : 1;
    uint64_t kv0 = c->kv_heads >= tp ? rank * kvh : rank / (tp / c->kv_heads);
    start[0] = rank * qh * hd;
    len[0] = qh * hd;
    start[1] = q + kv0 * hd;
    len[1] = kvh * hd;
    start[2] = q + kv + kv0 * hd;
    len[2] = kvh * hd;
    return 3;
}

static uint32_t gate_up_rows(const struct tiny_cfg *c, uint32_t rank, uint32_t tp, uint64_t *start,
                             uint64_t *len)
{
    uint64_t per = c->inter / tp;
    start[0] = rank * per;
    len[0] = per;
    start[1] = c->inter + rank * per;
    len[1] = per;
    return 2;
}

/* The FP8 block amax of a BF16 [rows, cols] tensor, per 128x128 block from its origin, as
 * DeepGEMM's per_block_cast_to_fp8 (at least 1e-4); malloc'd, [ceil(rows/128)][ceil(cols/128)]. */
static float *block_amax(const uint8_t *bf16, uint64_t rows, uint64_t cols)
{
    uint64_t br = (rows + 127) / 128, bc = (cols + 127) / 128;
    float *am = calloc(br * bc + 1, sizeof(float));
    for (uint64_t r = 0; r < rows; r++)
        for (uint64_t k = 0; k < cols; k++) {
            uint16_t b;
            memcpy(&b, bf16 + (r * cols + k) * 2, 2);
            float a = fabsf(sim_bf16_to_f(b));
            float *x = &am[r / 128 * bc + k / 128];
            *x = a > *x ? a : *x;
        }
    for (uint64_t i = 0; i < br * bc; i++)
        am[i] = am[i] < 1e-4f ? 1e-4f : am[i];
    return am;
}

/* Compares one rank's local tensor (and scales) of a fused rollout tensor with the trainer
 * rows `start/len` stacked; returns the number of rows (BF16) or bytes (FP8 values and scales)
 * that differ. */
static uint64_t compare_rows(struct sim *s, uint32_t g, const char *name, const uint8_t *full,
                             uint64_t rows, uint64_t cols, const uint64_t *start,
                             const uint64_t *len, uint32_t n, bool fp8)
{
    const struct wb_inventory *R = s->f->in.rollout;
    ssize_t ri = wb_inv_find(R, name);
    CHECK(ri >= 0);
    const uint8_t *got = s->dst[g][ri];
    CHECK(got != NULL);
    uint64_t bad = 0, lrow = 0;
    const float *gs = NULL;
    float *am = NULL;
    if (fp8) {
        char sn[WB_NAME_MAX];
        snprintf(sn, sizeof(sn), "%s_scale_inv", name);
        ssize_t si = wb_inv_find(R, sn);
        CHECK(si >= 0);
        gs = (const float *)s->dst[g][si];
        CHECK(gs != NULL);
        am = block_amax(full, rows, cols);
    }
    uint64_t bc = (cols + 127) / 128;
    for (uint32_t p = 0; p < n; p++)
        for (uint64_t r = start[p]; r < start[p] + len[p]; r++, lrow++) {
            if (!fp8) {
                bad += memcmp(got + lrow * cols * 2, full + r * cols * 2, cols * 2) != 0;
                continue;
            }
            CHECK(r % 128 == lrow % 128); /* every share is whole blocks */
            for (uint64_t k = 0; k < cols; k++) {
                float a = am[r / 128 * bc + k / 128];
                uint16_t b;
                memcpy(&b, full + (r * cols + k) * 2, 2);
                bad += got[lrow * cols + k] != sim_f_to_e4m3(sim_bf16_to_f(b) * (448.0f / a));
                if (r % 128 == 0 && k % 128 == 0) {
                    float sc = a / 448.0f;
                    bad += memcmp(&gs[lrow / 128 * bc + k / 128], &sc, 4) != 0;
                }
            }
        }
    free(am);
    return bad;
}

static const char FSDP2[] = "world_size: 2\ngpus_per_node: 2\nmesh:\n  - {name: fsdp, size: 2}\n"
                            "placements:\n  - match: \"*\"\n    place: {fsdp: shard(0)}\n";
/* three shards of every tensor: row cuts inside the q/k/v and gate/up parts and inside FP8
 * blocks (1024 rows: 342 | 342 | 340), so amax exchanges run */
static const char FSDP3[] = "world_size: 3\ngpus_per_node: 3\nmesh:\n  - {name: fsdp, size: 3}\n"
                            "placements:\n  - match: \"*\"\n    place: {fsdp: shard(0)}\n";

/* Plans, executes and checks (planner_sim.h's own reference), then compares every rank's
 * qkv_proj and gate_up_proj of every layer with the independent computation; returns how
 * many rows (BF16) or bytes (FP8) differ. */
static uint64_t run(const char *family, const struct tiny_cfg *c, const char *trainer_yaml,
                    uint32_t tp, enum wb_plan_mode mode, struct wb_plan_stats *stats)
{
    struct fx f;
    struct wb_model md;
    fx_init(&f);
    const char *cfg = write_config(c);
    char tl[512], rl[512], rtext[128];
    snprintf(tl, sizeof(tl), "%s", wb_test_write_file("trainer.yaml", trainer_yaml));
    snprintf(rtext, sizeof(rtext), "replicas: 1\ngpus_per_replica: %u\ntp: %u\n", tp, tp);
    snprintf(rl, sizeof(rl), "%s", wb_test_write_file("rollout.yaml", rtext));
    struct wb_model_src src = {
        .rules = family, .config = cfg, .trainer_layout = tl, .rollout_layout = rl};
    fx_model(&f, &src, &md);
    struct wb_plan *p = sim_plan_check(&f, mode);
    struct sim s;
    sim_setup(&s, &f, p);
    sim_run(&s);
    uint64_t bad = 0;
    for (uint32_t g = 0; g < tp; g++)
        for (uint32_t l = 0; l < c->layers; l++) {
            char tn[WB_NAME_MAX];
            uint64_t start[3], len[3];
            uint32_t n = qkv_rows(c, g, tp, start, len);
            snprintf(tn, sizeof(tn), "model.layers.%u.self_attn.qkv_proj.weight", l);
            ssize_t t = wb_inv_find(f.in.trainer, tn);
            CHECK(t >= 0);
            bad += compare_rows(&s, g, tn, s.full[t], f.in.trainer->p[t].shape.dim[0], c->hidden,
                                start, len, n, c->fp8);
            n = gate_up_rows(c, g, tp, start, len);
            snprintf(tn, sizeof(tn), "model.layers.%u.mlp.gate_up_proj.weight", l);
            t = wb_inv_find(f.in.trainer, tn);
            CHECK(t >= 0);
            bad += compare_rows(&s, g, tn, s.full[t], f.in.trainer->p[t].shape.dim[0], c->hidden,
                                start, len, n, c->fp8);
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

/* Runs the phi3 family on c at TP 1, 2, 4 in every mode from 2 and 3 FSDP shards; every byte
 * right. Gather mode gathers each trainer tensor once per mesh member, the split ones too (9
 * tensors a layer-1 model: embed, norm, lm_head, 2 norms, qkv, o, gate_up, down; layer 2
 * adds 6); with 3 shards FP8 blocks straddle owners and direct mode exchanges their amax. */
static void run_all(const struct tiny_cfg *c)
{
    uint64_t tensors = 3 + 6 * (uint64_t)c->layers;
    for (uint32_t tp = 1; tp <= 4; tp *= 2)
        for (size_t m = 0; m < WB_ARRAY_LEN(MODES); m++)
            for (uint32_t world = 2; world <= 3; world++) {
                struct wb_plan_stats st;
                CHECK_U64(run("configs/models/phi3.yaml", c, world == 2 ? FSDP2 : FSDP3, tp,
                              MODES[m], &st),
                          0);
                CHECK_U64(st.tensors, tensors);
                if (MODES[m] == WB_MODE_GATHER)
                    CHECK_U64(st.gathers, tensors * world);
                if (MODES[m] == WB_MODE_DIRECT)
                    CHECK_U64(st.gathers, 0);
                if (MODES[m] == WB_MODE_DIRECT && c->fp8 && world == 3)
                    CHECK(st.amax_ops > 0);
            }
}

/* BF16: 4 query heads of 32, 2 kv heads (replicated at TP 4), gate/up of 96 rows each. */
static void test_phi3_bf16(void)
{
    struct tiny_cfg c = {.hidden = 128,
                         .heads = 4,
                         .kv_heads = 2,
                         .head_dim = 32,
                         .inter = 96,
                         .layers = 2,
                         .vocab = 256};
    run_all(&c);
}

/* FP8 rollout: heads of 128 so that every rank's share is whole blocks. */
static void test_phi3_fp8(void)
{
    struct tiny_cfg c = {.hidden = 256,
                         .heads = 4,
                         .kv_heads = 2,
                         .head_dim = 128,
                         .inter = 512,
                         .layers = 1,
                         .vocab = 256,
                         .fp8 = true};
    run_all(&c);
}

/* q and k sizes swapped: every shape is right, the plan verifies against its own mappings, and
 * at TP >= 2 the rows are wrong — which only the independent computation sees. At TP 1 the
 * swap changes nothing (the whole tensor is one piece). */
static void test_swapped_split_caught_by_rows(void)
{
    struct tiny_cfg c = {.hidden = 128,
                         .heads = 4,
                         .kv_heads = 2,
                         .head_dim = 32,
                         .inter = 96,
                         .layers = 1,
                         .vocab = 256};
    const char *fam = swapped_family();
    CHECK_U64(run(fam, &c, FSDP2, 1, WB_MODE_AUTO, NULL), 0);
    /* q is rows 0:128, k 128:192, v 192:256. Rank 0 of 2 holds rows 0:32, 64:128, 192:224
     * instead of 0:64, 128:160, 192:224 (64 of its 128 rows wrong); rank 1 holds 32:64,
     * 128:192, 224:256 instead of 64:128, 160:192, 224:256 (64 wrong) */
    CHECK_U64(run(fam, &c, FSDP2, 2, WB_MODE_AUTO, NULL), 2 * 64);
    CHECK_U64(run("configs/models/phi3.yaml", &c, FSDP2, 2, WB_MODE_AUTO, NULL), 0);
}

const struct wb_test wb_tests[] = {
    {"phi3_bf16", test_phi3_bf16, 300},
    {"phi3_fp8", test_phi3_fp8, 600},
    {"swapped_split_caught_by_rows", test_swapped_split_caught_by_rows, 0},
    {0},
};
