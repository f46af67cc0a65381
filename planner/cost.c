/* cost.c — auto's choice between direct and gather, by what each costs on the hardware model.
 *
 * The estimate (estimate.c) simulates a built plan; building every mix of modes to simulate it
 * is out of the question, so the choice works on a bottleneck model of the same quantities:
 * per trainer rank, the seconds its NIC egress (writes, ring all-gathers), NIC ingress (ring
 * all-gathers), collective stage (NVLink all-gathers: launch + bytes / NVLink), CPU (posted
 * writes x write_submit per NIC stripe, op launches, collective launches, amax rendezvous),
 * GPU (copy and quantization bytes, launches) and H2D copy engine are busy, with every
 * rollout GPU's NIC ingress as a floor; a task whose temporary memory exceeds the cap runs
 * alone, so its time adds to its ranks' instead of overlapping. The plan's time is taken as
 * the busiest (rank, resource).
 *
 * Items are grouped into classes of equal cost (mapping transform and sharding, component
 * shapes, dtypes and placement rules, the rollout local shapes, the mesh size): the first item
 * of a class is measured, in both modes, from its subpieces and shard boxes (bytes, the runs a
 * write cannot span, amax exchanges where FP8 blocks straddle shards), and the others take its
 * figures on their own meshes (a gather is over NVLink when the item's shard group sits in one
 * node). A class and every (mapping, mesh) group an item of it belongs to decide together.
 * Starting from all direct, each decision unit is moved to gather when that lowers the busiest
 * time (then the busiest trainer's, then the sum over ranks); passes repeat until none moves.
 * A mix is kept only when it beats both plain modes by a margin; otherwise the cheaper plain
 * mode is taken whole, and gather only when it is clearly cheaper: the simulated gather pays
 * rendezvous and serialized collectives the bottleneck view does not see.
 *
 * Everything here depends on the items and the layouts only (not on templates), so the plan
 * is the same with and without stamping. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "planner/build.h"

enum { RES_EG, RES_IN, RES_COLL, RES_CPU, RES_GPU, RES_H2D, NRES };

/* Margins: a mix must beat the better plain mode by MIX_GAIN, gather must beat direct by
 * GATHER_GAIN to be taken whole (plan.c then checks the choice by simulation against the
 * plain modes the model cannot rule out). */
static const double MIX_GAIN = 0.97, GATHER_GAIN = 0.90;

/* Without a hardware model there is nothing to weigh: auto keeps its earlier rule, gather
 * where direct writes would cut the destination into many more runs than a gathered copy. */
enum { RUNS_MIN = 64, RUNS_FACTOR = 16 };

/* One item's cost in one mode, per member of its mesh (uniform over the members: the balancer
 * spreads a mesh's pieces over them), plus what a gather puts on the collective stage. */
struct mcost {
    double eg_bytes;   /* writes leaving each member */
    double posts;      /* posted writes (NIC stripes counted) */
    double ops;        /* GPU op launches */
    double colls;      /* collective launches (gathers, amax rendezvous) */
    double gpu_s;      /* copy/quantization time */
    double gather_in;  /* all-gather bytes each member receives */
    uint32_t ngathers; /* all-gathers each member runs */
    uint64_t tmp;      /* temporary bytes of the item's largest task at a member */
};

struct ccost {
    struct mcost m[2]; /* 0: direct, 1: gather */
    double h2d_bytes;  /* per member, either mode */
    uint64_t runs[2];  /* runs the writes of one rollout replica cover, direct and gathered */
};

/* What items of one cost class share (compared by its bytes: padding zeroed). */
struct ckey {
    uint64_t h1, h2;
};

static uint64_t hmix(uint64_t h, uint64_t v)
{
    h = (h ^ v) * 0xff51afd7ed558ccdull;
    return h ^ (h >> 29);
}

static struct ckey class_key(const struct plan_ctx *c, const struct item *it)
{
    const struct wb_mapping *mp = pl_ctx_map(c, it->mapping);
    const struct mesh_int *mesh = VEC_AT(&c->meshes, struct mesh_int, it->mesh);
    uint64_t h1 = 0x9E3779B97F4A7C15ull, h2 = 0xC2B2AE3D27D4EB4Full;
    uint64_t v[] = {mp->xform,
                    mp->src_dtype,
                    mp->dst_dtype,
                    mp->scale >= 0,
                    mp->shard.kind,
                    mp->shard.dim,
                    (uint64_t)(int64_t)mp->shard.ep1_tp_dim,
                    mp->shard.pad,
                    it->nc,
                    mesh->n};
    for (size_t i = 0; i < WB_ARRAY_LEN(v); i++) {
        h1 = hmix(h1, v[i]);
        h2 = hmix(h2 + 1, v[i]);
    }
    for (uint32_t ci = 0; ci < it->nc; ci++) {
        const struct wb_component *cp = pl_item_comp(c, it, ci);
        const struct wb_param *tp = &c->in->trainer->p[cp->trainer];
        uint64_t w[5 + 4 * WB_MAX_DIMS];
        size_t n = 0;
        w[n++] = tp->dtype;
        w[n++] = (uint64_t)(int64_t)c->pm->place[cp->trainer].rule;
        w[n++] = tp->shape.ndim;
        w[n++] = cp->dst.ndim;
        for (uint32_t d = 0; d < tp->shape.ndim && d < WB_MAX_DIMS; d++)
            w[n++] = tp->shape.dim[d];
        for (uint32_t d = 0; d < cp->src.ndim && d < WB_MAX_DIMS; d++)
            w[n++] = cp->src.off[d] << 20 ^ cp->src.ext[d];
        for (uint32_t d = 0; d < cp->dst.ndim && d < WB_MAX_DIMS; d++)
            w[n++] = cp->dst.ext[d]; /* not where: an expert's place in the stack differs */
        if (cp->permuted)            /* only then: the other classes' keys stay as they were */
            w[n++] = pl_perm_pack(cp->perm, tp->shape.ndim) + 1;
        for (size_t i = 0; i < n; i++) {
            h1 = hmix(h1, w[i]);
            h2 = hmix(h2 + 3, w[i]);
        }
    }
    for (uint32_t l = 0; l < c->gpr; l++) {
        const struct rlocal *lo = &c->rloc[it->mapping * c->gpr + l];
        h1 = hmix(h1, lo->np);
        h2 = hmix(h2 + 5, lo->np);
        for (uint32_t d = 0; d < lo->shape.ndim; d++) {
            h1 = hmix(h1, lo->shape.dim[d]);
            h2 = hmix(h2 + 7, lo->shape.dim[d]);
        }
    }
    return (struct ckey){h1, h2};
}

/* Posts for `runs` writes of `bytes` in all: a write of 64 KiB or more is striped over the
 * NICs (estimate.c counts the same). */
static double posts_of(uint64_t runs, uint64_t bytes, uint64_t nics)
{
    if (!runs)
        return 0;
    return (double)runs * (bytes / runs >= (64u << 10) ? (double)nics : 1.0);
}

/* A transposed component's PERMUTE op over `bytes` of the trainer tensor, done by one of the
 * members: a copy's time (as the estimate costs it), and its temporary memory where `own`
 * (direct: each part's owner; gather: a member's share of the subpieces, bytes / members). */
static void transposed(struct mcost *x, uint64_t bytes, const struct wb_hw *hw, double members,
                       bool own)
{
    x->tmp += own ? bytes : (uint64_t)((double)bytes / members);
    x->gpu_s += (double)bytes / hw->copy_Bps / members;
    x->ops += 1.0 / members;
}

/* Measures the first item of a class in both modes (c->sub and c->icomp must be its). */
static void measure(const struct plan_ctx *c, const struct item *it, struct ccost *cc)
{
    const struct wb_hw *hw = &c->in->tl->hw;
    const struct wb_mapping *mp = pl_ctx_map(c, it->mapping);
    const struct mesh_int *mesh = VEC_AT(&c->meshes, struct mesh_int, it->mesh);
    double members = mesh->n ? (double)mesh->n : 1;
    double reps = (double)c->in->rl->replicas;
    bool fp8 = mp->xform == WB_XFORM_FP8_BLOCK;
    double rate = fp8 ? hw->quant_Bps : hw->copy_Bps;
    uint64_t nics = hw->nics_per_gpu ? hw->nics_per_gpu : 1;
    memset(cc, 0, sizeof(*cc));
    struct mcost *D = &cc->m[0], *G = &cc->m[1];
    for (uint32_t ci = 0; ci < it->nc; ci++) {
        const struct icomp *ic = VEC_AT(&c->icomp, struct icomp, ci);
        const struct wb_param *tp = &c->in->trainer->p[ic->t];
        uint64_t full = wb_shape_numel(&tp->shape) * wb_dtype_size(tp->dtype);
        uint32_t n = ic->nk ? ic->nk : 1;
        /* a gather group is cut into tasks of whole tensors (plan.c): a task runs alone only
         * when one tensor and its output exceed the cap */
        if (full + full / wb_dtype_size(tp->dtype) * wb_dtype_size(mp->dst_dtype) > G->tmp)
            G->tmp = full + full / wb_dtype_size(tp->dtype) * wb_dtype_size(mp->dst_dtype);
        G->gather_in += (double)full * (n - 1) / n;
        G->ngathers++;
        D->tmp += full / n;
        /* amax: every shard edge inside a 128-block along a blocked dim puts its two owners in
         * an exchange; an owner has one AMAX op for all its exchanges over the same blocks, so
         * the ops are the owners with an edge (at most n; once per replica of the shards) */
        if (fp8 && !ic->aligned) {
            uint32_t straddles = 0;
            for (uint32_t k = 0; k < ic->nk; k++) {
                const struct wb_box *B = VEC_AT(&c->ibox, struct wb_box, ic->b0 + k);
                for (uint32_t d = 0; d < B->ndim; d++)
                    if (qblock(B->ndim, d) > 1 && B->ext[d] && B->off[d] % WB_FP8_BLOCK)
                        straddles++;
            }
            double owners = 2.0 * straddles < n ? 2.0 * straddles : (double)n;
            D->colls += owners * (members / n) / members;
            D->ops += owners * (members / n) / members;
        }
    }
    /* each member holds one shard of each component */
    cc->h2d_bytes = c->in->tl->residence == WB_RESIDE_HOST ? (double)D->tmp : 0;
    for (size_t s = 0; s < c->sub.n; s++) {
        const struct subpiece *sp = VEC_AT(&c->sub, struct subpiece, s);
        const struct rlocal *lo = &c->rloc[it->mapping * c->gpr + sp->l];
        const struct icomp *ic = VEC_AT(&c->icomp, struct icomp, sp->ci);
        const struct wb_param *tp = &c->in->trainer->p[ic->t];
        /* gather: the whole subpiece from the gathered tensor */
        uint64_t bytes = pl_dst_bytes(mp, &sp->S);
        uint64_t vbytes = wb_box_numel(&sp->S) * wb_dtype_size(mp->dst_dtype);
        struct wb_ranges rg;
        uint64_t runs = wb_ranges_init(&rg, &lo->shape, &sp->D, 1) == 0 ? wb_ranges_count(&rg) : 1;
        cc->runs[1] += runs;
        G->eg_bytes += reps * (double)bytes / members;
        G->posts += reps * (posts_of(runs, vbytes, nics) + (fp8 ? 1 : 0)) / members;
        G->ops += 1.0 / members;
        G->gpu_s += (double)(wb_box_numel(&sp->S) * wb_dtype_size(tp->dtype)) / rate / members;
        /* direct: the subpiece's part in each shard, from the shard's owner */
        for (uint32_t k = 0; k < ic->nk; k++) {
            struct wb_box X;
            if (!wb_box_intersect(&sp->S, VEC_AT(&c->ibox, struct wb_box, ic->b0 + k), &X))
                continue;
            struct wb_box Dx = pl_map_to_dst(&sp->S, &sp->D, &X);
            uint64_t xb = pl_dst_bytes(mp, &X);
            uint64_t xv = wb_box_numel(&X) * wb_dtype_size(mp->dst_dtype);
            uint64_t xr = wb_ranges_init(&rg, &lo->shape, &Dx, 1) == 0 ? wb_ranges_count(&rg) : 1;
            cc->runs[0] += xr;
            D->eg_bytes += reps * (double)xb / members;
            D->posts += reps * (posts_of(xr, xv, nics) + (fp8 ? 1 : 0)) / members;
            D->ops += 1.0 / members;
            D->gpu_s += (double)(wb_box_numel(&X) * wb_dtype_size(tp->dtype)) / rate / members;
            D->tmp += xv;
            if (ic->permuted) /* the transposed copy of the part (a PERMUTE op) */
                transposed(D, wb_box_numel(&X) * wb_dtype_size(tp->dtype), hw, members, true);
        }
        if (ic->permuted) /* gather: the subpiece transposed out of the gathered tensor */
            transposed(G, wb_box_numel(&sp->S) * wb_dtype_size(tp->dtype), hw, members, false);
    }
    for (int m = 0; m < 2; m++)
        cc->m[m].gpu_s += cc->m[m].ops * hw->kernel_s;
}

/* ---------------------------------------------------------------- the choice */

struct chooser {
    const struct plan_ctx *c;
    uint32_t nt;
    double *load;   /* [nt][NRES] seconds */
    double *serial; /* [nt] seconds of tasks that run alone */
    double floor_s; /* the busiest rollout GPU's ingress */
    double te, nvl;
};

/* Adds (sign +1) or removes (-1) item i in mode m to the ranks of its mesh. */
static void apply(struct chooser *ch, const struct item *it, const struct ccost *cc, int m,
                  bool nvlink, double sign)
{
    const struct plan_ctx *c = ch->c;
    const struct wb_hw *hw = &c->in->tl->hw;
    const struct mcost *x = &cc->m[m];
    const struct mesh_int *mesh = VEC_AT(&c->meshes, struct mesh_int, it->mesh);
    double r[NRES] = {0};
    double gin = m ? x->gather_in : 0;
    r[RES_EG] = (x->eg_bytes + (nvlink ? 0 : gin)) / ch->te;
    r[RES_IN] = (nvlink ? 0 : gin) / ch->te;
    r[RES_COLL] = nvlink ? x->ngathers * hw->gather_s + gin / ch->nvl : 0;
    r[RES_CPU] = x->posts * hw->write_submit_s + x->ops * hw->kernel_s +
                 (x->colls + (m ? x->ngathers : 0)) * hw->gather_s;
    r[RES_GPU] = x->gpu_s;
    r[RES_H2D] = cc->h2d_bytes / hw->h2d_Bps;
    uint64_t cap = c->opts->mem_cap; /* normalized at the entry (pl_plan_build) */
    double alone = x->tmp > cap ? r[RES_EG] + r[RES_IN] + r[RES_COLL] : 0;
    for (uint32_t k = 0; k < mesh->n; k++) {
        double *L = &ch->load[(size_t)mesh->ranks[k] * NRES];
        for (int q = 0; q < NRES; q++)
            L[q] += sign * r[q];
        ch->serial[mesh->ranks[k]] += sign * alone;
    }
}

/* (busiest of all, busiest trainer, sum over trainers) */
/* (busiest of all, busiest trainer, sum over trainers); *lb (may be NULL): the busiest of all
 * without the run-alone term, a lower bound of the simulated time (every figure is a rank's
 * busy time on one resource, averaged over a mesh's members where the balancer may do worse,
 * and posts counted where the plan may split writes further). */
static void objective(const struct chooser *ch, double out[3], double *lb)
{
    double mx = 0, sum = 0, mx0 = 0;
    for (uint32_t r = 0; r < ch->nt; r++) {
        const double *L = &ch->load[(size_t)r * NRES];
        double t = 0;
        for (int q = 0; q < NRES; q++)
            t = L[q] > t ? L[q] : t;
        mx0 = t > mx0 ? t : mx0;
        t += ch->serial[r];
        mx = t > mx ? t : mx;
        sum += t;
    }
    out[0] = mx > ch->floor_s ? mx : ch->floor_s;
    out[1] = mx;
    out[2] = sum;
    if (lb)
        *lb = mx0 > ch->floor_s ? mx0 : ch->floor_s;
}

static bool better(const double a[3], const double b[3])
{
    const double eps = 1e-9;
    if (a[0] < b[0] * (1 - eps))
        return true;
    if (a[0] > b[0] * (1 + eps))
        return false;
    if (a[1] < b[1] * (1 - eps))
        return true;
    if (a[1] > b[1] * (1 + eps))
        return false;
    return a[2] < b[2] * (1 - eps);
}

static uint32_t uf_find(uint32_t *p, uint32_t x)
{
    while (p[x] != x)
        x = p[x] = p[p[x]];
    return x;
}

/* Whether item it's shard group (the owners of its first component's shards, replica 0) sits
 * in one node: its gathers run over NVLink. */
static bool item_nvlink(const struct plan_ctx *c, const struct item *it)
{
    uint32_t t = pl_item_comp(c, it, 0)->trainer;
    const struct tplace *tp = &c->pm->place[t];
    uint32_t ns = pl_place_nshards(c->pm, tp), gpn = c->in->tl->gpus_per_node;
    uint32_t node = pl_place_shard_rank(c->pm, tp, 0, 0) / gpn;
    for (uint32_t s = 1; s < ns; s++)
        if (pl_place_shard_rank(c->pm, tp, s, 0) / gpn != node)
            return false;
    return true;
}

/* Decision units: an item joins the unit of its class's first item and of its (mapping,
 * mesh) group's first item (union-find over uf). */
static void join_units(const struct plan_ctx *c, const uint32_t *cls, uint32_t *uf,
                       int32_t *class_first, int32_t *group_first)
{
    size_t nm = c->meshes.n;
    for (size_t i = 0; i < c->items.n; i++) {
        const struct item *it = VEC_AT(&c->items, struct item, i);
        int32_t *cf = &class_first[cls[i]];
        int32_t *gf = &group_first[(size_t)it->mapping * nm + it->mesh];
        uint32_t a = uf_find(uf, (uint32_t)i);
        if (*cf >= 0)
            uf[uf_find(uf, (uint32_t)*cf)] = a;
        else
            *cf = (int32_t)i;
        if (*gf >= 0)
            uf[uf_find(uf, (uint32_t)*gf)] = uf_find(uf, a);
        else
            *gf = (int32_t)i;
    }
}

/* The rollout floor: each rollout GPU receives its local tensors, whatever the mode; the
 * busiest one's bytes at its NICs' rate. */
static double rollout_floor(const struct plan_ctx *c, const struct wb_hw *rh)
{
    double re = rh->nic_gbps * 1e9 / 8 * (double)rh->nics_per_gpu * rh->nic_efficiency;
    double mx = 0;
    for (uint32_t l = 0; l < c->gpr; l++) {
        double b = 0;
        for (size_t m = 0; m < c->in->match->n; m++) {
            const struct rlocal *lo = &c->rloc[m * c->gpr + l];
            const struct wb_mapping *mp = pl_ctx_map(c, (uint32_t)m);
            for (uint32_t p = 0; p < lo->np; p++) {
                const struct wb_local_piece *pc =
                    VEC_AT(&c->pieces, struct wb_local_piece, lo->p0 + p);
                b += (double)wb_box_numel(&pc->global) * wb_dtype_size(mp->dst_dtype);
            }
        }
        mx = b > mx ? b : mx;
    }
    return mx / re;
}

/* From the loads ch holds (mode[u] of every unit applied), units move to the other mode
 * while that helps the objective, at most four passes; cur is the objective throughout. */
static void move_units(struct chooser *ch, uint32_t *uf, uint8_t *mode, const struct ccost *C,
                       const uint32_t *cls, const bool *nvl, double *cur)
{
    const struct plan_ctx *c = ch->c;
    size_t ni = c->items.n;
    for (int pass = 0; pass < 4; pass++) {
        bool moved = false;
        for (size_t u = 0; u < ni; u++) {
            if (uf_find(uf, (uint32_t)u) != u)
                continue;
            uint8_t to = !mode[u];
            for (size_t i = 0; i < ni; i++)
                if (uf_find(uf, (uint32_t)i) == u) {
                    const struct item *it = VEC_AT(&c->items, struct item, i);
                    apply(ch, it, &C[cls[i]], mode[u], nvl[i], -1);
                    apply(ch, it, &C[cls[i]], to, nvl[i], 1);
                }
            double now[3];
            objective(ch, now, NULL);
            if (better(now, cur)) {
                mode[u] = to;
                memcpy(cur, now, 3 * sizeof(double));
                moved = true;
                continue;
            }
            for (size_t i = 0; i < ni; i++) /* back */
                if (uf_find(uf, (uint32_t)i) == u) {
                    const struct item *it = VEC_AT(&c->items, struct item, i);
                    apply(ch, it, &C[cls[i]], to, nvl[i], -1);
                    apply(ch, it, &C[cls[i]], mode[u], nvl[i], 1);
                }
        }
        if (!moved)
            break;
    }
}

int pl_auto_choose(struct plan_ctx *c, uint8_t *gather_groups, struct pl_auto_cost *cost)
{
    size_t ni = c->items.n, nm = c->meshes.n;
    const struct wb_hw *hw = &c->in->tl->hw, *rh = &c->in->rl->hw;
    bool model = hw->nic_gbps > 0 && rh->nic_gbps > 0;
    memset(gather_groups, 0, c->in->match->n * nm + 1);
    memset(cost, 0, sizeof(*cost));
    cost->kind = PL_AUTO_DIRECT;
    if (!ni)
        return 0;
    struct intern classes;
    pl_intern_init(&classes, sizeof(struct ckey));
    struct vec costs; /* struct ccost per class */
    pl_vec_init(&costs, sizeof(struct ccost));
    uint32_t *cls = malloc(ni * sizeof(uint32_t));
    uint32_t *uf = malloc((ni + 1) * sizeof(uint32_t));
    bool *nvl = malloc(ni * sizeof(bool));
    uint8_t *mode = calloc(ni + 1, 1);
    int32_t *group_first = malloc((c->in->match->n * nm + 1) * sizeof(int32_t));
    struct chooser ch = {.c = c, .nt = c->nt};
    ch.load = calloc((size_t)c->nt * NRES + 1, sizeof(double));
    ch.serial = calloc(c->nt + 1, sizeof(double));
    int r = cls && uf && nvl && mode && group_first && ch.load && ch.serial ? 0 : -ENOMEM;
    for (size_t g = 0; !r && g < c->in->match->n * nm; g++)
        group_first[g] = -1;
    ch.te = hw->nic_gbps * 1e9 / 8 * (double)hw->nics_per_gpu * hw->nic_efficiency;
    ch.nvl = hw->nvlink_Bps;
    /* classes, measured on their first item */
    for (size_t i = 0; !r && i < ni; i++) {
        const struct item *it = VEC_AT(&c->items, struct item, i);
        struct ckey key = class_key(c, it);
        size_t before = classes.v.n;
        cls[i] = pl_intern_bytes(&classes, &key);
        if (classes.err) {
            r = classes.err;
            break;
        }
        nvl[i] = item_nvlink(c, it);
        uf[i] = (uint32_t)i;
        if (classes.v.n == before)
            continue;
        struct ccost *cc = pl_vec_push(&costs, NULL);
        if (!cc || (r = pl_item_subpieces((struct plan_ctx *)c, it)) ||
            (r = pl_item_comps_prepare((struct plan_ctx *)c, it))) {
            r = r ? r : -ENOMEM;
            break;
        }
        measure(c, it, cc);
    }
    /* decision units: a class, and every (mapping, mesh) group its items are in */
    int32_t *class_first = NULL;
    if (!r && !(class_first = malloc((classes.v.n + 1) * sizeof(int32_t))))
        r = -ENOMEM;
    for (size_t k = 0; !r && k < classes.v.n; k++)
        class_first[k] = -1;
    if (!r)
        join_units(c, cls, uf, class_first, group_first);
    if (!r && !model) {
        /* no hardware model: a unit goes gather when its first item's class explodes */
        const struct ccost *C0 = costs.p;
        for (size_t i = 0; i < ni; i++) {
            const struct ccost *x = &C0[cls[uf_find(uf, (uint32_t)i)]];
            const struct item *it = VEC_AT(&c->items, struct item, i);
            if (x->runs[0] > RUNS_MIN && x->runs[0] > RUNS_FACTOR * x->runs[1])
                gather_groups[(size_t)it->mapping * nm + it->mesh] = 1;
        }
        goto done;
    }
    if (!r)
        ch.floor_s = rollout_floor(c, rh);
    if (r) /* out of memory above: ch.load may be NULL */
        goto done;
    /* all direct; then units move to gather while that helps */
    const struct ccost *C = costs.p;
    for (size_t i = 0; !r && i < ni; i++)
        apply(&ch, VEC_AT(&c->items, struct item, i), &C[cls[i]], 0, nvl[i], 1);
    double all_direct[3], cur[3], all_gather[3];
    double direct_lb, gather_lb;
    objective(&ch, all_direct, &direct_lb);
    memcpy(cur, all_direct, sizeof(cur));
    move_units(&ch, uf, mode, C, cls, nvl, cur);
    if (!r) {
        /* the plain modes for comparison */
        memset(ch.load, 0, (size_t)c->nt * NRES * sizeof(double));
        memset(ch.serial, 0, c->nt * sizeof(double));
        for (size_t i = 0; i < ni; i++)
            apply(&ch, VEC_AT(&c->items, struct item, i), &C[cls[i]], 1, nvl[i], 1);
        objective(&ch, all_gather, &gather_lb);
        bool any = false, all = true;
        for (size_t i = 0; i < ni; i++) {
            bool g = mode[uf_find(uf, (uint32_t)i)];
            any |= g;
            all &= g;
        }
        double best_plain = all_direct[0] < all_gather[0] ? all_direct[0] : all_gather[0];
        int whole = -1; /* -1: keep the mix */
        if (any && !all && !(cur[0] < MIX_GAIN * best_plain))
            whole = all_gather[0] < GATHER_GAIN * all_direct[0];
        else if (all)
            whole = all_gather[0] < GATHER_GAIN * all_direct[0];
        for (size_t i = 0; i < ni; i++) {
            const struct item *it = VEC_AT(&c->items, struct item, i);
            bool g = whole >= 0 ? whole : mode[uf_find(uf, (uint32_t)i)];
            if (g)
                gather_groups[(size_t)it->mapping * nm + it->mesh] = 1;
        }
        cost->direct_s = all_direct[0];
        cost->gather_s = all_gather[0];
        cost->direct_lb = direct_lb;
        cost->gather_lb = gather_lb;
        cost->kind = whole == 1           ? PL_AUTO_GATHER
                     : whole == 0 || !any ? PL_AUTO_DIRECT
                                          : PL_AUTO_MIX;
        cost->chosen_s = cost->kind == PL_AUTO_GATHER   ? all_gather[0]
                         : cost->kind == PL_AUTO_DIRECT ? all_direct[0]
                                                        : cur[0];
        wb_log(WB_LOG_DEBUG, "planner",
               "auto: %zu cost classes; modelled direct %.4f s (trainers %.4f s, at least %.4f s), "
               "gather %.4f s (%.4f s, at least %.4f s), best mix %.4f s (%.4f s), rollout floor "
               "%.4f s: %s",
               classes.v.n, all_direct[0], all_direct[1], direct_lb, all_gather[0], all_gather[1],
               gather_lb, cur[0], cur[1], ch.floor_s,
               whole == 1   ? "gather"
               : whole == 0 ? "direct"
               : any        ? "mix"
                            : "direct");
    }
done:
    pl_intern_free(&classes);
    pl_vec_free(&costs);
    free(cls);
    free(uf);
    free(nvl);
    free(mode);
    free(group_first);
    free(class_first);
    free(ch.load);
    free(ch.serial);
    return r;
}
