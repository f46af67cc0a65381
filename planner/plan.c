/* plan.c — wb_plan_build(), the builder's driver: rollout local layouts, shard box classes,
 * items, meshes, mesh groups and phases, and modes; then pass 1 (walk.c), balancing
 * (balance.c), pass 3 (emit_threads.c), the greedy fallback, and the plan's assembly
 * (assemble.c). See build.h for the passes and which file does what.
 *
 * Items: a mapping's components are grouped by mesh (their owner set); a group whose bytes
 * exceed a quarter of the memory cap is cut into several items, so that one task's temporary
 * memory stays well under the cap (a stacked-experts tensor gathered whole would not).
 * Mesh groups: meshes sorted by size (largest first) are colored greedily so that each group's
 * meshes share no rank; each group is one phase, in that order (dense weights first when they
 * sit on the larger meshes, as in the reference). */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "planner/build.h"

/* ---------------------------------------------------------------- rollout locals */

static int build_rollout_locals(struct plan_ctx *c)
{
    const struct wb_match *mt = c->in->match;
    const struct wb_rollout_layout *rl = c->in->rl;
    const struct wb_inventory *ri = c->in->rollout;
    c->rloc = calloc(mt->n * c->gpr + 1, sizeof(*c->rloc));
    if (!c->rloc)
        return -ENOMEM;
    int err = 0;
    struct pl_problems pp = {c->el, 0};
    for (size_t m = 0; m < mt->n; m++) {
        const struct wb_mapping *mp = &mt->map[m];
        if (mp->scale >= 0) {
            struct wb_shape g = pl_grid_shape(&ri->p[mp->rollout].shape);
            if (!wb_shape_eq(&g, &ri->p[mp->scale].shape)) {
                char a[128], b[128];
                pl_problem(&pp, "%s: shape %s is not the 128x128 block grid %s of %s",
                           ri->p[mp->scale].name,
                           wb_shape_str(&ri->p[mp->scale].shape, a, sizeof(a)),
                           wb_shape_str(&g, b, sizeof(b)), ri->p[mp->rollout].name);
                err = -WB_E_PLAN;
                continue;
            }
        }
        for (uint32_t l = 0; l < c->gpr; l++) {
            struct wb_local_piece pcs[WB_MAX_PIECES];
            uint32_t np = 0;
            struct rlocal *lo = &c->rloc[m * c->gpr + l];
            struct wb_errlist mel;
            wb_errlist_init(&mel);
            int r = wb_mapping_local(mt, ri, mp, l % rl->tp, rl->tp, l % rl->ep, rl->ep, &lo->shape,
                                     pcs, &np, &mel);
            if (r) {
                if (wb_errlist_count(&mel) == 0)
                    wb_errlist_add(&mel, "%s: cannot shard over tp %u, ep %u: %s",
                                   ri->p[mp->rollout].name, rl->tp, rl->ep, wb_strerror(r));
                /* every mapping that cannot be sharded counts; the first ones are listed
                 * (one message per mapping is enough) */
                pl_problems_take(&pp, &mel);
                if (r == -ENOMEM)
                    return r;
                err = -WB_E_PLAN;
                break;
            }
            wb_errlist_free(&mel);
            lo->p0 = (uint32_t)c->pieces.n;
            lo->np = np;
            lo->scale_shape = pl_grid_shape(&lo->shape);
            for (uint32_t k = 0; k < np; k++)
                if (!pl_vec_push(&c->pieces, &pcs[k]))
                    return -ENOMEM;
        }
    }
    return err;
}

/* Shard box classes: a trainer tensor's shard boxes follow from its placement rule and shape
 * (placement.c), so tensors with equal (rule, shape) share them. */
static int build_classes(struct plan_ctx *c)
{
    const struct wb_inventory *ti = c->in->trainer;
    c->tcls = calloc(ti->n + 1, sizeof(uint32_t));
    if (!c->tcls)
        return -ENOMEM;
    for (size_t t = 0; t < ti->n; t++) {
        struct cls_key key;
        memset(&key, 0, sizeof(key)); /* interned by its bytes */
        key.rule = c->pm->place[t].rule;
        key.shape.ndim = ti->p[t].shape.ndim;
        for (uint32_t d = 0; d < key.shape.ndim && d < WB_MAX_DIMS; d++)
            key.shape.dim[d] = ti->p[t].shape.dim[d];
        size_t before = c->cls.v.n;
        c->tcls[t] = pl_intern_bytes(&c->cls, &key);
        if (c->cls.err)
            return c->cls.err;
        if (c->cls.v.n == before || c->pm->place[t].rule < 0)
            continue;
        /* a new class: its shard boxes, and whether every edge is on a 128 block edge */
        const struct tplace *tp = &c->pm->place[t];
        const struct wb_shape *sh = &ti->p[t].shape;
        struct cls_info ci = {(uint32_t)c->cbox.n, pl_place_nshards(c->pm, tp), true};
        if (pl_vec_reserve(&c->cbox, ci.nk))
            return -ENOMEM;
        for (uint32_t k = 0; k < ci.nk; k++) {
            struct wb_box B = pl_place_shard_box(c->pm, tp, sh, k);
            for (uint32_t d = 0; d < B.ndim; d++)
                if (qblock(B.ndim, d) > 1 &&
                    (B.off[d] % WB_FP8_BLOCK ||
                     ((B.off[d] + B.ext[d]) % WB_FP8_BLOCK && B.off[d] + B.ext[d] != sh->dim[d])))
                    ci.aligned = false;
            *VEC_AT(&c->cbox, struct wb_box, c->cbox.n++) = B;
        }
        while (c->cinfo.n <= c->tcls[t]) /* classes of unplaced tensors stay zero */
            if (!pl_vec_push(&c->cinfo, NULL))
                return -ENOMEM;
        *VEC_AT(&c->cinfo, struct cls_info, c->tcls[t]) = ci;
    }
    return 0;
}

/* ---------------------------------------------------------------- meshes and items */

static int64_t mesh_intern(struct plan_ctx *c, const struct tplace *tp)
{
    const struct wb_trainer_layout *tl = c->in->tl;
    int32_t sel[WB_MESH_MAX_DIMS];
    for (uint32_t d = 0; d < WB_MESH_MAX_DIMS; d++)
        sel[d] = d < tl->ndims && tl->dim[d].size > 1 ? tp->sel[d] : -1;
    for (size_t i = c->meshes.n; i-- > 0;) {
        const struct mesh_int *m = VEC_AT(&c->meshes, struct mesh_int, i);
        if (memcmp(m->sel, sel, sizeof(sel)) == 0)
            return (int64_t)i;
    }
    struct mesh_int m = {.order = (uint32_t)c->meshes.n};
    memcpy(m.sel, sel, sizeof(sel));
    struct tplace t = *tp;
    memcpy(t.sel, sel, sizeof(sel));
    m.n = pl_place_nranks(c->pm, &t);
    m.bits = calloc(c->words, sizeof(uint64_t));
    m.ranks = malloc((m.n ? m.n : 1) * sizeof(uint32_t));
    if (!m.bits || !m.ranks || !pl_vec_push(&c->meshes, &m)) {
        free(m.bits);
        free(m.ranks);
        return -ENOMEM;
    }
    for (uint32_t i = 0; i < m.n; i++) {
        uint32_t r = pl_place_rank(c->pm, &t, NULL, i, NULL, NULL, NULL);
        m.bits[r / 64] |= 1ull << (r % 64);
    }
    for (uint32_t r = 0, k = 0; r < c->nt; r++)
        if (m.bits[r / 64] >> (r % 64) & 1)
            m.ranks[k++] = r;
    return (int64_t)c->meshes.n - 1;
}

/* gather_groups (may be NULL): per (mapping, mesh), whether auto chose gather for it; such a
 * group is cut into items by whole-tensor bytes, as --mode gather cuts every group. */
static int build_items(struct plan_ctx *c, const uint8_t *gather_groups, size_t nmeshes)
{
    const struct wb_match *mt = c->in->match;
    const struct wb_inventory *ti = c->in->trainer;
    uint64_t limit = c->opts->mem_cap / 4; /* normalized at the entry (pl_plan_build) */
    bool all_gather = c->opts->mode == WB_MODE_GATHER;
    /* per mapping: open item per mesh */
    struct open {
        uint32_t mesh, item;
        uint64_t bytes;
    };
    struct vec open;
    pl_vec_init(&open, sizeof(struct open));
    for (size_t m = 0; m < mt->n; m++) {
        const struct wb_mapping *mp = &mt->map[m];
        open.n = 0;
        for (uint32_t k = 0; k < mp->ncomp; k++) {
            uint32_t t = mp->comp[k].trainer;
            const struct tplace *tp = &c->pm->place[t];
            int64_t mesh = mesh_intern(c, tp);
            if (mesh < 0) {
                pl_vec_free(&open);
                return (int)mesh;
            }
            uint64_t bytes = wb_shape_numel(&ti->p[t].shape) * wb_dtype_size(ti->p[t].dtype);
            bool gather = all_gather || (gather_groups && (size_t)mesh < nmeshes &&
                                         gather_groups[m * nmeshes + (size_t)mesh]);
            if (!gather)
                bytes /= pl_place_nshards(c->pm, tp);
            struct open *o = NULL;
            for (size_t i = 0; i < open.n; i++)
                if (VEC_AT(&open, struct open, i)->mesh == (uint32_t)mesh)
                    o = VEC_AT(&open, struct open, i);
            if (o && o->bytes > 0 && o->bytes + bytes > limit)
                o->item = UINT32_MAX; /* full: start a new one */
            if (!o) {
                o = pl_vec_push(&open, NULL);
                if (!o)
                    goto nomem;
                o->mesh = (uint32_t)mesh;
                o->item = UINT32_MAX;
            }
            if (o->item == UINT32_MAX) {
                struct item it = {.mapping = (uint32_t)m,
                                  .mesh = (uint32_t)mesh,
                                  .c0 = (uint32_t)c->item_comps.n,
                                  .nc = 0};
                /* components of one item must be contiguous in item_comps: items of one
                 * mapping interleave, so each item gets its own run, appended as it grows
                 * (fixed up below). */
                if (!pl_vec_push(&c->items, &it))
                    goto nomem;
                o->item = (uint32_t)c->items.n - 1;
                o->bytes = 0;
            }
            o->bytes += bytes;
            /* record (item, component) pairs; runs are made contiguous after the mapping */
            uint32_t pair[2] = {o->item, k};
            struct vec *ic = &c->item_comps;
            if (pl_vec_reserve(ic, 2))
                goto nomem;
            memcpy(VEC_AT(ic, uint32_t, ic->n), pair, sizeof(pair));
            ic->n += 2;
        }
        /* Rewrite this mapping's (item, comp) pairs into per-item contiguous runs. */
        size_t first = c->items.n, start = SIZE_MAX;
        for (size_t i = c->items.n; i-- > 0;) {
            if (VEC_AT(&c->items, struct item, i)->mapping != (uint32_t)m)
                break;
            first = i;
        }
        for (size_t i = first; i < c->items.n; i++) {
            size_t c0 = VEC_AT(&c->items, struct item, i)->c0;
            if (c0 < start)
                start = c0;
        }
        if (start == SIZE_MAX)
            continue;
        size_t npairs = (c->item_comps.n - start) / 2;
        uint32_t *pairs = malloc(npairs * 2 * sizeof(uint32_t));
        if (!pairs)
            goto nomem;
        memcpy(pairs, VEC_AT(&c->item_comps, uint32_t, start), npairs * 2 * sizeof(uint32_t));
        c->item_comps.n = start;
        for (size_t i = first; i < c->items.n; i++) {
            struct item *it = VEC_AT(&c->items, struct item, i);
            it->c0 = (uint32_t)c->item_comps.n;
            it->nc = 0;
            for (size_t p = 0; p < npairs; p++)
                if (pairs[2 * p] == i) {
                    if (!pl_vec_push(&c->item_comps, &pairs[2 * p + 1])) {
                        free(pairs);
                        goto nomem;
                    }
                    it->nc++;
                }
        }
        free(pairs);
    }
    pl_vec_free(&open);
    return 0;
nomem:
    pl_vec_free(&open);
    return -ENOMEM;
}

static int cmp_mesh_order(const void *a, const void *b, void *ctx)
{
    const struct mesh_int *M = ctx;
    const struct mesh_int *x = &M[*(const uint32_t *)a], *y = &M[*(const uint32_t *)b];
    if (x->n != y->n)
        return x->n > y->n ? -1 : 1;
    return x->order < y->order ? -1 : x->order > y->order;
}

static int cmp_item_phase(const void *a, const void *b, void *ctx)
{
    const struct plan_ctx *c = ctx;
    const struct item *x = a, *y = b;
    uint32_t px = VEC_AT(&c->meshes, struct mesh_int, x->mesh)->phase;
    uint32_t py = VEC_AT(&c->meshes, struct mesh_int, y->mesh)->phase;
    if (px != py)
        return px < py ? -1 : 1;
    /* stable: items were appended in mapping order and c0 grows with it */
    return x->c0 < y->c0 ? -1 : x->c0 > y->c0;
}

static int build_phases(struct plan_ctx *c)
{
    size_t nm = c->meshes.n;
    uint32_t *order = malloc((nm ? nm : 1) * sizeof(uint32_t));
    struct vec groups; /* uint64_t bitsets, words each */
    pl_vec_init(&groups, c->words * sizeof(uint64_t));
    if (!order)
        return -ENOMEM;
    for (size_t i = 0; i < nm; i++)
        order[i] = (uint32_t)i;
    qsort_r(order, nm, sizeof(uint32_t), cmp_mesh_order, c->meshes.p);
    for (size_t k = 0; k < nm; k++) {
        struct mesh_int *m = VEC_AT(&c->meshes, struct mesh_int, order[k]);
        size_t g = 0;
        for (; g < groups.n; g++) {
            const uint64_t *gb = (const uint64_t *)groups.p + g * c->words;
            bool clash = false;
            for (uint32_t w = 0; w < c->words && !clash; w++)
                clash = (gb[w] & m->bits[w]) != 0;
            if (!clash)
                break;
        }
        if (g == groups.n && !pl_vec_push(&groups, NULL)) {
            free(order);
            pl_vec_free(&groups);
            return -ENOMEM;
        }
        uint64_t *gb = (uint64_t *)groups.p + g * c->words;
        for (uint32_t w = 0; w < c->words; w++)
            gb[w] |= m->bits[w];
        m->phase = (uint32_t)g;
    }
    c->nphases = (uint32_t)groups.n;
    free(order);
    pl_vec_free(&groups);
    for (size_t i = 0; i < c->items.n; i++) {
        struct item *it = VEC_AT(&c->items, struct item, i);
        it->phase = VEC_AT(&c->meshes, struct mesh_int, it->mesh)->phase;
    }
    qsort_r(c->items.p, c->items.n, sizeof(struct item), cmp_item_phase, c);
    return 0;
}

/* Modes: forced ones, or auto's choice per (mapping, mesh) group (cost.c); then templates
 * (stamp.c: items of the same mode only are congruent). */
static int choose_modes(struct plan_ctx *c, const uint8_t *gather_groups, size_t nmeshes)
{
    for (size_t i = 0; i < c->items.n; i++) {
        struct item *it = VEC_AT(&c->items, struct item, i);
        bool g = c->opts->mode == WB_MODE_GATHER ||
                 (c->opts->mode == WB_MODE_AUTO && gather_groups &&
                  gather_groups[(size_t)it->mapping * nmeshes + it->mesh]);
        it->mode = g ? WB_MODE_GATHER : WB_MODE_DIRECT;
        int64_t like;
        int r = pl_item_subpieces(c, it);
        if (!r)
            r = pl_stamp_classify(c, (uint32_t)i, &like);
        if (r)
            return r;
    }
    return 0;
}

/* ---------------------------------------------------------------- build */

static void ctx_free(struct plan_ctx *c)
{
    wb_placement_map_free(c->pm);
    free(c->rloc);
    pl_vec_free(&c->pieces);
    for (size_t i = 0; i < c->meshes.n; i++) {
        free(VEC_AT(&c->meshes, struct mesh_int, i)->bits);
        free(VEC_AT(&c->meshes, struct mesh_int, i)->ranks);
    }
    pl_vec_free(&c->meshes);
    pl_vec_free(&c->items);
    pl_vec_free(&c->item_comps);
    pl_bal_free(&c->bal);
    pl_rank_outs_free(c->ro, c->nt);
    free(c->tcls);
    free(c->dem0);
    pl_vec_free(&c->cbox);
    pl_vec_free(&c->cinfo);
    pl_intern_free(&c->cls);
    pl_scratch_free(c);
    pl_stamp_free(&c->st);
}

/* Pass 1: every item's demands to the balancer (stamped where a template allows). */
static int walk_all(struct plan_ctx *c)
{
    uint32_t group = 0;
    pl_stamp_pass_reset(c, 1);
    free(c->dem0);
    c->dem0 = calloc(c->items.n + 1, sizeof(uint32_t));
    if (!c->dem0)
        return -ENOMEM;
    for (size_t i = 0; i < c->items.n; i++) {
        c->dem0[i] = (uint32_t)c->bal.demands.n;
        int r = pl_stamp_walk_apply(c, (uint32_t)i, &group);
        if (r > 0)
            continue;
        if (!r)
            r = pl_stamp_walk_begin(c, (uint32_t)i, group);
        if (!r)
            r = pl_walk_item(c, VEC_AT(&c->items, struct item, i), false, &group);
        if (!r)
            r = pl_stamp_walk_end(c, (uint32_t)i, group);
        if (r)
            return r;
    }
    c->dem0[c->items.n] = (uint32_t)c->bal.demands.n;
    return 0;
}

int wb_plan_build(const struct wb_plan_input *in, const struct wb_plan_opts *opts,
                  struct wb_plan **out, struct wb_errlist *el)
{
    return pl_plan_build(in, opts, true, out, NULL, el);
}

/* The largest task's temporary bytes over every table: where they are, and how many tasks are
 * over `cap`. */
struct cap_need {
    uint64_t need, over;
    uint32_t rank, task;
};

static struct cap_need cap_need(const struct wb_plan *p, uint64_t cap)
{
    struct cap_need n = {0, 0, 0, 0};
    const struct wb_route_table *tables = pl_tables(p);
    for (uint32_t r = 0; r < p->ntrainers; r++)
        for (uint32_t k = 0; k < tables[r].ntasks; k++) {
            uint64_t b = tables[r].tasks[k].tmp_bytes;
            n.over += b > cap;
            if (b > n.need)
                n.need = b, n.rank = r, n.task = k;
        }
    return n;
}

/* opts.fit_cap: the cap of the plan and of every table becomes the largest task's bytes where
 * the cap is below them. Done on the plan that was chosen, after it was built and (auto)
 * simulated at the cap asked for, so the plan is the one that cap gives, only its cap raised. */
static void fit_cap(struct wb_plan *p)
{
    struct cap_need n = cap_need(p, p->mem_cap);
    if (n.need <= p->mem_cap)
        return;
    p->mem_cap = n.need;
    for (uint32_t r = 0; r < p->ntrainers; r++)
        pl_tables(p)[r].mem_cap = n.need;
}

/* Items are cut at a quarter of the cap (build_items), but one component's share is not: a
 * tensor gathered whole (an embedding, stacked experts) can exceed the cap. The executor starts
 * a task only when its bytes fit, so such a task would never start. Running it alone was the
 * other choice, rejected: it would hold more than the cap, the one promise the cap makes. The
 * builder itself leaves the plan as it is (the estimate admits such a task alone), so that
 * plans can be compared at one cap; what is to be executed is either built with opts.fit_cap
 * or checked here. */
int wb_plan_check_cap(const struct wb_plan *p, const struct wb_plan_input *in,
                      struct wb_errlist *el)
{
    struct cap_need n = cap_need(p, p->mem_cap);
    if (n.need <= p->mem_cap)
        return 0;
    const struct wb_rt_task *t = &pl_tables(p)[n.rank].tasks[n.task];
    uint32_t rt = t->mapping < in->match->n ? in->match->map[t->mapping].rollout : UINT32_MAX;
    char a[32], b[32];
    wb_errlist_add(el,
                   "mem_cap %s is below the %s the largest task needs (%s, %s on trainer rank "
                   "%u; %llu task(s) over the cap): set mem_cap to at least %llu bytes",
                   wb_fmt_bytes(p->mem_cap, a, sizeof(a)), wb_fmt_bytes(n.need, b, sizeof(b)),
                   rt < in->rollout->n ? in->rollout->p[rt].name : "?", wb_plan_mode_name(t->mode),
                   n.rank, (unsigned long long)n.over, (unsigned long long)n.need);
    return -WB_E_PLAN;
}

/* Auto's choice as it came out of pl_auto_choose, for pl_plan_build to check it. */
struct auto_info {
    uint8_t *groups; /* malloc'd: per (mapping, mesh), gather or not */
    size_t nmeshes;
    struct pl_auto_cost cost;
};

/* Auto's gather groups (*out, malloc'd: per (mapping, mesh)): force_groups when given, else
 * pl_auto_choose's choice, also kept in ai. Where any group gathers, the items, phases and
 * templates are cut again. */
static int auto_groups(struct plan_ctx *c, bool stamp, const uint8_t *force_groups,
                       struct auto_info *ai, uint8_t **out)
{
    size_t nm = c->meshes.n;
    int r = 0;
    uint8_t *gather_groups = *out = malloc(c->in->match->n * nm + 1);
    if (!gather_groups)
        return -ENOMEM;
    if (force_groups) {
        memcpy(gather_groups, force_groups, c->in->match->n * nm);
    } else if ((r = pl_auto_choose(c, gather_groups, &ai->cost))) {
        return r;
    } else {
        ai->groups = malloc(c->in->match->n * nm + 1);
        if (!ai->groups)
            return -ENOMEM;
        memcpy(ai->groups, gather_groups, c->in->match->n * nm);
        ai->nmeshes = nm;
    }
    bool any = false;
    for (size_t g = 0; g < c->in->match->n * nm; g++)
        any |= gather_groups[g];
    if (any) {
        /* the gather groups are cut into items as gather mode cuts them: the items, their
         * order and the templates again */
        pl_vec_free(&c->items);
        pl_vec_free(&c->item_comps);
        pl_vec_init(&c->items, sizeof(struct item));
        pl_vec_init(&c->item_comps, sizeof(uint32_t));
        pl_stamp_free(&c->st);
        pl_stamp_init(&c->st);
        if ((r = build_items(c, gather_groups, nm)) || (r = build_phases(c)) ||
            (r = pl_stamp_prepare(c, stamp)))
            return r;
    }
    return 0;
}

/* An empty plan of c's sizes, or NULL: no memory. */
static struct wb_plan *plan_new(const struct plan_ctx *c)
{
    struct pl_plan *pp = calloc(1, sizeof(*pp));
    if (!pp)
        return NULL;
    struct wb_plan *p = &pp->pub;
    p->mode = c->opts->mode;
    p->mem_cap = c->opts->mem_cap;
    p->ntrainers = c->nt;
    p->nrollouts = c->nr;
    pp->tables = calloc(c->nt, sizeof(*pp->tables));
    p->recv = calloc(c->nr ? c->nr : 1, sizeof(*p->recv));
    p->stats.send_bytes = calloc(c->nt, sizeof(uint64_t));
    p->stats.gather_in_bytes = calloc(c->nt, sizeof(uint64_t));
    p->stats.recv_bytes = calloc(c->nr ? c->nr : 1, sizeof(uint64_t));
    if (!pp->tables || !p->recv || !p->stats.send_bytes || !p->stats.gather_in_bytes ||
        !p->stats.recv_bytes) {
        wb_plan_free(p);
        return NULL;
    }
    return p;
}

/* One build. force_groups (may be NULL): auto's gather groups to use instead of choosing
 * them (nmappings * ai->nmeshes); with auto and none forced, the choice goes to *ai. */
static int build_once(const struct wb_plan_input *in, const struct wb_plan_opts *opts, bool stamp,
                      const uint8_t *force_groups, struct auto_info *ai, struct wb_plan **out,
                      size_t *nstamped, struct wb_errlist *el)
{
    uint64_t t_setup = wb_now_ns();
    struct plan_ctx c;
    memset(&c, 0, sizeof(c));
    c.in = in;
    c.opts = opts;
    c.el = el;
    pl_vec_init(&c.pieces, sizeof(struct wb_local_piece));
    pl_vec_init(&c.meshes, sizeof(struct mesh_int));
    pl_vec_init(&c.items, sizeof(struct item));
    pl_intern_init(&c.cls, sizeof(struct cls_key));
    pl_vec_init(&c.cbox, sizeof(struct wb_box));
    pl_vec_init(&c.cinfo, sizeof(struct cls_info));
    pl_vec_init(&c.item_comps, sizeof(uint32_t));
    pl_scratch_init(&c);
    pl_stamp_init(&c.st);
    struct wb_plan *p = NULL;
    uint8_t *gather_groups = NULL;
    int r = wb_layout_check(in->tl, in->rl, el);
    if (r)
        goto out;
    c.nt = in->tl->world;
    c.gpr = in->rl->gpus_per_replica;
    c.nr = in->rl->replicas * c.gpr;
    c.words = (c.nt + 63) / 64;

    bool *used = calloc(in->trainer->n + 1, sizeof(bool));
    if (!used) {
        r = -ENOMEM;
        goto out;
    }
    for (size_t m = 0; m < in->match->n; m++)
        for (uint32_t k = 0; k < in->match->map[m].ncomp; k++)
            used[in->match->map[m].comp[k].trainer] = true;
    r = wb_placement_map_build(in->tl, in->trainer, used, &c.pm, el);
    free(used);
    if (r)
        goto out;
    r = build_rollout_locals(&c);
    if (!r)
        r = build_classes(&c);
    if (r)
        goto out;
    if ((r = build_items(&c, NULL, 0)) || (r = build_phases(&c)) ||
        (r = pl_stamp_prepare(&c, stamp)))
        goto out;
    size_t nm = c.meshes.n;
    if (opts->mode == WB_MODE_AUTO &&
        (r = auto_groups(&c, stamp, force_groups, ai, &gather_groups)))
        goto out;
    uint64_t t_walk = wb_now_ns();
    r = choose_modes(&c, gather_groups, nm);
    if (!r)
        r = pl_bal_init(&c.bal, c.nt, c.nphases);
    if (r)
        goto out;
    r = walk_all(&c);
    if (r)
        goto out;
    uint64_t t_solve = wb_now_ns();
    r = pl_bal_solve(&c.bal, false);
    if (r)
        goto out;
    c.ro = pl_rank_outs_new(c.nt);
    if (!c.ro) {
        r = -ENOMEM;
        goto out;
    }
    uint64_t t_emit = wb_now_ns();
    r = pl_emit_all(&c);
    if (r)
        goto out;
    /* Splits round part sizes; should that make the busiest sender worse than the reference
     * greedy, emit the greedy's assignment instead. */
    uint64_t mx = 0;
    for (uint32_t k = 0; k < c.nt; k++)
        if (c.ro[k].send > mx)
            mx = c.ro[k].send;
    if (mx > c.bal.greedy_max && !c.bal.used_greedy) {
        uint64_t lb = c.bal.lower_bound;
        pl_bal_free(&c.bal);
        if ((r = pl_bal_init(&c.bal, c.nt, c.nphases)))
            goto out;
        memset(c.pieces_by_mode, 0, sizeof(c.pieces_by_mode));
        if ((r = walk_all(&c)) || (r = pl_bal_solve(&c.bal, true)) || (r = pl_emit_all(&c)))
            goto out;
        c.bal.lower_bound = lb;
    }

    if (!(p = plan_new(&c))) {
        r = -ENOMEM;
        goto out;
    }
    uint64_t t_finish = wb_now_ns();
    r = pl_finish_tables(&c, p);
    wb_log(WB_LOG_DEBUG, "planner",
           "plan: items and modes in %.3f s, walked in %.3f s, sources chosen in %.3f s, tables "
           "emitted in %.3f s, finished in %.3f s",
           (double)(t_walk - t_setup) * 1e-9, (double)(t_solve - t_walk) * 1e-9,
           (double)(t_emit - t_solve) * 1e-9, (double)(t_finish - t_emit) * 1e-9,
           (double)(wb_now_ns() - t_finish) * 1e-9);
    if (r)
        goto out;
    /* distinct trainer tensors read: a split rule's components are boxes of one tensor */
    p->stats.tensors = 0;
    uint8_t *seen = calloc(in->trainer->n + 1, 1);
    if (!seen) {
        r = -ENOMEM;
        goto out;
    }
    for (size_t m = 0; m < in->match->n; m++)
        for (uint32_t k = 0; k < in->match->map[m].ncomp; k++) {
            uint32_t t = in->match->map[m].comp[k].trainer;
            p->stats.tensors += !seen[t];
            seen[t] = 1;
        }
    free(seen);
    p->stats.mappings = in->match->n;
    p->stats.items = c.items.n;
    p->stats.amax_ops = c.amax_ops;
    p->stats.gathers = c.gathers;
    memcpy(p->stats.pieces, c.pieces_by_mode, sizeof(p->stats.pieces));
    p->stats.lower_bound = c.bal.lower_bound;
    p->stats.greedy_max = c.bal.greedy_max;
    if (nstamped)
        *nstamped = c.st.stamped;
out:
    free(gather_groups);
    ctx_free(&c);
    if (r) {
        wb_plan_free(p);
        if (r != -ENOMEM && r != -WB_E_CONFIG)
            r = -WB_E_PLAN;
        return r;
    }
    *out = p;
    return 0;
}

/* Auto checks its choice against the plain modes by simulation where the cost model cannot
 * settle it. The model is a bottleneck view, and a mix can lose in the simulation: the balancer
 * spreads a direct item's bytes, not its writes, so a mesh's many small writes can pile up on
 * the ranks with the fewest bytes; a phase of such writes holding the memory cap gates the next
 * phase's gathers. A plain choice with the other plain mode modelled far above it (CLEAR) is
 * kept as it is; otherwise the choice is simulated, and a plain mode is built and simulated
 * only if its modelled lower bound is below that time (a mode whose bound is above cannot win:
 * an all-direct layout with column-sharded tensors, whose plan could not even be held in
 * memory, is never built). Plain modes are built exactly as --mode direct and --mode gather
 * build them, so auto's simulated time is never above the better of them. */
static const double CLEAR = 1.5;

static int choose_build(const struct wb_plan_input *in, const struct wb_plan_opts *opts, bool stamp,
                        struct wb_plan **out, size_t *nstamped, struct wb_errlist *el)
{
    struct auto_info ai;
    memset(&ai, 0, sizeof(ai));
    struct wb_plan *best = NULL;
    int r = build_once(in, opts, stamp, NULL, &ai, &best, nstamped, el);
    if (r || opts->mode != WB_MODE_AUTO || !ai.groups) {
        free(ai.groups);
        if (!r)
            *out = best;
        return r;
    }
    const struct pl_auto_cost *ac = &ai.cost;
    size_t ng = in->match->n * ai.nmeshes;
    /* the plain modes that may do better: 0 direct, 1 gather */
    bool check[2] = {false, false};
    for (int m = 0; m < 2; m++) {
        double x = m ? ac->gather_s : ac->direct_s;
        check[m] = (int)ac->kind != m && (ac->kind == PL_AUTO_MIX || x < CLEAR * ac->chosen_s);
    }
    if (!check[0] && !check[1]) {
        free(ai.groups);
        *out = best;
        return 0;
    }
    struct wb_estimate e;
    struct wb_errlist quiet; /* an estimate that fails keeps the choice */
    wb_errlist_init(&quiet);
    double best_s = INFINITY;
    if (wb_plan_estimate(best, in, &e, &quiet) == 0) {
        best_s = e.total_s;
        pl_est_memo_set(best, in, &e); /* wb-plan --estimate asks for it again */
    }
    uint8_t *groups = malloc(ng + 1);
    r = groups ? 0 : -ENOMEM;
    for (int m = 0; !r && m < 2; m++) {
        if (!check[m] || (m ? ac->gather_lb : ac->direct_lb) >= best_s)
            continue;
        memset(groups, m, ng);
        struct wb_plan *alt = NULL;
        size_t ns = 0;
        struct auto_info unused;
        memset(&unused, 0, sizeof(unused));
        unused.nmeshes = ai.nmeshes;
        r = build_once(in, opts, stamp, groups, &unused, &alt, &ns, el);
        if (r)
            break;
        double s = INFINITY;
        if (wb_plan_estimate(alt, in, &e, &quiet) == 0) {
            s = e.total_s;
            pl_est_memo_set(alt, in, &e);
        }
        wb_log(WB_LOG_DEBUG, "planner",
               "auto: simulated %.4f s for the choice so far, %.4f s for %s", best_s, s,
               m ? "gather" : "direct");
        if (s < best_s) {
            wb_plan_free(best);
            best = alt;
            best_s = s;
            if (nstamped)
                *nstamped = ns;
        } else {
            wb_plan_free(alt);
        }
    }
    wb_errlist_free(&quiet);
    free(groups);
    free(ai.groups);
    if (r) {
        wb_plan_free(best);
        return r;
    }
    *out = best;
    return 0;
}

/* The entry of every build: the options with their defaults applied, once (every file below
 * reads opts->mem_cap as it is), then the build and, with opts.fit_cap, the cap fitted. */
int pl_plan_build(const struct wb_plan_input *in, const struct wb_plan_opts *opts_in, bool stamp,
                  struct wb_plan **out, size_t *nstamped, struct wb_errlist *el)
{
    struct wb_plan_opts o = *opts_in;
    if (!o.mem_cap)
        o.mem_cap = WB_MEM_CAP_DEFAULT;
    /* the relay shape is checked before a minute of planning */
    struct wb_relay relay;
    char why[256];
    if (wb_relay_resolve(&o.relay, in->rl->replicas, &relay, why, sizeof(why))) {
        wb_errlist_add(el, "%s: %s", in->rl->path ? in->rl->path : "rollout layout", why);
        return -WB_E_CONFIG;
    }
    int r = choose_build(in, &o, stamp, out, nstamped, el);
    if (!r && o.fit_cap)
        fit_cap(*out);
    if (r)
        return r;
    if (relay.kind != WB_PLAN_RELAY_AUTO) {
        (*out)->relay = in->rl->replicas > 1 ? relay : (struct wb_relay){WB_PLAN_RELAY_OFF, 0, 0};
        return 0;
    }
    (*out)->relay = relay; /* the roots asked for, if any: auto keeps them */
    if ((r = pl_relay_choose(*out, in))) {
        wb_plan_free(*out);
        *out = NULL;
    }
    return r;
}
