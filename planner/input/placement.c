/* placement.c — which trainer ranks hold which box of every trainer tensor; also the planner's
 * small shared tools declared in plan_int.h (growable vectors, interning, FP8 block grids).
 *
 * A tensor is placed by the first rule whose pattern matches its name. Mesh dims taking
 * `layer`, `expert` or an index fix one coordinate (pipeline stage, expert shard, a fixed
 * stage); the remaining dims are Replicate or Shard(dim), applied in mesh-dim order with the
 * torch.chunk rule (ceil-division chunks, the last ones short or empty), which is what DTensor
 * and FSDP2 do. Owner sets are enumerated on demand from the fixed coordinates instead of being
 * stored: a 1T-parameter model has ~10^5 tensors with up to hundreds of owners each.
 * Also holds the small helpers shared by the planner files (vectors, FP8 block grids). */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "planner/plan_int.h"

/* ---------------------------------------------------------------- vectors */

void pl_vec_free(struct vec *v)
{
    free(v->p);
    v->p = NULL;
    v->n = v->cap = 0;
}

int pl_vec_reserve(struct vec *v, size_t more)
{
    if (v->n + more <= v->cap)
        return 0;
    size_t cap = v->cap ? v->cap : 16;
    while (cap < v->n + more)
        cap *= 2;
    void *p = realloc(v->p, cap * v->elem);
    if (!p)
        return -ENOMEM;
    v->p = p;
    v->cap = cap;
    return 0;
}

void *pl_zalloc(size_t n, size_t size)
{
    if (size && n > SIZE_MAX / size)
        return NULL;
    void *p = malloc(n * size > 0 ? n * size : 1);
    if (p)
        memset(p, 0, n * size);
    return p;
}

void *pl_vec_push(struct vec *v, const void *e)
{
    if (pl_vec_reserve(v, 1))
        return NULL;
    void *dst = (char *)v->p + v->n * v->elem;
    if (e)
        memcpy(dst, e, v->elem);
    else
        memset(dst, 0, v->elem);
    v->n++;
    return dst;
}

/* ---------------------------------------------------------------- interning */

void pl_intern_init(struct intern *in, size_t elem)
{
    memset(in, 0, sizeof(*in));
    pl_vec_init(&in->v, elem);
}

void pl_intern_free(struct intern *in)
{
    pl_vec_free(&in->v);
    free(in->hash);
    memset(in, 0, sizeof(*in));
}

static uint64_t hash_bytes(const void *p, size_t n)
{
    const uint8_t *b = p;
    uint64_t h = 0x9E3779B97F4A7C15ull ^ n;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, b + i, 8);
        if (w) { /* unused dims are zero: skipping them keeps boxes cheap to hash */
            h = (h ^ w ^ i) * 0xff51afd7ed558ccdull;
            h ^= h >> 32;
        }
    }
    for (; i < n; i++)
        h = (h ^ b[i]) * 0x100000001b3ull;
    return h ^ (h >> 29);
}

uint32_t pl_intern_bytes(struct intern *in, const void *val)
{
    size_t elem = in->v.elem;
    if (in->v.n * 2 >= in->cap) {
        size_t cap = in->cap ? in->cap * 2 : 64;
        uint32_t *h = calloc(cap, sizeof(uint32_t));
        if (!h) {
            in->err = -ENOMEM;
            return 0;
        }
        for (size_t i = 0; i < in->v.n; i++) {
            size_t j = hash_bytes((char *)in->v.p + i * elem, elem) & (cap - 1);
            while (h[j])
                j = (j + 1) & (cap - 1);
            h[j] = (uint32_t)i + 1;
        }
        free(in->hash);
        in->hash = h;
        in->cap = cap;
    }
    size_t j = hash_bytes(val, elem) & (in->cap - 1);
    while (in->hash[j]) {
        if (memcmp((char *)in->v.p + (in->hash[j] - 1) * elem, val, elem) == 0)
            return in->hash[j] - 1;
        j = (j + 1) & (in->cap - 1);
    }
    if (!pl_vec_push(&in->v, val)) {
        in->err = -ENOMEM;
        return 0;
    }
    in->hash[j] = (uint32_t)in->v.n;
    return (uint32_t)in->v.n - 1;
}

uint32_t pl_intern_box(struct intern *in, const struct wb_box *b)
{
    /* the hash below reads the whole struct; unused dims are zero */
    struct wb_box c; /* canonical: unused dims zero */
    memset(&c, 0, sizeof(c));
    c.ndim = b->ndim;
    for (uint32_t d = 0; d < b->ndim && d < WB_MAX_DIMS; d++) {
        c.off[d] = b->off[d];
        c.ext[d] = b->ext[d];
    }
    return pl_intern_bytes(in, &c);
}

uint32_t pl_intern_shape(struct intern *in, const struct wb_shape *s)
{
    struct wb_shape c;
    memset(&c, 0, sizeof(c));
    c.ndim = s->ndim;
    for (uint32_t d = 0; d < s->ndim && d < WB_MAX_DIMS; d++)
        c.dim[d] = s->dim[d];
    return pl_intern_bytes(in, &c);
}

/* ---------------------------------------------------------------- block grids */

struct wb_box pl_box_blocks(const struct wb_box *b)
{
    struct wb_box g = {.ndim = b->ndim};
    for (uint32_t d = 0; d < b->ndim; d++) {
        uint64_t q = qblock(b->ndim, d);
        if (b->ext[d] == 0) {
            g.off[d] = b->off[d] / q;
            g.ext[d] = 0;
            continue;
        }
        g.off[d] = b->off[d] / q;
        g.ext[d] = ceil_div(b->off[d] + b->ext[d], q) - g.off[d];
    }
    return g;
}

struct wb_box pl_blocks_elems(const struct wb_box *blocks, const struct wb_shape *shape)
{
    struct wb_box e = {.ndim = blocks->ndim};
    for (uint32_t d = 0; d < blocks->ndim; d++) {
        uint64_t q = qblock(blocks->ndim, d);
        uint64_t a = blocks->off[d] * q, z = (blocks->off[d] + blocks->ext[d]) * q;
        if (z > shape->dim[d])
            z = shape->dim[d];
        e.off[d] = a;
        e.ext[d] = z > a ? z - a : 0;
    }
    return e;
}

struct wb_shape pl_grid_shape(const struct wb_shape *s)
{
    struct wb_shape g = {.ndim = s->ndim};
    for (uint32_t d = 0; d < s->ndim; d++)
        g.dim[d] = ceil_div(s->dim[d], qblock(s->ndim, d));
    return g;
}

/* ---------------------------------------------------------------- patterns */

/* Matches name against pattern (literal text, `*`, {layer}, {expert}); captures are written
 * to caps[0] (layer) and caps[1] (expert), -1 when absent. */
static bool pattern_match(const char *p, const char *s, int64_t caps[2])
{
    while (*p) {
        if (*p == '*') {
            while (*p == '*')
                p++;
            if (!*p)
                return true;
            for (const char *t = s; *t; t++)
                if (pattern_match(p, t, caps))
                    return true;
            return pattern_match(p, s + strlen(s), caps);
        }
        if (*p == '{') {
            int which = strncmp(p, "{layer}", 7) == 0 ? 0 : strncmp(p, "{expert}", 8) == 0 ? 1 : -1;
            if (which >= 0) {
                if (*s < '0' || *s > '9')
                    return false;
                const char *rest = p + (which == 0 ? 7 : 8);
                /* A capture takes the longest run of digits that lets the rest match. */
                const char *e = s;
                while (*e >= '0' && *e <= '9')
                    e++;
                for (const char *end = e; end > s; end--) {
                    int64_t save = caps[which];
                    int64_t v = 0;
                    for (const char *c = s; c < end && v < (1LL << 40); c++)
                        v = v * 10 + (*c - '0');
                    caps[which] = v;
                    if (pattern_match(rest, end, caps))
                        return true;
                    caps[which] = save;
                }
                return false;
            }
        }
        if (*p != *s)
            return false;
        p++;
        s++;
    }
    return *s == 0;
}

static bool float_dtype(enum wb_dtype d)
{
    return d == WB_DTYPE_BF16 || d == WB_DTYPE_FP16 || d == WB_DTYPE_FP32;
}

int wb_trainer_layout_dtypes(const struct wb_trainer_layout *tl, struct wb_inventory *trainer)
{
    for (size_t i = 0; tl->ndtypes && i < trainer->n; i++) {
        struct wb_param *prm = &trainer->p[i];
        if (!float_dtype(prm->dtype))
            continue;
        for (size_t r = 0; r < tl->ndtypes; r++) {
            int64_t caps[2] = {-1, -1};
            if (pattern_match(tl->dtypes[r].pattern, prm->name, caps)) {
                prm->dtype = tl->dtypes[r].dtype;
                break;
            }
        }
    }
    return 0;
}

/* ---------------------------------------------------------------- problems */

bool pl_place_splits(enum wb_place_kind k)
{
    return k == WB_PLACE_SHARD || k == WB_PLACE_ROWS;
}

void pl_problem(struct pl_problems *pp, const char *fmt, ...)
{
    if (pp->n++ >= PL_KEEP) {
        wb_errlist_drop(pp->el, 1);
        return;
    }
    va_list ap;
    va_start(ap, fmt);
    wb_errlist_vadd(pp->el, fmt, ap);
    va_end(ap);
}

void pl_problems_take(struct pl_problems *pp, struct wb_errlist *src)
{
    for (size_t i = 0; i < src->n; i++)
        pl_problem(pp, "%s", src->msgs[i]);
    if (src->dropped) {
        pp->n += src->dropped;
        wb_errlist_drop(pp->el, src->dropped);
    }
    wb_errlist_free(src);
}

/* ---------------------------------------------------------------- placement map */

void wb_placement_map_free(struct wb_placement_map *pm)
{
    if (!pm)
        return;
    free(pm->rule_experts);
    free(pm->place);
    free(pm);
}

static int cmp_name(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

int wb_placement_map_build(const struct wb_trainer_layout *tl, const struct wb_inventory *inv,
                           const bool *used, struct wb_placement_map **out, struct wb_errlist *el)
{
    struct wb_placement_map *pm = calloc(1, sizeof(*pm));
    int64_t *caps = NULL;
    if (!pm)
        return -ENOMEM;
    pm->tl = tl;
    pm->inv = inv;
    pm->rule_experts = calloc(tl->nrules ? tl->nrules : 1, sizeof(uint32_t));
    pm->place = calloc(inv->n ? inv->n : 1, sizeof(*pm->place));
    caps = calloc(inv->n ? inv->n : 1, 2 * sizeof(int64_t));
    if (!pm->rule_experts || !pm->place || !caps) {
        free(caps);
        wb_placement_map_free(pm);
        return -ENOMEM;
    }
    uint32_t stride = 1;
    for (uint32_t d = tl->ndims; d-- > 0;) {
        pm->stride[d] = stride;
        stride *= tl->dim[d].size;
    }

    struct pl_problems ec = {el, 0};
    int64_t maxlayer = -1;
    bool any_layer_rule = false;
    for (size_t t = 0; t < inv->n; t++) {
        struct tplace *tp = &pm->place[t];
        tp->rule = -1;
        if (used && !used[t])
            continue;
        const struct wb_param *prm = &inv->p[t];
        int64_t *c = &caps[2 * t];
        c[0] = c[1] = -1;
        if (tl->nnamed) { /* placed by name: no captures, no pattern */
            const char *key = prm->name;
            char **hit = bsearch(&key, tl->named, tl->nnamed, sizeof(char *), cmp_name);
            if (hit)
                tp->rule = (int32_t)tl->named_rule[hit - tl->named];
        }
        for (size_t r = 0; tp->rule < 0 && r < tl->nrules; r++) {
            c[0] = c[1] = -1;
            if (pattern_match(tl->rules[r].pattern, prm->name, c)) {
                tp->rule = (int32_t)r;
                break;
            }
        }
        if (tp->rule < 0) {
            pl_problem(&ec, "%s: no placement rule matches (%s)", prm->name, tl->path);
            continue;
        }
        const struct wb_place_rule *rule = &tl->rules[tp->rule];
        for (uint32_t d = 0; d < tl->ndims; d++) {
            const struct wb_placement *pl = &rule->place[d];
            if (pl_place_splits(pl->kind) && pl->arg >= prm->shape.ndim)
                pl_problem(&ec, "%s: rule %s:%u shards dim %u over %s but the tensor has %u dim%s",
                           prm->name, tl->path, rule->line, pl->arg, tl->dim[d].name,
                           prm->shape.ndim, prm->shape.ndim == 1 ? "" : "s");
            else if (pl->kind == WB_PLACE_ROWS) {
                /* cuts from 0 to the extent, never falling */
                const uint64_t *cut = rule->rows;
                uint32_t n = tl->dim[d].size, k = 0;
                while (cut && k < n && cut[k] <= cut[k + 1])
                    k++;
                if (!cut || cut[0] != 0 || k < n || cut[n] != prm->shape.dim[pl->arg])
                    pl_problem(
                        &ec,
                        "%s: explicit rows over %s do not cut its %llu rows along dim %u into "
                        "%u rising ranges from 0 (%s)",
                        prm->name, tl->dim[d].name, (unsigned long long)prm->shape.dim[pl->arg],
                        pl->arg, n, tl->path);
            }
            if (pl->kind == WB_PLACE_LAYER) {
                any_layer_rule = true;
                if (c[0] > maxlayer)
                    maxlayer = c[0];
            }
            if (pl->kind == WB_PLACE_EXPERT && c[1] + 1 > (int64_t)pm->rule_experts[tp->rule])
                pm->rule_experts[tp->rule] = (uint32_t)(c[1] + 1);
        }
    }
    pm->nlayers = tl->pp_layers ? tl->pp_layers : (uint32_t)(maxlayer + 1);

    /* Experts must split evenly: one message per rule. */
    bool *rule_bad = calloc(tl->nrules ? tl->nrules : 1, sizeof(bool));
    if (!rule_bad) {
        free(caps);
        wb_placement_map_free(pm);
        return -ENOMEM;
    }
    for (size_t t = 0; t < inv->n; t++) {
        struct tplace *tp = &pm->place[t];
        for (uint32_t d = 0; d < WB_MESH_MAX_DIMS; d++)
            tp->sel[d] = -1;
        if (tp->rule < 0)
            continue;
        const struct wb_place_rule *rule = &tl->rules[tp->rule];
        const int64_t *c = &caps[2 * t];
        for (uint32_t d = 0; d < tl->ndims; d++) {
            const struct wb_placement *pl = &rule->place[d];
            uint32_t size = tl->dim[d].size;
            if (pl->kind == WB_PLACE_INDEX) {
                tp->sel[d] = (int32_t)pl->arg;
            } else if (pl->kind == WB_PLACE_LAYER) {
                if (c[0] >= (int64_t)pm->nlayers) {
                    pl_problem(&ec, "%s: layer %lld >= pp_layers %u (%s)", inv->p[t].name,
                               (long long)c[0], pm->nlayers, tl->path);
                    continue;
                }
                if (pm->nlayers < size && !rule_bad[tp->rule]) {
                    rule_bad[tp->rule] = true;
                    pl_problem(&ec, "%s:%u: %u layers cannot fill %s = %u pipeline stages",
                               tl->path, rule->line, pm->nlayers, tl->dim[d].name, size);
                }
                tp->sel[d] = (int32_t)((uint64_t)c[0] * size / pm->nlayers);
            } else if (pl->kind == WB_PLACE_EXPERT) {
                uint32_t ne = pm->rule_experts[tp->rule];
                if (ne % size) {
                    if (!rule_bad[tp->rule]) {
                        rule_bad[tp->rule] = true;
                        pl_problem(
                            &ec, "%s:%u: %u experts (e.g. %s) cannot be split evenly over %s = %u",
                            tl->path, rule->line, ne, inv->p[t].name, tl->dim[d].name, size);
                    }
                    continue;
                }
                tp->sel[d] = (int32_t)(c[1] / (ne / size));
            }
        }
    }
    (void)any_layer_rule;
    free(rule_bad);
    free(caps);
    if (ec.n) {
        wb_placement_map_free(pm);
        return -WB_E_PLAN;
    }
    *out = pm;
    return 0;
}

/* ---------------------------------------------------------------- owner enumeration */

void pl_chunk_range(uint64_t ext, uint32_t n, uint32_t i, uint64_t *off, uint64_t *len)
{
    uint64_t cs = ceil_div(ext, n);
    uint64_t a = (uint64_t)i * cs;
    *off = a;
    *len = a >= ext ? 0 : (ext - a < cs ? ext - a : cs);
}

uint32_t pl_place_nranks(const struct wb_placement_map *pm, const struct tplace *tp)
{
    uint32_t n = 1;
    for (uint32_t d = 0; d < pm->tl->ndims; d++)
        if (tp->sel[d] < 0)
            n *= pm->tl->dim[d].size;
    return n;
}

uint32_t pl_place_nshards(const struct wb_placement_map *pm, const struct tplace *tp)
{
    uint32_t n = 1;
    const struct wb_place_rule *rule = &pm->tl->rules[tp->rule];
    for (uint32_t d = 0; d < pm->tl->ndims; d++)
        if (tp->sel[d] < 0 && pl_place_splits(rule->place[d].kind))
            n *= pm->tl->dim[d].size;
    return n;
}

uint32_t pl_place_nreplicas(const struct wb_placement_map *pm, const struct tplace *tp)
{
    return pl_place_nranks(pm, tp) / pl_place_nshards(pm, tp);
}

/* Box from per-dim coordinates. */
static struct wb_box coords_box(const struct wb_placement_map *pm, const struct tplace *tp,
                                const struct wb_shape *shape, const uint32_t *coord)
{
    struct wb_box b = wb_box_full(shape);
    const struct wb_place_rule *rule = &pm->tl->rules[tp->rule];
    for (uint32_t d = 0; d < pm->tl->ndims; d++) {
        const struct wb_placement *pl = &rule->place[d];
        if (!pl_place_splits(pl->kind))
            continue;
        uint64_t off, len;
        if (pl->kind == WB_PLACE_ROWS) { /* the cuts are of the whole extent */
            off = rule->rows[coord[d]];
            len = rule->rows[coord[d] + 1] - off;
        } else {
            pl_chunk_range(b.ext[pl->arg], pm->tl->dim[d].size, coord[d], &off, &len);
        }
        b.off[pl->arg] += off;
        b.ext[pl->arg] = len;
    }
    return b;
}

uint32_t pl_place_rank(const struct wb_placement_map *pm, const struct tplace *tp,
                       const struct wb_shape *shape, uint32_t i, struct wb_box *box,
                       uint32_t *shard, uint32_t *replica)
{
    const struct wb_trainer_layout *tl = pm->tl;
    const struct wb_place_rule *rule = &tl->rules[tp->rule];
    uint32_t coord[WB_MESH_MAX_DIMS] = {0};
    for (uint32_t d = tl->ndims; d-- > 0;) {
        if (tp->sel[d] >= 0) {
            coord[d] = (uint32_t)tp->sel[d];
        } else {
            coord[d] = i % tl->dim[d].size;
            i /= tl->dim[d].size;
        }
    }
    uint32_t rank = 0, s = 0, q = 0;
    for (uint32_t d = 0; d < tl->ndims; d++) {
        rank += coord[d] * pm->stride[d];
        if (tp->sel[d] >= 0)
            continue;
        if (pl_place_splits(rule->place[d].kind))
            s = s * tl->dim[d].size + coord[d];
        else
            q = q * tl->dim[d].size + coord[d];
    }
    if (box)
        *box = coords_box(pm, tp, shape, coord);
    if (shard)
        *shard = s;
    if (replica)
        *replica = q;
    return rank;
}

/* Coordinates from a shard index s and a replica index q. */
static void sq_coords(const struct wb_placement_map *pm, const struct tplace *tp, uint32_t s,
                      uint32_t q, uint32_t *coord)
{
    const struct wb_trainer_layout *tl = pm->tl;
    const struct wb_place_rule *rule = &tl->rules[tp->rule];
    for (uint32_t d = tl->ndims; d-- > 0;) {
        if (tp->sel[d] >= 0) {
            coord[d] = (uint32_t)tp->sel[d];
        } else if (pl_place_splits(rule->place[d].kind)) {
            coord[d] = s % tl->dim[d].size;
            s /= tl->dim[d].size;
        } else {
            coord[d] = q % tl->dim[d].size;
            q /= tl->dim[d].size;
        }
    }
}

struct wb_box pl_place_shard_box(const struct wb_placement_map *pm, const struct tplace *tp,
                                 const struct wb_shape *shape, uint32_t s)
{
    uint32_t coord[WB_MESH_MAX_DIMS] = {0};
    sq_coords(pm, tp, s, 0, coord);
    return coords_box(pm, tp, shape, coord);
}

uint32_t pl_place_shard_rank(const struct wb_placement_map *pm, const struct tplace *tp, uint32_t s,
                             uint32_t q)
{
    uint32_t coord[WB_MESH_MAX_DIMS] = {0};
    sq_coords(pm, tp, s, q, coord);
    uint32_t rank = 0;
    for (uint32_t d = 0; d < pm->tl->ndims; d++)
        rank += coord[d] * pm->stride[d];
    return rank;
}

int wb_placement_owners(const struct wb_placement_map *pm, uint32_t tensor,
                        struct wb_owner **owners, uint32_t *n)
{
    if (tensor >= pm->inv->n || pm->place[tensor].rule < 0)
        return -EINVAL;
    const struct tplace *tp = &pm->place[tensor];
    uint32_t nr = pl_place_nranks(pm, tp), k = 0;
    struct wb_owner *o = malloc((nr ? nr : 1) * sizeof(*o));
    if (!o)
        return -ENOMEM;
    for (uint32_t i = 0; i < nr; i++) {
        struct wb_box b;
        uint32_t rank = pl_place_rank(pm, tp, &pm->inv->p[tensor].shape, i, &b, NULL, NULL);
        if (wb_box_empty(&b) && b.ndim > 0)
            continue;
        o[k].rank = rank;
        o[k].box = b;
        k++;
    }
    *owners = o;
    *n = k;
    return 0;
}

int wb_trainer_owners(const struct wb_trainer_layout *tl, const struct wb_inventory *trainer,
                      uint32_t tensor, struct wb_owner **owners, uint32_t *n, struct wb_errlist *el)
{
    struct wb_placement_map *pm;
    int r = wb_placement_map_build(tl, trainer, NULL, &pm, el);
    if (r)
        return r;
    r = wb_placement_owners(pm, tensor, owners, n);
    wb_placement_map_free(pm);
    return r;
}
