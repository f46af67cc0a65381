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

/* The warm-up note's ctx (ag_data_peers): one no task has. */
static const uint64_t WARMUP_CTX = UINT64_MAX;

static enum wb_tx_mem mem_kind(const struct data *d)
{
    return d->gpu ? WB_TX_MEM_CUDA : WB_TX_MEM_HOST;
}

static void peer_clear(struct peer *p)
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
    ag_fill_free(d->fill); /* waits for a fill under way, before the memory it writes goes */
    d->fill = NULL;
    ag_io_close(d->io); /* reads in flight write into TMP: they end first */
    d->io = NULL;
    wb_tx_close(d->tx); /* releases every registration */
    d->tx = NULL;
    enum wb_tx_mem k = mem_kind(d);
    ag_host_free(d->stage);
    wb_sum_gpu_free(d->rsum);
    ag_host_free(d->sum_in_host);
    free(d->rpiece);
    free(d->rhash);
    wb_tx_mem_free(k, d->sum_out);
    wb_tx_mem_free(k, d->sum_in);
    free(d->slot);
    free(d->whash);
    free(d->wskip);
    free(d->tskip);
    free(d->task_bytes);
    free(d->lname);
    free(d->expect_local);
    free(d->local_left);
    free(d->writers);
    free(d->rready);
    free(d->sum_reached);
    free(d->landed);
    free(d->ready);
    free(d->area);
    if (d->param != d->param_host_buf)
        wb_tx_mem_free(k, d->param);
    ag_host_free(d->param_host_buf);
    wb_tx_mem_free(k, d->tmp);
    wb_tx_mem_free(k, d->inbox);
    wb_tx_mem_free(k, d->amax_in);
    wb_tx_mem_free(k, d->amax_out);
    wb_tx_mem_free(k, d->scratch[0]);
    wb_tx_mem_free(k, d->scratch[1]);
    free(d->hscratch);
    for (uint32_t i = 0; d->tpeer && i < d->table.ntrainers; i++)
        peer_clear(&d->tpeer[i]);
    for (uint32_t i = 0; d->rpeer && i < d->table.nrollouts; i++)
        peer_clear(&d->rpeer[i]);
    free(d->tpeer);
    free(d->rpeer);
    if (d->have_table)
        ag_exec_free(d);
    free(d->shards);
    free(d->shard_of);
    if (d->have_table)
        wb_route_table_free(&d->table);
    for (uint32_t i = 0; d->locals && i < d->recv.nlocal; i++)
        if (d->locals[i].owned)
            wb_tx_mem_free(k, d->locals[i].buf);
    free(d->empty_buf);
    for (uint32_t i = 0; d->ep && i < d->ep->nsegs; i++)
        d->ep->segs[i].mr = NULL; /* released with the transport */
    free(d->locals);
    free(d->expect_of);
    free(d->reached);
    if (d->have_recv)
        wb_recv_list_free(&d->recv);
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

/* Allocates n bytes of the executor's memory kind and registers them. */
static int reg_alloc(struct data *d, uint64_t n, unsigned access, void **buf, struct wb_tx_mr **mr,
                     const char *what, char *err, size_t errcap)
{
    int rc = wb_tx_mem_alloc(mem_kind(d), d->device, n, buf);
    if (rc) {
        snprintf(err, errcap, "%s: cannot allocate %" PRIu64 " bytes: %s", what, n,
                 wb_strerror(rc));
        return rc;
    }
    if (!d->gpu)
        memset(*buf, 0, n);
    if (!mr)
        return 0;
    rc = wb_tx_mr_reg(d->tx, *buf, n, access, mr);
    if (rc) {
        snprintf(err, errcap, "%s: cannot register %" PRIu64 " bytes: %s", what, n,
                 wb_tx_errmsg(d->tx));
        wb_tx_mem_free(mem_kind(d), *buf); /* the caller owns only what registered */
        *buf = NULL;
    }
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
        rc = reg_alloc(d, pb, WB_TX_ACCESS_SRC, &d->param, &d->param_mr, "parameters", err, errcap);
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
    struct seg *g = &d->ep->segs[k];
    if (g->mr)
        return 0;
    int rc = wb_tx_mr_reg(d->tx, (void *)g->base, g->len, access, &g->mr);
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
    if (d->ep->sourced && !d->param_host) {
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
        if (d->ep->sourced) { /* read by H2D ops through the source, nothing in memory */
            s->src_index = (int32_t)(r - d->ep->regs);
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
        s->mr = d->ep->segs[k].mr;
        s->mr_off = (uintptr_t)s->ptr - d->ep->segs[k].base;
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
    d->slot = malloc((nw ? nw : 1) * sizeof(uint32_t));
    d->whash = calloc(nw ? nw : 1, sizeof(uint64_t));
    if (!d->slot || !d->whash)
        return -ENOMEM;
    const uint8_t *p = sums->p;
    for (uint32_t i = 0; i < nw; i++)
        d->slot[i] = (uint32_t)p[4 * i] | (uint32_t)p[4 * i + 1] << 8 |
                     (uint32_t)p[4 * i + 2] << 16 | (uint32_t)p[4 * i + 3] << 24;
    return reg_alloc(d, (uint64_t)(nw ? nw : 1) * WB_SUM_RECORD, WB_TX_ACCESS_SRC, &d->sum_out,
                     &d->sum_out_mr, "checksum outbox", err, errcap);
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
    if (!d->tpeer || !d->rpeer || !d->rready)
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
    rc = reg_alloc(d, d->tmp_size ? d->tmp_size : 256, WB_TX_ACCESS_SRC, &d->tmp, &d->tmp_mr,
                   "temporary memory", err, errcap);
    if (!rc && d->inbox_bytes)
        rc = reg_alloc(d, d->inbox_bytes, WB_TX_ACCESS_DST, &d->inbox, &d->inbox_mr, "gather inbox",
                       err, errcap);
    if (!rc && d->amax_in_bytes)
        rc = reg_alloc(d, d->amax_in_bytes, WB_TX_ACCESS_DST, &d->amax_in, &d->amax_in_mr,
                       "amax inbox", err, errcap);
    if (!rc && d->amax_out_bytes)
        rc = reg_alloc(d, d->amax_out_bytes, WB_TX_ACCESS_SRC, &d->amax_out, &d->amax_out_mr,
                       "amax outbox", err, errcap);
    for (int k = 0; !rc && k < 2; k++)
        rc = reg_alloc(d, d->scratch_bytes, 0, &d->scratch[k], NULL, "scratch", err, errcap);
    if (!rc && d->verify)
        rc = sums_trainer(d, &b->sums, err, errcap);
    d->task_bytes = calloc(t->ntasks ? t->ntasks : 1, sizeof(uint64_t));
    d->tskip = calloc(t->ntasks ? t->ntasks : 1, 1);
    d->wskip = calloc(t->nwrites ? t->nwrites : 1, 1);
    if (!rc && (!d->task_bytes || !d->tskip || !d->wskip))
        rc = -ENOMEM;
    /* a sourced GPU endpoint reads into pinned host memory, then copies to the GPU */
    if (!rc && d->gpu && d->ep->sourced &&
        (rc = ag_host_alloc(d->tmp_size ? d->tmp_size : 256, (void **)&d->stage)) != 0)
        snprintf(err, errcap, "staging memory: cannot allocate %" PRIu64 " pinned bytes: %s",
                 d->tmp_size, wb_strerror(rc));
    if (!rc && d->ep->sourced && (rc = ag_io_open(&d->ep->src, &d->io)) != 0)
        snprintf(err, errcap, "I/O threads: %s", wb_strerror(rc));
    if (rc)
        return rc;
    d->hscratch = calloc(1, d->scratch_bytes);
    if (!d->hscratch)
        return -ENOMEM;

    /* regions: [gather inbox, amax inbox, [[mesh, off, tag], ...]] */
    struct wb_mpw *w = &d->region_blob;
    wb_mpw_array(w, 3);
    put_rdesc(d, w, d->inbox_mr);
    put_rdesc(d, w, d->amax_in_mr);
    wb_mpw_array(w, d->nsec);
    for (uint32_t i = 0; i < d->nsec; i++) {
        wb_mpw_array(w, 3);
        wb_mpw_u64(w, d->sec[i].mesh);
        wb_mpw_u64(w, d->sec[i].off);
        wb_mpw_u64(w, d->sec[i].tag);
    }
    return wb_mpw_finish(w);
}

/* ---------------------------------------------------------------- rollout setup */

/* A tag's count was reached: its writes (or, with the sum bit, its checksum records) are all
 * in. An entry whose both are in waits in d->ready to be checked by ag_data_progress(). */
/* A rollout tensor's window: opened for an attempt, closed once its writes are all in (or the
 * attempt ends). A backend that cannot close windows (CUDA IPC) leaves them open: keys and
 * the writers' own bounds checks are what it has. */
static void local_window(struct data *d, uint32_t k, bool open)
{
    struct local *l = &d->locals[k];
    if (d->caps.windows && l->mr && l->desc.bytes)
        wb_tx_mr_window(d->tx, l->mr, open);
}

static void rollout_windows(struct data *d, bool open)
{
    for (uint32_t k = 0; d->caps.windows && k < d->recv.nlocal; k++)
        local_window(d, k, open);
    if (d->caps.windows && d->sum_in_mr)
        wb_tx_mr_window(d->tx, d->sum_in_mr, open);
    d->windows_open = open;
}

/* A rollout's attempt is over (done, failed, aborted, past its deadline): nothing more may
 * land, and nothing more counts. */
static void rollout_close(struct data *d)
{
    if (!d->tx || d->role != WB_ROLE_ROLLOUT)
        return;
    if (d->windows_open)
        rollout_windows(d, false);
    wb_tx_attempt_end(d->tx);
}

static void on_data_imm(void *arg, uint32_t imm)
{
    struct data *d = arg;
    uint32_t tag = imm_tag_of(imm), sum = tag & IMM_SUM_BIT;
    tag &= ~IMM_SUM_BIT;
    if (imm_kind_of(imm) != IMM_DATA || !d->active)
        return;
    if (tag > d->max_data_tag || d->expect_of[tag] < 0)
        return;
    uint32_t i = (uint32_t)d->expect_of[tag];
    uint8_t *flag = sum ? &d->sum_reached[i] : &d->reached[i];
    if (*flag || d->landed[i])
        return;
    *flag = 1;
    if (d->reached[i] && (d->sum_reached[i] || !d->verify)) {
        d->ready[d->nready++] = i;
        /* every planned write of the entry is in: once the tensor's last entry is, its window
         * closes — before it is checked, so the check covers bytes nothing can change */
        uint32_t k = d->expect_local[i];
        if (k != UINT32_MAX && d->local_left[k] && --d->local_left[k] == 0)
            local_window(d, k, false);
    }
}

/* A registering rollout: local i of the receive list is the engine's tensor of the i-th name
 * the controller sent; peers write it through a bounded view of its allocation's
 * registration. */
static int local_bind(struct data *d, struct local *l, struct wb_mpr *names, char *err,
                      size_t errcap)
{
    char name[WB_NAME_MAX], a[160], b[160];
    if (wb_mpr_str(names, name, sizeof(name))) {
        snprintf(err, errcap, "setup: the names of the local tensors are malformed");
        return -EBADMSG;
    }
    const struct reg *r = ag_regs_find(d->ep, name);
    if (!r || r->t.meta.dtype != l->desc.dtype || !wb_shape_eq(&r->t.meta.shape, &l->desc.shape) ||
        !wb_reg_contiguous(&r->t)) {
        snprintf(err, errcap, "%s: the plan's %s %s differs from the registered tensor", name,
                 wb_dtype_name(l->desc.dtype), wb_shape_str(&l->desc.shape, a, sizeof(a)));
        if (r)
            snprintf(err + strlen(err), errcap - strlen(err), " (%s %s)",
                     wb_dtype_name(r->t.meta.dtype), wb_shape_str(&r->t.meta.shape, b, sizeof(b)));
        return -EINVAL;
    }
    l->buf = r->ptr;
    if (!l->desc.bytes) /* nothing lands: a descriptor of size 0 (setup_rollout) */
        return 0;
    if (ag_seg_of(d->ep, l->buf, l->desc.bytes) < 0) {
        snprintf(err, errcap, "%s: no registered allocation holds it", name);
        return -EINVAL;
    }
    /* Its own registration, exactly its bytes: a key covers this tensor and nothing beside it
     * (an engine's allocator packs many tensors into one allocation). */
    int rc = wb_tx_mr_reg(d->tx, l->buf, l->desc.bytes, WB_TX_ACCESS_DST, &l->mr);
    if (rc)
        snprintf(err, errcap, "%s: cannot register its %" PRIu64 " bytes: %s", name, l->desc.bytes,
                 wb_tx_errmsg(d->tx));
    rc = rc ? rc : wb_tx_rdesc(d->tx, l->mr, &l->rd);
    if (rc && !*err)
        snprintf(err, errcap, "%s: cannot describe it for writers: %s", name, wb_strerror(rc));
    return rc;
}

/* Zero-byte tensors are described by a size-0 view of one small registration of their own,
 * whose window never opens. */
static int empty_desc(struct data *d, struct wb_tx_rdesc *out, char *err, size_t errcap)
{
    if (!d->empty_mr) {
        d->empty_buf = calloc(1, 64);
        int rc = d->empty_buf
                     ? wb_tx_mr_reg(d->tx, d->empty_buf, 64, WB_TX_ACCESS_DST, &d->empty_mr)
                     : -ENOMEM;
        if (rc) {
            snprintf(err, errcap, "a descriptor for empty tensors: %s", wb_strerror(rc));
            return rc;
        }
        wb_tx_mr_window(d->tx, d->empty_mr, false);
    }
    struct wb_tx_rdesc whole;
    int rc = wb_tx_rdesc(d->tx, d->empty_mr, &whole);
    return rc ? rc : wb_tx_rdesc_view(&whole, 0, 0, out);
}

static int setup_rollout(struct data *d, const void *plan, size_t plan_len,
                         const struct wb_bytes *names, char *err, size_t errcap)
{
    int rc = wb_recv_list_decode(plan, plan_len, &d->recv);
    if (rc) {
        snprintf(err, errcap, "receive list: %s", wb_strerror(rc));
        return rc;
    }
    d->have_recv = true;
    uint32_t nl = d->recv.nlocal, ne = d->recv.nexpect;
    d->locals = calloc(nl ? nl : 1, sizeof(*d->locals));
    d->lname = calloc(nl ? nl : 1, sizeof(*d->lname));
    if (!d->locals || !d->lname)
        return -ENOMEM;
    struct wb_mpr nr;
    uint32_t nn = 0;
    wb_mpr_init(&nr, names->p, names->n);
    bool have_names = names->n && wb_mpr_array(&nr, WB_WIRE_MAX_ARRAY, &nn) == 0 && nn == nl;
    if (!d->synthetic && !have_names) {
        snprintf(err, errcap, "setup: %u local tensor names for %u local tensors", nn, nl);
        return -EBADMSG;
    }
    struct wb_mpw *w = &d->region_blob;
    wb_mpw_array(w, nl + (d->verify ? 1 : 0));
    for (uint32_t i = 0; i < nl; i++) {
        struct local *l = &d->locals[i];
        char what[64];
        l->desc = d->recv.local[i];
        if (d->synthetic) {
            snprintf(what, sizeof(what), "rollout tensor %u", l->desc.tensor);
            struct kept *k = NULL;
            for (uint32_t j = 0; j < d->nkept && !k; j++)
                if (d->kept[j].buf && d->kept[j].tensor == l->desc.tensor &&
                    d->kept[j].bytes == l->desc.bytes)
                    k = &d->kept[j];
            if (k) { /* the same tensor as before the re-setup: its weights stay */
                l->buf = k->buf;
                k->buf = NULL;
                d->nkept_taken++;
                l->owned = true;
                rc = wb_tx_mr_reg(d->tx, l->buf, l->desc.bytes ? l->desc.bytes : 1,
                                  WB_TX_ACCESS_DST, &l->mr);
                if (rc)
                    snprintf(err, errcap, "%s: cannot register %" PRIu64 " bytes: %s", what,
                             l->desc.bytes, wb_tx_errmsg(d->tx));
            } else {
                rc = reg_alloc(d, l->desc.bytes ? l->desc.bytes : 1, WB_TX_ACCESS_DST, &l->buf,
                               &l->mr, what, err, errcap);
                l->owned = rc == 0;
            }
            rc = rc ? rc : wb_tx_rdesc(d->tx, l->mr, &l->rd);
            rc = rc || l->desc.bytes ? rc : wb_tx_rdesc_view(&l->rd, 0, 0, &l->rd);
            if (!rc && have_names && wb_mpr_str(&nr, d->lname[i], sizeof(d->lname[i])))
                rc = -EBADMSG;
        } else {
            struct wb_mpr at = nr; /* local_bind reads the name; keep a copy for messages */
            rc = local_bind(d, l, &nr, err, errcap);
            rc = rc || l->desc.bytes ? rc : empty_desc(d, &l->rd, err, errcap);
            if (!rc)
                wb_mpr_str(&at, d->lname[i], sizeof(d->lname[i]));
        }
        if (rc)
            return rc;
        if (!d->lname[i][0])
            snprintf(d->lname[i], sizeof(d->lname[i]), "rollout tensor %u", l->desc.tensor);
        d->local_bytes += l->desc.bytes;
        wb_mpw_array(w, 2);
        wb_mpw_u64(w, l->desc.tensor);
        wb_tx_rdesc_put(w, &l->rd);
    }
    for (uint32_t i = 0; i < ne; i++)
        if (d->recv.expect[i].tag > d->max_data_tag)
            d->max_data_tag = d->recv.expect[i].tag;
    if (d->max_data_tag >= IMM_SUM_BIT) {
        snprintf(err, errcap, "receive list: data tag %u does not fit the immediate's tag bits",
                 d->max_data_tag);
        return -E2BIG;
    }
    d->expect_of = malloc((d->max_data_tag + 1) * sizeof(int32_t));
    d->expect_local = calloc(ne ? ne : 1, sizeof(uint32_t));
    d->local_left = calloc(nl ? nl : 1, sizeof(uint32_t));
    d->reached = calloc(ne ? ne : 1, 1);
    d->sum_reached = calloc(ne ? ne : 1, 1);
    d->landed = calloc(ne ? ne : 1, 1);
    d->ready = calloc(ne ? ne : 1, sizeof(uint32_t));
    d->area = calloc(ne ? ne : 1, sizeof(uint64_t));
    if (!d->expect_of || !d->expect_local || !d->reached || !d->sum_reached || !d->landed ||
        !d->ready || !d->area || !d->local_left)
        return -ENOMEM;
    for (uint32_t i = 0; i <= d->max_data_tag; i++)
        d->expect_of[i] = -1;
    uint64_t slots = 0;
    for (uint32_t i = 0; i < ne; i++) {
        const struct wb_rt_expect *e = &d->recv.expect[i];
        d->expect_of[e->tag] = (int32_t)i;
        d->expect_local[i] = UINT32_MAX;
        for (uint32_t k = 0; k < nl; k++)
            if (d->locals[k].desc.tensor == e->tensor)
                d->expect_local[i] = k;
        if (d->expect_local[i] == UINT32_MAX && e->writes) {
            snprintf(err, errcap, "receive list: tag %u counts writes to tensor %u, not held here",
                     e->tag, e->tensor);
            return -EBADMSG;
        }
        d->area[i] = slots;
        slots += e->writes;
    }
    /* the checksum inbox: a record per write, grouped by expect entry (the controller gives
     * every writer its slots in the same order) */
    if (d->verify) {
        d->sum_in_bytes = (slots ? slots : 1) * WB_SUM_RECORD;
        rc = reg_alloc(d, d->sum_in_bytes, WB_TX_ACCESS_DST, &d->sum_in, &d->sum_in_mr,
                       "checksum inbox", err, errcap);
        if (!rc && d->gpu && (rc = ag_host_alloc(d->sum_in_bytes, &d->sum_in_host)) != 0)
            snprintf(err, errcap, "checksum inbox's host mirror: %s", wb_strerror(rc));
        struct wb_tx_rdesc rd;
        rc = rc ? rc : wb_tx_rdesc(d->tx, d->sum_in_mr, &rd);
        if (rc)
            return rc;
        wb_mpw_array(w, 2);
        wb_mpw_u64(w, SUM_INBOX_ENTRY);
        wb_tx_rdesc_put(w, &rd);
    }
    rollout_windows(d, false); /* read-only to the network until an attempt opens them */
    return wb_mpw_finish(w);
}

int ag_data_setup(struct data **dp, struct wb_endpoint *ep, const struct wb_body_setup *b,
                  uint64_t next_version, struct data_setup_out *out, char *err, size_t errcap)
{
    const struct wb_endpoint_opts *o = &ep->o;
    const void *plan = b->plan.p, *shards = b->shards.p;
    *out = (struct data_setup_out){0};
    size_t plan_len = b->plan.n, shards_len = b->shards.n;
    /* The old setup goes first: its transport holds the registrations of the endpoint's
     * allocations, which the new one registers again (and its memory is freed before more is
     * allocated). A synthetic rollout's tensors are carried over: the new setup takes those it
     * holds again (same tensor, same size), so a re-setup keeps the weights. */
    struct kept *kept = NULL;
    uint32_t nkept = 0;
    enum wb_tx_mem kept_kind = WB_TX_MEM_HOST;
    int kept_device = -1;
    struct data *old = *dp;
    bool resetup = old != NULL;
    if (old && old->role == WB_ROLE_ROLLOUT && old->synthetic && old->have_recv &&
        (kept = calloc(old->recv.nlocal ? old->recv.nlocal : 1, sizeof(*kept))) != NULL) {
        kept_kind = mem_kind(old);
        kept_device = old->device;
        for (uint32_t i = 0; i < old->recv.nlocal; i++)
            if (old->locals[i].owned) {
                kept[nkept++] = (struct kept){old->locals[i].desc.tensor, old->locals[i].desc.bytes,
                                              old->locals[i].buf};
                old->locals[i].owned = false;
            }
    }
    /* What landed of a failed version stays known across the re-setup (the tensors, and so
     * their bytes, stay): a resumed attempt does not send it again. By tag. */
    uint64_t *landed_tags = NULL, landed_version = 0;
    uint32_t nlanded_tags = 0;
    if (old && old->role == WB_ROLE_ROLLOUT && old->have_recv && old->landed_version &&
        (landed_tags = calloc(old->recv.nexpect ? old->recv.nexpect : 1, sizeof(uint64_t)))) {
        landed_version = old->landed_version;
        for (uint32_t i = 0; i < old->recv.nexpect; i++)
            if (old->landed[i] && old->recv.expect[i].writes)
                landed_tags[nlanded_tags++] = old->recv.expect[i].tag;
    }
    ag_data_free(*dp);
    *dp = NULL;
    struct data *d = calloc(1, sizeof(*d));
    if (!d) {
        for (uint32_t i = 0; i < nkept; i++)
            wb_tx_mem_free(kept_kind, kept[i].buf);
        free(kept);
        return -ENOMEM;
    }
    d->role = o->role;
    d->rank = o->rank;
    d->ep = ep;
    d->o = o;
    d->synthetic = o->synthetic;
    d->job = ep->job;
    d->device = o->device;
    d->empty = plan_len == 0;
    d->verify = b->verify;
    uint64_t t0 = wb_now_ns();
    wb_mpw_init(&d->addr_blob);
    wb_mpw_init(&d->region_blob);
    int rc = 0;
    if (!d->empty && o->device >= 0) {
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
    if (!rc && !d->empty && o->role == WB_ROLE_TRAINER && d->synthetic) {
        struct ag_fill_src fs = {d->shards,         d->nshards, d->job.seed,
                                 d->param_host_buf, d->stream,  d->device};
        rc = ag_fill_new(&fs, &d->fill);
    }
    if (!rc && !d->empty && o->role == WB_ROLE_ROLLOUT) {
        bool same_kind = mem_kind(d) == kept_kind && d->device == kept_device;
        d->kept = same_kind ? kept : NULL;
        d->nkept = same_kind ? nkept : 0;
        rc = setup_rollout(d, plan, plan_len, &b->locals, err, errcap);
    }
    uint32_t taken = d->nkept_taken;
    for (uint32_t i = 0; i < nkept; i++) /* what the new setup did not take */
        if (kept[i].buf)
            wb_tx_mem_free(kept_kind, kept[i].buf);
    free(kept);
    d->kept = NULL;
    d->nkept = 0;
    /* an engine's tensors are its own (never replaced); a synthetic rollout's were kept */
    bool same_memory = !rc && d->role == WB_ROLE_ROLLOUT && !d->empty &&
                       (!d->synthetic || (nkept && taken == d->recv.nlocal));
    if (same_memory && nlanded_tags) {
        d->landed_version = landed_version;
        for (uint32_t i = 0; i < d->recv.nexpect; i++)
            for (uint32_t k = 0; k < nlanded_tags; k++)
                if (landed_tags[k] == d->recv.expect[i].tag)
                    d->landed[i] = 1;
    }
    free(landed_tags);
    if (resetup && nkept && (rc || taken < nkept || taken < d->recv.nlocal))
        out->lost =
            rc ? "its re-setup failed, releasing its tensors" : "a re-setup replaced its tensors";
    else if (!rc && nkept)
        wb_log(WB_LOG_INFO, M, "rollout rank %u: re-setup kept its %u tensors and their weights",
               o->rank, taken);
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
               d->inbox_bytes, d->caps.name, d->gpu ? "GPU" : "host memory",
               (double)(wb_now_ns() - t0) / 1e6);
    else if (!d->empty)
        wb_log(WB_LOG_INFO, M,
               "rollout rank %u: %u local tensors (%" PRIu64 " bytes), %s on %s, set up in %.0f ms",
               d->rank, d->recv.nlocal, d->local_bytes, d->caps.name,
               d->gpu ? "GPU" : "host memory", (double)(wb_now_ns() - t0) / 1e6);
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

static int parse_rollout_regions(struct peer *p, struct wb_mpr *r)
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
        if (wb_tx_rdesc_get(r, &p->reg[k]))
            return -EBADMSG;
        p->reg_tensor[k++] = (uint32_t)tn;
    }
    p->nreg = k;
    return r->err;
}

/* A rollout's PEERS: the trainers that write to it — the only senders whose notes it counts,
 * and the ones it tells "ready". */
static int rollout_peers(struct data *d, struct wb_mpr *r, uint32_t n, char *err, size_t errcap)
{
    free(d->writers);
    d->nwriters = 0;
    d->writers = calloc(n ? n : 1, sizeof(uint32_t));
    if (!d->writers)
        return -ENOMEM;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t four;
        uint64_t role, rank;
        const void *addr, *reg;
        size_t alen, rlen;
        if (wb_mpr_array(r, 4, &four) || four != 4 || wb_mpr_u64(r, &role) ||
            wb_mpr_u64(r, &rank) || wb_mpr_bin(r, &addr, &alen, 1u << 20) ||
            wb_mpr_bin(r, &reg, &rlen, 1u << 30)) {
            snprintf(err, errcap, "peer list: malformed entry %u", i);
            return -EBADMSG;
        }
        if (role != WB_ROLE_TRAINER || !alen)
            continue;
        struct wb_mpr ar;
        uint32_t idx;
        wb_mpr_init(&ar, addr, alen);
        int rc = wb_tx_peer_add(d->tx, &ar, &idx);
        if (rc) {
            snprintf(err, errcap, "trainer rank %" PRIu64 ": transport address: %s", rank,
                     wb_tx_errmsg(d->tx));
            return rc;
        }
        d->writers[d->nwriters++] = idx;
        if (wb_tx_connect(d->tx, idx, (void *)(uintptr_t)WARMUP_CTX) != 0)
            wb_log(WB_LOG_DEBUG, M, "rollout rank %u: warm-up to trainer rank %" PRIu64 ": %s",
                   d->rank, rank, wb_tx_errmsg(d->tx));
    }
    return 0;
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
        return rollout_peers(d, &r, n, err, errcap);
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
        peer_clear(p);
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
        rc = tr ? parse_trainer_regions(p, &rr) : parse_rollout_regions(p, &rr);
        if (rc) {
            snprintf(err, errcap, "%s rank %" PRIu64 ": memory descriptors: %s",
                     wb_role_name((enum wb_role)role), rank, wb_strerror(rc));
            peer_clear(p);
            return rc;
        }
        p->addr = malloc(alen);
        if (!p->addr) {
            snprintf(err, errcap, "%s rank %" PRIu64 ": transport address: out of memory",
                     wb_role_name((enum wb_role)role), rank);
            peer_clear(p);
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
    d->nspans = d->nspans < SPAN_MAX ? d->nspans : 0;
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

static int trainer_skip(struct data *d, const struct skipset *ss)
{
    const struct wb_route_table *t = &d->table;
    for (uint32_t k = 0; k < t->nwrites; k++)
        d->wskip[k] = skip_has(ss, t->writes[k].dst_rank, t->writes[k].tag);
    return 0;
}

static int rollout_arm(struct data *d, uint64_t version, const struct skipset *ss, char *err,
                       size_t errcap)
{
    uint32_t ne = d->recv.nexpect;
    memset(d->local_left, 0, (d->recv.nlocal ? d->recv.nlocal : 1) * sizeof(uint32_t));
    if (d->landed_version != version) { /* what landed of another version is no use */
        memset(d->landed, 0, ne ? ne : 1);
        d->landed_version = version;
    }
    memset(d->reached, 0, ne ? ne : 1);
    memset(d->sum_reached, 0, ne ? ne : 1);
    d->nready = d->nlanded = d->nwant = 0;
    for (uint32_t i = 0; i < ne; i++) {
        const struct wb_rt_expect *e = &d->recv.expect[i];
        if (!e->writes) {
            d->landed[i] = 1;
            continue;
        }
        if (skip_has(ss, d->rank, e->tag)) {
            if (!d->landed[i]) { /* never complete with a piece missing */
                snprintf(err, errcap,
                         "told not to expect %s again, but it has not landed here in version "
                         "%" PRIu64,
                         d->lname[d->expect_local[i]], version);
                return -EINVAL;
            }
            continue;
        }
        d->landed[i] = 0;
        d->nwant++;
        if (d->expect_local[i] != UINT32_MAX)
            d->local_left[d->expect_local[i]]++;
        int rc = wb_tx_expect(d->tx, imm_make(IMM_DATA, e->tag), e->writes, on_data_imm, d);
        if (!rc && d->verify)
            rc = wb_tx_expect(d->tx, imm_make(IMM_DATA, e->tag | IMM_SUM_BIT), e->writes,
                              on_data_imm, d);
        if (rc) {
            snprintf(err, errcap, "rollout rank %u: immediate counter of tag %u: %s", d->rank,
                     e->tag, wb_tx_errmsg(d->tx));
            return rc;
        }
    }
    return 0;
}

/* A rollout's part of an attempt's start, once its counters are armed: the windows of what it
 * will receive open, then every trainer that writes to it hears "ready" — none writes before. */
static int rollout_open(struct data *d, char *err, size_t errcap)
{
    for (uint32_t k = 0; d->caps.windows && k < d->recv.nlocal; k++)
        if (d->local_left[k])
            local_window(d, k, true);
    if (d->caps.windows && d->sum_in_mr)
        wb_tx_mr_window(d->tx, d->sum_in_mr, true);
    d->windows_open = true;
    for (uint32_t i = 0; i < d->nwriters; i++) {
        int rc = wb_tx_write_imm(d->tx, d->writers[i], imm_make(IMM_READY, d->rank),
                                 (void *)(uintptr_t)WARMUP_CTX);
        if (rc) {
            snprintf(err, errcap, "rollout rank %u: telling a trainer it is ready: %s", d->rank,
                     wb_tx_errmsg(d->tx));
            return rc;
        }
    }
    return 0;
}

/* What this side may count in one attempt: every counter it arms, and the notes behind them
 * (the transport's bounds for the attempt; a little slack for nothing). */
static void attempt_bounds(const struct data *d, uint64_t *tags, uint64_t *notes)
{
    uint64_t t = 16, n = 16;
    if (d->role == WB_ROLE_ROLLOUT) {
        for (uint32_t i = 0; i < d->recv.nexpect; i++) {
            t += d->verify ? 2 : 1;
            n += d->recv.expect[i].writes * (d->verify ? 2 : 1);
        }
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
    struct wb_tx_attempt at = {.epoch = epoch, .version = version};
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
        trainer_skip(d, &ss);
        skip_free(&ss);
        rc = ag_exec_arm(d);
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
    rc = rollout_arm(d, version, &ss, err, errcap);
    skip_free(&ss);
    rc = rc ? rc : rollout_open(d, err, errcap);
    wb_log(WB_LOG_DEBUG, M,
           "rollout rank %u: attempt of version %" PRIu64 " armed and open in %.3f ms", d->rank,
           version, (double)(wb_now_ns() - d->start_ns) / 1e6);
    if (rc) {
        d->active = false;
        rollout_close(d);
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

bool ag_data_receiving(const struct data *d)
{
    return d->role == WB_ROLE_ROLLOUT && !d->empty && d->active && d->nwant > 0;
}

/* Rollouts: room for n records' pieces and sums. */
static int rsum_reserve(struct data *d, uint64_t n)
{
    if (n <= d->rcap)
        return 0;
    struct wb_sum_piece *p = realloc(d->rpiece, n * sizeof(*p));
    if (p)
        d->rpiece = p;
    uint64_t *h = realloc(d->rhash, n * sizeof(*h));
    if (h)
        d->rhash = h;
    if (!p || !h)
        return -ENOMEM;
    d->rcap = n;
    return 0;
}

/* Rollouts: the records of expect entries ent[0..ne) against what landed, in one batch: the
 * records read (GPU: one copy each into the inbox's pinned mirror, one wait), checked for
 * where they point, then the sums of every record's bytes — one kernel over the tensors' GPU
 * memory, or wb_sum64 on the host — compared. */
static int check_landed(struct data *d, const uint32_t *ent, uint32_t ne)
{
    uint64_t nrec = 0;
    for (uint32_t j = 0; j < ne; j++)
        nrec += d->recv.expect[ent[j]].writes;
    int rc = rsum_reserve(d, nrec ? nrec : 1);
    const uint8_t *in = d->gpu ? d->sum_in_host : d->sum_in;
    for (uint32_t j = 0; !rc && d->gpu && j < ne; j++) {
        uint64_t at = d->area[ent[j]] * WB_SUM_RECORD;
        rc = ag_copy_async((uint8_t *)d->sum_in_host + at, (const uint8_t *)d->sum_in + at,
                           d->recv.expect[ent[j]].writes * WB_SUM_RECORD, d->stream);
    }
    rc = rc || !d->gpu ? rc : ag_stream_sync(d->stream);
    if (rc)
        return rc;
    uint64_t at = 0;
    for (uint32_t j = 0; j < ne; j++) {
        uint32_t i = ent[j];
        const struct wb_rt_expect *e = &d->recv.expect[i];
        const struct local *l = &d->locals[d->expect_local[i]];
        const char *name = d->lname[d->expect_local[i]];
        const struct wb_sum_record *rec =
            (const struct wb_sum_record *)(in + d->area[i] * WB_SUM_RECORD);
        uint64_t covered = 0;
        for (uint64_t k = 0; k < e->writes; k++) {
            const struct wb_sum_record *x = &rec[k];
            if (x->epoch != d->epoch || x->version != d->version ||
                x->mac != wb_siphash(d->key, x, WB_SUM_RECORD_MACED)) {
                snprintf(d->fail, sizeof(d->fail),
                         "%s: checksum record %" PRIu64 " is not this attempt's (epoch %016" PRIx64
                         ", version %" PRIu64 ", or its MAC does not match)",
                         name, k, x->epoch, x->version);
                return -EBADMSG;
            }
            if (x->tensor != e->tensor || x->len > l->desc.bytes ||
                x->dst_off > l->desc.bytes - x->len) {
                snprintf(d->fail, sizeof(d->fail),
                         "%s: checksum record %" PRIu64 " is malformed (tensor %u, bytes [%" PRIu64
                         ", +%" PRIu64 ") of %" PRIu64 ")",
                         name, k, x->tensor, x->dst_off, x->len, l->desc.bytes);
                return -EBADMSG;
            }
            d->rpiece[at + k] = (struct wb_sum_piece){(const uint8_t *)l->buf + x->dst_off, x->len};
            covered += x->len;
        }
        if (covered != e->bytes) {
            snprintf(d->fail, sizeof(d->fail),
                     "%s: checksum records cover %" PRIu64 " of %" PRIu64 " bytes", name, covered,
                     e->bytes);
            return -EIO;
        }
        at += e->writes;
    }
    if (d->gpu) {
        rc = d->rsum ? 0 : wb_sum_gpu_new(&d->rsum);
        rc = rc ? rc : wb_sum_gpu_run(d->rsum, d->rpiece, nrec, d->stream, d->rhash);
        if (rc) {
            snprintf(d->fail, sizeof(d->fail), "%s: checksums on the GPU: %s",
                     d->lname[d->expect_local[ent[0]]], wb_strerror(rc));
            return rc;
        }
    }
    at = 0;
    for (uint32_t j = 0; j < ne; j++) {
        uint32_t i = ent[j];
        const struct wb_sum_record *rec =
            (const struct wb_sum_record *)(in + d->area[i] * WB_SUM_RECORD);
        for (uint64_t k = 0; k < d->recv.expect[i].writes; k++, at++) {
            const struct wb_sum_record *x = &rec[k];
            uint64_t h = d->gpu ? d->rhash[at] : wb_sum64(d->rpiece[at].p, x->len);
            if (h != x->sum) {
                snprintf(
                    d->fail, sizeof(d->fail),
                    "%s: bytes [%" PRIu64 ", %" PRIu64
                    ") written by trainer rank %u do not match their checksum: sum64 %016" PRIx64
                    " landed, %016" PRIx64 " sent",
                    d->lname[d->expect_local[i]], x->dst_off, x->dst_off + x->len, x->trainer, h,
                    x->sum);
                return -EIO;
            }
        }
    }
    return 0;
}

/* Testing (--corrupt): the first byte of the named tensor flipped once it landed. */
static void corrupt(struct data *d, uint32_t i)
{
    const struct local *l = &d->locals[d->expect_local[i]];
    if (!d->o->corrupt || d->corrupted || !l->desc.bytes ||
        strcmp(d->lname[d->expect_local[i]], d->o->corrupt) != 0)
        return;
    uint8_t b;
    if (wb_tx_mem_copy(&b, l->buf, 1) == 0) {
        b ^= 0x01;
        wb_tx_mem_copy(l->buf, &b, 1);
    }
    d->corrupted = true;
}

/* Rollouts: the entries whose writes (and records) are all in, checked and marked landed.
 * Nothing to check (no verify): every ready entry at once — one per turn of the loop cost a
 * 680-tensor rollout 1.4 ms after its last byte. Checked on the host: one per turn, so that
 * heartbeats go on between the checks of large tensors; on a GPU: every ready entry up to
 * 4 GiB of them per turn (a kernel hashes that in milliseconds), so that the waits of a batch
 * are paid once, not per tensor. */
static void rollout_step(struct data *d)
{
    if (!d->nready || d->fail[0])
        return;
    uint32_t n = d->verify ? 0 : d->nready;
    uint64_t bytes = 0;
    while (n < d->nready && (n == 0 || (d->gpu && bytes < (4ull << 30))))
        bytes += d->recv.expect[d->ready[d->nready - 1 - n++]].bytes;
    d->nready -= n;
    const uint32_t *ent = &d->ready[d->nready];
    for (uint32_t j = 0; j < n; j++)
        corrupt(d, ent[j]);
    if (d->verify && check_landed(d, ent, n)) {
        if (!d->fail[0])
            snprintf(d->fail, sizeof(d->fail), "%s: cannot check it",
                     d->lname[d->expect_local[ent[0]]]);
        return;
    }
    for (uint32_t j = 0; j < n; j++) {
        d->landed[ent[j]] = 1;
        d->nlanded++;
    }
}

int ag_data_landed(const struct data *d, uint64_t version, struct wb_mpw *w)
{
    uint32_t n = 0;
    bool mine = d->role == WB_ROLE_ROLLOUT && !d->empty && d->landed_version == version;
    for (uint32_t i = 0; mine && i < d->recv.nexpect; i++)
        n += d->landed[i] && d->recv.expect[i].writes;
    wb_mpw_array(w, n);
    for (uint32_t i = 0; mine && i < d->recv.nexpect; i++)
        if (d->landed[i] && d->recv.expect[i].writes)
            wb_mpw_u64(w, d->recv.expect[i].tag);
    return wb_mpw_finish(w);
}

void ag_data_progress_get(const struct data *d, struct data_progress *out)
{
    out->done = d->role == WB_ROLE_TRAINER ? d->done_bytes : 0;
    out->total = d->role == WB_ROLE_TRAINER ? d->total_bytes : 0;
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
        if (n < 64)
            return;
    }
}

int ag_data_progress(struct data *d, struct data_done *out)
{
    if (d->tx)
        ag_data_poll(d);
    if (!d->active && d->windows_open && wb_now_ns() >= d->deadline_ns)
        rollout_close(d); /* a failed attempt no ABORT ended */
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
        rollout_step(d);
        if (!d->fail[0] && d->nlanded < d->nwant)
            return 0;
    }
    d->active = false;
    /* Done: every planned write is in, nothing more may land or count. Failed here: trainers
     * may still have writes on their way, and a write into a closed window breaks the
     * trainer's connection, so the windows stay open until the controller's ABORT (sent once
     * the trainers drained) or the deadline. */
    if (d->fail[0] == 0)
        rollout_close(d);
    memset(out, 0, sizeof(*out));
    out->ok = d->fail[0] == 0;
    snprintf(out->err, sizeof(out->err), "%s", d->fail);
    if (d->role == WB_ROLE_TRAINER && !d->empty)
        out->stats = d->stats;
    out->stats.rank = d->rank;
    out->stats.cap = d->empty ? 0 : d->cap;
    out->stats.total_ns = wb_now_ns() - d->start_ns;
    out->rx_bytes = d->role == WB_ROLE_ROLLOUT && !d->empty ? d->recv.recv_bytes : 0;
    d->last_ok = out->ok;
    return 1;
}

void ag_data_after(struct data *d)
{
    if (d->role != WB_ROLE_TRAINER || d->empty)
        return;
    ag_exec_trace_write(d);
    if (d->last_ok)
        prefill(d, d->version + 1);
}

bool ag_data_empty(const struct data *d)
{
    return d->empty;
}

bool ag_data_busy(const struct data *d)
{
    return d->tx != NULL;
}

bool ag_data_idle(const struct data *d)
{
    return !d->active && !d->pending_start && !d->windows_open && !d->outstanding &&
           !(d->fill && ag_fill_want(d->fill)) && !(d->io && ag_io_busy(d->io));
}

void ag_data_abort(struct data *d)
{
    if (d->active && d->role == WB_ROLE_TRAINER && !d->empty)
        ag_exec_abort(d);
    d->active = false;
    d->pending_start = false;
    rollout_close(d);
    /* A trainer's writes complete once they left (their notes follow in order); what it wrote
     * to each rollout is placed once a fence behind it comes back: only then is the trainer
     * drained (REPORT_DRAINED), and only then may the rollouts close their windows. */
    for (uint32_t g = 0; d->role == WB_ROLE_TRAINER && d->tx && d->rpeer && g < d->table.nrollouts;
         g++)
        if (d->rpeer[g].present &&
            wb_tx_fence(d->tx, d->rpeer[g].idx, (void *)(uintptr_t)WARMUP_CTX) == 0)
            d->outstanding++;
}

/* ---------------------------------------------------------------- rollout dumps */

int ag_data_dump(struct data *d, const char *dir, uint64_t version, char *err, size_t errcap)
{
    if (d->role != WB_ROLE_ROLLOUT || d->empty)
        return 0;
    if (d->gpu && ag_gpu_use(d->device)) { /* whichever thread calls */
        snprintf(err, errcap, "GPU %d: cannot use it to read the rollout's tensors", d->device);
        return -WB_E_CUDA;
    }
    char path[1200], tmp[1300];
    snprintf(path, sizeof(path), "%s/rollout%u.v%" PRIu64 ".bin", dir, d->rank, version);
    snprintf(tmp, sizeof(tmp), "%s.tmp%d", path, (int)getpid());
    /* created, never opened through a link planted at its name */
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    FILE *f = fd < 0 ? NULL : fdopen(fd, "wb");
    if (!f) {
        if (fd >= 0)
            close(fd);
        snprintf(err, errcap, "%s: cannot create", tmp);
        return -errno;
    }
    int rc = 0;
    const char *what = "writing it";
    uint8_t *host = NULL;
    fwrite("WBDUMP1\n", 1, 8, f);
    uint32_t n = d->recv.nlocal;
    fwrite(&n, sizeof(n), 1, f);
    for (uint32_t i = 0; !rc && i < n; i++) {
        const struct local *l = &d->locals[i];
        uint64_t b = l->desc.bytes;
        fwrite(&l->desc.tensor, sizeof(uint32_t), 1, f);
        fwrite(&b, sizeof(b), 1, f);
        const void *src = l->buf;
        if (d->gpu) {
            free(host);
            host = malloc(b ? b : 1);
            rc = host ? wb_tx_mem_copy(host, l->buf, b) : -ENOMEM;
            src = host;
            if (rc)
                what = "copying a tensor out of GPU memory";
        }
        if (!rc && fwrite(src, 1, b, f) != b)
            rc = -EIO;
    }
    free(host);
    if (fclose(f) || rc || rename(tmp, path)) {
        snprintf(err, errcap, "%s: cannot write the rollout's tensors (%s: %s)", path, what,
                 wb_strerror(rc ? rc : -EIO));
        unlink(tmp);
        return rc ? rc : -EIO;
    }
    return 0;
}

void ag_data_free(struct data *d)
{
    if (!d)
        return;
    data_release(d);
    free(d);
}
