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
 * The trainer naming and the trainer-mesh vars come from the registrations too, when the job
 * does not give them: a family var mesh_<dim> is set to the size of the mesh dim of that name
 * (mesh_tp from "tp": Megatron's linear_fc1 groups and vocab padding), and of a family file's
 * namings the one whose trainer inventory holds every registered name is used (Megatron's
 * decoder.layers... names select `megatron`). The trainer inventory is generated again with
 * them before the layout is derived from it.
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

/* Whether the job's vars text ("a=1,mesh_tp=2") sets var `name`. */
static bool job_sets(const char *vars, const char *name)
{
    size_t len = strlen(name);
    for (const char *p = vars; p && *p;) {
        while (*p == ' ' || *p == ',')
            p++;
        if (strncmp(p, name, len) == 0 && (p[len] == '=' || p[len] == ' '))
            return true;
        p = strchr(p, ',');
    }
    return false;
}

/* The registered names (sorted, unique) that inventory `inv` lacks: how many, the first three
 * in `buf`. */
static size_t lacking(const struct wb_inventory *inv, const struct placed *all, size_t u, char *buf,
                      size_t cap)
{
    size_t n = 0, pos = 0;
    buf[0] = 0;
    for (size_t i = 0; i < u; i++) {
        if (wb_inv_find(inv, all[i].name) >= 0)
            continue;
        if (n++ < 3 && pos < cap)
            pos += (size_t)snprintf(buf + pos, cap - pos, "%s%s", n > 1 ? ", " : "", all[i].name);
    }
    if (n > 3 && pos < cap)
        snprintf(buf + pos, cap - pos, ", ...");
    return n;
}

/* Sets the family's mesh_<dim> vars from the registered mesh (unless the job's model.vars sets
 * them), chooses the naming (unless the job's model.naming does: the one whose trainer
 * inventory holds every registered name) and generates the trainer inventory again with both.
 * Only for a trainer inventory generated from config.json; with one naming and no mesh var it
 * changes nothing, and a registered name the inventory lacks is register.c's to report. */
static int naming_and_mesh(const struct wb_job *job, struct wb_model *md,
                           const struct wb_reg_mesh *m, const struct placed *all, size_t u,
                           struct wb_errlist *el)
{
    const char *cfg = job->model.hf_config;
    if (!cfg || !*cfg || (job->model.trainer_inventory && *job->model.trainer_inventory))
        return 0;
    struct wb_match_rules *rules = md->rules;
    const char *jv = job->model.vars ? job->model.vars : "";
    char vars[2048];
    int pos = snprintf(vars, sizeof(vars), "%s", jv);
    bool changed = false;
    for (uint32_t d = 0; d < m->ndims; d++) {
        char var[WB_REG_MESH_NAME + 8];
        snprintf(var, sizeof(var), "mesh_%s", m->name[d]);
        if (!wb_match_rules_has_var(rules, var) || job_sets(jv, var))
            continue;
        if (pos >= 0 && (size_t)pos < sizeof(vars))
            pos += snprintf(vars + pos, sizeof(vars) - (size_t)pos, "%s%s=%u", pos ? "," : "", var,
                            m->size[d]);
        changed = true;
    }
    if (pos < 0 || (size_t)pos >= sizeof(vars)) {
        wb_errlist_add(el, "the job's model.vars and the trainers' mesh vars are too long");
        return -WB_E_CONFIG;
    }
    int err = changed ? wb_match_rules_set_vars(rules, vars, el) : 0;
    if (err)
        return err;
    const char *const *names;
    size_t nn = wb_match_rules_namings(rules, &names);
    bool choose = !(job->model.naming && *job->model.naming) && nn > 1;
    if (choose) {
        char why[2048], miss[3 * WB_NAME_MAX + 8];
        size_t wpos = 0, fits = 0, fit = 0;
        why[0] = 0;
        char fitting[256] = "";
        for (size_t i = 0; i < nn && !err; i++) {
            struct wb_inventory t;
            wb_inv_init(&t);
            err = wb_match_rules_set_naming(rules, names[i], el);
            err = err ? err : wb_match_rules_generate(rules, cfg, "trainer", &t, el);
            if (!err) {
                size_t k = lacking(&t, all, u, miss, sizeof(miss));
                if (!k) {
                    size_t fl = strlen(fitting);
                    snprintf(fitting + fl, sizeof(fitting) - fl, "%s%s", fits ? ", " : "",
                             names[i]);
                    fit = i;
                    fits++;
                } else if (wpos < sizeof(why)) {
                    wpos += (size_t)snprintf(why + wpos, sizeof(why) - wpos, "%s%s lacks %zu (%s)",
                                             wpos ? "; " : "", names[i], k, miss);
                }
            }
            wb_inv_free(&t);
        }
        if (err)
            return err;
        if (fits != 1) {
            if (!fits)
                wb_errlist_add(el,
                               "the trainers registered names that no naming of %s has "
                               "(%zu names): %s",
                               job->model.rules, u, why);
            else
                wb_errlist_add(el,
                               "the trainers' registered names fit %zu namings of %s (%s): give "
                               "the job's model.naming",
                               fits, job->model.rules, fitting);
            return -WB_E_CONFIG;
        }
        if ((err = wb_match_rules_set_naming(rules, names[fit], el)))
            return err;
        wb_log(WB_LOG_INFO, "controller", "trainer naming %s (the registered names are its own)",
               names[fit]);
        changed = changed || fit != 0 || strcmp(names[fit], names[0]) != 0;
    }
    if (!changed && !choose)
        return 0;
    struct wb_inventory t;
    wb_inv_init(&t);
    if ((err = wb_match_rules_generate(rules, cfg, "trainer", &t, el))) {
        wb_inv_free(&t);
        return err;
    }
    wb_inv_free(&md->trainer);
    md->trainer = t;
    return 0;
}

static int derive_layout(const struct wb_job *job, uint32_t ntrainers, const struct wb_bytes *inv,
                         const struct wb_bytes *mesh, struct wb_model *md,
                         struct wb_trainer_layout *out, struct wb_errlist *el)
{
    struct wb_inventory *trainer = &md->trainer;
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
    if (!err)
        err = naming_and_mesh(job, md, &m0, all, u, el);
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
    int err = derive_layout(job, p->ntrainers, inv, mesh, md, &tl, el);
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
