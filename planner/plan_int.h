/* plan_int.h — private declarations shared by the planner's files (layout, placement, plan
 * building, balancing, wire, estimate). Nothing here is API; see planner.h for the contract. */
#ifndef WB_PLAN_INT_H
#define WB_PLAN_INT_H

#include "planner/planner.h"

/* ---------------------------------------------------------------- the plan's private side */

/* What a plan holds beside its public summary: the routing tables ([ntrainers]; a lazy plan's
 * hold only the tasks, gather peers and boxes of stamped items, wb_plan_table() expands the
 * rest from `lazy`) and the lazy plan's segments (NULL unless built with opts.lazy). The
 * public struct is the first member, so a struct wb_plan * of a built plan is one of these. */
struct pl_plan {
    struct wb_plan pub;
    struct wb_route_table *tables;
    struct pl_lazy *lazy;
    struct pl_est_memo *memo; /* NULL: none (estimate.c) */
};

/* The estimate of a plan made while it was built (auto mode simulates its choice where the cost
 * model cannot settle it, a second or more at a thousand rollout GPUs) and what it was made
 * from: the hardware models, the trainers' node size and the plan's cap. The simulation is
 * deterministic, so wb_plan_estimate() of that plan with those hands out a copy instead of
 * simulating again; anything else simulates. */
struct pl_est_memo {
    struct wb_estimate e;
    struct wb_hw th, rh;
    uint32_t gpus_per_node;
    uint64_t mem_cap;
    struct wb_relay relay; /* the shape it simulated */
};
/* Keeps *e (taken over; zeroed) as p's memo for in; without memory *e is freed instead. */
void pl_est_memo_set(struct wb_plan *p, const struct wb_plan_input *in, struct wb_estimate *e);
void pl_est_memo_free(struct wb_plan *p);
/* The estimate of p as if executed under relay shape `shape` (resolved; OFF: no relay), which
 * need not be p's own (relay auto simulates the shapes it chooses among). */
int pl_estimate_relay(const struct wb_plan *p, const struct wb_plan_input *in,
                      const struct wb_relay *shape, struct wb_estimate *out, struct wb_errlist *el);
/* Whether p keeps an estimate for in's hardware under `shape` (pl_estimate_relay then copies). */
bool pl_est_memo_has(const struct wb_plan *p, const struct wb_plan_input *in,
                     const struct wb_relay *shape);
/* relay auto (relay.c): simulates the shapes that can win and records the fastest in p->relay
 * (its estimate kept as p's memo) and what it tried in p->relay_tried. 0 or -ENOMEM. */
int pl_relay_choose(struct wb_plan *p, const struct wb_plan_input *in);
/* wb_relay_verify of p's own relay over every replica (the forest its estimate assumes). */
int pl_relay_verify_plan(const struct wb_plan *p, struct wb_errlist *el);

static inline struct pl_plan *pl_plan_of(const struct wb_plan *p)
{
    return (struct pl_plan *)(uintptr_t)p;
}
/* The plan's own tables, as built (a lazy plan's unexpanded). Readers outside the builder and
 * the lazy expansion take wb_plan_table(); white-box tests reach in here to break a plan. */
static inline struct wb_route_table *pl_tables(const struct wb_plan *p)
{
    return pl_plan_of(p)->tables;
}
static inline struct pl_lazy *pl_lazy_of(const struct wb_plan *p)
{
    return pl_plan_of(p)->lazy;
}

/* ---------------------------------------------------------------- small vectors */

/* A growable array of fixed-size elements. */
struct vec {
    void *p;
    size_t n, cap, elem;
};

static inline void pl_vec_init(struct vec *v, size_t elem)
{
    v->p = NULL;
    v->n = v->cap = 0;
    v->elem = elem;
}
void pl_vec_free(struct vec *v);

/* calloc(n, size) whose pages are written now. For arrays read before they are written
 * (counters, bitmaps): a fresh page read first maps the kernel's zero page, and the first write
 * then takes a second fault and a TLB shootdown across the process's CPUs. */
void *pl_zalloc(size_t n, size_t size);
/* Room for `more` elements; returns 0 or -ENOMEM. */
int pl_vec_reserve(struct vec *v, size_t more);
/* Appends one element (copied from e, or zeroed when e is NULL); returns its address or NULL. */
void *pl_vec_push(struct vec *v, const void *e);
#define VEC_AT(v, T, i) (&((T *)(v)->p)[i])

/* A set of distinct boxes or shapes, each stored once; values are looked up by content. */
struct intern {
    struct vec v;
    uint32_t *hash; /* open addressing, index + 1 */
    size_t cap;
    int err; /* -ENOMEM once an insertion failed */
};

void pl_intern_init(struct intern *in, size_t elem);
void pl_intern_free(struct intern *in);
/* Index of the value (inserted when new); 0 with in->err set on allocation failure. */
uint32_t pl_intern_box(struct intern *in, const struct wb_box *b);
/* Any value of in's element size whose bytes are canonical (padding zeroed). */
uint32_t pl_intern_bytes(struct intern *in, const void *val);
uint32_t pl_intern_shape(struct intern *in, const struct wb_shape *s);

/* Whether a write record fans out to every one of `reps` replicas of `gpr` GPUs from a rank
 * of replica 0: the same bytes reach the same local rank of every replica, so what it brings
 * a receiver is counted (stamp.c) and checked (verify.c) once for all of them. */
static inline bool pl_full_fanout(const struct wb_rt_write *x, uint32_t gpr, uint32_t reps)
{
    return reps > 1 && x->more + 1 == reps && x->rank_step == gpr && x->dst_rank < gpr;
}

/* ---------------------------------------------------------------- problems */

/* One check's problems: the first PL_KEEP go into el with their text, the others are only
 * counted (wb_errlist_drop), so that a plan with a million violations reports the right count
 * in bounded memory. */
enum { PL_KEEP = 20 };
struct pl_problems {
    struct wb_errlist *el;
    size_t n; /* problems found by this check */
};

void pl_problem(struct pl_problems *pp, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Moves every message of src into pp (kept or counted, as pl_problem) and empties src. */
void pl_problems_take(struct pl_problems *pp, struct wb_errlist *src);

/* ---------------------------------------------------------------- placement */

/* Where one trainer tensor lives: the rule that placed it and, per mesh dim, the fixed
 * coordinate (LAYER/EXPERT/INDEX dims) or -1 (REPLICATE/SHARD dims). */
struct tplace {
    int32_t rule;
    int32_t sel[WB_MESH_MAX_DIMS];
};

struct wb_placement_map {
    const struct wb_trainer_layout *tl;
    const struct wb_inventory *inv;
    uint32_t nlayers;
    uint32_t *rule_experts; /* per rule: experts = max {expert} + 1 */
    uint32_t stride[WB_MESH_MAX_DIMS];
    struct tplace *place; /* per trainer tensor */
};

/* Whether a placement kind cuts the tensor into shards (Shard(d), explicit rows). */
bool pl_place_splits(enum wb_place_kind k);
/* Number of ranks in the owner set (product of free dims). */
uint32_t pl_place_nranks(const struct wb_placement_map *pm, const struct tplace *tp);
/* The i-th rank of the set (i < pl_place_nranks), in ascending rank order, with the box it holds,
 * its shard index (mixed radix over SHARD dims) and replica index (over REPLICATE dims). */
uint32_t pl_place_rank(const struct wb_placement_map *pm, const struct tplace *tp,
                       const struct wb_shape *shape, uint32_t i, struct wb_box *box,
                       uint32_t *shard, uint32_t *replica);
/* Number of distinct shards and replicas. */
uint32_t pl_place_nshards(const struct wb_placement_map *pm, const struct tplace *tp);
uint32_t pl_place_nreplicas(const struct wb_placement_map *pm, const struct tplace *tp);
/* Box of shard s, and the rank holding shard s in replica q. */
struct wb_box pl_place_shard_box(const struct wb_placement_map *pm, const struct tplace *tp,
                                 const struct wb_shape *shape, uint32_t s);
uint32_t pl_place_shard_rank(const struct wb_placement_map *pm, const struct tplace *tp, uint32_t s,
                             uint32_t q);
/* Chunk i of n of extent ext under torch.chunk rules: offset and length (length may be 0). */
void pl_chunk_range(uint64_t ext, uint32_t n, uint32_t i, uint64_t *off, uint64_t *len);

/* ---------------------------------------------------------------- rollout locals */

/* Per rollout tensor: the mapping that builds it (value or scale tensor), UINT32_MAX for none;
 * malloc'd, NULL without memory. */
uint32_t *pl_rollout_mapping_of(const struct wb_plan_input *in);
/* The bytes of a rollout rank's local tensor the plan must write: all of it, but for a mapping
 * whose pieces cover less than its local shape (vocab padding rows, a tensor only tp rank 0
 * holds): those start at local byte 0, so the written bytes are a prefix of this length. */
uint64_t pl_local_written(const struct wb_plan_input *in, const uint32_t *map_of,
                          const struct wb_recv_list *rv, const struct wb_rt_local *lo);

/* ---------------------------------------------------------------- helpers */

static inline uint64_t ceil_div(uint64_t a, uint64_t b)
{
    return (a + b - 1) / b;
}

/* FP8 block grid: dims ndim-2 and ndim-1 have blocks of 128 (a 1-d tensor: its only dim);
 * leading dims have blocks of 1. The edge is quant/'s, the only one anything produces. */
static inline uint64_t qblock(uint32_t ndim, uint32_t d)
{
    return (d + 2 >= ndim) ? WB_FP8_BLOCK : 1;
}
/* The blocks a box touches (block coordinates). */
struct wb_box pl_box_blocks(const struct wb_box *b);
/* The elements covered by a box of blocks, clipped to the shape. */
struct wb_box pl_blocks_elems(const struct wb_box *blocks, const struct wb_shape *shape);
/* Block grid shape of a tensor shape. */
struct wb_shape pl_grid_shape(const struct wb_shape *s);

/* ---------------------------------------------------------------- lazy tables (lazy.c) */

/* An item stamped at one rank and left unexpanded (wb_plan_opts.lazy): its ops and write
 * records are its representative's rows at rank `src` (src's own, never lazy, rows
 * ops[op0, op1) and writes[w0, w1)) renumbered, and they come before the table's own rows
 * from at_op and at_w on. The renumbering (stamp.c says why it is exact): trainer tensors by
 * the (from, to) pairs pool[map0 ..][0 .. 2 ntm), interned boxes and shapes by the pairs after
 * them (nbx, then nsh; same is set where the rank is src's, and nothing is renumbered),
 * gather and amax peer lists by a shift (their lists are the table's own), gathers into the
 * item's mesh with ordinals shifted, writes to rollout ranks + dl and tensor vx -> vy (any
 * other: the scale tensor sy). */
struct pl_seg {
    uint32_t at_task, ntask, task0; /* its tasks: the table's [at_task, +ntask), src's from task0 */
    uint32_t at_op, at_w, at_a, at_x;
    uint32_t src, op0, op1, w0, w1, a0, a1; /* a: amax expectations (tags + tag_shift) */
    /* amax peers: src's rows x0 .. x1 (its ops' peer0 count xsrc more), ranks + dr, tags +
     * tag_shift, own inbox offsets + inbox_shift, the peers' + the shift in the pool's
     * (rank, low, high) triples at pool[dpos0 ..][0 .. 3 ndpos) for the peer's (source) rank */
    uint32_t x0, x1, xsrc, dpos0, ndpos;
    int32_t dr;
    uint64_t inbox_shift;
    uint32_t map0, ntm, nbx, nsh;
    bool same;
    uint32_t pshift, xshift, seq_shift, mesh;
    uint32_t tag_shift; /* its amax peers' tags (the table's own) are the source's + this */
    bool gathers;       /* it may have GATHER ops */
    int32_t dl;
    uint32_t vx, vy, sy;
};

/* A lazy plan's per-table segments, in table order, their pools, and the counts expanded. */
struct pl_lazy_table {
    struct pl_seg *seg;
    uint32_t nseg;
    uint32_t *pool;
    uint32_t nops, nwrites, namax, napeers;
};
struct pl_lazy {
    struct pl_lazy_table *t; /* [ntrainers] */
};

/* A segment's ops and records: n source rows renumbered into out. */
void pl_seg_ops(const struct pl_seg *sg, const uint32_t *pool, const struct wb_rt_op *src,
                uint32_t n, struct wb_rt_op *out);
void pl_seg_writes(const struct pl_seg *sg, const uint32_t *pool, const struct wb_rt_write *src,
                   uint32_t n, struct wb_rt_write *out);
/* Where a task's ops and records are without expanding anything: its own rows, or (seg set)
 * its representative's in the table `rows` (whose boxes and shapes equal the renumbered ones),
 * to be read through seg's renumbering (pl_seg_ops) where it matters. Walk a table's tasks in
 * order from a zeroed cursor with pl_task_rows(). */
struct pl_rows {
    const struct wb_route_table *rows;
    const struct wb_rt_op *ops;
    const struct wb_rt_write *writes;
    const struct pl_seg *seg;
    uint32_t xoff; /* an op's amax peers are rows->amax_peers[peer0 - xoff ..] (own rows) */
};
struct pl_cursor {
    uint32_t seg, vops, vwrites, vapeers; /* next segment; rows of the segments passed */
};
void pl_task_rows(const struct wb_plan *p, uint32_t r, uint32_t k, struct pl_cursor *cu,
                  struct pl_rows *out);
/* A segment's amax peers: n source rows renumbered. */
void pl_seg_apeers(const struct pl_seg *sg, const uint32_t *pool, const struct wb_rt_amax_peer *src,
                   uint32_t n, struct wb_rt_amax_peer *out);
/* A segment's amax expectations: n source rows with its tag shift. */
void pl_seg_amax(const struct pl_seg *sg, const struct wb_rt_expect *src, uint32_t n,
                 struct wb_rt_expect *out);
/* A segment's renumbering of one box index (gather peers' boxes). */
uint32_t pl_seg_box(const struct pl_seg *sg, const uint32_t *pool, uint32_t b);
/* wb_plan_table(), expanding only the write records when !ops (then the table has no ops and
 * no amax peers or expectations). */
const struct wb_route_table *pl_plan_table(const struct wb_plan *p, uint32_t r,
                                           struct wb_plan_tbuf *buf, bool ops);
/* Rank r's op and amax peer counts once expanded. */
uint32_t pl_table_nops(const struct wb_plan *p, uint32_t r);
uint32_t pl_table_napeers(const struct wb_plan *p, uint32_t r);
void pl_lazy_free(struct pl_lazy *lz, uint32_t ntables);

/* verify's destination check in work per write record where the rollout replicas are
 * congruent (verify_dest.c): 1 when every byte of every replica's local tensors is shown
 * written exactly once, 0 when it cannot show that (the exact check then runs and names the
 * problems), or -ENOMEM. */
int pl_verify_dest_fast(const struct wb_plan *p, const struct wb_plan_input *in);

/* wb_plan_verify, on the calling thread alone unless `threads` (then on up to three). */
int pl_verify(const struct wb_plan *p, const struct wb_plan_input *in, struct wb_errlist *el,
              bool threads);

#endif /* WB_PLAN_INT_H */
