/* fabric.h — private header of the libfabric backend (transport/fabric/).
 *
 * One FI_EP_RDM endpoint per rail, each with its own fabric, domain, AV and CQ, so rails can be
 * different NICs (efa: one domain per NIC) or, on tcp, different connections over one interface.
 * Files:
 *   fabric.c         open/close, rails, peers, registration, query
 *   fabric_post.c    writes: splitting into shards and pieces, the bounce stage, pending queues,
 *                    batched posting, batched completion reading, staged commits, peer failure
 *   fabric_cuda.c    the CUDA half of the bounce/staging path (streams, events, pinned memory)
 *   fabric_nocuda.c  the same interface without CUDA (host copies only)
 *
 * Why a bounce/staging path at all: none of the libfabric providers on the project's machines
 * registers CUDA memory (no FI_HMEM). A device source is then copied into pinned host chunks
 * (cudaMemcpyAsync, one stream, events) while earlier chunks are on the wire; a device
 * destination is given a pinned host mirror that peers write into, and the writer follows the
 * data of each write with a small "commit" message; the owner copies the committed range to the
 * device and only then counts the write's immediate. The same code runs on host memory when
 * stage_host is set, which is how it is tested on machines without a GPU.
 *
 * Immediates: every write that carries one, and every write into a staged region, is followed
 * by a note (transport/note.c) sent as a message once the write's data operations completed
 * with FI_DELIVERY_COMPLETE — so the destination counts each user write exactly once, whatever
 * its split across rails and bounce chunks, and only after its bytes are in place. Notes are
 * received into buffers posted on each rail and read with their source address (FI_SOURCE):
 * the provider names the sending endpoint when it is in this transport's address vector, and
 * a note from any other is a stranger's. Nothing is ever written into this transport's own
 * control memory, and the provider's remote CQ data is not used: a write carrying some comes
 * from no peer of ours. (pplx-garden instead tags every shard and makes receivers expect
 * shards; hiding the split keeps the plan independent of the writer's rail count, at one small
 * message per striped write.)
 *
 * Windows: a destination registration is closed by closing its provider registrations and
 * opened by registering the same memory again under the same requested keys, so writers keep
 * their descriptors; the providers here (tcp, shm) then refuse a write with its key. A provider
 * that chooses its own keys cannot reopen under the old key: the window stays open there.
 */
#ifndef WB_TX_FABRIC_H
#define WB_TX_FABRIC_H

#include "transport/tx_priv.h"

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>
#include <signal.h>
#include <stdbool.h>

enum {
    FAB_NAME_MAX = 64, /* endpoint address bytes */
    /* Note receives posted per rail. Many: a message that finds none posted waits in the
     * provider as an unexpected message holding a whole eager buffer (1 KiB on tcp;ofi_rxm as
     * we set it), so a burst of them — a flood from a stranger — would cost memory in
     * proportion. */
    FAB_NRECV = 1024,
    /* Bytes per note receive buffer: the largest message of notes a peer sends (notes queued
     * together to one peer on one rail go as one message, up to this and the inject size). */
    FAB_MSG_SIZE = 896,
    FAB_CHECK_NS = 100 * 1000 * 1000, /* liveness/timeout checks at most every 100 ms */
    FAB_PAD = 64,                     /* bytes of a rail's fence pad */
    FAB_MAX_OP = 1 << 30,             /* largest provider operation (tcp and shm report SIZE_MAX) */
};

enum fab_op_kind { OP_DATA = 1, OP_NOTE, OP_RECV };
enum fab_op_state { ST_FREE = 0, ST_COPYQ, ST_COPYING, ST_PENDING, ST_POSTED, ST_ABANDONED };

struct fab_write;
struct fab_chunk;

/* One provider operation. In exactly one list (per its state) at any time. */
struct fab_op {
    struct fi_context2 fctx; /* the context handed to libfabric (FI_CONTEXT/FI_CONTEXT2 modes) */
    struct fab_op *next, *prev;
    struct fab_write *w;
    struct fab_mr *mr; /* source registration kept busy, or NULL */
    uint8_t kind, state, rail;
    uint32_t peer;
    void *lbuf, *ldesc;   /* local buffer and its descriptor */
    const void *copy_src; /* bounce: where the chunk is filled from */
    struct fab_chunk *chunk;
    void *gpu_ev;
    uint64_t len, raddr, rkey, data, flags;
    uint64_t t_post;           /* ns, for op_timeout */
    struct fab_op *prog;       /* OP_DATA of a progress write: its piece's note, sent once done */
    uint8_t note[WB_TXN_WIRE]; /* OP_NOTE: what is sent */
};

struct fab_list {
    struct fab_op *first, *last;
    size_t n;
    uint64_t bytes; /* of its OP_DATA operations */
};

/* One wb_tx_write (or wb_tx_write_imm): done when `left` reaches 0. */
struct fab_write {
    struct fab_write *next; /* done list / free list */
    void *ctx;
    uint32_t peer, left;
    int err, native_err;
    bool final_started;
    struct fab_op *final_op; /* its note, made when queued and enqueued after its data */
};

struct fab_chunk {
    struct fab_chunk *next;
    uint8_t *ptr;
};

struct fab_rail {
    struct fi_info *info;
    struct fid_fabric *fabric;
    struct fid_domain *domain;
    struct fid_av *av;
    struct fid_cq *cq;
    struct fid_ep *ep;
    uint8_t name[FAB_NAME_MAX];
    size_t namelen;
    uint64_t mr_mode, max_msg, window;
    size_t inject_size;
    size_t key_size;        /* bytes of the domain's memory keys (0: not said) */
    struct fid_mr *ctrl_mr; /* the note receive buffers (local use only) */
    void *ctrl_desc;
    /* The fence pad: FAB_PAD bytes a peer's fence writes (delivery-complete) and nothing reads;
     * the first 8 are what this side's fences write from. */
    struct fid_mr *pad_mr;
    void *pad_desc;
    uint64_t pad_key;
    uint32_t *fa_peer; /* AV index -> peer index + 1 (0: none), for notes' source addresses */
    size_t nfa;
    struct fid_mr *pool_mr; /* bounce pool, registered on first use */
    void *pool_desc;
    /* Operations not yet posted: notes (not fences) in `notes`, posted before any data in
     * `pending`, so that a note is never queued behind data it does not follow; `posted`: with
     * the provider, at most `window` of them and, beyond the first, inflight_bytes of data. */
    struct fab_list notes, pending, posted;
    /* Since when the provider has refused the head of `pending` (-FI_EAGAIN), 0: not refused.
     * tcp;ofi_rxm refuses every operation to a peer it cannot connect to (an address whose
     * endpoint closed: a peer set up again) and retries the connection on each post, forever;
     * op_timeout counts from here too, or such a write would never be reported. */
    uint64_t refused_since;
    uint8_t batch[FAB_MSG_SIZE]; /* notes going out as one message */
    struct fab_op recv[FAB_NRECV];
    uint64_t recv_repost[FAB_NRECV / 64]; /* receives to post again (EAGAIN), a bit each */
};

struct fab_peer {
    fi_addr_t fa[WB_TX_MAX_RAILS]; /* per local rail: the remote rail it talks to */
    uint64_t pad_addr[WB_TX_MAX_RAILS], pad_key[WB_TX_MAX_RAILS]; /* that rail's fence pad */
    uint32_t nrem;
    bool failed;
    int fail_err, fail_native;
    uint64_t inflight; /* operations queued or posted */
};

struct fab_mr {
    struct wb_tx_mr base;
    struct fid_mr *mr[WB_TX_MAX_RAILS];
    void *desc[WB_TX_MAX_RAILS];
    uint64_t key[WB_TX_MAX_RAILS];
    bool bounce;   /* source sent through bounce chunks (nothing registered for SRC) */
    void *mirror;  /* staged destination: the host mirror peers write into */
    bool pinned;   /* mirror from cudaHostAlloc */
    uint64_t busy; /* operations reading it, staged copies writing it */
    bool closed;   /* DST window closed: no provider registration */
    void *target;  /* what the provider registrations cover (ptr or mirror) */
    uint64_t acc;  /* their access flags */
    int dev;       /* their device (-1: host memory) */
};

/* A staged copy (mirror -> registered memory) in flight at the destination. */
struct fab_stage {
    struct fab_stage *next;
    struct fab_mr *mr;
    void *ev;
    uint32_t tag;
    bool has_imm;
};

struct fab_gpu;

struct fab_slab {
    struct fab_slab *next;
};

struct fab_tx {
    struct wb_tx base;
    struct wb_tx_cfg cfg; /* scalars only; strings are not kept */
    char prov[64], name[96];
    uint32_t nrails;
    struct fab_rail rail[WB_TX_MAX_RAILS];
    bool hmem; /* the provider registers CUDA memory */
    /* Notes may follow their write's data on the same rail without waiting for its delivery:
     * tcp;ofi_rxm, whose target reads one connection's stream in order and places an RMA
     * write's payload before it reads the next message's header (prov/tcp: the receive state
     * machine finishes a write's payload first). Not shm (a large write may finish in segments
     * after later commands were processed) nor the hardware providers (no such promise). */
    bool ordered;
    int gpu_device; /* device of the first device registration, -1 before */
    struct fab_gpu *gpu;
    uint8_t *ctrl; /* note receive buffers, all rails */
    uint8_t *pad;  /* fence pads, FAB_PAD bytes a rail */
    uint32_t rr;   /* next rail for round-robin */
    struct fab_peer *peers;
    uint32_t npeers, peer_cap;
    struct fab_mr **mrs; /* sorted by id */
    size_t nmrs, mrs_cap;
    /* bounce pool */
    uint8_t *pool;
    bool pool_pinned;
    struct fab_chunk *chunks, *free_chunks;
    struct fab_list copyq, copying;
    /* staged copies at the destination, FIFO (one stream) */
    struct fab_stage *stage_first, *stage_last;
    /* allocation */
    struct fab_slab *slabs;
    struct fab_op *free_ops;
    struct fab_write *free_writes;
    struct fab_write *done_first, *done_last;
    struct fab_write *fences; /* fences waiting for their peer's operations (not ordered) */
    uint64_t last_check;
    struct wb_tx_stats st;
};

static inline struct fab_tx *fab_of(struct wb_tx *tx)
{
    return WB_CONTAINER_OF(tx, struct fab_tx, base);
}

/* fabric_post.c */
int fab_write(struct wb_tx *tx, const struct wb_tx_write *w);
int fab_note(struct wb_tx *tx, uint32_t peer, uint32_t tag, uint32_t n, void *ctx);
int fab_fence(struct wb_tx *tx, uint32_t peer, void *ctx);
ssize_t fab_poll(struct wb_tx *tx, struct wb_tx_event *ev, size_t max);
/* Posts the note receives of a rail (at open). */
int fab_post_recvs(struct fab_tx *fx, uint32_t rail);
/* Frees operation slabs and bookkeeping lists (close). */
void fab_post_fini(struct fab_tx *fx);

/* fabric.c */
struct fab_mr *fab_mr_find(struct fab_tx *fx, uint64_t id);
/* Registers the bounce pool on every rail (first bounced write). */
int fab_pool_init(struct fab_tx *fx);

/* fabric_cuda.c / fabric_nocuda.c */
bool fab_gpu_available(void);
int fab_gpu_open(int device, struct fab_gpu **out);
/* Waits for every copy, then frees (NULL-safe). */
void fab_gpu_close(struct fab_gpu *g);
int fab_gpu_host_alloc(size_t len, bool pinned, void **out);
void fab_gpu_host_free(void *p, bool pinned);
/* Starts a copy on stream 0 (to host) or 1 (to device). Host-to-host copies are done at once and
 * *ev is NULL; otherwise *ev is queried with fab_gpu_done(). *native: cudaError_t on failure. */
int fab_gpu_copy(struct fab_gpu *g, int stream, void *dst, const void *src, size_t len, void **ev,
                 int *native);
/* 1 when the copy behind ev finished (ev is released), 0 while running, -WB_E_CUDA (released). */
int fab_gpu_done(struct fab_gpu *g, void *ev, int *native);

/* fabric_dl.c: libfabric loaded at the first open, signal handlers kept (see there). */
enum { FAB_NSIG = NSIG }; /* signals 1..NSIG-1: standard and real-time */
struct fab_sigs {
    struct sigaction act[FAB_NSIG];
    bool have[FAB_NSIG]; /* sigaction could query it (not for 32/33, glibc's own) */
};
/* Saves the disposition of every signal that can be queried. */
void fab_sig_save(struct fab_sigs *s);
/* Puts back every saved disposition that differs now (handler, flags or mask); leaves the
 * others alone. Returns how many it put back. */
int fab_sig_restore(const struct fab_sigs *s);
/* fab_sig_restore, saying at debug level what it put back after what. */
void fab_sig_keep(const struct fab_sigs *s, const char *after);
/* Loads libfabric once per process (environment and handlers as fabric_dl.c says); NULL, or
 * why it could not. Every function below needs it to have succeeded, except fab_strerror. */
const char *fab_dl_open(void);
/* fi_getinfo(version, NULL, NULL, 0, hints, info), fi_fabric, fi_dupinfo, fi_freeinfo (NULL is
 * fine), fi_strerror: the functions libfabric exports that this backend calls. */
int fab_getinfo(uint32_t version, const struct fi_info *hints, struct fi_info **info);
int fab_fabric_open(struct fi_fabric_attr *attr, struct fid_fabric **fabric);
struct fi_info *fab_dupinfo(const struct fi_info *info);
void fab_freeinfo(struct fi_info *info);
const char *fab_strerror(int e);

#endif /* WB_TX_FABRIC_H */
