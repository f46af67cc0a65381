/* controller.h — the one public header of controller/: the job configuration, the controller
 * itself, and the reference check that transfers are verified against.
 *
 * The controller collects agents (proto/ is the protocol they speak), matches and plans once
 * (matcher/, planner/), hands each agent its routing table or receive list (route/), triggers
 * transfers and publishes "version N complete" only when every trainer and rollout agrees.
 * One listener carries everything (the REQ/REP wire protocol, served by the controller itself
 * so that strangers are refused before they cost anything): a request is answered at once or
 * held (agent polls
 * until a command is queued, a client's transfer until it ends), every held request with a
 * deadline, so nothing waits forever on either side.
 */
#ifndef WB_CONTROLLER_H
#define WB_CONTROLLER_H

#include <stdio.h>

#include "common/common.h"
#include "proto/proto.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ================================================================ job configuration */

/* The job file (configs/jobs/NAME.yaml), loaded by the table in job.c; --dump-config prints it. */
struct wb_job {
    char *name;
    char *listen; /* nng URL the controller listens on */
    char *token;  /* cluster token ("" -> $WB_TOKEN; "" if neither: required to serve) */
    struct {
        char *rules;             /* model rules (configs/models/…) */
        char *hf_config;         /* config.json: generate both inventories from the rules */
        char *vars;              /* the job's values of the family file's vars ("mtp=1") */
        char *naming;            /* the trainer naming ("megatron"); "": derived or the first */
        char *trainer_inventory; /* inventory files (YAML/JSON) */
        char *rollout_inventory;
    } model;
    char *trainer_layout; /* cluster layout files */
    char *rollout_layout;
    int mode;         /* enum wb_plan_mode: auto|direct|gather (route's wb_plan_mode_names) */
    uint64_t mem_cap; /* executor temporary-memory cap, bytes */
    uint64_t seed;    /* synthetic parameter source seed */
    char *provider;   /* transport: tcp|shm|cuda_ipc|… as transport/ names them */
    /* Liveness: a heartbeat every heartbeat_ns; silent for suspect_ns, an agent is suspect
     * (shown, waited for); for dead_ns, dead. A closed connection is a death at once. */
    uint64_t heartbeat_ns, suspect_ns, dead_ns, transfer_ns, poll_hold_ns;
    uint64_t trainers, rollouts; /* expected agents; 0 = from the layouts */
    char *trace;                 /* "" or a directory: agents write <role><rank>.v<N>.json */
    uint64_t trace_keep;         /* versions of traces each agent keeps there (1 .. 1000000) */
    bool verify; /* rollouts check every write against its checksum computed at the writer */
    /* Delta updates: trainers send a rollout only the bytes that changed since the version it
     * holds whole, and everything every delta_full_every versions and on any doubt. */
    bool delta;
    uint64_t delta_full_every;
    /* The synthetic source changes this fraction of elements per version (0: all of them) */
    double synthetic_change;
    uint64_t max_connections; /* introduced connections held at once (0: 4 per agent + 64) */
    uint64_t version_step;    /* a version may be at most this far past the last complete one */
    uint64_t handshake_ns; /* a connection not introduced (HELLO with the token) by then closes */
    uint64_t max_pending;  /* connections not introduced yet (0: 3 per agent + 64) */
    uint64_t max_pending_per_peer; /* ... of one peer address (0: 3 per agent + 16) */
    char *metrics; /* "" or HOST:PORT: Prometheus text at GET /metrics (metrics.c) */
    struct {
        char *cert; /* PEM certificate (chain) the controller shows on a tls+tcp:// listen URL */
        char *key;  /* PEM private key of cert */
    } tls;
};

/* The synthetic source's change period for the job's synthetic_change (wb_synth_fill_change):
 * one element in every period changes per version; 0 when every element does. */
static inline uint64_t wb_job_change_period(const struct wb_job *j)
{
    if (!(j->synthetic_change > 0))
        return 0;
    double p = 1.0 / j->synthetic_change + 0.5;
    return p >= 1e18 ? (uint64_t)1e18 : (uint64_t)p;
}

/* The longest duration a job or a request may set (7 days): longer ones are refused rather
 * than added to a clock reading, where 2^64 ns would wrap to an immediate deadline. */
enum { WB_JOB_MAX_DAYS = 7 };
static const uint64_t WB_JOB_MAX_NS = WB_JOB_MAX_DAYS * 86400ull * 1000000000ull;

extern const struct wb_cfg_field wb_job_fields[];

/* Loads the job file; paths inside it are resolved relative to the file's directory. Problems
 * go to el with file:line:col; -WB_E_CONFIG then. The token falls back to $WB_TOKEN
 * (wb_token_resolve) and may be absent: wb_controller_create() is what requires one. */
int wb_job_load(const char *path, struct wb_job *job, struct wb_errlist *el);
void wb_job_free(struct wb_job *job);

/* ================================================================ the controller */

struct wb_controller;

/* Creates the controller: loads and checks the model and layouts, matches and plans (every
 * problem goes to el: a mismatched model is refused here, before anything is sent), and
 * listens. A job without a token is -WB_E_CONFIG. The job is borrowed for the controller's
 * lifetime. */
int wb_controller_create(const struct wb_job *job, struct wb_controller **out,
                         struct wb_errlist *el);
/* What a program embedding the controller gives beyond the job file: a checkpoint broadcast
 * (ckpt/bin/wb-broadcast) plans for readers it laid out itself. */
struct wb_trainer_layout;
struct wb_inventory;
/* What one trainer rank's source holds, part by part in its registration order (a broadcast
 * reader's share pieces): the digest of each part's bytes, and how a refusal names it. */
struct wb_source_parts {
    uint32_t n;
    const uint8_t *digests;  /* 16 bytes each (XXH3-128) */
    const char *const *what; /* "model.norm.weight", "lm_head.weight (rows 0-511)" */
};
struct wb_controller_opts {
    /* The trainer layout (taken over: *trainer_layout is left zeroed, also on failure) and the
     * trainer inventory (copied) instead of the job's; the job then names no trainer layout. */
    struct wb_trainer_layout *trainer_layout;
    const struct wb_inventory *trainer_inv;
    /* Every trainer must register with this source (REGISTER.source, a checkpoint's
     * fingerprint); NULL: any. */
    const char *source;
    /* Or one per trainer rank (nsources of them, a broadcast's readers: the checkpoint's
     * fingerprint and the content hash of that reader's share); overrides source. */
    const char *const *sources;
    uint32_t nsources;
    /* With sources: what each of those ranks' source holds (nsources of them, or NULL). A
     * trainer refused for another source whose fingerprint is the job's (the same files, the
     * same share) and that registered its own digests (wb_endpoint_source.digests) is told
     * which of its tensors differ, the first by name. Copied. */
    const struct wb_source_parts *parts;
    /* Raise the executors' memory cap to the largest task where that is over the job's cap
     * (a checkpoint's tensors are the size they are) instead of failing at setup. */
    bool fit_largest_task;
};

/* wb_controller_create with options (o may be NULL). */
int wb_controller_create_opts(const struct wb_job *job, const struct wb_controller_opts *o,
                              struct wb_controller **out, struct wb_errlist *el);
/* What the plan is, for the program that embeds the controller. The plan is fixed once
 * created, so this may be read from any thread while the controller runs (a plan still waiting
 * for the trainers' registrations reads as zeros). */
struct wb_controller_plan_info {
    uint32_t ntrainers, nrollouts;
    uint64_t bytes;        /* every write of a transfer */
    uint64_t mem_cap;      /* the executors' temporary-memory cap */
    uint64_t largest_task; /* temporary bytes of the largest task */
};
/* send (may be NULL): ntrainers entries, what each trainer rank writes. */
void wb_controller_plan_info(const struct wb_controller *c, struct wb_controller_plan_info *out,
                             uint64_t *send);
/* Runs the event loop until a client asks for shutdown (returns 0) or a fatal error. */
int wb_controller_run(struct wb_controller *c);
/* One turn of that loop, for a program that runs its own (and the message-handler fuzz
 * target): waits up to wait_ms for messages, handles those that came, runs the timers.
 * 0: go on; 1: shut down; < 0: a fatal error. */
int wb_controller_step(struct wb_controller *c, int wait_ms);
/* One request handled as if it had arrived on the socket, then the timers run, without the
 * network (tests and the message-handler fuzz target): every reply the controller gives
 * meanwhile — to this request, or to one it held — is appended to *replies (a wb_mpw the caller
 * initialised). 0 or -ENOMEM. */
struct wb_mpw;
int wb_controller_feed(struct wb_controller *c, const void *buf, size_t len,
                       struct wb_mpw *replies);
void wb_controller_destroy(struct wb_controller *c);

/* ================================================================ the reference check
 *
 * What every byte of a rollout rank's tensors must be after version N, computed independently
 * of the planner and the executor (verify.c): the matcher's mappings, the synthetic source, the
 * quant CPU reference, the rollout layout's boxes. Checked against a rollout agent's dump
 * (wb-agent --dump DIR writes DIR/rollout<rank>.v<N>.bin: "WBDUMP1\n", u32 count, then per
 * local tensor u32 rollout tensor index, u64 bytes, the bytes; host byte order). */
struct wb_ref;
int wb_ref_load(const struct wb_job *job, struct wb_ref **out, struct wb_errlist *el);
void wb_ref_free(struct wb_ref *f);
uint32_t wb_ref_nrollouts(const struct wb_ref *f);
/* 0 when the dump of rollout `rank` at `path` equals the reference for `version` (*bytes: how
 * many were compared); otherwise a negative code and msg naming the rank, tensor and first
 * differing byte. */
int wb_ref_check_dump(const struct wb_ref *f, uint32_t rank, uint64_t version, const char *path,
                      char *msg, size_t cap, uint64_t *bytes);

#ifdef __cplusplus
}
#endif

#endif /* WB_CONTROLLER_H */
