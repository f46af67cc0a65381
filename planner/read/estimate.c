/* estimate.c — wb_plan_estimate(): a discrete-time simulation of executing a plan.
 *
 * The model (also in the README):
 *  - each trainer GPU runs its tasks in table order through FIFO stages, as the executor does:
 *    admission under the memory cap (a task larger than the cap runs alone here; a plan to be
 *    executed has none: wb_plan_check_cap, opts.fit_cap) -> H2D copy engine
 *    (h2d_Bps) -> collectives (GATHER: an all-gather among the shard peers, which starts when
 *    every peer reached it; over NVLink at nvlink_Bps when all peers share a node, else as
 *    ring flows through the NICs; AMAX: a rendezvous with the peer plus one collective launch)
 *    -> GPU stream (copies at copy_Bps, quantization at quant_Bps, kernel_s per op) -> CPU
 *    (one thread: kernel_s per op launched, gather_s per collective, write_submit_s per write
 *    per NIC stripe for writes of 64 KiB or more, one post otherwise) -> network;
 *  - the network is fluid: every (sender, receiver) pair is a FIFO of byte chunks; each step
 *    the NIC egress of every GPU (nic_gbps x nics x efficiency) and the ingress of every GPU
 *    are shared max-min fairly among their active pairs (water-filling);
 *  - phases with barrier_after: no task of the next phase starts before every rank passed its
 *    last collective of the phase and barrier_s elapsed; writes of earlier phases go on;
 *  - a task's memory is freed when its last byte arrived.
 * Not modelled: PCIe contention between H2D and NIC reads, NVLink contention between
 * concurrent gathers, switch/fabric congestion, stragglers, the controller's messages. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "planner/plan_int.h"

enum { MAX_STEPS = 4000000 };

struct chunk {
    uint32_t task; /* index into tasks, or gather instance | GATHER_BIT, or RELAY_TASK */
    uint32_t flow; /* a task's: its flow (sim.flow) */
    uint64_t left, bytes;
};

/* A chunk a relaying rollout forwards to a child: one piece of what was placed there. */
enum { RELAY_TASK = UINT32_MAX };
/* A relay forwards what was placed a piece at a time, as the agent does: the trainers' writes
 * to a relaying rank and its own forwards announce each piece of at most a quarter of the
 * transport's inflight_bytes (16 MiB by default); under a relay a flow is posted as chunks of
 * at most that. */
enum { RELAY_PIECE = 4 << 20 };

struct pair {
    uint32_t src, dst; /* node ids: trainers, then rollouts */
    uint32_t w, step;  /* copies: the same bytes to dst + k * step, k < w (replica fan-out) */
    uint32_t cls;      /* w > 1: its receivers' class (sim.cls) */
    struct vec q;      /* struct chunk FIFO */
    size_t head;
    double rate;
    uint64_t left; /* bytes queued */
    bool active;
    /* Lazy delivery: left and the head chunk are as at the start of step `upd`; until its
     * event step nothing happens to the pair but (uint64_t)rate bytes a step. */
    uint64_t upd, ev;
    uint32_t ver;  /* its entries in the event heap with another version are stale */
    uint32_t apos; /* its position in the active list (an entry elsewhere is a leftover) */
    uint64_t due;  /* step + 1 when it is on that step's due list */
    double prev;   /* its share before the last water-fill */
    bool sched;    /* has had a share: it is eager or has an event (or none to have) */
    bool eager;    /* delivered every step (no event) */
};

/* An event: at step `ev` a pair's head chunk completes or it comes near its end. */
struct pev {
    uint64_t ev;
    uint32_t pair, ver;
};

struct etask {
    uint32_t rank, phase, ncoll, ninst, nflow, f0;
    uint32_t nlaunch; /* collective ops (an AMAX op has a ref per peer, one launch) */
    uint64_t tmp, write_bytes, h2d_bytes, quant_bytes, gather_bytes;
    double h2d_s, gpu_s, submit_s;
    uint32_t c0;      /* collectives at est.coll[c0 .. c0+ncoll) */
    uint32_t pending; /* chunks not yet delivered */
    double t_start, t_end;
    bool started, done;
};

/* A gather instance (its members), or an amax rendezvous (the ops with one tag). A task's
 * collectives are refs: a gather instance's index, or AMX_REF | tag. */
struct inst {
    uint32_t n, arrived, nflows;
    uint64_t bytes_in; /* max over members */
    bool nvlink, started;
    double t_done; /* NVLink: known at start; network: when the last flow lands */
    uint32_t f0;   /* network gathers: ring flows at sim.rflow[f0 .. f0+n) */
};

struct amx {
    uint16_t n, arrived;
    uint32_t start; /* 1 + the step the last arrival started it in; 0: not started. It ends
                       gather_s after that step's start (sim.tstep): 8 bytes, not 16, for 10^7
                       rendezvous at 1024 -> 512 */
};

/* AMX_MORE marks a ref that belongs to the same AMAX op as the one before it: a rank arrives
 * at every exchange of an op at once (it sends its partial to all its peers), then waits for
 * each. */
enum { AMX_REF = 1u << 31, AMX_MORE = 1u << 30, AMX_TAG = AMX_MORE - 1 };

struct rflow {
    uint32_t inst, src, dst;
    uint64_t bytes;
};

struct rank_state {
    uint32_t t0, nt;                     /* its tasks */
    uint32_t admit, h2d, coll, gpu, sub; /* next task index per stage (relative) */
    double h2d_left, gpu_left, sub_left; /* seconds of work left on the current task */
    uint32_t coll_k;                     /* next collective of the current coll task */
    bool coll_arrived;
    const struct amx *blk; /* the amax rendezvous it arrived at and waits on, or NULL */
    uint64_t mem;
    uint32_t running;    /* admitted, not done */
    uint32_t wait_phase; /* the next task to admit, as admission needs it (its etask is far) */
    uint64_t wait_tmp;
    double busy_h2d, busy_gpu, busy_sub, wait_coll, busy_coll;
    double end;
};

/* The receivers dst + k * step, k < w, of a pair with copies. */
struct ckey {
    uint32_t dst, w, step;
};

/* A task's bytes to one rollout rank and its copies (replica fan-out), per copy. */
struct eflow {
    uint32_t dst, w, step;
    uint64_t bytes;
};

struct sim {
    bool shares_stale;         /* a pair started or ended since the shares were computed */
    uint64_t step;             /* the step being simulated (its rank stages, then net_step) */
    struct vec heap;           /* struct pev: min-heap by (ev, pair) */
    struct vec due;            /* uint64_t: the pairs that do something in this step */
    struct vec eagerl;         /* uint32_t: the eager pairs (and some that ended or were not) */
    double sum_tr, sum_gather; /* bytes a step all active pairs move, at the current shares */
    const struct wb_plan *p;
    uint32_t nt, nr, nphases;
    struct etask *task;
    size_t ntask;
    uint32_t *coll; /* per task collective refs */
    struct inst *inst;
    size_t ninst, icap;
    struct intern gkeys; /* gather instances by (mesh, seq, first peer): uint64_t keys */
    struct amx *amx;     /* by tag */
    struct vec tstep;    /* double: each step's start time */
    size_t namx;
    struct rank_state *rs;
    struct pair *pair;
    size_t npair, cpair;
    uint32_t *phash;
    size_t hcap;
    struct eflow *flow;  /* per task flows */
    struct rflow *rflow; /* ring flows of network gathers */
    size_t nrflow;
    uint32_t *last_coll;      /* per rank and phase: relative index of the last task of the phase
                                 (+1), 0 when the rank has none */
    double *egress, *ingress; /* bytes/s per node */
    uint32_t *act;            /* active pair indices */
    uint32_t *want;           /* water_fill: the pairs still wanting more (cact of room) */
    struct wfp {              /* water_fill: the active pairs' fields it uses, in list order */
        uint32_t src, dst, w, cls;
        double left, rate, give;
    } * wf; /* [cact] */
    size_t nact, cact;
    double *eleft, *ileft; /* per node, per step */
    uint64_t t_fill;       /* time spent water-filling, for the debug log */
    size_t nfill;
    /* Receiver classes: the receivers of pairs with copies (dst + k * step, k < w), interned
     * (struct ckey). Pairs of one class share their receivers, so a water-fill round takes
     * their least share once per class, not once per pair. */
    struct intern ckeys;
    struct rcls {
        uint32_t count; /* pairs of the class wanting more this round */
        double imin;    /* least ileft (then least share) over the receivers */
        double sub;     /* given this round, per receiver */
    } * cls;            /* [ccap], by class */
    size_t ccap;
    uint32_t *nout, *nin;
    double *rollout_end; /* per rollout GPU: its last byte */
    size_t ndone;
    /* Relay (wb_plan.relay, or the shape auto simulates): the forest over every replica; a
     * trainer writes only copies to a root replica's ranks, and what is placed at a relaying
     * rank is forwarded, as the agent does, to the same local rank of each child replica a
     * piece at a time (RELAY_PIECE; queued in rq while the step delivers, posted after it). */
    bool relay;
    const bool *member; /* [replicas]: the attempt's member set (NULL: every replica) */
    uint32_t gpr, nrep;
    uint32_t *rparent;   /* [nrep]: WB_RELAY_ROOT or the parent replica */
    uint32_t *rkid0;     /* [nrep + 1]: replica j's children at rkids[rkid0[j] .. rkid0[j+1]) */
    uint32_t *rkids;     /* [nrep] */
    struct vec rq;       /* struct rpost: forwards to post after the step */
    uint64_t relay_left; /* relay chunks posted and not yet delivered */
    bool rq_err;
    double *barrier_done; /* per phase */
    uint32_t *phase_left; /* ranks not yet past the phase's last collective */
    double *arrive;       /* per phase: latest arrival */
    /* a delta update's model (wb_plan_estimate_delta), or NULL */
    const struct delta_model *delta;
};

struct delta_model;
static uint64_t delta_write_len(const struct delta_model *dm, const struct wb_rt_write *x,
                                double *gpu_s);

/* ---------------------------------------------------------------- pairs */

static size_t pair_hash(uint32_t a, uint32_t b, uint32_t w, uint32_t step, size_t cap)
{
    uint64_t key = ((uint64_t)a << 32 | b) ^ ((uint64_t)w << 48) ^ ((uint64_t)step << 24);
    return (size_t)((key * 0x9E3779B97F4A7C15ull) >> 20) & (cap - 1);
}

static uint32_t class_of(struct sim *s, uint32_t dst, uint32_t w, uint32_t step);

static struct pair *get_pair(struct sim *s, uint32_t a, uint32_t b, uint32_t w, uint32_t step)
{
    if (w <= 1)
        w = 1, step = 0;
    size_t h = pair_hash(a, b, w, step, s->hcap);
    while (s->phash[h]) {
        struct pair *p = &s->pair[s->phash[h] - 1];
        if (p->src == a && p->dst == b && p->w == w && p->step == step)
            return p;
        h = (h + 1) & (s->hcap - 1);
    }
    if (s->npair + 1 >= s->hcap / 2) {
        size_t cap = s->hcap * 2;
        uint32_t *nh = pl_zalloc(cap, sizeof(uint32_t)); /* probed before written */
        if (!nh)
            return NULL;
        for (size_t i = 0; i < s->npair; i++) {
            const struct pair *q = &s->pair[i];
            size_t j = pair_hash(q->src, q->dst, q->w, q->step, cap);
            while (nh[j])
                j = (j + 1) & (cap - 1);
            nh[j] = (uint32_t)i + 1;
        }
        free(s->phash);
        s->phash = nh;
        s->hcap = cap;
        return get_pair(s, a, b, w, step);
    }
    uint32_t cls = w > 1 ? class_of(s, b, w, step) : UINT32_MAX;
    if (w > 1 && cls == UINT32_MAX)
        return NULL;
    if (s->npair == s->cpair) {
        size_t c = s->cpair ? s->cpair * 2 : 1024;
        struct pair *np = realloc(s->pair, c * sizeof(*np));
        if (!np)
            return NULL;
        s->pair = np;
        s->cpair = c;
    }
    struct pair *p = &s->pair[s->npair++];
    memset(p, 0, sizeof(*p));
    p->src = a;
    p->dst = b;
    p->w = w;
    p->step = step;
    p->cls = cls;
    pl_vec_init(&p->q, sizeof(struct chunk));
    s->phash[h] = (uint32_t)s->npair;
    return p;
}

/* ---------------------------------------------------------------- lazy delivery */

/* Brings a pair to the start of step k: no chunk of it completed in between (its event step
 * is k or later), so each step took (uint64_t)rate bytes off its head chunk. */
static void materialize(struct sim *s, struct pair *p, uint64_t k)
{
    if (p->upd >= k)
        return;
    uint64_t d = (k - p->upd) * (uint64_t)p->rate;
    if (p->head < p->q.n && d) {
        VEC_AT(&p->q, struct chunk, p->head)->left -= d;
        p->left -= d;
    }
    p->upd = k;
    (void)s;
}

/* The first j >= 0 with !(x - j*R > lim) (as doubles), or UINT64_MAX when none. */
static uint64_t first_step(uint64_t x, uint64_t R, double lim)
{
    if (!((double)x > lim))
        return 0;
    if (R == 0)
        return UINT64_MAX;
    double est = ((double)x - lim) / (double)R;
    uint64_t j = est > 0 ? (uint64_t)est : 0;
    if (j > x / R)
        j = x / R;
    while (j > 0 && !((double)(x - (j - 1) * R) > lim))
        j--;
    while (j <= x / R && (double)(x - j * R) > lim)
        j++;
    return j <= x / R ? j : UINT64_MAX;
}

static bool pev_less(const struct pev *a, const struct pev *b)
{
    return a->ev < b->ev || (a->ev == b->ev && a->pair < b->pair);
}

static void sift_down(struct pev *h, size_t n, size_t i)
{
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < n && pev_less(&h[l], &h[m]))
            m = l;
        if (r < n && pev_less(&h[r], &h[m]))
            m = r;
        if (m == i)
            return;
        struct pev x = h[m];
        h[m] = h[i];
        h[i] = x;
        i = m;
    }
}

static int heap_push(struct sim *s, struct pev e)
{
    if (!pl_vec_push(&s->heap, &e))
        return -ENOMEM;
    struct pev *h = s->heap.p;
    size_t i = s->heap.n - 1;
    while (i > 0) {
        size_t up = (i - 1) / 2;
        if (h[up].ev < h[i].ev || (h[up].ev == h[i].ev && h[up].pair <= h[i].pair))
            break;
        struct pev x = h[up];
        h[up] = h[i];
        h[i] = x;
        i = up;
    }
    return 0;
}

static struct pev heap_pop(struct sim *s)
{
    struct pev *h = s->heap.p, top = h[0];
    h[0] = h[--s->heap.n];
    sift_down(h, s->heap.n, 0);
    return top;
}

/* A materialized pair's next event: its head chunk completes (the step moves no more than it
 * has left, +0.5) or it comes within two steps' share of its end (the shares must then be
 * computed again: it may cap its own). */
static int schedule(struct sim *s, struct pair *p)
{
    uint64_t R = (uint64_t)p->rate, j = UINT64_MAX;
    if (p->head < p->q.n) {
        j = first_step(VEC_AT(&p->q, struct chunk, p->head)->left, R, p->rate + 0.5);
        /* for a whole number of bytes x, x < c exactly when !(x > ceil(c) - 1) */
        uint64_t js = first_step(p->left, R, ceil(2 * p->rate + 1) - 1);
        j = js < j ? js : j;
    }
    p->ver++;
    if (j == UINT64_MAX) {
        p->ev = UINT64_MAX;
        return 0;
    }
    p->ev = p->upd + j;
    return heap_push(s, (struct pev){p->ev, (uint32_t)(p - s->pair), p->ver});
}

/* The receiver class of (dst, w, step), made on first use; UINT32_MAX: no memory. */
static uint32_t class_of(struct sim *s, uint32_t dst, uint32_t w, uint32_t step)
{
    struct ckey k = {dst, w, step};
    uint32_t c = pl_intern_bytes(&s->ckeys, &k);
    if (s->ckeys.err)
        return UINT32_MAX;
    if (c >= s->ccap) {
        size_t n = s->ccap ? 2 * s->ccap : 64;
        struct rcls *nc = realloc(s->cls, n * sizeof(*nc));
        if (!nc)
            return UINT32_MAX;
        memset(nc + s->ccap, 0, (n - s->ccap) * sizeof(*nc));
        s->cls = nc;
        s->ccap = n;
    }
    return c;
}

/* Queues `bytes` (per copy) from node a to node b and its copies. */
static int post(struct sim *s, uint32_t a, uint32_t b, uint32_t w, uint32_t step, uint32_t id,
                uint32_t flow, uint64_t bytes)
{
    struct pair *p = get_pair(s, a, b, w, step);
    if (!p)
        return -ENOMEM;
    if (p->active)
        materialize(s, p, s->step);
    if (p->active && (double)p->left < 2 * p->rate + 1)
        s->shares_stale = true; /* its share may have been capped by what it had left */
    struct chunk c = {id, flow, bytes, bytes};
    if (!pl_vec_push(&p->q, &c))
        return -ENOMEM;
    p->left += bytes;
    /* an active pair keeps its event: its head chunk is the same, and with more left it comes
     * near its end later, so the event is on time or early (then it is only looked at) */
    if (!p->active) {
        p->upd = s->step;
        p->sched = false;
        if (s->nact == s->cact) {
            size_t c = s->cact ? 2 * s->cact : 1024;
            uint32_t *na = realloc(s->act, c * sizeof(uint32_t));
            if (!na)
                return -ENOMEM;
            s->act = na;
            uint32_t *nw = realloc(s->want, c * sizeof(uint32_t));
            if (!nw)
                return -ENOMEM;
            s->want = nw;
            struct wfp *nf = realloc(s->wf, c * sizeof(*nf));
            if (!nf)
                return -ENOMEM;
            s->wf = nf;
            s->cact = c;
        }
        p->apos = (uint32_t)s->nact;
        s->act[s->nact++] = (uint32_t)(p - s->pair);
        s->shares_stale = true;
    }
    p->active = true;
    return 0;
}

/* ---------------------------------------------------------------- setup */

static uint64_t op_box_bytes(const struct wb_route_table *t, uint32_t box, enum wb_dtype dt)
{
    return wb_box_numel(&t->boxes[box]) * wb_dtype_size(dt);
}

/* Makes room for amax tag `tag` (doubling). */
static int amx_room(struct sim *s, uint32_t tag)
{
    if (tag < s->namx)
        return 0;
    if (tag > AMX_TAG)
        return -E2BIG;
    while (s->namx <= tag) {
        size_t old = s->namx;
        if (wb_grow(&s->amx, &s->namx, 1024, sizeof(*s->amx)))
            return -ENOMEM;
        memset(s->amx + old, 0, (s->namx - old) * sizeof(*s->amx));
    }
    return 0;
}

/* The instance of a gather op keyed by (mesh, seq, first peer), made on first sight
 * (instances are numbered as their keys are interned). */
static int gather_inst(struct sim *s, uint64_t key, uint32_t *id)
{
    *id = pl_intern_bytes(&s->gkeys, &key);
    if (s->gkeys.err)
        return -ENOMEM;
    if (*id < s->ninst)
        return 0;
    if (s->ninst == s->icap) {
        size_t old = s->icap;
        if (wb_grow(&s->inst, &s->icap, 1024, sizeof(*s->inst)))
            return -ENOMEM;
        memset(s->inst + old, 0, (s->icap - old) * sizeof(*s->inst));
    }
    s->ninst++;
    return 0;
}

/* The copies of record x the trainers write under a relay: those to root replicas, which in
 * the forest over every replica are its first ones (a record's copies go to rising ranks). */
static uint32_t relay_copies(const struct sim *s, const struct wb_rt_write *x)
{
    uint32_t n = 0, nc = wb_rt_copies(x);
    while (n < nc) {
        uint32_t d = wb_rt_copy_rank(x, n);
        if (d >= s->nr || s->rparent[d / s->gpr] != WB_RELAY_ROOT)
            break;
        n++;
    }
    return n;
}

/* A reader of the tables: ranks [r0, r1). It writes their tasks in place, their collective
 * refs from each rank's op base on (a rank has no more refs than ops), and their flows into
 * its own vector (f0 relative to it). A parallel reader stops at a gather (gathers share a
 * hash) or at a tag past the rendezvous array; the caller then reads everything again alone. */
struct reader {
    struct sim *s;
    const struct wb_plan_input *in;
    struct vec *rflows;          /* NULL for a parallel reader */
    const size_t *tbase, *obase; /* per rank: first task, first collective ref (plan-wide) */
    uint32_t r0, r1;
    struct vec flow;
    uint32_t *seen; /* dst -> flow + 1 */
    bool stop;
    int err;
    /* two passes (parallel readers of a lazy plan): the first reads every task but the stamped
     * ones (ending each rank's collective refs at cend[r]), the second makes each stamped task
     * from its representative's (flows from flow_a, the first pass's, merged) */
    bool two_pass, second;
    size_t *cend;
    const struct eflow *flow_a;
    struct wb_plan_tbuf tb; /* one pass over a lazy plan: each table expanded */
};

/* One op of table t (its amax peers at t->amax_peers[peer0 - xoff ..]). */
static int read_op(struct reader *rd, const struct wb_route_table *t, uint32_t r,
                   const struct wb_rt_op *op, uint32_t xoff, struct etask *e, size_t *ci)
{
    struct sim *s = rd->s;
    const struct wb_hw *hw = &rd->in->tl->hw;
    switch (op->kind) {
    case WB_OP_H2D:
        e->h2d_bytes += op->h2d.bytes;
        return 0;
    case WB_OP_COPY:
    case WB_OP_CAST:
        e->gpu_s += hw->kernel_s +
                    (double)op_box_bytes(t, op->copy.src_box, op->copy.src.dtype) / hw->copy_Bps;
        return 0;
    case WB_OP_PERMUTE: /* costed as a copy: a tiled transpose reads and writes once */
        e->gpu_s +=
            hw->kernel_s +
            (double)op_box_bytes(t, op->permute.src_box, op->permute.src.dtype) / hw->copy_Bps;
        return 0;
    case WB_OP_QUANT: {
        uint64_t b = op_box_bytes(t, op->quant.src_box, op->quant.src.dtype);
        e->quant_bytes += b;
        e->gpu_s += hw->kernel_s + (double)b / hw->quant_Bps;
        return 0;
    }
    case WB_OP_AMAX: {
        for (uint32_t k = 0; k < op->amax.npeers; k++) {
            uint32_t tag = t->amax_peers[op->amax.peer0 - xoff + k].tag;
            if (!rd->rflows) { /* parallel: the array must be there, counts are atomic */
                if (tag >= s->namx) {
                    rd->stop = true;
                    return 0;
                }
                if (__atomic_load_n(&s->amx[tag].n, __ATOMIC_RELAXED) < UINT16_MAX)
                    __atomic_fetch_add(&s->amx[tag].n, 1, __ATOMIC_RELAXED);
            } else {
                int err = amx_room(s, tag);
                if (err)
                    return err;
                if (s->amx[tag].n < UINT16_MAX)
                    s->amx[tag].n++;
            }
            s->coll[(*ci)++] = AMX_REF | (k ? AMX_MORE : 0) | tag;
            e->ncoll++;
        }
        e->nlaunch++;
        return 0;
    }
    case WB_OP_GATHER:
        break;
    }
    if (!rd->rflows) {
        rd->stop = true;
        return 0;
    }
    uint64_t key = ((uint64_t)op->gather.mesh << 40) ^ ((uint64_t)op->gather.seq << 20) ^
                   t->peers[op->gather.peer0].rank ^ (1ull << 63);
    uint32_t id;
    int err = gather_inst(s, key, &id);
    if (err)
        return err;
    struct inst *in2 = &s->inst[id];
    in2->n++;
    e->gather_bytes += op->gather.bytes_in;
    if (op->gather.bytes_in > in2->bytes_in)
        in2->bytes_in = op->gather.bytes_in;
    uint32_t gpn = rd->in->tl->gpus_per_node;
    bool same = true;
    uint32_t node = r / gpn, prev = r, np = op->gather.npeers;
    for (uint32_t q = 0; q < np; q++) {
        uint32_t pr = t->peers[op->gather.peer0 + q].rank;
        same &= pr / gpn == node;
        if (pr == r)
            prev = t->peers[op->gather.peer0 + (q + np - 1) % np].rank;
    }
    in2->nvlink = same;
    /* ring all-gather: each member receives its missing bytes from the previous member */
    if (!same && op->gather.bytes_in) {
        struct rflow rf = {id, prev, r, op->gather.bytes_in};
        if (!pl_vec_push(rd->rflows, &rf))
            return -ENOMEM;
    }
    s->coll[(*ci)++] = id;
    e->ncoll++;
    e->nlaunch++;
    return 0;
}

/* Second pass: stamped task ti of rank r from its representative's, already read (the same
 * ops and records but for the amax tags, shifted, and the destinations, + dl). */
static void read_stamped(struct reader *rd, const struct pl_rows *R, uint32_t k, size_t ti,
                         size_t *ci)
{
    struct sim *s = rd->s;
    const struct pl_seg *sg = R->seg;
    const struct etask *x = &s->task[rd->tbase[sg->src] + sg->task0 + (k - sg->at_task)];
    struct etask *e = &s->task[ti];
    e->ncoll = x->ncoll;
    e->ninst = x->ninst;
    e->nlaunch = x->nlaunch;
    e->h2d_bytes = x->h2d_bytes;
    e->quant_bytes = x->quant_bytes;
    e->gather_bytes = x->gather_bytes;
    e->h2d_s = x->h2d_s;
    e->gpu_s = x->gpu_s;
    e->submit_s = x->submit_s;
    e->c0 = (uint32_t)*ci;
    for (uint32_t c = 0; c < x->ncoll; c++) {
        uint32_t ref = s->coll[x->c0 + c], tag = (ref & AMX_TAG) + sg->tag_shift;
        if (!(ref & AMX_REF) || tag >= s->namx || tag > AMX_TAG) {
            rd->stop = true; /* read again alone */
            return;
        }
        if (__atomic_load_n(&s->amx[tag].n, __ATOMIC_RELAXED) < UINT16_MAX)
            __atomic_fetch_add(&s->amx[tag].n, 1, __ATOMIC_RELAXED);
        s->coll[(*ci)++] = (ref & ~AMX_TAG) | tag;
    }
    e->f0 = (uint32_t)rd->flow.n;
    for (uint32_t f = x->f0; f < x->f0 + x->nflow; f++) {
        struct eflow nf = rd->flow_a[f];
        nf.dst = (uint32_t)((int64_t)nf.dst + sg->dl);
        if (!pl_vec_push(&rd->flow, &nf)) {
            rd->err = -ENOMEM;
            return;
        }
    }
    e->nflow = x->nflow;
}

static void *read_ranks(void *arg)
{
    struct reader *rd = arg;
    struct sim *s = rd->s;
    const struct wb_plan *p = s->p;
    const struct wb_hw *hw = &rd->in->tl->hw;
    for (uint32_t r = rd->r0; r < rd->r1 && !rd->err && !rd->stop; r++) {
        /* a lazy plan's stamped tasks are read in their representative's rows (same boxes),
         * their collectives and records renumbered */
        const struct wb_route_table *t = &pl_tables(p)[r];
        bool whole = pl_lazy_of(p) && !rd->two_pass; /* read in one pass: the table expanded */
        if (whole && !(t = wb_plan_table(p, r, &rd->tb))) {
            rd->err = -ENOMEM;
            break;
        }
        struct pl_cursor cu = {0};
        size_t ti = rd->tbase[r], ci = rd->second ? rd->cend[r] : rd->obase[r];
        s->rs[r].t0 = (uint32_t)ti;
        s->rs[r].nt = t->ntasks;
        for (uint32_t k = 0; k < t->ntasks && !rd->err && !rd->stop; k++, ti++) {
            const struct wb_rt_task *T = &t->tasks[k];
            struct pl_rows R;
            if (whole)
                R = (struct pl_rows){t, t->ops + T->op0, t->writes + T->write0, NULL, 0};
            else
                pl_task_rows(p, r, k, &cu, &R);
            if (rd->second) {
                if (R.seg)
                    read_stamped(rd, &R, k, ti, &ci);
                continue;
            }
            struct etask *e = &s->task[ti];
            e->rank = r;
            e->phase = T->phase;
            e->tmp = T->tmp_bytes;
            e->write_bytes = T->write_bytes;
            if (R.seg)
                continue; /* the second pass makes it */
            e->c0 = (uint32_t)ci;
            /* the rendezvous are far apart in memory: asked for ahead */
            for (uint32_t o = 0; o < T->nops; o++)
                for (uint32_t k = 0; R.ops[o].kind == WB_OP_AMAX && k < R.ops[o].amax.npeers; k++) {
                    uint32_t tag = t->amax_peers[R.ops[o].amax.peer0 - R.xoff + k].tag;
                    if (tag < s->namx)
                        __builtin_prefetch(&s->amx[tag], 1);
                }
            for (uint32_t o = 0; o < T->nops && !rd->err && !rd->stop; o++)
                rd->err = read_op(rd, t, r, &R.ops[o], R.xoff, e, &ci);
            e->h2d_s = (double)e->h2d_bytes / hw->h2d_Bps;
            /* flows: bytes per destination (writes are grouped per destination rank) */
            size_t f0 = rd->flow.n;
            e->f0 = (uint32_t)f0;
            uint32_t posts = 0;
            uint64_t relay_bytes = 0;
            for (uint32_t w = 0; w < T->nwrites; w++) {
                const struct wb_rt_write *x = &R.writes[w];
                uint32_t g = x->dst_rank < p->nrollouts ? x->dst_rank : p->nrollouts;
                uint32_t f = rd->seen[g], nc = wb_rt_copies(x), step = nc > 1 ? x->rank_step : 0;
                if (s->relay && (nc = relay_copies(s, x)) == 0)
                    continue; /* to relayed replicas only: their parents write them */
                step = nc > 1 ? x->rank_step : 0;
                relay_bytes += x->len * nc;
                struct eflow *F = rd->flow.p;
                if (f <= f0 || f > rd->flow.n || F[f - 1].dst != x->dst_rank || F[f - 1].w != nc ||
                    F[f - 1].step != step) {
                    struct eflow nf = {x->dst_rank, nc, step, 0};
                    if (!pl_vec_push(&rd->flow, &nf)) {
                        rd->err = -ENOMEM;
                        break;
                    }
                    rd->seen[g] = f = (uint32_t)rd->flow.n;
                }
                /* a delta update sends a payload instead where it is cheaper */
                uint64_t len = s->delta ? delta_write_len(s->delta, x, &e->gpu_s) : x->len;
                VEC_AT(&rd->flow, struct eflow, f - 1)->bytes += len;
                posts += nc * (len >= (64u << 10) ? (uint32_t)hw->nics_per_gpu : 1);
            }
            e->nflow = (uint32_t)(rd->flow.n - f0);
            if (s->relay)
                e->write_bytes = relay_bytes;
            /* the executor's one CPU thread launches the task's GPU ops and collectives and
             * posts its writes: all of that is CPU time on the rank's critical path */
            e->submit_s =
                posts * hw->write_submit_s + T->nops * hw->kernel_s + e->nlaunch * hw->gather_s;
        }
        if (rd->cend && !rd->second)
            rd->cend[r] = ci;
    }
    return NULL;
}

/* Runs the two readers side by side; false when the second thread could not start. */
static bool run_readers(struct reader *rd)
{
    pthread_t th;
    if (pthread_create(&th, NULL, read_ranks, &rd[1]))
        return false;
    read_ranks(&rd[0]);
    pthread_join(th, NULL);
    return true;
}

/* The flows, the second reader's after the first's (tasks from t1 on are the second's). */
static int merge_flows(struct sim *s, const struct reader *rd, size_t t1)
{
    size_t n0 = rd[0].flow.n, n1 = rd[1].flow.n;
    free(s->flow);
    s->flow = malloc((n0 + n1 + 1) * sizeof(*s->flow));
    if (!s->flow)
        return -ENOMEM;
    if (n0)
        memcpy(s->flow, rd[0].flow.p, n0 * sizeof(struct eflow));
    if (n1) {
        memcpy(s->flow + n0, rd[1].flow.p, n1 * sizeof(struct eflow));
        for (size_t i = t1; i < s->ntask; i++)
            s->task[i].f0 += (uint32_t)n0;
    }
    return 0;
}

/* Appends the second pass's flows (each reader's stamped tasks count theirs from 0). */
static int merge_second(struct sim *s, const struct wb_plan *p, const struct reader *rd, size_t na,
                        uint32_t half)
{
    size_t n0 = rd[0].flow.n, n1 = rd[1].flow.n;
    struct eflow *f = realloc(s->flow, (na + n0 + n1 + 1) * sizeof(*f));
    if (!f)
        return -ENOMEM;
    s->flow = f;
    if (n0)
        memcpy(f + na, rd[0].flow.p, n0 * sizeof(*f));
    if (n1)
        memcpy(f + na + n0, rd[1].flow.p, n1 * sizeof(*f));
    for (uint32_t r = 0; r < p->ntrainers; r++) {
        const struct pl_lazy_table *lz = &pl_lazy_of(p)->t[r];
        uint32_t add = (uint32_t)(r < half ? na : na + n0);
        for (uint32_t g = 0; g < lz->nseg; g++)
            for (uint32_t k = 0; k < lz->seg[g].ntask; k++)
                s->task[s->rs[r].t0 + lz->seg[g].at_task + k].f0 += add;
    }
    return 0;
}

static int build(struct sim *s, const struct wb_plan_input *in, struct vec *rflows)
{
    const struct wb_plan *p = s->p;
    uint32_t nt = p->ntrainers;
    size_t ntask = 0, nops = 0;
    size_t *tbase = malloc(((size_t)nt + 1) * sizeof(size_t));
    size_t *obase = malloc(((size_t)nt + 1) * sizeof(size_t));
    if (!tbase || !obase) {
        free(tbase);
        free(obase);
        return -ENOMEM;
    }
    for (uint32_t r = 0; r < nt; r++) {
        tbase[r] = ntask;
        obase[r] = nops;
        ntask += pl_tables(p)[r].ntasks;
        /* collective refs: at most one per op, and one per AMAX peer */
        nops += pl_table_nops(p, r) + pl_table_napeers(p, r);
    }
    s->ntask = ntask;
    s->task = calloc(ntask + 1, sizeof(*s->task));
    s->coll = malloc((nops + 1) * sizeof(uint32_t)); /* a rank's refs from its base on */
    s->rs = calloc(nt ? nt : 1, sizeof(*s->rs));
    struct reader rd[2];
    memset(rd, 0, sizeof(rd));
    int err = -ENOMEM;
    for (int k = 0; k < 2; k++) {
        rd[k] = (struct reader){s, in, NULL, tbase, obase, 0, 0, {0}, NULL, false, 0};
        pl_vec_init(&rd[k].flow, sizeof(struct eflow));
        rd[k].seen = calloc((size_t)p->nrollouts + 1, sizeof(uint32_t));
    }
    if (!s->task || !s->coll || !s->rs || !rd[0].seen || !rd[1].seen)
        goto out;
    /* amax rendezvous by tag, which is plan-wide (10^7 exchanges at 1024 -> 512): sized from
     * the tables' tag bits, which cover every tag, grown if a tag is past them anyway */
    uint32_t bits = nt ? pl_tables(p)[0].tag_bits : 0;
    if ((err = amx_room(s, bits >= 1 && bits <= 30 ? (1u << bits) - 1 : 1)))
        goto out;
    /* two readers, halves of the ranks, when there are two CPUs; alone when one stopped. A
     * lazy plan's stamped tasks are made from their representatives' in a second pass. */
    uint32_t half = nt / 2;
    bool two = nt > 1 && sysconf(_SC_NPROCESSORS_ONLN) > 1;
    rd[0].r1 = rd[1].r0 = half;
    rd[1].r1 = nt;
    size_t *cend = NULL;
    /* relay: every record is read (a stamped task's copies to root replicas are its own) */
    if (two && pl_lazy_of(p) && !s->relay && !(cend = malloc(((size_t)nt + 1) * sizeof(size_t)))) {
        err = -ENOMEM;
        goto out;
    }
    for (int k = 0; k < 2; k++) {
        rd[k].two_pass = cend != NULL;
        rd[k].cend = cend;
    }
    size_t na = 0; /* flows of the first pass */
    two = two && run_readers(rd);
    err = rd[0].err ? rd[0].err : rd[1].err;
    if (!err && two && !rd[0].stop && !rd[1].stop && (err = merge_flows(s, rd, tbase[half])) == 0)
        na = rd[0].flow.n + rd[1].flow.n;
    if (!err && two && !rd[0].stop && !rd[1].stop && cend) {
        for (int k = 0; k < 2; k++) {
            rd[k].second = true;
            rd[k].flow_a = s->flow;
            rd[k].flow.n = 0;
        }
        two = run_readers(rd);
        err = rd[0].err ? rd[0].err : rd[1].err;
        if (!err && two && !rd[0].stop && !rd[1].stop)
            err = merge_second(s, p, rd, na, half);
    }
    free(cend);
    if (err)
        goto out;
    if (!two || rd[0].stop || rd[1].stop) {
        /* alone, in one pass: undo what the readers counted */
        memset(s->task, 0, (ntask + 1) * sizeof(*s->task));
        memset(s->amx, 0, s->namx * sizeof(*s->amx));
        free(s->flow);
        s->flow = NULL;
        for (int k = 0; k < 2; k++) {
            rd[k].flow.n = 0;
            rd[k].stop = rd[k].two_pass = rd[k].second = false;
            rd[k].cend = NULL;
        }
        memset(rd[0].seen, 0, ((size_t)p->nrollouts + 1) * sizeof(uint32_t));
        rd[0].rflows = rflows;
        rd[0].r0 = 0;
        rd[0].r1 = nt;
        read_ranks(&rd[0]);
        if ((err = rd[0].err) || (err = merge_flows(s, rd, ntask)))
            goto out;
    }
    err = 0;
out:
    for (int k = 0; k < 2; k++) {
        pl_vec_free(&rd[k].flow);
        free(rd[k].seen);
        wb_plan_tbuf_free(&rd[k].tb);
    }
    free(tbase);
    free(obase);
    if (err)
        return err;
    /* ring flows grouped by instance */
    s->nrflow = rflows->n;
    s->rflow = malloc((rflows->n + 1) * sizeof(struct rflow));
    uint32_t *cnt = calloc(s->ninst + 1, sizeof(uint32_t));
    if (!s->rflow || !cnt) {
        free(cnt);
        return -ENOMEM;
    }
    const struct rflow *R = rflows->p;
    for (size_t i = 0; i < rflows->n; i++)
        cnt[R[i].inst + 1]++;
    for (size_t i = 0; i < s->ninst; i++) {
        cnt[i + 1] += cnt[i];
        s->inst[i].f0 = cnt[i];
    }
    for (size_t i = 0; i < rflows->n; i++)
        s->rflow[cnt[R[i].inst]++] = R[i];
    free(cnt);
    /* per rank and phase: the last task of the phase (relative index + 1) */
    s->last_coll = calloc((size_t)p->ntrainers * s->nphases + 1, sizeof(uint32_t));
    if (!s->last_coll)
        return -ENOMEM;
    for (uint32_t r = 0; r < p->ntrainers; r++)
        for (uint32_t k = 0; k < s->rs[r].nt; k++)
            s->last_coll[(size_t)r * s->nphases + s->task[s->rs[r].t0 + k].phase] = k + 1;
    return 0;
}

/* ---------------------------------------------------------------- network step */

static int make_eager(struct sim *s, struct pair *p);

/* Max-min fair shares of this step's NIC egress and ingress among the active pairs, into
 * pair.rate (bytes in the step). A pair with copies moves the same share to each of its
 * receivers: it counts w times at its sender and once at each receiver. Every pair whose share
 * changed is made eager (net_step). Returns -ENOMEM or 0. */
static int water_fill(struct sim *s, double dt)
{
    double *eleft = s->eleft, *ileft = s->ileft;
    uint32_t *nout = s->nout, *nin = s->nin;
    uint32_t nn = s->nt + s->nr;
    const struct ckey *K = s->ckeys.v.p;
    size_t ncls = s->ckeys.v.n;
    /* Pairs that ended leave the list, which keeps its order; the others are brought up to
     * the step (materialize), keep their share before (prev), and the fields the rounds read
     * and write are gathered in list order (one pass over the pairs, which are far apart;
     * written back after). */
    struct wfp *F = s->wf;
    size_t keep = 0;
    for (size_t i = 0; i < s->nact; i++) {
        struct pair *p = &s->pair[s->act[i]];
        if (p->active && p->apos == i) {
            materialize(s, p, s->step);
            p->prev = p->rate;
            F[keep] = (struct wfp){p->src, p->dst, p->w, p->cls, (double)p->left, 0, 0};
            p->apos = (uint32_t)keep;
            s->act[keep++] = s->act[i];
        }
    }
    s->nact = keep;
    for (uint32_t n = 0; n < nn; n++) {
        eleft[n] = s->egress[n] * dt;
        ileft[n] = s->ingress[n] * dt;
    }
    /* A pair that wants nothing more in a round (its bytes are all given, or an end is full)
     * wants nothing in the later ones: ends only fill and rates only grow. So each round looks
     * at the previous round's wanting pairs only, in list order. */
    uint32_t *W = s->want;
    size_t nw = s->nact;
    for (size_t i = 0; i < nw; i++)
        W[i] = (uint32_t)i;
    for (int round = 0; round < 4 && nw; round++) {
        size_t want = 0;
        memset(nout, 0, nn * sizeof(*nout));
        memset(nin, 0, nn * sizeof(*nin));
        for (size_t c = 0; c < ncls; c++) {
            struct rcls *k = &s->cls[c];
            k->imin = INFINITY;
            k->count = 0;
            for (uint32_t j = 0, d = K[c].dst; j < K[c].w; j++, d += K[c].step)
                k->imin = ileft[d] < k->imin ? ileft[d] : k->imin;
        }
        for (size_t i = 0; i < nw; i++) {
            struct wfp *p = &F[W[i]];
            double imin = p->w > 1 ? s->cls[p->cls].imin : ileft[p->dst];
            if (p->left > p->rate + 0.5 && eleft[p->src] > 1 && imin > 1) {
                nout[p->src] += p->w;
                if (p->w > 1)
                    s->cls[p->cls].count++;
                else
                    nin[p->dst]++;
                W[want++] = W[i]; /* wants more this round */
            }
        }
        nw = want;
        if (!want)
            break;
        for (size_t c = 0; c < ncls; c++) {
            const struct rcls *k = &s->cls[c];
            for (uint32_t j = 0, d = K[c].dst; k->count && j < K[c].w; j++, d += K[c].step)
                nin[d] += k->count;
        }
        for (size_t c = 0; c < ncls; c++) {
            struct rcls *k = &s->cls[c];
            k->imin = INFINITY;
            for (uint32_t j = 0, d = K[c].dst; k->count && j < K[c].w; j++, d += K[c].step) {
                double x = ileft[d] / nin[d];
                k->imin = x < k->imin ? x : k->imin;
            }
        }
        /* equal shares of what each end has left at the round's start: sums never exceed it */
        for (size_t i = 0; i < nw; i++) {
            struct wfp *p = &F[W[i]];
            double give = eleft[p->src] / nout[p->src];
            double in = p->w > 1 ? s->cls[p->cls].imin : ileft[p->dst] / nin[p->dst];
            if (in < give)
                give = in;
            if (p->left - p->rate < give)
                give = p->left - p->rate;
            p->rate += give;
            p->give = give;
        }
        for (size_t i = 0; i < nw; i++) {
            struct wfp *p = &F[W[i]];
            eleft[p->src] -= p->give * p->w;
            if (p->w > 1)
                s->cls[p->cls].sub += p->give;
            else
                ileft[p->dst] -= p->give;
            p->give = 0;
        }
        for (size_t c = 0; c < ncls; c++) {
            struct rcls *k = &s->cls[c];
            for (uint32_t j = 0, d = K[c].dst; k->sub != 0 && j < K[c].w; j++, d += K[c].step)
                ileft[d] -= k->sub;
            k->sub = 0;
        }
    }
    s->sum_tr = s->sum_gather = 0;
    bool fresh = s->heap.n > 4 * s->nact + 1024; /* mostly void entries: start afresh */
    if (fresh)
        s->heap.n = 0;
    for (size_t i = 0; i < s->nact; i++) {
        struct pair *p = &s->pair[s->act[i]];
        p->rate = F[i].rate;
        if (p->rate > 0)
            *(p->dst < s->nt ? &s->sum_gather : &s->sum_tr) += p->rate * p->w;
        if ((fresh || p->rate != p->prev || !p->sched) && make_eager(s, p))
            return -ENOMEM;
        p->sched = true;
    }
    return 0;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* One step of the fluid network: max-min fair shares by a few rounds of water-filling, then
 * delivery in FIFO order per pair.
 *
 * The shares depend only on the active pairs (in order) and on which of them has less left
 * than it would get; while neither changes, last step's shares are this step's, bit for bit,
 * and each pair moves (uint64_t)rate bytes a step off its head chunk. So shares are computed
 * again only when a pair started, ended or came near its end, and a pair is touched only in
 * the steps where its head chunk completes (events in a heap); the others are brought up to
 * date when needed (materialize). At 1024 -> 512 a step has 65536 active pairs, of which a few
 * do something. The result is the one a step-by-step walk over every pair gives. Returns
 * -ENOMEM or 0. */
/* Adds a pair to this step's due list once. */
static int make_due(struct sim *s, struct pair *p)
{
    if (p->due == s->step + 1)
        return 0;
    p->due = s->step + 1;
    uint64_t d = (uint64_t)(p - s->pair);
    return pl_vec_push(&s->due, &d) ? 0 : -ENOMEM;
}

/* Pops the events of steps up to this one: their pairs are due. A pair near its end makes the
 * shares stale. */
static int pop_events(struct sim *s)
{
    uint64_t k = s->step;
    while (s->heap.n && ((const struct pev *)s->heap.p)[0].ev <= k) {
        struct pev e = heap_pop(s);
        struct pair *p = &s->pair[e.pair];
        if (e.ver != p->ver || !p->active)
            continue;
        materialize(s, p, k);
        if ((double)p->left < 2 * p->rate + 1)
            s->shares_stale = true;
        if (make_due(s, p))
            return -ENOMEM;
    }
    return 0;
}

/* ---------------------------------------------------------------- relay */

/* A forward a relaying rollout posts once the step is delivered. */
struct rpost {
    uint32_t src, dst; /* rollout ranks */
    uint64_t bytes;
};

/* A piece of `bytes` was placed at rollout rank g: a relaying rank forwards it to the same
 * local rank of each child replica. The forwards are queued: a post may grow the pairs under
 * the step's delivery loop; they are posted after it (a hop starts on the next step). */
static void relay_placed(struct sim *s, uint32_t g, uint64_t bytes)
{
    uint32_t j = g / s->gpr, l = g % s->gpr;
    for (uint32_t i = s->rkid0[j]; i < s->rkid0[j + 1]; i++) {
        struct rpost q = {g, s->rkids[i] * s->gpr + l, bytes};
        if (!pl_vec_push(&s->rq, &q))
            s->rq_err = true;
    }
}

/* A forwarded piece landed at rollout rank g. */
static void relay_landed(struct sim *s, uint32_t g, uint64_t bytes, double when)
{
    if (when > s->rollout_end[g])
        s->rollout_end[g] = when;
    s->relay_left--;
    relay_placed(s, g, bytes);
}

/* Posts the forwards queued while the step was delivered. */
static int relay_post(struct sim *s)
{
    if (s->rq_err)
        return -ENOMEM;
    const struct rpost *q = s->rq.p;
    for (size_t i = 0; i < s->rq.n; i++) {
        if (post(s, s->nt + q[i].src, s->nt + q[i].dst, 1, 0, RELAY_TASK, 0, q[i].bytes))
            return -ENOMEM;
        s->relay_left++;
    }
    s->rq.n = 0;
    return 0;
}

/* The forest over every replica for shape (its children lists too); 0 or -ENOMEM. */
static int relay_setup(struct sim *s, const struct wb_plan *p, const struct wb_relay *shape)
{
    s->relay = false;
    if (!shape || (shape->kind == WB_PLAN_RELAY_OFF && !s->member) || !p->nrollouts || !p->recv)
        return 0;
    s->nrep = wb_plan_replicas(p);
    s->gpr = p->nrollouts / s->nrep;
    if (s->nrep < 2 || s->gpr * s->nrep != p->nrollouts)
        return 0;
    s->rparent = malloc(s->nrep * sizeof(uint32_t));
    s->rkid0 = calloc(s->nrep + 2, sizeof(uint32_t));
    s->rkids = malloc(s->nrep * sizeof(uint32_t));
    if (!s->rparent || !s->rkid0 || !s->rkids)
        return -ENOMEM;
    wb_relay_forest(shape, s->nrep, s->member, s->rparent);
    for (uint32_t j = 0; j < s->nrep; j++)
        if (s->rparent[j] < s->nrep)
            s->rkid0[s->rparent[j] + 2]++;
    for (uint32_t j = 0; j < s->nrep; j++)
        s->rkid0[j + 2] += s->rkid0[j + 1];
    for (uint32_t j = 0; j < s->nrep; j++)
        if (s->rparent[j] < s->nrep)
            s->rkids[s->rkid0[s->rparent[j] + 1]++] = j;
    s->relay = true;
    return 0;
}

/* Delivers one step's share of a pair through its FIFO (chunk completions, task and gather
 * ends); the pair is then as at the start of the next step. */
static void deliver(struct sim *s, struct pair *p, double t, double dt)
{
    double bytes = p->rate;
    while (bytes > 0 && p->head < p->q.n) {
        struct chunk *c = VEC_AT(&p->q, struct chunk, p->head);
        if ((double)c->left > bytes + 0.5) {
            c->left -= (uint64_t)bytes;
            p->left -= (uint64_t)bytes;
            break;
        }
        double frac = p->rate > 0 ? 1.0 - (bytes - (double)c->left) / p->rate : 1.0;
        bytes -= (double)c->left;
        p->left -= c->left;
        c->left = 0;
        double when = t + dt * (frac < 0 ? 0 : frac > 1 ? 1 : frac);
        if (c->task == RELAY_TASK) {
            relay_landed(s, p->dst - s->nt, c->bytes, when);
        } else if (c->task & (1u << 31)) {
            struct inst *in = &s->inst[c->task & ~(1u << 31)];
            if (--in->nflows == 0)
                in->t_done = when;
        } else {
            struct etask *e = &s->task[c->task];
            for (uint32_t k = 0, d = p->dst; p->dst >= s->nt && k < p->w; k++, d += p->step) {
                if (when > s->rollout_end[d - s->nt])
                    s->rollout_end[d - s->nt] = when;
                if (s->relay)
                    relay_placed(s, d - s->nt, c->bytes);
            }
            if (--e->pending == 0) {
                e->done = true;
                e->t_end = when;
                s->rs[e->rank].mem -= e->tmp;
                s->rs[e->rank].running--;
                s->ndone++;
            }
        }
        p->head++;
    }
    p->upd = s->step + 1;
    if (p->head == p->q.n) {
        p->active = false;
        p->eager = false;
        p->left = 0;
        p->q.n = p->head = 0;
        p->ver++;
        s->shares_stale = true;
    }
}

/* Makes a pair eager: delivered every step until a step without new shares. */
static int make_eager(struct sim *s, struct pair *p)
{
    p->ver++; /* its event, if any, is void */
    if (p->eager)
        return 0;
    p->eager = true;
    uint32_t id = (uint32_t)(p - s->pair);
    return pl_vec_push(&s->eagerl, &id) ? 0 : -ENOMEM;
}

static int net_step(struct sim *s, double t, double dt, double *sent_tr, double *sent_gather)
{
    uint64_t k = s->step;
    s->due.n = 0;
    if (pop_events(s))
        return -ENOMEM;
    for (size_t i = 0; i < s->eagerl.n && !s->shares_stale; i++) {
        const struct pair *p = &s->pair[((const uint32_t *)s->eagerl.p)[i]];
        if (p->active && p->eager && (double)p->left < 2 * p->rate + 1)
            s->shares_stale = true; /* near its end: it may cap its own share */
    }
    bool filled = false;
    if (s->shares_stale) {
        /* Every pair as of now. A pair whose share changed is delivered step by step (eager)
         * until a step without new shares, then it gets an event again: where shares change
         * every step (a gather phase) this is the plain walk, where they hold (1024 -> 512
         * direct: 65536 pairs, a water-fill every 10 steps) it is a few pairs a step. The
         * water-fill brings every pair up to now (materialize) as it lists them. */
        uint64_t t0 = wb_now_ns();
        if (water_fill(s, dt))
            return -ENOMEM;
        s->t_fill += wb_now_ns() - t0;
        s->nfill++;
        s->shares_stale = false;
        filled = true;
    }
    *sent_tr += s->sum_tr;
    *sent_gather += s->sum_gather;
    /* Delivery in list order, so that completions in one step are seen in the order a walk over
     * every pair sees them (an instance's or a task's end is its last flow's): a scan of the
     * list when much is due, else the due pairs sorted by their place in it. */
    size_t ndue = s->due.n, neager = s->eagerl.n;
    if (8 * (ndue + neager) > s->nact) {
        for (size_t i = 0; i < s->nact; i++) {
            struct pair *p = &s->pair[s->act[i]];
            if (!p->active || p->apos != i || (!p->eager && p->due != k + 1))
                continue;
            bool was_eager = p->eager;
            deliver(s, p, t, dt);
            if (p->active && !was_eager && schedule(s, p))
                return -ENOMEM;
        }
    } else {
        if (pl_vec_reserve(&s->due, neager))
            return -ENOMEM;
        uint64_t *due = s->due.p; /* place in the list << 32 | pair */
        const uint32_t *el = s->eagerl.p;
        for (size_t i = 0; i < neager; i++) {
            const struct pair *p = &s->pair[el[i]];
            if (p->active && p->eager && p->due != k + 1) /* not listed already */
                due[ndue++] = el[i];
        }
        for (size_t i = 0; i < ndue; i++)
            due[i] |= (uint64_t)s->pair[(uint32_t)due[i]].apos << 32;
        if (ndue > 1)
            qsort(due, ndue, sizeof(uint64_t), cmp_u64);
        for (size_t i = 0; i < ndue; i++) {
            struct pair *p = &s->pair[(uint32_t)due[i]];
            bool was_eager = p->eager;
            deliver(s, p, t, dt);
            if (p->active && !was_eager && schedule(s, p))
                return -ENOMEM;
        }
    }
    /* eager pairs: after a step without new shares they get events again */
    uint32_t *el = s->eagerl.p;
    size_t keep = 0;
    for (size_t i = 0; i < s->eagerl.n; i++) {
        struct pair *p = &s->pair[el[i]];
        if (!p->active || !p->eager)
            continue;
        if (filled) {
            el[keep++] = el[i];
        } else {
            p->eager = false;
            if (schedule(s, p))
                return -ENOMEM;
        }
    }
    s->eagerl.n = keep;
    s->step = k + 1;
    return 0;
}

/* ---------------------------------------------------------------- per-rank stages */

/* Runs a FIFO stage: tasks [*idx, limit) each needing work(e) seconds; returns busy time. */
static double run_stage(struct sim *s, struct rank_state *rs, uint32_t *idx, uint32_t limit,
                        double *left, int which, double t, double dt, uint64_t cap)
{
    double budget = dt, busy = 0;
    (void)cap;
    while (*idx < limit) {
        struct etask *e = &s->task[rs->t0 + *idx];
        if (*left <= 0)
            *left = which == 0 ? e->h2d_s : which == 1 ? e->gpu_s : e->submit_s;
        double use = *left < budget ? *left : budget;
        *left -= use;
        budget -= use;
        busy += use;
        if (*left > 1e-12)
            break;
        *left = 0;
        if (which == 2) { /* posted: its flows enter the network */
            e->pending = 0;
            for (uint32_t f = e->f0; f < e->f0 + e->nflow; f++) {
                /* under a relay, in pieces: each is forwarded once placed */
                uint64_t b = s->flow[f].bytes, at = 0, piece = s->relay ? RELAY_PIECE : b;
                do {
                    uint64_t n = b - at < piece ? b - at : piece;
                    if (post(s, e->rank, s->nt + s->flow[f].dst, s->flow[f].w, s->flow[f].step,
                             rs->t0 + *idx, f, n))
                        return -1;
                    e->pending++;
                    at += n;
                } while (at < b);
            }
            if (e->nflow == 0) {
                e->done = true;
                e->t_end = t + (dt - budget);
                rs->mem -= e->tmp;
                rs->running--;
                s->ndone++;
            }
        }
        (*idx)++;
    }
    return busy;
}

/* Whether a rank at this amax rendezvous still waits at the end of the step starting at t. */
static bool amx_waits(const struct sim *s, const struct amx *a, double t, double dt, double g)
{
    return !a->start || *VEC_AT(&s->tstep, double, a->start - 1) + g > t + dt;
}

/* The collective stage of one rank: passes every collective that completes within this step.
 * Returns 1 when it advanced, 0 when not, -1 on allocation failure. Collectives complete at
 * their own times (start = last arrival), so the caller repeats all ranks until none advances:
 * a collective costs its duration, not a simulation step. */
static int run_coll(struct sim *s, uint32_t r, double t, double dt, const struct wb_hw *hw)
{
    struct rank_state *rs = &s->rs[r];
    int moved = 0;
    /* waiting at a rendezvous: only it need be looked at (the passes come back to every rank) */
    if (rs->blk && amx_waits(s, rs->blk, t, dt, hw->gather_s))
        return 0;
    rs->blk = NULL;
    while (rs->coll < rs->h2d) {
        struct etask *e = &s->task[rs->t0 + rs->coll];
        if (rs->coll_k < e->ncoll && (s->coll[e->c0 + rs->coll_k] & AMX_REF)) {
            const uint32_t *ref = &s->coll[e->c0 + rs->coll_k];
            struct amx *a = &s->amx[ref[0] & AMX_TAG];
            if (!rs->coll_arrived) { /* at every exchange of the op; the last to arrive starts it */
                rs->coll_arrived = true;
                moved = 1;
                for (uint32_t j = 0; rs->coll_k + j < e->ncoll; j++) {
                    if (j && !(ref[j] & AMX_MORE))
                        break;
                    struct amx *b = &s->amx[ref[j] & AMX_TAG];
                    if (++b->arrived == b->n)
                        b->start = (uint32_t)s->step + 1;
                }
            }
            if (amx_waits(s, a, t, dt, hw->gather_s)) {
                rs->blk = a;
                break;
            }
            rs->coll_k++;
            /* the op's next exchange was arrived at with this one */
            rs->coll_arrived = rs->coll_k < e->ncoll && (ref[1] & AMX_REF) && (ref[1] & AMX_MORE);
            if (rs->coll_k < e->ncoll && (ref[1] & AMX_REF))
                __builtin_prefetch(&s->amx[ref[1] & AMX_TAG], 1);
            moved = 1;
            continue;
        }
        if (rs->coll_k < e->ncoll) {
            struct inst *in = &s->inst[s->coll[e->c0 + rs->coll_k]];
            if (!rs->coll_arrived) {
                rs->coll_arrived = true;
                in->arrived++;
                moved = 1;
            }
            if (!in->started && in->arrived == in->n) {
                in->started = true;
                if (in->nvlink) {
                    in->t_done = t + hw->gather_s + (double)in->bytes_in / hw->nvlink_Bps;
                } else {
                    uint32_t f1 =
                        (uint32_t)(in - s->inst) + 1 < s->ninst ? in[1].f0 : (uint32_t)s->nrflow;
                    in->nflows = f1 - in->f0;
                    in->t_done = in->nflows ? INFINITY : t + hw->gather_s;
                    for (uint32_t f = in->f0; f < f1; f++)
                        if (post(s, s->rflow[f].src, s->rflow[f].dst, 1, 0,
                                 (uint32_t)(in - s->inst) | (1u << 31), 0, s->rflow[f].bytes))
                            return -1;
                }
            }
            if (!in->started || in->t_done > t + dt)
                break;
            rs->coll_k++;
            rs->coll_arrived = false;
            moved = 1;
            continue;
        }
        rs->coll_k = 0;
        rs->coll_arrived = false;
        rs->coll++;
        moved = 1;
    }
    return moved;
}

/* Where the rank's collective stage stands at the end of a step, for the time accounts. */
static void coll_account(struct sim *s, uint32_t r, double dt)
{
    struct rank_state *rs = &s->rs[r];
    if (rs->coll >= rs->h2d)
        return;
    const struct etask *e = &s->task[rs->t0 + rs->coll];
    if (rs->coll_k >= e->ncoll)
        return;
    uint32_t ref = s->coll[e->c0 + rs->coll_k];
    if (ref & AMX_REF ? s->amx[ref & AMX_TAG].start != 0 : s->inst[ref].started)
        rs->busy_coll += dt;
    else
        rs->wait_coll += dt;
}

/* ---------------------------------------------------------------- main loop */

static bool gate_open(const struct sim *s, uint32_t phase, double t)
{
    for (uint32_t q = 0; q < phase; q++)
        if (s->barrier_done[q] > t)
            return false;
    return true;
}

/* The simulation; it gives up with -ECANCELED once *stop is set (when not NULL). */
/* Opened once the estimate has read the tables (wb_plan_verify_estimate starts verify then:
 * the readers have both CPUs to themselves, verify shares them with the simulation). */
struct gate {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool open;
};

static void gate_set(struct gate *g)
{
    if (!g)
        return;
    pthread_mutex_lock(&g->mu);
    g->open = true;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
}

static void gate_wait(struct gate *g)
{
    pthread_mutex_lock(&g->mu);
    while (!g->open)
        pthread_cond_wait(&g->cv, &g->mu);
    pthread_mutex_unlock(&g->mu);
}

/* The simulation's per-NIC and per-phase arrays and the estimate's own. */
static int sim_alloc(struct sim *s, struct wb_estimate *e)
{
    uint32_t nn = s->nt + s->nr;
    s->egress = malloc(nn * sizeof(double));
    s->ingress = malloc(nn * sizeof(double));
    s->eleft = malloc(nn * sizeof(double));
    s->ileft = malloc(nn * sizeof(double));
    s->nout = malloc(nn * sizeof(uint32_t));
    s->nin = malloc(nn * sizeof(uint32_t));
    s->barrier_done = malloc(s->nphases * sizeof(double));
    s->arrive = calloc(s->nphases, sizeof(double));
    s->phase_left = calloc(s->nphases, sizeof(uint32_t));
    e->nphases = s->p->nphases;
    e->phase = calloc(s->nphases, sizeof(*e->phase));
    e->trainer_end_s = calloc(s->nt, sizeof(double));
    e->busy_h2d_s = calloc(s->nt, sizeof(double));
    e->busy_gpu_s = calloc(s->nt, sizeof(double));
    e->busy_gather_s = calloc(s->nt, sizeof(double));
    e->busy_submit_s = calloc(s->nt, sizeof(double));
    e->wait_s = calloc(s->nt, sizeof(double));
    e->rollout_end_s = calloc(s->nr ? s->nr : 1, sizeof(double));
    if (!s->egress || !s->ingress || !s->eleft || !s->ileft || !s->nout || !s->nin ||
        !s->barrier_done || !s->arrive || !s->phase_left || !e->phase || !e->trainer_end_s ||
        !e->busy_h2d_s || !e->busy_gpu_s || !e->busy_gather_s || !e->busy_submit_s || !e->wait_s ||
        !e->rollout_end_s)
        return -ENOMEM;
    return 0;
}

/* A resource's time at full speed: the bound when it is the largest so far (then named). */
#define BOUND(x, ...)                                                                              \
    do {                                                                                           \
        double x_ = (x);                                                                           \
        if (x_ > lb) {                                                                             \
            lb = x_;                                                                               \
            snprintf(bound, cap, __VA_ARGS__);                                                     \
        }                                                                                          \
    } while (0)

/* The trainers' own bounds, with or without relays: each rank's copy engine, GPU and CPU. */
static double trainer_bounds(const struct sim *s, double lb, char *bound, size_t cap)
{
    for (uint32_t r = 0; r < s->nt; r++) {
        double h = 0, q = 0, cpu = 0;
        for (uint32_t k = 0; k < s->rs[r].nt; k++) {
            h += s->task[s->rs[r].t0 + k].h2d_s;
            q += s->task[s->rs[r].t0 + k].gpu_s;
            cpu += s->task[s->rs[r].t0 + k].submit_s;
        }
        BOUND(h, "trainer rank %u's host-to-device copies", r);
        BOUND(q, "trainer rank %u's GPU ops (fuse, cast, quantize)", r);
        BOUND(cpu, "trainer rank %u's CPU (launching ops, posting writes)", r);
    }
    return lb;
}

/* The lower bound: the busiest NIC (writes plus gathers that leave the node), copy engine, GPU
 * or CPU at full speed; `bound` names it. */
static int lower_bound(const struct sim *s, double te, double re, double *out, char *bound,
                       size_t cap)
{
    double lb = 0;
    char b1[32];
    snprintf(bound, cap, "nothing to move");
    {
        uint64_t *out_b = calloc(s->nt, sizeof(uint64_t)), *in_b = calloc(s->nt, sizeof(uint64_t));
        if (!out_b || !in_b) {
            free(out_b);
            free(in_b);
            return -ENOMEM;
        }
        for (size_t i = 0; i < s->nrflow; i++) {
            out_b[s->rflow[i].src] += s->rflow[i].bytes;
            in_b[s->rflow[i].dst] += s->rflow[i].bytes;
        }
        for (uint32_t r = 0; r < s->nt; r++) {
            uint64_t eg = s->p->stats.send_bytes[r] + out_b[r];
            bool in = in_b[r] > eg;
            BOUND((double)(in ? in_b[r] : eg) / te, "trainer rank %u's NIC %s: %s at %.1f GB/s", r,
                  in ? "ingress (gathers)" : "egress", wb_fmt_bytes(in ? in_b[r] : eg, b1, 32),
                  te / 1e9);
        }
        free(out_b);
        free(in_b);
    }
    for (uint32_t g = 0; g < s->nr; g++) {
        const struct wb_recv_list *rl = &s->p->recv[g];
        BOUND((double)s->p->stats.recv_bytes[g] / re,
              "rollout rank %u's NIC ingress (replica %u, tp rank %u): %s at %.1f GB/s", g,
              rl->replica, rl->tp_rank, wb_fmt_bytes(s->p->stats.recv_bytes[g], b1, 32), re / 1e9);
    }
    lb = trainer_bounds(s, lb, bound, cap);
    *out = lb;
    return 0;
}

/* The lower bound under a relay: the busiest NIC, now with each trainer's egress its copies
 * to root replicas only, and a relaying rollout's egress its received bytes times its
 * children; the trainers' copy engine, GPU and CPU as without. */
static int relay_bound(const struct sim *s, double te, double re, double *out, char *bound,
                       size_t cap)
{
    double lb = 0;
    snprintf(bound, cap, "nothing to move");
    uint64_t *eg = calloc(s->nt + 1, sizeof(uint64_t));
    if (!eg)
        return -ENOMEM;
    for (size_t i = 0; i < s->ntask; i++)
        for (uint32_t f = s->task[i].f0; f < s->task[i].f0 + s->task[i].nflow; f++)
            eg[s->task[i].rank] += s->flow[f].bytes * s->flow[f].w;
    for (size_t i = 0; i < s->nrflow; i++)
        eg[s->rflow[i].src] += s->rflow[i].bytes;
    char b1[32];
    for (uint32_t r = 0; r < s->nt; r++)
        BOUND((double)eg[r] / te, "trainer rank %u's NIC egress: %s at %.1f GB/s", r,
              wb_fmt_bytes(eg[r], b1, 32), te / 1e9);
    free(eg);
    for (uint32_t g = 0; g < s->nr; g++) {
        uint32_t j = g / s->gpr, kids = s->rkid0[j + 1] - s->rkid0[j];
        uint64_t in = s->p->stats.recv_bytes[g], outb = in * kids;
        bool o = outb > in;
        BOUND((double)(o ? outb : in) / re,
              "rollout rank %u's NIC %s (replica %u, %s): %s at %.1f GB/s", g,
              o ? "egress" : "ingress", j, o ? "relaying" : "its own bytes",
              wb_fmt_bytes(o ? outb : in, b1, 32), re / 1e9);
    }
    lb = trainer_bounds(s, lb, bound, cap);
    *out = lb;
    return 0;
}
#undef BOUND

/* The step: fine enough that per-step granularity stays small against the whole, and against
 * the chain of collectives a rank passes one after another (each network gather ends on a
 * step boundary). */
static double step_size(const struct sim *s, double lb)
{
    uint32_t max_coll = 0;
    for (uint32_t r = 0; r < s->nt; r++) {
        /* gathers (network gathers end on a step boundary); amax rendezvous complete within
         * the step they finish in */
        uint32_t n = 0;
        for (uint32_t k = 0; k < s->rs[r].nt; k++) {
            const struct etask *x = &s->task[s->rs[r].t0 + k];
            for (uint32_t c = 0; c < x->ncoll; c++)
                n += !(s->coll[x->c0 + c] & AMX_REF);
        }
        max_coll = n > max_coll ? n : max_coll;
    }
    double dt = lb / 3000;
    if (max_coll && lb / (8.0 * max_coll) < dt)
        dt = lb / (8.0 * max_coll);
    if (dt < 20e-6)
        dt = 20e-6;
    if (dt > 1e-3)
        dt = 1e-3;
    return dt;
}

/* The main loop: a step of dt at a time, admission, the stages, collectives and the network,
 * until every task is done; egress, ingress and gather rates per step into eg, ig and gg, the
 * simulated time into *t_out. Gives up with -ECANCELED once *stop is set (when not NULL). */
static int simulate(struct sim *s, const struct wb_hw *th, double dt, const atomic_bool *stop,
                    struct wb_errlist *el, struct vec *eg, struct vec *ig, struct vec *gg,
                    double *t_out, uint64_t t_build)
{
    double t = 0;
    size_t done_tasks = 0, last_done = 0, stall = 0;
    uint64_t t_coll = 0, t_stage = 0, t_net = 0;
    uint64_t cap = s->p->mem_cap;
    int rc = 0;
    uint32_t *before = calloc(s->nt + 1, sizeof(uint32_t));
    if (!before)
        return -ENOMEM;
    for (uint32_t r = 0; r < s->nt; r++)
        if (s->rs[r].nt) {
            s->rs[r].wait_phase = s->task[s->rs[r].t0].phase;
            s->rs[r].wait_tmp = s->task[s->rs[r].t0].tmp;
        }
    for (uint32_t r = 0; r < s->nt; r++) /* ranks without tasks in a phase arrive at once */
        for (uint32_t q = 0; q < s->nphases; q++)
            if (s->phase_left[q] && !s->last_coll[(size_t)r * s->nphases + q])
                s->phase_left[q]--;
    for (uint32_t q = 0; q < s->nphases; q++)
        if (s->barrier_done[q] == INFINITY && s->phase_left[q] == 0)
            s->barrier_done[q] = th->barrier_s;
    for (size_t step = 0; done_tasks < s->ntask || s->relay_left || s->rq.n; step++) {
        if (stop && atomic_load_explicit(stop, memory_order_relaxed)) {
            rc = -ECANCELED;
            break;
        }
        if (step >= MAX_STEPS) {
            wb_errlist_add(el, "estimate: simulation did not finish in %.0f s of simulated time",
                           t);
            rc = -WB_E_PLAN;
            break;
        }
        if (!pl_vec_push(&s->tstep, &t)) {
            rc = -ENOMEM;
            break;
        }
        for (uint32_t r = 0; r < s->nt; r++) {
            struct rank_state *rs = &s->rs[r];
            while (rs->admit < rs->nt) {
                if (!gate_open(s, rs->wait_phase, t))
                    break;
                if (rs->running && rs->mem + rs->wait_tmp > cap)
                    break;
                struct etask *x = &s->task[rs->t0 + rs->admit];
                rs->mem += x->tmp;
                rs->running++;
                x->started = true;
                x->t_start = t;
                if (++rs->admit < rs->nt) {
                    rs->wait_phase = x[1].phase;
                    rs->wait_tmp = x[1].tmp;
                }
            }
            rs->busy_h2d += run_stage(s, rs, &rs->h2d, rs->admit, &rs->h2d_left, 0, t, dt, cap);
            before[r] = rs->coll;
        }
        uint64_t ta = wb_now_ns();
        for (int pass = 0, moved = 1; moved && pass < 1000; pass++) {
            moved = 0;
            for (uint32_t r = 0; r < s->nt; r++) {
                int m = run_coll(s, r, t, dt, th);
                if (m < 0) {
                    rc = -ENOMEM;
                    goto loop_out;
                }
                moved |= m;
            }
        }
        uint64_t tb = wb_now_ns();
        t_coll += tb - ta;
        for (uint32_t r = 0; r < s->nt; r++) {
            struct rank_state *rs = &s->rs[r];
            coll_account(s, r, dt);
            /* barrier arrivals: passing the last task of a phase */
            for (uint32_t k = before[r]; k < rs->coll; k++) {
                uint32_t ph = s->task[rs->t0 + k].phase;
                if (s->last_coll[(size_t)r * s->nphases + ph] == k + 1 && s->phase_left[ph]) {
                    s->arrive[ph] = t + dt > s->arrive[ph] ? t + dt : s->arrive[ph];
                    if (--s->phase_left[ph] == 0)
                        s->barrier_done[ph] = s->arrive[ph] + th->barrier_s;
                }
            }
            rs->busy_gpu += run_stage(s, rs, &rs->gpu, rs->coll, &rs->gpu_left, 1, t, dt, cap);
            double b = run_stage(s, rs, &rs->sub, rs->gpu, &rs->sub_left, 2, t, dt, cap);
            if (b < 0) {
                rc = -ENOMEM;
                goto loop_out;
            }
            rs->busy_sub += b;
        }
        double sent = 0, gsent = 0;
        uint64_t tc = wb_now_ns();
        t_stage += tc - tb;
        if ((rc = net_step(s, t, dt, &sent, &gsent)) || (s->relay && (rc = relay_post(s))))
            break;
        t_net += wb_now_ns() - tc;
        t += dt;
        double v1 = sent / dt, v2 = sent / dt, v3 = gsent / dt;
        if (!pl_vec_push(eg, &v1) || !pl_vec_push(ig, &v2) || !pl_vec_push(gg, &v3)) {
            rc = -ENOMEM;
            break;
        }
        done_tasks = s->ndone;
        stall = done_tasks == last_done && !s->relay_left ? stall + 1 : 0;
        last_done = done_tasks;
        if (stall > 2000000) {
            wb_errlist_add(el, "estimate: simulation stalled at %.3f s", t);
            rc = -WB_E_PLAN;
            break;
        }
    }
loop_out:
    wb_log(WB_LOG_DEBUG, "planner",
           "estimate: tables read in %.3f s (%zu tasks, %zu gathers, %zu amax tags); %zu steps: "
           "collectives %.3f s, stages %.3f s, network %.3f s (%zu pairs, %zu water-fills in "
           "%.3f s)",
           (double)t_build * 1e-9, s->ntask, s->ninst, s->namx, (size_t)eg->n,
           (double)t_coll * 1e-9, (double)t_stage * 1e-9, (double)t_net * 1e-9, s->npair, s->nfill,
           (double)s->t_fill * 1e-9);
    free(before);
    *t_out = t;
    return rc;
}

/* The estimate's figures per phase and per rank, from the finished simulation. */
static void sim_results(const struct sim *s, struct wb_estimate *e)
{
    for (uint32_t q = 0; q < e->nphases; q++) {
        e->phase[q].start_s = INFINITY;
        e->phase[q].end_s = 0;
    }
    for (size_t i = 0; i < s->ntask; i++) {
        const struct etask *x = &s->task[i];
        struct wb_est_phase *ph = &e->phase[x->phase];
        if (x->t_start < ph->start_s)
            ph->start_s = x->t_start;
        if (x->t_end > ph->end_s)
            ph->end_s = x->t_end;
        ph->write_bytes += x->write_bytes;
        ph->h2d_bytes += x->h2d_bytes;
        ph->quant_bytes += x->quant_bytes;
        if (x->t_end > e->trainer_end_s[x->rank])
            e->trainer_end_s[x->rank] = x->t_end;
    }
    for (uint32_t r = 0; r < s->nt; r++) {
        const struct wb_route_table *tb = &pl_tables(s->p)[r];
        uint64_t per_phase_send[64] = {0}, per_phase_gather[64] = {0};
        for (uint32_t k = 0; k < tb->ntasks; k++) {
            uint32_t ph = tb->tasks[k].phase;
            if (ph >= 64)
                continue;
            per_phase_send[ph] += tb->tasks[k].write_bytes;
            per_phase_gather[ph] += s->task[s->rs[r].t0 + k].gather_bytes;
        }
        for (uint32_t q = 0; q < e->nphases && q < 64; q++) {
            e->phase[q].gather_bytes += per_phase_gather[q];
            if (per_phase_send[q] > e->phase[q].max_send_bytes)
                e->phase[q].max_send_bytes = per_phase_send[q];
            if (per_phase_gather[q] > e->phase[q].max_gather_bytes)
                e->phase[q].max_gather_bytes = per_phase_gather[q];
        }
        e->busy_h2d_s[r] = s->rs[r].busy_h2d;
        e->busy_gpu_s[r] = s->rs[r].busy_gpu;
        e->busy_gather_s[r] = s->rs[r].busy_coll;
        e->busy_submit_s[r] = s->rs[r].busy_sub;
        e->wait_s[r] = s->rs[r].wait_coll;
    }
    {
        uint64_t peak = 0;
        for (uint32_t r = 0; r < s->nt; r++)
            if (pl_tables(s->p)[r].max_tmp_bytes > peak)
                peak = pl_tables(s->p)[r].max_tmp_bytes;
        e->peak_tmp_bytes = peak;
    }
}

static void sim_free(struct sim *s)
{
    for (size_t i = 0; i < s->npair; i++)
        pl_vec_free(&s->pair[i].q);
    free(s->pair);
    free(s->phash);
    free(s->cls);
    pl_intern_free(&s->ckeys);
    pl_intern_free(&s->gkeys);
    free(s->task);
    free(s->coll);
    free(s->inst);
    free(s->amx);
    free(s->flow);
    free(s->rflow);
    free(s->rs);
    free(s->last_coll);
    free(s->egress);
    free(s->ingress);
    free(s->eleft);
    free(s->ileft);
    free(s->nout);
    free(s->nin);
    free(s->act);
    free(s->want);
    free(s->wf);
    pl_vec_free(&s->heap);
    pl_vec_free(&s->due);
    pl_vec_free(&s->eagerl);
    pl_vec_free(&s->tstep);
    free(s->rparent);
    free(s->rkid0);
    free(s->rkids);
    pl_vec_free(&s->rq);
    free(s->barrier_done);
    free(s->arrive);
    free(s->phase_left);
}

/* ---------------------------------------------------------------- the plan's own estimate */

/* Whether two hardware models give the same simulation (their names aside). */
static bool hw_same(const struct wb_hw *a, const struct wb_hw *b)
{
    return a->nic_gbps == b->nic_gbps && a->nics_per_gpu == b->nics_per_gpu &&
           a->nic_efficiency == b->nic_efficiency && a->nvlink_Bps == b->nvlink_Bps &&
           a->h2d_Bps == b->h2d_Bps && a->copy_Bps == b->copy_Bps && a->quant_Bps == b->quant_Bps &&
           a->kernel_s == b->kernel_s && a->write_submit_s == b->write_submit_s &&
           a->barrier_s == b->barrier_s && a->gather_s == b->gather_s;
}

static bool relay_same(const struct wb_relay *a, const struct wb_relay *b)
{
    bool off_a = !a || a->kind == WB_PLAN_RELAY_OFF, off_b = !b || b->kind == WB_PLAN_RELAY_OFF;
    if (off_a || off_b)
        return off_a == off_b;
    return a->kind == b->kind && a->fanout == b->fanout && a->roots == b->roots;
}

/* The memo of p when it was made from what in gives now, else NULL. */
static const struct pl_est_memo *memo_for(const struct wb_plan *p, const struct wb_plan_input *in)
{
    const struct pl_est_memo *m = pl_plan_of(p)->memo;
    if (!m || !hw_same(&m->th, &in->tl->hw) || !hw_same(&m->rh, &in->rl->hw) ||
        m->gpus_per_node != in->tl->gpus_per_node || m->mem_cap != p->mem_cap ||
        !relay_same(&m->relay, &p->relay))
        return NULL;
    return m;
}

static double *dup_doubles(const double *v, size_t n, bool *ok)
{
    if (!v)
        return NULL;
    double *d = malloc((n ? n : 1) * sizeof(double));
    if (!d)
        *ok = false;
    else if (n)
        memcpy(d, v, n * sizeof(double));
    return d;
}

/* A copy of the memo's estimate into *out (0), or -ENOMEM. */
static int memo_copy(const struct wb_plan *p, const struct pl_est_memo *m, struct wb_estimate *out)
{
    const struct wb_estimate *e = &m->e;
    struct wb_estimate c = *e;
    bool ok = true;
    c.phase = NULL;
    if (e->phase) {
        c.phase = malloc((e->nphases ? e->nphases : 1) * sizeof(*c.phase));
        if (c.phase)
            memcpy(c.phase, e->phase, e->nphases * sizeof(*c.phase));
        else
            ok = false;
    }
    uint32_t nt = p->ntrainers, nr = p->nrollouts, ns = e->nsamples;
    c.trainer_end_s = dup_doubles(e->trainer_end_s, nt, &ok);
    c.busy_h2d_s = dup_doubles(e->busy_h2d_s, nt, &ok);
    c.busy_gpu_s = dup_doubles(e->busy_gpu_s, nt, &ok);
    c.busy_gather_s = dup_doubles(e->busy_gather_s, nt, &ok);
    c.busy_submit_s = dup_doubles(e->busy_submit_s, nt, &ok);
    c.wait_s = dup_doubles(e->wait_s, nt, &ok);
    c.rollout_end_s = dup_doubles(e->rollout_end_s, nr, &ok);
    c.egress_Bps = dup_doubles(e->egress_Bps, ns, &ok);
    c.ingress_Bps = dup_doubles(e->ingress_Bps, ns, &ok);
    c.gather_Bps = dup_doubles(e->gather_Bps, ns, &ok);
    if (!ok) {
        wb_estimate_free(&c);
        return -ENOMEM;
    }
    *out = c;
    return 0;
}

void pl_est_memo_set(struct wb_plan *p, const struct wb_plan_input *in, struct wb_estimate *e)
{
    pl_est_memo_free(p);
    struct pl_est_memo *m = malloc(sizeof(*m));
    if (!m) {
        wb_estimate_free(e);
        return;
    }
    m->e = *e;
    memset(e, 0, sizeof(*e));
    m->th = in->tl->hw;
    m->rh = in->rl->hw;
    m->gpus_per_node = in->tl->gpus_per_node;
    m->mem_cap = p->mem_cap;
    m->relay = p->relay;
    pl_plan_of(p)->memo = m;
}

void pl_est_memo_free(struct wb_plan *p)
{
    struct pl_est_memo *m = pl_plan_of(p)->memo;
    if (!m)
        return;
    wb_estimate_free(&m->e);
    free(m);
    pl_plan_of(p)->memo = NULL;
}

/* The simulation of p's execution with the relay shape; with dm, of a delta update's (the plan's
 * own estimate is a full update's: no memo then). */
static int estimate_as(const struct wb_plan *p, const struct wb_plan_input *in,
                       const struct wb_relay *shape, const struct delta_model *dm,
                       const bool *member, struct wb_estimate *out, struct wb_errlist *el,
                       const atomic_bool *stop, struct gate *read)
{
    const struct wb_hw *th = &in->tl->hw, *rh = &in->rl->hw;
    if (th->nic_gbps <= 0 || rh->nic_gbps <= 0) {
        wb_errlist_add(el, "%s: no hardware model (a `hardware:` key) for the estimate",
                       th->nic_gbps <= 0 ? in->tl->path : in->rl->path);
        return -WB_E_CONFIG;
    }
    const struct pl_est_memo *m = dm || member ? NULL : memo_for(p, in);
    if (m && !relay_same(&m->relay, shape))
        m = NULL;
    if (m) {
        gate_set(read);
        return memo_copy(p, m, out);
    }
    struct sim s;
    memset(&s, 0, sizeof(s));
    pl_intern_init(&s.ckeys, sizeof(struct ckey));
    pl_intern_init(&s.gkeys, sizeof(uint64_t));
    s.p = p;
    s.delta = dm;
    s.member = member;
    s.nt = p->ntrainers;
    s.nr = p->nrollouts;
    s.nphases = p->nphases ? p->nphases : 1;
    s.hcap = 4096;
    s.phash = pl_zalloc(s.hcap, sizeof(uint32_t));
    struct vec rflows;
    pl_vec_init(&rflows, sizeof(struct rflow));
    pl_vec_init(&s.heap, sizeof(struct pev));
    pl_vec_init(&s.due, sizeof(uint64_t));
    pl_vec_init(&s.eagerl, sizeof(uint32_t));
    pl_vec_init(&s.tstep, sizeof(double));
    pl_vec_init(&s.rq, sizeof(struct rpost));
    struct wb_estimate e;
    memset(&e, 0, sizeof(e));
    uint64_t t_build = wb_now_ns();
    int rc = s.phash ? relay_setup(&s, p, shape) : -ENOMEM;
    if (!rc)
        rc = build(&s, in, &rflows);
    t_build = wb_now_ns() - t_build;
    gate_set(read);
    if (rc == -E2BIG) {
        wb_errlist_add(el, "estimate: an amax exchange tag is 2^30 or more");
        rc = -WB_E_PLAN;
    }
    pl_vec_free(&rflows);
    if (!rc)
        rc = sim_alloc(&s, &e);
    if (rc)
        goto out;
    s.rollout_end = e.rollout_end_s;
    double te = th->nic_gbps * 1e9 / 8 * (double)th->nics_per_gpu * th->nic_efficiency;
    double re = rh->nic_gbps * 1e9 / 8 * (double)rh->nics_per_gpu * rh->nic_efficiency;
    for (uint32_t i = 0; i < s.nt + s.nr; i++)
        s.egress[i] = s.ingress[i] = i < s.nt ? te : re;
    /* barriers: only phases that ask for one gate the next phase */
    for (uint32_t q = 0; q < s.nphases; q++) {
        bool want = p->nphases && s.nt && pl_tables(p)[0].phases[q].barrier_after;
        s.barrier_done[q] = want ? INFINITY : 0;
        s.phase_left[q] = want ? s.nt : 0;
    }

    double lb = 0;
    if ((rc = s.relay ? relay_bound(&s, te, re, &lb, e.bound, sizeof(e.bound))
                      : lower_bound(&s, te, re, &lb, e.bound, sizeof(e.bound))))
        goto out;
    e.lower_bound_s = lb;

    double dt = step_size(&s, lb);
    e.sample_dt = dt;
    struct vec eg, ig, gg;
    pl_vec_init(&eg, sizeof(double));
    pl_vec_init(&ig, sizeof(double));
    pl_vec_init(&gg, sizeof(double));
    double t = 0;
    rc = simulate(&s, th, dt, stop, el, &eg, &ig, &gg, &t, t_build);
    e.total_s = t;
    e.nsamples = (uint32_t)eg.n;
    e.egress_Bps = eg.p;
    e.ingress_Bps = ig.p;
    e.gather_Bps = gg.p;
    sim_results(&s, &e);
out:
    sim_free(&s);
    if (rc) {
        wb_estimate_free(&e);
        return rc;
    }
    *out = e;
    return 0;
}

static int estimate(const struct wb_plan *p, const struct wb_plan_input *in,
                    const struct wb_relay *shape, struct wb_estimate *out, struct wb_errlist *el,
                    const atomic_bool *stop, struct gate *read)
{
    return estimate_as(p, in, shape, NULL, NULL, out, el, stop, read);
}

int wb_plan_estimate(const struct wb_plan *p, const struct wb_plan_input *in,
                     struct wb_estimate *out, struct wb_errlist *el)
{
    return estimate(p, in, &p->relay, out, el, NULL, NULL);
}

int wb_plan_estimate_join(const struct wb_plan *p, const struct wb_plan_input *in,
                          struct wb_estimate *out, struct wb_errlist *el)
{
    uint32_t nrep = wb_plan_replicas(p);
    if (nrep < 2)
        return estimate_as(p, in, &p->relay, NULL, NULL, out, el, NULL, NULL);
    bool *member = calloc(nrep, sizeof(bool));
    if (!member)
        return -ENOMEM;
    member[0] = true; /* replicas are congruent: any one costs the same */
    int rc = estimate_as(p, in, &p->relay, NULL, member, out, el, NULL, NULL);
    free(member);
    return rc;
}

bool pl_est_memo_has(const struct wb_plan *p, const struct wb_plan_input *in,
                     const struct wb_relay *shape)
{
    const struct pl_est_memo *m = memo_for(p, in);
    return m && relay_same(&m->relay, shape);
}

int pl_estimate_relay(const struct wb_plan *p, const struct wb_plan_input *in,
                      const struct wb_relay *shape, struct wb_estimate *out, struct wb_errlist *el)
{
    return estimate(p, in, shape, out, el, NULL, NULL);
}

struct verify_job {
    const struct wb_plan *p;
    const struct wb_plan_input *in;
    struct wb_errlist *el;
    atomic_bool *stop;
    int rc;
    double s;
    struct gate *read;
};

static void *verify_main(void *arg)
{
    struct verify_job *j = arg;
    gate_wait(j->read);
    uint64_t t0 = wb_now_ns();
    j->rc = pl_verify(j->p, j->in, j->el, false);
    j->s = (double)(wb_now_ns() - t0) * 1e-9;
    if (j->rc)
        atomic_store(j->stop, true);
    return NULL;
}

void wb_plan_verify_estimate(const struct wb_plan *p, const struct wb_plan_input *in,
                             struct wb_estimate *est, struct wb_errlist *verify_el,
                             struct wb_errlist *est_el, struct wb_plan_checks *res)
{
    if (memo_for(p, in) && in->tl->hw.nic_gbps > 0 && in->rl->hw.nic_gbps > 0) {
        /* simulated while it was built: verify alone, on its own threads, then the copy */
        uint64_t t0 = wb_now_ns();
        res->verify_rc = pl_verify(p, in, verify_el, true);
        res->verify_s = (double)(wb_now_ns() - t0) * 1e-9;
        t0 = wb_now_ns();
        res->est_rc =
            res->verify_rc ? -ECANCELED : estimate(p, in, &p->relay, est, est_el, NULL, NULL);
        res->est_s = (double)(wb_now_ns() - t0) * 1e-9;
        return;
    }
    atomic_bool stop;
    atomic_init(&stop, false);
    struct gate read = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, false};
    struct verify_job j = {p, in, verify_el, &stop, 0, 0, &read};
    pthread_t th;
    bool side =
        sysconf(_SC_NPROCESSORS_ONLN) > 1 && pthread_create(&th, NULL, verify_main, &j) == 0;
    if (!side) { /* one CPU (or no thread): verify first, and simulate only a plan that passed */
        uint64_t t0 = wb_now_ns();
        j.rc = pl_verify(p, in, verify_el, false);
        j.s = (double)(wb_now_ns() - t0) * 1e-9;
    }
    uint64_t t0 = wb_now_ns();
    res->est_rc =
        side || !j.rc ? estimate(p, in, &p->relay, est, est_el, &stop, &read) : -ECANCELED;
    gate_set(&read); /* an estimate that failed before reading */
    res->est_s = (double)(wb_now_ns() - t0) * 1e-9;
    if (side)
        pthread_join(th, NULL);
    if (j.rc && !res->est_rc) { /* verify failed after the simulation finished */
        wb_estimate_free(est);
        res->est_rc = -ECANCELED;
    }
    res->verify_rc = j.rc;
    res->verify_s = j.s;
}

void wb_estimate_free(struct wb_estimate *e)
{
    free(e->phase);
    free(e->trainer_end_s);
    free(e->busy_h2d_s);
    free(e->busy_gpu_s);
    free(e->busy_gather_s);
    free(e->busy_submit_s);
    free(e->wait_s);
    free(e->rollout_end_s);
    free(e->egress_Bps);
    free(e->ingress_Bps);
    free(e->gather_Bps);
    memset(e, 0, sizeof(*e));
}

static double mean_of(const double *v, uint32_t n)
{
    double s = 0;
    for (uint32_t i = 0; i < n; i++)
        s += v[i];
    return n ? s / n : 0;
}

static double max_of(const double *v, uint32_t n)
{
    double m = 0;
    for (uint32_t i = 0; i < n; i++)
        m = v[i] > m ? v[i] : m;
    return m;
}

void wb_estimate_print(const struct wb_estimate *e, const struct wb_plan *p, FILE *f)
{
    char a[32], b[32], c[32], d[32], h[32];
    fprintf(f, "estimate: %.3f s (lower bound %.3f s, the busiest resource at full speed: %s)\n",
            e->total_s, e->lower_bound_s, e->bound);
    for (uint32_t q = 0; q < e->nphases; q++) {
        const struct wb_est_phase *ph = &e->phase[q];
        fprintf(f,
                "  phase %u: %.3f .. %.3f s: %s written (busiest sender %s), %s gathered "
                "(busiest %s), %s H2D\n",
                q, ph->start_s == INFINITY ? 0.0 : ph->start_s, ph->end_s,
                wb_fmt_bytes(ph->write_bytes, a, sizeof(a)),
                wb_fmt_bytes(ph->max_send_bytes, b, sizeof(b)),
                wb_fmt_bytes(ph->gather_bytes, c, sizeof(c)),
                wb_fmt_bytes(ph->max_gather_bytes, d, sizeof(d)),
                wb_fmt_bytes(ph->h2d_bytes, h, sizeof(h)));
    }
    uint32_t n = p->ntrainers;
    fprintf(f,
            "  per trainer GPU (mean / max): H2D %.0f / %.0f ms, GPU ops %.0f / %.0f ms, "
            "gathers %.0f / %.0f ms,\n"
            "    waiting for peers %.0f / %.0f ms, CPU (launching ops, posting writes) %.0f / "
            "%.0f ms,\n    done at %.0f / %.0f ms\n",
            1e3 * mean_of(e->busy_h2d_s, n), 1e3 * max_of(e->busy_h2d_s, n),
            1e3 * mean_of(e->busy_gpu_s, n), 1e3 * max_of(e->busy_gpu_s, n),
            1e3 * mean_of(e->busy_gather_s, n), 1e3 * max_of(e->busy_gather_s, n),
            1e3 * mean_of(e->wait_s, n), 1e3 * max_of(e->wait_s, n),
            1e3 * mean_of(e->busy_submit_s, n), 1e3 * max_of(e->busy_submit_s, n),
            1e3 * mean_of(e->trainer_end_s, n), 1e3 * max_of(e->trainer_end_s, n));
    fprintf(f, "  per rollout GPU: last byte at %.0f ms (mean %.0f ms); largest task %s\n",
            1e3 * max_of(e->rollout_end_s, p->nrollouts),
            1e3 * mean_of(e->rollout_end_s, p->nrollouts),
            wb_fmt_bytes(e->peak_tmp_bytes, a, sizeof(a)));
}

/* ---------------------------------------------------------------- delta updates (#34)
 *
 * A delta update sends, per write, only the bytes that changed since the version the rollout
 * holds, as the data path encodes them (agent/delta.c): a record of a 32-byte header, then a
 * u32 offset and the u8 value of each changed byte (DELTA_ENTRY_BYTES), padded to 8 bytes,
 * written into the rollout's delta inbox; the rollout agent stores the records' bytes once the
 * attempt's writes are in, before the version counts. The model takes a fraction `changed` of
 * every FP8/BF16 write's bytes as changed (ceil per write); other writes (FP32 block scales,
 * FP16, FP32 weights) go in full. A write goes as a delta only where header + entries are at
 * most half the write (the data path's rule) and the delta costs less than the full write at
 * the uncontended link rate of one trainer GPU to one rollout GPU: record on the wire + the
 * rollout's apply (reading the record and writing the changed bytes at its hardware model's
 * copy_GBps, the memory bandwidth) < the write on the wire. The trainer compares its output
 * with its shadow of the last version sent (reads both: 2 x the write's bytes at its
 * copy_GBps, on its GPU stage) for every FP8/BF16 write, whichever way it then goes. A
 * rollout's version ends after its last byte plus all its apply work and one launch. */
enum { DELTA_ENTRY_BYTES = 5, DELTA_RECORD_HEADER = 32 };

struct delta_model {
    double changed;   /* fraction of FP8/BF16 bytes changed */
    double link_Bps;  /* one trainer GPU -> one rollout GPU at full speed */
    double apply_Bps; /* the rollout's memory bandwidth (copy_Bps) */
    double diff_Bps;  /* the trainer's (copy_Bps) */
    const struct wb_inventory *rollout;
};

enum delta_way { DELTA_SENT, DELTA_OTHER_DTYPE, DELTA_OVER_HALF, DELTA_NOT_CHEAPER };

/* How one write goes: *sent is what it puts on the wire (per copy), *apply_s the rollout's
 * work for it (per copy). */
static enum delta_way delta_choose(const struct delta_model *dm, const struct wb_rt_write *x,
                                   uint64_t *sent, double *apply_s)
{
    *sent = x->len;
    *apply_s = 0;
    enum wb_dtype dt =
        x->dst_tensor < dm->rollout->n ? dm->rollout->p[x->dst_tensor].dtype : WB_DTYPE_INVALID;
    if (dt != WB_DTYPE_FP8_E4M3 && dt != WB_DTYPE_BF16)
        return DELTA_OTHER_DTYPE;
    uint64_t changed = (uint64_t)ceil(dm->changed * (double)x->len);
    if (changed > x->len)
        changed = x->len;
    uint64_t half = x->len / 2;
    if (half <= DELTA_RECORD_HEADER || changed > (half - DELTA_RECORD_HEADER) / DELTA_ENTRY_BYTES)
        return DELTA_OVER_HALF;
    uint64_t payload = (DELTA_RECORD_HEADER + changed * DELTA_ENTRY_BYTES + 7) / 8 * 8;
    double apply = (double)(payload + changed) / dm->apply_Bps;
    if ((double)payload / dm->link_Bps + apply >= (double)x->len / dm->link_Bps)
        return DELTA_NOT_CHEAPER;
    *sent = payload;
    *apply_s = apply;
    return DELTA_SENT;
}

/* The simulation's bytes for write record x (per copy); the trainer's compare with its shadow
 * goes to its task's GPU time. */
static uint64_t delta_write_len(const struct delta_model *dm, const struct wb_rt_write *x,
                                double *gpu_s)
{
    uint64_t sent;
    double apply;
    if (delta_choose(dm, x, &sent, &apply) != DELTA_OTHER_DTYPE)
        *gpu_s += 2.0 * (double)x->len / dm->diff_Bps;
    return sent;
}

int wb_plan_estimate_delta(const struct wb_plan *p, const struct wb_plan_input *in, double changed,
                           struct wb_delta_estimate *out, struct wb_errlist *el)
{
    if (!(changed > 0 && changed <= 1)) {
        wb_errlist_add(el, "changed fraction %g: must be in (0, 1]", changed);
        return -EINVAL;
    }
    const struct wb_hw *th = &in->tl->hw, *rh = &in->rl->hw;
    double te = th->nic_gbps * 1e9 / 8 * (double)th->nics_per_gpu * th->nic_efficiency;
    double re = rh->nic_gbps * 1e9 / 8 * (double)rh->nics_per_gpu * rh->nic_efficiency;
    struct delta_model dm = {changed, te < re ? te : re, rh->copy_Bps, th->copy_Bps, in->rollout};
    struct wb_delta_estimate d;
    memset(&d, 0, sizeof(d));
    d.changed = changed;
    d.entry_bytes = DELTA_ENTRY_BYTES;
    d.header_bytes = DELTA_RECORD_HEADER;
    struct wb_estimate full, delta;
    int rc = estimate_as(p, in, &p->relay, NULL, NULL, &full, el, NULL, NULL);
    if (rc)
        return rc;
    d.full_s = full.total_s;
    wb_estimate_free(&full);
    if ((rc = estimate_as(p, in, &p->relay, &dm, NULL, &delta, el, NULL, NULL)))
        return rc;
    /* bytes and ways, every copy counted; each rollout's apply work */
    uint32_t nr = p->nrollouts;
    double *work = calloc((size_t)nr + 1, sizeof(double));
    struct wb_plan_tbuf tb = {0};
    rc = work ? 0 : -ENOMEM;
    for (uint32_t r = 0; r < p->ntrainers && !rc; r++) {
        const struct wb_route_table *t = wb_plan_table(p, r, &tb);
        if (!t) {
            rc = -ENOMEM;
            break;
        }
        for (uint32_t w = 0; w < t->nwrites; w++) {
            const struct wb_rt_write *x = &t->writes[w];
            uint64_t sent, nc = wb_rt_copies(x);
            double apply;
            enum delta_way way = delta_choose(&dm, x, &sent, &apply);
            d.full_bytes += nc * x->len;
            d.sent_bytes += nc * sent;
            d.writes += nc;
            uint64_t *count[] = {&d.delta_writes, &d.full_other, &d.full_over_half,
                                 &d.full_not_cheaper};
            *count[way] += nc;
            for (uint32_t k = 0; k < nc && way == DELTA_SENT; k++) {
                uint32_t q = wb_rt_copy_rank(x, k);
                if (q < nr)
                    work[q] += apply;
            }
        }
    }
    wb_plan_tbuf_free(&tb);
    if (!rc) {
        d.delta_s = delta.total_s;
        d.step_s = delta.sample_dt;
        for (uint32_t q = 0; q < nr; q++) {
            if (work[q] <= 0)
                continue;
            /* the records are stored once the attempt's writes are in */
            double end = delta.rollout_end_s[q] + work[q] + rh->kernel_s;
            d.delta_s = end > d.delta_s ? end : d.delta_s;
            d.apply_s = work[q] > d.apply_s ? work[q] : d.apply_s;
        }
        *out = d;
    }
    free(work);
    wb_estimate_free(&delta);
    return rc;
}

void wb_delta_estimate_print(const struct wb_delta_estimate *d, FILE *f)
{
    char a[32], b[32];
    fprintf(f,
            "delta update (--changed %g: that fraction of FP8/BF16 bytes changed; a record per "
            "write: %u-byte header, %u bytes per changed byte):\n",
            d->changed, d->header_bytes, d->entry_bytes);
    fprintf(f, "  sent %s of a full update's %s (%.2f %%)\n", wb_fmt_bytes(d->sent_bytes, a, 32),
            wb_fmt_bytes(d->full_bytes, b, 32),
            d->full_bytes ? 100.0 * (double)d->sent_bytes / (double)d->full_bytes : 0.0);
    fprintf(f,
            "  writes: %" PRIu64 " of %" PRIu64 " as deltas; in full: %" PRIu64
            " not FP8/BF16 (block scales), %" PRIu64 " over half their size as a delta, %" PRIu64
            " not cheaper as a delta\n",
            d->delta_writes, d->writes, d->full_other, d->full_over_half, d->full_not_cheaper);
    fprintf(f,
            "  estimate: %.3f s against %.3f s for a full update (%.3fx); the busiest rollout "
            "applies %.3f ms of records\n",
            d->delta_s, d->full_s, d->full_s > 0 ? d->delta_s / d->full_s : 0.0, 1e3 * d->apply_s);
}
