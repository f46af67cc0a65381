/* bcast.h — the one public header of bcast/: a one-shot broadcast of a Hugging Face
 * safetensors checkpoint into a rollout fleet, with no trainer running.
 *
 * Readers play the trainer side of a job. Each is a trainer endpoint whose tensors are the
 * rows of its share of the checkpoint (ckpt/'s wb_ckpt_shares_make: contiguous byte ranges of
 * the files, large tensors split by rows), read through the endpoint's source on I/O threads
 * into the executor's temporary memory, under its memory cap: the same plan, pipeline and
 * transports as a training update, and memory bounded whatever the checkpoint's size.
 *
 * The coordinator checks the checkpoint against the job's model (every problem listed before
 * anything listens), hashes each reader's share of it (XXH3-128, wb_ckpt_share_hash: the ground
 * truth every reader's own hash of its share must equal to register, so a reader holding other
 * bytes is refused before any transfer), lays the readers out (wb_ckpt_layout), runs the job's
 * controller in its own process, waits for every reader and rollout, runs the transfer while
 * showing progress, and has every rollout check each write against the checksum its reader
 * computed. A failed attempt whose reader or rollout died is resumed once the agent is back: only
 * the rollout tensors that had not landed (and been verified) are sent again.
 *
 * Errors: 0 or a negative code; problems appended to the error list. */
#ifndef WB_BCAST_H
#define WB_BCAST_H

#include <stdio.h>

#include "ckpt/ckpt.h"
#include "controller/controller.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ================================================================ readers */

struct wb_bcast_reader_opts {
    const char *checkpoint;
    const char *controller; /* nng URL of the coordinator's controller */
    const char *token;
    uint32_t rank, readers; /* this reader, and how many share the checkpoint */
    int32_t device;         /* GPU the reads are copied to (-1: host memory) */
    struct wb_ckpt_io_opts io;
    uint32_t io_threads; /* 0: 2 */
    const char *tx_domain, *tx_extra, *trace;
    uint64_t give_up_ns; /* stop when the controller stays silent this long (0: 30 s) */
    uint64_t pace_ns;    /* testing: extra delay before each task starts */
};

/* Opens the checkpoint, hashes its share, registers it (the fingerprint and the share's hash)
 * and serves the coordinator's transfers until it ends the job (0), refusing a read from a
 * file written to since the hash. A bad checkpoint or a registration the coordinator refuses is
 * -EBADMSG / -WB_E_CONFIG with every problem in el; a controller gone silent -WB_E_PEER. */
int wb_bcast_reader_run(const struct wb_bcast_reader_opts *o, struct wb_errlist *el);

/* ================================================================ the coordinator */

enum wb_bcast_progress {
    WB_BCAST_PROGRESS_AUTO = 0, /* a live line on a terminal, plain lines otherwise */
    WB_BCAST_PROGRESS_LIVE,     /* one line rewritten in place */
    WB_BCAST_PROGRESS_PLAIN,    /* a line every period */
    WB_BCAST_PROGRESS_OFF,
};

struct wb_bcast_opts {
    const char *checkpoint;
    /* The job: model rules, config.json, vars, rollout layout, listen URL, token, provider,
     * memory cap, timeouts. It names no trainer layout; trainers is the number of readers
     * (the coordinator sets it from `readers`). Borrowed. */
    struct wb_job *job;
    uint32_t readers;
    enum wb_ckpt_form form;
    uint64_t version;     /* the version the rollouts hold afterwards (0: 1) */
    uint64_t wait_ns;     /* how long to wait for every agent, at the start and after one died
                             (0: 10 minutes) */
    uint32_t attempts;    /* attempts at most (0: 4) */
    uint64_t transfer_ns; /* an attempt not done by then fails (0: 24 hours) */
    bool verify;          /* rollouts check every write's checksum (the job's verify is set) */
    enum wb_bcast_progress progress;
    uint64_t period_ns; /* plain progress lines this often (0: 2 s) */
    FILE *out;          /* progress and summary (NULL: stderr) */
};

struct wb_bcast_reader_stats {
    uint64_t read_bytes;  /* of the checkpoint (its share) */
    uint64_t write_bytes; /* to rollouts, every attempt */
    uint64_t peak_tmp, cap;
    uint64_t total_ns; /* of its last attempt */
};

struct wb_bcast_result {
    uint64_t version;
    uint64_t ckpt_bytes;   /* the checkpoint's tensor bytes */
    uint64_t plan_bytes;   /* what the plan writes to the rollouts */
    uint64_t write_bytes;  /* what was written, every attempt together */
    uint64_t resent_bytes; /* of those, written by attempts after the first */
    uint64_t total_ns;     /* first transfer request to the last attempt's end */
    uint32_t attempts, readers, rollouts;
    struct wb_bcast_reader_stats *reader; /* [readers] (malloc'd: wb_bcast_result_free) */
};
void wb_bcast_result_free(struct wb_bcast_result *r);

/* Runs the broadcast (see above). 0 when every rollout holds the checkpoint as `version`;
 * -EBADMSG / -WB_E_MATCH / -WB_E_PLAN when the checkpoint, the model or the plan is refused
 * (every problem in el, nothing listened for or sent); -WB_E_PEER when an attempt failed in a
 * way a retry cannot mend (a checksum mismatch, a read error: el names the tensor and rank)
 * or the attempts ran out; -ETIMEDOUT when an agent did not come in time (el names it). */
int wb_bcast_run(const struct wb_bcast_opts *o, struct wb_bcast_result *res, struct wb_errlist *el);

/* ================================================================ progress */

/* One rendering of the transfer in flight: written and to write over all readers, the rate
 * since the attempt started, and the reader expected to finish last. */
struct wb_bcast_progress_state {
    uint64_t done, total;
    double elapsed_s;
    uint32_t slowest;    /* reader */
    double slowest_frac; /* its done / total */
    bool have_slowest;
};

/* The progress line (no newline): "1.07 GB / 2.14 GB  50.0%  0.89 GB/s  ETA 0:01  slowest
 * reader 1 47.5%". */
void wb_bcast_progress_line(const struct wb_bcast_progress_state *s, char *buf, size_t cap);

#ifdef __cplusplus
}
#endif

#endif /* WB_BCAST_H */
