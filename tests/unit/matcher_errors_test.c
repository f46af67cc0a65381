/* matcher_errors_test.c — bad input, each with its exact message: missing / extra tensors,
 * shape mismatches (renamed, fused, stacked), FP8 scale problems, unsupported dtype
 * conversions, rule-file errors (unknown key, duplicate rule, captures), inventory-file errors
 * (duplicate name), template arithmetic and config.json fields. Several problems in one run
 * are all reported. */
#include "matcher/matcher.h"
#include "tests/unit/matcher_expect.h"
#include "tests/wbtest.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const QWEN3 = "configs/models/qwen3.yaml";
static const char *const QWEN3_MOE = "configs/models/qwen3_moe.yaml";

struct edit {
    const char *skip;      /* leave this tensor out */
    const char *name;      /* change this tensor ... */
    struct wb_shape shape; /* ... to this shape (ndim 0 = keep) */
    enum wb_dtype dtype;   /* ... and/or dtype (INVALID = keep) */
};

static void copy_edit(const struct wb_inventory *src, struct wb_inventory *dst,
                      const struct edit *e)
{
    wb_inv_init(dst);
    bool seen_skip = !e->skip, seen_name = !e->name;
    for (size_t i = 0; i < src->n; i++) {
        const struct wb_param *p = &src->p[i];
        if (e->skip && strcmp(p->name, e->skip) == 0) {
            seen_skip = true;
            continue;
        }
        struct wb_shape s = p->shape;
        enum wb_dtype dt = p->dtype;
        if (e->name && strcmp(p->name, e->name) == 0) {
            seen_name = true;
            if (e->shape.ndim)
                s = e->shape;
            if (e->dtype)
                dt = e->dtype;
        }
        CHECK_INT(wb_inv_add(dst, p->name, dt, &s), 0);
    }
    CHECK(seen_skip && seen_name);
}

struct pair {
    struct wb_inventory t, r;
    struct wb_match_rules *rules;
};

static void gen_pair(const char *family, const char *tcfg, const char *rcfg, struct pair *p)
{
    struct wb_errlist el;
    wb_errlist_init(&el);
    wb_inv_init(&p->t);
    wb_inv_init(&p->r);
    CHECK_INT(wb_inv_generate(family, tcfg, "trainer", &p->t, &el), 0);
    CHECK_INT(wb_inv_generate(family, rcfg, "rollout", &p->r, &el), 0);
    CHECK_INT(wb_match_rules_load(family, &p->rules, &el), 0);
    wb_errlist_free(&el);
}

static void pair_free(struct pair *p)
{
    wb_inv_free(&p->t);
    wb_inv_free(&p->r);
    wb_match_rules_free(p->rules);
}

/* Matches edited inventories and returns the errors (the match must fail). */
static void match_edited(const char *family, const char *tcfg, const char *rcfg,
                         const struct edit *te, const struct edit *re, struct wb_errlist *el)
{
    struct pair p;
    gen_pair(family, tcfg, rcfg, &p);
    struct wb_inventory t, r;
    struct edit none = {0};
    copy_edit(&p.t, &t, te ? te : &none);
    copy_edit(&p.r, &r, re ? re : &none);
    struct wb_match *m = (struct wb_match *)0x1;
    wb_errlist_init(el);
    CHECK_INT(wb_match_run(p.rules, &t, &r, &m, el), -WB_E_MATCH);
    CHECK(m == (struct wb_match *)0x1); /* untouched on failure */
    wb_inv_free(&t);
    wb_inv_free(&r);
    pair_free(&p);
}

static void qwen3_edited(const struct edit *te, const struct edit *re, struct wb_errlist *el)
{
    match_edited(QWEN3, "configs/hf/Qwen3-8B.json", "configs/hf/Qwen3-8B.json", te, re, el);
}

static void qwen3_fp8_edited(const struct edit *te, const struct edit *re, struct wb_errlist *el)
{
    match_edited(QWEN3, "configs/hf/Qwen3-8B.json", "configs/hf/Qwen3-8B-FP8.json", te, re, el);
}

/* ---------------------------------------------------------------- match errors */

static void test_missing_trainer_tensor(void)
{
    struct wb_errlist el;
    qwen3_edited(&(struct edit){.skip = "model.layers.3.self_attn.o_proj.weight"}, NULL, &el);
    EXPECT(&el, "model.layers.3.self_attn.o_proj.weight: trainer tensor "
                "model.layers.3.self_attn.o_proj.weight not found (rule "
                "configs/models/qwen3.yaml:118)");
    wb_errlist_free(&el);
}

static void test_missing_fused_component(void)
{
    struct wb_errlist el;
    qwen3_edited(&(struct edit){.skip = "model.layers.2.self_attn.k_proj.weight"}, NULL, &el);
    EXPECT(&el, "model.layers.2.self_attn.qkv_proj.weight: trainer tensor "
                "model.layers.2.self_attn.k_proj.weight not found (rule "
                "configs/models/qwen3.yaml:110)");
    wb_errlist_free(&el);
}

static void test_missing_experts(void)
{
    /* two experts missing from one stacked w13: one message names them (rule line 107) */
    struct pair p;
    gen_pair(QWEN3_MOE, "configs/hf/Qwen3-30B-A3B.json", "configs/hf/Qwen3-30B-A3B.json", &p);
    struct wb_inventory t1, t;
    copy_edit(&p.t, &t1, &(struct edit){.skip = "model.layers.0.mlp.experts.5.up_proj.weight"});
    copy_edit(&t1, &t, &(struct edit){.skip = "model.layers.0.mlp.experts.77.gate_proj.weight"});
    struct wb_errlist el;
    wb_errlist_init(&el);
    struct wb_match *m = NULL;
    CHECK_INT(wb_match_run(p.rules, &t, &p.r, &m, &el), -WB_E_MATCH);
    EXPECT(&el, "model.layers.0.mlp.experts.w13_weight: 2 trainer tensors not found: "
                "model.layers.0.mlp.experts.5.up_proj.weight, "
                "model.layers.0.mlp.experts.77.gate_proj.weight (rule "
                "configs/models/qwen3_moe.yaml:193)");
    CHECK(m == NULL);
    wb_errlist_free(&el);
    wb_inv_free(&t1);
    wb_inv_free(&t);
    pair_free(&p);
}

static void test_extra_trainer_tensor(void)
{
    struct pair p;
    gen_pair(QWEN3, "configs/hf/Qwen3-8B.json", "configs/hf/Qwen3-8B.json", &p);
    struct wb_shape s = {1, {8}};
    CHECK_INT(wb_inv_add(&p.t, "model.layers.0.mlp.extra.weight", WB_DTYPE_BF16, &s), 0);
    struct wb_errlist el;
    wb_errlist_init(&el);
    struct wb_match *m = NULL;
    CHECK_INT(wb_match_run(p.rules, &p.t, &p.r, &m, &el), -WB_E_MATCH);
    EXPECT(&el, "model.layers.0.mlp.extra.weight bf16 [8]: trainer tensor not used by any "
                "rollout tensor and not declared ignorable (configs/models/qwen3.yaml)");
    wb_errlist_free(&el);
    pair_free(&p);
}

static void test_extra_rollout_tensor(void)
{
    struct pair p;
    gen_pair(QWEN3, "configs/hf/Qwen3-8B.json", "configs/hf/Qwen3-8B.json", &p);
    struct wb_shape s = {1, {8}};
    CHECK_INT(wb_inv_add(&p.r, "model.layers.0.self_attn.extra.weight", WB_DTYPE_BF16, &s), 0);
    struct wb_errlist el;
    wb_errlist_init(&el);
    struct wb_match *m = NULL;
    CHECK_INT(wb_match_run(p.rules, &p.t, &p.r, &m, &el), -WB_E_MATCH);
    EXPECT(&el, "model.layers.0.self_attn.extra.weight: trainer tensor "
                "model.layers.0.self_attn.extra.weight not found (rule "
                "configs/models/qwen3.yaml:203)");
    wb_errlist_free(&el);
    pair_free(&p);
}

static void test_fused_component_shape(void)
{
    struct wb_errlist el;
    qwen3_edited(
        &(struct edit){.name = "model.layers.0.self_attn.k_proj.weight", .shape = {2, {512, 4096}}},
        NULL, &el);
    EXPECT(&el, "model.layers.0.self_attn.qkv_proj.weight: rollout shape [6144, 4096] != fused "
                "trainer shape [5632, 4096] (q_proj 4096 + k_proj 512 + v_proj 1024) (rule "
                "configs/models/qwen3.yaml:110)");
    wb_errlist_free(&el);
}

static void test_fused_components_disagree(void)
{
    struct wb_errlist el;
    qwen3_edited(
        &(struct edit){.name = "model.layers.4.mlp.up_proj.weight", .shape = {2, {12288, 2048}}},
        NULL, &el);
    EXPECT(&el, "model.layers.4.mlp.gate_up_proj.weight: fused components do not agree outside "
                "dim 0: gate_proj [12288, 4096], up_proj [12288, 2048] (rule "
                "configs/models/qwen3.yaml:122)");
    wb_errlist_free(&el);
}

static void test_rename_shape(void)
{
    struct wb_errlist el;
    qwen3_edited(NULL,
                 &(struct edit){.name = "model.layers.1.self_attn.o_proj.weight",
                                .shape = {2, {4096, 2048}}},
                 &el);
    EXPECT(&el, "model.layers.1.self_attn.o_proj.weight: rollout shape [4096, 2048] != trainer "
                "shape [4096, 4096] (model.layers.1.self_attn.o_proj.weight) (rule "
                "configs/models/qwen3.yaml:118)");
    wb_errlist_free(&el);
}

static void test_wrong_scale_shape(void)
{
    struct wb_errlist el;
    qwen3_fp8_edited(NULL,
                     &(struct edit){.name = "model.layers.0.self_attn.qkv_proj.weight_scale_inv",
                                    .shape = {2, {48, 16}}},
                     &el);
    EXPECT(&el, "model.layers.0.self_attn.qkv_proj.weight_scale_inv: scale fp32 [48, 16] != "
                "expected fp32 [48, 32] for model.layers.0.self_attn.qkv_proj.weight [6144, "
                "4096] in 128x128 blocks (rule configs/models/qwen3.yaml:110)");
    wb_errlist_free(&el);
}

static void test_fp8_without_scale(void)
{
    struct wb_errlist el;
    qwen3_fp8_edited(NULL, &(struct edit){.skip = "model.layers.7.mlp.down_proj.weight_scale_inv"},
                     &el);
    EXPECT(&el, "model.layers.7.mlp.down_proj.weight: rollout dtype fp8_e4m3 needs scale tensor "
                "model.layers.7.mlp.down_proj.weight_scale_inv (rule "
                "configs/models/qwen3.yaml:129)");
    wb_errlist_free(&el);
}

static void test_fp8_not_allowed(void)
{
    struct wb_errlist el;
    qwen3_fp8_edited(
        NULL,
        &(struct edit){.name = "model.layers.0.input_layernorm.weight", .dtype = WB_DTYPE_FP8_E4M3},
        &el);
    EXPECT(&el, "model.layers.0.input_layernorm.weight: rollout dtype fp8_e4m3, but no quant.fp8 "
                "pattern of configs/models/qwen3.yaml:26 allows FP8 for it (it stays in higher "
                "precision)");
    wb_errlist_free(&el);
}

static void test_unsupported_conversion(void)
{
    struct wb_errlist el;
    qwen3_edited(&(struct edit){.name = "model.norm.weight", .dtype = WB_DTYPE_I32}, NULL, &el);
    EXPECT(&el, "model.norm.weight: dtype conversion i32 -> bf16 not supported (trainer "
                "model.norm.weight) (rule configs/models/qwen3.yaml:203)");
    wb_errlist_free(&el);
}

static void test_orphan_scale(void)
{
    struct pair p;
    gen_pair(QWEN3, "configs/hf/Qwen3-8B.json", "configs/hf/Qwen3-8B-FP8.json", &p);
    struct wb_shape s = {2, {1, 1}};
    CHECK_INT(wb_inv_add(&p.r, "model.foo.weight_scale_inv", WB_DTYPE_FP32, &s), 0);
    struct wb_errlist el;
    wb_errlist_init(&el);
    struct wb_match *m = NULL;
    CHECK_INT(wb_match_run(p.rules, &p.t, &p.r, &m, &el), -WB_E_MATCH);
    EXPECT(&el, "model.foo.weight_scale_inv: rollout scale tensor without its value tensor "
                "model.foo.weight");
    wb_errlist_free(&el);
    pair_free(&p);
}

static void test_all_reported_together(void)
{
    /* three problems of different kinds in one run: all three come back, and the trainer
     * tensors named by the two failed mappings are not reported again as unused; the
     * ignorable inv_freq is left out silently */
    struct pair p;
    gen_pair(QWEN3, "configs/hf/Qwen3-8B.json", "configs/hf/Qwen3-8B.json", &p);
    struct wb_inventory t, r;
    copy_edit(&p.t, &t, &(struct edit){.skip = "model.layers.35.mlp.up_proj.weight"});
    copy_edit(&p.r, &r,
              &(struct edit){.name = "model.embed_tokens.weight", .shape = {2, {151936, 2048}}});
    struct wb_shape s = {1, {4}};
    CHECK_INT(wb_inv_add(&t, "model.layers.0.self_attn.rotary_emb.inv_freq", WB_DTYPE_FP32, &s), 0);
    CHECK_INT(wb_inv_add(&t, "model.unused.weight", WB_DTYPE_FP32, &s), 0);
    struct wb_errlist el;
    wb_errlist_init(&el);
    struct wb_match *m = NULL;
    CHECK_INT(wb_match_run(p.rules, &t, &r, &m, &el), -WB_E_MATCH);
    EXPECT(&el,
           "model.embed_tokens.weight: rollout shape [151936, 2048] != trainer shape [151936, "
           "4096] (model.embed_tokens.weight) (rule configs/models/qwen3.yaml:133)",
           "model.layers.35.mlp.gate_up_proj.weight: trainer tensor "
           "model.layers.35.mlp.up_proj.weight not found (rule configs/models/qwen3.yaml:122)",
           "model.unused.weight fp32 [4]: trainer tensor not used by any rollout tensor and not "
           "declared ignorable (configs/models/qwen3.yaml)");
    wb_errlist_free(&el);
    wb_inv_free(&t);
    wb_inv_free(&r);
    pair_free(&p);
}

/* ---------------------------------------------------------------- small inline families */

/* A tiny family: trainer a.{i}.w [rows, 256] for i < n, rollout fused.w; rules given. */
static const char *tiny_cfg(void)
{
    return put("tiny.json", "{\"n\": 2, \"rows\": 64, \"zero\": 0, "
                            "\"eps\": 1e-06, \"hidden\": 256}");
}

static void test_unknown_rule_key(void)
{
    const char *path = put("rules.yaml", "family: t\n"
                                         "rules:\n"
                                         "  - rollout: fused.w\n"
                                         "    from: [a.w, b.w]\n"
                                         "    fuse_dim: 0\n"
                                         "    shard: {tp: 0, heads: 8}\n");
    struct wb_errlist el;
    wb_errlist_init(&el);
    struct wb_match_rules *r = NULL;
    CHECK_INT(wb_match_rules_load(path, &r, &el), -WB_E_CONFIG);
    CHECK(r == NULL);
    EXPECT(&el, fmt("%s:5:5: fuse_dim: unknown key", path),
           fmt("%s:6:20: heads: unknown key", path));
    wb_errlist_free(&el);
}

static void test_duplicate_rule(void)
{
    const char *path = put("rules.yaml", "family: t\n"
                                         "rules:\n"
                                         "  - rollout: x.{L}.w\n"
                                         "    from: y.{L}.w\n"
                                         "  - rollout: z.w\n"
                                         "    from: z.w\n"
                                         "  - rollout: x.{L}.w\n"
                                         "    from: q.{L}.w\n");
    struct wb_errlist el;
    wb_errlist_init(&el);
    struct wb_match_rules *r = NULL;
    CHECK_INT(wb_match_rules_load(path, &r, &el), -WB_E_CONFIG);
    EXPECT(&el, fmt("%s:7:5: rollout 'x.{L}.w' duplicates the rule at line 3", path));
    wb_errlist_free(&el);
}

static void test_uncaptured_template_var(void)
{
    const char *path = put("rules.yaml", "family: t\n"
                                         "rules:\n"
                                         "  - rollout: layers.{L}.w13\n"
                                         "    from: layers.{L}.experts.{E}.w1\n");
    struct wb_errlist el;
    wb_errlist_init(&el);
    struct wb_match_rules *r = NULL;
    CHECK_INT(wb_match_rules_load(path, &r, &el), -WB_E_CONFIG);
    EXPECT(&el, fmt("%s:3:5: from 'layers.{L}.experts.{E}.w1': {E} is neither captured by "
                    "rollout 'layers.{L}.w13' nor the stack variable",
                    path));
    wb_errlist_free(&el);
}

static void test_duplicate_name_in_inventory_file(void)
{
    const char *path = put("inv.yaml", "a.weight: [bf16, [4, 4]]\n"
                                       "b.weight: [bf16, [4]]\n"
                                       "a.weight: {dtype: fp32, shape: [4, 4]}\n"
                                       "c.weight: [bf17, [4]]\n");
    struct wb_errlist el;
    wb_errlist_init(&el);
    struct wb_inventory inv;
    wb_inv_init(&inv);
    CHECK_INT(wb_inv_load_file(path, &inv, &el), -WB_E_CONFIG);
    CHECK_INT(inv.n, 0);
    EXPECT(&el, fmt("%s:3:1: duplicate tensor name 'a.weight' (first at line 1)", path),
           fmt("%s:4:12: c.weight: unknown dtype 'bf17'", path));
    wb_errlist_free(&el);
}

static void test_bad_template_arithmetic(void)
{
    const char *fam = put("fam.yaml", "family: t\n"
                                      "trainer:\n"
                                      "  - for: {i: n}\n"
                                      "    tensors:\n"
                                      "      a.{i}.w: [rows**2, hidden]\n"
                                      "      b.{i.w: [rows]\n"
                                      "      c.w: [foo(rows), hidden +]\n");
    struct wb_errlist el;
    wb_errlist_init(&el);
    struct wb_inventory inv;
    wb_inv_init(&inv);
    CHECK_INT(wb_inv_generate(fam, tiny_cfg(), "trainer", &inv, &el), -WB_E_CONFIG);
    EXPECT(&el,
           fmt("%s:5:17: shape of 'a.{i}.w': bad expression 'rows**2': unexpected '*' at column 6",
               fam),
           fmt("%s:6:7: bad name template 'b.{i.w': '{' without '}' at column 3", fam),
           fmt("%s:7:13: shape of 'c.w': bad expression 'foo(rows)': unknown function 'foo' at "
               "column 1",
               fam),
           fmt("%s:7:24: shape of 'c.w': bad expression 'hidden +': unexpected end of expression "
               "at column 9",
               fam));
    CHECK_INT(inv.n, 0);
    wb_errlist_free(&el);
}

static void test_template_evaluation_errors(void)
{
    const char *fam = put("fam.yaml", "family: t\n"
                                      "trainer:\n"
                                      "  - for: {i: n}\n"
                                      "    tensors:\n"
                                      "      a.{i}.w: [hidden / (zero * i)]\n"
                                      "      b.{i}.w: [eps]\n"
                                      "      c.{i}.w: [rows - 100]\n"
                                      "  - tensors:\n"
                                      "      d.w: [9223372036854775807 + rows]\n");
    struct wb_errlist el;
    wb_errlist_init(&el);
    struct wb_inventory inv;
    wb_inv_init(&inv);
    CHECK_INT(wb_inv_generate(fam, tiny_cfg(), "trainer", &inv, &el), -WB_E_CONFIG);
    EXPECT(&el, fmt("%s:5:7: 'hidden / (zero * i)': division by zero (with i=0)", fam),
           fmt("%s:6:7: 'eps': field 'eps' is not an integer (1e-06) (with i=0)", fam),
           fmt("%s:7:7: 'rows - 100': dimension 0 of c.0.w is negative (-36) (with i=0)", fam),
           fmt("%s:9:7: '9223372036854775807 + rows': integer overflow", fam));
    wb_errlist_free(&el);
}

static void test_config_missing_field(void)
{
    /* Qwen3-8B's config.json without num_key_value_heads: both k_proj and v_proj name it */
    FILE *f = fopen("configs/hf/Qwen3-8B.json", "r");
    CHECK(f);
    char buf[4096], out[4096];
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = 0;
    char *at = strstr(buf, "  \"num_key_value_heads\": 8,\n");
    CHECK(at);
    snprintf(out, sizeof(out), "%.*s%s", (int)(at - buf), buf,
             at + strlen("  \"num_key_value_heads\": 8,\n"));
    const char *cfg = put("Qwen3-8B-broken.json", out);
    struct wb_errlist el;
    wb_errlist_init(&el);
    struct wb_inventory inv;
    wb_inv_init(&inv);
    CHECK_INT(wb_inv_generate(QWEN3, cfg, "trainer", &inv, &el), -WB_E_CONFIG);
    EXPECT(&el,
           fmt("%s: missing field 'num_key_value_heads' (needed by 'num_key_value_heads*head_dim' "
               "at configs/models/qwen3.yaml:49:7)",
               cfg),
           fmt("%s: missing field 'num_key_value_heads' (needed by 'num_key_value_heads*head_dim' "
               "at configs/models/qwen3.yaml:50:7)",
               cfg));
    CHECK_INT(inv.n, 0);
    wb_errlist_free(&el);
}

static void test_bad_config_json(void)
{
    const char *cfg = put("bad.json", "{\"n\": 2,\n \"n\": 3}\n");
    struct wb_errlist el;
    wb_errlist_init(&el);
    struct wb_inventory inv;
    wb_inv_init(&inv);
    CHECK_INT(wb_inv_generate(QWEN3, cfg, "trainer", &inv, &el), -WB_E_CONFIG);
    EXPECT(&el, fmt("%s:2:4: duplicate object key near '\"n\"'", cfg));
    wb_errlist_free(&el);
}

static void test_generator_unknown_keys(void)
{
    const char *fam = put("fam.yaml", "family: t\n"
                                      "trianer: []\n"
                                      "trainer:\n"
                                      "  - tensor:\n"
                                      "      a.w: [rows]\n");
    struct wb_errlist el;
    wb_errlist_init(&el);
    struct wb_inventory inv;
    wb_inv_init(&inv);
    CHECK_INT(wb_inv_generate(fam, tiny_cfg(), "trainer", &inv, &el), -WB_E_CONFIG);
    EXPECT(&el, fmt("%s:2:1: trianer: unknown key", fam));
    wb_errlist_free(&el);
    /* once the top level is right, the block's own keys are checked */
    fam = put("fam2.yaml", "family: t\n"
                           "trainer:\n"
                           "  - tensor:\n"
                           "      a.w: [rows]\n");
    wb_errlist_init(&el);
    CHECK_INT(wb_inv_generate(fam, tiny_cfg(), "trainer", &inv, &el), -WB_E_CONFIG);
    EXPECT(&el, fmt("%s:3:5: tensor: unknown key", fam),
           fmt("%s:3:5: tensors: required key missing", fam));
    wb_errlist_free(&el);
}

/* A small family whose trainer and rollout come from the same file, for rule-level errors. */
static void tiny_match(const char *yaml, struct wb_errlist *el, int want)
{
    const char *fam = put("tiny.yaml", yaml);
    struct wb_inventory t, r;
    wb_inv_init(&t);
    wb_inv_init(&r);
    struct wb_match_rules *rules;
    wb_errlist_init(el);
    CHECK_INT(wb_inv_generate(fam, tiny_cfg(), "trainer", &t, el), 0);
    CHECK_INT(wb_inv_generate(fam, tiny_cfg(), "rollout", &r, el), 0);
    CHECK_INT(wb_match_rules_load(fam, &rules, el), 0);
    struct wb_match *m = NULL;
    CHECK_INT(wb_match_run(rules, &t, &r, &m, el), want);
    wb_match_free(m);
    wb_match_rules_free(rules);
    wb_inv_free(&t);
    wb_inv_free(&r);
}

static void test_no_rule(void)
{
    struct wb_errlist el;
    tiny_match("family: t\n"
               "trainer:\n"
               "  - tensors: {a.w: [rows]}\n"
               "rollout:\n"
               "  - tensors: {a.w: [rows], b.w: [rows, hidden]}\n"
               "rules:\n"
               "  - rollout: a.w\n"
               "    from: a.w\n",
               &el, -WB_E_MATCH);
    const char *path = fmt("%s/tiny.yaml", wb_test_tmpdir());
    EXPECT(&el, fmt("b.w [64, 256]: no rule in %s builds this rollout tensor", path));
    wb_errlist_free(&el);
}

static void test_trainer_used_twice(void)
{
    struct wb_errlist el;
    tiny_match("family: t\n"
               "trainer:\n"
               "  - tensors: {a.w: [rows]}\n"
               "rollout:\n"
               "  - tensors: {x.w: [rows], y.w: [rows]}\n"
               "rules:\n"
               "  - rollout: \"*\"\n"
               "    from: a.w\n",
               &el, -WB_E_MATCH);
    EXPECT(&el, "a.w: trainer tensor used more than once (by x.w and y.w)");
    wb_errlist_free(&el);
}

static void test_stacked_shape_mismatch(void)
{
    struct wb_errlist el;
    tiny_match("family: t\n"
               "trainer:\n"
               "  - for: {e: n}\n"
               "    tensors:\n"
               "      e.{e}.gate: [rows, hidden]\n"
               "      e.{e}.up: [rows, hidden]\n"
               "rollout:\n"
               "  - tensors: {w13: [n, 3*rows, hidden]}\n"
               "rules:\n"
               "  - rollout: w13\n"
               "    stack: E\n"
               "    from: [\"e.{E}.gate\", \"e.{E}.up\"]\n"
               "    dim: 1\n",
               &el, -WB_E_MATCH);
    const char *path = fmt("%s/tiny.yaml", wb_test_tmpdir());
    EXPECT(&el, fmt("w13: rollout shape [2, 192, 256] != stacked trainer shape [2, 128, 256] "
                    "(2 x (gate 64 + up 64)) (rule %s:10)",
                    path));
    wb_errlist_free(&el);
}

static void test_fp8_misaligned_component(void)
{
    /* k has 64 rows: with 128x128 blocks the component after it would start mid-block */
    struct wb_errlist el;
    tiny_match("family: t\n"
               "quant: {fp8: [\"*\"]}\n"
               "trainer:\n"
               "  - tensors: {q.weight: [2*rows, hidden], k.weight: [rows, hidden], "
               "v.weight: [rows, hidden]}\n"
               "rollout:\n"
               "  - fp8: 1\n"
               "    tensors: {qkv.weight: [4*rows, hidden]}\n"
               "rules:\n"
               "  - rollout: qkv.weight\n"
               "    from: [q.weight, k.weight, v.weight]\n",
               &el, -WB_E_MATCH);
    const char *path = fmt("%s/tiny.yaml", wb_test_tmpdir());
    EXPECT(&el, fmt("qkv.weight: component k [128, 192) along dim 0 is not aligned to "
                    "128-element FP8 blocks; only the last component may end unaligned (rule "
                    "%s:9)",
                    path));
    wb_errlist_free(&el);
}

static void test_head_dim_errors(void)
{
    struct wb_errlist el;
    tiny_match("family: t\n"
               "trainer:\n"
               "  - tensors: {q.weight: [2*rows, hidden], k.weight: [rows, hidden]}\n"
               "rollout:\n"
               "  - tensors: {qk.weight: [3*rows, hidden]}\n"
               "rules:\n"
               "  - rollout: qk.weight\n"
               "    from: [q.weight, k.weight]\n"
               "    shard: {tp: 0, head_dim: 48}\n",
               &el, -WB_E_MATCH);
    const char *path = fmt("%s/tiny.yaml", wb_test_tmpdir());
    EXPECT(&el, fmt("qk.weight: component q has 128 elements along dim 0, not a whole number of "
                    "48-element heads (rule %s:7)",
                    path));
    wb_errlist_free(&el);
    tiny_match("family: t\n"
               "trainer:\n"
               "  - tensors: {q.weight: [2*rows, hidden]}\n"
               "rollout:\n"
               "  - tensors: {q.weight: [2*rows, hidden]}\n"
               "rules:\n"
               "  - rollout: q.weight\n"
               "    from: q.weight\n"
               "    shard: {tp: 0, head_dim: hidden_size / heads}\n",
               &el, -WB_E_MATCH);
    EXPECT(&el, fmt("q.weight: shard head_dim 'hidden_size / heads': missing field "
                    "'hidden_size' (rule %s:7)",
                    path));
    wb_errlist_free(&el);
}

static void test_permute_errors(void)
{
    const char *path = put("perm.yaml", "family: t\n"
                                        "rules:\n"
                                        "  - rollout: a.w\n"
                                        "    from: a.w\n"
                                        "    permute: [0, 0, 1]\n"
                                        "  - rollout: b.w\n"
                                        "    from: [b1.w, b2.w]\n"
                                        "    permute: [1, 0]\n"
                                        "  - rollout: c.w\n"
                                        "    from: c.w\n"
                                        "    permute: 1\n");
    struct wb_errlist el;
    wb_errlist_init(&el);
    struct wb_match_rules *r = NULL;
    CHECK_INT(wb_match_rules_load(path, &r, &el), -WB_E_CONFIG);
    EXPECT(&el,
           fmt("%s:5:14: permute: expected a permutation of 0..n-1 (2 <= n <= 6), such as "
               "[0, 2, 1]",
               path),
           fmt("%s:8:14: permute: only for a rule with a single `from` (no fuse or stack)", path),
           fmt("%s:11:14: permute: expected a permutation of 0..n-1 (2 <= n <= 6), such as "
               "[0, 2, 1]",
               path));
    wb_errlist_free(&el);
    /* shapes that do not agree once permuted, and a permutation of the wrong length */
    tiny_match("family: t\n"
               "trainer:\n"
               "  - tensors: {a.w: [n, rows, hidden], b.w: [n, rows, hidden]}\n"
               "rollout:\n"
               "  - tensors: {a.w: [n, rows, hidden], b.w: [n, hidden, rows]}\n"
               "rules:\n"
               "  - rollout: a.w\n"
               "    from: a.w\n"
               "    permute: [0, 2, 1]\n"
               "  - rollout: b.w\n"
               "    from: b.w\n"
               "    permute: [1, 0]\n",
               &el, -WB_E_MATCH);
    const char *fam = fmt("%s/tiny.yaml", wb_test_tmpdir());
    EXPECT(&el,
           fmt("a.w: rollout shape [2, 64, 256] != trainer shape [2, 64, 256] permuted [0, 2, 1] = "
               "[2, 256, 64] (a.w) (rule %s:7)",
               fam),
           fmt("b.w: permute [1, 0] has 2 dims, trainer tensor b.w [2, 64, 256] has 3 (rule %s:10)",
               fam));
    wb_errlist_free(&el);
}

/* ---------------------------------------------------------------- quantization configs */

/* Qwen3-8B-FP8's config.json with its quantization_config replaced by `q` (JSON text). */
static const char *fp8_config_with(const char *name, const char *q)
{
    FILE *f = fopen("configs/hf/Qwen3-8B-FP8.json", "r");
    CHECK(f);
    char buf[4096], out[4096];
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = 0;
    char *a = strstr(buf, "\"quantization_config\": {"), *z = a ? strstr(a, "},\n") : NULL;
    CHECK(a && z);
    snprintf(out, sizeof(out), "%.*s\"quantization_config\": %s%s", (int)(a - buf), buf, q, z + 1);
    return put(name, out);
}

/* Generating the rollout from `q` fails with exactly the messages given. */
static void quant_refused(const char *q, size_t n, const char *const *want, int line)
{
    const char *cfg = fp8_config_with("q.json", q);
    struct wb_errlist el;
    wb_errlist_init(&el);
    struct wb_inventory inv;
    wb_inv_init(&inv);
    CHECK_INT(wb_inv_generate(QWEN3, cfg, "rollout", &inv, &el), -WB_E_CONFIG);
    CHECK_INT(inv.n, 0);
    char w[8][512];
    const char *wp[8];
    for (size_t i = 0; i < n && i < 8; i++) {
        /* "{cfg}" in a wanted message stands for the config's path */
        const char *at = strstr(want[i], "{cfg}");
        if (at)
            snprintf(w[i], sizeof(w[i]), "%s: %.*s%s%s", cfg, (int)(at - want[i]), want[i], cfg,
                     at + 5);
        else
            snprintf(w[i], sizeof(w[i]), "%s: %s", cfg, want[i]);
        wp[i] = w[i];
    }
    expect(&el, n, wp, line);
    wb_errlist_free(&el);
}
#define QUANT_REFUSED(q, ...)                                                                      \
    do {                                                                                           \
        const char *const want_[] = {__VA_ARGS__};                                                 \
        quant_refused((q), WB_ARRAY_LEN(want_), want_, __LINE__);                                  \
    } while (0)

static void test_quantization_config_refused(void)
{
    /* each of these used to be taken as FP8 128x128 blocks, exit 0, wrong rollout */
    QUANT_REFUSED("{\"quant_method\": \"awq\", \"bits\": 4, \"group_size\": 128}",
                  "quantization_config.quant_method: awq: not produced by weightbridge (only fp8 "
                  "with 128x128 blocks)"
                  "; for a BF16 rollout give a config.json without quantization_config, this one "
                  "for the trainer side only (wb-match --config BF16.json --trainer-config {cfg})");
    QUANT_REFUSED("{\"quant_method\": \"compressed-tensors\", \"config_groups\": {\"group_0\": "
                  "{\"weights\": {\"num_bits\": 8}}}}",
                  "quantization_config.quant_method: compressed-tensors: not produced by "
                  "weightbridge (only fp8 with 128x128 blocks)"
                  "; for a BF16 rollout give a config.json without quantization_config, this one "
                  "for the trainer side only (wb-match --config BF16.json --trainer-config {cfg})");
    QUANT_REFUSED("{\"quant_method\": \"mxfp4\"}",
                  "quantization_config.quant_method: mxfp4: not produced by weightbridge (only fp8 "
                  "with 128x128 blocks)"
                  "; for a BF16 rollout give a config.json without quantization_config, this one "
                  "for the trainer side only (wb-match --config BF16.json --trainer-config {cfg})");
    QUANT_REFUSED("{\"activation_scheme\": \"dynamic\", \"fmt\": \"e4m3\", \"quant_method\": "
                  "\"fp8\", \"weight_block_size\": [64, 64]}",
                  "quantization_config.weight_block_size: [64, 64]: only 128x128 FP8 blocks are "
                  "produced (quant/)");
    QUANT_REFUSED("{\"quant_method\": \"fp8\", \"weight_block_size\": [128]}",
                  "quantization_config.weight_block_size: [128]: only 128x128 FP8 blocks are "
                  "produced (quant/)");
    QUANT_REFUSED("{\"quant_method\": \"fp8\", \"activation_scheme\": \"dynamic\"}",
                  "quantization_config.weight_block_size: missing: only 128x128 FP8 blocks are "
                  "produced (quant/), not per-tensor scales");
    QUANT_REFUSED("{\"quant_method\": \"fp8\", \"weight_block_size\": [128, 128], \"fmt\": "
                  "\"e5m2\", \"activation_scheme\": \"static\"}",
                  "quantization_config.fmt: e5m2: only e4m3 values are produced (quant/)",
                  "quantization_config.activation_scheme: static: only dynamic activation scales "
                  "(no input_scale tensors are produced)");
    QUANT_REFUSED("{\"quant_method\": \"fp8\", \"weight_block_size\": [128, 128], "
                  "\"modules_to_not_convert\": [\"lm_head\"], \"ignored_layers\": [\"x\"]}",
                  "quantization_config.ignored_layers: not supported (the family file says which "
                  "tensors are FP8)",
                  "quantization_config.modules_to_not_convert: not supported (the family file says "
                  "which tensors are FP8)");
    QUANT_REFUSED("\"fp8\"", "quantization_config: fp8: expected an object");
    QUANT_REFUSED("{\"weight_block_size\": [128, 128]}",
                  "quantization_config.quant_method: missing");
    /* null means no quantization: a BF16 rollout, as without the key */
    const char *cfg = fp8_config_with("null.json", "null");
    struct wb_errlist el;
    wb_errlist_init(&el);
    struct wb_inventory inv;
    wb_inv_init(&inv);
    CHECK_INT(wb_inv_generate(QWEN3, cfg, "rollout", &inv, &el), 0);
    CHECK_INT(inv.n, 3 + 36 * 8);
    wb_inv_free(&inv);
    wb_errlist_free(&el);
}

static void test_quantization_config_trainer_side(void)
{
    /* a BF16 trainer generated from a config whose rollout would be MXFP4 is fine (no FP8 block
     * reads it); a trainer block that makes FP8 tensors from a 64x64 config is not */
    const char *mx = fp8_config_with("mx.json", "{\"quant_method\": \"mxfp4\"}");
    struct wb_errlist el;
    wb_errlist_init(&el);
    struct wb_inventory inv;
    wb_inv_init(&inv);
    CHECK_INT(wb_inv_generate(QWEN3, mx, "trainer", &inv, &el), 0);
    CHECK_INT(inv.n, 3 + 36 * 11);
    const char *fam = put("ckpt.yaml", "family: ckpt\n"
                                       "quant: {fp8: [\"*\"]}\n"
                                       "trainer:\n"
                                       "  - fp8: defined(quantization_config)\n"
                                       "    tensors: {a.weight: [256, hidden_size]}\n");
    const char *cfg =
        fp8_config_with("b64.json", "{\"quant_method\": \"fp8\", \"weight_block_size\": [64, 64]}");
    CHECK_INT(wb_inv_generate(fam, cfg, "trainer", &inv, &el), -WB_E_CONFIG);
    EXPECT(&el, fmt("%s: quantization_config.weight_block_size: [64, 64]: only 128x128 FP8 blocks "
                    "are produced (quant/)",
                    cfg));
    wb_inv_free(&inv);
    wb_errlist_free(&el);
}

static void test_family_block_size(void)
{
    /* the block edge has one home (common.h's WB_FP8_BLOCK); a family asking for another one
     * is refused with the place and key */
    const char *fam = put("b64.yaml", "family: t\n"
                                      "quant:\n"
                                      "  block: 64\n"
                                      "  fp8: [\"*\"]\n"
                                      "rules:\n"
                                      "  - rollout: a.w\n"
                                      "    from: a.w\n");
    struct wb_errlist el;
    wb_errlist_init(&el);
    struct wb_match_rules *r = NULL;
    CHECK_INT(wb_match_rules_load(fam, &r, &el), -WB_E_CONFIG);
    EXPECT(&el,
           fmt("%s:3:10: quant.block: 64: only 128x128 FP8 blocks are produced (quant/)", fam));
    wb_errlist_free(&el);
    struct wb_inventory inv;
    wb_inv_init(&inv);
    wb_errlist_init(&el);
    CHECK_INT(wb_inv_generate(fam, tiny_cfg(), "trainer", &inv, &el), -WB_E_CONFIG);
    EXPECT(&el,
           fmt("%s:3:10: quant.block: 64: only 128x128 FP8 blocks are produced (quant/)", fam));
    wb_errlist_free(&el);
    /* 128 written out is the same as leaving it out */
    fam = put("b128.yaml",
              "family: t\nquant: {block: 128}\nrules:\n  - rollout: a.w\n    from: a.w\n");
    wb_errlist_init(&el);
    CHECK_INT(wb_match_rules_load(fam, &r, &el), 0);
    wb_match_rules_free(r);
    wb_errlist_free(&el);
}

const struct wb_test wb_tests[] = {
    {"missing_trainer_tensor", test_missing_trainer_tensor, 0},
    {"missing_fused_component", test_missing_fused_component, 0},
    {"missing_experts", test_missing_experts, 0},
    {"extra_trainer_tensor", test_extra_trainer_tensor, 0},
    {"extra_rollout_tensor", test_extra_rollout_tensor, 0},
    {"fused_component_shape", test_fused_component_shape, 0},
    {"fused_components_disagree", test_fused_components_disagree, 0},
    {"rename_shape", test_rename_shape, 0},
    {"wrong_scale_shape", test_wrong_scale_shape, 0},
    {"fp8_without_scale", test_fp8_without_scale, 0},
    {"fp8_not_allowed", test_fp8_not_allowed, 0},
    {"unsupported_conversion", test_unsupported_conversion, 0},
    {"orphan_scale", test_orphan_scale, 0},
    {"all_reported_together", test_all_reported_together, 0},
    {"unknown_rule_key", test_unknown_rule_key, 0},
    {"duplicate_rule", test_duplicate_rule, 0},
    {"uncaptured_template_var", test_uncaptured_template_var, 0},
    {"duplicate_name_in_inventory_file", test_duplicate_name_in_inventory_file, 0},
    {"bad_template_arithmetic", test_bad_template_arithmetic, 0},
    {"template_evaluation_errors", test_template_evaluation_errors, 0},
    {"config_missing_field", test_config_missing_field, 0},
    {"bad_config_json", test_bad_config_json, 0},
    {"generator_unknown_keys", test_generator_unknown_keys, 0},
    {"no_rule", test_no_rule, 0},
    {"trainer_used_twice", test_trainer_used_twice, 0},
    {"stacked_shape_mismatch", test_stacked_shape_mismatch, 0},
    {"fp8_misaligned_component", test_fp8_misaligned_component, 0},
    {"head_dim_errors", test_head_dim_errors, 0},
    {"permute_errors", test_permute_errors, 0},
    {"quantization_config_refused", test_quantization_config_refused, 0},
    {"quantization_config_trainer_side", test_quantization_config_trainer_side, 0},
    {"family_block_size", test_family_block_size, 0},
    {0},
};
