/* loop.c — the endpoint's control loop: register with the controller, heartbeat, long-poll for
 * commands, run them on the data side (data.c) and report back; send the pushes the trainer's
 * process asked for and publish what happened to them (state.c).
 *
 * One thread, never blocking: the loop polls the two channel fds and calls ag_data_progress()
 * between polls, so the executor advances while control messages flow. It polls without
 * waiting while a transfer runs, every millisecond while the transport has anything in flight,
 * and otherwise sleeps until a message, a wake-up (ag_wake: a push, a close, the heartbeat
 * thread's news) or its next timer — an idle agent costs next to nothing (loop_wait_ms).
 * Two REQ channels because a REQ socket has one request in flight: the "poll" channel is
 * parked at the controller most of the time, the "call" channel carries registers, heartbeats,
 * reports and pushes, answered at once. Reports and pushes go out in order through a queue. */
#include "agent/priv.h"

#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static const char *M = "agent";

void ag_wake(struct wb_endpoint *ep)
{
    uint64_t one = 1;
    if (write(ep->wake_fd, &one, sizeof(one)) < 0) { /* full: a wake-up is pending anyway */
    }
}

/* ---------------------------------------------------------------- sending */

static void send_register(struct wb_endpoint *ep)
{
    struct wb_mpw w, inv;
    struct wb_body_register b = {
        .rank = ep->o.rank, .device = ep->o.device, .synthetic = ep->o.synthetic};
    snprintf(b.role, sizeof(b.role), "%s", ep->role);
    gethostname(b.host, sizeof(b.host) - 1);
    b.pid = (uint64_t)getpid();
    snprintf(b.source, sizeof(b.source), "%s", ep->src_id);
    b.digests = (struct wb_bytes){ep->src_digests, (size_t)ep->src_ndigests * 16};
    b.version = ag_state_version(ep->st);
    b.torn = ep->o.role == WB_ROLE_ROLLOUT && ag_state_torn(ep->st);
    b.session = ep->lost_session;
    struct wb_mpw mesh;
    wb_mpw_init(&inv);
    wb_mpw_init(&mesh);
    ag_regs_put(ep, &inv);
    b.inv = (struct wb_bytes){inv.buf, inv.len};
    if (ep->mesh.ndims) {
        wb_reg_mesh_put(&mesh, &ep->mesh);
        b.mesh = (struct wb_bytes){mesh.buf, mesh.len};
    }
    wb_mpw_init(&w);
    wb_msg_encode(&w, WB_MSG_REGISTER, ep->o.token, &b);
    int err = wb_chan_send(&ep->call, &w);
    wb_mpw_free(&w);
    wb_mpw_free(&inv);
    wb_mpw_free(&mesh);
    wb_log(WB_LOG_DEBUG, M, "%s rank %u: register sent: %s", ep->role, ep->o.rank,
           wb_strerror(err));
    ep->registering = err == 0;
    ep->call_is_report = false;
}

/* This endpoint's session header (the first member of every call after REGISTER). */
static struct wb_session session_of(const struct wb_endpoint *ep)
{
    struct wb_session s = {.rank = ep->o.rank, .session = ep->session};
    snprintf(s.role, sizeof(s.role), "%s", ep->role);
    return s;
}

static void send_poll(struct wb_endpoint *ep)
{
    struct wb_mpw w;
    struct wb_body_poll b = {session_of(ep), ep->last_seq};
    wb_mpw_init(&w);
    wb_msg_encode(&w, WB_MSG_POLL, ep->o.token, &b);
    wb_chan_send(&ep->pollc, &w);
    wb_mpw_free(&w);
}

static void lose_session(struct wb_endpoint *ep, const char *why);

/* Queues a call (a body of `type` whose first member is the session header, filled here); it
 * leaves when the call channel is free. push: the version of a PUSH, 0 for a report. */
static void queue_call(struct wb_endpoint *ep, uint32_t type, void *body, uint64_t push)
{
    if (ep->nq == MAX_QUEUED) {
        wb_log(WB_LOG_ERROR, M, "%s rank %u: report queue full", ep->role, ep->o.rank);
        return;
    }
    *(struct wb_session *)body = session_of(ep);
    struct wb_mpw *w = &ep->queue[ep->nq];
    wb_mpw_init(w);
    wb_msg_encode(w, type, ep->o.token, body);
    if (w->err) {
        /* Queued, it could never leave and would hold back every call after it; dropped, the
         * controller would wait for it for ever (a setup's report has no time limit). Start
         * the session again instead: the controller sets this agent up anew. */
        char why[WB_ERRMSG_MAX];
        snprintf(why, sizeof(why), "a %s could not be built: %s", push ? "push" : "report",
                 wb_strerror(w->err));
        wb_mpw_free(w);
        if (push)
            ag_push_event(ep->st, push, WB_PUSH_DONE, true, why);
        lose_session(ep, why);
        return;
    }
    ep->queue_push[ep->nq++] = push;
}

static void report(struct wb_endpoint *ep, uint32_t type, void *body)
{
    queue_call(ep, type, body, 0);
}

static void pump_calls(struct wb_endpoint *ep)
{
    if (ep->call.busy || !ep->session || !ep->nq)
        return;
    if (wb_chan_send(&ep->call, &ep->queue[0]) == 0) { /* it leaves when its reply arrives */
        ep->call_is_report = true;
        ep->call_push = ep->queue_push[0];
    }
}

/* ---------------------------------------------------------------- heartbeats */

/* What the next heartbeat says, from the loop's state; what the heartbeats heard, to it. */
static void hb_update(struct wb_endpoint *ep)
{
    struct wb_body_heartbeat b = {session_of(ep), ag_state_version(ep->st), ep->in_flight};
    if (ep->d && ep->o.role == WB_ROLE_TRAINER) { /* also once done: the last figures */
        struct data_progress pg;
        ag_data_progress_get(ep->d, &pg);
        b.done = pg.done;
        b.total = pg.total;
        b.epoch = pg.epoch;
    }
    b.torn = ep->o.role == WB_ROLE_ROLLOUT && ag_state_torn(ep->st);
    b.commits = ep->commits;
    b.dropped = ep->d ? ag_data_dropped(ep->d) : 0;
    uint64_t loop_sent =
        ep->pollc.sent_ns > ep->call.sent_ns ? ep->pollc.sent_ns : ep->call.sent_ns;
    struct ag_hb_news news;
    ag_hb_update(ep->hb, &b, loop_sent, ep->hb_ns, &news);
    if (news.ended)
        ep->exiting = true; /* the controller said so on the heartbeat connection */
    if (news.heard > ep->last_heard)
        ep->last_heard = news.heard;
    if (news.lost && news.lost == ep->session)
        lose_session(ep, "the controller no longer knows this session");
}

/* Trainers: sends the pushes the process asked for, once registered. */
static void pump_pushes(struct wb_endpoint *ep)
{
    if (ep->o.role != WB_ROLE_TRAINER || !ep->session)
        return;
    uint64_t v;
    bool queue;
    while (ep->session && (v = ag_push_next(ep->st, &queue)) != 0) { /* a failed one ends it */
        struct wb_body_push b = {.version = v, .queue = queue};
        queue_call(ep, WB_MSG_PUSH, &b, v);
    }
}

/* ---------------------------------------------------------------- session */

static void lose_session(struct wb_endpoint *ep, const char *why)
{
    wb_log(WB_LOG_WARN, M, "%s rank %u: %s: registering again", ep->role, ep->o.rank, why);
    if (ep->session)
        ep->lost_session = ep->session;
    ep->session = 0;
    ep->last_seq = 0;
    for (size_t i = 0; i < ep->nq; i++) {
        if (ep->queue_push[i]) /* a push not delivered: the controller starts from nothing */
            ag_push_event(ep->st, ep->queue_push[i], WB_PUSH_DONE, true,
                          "the controller lost this trainer's session before the push arrived");
        wb_mpw_free(&ep->queue[i]);
    }
    ep->nq = 0;
    if (ep->xfer_active && ep->d) {
        ag_data_abort(ep->d);
        if (ep->o.role == WB_ROLE_TRAINER)
            ag_push_event(ep->st, ep->v.attempt, WB_PUSH_DONE, true, why);
    }
    ep->xfer_active = false;
    ep->attempt_open = false;
    ep->settled = false;
    ep->in_flight = false;
    ep->pollc.busy = false;
    ag_set_ready(ep->st, false);
}

/* Handles an ERROR reply; returns a negative code when the endpoint must stop. */
static int on_error_reply(struct wb_endpoint *ep, const struct wb_msg *m)
{
    struct wb_body_error e;
    char why[WB_ERRMSG_MAX];
    if (wb_msg_decode(m, &e, why, sizeof(why))) {
        wb_log(WB_LOG_ERROR, M, "reply from controller: %s", why);
        return 0;
    }
    if (e.code == -WB_E_TOKEN) {
        ag_set_fatal(ep->st, -WB_E_TOKEN, "%s rank %u: controller %s: %s", ep->role, ep->o.rank,
                     ep->o.controller, e.msg);
        return -WB_E_TOKEN;
    }
    if (e.code == -WB_E_PEER) {
        lose_session(ep, e.msg);
        return 0;
    }
    if (e.code == -WB_E_ENDED) { /* as an EXIT command */
        ep->exiting = true;
        return 0;
    }
    if (e.code == -EADDRINUSE && ep->registering) { /* another live process holds the rank */
        wb_log(WB_LOG_WARN, M, "%s", e.msg);
        ep->registering = false;
        ep->retry_at = wb_now_ns() + ep->hb_ns;
        return 0;
    }
    if (ep->registering) { /* refused: a wrong registration, a rank outside the job */
        ag_set_fatal(ep->st, e.code == -WB_E_CONFIG ? -WB_E_CONFIG : -EINVAL,
                     "%s rank %u: controller %s: %s%s%.*s", ep->role, ep->o.rank, ep->o.controller,
                     e.msg, e.detail.n ? ":\n" : "", (int)e.detail.n, (const char *)e.detail.p);
        return e.code == -WB_E_CONFIG ? -WB_E_CONFIG : -EINVAL;
    }
    if (ep->call_push) { /* the controller refused a push */
        ag_push_event(ep->st, ep->call_push, WB_PUSH_DONE, true, e.msg);
        return 0;
    }
    wb_log(WB_LOG_ERROR, M, "%s rank %u: controller %s: %s", ep->role, ep->o.rank, ep->o.controller,
           e.msg);
    return 0;
}

static void report_pop(struct wb_endpoint *ep)
{
    wb_mpw_free(&ep->queue[0]);
    memmove(&ep->queue[0], &ep->queue[1], (ep->nq - 1) * sizeof(ep->queue[0]));
    memmove(&ep->queue_push[0], &ep->queue_push[1], (ep->nq - 1) * sizeof(ep->queue_push[0]));
    ep->nq--;
}

/* Opens a reply from the controller: 1 with m ready to decode, 0 when it was an ERROR (handled
 * into *rc) or unreadable (logged). */
static int open_reply(struct wb_endpoint *ep, const void *buf, size_t len, struct wb_msg *m,
                      int *rc)
{
    const char *why;
    *rc = 0;
    if (wb_msg_open(buf, len, ep->o.token, m, &why)) {
        wb_log(WB_LOG_ERROR, M, "reply from controller: %s", why);
        return 0;
    }
    if (m->type == WB_MSG_ERROR) {
        *rc = on_error_reply(ep, m);
        return 0;
    }
    return 1;
}

static int on_call_reply(struct wb_endpoint *ep, void *buf, size_t len)
{
    struct wb_msg m;
    int rc;
    bool was_report = ep->call_is_report && ep->nq;
    uint64_t session = ep->session;
    int opened = open_reply(ep, buf, len, &m, &rc);
    /* answered (OK or ERROR): the report or push arrived — unless the answer was that the
     * session is gone, which emptied the queue (lose_session) */
    if (was_report && ep->session == session && ep->nq)
        report_pop(ep);
    ep->call_is_report = false;
    ep->call_push = 0;
    if (!opened)
        return rc;
    if (m.type == WB_MSG_REGISTERED && ep->registering) {
        struct wb_body_registered r;
        char why[WB_ERRMSG_MAX];
        ep->registering = false;
        if (wb_msg_decode(&m, &r, why, sizeof(why))) {
            ag_set_fatal(ep->st, -EBADMSG, "reply from controller: %s", why);
            return -EBADMSG;
        }
        ep->session = r.session;
        ep->hb_ns = r.heartbeat_ns;
        ep->dead_ns = r.dead_ns;
        ep->hold_ns = r.poll_hold_ns;
        ep->last_seq = 0;
        wb_log(WB_LOG_INFO, M, "%s rank %u registered, session %" PRIu64, ep->role, ep->o.rank,
               ep->session);
        /* The heartbeats carry the new session from now on: the SETUP that may come with the
         * first poll answer blocks this loop for as long as registering the memory takes, and
         * a beat without the session (or with the lost one) would let the agent be taken for
         * dead meanwhile. */
        hb_update(ep);
        send_poll(ep);
    }
    return 0;
}

/* ---------------------------------------------------------------- commands */

static void cmd_setup(struct wb_endpoint *ep, const struct wb_body_setup *b)
{
    struct agent_job j = {.gen = b->gen, .seed = b->seed, .change_period = b->change_period};
    struct data_setup_out out = {0};
    char err[WB_ERRMSG_MAX] = "";
    snprintf(j.provider, sizeof(j.provider), "%s", b->provider);
    snprintf(j.trace, sizeof(j.trace), "%s", b->trace);
    j.trace_keep = b->trace_keep > UINT32_MAX ? UINT32_MAX : (uint32_t)b->trace_keep;
    snprintf(j.name, sizeof(j.name), "%s", b->job);
    ep->job = j;
    if (ep->xfer_active && ep->d)
        ag_data_abort(ep->d);
    ep->xfer_active = false;
    ep->attempt_open = false;
    ep->settled = false; /* until READY: connections are being made */
    ag_dump_wait(ep);    /* the dump reads the memory the new setup replaces */
    ag_set_ready(ep->st, false);
    /* the first transfer's values are made while peers connect: the next version's */
    int rc = ag_data_setup(&ep->d, ep, b, ep->v.attempt + 1, &out, err, sizeof(err));
    if (out.lost)
        ag_version_lost(ep->st, out.lost);
    if (rc && !*err) /* a failure without its own message still says what it was */
        snprintf(err, sizeof(err), "%s", wb_strerror(rc));
    if (rc)
        wb_log(WB_LOG_ERROR, M, "%s rank %u: setup failed: %s", ep->role, ep->o.rank, err);
    struct wb_body_rep_setup r = {.gen = j.gen,
                                  .ok = rc == 0,
                                  .addr = {out.addr, out.addr_len},
                                  .regions = {out.regions, out.regions_len}};
    snprintf(r.err, sizeof(r.err), "%s", err);
    report(ep, WB_MSG_REP_SETUP, &r);
}

/* Testing ($WB_TEST_PEERS_OUT=DIR): what this agent was told of its peers — addresses and
 * memory descriptors, every key it holds — written to DIR/<role><rank>.peers, so that a test
 * can play a departed member who kept them. */
static void peers_out(const struct wb_endpoint *ep, const struct wb_body_peers *b)
{
    const char *dir = getenv("WB_TEST_PEERS_OUT");
    if (!dir || !*dir)
        return;
    char path[1100];
    snprintf(path, sizeof(path), "%s/%s%u.peers", dir, ep->role, ep->o.rank);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(b->agents.p, 1, b->agents.n, f) != b->agents.n)
        wb_log(WB_LOG_ERROR, M, "%s: cannot write the peer list", path);
    if (f)
        fclose(f);
}

static void cmd_peers(struct wb_endpoint *ep, const struct wb_body_peers *b)
{
    char err[WB_ERRMSG_MAX] = "";
    ep->settled = false; /* until READY: warm-up notes travel to the peers */
    peers_out(ep, b);
    int rc = ep->d ? ag_data_peers(ep->d, b->agents.p, b->agents.n, err, sizeof(err)) : -EINVAL;
    if (rc && !*err)
        snprintf(err, sizeof(err), "%s", ep->d ? wb_strerror(rc) : "peers before setup");
    struct wb_body_rep_connected r = {.gen = b->gen, .ok = rc == 0};
    snprintf(r.err, sizeof(r.err), "%s", err);
    report(ep, WB_MSG_REP_CONNECTED, &r);
}

/* Reports the end of a transfer (ok or not); stats and rx_bytes only for a success. */
static void report_done(struct wb_endpoint *ep, uint64_t version, bool ok, const char *err,
                        const struct wb_xfer_stats *stats, uint64_t rx_bytes)
{
    if (ep->o.role == WB_ROLE_TRAINER) {
        struct wb_mpw sw;
        struct wb_xfer_stats none = {.rank = ep->o.rank};
        wb_mpw_init(&sw);
        wb_body_put(&sw, WB_BODY_STATS, stats ? stats : &none);
        struct wb_body_rep_sent r = {.version = version, .ok = ok, .stats = {sw.buf, sw.len}};
        snprintf(r.err, sizeof(r.err), "%s", err ? err : "");
        report(ep, WB_MSG_REP_SENT, &r);
        wb_mpw_free(&sw);
    } else {
        struct wb_body_rep_received r = {.version = version, .ok = ok, .bytes = rx_bytes};
        snprintf(r.err, sizeof(r.err), "%s", err ? err : "");
        report(ep, WB_MSG_REP_RECEIVED, &r);
    }
}

static void cmd_transfer(struct wb_endpoint *ep, const struct wb_body_version_epoch *b)
{
    uint64_t version = b->version;
    char err[WB_ERRMSG_MAX] = "";
    ep->v.draining = 0;
    ep->attempt_open = true; /* until its outcome arrives, failed start or not */
    /* trainers: the versions skipped since the last one that started are this one's */
    if (ep->o.role == WB_ROLE_TRAINER)
        ag_push_started(ep->st, version);
    int rc = ep->d ? ag_data_start(ep->d, b, err, sizeof(err)) : -EINVAL;
    if (rc) {
        if (!*err)
            snprintf(err, sizeof(err), "transfer before setup");
        report_done(ep, version, false, err, NULL, 0);
        return;
    }
    /* Its windows are open: until a version completes here, the tensors may hold a mix. */
    if (ag_data_receiving(ep->d))
        ag_version_torn(ep->st);
    ep->xfer_active = true;
    ep->v.attempt = version;
    ep->in_flight = ep->o.role == WB_ROLE_ROLLOUT;
    ep->pace_until = wb_now_ns() + ep->o.pace_ns;
}

static void commit(struct wb_endpoint *ep, uint64_t version)
{
    ep->in_flight = false;
    ag_version_done(ep->st, version, false, NULL);
    ep->commits++;
    hb_update(ep); /* the next heartbeat says so, not what the last snapshot held */
    struct wb_body_rep_committed r = {.version = version, .commits = ep->commits};
    report(ep, WB_MSG_REP_COMMITTED, &r);
    wb_log(WB_LOG_INFO, M, "rollout rank %u: version %" PRIu64 " complete", ep->o.rank, version);
}

static void *dump_main(void *arg)
{
    struct wb_endpoint *ep = arg;
    int rc = ag_data_dump(ep->d, ep->o.dump, ep->v.committing, ep->dump_err, sizeof(ep->dump_err));
    atomic_store(&ep->dump_state, rc ? rc : 1);
    ag_wake(ep); /* the loop commits the version now */
    return NULL;
}

void ag_dump_wait(struct wb_endpoint *ep)
{
    if (!ep->dumping)
        return;
    pthread_join(ep->dump_thread, NULL);
    ep->dumping = false;
}

/* A dump that ended: the version is committed (a failed dump is logged; the bytes are in
 * place all the same). */
static void dump_step(struct wb_endpoint *ep)
{
    if (!ep->dumping || atomic_load(&ep->dump_state) == 0)
        return;
    pthread_join(ep->dump_thread, NULL);
    ep->dumping = false;
    if (atomic_load(&ep->dump_state) < 0)
        wb_log(WB_LOG_ERROR, M, "rollout rank %u: %s", ep->o.rank, ep->dump_err);
    commit(ep, ep->v.committing);
}

static void cmd_complete(struct wb_endpoint *ep, uint64_t version)
{
    if (version == ep->v.attempt)
        ep->attempt_open = false;
    if (ep->o.role == WB_ROLE_TRAINER) {
        ag_push_event(ep->st, version, WB_PUSH_DONE, false, NULL);
        return;
    }
    if (ep->dumping) /* the controller repeats COMPLETE until COMMITTED: still dumping */
        return;
    if (ep->o.dump && ep->d && version >= ep->o.dump_from) {
        ep->v.committing = version;
        ep->dump_err[0] = 0;
        atomic_store(&ep->dump_state, 0);
        if (pthread_create(&ep->dump_thread, NULL, dump_main, ep) == 0) {
            ep->dumping = true;
            return;
        }
        wb_log(WB_LOG_ERROR, M, "rollout rank %u: cannot start the dump's thread", ep->o.rank);
    }
    commit(ep, version);
}

static void cmd_abort(struct wb_endpoint *ep, const struct wb_body_abort *b)
{
    wb_log(WB_LOG_WARN, M, "%s rank %u: transfer %" PRIu64 " aborted: %s", ep->role, ep->o.rank,
           b->version, b->reason);
    /* A trainer that finished its part fences too: its last writes completed once they were
     * in the connection's stream (tcp), not once placed, and the rollouts close their windows
     * as soon as every trainer says it drained — a write landing on a closed window makes the
     * provider drop the connection, and whatever is sent on it next is lost. */
    if (ep->d && ep->v.attempt == b->version && (ep->xfer_active || ep->o.role == WB_ROLE_TRAINER))
        ag_data_abort(ep->d);
    if (ep->v.attempt == b->version) {
        ep->xfer_active = false;
        ep->attempt_open = false; /* a trainer still drains (drain_version) */
        ep->in_flight = false;
    }
    if (ep->o.role == WB_ROLE_TRAINER) {
        ag_push_event(ep->st, b->version, WB_PUSH_DONE, true, b->reason);
        ep->v.draining = b->version; /* REPORT_DRAINED once its writes all completed */
        return;
    }
    ag_version_done(ep->st, b->version, true, b->reason);
    /* what landed of the version, so that the next attempt resends only the rest */
    struct wb_mpw w;
    wb_mpw_init(&w);
    if (ep->d && ag_data_landed(ep->d, b->version, &w) == 0) {
        struct wb_body_rep_received r = {.version = b->version, .landed = {w.buf, w.len}};
        snprintf(r.err, sizeof(r.err), "aborted");
        report(ep, WB_MSG_REP_RECEIVED, &r);
    }
    wb_mpw_free(&w);
}

/* Every command body, decoded by its type. */
union cmd_body {
    struct wb_body_setup setup;
    struct wb_body_peers peers;
    struct wb_body_version_epoch xfer;
    struct wb_body_version complete;
    struct wb_body_abort abort;
    struct wb_body_ready ready;
    struct wb_body_error refused;
    struct wb_body_skipped skipped;
};

static int on_commands(struct wb_endpoint *ep, void *buf, size_t len)
{
    struct wb_msg m;
    struct wb_body_commands cb;
    struct wb_cmd_reader cr;
    char why[WB_ERRMSG_MAX];
    int rc;
    if (!open_reply(ep, buf, len, &m, &rc))
        return rc;
    if (m.type != WB_MSG_COMMANDS || wb_msg_decode(&m, &cb, why, sizeof(why)) ||
        wb_cmd_reader_init(&cr, &cb.cmds))
        return 0;
    uint64_t seq;
    uint32_t type;
    struct wb_mpr body;
    while ((rc = wb_cmd_next(&cr, &seq, &type, &body)) == 1) {
        if (seq <= ep->last_seq)
            continue; /* seen before: a re-sent command */
        ep->last_seq = seq;
        union cmd_body b;
        if (wb_body_get(&body, type, &b, why, sizeof(why))) {
            wb_log(WB_LOG_ERROR, M, "%s rank %u: command refused: %s", ep->role, ep->o.rank, why);
            continue;
        }
        switch (type) {
        case WB_CMD_SETUP:
            cmd_setup(ep, &b.setup);
            break;
        case WB_CMD_PEERS:
            cmd_peers(ep, &b.peers);
            break;
        case WB_CMD_TRANSFER:
            cmd_transfer(ep, &b.xfer);
            break;
        case WB_CMD_COMPLETE:
            cmd_complete(ep, b.complete.version);
            break;
        case WB_CMD_ABORT:
            cmd_abort(ep, &b.abort);
            break;
        case WB_CMD_READY:
            ep->settled = true;
            ag_set_ready(ep->st, true);
            break;
        case WB_CMD_REFUSED:
            ag_set_fatal(ep->st, b.refused.code ? (int)b.refused.code : -WB_E_CONFIG,
                         "%s rank %u: controller %s: %s%s%.*s", ep->role, ep->o.rank,
                         ep->o.controller, b.refused.msg, b.refused.detail.n ? ":\n" : "",
                         (int)b.refused.detail.n, (const char *)b.refused.detail.p);
            ep->exiting = true;
            ep->exit_code = b.refused.code ? (int)b.refused.code : -WB_E_CONFIG;
            break;
        case WB_CMD_EXIT:
            ep->exiting = true;
            break;
        case WB_CMD_SKIPPED:
            if (ep->o.role == WB_ROLE_TRAINER)
                ag_push_skipped(ep->st, b.skipped.version, b.skipped.by);
            break;
        default:
            wb_log(WB_LOG_ERROR, M, "%s rank %u: unknown command %#x", ep->role, ep->o.rank, type);
            break;
        }
    }
    if (rc < 0)
        wb_log(WB_LOG_ERROR, M, "%s rank %u: malformed command list", ep->role, ep->o.rank);
    return 0;
}

/* ---------------------------------------------------------------- the loop */

/* Rollouts: the engine's post-update hook, after the bytes landed and before "received". */
static void run_hook(struct wb_endpoint *ep, struct data_done *done)
{
    pthread_mutex_lock(&ep->mu);
    wb_endpoint_hook fn = ep->hook;
    void *arg = ep->hook_arg;
    pthread_mutex_unlock(&ep->mu);
    if (!fn || !done->ok)
        return;
    char err[400] = "";
    uint64_t t0 = wb_now_ns();
    if (fn(arg, ep->v.attempt, err, sizeof(err))) {
        done->ok = false;
        snprintf(done->err, sizeof(done->err), "post-update hook: %s", *err ? err : "failed");
    }
    if (ep->d)
        ag_data_hook_ran(ep->d, t0, wb_now_ns(), done->ok ? NULL : done->err);
}

/* Trainers: an aborted attempt's writes all completed: the controller may close the
 * rollouts' windows without a write of ours still on its way. */
static void drain_step(struct wb_endpoint *ep)
{
    if (!ep->v.draining || !ep->session || (ep->d && !ag_data_drained(ep->d)))
        return;
    struct wb_body_rep_drained r = {.version = ep->v.draining};
    ep->v.draining = 0;
    report(ep, WB_MSG_REP_DRAINED, &r);
}

static void data_step(struct wb_endpoint *ep)
{
    drain_step(ep);
    if (!ep->d)
        return;
    struct data_done done;
    /* Always: the transport moves data only while it is polled, transfer or not. */
    if (ep->xfer_active && wb_now_ns() < ep->pace_until) {
        ag_data_poll(ep->d);
        return;
    }
    if (ag_data_progress(ep->d, &done) != 1 || !ep->xfer_active)
        return;
    ep->xfer_active = false;
    if (ep->o.role == WB_ROLE_ROLLOUT)
        run_hook(ep, &done);
    else if (done.ok) /* the executor read its last source byte */
        ag_push_figures(ep->st, ep->v.attempt, &done.stats);
    if (ep->o.role == WB_ROLE_TRAINER)
        ag_push_event(ep->st, ep->v.attempt, WB_PUSH_SOURCES, false, NULL);
    report_done(ep, ep->v.attempt, done.ok, done.err, &done.stats, done.rx_bytes);
    ep->after_pending = true;
    if (!done.ok)
        wb_log(WB_LOG_ERROR, M, "%s rank %u: transfer %" PRIu64 " failed: %s", ep->role, ep->o.rank,
               ep->v.attempt, done.err);
}

void ag_state_request(struct wb_endpoint *ep)
{
    atomic_store(&ep->state_req, 1);
    ag_wake(ep);
}

/* A state dump asked for (ag_state_request): written here, on the loop, so that no command
 * changes the tensors or the claim while it is taken; the claim file comes last. */
static void state_step(struct wb_endpoint *ep)
{
    if (!atomic_exchange(&ep->state_req, 0))
        return;
    if (!ep->o.dump || !ep->d || ep->o.role != WB_ROLE_ROLLOUT)
        return;
    ag_dump_wait(ep);
    char dir[1100], path[1200], tmp[1300], err[512] = "";
    snprintf(dir, sizeof(dir), "%s/state", ep->o.dump);
    mkdir(dir, 0755);
    uint64_t v = ag_state_version(ep->st);
    bool torn = ag_state_torn(ep->st);
    int rc = ag_data_dump(ep->d, dir, v, err, sizeof(err));
    snprintf(path, sizeof(path), "%s/rollout%u.txt", dir, ep->o.rank);
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    FILE *f = rc ? NULL : fopen(tmp, "w");
    if (f) {
        fprintf(f, "version %" PRIu64 " torn %d in_flight %d\n", v, torn ? 1 : 0,
                ep->xfer_active ? 1 : 0);
        rc = fclose(f) || rename(tmp, path) ? -EIO : 0;
    }
    if (rc || !f)
        wb_log(WB_LOG_ERROR, M, "rollout rank %u: state dump: %s", ep->o.rank,
               *err ? err : "cannot write its claim");
}

/* The endpoint is being closed (wb_endpoint_close): the controller is told, so that it reports a
 * rank that left (at INFO, "left" in the status) and not one that died, which is what a closed
 * connection alone would say. Waited for a second at most: a controller that is gone or slow
 * does not hold up the close, and then takes the closed connection for a death as before. */
static void say_leave(struct wb_endpoint *ep)
{
    struct wb_body_leave b = {session_of(ep)};
    struct wb_mpw w;
    void *buf = NULL;
    size_t len = 0;
    wb_mpw_init(&w);
    wb_msg_encode(&w, WB_MSG_LEAVE, ep->o.token, &b);
    if (!w.err && wb_chan_call(&ep->call, &w, 1000000000ull, &buf, &len) == 0)
        wb_chan_free(buf);
    wb_mpw_free(&w);
    wb_log(WB_LOG_DEBUG, M, "%s rank %u: left the job", ep->role, ep->o.rank);
}

static bool stop_asked(struct wb_endpoint *ep)
{
    pthread_mutex_lock(&ep->mu);
    bool s = ep->stop;
    pthread_mutex_unlock(&ep->mu);
    return s;
}

/* Close asked: true once the reports already queued (a rollout's COMMITTED, say) reached the
 * controller, or after a second, so that closing right after a wait never loses them. */
static bool may_stop(struct wb_endpoint *ep, uint64_t now)
{
    if (!stop_asked(ep))
        return false;
    if (!ep->stop_at)
        ep->stop_at = now + 1000000000ull;
    return !ep->session || (ep->nq == 0 && !ep->call.busy) || now >= ep->stop_at;
}

/* A connection to the controller is up on some channel (the heartbeat thread's included: its
 * count is read atomically). */
static bool reachable(const struct wb_endpoint *ep)
{
    return wb_chan_connected(&ep->call) || wb_chan_connected(&ep->pollc) || ag_hb_connected(ep->hb);
}

/* How long the loop may sleep in poll() before its next turn. Not at all while a transfer runs;
 * a millisecond while the transport may have anything in flight (software providers move data
 * only when polled: connections being made before READY, an attempt open until its outcome —
 * a peer's fence or barrier may still come —, a drain, a fill); 10 ms while something waits for
 * a connection or a retry; otherwise (idle: ready, between attempts) up to a second. Messages
 * and wake-ups end the sleep at once; the second only bounds the timers' lateness (a lost
 * request's resend after dead_ns). */
static int loop_wait_ms(struct wb_endpoint *ep, uint64_t now)
{
    if (ep->xfer_active)
        return 0;
    if (ep->d && ag_data_busy(ep->d) &&
        (!ep->settled || ep->attempt_open || ep->v.draining || !ag_data_idle(ep->d)))
        return 1;
    /* Traffic on an idle transport (notes from a stranger, a late peer): it was dropped, and
     * the transport is drained every millisecond for a second after the last such note, so
     * that a flood costs the flooder, not this agent's memory or the kernel's buffers. */
    uint64_t dropped = ep->d ? ag_data_dropped(ep->d) : 0;
    if (dropped != ep->idle_dropped) {
        ep->idle_dropped = dropped;
        ep->drain_until = now + 1000000000ull;
    }
    if (ep->d && ag_data_busy(ep->d) && now < ep->drain_until)
        return 1;
    if (!ep->session || !ep->pollc.busy || (ep->nq && !ep->call.busy) || !reachable(ep))
        return 10;
    return 1000;
}

static int loop(struct wb_endpoint *ep)
{
    int rc = 0;
    char err[512];
    if (!ep->o.synthetic && (rc = ag_segs_build(ep, err, sizeof(err))) != 0) {
        ag_set_fatal(ep->st, rc, "%s rank %u: %s", ep->role, ep->o.rank, err);
        return rc;
    }
    ep->last_heard = ep->last_reach = wb_now_ns();
    for (;;) {
        uint64_t now = wb_now_ns();
        if (ep->exiting || may_stop(ep, now))
            break;
        if (!ep->session && !ep->call.busy && now >= ep->retry_at)
            send_register(ep);
        /* Giving up is for a controller that cannot be reached — no connection on any channel
         * (it exited, its host is gone) — never for one that is connected and slow to answer
         * (a starved process): that one is waited for, and said so every 30 s. */
        if (reachable(ep) || ep->last_heard > ep->last_reach)
            ep->last_reach = reachable(ep) ? now : ep->last_heard;
        if (now - ep->last_reach > ep->o.give_up_ns) {
            ag_set_fatal(ep->st, -WB_E_PEER,
                         "%s rank %u: controller %s unreachable for %.1f s (no connection), giving "
                         "up",
                         ep->role, ep->o.rank, ep->o.controller,
                         (double)(now - ep->last_reach) / 1e9);
            return -WB_E_PEER;
        }
        uint64_t said = (now - ep->last_heard) / (30ull * 1000000000);
        if (said > ep->silent_said) /* every 30 s, once */
            wb_log(WB_LOG_WARN, M, "%s rank %u: controller %s silent for %.0f s (%s): %s", ep->role,
                   ep->o.rank, ep->o.controller, (double)(now - ep->last_heard) / 1e9,
                   reachable(ep) ? "connected" : "no connection",
                   ep->o.role == WB_ROLE_ROLLOUT
                       ? "keeping the weights, waiting for it to come back"
                       : "waiting for it (a trainer gives up only when it cannot reach it)");
        ep->silent_said = said;
        /* A request lost with its connection (the controller restarted, the connection was
         * replaced), or unanswered for dead_ns: send it again (the REQ socket abandons the old
         * request). */
        if (ep->call.busy && (wb_chan_lost(&ep->call) ||
                              (now > ep->call.sent_ns && now - ep->call.sent_ns > ep->dead_ns))) {
            if (ep->registering || !ep->session)
                send_register(ep);
            else
                ep->call.busy = false; /* pump_calls() sends queue[0] again */
        }
        if (ep->session &&
            (!ep->pollc.busy || wb_chan_lost(&ep->pollc) ||
             (now > ep->pollc.sent_ns && now - ep->pollc.sent_ns > ep->hold_ns + ep->dead_ns)))
            send_poll(ep);
        pump_pushes(ep);
        if (now >= ep->hb_next) { /* not on every turn of a transfer's busy loop */
            hb_update(ep);
            ep->hb_next = now + 10 * 1000000ull;
        }
        pump_calls(ep);
        if (ep->after_pending && ep->d) { /* the report is out (or queued behind a call) */
            ep->after_pending = false;
            ag_data_after(ep->d);
        }
        dump_step(ep);
        state_step(ep);

        struct pollfd p[3] = {{.fd = ep->call.fd, .events = POLLIN},
                              {.fd = ep->pollc.fd, .events = POLLIN},
                              {.fd = ep->wake_fd, .events = POLLIN}};
        int wait = loop_wait_ms(ep, now);
        if (wait > 1) /* the next beat says what the state is now, however long the sleep */
            hb_update(ep);
        if (poll(p, 3, wait) > 0 && (p[2].revents & POLLIN)) {
            uint64_t n;
            if (read(ep->wake_fd, &n, sizeof(n)) < 0) { /* EAGAIN: another read took it */
            }
        }
        void *buf;
        size_t len;
        while (wb_chan_try_recv(&ep->call, &buf, &len) == 1) {
            ep->last_heard = wb_now_ns();
            rc = on_call_reply(ep, buf, len);
            wb_chan_free(buf);
            if (rc)
                return rc;
        }
        while (wb_chan_try_recv(&ep->pollc, &buf, &len) == 1) {
            ep->last_heard = wb_now_ns();
            rc = on_commands(ep, buf, len);
            wb_chan_free(buf);
            if (rc)
                return rc;
            if (ep->session)
                send_poll(ep);
        }
        data_step(ep);
    }
    if (ep->exiting)
        ag_set_fatal(ep->st, -WB_E_ENDED, "%s rank %u: the controller ended the job", ep->role,
                     ep->o.rank);
    /* Acknowledge EXIT so the controller knows we heard it, then give the message a moment
     * to leave before the socket closes. */
    if (ep->exiting && ep->session) {
        send_poll(ep);
        struct timespec ts = {0, 50 * 1000000};
        nanosleep(&ts, NULL);
    } else if (ep->session && stop_asked(ep)) {
        say_leave(ep);
    }
    return ep->exit_code;
}

int ag_loop(struct wb_endpoint *ep)
{
    int rc = ag_hb_start(ep->o.controller, ep->o.token, ep->hb_ns, ep->wake_fd, &ep->hb);
    if (rc) {
        ag_set_fatal(ep->st, rc, "%s rank %u: controller %s: cannot start the heartbeats: %s",
                     ep->role, ep->o.rank, ep->o.controller, wb_strerror(rc));
        return rc;
    }
    rc = loop(ep);
    ag_hb_stop(ep->hb);
    ep->hb = NULL;
    return rc;
}
