/* match.c — wb_match_run: decides how every rollout tensor is built from trainer tensors.
 *
 * The passes follow the reference design (blog 02, 训推参数匹配):
 *  1. quant grouping: on each side "X" + "X<scale_suffix>" become one quantized parameter;
 *  2. per rollout value tensor, the first rule whose pattern matches builds the mapping:
 *     rename / tie / fuse along a dim / stack per-expert tensors / take a slice of a stacked
 *     trainer tensor; every trainer name is looked up in the trainer's hash index;
 *  3. checks on each mapping: trainer tensors present, shapes agree after fusion/stacking,
 *     dtype conversion supported, FP8 scale present with the right shape, fused components
 *     aligned to the quantization block (only the last may end unaligned, as vLLM allows);
 *  4. trainer coverage: every trainer tensor used exactly once (elements counted, so slices
 *     of a stacked tensor add up), unless declared ignorable; tied weights are extra uses.
 * Every problem goes to the error list; nothing stops at the first. The work is linear in
 * the number of tensors (one hash probe per trainer name), so a 70k-tensor Kimi-K2 inventory
 * matches in tens of milliseconds. */
#include "matcher/mpriv.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct mctx {
    const struct wb_match_rules *rs;
    const struct wb_inventory *T, *R;
    struct wb_errlist *el;
    int32_t *r_scale, *t_scale; /* value -> its scale tensor, or -1 */
    uint8_t *r_is_scale, *t_is_scale;
    uint64_t *t_used;  /* elements of each trainer tensor consumed */
    int32_t *t_user;   /* first rollout tensor using it */
    uint8_t *t_over;   /* over-use already reported */
    uint8_t *t_failed; /* named by a mapping that failed: not reported as unused */
    int64_t *head_dim; /* per rule; 0 = none, -1 = could not be evaluated */
    /* per rule, WB_SPLIT_MAX each: a split rule's component sizes; -1 = could not be
     * evaluated (said when a tensor uses the rule, as head_dim) */
    int64_t *split_size;
    int64_t *groups;      /* per rule: a split's groups (1 without `groups`), -1 = error */
    uint32_t *rule_built; /* per rule: rollout tensors it built (or tried to) */
    struct wb_mapping *map;
    size_t n, cap;
    size_t nerr;
    int fatal; /* -ENOMEM */
    /* scale tensors of the wrong dtype: one line per side however many (a whole checkpoint's
     * scales saved in BF16 is one problem, not one per tensor) */
    struct {
        size_t n;
        uint32_t tensor, line;
    } bad_scale[2]; /* 0: trainer, 1: rollout */
};

static void bad_scale_dtype(struct mctx *c, int side, uint32_t tensor, uint32_t line)
{
    if (c->bad_scale[side].n++ == 0) {
        c->bad_scale[side].tensor = tensor;
        c->bad_scale[side].line = line;
    }
}

static void merr(struct mctx *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void merr(struct mctx *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    if (wb_errlist_vadd(c->el, fmt, ap))
        c->fatal = -ENOMEM;
    va_end(ap);
    c->nerr++;
}

static char *shp(const struct wb_shape *s, char *buf, size_t cap)
{
    return wb_shape_str(s, buf, cap);
}

static bool ends_with(const char *s, size_t len, const char *suf, size_t n)
{
    return len >= n && memcmp(s + len - n, suf, n) == 0;
}

/* Pass 1: pairs "X" with "X<suffix>" on one side. */
static void group_scales(struct mctx *c, const struct wb_inventory *inv, int32_t *scale_of,
                         uint8_t *is_scale, const char *side)
{
    const char *suf = c->rs->scale_suffix;
    size_t sl = strlen(suf);
    for (size_t i = 0; i < inv->n; i++)
        scale_of[i] = -1;
    for (size_t i = 0; i < inv->n; i++) {
        const char *name = inv->p[i].name;
        size_t len = strlen(name);
        if (!ends_with(name, len, suf, sl) || len == sl)
            continue;
        char base[WB_NAME_MAX];
        memcpy(base, name, len - sl);
        base[len - sl] = 0;
        ssize_t v = wb_inv_find(inv, base);
        if (v < 0) {
            merr(c, "%s: %s scale tensor without its value tensor %s", name, side, base);
            is_scale[i] = 1;
            continue;
        }
        scale_of[v] = (int32_t)i;
        is_scale[i] = 1;
    }
}

static bool any_match(const struct wb_pat *p, size_t n, const char *name)
{
    struct wb_caps caps;
    for (size_t i = 0; i < n; i++)
        if (mx_pat_match(&p[i], name, &caps))
            return true;
    return false;
}

/* A rule-level expression (a shard's head_dim, a split's sizes) over the bound config and the
 * job's vars: 0 and *out, or an error in err. Values must be positive. */
static int eval_rule_expr(const struct mctx *c, const struct wb_expr *e, int64_t *out, char *err,
                          size_t errcap)
{
    const struct wb_match_rules *rs = c->rs;
    struct wb_xenv env = {.sets = rs->sets,
                          .nsets = rs->nsets,
                          .cfg = rs->cfg,
                          .derived = rs->vars,
                          .nderived = rs->nvars};
    int64_t v;
    int r = mx_expr_eval_num(e, &env, &v, err, errcap);
    if (r == 0 && v <= 0) {
        snprintf(err, errcap, "not positive (%lld)", (long long)v);
        r = -EINVAL;
    }
    if (r == 0)
        *out = v;
    return r;
}

/* A dropped split component's size may be 0 (Megatron's vocab padding when the vocab divides
 * already); eval_rule_expr's "not positive (0)" is then no error. */
static int eval_split_expr(const struct mctx *c, const struct wb_split *sp, int64_t *out, char *err,
                           size_t errcap)
{
    int r = eval_rule_expr(c, sp->size, out, err, errcap);
    if (r == -EINVAL && sp->drop && strcmp(err, "not positive (0)") == 0) {
        *out = 0;
        return 0;
    }
    return r;
}

/* Groups of a grouped split: at most this many (each group is a component per name). */
enum { WB_SPLIT_MAX_GROUPS = 4096 };

static int eval_groups(const struct mctx *c, const struct wb_rule *rl, int64_t *out, char *err,
                       size_t errcap)
{
    if (!rl->groups) {
        *out = 1;
        return 0;
    }
    int r = eval_rule_expr(c, rl->groups, out, err, errcap);
    if (r == 0 && *out > WB_SPLIT_MAX_GROUPS) {
        snprintf(err, errcap, "%lld groups, more than %d", (long long)*out, WB_SPLIT_MAX_GROUPS);
        r = -E2BIG;
    }
    return r;
}

static void eval_split_sizes(struct mctx *c)
{
    for (size_t i = 0; i < c->rs->n; i++) {
        const struct wb_rule *rl = &c->rs->r[i];
        char err[256];
        int64_t v;
        for (size_t k = 0; k < rl->nsplit; k++)
            c->split_size[i * WB_SPLIT_MAX + k] =
                eval_split_expr(c, &rl->split[k], &v, err, sizeof(err)) ? -1 : v;
        c->groups[i] = eval_groups(c, rl, &v, err, sizeof(err)) ? -1 : v;
    }
}

/* The per-rule head size, evaluated once per match over the bound config and the vars. */
static void eval_head_dims(struct mctx *c)
{
    for (size_t i = 0; i < c->rs->n; i++) {
        const struct wb_rule *rl = &c->rs->r[i];
        char err[256];
        int64_t v;
        /* -1: reported when a tensor uses the rule, with the tensor's name */
        c->head_dim[i] = !rl->head_dim                                           ? 0
                         : eval_rule_expr(c, rl->head_dim, &v, err, sizeof(err)) ? -1
                                                                                 : v;
    }
}

/* ---------------------------------------------------------------- building one mapping */

struct build {
    struct mctx *c;
    size_t ri; /* rollout index */
    const struct wb_rule *rl;
    const struct wb_caps *caps;
    const struct wb_param *R;
    struct wb_component *comp;
    size_t ncomp, cap;
    size_t nmissing;
    char missing[3][WB_NAME_MAX];
    bool bad;
    uint64_t dropped; /* split: elements of each trainer tensor cut off (`_` components) */
};

static int push_comp(struct build *b, uint32_t t, const struct wb_box *src,
                     const struct wb_box *dst)
{
    if (b->ncomp == b->cap && wb_grow(&b->comp, &b->cap, 4, sizeof(*b->comp)) != 0) {
        b->c->fatal = -ENOMEM;
        return -ENOMEM;
    }
    b->comp[b->ncomp++] =
        (struct wb_component){.trainer = t, .src = *src, .dst = *dst, .trainer_scale = -1};
    return 0;
}

/* Component i's name in messages: a split rule's name for it ("k", "q of group 1": found by
 * its place in the rollout tensor), else its trainer tensor's label ("k_proj"). */
static void comp_label(const struct build *b, size_t i, char *buf, size_t cap)
{
    const struct wb_rule *rl = b->rl;
    const struct mctx *c = b->c;
    if (rl->nsplit) {
        size_t ri = (size_t)(rl - c->rs->r);
        const int64_t *size = &c->split_size[ri * WB_SPLIT_MAX];
        int64_t g = c->groups[ri] > 0 ? c->groups[ri] : 1;
        const struct wb_box *dst = &b->comp[i].dst;
        uint32_t d = rl->dim;
        uint64_t at = d < dst->ndim ? dst->off[d] : 0, off = 0;
        for (size_t k = 0; k < rl->nsplit; k++) {
            if (rl->split[k].drop || size[k] <= 0)
                continue;
            uint64_t ext = (uint64_t)size[k] * (uint64_t)g;
            if (at >= off && at < off + ext) {
                if (g == 1)
                    snprintf(buf, cap, "%s", rl->split[k].name);
                else
                    snprintf(buf, cap, "%s of group %llu", rl->split[k].name,
                             (unsigned long long)((at - off) / (uint64_t)size[k]));
                return;
            }
            off += ext;
        }
    }
    mx_name_label(c->T->p[b->comp[i].trainer].name, buf, cap);
}

static void note_missing(struct build *b, const char *name)
{
    if (b->nmissing < 3)
        snprintf(b->missing[b->nmissing], WB_NAME_MAX, "%s", name);
    b->nmissing++;
    b->bad = true;
}

static void report_missing(struct build *b)
{
    if (!b->nmissing)
        return;
    struct mctx *c = b->c;
    const char *path = c->rs->path;
    unsigned line = b->rl->line;
    if (b->nmissing == 1)
        merr(c, "%s: trainer tensor %s not found (rule %s:%u)", b->R->name, b->missing[0], path,
             line);
    else
        merr(c, "%s: %zu trainer tensors not found: %s, %s%s%s%s (rule %s:%u)", b->R->name,
             b->nmissing, b->missing[0], b->missing[1], b->nmissing > 2 ? ", " : "",
             b->nmissing > 2 ? b->missing[2] : "", b->nmissing > 3 ? ", ..." : "", path, line);
}

static ssize_t lookup(struct build *b, const struct wb_pat *t, const char *over, uint64_t val,
                      char *name)
{
    int r = mx_pat_subst(t, b->caps, over, val, name, WB_NAME_MAX);
    if (r) {
        merr(b->c, "%s: cannot build a trainer name from '%s' (rule %s:%u)", b->R->name, t->src,
             b->c->rs->path, b->rl->line);
        b->bad = true;
        return -1;
    }
    return wb_inv_find(b->c->T, name);
}

/* "q_proj 4096 + k_proj 1024 + v_proj 1024" */
static void parts_str(struct build *b, size_t first, size_t count, uint32_t dim, char *buf,
                      size_t cap)
{
    size_t pos = 0;
    buf[0] = 0;
    for (size_t i = 0; i < count && pos < cap; i++) {
        const struct wb_param *t = &b->c->T->p[b->comp[first + i].trainer];
        char label[WB_NAME_MAX];
        mx_name_label(t->name, label, sizeof(label));
        uint64_t ext = dim < t->shape.ndim ? t->shape.dim[dim] : 0;
        pos += (size_t)snprintf(buf + pos, cap - pos, "%s%s %llu", i ? " + " : "", label,
                                (unsigned long long)ext);
    }
}

/* A transposed rename: rollout dim k is trainer dim perm[k]. */
static void build_permuted(struct build *b, uint32_t t)
{
    struct mctx *c = b->c;
    const struct wb_rule *rl = b->rl;
    const struct wb_param *T = &c->T->p[t];
    const struct wb_shape *rs = &b->R->shape;
    struct wb_box src = wb_box_full(&T->shape), dst = wb_box_full(rs);
    if (push_comp(b, t, &src, &dst))
        return;
    struct wb_component *cp = &b->comp[b->ncomp - 1];
    cp->permuted = true;
    memcpy(cp->perm, rl->perm, sizeof(cp->perm));
    struct wb_shape want = {.ndim = T->shape.ndim};
    bool ok = T->shape.ndim == rl->nperm;
    for (uint32_t k = 0; ok && k < rl->nperm; k++)
        want.dim[k] = T->shape.dim[rl->perm[k]];
    if (ok && wb_shape_eq(&want, rs))
        return;
    char a[128], s[128], w[128], p[64];
    size_t pos = 0;
    for (uint32_t k = 0; k < rl->nperm && pos < sizeof(p); k++)
        pos += (size_t)snprintf(p + pos, sizeof(p) - pos, "%s%u", k ? ", " : "", rl->perm[k]);
    if (!ok)
        merr(c, "%s: permute [%s] has %u dims, trainer tensor %s %s has %u (rule %s:%u)",
             b->R->name, p, rl->nperm, T->name, shp(&T->shape, s, sizeof(s)), T->shape.ndim,
             c->rs->path, rl->line);
    else
        merr(c, "%s: rollout shape %s != trainer shape %s permuted [%s] = %s (%s) (rule %s:%u)",
             b->R->name, shp(rs, a, sizeof(a)), shp(&T->shape, s, sizeof(s)), p,
             shp(&want, w, sizeof(w)), T->name, c->rs->path, rl->line);
    b->bad = true;
}

/* A split: trainer tensor t, fused already (Phi-3's qkv_proj), cut along the rule's dim into
 * its named components, each at its place in the rollout tensor, so that a TP split takes each
 * one's share (rank r: [q_r; k_r; v_r]) as it does for a fuse rule's components. With `groups`
 * the tensor is G repetitions of the components (Megatron's linear_qkv: per query group [q; k;
 * v]); component c of group g goes to c's place, group g's slot, and continues the rollout part
 * of group g-1's piece (joins_prev), so that the rollout's TP split sees one q, one k, one v.
 * Components named `_` are cut off. Stacked (e = expert): the pieces go to rollout [e, ...].
 * The trainer tensor must be G x the sizes along the dim; the rollout (item) shape must be the
 * trainer's less the dropped parts. */
static void build_split_pieces(struct build *b, uint32_t t, bool stacked, uint64_t e);

/* A split that fails leaves its trainer tensor failed, not unused (one problem, said once). */
static void build_split(struct build *b, uint32_t t, bool stacked, uint64_t e)
{
    bool was = b->bad;
    build_split_pieces(b, t, stacked, e);
    if (b->bad && !was)
        b->c->t_failed[t] = 1;
}

static void build_split_pieces(struct build *b, uint32_t t, bool stacked, uint64_t e)
{
    struct mctx *c = b->c;
    const struct wb_rule *rl = b->rl;
    const struct wb_param *T = &c->T->p[t];
    const char *path = c->rs->path;
    char s[128], a[128];
    size_t ri = (size_t)(rl - c->rs->r);
    uint32_t dd = rl->dim, d = stacked ? dd - 1 : dd; /* rollout dim, trainer dim */
    if (d >= T->shape.ndim) {
        merr(c, "%s: split along dim %u, but trainer tensor %s %s has %u dims (rule %s:%u)",
             b->R->name, d, T->name, shp(&T->shape, s, sizeof(s)), T->shape.ndim, path, rl->line);
        b->bad = true;
        return;
    }
    char err[256];
    int64_t v;
    if (c->groups[ri] < 0) {
        eval_groups(c, rl, &v, err, sizeof(err));
        merr(c, "%s: split groups '%s': %s (rule %s:%u)", b->R->name, mx_expr_text(rl->groups), err,
             path, rl->line);
        b->bad = true;
        return;
    }
    uint64_t g = (uint64_t)c->groups[ri];
    const int64_t *size = &c->split_size[ri * WB_SPLIT_MAX];
    uint64_t sum = 0, kept = 0;
    for (size_t k = 0; k < rl->nsplit; k++) {
        if (size[k] < 0) {
            eval_split_expr(c, &rl->split[k], &v, err, sizeof(err));
            merr(c, "%s: split %s: '%s': %s (rule %s:%u)", b->R->name, rl->split[k].name,
                 mx_expr_text(rl->split[k].size), err, path, rl->line);
            b->bad = true;
            return;
        }
        /* saturating: 16 sizes below 2^63 may pass 2^64; a size above the dim is wrong, and
         * sizes up to it (2^48) add up without overflow */
        sum = sum == UINT64_MAX || (uint64_t)size[k] > T->shape.dim[d] ? UINT64_MAX
                                                                       : sum + (uint64_t)size[k];
        if (!rl->split[k].drop)
            kept += (uint64_t)size[k] <= T->shape.dim[d] ? (uint64_t)size[k] : 0;
    }
    /* g <= 4096 and sum <= 2^48 unless saturated: no overflow */
    uint64_t total = sum == UINT64_MAX ? UINT64_MAX : sum * g;
    if (total != T->shape.dim[d]) {
        char parts[512], tot[64] = "more";
        size_t pos = 0;
        for (size_t k = 0; k < rl->nsplit && pos < sizeof(parts); k++)
            pos += (size_t)snprintf(parts + pos, sizeof(parts) - pos, "%s%s %lld", k ? " + " : "",
                                    rl->split[k].name, (long long)size[k]);
        if (total != UINT64_MAX && g > 1)
            snprintf(tot, sizeof(tot), "%llu, x %llu groups = %llu", (unsigned long long)sum,
                     (unsigned long long)g, (unsigned long long)total);
        else if (total != UINT64_MAX)
            snprintf(tot, sizeof(tot), "%llu", (unsigned long long)total);
        merr(c, "%s: split %s = %s, but trainer tensor %s %s has %llu along dim %u (rule %s:%u)",
             b->R->name, parts, tot, T->name, shp(&T->shape, s, sizeof(s)),
             (unsigned long long)T->shape.dim[d], d, path, rl->line);
        b->bad = true;
        return;
    }
    /* the rollout (item) shape: the trainer's less what is dropped */
    struct wb_shape want = T->shape, got = b->R->shape;
    want.dim[d] = kept * g;
    if (stacked) {
        got.ndim = b->R->shape.ndim ? b->R->shape.ndim - 1 : 0;
        for (uint32_t k = 0; k < got.ndim; k++)
            got.dim[k] = b->R->shape.dim[k + 1];
    }
    if (!wb_shape_eq(&want, &got)) {
        if (kept * g == T->shape.dim[d])
            merr(c, "%s: rollout shape %s != trainer shape %s (%s) (rule %s:%u)", b->R->name,
                 shp(&b->R->shape, a, sizeof(a)), shp(&T->shape, s, sizeof(s)), T->name, path,
                 rl->line);
        else {
            char w[128];
            merr(c,
                 "%s: rollout shape %s != trainer shape %s less the dropped `_` components = %s "
                 "(%s) (rule %s:%u)",
                 b->R->name, shp(&b->R->shape, a, sizeof(a)), shp(&T->shape, s, sizeof(s)),
                 shp(&want, w, sizeof(w)), T->name, path, rl->line);
        }
        b->bad = true;
        return;
    }
    uint64_t outer = 1; /* elements per unit along d: the dims other than d */
    for (uint32_t k = 0; k < T->shape.ndim; k++)
        outer *= k == d ? 1 : T->shape.dim[k];
    b->dropped = (T->shape.dim[d] - kept * g) * outer;
    uint64_t coff = 0; /* component c's place in the rollout along d */
    for (size_t k = 0; k < rl->nsplit; k++) {
        if (rl->split[k].drop)
            continue;
        uint64_t in = 0; /* component k's offset within a group of the trainer tensor */
        for (size_t j = 0; j < k; j++)
            in += (uint64_t)size[j];
        for (uint64_t gi = 0; gi < g; gi++) {
            struct wb_box src = wb_box_full(&T->shape), dst;
            src.off[d] = gi * sum + in;
            src.ext[d] = (uint64_t)size[k];
            dst = src;
            dst.off[d] = coff + gi * (uint64_t)size[k];
            if (stacked) {
                dst.ndim = src.ndim + 1;
                for (uint32_t q = src.ndim; q > 0; q--) {
                    dst.off[q] = dst.off[q - 1];
                    dst.ext[q] = dst.ext[q - 1];
                }
                dst.off[0] = e;
                dst.ext[0] = 1;
            }
            if (push_comp(b, t, &src, &dst))
                return;
            b->comp[b->ncomp - 1].joins_prev = gi > 0;
        }
        coff += (uint64_t)size[k] * g;
    }
}

static void build_from(struct build *b, enum wb_map_kind *kind)
{
    struct mctx *c = b->c;
    char name[WB_NAME_MAX], tied[WB_NAME_MAX];
    ssize_t t = lookup(b, &b->rl->from[0], NULL, 0, name);
    *kind = WB_MAP_RENAME;
    if (t < 0 && !b->bad && b->rl->tied.src) {
        t = lookup(b, &b->rl->tied, NULL, 0, tied);
        if (t >= 0)
            *kind = WB_MAP_TIE;
        else if (!b->bad) {
            merr(c, "%s: trainer tensor %s not found, nor tied %s (rule %s:%u)", b->R->name, name,
                 tied, c->rs->path, b->rl->line);
            b->bad = true;
            return;
        }
    }
    if (t < 0) {
        if (!b->bad)
            note_missing(b, name);
        return;
    }
    const struct wb_param *T = &c->T->p[t];
    struct wb_box full = wb_box_full(&T->shape);
    if (b->rl->nperm) {
        build_permuted(b, (uint32_t)t);
        return;
    }
    if (b->rl->nsplit) {
        build_split(b, (uint32_t)t, false, 0);
        return;
    }
    push_comp(b, (uint32_t)t, &full, &full);
    if (!wb_shape_eq(&T->shape, &b->R->shape)) {
        char a[128], s[128];
        merr(c, "%s: rollout shape %s != trainer shape %s (%s) (rule %s:%u)", b->R->name,
             shp(&b->R->shape, a, sizeof(a)), shp(&T->shape, s, sizeof(s)), T->name, c->rs->path,
             b->rl->line);
        b->bad = true;
        return;
    }
}

/* Concatenates the rule's `from` tensors along item dim d into the rollout box at leading
 * offset `lead` (stacking) or none. Returns false when a tensor is missing. Shapes are checked
 * by the caller against the rollout shape. */
static bool gather_fused(struct build *b, bool stacked, uint64_t e, uint32_t d)
{
    char name[WB_NAME_MAX];
    bool ok = true;
    uint64_t off = 0;
    for (size_t j = 0; j < b->rl->nfrom; j++) {
        ssize_t t = lookup(b, &b->rl->from[j], b->rl->stack_var, e, name);
        if (t < 0) {
            if (!b->bad || b->nmissing)
                note_missing(b, name);
            ok = false;
            continue;
        }
        const struct wb_param *T = &b->c->T->p[t];
        struct wb_box src = wb_box_full(&T->shape), dst = src;
        if (stacked) {
            dst.ndim = src.ndim + 1;
            for (uint32_t k = src.ndim; k > 0; k--) {
                dst.off[k] = src.off[k - 1];
                dst.ext[k] = src.ext[k - 1];
            }
            dst.off[0] = e;
            dst.ext[0] = 1;
        }
        uint32_t dd = stacked ? d + 1 : d;
        if (d < T->shape.ndim) {
            dst.off[dd] = off;
            off += T->shape.dim[d];
        }
        if (push_comp(b, (uint32_t)t, &src, &dst))
            return false;
    }
    return ok;
}

/* Checks that the components starting at `first` (count of them, concatenated along item
 * dim d) make up `want`; reports "rollout shape != fused trainer shape (...)". */
static bool check_fused(struct build *b, size_t first, size_t count, uint32_t d,
                        const struct wb_shape *want, const struct wb_shape *rollout_shape,
                        uint64_t stack)
{
    struct mctx *c = b->c;
    const struct wb_param *T0 = &c->T->p[b->comp[first].trainer];
    struct wb_shape got = T0->shape;
    bool agree = true;
    uint64_t sum = 0;
    for (size_t i = 0; i < count; i++) {
        const struct wb_param *T = &c->T->p[b->comp[first + i].trainer];
        if (T->shape.ndim != got.ndim || d >= T->shape.ndim) {
            agree = false;
            continue;
        }
        for (uint32_t k = 0; k < got.ndim; k++)
            if (k != d && T->shape.dim[k] != got.dim[k])
                agree = false;
        sum += T->shape.dim[d];
    }
    char a[128], s[128], parts[512];
    if (!agree) {
        size_t pos = 0;
        parts[0] = 0;
        for (size_t i = 0; i < count && pos < sizeof(parts); i++) {
            const struct wb_param *T = &c->T->p[b->comp[first + i].trainer];
            char label[WB_NAME_MAX];
            mx_name_label(T->name, label, sizeof(label));
            pos += (size_t)snprintf(parts + pos, sizeof(parts) - pos, "%s%s %s", i ? ", " : "",
                                    label, shp(&T->shape, s, sizeof(s)));
        }
        merr(c, "%s: fused components do not agree outside dim %u: %s (rule %s:%u)", b->R->name, d,
             parts, c->rs->path, b->rl->line);
        b->bad = true;
        return false;
    }
    if (d < got.ndim)
        got.dim[d] = sum;
    if (wb_shape_eq(&got, want))
        return true;
    parts_str(b, first, count, d, parts, sizeof(parts));
    if (stack) {
        struct wb_shape full = {.ndim = got.ndim + 1};
        full.dim[0] = stack;
        for (uint32_t k = 0; k < got.ndim; k++)
            full.dim[k + 1] = got.dim[k];
        merr(c, "%s: rollout shape %s != stacked trainer shape %s (%llu x (%s)) (rule %s:%u)",
             b->R->name, shp(rollout_shape, a, sizeof(a)), shp(&full, s, sizeof(s)),
             (unsigned long long)stack, parts, c->rs->path, b->rl->line);
    } else {
        merr(c, "%s: rollout shape %s != fused trainer shape %s (%s) (rule %s:%u)", b->R->name,
             shp(rollout_shape, a, sizeof(a)), shp(&got, s, sizeof(s)), parts, c->rs->path,
             b->rl->line);
    }
    b->bad = true;
    return false;
}

static void build_fuse(struct build *b)
{
    if (!gather_fused(b, false, 0, b->rl->dim)) {
        report_missing(b);
        return;
    }
    check_fused(b, 0, b->ncomp, b->rl->dim, &b->R->shape, &b->R->shape, 0);
}

static void build_stack(struct build *b)
{
    struct mctx *c = b->c;
    const struct wb_shape *rs = &b->R->shape;
    if (rs->ndim < 2) {
        char a[128];
        merr(c, "%s: rollout shape %s has no stacked dim 0 (rule %s:%u)", b->R->name,
             shp(rs, a, sizeof(a)), c->rs->path, b->rl->line);
        b->bad = true;
        return;
    }
    struct wb_shape item = {.ndim = rs->ndim - 1};
    for (uint32_t k = 1; k < rs->ndim; k++)
        item.dim[k - 1] = rs->dim[k];
    uint32_t d = b->rl->nfrom > 1 ? b->rl->dim - 1 : 0;
    bool ok = true, shape_reported = false;
    if (b->rl->nsplit) { /* per-expert tensors fused already, each split */
        char name[WB_NAME_MAX];
        for (uint64_t e = 0; e < rs->dim[0] && !c->fatal; e++) {
            ssize_t t = lookup(b, &b->rl->from[0], b->rl->stack_var, e, name);
            if (t < 0) {
                if (!b->bad || b->nmissing)
                    note_missing(b, name);
                ok = false;
                continue;
            }
            if (!shape_reported) {
                bool was = b->bad;
                build_split(b, (uint32_t)t, true, e);
                shape_reported = b->bad && !was;
            }
        }
        if (!ok)
            report_missing(b);
        return;
    }
    for (uint64_t e = 0; e < rs->dim[0]; e++) {
        size_t first = b->ncomp;
        if (!gather_fused(b, true, e, d)) {
            ok = false;
            if (c->fatal)
                return;
            continue;
        }
        if (!shape_reported && !check_fused(b, first, b->ncomp - first, d, &item, rs, rs->dim[0]))
            shape_reported = true;
    }
    if (!ok)
        report_missing(b);
}

static void build_unstack(struct build *b)
{
    struct mctx *c = b->c;
    const struct wb_rule *rl = b->rl;
    char name[WB_NAME_MAX];
    ssize_t t = lookup(b, &rl->from[0], NULL, 0, name);
    if (t < 0) {
        if (!b->bad)
            note_missing(b, name);
        report_missing(b);
        return;
    }
    uint64_t e = 0;
    for (size_t k = 0; k < b->caps->n; k++)
        if (strcmp(b->caps->name[k], rl->index_var) == 0) {
            char num[24];
            snprintf(num, sizeof(num), "%.*s", (int)b->caps->len[k], b->caps->at[k]);
            wb_parse_u64(num, &e);
        }
    const struct wb_param *T = &c->T->p[t];
    const struct wb_shape *rs = &b->R->shape;
    char a[128], s[128];
    struct wb_box tfull = wb_box_full(&T->shape);
    if (push_comp(b, (uint32_t)t, &tfull, &tfull)) /* its boxes are set below when all is well */
        return;
    if (T->shape.ndim != rs->ndim + 1 || e >= T->shape.dim[0]) {
        merr(c, "%s: trainer tensor %s %s has no slice %llu for rollout shape %s (rule %s:%u)",
             b->R->name, T->name, shp(&T->shape, s, sizeof(s)), (unsigned long long)e,
             shp(rs, a, sizeof(a)), c->rs->path, rl->line);
        b->bad = true;
        return;
    }
    struct wb_box src = wb_box_full(&T->shape);
    src.off[0] = e;
    src.ext[0] = 1;
    struct wb_shape want = {.ndim = rs->ndim};
    for (uint32_t k = 0; k < rs->ndim; k++)
        want.dim[k] = T->shape.dim[k + 1];
    bool divisible = true;
    if (rl->chunk_n) {
        uint32_t d = rl->dim;
        if (d >= want.ndim || want.dim[d] % rl->chunk_n) {
            divisible = false;
        } else {
            uint64_t ext = want.dim[d] / rl->chunk_n;
            want.dim[d] = ext;
            src.off[d + 1] = rl->chunk_i * ext;
            src.ext[d + 1] = ext;
        }
    }
    if (!divisible || !wb_shape_eq(&want, rs)) {
        char chunk[96] = "";
        if (rl->chunk_n)
            snprintf(chunk, sizeof(chunk), ", chunk %u of %u along dim %u", rl->chunk_i,
                     rl->chunk_n, rl->dim);
        merr(c, "%s: rollout shape %s != trainer slice shape %s (%s[%llu]%s) (rule %s:%u)",
             b->R->name, shp(rs, a, sizeof(a)),
             divisible ? shp(&want, s, sizeof(s)) : "(not divisible)", T->name,
             (unsigned long long)e, chunk, c->rs->path, rl->line);
        b->bad = true;
        return;
    }
    b->comp[b->ncomp - 1].src = src;
    b->comp[b->ncomp - 1].dst = wb_box_full(rs);
}

/* dtype, FP8 scale and alignment checks; fills xform/dtypes/scale of m. */
static void check_dtypes(struct build *b, struct wb_mapping *m)
{
    struct mctx *c = b->c;
    const struct wb_match_rules *rs = c->rs;
    const struct wb_param *R = b->R;
    const char *path = rs->path;
    unsigned line = b->rl->line;
    char a[128], s[128];
    enum wb_dtype src = c->T->p[b->comp[0].trainer].dtype;
    for (size_t i = 1; i < b->ncomp; i++) {
        const struct wb_param *T = &c->T->p[b->comp[i].trainer];
        if (T->dtype != src) {
            merr(c, "%s: components have different dtypes: %s %s, %s %s (rule %s:%u)", R->name,
                 c->T->p[b->comp[0].trainer].name, wb_dtype_name(src), T->name,
                 wb_dtype_name(T->dtype), path, line);
            b->bad = true;
            return;
        }
    }
    m->src_dtype = src;
    m->dst_dtype = R->dtype;
    int32_t scale = c->r_scale[b->ri];
    bool floaty = src == WB_DTYPE_BF16 || src == WB_DTYPE_FP16 || src == WB_DTYPE_FP32;
    bool dfloaty =
        R->dtype == WB_DTYPE_BF16 || R->dtype == WB_DTYPE_FP16 || R->dtype == WB_DTYPE_FP32;
    if (R->dtype != WB_DTYPE_FP8_E4M3) {
        if (scale >= 0) {
            merr(c, "%s: rollout tensor has scale %s but dtype %s, not fp8_e4m3 (rule %s:%u)",
                 R->name, c->R->p[scale].name, wb_dtype_name(R->dtype), path, line);
            b->bad = true;
            return;
        }
        if (src == R->dtype)
            m->xform = WB_XFORM_COPY;
        else if (floaty && dfloaty)
            m->xform = WB_XFORM_CAST;
        else {
            merr(c, "%s: dtype conversion %s -> %s not supported (trainer %s) (rule %s:%u)",
                 R->name, wb_dtype_name(src), wb_dtype_name(R->dtype),
                 c->T->p[b->comp[0].trainer].name, path, line);
            b->bad = true;
        }
        return;
    }
    /* FP8 block-quantized rollout tensor */
    m->block = WB_FP8_BLOCK;
    if (!any_match(rs->fp8, rs->nfp8, R->name)) {
        merr(c,
             "%s: rollout dtype fp8_e4m3, but no quant.fp8 pattern of %s:%u allows FP8 for "
             "it (it stays in higher precision)",
             R->name, path, rs->fp8_line);
        b->bad = true;
        return;
    }
    if (scale < 0) {
        merr(c, "%s: rollout dtype fp8_e4m3 needs scale tensor %s%s (rule %s:%u)", R->name, R->name,
             rs->scale_suffix, path, line);
        b->bad = true;
        return;
    }
    m->scale = scale;
    const struct wb_param *S = &c->R->p[scale];
    if (R->shape.ndim < 2) {
        merr(c, "%s: fp8_e4m3 block quantization needs at least 2 dims, shape %s (rule %s:%u)",
             R->name, shp(&R->shape, a, sizeof(a)), path, line);
        b->bad = true;
        return;
    }
    struct wb_shape want = R->shape;
    for (uint32_t k = want.ndim - 2; k < want.ndim; k++)
        want.dim[k] = (want.dim[k] + WB_FP8_BLOCK - 1) / WB_FP8_BLOCK;
    if (wb_shape_eq(&S->shape, &want) && S->dtype != WB_DTYPE_FP32) {
        bad_scale_dtype(c, 1, (uint32_t)scale, line);
        b->bad = true;
    } else if (!wb_shape_eq(&S->shape, &want) || S->dtype != WB_DTYPE_FP32) {
        char r[128];
        merr(c, "%s: scale %s %s != expected fp32 %s for %s %s in %ux%u blocks (rule %s:%u)",
             S->name, wb_dtype_name(S->dtype), shp(&S->shape, a, sizeof(a)),
             shp(&want, s, sizeof(s)), R->name, shp(&R->shape, r, sizeof(r)), WB_FP8_BLOCK,
             WB_FP8_BLOCK, path, line);
        b->bad = true;
    }
    /* fused components: each must start on a block edge and end on one, except the one that
     * ends the tensor (vLLM allows the last merged partition to be unaligned) */
    uint32_t nd = R->shape.ndim;
    for (size_t i = 0; i < b->ncomp; i++) {
        const struct wb_box *dst = &b->comp[i].dst;
        for (uint32_t k = nd - 2; k < nd; k++) {
            uint64_t off = dst->off[k], end = off + dst->ext[k];
            if (off % WB_FP8_BLOCK == 0 && (end % WB_FP8_BLOCK == 0 || end == R->shape.dim[k]))
                continue;
            char label[WB_NAME_MAX];
            comp_label(b, i, label, sizeof(label));
            merr(c,
                 "%s: component %s [%llu, %llu) along dim %u is not aligned to %u-element "
                 "FP8 blocks; only the last component may end unaligned (rule %s:%u)",
                 R->name, label, (unsigned long long)off, (unsigned long long)end, k, WB_FP8_BLOCK,
                 path, line);
            b->bad = true;
            return;
        }
    }
    if (floaty) {
        m->xform = WB_XFORM_FP8_BLOCK;
        return;
    }
    if (src != WB_DTYPE_FP8_E4M3) {
        merr(c, "%s: dtype conversion %s -> fp8_e4m3 not supported (trainer %s) (rule %s:%u)",
             R->name, wb_dtype_name(src), c->T->p[b->comp[0].trainer].name, path, line);
        b->bad = true;
        return;
    }
    /* trainer already FP8 (checkpoint broadcast): values and scales are copied */
    if (b->comp[0].permuted) { /* the scale grid would have to be transposed too */
        merr(c,
             "%s: an FP8 trainer tensor cannot be copied transposed with its scales (rule %s:%u)",
             R->name, path, line);
        b->bad = true;
        return;
    }
    m->xform = WB_XFORM_COPY;
    for (size_t i = 0; i < b->ncomp; i++) {
        struct wb_component *cp = &b->comp[i];
        const struct wb_param *T = &c->T->p[cp->trainer];
        int32_t ts = c->t_scale[cp->trainer];
        struct wb_box sb;
        if (ts < 0) {
            merr(c, "%s: trainer tensor %s is fp8_e4m3 without scale %s%s (rule %s:%u)", R->name,
                 T->name, T->name, rs->scale_suffix, path, line);
            b->bad = true;
            continue;
        }
        struct wb_box tfull = wb_box_full(&T->shape), tsb;
        struct wb_box sfull = wb_box_full(&c->T->p[ts].shape);
        if (wb_scale_box(&cp->src, WB_FP8_BLOCK, &sb) || wb_scale_box(&tfull, WB_FP8_BLOCK, &tsb) ||
            !wb_box_eq(&sfull, &tsb)) {
            merr(c, "%s: trainer scale %s %s does not cover %s %s in %ux%u blocks (rule %s:%u)",
                 R->name, c->T->p[ts].name, shp(&c->T->p[ts].shape, a, sizeof(a)), T->name,
                 shp(&T->shape, s, sizeof(s)), WB_FP8_BLOCK, WB_FP8_BLOCK, path, line);
            b->bad = true;
            continue;
        }
        if (c->T->p[ts].dtype != WB_DTYPE_FP32) {
            bad_scale_dtype(c, 0, (uint32_t)ts, line);
            b->bad = true;
            continue;
        }
        cp->trainer_scale = ts;
    }
}

static void set_heads(struct build *b, size_t rule_index, struct wb_mapping *m)
{
    struct mctx *c = b->c;
    int64_t hd = c->head_dim[rule_index];
    if (!hd)
        return;
    if (hd < 0) {
        char err[256];
        int64_t v;
        eval_rule_expr(c, b->rl->head_dim, &v, err, sizeof(err));
        merr(c, "%s: shard head_dim '%s': %s (rule %s:%u)", b->R->name,
             mx_expr_text(b->rl->head_dim), err, c->rs->path, b->rl->line);
        b->bad = true;
        return;
    }
    uint32_t d = m->shard.kind == WB_SHARD_TP ? m->shard.dim : (uint32_t)m->shard.ep1_tp_dim;
    for (size_t i = 0; i < b->ncomp; i++) {
        struct wb_component *cp = &b->comp[i];
        if (d >= cp->dst.ndim)
            continue;
        uint64_t ext = cp->dst.ext[d];
        if (ext % (uint64_t)hd) {
            char label[WB_NAME_MAX];
            comp_label(b, i, label, sizeof(label));
            merr(c,
                 "%s: component %s has %llu elements along dim %u, not a whole number of "
                 "%lld-element heads (rule %s:%u)",
                 b->R->name, label, (unsigned long long)ext, d, (long long)hd, c->rs->path,
                 b->rl->line);
            b->bad = true;
            return;
        }
        if (ext / (uint64_t)hd > UINT32_MAX) {
            merr(c, "%s: %llu heads of %lld elements along dim %u: too many (rule %s:%u)",
                 b->R->name, (unsigned long long)(ext / (uint64_t)hd), (long long)hd, d,
                 c->rs->path, b->rl->line);
            b->bad = true;
            return;
        }
        cp->heads = (uint32_t)(ext / (uint64_t)hd);
    }
}

static void account(struct mctx *c, size_t ri, const struct wb_component *cp, bool tie)
{
    if (tie)
        return;
    uint32_t t = cp->trainer;
    c->t_used[t] += wb_box_numel(&cp->src);
    if (c->t_user[t] < 0)
        c->t_user[t] = (int32_t)ri;
    uint64_t numel = wb_shape_numel(&c->T->p[t].shape);
    if (c->t_used[t] > numel && !c->t_over[t]) {
        c->t_over[t] = 1;
        merr(c, "%s: trainer tensor used more than once (by %s and %s)", c->T->p[t].name,
             c->R->p[c->t_user[t]].name, c->R->p[ri].name);
    }
    if (cp->trainer_scale >= 0) {
        uint32_t s = (uint32_t)cp->trainer_scale;
        struct wb_box sb;
        if (wb_scale_box(&cp->src, WB_FP8_BLOCK, &sb) == 0)
            c->t_used[s] += wb_box_numel(&sb);
    }
}

/* An FP8 checkpoint copied into FP8 rollout tensors: the scales become a mapping of their own
 * (the rollout scale tensor built from the trainer scale tensors, boxes in blocks, sharded like
 * the values), so that the planner plans them like any copy — a trainer scale tensor is a
 * trainer tensor of its own, placed (and read) apart from its values. The value mapping keeps
 * `block` (its shard edges must still fall on block edges) and loses `scale`. */
static void split_fp8_copy(struct mctx *c, size_t vi)
{
    if (c->n == c->cap && wb_grow(&c->map, &c->cap, 256, sizeof(*c->map)) != 0) {
        c->fatal = -ENOMEM;
        return;
    }
    struct wb_mapping *v = &c->map[vi];
    struct wb_component *comp = calloc(v->ncomp, sizeof(*comp));
    if (!comp) {
        c->fatal = -ENOMEM;
        return;
    }
    struct wb_mapping s = {.rollout = (uint32_t)v->scale,
                           .scale = -1,
                           .xform = WB_XFORM_COPY,
                           .src_dtype = WB_DTYPE_FP32,
                           .dst_dtype = WB_DTYPE_FP32,
                           .shard = v->shard,
                           .ncomp = v->ncomp,
                           .comp = comp,
                           .rule_line = v->rule_line,
                           .kind = v->kind,
                           .fp8_scales = true};
    for (uint32_t i = 0; i < v->ncomp; i++) {
        const struct wb_component *vc = &v->comp[i];
        comp[i] = (struct wb_component){.trainer = (uint32_t)vc->trainer_scale,
                                        .heads = vc->heads,
                                        .trainer_scale = -1,
                                        .joins_prev = vc->joins_prev};
        /* both boxes start on block edges (checked when the values were matched) */
        wb_scale_box(&vc->src, v->block, &comp[i].src);
        wb_scale_box(&vc->dst, v->block, &comp[i].dst);
    }
    v->scale = -1;
    c->map[c->n++] = s;
}

static void build_one(struct mctx *c, size_t ri, size_t rule_index, const struct wb_caps *caps)
{
    const struct wb_rule *rl = &c->rs->r[rule_index];
    struct build b = {.c = c, .ri = ri, .rl = rl, .caps = caps, .R = &c->R->p[ri]};
    struct wb_mapping m = {
        .rollout = (uint32_t)ri, .scale = -1, .rule_line = rl->line, .shard = rl->shard};
    switch (rl->kind) {
    case WB_RULE_FROM:
        build_from(&b, &m.kind);
        report_missing(&b);
        if (rl->nsplit && m.kind != WB_MAP_TIE)
            m.kind = WB_MAP_SPLIT;
        break;
    case WB_RULE_FUSE:
        m.kind = WB_MAP_FUSE;
        build_fuse(&b);
        break;
    case WB_RULE_STACK:
        m.kind = WB_MAP_STACK;
        build_stack(&b);
        break;
    case WB_RULE_UNSTACK:
        m.kind = WB_MAP_UNSTACK;
        build_unstack(&b);
        break;
    }
    if (!b.bad && !c->fatal && b.ncomp)
        check_dtypes(&b, &m);
    if (!b.bad && !c->fatal)
        set_heads(&b, rule_index, &m);
    for (size_t i = 0; i < b.ncomp; i++) {
        if (b.bad)
            c->t_failed[b.comp[i].trainer] = 1;
        else
            account(c, ri, &b.comp[i], m.kind == WB_MAP_TIE);
        /* a split's dropped elements, once per trainer tensor (its pieces are consecutive) */
        if (!b.bad && m.kind != WB_MAP_TIE && b.dropped &&
            (i == 0 || b.comp[i - 1].trainer != b.comp[i].trainer))
            c->t_used[b.comp[i].trainer] += b.dropped;
    }
    if (b.bad || c->fatal || !b.ncomp) {
        free(b.comp);
        return;
    }
    if (c->n == c->cap && wb_grow(&c->map, &c->cap, 256, sizeof(*c->map)) != 0) {
        c->fatal = -ENOMEM;
        free(b.comp);
        return;
    }
    m.ncomp = (uint32_t)b.ncomp;
    m.comp = b.comp;
    c->map[c->n++] = m;
    if (m.xform == WB_XFORM_COPY && m.scale >= 0)
        split_fp8_copy(c, c->n - 1);
}

/* ---------------------------------------------------------------- the run */

/* The decoder layer index in a name ("model.layers.61.mlp..." -> 61), or -1. */
static long layer_of(const char *name)
{
    const char *l = strstr(name, "layers.");
    if (!l || l[7] < '0' || l[7] > '9')
        return -1;
    char *end;
    long v = strtol(l + 7, &end, 10);
    return *end == '.' ? v : -1;
}

enum unused_kind { USED = 0, UNUSED, PART_USED };

/* Whether trainer tensor t is used up: USED (or ignorable, counted in *nignored, or failed in
 * a mapping already reported, or a scale whose value is reported), UNUSED or PART_USED. */
static enum unused_kind trainer_unused(const struct mctx *c, size_t t, size_t *nignored)
{
    const struct wb_inventory *T = c->T;
    const struct wb_param *P = &T->p[t];
    if (c->t_used[t] >= wb_shape_numel(&P->shape) || c->t_failed[t])
        return USED;
    if (c->t_used[t])
        return PART_USED;
    const char *value_name = P->name;
    char base[WB_NAME_MAX];
    if (c->t_is_scale[t]) { /* a scale goes with its value */
        size_t sl = strlen(c->rs->scale_suffix), len = strlen(P->name);
        snprintf(base, sizeof(base), "%.*s", (int)(len - sl), P->name);
        value_name = base;
    }
    if (any_match(c->rs->ign_trainer, c->rs->nign_trainer, value_name)) {
        (*nignored)++;
        return USED;
    }
    ssize_t v = c->t_is_scale[t] ? wb_inv_find(T, value_name) : -1;
    if (v >= 0 && c->t_used[v] == 0)
        return USED; /* its value is reported */
    return UNUSED;
}

/* Moves the last message of el to index `at` (a cause said before what it explains). */
static void el_move_last(struct wb_errlist *el, size_t at)
{
    char *h = el->msgs[el->n - 1];
    memmove(&el->msgs[at + 1], &el->msgs[at], (el->n - 1 - at) * sizeof(*el->msgs));
    el->msgs[at] = h;
}

/* When every unused trainer tensor lies in layers past the last one the rollout uses, the
 * checkpoint most likely carries a multi-token-prediction draft layer (DeepSeek-V3's layer 61)
 * that this run left out: one line for all of them (787 for DeepSeek-V3), naming the way out. */
static void unused_layers(struct mctx *c, size_t first, size_t nunused, long lo, long hi, long used)
{
    const struct wb_param *T = &c->T->p[first];
    char layers[64], a[128];
    if (lo == hi)
        snprintf(layers, sizeof(layers), "layer %ld", lo);
    else
        snprintf(layers, sizeof(layers), "layers %ld-%ld", lo, hi);
    merr(c,
         "%zu trainer tensor%s in %s, past the last layer the rollout uses (%ld), %s used by no "
         "rollout tensor (first: %s %s %s): a multi-token-prediction (MTP) draft layer? A family "
         "with an `mtp` var moves it with --var mtp=1 (a job file: model.vars: \"mtp=1\"); "
         "otherwise list it in the family's ignore.trainer (%s)",
         nunused, nunused == 1 ? "" : "s", layers, used, nunused == 1 ? "is" : "are", T->name,
         wb_dtype_name(T->dtype), shp(&T->shape, a, sizeof(a)), c->rs->path);
}

/* Rules that built nothing, unless `optional`: a typo in a rule's pattern lets its tensors fall
 * through to a later rule (the catch-all), which then fails far from the cause — or succeeds
 * with the wrong layout. Each is said first, at the rule's file:line:col. With a rollout
 * inventory that may hold part of the model (wb_match_rules_partial_rollout) only rules whose
 * names earlier rules took are said. */
static void report_unbuilt(struct mctx *c, size_t first)
{
    const struct wb_match_rules *rs = c->rs;
    size_t at = first;
    for (size_t k = 0; k < rs->n && !c->fatal; k++) {
        const struct wb_rule *rl = &rs->r[k];
        if (c->rule_built[k] || rl->optional || !(rl->naming & (1u << rs->naming)))
            continue;
        /* names it matches, taken first by an earlier rule or by ignore.rollout */
        size_t nmatch = 0, by = 0, ex = 0;
        for (size_t i = 0; i < c->R->n; i++) {
            struct wb_caps caps;
            const char *name = c->R->p[i].name;
            if (c->r_is_scale[i] || !mx_pat_match(&rl->rollout, name, &caps))
                continue;
            if (nmatch++)
                continue;
            ex = i;
            by = rs->n; /* ignore.rollout, unless an earlier rule took it */
            if (!any_match(rs->ign_rollout, rs->nign_rollout, name))
                for (by = 0; by < k && (!(rs->r[by].naming & (1u << rs->naming)) ||
                                        !mx_pat_match(&rs->r[by].rollout, name, &caps));
                     by++)
                    ;
        }
        if (!nmatch && rs->partial_rollout)
            continue;
        char taker[64];
        if (by == rs->n)
            snprintf(taker, sizeof(taker), "it is in ignore.rollout");
        else
            snprintf(taker, sizeof(taker), "by the rule at line %u", nmatch ? rs->r[by].line : 0);
        if (!nmatch)
            merr(c,
                 "%s:%u:%u: the rule for rollout '%s' built no rollout tensor: no rollout tensor's "
                 "name matches it (a typo? a rule that applies to some configs only says "
                 "optional: true)",
                 rs->path, rl->line, rl->col, rl->rollout.src);
        else
            merr(c,
                 "%s:%u:%u: the rule for rollout '%s' built no rollout tensor: the %zu rollout "
                 "tensor%s it matches %s taken before it (first: %s, %s)",
                 rs->path, rl->line, rl->col, rl->rollout.src, nmatch, nmatch == 1 ? "" : "s",
                 nmatch == 1 ? "is" : "are", c->R->p[ex].name, taker);
        if (!c->fatal)
            el_move_last(c->el, at++);
    }
}

void wb_match_free(struct wb_match *m)
{
    if (!m)
        return;
    for (size_t i = 0; i < m->n; i++)
        free(m->map[i].comp);
    free(m->map);
    free(m->rules_path);
    free(m);
}

int wb_match_run(const struct wb_match_rules *rules, const struct wb_inventory *trainer,
                 const struct wb_inventory *rollout, struct wb_match **out, struct wb_errlist *el)
{
    struct mctx c = {.rs = rules, .T = trainer, .R = rollout, .el = el};
    size_t nt = trainer->n, nr = rollout->n, first = el->n;
    int r = -ENOMEM;
    c.r_scale = calloc(nr + 1, sizeof(*c.r_scale));
    c.r_is_scale = calloc(nr + 1, 1);
    c.t_scale = calloc(nt + 1, sizeof(*c.t_scale));
    c.t_is_scale = calloc(nt + 1, 1);
    c.t_used = calloc(nt + 1, sizeof(*c.t_used));
    c.t_user = malloc((nt + 1) * sizeof(*c.t_user));
    c.t_over = calloc(nt + 1, 1);
    c.t_failed = calloc(nt + 1, 1);
    c.head_dim = calloc(rules->n + 1, sizeof(*c.head_dim));
    c.split_size = calloc(rules->n * WB_SPLIT_MAX + 1, sizeof(*c.split_size));
    c.rule_built = calloc(rules->n + 1, sizeof(*c.rule_built));
    c.groups = calloc(rules->n + 1, sizeof(*c.groups));
    if (!c.r_scale || !c.r_is_scale || !c.t_scale || !c.t_is_scale || !c.t_used || !c.t_user ||
        !c.t_over || !c.t_failed || !c.head_dim || !c.split_size || !c.rule_built || !c.groups)
        goto out;
    for (size_t i = 0; i < nt; i++)
        c.t_user[i] = -1;
    group_scales(&c, rollout, c.r_scale, c.r_is_scale, "rollout");
    group_scales(&c, trainer, c.t_scale, c.t_is_scale, "trainer");
    eval_head_dims(&c);
    eval_split_sizes(&c);

    struct wb_caps caps;
    for (size_t i = 0; i < nr && !c.fatal; i++) {
        if (c.r_is_scale[i])
            continue;
        const char *name = rollout->p[i].name;
        if (any_match(rules->ign_rollout, rules->nign_rollout, name))
            continue;
        size_t len = strlen(name), k = 0;
        for (; k < rules->n; k++) {
            const struct wb_rule *rl = &rules->r[k];
            if (!(rl->naming & (1u << rules->naming))) /* another naming's rule */
                continue;
            if (rl->suffix_len && !ends_with(name, len, rl->suffix, rl->suffix_len))
                continue;
            if (mx_pat_match(&rl->rollout, name, &caps))
                break;
        }
        if (k == rules->n) {
            char a[128];
            merr(&c, "%s %s: no rule in %s builds this rollout tensor", name,
                 shp(&rollout->p[i].shape, a, sizeof(a)), rules->path);
            continue;
        }
        c.rule_built[k]++;
        build_one(&c, i, k, &caps);
    }

    size_t nignored = 0, nunused = 0;
    /* the last layer used; the unused tensors' layers (lo -1: one of them is in none) */
    long used_layer = -1, lo = LONG_MAX, hi = -1;
    ssize_t first_unused = -1;
    for (size_t t = 0; t < nt; t++)
        if (c.t_used[t] && layer_of(trainer->p[t].name) > used_layer)
            used_layer = layer_of(trainer->p[t].name);
    for (size_t t = 0; t < nt; t++) {
        if (trainer_unused(&c, t, &nignored) != UNUSED)
            continue;
        long layer = layer_of(trainer->p[t].name);
        first_unused = first_unused < 0 ? (ssize_t)t : first_unused;
        nunused++;
        lo = layer < 0 ? -1 : lo < 0 ? lo : layer < lo ? layer : lo;
        hi = layer > hi ? layer : hi;
    }
    /* every unused tensor past the last layer the rollout uses: one line for all of them */
    bool draft = nunused && lo >= 0 && lo > used_layer && used_layer >= 0;
    if (draft)
        unused_layers(&c, (size_t)first_unused, nunused, lo, hi, used_layer);
    for (size_t t = 0; t < nt && !c.fatal; t++) {
        const struct wb_param *T = &trainer->p[t];
        size_t ign = 0;
        enum unused_kind kind = trainer_unused(&c, t, &ign);
        char a[128];
        if (kind == UNUSED && !draft)
            merr(&c,
                 "%s %s %s: trainer tensor not used by any rollout tensor and not declared "
                 "ignorable (%s)",
                 T->name, wb_dtype_name(T->dtype), shp(&T->shape, a, sizeof(a)), rules->path);
        else if (kind == PART_USED)
            merr(&c, "%s %s: only %llu of %llu elements used by rollout tensors (first: %s)",
                 T->name, shp(&T->shape, a, sizeof(a)), (unsigned long long)c.t_used[t],
                 (unsigned long long)wb_shape_numel(&T->shape), rollout->p[c.t_user[t]].name);
    }
    report_unbuilt(&c, first);
    for (int side = 0; side < 2; side++) {
        if (!c.bad_scale[side].n)
            continue;
        const struct wb_param *S = &(side ? rollout : trainer)->p[c.bad_scale[side].tensor];
        merr(&c, "%s scale tensors must be fp32: %zu are not (first %s, %s) (rule %s:%u)",
             side ? "rollout" : "trainer", c.bad_scale[side].n, S->name, wb_dtype_name(S->dtype),
             rules->path, c.bad_scale[side].line);
    }
    if (c.fatal) {
        r = c.fatal;
        goto out;
    }
    if (c.nerr) {
        r = -WB_E_MATCH;
        goto out;
    }
    struct wb_match *m = calloc(1, sizeof(*m));
    if (!m || !(m->rules_path = strdup(rules->path))) {
        free(m);
        goto out;
    }
    m->map = c.map;
    m->n = c.n;
    m->nignored = nignored;
    c.map = NULL;
    c.n = 0;
    *out = m;
    r = 0;
out:
    if (r == -ENOMEM)
        wb_errlist_add(el, "matcher: out of memory");
    for (size_t i = 0; i < c.n; i++)
        free(c.map[i].comp);
    free(c.map);
    free(c.r_scale);
    free(c.r_is_scale);
    free(c.t_scale);
    free(c.t_is_scale);
    free(c.t_used);
    free(c.t_user);
    free(c.t_over);
    free(c.t_failed);
    free(c.head_dim);
    free(c.split_size);
    free(c.rule_built);
    free(c.groups);
    return r;
}
