/* data.c — the agent's data side: what SETUP, PEERS and TRANSFER do to memory and the transport.
 *
 * SETUP decodes this agent's part of the plan, opens the transport, allocates and registers its
 * memory and returns two blobs the controller relays: the transport address and the memory
 * descriptors (xfer.h says which regions). A trainer materializes its shards from the synthetic
 * source; a rollout allocates one buffer per local tensor — the memory peers write into.
 * A rollout registers each local tensor on its own, exactly its bytes, and keeps its window
 * closed between attempts (xfer.h). PEERS gives a trainer the agents it writes to (and only
 * the descriptors of the regions it writes), a rollout the trainers that write to it.
 * TRANSFER N begins the attempt on the transport, starts the executor (trainers, exec.c) or
 * arms the counters of the receive list, opens the windows and says "ready" to its writers
 * (rollouts); a rollout is done when every tag reached the plan's count.
 *
 * The transport moves data only while both sides poll it (software providers), so ag_data_poll()
 * runs on every turn of the agent's loop while anything may be in flight; between attempts
 * (ag_data_idle) nothing is, and the loop sleeps. A job without a model (control plane
 * only) has empty plans: nothing is opened and a transfer finishes at once. */
#include "agent/xfer.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>
#if defined(__x86_64__)
/* libxxhash's runtime dispatch: AVX2/AVX-512 where the CPU has them (the plain entry points
 * are SSE2 only, about half as fast). Same results. */
#include <xxh_x86dispatch.h>
#endif

static const char *M = "agent";

void ag_peer_clear(struct peer *p)
{
    free(p->addr);
    free(p->sec);
    free(p->reg_tensor);
    free(p->reg);
    memset(p, 0, sizeof(*p));
}

static void prefill(struct data *d, uint64_t version);

static void data_release(struct data *d)
{
    ag_trace_free(d->trace); /* a file being written reads the labels freed below */
    d->trace = NULL;
    ag_fill_free(d->fill); /* waits for a fill under way, before the memory it writes goes */
    d->fill = NULL;
    ag_io_close(d->io); /* reads in flight write into TMP: they end first */
    d->io = NULL;
    wb_tx_close(d->tx); /* releases every registration */
    d->tx = NULL;
    ag_delta_free(d);
    enum wb_tx_mem k = ag_mem_kind(d);
    ag_rollout_free(d);
    ag_host_free(d->stage);
    wb_tx_mem_free(k, d->sums.sum_out);
    free(d->sums.slot);
    free(d->sums.whash);
    free(d->resume.wskip);
    free(d->resume.tskip);
    free(d->resume.task_bytes);
    free(d->rready);
    free(d->rrelay);
    free(d->rout);
    if (d->param != d->param_host_buf)
        wb_tx_mem_free(k, d->param);
    ag_host_free(d->param_host_buf);
    wb_tx_mem_free(k, d->tmp);
    wb_tx_mem_free(k, d->mx.inbox);
    wb_tx_mem_free(k, d->mx.amax_in);
    wb_tx_mem_free(k, d->mx.amax_out);
    wb_tx_mem_free(k, d->scratch[0]);
    wb_tx_mem_free(k, d->scratch[1]);
    free(d->hscratch);
    for (uint32_t i = 0; d->tpeer && i < d->table.ntrainers; i++)
        ag_peer_clear(&d->tpeer[i]);
    for (uint32_t i = 0; d->rpeer && i < d->table.nrollouts; i++)
        ag_peer_clear(&d->rpeer[i]);
    free(d->tpeer);
    free(d->rpeer);
    if (d->have_table)
        ag_exec_free(d);
    free(d->shards);
    free(d->shard_of);
    if (d->have_table)
        wb_route_table_free(&d->table);
    free(d->seg_mr); /* the registrations went with the transport */
    wb_mpw_free(&d->addr_blob);
    wb_mpw_free(&d->region_blob);
    ag_stream_destroy(d->stream);
    ag_stream_destroy(d->h2d_stream);
    ag_stream_destroy(d->sum_stream);
}

/* ---------------------------------------------------------------- transport */

/* Opens the transport: the job's provider, this agent's domain and device, and whatever more
 * --tx-extra sets (a YAML mapping of wb_tx_cfg keys). */
static int tx_open(struct data *d, char *err, size_t errcap)
{
    const char *prov = d->job.provider[0] ? d->job.provider : "tcp";
    struct wb_errlist el;
    struct wb_yaml *y = NULL;
    struct wb_tx_cfg cfg;
    memset(&cfg, 0, sizeof(cfg));
    wb_errlist_init(&el);
    int rc = d->o->tx_extra ? wb_yaml_load_string("--tx-extra", d->o->tx_extra, &el, &y) : 0;
    rc = rc ? rc : wb_cfg_parse(y, y ? wb_yaml_root(y) : NULL, wb_tx_cfg_fields, &cfg, &el);
    rc = rc ? rc : wb_tx_cfg_provider(&cfg, prov);
    if (!rc && d->o->tx_domain) {
        char *dom = strdup(d->o->tx_domain);
        rc = dom ? 0 : -ENOMEM;
        if (dom) {
            free(cfg.domain);
            cfg.domain = dom;
        }
    }
    cfg.device = d->device;
    rc = rc ? rc : wb_tx_open(&cfg, &el, &d->tx);
    if (rc) {
        char *msg = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&msg, &len);
        if (f) {
            wb_errlist_print(&el, "", f);
            fclose(f);
        }
        snprintf(err, errcap, "transport %s: %s", prov, msg && *msg ? msg : wb_strerror(rc));
        for (char *p = err; *p; p++)
            if (*p == '\n')
                *p = *(p + 1) ? ';' : 0;
        free(msg);
    } else {
        wb_tx_query(d->tx, &d->caps);
    }
    wb_cfg_free(wb_tx_cfg_fields, &cfg);
    wb_yaml_free(y);
    wb_errlist_free(&el);
    return rc;
}

static void put_rdesc(struct data *d, struct wb_mpw *w, const struct wb_tx_mr *mr)
{
    struct wb_tx_rdesc rd;
    if (!mr || wb_tx_rdesc(d->tx, mr, &rd)) {
        wb_mpw_nil(w);
        return;
    }
    wb_tx_rdesc_put(w, &rd);
}

/* ---------------------------------------------------------------- trainer setup */

/* Synthetic source: every shard in one arena of the executor's memory kind, registered once. */
static int param_arena(struct data *d, char *err, size_t errcap)
{
    uint64_t pb = d->param_bytes ? d->param_bytes : 256;
    int rc = 0;
    if (d->gpu && !d->param_host) { /* parameters in GPU memory, written from in place */
        rc = ag_reg_alloc(d, pb, WB_TX_ACCESS_SRC, &d->param, &d->param_mr, "parameters", err,
                          errcap);
    } else if ((rc = ag_host_alloc(pb, &d->param_host_buf)) == 0 && !d->gpu) {
        d->param = d->param_host_buf; /* host memory throughout: a write source */
        if ((rc = wb_tx_mr_reg(d->tx, d->param, pb, WB_TX_ACCESS_SRC, &d->param_mr)) != 0)
            snprintf(err, errcap, "parameters: cannot register %" PRIu64 " bytes: %s", pb,
                     wb_tx_errmsg(d->tx));
    } /* else GPU with host-resident parameters: only H2D ops read them */
    if (rc)
        return rc;
    uint8_t *base = d->param_host ? d->param_host_buf : d->param;
    for (uint32_t i = 0; i < d->nshards; i++) {
        d->shards[i].ptr = base + d->shards[i].off;
        d->shards[i].mr = d->param_host && d->gpu ? NULL : d->param_mr;
        d->shards[i].mr_off = d->shards[i].off;
    }
    return 0;
}

/* Registers segment k of the endpoint's allocations (once per setup). */
static int seg_reg(struct data *d, int k, unsigned access, char *err, size_t errcap)
{
    const struct seg *g = ag_seg_get(d->ep, (uint32_t)k);
    if (!d->seg_mr && !(d->seg_mr = calloc(ag_segs_count(d->ep), sizeof(*d->seg_mr))))
        return -ENOMEM;
    if (d->seg_mr[k])
        return 0;
    int rc = wb_tx_mr_reg(d->tx, (void *)g->base, g->len, access, &d->seg_mr[k]);
    if (rc)
        snprintf(err, errcap, "%s memory at %#" PRIxPTR " (%" PRIu64 " bytes): cannot register: %s",
                 g->device ? "GPU" : "host", g->base, g->len, wb_tx_errmsg(d->tx));
    return rc;
}

/* A registering endpoint: each shard the plan gives this rank is the process's own tensor of
 * that name (the controller checked the registration; checked again here, it costs nothing).
 * Shards are written from where they are, through their allocation's registration. */
static int param_bind(struct data *d, char *err, size_t errcap)
{
    if (d->source && !d->param_host) {
        snprintf(err, errcap,
                 "this trainer reads its tensors from a source, but the layout keeps parameters "
                 "in GPU memory (residence: gpu); a sourced trainer needs residence: host");
        return -EINVAL;
    }
    for (uint32_t i = 0; i < d->nshards; i++) {
        struct shard *s = &d->shards[i];
        const struct reg *r = ag_regs_find(d->ep, s->meta.name);
        if (!r || r->t.meta.dtype != s->meta.dtype ||
            !wb_shape_eq(&r->t.meta.shape, &s->meta.shape) ||
            !wb_box_eq(&r->t.meta.box, &s->meta.box) || !wb_reg_contiguous(&r->t)) {
            snprintf(err, errcap, "%s: the plan's shard differs from the registered tensor",
                     s->meta.name);
            return -EINVAL;
        }
        if (d->source) { /* read by H2D ops through the source, nothing in memory */
            s->src_index = (int32_t)ag_regs_index_of(d->ep, r);
            continue;
        }
        if (d->param_host && r->device) {
            snprintf(err, errcap,
                     "%s: the layout keeps parameters in host memory (residence: "
                     "host), but this tensor is in GPU memory",
                     s->meta.name);
            return -EINVAL;
        }
        s->ptr = r->ptr;
        if (!s->bytes || (d->param_host && d->gpu))
            continue; /* nothing to write, or read only by H2D ops */
        int k = ag_seg_of(d->ep, s->ptr, s->bytes);
        int rc = k < 0 ? -EINVAL : seg_reg(d, k, WB_TX_ACCESS_SRC, err, errcap);
        if (k < 0)
            snprintf(err, errcap, "%s: no registered allocation holds it", s->meta.name);
        if (rc)
            return rc;
        s->mr = d->seg_mr[k];
        s->mr_off = (uintptr_t)s->ptr - ag_seg_get(d->ep, (uint32_t)k)->base;
    }
    return 0;
}

/* Checksums at a trainer: per table write its slot in its rollout's inbox (SETUP.sums), and
 * the outbox its records are written from. */
static int sums_trainer(struct data *d, const struct wb_bytes *sums, char *err, size_t errcap)
{
    uint32_t nw = d->table.nwrites;
    if (sums->n != (size_t)nw * 4) {
        snprintf(err, errcap, "setup: %zu bytes of checksum slots for %u writes", sums->n, nw);
        return -EBADMSG;
    }
    d->sums.slot = malloc((nw ? nw : 1) * sizeof(uint32_t));
    d->sums.whash = calloc(nw ? nw : 1, sizeof(uint64_t));
    if (!d->sums.slot || !d->sums.whash)
        return -ENOMEM;
    const uint8_t *p = sums->p;
    for (uint32_t i = 0; i < nw; i++)
        d->sums.slot[i] = (uint32_t)p[4 * i] | (uint32_t)p[4 * i + 1] << 8 |
                          (uint32_t)p[4 * i + 2] << 16 | (uint32_t)p[4 * i + 3] << 24;
    return ag_reg_alloc(d, (uint64_t)(nw ? nw : 1) * WB_SUM_RECORD, WB_TX_ACCESS_SRC,
                        &d->sums.sum_out, &d->sums.sum_out_mr, "checksum outbox", err, errcap);
}

static int setup_trainer(struct data *d, const void *plan, size_t plan_len, const void *shards,
                         size_t shards_len, const struct wb_body_setup *b, char *err, size_t errcap)
{
    int rc = wb_route_table_decode(plan, plan_len, &d->table);
    if (rc) {
        snprintf(err, errcap, "routing table: %s", wb_strerror(rc));
        return rc;
    }
    d->have_table = true;
    struct wb_route_table *t = &d->table;
    struct wb_mpr r;
    uint32_t n;
    wb_mpr_init(&r, shards, shards_len);
    if (wb_mpr_array(&r, WB_WIRE_MAX_ARRAY, &n)) {
        snprintf(err, errcap, "shard list: malformed");
        return -EBADMSG;
    }
    d->shards = calloc(n ? n : 1, sizeof(*d->shards));
    if (!d->shards)
        return -ENOMEM;
    for (uint32_t i = 0; i < n; i++) {
        struct shard *s = &d->shards[i];
        uint32_t two = 0;
        uint64_t tn = 0;
        if (wb_mpr_array(&r, 2, &two) || two != 2 || wb_mpr_u64(&r, &tn) || tn > UINT32_MAX ||
            wb_wire_get_tensor_meta(&r, &s->meta)) {
            snprintf(err, errcap, "shard list: malformed entry %u", i);
            return -EBADMSG;
        }
        s->tensor = (uint32_t)tn;
        s->src_index = -1;
        s->bytes = wb_box_numel(&s->meta.box) * wb_dtype_size(s->meta.dtype);
        s->off = d->param_bytes;
        d->param_bytes += (s->bytes + 255) / 256 * 256;
        if (s->tensor + 1 > d->ntensors)
            d->ntensors = s->tensor + 1;
        d->nshards = i + 1;
    }
    if (wb_mpr_end(&r))
        return -EBADMSG;
    d->shard_of = calloc(d->ntensors ? d->ntensors : 1, sizeof(uint32_t));
    if (!d->shard_of)
        return -ENOMEM;
    for (uint32_t i = 0; i < d->nshards; i++)
        d->shard_of[d->shards[i].tensor] = i + 1;
    d->tpeer = calloc(t->ntrainers ? t->ntrainers : 1, sizeof(*d->tpeer));
    d->rpeer = calloc(t->nrollouts ? t->nrollouts : 1, sizeof(*d->rpeer));
    d->rready = malloc(t->nrollouts ? t->nrollouts : 1);
    d->rout = calloc(t->nrollouts ? t->nrollouts : 1, 1);
    if (!d->tpeer || !d->rpeer || !d->rready || !d->rout)
        return -ENOMEM;
    memset(d->rready, 2, t->nrollouts); /* 2: never written by this table */
    for (uint32_t k = 0; k < t->nwrites; k++)
        if (t->writes[k].dst_rank < t->nrollouts)
            d->rready[t->writes[k].dst_rank] = 0;
    if ((rc = ag_exec_setup(d, err, errcap)) != 0)
        return rc;

    /* memory: parameters, TMP arena, inboxes, outbox, scratch */
    d->param_host = t->residence == WB_RESIDE_HOST;
    rc = d->synthetic ? param_arena(d, err, errcap) : param_bind(d, err, errcap);
    if (rc)
        return rc;
    rc = ag_reg_alloc(d, d->tmp_size ? d->tmp_size : 256, WB_TX_ACCESS_SRC, &d->tmp, &d->tmp_mr,
                      "temporary memory", err, errcap);
    if (!rc && d->mx.inbox_bytes)
        rc = ag_reg_alloc(d, d->mx.inbox_bytes, WB_TX_ACCESS_DST, &d->mx.inbox, &d->mx.inbox_mr,
                          "gather inbox", err, errcap);
    if (!rc && d->mx.amax_in_bytes)
        rc = ag_reg_alloc(d, d->mx.amax_in_bytes, WB_TX_ACCESS_DST, &d->mx.amax_in,
                          &d->mx.amax_in_mr, "amax inbox", err, errcap);
    if (!rc && d->mx.amax_out_bytes)
        rc = ag_reg_alloc(d, d->mx.amax_out_bytes, WB_TX_ACCESS_SRC, &d->mx.amax_out,
                          &d->mx.amax_out_mr, "amax outbox", err, errcap);
    for (int k = 0; !rc && k < 2; k++)
        rc = ag_reg_alloc(d, d->scratch_bytes, 0, &d->scratch[k], NULL, "scratch", err, errcap);
    if (!rc && d->verify)
        rc = sums_trainer(d, &b->sums, err, errcap);
    if (!rc)
        rc = ag_delta_trainer_setup(d, err, errcap);
    d->resume.task_bytes = calloc(t->ntasks ? t->ntasks : 1, sizeof(uint64_t));
    d->resume.tskip = calloc(t->ntasks ? t->ntasks : 1, 1);
    d->resume.wskip = calloc(t->nwrites ? t->nwrites : 1, 1);
    if (!rc && (!d->resume.task_bytes || !d->resume.tskip || !d->resume.wskip))
        rc = -ENOMEM;
    /* a sourced GPU endpoint reads into pinned host memory, then copies to the GPU */
    if (!rc && d->gpu && d->source &&
        (rc = ag_host_alloc(d->tmp_size ? d->tmp_size : 256, (void **)&d->stage)) != 0)
        snprintf(err, errcap, "staging memory: cannot allocate %" PRIu64 " pinned bytes: %s",
                 d->tmp_size, wb_strerror(rc));
    if (!rc && d->source && (rc = ag_io_open(d->source, &d->io)) != 0)
        snprintf(err, errcap, "I/O threads: %s", wb_strerror(rc));
    if (rc)
        return rc;
    d->hscratch = calloc(1, d->scratch_bytes);
    if (!d->hscratch)
        return -ENOMEM;

    /* regions: [gather inbox, amax inbox, [[mesh, off, tag], ...]] */
    struct wb_mpw *w = &d->region_blob;
    wb_mpw_array(w, 3);
    put_rdesc(d, w, d->mx.inbox_mr);
    put_rdesc(d, w, d->mx.amax_in_mr);
    wb_mpw_array(w, d->mx.nsec);
    for (uint32_t i = 0; i < d->mx.nsec; i++) {
        wb_mpw_array(w, 3);
        wb_mpw_u64(w, d->mx.sec[i].mesh);
        wb_mpw_u64(w, d->mx.sec[i].off);
        wb_mpw_u64(w, d->mx.sec[i].tag);
    }
    return wb_mpw_finish(w);
}

/* ---------------------------------------------------------------- rollout setup */

int ag_data_setup(struct data **dp, struct wb_endpoint *ep, const struct wb_body_setup *b,
                  uint64_t next_version, struct data_setup_out *out, char *err, size_t errcap)
{
    const struct wb_endpoint_opts *o = &ep->o;
    const void *plan = b->plan.p, *shards = b->shards.p;
    *out = (struct data_setup_out){0};
    size_t plan_len = b->plan.n, shards_len = b->shards.n;
    /* The old setup goes first: its transport holds the registrations of the endpoint's
     * allocations, which the new one registers again (and its memory is freed before more is
     * allocated). What a rollout carries over (its tensors, what landed) is taken first. */
    struct rollout_carry carry;
    struct data *old = *dp;
    bool resetup = old != NULL;
    ag_rollout_carry_out(old, &carry);
    ag_data_free(*dp);
    *dp = NULL;
    struct data *d = calloc(1, sizeof(*d));
    if (!d) {
        ag_rollout_carry_end(NULL, -ENOMEM, false, &carry, &out->lost);
        return -ENOMEM;
    }
    d->role = o->role;
    d->rank = o->rank;
    d->ep = ep;
    d->source = ag_regs_source(ep);
    d->o = o;
    d->synthetic = o->synthetic;
    d->job = ep->job;
    d->device = o->device;
    d->empty = plan_len == 0;
    d->verify = b->verify;
    uint64_t t0 = wb_now_ns();
    /* traces: the endpoint's own directory, else the job's (no memory for one: none) */
    if (!d->empty)
        ag_trace_new(o->trace && *o->trace ? o->trace : d->job.trace, d->job.trace_keep,
                     d->job.name, d->role, d->rank, &d->trace);
    wb_mpw_init(&d->addr_blob);
    wb_mpw_init(&d->region_blob);
    int rc = ag_delta_setup(d, b, err, errcap);
    if (!rc && !d->empty && o->device >= 0) {
        rc = ag_gpu_use(o->device);
        rc = rc ? rc : ag_stream_create(&d->stream);
        rc = rc ? rc : ag_stream_create(&d->h2d_stream);
        if (b->verify)
            rc = rc ? rc : ag_stream_create(&d->sum_stream);
        if (rc)
            snprintf(err, errcap, "GPU %d: %s", o->device, wb_strerror(rc));
        d->gpu = rc == 0;
    }
    if (!rc && !d->empty)
        rc = tx_open(d, err, errcap);
    if (!rc && d->tx) /* nothing counts before the first attempt begins */
        wb_tx_attempt_end(d->tx);
    if (!rc && !d->empty && o->role == WB_ROLE_TRAINER)
        rc = setup_trainer(d, plan, plan_len, shards, shards_len, b, err, errcap);
    if (!rc && !d->empty && o->role == WB_ROLE_TRAINER)
        ag_trace_trainer_setup(d);
    if (!rc && !d->empty && o->role == WB_ROLE_TRAINER && d->synthetic) {
        struct ag_fill_src fs = {d->shards, d->nshards, d->job.seed,         d->param_host_buf,
                                 d->stream, d->device,  d->job.change_period};
        rc = ag_fill_new(&fs, &d->fill);
    }
    if (!rc && !d->empty && o->role == WB_ROLE_ROLLOUT)
        rc = ag_rollout_setup(d, plan, plan_len, &b->locals, &carry, err, errcap);
    ag_rollout_carry_end(d, rc, resetup, &carry, &out->lost);
    if (!rc && d->tx) {
        rc = wb_tx_addr(d->tx, &d->addr_blob);
        rc = rc ? rc : wb_mpw_finish(&d->addr_blob);
    }
    if (rc) {
        if (!*err)
            snprintf(err, errcap, "setup: %s", wb_strerror(rc));
        data_release(d);
        free(d);
        return rc;
    }
    if (d->role == WB_ROLE_TRAINER && !d->empty)
        wb_log(WB_LOG_INFO, M,
               "trainer rank %u: %u tasks, %u writes, %u shards (%" PRIu64
               " bytes), memory cap %" PRIu64 ", gather inbox %" PRIu64
               ", %s on %s, set up in %.0f ms",
               d->rank, d->table.ntasks, d->table.nwrites, d->nshards, d->param_bytes, d->cap,
               d->mx.inbox_bytes, d->caps.name, d->gpu ? "GPU" : "host memory",
               (double)(wb_now_ns() - t0) / 1e6);
    else if (!d->empty) {
        uint32_t nlocal;
        uint64_t bytes;
        ag_rollout_size(d, &nlocal, &bytes);
        wb_log(WB_LOG_INFO, M,
               "rollout rank %u: %u local tensors (%" PRIu64 " bytes), %s on %s, set up in %.0f ms",
               d->rank, nlocal, bytes, d->caps.name, d->gpu ? "GPU" : "host memory",
               (double)(wb_now_ns() - t0) / 1e6);
    }
    prefill(d, next_version); /* the first transfer's values, while peers connect */
    *dp = d;
    out->addr = d->addr_blob.len ? d->addr_blob.buf : NULL;
    out->addr_len = d->addr_blob.len;
    out->regions = d->region_blob.len ? d->region_blob.buf : NULL;
    out->regions_len = d->region_blob.len;
    return 0;
}

/* ---------------------------------------------------------------- peers */

static int parse_trainer_regions(struct peer *p, struct wb_mpr *r)
{
    uint32_t three, n;
    if (wb_mpr_array(r, 3, &three) || three != 3)
        return -EBADMSG;
    p->has_inbox = !wb_mpr_nil(r) && wb_tx_rdesc_get(r, &p->inbox) == 0;
    p->has_amax = !wb_mpr_nil(r) && wb_tx_rdesc_get(r, &p->amaxbox) == 0;
    if (wb_mpr_array(r, 1u << 20, &n))
        return -EBADMSG;
    p->sec = calloc(n ? n : 1, sizeof(*p->sec));
    if (!p->sec)
        return -ENOMEM;
    for (uint32_t i = 0; i < n; i++) {
        uint64_t mesh, off, tag;
        if (wb_mpr_array(r, 3, &three) || three != 3 || wb_mpr_u64(r, &mesh) ||
            wb_mpr_u64(r, &off) || wb_mpr_u64(r, &tag))
            return -EBADMSG;
        p->sec[i] = (struct gsec){(uint32_t)mesh, off, (uint32_t)tag};
    }
    p->nsec = n;
    return r->err;
}

int ag_peer_rollout_regions(struct peer *p, struct wb_mpr *r, uint32_t rank)
{
    uint32_t n, two;
    if (wb_mpr_array(r, 1u << 24, &n))
        return -EBADMSG;
    p->reg_tensor = calloc(n ? n : 1, sizeof(uint32_t));
    p->reg = calloc(n ? n : 1, sizeof(*p->reg));
    if (!p->reg_tensor || !p->reg)
        return -ENOMEM;
    uint32_t k = 0;
    for (uint32_t i = 0; i < n; i++) {
        uint64_t tn;
        if (wb_mpr_array(r, 2, &two) || two != 2 || wb_mpr_u64(r, &tn))
            return -EBADMSG;
        if (tn == SUM_INBOX_ENTRY) {
            if (wb_tx_rdesc_get(r, &p->sums))
                return -EBADMSG;
            p->has_sums = true;
            continue;
        }
        if (tn == DELTA_SLAB_ENTRY + rank) { /* ours; the controller hands out no other */
            if (wb_tx_rdesc_get(r, &p->delta))
                return -EBADMSG;
            p->has_delta = true;
            continue;
        }
        if (wb_tx_rdesc_get(r, &p->reg[k]))
            return -EBADMSG;
        p->reg_tensor[k++] = (uint32_t)tn;
    }
    p->nreg = k;
    return r->err;
}

int ag_data_peers(struct data *d, const void *peers, size_t len, char *err, size_t errcap)
{
    if (d->empty)
        return 0;
    struct wb_mpr r;
    uint32_t n;
    wb_mpr_init(&r, peers, len);
    if (wb_mpr_array(&r, WB_RANKS_MAX * 2, &n)) {
        snprintf(err, errcap, "peer list: malformed");
        return -EBADMSG;
    }
    if (d->role == WB_ROLE_ROLLOUT)
        return ag_rollout_peers(d, &r, n, err, errcap);
    ag_direct_release(d); /* lowered again against these peers at the next transfer */
    for (uint32_t i = 0; i < n; i++) {
        uint32_t four;
        uint64_t role, rank;
        const void *addr, *reg;
        size_t alen, rlen;
        if (wb_mpr_array(&r, 4, &four) || four != 4 || wb_mpr_u64(&r, &role) ||
            wb_mpr_u64(&r, &rank) || wb_mpr_bin(&r, &addr, &alen, 1u << 20) ||
            wb_mpr_bin(&r, &reg, &rlen, 1u << 30)) {
            snprintf(err, errcap, "peer list: malformed entry %u", i);
            return -EBADMSG;
        }
        bool tr = role == WB_ROLE_TRAINER;
        if (tr && rank == d->rank)
            continue;
        uint32_t max = tr ? d->table.ntrainers : d->table.nrollouts;
        if (rank >= max || !alen)
            continue;
        struct peer *p = tr ? &d->tpeer[rank] : &d->rpeer[rank];
        if (p->present && p->addr_len == alen && !memcmp(p->addr, addr, alen))
            continue; /* the same process as before */
        ag_peer_clear(p);
        struct wb_mpr ar;
        wb_mpr_init(&ar, addr, alen);
        int rc = wb_tx_peer_add(d->tx, &ar, &p->idx);
        if (rc) {
            snprintf(err, errcap, "%s rank %" PRIu64 ": transport address: %s",
                     wb_role_name((enum wb_role)role), rank, wb_tx_errmsg(d->tx));
            return rc;
        }
        struct wb_mpr rr;
        wb_mpr_init(&rr, reg, rlen);
        rc = tr ? parse_trainer_regions(p, &rr) : ag_peer_rollout_regions(p, &rr, d->rank);
        if (rc) {
            snprintf(err, errcap, "%s rank %" PRIu64 ": memory descriptors: %s",
                     wb_role_name((enum wb_role)role), rank, wb_strerror(rc));
            ag_peer_clear(p);
            return rc;
        }
        p->addr = malloc(alen);
        if (!p->addr) {
            snprintf(err, errcap, "%s rank %" PRIu64 ": transport address: out of memory",
                     wb_role_name((enum wb_role)role), rank);
            ag_peer_clear(p);
            return -ENOMEM;
        }
        memcpy(p->addr, addr, alen);
        p->addr_len = alen;
        p->present = true;
        /* Warm-up: a note nothing counts makes the provider connect now (tcp;ofi_rxm connects
         * on first use), so the first transfer does not pay for it; its completion is not
         * counted toward any transfer. */
        if (wb_tx_connect(d->tx, p->idx, (void *)(uintptr_t)WARMUP_CTX) == 0)
            d->outstanding++;
    }
    /* The direct path, lowered against these peers now, so no transfer pays for it (opening a
     * rollout's allocations by IPC handle takes a while). A failure leaves every task on the
     * general pipeline. */
    int rc = ag_direct_prepare(d);
    if (rc)
        wb_log(WB_LOG_WARN, M, "trainer rank %u: direct path: %s; every task takes the pipeline",
               d->rank, d->fail[0] ? d->fail : wb_strerror(rc));
    return 0;
}

/* ---------------------------------------------------------------- transfers */

/* Starts the next version's fill once nothing else runs (synthetic trainers). */
static void prefill(struct data *d, uint64_t version)
{
    char err[256] = "";
    if (!d->fill || !d->nshards || ag_fill_want(d->fill) || ag_fill_have(d->fill) == version)
        return;
    if (ag_fill_begin(d->fill, version, err, sizeof(err)))
        wb_log(WB_LOG_WARN, M, "trainer rank %u: version %" PRIu64 ": %s", d->rank, version, err);
}

/* The transfer's executor starts: the shards hold this version (a registering trainer's hold
 * what its process put there). */
static int trainer_begin(struct data *d)
{
    d->start_ns = wb_now_ns();
    return ag_exec_start(d);
}

/* A trainer's transfer starts once the last attempt's writes drained and, synthetic, once this
 * version's values are in place: 1 started, 0 not yet, negative on failure (d->fail says). */
static int trainer_try_begin(struct data *d)
{
    if (d->outstanding || (d->io && ag_io_busy(d->io)))
        return 0; /* writes or reads of an aborted attempt still in flight: drain first */
    if (d->fill) {
        char err[256] = "";
        int rc = ag_fill_poll(d->fill, err, sizeof(err));
        if (rc < 0) {
            snprintf(d->fail, sizeof(d->fail), "%s", err);
            return rc;
        }
        if (rc == 0)
            return 0; /* a fill is under way (this version's or a guess that missed) */
        uint64_t have = ag_fill_have(d->fill);
        if (have != d->version) {
            if (have)
                wb_log(WB_LOG_INFO, M,
                       "trainer rank %u: version %" PRIu64 " asked, %" PRIu64
                       " prepared: generating it",
                       d->rank, d->version, have);
            if ((rc = ag_fill_begin(d->fill, d->version, err, sizeof(err))) != 0) {
                snprintf(d->fail, sizeof(d->fail), "%s", err);
                return rc;
            }
            return 0;
        }
    }
    d->pending_start = false;
    int rc = trainer_begin(d);
    return rc ? rc : 1;
}

/* TRANSFER.skip: per rollout rank, the data tags not sent again in this attempt. tags[g]
 * sorted (malloc'd, NULL when none). Absent or empty: nothing skipped. */
struct skipset {
    uint32_t n;
    uint64_t **tags;
    uint32_t *cnt;
};

static void skip_free(struct skipset *ss)
{
    for (uint32_t g = 0; ss->tags && g < ss->n; g++)
        free(ss->tags[g]);
    free(ss->tags);
    free(ss->cnt);
    memset(ss, 0, sizeof(*ss));
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static int skip_parse(const struct wb_bytes *b, uint32_t nranks, struct skipset *ss)
{
    memset(ss, 0, sizeof(*ss));
    struct wb_mpr r;
    uint32_t n;
    wb_mpr_init(&r, b->p, b->n);
    if (!b->n || wb_mpr_nil(&r))
        return 0;
    if (wb_mpr_array(&r, nranks, &n))
        return -EBADMSG;
    ss->n = n;
    ss->tags = calloc(n ? n : 1, sizeof(uint64_t *));
    ss->cnt = calloc(n ? n : 1, sizeof(uint32_t));
    if (!ss->tags || !ss->cnt)
        return -ENOMEM;
    for (uint32_t g = 0; g < n; g++) {
        uint32_t k;
        if (wb_mpr_array(&r, WB_WIRE_MAX_ARRAY, &k))
            return -EBADMSG;
        ss->tags[g] = malloc((k ? k : 1) * sizeof(uint64_t));
        if (!ss->tags[g])
            return -ENOMEM;
        for (uint32_t i = 0; i < k; i++)
            if (wb_mpr_u64(&r, &ss->tags[g][i]))
                return -EBADMSG;
        ss->cnt[g] = k;
        qsort(ss->tags[g], k, sizeof(uint64_t), cmp_u64);
    }
    return 0;
}

static bool skip_has(const struct skipset *ss, uint32_t g, uint64_t tag)
{
    if (g >= ss->n || !ss->cnt[g])
        return false;
    return bsearch(&tag, ss->tags[g], ss->cnt[g], sizeof(uint64_t), cmp_u64) != NULL;
}

int ag_relay_parse(const struct wb_bytes *b, uint32_t *replicas, uint32_t *per, uint32_t **parent)
{
    struct wb_mpr r;
    uint32_t two, n;
    uint64_t pr;
    *replicas = *per = 0;
    *parent = NULL;
    wb_mpr_init(&r, b->p, b->n);
    if (!b->n || wb_mpr_nil(&r))
        return 0;
    if (wb_mpr_array(&r, 2, &two) || two != 2 || wb_mpr_u64(&r, &pr) || pr == 0 ||
        pr > WB_RANKS_MAX || wb_mpr_array(&r, WB_RANKS_MAX, &n))
        return -EBADMSG;
    uint32_t *par = malloc((n ? n : 1) * sizeof(uint32_t));
    if (!par)
        return -ENOMEM;
    for (uint32_t i = 0; i < n; i++)
        par[i] = UINT32_MAX;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t k;
        if (wb_mpr_array(&r, n, &k))
            goto bad;
        for (uint32_t j = 0; j < k; j++) {
            uint64_t c;
            /* a child of one parent, never itself, never a parent's parent: the forest */
            if (wb_mpr_u64(&r, &c) || c >= n || c == i || par[c] != UINT32_MAX)
                goto bad;
            par[c] = i;
        }
    }
    for (uint32_t i = 0; i < n; i++) { /* no cycle: every replica reaches a root */
        uint32_t at = i, hops = 0;
        while (par[at] != UINT32_MAX && hops++ <= n)
            at = par[at];
        if (hops > n)
            goto bad;
    }
    if (r.err)
        goto bad;
    *replicas = n;
    *per = (uint32_t)pr;
    *parent = par;
    return 0;
bad:
    free(par);
    return -EBADMSG;
}

/* The attempt's writes not sent: what landed earlier (TRANSFER.skip) and, relayed, every write
 * to a replica that another replica writes (TRANSFER.relay). */
static int trainer_skip(struct data *d, const struct skipset *ss, const struct wb_bytes *relay)
{
    const struct wb_route_table *t = &d->table;
    uint32_t replicas, per, *parent;
    int rc = ag_relay_parse(relay, &replicas, &per, &parent);
    if (rc) {
        snprintf(d->fail, sizeof(d->fail), "transfer: malformed relay forest");
        return rc;
    }
    if (replicas && !d->rrelay && !(d->rrelay = calloc(t->nrollouts ? t->nrollouts : 1, 1))) {
        free(parent);
        return -ENOMEM;
    }
    if (replicas && !d->no_direct) { /* every write goes through the skips from now on */
        d->no_direct = true;
        ag_direct_release(d);
    }
    for (uint32_t g = 0; d->rrelay && g < t->nrollouts; g++)
        d->rrelay[g] = replicas && g / per < replicas && parent[g / per] != UINT32_MAX;
    d->relaying = replicas > 0;
    for (uint32_t k = 0; k < t->nwrites; k++)
        d->resume.wskip[k] = skip_has(ss, t->writes[k].dst_rank, t->writes[k].tag) ||
                             (d->rrelay && d->rrelay[t->writes[k].dst_rank]);
    free(parent);
    return 0;
}

/* The replica indices of a msgpack array (TRANSFER.members, DROP.replicas), each rank of them
 * set to `mark` in rout (nrollouts entries, replica_ranks ranks per replica); with `invert`,
 * every rank of the other replicas instead. Nothing or an empty array with invert: nothing
 * marked (every replica is a member). -EBADMSG for a malformed list. */
static int replicas_mark(const struct wb_bytes *b, uint64_t replica_ranks, uint32_t nrollouts,
                         bool invert, uint8_t mark, uint8_t *rout)
{
    struct wb_mpr r;
    uint32_t n = 0;
    wb_mpr_init(&r, b->p, b->n);
    if (!b->n || wb_mpr_nil(&r))
        return 0;
    if (wb_mpr_array(&r, WB_RANKS_MAX, &n))
        return -EBADMSG;
    if (!n)
        return 0;
    if (!replica_ranks)
        return -EBADMSG;
    uint8_t *in = calloc(nrollouts ? nrollouts : 1, 1);
    if (!in)
        return -ENOMEM;
    for (uint32_t i = 0; i < n; i++) {
        uint64_t k;
        if (wb_mpr_u64(&r, &k)) {
            free(in);
            return -EBADMSG;
        }
        for (uint64_t g = k * replica_ranks; g < (k + 1) * replica_ranks && g < nrollouts; g++)
            in[g] = 1;
    }
    for (uint32_t g = 0; g < nrollouts; g++)
        if (in[g] != invert)
            rout[g] = mark;
    free(in);
    return 0;
}

void ag_data_drop(struct data *d, const struct wb_body_drop *b)
{
    if (d->role != WB_ROLE_TRAINER || d->empty || !d->active || b->version != d->version ||
        b->epoch != d->epoch)
        return;
    uint32_t nr = d->table.nrollouts;
    uint8_t *mark = calloc(nr ? nr : 1, 1);
    if (!mark)
        return; /* the attempt goes on writing to them: their failures then fail it */
    if (replicas_mark(&b->replicas, b->replica_ranks, nr, false, 1, mark)) {
        wb_log(WB_LOG_ERROR, M, "trainer rank %u: DROP: malformed list of replicas", d->rank);
        free(mark);
        return;
    }
    uint32_t n = 0;
    for (uint32_t g = 0; g < nr; g++)
        if (mark[g] && d->rout[g] != ROUT_OUT) {
            ag_exec_rank_out(d, g, ROUT_OUT);
            n++;
        }
    free(mark);
    wb_log(WB_LOG_INFO, M,
           "trainer rank %u: transfer %" PRIu64 ": %u rollout rank%s dropped, nothing more "
           "written to them",
           d->rank, d->version, n, n == 1 ? "" : "s");
}

/* What this side may count in one attempt: every counter it arms, and the notes behind them
 * (the transport's bounds for the attempt; a little slack for nothing). */
static void attempt_bounds(const struct data *d, uint64_t *tags, uint64_t *notes)
{
    uint64_t t = 16, n = 16;
    if (d->role == WB_ROLE_ROLLOUT) {
        ag_rollout_bounds(d, &t, &n);
    } else {
        const struct wb_route_table *tb = &d->table;
        t += tb->namax + tb->nphases + tb->nrollouts + tb->nops;
        for (uint32_t i = 0; i < tb->namax; i++)
            n += tb->amax[i].writes;
        for (uint32_t i = 0; i < tb->nops; i++)
            if (tb->ops[i].kind == WB_OP_GATHER)
                n += tb->ops[i].gather.npeers;
        n += (uint64_t)tb->nphases * tb->ntrainers + tb->nrollouts;
    }
    *tags = t;
    *notes = n;
}

int ag_data_start(struct data *d, const struct wb_body_version_epoch *b, char *err, size_t errcap)
{
    uint64_t version = b->version, epoch = b->epoch;
    if (!epoch || (!d->empty && b->key.n != WB_MAC_KEY_BYTES)) {
        snprintf(err, errcap, "transfer %" PRIu64 ": the attempt has no epoch or no %d-byte key",
                 version, WB_MAC_KEY_BYTES);
        return -EPROTO;
    }
    d->version = version;
    d->epoch = epoch;
    d->attempt++;
    if (b->key.n == WB_MAC_KEY_BYTES)
        memcpy(d->key, b->key.p, WB_MAC_KEY_BYTES);
    d->start_ns = wb_now_ns();
    /* twice the attempt's time: the controller ends it first when it is there to */
    d->deadline_ns = d->start_ns + 2 * (b->timeout_ns ? b->timeout_ns : AG_DEFAULTS.transfer_ns);
    d->fail[0] = 0;
    d->active = true;
    d->pending_start = false;
    d->draining = false;
    d->nspans = 0; /* a trace holds its own attempt */
    d->hook_t0 = d->hook_t1 = 0;
    if (d->empty)
        return 0;
    struct skipset ss;
    int rc =
        skip_parse(&b->skip, d->role == WB_ROLE_TRAINER ? d->table.nrollouts : UINT32_MAX, &ss);
    if (rc) {
        snprintf(err, errcap, "transfer: malformed list of tensors not to send again");
        skip_free(&ss);
        d->active = false;
        return rc;
    }
    /* Everything counted before is forgotten; this attempt's notes alone count from now on. */
    struct wb_tx_attempt at = {
        .epoch = epoch, .version = version, .peer_times = d->trace && d->role == WB_ROLE_ROLLOUT};
    memcpy(at.key, d->key, sizeof(at.key));
    attempt_bounds(d, &at.max_tags, &at.max_notes);
    rc = wb_tx_attempt_begin(d->tx, &at);
    if (rc) {
        snprintf(err, errcap, "transfer %" PRIu64 ": %s", version, wb_tx_errmsg(d->tx));
        skip_free(&ss);
        d->active = false;
        return rc;
    }
    if (d->role == WB_ROLE_TRAINER) {
        rc = trainer_skip(d, &ss, &b->relay);
        skip_free(&ss);
        /* the attempt's member set: nothing is written to the other replicas' ranks */
        if (!rc) {
            memset(d->rout, ROUT_IN, d->table.nrollouts);
            rc = replicas_mark(&b->members, b->replica_ranks, d->table.nrollouts, true, ROUT_OUT,
                               d->rout);
            if (rc) {
                snprintf(err, errcap, "transfer: malformed member set");
                d->active = false;
                return rc;
            }
            d->direct_off = false;
            for (uint32_t k = 0; k < d->table.nwrites; k++)
                if (d->rout[d->table.writes[k].dst_rank]) {
                    d->resume.wskip[k] = 1;
                    d->direct_off = true;
                }
        }
        if (!rc) {
            rc = ag_delta_start(d, b, err, errcap);
            if (rc) {
                d->active = false;
                return rc;
            }
        }
        rc = rc ? rc : ag_exec_arm(d);
        if (rc) {
            snprintf(err, errcap, "%s", d->fail[0] ? d->fail : wb_strerror(rc));
            d->active = false;
            return rc;
        }
        d->pending_start = true; /* ag_data_progress() starts it as soon as it can */
        rc = trainer_try_begin(d);
        if (rc >= 0)
            return 0;
        snprintf(err, errcap, "%s", d->fail[0] ? d->fail : wb_strerror(rc));
        d->active = false;
        d->pending_start = false;
        return rc;
    }
    bool mine = d->rank < ss.n;
    rc = ag_rollout_start(d, version, mine ? ss.tags[d->rank] : NULL, mine ? ss.cnt[d->rank] : 0,
                          &b->relay, err, errcap);
    skip_free(&ss);
    wb_log(WB_LOG_DEBUG, M,
           "rollout rank %u: attempt of version %" PRIu64 " armed and open in %.3f ms", d->rank,
           version, (double)(wb_now_ns() - d->start_ns) / 1e6);
    if (rc) {
        d->active = false;
        ag_rollout_close(d);
    }
    return rc;
}

uint64_t ag_data_dropped(const struct data *d)
{
    if (!d->tx)
        return 0;
    struct wb_tx_note_stats st;
    wb_tx_note_stats(d->tx, &st);
    return st.stranger + st.stale + st.forged + st.replayed + st.full;
}

bool ag_data_drained(const struct data *d)
{
    if (d->role != WB_ROLE_TRAINER || d->empty || !d->tx)
        return true;
    return !d->active && !d->outstanding && !(d->io && ag_io_busy(d->io));
}

void ag_data_progress_get(const struct data *d, struct data_progress *out)
{
    out->done = d->role == WB_ROLE_TRAINER ? d->resume.done_bytes : 0;
    out->total = d->role == WB_ROLE_TRAINER ? d->resume.total_bytes : 0;
    out->epoch = d->epoch;
}

/* Polls the transport: completions to the executor, immediates counted (callbacks). */
void ag_data_poll(struct data *d)
{
    if (!d->tx)
        return;
    struct wb_tx_event ev[64];
    for (int round = 0; round < 4; round++) {
        ssize_t n = wb_tx_poll(d->tx, ev, 64);
        if (n < 0) {
            if (d->active && !d->fail[0])
                snprintf(d->fail, sizeof(d->fail), "%s rank %u: transport failed: %s",
                         wb_role_name(d->role), d->rank, wb_tx_errmsg(d->tx));
            return;
        }
        for (ssize_t i = 0; i < n; i++)
            if (d->role == WB_ROLE_TRAINER)
                ag_exec_event(d, &ev[i]);
            else
                ag_rollout_event(d, &ev[i]);
        if (n < 64)
            return;
    }
}

int ag_data_progress(struct data *d, struct data_done *out)
{
    if (d->tx)
        ag_data_poll(d);
    if (!d->active && ag_rollout_windows_open(d) && wb_now_ns() >= d->deadline_ns)
        ag_rollout_close(d); /* a failed attempt no ABORT ended */
    /* between transfers: say when the next version's values are ready */
    if (!d->active && d->fill && ag_fill_want(d->fill)) {
        char err[256] = "";
        uint64_t v = ag_fill_want(d->fill), t0 = ag_fill_t0(d->fill);
        int rc = ag_fill_poll(d->fill, err, sizeof(err));
        if (rc < 0)
            wb_log(WB_LOG_WARN, M, "trainer rank %u: version %" PRIu64 ": %s", d->rank, v, err);
        else if (rc == 1)
            wb_log(WB_LOG_INFO, M,
                   "trainer rank %u: version %" PRIu64 "'s values ready (generated in %.0f ms)",
                   d->rank, v, (double)(wb_now_ns() - t0) / 1e6);
    }
    if (!d->active)
        return 0;
    if (!d->empty && d->role == WB_ROLE_ROLLOUT && !d->fail[0] && wb_now_ns() >= d->deadline_ns)
        snprintf(d->fail, sizeof(d->fail),
                 "rollout rank %u: version %" PRIu64 " not in by its deadline (%.1f s); its "
                 "windows closed",
                 d->rank, d->version, (double)(d->deadline_ns - d->start_ns) / 1e9);
    if (!d->empty && d->role == WB_ROLE_TRAINER) {
        if (d->pending_start && trainer_try_begin(d) == 0)
            return 0;
        if (!d->fail[0] && ag_exec_step(d) == 0)
            return 0;
        if (d->fail[0]) /* stop issuing; completions still drain through ag_data_poll */
            ag_exec_abort(d);
    } else if (!d->empty) {
        ag_rollout_step(d);
        if (!d->fail[0] && !ag_rollout_complete(d))
            return 0;
    }
    d->active = false;
    d->end_ns = wb_now_ns();
    if (d->role == WB_ROLE_ROLLOUT && !d->empty)
        ag_rollout_trace_snap(d); /* what each writer's notes brought, before the attempt ends */
    /* Done: every planned write is in, nothing more may land or count. Failed here: trainers
     * may still have writes on their way, and a write into a closed window breaks the
     * trainer's connection, so the windows stay open until the controller's ABORT (sent once
     * the trainers drained) or the deadline. */
    if (d->fail[0] == 0)
        ag_rollout_close(d);
    memset(out, 0, sizeof(*out));
    out->ok = d->fail[0] == 0;
    if (d->role == WB_ROLE_TRAINER && !d->empty)
        ag_delta_end(d, out->ok);
    snprintf(out->err, sizeof(out->err), "%s", d->fail);
    if (d->role == WB_ROLE_TRAINER && !d->empty)
        out->stats = d->stats;
    out->stats.rank = d->rank;
    out->stats.cap = d->empty ? 0 : d->cap;
    out->stats.total_ns = wb_now_ns() - d->start_ns;
    out->rx_bytes = d->role == WB_ROLE_ROLLOUT && !d->empty ? ag_rollout_rx_bytes(d) : 0;
    d->last_ok = out->ok;
    return 1;
}

void ag_data_after(struct data *d)
{
    if (d->empty)
        return;
    if (d->role == WB_ROLE_ROLLOUT) {
        ag_rollout_trace(d);
        return;
    }
    ag_trace_trainer(d);
    if (d->last_ok)
        prefill(d, d->version + 1);
}

void ag_data_hook_ran(struct data *d, uint64_t t0, uint64_t t1, const char *failed)
{
    d->hook_t0 = t0;
    d->hook_t1 = t1;
    if (failed) { /* the version failed here after all */
        d->last_ok = false;
        snprintf(d->fail, sizeof(d->fail), "%s", failed);
    }
}

bool ag_data_busy(const struct data *d)
{
    return d->tx != NULL;
}

bool ag_data_idle(const struct data *d)
{
    return !d->active && !d->pending_start && !ag_rollout_windows_open(d) && !d->outstanding &&
           !(d->fill && ag_fill_want(d->fill)) && !(d->io && ag_io_busy(d->io));
}

void ag_data_abort(struct data *d)
{
    if (d->active && d->role == WB_ROLE_TRAINER && !d->empty)
        ag_exec_abort(d);
    d->active = false;
    d->pending_start = false;
    ag_rollout_close(d);
    /* A trainer's writes complete once they left (their notes follow in order); what it wrote
     * to each rollout is placed once a fence behind it comes back: only then is the trainer
     * drained (REPORT_DRAINED), and only then may the rollouts close their windows. */
    for (uint32_t g = 0; d->role == WB_ROLE_TRAINER && d->tx && d->rpeer && g < d->table.nrollouts;
         g++)
        if (d->rpeer[g].present &&
            wb_tx_fence(d->tx, d->rpeer[g].idx, (void *)(uintptr_t)WARMUP_CTX) == 0)
            d->outstanding++;
}

void ag_data_free(struct data *d)
{
    if (!d)
        return;
    data_release(d);
    free(d);
}
