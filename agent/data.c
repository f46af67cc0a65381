/* data.c — the agent's data side: what SETUP, PEERS and TRANSFER do to memory and the
 * transport. A job without a model (control plane only) has empty plans: setup registers
 * nothing, a transfer moves nothing and finishes at once, which keeps the control plane
 * testable on its own. */
#include "agent/priv.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

struct data {
    enum wb_role role;
    uint32_t rank;
    struct agent_job job;
    bool empty; /* no plan: nothing to move */
    bool active;
    uint64_t version, start_ns;
};

int data_setup(struct data **dp, const struct wb_agent_opts *o, const struct agent_job *job,
               const void *plan, size_t plan_len, const void *shards, size_t shards_len,
               const void **addr, size_t *addr_len, const void **regions, size_t *regions_len,
               char *err, size_t errcap)
{
    (void)shards;
    (void)shards_len;
    (void)plan;
    if (plan_len) {
        snprintf(err, errcap, "this agent build cannot execute plans");
        return -ENOTSUP;
    }
    struct data *d = calloc(1, sizeof(*d));
    if (!d)
        return -ENOMEM;
    d->role = o->role;
    d->rank = o->rank;
    d->job = *job;
    d->empty = true;
    data_free(*dp);
    *dp = d;
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
    (void)err;
    (void)errcap;
    d->active = true;
    d->version = version;
    d->start_ns = wb_now_ns();
    return 0;
}

int data_progress(struct data *d, struct data_done *out)
{
    if (!d->active)
        return 0;
    d->active = false;
    memset(out, 0, sizeof(*out));
    out->ok = true;
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
    free(d);
}
