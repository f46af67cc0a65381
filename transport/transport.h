/* transport.h — the one public header of transport/: one-sided WRITE with 32-bit immediates,
 * reliable and unordered, behind one ops table with several backends.
 *
 * Model (from the reference design and published libfabric practice):
 *  - A transport is opened from a config (backend, provider, rails). It has one endpoint per
 *    rail; large writes are split into aligned shards striped across the rails.
 *  - Memory is registered once. A registration meant as a write destination yields a remote
 *    descriptor (one (address, key) per rail) that is serialized with wb_tx_rdesc_put() and sent
 *    to writers over the control plane.
 *  - Peers are added from the address blob a transport writes with wb_tx_addr().
 *  - wb_tx_write() copies [src+src_off, +len) into the peer's region at dst_off, optionally with a
 *    32-bit immediate. Nothing is ordered: two writes land in either order, and one write's
 *    immediate says nothing about another write. The one promise is that a write's immediate is
 *    counted at the destination only after all of that write's bytes are in place (in device
 *    memory, for device regions).
 *  - The destination counts immediates per tag (wb_tx_expect(tag, n)) and is told once when n
 *    arrivals are reached, through wb_tx_poll() — writers agree on n with the receiver, the
 *    transport never reorders or waits.
 *  - An immediate travels as a *note* (transport/note.c): the tag with the transfer attempt's
 *    64-bit random epoch and version, a per-(peer, tag) sequence number, both transports'
 *    identities and a SipHash MAC under the attempt's 128-bit key, sent once the write's bytes
 *    are delivered (or, where the provider reads a connection in order, right behind them on
 *    the same connection); one note may stand for n writes of one tag (wb_tx_write_imms).
 *    A fence (wb_tx_fence) completes once every write with an immediate sent to a peer before
 *    it was placed.
 *    A destination counts a note only from a peer it added, of the attempt it
 *    has begun (wb_tx_attempt_begin), with a valid MAC and never twice; everything else is
 *    dropped, counted (wb_tx_note_stats) and logged at most once a second. Beginning an
 *    attempt resets every counter, so nothing received before can complete it.
 *  - A destination region accepts writes only while its window is open (wb_tx_mr_window):
 *    closed, a write with its key is refused by the provider and lands nowhere.
 *  - Every write is checked against its descriptor before anything is posted: a write outside
 *    the destination (or source) region returns -WB_E_BOUNDS and posts nothing.
 *
 * Zero-length writes (a real bug in the reference: a 0-length write addressed at the end of a
 * region). Decision: a zero-length write is valid at any dst_off <= size, the end included, and
 * posts no data operation at all, so no provider ever sees an address at or past a region's end.
 * With an immediate, the immediate travels alone (like wb_tx_write_imm()); without one the write
 * completes locally at the next poll. dst_off > size is -WB_E_BOUNDS like any other violation.
 *
 * Progress: software providers (tcp, shm) and the CUDA IPC mailbox move data only while both
 * sides call wb_tx_poll(), so a passive destination must still poll (it is the call that counts
 * its immediates); a destination silent for longer than op_timeout is failed by its writers.
 * A transport is not thread-safe: one thread owns it.
 *
 * Failure: every accepted write is reported exactly once. An error completion fails its peer:
 * queued writes to it complete with -WB_E_PEER and new ones are refused; a same-host peer whose
 * process is gone is noticed within 100 ms even where the provider never reports it (shm).
 *
 * Backends (see the registry in transport.c): "fabric" (libfabric FI_EP_RDM: efa,
 * verbs;ofi_rxm, tcp, shm), "cudaipc" (GPUs of one host), "verbs" (slot for the later libibverbs
 * RC backend; opening it returns -ENOTSUP).
 */
#ifndef WB_TRANSPORT_H
#define WB_TRANSPORT_H

#include "common/common.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- configuration */

enum wb_tx_backend { WB_TX_FABRIC = 0, WB_TX_CUDAIPC, WB_TX_VERBS, WB_TX_BACKEND_COUNT };

enum { WB_TX_MAX_RAILS = 8 };

enum wb_tx_hmem { WB_TX_HMEM_AUTO = 0, WB_TX_HMEM_OFF };

/* Loaded from YAML by wb_cfg_parse(wb_tx_cfg_fields, ...) or filled with wb_cfg_defaults();
 * free with wb_cfg_free(wb_tx_cfg_fields, cfg). */
struct wb_tx_cfg {
    int backend;             /* enum wb_tx_backend */
    char *provider;          /* fabric: libfabric provider ("tcp", "shm", "efa", "verbs;ofi_rxm") */
    char *domain;            /* fabric: comma-separated domain (NIC / interface) names, "" = all */
    uint64_t rails;          /* endpoints (fabric) or copy streams (cudaipc), 1..WB_TX_MAX_RAILS */
    uint64_t shard_size;     /* writes longer than this are split across rails */
    uint64_t window;         /* operations in flight per rail (0: the provider's queue size) */
    uint64_t inflight_bytes; /* fabric: data bytes posted per rail (0: no bound) */
    uint64_t post_batch;     /* operations posted per rail per poll */
    uint64_t cq_batch;       /* completions read per fi_cq_read */
    int hmem;                /* enum wb_tx_hmem: register device memory with the provider */
    bool stage_host;         /* fabric: move host memory through the bounce/staging path too */
    uint64_t bounce_size;    /* bytes per pinned bounce chunk (device sources without FI_HMEM) */
    uint64_t bounce_chunks;  /* bounce chunks, i.e. device-to-host copies in flight */
    uint64_t op_timeout;     /* ns an operation may stay in flight before its peer is failed */
    int64_t device;          /* cudaipc: CUDA device of this process (-1: the current one) */
    uint64_t bw_hint;        /* bytes/s reported by query (0: what the backend can tell) */
};

/* The table behind struct wb_tx_cfg: keys, types, defaults and docs. */
extern const struct wb_cfg_field wb_tx_cfg_fields[];

/* Points a filled config at a data path by the name a job file uses: "cudaipc" (or "cuda_ipc")
 * selects the CUDA IPC backend; any other name is a libfabric provider ("tcp", "shm", "efa",
 * "verbs;ofi_rxm") of the fabric backend. Callers never branch on backend names themselves.
 * Returns 0 or -ENOMEM (cfg unchanged). */
int wb_tx_cfg_provider(struct wb_tx_cfg *cfg, const char *provider);

/* ---------------------------------------------------------------- objects */

struct wb_tx;
struct wb_tx_ops;
struct wb_tx_core; /* backend-independent state: peers, immediate counters (transport.c) */

/* The base object every backend embeds; backends recover their type with WB_CONTAINER_OF. */
struct wb_tx {
    const struct wb_tx_ops *ops;
    struct wb_tx_core *core;
};

enum wb_tx_mem { WB_TX_MEM_HOST = 0, WB_TX_MEM_CUDA };

/* Access requested at registration. SRC: the region is a local write source. DST: peers write
 * into it (wb_tx_rdesc() then describes it). A fabric provider without FI_HMEM keeps a pinned
 * host mirror of a DST device region, so ask for DST only where peers write. */
enum wb_tx_access { WB_TX_ACCESS_SRC = 1, WB_TX_ACCESS_DST = 2 };

/* A local registration (the backend's handle embeds it). Read-only for callers. */
struct wb_tx_mr {
    void *ptr;
    uint64_t size;
    enum wb_tx_mem mem;
    int device;      /* CUDA device of device memory, -1 for host memory */
    unsigned access; /* enum wb_tx_access bits */
    uint64_t id;     /* unique within its transport, never reused */
};

enum { WB_TX_RDESC_OPAQUE = 80 };

/* Flags of a remote descriptor. STAGED: the region is device memory reached through a host
 * mirror; the owner copies landed bytes to the device before counting their immediate. */
enum wb_tx_rdesc_flags { WB_TX_RDESC_STAGED = 1u };

/* A remote descriptor: what a writer needs to address a peer's region. Plain data, safe to copy
 * and to send (wb_tx_rdesc_put/get). */
struct wb_tx_rdesc {
    uint32_t backend; /* enum wb_tx_backend of the owner */
    uint32_t flags;   /* enum wb_tx_rdesc_flags */
    uint64_t owner;   /* uid of the owning transport (must be the peer written to) */
    uint64_t id;      /* the owner's wb_tx_mr.id */
    uint64_t size;    /* writable bytes: [0, size) */
    uint64_t base;    /* where [0, size) starts in the owner's registration (0; a view's offset) */
    uint32_t nrails;
    struct {
        uint64_t addr, key;
    } rail[WB_TX_MAX_RAILS];
    uint32_t opaque_len; /* backend bytes (CUDA IPC handle) */
    uint8_t opaque[WB_TX_RDESC_OPAQUE];
};

/* One write. `dst` and the struct itself are read only during wb_tx_write(). */
struct wb_tx_write {
    const struct wb_tx_mr *src; /* registered with WB_TX_ACCESS_SRC; may be NULL when len == 0 */
    uint64_t src_off;
    uint32_t peer; /* index from wb_tx_peer_add() */
    const struct wb_tx_rdesc *dst;
    uint64_t dst_off;
    uint64_t len;
    bool has_imm;
    uint32_t imm; /* the tag counted at the destination when has_imm */
    void *ctx;    /* returned in the completion event */
    /* The destination hears of each piece as it is placed, under the tag `imm` (with or
     * without has_imm), before the write counts (wb_tx_on_progress: a destination that
     * forwards what landed starts early). Fabric backend, destinations without staging;
     * elsewhere nothing is heard. */
    bool progress;
    /* Completes only once a note sent to the peer after its completion cannot be read before
     * its bytes are placed (delivery-complete, or on an ordered connection once in the
     * stream): for a write without an immediate whose bytes a later note announces. */
    bool settle;
};

enum wb_tx_event_kind {
    WB_TX_EV_WRITE = 1, /* a wb_tx_write()/wb_tx_write_imm() finished (err says how) */
    WB_TX_EV_IMM,       /* an expectation set with wb_tx_expect() (no callback) was reached */
};

/* Completion entry. err is 0, or a negative errno / -WB_E_* (-WB_E_PEER: the peer died or
 * failed; -ETIMEDOUT: op_timeout passed); native_err is the library's own code (libfabric
 * prov_errno, cudaError_t), 0 when there is none. */
struct wb_tx_event {
    enum wb_tx_event_kind kind;
    int err;
    int native_err;
    uint32_t tag; /* WB_TX_EV_IMM: the tag */
    void *ctx;    /* WB_TX_EV_WRITE: the write's ctx; WB_TX_EV_IMM: wb_tx_expect()'s arg */
};

/* What a backend can do; the planner and agent decide from this, never from the name. */
struct wb_tx_caps {
    const char *name;   /* for logs: "fabric/tcp;ofi_rxm", "cudaipc" */
    uint32_t rails;     /* endpoints or streams in use */
    uint64_t max_write; /* largest single wb_tx_write (the transport splits internally) */
    uint64_t max_op;    /* largest operation handed to the provider in one piece */
    bool mem_host;      /* host memory can be registered */
    bool mem_cuda;      /* CUDA device memory can be registered */
    bool gpu_direct;    /* device memory is written in place (FI_HMEM, IPC), not staged */
    bool needs_reg;     /* sources and destinations must be registered (always, today) */
    bool same_host;     /* peers must be on this host */
    bool windows;       /* a DST registration's window can be closed (wb_tx_mr_window) */
    uint32_t imm_bits;  /* immediate width: 32 */
    uint64_t bw_hint;   /* bytes/s over all rails, 0 when unknown */
};

/* What became of the notes that arrived here (wb_tx_note_stats): counted ones, ones kept for
 * an attempt this side had not begun yet, and the refusals by reason. */
struct wb_tx_note_stats {
    uint64_t accepted; /* passed every check (counted, or a staged range copied) */
    uint64_t early;    /* kept for an attempt not begun here yet (checked again when it is) */
    uint64_t stranger; /* from no peer this transport added (or a provider write with CQ data) */
    uint64_t stale;    /* of an attempt that is over, or of none */
    uint64_t forged;   /* malformed, another's identity, a wrong MAC or version */
    uint64_t replayed; /* a (sender, tag, seq) counted before in this attempt */
    uint64_t full;     /* no room left in the attempt's bounded tables */
};

struct wb_tx_stats {
    uint64_t writes, bytes; /* accepted by wb_tx_write / wb_tx_write_imm */
    uint64_t ops_posted;    /* provider operations (shards, chunks, immediates, commits) */
    uint64_t eagain;        /* times the provider said -FI_EAGAIN */
    uint64_t errors;        /* error completions delivered */
    uint64_t imm_recv;      /* immediates counted here */
    uint64_t progress_recv; /* progress notes heard here (wb_tx_on_progress) */
    uint64_t bounce_copies; /* device->host copies into bounce chunks */
    uint64_t staged_copies; /* host mirror->device copies of landed bytes */
};

/* Callback for a reached expectation, called from inside wb_tx_poll(). It may call
 * wb_tx_expect() and wb_tx_write() (they only queue work) but not wb_tx_poll() or close. */
typedef void (*wb_tx_imm_cb)(void *arg, uint32_t tag);

/* ---------------------------------------------------------------- the ops table
 *
 * Every slot is set; an unsupported operation is a stub returning -ENOTSUP. No slot blocks
 * waiting for the network or a peer: work is queued and advanced by poll. Unless said otherwise
 * a slot returns 0 or a negative errno / -WB_E_*, leaves no state behind on failure, and
 * explains a failure in wb_tx_errmsg(). Callers use the wb_tx_* wrappers below, which do the
 * backend-independent checks (bounds, peers) first. */
struct wb_tx_ops {
    const char *name;

    /* Fills *caps. Never fails for an open transport. */
    int (*query)(struct wb_tx *tx, struct wb_tx_caps *caps);

    /* Appends this transport's address body (one entry per rail) to w; the wrapper writes the
     * versioned header around it. -ENOMEM from the writer. */
    int (*addr)(struct wb_tx *tx, struct wb_mpw *w);

    /* Reads a peer's address body from r (header already checked) and makes it peer `index`
     * (the wrapper assigns indices in order). -EBADMSG for a malformed body, -EPROTO for a
     * peer of another provider, -EHOSTUNREACH for a peer this backend cannot reach (cudaipc on
     * another host), -WB_E_FABRIC when the provider refuses the address. */
    int (*peer_add)(struct wb_tx *tx, struct wb_mpr *r, uint32_t index);

    /* Registers [ptr, ptr+len) (host or CUDA device memory, detected) for `access`. The memory
     * stays owned by the caller and must outlive the registration. -EINVAL for len 0 or no
     * access bits, -ENOTSUP for a memory kind the backend cannot use, -WB_E_FABRIC/-WB_E_CUDA
     * when the library refuses. On success *out is the handle. */
    int (*mr_reg)(struct wb_tx *tx, void *ptr, uint64_t len, unsigned access,
                  struct wb_tx_mr **out);

    /* Describes a DST registration for peers (*out written on success). -EINVAL when mr was
     * not registered with WB_TX_ACCESS_DST. */
    int (*mr_rdesc)(struct wb_tx *tx, const struct wb_tx_mr *mr, struct wb_tx_rdesc *out);

    /* Releases a registration. -EBUSY (and nothing released) while writes from or staged copies
     * into it are in flight; writes already reported failed with their peer do not count. A
     * peer may still hold the old descriptor: the owner must tell its writers first (a write
     * through a stale descriptor is not detected by every provider — tcp drops it silently). */
    int (*mr_dereg)(struct wb_tx *tx, struct wb_tx_mr *mr);

    /* Queues a write already checked by wb_tx_check_write(). Returns 0 when queued (exactly
     * one WB_TX_EV_WRITE follows from poll), -WB_E_PEER when the peer has failed, -ENOMEM.
     * Nothing is posted on failure. */
    int (*write)(struct wb_tx *tx, const struct wb_tx_write *w);

    /* Queues a note without data to `peer`: n > 0, n immediates of `tag` at once (counted
     * there like n writes' immediates); n == 0, a warm-up nothing counts (wb_tx_connect).
     * Returns as write does. */
    int (*note)(struct wb_tx *tx, uint32_t peer, uint32_t tag, uint32_t n, void *ctx);

    /* Queues a fence to `peer`: its one WB_TX_EV_WRITE comes once every write with an
     * immediate queued to the peer before it was placed there (wb_tx_fence); err set if the
     * peer failed. A write the peer refused is not reported by the fence. Returns as write
     * does. */
    int (*fence)(struct wb_tx *tx, uint32_t peer, void *ctx);

    /* Opens or closes a DST registration's window: closed, the provider refuses writes with
     * its key (they land nowhere); opened again, the same descriptor works. A registration
     * starts open. -ENOTSUP where the backend cannot (a provider that chooses its own keys, or
     * CUDA IPC, whose writers map the memory itself): the caller then relies on keys alone. */
    int (*mr_window)(struct wb_tx *tx, struct wb_tx_mr *mr, bool open);

    /* The address at which this process reaches byte 0 of the destination region `dst` of
     * `peer` (already checked by wb_tx_peer_ptr()). -ENOTSUP where the backend cannot (fabric:
     * a peer's memory is reached through the NIC only). */
    int (*peer_ptr)(struct wb_tx *tx, uint32_t peer, const struct wb_tx_rdesc *dst, void **out);

    /* Advances everything: posts queued work (batched, up to the window), reads completions
     * in batches, counts arrived immediates, checks peers' liveness and op_timeout. Writes up
     * to max events and returns their number; events that do not fit stay queued. A negative
     * return is a fatal error of the transport (it must then be closed). */
    ssize_t (*poll)(struct wb_tx *tx, struct wb_tx_event *ev, size_t max);

    /* Counters since open. */
    int (*stats)(struct wb_tx *tx, struct wb_tx_stats *st);

    /* Frees everything, whatever state the transport is in (also right after a failed call or
     * a dead peer): operations still in flight are cancelled without events, registrations are
     * released. The memory the caller registered is untouched. */
    void (*close)(struct wb_tx *tx);
};

/* ---------------------------------------------------------------- opening and describing */

/* Opens the backend cfg->backend. Problems are appended to el ("transport.rails: ...",
 * "fabric: provider 'x': fi_getinfo: No data available") and returned as -EINVAL,
 * -ENOTSUP (backend not built / not implemented), -WB_E_NOGPU, -WB_E_FABRIC, -WB_E_CUDA. */
int wb_tx_open(const struct wb_tx_cfg *cfg, struct wb_errlist *el, struct wb_tx **out);

/* The backend names in enum order ("fabric", "cudaipc", "verbs"). */
const char *wb_tx_backend_name(enum wb_tx_backend b);

/* The explanation of the last failed call on tx ("" when none). */
const char *wb_tx_errmsg(const struct wb_tx *tx);

/* Writes the versioned address blob [version, backend, uid, host, pid, start, body]. */
int wb_tx_addr(struct wb_tx *tx, struct wb_mpw *w);

/* Adds a peer from a blob written by wb_tx_addr() (exactly one object read from r). *peer is
 * its index for wb_tx_write(). -WB_E_VERSION for another blob version, -EPROTO for another
 * backend, -EEXIST for this transport's own blob, else as the backend's peer_add. */
int wb_tx_peer_add(struct wb_tx *tx, struct wb_mpr *r, uint32_t *peer);

/* A view of a descriptor: bytes [off, off + len) of d, addressed from 0 and bounded by len, so
 * that one registration (a whole allocation) can be handed out as one descriptor per tensor and
 * every write is still checked against the tensor it lands in. -WB_E_BOUNDS when the range is
 * not inside d (overflow-safe). */
int wb_tx_rdesc_view(const struct wb_tx_rdesc *d, uint64_t off, uint64_t len,
                     struct wb_tx_rdesc *out);

/* Remote descriptor wire codec (a msgpack array carrying its own version). _get returns
 * -WB_E_VERSION for another version and -EBADMSG for anything malformed. */
void wb_tx_rdesc_put(struct wb_mpw *w, const struct wb_tx_rdesc *d);
int wb_tx_rdesc_get(struct wb_mpr *r, struct wb_tx_rdesc *d);

/* Checks a write against its source registration, its destination descriptor and the peer
 * table. 0, -EINVAL (unknown peer, descriptor of another transport or backend, NULL src with
 * len > 0, source not registered for SRC) or -WB_E_BOUNDS ([off, off+len) not inside a region;
 * overflow-safe; a zero-length write is inside when off <= size). Explains in wb_tx_errmsg(). */
int wb_tx_check_write(struct wb_tx *tx, const struct wb_tx_write *w);

/* Direct addressing. Where a peer's memory is mapped into this process — cudaipc: the peer's
 * allocation opened by its IPC handle on this transport's GPU, or the very pointer when the
 * peer is this process — *out is where bytes [off, off + len) of its region `dst` are, for the
 * caller to write with its own CUDA kernels (on the transport's device) instead of posting
 * writes: a quantization can then store straight into a rollout's weights. Such stores carry
 * no completion: once they are done (a CUDA event), the caller tells the peer with
 * wb_tx_write_imm(), one immediate per write it stands for, exactly as it would count posted
 * writes. -ENOTSUP where the backend cannot map peers' memory (fabric), -EINVAL or
 * -WB_E_BOUNDS as wb_tx_check_write() says (explained in wb_tx_errmsg()). */
int wb_tx_peer_ptr(struct wb_tx *tx, uint32_t peer, const struct wb_tx_rdesc *dst, uint64_t off,
                   uint64_t len, void **out);

/* ---------------------------------------------------------------- attempts and counters */

/* A transfer attempt, as every member learns it from the controller: a 64-bit random epoch
 * (never 0), the version, and the 128-bit key its notes are authenticated with. max_tags and
 * max_notes bound what this side may count in it (distinct tags; notes, for the replay set);
 * 0 takes a default. */
struct wb_tx_attempt {
    uint64_t epoch, version;
    uint8_t key[WB_MAC_KEY_BYTES];
    uint64_t max_tags, max_notes;
    /* Record, per peer, when its counted notes arrived (wb_tx_peer_notes): a clock read per
     * accepted note, so only for a side that traces its attempts. */
    bool peer_times;
};

/* Begins an attempt: every counter, pending notification and replay entry of the previous one
 * is forgotten; notes sent from now on carry this epoch and key (writes queued before keep
 * theirs); notes received carrying it count; notes that arrived early for it are checked at
 * the next polls. -EINVAL for epoch 0, -EALREADY when it is the current one. */
int wb_tx_attempt_begin(struct wb_tx *tx, const struct wb_tx_attempt *a);
/* Ends the current attempt (or the open mode of a fresh transport, which counts notes of
 * epoch 0 under the zero key, for tools and tests): nothing counts until the next begins. */
void wb_tx_attempt_end(struct wb_tx *tx);
/* The current attempt's epoch, 0 when none. */
uint64_t wb_tx_attempt_epoch(const struct wb_tx *tx);
/* Counters of arrived notes since open. */
void wb_tx_note_stats(const struct wb_tx *tx, struct wb_tx_note_stats *out);

/* What one peer's counted notes brought in the last attempt begun with peer_times: the
 * immediates they stood for, and when (wb_now_ns) the first and the last of them was accepted
 * (0 when none came). Kept after the attempt ends, until the next one begins. */
struct wb_tx_peer_notes {
    uint64_t imms, first_ns, last_ns;
};
/* 0; -ENODATA when the last attempt begun recorded no times (peer_times off, or no memory for
 * them: the attempt goes on without), -EINVAL for a peer added after it began. */
int wb_tx_peer_notes(const struct wb_tx *tx, uint32_t peer, struct wb_tx_peer_notes *out);

/* Arms the counter of `tag` in the current attempt: when n immediates with that tag have
 * arrived in it (counting those that arrived before this call, in any order), the expectation
 * is reached exactly once: n is taken off the count (later arrivals count toward the next
 * expectation of the tag) and, from the next wb_tx_poll(), cb(arg, tag) is called or — cb NULL
 * — a WB_TX_EV_IMM event with ctx = arg is returned. n == 0 is reached at once. -EBUSY when the
 * tag is already armed, -ENOSPC when the attempt's max_tags counters are in use, -ENOMEM. */
int wb_tx_expect(struct wb_tx *tx, uint32_t tag, uint64_t n, wb_tx_imm_cb cb, void *arg);

/* A piece of a progress write (wb_tx_write.progress) placed here: `len` bytes at `off` of the
 * registration `region` (its wb_tx_mr.id; off counts from the registration's start), of a write
 * whose immediate is `tag`. Checked as every note is (this attempt's member, its MAC), but the
 * range is the sender's word: check it against what the tag stands for. Called from
 * wb_tx_poll(). */
typedef void (*wb_tx_progress_cb)(void *arg, uint32_t tag, uint64_t region, uint64_t off,
                                  uint64_t len);
/* Sets (cb NULL: clears) the progress hook. Without one, progress notes are dropped. */
void wb_tx_on_progress(struct wb_tx *tx, wb_tx_progress_cb cb, void *arg);

/* Immediates of `tag` arrived and not yet taken by a reached expectation. */
uint64_t wb_tx_imm_count(const struct wb_tx *tx, uint32_t tag);

/* ---------------------------------------------------------------- thin wrappers */

static inline int wb_tx_query(struct wb_tx *tx, struct wb_tx_caps *caps)
{
    return tx->ops->query(tx, caps);
}

static inline int wb_tx_mr_reg(struct wb_tx *tx, void *ptr, uint64_t len, unsigned access,
                               struct wb_tx_mr **out)
{
    return tx->ops->mr_reg(tx, ptr, len, access, out);
}

static inline int wb_tx_rdesc(struct wb_tx *tx, const struct wb_tx_mr *mr, struct wb_tx_rdesc *out)
{
    return tx->ops->mr_rdesc(tx, mr, out);
}

static inline int wb_tx_mr_dereg(struct wb_tx *tx, struct wb_tx_mr *mr)
{
    return tx->ops->mr_dereg(tx, mr);
}

/* Queues one write after wb_tx_check_write(); see the ops table for the contract. */
static inline int wb_tx_write(struct wb_tx *tx, const struct wb_tx_write *w)
{
    int r = wb_tx_check_write(tx, w);
    return r ? r : tx->ops->write(tx, w);
}

/* An immediate alone. -EINVAL for an unknown peer. */
int wb_tx_check_peer(struct wb_tx *tx, uint32_t peer);
static inline int wb_tx_write_imm(struct wb_tx *tx, uint32_t peer, uint32_t tag, void *ctx)
{
    int r = wb_tx_check_peer(tx, peer);
    return r ? r : tx->ops->note(tx, peer, tag, 1, ctx);
}

/* n immediates of `tag` in one note (one completion event), counted at `peer` exactly as n
 * wb_tx_write_imm() would be: stores into a peer's memory announced in a batch. n is 1 ..
 * 2^24; -EINVAL otherwise or for an unknown peer. */
int wb_tx_write_imms(struct wb_tx *tx, uint32_t peer, uint32_t tag, uint32_t n, void *ctx);

static inline ssize_t wb_tx_poll(struct wb_tx *tx, struct wb_tx_event *ev, size_t max)
{
    return tx->ops->poll(tx, ev, max);
}

static inline int wb_tx_stats(struct wb_tx *tx, struct wb_tx_stats *st)
{
    return tx->ops->stats(tx, st);
}

/* See the ops table. */
static inline int wb_tx_mr_window(struct wb_tx *tx, struct wb_tx_mr *mr, bool open)
{
    return tx->ops->mr_window(tx, mr, open);
}

/* Makes the provider connect to `peer` now (tcp;ofi_rxm connects on first use) with a note
 * that nothing counts, so the first transfer does not pay for it. Completes as a write. */
int wb_tx_connect(struct wb_tx *tx, uint32_t peer, void *ctx);

/* A write's completion says its bytes left; where the provider keeps order its note follows
 * without waiting (fabric.h). A fence says more: its completion comes once every write with an
 * immediate queued to `peer` before it was placed there (by the provider: a staged
 * destination copies to the device when it handles the commit), so that, say, nothing of an
 * aborted attempt is still on its way when the peer closes its windows. */
int wb_tx_fence(struct wb_tx *tx, uint32_t peer, void *ctx);

/* Closes a transport (NULL is a no-op). */
static inline void wb_tx_close(struct wb_tx *tx)
{
    if (tx)
        tx->ops->close(tx);
}

/* ---------------------------------------------------------------- memory helpers
 *
 * For programs and tests that need memory of a kind without linking CUDA themselves. Device
 * memory needs a CUDA build and a GPU (-WB_E_NOGPU otherwise). */

/* Page-aligned host memory or cudaMalloc'd memory on `device` (-1: current). */
int wb_tx_mem_alloc(enum wb_tx_mem kind, int device, size_t len, void **out);
void wb_tx_mem_free(enum wb_tx_mem kind, void *p);
/* Synchronous copy between any two kinds (cudaMemcpy with cudaMemcpyDefault, or memcpy). */
int wb_tx_mem_copy(void *dst, const void *src, size_t len);
/* Baseline for benchmarks: `reps` back-to-back asynchronous copies of len bytes from src to dst
 * on one stream, then one synchronize; between two GPUs, cudaMemcpyPeerAsync with peer access
 * enabled. */
int wb_tx_mem_copy_reps(void *dst, const void *src, size_t len, size_t reps);

#ifdef __cplusplus
}
#endif

#endif /* WB_TRANSPORT_H */
