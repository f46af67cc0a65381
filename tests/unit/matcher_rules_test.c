/* matcher_rules_test.c — the rules themselves: split rules for trainer tensors fused already
 * (syntax, sizes, what each TP rank gets, what shapes cannot see), rules that build nothing
 * (a typo falls through to the catch-all) unless optional, rules an earlier rule or
 * ignore.rollout shadows whole, the pattern inclusion behind that, the shipped phi3 family
 * against the Hugging Face checkpoint and vLLM's layout, and every shipped family with every
 * shipped config.json matching clean; grouped splits (Megatron's linear_qkv, linear_fc1 per TP
 * rank), dropped components, splits with stack and trainer namings. Exact messages throughout. */
#include "matcher/matcher.h"
#include "matcher/mpriv.h"
#include "tests/unit/matcher_expect.h"
#include "tests/wbtest.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A tiny family with Phi-3's shape of problem: qkv fused on both sides, heads of 4 elements,
 * 4 query heads and 2 key/value heads; RULES is the rules section. */
static const char TINY_CONFIG[] = "{\"n\": 2, \"h\": 4, \"kv\": 2, \"hid\": 8}";

static const char *tiny_family(const char *rules)
{
    static char text[4096];
    snprintf(text, sizeof(text),
             "family: t\n"
             "vars: {hd: 4}\n"
             "trainer:\n"
             "  - for: {layer: n}\n"
             "    tensors:\n"
             "      m.{layer}.qkv.weight: [(h + 2*kv)*hd, hid]\n"
             "      m.{layer}.norm.weight: [hid]\n"
             "rollout:\n"
             "  - for: {layer: n}\n"
             "    tensors:\n"
             "      m.{layer}.qkv.weight: [(h + 2*kv)*hd, hid]\n"
             "      m.{layer}.norm.weight: [hid]\n"
             "rules:\n"
             "%s",
             rules);
    return put("tiny.yaml", text);
}

struct tiny {
    struct wb_inventory t, r;
    struct wb_match_rules *rules;
    struct wb_match *m;
    struct wb_errlist el;
    const char *path;
};

/* Loads the tiny family with `rules` and matches; returns wb_match_run's result (the rules
 * must load). */
static int tiny_match(struct tiny *x, const char *rules)
{
    memset(x, 0, sizeof(*x));
    wb_errlist_init(&x->el);
    wb_inv_init(&x->t);
    wb_inv_init(&x->r);
    x->path = tiny_family(rules);
    const char *cfg = put("tiny.json", TINY_CONFIG);
    CHECK_INT(wb_match_rules_load(x->path, &x->rules, &x->el), 0);
    CHECK_INT(wb_match_rules_bind_config(x->rules, cfg, &x->el), 0);
    CHECK_INT(wb_match_rules_generate(x->rules, cfg, "trainer", &x->t, &x->el), 0);
    CHECK_INT(wb_match_rules_generate(x->rules, cfg, "rollout", &x->r, &x->el), 0);
    return wb_match_run(x->rules, &x->t, &x->r, &x->m, &x->el);
}

static void tiny_free(struct tiny *x)
{
    wb_match_free(x->m);
    wb_match_rules_free(x->rules);
    wb_inv_free(&x->t);
    wb_inv_free(&x->r);
    wb_errlist_free(&x->el);
}

static const struct wb_mapping *mapping_of(const struct wb_match *m, const struct wb_inventory *r,
                                           const char *name)
{
    for (size_t i = 0; i < m->n; i++)
        if (strcmp(r->p[m->map[i].rollout].name, name) == 0)
            return &m->map[i];
    wb_test_fail(__FILE__, __LINE__, "no mapping builds %s", name);
}

/* The global boxes rank `rank` of `tp` holds of the mapping, as text: "[0:8, 0:8] [16:20, 0:8]" */
static const char *pieces_str(const struct wb_match *m, const struct wb_inventory *r,
                              const struct wb_mapping *mp, uint32_t rank, uint32_t tp)
{
    static char out[512];
    struct wb_shape ls;
    struct wb_local_piece pc[WB_MAX_PIECES];
    uint32_t np;
    struct wb_errlist el;
    wb_errlist_init(&el);
    CHECK_INT(wb_mapping_local(m, r, mp, rank, tp, 0, 1, &ls, pc, &np, &el), 0);
    size_t pos = 0;
    char b[128];
    pos += (size_t)snprintf(out + pos, sizeof(out) - pos, "%s:", wb_shape_str(&ls, b, sizeof(b)));
    for (uint32_t k = 0; k < np; k++)
        pos += (size_t)snprintf(out + pos, sizeof(out) - pos, " %s",
                                wb_box_str(&pc[k].global, b, sizeof(b)));
    wb_errlist_free(&el);
    return out;
}

/* ---------------------------------------------------------------- split rules */

static const char SPLIT_QKV[] = "  - rollout: m.{L}.qkv.weight\n"
                                "    from: m.{L}.qkv.weight\n"
                                "    split: [q: h*hd, k: kv*hd, v: kv*hd]\n"
                                "    shard: {tp: 0, head_dim: hd}\n"
                                "  - rollout: \"*\"\n"
                                "    from: \"*\"\n";

/* Each TP rank gets its share of every component, as vLLM's QKVParallelLinear loads a tensor
 * fused on disk: rows q 0:16, k 16:24, v 24:32; 2 kv heads over 4 ranks are replicated. */
static void test_split_ranks(void)
{
    struct tiny x;
    CHECK_INT(tiny_match(&x, SPLIT_QKV), 0);
    const struct wb_mapping *mp = mapping_of(x.m, &x.r, "m.1.qkv.weight");
    CHECK_INT(mp->kind, WB_MAP_SPLIT);
    CHECK_INT(mp->ncomp, 3);
    for (uint32_t k = 0; k < 3; k++)
        CHECK_INT(mp->comp[k].trainer, wb_inv_find(&x.t, "m.1.qkv.weight"));
    CHECK_INT(mp->comp[0].heads, 4);
    CHECK_INT(mp->comp[1].heads, 2);
    CHECK_INT(mp->comp[2].heads, 2);
    CHECK_STR(pieces_str(x.m, &x.r, mp, 0, 1), "[32, 8]: [0:32, 0:8]"); /* TP 1: all of it */
    CHECK_STR(pieces_str(x.m, &x.r, mp, 0, 2), "[16, 8]: [0:8, 0:8] [16:20, 0:8] [24:28, 0:8]");
    CHECK_STR(pieces_str(x.m, &x.r, mp, 1, 2), "[16, 8]: [8:16, 0:8] [20:24, 0:8] [28:32, 0:8]");
    CHECK_STR(pieces_str(x.m, &x.r, mp, 0, 4), "[12, 8]: [0:4, 0:8] [16:20, 0:8] [24:28, 0:8]");
    CHECK_STR(pieces_str(x.m, &x.r, mp, 1, 4), "[12, 8]: [4:8, 0:8] [16:20, 0:8] [24:28, 0:8]");
    CHECK_STR(pieces_str(x.m, &x.r, mp, 3, 4), "[12, 8]: [12:16, 0:8] [20:24, 0:8] [28:32, 0:8]");
    tiny_free(&x);
    /* without the split the same tensor is one component: rank 1 of 2 would get rows 16:32,
     * all of k and v and none of q */
    CHECK_INT(tiny_match(&x, "  - rollout: m.{L}.qkv.weight\n"
                             "    from: m.{L}.qkv.weight\n"
                             "    shard: {tp: 0}\n"
                             "  - rollout: \"*\"\n"
                             "    from: \"*\"\n"),
              0);
    mp = mapping_of(x.m, &x.r, "m.1.qkv.weight");
    CHECK_INT(mp->kind, WB_MAP_RENAME);
    CHECK_STR(pieces_str(x.m, &x.r, mp, 1, 2), "[16, 8]: [16:32, 0:8]");
    tiny_free(&x);
}

/* Sizes that do not add up, cannot be evaluated, are not positive, or cut heads: each an
 * exact error naming the tensor, the components and the rule. */
static void test_split_sizes_checked(void)
{
    struct tiny x;
    /* k written with the query heads: 16 + 16 + 8 = 40 rows of a 32-row tensor */
    CHECK_INT(tiny_match(&x, "  - rollout: m.{L}.qkv.weight\n"
                             "    from: m.{L}.qkv.weight\n"
                             "    split: [q: h*hd, k: h*hd, v: kv*hd]\n"
                             "    shard: {tp: 0, head_dim: hd}\n"
                             "  - rollout: \"*\"\n"
                             "    from: \"*\"\n"),
              -WB_E_MATCH);
    EXPECT(&x.el,
           fmt("m.0.qkv.weight: split q 16 + k 16 + v 8 = 40, but trainer tensor m.0.qkv.weight "
               "[32, 8] has 32 along dim 0 (rule %s:14)",
               x.path),
           fmt("m.1.qkv.weight: split q 16 + k 16 + v 8 = 40, but trainer tensor m.1.qkv.weight "
               "[32, 8] has 32 along dim 0 (rule %s:14)",
               x.path));
    tiny_free(&x);
    /* a size far beyond the tensor: no sum is formed (it could pass 2^64) */
    CHECK_INT(tiny_match(&x, "  - rollout: m.{L}.qkv.weight\n"
                             "    from: m.{L}.qkv.weight\n"
                             "    split: [q: 9223372036854775807, k: 9223372036854775807, v: 2]\n"
                             "  - rollout: \"*\"\n"
                             "    from: \"*\"\n"),
              -WB_E_MATCH);
    CHECK_INT(x.el.n, 2);
    CHECK_STR(x.el.msgs[0], fmt("m.0.qkv.weight: split q 9223372036854775807 + k "
                                "9223372036854775807 + v 2 = more, but trainer tensor "
                                "m.0.qkv.weight [32, 8] has 32 along dim 0 (rule %s:14)",
                                x.path));
    tiny_free(&x);
    CHECK_INT(tiny_match(&x, "  - rollout: m.{L}.qkv.weight\n"
                             "    from: m.{L}.qkv.weight\n"
                             "    split: [q: h*hd, k: nope*hd, v: 0]\n"
                             "  - rollout: \"*\"\n"
                             "    from: \"*\"\n"),
              -WB_E_MATCH);
    EXPECT(&x.el,
           fmt("m.0.qkv.weight: split k: 'nope*hd': missing field 'nope' (rule %s:14)", x.path),
           fmt("m.1.qkv.weight: split k: 'nope*hd': missing field 'nope' (rule %s:14)", x.path));
    tiny_free(&x);
    CHECK_INT(tiny_match(&x, "  - rollout: m.{L}.qkv.weight\n"
                             "    from: m.{L}.qkv.weight\n"
                             "    split: [q: h*hd + kv*hd, v: 0 - kv*hd + kv*hd]\n"
                             "  - rollout: \"*\"\n"
                             "    from: \"*\"\n"),
              -WB_E_MATCH);
    CHECK_STR(x.el.msgs[0], fmt("m.0.qkv.weight: split v: '0 - kv*hd + kv*hd': not positive (0) "
                                "(rule %s:14)",
                                x.path));
    tiny_free(&x);
    CHECK_INT(tiny_match(&x, "  - rollout: m.{L}.qkv.weight\n"
                             "    from: m.{L}.qkv.weight\n"
                             "    split: [q: 16, k: 16]\n"
                             "    dim: 2\n"
                             "  - rollout: \"*\"\n"
                             "    from: \"*\"\n"),
              -WB_E_MATCH);
    CHECK_STR(x.el.msgs[0], fmt("m.0.qkv.weight: split along dim 2, but trainer tensor "
                                "m.0.qkv.weight [32, 8] has 2 dims (rule %s:14)",
                                x.path));
    tiny_free(&x);
    /* sizes that add up but cut a head: q 15 rows of 4-row heads */
    CHECK_INT(tiny_match(&x, "  - rollout: m.{L}.qkv.weight\n"
                             "    from: m.{L}.qkv.weight\n"
                             "    split: [q: 15, k: 9, v: 8]\n"
                             "    shard: {tp: 0, head_dim: hd}\n"
                             "  - rollout: \"*\"\n"
                             "    from: \"*\"\n"),
              -WB_E_MATCH);
    EXPECT(&x.el,
           fmt("m.0.qkv.weight: component q has 15 elements along dim 0, not a whole number of "
               "4-element heads (rule %s:14)",
               x.path),
           fmt("m.1.qkv.weight: component q has 15 elements along dim 0, not a whole number of "
               "4-element heads (rule %s:14)",
               x.path));
    tiny_free(&x);
}

/* What shapes cannot see: q and k sizes swapped (k gets the 4 query heads' rows) add up, cut no
 * head and give every rank a tensor of the right shape — only its rows are wrong. The match
 * accepts it; configs/models/README.md says so (a forward pass over the rollout tensors is what
 * catches it). With as many kv heads as query heads (Phi-3-mini) the order of equal sizes does
 * not even change the split. */
static void test_split_swapped_sizes_keep_shapes(void)
{
    struct tiny x;
    CHECK_INT(tiny_match(&x, "  - rollout: m.{L}.qkv.weight\n"
                             "    from: m.{L}.qkv.weight\n"
                             "    split: [q: kv*hd, k: h*hd, v: kv*hd]\n"
                             "    shard: {tp: 0, head_dim: hd}\n"
                             "  - rollout: \"*\"\n"
                             "    from: \"*\"\n"),
              0);
    CHECK_INT(x.el.n, 0);
    const struct wb_mapping *mp = mapping_of(x.m, &x.r, "m.0.qkv.weight");
    /* the right split's rank 1 of 2: [16, 8]: [8:16] [20:24] [28:32] */
    CHECK_STR(pieces_str(x.m, &x.r, mp, 1, 2), "[16, 8]: [4:8, 0:8] [16:24, 0:8] [28:32, 0:8]");
    tiny_free(&x);
}

/* ---------------------------------------------------------------- grouped, dropping, stacked */

/* Megatron's linear_qkv: per query group [q of the group; k; v] along dim 0. The tiny model's
 * 4 query heads in 2 groups of 2, heads of 4 rows: trainer rows g0 [q 0:8, k 8:12, v 12:16],
 * g1 [q 16:24, k 24:28, v 28:32]; the rollout [q0 q1; k0 k1; v0 v1] = q 0:16, k 16:24, v
 * 24:32, and its TP split sees one q, one k, one v (the pieces of group 1 join group 0's). */
static void test_split_groups(void)
{
    struct tiny x;
    CHECK_INT(tiny_match(&x, "  - rollout: m.{L}.qkv.weight\n"
                             "    from: m.{L}.qkv.weight\n"
                             "    groups: kv\n"
                             "    split: [q: h/kv*hd, k: hd, v: hd]\n"
                             "    shard: {tp: 0, head_dim: hd}\n"
                             "  - rollout: \"*\"\n"
                             "    from: \"*\"\n"),
              0);
    const struct wb_mapping *mp = mapping_of(x.m, &x.r, "m.0.qkv.weight");
    CHECK_INT(mp->kind, WB_MAP_SPLIT);
    CHECK_INT(mp->ncomp, 6);
    static const uint64_t src[6] = {0, 16, 8, 24, 12, 28}, dst[6] = {0, 8, 16, 20, 24, 28};
    static const uint64_t ext[6] = {8, 8, 4, 4, 4, 4};
    for (uint32_t k = 0; k < 6; k++) {
        CHECK_INT(mp->comp[k].src.off[0], src[k]);
        CHECK_INT(mp->comp[k].dst.off[0], dst[k]);
        CHECK_INT(mp->comp[k].src.ext[0], ext[k]);
        CHECK_INT(mp->comp[k].joins_prev, k % 2);
        CHECK_INT(mp->comp[k].heads, k < 2 ? 2 : 1);
    }
    /* exactly the split rule's pieces at every TP (test_split_ranks): q's 4 heads, k's and v's 2 */
    CHECK_STR(pieces_str(x.m, &x.r, mp, 0, 2), "[16, 8]: [0:8, 0:8] [16:20, 0:8] [24:28, 0:8]");
    CHECK_STR(pieces_str(x.m, &x.r, mp, 1, 2), "[16, 8]: [8:16, 0:8] [20:24, 0:8] [28:32, 0:8]");
    CHECK_STR(pieces_str(x.m, &x.r, mp, 3, 4), "[12, 8]: [12:16, 0:8] [20:24, 0:8] [28:32, 0:8]");
    tiny_free(&x);
    /* sizes x groups must be the tensor's rows */
    CHECK_INT(tiny_match(&x, "  - rollout: m.{L}.qkv.weight\n"
                             "    from: m.{L}.qkv.weight\n"
                             "    groups: h\n"
                             "    split: [q: h/kv*hd, k: hd, v: hd]\n"
                             "  - rollout: \"*\"\n"
                             "    from: \"*\"\n"),
              -WB_E_MATCH);
    EXPECT(&x.el,
           fmt("m.0.qkv.weight: split q 8 + k 4 + v 4 = 16, x 4 groups = 64, but trainer tensor "
               "m.0.qkv.weight [32, 8] has 32 along dim 0 (rule %s:14)",
               x.path),
           fmt("m.1.qkv.weight: split q 8 + k 4 + v 4 = 16, x 4 groups = 64, but trainer tensor "
               "m.1.qkv.weight [32, 8] has 32 along dim 0 (rule %s:14)",
               x.path));
    tiny_free(&x);
    CHECK_INT(tiny_match(&x, "  - rollout: m.{L}.qkv.weight\n"
                             "    from: m.{L}.qkv.weight\n"
                             "    groups: kv - 2\n"
                             "    split: [q: h/kv*hd, k: hd, v: hd]\n"
                             "  - rollout: \"*\"\n"
                             "    from: \"*\"\n"),
              -WB_E_MATCH);
    EXPECT(&x.el,
           fmt("m.0.qkv.weight: split groups 'kv - 2': not positive (0) (rule %s:14)", x.path),
           fmt("m.1.qkv.weight: split groups 'kv - 2': not positive (0) (rule %s:14)", x.path));
    tiny_free(&x);
}

/* A component named `_` is cut off: the rollout is the trainer less it, its elements count as
 * used; size 0 is allowed for it (Megatron's vocab padding when the vocab divides already). */
static void test_split_drop(void)
{
    static const char fam[] = "family: t\n"
                              "vars: {pad: 3}\n"
                              "trainer:\n"
                              "  - tensors:\n"
                              "      emb: [10 + pad, 4]\n"
                              "rollout:\n"
                              "  - tensors:\n"
                              "      emb: [10, 4]\n"
                              "rules:\n"
                              "  - rollout: emb\n"
                              "    from: emb\n"
                              "    split: [rows: 10, _: pad]\n"
                              "    shard: {tp: 0, pad: 4}\n";
    const char *path = put("drop.yaml", fam), *cfg = put("drop.json", "{}");
    for (int pad = 0; pad <= 3; pad += 3) {
        struct wb_errlist el;
        wb_errlist_init(&el);
        struct wb_match_rules *r = NULL;
        struct wb_inventory t, ro;
        wb_inv_init(&t);
        wb_inv_init(&ro);
        struct wb_match *m = NULL;
        CHECK_INT(wb_match_rules_load(path, &r, &el), 0);
        CHECK_INT(wb_match_rules_set_vars(r, pad ? "" : "pad=0", &el), 0);
        CHECK_INT(wb_match_rules_generate(r, cfg, "trainer", &t, &el), 0);
        CHECK_INT(wb_match_rules_generate(r, cfg, "rollout", &ro, &el), 0);
        CHECK_INT(t.p[0].shape.dim[0], 10 + (uint64_t)pad);
        CHECK_INT(wb_match_run(r, &t, &ro, &m, &el), 0);
        CHECK_INT(el.n, 0);
        CHECK_INT(m->n, 1);
        CHECK_INT(m->map[0].ncomp, 1);
        CHECK_INT(m->map[0].comp[0].src.off[0], 0);
        CHECK_INT(m->map[0].comp[0].src.ext[0], 10);
        CHECK_STR(pieces_str(m, &ro, &m->map[0], 1, 2), "[6, 4]: [6:10, 0:4]");
        wb_match_free(m);
        /* a rollout that is not the trainer less the dropped rows */
        struct wb_shape s = {.ndim = 2, .dim = {11, 4}};
        ro.p[0].shape = s;
        CHECK_INT(wb_match_run(r, &t, &ro, &m, &el), -WB_E_MATCH);
        if (pad)
            EXPECT(&el,
                   fmt("emb: rollout shape [11, 4] != trainer shape [13, 4] less the dropped `_` "
                       "components = [10, 4] (emb) (rule %s:10)",
                       path));
        else
            EXPECT(&el,
                   fmt("emb: rollout shape [11, 4] != trainer shape [10, 4] (emb) (rule %s:10)",
                       path));
        wb_inv_free(&t);
        wb_inv_free(&ro);
        wb_match_rules_free(r);
        wb_errlist_free(&el);
    }
}

/* Per-expert tensors fused already ([gate; up] per trainer TP rank: groups 2), stacked into a
 * FusedMoE w13 [E, 2I, H]: expert e's gate_r rows go to w13[e, r*I/2 ...], up_r to
 * w13[e, I + r*I/2 ...]; the rollout's TP split along dim 1 gives each rank its share of gate
 * and of up, whole. And a 3-D fused tensor [E, 2I, H] split along dim 1 (transformers 5). */
static void test_split_stack(void)
{
    static const char fam[] = "family: t\n"
                              "namings: [local, fused]\n"
                              "trainer:\n"
                              "  - naming: local\n"
                              "    for: {e: 2}\n"
                              "    tensors:\n"
                              "      x.{e}.fc1: [16, 4]\n"
                              "  - naming: fused\n"
                              "    tensors:\n"
                              "      x.gate_up: [2, 16, 4]\n"
                              "rollout:\n"
                              "  - tensors:\n"
                              "      w13: [2, 16, 4]\n"
                              "rules:\n"
                              "  - rollout: w13\n"
                              "    naming: local\n"
                              "    stack: E\n"
                              "    from: x.{E}.fc1\n"
                              "    groups: 2\n"
                              "    split: [gate: 4, up: 4]\n"
                              "    dim: 1\n"
                              "    shard: {ep: 0, tp: 1}\n"
                              "  - rollout: w13\n"
                              "    naming: fused\n"
                              "    from: x.gate_up\n"
                              "    split: [gate: 8, up: 8]\n"
                              "    dim: 1\n"
                              "    shard: {ep: 0, tp: 1}\n";
    const char *path = put("stack.yaml", fam), *cfg = put("stack.json", "{}");
    for (int fused = 0; fused < 2; fused++) {
        struct wb_errlist el;
        wb_errlist_init(&el);
        struct wb_match_rules *r = NULL;
        struct wb_inventory t, ro;
        wb_inv_init(&t);
        wb_inv_init(&ro);
        struct wb_match *m = NULL;
        CHECK_INT(wb_match_rules_load(path, &r, &el), 0);
        CHECK_INT(wb_match_rules_set_naming(r, fused ? "fused" : "local", &el), 0);
        CHECK_STR(wb_match_rules_naming(r), fused ? "fused" : "local");
        CHECK_INT(wb_match_rules_generate(r, cfg, "trainer", &t, &el), 0);
        CHECK_INT(wb_match_rules_generate(r, cfg, "rollout", &ro, &el), 0);
        CHECK_INT(t.n, fused ? 1 : 2);
        CHECK_INT(wb_match_run(r, &t, &ro, &m, &el), 0);
        const struct wb_mapping *mp = &m->map[0];
        CHECK_INT(mp->kind, fused ? WB_MAP_SPLIT : WB_MAP_STACK);
        char b[128];
        if (fused) {
            CHECK_INT(mp->ncomp, 2);
            CHECK_STR(wb_box_str(&mp->comp[1].src, b, sizeof(b)), "[0:2, 8:16, 0:4]");
            CHECK_STR(wb_box_str(&mp->comp[1].dst, b, sizeof(b)), "[0:2, 8:16, 0:4]");
        } else {
            CHECK_INT(mp->ncomp, 8); /* 2 experts x (gate, up) x 2 groups */
            /* expert 1's up of trainer rank 1: rows 12:16 of x.1.fc1, w13[1, 12:16] */
            CHECK_INT(mp->comp[7].trainer, wb_inv_find(&t, "x.1.fc1"));
            CHECK_STR(wb_box_str(&mp->comp[7].src, b, sizeof(b)), "[12:16, 0:4]");
            CHECK_STR(wb_box_str(&mp->comp[7].dst, b, sizeof(b)), "[1:2, 12:16, 0:4]");
            /* expert 1's gate of trainer rank 1 (rows 8:12) and up of rank 0 (rows 4:8) */
            CHECK_STR(wb_box_str(&mp->comp[5].src, b, sizeof(b)), "[8:12, 0:4]");
            CHECK_STR(wb_box_str(&mp->comp[5].dst, b, sizeof(b)), "[1:2, 4:8, 0:4]");
            CHECK_STR(wb_box_str(&mp->comp[6].src, b, sizeof(b)), "[4:8, 0:4]");
            CHECK_STR(wb_box_str(&mp->comp[6].dst, b, sizeof(b)), "[1:2, 8:12, 0:4]");
        }
        /* TP 2 without EP: rank 1 holds gate 4:8 and up 12:16 of every expert */
        CHECK_STR(pieces_str(m, &ro, mp, 1, 2), "[2, 8, 4]: [0:2, 4:8, 0:4] [0:2, 12:16, 0:4]");
        wb_match_free(m);
        wb_inv_free(&t);
        wb_inv_free(&ro);
        wb_match_rules_free(r);
        wb_errlist_free(&el);
    }
}

/* FP8 rollouts: every piece of a grouped split must lie on 128-element block edges of the
 * rollout tensor; pieces of 64 rows are refused, naming the piece. */
static void test_split_groups_fp8(void)
{
    static const char fam[] = "family: t\n"
                              "quant: {fp8: [qkv]}\n"
                              "trainer:\n"
                              "  - tensors:\n"
                              "      qkv: [4*hd, 256]\n"
                              "rollout:\n"
                              "  - fp8: 1\n"
                              "    tensors:\n"
                              "      qkv: [4*hd, 256]\n"
                              "rules:\n"
                              "  - rollout: qkv\n"
                              "    from: qkv\n"
                              "    groups: 2\n"
                              "    split: [q: hd, k: hd/2, v: hd/2]\n";
    const char *path = put("g8.yaml", fam);
    for (int hd = 256; hd >= 128; hd -= 128) {
        struct wb_errlist el;
        wb_errlist_init(&el);
        struct wb_match_rules *r = NULL;
        struct wb_inventory t, ro;
        wb_inv_init(&t);
        wb_inv_init(&ro);
        struct wb_match *m = NULL;
        const char *cfg = put("g8.json", fmt("{\"hd\": %d}", hd));
        CHECK_INT(wb_match_rules_load(path, &r, &el), 0);
        CHECK_INT(wb_match_rules_generate(r, cfg, "trainer", &t, &el), 0);
        CHECK_INT(wb_match_rules_generate(r, cfg, "rollout", &ro, &el), 0);
        CHECK_INT(wb_match_rules_bind_config(r, cfg, &el), 0);
        int e = wb_match_run(r, &t, &ro, &m, &el);
        if (hd == 256) { /* q 256 a group, k and v 128: every piece whole blocks */
            CHECK_INT(e, 0);
            CHECK_INT(m->map[0].xform, WB_XFORM_FP8_BLOCK);
        } else {
            CHECK_INT(e, -WB_E_MATCH);
            EXPECT(&el, fmt("qkv: component k of group 0 [256, 320) along dim 0 is not aligned to "
                            "128-element FP8 blocks; only the last component may end unaligned "
                            "(rule %s:11)",
                            path));
        }
        wb_match_free(m);
        wb_inv_free(&t);
        wb_inv_free(&ro);
        wb_match_rules_free(r);
        wb_errlist_free(&el);
    }
}

/* namings: the trainer blocks and rules of one naming apply; rules of different namings may
 * build the same rollout name; a naming the file lacks is an error naming its namings. */
static void test_namings(void)
{
    static const char fam[] = "family: t\n"
                              "namings: [a, b]\n"
                              "trainer:\n"
                              "  - naming: a\n"
                              "    tensors: {w.a: [4]}\n"
                              "  - naming: [b]\n"
                              "    tensors: {w.b: [4]}\n"
                              "  - tensors: {n: [2]}\n"
                              "rollout:\n"
                              "  - tensors: {w: [4], n: [2]}\n"
                              "rules:\n"
                              "  - rollout: w\n"
                              "    naming: a\n"
                              "    from: w.a\n"
                              "  - rollout: w\n"
                              "    naming: b\n"
                              "    from: w.b\n"
                              "  - rollout: \"*\"\n"
                              "    from: \"*\"\n";
    const char *path = put("nam.yaml", fam), *cfg = put("nam.json", "{}");
    struct wb_errlist el;
    wb_errlist_init(&el);
    struct wb_match_rules *r = NULL;
    CHECK_INT(wb_match_rules_load(path, &r, &el), 0);
    const char *const *names;
    CHECK_INT(wb_match_rules_namings(r, &names), 2);
    CHECK_STR(names[1], "b");
    CHECK_STR(wb_match_rules_naming(r), "a"); /* the first, by default */
    for (int k = 0; k < 2; k++) {
        struct wb_inventory t, ro;
        wb_inv_init(&t);
        wb_inv_init(&ro);
        struct wb_match *m = NULL;
        CHECK_INT(wb_match_rules_set_naming(r, k ? "b" : NULL, &el), 0);
        CHECK_INT(wb_match_rules_generate(r, cfg, "trainer", &t, &el), 0);
        CHECK_INT(wb_match_rules_generate(r, cfg, "rollout", &ro, &el), 0);
        CHECK_INT(t.n, 2);
        CHECK_STR(t.p[0].name, k ? "w.b" : "w.a");
        CHECK_INT(wb_match_run(r, &t, &ro, &m, &el), 0);
        CHECK_INT(el.n, 0);
        CHECK_INT(m->map[0].comp[0].trainer, 0);
        CHECK_INT(m->map[0].rule_line, k ? 15 : 12);
        wb_match_free(m);
        wb_inv_free(&t);
        wb_inv_free(&ro);
    }
    CHECK_INT(wb_match_rules_set_naming(r, "c", &el), -WB_E_CONFIG);
    EXPECT(&el, fmt("naming 'c': not one of %s's namings (a, b)", path));
    wb_errlist_free(&el);
    wb_match_rules_free(r);
    /* wb_inv_generate_named: the same trainer inventory */
    struct wb_inventory t;
    wb_inv_init(&t);
    CHECK_INT(wb_inv_generate_named(path, cfg, NULL, "b", "trainer", &t, &el), 0);
    CHECK_STR(t.p[0].name, "w.b");
    CHECK_INT(wb_inv_generate_named(path, cfg, NULL, "hf", "trainer", &t, &el), -WB_E_CONFIG);
    EXPECT(&el, fmt("naming 'hf': not one of %s's namings (a, b)", path));
    wb_errlist_free(&el);
    wb_inv_free(&t);
    /* a block's unknown naming, a rollout block's naming, namings listed twice */
    static const struct {
        const char *from, *to, *want;
    } bad[] = {
        {"  - naming: [b]\n", "  - naming: [b, x]\n",
         "%s:6:17: naming: 'x' is not one of the file's namings (a, b)"},
        {"  - tensors: {w: [4], n: [2]}\n", "  - naming: a\n    tensors: {w: [4], n: [2]}\n",
         "%s:10:13: naming: only trainer blocks have a naming (the rollout side is the same for "
         "every naming)"},
    };
    for (size_t i = 0; i < WB_ARRAY_LEN(bad); i++) {
        char text[2048];
        const char *at = strstr(fam, bad[i].from);
        snprintf(text, sizeof(text), "%.*s%s%s", (int)(at - fam), fam, bad[i].to,
                 at + strlen(bad[i].from));
        const char *p = put("nam_bad.yaml", text);
        struct wb_inventory x;
        wb_inv_init(&x);
        const char *side = i == 0 ? "trainer" : "rollout";
        CHECK_INT(wb_inv_generate_named(p, cfg, NULL, NULL, side, &x, &el), -WB_E_CONFIG);
        EXPECT(&el, fmt(bad[i].want, p));
        wb_errlist_free(&el);
        wb_inv_free(&x);
    }
    const char *p = put("nam_twice.yaml", "family: t\nnamings: [a, a]\nrules: []\n");
    CHECK_INT(wb_match_rules_load(p, &r, &el), -WB_E_CONFIG);
    EXPECT(&el, fmt("%s:2:14: namings: 'a' listed twice", p));
    wb_errlist_free(&el);
    /* rules of one naming still shadow each other */
    char text[2048];
    snprintf(text, sizeof(text), "%s  - rollout: w\n    naming: [b, a]\n    from: w.b\n", fam);
    p = put("nam_dup.yaml", text);
    CHECK_INT(wb_match_rules_load(p, &r, &el), -WB_E_CONFIG);
    EXPECT(&el, fmt("%s:20:5: rollout 'w' duplicates the rule at line 12", p));
    wb_errlist_free(&el);
}

/* The syntax: a list of `name: size` pairs, in order, on a rule with one `from`. */
static void test_split_syntax(void)
{
    static const struct {
        const char *rule, *want;
    } cases[] = {
        {"    split: {q: 16, k: 16}\n",
         "%s:16:12: split: expected a list of 2 to 16 `name: size` components in order, such as "
         "[q: num_attention_heads*head_dim, k: num_key_value_heads*head_dim, v: "
         "num_key_value_heads*head_dim]"},
        {"    split: [q: 32]\n",
         "%s:16:12: split: expected a list of 2 to 16 `name: size` components in order, such as "
         "[q: num_attention_heads*head_dim, k: num_key_value_heads*head_dim, v: "
         "num_key_value_heads*head_dim]"},
        {"    split: [q: 16, 16]\n",
         "%s:16:20: split[1]: expected one `name: size` pair (a name of letters, digits and _, "
         "and a size expression)"},
        {"    split: [q: 16, 2k: 16]\n",
         "%s:16:20: split[1]: expected one `name: size` pair (a name of letters, digits and _, "
         "and a size expression)"},
        {"    split: [q: 16, q: 16]\n", "%s:16:20: split[1]: component 'q' named twice"},
        {"    split: [q: 16, k: (16]\n",
         "%s:16:20: split[1]: k: bad expression '(16': expected ')' but found end of expression "
         "at column 4"},
        {"    split: [q: 16, k: 16]\n    permute: [1, 0]\n",
         "%s:16:12: split: only for a rule with a single `from` (no fuse, index or permute)"},
        /* dropped components (`_`, may repeat) and groups */
        {"    split: [_: 16, _: 16]\n",
         "%s:16:12: split: every component is dropped (`_`); keep at least one"},
        {"    groups: 2\n", "%s:16:13: groups: only with split (the components of one group)"},
        {"    split: [q: 16, k: 16]\n    groups: (2\n",
         "%s:17:13: groups: bad expression '(2': expected ')' but found end of expression at "
         "column 3"},
        {"    naming: megatron\n",
         "%s:16:13: naming: 'megatron' is not one of the file's namings (hf)"},
        {"    naming: []\n", "%s:16:13: naming: an empty list selects no naming"},
    };
    for (size_t i = 0; i < WB_ARRAY_LEN(cases); i++) {
        char rules[512];
        snprintf(rules, sizeof(rules),
                 "  - rollout: m.{L}.qkv.weight\n"
                 "    from: m.{L}.qkv.weight\n"
                 "%s"
                 "  - rollout: \"*\"\n"
                 "    from: \"*\"\n",
                 cases[i].rule);
        const char *path = tiny_family(rules);
        struct wb_errlist el;
        wb_errlist_init(&el);
        struct wb_match_rules *r = NULL;
        CHECK_INT(wb_match_rules_load(path, &r, &el), -WB_E_CONFIG);
        EXPECT(&el, fmt(cases[i].want, path));
        wb_errlist_free(&el);
    }
    /* and with a fuse rule's list of `from` */
    const char *path = tiny_family("  - rollout: m.{L}.qkv.weight\n"
                                   "    from: [\"m.{L}.a\", \"m.{L}.b\"]\n"
                                   "    split: [q: 16, k: 16]\n");
    struct wb_errlist el;
    wb_errlist_init(&el);
    struct wb_match_rules *r = NULL;
    CHECK_INT(wb_match_rules_load(path, &r, &el), -WB_E_CONFIG);
    EXPECT(&el, fmt("%s:16:12: split: only for a rule with a single `from` (no fuse, index or "
                    "permute)",
                    path));
    wb_errlist_free(&el);
}

/* ---------------------------------------------------------------- rules that build nothing */

/* A typo in the split rule's pattern: its tensors fall through to the catch-all, which
 * renames them replicated — a match that succeeds with every TP rank's rows wrong. Now the
 * rule that built nothing is the error, at its place. */
static void test_unbuilt_rule_typo(void)
{
    struct tiny x;
    CHECK_INT(tiny_match(&x, "  - rollout: m.{L}.qvk.weight\n"
                             "    from: m.{L}.qkv.weight\n"
                             "    split: [q: h*hd, k: kv*hd, v: kv*hd]\n"
                             "    shard: {tp: 0, head_dim: hd}\n"
                             "  - rollout: \"*\"\n"
                             "    from: \"*\"\n"),
              -WB_E_MATCH);
    EXPECT(&x.el, fmt("%s:14:5: the rule for rollout 'm.{L}.qvk.weight' built no rollout tensor: "
                      "no rollout tensor's name matches it (a typo? a rule that applies to some "
                      "configs only says optional: true)",
                      x.path));
    CHECK(x.m == NULL);
    tiny_free(&x);
    /* the cause comes before what it explains */
    CHECK_INT(tiny_match(&x, "  - rollout: m.{L}.qvk.weight\n"
                             "    from: m.{L}.qkv.weight\n"
                             "  - rollout: m.{L}.qkv.weight\n"
                             "    from: m.{L}.qkv_proj.weight\n"
                             "  - rollout: \"*\"\n"
                             "    from: \"*\"\n"),
              -WB_E_MATCH);
    EXPECT(&x.el,
           fmt("%s:14:5: the rule for rollout 'm.{L}.qvk.weight' built no rollout tensor: no "
               "rollout tensor's name matches it (a typo? a rule that applies to some configs "
               "only says optional: true)",
               x.path),
           fmt("m.0.qkv.weight: trainer tensor m.0.qkv_proj.weight not found (rule %s:16)", x.path),
           fmt("m.1.qkv.weight: trainer tensor m.1.qkv_proj.weight not found (rule %s:16)", x.path),
           fmt("m.0.qkv.weight bf16 [32, 8]: trainer tensor not used by any rollout tensor and "
               "not declared ignorable (%s)",
               x.path),
           fmt("m.1.qkv.weight bf16 [32, 8]: trainer tensor not used by any rollout tensor and "
               "not declared ignorable (%s)",
               x.path));
    tiny_free(&x);
    /* optional: true lets a rule build nothing (an MTP layer's rule when mtp=0) */
    CHECK_INT(tiny_match(&x, "  - rollout: m.{L}.mtp.weight\n"
                             "    optional: true\n"
                             "    from: m.{L}.mtp.weight\n"
                             "  - rollout: \"*\"\n"
                             "    from: \"*\"\n"),
              0);
    CHECK_INT(x.el.n, 0);
    tiny_free(&x);
    /* a value other than a boolean is refused where it is */
    const char *path = tiny_family("  - rollout: m.{L}.mtp.weight\n"
                                   "    optional: 2\n"
                                   "    from: m.{L}.mtp.weight\n");
    struct wb_errlist el;
    wb_errlist_init(&el);
    struct wb_match_rules *r = NULL;
    CHECK_INT(wb_match_rules_load(path, &r, &el), -WB_E_CONFIG);
    EXPECT(&el, fmt("%s:15:15: optional: expected true or false, got '2'", path));
    wb_errlist_free(&el);
}

/* A rule whose names earlier rules (or ignore.rollout) all took in this inventory, though not
 * in every one: said with the first name and who took it. */
static void test_unbuilt_rule_taken(void)
{
    struct tiny x;
    CHECK_INT(tiny_match(&x, "  - rollout: m.{L}.*\n"
                             "    from: m.{L}.*\n"
                             "  - rollout: \"*.qkv.weight\"\n"
                             "    from: \"*.qkv.weight\"\n"),
              -WB_E_MATCH);
    EXPECT(&x.el, fmt("%s:16:5: the rule for rollout '*.qkv.weight' built no rollout tensor: the "
                      "2 rollout tensors it matches are taken before it (first: m.0.qkv.weight, "
                      "by the rule at line 14)",
                      x.path));
    tiny_free(&x);
    /* ignore.rollout takes the norms before any rule sees them */
    char text[2048];
    snprintf(text, sizeof(text),
             "family: t\n"
             "vars: {hd: 4}\n"
             "ignore:\n"
             "  rollout: [\"m.0.norm.weight\", \"m.1.norm.weight\"]\n"
             "  trainer: [\"*.norm.weight\"]\n"
             "trainer:\n"
             "  - for: {layer: n}\n"
             "    tensors:\n"
             "      m.{layer}.qkv.weight: [(h + 2*kv)*hd, hid]\n"
             "      m.{layer}.norm.weight: [hid]\n"
             "rollout:\n"
             "  - for: {layer: n}\n"
             "    tensors:\n"
             "      m.{layer}.qkv.weight: [(h + 2*kv)*hd, hid]\n"
             "      m.{layer}.norm.weight: [hid]\n"
             "rules:\n"
             "  - rollout: m.{L}.norm.weight\n"
             "    from: m.{L}.norm.weight\n"
             "  - rollout: \"*\"\n"
             "    from: \"*\"\n");
    const char *path = put("ign.yaml", text), *cfg = put("tiny.json", TINY_CONFIG);
    struct wb_errlist el;
    wb_errlist_init(&el);
    struct wb_match_rules *r = NULL;
    struct wb_inventory t, ro;
    wb_inv_init(&t);
    wb_inv_init(&ro);
    CHECK_INT(wb_match_rules_load(path, &r, &el), 0);
    CHECK_INT(wb_match_rules_generate(r, cfg, "trainer", &t, &el), 0);
    CHECK_INT(wb_match_rules_generate(r, cfg, "rollout", &ro, &el), 0);
    struct wb_match *m = NULL;
    CHECK_INT(wb_match_run(r, &t, &ro, &m, &el), -WB_E_MATCH);
    EXPECT(&el, fmt("%s:17:5: the rule for rollout 'm.{L}.norm.weight' built no rollout tensor: "
                    "the 2 rollout tensors it matches are taken before it (first: "
                    "m.0.norm.weight, it is in ignore.rollout)",
                    path));
    wb_errlist_free(&el);
    wb_match_rules_free(r);
    wb_inv_free(&t);
    wb_inv_free(&ro);
}

/* A rollout inventory that may hold part of the model (a file: wb_match_rules_partial_rollout):
 * a rule matching none of its names is no error there, one whose names earlier rules took
 * still is. */
static void test_unbuilt_partial_rollout(void)
{
    const char *path = tiny_family("  - rollout: m.{L}.mtp.weight\n"
                                   "    from: m.{L}.mtp.weight\n"
                                   "  - rollout: m.{L}.*\n"
                                   "    from: m.{L}.*\n"
                                   "  - rollout: \"*.qkv.weight\"\n"
                                   "    from: \"*.qkv.weight\"\n");
    const char *cfg = put("tiny.json", TINY_CONFIG);
    struct wb_errlist el;
    wb_errlist_init(&el);
    struct wb_match_rules *r = NULL;
    struct wb_inventory t, ro;
    wb_inv_init(&t);
    wb_inv_init(&ro);
    CHECK_INT(wb_match_rules_load(path, &r, &el), 0);
    CHECK_INT(wb_match_rules_generate(r, cfg, "trainer", &t, &el), 0);
    CHECK_INT(wb_match_rules_generate(r, cfg, "rollout", &ro, &el), 0);
    wb_match_rules_partial_rollout(r, true);
    struct wb_match *m = NULL;
    CHECK_INT(wb_match_run(r, &t, &ro, &m, &el), -WB_E_MATCH);
    EXPECT(&el, fmt("%s:18:5: the rule for rollout '*.qkv.weight' built no rollout tensor: the 2 "
                    "rollout tensors it matches are taken before it (first: m.0.qkv.weight, by "
                    "the rule at line 16)",
                    path));
    wb_errlist_free(&el);
    wb_match_rules_free(r);
    wb_inv_free(&t);
    wb_inv_free(&ro);
}

/* ---------------------------------------------------------------- rules that never match */

static void test_shadowed_rules(void)
{
    const char *path = tiny_family("  - rollout: \"*\"\n"
                                   "    from: \"*\"\n"
                                   "  - rollout: m.{L}.qkv.weight\n"
                                   "    from: m.{L}.qkv.weight\n"
                                   "    split: [q: h*hd, k: kv*hd, v: kv*hd]\n"
                                   "  - rollout: m.{L}.*\n"
                                   "    from: m.{L}.*\n");
    struct wb_errlist el;
    wb_errlist_init(&el);
    struct wb_match_rules *r = NULL;
    CHECK_INT(wb_match_rules_load(path, &r, &el), -WB_E_CONFIG);
    EXPECT(&el,
           fmt("%s:16:5: the rule for rollout 'm.{L}.qkv.weight' can never build a tensor: the "
               "rule at line 14 (rollout '*') comes first and matches every name it matches",
               path),
           fmt("%s:19:5: the rule for rollout 'm.{L}.*' can never build a tensor: the rule at "
               "line 14 (rollout '*') comes first and matches every name it matches",
               path));
    wb_errlist_free(&el);
    /* an earlier rule of narrower text can still take all of a later one's names */
    path = tiny_family("  - rollout: m.{L}.*\n"
                       "    from: m.{L}.*\n"
                       "  - rollout: m.{L}.qkv.weight\n"
                       "    from: m.{L}.qkv.weight\n"
                       "  - rollout: m.0{L}.norm.weight\n"
                       "    from: m.0{L}.norm.weight\n"
                       "  - rollout: \"*.weight\"\n"
                       "    from: \"*.weight\"\n");
    wb_errlist_init(&el);
    CHECK_INT(wb_match_rules_load(path, &r, &el), -WB_E_CONFIG);
    EXPECT(&el,
           fmt("%s:16:5: the rule for rollout 'm.{L}.qkv.weight' can never build a tensor: the "
               "rule at line 14 (rollout 'm.{L}.*') comes first and matches every name it "
               "matches",
               path),
           fmt("%s:18:5: the rule for rollout 'm.0{L}.norm.weight' can never build a tensor: the "
               "rule at line 14 (rollout 'm.{L}.*') comes first and matches every name it "
               "matches",
               path));
    wb_errlist_free(&el);
    /* ignore.rollout is applied before any rule */
    path = put("ign.yaml", "family: t\n"
                           "ignore:\n"
                           "  rollout: [\"*.k_scale\"]\n"
                           "rules:\n"
                           "  - rollout: m.{L}.attn.k_scale\n"
                           "    from: m.{L}.attn.k_scale\n"
                           "  - rollout: \"*\"\n"
                           "    from: \"*\"\n");
    wb_errlist_init(&el);
    CHECK_INT(wb_match_rules_load(path, &r, &el), -WB_E_CONFIG);
    EXPECT(&el, fmt("%s:5:5: the rule for rollout 'm.{L}.attn.k_scale' can never build a tensor: "
                    "ignore.rollout '*.k_scale' matches every name it matches",
                    path));
    wb_errlist_free(&el);
    /* overlaps that leave a later rule some names load (the shipped families' order) */
    path = tiny_family("  - rollout: m.{L}.mlp.*down_proj.weight\n"
                       "    from: m.{L}.mlp.*down_proj.weight\n"
                       "  - rollout: m.{L}.mtp_block.mlp.*down_proj.weight\n"
                       "    from: m.{L}.mlp.*down_proj.weight\n"
                       "  - rollout: m.{L}.mtp_block.*\n"
                       "    from: m.{L}.*\n"
                       "  - rollout: m.1{L}.*\n"
                       "    from: m.1{L}.*\n"
                       "  - rollout: \"*\"\n"
                       "    from: \"*\"\n");
    wb_errlist_init(&el);
    CHECK_INT(wb_match_rules_load(path, &r, &el), 0);
    CHECK_INT(el.n, 0);
    wb_match_rules_free(r);
    wb_errlist_free(&el);
}

static int covers(const char *outer, const char *inner)
{
    struct wb_pat a, b;
    char err[256];
    CHECK_INT(mx_pat_compile(outer, &a, err, sizeof(err)), 0);
    CHECK_INT(mx_pat_compile(inner, &b, err, sizeof(err)), 0);
    uint64_t budget = 1 << 20;
    int r = mx_pat_covers(&a, &b, &budget);
    mx_pat_free(&a);
    mx_pat_free(&b);
    return r;
}

/* Pattern inclusion: every name the inner pattern matches, the outer matches too. */
static void test_pattern_covers(void)
{
    CHECK_INT(covers("*", "anything.{L}.at*all"), 1);
    CHECK_INT(covers("*", "*"), 1);
    CHECK_INT(covers("a.{L}.b", "a.{L}.b"), 1);
    CHECK_INT(covers("a.{L}.b", "a.17.b"), 1);
    CHECK_INT(covers("a.{L}.b", "a.x.b"), 0);
    CHECK_INT(covers("a.{L}.b", "a.*.b"), 0); /* * may be empty or hold a dot */
    CHECK_INT(covers("a.*.b", "a.{L}.b"), 1);
    CHECK_INT(covers("a.*b", "a.*.b"), 1);
    CHECK_INT(covers("a.*.b", "a.*b"), 0);
    CHECK_INT(covers("x{L}", "x0{M}"), 1); /* digits after digits are digits */
    CHECK_INT(covers("x0{M}", "x{L}"), 0);
    CHECK_INT(covers("x{L}", "x{M}y"), 0);
    CHECK_INT(covers("*.weight", "model.layers.{L}.mlp.{E}.weight"), 1);
    CHECK_INT(covers("*.weight", "model.layers.{L}.*"), 0);
    CHECK_INT(covers("model.layers.{L}.*", "model.layers.{L}.mtp_block.*"), 1);
    CHECK_INT(covers("model.layers.{L}.mtp_block.*", "model.layers.{L}.*"), 0);
    CHECK_INT(covers("*a*b*", "xxbxxaxx"), 0);
    CHECK_INT(covers("*a*b*", "xxaxxbxx"), 1);
    CHECK_INT(covers("{A}.*", "{A}.{B}.{C}"), 1);
    CHECK_INT(covers("{A}.{B}", "{A}.{B}.{C}"), 0);
}

/* ---------------------------------------------------------------- shipped families */

/* Every shipped family with every shipped config.json of its model_type (and the test
 * fixtures' families with theirs) matches without a problem: no rule builds nothing unless
 * optional, none is shadowed; DeepSeek-V3 also with its MTP layer. gpt-oss's published config
 * is MXFP4, refused for a rollout: its rollout side reads a copy without quantization_config. */
static void test_shipped_families_clean(void)
{
    static const char *const families[] = {
        "configs/models/qwen3.yaml",           "configs/models/qwen3_moe.yaml",
        "configs/models/deepseek_v3.yaml",     "configs/models/llama3.yaml",
        "configs/models/gpt_oss.yaml",         "configs/models/phi3.yaml",
        "tests/fixtures/matcher/mixtral.yaml", "tests/fixtures/matcher/stacked_to_per_expert.yaml",
    };
    static const char *const configs[] = {
        "configs/hf/DeepSeek-V3.json",
        "configs/hf/Kimi-K2-Instruct.json",
        "configs/hf/Llama-3.1-8B.json",
        "configs/hf/Phi-3-mini-4k-instruct.json",
        "configs/hf/Qwen3-235B-A22B-FP8.json",
        "configs/hf/Qwen3-235B-A22B.json",
        "configs/hf/Qwen3-30B-A3B.json",
        "configs/hf/Qwen3-8B-FP8.json",
        "configs/hf/Qwen3-8B.json",
        "configs/hf/gpt-oss-20b.json",
        "configs/jobs/demo/config.json",
        "tests/fixtures/adapters/dsv3_tiny.json",
        "tests/fixtures/ckpt/qwen3-1g.json",
        "tests/fixtures/matcher/Mixtral-8x7B-v0.1.json",
        "tests/fixtures/matcher/tiny_moe.json",
    };
    /* gpt-oss-20b.json without its quantization_config, for the rollout */
    char *text = NULL;
    {
        FILE *f = fopen("configs/hf/gpt-oss-20b.json", "rb");
        CHECK(f != NULL);
        static char buf[1 << 16];
        size_t n = fread(buf, 1, sizeof(buf) - 1, f);
        fclose(f);
        buf[n] = 0;
        char *q = strstr(buf, "  \"quantization_config\": {");
        CHECK(q != NULL);
        char *end = strstr(q, "},\n");
        CHECK(end != NULL);
        memmove(q, end + 3, strlen(end + 3) + 1);
        text = buf;
    }
    const char *goss_bf16 = put("gpt-oss-20b-bf16.json", text);
    size_t matched = 0;
    for (size_t fi = 0; fi < WB_ARRAY_LEN(families); fi++)
        for (size_t ci = 0; ci < WB_ARRAY_LEN(configs); ci++)
            for (int mtp = 0; mtp < 2; mtp++) {
                const char *fam = families[fi], *tcfg = configs[ci], *rcfg = tcfg;
                if (mtp && !strstr(fam, "deepseek_v3"))
                    continue;
                /* the unstacking fixture covers any model_type; it is meant for tiny_moe.json */
                if (!strstr(fam, "stacked_to_per_expert") != !strstr(tcfg, "tiny_moe"))
                    continue;
                if (strstr(tcfg, "gpt-oss"))
                    rcfg = goss_bf16;
                struct wb_errlist el;
                wb_errlist_init(&el);
                struct wb_match_rules *r = NULL;
                CHECK_INT(wb_match_rules_load(fam, &r, &el), 0);
                CHECK_INT(wb_match_rules_set_vars(r, mtp ? "mtp=1" : "", &el), 0);
                if (wb_match_rules_bind_config(r, rcfg, &el)) {
                    /* another family's config: refused by its model_type, nothing else */
                    if (el.n != 1 || (!strstr(el.msgs[0], "not a model this family file covers") &&
                                      !strstr(el.msgs[0], "model_type: missing")))
                        wb_test_fail(__FILE__, __LINE__, "%s with %s: %s", fam, rcfg,
                                     el.n ? el.msgs[0] : "refused");
                    wb_match_rules_free(r);
                    wb_errlist_free(&el);
                    continue;
                }
                struct wb_inventory t, ro;
                wb_inv_init(&t);
                wb_inv_init(&ro);
                struct wb_match *m = NULL;
                int e = wb_match_rules_generate(r, tcfg, "trainer", &t, &el);
                if (!e)
                    e = wb_match_rules_generate(r, rcfg, "rollout", &ro, &el);
                if (!e)
                    e = wb_match_run(r, &t, &ro, &m, &el);
                if (e || el.n)
                    wb_test_fail(__FILE__, __LINE__, "%s with %s%s: %s", fam, tcfg,
                                 mtp ? " (mtp=1)" : "", el.n ? el.msgs[0] : "failed");
                matched++;
                wb_match_free(m);
                wb_inv_free(&t);
                wb_inv_free(&ro);
                wb_match_rules_free(r);
                wb_errlist_free(&el);
            }
    /* qwen3 x 3, qwen3_moe x 4, deepseek_v3 x 3 x 2, llama3, gpt_oss, phi3, mixtral, and the
     * unstacking fixture (no model_type: any config; tiny_moe.json is its own) */
    CHECK_INT(matched, 3 + 4 + 6 + 1 + 1 + 1 + 1 + 1);
}

/* ---------------------------------------------------------------- phi3 */

/* The phi3 family: the trainer inventory is the Hugging Face checkpoint's (Phi-3-mini-4k:
 * 195 tensors, qkv_proj and gate_up_proj fused, no biases), the rollout vLLM's
 * Phi3ForCausalLM (the same names, fused, per-rank shares of each component). */
static void test_phi3_mini(void)
{
    const char *fam = "configs/models/phi3.yaml", *cfg = "configs/hf/Phi-3-mini-4k-instruct.json";
    struct wb_errlist el;
    wb_errlist_init(&el);
    struct wb_match_rules *r = NULL;
    struct wb_inventory t, ro;
    wb_inv_init(&t);
    wb_inv_init(&ro);
    CHECK_INT(wb_match_rules_load(fam, &r, &el), 0);
    CHECK_INT(wb_match_rules_bind_config(r, cfg, &el), 0);
    CHECK_INT(wb_match_rules_generate(r, cfg, "trainer", &t, &el), 0);
    CHECK_INT(wb_match_rules_generate(r, cfg, "rollout", &ro, &el), 0);
    /* the checkpoint's names and shapes, written out here */
    CHECK_INT(t.n, 3 + 32 * 6);
    static const struct {
        const char *name;
        uint64_t d0, d1;
    } want[] = {
        {"model.embed_tokens.weight", 32064, 3072},
        {"lm_head.weight", 32064, 3072},
        {"model.norm.weight", 3072, 0},
        {"model.layers.%u.input_layernorm.weight", 3072, 0},
        {"model.layers.%u.post_attention_layernorm.weight", 3072, 0},
        {"model.layers.%u.self_attn.qkv_proj.weight", 9216, 3072},
        {"model.layers.%u.self_attn.o_proj.weight", 3072, 3072},
        {"model.layers.%u.mlp.gate_up_proj.weight", 16384, 3072},
        {"model.layers.%u.mlp.down_proj.weight", 3072, 8192},
    };
    for (int side = 0; side < 2; side++) {
        const struct wb_inventory *inv = side ? &ro : &t;
        CHECK_INT(inv->n, 195);
        size_t seen = 0;
        for (size_t w = 0; w < WB_ARRAY_LEN(want); w++)
            for (unsigned l = 0; l < (strchr(want[w].name, '%') ? 32u : 1u); l++) {
                char name[WB_NAME_MAX];
                snprintf(name, sizeof(name), want[w].name, l);
                ssize_t i = wb_inv_find(inv, name);
                if (i < 0)
                    wb_test_fail(__FILE__, __LINE__, "%s: no %s", side ? "rollout" : "trainer",
                                 name);
                struct wb_shape s = {want[w].d1 ? 2 : 1, {want[w].d0, want[w].d1}};
                CHECK(wb_shape_eq(&inv->p[i].shape, &s));
                CHECK_INT(inv->p[i].dtype, WB_DTYPE_BF16);
                seen++;
            }
        CHECK_INT(seen, 195);
    }
    struct wb_match *m = NULL;
    CHECK_INT(wb_match_run(r, &t, &ro, &m, &el), 0);
    size_t kinds[6] = {0};
    for (size_t i = 0; i < m->n; i++)
        kinds[m->map[i].kind]++;
    CHECK_INT(kinds[WB_MAP_SPLIT], 64);
    CHECK_INT(kinds[WB_MAP_RENAME], 131);
    /* vLLM's QKVParallelLinear / MergedColumnParallelLinear shares, rank 1 of 4: q heads 8-15,
     * k heads 8-15, v heads 8-15 (96 rows each); gate and up rows 2048-4095 of each */
    const struct wb_mapping *qkv = mapping_of(m, &ro, "model.layers.7.self_attn.qkv_proj.weight");
    CHECK_STR(pieces_str(m, &ro, qkv, 1, 4),
              "[2304, 3072]: [768:1536, 0:3072] [3840:4608, 0:3072] [6912:7680, 0:3072]");
    const struct wb_mapping *gu = mapping_of(m, &ro, "model.layers.7.mlp.gate_up_proj.weight");
    CHECK_STR(pieces_str(m, &ro, gu, 1, 4),
              "[4096, 3072]: [2048:4096, 0:3072] [10240:12288, 0:3072]");
    wb_match_free(m);
    wb_match_rules_free(r);
    wb_inv_free(&t);
    wb_inv_free(&ro);
    wb_errlist_free(&el);
}

const struct wb_test wb_tests[] = {
    {"split_ranks", test_split_ranks, 0},
    {"split_sizes_checked", test_split_sizes_checked, 0},
    {"split_swapped_sizes_keep_shapes", test_split_swapped_sizes_keep_shapes, 0},
    {"split_syntax", test_split_syntax, 0},
    {"split_groups", test_split_groups, 0},
    {"split_drop", test_split_drop, 0},
    {"split_stack", test_split_stack, 0},
    {"split_groups_fp8", test_split_groups_fp8, 0},
    {"namings", test_namings, 0},
    {"unbuilt_rule_typo", test_unbuilt_rule_typo, 0},
    {"unbuilt_rule_taken", test_unbuilt_rule_taken, 0},
    {"unbuilt_partial_rollout", test_unbuilt_partial_rollout, 0},
    {"shadowed_rules", test_shadowed_rules, 0},
    {"pattern_covers", test_pattern_covers, 0},
    {"shipped_families_clean", test_shipped_families_clean, 120},
    {"phi3_mini", test_phi3_mini, 0},
    {0},
};
