/* balance.h — source selection (private to planner/): which owner sends each demand.
 *
 * A demand is a run of bytes one rollout GPU needs that any rank of a candidate set could send
 * (the replicas of a shard in direct mode, the mesh members after a gather). Demands with one
 * candidate are fixed and only add to that rank's base load. The balancer computes
 *  - the lower bound: the smallest T such that the demands can be split among candidates with
 *    no rank above T (parametric max-flow over candidate sets; exact for divisible demands);
 *  - the reference greedy: demands in plan order, each greedy group (one (item, rollout GPU)
 *    in gather mode, one demand otherwise) given whole to its least-loaded candidate;
 *  - its own assignment, phase by phase (phases are separated by barriers, so each should be
 *    balanced on top of the loads of the earlier ones, as the reference balances per mesh
 *    group): the max-flow's per-set quotas filled largest-first, splitting a demand along its
 *    units where a quota ends; then parts are moved off the busiest rank while that lowers the
 *    maximum; the greedy's assignment is kept when it is no worse. */
#ifndef WB_PLANNER_BALANCE_H
#define WB_PLANNER_BALANCE_H

#include "planner/plan_int.h"

struct bal_demand {
    uint64_t bytes;
    uint32_t set;    /* candidate set id */
    uint32_t nunits; /* it may be split at unit boundaries (1: never) */
    uint32_t group;  /* greedy group id: consecutive demands with equal ids go together */
    uint32_t phase;
    uint32_t part0; /* output: parts[part0 .. part0+nparts) */
    uint32_t nparts;
};

/* One assigned piece of a demand: units [u0, u1) go to rank. */
struct bal_part {
    uint32_t rank;
    uint32_t u0, u1;
};

struct balance {
    uint32_t nranks;
    uint32_t nphases;
    uint64_t *base;       /* [nranks] fixed loads */
    uint64_t *pbase;      /* [nphases * nranks] fixed loads per phase */
    struct vec sets;      /* struct bal_set */
    struct vec set_ranks; /* uint32_t, sets' members */
    uint32_t *hash;       /* open addressing over set ids (+1), size hcap */
    size_t hcap;
    struct vec demands; /* struct bal_demand */
    struct vec parts;   /* struct bal_part */
    /* results */
    uint64_t lower_bound, greedy_max, max_load;
    bool used_greedy;
    uint64_t *load; /* [nranks] final loads (estimated from demand bytes) */
};

struct bal_set {
    uint32_t r0, n;
    uint64_t total;  /* bytes of its demands */
    uint64_t ptotal; /* bytes of its demands in the phase being balanced */
    uint64_t hash;
};

int pl_bal_init(struct balance *b, uint32_t nranks, uint32_t nphases);
void pl_bal_free(struct balance *b);
/* Interns a sorted candidate list; returns the set id (>= 0) or -ENOMEM. */
int64_t pl_bal_set(struct balance *b, const uint32_t *ranks, uint32_t n);
/* Adds a demand; a single-candidate set adds to the base load instead and returns 1. */
int pl_bal_add(struct balance *b, uint32_t set, uint64_t bytes, uint32_t nunits, uint32_t group,
               uint32_t phase);
/* Balances. `greedy_only` skips the optimization (the reference alone). */
int pl_bal_solve(struct balance *b, bool greedy_only);

#endif /* WB_PLANNER_BALANCE_H */
