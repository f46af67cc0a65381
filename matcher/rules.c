/* rules.c — loads the `rules`, `quant` and `ignore` sections of a model-family file into
 * struct wb_match_rules (reference: configs/models/README.md). One rule says how one kind of
 * rollout tensor is built:
 *
 *   - rollout: model.layers.{L}.self_attn.qkv_proj.weight     # pattern, {L} captures digits
 *     from: [model.layers.{L}.self_attn.q_proj.weight, ...k_proj..., ...v_proj...]
 *     dim: 0                                  # rollout dim the pieces are concatenated along
 *     shard: {tp: 0, head_dim: head_dim}      # TP per component, GQA-aware
 *   - rollout: model.layers.{L}.mlp.experts.w13_weight
 *     stack: E                                # {E} runs over rollout dim 0 (the experts)
 *     from: [model.layers.{L}.mlp.experts.{E}.gate_proj.weight, ...up_proj...]
 *     dim: 1
 *     shard: {ep: 0, tp: 1}                   # EP over experts; without EP, TP along dim 1
 *   - rollout: model.layers.{L}.mlp.experts.{E}.gate_proj.weight
 *     from: model.layers.{L}.mlp.experts.gate_up_proj
 *     index: E                                # trainer[E] (trainer stacked, rollout not)
 *     chunk: [0, 2]                           # first half along `dim`
 *   - rollout: lm_head.weight
 *     from: lm_head.weight
 *     tied: model.embed_tokens.weight         # used when the trainer has no lm_head.weight
 *   - rollout: model.layers.{L}.mlp.experts.w13_weight
 *     from: model.layers.{L}.mlp.experts.gate_up_proj
 *     permute: [0, 2, 1]                      # rollout dim k is trainer dim permute[k]
 *   - rollout: "*"                            # everything else: same name, replicated
 *     from: "*"
 * The first rule whose pattern matches a rollout name applies. (YAML: inside a flow list
 * [a, b], names with braces must be quoted: ["x.{L}.w", "y.{L}.w"]; block lists need not.) Every
 * key is checked; an unknown key is an error with its file:line:col, so a typo never silently drops
 * a rule. */
#include "matcher/mpriv.h"

#include <ctype.h>
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct rule_cfg {
    char *rollout, *stack, *index, *tied, *groups;
    const struct wb_ynode *from, *chunk, *shard, *permute, *split, *naming;
    uint64_t dim;
    bool optional;
};

static const struct wb_cfg_field rule_table[] = {
    {"rollout", WB_CFG_STR, NULL, "rollout name pattern", offsetof(struct rule_cfg, rollout), NULL,
     NULL},
    {"from", WB_CFG_NODE, NULL, "trainer name template, or a list of them (fused)",
     offsetof(struct rule_cfg, from), NULL, NULL},
    {"dim", WB_CFG_U64, "0", "rollout dim of concatenation / chunking",
     offsetof(struct rule_cfg, dim), NULL, NULL},
    {"stack", WB_CFG_STR, "", "capture iterated over rollout dim 0",
     offsetof(struct rule_cfg, stack), NULL, NULL},
    {"index", WB_CFG_STR, "", "capture selecting trainer dim 0 (unstacking)",
     offsetof(struct rule_cfg, index), NULL, NULL},
    {"chunk", WB_CFG_NODE, "", "[i, n]: chunk i of n along dim (with index)",
     offsetof(struct rule_cfg, chunk), NULL, NULL},
    {"tied", WB_CFG_STR, "", "trainer tensor used when `from` is absent (tied weights)",
     offsetof(struct rule_cfg, tied), NULL, NULL},
    {"shard", WB_CFG_NODE, "", "replicate, {tp: dim[, head_dim: expr]}, {ep: 0[, tp: dim]}",
     offsetof(struct rule_cfg, shard), NULL, NULL},
    {"permute", WB_CFG_NODE, "", "[d0, d1, ...]: rollout dim k is trainer dim dk (a transpose)",
     offsetof(struct rule_cfg, permute), NULL, NULL},
    {"split", WB_CFG_NODE, "",
     "[name: size, ...]: the one `from` tensor is fused already; its components along dim",
     offsetof(struct rule_cfg, split), NULL, NULL},
    {"groups", WB_CFG_STR, "",
     "with split: the trainer tensor repeats the components this many times along dim",
     offsetof(struct rule_cfg, groups), NULL, NULL},
    {"naming", WB_CFG_NODE, "", "the trainer naming(s) the rule belongs to (default: every one)",
     offsetof(struct rule_cfg, naming), NULL, NULL},
    {"optional", WB_CFG_BOOL, "false",
     "the rule may build no rollout tensor (else that is an error: a typo falls through)",
     offsetof(struct rule_cfg, optional), NULL, NULL},
    {0},
};

struct shard_cfg {
    char *tp;
    int64_t ep;
    uint64_t pad;
    char *head_dim;
};

static const struct wb_cfg_field shard_table[] = {
    {"tp", WB_CFG_STR, "", "dim split over tensor-parallel ranks, or rank0 (with ep)",
     offsetof(struct shard_cfg, tp), NULL, NULL},
    {"ep", WB_CFG_I64, "-1", "dim split over expert-parallel ranks (0)",
     offsetof(struct shard_cfg, ep), NULL, NULL},
    {"pad", WB_CFG_U64, "0", "pad the tp dim to a multiple of this before splitting (vocab)",
     offsetof(struct shard_cfg, pad), NULL, NULL},
    {"head_dim", WB_CFG_STR, "", "head size: components are split by whole heads",
     offsetof(struct shard_cfg, head_dim), NULL, NULL},
    {0},
};

static void rule_free(struct wb_rule *r)
{
    mx_pat_free(&r->rollout);
    for (size_t i = 0; i < r->nfrom; i++)
        mx_pat_free(&r->from[i]);
    free(r->from);
    free(r->stack_var);
    free(r->index_var);
    mx_pat_free(&r->tied);
    mx_expr_free(r->head_dim);
    for (size_t i = 0; i < r->nsplit; i++) {
        free(r->split[i].name);
        mx_expr_free(r->split[i].size);
    }
    free(r->split);
    mx_expr_free(r->groups);
}

void wb_match_rules_free(struct wb_match_rules *r)
{
    if (!r)
        return;
    for (size_t i = 0; i < r->n; i++)
        rule_free(&r->r[i]);
    free(r->r);
    for (size_t i = 0; i < r->nfp8; i++)
        mx_pat_free(&r->fp8[i]);
    free(r->fp8);
    for (size_t i = 0; i < r->nign_trainer; i++)
        mx_pat_free(&r->ign_trainer[i]);
    free(r->ign_trainer);
    for (size_t i = 0; i < r->nign_rollout; i++)
        mx_pat_free(&r->ign_rollout[i]);
    free(r->ign_rollout);
    mx_family_close(r->fam); /* vars and model_types with it */
    free(r->sets);
    free(r->sets_buf);
    for (size_t i = 0; i < r->ncfgs; i++)
        mx_jcfg_free(r->cfgs[i]);
    free(r->cfgs);
    free(r->scale_suffix);
    free(r->family);
    free(r->path);
    free(r);
}

/* A list of name patterns (or one pattern). */
static int load_patterns(const struct wb_yaml *y, const struct wb_ynode *n, const char *what,
                         struct wb_pat **out, size_t *nout, struct wb_errlist *el)
{
    char at[300], err[256];
    *out = NULL;
    *nout = 0;
    if (!n)
        return 0;
    size_t cnt = wb_ynode_kind(n) == WB_YNODE_SEQ ? wb_ynode_len(n) : 1;
    struct wb_pat *p = calloc(cnt + 1, sizeof(*p));
    if (!p)
        return -ENOMEM;
    int r = 0;
    size_t k = 0;
    for (size_t i = 0; i < cnt; i++) {
        const struct wb_ynode *item = wb_ynode_kind(n) == WB_YNODE_SEQ ? wb_ynode_item(y, n, i) : n;
        const char *s = wb_ynode_scalar(item);
        wb_yaml_where(y, item, at, sizeof(at));
        if (!s) {
            wb_errlist_add(el, "%s: %s: expected a name pattern", at, what);
            r = -WB_E_CONFIG;
            continue;
        }
        if (mx_pat_compile(s, &p[k], err, sizeof(err))) {
            wb_errlist_add(el, "%s: %s: %s", at, what, err);
            r = -WB_E_CONFIG;
            continue;
        }
        k++;
    }
    if (r) {
        for (size_t i = 0; i < k; i++)
            mx_pat_free(&p[i]);
        free(p);
        return r;
    }
    *out = p;
    *nout = k;
    return 0;
}

/* Every {X} in a trainer template must be captured by the rollout pattern or be the stack
 * variable; the index variable must not appear there (it selects trainer dim 0 instead). */
static int check_template(const struct wb_rule *rl, const struct wb_pat *t, const char *at,
                          struct wb_errlist *el)
{
    int r = 0;
    for (size_t i = 0; i < t->nseg; i++) {
        const struct wb_pat_seg *g = &t->seg[i];
        if (g->kind != WB_SEG_CAP)
            continue;
        if (rl->index_var && strcmp(g->text, rl->index_var) == 0) {
            wb_errlist_add(el,
                           "%s: from '%s': {%s} is the index variable; it selects trainer "
                           "dim 0 and cannot appear in the trainer name",
                           at, t->src, g->text);
            r = -WB_E_CONFIG;
        } else if (!mx_pat_has_cap(&rl->rollout, g->text) &&
                   !(rl->stack_var && strcmp(g->text, rl->stack_var) == 0)) {
            wb_errlist_add(el,
                           "%s: from '%s': {%s} is neither captured by rollout '%s' nor the "
                           "stack variable",
                           at, t->src, g->text, rl->rollout.src);
            r = -WB_E_CONFIG;
        }
    }
    if (t->nstar > rl->rollout.nstar) {
        wb_errlist_add(el, "%s: from '%s': %zu '*' but rollout '%s' captures only %zu", at, t->src,
                       t->nstar, rl->rollout.src, rl->rollout.nstar);
        r = -WB_E_CONFIG;
    }
    return r;
}

static int load_shard(const struct wb_yaml *y, const struct wb_ynode *n, struct wb_rule *rl,
                      struct wb_errlist *el)
{
    char at[300], err[256];
    rl->shard = (struct wb_shard){.kind = WB_SHARD_REPLICATE, .ep1_tp_dim = -1};
    if (!n)
        return 0;
    wb_yaml_where(y, n, at, sizeof(at));
    const char *s = wb_ynode_scalar(n);
    if (s) {
        if (strcmp(s, "replicate") == 0)
            return 0;
        wb_errlist_add(el,
                       "%s: shard: expected replicate or a mapping {tp: dim} / {ep: 0}, "
                       "got '%s'",
                       at, s);
        return -WB_E_CONFIG;
    }
    struct shard_cfg c = {0};
    int r = wb_cfg_parse(y, n, shard_table, &c, el);
    if (r)
        goto out;
    int64_t tp = -1;
    bool rank0 = strcmp(c.tp, "rank0") == 0;
    if (*c.tp && !rank0 && (wb_parse_i64(c.tp, &tp) || tp < 0 || tp >= WB_MAX_DIMS)) {
        wb_errlist_add(el, "%s: shard: tp: '%s': expected a dim 0..%d (or rank0 with ep)", at, c.tp,
                       WB_MAX_DIMS - 1);
        r = -WB_E_CONFIG;
        goto out;
    }
    if (c.ep != -1 && c.ep != 0) {
        wb_errlist_add(el, "%s: shard: tp must be a dim 0..%d and ep must be 0 (experts)", at,
                       WB_MAX_DIMS - 1);
        r = -WB_E_CONFIG;
        goto out;
    }
    if (rank0 && c.ep != 0) {
        wb_errlist_add(el,
                       "%s: shard: tp: rank0 only with ep: 0 (a FusedMoE tensor that tp rank 0 "
                       "holds whole without EP)",
                       at);
        r = -WB_E_CONFIG;
        goto out;
    }
    if (c.pad && (tp != 0 || c.ep == 0 || c.pad > (1u << 16))) {
        wb_errlist_add(el,
                       "%s: shard: pad: %llu: needs tp: 0 (vocab rows) without ep, and at most "
                       "65536",
                       at, (unsigned long long)c.pad);
        r = -WB_E_CONFIG;
        goto out;
    }
    if (c.ep == 0) {
        rl->shard = (struct wb_shard){
            .kind = WB_SHARD_EP, .dim = 0, .ep1_tp_dim = rank0 ? WB_SHARD_RANK0 : (int32_t)tp};
    } else if (tp >= 0) {
        rl->shard = (struct wb_shard){
            .kind = WB_SHARD_TP, .dim = (uint32_t)tp, .ep1_tp_dim = -1, .pad = (uint32_t)c.pad};
    }
    if (*c.head_dim) {
        if (tp < 0) {
            wb_errlist_add(el, "%s: shard: head_dim needs tp", at);
            r = -WB_E_CONFIG;
        } else if (c.pad) {
            wb_errlist_add(el, "%s: shard: head_dim and pad do not go together", at);
            r = -WB_E_CONFIG;
        } else if (mx_expr_compile(c.head_dim, &rl->head_dim, err, sizeof(err))) {
            wb_errlist_add(el, "%s: shard.head_dim: bad expression '%s': %s", at, c.head_dim, err);
            r = -WB_E_CONFIG;
        }
    }
out:
    wb_cfg_free(shard_table, &c);
    return r;
}

/* permute: [d0, d1, ...], a permutation of 0..n-1, for a rule with one trainer tensor. */
static int load_permute(const struct wb_yaml *y, const struct wb_ynode *n, struct wb_rule *rl,
                        struct wb_errlist *el)
{
    char at[300];
    wb_yaml_where(y, n, at, sizeof(at));
    size_t len = wb_ynode_kind(n) == WB_YNODE_SEQ ? wb_ynode_len(n) : 0;
    bool seen[WB_MAX_DIMS] = {0}, ok = len >= 2 && len <= WB_MAX_DIMS;
    for (size_t i = 0; ok && i < len; i++) {
        uint64_t d;
        ok = wb_parse_u64(wb_ynode_scalar(wb_ynode_item(y, n, i)), &d) == 0 && d < len && !seen[d];
        if (ok) {
            seen[d] = true;
            rl->perm[i] = (uint8_t)d;
        }
    }
    if (!ok) {
        wb_errlist_add(el,
                       "%s: permute: expected a permutation of 0..n-1 (2 <= n <= %d), such as "
                       "[0, 2, 1]",
                       at, WB_MAX_DIMS);
        return -WB_E_CONFIG;
    }
    if (rl->kind != WB_RULE_FROM) {
        wb_errlist_add(el, "%s: permute: only for a rule with a single `from` (no fuse or stack)",
                       at);
        return -WB_E_CONFIG;
    }
    rl->nperm = (uint32_t)len;
    return 0;
}

/* split: [name: size, ...] — a list, so that the order is the document's; each item one
 * `name: expression` pair, the names distinct. The sizes are evaluated when matching. */
static int load_split(const struct wb_yaml *y, const struct wb_ynode *n, struct wb_rule *rl,
                      struct wb_errlist *el)
{
    char at[300], err[256];
    wb_yaml_where(y, n, at, sizeof(at));
    size_t len = wb_ynode_kind(n) == WB_YNODE_SEQ ? wb_ynode_len(n) : 0;
    if (len < 2 || len > WB_SPLIT_MAX) {
        wb_errlist_add(el,
                       "%s: split: expected a list of 2 to %d `name: size` components in order, "
                       "such as [q: num_attention_heads*head_dim, k: num_key_value_heads*head_dim, "
                       "v: num_key_value_heads*head_dim]",
                       at, WB_SPLIT_MAX);
        return -WB_E_CONFIG;
    }
    if (!(rl->split = calloc(len, sizeof(*rl->split))))
        return -ENOMEM;
    int r = 0;
    for (size_t i = 0; i < len; i++) {
        const struct wb_ynode *item = wb_ynode_item(y, n, i), *k = NULL, *v = NULL;
        wb_yaml_where(y, item, at, sizeof(at));
        if (wb_ynode_kind(item) == WB_YNODE_MAP && wb_ynode_len(item) == 1)
            wb_ynode_pair(y, item, 0, &k, &v);
        const char *name = wb_ynode_scalar(k), *size = wb_ynode_scalar(v);
        bool ident = name && (isalpha((unsigned char)name[0]) || name[0] == '_');
        for (const char *p = name; ident && *p; p++)
            ident = isalnum((unsigned char)*p) || *p == '_';
        if (!ident || !size || !*size) {
            wb_errlist_add(el,
                           "%s: split[%zu]: expected one `name: size` pair (a name of letters, "
                           "digits and _, and a size expression)",
                           at, i);
            r = -WB_E_CONFIG;
            continue;
        }
        bool drop = strcmp(name, "_") == 0;
        for (size_t j = 0; j < rl->nsplit && !drop; j++)
            if (strcmp(rl->split[j].name, name) == 0) {
                wb_errlist_add(el, "%s: split[%zu]: component '%s' named twice", at, i, name);
                r = -WB_E_CONFIG;
            }
        struct wb_split *sp = &rl->split[rl->nsplit];
        sp->drop = drop;
        if (!(sp->name = strdup(name)))
            return -ENOMEM;
        rl->nsplit++; /* freed with the rule from here on */
        int e = mx_expr_compile(size, &sp->size, err, sizeof(err));
        if (e == -ENOMEM)
            return e;
        if (e) {
            wb_errlist_add(el, "%s: split[%zu]: %s: bad expression '%s': %s", at, i, name, size,
                           err);
            r = -WB_E_CONFIG;
        }
    }
    if (r)
        return r;
    wb_yaml_where(y, n, at, sizeof(at));
    size_t kept = 0;
    for (size_t i = 0; i < rl->nsplit; i++)
        kept += !rl->split[i].drop;
    if (!kept) {
        wb_errlist_add(el, "%s: split: every component is dropped (`_`); keep at least one", at);
        return -WB_E_CONFIG;
    }
    if ((rl->kind != WB_RULE_FROM && rl->kind != WB_RULE_STACK) || rl->nfrom != 1 || rl->nperm) {
        wb_errlist_add(el,
                       "%s: split: only for a rule with a single `from` (no fuse, index or "
                       "permute)",
                       at);
        return -WB_E_CONFIG;
    }
    if (rl->kind == WB_RULE_STACK && rl->dim == 0) {
        wb_errlist_add(el,
                       "%s: split: with stack, dim is the rollout dim of the components, >= 1 "
                       "(dim 0 holds the stack)",
                       at);
        return -WB_E_CONFIG;
    }
    return 0;
}

static int load_rule(const struct wb_family *f, const struct wb_ynode *n, struct wb_rule *rl,
                     struct wb_errlist *el)
{
    const struct wb_yaml *y = f->y;
    char at[300], err[256];
    struct rule_cfg c = {0};
    wb_yaml_where(y, n, at, sizeof(at));
    int r = wb_cfg_parse(y, n, rule_table, &c, el);
    if (r) {
        if (c.shard) /* report the shard's problems too */
            load_shard(y, c.shard, rl, el);
        goto out;
    }
    {
        /* line and column, for messages about this rule */
        const char *p = strrchr(at, ':');
        const char *q = p;
        while (q > at && q[-1] != ':')
            q--;
        rl->line = (uint32_t)strtoul(q, NULL, 10);
        rl->col = (uint32_t)strtoul(p + 1, NULL, 10);
    }
    if (mx_pat_compile(c.rollout, &rl->rollout, err, sizeof(err))) {
        wb_errlist_add(el, "%s: rollout: %s", at, err);
        r = -WB_E_CONFIG;
        goto out;
    }
    if (*c.stack && !(rl->stack_var = strdup(c.stack))) {
        r = -ENOMEM;
        goto out;
    }
    if (*c.index && !(rl->index_var = strdup(c.index))) {
        r = -ENOMEM;
        goto out;
    }
    if (rl->stack_var && rl->index_var) {
        wb_errlist_add(el, "%s: a rule cannot both stack and index", at);
        r = -WB_E_CONFIG;
        goto out;
    }
    if (rl->stack_var && mx_pat_has_cap(&rl->rollout, rl->stack_var)) {
        wb_errlist_add(el,
                       "%s: stack: {%s} is captured by rollout '%s'; the stack variable runs "
                       "over rollout dim 0 and must not be in its name",
                       at, rl->stack_var, c.rollout);
        r = -WB_E_CONFIG;
        goto out;
    }
    if (rl->index_var && !mx_pat_has_cap(&rl->rollout, rl->index_var)) {
        wb_errlist_add(el, "%s: index: {%s} is not captured by rollout '%s'", at, rl->index_var,
                       c.rollout);
        r = -WB_E_CONFIG;
        goto out;
    }
    if (c.dim >= WB_MAX_DIMS) {
        wb_errlist_add(el, "%s: dim: %llu is not a dimension (0..%d)", at,
                       (unsigned long long)c.dim, WB_MAX_DIMS - 1);
        r = -WB_E_CONFIG;
        goto out;
    }
    rl->dim = (uint32_t)c.dim;
    if ((r = load_patterns(y, c.from, "from", &rl->from, &rl->nfrom, el)))
        goto out;
    if (!rl->nfrom) {
        wb_errlist_add(el, "%s: from: needs at least one trainer name", at);
        r = -WB_E_CONFIG;
        goto out;
    }
    for (size_t i = 0; i < rl->nfrom; i++)
        if (check_template(rl, &rl->from[i], at, el))
            r = -WB_E_CONFIG;
    if (*c.tied) {
        if (mx_pat_compile(c.tied, &rl->tied, err, sizeof(err))) {
            wb_errlist_add(el, "%s: tied: %s", at, err);
            r = -WB_E_CONFIG;
        } else if (check_template(rl, &rl->tied, at, el)) {
            r = -WB_E_CONFIG;
        }
    }
    if (rl->stack_var) {
        rl->kind = WB_RULE_STACK;
        if (rl->nfrom > 1 && rl->dim == 0) {
            wb_errlist_add(el,
                           "%s: dim: stacked components are concatenated along a rollout "
                           "dim >= 1 (dim 0 holds the stack)",
                           at);
            r = -WB_E_CONFIG;
        }
    } else if (rl->index_var) {
        rl->kind = WB_RULE_UNSTACK;
        if (rl->nfrom != 1) {
            wb_errlist_add(el, "%s: from: index takes exactly one stacked trainer tensor", at);
            r = -WB_E_CONFIG;
        }
    } else {
        rl->kind = rl->nfrom > 1 ? WB_RULE_FUSE : WB_RULE_FROM;
    }
    if (rl->tied.src && rl->kind != WB_RULE_FROM) {
        wb_errlist_add(el, "%s: tied: only for a rule with a single `from`", at);
        r = -WB_E_CONFIG;
    }
    if (c.chunk) {
        const struct wb_ynode *a = wb_ynode_item(y, c.chunk, 0), *b = wb_ynode_item(y, c.chunk, 1);
        uint64_t i, k;
        if (wb_ynode_kind(c.chunk) != WB_YNODE_SEQ || wb_ynode_len(c.chunk) != 2 ||
            wb_parse_u64(wb_ynode_scalar(a), &i) || wb_parse_u64(wb_ynode_scalar(b), &k) ||
            k == 0 || i >= k || k > 1024) {
            wb_errlist_add(el, "%s: chunk: expected [i, n] with 0 <= i < n",
                           wb_yaml_where(y, c.chunk, err, sizeof(err)));
            r = -WB_E_CONFIG;
        } else if (rl->kind != WB_RULE_UNSTACK) {
            wb_errlist_add(el, "%s: chunk: only with index", at);
            r = -WB_E_CONFIG;
        } else {
            rl->chunk_i = (uint32_t)i;
            rl->chunk_n = (uint32_t)k;
        }
    }
    int e = c.permute ? load_permute(y, c.permute, rl, el) : 0;
    r = e ? e : r; /* -WB_E_CONFIG (said) or -ENOMEM */
    e = c.split ? load_split(y, c.split, rl, el) : 0;
    r = e ? e : r;
    if (*c.groups) {
        const struct wb_ynode *gn = wb_ynode_get(y, n, "groups");
        char gat[300];
        wb_yaml_where(y, gn ? gn : n, gat, sizeof(gat));
        if (!c.split) {
            wb_errlist_add(el, "%s: groups: only with split (the components of one group)", gat);
            r = r ? r : -WB_E_CONFIG;
        } else if ((e = mx_expr_compile(c.groups, &rl->groups, err, sizeof(err)))) {
            if (e == -ENOMEM)
                r = e;
            else {
                wb_errlist_add(el, "%s: groups: bad expression '%s': %s", gat, c.groups, err);
                r = r ? r : -WB_E_CONFIG;
            }
        }
    }
    e = mx_naming_mask(f, c.naming, &rl->naming, el);
    r = e ? e : r;
    e = load_shard(y, c.shard, rl, el);
    r = e ? e : r;
    rl->optional = c.optional;
    const struct wb_pat_seg *last = &rl->rollout.seg[rl->rollout.nseg - 1];
    if (last->kind == WB_SEG_LIT) {
        rl->suffix = last->text;
        rl->suffix_len = last->len;
    }
out:
    wb_cfg_free(rule_table, &c);
    return r;
}

static int rules_load(const char *path, struct wb_match_rules **out, struct wb_errlist *el);

enum { RULES_COVER_BUDGET = 1 << 18 };

int wb_match_rules_load(const char *path, struct wb_match_rules **out, struct wb_errlist *el)
{
    size_t before = el->n;
    int r = rules_load(path, out, el);
    if (r == -ENOMEM && el->n == before)
        wb_errlist_add(el, "%s: out of memory loading the rules", path);
    return r;
}

static int rules_load(const char *path, struct wb_match_rules **out, struct wb_errlist *el)
{
    struct wb_family *f;
    int r = mx_family_open(path, &f, el);
    if (r)
        return r;
    struct wb_match_rules *rs = calloc(1, sizeof(*rs));
    if (!rs) {
        mx_family_close(f);
        return -ENOMEM;
    }
    rs->fam = f; /* kept open: the inventories are generated from it (wb_match_rules_generate) */
    if (!(rs->path = strdup(path)) || !(rs->family = strdup(f->family)) ||
        !(rs->scale_suffix = strdup(f->quant.scale_suffix))) {
        r = -ENOMEM;
        goto err;
    }
    const struct wb_yaml *y = f->y;
    rs->vars = f->dv;
    rs->nvars = f->ndv;
    rs->model_types = f->model_types;
    rs->nmodel_types = f->nmodel_types;
    snprintf(rs->model_type_at, sizeof(rs->model_type_at), "%s", f->model_type_at);
    if (f->quant.fp8) {
        char at[300];
        wb_yaml_where(y, f->quant.fp8, at, sizeof(at));
        const char *p = strrchr(at, ':'), *q = p;
        while (q > at && q[-1] != ':')
            q--;
        rs->fp8_line = (uint32_t)strtoul(q, NULL, 10);
    }
    int lr = load_patterns(y, f->quant.fp8, "quant.fp8", &rs->fp8, &rs->nfp8, el);
    int tr = load_patterns(y, f->ignore.trainer, "ignore.trainer", &rs->ign_trainer,
                           &rs->nign_trainer, el);
    int rr = load_patterns(y, f->ignore.rollout, "ignore.rollout", &rs->ign_rollout,
                           &rs->nign_rollout, el);
    r = lr ? lr : tr ? tr : rr;
    if (wb_ynode_kind(f->rules) != WB_YNODE_SEQ) {
        wb_errlist_add(el, "%s: no \"rules\" section (a list of rules)", path);
        r = -WB_E_CONFIG;
        goto err;
    }
    size_t n = wb_ynode_len(f->rules);
    /* the shadow check's steps over the whole file (mx_pat_covers): deepseek_v3.yaml needs
     * 13,920, the others under 100; past the bound (a file of thousands of rules, or hostile
     * patterns) the rest is loaded without it, in bounded time */
    uint64_t budget = RULES_COVER_BUDGET;
    if (!(rs->r = calloc(n + 1, sizeof(*rs->r)))) {
        r = -ENOMEM;
        goto err;
    }
    for (size_t i = 0; i < n; i++) {
        struct wb_rule *rl = &rs->r[rs->n];
        const struct wb_ynode *node = wb_ynode_item(y, f->rules, i);
        int e = load_rule(f, node, rl, el);
        rs->n++; /* freed with the rest, even when half loaded */
        if (e) {
            r = r ? r : e;
            continue;
        }
        char at[300];
        wb_yaml_where(y, node, at, sizeof(at));
        bool said = false;
        for (size_t k = 0; k + 1 < rs->n && !said; k++) {
            /* rules of different namings never meet */
            if (!rs->r[k].rollout.src || !(rs->r[k].naming & rl->naming))
                continue;
            if (strcmp(rs->r[k].rollout.src, rl->rollout.src) == 0) {
                wb_errlist_add(el, "%s: rollout '%s' duplicates the rule at line %u", at,
                               rl->rollout.src, rs->r[k].line);
                r = -WB_E_CONFIG;
                said = true;
                continue;
            }
            /* the first rule that matches builds the tensor: a later rule whose names an
             * earlier one all matches (a catch-all placed first) never runs */
            int c = mx_pat_covers(&rs->r[k].rollout, &rl->rollout, &budget);
            if (c == -ENOMEM) {
                r = c;
                goto err;
            }
            if (c == 1) {
                wb_errlist_add(el,
                               "%s: the rule for rollout '%s' can never build a tensor: the rule "
                               "at line %u (rollout '%s') comes first and matches every name it "
                               "matches",
                               at, rl->rollout.src, rs->r[k].line, rs->r[k].rollout.src);
                r = -WB_E_CONFIG;
                said = true;
            }
        }
        for (size_t k = 0; k < rs->nign_rollout && !said; k++) {
            int c = mx_pat_covers(&rs->ign_rollout[k], &rl->rollout, &budget);
            if (c == -ENOMEM) {
                r = c;
                goto err;
            }
            if (c == 1) {
                wb_errlist_add(el,
                               "%s: the rule for rollout '%s' can never build a tensor: "
                               "ignore.rollout '%s' matches every name it matches",
                               at, rl->rollout.src, rs->ign_rollout[k].src);
                r = -WB_E_CONFIG;
                said = true;
            }
        }
    }
    if (r)
        goto err;
    *out = rs;
    return 0;
err:
    wb_match_rules_free(rs); /* f with it */
    return r;
}

/* config.json at `path` as these rules read it: parsed on its first use, then kept, so that a
 * model's load reads each file once (both inventories and the binding). A file that fails to
 * parse is not kept; its problems go to el each time. */
static int rules_config(struct wb_match_rules *r, const char *path, const struct wb_jcfg **out,
                        struct wb_errlist *el)
{
    for (size_t i = 0; i < r->ncfgs; i++)
        if (strcmp(r->cfgs[i]->path, path) == 0) {
            *out = r->cfgs[i];
            return 0;
        }
    struct wb_jcfg **grown = realloc(r->cfgs, (r->ncfgs + 1) * sizeof(*grown));
    if (!grown)
        return -ENOMEM;
    r->cfgs = grown;
    struct wb_jcfg *c = NULL;
    int e = mx_jcfg_load(path, &c, el);
    if (e)
        return e;
    r->cfgs[r->ncfgs++] = c;
    *out = c;
    return 0;
}

int wb_match_rules_bind_config(struct wb_match_rules *r, const char *config_json,
                               struct wb_errlist *el)
{
    const struct wb_jcfg *c = NULL;
    int e = rules_config(r, config_json, &c, el);
    if (!e)
        e = mx_check_model_type(r->model_types, r->nmodel_types, r->model_type_at, c, el);
    if (e)
        return e;
    r->cfg = c;
    return 0;
}

int wb_match_rules_generate(struct wb_match_rules *r, const char *config_json, const char *side,
                            struct wb_inventory *inv, struct wb_errlist *el)
{
    size_t before = el->n;
    const struct wb_jcfg *cfg = NULL;
    int e = side && (strcmp(side, "trainer") == 0 || strcmp(side, "rollout") == 0)
                ? rules_config(r, config_json, &cfg, el)
                : 0; /* mx_inv_generate_parsed says what is wrong with side */
    if (!e)
        e = mx_inv_generate_parsed(r->fam, r->path, cfg, r->sets, r->nsets, r->naming, side, inv,
                                   el);
    /* an allocation failure is an error with a message, never an empty success */
    if (e == -ENOMEM && el->n == before)
        wb_errlist_add(el, "%s: out of memory generating the %s inventory", r->path, side);
    return e;
}

void wb_match_rules_partial_rollout(struct wb_match_rules *r, bool partial)
{
    r->partial_rollout = partial;
}

int wb_match_rules_set_vars(struct wb_match_rules *r, const char *vars, struct wb_errlist *el)
{
    struct wb_xvar *sets;
    size_t n;
    char *buf;
    int e = mx_vars_parse(vars, r->vars, r->nvars, r->path, &sets, &n, &buf, el);
    if (e)
        return e;
    free(r->sets);
    free(r->sets_buf);
    r->sets = sets;
    r->nsets = n;
    r->sets_buf = buf;
    return 0;
}

int wb_match_rules_set_naming(struct wb_match_rules *r, const char *naming, struct wb_errlist *el)
{
    uint32_t idx;
    int e = mx_naming_index(r->fam, r->path, naming, &idx, el);
    if (!e)
        r->naming = idx;
    return e;
}

size_t wb_match_rules_namings(const struct wb_match_rules *r, const char *const **names)
{
    *names = (const char *const *)r->fam->namings;
    return r->fam->nnamings;
}

const char *wb_match_rules_naming(const struct wb_match_rules *r)
{
    return r->fam->namings[r->naming];
}

bool wb_match_rules_has_var(const struct wb_match_rules *r, const char *name)
{
    for (size_t i = 0; i < r->nvars; i++)
        if (strcmp(r->vars[i].name, name) == 0)
            return true;
    return false;
}
