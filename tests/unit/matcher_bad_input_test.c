/* matcher_bad_input_test.c — inputs a user can get wrong, each refused with its exact message,
 * quickly and in bounded memory: config.json values out of range or of the wrong JSON type
 * (a layer count of INT64_MIN, negative or boolean counts, 2^62 dimensions, strings for
 * numbers, zero sizes), a config of another model type, loops whose product explodes,
 * allocation failure (an error, never an empty success), family-file and rule mistakes,
 * scale tensors of the wrong dtype (one line, not one per tensor), and wb-match's options. */
#include "matcher/matcher.h"
#include "tests/unit/matcher_expect.h"
#include "tests/wbtest.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

static const char *const QWEN3 = "configs/models/qwen3.yaml";
static const char *const DSV3 = "configs/models/deepseek_v3.yaml";

/* A config.json derived from a shipped one by replacing one text. */
static const char *derived(const char *from, const char *name, const char *old, const char *new)
{
    FILE *fp = fopen(from, "r");
    CHECK(fp);
    static char buf[1 << 16], out[1 << 16];
    size_t n = fread(buf, 1, sizeof(buf) - 1, fp);
    fclose(fp);
    buf[n] = 0;
    char *at = strstr(buf, old);
    if (!at)
        wb_test_fail(__FILE__, __LINE__, "%s has no '%s'", from, old);
    snprintf(out, sizeof(out), "%.*s%s%s", (int)(at - buf), buf, new, at + strlen(old));
    return put(name, out);
}

/* Generates one side and expects failure; the error list is left in el. */
static void gen_fails(const char *family, const char *cfg, const char *side, struct wb_errlist *el)
{
    struct wb_inventory inv;
    wb_inv_init(&inv);
    wb_errlist_init(el);
    int r = wb_inv_generate(family, cfg, side, &inv, el);
    CHECK(r < 0);
    CHECK_INT(inv.n, 0); /* nothing half-made */
    wb_inv_free(&inv);
}

#define CHECK_CONTAINS(hay, needle)                                                                \
    do {                                                                                           \
        const char *h_ = (hay), *n_ = (needle);                                                    \
        if (!strstr(h_, n_))                                                                       \
            wb_test_fail(__FILE__, __LINE__, "output lacks \"%s\":\n%s", n_, h_);                  \
    } while (0)

/* ---------------------------------------------------------------- config.json values */

static void test_layer_start_int64_min(void)
{
    /* used to hang with memory growing ~300 MB/s (a signed overflow computing the loop count):
     * the start is refused before the loop runs once, the exact error says so */
    const char *cfg =
        derived("configs/hf/DeepSeek-V3.json", "ds.json", "\"first_k_dense_replace\": 3",
                "\"first_k_dense_replace\": -9223372036854775808");
    struct wb_errlist el;
    gen_fails(DSV3, cfg, "trainer", &el);
    EXPECT(&el,
           "configs/models/deepseek_v3.yaml:72:11: 'first_k_dense_replace': loop layer starts at "
           "-9223372036854775808, a negative index",
           "configs/models/deepseek_v3.yaml:80:11: 'first_k_dense_replace': loop layer starts at "
           "-9223372036854775808, a negative index");
    wb_errlist_free(&el);
}

static void test_negative_layer_count(void)
{
    const char *cfg = derived("configs/hf/Qwen3-8B.json", "neg.json", "\"num_hidden_layers\": 36",
                              "\"num_hidden_layers\": -5");
    struct wb_errlist el;
    gen_fails(QWEN3, cfg, "rollout", &el);
    EXPECT(&el,
           "configs/models/qwen3.yaml:94:11: 'num_hidden_layers': loop layer ends at -5, a "
           "negative index",
           "configs/models/qwen3.yaml:100:11: 'num_hidden_layers': loop layer ends at -5, a "
           "negative index");
    wb_errlist_free(&el);
}

static void test_boolean_layer_count(void)
{
    /* true used to be one layer */
    const char *cfg = derived("configs/hf/Qwen3-8B.json", "bool.json", "\"num_hidden_layers\": 36",
                              "\"num_hidden_layers\": true");
    struct wb_errlist el;
    gen_fails(QWEN3, cfg, "trainer", &el);
    EXPECT(&el, "configs/models/qwen3.yaml:44:11: 'num_hidden_layers': field 'num_hidden_layers' "
                "is a boolean (true), not a number");
    wb_errlist_free(&el);
    /* booleans are fine as conditions (tie_word_embeddings == 0), not in arithmetic */
    cfg = derived("configs/hf/Qwen3-8B.json", "bool2.json", "\"hidden_size\": 4096",
                  "\"hidden_size\": false");
    gen_fails(QWEN3, cfg, "trainer", &el);
    CHECK(el.n >= 1);
    CHECK_STR(el.msgs[0], "configs/models/qwen3.yaml:37:7: 'hidden_size': field 'hidden_size' is "
                          "a boolean (false), not a number");
    wb_errlist_free(&el);
}

static void test_tie_word_embeddings_2(void)
{
    /* a number where config.json should say true or false used to be read as true (tied: no
     * lm_head) */
    const char *cfg = derived("configs/hf/Qwen3-8B.json", "tie2.json",
                              "\"tie_word_embeddings\": false", "\"tie_word_embeddings\": 2");
    struct wb_errlist el;
    gen_fails(QWEN3, cfg, "trainer", &el);
    EXPECT(&el, "configs/models/qwen3.yaml:39:5: 'boolean(tie_word_embeddings) == 0': field "
                "'tie_word_embeddings' is 2, not a boolean (true or false)");
    wb_errlist_free(&el);
}

/* every truth value a shipped family reads from config.json goes through boolean():
 * gpt-oss's attention_bias: 2 used to turn the biases on */
static void test_attention_bias_2(void)
{
    const char *cfg = derived("configs/hf/gpt-oss-20b.json", "bias2.json",
                              "\"attention_bias\": true", "\"attention_bias\": 2");
    struct wb_errlist el;
    gen_fails("configs/models/gpt_oss.yaml", cfg, "trainer", &el);
    EXPECT(&el, "configs/models/gpt_oss.yaml:51:5: 'boolean(attention_bias)': field "
                "'attention_bias' is 2, not a boolean (true or false) (with layer=0)");
    wb_errlist_free(&el);
}

/* 100,000 nested '[' (or '{') in config.json: jansson stops at its depth bound (2048), an
 * exact error, not a deep recursion in the reader or the flattening of nested objects. */
static void test_config_json_nesting(void)
{
    enum { DEPTH = 100000 };
    for (int obj = 0; obj < 2; obj++) {
        char *deep = malloc(6 * DEPTH + 64), *p = deep;
        CHECK(deep != NULL);
        p += sprintf(p, "{\"model_type\": \"qwen3\", \"x\": ");
        for (int i = 0; i < DEPTH; i++)
            p += sprintf(p, obj ? "{\"a\":" : "[");
        p += sprintf(p, obj ? "1" : "");
        for (int i = 0; i < DEPTH; i++)
            *p++ = obj ? '}' : ']';
        strcpy(p, "}");
        const char *cfg = put(obj ? "deep_obj.json" : "deep.json", deep);
        free(deep);
        struct wb_errlist el;
        gen_fails(QWEN3, cfg, "trainer", &el);
        CHECK_INT(el.n, 1);
        char want[700];
        snprintf(want, sizeof(want), "%s:1:%d: maximum parsing depth reached near '%c'", cfg,
                 obj ? 10265 : 2077, obj ? '{' : '[');
        CHECK_STR(el.msgs[0], want);
        wb_errlist_free(&el);
    }
}

static void test_dimension_2_62(void)
{
    /* 2^62 x 4096 elements overflow any byte count: refused at 2^48 bytes */
    const char *cfg = derived("configs/hf/Qwen3-8B.json", "huge.json", "\"vocab_size\": 151936",
                              "\"vocab_size\": 4611686018427387904");
    struct wb_errlist el;
    gen_fails(QWEN3, cfg, "trainer", &el);
    EXPECT(&el,
           "configs/models/qwen3.yaml:37:7: model.embed_tokens.weight [4611686018427387904, "
           "4096]: more than 2^48 bytes (bf16)",
           "configs/models/qwen3.yaml:42:7: lm_head.weight [4611686018427387904, 4096]: more "
           "than 2^48 bytes (bf16)");
    wb_errlist_free(&el);
    /* the same in an inventory file */
    const char *inv = put("inv.yaml", "a.weight: [bf16, [4611686018427387904, 4]]\n"
                                      "b.weight: [fp32, [65536, 65536, 65536]]\n"
                                      "c.weight: [fp32, [65536, 65536, 16384]]\n");
    struct wb_inventory t;
    wb_inv_init(&t);
    wb_errlist_init(&el);
    CHECK_INT(wb_inv_load_file(inv, &t, &el), -WB_E_CONFIG);
    EXPECT(&el, fmt("%s:1:1: a.weight [4611686018427387904, 4]: more than 2^48 bytes (bf16)", inv),
           fmt("%s:2:1: b.weight [65536, 65536, 65536]: more than 2^48 bytes (fp32)", inv));
    wb_errlist_free(&el);
    wb_inv_free(&t);
}

static void test_string_for_a_number(void)
{
    const char *cfg = derived("configs/hf/Qwen3-8B.json", "str.json", "\"num_attention_heads\": 32",
                              "\"num_attention_heads\": \"32\"");
    struct wb_errlist el;
    gen_fails(QWEN3, cfg, "trainer", &el);
    CHECK(el.n >= 1);
    CHECK_STR(el.msgs[0], fmt("%s: check 'num_attention_heads %% num_key_value_heads == 0' "
                              "(configs/models/qwen3.yaml:20:5): field 'num_attention_heads' is "
                              "not an integer (\"32\")",
                              cfg));
    wb_errlist_free(&el);
}

static void test_float_for_a_number(void)
{
    const char *cfg = derived("configs/hf/Qwen3-8B.json", "float.json",
                              "\"intermediate_size\": 12288", "\"intermediate_size\": 12288.5");
    struct wb_errlist el;
    gen_fails(QWEN3, cfg, "trainer", &el);
    EXPECT(&el,
           "configs/models/qwen3.yaml:54:7: 'intermediate_size': field 'intermediate_size' is not "
           "an integer (12288.5) (with layer=0)",
           "configs/models/qwen3.yaml:55:7: 'intermediate_size': field 'intermediate_size' is not "
           "an integer (12288.5) (with layer=0)",
           "configs/models/qwen3.yaml:56:7: 'intermediate_size': field 'intermediate_size' is not "
           "an integer (12288.5) (with layer=0)");
    wb_errlist_free(&el);
}

static void test_list_for_a_number(void)
{
    const char *cfg = derived("configs/hf/Qwen3-8B.json", "list.json", "\"num_hidden_layers\": 36",
                              "\"num_hidden_layers\": [36]");
    struct wb_errlist el;
    gen_fails(QWEN3, cfg, "trainer", &el);
    EXPECT(&el, "configs/models/qwen3.yaml:44:11: 'num_hidden_layers': field 'num_hidden_layers' "
                "is not an integer (a list)");
    wb_errlist_free(&el);
}

static void test_zero_size(void)
{
    /* a zero in config.json gives empty tensors no model has */
    const char *cfg =
        derived("configs/hf/Qwen3-8B.json", "zero.json", "\"head_dim\": 128", "\"head_dim\": 0");
    struct wb_errlist el;
    gen_fails(QWEN3, cfg, "rollout", &el);
    EXPECT(&el,
           "configs/models/qwen3.yaml:98:7: 'head_dim': dimension 0 of "
           "model.layers.0.self_attn.q_norm.weight is zero (0) (with layer=0)",
           "configs/models/qwen3.yaml:99:7: 'head_dim': dimension 0 of "
           "model.layers.0.self_attn.k_norm.weight is zero (0) (with layer=0)",
           "configs/models/qwen3.yaml:103:7: '(num_attention_heads + "
           "2*num_key_value_heads)*head_dim': "
           "dimension 0 of model.layers.0.self_attn.qkv_proj.weight is zero (0) (with layer=0)",
           "configs/models/qwen3.yaml:105:7: 'num_attention_heads*head_dim': dimension 1 of "
           "model.layers.0.self_attn.o_proj.weight is zero (0) (with layer=0)");
    wb_errlist_free(&el);
}

static void test_heads_not_dividing(void)
{
    /* 32 query heads in groups over 5 kv heads: vLLM refuses the model, so does the family */
    const char *cfg = derived("configs/hf/Qwen3-8B.json", "gqa.json", "\"num_key_value_heads\": 8",
                              "\"num_key_value_heads\": 5");
    struct wb_errlist el;
    gen_fails(QWEN3, cfg, "trainer", &el);
    EXPECT(&el, fmt("%s: check failed: 'num_attention_heads %% num_key_value_heads == 0' "
                    "(configs/models/qwen3.yaml:20:5)",
                    cfg));
    wb_errlist_free(&el);
}

static void test_missing_vocab(void)
{
    const char *cfg = derived("configs/hf/Qwen3-8B.json", "novocab.json",
                              "  \"vocab_size\": 151936\n", "  \"zz\": 0\n");
    struct wb_errlist el;
    gen_fails(QWEN3, cfg, "rollout", &el);
    EXPECT(&el,
           fmt("%s: missing field 'vocab_size' (needed by 'vocab_size' at "
               "configs/models/qwen3.yaml:89:7)",
               cfg),
           fmt("%s: missing field 'vocab_size' (needed by 'vocab_size' at "
               "configs/models/qwen3.yaml:93:7)",
               cfg));
    wb_errlist_free(&el);
}

static void test_moe_config_to_dense_family(void)
{
    /* Qwen3-30B-A3B's config given to the dense family used to match 387 tensors, experts
     * silently left out */
    struct wb_errlist el;
    gen_fails(QWEN3, "configs/hf/Qwen3-30B-A3B.json", "trainer", &el);
    EXPECT(&el, "configs/hf/Qwen3-30B-A3B.json: model_type: qwen3_moe: not a model this family "
                "file covers (configs/models/qwen3.yaml:8:13: model_type: qwen3)");
    wb_errlist_free(&el);
    /* the rules bound to it refuse it too */
    struct wb_match_rules *rules;
    wb_errlist_init(&el);
    CHECK_INT(wb_match_rules_load(QWEN3, &rules, &el), 0);
    CHECK_INT(wb_match_rules_bind_config(rules, "configs/hf/Qwen3-30B-A3B.json", &el),
              -WB_E_CONFIG);
    CHECK_INT(el.n, 1);
    wb_match_rules_free(rules);
    wb_errlist_free(&el);
}

static void test_model_type_missing_or_not_a_string(void)
{
    const char *cfg = derived("configs/hf/Qwen3-8B.json", "nomt.json", "\"model_type\": \"qwen3\"",
                              "\"model_typo\": \"qwen3\"");
    struct wb_errlist el;
    gen_fails(QWEN3, cfg, "trainer", &el);
    EXPECT(&el, fmt("%s: model_type: missing; the family file covers qwen3 "
                    "(configs/models/qwen3.yaml:8:13)",
                    cfg));
    wb_errlist_free(&el);
    cfg = derived("configs/hf/Qwen3-8B.json", "mt3.json", "\"model_type\": \"qwen3\"",
                  "\"model_type\": 3");
    gen_fails(QWEN3, cfg, "trainer", &el);
    EXPECT(&el, fmt("%s: model_type: a number: expected a string", cfg));
    wb_errlist_free(&el);
}

static void test_big_integer_and_dotted_keys(void)
{
    const char *cfg = put("big.json", "{\"model_type\": \"qwen3\", \"vocab_size\": "
                                      "100000000000000000000}");
    struct wb_errlist el;
    gen_fails(QWEN3, cfg, "trainer", &el);
    EXPECT(&el, fmt("%s:1:59: too big integer", cfg));
    wb_errlist_free(&el);
    /* "rope.theta" and {"rope": {"theta"}} flatten to one name: which one wins is not ours to
     * pick */
    cfg =
        put("dot.json", "{\"model_type\": \"qwen3\", \"rope.theta\": 1, \"rope\": {\"theta\": 2}}");
    gen_fails(QWEN3, cfg, "trainer", &el);
    EXPECT(&el, fmt("%s: key 'rope.theta' is given twice (once with a dot in its name)", cfg));
    wb_errlist_free(&el);
    cfg = put("arr.json", "[1, 2]");
    gen_fails(QWEN3, cfg, "trainer", &el);
    EXPECT(&el, fmt("%s: expected a JSON object at the top", cfg));
    wb_errlist_free(&el);
}

static void test_negation_overflow(void)
{
    const char *fam = put("neg.yaml", "family: t\n"
                                      "trainer:\n"
                                      "  - tensors:\n"
                                      "      a.w: [-n]\n");
    const char *cfg = put("n.json", "{\"n\": -9223372036854775808}");
    struct wb_errlist el;
    gen_fails(fam, cfg, "trainer", &el);
    EXPECT(&el, fmt("%s:4:7: '-n': integer overflow", fam));
    wb_errlist_free(&el);
}

/* ---------------------------------------------------------------- a job's vars */

static void test_job_vars(void)
{
    struct wb_errlist el;
    const char *cfg = "configs/hf/DeepSeek-V3.json";
    struct wb_inventory inv;
    wb_inv_init(&inv);
    const char *bad[][2] = {
        {"mpt=1", "vars 'mpt=1': 'mpt' is not one of configs/models/deepseek_v3.yaml's vars "
                  "(mtp, all_layers)"},
        {"mtp", "vars 'mtp': expected NAME=INTEGER[,NAME=INTEGER...]"},
        {"mtp=yes", "vars 'mtp=yes': expected NAME=INTEGER[,NAME=INTEGER...]"},
        {"=1", "vars '=1': expected NAME=INTEGER[,NAME=INTEGER...]"},
        {"mtp=1,mtp=0", "vars 'mtp=1,mtp=0': 'mtp' given twice"},
    };
    for (size_t i = 0; i < WB_ARRAY_LEN(bad); i++) {
        wb_errlist_init(&el);
        CHECK_INT(wb_inv_generate_vars(DSV3, cfg, bad[i][0], "trainer", &inv, &el), -WB_E_CONFIG);
        EXPECT(&el, bad[i][1]);
        wb_errlist_free(&el);
    }
    /* the rules check the same names */
    struct wb_match_rules *rules;
    wb_errlist_init(&el);
    CHECK_INT(wb_match_rules_load(DSV3, &rules, &el), 0);
    CHECK_INT(wb_match_rules_set_vars(rules, "mpt=1", &el), -WB_E_CONFIG);
    EXPECT(&el, "vars 'mpt=1': 'mpt' is not one of configs/models/deepseek_v3.yaml's vars (mtp, "
                "all_layers)");
    wb_match_rules_free(rules);
    wb_errlist_free(&el);
    /* a family without vars */
    const char *fam = put("novars.yaml", "family: t\ntrainer: []\n");
    wb_errlist_init(&el);
    CHECK_INT(wb_inv_generate_vars(fam, put("e.json", "{}"), "mtp=1", "trainer", &inv, &el),
              -WB_E_CONFIG);
    EXPECT(&el, fmt("vars 'mtp=1': 'mtp' is not one of %s's vars (it has none)", fam));
    wb_errlist_free(&el);
    /* MTP asked of a config that does not say how many MTP layers there are */
    const char *nomtp = derived("configs/hf/DeepSeek-V3.json", "nomtp.json",
                                "  \"num_nextn_predict_layers\": 1,\n", "");
    wb_errlist_init(&el);
    CHECK_INT(wb_inv_generate(DSV3, nomtp, "trainer", &inv, &el), 0); /* mtp=0 never asks */
    CHECK_INT(wb_inv_generate_vars(DSV3, nomtp, "mtp=1", "trainer", &inv, &el), -WB_E_CONFIG);
    CHECK(el.n >= 1);
    CHECK_STR(el.msgs[0], fmt("%s: missing field 'num_nextn_predict_layers' (needed by "
                              "'all_layers' at configs/models/deepseek_v3.yaml:43:11)",
                              nomtp));
    wb_errlist_free(&el);
    wb_inv_free(&inv);
}

/* A checkpoint with DeepSeek-V3's MTP layer matched with the default mtp=0: 787 "not used"
 * lines used to be all; now one line says them all and names --var mtp=1. */
static void test_mtp_hint(void)
{
    struct wb_errlist el;
    wb_errlist_init(&el);
    struct wb_inventory t = {0}, r = {0};
    CHECK_INT(
        wb_inv_generate_vars(DSV3, "configs/hf/DeepSeek-V3.json", "mtp=1", "trainer", &t, &el), 0);
    CHECK_INT(wb_inv_generate(DSV3, "configs/hf/DeepSeek-V3.json", "rollout", &r, &el), 0);
    struct wb_match_rules *rules = NULL;
    CHECK_INT(wb_match_rules_load(DSV3, &rules, &el), 0);
    struct wb_match *m = NULL;
    CHECK_INT(wb_match_run(rules, &t, &r, &m, &el), -WB_E_MATCH);
    CHECK_INT(el.n, 1);
    CHECK_STR(el.msgs[0],
              "787 trainer tensors in layer 61, past the last layer the rollout uses (60), are "
              "used by no rollout tensor (first: model.layers.61.input_layernorm.weight bf16 "
              "[7168]): a multi-token-prediction (MTP) draft layer? A family with an `mtp` var "
              "moves it with --var mtp=1 (a job file: model.vars: \"mtp=1\"); otherwise list it "
              "in the family's ignore.trainer (configs/models/deepseek_v3.yaml)");
    wb_match_rules_free(rules);
    wb_inv_free(&t);
    wb_inv_free(&r);
    wb_errlist_free(&el);
}

/* ---------------------------------------------------------------- loops */

static void test_nested_loops_product(void)
{
    const char *fam = put("loops.yaml", "family: t\n"
                                        "trainer:\n"
                                        "  - for: {a: n, b: n, c: n}\n"
                                        "    tensors:\n"
                                        "      x.{a}.{b}.{c}: [4]\n");
    const char *cfg = put("n.json", "{\"n\": 1000}");
    struct wb_errlist el;
    /* refused from the bounds alone, before an iteration runs: the error names the product */
    gen_fails(fam, cfg, "trainer", &el);
    EXPECT(&el, fmt("%s:3:5: for: a 1000 x b 1000 x c 1000 = 1000000000 iterations, more than "
                    "1048576 in all (nested loops multiply)",
                    fam));
    wb_errlist_free(&el);
    /* an inner bound that grows with the outer variable is caught while running (the block
     * makes no tensor, so only the iterations count): stopped at the budget of 1048576, which
     * the error names, not after the 1000 x 600000 the bounds allow */
    fam = put("loops2.yaml", "family: t\n"
                             "trainer:\n"
                             "  - for: {a: n, b: a * 600}\n"
                             "    when: a < 0\n"
                             "    tensors:\n"
                             "      x.{a}.{b}: [4]\n");
    gen_fails(fam, cfg, "trainer", &el);
    EXPECT(&el, fmt("%s:3:5: for: the loops of this section run more than 1048576 iterations in "
                    "all (nested loops multiply); stopped",
                    fam));
    wb_errlist_free(&el);
}

static void test_single_loop_too_long(void)
{
    const char *fam = put("loop.yaml", "family: t\n"
                                       "trainer:\n"
                                       "  - for: {i: n}\n"
                                       "    tensors:\n"
                                       "      x.{i}: [4]\n");
    const char *cfg = put("n.json", "{\"n\": 2000000}");
    struct wb_errlist el;
    gen_fails(fam, cfg, "trainer", &el);
    EXPECT(&el, fmt("%s:3:11: 'n': loop i of 2000000 iterations (at most 1048576)", fam));
    wb_errlist_free(&el);
}

static void test_too_many_tensors(void)
{
    /* 1000 x 600 iterations fit the loop budget; 600,000 tensors do not: generation stops at the
     * 524289th tensor (x.873.488 = 873 * 600 + 488 + 1), named in the error, not at the end */
    const char *fam = put("many.yaml", "family: t\n"
                                       "trainer:\n"
                                       "  - for: {a: 1000, b: 600}\n"
                                       "    tensors:\n"
                                       "      x.{a}.{b}: [4]\n");
    const char *cfg = put("e.json", "{}");
    struct wb_errlist el;
    gen_fails(fam, cfg, "trainer", &el);
    EXPECT(&el, fmt("%s:5:7: x.873.488: more than 524288 tensors generated; stopped", fam));
    wb_errlist_free(&el);
}

static void test_loop_variable_names(void)
{
    const char *fam = put("lv.yaml", "family: t\n"
                                     "trainer:\n"
                                     "  - for: {1x: 2, b: 2, b: 3}\n"
                                     "    tensors:\n"
                                     "      x.{b}: [4]\n");
    const char *cfg = put("e.json", "{}");
    struct wb_errlist el;
    gen_fails(fam, cfg, "trainer", &el);
    EXPECT(&el, fmt("%s:3:11: for: loop variable '1x' is not a name", fam),
           fmt("%s:3:24: for: loop variable 'b' twice", fam));
    wb_errlist_free(&el);
}

/* ---------------------------------------------------------------- allocation failure */

/* Run in a child process with its address space capped: generating Kimi-K2's 70k-tensor
 * inventory must fail with an error that says so, never return an empty success. (Under ASan
 * only large allocations come from new mappings; they are what fails here.) */
static void test_oom_child(void)
{
    if (!getenv("WB_OOM_CHILD"))
        wb_test_skip("run by oom_is_an_error");
    long pages = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    CHECK(f && fscanf(f, "%ld", &pages) == 1);
    fclose(f);
    struct rlimit rl;
    CHECK_INT(getrlimit(RLIMIT_AS, &rl), 0);
    rl.rlim_cur = (rlim_t)pages * (rlim_t)sysconf(_SC_PAGESIZE) + (8u << 20);
    if (rl.rlim_max != RLIM_INFINITY && rl.rlim_cur > rl.rlim_max)
        wb_test_skip("address space limit too low already");
    CHECK_INT(setrlimit(RLIMIT_AS, &rl), 0);
    struct wb_errlist el;
    wb_errlist_init(&el);
    struct wb_inventory inv;
    wb_inv_init(&inv);
    int r = wb_inv_generate(DSV3, "configs/hf/Kimi-K2-Instruct.json", "trainer", &inv, &el);
    char line[512];
    int n = snprintf(line, sizeof(line), "rc=%d tensors=%zu msgs=%zu first=%s\n", r, inv.n, el.n,
                     el.n ? el.msgs[0] : "-");
    if (write(1, line, (size_t)n) != n)
        _exit(3);
    _exit(0); /* no leak check under the cap */
}

static void run_argv(void *arg)
{
    char **argv = arg;
    execv(argv[0], argv);
    _exit(127);
}

static void test_oom_is_an_error(void)
{
    char out[8192], self[512], opts[1024];
    ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    CHECK(n > 0);
    self[n] = 0;
    const char *asan = getenv("ASAN_OPTIONS");
    snprintf(opts, sizeof(opts), "%s%sallocator_may_return_null=1:detect_leaks=0", asan ? asan : "",
             asan && *asan ? ":" : "");
    setenv("ASAN_OPTIONS", opts, 1);
    setenv("WB_OOM_CHILD", "1", 1);
    char *argv[] = {self, "oom_child", NULL};
    CHECK_INT(wb_test_capture(run_argv, argv, out, sizeof(out)), 0);
    CHECK_CONTAINS(out, "rc=-12 tensors=0 msgs=1 first=configs/models/deepseek_v3.yaml: out of "
                        "memory generating the trainer inventory\n");
}

/* ---------------------------------------------------------------- scale dtypes */

static void test_bf16_scales_one_line(void)
{
    /* an FP8 trainer checkpoint whose 200 scale tensors were saved in BF16: one line says so
     * (it used to be one "does not cover" line per tensor) */
    const char *fam = put("ckpt.yaml", "family: ckpt\n"
                                       "quant: {fp8: [\"*.w\"]}\n"
                                       "trainer:\n"
                                       "  - for: {i: 200}\n"
                                       "    fp8: 1\n"
                                       "    tensors:\n"
                                       "      l.{i}.w: [256, 256]\n"
                                       "rollout:\n"
                                       "  - for: {i: 200}\n"
                                       "    fp8: 1\n"
                                       "    tensors:\n"
                                       "      l.{i}.w: [256, 256]\n"
                                       "rules:\n"
                                       "  - rollout: \"*\"\n"
                                       "    from: \"*\"\n");
    const char *cfg = put("e.json", "{}");
    struct wb_errlist el;
    wb_errlist_init(&el);
    struct wb_inventory t, t2, r;
    wb_inv_init(&t);
    wb_inv_init(&t2);
    wb_inv_init(&r);
    if (wb_inv_generate(fam, cfg, "trainer", &t, &el) ||
        wb_inv_generate(fam, cfg, "rollout", &r, &el))
        wb_test_fail(__FILE__, __LINE__, "%s", el.msgs[0]);
    for (size_t i = 0; i < t.n; i++) {
        bool scale = strstr(t.p[i].name, "_scale_inv") != NULL;
        CHECK_INT(wb_inv_add(&t2, t.p[i].name, scale ? WB_DTYPE_BF16 : t.p[i].dtype, &t.p[i].shape),
                  0);
    }
    struct wb_match_rules *rules;
    CHECK_INT(wb_match_rules_load(fam, &rules, &el), 0);
    struct wb_match *m = NULL;
    CHECK_INT(wb_match_run(rules, &t2, &r, &m, &el), -WB_E_MATCH);
    EXPECT(&el, fmt("trainer scale tensors must be fp32: 200 are not (first l.0.w_scale_inv, bf16) "
                    "(rule %s:14)",
                    fam));
    wb_match_rules_free(rules);
    wb_inv_free(&t);
    wb_inv_free(&t2);
    wb_inv_free(&r);
    wb_errlist_free(&el);
}

/* ---------------------------------------------------------------- family files and rules */

static void test_family_file_mistakes(void)
{
    const char *cfg = put("e.json", "{}");
    struct wb_errlist el;
    const char *fam = put("f1.yaml", "family: t\n"
                                     "model_type: []\n"
                                     "trainer: []\n");
    gen_fails(fam, cfg, "trainer", &el);
    EXPECT(&el, fmt("%s:2:13: model_type: an empty list covers no model", fam));
    wb_errlist_free(&el);
    fam = put("f2.yaml", "family: t\n"
                         "checks: [\"n >\"]\n"
                         "trainer: []\n");
    gen_fails(fam, cfg, "trainer", &el);
    EXPECT(&el, fmt("%s:2:10: checks: bad expression 'n >': unexpected end of expression at "
                    "column 4",
                    fam));
    wb_errlist_free(&el);
    fam = put("f3.yaml", "family: t\n"
                         "quant: {scale_suffix: \"\"}\n"
                         "trainer: []\n");
    gen_fails(fam, cfg, "trainer", &el);
    EXPECT(&el, fmt("%s:2:23: quant.scale_suffix: must not be empty", fam));
    wb_errlist_free(&el);
    char long_name[400];
    memset(long_name, 'x', 300);
    long_name[300] = 0;
    fam = put("f4.yaml", fmt("family: t\n"
                             "trainer:\n"
                             "  - tensors:\n"
                             "      a.{n}.%s: [4]\n",
                             long_name));
    gen_fails(fam, put("n1.json", "{\"n\": 1}"), "trainer", &el);
    EXPECT(&el, fmt("%s:4:7: 'a.{n}.%s': name longer than 255 bytes", fam, long_name));
    wb_errlist_free(&el);
    fam = put("f5.yaml", "family: t\n"
                         "vars: {big: \"1 << 3\"}\n"
                         "trainer: []\n");
    gen_fails(fam, cfg, "trainer", &el);
    EXPECT(&el, fmt("%s:2:13: vars.big: bad expression '1 << 3': unexpected '<' at column 4", fam));
    wb_errlist_free(&el);
}

static void test_rule_shard_mistakes(void)
{
    const char *path = put("rules.yaml", "family: t\n"
                                         "rules:\n"
                                         "  - rollout: a.w\n"
                                         "    from: a.w\n"
                                         "    shard: {tp: 7}\n"
                                         "  - rollout: b.w\n"
                                         "    from: b.w\n"
                                         "    shard: {tp: rank0}\n"
                                         "  - rollout: c.w\n"
                                         "    from: c.w\n"
                                         "    shard: {tp: 1, pad: 64}\n"
                                         "  - rollout: d.w\n"
                                         "    from: d.w\n"
                                         "    shard: {tp: 0, pad: 64, head_dim: 128}\n"
                                         "  - rollout: e.w\n"
                                         "    from: e.w\n"
                                         "    shard: {ep: 1}\n");
    struct wb_errlist el;
    wb_errlist_init(&el);
    struct wb_match_rules *r = NULL;
    CHECK_INT(wb_match_rules_load(path, &r, &el), -WB_E_CONFIG);
    CHECK(r == NULL);
    EXPECT(&el, fmt("%s:5:12: shard: tp: '7': expected a dim 0..5 (or rank0 with ep)", path),
           fmt("%s:8:12: shard: tp: rank0 only with ep: 0 (a FusedMoE tensor that tp rank 0 holds "
               "whole without EP)",
               path),
           fmt("%s:11:12: shard: pad: 64: needs tp: 0 (vocab rows) without ep, and at most 65536",
               path),
           fmt("%s:14:12: shard: head_dim and pad do not go together", path),
           fmt("%s:17:12: shard: tp must be a dim 0..5 and ep must be 0 (experts)", path));
    wb_errlist_free(&el);
}

/* ---------------------------------------------------------------- wb-match */

static char bin[512];

static const char *match_bin(void)
{
    const char *dir = getenv("WB_BIN");
    snprintf(bin, sizeof(bin), "%s/wb-match", dir ? dir : "build/bin");
    if (access(bin, X_OK) != 0)
        wb_test_skip("%s not built", bin);
    return bin;
}

static void wbm(const char *want, int want_rc, ...)
{
    char *argv[16] = {(char *)match_bin(), "--family", (char *)QWEN3, "--config",
                      "configs/hf/Qwen3-8B.json"};
    int n = 5;
    va_list ap;
    va_start(ap, want_rc);
    for (const char *a; (a = va_arg(ap, const char *)) != NULL && n < 15;)
        argv[n++] = (char *)a;
    va_end(ap);
    argv[n] = NULL;
    char out[16384];
    CHECK_INT(wb_test_capture(run_argv, argv, out, sizeof(out)), want_rc);
    CHECK_STR(out, want);
}

static void test_wb_match_options(void)
{
    wbm("wb-match: --tp '0': expected an integer 1..4096\n", 2, "--tp", "0", NULL);
    wbm("wb-match: --tp 'abc': expected an integer 1..4096\n", 2, "--tp", "abc", NULL);
    wbm("wb-match: --tp '8x': expected an integer 1..4096\n", 2, "--tp", "8x", NULL);
    wbm("wb-match: --ep '-1': expected an integer 1..4096\n", 2, "--ep", "-1", NULL);
    wbm("wb-match: --rank 100: a replica of tp 8 / ep 1 has ranks 0..7\n", 2, "--rank", "100",
        "--tp", "8", NULL);
    wbm("wb-match: --rank needs --tp or --ep\n", 2, "--rank", "1", NULL);
    wbm("wb-match: --tp 3 and --ep 2: the smaller must divide the larger\n", 2, "--tp", "3", "--ep",
        "2", NULL);
    wbm("wb-match: --tp 8 and --ep 4: vLLM's expert parallelism is off (--ep 1) or spans the "
        "replica (--ep = tp x data-parallel size, at least --tp)\n",
        2, "--tp", "8", "--ep", "4", NULL);
    wbm("wb-match: vars 'nope=1': 'nope' is not one of configs/models/qwen3.yaml's vars "
        "(head_dim, mesh_tp, make_vocab_size_divisible_by, padded_vocab_size)\nwb-match: 1 "
        "problem\n",
        1, "--var", "nope=1", NULL);
}

const struct wb_test wb_tests[] = {
    {"layer_start_int64_min", test_layer_start_int64_min, 10},
    {"negative_layer_count", test_negative_layer_count, 0},
    {"boolean_layer_count", test_boolean_layer_count, 0},
    {"dimension_2_62", test_dimension_2_62, 0},
    {"string_for_a_number", test_string_for_a_number, 0},
    {"float_for_a_number", test_float_for_a_number, 0},
    {"list_for_a_number", test_list_for_a_number, 0},
    {"zero_size", test_zero_size, 0},
    {"heads_not_dividing", test_heads_not_dividing, 0},
    {"missing_vocab", test_missing_vocab, 0},
    {"moe_config_to_dense_family", test_moe_config_to_dense_family, 0},
    {"model_type_missing_or_not_a_string", test_model_type_missing_or_not_a_string, 0},
    {"big_integer_and_dotted_keys", test_big_integer_and_dotted_keys, 0},
    {"negation_overflow", test_negation_overflow, 0},
    {"tie_word_embeddings_2", test_tie_word_embeddings_2, 0},
    {"attention_bias_2", test_attention_bias_2, 0},
    {"config_json_nesting", test_config_json_nesting, 0},
    {"mtp_hint", test_mtp_hint, 0},
    {"job_vars", test_job_vars, 0},
    {"nested_loops_product", test_nested_loops_product, 10},
    {"single_loop_too_long", test_single_loop_too_long, 10},
    {"too_many_tensors", test_too_many_tensors, 20},
    {"loop_variable_names", test_loop_variable_names, 0},
    {"oom_child", test_oom_child, 0},
    {"oom_is_an_error", test_oom_is_an_error, 30},
    {"bf16_scales_one_line", test_bf16_scales_one_line, 0},
    {"family_file_mistakes", test_family_file_mistakes, 0},
    {"rule_shard_mistakes", test_rule_shard_mistakes, 0},
    {"wb_match_options", test_wb_match_options, 0},
    {0},
};
