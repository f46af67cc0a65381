/* priv.h — private to agent/: the agent object shared by the control loop (agent.c) and the
 * data side (data.c: setup, peers, the trainer's executor and the rollout's counters). */
#ifndef WB_AGENT_PRIV_H
#define WB_AGENT_PRIV_H

#include "agent/agent.h"

struct data; /* data.c's state (plan, buffers, transport, executor) */

/* What the control loop learns from SETUP. */
struct agent_job {
    uint64_t gen, seed;
    char provider[64];
    char trace[1024];
    char name[128];
};

/* Data-side results the control loop turns into reports. */
struct data_done {
    bool ok;
    char err[512];
    struct wb_xfer_stats stats; /* trainers */
    uint64_t rx_bytes;          /* rollouts */
};

/* Setup: decode the plan bytes, allocate and register buffers, open the transport. On success
 * *addr and *regions are msgpack blobs owned by the data side (valid until the next setup). */
int ag_data_setup(struct data **d, const struct wb_agent_opts *o, const struct agent_job *job,
                  const void *plan, size_t plan_len, const void *shards, size_t shards_len,
                  const void **addr, size_t *addr_len, const void **regions, size_t *regions_len,
                  char *err, size_t errcap);
/* Trainer: the PEERS list (a msgpack array of [role, rank, addr, regions]). */
int ag_data_peers(struct data *d, const void *peers, size_t len, char *err, size_t errcap);
/* Starts transfer `version`, attempt `epoch` (trainers: regenerate synthetic weights, start
 * the executor; rollouts: start counting immediates for it). */
int ag_data_start(struct data *d, uint64_t version, uint64_t epoch, char *err, size_t errcap);
/* Makes progress without blocking; 1 when the transfer finished (*out filled), 0 when not. */
int ag_data_progress(struct data *d, struct data_done *out);
/* Drops the transfer in flight (ABORT). */
void ag_data_abort(struct data *d);
/* Polls the transport only (completions, immediates), without advancing a transfer. */
void ag_data_poll(struct data *d);
/* True when the data side has a transport that must be polled on every turn of the loop. */
bool ag_data_busy(const struct data *d);
/* Rollouts: writes every local tensor to DIR/rollout<rank>.v<version>.bin (for checks). */
int ag_data_dump(struct data *d, const char *dir, uint64_t version, char *err, size_t errcap);
void ag_data_free(struct data *d);

#endif /* WB_AGENT_PRIV_H */
