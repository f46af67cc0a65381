/* xfer.h — private to agent/: the data side. struct data is the attempt (version, epoch, key,
 * transport) and the trainer's side (table, shards, arenas, inboxes, barriers, checksums,
 * executor), shared by data.c (setup, registration, peers, the attempt's lifecycle), exec.c
 * (the trainer's pipelined executor) and ops.c (the routing-table ops on host or GPU memory).
 * The pieces with one owner hang off it by an opaque pointer and are reached through their
 * file's calls: rollout.c (a rollout's receive side), fill.c (the synthetic fill), direct.c
 * (the direct path). gpu.cu / gpu_nocuda.c: streams and events; mem.c: registered buffers.
 *
 * Memory a trainer registers with the transport (one registration each, so the hot path never
 * registers): the PARAM arena (every shard it holds, SRC), the TMP arena (the executor's
 * temporary memory, exactly the memory cap, SRC: writes and gathers read from it), the gather
 * inbox (DST: mesh peers write their shards into it), the amax inbox (DST) and the amax outbox
 * (SRC). A rollout registers each local tensor (DST) and publishes one descriptor per tensor,
 * so the transport checks every write against the bounds of the tensor it lands in.
 *
 * Immediates are 32-bit tags: kind (3 bits) | tag (29 bits: the planner's tag, a gather slot,
 * a phase, or a rollout rank). They travel in the transport's notes, which carry the attempt's
 * epoch and MAC (transport.h), so a note of an aborted attempt, a former member's or a
 * stranger's never counts toward the one in flight.
 *
 * An attempt, at every member: TRANSFER brings its epoch, key, version and deadline; the agent
 * begins it on its transport (every counter of the one before forgotten), arms every counter it
 * will need and opens the windows of its destination regions. A rollout then tells each
 * trainer that writes to it "ready" (an IMM_READY note): a trainer posts nothing to a rollout,
 * and stores nothing into its memory, before that rollout's note arrived, so no write reaches
 * a region whose window is closed, and no byte lands before the rollout knows it may be torn.
 * Windows close again as soon as what was planned for them is in (a rollout tensor once its
 * writes counted), when the attempt ends, or at its deadline. */
#ifndef WB_AGENT_XFER_H
#define WB_AGENT_XFER_H

#include "agent/gpu.h"
#include "agent/priv.h"
#include "quant/quant.h"
#include "route/route.h"
#include "transport/transport.h"

#include <stdatomic.h>

enum imm_kind { IMM_DATA = 0, IMM_AMAX, IMM_GATHER, IMM_BARRIER, IMM_READY };
enum { IMM_TAG_BITS = 29 };
/* A checksum record (SETUP.verify) goes with IMM_DATA and its data tag with this bit set:
 * data tags (rollout tensor index + 1, at most 2^19 tensors) stay below it. */
enum { IMM_SUM_BIT = 1u << 21 };
/* data.rout: a rollout rank in the attempt, out of it, or lost (see there) */
enum { ROUT_IN = 0, ROUT_OUT, ROUT_LOST };

static inline uint32_t imm_make(enum imm_kind k, uint32_t tag)
{
    return ((uint32_t)k << IMM_TAG_BITS) | (tag & ((1u << IMM_TAG_BITS) - 1));
}

static inline enum imm_kind imm_kind_of(uint32_t imm)
{
    return (enum imm_kind)(imm >> IMM_TAG_BITS);
}

static inline uint32_t imm_tag_of(uint32_t imm)
{
    return imm & ((1u << IMM_TAG_BITS) - 1);
}

/* ---------------------------------------------------------------- state */

/* A trainer shard: where its bytes are, and the registration writes read it through. The
 * synthetic source keeps every shard in one arena; a registering endpoint's shards are the
 * process's own tensors, registered by the allocations they lie in. */
struct shard {
    uint32_t tensor; /* trainer tensor index */
    struct wb_tensor_meta meta;
    uint64_t off, bytes; /* synthetic: offset in the PARAM arena */
    int32_t src_index;   /* a sourced trainer: the registration H2D ops read through, else -1 */
    uint8_t *ptr;        /* its first byte */
    struct wb_tx_mr *mr; /* NULL where nothing writes from it (host-resident: H2D only) */
    uint64_t mr_off;     /* ptr's offset in mr */
};

/* A rollout's local tensor: its own allocation (synthetic) or the engine's memory. */
struct local {
    struct wb_rt_local desc;
    void *buf;
    struct wb_tx_mr *mr; /* its own registration: exactly its bytes (none when it has none) */
    bool owned;
    struct wb_tx_rdesc rd; /* what peers write through: the tensor's bounded view */
};

/* A synthetic rollout's tensor memory carried over a re-setup (its weights are kept). */
struct kept {
    uint32_t tensor;
    uint64_t bytes;
    void *buf; /* NULL once taken */
};

/* A gather section of a trainer's inbox: the gathers of one mesh, laid out slot after slot. */
struct gsec {
    uint32_t mesh;
    uint64_t off;
    uint32_t tag;
    uint32_t phase; /* local only: the mesh's phase (not published) */
};

/* What a trainer knows about another agent. */
struct peer {
    bool present;
    uint32_t idx; /* transport peer index */
    uint8_t *addr;
    size_t addr_len;
    /* trainers */
    bool has_inbox, has_amax;
    struct wb_tx_rdesc inbox, amaxbox;
    uint32_t nsec;
    struct gsec *sec;
    /* rollouts: descriptor per rollout tensor (index into the rollout inventory), and the
     * checksum inbox when the job verifies */
    uint32_t nreg;
    uint32_t *reg_tensor;
    struct wb_tx_rdesc *reg;
    bool has_sums;
    struct wb_tx_rdesc sums;
    bool has_delta; /* its delta inbox (a delta job) */
    struct wb_tx_rdesc delta;
};

/* The ctx of notes no task has (warm-up, fences): their completions count for nothing. */
static const uint64_t WARMUP_CTX = UINT64_MAX;
/* A rollout's READY to its writer i has ctx READY_CTX | i: a READY that could not be sent
 * fails the attempt at once (that trainer will never write), instead of at its deadline. */
static const uint64_t READY_CTX = 0xfffffffe00000000ull;

/* A relaying rollout's notes, checksum records and fences to child j have ctx RELAY_CTX |
 * attempt << 24 | j, and its READY to its parent relay RELAY_CTX | RELAY_PARENT: their
 * completions are the relay's (relay.c). */
static const uint64_t RELAY_CTX = 0xfffffffd00000000ull;
enum { RELAY_PARENT = 0xffffffu };
/* A relay's forward of a range has ctx RELAY_FWD_CTX | attempt << 24 | k: its k-th forward of
 * the attempt (relay.c keeps which child and which entry). */
static const uint64_t RELAY_FWD_CTX = 0xfffffffc00000000ull;

/* The rollout-region entry that describes a rollout's checksum inbox instead of a tensor. */
enum { SUM_INBOX_ENTRY = 0xffffffffu };
/* ... and those that describe its delta inbox's slabs (delta.c), one per writing trainer: this
 * plus the trainer's rank (the controller hands each trainer its own alone). */
static const uint64_t DELTA_SLAB_ENTRY = 1ull << 40;

/* ---------------------------------------------------------------- sourced reads (io.c) */

enum { AG_IO_IDLE = 0, AG_IO_QUEUED, AG_IO_DONE };

/* One read of a registration's bytes into host memory; owned by the task that waits for it. */
struct ag_io_req {
    uint32_t index; /* registration */
    uint64_t off, len;
    void *dst;
    int rc;
    int state; /* AG_IO_*, read with ag_io_done() */
    char msg[256];
    struct ag_io_req *next;
};

struct ag_io;
int ag_io_open(const struct wb_endpoint_source *src, struct ag_io **out);
/* Queues r (its index, off, len, dst set). */
void ag_io_submit(struct ag_io *io, struct ag_io_req *r);
/* The request finished: r->rc (0 or negative, r->msg the reason) and dst's bytes are valid. */
bool ag_io_done(const struct ag_io_req *r);
/* Drops every queued request (they finish with -ECANCELED); running ones complete. */
void ag_io_cancel(struct ag_io *io);
/* Requests queued or running: TMP memory they write into must not be reused before 0. */
uint32_t ag_io_busy(struct ag_io *io);
/* Cancels what is queued, waits for what runs, stops the threads. NULL is a no-op. */
void ag_io_close(struct ag_io *io);

/* Per GATHER op of the table: its place in the inbox layout. */
struct gref {
    uint32_t slot;       /* ordinal among the mesh's gathers (phase, seq order) */
    uint64_t slot_off;   /* within the mesh section */
    uint64_t full_bytes; /* the slot's size */
    uint64_t moff0;      /* d->moff[moff0 + j]: member j's (table.peers order) offset in the slot */
};

enum { SPAN_MAX = 1 << 16 };

struct span {
    uint8_t stage;
    uint32_t task;
    uint64_t t0, t1;
};

struct task;

/* direct.c: the direct path. ag_dst_fn gives the address of a write's destination bytes (its
 * dst_off included) when this process can store there itself, else NULL. */
typedef uint8_t *(*ag_dst_fn)(void *arg, const struct wb_rt_write *w);
struct ag_direct_plan {
    uint8_t *is_direct; /* [ntasks] */
    uint32_t ntasks;    /* how many are */
    uint64_t bytes;     /* what their writes move */
    struct wb_quant_item *q;
    size_t nq;
    struct wb_copy_item *c;
    size_t nc;
};

/* A trainer's exchanges with its mesh peers, laid out by data.c's setup and stepped by exec.c:
 * the gather inbox and its sections, the amax inbox and outbox, and the phases' barriers. */
struct mesh_exchange {
    void *inbox;
    uint64_t inbox_bytes;
    struct wb_tx_mr *inbox_mr;
    uint32_t nsec;
    struct gsec *sec;
    struct gref *gref; /* [table.nops], only GATHER entries used */
    uint64_t *moff;    /* members' offsets within their slots (struct gref) */
    void *amax_in, *amax_out;
    uint64_t amax_in_bytes, amax_out_bytes;
    uint64_t *amax_out_off; /* [table.nops] */
    struct wb_tx_mr *amax_in_mr, *amax_out_mr;
    uint32_t max_amax_tag;
    uint8_t *amax_arrived; /* [max_amax_tag + 1] */
    uint8_t *gather_ready; /* [table.nops]: the slot's peers all arrived */
    uint8_t *barrier_done; /* [nphases]: 1 all arrived, 2 its span recorded */
    uint64_t *barrier_t0;  /* [nphases]: when this rank issued it */
    uint32_t *gx_total;    /* [nphases]: GATHER/AMAX ops of the phase */
    uint32_t *gx_done;     /* [nphases] */
    bool *barrier_issued;  /* [nphases] */
};

/* A trainer's checksums (SETUP.verify), laid out by data.c's setup and written by exec.c: every
 * write to a rollout is recorded (sum_out, one WB_SUM_RECORD slot per table write) into the
 * rollout's sum inbox at slot[write]. */
struct trainer_sums {
    uint32_t *slot;
    void *sum_out;
    struct wb_tx_mr *sum_out_mr;
    uint64_t *whash; /* [table.nwrites]: the wb_sum64 of each write posted */
    /* [table.nwrites]: the write whose sum a write takes (itself, or an earlier replica of the
     * same source in its task), and a write hashed on the GPU: its piece in its task's batch
     * (UINT32_MAX: hashed on the host) */
    uint32_t *wsame, *wpiece;
    struct wb_sum_piece *spiece;  /* [max_task_writes]: a task's batch being launched */
    struct wb_sum_record *srec;   /* GPU: [table.nwrites], pinned: records on their way out */
    struct wb_sum_gpu **sum_free; /* GPU batches not in use (a task holds one in flight) */
    size_t nsum_free, cap_sum_free;
};

/* A trainer's resumed attempt (TRANSFER.skip, set by data.c, used by exec.c): table writes not
 * sent again (their rollout tensor landed earlier), tasks skipped whole, bytes per task, and
 * the attempt's progress (heartbeats carry it). */
struct resume {
    uint8_t *wskip;
    uint8_t *tskip;
    uint64_t *task_bytes;
    uint64_t done_bytes, total_bytes;
};

struct data {
    enum wb_role role;
    uint32_t rank;
    int device; /* CUDA device, -1 = host memory */
    bool gpu;
    struct wb_endpoint *ep;
    const struct wb_endpoint_opts *o;
    bool synthetic;
    struct agent_job job;
    bool empty; /* no plan: nothing to move */
    bool active, pending_start, last_ok;
    /* the attempt: TRANSFER's version and epoch (the loop's loop_versions.attempt once it
     * started), when it started */
    uint64_t version, epoch, start_ns, end_ns;
    uint8_t key[WB_MAC_KEY_BYTES]; /* the attempt's (TRANSFER.key) */
    uint64_t deadline_ns;          /* rollouts: windows close and the attempt fails here */
    uint8_t attempt;               /* counts attempts: a write's ctx names its own */
    bool draining;                 /* trainers: an attempt ended; its writes still complete */
    struct ag_fill *fill; /* synthetic trainers: the source's values in the shards (fill.c) */
    char fail[512];
    /* transport */
    struct wb_tx *tx;
    struct wb_tx_caps caps;
    struct wb_mpw addr_blob, region_blob;
    void *stream;     /* the executor's kernels and copies */
    void *h2d_stream; /* host-to-device copies, so they run ahead of the kernels */
    void *sum_stream; /* verify: checksum records to the outbox, queued behind nothing else */
    /* trainer */
    struct wb_route_table table;
    bool have_table;
    struct shard *shards;
    uint32_t nshards;
    uint32_t *shard_of; /* trainer tensor -> shard index + 1 (0: not held) */
    /* a registering trainer: the registration of each of the endpoint's allocations (its
     * segments, regs.c) that a shard is written from, NULL until one is */
    struct wb_tx_mr **seg_mr;
    const struct wb_endpoint_source *source; /* a sourced trainer's (NULL: none) */
    uint32_t ntensors;
    void *param;
    uint64_t param_bytes;
    bool param_host; /* host-resident parameters (H2D ops read them) */
    void *param_host_buf;
    struct wb_tx_mr *param_mr;
    void *tmp;
    uint64_t tmp_size;
    struct wb_tx_mr *tmp_mr;
    struct mesh_exchange mx;
    void *scratch[2], *hscratch; /* ops' pack/cast space (device or host), host space */
    uint64_t scratch_bytes;
    struct peer *tpeer; /* [ntrainers] */
    struct peer *rpeer; /* [nrollouts] */
    /* trainers: [nrollouts] 1 once the rollout said its windows are open (IMM_READY), 2 for
     * a rollout this table never writes; how many of those written are still not ready */
    uint8_t *rready;
    uint32_t rready_left;
    /* trainers, relayed attempts (TRANSFER.relay): [nrollouts] 1 for a rollout another replica
     * writes in this attempt (this table's writes to it are skipped, its READY not awaited);
     * no_direct: the job relays, so no write bypasses the skips (the direct path is off) */
    uint8_t *rrelay;
    bool relaying; /* this attempt relays: writes to rollouts announce their pieces */
    bool no_direct;
    /* trainers: [nrollouts] per rollout rank, for the attempt in flight: ROUT_OUT when its
     * replica is no member of the attempt or was dropped from it (DROP): nothing is written to
     * it; ROUT_LOST when a write to it failed and the controller has not dropped it yet: the
     * attempt's report waits for that DROP (or the abort), it does not fail. */
    uint8_t *rout;
    bool direct_off; /* a rollout was out when the attempt started: no direct path in it */
    /* executor */
    struct task *tasks;
    uint32_t next_task, tasks_done;
    uint64_t tmp_used, peak_tmp, cap;
    uint64_t outstanding; /* writes posted and not completed, all epochs */
    uint64_t next_start_ns;
    struct ag_direct *direct; /* the direct path (direct.c): built at the first transfer after
                                 PEERS (NULL: not yet) */
    struct wb_xfer_stats stats;
    struct span *spans;
    uint32_t nspans;
    /* traces (trace.c; NULL: off): the trace, and each task's label */
    struct ag_trace *trace;
    uint32_t *task_label; /* [table.ntasks] */
    uint32_t label_barrier, label_direct;
    uint64_t hook_t0, hook_t1; /* rollouts: the engine's post-update hook ran (0: it did not) */
    /* a sourced trainer (wb_endpoint_set_source): its reads, and for a GPU endpoint the pinned
     * host mirror of TMP they land in before the copy to the GPU (also where written bytes are
     * copied back to be hashed) */
    struct ag_io *io;
    uint8_t *stage;
    bool verify; /* checksums (SETUP.verify): every write to a rollout is checked there */
    struct trainer_sums sums;
    uint32_t max_task_writes;
    uint64_t *akeys; /* [max_task_writes]: a direct task's (rollout, tag) pairs, to batch notes */
    struct resume resume;
    /* rollout: its receive side (rollout.c) */
    struct rollout *rx;
    /* delta updates (delta.c; NULL: the job has none): a trainer's shadow and outbox, a
     * rollout's delta inbox */
    struct ag_delta *delta;
};

/* The memory kind of this agent's buffers (its device's, or host memory). */
static inline enum wb_tx_mem ag_mem_kind(const struct data *d)
{
    return d->gpu ? WB_TX_MEM_CUDA : WB_TX_MEM_HOST;
}

/* mem.c: allocates n bytes of ag_mem_kind(d) (zeroed in host memory) and, unless mr is NULL,
 * registers them with access; err names `what`. On failure nothing is left allocated. */
int ag_reg_alloc(struct data *d, uint64_t n, unsigned access, void **buf, struct wb_tx_mr **mr,
                 const char *what, char *err, size_t errcap);

/* rollout.c: a rollout's receive side (struct rollout, d->rx). */
/* What a re-setup carries from the old setup to the new: a synthetic rollout's tensors (the
 * new setup takes those it holds again, same tensor and size, so the weights stay) and the
 * tags that landed of a failed version (a resumed attempt is not sent them again). */
struct rollout_carry {
    struct kept *kept;
    uint32_t nkept, taken;
    enum wb_tx_mem kind;
    int device;
    uint64_t *tags;
    uint32_t ntags;
    uint64_t landed_version;
};
/* Takes what old (any role, or NULL) has to carry; its tensors are then the carry's. */
void ag_rollout_carry_out(struct data *old, struct rollout_carry *c);
/* Decodes the receive list, takes the carried tensors it can, allocates or binds the rest
 * (names: the engine's tensor names, a registering endpoint) and writes the regions blob. */
int ag_rollout_setup(struct data *d, const void *plan, size_t plan_len,
                     const struct wb_bytes *names, struct rollout_carry *c, char *err,
                     size_t errcap);
/* After a setup (rc its outcome; d NULL when none was made): frees what was carried and not
 * taken, restores what landed where the memory stayed the same, and says in *lost why a
 * re-setup left the rank without the version it held (NULL: it did not). */
void ag_rollout_carry_end(struct data *d, int rc, bool resetup, struct rollout_carry *c,
                          const char **lost);
void ag_rollout_free(struct data *d);
int ag_rollout_peers(struct data *d, struct wb_mpr *r, uint32_t n, char *err, size_t errcap);
/* Arms the attempt's counters (skip: this rank's tags not sent again, sorted), opens the
 * windows and tells every writer "ready" — in a relayed attempt (relay: TRANSFER.relay) the
 * parent relay instead of the trainers, when it has one — and arms its children's READY. */
int ag_rollout_start(struct data *d, uint64_t version, const uint64_t *skip, uint32_t nskip,
                     const struct wb_bytes *relay, char *err, size_t errcap);
/* The attempt is over: nothing more may land, nothing more counts. */
void ag_rollout_close(struct data *d);
/* A completion of the rollout's own notes: a READY that failed fails the attempt. */
void ag_rollout_event(struct data *d, const struct wb_tx_event *ev);
/* Checks and marks landed what is in (d->fail says what failed). */
void ag_rollout_step(struct data *d);
bool ag_rollout_complete(const struct data *d);
bool ag_rollout_windows_open(const struct data *d);
uint64_t ag_rollout_rx_bytes(const struct data *d);
void ag_rollout_size(const struct data *d, uint32_t *nlocal, uint64_t *bytes);
/* Adds what the attempt may count (its counters, their notes) to *tags and *notes. */
void ag_rollout_bounds(const struct data *d, uint64_t *tags, uint64_t *notes);
/* Traces (d->trace set): the attempt just finished here, what each writer's notes brought is
 * taken from the transport before it ends; then, once the report left, its events go to the
 * trace. */
void ag_rollout_trace_snap(struct data *d);
void ag_rollout_trace(struct data *d);

/* Parses TRANSFER.relay, [gpus per replica, [[children of replica 0], ...]]: the replica
 * count, per replica its parent (UINT32_MAX: a root, written by the trainers), the ranks
 * per replica. 0 with *replicas 0 when it is absent (no relay); -EBADMSG. parent is
 * malloc'd (free it). */
int ag_relay_parse(const struct wb_bytes *b, uint32_t *replicas, uint32_t *per, uint32_t **parent);

/* relay.c: a rollout forwarding what it received to the same local rank of its child
 * replicas (struct relay, d->rx's). */
struct relay;
/* PEERS: a relay neighbour (a rollout of another replica) and its regions. */
int ag_relay_peer(struct data *d, uint64_t rank, struct wb_mpr *addr, struct wb_mpr *regions,
                  char *err, size_t errcap);
/* The attempt's part for this rollout (TRANSFER.relay, its bytes): its parent relay (the one
 * writer it tells READY, instead of the trainers) and its children, whose READY is awaited.
 * *parent_peer: the transport index of the parent, UINT32_MAX when the trainers write it. */
int ag_relay_start(struct data *d, const struct wb_bytes *relay, uint32_t *parent_peer, char *err,
                   size_t errcap);
/* Expect entry i landed (and was checked): forwarded to every child as soon as it is ready. */
void ag_relay_landed(struct data *d, uint32_t i);
/* Posts what can go to the children that said READY. */
void ag_relay_step(struct data *d);
/* The ctx of the READY a rollout sends its parent relay. */
void *ag_relay_parent_ctx(struct data *d);
/* A new PEERS: the relay neighbours of the last one are forgotten. */
void ag_relay_forget_peers(struct data *d);
/* Every child has everything forwarded and fenced (or failed): the attempt may end here. */
bool ag_relay_done(const struct data *d);
/* A completion of a relay write or fence (ctx RELAY_CTX | j). */
void ag_relay_event(struct data *d, const struct wb_tx_event *ev);
/* What the attempt may count for the relay (children's READY). */
void ag_relay_bounds(const struct data *d, uint64_t *tags, uint64_t *notes);
/* The attempt ended: nothing more is forwarded (writes posted still complete). */
void ag_relay_stop(struct data *d);
void ag_relay_free(struct relay *r);
/* Parses a rollout's regions blob (PEERS) into p (data.c); rank: the reader's trainer rank,
 * whose delta slab it takes (UINT32_MAX: none, as for a relay neighbour). */
int ag_peer_rollout_regions(struct peer *p, struct wb_mpr *r, uint32_t rank);
void ag_peer_clear(struct peer *p);
/* delta.c: delta updates (the file says how and when they are exact). */
struct ag_delta;
/* SETUP of a delta job: d->delta, with the slabs kept for the role's setup (nothing when the
 * job has no delta updates). */
int ag_delta_setup(struct data *d, const struct wb_body_setup *b, char *err, size_t errcap);
/* Frees d->delta (after the transport closed: it holds registrations). */
void ag_delta_free(struct data *d);
/* Trainers, once the table is decoded and the transport open: the shadow's slots, the shadow
 * and the registered outbox. */
int ag_delta_trainer_setup(struct data *d, char *err, size_t errcap);
/* Trainers, at TRANSFER: which rollouts may get deltas, and whether the shadow holds the base. */
int ag_delta_start(struct data *d, const struct wb_body_version_epoch *b, char *err, size_t errcap);
/* Table write k (not skipped), about to be posted from src to rollout peer p as w: updates the
 * shadow of its source and, where the write goes as a delta, rewrites w to carry the record
 * into the rollout's delta inbox (1). 0: send it whole, as w says. */
int ag_delta_write(struct data *d, uint32_t k, const uint8_t *src, const struct peer *p,
                   struct wb_tx_write *w);
/* Trainers, the attempt ended here (ok: every write of it completed): the shadow's version. */
void ag_delta_end(struct data *d, bool ok);
/* This attempt allows rollout g a delta (TRANSFER.delta), against *base (TRANSFER.delta_base). */
bool ag_delta_allowed(const struct data *d, uint32_t g, uint64_t *base);
/* Rollouts: entries the regions blob gets (0 or 1); the inbox allocated, registered (window
 * closed) and published; its window; the records of this attempt stored into the tensors,
 * once every write is in (0, or negative with d->fail set). */
uint32_t ag_delta_regions(const struct data *d);
/* PEERS: writer trainer `rank` writes the rollout tensors of the msgpack array (len bytes; a
 * record of its may name those alone). Nothing to do outside a delta job. */
int ag_delta_writer(struct data *d, uint32_t rank, const void *list, size_t len);
int ag_delta_rollout_setup(struct data *d, struct wb_mpw *w, char *err, size_t errcap);
void ag_delta_window(struct data *d, bool open);
int ag_delta_apply(struct data *d, const struct local *locals, uint32_t nlocal,
                   const uint32_t *writer_rank, uint32_t nwriters);

/* fill.c: the synthetic source's values in a synthetic trainer's shards, one fill at a time. */
struct ag_fill;
struct ag_fill_src {
    const struct shard *shards;
    uint32_t nshards;
    uint64_t seed;
    uint8_t *host; /* the host arena the shards' offsets are in, NULL: shards on the GPU */
    void *stream;  /* GPU: where the kernels run */
    int device;
    uint64_t change_period; /* wb_synth_fill_change's (0: every element changes) */
};
int ag_fill_new(const struct ag_fill_src *src, struct ag_fill **out);
/* Starts version's fill (none may be under way); 0 or negative (err says why). */
int ag_fill_begin(struct ag_fill *f, uint64_t version, char *err, size_t errcap);
/* 1 when no fill is under way (the one that was has ended), 0 while one runs, negative when
 * it failed (err says why). */
int ag_fill_poll(struct ag_fill *f, char *err, size_t errcap);
/* The version the shards hold (0: none), the one under way (0: none), and when it began. */
uint64_t ag_fill_have(const struct ag_fill *f);
uint64_t ag_fill_want(const struct ag_fill *f);
uint64_t ag_fill_t0(const struct ag_fill *f);
/* Waits for a fill under way (close, re-setup). NULL is a no-op. */
void ag_fill_free(struct ag_fill *f);

/* exec.c */
int ag_exec_setup(struct data *d, char *err, size_t errcap);
void ag_exec_free(struct data *d);
int ag_exec_start(struct data *d);
/* 1: finished (ok or failed: d->fail), 0: running. */
int ag_exec_step(struct data *d);
void ag_exec_event(struct data *d, const struct wb_tx_event *ev);
void ag_exec_imm(struct data *d, uint32_t imm);
/* Arms every counter of this trainer's attempt (the transport's attempt has begun) and forgets
 * what the last one counted. 0 or negative (d->fail says). */
int ag_exec_arm(struct data *d);
void ag_exec_abort(struct data *d);

/* trace.c: the agent's Chrome traces, a file per version (<role><rank>.v<version>.json) in its
 * trace directory, the newest `keep` kept; formatted and written by a thread of their own. */
enum {
    AG_TRACE_NAMES = 4,            /* tensor names one event lists at most */
    AG_TRACE_KEEP_DEFAULT = 8,     /* versions kept when the job does not say */
    AG_TRACE_ROLLOUT_PID = 100000, /* a rollout's trace process id: this + rank (trainers: rank) */
};
static const uint32_t AG_TRACE_NONE = UINT32_MAX; /* no label (out of memory) */
struct ag_trace;
/* What an event says besides its time: the name on the slice (NULL: the first tensor's name,
 * with " +N" for the N more it moves), the tensors it moves (n <= AG_TRACE_NAMES names given,
 * total in all) and more JSON members for its args ("\"bytes\":4096"), or NULL. */
struct ag_trace_label_in {
    const char *name;
    const char *const *tensors;
    uint32_t n, total;
    const char *args;
};
struct ag_tev {
    uint64_t t0, t1; /* wb_now_ns(); an instant's t1 is unused */
    uint32_t tid;    /* its track (ag_trace_track) */
    uint32_t label;
    int32_t task; /* the routing table's task, -1: none */
    bool instant;
};
/* *out NULL (traces off, nothing to free) when dir is NULL or empty, or — said in a warning
 * naming it — not a directory this process can write into. keep: versions kept (0: the
 * default). -ENOMEM. */
int ag_trace_new(const char *dir, uint32_t keep, const char *job, enum wb_role role, uint32_t rank,
                 struct ag_trace **out);
/* Waits for a file being written, frees. NULL is a no-op. */
void ag_trace_free(struct ag_trace *t);
/* The setup's tracks and labels (each call waits for a file being written; NULL t: nothing). */
void ag_trace_track(struct ag_trace *t, uint32_t tid, const char *name, const char *cat);
/* A label of the setup, or (per_version) of the version begun; AG_TRACE_NONE without memory. */
uint32_t ag_trace_label(struct ag_trace *t, bool per_version, const struct ag_trace_label_in *in);
/* A version's events, once it ended here: begin, labels and events, end (the file is written
 * and the directory pruned on the writer thread). NULL t: nothing. */
void ag_trace_begin(struct ag_trace *t, uint64_t version, uint64_t epoch);
void ag_trace_add(struct ag_trace *t, const struct ag_tev *e);
void ag_trace_end(struct ag_trace *t, bool ok, const char *why);
/* A trainer's tracks and task labels (once per setup, d->trace set), and its attempt that
 * finished, from the executor's spans. */
void ag_trace_trainer_setup(struct data *d);
void ag_trace_trainer(struct data *d);

/* direct.c */
/* Lowers every task that qualifies (direct.c says which) into quantization tiles and copies.
 * shard_ptr[tensor]: the first byte of the PARAM shard of trainer tensor `tensor` (NULL where
 * not held or not addressable by kernels). 0 or -ENOMEM. */
int ag_direct_lower(const struct wb_route_table *t, uint8_t *const *shard_ptr, uint32_t ntensors,
                    ag_dst_fn dst, void *arg, struct ag_direct_plan *out);
void ag_direct_plan_free(struct ag_direct_plan *p);
/* Lowers this trainer's table once its peers are known (GPU shards only; WB_DIRECT=0 in the
 * environment turns the path off, for comparisons) and prepares the batch. */
int ag_direct_prepare(struct data *d);
void ag_direct_release(struct data *d);
/* Task ti runs on the direct path (its batch exists and holds it). */
bool ag_direct_has(const struct data *d, uint32_t ti);
/* Launches the batch once per attempt (nothing when there is none or it was launched): 0 or
 * negative. */
int ag_direct_launch(struct data *d);
/* 1 when the launched batch finished just now (*t0: when it was launched), 0 when nothing
 * changed, negative when its kernels failed. */
int ag_direct_poll(struct data *d, uint64_t *t0);
/* The batch finished in this attempt: its tasks announce their writes. */
bool ag_direct_done(const struct data *d);
/* Forgets the attempt's launch (a new attempt, an abort). */
void ag_direct_reset(struct data *d);
/* Delta jobs: the batch ran in this attempt storing changes only (its writes' bytes are then
 * what it stored, counted when it finished, not what the writes span). */
bool ag_direct_sent_delta(const struct data *d);
/* The attempt ended (ok: well here): the shadows hold this version, or none. */
void ag_direct_end(struct data *d, bool ok);

/* ops.c: one routing-table op, or part of one; see exec.c for the stepping. */
struct opctx {
    struct data *d;
    struct task *t;
    uint8_t *tmp; /* the task's TMP base */
};
void *ag_ops_view_ptr(const struct opctx *c, const struct wb_rt_view *v);
int ag_ops_copy(const struct opctx *c, const struct wb_rt_op *op);
int ag_ops_quant(const struct opctx *c, const struct wb_rt_op *op);
int ag_ops_permute(const struct opctx *c, const struct wb_rt_op *op);
/* AMAX: partial amax of every block op's region touches (FP32, the region's block grid), into
 * host_part; on a GPU into dev_part, enqueued on the stream, and copied to host_part too unless
 * it is NULL (the caller reads it after an event). */
int ag_ops_amax_partial(const struct opctx *c, const struct wb_rt_op *op, float *dev_part,
                        float *host_part);
/* The partial arranged over the op's blocks into `blocks` (zero where the region has none),
 * and a peer's blocks array max-merged into the TMP amax grid (NaN wins): host memory, or on a
 * GPU device memory by a kernel on the stream. */
int ag_ops_amax_blocks(const struct opctx *c, const struct wb_rt_op *op, const float *part,
                       float *blocks);
int ag_ops_amax_into_grid(const struct opctx *c, const struct wb_rt_op *op, const float *peer,
                          float *grid);
uint64_t ag_ops_amax_bytes(const struct wb_route_table *t, const struct wb_rt_op *op);
int ag_ops_unpack_member(const struct opctx *c, const struct wb_rt_op *op, uint32_t member,
                         const void *packed);
uint64_t ag_ops_scratch_need(const struct wb_route_table *t);

#endif /* WB_AGENT_XFER_H */
