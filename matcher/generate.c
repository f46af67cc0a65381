/* generate.c — model-family files: opening and checking one (shared with rules.c), and
 * generating a parameter inventory from a Hugging Face config.json plus the family file's
 * "trainer" or "rollout" section. The file format's reference is configs/models/README.md.
 *
 * A section is a list of blocks:
 *   - for: {layer: num_hidden_layers, expert: [0, n_routed_experts]}   # nested loops
 *     when: layer >= first_k_dense_replace                             # condition
 *     dtype: bf16                                                      # default dtype
 *     fp8: defined(quantization_config)     # FP8 block-quantized values + FP32 scales
 *     tensors:
 *       model.layers.{layer}.mlp.experts.{expert}.gate_proj.weight: [moe_intermediate_size,
 * hidden_size] model.layers.{layer}.mlp.gate.e_score_correction_bias: {shape: [n_routed_experts],
 * dtype: fp32} Everything in braces and every shape entry is an expression (expr.c) over the loop
 * variables, the config.json fields and the family's `vars` (defaults for fields a config
 * lacks). All expressions are compiled before anything runs, so a syntax error anywhere is
 * reported with its file:line:col even if that block would never run. */
#include "matcher/mpriv.h"

#include <ctype.h>
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- family files */

struct top {
    char *family, *description;
    const struct wb_ynode *model_type, *checks, *vars, *quant, *ignore, *trainer, *rollout, *rules,
        *namings;
};

static const struct wb_cfg_field top_table[] = {
    {"family", WB_CFG_STR, NULL, "family name", offsetof(struct top, family), NULL, NULL},
    {"description", WB_CFG_STR, "", "what the file covers", offsetof(struct top, description), NULL,
     NULL},
    {"model_type", WB_CFG_NODE, "",
     "config.json model_type values the file covers (a name or a list); others are refused",
     offsetof(struct top, model_type), NULL, NULL},
    {"namings", WB_CFG_NODE, "",
     "trainer namings the file describes (a list; the first is the default): hf when absent",
     offsetof(struct top, namings), NULL, NULL},
    {"checks", WB_CFG_NODE, "",
     "conditions over config.json fields that must hold (a list of expressions)",
     offsetof(struct top, checks), NULL, NULL},
    {"vars", WB_CFG_NODE, "",
     "derived values: name: expression, used when config.json lacks"
     " the name",
     offsetof(struct top, vars), NULL, NULL},
    {"quant", WB_CFG_NODE, "", "FP8 block quantization: scale_suffix, block, fp8 patterns",
     offsetof(struct top, quant), NULL, NULL},
    {"ignore", WB_CFG_NODE, "", "trainer/rollout name patterns left out of the match",
     offsetof(struct top, ignore), NULL, NULL},
    {"trainer", WB_CFG_NODE, "", "trainer-side inventory generator", offsetof(struct top, trainer),
     NULL, NULL},
    {"rollout", WB_CFG_NODE, "", "rollout-side inventory generator", offsetof(struct top, rollout),
     NULL, NULL},
    {"rules", WB_CFG_NODE, "", "how each rollout tensor is built", offsetof(struct top, rules),
     NULL, NULL},
    {0},
};

struct quant {
    char *scale_suffix;
    uint64_t block;
    const struct wb_ynode *fp8;
};

static const struct wb_cfg_field quant_table[] = {
    {"scale_suffix", WB_CFG_STR, "_scale_inv", "scale tensor = value tensor name + suffix",
     offsetof(struct quant, scale_suffix), NULL, NULL},
    {"block", WB_CFG_U64, "128", "quantization block edge: 128 (the only one quant/ produces)",
     offsetof(struct quant, block), NULL, NULL},
    {"fp8", WB_CFG_NODE, "", "rollout name patterns that may be FP8 block-quantized",
     offsetof(struct quant, fp8), NULL, NULL},
    {0},
};

struct ignore {
    const struct wb_ynode *trainer, *rollout;
};

static const struct wb_cfg_field ignore_table[] = {
    {"trainer", WB_CFG_NODE, "", "trainer tensors that may stay unused",
     offsetof(struct ignore, trainer), NULL, NULL},
    {"rollout", WB_CFG_NODE, "", "rollout tensors nothing writes", offsetof(struct ignore, rollout),
     NULL, NULL},
    {0},
};

void mx_family_vars_free(struct wb_xderived *v, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        free(v[i].name);
        mx_expr_free(v[i].e);
    }
    free(v);
}

static int family_vars(const struct wb_yaml *y, const struct wb_ynode *node,
                       struct wb_xderived **out, size_t *nout, struct wb_errlist *el)
{
    size_t n = wb_ynode_len(node);
    char at[300], err[256];
    *out = NULL;
    *nout = 0;
    if (!node)
        return 0;
    if (wb_ynode_kind(node) != WB_YNODE_MAP) {
        wb_errlist_add(el, "%s: vars: expected a mapping name: expression",
                       wb_yaml_where(y, node, at, sizeof(at)));
        return -WB_E_CONFIG;
    }
    struct wb_xderived *v = calloc(n + 1, sizeof(*v));
    if (!v)
        return -ENOMEM;
    int r = 0;
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        const struct wb_ynode *key, *val;
        wb_ynode_pair(y, node, i, &key, &val);
        const char *name = wb_ynode_scalar(key), *text = wb_ynode_scalar(val);
        wb_yaml_where(y, val, at, sizeof(at));
        if (!name || !text) {
            wb_errlist_add(el, "%s: vars: expected name: expression", at);
            r = -WB_E_CONFIG;
            continue;
        }
        if (mx_expr_compile(text, &v[k].e, err, sizeof(err))) {
            wb_errlist_add(el, "%s: vars.%s: bad expression '%s': %s", at, name, text, err);
            r = -WB_E_CONFIG;
            continue;
        }
        v[k].name = strdup(name);
        snprintf(v[k].where, sizeof(v[k].where), "%s", at);
        k++;
        if (!v[k - 1].name) {
            r = -ENOMEM;
            break;
        }
    }
    if (r) {
        mx_family_vars_free(v, k);
        return r;
    }
    *out = v;
    *nout = k;
    return 0;
}

static bool is_name(const char *s)
{
    if (!(isalpha((unsigned char)*s) || *s == '_'))
        return false;
    for (s++; *s; s++)
        if (!(isalnum((unsigned char)*s) || *s == '_'))
            return false;
    return true;
}

/* "hf, megatron, megatron_local" */
static void namings_str(const struct wb_family *f, char *buf, size_t cap)
{
    size_t pos = 0;
    buf[0] = 0;
    for (size_t i = 0; i < f->nnamings && pos < cap; i++)
        pos += (size_t)snprintf(buf + pos, cap - pos, "%s%s", i ? ", " : "", f->namings[i]);
}

/* namings: [hf, fused, ...] — absent: [hf]. */
static int family_namings(struct wb_family *f, const struct wb_ynode *node, struct wb_errlist *el)
{
    char at[300];
    if (!node) {
        if (!(f->namings[0] = strdup("hf")))
            return -ENOMEM;
        f->nnamings = 1;
        return 0;
    }
    wb_yaml_where(f->y, node, at, sizeof(at));
    size_t n = wb_ynode_kind(node) == WB_YNODE_SEQ ? wb_ynode_len(node) : 0;
    if (n == 0 || n > WB_NAMING_MAX) {
        wb_errlist_add(el,
                       "%s: namings: expected a list of 1 to %d naming names, such as [hf, "
                       "megatron]",
                       at, WB_NAMING_MAX);
        return -WB_E_CONFIG;
    }
    int r = 0;
    for (size_t i = 0; i < n; i++) {
        const struct wb_ynode *it = wb_ynode_item(f->y, node, i);
        const char *name = wb_ynode_scalar(it);
        wb_yaml_where(f->y, it, at, sizeof(at));
        if (!name || !is_name(name)) {
            wb_errlist_add(el, "%s: namings[%zu]: expected a name of letters, digits and _", at, i);
            r = -WB_E_CONFIG;
            continue;
        }
        for (size_t k = 0; k < f->nnamings; k++)
            if (strcmp(f->namings[k], name) == 0) {
                wb_errlist_add(el, "%s: namings: '%s' listed twice", at, name);
                r = -WB_E_CONFIG;
            }
        if (!(f->namings[f->nnamings] = strdup(name)))
            return -ENOMEM;
        f->nnamings++;
    }
    return r;
}

int mx_naming_mask(const struct wb_family *f, const struct wb_ynode *node, uint32_t *mask,
                   struct wb_errlist *el)
{
    uint32_t all = f->nnamings >= 32 ? UINT32_MAX : (1u << f->nnamings) - 1, m = 0;
    if (!node) {
        *mask = all;
        return 0;
    }
    bool list = wb_ynode_kind(node) == WB_YNODE_SEQ;
    size_t n = list ? wb_ynode_len(node) : 1;
    char at[300], names[WB_NAMING_MAX * 40];
    int r = 0;
    if (n == 0) {
        wb_errlist_add(el, "%s: naming: an empty list selects no naming",
                       wb_yaml_where(f->y, node, at, sizeof(at)));
        return -WB_E_CONFIG;
    }
    for (size_t i = 0; i < n; i++) {
        const struct wb_ynode *it = list ? wb_ynode_item(f->y, node, i) : node;
        const char *name = wb_ynode_scalar(it);
        wb_yaml_where(f->y, it, at, sizeof(at));
        size_t k = 0;
        while (name && k < f->nnamings && strcmp(f->namings[k], name) != 0)
            k++;
        if (!name || k == f->nnamings) {
            namings_str(f, names, sizeof(names));
            wb_errlist_add(el, "%s: naming: '%s' is not one of the file's namings (%s)", at,
                           name ? name : "(a collection)", names);
            r = -WB_E_CONFIG;
            continue;
        }
        m |= 1u << k;
    }
    if (!r)
        *mask = m;
    return r;
}

int mx_naming_index(const struct wb_family *f, const char *path, const char *name, uint32_t *idx,
                    struct wb_errlist *el)
{
    if (!name || !*name) {
        *idx = 0;
        return 0;
    }
    for (size_t k = 0; k < f->nnamings; k++)
        if (strcmp(f->namings[k], name) == 0) {
            *idx = (uint32_t)k;
            return 0;
        }
    char names[WB_NAMING_MAX * 40];
    namings_str(f, names, sizeof(names));
    wb_errlist_add(el, "naming '%s': not one of %s's namings (%s)", name, path, names);
    return -WB_E_CONFIG;
}

void mx_family_free_types(char **types, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(types[i]);
    free(types);
}

/* model_type: a name or a list of names (config.json model_type values the file covers). */
static int family_model_types(struct wb_family *f, const struct wb_ynode *node,
                              struct wb_errlist *el)
{
    if (!node)
        return 0;
    wb_yaml_where(f->y, node, f->model_type_at, sizeof(f->model_type_at));
    bool seq = wb_ynode_kind(node) == WB_YNODE_SEQ;
    size_t n = seq ? wb_ynode_len(node) : 1;
    if (!(f->model_types = calloc(n + 1, sizeof(char *))))
        return -ENOMEM;
    for (size_t i = 0; i < n; i++) {
        const struct wb_ynode *it = seq ? wb_ynode_item(f->y, node, i) : node;
        const char *t = wb_ynode_scalar(it);
        if (!t || !*t) {
            char at[300];
            wb_errlist_add(el, "%s: model_type: expected a name or a list of names",
                           wb_yaml_where(f->y, it, at, sizeof(at)));
            return -WB_E_CONFIG;
        }
        if (!(f->model_types[f->nmodel_types] = strdup(t)))
            return -ENOMEM;
        f->nmodel_types++;
    }
    if (!n) {
        wb_errlist_add(el, "%s: model_type: an empty list covers no model", f->model_type_at);
        return -WB_E_CONFIG;
    }
    return 0;
}

int mx_check_model_type(char *const *types, size_t n, const char *at, const struct wb_jcfg *cfg,
                        struct wb_errlist *el)
{
    if (!n)
        return 0;
    char list[256];
    size_t pos = 0;
    list[0] = 0;
    for (size_t i = 0; i < n && pos < sizeof(list); i++)
        pos += (size_t)snprintf(list + pos, sizeof(list) - pos, "%s%s", i ? ", " : "", types[i]);
    const struct wb_jval *v = mx_jcfg_get(cfg, "model_type", strlen("model_type"));
    if (!v) {
        wb_errlist_add(el, "%s: model_type: missing; the family file covers %s (%s)", cfg->path,
                       list, at);
        return -WB_E_CONFIG;
    }
    if (!v->str) {
        wb_errlist_add(el, "%s: model_type: %s: expected a string", cfg->path,
                       v->kind == WB_J_OTHER  ? v->text
                       : v->kind == WB_J_LIST ? "a list"
                                              : "a number");
        return -WB_E_CONFIG;
    }
    for (size_t i = 0; i < n; i++)
        if (strcmp(types[i], v->str) == 0)
            return 0;
    wb_errlist_add(el,
                   "%s: model_type: %s: not a model this family file covers (%s: model_type: %s)",
                   cfg->path, v->str, at, list);
    return -WB_E_CONFIG;
}

/* "[64, 64]", or the value's JSON text. */
static const char *jval_str(const struct wb_jval *v, char *buf, size_t cap)
{
    if (v->kind == WB_J_OTHER)
        return v->str ? v->str : v->text;
    if (v->kind == WB_J_INT) {
        snprintf(buf, cap, v->is_bool ? (v->i ? "true" : "false") : "%lld", (long long)v->i);
        return buf;
    }
    size_t pos = (size_t)snprintf(buf, cap, "[");
    for (size_t i = 0; i < v->nlist && pos < cap; i++)
        pos +=
            (size_t)snprintf(buf + pos, cap - pos, "%s%lld", i ? ", " : "", (long long)v->list[i]);
    if (pos < cap)
        snprintf(buf + pos, cap - pos, "]");
    return buf;
}

int mx_check_quant_config(const struct wb_jcfg *cfg, struct wb_errlist *el)
{
    static const char pre[] = "quantization_config";
    const size_t pl = sizeof(pre) - 1;
    const char *path = cfg->path;
    char buf[256];
    const struct wb_jval *top = mx_jcfg_get(cfg, pre, pl);
    if (top) { /* a value, not an object (nulls are left out: no quantization) */
        wb_errlist_add(el, "%s: %s: %s: expected an object", path, pre,
                       jval_str(top, buf, sizeof(buf)));
        return -WB_E_CONFIG;
    }
    size_t first = cfg->n;
    for (size_t i = 0; i < cfg->n && first == cfg->n; i++)
        if (strncmp(cfg->v[i].name, pre, pl) == 0 && cfg->v[i].name[pl] == '.')
            first = i;
    if (first == cfg->n)
        return 0; /* no quantization: every tensor stays in the family's dtype */
    const struct wb_jval *m = mx_jcfg_get(cfg, "quantization_config.quant_method",
                                          strlen("quantization_config.quant_method"));
    if (!m || !m->str) {
        wb_errlist_add(el, "%s: quantization_config.quant_method: %s", path,
                       m ? "expected a string" : "missing");
        return -WB_E_CONFIG;
    }
    if (strcmp(m->str, "fp8") != 0) {
        wb_errlist_add(el,
                       "%s: quantization_config.quant_method: %s: not produced by weightbridge "
                       "(only fp8 with %ux%u blocks); for a BF16 rollout give a config.json "
                       "without quantization_config, this one for the trainer side only "
                       "(wb-match --config BF16.json --trainer-config %s)",
                       path, m->str, WB_FP8_BLOCK, WB_FP8_BLOCK, path);
        return -WB_E_CONFIG;
    }
    int r = 0;
    const struct wb_jval *bs = mx_jcfg_get(cfg, "quantization_config.weight_block_size",
                                           strlen("quantization_config.weight_block_size"));
    if (!bs) {
        wb_errlist_add(el,
                       "%s: quantization_config.weight_block_size: missing: only %ux%u FP8 "
                       "blocks are produced (quant/), not per-tensor scales",
                       path, WB_FP8_BLOCK, WB_FP8_BLOCK);
        r = -WB_E_CONFIG;
    } else if (bs->kind != WB_J_LIST || bs->nlist != 2 || bs->list[0] != WB_FP8_BLOCK ||
               bs->list[1] != WB_FP8_BLOCK) {
        wb_errlist_add(el,
                       "%s: quantization_config.weight_block_size: %s: only %ux%u FP8 blocks are "
                       "produced (quant/)",
                       path, jval_str(bs, buf, sizeof(buf)), WB_FP8_BLOCK, WB_FP8_BLOCK);
        r = -WB_E_CONFIG;
    }
    /* the other keys an FP8 block config may have, each with the one value produced */
    static const struct {
        const char *key, *want, *why;
    } keys[] = {{"quantization_config.fmt", "e4m3", "only e4m3 values are produced (quant/)"},
                {"quantization_config.activation_scheme", "dynamic",
                 "only dynamic activation scales (no input_scale tensors are produced)"}};
    for (size_t k = 0; k < WB_ARRAY_LEN(keys); k++) {
        const struct wb_jval *v = mx_jcfg_get(cfg, keys[k].key, strlen(keys[k].key));
        if (v && (!v->str || strcmp(v->str, keys[k].want) != 0)) {
            wb_errlist_add(el, "%s: %s: %s: %s", path, keys[k].key, jval_str(v, buf, sizeof(buf)),
                           keys[k].why);
            r = -WB_E_CONFIG;
        }
    }
    /* anything else (modules_to_not_convert, ignored_layers, ...) would change which tensors
     * are FP8; the family's fp8 blocks say that, so such a key is refused, once per key */
    const char *last = NULL;
    size_t last_len = 0;
    for (size_t i = first; i < cfg->n; i++) {
        const char *nm = cfg->v[i].name;
        if (strncmp(nm, pre, pl) != 0 || nm[pl] != '.')
            break;
        const char *key = nm + pl + 1;
        size_t kl = strcspn(key, ".");
        static const char *const known[] = {"quant_method", "weight_block_size", "fmt",
                                            "activation_scheme"};
        bool ok = false;
        for (size_t k = 0; k < WB_ARRAY_LEN(known); k++)
            ok = ok || (strlen(known[k]) == kl && strncmp(known[k], key, kl) == 0);
        if (ok || (last && last_len == kl && strncmp(last, key, kl) == 0))
            continue;
        last = key;
        last_len = kl;
        wb_errlist_add(el,
                       "%s: quantization_config.%.*s: not supported (the family file says which "
                       "tensors are FP8)",
                       path, (int)kl, key);
        r = -WB_E_CONFIG;
    }
    return r;
}

/* checks: a list of expressions, each compiled once (so a syntax error is reported with its
 * place even when no config is given). */
static int family_checks(struct wb_family *f, const struct wb_ynode *node, struct wb_errlist *el)
{
    char at[300], err[256];
    if (!node)
        return 0;
    if (wb_ynode_kind(node) != WB_YNODE_SEQ) {
        wb_errlist_add(el, "%s: checks: expected a list of expressions",
                       wb_yaml_where(f->y, node, at, sizeof(at)));
        return -WB_E_CONFIG;
    }
    size_t n = wb_ynode_len(node);
    if (!(f->checks = calloc(n + 1, sizeof(*f->checks))))
        return -ENOMEM;
    int r = 0;
    for (size_t i = 0; i < n; i++) {
        const struct wb_ynode *it = wb_ynode_item(f->y, node, i);
        const char *text = wb_ynode_scalar(it);
        struct wb_xderived *c = &f->checks[f->nchecks];
        wb_yaml_where(f->y, it, at, sizeof(at));
        if (!text) {
            wb_errlist_add(el, "%s: checks: expected an expression", at);
            r = -WB_E_CONFIG;
            continue;
        }
        int e = mx_expr_compile(text, &c->e, err, sizeof(err));
        if (e) {
            wb_errlist_add(el, "%s: checks: bad expression '%s': %s", at, text, err);
            r = e == -ENOMEM ? e : -WB_E_CONFIG;
            continue;
        }
        snprintf(c->where, sizeof(c->where), "%s", at);
        f->nchecks++;
        if (!(c->name = strdup(text)))
            return -ENOMEM;
    }
    return r;
}

int mx_vars_parse(const char *text, const struct wb_xderived *dv, size_t ndv, const char *path,
                  struct wb_xvar **out, size_t *nout, char **buf, struct wb_errlist *el)
{
    *out = NULL;
    *nout = 0;
    *buf = NULL;
    if (!text || !*text)
        return 0;
    size_t n = 1;
    for (const char *p = text; *p; p++)
        n += *p == ',';
    char *b = strdup(text);
    struct wb_xvar *v = calloc(n, sizeof(*v));
    if (!b || !v) {
        free(b);
        free(v);
        return -ENOMEM;
    }
    int r = 0;
    size_t k = 0;
    for (char *item = b, *next; item && !r; item = next) {
        next = strchr(item, ',');
        if (next)
            *next++ = 0;
        char *eq = strchr(item, '=');
        int64_t val;
        if (!eq || eq == item || wb_parse_i64(eq + 1, &val)) {
            wb_errlist_add(el, "vars '%s': expected NAME=INTEGER[,NAME=INTEGER...]", text);
            r = -WB_E_CONFIG;
            break;
        }
        *eq = 0;
        size_t d = 0;
        while (d < ndv && strcmp(dv[d].name, item) != 0)
            d++;
        if (d == ndv) {
            char names[256] = "";
            size_t pos = 0;
            for (size_t i = 0; i < ndv && pos < sizeof(names); i++)
                pos += (size_t)snprintf(names + pos, sizeof(names) - pos, "%s%s", i ? ", " : "",
                                        dv[i].name);
            wb_errlist_add(el, "vars '%s': '%s' is not one of %s's vars (%s)", text, item, path,
                           ndv ? names : "it has none");
            r = -WB_E_CONFIG;
            break;
        }
        for (size_t i = 0; i < k; i++)
            if (strcmp(v[i].name, item) == 0) {
                wb_errlist_add(el, "vars '%s': '%s' given twice", text, item);
                r = -WB_E_CONFIG;
            }
        v[k++] = (struct wb_xvar){item, val};
    }
    if (r) {
        free(b);
        free(v);
        return r;
    }
    *out = v;
    *nout = k;
    *buf = b;
    return 0;
}

/* Every check must hold for the config.json; each failing one is reported. A check over a
 * field the config lacks is left to the generator, which names every place needing it. */
static int run_checks(const struct wb_family *f, const struct wb_jcfg *cfg,
                      const struct wb_xvar *sets, size_t nsets, struct wb_errlist *el)
{
    int r = 0;
    for (size_t i = 0; i < f->nchecks; i++) {
        const struct wb_xderived *c = &f->checks[i];
        struct wb_xenv env = {
            .sets = sets, .nsets = nsets, .cfg = cfg, .derived = f->dv, .nderived = f->ndv};
        char err[256];
        int64_t v;
        int e = mx_expr_eval(c->e, &env, &v, err, sizeof(err));
        if (e == -ENOENT) /* the tensors that need the field report it where they need it */
            continue;
        if (e)
            wb_errlist_add(el, "%s: check '%s' (%s): %s", cfg->path, c->name, c->where, err);
        else if (!v)
            wb_errlist_add(el, "%s: check failed: '%s' (%s)", cfg->path, c->name, c->where);
        if (e || !v)
            r = e == -ENOMEM ? e : -WB_E_CONFIG;
    }
    return r;
}

void mx_family_close(struct wb_family *f)
{
    if (!f)
        return;
    mx_family_vars_free(f->checks, f->nchecks);
    mx_family_free_types(f->model_types, f->nmodel_types);
    free(f->family);
    free(f->description);
    free(f->quant.scale_suffix);
    mx_family_vars_free(f->dv, f->ndv);
    for (size_t i = 0; i < f->nnamings; i++)
        free(f->namings[i]);
    wb_yaml_free(f->y);
    free(f);
}

int mx_family_open(const char *path, struct wb_family **out, struct wb_errlist *el)
{
    struct wb_family *f = calloc(1, sizeof(*f));
    if (!f)
        return -ENOMEM;
    int r = wb_yaml_load(path, el, &f->y);
    if (r) {
        free(f);
        return r;
    }
    struct top t = {0};
    struct quant q = {0};
    struct ignore ig = {0};
    r = wb_cfg_parse(f->y, wb_yaml_root(f->y), top_table, &t, el);
    f->family = t.family;
    f->description = t.description;
    if (r)
        goto err;
    r = wb_cfg_parse(f->y, t.quant, quant_table, &q, el);
    f->quant.scale_suffix = q.scale_suffix;
    f->quant.fp8 = q.fp8;
    if (r)
        goto err;
    if (q.block != WB_FP8_BLOCK) {
        char at[300];
        const struct wb_ynode *bn = wb_ynode_get(f->y, t.quant, "block");
        wb_errlist_add(el, "%s: quant.block: %llu: only %ux%u FP8 blocks are produced (quant/)",
                       wb_yaml_where(f->y, bn ? bn : t.quant, at, sizeof(at)),
                       (unsigned long long)q.block, WB_FP8_BLOCK, WB_FP8_BLOCK);
        r = -WB_E_CONFIG;
        goto err;
    }
    if (!*q.scale_suffix) {
        char at[300];
        const struct wb_ynode *sn = wb_ynode_get(f->y, t.quant, "scale_suffix");
        wb_errlist_add(el, "%s: quant.scale_suffix: must not be empty",
                       wb_yaml_where(f->y, sn ? sn : t.quant, at, sizeof(at)));
        r = -WB_E_CONFIG;
        goto err;
    }
    if ((r = family_model_types(f, t.model_type, el)))
        goto err;
    if ((r = family_namings(f, t.namings, el)))
        goto err;
    if ((r = wb_cfg_parse(f->y, t.ignore, ignore_table, &ig, el)))
        goto err;
    f->ignore.trainer = ig.trainer;
    f->ignore.rollout = ig.rollout;
    f->vars = t.vars;
    f->trainer = t.trainer;
    f->rollout = t.rollout;
    f->rules = t.rules;
    if ((r = family_vars(f->y, t.vars, &f->dv, &f->ndv, el)))
        goto err;
    if ((r = family_checks(f, t.checks, el)))
        goto err;
    *out = f;
    return 0;
err:
    mx_family_close(f);
    return r;
}

/* ---------------------------------------------------------------- the generator */

struct gtensor {
    struct wb_tmpl *name;
    const char *src; /* template text (inside the YAML document) */
    struct wb_expr *dim[WB_MAX_DIMS];
    uint32_t ndim;
    enum wb_dtype dt;
    bool dt_explicit;
    struct wb_expr *when;
    char where[300];
    bool reported; /* an evaluation error was already reported */
};

struct gloop {
    const char *var;
    struct wb_expr *from, *to;
    char where[300];
};

struct gblock {
    struct gloop loop[4];
    size_t nloop;
    struct wb_expr *when, *fp8;
    enum wb_dtype dt;
    struct gtensor *t;
    size_t nt;
    char where[300];
    bool reported;
    uint32_t naming; /* the namings the block belongs to (a bit mask) */
};

struct gen {
    const struct wb_family *f;
    const struct wb_jcfg *cfg;
    struct gblock *b;
    size_t nb;
    struct wb_inventory inv;
    uint32_t *origin; /* per generated parameter: block << 16 | tensor, for duplicate messages */
    size_t origin_cap;
    const struct wb_xvar *sets; /* the job's values of the family's vars */
    size_t nsets;
    uint64_t iters;     /* loop iterations run so far, all levels and blocks together */
    bool too_many;      /* WB_GEN_MAX_TENSORS reached (reported) */
    bool quant_checked; /* quantization_config checked (quant_err is the result) */
    int quant_err;
    struct wb_errlist *el;
    int err;
};

struct block_cfg {
    const struct wb_ynode *loops, *tensors, *naming;
    char *when, *dtype, *fp8;
};

static const struct wb_cfg_field block_table[] = {
    {"for", WB_CFG_NODE, "", "loops: var: count or var: [from, to]",
     offsetof(struct block_cfg, loops), NULL, NULL},
    {"when", WB_CFG_STR, "", "condition", offsetof(struct block_cfg, when), NULL, NULL},
    {"dtype", WB_CFG_STR, "bf16", "dtype of the tensors", offsetof(struct block_cfg, dtype), NULL,
     NULL},
    {"fp8", WB_CFG_STR, "", "condition for FP8 block quantization", offsetof(struct block_cfg, fp8),
     NULL, NULL},
    {"tensors", WB_CFG_NODE, NULL, "name template: shape", offsetof(struct block_cfg, tensors),
     NULL, NULL},
    {"naming", WB_CFG_NODE, "", "trainer blocks: the naming(s) the block belongs to",
     offsetof(struct block_cfg, naming), NULL, NULL},
    {0},
};

/* Compiles one expression scalar, reporting "file:l:c: <what> 'text': problem". */
static struct wb_expr *compile_at(struct gen *g, const struct wb_ynode *n, const char *what)
{
    char at[300], err[256];
    const char *text = wb_ynode_scalar(n);
    wb_yaml_where(g->f->y, n, at, sizeof(at));
    if (!text) {
        wb_errlist_add(g->el, "%s: %s: expected an expression", at, what);
        g->err = -WB_E_CONFIG;
        return NULL;
    }
    struct wb_expr *e;
    int r = mx_expr_compile(text, &e, err, sizeof(err));
    if (r) {
        wb_errlist_add(g->el, "%s: %s: bad expression '%s': %s", at, what, text, err);
        g->err = r == -ENOMEM ? r : -WB_E_CONFIG;
        return NULL;
    }
    return e;
}

static struct wb_expr *compile_key(struct gen *g, const struct wb_ynode *map, const char *key)
{
    return compile_at(g, wb_ynode_get(g->f->y, map, key), key);
}

static void compile_tensor(struct gen *g, struct gblock *b, const struct wb_ynode *key,
                           const struct wb_ynode *val)
{
    const struct wb_yaml *y = g->f->y;
    struct gtensor *t = &b->t[b->nt];
    char err[256];
    t->src = wb_ynode_scalar(key);
    t->dt = b->dt;
    wb_yaml_where(y, key, t->where, sizeof(t->where));
    if (!t->src) {
        wb_errlist_add(g->el, "%s: tensor names must be strings", t->where);
        g->err = -WB_E_CONFIG;
        return;
    }
    if (mx_tmpl_compile(t->src, &t->name, err, sizeof(err))) {
        wb_errlist_add(g->el, "%s: bad name template '%s': %s", t->where, t->src, err);
        g->err = -WB_E_CONFIG;
        return;
    }
    b->nt++;
    const struct wb_ynode *shape = val;
    if (wb_ynode_kind(val) == WB_YNODE_MAP) {
        shape = NULL;
        for (size_t i = 0; i < wb_ynode_len(val); i++) {
            const struct wb_ynode *k, *v;
            wb_ynode_pair(y, val, i, &k, &v);
            const char *kn = wb_ynode_scalar(k);
            char at[300];
            wb_yaml_where(y, k, at, sizeof(at));
            if (kn && strcmp(kn, "shape") == 0) {
                shape = v;
            } else if (kn && strcmp(kn, "when") == 0) {
                t->when = compile_at(g, v, "when");
            } else if (kn && strcmp(kn, "dtype") == 0) {
                const char *d = wb_ynode_scalar(v);
                if (!d || wb_dtype_parse(d, &t->dt)) {
                    wb_errlist_add(g->el, "%s: %s: unknown dtype '%s'", at, t->src, d ? d : "?");
                    g->err = -WB_E_CONFIG;
                }
                t->dt_explicit = true;
            } else {
                wb_errlist_add(g->el, "%s: %s: unknown key '%s' (expected shape, dtype, when)", at,
                               t->src, kn ? kn : "?");
                g->err = -WB_E_CONFIG;
            }
        }
    }
    if (wb_ynode_kind(shape) != WB_YNODE_SEQ || wb_ynode_len(shape) > WB_MAX_DIMS) {
        wb_errlist_add(g->el, "%s: %s: shape must be a list of at most %d expressions", t->where,
                       t->src, WB_MAX_DIMS);
        g->err = -WB_E_CONFIG;
        return;
    }
    t->ndim = (uint32_t)wb_ynode_len(shape);
    for (uint32_t d = 0; d < t->ndim; d++) {
        char what[300];
        snprintf(what, sizeof(what), "shape of '%s'", t->src);
        t->dim[d] = compile_at(g, wb_ynode_item(y, shape, d), what);
    }
}

static void compile_block(struct gen *g, const struct wb_ynode *node, bool rollout)
{
    const struct wb_yaml *y = g->f->y;
    struct gblock *b = &g->b[g->nb++];
    struct block_cfg c = {0};
    wb_yaml_where(y, node, b->where, sizeof(b->where));
    int r = wb_cfg_parse(y, node, block_table, &c, g->el);
    if (r) {
        g->err = r; /* -WB_E_CONFIG, said; or -ENOMEM */
        goto out;
    }
    if (wb_dtype_parse(c.dtype, &b->dt)) {
        wb_errlist_add(g->el, "%s: unknown dtype '%s'", b->where, c.dtype);
        g->err = -WB_E_CONFIG;
    }
    if (rollout && c.naming) {
        char at[300];
        wb_errlist_add(g->el,
                       "%s: naming: only trainer blocks have a naming (the rollout side is the "
                       "same for every naming)",
                       wb_yaml_where(y, c.naming, at, sizeof(at)));
        g->err = -WB_E_CONFIG;
    } else if ((r = mx_naming_mask(g->f, c.naming, &b->naming, g->el))) {
        g->err = r;
    }
    if (*c.when)
        b->when = compile_key(g, node, "when");
    if (*c.fp8)
        b->fp8 = compile_key(g, node, "fp8");
    if (c.loops) {
        if (wb_ynode_kind(c.loops) != WB_YNODE_MAP || wb_ynode_len(c.loops) > 4) {
            char at[300];
            wb_errlist_add(g->el, "%s: for: expected a mapping of at most 4 loops",
                           wb_yaml_where(y, c.loops, at, sizeof(at)));
            g->err = -WB_E_CONFIG;
        } else {
            for (size_t i = 0; i < wb_ynode_len(c.loops); i++) {
                const struct wb_ynode *k, *v;
                wb_ynode_pair(y, c.loops, i, &k, &v);
                struct gloop *l = &b->loop[b->nloop++];
                l->var = wb_ynode_scalar(k);
                wb_yaml_where(y, k, l->where, sizeof(l->where));
                if (!l->var || !is_name(l->var)) {
                    wb_errlist_add(g->el, "%s: for: loop variable '%s' is not a name", l->where,
                                   l->var ? l->var : "(a collection)");
                    g->err = -WB_E_CONFIG;
                    continue;
                }
                for (size_t j = 0; j + 1 < b->nloop; j++)
                    if (b->loop[j].var && strcmp(b->loop[j].var, l->var) == 0) {
                        wb_errlist_add(g->el, "%s: for: loop variable '%s' twice", l->where,
                                       l->var);
                        g->err = -WB_E_CONFIG;
                    }
                if (wb_ynode_kind(v) == WB_YNODE_SEQ && wb_ynode_len(v) == 2) {
                    l->from = compile_at(g, wb_ynode_item(y, v, 0), "for");
                    l->to = compile_at(g, wb_ynode_item(y, v, 1), "for");
                } else {
                    l->to = compile_at(g, v, "for");
                }
            }
        }
    }
    if (wb_ynode_kind(c.tensors) != WB_YNODE_MAP) {
        wb_errlist_add(g->el, "%s: tensors: expected a mapping name template: shape", b->where);
        g->err = -WB_E_CONFIG;
        goto out;
    }
    if (wb_ynode_len(c.tensors) > 0xffff) {
        wb_errlist_add(g->el, "%s: tensors: %zu names, at most 65535 in one block", b->where,
                       wb_ynode_len(c.tensors));
        g->err = -WB_E_CONFIG;
        goto out;
    }
    if (!(b->t = calloc(wb_ynode_len(c.tensors) + 1, sizeof(*b->t)))) {
        g->err = -ENOMEM;
        goto out;
    }
    for (size_t i = 0; i < wb_ynode_len(c.tensors); i++) {
        const struct wb_ynode *k, *v;
        wb_ynode_pair(y, c.tensors, i, &k, &v);
        compile_tensor(g, b, k, v);
    }
out:
    wb_cfg_free(block_table, &c);
}

static void gen_free(struct gen *g)
{
    for (size_t i = 0; i < g->nb; i++) {
        struct gblock *b = &g->b[i];
        for (size_t l = 0; l < b->nloop; l++) {
            mx_expr_free(b->loop[l].from);
            mx_expr_free(b->loop[l].to);
        }
        mx_expr_free(b->when);
        mx_expr_free(b->fp8);
        for (size_t t = 0; t < b->nt; t++) {
            mx_tmpl_free(b->t[t].name);
            mx_expr_free(b->t[t].when);
            for (uint32_t d = 0; d < b->t[t].ndim; d++)
                mx_expr_free(b->t[t].dim[d]);
        }
        free(b->t);
    }
    free(g->b);
    free(g->origin);
    wb_inv_free(&g->inv);
}

/* Reports an evaluation error once per expression site. */
static void eval_error(struct gen *g, bool *reported, int r, const char *err, const char *text,
                       const char *where, const struct wb_xenv *env)
{
    g->err = r == -ENOMEM ? r : -WB_E_CONFIG;
    if (*reported)
        return;
    *reported = true;
    char loops[128] = "";
    size_t pos = 0;
    for (size_t i = 0; i < env->nvars && pos < sizeof(loops); i++)
        pos += (size_t)snprintf(loops + pos, sizeof(loops) - pos, "%s%s=%lld", i ? ", " : " (with ",
                                env->vars[i].name, (long long)env->vars[i].value);
    if (env->nvars && pos < sizeof(loops))
        snprintf(loops + pos, sizeof(loops) - pos, ")");
    if (r == -ENOENT)
        wb_errlist_add(g->el, "%s: %s (needed by '%s' at %s)", g->cfg->path, err, text, where);
    else
        wb_errlist_add(g->el, "%s: '%s': %s%s", where, text, err, loops);
}

static int add_param(struct gen *g, const char *name, enum wb_dtype dt, const struct wb_shape *s,
                     uint32_t origin)
{
    const char *where = g->b[origin >> 16].t[origin & 0xffff].where;
    if (g->inv.n >= WB_GEN_MAX_TENSORS) {
        if (!g->too_many)
            wb_errlist_add(g->el, "%s: %s: more than %d tensors generated; stopped", where, name,
                           WB_GEN_MAX_TENSORS);
        g->too_many = true;
        g->err = -WB_E_CONFIG;
        return -WB_E_CONFIG;
    }
    int r = wb_inv_add(&g->inv, name, dt, s);
    if (r == -EEXIST) {
        ssize_t first = wb_inv_find(&g->inv, name);
        uint32_t o = g->origin[first];
        wb_errlist_add(g->el, "%s: generated tensor name '%s' twice (first by %s)", where, name,
                       g->b[o >> 16].t[o & 0xffff].where);
        g->err = -WB_E_CONFIG;
        return 0;
    }
    if (r == -EOVERFLOW) {
        char a[160];
        wb_errlist_add(g->el, "%s: %s %s: more than 2^48 bytes (%s)", where, name,
                       wb_shape_str(s, a, sizeof(a)), wb_dtype_name(dt));
        g->err = -WB_E_CONFIG;
        return 0;
    }
    if (r)
        return r;
    if (g->inv.n > g->origin_cap &&
        wb_grow(&g->origin, &g->origin_cap, 1024, sizeof(*g->origin)) != 0)
        return -ENOMEM;
    g->origin[g->inv.n - 1] = origin;
    return 0;
}

static int emit(struct gen *g, size_t bi, struct wb_xenv *env, bool fp8)
{
    struct gblock *b = &g->b[bi];
    char err[640], name[WB_NAME_MAX];
    for (size_t ti = 0; ti < b->nt; ti++) {
        struct gtensor *t = &b->t[ti];
        int64_t v;
        int r;
        if (t->when) {
            if ((r = mx_expr_eval(t->when, env, &v, err, sizeof(err)))) {
                eval_error(g, &t->reported, r, err, mx_expr_text(t->when), t->where, env);
                continue;
            }
            if (!v)
                continue;
        }
        if ((r = mx_tmpl_render(t->name, env, name, sizeof(name), err, sizeof(err)))) {
            eval_error(g, &t->reported, r, err, t->src, t->where, env);
            continue;
        }
        struct wb_shape s = {.ndim = t->ndim};
        bool ok = true;
        for (uint32_t d = 0; d < t->ndim && ok; d++) {
            if ((r = mx_expr_eval_num(t->dim[d], env, &v, err, sizeof(err)))) {
                eval_error(g, &t->reported, r, err, mx_expr_text(t->dim[d]), t->where, env);
                ok = false;
            } else if (v <= 0) {
                /* a zero is a config.json field set to 0 (or missing from a product): an
                 * empty tensor no model has */
                snprintf(err, sizeof(err), "dimension %u of %s is %s (%lld)", d, name,
                         v ? "negative" : "zero", (long long)v);
                eval_error(g, &t->reported, -EINVAL, err, mx_expr_text(t->dim[d]), t->where, env);
                ok = false;
            } else {
                s.dim[d] = (uint64_t)v;
            }
        }
        if (!ok)
            continue;
        uint32_t origin = (uint32_t)(bi << 16 | ti);
        bool quant = fp8 && !t->dt_explicit;
        if (quant && t->ndim < 2) {
            snprintf(err, sizeof(err), "FP8 block quantization needs at least 2 dimensions");
            eval_error(g, &t->reported, -EINVAL, err, t->src, t->where, env);
            continue;
        }
        size_t before = g->inv.n;
        if ((r = add_param(g, name, quant ? WB_DTYPE_FP8_E4M3 : t->dt, &s, origin)))
            return r;
        if (quant && g->inv.n > before) {
            char sname[WB_NAME_MAX];
            if ((size_t)snprintf(sname, sizeof(sname), "%s%s", name, g->f->quant.scale_suffix) >=
                sizeof(sname)) {
                snprintf(err, sizeof(err), "scale name of %s too long", name);
                eval_error(g, &t->reported, -EINVAL, err, t->src, t->where, env);
                continue;
            }
            for (uint32_t d = s.ndim - 2; d < s.ndim; d++)
                s.dim[d] = (s.dim[d] + WB_FP8_BLOCK - 1) / WB_FP8_BLOCK;
            if ((r = add_param(g, sname, WB_DTYPE_FP32, &s, origin)))
                return r;
        }
    }
    return 0;
}

/* The trainer side is checked against quantization_config only where a block makes FP8
 * tensors from it; the rollout side always (a rollout's config.json says what vLLM holds). */
static int fp8_config_ok(struct gen *g)
{
    if (!g->quant_checked) {
        g->quant_checked = true;
        size_t before = g->el->n;
        g->quant_err = mx_check_quant_config(g->cfg, g->el);
        if (g->quant_err && g->el->n == before)
            wb_errlist_add(g->el, "%s: out of memory", g->cfg->path);
    }
    if (g->quant_err)
        g->err = g->quant_err;
    return g->quant_err;
}

/* Nested loops multiply: before a block runs, its loop counts (each evaluated with the outer
 * variables at their first value) are multiplied, so {a: 1000, b: 1000, c: 1000} is refused at
 * once instead of after a million iterations. Bounds that depend on outer variables can still
 * grow; the running count in run_block() catches those. Returns 0 when the block may run (or
 * when a bound cannot be evaluated here: run_block() reports that with its loop values). */
static int loops_precheck(struct gen *g, struct gblock *b, struct wb_xvar *vars)
{
    char what[256], err[256];
    size_t pos = 0;
    uint64_t prod = 1;
    for (size_t level = 0; level < b->nloop; level++) {
        struct gloop *l = &b->loop[level];
        struct wb_xenv env = {.vars = vars,
                              .nvars = level,
                              .sets = g->sets,
                              .nsets = g->nsets,
                              .cfg = g->cfg,
                              .derived = g->f->dv,
                              .nderived = g->f->ndv};
        int64_t from = 0, to;
        if ((l->from && mx_expr_eval_num(l->from, &env, &from, err, sizeof(err))) ||
            mx_expr_eval_num(l->to, &env, &to, err, sizeof(err)) || from < 0 || to < 0)
            return 0;
        uint64_t count = to > from ? (uint64_t)(to - from) : 0;
        if (__builtin_mul_overflow(prod, count, &prod))
            prod = UINT64_MAX;
        if (pos < sizeof(what))
            pos += (size_t)snprintf(what + pos, sizeof(what) - pos, "%s%s %llu", level ? " x " : "",
                                    l->var, (unsigned long long)count);
        vars[level].name = l->var;
        vars[level].value = from;
    }
    if (prod <= WB_GEN_MAX_ITERS - g->iters)
        return 0;
    wb_errlist_add(g->el,
                   "%s: for: %s = %llu iterations, more than %d in all (nested loops multiply)",
                   b->where, what, (unsigned long long)prod, WB_GEN_MAX_ITERS);
    g->err = -WB_E_CONFIG;
    return -WB_E_CONFIG;
}

static int run_block(struct gen *g, size_t bi, size_t level, struct wb_xvar *vars)
{
    struct gblock *b = &g->b[bi];
    int r;
    if (level == 0 && b->nloop > 1 && (r = loops_precheck(g, b, vars)))
        return r;
    struct wb_xenv env = {.vars = vars,
                          .nvars = level,
                          .sets = g->sets,
                          .nsets = g->nsets,
                          .cfg = g->cfg,
                          .derived = g->f->dv,
                          .nderived = g->f->ndv};
    char err[256];
    int64_t v;
    if (level < b->nloop) {
        struct gloop *l = &b->loop[level];
        int64_t from = 0, to;
        if (l->from && (r = mx_expr_eval_num(l->from, &env, &from, err, sizeof(err)))) {
            eval_error(g, &b->reported, r, err, mx_expr_text(l->from), l->where, &env);
            return 0;
        }
        if ((r = mx_expr_eval_num(l->to, &env, &to, err, sizeof(err)))) {
            eval_error(g, &b->reported, r, err, mx_expr_text(l->to), l->where, &env);
            return 0;
        }
        /* loop variables index tensors: both bounds are counts, never negative */
        if (from < 0 || to < 0) {
            const struct wb_expr *e = from < 0 ? l->from : l->to;
            snprintf(err, sizeof(err), "loop %s %s at %lld, a negative index", l->var,
                     from < 0 ? "starts" : "ends", (long long)(from < 0 ? from : to));
            eval_error(g, &b->reported, -EINVAL, err, mx_expr_text(e), l->where, &env);
            return 0;
        }
        uint64_t count = to > from ? (uint64_t)(to - from) : 0;
        if (count > WB_GEN_MAX_ITERS) {
            snprintf(err, sizeof(err), "loop %s of %llu iterations (at most %d)", l->var,
                     (unsigned long long)count, WB_GEN_MAX_ITERS);
            eval_error(g, &b->reported, -EINVAL, err, mx_expr_text(l->to), l->where, &env);
            return 0;
        }
        /* nested loops multiply: every iteration of every level counts against one budget for
         * the whole section, so {a: 1000, b: 1000, c: 1000} stops here instead of running */
        g->iters += count;
        if (g->iters > WB_GEN_MAX_ITERS) {
            wb_errlist_add(g->el,
                           "%s: for: the loops of this section run more than %d iterations in "
                           "all (nested loops multiply); stopped",
                           b->where, WB_GEN_MAX_ITERS);
            g->err = -WB_E_CONFIG;
            return -WB_E_CONFIG;
        }
        vars[level].name = l->var;
        for (int64_t i = from; i < to; i++) {
            vars[level].value = i;
            if ((r = run_block(g, bi, level + 1, vars)))
                return r;
        }
        return 0;
    }
    if (b->when) {
        if ((r = mx_expr_eval(b->when, &env, &v, err, sizeof(err)))) {
            eval_error(g, &b->reported, r, err, mx_expr_text(b->when), b->where, &env);
            return 0;
        }
        if (!v)
            return 0;
    }
    bool fp8 = false;
    if (b->fp8) {
        if ((r = mx_expr_eval(b->fp8, &env, &v, err, sizeof(err)))) {
            eval_error(g, &b->reported, r, err, mx_expr_text(b->fp8), b->where, &env);
            return 0;
        }
        fp8 = v != 0;
        if (fp8 && (r = fp8_config_ok(g)))
            return r;
    }
    return emit(g, bi, &env, fp8);
}

static int check_side(const char *side, struct wb_errlist *el)
{
    if (!side || (strcmp(side, "trainer") != 0 && strcmp(side, "rollout") != 0)) {
        wb_errlist_add(el, "side must be \"trainer\" or \"rollout\", got \"%s\"",
                       side ? side : "(null)");
        return -EINVAL;
    }
    return 0;
}

int wb_inv_generate(const char *family_yaml, const char *config_json, const char *side,
                    struct wb_inventory *inv, struct wb_errlist *el)
{
    return wb_inv_generate_vars(family_yaml, config_json, NULL, side, inv, el);
}

int wb_inv_generate_vars(const char *family_yaml, const char *config_json, const char *vars,
                         const char *side, struct wb_inventory *inv, struct wb_errlist *el)
{
    return wb_inv_generate_named(family_yaml, config_json, vars, NULL, side, inv, el);
}

int wb_inv_generate_named(const char *family_yaml, const char *config_json, const char *vars,
                          const char *naming, const char *side, struct wb_inventory *inv,
                          struct wb_errlist *el)
{
    struct wb_family *f = NULL;
    int r = mx_family_open(family_yaml, &f, el);
    if (r == 0)
        r = mx_inv_generate_family(f, family_yaml, config_json, vars, naming, side, inv, el);
    mx_family_close(f);
    return r;
}

int mx_inv_generate_family(struct wb_family *f, const char *family_yaml, const char *config_json,
                           const char *vars, const char *naming, const char *side,
                           struct wb_inventory *inv, struct wb_errlist *el)
{
    struct wb_jcfg *cfg = NULL;
    struct wb_xvar *sets = NULL;
    char *sets_buf = NULL;
    size_t nsets = 0, before = el->n;
    int r;
    uint32_t ni = 0;
    if ((r = check_side(side, el)) || (r = mx_naming_index(f, family_yaml, naming, &ni, el)))
        return r;
    if (!(r = mx_vars_parse(vars, f->dv, f->ndv, family_yaml, &sets, &nsets, &sets_buf, el)) &&
        !(r = mx_jcfg_load(config_json, &cfg, el)))
        r = mx_inv_generate_parsed(f, family_yaml, cfg, sets, nsets, ni, side, inv, el);
    /* an allocation failure is an error with a message, never an empty success */
    if (r == -ENOMEM && el->n == before)
        wb_errlist_add(el, "%s: out of memory generating the %s inventory", family_yaml, side);
    free(sets);
    free(sets_buf);
    mx_jcfg_free(cfg);
    return r;
}

int mx_inv_generate_parsed(struct wb_family *f, const char *family_yaml, const struct wb_jcfg *cfg,
                           const struct wb_xvar *sets, size_t nsets, uint32_t naming,
                           const char *side, struct wb_inventory *inv, struct wb_errlist *el)
{
    struct gen g = {.el = el};
    int r;
    if ((r = check_side(side, el)))
        return r;
    bool rollout = strcmp(side, "rollout") == 0;
    const struct wb_ynode *sec = rollout ? f->rollout : f->trainer;
    if (wb_ynode_kind(sec) != WB_YNODE_SEQ) {
        wb_errlist_add(el, "%s: no \"%s\" section (a list of tensor blocks)", family_yaml, side);
        return -WB_E_CONFIG;
    }
    if ((r = mx_check_model_type(f->model_types, f->nmodel_types, f->model_type_at, cfg, el)) ||
        (r = run_checks(f, cfg, sets, nsets, el)))
        return r;
    g.f = f;
    g.cfg = cfg;
    g.sets = sets;
    g.nsets = nsets;
    wb_inv_init(&g.inv);
    size_t nb = wb_ynode_len(sec);
    if (nb >= 1 << 15) {
        char at[300];
        wb_errlist_add(el, "%s: %s: %zu blocks, at most %d",
                       wb_yaml_where(f->y, sec, at, sizeof(at)), side, nb, (1 << 15) - 1);
        r = -WB_E_CONFIG;
        goto out;
    }
    if (!(g.b = calloc(nb + 1, sizeof(*g.b)))) {
        r = -ENOMEM;
        goto out;
    }
    if (rollout && (r = fp8_config_ok(&g)))
        goto out;
    for (size_t i = 0; i < nb; i++)
        compile_block(&g, wb_ynode_item(f->y, sec, i), rollout);
    /* every block runs even after an evaluation error, so all of them are reported; a
     * compile error stops before anything runs */
    if (!g.err)
        for (size_t i = 0; i < g.nb; i++) {
            struct wb_xvar vars[4];
            if (!(g.b[i].naming & (1u << naming))) /* another naming's block */
                continue;
            if ((r = run_block(&g, i, 0, vars))) {
                g.err = r;
                break;
            }
        }
    r = g.err;
    if (r == 0) {
        wb_inv_free(inv);
        *inv = g.inv;
        wb_inv_init(&g.inv);
    }
out:
    gen_free(&g);
    return r;
}
