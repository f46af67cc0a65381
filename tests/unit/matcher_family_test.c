/* matcher_family_test.c — every shipped model family: the trainer inventory generated from the
 * real config.json (Hugging Face names) matches the generated rollout inventory (vLLM names)
 * with zero errors, and the mappings are counted exactly (fused qkv / gate_up, stacked
 * experts, FP8 quantized, ties, ignored). Also: inventories (registration, files), a fifth
 * family added as YAML only (Mixtral), and trainer-stacked -> rollout-per-expert unstacking. */
#include "matcher/matcher.h"
#include "tests/wbtest.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct counts {
    size_t trainer, rollout, maps, ignored;
    size_t kind[6];  /* enum wb_map_kind */
    size_t xform[3]; /* enum wb_xform */
    size_t scaled;   /* mappings with a rollout scale */
};

struct fam {
    struct wb_inventory t, r;
    struct wb_match_rules *rules;
    struct wb_match *m;
    struct counts c;
};

static void print_errors(const struct wb_errlist *el)
{
    for (size_t i = 0; i < el->n && i < 20; i++)
        fprintf(stderr, "  error: %s\n", el->msgs[i]);
}

/* Generates both sides from a family file and a config, then matches. */
static void run_family(const char *family, const char *trainer_cfg, const char *rollout_cfg,
                       bool bind, struct fam *f)
{
    struct wb_errlist el;
    wb_errlist_init(&el);
    memset(f, 0, sizeof(*f));
    wb_inv_init(&f->t);
    wb_inv_init(&f->r);
    int r = wb_inv_generate(family, trainer_cfg, "trainer", &f->t, &el);
    if (!r)
        r = wb_inv_generate(family, rollout_cfg, "rollout", &f->r, &el);
    if (!r)
        r = wb_match_rules_load(family, &f->rules, &el);
    if (!r && bind)
        r = wb_match_rules_bind_config(f->rules, rollout_cfg, &el);
    if (!r)
        r = wb_match_run(f->rules, &f->t, &f->r, &f->m, &el);
    if (r)
        print_errors(&el);
    CHECK_INT(r, 0);
    CHECK_INT(el.n, 0);
    wb_errlist_free(&el);
    f->c.trainer = f->t.n;
    f->c.rollout = f->r.n;
    f->c.maps = f->m->n;
    f->c.ignored = f->m->nignored;
    for (size_t i = 0; i < f->m->n; i++) {
        const struct wb_mapping *m = &f->m->map[i];
        f->c.kind[m->kind]++;
        f->c.xform[m->xform]++;
        f->c.scaled += m->scale >= 0;
    }
}

static void fam_free(struct fam *f)
{
    wb_match_free(f->m);
    wb_match_rules_free(f->rules);
    wb_inv_free(&f->t);
    wb_inv_free(&f->r);
}

static const struct wb_mapping *find_map(const struct fam *f, const char *rollout)
{
    ssize_t i = wb_inv_find(&f->r, rollout);
    CHECK(i >= 0);
    for (size_t k = 0; k < f->m->n; k++)
        if (f->m->map[k].rollout == (uint32_t)i)
            return &f->m->map[k];
    wb_test_fail(__FILE__, __LINE__, "no mapping for %s", rollout);
}

static const char *tname(const struct fam *f, const struct wb_mapping *m, uint32_t c)
{
    return f->t.p[m->comp[c].trainer].name;
}

static void check_box(const struct wb_box *b, uint32_t ndim, const uint64_t *off,
                      const uint64_t *ext)
{
    CHECK_INT(b->ndim, ndim);
    for (uint32_t d = 0; d < ndim; d++) {
        CHECK_U64(b->off[d], off[d]);
        CHECK_U64(b->ext[d], ext[d]);
    }
}

/* A config.json derived from a shipped one by replacing one text (e.g. a tied variant). */
static const char *derived_config(const char *from, const char *name, const char *old,
                                  const char *new)
{
    FILE *f = fopen(from, "r");
    CHECK(f);
    static char buf[1 << 16], out[1 << 16];
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = 0;
    char *at = strstr(buf, old);
    CHECK(at);
    snprintf(out, sizeof(out), "%.*s%s%s", (int)(at - buf), buf, new, at + strlen(old));
    return wb_test_write_file(name, out);
}

static const char *const FP8_BLOCK =
    "\"quantization_config\": {\"activation_scheme\": \"dynamic\", \"fmt\": \"e4m3\", "
    "\"quant_method\": \"fp8\", \"weight_block_size\": [128, 128]},\n  \"rms_norm_eps\"";

/* ---------------------------------------------------------------- families */

static void test_qwen3_8b(void)
{
    struct fam f;
    run_family("configs/models/qwen3.yaml", "configs/hf/Qwen3-8B.json", "configs/hf/Qwen3-8B.json",
               true, &f);
    CHECK_INT(f.c.trainer, 3 + 36 * 11);
    CHECK_INT(f.c.rollout, 3 + 36 * 8);
    CHECK_INT(f.c.maps, 291);
    CHECK_INT(f.c.kind[WB_MAP_FUSE], 72); /* 36 qkv + 36 gate_up */
    CHECK_INT(f.c.kind[WB_MAP_RENAME], 219);
    CHECK_INT(f.c.xform[WB_XFORM_COPY], 291);
    CHECK_INT(f.c.scaled, 0);

    const struct wb_mapping *m = find_map(&f, "model.layers.5.self_attn.qkv_proj.weight");
    CHECK_INT(m->ncomp, 3);
    CHECK_STR(tname(&f, m, 0), "model.layers.5.self_attn.q_proj.weight");
    CHECK_STR(tname(&f, m, 1), "model.layers.5.self_attn.k_proj.weight");
    CHECK_STR(tname(&f, m, 2), "model.layers.5.self_attn.v_proj.weight");
    check_box(&m->comp[1].src, 2, (uint64_t[]){0, 0}, (uint64_t[]){1024, 4096});
    check_box(&m->comp[1].dst, 2, (uint64_t[]){4096, 0}, (uint64_t[]){1024, 4096});
    check_box(&m->comp[2].dst, 2, (uint64_t[]){5120, 0}, (uint64_t[]){1024, 4096});
    CHECK_INT(m->comp[0].heads, 32);
    CHECK_INT(m->comp[1].heads, 8);
    CHECK_INT(m->comp[2].heads, 8);
    CHECK_INT(m->shard.kind, WB_SHARD_TP);
    CHECK_INT(m->shard.dim, 0);
    CHECK_INT(m->rule_line, 110);
    CHECK_INT(m->xform, WB_XFORM_COPY);
    CHECK_INT(m->scale, -1);

    m = find_map(&f, "model.layers.5.mlp.down_proj.weight");
    CHECK_INT(m->kind, WB_MAP_RENAME);
    CHECK_INT(m->shard.kind, WB_SHARD_TP);
    CHECK_INT(m->shard.dim, 1);
    m = find_map(&f, "model.layers.5.self_attn.k_norm.weight");
    CHECK_INT(m->shard.kind, WB_SHARD_REPLICATE);
    CHECK_STR(f.m->rules_path, "configs/models/qwen3.yaml");
    fam_free(&f);
}

static void test_qwen3_8b_fp8(void)
{
    /* Qwen3-8B-FP8: BF16 trainer (HF names), FP8 block-quantized vLLM rollout */
    struct fam f;
    run_family("configs/models/qwen3.yaml", "configs/hf/Qwen3-8B.json",
               "configs/hf/Qwen3-8B-FP8.json", true, &f);
    CHECK_INT(f.c.trainer, 399);
    CHECK_INT(f.c.rollout, 3 + 36 * 4 + 36 * 4 * 2);
    CHECK_INT(f.c.maps, 291);
    CHECK_INT(f.c.xform[WB_XFORM_FP8_BLOCK], 144);
    CHECK_INT(f.c.xform[WB_XFORM_COPY], 147);
    CHECK_INT(f.c.scaled, 144);
    const struct wb_mapping *m = find_map(&f, "model.layers.0.self_attn.qkv_proj.weight");
    CHECK_STR(f.r.p[m->scale].name, "model.layers.0.self_attn.qkv_proj.weight_scale_inv");
    CHECK_INT(f.r.p[m->scale].shape.dim[0], 48);
    CHECK_INT(f.r.p[m->scale].shape.dim[1], 32);
    CHECK_INT(m->src_dtype, WB_DTYPE_BF16);
    CHECK_INT(m->dst_dtype, WB_DTYPE_FP8_E4M3);
    CHECK_INT(m->block, 128);
    m = find_map(&f, "model.norm.weight");
    CHECK_INT(m->xform, WB_XFORM_COPY);
    CHECK_INT(m->block, 0);
    fam_free(&f);
}

static void test_qwen3_30b_a3b(void)
{
    struct fam f;
    run_family("configs/models/qwen3_moe.yaml", "configs/hf/Qwen3-30B-A3B.json",
               "configs/hf/Qwen3-30B-A3B.json", true, &f);
    CHECK_INT(f.c.trainer, 3 + 48 * (8 + 1 + 128 * 3));
    CHECK_INT(f.c.trainer, 18867);
    CHECK_INT(f.c.rollout, 3 + 48 * 9);
    CHECK_INT(f.c.maps, 435);
    CHECK_INT(f.c.kind[WB_MAP_FUSE], 48);  /* qkv; no dense layer, so no gate_up */
    CHECK_INT(f.c.kind[WB_MAP_STACK], 96); /* 48 w13 + 48 w2 */
    CHECK_INT(f.c.kind[WB_MAP_RENAME], 291);
    size_t gate_up = 0, w13 = 0, w2 = 0;
    for (size_t i = 0; i < f.m->n; i++) {
        const char *n = f.r.p[f.m->map[i].rollout].name;
        gate_up += strstr(n, "gate_up_proj") != NULL;
        w13 += strstr(n, "w13_weight") != NULL;
        w2 += strstr(n, "w2_weight") != NULL;
    }
    CHECK_INT(gate_up, 0);
    CHECK_INT(w13, 48);
    CHECK_INT(w2, 48);

    const struct wb_mapping *m = find_map(&f, "model.layers.47.mlp.experts.w13_weight");
    CHECK_INT(m->kind, WB_MAP_STACK);
    CHECK_INT(m->ncomp, 256); /* 128 experts x (gate, up) */
    CHECK_STR(tname(&f, m, 0), "model.layers.47.mlp.experts.0.gate_proj.weight");
    CHECK_STR(tname(&f, m, 1), "model.layers.47.mlp.experts.0.up_proj.weight");
    CHECK_STR(tname(&f, m, 255), "model.layers.47.mlp.experts.127.up_proj.weight");
    check_box(&m->comp[255].src, 2, (uint64_t[]){0, 0}, (uint64_t[]){768, 2048});
    check_box(&m->comp[255].dst, 3, (uint64_t[]){127, 768, 0}, (uint64_t[]){1, 768, 2048});
    CHECK_INT(m->shard.kind, WB_SHARD_EP);
    CHECK_INT(m->shard.dim, 0);
    CHECK_INT(m->shard.ep1_tp_dim, 1);
    m = find_map(&f, "model.layers.0.mlp.experts.w2_weight");
    CHECK_INT(m->ncomp, 128);
    check_box(&m->comp[3].dst, 3, (uint64_t[]){3, 0, 0}, (uint64_t[]){1, 2048, 768});
    CHECK_INT(m->shard.ep1_tp_dim, 2);
    m = find_map(&f, "model.layers.0.mlp.gate.weight");
    CHECK_INT(m->shard.kind, WB_SHARD_REPLICATE);
    m = find_map(&f, "model.layers.0.self_attn.qkv_proj.weight");
    CHECK_INT(m->comp[1].heads, 4);
    fam_free(&f);
}

static void test_qwen3_235b_a22b(void)
{
    struct fam f;
    run_family("configs/models/qwen3_moe.yaml", "configs/hf/Qwen3-235B-A22B.json",
               "configs/hf/Qwen3-235B-A22B.json", false, &f);
    CHECK_INT(f.c.trainer, 36945);
    CHECK_INT(f.c.rollout, 849);
    CHECK_INT(f.c.kind[WB_MAP_FUSE], 94);
    CHECK_INT(f.c.kind[WB_MAP_STACK], 188);
    CHECK_INT(f.c.kind[WB_MAP_RENAME], 567);
    /* without a bound config the rules' head_dim default (128) applies: 64 q and 4 kv heads */
    const struct wb_mapping *m = find_map(&f, "model.layers.93.self_attn.qkv_proj.weight");
    CHECK_INT(m->comp[0].heads, 64);
    CHECK_INT(m->comp[2].heads, 4);
    fam_free(&f);
}

static void test_qwen3_moe_fp8_and_dense_layers(void)
{
    /* Qwen3-30B-A3B with an FP8 rollout and two dense layers (mlp_only_layers), to cover the
     * MoE-layer condition and the FP8 MoE scale shapes [E, ceil(2I/128), ceil(H/128)] */
    const char *fp8 =
        derived_config("configs/hf/Qwen3-30B-A3B.json", "fp8.json", "\"rms_norm_eps\"", FP8_BLOCK);
    const char *cfg = derived_config(fp8, "fp8_dense.json", "\"mlp_only_layers\": []",
                                     "\"mlp_only_layers\": [0, 47]");
    struct fam f;
    run_family("configs/models/qwen3_moe.yaml", cfg, cfg, true, &f);
    CHECK_INT(f.c.trainer, 3 + 48 * 8 + 46 * (1 + 128 * 3) + 2 * 3);
    CHECK_INT(f.c.kind[WB_MAP_STACK], 92);
    CHECK_INT(f.c.kind[WB_MAP_FUSE], 48 + 2);
    CHECK_INT(f.c.xform[WB_XFORM_FP8_BLOCK], 48 * 2 + 46 * 2 + 2 * 2);
    const struct wb_mapping *m = find_map(&f, "model.layers.1.mlp.experts.w13_weight");
    const struct wb_param *s = &f.r.p[m->scale];
    CHECK_STR(s->name, "model.layers.1.mlp.experts.w13_weight_scale_inv");
    CHECK_INT(s->shape.ndim, 3);
    CHECK_U64(s->shape.dim[0], 128);
    CHECK_U64(s->shape.dim[1], 12);
    CHECK_U64(s->shape.dim[2], 16);
    CHECK(wb_inv_find(&f.r, "model.layers.47.mlp.gate_up_proj.weight") >= 0);
    CHECK(wb_inv_find(&f.r, "model.layers.47.mlp.gate.weight") < 0);
    fam_free(&f);
}

static void test_deepseek_v3(void)
{
    struct fam f;
    run_family("configs/models/deepseek_v3.yaml", "configs/hf/DeepSeek-V3.json",
               "configs/hf/DeepSeek-V3.json", true, &f);
    CHECK_INT(f.c.trainer, 45395);
    CHECK_INT(f.c.rollout, 1327);
    CHECK_INT(f.c.maps, 845);
    CHECK_INT(f.c.kind[WB_MAP_FUSE], 61 + 3 + 58); /* fused_qkv_a, dense and shared gate_up */
    CHECK_INT(f.c.kind[WB_MAP_STACK], 116);
    CHECK_INT(f.c.xform[WB_XFORM_FP8_BLOCK], 482);
    CHECK_INT(f.c.xform[WB_XFORM_COPY], 363);

    const struct wb_mapping *m = find_map(&f, "model.layers.0.self_attn.fused_qkv_a_proj.weight");
    CHECK_INT(m->ncomp, 2);
    CHECK_STR(tname(&f, m, 0), "model.layers.0.self_attn.q_a_proj.weight");
    CHECK_STR(tname(&f, m, 1), "model.layers.0.self_attn.kv_a_proj_with_mqa.weight");
    check_box(&m->comp[1].dst, 2, (uint64_t[]){1536, 0}, (uint64_t[]){576, 7168});
    CHECK_INT(m->shard.kind, WB_SHARD_REPLICATE);
    CHECK_INT(m->xform, WB_XFORM_FP8_BLOCK);
    CHECK_INT(f.r.p[m->scale].shape.dim[0], 17); /* ceil(2112 / 128) */
    m = find_map(&f, "model.layers.3.mlp.gate.e_score_correction_bias");
    CHECK_INT(m->src_dtype, WB_DTYPE_FP32);
    CHECK_INT(m->xform, WB_XFORM_COPY);
    m = find_map(&f, "model.layers.60.mlp.shared_experts.down_proj.weight");
    CHECK_INT(m->shard.dim, 1);
    CHECK(wb_inv_find(&f.t, "model.layers.2.mlp.gate_proj.weight") >= 0);
    CHECK(wb_inv_find(&f.t, "model.layers.3.mlp.gate_proj.weight") < 0);
    fam_free(&f);
}

/* Both sides and the rules with a job's values of the family's vars. */
static void run_family_vars(const char *family, const char *cfg, const char *vars, struct fam *f)
{
    struct wb_errlist el;
    wb_errlist_init(&el);
    memset(f, 0, sizeof(*f));
    wb_inv_init(&f->t);
    wb_inv_init(&f->r);
    int r = wb_inv_generate_vars(family, cfg, vars, "trainer", &f->t, &el);
    r = r ? r : wb_inv_generate_vars(family, cfg, vars, "rollout", &f->r, &el);
    r = r ? r : wb_match_rules_load(family, &f->rules, &el);
    r = r ? r : wb_match_rules_set_vars(f->rules, vars, &el);
    r = r ? r : wb_match_rules_bind_config(f->rules, cfg, &el);
    r = r ? r : wb_match_run(f->rules, &f->t, &f->r, &f->m, &el);
    if (r)
        print_errors(&el);
    CHECK_INT(r, 0);
    wb_errlist_free(&el);
    f->c.trainer = f->t.n;
    f->c.rollout = f->r.n;
    f->c.maps = f->m->n;
    f->c.ignored = f->m->nignored;
    for (size_t i = 0; i < f->m->n; i++) {
        f->c.kind[f->m->map[i].kind]++;
        f->c.xform[f->m->map[i].xform]++;
    }
}

static void test_deepseek_v3_mtp(void)
{
    /* mtp=0 is the default: exactly the main model (test_deepseek_v3) */
    struct fam f;
    run_family_vars("configs/models/deepseek_v3.yaml", "configs/hf/DeepSeek-V3.json", "mtp=0", &f);
    CHECK_INT(f.c.trainer, 45395);
    CHECK_INT(f.c.rollout, 1327);
    CHECK_INT(f.c.maps, 845);
    CHECK(wb_inv_find(&f.t, "model.layers.61.eh_proj.weight") < 0);
    fam_free(&f);

    /* mtp=1: layer 61 as the HF checkpoint holds it (788 tensors, ~13.5 B parameters) and as
     * vLLM's DeepSeekMTP draft holds it */
    run_family_vars("configs/models/deepseek_v3.yaml", "configs/hf/DeepSeek-V3.json", "mtp=1", &f);
    CHECK_INT(f.c.trainer, 45395 + 788);
    CHECK_INT(f.c.rollout, 1327 + 27); /* 19 tensors + 8 FP8 scales */
    CHECK_INT(f.c.maps, 845 + 19);
    CHECK_INT(f.c.ignored, 1); /* model.layers.61.embed_tokens: vLLM shares the target's */
    CHECK_INT(f.c.kind[WB_MAP_FUSE], 122 + 2);
    CHECK_INT(f.c.kind[WB_MAP_STACK], 116 + 2);
    CHECK_INT(f.c.xform[WB_XFORM_FP8_BLOCK], 482 + 8);
    CHECK_INT(f.c.xform[WB_XFORM_COPY], 363 + 11);
    size_t n61 = 0;
    uint64_t params = 0;
    for (size_t i = 0; i < f.t.n; i++)
        if (strncmp(f.t.p[i].name, "model.layers.61.", 16) == 0) {
            n61++;
            params += wb_shape_numel(&f.t.p[i].shape);
        }
    CHECK_INT(n61, 788);
    CHECK_U64(params, 13463426304ull); /* 2 x 0.93 B vocab, 11.27 B experts, ... */

    const struct wb_mapping *m = find_map(&f, "model.layers.61.mtp_block.mlp.experts.w13_weight");
    CHECK_INT(m->kind, WB_MAP_STACK);
    CHECK_INT(m->ncomp, 512);
    CHECK_STR(tname(&f, m, 1), "model.layers.61.mlp.experts.0.up_proj.weight");
    CHECK_INT(m->xform, WB_XFORM_FP8_BLOCK);
    CHECK_INT(m->shard.kind, WB_SHARD_EP);
    m = find_map(&f, "model.layers.61.mtp_block.self_attn.fused_qkv_a_proj.weight");
    CHECK_STR(tname(&f, m, 0), "model.layers.61.self_attn.q_a_proj.weight");
    CHECK_INT(m->shard.kind, WB_SHARD_REPLICATE);
    m = find_map(&f, "model.layers.61.mtp_block.mlp.gate.e_score_correction_bias");
    CHECK_INT(m->src_dtype, WB_DTYPE_FP32);
    m = find_map(&f, "model.layers.61.eh_proj.weight");
    CHECK_INT(m->xform, WB_XFORM_COPY); /* an nn.Linear in vLLM: BF16, replicated */
    CHECK_INT(m->shard.kind, WB_SHARD_REPLICATE);
    CHECK_U64(f.r.p[m->rollout].shape.dim[1], 14336);
    m = find_map(&f, "model.layers.61.shared_head.head.weight");
    CHECK_INT(m->kind, WB_MAP_RENAME);
    CHECK_INT(m->dst_dtype, WB_DTYPE_BF16);
    CHECK_INT(m->shard.pad, 64);
    CHECK(wb_inv_find(&f.r, "model.layers.61.embed_tokens.weight") < 0);
    fam_free(&f);

    /* a trainer that shares the output head (no shared_head.head of its own): built from
     * lm_head.weight */
    struct wb_errlist el;
    wb_errlist_init(&el);
    struct wb_inventory t, t2, r;
    wb_inv_init(&t);
    wb_inv_init(&t2);
    wb_inv_init(&r);
    CHECK_INT(wb_inv_generate_vars("configs/models/deepseek_v3.yaml", "configs/hf/DeepSeek-V3.json",
                                   "mtp=1", "trainer", &t, &el),
              0);
    CHECK_INT(wb_inv_generate_vars("configs/models/deepseek_v3.yaml", "configs/hf/DeepSeek-V3.json",
                                   "mtp=1", "rollout", &r, &el),
              0);
    for (size_t i = 0; i < t.n; i++)
        if (strcmp(t.p[i].name, "model.layers.61.shared_head.head.weight") != 0)
            CHECK_INT(wb_inv_add(&t2, t.p[i].name, t.p[i].dtype, &t.p[i].shape), 0);
    struct wb_match_rules *rules;
    struct wb_match *mt;
    CHECK_INT(wb_match_rules_load("configs/models/deepseek_v3.yaml", &rules, &el), 0);
    CHECK_INT(wb_match_run(rules, &t2, &r, &mt, &el), 0);
    size_t ties = 0;
    for (size_t i = 0; i < mt->n; i++)
        if (mt->map[i].kind == WB_MAP_TIE) {
            ties++;
            CHECK_STR(r.p[mt->map[i].rollout].name, "model.layers.61.shared_head.head.weight");
            CHECK_STR(t2.p[mt->map[i].comp[0].trainer].name, "lm_head.weight");
        }
    CHECK_INT(ties, 1);
    wb_match_free(mt);
    wb_match_rules_free(rules);
    wb_inv_free(&t);
    wb_inv_free(&t2);
    wb_inv_free(&r);
    wb_errlist_free(&el);
}

static void test_kimi_k2(void)
{
    struct fam f;
    run_family("configs/models/deepseek_v3.yaml", "configs/hf/Kimi-K2-Instruct.json",
               "configs/hf/Kimi-K2-Instruct.json", true, &f);
    CHECK_INT(f.c.trainer, 69975);
    CHECK_INT(f.c.rollout, 1339);
    CHECK_INT(f.c.maps, 853);
    CHECK_INT(f.c.kind[WB_MAP_FUSE], 61 + 1 + 60);
    CHECK_INT(f.c.kind[WB_MAP_STACK], 120);
    CHECK_INT(f.c.xform[WB_XFORM_FP8_BLOCK], 486);
    const struct wb_mapping *m = find_map(&f, "model.layers.1.mlp.experts.w13_weight");
    CHECK_INT(m->ncomp, 768);
    CHECK_STR(f.r.p[m->scale].name, "model.layers.1.mlp.experts.w13_weight_scale_inv");
    fam_free(&f);
}

static void test_llama31_8b(void)
{
    struct fam f;
    run_family("configs/models/llama3.yaml", "configs/hf/Llama-3.1-8B.json",
               "configs/hf/Llama-3.1-8B.json", true, &f);
    CHECK_INT(f.c.trainer, 3 + 32 * 9);
    CHECK_INT(f.c.rollout, 3 + 32 * 6);
    CHECK_INT(f.c.kind[WB_MAP_FUSE], 64);
    CHECK_INT(f.c.kind[WB_MAP_RENAME], 131);
    /* no head_dim in this config.json: vars derive it as hidden_size / num_attention_heads */
    const struct wb_mapping *m = find_map(&f, "model.layers.0.self_attn.qkv_proj.weight");
    CHECK_U64(f.r.p[m->rollout].shape.dim[0], 6144);
    CHECK_INT(m->comp[1].heads, 8);
    fam_free(&f);
}

static void test_tied_and_ignored(void)
{
    /* trainer tied (no lm_head; state dict with rotary inv_freq), rollout with a separate
     * lm_head: lm_head is built from embed_tokens, inv_freq is ignored */
    const char *tied =
        derived_config("configs/hf/Llama-3.1-8B.json", "tied.json",
                       "\"tie_word_embeddings\": false", "\"tie_word_embeddings\": true");
    struct wb_errlist el;
    wb_errlist_init(&el);
    struct wb_inventory t, r;
    wb_inv_init(&t);
    wb_inv_init(&r);
    struct wb_match_rules *rules;
    struct wb_match *m;
    CHECK_INT(wb_inv_generate("configs/models/llama3.yaml", tied, "trainer", &t, &el), 0);
    CHECK_INT(wb_inv_generate("configs/models/llama3.yaml", "configs/hf/Llama-3.1-8B.json",
                              "rollout", &r, &el),
              0);
    CHECK(wb_inv_find(&t, "lm_head.weight") < 0);
    struct wb_shape s = {1, {64}};
    CHECK_INT(wb_inv_add(&t, "model.layers.0.self_attn.rotary_emb.inv_freq", WB_DTYPE_FP32, &s), 0);
    CHECK_INT(wb_inv_add(&t, "model.layers.1.self_attn.rotary_emb.inv_freq", WB_DTYPE_FP32, &s), 0);
    CHECK_INT(wb_match_rules_load("configs/models/llama3.yaml", &rules, &el), 0);
    CHECK_INT(wb_match_run(rules, &t, &r, &m, &el), 0);
    CHECK_INT(m->nignored, 2);
    size_t ties = 0;
    for (size_t i = 0; i < m->n; i++)
        if (m->map[i].kind == WB_MAP_TIE) {
            ties++;
            CHECK_STR(r.p[m->map[i].rollout].name, "lm_head.weight");
            CHECK_STR(t.p[m->map[i].comp[0].trainer].name, "model.embed_tokens.weight");
        }
    CHECK_INT(ties, 1);
    CHECK_INT(m->n, 195);
    wb_match_free(m);
    wb_match_rules_free(rules);
    wb_inv_free(&t);
    wb_inv_free(&r);
    CHECK_INT(el.n, 0);
    wb_errlist_free(&el);
}

/* gpt-oss-20b's published config.json (configs/hf/) says MXFP4; its BF16 form has no
 * quantization_config (what a BF16 checkpoint's config.json says). */
static const char *gpt_oss_bf16(void)
{
    FILE *f = fopen("configs/hf/gpt-oss-20b.json", "r");
    CHECK(f);
    static char buf[8192], out[8192];
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = 0;
    char *a = strstr(buf, "  \"quantization_config\": {");
    char *z = a ? strstr(a, "\"quant_method\": \"mxfp4\"\n  },\n") : NULL;
    CHECK(a && z);
    z += strlen("\"quant_method\": \"mxfp4\"\n  },\n");
    snprintf(out, sizeof(out), "%.*s%s", (int)(a - buf), buf, z);
    return wb_test_write_file("gpt-oss-20b-bf16.json", out);
}

static void test_gpt_oss_20b(void)
{
    char cfg[512];
    snprintf(cfg, sizeof(cfg), "%s", gpt_oss_bf16());
    struct fam f;
    run_family("configs/models/gpt_oss.yaml", cfg, cfg, true, &f);
    /* 3 + 24 x (2 norms, q/k/v/o weights and biases, sinks, router weight and bias, 4 expert
     * tensors) */
    CHECK_INT(f.c.trainer, 3 + 24 * 17);
    CHECK_INT(f.c.rollout, 3 + 24 * 13);
    CHECK_INT(f.c.maps, 315);
    CHECK_INT(f.c.kind[WB_MAP_FUSE], 48); /* qkv weight and bias */
    CHECK_INT(f.c.kind[WB_MAP_RENAME], 267);
    CHECK_INT(f.c.xform[WB_XFORM_COPY], 315);
    size_t permuted = 0;
    for (size_t i = 0; i < f.m->n; i++)
        permuted += f.m->map[i].comp[0].permuted;
    CHECK_INT(permuted, 48); /* w13 and w2 of every layer */

    const struct wb_mapping *m = find_map(&f, "model.layers.7.mlp.experts.w13_weight");
    CHECK_INT(m->ncomp, 1);
    CHECK_STR(tname(&f, m, 0), "model.layers.7.mlp.experts.gate_up_proj");
    CHECK(m->comp[0].permuted);
    CHECK_INT(m->comp[0].perm[0], 0);
    CHECK_INT(m->comp[0].perm[1], 2);
    CHECK_INT(m->comp[0].perm[2], 1);
    check_box(&m->comp[0].src, 3, (uint64_t[]){0, 0, 0}, (uint64_t[]){32, 2880, 5760});
    check_box(&m->comp[0].dst, 3, (uint64_t[]){0, 0, 0}, (uint64_t[]){32, 5760, 2880});
    CHECK_INT(m->shard.kind, WB_SHARD_EP);
    CHECK_INT(m->shard.ep1_tp_dim, 1);
    m = find_map(&f, "model.layers.7.mlp.experts.w2_weight");
    check_box(&m->comp[0].src, 3, (uint64_t[]){0, 0, 0}, (uint64_t[]){32, 2880, 2880});
    CHECK(m->comp[0].permuted);
    CHECK_INT(m->shard.ep1_tp_dim, 2);
    m = find_map(&f, "model.layers.7.mlp.experts.w2_bias");
    CHECK(!m->comp[0].permuted);
    CHECK_INT(m->shard.ep1_tp_dim, WB_SHARD_RANK0);
    m = find_map(&f, "model.layers.7.attn.qkv_proj.bias");
    CHECK_INT(m->ncomp, 3);
    check_box(&m->comp[2].dst, 1, (uint64_t[]){4608}, (uint64_t[]){512});
    CHECK_INT(m->comp[0].heads, 64);
    CHECK_INT(m->comp[1].heads, 8);
    m = find_map(&f, "model.layers.7.attn.sinks");
    CHECK_STR(tname(&f, m, 0), "model.layers.7.self_attn.sinks");
    CHECK_INT(m->shard.kind, WB_SHARD_TP);
    m = find_map(&f, "model.layers.7.attn.o_proj.bias");
    CHECK_INT(m->shard.kind, WB_SHARD_REPLICATE);
    m = find_map(&f, "model.embedding.weight");
    CHECK_STR(tname(&f, m, 0), "model.embed_tokens.weight");
    CHECK_INT(m->shard.pad, 64);
    fam_free(&f);
}

static void test_gpt_oss_mxfp4_refused(void)
{
    /* the published config: the trainer (BF16 in training) is generated, the MXFP4 rollout is
     * refused naming the key */
    struct wb_errlist el;
    wb_errlist_init(&el);
    struct wb_inventory t, r;
    wb_inv_init(&t);
    wb_inv_init(&r);
    CHECK_INT(wb_inv_generate("configs/models/gpt_oss.yaml", "configs/hf/gpt-oss-20b.json",
                              "trainer", &t, &el),
              0);
    CHECK_INT(t.n, 411);
    CHECK_INT(wb_inv_generate("configs/models/gpt_oss.yaml", "configs/hf/gpt-oss-20b.json",
                              "rollout", &r, &el),
              -WB_E_CONFIG);
    CHECK_INT(el.n, 1);
    CHECK_STR(el.msgs[0], "configs/hf/gpt-oss-20b.json: quantization_config.quant_method: mxfp4: "
                          "not produced by weightbridge (only fp8 with 128x128 blocks); for a BF16 "
                          "rollout give a config.json without quantization_config, this one for "
                          "the trainer side only (wb-match --config BF16.json --trainer-config "
                          "configs/hf/gpt-oss-20b.json)");
    wb_inv_free(&t);
    wb_inv_free(&r);
    wb_errlist_free(&el);
}

/* ---------------------------------------------------------------- YAML-only families */

static void test_mixtral_yaml_only(void)
{
    /* a fifth family, Mixtral naming (block_sparse_moe, experts w1/w2/w3), added with a YAML
     * file and its config.json only */
    struct fam f;
    run_family("tests/fixtures/matcher/mixtral.yaml",
               "tests/fixtures/matcher/Mixtral-8x7B-v0.1.json",
               "tests/fixtures/matcher/Mixtral-8x7B-v0.1.json", true, &f);
    CHECK_INT(f.c.trainer, 3 + 32 * (7 + 8 * 3));
    CHECK_INT(f.c.rollout, 3 + 32 * 7);
    CHECK_INT(f.c.kind[WB_MAP_FUSE], 32);
    CHECK_INT(f.c.kind[WB_MAP_STACK], 64);
    const struct wb_mapping *m =
        find_map(&f, "model.layers.31.block_sparse_moe.experts.w13_weight");
    CHECK_INT(m->ncomp, 16);
    CHECK_STR(tname(&f, m, 0), "model.layers.31.block_sparse_moe.experts.0.w1.weight");
    CHECK_STR(tname(&f, m, 1), "model.layers.31.block_sparse_moe.experts.0.w3.weight");
    check_box(&m->comp[1].dst, 3, (uint64_t[]){0, 14336, 0}, (uint64_t[]){1, 14336, 4096});
    fam_free(&f);
}

static void test_unstack_trainer_stacked(void)
{
    /* trainer holds stacked experts gate_up_proj [E, 2I, H] / down_proj [E, H, I]; the
     * rollout wants one tensor per expert: each is a slice (and half) of the stacked one */
    struct fam f;
    run_family("tests/fixtures/matcher/stacked_to_per_expert.yaml",
               "tests/fixtures/matcher/tiny_moe.json", "tests/fixtures/matcher/tiny_moe.json",
               false, &f);
    CHECK_INT(f.c.trainer, 2 * 2);
    CHECK_INT(f.c.rollout, 2 * 4 * 3);
    CHECK_INT(f.c.kind[WB_MAP_UNSTACK], 24);
    const struct wb_mapping *m = find_map(&f, "layers.1.experts.3.up_proj.weight");
    CHECK_INT(m->ncomp, 1);
    CHECK_STR(tname(&f, m, 0), "layers.1.experts.gate_up_proj");
    check_box(&m->comp[0].src, 3, (uint64_t[]){3, 256, 0}, (uint64_t[]){1, 256, 128});
    check_box(&m->comp[0].dst, 2, (uint64_t[]){0, 0}, (uint64_t[]){256, 128});
    m = find_map(&f, "layers.0.experts.2.down_proj.weight");
    check_box(&m->comp[0].src, 3, (uint64_t[]){2, 0, 0}, (uint64_t[]){1, 128, 256});
    fam_free(&f);
}

static void test_fp8_checkpoint_cast_and_rollout_ignore(void)
{
    /* checkpoint broadcast: the trainer side is itself an FP8 checkpoint (values + scales);
     * fused into an FP8 rollout tensor, values and scales are copied. An FP32 trainer tensor
     * is cast to a BF16 rollout tensor, and a rollout tensor declared ignorable (a KV-cache
     * scale nothing writes) is left out. */
    const char *cfg = wb_test_write_file("c.json", "{\"hidden\": 256}");
    char cfg_path[512];
    snprintf(cfg_path, sizeof(cfg_path), "%s", cfg);
    const char *fam = wb_test_write_file(
        "ckpt.yaml", "family: ckpt\n"
                     "quant: {fp8: [\"*_proj.weight\"]}\n"
                     "ignore: {rollout: [\"*.k_scale\"]}\n"
                     "trainer:\n"
                     "  - fp8: 1\n"
                     "    tensors: {a.q_a_proj.weight: [1536, hidden], a.kv_a_proj.weight: [576, "
                     "hidden]}\n"
                     "  - dtype: fp32\n"
                     "    tensors: {a.norm.weight: [hidden]}\n"
                     "rollout:\n"
                     "  - fp8: 1\n"
                     "    tensors: {a.fused_proj.weight: [2112, hidden]}\n"
                     "  - tensors: {a.norm.weight: [hidden], a.attn.k_scale: []}\n"
                     "rules:\n"
                     "  - rollout: a.fused_proj.weight\n"
                     "    from: [a.q_a_proj.weight, a.kv_a_proj.weight]\n"
                     "  - rollout: \"*\"\n"
                     "    from: \"*\"\n");
    char fam_path[512];
    snprintf(fam_path, sizeof(fam_path), "%s", fam);
    struct fam f;
    run_family(fam_path, cfg_path, cfg_path, false, &f);
    CHECK_INT(f.c.trainer, 5);
    CHECK_INT(f.c.rollout, 4);
    CHECK_INT(f.c.maps, 3);
    const struct wb_mapping *m = find_map(&f, "a.fused_proj.weight");
    CHECK_INT(m->xform, WB_XFORM_COPY);
    CHECK_INT(m->src_dtype, WB_DTYPE_FP8_E4M3);
    CHECK_INT(m->block, 128);
    CHECK_INT(m->scale, -1); /* the scales are a mapping of their own */
    CHECK_STR(f.t.p[m->comp[0].trainer_scale].name, "a.q_a_proj.weight_scale_inv");
    CHECK_STR(f.t.p[m->comp[1].trainer_scale].name, "a.kv_a_proj.weight_scale_inv");
    CHECK_U64(f.t.p[m->comp[1].trainer_scale].shape.dim[0], 5);
    m = find_map(&f, "a.fused_proj.weight_scale_inv");
    CHECK(m->fp8_scales);
    CHECK_INT(m->xform, WB_XFORM_COPY);
    CHECK_INT(m->src_dtype, WB_DTYPE_FP32);
    CHECK_U64(f.r.p[m->rollout].shape.dim[0], 17);
    CHECK_INT(m->ncomp, 2);
    CHECK_STR(f.t.p[m->comp[1].trainer].name, "a.kv_a_proj.weight_scale_inv");
    check_box(&m->comp[1].src, 2, (uint64_t[]){0, 0}, (uint64_t[]){5, 2});
    check_box(&m->comp[1].dst, 2, (uint64_t[]){12, 0}, (uint64_t[]){5, 2});
    m = find_map(&f, "a.norm.weight");
    CHECK_INT(m->xform, WB_XFORM_CAST);
    CHECK_INT(m->src_dtype, WB_DTYPE_FP32);
    CHECK_INT(m->dst_dtype, WB_DTYPE_BF16);
    fam_free(&f);
}

/* ---------------------------------------------------------------- inventories */

static void test_inventory_add_find(void)
{
    struct wb_inventory inv;
    wb_inv_init(&inv);
    struct wb_shape s = {2, {8, 16}};
    char name[64];
    for (int i = 0; i < 5000; i++) {
        snprintf(name, sizeof(name), "layers.%d.w", i);
        CHECK_INT(wb_inv_add(&inv, name, WB_DTYPE_BF16, &s), 0);
    }
    CHECK_INT(wb_inv_add(&inv, "layers.17.w", WB_DTYPE_BF16, &s), -EEXIST);
    CHECK_INT(wb_inv_add(&inv, "", WB_DTYPE_BF16, &s), -EINVAL);
    CHECK_INT(wb_inv_add(&inv, "x", WB_DTYPE_INVALID, &s), -EINVAL);
    CHECK_INT(inv.n, 5000);
    CHECK_INT(wb_inv_find(&inv, "layers.4321.w"), 4321);
    CHECK_INT(wb_inv_find(&inv, "layers.5000.w"), -1);
    wb_inv_free(&inv);
}

static void test_inventory_file_roundtrip(void)
{
    struct wb_errlist el;
    wb_errlist_init(&el);
    const char *yaml = wb_test_write_file("inv.yaml", "a.weight: {dtype: bf16, shape: [4, 8]}\n"
                                                      "b.weight: [float32, [3]]\n"
                                                      "c.scale: [fp32, []]\n");
    struct wb_inventory inv, back;
    wb_inv_init(&inv);
    wb_inv_init(&back);
    CHECK_INT(wb_inv_load_file(yaml, &inv, &el), 0);
    CHECK_INT(inv.n, 3);
    CHECK_INT(inv.p[1].dtype, WB_DTYPE_FP32);
    CHECK_INT(inv.p[2].shape.ndim, 0);
    char path[512];
    snprintf(path, sizeof(path), "%s/inv.json", wb_test_tmpdir());
    CHECK_INT(wb_inv_save_file(path, &inv), 0);
    CHECK_INT(wb_inv_load_file(path, &back, &el), 0);
    CHECK_INT(back.n, 3);
    for (size_t i = 0; i < 3; i++) {
        CHECK_STR(back.p[i].name, inv.p[i].name);
        CHECK_INT(back.p[i].dtype, inv.p[i].dtype);
        CHECK(wb_shape_eq(&back.p[i].shape, &inv.p[i].shape));
    }
    CHECK_INT(el.n, 0);
    wb_inv_free(&inv);
    wb_inv_free(&back);
    wb_errlist_free(&el);
}

static void test_dry_run_from_files(void)
{
    /* generated inventories written to files and matched from the files (the dry-run path) */
    struct wb_errlist el;
    wb_errlist_init(&el);
    struct wb_inventory t, r, t2, r2;
    wb_inv_init(&t);
    wb_inv_init(&r);
    wb_inv_init(&t2);
    wb_inv_init(&r2);
    CHECK_INT(wb_inv_generate("configs/models/qwen3.yaml", "configs/hf/Qwen3-8B.json", "trainer",
                              &t, &el),
              0);
    CHECK_INT(wb_inv_generate("configs/models/qwen3.yaml", "configs/hf/Qwen3-8B-FP8.json",
                              "rollout", &r, &el),
              0);
    char tp[512], rp[512];
    snprintf(tp, sizeof(tp), "%s/trainer.json", wb_test_tmpdir());
    snprintf(rp, sizeof(rp), "%s/rollout.json", wb_test_tmpdir());
    CHECK_INT(wb_inv_save_file(tp, &t), 0);
    CHECK_INT(wb_inv_save_file(rp, &r), 0);
    CHECK_INT(wb_inv_load_file(tp, &t2, &el), 0);
    CHECK_INT(wb_inv_load_file(rp, &r2, &el), 0);
    struct wb_match_rules *rules;
    struct wb_match *m;
    CHECK_INT(wb_match_rules_load("configs/models/qwen3.yaml", &rules, &el), 0);
    CHECK_INT(wb_match_run(rules, &t2, &r2, &m, &el), 0);
    CHECK_INT(m->n, 291);
    wb_match_free(m);
    wb_match_rules_free(rules);
    wb_inv_free(&t);
    wb_inv_free(&r);
    wb_inv_free(&t2);
    wb_inv_free(&r2);
    wb_errlist_free(&el);
}

const struct wb_test wb_tests[] = {
    {"qwen3_8b", test_qwen3_8b, 0},
    {"qwen3_8b_fp8", test_qwen3_8b_fp8, 0},
    {"qwen3_30b_a3b", test_qwen3_30b_a3b, 0},
    {"qwen3_235b_a22b", test_qwen3_235b_a22b, 0},
    {"qwen3_moe_fp8_and_dense_layers", test_qwen3_moe_fp8_and_dense_layers, 0},
    {"deepseek_v3", test_deepseek_v3, 0},
    {"deepseek_v3_mtp", test_deepseek_v3_mtp, 0},
    {"kimi_k2", test_kimi_k2, 0},
    {"llama31_8b", test_llama31_8b, 0},
    {"tied_and_ignored", test_tied_and_ignored, 0},
    {"gpt_oss_20b", test_gpt_oss_20b, 0},
    {"gpt_oss_mxfp4_refused", test_gpt_oss_mxfp4_refused, 0},
    {"mixtral_yaml_only", test_mixtral_yaml_only, 0},
    {"unstack_trainer_stacked", test_unstack_trainer_stacked, 0},
    {"fp8_checkpoint_cast_and_rollout_ignore", test_fp8_checkpoint_cast_and_rollout_ignore, 0},
    {"inventory_add_find", test_inventory_add_find, 0},
    {"inventory_file_roundtrip", test_inventory_file_roundtrip, 0},
    {"dry_run_from_files", test_dry_run_from_files, 0},
    {0},
};
