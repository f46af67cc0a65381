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
    bool done;    /* COMPLETE, ABORT or SKIPPED arrived */
    bool failed;
    uint64_t pushed_ns, started_ns, done_ns;
    struct wb_push_stats stats; /* skipped_by, the skipped list and the figures */
    int code; /* why it failed: the endpoint's fatal code (job ended...), 0: the version failed */
    char reason[WB_ERRMSG_MAX];
};

/* Pushes remembered (the unfinished ones and the newest finished); skips heard of versions
 * this rank has not pushed yet (another rank pushed past them first). */
enum { MAX_PUSHES = 64, MAX_HEARD = 64 };

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
    bool queue; /* push policy WB_PUSH_QUEUE */
    struct {
        uint64_t version, by;
    } heard[MAX_HEARD]; /* a ring */
    uint32_t nheard;
    /* skipped since the last transfer started: the next one's list */
    uint64_t since[WB_PUSH_SKIPPED_MAX];
    uint64_t nsince;
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

static struct push *push_find(struct ag_state *st, uint64_t version)
{
    for (uint32_t i = st->npushes; i-- > 0;)
        if (st->pushes[i].version == version)
            return &st->pushes[i];
    return NULL;
}

static void push_finish(struct ag_state *st, struct push *p, bool failed, const char *reason);

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
            char why[WB_ERRMSG_MAX];
            snprintf(why, sizeof(why), "%.400s", st->err);
            push_finish(st, &st->pushes[i], true, why);
            st->pushes[i].code = code;
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

/* A push's outcome is known: its waiters wake. Called with mu held. */
static void push_finish(struct ag_state *st, struct push *p, bool failed, const char *reason)
{
    p->done = p->sources = true;
    p->failed = failed;
    p->stats.failed = failed;
    p->done_ns = wb_now_ns();
    if (!p->started_ns)
        p->started_ns = p->done_ns;
    snprintf(p->reason, sizeof(p->reason), "%s", reason ? reason : "");
    if (!failed && !p->stats.skipped_by && p->version > st->pushed)
        st->pushed = p->version;
    pthread_cond_broadcast(&st->cv);
}

uint64_t ag_push_next(struct ag_state *st, bool *queue)
{
    uint64_t v = 0;
    pthread_mutex_lock(&st->mu);
    *queue = st->queue;
    for (uint32_t i = 0; i < st->npushes && !v; i++) {
        struct push *p = &st->pushes[i];
        if (p->done)
            continue;
        if (p->sent && st->queue) /* the next leaves once this one ended */
            break;
        if (!p->sent) {
            p->sent = true;
            v = p->version;
        }
    }
    pthread_mutex_unlock(&st->mu);
    return v;
}

void ag_push_skipped(struct ag_state *st, uint64_t version, uint64_t by)
{
    pthread_mutex_lock(&st->mu);
    struct push *p = push_find(st, version);
    bool known = p ? p->stats.skipped_by != 0 : false;
    for (uint32_t i = 0; !p && i < st->nheard && i < MAX_HEARD; i++)
        known |= st->heard[i].version == version;
    if (!known) { /* the first word on it is the one every rank heard first, too */
        if (p && !p->done) {
            p->stats.skipped_by = by;
            push_finish(st, p, false, NULL);
        } else if (!p) {
            st->heard[st->nheard % MAX_HEARD].version = version;
            st->heard[st->nheard % MAX_HEARD].by = by;
            st->nheard++;
        }
        if (!p || p->stats.skipped_by == by) {
            if (st->nsince < WB_PUSH_SKIPPED_MAX)
                st->since[st->nsince] = version;
            else { /* keep the newest */
                memmove(&st->since[0], &st->since[1], sizeof(st->since) - sizeof(st->since[0]));
                st->since[WB_PUSH_SKIPPED_MAX - 1] = version;
            }
            st->nsince++;
        }
    }
    pthread_mutex_unlock(&st->mu);
}

void ag_push_started(struct ag_state *st, uint64_t version)
{
    pthread_mutex_lock(&st->mu);
    struct push *p = push_find(st, version);
    if (p && !p->done) {
        p->started_ns = wb_now_ns();
        uint64_t n = st->nsince < WB_PUSH_SKIPPED_MAX ? st->nsince : WB_PUSH_SKIPPED_MAX;
        memcpy(p->stats.skipped, st->since, n * sizeof(st->since[0]));
        p->stats.nskipped = st->nsince;
    }
    st->nsince = 0; /* a transfer not pushed here (wb-ctl transfer) went in their place */
    pthread_mutex_unlock(&st->mu);
}

void ag_push_figures(struct ag_state *st, uint64_t version, const struct wb_xfer_stats *stats)
{
    pthread_mutex_lock(&st->mu);
    struct push *p = push_find(st, version);
    if (p) {
        p->stats.bytes = stats->bytes;
        p->stats.writes = stats->writes;
        memcpy(p->stats.stage_ns, stats->stage_ns, sizeof(p->stats.stage_ns));
        p->stats.xfer_ns = stats->total_ns;
    }
    pthread_mutex_unlock(&st->mu);
}

void ag_push_event(struct ag_state *st, uint64_t version, enum wb_push_event ev, bool failed,
                   const char *reason)
{
    pthread_mutex_lock(&st->mu);
    struct push *p = push_find(st, version);
    if (p && !p->done) {
        p->sources = true; /* done implies the sources are free too */
        if (ev == WB_PUSH_DONE || failed)
            push_finish(st, p, failed, reason);
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
    } else if (version == 0 || version <= st->pushed ||
               (st->npushes && version <= st->pushes[st->npushes - 1].version)) {
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
        if (!rc) {
            struct push *p = &st->pushes[st->npushes++];
            *p = (struct push){.version = version, .pushed_ns = wb_now_ns()};
            p->stats.version = version;
            /* another rank pushed past it first: the controller skipped it already */
            for (uint32_t i = 0; i < st->nheard && i < MAX_HEARD; i++)
                if (st->heard[i].version == version) {
                    p->sent = true;
                    p->stats.skipped_by = st->heard[i].by;
                    push_finish(st, p, false, NULL);
                }
        }
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
    } else if (!rc && p->stats.skipped_by) {
        rc = WB_PUSH_SKIPPED;
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

int ag_state_set_policy(struct ag_state *st, enum wb_push_policy policy)
{
    int rc = 0;
    pthread_mutex_lock(&st->mu);
    if (st->role != WB_ROLE_TRAINER || (policy != WB_PUSH_LATEST && policy != WB_PUSH_QUEUE)) {
        snprintf(st->err, sizeof(st->err),
                 "push policy: a trainer's, WB_PUSH_LATEST (0) or WB_PUSH_QUEUE (1)");
        rc = -EINVAL;
    } else if (st->npushes) {
        snprintf(st->err, sizeof(st->err), "push policy: set before the first push");
        rc = -EBUSY;
    } else {
        st->queue = policy == WB_PUSH_QUEUE;
    }
    pthread_mutex_unlock(&st->mu);
    return rc;
}

int ag_state_push_stats(struct ag_state *st, uint64_t version, struct wb_push_stats *out)
{
    int rc = 0;
    pthread_mutex_lock(&st->mu);
    struct push *p = push_find(st, version);
    if (!p) {
        snprintf(st->err, sizeof(st->err),
                 "version %" PRIu64 " was not pushed (or is older than the last %d pushes)",
                 version, MAX_PUSHES);
        rc = -EINVAL;
    } else if (!p->done) {
        snprintf(st->err, sizeof(st->err), "version %" PRIu64 ": no outcome yet", version);
        rc = -EAGAIN;
    } else {
        *out = p->stats;
        out->wait_ns = p->started_ns - p->pushed_ns;
        out->total_ns = p->done_ns - p->pushed_ns;
    }
    pthread_mutex_unlock(&st->mu);
    return rc;
}
