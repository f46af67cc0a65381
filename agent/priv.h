/* priv.h — private to agent/: the endpoint object shared by its public calls (endpoint.c), its
 * control loop (loop.c), its registrations (regs.c) and its data side (data.c: setup, peers,
 * the trainer's executor and the rollout's counters).
 *
 * Threads: the control loop runs on the endpoint's thread (or the caller's, wb_endpoint_run).
 * Everything the public calls read or wait for — readiness, pushes asked for and their
 * outcomes, the versions held, failures — is state.c's, under its own lock; the endpoint's
 * `mu` guards the rest the public calls touch (the thread, a close asked for, the hook, the
 * registrations before the start); everything else is the loop's alone.
 *
 * Calls run downward only: endpoint.c (public calls) → loop.c (the loop) → data.c (setup,
 * peers, progress) → exec.c, direct.c, ops.c, regs.c, io.c; state.c sits below the public calls
 * and the loop and calls none of them. The data side reports outcomes (return values, struct
 * data_done, struct data_setup_out), which the loop turns into state changes and reports. */
#ifndef WB_AGENT_PRIV_H
#define WB_AGENT_PRIV_H

#include <pthread.h>
#include <stdatomic.h>

#include "agent/agent.h"

struct data; /* data.c's state (plan, buffers, transport, executor) */

/* The agent's time defaults, every one in this one place. The first three hold until REGISTERED
 * brings the controller's (its heartbeat period, when it takes a silent agent for dead, how
 * long it parks a poll); give_up_trainer_ns is a trainer's opts.give_up_ns when that is 0 (a
 * rollout holds the weights and never gives up); transfer_ns an attempt's when its TRANSFER
 * names no timeout (a rollout's windows close twice that long after they opened, whatever the
 * controller says meanwhile). */
static const struct ag_defaults {
    uint64_t heartbeat_ns, dead_ns, poll_hold_ns, give_up_trainer_ns, transfer_ns;
} AG_DEFAULTS = {
    .heartbeat_ns = 200 * 1000000ull,
    .dead_ns = 10ull * 1000000000,
    .poll_hold_ns = 500 * 1000000ull,
    .give_up_trainer_ns = 30ull * 1000000000,
    .transfer_ns = 60ull * 1000000000,
};

/* What the control loop learns from SETUP. */
struct agent_job {
    uint64_t gen, seed;
    uint64_t change_period; /* the synthetic source's (SETUP.change_period) */
    char provider[64];
    char trace[1024];
    uint32_t trace_keep; /* versions of traces kept (0: the default) */
    char name[128];
};

/* Data-side results the control loop turns into reports. */
struct data_done {
    bool ok;
    char err[512];
    struct wb_xfer_stats stats; /* trainers */
    uint64_t rx_bytes;          /* rollouts */
};

/* Data-side progress of the transfer in flight (heartbeats carry it). */
struct data_progress {
    uint64_t done, total; /* trainers: bytes written to rollouts and to write, this attempt */
    uint64_t epoch;       /* the attempt (0: none yet) */
};

/* A registered tensor (a copy of the caller's description). */
struct reg {
    struct wb_reg_tensor t;
    void *ptr;
    bool device;
};

/* The registrations, grouped into the allocations they lie in (what is registered with the
 * transport). */
struct seg {
    uintptr_t base;
    uint64_t len;
    bool device;
};

/* The loop's versions, one field per meaning (what it publishes — the version held, the push
 * done, the version failed — is state.c's). */
struct loop_versions {
    uint64_t attempt;    /* the version of the last TRANSFER that started here (0: none yet) */
    uint64_t draining;   /* trainers: an aborted attempt whose REPORT_DRAINED is due (0: none) */
    uint64_t committing; /* rollouts: a complete version whose dump runs before COMMITTED */
};

enum { MAX_QUEUED = 64 };

struct wb_endpoint {
    struct wb_endpoint_opts o;
    char *s_controller, *s_token, *s_trace, *s_domain, *s_dump, *s_extra,
        *s_corrupt; /* opts' copies */
    const char *role;
    struct wb_chan call, pollc;
    /* session (loop only) */
    uint64_t session;
    uint64_t lost_session; /* the session held before it was lost: proof for re-registering */
    uint64_t hb_ns, dead_ns, hold_ns;
    uint64_t last_heard;  /* last reply from the controller */
    uint64_t last_reach;  /* last time the controller was reachable (a connection, a reply) */
    uint64_t silent_said; /* how many 30 s of the controller's silence were said */
    bool call_is_report;  /* the call in flight is queue[0] */
    uint64_t call_push;   /* ... and it is the PUSH of this version (0: not a push) */
    bool registering;
    uint64_t retry_at; /* no register before this time */
    uint64_t last_seq; /* last command handled */
    bool exiting;
    int exit_code; /* what the loop returns once exiting (REFUSED: the controller's code) */
    struct wb_mpw queue[MAX_QUEUED]; /* calls waiting for the call channel, encoded */
    uint64_t queue_push[MAX_QUEUED]; /* the version of a queued PUSH, 0 for a report */
    size_t nq;
    /* registrations (fixed once started) */
    struct reg *regs;
    uint32_t nregs;
    size_t capregs;
    uint32_t *by_name; /* registration indices sorted by name (built at start) */
    /* a sourced trainer: its tensors are read from here (wb_endpoint_set_source) */
    bool sourced;
    struct wb_endpoint_source src;
    char src_id[WB_SOURCE_MAX];
    uint8_t *src_digests; /* 16 bytes per tensor (wb_endpoint_source.digests), NULL: none */
    uint32_t src_ndigests;
    struct seg *segs;
    uint32_t nsegs;
    struct wb_reg_mesh mesh; /* trainers: ndims 0 when no placements are given */
    wb_endpoint_hook hook;
    void *hook_arg;
    /* data side (loop only) */
    struct agent_job job;
    struct data *d;
    bool xfer_active;
    /* Between TRANSFER and its outcome (COMPLETE or ABORT): peers may still need this agent's
     * transport (a fence, a barrier), so the loop keeps polling it. */
    bool attempt_open;
    /* READY came for the current setup: the transport has settled (connections made, warm-up
     * notes delivered), and between attempts it needs no polling. */
    bool settled;
    uint64_t idle_dropped; /* loop_wait_ms: notes dropped as of its last turn ... */
    uint64_t drain_until;  /* ... and until when the transport is drained after a change */
    struct loop_versions v;
    bool in_flight;
    uint64_t commits; /* rollouts: versions committed (heartbeats and COMMITTED carry it) */
    uint64_t pace_until;
    bool after_pending; /* a transfer ended: its follow-up work waits until the report left */
    /* rollouts: a version's dump, written by its own thread (a large model takes seconds, and
     * the loop keeps heartbeating); COMMITTED is reported when it ends */
    pthread_t dump_thread;
    bool dumping;           /* for v.committing */
    _Atomic int dump_state; /* 0 running, 1 done, negative: failed (dump_err) */
    _Atomic int state_req;  /* testing (wb-agent SIGUSR1): dump the tensors as they are now */
    char dump_err[WB_ERRMSG_MAX];
    /* heartbeats, from their own thread (hb.c; NULL while the loop does not run) */
    struct ag_hb *hb;
    uint64_t hb_next; /* loop only: when hb_update runs next */
    /* Wakes the loop from its sleep (an eventfd): a push or a close asked for, the heartbeat
     * thread's news, a dump that ended, a state dump asked for (async-signal-safe). */
    int wake_fd;
    /* shared with the public calls, under mu */
    pthread_mutex_t mu;
    pthread_t thread;
    bool thread_started, stop;
    uint64_t stop_at; /* loop only: when a close stops waiting for queued reports */
    /* what the loop publishes and the public calls wait on (state.c) */
    struct ag_state *st;
};

/* loop.c: the control loop. Returns as wb_endpoint_run() does. */
int ag_loop(struct wb_endpoint *ep);
/* Wakes the loop if it sleeps (any thread, and signal handlers). */
void ag_wake(struct wb_endpoint *ep);
/* Waits for a rollout's dump thread, if one runs (before its memory goes). */
void ag_dump_wait(struct wb_endpoint *ep);

/* state.c: what the loop publishes and the public calls wait on, under a lock of its own. */
struct ag_state;
int ag_state_new(enum wb_role role, uint32_t rank, struct ag_state **out);
void ag_state_free(struct ag_state *st);
/* The last error message (the public calls' and the loop's): says it, and a snapshot of it. */
void ag_state_say(struct ag_state *st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
const char *ag_state_error(struct ag_state *st);
/* What this rank holds: a trainer its newest push done, a rollout its complete version. */
uint64_t ag_state_version(struct ag_state *st);
bool ag_state_torn(struct ag_state *st);
/* The public calls' waits (each says what went wrong with ag_state_say's message). */
int ag_state_wait_ready(struct ag_state *st, uint64_t timeout_ns);
int ag_state_push(struct ag_state *st, uint64_t version);
int ag_state_set_policy(struct ag_state *st, enum wb_push_policy policy);
int ag_state_wait_push(struct ag_state *st, uint64_t version, enum wb_push_event ev,
                       uint64_t timeout_ns);
int ag_state_push_stats(struct ag_state *st, uint64_t version, struct wb_push_stats *out);
int ag_state_wait_version(struct ag_state *st, uint64_t version, uint64_t timeout_ns);
/* The loop's news: a failure that stops it (the first is told), READY or not. */
void ag_set_fatal(struct ag_state *st, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void ag_set_ready(struct ag_state *st, bool ready);
/* Trainers: the next push the loop should send (0: none; *queue: the policy it carries), and
 * what happened to one. */
uint64_t ag_push_next(struct ag_state *st, bool *queue);
void ag_push_event(struct ag_state *st, uint64_t version, enum wb_push_event ev, bool failed,
                   const char *reason);
/* Trainers: the controller skipped `version` in favour of `by` (a version not pushed here yet
 * is remembered: its push is skipped at once); transfer `version` started (the versions
 * skipped since the last one are its); this rank's figures of its transfer. */
void ag_push_skipped(struct ag_state *st, uint64_t version, uint64_t by);
void ag_push_started(struct ag_state *st, uint64_t version);
void ag_push_figures(struct ag_state *st, uint64_t version, const struct wb_xfer_stats *stats);
/* Rollouts: a version completed or failed. */
void ag_version_done(struct ag_state *st, uint64_t version, bool failed, const char *reason);
/* A rollout opened its windows to an attempt: torn until a version completes on it. */
void ag_version_torn(struct ag_state *st);
/* Rollouts: the tensors no longer hold the version they held (why: what replaced them); the
 * rank holds none from now on. */
void ag_version_lost(struct ag_state *st, const char *why);

/* hb.c: the heartbeats' thread and channel. */
struct ag_hb;
/* What the beats heard since the last update: when one was last answered, a session the
 * controller said it lost (0: none), whether it said the job is ending. */
struct ag_hb_news {
    uint64_t heard, lost;
    bool ended;
};
/* Starts beating every period_ns (nothing goes out before the first update with a session);
 * wake_fd: the loop's eventfd, written when news must be acted on at once. */
int ag_hb_start(const char *controller, const char *token, uint64_t period_ns, int wake_fd,
                struct ag_hb **out);
/* Stops the thread (a call in flight gives up within 20 ms) and frees. NULL is a no-op. */
void ag_hb_stop(struct ag_hb *hb);
/* The next beat is b; the loop last sent a request at loop_sent_ns; the period is period_ns. */
void ag_hb_update(struct ag_hb *hb, const struct wb_body_heartbeat *b, uint64_t loop_sent_ns,
                  uint64_t period_ns, struct ag_hb_news *news);
/* The heartbeats' connection to the controller is up (read atomically). */
bool ag_hb_connected(const struct ag_hb *hb);

/* regs.c: registrations. */
int ag_regs_add(struct wb_endpoint *ep, const struct wb_tensor_reg *t, char *err, size_t errcap);
const struct reg *ag_regs_find(const struct wb_endpoint *ep, const char *name);
/* Sorts the registrations' names for ag_regs_find (once started). */
int ag_regs_index(struct wb_endpoint *ep);
/* REGISTER.inv: every registration (wb_reg_put). */
void ag_regs_put(const struct wb_endpoint *ep, struct wb_mpw *w);
/* Groups the registrations into allocations (ep->segs): GPU memory by the allocation the
 * driver reports, host memory by page-aligned ranges merged where they touch. */
int ag_segs_build(struct wb_endpoint *ep, char *err, size_t errcap);
/* The grouping itself, for nregs registrations: range(arg, p, &base, &size) is the GPU
 * allocation holding device pointer p (ag_gpu_addr_range in ag_segs_build; tests give their
 * own). *out (malloc'd) gets *nout segments sorted by base. */
typedef int (*ag_alloc_range_fn)(void *arg, const void *p, uintptr_t *base, uint64_t *size);
int ag_segs_group(const struct reg *regs, uint32_t nregs, ag_alloc_range_fn range, void *arg,
                  struct seg **out, uint32_t *nout, char *err, size_t errcap);
/* The segment holding [p, p + n): its index, or -1. */
int ag_seg_of(const struct wb_endpoint *ep, const void *p, uint64_t n);
uint32_t ag_segs_count(const struct wb_endpoint *ep);
const struct seg *ag_seg_get(const struct wb_endpoint *ep, uint32_t k);
/* Registration r's index (what a source's reads name). */
uint32_t ag_regs_index_of(const struct wb_endpoint *ep, const struct reg *r);
/* A sourced trainer's source (wb_endpoint_set_source), NULL for any other endpoint. */
const struct wb_endpoint_source *ag_regs_source(const struct wb_endpoint *ep);
void ag_regs_free(struct wb_endpoint *ep);

/* What a setup gives back to the loop. */
struct data_setup_out {
    /* msgpack blobs owned by the data side (valid until the next setup), on success */
    const void *addr, *regions;
    size_t addr_len, regions_len;
    /* rollouts, success or not: why the tensors no longer hold the version they held (a
     * re-setup replaced or released them), NULL when they still do */
    const char *lost;
};

/* data.c: setup decodes the plan bytes (and, for trainers, the shard list; for rollouts of a
 * registering endpoint, the names of its locals), binds or allocates and registers memory, and
 * opens the transport; a synthetic trainer starts filling its shards with next_version's
 * values. */
int ag_data_setup(struct data **d, struct wb_endpoint *ep, const struct wb_body_setup *b,
                  uint64_t next_version, struct data_setup_out *out, char *err, size_t errcap);
/* Trainer: the PEERS list (a msgpack array of [role, rank, addr, regions]). */
int ag_data_peers(struct data *d, const void *peers, size_t len, char *err, size_t errcap);
/* Starts the attempt TRANSFER describes (its version, epoch, key and timeout; skip: the tags
 * that landed in an earlier attempt, per rollout rank): it begins on the transport, trainers
 * arm their counters and start the executor (synthetic values generated first), rollouts arm
 * theirs, open their windows and tell their trainers they are ready. */
int ag_data_start(struct data *d, const struct wb_body_version_epoch *b, char *err, size_t errcap);
/* Testing (wb-agent's SIGUSR1; async-signal-safe): the loop writes the rollout's tensors as
 * they are into <dump>/state/rollout<rank>.v<version>.bin and, after it, the version and torn
 * flag it claims into <dump>/state/rollout<rank>.txt ("version V torn 0|1"). */
void ag_state_request(struct wb_endpoint *ep);
/* Notes this agent's transport refused since setup (strangers, stale, forged, replayed). */
uint64_t ag_data_dropped(const struct data *d);
/* Trainers: no write of an ended attempt is in flight any more (nothing of it can land). */
bool ag_data_drained(const struct data *d);
/* Rollouts: an attempt with something to receive is open (writes may land). */
bool ag_data_receiving(const struct data *d);
/* Trainers: bytes written and to write in the transfer in flight. */
void ag_data_progress_get(const struct data *d, struct data_progress *out);
/* Rollouts: the tags of `version` that landed (and were verified) so far, as a msgpack array
 * (for REPORT_RECEIVED after an abort). */
int ag_data_landed(const struct data *d, uint64_t version, struct wb_mpw *w);
/* Makes progress without blocking; 1 when the transfer finished (*out filled), 0 when not. */
int ag_data_progress(struct data *d, struct data_done *out);
/* What follows a finished transfer once its report has left (so none of it delays the
 * report): the version's trace (written on a thread of its own), and the synthetic source's
 * fill of the next version. */
void ag_data_after(struct data *d);
/* Rollouts: the engine's post-update hook ran from t0 to t1, and failed the version when
 * `failed` (its message) is not NULL: for the trace. */
void ag_data_hook_ran(struct data *d, uint64_t t0, uint64_t t1, const char *failed);
/* Drops the transfer in flight (ABORT). */
void ag_data_abort(struct data *d);
/* Polls the transport only (completions, immediates), without advancing a transfer. */
void ag_data_poll(struct data *d);
/* True when the data side has a transport that must be polled on every turn of the loop. */
bool ag_data_busy(const struct data *d);
/* Nothing is in flight on the data side: no attempt, no open window, no write or read
 * outstanding, no fill under way. Its transport needs no polling until the next command. */
bool ag_data_idle(const struct data *d);
/* Rollouts: writes every local tensor to DIR/rollout<rank>.v<version>.bin (for checks). Runs
 * on any thread (the loop's keeps heartbeating meanwhile). */
int ag_data_dump(struct data *d, const char *dir, uint64_t version, char *err, size_t errcap);
void ag_data_free(struct data *d);

#endif /* WB_AGENT_PRIV_H */
