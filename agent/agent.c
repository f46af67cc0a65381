/* agent.c — the agent's control loop: register with the controller, heartbeat, long-poll for
 * commands, run them on the data side (data.c) and report back.
 *
 * One thread, never blocking: the loop polls the two channel fds with a short timeout and
 * calls ag_data_progress() between polls, so the executor advances while control messages flow.
 * Two REQ channels because a REQ socket has one request in flight: the "poll" channel is
 * parked at the controller most of the time, the "call" channel carries registers, heartbeats
 * and reports, answered at once. Reports go out in order through a small queue. */
#include "agent/priv.h"

#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

enum { MAX_QUEUED = 64 };

struct wb_agent {
    struct wb_agent_opts o;
    struct wb_chan call, pollc;
    const char *role;
    /* session */
    uint64_t session;
    uint64_t hb_ns, dead_ns, hold_ns;
    uint64_t last_heard; /* last reply from the controller */
    uint64_t next_hb;
    bool call_is_report; /* the call in flight is queue[0] */
    bool registering;
    uint64_t retry_at; /* no register before this time */
    uint64_t last_seq; /* last command handled */
    bool exiting;
    /* reports waiting for the call channel, encoded */
    struct wb_mpw queue[MAX_QUEUED];
    size_t nq;
    /* data side */
    struct agent_job job;
    struct data *d;
    bool xfer_active;
    uint64_t xfer_version;
    uint64_t version; /* rollouts: last complete version */
    bool in_flight;
    uint64_t pace_until;
};

static const char *M = "agent";

/* ---------------------------------------------------------------- sending */

static void send_register(struct wb_agent *a)
{
    struct wb_mpw w, inv;
    struct wb_body_register b = {.rank = a->o.rank, .device = a->o.device};
    snprintf(b.role, sizeof(b.role), "%s", a->role);
    gethostname(b.host, sizeof(b.host) - 1);
    b.pid = (uint64_t)getpid();
    /* The synthetic source holds exactly the shards the plan assigns (sent in SETUP), so the
     * inventory registered here is empty; a source with its own tensors lists them. */
    wb_mpw_init(&inv);
    wb_mpw_array(&inv, 0);
    b.inv = (struct wb_bytes){inv.buf, inv.len};
    wb_mpw_init(&w);
    wb_msg_encode(&w, WB_MSG_REGISTER, a->o.token, &b);
    int err = wb_chan_send(&a->call, &w);
    wb_mpw_free(&w);
    wb_mpw_free(&inv);
    wb_log(WB_LOG_DEBUG, M, "%s rank %u: register sent: %s", a->role, a->o.rank, wb_strerror(err));
    a->registering = err == 0;
    a->call_is_report = false;
}

/* This agent's session header (the first member of every call after REGISTER). */
static struct wb_session session_of(const struct wb_agent *a)
{
    struct wb_session s = {.rank = a->o.rank, .session = a->session};
    snprintf(s.role, sizeof(s.role), "%s", a->role);
    return s;
}

static void send_poll(struct wb_agent *a)
{
    struct wb_mpw w;
    struct wb_body_poll b = {session_of(a), a->last_seq};
    wb_mpw_init(&w);
    wb_msg_encode(&w, WB_MSG_POLL, a->o.token, &b);
    wb_chan_send(&a->pollc, &w);
    wb_mpw_free(&w);
}

/* Queues a report (a body of `type` whose first member is the session header, filled here); it
 * leaves when the call channel is free. */
static void report(struct wb_agent *a, uint32_t type, void *body)
{
    if (a->nq == MAX_QUEUED) {
        wb_log(WB_LOG_ERROR, M, "%s rank %u: report queue full", a->role, a->o.rank);
        return;
    }
    *(struct wb_session *)body = session_of(a);
    struct wb_mpw *w = &a->queue[a->nq++];
    wb_mpw_init(w);
    wb_msg_encode(w, type, a->o.token, body);
}

static void pump_calls(struct wb_agent *a, uint64_t now)
{
    if (a->call.busy || !a->session)
        return;
    if (a->nq) { /* queue[0] leaves the queue when its reply arrives */
        if (wb_chan_send(&a->call, &a->queue[0]) == 0)
            a->call_is_report = true;
        return;
    }
    if (now >= a->next_hb) {
        struct wb_mpw w;
        struct wb_body_heartbeat b = {session_of(a), a->version, a->in_flight};
        wb_mpw_init(&w);
        wb_msg_encode(&w, WB_MSG_HEARTBEAT, a->o.token, &b);
        if (wb_chan_send(&a->call, &w) == 0)
            a->call_is_report = false;
        wb_mpw_free(&w);
        a->next_hb = now + a->hb_ns;
    }
}

/* ---------------------------------------------------------------- session */

static void lose_session(struct wb_agent *a, const char *why)
{
    wb_log(WB_LOG_WARN, M, "%s rank %u: %s: registering again", a->role, a->o.rank, why);
    a->session = 0;
    a->last_seq = 0;
    for (size_t i = 0; i < a->nq; i++)
        wb_mpw_free(&a->queue[i]);
    a->nq = 0;
    if (a->xfer_active && a->d)
        ag_data_abort(a->d);
    a->xfer_active = false;
    a->in_flight = false;
    a->pollc.busy = false;
}

/* Handles an ERROR reply; returns a negative code when the agent must stop. */
static int on_error_reply(struct wb_agent *a, const struct wb_msg *m)
{
    struct wb_body_error e;
    char why[WB_ERRMSG_MAX];
    if (wb_msg_decode(m, &e, why, sizeof(why))) {
        wb_log(WB_LOG_ERROR, M, "reply from controller: %s", why);
        return 0;
    }
    if (e.code == -WB_E_TOKEN) {
        fprintf(stderr, "wb-agent: %s rank %u: controller %s: %s\n", a->role, a->o.rank,
                a->o.controller, e.msg);
        return -WB_E_TOKEN;
    }
    if (e.code == -WB_E_PEER) {
        lose_session(a, e.msg);
        return 0;
    }
    if (e.code == -EADDRINUSE && a->registering) { /* another live process holds the rank */
        wb_log(WB_LOG_WARN, M, "%s", e.msg);
        a->registering = false;
        a->retry_at = wb_now_ns() + a->hb_ns;
        return 0;
    }
    fprintf(stderr, "wb-agent: %s rank %u: controller %s: %s\n", a->role, a->o.rank,
            a->o.controller, e.msg);
    return a->registering ? -EINVAL : 0;
}

static void report_pop(struct wb_agent *a)
{
    wb_mpw_free(&a->queue[0]);
    memmove(&a->queue[0], &a->queue[1], (a->nq - 1) * sizeof(a->queue[0]));
    a->nq--;
}

/* Opens a reply from the controller: 1 with m ready to decode, 0 when it was an ERROR (handled
 * into *rc) or unreadable (logged). */
static int open_reply(struct wb_agent *a, const void *buf, size_t len, struct wb_msg *m, int *rc)
{
    const char *why;
    *rc = 0;
    if (wb_msg_open(buf, len, a->o.token, m, &why)) {
        wb_log(WB_LOG_ERROR, M, "reply from controller: %s", why);
        return 0;
    }
    if (m->type == WB_MSG_ERROR) {
        *rc = on_error_reply(a, m);
        return 0;
    }
    return 1;
}

static int on_call_reply(struct wb_agent *a, void *buf, size_t len)
{
    struct wb_msg m;
    int rc;
    if (a->call_is_report && a->nq) /* answered (OK or ERROR): the report arrived */
        report_pop(a);
    a->call_is_report = false;
    if (!open_reply(a, buf, len, &m, &rc))
        return rc;
    if (m.type == WB_MSG_REGISTERED && a->registering) {
        struct wb_body_registered r;
        char why[WB_ERRMSG_MAX];
        a->registering = false;
        if (wb_msg_decode(&m, &r, why, sizeof(why))) {
            wb_log(WB_LOG_ERROR, M, "reply from controller: %s", why);
            return -EBADMSG;
        }
        a->session = r.session;
        a->hb_ns = r.heartbeat_ns;
        a->dead_ns = r.dead_ns;
        a->hold_ns = r.poll_hold_ns;
        a->last_seq = 0;
        wb_log(WB_LOG_INFO, M, "%s rank %u registered, session %" PRIu64, a->role, a->o.rank,
               a->session);
        send_poll(a);
    }
    return 0;
}

/* ---------------------------------------------------------------- commands */

static void cmd_setup(struct wb_agent *a, const struct wb_body_setup *b)
{
    struct agent_job j = {.gen = b->gen, .seed = b->seed};
    const void *addr = NULL, *regions = NULL;
    size_t addr_len = 0, regions_len = 0;
    char err[WB_ERRMSG_MAX] = "";
    snprintf(j.provider, sizeof(j.provider), "%s", b->provider);
    snprintf(j.trace, sizeof(j.trace), "%s", b->trace);
    snprintf(j.name, sizeof(j.name), "%s", b->job);
    a->job = j;
    if (a->xfer_active && a->d)
        ag_data_abort(a->d);
    a->xfer_active = false;
    int rc = ag_data_setup(&a->d, &a->o, &j, b->plan.p, b->plan.n, b->shards.p, b->shards.n, &addr,
                           &addr_len, &regions, &regions_len, err, sizeof(err));
    if (rc)
        wb_log(WB_LOG_ERROR, M, "%s rank %u: setup failed: %s", a->role, a->o.rank, err);
    struct wb_body_rep_setup r = {
        .gen = j.gen, .ok = rc == 0, .addr = {addr, addr_len}, .regions = {regions, regions_len}};
    snprintf(r.err, sizeof(r.err), "%s", err);
    report(a, WB_MSG_REP_SETUP, &r);
}

static void cmd_peers(struct wb_agent *a, const struct wb_body_peers *b)
{
    char err[WB_ERRMSG_MAX] = "";
    int rc = a->d ? ag_data_peers(a->d, b->agents.p, b->agents.n, err, sizeof(err)) : -EINVAL;
    if (rc && !*err)
        snprintf(err, sizeof(err), "peers before setup");
    struct wb_body_rep_connected r = {.gen = b->gen, .ok = rc == 0};
    snprintf(r.err, sizeof(r.err), "%s", err);
    report(a, WB_MSG_REP_CONNECTED, &r);
}

/* Reports the end of a transfer (ok or not); stats and rx_bytes only for a success. */
static void report_done(struct wb_agent *a, uint64_t version, bool ok, const char *err,
                        const struct wb_xfer_stats *stats, uint64_t rx_bytes)
{
    if (a->o.role == WB_ROLE_TRAINER) {
        struct wb_mpw sw;
        struct wb_xfer_stats none = {.rank = a->o.rank};
        wb_mpw_init(&sw);
        wb_body_put(&sw, WB_BODY_STATS, stats ? stats : &none);
        struct wb_body_rep_sent r = {.version = version, .ok = ok, .stats = {sw.buf, sw.len}};
        snprintf(r.err, sizeof(r.err), "%s", err ? err : "");
        report(a, WB_MSG_REP_SENT, &r);
        wb_mpw_free(&sw);
    } else {
        struct wb_body_rep_received r = {.version = version, .ok = ok, .bytes = rx_bytes};
        snprintf(r.err, sizeof(r.err), "%s", err ? err : "");
        report(a, WB_MSG_REP_RECEIVED, &r);
    }
}

static void cmd_transfer(struct wb_agent *a, uint64_t version, uint64_t epoch)
{
    char err[WB_ERRMSG_MAX] = "";
    int rc = a->d ? ag_data_start(a->d, version, epoch, err, sizeof(err)) : -EINVAL;
    if (rc) {
        if (!*err)
            snprintf(err, sizeof(err), "transfer before setup");
        report_done(a, version, false, err, NULL, 0);
        return;
    }
    a->xfer_active = true;
    a->xfer_version = version;
    a->in_flight = a->o.role == WB_ROLE_ROLLOUT;
    a->pace_until = wb_now_ns() + a->o.pace_ns;
}

static void cmd_complete(struct wb_agent *a, uint64_t version)
{
    if (a->o.role != WB_ROLE_ROLLOUT)
        return;
    char err[WB_ERRMSG_MAX] = "";
    int rc = a->o.dump && a->d ? ag_data_dump(a->d, a->o.dump, version, err, sizeof(err)) : 0;
    if (rc)
        wb_log(WB_LOG_ERROR, M, "rollout rank %u: %s", a->o.rank, err);
    a->version = version;
    a->in_flight = false;
    struct wb_body_rep_committed r = {.version = version};
    report(a, WB_MSG_REP_COMMITTED, &r);
    wb_log(WB_LOG_INFO, M, "rollout rank %u: version %" PRIu64 " complete", a->o.rank, version);
}

static void cmd_abort(struct wb_agent *a, const struct wb_body_abort *b)
{
    wb_log(WB_LOG_WARN, M, "%s rank %u: transfer %" PRIu64 " aborted: %s", a->role, a->o.rank,
           b->version, b->reason);
    if (a->xfer_active && a->xfer_version == b->version && a->d)
        ag_data_abort(a->d);
    if (a->xfer_version == b->version) {
        a->xfer_active = false;
        a->in_flight = false;
    }
}

/* Every command body, decoded by its type. */
union cmd_body {
    struct wb_body_setup setup;
    struct wb_body_peers peers;
    struct wb_body_version_epoch xfer;
    struct wb_body_version complete;
    struct wb_body_abort abort;
};

static int on_commands(struct wb_agent *a, void *buf, size_t len)
{
    struct wb_msg m;
    struct wb_body_commands cb;
    struct wb_cmd_reader cr;
    char why[WB_ERRMSG_MAX];
    int rc;
    if (!open_reply(a, buf, len, &m, &rc))
        return rc;
    if (m.type != WB_MSG_COMMANDS || wb_msg_decode(&m, &cb, why, sizeof(why)) ||
        wb_cmd_reader_init(&cr, &cb.cmds))
        return 0;
    uint64_t seq;
    uint32_t type;
    struct wb_mpr body;
    while ((rc = wb_cmd_next(&cr, &seq, &type, &body)) == 1) {
        if (seq <= a->last_seq)
            continue; /* seen before: a re-sent command */
        a->last_seq = seq;
        union cmd_body b;
        if (wb_body_get(&body, type, &b, why, sizeof(why))) {
            wb_log(WB_LOG_ERROR, M, "%s rank %u: command refused: %s", a->role, a->o.rank, why);
            continue;
        }
        switch (type) {
        case WB_CMD_SETUP:
            cmd_setup(a, &b.setup);
            break;
        case WB_CMD_PEERS:
            cmd_peers(a, &b.peers);
            break;
        case WB_CMD_TRANSFER:
            cmd_transfer(a, b.xfer.version, b.xfer.epoch);
            break;
        case WB_CMD_COMPLETE:
            cmd_complete(a, b.complete.version);
            break;
        case WB_CMD_ABORT:
            cmd_abort(a, &b.abort);
            break;
        case WB_CMD_EXIT:
            a->exiting = true;
            break;
        default:
            wb_log(WB_LOG_ERROR, M, "%s rank %u: unknown command %#x", a->role, a->o.rank, type);
            break;
        }
    }
    if (rc < 0)
        wb_log(WB_LOG_ERROR, M, "%s rank %u: malformed command list", a->role, a->o.rank);
    return 0;
}

/* ---------------------------------------------------------------- the loop */

static void data_step(struct wb_agent *a)
{
    if (!a->d)
        return;
    struct data_done done;
    /* Always: the transport moves data only while it is polled, transfer or not. */
    if (a->xfer_active && wb_now_ns() < a->pace_until) {
        ag_data_poll(a->d);
        return;
    }
    if (ag_data_progress(a->d, &done) != 1 || !a->xfer_active)
        return;
    a->xfer_active = false;
    report_done(a, a->xfer_version, done.ok, done.err, &done.stats, done.rx_bytes);
    if (!done.ok)
        wb_log(WB_LOG_ERROR, M, "%s rank %u: transfer %" PRIu64 " failed: %s", a->role, a->o.rank,
               a->xfer_version, done.err);
}

int wb_agent_run(struct wb_agent *a)
{
    int rc = 0;
    a->last_heard = wb_now_ns();
    while (!a->exiting) {
        uint64_t now = wb_now_ns();
        if (!a->session && !a->call.busy && now >= a->retry_at)
            send_register(a);
        if (now - a->last_heard > a->o.give_up_ns) {
            fprintf(stderr, "wb-agent: %s rank %u: controller %s silent for %.1f s, giving up\n",
                    a->role, a->o.rank, a->o.controller, (double)(now - a->last_heard) / 1e9);
            return -WB_E_PEER;
        }
        /* A request unanswered for dead_ns: the controller restarted or the connection was
         * replaced; send again (the REQ socket abandons the old request). */
        if (a->call.busy && now > a->call.sent_ns && now - a->call.sent_ns > a->dead_ns) {
            if (a->registering || !a->session)
                send_register(a);
            else
                a->call.busy = false; /* pump_calls() sends queue[0] or a heartbeat again */
        }
        if (a->session && (!a->pollc.busy || (now > a->pollc.sent_ns &&
                                              now - a->pollc.sent_ns > a->hold_ns + a->dead_ns)))
            send_poll(a);
        pump_calls(a, now);

        struct pollfd p[2] = {{.fd = a->call.fd, .events = POLLIN},
                              {.fd = a->pollc.fd, .events = POLLIN}};
        poll(p, 2, a->xfer_active ? 0 : a->d && ag_data_busy(a->d) ? 1 : 10);
        void *buf;
        size_t len;
        while (wb_chan_try_recv(&a->call, &buf, &len) == 1) {
            a->last_heard = wb_now_ns();
            rc = on_call_reply(a, buf, len);
            wb_chan_free(buf);
            if (rc)
                return rc;
        }
        while (wb_chan_try_recv(&a->pollc, &buf, &len) == 1) {
            a->last_heard = wb_now_ns();
            rc = on_commands(a, buf, len);
            wb_chan_free(buf);
            if (rc)
                return rc;
            if (a->session)
                send_poll(a);
        }
        data_step(a);
    }
    /* Acknowledge EXIT so the controller knows we heard it, then give the message a moment
     * to leave before the socket closes. */
    send_poll(a);
    struct timespec ts = {0, 50 * 1000000};
    nanosleep(&ts, NULL);
    return 0;
}

int wb_agent_create(const struct wb_agent_opts *opts, struct wb_agent **out)
{
    struct wb_agent *a = calloc(1, sizeof(*a));
    if (!a)
        return -ENOMEM;
    a->o = *opts;
    if (!a->o.give_up_ns)
        a->o.give_up_ns = 30ull * 1000000000;
    a->role = wb_role_name(opts->role);
    a->hb_ns = 200 * 1000000ull;
    a->dead_ns = 1500 * 1000000ull;
    a->hold_ns = 500 * 1000000ull;
    int err = wb_chan_open(&a->call, opts->controller);
    if (err)
        goto err_free;
    err = wb_chan_open(&a->pollc, opts->controller);
    if (err)
        goto err_call;
    *out = a;
    return 0;

err_call:
    wb_chan_close(&a->call);
err_free:
    free(a);
    return err;
}

void wb_agent_destroy(struct wb_agent *a)
{
    if (!a)
        return;
    for (size_t i = 0; i < a->nq; i++)
        wb_mpw_free(&a->queue[i]);
    ag_data_free(a->d);
    wb_chan_close(&a->pollc);
    wb_chan_close(&a->call);
    free(a);
}
