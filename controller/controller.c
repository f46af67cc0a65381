/* controller.c — the controller's single-threaded event loop: agent membership (register,
 * heartbeat, death by silence), the setup handshake that hands out the plan, transfers
 * (trigger, collect reports, publish "version N complete" to rollouts, or fail naming the
 * rank), and the client requests of wb-ctl.
 *
 * One listener carries everything (serve.c: connections, their handshake and binding). A request is
 * either answered at once or kept ("held"): agent polls are held until a command is queued for that
 * agent or poll_hold passes; a client's transfer request is held until the transfer ends. Every
 * held request has a deadline, so nothing waits forever on either side.
 *
 * Setup handshake, run whenever the set of live agent sessions changes (start-up, restart):
 *   SETUP(gen) to every agent whose session has not been set up  -> REPORT setup {addr, regions}
 *   PEERS(gen) with every agent's addr+regions to every trainer  -> REPORT connected
 *   then READY: transfers may run. */
#include "controller/ctl.h"
#include "planner/planner.h"

#include <errno.h>
#include <inttypes.h>
#include <nng/nng.h>
#include <nng/supplemental/tls/tls.h>
#include <poll.h>
#include <pthread.h>
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
    bool left;    /* not alive because it said LEAVE (closed its endpoint), not because it died */
    bool suspect; /* alive, but silent for suspect_after: maybe starved, maybe gone */
    /* Declared dead by silence alone (its connections still open): the process may live on,
     * starved. A shutdown waits for it to hear that the job ends (told_end), within its
     * deadline: a rollout never told waits for the controller for ever. */
    bool unheard;
    bool told_end;    /* the shutdown reached it: EXIT acknowledged or a request answered ENDED */
    uint64_t session; /* 0: never registered */
    uint64_t last_ns;
    char host[64];
    uint64_t pid;
    int64_t device;
    bool synthetic;            /* holds no tensors of its own (wb-agent): nothing to check */
    bool sourced;              /* reads its tensors from a source (a checkpoint) */
    struct ctl_blob inv, mesh; /* a deferred plan's registrations, checked once it is made */
    uint64_t pushed; /* trainers: the version this agent's process asked for (PUSH) that has
                        not started, 0: none */
    bool push_queue; /* its push policy: every version in order (false: the latest wins) */
    /* setup */
    uint64_t setup_session;        /* session whose SETUP report arrived */
    char setup_err[WB_ERRMSG_MAX]; /* its last SETUP failed, and why ("" when it did not) */
    char refused[WB_ERRMSG_MAX];   /* its last registration read another source, and how */
    uint64_t connected_gen;        /* gen of the last CONNECTED report */
    struct ctl_blob addr;          /* transport address (REPORT setup) */
    struct ctl_blob regions;       /* memory descriptors (REPORT setup) */
    /* commands */
    struct cmd *cmds;
    size_t ncmds, capcmds;
    uint64_t next_seq;
    nng_msg *held; /* an open poll */
    uint64_t held_until;
    /* rollout state (heartbeats) */
    uint64_t version;
    bool in_flight;
    bool torn;        /* rollouts: said so in their heartbeat */
    uint64_t commits; /* rollouts: the count its last COMMITTED report carried */
    uint64_t dropped; /* notes its transport refused (heartbeats) */
    /* trainers: progress of the transfer in flight (heartbeats) */
    uint64_t done_bytes, total_bytes;
    /* rollouts: what landed of a failed version (REPORT_RECEIVED after ABORT), so that its
     * next attempt resends only the rest */
    uint64_t landed_version;
    struct ctl_blob landed;
    /* current transfer */
    bool done, committed;
    uint64_t xfer_session; /* its session when the attempt started */
    /* The connections its session-carrying messages came on (call, poll, heartbeat): when one
     * closes, the process is gone (a crash closes every socket at once), no need to wait for
     * dead_after. */
    uint32_t pipes[4];
    bool drained; /* trainers, an attempt being torn down: its writes all completed */
    struct wb_xfer_stats stats;
    uint64_t rx_bytes;
};

/* Why a transfer attempt failed, as the metrics count it. */
enum fail_cause { FAIL_AGENT_LOST, FAIL_AGENT_ERROR, FAIL_TIMEOUT, FAIL_SHUTDOWN, FAIL_COUNT };
static const char *const fail_names[] = {"agent_lost", "agent_error", "timeout", "shutdown"};
/* The transfer-duration histogram's upper bounds, seconds (+Inf implied). */
static const double dur_buckets[] = {0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120};

struct xfer {
    bool active;
    uint64_t version;
    uint64_t start_ns, deadline;
    nng_msg *client; /* held wb-ctl request */
    uint32_t trainers_done, rollouts_done, committed;
    uint64_t sent_ns, received_ns; /* when the last SENT / RECEIVED came */
    bool completing;               /* COMPLETE sent, waiting for COMMITTED */
    /* A failed attempt is torn down before anything else runs: the trainers stop and report
     * that their writes drained, then the rollouts close their windows; only then is the
     * client answered and the job ready again. */
    bool aborting;
    uint64_t abort_deadline;
    char why[512];
};

struct wb_controller {
    const struct wb_job *job;
    struct ctl_serve *srv;
    int fd;
    struct wb_mpw *capture; /* wb_controller_feed: replies go here instead of the socket */
    struct ctl_plan plan;
    uint32_t nagents;
    struct agent *agents; /* trainers first, then rollouts */
    enum ctl_state state;
    uint64_t gen;
    uint64_t sessions;         /* session ids handed out */
    uint64_t refused_sessions; /* a deferred plan failed with these sessions: wait for new ones */
    uint64_t last_version;     /* last complete transfer */
    uint64_t failed_version;   /* the version whose last attempt failed (0: none) */
    uint64_t attempted;        /* the highest version this process started an attempt of */
    /* Delta updates: the last attempt completed, so the next may send deltas (false at start
     * and after any failed attempt); per rollout, whether this attempt allows it one; the
     * last complete version's bytes, a full update's and the rollouts that got deltas. */
    bool delta_next;
    uint8_t *x_delta;
    uint64_t last_bytes, last_full_bytes, last_delta_rollouts;
    uint64_t epochs;           /* the epoch of the last transfer attempt started */
    struct ctl_sources src;    /* the source each trainer rank must read (register.c) */
    uint64_t refuse_t0;        /* refusals logged in the second from refuse_t0 ... */
    uint32_t refuse_logged;
    uint64_t refuse_quiet; /* ... and not logged */
    struct xfer x;
    bool shutting_down;
    uint64_t exit_deadline, exit_linger;
    uint64_t conn_said;          /* connections and messages refused that the log has counted */
    uint64_t checked_ns;         /* check_dead's last turn (0: none yet) */
    struct ctl_metrics *metrics; /* the job's metrics: endpoint (NULL: off) */
    struct {
        uint64_t complete, failed, causes[FAIL_COUNT];
        uint64_t last_ns, last_bytes, bytes_total;
        uint64_t sum_ns, buckets[WB_ARRAY_LEN(dur_buckets)]; /* cumulative counts */
        uint64_t published_ns;                               /* when the text was last rendered */
    } met;
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
    if (c->capture) { /* wb_controller_feed: the reply goes to the caller */
        if (!body->err)
            wb_mpw_raw(c->capture, body->buf, body->len);
        nng_msg_free(req);
        return;
    }
    if (body->err || nng_msg_append(req, body->buf, body->len) != 0) {
        wb_log(WB_LOG_WARN, M, "a reply could not be sent");
        nng_msg_free(req);
        return;
    }
    /* a connection gone meanwhile: its peer asks again on its next one */
    int err = ctl_serve_send(c->srv, req);
    if (err && err != -ENOTCONN)
        wb_log(WB_LOG_WARN, M, "a reply could not be sent: %s", wb_strerror(err));
}

/* Refusals never carry the token: the sender may not know it. */
static void reply_error(struct wb_controller *c, nng_msg *req, int code, const char *msg)
{
    struct wb_mpw w;
    wb_mpw_init(&w);
    wb_msg_error(&w, code, msg);
    reply(c, req, &w);
    wb_mpw_free(&w);
}

static void reply_msg(struct wb_controller *c, nng_msg *req, uint32_t type, const void *body)
{
    struct wb_mpw w;
    wb_mpw_init(&w);
    wb_msg_encode(&w, type, c->job->token, body);
    reply(c, req, &w);
    wb_mpw_free(&w);
}

static void reply_ok(struct wb_controller *c, nng_msg *req)
{
    reply_msg(c, req, WB_MSG_OK, NULL);
}

static struct wb_bytes mpw_bytes(const struct wb_mpw *w)
{
    return (struct wb_bytes){w->buf, w->len};
}

/* ---------------------------------------------------------------- commands */

static void flush_poll(struct wb_controller *c, struct agent *a);

/* Queues a command for an agent (encoded now as [seq, type, body]) and answers its held poll.
 * -ENOMEM (logged) when the command could not be queued. */
static int cmd_queue(struct wb_controller *c, struct agent *a, uint32_t type, const void *body)
{
    if (a->ncmds == a->capcmds && wb_grow(&a->cmds, &a->capcmds, 8, sizeof(*a->cmds))) {
        wb_log(WB_LOG_ERROR, M, "%s rank %u: no memory to queue a command", wb_role_name(a->role),
               a->rank);
        return -ENOMEM;
    }
    struct cmd *cm = &a->cmds[a->ncmds];
    wb_mpw_init(&cm->body);
    wb_cmd_put(&cm->body, a->next_seq + 1, type, body);
    if (cm->body.err) { /* never queued half-built: it would go out as garbage */
        wb_log(WB_LOG_ERROR, M, "%s rank %u: no memory to queue a command", wb_role_name(a->role),
               a->rank);
        wb_mpw_free(&cm->body);
        return -ENOMEM;
    }
    cm->seq = ++a->next_seq;
    a->ncmds++;
    flush_poll(c, a);
    return 0;
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

/* Answers the agent's held poll with its pending commands. */
static void flush_poll(struct wb_controller *c, struct agent *a)
{
    if (!a->held)
        return;
    struct wb_mpw cmds, w;
    wb_mpw_init(&cmds);
    wb_mpw_init(&w);
    wb_mpw_array(&cmds, (uint32_t)a->ncmds);
    for (size_t i = 0; i < a->ncmds; i++)
        wb_mpw_raw(&cmds, a->cmds[i].body.buf, a->cmds[i].body.len);
    struct wb_body_commands b = {mpw_bytes(&cmds)};
    if (!cmds.err)
        wb_msg_encode(&w, WB_MSG_COMMANDS, c->job->token, &b);
    int err = cmds.err ? cmds.err : w.err;
    wb_mpw_free(&cmds);
    if (err) { /* the poll stays held and is answered on a later turn: no command is lost */
        wb_log(WB_LOG_WARN, M, "%s rank %u: commands not sent this turn: %s", wb_role_name(a->role),
               a->rank, wb_strerror(err));
        wb_mpw_free(&w);
        return;
    }
    reply(c, a->held, &w);
    wb_mpw_free(&w);
    a->held = NULL;
}

static void queue_abort(struct wb_controller *c, struct agent *a, uint64_t version,
                        const char *reason)
{
    struct wb_body_abort b = {.version = version};
    snprintf(b.reason, sizeof(b.reason), "%s", reason);
    cmd_queue(c, a, WB_CMD_ABORT, &b);
}

/* ---------------------------------------------------------------- membership */

/* False with every agent the job waits for named in why ("waiting for trainer ranks 1-3 (not
 * registered); rollout rank 0 (dead)"), when one is not alive. */
static bool agents_all_alive(struct wb_controller *c, char *why, size_t cap)
{
    size_t n = 0;
    for (uint32_t i = 0; i < c->nagents; i++)
        n += !c->agents[i].alive;
    if (!n)
        return true;
    struct wb_rank_state *v = calloc(n, sizeof(*v));
    if (!v) {
        snprintf(why, cap, "waiting for %zu agents", n);
        return false;
    }
    n = 0;
    for (uint32_t i = 0; i < c->nagents; i++) {
        const struct agent *a = &c->agents[i];
        if (!a->alive)
            v[n++] = (struct wb_rank_state){wb_role_name(a->role), a->rank,
                                            a->left      ? "left"
                                            : a->session ? "dead"
                                                         : "not registered"};
    }
    int at = snprintf(why, cap, "waiting for ");
    if (at > 0 && (size_t)at < cap)
        wb_ranks_text(v, n, why + at, cap - (size_t)at);
    free(v);
    return false;
}

static void xfer_fail(struct wb_controller *c, enum fail_cause cause, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void metrics_publish(struct wb_controller *c);
static void push_check(struct wb_controller *c);
static void log_refusal(struct wb_controller *c, const char *what);
static void teardown_check(struct wb_controller *c, uint64_t now);

static void set_state(struct wb_controller *c, enum ctl_state s)
{
    if (c->state != s)
        wb_log(WB_LOG_INFO, M, "state %s -> %s (gen %" PRIu64 ")", state_names[c->state],
               state_names[s], c->gen);
    c->state = s;
}

static void send_setup(struct wb_controller *c, struct agent *a)
{
    const struct wb_job *j = c->job;
    bool tr = a->role == WB_ROLE_TRAINER;
    const struct ctl_blob *tbl = tr ? &c->plan.table[a->rank] : &c->plan.recv[a->rank];
    struct wb_body_setup b = {
        .gen = c->gen, .seed = j->seed, .plan = {tbl->buf, tbl->len}, .verify = j->verify};
    if (tr)
        b.shards = (struct wb_bytes){c->plan.shards[a->rank].buf, c->plan.shards[a->rank].len};
    else if (c->plan.locals)
        b.locals = (struct wb_bytes){c->plan.locals[a->rank].buf, c->plan.locals[a->rank].len};
    if (tr && c->plan.sums)
        b.sums = (struct wb_bytes){c->plan.sums[a->rank].buf, c->plan.sums[a->rank].len};
    const struct ctl_blob *slabs = tr ? c->plan.dslab_t : c->plan.dslab_r;
    b.delta = j->delta && slabs;
    if (b.delta)
        b.delta_slabs = (struct wb_bytes){slabs[a->rank].buf, slabs[a->rank].len};
    b.change_period = wb_job_change_period(j);
    snprintf(b.provider, sizeof(b.provider), "%s", j->provider);
    snprintf(b.trace, sizeof(b.trace), "%s", j->trace);
    b.trace_keep = j->trace_keep;
    snprintf(b.job, sizeof(b.job), "%s", j->name);
    if (cmd_queue(c, a, WB_CMD_SETUP, &b)) /* the job waits for it: the status says why */
        snprintf(a->setup_err, sizeof(a->setup_err), "its setup could not be sent: %s",
                 wb_strerror(-ENOMEM));
}

/* Where a rollout's regions blob ([[tensor, descriptor], ...], see agent/xfer.h) describes each
 * tensor: sorted by tensor, so that a trainer's list is cut out by lookups. */
struct reg_index {
    uint64_t tensor;
    const uint8_t *p; /* the whole [tensor, descriptor] entry */
    size_t len;
};

static int cmp_reg(const void *a, const void *b)
{
    uint64_t x = ((const struct reg_index *)a)->tensor, y = ((const struct reg_index *)b)->tensor;
    return x < y ? -1 : x > y;
}

static int index_regions(const struct ctl_blob *b, struct reg_index **out, size_t *nout)
{
    struct wb_mpr r;
    uint32_t n = 0;
    wb_mpr_init(&r, b->buf, b->len);
    *out = NULL;
    *nout = 0;
    if (!b->len || wb_mpr_array(&r, WB_WIRE_MAX_ARRAY, &n))
        return b->len ? -EBADMSG : 0;
    struct reg_index *ix = calloc(n ? n : 1, sizeof(*ix));
    if (!ix)
        return -ENOMEM;
    for (uint32_t i = 0; i < n; i++) {
        const uint8_t *at = r.p;
        uint32_t two = 0;
        if (wb_mpr_array(&r, 2, &two) || two != 2 || wb_mpr_u64(&r, &ix[i].tensor) ||
            wb_mpr_skip(&r)) {
            free(ix);
            return -EBADMSG;
        }
        ix[i].p = at;
        ix[i].len = (size_t)(r.p - at);
    }
    qsort(ix, n, sizeof(*ix), cmp_reg);
    *out = ix;
    *nout = n;
    return 0;
}

/* The part of rollout g's regions trainer t may have: the tensors it writes there, and the
 * checksum inbox (SUM_INBOX_ENTRY) and its own slab of the delta inbox (agent/xfer.h:
 * DELTA_SLAB_ENTRY + t) when it writes there at all. */
static void regions_for(struct wb_mpw *w, const struct reg_index *ix, size_t n,
                        const uint64_t *keys, size_t nkeys, uint32_t g, uint32_t t)
{
    size_t lo = 0, hi = nkeys;
    while (lo < hi) { /* the first key of rollout g */
        size_t mid = (lo + hi) / 2;
        if (keys[mid] >> 32 < g)
            lo = mid + 1;
        else
            hi = mid;
    }
    size_t k0 = lo, k1 = lo;
    while (k1 < nkeys && keys[k1] >> 32 == g)
        k1++;
    uint32_t count = 0;
    const struct reg_index *sum = NULL, *slab = NULL;
    for (size_t i = 0; i < n; i++) {
        if (ix[i].tensor == 0xffffffffu)
            sum = &ix[i];
        if (ix[i].tensor == (1ull << 40) + t)
            slab = &ix[i];
    }
    for (size_t k = k0; k < k1; k++) {
        struct reg_index key = {.tensor = keys[k] & 0xffffffffu};
        count += bsearch(&key, ix, n, sizeof(*ix), cmp_reg) != NULL;
    }
    struct wb_mpw part;
    wb_mpw_init(&part);
    wb_mpw_array(&part, count + (sum ? 1 : 0) + (slab ? 1 : 0));
    for (size_t k = k0; k < k1; k++) {
        struct reg_index key = {.tensor = keys[k] & 0xffffffffu};
        const struct reg_index *e = bsearch(&key, ix, n, sizeof(*ix), cmp_reg);
        if (e)
            wb_mpw_raw(&part, e->p, e->len);
    }
    if (sum)
        wb_mpw_raw(&part, sum->p, sum->len);
    if (slab)
        wb_mpw_raw(&part, slab->p, slab->len);
    if (wb_mpw_finish(&part) == 0)
        wb_mpw_bin(w, part.buf, part.len);
    else
        w->err = part.err ? part.err : -ENOMEM;
    wb_mpw_free(&part);
}

/* What a rollout learns of trainer t, one of its writers: nothing, or in a delta job the
 * tensors t writes there (a msgpack array of rollout tensors, sorted) — a delta record of t
 * may name those alone. */
static void writes_to(struct wb_mpw *w, const struct wb_controller *c, uint32_t t, uint32_t g)
{
    if (!c->job->delta || !c->plan.dslab_r) {
        wb_mpw_bin(w, "", 0);
        return;
    }
    const uint64_t *k = c->plan.wkeys[t];
    size_t n = c->plan.nwkeys[t], m = 0;
    for (size_t i = 0; i < n; i++)
        m += k[i] >> 32 == g;
    struct wb_mpw part;
    wb_mpw_init(&part);
    wb_mpw_array(&part, (uint32_t)m);
    for (size_t i = 0; i < n; i++)
        if (k[i] >> 32 == g)
            wb_mpw_u64(&part, k[i] & 0xffffffffu);
    if (wb_mpw_finish(&part) == 0)
        wb_mpw_bin(w, part.buf, part.len);
    else
        w->err = part.err ? part.err : -ENOMEM;
    wb_mpw_free(&part);
}

static void peer_head(struct wb_mpw *w, const struct agent *p)
{
    wb_mpw_array(w, 4);
    wb_mpw_u64(w, p->role);
    wb_mpw_u64(w, p->rank);
    wb_mpw_bin(w, p->addr.len ? p->addr.buf : (uint8_t *)"", p->addr.len);
}

/* PEERS, per agent and scoped to its plan: a trainer gets the address of every trainer (the
 * barriers go to all) with the inbox descriptors of those it gathers or swaps amax with, and
 * the address of every rollout it writes to with the descriptors of exactly the tensors it
 * writes there; a rollout gets the addresses of the trainers that write to it (the only ones
 * whose notes it counts). Nobody learns a key it has no planned write for. */
static void send_peers(struct wb_controller *c)
{
    uint32_t nt = c->plan.ntrainers, nr = c->plan.nrollouts;
    bool scoped = c->plan.wkeys != NULL;
    struct reg_index **ix = calloc(nr ? nr : 1, sizeof(*ix));
    size_t *nix = calloc(nr ? nr : 1, sizeof(*nix));
    int err = ix && nix ? 0 : -ENOMEM;
    for (uint32_t g = 0; !err && scoped && g < nr; g++)
        err = index_regions(&c->agents[nt + g].regions, &ix[g], &nix[g]);
    static const uint8_t no_inbox[] = {0x93, 0xc0, 0xc0, 0x90}; /* [nil, nil, []] */
    for (uint32_t i = 0; i < c->nagents; i++) {
        struct agent *a = &c->agents[i];
        bool tr = a->role == WB_ROLE_TRAINER;
        struct wb_mpw w;
        wb_mpw_init(&w);
        uint32_t n = 0;
        for (uint32_t j = 0; scoped && j < c->nagents; j++) {
            const struct agent *p = &c->agents[j];
            if (tr)
                n +=
                    p->role == WB_ROLE_TRAINER || c->plan.writer_of[(size_t)p->rank * nt + a->rank];
            else
                n +=
                    p->role == WB_ROLE_TRAINER && c->plan.writer_of[(size_t)a->rank * nt + p->rank];
        }
        wb_mpw_array(&w, n);
        for (uint32_t j = 0; !err && scoped && j < c->nagents; j++) {
            const struct agent *p = &c->agents[j];
            if (tr && p->role == WB_ROLE_TRAINER) {
                peer_head(&w, p);
                if (c->plan.tpeer_of[(size_t)a->rank * nt + p->rank] && p->regions.len)
                    wb_mpw_bin(&w, p->regions.buf, p->regions.len);
                else
                    wb_mpw_bin(&w, no_inbox, sizeof(no_inbox));
            } else if (tr && c->plan.writer_of[(size_t)p->rank * nt + a->rank]) {
                peer_head(&w, p);
                regions_for(&w, ix[p->rank], nix[p->rank], c->plan.wkeys[a->rank],
                            c->plan.nwkeys[a->rank], p->rank, a->rank);
            } else if (!tr && p->role == WB_ROLE_TRAINER &&
                       c->plan.writer_of[(size_t)a->rank * nt + p->rank]) {
                peer_head(&w, p);
                writes_to(&w, c, p->rank, a->rank);
            }
        }
        struct wb_body_peers b = {.gen = c->gen, .agents = mpw_bytes(&w)};
        if (err || w.err || cmd_queue(c, a, WB_CMD_PEERS, &b))
            /* the job waits for it: the status says why */
            snprintf(a->setup_err, sizeof(a->setup_err), "its peer list could not be made: %s",
                     wb_strerror(err     ? err
                                 : w.err ? w.err
                                         : -ENOMEM));
        wb_mpw_free(&w);
    }
    for (uint32_t g = 0; ix && g < nr; g++)
        free(ix[g]);
    free(ix);
    free(nix);
}

static int blob_set(struct ctl_blob *b, const struct wb_bytes *x);
static void agent_reset(struct agent *a);

/* A job without a trainer layout: once every agent registered, the layout is derived from the
 * trainers' registrations and the plan made; then every registration is checked against it as
 * in a job planned at start. If the registrations cannot be planned at all, every agent is told
 * why (REFUSED) and stops; an agent whose own registration does not fit the plan loses its
 * session, registers again and is refused with its problems listed (registration_ok). Returns
 * true when the plan exists and every registration fits it. */
static bool finish_plan(struct wb_controller *c)
{
    uint32_t nt = c->plan.ntrainers;
    struct wb_bytes *inv = calloc(nt ? nt : 1, sizeof(*inv));
    struct wb_bytes *mesh = calloc(nt ? nt : 1, sizeof(*mesh));
    struct wb_errlist el;
    char *detail = NULL;
    size_t len = 0;
    bool ok = false;
    wb_errlist_init(&el);
    int err = inv && mesh ? 0 : -ENOMEM;
    for (uint32_t t = 0; !err && t < nt; t++) {
        inv[t] = (struct wb_bytes){c->agents[t].inv.buf, c->agents[t].inv.len};
        mesh[t] = (struct wb_bytes){c->agents[t].mesh.buf, c->agents[t].mesh.len};
    }
    err = err ? err : ctl_plan_derive(c->job, &c->plan, inv, mesh, &el);
    free(inv);
    free(mesh);
    if (err) {
        struct wb_body_error e = {.code = -WB_E_CONFIG};
        FILE *f = open_memstream(&detail, &len);
        if (f) {
            wb_errlist_print(&el, "", f);
            fclose(f);
        }
        snprintf(e.msg, sizeof(e.msg),
                 "register: the trainers' registrations cannot be planned (%zu problem%s)", el.n,
                 el.n == 1 ? "" : "s");
        e.detail = (struct wb_bytes){detail, detail ? strlen(detail) : 0};
        wb_log(WB_LOG_WARN, M, "%s:\n%s", e.msg, detail ? detail : "");
        for (uint32_t i = 0; i < c->nagents; i++)
            cmd_queue(c, &c->agents[i], WB_CMD_REFUSED, &e);
        c->refused_sessions = c->sessions;
        free(detail);
        wb_errlist_free(&el);
        return false;
    }
    wb_errlist_free(&el);
    wb_log(WB_LOG_INFO, M, "trainer layout derived from the registrations; planned");
    ok = true;
    for (uint32_t i = 0; i < c->nagents; i++) {
        struct agent *a = &c->agents[i];
        uint32_t n = 0;
        struct wb_bytes b = {a->inv.buf, a->inv.len};
        detail = NULL;
        if (a->synthetic || ctl_check_registration(&c->plan, a->role, a->rank, &b, &detail, &n))
            n = 0;
        free(detail);
        if (n) { /* its next call finds no session; its new registration is refused, listed */
            agent_reset(a);
            a->alive = false;
            a->session = 0;
            ok = false;
        }
    }
    return ok;
}

/* An agent whose part of the transfer in flight is over: a trainer that reported its writes
 * sent, a rollout that committed the version. Its death no longer fails the transfer (a
 * rollout process that received its last version may exit before the others committed). */
static bool part_done(const struct wb_controller *c, const struct agent *a)
{
    return c->x.active && !c->x.aborting && (a->role == WB_ROLE_TRAINER ? a->done : a->committed);
}

/* Moves the setup state machine forward after any event. */
static void advance(struct wb_controller *c)
{
    char why[400];
    if (!agents_all_alive(c, why, sizeof(why))) {
        if (c->state != ST_WAITING) {
            bool needed = false; /* a dead agent the transfer in flight still waits for */
            for (uint32_t i = 0; i < c->nagents; i++)
                needed |= !c->agents[i].alive && !part_done(c, &c->agents[i]);
            if (c->x.active && needed)
                xfer_fail(c, FAIL_AGENT_LOST, "%s", why);
            set_state(c, ST_WAITING);
        }
        return;
    }
    if (c->state == ST_WAITING && c->plan.deferred &&
        (c->sessions == c->refused_sessions || !finish_plan(c)))
        return;
    if (c->state == ST_WAITING) {
        /* Membership changed (an agent registered, or one died): every agent is set up anew —
         * new transports, new memory keys — so that nothing a departed process learnt (an
         * address, a key) still works. Rollouts keep their weights across it. */
        c->gen++;
        set_state(c, ST_SETUP);
        for (uint32_t i = 0; i < c->nagents; i++) {
            c->agents[i].setup_session = 0;
            send_setup(c, &c->agents[i]);
        }
    }
    if (c->state == ST_SETUP) {
        for (uint32_t i = 0; i < c->nagents; i++)
            if (c->agents[i].setup_session != c->agents[i].session)
                return;
        set_state(c, ST_CONNECT);
        send_peers(c);
    }
    if (c->state == ST_CONNECT) {
        for (uint32_t i = 0; i < c->nagents; i++)
            if (c->agents[i].connected_gen != c->gen)
                return;
        set_state(c, ST_READY);
        wb_log(WB_LOG_INFO, M, "ready: %u trainers, %u rollouts", c->plan.ntrainers,
               c->plan.nrollouts);
        struct wb_body_ready r = {c->gen};
        for (uint32_t i = 0; i < c->nagents; i++)
            cmd_queue(c, &c->agents[i], WB_CMD_READY, &r);
        push_check(c);
    }
}

/* A new session for (role, rank): a restart, or a re-registration after the controller lost
 * the agent. Everything learnt from the old session is forgotten but the connections it was
 * heard on (a->pipes): while they are open a dead agent may still be told the job ends, and
 * their closing says its process is gone; on_register forgets them with the session. */
static void agent_reset(struct agent *a)
{
    if (a->held) {
        nng_msg_free(a->held);
        a->held = NULL;
    }
    cmds_clear(a);
    free(a->addr.buf);
    free(a->regions.buf);
    free(a->inv.buf);
    free(a->mesh.buf);
    free(a->landed.buf);
    a->inv = a->mesh = a->landed = (struct ctl_blob){0};
    a->landed_version = 0;
    a->done_bytes = a->total_bytes = 0;
    a->pushed = 0;
    a->addr = (struct ctl_blob){0};
    a->regions = (struct ctl_blob){0};
    a->setup_session = 0;
    a->setup_err[0] = 0;
    a->connected_gen = 0;
    a->version = 0;
    a->in_flight = false;
    a->torn = false;
    a->commits = 0;
    a->dropped = 0;
    a->suspect = false;
}

/* Silence, in two stages. A process that crashed or was killed closes its connections, and
 * check_closed() declares it dead at once; a process that is connected but silent is usually
 * starved (a loaded machine, a swapping host, a stop signal), so silence first makes it only
 * suspect — shown in the status, logged, waited for by a transfer that needs it (the attempt's
 * own timeout still bounds that) — and dead only after dead_after, when the transfer that
 * needs it fails. A suspect agent that is heard again is simply alive. */
static void check_dead(struct wb_controller *c, uint64_t now)
{
    /* Silence counts only while the controller listens. It turns several times a heartbeat;
     * a turn later than that (this process starved or stopped, a long plan) credits every
     * agent the time it could not hear them, so that a starved controller does not declare
     * its agents dead the moment it runs again, their messages still queued. */
    uint64_t gap = c->checked_ns && now > c->checked_ns ? now - c->checked_ns : 0;
    c->checked_ns = now;
    if (gap > c->job->heartbeat_ns)
        for (uint32_t i = 0; i < c->nagents; i++) {
            struct agent *a = &c->agents[i];
            uint64_t credit = gap - c->job->heartbeat_ns;
            a->last_ns = now - a->last_ns > credit ? a->last_ns + credit : now;
        }
    for (uint32_t i = 0; i < c->nagents; i++) {
        struct agent *a = &c->agents[i];
        /* An agent handling SETUP is busy for a while (transport open, allocation and
         * registration block its loop): it gets four times the silence before it counts as
         * dead, so a slow setup does not start a new round. */
        uint64_t limit = c->job->dead_ns;
        if (c->state == ST_SETUP && a->setup_session != a->session)
            limit *= 4;
        uint64_t silent = a->alive ? now - a->last_ns : 0;
        if (a->alive && !a->suspect && silent > c->job->suspect_ns && silent <= limit) {
            a->suspect = true;
            wb_log(WB_LOG_WARN, M, "%s rank %u is suspect: silent for %.2f s (dead after %.1f s)",
                   wb_role_name(a->role), a->rank, (double)silent / 1e9, (double)limit / 1e9);
        } else if (a->suspect && silent <= c->job->suspect_ns) {
            a->suspect = false;
            wb_log(WB_LOG_INFO, M, "%s rank %u is heard again", wb_role_name(a->role), a->rank);
        }
        if (a->alive && silent > limit) {
            a->alive = false;
            /* with a connection we know of still open (one that closes says it is gone) */
            a->unheard = false;
            for (size_t j = 0; j < WB_ARRAY_LEN(a->pipes); j++)
                a->unheard |= a->pipes[j] != 0;
            wb_log(WB_LOG_WARN, M, "%s rank %u is dead: silent for %.2f s", wb_role_name(a->role),
                   a->rank, (double)(now - a->last_ns) / 1e9);
            if (c->x.active && !part_done(c, a))
                xfer_fail(c, FAIL_AGENT_LOST, "%s rank %u died (silent for %.2f s)",
                          wb_role_name(a->role), a->rank, (double)(now - a->last_ns) / 1e9);
            agent_reset(a); /* its pipes stay: their closing says the process is gone */
        }
    }
    teardown_check(c, now);
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

/* A trainer whose writes of the attempt can no longer land: drained, dead, or replaced by
 * another process since the attempt started. */
static bool trainer_quiet(const struct agent *a)
{
    return a->drained || !a->alive || a->session != a->xfer_session;
}

/* The teardown's second half, once every trainer is quiet (or its deadline passed): the
 * rollouts close their windows and say what landed, the client learns why, and the job is
 * ready for the next attempt. */
static void teardown_check(struct wb_controller *c, uint64_t now)
{
    if (!c->x.active || !c->x.aborting)
        return;
    for (uint32_t t = 0; t < c->plan.ntrainers && now < c->x.abort_deadline; t++)
        if (!trainer_quiet(&c->agents[t]))
            return;
    for (uint32_t r = 0; r < c->plan.nrollouts; r++) {
        struct agent *a = &c->agents[c->plan.ntrainers + r];
        if (a->alive)
            queue_abort(c, a, c->x.version, c->x.why);
    }
    char msg[600];
    snprintf(msg, sizeof(msg), "transfer %" PRIu64 " failed: %s", c->x.version, c->x.why);
    metrics_publish(c); /* a client told of the failure reads it counted */
    if (c->x.client)
        reply_error(c, c->x.client, -WB_E_PEER, msg);
    c->x.client = NULL;
    wb_log(WB_LOG_INFO, M, "transfer %" PRIu64 " torn down", c->x.version);
    xfer_end(c);
    push_check(c); /* pushes that came meanwhile */
}

static void xfer_fail(struct wb_controller *c, enum fail_cause cause, const char *fmt, ...)
{
    if (c->x.aborting) /* the first reason is the one that counts */
        return;
    c->met.failed++;
    c->met.causes[cause]++;
    char why[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof(why), fmt, ap);
    va_end(ap);
    wb_log(WB_LOG_WARN, M, "transfer %" PRIu64 " failed: %s", c->x.version, why);
    c->failed_version = c->x.version;
    c->delta_next = false; /* after any failed attempt, a full update */
    c->x.aborting = true;
    snprintf(c->x.why, sizeof(c->x.why), "%s", why);
    uint64_t now = wb_now_ns();
    /* bounded: a trainer's writes finish or fail within the transport's op_timeout, a silent
     * trainer is declared dead within dead_after */
    c->x.abort_deadline = now + 2 * c->job->transfer_ns + c->job->dead_ns;
    for (uint32_t t = 0; t < c->plan.ntrainers; t++)
        if (c->agents[t].alive && c->agents[t].session == c->agents[t].xfer_session)
            queue_abort(c, &c->agents[t], c->x.version, why);
    teardown_check(c, now);
}

static void xfer_result(struct wb_controller *c)
{
    uint64_t now = wb_now_ns();
    struct wb_mpw tr, rb;
    wb_mpw_init(&tr);
    wb_mpw_init(&rb);
    wb_mpw_array(&tr, c->plan.ntrainers);
    for (uint32_t t = 0; t < c->plan.ntrainers; t++)
        wb_body_put(&tr, WB_BODY_STATS, &c->agents[t].stats);
    wb_mpw_array(&rb, c->plan.nrollouts);
    for (uint32_t r = 0; r < c->plan.nrollouts; r++)
        wb_mpw_u64(&rb, c->agents[c->plan.ntrainers + r].rx_bytes);
    struct wb_body_result b = {.version = c->x.version,
                               .total_ns = now - c->x.start_ns,
                               .gen = c->gen,
                               .sent_ns = c->x.sent_ns,
                               .received_ns = c->x.received_ns,
                               .trainers = mpw_bytes(&tr),
                               .rollout_bytes = mpw_bytes(&rb)};
    wb_log(WB_LOG_INFO, M, "transfer %" PRIu64 " complete in %.3f s", c->x.version,
           (double)(now - c->x.start_ns) / 1e9);
    nng_msg *client = c->x.client;
    c->last_version = c->x.version;
    c->failed_version = 0;
    c->delta_next = true;
    uint64_t bytes = 0, full = 0;
    uint32_t ok = 0, ndelta = 0;
    for (uint32_t t = 0; t < c->plan.ntrainers; t++) {
        bytes += c->agents[t].stats.bytes;
        full += c->agents[t].stats.full_bytes;
        ok += c->agents[t].stats.delta_ok;
    }
    /* per rollout: allowed deltas, and sent them by every trainer (1), some (2) or none (0) */
    uint8_t *dl = c->x_delta && c->job->delta ? malloc(c->plan.nrollouts + 1) : NULL;
    for (uint32_t r = 0; dl && r < c->plan.nrollouts; r++) {
        dl[r] = !c->x_delta[r] || !ok ? 0 : ok == c->plan.ntrainers ? 1 : 2;
        ndelta += dl[r] != 0;
    }
    if (dl)
        b.delta = (struct wb_bytes){dl, c->plan.nrollouts};
    c->last_bytes = bytes;
    c->last_full_bytes = c->job->delta ? full : 0;
    c->last_delta_rollouts = ndelta;
    c->met.complete++;
    c->met.last_ns = now - c->x.start_ns;
    c->met.last_bytes = bytes;
    c->met.bytes_total += bytes;
    c->met.sum_ns += c->met.last_ns;
    for (size_t i = 0; i < WB_ARRAY_LEN(dur_buckets); i++)
        c->met.buckets[i] += (double)c->met.last_ns / 1e9 <= dur_buckets[i];
    xfer_end(c);
    metrics_publish(c); /* a client told of the result reads it counted */
    if (client)
        reply_msg(c, client, WB_MSG_RESULT, &b);
    free(dl);
    wb_mpw_free(&tr);
    wb_mpw_free(&rb);
}

/* After each report: all trainers sent and all rollouts counted -> publish; all committed ->
 * answer the client. */
static void xfer_check(struct wb_controller *c)
{
    if (!c->x.active || c->x.aborting)
        return;
    if (!c->x.completing && c->x.trainers_done == c->plan.ntrainers &&
        c->x.rollouts_done == c->plan.nrollouts) {
        c->x.completing = true;
        struct wb_body_version b = {c->x.version};
        for (uint32_t r = 0; r < c->plan.nrollouts; r++)
            cmd_queue(c, &c->agents[c->plan.ntrainers + r], WB_CMD_COMPLETE, &b);
    }
    if (c->x.completing && c->x.committed == c->plan.nrollouts) {
        /* the trainers' processes learn that every rollout holds the version */
        struct wb_body_version b = {c->x.version};
        for (uint32_t t = 0; t < c->plan.ntrainers; t++)
            cmd_queue(c, &c->agents[t], WB_CMD_COMPLETE, &b);
        xfer_result(c);
        push_check(c); /* a version pushed meanwhile goes next */
    }
}

/* Each transfer attempt's epoch: 64 random bits (never 0, never the previous one's), carried
 * by every note of the attempt, so nothing of another attempt counts toward it. */
static uint64_t epoch_new(uint64_t prev)
{
    for (;;) {
        uint64_t v = wb_random_u64();
        if (v && v != prev)
            return v;
    }
}

/* A version more than version_step past the last complete one is refused (true, with why in
 * msg): a member that sent 2^64-1 would leave no later version to send, for this controller
 * and, through what the rollouts then hold, for the next one. */
static bool version_far(const struct wb_controller *c, const char *what, uint64_t v, char *msg,
                        size_t cap)
{
    uint64_t step = c->job->version_step ? c->job->version_step : 1ull << 32;
    if (v <= c->last_version || v - c->last_version <= step)
        return false;
    snprintf(msg, cap,
             "%sversion %" PRIu64 " is more than version_step (%" PRIu64 ") past the last "
             "complete version %" PRIu64,
             what, v, step, c->last_version);
    return true;
}

/* Delta updates: which rollouts transfer v may send only what changed (TRANSFER.delta). A
 * rollout gets deltas only when it provably holds the base whole: it committed the last
 * complete version (the base), is not torn, and no attempt failed since that version
 * completed (delta_next: also false before this process completed any) — and v is not a
 * multiple of delta_full_every, when everybody gets a full update. The trainers add their own
 * condition: their record of what they sent holds the base (agent/delta.c). */
static void delta_decide(struct wb_controller *c, uint64_t v, struct wb_body_version_epoch *cmd)
{
    const struct wb_job *j = c->job;
    uint32_t nr = c->plan.nrollouts, n = 0;
    if (!j->delta || !c->plan.dslab_t)
        return;
    if (!c->x_delta && !(c->x_delta = malloc(nr ? nr : 1)))
        return; /* no memory: a full update */
    uint64_t base = c->last_version;
    bool all = c->delta_next && base && v > base && v % j->delta_full_every != 0;
    for (uint32_t r = 0; r < nr; r++) {
        const struct agent *a = &c->agents[c->plan.ntrainers + r];
        c->x_delta[r] = all && a->alive && a->version == base && !a->torn;
        n += c->x_delta[r];
    }
    if (n) {
        cmd->delta = (struct wb_bytes){c->x_delta, nr};
        cmd->delta_base = base;
    }
    wb_log(WB_LOG_INFO, M,
           "transfer %" PRIu64 ": deltas against %" PRIu64 " to %u of %u rollouts%s", v, base, n,
           nr,
           !c->delta_next ? " (a full update after a failed attempt or a start)"
           : base && v % j->delta_full_every == 0 ? " (delta_full_every)"
                                                  : "");
}

/* Starts transfer v (client: the wb-ctl request to answer at the end, or NULL for a push). */
static void xfer_start(struct wb_controller *c, uint64_t v, uint64_t timeout, nng_msg *client)
{
    xfer_end(c);
    c->x.active = true;
    c->x.version = v;
    if (v > c->attempted)
        c->attempted = v;
    c->x.start_ns = wb_now_ns();
    c->x.deadline = c->x.start_ns + timeout;
    c->x.client = client;
    c->epochs = epoch_new(c->epochs); /* agents tag this attempt's notes with it */
    /* The attempt's MAC key: its members alone learn it (over this channel), so a note that
     * counts is a member's; nobody else, a former member included, can make one. */
    uint64_t key[2] = {wb_random_u64(), wb_random_u64()};
    struct wb_body_version_epoch cmd = {
        .version = v, .epoch = c->epochs, .key = {key, sizeof(key)}, .timeout_ns = timeout};
    /* Another attempt of a version that failed: what landed at each rollout since (it said so
     * when told to abort, and has kept its session) is not sent again — when every trainer's
     * bytes of a version are fixed: a checkpoint's, or the synthetic source's. A process's own
     * tensors may have changed since; they are sent whole. */
    struct wb_mpw skip;
    wb_mpw_init(&skip);
    bool fixed = true;
    for (uint32_t t = 0; t < c->plan.ntrainers; t++)
        fixed &= c->agents[t].synthetic || c->agents[t].sourced;
    if (v == c->failed_version && fixed) {
        uint64_t any = 0;
        wb_mpw_array(&skip, c->plan.nrollouts);
        for (uint32_t r = 0; r < c->plan.nrollouts; r++) {
            struct agent *a = &c->agents[c->plan.ntrainers + r];
            if (a->landed_version == v && a->landed.len > 1) {
                wb_mpw_raw(&skip, a->landed.buf, a->landed.len);
                any++;
            } else {
                wb_mpw_array(&skip, 0);
            }
        }
        if (any && wb_mpw_finish(&skip) == 0)
            cmd.skip = mpw_bytes(&skip);
        wb_log(WB_LOG_INFO, M,
               "transfer %" PRIu64 " resumed: %" PRIu64 " rollout%s keep what landed", v, any,
               any == 1 ? "" : "s");
    }
    delta_decide(c, v, &cmd);
    for (uint32_t i = 0; i < c->nagents; i++) {
        struct agent *a = &c->agents[i];
        a->stats = (struct wb_xfer_stats){.rank = a->rank};
        a->rx_bytes = 0;
        a->pushed = 0;
        a->done_bytes = a->total_bytes = 0;
        a->xfer_session = a->session;
        a->drained = false;
        cmd_queue(c, a, WB_CMD_TRANSFER, &cmd);
    }
    wb_mpw_free(&skip);
    wb_log(WB_LOG_INFO, M, "transfer %" PRIu64 " started", v);
}

static void on_ctl_transfer(struct wb_controller *c, nng_msg *req,
                            const struct wb_body_ctl_transfer *b)
{
    uint64_t v = b->version, timeout = b->timeout_ns ? b->timeout_ns : c->job->transfer_ns;
    char why[400], msg[480];
    if (v == 0) {
        reply_error(c, req, -EINVAL, "transfer: version must be a positive integer");
        return;
    }
    if (c->shutting_down) {
        reply_error(c, req, -WB_E_PEER, "controller is shutting down");
        return;
    }
    if (c->x.active) {
        if (c->x.aborting)
            snprintf(msg, sizeof(msg),
                     "transfer %" PRIu64 " failed (%.150s) and is being torn down; retry once "
                     "it is",
                     c->x.version, c->x.why);
        else
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
    if (version_far(c, "transfer: ", v, msg, sizeof(msg)) ||
        (b->timeout_ns > WB_JOB_MAX_NS &&
         snprintf(msg, sizeof(msg),
                  "transfer: timeout_ns %" PRIu64 " is longer than the longest duration, %d days",
                  b->timeout_ns, WB_JOB_MAX_DAYS) > 0)) {
        reply_error(c, req, -ERANGE, msg);
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
    xfer_start(c, v, timeout, req);
}

/* Tells the trainers that `version` will never be transferred: a push of `by` replaced it.
 * Each rank's endpoint releases the version's tensors and reports it skipped, whether it
 * pushed it already or pushes it later. `only`: tell that trainer alone (one that pushed a
 * version skipped before: the others were told then), NULL: every trainer. */
static void push_skip(struct wb_controller *c, uint64_t version, uint64_t by, struct agent *only)
{
    if (!only)
        wb_log(WB_LOG_INFO, M, "version %" PRIu64 " skipped: version %" PRIu64 " was pushed",
               version, by);
    struct wb_body_skipped b = {.version = version, .by = by};
    for (uint32_t t = 0; t < c->plan.ntrainers; t++) {
        struct agent *a = &c->agents[t];
        if (only && a != only)
            continue;
        if (a->pushed == version)
            a->pushed = 0;
        if (a->session)
            cmd_queue(c, a, WB_CMD_SKIPPED, &b);
    }
}

/* A trainer's process asks for transfer `version` (its endpoint's push). The transfer starts
 * once every trainer asked for the same version and the job is ready; until then the request
 * stands (an agent that re-registers asks again).
 *
 * Policy "latest" (the default): a push while a transfer is in flight waits; a newer one
 * replaces it. The controller is the one place that sees every rank's pushes, so it decides
 * for all: a version that any rank pushed past before it started can never start (that rank
 * pushes versions in order and will not push it again), and is skipped on every rank — told
 * to each (SKIPPED) — whichever rank pushes it first or last. Policy "queue": the endpoint
 * sends a push only once its previous one ended, so every version is transferred. The ranks'
 * policies must agree. */
static void on_push(struct wb_controller *c, nng_msg *req, struct agent *a, uint64_t v, bool queue)
{
    char msg[256] = "";
    if (a->role != WB_ROLE_TRAINER) {
        reply_error(c, req, -EINVAL, "push: only trainers push versions");
        return;
    }
    if (c->x.active && c->x.version == v && !c->x.aborting) {
        reply_ok(c, req); /* already running (a repeated request) */
        return;
    }
    if (v == 0)
        snprintf(msg, sizeof(msg), "push: version must be a positive integer");
    else if (v <= c->last_version)
        snprintf(msg, sizeof(msg),
                 "push: version %" PRIu64 " is not newer than the last complete version %" PRIu64,
                 v, c->last_version);
    else if (version_far(c, "push: ", v, msg, sizeof(msg)))
        ;
    else if (queue && c->x.active && !c->x.aborting)
        snprintf(msg, sizeof(msg), "push: transfer %" PRIu64 " is in flight", c->x.version);
    for (uint32_t t = 0; !*msg && t < c->plan.ntrainers; t++) {
        const struct agent *o = &c->agents[t];
        if (o->pushed && o != a && o->push_queue != queue)
            snprintf(msg, sizeof(msg),
                     "push: trainer rank %u pushes with policy %s, trainer rank %u with %s; every "
                     "trainer uses the same push policy",
                     a->rank, queue ? "queue" : "latest", t, o->push_queue ? "queue" : "latest");
        else if (queue && o->pushed && o->pushed != v)
            snprintf(msg, sizeof(msg),
                     "push: trainer rank %u asked for version %" PRIu64 ", trainer rank %u for "
                     "%" PRIu64 "; every trainer pushes the same versions in the same order",
                     a->rank, v, t, o->pushed);
    }
    if (*msg) {
        reply_error(c, req, -EINVAL, msg);
        return;
    }
    if (!queue) {
        /* the newest version asked for: in flight, or pushed and not started */
        uint64_t newest = c->x.active && !c->x.aborting ? c->x.version : 0;
        for (uint32_t t = 0; t < c->plan.ntrainers; t++)
            if (c->agents[t].pushed > newest)
                newest = c->agents[t].pushed;
        if (v < newest) { /* another rank pushed past it: it can never start */
            reply_ok(c, req);
            push_skip(c, v, newest, a);
            return;
        }
        /* every version pushed and not started below v: v replaces it */
        for (uint32_t t = 0; t < c->plan.ntrainers; t++) {
            uint64_t old = c->agents[t].pushed;
            if (old && old < v)
                push_skip(c, old, v, NULL);
        }
    }
    a->pushed = v;
    a->push_queue = queue;
    reply_ok(c, req);
    push_check(c);
}

/* Starts the transfer every trainer pushed, once the job is ready. */
static void push_check(struct wb_controller *c)
{
    if (c->x.active || c->state != ST_READY || c->shutting_down || !c->plan.ntrainers)
        return;
    uint64_t v = c->agents[0].pushed;
    for (uint32_t t = 0; t < c->plan.ntrainers; t++)
        if (!c->agents[t].pushed || c->agents[t].pushed != v)
            return;
    xfer_start(c, v, c->job->transfer_ns, NULL);
}

static void xfer_timeout(struct wb_controller *c, uint64_t now)
{
    if (!c->x.active || c->x.aborting || now < c->x.deadline)
        return;
    char list[300];
    size_t pos = 0;
    list[0] = 0;
    for (uint32_t i = 0; i < c->nagents && pos < sizeof(list) - 40; i++) {
        struct agent *a = &c->agents[i];
        bool pending = c->x.completing ? a->role == WB_ROLE_ROLLOUT && !a->committed : !a->done;
        if (pending)
            pos +=
                (size_t)snprintf(list + pos, sizeof(list) - pos, "%s%s rank %u%s", pos ? ", " : "",
                                 wb_role_name(a->role), a->rank, a->suspect ? " (suspect)" : "");
    }
    xfer_fail(c, FAIL_TIMEOUT, "timed out after %.1f s waiting for %s",
              (double)(now - c->x.start_ns) / 1e9, list);
}

/* ---------------------------------------------------------------- agent messages */

/* The tensors an agent registered are the metadata the plan was made for; anything else is
 * refused before the agent joins, every problem listed (ERROR detail), so that nothing is set
 * up or transferred with a wrong layout. */
static bool registration_ok(struct wb_controller *c, nng_msg *req, enum wb_role role, uint32_t rank,
                            const struct wb_body_register *b)
{
    char msg[WB_ERRMSG_MAX], *detail = NULL;
    uint32_t n = 0;
    if (b->synthetic)
        return true;
    if (c->plan.deferred) /* checked once every trainer registered (advance: finish_plan) */
        return true;
    if (!c->plan.has_model) {
        if (b->inv.n <= 1) /* an empty array */
            return true;
        snprintf(msg, sizeof(msg), "register: job %s has no model; %s rank %u registers tensors",
                 c->job->name, b->role, rank);
        reply_error(c, req, -WB_E_CONFIG, msg);
        return false;
    }
    int err = ctl_check_registration(&c->plan, role, rank, &b->inv, &detail, &n);
    if (err) {
        snprintf(msg, sizeof(msg), "register: %s rank %u: malformed tensor list", b->role, rank);
        reply_error(c, req, -EBADMSG, msg);
        return false;
    }
    if (n) {
        struct wb_mpw w;
        struct wb_body_error e = {.code = -WB_E_CONFIG, .detail = {detail, strlen(detail)}};
        snprintf(e.msg, sizeof(e.msg),
                 "register: %u registration problem%s (nothing is planned "
                 "for this rank until they are fixed)",
                 n, n == 1 ? "" : "s");
        wb_log(WB_LOG_WARN, M, "%s:\n%s", e.msg, detail);
        wb_mpw_init(&w);
        wb_msg_encode(&w, WB_MSG_ERROR, NULL, &e);
        reply(c, req, &w);
        wb_mpw_free(&w);
    }
    free(detail);
    return n == 0;
}

/* An agent holds a version complete that this controller does not know (it restarted): the
 * versions go on from there, so that an older one is never accepted again. A version this
 * process attempted itself is complete only when its attempt completed: a rollout may have
 * committed one whose attempt failed after that (another rollout died before it committed,
 * without the bytes), and its retry must be accepted. */
static void seen_version(struct wb_controller *c, const struct agent *a, uint64_t v)
{
    char msg[256];
    if (v <= c->last_version || v <= c->attempted || c->x.active)
        return;
    if (version_far(c, "", v, msg, sizeof(msg))) {
        char line[400];
        snprintf(line, sizeof(line), "%s rank %u holds %s (not taken)", wb_role_name(a->role),
                 a->rank, msg);
        log_refusal(c, line);
        return;
    }
    wb_log(WB_LOG_INFO, M,
           "%s rank %u holds version %" PRIu64 " complete: the last complete version from now on",
           wb_role_name(a->role), a->rank, v);
    c->last_version = v;
}

/* A session identity nobody can guess from the ones seen before: 64 random bits (never 0, never
 * another live agent's). */
static uint64_t session_new(const struct wb_controller *c)
{
    for (;;) {
        uint64_t v = wb_random_u64();
        bool taken = v == 0;
        for (uint32_t i = 0; !taken && i < c->nagents; i++)
            taken = c->agents[i].session == v;
        if (!taken)
            return v;
    }
}

/* The shutdown reached agent a (its request is answered "the job is shutting down"): the
 * controller lingers 200 ms more, so that the answer is written before its socket closes (an
 * agent whose answer is lost sees only a closed connection, and a rollout then waits). */
static void told_end(struct wb_controller *c, struct agent *a)
{
    a->told_end = true;
    uint64_t linger = wb_now_ns() + 200 * 1000000ull;
    if (linger > c->exit_linger)
        c->exit_linger = linger;
}

/* The connection req came on is one of a's (check_closed: its closing says a's process is
 * gone). */
static void note_pipe(struct wb_controller *c, struct agent *a, nng_msg *req)
{
    uint32_t pid = c->capture ? 0 : (uint32_t)nng_pipe_id(nng_msg_get_pipe(req));
    bool known = false;
    for (size_t i = 0; i < WB_ARRAY_LEN(a->pipes); i++)
        known |= a->pipes[i] == pid;
    if (pid && !known) { /* the oldest forgotten: a reconnected channel replaces its pipe */
        memmove(a->pipes + 1, a->pipes, sizeof(a->pipes) - sizeof(a->pipes[0]));
        a->pipes[0] = pid;
    }
}

static void on_register(struct wb_controller *c, nng_msg *req, const struct wb_body_register *b)
{
    char msg[WB_ERRMSG_MAX];
    enum wb_role role;
    if (c->shutting_down) {
        reply_error(c, req, -WB_E_ENDED, "register: the job is shutting down");
        return;
    }
    if (wb_role_parse(b->role, &role)) {
        snprintf(msg, sizeof(msg), "register: role must be trainer or rollout, got \"%s\"",
                 b->role);
        reply_error(c, req, -EINVAL, msg);
        return;
    }
    struct agent *a = b->rank > UINT32_MAX ? NULL : agent_at(c, role, (uint32_t)b->rank);
    if (!a) {
        snprintf(msg, sizeof(msg), "register: %s rank %" PRIu64 " is outside the job's %u %ss",
                 b->role, b->rank, role == WB_ROLE_TRAINER ? c->plan.ntrainers : c->plan.nrollouts,
                 b->role);
        reply_error(c, req, -EINVAL, msg);
        return;
    }
    if (c->shutting_down) {
        reply_error(c, req, -WB_E_PEER, "controller is shutting down");
        return;
    }
    if (a->alive &&
        (b->session != a->session || b->pid != a->pid || strcmp(b->host, a->host) != 0)) {
        /* Two live processes claiming one rank would take the rank from each other forever,
         * and host and pid are no proof (wb-ctl status shows them): only the holder, which
         * knows its session, may register again while it is alive; anyone else waits until
         * the holder is dead (silent for dead_after). */
        snprintf(msg, sizeof(msg),
                 "register: %s rank %u is held by %s pid %" PRIu64
                 " (alive)%s; retry after it exits",
                 b->role, a->rank, a->host, a->pid,
                 b->pid == a->pid && strcmp(b->host, a->host) == 0
                     ? " and this registration does not carry its session"
                     : "");
        reply_error(c, req, -EADDRINUSE, msg);
        return;
    }
    if (role == WB_ROLE_TRAINER &&
        ctl_sources_check(&c->src, a->rank, b->source, &b->digests, msg, sizeof(msg))) {
        /* kept for status until it registers again: a coordinator waiting for it learns at
         * once that this process will not do, instead of waiting for it in vain */
        snprintf(a->refused, sizeof(a->refused), "%s", msg);
        reply_error(c, req, -WB_E_CONFIG, msg);
        return;
    }
    if (!registration_ok(c, req, role, a->rank, b))
        return;
    if (a->session) {
        wb_log(WB_LOG_INFO, M, "%s rank %u re-registers (session %" PRIu64 " replaced)", b->role,
               a->rank, a->session);
        if (c->x.active)
            xfer_fail(c, FAIL_AGENT_LOST, "%s rank %u restarted", b->role, a->rank);
    }
    agent_reset(a);
    memset(a->pipes, 0, sizeof(a->pipes)); /* the new session's connections, recorded anew */
    a->refused[0] = 0;
    c->sessions++;
    a->session = session_new(c);
    a->alive = true;
    a->unheard = a->told_end = false;
    a->left = false;
    a->last_ns = wb_now_ns();
    snprintf(a->host, sizeof(a->host), "%s", b->host);
    a->pid = b->pid;
    a->device = b->device;
    a->synthetic = b->synthetic;
    a->sourced = b->source[0] != 0;
    if (c->plan.deferred && (blob_set(&a->inv, &b->inv) || blob_set(&a->mesh, &b->mesh)))
        wb_log(WB_LOG_ERROR, M, "%s rank %u: no memory to keep the registration", b->role, a->rank);
    wb_log(WB_LOG_INFO, M,
           "%s rank %u registered: host %s pid %" PRIu64 " device %" PRId64 " session %" PRIu64,
           b->role, a->rank, a->host, a->pid, a->device, a->session);
    seen_version(c, a, b->version);
    a->version = b->version;
    a->torn = role == WB_ROLE_ROLLOUT && b->torn; /* what its memory holds, as it says */
    struct wb_body_registered r = {a->session, c->job->heartbeat_ns, c->job->dead_ns,
                                   c->job->poll_hold_ns};
    reply_msg(c, req, WB_MSG_REGISTERED, &r);
    /* A new session always means a new setup round (its buffers and address are new). */
    set_state(c, ST_WAITING);
}

/* The agent a session-carrying message comes from, or NULL after replying with an error. */
static struct agent *session_agent(struct wb_controller *c, nng_msg *req,
                                   const struct wb_session *s)
{
    char msg[200];
    enum wb_role role;
    struct agent *a = NULL;
    if (wb_role_parse(s->role, &role) == 0 && s->rank <= UINT32_MAX)
        a = agent_at(c, role, (uint32_t)s->rank);
    if (c->shutting_down && (!a || !a->alive || a->session != s->session)) {
        /* an agent the controller lost (or a restarted one never knew) exits, too */
        if (a)
            told_end(c, a);
        reply_error(c, req, -WB_E_ENDED, "the job is shutting down");
        return NULL;
    }
    if (!a || !a->alive || a->session != s->session) {
        snprintf(msg, sizeof(msg),
                 "%s rank %" PRIu64 ": unknown session %" PRIu64 ": register again", s->role,
                 s->rank, s->session);
        reply_error(c, req, -WB_E_PEER, msg);
        return NULL;
    }
    a->last_ns = wb_now_ns();
    note_pipe(c, a, req);
    return a;
}

/* Agents whose connection closed are dead at once: a crashed process closes them all. */
static void check_closed(struct wb_controller *c)
{
    uint32_t closed[256], n = c->srv ? ctl_serve_closed(c->srv, closed, 256) : 0;
    for (uint32_t i = 0; i < c->nagents && n; i++) {
        struct agent *a = &c->agents[i];
        bool gone = false;
        for (uint32_t k = 0; k < n && !gone; k++)
            for (size_t j = 0; j < WB_ARRAY_LEN(a->pipes) && !gone; j++)
                gone = a->pipes[j] && a->pipes[j] == closed[k];
        if (gone)
            a->unheard = false; /* the process is gone: nobody to tell */
        if (!gone || !a->alive)
            continue;
        a->alive = false;
        if (c->shutting_down)
            wb_log(WB_LOG_INFO, M, "%s rank %u left (the job is shutting down)",
                   wb_role_name(a->role), a->rank);
        else
            wb_log(WB_LOG_WARN, M, "%s rank %u is dead: its connection closed",
                   wb_role_name(a->role), a->rank);
        if (c->x.active && !part_done(c, a))
            xfer_fail(c, FAIL_AGENT_LOST, "%s rank %u died (its connection closed)",
                      wb_role_name(a->role), a->rank);
        agent_reset(a);
    }
}

static int blob_set(struct ctl_blob *b, const struct wb_bytes *x)
{
    uint8_t *nb = malloc(x->n ? x->n : 1);
    if (!nb)
        return -ENOMEM;
    if (x->n)
        memcpy(nb, x->p, x->n);
    free(b->buf);
    b->buf = nb;
    b->len = x->n;
    return 0;
}

static void on_rep_setup(struct wb_controller *c, struct agent *a,
                         const struct wb_body_rep_setup *b)
{
    snprintf(a->setup_err, sizeof(a->setup_err), "%s", b->ok ? "" : b->err);
    if (!b->ok) {
        wb_log(WB_LOG_ERROR, M, "%s rank %u setup failed: %s", wb_role_name(a->role), a->rank,
               b->err);
    } else if (b->gen == c->gen) {
        if (blob_set(&a->addr, &b->addr) == 0 && blob_set(&a->regions, &b->regions) == 0) {
            a->setup_session = a->session;
            return;
        }
        /* not set up without its address: say so in the status rather than wait silently */
        snprintf(a->setup_err, sizeof(a->setup_err), "keeping its address: %s",
                 wb_strerror(-ENOMEM));
        wb_log(WB_LOG_ERROR, M, "%s rank %u setup failed: %s", wb_role_name(a->role), a->rank,
               a->setup_err);
    }
}

/* A trainer's SENT or a rollout's RECEIVED for the transfer in flight. */
static void on_rep_done(struct wb_controller *c, struct agent *a, uint64_t version, bool ok,
                        const char *err)
{
    if (!c->x.active || c->x.aborting || version != c->x.version || a->done)
        return;
    if (!ok) {
        xfer_fail(c, FAIL_AGENT_ERROR, "%s rank %u: %s", wb_role_name(a->role), a->rank, err);
        return;
    }
    a->done = true;
    if (a->role == WB_ROLE_TRAINER)
        c->x.trainers_done++;
    else
        c->x.rollouts_done++;
    if (a->role == WB_ROLE_TRAINER && c->x.trainers_done == c->plan.ntrainers)
        c->x.sent_ns = wb_now_ns() - c->x.start_ns;
    if (a->role == WB_ROLE_ROLLOUT && c->x.rollouts_done == c->plan.nrollouts)
        c->x.received_ns = wb_now_ns() - c->x.start_ns;
}

static void on_rep_sent(struct wb_controller *c, struct agent *a, const struct wb_body_rep_sent *b)
{
    struct wb_xfer_stats st;
    char why[160];
    struct wb_mpr r;
    wb_mpr_init(&r, b->stats.p, b->stats.n);
    if (b->ok && c->x.active && b->version == c->x.version && !a->done) {
        if (wb_body_get(&r, WB_BODY_STATS, &st, why, sizeof(why)) == 0) {
            a->stats = st;
            a->stats.rank = a->rank;
        } else {
            wb_log(WB_LOG_WARN, M, "trainer rank %u: statistics: %s", a->rank, why);
        }
    }
    on_rep_done(c, a, b->version, b->ok, b->err);
}

static void on_rep_received(struct wb_controller *c, struct agent *a,
                            const struct wb_body_rep_received *b)
{
    if (!b->ok && b->landed.n && (b->version == c->failed_version || b->version == c->x.version)) {
        if (blob_set(&a->landed, &b->landed) == 0)
            a->landed_version = b->version;
    }
    if (b->ok && c->x.active && b->version == c->x.version && !a->done)
        a->rx_bytes = b->bytes;
    on_rep_done(c, a, b->version, b->ok, b->err);
}

static void on_rep_committed(struct wb_controller *c, struct agent *a,
                             const struct wb_body_rep_committed *r)
{
    if (r->commits > a->commits)
        a->commits = r->commits;
    if (c->x.active && c->x.completing && r->version == c->x.version && !a->committed) {
        a->committed = true;
        a->version = r->version;
        a->in_flight = false;
        a->torn = false;
        c->x.committed++;
    }
}

/* Every body an agent or a client may send, decoded by its type. */
union body {
    struct wb_body_register reg;
    struct wb_body_heartbeat hb;
    struct wb_body_poll poll;
    struct wb_body_rep_setup setup;
    struct wb_body_rep_connected conn;
    struct wb_body_rep_sent sent;
    struct wb_body_rep_received recv;
    struct wb_body_rep_committed commit;
    struct wb_body_push push;
    struct wb_body_rep_drained drained;
    struct wb_body_leave leave;
    struct wb_body_ctl_transfer xfer;
    struct wb_session s; /* the first member of every agent call after REGISTER */
};

static void on_agent_call(struct wb_controller *c, nng_msg *req, uint32_t type, union body *b)
{
    struct agent *a = session_agent(c, req, &b->s);
    if (!a)
        return;
    /* A report must fit its sender's role: only trainers send, only rollouts receive and
     * commit. */
    enum wb_role want = type == WB_MSG_REP_SENT || type == WB_MSG_REP_DRAINED ? WB_ROLE_TRAINER
                        : type == WB_MSG_REP_RECEIVED || type == WB_MSG_REP_COMMITTED
                            ? WB_ROLE_ROLLOUT
                            : a->role;
    if (a->role != want) {
        char msg[160];
        snprintf(msg, sizeof(msg), "%s rank %u cannot report %s: only %ss do",
                 wb_role_name(a->role), a->rank, wb_msg_type_name(type), wb_role_name(want));
        wb_log(WB_LOG_WARN, M, "%s", msg);
        reply_error(c, req, -WB_E_PEER, msg);
        return;
    }
    switch (type) {
    case WB_MSG_HEARTBEAT:
        if (c->shutting_down) { /* the EXIT again, on the agent's other connection: a poll
                                 * answer that did not arrive leaves no agent waiting */
            told_end(c, a);
            reply_error(c, req, -WB_E_ENDED, "the job is shutting down");
            return;
        }
        if (b->hb.commits >= a->commits) { /* not taken before a commit it reported since */
            a->version = b->hb.version;
            a->in_flight = b->hb.in_flight;
            a->torn = b->hb.torn;
        }
        a->dropped = b->hb.dropped;
        if (a->role == WB_ROLE_ROLLOUT)
            seen_version(c, a, b->hb.version);
        if (c->x.active && b->hb.epoch == c->epochs) { /* not an earlier attempt's */
            a->done_bytes = b->hb.done;
            a->total_bytes = b->hb.total;
        }
        reply_ok(c, req);
        return;
    case WB_MSG_LEAVE: /* a clean close: said at INFO, and no death (the status says "left") */
        a->alive = false;
        a->left = true;
        wb_log(WB_LOG_INFO, M, "%s rank %u left (it closed its endpoint)", wb_role_name(a->role),
               a->rank);
        if (c->x.active && !part_done(c, a))
            xfer_fail(c, FAIL_AGENT_LOST, "%s rank %u left (it closed its endpoint)",
                      wb_role_name(a->role), a->rank);
        agent_reset(a);
        reply_ok(c, req);
        return;
    case WB_MSG_POLL:
        cmds_ack(a, b->poll.ack);
        if (a->held) /* the agent gave up on its previous poll */
            nng_msg_free(a->held);
        a->held = req;
        a->held_until = wb_now_ns() + c->job->poll_hold_ns;
        if (a->ncmds)
            flush_poll(c, a);
        return;
    case WB_MSG_REP_SETUP:
        on_rep_setup(c, a, &b->setup);
        break;
    case WB_MSG_REP_CONNECTED:
        if (!b->conn.ok) {
            wb_log(WB_LOG_ERROR, M, "%s rank %u could not connect: %s", wb_role_name(a->role),
                   a->rank, b->conn.err);
            /* the job waits for it: the status says why, as for a failed setup */
            snprintf(a->setup_err, sizeof(a->setup_err), "could not connect: %.*s",
                     (int)sizeof(a->setup_err) - 20, b->conn.err);
        } else {
            a->connected_gen = b->conn.gen;
            if (strncmp(a->setup_err, "could not connect: ", 19) == 0)
                a->setup_err[0] = 0;
        }
        break;
    case WB_MSG_REP_SENT:
        on_rep_sent(c, a, &b->sent);
        break;
    case WB_MSG_REP_RECEIVED:
        on_rep_received(c, a, &b->recv);
        break;
    case WB_MSG_REP_COMMITTED:
        on_rep_committed(c, a, &b->commit);
        break;
    case WB_MSG_PUSH:
        on_push(c, req, a, b->push.version, b->push.queue);
        return;
    case WB_MSG_REP_DRAINED:
        if (c->x.active && c->x.aborting && b->drained.version == c->x.version) {
            a->drained = true;
            reply_ok(c, req);
            teardown_check(c, wb_now_ns());
            return;
        }
        break;
    }
    reply_ok(c, req);
    xfer_check(c);
}

/* ---------------------------------------------------------------- client messages */

static const char *const agent_states[] = {"alive", "suspect", "failed", "dead",
                                           "left",  "refused", "absent"};

static const char *agent_state(const struct agent *a)
{
    return a->alive && a->setup_err[0] ? "failed"
           : a->alive && a->suspect    ? "suspect"
           : a->alive                  ? "alive"
           : a->left                   ? "left"
           : a->refused[0]             ? "refused"
           : a->session                ? "dead"
                                       : "absent";
}

/* not "ready" while a failed attempt is torn down: a transfer would be refused */
static const char *job_state(const struct wb_controller *c)
{
    return c->x.active && c->x.aborting ? "aborting" : state_names[c->state];
}

/* One metric's HELP and TYPE lines. */
static void met_head(FILE *f, const char *name, const char *type, const char *help)
{
    fprintf(f, "# HELP weightbridge_%s %s\n# TYPE weightbridge_%s %s\n", name, help, name, type);
}

/* The Prometheus text exposition (format 0.0.4) of the controller's state, handed to the
 * metrics thread. Rendered by the loop (it owns the state), so the thread never reads it. */
static void metrics_publish(struct wb_controller *c)
{
    if (!c->metrics)
        return;
    c->met.published_ns = wb_now_ns();
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f)
        return; /* the last text stays served */
    met_head(f, "versions_complete_total", "counter",
             "Transfers that completed (every rollout committed).");
    fprintf(f, "weightbridge_versions_complete_total %" PRIu64 "\n", c->met.complete);
    met_head(f, "versions_failed_total", "counter", "Transfer attempts that failed.");
    fprintf(f, "weightbridge_versions_failed_total %" PRIu64 "\n", c->met.failed);
    met_head(f, "failures_total", "counter", "Failed transfer attempts by cause.");
    for (int i = 0; i < FAIL_COUNT; i++)
        fprintf(f, "weightbridge_failures_total{cause=\"%s\"} %" PRIu64 "\n", fail_names[i],
                c->met.causes[i]);
    met_head(f, "last_complete_version", "gauge",
             "The last version every rollout holds (0: none yet).");
    fprintf(f, "weightbridge_last_complete_version %" PRIu64 "\n", c->last_version);
    met_head(f, "version_in_flight", "gauge", "The version being transferred (0: none).");
    fprintf(f, "weightbridge_version_in_flight %" PRIu64 "\n", c->x.active ? c->x.version : 0);
    met_head(f, "last_transfer_seconds", "gauge", "Duration of the last complete transfer.");
    fprintf(f, "weightbridge_last_transfer_seconds %.9f\n", (double)c->met.last_ns / 1e9);
    met_head(f, "last_transfer_bytes", "gauge",
             "Bytes the trainers wrote for the last complete version.");
    fprintf(f, "weightbridge_last_transfer_bytes %" PRIu64 "\n", c->met.last_bytes);
    met_head(f, "transferred_bytes_total", "counter",
             "Bytes the trainers wrote for complete versions.");
    fprintf(f, "weightbridge_transferred_bytes_total %" PRIu64 "\n", c->met.bytes_total);
    met_head(f, "transfer_seconds", "histogram", "Durations of complete transfers.");
    for (size_t i = 0; i < WB_ARRAY_LEN(dur_buckets); i++)
        fprintf(f, "weightbridge_transfer_seconds_bucket{le=\"%g\"} %" PRIu64 "\n", dur_buckets[i],
                c->met.buckets[i]);
    fprintf(f,
            "weightbridge_transfer_seconds_bucket{le=\"+Inf\"} %" PRIu64 "\n"
            "weightbridge_transfer_seconds_sum %.9f\n"
            "weightbridge_transfer_seconds_count %" PRIu64 "\n",
            c->met.complete, (double)c->met.sum_ns / 1e9, c->met.complete);
    met_head(f, "agents", "gauge", "Agents by role and state.");
    uint64_t n[2][WB_ARRAY_LEN(agent_states)] = {{0}};
    for (uint32_t i = 0; i < c->nagents; i++) { /* one pass over the agents */
        const char *st = agent_state(&c->agents[i]);
        size_t k = 0;
        while (k + 1 < WB_ARRAY_LEN(agent_states) && strcmp(st, agent_states[k]))
            k++;
        n[c->agents[i].role == WB_ROLE_ROLLOUT][k]++;
    }
    for (int role = 0; role < 2; role++)
        for (size_t k = 0; k < WB_ARRAY_LEN(agent_states); k++)
            fprintf(f, "weightbridge_agents{role=\"%s\",state=\"%s\"} %" PRIu64 "\n",
                    wb_role_name(role ? WB_ROLE_ROLLOUT : WB_ROLE_TRAINER), agent_states[k],
                    n[role][k]);
    met_head(f, "ready", "gauge", "1 while a transfer may start (every agent set up), else 0.");
    fprintf(f, "weightbridge_ready %d\n", !strcmp(job_state(c), "ready"));
    if (fclose(f) != 0 || !text) {
        free(text);
        return;
    }
    ctl_metrics_publish(c->metrics, text, len);
}

static void on_ctl_status(struct wb_controller *c, nng_msg *req)
{
    uint64_t now = wb_now_ns();
    struct wb_mpw agents;
    wb_mpw_init(&agents);
    wb_mpw_array(&agents, c->nagents);
    for (uint32_t i = 0; i < c->nagents; i++) {
        const struct agent *a = &c->agents[i];
        struct wb_body_agent_status as = {.rank = a->rank,
                                          .pid = a->pid,
                                          .device = a->device,
                                          .version = a->version,
                                          .in_flight = a->in_flight,
                                          .torn = a->torn,
                                          .seen_ms = a->session ? (now - a->last_ns) / 1000000 : 0,
                                          .done = a->done_bytes,
                                          .total = a->total_bytes,
                                          .dropped = a->dropped};
        snprintf(as.role, sizeof(as.role), "%s", wb_role_name(a->role));
        snprintf(as.state, sizeof(as.state), "%s", agent_state(a));
        snprintf(as.err, sizeof(as.err), "%s",
                 !a->alive && a->refused[0] ? a->refused : a->setup_err);
        snprintf(as.host, sizeof(as.host), "%s", a->host);
        wb_body_put(&agents, WB_BODY_AGENT_STATUS, &as);
    }
    struct wb_conn_stats cs = {0};
    if (c->srv)
        ctl_serve_stats(c->srv, &cs);
    struct wb_mpw conns;
    wb_mpw_init(&conns);
    wb_body_put(&conns, WB_BODY_CONN_STATS, &cs);
    struct wb_body_status b = {.gen = c->gen,
                               .version = c->last_version,
                               .last_bytes = c->last_bytes,
                               .last_full_bytes = c->last_full_bytes,
                               .last_delta_rollouts = c->last_delta_rollouts,
                               .in_flight = c->x.active ? c->x.version : 0,
                               .agents = mpw_bytes(&agents),
                               .conns = mpw_bytes(&conns)};
    snprintf(b.job, sizeof(b.job), "%s", c->job->name);
    snprintf(b.state, sizeof(b.state), "%s", job_state(c));
    reply_msg(c, req, WB_MSG_STATUS, &b);
    wb_mpw_free(&agents);
    wb_mpw_free(&conns);
}

static void on_ctl_plan(struct wb_controller *c, nng_msg *req)
{
    struct wb_body_plan_info b = {{c->plan.summary, strlen(c->plan.summary)}};
    reply_msg(c, req, WB_MSG_PLAN_INFO, &b);
}

static void on_ctl_shutdown(struct wb_controller *c, nng_msg *req)
{
    if (c->x.active)
        xfer_fail(c, FAIL_SHUTDOWN, "controller shutting down");
    for (uint32_t i = 0; i < c->nagents; i++) /* an agent without its EXIT would outlive us */
        if (c->agents[i].alive && cmd_queue(c, &c->agents[i], WB_CMD_EXIT, NULL)) {
            reply_error(c, req, -ENOMEM, "shutdown: out of memory telling the agents; ask again");
            return;
        }
    c->shutting_down = true;
    /* Every live agent must hear its EXIT: one that misses it waits for a controller that
     * never comes back (rollouts outlive an outage on purpose). A busy agent may take a while
     * to poll; it is waited for until it acknowledges or falls silent for dead_after (then it
     * stops counting), within a generous bound. */
    c->exit_deadline = wb_now_ns() + 4 * (c->job->dead_ns + c->job->poll_hold_ns);
    c->exit_linger = wb_now_ns() + 200 * 1000000ull;
    wb_log(WB_LOG_INFO, M, "shutting down");
    reply_ok(c, req);
}

/* ---------------------------------------------------------------- the loop */

/* A refused message, logged: at most 10 a second (a flood must not fill the disk); the others
 * are counted and their number said once the second is over. */
static void log_refusal(struct wb_controller *c, const char *what)
{
    uint64_t now = wb_now_ns();
    if (now - c->refuse_t0 >= 1000000000ull) {
        if (c->refuse_quiet)
            wb_log(WB_LOG_WARN, M, "%" PRIu64 " more refused messages not logged", c->refuse_quiet);
        c->refuse_t0 = now;
        c->refuse_logged = 0;
        c->refuse_quiet = 0;
    }
    if (c->refuse_logged < 10) {
        c->refuse_logged++;
        wb_log(WB_LOG_WARN, M, "%s", what);
    } else {
        c->refuse_quiet++;
    }
}

static void on_message(struct wb_controller *c, nng_msg *req)
{
    struct wb_msg m;
    const char *why = NULL;
    char msg[WB_ERRMSG_MAX];
    union body b;
    int err = wb_msg_open(nng_msg_body(req), nng_msg_len(req), c->job->token, &m, &why);
    if (err) {
        log_refusal(c, why);
        reply_error(c, req, err, why);
        return;
    }
    switch (m.type) {
    case WB_MSG_REGISTER:
    case WB_MSG_HEARTBEAT:
    case WB_MSG_POLL:
    case WB_MSG_REP_SETUP:
    case WB_MSG_REP_CONNECTED:
    case WB_MSG_REP_SENT:
    case WB_MSG_REP_RECEIVED:
    case WB_MSG_REP_COMMITTED:
    case WB_MSG_PUSH:
    case WB_MSG_REP_DRAINED:
    case WB_MSG_LEAVE:
    case WB_MSG_CTL_TRANSFER:
    case WB_MSG_CTL_STATUS:
    case WB_MSG_CTL_PLAN:
    case WB_MSG_CTL_SHUTDOWN:
        break;
    default:
        reply_error(c, req, -EBADMSG, "refused: unknown message type");
        return;
    }
    if ((err = wb_msg_decode(&m, &b, msg, sizeof(msg))) != 0) {
        char line[WB_ERRMSG_MAX + 16];
        snprintf(line, sizeof(line), "refused: %s", msg);
        log_refusal(c, line);
        reply_error(c, req, err, msg);
        return;
    }
    switch (m.type) {
    case WB_MSG_REGISTER:
        on_register(c, req, &b.reg);
        break;
    case WB_MSG_CTL_TRANSFER:
        on_ctl_transfer(c, req, &b.xfer);
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
        on_agent_call(c, req, m.type, &b);
        break;
    }
    advance(c);
}

/* Says how many connections and messages serve.c refused since the last time (through the
 * refusal log's rate limit). */
static void conn_say(struct wb_controller *c)
{
    struct wb_conn_stats s;
    ctl_serve_stats(c->srv, &s);
    uint64_t k = s.expired + s.evicted + s.full + s.oversized + s.refused + s.unbound;
    if (k == c->conn_said)
        return;
    c->conn_said = k;
    char line[400];
    snprintf(line, sizeof(line),
             "connections so far: %" PRIu64 " accepted, %" PRIu64 " held now (max_connections "
             "%" PRIu64 "); closed %" PRIu64 " silent past the handshake time, %" PRIu64
             " evicted, %" PRIu64 " over max_connections, %" PRIu64 " with a first frame over "
             "%u bytes, %" PRIu64 " with a first message that was no HELLO with the token; %" PRIu64
             " messages refused (another connection's, a replay)",
             s.accepted, s.held,
             (uint64_t)(c->job->max_connections ? c->job->max_connections : 4ull * c->nagents + 64),
             s.expired, s.evicted, s.full, s.oversized, (unsigned)WB_HELLO_MAX, s.refused,
             s.unbound);
    log_refusal(c, line);
}

static void on_tick(struct wb_controller *c, uint64_t now)
{
    if (c->srv) {
        ctl_serve_tick(c->srv, now);
        conn_say(c);
    }
    check_closed(c);
    check_dead(c, now);
    for (uint32_t i = 0; i < c->nagents; i++) {
        struct agent *a = &c->agents[i];
        if (a->held && now >= a->held_until)
            flush_poll(c, a); /* an empty answer: the agent polls again */
    }
    xfer_timeout(c, now);
    teardown_check(c, now);
    advance(c);
    /* at most every 100 ms from here (the loop turns on every message); a transfer's outcome
     * is published at once where it is decided, before its client is answered */
    if (now - c->met.published_ns >= 100 * 1000000ull)
        metrics_publish(c);
}

/* Shutdown is done when every live agent acknowledged its EXIT and every agent declared dead by
 * silence alone heard that the job ends on its next request (check_dead still runs: a live one
 * silent for dead_after joins those), or at the deadline. */
static bool shutdown_done(struct wb_controller *c, uint64_t now)
{
    if (now >= c->exit_deadline)
        return true;
    /* Replies leave asynchronously: give the last ones (the client's OK) time to be written
     * before the socket closes. */
    if (now < c->exit_linger)
        return false;
    for (uint32_t i = 0; i < c->nagents; i++) {
        const struct agent *a = &c->agents[i];
        if ((a->alive && a->ncmds) || (!a->alive && a->unheard && !a->told_end))
            return false;
    }
    return true;
}

void wb_controller_plan_info(const struct wb_controller *c, struct wb_controller_plan_info *out,
                             uint64_t *send)
{
    *out = (struct wb_controller_plan_info){.ntrainers = c->plan.ntrainers,
                                            .nrollouts = c->plan.nrollouts,
                                            .bytes = c->plan.total_bytes,
                                            .mem_cap = c->plan.mem_cap,
                                            .largest_task = c->plan.largest_task};
    for (uint32_t r = 0; send && r < c->plan.ntrainers; r++)
        send[r] = c->plan.send_bytes ? c->plan.send_bytes[r] : 0;
}

int wb_controller_step(struct wb_controller *c, int wait_ms)
{
    if (c->shutting_down && shutdown_done(c, wb_now_ns()))
        return 1;
    struct pollfd p = {.fd = c->fd, .events = POLLIN};
    poll(&p, 1, wait_ms);
    for (int k = 0; k < 64; k++) {
        nng_msg *req = ctl_serve_recv(c->srv);
        if (!req)
            break;
        on_message(c, req);
    }
    on_tick(c, wb_now_ns());
    return 0;
}

int wb_controller_feed(struct wb_controller *c, const void *buf, size_t len, struct wb_mpw *replies)
{
    nng_msg *req;
    if (nng_msg_alloc(&req, 0) != 0 || nng_msg_append(req, buf, len) != 0)
        return -ENOMEM;
    c->capture = replies;
    on_message(c, req);
    on_tick(c, wb_now_ns());
    c->capture = NULL;
    return 0;
}

int wb_controller_run(struct wb_controller *c)
{
    int rc;
    while ((rc = wb_controller_step(c, 20)) == 0)
        ;
    return rc < 0 ? rc : 0;
}

/* Reads a whole (small) file into a NUL-terminated buffer, or NULL. */
static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    char *buf = NULL;
    long n;
    if (f && fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) >= 0 && n < (1 << 20) &&
        fseek(f, 0, SEEK_SET) == 0 && (buf = malloc((size_t)n + 1)) != NULL) {
        if (fread(buf, 1, (size_t)n, f) != (size_t)n) {
            free(buf);
            buf = NULL;
        } else {
            buf[n] = 0;
        }
    }
    if (f)
        fclose(f);
    return buf;
}

/* Listens on the job's URL; on tls+tcp:// with the job's certificate and key. */
static int listen_on(struct wb_controller *c, const struct wb_job *job, struct wb_errlist *el)
{
    nng_tls_config *cfg = NULL;
    char *cert = NULL, *key = NULL, why[200] = "";
    int rv = 0, err = 0;
    if (strncmp(job->listen, "tls+tcp://", 10) == 0) {
        if (!(cert = slurp(job->tls.cert)) || !(key = slurp(job->tls.key))) {
            wb_errlist_add(el, "controller: tls.%s %s: cannot read it", cert ? "key" : "cert",
                           cert ? job->tls.key : job->tls.cert);
            err = -WB_E_CONFIG;
        } else if ((rv = nng_tls_config_alloc(&cfg, NNG_TLS_MODE_SERVER)) == 0 &&
                   (rv = nng_tls_config_own_cert(cfg, cert, key, NULL)) != 0) {
            wb_errlist_add(el,
                           "controller: tls.cert %s, tls.key %s: not a PEM certificate and its "
                           "key: %s",
                           job->tls.cert, job->tls.key, nng_strerror(rv));
            err = -WB_E_CONFIG;
        }
    }
    if (!err && rv) {
        wb_errlist_add(el, "controller: cannot listen on %s: %s", job->listen, nng_strerror(rv));
        err = -EINVAL;
    }
    /* an agent holds three connections (calls, polls, heartbeats), wb-ctl one; until they
     * are introduced, as many again plus a margin */
    uint64_t held = job->max_connections ? job->max_connections : 4ull * c->nagents + 64;
    uint64_t pend = job->max_pending ? job->max_pending : 3ull * c->nagents + 64;
    uint64_t peer = job->max_pending_per_peer ? job->max_pending_per_peer : 3ull * c->nagents + 16;
    struct ctl_serve_limits lim = {.handshake_ns = job->handshake_ns,
                                   .max_held = held > UINT32_MAX ? UINT32_MAX : (uint32_t)held,
                                   .max_pending = pend > UINT32_MAX ? UINT32_MAX : (uint32_t)pend,
                                   .max_per_peer = peer > UINT32_MAX ? UINT32_MAX : (uint32_t)peer};
    if (!err &&
        (err = ctl_serve_open(&c->srv, job->listen, cfg, job->token, &lim, why, sizeof(why))) != 0)
        wb_errlist_add(el, "controller: cannot listen on %s: %s", job->listen, why);
    if (cfg)
        nng_tls_config_free(cfg); /* the listener holds its own reference */
    free(cert);
    free(key);
    return err;
}

int wb_controller_create(const struct wb_job *job, struct wb_controller **out,
                         struct wb_errlist *el)
{
    return wb_controller_create_opts(job, NULL, out, el);
}

int wb_controller_create_opts(const struct wb_job *job, const struct wb_controller_opts *o,
                              struct wb_controller **out, struct wb_errlist *el)
{
    if (!job->token || !*job->token) {
        wb_errlist_add(el,
                       "job %s: token: no cluster token (set token: in the job file or $WB_TOKEN)",
                       job->name);
        if (o && o->trainer_layout)
            wb_trainer_layout_free(o->trainer_layout);
        return -WB_E_CONFIG;
    }
    struct wb_controller *c = calloc(1, sizeof(*c));
    if (!c) {
        if (o && o->trainer_layout)
            wb_trainer_layout_free(o->trainer_layout);
        return -ENOMEM;
    }
    c->job = job;
    int err = ctl_sources_init(&c->src, o);
    err = err ? err : ctl_plan_build(job, o, &c->plan, el);
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
    /* an agent holds three connections (calls, polls, heartbeats); wb-ctl one */
    if (job->max_connections && job->max_connections < 3ull * c->nagents + 1) {
        wb_errlist_add(el,
                       "job: max_connections %llu is below what the %u agents and one wb-ctl "
                       "hold (%llu)",
                       (unsigned long long)job->max_connections, c->nagents, 3ull * c->nagents + 1);
        err = -WB_E_CONFIG;
        goto err_agents;
    }
    if ((err = listen_on(c, job, el)) != 0)
        goto err_agents;
    c->fd = ctl_serve_fd(c->srv);
    if (job->metrics && *job->metrics) {
        char why[400];
        if ((err = ctl_metrics_open(&c->metrics, job->metrics, why, sizeof(why))) != 0) {
            wb_errlist_add(el, "job %s: %s", job->name, why);
            goto err_serve;
        }
        wb_log(WB_LOG_INFO, M, "metrics: GET /metrics on %s (port %u)", job->metrics,
               ctl_metrics_port(c->metrics));
        metrics_publish(c);
    }
    wb_log(WB_LOG_INFO, M, "job %s listening on %s: %u trainers, %u rollouts", job->name,
           job->listen, c->plan.ntrainers, c->plan.nrollouts);
    *out = c;
    return 0;

err_serve:
    ctl_serve_close(c->srv);
err_agents:
    free(c->agents);
err_plan:
    ctl_plan_free(&c->plan);
err_free:
    if (o && o->trainer_layout) /* zeroed when the plan took it over */
        wb_trainer_layout_free(o->trainer_layout);
    ctl_sources_free(&c->src);
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
    ctl_metrics_close(c->metrics);
    ctl_serve_close(c->srv); /* no callback of nng's runs after it */
    free(c->agents);
    free(c->x_delta);
    ctl_plan_free(&c->plan);
    ctl_sources_free(&c->src);
    free(c);
}
