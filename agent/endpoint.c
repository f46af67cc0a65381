/* endpoint.c — the endpoint's public calls: open, add tensors, start the thread and wait for the
 * job to be ready, push and wait for pushed versions (trainers), wait for versions (rollouts),
 * close. They talk to the control loop (agent.c) only through the state under ep->mu: a call
 * records a request or waits on ep->cv for what the loop publishes, so a slow caller never
 * holds up heartbeats and a busy loop never blocks a caller beyond its time limit. */
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
        ep->o.give_up_ns = opts->role == WB_ROLE_ROLLOUT ? UINT64_MAX : 30ull * 1000000000;
    ep->role = wb_role_name(opts->role);
    ep->hb_ns = 200 * 1000000ull;
    ep->dead_ns = 10000 * 1000000ull;
    ep->hold_ns = 500 * 1000000ull;
    ep->wake_fd = -1;
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_mutex_init(&ep->mu, NULL);
    pthread_cond_init(&ep->cv, &ca);
    pthread_condattr_destroy(&ca);
    if (!err && (!opts->controller || !opts->token || (unsigned)opts->role >= WB_ROLE_COUNT))
        err = -EINVAL;
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
    pthread_cond_destroy(&ep->cv);
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

static void set_err(struct wb_endpoint *ep, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void set_err(struct wb_endpoint *ep, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ep->err, sizeof(ep->err), fmt, ap);
    va_end(ap);
}

int wb_endpoint_add(struct wb_endpoint *ep, const struct wb_tensor_reg *t)
{
    char err[512];
    pthread_mutex_lock(&ep->mu);
    int rc = ep->thread_started || ep->session ? -EBUSY : 0;
    if (rc)
        set_err(ep, "%s: tensors are added before the endpoint starts", t->name ? t->name : "?");
    else if ((rc = ag_regs_add(ep, t, err, sizeof(err))) != 0)
        set_err(ep, "%s", err);
    pthread_mutex_unlock(&ep->mu);
    return rc;
}

int wb_endpoint_set_source(struct wb_endpoint *ep, const struct wb_endpoint_source *src)
{
    int rc = 0;
    pthread_mutex_lock(&ep->mu);
    if (ep->o.role != WB_ROLE_TRAINER || ep->o.synthetic) {
        set_err(ep, "source: only a trainer endpoint reads its tensors from a source");
        rc = -EINVAL;
    } else if (!src || !src->read || (src->id && strlen(src->id) >= WB_SOURCE_MAX)) {
        set_err(ep, "source: a read function and an id of at most %d bytes", WB_SOURCE_MAX - 1);
        rc = -EINVAL;
    } else if (ep->nregs || ep->thread_started) {
        set_err(ep, "source: set before any tensor is added");
        rc = -EBUSY;
    } else {
        ep->src = *src;
        ep->src.id = NULL;
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
        set_err(ep, "mesh: 1 to %d dims, each named (at most %d bytes) with a size of at least 1",
                WB_REG_MESH_DIMS, WB_REG_MESH_NAME - 1);
    } else if (ep->nregs || ep->thread_started) {
        rc = -EBUSY;
        set_err(ep, "mesh: set before any tensor is added");
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

/* ---------------------------------------------------------------- state the loop publishes */

void ag_set_fatal(struct wb_endpoint *ep, int code, const char *fmt, ...)
{
    va_list ap;
    pthread_mutex_lock(&ep->mu);
    if (ep->fatal) { /* the first reason is the one to tell */
        pthread_mutex_unlock(&ep->mu);
        return;
    }
    va_start(ap, fmt);
    vsnprintf(ep->err, sizeof(ep->err), fmt, ap);
    va_end(ap);
    ep->fatal = code;
    for (uint32_t i = 0; i < ep->npushes; i++) /* nothing pending will happen now */
        if (!ep->pushes[i].done) {
            ep->pushes[i].done = ep->pushes[i].sources = ep->pushes[i].failed = true;
            snprintf(ep->pushes[i].reason, sizeof(ep->pushes[i].reason), "%.400s", ep->err);
        }
    pthread_cond_broadcast(&ep->cv);
    pthread_mutex_unlock(&ep->mu);
}

void ag_set_ready(struct wb_endpoint *ep, bool ready)
{
    pthread_mutex_lock(&ep->mu);
    ep->ready = ready;
    pthread_cond_broadcast(&ep->cv);
    pthread_mutex_unlock(&ep->mu);
}

static struct push *push_find(struct wb_endpoint *ep, uint64_t version)
{
    for (uint32_t i = ep->npushes; i-- > 0;)
        if (ep->pushes[i].version == version)
            return &ep->pushes[i];
    return NULL;
}

uint64_t ag_push_next(struct wb_endpoint *ep)
{
    uint64_t v = 0;
    pthread_mutex_lock(&ep->mu);
    for (uint32_t i = 0; i < ep->npushes && !v; i++)
        if (!ep->pushes[i].sent && !ep->pushes[i].done) {
            ep->pushes[i].sent = true;
            v = ep->pushes[i].version;
        }
    pthread_mutex_unlock(&ep->mu);
    return v;
}

void ag_push_event(struct wb_endpoint *ep, uint64_t version, enum wb_push_event ev, bool failed,
                   const char *reason)
{
    pthread_mutex_lock(&ep->mu);
    struct push *p = push_find(ep, version);
    if (p && !p->done) {
        p->sources = true; /* done implies the sources are free too */
        if (ev == WB_PUSH_DONE || failed) {
            p->done = true;
            p->failed = failed;
            snprintf(p->reason, sizeof(p->reason), "%s", reason ? reason : "");
            if (!failed && version > ep->version)
                ep->version = version;
        }
    }
    pthread_cond_broadcast(&ep->cv);
    pthread_mutex_unlock(&ep->mu);
}

void ag_version_torn(struct wb_endpoint *ep)
{
    pthread_mutex_lock(&ep->mu);
    ep->torn = true;
    pthread_mutex_unlock(&ep->mu);
}

void ag_version_done(struct wb_endpoint *ep, uint64_t version, bool failed, const char *reason)
{
    pthread_mutex_lock(&ep->mu);
    if (failed) { /* torn already says whether its windows opened (ag_version_torn) */
        ep->failed_version = version;
        snprintf(ep->failed_reason, sizeof(ep->failed_reason), "%s", reason ? reason : "");
    } else if (version > ep->version) {
        ep->version = version;
        ep->torn = false;
    }
    pthread_cond_broadcast(&ep->cv);
    pthread_mutex_unlock(&ep->mu);
}

void ag_version_lost(struct wb_endpoint *ep, const char *why)
{
    pthread_mutex_lock(&ep->mu);
    if (ep->version)
        wb_log(WB_LOG_WARN, "agent", "rollout rank %u: %s: it no longer holds version %" PRIu64,
               ep->o.rank, why, ep->version);
    ep->version = 0;
    ep->torn = false;
    pthread_cond_broadcast(&ep->cv);
    pthread_mutex_unlock(&ep->mu);
}

/* ---------------------------------------------------------------- waiting */

static struct timespec deadline_of(uint64_t timeout_ns)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    uint64_t ns = (uint64_t)ts.tv_nsec + timeout_ns % 1000000000ull;
    ts.tv_sec += (time_t)(timeout_ns / 1000000000ull + ns / 1000000000ull);
    ts.tv_nsec = (long)(ns % 1000000000ull);
    return ts;
}

/* Waits on cv until the deadline; -ETIMEDOUT when it passed. Called with mu held. */
static int wait_until(struct wb_endpoint *ep, const struct timespec *dl)
{
    int r = pthread_cond_timedwait(&ep->cv, &ep->mu, dl);
    return r == ETIMEDOUT ? -ETIMEDOUT : 0;
}

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
    if (pthread_create(&ep->thread, NULL, thread_main, ep)) {
        set_err(ep, "cannot start the endpoint's thread");
        pthread_mutex_unlock(&ep->mu);
        return -ENOMEM;
    }
    ep->thread_started = true;
    pthread_mutex_unlock(&ep->mu);
    return timeout_ns ? wb_endpoint_wait_ready(ep, timeout_ns) : 0;
}

int wb_endpoint_wait_ready(struct wb_endpoint *ep, uint64_t timeout_ns)
{
    struct timespec dl = deadline_of(timeout_ns);
    int rc = 0;
    pthread_mutex_lock(&ep->mu);
    while (!ep->ready && !ep->fatal && !rc)
        rc = wait_until(ep, &dl);
    if (ep->fatal)
        rc = ep->fatal;
    else if (rc)
        set_err(ep, "%s rank %u: the job was not ready within %.1f s (every agent must register)",
                ep->role, ep->o.rank, (double)timeout_ns / 1e9);
    pthread_mutex_unlock(&ep->mu);
    return rc;
}

int wb_endpoint_push(struct wb_endpoint *ep, uint64_t version)
{
    pthread_mutex_lock(&ep->mu);
    int rc = 0;
    if (ep->o.role != WB_ROLE_TRAINER) {
        set_err(ep, "push: rollouts do not push versions");
        rc = -EINVAL;
    } else if (ep->fatal) {
        rc = ep->fatal;
    } else if (version == 0 || version <= ep->version || push_find(ep, version)) {
        set_err(ep, "push: version %" PRIu64 " is not newer than the versions pushed before",
                version);
        rc = -EINVAL;
    } else {
        if (ep->npushes == MAX_PUSHES) { /* forget the oldest finished one */
            uint32_t k = 0;
            while (k < ep->npushes && !ep->pushes[k].done)
                k++;
            if (k == ep->npushes) {
                set_err(ep, "push: %d versions are still in flight", MAX_PUSHES);
                rc = -EBUSY;
            } else {
                memmove(&ep->pushes[k], &ep->pushes[k + 1],
                        (ep->npushes - k - 1) * sizeof(ep->pushes[0]));
                ep->npushes--;
            }
        }
        if (!rc)
            ep->pushes[ep->npushes++] = (struct push){.version = version};
    }
    pthread_mutex_unlock(&ep->mu);
    if (!rc)
        ag_wake(ep); /* the loop sleeps between transfers */
    return rc;
}

int wb_endpoint_wait_push(struct wb_endpoint *ep, uint64_t version, enum wb_push_event ev,
                          uint64_t timeout_ns)
{
    struct timespec dl = deadline_of(timeout_ns);
    int rc = 0;
    pthread_mutex_lock(&ep->mu);
    struct push *p = push_find(ep, version);
    if (!p) {
        set_err(ep, "version %" PRIu64 " was not pushed", version);
        rc = -EINVAL;
    }
    while (!rc && !(ev == WB_PUSH_SOURCES ? p->sources : p->done) && !p->failed) {
        rc = wait_until(ep, &dl);
        p = push_find(ep, version); /* the table may have moved */
        if (!p)
            rc = -EINVAL;
    }
    if (!rc && p->failed) {
        set_err(ep, "version %" PRIu64 " failed: %s", version, p->reason);
        rc = -WB_E_PEER;
    } else if (rc == -ETIMEDOUT) {
        set_err(ep, "version %" PRIu64 ": no %s within %.1f s", version,
                ev == WB_PUSH_SOURCES ? "release of the sources" : "outcome",
                (double)timeout_ns / 1e9);
    }
    pthread_mutex_unlock(&ep->mu);
    return rc;
}

int wb_endpoint_wait(struct wb_endpoint *ep, uint64_t version, uint64_t timeout_ns)
{
    struct timespec dl = deadline_of(timeout_ns);
    int rc = 0;
    pthread_mutex_lock(&ep->mu);
    while (!rc && ep->version < version && ep->failed_version != version && !ep->fatal)
        rc = wait_until(ep, &dl);
    if (ep->version >= version) {
        rc = 0;
    } else if (ep->failed_version == version) {
        if (ep->torn)
            set_err(ep,
                    "version %" PRIu64 " failed: %s (this rank's tensors are torn: parts of it may "
                    "have landed over version %" PRIu64 ")",
                    version, ep->failed_reason, ep->version);
        else
            set_err(ep,
                    "version %" PRIu64 " failed: %s (this rank still holds version %" PRIu64 ")",
                    version, ep->failed_reason, ep->version);
        rc = -WB_E_PEER;
    } else if (ep->fatal) {
        rc = -WB_E_PEER;
    } else {
        set_err(ep,
                "version %" PRIu64 " did not complete within %.1f s (this rank holds %" PRIu64 ")",
                version, (double)timeout_ns / 1e9, ep->version);
    }
    pthread_mutex_unlock(&ep->mu);
    return rc;
}

uint64_t wb_endpoint_version(struct wb_endpoint *ep)
{
    pthread_mutex_lock(&ep->mu);
    uint64_t v = ep->version;
    pthread_mutex_unlock(&ep->mu);
    return v;
}

bool wb_endpoint_torn(struct wb_endpoint *ep)
{
    pthread_mutex_lock(&ep->mu);
    bool t = ep->torn;
    pthread_mutex_unlock(&ep->mu);
    return t;
}

const char *wb_endpoint_error(struct wb_endpoint *ep)
{
    pthread_mutex_lock(&ep->mu);
    memcpy(ep->err_copy, ep->err, sizeof(ep->err_copy));
    pthread_mutex_unlock(&ep->mu);
    return ep->err_copy;
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
    pthread_cond_destroy(&ep->cv);
    pthread_mutex_destroy(&ep->mu);
    free(ep->s_controller);
    free(ep->s_token);
    free(ep->s_trace);
    free(ep->s_domain);
    free(ep->s_dump);
    free(ep->s_extra);
    free(ep->s_corrupt);
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
        pthread_mutex_lock(&ep->mu);
        set_err(ep, "%s: unknown dtype '%s'", name ? name : "?", dtype ? dtype : "");
        pthread_mutex_unlock(&ep->mu);
        return -EINVAL;
    }
    if (ndim == 0 || ndim > WB_MAX_DIMS) {
        pthread_mutex_lock(&ep->mu);
        set_err(ep, "%s: %u dimensions (1 to %d are supported)", name ? name : "?", ndim,
                WB_MAX_DIMS);
        pthread_mutex_unlock(&ep->mu);
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
