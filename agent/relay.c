/* relay.c — a rollout relaying a version to the same local rank of its child replicas, so that
 * the trainers send each byte once per root replica instead of once per replica (the job's
 * relay: chain | tree; the controller makes the forest per attempt, controller/relay.c).
 *
 * Replicas are congruent: local rank l of every replica has the same receive list (tensors,
 * expect entries, checksum slots), so a child is written exactly as the trainers would write
 * it — the same offsets, the same number of writes per expect entry, each with a note of the
 * entry's data tag — and counts, checks and completes with the code it runs when the
 * trainers write it. Nothing of the engine is involved: the agent forwards from the tensors
 * themselves (a registration of its own for reading, no extra memory), through the transport
 * the trainers' writes take (host or GPU memory alike).
 *
 * Pipelined by piece: the trainers' writes to a relaying replica announce each piece as it is
 * placed (wb_tx_write.progress: the transport sends a progress note per piece of at most a
 * quarter of transport.inflight_bytes), and the relay forwards that range to every child that
 * said READY at once — a hop lags the one before by a piece, not by a tensor. Its forwards
 * announce their pieces the same way, so a child relaying further starts as early. What the
 * child counts is sent once the entry is whole and checked here, and only after every forward
 * of it completed (a write that settles: nothing sent after it is read before its bytes are
 * placed): one note standing for the entry's writes (the number its trainers would have
 * sent) and, verifying, the trainers' own checksum records (their MAC is under the attempt's
 * key, which every member holds), so the child checks what it got against the sums computed
 * at the trainer, end to end. An entry whose pieces were not all announced (a transport that
 * does not: CUDA IPC, a staged GPU destination; or a note not heard) goes whole once it
 * landed. The count notes may trail the data: they matter for the child's own completion and
 * checks, not for what it forwards.

 * When a relay counts its version complete: once its own tensors are in AND every forward to
 * every child has completed and a fence behind them came back (the bytes are placed at the
 * child). The alternative — the controller waiting for the children's commits — holds
 * anyway (a version completes only when every replica committed), but would let a relay end
 * its attempt (close, be told ABORT, begin the next) with forwards still reading its tensors
 * and in flight to a child; fenced, nothing of an attempt is left in flight once it ends
 * here. A forward that fails (the child died or failed) does not fail the relay's own
 * version: the child's failure is its own, and the controller names it and the replicas
 * below it. */
#include "agent/rollout.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *M = "agent";

/* A relay neighbour: the same local rank of another replica (PEERS). */
struct nbr {
    uint64_t rank;
    struct peer p;
    int32_t *desc_of; /* [nlocal]: its descriptor (p.reg index) of local tensor k, -1 */
    uint8_t *addr;    /* its transport address (PEERS), to add it again */
    size_t alen;
    bool broken; /* a forward to it failed: the transport refuses it until it is added again */
};

/* A child of this attempt. */
struct child {
    uint32_t nb;          /* its neighbour index */
    bool ready;           /* its READY came: its windows are open */
    bool failed;          /* a forward to it failed: nothing more goes */
    bool fenced;          /* every entry went, and the fence behind them was posted */
    uint32_t rcursor;     /* ranges of rng[] forwarded */
    uint32_t cursor;      /* entries of order[] whose counts (and records) went */
    uint32_t *pend;       /* [nexpect]: forwards of entry i posted, not completed */
    uint64_t outstanding; /* writes, notes and fences posted, not completed */
};

/* A forward of the attempt: to child j, a range of entry i (its completion's ctx says which). */
struct fwd {
    uint32_t j, i;
};
enum { FWD_MAX = 1u << 24 }; /* forwards an attempt may post (the ctx has 24 bits for it) */

/* A range of a tensor placed here this attempt: expect entry i's bytes [off, off + len) of its
 * tensor. */
struct rng {
    uint32_t i;
    uint64_t off, len;
};

struct relay {
    struct nbr *nbr;
    uint32_t nnbr;
    /* reading registrations of the tensors and the checksum inbox (made once per setup) */
    struct wb_tx_mr **src_mr; /* [nlocal] */
    struct wb_tx_mr *sum_src_mr;
    bool registered;
    /* the attempt */
    uint8_t attempt; /* d->attempt it was started for: completions of another are stale */
    struct child *child;
    uint32_t nchild;
    uint32_t *order; /* [nexpect]: the entries in the order they landed */
    uint32_t *rmark; /* [nexpect]: ranges heard when order[k] landed (its are among them) */
    uint32_t norder;
    struct rng *rng; /* ranges placed, in the order heard */
    uint32_t nrng, rcap;
    uint64_t *cover; /* [nexpect]: bytes of entry i heard as ranges */
    uint32_t *pend;  /* [nchild * nexpect]: the children's pend arrays */
    struct fwd *fwd; /* the attempt's forwards, by their ctx */
    uint32_t nfwd, fcap;
    bool stopped;
    uint64_t bytes; /* forwarded this attempt, every child */
};

static struct relay *relay_of(struct data *d)
{
    if (!d->rx->relay)
        d->rx->relay = calloc(1, sizeof(*d->rx->relay));
    return d->rx->relay;
}

void ag_relay_free(struct relay *r)
{
    if (!r)
        return;
    for (uint32_t i = 0; i < r->nnbr; i++) {
        ag_peer_clear(&r->nbr[i].p);
        free(r->nbr[i].desc_of);
        free(r->nbr[i].addr);
    }
    free(r->nbr);
    free(r->src_mr); /* the registrations go with the transport */
    free(r->child);
    free(r->order);
    free(r->rmark);
    free(r->rng);
    free(r->cover);
    free(r->pend);
    free(r->fwd);
    free(r);
}

/* The tensors and the checksum inbox, registered for reading: windows close only on
 * write-destination-only registrations, so the relay reads through registrations of its
 * own and the windows stay as strict as without a relay. */
static int relay_register(struct data *d, struct relay *r, char *err, size_t errcap)
{
    uint32_t nl = d->rx->recv.nlocal;
    if (r->registered)
        return 0;
    r->src_mr = calloc(nl ? nl : 1, sizeof(*r->src_mr));
    if (!r->src_mr)
        return -ENOMEM;
    for (uint32_t k = 0; k < nl; k++) {
        const struct local *l = &d->rx->locals[k];
        if (!l->desc.bytes)
            continue;
        int rc = wb_tx_mr_reg(d->tx, l->buf, l->desc.bytes, WB_TX_ACCESS_SRC, &r->src_mr[k]);
        if (rc) {
            snprintf(err, errcap, "relay: %s: cannot register it for reading: %s", d->rx->lname[k],
                     wb_tx_errmsg(d->tx));
            return rc;
        }
    }
    if (d->verify && d->rx->sum_in) {
        int rc = wb_tx_mr_reg(d->tx, d->rx->sum_in, d->rx->sum_in_bytes, WB_TX_ACCESS_SRC,
                              &r->sum_src_mr);
        if (rc) {
            snprintf(err, errcap, "relay: the checksum inbox: cannot register it for reading: %s",
                     wb_tx_errmsg(d->tx));
            return rc;
        }
    }
    r->registered = true;
    return 0;
}

int ag_relay_peer(struct data *d, uint64_t rank, struct wb_mpr *addr, struct wb_mpr *regions,
                  char *err, size_t errcap)
{
    struct relay *r = relay_of(d);
    if (!r)
        return -ENOMEM;
    int rc = relay_register(d, r, err, errcap);
    if (rc)
        return rc;
    struct nbr *nb = realloc(r->nbr, (r->nnbr + 1) * sizeof(*nb));
    if (!nb)
        return -ENOMEM;
    r->nbr = nb;
    nb = &r->nbr[r->nnbr];
    memset(nb, 0, sizeof(*nb));
    nb->rank = rank;
    const uint8_t *a0 = addr->p;
    rc = wb_tx_peer_add(d->tx, addr, &nb->p.idx);
    if (!rc && (nb->addr = malloc((size_t)(addr->p - a0))) != NULL) {
        nb->alen = (size_t)(addr->p - a0);
        memcpy(nb->addr, a0, nb->alen);
    }
    if (rc) {
        snprintf(err, errcap, "rollout rank %" PRIu64 " (relay): transport address: %s", rank,
                 wb_tx_errmsg(d->tx));
        return rc;
    }
    rc = ag_peer_rollout_regions(&nb->p, regions, UINT32_MAX);
    uint32_t nl = d->rx->recv.nlocal;
    if (!rc && !(nb->desc_of = malloc((nl ? nl : 1) * sizeof(int32_t))))
        rc = -ENOMEM;
    if (rc) {
        snprintf(err, errcap, "rollout rank %" PRIu64 " (relay): memory descriptors: %s", rank,
                 wb_strerror(rc));
        ag_peer_clear(&nb->p);
        free(nb->desc_of);
        free(nb->addr);
        return rc;
    }
    for (uint32_t k = 0; k < nl; k++) {
        nb->desc_of[k] = -1;
        for (uint32_t j = 0; j < nb->p.nreg && nb->desc_of[k] < 0; j++)
            if (nb->p.reg_tensor[j] == d->rx->locals[k].desc.tensor)
                nb->desc_of[k] = (int32_t)j;
    }
    nb->p.present = true;
    r->nnbr++;
    if (wb_tx_connect(d->tx, nb->p.idx, (void *)(uintptr_t)WARMUP_CTX) != 0)
        wb_log(WB_LOG_DEBUG, M, "rollout rank %u: warm-up to rollout rank %" PRIu64 ": %s", d->rank,
               rank, wb_tx_errmsg(d->tx));
    return 0;
}

void ag_relay_forget_peers(struct data *d)
{
    struct relay *r = d->rx ? d->rx->relay : NULL;
    for (uint32_t i = 0; r && i < r->nnbr; i++) {
        ag_peer_clear(&r->nbr[i].p);
        free(r->nbr[i].desc_of);
        free(r->nbr[i].addr);
    }
    if (r)
        r->nnbr = 0;
}

/* A forward of an attempt before failed (typically: it reached a window its child had closed
 * when that attempt was aborted, while it was still on its way), and the transport refuses
 * that peer since. Added again it is a fresh peer, so one failed attempt does not fail every
 * later one: 0, or negative (said in the log). */
static int readd(struct data *d, struct nbr *nb)
{
    struct wb_mpr ar;
    uint32_t idx;
    wb_mpr_init(&ar, nb->addr, nb->alen);
    int rc = wb_tx_peer_add(d->tx, &ar, &idx);
    if (rc) {
        wb_log(WB_LOG_WARN, M, "rollout rank %u: relay: adding rollout rank %" PRIu64 " again: %s",
               d->rank, nb->rank, wb_tx_errmsg(d->tx));
        return rc;
    }
    nb->p.idx = idx;
    nb->broken = false;
    wb_log(WB_LOG_INFO, M, "rollout rank %u: relay: rollout rank %" PRIu64 " added again", d->rank,
           nb->rank);
    return 0;
}

static struct nbr *nbr_find(struct relay *r, uint64_t rank, uint32_t *at)
{
    for (uint32_t i = 0; r && i < r->nnbr; i++)
        if (r->nbr[i].rank == rank) {
            if (at)
                *at = i;
            return &r->nbr[i];
        }
    return NULL;
}

static void on_child_ready(void *arg, uint32_t imm)
{
    struct data *d = arg;
    struct relay *r = d->rx->relay;
    uint32_t rank = imm_tag_of(imm);
    for (uint32_t j = 0; r && j < r->nchild; j++)
        if (r->nbr[r->child[j].nb].rank == rank)
            r->child[j].ready = true;
}

static void *ctx_of(const struct relay *r, uint32_t j)
{
    return (void *)(uintptr_t)(RELAY_CTX | ((uint64_t)r->attempt << 24) | j);
}

/* Appends a range placed here (entry i's bytes [off, off + len)); false without memory. */
static bool rng_push(struct relay *r, uint32_t i, uint64_t off, uint64_t len)
{
    if (r->nrng == r->rcap) {
        uint32_t cap = r->rcap ? 2 * r->rcap : 256;
        struct rng *g = realloc(r->rng, cap * sizeof(*g));
        if (!g)
            return false;
        r->rng = g;
        r->rcap = cap;
    }
    r->rng[r->nrng++] = (struct rng){i, off, len};
    r->cover[i] += len;
    return true;
}

/* A piece of a trainer's (or this replica's parent's) write placed here: queued for the
 * children, if it is what the tag stands for — a range of the entry's own tensor, the entry
 * not landed yet (a note is the sender's word; anything else is ignored, and the entry then
 * goes whole once it landed). */
static void on_progress(void *arg, uint32_t imm, uint64_t region, uint64_t off, uint64_t len)
{
    struct data *d = arg;
    struct relay *r = d->rx ? d->rx->relay : NULL;
    uint32_t tag = imm_tag_of(imm);
    if (!r || !r->nchild || r->stopped || !d->active || imm_kind_of(imm) != IMM_DATA ||
        tag > d->rx->max_data_tag || d->rx->expect_of[tag] < 0)
        return;
    uint32_t i = (uint32_t)d->rx->expect_of[tag], k = d->rx->expect_local[i];
    if (k == UINT32_MAX || d->rx->landed[i] || !len)
        return;
    const struct local *l = &d->rx->locals[k];
    if (region != l->rd.id || off < l->rd.base || len > l->desc.bytes ||
        off - l->rd.base > l->desc.bytes - len || r->cover[i] >= l->desc.bytes)
        return;
    rng_push(r, i, off - l->rd.base, len); /* without memory: goes whole once it landed */
}

int ag_relay_start(struct data *d, const struct wb_bytes *relay, uint32_t *parent_peer, char *err,
                   size_t errcap)
{
    uint32_t replicas, per, *parent;
    *parent_peer = UINT32_MAX;
    struct relay *r = d->rx->relay;
    if (r) {
        r->nchild = r->norder = r->nrng = r->nfwd = 0;
        r->stopped = false;
        r->bytes = 0;
        r->attempt = d->attempt;
    }
    int rc = ag_relay_parse(relay, &replicas, &per, &parent);
    if (rc) {
        snprintf(err, errcap, "rollout rank %u: transfer: malformed relay forest", d->rank);
        return rc;
    }
    if (!replicas)
        return 0;
    uint32_t me = d->rank / per, local = d->rank % per;
    if (me >= replicas || me != d->rx->recv.replica) {
        snprintf(err, errcap,
                 "rollout rank %u: the relay forest puts it in replica %u, its receive list in "
                 "replica %u",
                 d->rank, me, d->rx->recv.replica);
        free(parent);
        return -EPROTO;
    }
    if (parent[me] != UINT32_MAX) {
        uint64_t pr = (uint64_t)parent[me] * per + local;
        const struct nbr *nb = nbr_find(r, pr, NULL);
        if (!nb) {
            snprintf(err, errcap,
                     "rollout rank %u: its relay, rollout rank %" PRIu64 " (replica %u), is not "
                     "among its peers",
                     d->rank, pr, parent[me]);
            free(parent);
            return -EPROTO;
        }
        *parent_peer = nb->p.idx;
    }
    uint32_t n = 0;
    for (uint32_t c = 0; c < replicas; c++)
        n += parent[c] == me;
    if (n) {
        size_t ne = d->rx->recv.nexpect + 1;
        struct child *ch = r ? realloc(r->child, n * sizeof(*ch)) : NULL;
        uint32_t *order = ch ? realloc(r->order, ne * sizeof(uint32_t)) : NULL;
        uint32_t *rmark = order ? realloc(r->rmark, ne * sizeof(uint32_t)) : NULL;
        uint64_t *cover = rmark ? realloc(r->cover, ne * sizeof(uint64_t)) : NULL;
        uint32_t *pend = cover ? realloc(r->pend, n * ne * sizeof(uint32_t)) : NULL;
        if (ch)
            r->child = ch;
        if (order)
            r->order = order;
        if (rmark)
            r->rmark = rmark;
        if (cover)
            r->cover = cover;
        if (pend) {
            r->pend = pend;
            memset(cover, 0, ne * sizeof(uint64_t));
            memset(pend, 0, n * ne * sizeof(uint32_t));
            wb_tx_on_progress(d->tx, on_progress, d);
        }
        if (!pend) {
            snprintf(err, errcap, "rollout rank %u: relay: %s", d->rank,
                     r ? wb_strerror(-ENOMEM) : "it has no relay neighbours (PEERS)");
            free(parent);
            return r ? -ENOMEM : -EPROTO;
        }
    }
    for (uint32_t c = 0; c < replicas && !rc; c++) {
        if (parent[c] != me)
            continue;
        uint64_t cr = (uint64_t)c * per + local;
        uint32_t at;
        const struct nbr *nb = nbr_find(r, cr, &at);
        const char *lack = !nb                            ? "is not among its peers"
                           : d->verify && !nb->p.has_sums ? "has no checksum inbox descriptor"
                                                          : NULL;
        for (uint32_t k = 0; nb && !lack && k < d->rx->recv.nlocal; k++)
            if (d->rx->locals[k].desc.bytes && nb->desc_of[k] < 0)
                lack = "has no descriptor of a tensor it holds";
        if (lack) {
            snprintf(err, errcap,
                     "rollout rank %u: its child, rollout rank %" PRIu64 " (replica %u), %s",
                     d->rank, cr, c, lack);
            rc = -EPROTO;
            break;
        }
        if (r->nbr[at].broken && r->nbr[at].addr)
            readd(d, &r->nbr[at]);
        r->child[r->nchild] = (struct child){
            .nb = at, .pend = r->pend + (size_t)r->nchild * (d->rx->recv.nexpect + 1)};
        r->nchild++;
        rc = wb_tx_expect(d->tx, imm_make(IMM_READY, (uint32_t)cr), 1, on_child_ready, d);
        if (rc)
            snprintf(err, errcap,
                     "rollout rank %u: relay: the counter of rollout rank %" PRIu64 "'s READY: %s",
                     d->rank, cr, wb_tx_errmsg(d->tx));
    }
    free(parent);
    if (!rc && r && r->nchild)
        wb_log(WB_LOG_DEBUG, M, "rollout rank %u: version %" PRIu64 ": relays to %u replica%s",
               d->rank, d->version, r->nchild, r->nchild == 1 ? "" : "s");
    return rc;
}

void ag_relay_landed(struct data *d, uint32_t i)
{
    struct relay *r = d->rx->relay;
    if (!r || !r->nchild || r->stopped || r->norder >= d->rx->recv.nexpect)
        return;
    uint32_t k = d->rx->expect_local[i];
    uint64_t bytes = k == UINT32_MAX ? 0 : d->rx->locals[k].desc.bytes;
    if (r->cover[i] < bytes) { /* not every piece was heard: the whole tensor goes */
        r->cover[i] = 0;
        if (!rng_push(r, i, 0, bytes)) {
            r->stopped = true;
            snprintf(d->fail, sizeof(d->fail), "relay: %s", wb_strerror(-ENOMEM));
            return;
        }
    }
    r->rmark[r->norder] = r->nrng;
    r->order[r->norder++] = i;
}

static void child_failed(struct data *d, struct child *c, const char *what)
{
    struct relay *r = d->rx->relay;
    if (c->failed)
        return;
    c->failed = true;
    r->nbr[c->nb].broken = true;
    wb_log(WB_LOG_WARN, M,
           "rollout rank %u: version %" PRIu64 ": forwarding to rollout rank %" PRIu64
           " failed (%s); nothing more goes to it in this attempt",
           d->rank, d->version, r->nbr[c->nb].rank, what);
}

/* One write of the relay to child j; false when it could not be posted (the child failed). */
static bool post(struct data *d, uint32_t j, const struct wb_tx_write *w)
{
    struct relay *r = d->rx->relay;
    struct child *c = &r->child[j];
    struct nbr *nb = &r->nbr[c->nb];
    int rc = wb_tx_write(d->tx, w);
    if (rc == -WB_E_PEER && nb->addr && readd(d, nb) == 0) { /* failed in an attempt before */
        struct wb_tx_write again = *w;
        again.peer = nb->p.idx;
        rc = wb_tx_write(d->tx, &again);
    }
    if (rc) {
        child_failed(d, c, wb_tx_errmsg(d->tx));
        return false;
    }
    c->outstanding++;
    r->bytes += w->len;
    return true;
}

/* A range to child j: read from this replica's tensor, written to the same offsets of the
 * child's, announcing its pieces (for a child that relays further) and settling (the entry's
 * count, sent once it completed, cannot overtake it). */
static bool forward_range(struct data *d, uint32_t j, const struct rng *g)
{
    struct relay *r = d->rx->relay;
    const struct nbr *nb = &r->nbr[r->child[j].nb];
    uint32_t k = d->rx->expect_local[g->i];
    if (r->nfwd == r->fcap) {
        uint32_t cap = r->fcap ? 2 * r->fcap : 1024;
        struct fwd *f = cap <= FWD_MAX ? realloc(r->fwd, cap * sizeof(*f)) : NULL;
        if (!f) {
            child_failed(d, &r->child[j], "no room to track its forwards");
            return false;
        }
        r->fwd = f;
        r->fcap = cap;
    }
    struct wb_tx_write w = {
        .src = r->src_mr[k],
        .src_off = g->off,
        .peer = nb->p.idx,
        .dst = &nb->p.reg[nb->desc_of[k] < 0 ? 0 : nb->desc_of[k]],
        .dst_off = g->off,
        .len = g->len,
        .imm = imm_make(IMM_DATA, d->rx->recv.expect[g->i].tag),
        .ctx = (void *)(uintptr_t)(RELAY_FWD_CTX | ((uint64_t)r->attempt << 24) | r->nfwd),
        .progress = true,
        .settle = true};
    if (!post(d, j, &w))
        return false;
    r->fwd[r->nfwd++] = (struct fwd){j, g->i};
    r->child[j].pend[g->i]++;
    return true;
}

/* What child j counts for entry i, once its bytes are placed there: one note standing for the
 * entry's writes and, verifying, the trainers' checksum records, each with its note. */
static bool forward_counts(struct data *d, uint32_t j, uint32_t i)
{
    struct relay *r = d->rx->relay;
    struct child *c = &r->child[j];
    const struct nbr *nb = &r->nbr[c->nb];
    const struct wb_rt_expect *e = &d->rx->recv.expect[i];
    if (e->writes) {
        int rc = wb_tx_write_imms(d->tx, nb->p.idx, imm_make(IMM_DATA, e->tag), (uint32_t)e->writes,
                                  ctx_of(r, j));
        if (rc) {
            child_failed(d, c, wb_tx_errmsg(d->tx));
            return false;
        }
        c->outstanding++;
    }
    if (!d->verify)
        return true;
    struct wb_tx_write s = {.src = r->sum_src_mr,
                            .src_off = d->rx->area[i] * WB_SUM_RECORD,
                            .peer = nb->p.idx,
                            .dst = &nb->p.sums,
                            .dst_off = d->rx->area[i] * WB_SUM_RECORD,
                            .len = WB_SUM_RECORD,
                            .has_imm = true,
                            .imm = imm_make(IMM_DATA, e->tag | IMM_SUM_BIT),
                            .ctx = ctx_of(r, j)};
    for (uint64_t n = 0; n < e->writes; n++, s.src_off += WB_SUM_RECORD, s.dst_off += WB_SUM_RECORD)
        if (!post(d, j, &s))
            return false;
    return true;
}

void ag_relay_step(struct data *d)
{
    struct relay *r = d->rx->relay;
    if (!r || !r->nchild || r->stopped)
        return;
    for (uint32_t j = 0; j < r->nchild; j++) {
        struct child *c = &r->child[j];
        if (!c->ready || c->failed || c->fenced)
            continue;
        while (c->rcursor < r->nrng && !c->failed)
            if (forward_range(d, j, &r->rng[c->rcursor]))
                c->rcursor++;
        /* counts of the landed entries whose ranges all went, once those completed */
        while (c->cursor < r->norder && !c->failed && c->rcursor >= r->rmark[c->cursor] &&
               !c->pend[r->order[c->cursor]])
            if (forward_counts(d, j, r->order[c->cursor]))
                c->cursor++;
        /* every entry this rollout receives went: a fence behind them, whose completion says
         * they are placed at the child */
        if (!c->failed && c->cursor == d->rx->nwant && r->norder == d->rx->nwant) {
            int rc = wb_tx_fence(d->tx, r->nbr[c->nb].p.idx, ctx_of(r, j));
            if (rc)
                child_failed(d, c, wb_tx_errmsg(d->tx));
            else {
                c->outstanding++;
                c->fenced = true;
            }
        }
    }
}

bool ag_relay_done(const struct data *d)
{
    const struct relay *r = d->rx->relay;
    for (uint32_t j = 0; r && j < r->nchild; j++) {
        const struct child *c = &r->child[j];
        if (c->outstanding || (!c->failed && !c->fenced))
            return false;
    }
    if (r && r->nchild)
        wb_log(WB_LOG_DEBUG, M,
               "rollout rank %u: version %" PRIu64 ": %" PRIu64 " bytes relayed to %u replica%s",
               d->rank, d->version, r->bytes, r->nchild, r->nchild == 1 ? "" : "s");
    return true;
}

void ag_relay_event(struct data *d, const struct wb_tx_event *ev)
{
    uint64_t v = (uint64_t)(uintptr_t)ev->ctx;
    struct relay *r = d->rx ? d->rx->relay : NULL;
    if ((v & ~0xffffffffull) == RELAY_FWD_CTX) { /* a range forward */
        uint32_t k = (uint32_t)(v & (FWD_MAX - 1));
        if (!r || (uint8_t)(v >> 24) != r->attempt || k >= r->nfwd)
            return; /* of an attempt before */
        struct child *c = &r->child[r->fwd[k].j];
        if (c->outstanding)
            c->outstanding--;
        if (c->pend[r->fwd[k].i])
            c->pend[r->fwd[k].i]--;
        if (ev->err)
            child_failed(d, c,
                         ev->err == -WB_E_PEER ? "the peer died or failed" : wb_strerror(ev->err));
        return;
    }
    uint32_t j = (uint32_t)(v & RELAY_PARENT);
    uint8_t attempt = (uint8_t)(v >> 24);
    if (j == RELAY_PARENT) { /* the READY to this attempt's parent */
        if (ev->err && d->active && !d->fail[0] && attempt == d->attempt)
            snprintf(d->fail, sizeof(d->fail),
                     "telling its relay it is ready failed (%s); it will not write",
                     ev->err == -WB_E_PEER ? "the peer died or failed" : wb_strerror(ev->err));
        return;
    }
    if (!r || attempt != r->attempt || j >= r->nchild)
        return; /* a completion of an attempt before: nothing counts it */
    struct child *c = &r->child[j];
    if (c->outstanding)
        c->outstanding--;
    if (ev->err)
        child_failed(d, c,
                     ev->err == -WB_E_PEER ? "the peer died or failed" : wb_strerror(ev->err));
}

void ag_relay_bounds(const struct data *d, uint64_t *tags, uint64_t *notes)
{
    const struct relay *r = d->rx ? d->rx->relay : NULL;
    if (r) {
        *tags += r->nnbr;
        *notes += r->nnbr;
    }
}

void ag_relay_stop(struct data *d)
{
    struct relay *r = d->rx ? d->rx->relay : NULL;
    if (r)
        r->stopped = true;
}

void *ag_relay_parent_ctx(struct data *d)
{
    return (void *)(uintptr_t)(RELAY_CTX | ((uint64_t)d->attempt << 24) | RELAY_PARENT);
}
