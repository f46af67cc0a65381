/* controller.c — the controller's single-threaded event loop: agent membership (register,
 * heartbeat, death by silence), the setup handshake that hands out the plan, transfers
 * (trigger, collect reports, publish "version N complete" to rollouts, or fail naming the
 * rank), and the client requests of wb-ctl.
 *
 * One raw REP socket carries everything (see controller.h). A request is either answered at
 * once or kept ("held"): agent polls are held until a command is queued for that agent or
 * poll_hold passes; a client's transfer request is held until the transfer ends. Every held
 * request has a deadline, so nothing waits forever on either side.
 *
 * Setup handshake, run whenever the set of live agent sessions changes (start-up, restart):
 *   SETUP(gen) to every agent whose session has not been set up  -> REPORT setup {addr, regions}
 *   PEERS(gen) with every agent's addr+regions to every trainer  -> REPORT connected
 *   then READY: transfers may run. */
#include "controller/ctl.h"

#include <errno.h>
#include <inttypes.h>
#include <nng/nng.h>
#include <nng/protocol/reqrep0/rep.h>
#include <poll.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

enum ctl_state { ST_WAITING = 0, ST_SETUP, ST_CONNECT, ST_READY };
static const char *const state_names[] = {"waiting", "setup", "connect", "ready"};

struct cmd {
    uint64_t seq;
    struct wb_mpw body; /* [seq, kind, body] already encoded */
};

struct agent {
    enum wb_role role;
    uint32_t rank;
    bool alive;
    uint64_t session; /* 0: never registered */
    uint64_t last_ns;
    char host[64];
    uint64_t pid;
    int64_t device;
    /* setup */
    uint64_t setup_session;  /* session whose SETUP report arrived */
    uint64_t connected_gen;  /* gen of the last CONNECTED report */
    struct ctl_blob addr;    /* transport address (REPORT setup) */
    struct ctl_blob regions; /* memory descriptors (REPORT setup) */
    /* commands */
    struct cmd *cmds;
    size_t ncmds, capcmds;
    uint64_t next_seq;
    nng_msg *held; /* an open poll */
    uint64_t held_until;
    /* rollout state (heartbeats) */
    uint64_t version;
    bool in_flight;
    /* current transfer */
    bool done, committed;
    struct wb_xfer_stats stats;
    uint64_t rx_bytes;
};

struct xfer {
    bool active;
    uint64_t version;
    uint64_t start_ns, deadline;
    nng_msg *client; /* held wb-ctl request */
    uint32_t trainers_done, rollouts_done, committed;
    bool completing; /* COMPLETE sent, waiting for COMMITTED */
};

struct wb_controller {
    const struct wb_job *job;
    nng_socket sock;
    int fd;
    struct ctl_plan plan;
    uint32_t nagents;
    struct agent *agents; /* trainers first, then rollouts */
    enum ctl_state state;
    uint64_t gen;
    uint64_t sessions;     /* session ids handed out */
    uint64_t last_version; /* last complete transfer */
    uint64_t epochs;       /* transfer attempts started */
    struct xfer x;
    bool shutting_down;
    uint64_t exit_deadline, exit_linger;
};

static const char *M = "controller";

static struct agent *agent_at(struct wb_controller *c, enum wb_role role, uint32_t rank)
{
    uint32_t n = role == WB_ROLE_TRAINER ? c->plan.ntrainers : c->plan.nrollouts;
    if (rank >= n)
        return NULL;
    return &c->agents[(role == WB_ROLE_TRAINER ? 0 : c->plan.ntrainers) + rank];
}

/* ---------------------------------------------------------------- replies */

/* Sends body as the reply to req (whose header routes it back); consumes req. */
static void reply(struct wb_controller *c, nng_msg *req, const struct wb_mpw *body)
{
    nng_msg_clear(req);
    if (body->err || nng_msg_append(req, body->buf, body->len) != 0 ||
        nng_sendmsg(c->sock, req, 0) != 0) {
        wb_log(WB_LOG_WARN, M, "a reply could not be sent");
        nng_msg_free(req);
    }
}

static void reply_error(struct wb_controller *c, nng_msg *req, int code, const char *msg)
{
    struct wb_mpw w;
    wb_mpw_init(&w);
    wb_msg_error(&w, c->job->token, code, msg);
    reply(c, req, &w);
    wb_mpw_free(&w);
}

static void reply_ok(struct wb_controller *c, nng_msg *req)
{
    struct wb_mpw w;
    wb_mpw_init(&w);
    wb_msg_begin(&w, WB_MSG_OK, c->job->token, 0);
    reply(c, req, &w);
    wb_mpw_free(&w);
}

/* ---------------------------------------------------------------- commands */

/* Queues a command for an agent; the body is written by the caller into the returned writer
 * after this call ([seq, kind, <body>]). Returns NULL on allocation failure. */
static struct wb_mpw *cmd_push(struct agent *a, enum wb_cmd_kind kind)
{
    if (a->ncmds == a->capcmds) {
        size_t cap = a->capcmds ? 2 * a->capcmds : 8;
        struct cmd *n = realloc(a->cmds, cap * sizeof(*n));
        if (!n)
            return NULL;
        a->cmds = n;
        a->capcmds = cap;
    }
    struct cmd *cm = &a->cmds[a->ncmds++];
    cm->seq = ++a->next_seq;
    wb_mpw_init(&cm->body);
    wb_mpw_array(&cm->body, 3);
    wb_mpw_u64(&cm->body, cm->seq);
    wb_mpw_u64(&cm->body, kind);
    return &cm->body;
}

static void cmds_ack(struct agent *a, uint64_t ack)
{
    size_t keep = 0;
    for (size_t i = 0; i < a->ncmds; i++) {
        if (a->cmds[i].seq <= ack)
            wb_mpw_free(&a->cmds[i].body);
        else
            a->cmds[keep++] = a->cmds[i];
    }
    a->ncmds = keep;
}

static void cmds_clear(struct agent *a)
{
    cmds_ack(a, UINT64_MAX);
    a->next_seq = 0;
}

/* Appends an already encoded object (common's writer has no raw append). */
static void mpw_raw(struct wb_mpw *w, const struct wb_mpw *obj)
{
    if (w->err || obj->err) {
        w->err = w->err ? w->err : obj->err;
        return;
    }
    if (w->len + obj->len > w->cap) {
        size_t cap = w->cap ? w->cap : 256;
        while (cap < w->len + obj->len)
            cap *= 2;
        uint8_t *nb = realloc(w->buf, cap);
        if (!nb) {
            w->err = -ENOMEM;
            return;
        }
        w->buf = nb;
        w->cap = cap;
    }
    memcpy(w->buf + w->len, obj->buf, obj->len);
    w->len += obj->len;
}

/* Answers the agent's held poll with its pending commands. */
static void flush_poll(struct wb_controller *c, struct agent *a)
{
    if (!a->held)
        return;
    struct wb_mpw w;
    wb_mpw_init(&w);
    wb_msg_begin(&w, WB_MSG_COMMANDS, c->job->token, 1);
    wb_mpw_str(&w, "cmds");
    wb_mpw_array(&w, (uint32_t)a->ncmds);
    for (size_t i = 0; i < a->ncmds; i++)
        mpw_raw(&w, &a->cmds[i].body);
    reply(c, a->held, &w);
    wb_mpw_free(&w);
    a->held = NULL;
}

static void queue_simple(struct wb_controller *c, struct agent *a, enum wb_cmd_kind kind,
                         uint64_t version, const char *reason)
{
    struct wb_mpw *w = cmd_push(a, kind);
    if (!w)
        return;
    wb_mpw_map(w, reason ? 2 : 1);
    wb_msg_ku64(w, "version", version);
    if (reason)
        wb_msg_kstr(w, "reason", reason);
    flush_poll(c, a);
}

/* ---------------------------------------------------------------- membership */

static bool agents_all_alive(struct wb_controller *c, char *why, size_t cap)
{
    for (uint32_t i = 0; i < c->nagents; i++) {
        struct agent *a = &c->agents[i];
        if (!a->alive) {
            snprintf(why, cap, "waiting for %s rank %u (%s)", wb_role_name(a->role), a->rank,
                     a->session ? "dead" : "not registered");
            return false;
        }
    }
    return true;
}

static void xfer_fail(struct wb_controller *c, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static void set_state(struct wb_controller *c, enum ctl_state s)
{
    if (c->state != s)
        wb_log(WB_LOG_INFO, M, "state %s -> %s (gen %" PRIu64 ")", state_names[c->state],
               state_names[s], c->gen);
    c->state = s;
}

static void send_setup(struct wb_controller *c, struct agent *a)
{
    struct wb_mpw *w = cmd_push(a, WB_CMD_SETUP);
    if (!w)
        return;
    const struct wb_job *j = c->job;
    bool tr = a->role == WB_ROLE_TRAINER;
    const struct ctl_blob *tbl = tr ? &c->plan.table[a->rank] : &c->plan.recv[a->rank];
    wb_mpw_map(w, 10);
    wb_msg_ku64(w, "gen", c->gen);
    wb_msg_ku64(w, "session", a->session);
    wb_msg_ku64(w, "seed", j->seed);
    wb_msg_ku64(w, "mem_cap", j->mem_cap);
    wb_msg_ku64(w, "mode", (uint64_t)j->mode);
    wb_msg_kstr(w, "provider", j->provider);
    wb_msg_kstr(w, "trace", j->trace);
    wb_msg_kstr(w, "job", j->name);
    wb_msg_kbin(w, "plan", tbl->buf, tbl->len);
    if (tr)
        wb_msg_kbin(w, "shards", c->plan.shards[a->rank].buf, c->plan.shards[a->rank].len);
    else
        wb_msg_ku64(w, "expect_bytes", c->plan.expect_bytes[a->rank]);
    flush_poll(c, a);
}

static void send_peers(struct wb_controller *c)
{
    for (uint32_t t = 0; t < c->plan.ntrainers; t++) {
        struct agent *a = &c->agents[t];
        struct wb_mpw *w = cmd_push(a, WB_CMD_PEERS);
        if (!w)
            continue;
        wb_mpw_map(w, 2);
        wb_msg_ku64(w, "gen", c->gen);
        wb_mpw_str(w, "agents");
        wb_mpw_array(w, c->nagents);
        for (uint32_t i = 0; i < c->nagents; i++) {
            struct agent *p = &c->agents[i];
            wb_mpw_array(w, 4);
            wb_mpw_u64(w, p->role);
            wb_mpw_u64(w, p->rank);
            wb_mpw_bin(w, p->addr.len ? p->addr.buf : (uint8_t *)"", p->addr.len);
            wb_mpw_bin(w, p->regions.len ? p->regions.buf : (uint8_t *)"", p->regions.len);
        }
        flush_poll(c, a);
    }
}

/* Moves the setup state machine forward after any event. */
static void advance(struct wb_controller *c)
{
    char why[128];
    if (!agents_all_alive(c, why, sizeof(why))) {
        if (c->state != ST_WAITING) {
            if (c->x.active)
                xfer_fail(c, "%s", why);
            set_state(c, ST_WAITING);
        }
        return;
    }
    if (c->state == ST_WAITING) {
        c->gen++;
        set_state(c, ST_SETUP);
        for (uint32_t i = 0; i < c->nagents; i++)
            if (c->agents[i].setup_session != c->agents[i].session)
                send_setup(c, &c->agents[i]);
    }
    if (c->state == ST_SETUP) {
        for (uint32_t i = 0; i < c->nagents; i++)
            if (c->agents[i].setup_session != c->agents[i].session)
                return;
        set_state(c, ST_CONNECT);
        send_peers(c);
    }
    if (c->state == ST_CONNECT) {
        for (uint32_t t = 0; t < c->plan.ntrainers; t++)
            if (c->agents[t].connected_gen != c->gen)
                return;
        set_state(c, ST_READY);
        wb_log(WB_LOG_INFO, M, "ready: %u trainers, %u rollouts", c->plan.ntrainers,
               c->plan.nrollouts);
    }
}

/* A new session for (role, rank): a restart, or a re-registration after the controller lost
 * the agent. Everything learnt from the old session is forgotten. */
static void agent_reset(struct agent *a)
{
    if (a->held) {
        nng_msg_free(a->held);
        a->held = NULL;
    }
    cmds_clear(a);
    free(a->addr.buf);
    free(a->regions.buf);
    a->addr = (struct ctl_blob){0};
    a->regions = (struct ctl_blob){0};
    a->setup_session = 0;
    a->connected_gen = 0;
    a->version = 0;
    a->in_flight = false;
}

static void check_dead(struct wb_controller *c, uint64_t now)
{
    for (uint32_t i = 0; i < c->nagents; i++) {
        struct agent *a = &c->agents[i];
        /* An agent handling SETUP is busy for a while (transport open, allocation and
         * registration block its loop): it gets four times the silence before it counts as
         * dead, so a slow setup does not start a new round. */
        uint64_t limit = c->job->dead_ns;
        if (c->state == ST_SETUP && a->setup_session != a->session)
            limit *= 4;
        if (a->alive && now - a->last_ns > limit) {
            a->alive = false;
            wb_log(WB_LOG_WARN, M, "%s rank %u is dead: silent for %.2f s", wb_role_name(a->role),
                   a->rank, (double)(now - a->last_ns) / 1e9);
            if (c->x.active)
                xfer_fail(c, "%s rank %u died (silent for %.2f s)", wb_role_name(a->role), a->rank,
                          (double)(now - a->last_ns) / 1e9);
            agent_reset(a);
        }
    }
}

/* ---------------------------------------------------------------- transfers */

static void xfer_end(struct wb_controller *c)
{
    c->x = (struct xfer){0};
    for (uint32_t i = 0; i < c->nagents; i++) {
        c->agents[i].done = false;
        c->agents[i].committed = false;
    }
}

static void xfer_fail(struct wb_controller *c, const char *fmt, ...)
{
    char why[512], msg[600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof(why), fmt, ap);
    va_end(ap);
    snprintf(msg, sizeof(msg), "transfer %" PRIu64 " failed: %s", c->x.version, why);
    wb_log(WB_LOG_WARN, M, "%s", msg);
    for (uint32_t i = 0; i < c->nagents; i++)
        if (c->agents[i].alive)
            queue_simple(c, &c->agents[i], WB_CMD_ABORT, c->x.version, why);
    if (c->x.client)
        reply_error(c, c->x.client, -WB_E_PEER, msg);
    xfer_end(c);
}

static void xfer_result(struct wb_controller *c)
{
    struct wb_mpw w;
    uint64_t now = wb_now_ns();
    wb_mpw_init(&w);
    wb_msg_begin(&w, WB_MSG_RESULT, c->job->token, 5);
    wb_msg_ku64(&w, "version", c->x.version);
    wb_msg_ku64(&w, "total_ns", now - c->x.start_ns);
    wb_msg_ku64(&w, "gen", c->gen);
    wb_mpw_str(&w, "trainers");
    wb_mpw_array(&w, c->plan.ntrainers);
    for (uint32_t t = 0; t < c->plan.ntrainers; t++)
        wb_xfer_stats_put(&w, &c->agents[t].stats);
    wb_mpw_str(&w, "rollout_bytes");
    wb_mpw_array(&w, c->plan.nrollouts);
    for (uint32_t r = 0; r < c->plan.nrollouts; r++)
        wb_mpw_u64(&w, c->agents[c->plan.ntrainers + r].rx_bytes);
    wb_log(WB_LOG_INFO, M, "transfer %" PRIu64 " complete in %.3f s", c->x.version,
           (double)(now - c->x.start_ns) / 1e9);
    if (c->x.client)
        reply(c, c->x.client, &w);
    wb_mpw_free(&w);
    c->last_version = c->x.version;
    xfer_end(c);
}

/* After each report: all trainers sent and all rollouts counted -> publish; all committed ->
 * answer the client. */
static void xfer_check(struct wb_controller *c)
{
    if (!c->x.active)
        return;
    if (!c->x.completing && c->x.trainers_done == c->plan.ntrainers &&
        c->x.rollouts_done == c->plan.nrollouts) {
        c->x.completing = true;
        for (uint32_t r = 0; r < c->plan.nrollouts; r++)
            queue_simple(c, &c->agents[c->plan.ntrainers + r], WB_CMD_COMPLETE, c->x.version, NULL);
    }
    if (c->x.completing && c->x.committed == c->plan.nrollouts)
        xfer_result(c);
}

static void on_ctl_transfer(struct wb_controller *c, nng_msg *req, const struct wb_msg *m)
{
    uint64_t v, timeout = c->job->transfer_ns;
    char why[160], msg[256];
    if (wb_msg_u64(m, "version", &v) || v == 0) {
        reply_error(c, req, -EINVAL, "transfer: version must be a positive integer");
        return;
    }
    wb_msg_u64(m, "timeout_ns", &timeout);
    if (c->shutting_down) {
        reply_error(c, req, -WB_E_PEER, "controller is shutting down");
        return;
    }
    if (c->x.active) {
        snprintf(msg, sizeof(msg), "transfer %" PRIu64 " is in flight", c->x.version);
        reply_error(c, req, -EBUSY, msg);
        return;
    }
    if (v <= c->last_version) {
        snprintf(msg, sizeof(msg),
                 "version %" PRIu64 " is not newer than the last complete version %" PRIu64, v,
                 c->last_version);
        reply_error(c, req, -EINVAL, msg);
        return;
    }
    if (c->state != ST_READY) {
        if (agents_all_alive(c, why, sizeof(why)))
            snprintf(why, sizeof(why), "agents are in %s (gen %" PRIu64 ")", state_names[c->state],
                     c->gen);
        snprintf(msg, sizeof(msg), "not ready: %s", why);
        reply_error(c, req, -EAGAIN, msg);
        return;
    }
    xfer_end(c);
    c->x.active = true;
    c->x.version = v;
    c->x.start_ns = wb_now_ns();
    c->x.deadline = c->x.start_ns + timeout;
    c->x.client = req;
    c->epochs++; /* each attempt has its own epoch: agents tag its immediates with it */
    for (uint32_t i = 0; i < c->nagents; i++) {
        struct agent *a = &c->agents[i];
        a->stats = (struct wb_xfer_stats){.rank = a->rank};
        a->rx_bytes = 0;
        struct wb_mpw *w = cmd_push(a, WB_CMD_TRANSFER);
        if (!w)
            continue;
        wb_mpw_map(w, 2);
        wb_msg_ku64(w, "version", v);
        wb_msg_ku64(w, "epoch", c->epochs);
        flush_poll(c, a);
    }
    wb_log(WB_LOG_INFO, M, "transfer %" PRIu64 " started", v);
}

static void xfer_timeout(struct wb_controller *c, uint64_t now)
{
    if (!c->x.active || now < c->x.deadline)
        return;
    char list[300];
    size_t pos = 0;
    list[0] = 0;
    for (uint32_t i = 0; i < c->nagents && pos < sizeof(list) - 40; i++) {
        struct agent *a = &c->agents[i];
        bool pending = c->x.completing ? a->role == WB_ROLE_ROLLOUT && !a->committed : !a->done;
        if (pending)
            pos += (size_t)snprintf(list + pos, sizeof(list) - pos, "%s%s rank %u", pos ? ", " : "",
                                    wb_role_name(a->role), a->rank);
    }
    xfer_fail(c, "timed out after %.1f s waiting for %s", (double)(now - c->x.start_ns) / 1e9,
              list);
}

/* ---------------------------------------------------------------- agent messages */

static void on_register(struct wb_controller *c, nng_msg *req, const struct wb_msg *m)
{
    char role_s[16], msg[256];
    enum wb_role role;
    uint64_t rank;
    if (wb_msg_str(m, "role", role_s, sizeof(role_s)) || wb_role_parse(role_s, &role) ||
        wb_msg_u64(m, "rank", &rank)) {
        reply_error(c, req, -EINVAL, "register: role (trainer|rollout) and rank are required");
        return;
    }
    struct agent *a = agent_at(c, role, (uint32_t)rank);
    if (!a || rank > UINT32_MAX) {
        snprintf(msg, sizeof(msg), "register: %s rank %" PRIu64 " is outside the job's %u %ss",
                 role_s, rank, role == WB_ROLE_TRAINER ? c->plan.ntrainers : c->plan.nrollouts,
                 role_s);
        reply_error(c, req, -EINVAL, msg);
        return;
    }
    if (c->shutting_down) {
        reply_error(c, req, -WB_E_PEER, "controller is shutting down");
        return;
    }
    char host[64] = "";
    uint64_t pid = 0;
    wb_msg_str(m, "host", host, sizeof(host));
    wb_msg_u64(m, "pid", &pid);
    if (a->alive && (pid != a->pid || strcmp(host, a->host) != 0)) {
        /* Two live processes claiming one rank would take the rank from each other forever;
         * the newcomer waits until the holder is dead (silent for dead_after). */
        snprintf(msg, sizeof(msg),
                 "register: %s rank %u is held by %s pid %" PRIu64 " (alive); retry after it exits",
                 role_s, a->rank, a->host, a->pid);
        reply_error(c, req, -EADDRINUSE, msg);
        return;
    }
    if (a->session) {
        wb_log(WB_LOG_INFO, M, "%s rank %u re-registers (session %" PRIu64 " replaced)", role_s,
               a->rank, a->session);
        if (c->x.active)
            xfer_fail(c, "%s rank %u restarted", role_s, a->rank);
    }
    agent_reset(a);
    a->session = ++c->sessions;
    a->alive = true;
    a->last_ns = wb_now_ns();
    memcpy(a->host, host, sizeof(a->host));
    a->pid = pid;
    a->device = -1;
    wb_msg_i64(m, "device", &a->device);
    wb_log(WB_LOG_INFO, M,
           "%s rank %u registered: host %s pid %" PRIu64 " device %" PRId64 " session %" PRIu64,
           role_s, a->rank, a->host, a->pid, a->device, a->session);

    struct wb_mpw w;
    wb_mpw_init(&w);
    wb_msg_begin(&w, WB_MSG_REGISTERED, c->job->token, 4);
    wb_msg_ku64(&w, "session", a->session);
    wb_msg_ku64(&w, "heartbeat_ns", c->job->heartbeat_ns);
    wb_msg_ku64(&w, "dead_ns", c->job->dead_ns);
    wb_msg_ku64(&w, "poll_hold_ns", c->job->poll_hold_ns);
    reply(c, req, &w);
    wb_mpw_free(&w);
    /* A new session always means a new setup round (its buffers and address are new). */
    set_state(c, ST_WAITING);
}

/* The agent a session-carrying message comes from, or NULL after replying with an error. */
static struct agent *session_agent(struct wb_controller *c, nng_msg *req, const struct wb_msg *m)
{
    char role_s[16], msg[200];
    enum wb_role role;
    uint64_t rank, session;
    if (wb_msg_str(m, "role", role_s, sizeof(role_s)) || wb_role_parse(role_s, &role) ||
        wb_msg_u64(m, "rank", &rank) || wb_msg_u64(m, "session", &session)) {
        reply_error(c, req, -EINVAL, "role, rank and session are required");
        return NULL;
    }
    struct agent *a = agent_at(c, role, (uint32_t)rank);
    if (!a || !a->alive || a->session != session) {
        snprintf(msg, sizeof(msg),
                 "%s rank %" PRIu64 ": unknown session %" PRIu64 ": register again", role_s, rank,
                 session);
        reply_error(c, req, -WB_E_PEER, msg);
        return NULL;
    }
    a->last_ns = wb_now_ns();
    return a;
}

static void on_heartbeat(struct wb_controller *c, nng_msg *req, const struct wb_msg *m)
{
    struct agent *a = session_agent(c, req, m);
    if (!a)
        return;
    wb_msg_u64(m, "version", &a->version);
    wb_msg_bool(m, "in_flight", &a->in_flight);
    reply_ok(c, req);
}

static int blob_set(struct ctl_blob *b, const void *p, size_t n)
{
    uint8_t *nb = malloc(n ? n : 1);
    if (!nb)
        return -ENOMEM;
    if (n)
        memcpy(nb, p, n);
    free(b->buf);
    b->buf = nb;
    b->len = n;
    return 0;
}

static void on_report(struct wb_controller *c, nng_msg *req, const struct wb_msg *m)
{
    struct agent *a = session_agent(c, req, m);
    if (!a)
        return;
    uint64_t what = 0, gen = 0, version = 0;
    bool ok = false;
    char err[512] = "";
    wb_msg_u64(m, "what", &what);
    wb_msg_u64(m, "gen", &gen);
    wb_msg_u64(m, "version", &version);
    wb_msg_bool(m, "ok", &ok);
    wb_msg_str(m, "err", err, sizeof(err));
    const char *role = wb_role_name(a->role);
    switch (what) {
    case WB_REP_SETUP: {
        const void *p;
        size_t n;
        if (!ok) {
            wb_log(WB_LOG_ERROR, M, "%s rank %u setup failed: %s", role, a->rank, err);
            break;
        }
        if (gen != c->gen)
            break;
        if (wb_msg_bin(m, "addr", &p, &n) == 0 && blob_set(&a->addr, p, n) == 0 &&
            wb_msg_bin(m, "regions", &p, &n) == 0 && blob_set(&a->regions, p, n) == 0)
            a->setup_session = a->session;
        break;
    }
    case WB_REP_CONNECTED:
        if (!ok)
            wb_log(WB_LOG_ERROR, M, "%s rank %u could not connect: %s", role, a->rank, err);
        else
            a->connected_gen = gen;
        break;
    case WB_REP_SENT:
    case WB_REP_RECEIVED:
        if (!c->x.active || version != c->x.version || a->done)
            break;
        if (!ok) {
            reply_ok(c, req);
            xfer_fail(c, "%s rank %u: %s", role, a->rank, err);
            advance(c);
            return;
        }
        a->done = true;
        if (what == WB_REP_SENT) {
            struct wb_mpr r = wb_msg_get(m, "stats");
            if (wb_xfer_stats_get(&r, &a->stats) == 0)
                a->stats.rank = a->rank;
            c->x.trainers_done++;
        } else {
            wb_msg_u64(m, "bytes", &a->rx_bytes);
            c->x.rollouts_done++;
        }
        break;
    case WB_REP_COMMITTED:
        if (c->x.active && c->x.completing && version == c->x.version && !a->committed) {
            a->committed = true;
            a->version = version;
            a->in_flight = false;
            c->x.committed++;
        }
        break;
    default:
        reply_error(c, req, -EINVAL, "report: unknown kind");
        return;
    }
    reply_ok(c, req);
    advance(c);
    xfer_check(c);
}

static void on_poll(struct wb_controller *c, nng_msg *req, const struct wb_msg *m)
{
    struct agent *a = session_agent(c, req, m);
    if (!a)
        return;
    uint64_t ack = 0;
    wb_msg_u64(m, "ack", &ack);
    cmds_ack(a, ack);
    if (a->held) /* the agent gave up on its previous poll */
        nng_msg_free(a->held);
    a->held = req;
    a->held_until = wb_now_ns() + c->job->poll_hold_ns;
    if (a->ncmds)
        flush_poll(c, a);
}

/* ---------------------------------------------------------------- client messages */

static void on_ctl_status(struct wb_controller *c, nng_msg *req)
{
    struct wb_mpw w;
    uint64_t now = wb_now_ns();
    wb_mpw_init(&w);
    wb_msg_begin(&w, WB_MSG_STATUS, c->job->token, 6);
    wb_msg_kstr(&w, "job", c->job->name);
    wb_msg_kstr(&w, "state", state_names[c->state]);
    wb_msg_ku64(&w, "gen", c->gen);
    wb_msg_ku64(&w, "version", c->last_version);
    wb_msg_ku64(&w, "in_flight", c->x.active ? c->x.version : 0);
    wb_mpw_str(&w, "agents");
    wb_mpw_array(&w, c->nagents);
    for (uint32_t i = 0; i < c->nagents; i++) {
        struct agent *a = &c->agents[i];
        wb_mpw_map(&w, 9);
        wb_msg_kstr(&w, "role", wb_role_name(a->role));
        wb_msg_ku64(&w, "rank", a->rank);
        wb_msg_kstr(&w, "state", a->alive ? "alive" : a->session ? "dead" : "absent");
        wb_msg_kstr(&w, "host", a->host);
        wb_msg_ku64(&w, "pid", a->pid);
        wb_msg_ki64(&w, "device", a->device);
        wb_msg_ku64(&w, "version", a->version);
        wb_msg_kbool(&w, "in_flight", a->in_flight);
        wb_msg_ku64(&w, "seen_ms", a->session ? (now - a->last_ns) / 1000000 : 0);
    }
    reply(c, req, &w);
    wb_mpw_free(&w);
}

static void on_ctl_plan(struct wb_controller *c, nng_msg *req)
{
    struct wb_mpw w;
    wb_mpw_init(&w);
    wb_msg_begin(&w, WB_MSG_PLAN_INFO, c->job->token, 1);
    wb_msg_kstr(&w, "summary", c->plan.summary);
    reply(c, req, &w);
    wb_mpw_free(&w);
}

static void on_ctl_shutdown(struct wb_controller *c, nng_msg *req)
{
    if (c->x.active)
        xfer_fail(c, "controller shutting down");
    c->shutting_down = true;
    c->exit_deadline = wb_now_ns() + c->job->poll_hold_ns + 2 * c->job->heartbeat_ns;
    c->exit_linger = wb_now_ns() + 200 * 1000000ull;
    for (uint32_t i = 0; i < c->nagents; i++)
        if (c->agents[i].alive)
            queue_simple(c, &c->agents[i], WB_CMD_EXIT, 0, NULL);
    wb_log(WB_LOG_INFO, M, "shutting down");
    reply_ok(c, req);
}

/* ---------------------------------------------------------------- the loop */

static void on_message(struct wb_controller *c, nng_msg *req)
{
    struct wb_msg m;
    const char *why = NULL;
    int err = wb_msg_open(nng_msg_body(req), nng_msg_len(req), c->job->token, &m, &why);
    if (err) {
        wb_log(WB_LOG_WARN, M, "%s", why);
        reply_error(c, req, err, why);
        return;
    }
    switch (m.type) {
    case WB_MSG_REGISTER:
        on_register(c, req, &m);
        break;
    case WB_MSG_HEARTBEAT:
        on_heartbeat(c, req, &m);
        break;
    case WB_MSG_REPORT:
        on_report(c, req, &m);
        return; /* advance() already ran */
    case WB_MSG_POLL:
        on_poll(c, req, &m);
        break;
    case WB_MSG_CTL_TRANSFER:
        on_ctl_transfer(c, req, &m);
        break;
    case WB_MSG_CTL_STATUS:
        on_ctl_status(c, req);
        break;
    case WB_MSG_CTL_PLAN:
        on_ctl_plan(c, req);
        break;
    case WB_MSG_CTL_SHUTDOWN:
        on_ctl_shutdown(c, req);
        break;
    default:
        reply_error(c, req, -EBADMSG, "refused: unknown message type");
        return;
    }
    advance(c);
}

static void on_tick(struct wb_controller *c, uint64_t now)
{
    check_dead(c, now);
    for (uint32_t i = 0; i < c->nagents; i++) {
        struct agent *a = &c->agents[i];
        if (a->held && now >= a->held_until)
            flush_poll(c, a); /* an empty answer: the agent polls again */
    }
    xfer_timeout(c, now);
    advance(c);
}

/* Shutdown is done when every live agent acknowledged its EXIT, or at the deadline. */
static bool shutdown_done(struct wb_controller *c, uint64_t now)
{
    if (now >= c->exit_deadline)
        return true;
    /* Replies leave asynchronously: give the last ones (the client's OK) time to be written
     * before the socket closes. */
    if (now < c->exit_linger)
        return false;
    for (uint32_t i = 0; i < c->nagents; i++)
        if (c->agents[i].alive && c->agents[i].ncmds)
            return false;
    return true;
}

int wb_controller_run(struct wb_controller *c)
{
    for (;;) {
        uint64_t now = wb_now_ns();
        if (c->shutting_down && shutdown_done(c, now))
            return 0;
        struct pollfd p = {.fd = c->fd, .events = POLLIN};
        poll(&p, 1, 20);
        for (int k = 0; k < 64; k++) {
            nng_msg *req;
            int rv = nng_recvmsg(c->sock, &req, NNG_FLAG_NONBLOCK);
            if (rv == NNG_EAGAIN)
                break;
            if (rv) {
                wb_log(WB_LOG_ERROR, M, "receive: %s", nng_strerror(rv));
                return -EIO;
            }
            on_message(c, req);
        }
        on_tick(c, wb_now_ns());
    }
}

int wb_controller_create(const struct wb_job *job, struct wb_controller **out,
                         struct wb_errlist *el)
{
    struct wb_controller *c = calloc(1, sizeof(*c));
    if (!c)
        return -ENOMEM;
    c->job = job;
    int rv, err = ctl_plan_build(job, &c->plan, el);
    if (err)
        goto err_free;
    c->nagents = c->plan.ntrainers + c->plan.nrollouts;
    c->agents = calloc(c->nagents ? c->nagents : 1, sizeof(*c->agents));
    if (!c->agents) {
        err = -ENOMEM;
        goto err_plan;
    }
    for (uint32_t i = 0; i < c->nagents; i++) {
        bool tr = i < c->plan.ntrainers;
        c->agents[i].role = tr ? WB_ROLE_TRAINER : WB_ROLE_ROLLOUT;
        c->agents[i].rank = tr ? i : i - c->plan.ntrainers;
        c->agents[i].device = -1;
    }
    if ((rv = nng_rep0_open_raw(&c->sock)) != 0) {
        wb_errlist_add(el, "controller: cannot open a socket: %s", nng_strerror(rv));
        err = -EIO;
        goto err_agents;
    }
    nng_socket_set_size(c->sock, NNG_OPT_RECVMAXSZ, 1 << 30);
    /* Sends block only while the previous reply to the same agent is still being written
     * (nng's raw REP cannot queue a second one without blocking); a stuck peer costs at most
     * this long, then the reply is dropped and the peer's request times out and repeats. */
    nng_socket_set_ms(c->sock, NNG_OPT_SENDTIMEO, 200);
    if ((rv = nng_listen(c->sock, job->listen, NULL, 0)) != 0) {
        wb_errlist_add(el, "controller: cannot listen on %s: %s", job->listen, nng_strerror(rv));
        err = rv == NNG_EADDRINUSE ? -EADDRINUSE : -EINVAL;
        goto err_sock;
    }
    if ((rv = nng_socket_get_int(c->sock, NNG_OPT_RECVFD, &c->fd)) != 0) {
        wb_errlist_add(el, "controller: no receive fd: %s", nng_strerror(rv));
        err = -EIO;
        goto err_sock;
    }
    wb_log(WB_LOG_INFO, M, "job %s listening on %s: %u trainers, %u rollouts", job->name,
           job->listen, c->plan.ntrainers, c->plan.nrollouts);
    *out = c;
    return 0;

err_sock:
    nng_close(c->sock);
err_agents:
    free(c->agents);
err_plan:
    ctl_plan_free(&c->plan);
err_free:
    free(c);
    return err;
}

void wb_controller_destroy(struct wb_controller *c)
{
    if (!c)
        return;
    if (c->x.client)
        nng_msg_free(c->x.client);
    for (uint32_t i = 0; i < c->nagents; i++) {
        agent_reset(&c->agents[i]);
        free(c->agents[i].cmds);
    }
    nng_close(c->sock);
    free(c->agents);
    ctl_plan_free(&c->plan);
    free(c);
}
