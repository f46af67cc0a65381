/* matcher_expr_test.c — the matcher's small languages on their own: integer expressions
 * (precedence, functions, config lookups, errors), name templates, and name patterns with
 * captures. These are private to matcher/ (matcher/mpriv.h). */
#include "matcher/mpriv.h"
#include "tests/wbtest.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static struct wb_jcfg *cfg(void)
{
    const char *p = wb_test_write_file(
        "c.json", "{\"hidden_size\": 4096, \"heads\": 32, \"tie\": true, \"eps\": 1e-06, "
                  "\"skip\": [0, 3], \"nothing\": null, \"name\": \"x\", "
                  "\"quant\": {\"method\": \"fp8\", \"block\": [128, 128]}}");
    struct wb_errlist el;
    wb_errlist_init(&el);
    struct wb_jcfg *c = NULL;
    CHECK_INT(mx_jcfg_load(p, &c, &el), 0);
    wb_errlist_free(&el);
    return c;
}

static int64_t ev(const char *text, struct wb_xenv *env)
{
    struct wb_expr *e;
    char err[256];
    int r = mx_expr_compile(text, &e, err, sizeof(err));
    if (r)
        wb_test_fail(__FILE__, __LINE__, "'%s': %s", text, err);
    int64_t v = -999;
    r = mx_expr_eval(e, env, &v, err, sizeof(err));
    mx_expr_free(e);
    if (r)
        wb_test_fail(__FILE__, __LINE__, "'%s': %s", text, err);
    return v;
}

static void ev_err(const char *text, struct wb_xenv *env, int want, const char *msg)
{
    struct wb_expr *e;
    char err[256];
    int r = mx_expr_compile(text, &e, err, sizeof(err));
    if (r == 0) {
        int64_t v;
        r = mx_expr_eval(e, env, &v, err, sizeof(err));
        mx_expr_free(e);
    }
    CHECK_INT(r, want);
    CHECK_STR(err, msg);
}

static void test_arithmetic(void)
{
    struct wb_xvar vars[] = {{"layer", 3}, {"e", 7}};
    struct wb_jcfg *c = cfg();
    struct wb_xenv env = {.vars = vars, .nvars = 2, .cfg = c};
    CHECK_INT(ev("1 + 2 * 3", &env), 7);
    CHECK_INT(ev("(1 + 2) * 3", &env), 9);
    CHECK_INT(ev("hidden_size / heads", &env), 128);
    CHECK_INT(ev("-7 / 2", &env), -3); /* truncates like C */
    CHECK_INT(ev("7 % 4 - -1", &env), 4);
    CHECK_INT(ev("ceil_div(2112, 128)", &env), 17);
    CHECK_INT(ev("min(layer, e) + max(layer, e)", &env), 10);
    CHECK_INT(ev("layer >= 3 && e < 8", &env), 1);
    CHECK_INT(ev("layer == 2 || !tie", &env), 0);
    CHECK_INT(ev("layer != 3 ? 100 : 200", &env), 200);
    CHECK_INT(ev("1 < 2 == 1", &env), 1);
    CHECK_INT(ev("contains(skip, layer)", &env), 1);
    CHECK_INT(ev("contains(skip, e)", &env), 0);
    CHECK_INT(
        ev("defined(quant) + defined(quant.method) + defined(nothing) + defined(layer)", &env), 3);
    CHECK_INT(ev("  layer*2+e  ", &env), 13);
    mx_jcfg_free(c);
}

static void test_derived_values(void)
{
    struct wb_jcfg *c = cfg();
    struct wb_xderived d[2] = {{.name = "head_dim"}, {.name = "loop"}};
    char err[256];
    CHECK_INT(mx_expr_compile("hidden_size / heads", &d[0].e, err, sizeof(err)), 0);
    CHECK_INT(mx_expr_compile("loop + 1", &d[1].e, err, sizeof(err)), 0);
    snprintf(d[1].where, sizeof(d[1].where), "f.yaml:3:9");
    struct wb_xenv env = {.cfg = c, .derived = d, .nderived = 2};
    CHECK_INT(ev("2 * head_dim", &env), 256);
    ev_err("loop", &env, -EINVAL, "'loop' is defined in terms of itself (f.yaml:3:9)");
    mx_expr_free(d[0].e);
    mx_expr_free(d[1].e);
    mx_jcfg_free(c);
}

static void test_expression_errors(void)
{
    struct wb_jcfg *c = cfg();
    struct wb_xenv env = {.cfg = c};
    ev_err("heads**2", &env, -EINVAL, "unexpected '*' at column 7");
    ev_err("(heads", &env, -EINVAL, "expected ')' but found end of expression at column 7");
    ev_err("", &env, -EINVAL, "empty expression: end of expression at column 1");
    ev_err("2heads", &env, -EINVAL, "unexpected 'heads' at column 2");
    ev_err("sqrt(4)", &env, -EINVAL, "unknown function 'sqrt' at column 1");
    ev_err("min(1)", &env, -EINVAL, "expected ',' but found ')' at column 6");
    ev_err("defined(3)", &env, -EINVAL, "expected a field name but found '3' at column 9");
    ev_err("heads $ 2", &env, -EINVAL, "unexpected '$' at column 7");
    ev_err("99999999999999999999", &env, -EINVAL,
           "number too large: '99999999999999999999' at column 1");
    ev_err("layers + 1", &env, -ENOENT, "missing field 'layers'");
    ev_err("eps * 2", &env, -EINVAL, "field 'eps' is not an integer (1e-06)");
    ev_err("name", &env, -EINVAL, "field 'name' is not an integer (\"x\")");
    ev_err("skip", &env, -EINVAL, "field 'skip' is not an integer (a list)");
    ev_err("heads % (heads - 32)", &env, -EDOM, "division by zero");
    ev_err("9223372036854775807 * 2", &env, -ERANGE, "integer overflow");
    ev_err("contains(heads, 1)", &env, -EINVAL, "field 'heads' is not a list of integers");
    mx_jcfg_free(c);
}

/* boolean(name): config.json's true/false, or a job value 0/1; "tie_word_embeddings: 2" (or 1)
 * in config.json is refused instead of read as true. */
static void test_boolean(void)
{
    const char *p = wb_test_write_file(
        "b.json", "{\"tie\": true, \"untie\": false, \"two\": 2, \"one\": 1, \"s\": \"yes\"}");
    struct wb_errlist el;
    wb_errlist_init(&el);
    struct wb_jcfg *c = NULL;
    CHECK_INT(mx_jcfg_load(p, &c, &el), 0);
    struct wb_xvar sets[] = {{"flag", 1}, {"two", 0}, {"bad", 3}};
    struct wb_xenv env = {.cfg = c, .sets = sets, .nsets = 3};
    CHECK_INT(ev("boolean(tie)", &env), 1);
    CHECK_INT(ev("boolean(untie) == 0", &env), 1);
    CHECK_INT(ev("boolean(flag)", &env), 1);
    CHECK_INT(ev("boolean(two)", &env), 0); /* the job's value wins over config.json's */
    ev_err("boolean(one)", &env, -EINVAL, "field 'one' is 1, not a boolean (true or false)");
    ev_err("boolean(bad)", &env, -EINVAL, "'bad' is 3, not a boolean (0 or 1)");
    ev_err("boolean(s)", &env, -EINVAL, "field 's' is not an integer (\"yes\")");
    ev_err("boolean(nope)", &env, -ENOENT, "missing field 'nope'");
    struct wb_xenv cfg_only = {.cfg = c};
    ev_err("boolean(two) == 0", &cfg_only, -EINVAL,
           "field 'two' is 2, not a boolean (true or false)");
    mx_jcfg_free(c);
    wb_errlist_free(&el);
}

/* 100,000 levels of '(' / '!' / '-' or an operator chain of 100,000 terms overflowed the
 * parser's or the evaluator's stack (SIGSEGV); nesting is refused past 200 levels, at the
 * column where it passes the bound, and 200 levels still work. */
static char *repeat(const char *unit, size_t n, const char *tail)
{
    size_t u = strlen(unit), t = strlen(tail);
    char *s = malloc(u * n + t + 1);
    CHECK(s != NULL);
    for (size_t i = 0; i < n; i++)
        memcpy(s + i * u, unit, u);
    memcpy(s + u * n, tail, t + 1);
    return s;
}

static void test_nesting_bounded(void)
{
    struct wb_xenv env = {0};
    const char *deep = "expression nested deeper than 200 levels at column ";
    char want[96];
    struct {
        const char *unit, *tail;
        size_t n;
        int column; /* 0: compiles; evaluates to `value` */
        int64_t value;
    } cases[] = {
        {"(", "1", 100000, 201, 0},    {"!", "1", 100000, 201, 0},
        {"-", "1", 100000, 201, 0},    {"1+", "1", 100000, 402, 0},
        {"1?", "1:0", 100000, 401, 0}, {"max(1,", "1", 100000, 1199, 0},
        {"(", "1", 199, 0, 1},         {"-", "1", 198, 0, 1},
        {"1+", "1", 199, 0, 200},
    };
    for (size_t i = 0; i < WB_ARRAY_LEN(cases); i++) {
        char *text = repeat(cases[i].unit, cases[i].n, cases[i].tail);
        if (cases[i].column) {
            snprintf(want, sizeof(want), "%s%d", deep, cases[i].column);
            ev_err(text, &env, -EINVAL, want);
        } else if (cases[i].unit[0] == '(') {
            /* balanced: close every '(' */
            char *closed = repeat(")", cases[i].n, "");
            char *full = malloc(strlen(text) + strlen(closed) + 1);
            CHECK(full != NULL);
            strcpy(full, text);
            strcat(full, closed);
            CHECK_INT(ev(full, &env), cases[i].value);
            free(full);
            free(closed);
        } else
            CHECK_INT(ev(text, &env), cases[i].value);
        free(text);
    }
}

static void test_templates(void)
{
    struct wb_xvar vars[] = {{"layer", 12}, {"expert", 0}};
    struct wb_xenv env = {.vars = vars, .nvars = 2};
    struct wb_tmpl *t;
    char err[256], buf[WB_NAME_MAX];
    CHECK_INT(
        mx_tmpl_compile("model.layers.{layer}.mlp.experts.{expert + 1}.w", &t, err, sizeof(err)),
        0);
    CHECK_INT(mx_tmpl_render(t, &env, buf, sizeof(buf), err, sizeof(err)), 0);
    CHECK_STR(buf, "model.layers.12.mlp.experts.1.w");
    CHECK_INT(mx_tmpl_render(t, &env, buf, 10, err, sizeof(err)), -ENAMETOOLONG);
    CHECK_STR(err, "name longer than 9 bytes");
    mx_tmpl_free(t);
    CHECK_INT(mx_tmpl_compile("a.{layer", &t, err, sizeof(err)), -EINVAL);
    CHECK_STR(err, "'{' without '}' at column 3");
    CHECK_INT(mx_tmpl_compile("a.}b", &t, err, sizeof(err)), -EINVAL);
    CHECK_STR(err, "'}' without '{' at column 3");
    CHECK_INT(mx_tmpl_compile("a.{layer+}", &t, err, sizeof(err)), -EINVAL);
    CHECK_STR(err, "in '{layer+}': unexpected end of expression at column 7");
}

static void test_patterns(void)
{
    struct wb_pat p, t;
    struct wb_caps caps;
    char err[256], buf[WB_NAME_MAX];
    CHECK_INT(mx_pat_compile("model.layers.{L}.mlp.*down_proj.weight", &p, err, sizeof(err)), 0);
    CHECK(mx_pat_match(&p, "model.layers.17.mlp.shared_experts.down_proj.weight", &caps));
    CHECK_INT(caps.n, 2);
    CHECK_STR(caps.name[0], "L");
    CHECK_INT(caps.len[0], 2);
    CHECK(mx_pat_match(&p, "model.layers.3.mlp.down_proj.weight", &caps));
    CHECK_INT(caps.len[1], 0);
    CHECK(!mx_pat_match(&p, "model.layers.x.mlp.down_proj.weight", &caps));
    CHECK(!mx_pat_match(&p, "model.layers.3.mlp.down_proj.weight2", &caps));
    CHECK(mx_pat_match(&p, "model.layers.17.mlp.shared_experts.down_proj.weight", &caps));
    CHECK_INT(mx_pat_compile("blocks.{L}.ffn.*w2.{E}", &t, err, sizeof(err)), 0);
    CHECK_INT(mx_pat_subst(&t, &caps, "E", 42, buf, sizeof(buf)), 0);
    CHECK_STR(buf, "blocks.17.ffn.shared_experts.w2.42");
    CHECK_INT(mx_pat_subst(&t, &caps, NULL, 0, buf, sizeof(buf)), -ENOENT);
    CHECK_INT(mx_pat_subst(&t, &caps, "E", 42, buf, 8), -ENAMETOOLONG);
    CHECK(mx_pat_has_cap(&t, "E"));
    CHECK(!mx_pat_has_cap(&t, "X"));
    mx_pat_free(&p);
    mx_pat_free(&t);
    CHECK_INT(mx_pat_compile("a.{1x}.b", &p, err, sizeof(err)), -EINVAL);
    CHECK_STR(err, "bad capture at column 3 of 'a.{1x}.b' (want {NAME})");
    CHECK_INT(mx_pat_compile("a.{L}*", &p, err, sizeof(err)), -EINVAL);
    CHECK_STR(err, "two captures in a row at column 6 of 'a.{L}*'");
    char label[64];
    mx_name_label("model.layers.0.self_attn.q_proj.weight", label, sizeof(label));
    CHECK_STR(label, "q_proj");
    mx_name_label("model.layers.0.mlp.experts.w13_weight", label, sizeof(label));
    CHECK_STR(label, "w13_weight");
    mx_name_label("lm_head", label, sizeof(label));
    CHECK_STR(label, "lm_head");
}

const struct wb_test wb_tests[] = {
    {"arithmetic", test_arithmetic, 0},
    {"derived_values", test_derived_values, 0},
    {"expression_errors", test_expression_errors, 0},
    {"nesting_bounded", test_nesting_bounded, 0},
    {"boolean", test_boolean, 0},
    {"templates", test_templates, 0},
    {"patterns", test_patterns, 0},
    {0},
};
