/* route.h — the one public header of route/: the routing table a trainer GPU executes and the
 * receive list a rollout GPU counts, with their wire codec.
 *
 * This is the contract between the planner, which produces these (planner/), and the agent,
 * which consumes them (agent/): neither needs the other's header. A table says, for one
 * trainer rank, which tasks run in which phase, the stage ops of each (H2D, gather, amax
 * exchange, copy/cast, FP8 quantization) over its registered shards and a temporary arena,
 * and the one-sided writes that deliver the bytes, with the tags a receiver counts. It also
 * carries how it must be run: the memory cap and the mode. (The FP8 block edge is WB_FP8_BLOCK,
 * common.h: the wire says it, and a decoder refuses any other, but no struct holds a copy.)
 *
 * Vocabulary: trainer tensor / rollout tensor are indices into the job's two inventories;
 * PARAM is a trainer rank's local shard of a trainer tensor; TMP is a task's temporary
 * allocation; see planner.h for how tables are built.
 */
#ifndef WB_ROUTE_H
#define WB_ROUTE_H

#include "common/common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The executor's temporary-memory cap when a job does not set one (1 GiB). */
enum { WB_MEM_CAP_DEFAULT = 1 << 30 };

/* Where a trainer's parameters live. */
enum wb_residence {
    WB_RESIDE_GPU = 0, /* parameters live in GPU memory */
    WB_RESIDE_HOST,    /* FSDP CPU offload: pinned host memory, every task starts with H2D */
};

/* ================================================================ routing tables */

/* How a piece is produced. WB_MODE_AUTO is only a request: the plan records the chosen mode.
 * WB_MODE_AMAX is only a choice: the planner makes it where FP8 blocks straddle owners of a
 * direct piece; a plan cannot be asked for it. */
enum wb_plan_mode { WB_MODE_AUTO = 0, WB_MODE_DIRECT, WB_MODE_AMAX, WB_MODE_GATHER };
/* The one list of the modes' names, indexed by enum wb_plan_mode, NULL-terminated (a config
 * loader's enum choices; the Python package reads the names through the two calls below). */
extern const char *const wb_plan_mode_names[];
const char *wb_plan_mode_name(enum wb_plan_mode m);
/* The modes a plan can be asked for: auto, direct, gather (amax is -EINVAL). */
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
    WB_OP_AMAX,    /* exchange partial block amax with the owners sharing some blocks */
    WB_OP_COPY,    /* box copy, same dtype (projection fusion, packing, stacking) */
    WB_OP_CAST,    /* box copy with dtype conversion */
    WB_OP_QUANT,   /* FP8 E4M3 128x128 block quantization of a region */
    WB_OP_PERMUTE, /* box copy, same dtype, with the dims permuted (a transpose) */
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

/* Partial-amax exchange for FP8 blocks that straddle owners: one op per shared block box,
 * with every peer owner that shares exactly those blocks. Each exchange with a peer is a pair
 * of mirror entries (same tag, same blocks, inboxes crossed): the peer's op lists this rank.
 * The executor computes its partial amax (max |x| in FP32, 0 where it holds no element of a
 * block) over `region` (a box of the trainer tensor, tensor coordinates; its data is src_box
 * of the view `src`) for each block of `blocks` (block-grid coordinates of the trainer tensor:
 * 128x128 over the last two dims, 1 along leading dims), writes that FP32 array (blocks'
 * extents, row-major) into every peer's amax inbox at the peer entry's peer_inbox_off with
 * the entry's immediate tag, waits for every peer's array in its own inbox at the entry's
 * inbox_off (the peer sends with the same tag), and for the blocks of `blocks` inside `grid`
 * stores the max of the grid value and the peers' into the task's amax grid at TMP amax_off
 * (FP32, grid's extents, row-major; the executor zeroes it when the task starts). grid is the
 * QUANT op's grid. One op instead of one per peer: the partial is computed once, and a
 * 64-way FSDP shard of an expert (4 owners per 128-row block row) has one op, not three. */
struct wb_rt_amax_peer {
    uint32_t rank;
    uint32_t tag;            /* the immediate of both directions of this exchange */
    uint64_t peer_inbox_off; /* where my partial goes in the peer's inbox */
    uint64_t inbox_off;      /* where the peer's arrives in mine */
};

struct wb_rt_amax {
    uint32_t peer0, npeers; /* table.amax_peers[peer0 .. peer0+npeers), npeers >= 1 */
    struct wb_rt_view src;
    uint32_t src_box, region, blocks, grid; /* box indices */
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

/* Transposing box copy (a rule's `permute`: gpt-oss experts, trainer [E, H, 2I] -> rollout
 * [E, 2I, H]): dst_box of dst (same dtype, same ndim n) gets src_box of src with its dims
 * permuted: dst_box.ext[k] == src_box.ext[p_k] and the element at dst_box.off + i is the one
 * at src_box.off + j with j[p_k] = i_k, where p_k = (perm >> 4k) & 15 (PyTorch's
 * src.permute(p)). Ops after it that name the trainer tensor (AMAX, QUANT regions and blocks)
 * speak of the permuted tensor: its dims in the rollout's order, so that FP8 blocks are
 * 128x128 over the rollout tensor's last two dims. */
struct wb_rt_permute {
    struct wb_rt_view src, dst;
    uint32_t src_box, dst_box; /* box indices */
    uint32_t perm;             /* dst dim k is src dim (perm >> 4k) & 15 */
};

static inline uint32_t wb_rt_perm_dim(uint32_t perm, uint32_t k)
{
    return (perm >> (4 * k)) & 15;
}

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
        struct wb_rt_permute permute;
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
 * The executor checks dst_off + len against the destination region before posting.
 *
 * Replica fan-out: a record with more = m > 0 stands for m + 1 writes, the same bytes to
 * dst_rank + k * rank_step for k = 0..m (every rollout replica holds the same local tensors,
 * so one record serves them all: a 1024 -> 512 plan has 1.1 * 10^8 writes in 1.3 * 10^7
 * records, half of them fanned out to all 16 replicas).
 * A plan's tables carry records; a decoded table never does: wb_route_table_decode() expands
 * them in place (write k of record i, in that order), so an executor sees single writes. */
enum { WB_RT_TMP_SRC = -1 }; /* as uint32_t */
struct wb_rt_write {
    uint64_t src_off;
    uint64_t dst_off;
    uint64_t len;
    uint32_t src_tensor;
    uint32_t dst_rank;
    uint32_t dst_tensor;
    uint32_t tag;
    uint32_t more;      /* copies beyond the first (0: a single write) */
    uint32_t rank_step; /* rank distance between copies (when more > 0) */
};

/* The writes a record stands for, and the destination rank of its copy k. */
static inline uint32_t wb_rt_copies(const struct wb_rt_write *w)
{
    return w->more + 1;
}

static inline uint32_t wb_rt_copy_rank(const struct wb_rt_write *w, uint32_t k)
{
    return w->dst_rank + k * w->rank_step;
}

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
    uint32_t namax_peers;
    struct wb_rt_amax_peer *amax_peers; /* the peers of AMAX ops */
    uint32_t nboxes;
    struct wb_box *boxes; /* distinct boxes referenced by ops and peers */
    uint32_t nshapes;
    struct wb_shape *shapes; /* distinct view shapes */
    uint32_t nwrites;
    struct wb_rt_write *writes; /* records (see struct wb_rt_write); tasks index them */
    uint64_t amax_inbox_bytes;  /* size of the registered region peers write partial amax into */
    uint32_t namax;
    struct wb_rt_expect *amax; /* what arrives in the inbox, per tag */
    uint64_t send_bytes;       /* sum of write lengths */
    uint64_t max_tmp_bytes;    /* largest task.tmp_bytes: the memory cap must be >= this */
    /* How the executor runs the table. The plan decides these once for every rank, so the
     * table is all an agent needs: no second source for any of them. */
    uint64_t mem_cap;       /* temporary-memory cap the tasks were sized for (>= max_tmp_bytes) */
    enum wb_plan_mode mode; /* the mode the plan was asked for (tasks record the chosen one) */
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

/* ================================================================ wire */

/* Envelope types (common's versioned msgpack envelope). The body is a map whose first key is
 * "format" (WB_PLAN_FORMAT); later formats only add keys, and decoders skip unknown keys. */
enum {
    WB_MSG_ROUTE_TABLE = 0x0401,
    WB_MSG_RECV_LIST = 0x0402,
    WB_PLAN_FORMAT = 4, /* 2: tables carry mem_cap, block and mode; 3: write records carry
                           their replica fan-out (9 fields); 4: an AMAX op lists its peers
                           (amax_peers); PERMUTE ops came later without a new number (it is
                           in every plan's JSON, whose hashes are pinned): a decoder that
                           predates them refuses such a table as malformed */
};

/* Appends an envelope holding the table to w (check wb_mpw_finish()). */
void wb_route_table_encode(struct wb_mpw *w, const struct wb_route_table *t);
/* Decodes an envelope; every count and index is checked (indices within their arrays, boxes
 * within shapes, op kinds known) before it is trusted, and write records are expanded into
 * single writes (more = 0; tasks' write ranges follow). -EBADMSG / -WB_E_VERSION / -ENOMEM. */
int wb_route_table_decode(const void *buf, size_t len, struct wb_route_table *out);
void wb_route_table_free(struct wb_route_table *t);
/* The writes a table's records stand for (sum of their copies). */
uint64_t wb_route_table_writes(const struct wb_route_table *t);
/* Replaces a table's write records by the single writes they stand for (record i's copies in
 * order; tasks' write ranges follow), as decoding does. 0, -EBADMSG (more than
 * WB_WIRE_MAX_ARRAY writes, or a task's range outside the records), -ENOMEM. */
int wb_route_table_expand(struct wb_route_table *t);

void wb_recv_list_encode(struct wb_mpw *w, const struct wb_recv_list *r);
int wb_recv_list_decode(const void *buf, size_t len, struct wb_recv_list *out);
void wb_recv_list_free(struct wb_recv_list *r);

#ifdef __cplusplus
}
#endif

#endif /* WB_ROUTE_H */
