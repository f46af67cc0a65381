/* proto.h — the one public header of proto/: the control-plane protocol every weightbridge
 * process speaks (agents, the controller, wb-ctl): roles, message types, one C struct per
 * message body with the table that encodes and decodes it, transfer statistics, and the nng
 * request channel.
 *
 * It sits below both agent/ and controller/ so that neither includes the other: the agent and
 * the controller stand side by side on this contract.
 *
 * Transport of control messages: nng's REQ/REP wire protocol. Every agent dials the controller
 * with three REQ sockets — a "call" socket for register / report / push (answered at once), a
 * "poll" socket the controller holds until it has commands for the agent (long poll) and a
 * heartbeat socket. Commands carry sequence numbers and stay queued until the agent
 * acknowledges them in its next poll, so a lost reply never loses a command. wb-ctl dials with
 * one REQ. The controller serves the same wire protocol itself on nng's stream layer (a REP
 * socket reads a frame whole before its protocol sees it; see controller/serve.c).
 *
 * Connections: a connection's first message is a HELLO (at most WB_HELLO_MAX bytes, with the
 * token); the WELCOME reply hands out a 64-bit nonce for that connection, and every later
 * message on it travels behind a binding prefix (WB_BIND_LEN bytes: magic, that nonce and a
 * sequence number that grows with every message sent on the connection). The controller refuses
 * a message whose nonce is not its connection's (a message captured on one connection and sent
 * on another) or whose number is not above the last one's (a replay on the same connection).
 * wb_chan does all of this under its API.
 *
 * Wire form: common's versioned envelope [magic, version, type, body]. The body is a msgpack
 * map; every message but ERROR has "token" (the cluster token from the job file or $WB_TOKEN)
 * as its first key, and an ERROR never carries it, so a refusal tells a stranger nothing. The
 * keys after the token are described by the message's field table (struct wb_field rows:
 * key, type, required, offset); a decoder reports an unknown key, a missing required key, a
 * wrong type or an oversized string as an error naming the message and the key, and fills
 * nothing on failure. Nested maps (a command's body inside COMMANDS, one agent of STATUS,
 * a trainer's statistics) are bodies with tables of their own.
 */
#ifndef WB_PROTO_H
#define WB_PROTO_H

#include "common/common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ================================================================ roles and stages */

enum wb_role { WB_ROLE_TRAINER = 0, WB_ROLE_ROLLOUT, WB_ROLE_COUNT };
const char *wb_role_name(enum wb_role r);
int wb_role_parse(const char *s, enum wb_role *out);

/* The cluster token: `given` (a job file's token:, a --token option) when it is set and not
 * empty, else $WB_TOKEN when set and not empty, else NULL. The one home of that fallback: a
 * program that needs a token calls this and says which it lacks; one that sends nothing (a
 * dry run, wb-ctl verify) never asks. */
const char *wb_token_resolve(const char *given);

/* The executor's stages, as transfer statistics and traces report them. */
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

/* ================================================================ message types */

/* Every body type. Messages travel alone in an envelope; commands travel inside COMMANDS as
 * [seq, type, body]; the last group are maps nested inside other bodies. */
enum wb_msg_type {
    /* replies */
    WB_MSG_ERROR = 0x0701, /* struct wb_body_error */
    WB_MSG_OK,             /* no fields */
    WB_MSG_REGISTERED,     /* struct wb_body_registered */
    WB_MSG_COMMANDS,       /* struct wb_body_commands (poll reply) */
    WB_MSG_RESULT,         /* struct wb_body_result (a transfer's outcome) */
    WB_MSG_STATUS,         /* struct wb_body_status */
    WB_MSG_PLAN_INFO,      /* struct wb_body_plan_info */
    WB_MSG_WELCOME,        /* struct wb_body_welcome (HELLO's answer) */
    /* agent calls */
    WB_MSG_REGISTER = 0x0710, /* struct wb_body_register */
    WB_MSG_HEARTBEAT,         /* struct wb_body_heartbeat */
    WB_MSG_POLL,              /* struct wb_body_poll */
    WB_MSG_REP_SETUP,         /* struct wb_body_rep_setup: buffers allocated and registered */
    WB_MSG_REP_CONNECTED,     /* struct wb_body_rep_connected: peers inserted */
    WB_MSG_REP_SENT,          /* struct wb_body_rep_sent: a trainer finished a transfer */
    WB_MSG_REP_RECEIVED,      /* struct wb_body_rep_received: a rollout's counters reached */
    WB_MSG_REP_COMMITTED,     /* struct wb_body_rep_committed: a rollout published a version */
    WB_MSG_PUSH,              /* struct wb_body_push: a trainer asks for a transfer -> OK/ERROR */
    WB_MSG_REP_DRAINED,       /* struct wb_body_rep_drained: a trainer's writes of an ended
                                 attempt all completed (nothing of it can land any more) */
    WB_MSG_LEAVE,             /* struct wb_body_leave: the endpoint is closing -> OK */
    /* client calls (wb-ctl) */
    WB_MSG_CTL_TRANSFER = 0x0720, /* struct wb_body_ctl_transfer -> RESULT or ERROR */
    WB_MSG_CTL_STATUS,            /* no fields -> STATUS */
    WB_MSG_CTL_PLAN,              /* no fields -> PLAN_INFO */
    WB_MSG_CTL_SHUTDOWN,          /* no fields -> OK; agents are told to exit */
    /* every connection's first message (wb_chan sends it) */
    WB_MSG_HELLO = 0x0728, /* no fields -> WELCOME or ERROR */
    /* commands (inside COMMANDS) */
    WB_CMD_SETUP = 0x0730, /* struct wb_body_setup */
    WB_CMD_PEERS,          /* struct wb_body_peers */
    WB_CMD_TRANSFER,       /* struct wb_body_version_epoch */
    WB_CMD_COMPLETE,       /* struct wb_body_version: rollouts publish it */
    WB_CMD_ABORT,          /* struct wb_body_abort */
    WB_CMD_EXIT,           /* no fields: clean shutdown */
    WB_CMD_READY,          /* struct wb_body_ready: every agent is set up; transfers may run */
    WB_CMD_REFUSED,        /* struct wb_body_error: the registration cannot be planned (every
                              problem in detail); the agent stops */
    WB_CMD_SKIPPED,        /* struct wb_body_skipped (trainers): a pushed version that will
                              never be transferred, a newer push replaced it */
    /* nested maps */
    WB_BODY_STATS = 0x0740, /* struct wb_xfer_stats */
    WB_BODY_AGENT_STATUS,   /* struct wb_body_agent_status (one entry of STATUS.agents) */
    WB_BODY_CONN_STATS,     /* struct wb_conn_stats (STATUS.conns) */
};

/* The type's name ("REGISTER", "SETUP", ...), or NULL for a type without a table. */
const char *wb_msg_type_name(uint32_t type);

/* ================================================================ bodies */

enum {
    WB_ERRMSG_MAX = 512,
    WB_HOST_MAX = 64,
    WB_ROLE_STR = 16,
    WB_JOBNAME_MAX = 128,
    WB_PATH_STR = 1024,
    WB_RANKS_MAX = 4096, /* agents of one role a job may have */
    WB_SOURCE_MAX = 160, /* REGISTER.source */
};

/* Bytes inside a received message (bin or str payloads, or a nested msgpack object): valid as
 * long as the message buffer is. Encoders copy them. */
struct wb_bytes {
    const void *p;
    size_t n;
};

struct wb_body_error {
    int64_t code;
    char msg[WB_ERRMSG_MAX];
    struct wb_bytes detail; /* optional: every problem, one per line (a refused registration) */
};

/* Every agent call after REGISTER names its session. */
struct wb_session {
    char role[WB_ROLE_STR];
    uint64_t rank;
    uint64_t session;
};

struct wb_body_register {
    char role[WB_ROLE_STR];
    uint64_t rank;
    int64_t device; /* GPU index, -1: host memory */
    char host[WB_HOST_MAX];
    uint64_t pid;
    bool synthetic;       /* the agent holds no tensors of its own: it allocates what the plan
                             assigns and fills trainer shards from the synthetic source */
    struct wb_bytes inv;  /* msgpack array of struct wb_reg_tensor (wb_reg_put) */
    struct wb_bytes mesh; /* trainers: struct wb_reg_mesh (wb_reg_mesh_put), or nothing */
    /* Trainers whose tensors are read from a source (a checkpoint) instead of memory: what
     * the bytes are (the checkpoint's fingerprint), "" otherwise. */
    char source[WB_SOURCE_MAX];
    /* A sourced trainer's digests of its tensors, 16 bytes each in registration order (a
     * checkpoint reader's XXH3-128 per piece), or nothing: a refusal of its source names the
     * first tensor whose digest is not the job's. */
    struct wb_bytes digests;
    /* The last version this agent knows complete (rollouts: the one they hold; trainers: their
     * last done push): a restarted controller's versions go on from the highest. */
    uint64_t version;
    /* Rollouts: a transfer reached this process's tensors and no version completed on them
     * since (wb_endpoint_torn): they hold neither `version` whole nor another. */
    bool torn;
    /* The session this process held until it lost it (0: none). A rank the controller still
     * thinks alive is given only to a registration that proves it is its holder this way:
     * host and pid are public (wb-ctl status shows them), the session's 64 random bits not. */
    uint64_t session;
};

/* One tensor an endpoint registers: its metadata (name, dtype, global shape, the box this rank
 * holds; a rollout's shape is its local tensor's and the box all of it), when it is not laid
 * out contiguously row-major its strides in elements, and — for a trainer whose process knows
 * it (a DTensor, a Megatron model) — how it is placed on the trainers' device mesh: per mesh
 * dim, WB_REG_REPLICATE, the tensor dim it is sharded along (torch.chunk rule, 0 and up), or
 * "only the ranks at coordinate i of this dim hold it" (a pipeline stage's layers, an expert
 * rank's experts), wb_reg_at(i) = -2 - i: the values below -1 were free, so older agents'
 * placements keep their meaning. */
enum { WB_REG_MESH_DIMS = 6, WB_REG_REPLICATE = -1, WB_REG_AT_MAX = 1 << 20 };

/* The placement value "at coordinate i", and back: the coordinate a value names, or -1 when
 * it is no "at" (replicate, or a shard dim). */
static inline int32_t wb_reg_at(uint32_t i)
{
    return -2 - (int32_t)i;
}

static inline int64_t wb_reg_at_index(int64_t v)
{
    if (v > -2)
        return -1;
    return v < -2 - (int64_t)WB_REG_AT_MAX ? (int64_t)WB_REG_AT_MAX : -2 - v; /* no overflow */
}

struct wb_reg_tensor {
    struct wb_tensor_meta meta;
    bool has_strides;
    int64_t strides[WB_MAX_DIMS];
    uint32_t nplace; /* 0: not given */
    int32_t place[WB_REG_MESH_DIMS];
};

/* The trainers' device mesh an endpoint's placements refer to (REGISTER.mesh): dims in the
 * order ranks are numbered, row-major (the first dim is the slowest). */
enum { WB_REG_MESH_NAME = 16 };
struct wb_reg_mesh {
    uint32_t ndims;
    char name[WB_REG_MESH_DIMS][WB_REG_MESH_NAME];
    uint32_t size[WB_REG_MESH_DIMS];
};
void wb_reg_mesh_put(struct wb_mpw *w, const struct wb_reg_mesh *m);
int wb_reg_mesh_get(struct wb_mpr *r, struct wb_reg_mesh *m);
void wb_reg_put(struct wb_mpw *w, const struct wb_reg_tensor *t);
/* -EBADMSG for a malformed entry (r fails). */
int wb_reg_get(struct wb_mpr *r, struct wb_reg_tensor *t);
/* True when the strides (if any) are those of a contiguous row-major box. */
bool wb_reg_contiguous(const struct wb_reg_tensor *t);

struct wb_body_registered {
    uint64_t session, heartbeat_ns, dead_ns, poll_hold_ns;
};

struct wb_body_heartbeat {
    struct wb_session s;
    uint64_t version; /* rollouts: last complete version */
    bool in_flight;
    uint64_t done, total; /* trainers: bytes of the transfer in flight written and to write */
    uint64_t epoch;       /* ... of this transfer attempt (TRANSFER.epoch; 0: none yet) */
    bool torn;        /* rollouts: a failed transfer may have landed in part (wb_endpoint_torn) */
    uint64_t dropped; /* notes this agent's transport refused so far (wb_tx_note_stats) */
    /* Rollouts: versions this process committed so far. Heartbeats travel on their own
     * connection, so one taken before a COMMITTED report can arrive after it: the controller
     * keeps a heartbeat's version and torn only when its count is not behind the report's. */
    uint64_t commits;
};

struct wb_body_rep_drained {
    struct wb_session s;
    uint64_t version;
};

/* LEAVE: the process closed its endpoint (wb_endpoint_close): it left, and did not die. */
struct wb_body_leave {
    struct wb_session s;
};

struct wb_body_poll {
    struct wb_session s;
    uint64_t ack; /* last command sequence number handled */
};

/* COMMANDS: a msgpack array of [seq, type, body] (wb_cmd_put / wb_cmd_next). */
struct wb_body_commands {
    struct wb_bytes cmds;
};

struct wb_body_rep_setup {
    struct wb_session s;
    uint64_t gen;
    bool ok;
    char err[WB_ERRMSG_MAX];
    struct wb_bytes addr;    /* transport address blob */
    struct wb_bytes regions; /* memory descriptors blob */
};

struct wb_body_rep_connected {
    struct wb_session s;
    uint64_t gen;
    bool ok;
    char err[WB_ERRMSG_MAX];
};

struct wb_body_rep_sent {
    struct wb_session s;
    uint64_t version;
    bool ok;
    char err[WB_ERRMSG_MAX];
    struct wb_bytes stats; /* a WB_BODY_STATS map */
};

struct wb_body_rep_received {
    struct wb_session s;
    uint64_t version;
    bool ok;
    char err[WB_ERRMSG_MAX];
    uint64_t bytes;
    /* A rollout told to abort a version: the data tags (rollout tensor index + 1) that landed
     * complete — and verified, when the job verifies — in some attempt of it, as a msgpack
     * array of u64, so that the next attempt resends only the rest. */
    struct wb_bytes landed;
};

struct wb_body_rep_committed {
    struct wb_session s;
    uint64_t version;
    uint64_t commits; /* the process's committed versions, this one included (heartbeat) */
};

struct wb_body_push {
    struct wb_session s;
    uint64_t version;
    bool queue; /* the trainer's push policy: every version in order (false: the latest wins) */
};

struct wb_body_skipped {
    uint64_t version; /* never transferred */
    uint64_t by;      /* the newer push that replaced it */
};

struct wb_body_ready {
    uint64_t gen;
};

struct wb_body_ctl_transfer {
    uint64_t version;
    uint64_t timeout_ns; /* 0: the job's transfer_timeout */
};

struct wb_body_result {
    uint64_t version, total_ns, gen;
    /* since the start, when the last trainer reported its writes done, the last rollout counted
     * everything, and (total_ns) the last rollout committed the version */
    uint64_t sent_ns, received_ns;
    struct wb_bytes trainers;      /* array of WB_BODY_STATS maps, by rank */
    struct wb_bytes rollout_bytes; /* array of u64, by rank */
    /* Delta jobs: per rollout rank one byte, 0 sent full, 1 sent deltas by every trainer, 2 by
     * some (the others' shadows did not hold the base); nothing: every rollout full */
    struct wb_bytes delta;
};

struct wb_body_status {
    char job[WB_JOBNAME_MAX];
    char state[WB_ROLE_STR];
    uint64_t gen, version, in_flight;
    /* the last complete version's bytes written and a full update's (0, 0: none yet), and
     * how many rollouts got deltas */
    uint64_t last_bytes, last_full_bytes, last_delta_rollouts;
    struct wb_bytes agents; /* array of WB_BODY_AGENT_STATUS maps */
    struct wb_bytes conns;  /* a WB_BODY_CONN_STATS map (optional) */
};

/* The controller's control connections: held now, and what it refused since it started. */
struct wb_conn_stats {
    uint64_t held, pending; /* connections introduced (HELLO with the token) / not yet */
    uint64_t max_held, max_pending;
    uint64_t accepted;  /* connections accepted */
    uint64_t expired;   /* closed: no HELLO within the job's handshake time */
    uint64_t evicted;   /* closed to make room for a newer unintroduced connection */
    uint64_t full;      /* closed: introduced while max_connections were held */
    uint64_t oversized; /* closed: a first frame over WB_HELLO_MAX, before it was read */
    uint64_t refused;   /* closed: a first message that was no HELLO with the token */
    uint64_t unbound;   /* messages refused: another connection's nonce, a replay */
};

struct wb_body_welcome {
    uint64_t nonce; /* this connection's: every later message's binding prefix carries it */
};

struct wb_body_agent_status {
    char role[WB_ROLE_STR];
    uint64_t rank;
    char state[WB_ROLE_STR]; /* alive, dead, absent */
    char host[WB_HOST_MAX];
    uint64_t pid;
    int64_t device;
    uint64_t version;
    bool in_flight;
    bool torn; /* rollouts: version's tensors overwritten in part by a failed transfer */
    uint64_t seen_ms;
    uint64_t done, total;    /* trainers: bytes of the transfer in flight written and to write */
    char err[WB_ERRMSG_MAX]; /* why its setup failed (state "failed"), "" otherwise */
    uint64_t dropped;        /* notes its transport refused (strangers, stale, forged, replayed) */
};

struct wb_body_plan_info {
    struct wb_bytes summary; /* text */
};

struct wb_body_setup {
    uint64_t gen;
    uint64_t seed;           /* synthetic source seed */
    char provider[64];       /* transport provider (wb_tx_cfg_provider) */
    char trace[WB_PATH_STR]; /* "" or a directory for Chrome traces */
    uint64_t trace_keep;     /* versions of traces each agent keeps there (0: its default) */
    char job[WB_JOBNAME_MAX];
    struct wb_bytes plan;   /* routing table (trainers) or receive list (rollouts) envelope */
    struct wb_bytes shards; /* trainers: msgpack array of [trainer tensor, wb_tensor_meta] */
    struct wb_bytes locals; /* rollouts: msgpack array of the names of the receive list's
                               local tensors, in its order (a registering rollout binds them) */
    /* Checksums: every write to a rollout is followed by a record of it (where it landed and
     * the wb_sum64 of its bytes at the writer) in the rollout's sum inbox, which checks what
     * landed against it. The inbox has one WB_SUM_RECORD-byte slot per write the receive list
     * counts, grouped by expect entry in the list's order. */
    bool verify;
    struct wb_bytes sums; /* trainers, with verify: per write of the table, its slot in its
                             rollout's inbox, u32 little-endian each */
    /* Delta updates (job key delta): a rollout's delta inbox has a slab per trainer that
     * writes to it, sized by the plan; a trainer writes the changed bytes of its writes there
     * as records (struct wb_delta_rec) when TRANSFER says so. delta_slabs: trainers, per
     * rollout rank, its slab's offset and size in that rollout's inbox; rollouts, per trainer
     * rank, the slab's offset and size in its own (u64 little-endian pairs). */
    bool delta;
    struct wb_bytes delta_slabs;
    /* Synthetic trainers: the source changes 1 / change_period of the elements per version
     * (wb_synth_fill_change; 0: all of them). */
    uint64_t change_period;
};

/* A delta record as a trainer writes it into its slab of a rollout's delta inbox, records back
 * to back (8-byte aligned) from the slab's start: the write it stands for (bytes [dst_off,
 * dst_off + len) of rollout tensor `tensor`), then n u32 offsets within the write, ascending,
 * then the n byte values there, padded to 8. The rollout reads the records of this attempt
 * (epoch) from the slab's start up to the first that is not, once every write it counts is in,
 * and stores the values before it checks or commits anything. */
struct wb_delta_rec {
    uint64_t epoch; /* TRANSFER.epoch */
    uint64_t dst_off, len;
    uint32_t tensor; /* the rollout tensor (inventory index) */
    uint32_t n;      /* bytes changed */
};

/* A checksum record as it lands in a rollout's sum inbox (little-endian on the wire, as every
 * host weightbridge runs on). It names its attempt and version and carries a MAC under the
 * attempt's key (wb_siphash over every field before it): a record of another attempt, or one
 * made by anybody but the attempt's members, does not match. */
enum { WB_SUM_RECORD = 64 };
struct wb_sum_record {
    uint64_t dst_off, len; /* the write: bytes [dst_off, dst_off + len) of tensor `tensor` */
    uint64_t sum;          /* wb_sum64 (common.h) of those bytes at the writer */
    uint32_t trainer;      /* the writing trainer rank */
    uint32_t tensor;       /* the rollout tensor (inventory index) */
    uint64_t epoch;        /* TRANSFER.epoch of the attempt that wrote it */
    uint64_t version;
    uint64_t mac;      /* wb_siphash(TRANSFER.key, the 48 bytes above) */
    uint64_t reserved; /* 0 */
};
enum { WB_SUM_RECORD_MACED = 48 }; /* bytes of a record its MAC covers */

/* PEERS: a msgpack array of [role, rank, addr, regions] for every agent. */
struct wb_body_peers {
    uint64_t gen;
    struct wb_bytes agents;
};

struct wb_body_version {
    uint64_t version;
};

struct wb_body_version_epoch {
    uint64_t version;
    uint64_t epoch; /* the attempt: 64 random bits its notes carry (never 0) */
    /* The attempt's 128-bit MAC key (WB_MAC_KEY_BYTES): only the attempt's members learn it,
     * so only they can make notes that count (transport.h). */
    struct wb_bytes key;
    /* How long the attempt may take; a rollout closes its windows and gives the attempt up
     * past twice that even when no controller says so. 0: the agent's default. */
    uint64_t timeout_ns;
    /* A resumed attempt (TRANSFER only): per rollout rank, a msgpack array of the data tags
     * that landed in an earlier attempt of this version and are not sent again; nothing
     * (or an empty array) when everything is sent. */
    struct wb_bytes skip;
    /* Delta updates (TRANSFER only): per rollout rank one byte, 1 where the rollout holds
     * version delta_base whole and may be sent only what changed since; nothing: all full. A
     * trainer whose own record of what it sent (its shadow) is not of delta_base sends full. */
    struct wb_bytes delta;
    uint64_t delta_base;
};

struct wb_body_abort {
    uint64_t version;
    char reason[WB_ERRMSG_MAX];
};

/* One trainer's figures for one transfer (REP_SENT, and RESULT per trainer). */
struct wb_xfer_stats {
    uint64_t rank;
    uint64_t bytes, writes, tasks;
    uint64_t peak_tmp, cap;
    uint64_t stage_ns[WB_STAGE_COUNT]; /* summed busy time per stage */
    uint64_t total_ns;                 /* TRANSFER received -> last write completed */
    uint64_t mem_waits;                /* tasks that waited for memory under the cap */
    /* Delta updates: what a full update writes (bytes equals it when everything went full),
     * the bytes of delta records among bytes, and whether this trainer's shadow held the base
     * version (so it sent deltas where TRANSFER allowed them) */
    uint64_t full_bytes, delta_bytes;
    uint64_t delta_ok; /* 0 or 1 (a u64: the struct has no padding, and is compared whole) */
};

/* ================================================================ field tables */

enum wb_field_type {
    WB_FIELD_U64 = 1, /* uint64_t */
    WB_FIELD_I64,     /* int64_t */
    WB_FIELD_BOOL,    /* bool */
    WB_FIELD_STR,     /* char[size]: NUL-terminated, longer strings are an error */
    WB_FIELD_BYTES,   /* struct wb_bytes: a str or bin payload */
    WB_FIELD_OBJ,     /* struct wb_bytes: any one msgpack object, kept as its encoding */
    WB_FIELD_U64S,    /* uint64_t[size / 8]: an array of at most that many (the rest zeroed) */
};

/* One row: key, type, whether a decoder insists on it, where it lives in the body struct and
 * its size there. Encoders write every row. */
struct wb_field {
    const char *key;
    enum wb_field_type type;
    bool required;
    size_t off, size;
};

/* The table of a body type (NULL for a type without one). *n gets its row count. */
const struct wb_field *wb_msg_fields(uint32_t type, size_t *n);

/* ================================================================ encoding and decoding */

/* Writes a whole message: envelope, body map, "token" first (except for ERROR), then every
 * field of `body` (a struct of the type's table; NULL for types without fields). Check
 * wb_mpw_finish() afterwards. */
void wb_msg_encode(struct wb_mpw *w, uint32_t type, const char *token, const void *body);
/* Writes only the body map (commands, nested maps). */
void wb_body_put(struct wb_mpw *w, uint32_t type, const void *body);

/* A received message whose envelope and token were checked; its body is not decoded yet. */
struct wb_msg {
    uint32_t type;
    uint32_t nkeys;  /* body keys after the token */
    struct wb_mpr r; /* at the first of them */
};

/* Opens a message and checks its token (every type but ERROR must carry `token` as its first
 * key). Errors, with *why set: -EBADMSG "refused: not a weightbridge message",
 * -WB_E_VERSION "refused: unsupported message version", -EBADMSG "refused: message body is
 * not a map", -WB_E_TOKEN "refused: message without a cluster token" or "refused: wrong
 * cluster token". Nothing is copied: the buffer must outlive m. */
int wb_msg_open(const void *buf, size_t len, const char *token, struct wb_msg *m, const char **why);
/* Decodes an opened message's body into `body` (the struct of m->type's table). On failure
 * (-EBADMSG) why holds e.g. "REPORT_SENT: unknown field \"stat\"" or "REGISTER: missing field
 * \"rank\"" and body is untouched. */
int wb_msg_decode(const struct wb_msg *m, void *body, char *why, size_t whycap);
/* Decodes a body map at r (a command body, a nested map); r moves past it. */
int wb_body_get(struct wb_mpr *r, uint32_t type, void *body, char *why, size_t whycap);

/* The ERROR reply {code, msg}; it never carries the token. */
void wb_msg_error(struct wb_mpw *w, int code, const char *msg);

/* ---------------------------------------------------------------- commands */

/* Appends one command [seq, type, body] to w (an array being written). */
void wb_cmd_put(struct wb_mpw *w, uint64_t seq, uint32_t type, const void *body);

/* Reads the commands of a COMMANDS body one by one. */
struct wb_cmd_reader {
    struct wb_mpr r;
    uint32_t left;
};
int wb_cmd_reader_init(struct wb_cmd_reader *cr, const struct wb_bytes *cmds);
/* Agents a job waits for, named in one line (ranks.c): consecutive entries of one role and
 * state are one group, their ranks as ranges — "trainer ranks 1-3, 7 (not registered); rollout
 * rank 0 (dead)". Writes at most cap bytes (a line that does not fit ends in "..."); returns
 * the length of the whole line. */
struct wb_rank_state {
    const char *role;
    uint32_t rank;
    const char *state; /* "not registered", "dead", "left" */
};
size_t wb_ranks_text(const struct wb_rank_state *v, size_t n, char *out, size_t cap);
/* The same line for the agents of a STATUS body that are not there (states absent — said "not
 * registered" —, dead, left); returns how many, "" when none, or -EBADMSG. */
int wb_status_missing(const struct wb_body_status *st, char *out, size_t cap);

/* 1 with *seq, *type and the body map in *body (a reader for wb_body_get), 0 when none is left,
 * -EBADMSG for a malformed entry. */
int wb_cmd_next(struct wb_cmd_reader *cr, uint64_t *seq, uint32_t *type, struct wb_mpr *body);

/* ---------------------------------------------------------------- connection binding */

/* A HELLO frame (the request header included) is at most this long: a larger first frame is
 * refused from its length, before anything of it is read. */
enum { WB_HELLO_MAX = 8192 };

/* The prefix every message after HELLO carries: "WBb1", 4 zero bytes, the connection's nonce
 * and the message's sequence number (little-endian). */
enum { WB_BIND_MAGIC = 0x31624257, WB_BIND_LEN = 24 };
void wb_bind_put(uint8_t out[WB_BIND_LEN], uint64_t nonce, uint64_t seq);
/* 0 with *nonce and *seq when p starts with a binding prefix, -EBADMSG otherwise. */
int wb_bind_get(const void *p, size_t n, uint64_t *nonce, uint64_t *seq);

/* ---------------------------------------------------------------- request channel */

/* The largest message the controller accepts on an introduced connection (a larger frame is
 * closed from its length, before it is read; before HELLO the bound is WB_HELLO_MAX);
 * wb_chan_send refuses to send one (-EMSGSIZE). A registration of 100,000 tensors is about
 * 15 MiB. */
enum { WB_CTL_MAX_MSG = 64 << 20 };

/* A REQ socket to the controller used one request at a time. Non-blocking use: send, then
 * wb_chan_try_recv() until it yields the reply (fd is pollable for readability). The channel
 * introduces each connection it gets (HELLO with its token) before the first request on it and
 * sends every request behind the connection's binding prefix; a request refused because its
 * connection was replaced meanwhile (-WB_E_HELLO) is sent again after a new HELLO.
 *
 * A request lives on the connection it was sent on: when that closes (the controller
 * restarted, the connection was reset) its reply can never come, and nng does not send it
 * again (resending is ours to decide). wb_chan_lost() says so at once, so the caller sends it
 * again on the next connection instead of waiting out a timeout; wb_chan_connected() tells a
 * controller that cannot be reached from one that answers slowly. */
struct wb_chan_state;
struct wb_chan_pipes;
struct wb_chan {
    uint32_t sock; /* nng_socket id (nng.h stays out of this header) */
    int fd;        /* readable when a reply may be waiting */
    bool busy;     /* a request is outstanding */
    uint64_t sent_ns;
    struct wb_chan_state *st;    /* the token, the connection's nonce, the request in flight */
    struct wb_chan_pipes *pipes; /* counted by nng's pipe callbacks (its threads) */
    uint32_t closed_at_send;     /* connections closed so far when the request left */
};

/* Dials url (asynchronously: the dial completes in the background and is retried). token: what
 * HELLO carries (NULL or "": none, so that a controller refuses every request). */
int wb_chan_open(struct wb_chan *c, const char *url, const char *token);
void wb_chan_close(struct wb_chan *c);
/* Sends w's bytes as the request; a request still outstanding is abandoned. */
int wb_chan_send(struct wb_chan *c, const struct wb_mpw *w);
/* The reply, if one has arrived: 1 with *buf (free with wb_chan_free) and *len, 0 when none
 * yet, negative on error. */
int wb_chan_try_recv(struct wb_chan *c, void **buf, size_t *len);
/* A connection to the controller is up (it may still be slow to answer). */
bool wb_chan_connected(const struct wb_chan *c);
/* The outstanding request may be lost: a connection closed since it was sent. */
bool wb_chan_lost(const struct wb_chan *c);
/* Blocking round trip with a time limit: -ETIMEDOUT when no reply came within timeout_ns. */
int wb_chan_call(struct wb_chan *c, const struct wb_mpw *w, uint64_t timeout_ns, void **buf,
                 size_t *len);
void wb_chan_free(void *buf);

#ifdef __cplusplus
}
#endif

#endif /* WB_PROTO_H */
