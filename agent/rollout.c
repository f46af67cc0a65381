/* rollout.c — a rollout's receive side: its local tensors (allocated, kept over a re-setup, or
 * the engine's own), their windows, the counters of an attempt's tags, the checksum inbox and
 * its checks, what landed of a version (so that a resumed attempt is sent only the rest), and
 * the dumps of its tensors. struct rollout (rollout.h) is this file's and the relay's
 * (relay.c); data.c reaches it through the ag_rollout_* calls (xfer.h), and reads nothing of
 * it. */
#include "agent/rollout.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *M = "agent";

/* A batch of checksum checks, for the trace: when, how many entries and bytes, the first
 * entries it held. */
struct rcheck {
    uint64_t t0, t1, bytes;
    uint32_t n;
    uint32_t ent[AG_TRACE_NAMES];
};

/* What a traced rollout records of an attempt (times are wb_now_ns(), 0: not this attempt):
 * when its windows opened and its writers were told, when each expect entry's writes (and
 * records) were all in, the checksum batches, and per writer its notes and the last batch
 * that checked one of its writes. Written as events once the attempt's report left. */
struct rtrace {
    uint64_t open_ns;
    uint64_t *in_ns;    /* [nexpect] */
    struct rcheck *chk; /* [nexpect]: a batch checks one entry at least */
    uint32_t nchk;
    uint32_t *local_label; /* [nlocal] */
    int32_t *widx;         /* trainer rank -> writer index (nwidx of them), -1 */
    uint32_t nwidx;
    uint32_t *w_chk;             /* [nwriters]: 1 + the last batch holding one of its records, 0 */
    struct wb_tx_peer_notes *wn; /* [nwriters], taken when the attempt finished here */
    bool have_wn;
};

static void trace_setup(struct data *d);

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* TRANSFER.skip's tags for this rank (sorted) hold tag. */
static bool skipped(const uint64_t *skip, uint32_t nskip, uint64_t tag)
{
    return nskip && bsearch(&tag, skip, nskip, sizeof(uint64_t), cmp_u64) != NULL;
}

/* A rollout tensor's window: opened for an attempt, closed once its writes are all in (or the
 * attempt ends). A backend that cannot close windows (CUDA IPC) leaves them open: keys and
 * the writers' own bounds checks are what it has. */
static void local_window(struct data *d, uint32_t k, bool open)
{
    struct local *l = &d->rx->locals[k];
    if (d->caps.windows && l->mr && l->desc.bytes)
        wb_tx_mr_window(d->tx, l->mr, open);
}

static void rollout_windows(struct data *d, bool open)
{
    for (uint32_t k = 0; d->caps.windows && k < d->rx->recv.nlocal; k++)
        local_window(d, k, open);
    if (d->caps.windows && d->rx->sum_in_mr)
        wb_tx_mr_window(d->tx, d->rx->sum_in_mr, open);
    ag_delta_window(d, open);
    d->rx->windows_open = open;
}

/* A rollout's attempt is over (done, failed, aborted, past its deadline): nothing more may
 * land, and nothing more counts. */
void ag_rollout_close(struct data *d)
{
    if (!d->tx || d->role != WB_ROLE_ROLLOUT || !d->rx)
        return;
    if (d->rx->windows_open)
        rollout_windows(d, false);
    ag_relay_stop(d);
    wb_tx_attempt_end(d->tx);
}

/* A tag's count was reached: its writes (or, with the sum bit, its checksum records) are all
 * in. An entry whose both are in waits in ready[] to be checked by ag_rollout_step(). */
static void on_data_imm(void *arg, uint32_t imm)
{
    struct data *d = arg;
    uint32_t tag = imm_tag_of(imm), sum = tag & IMM_SUM_BIT;
    tag &= ~IMM_SUM_BIT;
    if (imm_kind_of(imm) != IMM_DATA || !d->active)
        return;
    if (tag > d->rx->max_data_tag || d->rx->expect_of[tag] < 0)
        return;
    uint32_t i = (uint32_t)d->rx->expect_of[tag];
    uint8_t *flag = sum ? &d->rx->sum_reached[i] : &d->rx->reached[i];
    if (*flag || d->rx->landed[i])
        return;
    *flag = 1;
    if (d->rx->reached[i] && (d->rx->sum_reached[i] || !d->verify)) {
        d->rx->ready[d->rx->nready++] = i;
        if (d->rx->tr)
            d->rx->tr->in_ns[i] = wb_now_ns();
        /* every planned write of the entry is in: once the tensor's last entry is, its window
         * closes — before it is checked, so the check covers bytes nothing can change */
        uint32_t k = d->rx->expect_local[i];
        if (k != UINT32_MAX && d->rx->local_left[k] && --d->rx->local_left[k] == 0)
            local_window(d, k, false);
    }
}

/* A registering rollout: local i of the receive list is the engine's tensor of the i-th name
 * the controller sent; peers write it through a bounded view of its allocation's
 * registration. */
static int local_bind(struct data *d, struct local *l, struct wb_mpr *names, char *err,
                      size_t errcap)
{
    char name[WB_NAME_MAX], a[160], b[160];
    if (wb_mpr_str(names, name, sizeof(name))) {
        snprintf(err, errcap, "setup: the names of the local tensors are malformed");
        return -EBADMSG;
    }
    const struct reg *r = ag_regs_find(d->ep, name);
    if (!r || r->t.meta.dtype != l->desc.dtype || !wb_shape_eq(&r->t.meta.shape, &l->desc.shape) ||
        !wb_reg_contiguous(&r->t)) {
        snprintf(err, errcap, "%s: the plan's %s %s differs from the registered tensor", name,
                 wb_dtype_name(l->desc.dtype), wb_shape_str(&l->desc.shape, a, sizeof(a)));
        if (r)
            snprintf(err + strlen(err), errcap - strlen(err), " (%s %s)",
                     wb_dtype_name(r->t.meta.dtype), wb_shape_str(&r->t.meta.shape, b, sizeof(b)));
        return -EINVAL;
    }
    l->buf = r->ptr;
    if (!l->desc.bytes) /* nothing lands: a descriptor of size 0 (setup_rollout) */
        return 0;
    if (ag_seg_of(d->ep, l->buf, l->desc.bytes) < 0) {
        snprintf(err, errcap, "%s: no registered allocation holds it", name);
        return -EINVAL;
    }
    /* Its own registration, exactly its bytes: a key covers this tensor and nothing beside it
     * (an engine's allocator packs many tensors into one allocation). */
    int rc = wb_tx_mr_reg(d->tx, l->buf, l->desc.bytes, WB_TX_ACCESS_DST, &l->mr);
    if (rc)
        snprintf(err, errcap, "%s: cannot register its %" PRIu64 " bytes: %s", name, l->desc.bytes,
                 wb_tx_errmsg(d->tx));
    rc = rc ? rc : wb_tx_rdesc(d->tx, l->mr, &l->rd);
    if (rc && !*err)
        snprintf(err, errcap, "%s: cannot describe it for writers: %s", name, wb_strerror(rc));
    return rc;
}

/* Zero-byte tensors are described by a size-0 view of one small registration of their own,
 * whose window never opens. */
static int empty_desc(struct data *d, struct wb_tx_rdesc *out, char *err, size_t errcap)
{
    if (!d->rx->empty_mr) {
        d->rx->empty_buf = calloc(1, 64);
        int rc = d->rx->empty_buf
                     ? wb_tx_mr_reg(d->tx, d->rx->empty_buf, 64, WB_TX_ACCESS_DST, &d->rx->empty_mr)
                     : -ENOMEM;
        if (rc) {
            snprintf(err, errcap, "a descriptor for empty tensors: %s", wb_strerror(rc));
            return rc;
        }
        wb_tx_mr_window(d->tx, d->rx->empty_mr, false);
    }
    struct wb_tx_rdesc whole;
    int rc = wb_tx_rdesc(d->tx, d->rx->empty_mr, &whole);
    return rc ? rc : wb_tx_rdesc_view(&whole, 0, 0, out);
}

static int setup_rollout(struct data *d, const void *plan, size_t plan_len,
                         const struct wb_bytes *names, char *err, size_t errcap)
{
    int rc = wb_recv_list_decode(plan, plan_len, &d->rx->recv);
    if (rc) {
        snprintf(err, errcap, "receive list: %s", wb_strerror(rc));
        return rc;
    }
    d->rx->have_recv = true;
    uint32_t nl = d->rx->recv.nlocal, ne = d->rx->recv.nexpect;
    d->rx->locals = calloc(nl ? nl : 1, sizeof(*d->rx->locals));
    d->rx->lname = calloc(nl ? nl : 1, sizeof(*d->rx->lname));
    if (!d->rx->locals || !d->rx->lname)
        return -ENOMEM;
    struct wb_mpr nr;
    uint32_t nn = 0;
    wb_mpr_init(&nr, names->p, names->n);
    bool have_names = names->n && wb_mpr_array(&nr, WB_WIRE_MAX_ARRAY, &nn) == 0 && nn == nl;
    if (!d->synthetic && !have_names) {
        snprintf(err, errcap, "setup: %u local tensor names for %u local tensors", nn, nl);
        return -EBADMSG;
    }
    struct wb_mpw *w = &d->region_blob;
    wb_mpw_array(w, nl + (d->verify ? 1 : 0) + ag_delta_regions(d));
    for (uint32_t i = 0; i < nl; i++) {
        struct local *l = &d->rx->locals[i];
        char what[64];
        l->desc = d->rx->recv.local[i];
        if (d->synthetic) {
            snprintf(what, sizeof(what), "rollout tensor %u", l->desc.tensor);
            struct kept *k = NULL;
            for (uint32_t j = 0; j < d->rx->nkept && !k; j++)
                if (d->rx->kept[j].buf && d->rx->kept[j].tensor == l->desc.tensor &&
                    d->rx->kept[j].bytes == l->desc.bytes)
                    k = &d->rx->kept[j];
            if (k) { /* the same tensor as before the re-setup: its weights stay */
                l->buf = k->buf;
                k->buf = NULL;
                d->rx->nkept_taken++;
                l->owned = true;
                rc = wb_tx_mr_reg(d->tx, l->buf, l->desc.bytes ? l->desc.bytes : 1,
                                  WB_TX_ACCESS_DST, &l->mr);
                if (rc)
                    snprintf(err, errcap, "%s: cannot register %" PRIu64 " bytes: %s", what,
                             l->desc.bytes, wb_tx_errmsg(d->tx));
            } else {
                rc = ag_reg_alloc(d, l->desc.bytes ? l->desc.bytes : 1, WB_TX_ACCESS_DST, &l->buf,
                                  &l->mr, what, err, errcap);
                l->owned = rc == 0;
            }
            rc = rc ? rc : wb_tx_rdesc(d->tx, l->mr, &l->rd);
            rc = rc || l->desc.bytes ? rc : wb_tx_rdesc_view(&l->rd, 0, 0, &l->rd);
            if (!rc && have_names && wb_mpr_str(&nr, d->rx->lname[i], sizeof(d->rx->lname[i])))
                rc = -EBADMSG;
        } else {
            struct wb_mpr at = nr; /* local_bind reads the name; keep a copy for messages */
            rc = local_bind(d, l, &nr, err, errcap);
            rc = rc || l->desc.bytes ? rc : empty_desc(d, &l->rd, err, errcap);
            if (!rc)
                wb_mpr_str(&at, d->rx->lname[i], sizeof(d->rx->lname[i]));
        }
        if (rc)
            return rc;
        if (!d->rx->lname[i][0])
            snprintf(d->rx->lname[i], sizeof(d->rx->lname[i]), "rollout tensor %u", l->desc.tensor);
        d->rx->local_bytes += l->desc.bytes;
        wb_mpw_array(w, 2);
        wb_mpw_u64(w, l->desc.tensor);
        wb_tx_rdesc_put(w, &l->rd);
    }
    for (uint32_t i = 0; i < ne; i++)
        if (d->rx->recv.expect[i].tag > d->rx->max_data_tag)
            d->rx->max_data_tag = d->rx->recv.expect[i].tag;
    if (d->rx->max_data_tag >= IMM_SUM_BIT) {
        snprintf(err, errcap, "receive list: data tag %u does not fit the immediate's tag bits",
                 d->rx->max_data_tag);
        return -E2BIG;
    }
    d->rx->expect_of = malloc((d->rx->max_data_tag + 1) * sizeof(int32_t));
    d->rx->expect_local = calloc(ne ? ne : 1, sizeof(uint32_t));
    d->rx->local_left = calloc(nl ? nl : 1, sizeof(uint32_t));
    d->rx->reached = calloc(ne ? ne : 1, 1);
    d->rx->sum_reached = calloc(ne ? ne : 1, 1);
    d->rx->landed = calloc(ne ? ne : 1, 1);
    d->rx->ready = calloc(ne ? ne : 1, sizeof(uint32_t));
    d->rx->area = calloc(ne ? ne : 1, sizeof(uint64_t));
    if (!d->rx->expect_of || !d->rx->expect_local || !d->rx->reached || !d->rx->sum_reached ||
        !d->rx->landed || !d->rx->ready || !d->rx->area || !d->rx->local_left)
        return -ENOMEM;
    for (uint32_t i = 0; i <= d->rx->max_data_tag; i++)
        d->rx->expect_of[i] = -1;
    uint64_t slots = 0;
    for (uint32_t i = 0; i < ne; i++) {
        const struct wb_rt_expect *e = &d->rx->recv.expect[i];
        d->rx->expect_of[e->tag] = (int32_t)i;
        d->rx->expect_local[i] = UINT32_MAX;
        for (uint32_t k = 0; k < nl; k++)
            if (d->rx->locals[k].desc.tensor == e->tensor)
                d->rx->expect_local[i] = k;
        if (d->rx->expect_local[i] == UINT32_MAX && e->writes) {
            snprintf(err, errcap, "receive list: tag %u counts writes to tensor %u, not held here",
                     e->tag, e->tensor);
            return -EBADMSG;
        }
        d->rx->area[i] = slots;
        slots += e->writes;
    }
    /* the checksum inbox: a record per write, grouped by expect entry (the controller gives
     * every writer its slots in the same order) */
    if (d->verify) {
        d->rx->sum_in_bytes = (slots ? slots : 1) * WB_SUM_RECORD;
        rc = ag_reg_alloc(d, d->rx->sum_in_bytes, WB_TX_ACCESS_DST, &d->rx->sum_in,
                          &d->rx->sum_in_mr, "checksum inbox", err, errcap);
        if (!rc && d->gpu && (rc = ag_host_alloc(d->rx->sum_in_bytes, &d->rx->sum_in_host)) != 0)
            snprintf(err, errcap, "checksum inbox's host mirror: %s", wb_strerror(rc));
        struct wb_tx_rdesc rd;
        rc = rc ? rc : wb_tx_rdesc(d->tx, d->rx->sum_in_mr, &rd);
        if (rc)
            return rc;
        wb_mpw_array(w, 2);
        wb_mpw_u64(w, SUM_INBOX_ENTRY);
        wb_tx_rdesc_put(w, &rd);
    }
    if ((rc = ag_delta_rollout_setup(d, w, err, errcap)) != 0)
        return rc;
    rollout_windows(d, false); /* read-only to the network until an attempt opens them */
    trace_setup(d);
    return wb_mpw_finish(w);
}

/* ---------------------------------------------------------------- traces */

enum { TRACK_VERSION = 0, TRACK_LANDED, TRACK_CHECK, TRACK_WRITER0 = 100 };

static void rtrace_free(struct rtrace *tr)
{
    if (!tr)
        return;
    free(tr->in_ns);
    free(tr->chk);
    free(tr->local_label);
    free(tr->widx);
    free(tr->w_chk);
    free(tr->wn);
    free(tr);
}

/* The trace's tracks and a label per local tensor (its name and bytes), once per setup. No
 * memory for them: no trace, the transfer is unaffected. */
static void trace_setup(struct data *d)
{
    uint32_t nl = d->rx->recv.nlocal, ne = d->rx->recv.nexpect;
    if (!d->trace)
        return;
    struct rtrace *tr = calloc(1, sizeof(*tr));
    if (!tr || !(tr->in_ns = calloc(ne ? ne : 1, sizeof(uint64_t))) ||
        !(tr->chk = calloc(ne ? ne : 1, sizeof(*tr->chk))) ||
        !(tr->local_label = calloc(nl ? nl : 1, sizeof(uint32_t)))) {
        rtrace_free(tr);
        return;
    }
    ag_trace_track(d->trace, TRACK_VERSION, "version", "version");
    ag_trace_track(d->trace, TRACK_LANDED, "tensors landed", "landed");
    if (d->verify)
        ag_trace_track(d->trace, TRACK_CHECK, "checksums", "check");
    for (uint32_t k = 0; k < nl; k++) {
        char args[48];
        const char *name = d->rx->lname[k];
        snprintf(args, sizeof(args), "\"bytes\":%" PRIu64, d->rx->locals[k].desc.bytes);
        tr->local_label[k] = ag_trace_label(
            d->trace, false,
            &(struct ag_trace_label_in){.tensors = &name, .n = 1, .total = 1, .args = args});
    }
    d->rx->tr = tr;
}

/* Writers, once PEERS named them: a track each, and where their records are counted. */
static int trace_writers(struct data *d)
{
    struct rtrace *tr = d->rx->tr;
    if (!tr)
        return 0;
    uint32_t nw = d->rx->nwriters, nidx = 0;
    for (uint32_t i = 0; i < nw; i++)
        nidx = d->rx->writer_rank[i] >= nidx ? d->rx->writer_rank[i] + 1 : nidx;
    free(tr->widx);
    free(tr->w_chk);
    free(tr->wn);
    tr->nwidx = 0;
    tr->widx = malloc((nidx ? nidx : 1) * sizeof(int32_t));
    tr->w_chk = calloc(nw ? nw : 1, sizeof(uint32_t));
    tr->wn = calloc(nw ? nw : 1, sizeof(*tr->wn));
    if (!tr->widx || !tr->w_chk || !tr->wn) {
        d->rx->tr = NULL;
        rtrace_free(tr);
        return 0;
    }
    tr->nwidx = nidx;
    for (uint32_t r = 0; r < nidx; r++)
        tr->widx[r] = -1;
    for (uint32_t i = 0; i < nw; i++) {
        char name[48];
        tr->widx[d->rx->writer_rank[i]] = (int32_t)i;
        snprintf(name, sizeof(name), "trainer %u writes", d->rx->writer_rank[i]);
        ag_trace_track(d->trace, TRACK_WRITER0 + d->rx->writer_rank[i], name, "writes");
    }
    return 0;
}

void ag_rollout_trace_snap(struct data *d)
{
    struct rtrace *tr = d->rx ? d->rx->tr : NULL;
    if (!tr || !tr->wn)
        return;
    tr->have_wn = true;
    for (uint32_t i = 0; i < d->rx->nwriters && tr->have_wn; i++)
        tr->have_wn = wb_tx_peer_notes(d->tx, d->rx->writers[i], &tr->wn[i]) == 0;
}

/* The attempt that finished here, as events: the version (its start to the last tensor in and
 * checked, the hook after it), each tensor as it landed, each checksum batch, and per writer
 * its notes' first and last arrival and when the last of its writes was checked. */
void ag_rollout_trace(struct data *d)
{
    struct rtrace *tr = d->rx ? d->rx->tr : NULL;
    struct ag_trace *t = d->trace;
    if (!tr)
        return;
    char name[64], args[256];
    ag_trace_begin(t, d->version, d->epoch);
    snprintf(name, sizeof(name), "version %" PRIu64, d->version);
    snprintf(args, sizeof(args),
             "\"bytes\":%" PRIu64 ",\"tensors_landed\":%u,\"tensors_wanted\":%u,"
             "\"verify\":%s,\"outcome\":\"%s\"",
             d->rx->recv.recv_bytes, d->rx->nlanded, d->rx->nwant, d->verify ? "true" : "false",
             d->last_ok ? "complete" : "failed");
    struct ag_tev e = {.tid = TRACK_VERSION, .task = -1};
    e.label = ag_trace_label(t, true, &(struct ag_trace_label_in){.name = name, .args = args});
    e.t0 = d->start_ns;
    e.t1 = d->hook_t1 ? d->hook_t1 : d->end_ns;
    ag_trace_add(t, &e);
    if (tr->open_ns) {
        e.label = ag_trace_label(t, true,
                                 &(struct ag_trace_label_in){.name = "windows open, writers told"});
        e.t1 = tr->open_ns;
        ag_trace_add(t, &e);
    }
    if (d->hook_t1) {
        e.label = ag_trace_label(t, true, &(struct ag_trace_label_in){.name = "post-update hook"});
        e.t0 = d->hook_t0;
        e.t1 = d->hook_t1;
        ag_trace_add(t, &e);
    }
    for (uint32_t i = 0; i < d->rx->recv.nexpect; i++) {
        uint32_t k = d->rx->expect_local[i];
        if (!tr->in_ns[i] || k == UINT32_MAX)
            continue;
        ag_trace_add(t, &(struct ag_tev){.t0 = tr->in_ns[i],
                                         .t1 = tr->in_ns[i],
                                         .tid = TRACK_LANDED,
                                         .label = tr->local_label[k],
                                         .task = -1,
                                         .instant = true});
    }
    for (uint32_t b = 0; b < tr->nchk; b++) {
        const struct rcheck *c = &tr->chk[b];
        const char *names[AG_TRACE_NAMES];
        uint32_t n = c->n < AG_TRACE_NAMES ? c->n : AG_TRACE_NAMES;
        for (uint32_t j = 0; j < n; j++)
            names[j] = d->rx->lname[d->rx->expect_local[c->ent[j]]];
        snprintf(args, sizeof(args), "\"bytes\":%" PRIu64, c->bytes);
        e = (struct ag_tev){.t0 = c->t0, .t1 = c->t1, .tid = TRACK_CHECK, .task = -1};
        e.label = ag_trace_label(
            t, true,
            &(struct ag_trace_label_in){.tensors = names, .n = n, .total = c->n, .args = args});
        ag_trace_add(t, &e);
    }
    for (uint32_t i = 0; tr->have_wn && i < d->rx->nwriters; i++) {
        const struct wb_tx_peer_notes *w = &tr->wn[i];
        uint32_t rank = d->rx->writer_rank[i];
        e = (struct ag_tev){.tid = TRACK_WRITER0 + rank, .task = -1};
        if (w->imms) {
            snprintf(name, sizeof(name), "trainer %u", rank);
            snprintf(args, sizeof(args), "\"trainer\":%u,\"notes\":%" PRIu64, rank, w->imms);
            e.label =
                ag_trace_label(t, true, &(struct ag_trace_label_in){.name = name, .args = args});
            e.t0 = w->first_ns;
            e.t1 = w->last_ns;
            ag_trace_add(t, &e);
        }
        if (tr->w_chk[i] && tr->w_chk[i] <= tr->nchk) {
            snprintf(name, sizeof(name), "trainer %u checked", rank);
            snprintf(args, sizeof(args), "\"trainer\":%u", rank);
            e.label =
                ag_trace_label(t, true, &(struct ag_trace_label_in){.name = name, .args = args});
            e.t0 = e.t1 = tr->chk[tr->w_chk[i] - 1].t1;
            e.instant = true;
            ag_trace_add(t, &e);
            e.instant = false;
        }
    }
    ag_trace_end(t, d->last_ok, d->fail);
}

/* A rollout's PEERS: the trainers that write to it — the only senders whose notes it counts,
 * and the ones it tells "ready". */
int ag_rollout_peers(struct data *d, struct wb_mpr *r, uint32_t n, char *err, size_t errcap)
{
    ag_relay_forget_peers(d);
    free(d->rx->writers);
    free(d->rx->writer_rank);
    d->rx->nwriters = 0;
    d->rx->writers = calloc(n ? n : 1, sizeof(uint32_t));
    d->rx->writer_rank = calloc(n ? n : 1, sizeof(uint32_t));
    if (!d->rx->writers || !d->rx->writer_rank)
        return -ENOMEM;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t four;
        uint64_t role, rank;
        const void *addr, *reg;
        size_t alen, rlen;
        if (wb_mpr_array(r, 4, &four) || four != 4 || wb_mpr_u64(r, &role) ||
            wb_mpr_u64(r, &rank) || wb_mpr_bin(r, &addr, &alen, 1u << 20) ||
            wb_mpr_bin(r, &reg, &rlen, 1u << 30)) {
            snprintf(err, errcap, "peer list: malformed entry %u", i);
            return -EBADMSG;
        }
        if (role == WB_ROLE_ROLLOUT && alen && rank != d->rank) { /* a relay neighbour */
            struct wb_mpr ar, rr;
            wb_mpr_init(&ar, addr, alen);
            wb_mpr_init(&rr, reg, rlen);
            int rc = ag_relay_peer(d, rank, &ar, &rr, err, errcap);
            if (rc)
                return rc;
            continue;
        }
        if (role != WB_ROLE_TRAINER || !alen)
            continue;
        struct wb_mpr ar;
        uint32_t idx;
        wb_mpr_init(&ar, addr, alen);
        int rc = wb_tx_peer_add(d->tx, &ar, &idx);
        if (rc) {
            snprintf(err, errcap, "trainer rank %" PRIu64 ": transport address: %s", rank,
                     wb_tx_errmsg(d->tx));
            return rc;
        }
        d->rx->writer_rank[d->rx->nwriters] = (uint32_t)rank;
        d->rx->writers[d->rx->nwriters++] = idx;
        if ((rc = ag_delta_writer(d, (uint32_t)rank, reg, rlen)) != 0) {
            snprintf(err, errcap, "trainer rank %" PRIu64 ": malformed list of its tensors", rank);
            return rc;
        }
        if (wb_tx_connect(d->tx, idx, (void *)(uintptr_t)WARMUP_CTX) != 0)
            wb_log(WB_LOG_DEBUG, M, "rollout rank %u: warm-up to trainer rank %" PRIu64 ": %s",
                   d->rank, rank, wb_tx_errmsg(d->tx));
    }
    return trace_writers(d);
}

static int rollout_arm(struct data *d, uint64_t version, const uint64_t *skip, uint32_t nskip,
                       char *err, size_t errcap)
{
    uint32_t ne = d->rx->recv.nexpect;
    memset(d->rx->local_left, 0, (d->rx->recv.nlocal ? d->rx->recv.nlocal : 1) * sizeof(uint32_t));
    if (d->rx->landed_version != version) { /* what landed of another version is no use */
        memset(d->rx->landed, 0, ne ? ne : 1);
        d->rx->landed_version = version;
    }
    memset(d->rx->reached, 0, ne ? ne : 1);
    memset(d->rx->sum_reached, 0, ne ? ne : 1);
    d->rx->nready = d->rx->nlanded = d->rx->nwant = 0;
    if (d->rx->tr) { /* the trace holds this attempt only */
        struct rtrace *tr = d->rx->tr;
        memset(tr->in_ns, 0, (ne ? ne : 1) * sizeof(uint64_t));
        if (tr->w_chk)
            memset(tr->w_chk, 0, (d->rx->nwriters ? d->rx->nwriters : 1) * sizeof(uint32_t));
        tr->nchk = 0;
        tr->open_ns = 0;
        tr->have_wn = false;
    }
    for (uint32_t i = 0; i < ne; i++) {
        const struct wb_rt_expect *e = &d->rx->recv.expect[i];
        if (!e->writes) {
            d->rx->landed[i] = 1;
            continue;
        }
        if (skipped(skip, nskip, e->tag)) {
            if (!d->rx->landed[i]) { /* never complete with a piece missing */
                snprintf(err, errcap,
                         "told not to expect %s again, but it has not landed here in version "
                         "%" PRIu64,
                         d->rx->lname[d->rx->expect_local[i]], version);
                return -EINVAL;
            }
            continue;
        }
        d->rx->landed[i] = 0;
        d->rx->nwant++;
        if (d->rx->expect_local[i] != UINT32_MAX)
            d->rx->local_left[d->rx->expect_local[i]]++;
        int rc = wb_tx_expect(d->tx, imm_make(IMM_DATA, e->tag), e->writes, on_data_imm, d);
        if (!rc && d->verify)
            rc = wb_tx_expect(d->tx, imm_make(IMM_DATA, e->tag | IMM_SUM_BIT), e->writes,
                              on_data_imm, d);
        if (rc) {
            snprintf(err, errcap, "rollout rank %u: immediate counter of tag %u: %s", d->rank,
                     e->tag, wb_tx_errmsg(d->tx));
            return rc;
        }
    }
    return 0;
}

/* A rollout's part of an attempt's start, once its counters are armed: the windows of what it
 * will receive open, then every trainer that writes to it hears "ready" — none writes before. */
static int rollout_open(struct data *d, char *err, size_t errcap)
{
    for (uint32_t k = 0; d->caps.windows && k < d->rx->recv.nlocal; k++)
        if (d->rx->local_left[k])
            local_window(d, k, true);
    if (d->caps.windows && d->rx->sum_in_mr)
        wb_tx_mr_window(d->tx, d->rx->sum_in_mr, true);
    ag_delta_window(d, true);
    d->rx->windows_open = true;
    if (d->rx->parent_peer != UINT32_MAX) { /* relayed: the parent relay alone writes it */
        int rc = wb_tx_write_imm(d->tx, d->rx->parent_peer, imm_make(IMM_READY, d->rank),
                                 ag_relay_parent_ctx(d));
        if (rc) {
            snprintf(err, errcap, "rollout rank %u: telling its relay it is ready: %s", d->rank,
                     wb_tx_errmsg(d->tx));
            return rc;
        }
    }
    for (uint32_t i = 0; d->rx->parent_peer == UINT32_MAX && i < d->rx->nwriters; i++) {
        int rc = wb_tx_write_imm(d->tx, d->rx->writers[i], imm_make(IMM_READY, d->rank),
                                 (void *)(uintptr_t)(READY_CTX | i));
        if (rc) {
            snprintf(err, errcap, "rollout rank %u: telling a trainer it is ready: %s", d->rank,
                     wb_tx_errmsg(d->tx));
            return rc;
        }
    }
    if (d->rx->tr)
        d->rx->tr->open_ns = wb_now_ns();
    return 0;
}

void ag_rollout_event(struct data *d, const struct wb_tx_event *ev)
{
    uint64_t v = (uint64_t)(uintptr_t)ev->ctx;
    if (ev->kind == WB_TX_EV_WRITE &&
        ((v & ~0xffffffffull) == RELAY_CTX || (v & ~0xffffffffull) == RELAY_FWD_CTX)) {
        ag_relay_event(d, ev);
        return;
    }
    if (ev->kind != WB_TX_EV_WRITE || !ev->err || (v & ~0xffffffffull) != READY_CTX || !d->active ||
        d->fail[0] || !d->rx || (uint32_t)v >= d->rx->nwriters)
        return;
    snprintf(d->fail, sizeof(d->fail),
             "telling trainer rank %u it is ready failed (%s); it will not write",
             d->rx->writer_rank[(uint32_t)v],
             ev->err == -WB_E_PEER ? "the peer died or failed" : wb_strerror(ev->err));
}

bool ag_data_receiving(const struct data *d)
{
    return d->role == WB_ROLE_ROLLOUT && !d->empty && d->rx && d->active && d->rx->nwant > 0;
}

/* Rollouts: room for n records' pieces and sums. */
static int rsum_reserve(struct data *d, uint64_t n)
{
    if (n <= d->rx->rcap)
        return 0;
    struct wb_sum_piece *p = realloc(d->rx->rpiece, n * sizeof(*p));
    if (p)
        d->rx->rpiece = p;
    uint64_t *h = realloc(d->rx->rhash, n * sizeof(*h));
    if (h)
        d->rx->rhash = h;
    if (!p || !h)
        return -ENOMEM;
    d->rx->rcap = n;
    return 0;
}

/* Rollouts: the records of expect entries ent[0..ne) against what landed, in one batch: the
 * records read (GPU: one copy each into the inbox's pinned mirror, one wait), checked for
 * where they point, then the sums of every record's bytes — one kernel over the tensors' GPU
 * memory, or wb_sum64 on the host — compared. */
static int check_landed(struct data *d, const uint32_t *ent, uint32_t ne)
{
    uint64_t nrec = 0;
    for (uint32_t j = 0; j < ne; j++)
        nrec += d->rx->recv.expect[ent[j]].writes;
    int rc = rsum_reserve(d, nrec ? nrec : 1);
    const uint8_t *in = d->gpu ? d->rx->sum_in_host : d->rx->sum_in;
    for (uint32_t j = 0; !rc && d->gpu && j < ne; j++) {
        uint64_t at = d->rx->area[ent[j]] * WB_SUM_RECORD;
        rc = ag_copy_async((uint8_t *)d->rx->sum_in_host + at, (const uint8_t *)d->rx->sum_in + at,
                           d->rx->recv.expect[ent[j]].writes * WB_SUM_RECORD, d->stream);
    }
    rc = rc || !d->gpu ? rc : ag_stream_sync(d->stream);
    if (rc)
        return rc;
    uint64_t at = 0;
    for (uint32_t j = 0; j < ne; j++) {
        uint32_t i = ent[j];
        const struct wb_rt_expect *e = &d->rx->recv.expect[i];
        const struct local *l = &d->rx->locals[d->rx->expect_local[i]];
        const char *name = d->rx->lname[d->rx->expect_local[i]];
        const struct wb_sum_record *rec =
            (const struct wb_sum_record *)(in + d->rx->area[i] * WB_SUM_RECORD);
        uint64_t covered = 0;
        for (uint64_t k = 0; k < e->writes; k++) {
            const struct wb_sum_record *x = &rec[k];
            if (x->epoch != d->epoch || x->version != d->version ||
                x->mac != wb_siphash(d->key, x, WB_SUM_RECORD_MACED)) {
                snprintf(d->fail, sizeof(d->fail),
                         "%s: checksum record %" PRIu64 " is not this attempt's (epoch %016" PRIx64
                         ", version %" PRIu64 ", or its MAC does not match)",
                         name, k, x->epoch, x->version);
                return -EBADMSG;
            }
            if (x->tensor != e->tensor || x->len > l->desc.bytes ||
                x->dst_off > l->desc.bytes - x->len) {
                snprintf(d->fail, sizeof(d->fail),
                         "%s: checksum record %" PRIu64 " is malformed (tensor %u, bytes [%" PRIu64
                         ", +%" PRIu64 ") of %" PRIu64 ")",
                         name, k, x->tensor, x->dst_off, x->len, l->desc.bytes);
                return -EBADMSG;
            }
            d->rx->rpiece[at + k] =
                (struct wb_sum_piece){(const uint8_t *)l->buf + x->dst_off, x->len};
            covered += x->len;
        }
        if (covered != e->bytes) {
            snprintf(d->fail, sizeof(d->fail),
                     "%s: checksum records cover %" PRIu64 " of %" PRIu64 " bytes", name, covered,
                     e->bytes);
            return -EIO;
        }
        at += e->writes;
    }
    if (d->gpu) {
        rc = d->rx->rsum ? 0 : wb_sum_gpu_new(&d->rx->rsum);
        rc = rc ? rc : wb_sum_gpu_run(d->rx->rsum, d->rx->rpiece, nrec, d->stream, d->rx->rhash);
        if (rc) {
            snprintf(d->fail, sizeof(d->fail), "%s: checksums on the GPU: %s",
                     d->rx->lname[d->rx->expect_local[ent[0]]], wb_strerror(rc));
            return rc;
        }
    }
    at = 0;
    for (uint32_t j = 0; j < ne; j++) {
        uint32_t i = ent[j];
        const struct wb_sum_record *rec =
            (const struct wb_sum_record *)(in + d->rx->area[i] * WB_SUM_RECORD);
        for (uint64_t k = 0; k < d->rx->recv.expect[i].writes; k++, at++) {
            const struct wb_sum_record *x = &rec[k];
            uint64_t h = d->gpu ? d->rx->rhash[at] : wb_sum64(d->rx->rpiece[at].p, x->len);
            if (d->rx->tr && x->trainer < d->rx->tr->nwidx && d->rx->tr->widx[x->trainer] >= 0)
                d->rx->tr->w_chk[d->rx->tr->widx[x->trainer]] = d->rx->tr->nchk + 1;
            if (h != x->sum) {
                snprintf(
                    d->fail, sizeof(d->fail),
                    "%s: bytes [%" PRIu64 ", %" PRIu64
                    ") written by trainer rank %u do not match their checksum: sum64 %016" PRIx64
                    " landed, %016" PRIx64 " sent",
                    d->rx->lname[d->rx->expect_local[i]], x->dst_off, x->dst_off + x->len,
                    x->trainer, h, x->sum);
                return -EIO;
            }
        }
    }
    return 0;
}

/* Testing (--corrupt): the first byte of the named tensor flipped once it landed. */
static void corrupt(struct data *d, uint32_t i)
{
    const struct local *l = &d->rx->locals[d->rx->expect_local[i]];
    if (!d->o->corrupt || d->rx->corrupted || !l->desc.bytes ||
        strcmp(d->rx->lname[d->rx->expect_local[i]], d->o->corrupt) != 0)
        return;
    uint8_t b;
    if (wb_tx_mem_copy(&b, l->buf, 1) == 0) {
        b ^= 0x01;
        wb_tx_mem_copy(l->buf, &b, 1);
    }
    d->rx->corrupted = true;
}

/* Rollouts: the entries whose writes (and records) are all in, checked and marked landed.
 * Nothing to check (no verify): every ready entry at once — one per turn of the loop cost a
 * 680-tensor rollout 1.4 ms after its last byte. Checked on the host: one per turn, so that
 * heartbeats go on between the checks of large tensors; on a GPU: every ready entry up to
 * 4 GiB of them per turn (a kernel hashes that in milliseconds), so that the waits of a batch
 * are paid once, not per tensor. */
static void step_landed(struct data *d);

void ag_rollout_step(struct data *d)
{
    step_landed(d);
    if (!d->fail[0])
        ag_relay_step(d);
}

static void step_landed(struct data *d)
{
    if (!d->rx->nready || d->fail[0])
        return;
    /* a delta job: nothing is checked or counted before this attempt's deltas are stored,
     * which is once every write is in (a record lands before the note that counts it) */
    if (d->delta && d->rx->nready + d->rx->nlanded < d->rx->nwant)
        return;
    if (ag_delta_apply(d, d->rx->locals, d->rx->recv.nlocal, d->rx->writer_rank, d->rx->nwriters))
        return;
    uint32_t n = d->verify ? 0 : d->rx->nready;
    uint64_t bytes = 0;
    while (n < d->rx->nready && (n == 0 || (d->gpu && bytes < (4ull << 30))))
        bytes += d->rx->recv.expect[d->rx->ready[d->rx->nready - 1 - n++]].bytes;
    d->rx->nready -= n;
    const uint32_t *ent = &d->rx->ready[d->rx->nready];
    for (uint32_t j = 0; j < n; j++)
        corrupt(d, ent[j]);
    uint64_t t0 = d->verify && d->rx->tr ? wb_now_ns() : 0;
    if (d->verify && check_landed(d, ent, n)) {
        if (!d->fail[0])
            snprintf(d->fail, sizeof(d->fail), "%s: cannot check it",
                     d->rx->lname[d->rx->expect_local[ent[0]]]);
        return;
    }
    if (t0 && d->rx->tr->nchk < d->rx->recv.nexpect) {
        struct rcheck *c = &d->rx->tr->chk[d->rx->tr->nchk++];
        *c = (struct rcheck){.t0 = t0, .t1 = wb_now_ns(), .bytes = bytes, .n = n};
        for (uint32_t j = 0; j < n && j < AG_TRACE_NAMES; j++)
            c->ent[j] = ent[j];
    }
    for (uint32_t j = 0; j < n; j++) {
        d->rx->landed[ent[j]] = 1;
        d->rx->nlanded++;
        ag_relay_landed(d, ent[j]);
    }
}

int ag_data_landed(const struct data *d, uint64_t version, struct wb_mpw *w)
{
    uint32_t n = 0;
    bool mine =
        d->role == WB_ROLE_ROLLOUT && !d->empty && d->rx && d->rx->landed_version == version;
    for (uint32_t i = 0; mine && i < d->rx->recv.nexpect; i++)
        n += d->rx->landed[i] && d->rx->recv.expect[i].writes;
    wb_mpw_array(w, n);
    for (uint32_t i = 0; mine && i < d->rx->recv.nexpect; i++)
        if (d->rx->landed[i] && d->rx->recv.expect[i].writes)
            wb_mpw_u64(w, d->rx->recv.expect[i].tag);
    return wb_mpw_finish(w);
}

/* ---------------------------------------------------------------- rollout dumps */

int ag_data_dump(struct data *d, const char *dir, uint64_t version, char *err, size_t errcap)
{
    if (d->role != WB_ROLE_ROLLOUT || d->empty || !d->rx)
        return 0;
    if (d->gpu && ag_gpu_use(d->device)) { /* whichever thread calls */
        snprintf(err, errcap, "GPU %d: cannot use it to read the rollout's tensors", d->device);
        return -WB_E_CUDA;
    }
    char path[1200], tmp[1300];
    snprintf(path, sizeof(path), "%s/rollout%u.v%" PRIu64 ".bin", dir, d->rank, version);
    snprintf(tmp, sizeof(tmp), "%s.tmp%d", path, (int)getpid());
    /* created, never opened through a link planted at its name */
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    FILE *f = fd < 0 ? NULL : fdopen(fd, "wb");
    if (!f) {
        if (fd >= 0)
            close(fd);
        snprintf(err, errcap, "%s: cannot create", tmp);
        return -errno;
    }
    int rc = 0;
    const char *what = "writing it";
    uint8_t *host = NULL;
    fwrite("WBDUMP1\n", 1, 8, f);
    uint32_t n = d->rx->recv.nlocal;
    fwrite(&n, sizeof(n), 1, f);
    for (uint32_t i = 0; !rc && i < n; i++) {
        const struct local *l = &d->rx->locals[i];
        uint64_t b = l->desc.bytes;
        fwrite(&l->desc.tensor, sizeof(uint32_t), 1, f);
        fwrite(&b, sizeof(b), 1, f);
        const void *src = l->buf;
        if (d->gpu) {
            free(host);
            host = malloc(b ? b : 1);
            rc = host ? wb_tx_mem_copy(host, l->buf, b) : -ENOMEM;
            src = host;
            if (rc)
                what = "copying a tensor out of GPU memory";
        }
        if (!rc && fwrite(src, 1, b, f) != b)
            rc = -EIO;
    }
    free(host);
    if (fclose(f) || rc || rename(tmp, path)) {
        snprintf(err, errcap, "%s: cannot write the rollout's tensors (%s: %s)", path, what,
                 wb_strerror(rc ? rc : -EIO));
        unlink(tmp);
        return rc ? rc : -EIO;
    }
    return 0;
}

/* ---------------------------------------------------------------- what data.c asks */

int ag_rollout_start(struct data *d, uint64_t version, const uint64_t *skip, uint32_t nskip,
                     const struct wb_bytes *relay, char *err, size_t errcap)
{
    int rc = rollout_arm(d, version, skip, nskip, err, errcap);
    rc = rc ? rc : ag_relay_start(d, relay, &d->rx->parent_peer, err, errcap);
    return rc ? rc : rollout_open(d, err, errcap);
}

bool ag_rollout_windows_open(const struct data *d)
{
    return d->rx && d->rx->windows_open;
}

bool ag_rollout_complete(const struct data *d)
{
    return d->rx->nlanded >= d->rx->nwant && ag_relay_done(d);
}

uint64_t ag_rollout_rx_bytes(const struct data *d)
{
    return d->rx->recv.recv_bytes;
}

void ag_rollout_size(const struct data *d, uint32_t *nlocal, uint64_t *bytes)
{
    *nlocal = d->rx ? d->rx->recv.nlocal : 0;
    *bytes = d->rx ? d->rx->local_bytes : 0;
}

void ag_rollout_bounds(const struct data *d, uint64_t *tags, uint64_t *notes)
{
    ag_relay_bounds(d, tags, notes);
    for (uint32_t i = 0; i < d->rx->recv.nexpect; i++) {
        *tags += d->verify ? 2 : 1;
        *notes += d->rx->recv.expect[i].writes * (d->verify ? 2 : 1);
    }
}

void ag_rollout_carry_out(struct data *old, struct rollout_carry *c)
{
    memset(c, 0, sizeof(*c));
    c->kind = WB_TX_MEM_HOST;
    c->device = -1;
    struct rollout *r = old && old->role == WB_ROLE_ROLLOUT ? old->rx : NULL;
    if (!r || !r->have_recv)
        return;
    /* A synthetic rollout's tensors are carried over: the new setup takes those it holds
     * again (same tensor, same size), so a re-setup keeps the weights. */
    if (old->synthetic &&
        (c->kept = calloc(r->recv.nlocal ? r->recv.nlocal : 1, sizeof(*c->kept))) != NULL) {
        c->kind = ag_mem_kind(old);
        c->device = old->device;
        for (uint32_t i = 0; i < r->recv.nlocal; i++)
            if (r->locals[i].owned) {
                c->kept[c->nkept++] = (struct kept){r->locals[i].desc.tensor,
                                                    r->locals[i].desc.bytes, r->locals[i].buf};
                r->locals[i].owned = false;
            }
    }
    /* What landed of a failed version stays known across the re-setup (the tensors, and so
     * their bytes, stay): a resumed attempt does not send it again. By tag. */
    if (r->landed_version &&
        (c->tags = calloc(r->recv.nexpect ? r->recv.nexpect : 1, sizeof(uint64_t)))) {
        c->landed_version = r->landed_version;
        for (uint32_t i = 0; i < r->recv.nexpect; i++)
            if (r->landed[i] && r->recv.expect[i].writes)
                c->tags[c->ntags++] = r->recv.expect[i].tag;
    }
}

int ag_rollout_setup(struct data *d, const void *plan, size_t plan_len,
                     const struct wb_bytes *names, struct rollout_carry *c, char *err,
                     size_t errcap)
{
    d->rx = calloc(1, sizeof(*d->rx));
    if (!d->rx)
        return -ENOMEM;
    d->rx->parent_peer = UINT32_MAX;
    bool same_kind = ag_mem_kind(d) == c->kind && d->device == c->device;
    d->rx->kept = same_kind ? c->kept : NULL;
    d->rx->nkept = same_kind ? c->nkept : 0;
    int rc = setup_rollout(d, plan, plan_len, names, err, errcap);
    c->taken = d->rx->nkept_taken;
    d->rx->kept = NULL;
    d->rx->nkept = 0;
    return rc;
}

void ag_rollout_carry_end(struct data *d, int rc, bool resetup, struct rollout_carry *c,
                          const char **lost)
{
    uint32_t taken = c->taken;
    for (uint32_t i = 0; i < c->nkept; i++) /* what the new setup did not take */
        if (c->kept[i].buf)
            wb_tx_mem_free(c->kind, c->kept[i].buf);
    free(c->kept);
    struct rollout *r = d && !rc && d->role == WB_ROLE_ROLLOUT && !d->empty ? d->rx : NULL;
    /* an engine's tensors are its own (never replaced); a synthetic rollout's were kept */
    bool same_memory = r && (!d->synthetic || (c->nkept && taken == r->recv.nlocal));
    if (same_memory && c->ntags) {
        r->landed_version = c->landed_version;
        for (uint32_t i = 0; i < r->recv.nexpect; i++)
            for (uint32_t k = 0; k < c->ntags; k++)
                if (c->tags[k] == r->recv.expect[i].tag)
                    r->landed[i] = 1;
    }
    free(c->tags);
    uint32_t nlocal = d && d->rx ? d->rx->recv.nlocal : 0;
    if (resetup && c->nkept && (rc || taken < c->nkept || taken < nlocal))
        *lost =
            rc ? "its re-setup failed, releasing its tensors" : "a re-setup replaced its tensors";
    else if (!rc && c->nkept)
        wb_log(WB_LOG_INFO, M, "rollout rank %u: re-setup kept its %u tensors and their weights",
               d->rank, taken);
    memset(c, 0, sizeof(*c));
}

void ag_rollout_free(struct data *d)
{
    struct rollout *r = d->rx;
    if (!r)
        return;
    enum wb_tx_mem k = ag_mem_kind(d);
    rtrace_free(r->tr);
    ag_relay_free(r->relay);
    wb_sum_gpu_free(r->rsum);
    ag_host_free(r->sum_in_host);
    free(r->rpiece);
    free(r->rhash);
    wb_tx_mem_free(k, r->sum_in);
    free(r->lname);
    free(r->expect_local);
    free(r->local_left);
    free(r->writers);
    free(r->writer_rank);
    free(r->sum_reached);
    free(r->landed);
    free(r->ready);
    free(r->area);
    for (uint32_t i = 0; r->locals && i < r->recv.nlocal; i++)
        if (r->locals[i].owned)
            wb_tx_mem_free(k, r->locals[i].buf);
    free(r->empty_buf);
    free(r->locals);
    free(r->expect_of);
    free(r->reached);
    if (r->have_recv)
        wb_recv_list_free(&r->recv);
    free(r);
    d->rx = NULL;
}
