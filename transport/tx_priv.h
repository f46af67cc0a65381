/* tx_priv.h — what transport.c offers the backends (never included outside transport/): the
 * shared core (peer table, immediate counters, error text, liveness of same-host peers) and the
 * backends' open functions for the registry. */
#ifndef WB_TX_PRIV_H
#define WB_TX_PRIV_H

#include "transport/transport.h"

/* Backend open functions named by the registry in transport.c. */
int txi_fabric_open(const struct wb_tx_cfg *cfg, struct wb_errlist *el, struct wb_tx **out);
int txi_cudaipc_open(const struct wb_tx_cfg *cfg, struct wb_errlist *el, struct wb_tx **out);

/* Sets tx->ops and allocates tx->core for backend b. -ENOMEM. */
int txi_core_init(struct wb_tx *tx, const struct wb_tx_ops *ops, enum wb_tx_backend b);
/* Frees tx->core (NULL-safe, idempotent). */
void txi_core_fini(struct wb_tx *tx);

/* Records the explanation returned by wb_tx_errmsg(); returns err for `return txi_err(...)`.
 * Also logged at debug level. */
int txi_err(struct wb_tx *tx, int err, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

uint64_t txi_uid(const struct wb_tx *tx);
/* A fresh registration id (never 0, never reused). */
uint64_t txi_next_mr_id(struct wb_tx *tx);
uint32_t txi_npeers(const struct wb_tx *tx);
/* 1 when the peer runs on this host (same boot and pid namespace), else 0. */
int txi_peer_local(const struct wb_tx *tx, uint32_t peer);
/* For a local peer: 1 while its process lives (same pid and start time, not a zombie), 0 once
 * it is gone. For a remote peer: always 1 (the provider reports those failures). */
int txi_peer_alive(const struct wb_tx *tx, uint32_t peer);
/* The pid a peer announced (for messages). */
int64_t txi_peer_pid(const struct wb_tx *tx, uint32_t peer);

/* Start time of a process in clock ticks since boot (field 22 of /proc/<pid>/stat) and whether
 * it is a zombie. 0, or -ESRCH when there is no such process. */
int txi_proc_stat(int64_t pid, uint64_t *start, bool *zombie);

/* The uid a peer announced. */
uint64_t txi_peer_uid(const struct wb_tx *tx, uint32_t peer);

/* ---------------------------------------------------------------- notes (note.c) */

enum { WB_TXN_MAX_COUNT = 1 << 24 };          /* immediates one note may stand for */
enum { WB_TXN_WIRE = 80, WB_TXN_SHORT = 56 }; /* bytes of a note on the wire */
enum { WB_TXN_NOBODY = 0xffffffffu };         /* a note's sender is no peer of this transport */
/* note flags: COUNT n immediates of tag; COMMIT: copy the staged range first; WARMUP: nothing;
 * PROGRESS: the range (of a write with immediate tag) is placed, nothing counts */
enum { WB_TXN_COUNT = 1, WB_TXN_COMMIT = 2, WB_TXN_WARMUP = 4, WB_TXN_PROGRESS = 8 };

/* An accepted note: count `tag` (COUNT) and/or copy a staged range first (COMMIT). */
struct wb_txn {
    uint16_t flags;
    uint32_t tag, seq;
    uint32_t count; /* COUNT: the immediates of tag it stands for */
    uint64_t region, off, len;
};

enum wb_txn_refusal { WB_TXN_STRANGER, WB_TXN_STALE, WB_TXN_FORGED, WB_TXN_REPLAYED, WB_TXN_FULL };

struct wb_txn_state;
int txi_notes_init(struct wb_txn_state **out);
void txi_notes_fini(struct wb_txn_state *s);
/* The core's note state. */
struct wb_txn_state *txi_notes(struct wb_tx *tx);

/* Writer: a note to `peer` into out[] — flags WB_TXN_COUNT (n immediates of tag counted there),
 * WB_TXN_COMMIT (the staged range region/off/len copied there first) or WB_TXN_WARMUP (nothing) —
 * stamped with the current attempt and its next sequence number for (peer, tag), and its MAC. Call
 * it when the write is queued, so that a write finishing after another attempt began still carries
 * its own. Returns the note's length on the wire (WB_TXN_SHORT, or WB_TXN_WIRE for a commit),
 * -EPROTO when no attempt is current (warm-ups excepted), -ENOMEM. */
int txi_note_make(struct wb_tx *tx, uint32_t peer, uint16_t flags, uint32_t tag, uint32_t n,
                  uint64_t region, uint64_t off, uint64_t len, uint8_t out[WB_TXN_WIRE]);
/* Receiver: checks a note from peer `src` (WB_TXN_NOBODY when the sender is no peer). 1: act
 * on *out now (copy its staged range, then count its tag); 0: dropped (counted in the stats),
 * a warm-up, or kept for an attempt not begun here yet. */
int txi_note_accept(struct wb_tx *tx, const void *buf, size_t len, uint32_t src,
                    struct wb_txn *out);
/* Receiver: the length of the note at the head of buf, by its flags (WB_TXN_SHORT, or
 * WB_TXN_WIRE for a commit), or 0 when fewer bytes than that remain. A backend that sends
 * several notes in one message walks it with this; each note is then checked on its own. */
size_t txi_note_size(const void *buf, size_t len);
/* Receiver: the next kept note that belongs to the attempt just begun (1, into wire and *src,
 * to be passed to txi_note_accept again), 0 when none is left. Backends call it in poll. */
int txi_note_early(struct wb_tx *tx, uint8_t wire[WB_TXN_WIRE], uint32_t *src);
/* Counts a refusal the backend made itself (a provider write carrying CQ data, a commit for a
 * closed or unknown region). */
void txi_note_refuse(struct wb_tx *tx, enum wb_txn_refusal why);

/* An accepted progress note: the hook (wb_tx_on_progress) hears of it. */
void txi_progress(struct wb_tx *tx, uint32_t tag, uint64_t region, uint64_t off, uint64_t len);

/* Counts n accepted immediates of `tag`; a reached expectation is queued for the next drain.
 * A tag without a counter where the attempt has no room for another is dropped (stats). */
void txi_imm_arrived(struct wb_tx *tx, uint32_t tag, uint32_t n);
/* Delivers queued reached expectations: calls callbacks, writes events for the others into
 * ev[0..max). Returns the number of events written. Backends call it at the end of poll. */
size_t txi_imm_drain(struct wb_tx *tx, struct wb_tx_event *ev, size_t max);

#endif /* WB_TX_PRIV_H */
