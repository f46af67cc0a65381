/* state.c — what the control loop publishes and the public calls wait on: readiness, the
 * failure that stopped the loop, the last error message, the versions this rank holds and the
 * pushes its process asked for. One mutex and one condition guard all of it; the loop
 * (loop.c) writes through the ag_set_*, ag_push_* and ag_version_* calls, the public calls
 * (endpoint.c) read and wait through the ag_state_* ones. Nothing here calls back: the state
 * knows neither the loop nor the data side.
 *
 * The versions, one field per meaning (the loop's own — the attempt in flight, a drain due, a
 * commit behind a dump — are struct loop_versions, priv.h):
 *   held    rollouts: the version the tensors hold whole (0: none)
 *   pushed  trainers: the newest push that completed
 *   failed  rollouts: the last version whose attempt failed here (failed_reason says why)
 *   torn    rollouts: an attempt reached the tensors and did not complete, so they may hold
 *           parts of it; until a version completes (or the tensors are lost) */
#include "agent/priv.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* A pushed version as the trainer's process sees it. */
struct push {
    uint64_t version;
    bool sent;    /* PUSH went to the controller */
    bool sources; /* this rank's executor no longer reads its tensors */
    bool done;    /* COMPLETE or ABORT arrived */
    bool failed;
    int code; /* why it failed: the endpoint's fatal code (job ended...), 0: the version failed */
    char reason[WB_ERRMSG_MAX];
};

enum { MAX_PUSHES = 16 };

struct ag_state {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    enum wb_role role;
    uint32_t rank;
    bool ready;     /* the controller said READY */
    int fatal;      /* the loop stopped with this code (0: running) */
    char err[4096]; /* the last failure's message */
    uint64_t held, pushed, failed;
    char failed_reason[WB_ERRMSG_MAX];
    bool torn;
    struct push pushes[MAX_PUSHES];
    uint32_t npushes;
    char err_copy[4096]; /* ag_state_error()'s snapshot */
};

int ag_state_new(enum wb_role role, uint32_t rank, struct ag_state **out)
{
    struct ag_state *st = calloc(1, sizeof(*st));
    if (!st)
        return -ENOMEM;
    st->role = role;
    st->rank = rank;
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_mutex_init(&st->mu, NULL);
    pthread_cond_init(&st->cv, &ca);
    pthread_condattr_destroy(&ca);
    *out = st;
    return 0;
}

void ag_state_free(struct ag_state *st)
{
    if (!st)
        return;
    pthread_cond_destroy(&st->cv);
    pthread_mutex_destroy(&st->mu);
    free(st);
}

static void vsay(struct ag_state *st, const char *fmt, va_list ap)
{
    vsnprintf(st->err, sizeof(st->err), fmt, ap);
}

void ag_state_say(struct ag_state *st, const char *fmt, ...)
{
    va_list ap;
    pthread_mutex_lock(&st->mu);
    va_start(ap, fmt);
    vsay(st, fmt, ap);
    va_end(ap);
    pthread_mutex_unlock(&st->mu);
}

const char *ag_state_error(struct ag_state *st)
{
    pthread_mutex_lock(&st->mu);
    memcpy(st->err_copy, st->err, sizeof(st->err_copy));
    pthread_mutex_unlock(&st->mu);
    return st->err_copy;
}

uint64_t ag_state_version(struct ag_state *st)
{
    pthread_mutex_lock(&st->mu);
    uint64_t v = st->role == WB_ROLE_TRAINER ? st->pushed : st->held;
    pthread_mutex_unlock(&st->mu);
    return v;
}

bool ag_state_torn(struct ag_state *st)
{
    pthread_mutex_lock(&st->mu);
    bool t = st->torn;
    pthread_mutex_unlock(&st->mu);
    return t;
}

/* ---------------------------------------------------------------- what the loop publishes */

void ag_set_fatal(struct ag_state *st, int code, const char *fmt, ...)
{
    va_list ap;
    pthread_mutex_lock(&st->mu);
    if (st->fatal) { /* the first reason is the one to tell */
        pthread_mutex_unlock(&st->mu);
        return;
    }
    va_start(ap, fmt);
    vsay(st, fmt, ap);
    va_end(ap);
    st->fatal = code;
    for (uint32_t i = 0; i < st->npushes; i++) /* nothing pending will happen now */
        if (!st->pushes[i].done) {
            st->pushes[i].done = st->pushes[i].sources = st->pushes[i].failed = true;
            st->pushes[i].code = code;
            snprintf(st->pushes[i].reason, sizeof(st->pushes[i].reason), "%.400s", st->err);
        }
    pthread_cond_broadcast(&st->cv);
    pthread_mutex_unlock(&st->mu);
}

void ag_set_ready(struct ag_state *st, bool ready)
{
    pthread_mutex_lock(&st->mu);
    st->ready = ready;
    pthread_cond_broadcast(&st->cv);
    pthread_mutex_unlock(&st->mu);
}

static struct push *push_find(struct ag_state *st, uint64_t version)
{
    for (uint32_t i = st->npushes; i-- > 0;)
        if (st->pushes[i].version == version)
            return &st->pushes[i];
    return NULL;
}

uint64_t ag_push_next(struct ag_state *st)
{
    uint64_t v = 0;
    pthread_mutex_lock(&st->mu);
    for (uint32_t i = 0; i < st->npushes && !v; i++)
        if (!st->pushes[i].sent && !st->pushes[i].done) {
            st->pushes[i].sent = true;
            v = st->pushes[i].version;
        }
    pthread_mutex_unlock(&st->mu);
    return v;
}

void ag_push_event(struct ag_state *st, uint64_t version, enum wb_push_event ev, bool failed,
                   const char *reason)
{
    pthread_mutex_lock(&st->mu);
    struct push *p = push_find(st, version);
    if (p && !p->done) {
        p->sources = true; /* done implies the sources are free too */
        if (ev == WB_PUSH_DONE || failed) {
            p->done = true;
            p->failed = failed;
            snprintf(p->reason, sizeof(p->reason), "%s", reason ? reason : "");
            if (!failed && version > st->pushed)
                st->pushed = version;
        }
    }
    pthread_cond_broadcast(&st->cv);
    pthread_mutex_unlock(&st->mu);
}

void ag_version_torn(struct ag_state *st)
{
    pthread_mutex_lock(&st->mu);
    st->torn = true;
    pthread_mutex_unlock(&st->mu);
}

void ag_version_done(struct ag_state *st, uint64_t version, bool failed, const char *reason)
{
    pthread_mutex_lock(&st->mu);
    if (failed) { /* torn already says whether its windows opened (ag_version_torn) */
        st->failed = version;
        snprintf(st->failed_reason, sizeof(st->failed_reason), "%s", reason ? reason : "");
    } else if (version > st->held) {
        st->held = version;
        st->torn = false;
    }
    pthread_cond_broadcast(&st->cv);
    pthread_mutex_unlock(&st->mu);
}

void ag_version_lost(struct ag_state *st, const char *why)
{
    pthread_mutex_lock(&st->mu);
    if (st->held)
        wb_log(WB_LOG_WARN, "agent", "rollout rank %u: %s: it no longer holds version %" PRIu64,
               st->rank, why, st->held);
    st->held = 0;
    st->torn = false;
    pthread_cond_broadcast(&st->cv);
    pthread_mutex_unlock(&st->mu);
}

/* ---------------------------------------------------------------- what the public calls ask */

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
static int wait_until(struct ag_state *st, const struct timespec *dl)
{
    int r = pthread_cond_timedwait(&st->cv, &st->mu, dl);
    return r == ETIMEDOUT ? -ETIMEDOUT : 0;
}

int ag_state_wait_ready(struct ag_state *st, uint64_t timeout_ns)
{
    struct timespec dl = deadline_of(timeout_ns);
    int rc = 0;
    pthread_mutex_lock(&st->mu);
    while (!st->ready && !st->fatal && !rc)
        rc = wait_until(st, &dl);
    if (st->fatal)
        rc = st->fatal;
    else if (rc)
        snprintf(st->err, sizeof(st->err),
                 "%s rank %u: the job was not ready within %.1f s (every agent must register)",
                 wb_role_name(st->role), st->rank, (double)timeout_ns / 1e9);
    pthread_mutex_unlock(&st->mu);
    return rc;
}

int ag_state_push(struct ag_state *st, uint64_t version)
{
    pthread_mutex_lock(&st->mu);
    int rc = 0;
    if (st->role != WB_ROLE_TRAINER) {
        snprintf(st->err, sizeof(st->err), "push: rollouts do not push versions");
        rc = -EINVAL;
    } else if (st->fatal) {
        rc = st->fatal;
    } else if (version == 0 || version <= st->pushed || push_find(st, version)) {
        snprintf(st->err, sizeof(st->err),
                 "push: version %" PRIu64 " is not newer than the versions pushed before", version);
        rc = -EINVAL;
    } else {
        if (st->npushes == MAX_PUSHES) { /* forget the oldest finished one */
            uint32_t k = 0;
            while (k < st->npushes && !st->pushes[k].done)
                k++;
            if (k == st->npushes) {
                snprintf(st->err, sizeof(st->err), "push: %d versions are still in flight",
                         MAX_PUSHES);
                rc = -EBUSY;
            } else {
                memmove(&st->pushes[k], &st->pushes[k + 1],
                        (st->npushes - k - 1) * sizeof(st->pushes[0]));
                st->npushes--;
            }
        }
        if (!rc)
            st->pushes[st->npushes++] = (struct push){.version = version};
    }
    pthread_mutex_unlock(&st->mu);
    return rc;
}

int ag_state_wait_push(struct ag_state *st, uint64_t version, enum wb_push_event ev,
                       uint64_t timeout_ns)
{
    struct timespec dl = deadline_of(timeout_ns);
    int rc = 0;
    pthread_mutex_lock(&st->mu);
    struct push *p = push_find(st, version);
    if (!p) {
        snprintf(st->err, sizeof(st->err), "version %" PRIu64 " was not pushed", version);
        rc = -EINVAL;
    }
    while (!rc && !(ev == WB_PUSH_SOURCES ? p->sources : p->done) && !p->failed) {
        rc = wait_until(st, &dl);
        p = push_find(st, version); /* the table may have moved */
        if (!p)
            rc = -EINVAL;
    }
    if (!rc && p->failed) {
        snprintf(st->err, sizeof(st->err), "version %" PRIu64 " failed: %s", version, p->reason);
        rc = p->code ? p->code : -WB_E_PEER;
    } else if (rc == -ETIMEDOUT) {
        snprintf(st->err, sizeof(st->err), "version %" PRIu64 ": no %s within %.1f s", version,
                 ev == WB_PUSH_SOURCES ? "release of the sources" : "outcome",
                 (double)timeout_ns / 1e9);
    }
    pthread_mutex_unlock(&st->mu);
    return rc;
}

int ag_state_wait_version(struct ag_state *st, uint64_t version, uint64_t timeout_ns)
{
    struct timespec dl = deadline_of(timeout_ns);
    int rc = 0;
    pthread_mutex_lock(&st->mu);
    /* a trainer holds what it pushed; a rollout what completed on it */
    uint64_t *have = st->role == WB_ROLE_TRAINER ? &st->pushed : &st->held;
    while (!rc && *have < version && st->failed != version && !st->fatal)
        rc = wait_until(st, &dl);
    if (*have >= version) {
        rc = 0;
    } else if (st->failed == version) {
        if (st->torn)
            snprintf(st->err, sizeof(st->err),
                     "version %" PRIu64 " failed: %s (this rank's tensors are torn: parts of it "
                     "may have landed over version %" PRIu64 ")",
                     version, st->failed_reason, *have);
        else
            snprintf(st->err, sizeof(st->err),
                     "version %" PRIu64 " failed: %s (this rank still holds version %" PRIu64 ")",
                     version, st->failed_reason, *have);
        rc = -WB_E_PEER;
    } else if (st->fatal) {
        rc = st->fatal; /* what ended the endpoint (-WB_E_ENDED: the job was shut down) */
    } else {
        snprintf(st->err, sizeof(st->err),
                 "version %" PRIu64 " did not complete within %.1f s (this rank holds %" PRIu64 ")",
                 version, (double)timeout_ns / 1e9, *have);
    }
    pthread_mutex_unlock(&st->mu);
    return rc;
}
