/* build.h — the plan builder's working state, and the functions its files share (private to
 * the builder: planner/plan.c, cost.c, emit_threads.c, walk.c, stamp.c, assemble.c, emit.c
 * and geometry.c; balance.c has balance.h).
 *
 * Building runs in three passes over the items in phase order:
 *  1. enumerate every (item, rollout GPU, component, shard) demand (walk.c) and hand it to the
 *     balancer (fixed demands only add base load);
 *  2. balance (balance.c);
 *  3. replay the same enumeration, now with the chosen senders, and emit each rank's tasks:
 *     stage ops, writes, amax exchanges (emit.c), or stamp an item out from a congruent one
 *     (stamp.c); emit_threads.c sizes the tables first and may split the ranks among threads.
 * Replaying instead of storing keeps memory at one record per multi-candidate demand.
 *
 * Each file calls only files below it, never back up (below them all sit placement.c's
 * vectors, interning and placement, and layout.c's checks):
 *   plan.c         -> cost.c emit_threads.c walk.c stamp.c assemble.c balance.c geometry.c
 *   cost.c         -> walk.c geometry.c
 *   emit_threads.c -> walk.c stamp.c emit.c
 *   walk.c         -> stamp.c balance.c geometry.c
 *   stamp.c        -> balance.c geometry.c lazy.c
 *   emit.c         -> geometry.c
 *   assemble.c, balance.c, geometry.c: leaves; lazy.c (a lazy plan's segments) is a leaf
 *   below the plan's readers too (verify, estimate, JSON). */
#ifndef WB_PLANNER_BUILD_H
#define WB_PLANNER_BUILD_H

#include "planner/balance.h"

/* One rank's local layout of one mapping's rollout tensor. */
struct rlocal {
    struct wb_shape shape;       /* local value tensor */
    struct wb_shape scale_shape; /* local scale tensor (FP8 mappings) */
    uint32_t p0, np;             /* pieces in ctx.pieces */
};

struct item {
    uint32_t mapping, mesh, phase;
    uint32_t c0, nc;        /* component indices in ctx.item_comps */
    enum wb_plan_mode mode; /* GATHER or DIRECT (AMAX decided per piece) */
};

struct mesh_int {
    int32_t sel[WB_MESH_MAX_DIMS];
    uint32_t n;
    uint64_t *bits;  /* rank bitset, ctx.words words */
    uint32_t *ranks; /* the n members, ascending */
    uint32_t phase;
    uint32_t order; /* first appearance */
};

/* A destination piece of an item: component ci's part of rollout local piece p at local
 * index l. S is in trainer-tensor coordinates, D in the rollout rank's local tensor. */
struct subpiece {
    uint32_t l, ci;
    struct wb_box S, D;
};

/* What one rank writes for an item: units [u0, u1) of subpiece `sub`'s intersection with
 * shard k (k == UINT32_MAX: the whole subpiece, gather mode) to rollout rank g. The boxes are
 * recomputed when needed (pl_asg_boxes) instead of stored: there are millions. */
struct assign {
    uint32_t rank, g, ci, sub, k, u0, u1;
};

/* An assignment's trainer box S and rollout local box D. */
struct sd {
    struct wb_box S, D;
};

/* Per item and component: the tensor, its placement and shard boxes. */
struct icomp {
    uint32_t t, nk;
    const struct tplace *tp;
    const struct wb_shape *sh;
    uint32_t b0;  /* shard boxes at ctx.ibox[b0 .. b0+nk), set ids at ctx.iset[b0 ..] */
    uint32_t cls; /* shard box class: components of one class have the same shard boxes */
    bool aligned; /* every shard edge on a 128 block edge (FP8 never straddles) */
    /* A transposed component (wb_component.permuted): the item is planned in the coordinates
     * of the permuted tensor (the rollout's dim order), so its shard boxes at ibox, sh (then
     * &psh, set once the item's components are all in place) and its subpieces' S are
     * permuted; emit.c transposes the shard into that order (a PERMUTE op) before anything
     * reads it, and speaks the trainer's own order only to the shard and the gather. */
    bool permuted;
    uint8_t perm[WB_MAX_DIMS];
    struct wb_shape psh;
};

/* One (subpiece, shard) demand of the current local-rank group, shared by all replicas. */
struct dem {
    uint32_t sub, k, nu, dim;
    uint64_t gran, bytes;
    int64_t set;
    struct wb_box X;
    bool straddle;
};

/* An amax exchange between two owners of one component (both directions). */
struct xchg {
    uint32_t ci, a, b; /* ranks */
    struct wb_box blocks;
    uint32_t tag;
    uint64_t slot_a, slot_b; /* inbox offsets at a and at b */
};

/* What decides a component's shard boxes (placement.c: the rule's SHARD dims and the shape). */
struct cls_key {
    int32_t rule;
    struct wb_shape shape;
};

struct cls_info {
    uint32_t b0, nk; /* shard boxes cbox[b0 .. b0+nk) */
    bool aligned;    /* every shard edge on a 128 block edge (FP8 never straddles) */
};

/* A rank's gather peers for tensors of one class, direct-mapped by class. The peers of rank r
 * for a tensor it owns follow from r and the placement rule (the tensor's fixed coordinates
 * are r's), their boxes from the class: an expert tensor's gather would otherwise place and
 * intern its shards again on every rank. */
enum { PEER_CACHE = 8 };
struct peer_ids {
    uint32_t cls, n; /* n == 0: empty */
    struct wb_rt_peer *pe;
};

/* Per trainer rank output under construction. */
struct rank_out {
    struct vec tasks, ops, writes, peers, amax, apeers; /* apeers: AMAX ops' peers */
    struct intern boxes, shapes;
    struct peer_ids pcache[PEER_CACHE];
    uint64_t send, gather_in, h2d;
    uint64_t nwrites;               /* writes the records stand for (their copies) */
    uint64_t want_ops, want_writes; /* what presize expects pass 3 to append */
    /* a lazy plan's (opts.lazy): stamped items' segments (struct pl_seg) and their renumbering
     * pairs, and the ops, records, amax expectations and amax peers they stand for (task op0
     * and write0 and AMAX peer0 count them, as in the table expanded) */
    struct vec segs, pool;
    uint32_t vops, vwrites, vamax, vapeers;
};

/* Templates (stamp.c): representatives, what was recorded of them, and per item the one it
 * is stamped from with the rank and rollout-local-rank offsets. */
struct stamp {
    bool on, logging, recording;
    struct vec reps, sub, tens; /* representatives, their subpieces and tensors */
    struct vec p1u32, p1u64;    /* pass 1: candidate-set requests, base-load deltas */
    struct vec p3rk, p3u32;     /* pass 3: per mesh position ranges, first-use lists */
    int32_t *head;              /* signature hash -> representative, chained */
    size_t hcap;
    int32_t *rep_of, *dr, *dl; /* per item */
    size_t demands0;           /* snapshots while a representative is walked */
    uint32_t group0;
    uint64_t pieces0[4];
    size_t stamped; /* items stamped in the last emission pass */
};

struct plan_ctx {
    const struct wb_plan_input *in;
    const struct wb_plan_opts *opts;
    struct wb_errlist *el;
    struct wb_placement_map *pm;
    uint32_t nt, nr, gpr, words;
    struct rlocal *rloc; /* [nmappings * gpr] */
    struct vec pieces;   /* struct wb_local_piece */
    struct vec meshes;   /* struct mesh_int */
    struct vec items;    /* struct item, phase order after ordering */
    struct intern cls;   /* shard box classes: (placement rule, shape) */
    uint32_t *tcls;      /* per trainer tensor: its class */
    struct vec cinfo;    /* per class: struct cls_info */
    struct vec cbox;     /* the classes' shard boxes */
    struct vec item_comps;
    uint32_t nphases;
    struct balance bal;
    /* pass 3. Emission may run in several threads, each with its own copy of this context
     * (pl_emit_all): thread `me` fills the tables of the ranks r with part[r] == me (all of
     * them when part is NULL) and keeps its own counters, receive counts and inbox cursors,
     * which every thread advances for all ranks alike. */
    struct rank_out *ro; /* [nt] */
    const uint8_t *part; /* [nt] or NULL */
    uint32_t me;
    uint64_t *inbox;      /* [nt] amax inbox cursors */
    uint32_t next_tag;    /* amax tags, plan-wide */
    uint32_t *gather_seq; /* per mesh */
    bool *phase_coll;     /* per phase: has GATHER/AMAX ops */
    struct recv_count {
        uint64_t bytes, writes;
    } * recv;                /* [nr * nrollout tensors] */
    struct recv_count *rcls; /* [gpr * nrollout tensors]: what records fanned out to every
                                replica bring each replica's rank (stamp.c counts them here
                                once, pl_emit_all adds them to recv) */
    uint64_t pieces_by_mode[4];
    uint64_t gathers, amax_ops;
    /* scratch */
    struct vec sub, asg, xc, icomp, ibox, iset, dem, sd;
    struct vec xmine; /* emit_component: the exchanges of one rank (indices into xc) */
    size_t demand_cursor;
    uint32_t *dem0; /* per item (+1): its first balanced demand in bal.demands */
    struct stamp st;
};

/* Whether this emission thread fills rank r's table. */
static inline bool owns(const struct plan_ctx *c, uint32_t r)
{
    return !c->part || c->part[r] == c->me;
}

/* ---------------------------------------------------------------- plan.c */
/* The driver: items, meshes, phases, modes, pass 1, balancing, pass 3, plan assembly. */

/* wb_plan_build() with templates on or off (tests compare the two); *nstamped (may be NULL):
 * items stamped from a template in the final emission. */
int pl_plan_build(const struct wb_plan_input *in, const struct wb_plan_opts *opts, bool stamp,
                  struct wb_plan **out, size_t *nstamped, struct wb_errlist *el);

/* ---------------------------------------------------------------- cost.c */
/* Auto's choice between direct and gather, by cost on the hardware model. */

/* For the items as cut for direct mode (c->items, before modes are chosen): sets
 * gather_groups[mapping * nmeshes + mesh] to 1 for the (mapping, mesh) groups that go gather,
 * 0 for the others (an array of nmappings * nmeshes). Uses c->sub and c->icomp as scratch. */
enum pl_auto_kind { PL_AUTO_DIRECT = 0, PL_AUTO_GATHER = 1, PL_AUTO_MIX = 2 };
/* The cost model's view of the choice: its modelled seconds for all direct, all gather and
 * the chosen assignment, what kind that is, and for the plain modes what their simulated times
 * cannot be below. */
struct pl_auto_cost {
    double direct_s, gather_s, chosen_s;
    double direct_lb, gather_lb; /* lower bounds of the plain modes' simulated times */
    enum pl_auto_kind kind;
};
int pl_auto_choose(struct plan_ctx *c, uint8_t *gather_groups, struct pl_auto_cost *cost);

/* ---------------------------------------------------------------- emit_threads.c */
/* Pass 3 over every item, ranks split among threads; per-rank tables under construction. */

struct rank_out *pl_rank_outs_new(uint32_t n);
void pl_rank_outs_free(struct rank_out *ro, uint32_t n);
/* A context's own working state: scratch vectors and pass-3 counters (receive counts, gather
 * ordinals, collective phases, inbox cursors). */
void pl_scratch_init(struct plan_ctx *c);
void pl_scratch_free(struct plan_ctx *c);
/* Pass 3: c->ro reset, then filled, in c->opts->threads threads. */
int pl_emit_all(struct plan_ctx *c);
/* Emission threads wb_plan_build() uses for opts->threads == 0 (one per CPU, at most 8). */
uint32_t pl_plan_threads_default(void);

/* ---------------------------------------------------------------- walk.c */
/* An item's subpieces and demands in plan order (pass 1: to the balancer; pass 3: assignments). */

/* Subpieces of an item (into c->sub). */
int pl_item_subpieces(struct plan_ctx *c, const struct item *it);
/* Prepares c->icomp/ibox/iset for an item. */
int pl_item_comps_prepare(struct plan_ctx *c, const struct item *it);
/* Walks an item's demands in plan order: pass 1 (emit == false) hands them to the balancer,
 * pass 3 reads their senders back into assignments (c->asg). */
int pl_walk_item(struct plan_ctx *c, const struct item *it, bool emit, uint32_t *group);

/* ---------------------------------------------------------------- stamp.c */
/* Templates: items stamped out from a congruent representative's recorded output. */

/* pl_stamp_prepare() once the items exist; pl_stamp_classify() per item in plan order with
 * its subpieces in c->sub (*like: the earlier item it is congruent to, or -1). Per pass:
 * pl_stamp_pass_reset(); per item either *_apply() (returns 1 when it stamped the item) or
 * *_begin(), the normal walk/emission, *_end(). pl_stamp_log_set() records candidate-set
 * requests while a representative is walked. */
void pl_stamp_init(struct stamp *st);
void pl_stamp_free(struct stamp *st);
int pl_stamp_prepare(struct plan_ctx *c, bool on);
int pl_stamp_classify(struct plan_ctx *c, uint32_t i, int64_t *like);
void pl_stamp_pass_reset(struct plan_ctx *c, int pass);
int pl_stamp_walk_begin(struct plan_ctx *c, uint32_t i, uint32_t group);
int pl_stamp_walk_end(struct plan_ctx *c, uint32_t i, uint32_t group);
int pl_stamp_walk_apply(struct plan_ctx *c, uint32_t i, uint32_t *group);
int pl_stamp_log_set(struct plan_ctx *c, int64_t set);
int pl_stamp_emit_begin(struct plan_ctx *c, uint32_t i);
int pl_stamp_emit_end(struct plan_ctx *c, uint32_t i);
int pl_stamp_emit_apply(struct plan_ctx *c, uint32_t i);
/* The representative of item i (i itself when it is one; -1 when it has none) and i's rank
 * offset from it. */
int64_t pl_stamp_rep_of(const struct plan_ctx *c, uint32_t i, int64_t *dr);

/* ---------------------------------------------------------------- assemble.c */
/* The per-rank output moved into the plan's routing tables and receive lists. */

int pl_finish_tables(struct plan_ctx *c, struct wb_plan *p);

/* ---------------------------------------------------------------- emit.c */
/* One item's tasks (stage ops, writes, amax exchanges) from its assignments. */

/* Builds the tasks of item item_index from its assignments (c->asg). */
int pl_emit_item(struct plan_ctx *c, uint32_t item_index);

/* ---------------------------------------------------------------- geometry.c */
/* Box and shard arithmetic (a leaf: calls nothing else in the builder). */

const struct wb_mapping *pl_ctx_map(const struct plan_ctx *c, uint32_t m);
const struct wb_component *pl_item_comp(const struct plan_ctx *c, const struct item *it,
                                        uint32_t ci);
/* Rank r's shard and replica index of trainer tensor t; false when r is not an owner. */
bool pl_rank_shard(const struct plan_ctx *c, uint32_t t, uint32_t r, uint32_t *shard,
                   uint32_t *replica);
/* Rank r's box of trainer tensor t; false when r is not in the owner set. */
bool pl_rank_box(const struct plan_ctx *c, uint32_t t, uint32_t r, struct wb_box *box,
                 uint32_t *shard, uint32_t *replica);
/* Units along which a trainer box may be split, and the sub-box of units [u0, u1). */
uint32_t pl_box_units(const struct plan_ctx *c, const struct wb_mapping *m, const struct wb_box *S,
                      uint32_t *dim, uint64_t *gran);
struct wb_box pl_box_unit_range(const struct wb_box *S, uint32_t dim, uint64_t gran, uint32_t u0,
                                uint32_t u1);
/* D for a sub-box S' of subpiece (S, D). */
struct wb_box pl_map_to_dst(const struct wb_box *S, const struct wb_box *D,
                            const struct wb_box *Sp);
/* Destination bytes of trainer box S under mapping m (values + the scales whose block origin
 * lies in S). */
uint64_t pl_dst_bytes(const struct wb_mapping *m, const struct wb_box *S);
/* Blocks whose origin element lies in S. */
struct wb_box pl_origin_blocks(const struct wb_box *S);
/* A component's permutation (rollout dim k is trainer dim perm[k]) as a route table's PERMUTE
 * op carries it, and boxes between the trainer's dim order (T) and the permuted one (P):
 * pl_perm_box(b)[k] = b[perm[k]], pl_unperm_box its inverse. */
uint32_t pl_perm_pack(const uint8_t *perm, uint32_t ndim);
struct wb_box pl_perm_box(const struct wb_box *b, const uint8_t *perm);
struct wb_box pl_unperm_box(const struct wb_box *b, const uint8_t *perm);
struct wb_shape pl_perm_shape(const struct wb_shape *s, const uint8_t *perm);
/* The boxes of an assignment (of the item whose subpieces and shard boxes are in c). */
void pl_asg_boxes(const struct plan_ctx *c, const struct item *it, const struct assign *a,
                  struct sd *out);

#endif /* WB_PLANNER_BUILD_H */
