/* cudaipc_cuda.c — the CUDA IPC backend: GPUs of one host write into each other's memory with
 * peer copies; immediates travel through the destination's shared-memory mailbox once the
 * copies' events have fired. Design notes in cudaipc.h. */
#include "common/fault.h"
#include "transport/cudaipc/cudaipc.h"
#include "transport/tx_priv.h"

#include <cuda.h>
#include <cuda_runtime.h>
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { CHECK_NS = 100 * 1000 * 1000 };

/* One opened allocation of a peer. Keyed by the handle, not the region: registrations inside
 * one allocation (tensors of one allocator segment) share a handle, and a process may open a
 * handle only once. */
struct ipc_map {
    cudaIpcMemHandle_t handle;
    void *base;
};

struct ipc_peer {
    struct wb_mbox mb;
    int64_t device;
    bool failed;
    int fail_err;
    struct ipc_map *maps;
    size_t nmaps, cap;
    uint64_t inflight;
    uint64_t fences; /* of inflight: fences waiting for the writes before them */
};

struct ipc_mr {
    struct wb_tx_mr base;
    cudaIpcMemHandle_t handle;
    uint64_t alloc_off; /* offset of ptr in the allocation the handle names */
    uintptr_t alloc;    /* that allocation's base: what a peer in this process writes to */
    uint64_t busy;
};

struct ipc_write;

struct ipc_shard {
    struct ipc_shard *next;
    struct ipc_write *w;
    cudaEvent_t ev;
};

struct ipc_write {
    struct ipc_write *next; /* mailbox wait list or done list */
    void *ctx;
    uint32_t peer, shards_left;
    int err, native;
    bool has_imm; /* a note follows (made when the write was queued) */
    uint8_t note[WB_TXN_WIRE];
    struct ipc_mr *src;
    struct ipc_shard shard[WB_TX_MAX_RAILS];
};

struct ipc_stream {
    cudaStream_t s;
    struct ipc_shard *first, *last;
};

struct ipc_wlist {
    struct ipc_write *first, *last;
};

struct ipc_tx {
    struct wb_tx base;
    struct wb_tx_cfg cfg;
    int device;
    uint32_t nrails, rr;
    struct ipc_stream stream[WB_TX_MAX_RAILS];
    struct wb_mbox own;
    struct ipc_peer *peers;
    uint32_t npeers, peer_cap;
    struct ipc_mr **mrs;
    size_t nmrs, mrs_cap;
    struct ipc_wlist immq, fenceq, done;
    cudaEvent_t *spare;
    size_t nspare, spare_cap;
    uint64_t last_check;
    struct wb_tx_stats st;
};

static struct ipc_tx *ipc_of(struct wb_tx *tx)
{
    return WB_CONTAINER_OF(tx, struct ipc_tx, base);
}

static void wlist_push(struct ipc_wlist *l, struct ipc_write *w)
{
    w->next = NULL;
    if (l->last)
        l->last->next = w;
    else
        l->first = w;
    l->last = w;
}

static int cuda_err(struct wb_tx *tx, cudaError_t r, const char *what)
{
    (void)cudaGetLastError();
    return txi_err(tx, -WB_E_CUDA, "cudaipc: %s: %s", what, cudaGetErrorString(r));
}

/* ---------------------------------------------------------------- events */

static int event_get(struct ipc_tx *ix, cudaEvent_t *e)
{
    if (ix->nspare) {
        *e = ix->spare[--ix->nspare];
        return 0;
    }
    return cudaEventCreateWithFlags(e, cudaEventDisableTiming) == cudaSuccess ? 0 : -WB_E_CUDA;
}

static void event_put(struct ipc_tx *ix, cudaEvent_t e)
{
    if (ix->nspare == ix->spare_cap &&
        wb_grow(&ix->spare, &ix->spare_cap, 64, sizeof(*ix->spare)) != 0) {
        cudaEventDestroy(e);
        return;
    }
    ix->spare[ix->nspare++] = e;
}

/* ---------------------------------------------------------------- registration */

/* The allocation containing p (cuMemGetAddressRange): cudaIpcGetMemHandle names whole
 * allocations, while callers register tensors inside allocator segments. The driver function is
 * fetched through the runtime because the build links only the static runtime. */
static int alloc_base(const void *p, uint64_t *off, uint64_t *alloc_size)
{
    void *fn = NULL;
    enum cudaDriverEntryPointQueryResult q;
    if (cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &fn, 12000, cudaEnableDefault,
                                         &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess || !fn) {
        (void)cudaGetLastError();
        return -ENOTSUP;
    }
    CUresult (*get_range)(CUdeviceptr *, size_t *, CUdeviceptr);
    memcpy(&get_range, &fn, sizeof(get_range)); /* dlsym-style: the pointer is a function */
    CUdeviceptr base;
    size_t size;
    if (get_range(&base, &size, (CUdeviceptr)(uintptr_t)p) != CUDA_SUCCESS)
        return -WB_E_CUDA;
    *off = (uint64_t)((uintptr_t)p - (uintptr_t)base);
    *alloc_size = size;
    return 0;
}

static int ipc_mr_reg(struct wb_tx *tx, void *ptr, uint64_t len, unsigned access,
                      struct wb_tx_mr **out)
{
    struct ipc_tx *ix = ipc_of(tx);
    if (!ptr || len == 0 || !(access & (WB_TX_ACCESS_SRC | WB_TX_ACCESS_DST)))
        return txi_err(tx, -EINVAL, "register: need a pointer, a length and SRC/DST access");
    struct cudaPointerAttributes a;
    cudaError_t r = cudaPointerGetAttributes(&a, ptr);
    if (r != cudaSuccess || a.type != cudaMemoryTypeDevice) {
        (void)cudaGetLastError();
        return txi_err(tx, -ENOTSUP, "register: cudaipc registers CUDA device memory only");
    }
    if (a.device != ix->device)
        return txi_err(tx, -EINVAL, "register: memory of GPU %d, this transport serves GPU %d",
                       a.device, ix->device);
    if (ix->nmrs == ix->mrs_cap && wb_grow(&ix->mrs, &ix->mrs_cap, 16, sizeof(*ix->mrs)) != 0)
        return txi_err(tx, -ENOMEM, "register: the table of registrations: out of memory");
    struct ipc_mr *m = calloc(1, sizeof(*m));
    if (!m)
        return txi_err(tx, -ENOMEM, "register: out of memory");
    if (access & WB_TX_ACCESS_DST) {
        uint64_t asize = 0;
        int e = alloc_base(ptr, &m->alloc_off, &asize);
        if (e) {
            free(m);
            return txi_err(tx, e, "register: cuMemGetAddressRange failed");
        }
        /* A peer maps the allocation the handle names and nothing after it: a region running
         * past it would be written past the peer's mapping (issue #35). */
        uint64_t off = m->alloc_off;
        if (len > asize - off) {
            free(m);
            return txi_err(tx, -WB_E_BOUNDS,
                           "register: %" PRIu64 " bytes at %p run past their allocation "
                           "(%" PRIu64 " bytes, %p at offset %" PRIu64
                           "): a peer maps one allocation per IPC handle",
                           len, ptr, asize, ptr, off);
        }
        void *base = (uint8_t *)ptr - m->alloc_off;
        m->alloc = (uintptr_t)base;
        r = cudaIpcGetMemHandle(&m->handle, base);
        if (r != cudaSuccess) {
            free(m);
            return cuda_err(tx, r,
                            "cudaIpcGetMemHandle (memory from cudaMallocAsync pools "
                            "cannot be exported)");
        }
    }
    m->base = (struct wb_tx_mr){.ptr = ptr,
                                .size = len,
                                .mem = WB_TX_MEM_CUDA,
                                .device = ix->device,
                                .access = access,
                                .id = txi_next_mr_id(tx)};
    ix->mrs[ix->nmrs++] = m;
    *out = &m->base;
    return 0;
}

static int ipc_mr_rdesc(struct wb_tx *tx, const struct wb_tx_mr *mr, struct wb_tx_rdesc *out)
{
    const struct ipc_mr *m = WB_CONTAINER_OF(mr, struct ipc_mr, base);
    if (!(mr->access & WB_TX_ACCESS_DST))
        return txi_err(tx, -EINVAL,
                       "describe: region %" PRIu64 " is not registered as a "
                       "write destination",
                       mr->id);
    struct wb_tx_rdesc d;
    memset(&d, 0, sizeof(d));
    d.backend = WB_TX_CUDAIPC;
    d.owner = txi_uid(tx);
    d.id = mr->id;
    d.size = mr->size;
    d.nrails = 1;
    d.rail[0].addr = m->alloc_off;
    d.rail[0].key = m->alloc; /* for a writer in the same process, which cannot open the handle */
    d.opaque_len = sizeof(m->handle);
    memcpy(d.opaque, &m->handle, sizeof(m->handle));
    *out = d;
    return 0;
}

static int ipc_mr_dereg(struct wb_tx *tx, struct wb_tx_mr *mr)
{
    struct ipc_tx *ix = ipc_of(tx);
    struct ipc_mr *m = WB_CONTAINER_OF(mr, struct ipc_mr, base);
    if (m->busy)
        return txi_err(tx, -EBUSY,
                       "deregister: region %" PRIu64 " has %" PRIu64 " copies in flight", mr->id,
                       m->busy);
    for (size_t i = 0; i < ix->nmrs; i++) {
        if (ix->mrs[i] != m)
            continue;
        ix->mrs[i] = ix->mrs[--ix->nmrs];
        free(m);
        return 0;
    }
    return txi_err(tx, -EINVAL, "deregister: unknown region");
}

/* ---------------------------------------------------------------- peers */

static int ipc_addr(struct wb_tx *tx, struct wb_mpw *w)
{
    struct ipc_tx *ix = ipc_of(tx);
    wb_mpw_array(w, 2);
    wb_mpw_str(w, ix->own.name);
    wb_mpw_i64(w, ix->device);
    return wb_mpw_finish(w);
}

static int ipc_peer_add(struct wb_tx *tx, struct wb_mpr *r, uint32_t index)
{
    struct ipc_tx *ix = ipc_of(tx);
    char name[WB_MBOX_NAME_MAX];
    uint32_t two = 0;
    struct ipc_peer p;
    memset(&p, 0, sizeof(p));
    wb_mpr_array(r, 2, &two);
    wb_mpr_str(r, name, sizeof(name));
    wb_mpr_i64(r, &p.device);
    if (r->err || two != 2)
        return txi_err(tx, -EBADMSG, "peer address: malformed cudaipc body");
    if (!txi_peer_local(tx, index))
        return txi_err(tx, -EHOSTUNREACH,
                       "peer address: cudaipc peer (pid %" PRId64 ") is on another host",
                       txi_peer_pid(tx, index));
    if (ix->npeers == ix->peer_cap) {
        uint32_t cap = ix->peer_cap ? 2 * ix->peer_cap : 8;
        struct ipc_peer *np = realloc(ix->peers, cap * sizeof(*np));
        if (!np)
            return -ENOMEM;
        ix->peers = np;
        ix->peer_cap = cap;
    }
    int e = mbox_open(&p.mb, name, txi_uid(tx));
    if (e)
        return txi_err(tx, e == -ENOENT ? -EHOSTUNREACH : e, "peer address: mailbox %s: %s", name,
                       wb_strerror(e));
    int can = 0;
    if (p.device != ix->device &&
        (cudaDeviceCanAccessPeer(&can, ix->device, (int)p.device) != cudaSuccess || !can)) {
        (void)cudaGetLastError();
        wb_log(WB_LOG_WARN, "transport",
               "cudaipc: GPU %d cannot reach GPU %" PRId64 " directly; copies go through the host",
               ix->device, p.device);
    }
    ix->peers[ix->npeers++] = p;
    return 0;
}

/* ---------------------------------------------------------------- writes */

static void finish(struct ipc_tx *ix, struct ipc_write *w)
{
    ix->peers[w->peer].inflight--;
    wlist_push(&ix->done, w);
}

/* After the copies: tell the destination, or wait for room in its mailbox. */
static void notify(struct ipc_tx *ix, struct ipc_write *w)
{
    struct ipc_peer *p = &ix->peers[w->peer];
    if (!w->err && p->failed) {
        w->err = -WB_E_PEER;
        w->native = 0;
    }
    if (w->err || !w->has_imm) {
        finish(ix, w);
        return;
    }
    if (ix->immq.first) { /* keep FIFO behind the ones already waiting */
        wlist_push(&ix->immq, w);
        return;
    }
    if (mbox_push(&p->mb, w->note) != 0) {
        ix->st.eagain++; /* the destination's ring is full */
        wlist_push(&ix->immq, w);
        return;
    }
    finish(ix, w);
}

static int ipc_note(struct wb_tx *tx, uint32_t peer, uint32_t tag, uint32_t n, void *ctx)
{
    struct ipc_tx *ix = ipc_of(tx);
    struct ipc_peer *p = &ix->peers[peer];
    if (p->failed)
        return txi_err(tx, -WB_E_PEER, "write: peer %u (pid %" PRId64 ") has failed", peer,
                       txi_peer_pid(tx, peer));
    struct ipc_write *w = calloc(1, sizeof(*w));
    if (!w)
        return -ENOMEM;
    *w = (struct ipc_write){.ctx = ctx, .peer = peer, .has_imm = true};
    int e = txi_note_make(tx, peer, n ? WB_TXN_COUNT : WB_TXN_WARMUP, tag, n, 0, 0, 0, w->note);
    if (e < 0) {
        free(w);
        return e;
    }
    p->inflight++;
    ix->st.writes++;
    notify(ix, w);
    return 0;
}

/* A copy completes only once its bytes are in the peer's memory (and its note in the peer's
 * mailbox): a fence completes once nothing but fences is in flight to the peer (fences_reap),
 * so everything queued before it was placed. */
static int ipc_fence(struct wb_tx *tx, uint32_t peer, void *ctx)
{
    struct ipc_tx *ix = ipc_of(tx);
    struct ipc_write *w = calloc(1, sizeof(*w));
    if (!w)
        return -ENOMEM;
    *w = (struct ipc_write){.ctx = ctx, .peer = peer};
    ix->peers[peer].inflight++;
    ix->peers[peer].fences++;
    ix->st.writes++;
    wlist_push(&ix->fenceq, w);
    return 0;
}

/* Completes the fences whose peer has nothing else in flight (or failed). */
static void fences_reap(struct ipc_tx *ix)
{
    struct ipc_wlist wait = ix->fenceq;
    ix->fenceq = (struct ipc_wlist){0};
    for (struct ipc_write *w = wait.first, *next; w; w = next) {
        next = w->next;
        struct ipc_peer *p = &ix->peers[w->peer];
        if (p->failed || p->inflight == p->fences) {
            w->err = p->failed ? -WB_E_PEER : 0;
            p->fences--;
            finish(ix, w);
        } else {
            wlist_push(&ix->fenceq, w);
        }
    }
}

static void *peer_region(struct ipc_tx *ix, uint32_t peer, const struct wb_tx_rdesc *d, int *err)
{
    struct ipc_peer *p = &ix->peers[peer];
    if (d->opaque_len != sizeof(cudaIpcMemHandle_t)) {
        *err =
            txi_err(&ix->base, -EINVAL, "write: descriptor %" PRIu64 " has no IPC handle", d->id);
        return NULL;
    }
    /* A peer in this very process (a trainer and a rollout colocated in one process): its
     * memory is ours to address, and CUDA refuses to open a process's own IPC handle. */
    if (txi_peer_pid(&ix->base, peer) == (int64_t)getpid())
        return (void *)(uintptr_t)d->rail[0].key;
    cudaIpcMemHandle_t h;
    memcpy(&h, d->opaque, sizeof(h));
    for (size_t i = 0; i < p->nmaps; i++)
        if (memcmp(&p->maps[i].handle, &h, sizeof(h)) == 0)
            return p->maps[i].base;
    if (p->nmaps == p->cap && wb_grow(&p->maps, &p->cap, 8, sizeof(*p->maps)) != 0) {
        *err = -ENOMEM;
        return NULL;
    }
    void *base = NULL;
    cudaError_t r = cudaIpcOpenMemHandle(&base, h, cudaIpcMemLazyEnablePeerAccess);
    if (r != cudaSuccess) {
        *err = cuda_err(&ix->base, r, "cudaIpcOpenMemHandle");
        return NULL;
    }
    p->maps[p->nmaps++] = (struct ipc_map){.handle = h, .base = base};
    return base;
}

static int ipc_peer_ptr(struct wb_tx *tx, uint32_t peer, const struct wb_tx_rdesc *d, void **out)
{
    struct ipc_tx *ix = ipc_of(tx);
    if (ix->peers[peer].failed)
        return txi_err(tx, -WB_E_PEER, "peer memory: peer %u (pid %" PRId64 ") has failed", peer,
                       txi_peer_pid(tx, peer));
    cudaError_t dr = cudaSetDevice(ix->device);
    if (dr != cudaSuccess)
        return cuda_err(tx, dr, "cudaSetDevice");
    int err = 0;
    uint8_t *base = peer_region(ix, peer, d, &err);
    if (!base)
        return err;
    *out = base + d->rail[0].addr + d->base;
    return 0;
}

static int ipc_write(struct wb_tx *tx, const struct wb_tx_write *uw)
{
    struct ipc_tx *ix = ipc_of(tx);
    struct ipc_peer *p = &ix->peers[uw->peer];
    if (p->failed)
        return txi_err(tx, -WB_E_PEER, "write: peer %u (pid %" PRId64 ") has failed", uw->peer,
                       txi_peer_pid(tx, uw->peer));
    if (uw->len == 0) {
        if (uw->has_imm)
            return ipc_note(tx, uw->peer, uw->imm, 1, uw->ctx);
        struct ipc_write *w = calloc(1, sizeof(*w));
        if (!w)
            return -ENOMEM;
        *w = (struct ipc_write){.ctx = uw->ctx, .peer = uw->peer};
        p->inflight++;
        ix->st.writes++;
        finish(ix, w);
        return 0;
    }
    /* Streams, events and IPC mappings belong to this transport's device, whatever device the
     * calling thread has current. */
    cudaError_t dr = cudaSetDevice(ix->device);
    if (dr != cudaSuccess)
        return cuda_err(tx, dr, "cudaSetDevice");
    int err = 0;
    uint8_t *base = peer_region(ix, uw->peer, uw->dst, &err);
    if (!base)
        return err;
    struct ipc_write *w = calloc(1, sizeof(*w));
    if (!w)
        return -ENOMEM;
    struct ipc_mr *m = WB_CONTAINER_OF(uw->src, struct ipc_mr, base);
    *w = (struct ipc_write){.ctx = uw->ctx, .peer = uw->peer, .has_imm = uw->has_imm, .src = m};
    if (uw->has_imm) {
        int e = txi_note_make(tx, uw->peer, WB_TXN_COUNT, uw->imm, 1, 0, 0, 0, w->note);
        if (e < 0) {
            free(w);
            return e;
        }
    }
    uint8_t *dst = base + uw->dst->rail[0].addr + uw->dst->base + uw->dst_off;
    const uint8_t *src = (const uint8_t *)m->base.ptr + uw->src_off;
    uint64_t len = uw->len, n = 1;
    if (ix->nrails > 1 && len > ix->cfg.shard_size)
        n = len / ix->cfg.shard_size + (len % ix->cfg.shard_size != 0);
    if (n > ix->nrails)
        n = ix->nrails;
    uint64_t shard = ((len + n - 1) / n + 4095) & ~(uint64_t)4095;
    uint32_t k = 0;
    for (uint64_t off = 0; off < len; off += shard, k++) {
        struct ipc_stream *s = &ix->stream[(ix->rr + k) % ix->nrails];
        uint64_t sl = len - off < shard ? len - off : shard;
        cudaEvent_t ev;
        cudaError_t r = cudaErrorMemoryAllocation;
        if (event_get(ix, &ev) == 0) {
            r = WB_FAULT_HIT(WB_FAULT_POST) /* make fault: as the runtime refuses a copy */
                    ? cudaErrorUnknown
                    : cudaMemcpyAsync(dst + off, src + off, sl, cudaMemcpyDefault, s->s);
            if (r == cudaSuccess)
                r = cudaEventRecord(ev, s->s);
            if (r != cudaSuccess)
                event_put(ix, ev);
        }
        if (r != cudaSuccess) {
            if (k == 0) {
                free(w);
                return cuda_err(tx, r, "cudaMemcpyAsync");
            }
            w->err = -WB_E_CUDA; /* the shards already queued finish, then report this */
            w->native = (int)r;
            (void)cudaGetLastError();
            break;
        }
        struct ipc_shard *sh = &w->shard[k];
        *sh = (struct ipc_shard){.w = w, .ev = ev};
        if (s->last)
            s->last->next = sh;
        else
            s->first = sh;
        s->last = sh;
        w->shards_left++;
        ix->st.ops_posted++;
    }
    ix->rr = (ix->rr + k) % ix->nrails;
    m->busy++;
    p->inflight++;
    ix->st.writes++;
    ix->st.bytes += len;
    return 0;
}

/* ---------------------------------------------------------------- poll */

/* The peer whose writer ring `owner` is (mbox_writer_id of its uid, in its process), or
 * WB_TXN_NOBODY. */
static uint32_t ring_peer(struct ipc_tx *ix, uint64_t owner)
{
    for (uint32_t k = 0; k < ix->npeers; k++)
        if ((uint64_t)txi_peer_pid(&ix->base, k) == owner >> 32 &&
            (txi_peer_uid(&ix->base, k) & 0xffffffffu) == (owner & 0xffffffffu))
            return k;
    return WB_TXN_NOBODY;
}

static void take_note(struct ipc_tx *ix, const void *note, uint32_t src)
{
    struct wb_txn n;
    if (txi_note_accept(&ix->base, note, WB_TXN_WIRE, src, &n) == 1 && (n.flags & WB_TXN_COUNT)) {
        ix->st.imm_recv += n.count;
        txi_imm_arrived(&ix->base, n.tag, n.count);
    }
}

static void count_imm(void *arg, uint64_t owner, const void *note)
{
    struct ipc_tx *ix = arg;
    take_note(ix, note, ring_peer(ix, owner));
}

/* Retires finished copies of one stream (in order). `wait` synchronizes first (close). */
static void stream_reap(struct ipc_tx *ix, struct ipc_stream *s, bool wait)
{
    while (s->first) {
        struct ipc_shard *sh = s->first;
        cudaError_t r = wait ? cudaEventSynchronize(sh->ev) : cudaEventQuery(sh->ev);
        if (r == cudaErrorNotReady)
            return;
        s->first = sh->next;
        if (!s->first)
            s->last = NULL;
        event_put(ix, sh->ev);
        struct ipc_write *w = sh->w;
        if (r != cudaSuccess && !w->err) {
            w->err = -WB_E_CUDA;
            w->native = (int)r;
            (void)cudaGetLastError();
        }
        if (--w->shards_left == 0) {
            w->src->busy--;
            notify(ix, w);
        }
    }
}

static ssize_t ipc_poll(struct wb_tx *tx, struct wb_tx_event *ev, size_t max)
{
    struct ipc_tx *ix = ipc_of(tx);
    uint64_t now = wb_now_ns();
    if (now - ix->last_check >= CHECK_NS) {
        ix->last_check = now;
        for (uint32_t k = 0; k < ix->npeers; k++) {
            struct ipc_peer *p = &ix->peers[k];
            if (!p->failed && p->inflight && !txi_peer_alive(tx, k)) {
                p->failed = true;
                p->fail_err = -WB_E_PEER;
                wb_log(WB_LOG_WARN, "transport", "cudaipc: peer %u (pid %" PRId64 ") is gone", k,
                       txi_peer_pid(tx, k));
            }
        }
    }
    for (uint32_t i = 0; i < ix->nrails; i++)
        stream_reap(ix, &ix->stream[i], false);
    struct ipc_wlist wait = ix->immq;
    ix->immq = (struct ipc_wlist){0};
    for (struct ipc_write *w = wait.first, *next; w; w = next) {
        next = w->next;
        struct ipc_peer *p = &ix->peers[w->peer];
        if (p->failed) {
            w->err = -WB_E_PEER;
            finish(ix, w);
        } else if (ix->immq.first || mbox_push(&p->mb, w->note) != 0) {
            wlist_push(&ix->immq, w);
        } else {
            finish(ix, w);
        }
    }
    fences_reap(ix);
    uint8_t early[WB_TXN_WIRE];
    uint32_t from;
    while (txi_note_early(tx, early, &from))
        take_note(ix, early, from);
    mbox_drain(&ix->own, count_imm, ix);
    size_t n = 0;
    while (ix->done.first && n < max) {
        struct ipc_write *w = ix->done.first;
        ix->done.first = w->next;
        if (!ix->done.first)
            ix->done.last = NULL;
        ev[n++] = (struct wb_tx_event){
            .kind = WB_TX_EV_WRITE, .err = w->err, .native_err = w->native, .ctx = w->ctx};
        if (w->err)
            ix->st.errors++;
        free(w);
    }
    return (ssize_t)(n + txi_imm_drain(tx, ev + n, max - n));
}

/* A writer maps the allocation and stores into it itself: nothing here can refuse a write. */
static int ipc_mr_window(struct wb_tx *tx, struct wb_tx_mr *mr, bool open)
{
    (void)open;
    return txi_err(tx, -ENOTSUP,
                   "window: CUDA IPC writers map region %" PRIu64 " themselves; it stays open",
                   mr->id);
}

/* ---------------------------------------------------------------- query, close, open */

static int ipc_query(struct wb_tx *tx, struct wb_tx_caps *c)
{
    struct ipc_tx *ix = ipc_of(tx);
    *c = (struct wb_tx_caps){.name = "cudaipc",
                             .rails = ix->nrails,
                             .max_write = UINT64_MAX,
                             .max_op = UINT64_MAX,
                             .mem_host = false,
                             .mem_cuda = true,
                             .gpu_direct = true,
                             .needs_reg = true,
                             .same_host = true,
                             .windows = false,
                             .imm_bits = 32,
                             .bw_hint = ix->cfg.bw_hint};
    return 0;
}

static int ipc_stats(struct wb_tx *tx, struct wb_tx_stats *st)
{
    *st = ipc_of(tx)->st;
    return 0;
}

static void free_wlist(struct ipc_wlist *l)
{
    for (struct ipc_write *w = l->first, *next; w; w = next) {
        next = w->next;
        free(w);
    }
    *l = (struct ipc_wlist){0};
}

static void ipc_close(struct wb_tx *tx)
{
    struct ipc_tx *ix = ipc_of(tx);
    if (ix->stream[0].s)
        cudaSetDevice(ix->device);
    for (uint32_t i = 0; i < ix->nrails; i++) {
        if (!ix->stream[i].s)
            continue;
        stream_reap(ix, &ix->stream[i], true); /* copies finish before memory goes */
        cudaStreamDestroy(ix->stream[i].s);
    }
    free_wlist(&ix->immq);
    free_wlist(&ix->fenceq);
    free_wlist(&ix->done);
    for (size_t i = 0; i < ix->nspare; i++)
        cudaEventDestroy(ix->spare[i]);
    free(ix->spare);
    for (uint32_t k = 0; k < ix->npeers; k++) {
        struct ipc_peer *p = &ix->peers[k];
        for (size_t i = 0; i < p->nmaps; i++)
            cudaIpcCloseMemHandle(p->maps[i].base);
        free(p->maps);
        mbox_close(&p->mb);
    }
    free(ix->peers);
    for (size_t i = 0; i < ix->nmrs; i++)
        free(ix->mrs[i]);
    free(ix->mrs);
    mbox_close(&ix->own);
    (void)cudaGetLastError();
    txi_core_fini(tx);
    free(ix);
}

static const struct wb_tx_ops ipc_ops = {
    .name = "cudaipc",
    .query = ipc_query,
    .addr = ipc_addr,
    .peer_add = ipc_peer_add,
    .mr_reg = ipc_mr_reg,
    .mr_rdesc = ipc_mr_rdesc,
    .mr_dereg = ipc_mr_dereg,
    .mr_window = ipc_mr_window,
    .write = ipc_write,
    .note = ipc_note,
    .fence = ipc_fence,
    .peer_ptr = ipc_peer_ptr,
    .poll = ipc_poll,
    .stats = ipc_stats,
    .close = ipc_close,
};

int txi_cudaipc_open(const struct wb_tx_cfg *cfg, struct wb_errlist *el, struct wb_tx **out)
{
    int n = wb_gpu_count();
    if (n == 0) {
        wb_errlist_add(el, "transport.backend: cudaipc needs a GPU and none is usable");
        return -WB_E_NOGPU;
    }
    if (cfg->device >= n) {
        wb_errlist_add(el, "transport.device: %" PRId64 " but this host has %d GPU(s)", cfg->device,
                       n);
        return -EINVAL;
    }
    struct ipc_tx *ix = calloc(1, sizeof(*ix));
    if (!ix)
        return -ENOMEM;
    int e = txi_core_init(&ix->base, &ipc_ops, WB_TX_CUDAIPC);
    if (e) {
        free(ix);
        return e;
    }
    ix->cfg = *cfg;
    ix->cfg.provider = ix->cfg.domain = NULL;
    ix->nrails = (uint32_t)cfg->rails;
    cudaError_t r = cfg->device >= 0 ? cudaSetDevice((int)cfg->device) : cudaGetDevice(&ix->device);
    if (cfg->device >= 0)
        ix->device = (int)cfg->device;
    for (uint32_t i = 0; r == cudaSuccess && i < ix->nrails; i++)
        r = cudaStreamCreateWithFlags(&ix->stream[i].s, cudaStreamNonBlocking);
    if (r != cudaSuccess) {
        wb_errlist_add(el, "cudaipc: GPU %d: %s", ix->device, cudaGetErrorString(r));
        ipc_close(&ix->base);
        return -WB_E_CUDA;
    }
    e = mbox_create(&ix->own, txi_uid(&ix->base));
    if (e) {
        wb_errlist_add(el, "cudaipc: mailbox in /dev/shm: %s", wb_strerror(e));
        ipc_close(&ix->base);
        return e;
    }
    *out = &ix->base;
    return 0;
}
