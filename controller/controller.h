/* controller.h — the one public header of controller/: the control-plane protocol every
 * weightbridge process speaks (message types, the token-checked message reader, the nng
 * request channel), the job configuration, and the controller itself.
 *
 * Transport of control messages: nng. The controller listens on one raw REP socket; every
 * agent dials it with two REQ sockets — a "call" socket for register / heartbeat / report
 * (answered at once) and a "poll" socket the controller holds until it has commands for the
 * agent (long poll). Raw REP lets one single-threaded loop keep many requests open and answer
 * them in any order, so the controller needs no threads and the agents need no listen
 * address (they may sit behind NAT or in another network namespace). Commands carry sequence
 * numbers and stay queued until the agent acknowledges them in its next poll, so a lost reply
 * (a dropped connection) never loses a command. wb-ctl dials the same socket with one REQ.
 *
 * Every message is common's versioned envelope [magic, version, type, body] whose body is a
 * msgpack map with "token" as its first key: the cluster token from the job file or $WB_TOKEN.
 * A message without it or with another token is refused with an ERROR reply
 * ("refused: message without a cluster token" / "refused: wrong cluster token"). Decoders skip
 * keys they do not know, so later versions only add keys.
 */
#ifndef WB_CONTROLLER_H
#define WB_CONTROLLER_H

#include <stdio.h>

#include "common/common.h"

/* ================================================================ protocol */

enum wb_msg_type {
    WB_MSG_ERROR = 0x0701, /* reply: {code, msg} */
    WB_MSG_OK,             /* reply: {} or a few fields */
    WB_MSG_REGISTER,       /* agent call: {role, rank, device, host, pid, addr, inv, ...} */
    WB_MSG_REGISTERED,     /* reply: {session, heartbeat_ns, timeout_ns, job...} */
    WB_MSG_HEARTBEAT,      /* agent call: {role, rank, session, version, in_flight} */
    WB_MSG_REPORT,         /* agent call: {role, rank, session, what, version, ok, ...} */
    WB_MSG_POLL,           /* agent poll: {role, rank, session, ack} */
    WB_MSG_COMMANDS,       /* poll reply: {cmds: [[seq, kind, body], ...]} */
    WB_MSG_CTL_TRANSFER,   /* client: {version, timeout_ns} -> RESULT or ERROR */
    WB_MSG_CTL_STATUS,     /* client: {} -> STATUS */
    WB_MSG_CTL_PLAN,       /* client: {} -> PLAN_INFO */
    WB_MSG_CTL_SHUTDOWN,   /* client: {} -> OK; controller tells agents to exit, then exits */
    WB_MSG_RESULT,         /* reply: a transfer's result (struct wb_xfer_result) */
    WB_MSG_STATUS,         /* reply: the controller's and every agent's state */
    WB_MSG_PLAN_INFO,      /* reply: the plan summary text */
};

enum wb_role { WB_ROLE_TRAINER = 0, WB_ROLE_ROLLOUT, WB_ROLE_COUNT };
const char *wb_role_name(enum wb_role r);
int wb_role_parse(const char *s, enum wb_role *out);

/* Commands the controller queues for an agent (COMMANDS entries). */
enum wb_cmd_kind {
    WB_CMD_SETUP = 1, /* body: {gen, table|recv (planner wire bytes), shards, job} */
    WB_CMD_PEERS,     /* body: {gen, agents: [{role, rank, addr, regions}]} */
    WB_CMD_TRANSFER,  /* body: {version, epoch (attempt counter)} */
    WB_CMD_COMPLETE,  /* body: {version}: rollouts publish it */
    WB_CMD_ABORT,     /* body: {version, reason} */
    WB_CMD_EXIT,      /* body: {}: clean shutdown */
};

/* What an agent reports (REPORT "what"). */
enum wb_report_kind {
    WB_REP_SETUP = 1, /* {gen, ok, err, regions}: buffers allocated and registered */
    WB_REP_CONNECTED, /* {gen, ok, err}: peers inserted, ready to transfer */
    WB_REP_SENT,      /* trainer: {version, ok, err, stats} */
    WB_REP_RECEIVED,  /* rollout: {version, ok, err, bytes, writes}: counters reached */
    WB_REP_COMMITTED, /* rollout: {version}: version published */
};

/* A message being written: the envelope, the body map header with its pair count, and the
 * token as the first pair. The caller then writes npairs more key/value pairs. */
void wb_msg_begin(struct wb_mpw *w, uint32_t type, const char *token, uint32_t npairs);
/* Key helpers (a key string, then its value). */
void wb_msg_kstr(struct wb_mpw *w, const char *key, const char *val);
void wb_msg_ku64(struct wb_mpw *w, const char *key, uint64_t val);
void wb_msg_ki64(struct wb_mpw *w, const char *key, int64_t val);
void wb_msg_kf64(struct wb_mpw *w, const char *key, double val);
void wb_msg_kbool(struct wb_mpw *w, const char *key, bool val);
void wb_msg_kbin(struct wb_mpw *w, const char *key, const void *p, size_t n);

enum { WB_MSG_MAX_KEYS = 48 };

/* A received message: its type and, for each key of the body map, a reader positioned at the
 * value. Nothing is copied: the message buffer must outlive it. */
struct wb_msg {
    uint32_t type;
    uint32_t nkeys;
    struct {
        const char *key;
        size_t keylen;
        struct wb_mpr val;
    } kv[WB_MSG_MAX_KEYS];
};

/* Opens a message and checks its token (token NULL: no check, for clients reading ERROR
 * replies). Errors: -EBADMSG (not a message), -WB_E_VERSION, -WB_E_TOKEN with *why set to
 * "refused: message without a cluster token" or "refused: wrong cluster token". */
int wb_msg_open(const void *buf, size_t len, const char *token, struct wb_msg *m, const char **why);
/* Indexes the map object at r (a command body, a status entry) like a message body; r moves
 * past it. -EBADMSG when it is not a map of at most WB_MSG_MAX_KEYS string keys. */
int wb_msg_index(struct wb_mpr *r, struct wb_msg *m);
/* A reader at key's value (a copy: reading it does not disturb the message), or a failed
 * reader (every read -EBADMSG) when the key is absent. */
struct wb_mpr wb_msg_get(const struct wb_msg *m, const char *key);
bool wb_msg_has(const struct wb_msg *m, const char *key);
/* Typed getters: 0, -ENOENT when absent, -EBADMSG for a wrong type. */
int wb_msg_u64(const struct wb_msg *m, const char *key, uint64_t *v);
int wb_msg_i64(const struct wb_msg *m, const char *key, int64_t *v);
int wb_msg_f64(const struct wb_msg *m, const char *key, double *v);
int wb_msg_bool(const struct wb_msg *m, const char *key, bool *v);
int wb_msg_str(const struct wb_msg *m, const char *key, char *buf, size_t cap);
int wb_msg_bin(const struct wb_msg *m, const char *key, const void **p, size_t *n);

/* Encodes an ERROR reply {code, msg}. */
void wb_msg_error(struct wb_mpw *w, const char *token, int code, const char *msg);

/* ---------------------------------------------------------------- the request channel */

/* A REQ socket to the controller used one request at a time. Non-blocking use: send, then
 * wb_chan_try_recv() until it yields the reply (fd() is pollable for readability). */
struct wb_chan {
    uint32_t sock; /* nng_socket id (nng.h stays out of this header) */
    int fd;        /* readable when a reply may be waiting */
    bool busy;     /* a request is outstanding */
    uint64_t sent_ns;
};

/* Dials url (asynchronously: the dial completes in the background and is retried). */
int wb_chan_open(struct wb_chan *c, const char *url);
void wb_chan_close(struct wb_chan *c);
/* Sends w's bytes as the request; a request still outstanding is abandoned. */
int wb_chan_send(struct wb_chan *c, const struct wb_mpw *w);
/* The reply, if one has arrived: 1 with *buf (free with wb_chan_free) and *len, 0 when none
 * yet, negative on error. */
int wb_chan_try_recv(struct wb_chan *c, void **buf, size_t *len);
/* Blocking round trip with a time limit: -ETIMEDOUT when no reply came within timeout_ns. */
int wb_chan_call(struct wb_chan *c, const struct wb_mpw *w, uint64_t timeout_ns, void **buf,
                 size_t *len);
void wb_chan_free(void *buf);

/* ================================================================ job configuration */

enum { WB_JOB_ROLE_MAX = 4096 };

/* The job file (configs/jobs/NAME.yaml), loaded by the table in job.c; --dump-config prints it. */
struct wb_job {
    char *name;
    char *listen; /* nng URL the controller listens on */
    char *token;  /* cluster token ("" -> $WB_TOKEN; required either way) */
    struct {
        char *rules;             /* model rules (configs/models/…) */
        char *hf_config;         /* config.json: generate both inventories from the rules */
        char *vars;              /* the job's values of the family file's vars ("mtp=1") */
        char *trainer_inventory; /* inventory files (YAML/JSON) */
        char *rollout_inventory;
    } model;
    char *trainer_layout; /* cluster layout files */
    char *rollout_layout;
    int mode;         /* enum wb_plan_mode order: auto|direct|amax|gather */
    uint64_t mem_cap; /* executor temporary-memory cap, bytes */
    uint64_t seed;    /* synthetic parameter source seed */
    char *provider;   /* transport: tcp|shm|cuda_ipc|… as transport/ names them */
    uint64_t heartbeat_ns, dead_ns, transfer_ns, poll_hold_ns;
    uint64_t trainers, rollouts; /* expected agents; 0 = from the layouts */
    char *trace;                 /* "" or a directory: agents write <dir>/<role><rank>.json */
};

extern const struct wb_cfg_field wb_job_fields[];

/* Loads the job file; paths inside it are resolved relative to the file's directory. Problems
 * go to el with file:line:col; -WB_E_CONFIG then. The token falls back to $WB_TOKEN. */
int wb_job_load(const char *path, struct wb_job *job, struct wb_errlist *el);
void wb_job_free(struct wb_job *job);

/* ================================================================ the controller */

struct wb_controller;

/* Creates the controller: loads and checks the model and layouts, matches and plans (every
 * problem goes to el: a mismatched model is refused here, before anything is sent), and
 * listens. The job is borrowed for the controller's lifetime. */
int wb_controller_create(const struct wb_job *job, struct wb_controller **out,
                         struct wb_errlist *el);
/* Runs the event loop until a client asks for shutdown (returns 0) or a fatal error. */
int wb_controller_run(struct wb_controller *c);
void wb_controller_destroy(struct wb_controller *c);

/* ================================================================ transfer results */

enum wb_stage {
    WB_STAGE_H2D = 0,
    WB_STAGE_GATHER,
    WB_STAGE_FUSE,
    WB_STAGE_QUANT,
    WB_STAGE_WRITE,
    WB_STAGE_BARRIER,
    WB_STAGE_COUNT
};
const char *wb_stage_name(enum wb_stage s);

/* One trainer's figures for one transfer (sent in its REPORT, returned in RESULT). */
struct wb_xfer_stats {
    uint32_t rank;
    uint64_t bytes, writes, tasks;
    uint64_t peak_tmp, cap;
    uint64_t stage_ns[WB_STAGE_COUNT]; /* summed busy time per stage */
    uint64_t total_ns;                 /* TRANSFER received -> last write completed */
    uint64_t mem_waits;                /* tasks that waited for memory under the cap */
};

void wb_xfer_stats_put(struct wb_mpw *w, const struct wb_xfer_stats *s);
int wb_xfer_stats_get(struct wb_mpr *r, struct wb_xfer_stats *s);

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

#endif /* WB_CONTROLLER_H */
