/* data.c — the agent's data side: what SETUP, PEERS and TRANSFER do to memory.
 *
 * SETUP decodes this agent's part of the plan. A trainer gets its routing table and the list
 * of shards it holds, and materializes the shards from the synthetic source; a rollout gets its
 * receive list and allocates one buffer per local tensor (the memory peers write into). A job
 * without a model (control plane only) has empty plans: nothing is allocated and a transfer
 * moves nothing and finishes at once.
 *
 * Moving bytes between processes needs the transport part (transport/transport.h: register
 * memory, remote descriptors, WRITE with immediate, immediate counters). This build has no
 * transport part, so a transfer of a non-empty plan fails with a message saying so instead of
 * pretending; see the executor notes in the final report of issue 7. */
#include "agent/priv.h"
#include "planner/planner.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

struct shard {
    uint32_t tensor; /* trainer tensor index */
    struct wb_tensor_meta meta;
    void *buf; /* host, row-major over meta.box */
    uint64_t bytes;
};

struct local {
    struct wb_rt_local desc;
    void *buf;
};

struct data {
    enum wb_role role;
    uint32_t rank;
    struct agent_job job;
    bool empty; /* no plan: nothing to move */
    bool active;
    uint64_t version, start_ns;
    /* trainer */
    struct wb_route_table table;
    bool have_table;
    struct shard *shards;
    uint32_t nshards;
    uint64_t param_bytes;
    /* rollout */
    struct wb_recv_list recv;
    bool have_recv;
    struct local *locals;
    uint64_t local_bytes;
    char fail[256];
};

static void data_release(struct data *d)
{
    for (uint32_t i = 0; i < d->nshards; i++)
        free(d->shards[i].buf);
    free(d->shards);
    if (d->have_table)
        wb_route_table_free(&d->table);
    for (uint32_t i = 0; d->locals && i < d->recv.nlocal; i++)
        free(d->locals[i].buf);
    free(d->locals);
    if (d->have_recv)
        wb_recv_list_free(&d->recv);
}

static int setup_trainer(struct data *d, const void *plan, size_t plan_len, const void *shards,
                         size_t shards_len, char *err, size_t errcap)
{
    int rc = wb_route_table_decode(plan, plan_len, &d->table);
    if (rc) {
        snprintf(err, errcap, "routing table: %s", wb_strerror(rc));
        return rc;
    }
    d->have_table = true;
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
        uint32_t two;
        uint64_t t;
        wb_mpr_array(&r, 2, &two);
        wb_mpr_u64(&r, &t);
        if (two != 2 || t > UINT32_MAX || wb_wire_get_tensor_meta(&r, &s->meta)) {
            snprintf(err, errcap, "shard list: malformed entry %u", i);
            return -EBADMSG;
        }
        s->tensor = (uint32_t)t;
        s->bytes = wb_box_numel(&s->meta.box) * wb_dtype_size(s->meta.dtype);
        s->buf = malloc(s->bytes ? s->bytes : 1);
        if (!s->buf)
            return -ENOMEM;
        d->nshards = i + 1;
        d->param_bytes += s->bytes;
    }
    return wb_mpr_end(&r) ? -EBADMSG : 0;
}

static int setup_rollout(struct data *d, const void *plan, size_t plan_len, char *err,
                         size_t errcap)
{
    int rc = wb_recv_list_decode(plan, plan_len, &d->recv);
    if (rc) {
        snprintf(err, errcap, "receive list: %s", wb_strerror(rc));
        return rc;
    }
    d->have_recv = true;
    d->locals = calloc(d->recv.nlocal ? d->recv.nlocal : 1, sizeof(*d->locals));
    if (!d->locals)
        return -ENOMEM;
    for (uint32_t i = 0; i < d->recv.nlocal; i++) {
        d->locals[i].desc = d->recv.local[i];
        d->locals[i].buf = calloc(1, d->recv.local[i].bytes ? d->recv.local[i].bytes : 1);
        if (!d->locals[i].buf)
            return -ENOMEM;
        d->local_bytes += d->recv.local[i].bytes;
    }
    return 0;
}

int data_setup(struct data **dp, const struct wb_agent_opts *o, const struct agent_job *job,
               const void *plan, size_t plan_len, const void *shards, size_t shards_len,
               const void **addr, size_t *addr_len, const void **regions, size_t *regions_len,
               char *err, size_t errcap)
{
    struct data *d = calloc(1, sizeof(*d));
    if (!d)
        return -ENOMEM;
    d->role = o->role;
    d->rank = o->rank;
    d->job = *job;
    d->empty = plan_len == 0;
    int rc = 0;
    if (!d->empty && o->role == WB_ROLE_TRAINER)
        rc = setup_trainer(d, plan, plan_len, shards, shards_len, err, errcap);
    else if (!d->empty)
        rc = setup_rollout(d, plan, plan_len, err, errcap);
    if (rc) {
        if (!*err)
            snprintf(err, errcap, "setup: %s", wb_strerror(rc));
        data_release(d);
        free(d);
        return rc;
    }
    if (d->role == WB_ROLE_TRAINER && !d->empty)
        wb_log(WB_LOG_INFO, "agent", "trainer rank %u: %u tasks, %u writes, %u shards (%llu bytes)",
               d->rank, d->table.ntasks, d->table.nwrites, d->nshards,
               (unsigned long long)d->param_bytes);
    else if (!d->empty)
        wb_log(WB_LOG_INFO, "agent", "rollout rank %u: %u local tensors (%llu bytes)", d->rank,
               d->recv.nlocal, (unsigned long long)d->local_bytes);
    data_free(*dp);
    *dp = d;
    /* No transport part in this build: nothing to publish. */
    *addr = NULL;
    *addr_len = 0;
    *regions = NULL;
    *regions_len = 0;
    return 0;
}

int data_peers(struct data *d, const void *peers, size_t len, char *err, size_t errcap)
{
    (void)d;
    (void)peers;
    (void)len;
    (void)err;
    (void)errcap;
    return 0;
}

int data_start(struct data *d, uint64_t version, char *err, size_t errcap)
{
    d->version = version;
    d->start_ns = wb_now_ns();
    d->fail[0] = 0;
    if (!d->empty && d->role == WB_ROLE_TRAINER) {
        /* The optimizer step: this version's weights, from the synthetic source. */
        for (uint32_t i = 0; i < d->nshards; i++) {
            struct shard *s = &d->shards[i];
            int rc = wb_synth_fill(s->meta.name, d->job.seed, version, s->meta.dtype,
                                   &s->meta.shape, &s->meta.box, s->buf);
            if (rc) {
                snprintf(err, errcap, "%s: cannot generate %s values", s->meta.name,
                         wb_dtype_name(s->meta.dtype));
                return rc;
            }
        }
        d->start_ns = wb_now_ns();
    }
    if (!d->empty)
        snprintf(d->fail, sizeof(d->fail),
                 "this build has no transport part (transport/transport.h), so the plan's "
                 "%llu bytes cannot be moved",
                 (unsigned long long)(d->role == WB_ROLE_TRAINER ? d->table.send_bytes
                                                                 : d->recv.recv_bytes));
    d->active = true;
    return 0;
}

int data_progress(struct data *d, struct data_done *out)
{
    if (!d->active)
        return 0;
    if (d->role == WB_ROLE_ROLLOUT && !d->empty)
        return 0; /* counters never reach the plan's counts without a transport */
    d->active = false;
    memset(out, 0, sizeof(*out));
    out->ok = d->fail[0] == 0;
    snprintf(out->err, sizeof(out->err), "%s", d->fail);
    out->stats.rank = d->rank;
    out->stats.cap = d->job.mem_cap;
    out->stats.total_ns = wb_now_ns() - d->start_ns;
    return 1;
}

void data_abort(struct data *d)
{
    d->active = false;
}

void data_free(struct data *d)
{
    if (!d)
        return;
    data_release(d);
    free(d);
}
