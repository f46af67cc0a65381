/* endpoint.c — the endpoint's public calls: open, add tensors, start the thread and wait for the
 * job to be ready, push and wait for pushed versions (trainers), wait for versions (rollouts),
 * close. They talk to the control loop (loop.c) only through what state.c holds: a call
 * records a request or waits for what the loop publishes, so a slow caller never holds up
 * heartbeats and a busy loop never blocks a caller beyond its time limit. */
#include "agent/priv.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

static char *dup_opt(const char *s, int *err)
{
    if (!s)
        return NULL;
    char *d = strdup(s);
    if (!d)
        *err = -ENOMEM;
    return d;
}

int wb_endpoint_open(const struct wb_endpoint_opts *opts, struct wb_endpoint **out)
{
    struct wb_endpoint *ep = calloc(1, sizeof(*ep));
    if (!ep)
        return -ENOMEM;
    int err = 0;
    ep->o = *opts;
    ep->o.controller = ep->s_controller = dup_opt(opts->controller, &err);
    ep->o.token = ep->s_token = dup_opt(opts->token, &err);
    ep->o.trace = ep->s_trace = dup_opt(opts->trace, &err);
    ep->o.tx_domain = ep->s_domain = dup_opt(opts->tx_domain, &err);
    ep->o.dump = ep->s_dump = dup_opt(opts->dump, &err);
    ep->o.tx_extra = ep->s_extra = dup_opt(opts->tx_extra, &err);
    ep->o.corrupt = ep->s_corrupt = dup_opt(opts->corrupt, &err);
    if (!ep->o.give_up_ns) /* a rollout holds the weights: it outlives any controller outage */
        ep->o.give_up_ns =
            opts->role == WB_ROLE_ROLLOUT ? UINT64_MAX : AG_DEFAULTS.give_up_trainer_ns;
    ep->role = wb_role_name(opts->role);
    ep->hb_ns = AG_DEFAULTS.heartbeat_ns;
    ep->dead_ns = AG_DEFAULTS.dead_ns;
    ep->hold_ns = AG_DEFAULTS.poll_hold_ns;
    ep->wake_fd = -1;
    pthread_mutex_init(&ep->mu, NULL);
    if (!err && (!opts->controller || !opts->token || (unsigned)opts->role >= WB_ROLE_COUNT))
        err = -EINVAL;
    err = err ? err : ag_state_new(opts->role, opts->rank, &ep->st);
    if (!err && (ep->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) < 0)
        err = -errno;
    err = err ? err : wb_chan_open(&ep->call, opts->controller, opts->token);
    if (err)
        goto err_free;
    err = wb_chan_open(&ep->pollc, opts->controller, opts->token);
    if (err)
        goto err_call;
    *out = ep;
    return 0;

err_call:
    wb_chan_close(&ep->call);
err_free:
    if (ep->wake_fd >= 0)
        close(ep->wake_fd);
    ag_state_free(ep->st);
    pthread_mutex_destroy(&ep->mu);
    free(ep->s_controller);
    free(ep->s_token);
    free(ep->s_trace);
    free(ep->s_domain);
    free(ep->s_dump);
    free(ep->s_extra);
    free(ep->s_corrupt);
    free(ep);
    return err;
}

int wb_endpoint_add(struct wb_endpoint *ep, const struct wb_tensor_reg *t)
{
    char err[512];
    pthread_mutex_lock(&ep->mu);
    int rc = ep->thread_started || ep->session ? -EBUSY : 0;
    if (rc)
        ag_state_say(ep->st, "%s: tensors are added before the endpoint starts",
                     t->name ? t->name : "?");
    else if ((rc = ag_regs_add(ep, t, err, sizeof(err))) != 0)
        ag_state_say(ep->st, "%s", err);
    pthread_mutex_unlock(&ep->mu);
    return rc;
}

int wb_endpoint_set_source(struct wb_endpoint *ep, const struct wb_endpoint_source *src)
{
    int rc = 0;
    pthread_mutex_lock(&ep->mu);
    if (ep->o.role != WB_ROLE_TRAINER || ep->o.synthetic) {
        ag_state_say(ep->st, "source: only a trainer endpoint reads its tensors from a source");
        rc = -EINVAL;
    } else if (!src || !src->read || (src->id && strlen(src->id) >= WB_SOURCE_MAX)) {
        ag_state_say(ep->st, "source: a read function and an id of at most %d bytes",
                     WB_SOURCE_MAX - 1);
        rc = -EINVAL;
    } else if (ep->nregs || ep->thread_started) {
        ag_state_say(ep->st, "source: set before any tensor is added");
        rc = -EBUSY;
    } else if (src->ndigests && !src->digests) {
        ag_state_say(ep->st, "source: digests for %u tensors, and no memory holding them",
                     src->ndigests);
        rc = -EINVAL;
    } else if (src->ndigests && !(ep->src_digests = malloc((size_t)src->ndigests * 16))) {
        ag_state_say(ep->st, "source: no memory for its %u digests", src->ndigests);
        rc = -ENOMEM;
    } else {
        ep->src = *src;
        ep->src.id = NULL;
        ep->src.digests = NULL;
        if (src->ndigests)
            memcpy(ep->src_digests, src->digests, (size_t)src->ndigests * 16);
        ep->src_ndigests = src->ndigests;
        if (!ep->src.threads)
            ep->src.threads = 2;
        snprintf(ep->src_id, sizeof(ep->src_id), "%s", src->id ? src->id : "");
        ep->sourced = true;
    }
    pthread_mutex_unlock(&ep->mu);
    return rc;
}

int wb_endpoint_set_mesh(struct wb_endpoint *ep, uint32_t ndims, const char *const *names,
                         const uint32_t *sizes)
{
    struct wb_reg_mesh m = {.ndims = ndims};
    int rc = ndims == 0 || ndims > WB_REG_MESH_DIMS ? -EINVAL : 0;
    for (uint32_t d = 0; !rc && d < ndims; d++) {
        if (!sizes[d] || !names[d] || !*names[d] || strlen(names[d]) >= WB_REG_MESH_NAME)
            rc = -EINVAL;
        else
            snprintf(m.name[d], sizeof(m.name[d]), "%s", names[d]);
        m.size[d] = sizes[d];
    }
    pthread_mutex_lock(&ep->mu);
    if (rc) {
        ag_state_say(ep->st,
                     "mesh: 1 to %d dims, each named (at most %d bytes) with a size of at least 1",
                     WB_REG_MESH_DIMS, WB_REG_MESH_NAME - 1);
    } else if (ep->nregs || ep->thread_started) {
        rc = -EBUSY;
        ag_state_say(ep->st, "mesh: set before any tensor is added");
    } else {
        ep->mesh = m;
    }
    pthread_mutex_unlock(&ep->mu);
    return rc;
}

void wb_endpoint_set_hook(struct wb_endpoint *ep, wb_endpoint_hook fn, void *arg)
{
    pthread_mutex_lock(&ep->mu);
    ep->hook = fn;
    ep->hook_arg = arg;
    pthread_mutex_unlock(&ep->mu);
}

/* ---------------------------------------------------------------- the thread and the waits */

static void *thread_main(void *arg)
{
    struct wb_endpoint *ep = arg;
    ag_loop(ep);
    return NULL;
}

int wb_endpoint_start(struct wb_endpoint *ep, uint64_t timeout_ns)
{
    pthread_mutex_lock(&ep->mu);
    if (ep->thread_started) {
        pthread_mutex_unlock(&ep->mu);
        return -EBUSY;
    }
    if (ep->src_ndigests && ep->src_ndigests != ep->nregs) {
        ag_state_say(ep->st, "source: digests for %u tensors, %u added", ep->src_ndigests,
                     ep->nregs);
        pthread_mutex_unlock(&ep->mu);
        return -EINVAL;
    }
    if (pthread_create(&ep->thread, NULL, thread_main, ep)) {
        ag_state_say(ep->st, "cannot start the endpoint's thread");
        pthread_mutex_unlock(&ep->mu);
        return -ENOMEM;
    }
    ep->thread_started = true;
    pthread_mutex_unlock(&ep->mu);
    return timeout_ns ? wb_endpoint_wait_ready(ep, timeout_ns) : 0;
}

/* Which agents the job waits for, asked of the controller (a STATUS request on a connection of
 * its own, 2 s at most): "" when it cannot say. */
static void missing_ranks(struct wb_endpoint *ep, char *out, size_t cap)
{
    struct wb_chan ch;
    struct wb_mpw w;
    void *buf = NULL;
    size_t len = 0;
    out[0] = 0;
    if (wb_chan_open(&ch, ep->o.controller, ep->o.token))
        return;
    wb_mpw_init(&w);
    wb_msg_encode(&w, WB_MSG_CTL_STATUS, ep->o.token, NULL);
    if (!w.err && wb_chan_call(&ch, &w, 2000000000ull, &buf, &len) == 0) {
        struct wb_msg m;
        struct wb_body_status st;
        const char *why;
        char whybuf[64];
        if (wb_msg_open(buf, len, ep->o.token, &m, &why) == 0 && m.type == WB_MSG_STATUS &&
            wb_msg_decode(&m, &st, whybuf, sizeof(whybuf)) == 0 &&
            wb_status_missing(&st, out, cap) <= 0)
            out[0] = 0;
        wb_chan_free(buf);
    }
    wb_mpw_free(&w);
    wb_chan_close(&ch);
}

int wb_endpoint_wait_ready(struct wb_endpoint *ep, uint64_t timeout_ns)
{
    int rc = ag_state_wait_ready(ep->st, timeout_ns);
    if (rc == -ETIMEDOUT) { /* name the agents it waits for, every one */
        char missing[2048];
        missing_ranks(ep, missing, sizeof(missing));
        if (missing[0])
            ag_state_say(ep->st, "%s rank %u: the job was not ready within %.1f s: waiting for %s",
                         ep->role, ep->o.rank, (double)timeout_ns / 1e9, missing);
    }
    return rc;
}

int wb_endpoint_push(struct wb_endpoint *ep, uint64_t version)
{
    int rc = ag_state_push(ep->st, version);
    if (!rc)
        ag_wake(ep); /* the loop sleeps between transfers */
    return rc;
}

int wb_endpoint_wait_push(struct wb_endpoint *ep, uint64_t version, enum wb_push_event ev,
                          uint64_t timeout_ns)
{
    return ag_state_wait_push(ep->st, version, ev, timeout_ns);
}

int wb_endpoint_set_push_policy(struct wb_endpoint *ep, enum wb_push_policy policy)
{
    return ag_state_set_policy(ep->st, policy);
}

int wb_endpoint_push_stats(struct wb_endpoint *ep, uint64_t version, struct wb_push_stats *out)
{
    return ag_state_push_stats(ep->st, version, out);
}

int wb_endpoint_wait(struct wb_endpoint *ep, uint64_t version, uint64_t timeout_ns)
{
    return ag_state_wait_version(ep->st, version, timeout_ns);
}

uint64_t wb_endpoint_version(struct wb_endpoint *ep)
{
    return ag_state_version(ep->st);
}

bool wb_endpoint_torn(struct wb_endpoint *ep)
{
    return ag_state_torn(ep->st);
}

const char *wb_endpoint_error(struct wb_endpoint *ep)
{
    return ag_state_error(ep->st);
}

int wb_endpoint_run(struct wb_endpoint *ep)
{
    return ag_loop(ep);
}

void wb_endpoint_close(struct wb_endpoint *ep)
{
    if (!ep)
        return;
    pthread_mutex_lock(&ep->mu);
    ep->stop = true;
    bool joined = ep->thread_started;
    pthread_mutex_unlock(&ep->mu);
    ag_wake(ep);
    if (joined)
        pthread_join(ep->thread, NULL);
    for (size_t i = 0; i < ep->nq; i++)
        wb_mpw_free(&ep->queue[i]);
    ag_dump_wait(ep);
    ag_data_free(ep->d); /* releases the transport and its registrations first */
    ag_regs_free(ep);
    wb_chan_close(&ep->pollc);
    wb_chan_close(&ep->call);
    close(ep->wake_fd);
    ag_state_free(ep->st);
    pthread_mutex_destroy(&ep->mu);
    free(ep->s_controller);
    free(ep->s_token);
    free(ep->s_trace);
    free(ep->s_domain);
    free(ep->s_dump);
    free(ep->s_extra);
    free(ep->s_corrupt);
    free(ep->src_digests);
    free(ep);
}

/* ---------------------------------------------------------------- for language bindings */

int wb_endpoint_open_args(const char *controller, const char *role, uint32_t rank,
                          const char *token, int32_t device, const char *tx_domain,
                          const char *tx_extra, const char *dump, const char *trace,
                          uint64_t give_up_ns, struct wb_endpoint **out, const char **why)
{
    struct wb_endpoint_opts o = {.rank = rank,
                                 .device = device,
                                 .controller = controller,
                                 .token = token,
                                 .tx_domain = tx_domain,
                                 .tx_extra = tx_extra,
                                 .dump = dump,
                                 .trace = trace,
                                 .give_up_ns = give_up_ns};
    *why = NULL;
    if (!role || wb_role_parse(role, &o.role))
        *why = "role: expected trainer or rollout";
    else if (!controller || !*controller)
        *why = "controller: an nng URL such as tcp://host:7420 is required";
    else if (!token || !*token)
        *why = "token: the cluster token is required (or $WB_TOKEN)";
    else if (device < -1)
        *why = "device: a GPU index, or -1 for host memory";
    if (*why)
        return -EINVAL;
    int rc = wb_endpoint_open(&o, out);
    if (rc == -EINVAL)
        *why = "controller: not a usable nng URL";
    return rc;
}

int wb_endpoint_add_args(struct wb_endpoint *ep, const char *name, const char *dtype, uint32_t ndim,
                         const uint64_t *shape, const uint64_t *box_off, const uint64_t *box_ext,
                         const int64_t *strides, void *ptr, const int32_t *placement)
{
    struct wb_tensor_reg t = {.name = name, .strides = strides, .ptr = ptr, .placement = placement};
    if (!dtype || wb_dtype_parse(dtype, &t.dtype)) {
        ag_state_say(ep->st, "%s: unknown dtype '%s'", name ? name : "?", dtype ? dtype : "");
        return -EINVAL;
    }
    if (ndim == 0 || ndim > WB_MAX_DIMS) {
        ag_state_say(ep->st, "%s: %u dimensions (1 to %d are supported)", name ? name : "?", ndim,
                     WB_MAX_DIMS);
        return -EINVAL;
    }
    t.shape.ndim = t.box.ndim = ndim;
    for (uint32_t d = 0; d < ndim; d++) {
        t.shape.dim[d] = shape[d];
        t.box.off[d] = box_off ? box_off[d] : 0;
        t.box.ext[d] = box_ext ? box_ext[d] : shape[d];
    }
    return wb_endpoint_add(ep, &t);
}
