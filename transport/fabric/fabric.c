/* fabric.c — the libfabric backend's objects: opening one FI_EP_RDM endpoint per rail from the
 * config, the address blob and peers, memory registration (per rail; FI_HMEM for device memory
 * when the provider has it, otherwise bounce sources and mirrored destinations), capability
 * query, and a close that tears down whatever exists. The data path is in fabric_post.c. */
#include "transport/fabric/fabric.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { FAB_API = FI_VERSION(1, 17) };

static void fab_close(struct wb_tx *tx);

/* ---------------------------------------------------------------- registration helpers */

/* A memory key nobody guesses from the ones seen before: random bits, as many as the domain's
 * keys hold (where the requester chooses, as on tcp and shm; a provider that picks its own
 * keys, FI_MR_PROV_KEY, ignores it). */
static uint64_t key_draw(const struct fab_rail *r)
{
    uint64_t k = wb_random_u64();
    if (r->key_size && r->key_size < sizeof(k))
        k &= (1ull << (8 * r->key_size)) - 1;
    return k ? k : 1;
}

/* Registers [p, p+len) on one rail, under *key when `reuse` (a window opened again), else a
 * fresh random key. device >= 0 marks CUDA memory (only with FI_HMEM). */
static int reg_rail_key(struct fab_tx *fx, uint32_t i, void *p, uint64_t len, uint64_t access,
                        int device, bool reuse, struct fid_mr **mr_out, void **desc, uint64_t *key)
{
    struct fab_rail *r = &fx->rail[i];
    struct iovec iov = {.iov_base = p, .iov_len = len};
    struct fi_mr_attr a = {.mr_iov = &iov, .iov_count = 1, .access = access};
    if (device >= 0) {
        a.iface = FI_HMEM_CUDA;
        a.device.cuda = device;
    }
    struct fid_mr *mr = NULL;
    int e;
    for (int tries = 0;; tries++) { /* a key already in use: another draw */
        a.requested_key = reuse ? *key : key_draw(r);
        e = fi_mr_regattr(r->domain, &a, 0, &mr);
        if (reuse || e != -FI_ENOKEY || tries == 8)
            break;
    }
    if (e)
        return txi_err(&fx->base, -WB_E_FABRIC,
                       "fabric: rail %u: fi_mr_regattr(%" PRIu64 " bytes): %s", i, len,
                       fab_strerror(-e));
    if (r->mr_mode & FI_MR_ENDPOINT) {
        if ((e = fi_mr_bind(mr, &r->ep->fid, 0)) != 0 || (e = fi_mr_enable(mr)) != 0) {
            fi_close(&mr->fid);
            return txi_err(&fx->base, -WB_E_FABRIC, "fabric: rail %u: fi_mr_bind: %s", i,
                           fab_strerror(-e));
        }
    }
    *mr_out = mr;
    *desc = fi_mr_desc(mr);
    *key = fi_mr_key(mr);
    return 0;
}

static int reg_rail(struct fab_tx *fx, uint32_t i, void *p, uint64_t len, uint64_t access,
                    int device, struct fid_mr **mr_out, void **desc, uint64_t *key)
{
    return reg_rail_key(fx, i, p, len, access, device, false, mr_out, desc, key);
}

/* The remote address of byte 0 of a registration: its virtual address or 0 (offset mode). */
static uint64_t rail_base(const struct fab_rail *r, const void *p)
{
    return (r->mr_mode & FI_MR_VIRT_ADDR) ? (uint64_t)(uintptr_t)p : 0;
}

int fab_pool_init(struct fab_tx *fx)
{
    if (fx->pool)
        return 0;
    size_t n = fx->cfg.bounce_chunks, sz = fx->cfg.bounce_size;
    bool pinned = fx->gpu_device >= 0;
    void *pool = NULL;
    int e = fab_gpu_host_alloc(n * sz, pinned, &pool);
    if (e)
        return txi_err(&fx->base, e, "fabric: bounce pool of %zu x %zu bytes: %s", n, sz,
                       wb_strerror(e));
    struct fab_chunk *ch = calloc(n, sizeof(*ch));
    if (!ch) {
        fab_gpu_host_free(pool, pinned);
        return txi_err(&fx->base, -ENOMEM, "fabric: bounce chunks: out of memory");
    }
    uint32_t i = 0;
    for (; i < fx->nrails; i++) {
        uint64_t key;
        e = reg_rail(fx, i, pool, n * sz, FI_WRITE | FI_READ | FI_SEND, -1, &fx->rail[i].pool_mr,
                     &fx->rail[i].pool_desc, &key);
        if (e)
            goto err_dereg;
    }
    for (size_t k = 0; k < n; k++) {
        ch[k].ptr = (uint8_t *)pool + k * sz;
        ch[k].next = k + 1 < n ? &ch[k + 1] : NULL;
    }
    fx->pool = pool;
    fx->pool_pinned = pinned;
    fx->chunks = ch;
    fx->free_chunks = ch;
    return 0;

err_dereg:
    while (i-- > 0) {
        fi_close(&fx->rail[i].pool_mr->fid);
        fx->rail[i].pool_mr = NULL;
    }
    free(ch);
    fab_gpu_host_free(pool, pinned);
    return e;
}

/* ---------------------------------------------------------------- registrations */

struct fab_mr *fab_mr_find(struct fab_tx *fx, uint64_t id)
{
    size_t lo = 0, hi = fx->nmrs;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (fx->mrs[mid]->base.id < id)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < fx->nmrs && fx->mrs[lo]->base.id == id ? fx->mrs[lo] : NULL;
}

static void mr_release(struct fab_tx *fx, struct fab_mr *m)
{
    for (uint32_t i = 0; i < fx->nrails; i++)
        if (m->mr[i])
            fi_close(&m->mr[i]->fid);
    if (m->mirror)
        fab_gpu_host_free(m->mirror, m->pinned);
    free(m);
}

static int fab_mr_reg(struct wb_tx *tx, void *ptr, uint64_t len, unsigned access,
                      struct wb_tx_mr **out)
{
    struct fab_tx *fx = fab_of(tx);
    if (!ptr || len == 0 || !(access & (WB_TX_ACCESS_SRC | WB_TX_ACCESS_DST)) ||
        (access & ~(unsigned)(WB_TX_ACCESS_SRC | WB_TX_ACCESS_DST)))
        return txi_err(tx, -EINVAL, "register: need a pointer, a length and SRC/DST access");
    int dev = wb_gpu_ptr_device(ptr);
    if (dev == WB_GPU_UNKNOWN)
        return txi_err(tx, -WB_E_CUDA,
                       "register: the CUDA runtime cannot say whether %p is device memory", ptr);
    if (dev >= 0) {
        if (fx->gpu_device >= 0 && dev != fx->gpu_device)
            return txi_err(tx, -EINVAL, "register: memory of GPU %d, this transport serves GPU %d",
                           dev, fx->gpu_device);
        if (!fx->gpu) {
            int e = fab_gpu_open(dev, &fx->gpu);
            if (e)
                return txi_err(tx, e, "register: CUDA streams on GPU %d: %s", dev, wb_strerror(e));
        }
        fx->gpu_device = dev;
    }
    if (fx->nmrs == fx->mrs_cap && wb_grow(&fx->mrs, &fx->mrs_cap, 16, sizeof(*fx->mrs)) != 0)
        return txi_err(tx, -ENOMEM, "register: the table of registrations: out of memory");
    struct fab_mr *m = calloc(1, sizeof(*m));
    if (!m)
        return txi_err(tx, -ENOMEM, "register: out of memory");
    m->base = (struct wb_tx_mr){.ptr = ptr,
                                .size = len,
                                .mem = dev >= 0 ? WB_TX_MEM_CUDA : WB_TX_MEM_HOST,
                                .device = dev,
                                .access = access,
                                .id = txi_next_mr_id(tx)};
    /* Staged: the provider cannot touch this memory in place (device memory without FI_HMEM,
     * or host memory with stage_host). Sources go through bounce chunks, destinations through
     * a host mirror of the same size. */
    bool staged = dev >= 0 ? !fx->hmem : fx->cfg.stage_host;
    int e = 0;
    void *target = ptr;
    if (staged) {
        m->bounce = access & WB_TX_ACCESS_SRC;
        if (access & WB_TX_ACCESS_DST) {
            m->pinned = dev >= 0;
            e = fab_gpu_host_alloc(len, m->pinned, &m->mirror);
            if (e) {
                txi_err(tx, e, "register: host mirror of %" PRIu64 " bytes: %s", len,
                        wb_strerror(e));
                goto err_free;
            }
            target = m->mirror;
        }
    }
    uint64_t acc = 0;
    if ((access & WB_TX_ACCESS_SRC) && !staged)
        acc |= FI_WRITE | FI_SEND;
    if (access & WB_TX_ACCESS_DST)
        acc |= FI_REMOTE_WRITE;
    m->target = target;
    m->acc = acc;
    m->dev = target == ptr ? dev : -1;
    if (acc) {
        for (uint32_t i = 0; i < fx->nrails; i++) {
            e = reg_rail(fx, i, target, len, acc, m->dev, &m->mr[i], &m->desc[i], &m->key[i]);
            if (e)
                goto err_free;
        }
    }
    fx->mrs[fx->nmrs++] = m; /* ids only grow: the array stays sorted */
    *out = &m->base;
    return 0;

err_free:
    mr_release(fx, m);
    return e;
}

static int fab_mr_rdesc(struct wb_tx *tx, const struct wb_tx_mr *mr, struct wb_tx_rdesc *out)
{
    struct fab_tx *fx = fab_of(tx);
    const struct fab_mr *m = WB_CONTAINER_OF(mr, struct fab_mr, base);
    if (!(mr->access & WB_TX_ACCESS_DST))
        return txi_err(tx, -EINVAL,
                       "describe: region %" PRIu64 " is not registered as a "
                       "write destination",
                       mr->id);
    struct wb_tx_rdesc d;
    memset(&d, 0, sizeof(d));
    d.backend = WB_TX_FABRIC;
    d.flags = m->mirror ? WB_TX_RDESC_STAGED : 0;
    d.owner = txi_uid(tx);
    d.id = mr->id;
    d.size = mr->size;
    d.nrails = fx->nrails;
    for (uint32_t i = 0; i < fx->nrails; i++) {
        d.rail[i].addr = rail_base(&fx->rail[i], m->mirror ? m->mirror : mr->ptr);
        d.rail[i].key = m->key[i];
    }
    *out = d;
    return 0;
}

static int fab_mr_dereg(struct wb_tx *tx, struct wb_tx_mr *mr)
{
    struct fab_tx *fx = fab_of(tx);
    struct fab_mr *m = WB_CONTAINER_OF(mr, struct fab_mr, base);
    if (m->busy)
        return txi_err(tx, -EBUSY,
                       "deregister: region %" PRIu64 " has %" PRIu64 " operations in flight",
                       mr->id, m->busy);
    size_t i = 0;
    while (i < fx->nmrs && fx->mrs[i] != m)
        i++;
    if (i == fx->nmrs)
        return txi_err(tx, -EINVAL, "deregister: unknown region");
    memmove(&fx->mrs[i], &fx->mrs[i + 1], (fx->nmrs - i - 1) * sizeof(*fx->mrs));
    fx->nmrs--;
    mr_release(fx, m);
    return 0;
}

/* Closing a window closes the provider registrations (the memory and its mirror stay); opening
 * it registers the same range under the same keys, so descriptors handed out stay valid. Writes
 * already accepted by the provider when it closes still finish: the providers check a key when
 * a write's header arrives. */
static int fab_mr_window(struct wb_tx *tx, struct wb_tx_mr *mr, bool open)
{
    struct fab_tx *fx = fab_of(tx);
    struct fab_mr *m = WB_CONTAINER_OF(mr, struct fab_mr, base);
    if (mr->access != WB_TX_ACCESS_DST)
        return txi_err(tx, -EINVAL, "window: region %" PRIu64 " is not a write destination only",
                       mr->id);
    for (uint32_t i = 0; i < fx->nrails; i++)
        if (fx->rail[i].mr_mode & FI_MR_PROV_KEY)
            return txi_err(tx, -ENOTSUP,
                           "window: provider '%s' chooses its own keys; region %" PRIu64
                           " stays open",
                           fx->prov, mr->id);
    if (m->closed == !open)
        return 0;
    if (!open) {
        for (uint32_t i = 0; i < fx->nrails; i++)
            if (m->mr[i]) {
                fi_close(&m->mr[i]->fid);
                m->mr[i] = NULL;
                m->desc[i] = NULL;
            }
        m->closed = true;
        return 0;
    }
    for (uint32_t i = 0; i < fx->nrails; i++) {
        uint64_t key = m->key[i];
        int e = reg_rail_key(fx, i, m->target, mr->size, m->acc, m->dev, true, &m->mr[i],
                             &m->desc[i], &key);
        if (e || key != m->key[i]) {
            if (!e)
                e = txi_err(tx, -WB_E_FABRIC, "window: rail %u: the provider changed key", i);
            while (i-- > 0) {
                fi_close(&m->mr[i]->fid);
                m->mr[i] = NULL;
            }
            return e;
        }
    }
    m->closed = false;
    return 0;
}

/* ---------------------------------------------------------------- addresses and peers */

/* [provider, [rail name...], [fence pad address, key, ...]] */
static int fab_addr(struct wb_tx *tx, struct wb_mpw *w)
{
    struct fab_tx *fx = fab_of(tx);
    wb_mpw_array(w, 3);
    wb_mpw_str(w, fx->prov);
    wb_mpw_array(w, fx->nrails);
    for (uint32_t i = 0; i < fx->nrails; i++)
        wb_mpw_bin(w, fx->rail[i].name, fx->rail[i].namelen);
    wb_mpw_array(w, 2 * fx->nrails);
    for (uint32_t i = 0; i < fx->nrails; i++) {
        wb_mpw_u64(w, rail_base(&fx->rail[i], fx->pad + (size_t)i * FAB_PAD));
        wb_mpw_u64(w, fx->rail[i].pad_key);
    }
    return wb_mpw_finish(w);
}

static int fab_peer_add(struct wb_tx *tx, struct wb_mpr *r, uint32_t index)
{
    struct fab_tx *fx = fab_of(tx);
    char prov[64];
    uint32_t three = 0, nrem = 0, npad = 0;
    wb_mpr_array(r, 3, &three);
    wb_mpr_str(r, prov, sizeof(prov));
    wb_mpr_array(r, WB_TX_MAX_RAILS, &nrem);
    if (r->err || three != 3 || nrem == 0)
        return txi_err(tx, -EBADMSG, "peer address: malformed fabric body");
    if (strcmp(prov, fx->prov) != 0)
        return txi_err(tx, -EPROTO, "peer address: peer uses provider '%s', this one '%s'", prov,
                       fx->prov);
    struct fab_peer p;
    memset(&p, 0, sizeof(p));
    p.nrem = nrem;
    const void *names[WB_TX_MAX_RAILS];
    for (uint32_t j = 0; j < nrem; j++) {
        size_t len = 0;
        wb_mpr_bin(r, &names[j], &len, FAB_NAME_MAX);
        if (r->err || len == 0)
            return txi_err(tx, -EBADMSG, "peer address: malformed rail %u", j);
    }
    uint64_t pads[2 * WB_TX_MAX_RAILS];
    wb_mpr_array(r, 2 * WB_TX_MAX_RAILS, &npad);
    for (uint32_t k = 0; k < npad && !r->err; k++)
        wb_mpr_u64(r, &pads[k]);
    if (r->err || npad != 2 * nrem)
        return txi_err(tx, -EBADMSG, "peer address: malformed fence pads");
    if (index != fx->npeers)
        return txi_err(tx, -EINVAL, "peer address: index %u out of order", index);
    if (fx->npeers == fx->peer_cap) {
        uint32_t cap = fx->peer_cap ? 2 * fx->peer_cap : 8;
        struct fab_peer *np = realloc(fx->peers, cap * sizeof(*np));
        if (!np)
            return txi_err(tx, -ENOMEM, "peer address: the table of peers: out of memory");
        fx->peers = np;
        fx->peer_cap = cap;
    }
    for (uint32_t i = 0; i < fx->nrails; i++) {
        struct fab_rail *ra = &fx->rail[i];
        uint32_t j = i % nrem;
        p.pad_addr[i] = pads[2 * j];
        p.pad_key[i] = pads[2 * j + 1];
        int n = fi_av_insert(ra->av, names[j], 1, &p.fa[i], 0, NULL);
        if (n != 1)
            return txi_err(tx, -WB_E_FABRIC, "peer address: rail %u: fi_av_insert: %s", i,
                           n < 0 ? fab_strerror(-n) : "address refused");
        /* FI_AV_TABLE: addresses are the indices 0, 1, 2... of the vector */
        if (p.fa[i] >= (1u << 24))
            return txi_err(tx, -WB_E_FABRIC,
                           "peer address: rail %u: address %" PRIu64 " is no table index", i,
                           (uint64_t)p.fa[i]);
        if (p.fa[i] >= ra->nfa) {
            size_t nn = p.fa[i] + 16;
            uint32_t *m = realloc(ra->fa_peer, nn * sizeof(*m));
            if (!m)
                return txi_err(tx, -ENOMEM, "peer address: out of memory");
            memset(m + ra->nfa, 0, (nn - ra->nfa) * sizeof(*m));
            ra->fa_peer = m;
            ra->nfa = nn;
        }
        ra->fa_peer[p.fa[i]] = index + 1;
    }
    /* AV entries of a refused peer stay in the AVs; they are unused and freed at close. */
    fx->peers[fx->npeers++] = p;
    return 0;
}

/* ---------------------------------------------------------------- query, stats */

static int fab_query(struct wb_tx *tx, struct wb_tx_caps *c)
{
    struct fab_tx *fx = fab_of(tx);
    uint64_t maxop = UINT64_MAX, bw = 0;
    for (uint32_t i = 0; i < fx->nrails; i++) {
        const struct fi_info *in = fx->rail[i].info;
        if (fx->rail[i].max_msg < maxop)
            maxop = fx->rail[i].max_msg;
        if (in->nic && in->nic->link_attr && in->nic->link_attr->speed)
            bw += in->nic->link_attr->speed / 8;
    }
    *c = (struct wb_tx_caps){.name = fx->name,
                             .rails = fx->nrails,
                             .max_write = UINT64_MAX,
                             .max_op = maxop,
                             .mem_host = true,
                             .mem_cuda = fab_gpu_available(),
                             .gpu_direct = fx->hmem,
                             .needs_reg = true,
                             .same_host = strcmp(fx->prov, "shm") == 0,
                             .windows = !(fx->rail[0].mr_mode & FI_MR_PROV_KEY),
                             .imm_bits = 32,
                             .bw_hint = fx->cfg.bw_hint ? fx->cfg.bw_hint : bw};
    return 0;
}

static int fab_stats(struct wb_tx *tx, struct wb_tx_stats *st)
{
    *st = fab_of(tx)->st;
    return 0;
}

static int fab_peer_ptr(struct wb_tx *tx, uint32_t peer, const struct wb_tx_rdesc *dst, void **out)
{
    (void)peer;
    (void)dst;
    (void)out;
    return txi_err(tx, -ENOTSUP, "the fabric backend cannot address a peer's memory");
}

static const struct wb_tx_ops fab_ops = {
    .name = "fabric",
    .query = fab_query,
    .addr = fab_addr,
    .peer_add = fab_peer_add,
    .mr_reg = fab_mr_reg,
    .mr_rdesc = fab_mr_rdesc,
    .mr_dereg = fab_mr_dereg,
    .mr_window = fab_mr_window,
    .peer_ptr = fab_peer_ptr,
    .write = fab_write,
    .note = fab_note,
    .fence = fab_fence,
    .poll = fab_poll,
    .stats = fab_stats,
    .close = fab_close,
};

/* ---------------------------------------------------------------- open */

/* The i-th comma-separated item of list into buf ("" when the list has fewer). Returns the
 * number of items. */
static size_t list_item(const char *list, size_t i, char *buf, size_t cap)
{
    size_t n = 0;
    buf[0] = 0;
    for (const char *p = list; *p;) {
        size_t len = strcspn(p, ",");
        if (n == i)
            snprintf(buf, cap, "%.*s", (int)len, p);
        n++;
        p += len;
        if (*p == ',')
            p++;
    }
    return n;
}

/* tcp;ofi_rxm's message buffers are 16 KiB by default, and it preposts thousands per endpoint
 * (about 65 MB of resident memory per rail, seen here); the only messages this transport sends
 * are notes of at most 80 bytes, so 1 KiB buffers lose nothing (data moves by RMA writes, which do
 * not use them). libfabric reads the setting when it first loads its providers, and rxm refuses a
 * peer whose value differs: it is set only where the environment does not say otherwise, and the
 * same way in every process of a job. */
static void rxm_buffers(void)
{
    setenv("FI_OFI_RXM_BUFFER_SIZE", "1024", 0);
}

static struct fi_info *get_info(const struct wb_tx_cfg *cfg, bool hmem, int *err)
{
    struct fi_info *hints = fab_dupinfo(NULL), *info = NULL;
    if (!hints) {
        *err = -FI_ENOMEM;
        return NULL;
    }
    hints->ep_attr->type = FI_EP_RDM;
    /* FI_SOURCE: a received note comes with the address vector index of its sender */
    hints->caps = FI_MSG | FI_RMA | FI_WRITE | FI_REMOTE_WRITE | FI_SEND | FI_RECV | FI_SOURCE;
    hints->mode = FI_CONTEXT | FI_CONTEXT2;
    hints->domain_attr->mr_mode =
        FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_ENDPOINT;
    if (hmem) {
        hints->caps |= FI_HMEM;
        hints->domain_attr->mr_mode |= FI_MR_HMEM;
    }
    hints->fabric_attr->prov_name = strdup(cfg->provider);
    /* Notes queued together go as one injected message (fabric_post.c): ask for an inject size
     * that holds a receive buffer's worth (tcp;ofi_rxm says 64 bytes unless asked, and gives up
     * to its buffer size); a provider that cannot is asked again for its own. */
    hints->tx_attr->inject_size = FAB_MSG_SIZE;
    *err = hints->fabric_attr->prov_name ? fab_getinfo(FAB_API, hints, &info) : -FI_ENOMEM;
    if (*err == -FI_ENODATA) {
        hints->tx_attr->inject_size = 0;
        *err = fab_getinfo(FAB_API, hints, &info);
    }
    fab_freeinfo(hints);
    return *err ? NULL : info;
}

/* Picks the fi_info of each rail: the named domains in order, or every distinct domain the
 * provider lists (the first entry of each, which is IPv4 before IPv6 for tcp), round robin. */
static int pick_rails(struct fab_tx *fx, const struct wb_tx_cfg *cfg, struct fi_info *list,
                      struct wb_errlist *el)
{
    const struct fi_info *distinct[64];
    size_t nd = 0;
    for (const struct fi_info *in = list; in && nd < 64; in = in->next) {
        if (in->domain_attr->cq_data_size < 4)
            continue;
        bool seen = false;
        for (size_t k = 0; k < nd; k++)
            seen |= strcmp(distinct[k]->domain_attr->name, in->domain_attr->name) == 0;
        if (!seen)
            distinct[nd++] = in;
    }
    char want[128];
    size_t nwant = list_item(cfg->domain, 0, want, sizeof(want));
    for (uint32_t i = 0; i < fx->nrails; i++) {
        const struct fi_info *pick = NULL;
        if (nwant) {
            list_item(cfg->domain, i % nwant, want, sizeof(want));
            for (size_t k = 0; k < nd && !pick; k++)
                if (strcmp(distinct[k]->domain_attr->name, want) == 0)
                    pick = distinct[k];
            if (!pick) {
                wb_errlist_add(el,
                               "transport.domain: provider '%s' has no domain '%s' with "
                               "remote CQ data (it has:%s%s%s%s)",
                               cfg->provider, want, nd > 0 ? " " : " none",
                               nd > 0 ? distinct[0]->domain_attr->name : "", nd > 1 ? " " : "",
                               nd > 1 ? distinct[1]->domain_attr->name : "");
                return -EINVAL;
            }
        } else if (nd) {
            pick = distinct[i % nd];
        } else {
            wb_errlist_add(el, "transport.provider: '%s' offers no domain with remote CQ data",
                           cfg->provider);
            return -EINVAL;
        }
        fx->rail[i].info = fab_dupinfo(pick);
        if (!fx->rail[i].info)
            return -ENOMEM;
    }
    return 0;
}

static int open_rail(struct fab_tx *fx, uint32_t i, struct wb_errlist *el)
{
    struct fab_rail *r = &fx->rail[i];
    struct fi_info *in = r->info;
    size_t qs = in->tx_attr->size + in->rx_attr->size;
    struct fi_cq_attr cqa = {
        .format = FI_CQ_FORMAT_DATA, .size = qs < 8192 ? 8192 : qs, .wait_obj = FI_WAIT_NONE};
    struct fi_av_attr ava = {.type = FI_AV_TABLE};
    const char *what;
    int e;
    /* Each step names itself for the message; whatever was opened is closed by fab_close. */
    if ((e = fab_fabric_open(in->fabric_attr, &r->fabric))) {
        what = "fi_fabric";
    } else if ((e = fi_domain(r->fabric, in, &r->domain, NULL))) {
        what = "fi_domain";
    } else if ((e = fi_cq_open(r->domain, &cqa, &r->cq, NULL))) {
        what = "fi_cq_open";
    } else if ((e = fi_av_open(r->domain, &ava, &r->av, NULL))) {
        what = "fi_av_open";
    } else if ((e = fi_endpoint(r->domain, in, &r->ep, NULL))) {
        what = "fi_endpoint";
    } else if ((e = fi_ep_bind(r->ep, &r->cq->fid, FI_TRANSMIT | FI_RECV))) {
        what = "fi_ep_bind(cq)";
    } else if ((e = fi_ep_bind(r->ep, &r->av->fid, 0))) {
        what = "fi_ep_bind(av)";
    } else if ((e = fi_enable(r->ep))) {
        what = "fi_enable";
    } else {
        r->namelen = sizeof(r->name);
        if ((e = fi_getname(&r->ep->fid, r->name, &r->namelen)))
            what = "fi_getname";
    }
    if (e) {
        wb_errlist_add(el, "fabric: provider '%s' domain '%s' rail %u: %s: %s",
                       in->fabric_attr->prov_name, in->domain_attr->name, i, what,
                       fab_strerror(-e));
        return -WB_E_FABRIC;
    }
    r->mr_mode = in->domain_attr->mr_mode;
    r->max_msg = in->ep_attr->max_msg_size ? in->ep_attr->max_msg_size : (1ull << 30);
    r->inject_size = in->tx_attr->inject_size;
    wb_log(WB_LOG_DEBUG, "transport", "fabric: rail %u: inject size %zu, window %zu", i,
           r->inject_size, (size_t)in->tx_attr->size);
    r->key_size = in->domain_attr->mr_key_size;
    r->window = fx->cfg.window ? fx->cfg.window : in->tx_attr->size;
    if (r->window == 0)
        r->window = 256;
    /* The note receive buffers: local use only, no peer may write them. */
    uint64_t ctrl_key;
    e = reg_rail(fx, i, fx->ctrl, (size_t)fx->nrails * FAB_NRECV * FAB_MSG_SIZE, FI_RECV, -1,
                 &r->ctrl_mr, &r->ctrl_desc, &ctrl_key);
    if (e) {
        wb_errlist_add(el, "%s", wb_tx_errmsg(&fx->base));
        return e;
    }
    e = reg_rail(fx, i, fx->pad + (size_t)i * FAB_PAD, FAB_PAD, FI_WRITE | FI_REMOTE_WRITE, -1,
                 &r->pad_mr, &r->pad_desc, &r->pad_key);
    if (e) {
        wb_errlist_add(el, "%s", wb_tx_errmsg(&fx->base));
        return e;
    }
    e = fab_post_recvs(fx, i);
    if (e) {
        wb_errlist_add(el, "fabric: rail %u: posting receives: %s", i, wb_tx_errmsg(&fx->base));
        return e;
    }
    return 0;
}

static int fab_open(const struct wb_tx_cfg *cfg, struct wb_errlist *el, struct wb_tx **out)
{
    struct fab_tx *fx = calloc(1, sizeof(*fx));
    if (!fx)
        return -ENOMEM;
    int e = txi_core_init(&fx->base, &fab_ops, WB_TX_FABRIC);
    if (e) {
        free(fx);
        return e;
    }
    fx->cfg = *cfg;
    fx->cfg.provider = fx->cfg.domain = NULL;
    fx->nrails = (uint32_t)cfg->rails;
    fx->gpu_device = -1;
    size_t ctrl_len = (size_t)fx->nrails * FAB_NRECV * FAB_MSG_SIZE;
    if (posix_memalign((void **)&fx->ctrl, 4096, ctrl_len) != 0) {
        fx->ctrl = NULL;
        e = -ENOMEM;
        goto err_close;
    }
    memset(fx->ctrl, 0, ctrl_len);
    if (posix_memalign((void **)&fx->pad, 64, (size_t)fx->nrails * FAB_PAD) != 0) {
        fx->pad = NULL;
        e = -ENOMEM;
        goto err_close;
    }
    memset(fx->pad, 0, (size_t)fx->nrails * FAB_PAD);

    int fe = 0;
    bool want_hmem = cfg->hmem == WB_TX_HMEM_AUTO && fab_gpu_available();
    struct fi_info *list = want_hmem ? get_info(cfg, true, &fe) : NULL;
    fx->hmem = list != NULL;
    if (!list)
        list = get_info(cfg, false, &fe);
    if (!list) {
        wb_errlist_add(el,
                       "transport.provider: '%s' offers no FI_EP_RDM endpoint with RMA writes "
                       "and messages: fi_getinfo: %s",
                       cfg->provider, fab_strerror(-fe));
        e = -WB_E_FABRIC;
        goto err_close;
    }
    e = pick_rails(fx, cfg, list, el);
    fab_freeinfo(list);
    if (e)
        goto err_close;
    snprintf(fx->prov, sizeof(fx->prov), "%s", fx->rail[0].info->fabric_attr->prov_name);
    fx->ordered = strcmp(fx->prov, "tcp;ofi_rxm") == 0 && !getenv("WB_TX_NOTES_DELIVERED");
    snprintf(fx->name, sizeof(fx->name), "fabric/%s", fx->prov);
    for (uint32_t i = 0; i < fx->nrails; i++) {
        e = open_rail(fx, i, el);
        if (e)
            goto err_close;
    }
    wb_log(WB_LOG_INFO, "transport", "fabric: %s, %u rail(s) on %s%s", fx->prov, fx->nrails,
           fx->rail[0].info->domain_attr->name, fx->hmem ? ", FI_HMEM" : "");
    *out = &fx->base;
    return 0;

err_close:
    fab_close(&fx->base);
    return e;
}

/* Providers install signal handlers of their own while they open (libfabric 1.17's shm: SIGINT,
 * SIGBUS, SIGSEGV and SIGTERM, to unlink its shared memory and then re-raise; psm's on load):
 * every disposition is saved before libfabric is loaded or anything is opened, and whatever a
 * provider changed is put back (fabric_dl.c says why). */
int txi_fabric_open(const struct wb_tx_cfg *cfg, struct wb_errlist *el, struct wb_tx **out)
{
    rxm_buffers();
    const char *why = fab_dl_open();
    if (why) {
        wb_errlist_add(el, "transport.backend: fabric: %s", why);
        return -WB_E_FABRIC;
    }
    struct fab_sigs *s = malloc(sizeof(*s));
    if (!s)
        return -ENOMEM;
    fab_sig_save(s);
    int e = fab_open(cfg, el, out);
    fab_sig_keep(s, "opening the transport");
    free(s);
    return e;
}

/* ---------------------------------------------------------------- close */

static void close_fid(struct fid *f)
{
    if (f)
        fi_close(f);
}

static void fab_close(struct wb_tx *tx)
{
    struct fab_tx *fx = fab_of(tx);
    /* Endpoints first: closing them cancels every operation still owned by the provider, so
     * the memory behind those operations can go afterwards. */
    for (uint32_t i = 0; i < fx->nrails; i++)
        if (fx->rail[i].ep)
            fi_close(&fx->rail[i].ep->fid);
    fab_gpu_close(fx->gpu); /* waits for copies into mirrors and bounce chunks */
    for (size_t k = 0; k < fx->nmrs; k++)
        mr_release(fx, fx->mrs[k]);
    free(fx->mrs);
    for (uint32_t i = 0; i < fx->nrails; i++) {
        struct fab_rail *r = &fx->rail[i];
        close_fid(r->pool_mr ? &r->pool_mr->fid : NULL);
        close_fid(r->ctrl_mr ? &r->ctrl_mr->fid : NULL);
        close_fid(r->pad_mr ? &r->pad_mr->fid : NULL);
        close_fid(r->av ? &r->av->fid : NULL);
        close_fid(r->cq ? &r->cq->fid : NULL);
        close_fid(r->domain ? &r->domain->fid : NULL);
        close_fid(r->fabric ? &r->fabric->fid : NULL);
        if (r->info)
            fab_freeinfo(r->info);
        free(r->fa_peer);
    }
    if (fx->pool)
        fab_gpu_host_free(fx->pool, fx->pool_pinned);
    free(fx->chunks);
    fab_post_fini(fx);
    free(fx->peers);
    free(fx->ctrl);
    free(fx->pad);
    txi_core_fini(&fx->base);
    free(fx);
}
