/* agent.c — the agent's control loop: register with the controller, heartbeat, long-poll for
 * commands, run them on the data side (data.c) and report back.
 *
 * One thread, never blocking: the loop polls the two channel fds with a short timeout and
 * calls data_progress() between polls, so the executor advances while control messages flow.
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
    /* reports waiting for the call channel */
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
    struct wb_mpw w;
    char host[64] = "";
    gethostname(host, sizeof(host) - 1);
    wb_mpw_init(&w);
    wb_msg_begin(&w, WB_MSG_REGISTER, a->o.token, 6);
    wb_msg_kstr(&w, "role", a->role);
    wb_msg_ku64(&w, "rank", a->o.rank);
    wb_msg_ki64(&w, "device", a->o.device);
    wb_msg_kstr(&w, "host", host);
    wb_msg_ku64(&w, "pid", (uint64_t)getpid());
    /* The synthetic source holds exactly the shards the plan assigns (sent in SETUP), so the
     * inventory registered here is empty; a source with its own tensors lists them. */
    wb_mpw_str(&w, "inv");
    wb_mpw_array(&w, 0);
    int err = wb_chan_send(&a->call, &w);
    wb_mpw_free(&w);
    wb_log(WB_LOG_DEBUG, M, "%s rank %u: register sent: %s", a->role, a->o.rank, wb_strerror(err));
    a->registering = err == 0;
    a->call_is_report = false;
}

/* Starts a message that identifies this agent's session; npairs more pairs follow. */
static void begin_session_msg(struct wb_agent *a, struct wb_mpw *w, uint32_t type, uint32_t npairs)
{
    wb_mpw_init(w);
    wb_msg_begin(w, type, a->o.token, npairs + 3);
    wb_msg_kstr(w, "role", a->role);
    wb_msg_ku64(w, "rank", a->o.rank);
    wb_msg_ku64(w, "session", a->session);
}

static void send_poll(struct wb_agent *a)
{
    struct wb_mpw w;
    begin_session_msg(a, &w, WB_MSG_POLL, 1);
    wb_msg_ku64(&w, "ack", a->last_seq);
    wb_chan_send(&a->pollc, &w);
    wb_mpw_free(&w);
}

/* Queues a report; it leaves when the call channel is free. */
static struct wb_mpw *report_begin(struct wb_agent *a, enum wb_report_kind what, bool ok,
                                   const char *err, uint32_t npairs)
{
    if (a->nq == MAX_QUEUED) {
        wb_log(WB_LOG_ERROR, M, "%s rank %u: report queue full", a->role, a->o.rank);
        return NULL;
    }
    struct wb_mpw *w = &a->queue[a->nq++];
    begin_session_msg(a, w, WB_MSG_REPORT, npairs + 3);
    wb_msg_ku64(w, "what", what);
    wb_msg_kbool(w, "ok", ok);
    wb_msg_kstr(w, "err", err ? err : "");
    return w;
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
        begin_session_msg(a, &w, WB_MSG_HEARTBEAT, 2);
        wb_msg_ku64(&w, "version", a->version);
        wb_msg_kbool(&w, "in_flight", a->in_flight);
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
        data_abort(a->d);
    a->xfer_active = false;
    a->in_flight = false;
    a->pollc.busy = false;
}

/* Handles an ERROR reply; returns a negative code when the agent must stop. */
static int on_error_reply(struct wb_agent *a, const struct wb_msg *m)
{
    int64_t code = 0;
    char msg[512] = "";
    wb_msg_i64(m, "code", &code);
    wb_msg_str(m, "msg", msg, sizeof(msg));
    if (code == -WB_E_TOKEN) {
        fprintf(stderr, "wb-agent: %s rank %u: controller %s: %s\n", a->role, a->o.rank,
                a->o.controller, msg);
        return -WB_E_TOKEN;
    }
    if (code == -WB_E_PEER) {
        lose_session(a, msg);
        return 0;
    }
    if (code == -EADDRINUSE && a->registering) { /* another live process holds the rank */
        wb_log(WB_LOG_WARN, M, "%s", msg);
        a->registering = false;
        a->retry_at = wb_now_ns() + a->hb_ns;
        return 0;
    }
    fprintf(stderr, "wb-agent: %s rank %u: controller %s: %s\n", a->role, a->o.rank,
            a->o.controller, msg);
    return a->registering ? -EINVAL : 0;
}

static void report_pop(struct wb_agent *a)
{
    wb_mpw_free(&a->queue[0]);
    memmove(&a->queue[0], &a->queue[1], (a->nq - 1) * sizeof(a->queue[0]));
    a->nq--;
}

static int on_call_reply(struct wb_agent *a, void *buf, size_t len)
{
    struct wb_msg m;
    const char *why;
    if (a->call_is_report && a->nq) /* answered (OK or ERROR): the report arrived */
        report_pop(a);
    a->call_is_report = false;
    /* ERROR replies are read without the token check: a controller refusing our token
     * cannot be expected to know it. */
    int err = wb_msg_open(buf, len, NULL, &m, &why);
    wb_log(WB_LOG_DEBUG, M, "%s rank %u: call reply type %#x: %s", a->role, a->o.rank, m.type,
           err ? why : "ok");
    if (err)
        return 0;
    if (m.type == WB_MSG_ERROR)
        return on_error_reply(a, &m);
    if (wb_msg_open(buf, len, a->o.token, &m, &why)) {
        wb_log(WB_LOG_ERROR, M, "reply from controller: %s", why);
        return 0;
    }
    if (m.type == WB_MSG_REGISTERED && a->registering) {
        a->registering = false;
        if (wb_msg_u64(&m, "session", &a->session))
            return -EBADMSG;
        wb_msg_u64(&m, "heartbeat_ns", &a->hb_ns);
        wb_msg_u64(&m, "dead_ns", &a->dead_ns);
        wb_msg_u64(&m, "poll_hold_ns", &a->hold_ns);
        a->last_seq = 0;
        wb_log(WB_LOG_INFO, M, "%s rank %u registered, session %" PRIu64, a->role, a->o.rank,
               a->session);
        send_poll(a);
    }
    return 0;
}

/* ---------------------------------------------------------------- commands */

static void cmd_setup(struct wb_agent *a, const struct wb_msg *b)
{
    struct agent_job j = {0};
    const void *plan = NULL, *shards = NULL, *addr = NULL, *regions = NULL;
    size_t plan_len = 0, shards_len = 0, addr_len = 0, regions_len = 0;
    char err[512] = "";
    wb_msg_u64(b, "gen", &j.gen);
    wb_msg_u64(b, "seed", &j.seed);
    wb_msg_u64(b, "mem_cap", &j.mem_cap);
    wb_msg_u64(b, "mode", &j.mode);
    wb_msg_str(b, "provider", j.provider, sizeof(j.provider));
    wb_msg_str(b, "trace", j.trace, sizeof(j.trace));
    wb_msg_str(b, "job", j.name, sizeof(j.name));
    wb_msg_bin(b, "plan", &plan, &plan_len);
    wb_msg_bin(b, "shards", &shards, &shards_len);
    a->job = j;
    if (a->xfer_active && a->d)
        data_abort(a->d);
    a->xfer_active = false;
    int rc = data_setup(&a->d, &a->o, &j, plan, plan_len, shards, shards_len, &addr, &addr_len,
                        &regions, &regions_len, err, sizeof(err));
    if (rc)
        wb_log(WB_LOG_ERROR, M, "%s rank %u: setup failed: %s", a->role, a->o.rank, err);
    struct wb_mpw *w = report_begin(a, WB_REP_SETUP, rc == 0, err, 3);
    if (!w)
        return;
    wb_msg_ku64(w, "gen", j.gen);
    wb_msg_kbin(w, "addr", addr, addr_len);
    wb_msg_kbin(w, "regions", regions, regions_len);
}

static void cmd_peers(struct wb_agent *a, const struct wb_msg *b)
{
    uint64_t gen = 0;
    const void *p = NULL;
    size_t n = 0;
    char err[512] = "";
    wb_msg_u64(b, "gen", &gen);
    struct wb_mpr r = wb_msg_get(b, "agents");
    if (r.err == 0) { /* the array object itself, as bytes */
        struct wb_mpr end = r;
        wb_mpr_skip(&end);
        p = r.p;
        n = (size_t)(end.p - r.p);
    }
    int rc = a->d ? data_peers(a->d, p, n, err, sizeof(err)) : -EINVAL;
    if (rc && !*err)
        snprintf(err, sizeof(err), "peers before setup");
    struct wb_mpw *w = report_begin(a, WB_REP_CONNECTED, rc == 0, err, 1);
    if (w)
        wb_msg_ku64(w, "gen", gen);
}

static void cmd_transfer(struct wb_agent *a, uint64_t version, uint64_t epoch)
{
    char err[512] = "";
    int rc = a->d ? data_start(a->d, version, epoch, err, sizeof(err)) : -EINVAL;
    if (rc) {
        if (!*err)
            snprintf(err, sizeof(err), "transfer before setup");
        struct wb_mpw *w = report_begin(
            a, a->o.role == WB_ROLE_TRAINER ? WB_REP_SENT : WB_REP_RECEIVED, false, err, 1);
        if (w)
            wb_msg_ku64(w, "version", version);
        return;
    }
    a->xfer_active = true;
    a->xfer_version = version;
    a->in_flight = a->o.role == WB_ROLE_ROLLOUT;
    a->pace_until = wb_now_ns() + a->o.pace_ns;
}

static int on_commands(struct wb_agent *a, void *buf, size_t len)
{
    struct wb_msg m;
    const char *why;
    if (wb_msg_open(buf, len, NULL, &m, &why))
        return 0;
    if (m.type == WB_MSG_ERROR)
        return on_error_reply(a, &m);
    if (wb_msg_open(buf, len, a->o.token, &m, &why) || m.type != WB_MSG_COMMANDS)
        return 0;
    struct wb_mpr r = wb_msg_get(&m, "cmds");
    uint32_t n = 0;
    if (wb_mpr_array(&r, WB_WIRE_MAX_ARRAY, &n))
        return 0;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t three;
        uint64_t seq = 0, kind = 0;
        wb_mpr_array(&r, 3, &three);
        wb_mpr_u64(&r, &seq);
        wb_mpr_u64(&r, &kind);
        struct wb_mpr body = r;
        if (wb_mpr_skip(&r) || three != 3)
            return 0;
        if (seq <= a->last_seq)
            continue; /* seen before: a re-sent command */
        a->last_seq = seq;
        struct wb_msg bm;
        if (wb_msg_index(&body, &bm))
            continue;
        bm.type = (uint32_t)kind;
        uint64_t version = 0, epoch = 0;
        wb_msg_u64(&bm, "version", &version);
        wb_msg_u64(&bm, "epoch", &epoch);
        switch (kind) {
        case WB_CMD_SETUP:
            cmd_setup(a, &bm);
            break;
        case WB_CMD_PEERS:
            cmd_peers(a, &bm);
            break;
        case WB_CMD_TRANSFER:
            cmd_transfer(a, version, epoch);
            break;
        case WB_CMD_COMPLETE:
            if (a->o.role == WB_ROLE_ROLLOUT) {
                char err[512] = "";
                int rc =
                    a->o.dump && a->d ? data_dump(a->d, a->o.dump, version, err, sizeof(err)) : 0;
                if (rc)
                    wb_log(WB_LOG_ERROR, M, "rollout rank %u: %s", a->o.rank, err);
                a->version = version;
                a->in_flight = false;
                struct wb_mpw *w = report_begin(a, WB_REP_COMMITTED, true, NULL, 1);
                if (w)
                    wb_msg_ku64(w, "version", version);
                wb_log(WB_LOG_INFO, M, "rollout rank %u: version %" PRIu64 " complete", a->o.rank,
                       version);
            }
            break;
        case WB_CMD_ABORT: {
            char reason[512] = "";
            wb_msg_str(&bm, "reason", reason, sizeof(reason));
            wb_log(WB_LOG_WARN, M, "%s rank %u: transfer %" PRIu64 " aborted: %s", a->role,
                   a->o.rank, version, reason);
            if (a->xfer_active && a->xfer_version == version && a->d)
                data_abort(a->d);
            if (a->xfer_version == version) {
                a->xfer_active = false;
                a->in_flight = false;
            }
            break;
        }
        case WB_CMD_EXIT:
            a->exiting = true;
            break;
        default:
            break;
        }
    }
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
        data_poll(a->d);
        return;
    }
    if (data_progress(a->d, &done) != 1 || !a->xfer_active)
        return;
    a->xfer_active = false;
    bool tr = a->o.role == WB_ROLE_TRAINER;
    struct wb_mpw *w =
        report_begin(a, tr ? WB_REP_SENT : WB_REP_RECEIVED, done.ok, done.err, tr ? 2 : 2);
    if (!w)
        return;
    wb_msg_ku64(w, "version", a->xfer_version);
    if (tr) {
        wb_mpw_str(w, "stats");
        wb_xfer_stats_put(w, &done.stats);
    } else {
        wb_msg_ku64(w, "bytes", done.rx_bytes);
    }
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
        poll(p, 2, a->xfer_active ? 0 : a->d && data_busy(a->d) ? 1 : 10);
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
    data_free(a->d);
    wb_chan_close(&a->pollc);
    wb_chan_close(&a->call);
    free(a);
}
