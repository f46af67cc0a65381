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
#include "route/route.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ================================================================ cluster layouts */

enum { WB_MESH_MAX_DIMS = 6, WB_MESH_NAME_MAX = 16 };
/* GPUs on either side of a plan, at most (a plan's tables grow with both). */
enum { WB_MAX_GPUS = 65536 };

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
    WB_PLACE_ROWS,          /* explicit ranges along tensor dim `arg`: coordinate i holds
                               [rows[i], rows[i + 1]) (the rule's cuts), empty ranges allowed:
                               the shares of a checkpoint cut where its readers' byte ranges end,
                               which torch.chunk's rule cannot express */
};

struct wb_placement {
    enum wb_place_kind kind;
    uint32_t arg; /* SHARD, ROWS: tensor dim; INDEX: coordinate */
};

/* "name pattern -> placement per mesh dim". Patterns are literal text with `*` (any run of
 * characters) and the captures {layer} and {expert} (a run of digits). First match wins. */
struct wb_place_rule {
    char *pattern;
    struct wb_placement place[WB_MESH_MAX_DIMS];
    uint32_t line;  /* line in the layout file, for messages */
    uint64_t *rows; /* a WB_PLACE_ROWS dim (at most one per rule): its size + 1 cuts, rising from
                       0 to the tensor's extent along the dim (owned); NULL otherwise */
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

/* "name pattern -> the dtype the trainers hold it in" (a layout's `dtypes:`; `dtype: X` is a
 * last rule "*" -> X). Patterns as in placement rules; first match wins. */
struct wb_dtype_rule {
    char *pattern;
    enum wb_dtype dtype; /* bf16, fp16 or fp32 */
    uint32_t line;       /* line in the layout file, for messages */
};

struct wb_trainer_layout {
    uint32_t world, gpus_per_node;
    uint32_t ndims;
    struct wb_mesh_dim dim[WB_MESH_MAX_DIMS];
    uint32_t pp_layers; /* layers split over a LAYER dim; 0 = max {layer} + 1 over the inventory */
    enum wb_residence residence;
    size_t nrules;
    struct wb_place_rule *rules;
    /* Tensors placed by name (a layout derived from what the trainers registered): named[i]
     * takes rule named_rule[i]; sorted by name, looked up before any pattern. */
    size_t nnamed;
    char **named;
    uint32_t *named_rule;
    /* The dtypes the trainers hold (wb_trainer_layout_dtypes); none: the model rules'. */
    size_t ndtypes;
    struct wb_dtype_rule *dtypes;
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
/* One key of a hardware model set from text, as a layout's `hardware:` would give it
 * ("nic_gbps", "200"; durations as "2us"): a what-if over a loaded model. 0, or -WB_E_CONFIG
 * with why in err (an unknown key names the known ones; a bad value the range). */
int wb_hw_set(struct wb_hw *hw, const char *key, const char *value, char *err, size_t cap);
/* A layout from placements known per tensor instead of a file (what trainers register from
 * their DTensors, or a checkpoint's shares): world = product of the dims, one rule per distinct
 * placement, each tensor placed by name. names[i] takes place[i * ndims .. + ndims) and, when
 * one of those is WB_PLACE_ROWS, the cuts rows[i] (ndims' size + 1 values; rows may be NULL
 * when no placement is ROWS). `origin` names it in messages. Every problem goes to el
 * (-WB_E_CONFIG); *out is zeroed on failure. */
int wb_trainer_layout_from_placements(uint32_t ndims, const struct wb_mesh_dim *dims,
                                      uint32_t gpus_per_node, enum wb_residence residence, size_t n,
                                      const char *const *names, const struct wb_placement *place,
                                      const uint64_t *const *rows, const char *origin,
                                      struct wb_trainer_layout *out, struct wb_errlist *el);
/* Gives the trainer inventory's floating-point tensors (bf16, fp16, fp32) the dtype the trainers
 * hold them in: the first of the layout's dtype rules matching the name; tensors no rule
 * matches, and FP8 or integer tensors, keep the model's dtype. (A trainer keeping FP32 masters
 * sends each value cast to the rollout's dtype: the matcher then casts or quantizes from it.)
 * Run before matching. Returns 0; the layout's rules were checked when it was loaded. */
int wb_trainer_layout_dtypes(const struct wb_trainer_layout *tl, struct wb_inventory *trainer);
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
 * to el, each naming the tensor or the rule's file:line: all are counted (wb_errlist_count), the
 * first 20 kept with their text. */
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

/* ================================================================ the model of a job */

/* Where a job's model comes from. Paths; NULL or "" where absent. Inventories are generated
 * from the rules' family entries and config.json unless inventory files are given; layouts are
 * loaded (and checked against each other) only when both are given. */
struct wb_model_src {
    const char *rules;          /* model-family YAML (configs/models/...) */
    const char *config;         /* config.json: the rollout inventory and the rules' bindings */
    const char *vars;           /* "NAME=VALUE,..." for the family file's vars (e.g. "mtp=1") */
    const char *trainer_config; /* config.json of the trainer side when it differs (an FP8
                                   checkpoint); NULL: config */
    const char *trainer_inv;    /* inventory files instead of generating from config.json */
    const char *rollout_inv;
    const char *trainer_layout; /* cluster layouts */
    const char *rollout_layout;
    /* the trainer inventory in memory instead (copied): a checkpoint's tensors as they are.
     * Last, so that bindings written before it (Python's _ModelSrc) keep their layout. */
    const struct wb_inventory *trainer_mem;
    /* the trainer naming (one of the family file's `namings:`, e.g. "megatron"); NULL or "":
     * the file's first. After trainer_mem for the same reason. */
    const char *naming;
};

/* Everything matching and planning start from: rules, both inventories, the match and (when
 * asked for) the layouts. */
struct wb_model {
    struct wb_match_rules *rules;
    struct wb_inventory trainer, rollout;
    struct wb_match *match;
    bool have_layouts;
    struct wb_trainer_layout tl;
    struct wb_rollout_layout rl;
};

/* Loads the rules, the two inventories, matches them and loads the layouts. Every problem found
 * goes to el (naming file:line, tensor or rank) and the return is its code (-WB_E_CONFIG,
 * -WB_E_MATCH, ...); *out is then left empty and needs no free. */
int wb_model_load(const struct wb_model_src *src, struct wb_model *out, struct wb_errlist *el);
void wb_model_free(struct wb_model *m);

/* ================================================================ plans */

struct wb_plan_input {
    const struct wb_inventory *trainer, *rollout;
    const struct wb_match *match;
    const struct wb_trainer_layout *tl;
    const struct wb_rollout_layout *rl;
};

/* The plan input of a loaded model (its layouts must have been loaded). */
static inline struct wb_plan_input wb_model_input(const struct wb_model *m)
{
    return (struct wb_plan_input){&m->trainer, &m->rollout, m->match, &m->tl, &m->rl};
}

/* ---------------------------------------------------------------- relay (issue #30) */

/* Replicas relaying to replicas. Where the trainers' NIC egress bounds an update (every byte
 * leaves a trainer once per replica), the member replicas of an attempt form a forest: the
 * trainers write only the roots' entries of their tables, and every other replica's local rank
 * l is written by its parent replica's local rank l, which forwards each expect entry's bytes
 * to the same offsets as soon as it has counted them (the replicas hold the same receive lists
 * rank by rank: congruence is checked, wb_relay_verify). OFF is today's plan: the trainers
 * write every replica. AUTO is only a request: wb_plan_build() simulates the shapes that can
 * win on the layouts' hardware model and records the fastest (off included). */
/* (The numbers are kept: a job's relay key can be stored as the same integer; the names carry
 * PLAN_ so that a part naming its own relay switch WB_RELAY_* can include this header.) */
enum wb_relay_kind {
    WB_PLAN_RELAY_OFF = 0,
    WB_PLAN_RELAY_CHAIN,
    WB_PLAN_RELAY_TREE,
    WB_PLAN_RELAY_AUTO
};
/* The names, indexed by enum wb_relay_kind, NULL-terminated (a config loader's choices). */
extern const char *const wb_relay_kind_names[];
/* "off", "chain", "tree", "auto" -> *out; -EINVAL otherwise. */
int wb_relay_kind_parse(const char *s, enum wb_relay_kind *out);

/* A relay shape. fanout: children per relaying replica (chain: 1; tree: >= 2; 0 asks for the
 * default: chain 1, tree 2); roots: replicas the trainers write (0: the default, 1). Over the
 * members m_0 < m_1 < ... < m_{n-1} of an attempt, m_0 .. m_{R-1} are roots (R = min(roots,
 * n)) and m_i, i >= R, is written by m_{(i - R) / fanout}: chain with R roots is R chains
 * interleaved (m_i after m_{i-R}), a tree fills level by level. */
struct wb_relay {
    enum wb_relay_kind kind;
    uint32_t fanout, roots;
};

/* The shape with its defaults applied and checked against the number of (capacity) replicas:
 * 0, or -WB_E_CONFIG with why in err naming the value (a chain with a fanout, a tree with
 * fanout 1, roots 0 or above the replicas). AUTO stays AUTO. */
int wb_relay_resolve(const struct wb_relay *in, uint32_t replicas, struct wb_relay *out, char *err,
                     size_t cap);

enum { WB_RELAY_ROOT = UINT32_MAX, WB_RELAY_ABSENT = UINT32_MAX - 1 };
/* The forest of one attempt: parent[j] for each of the `replicas` replicas: WB_RELAY_ROOT
 * (written by the trainers), WB_RELAY_ABSENT (not a member: member[j] false), or the replica
 * that writes it. member NULL: all. A resolved shape (OFF: every member a root). */
void wb_relay_forest(const struct wb_relay *shape, uint32_t replicas, const bool *member,
                     uint32_t *parent);

/* A forest as the rollouts are told it: the replicas the trainers write, and per relaying
 * replica its children (edges parent -> child). */
struct wb_relay_edge {
    uint32_t parent, child;
};
struct wb_relay_forest {
    uint32_t nroots;
    const uint32_t *roots;
    uint32_t nedges;
    const struct wb_relay_edge *edges;
};
/* The edges and roots of parent[] (wb_relay_forest) into f, its arrays malloc'd (free both). */
int wb_relay_forest_edges(const uint32_t *parent, uint32_t replicas, uint32_t **roots,
                          struct wb_relay_edge **edges, struct wb_relay_forest *f);

struct wb_plan;
/* Checks that the forest f over plan p's replicas writes every byte of every replica it names
 * exactly once and from a correct source: each replica named is a root or the child of
 * exactly one parent (not both, not twice), every replica reaches a root (no cycle), every
 * index is a replica of the plan, and each child's local rank l holds the same receive list as
 * its parent's local rank l (local tensors, dtypes, shapes, bytes, expected tags, bytes and
 * writes), so that its parent's counted bytes are exactly its own. (The roots' bytes are the
 * trainers' writes, which wb_plan_verify checks for every replica.) 0, or -WB_E_PLAN with
 * every violation in el, each naming the replicas and the rank. */
int wb_relay_verify(const struct wb_plan *p, const struct wb_relay_forest *f,
                    struct wb_errlist *el);

/* A shape in words: "off", "chain, 8 roots", "tree of fanout 2, 1 root". */
const char *wb_relay_str(const struct wb_relay *r, char *buf, size_t cap);

/* One simulated shape of auto's choice (wb_plan.relay_tried). */
enum wb_relay_skip {
    WB_RELAY_TRY_RUN = 0, /* simulated (or its simulation failed: total_s INFINITY) */
    WB_RELAY_TRY_BOUND,   /* its lower bound is not below the best time simulated before */
    WB_RELAY_TRY_HOPS,    /* fewer roots than a shape of its kind that was not 1% faster than
                             the one with more roots before it: more hops, the same bound */
};
struct wb_relay_try {
    struct wb_relay shape;
    double total_s; /* the simulated time; INFINITY: not simulated (skipped says why) */
    double bound_s; /* the shape's lower bound (busiest NIC at full speed) */
    enum wb_relay_skip skipped;
};

struct wb_plan_opts {
    enum wb_plan_mode mode; /* DIRECT/GATHER force (DIRECT falls back to AMAX where FP8 blocks
                               straddle owners); AUTO chooses per (mapping, mesh) group by cost
                               on the layouts' hardware model (planner/cost.c) and simulates
                               its choice against the plain modes the model cannot rule out,
                               so its estimate is never above theirs; without a hardware model
                               it gathers only where direct writes would explode */
    uint64_t mem_cap;       /* executor's temporary-memory cap, bytes; 0: WB_MEM_CAP_DEFAULT */
    uint32_t threads;       /* building threads; 0 = one per CPU (at most 8). The plan is the
                               same for any number. */
    bool lazy;              /* keep the ops and write records of items stamped from a template
                               (most of a large MoE plan's) unexpanded: a fraction of the time
                               and memory; wb_plan_table() expands them for any reader */
    bool fit_cap;           /* a plan to be executed whose largest task needs more than mem_cap:
                               the plan's and every table's cap become that task's bytes (a
                               checkpoint's tensors are the size they are). The plan itself is
                               the one mem_cap gives. Without it the plan keeps mem_cap, and
                               wb_plan_check_cap() tells whether it can be executed. */
    struct wb_relay relay;  /* zeroed: off. Not a property of the tables (they hold every
                               replica's entries): where they run, and the estimate */
};

/* A mesh: sorted member ranks. */
struct wb_plan_mesh {
    uint32_t n;
    uint32_t *ranks;
    uint32_t phase;
};

/* Summary figures; sender/receiver arrays are indexed by rank. */
struct wb_plan_stats {
    uint64_t tensors; /* distinct trainer tensors the mappings read */
    uint64_t mappings, items, tasks, ops, gathers;
    uint64_t amax_ops, amax_peers; /* AMAX ops, and their peers (one exchange each) */
    uint64_t writes;               /* single writes */
    uint64_t records;      /* write records (a record fans out to replicas: struct wb_rt_write) */
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

/* A built plan's summary. Its routing tables are not here: every reader, lazy plan or eager,
 * takes trainer rank r's table through wb_plan_table(), so a plan has one shape for readers
 * (the tables and what a lazy plan keeps unexpanded are the planner's, planner/plan_int.h). */
struct wb_plan {
    enum wb_plan_mode mode; /* as requested */
    uint64_t mem_cap;       /* the cap every table carries (opts.mem_cap or its default; with
                               opts.fit_cap, raised to the largest task's bytes) */
    uint32_t ntrainers, nrollouts;
    struct wb_recv_list *recv; /* [nrollouts] */
    uint32_t nmeshes;
    struct wb_plan_mesh *meshes;
    uint32_t nphases;
    struct wb_plan_stats stats;
    struct wb_relay relay; /* resolved: off, chain or tree (auto's choice) */
    /* auto's choice: the shapes it looked at, in the order simulated (NULL: none) */
    uint32_t nrelay_tried;
    struct wb_relay_try *relay_tried;
};

/* Trainer rank r's routing table as an executor gets it, for any plan: a lazy plan's table is
 * expanded into buf (its tasks, gather peers and boxes are the plan's; its ops, writes, amax
 * peers and expectations buf's own); an eager plan's is the plan's own table, buf untouched.
 * The result stays valid until the next call with buf (and the plan's life). NULL: no memory.
 * Free buf with wb_plan_tbuf_free() (a zeroed buf is empty). */
struct wb_plan_tbuf {
    struct wb_route_table t;
    struct wb_rt_op *ops;
    struct wb_rt_write *writes;
    struct wb_rt_expect *amax;
    struct wb_rt_amax_peer *apeers;
    size_t cops, cwrites, camax, capeers;
};
const struct wb_route_table *wb_plan_table(const struct wb_plan *p, uint32_t r,
                                           struct wb_plan_tbuf *buf);
void wb_plan_tbuf_free(struct wb_plan_tbuf *buf);

/* Builds the plan. Every problem found (layout, ownership, infeasible split) is appended to el,
 * each naming the tensor, rank or file:line; the return is then -WB_E_PLAN (or -WB_E_CONFIG)
 * and *out is untouched. */
int wb_plan_build(const struct wb_plan_input *in, const struct wb_plan_opts *opts,
                  struct wb_plan **out, struct wb_errlist *el);
void wb_plan_free(struct wb_plan *p);
/* A plan to be executed: every task's temporary bytes must fit under the plan's memory cap (the
 * executor never starts a larger task; a job would never become ready). Where one does not:
 * -WB_E_PLAN with one message naming the cap, the bytes needed and the task's tensor. 0 when
 * everything fits (always, for a plan built with opts.fit_cap). */
int wb_plan_check_cap(const struct wb_plan *p, const struct wb_plan_input *in,
                      struct wb_errlist *el);

/* One line per phase, task, op and write (names from `in`, which may be NULL). */
void wb_route_table_print(const struct wb_route_table *t, const struct wb_plan_input *in, FILE *f);

/* Checks a plan against its input: every destination byte written exactly once and inside its
 * local tensor; every write's source bytes held by the writing rank (its shard, an H2D copy of
 * it, a gather, or an op output derived from those) and mapping to the same tensor elements as
 * its destination; mesh groups disjoint; gathers in the same order on every mesh member;
 * amax ops mirrored. A lazy plan's stamped items are checked by their segments: each is shown
 * congruent to its representative (whose rows are checked op by op) or else expanded. Returns 0, or
 * -WB_E_PLAN with every violation counted in el (wb_errlist_count) and the first 20 kept with their
 * text. */
int wb_plan_verify(const struct wb_plan *p, const struct wb_plan_input *in, struct wb_errlist *el);

/* The plan's relay, when it has one or auto chose: the shape, the forest over every replica
 * (which replicas the trainers write, and who writes the others) and auto's simulated shapes.
 * Nothing for a plan without relay asked. */
void wb_relay_print(const struct wb_plan *p, FILE *f);

/* Prints the summary (tensors, bytes, phases, entries, writes, per-sender/per-receiver
 * min/mean/max, imbalance vs lower bound and vs the reference greedy). */
void wb_plan_print_summary(const struct wb_plan *p, const struct wb_plan_input *in, FILE *f);

/* When the rollout receives no FP8 at all (every weight BF16: twice the bytes of an FP8
 * rollout, usually a config.json without quantization_config), writes a one-line warning
 * into buf (without a "warning: " prefix) and returns true; the summary prints it too. */
bool wb_plan_dtype_warning(const struct wb_plan_input *in, char *buf, size_t cap);

/* ---------------------------------------------------------------- JSON */

/* The plan as JSON: format, mode, summary figures, per-rank totals and meshes; with tables
 * also everything needed to check it without this code: both inventories (names, dtypes,
 * shapes), every trainer tensor's owners and their shard boxes, the mappings, every routing
 * table and receive list (compact arrays whose layouts the file describes under "layouts"),
 * one entry per line so that it can be read as a stream (tests/sh/plan_audit.py does). Written
 * by hand through a buffer; returns 0 or -errno. */
int wb_plan_write_json(const struct wb_plan *p, const struct wb_plan_input *in, bool tables,
                       FILE *f);
/* The same with the estimate (NULL: none) under "estimate", after the summary. */
struct wb_estimate;
int wb_plan_write_json_est(const struct wb_plan *p, const struct wb_plan_input *in, bool tables,
                           const struct wb_estimate *est, FILE *f);

/* For language bindings: loads the model (wb_model_load), builds the plan and returns it as the
 * JSON wb_plan_write_json writes (*json, malloc'd). On failure *errors (malloc'd) holds every
 * problem, one per line. 0 or the failing call's code. */
int wb_plan_json(const struct wb_model_src *src, const struct wb_plan_opts *opts, bool tables,
                 char **json, char **errors);

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
    /* The resource that sets the lower bound, in words: "rollout rank 17's NIC ingress
     * (replica 4, tp rank 1): 54.91 GiB at 50.0 GB/s" */
    char bound[192];
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

/* Simulates p's execution on in's hardware models into *out (wb_estimate_free), or fails with
 * the problem in el. The simulation is deterministic: a plan that auto mode simulated while
 * choosing it keeps that estimate, and a call with the same hardware models, trainer node size
 * and cap returns a copy of it instead of simulating again. */
int wb_plan_estimate(const struct wb_plan *p, const struct wb_plan_input *in,
                     struct wb_estimate *out, struct wb_errlist *el);

/* The rollout replicas p covers (its receive lists' last replica + 1; 0 without rollouts). */
uint32_t wb_plan_replicas(const struct wb_plan *p);

/* One update to one replica alone, as a replica that joins a running job is caught up
 * (issue #30): the plan covers every replica up to the fleet's capacity, so a join re-plans
 * nothing; the trainers write that replica's copies only (the attempt's member set is the one
 * replica). A plan of one replica: wb_plan_estimate. */
int wb_plan_estimate_join(const struct wb_plan *p, const struct wb_plan_input *in,
                          struct wb_estimate *out, struct wb_errlist *el);

/* wb_plan_verify and wb_plan_estimate of one plan at once (wb-plan --verify --estimate): with
 * two CPUs or more, verify runs on one thread beside the simulation, which is mostly one
 * thread itself, so both take about as long as the longer one (else one after the other).
 * Each result is the one its own call returns, its problems in its own list (verify_el,
 * est_el); *est is written only when est_rc is 0. When verify fails the simulation is
 * stopped: est_rc is then -ECANCELED. */
struct wb_plan_checks {
    int verify_rc, est_rc;
    double verify_s, est_s; /* seconds each took */
};
void wb_plan_verify_estimate(const struct wb_plan *p, const struct wb_plan_input *in,
                             struct wb_estimate *est, struct wb_errlist *verify_el,
                             struct wb_errlist *est_el, struct wb_plan_checks *res);
void wb_estimate_free(struct wb_estimate *e);
void wb_estimate_print(const struct wb_estimate *e, const struct wb_plan *p, FILE *f);

/* A changed-only (delta) update against a full one (issue #34; wb-plan --changed F): a fraction
 * `changed` (0 < F <= 1) of every FP8/BF16 write's bytes changed since the version the rollout
 * holds; each write's changed bytes travel as one record (the data path's: header_bytes, then
 * entry_bytes per changed byte: u32 offset + u8 value, padded to 8), which the rollout stores
 * at its hardware model's copy_GBps before the version counts. A write goes as a delta where
 * the record is at most half the write and costs less than the write (wire + apply against
 * wire); block scales and other dtypes go in full. Both updates are simulated (wb_plan_estimate's
 * model; the delta's with the trainer's compare against its shadow on its GPU stage and each
 * rollout's apply after its bytes landed). Counts are writes, every replica copy counted. */
struct wb_delta_estimate {
    double changed;
    uint32_t entry_bytes, header_bytes;
    uint64_t full_bytes, sent_bytes; /* a full update's bytes, the delta update's */
    uint64_t writes, delta_writes;
    uint64_t full_other, full_over_half, full_not_cheaper; /* in full, and why */
    double full_s, delta_s;                                /* the two estimates */
    double apply_s;                                        /* the busiest rollout's apply work */
    double step_s; /* the delta simulation's time step (its times are in steps) */
};
/* 0, or the estimate's error (-WB_E_CONFIG without hardware models; -EINVAL for a fraction
 * outside (0, 1]) with the problem in el. */
int wb_plan_estimate_delta(const struct wb_plan *p, const struct wb_plan_input *in, double changed,
                           struct wb_delta_estimate *out, struct wb_errlist *el);
void wb_delta_estimate_print(const struct wb_delta_estimate *d, FILE *f);

/* Bar charts of bytes per trainer GPU and per rollout GPU, and the simulated timeline. */
int wb_plan_write_svg(const struct wb_plan *p, const struct wb_estimate *e, FILE *f);

#ifdef __cplusplus
}
#endif

#endif /* WB_PLANNER_H */
