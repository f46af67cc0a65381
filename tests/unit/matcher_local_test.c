/* matcher_local_test.c — wb_mapping_local: what one rollout rank holds of a mapping's tensor.
 * TP per component inside fused qkv (with GQA replication when kv heads < tp), EP over stacked
 * experts, TP inside experts without EP, row-parallel dims, replication, and the exact errors
 * for splits that cannot be done (non-divisible, GQA not replicable, FP8 blocks cut). */
#include "matcher/matcher.h"
#include "tests/wbtest.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct fam {
    struct wb_inventory t, r;
    struct wb_match_rules *rules;
    struct wb_match *m;
};

static void load(const char *family, const char *cfg, struct fam *f)
{
    struct wb_errlist el;
    wb_errlist_init(&el);
    wb_inv_init(&f->t);
    wb_inv_init(&f->r);
    CHECK_INT(wb_inv_generate(family, cfg, "trainer", &f->t, &el), 0);
    CHECK_INT(wb_inv_generate(family, cfg, "rollout", &f->r, &el), 0);
    CHECK_INT(wb_match_rules_load(family, &f->rules, &el), 0);
    CHECK_INT(wb_match_rules_bind_config(f->rules, cfg, &el), 0);
    CHECK_INT(wb_match_run(f->rules, &f->t, &f->r, &f->m, &el), 0);
    wb_errlist_free(&el);
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

struct local {
    struct wb_shape shape;
    struct wb_local_piece p[WB_MAX_PIECES];
    uint32_t n;
};

static void local_ok(const struct fam *f, const char *name, uint32_t tpr, uint32_t tp, uint32_t epr,
                     uint32_t ep, struct local *l)
{
    struct wb_errlist el;
    wb_errlist_init(&el);
    int r = wb_mapping_local(f->m, &f->r, find_map(f, name), tpr, tp, epr, ep, &l->shape, l->p,
                             &l->n, &el);
    for (size_t i = 0; i < el.n; i++)
        fprintf(stderr, "  error: %s\n", el.msgs[i]);
    CHECK_INT(r, 0);
    wb_errlist_free(&el);
}

static void local_err(const struct fam *f, const char *name, uint32_t tpr, uint32_t tp,
                      uint32_t epr, uint32_t ep, const char *want)
{
    struct wb_errlist el;
    wb_errlist_init(&el);
    struct local l;
    l.n = 99;
    int r = wb_mapping_local(f->m, &f->r, find_map(f, name), tpr, tp, epr, ep, &l.shape, l.p, &l.n,
                             &el);
    CHECK_INT(r, -WB_E_PLAN);
    CHECK_INT(l.n, 99); /* out-params untouched */
    CHECK_INT(el.n, 1);
    CHECK_STR(el.msgs[0], want);
    wb_errlist_free(&el);
}

static void check_dims(const struct wb_shape *s, uint32_t ndim, const uint64_t *d)
{
    CHECK_INT(s->ndim, ndim);
    for (uint32_t i = 0; i < ndim; i++)
        CHECK_U64(s->dim[i], d[i]);
}

/* piece i: global offset/extent along dim `dim`, local offset; other dims must be whole */
static void check_piece(const struct local *l, uint32_t i, const struct wb_shape *global,
                        uint32_t dim, uint64_t goff, uint64_t ext, uint64_t loff)
{
    const struct wb_local_piece *p = &l->p[i];
    CHECK_INT(p->global.ndim, global->ndim);
    CHECK_INT(p->local.ndim, global->ndim);
    for (uint32_t d = 0; d < global->ndim; d++) {
        if (d == dim) {
            CHECK_U64(p->global.off[d], goff);
            CHECK_U64(p->global.ext[d], ext);
            CHECK_U64(p->local.off[d], loff);
            CHECK_U64(p->local.ext[d], ext);
        } else {
            CHECK_U64(p->global.off[d], 0);
            CHECK_U64(p->global.ext[d], global->dim[d]);
            CHECK_U64(p->local.off[d], 0);
            CHECK_U64(p->local.ext[d], l->shape.dim[d]);
        }
    }
}

static const struct wb_shape *rshape(const struct fam *f, const char *name)
{
    return &f->r.p[wb_inv_find(&f->r, name)].shape;
}

/* ---------------------------------------------------------------- TP */

static void test_tp_qkv_heads_split(void)
{
    struct fam f;
    load("configs/models/qwen3.yaml", "configs/hf/Qwen3-8B.json", &f);
    const char *qkv = "model.layers.0.self_attn.qkv_proj.weight";
    struct local l;
    local_ok(&f, qkv, 1, 2, 0, 1, &l);
    check_dims(&l.shape, 2, (uint64_t[]){3072, 4096});
    CHECK_INT(l.n, 3);
    check_piece(&l, 0, rshape(&f, qkv), 0, 2048, 2048, 0);         /* q heads 16..31 */
    check_piece(&l, 1, rshape(&f, qkv), 0, 4096 + 512, 512, 2048); /* k heads 4..7 */
    check_piece(&l, 2, rshape(&f, qkv), 0, 5120 + 512, 512, 2560); /* v heads 4..7 */
    fam_free(&f);
}

static void test_tp_qkv_gqa_replication(void)
{
    /* Qwen3-30B-A3B: 4 kv heads over 8 ranks: rank r holds kv head r*4/8 (vLLM) */
    struct fam f;
    load("configs/models/qwen3_moe.yaml", "configs/hf/Qwen3-30B-A3B.json", &f);
    const char *qkv = "model.layers.7.self_attn.qkv_proj.weight";
    for (uint32_t r = 0; r < 8; r++) {
        struct local l;
        local_ok(&f, qkv, r, 8, 0, 1, &l);
        check_dims(&l.shape, 2, (uint64_t[]){512 + 128 + 128, 2048});
        CHECK_INT(l.n, 3);
        uint64_t kv = r * 4 / 8;
        check_piece(&l, 0, rshape(&f, qkv), 0, r * 512, 512, 0);
        check_piece(&l, 1, rshape(&f, qkv), 0, 4096 + kv * 128, 128, 512);
        check_piece(&l, 2, rshape(&f, qkv), 0, 4096 + 512 + kv * 128, 128, 640);
    }
    fam_free(&f);
}

static void test_tp_row_parallel_and_replicated(void)
{
    struct fam f;
    load("configs/models/qwen3.yaml", "configs/hf/Qwen3-8B.json", &f);
    struct local l;
    local_ok(&f, "model.layers.3.self_attn.o_proj.weight", 2, 4, 0, 1, &l);
    check_dims(&l.shape, 2, (uint64_t[]){4096, 1024});
    CHECK_INT(l.n, 1);
    check_piece(&l, 0, rshape(&f, "model.layers.3.self_attn.o_proj.weight"), 1, 2048, 1024, 0);
    local_ok(&f, "model.layers.3.mlp.gate_up_proj.weight", 3, 4, 0, 1, &l);
    check_dims(&l.shape, 2, (uint64_t[]){6144, 4096});
    CHECK_INT(l.n, 2); /* gate part and up part */
    check_piece(&l, 0, rshape(&f, "model.layers.3.mlp.gate_up_proj.weight"), 0, 3 * 3072, 3072, 0);
    check_piece(&l, 1, rshape(&f, "model.layers.3.mlp.gate_up_proj.weight"), 0, 12288 + 3 * 3072,
                3072, 3072);
    local_ok(&f, "model.norm.weight", 5, 8, 0, 1, &l);
    check_dims(&l.shape, 1, (uint64_t[]){4096});
    CHECK_INT(l.n, 1);
    check_piece(&l, 0, rshape(&f, "model.norm.weight"), 0, 0, 4096, 0);
    fam_free(&f);
}

/* ---------------------------------------------------------------- EP */

static void test_ep_stacked_experts(void)
{
    struct fam f;
    load("configs/models/qwen3_moe.yaml", "configs/hf/Qwen3-30B-A3B.json", &f);
    const char *w13 = "model.layers.2.mlp.experts.w13_weight";
    struct local l;
    local_ok(&f, w13, 3, 8, 3, 8, &l);
    check_dims(&l.shape, 3, (uint64_t[]){16, 1536, 2048});
    CHECK_INT(l.n, 1);
    check_piece(&l, 0, rshape(&f, w13), 0, 48, 16, 0);
    /* without EP: TP inside every expert, per component (gate, up) along dim 1 */
    local_ok(&f, w13, 1, 2, 0, 1, &l);
    check_dims(&l.shape, 3, (uint64_t[]){128, 768, 2048});
    CHECK_INT(l.n, 2);
    check_piece(&l, 0, rshape(&f, w13), 1, 384, 384, 0);
    check_piece(&l, 1, rshape(&f, w13), 1, 768 + 384, 384, 384);
    const char *w2 = "model.layers.2.mlp.experts.w2_weight";
    local_ok(&f, w2, 3, 4, 0, 1, &l);
    check_dims(&l.shape, 3, (uint64_t[]){128, 2048, 192});
    check_piece(&l, 0, rshape(&f, w2), 2, 576, 192, 0);
    local_err(&f, w13, 0, 1, 0, 3,
              "model.layers.2.mlp.experts.w13_weight: ep 3 does not divide the 128 experts along "
              "dim 0 (rule configs/models/qwen3_moe.yaml:193)");
    fam_free(&f);
}

/* ---------------------------------------------------------------- errors */

static void test_non_divisible_split(void)
{
    struct fam f;
    load("configs/models/qwen3.yaml", "configs/hf/Qwen3-8B.json", &f);
    local_err(&f, "model.layers.0.self_attn.qkv_proj.weight", 0, 3, 0, 1,
              "model.layers.0.self_attn.qkv_proj.weight: tp 3 does not divide the 32 heads of "
              "component [0, 4096) along dim 0 (rule configs/models/qwen3.yaml:110)");
    local_err(&f, "model.embed_tokens.weight", 2, 3, 0, 1,
              "model.embed_tokens.weight: tp 3 does not divide the 151936 rows along dim 0 "
              "padded to a multiple of 64 (151936 real) (rule configs/models/qwen3.yaml:133)");
    struct wb_errlist el;
    wb_errlist_init(&el);
    struct local l;
    CHECK_INT(wb_mapping_local(f.m, &f.r, find_map(&f, "model.norm.weight"), 4, 4, 0, 1, &l.shape,
                               l.p, &l.n, &el),
              -EINVAL);
    CHECK_STR(el.msgs[0], "model.norm.weight: bad rank: tp rank 4 of 4, ep rank 0 of 1");
    wb_errlist_free(&el);
    fam_free(&f);
}

static void test_gqa_not_replicable(void)
{
    /* 12 query heads and 3 kv heads over 4 ranks: q splits, kv cannot be replicated evenly */
    const char *cfg = wb_test_write_file("gqa.json", "{\"hidden\": 768}");
    char cfg_path[512];
    snprintf(cfg_path, sizeof(cfg_path), "%s", cfg);
    const char *fam = wb_test_write_file(
        "gqa.yaml", "family: gqa\n"
                    "trainer:\n"
                    "  - tensors: {q.weight: [768, hidden], k.weight: [192, hidden], "
                    "v.weight: [192, hidden]}\n"
                    "rollout:\n"
                    "  - tensors: {qkv.weight: [1152, hidden]}\n"
                    "rules:\n"
                    "  - rollout: qkv.weight\n"
                    "    from: [q.weight, k.weight, v.weight]\n"
                    "    shard: {tp: 0, head_dim: 64}\n");
    char fam_path[512];
    snprintf(fam_path, sizeof(fam_path), "%s", fam);
    struct fam f;
    load(fam_path, cfg_path, &f);
    char want[1024];
    snprintf(want, sizeof(want),
             "qkv.weight: the 3 heads of component [768, 960) along dim 0 cannot be replicated "
             "evenly over tp 4 (rule %s:7)",
             fam_path);
    local_err(&f, "qkv.weight", 1, 4, 0, 1, want);
    struct local l;
    local_ok(&f, "qkv.weight", 2, 6, 0, 1, &l); /* 6 ranks: q 2 heads, kv head 2*3/6 = 1 */
    check_dims(&l.shape, 2, (uint64_t[]){128 + 64 + 64, 768});
    check_piece(&l, 1, rshape(&f, "qkv.weight"), 0, 768 + 64, 64, 128);
    fam_free(&f);
}

static void test_fp8_blocks_cut(void)
{
    /* Qwen3-30B-A3B with FP8: tp 8 inside the experts would give 96-row pieces of a
     * 128x128-block tensor (vLLM refuses this too); with EP the experts stay whole */
    FILE *fp = fopen("configs/hf/Qwen3-30B-A3B.json", "r");
    CHECK(fp);
    char buf[4096], out[4096];
    size_t n = fread(buf, 1, sizeof(buf) - 1, fp);
    fclose(fp);
    buf[n] = 0;
    char *at = strstr(buf, "\"rms_norm_eps\"");
    CHECK(at);
    snprintf(out, sizeof(out),
             "%.*s\"quantization_config\": {\"activation_scheme\": \"dynamic\", \"fmt\": "
             "\"e4m3\", \"quant_method\": \"fp8\", \"weight_block_size\": [128, 128]},\n  %s",
             (int)(at - buf), buf, at);
    char cfg[512];
    snprintf(cfg, sizeof(cfg), "%s", wb_test_write_file("fp8.json", out));
    struct fam f;
    load("configs/models/qwen3_moe.yaml", cfg, &f);
    const char *w13 = "model.layers.0.mlp.experts.w13_weight";
    local_err(&f, w13, 0, 8, 0, 1,
              "model.layers.0.mlp.experts.w13_weight: tp 8 cuts component [0, 768) along dim 1 "
              "into 96-element pieces, not whole 128-element FP8 blocks (rule "
              "configs/models/qwen3_moe.yaml:193)");
    struct local l;
    local_ok(&f, w13, 0, 8, 5, 8, &l);
    check_dims(&l.shape, 3, (uint64_t[]){16, 1536, 2048});
    local_ok(&f, w13, 1, 2, 0, 1, &l); /* 384 rows per part: whole blocks */
    check_piece(&l, 1, rshape(&f, w13), 1, 768 + 384, 384, 384);
    /* the scale tensor's box for a piece */
    struct wb_box sb;
    CHECK_INT(wb_scale_box(&l.p[1].global, 128, &sb), 0);
    CHECK_INT(sb.ndim, 3);
    CHECK_U64(sb.off[0], 0);
    CHECK_U64(sb.ext[0], 128);
    CHECK_U64(sb.off[1], 9);
    CHECK_U64(sb.ext[1], 3);
    CHECK_U64(sb.off[2], 0);
    CHECK_U64(sb.ext[2], 16);
    /* qkv with tp 8: q 512 rows, kv replicated heads of 128 rows: all whole blocks */
    local_ok(&f, "model.layers.0.self_attn.qkv_proj.weight", 7, 8, 0, 1, &l);
    check_dims(&l.shape, 2, (uint64_t[]){768, 2048});
    fam_free(&f);
}

/* ---------------------------------------------------------------- vocab padding */

/* A config.json derived from a shipped one by replacing one text. */
static const char *derived_config(const char *from, const char *name, const char *old,
                                  const char *new)
{
    FILE *fp = fopen(from, "r");
    CHECK(fp);
    static char buf[1 << 16], out[1 << 16], path[512];
    size_t n = fread(buf, 1, sizeof(buf) - 1, fp);
    fclose(fp);
    buf[n] = 0;
    char *at = strstr(buf, old);
    CHECK(at);
    snprintf(out, sizeof(out), "%.*s%s%s", (int)(at - buf), buf, new, at + strlen(old));
    snprintf(path, sizeof(path), "%s", wb_test_write_file(name, out));
    return path;
}

/* Rank r of tp holds rows [lo, hi) of the real vocab in a local tensor of `per` rows; both the
 * embedding and the LM head (vLLM's VocabParallelEmbedding / ParallelLMHead). */
static void check_vocab_rank(const struct fam *f, const char *name, uint32_t r, uint32_t tp,
                             uint64_t per, uint64_t lo, uint64_t hi)
{
    struct local l;
    local_ok(f, name, r, tp, 0, 1, &l);
    const struct wb_shape *g = rshape(f, name);
    check_dims(&l.shape, 2, (uint64_t[]){per, g->dim[1]});
    if (hi == lo) {
        CHECK_INT(l.n, 0); /* only padding: nothing written */
        return;
    }
    CHECK_INT(l.n, 1);
    const struct wb_local_piece *p = &l.p[0];
    CHECK_U64(p->global.off[0], lo);
    CHECK_U64(p->global.ext[0], hi - lo);
    CHECK_U64(p->global.off[1], 0);
    CHECK_U64(p->global.ext[1], g->dim[1]);
    CHECK_U64(p->local.off[0], 0); /* real rows first, padding after */
    CHECK_U64(p->local.ext[0], hi - lo);
    CHECK_U64(p->local.ext[1], g->dim[1]);
}

static void test_vocab_padding_151672_tp8(void)
{
    /* 151,672 rows pad to 151,680 (a multiple of 64); 8 ranks of 18,960: rank 0 holds 0:18960
     * (not 0:18959, the unpadded split), rank 7 holds 132720:151672 and 8 padding rows */
    const char *cfg = derived_config("configs/hf/Qwen3-8B.json", "v151672.json",
                                     "\"vocab_size\": 151936", "\"vocab_size\": 151672");
    struct fam f;
    load("configs/models/qwen3.yaml", cfg, &f);
    /* the rollout inventory keeps the real vocab: padding is only in the local tensors */
    check_dims(rshape(&f, "model.embed_tokens.weight"), 2, (uint64_t[]){151672, 4096});
    for (int k = 0; k < 2; k++) {
        const char *name = k ? "lm_head.weight" : "model.embed_tokens.weight";
        for (uint32_t r = 0; r < 7; r++)
            check_vocab_rank(&f, name, r, 8, 18960, r * 18960ull, (r + 1) * 18960ull);
        check_vocab_rank(&f, name, 7, 8, 18960, 132720, 151672);
        /* tp 1 holds the padded 151,680 rows too */
        check_vocab_rank(&f, name, 0, 1, 151680, 0, 151672);
    }
    fam_free(&f);
}

static void test_vocab_padding_32001_tp2(void)
{
    /* Llama-2 style vocab of 32,001 (32,000 + a pad token): refused before, vLLM serves it:
     * padded to 32,064, 16,032 rows per rank, rank 1 holds 16032:32001 and 63 padding rows */
    const char *cfg = derived_config("configs/hf/Llama-3.1-8B.json", "v32001.json",
                                     "\"vocab_size\": 128256", "\"vocab_size\": 32001");
    struct fam f;
    load("configs/models/llama3.yaml", cfg, &f);
    for (int k = 0; k < 2; k++) {
        const char *name = k ? "lm_head.weight" : "model.embed_tokens.weight";
        check_vocab_rank(&f, name, 0, 2, 16032, 0, 16032);
        check_vocab_rank(&f, name, 1, 2, 16032, 16032, 32001);
    }
    /* tp 3 splits the padded 32,064 rows (10,688 each), not the 32,001 real ones (10,667) */
    check_vocab_rank(&f, "lm_head.weight", 0, 3, 10688, 0, 10688);
    check_vocab_rank(&f, "lm_head.weight", 1, 3, 10688, 10688, 21376);
    check_vocab_rank(&f, "lm_head.weight", 2, 3, 10688, 21376, 32001);
    /* tp 5 does not divide 32,064: vLLM refuses it too (divide() in VocabParallelEmbedding) */
    local_err(&f, "lm_head.weight", 0, 5, 0, 1,
              "lm_head.weight: tp 5 does not divide the 32064 rows along dim 0 padded to a "
              "multiple of 64 (32001 real) (rule configs/models/llama3.yaml:131)");
    fam_free(&f);
}

static void test_vocab_padding_rank_of_padding(void)
{
    /* 130 rows pad to 192; tp 4 gives 48 rows per rank: rank 2 holds 96:130 (34 real rows),
     * rank 3 holds only padding and gets no piece at all */
    const char *cfg = derived_config("configs/hf/Qwen3-8B.json", "v130.json",
                                     "\"vocab_size\": 151936", "\"vocab_size\": 130");
    struct fam f;
    load("configs/models/qwen3.yaml", cfg, &f);
    check_vocab_rank(&f, "model.embed_tokens.weight", 0, 4, 48, 0, 48);
    check_vocab_rank(&f, "model.embed_tokens.weight", 1, 4, 48, 48, 96);
    check_vocab_rank(&f, "model.embed_tokens.weight", 2, 4, 48, 96, 130);
    check_vocab_rank(&f, "model.embed_tokens.weight", 3, 4, 48, 0, 0);
    fam_free(&f);
}

/* ---------------------------------------------------------------- gpt-oss */

/* vLLM's GptOssModel._load_weights_other at TP 1, 2, 4 (gpt-oss-20b in BF16): qkv split per
 * head (64 q, 8 kv heads of 64), sinks by heads, w13 and its bias as one block along 2I, w2
 * along I after the transpose, w2_bias whole on rank 0 and nothing written elsewhere, the
 * vocab (201,088 = 64 x 3,142) split evenly. */
static void test_gpt_oss_tp(void)
{
    const char *cfg = derived_config("configs/hf/gpt-oss-20b.json", "gpt-oss-bf16.json",
                                     "\"quant_method\": \"mxfp4\"", "\"quant_method\": \"none\"");
    /* no quantization_config at all: drop the object (whose method was replaced above) */
    FILE *fp = fopen(cfg, "r");
    CHECK(fp);
    char buf[8192], out[8192];
    size_t n = fread(buf, 1, sizeof(buf) - 1, fp);
    fclose(fp);
    buf[n] = 0;
    char *a = strstr(buf, "  \"quantization_config\": {"), *z = a ? strstr(a, "  },\n") : NULL;
    CHECK(a && z);
    snprintf(out, sizeof(out), "%.*s%s", (int)(a - buf), buf, z + 5);
    char path[512];
    snprintf(path, sizeof(path), "%s", wb_test_write_file("gpt-oss-bf16.json", out));
    struct fam f;
    load("configs/models/gpt_oss.yaml", path, &f);
    const char *qkv = "model.layers.3.attn.qkv_proj.weight",
               *qkvb = "model.layers.3.attn.qkv_proj.bias";
    const char *w13 = "model.layers.3.mlp.experts.w13_weight",
               *w13b = "model.layers.3.mlp.experts.w13_bias";
    const char *w2 = "model.layers.3.mlp.experts.w2_weight",
               *w2b = "model.layers.3.mlp.experts.w2_bias";
    const char *sinks = "model.layers.3.attn.sinks", *emb = "model.embedding.weight";
    uint32_t tps[] = {1, 2, 4};
    for (int i = 0; i < 3; i++) {
        uint32_t tp = tps[i];
        for (uint32_t r = 0; r < tp; r++) {
            struct local l;
            uint64_t q = 4096 / tp, kv = 512 / tp;
            local_ok(&f, qkv, r, tp, 0, 1, &l);
            check_dims(&l.shape, 2, (uint64_t[]){q + 2 * kv, 2880});
            local_ok(&f, qkvb, r, tp, 0, 1, &l);
            check_dims(&l.shape, 1, (uint64_t[]){q + 2 * kv});
            if (tp == 1) { /* the whole tensor, one piece */
                CHECK_INT(l.n, 1);
                check_piece(&l, 0, rshape(&f, qkvb), 0, 0, 5120, 0);
            } else {
                CHECK_INT(l.n, 3);
                check_piece(&l, 0, rshape(&f, qkvb), 0, r * q, q, 0);
                check_piece(&l, 1, rshape(&f, qkvb), 0, 4096 + r * kv, kv, q);
                check_piece(&l, 2, rshape(&f, qkvb), 0, 4608 + r * kv, kv, q + kv);
                local_ok(&f, qkv, r, tp, 0, 1, &l);
                check_piece(&l, 2, rshape(&f, qkv), 0, 4608 + r * kv, kv, q + kv);
            }
            local_ok(&f, sinks, r, tp, 0, 1, &l);
            check_dims(&l.shape, 1, (uint64_t[]){64 / tp});
            check_piece(&l, 0, rshape(&f, sinks), 0, r * 64 / tp, 64 / tp, 0);
            local_ok(&f, w13, r, tp, 0, 1, &l);
            check_dims(&l.shape, 3, (uint64_t[]){32, 5760 / tp, 2880});
            CHECK_INT(l.n, 1); /* one block: gate and up are interleaved, not two parts */
            check_piece(&l, 0, rshape(&f, w13), 1, r * 5760 / tp, 5760 / tp, 0);
            local_ok(&f, w13b, r, tp, 0, 1, &l);
            check_dims(&l.shape, 2, (uint64_t[]){32, 5760 / tp});
            check_piece(&l, 0, rshape(&f, w13b), 1, r * 5760 / tp, 5760 / tp, 0);
            local_ok(&f, w2, r, tp, 0, 1, &l);
            check_dims(&l.shape, 3, (uint64_t[]){32, 2880, 2880 / tp});
            check_piece(&l, 0, rshape(&f, w2), 2, r * 2880 / tp, 2880 / tp, 0);
            local_ok(&f, w2b, r, tp, 0, 1, &l);
            check_dims(&l.shape, 2, (uint64_t[]){32, 2880});
            CHECK_INT(l.n, r == 0 ? 1 : 0);
            if (r == 0)
                check_piece(&l, 0, rshape(&f, w2b), 0, 0, 32, 0);
            local_ok(&f, emb, r, tp, 0, 1, &l);
            check_dims(&l.shape, 2, (uint64_t[]){201088 / tp, 2880});
            check_piece(&l, 0, rshape(&f, emb), 0, r * 201088 / tp, 201088 / tp, 0);
        }
    }
    /* EP 4: whole experts, the biases too */
    struct local l;
    local_ok(&f, w13, 0, 4, 2, 4, &l);
    check_dims(&l.shape, 3, (uint64_t[]){8, 5760, 2880});
    check_piece(&l, 0, rshape(&f, w13), 0, 16, 8, 0);
    local_ok(&f, w2b, 0, 4, 3, 4, &l);
    check_dims(&l.shape, 2, (uint64_t[]){8, 2880});
    check_piece(&l, 0, rshape(&f, w2b), 0, 24, 8, 0);
    fam_free(&f);
}

static void test_scale_box(void)
{
    /* fused_qkv_a_proj of DeepSeek-V3: kv_a part [1536, 2112) ends unaligned, which is fine */
    struct wb_box v = {2, {1536, 0}, {576, 7168}}, s;
    CHECK_INT(wb_scale_box(&v, 128, &s), 0);
    CHECK_U64(s.off[0], 12);
    CHECK_U64(s.ext[0], 5);
    CHECK_U64(s.off[1], 0);
    CHECK_U64(s.ext[1], 56);
    struct wb_box bad = {2, {64, 0}, {64, 128}};
    CHECK_INT(wb_scale_box(&bad, 128, &s), -EINVAL);
    struct wb_box one = {1, {0}, {128}};
    CHECK_INT(wb_scale_box(&one, 128, &s), -EINVAL);
}

const struct wb_test wb_tests[] = {
    {"tp_qkv_heads_split", test_tp_qkv_heads_split, 0},
    {"tp_qkv_gqa_replication", test_tp_qkv_gqa_replication, 0},
    {"tp_row_parallel_and_replicated", test_tp_row_parallel_and_replicated, 0},
    {"ep_stacked_experts", test_ep_stacked_experts, 0},
    {"non_divisible_split", test_non_divisible_split, 0},
    {"gqa_not_replicable", test_gqa_not_replicable, 0},
    {"fp8_blocks_cut", test_fp8_blocks_cut, 0},
    {"vocab_padding_151672_tp8", test_vocab_padding_151672_tp8, 0},
    {"vocab_padding_32001_tp2", test_vocab_padding_32001_tp2, 0},
    {"vocab_padding_rank_of_padding", test_vocab_padding_rank_of_padding, 0},
    {"gpt_oss_tp", test_gpt_oss_tp, 0},
    {"scale_box", test_scale_box, 0},
    {0},
};
