/* rollout.h — private to agent/rollout.c and agent/relay.c: a rollout's receive side (struct
 * rollout, d->rx), which the relay reads (its tensors, the expect entries, the checksum inbox)
 * to forward what landed to the same local rank of its child replicas. Nothing else includes
 * it: data.c reaches both through the ag_rollout_* and ag_relay_* calls (xfer.h). */
#ifndef WB_AGENT_ROLLOUT_H
#define WB_AGENT_ROLLOUT_H

#include "agent/xfer.h"

struct rtrace;

struct rollout {
    struct wb_recv_list recv;
    bool have_recv;
    struct local *locals;
    uint32_t *local_left;      /* [nlocal]: expect entries not yet in (its window closes at 0) */
    bool windows_open;         /* the attempt's windows are open */
    struct wb_tx_mr *empty_mr; /* what zero-byte tensors are described by */
    void *empty_buf;
    uint32_t *writers;     /* the trainer peers (transport indices) PEERS named */
    uint32_t *writer_rank; /* [nwriters]: their trainer ranks, for messages */
    uint32_t nwriters;
    char (*lname)[WB_NAME_MAX]; /* [nlocal]: names for messages ("" when not sent) */
    uint64_t local_bytes;
    uint32_t max_data_tag;
    int32_t *expect_of;     /* data tag -> expect index, -1 */
    uint32_t *expect_local; /* [nexpect]: its local tensor */
    uint8_t *reached;       /* [nexpect]: every write counted */
    uint8_t *sum_reached;   /* [nexpect]: every checksum record counted */
    /* resume: [nexpect] landed (and verified) in an attempt of landed_version */
    uint8_t *landed;
    uint64_t landed_version;
    uint32_t *ready; /* expect indices with data and records in, waiting to be checked */
    uint32_t nready;
    uint32_t nlanded, nwant;
    /* checksums (SETUP.verify): the inbox, records grouped by expect entry */
    void *sum_in;
    struct wb_tx_mr *sum_in_mr;
    uint64_t sum_in_bytes;
    void *sum_in_host;           /* GPU: its pinned host mirror, where records are read */
    uint64_t *area;              /* [nexpect]: the entry's first slot */
    struct wb_sum_gpu *rsum;     /* the batch of a tensor's records */
    struct wb_sum_piece *rpiece; /* [rcap] */
    uint64_t *rhash;             /* [rcap] */
    uint64_t rcap;
    bool corrupted;       /* testing: the byte was flipped (opts.corrupt) */
    struct rtrace *tr;    /* what the trace shows (d->trace set), NULL: not traced */
    struct relay *relay;  /* relay.c: neighbours, the attempt's parent and children (NULL: none) */
    uint32_t parent_peer; /* the attempt's parent relay's transport index (UINT32_MAX: none) */
    /* setup only: the previous setup's tensors, to take over */
    struct kept *kept;
    uint32_t nkept;
    uint32_t nkept_taken;
};

#endif /* WB_AGENT_ROLLOUT_H */
