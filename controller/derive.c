/* derive.c — the trainer layout of a job whose file names none, derived from what the trainers
 * registered: the device mesh their DTensors live on and each tensor's placement on it
 * (Replicate, Shard(d) by torch.chunk's rule, or "at coordinate i": only the ranks at
 * coordinate i of that mesh dim hold it — a pipeline stage's layers, an expert rank's experts;
 * WB_PLACE_INDEX for the planner). Every rank must describe the same mesh and
 * place each tensor alike; the boxes each rank registered are then checked against the derived
 * layout like any other registration (register.c), so a process whose shards disagree with its
 * own placements is refused with the tensor named.
 *
 * The dtype each tensor is registered in becomes the trainer side's (the same on every rank):
 * a trainer keeping FP32 (or FP16) masters is planned to cast or quantize from them.
 *
 * Why placements and not boxes alone: boxes say which rank holds what, but not which ranks hold
 * copies of one shard and which hold different shards — the mesh and its placements say both,
 * and they are what FSDP2/DTensor already knows.
 *
 * A rank registering a tensor "at" a coordinate it is not at is refused here, naming the rank,
 * the tensor and both coordinates: the planner would take it for the ranks at that coordinate
 * and never read this rank's copy. A rank at the coordinate that leaves it out is reported by
 * the registration check (register.c) as not registered. */
#include "controller/ctl.h"
#include "planner/planner.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct placed {
    char name[WB_NAME_MAX];
    struct wb_placement place[WB_MESH_MAX_DIMS];
    uint32_t first_rank;
    enum wb_dtype dtype; /* as registered */
};

static int cmp_placed(const void *a, const void *b)
{
    return strcmp(((const struct placed *)a)->name, ((const struct placed *)b)->name);
}

static bool float_dtype(enum wb_dtype d)
{
    return d == WB_DTYPE_BF16 || d == WB_DTYPE_FP16 || d == WB_DTYPE_FP32;
}

static bool same_mesh(const struct wb_reg_mesh *a, const struct wb_reg_mesh *b)
{
    if (a->ndims != b->ndims)
        return false;
    for (uint32_t d = 0; d < a->ndims; d++)
        if (a->size[d] != b->size[d] || strcmp(a->name[d], b->name[d]) != 0)
            return false;
    return true;
}

static int derive_layout(uint32_t ntrainers, const struct wb_bytes *inv,
                         const struct wb_bytes *mesh, struct wb_inventory *trainer,
                         struct wb_trainer_layout *out, struct wb_errlist *el)
{
    struct wb_reg_mesh m0 = {0};
    struct placed *all = NULL;
    size_t n = 0, cap = 0;
    int err = 0;
    bool misplaced = false; /* reported for every rank before giving up */
    for (uint32_t r = 0; r < ntrainers && !err; r++) {
        struct wb_reg_mesh m;
        struct wb_mpr rd;
        wb_mpr_init(&rd, mesh[r].p, mesh[r].n);
        if (!mesh[r].n || wb_reg_mesh_get(&rd, &m)) {
            wb_errlist_add(el,
                           "trainer rank %u registered no device mesh: the job names no "
                           "trainer_layout, so every trainer must give its tensors' placements",
                           r);
            err = -WB_E_CONFIG;
            continue;
        }
        if (r == 0) {
            m0 = m;
        } else if (!same_mesh(&m, &m0)) {
            wb_errlist_add(el, "trainer rank %u's device mesh differs from trainer rank 0's", r);
            err = -WB_E_CONFIG;
            continue;
        }
        uint32_t coord[WB_REG_MESH_DIMS]; /* rank r's place on the mesh (row-major) */
        for (uint32_t d = m.ndims, rest = r; d-- > 0;) {
            coord[d] = rest % m.size[d];
            rest /= m.size[d];
        }
        struct wb_mpr ri;
        uint32_t k = 0;
        wb_mpr_init(&ri, inv[r].p, inv[r].n);
        if (wb_mpr_array(&ri, WB_WIRE_MAX_ARRAY, &k)) {
            err = -EBADMSG;
            break;
        }
        for (uint32_t i = 0; i < k; i++) {
            struct wb_reg_tensor t;
            if (wb_reg_get(&ri, &t)) {
                err = -EBADMSG;
                break;
            }
            if (t.nplace != m.ndims) {
                wb_errlist_add(el,
                               "trainer rank %u: %s: registered without a placement on the %u-dim "
                               "mesh",
                               r, t.meta.name, m.ndims);
                err = -WB_E_CONFIG;
                continue;
            }
            if (n == cap && wb_grow(&all, &cap, 256, sizeof(*all))) {
                err = -ENOMEM;
                break;
            }
            struct placed *p = &all[n++];
            memset(p, 0, sizeof(*p));
            snprintf(p->name, sizeof(p->name), "%s", t.meta.name);
            p->first_rank = r;
            p->dtype = t.meta.dtype;
            for (uint32_t d = 0; d < m.ndims; d++) {
                int64_t at = wb_reg_at_index(t.place[d]);
                if (at >= (int64_t)m.size[d]) {
                    wb_errlist_add(el,
                                   "trainer rank %u: %s: placed at coordinate %lld of mesh dim "
                                   "%s, which has %u",
                                   r, t.meta.name, (long long)at, m.name[d], m.size[d]);
                    misplaced = true;
                } else if (at >= 0 && at != coord[d]) {
                    wb_errlist_add(el,
                                   "trainer rank %u: %s: placed at coordinate %lld of mesh dim "
                                   "%s, but the rank is at coordinate %u there; only the ranks at "
                                   "%lld register it",
                                   r, t.meta.name, (long long)at, m.name[d], coord[d],
                                   (long long)at);
                    misplaced = true;
                }
                p->place[d] = at >= 0 ? (struct wb_placement){WB_PLACE_INDEX, (uint32_t)at}
                              : t.place[d] == WB_REG_REPLICATE
                                  ? (struct wb_placement){WB_PLACE_REPLICATE, 0}
                                  : (struct wb_placement){WB_PLACE_SHARD, (uint32_t)t.place[d]};
            }
        }
    }
    if (!err && misplaced)
        err = -WB_E_CONFIG;
    if (!err) {
        uint64_t world = 1;
        for (uint32_t d = 0; d < m0.ndims; d++)
            world *= m0.size[d];
        if (world != ntrainers) {
            wb_errlist_add(el, "the trainers' device mesh has %llu ranks, the job %u trainers",
                           (unsigned long long)world, ntrainers);
            err = -WB_E_CONFIG;
        }
    }
    /* One placement per name: the same on every rank that registered it. */
    size_t u = 0;
    if (!err) {
        qsort(all, n, sizeof(*all), cmp_placed);
        for (size_t i = 0; i < n; i++) {
            if (u && strcmp(all[i].name, all[u - 1].name) == 0) {
                if (memcmp(all[i].place, all[u - 1].place, sizeof(all[i].place)) != 0) {
                    wb_errlist_add(el, "%s: trainer ranks %u and %u place it differently",
                                   all[i].name, all[u - 1].first_rank, all[i].first_rank);
                    err = -WB_E_CONFIG;
                }
                if (all[i].dtype != all[u - 1].dtype) {
                    wb_errlist_add(el, "%s: trainer rank %u holds it in %s, trainer rank %u in %s",
                                   all[i].name, all[u - 1].first_rank,
                                   wb_dtype_name(all[u - 1].dtype), all[i].first_rank,
                                   wb_dtype_name(all[i].dtype));
                    err = -WB_E_CONFIG;
                }
                continue;
            }
            all[u++] = all[i];
        }
    }
    const char **names = calloc(u ? u : 1, sizeof(char *));
    struct wb_placement *place = calloc((u ? u : 1) * (m0.ndims ? m0.ndims : 1), sizeof(*place));
    if (!err && (!names || !place))
        err = -ENOMEM;
    if (!err) {
        struct wb_mesh_dim dims[WB_MESH_MAX_DIMS];
        for (uint32_t d = 0; d < m0.ndims; d++) {
            dims[d].size = m0.size[d];
            snprintf(dims[d].name, sizeof(dims[d].name), "%s", m0.name[d]);
        }
        for (size_t i = 0; i < u; i++) {
            names[i] = all[i].name;
            memcpy(&place[i * m0.ndims], all[i].place, m0.ndims * sizeof(*place));
        }
        err = wb_trainer_layout_from_placements(m0.ndims, dims, 0, WB_RESIDE_GPU, u, names, place,
                                                NULL, "the trainers' registrations", out, el);
    }
    /* The dtypes they hold: a floating-point tensor registered in another floating-point dtype
     * than the model's (FP32 masters) is sent cast to the rollout's; anything else stays the
     * model's, and registration names the difference. */
    for (size_t i = 0; !err && i < u; i++) {
        ssize_t t = wb_inv_find(trainer, all[i].name);
        if (t >= 0 && float_dtype(trainer->p[t].dtype) && float_dtype(all[i].dtype))
            trainer->p[t].dtype = all[i].dtype;
    }
    free(names);
    free(place);
    free(all);
    return err;
}

int ctl_plan_derive(const struct wb_job *job, struct ctl_plan *p, const struct wb_bytes *inv,
                    const struct wb_bytes *mesh, struct wb_errlist *el)
{
    struct wb_trainer_layout tl;
    memset(&tl, 0, sizeof(tl));
    struct wb_model *md = p->md;
    int err = derive_layout(p->ntrainers, inv, mesh, &md->trainer, &tl, el);
    /* matched again: the registered dtypes decide between copies, casts and quantizations */
    struct wb_match *mt = NULL;
    err = err ? err : wb_match_run(md->rules, &md->trainer, &md->rollout, &mt, el);
    if (!err) {
        wb_match_free(md->match);
        md->match = mt;
    }
    err = err ? err : ctl_plan_finish(job, p, &tl, el);
    wb_trainer_layout_free(&tl);
    return err;
}
