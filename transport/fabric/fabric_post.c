/* fabric_post.c — the libfabric backend's data path.
 *
 * A user write becomes operations: shards striped across rails (writes above shard_size,
 * 4 KiB-aligned), each cut into pieces no larger than the provider's max message or, for bounced
 * sources, a bounce chunk. Operations wait in a per-rail FIFO and are posted lazily from
 * wb_tx_poll() in batches (post_batch) while fewer than `window` are in flight; -FI_EAGAIN
 * leaves the operation at the head of its queue until completions free the provider (as
 * libfabric's own guidance has it). Completions are read in batches of cq_batch. Bounced pieces
 * first take a pinned chunk and a device-to-host copy; the copies of later chunks run while earlier
 * ones are on the wire, and a chunk returns to the pool when its write operation completes.
 *
 * Failure: an error completion fails its write and marks the peer failed; the peer's queued
 * operations then fail with -WB_E_PEER without reaching the provider, and new writes to it are
 * refused. A same-host peer whose process is gone, or an operation in flight (or refused by the
 * provider, as one to an endpoint that closed is) for longer than op_timeout, fails the peer the
 * same way and also abandons what the provider still holds for it
 * (the write is reported; the operation's memory stays until the provider returns it or the
 * endpoint closes). That is what keeps a dead peer from hanging a writer: the shm provider never
 * completes operations addressed to a dead process.
 */
#include "transport/fabric/fabric.h"

#include "common/fault.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

enum { SLAB_OPS = 256, SLAB_WRITES = 256, CQ_ROUNDS = 64, CQ_MAX = 1024 };

/* ---------------------------------------------------------------- lists and allocation */

static void list_push(struct fab_list *l, struct fab_op *op)
{
    op->next = NULL;
    op->prev = l->last;
    if (l->last)
        l->last->next = op;
    else
        l->first = op;
    l->last = op;
    l->n++;
    l->bytes += op->kind == OP_DATA ? op->len : 0;
}

static void list_remove(struct fab_list *l, struct fab_op *op)
{
    if (op->prev)
        op->prev->next = op->next;
    else
        l->first = op->next;
    if (op->next)
        op->next->prev = op->prev;
    else
        l->last = op->prev;
    op->next = op->prev = NULL;
    l->n--;
    l->bytes -= op->kind == OP_DATA ? op->len : 0;
}

/* A slab of `count` objects of `size` bytes, linked into fx->slabs. */
static void *slab_new(struct fab_tx *fx, size_t size, size_t count)
{
    size_t head = (sizeof(struct fab_slab) + 63) & ~(size_t)63;
    struct fab_slab *s = calloc(1, head + size * count);
    if (!s)
        return NULL;
    s->next = fx->slabs;
    fx->slabs = s;
    return (char *)s + head;
}

static int ops_reserve(struct fab_tx *fx, size_t n)
{
    size_t have = 0;
    for (struct fab_op *o = fx->free_ops; o && have < n; o = o->next)
        have++;
    while (have < n) {
        struct fab_op *ops = slab_new(fx, sizeof(*ops), SLAB_OPS);
        if (!ops)
            return -ENOMEM;
        for (size_t i = 0; i < SLAB_OPS; i++) {
            ops[i].next = fx->free_ops;
            fx->free_ops = &ops[i];
        }
        have += SLAB_OPS;
    }
    return 0;
}

/* Only after ops_reserve(). */
static struct fab_op *op_get(struct fab_tx *fx)
{
    struct fab_op *op = fx->free_ops;
    fx->free_ops = op->next;
    memset(op, 0, sizeof(*op));
    return op;
}

static void op_put(struct fab_tx *fx, struct fab_op *op)
{
    if (op->prog) { /* a piece that did not complete: its progress note is not sent */
        op_put(fx, op->prog);
        op->prog = NULL;
    }
    op->state = ST_FREE;
    op->next = fx->free_ops;
    fx->free_ops = op;
}

static struct fab_write *write_get(struct fab_tx *fx)
{
    if (!fx->free_writes) {
        struct fab_write *ws = slab_new(fx, sizeof(*ws), SLAB_WRITES);
        if (!ws)
            return NULL;
        for (size_t i = 0; i < SLAB_WRITES; i++) {
            ws[i].next = fx->free_writes;
            fx->free_writes = &ws[i];
        }
    }
    struct fab_write *w = fx->free_writes;
    fx->free_writes = w->next;
    memset(w, 0, sizeof(*w));
    return w;
}

void fab_post_fini(struct fab_tx *fx)
{
    while (fx->stage_first) {
        struct fab_stage *s = fx->stage_first;
        fx->stage_first = s->next;
        free(s);
    }
    while (fx->slabs) {
        struct fab_slab *s = fx->slabs;
        fx->slabs = s->next;
        free(s);
    }
}

/* ---------------------------------------------------------------- completion bookkeeping */

static void write_finish(struct fab_tx *fx, struct fab_write *w)
{
    w->next = NULL;
    if (fx->done_last)
        fx->done_last->next = w;
    else
        fx->done_first = w;
    fx->done_last = w;
}

/* A note goes ahead of every queued data operation: it follows only data that already left
 * (its own write's, whose completion enqueued it) or none, so the data still queued is not
 * its to wait for — on an ordered connection it would wait for all of it, and a destination
 * that forwards what landed (a relay) would see nothing land until the whole queue went. */
static void enqueue(struct fab_tx *fx, struct fab_op *op)
{
    struct fab_rail *r = &fx->rail[op->rail];
    op->state = ST_PENDING;
    list_push(op->kind == OP_NOTE ? &r->notes : &r->pending, op);
}

/* One operation of w finished with err. The last one either starts w's final operation (the
 * immediate or commit that must follow the data) or completes w. */
static void part_done(struct fab_tx *fx, struct fab_write *w, int err, int native)
{
    if (err && !w->err) {
        w->err = err;
        w->native_err = native;
    }
    if (--w->left)
        return;
    struct fab_op *fin = w->final_op;
    if (fin && !w->final_started) {
        w->final_started = true;
        if (!w->err && !fx->peers[w->peer].failed) {
            w->left = 1;
            fx->peers[w->peer].inflight++;
            enqueue(fx, fin);
            return;
        }
        if (!w->err) {
            w->err = -WB_E_PEER;
            w->native_err = fx->peers[w->peer].fail_native;
        }
        op_put(fx, fin);
    }
    write_finish(fx, w);
}

/* An operation leaves the backend: the provider returned it, posting failed, or its peer failed
 * before it was posted. */
static void op_finish(struct fab_tx *fx, struct fab_op *op, int err, int native)
{
    if (op->chunk) {
        op->chunk->next = fx->free_chunks;
        fx->free_chunks = op->chunk;
    }
    if (op->mr)
        op->mr->busy--;
    if (op->state == ST_ABANDONED) { /* already reported with its peer's failure */
        op_put(fx, op);
        return;
    }
    struct fab_write *w = op->w;
    struct fab_op *prog = op->prog; /* a progress write's piece, placed: say so */
    op->prog = NULL;
    if (prog && (err || fx->peers[op->peer].failed)) {
        op_put(fx, prog);
        prog = NULL;
    }
    if (prog) {
        w->left++;
        fx->peers[op->peer].inflight++;
        enqueue(fx, prog);
    }
    fx->peers[op->peer].inflight--;
    op_put(fx, op);
    part_done(fx, w, err, native);
}

/* Marks a peer failed: queued operations fail with -WB_E_PEER, and with `abandon` so do the
 * ones the provider holds (they stay allocated until the provider returns them). */
static void peer_fail(struct fab_tx *fx, uint32_t peer, int err, int native, bool abandon)
{
    struct fab_peer *p = &fx->peers[peer];
    if (!p->failed) {
        p->failed = true;
        p->fail_err = err;
        p->fail_native = native;
        wb_log(WB_LOG_WARN, "transport", "fabric: peer %u (pid %" PRId64 ") failed: %s", peer,
               txi_peer_pid(&fx->base, peer), wb_strerror(err));
    }
    int code = err == -ETIMEDOUT ? -ETIMEDOUT : -WB_E_PEER;
    struct fab_list *queues[2 * WB_TX_MAX_RAILS + 1];
    size_t nq = 0;
    queues[nq++] = &fx->copyq;
    for (uint32_t i = 0; i < fx->nrails; i++) {
        queues[nq++] = &fx->rail[i].notes;
        queues[nq++] = &fx->rail[i].pending;
    }
    for (uint32_t i = 0; i < fx->nrails; i++) /* the head may change: a fresh count */
        fx->rail[i].refused_since = 0;
    for (size_t q = 0; q < nq; q++) {
        for (struct fab_op *op = queues[q]->first, *next; op; op = next) {
            next = op->next;
            if (op->peer != peer)
                continue;
            list_remove(queues[q], op);
            op_finish(fx, op, code, native);
        }
    }
    if (!abandon)
        return;
    for (uint32_t i = 0; i < fx->nrails; i++) {
        struct fab_list *l = &fx->rail[i].posted;
        for (struct fab_op *op = l->first, *next; op; op = next) {
            next = op->next;
            if (op->peer != peer)
                continue;
            list_remove(l, op);
            struct fab_write *w = op->w;
            op->state = ST_ABANDONED;
            /* The peer is gone, so the provider will not read the source again: let the
             * caller deregister it. The chunk stays with the operation until it returns. */
            if (op->mr)
                op->mr->busy--;
            op->mr = NULL;
            p->inflight--;
            part_done(fx, w, code, native);
        }
    }
}

/* ---------------------------------------------------------------- writes */

static uint64_t min_u64(uint64_t a, uint64_t b)
{
    return a < b ? a : b;
}
static uint64_t div_up(uint64_t a, uint64_t b)
{
    return a / b + (a % b != 0);
}

/* Fills a note operation (a message to the peer's rail this rail talks to); the note itself
 * is made by the caller. */
static void make_note(struct fab_op *op, uint32_t rail, uint32_t peer, int len)
{
    op->kind = OP_NOTE;
    op->rail = (uint8_t)rail;
    op->peer = peer;
    op->lbuf = op->note;
    op->len = (uint64_t)len;
}

static int refuse_failed(struct fab_tx *fx, uint32_t peer)
{
    return txi_err(&fx->base, -WB_E_PEER, "write: peer %u (pid %" PRId64 ") has failed: %s", peer,
                   txi_peer_pid(&fx->base, peer), wb_strerror(fx->peers[peer].fail_err));
}

int fab_note(struct wb_tx *tx, uint32_t peer, uint32_t tag, uint32_t n, void *ctx)
{
    struct fab_tx *fx = fab_of(tx);
    if (fx->peers[peer].failed)
        return refuse_failed(fx, peer);
    if (ops_reserve(fx, 1))
        return -ENOMEM;
    struct fab_write *w = write_get(fx);
    if (!w)
        return -ENOMEM;
    struct fab_op *op = op_get(fx);
    int e = txi_note_make(tx, peer, n ? WB_TXN_COUNT : WB_TXN_WARMUP, tag, n, 0, 0, 0, op->note);
    if (e < 0) {
        op_put(fx, op);
        w->next = fx->free_writes;
        fx->free_writes = w;
        return e;
    }
    w->ctx = ctx;
    w->peer = peer;
    w->left = 1;
    op->w = w;
    make_note(op, fx->rr, peer, e);
    fx->rr = (fx->rr + 1) % fx->nrails;
    fx->peers[peer].inflight++;
    fx->st.writes++;
    enqueue(fx, op);
    return 0;
}

/* A fence waits until nothing is in flight to its peer (fences_reap): every write before it
 * completed. A write with an immediate completes only once delivered, except where the provider
 * reads a connection in order (fx->ordered), where its completion says only that its bytes are
 * in the connection's stream; there the fence then writes 8 bytes into the peer's fence pad on
 * every rail, delivery-complete: the target acknowledges a write once it placed it, so after
 * everything before it on that connection. (A message will not do: tcp;ofi_rxm completes a
 * send once it left, delivery-complete or not.) */
int fab_fence(struct wb_tx *tx, uint32_t peer, void *ctx)
{
    struct fab_tx *fx = fab_of(tx);
    if (fx->peers[peer].failed)
        return refuse_failed(fx, peer);
    struct fab_write *w = write_get(fx);
    if (!w)
        return -ENOMEM;
    w->ctx = ctx;
    w->peer = peer;
    w->left = 0;
    w->next = fx->fences;
    fx->fences = w;
    fx->st.writes++;
    return 0;
}

/* An ordered transport's fence once its peer's writes completed: its pad writes. */
static int fence_writes(struct fab_tx *fx, struct fab_write *w)
{
    if (ops_reserve(fx, fx->nrails))
        return -ENOMEM;
    struct fab_peer *p = &fx->peers[w->peer];
    w->left = fx->nrails;
    for (uint32_t i = 0; i < fx->nrails; i++) {
        struct fab_op *op = op_get(fx);
        op->kind = OP_DATA;
        op->w = w;
        op->rail = (uint8_t)i;
        op->peer = w->peer;
        op->lbuf = fx->pad + (size_t)i * FAB_PAD;
        op->ldesc = fx->rail[i].pad_desc;
        op->len = 8;
        op->raddr = p->pad_addr[i] + 8;
        op->rkey = p->pad_key[i];
        op->flags = FI_DELIVERY_COMPLETE;
        p->inflight++;
        enqueue(fx, op);
    }
    return 0;
}

int fab_write(struct wb_tx *tx, const struct wb_tx_write *uw)
{
    struct fab_tx *fx = fab_of(tx);
    struct fab_peer *p = &fx->peers[uw->peer];
    if (p->failed)
        return refuse_failed(fx, uw->peer);
    if (uw->dst->nrails != p->nrem)
        return txi_err(tx, -EINVAL, "write: descriptor has %u rails, peer %u has %u",
                       uw->dst->nrails, uw->peer, p->nrem);
    if (uw->len == 0) {
        if (uw->has_imm)
            return fab_note(tx, uw->peer, uw->imm, 1, uw->ctx);
        /* Nothing to move and nothing to tell: complete at the next poll, post nothing. */
        struct fab_write *w = write_get(fx);
        if (!w)
            return -ENOMEM;
        w->ctx = uw->ctx;
        w->peer = uw->peer;
        fx->st.writes++;
        write_finish(fx, w);
        return 0;
    }
    struct fab_mr *m = WB_CONTAINER_OF(uw->src, struct fab_mr, base);
    bool staged_dst = uw->dst->flags & WB_TX_RDESC_STAGED;
    uint64_t piece = m->bounce ? fx->cfg.bounce_size : FAB_MAX_OP;
    for (uint32_t i = 0; i < fx->nrails; i++)
        piece = min_u64(piece, fx->rail[i].max_msg);
    if (fx->cfg.inflight_bytes) /* several in flight within the bound (room()) */
        piece = min_u64(piece, fx->cfg.inflight_bytes / 4);
    uint64_t len = uw->len, nshards = 1;
    if (fx->nrails > 1 && len > fx->cfg.shard_size)
        nshards = min_u64(fx->nrails, div_up(len, fx->cfg.shard_size));
    uint64_t shard = (div_up(len, nshards) + 4095) & ~(uint64_t)4095;
    uint64_t npieces = 0, nsh = 0;
    for (uint64_t off = 0; off < len; off += shard, nsh++)
        npieces += div_up(min_u64(shard, len - off), piece);
    /* A note follows the data (its immediate, or the commit of a staged range), sent once the
     * data operations completed at the destination. */
    bool noted = staged_dst || uw->has_imm;
    /* a progress write: a note per piece, made now (this attempt's), sent once it is placed */
    bool progress = uw->progress && !staged_dst;

    struct fab_write *w = write_get(fx);
    if (!w)
        return -ENOMEM;
    if (ops_reserve(fx, npieces * (progress ? 2 : 1) + (noted ? 1 : 0))) {
        w->next = fx->free_writes;
        fx->free_writes = w;
        return -ENOMEM;
    }
    if (noted) {
        struct fab_op *fin = op_get(fx);
        uint16_t nf =
            (uint16_t)((uw->has_imm ? WB_TXN_COUNT : 0) | (staged_dst ? WB_TXN_COMMIT : 0));
        int e = txi_note_make(tx, uw->peer, nf, uw->imm, 1, staged_dst ? uw->dst->id : 0,
                              staged_dst ? uw->dst->base + uw->dst_off : 0, staged_dst ? len : 0,
                              fin->note);
        if (e < 0) {
            op_put(fx, fin);
            w->next = fx->free_writes;
            fx->free_writes = w;
            return e;
        }
        fin->w = w;
        make_note(fin, fx->rr, uw->peer, e); /* the rail of the write's first (or only) shard */
        w->final_op = fin;
    }
    w->ctx = uw->ctx;
    w->peer = uw->peer;
    w->left = (uint32_t)npieces;
    /* Where the provider reads a connection's stream in order (fx->ordered) and the write
     * stays on one rail, its note, sent on that rail once the data left, is read there only
     * after the data was placed; otherwise the note waits for the data's delivery completion
     * (an acknowledgement from the target). Each piece's progress note likewise, and a
     * settling write's completion (a note the caller sends after it). */
    uint64_t flags = (noted || progress || uw->settle) && !(fx->ordered && nshards == 1)
                         ? FI_DELIVERY_COMPLETE
                         : 0;
    uint32_t s = 0;
    for (uint64_t off = 0; off < len; off += shard, s++) {
        uint32_t rail = (fx->rr + s) % fx->nrails, j = rail % p->nrem;
        uint64_t slen = min_u64(shard, len - off);
        for (uint64_t po = 0; po < slen; po += piece) {
            struct fab_op *op = op_get(fx);
            uint64_t so = uw->src_off + off + po, dof = uw->dst_off + off + po;
            op->kind = OP_DATA;
            op->w = w;
            op->mr = m;
            op->rail = (uint8_t)rail;
            op->peer = uw->peer;
            op->len = min_u64(piece, slen - po);
            op->raddr = uw->dst->rail[j].addr + uw->dst->base + dof;
            op->rkey = uw->dst->rail[j].key;
            op->flags = flags;
            if (progress) {
                struct fab_op *pn = op_get(fx);
                int e = txi_note_make(tx, uw->peer, WB_TXN_PROGRESS, uw->imm, 0, uw->dst->id,
                                      uw->dst->base + dof, op->len, pn->note);
                if (e < 0)
                    op_put(fx, pn); /* the piece goes unannounced: the write counts as ever */
                else {
                    make_note(pn, (uint32_t)rail, uw->peer, e);
                    pn->w = w;
                    op->prog = pn;
                }
            }
            m->busy++;
            p->inflight++;
            if (m->bounce) {
                op->copy_src = (const uint8_t *)m->base.ptr + so;
                op->state = ST_COPYQ;
                list_push(&fx->copyq, op);
            } else {
                op->lbuf = (uint8_t *)m->base.ptr + so;
                op->ldesc = m->desc[rail];
                enqueue(fx, op);
            }
        }
    }
    fx->rr = (fx->rr + s) % fx->nrails;
    fx->st.writes++;
    fx->st.bytes += len;
    return 0;
}

/* ---------------------------------------------------------------- posting */

/* 1 when the operation completed at once (injected), 0 when posted, else -FI_* from the
 * provider. */
static ssize_t post_op(struct fab_tx *fx, struct fab_op *op)
{
    struct fab_rail *r = &fx->rail[op->rail];
    fi_addr_t to = fx->peers[op->peer].fa[op->rail];
    if (WB_FAULT_HIT(WB_FAULT_POST)) /* make fault: as the provider refuses a post */
        return -FI_EIO;
    if (op->kind == OP_NOTE) {
        if (op->flags & FI_DELIVERY_COMPLETE) { /* a fence: answered once placed */
            struct iovec iov = {.iov_base = op->note, .iov_len = op->len};
            struct fi_msg m = {.msg_iov = &iov, .iov_count = 1, .addr = to, .context = &op->fctx};
            return fi_sendmsg(r->ep, &m, FI_DELIVERY_COMPLETE | FI_COMPLETION);
        }
        if (r->inject_size >= op->len) {
            ssize_t e = fi_inject(r->ep, op->note, op->len, to);
            return e ? e : 1;
        }
        return fi_send(r->ep, op->note, op->len, NULL, to, &op->fctx);
    }
    struct iovec iov = {.iov_base = op->lbuf, .iov_len = op->len};
    struct fi_rma_iov rma = {.addr = op->raddr, .len = op->len, .key = op->rkey};
    void *desc = op->ldesc;
    struct fi_msg_rma msg = {.msg_iov = &iov,
                             .desc = &desc,
                             .iov_count = 1,
                             .addr = to,
                             .rma_iov = &rma,
                             .rma_iov_count = 1,
                             .context = &op->fctx,
                             .data = op->data};
    return fi_writemsg(r->ep, &msg, op->flags);
}

static void repost_recv(struct fab_tx *fx, uint32_t i, uint32_t k)
{
    struct fab_rail *r = &fx->rail[i];
    struct fab_op *op = &r->recv[k];
    ssize_t e = fi_recv(r->ep, op->lbuf, FAB_MSG_SIZE, op->ldesc, FI_ADDR_UNSPEC, &op->fctx);
    if (e == -FI_EAGAIN)
        r->recv_repost[k / 64] |= 1ull << (k % 64);
    else if (e)
        wb_log(WB_LOG_ERROR, "transport", "fabric: rail %u: fi_recv: %s", i, fab_strerror(-e));
}

int fab_post_recvs(struct fab_tx *fx, uint32_t i)
{
    struct fab_rail *r = &fx->rail[i];
    uint8_t *bufs = fx->ctrl;
    for (uint32_t k = 0; k < FAB_NRECV; k++) {
        struct fab_op *op = &r->recv[k];
        op->kind = OP_RECV;
        op->rail = (uint8_t)i;
        op->data = k;
        op->lbuf = bufs + ((size_t)i * FAB_NRECV + k) * FAB_MSG_SIZE;
        op->ldesc = r->ctrl_desc;
        repost_recv(fx, i, k);
    }
    return 0;
}

/* Notes at the head of a rail's note queue, to one peer: those that fit one injected message
 * (a note is a small message: each on its own costs a system call and a TCP segment at both
 * ends, as much as a 64 KiB write's bytes). Returns how many were sent (at least 2), 0 when
 * there are not two to send together, or -FI_* from the provider. */
static ssize_t post_notes(struct fab_tx *fx, uint32_t i)
{
    struct fab_rail *r = &fx->rail[i];
    size_t cap = r->inject_size < FAB_MSG_SIZE ? r->inject_size : FAB_MSG_SIZE, len = 0;
    const struct fab_op *op = r->notes.first;
    ssize_t k = 0;
    for (const struct fab_op *q = op; q && q->peer == op->peer && len + q->len <= cap;
         q = q->next, k++) {
        memcpy(r->batch + len, q->note, q->len);
        len += q->len;
    }
    if (k < 2)
        return 0;
    if (WB_FAULT_HIT(WB_FAULT_POST))
        return -FI_EIO;
    ssize_t e = fi_inject(r->ep, r->batch, len, fx->peers[op->peer].fa[i]);
    return e ? e : k;
}

/* Whether op, the head of its queue, may go to the provider now: fewer than `window`
 * operations there and, for data, no more than inflight_bytes of data with it (a first one
 * always goes, however large). Bounding the data bounds how long a note posted now waits
 * behind it on an ordered connection, without taking from the rate: the connection's socket
 * buffer holds less than that. A bounced piece is bounded already, by the bounce chunks
 * (bounce_chunks x bounce_size in all): held back here, it would hold its chunk idle while
 * the device-to-host copies that chunk could carry wait (the bounce path lost 10 % on an
 * H200 with both bounds). */
static bool room(const struct fab_tx *fx, const struct fab_rail *r, const struct fab_op *op)
{
    uint64_t cap = fx->cfg.inflight_bytes;
    return r->posted.n < r->window && (op->kind != OP_DATA || op->chunk || !cap ||
                                       !r->posted.bytes || r->posted.bytes + op->len <= cap);
}

static void post_rail(struct fab_tx *fx, uint32_t i, uint64_t now)
{
    struct fab_rail *r = &fx->rail[i];
    for (uint32_t wd = 0; wd < FAB_NRECV / 64; wd++)
        for (uint64_t bits = r->recv_repost[wd]; bits; bits &= bits - 1) {
            uint32_t k = (uint32_t)__builtin_ctzll(bits);
            r->recv_repost[wd] &= ~(1ull << k);
            repost_recv(fx, i, wd * 64 + k);
        }
    for (uint64_t n = 0; n < fx->cfg.post_batch;) {
        struct fab_list *q = r->notes.first ? &r->notes : &r->pending;
        struct fab_op *op = q->first;
        if (!op || !room(fx, r, op))
            break;
        ssize_t e = op->kind == OP_NOTE ? post_notes(fx, i) : 0;
        if (e > 0 || (e < 0 && e != -FI_EAGAIN)) { /* that many notes left as one, or failed */
            if (e < 0)
                wb_log(WB_LOG_WARN, "transport", "fabric: rail %u: notes to peer %u: %s", i,
                       op->peer, fab_strerror((int)-e));
            else
                fx->st.ops_posted++;
            r->refused_since = 0;
            for (ssize_t k = e > 0 ? e : 1; k > 0; k--, n++) {
                op = q->first;
                list_remove(q, op);
                op_finish(fx, op, e < 0 ? (int)e : 0, e < 0 ? (int)-e : 0);
            }
            continue;
        }
        e = e ? e : post_op(fx, op);
        if (e == -FI_EAGAIN) {
            fx->st.eagain++;
            if (!r->refused_since)
                r->refused_since = now ? now : 1;
            break;
        }
        r->refused_since = 0;
        list_remove(q, op);
        n++;
        if (e < 0) {
            wb_log(WB_LOG_WARN, "transport", "fabric: rail %u: posting to peer %u: %s", i, op->peer,
                   fab_strerror((int)-e));
            op_finish(fx, op, (int)e, (int)-e);
            continue;
        }
        fx->st.ops_posted++;
        if (e == 1) { /* injected: no completion will come */
            op_finish(fx, op, 0, 0);
            continue;
        }
        op->state = ST_POSTED;
        op->t_post = now;
        list_push(&r->posted, op);
    }
}

/* ---------------------------------------------------------------- completions */

/* The transport peer a note came from (FI_SOURCE: its address vector index on this rail), or
 * WB_TXN_NOBODY. */
static uint32_t src_peer(const struct fab_tx *fx, uint32_t rail, fi_addr_t src)
{
    const struct fab_rail *r = &fx->rail[rail];
    if (src == FI_ADDR_NOTAVAIL || src >= r->nfa || !r->fa_peer[src])
        return WB_TXN_NOBODY;
    return r->fa_peer[src] - 1;
}

/* A note arrived from `src`: checked (note.c); a staged commit copies its range from the mirror
 * to the registered memory first, then the tag counts (at once for host copies, when the copy's
 * event fires otherwise). The range is checked against our own registration, which must be open:
 * a note is input from the network. */
static void handle_note(struct fab_tx *fx, const void *buf, size_t len, uint32_t src)
{
    struct wb_txn n;
    if (txi_note_accept(&fx->base, buf, len, src, &n) != 1)
        return;
    if (n.flags & WB_TXN_PROGRESS) {
        fx->st.progress_recv++;
        txi_progress(&fx->base, n.tag, n.region, n.off, n.len);
        return;
    }
    if (!(n.flags & WB_TXN_COMMIT)) {
        if (n.flags & WB_TXN_COUNT) {
            fx->st.imm_recv += n.count;
            txi_imm_arrived(&fx->base, n.tag, n.count);
        }
        return;
    }
    struct fab_mr *m = fab_mr_find(fx, n.region);
    if (!m || !m->mirror || m->closed || n.off > m->base.size || n.len > m->base.size - n.off) {
        txi_note_refuse(&fx->base, WB_TXN_STALE);
        return;
    }
    void *ev = NULL;
    int native = 0;
    int e = fab_gpu_copy(fx->gpu, 1, (uint8_t *)m->base.ptr + n.off,
                         (const uint8_t *)m->mirror + n.off, n.len, &ev, &native);
    fx->st.staged_copies++;
    bool count = n.flags & WB_TXN_COUNT;
    if (e) {
        wb_log(WB_LOG_ERROR, "transport",
               "fabric: staging region %" PRIu64 " [%" PRIu64 ", +%" PRIu64
               ") to the device failed (cuda error %d); immediate %u not counted",
               n.region, n.off, n.len, native, n.tag);
        return;
    }
    if (!ev) {
        if (count) {
            fx->st.imm_recv++;
            txi_imm_arrived(&fx->base, n.tag, 1);
        }
        return;
    }
    struct fab_stage *s = malloc(sizeof(*s));
    if (!s) { /* cannot track the copy: wait for it rather than lose the immediate */
        int d;
        while ((d = fab_gpu_done(fx->gpu, ev, &native)) == 0) {
        }
        if (d == 1 && count) {
            fx->st.imm_recv++;
            txi_imm_arrived(&fx->base, n.tag, 1);
        }
        return;
    }
    *s = (struct fab_stage){.mr = m, .ev = ev, .tag = n.tag, .has_imm = count};
    m->busy++;
    if (fx->stage_last)
        fx->stage_last->next = s;
    else
        fx->stage_first = s;
    fx->stage_last = s;
}

static void stage_check(struct fab_tx *fx)
{
    while (fx->stage_first) {
        struct fab_stage *s = fx->stage_first;
        int native = 0, d = fab_gpu_done(fx->gpu, s->ev, &native);
        if (d == 0)
            return; /* one stream: later copies finish later */
        if (d < 0)
            wb_log(WB_LOG_ERROR, "transport", "fabric: staged copy failed (cuda error %d)", native);
        else if (s->has_imm) {
            fx->st.imm_recv++;
            txi_imm_arrived(&fx->base, s->tag, 1);
        }
        s->mr->busy--;
        fx->stage_first = s->next;
        if (!fx->stage_first)
            fx->stage_last = NULL;
        free(s);
    }
}

static void handle_cqe(struct fab_tx *fx, uint32_t rail, const struct fi_cq_data_entry *e,
                       fi_addr_t src)
{
    if (e->flags & FI_REMOTE_WRITE) { /* remote CQ data: nobody of ours sends any */
        if (e->flags & FI_REMOTE_CQ_DATA)
            txi_note_refuse(&fx->base, WB_TXN_STRANGER);
        return;
    }
    if (!e->op_context)
        return;
    struct fab_op *op = WB_CONTAINER_OF(e->op_context, struct fab_op, fctx);
    if (op->kind == OP_RECV) { /* one note or several back to back, each checked */
        uint32_t from = src_peer(fx, rail, src);
        const uint8_t *b = op->lbuf;
        size_t left = e->len, n;
        do {
            if (!(n = txi_note_size(b, left))) {
                txi_note_refuse(&fx->base, from == WB_TXN_NOBODY ? WB_TXN_STRANGER : WB_TXN_FORGED);
                break;
            }
            handle_note(fx, b, n, from);
            b += n, left -= n;
        } while (left);
        repost_recv(fx, rail, (uint32_t)op->data);
        return;
    }
    if (op->state == ST_POSTED)
        list_remove(&fx->rail[op->rail].posted, op);
    op_finish(fx, op, 0, 0);
}

static void handle_cq_err(struct fab_tx *fx, uint32_t rail)
{
    struct fi_cq_err_entry ee;
    memset(&ee, 0, sizeof(ee));
    ssize_t n = fi_cq_readerr(fx->rail[rail].cq, &ee, 0);
    if (n != 1 || !ee.op_context)
        return;
    struct fab_op *op = WB_CONTAINER_OF(ee.op_context, struct fab_op, fctx);
    if (op->kind == OP_RECV) {
        if (ee.err != FI_ECANCELED)
            repost_recv(fx, rail, (uint32_t)op->data);
        return;
    }
    uint32_t peer = op->peer;
    bool abandoned = op->state == ST_ABANDONED;
    if (op->state == ST_POSTED)
        list_remove(&fx->rail[op->rail].posted, op);
    op_finish(fx, op, -ee.err, ee.prov_errno);
    if (!abandoned)
        peer_fail(fx, peer, -ee.err, ee.prov_errno, false);
}

static int drain_cq(struct fab_tx *fx, uint32_t rail)
{
    struct fi_cq_data_entry ents[CQ_MAX];
    fi_addr_t src[CQ_MAX];
    size_t batch = fx->cfg.cq_batch < CQ_MAX ? fx->cfg.cq_batch : CQ_MAX;
    for (int round = 0; round < CQ_ROUNDS; round++) {
        ssize_t n = fi_cq_readfrom(fx->rail[rail].cq, ents, batch, src);
        if (n == -FI_EAGAIN)
            return 0;
        if (n == -FI_EAVAIL) {
            handle_cq_err(fx, rail);
            continue;
        }
        if (n < 0)
            return txi_err(&fx->base, -WB_E_FABRIC, "fabric: rail %u: fi_cq_read: %s", rail,
                           fab_strerror((int)-n));
        for (ssize_t k = 0; k < n; k++)
            handle_cqe(fx, rail, &ents[k], src[k]);
        if ((size_t)n < batch)
            return 0;
    }
    return 0;
}

/* ---------------------------------------------------------------- bounce stage */

static void to_pending(struct fab_tx *fx, struct fab_op *op)
{
    const struct fab_peer *p = &fx->peers[op->peer];
    if (p->failed) {
        op_finish(fx, op, -WB_E_PEER, p->fail_native);
        return;
    }
    enqueue(fx, op);
}

static void copy_stage(struct fab_tx *fx)
{
    while (fx->copying.first) {
        struct fab_op *op = fx->copying.first;
        int native = 0, d = fab_gpu_done(fx->gpu, op->gpu_ev, &native);
        if (d == 0)
            break; /* one stream: the rest finish later */
        list_remove(&fx->copying, op);
        op->gpu_ev = NULL;
        if (d < 0)
            op_finish(fx, op, d, native);
        else
            to_pending(fx, op);
    }
    while (fx->copyq.first && (fx->free_chunks || !fx->pool)) {
        struct fab_op *op = fx->copyq.first;
        list_remove(&fx->copyq, op);
        int e = fab_pool_init(fx);
        if (e) {
            op_finish(fx, op, e, 0);
            continue;
        }
        struct fab_chunk *ch = fx->free_chunks;
        fx->free_chunks = ch->next;
        op->chunk = ch;
        op->lbuf = ch->ptr;
        op->ldesc = fx->rail[op->rail].pool_desc;
        void *ev = NULL;
        int native = 0;
        e = fab_gpu_copy(fx->gpu, 0, ch->ptr, op->copy_src, op->len, &ev, &native);
        fx->st.bounce_copies++;
        if (e) {
            op_finish(fx, op, e, native);
        } else if (!ev) {
            to_pending(fx, op);
        } else {
            op->gpu_ev = ev;
            op->state = ST_COPYING;
            list_push(&fx->copying, op);
        }
    }
}

/* ---------------------------------------------------------------- poll */

static void check_peers(struct fab_tx *fx, uint64_t now)
{
    for (uint32_t k = 0; k < fx->npeers; k++)
        if (!fx->peers[k].failed && fx->peers[k].inflight && !txi_peer_alive(&fx->base, k))
            peer_fail(fx, k, -WB_E_PEER, 0, true);
    if (!fx->cfg.op_timeout)
        return;
    for (uint32_t i = 0; i < fx->nrails; i++) {
        struct fab_rail *r = &fx->rail[i];
        struct fab_op *op;
        while ((op = r->posted.first) && now - op->t_post > fx->cfg.op_timeout)
            peer_fail(fx, op->peer, -ETIMEDOUT, 0, true);
        /* the head of the queue refused all that time: its peer, not the rail, is stuck (a
         * rail whose window is full has posted operations, which time out first) */
        if ((op = r->notes.first ? r->notes.first : r->pending.first) && r->refused_since &&
            now - r->refused_since > fx->cfg.op_timeout)
            peer_fail(fx, op->peer, -ETIMEDOUT, 0, true);
    }
}

/* The waiting fences whose peer has nothing in flight: complete (or, ordered, post their pad
 * writes); a failed peer's fail. */
static void fences_reap(struct fab_tx *fx)
{
    for (struct fab_write **pw = &fx->fences; *pw;) {
        struct fab_write *w = *pw;
        const struct fab_peer *p = &fx->peers[w->peer];
        if (!p->failed && p->inflight) {
            pw = &w->next;
            continue;
        }
        *pw = w->next;
        if (p->failed) {
            w->err = -WB_E_PEER;
            w->native_err = p->fail_native;
        } else if (fx->ordered) {
            int e = fence_writes(fx, w);
            if (e == 0)
                continue;
            w->err = e;
        }
        write_finish(fx, w);
    }
}

ssize_t fab_poll(struct wb_tx *tx, struct wb_tx_event *ev, size_t max)
{
    struct fab_tx *fx = fab_of(tx);
    uint64_t now = wb_now_ns();
    if (now - fx->last_check >= FAB_CHECK_NS) {
        check_peers(fx, now);
        fx->last_check = now;
    }
    copy_stage(fx);
    for (uint32_t i = 0; i < fx->nrails; i++)
        post_rail(fx, i, now);
    /* notes that arrived before the attempt they belong to began here */
    uint8_t early[WB_TXN_WIRE];
    uint32_t from;
    while (txi_note_early(tx, early, &from))
        handle_note(fx, early, sizeof(early), from);
    for (uint32_t i = 0; i < fx->nrails; i++) {
        int e = drain_cq(fx, i);
        if (e)
            return e;
    }
    fences_reap(fx);
    /* Completions freed chunks and window slots: post again rather than wait for the next
     * call (the lazy part is that write() itself never posts). */
    copy_stage(fx);
    for (uint32_t i = 0; i < fx->nrails; i++)
        post_rail(fx, i, now);
    stage_check(fx);
    size_t n = 0;
    while (fx->done_first && n < max) {
        struct fab_write *w = fx->done_first;
        fx->done_first = w->next;
        if (!fx->done_first)
            fx->done_last = NULL;
        ev[n++] = (struct wb_tx_event){
            .kind = WB_TX_EV_WRITE, .err = w->err, .native_err = w->native_err, .ctx = w->ctx};
        if (w->err)
            fx->st.errors++;
        w->next = fx->free_writes;
        fx->free_writes = w;
    }
    return (ssize_t)(n + txi_imm_drain(tx, ev + n, max - n));
}
