/* build.h — the plan builder's working state (private to planner/plan.c and emit.c).
 *
 * Building runs in three passes over the items in phase order:
 *  1. enumerate every (item, rollout GPU, component, shard) demand and hand it to the balancer
 *     (fixed demands only add base load);
 *  2. balance (balance.c);
 *  3. replay the same enumeration, now with the chosen senders, and emit each rank's tasks:
 *     stage ops, writes, amax exchanges (emit.c).
 * Replaying instead of storing keeps memory at one record per multi-candidate demand. */
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
    uint64_t *bits; /* rank bitset, ctx.words words */
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
 * recomputed when needed (asg_boxes) instead of stored: there are millions. */
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
    bool aligned; /* every shard edge on a 128 block edge (FP8 never straddles) */
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

/* Per trainer rank output under construction. */
struct rank_out {
    struct vec tasks, ops, writes, peers, amax;
    struct intern boxes, shapes;
    uint64_t inbox;
    uint64_t send, gather_in, h2d;
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
    struct vec item_comps;
    uint32_t nphases;
    struct balance bal;
    /* pass 3 */
    struct rank_out *ro;  /* [nt] */
    uint32_t next_tag;    /* amax tags, plan-wide */
    uint32_t *gather_seq; /* per mesh */
    bool *phase_coll;     /* per phase: has GATHER/AMAX ops */
    struct {
        uint64_t bytes, writes;
    } * recv; /* [nr * nrollout tensors] */
    uint64_t pieces_by_mode[4];
    uint64_t gathers, amax_ops;
    /* scratch */
    struct vec sub, asg, xc, icomp, ibox, iset, dem, sd;
    size_t demand_cursor;
};

/* plan.c helpers used by emit.c */
const struct wb_mapping *ctx_map(const struct plan_ctx *c, uint32_t m);
const struct wb_component *item_comp(const struct plan_ctx *c, const struct item *it, uint32_t ci);
/* Rank r's shard and replica index of trainer tensor t; false when r is not an owner. */
bool rank_shard(const struct plan_ctx *c, uint32_t t, uint32_t r, uint32_t *shard,
                uint32_t *replica);
/* Rank r's box of trainer tensor t; false when r is not in the owner set. */
bool rank_box(const struct plan_ctx *c, uint32_t t, uint32_t r, struct wb_box *box, uint32_t *shard,
              uint32_t *replica);
/* Subpieces of an item (into c->sub). */
int item_subpieces(struct plan_ctx *c, const struct item *it);
/* Units along which a trainer box may be split, and the sub-box of units [u0, u1). */
uint32_t box_units(const struct plan_ctx *c, const struct wb_mapping *m, const struct wb_box *S,
                   uint32_t *dim, uint64_t *gran);
struct wb_box box_unit_range(const struct wb_box *S, uint32_t dim, uint64_t gran, uint32_t u0,
                             uint32_t u1);
/* D for a sub-box S' of subpiece (S, D). */
struct wb_box map_to_dst(const struct wb_box *S, const struct wb_box *D, const struct wb_box *Sp);
/* Destination bytes of trainer box S under mapping m (values + the scales whose block origin
 * lies in S). */
uint64_t dst_bytes(const struct wb_mapping *m, const struct wb_box *S);
/* Blocks whose origin element lies in S. */
struct wb_box origin_blocks(const struct wb_box *S);

/* Prepares c->icomp/ibox/iset for an item. */
int item_comps_prepare(struct plan_ctx *c, const struct item *it);
/* The boxes of an assignment. */
void asg_boxes(const struct plan_ctx *c, const struct item *it, const struct assign *a,
               struct sd *out);

/* emit.c: builds the tasks of one item from its assignments (c->asg). */
int emit_item(struct plan_ctx *c, uint32_t item_index);

#endif /* WB_PLANNER_BUILD_H */
