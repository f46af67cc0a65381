/* delta.c — delta updates (job key delta): a trainer sends a rollout only the bytes of its writes
 * that changed since the version the rollout holds whole, and the rollout stores them before
 * the version counts. Both halves are here because they share the record (proto.h,
 * struct wb_delta_rec); exec.c and rollout.c call in at a few points.
 *
 * Trainer. A shadow keeps the bytes last sent of every distinct write source (a write's bytes
 * after fuse/cast/quantize, the same for every replica it goes to): memory equal to the
 * trainer's distinct output bytes, host memory. At each write the source is compared with its
 * shadow once per attempt; the changed bytes are packed as a record (u32 offsets, then the
 * byte values) into a registered outbox, and the shadow takes the new bytes. The write then
 * goes to the rollout's delta inbox instead of the tensor — the trainer's own slab there, at
 * its cursor — with the same immediate: its note counts as the write it stands for. A write
 * is sent whole where TRANSFER does not allow its rollout a delta, where the record would be
 * larger than half the write, or does not fit the outbox or the slab.
 *
 * Exactness. A delta of version V against base B is right only if the rollout holds B whole
 * and the shadow holds B's bytes. The controller vouches for the first (TRANSFER.delta: the
 * rollout committed B, the last complete version, is not torn, and no attempt failed since);
 * the trainer for the second: its shadow is of version B only when its last attempt (of B)
 * ended well here and touched every shadow slot (no write skipped by a resumed attempt, none
 * taken by the direct path). Anything else — a restart, a re-setup, an attempt that failed or
 * was resumed — leaves the shadow of no version, and the trainer sends full until a whole
 * attempt rebuilt it. A GPU trainer keeps no shadow here: its direct path (direct.c) keeps one on
 * the GPU and stores changes only under the same two conditions; its pipeline writes go full.
 *
 * Rollout. The inbox is one registration (host memory), a slab per writing trainer, with its
 * window open only during an attempt. Once every write of the attempt is in (each record was
 * written before the note that counts it), the window closes and the records of this attempt
 * are read from each slab's start — each checked against the tensor it names — and their
 * bytes stored (host tensors directly; GPU tensors through a host copy of the write's range).
 * Only then are tensors checked (verify: the records' sums are of the full bytes the trainer
 * produced, so a wrong shadow shows) and the version counted. */
#include "agent/xfer.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *M = "agent";

enum { REC_HDR = sizeof(struct wb_delta_rec) };
_Static_assert(sizeof(struct wb_delta_rec) == 32, "a delta record header is 32 bytes");

static const uint32_t NO_SLOT = UINT32_MAX;
static const uint64_t NO_PAYLOAD = UINT64_MAX;

/* One distinct write source of the table: its shadow and this attempt's record. */
struct dslot {
    uint64_t shadow_off, len;
    uint32_t stamp;      /* the attempt that touched it last */
    uint64_t pay_off;    /* this attempt's record in the outbox (NO_PAYLOAD: send full) */
    uint64_t pay_len;    /* its bytes, header included */
    uint32_t pay_tensor; /* the write the record names */
    uint64_t pay_dst;
};

struct ag_delta {
    struct wb_bytes slabs_blob; /* SETUP.delta_slabs, copied */
    uint8_t *slabs_buf;
    /* trainer */
    uint32_t nroll;
    uint64_t *slab_len; /* [nroll]: this trainer's slab in each rollout's inbox (its own
                           registration there: writes go at offsets within it) */
    uint64_t *cursor;   /* [nroll]: this attempt's next free byte in it */
    uint8_t *allow;     /* [nroll]: TRANSFER.delta */
    uint32_t *slot_of;  /* [table.nwrites] */
    struct dslot *slot;
    uint32_t nslots;
    uint8_t *shadow;
    uint64_t shadow_bytes;
    uint8_t *out; /* the outbox records are written from */
    uint64_t out_bytes, out_used;
    struct wb_tx_mr *out_mr;
    uint64_t shadow_version; /* the version the whole shadow holds (0: none) */
    uint64_t base;           /* this attempt's TRANSFER.delta_base */
    uint32_t stamp, touched;
    bool active;    /* this attempt sends deltas (the shadow holds its base) */
    bool corrupted; /* the testing hook fired in this attempt */
    /* rollout */
    uint64_t *rslab_off, *rslab_len; /* [nslab]: per trainer rank */
    uint32_t nslab;
    uint8_t *in;
    uint64_t in_bytes;
    struct wb_tx_mr **in_mr; /* [nslab]: each slab its own registration (NULL: empty) */
    uint32_t **wtensor;      /* [nslab]: the rollout tensors trainer rank i writes here, sorted */
    uint32_t *nwtensor;
    bool applied; /* this attempt's records are stored */
    uint8_t *bounce;
    uint64_t bounce_len;
};

static uint64_t get_u64(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

int ag_delta_setup(struct data *d, const struct wb_body_setup *b, char *err, size_t errcap)
{
    if (!b->delta || d->empty)
        return 0;
    struct ag_delta *x = calloc(1, sizeof(*x));
    if (!x)
        return -ENOMEM;
    d->delta = x;
    if (b->delta_slabs.n % 16) {
        snprintf(err, errcap, "setup: %zu bytes of delta slabs (16 each)", b->delta_slabs.n);
        return -EBADMSG;
    }
    x->slabs_buf = malloc(b->delta_slabs.n + 1);
    if (!x->slabs_buf)
        return -ENOMEM;
    memcpy(x->slabs_buf, b->delta_slabs.p, b->delta_slabs.n);
    x->slabs_blob = (struct wb_bytes){x->slabs_buf, b->delta_slabs.n};
    return 0;
}

void ag_delta_free(struct data *d)
{
    struct ag_delta *x = d->delta;
    if (!x)
        return;
    free(x->slabs_buf);
    free(x->slab_len);
    free(x->cursor);
    free(x->allow);
    free(x->slot_of);
    free(x->slot);
    free(x->shadow);
    free(x->out);
    free(x->rslab_off);
    free(x->rslab_len);
    free(x->in);
    free(x->in_mr);
    for (uint32_t i = 0; x->wtensor && i < x->nslab; i++)
        free(x->wtensor[i]);
    free(x->wtensor);
    free(x->nwtensor);
    free(x->bounce);
    free(x);
    d->delta = NULL;
}

/* ---------------------------------------------------------------- trainer */

struct skey {
    uint32_t src_tensor, task; /* task: only for TMP sources (their offsets are the task's) */
    uint64_t src_off, len;
    uint32_t write;
};

static int cmp_skey(const void *a, const void *b)
{
    const struct skey *x = a, *y = b;
    if (x->src_tensor != y->src_tensor)
        return x->src_tensor < y->src_tensor ? -1 : 1;
    if (x->task != y->task)
        return x->task < y->task ? -1 : 1;
    if (x->src_off != y->src_off)
        return x->src_off < y->src_off ? -1 : 1;
    if (x->len != y->len)
        return x->len < y->len ? -1 : 1;
    return x->write < y->write ? -1 : x->write > y->write;
}

int ag_delta_trainer_setup(struct data *d, char *err, size_t errcap)
{
    struct ag_delta *x = d->delta;
    const struct wb_route_table *t = &d->table;
    if (!x)
        return 0;
    x->nroll = t->nrollouts;
    if (x->slabs_blob.n != (size_t)t->nrollouts * 16) {
        snprintf(err, errcap, "setup: delta slabs for %zu rollouts, the table has %u",
                 x->slabs_blob.n / 16, t->nrollouts);
        return -EBADMSG;
    }
    uint32_t nr = x->nroll ? x->nroll : 1, nw = t->nwrites;
    x->slab_len = calloc(nr, sizeof(uint64_t));
    x->cursor = calloc(nr, sizeof(uint64_t));
    x->allow = calloc(nr, 1);
    x->slot_of = malloc((nw ? nw : 1) * sizeof(uint32_t));
    struct skey *k = malloc((nw ? nw : 1) * sizeof(*k));
    if (!x->slab_len || !x->cursor || !x->allow || !x->slot_of || !k) {
        free(k);
        return -ENOMEM;
    }
    for (uint32_t g = 0; g < x->nroll; g++)
        x->slab_len[g] = get_u64(x->slabs_buf + 16 * (size_t)g + 8);
    if (d->gpu) { /* no shadow on the GPU yet: every write is sent whole */
        free(k);
        wb_log(WB_LOG_INFO, M, "trainer rank %u: delta updates: GPU memory, sending full updates",
               d->rank);
        for (uint32_t i = 0; i < nw; i++)
            x->slot_of[i] = NO_SLOT;
        return 0;
    }
    /* the distinct sources: writes of the same bytes (replicas) share a slot */
    uint32_t n = 0;
    for (uint32_t ti = 0; ti < t->ntasks; ti++)
        for (uint32_t j = 0; j < t->tasks[ti].nwrites; j++) {
            uint32_t w = t->tasks[ti].write0 + j;
            const struct wb_rt_write *wr = &t->writes[w];
            x->slot_of[w] = NO_SLOT;
            if (!wr->len || wr->len > UINT32_MAX || wr->dst_rank >= x->nroll ||
                !x->slab_len[wr->dst_rank])
                continue;
            bool tmp = wr->src_tensor == (uint32_t)WB_RT_TMP_SRC;
            k[n++] = (struct skey){wr->src_tensor, tmp ? ti : 0, wr->src_off, wr->len, w};
        }
    qsort(k, n, sizeof(*k), cmp_skey);
    x->slot = calloc(n ? n : 1, sizeof(*x->slot));
    if (!x->slot) {
        free(k);
        return -ENOMEM;
    }
    for (uint32_t i = 0; i < n; i++) {
        bool same = i && k[i].src_tensor == k[i - 1].src_tensor && k[i].task == k[i - 1].task &&
                    k[i].src_off == k[i - 1].src_off && k[i].len == k[i - 1].len;
        if (!same) {
            x->slot[x->nslots] = (struct dslot){.shadow_off = x->shadow_bytes, .len = k[i].len};
            x->shadow_bytes += k[i].len;
            x->nslots++;
        }
        x->slot_of[k[i].write] = x->nslots - 1;
    }
    free(k);
    /* the outbox: as much as the slabs could take of this trainer's records, at most an
     * eighth of the shadow plus a header per slot (a record is worth sending below half its
     * write; past the budget, writes go whole) */
    uint64_t slabs = 0;
    for (uint32_t g = 0; g < x->nroll; g++)
        slabs += x->slab_len[g];
    uint64_t cap = x->shadow_bytes / 8 + (uint64_t)x->nslots * 64 + 4096;
    x->out_bytes = slabs < cap ? slabs : cap;
    x->shadow = malloc(x->shadow_bytes ? x->shadow_bytes : 1);
    x->out = calloc(1, x->out_bytes ? x->out_bytes : 64);
    if (!x->shadow || !x->out)
        return -ENOMEM;
    int rc =
        wb_tx_mr_reg(d->tx, x->out, x->out_bytes ? x->out_bytes : 64, WB_TX_ACCESS_SRC, &x->out_mr);
    if (rc) {
        snprintf(err, errcap, "delta outbox: cannot register %" PRIu64 " bytes: %s", x->out_bytes,
                 wb_tx_errmsg(d->tx));
        return rc;
    }
    wb_log(WB_LOG_INFO, M,
           "trainer rank %u: delta updates: shadow of %u sources, %" PRIu64
           " bytes; outbox %" PRIu64 " bytes",
           d->rank, x->nslots, x->shadow_bytes, x->out_bytes);
    return 0;
}

int ag_delta_start(struct data *d, const struct wb_body_version_epoch *b, char *err, size_t errcap)
{
    struct ag_delta *x = d->delta;
    if (!x || d->role != WB_ROLE_TRAINER)
        return 0;
    if (b->delta.n && b->delta.n != x->nroll) {
        snprintf(err, errcap, "transfer: delta flags for %zu rollouts, the table has %u",
                 b->delta.n, x->nroll);
        return -EBADMSG;
    }
    bool any = false;
    for (uint32_t g = 0; g < x->nroll; g++) {
        x->allow[g] = b->delta.n ? ((const uint8_t *)b->delta.p)[g] == 1 : 0;
        any |= x->allow[g];
        x->cursor[g] = 0;
    }
    /* what the shadow holds is B's only if the last attempt here rebuilt it whole (B's) */
    x->active = any && x->nslots && b->delta_base && x->shadow_version == b->delta_base;
    if (any && !x->active && x->nslots)
        wb_log(WB_LOG_INFO, M,
               "trainer rank %u: version %" PRIu64 ": deltas allowed against %" PRIu64
               ", but the shadow holds %s: sending full",
               d->rank, b->version, b->delta_base,
               x->shadow_version ? "another version" : "no version");
    x->shadow_version = 0; /* rewritten from here on */
    x->base = b->delta_base;
    x->stamp++;
    x->touched = 0;
    x->out_used = 0;
    x->corrupted = false;
    return 0;
}

void ag_delta_end(struct data *d, bool ok)
{
    struct ag_delta *x = d->delta;
    if (!x || d->role != WB_ROLE_TRAINER)
        return;
    x->shadow_version = ok && x->nslots && x->touched == x->nslots ? d->version : 0;
    d->stats.delta_ok = x->active || ag_direct_sent_delta(d) ? 1 : 0;
    ag_direct_end(d, ok);
}

bool ag_delta_allowed(const struct data *d, uint32_t g, uint64_t *base)
{
    const struct ag_delta *x = d->delta;
    if (!x || d->role != WB_ROLE_TRAINER || g >= x->nroll || !x->allow[g])
        return false;
    *base = x->base;
    return x->base != 0;
}

/* The record of slot s (write len bytes at src against its shadow), into the outbox: its
 * offset, or NO_PAYLOAD when it is not worth it or does not fit. The shadow takes the new
 * bytes either way. */
static uint64_t make_record(struct data *d, struct dslot *s, const uint8_t *src,
                            const struct wb_rt_write *wr)
{
    struct ag_delta *x = d->delta;
    uint8_t *sh = x->shadow + s->shadow_off;
    uint64_t len = s->len, n = 0, room = x->out_bytes - x->out_used;
    /* worth it below half the write; 5 bytes per changed byte after a 32-byte header */
    uint64_t limit = len / 2 > REC_HDR ? (len / 2 - REC_HDR) / 5 : 0;
    if (room > REC_HDR + 8 && (room - REC_HDR - 8) / 5 < limit)
        limit = (room - REC_HDR - 8) / 5;
    uint64_t i = 0;
    for (; i + 8 <= len && n <= limit; i += 8) /* count, a word at a time */
        if (get_u64(src + i) != get_u64(sh + i))
            for (uint64_t j = i; j < i + 8; j++)
                n += src[j] != sh[j];
    for (; i < len && n <= limit; i++)
        n += src[i] != sh[i];
    bool hook = d->o->corrupt_delta && d->o->corrupt_delta == d->version && !x->corrupted && n;
    uint64_t at = NO_PAYLOAD;
    /* testing (--corrupt-delta): the first changed byte is left out, as if the shadow had held
     * it already — the shadow no longer matches what the rollout holds */
    uint64_t keep = hook ? n - 1 : n, skip = hook ? 1 : 0;
    uint64_t size = (REC_HDR + 5 * keep + 7) / 8 * 8;
    if (n <= limit && size <= room) { /* worth it, and it fits (a header alone may not) */
        at = x->out_used;
        uint8_t *r = x->out + at;
        struct wb_delta_rec h = {.epoch = d->epoch,
                                 .dst_off = wr->dst_off,
                                 .len = len,
                                 .tensor = wr->dst_tensor,
                                 .n = (uint32_t)keep};
        memcpy(r, &h, REC_HDR);
        uint8_t *offs = r + REC_HDR, *vals = offs + 4 * keep;
        uint64_t m = 0;
        for (uint64_t j = 0; j < len && m < keep; j++) {
            if (src[j] == sh[j])
                continue;
            if (skip) {
                skip = 0;
                continue;
            }
            uint32_t o = (uint32_t)j;
            memcpy(offs + 4 * m, &o, 4);
            vals[m++] = src[j];
        }
        memset(vals + keep, 0, size - REC_HDR - 5 * keep);
        x->out_used += size;
        s->pay_len = size;
        s->pay_tensor = wr->dst_tensor;
        s->pay_dst = wr->dst_off;
        if (hook) {
            x->corrupted = true;
            wb_log(WB_LOG_WARN, M,
                   "trainer rank %u: testing: version %" PRIu64 ": a changed byte of rollout "
                   "tensor %u left out of its delta",
                   d->rank, d->version, wr->dst_tensor);
        }
    }
    memcpy(sh, src, len);
    return at;
}

int ag_delta_write(struct data *d, uint32_t k, const uint8_t *src, const struct peer *p,
                   struct wb_tx_write *w)
{
    struct ag_delta *x = d->delta;
    const struct wb_rt_write *wr = &d->table.writes[k];
    uint32_t si = x && src ? x->slot_of[k] : NO_SLOT;
    if (si == NO_SLOT)
        return 0;
    struct dslot *s = &x->slot[si];
    if (s->stamp != x->stamp) { /* the first of its writes in this attempt */
        s->stamp = x->stamp;
        x->touched++;
        s->pay_off = NO_PAYLOAD;
        if (x->active)
            s->pay_off = make_record(d, s, src, wr);
        else
            memcpy(x->shadow + s->shadow_off, src, s->len);
    }
    uint32_t g = wr->dst_rank;
    if (!x->active || !x->allow[g] || s->pay_off == NO_PAYLOAD || !p->has_delta ||
        x->cursor[g] + s->pay_len > x->slab_len[g])
        return 0;
    uint64_t at = s->pay_off;
    if (s->pay_tensor != wr->dst_tensor || s->pay_dst != wr->dst_off) {
        /* a replica that lands elsewhere in its rollout: a copy naming its own place */
        if (x->out_bytes - x->out_used < s->pay_len)
            return 0;
        at = x->out_used;
        memcpy(x->out + at, x->out + s->pay_off, s->pay_len);
        struct wb_delta_rec h;
        memcpy(&h, x->out + at, REC_HDR);
        h.tensor = wr->dst_tensor;
        h.dst_off = wr->dst_off;
        memcpy(x->out + at, &h, REC_HDR);
        x->out_used += s->pay_len;
    }
    w->src = x->out_mr;
    w->src_off = at;
    w->dst = &p->delta; /* this trainer's slab, registered on its own */
    w->dst_off = x->cursor[g];
    w->len = s->pay_len;
    x->cursor[g] += s->pay_len;
    d->stats.delta_bytes += s->pay_len;
    return 1;
}

/* ---------------------------------------------------------------- rollout */

static uint32_t slabs_used(const struct ag_delta *x)
{
    uint32_t n = 0;
    for (uint32_t i = 0; i < x->nslab; i++)
        n += x->rslab_len[i] != 0;
    return n;
}

/* The slabs are parsed at SETUP (ag_delta_setup keeps the blob; this counts what is in it). */
uint32_t ag_delta_regions(const struct data *d)
{
    const struct ag_delta *x = d->delta;
    if (!x)
        return 0;
    uint32_t n = 0;
    for (size_t i = 0; i < x->slabs_blob.n / 16; i++)
        n += get_u64(x->slabs_buf + 16 * i + 8) != 0;
    return n;
}

int ag_delta_rollout_setup(struct data *d, struct wb_mpw *w, char *err, size_t errcap)
{
    struct ag_delta *x = d->delta;
    if (!x)
        return 0;
    x->nslab = (uint32_t)(x->slabs_blob.n / 16);
    x->rslab_off = calloc(x->nslab ? x->nslab : 1, sizeof(uint64_t));
    x->rslab_len = calloc(x->nslab ? x->nslab : 1, sizeof(uint64_t));
    if (!x->rslab_off || !x->rslab_len)
        return -ENOMEM;
    for (uint32_t i = 0; i < x->nslab; i++) {
        x->rslab_off[i] = get_u64(x->slabs_buf + 16 * (size_t)i);
        x->rslab_len[i] = get_u64(x->slabs_buf + 16 * (size_t)i + 8);
        if (x->rslab_off[i] + x->rslab_len[i] < x->rslab_off[i] || x->rslab_len[i] % 8 ||
            x->rslab_off[i] % 8) {
            snprintf(err, errcap, "setup: delta slab of trainer rank %u is malformed", i);
            return -EBADMSG;
        }
        if (x->rslab_off[i] + x->rslab_len[i] > x->in_bytes)
            x->in_bytes = x->rslab_off[i] + x->rslab_len[i];
    }
    x->in = calloc(1, x->in_bytes ? x->in_bytes : 64);
    x->in_mr = calloc(x->nslab ? x->nslab : 1, sizeof(*x->in_mr));
    if (!x->in || !x->in_mr)
        return -ENOMEM;
    /* a registration per slab: a trainer holds the key of its own slab, no other's */
    for (uint32_t i = 0; i < x->nslab; i++) {
        if (!x->rslab_len[i])
            continue;
        int rc = wb_tx_mr_reg(d->tx, x->in + x->rslab_off[i], x->rslab_len[i], WB_TX_ACCESS_DST,
                              &x->in_mr[i]);
        struct wb_tx_rdesc rd;
        rc = rc ? rc : wb_tx_rdesc(d->tx, x->in_mr[i], &rd);
        if (rc) {
            snprintf(err, errcap, "delta inbox: trainer rank %u's slab (%" PRIu64 " bytes): %s", i,
                     x->rslab_len[i], wb_tx_errmsg(d->tx));
            return rc;
        }
        if (d->caps.windows)
            wb_tx_mr_window(d->tx, x->in_mr[i], false);
        wb_mpw_array(w, 2);
        wb_mpw_u64(w, DELTA_SLAB_ENTRY + i);
        wb_tx_rdesc_put(w, &rd);
    }
    wb_log(WB_LOG_INFO, M, "rollout rank %u: delta inbox of %" PRIu64 " bytes, %u slabs", d->rank,
           x->in_bytes, slabs_used(x));
    return 0;
}

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

int ag_delta_writer(struct data *d, uint32_t rank, const void *list, size_t len)
{
    struct ag_delta *x = d->delta;
    if (!x || rank >= x->nslab)
        return 0;
    if (!x->wtensor) {
        x->wtensor = calloc(x->nslab ? x->nslab : 1, sizeof(*x->wtensor));
        x->nwtensor = calloc(x->nslab ? x->nslab : 1, sizeof(*x->nwtensor));
        if (!x->wtensor || !x->nwtensor)
            return -ENOMEM;
    }
    free(x->wtensor[rank]);
    x->wtensor[rank] = NULL;
    x->nwtensor[rank] = 0;
    struct wb_mpr r;
    uint32_t n;
    wb_mpr_init(&r, list, len);
    if (!len || wb_mpr_array(&r, WB_WIRE_MAX_ARRAY, &n))
        return len ? -EBADMSG : 0;
    uint32_t *t = malloc((n ? n : 1) * sizeof(uint32_t));
    if (!t)
        return -ENOMEM;
    for (uint32_t i = 0; i < n; i++) {
        uint64_t v;
        if (wb_mpr_u64(&r, &v) || v > UINT32_MAX) {
            free(t);
            return -EBADMSG;
        }
        t[i] = (uint32_t)v;
    }
    qsort(t, n, sizeof(*t), cmp_u32);
    x->wtensor[rank] = t;
    x->nwtensor[rank] = n;
    return 0;
}

/* Trainer rank t writes rollout tensor `tensor` here (PEERS said so). */
static bool writes_tensor(const struct ag_delta *x, uint32_t t, uint32_t tensor)
{
    return x->wtensor && t < x->nslab && x->nwtensor[t] &&
           bsearch(&tensor, x->wtensor[t], x->nwtensor[t], sizeof(uint32_t), cmp_u32);
}

static void slab_windows(struct data *d, bool open)
{
    struct ag_delta *x = d->delta;
    for (uint32_t i = 0; d->caps.windows && x->in_mr && i < x->nslab; i++)
        if (x->in_mr[i])
            wb_tx_mr_window(d->tx, x->in_mr[i], open);
}

void ag_delta_window(struct data *d, bool open)
{
    struct ag_delta *x = d->delta;
    if (!x || !x->in_mr)
        return;
    slab_windows(d, open);
    if (open)
        x->applied = false;
}

/* The bytes of one record into the tensor (host memory, or a GPU tensor through a host copy
 * of the write's range). */
static int store(struct data *d, const struct local *l, const struct wb_delta_rec *h,
                 const uint8_t *offs, const uint8_t *vals)
{
    struct ag_delta *x = d->delta;
    uint8_t *base = (uint8_t *)l->buf + h->dst_off;
    if (d->gpu) {
        if (x->bounce_len < h->len) {
            uint8_t *b = realloc(x->bounce, h->len);
            if (!b)
                return -ENOMEM;
            x->bounce = b;
            x->bounce_len = h->len;
        }
        int rc = wb_tx_mem_copy(x->bounce, base, h->len);
        if (rc)
            return rc;
    }
    uint8_t *dst = d->gpu ? x->bounce : base;
    for (uint32_t i = 0; i < h->n; i++) {
        uint32_t o;
        memcpy(&o, offs + 4 * (size_t)i, 4);
        dst[o] = vals[i];
    }
    return d->gpu ? wb_tx_mem_copy(base, x->bounce, h->len) : 0;
}

int ag_delta_apply(struct data *d, const struct local *locals, uint32_t nlocal,
                   const uint32_t *writer_rank, uint32_t nwriters)
{
    struct ag_delta *x = d->delta;
    if (!x || x->applied)
        return 0;
    slab_windows(d, false); /* every write is in: nothing may change the records now */
    uint64_t nrec = 0, nbytes = 0;
    for (uint32_t wi = 0; wi < nwriters; wi++) {
        uint32_t t = writer_rank[wi];
        if (t >= x->nslab)
            continue;
        const uint8_t *s = x->in + x->rslab_off[t];
        uint64_t at = 0, end = x->rslab_len[t];
        uint32_t last = 0;
        while (at + REC_HDR <= end) {
            struct wb_delta_rec h;
            memcpy(&h, s + at, REC_HDR);
            if (h.epoch != d->epoch)
                break;
            uint64_t size = (REC_HDR + 5 * (uint64_t)h.n + 7) / 8 * 8;
            const struct local *l = NULL;
            for (uint32_t k = 0; k < nlocal && !l; k++) {
                uint32_t j = (last + k) % nlocal;
                if (locals[j].desc.tensor == h.tensor) {
                    l = &locals[j];
                    last = j;
                }
            }
            const char *why = NULL;
            if (h.n > h.len || size > end - at)
                why = "runs past its slab";
            else if (!l || h.len > l->desc.bytes || h.dst_off > l->desc.bytes - h.len)
                why = "names bytes outside the tensors here";
            else if (!writes_tensor(x, t, h.tensor))
                why = "names a tensor that trainer does not write";
            const uint8_t *offs = s + at + REC_HDR, *vals = offs + 4 * (uint64_t)h.n;
            for (uint32_t i = 0; !why && i < h.n; i++) {
                uint32_t o, p = 0;
                memcpy(&o, offs + 4 * (size_t)i, 4);
                if (i)
                    memcpy(&p, offs + 4 * (size_t)(i - 1), 4);
                if (o >= h.len || (i && o <= p))
                    why = "has an offset out of order or past its write";
            }
            if (why) {
                snprintf(d->fail, sizeof(d->fail),
                         "rollout rank %u: delta record %" PRIu64 " of trainer rank %u (tensor %u, "
                         "bytes [%" PRIu64 ", +%" PRIu64 ")) %s",
                         d->rank, nrec, t, h.tensor, h.dst_off, h.len, why);
                return -EBADMSG;
            }
            int rc = store(d, l, &h, offs, vals);
            if (rc) {
                snprintf(d->fail, sizeof(d->fail),
                         "rollout rank %u: storing a delta of trainer rank %u: %s", d->rank, t,
                         wb_strerror(rc));
                return rc;
            }
            nrec++;
            nbytes += h.n;
            at += size;
        }
    }
    x->applied = true;
    if (nrec)
        wb_log(WB_LOG_DEBUG, M,
               "rollout rank %u: version %" PRIu64 ": %" PRIu64 " delta records stored, %" PRIu64
               " bytes changed",
               d->rank, d->version, nrec, nbytes);
    return 0;
}
