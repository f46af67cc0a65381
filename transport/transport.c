/* transport.c — the backend-independent half of transport/: the config table, the backend
 * registry, the checks every write passes before a backend sees it, the peer table with the
 * liveness of same-host peers, the per-tag immediate counters, and the wire codecs of address
 * blobs and remote descriptors. Backends only move bytes; everything here behaves the same for
 * all of them, so the conformance suite tests it once per backend. */
#include "transport/tx_priv.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

/* ---------------------------------------------------------------- config */

static const char *const backend_names[] = {"fabric", "cudaipc", "verbs", NULL};
static const char *const hmem_names[] = {"auto", "off", NULL};

#define OFF(f) offsetof(struct wb_tx_cfg, f)
const struct wb_cfg_field wb_tx_cfg_fields[] = {
    {"backend", WB_CFG_ENUM, "fabric", "data path backend", OFF(backend), backend_names, NULL},
    {"provider", WB_CFG_STR, "tcp",
     "libfabric provider: efa, verbs;ofi_rxm, tcp (tcp;ofi_rxm), shm", OFF(provider), NULL, NULL},
    {"domain", WB_CFG_STR, "",
     "comma-separated NIC/interface names for the rails (\"\": every domain the provider "
     "offers, in its order)",
     OFF(domain), NULL, NULL},
    {"rails", WB_CFG_U64, "0",
     "endpoints (fabric) or copy streams (cudaipc), 1..8; 0: the backend's own (fabric 1, "
     "cudaipc 2)",
     OFF(rails), NULL, NULL},
    {"shard_size", WB_CFG_SIZE, "1MiB", "writes longer than this are striped across rails",
     OFF(shard_size), NULL, NULL},
    {"window", WB_CFG_U64, "0", "operations in flight per rail (0: the provider's queue size)",
     OFF(window), NULL, NULL},
    {"inflight_bytes", WB_CFG_SIZE, "16MiB",
     "fabric: data bytes handed to the provider per rail at once (writes are cut into pieces of "
     "a quarter of it); a note waits behind at most that much on an ordered connection. 0: no "
     "limit",
     OFF(inflight_bytes), NULL, NULL},
    {"post_batch", WB_CFG_U64, "64", "operations posted per rail per poll", OFF(post_batch), NULL,
     NULL},
    {"cq_batch", WB_CFG_U64, "64", "completions read per fi_cq_read", OFF(cq_batch), NULL, NULL},
    {"hmem", WB_CFG_ENUM, "auto", "register device memory with the provider when it can", OFF(hmem),
     hmem_names, NULL},
    {"stage_host", WB_CFG_BOOL, "false",
     "send host memory through the bounce/staging path too (tests it without a GPU)",
     OFF(stage_host), NULL, NULL},
    {"bounce_size", WB_CFG_SIZE, "2MiB", "bytes per pinned bounce chunk", OFF(bounce_size), NULL,
     NULL},
    {"bounce_chunks", WB_CFG_U64, "16", "bounce chunks (device-to-host copies in flight)",
     OFF(bounce_chunks), NULL, NULL},
    {"op_timeout", WB_CFG_DURATION, "30s",
     "an operation in flight longer than this fails its peer with -ETIMEDOUT (0: never)",
     OFF(op_timeout), NULL, NULL},
    {"device", WB_CFG_I64, "-1", "cudaipc: CUDA device of this process (-1: current)", OFF(device),
     NULL, NULL},
    {"bw_hint", WB_CFG_SIZE, "0", "bandwidth reported by query, bytes/s (0: detect)", OFF(bw_hint),
     NULL, NULL},
    {0},
};
#undef OFF

/* ---------------------------------------------------------------- registry */

static int verbs_open(const struct wb_tx_cfg *cfg, struct wb_errlist *el, struct wb_tx **out)
{
    (void)cfg;
    (void)out;
    wb_errlist_add(el, "transport.backend: 'verbs' (libibverbs RC) is not implemented yet; "
                       "use 'fabric' with provider 'verbs;ofi_rxm'");
    return -ENOTSUP;
}

struct tx_backend {
    const char *name;
    int (*open)(const struct wb_tx_cfg *cfg, struct wb_errlist *el, struct wb_tx **out);
    uint64_t rails; /* what rails: 0 means for it */
};

/* Copy streams are cheap and two keep a copy engine busy while the other is issued, so CUDA
 * IPC uses two by default; a libfabric endpoint per rail only pays off with a NIC per rail. */
static const struct tx_backend registry[WB_TX_BACKEND_COUNT] = {
    [WB_TX_FABRIC] = {"fabric", txi_fabric_open, 1},
    [WB_TX_CUDAIPC] = {"cudaipc", txi_cudaipc_open, 2},
    [WB_TX_VERBS] = {"verbs", verbs_open, 1},
};

const char *wb_tx_backend_name(enum wb_tx_backend b)
{
    return (unsigned)b < WB_TX_BACKEND_COUNT ? registry[b].name : "unknown";
}

static int check_cfg(const struct wb_tx_cfg *c, struct wb_errlist *el)
{
    int bad = 0;
    if ((unsigned)c->backend >= WB_TX_BACKEND_COUNT && ++bad)
        wb_errlist_add(el, "transport.backend: %d is not a backend", c->backend);
    if (c->rails > WB_TX_MAX_RAILS && ++bad)
        wb_errlist_add(el, "transport.rails: %" PRIu64 " is outside 1..%d", c->rails,
                       WB_TX_MAX_RAILS);
    if (c->shard_size < 4096 && ++bad)
        wb_errlist_add(el, "transport.shard_size: %" PRIu64 " is below 4096 bytes", c->shard_size);
    if ((c->bounce_size < 4096 || c->bounce_size % 4096) && ++bad)
        wb_errlist_add(el, "transport.bounce_size: %" PRIu64 " is not a multiple of 4096 bytes",
                       c->bounce_size);
    if ((c->bounce_chunks < 1 || c->bounce_chunks > 4096) && ++bad)
        wb_errlist_add(el, "transport.bounce_chunks: %" PRIu64 " is outside 1..4096",
                       c->bounce_chunks);
    if (c->inflight_bytes && c->inflight_bytes < 65536 && ++bad)
        wb_errlist_add(el, "transport.inflight_bytes: %" PRIu64 " is below 64 KiB (0: no limit)",
                       c->inflight_bytes);
    if ((c->post_batch < 1 || c->post_batch > 4096) && ++bad)
        wb_errlist_add(el, "transport.post_batch: %" PRIu64 " is outside 1..4096", c->post_batch);
    if ((c->cq_batch < 1 || c->cq_batch > 1024) && ++bad)
        wb_errlist_add(el, "transport.cq_batch: %" PRIu64 " is outside 1..1024", c->cq_batch);
    if ((!c->provider || !c->domain) && ++bad)
        wb_errlist_add(el, "transport: provider and domain unset (fill the config with "
                           "wb_cfg_defaults or wb_cfg_parse)");
    return bad ? -EINVAL : 0;
}

int wb_tx_open(const struct wb_tx_cfg *cfg, struct wb_errlist *el, struct wb_tx **out)
{
    int r = check_cfg(cfg, el);
    if (r)
        return r;
    struct wb_tx_cfg c = *cfg; /* shallow: the backend copies what it keeps */
    if (!c.rails)
        c.rails = registry[c.backend].rails;
    return registry[c.backend].open(&c, el, out);
}

int wb_tx_cfg_provider(struct wb_tx_cfg *cfg, const char *provider)
{
    bool ipc = strcmp(provider, "cudaipc") == 0 || strcmp(provider, "cuda_ipc") == 0;
    char *p = strdup(ipc ? "" : provider);
    if (!p)
        return -ENOMEM;
    free(cfg->provider);
    cfg->provider = p;
    cfg->backend = ipc ? WB_TX_CUDAIPC : WB_TX_FABRIC;
    return 0;
}

/* ---------------------------------------------------------------- core */

struct tx_peer {
    uint64_t uid;
    int64_t pid;
    uint64_t start;
    bool local;
};

enum { HOST_ID_MAX = 160 };

struct wb_tx_core {
    enum wb_tx_backend backend;
    uint64_t uid;
    char host[HOST_ID_MAX]; /* boot id + pid namespace: "same host" for pids */
    int64_t pid;
    uint64_t start;
    struct tx_peer *peers;
    uint32_t npeers, peer_cap;
    struct wb_txn_state *notes; /* the attempt, its counters, arrived notes (note.c) */
    uint64_t next_mr_id;
    wb_tx_progress_cb progress_cb;
    void *progress_arg;
    char err[320];
};

void wb_tx_on_progress(struct wb_tx *tx, wb_tx_progress_cb cb, void *arg)
{
    tx->core->progress_cb = cb;
    tx->core->progress_arg = arg;
}

void txi_progress(struct wb_tx *tx, uint32_t tag, uint64_t region, uint64_t off, uint64_t len)
{
    if (tx->core->progress_cb)
        tx->core->progress_cb(tx->core->progress_arg, tag, region, off, len);
}

int txi_proc_stat(int64_t pid, uint64_t *start, bool *zombie)
{
    char path[64], buf[1024];
    snprintf(path, sizeof(path), "/proc/%" PRId64 "/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return -ESRCH;
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = 0;
    char *p = strrchr(buf, ')'); /* the command name may hold spaces and parentheses */
    if (!p)
        return -ESRCH;
    p++;
    char state = 0;
    unsigned long long st = 0;
    /* After ")": state is field 3, starttime field 22. */
    if (sscanf(p,
               " %c %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s "
               "%llu",
               &state, &st) != 2)
        return -ESRCH;
    *start = st;
    *zombie = state == 'Z' || state == 'X' || state == 'x';
    return 0;
}

static void host_id(char *out, size_t cap)
{
    char boot[64] = "?", ns[64] = "?";
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (f) {
        if (!fgets(boot, sizeof(boot), f))
            snprintf(boot, sizeof(boot), "?");
        fclose(f);
        boot[strcspn(boot, "\n")] = 0;
    }
    ssize_t n = readlink("/proc/self/ns/pid", ns, sizeof(ns) - 1);
    ns[n > 0 ? n : 0] = 0;
    snprintf(out, cap, "%s/%s", boot, ns);
}

int txi_core_init(struct wb_tx *tx, const struct wb_tx_ops *ops, enum wb_tx_backend b)
{
    struct wb_tx_core *c = calloc(1, sizeof(*c));
    if (!c)
        return -ENOMEM;
    if (txi_notes_init(&c->notes) != 0) {
        free(c);
        return -ENOMEM;
    }
    c->backend = b;
    if (getrandom(&c->uid, sizeof(c->uid), GRND_NONBLOCK) != (ssize_t)sizeof(c->uid))
        c->uid = wb_now_ns() ^ ((uint64_t)getpid() << 32);
    c->uid |= 1; /* never 0 */
    host_id(c->host, sizeof(c->host));
    c->pid = getpid();
    bool z;
    if (txi_proc_stat(c->pid, &c->start, &z) != 0)
        c->start = 0;
    c->next_mr_id = 1;
    tx->ops = ops;
    tx->core = c;
    return 0;
}

void txi_core_fini(struct wb_tx *tx)
{
    if (!tx || !tx->core)
        return;
    free(tx->core->peers);
    txi_notes_fini(tx->core->notes);
    free(tx->core);
    tx->core = NULL;
}

int txi_err(struct wb_tx *tx, int err, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(tx->core->err, sizeof(tx->core->err), fmt, ap);
    va_end(ap);
    wb_log(WB_LOG_DEBUG, "transport", "%s (%s)", tx->core->err, wb_strerror(err));
    return err;
}

const char *wb_tx_errmsg(const struct wb_tx *tx)
{
    return tx && tx->core ? tx->core->err : "";
}

uint64_t txi_uid(const struct wb_tx *tx)
{
    return tx->core->uid;
}
uint64_t txi_next_mr_id(struct wb_tx *tx)
{
    return tx->core->next_mr_id++;
}
uint32_t txi_npeers(const struct wb_tx *tx)
{
    return tx->core->npeers;
}

struct wb_txn_state *txi_notes(struct wb_tx *tx)
{
    return tx->core->notes;
}

uint64_t txi_peer_uid(const struct wb_tx *tx, uint32_t peer)
{
    return peer < tx->core->npeers ? tx->core->peers[peer].uid : 0;
}

int txi_peer_local(const struct wb_tx *tx, uint32_t peer)
{
    return peer < tx->core->npeers && tx->core->peers[peer].local;
}

int64_t txi_peer_pid(const struct wb_tx *tx, uint32_t peer)
{
    return peer < tx->core->npeers ? tx->core->peers[peer].pid : -1;
}

int txi_peer_alive(const struct wb_tx *tx, uint32_t peer)
{
    if (peer >= tx->core->npeers)
        return 0;
    const struct tx_peer *p = &tx->core->peers[peer];
    if (!p->local)
        return 1;
    uint64_t start;
    bool zombie;
    if (txi_proc_stat(p->pid, &start, &zombie) != 0)
        return 0;
    return !zombie && (p->start == 0 || start == p->start);
}

/* ---------------------------------------------------------------- address blobs */

enum { ADDR_VERSION = 1, RDESC_VERSION = 2 /* 2: base */ };

int wb_tx_addr(struct wb_tx *tx, struct wb_mpw *w)
{
    struct wb_tx_core *c = tx->core;
    wb_mpw_array(w, 7);
    wb_mpw_u64(w, ADDR_VERSION);
    wb_mpw_u64(w, c->backend);
    wb_mpw_u64(w, c->uid);
    wb_mpw_str(w, c->host);
    wb_mpw_i64(w, c->pid);
    wb_mpw_u64(w, c->start);
    int r = tx->ops->addr(tx, w);
    return r ? r : wb_mpw_finish(w);
}

int wb_tx_peer_add(struct wb_tx *tx, struct wb_mpr *r, uint32_t *peer)
{
    struct wb_tx_core *c = tx->core;
    uint32_t n;
    uint64_t ver = 0, backend = 0;
    struct tx_peer p = {0};
    char host[HOST_ID_MAX];
    wb_mpr_array(r, 16, &n);
    wb_mpr_u64(r, &ver);
    if (r->err || n != 7)
        return txi_err(tx, -EBADMSG, "peer address: not a transport address blob");
    if (ver != ADDR_VERSION)
        return txi_err(tx, -WB_E_VERSION,
                       "peer address: version %" PRIu64 ", this build reads version %d", ver,
                       ADDR_VERSION);
    wb_mpr_u64(r, &backend);
    wb_mpr_u64(r, &p.uid);
    wb_mpr_str(r, host, sizeof(host));
    wb_mpr_i64(r, &p.pid);
    wb_mpr_u64(r, &p.start);
    if (r->err)
        return txi_err(tx, -EBADMSG, "peer address: malformed header");
    if (backend != c->backend)
        return txi_err(tx, -EPROTO, "peer address: peer uses backend %s, this one is %s",
                       wb_tx_backend_name((enum wb_tx_backend)backend),
                       wb_tx_backend_name(c->backend));
    if (p.uid == c->uid)
        return txi_err(tx, -EEXIST, "peer address: the blob is this transport's own");
    p.local = strcmp(host, c->host) == 0;
    if (c->npeers == c->peer_cap) {
        uint32_t cap = c->peer_cap ? 2 * c->peer_cap : 8;
        struct tx_peer *np = realloc(c->peers, cap * sizeof(*np));
        if (!np)
            return txi_err(tx, -ENOMEM, "peer address: the table of peers: out of memory");
        c->peers = np;
        c->peer_cap = cap;
    }
    /* The backend sees the peer already in the table (it may ask txi_peer_local). */
    c->peers[c->npeers] = p;
    c->npeers++;
    int e = tx->ops->peer_add(tx, r, c->npeers - 1);
    if (e) {
        c->npeers--;
        return e;
    }
    *peer = c->npeers - 1;
    return 0;
}

/* ---------------------------------------------------------------- descriptors */

int wb_tx_rdesc_view(const struct wb_tx_rdesc *d, uint64_t off, uint64_t len,
                     struct wb_tx_rdesc *out)
{
    if (off > d->size || len > d->size - off)
        return -WB_E_BOUNDS;
    *out = *d;
    out->base = d->base + off;
    out->size = len;
    return 0;
}

void wb_tx_rdesc_put(struct wb_mpw *w, const struct wb_tx_rdesc *d)
{
    uint32_t nr = d->nrails <= WB_TX_MAX_RAILS ? d->nrails : WB_TX_MAX_RAILS;
    uint32_t no = d->opaque_len <= WB_TX_RDESC_OPAQUE ? d->opaque_len : WB_TX_RDESC_OPAQUE;
    wb_mpw_array(w, 9);
    wb_mpw_u64(w, RDESC_VERSION);
    wb_mpw_u64(w, d->backend);
    wb_mpw_u64(w, d->flags);
    wb_mpw_u64(w, d->owner);
    wb_mpw_u64(w, d->id);
    wb_mpw_u64(w, d->size);
    wb_mpw_u64(w, d->base);
    wb_mpw_array(w, nr);
    for (uint32_t i = 0; i < nr; i++) {
        wb_mpw_array(w, 2);
        wb_mpw_u64(w, d->rail[i].addr);
        wb_mpw_u64(w, d->rail[i].key);
    }
    wb_mpw_bin(w, d->opaque, no);
}

int wb_tx_rdesc_get(struct wb_mpr *r, struct wb_tx_rdesc *out)
{
    struct wb_tx_rdesc d;
    memset(&d, 0, sizeof(d));
    uint32_t n = 0, nr = 0;
    uint64_t ver = 0, backend = 0, flags = 0;
    wb_mpr_array(r, 16, &n);
    wb_mpr_u64(r, &ver);
    if (r->err)
        return -EBADMSG;
    if (ver != RDESC_VERSION)
        return -WB_E_VERSION;
    if (n != 9)
        return -EBADMSG;
    wb_mpr_u64(r, &backend);
    wb_mpr_u64(r, &flags);
    wb_mpr_u64(r, &d.owner);
    wb_mpr_u64(r, &d.id);
    wb_mpr_u64(r, &d.size);
    wb_mpr_u64(r, &d.base);
    if (d.base + d.size < d.base)
        return -EBADMSG;
    if (wb_mpr_array(r, WB_TX_MAX_RAILS, &nr) || nr == 0)
        return -EBADMSG;
    for (uint32_t i = 0; i < nr; i++) {
        uint32_t two = 0;
        wb_mpr_array(r, 2, &two);
        if (two != 2)
            return -EBADMSG;
        wb_mpr_u64(r, &d.rail[i].addr);
        wb_mpr_u64(r, &d.rail[i].key);
    }
    const void *op = NULL;
    size_t nop = 0;
    wb_mpr_bin(r, &op, &nop, WB_TX_RDESC_OPAQUE);
    if (r->err || backend >= WB_TX_BACKEND_COUNT || flags > 0xffffffffu)
        return -EBADMSG;
    if (nop)
        memcpy(d.opaque, op, nop);
    d.opaque_len = (uint32_t)nop;
    d.nrails = nr;
    d.backend = (uint32_t)backend;
    d.flags = (uint32_t)flags;
    *out = d;
    return 0;
}

/* ---------------------------------------------------------------- checks */

int wb_tx_check_peer(struct wb_tx *tx, uint32_t peer)
{
    if (peer >= tx->core->npeers)
        return txi_err(tx, -EINVAL, "write: unknown peer %u (%u peers added)", peer,
                       tx->core->npeers);
    return 0;
}

/* [off, off+len) inside [0, size)? Overflow-safe; a zero-length range may sit at size. */
static bool range_inside(uint64_t off, uint64_t len, uint64_t size)
{
    return off <= size && len <= size - off;
}

int wb_tx_check_write(struct wb_tx *tx, const struct wb_tx_write *w)
{
    struct wb_tx_core *c = tx->core;
    int r = wb_tx_check_peer(tx, w->peer);
    if (r)
        return r;
    const struct wb_tx_rdesc *d = w->dst;
    if (!d)
        return txi_err(tx, -EINVAL, "write: no destination descriptor");
    if (d->backend != (uint32_t)c->backend)
        return txi_err(tx, -EINVAL, "write: descriptor is for backend %s, this transport is %s",
                       wb_tx_backend_name((enum wb_tx_backend)d->backend),
                       wb_tx_backend_name(c->backend));
    if (d->owner != c->peers[w->peer].uid)
        return txi_err(tx, -EINVAL,
                       "write: descriptor of region %" PRIu64 " does not belong to peer %u", d->id,
                       w->peer);
    if (!range_inside(w->dst_off, w->len, d->size))
        return txi_err(tx, -WB_E_BOUNDS,
                       "write: destination [%" PRIu64 ", +%" PRIu64 ") outside region %" PRIu64
                       " of %" PRIu64 " bytes",
                       w->dst_off, w->len, d->id, d->size);
    if (w->len == 0 && !w->src)
        return 0;
    if (!w->src)
        return txi_err(tx, -EINVAL, "write: no source registration for %" PRIu64 " bytes", w->len);
    if (!(w->src->access & WB_TX_ACCESS_SRC))
        return txi_err(tx, -EINVAL,
                       "write: source region %" PRIu64 " is not registered as a write source",
                       w->src->id);
    if (!range_inside(w->src_off, w->len, w->src->size))
        return txi_err(tx, -WB_E_BOUNDS,
                       "write: source [%" PRIu64 ", +%" PRIu64 ") outside region %" PRIu64
                       " of %" PRIu64 " bytes",
                       w->src_off, w->len, w->src->id, w->src->size);
    return 0;
}

int wb_tx_peer_ptr(struct wb_tx *tx, uint32_t peer, const struct wb_tx_rdesc *dst, uint64_t off,
                   uint64_t len, void **out)
{
    struct wb_tx_write w = {.peer = peer, .dst = dst, .dst_off = off, .len = 0};
    int r = wb_tx_check_write(tx, &w); /* peer, backend, owner */
    if (r)
        return r;
    if (!range_inside(off, len, dst->size))
        return txi_err(tx, -WB_E_BOUNDS,
                       "peer memory: [%" PRIu64 ", +%" PRIu64 ") outside region %" PRIu64
                       " of %" PRIu64 " bytes",
                       off, len, dst->id, dst->size);
    void *base = NULL;
    if ((r = tx->ops->peer_ptr(tx, peer, dst, &base)) != 0)
        return r;
    *out = (uint8_t *)base + off;
    return 0;
}

/* ---------------------------------------------------------------- notes */

int wb_tx_connect(struct wb_tx *tx, uint32_t peer, void *ctx)
{
    int r = wb_tx_check_peer(tx, peer);
    return r ? r : tx->ops->note(tx, peer, 0, 0, ctx);
}

int wb_tx_fence(struct wb_tx *tx, uint32_t peer, void *ctx)
{
    int r = wb_tx_check_peer(tx, peer);
    return r ? r : tx->ops->fence(tx, peer, ctx);
}

int wb_tx_write_imms(struct wb_tx *tx, uint32_t peer, uint32_t tag, uint32_t n, void *ctx)
{
    int r = wb_tx_check_peer(tx, peer);
    if (!r && (n == 0 || n > WB_TXN_MAX_COUNT))
        r = txi_err(tx, -EINVAL, "write: %u immediates in one note (1..%u)", n,
                    (unsigned)WB_TXN_MAX_COUNT);
    return r ? r : tx->ops->note(tx, peer, tag, n, ctx);
}
