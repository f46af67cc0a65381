/* plan.c — builds the controller's plan from the job file: without a model, the control plane
 * alone (agents register, heartbeat, and run empty transfers); with a model, matcher + planner
 * produce one routing table per trainer and one receive list per rollout, encoded once here so
 * that handing them out later is a copy. */
#include "controller/ctl.h"
#include "matcher/matcher.h"
#include "planner/planner.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int plan_empty(const struct wb_job *job, struct ctl_plan *p)
{
    p->ntrainers = (uint32_t)job->trainers;
    p->nrollouts = (uint32_t)job->rollouts;
    p->replicas = 1; /* no layout: the rollouts are one replica (nothing to relay) */
    p->replica_ranks = p->nrollouts;
    p->table = calloc(p->ntrainers, sizeof(*p->table));
    p->shards = calloc(p->ntrainers, sizeof(*p->shards));
    p->recv = calloc(p->nrollouts, sizeof(*p->recv));
    char text[256];
    snprintf(text, sizeof(text),
             "job %s: no model (control plane only): %u trainers, %u rollouts, 0 bytes\n",
             job->name, p->ntrainers, p->nrollouts);
    p->summary = strdup(text);
    if (!p->table || !p->shards || !p->recv || !p->summary)
        return -ENOMEM;
    return 0;
}

static int blob_from(struct ctl_blob *b, struct wb_mpw *w)
{
    int err = wb_mpw_finish(w);
    if (err) {
        wb_mpw_free(w);
        return err;
    }
    b->buf = w->buf;
    b->len = w->len;
    return 0; /* the writer's buffer now belongs to the blob */
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* The trainer tensors no mapping uses, sorted by name (ctl_check_registration accepts them). */
static int ignored_names(struct ctl_plan *p, const struct wb_inventory *ti,
                         const struct wb_match *mt)
{
    bool *used = calloc(ti->n ? ti->n : 1, sizeof(bool));
    p->ignored_names = calloc(ti->n ? ti->n : 1, sizeof(char *));
    if (!used || !p->ignored_names) {
        free(used);
        return -ENOMEM;
    }
    for (size_t m = 0; m < mt->n; m++)
        for (uint32_t c = 0; c < mt->map[m].ncomp; c++)
            used[mt->map[m].comp[c].trainer] = true;
    int err = 0;
    for (size_t t = 0; !err && t < ti->n; t++) {
        if (used[t])
            continue;
        char *s = strdup(ti->p[t].name);
        if (s)
            p->ignored_names[p->nignored_names++] = s;
        else
            err = -ENOMEM;
    }
    qsort(p->ignored_names, p->nignored_names, sizeof(char *), cmp_str);
    free(used);
    return err;
}

/* Per trainer rank: the shards it holds of every trainer tensor the match uses, as an array
 * of wb_tensor_meta (the synthetic source materializes exactly these). */
static int encode_shards(const struct wb_job *job, struct ctl_plan *p,
                         const struct wb_inventory *ti, const struct wb_match *mt,
                         const struct wb_trainer_layout *tl, struct wb_errlist *el)
{
    bool *used = calloc(ti->n ? ti->n : 1, sizeof(bool));
    uint32_t *count = calloc(p->ntrainers, sizeof(uint32_t));
    struct wb_owner **own = calloc(ti->n ? ti->n : 1, sizeof(*own));
    uint32_t *nown = calloc(ti->n ? ti->n : 1, sizeof(uint32_t));
    struct wb_mpw *w = calloc(p->ntrainers, sizeof(*w));
    int err = (!used || !count || !own || !nown || !w) ? -ENOMEM : 0;
    for (size_t m = 0; !err && m < mt->n; m++)
        for (uint32_t c = 0; c < mt->map[m].ncomp; c++)
            used[mt->map[m].comp[c].trainer] = true;
    /* one placement map for every tensor (building it per tensor was quadratic: minutes for a
     * 1,024-rank trainer of Kimi-K2's 60,000 tensors) */
    struct wb_placement_map *pm = NULL;
    err = err ? err : wb_placement_map_build(tl, ti, used, &pm, el);
    for (size_t t = 0; !err && t < ti->n; t++) {
        if (!used[t])
            continue;
        err = wb_placement_owners(pm, (uint32_t)t, &own[t], &nown[t]);
        for (uint32_t k = 0; !err && k < nown[t]; k++)
            if (own[t][k].rank < p->ntrainers)
                count[own[t][k].rank]++;
    }
    if (pm)
        wb_placement_map_free(pm);
    for (uint32_t r = 0; !err && r < p->ntrainers; r++) {
        wb_mpw_init(&w[r]);
        wb_mpw_array(&w[r], count[r]);
    }
    for (size_t t = 0; !err && t < ti->n; t++)
        for (uint32_t k = 0; used[t] && k < nown[t]; k++) {
            uint32_t r = own[t][k].rank;
            if (r >= p->ntrainers)
                continue;
            struct wb_tensor_meta tm = {
                .dtype = ti->p[t].dtype, .shape = ti->p[t].shape, .box = own[t][k].box};
            snprintf(tm.name, sizeof(tm.name), "%s", ti->p[t].name);
            wb_mpw_array(&w[r], 2); /* [trainer tensor index, meta] */
            wb_mpw_u64(&w[r], t);
            wb_wire_put_tensor_meta(&w[r], &tm);
        }
    for (uint32_t r = 0; w && r < p->ntrainers; r++) {
        if (err) /* not handed to a blob (calloc'd: an unused writer frees nothing) */
            wb_mpw_free(&w[r]);
        else
            err = blob_from(&p->shards[r], &w[r]);
    }
    (void)job;
    for (size_t t = 0; own && t < ti->n; t++)
        free(own[t]);
    free(own);
    free(nown);
    free(used);
    free(count);
    free(w);
    return err;
}

/* Verify: every write's slot in its rollout's checksum inbox. A rollout's inbox holds one
 * record per write it counts, grouped by its receive list's expect entries in order; within an
 * entry, writes come trainer by trainer in table order — so each trainer finds its slots
 * without knowing the others' tables, and the rollout its records without any list. The
 * trainers' tables are read in rank order (sums_rank for r = 0, 1, ...), each once. */
struct sums {
    uint32_t *next; /* [nrollouts * stride]: the next free slot per (rollout, tag) */
    size_t stride;
};

static int sums_init(struct sums *s, struct ctl_plan *p, const struct wb_plan *plan)
{
    uint32_t maxtag = 0;
    for (uint32_t g = 0; g < plan->nrollouts; g++)
        for (uint32_t i = 0; i < plan->recv[g].nexpect; i++)
            if (plan->recv[g].expect[i].tag > maxtag)
                maxtag = plan->recv[g].expect[i].tag;
    s->stride = (size_t)maxtag + 1;
    s->next = malloc((plan->nrollouts ? plan->nrollouts : 1) * s->stride * sizeof(uint32_t));
    p->sums = calloc(plan->ntrainers ? plan->ntrainers : 1, sizeof(*p->sums));
    if (!s->next || !p->sums)
        return -ENOMEM;
    for (uint32_t g = 0; g < plan->nrollouts; g++) {
        uint64_t slot = 0;
        for (uint32_t i = 0; i < plan->recv[g].nexpect; i++) {
            s->next[g * s->stride + plan->recv[g].expect[i].tag] = (uint32_t)slot;
            slot += plan->recv[g].expect[i].writes;
        }
        if (slot > UINT32_MAX)
            return -E2BIG;
    }
    return 0;
}

static int sums_rank(struct sums *s, struct ctl_plan *p, const struct wb_route_table *t, uint32_t r)
{
    size_t nw = (size_t)wb_route_table_writes(t); /* as the agent's decoded table has them */
    uint8_t *b = malloc(nw * 4 + 1);
    if (!b)
        return -ENOMEM;
    size_t k = 0;
    for (uint32_t i = 0; i < t->nwrites; i++) {
        const struct wb_rt_write *w = &t->writes[i];
        for (uint32_t c = 0; c < wb_rt_copies(w); c++, k++) {
            uint32_t slot = s->next[(size_t)wb_rt_copy_rank(w, c) * s->stride + w->tag]++;
            b[4 * k] = (uint8_t)slot;
            b[4 * k + 1] = (uint8_t)(slot >> 8);
            b[4 * k + 2] = (uint8_t)(slot >> 16);
            b[4 * k + 3] = (uint8_t)(slot >> 24);
        }
    }
    p->sums[r] = (struct ctl_blob){b, nw * 4};
    return 0;
}

/* Delta updates: each rollout's delta inbox has a slab per trainer that writes to it, of an
 * eighth of the bytes that trainer writes there, a header's room per write and 4 KiB
 * (8-aligned): a record (32 bytes and 5 per changed byte) of a write that changed in up to
 * 2.5 % of its bytes fits; a trainer sends whole what does not. Slabs come in trainer rank
 * order. dbytes/dwrites: [ntrainers * nrollouts], filled table by table (delta_rank). */
struct dslabs {
    uint64_t *bytes, *writes;
};

static void delta_rank(struct dslabs *s, uint32_t nr, const struct wb_route_table *t, uint32_t r)
{
    for (uint32_t i = 0; i < t->nwrites; i++) {
        const struct wb_rt_write *w = &t->writes[i];
        for (uint32_t c = 0; c < wb_rt_copies(w); c++) {
            uint32_t g = wb_rt_copy_rank(w, c);
            if (g < nr) {
                s->bytes[(size_t)r * nr + g] += w->len;
                s->writes[(size_t)r * nr + g]++;
            }
        }
    }
}

static uint64_t slab_size(uint64_t bytes, uint64_t writes)
{
    return bytes ? (bytes / 8 + writes * 64 + 4096 + 7) / 8 * 8 : 0;
}

static void put_u64(uint8_t *p, uint64_t v)
{
    memcpy(p, &v, 8);
}

static int delta_encode(struct dslabs *s, struct ctl_plan *p)
{
    uint32_t nt = p->ntrainers, nr = p->nrollouts;
    p->dslab_t = calloc(nt ? nt : 1, sizeof(*p->dslab_t));
    p->dslab_r = calloc(nr ? nr : 1, sizeof(*p->dslab_r));
    if (!p->dslab_t || !p->dslab_r)
        return -ENOMEM;
    for (uint32_t t = 0; t < nt; t++)
        if (!(p->dslab_t[t].buf = calloc(nr ? nr : 1, 16)))
            return -ENOMEM;
    for (uint32_t g = 0; g < nr; g++) {
        uint8_t *b = calloc(nt ? nt : 1, 16);
        if (!b)
            return -ENOMEM;
        p->dslab_r[g] = (struct ctl_blob){b, (size_t)nt * 16};
        uint64_t off = 0;
        for (uint32_t t = 0; t < nt; t++) {
            uint64_t len = slab_size(s->bytes[(size_t)t * nr + g], s->writes[(size_t)t * nr + g]);
            put_u64(b + 16 * (size_t)t, off);
            put_u64(b + 16 * (size_t)t + 8, len);
            put_u64(p->dslab_t[t].buf + 16 * (size_t)g, off);
            put_u64(p->dslab_t[t].buf + 16 * (size_t)g + 8, len);
            off += len;
        }
    }
    for (uint32_t t = 0; t < nt; t++)
        p->dslab_t[t].len = (size_t)nr * 16;
    return 0;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* Who writes what, from the tables (ctl.h): what PEERS may hand each agent. */
static int scope_init(struct ctl_plan *p)
{
    uint32_t nt = p->ntrainers, nr = p->nrollouts;
    p->wkeys = calloc(nt ? nt : 1, sizeof(*p->wkeys));
    p->nwkeys = calloc(nt ? nt : 1, sizeof(*p->nwkeys));
    p->tpeer_of = calloc((size_t)nt * nt + 1, 1);
    p->writer_of = calloc((size_t)nr * nt + 1, 1);
    return !p->wkeys || !p->nwkeys || !p->tpeer_of || !p->writer_of ? -ENOMEM : 0;
}

static int scope_rank(struct ctl_plan *p, const struct wb_route_table *t, uint32_t r)
{
    uint32_t nt = p->ntrainers, nr = p->nrollouts;
    size_t n = (size_t)wb_route_table_writes(t), k = 0;
    uint64_t *keys = malloc((n ? n : 1) * sizeof(uint64_t));
    if (!keys)
        return -ENOMEM;
    for (uint32_t i = 0; i < t->nwrites; i++) {
        const struct wb_rt_write *w = &t->writes[i];
        for (uint32_t c = 0; c < wb_rt_copies(w) && k < n; c++) {
            uint32_t g = wb_rt_copy_rank(w, c);
            keys[k++] = (uint64_t)g << 32 | w->dst_tensor;
            if (g < nr)
                p->writer_of[(size_t)g * nt + r] = 1;
        }
    }
    qsort(keys, k, sizeof(*keys), cmp_u64);
    size_t u = 0;
    for (size_t i = 0; i < k; i++)
        if (!u || keys[i] != keys[u - 1])
            keys[u++] = keys[i];
    p->wkeys[r] = keys;
    p->nwkeys[r] = u;
    for (uint32_t i = 0; i < t->nops; i++) {
        const struct wb_rt_op *op = &t->ops[i];
        if (op->kind == WB_OP_GATHER)
            for (uint32_t j = 0; j < op->gather.npeers; j++) {
                uint32_t q = t->peers[op->gather.peer0 + j].rank;
                if (q < nt && q != r)
                    p->tpeer_of[(size_t)r * nt + q] = 1;
            }
        if (op->kind == WB_OP_AMAX)
            for (uint32_t j = 0; j < op->amax.npeers; j++) {
                uint32_t q = t->amax_peers[op->amax.peer0 + j].rank;
                if (q < nt && q != r)
                    p->tpeer_of[(size_t)r * nt + q] = 1;
            }
    }
    return 0;
}

/* Trainer rank r's table, once: its bytes, its envelope for the agent, who it writes and its
 * checksum slots (s NULL: no verify). */
static int table_rank(struct ctl_plan *p, struct sums *s, const struct wb_route_table *t,
                      uint32_t r)
{
    p->send_bytes[r] = t->send_bytes;
    if (t->max_tmp_bytes > p->largest_task)
        p->largest_task = t->max_tmp_bytes;
    struct wb_mpw w;
    wb_mpw_init(&w);
    wb_route_table_encode(&w, t);
    int err = blob_from(&p->table[r], &w);
    err = err ? err : scope_rank(p, t, r);
    return err || !s ? err : sums_rank(s, p, t, r);
}

void ctl_model_src(const struct wb_job *job, struct wb_model_src *src)
{
    *src = (struct wb_model_src){.rules = job->model.rules,
                                 .config = job->model.hf_config,
                                 .vars = job->model.vars,
                                 .naming = job->model.naming,
                                 .trainer_inv = job->model.trainer_inventory,
                                 .rollout_inv = job->model.rollout_inventory,
                                 .trainer_layout = job->trainer_layout,
                                 .rollout_layout = job->rollout_layout};
}

/* Out of memory where no message was given: says at which step, so a start that fails is
 * not just "Cannot allocate memory". */
static int oom_at(struct wb_errlist *el, size_t n0, int err, const char *step)
{
    if (err == -ENOMEM && el->n == n0 && !el->dropped)
        wb_errlist_add(el, "out of memory %s", step);
    return err;
}

/* Plans a loaded model (its layouts loaded or derived) and encodes what every agent gets. */
static int plan_encode(const struct wb_job *job, struct ctl_plan *p, struct wb_model *mdp,
                       bool fit_largest, struct wb_errlist *el)
{
    struct wb_model md = *mdp; /* read only here; the caller owns it */
    struct wb_plan *plan = NULL;
    struct wb_plan_tbuf tb = {0}; /* a table as wb_plan_table() hands it out */
    struct wb_plan_input in = wb_model_input(&md);
    /* lazy: stamped items stay segments until a reader expands one trainer's table, so the
     * controller never holds every table expanded at once (about 2 GB at 1,024 trainers of
     * Kimi-K2); each table is expanded, encoded for its agent and released in turn */
    struct wb_plan_opts opts = {.mode = (enum wb_plan_mode)job->mode,
                                .mem_cap = job->mem_cap,
                                .fit_cap = fit_largest,
                                .lazy = true};
    int err = wb_plan_build(&in, &opts, &plan, el);
    err = err ? err : wb_plan_check_cap(plan, &in, el);
    if (err)
        goto out;
    if ((job->trainers && job->trainers != plan->ntrainers) ||
        (job->rollouts && job->rollouts != plan->nrollouts)) {
        wb_errlist_add(el, "job: trainers %llu, rollouts %llu disagree with the layouts (%u, %u)",
                       (unsigned long long)job->trainers, (unsigned long long)job->rollouts,
                       plan->ntrainers, plan->nrollouts);
        err = -WB_E_CONFIG;
        goto out;
    }
    p->has_model = true;
    p->ntrainers = plan->ntrainers;
    p->nrollouts = plan->nrollouts;
    p->replicas = md.rl.replicas ? md.rl.replicas : 1;
    p->replica_ranks = p->nrollouts / p->replicas;
    p->total_bytes = plan->stats.total_bytes;
    /* a cap below the largest task was refused above, or raised (fit_largest) */
    p->mem_cap = plan->mem_cap;
    if (p->mem_cap > (job->mem_cap ? job->mem_cap : WB_MEM_CAP_DEFAULT))
        wb_log(WB_LOG_INFO, "controller",
               "memory cap raised from %llu to the largest task's %llu bytes",
               (unsigned long long)(job->mem_cap ? job->mem_cap : WB_MEM_CAP_DEFAULT),
               (unsigned long long)p->mem_cap);
    p->send_bytes = malloc((p->ntrainers ? p->ntrainers : 1) * sizeof(uint64_t));
    p->table = calloc(p->ntrainers, sizeof(*p->table));
    p->shards = calloc(p->ntrainers, sizeof(*p->shards));
    p->recv = calloc(p->nrollouts ? p->nrollouts : 1, sizeof(*p->recv));
    if (!p->send_bytes || !p->table || !p->shards || !p->recv) {
        err = -ENOMEM;
        goto out;
    }
    struct sums sums = {0};
    struct dslabs ds = {0};
    bool ipc = job->provider &&
               (strcmp(job->provider, "cudaipc") == 0 || strcmp(job->provider, "cuda_ipc") == 0);
    size_t ntr = (size_t)p->ntrainers * p->nrollouts + 1;
    err = scope_init(p);
    err = err || !job->verify ? err : sums_init(&sums, p, plan);
    if (!err && job->delta && (!(ds.bytes = calloc(ntr, 8)) || !(ds.writes = calloc(ntr, 8))))
        err = -ENOMEM;
    for (uint32_t r = 0; !err && r < p->ntrainers; r++) {
        const struct wb_route_table *t = wb_plan_table(plan, r, &tb);
        err = t ? table_rank(p, job->verify ? &sums : NULL, t, r) : -ENOMEM;
        /* CUDA IPC registers device memory only: no host inbox, its slabs are empty (pipeline
         * writes go whole; the direct path stores changes itself, agent/direct.c) */
        if (!err && ds.bytes && !ipc)
            delta_rank(&ds, p->nrollouts, t, r);
    }
    err = err || !ds.bytes ? err : delta_encode(&ds, p);
    free(ds.bytes);
    free(ds.writes);
    free(sums.next);
    p->locals = calloc(p->nrollouts ? p->nrollouts : 1, sizeof(*p->locals));
    if (!err && !p->locals) /* a table that failed to encode stays an error */
        err = -ENOMEM;
    for (uint32_t r = 0; !err && r < p->nrollouts; r++) {
        struct wb_mpw w, names;
        wb_mpw_init(&w);
        wb_recv_list_encode(&w, &plan->recv[r]);
        err = blob_from(&p->recv[r], &w);
        wb_mpw_init(&names);
        wb_mpw_array(&names, plan->recv[r].nlocal);
        for (uint32_t i = 0; i < plan->recv[r].nlocal; i++)
            wb_mpw_str(&names, md.rollout.p[plan->recv[r].local[i].tensor].name);
        int e2 = blob_from(&p->locals[r], &names);
        err = err ? err : e2;
    }
    err = err ? err : encode_shards(job, p, &md.trainer, md.match, &md.tl, el);
    if (!err)
        err = ignored_names(p, &md.trainer, md.match);
    if (!err) {
        p->rollout_names = calloc(md.rollout.n + 1, sizeof(char *));
        err = p->rollout_names ? 0 : -ENOMEM;
        for (size_t i = 0; !err && i < md.rollout.n; i++) {
            p->rollout_names[i] = strdup(md.rollout.p[i].name);
            err = p->rollout_names[i] ? 0 : -ENOMEM;
            p->nrollout_names = (uint32_t)i + 1;
        }
    }
    if (!err) {
        char *text = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&text, &len);
        if (!f) {
            err = -ENOMEM;
            goto out;
        }
        fprintf(f, "job %s: mode %s, mem_cap %llu bytes\n", job->name,
                wb_plan_mode_name(plan->mode), (unsigned long long)plan->mem_cap);
        wb_plan_print_summary(plan, &in, f);
        fclose(f);
        p->summary = text;
        char w[512];
        if (wb_plan_dtype_warning(&in, w, sizeof(w)))
            wb_log(WB_LOG_WARN, "controller", "job %s: %s (model.hf_config %s)", job->name, w,
                   job->model.hf_config && *job->model.hf_config ? job->model.hf_config : "-");
    }
out:
    wb_plan_tbuf_free(&tb);
    wb_plan_free(plan);
    return err;
}

static int plan_model(const struct wb_job *job, struct ctl_plan *p, struct wb_errlist *el)
{
    struct wb_model_src src;
    ctl_model_src(job, &src);
    if (!*job->trainer_layout) { /* derived from what the trainers register (register.c) */
        src.rollout_layout = NULL;
        size_t n0 = el->n;
        p->md = calloc(1, sizeof(*p->md));
        if (!p->md)
            return oom_at(el, n0, -ENOMEM, "loading the model");
        int err = oom_at(el, n0, wb_model_load(&src, p->md, el), "loading the model");
        if (!err) {
            err = oom_at(el, n0, wb_rollout_layout_load(job->rollout_layout, &p->md->rl, el),
                         "loading the rollout layout");
            p->md->have_layouts = err == 0; /* tl comes later; both are freed together */
        }
        if (err)
            return err;
        p->has_model = p->deferred = true;
        p->ntrainers = (uint32_t)job->trainers;
        p->nrollouts = p->md->rl.replicas * p->md->rl.gpus_per_replica;
        p->replicas = p->md->rl.replicas ? p->md->rl.replicas : 1;
        p->replica_ranks = p->nrollouts / p->replicas;
        if (job->rollouts && job->rollouts != p->nrollouts) {
            wb_errlist_add(el, "job: rollouts %llu disagree with the rollout layout (%u)",
                           (unsigned long long)job->rollouts, p->nrollouts);
            return -WB_E_CONFIG;
        }
        char text[256];
        snprintf(text, sizeof(text),
                 "job %s: the trainer layout is derived from the %u trainers' registrations; "
                 "planned once they all registered\n",
                 job->name, p->ntrainers);
        p->summary = strdup(text);
        return p->summary ? 0 : oom_at(el, n0, -ENOMEM, "starting the job");
    }
    size_t n0 = el->n;
    struct wb_model md;
    int err = oom_at(el, n0, wb_model_load(&src, &md, el), "loading the model");
    if (err)
        return err;
    err = oom_at(el, n0, plan_encode(job, p, &md, false, el), "planning the job");
    wb_model_free(&md);
    return err;
}

int ctl_plan_finish(const struct wb_job *job, struct ctl_plan *p, struct wb_trainer_layout *tl,
                    struct wb_errlist *el)
{
    struct ctl_plan q;
    memset(&q, 0, sizeof(q));
    p->md->tl = *tl; /* the model owns it from now on */
    memset(tl, 0, sizeof(*tl));
    int err = wb_layout_check(&p->md->tl, &p->md->rl, el);
    err = err ? err : plan_encode(job, &q, p->md, false, el);
    if (err) {
        ctl_plan_free(&q);
        wb_trainer_layout_free(&p->md->tl);
        return err;
    }
    q.md = p->md;
    p->md = NULL;
    ctl_plan_free(p);
    *p = q; /* deferred no more */
    return 0;
}

/* A trainer layout and inventory given by the embedding program (a checkpoint broadcast's
 * readers): the job's rules, rollout side and rollout layout, planned at once. */
static int plan_given(const struct wb_job *job, const struct wb_controller_opts *o,
                      struct ctl_plan *p, struct wb_errlist *el)
{
    struct wb_model_src src;
    ctl_model_src(job, &src);
    src.trainer_layout = src.rollout_layout = NULL;
    src.trainer_inv = NULL;
    src.trainer_mem = o->trainer_inv;
    struct wb_trainer_layout tl = *o->trainer_layout;
    memset(o->trainer_layout, 0, sizeof(*o->trainer_layout));
    size_t n0 = el->n;
    struct wb_model md;
    int err = oom_at(el, n0, wb_model_load(&src, &md, el), "loading the model");
    if (err) {
        wb_trainer_layout_free(&tl);
        return err;
    }
    md.tl = tl;
    md.have_layouts = true; /* both freed with the model from here */
    err = wb_rollout_layout_load(job->rollout_layout, &md.rl, el);
    err = err ? err : wb_layout_check(&md.tl, &md.rl, el);
    err = oom_at(el, n0, err, "loading the rollout layout");
    err =
        err ? err
            : oom_at(el, n0, plan_encode(job, p, &md, o->fit_largest_task, el), "planning the job");
    wb_model_free(&md);
    return err;
}

int ctl_plan_build(const struct wb_job *job, const struct wb_controller_opts *o,
                   struct ctl_plan *out, struct wb_errlist *el)
{
    struct ctl_plan p;
    memset(&p, 0, sizeof(p));
    size_t n0 = el->n;
    int err;
    if (!*job->model.rules) {
        err = plan_empty(job, &p);
    } else if (o && o->trainer_layout) {
        err = plan_given(job, o, &p, el);
    } else {
        err = plan_model(job, &p, el);
    }
    if (!err && job->relay != WB_RELAY_OFF && !p.has_model) {
        wb_errlist_add(el, "job: relay: %s needs a model (rollout replicas to relay between)",
                       wb_relay_shape_names[job->relay]);
        err = -WB_E_CONFIG;
    }
    if (!err && job->relay != WB_RELAY_OFF && job->relay_roots > p.replicas) {
        wb_errlist_add(el,
                       "job: relay_roots: %" PRIu64 " roots, but the rollout layout has %u "
                       "replica%s",
                       job->relay_roots, p.replicas, p.replicas == 1 ? "" : "s");
        err = -WB_E_CONFIG;
    }
    if (err) {
        ctl_plan_free(&p);
        return oom_at(el, n0, err, "starting the job");
    }
    *out = p;
    return 0;
}

void ctl_plan_free(struct ctl_plan *p)
{
    if (p->md) {
        wb_model_free(p->md);
        free(p->md);
    }
    for (uint32_t i = 0; p->table && i < p->ntrainers; i++)
        free(p->table[i].buf);
    for (uint32_t i = 0; p->shards && i < p->ntrainers; i++) /* NULL when its calloc failed */
        free(p->shards[i].buf);
    for (uint32_t i = 0; p->sums && i < p->ntrainers; i++)
        free(p->sums[i].buf);
    free(p->sums);
    for (uint32_t i = 0; p->dslab_t && i < p->ntrainers; i++)
        free(p->dslab_t[i].buf);
    free(p->dslab_t);
    for (uint32_t i = 0; p->dslab_r && i < p->nrollouts; i++)
        free(p->dslab_r[i].buf);
    free(p->dslab_r);
    for (uint32_t i = 0; p->wkeys && i < p->ntrainers; i++)
        free(p->wkeys[i]);
    free(p->wkeys);
    free(p->nwkeys);
    free(p->tpeer_of);
    free(p->writer_of);
    free(p->send_bytes);
    for (uint32_t i = 0; p->recv && i < p->nrollouts; i++)
        free(p->recv[i].buf);
    for (uint32_t i = 0; p->locals && i < p->nrollouts; i++)
        free(p->locals[i].buf);
    free(p->locals);
    for (uint32_t i = 0; i < p->nrollout_names; i++)
        free(p->rollout_names[i]);
    free(p->rollout_names);
    for (uint32_t i = 0; i < p->nignored_names; i++)
        free(p->ignored_names[i]);
    free(p->ignored_names);
    free(p->table);
    free(p->shards);
    free(p->recv);
    free(p->summary);
    memset(p, 0, sizeof(*p));
}
