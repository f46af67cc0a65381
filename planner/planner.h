/* planner.h — the one public header of planner/: cluster layouts, the plan (one routing table
 * per trainer GPU and one receive list per rollout GPU), its wire/JSON forms, and the estimate.
 *
 * The planner runs once per job (and again when membership changes). It takes the matcher's
 * mappings (matcher/matcher.h) and the two cluster layouts, and decides for every byte of every
 * rollout tensor which trainer GPU writes it, from which buffer, after which local operations.
 * An update is then pure execution of the tables: no metadata exchange on the hot path.
 *
 * Vocabulary
 *  - trainer tensor / rollout tensor: global (unsharded) tensors, indexed by their position in
 *    the trainer / rollout inventory (struct wb_inventory).
 *  - shard: the box of a trainer tensor one trainer rank holds (FSDP2/DTensor rules: Shard(d)
 *    splits dim d in ceil-division chunks, the last ones short or empty; Replicate copies).
 *  - owners: the ranks holding a non-empty shard of a trainer tensor; the mesh of a tensor is
 *    its owner set; a mesh group is a set of meshes that share no rank; each mesh group is one
 *    phase, and phases are separated by barriers.
 *  - item: the part of one mapping whose components live on one mesh (a stacked-experts mapping
 *    spans one item per EP rank; a fused qkv is one item).
 *  - task: one routing-table entry = one item on one trainer rank: its stage ops, then writes.
 *  - mode: how a (item, rollout GPU) piece is produced. direct: each owner writes its shard's
 *    intersection (BF16->BF16, or FP8 with shard edges on 128-block edges); amax: FP8 blocks
 *    straddle owners, so owners exchange partial block amax, then each quantizes its own rows
 *    with the shared scale and writes directly; gather: mesh members all-gather the full tensor
 *    first (the reference design's full_tensor()).
 */
#ifndef WB_PLANNER_H
#define WB_PLANNER_H

#include <stdio.h>

#include "common/common.h"
#include "matcher/matcher.h"

/* ================================================================ cluster layouts */

enum { WB_MESH_MAX_DIMS = 6, WB_MESH_NAME_MAX = 16 };

/* One dimension of the trainer's device mesh. Ranks are numbered row-major over the mesh dims
 * in the order given (the first dim is the slowest, the last the fastest), so with
 * [fsdp 16, pp 2, ep 8] and 8 GPUs per node the ep dim spans a node. */
struct wb_mesh_dim {
    char name[WB_MESH_NAME_MAX];
    uint32_t size;
};

/* How one tensor class is laid out along one mesh dim. */
enum wb_place_kind {
    WB_PLACE_REPLICATE = 0, /* every coordinate holds the same data */
    WB_PLACE_SHARD,         /* DTensor Shard(dim): torch.chunk rule along `dim` */
    WB_PLACE_LAYER,         /* only the coordinate owning the tensor's layer ({layer} capture,
                               layers split into contiguous stages) holds it: pipeline stages */
    WB_PLACE_EXPERT,        /* only the coordinate owning the tensor's expert ({expert}
                               capture, experts split contiguously) holds it: expert parallel */
    WB_PLACE_INDEX,         /* only coordinate `index` holds it ("last" = size - 1) */
};

struct wb_placement {
    enum wb_place_kind kind;
    uint32_t arg; /* SHARD: tensor dim; INDEX: coordinate */
};

/* "name pattern -> placement per mesh dim". Patterns are literal text with `*` (any run of
 * characters) and the captures {layer} and {expert} (a run of digits). First match wins. */
struct wb_place_rule {
    char *pattern;
    struct wb_placement place[WB_MESH_MAX_DIMS];
    uint32_t line; /* line in the layout file, for messages */
};

enum wb_residence {
    WB_RESIDE_GPU = 0, /* parameters live in GPU memory */
    WB_RESIDE_HOST,    /* FSDP CPU offload: pinned host memory, every task starts with H2D */
};

/* The hardware model behind estimates. Rates are bytes per second; times are seconds. The
 * shipped files (configs/hw/) carry published figures and say where each comes from. */
struct wb_hw {
    char *name;
    double nic_gbps;       /* line rate of one NIC, Gbit/s */
    uint64_t nics_per_gpu; /* NICs striped by one GPU */
    double nic_efficiency; /* fraction of line rate a tuned RDMA WRITE stream reaches */
    double nvlink_Bps;     /* one GPU's NVLink bandwidth per direction, as NCCL/peer copies reach */
    double h2d_Bps;        /* pinned host -> device copy */
    double copy_Bps;       /* device -> device copy (fuse/pack/cast), bytes read per second */
    double quant_Bps;      /* FP8 block quantization, input bytes per second */
    double kernel_s;       /* launch cost of one GPU op */
    double write_submit_s; /* CPU cost to post one WRITE on one NIC */
    double barrier_s;      /* latency of one global barrier */
    double gather_s;       /* fixed cost of one collective (all-gather) call */
};

struct wb_trainer_layout {
    uint32_t world, gpus_per_node;
    uint32_t ndims;
    struct wb_mesh_dim dim[WB_MESH_MAX_DIMS];
    uint32_t pp_layers; /* layers split over a LAYER dim; 0 = max {layer} + 1 over the inventory */
    enum wb_residence residence;
    size_t nrules;
    struct wb_place_rule *rules;
    struct wb_hw hw;
    char *path; /* file it came from, for messages */
};

/* Rollout GPUs: rank = replica * gpus_per_replica + local, tp_rank = local % tp,
 * ep_rank = local % ep; the matcher's wb_mapping_local() decides each rank's boxes. */
struct wb_rollout_layout {
    uint32_t replicas, gpus_per_replica, tp, ep, gpus_per_node;
    struct wb_hw hw;
    char *path;
};

/* Load layout files (YAML, common's table-driven loader). A `hardware:` key names a hardware
 * file, resolved relative to the layout file. Every problem found is appended to el as
 * "file:line:col: key: problem"; the return is then -WB_E_CONFIG and *out is left zeroed. */
int wb_trainer_layout_load(const char *path, struct wb_trainer_layout *out, struct wb_errlist *el);
int wb_rollout_layout_load(const char *path, struct wb_rollout_layout *out, struct wb_errlist *el);
int wb_hw_load(const char *path, struct wb_hw *out, struct wb_errlist *el);
void wb_trainer_layout_free(struct wb_trainer_layout *t);
void wb_rollout_layout_free(struct wb_rollout_layout *r);
void wb_hw_free(struct wb_hw *hw);
/* Documented defaults of each file, as YAML (for --dump-config). */
void wb_layout_dump_docs(FILE *f);

/* One owner of a trainer tensor: rank and the box of the global tensor it holds. */
struct wb_owner {
    uint32_t rank;
    struct wb_box box;
};

/* The owners of trainer tensor `tensor` (ascending rank, empty shards left out). *owners is
 * malloc'd. -WB_E_PLAN with a message naming the tensor when no rule matches or the rule
 * cannot apply (EP not dividing experts, sharding a dim the tensor lacks, ...). */
int wb_trainer_owners(const struct wb_trainer_layout *tl, const struct wb_inventory *trainer,
                      uint32_t tensor, struct wb_owner **owners, uint32_t *n,
                      struct wb_errlist *el);

/* Every trainer tensor's placement, computed once (owner sets are enumerated on demand).
 * `used` (may be NULL: all) limits the tensors that must match a rule. Problems are appended
 * to el, each naming the tensor or the rule's file:line (at most 20, then a count). */
struct wb_placement_map;
int wb_placement_map_build(const struct wb_trainer_layout *tl, const struct wb_inventory *trainer,
                           const bool *used, struct wb_placement_map **out, struct wb_errlist *el);
/* Owners of one tensor, as wb_trainer_owners(). -EINVAL for a tensor the map did not place. */
int wb_placement_owners(const struct wb_placement_map *pm, uint32_t tensor,
                        struct wb_owner **owners, uint32_t *n);
void wb_placement_map_free(struct wb_placement_map *pm);

/* Layout checks that need no inventory (world size = product of mesh dims, divisibility of
 * GPUs per node, replicas x GPUs per replica, tp/ep dividing a replica ...). */
int wb_layout_check(const struct wb_trainer_layout *tl, const struct wb_rollout_layout *rl,
                    struct wb_errlist *el);

/* ================================================================ routing tables */

/* How a piece is produced. WB_MODE_AUTO is only a request: the plan records the chosen mode. */
enum wb_plan_mode { WB_MODE_AUTO = 0, WB_MODE_DIRECT, WB_MODE_AMAX, WB_MODE_GATHER };
const char *wb_plan_mode_name(enum wb_plan_mode m);
int wb_plan_mode_parse(const char *s, enum wb_plan_mode *out);

/* Where an op reads or writes. PARAM is this rank's registered local shard of trainer tensor
 * `tensor` (row-major, shape = the shard box's extents, trainer dtype; host memory when the
 * layout's residence is host, then only H2D ops read it). TMP is the task's temporary
 * allocation of task.tmp_bytes bytes, which the executor allocates under its memory cap when
 * the task starts and frees when its last write completed. */
enum wb_rt_buf_kind { WB_BUF_PARAM = 0, WB_BUF_TMP };

/* Boxes and shapes in ops are indices into the table's `boxes` and `shapes` arrays (each
 * distinct value stored once: a 1T-parameter plan has millions of ops but few distinct boxes).
 * wb_rt_box() / wb_rt_shape() below resolve them. */

/* A row-major array view: element (0,...,0) of shapes[shape] sits at byte `off` of the
 * buffer. */
struct wb_rt_view {
    enum wb_rt_buf_kind kind;
    uint32_t tensor; /* PARAM: trainer tensor index; TMP: unused (0) */
    uint64_t off;
    enum wb_dtype dtype;
    uint32_t shape; /* index into table.shapes */
};

enum wb_rt_op_kind {
    WB_OP_H2D = 1, /* copy bytes [src_off, src_off+bytes) of the PARAM (host) shard to TMP */
    WB_OP_GATHER,  /* all-gather a trainer tensor among its shard peers into a full TMP view */
    WB_OP_AMAX,    /* exchange partial block amax with one peer owner */
    WB_OP_COPY,    /* box copy, same dtype (projection fusion, packing, stacking) */
    WB_OP_CAST,    /* box copy with dtype conversion */
    WB_OP_QUANT,   /* FP8 E4M3 128x128 block quantization of a region */
};

struct wb_rt_h2d {
    uint64_t src_off; /* byte offset in the PARAM shard of op.tensor */
    uint64_t bytes;
    uint64_t dst_off; /* TMP offset */
};

/* All-gather (DTensor full_tensor()): the members are this rank and its shard peers (the
 * owners that share its Replicate coordinates), each with the box it contributes. After the
 * op, `dst` holds the whole trainer tensor. Every member of a mesh has the mesh's GATHER ops
 * in the same order (seq counts them per mesh and phase), as a collective requires. */
struct wb_rt_gather {
    struct wb_rt_view src;  /* my shard (PARAM, or TMP after H2D) */
    struct wb_rt_view dst;  /* full tensor, TMP */
    uint32_t peer0, npeers; /* members incl. me: table.peers[peer0 .. peer0+npeers) */
    uint32_t mesh;          /* plan-wide mesh index */
    uint32_t seq;           /* ordinal of this gather among its mesh's gathers in the phase */
    uint64_t bytes_in;      /* bytes this rank receives (full - own) */
};

/* Partial-amax exchange for FP8 blocks that straddle owners. Both sides carry the mirror op
 * (same tag, same blocks). The executor computes its partial amax (max |x| in FP32, 0 where it
 * holds no element of a block) over `region` (a box of the trainer tensor, tensor coordinates;
 * its data is src_box of the view `src`) for each block of `blocks` (block-grid coordinates of
 * the trainer tensor: 128x128 over the last two dims, 1 along leading dims), writes that FP32
 * array (blocks' extents, row-major) into `peer`'s amax inbox at peer_inbox_off with
 * immediate `tag`, waits for the peer's array in its own inbox at inbox_off (the peer sends
 * with the same tag), and for the blocks of `blocks` inside `grid` stores max(grid value,
 * peer's) into the task's amax grid at TMP amax_off (FP32, grid's extents, row-major; the
 * executor zeroes it when the task starts). grid is the QUANT op's grid. */
struct wb_rt_amax {
    uint32_t peer;
    uint32_t tag;
    struct wb_rt_view src;
    uint32_t src_box, region, blocks, grid; /* box indices */
    uint64_t peer_inbox_off, inbox_off;
    uint64_t amax_off;
};

/* Box copy: src_box of src goes to dst_box of dst (equal extents; a stacked destination may
 * have one more leading dim of extent 1). COPY requires equal dtypes; CAST converts. */
struct wb_rt_copy {
    struct wb_rt_view src, dst;
    uint32_t src_box, dst_box; /* box indices */
};

/* FP8 block quantization of `region` (a box of the trainer tensor op.tensor, tensor
 * coordinates; its data is src_box of the view `src`, same extents). Blocks are 128x128 over
 * the last two dims from the tensor origin (1 along leading dims); grid = the blocks region
 * touches (block coordinates). For each block: amax = max(max |x| over region ∩ block, the
 * amax grid value at TMP amax_off when amax_off != WB_RT_NONE, 1e-4); values
 * e4m3fn(float(x) * (448 / amax)) go to the view `dst` (FP8, region's extents, starting at its
 * element 0); scale_inv = amax / 448 to TMP scale_off (FP32, grid's extents, row-major). */
struct wb_rt_quant {
    struct wb_rt_view src, dst;
    uint32_t src_box, region, grid; /* box indices */
    uint64_t scale_off;
    uint64_t amax_off;
};

enum { WB_RT_NONE = -1 }; /* as uint64_t: no offset */

struct wb_rt_op {
    enum wb_rt_op_kind kind;
    uint32_t tensor; /* trainer tensor the op concerns */
    union {
        struct wb_rt_h2d h2d;
        struct wb_rt_gather gather;
        struct wb_rt_amax amax;
        struct wb_rt_copy copy; /* COPY and CAST */
        struct wb_rt_quant quant;
    };
};

/* A member of a GATHER. */
struct wb_rt_peer {
    uint32_t rank;
    uint32_t box; /* box index */
};

/* One one-sided WRITE with a 32-bit immediate. Source: src_tensor == WB_RT_TMP_SRC means TMP
 * offset src_off; otherwise the PARAM shard of trainer tensor src_tensor at byte src_off (GPU
 * residence only). Destination: rollout rank dst_rank, its local tensor dst_tensor (rollout
 * inventory index; the receive list gives its local shape and bytes), byte offset dst_off.
 * The executor checks dst_off + len against the destination region before posting. */
enum { WB_RT_TMP_SRC = -1 }; /* as uint32_t */
struct wb_rt_write {
    uint64_t src_off;
    uint64_t dst_off;
    uint64_t len;
    uint32_t src_tensor;
    uint32_t dst_rank;
    uint32_t dst_tensor;
    uint32_t tag;
};

/* One routing-table entry. Ops run in order (each may depend on the previous ones), then the
 * writes are posted (any order; completion is counted). `mesh` is the item's mesh (its owner
 * set); `group` the shard-group members share for the estimate. */
struct wb_rt_task {
    uint32_t mapping; /* index into struct wb_match */
    uint32_t item;    /* plan-wide item index */
    uint32_t phase;
    uint32_t mesh;
    enum wb_plan_mode mode; /* direct, amax or gather */
    uint64_t tmp_bytes;     /* TMP bytes the task needs from start to last write completion */
    uint32_t op0, nops;     /* table.ops[op0 .. op0+nops) */
    uint32_t write0, nwrites;
    uint64_t write_bytes;
};

/* Phases run in order. barrier_after: the executor issues a global barrier (asynchronously)
 * right after the phase's last GATHER/AMAX op, and starts the next phase's GATHER/AMAX ops only
 * once it completed; writes of a phase may overlap later phases. */
struct wb_rt_phase {
    uint32_t task0, ntasks;
    bool barrier_after;
};

/* The tags a receiver counts: the planner uses only the low `tag_bits` bits of a tag, so an
 * executor may fold a version counter into the high bits. Rollout data tags are rollout tensor
 * index + 1; amax tags are per receiving trainer, 1..n. */
struct wb_rt_expect {
    uint32_t tag;
    uint32_t tensor; /* rollout tensor (receive lists) or UINT32_MAX (amax) */
    uint64_t bytes;
    uint64_t writes;
};

/* A trainer rank's routing table. Arrays are owned by the table. */
struct wb_route_table {
    uint32_t rank, ntrainers, nrollouts;
    uint32_t tag_bits;
    enum wb_residence residence;
    uint32_t nphases;
    struct wb_rt_phase *phases;
    uint32_t ntasks;
    struct wb_rt_task *tasks; /* grouped by phase, in execution order */
    uint32_t nops;
    struct wb_rt_op *ops;
    uint32_t npeers;
    struct wb_rt_peer *peers;
    uint32_t nboxes;
    struct wb_box *boxes; /* distinct boxes referenced by ops and peers */
    uint32_t nshapes;
    struct wb_shape *shapes; /* distinct view shapes */
    uint32_t nwrites;
    struct wb_rt_write *writes;
    uint64_t amax_inbox_bytes; /* size of the registered region peers write partial amax into */
    uint32_t namax;
    struct wb_rt_expect *amax; /* what arrives in the inbox, per tag */
    uint64_t send_bytes;       /* sum of write lengths */
    uint64_t max_tmp_bytes;    /* largest task.tmp_bytes: the memory cap must be >= this */
};

static inline const struct wb_box *wb_rt_box(const struct wb_route_table *t, uint32_t i)
{
    return &t->boxes[i];
}

static inline const struct wb_shape *wb_rt_shape(const struct wb_route_table *t, uint32_t i)
{
    return &t->shapes[i];
}

/* A local tensor a rollout rank holds (allocate/register it; bounds for incoming writes). */
struct wb_rt_local {
    uint32_t tensor;
    enum wb_dtype dtype;
    struct wb_shape shape;
    uint64_t bytes;
};

/* A rollout rank's receive list: its local tensors and, per tag, the bytes and number of writes
 * that complete an update. */
struct wb_recv_list {
    uint32_t rank, replica, tp_rank, ep_rank;
    uint32_t tag_bits;
    uint32_t nlocal;
    struct wb_rt_local *local;
    uint32_t nexpect;
    struct wb_rt_expect *expect;
    uint64_t recv_bytes, recv_writes;
};

/* ================================================================ plans */

struct wb_plan_input {
    const struct wb_inventory *trainer, *rollout;
    const struct wb_match *match;
    const struct wb_trainer_layout *tl;
    const struct wb_rollout_layout *rl;
};

struct wb_plan_opts {
    enum wb_plan_mode mode; /* AUTO chooses per piece; DIRECT/GATHER force (DIRECT falls back
                               to AMAX where FP8 blocks straddle owners) */
    uint64_t mem_cap;       /* executor's temporary-memory cap, bytes; 0 = 1 GiB */
};

/* A mesh: sorted member ranks. */
struct wb_plan_mesh {
    uint32_t n;
    uint32_t *ranks;
    uint32_t phase;
};

/* Summary figures; sender/receiver arrays are indexed by rank. */
struct wb_plan_stats {
    uint64_t tensors, mappings, items, tasks, ops, writes, amax_ops, gathers;
    uint64_t pieces[4];    /* (item, rollout GPU) pieces per mode, indexed by enum wb_plan_mode */
    uint64_t total_bytes;  /* sum of all writes */
    uint64_t gather_bytes; /* sum over ranks of bytes received by GATHER ops */
    uint64_t h2d_bytes;
    uint64_t *send_bytes;      /* [ntrainers] */
    uint64_t *recv_bytes;      /* [nrollouts] */
    uint64_t *gather_in_bytes; /* [ntrainers] */
    uint64_t lower_bound;      /* no assignment can make the busiest sender send less */
    uint64_t greedy_max;       /* the reference greedy on the same pieces */
    uint64_t max_send;         /* this plan's busiest sender */
};

struct wb_plan {
    enum wb_plan_mode mode; /* as requested */
    uint64_t mem_cap;
    uint32_t ntrainers, nrollouts;
    struct wb_route_table *tables; /* [ntrainers] */
    struct wb_recv_list *recv;     /* [nrollouts] */
    uint32_t nmeshes;
    struct wb_plan_mesh *meshes;
    uint32_t nphases;
    struct wb_plan_stats stats;
};

/* Builds the plan. Every problem found (layout, ownership, infeasible split) is appended to el,
 * each naming the tensor, rank or file:line; the return is then -WB_E_PLAN (or -WB_E_CONFIG)
 * and *out is untouched. */
int wb_plan_build(const struct wb_plan_input *in, const struct wb_plan_opts *opts,
                  struct wb_plan **out, struct wb_errlist *el);
void wb_plan_free(struct wb_plan *p);

/* One line per phase, task, op and write (names from `in`, which may be NULL). */
void wb_route_table_print(const struct wb_route_table *t, const struct wb_plan_input *in, FILE *f);

/* Checks a plan against its input: every destination byte written exactly once and inside its
 * local tensor; every write's source bytes held by the writing rank (its shard, an H2D copy of
 * it, a gather, or an op output derived from those) and mapping to the same tensor elements as
 * its destination; mesh groups disjoint; gathers in the same order on every mesh member;
 * amax ops mirrored. Returns 0, or -WB_E_PLAN with the violations (at most 20) in el. */
int wb_plan_verify(const struct wb_plan *p, const struct wb_plan_input *in, struct wb_errlist *el);

/* Prints the summary (tensors, bytes, phases, entries, writes, per-sender/per-receiver
 * min/mean/max, imbalance vs lower bound and vs the reference greedy). */
void wb_plan_print_summary(const struct wb_plan *p, const struct wb_plan_input *in, FILE *f);

/* ---------------------------------------------------------------- wire and JSON */

/* Envelope types (common's versioned msgpack envelope). The body is a map whose first key is
 * "format" (WB_PLAN_FORMAT); later formats only add keys, and decoders skip unknown keys. */
enum {
    WB_MSG_ROUTE_TABLE = 0x0401,
    WB_MSG_RECV_LIST = 0x0402,
    WB_PLAN_FORMAT = 1,
};

/* Appends an envelope holding the table to w (check wb_mpw_finish()). */
void wb_route_table_encode(struct wb_mpw *w, const struct wb_route_table *t);
/* Decodes an envelope; every count and index is checked (indices within their arrays, boxes
 * within shapes, op kinds known) before it is trusted. -EBADMSG / -WB_E_VERSION / -ENOMEM. */
int wb_route_table_decode(const void *buf, size_t len, struct wb_route_table *out);
void wb_route_table_free(struct wb_route_table *t);

void wb_recv_list_encode(struct wb_mpw *w, const struct wb_recv_list *r);
int wb_recv_list_decode(const void *buf, size_t len, struct wb_recv_list *out);
void wb_recv_list_free(struct wb_recv_list *r);

/* The whole plan as JSON (jansson): summary, meshes, phases, every table and receive list.
 * With tables == false only the summary, meshes and per-rank totals. Returns 0 or -errno. */
int wb_plan_write_json(const struct wb_plan *p, const struct wb_plan_input *in, bool tables,
                       FILE *f);

/* ---------------------------------------------------------------- estimate */

struct wb_est_phase {
    double start_s, end_s;
    uint64_t write_bytes, gather_bytes, h2d_bytes, quant_bytes;
    uint64_t max_send_bytes, max_gather_bytes;
};

/* The simulated execution of a plan (discrete-event, per-GPU pipelines, shared NIC egress and
 * ingress, NVLink vs network gathers, barriers, the memory cap). */
struct wb_estimate {
    double total_s;
    double lower_bound_s; /* max over NICs of bytes / effective bandwidth, and H2D/PCIe */
    uint32_t nphases;
    struct wb_est_phase *phase;
    /* per trainer: when its last write completed, and where its time went */
    double *trainer_end_s;
    double *busy_h2d_s, *busy_gpu_s, *busy_gather_s, *busy_submit_s, *wait_s;
    double *rollout_end_s;
    uint64_t peak_tmp_bytes;
    /* timeline samples for plots: per step, aggregate egress bytes/s and active tasks */
    uint32_t nsamples;
    double sample_dt;
    double *egress_Bps, *ingress_Bps, *gather_Bps;
};

int wb_plan_estimate(const struct wb_plan *p, const struct wb_plan_input *in,
                     struct wb_estimate *out, struct wb_errlist *el);
void wb_estimate_free(struct wb_estimate *e);
void wb_estimate_print(const struct wb_estimate *e, const struct wb_plan *p, FILE *f);

/* Bar charts of bytes per trainer GPU and per rollout GPU, and the simulated timeline. */
int wb_plan_write_svg(const struct wb_plan *p, const struct wb_estimate *e, FILE *f);

#endif /* WB_PLANNER_H */
