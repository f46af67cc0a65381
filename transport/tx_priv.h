/* tx_priv.h — what transport.c offers the backends (never included outside transport/): the
 * shared core (peer table, immediate counters, error text, liveness of same-host peers) and the
 * backends' open functions for the registry. */
#ifndef WB_TX_PRIV_H
#define WB_TX_PRIV_H

#include "transport/transport.h"

/* Backend open functions named by the registry in transport.c. */
int wb_txi_fabric_open(const struct wb_tx_cfg *cfg, struct wb_errlist *el, struct wb_tx **out);
int wb_txi_cudaipc_open(const struct wb_tx_cfg *cfg, struct wb_errlist *el, struct wb_tx **out);

/* Sets tx->ops and allocates tx->core for backend b. -ENOMEM. */
int wb_txi_core_init(struct wb_tx *tx, const struct wb_tx_ops *ops, enum wb_tx_backend b);
/* Frees tx->core (NULL-safe, idempotent). */
void wb_txi_core_fini(struct wb_tx *tx);

/* Records the explanation returned by wb_tx_errmsg(); returns err for `return wb_txi_err(...)`.
 * Also logged at debug level. */
int wb_txi_err(struct wb_tx *tx, int err, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

uint64_t wb_txi_uid(const struct wb_tx *tx);
/* A fresh registration id (never 0, never reused). */
uint64_t wb_txi_next_mr_id(struct wb_tx *tx);
uint32_t wb_txi_npeers(const struct wb_tx *tx);
/* 1 when the peer runs on this host (same boot and pid namespace), else 0. */
int wb_txi_peer_local(const struct wb_tx *tx, uint32_t peer);
/* For a local peer: 1 while its process lives (same pid and start time, not a zombie), 0 once
 * it is gone. For a remote peer: always 1 (the provider reports those failures). */
int wb_txi_peer_alive(const struct wb_tx *tx, uint32_t peer);
/* The pid a peer announced (for messages). */
int64_t wb_txi_peer_pid(const struct wb_tx *tx, uint32_t peer);

/* Start time of a process in clock ticks since boot (field 22 of /proc/<pid>/stat) and whether
 * it is a zombie. 0, or -ESRCH when there is no such process. */
int wb_txi_proc_stat(int64_t pid, uint64_t *start, bool *zombie);

/* Counts one arrived immediate of `tag`; a reached expectation is queued for the next drain. */
void wb_txi_imm_arrived(struct wb_tx *tx, uint32_t tag);
/* Delivers queued reached expectations: calls callbacks, writes events for the others into
 * ev[0..max). Returns the number of events written. Backends call it at the end of poll. */
size_t wb_txi_imm_drain(struct wb_tx *tx, struct wb_tx_event *ev, size_t max);

#endif /* WB_TX_PRIV_H */
