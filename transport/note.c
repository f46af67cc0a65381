/* note.c — what a destination counts, and why nothing else can count: a transfer attempt's
 * notes, their per-tag counters, and the checks every arrived note passes before it counts.
 *
 * A note is what follows a write (or travels alone) to say "this write's bytes are in place":
 * a fixed 80-byte message carrying the write's tag, a sequence number, the attempt's 64-bit
 * random epoch and version, the sender's and receiver's transport identities, the staged
 * range it commits (if any), and a SipHash-2-4 MAC of all that under the attempt's 128-bit key.
 * The key reaches an attempt's members over the control plane only, so a note is forged only
 * by a member of the attempt; a note of another attempt (an aborted one, a former member's, a
 * captured one) carries another epoch and is dropped; a note replayed within its attempt repeats
 * a (sender, tag, seq) already counted and is dropped. What was counted before an attempt began
 * is forgotten when it begins: counters, the replay set and pending reached expectations are
 * reset by wb_tx_attempt_begin(), so nothing received earlier can complete it.
 *
 * Arrivals are checked in this order, each refusal counted in the stats and logged at most
 * once a second: a known sender (the backend names the transport peer a note came from: the
 * provider's source address, the mailbox ring's owner), the wire form, the sender's and this
 * transport's identities, the epoch, the MAC, then the replay set. A note whose epoch is not
 * the current one and not one of the recent past ones may belong to an attempt this side has
 * not begun yet (the sender learnt of it first): it is kept in a bounded buffer and checked
 * again once an attempt begins. All state is bounded: the counter table and the replay set by
 * what the attempt declared (wb_tx_attempt.max_tags, max_notes), the buffer by a fixed size;
 * a note that finds no room is dropped and counted, never a reason to allocate more.
 *
 * Without any attempt begun (a fresh transport, for tools and tests), notes carry epoch 0 and
 * a MAC under the all-zero key and are counted by a destination that has not begun one either;
 * wb_tx_attempt_end() leaves that open mode for good. */
#include "transport/tx_priv.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum {
    NOTE_MAGIC = 0x4e57, /* "WN" */
    NOTE_VERSION = 1,
    PAST_EPOCHS = 8,
    EARLY_CAP = 16384,           /* notes kept for an attempt not begun here yet */
    DEFAULT_MAX_TAGS = 1 << 16,  /* counters per attempt when the attempt does not say */
    DEFAULT_MAX_NOTES = 1 << 20, /* replay-set entries per attempt likewise (32 MiB at most) */
    LOG_EVERY_NS = 1000 * 1000 * 1000,
};

/* The wire form, little-endian (every host weightbridge runs on). count: the immediates of
 * `tag` the note stands for (a batch of stores announced at once, 1 for a write). A note that
 * commits nothing ends at the MAC (56 bytes, within what tcp;ofi_rxm sends inline); one that
 * commits a staged range carries the range after it (80 bytes), and its MAC covers both. */
struct note_wire {
    uint16_t magic;
    uint8_t version, flags;
    uint32_t tag, seq, count;
    uint64_t epoch, xversion;
    uint64_t src, dst;
    uint64_t mac; /* SipHash-2-4 of the 48 bytes before it and, in a commit, the range */
    uint64_t region, off, len;
};
_Static_assert(sizeof(struct note_wire) == WB_TXN_WIRE, "a note is at most 80 bytes");
_Static_assert(offsetof(struct note_wire, region) == WB_TXN_SHORT, "a short note ends at its MAC");

struct imm_slot {
    uint32_t tag;
    bool used, armed;
    uint64_t count, target;
    wb_tx_imm_cb cb;
    void *arg;
};

struct imm_ready {
    uint32_t tag;
    wb_tx_imm_cb cb;
    void *arg;
};

struct seen_key { /* a counted note: (sender, tag, seq); src 0 marks an empty slot */
    uint64_t src;
    uint32_t tag, seq;
};

struct seq_slot { /* writer: the next seq of (peer, tag) */
    uint64_t key; /* peer << 32 | tag, + 1 (0: empty) */
    uint32_t next;
};

struct early { /* a note buffered for an attempt not begun here yet */
    uint8_t wire[WB_TXN_WIRE];
    uint32_t src;
};

struct wb_txn_state {
    /* the attempt */
    bool open_mode; /* no attempt ever begun: epoch 0, zero key */
    bool active;    /* an attempt is current */
    uint64_t epoch, version;
    uint8_t key[WB_MAC_KEY_BYTES];
    uint64_t past[PAST_EPOCHS];
    uint32_t npast;
    uint64_t max_tags, max_notes;
    /* counters */
    struct imm_slot *slots; /* open addressing, power-of-two size */
    size_t nslots, used;
    struct imm_ready *ready; /* reached, not yet delivered */
    size_t nready, ready_cap, narmed;
    /* the replay set of the current attempt */
    struct seen_key *seen;
    size_t nseen_slots, nseen;
    /* writer sequence numbers of the current attempt */
    struct seq_slot *seq;
    size_t nseq_slots, nseq;
    /* notes kept for an attempt not begun yet: a ring */
    struct early *early;
    size_t early_head, early_n;
    size_t replay_left; /* entries of the ring still to check against the current attempt */
    /* per peer, when its counted notes came (wb_tx_attempt.peer_times; NULL: not recorded) */
    struct wb_tx_peer_notes *pn;
    uint32_t npn;
    /* refusals, and their log */
    struct wb_tx_note_stats st;
    uint64_t log_t0;
    struct wb_tx_note_stats logged;
};

/* ---------------------------------------------------------------- lifetime */

int txi_notes_init(struct wb_txn_state **out)
{
    struct wb_txn_state *s = calloc(1, sizeof(*s));
    if (!s)
        return -ENOMEM;
    s->open_mode = true;
    s->active = true; /* the open mode's "attempt": epoch 0, zero key */
    s->max_tags = DEFAULT_MAX_TAGS;
    s->max_notes = DEFAULT_MAX_NOTES;
    *out = s;
    return 0;
}

void txi_notes_fini(struct wb_txn_state *s)
{
    if (!s)
        return;
    free(s->slots);
    free(s->ready);
    free(s->seen);
    free(s->seq);
    free(s->early);
    free(s->pn);
    free(s);
}

/* ---------------------------------------------------------------- hashing helpers */

static uint64_t mix64(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return x;
}

/* A zeroed table of n slots of `size` bytes. */
static void *table_new(size_t n, size_t size)
{
    return calloc(n, size);
}

/* ---------------------------------------------------------------- counters */

/* The slot of `tag`, created when `create` and the attempt's bound allows (NULL when absent,
 * out of room or out of memory). */
static struct imm_slot *imm_slot(struct wb_txn_state *c, uint32_t tag, bool create)
{
    if (create && c->used + 1 > c->max_tags)
        create = false; /* a lookup only: a new counter finds no room */
    if (create && (c->used + 1) * 2 > c->nslots) {
        size_t n = c->nslots ? 2 * c->nslots : 64;
        struct imm_slot *s = table_new(n, sizeof(*s));
        if (!s)
            return NULL;
        for (size_t i = 0; i < c->nslots; i++) {
            if (!c->slots[i].used)
                continue;
            size_t j = mix64(c->slots[i].tag) & (n - 1);
            while (s[j].used)
                j = (j + 1) & (n - 1);
            s[j] = c->slots[i];
        }
        free(c->slots);
        c->slots = s;
        c->nslots = n;
    }
    if (!c->nslots)
        return NULL;
    size_t j = mix64(tag) & (c->nslots - 1);
    while (c->slots[j].used) {
        if (c->slots[j].tag == tag)
            return &c->slots[j];
        j = (j + 1) & (c->nslots - 1);
    }
    if (!create)
        return NULL;
    c->slots[j] = (struct imm_slot){.tag = tag, .used = true};
    c->used++;
    return &c->slots[j];
}

/* Queues a reached expectation. wb_tx_expect() reserved its place (ready_cap >= nready +
 * narmed), so firing never allocates and a notification is never lost. */
static void imm_fire(struct wb_txn_state *c, struct imm_slot *s)
{
    c->narmed--;
    c->ready[c->nready++] = (struct imm_ready){.tag = s->tag, .cb = s->cb, .arg = s->arg};
    s->count -= s->target;
    s->armed = false;
}

void txi_imm_arrived(struct wb_tx *tx, uint32_t tag, uint32_t n)
{
    struct wb_txn_state *c = txi_notes(tx);
    struct imm_slot *s = imm_slot(c, tag, true);
    if (!s) {
        c->st.full++;
        return;
    }
    s->count += n;
    if (s->armed && s->count >= s->target)
        imm_fire(c, s);
}

int wb_tx_expect(struct wb_tx *tx, uint32_t tag, uint64_t n, wb_tx_imm_cb cb, void *arg)
{
    struct wb_txn_state *c = txi_notes(tx);
    struct imm_slot *s = imm_slot(c, tag, true);
    if (!s)
        return c->used + 1 > c->max_tags
                   ? txi_err(tx, -ENOSPC,
                             "expect: tag %u: the attempt's %" PRIu64 " counters are in use", tag,
                             c->max_tags)
                   : -ENOMEM;
    if (!s->armed && c->nready + c->narmed + 1 > c->ready_cap) {
        size_t cap = 2 * (c->nready + c->narmed + 1);
        struct imm_ready *rd = realloc(c->ready, cap * sizeof(*rd));
        if (!rd)
            return -ENOMEM;
        c->ready = rd;
        c->ready_cap = cap;
    }
    if (s->armed)
        return txi_err(tx, -EBUSY,
                       "expect: tag %u is already armed (%" PRIu64 " of %" PRIu64 " arrived)", tag,
                       s->count, s->target);
    s->armed = true;
    c->narmed++;
    s->target = n;
    s->cb = cb;
    s->arg = arg;
    if (s->count >= n)
        imm_fire(c, s);
    return 0;
}

uint64_t wb_tx_imm_count(const struct wb_tx *tx, uint32_t tag)
{
    struct imm_slot *s = imm_slot(txi_notes((struct wb_tx *)tx), tag, false);
    return s ? s->count : 0;
}

size_t txi_imm_drain(struct wb_tx *tx, struct wb_tx_event *ev, size_t max)
{
    struct wb_txn_state *c = txi_notes(tx);
    size_t n = 0, i = 0, snapshot = c->nready;
    uint64_t epoch = c->epoch;
    for (; i < snapshot; i++) {
        struct imm_ready it = c->ready[i];
        if (it.cb) {
            it.cb(it.arg, it.tag); /* may append to c->ready (handled next drain) */
            if (c->epoch != epoch) /* the callback began another attempt: the rest is gone */
                return n;
            continue;
        }
        if (n == max)
            break;
        ev[n++] = (struct wb_tx_event){.kind = WB_TX_EV_IMM, .tag = it.tag, .ctx = it.arg};
    }
    if (i) {
        memmove(c->ready, c->ready + i, (c->nready - i) * sizeof(*c->ready));
        c->nready -= i;
    }
    return n;
}

/* ---------------------------------------------------------------- attempts */

static void past_add(struct wb_txn_state *s, uint64_t epoch)
{
    if (!epoch)
        return;
    for (uint32_t i = 0; i < s->npast; i++)
        if (s->past[i] == epoch)
            return;
    if (s->npast == PAST_EPOCHS)
        memmove(s->past, s->past + 1, (PAST_EPOCHS - 1) * sizeof(*s->past));
    else
        s->npast++;
    s->past[s->npast - 1] = epoch;
}

static bool past_has(const struct wb_txn_state *s, uint64_t epoch)
{
    for (uint32_t i = 0; i < s->npast; i++)
        if (s->past[i] == epoch)
            return true;
    return false;
}

/* Forgets everything counted: counters, pending notifications, the replay set, sequence
 * numbers. */
static void reset_counts(struct wb_txn_state *s)
{
    free(s->slots);
    s->slots = NULL;
    s->nslots = s->used = 0;
    s->nready = s->narmed = 0;
    free(s->seen);
    s->seen = NULL;
    s->nseen_slots = s->nseen = 0;
    free(s->seq);
    s->seq = NULL;
    s->nseq_slots = s->nseq = 0;
}

int wb_tx_attempt_begin(struct wb_tx *tx, const struct wb_tx_attempt *a)
{
    struct wb_txn_state *s = txi_notes(tx);
    if (!a->epoch)
        return txi_err(tx, -EINVAL, "attempt: epoch 0 is not an attempt's");
    if (s->active && !s->open_mode && s->epoch == a->epoch)
        return txi_err(tx, -EALREADY, "attempt: epoch %016" PRIx64 " has begun already", a->epoch);
    if (s->active && !s->open_mode)
        past_add(s, s->epoch);
    reset_counts(s);
    s->open_mode = false;
    s->active = true;
    s->epoch = a->epoch;
    s->version = a->version;
    memcpy(s->key, a->key, sizeof(s->key));
    s->max_tags = a->max_tags ? a->max_tags : DEFAULT_MAX_TAGS;
    s->max_notes = a->max_notes ? a->max_notes : DEFAULT_MAX_NOTES;
    s->replay_left = s->early_n; /* checked against this attempt by the next polls */
    /* Arrival times per peer, for a side that traces: no memory for them costs the record,
     * never the attempt. */
    free(s->pn);
    s->npn = a->peer_times ? txi_npeers(tx) : 0;
    s->pn = s->npn ? calloc(s->npn, sizeof(*s->pn)) : NULL;
    if (!s->pn)
        s->npn = 0;
    return 0;
}

void wb_tx_attempt_end(struct wb_tx *tx)
{
    struct wb_txn_state *s = txi_notes(tx);
    if (s->active && !s->open_mode)
        past_add(s, s->epoch);
    reset_counts(s);
    s->open_mode = false;
    s->active = false;
    s->epoch = 0;
    memset(s->key, 0, sizeof(s->key));
    s->replay_left = 0;
}

uint64_t wb_tx_attempt_epoch(const struct wb_tx *tx)
{
    const struct wb_txn_state *s = txi_notes((struct wb_tx *)tx);
    return s->active ? s->epoch : 0;
}

/* ---------------------------------------------------------------- the wire */

static uint64_t note_mac(const uint8_t key[WB_MAC_KEY_BYTES], const struct note_wire *w)
{
    uint8_t m[offsetof(struct note_wire, mac) + 3 * sizeof(uint64_t)];
    size_t n = offsetof(struct note_wire, mac);
    memcpy(m, w, n);
    if (w->flags & (WB_TXN_COMMIT | WB_TXN_PROGRESS)) {
        memcpy(m + n, &w->region, 3 * sizeof(uint64_t));
        n += 3 * sizeof(uint64_t);
    }
    return wb_siphash(key, m, n);
}

/* The bytes of a note with these flags on the wire. */
static size_t note_len(unsigned flags)
{
    return flags & (WB_TXN_COMMIT | WB_TXN_PROGRESS) ? WB_TXN_WIRE : WB_TXN_SHORT;
}

/* The next seq of (peer, tag) in this attempt; UINT32_MAX when out of memory. */
static uint32_t seq_next(struct wb_txn_state *s, uint32_t peer, uint32_t tag)
{
    uint64_t key = ((uint64_t)peer << 32 | tag) + 1;
    if ((s->nseq + 1) * 2 > s->nseq_slots) {
        size_t n = s->nseq_slots ? 2 * s->nseq_slots : 64;
        struct seq_slot *t = table_new(n, sizeof(*t));
        if (!t)
            return UINT32_MAX;
        for (size_t i = 0; i < s->nseq_slots; i++) {
            if (!s->seq[i].key)
                continue;
            size_t j = mix64(s->seq[i].key) & (n - 1);
            while (t[j].key)
                j = (j + 1) & (n - 1);
            t[j] = s->seq[i];
        }
        free(s->seq);
        s->seq = t;
        s->nseq_slots = n;
    }
    size_t j = mix64(key) & (s->nseq_slots - 1);
    while (s->seq[j].key && s->seq[j].key != key)
        j = (j + 1) & (s->nseq_slots - 1);
    if (!s->seq[j].key) {
        s->seq[j].key = key;
        s->nseq++;
    }
    return s->seq[j].next++;
}

int txi_note_make(struct wb_tx *tx, uint32_t peer, uint16_t flags, uint32_t tag, uint32_t n,
                  uint64_t region, uint64_t off, uint64_t len, uint8_t out[WB_TXN_WIRE])
{
    struct wb_txn_state *s = txi_notes(tx);
    struct note_wire w = {.magic = NOTE_MAGIC,
                          .version = NOTE_VERSION,
                          .flags = (uint8_t)flags,
                          .tag = tag,
                          .count = flags & WB_TXN_COUNT ? n : 0,
                          .src = txi_uid(tx),
                          .dst = txi_peer_uid(tx, peer),
                          .region = region,
                          .off = off,
                          .len = len};
    if (!(flags & WB_TXN_WARMUP)) {
        if (!s->active)
            return txi_err(tx, -EPROTO,
                           "write: no transfer attempt has begun here, so its notes would "
                           "be counted by none");
        w.epoch = s->epoch;
        w.xversion = s->version;
        if (flags & WB_TXN_COUNT) {
            w.seq = seq_next(s, peer, tag);
            if (w.seq == UINT32_MAX)
                return -ENOMEM;
        }
        w.mac = note_mac(s->key, &w);
    }
    memcpy(out, &w, sizeof(w));
    return (int)note_len(flags);
}

/* ---------------------------------------------------------------- arrivals */

static const char *const why_names[] = {"from strangers", "stale", "forged or malformed",
                                        "replayed", "without room"};

/* One refusal counted; the log says what was refused, at most once a second. */
static int refuse(struct wb_tx *tx, uint64_t *counter)
{
    struct wb_txn_state *s = txi_notes(tx);
    (*counter)++;
    uint64_t now = wb_now_ns();
    if (s->log_t0 && now - s->log_t0 < LOG_EVERY_NS)
        return 0;
    s->log_t0 = now;
    uint64_t d[5] = {s->st.stranger - s->logged.stranger, s->st.stale - s->logged.stale,
                     s->st.forged - s->logged.forged, s->st.replayed - s->logged.replayed,
                     s->st.full - s->logged.full};
    char msg[256];
    size_t pos = 0;
    for (int i = 0; i < 5; i++)
        if (d[i])
            pos += (size_t)snprintf(msg + pos, sizeof(msg) - pos, "%s%" PRIu64 " %s",
                                    pos ? ", " : "", d[i], why_names[i]);
    s->logged = s->st;
    wb_log(WB_LOG_WARN, "transport", "notes dropped (not counted): %s", msg);
    return 0;
}

/* The replay set: true when (src, tag, seq) was counted before in this attempt (then nothing
 * changes); else it is added. -ENOSPC when the attempt's bound is reached, -ENOMEM. */
static int seen_add(struct wb_txn_state *s, uint64_t src, uint32_t tag, uint32_t seq, bool *dup)
{
    *dup = false;
    bool room = s->nseen + 1 <= s->max_notes; /* a duplicate is still found when full */
    if (room && (s->nseen + 1) * 2 > s->nseen_slots) {
        size_t n = s->nseen_slots ? 2 * s->nseen_slots : 256;
        struct seen_key *t = table_new(n, sizeof(*t));
        if (!t)
            return -ENOMEM;
        for (size_t i = 0; i < s->nseen_slots; i++) {
            const struct seen_key *k = &s->seen[i];
            if (!k->src)
                continue;
            size_t j = mix64(k->src ^ ((uint64_t)k->tag << 32 | k->seq)) & (n - 1);
            while (t[j].src)
                j = (j + 1) & (n - 1);
            t[j] = *k;
        }
        free(s->seen);
        s->seen = t;
        s->nseen_slots = n;
    }
    size_t j = mix64(src ^ ((uint64_t)tag << 32 | seq)) & (s->nseen_slots - 1);
    while (s->seen[j].src) {
        const struct seen_key *k = &s->seen[j];
        if (k->src == src && k->tag == tag && k->seq == seq) {
            *dup = true;
            return 0;
        }
        j = (j + 1) & (s->nseen_slots - 1);
    }
    if (!room)
        return -ENOSPC;
    s->seen[j] = (struct seen_key){src, tag, seq};
    s->nseen++;
    return 0;
}

/* Keeps a note for an attempt not begun here yet; the ring drops its oldest when full (a
 * flood from a peer cannot grow it; what it pushes out was of no current attempt either). */
/* Keeps a note of len bytes (a short one is kept zero-padded to WB_TXN_WIRE, which accept
 * takes as a short note again). */
static void early_keep(struct wb_tx *tx, const void *buf, size_t len, uint32_t src)
{
    struct wb_txn_state *s = txi_notes(tx);
    if (!s->early && !(s->early = calloc(EARLY_CAP, sizeof(*s->early)))) {
        refuse(tx, &s->st.full);
        return;
    }
    if (s->early_n == EARLY_CAP) {
        s->early_head = (s->early_head + 1) % EARLY_CAP;
        s->early_n--;
        if (s->replay_left > s->early_n)
            s->replay_left = s->early_n;
        refuse(tx, &s->st.stale);
    }
    struct early *e = &s->early[(s->early_head + s->early_n) % EARLY_CAP];
    memset(e->wire, 0, WB_TXN_WIRE);
    memcpy(e->wire, buf, len < WB_TXN_WIRE ? len : WB_TXN_WIRE);
    e->src = src;
    s->early_n++;
    s->st.early++;
}

int txi_note_early(struct wb_tx *tx, uint8_t wire[WB_TXN_WIRE], uint32_t *src)
{
    struct wb_txn_state *s = txi_notes(tx);
    while (s->replay_left) {
        struct early *e = &s->early[s->early_head];
        s->early_head = (s->early_head + 1) % EARLY_CAP;
        s->early_n--;
        s->replay_left--;
        struct note_wire w;
        memcpy(&w, e->wire, sizeof(w));
        if (s->active && w.epoch == s->epoch) {
            memcpy(wire, e->wire, WB_TXN_WIRE);
            *src = e->src;
            return 1;
        }
        if (past_has(s, w.epoch) || !s->active) {
            refuse(tx, &s->st.stale);
            continue;
        }
        /* still of no attempt seen here: kept for the next one */
        struct early *back = &s->early[(s->early_head + s->early_n) % EARLY_CAP];
        memmove(back, e, sizeof(*e));
        s->early_n++;
    }
    return 0;
}

int txi_note_accept(struct wb_tx *tx, const void *buf, size_t len, uint32_t src, struct wb_txn *out)
{
    struct wb_txn_state *s = txi_notes(tx);
    if (src == WB_TXN_NOBODY || src >= txi_npeers(tx))
        return refuse(tx, &s->st.stranger);
    struct note_wire w;
    if (len < WB_TXN_SHORT)
        return refuse(tx, &s->st.forged);
    memset(&w, 0, sizeof(w));
    memcpy(&w, buf, WB_TXN_SHORT);
    if (len != note_len(w.flags) && !(len == WB_TXN_WIRE && note_len(w.flags) == WB_TXN_SHORT))
        return refuse(tx, &s->st.forged); /* a mailbox slot is WB_TXN_WIRE, whatever the note */
    if (note_len(w.flags) == WB_TXN_WIRE)
        memcpy(&w, buf, sizeof(w));
    if (w.magic != NOTE_MAGIC || w.version != NOTE_VERSION ||
        (w.flags & ~(unsigned)(WB_TXN_COUNT | WB_TXN_COMMIT | WB_TXN_WARMUP | WB_TXN_PROGRESS)) ||
        ((w.flags & WB_TXN_PROGRESS) && (w.flags & ~(unsigned)WB_TXN_PROGRESS)) ||
        ((w.flags & WB_TXN_COUNT) && (w.count == 0 || w.count > WB_TXN_MAX_COUNT)))
        return refuse(tx, &s->st.forged);
    if (w.src != txi_peer_uid(tx, src) || w.dst != txi_uid(tx))
        return refuse(tx, &s->st.forged);
    if (w.flags & WB_TXN_WARMUP)
        return 0; /* a connection being made: nothing to count */
    if (!s->active || w.epoch != s->epoch) {
        if (!w.epoch || past_has(s, w.epoch))
            return refuse(tx, &s->st.stale);
        early_keep(tx, buf, len, src);
        return 0;
    }
    if (w.mac != note_mac(s->key, &w) || w.xversion != s->version)
        return refuse(tx, &s->st.forged);
    if (w.flags & WB_TXN_COUNT) {
        bool dup;
        int e = seen_add(s, w.src, w.tag, w.seq, &dup);
        if (e)
            return refuse(tx, &s->st.full);
        if (dup)
            return refuse(tx, &s->st.replayed);
    }
    s->st.accepted++;
    if ((w.flags & WB_TXN_COUNT) && src < s->npn) {
        struct wb_tx_peer_notes *p = &s->pn[src];
        uint64_t now = wb_now_ns();
        if (!p->imms)
            p->first_ns = now;
        p->last_ns = now;
        p->imms += w.count;
    }
    *out = (struct wb_txn){.flags = w.flags,
                           .tag = w.tag,
                           .seq = w.seq,
                           .count = w.count,
                           .region = w.region,
                           .off = w.off,
                           .len = w.len};
    return 1;
}

size_t txi_note_size(const void *buf, size_t len)
{
    struct note_wire w;
    if (len < WB_TXN_SHORT)
        return 0;
    memcpy(&w, buf, offsetof(struct note_wire, tag));
    size_t n = note_len(w.flags);
    return n <= len ? n : 0;
}

void txi_note_refuse(struct wb_tx *tx, enum wb_txn_refusal why)
{
    struct wb_txn_state *s = txi_notes(tx);
    uint64_t *c[] = {&s->st.stranger, &s->st.stale, &s->st.forged, &s->st.replayed, &s->st.full};
    refuse(tx, c[why]);
}

void wb_tx_note_stats(const struct wb_tx *tx, struct wb_tx_note_stats *out)
{
    *out = txi_notes((struct wb_tx *)tx)->st;
}

int wb_tx_peer_notes(const struct wb_tx *tx, uint32_t peer, struct wb_tx_peer_notes *out)
{
    const struct wb_txn_state *s = txi_notes((struct wb_tx *)tx);
    if (!s->pn)
        return -ENODATA;
    if (peer >= s->npn)
        return -EINVAL;
    *out = s->pn[peer];
    return 0;
}
