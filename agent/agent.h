/* agent.h — the one public header of agent/: the worker process that runs on every trainer and
 * rollout GPU. It registers with the controller, receives its part of the plan once, and on
 * every "transfer N" executes it (trainers) or counts what lands (rollouts).
 *
 * Also here: the launcher-environment rank discovery (torchrun, Slurm). The synthetic parameter
 * source the agent fills trainer shards from is common's (wb_synth_fill()).
 */
#ifndef WB_AGENT_H
#define WB_AGENT_H

#include "common/common.h"
#include "proto/proto.h"

/* ================================================================ launcher environment */

struct wb_launch_env {
    int64_t rank;       /* global rank, -1 when unknown */
    int64_t local_rank; /* GPU index on this host, -1 when unknown */
    int64_t world;      /* -1 when unknown */
    const char *source; /* "torchrun", "slurm" or "none" */
};

/* Reads torchrun's RANK / LOCAL_RANK / WORLD_SIZE, else Slurm's SLURM_PROCID / SLURM_LOCALID /
 * SLURM_NTASKS. A variable that is set but not a non-negative integer is -EINVAL, with the
 * variable's name in *bad. */
int wb_launch_env_read(struct wb_launch_env *out, const char **bad);

/* ================================================================ the agent */

struct wb_agent_opts {
    enum wb_role role;
    uint32_t rank;
    int32_t device;         /* GPU index, -1 = host memory */
    const char *controller; /* nng URL */
    const char *token;
    const char *trace;     /* Chrome trace JSON path, or NULL */
    uint64_t give_up_ns;   /* exit when the controller stays silent this long */
    uint64_t pace_ns;      /* testing: extra delay before each task starts (0 = none) */
    const char *tx_domain; /* transport domain (NIC / interface), NULL = the provider's choice */
    const char *dump;      /* rollouts: directory for rollout<rank>.v<N>.bin after each version */
    const char *tx_extra;  /* more transport config lines (YAML, wb_tx_cfg keys), or NULL */
};

struct wb_agent;

int wb_agent_create(const struct wb_agent_opts *opts, struct wb_agent **out);
/* Runs until the controller says EXIT (returns 0), the controller refuses this agent (wrong
 * token: -WB_E_TOKEN) or stays silent past give_up_ns (-WB_E_PEER). Messages go to stderr. */
int wb_agent_run(struct wb_agent *a);
void wb_agent_destroy(struct wb_agent *a);

#endif /* WB_AGENT_H */
