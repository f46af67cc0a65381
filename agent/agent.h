/* agent.h — the one public header of agent/: the endpoint, by which a process takes part in a
 * weightbridge job as one trainer rank or one rollout rank.
 *
 * A trainer process (PyTorch under torchrun, say) opens an endpoint, registers the tensors it
 * already holds — name, dtype, global shape, the box of it this rank holds, strides, pointer —
 * and starts it; then, after each optimizer step, pushes a version. A rollout process (an
 * inference engine) registers its own parameters in the engine's layout (vLLM names, fused,
 * FP8 with scales) and waits for versions: the bytes are written into its memory in place.
 * What is registered is the metadata the controller checks against the model rules and the
 * layout before anything is planned for the rank: every missing, extra or mis-shaped tensor is
 * refused together, with the rank, the tensor, what was expected and what came.
 *
 * A started endpoint runs its own thread: it talks to the controller (heartbeats never wait on
 * the caller), executes the routing table (trainers) or counts what lands (rollouts). The
 * calls below are thread-safe; the waits have time limits.
 *
 * Memory: tensors may live in GPU memory (of the endpoint's device) or in host memory. The
 * endpoint registers whole allocations with the transport, not one region per tensor (for GPU
 * memory, the allocation a tensor lies in, as cuMemGetAddressRange reports it — the caching
 * allocator's segment), and hands peers one bounded view per tensor. Registered memory must
 * stay valid until the endpoint is closed; trainers must not modify a pushed version's tensors
 * until wb_endpoint_wait_push(WB_PUSH_SOURCES) returned, rollouts must not read a version
 * before wb_endpoint_wait() returned it.
 *
 * wb-agent is this API with `synthetic` set: it registers nothing, allocates what the plan
 * assigns its rank and fills trainer shards from the synthetic source at every transfer (the
 * demo, tests and benchmarks).
 *
 * Also here: the launcher-environment rank discovery (torchrun, Slurm).
 */
#ifndef WB_AGENT_H
#define WB_AGENT_H

#include "common/common.h"
#include "proto/proto.h"

#ifdef __cplusplus
extern "C" {
#endif

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

/* ================================================================ the endpoint */

struct wb_endpoint_opts {
    enum wb_role role;
    uint32_t rank;
    int32_t device;         /* GPU index of the tensors, -1 = host memory */
    const char *controller; /* nng URL */
    const char *token;
    bool synthetic;         /* wb-agent: hold what the plan assigns, synthetic values */
    const char *trace;      /* a directory for this agent's Chrome traces, one file per version
                               (<role><rank>.v<version>.json), instead of the job's trace:
                               directory; NULL: the job's */
    uint64_t give_up_ns;    /* stop when the controller cannot be reached (no connection, no
                               answer) this long (0: trainers 30 s, rollouts never: they keep
                               the weights and wait); one that answers slowly is waited for */
    uint64_t pace_ns;       /* testing: extra delay before each task starts (0 = none) */
    const char *tx_domain;  /* transport domain (NIC / interface), NULL = the provider's choice */
    const char *dump;       /* rollouts: directory for rollout<rank>.v<N>.bin after each version */
    const char *tx_extra;   /* more transport config lines (YAML, wb_tx_cfg keys), or NULL */
    uint64_t dump_from;     /* rollouts: dump only versions >= this (0: every version) */
    const char *corrupt;    /* testing (rollouts of a verifying job): once this tensor landed,
                               flip its first byte before it is checked */
    uint64_t corrupt_delta; /* testing (trainers of a delta job): in this version, leave one
                               changed byte out of the deltas, as a shadow that held it would */
};

struct wb_endpoint;

/* Creates an endpoint (nothing is sent yet). Strings in opts are copied. -EINVAL for a bad
 * controller URL, -ENOMEM. */
int wb_endpoint_open(const struct wb_endpoint_opts *opts, struct wb_endpoint **out);

/* Whether dir is a directory this process can write traces into: 0, or a negative errno
 * (-ENOENT, -ENOTDIR, -EACCES, ...). Programs check their --trace with it before they start;
 * an endpoint whose trace directory (its own or the job's) fails it logs a warning naming the
 * directory and writes no traces — a trace never fails a transfer. */
int wb_endpoint_trace_check(const char *dir);

/* One tensor this process owns. Trainers: `shape` is the global (unsharded) shape and `box` the
 * part this rank holds (global coordinates). Rollouts: `shape` is the local tensor as the
 * engine holds it and `box` all of it. `strides` (elements, box.ndim of them) may be NULL for
 * a contiguous row-major tensor; a tensor registered with other strides is reported by the
 * controller. `ptr` is its first element, in the endpoint's device memory or host memory. */
struct wb_tensor_reg {
    const char *name;
    enum wb_dtype dtype;
    struct wb_shape shape;
    struct wb_box box;
    const int64_t *strides;
    void *ptr;
    /* Trainers that know how a tensor is placed (DTensor placements, a Megatron model's
     * parallel state): per dim of the mesh given to wb_endpoint_set_mesh(), WB_REG_REPLICATE,
     * the tensor dim it is sharded along (torch.chunk rule), or wb_reg_at(i): only the ranks at
     * coordinate i of that dim hold it (a pipeline stage's layers: wb_reg_at(stage) on the pp
     * dim; an expert-parallel rank's experts: wb_reg_at(ep_rank) on the ep dim); the ranks at
     * other coordinates do not register it. NULL when not known. A job whose file names no
     * trainer layout derives it from these; the controller refuses a rank that registers a
     * tensor "at" a coordinate it is not at, naming the rank and the tensor. */
    const int32_t *placement;
};

/* Trainers whose tensors are not in memory — a checkpoint on storage, broadcast to a rollout
 * fleet by reader processes (ckpt/bin/wb-broadcast). Tensors are added with ptr NULL and the
 * executor reads the bytes each task needs from the source straight into its temporary memory
 * (host memory; for a GPU endpoint pinned host memory, then a copy to the GPU) under the
 * memory cap, on I/O threads of its own, so memory stays bounded whatever the source's size.
 * Every task of such a trainer starts with its reads: the job's layout must keep the tensors
 * in host memory (residence: host). */
struct wb_endpoint_source {
    /* Reads bytes [off, off + len) of registered tensor `index` (its box, row-major; indices
     * count wb_endpoint_add calls from 0) into dst, host memory. Called on I/O thread `thread`
     * (0 .. threads - 1), concurrently for different requests. Returns 0, or a negative errno
     * with a message naming what failed (file, offset) in msg. */
    int (*read)(void *arg, uint32_t thread, uint32_t index, uint64_t off, uint64_t len, void *dst,
                char *msg, size_t msgcap);
    void *arg;
    uint32_t threads; /* I/O threads (0: 2) */
    /* What the bytes are (a checkpoint's fingerprint), sent in REGISTER: a controller that was
     * told which source its job moves refuses a trainer reading another. Copied. */
    const char *id;
    /* Optional, what each tensor holds: 16 bytes per tensor added (a checkpoint piece's
     * XXH3-128), in wb_endpoint_add order, ndigests of them — as many as are added before the
     * start (else the start is -EINVAL). Sent in REGISTER: a controller that knows the same
     * digests names the first tensor whose bytes differ when it refuses the id. Copied. */
    const uint8_t *digests;
    uint32_t ndigests;
};

/* Makes the endpoint a sourced trainer (before any tensor is added). -EINVAL for a rollout, a
 * source without read or an id over WB_SOURCE_MAX - 1 bytes; -EBUSY after wb_endpoint_add;
 * -ENOMEM. */
int wb_endpoint_set_source(struct wb_endpoint *ep, const struct wb_endpoint_source *src);

/* Trainers: the device mesh the tensors' placements refer to (ranks row-major over the dims,
 * the first slowest), before any tensor is added. -EINVAL for more than WB_REG_MESH_DIMS dims, a
 * size 0 or a name too long. */
int wb_endpoint_set_mesh(struct wb_endpoint *ep, uint32_t ndims, const char *const *names,
                         const uint32_t *sizes);

/* Adds a tensor (before wb_endpoint_start). Checked here: the name is new (-EEXIST), dtype and
 * box are valid and inside the shape, the pointer is of the endpoint's memory kind — NULL for a
 * sourced trainer (-EINVAL); wb_endpoint_error() says which and why. */
int wb_endpoint_add(struct wb_endpoint *ep, const struct wb_tensor_reg *t);

/* Rollouts: called on the endpoint's thread after every byte of `version` landed and before
 * the rollout reports it received (so "complete" is only published once it ran on every
 * rollout) — engines derive tensors from weights (vLLM's MLA W_UK_T/W_UV from kv_b_proj).
 * Return 0, or non-zero with a message in err to fail the version. */
typedef int (*wb_endpoint_hook)(void *arg, uint64_t version, char *err, size_t errcap);
void wb_endpoint_set_hook(struct wb_endpoint *ep, wb_endpoint_hook fn, void *arg);

/* Registers with the controller (the tensors added so far are the registration) and starts the
 * endpoint's thread; returns when the whole job is ready (every agent registered and set up),
 * or with the reason it will not be: -WB_E_CONFIG when the controller refused the registration
 * (wb_endpoint_error() lists every problem), -WB_E_TOKEN, -ETIMEDOUT, -WB_E_PEER. With
 * timeout_ns 0 it returns 0 at once (the thread goes on registering): one thread can then start
 * several endpoints — a trainer and a rollout colocated in one process — and wait for them
 * with wb_endpoint_wait_ready(). */
int wb_endpoint_start(struct wb_endpoint *ep, uint64_t timeout_ns);
int wb_endpoint_wait_ready(struct wb_endpoint *ep, uint64_t timeout_ns);

/* Trainers: asks for transfer `version` (every trainer rank pushes the same versions in the
 * same order; the transfer starts when all did). Returns at once.
 *
 * A push while another version is in flight waits for it. What happens to it then is the
 * endpoint's push policy (wb_endpoint_set_push_policy):
 *   WB_PUSH_LATEST (the default, for asynchronous RL): the latest wins. A push replaces the
 *     version queued before it (pushed, not started): that one is never transferred — it is
 *     skipped, on every trainer rank alike (the controller decides, as it sees every rank's
 *     pushes: a version any rank has pushed past before it started is skipped for all). The
 *     version in flight always completes.
 *   WB_PUSH_QUEUE: every version is transferred, in order; the endpoint sends the next push
 *     once the previous one ended.
 * The tensors are read in place: a queued version reads them when its transfer starts, so
 * they must not change until wait_push(WB_PUSH_SOURCES) returned — at once for a skipped
 * version (it will never read them), else once this rank's transfer of it read its last byte. */
int wb_endpoint_push(struct wb_endpoint *ep, uint64_t version);

enum wb_push_policy {
    WB_PUSH_LATEST = 0, /* a push replaces a queued one (the default) */
    WB_PUSH_QUEUE,      /* every pushed version is transferred, in order */
};
/* Trainers: sets the push policy, before the first push; -EINVAL for another role or an
 * unknown policy, -EBUSY once a version was pushed. Every trainer rank of a job uses the same
 * policy: the controller refuses a push whose policy differs from another rank's. */
int wb_endpoint_set_push_policy(struct wb_endpoint *ep, enum wb_push_policy policy);

enum wb_push_event {
    WB_PUSH_SOURCES = 1, /* this rank finished reading its tensors: they may change again */
    WB_PUSH_DONE,        /* every rollout holds the version (or it failed, or was skipped) */
};
enum { WB_PUSH_SKIPPED = 1 }; /* wait_push: a newer push replaced the version (not an error) */
/* Trainers: waits for an event of a pushed version. 0 when it happened and the version has
 * not failed; WB_PUSH_SKIPPED (both events) when a newer push replaced it before it started
 * (wb_endpoint_push_stats() says by which); -WB_E_PEER when the version failed
 * (wb_endpoint_error(): the controller's reason); the code that stopped the endpoint when it
 * stopped first (-WB_E_ENDED: the controller ended the job; -WB_E_PEER: the controller
 * unreachable); -ETIMEDOUT; -EINVAL for a version never pushed. */
int wb_endpoint_wait_push(struct wb_endpoint *ep, uint64_t version, enum wb_push_event ev,
                          uint64_t timeout_ns);

enum { WB_PUSH_SKIPPED_MAX = 32 };
/* What became of one pushed version on this trainer rank. */
struct wb_push_stats {
    uint64_t version;
    uint64_t skipped_by; /* skipped: the newer version that replaced it (0: not skipped) */
    uint64_t nskipped;   /* versions skipped in favour of this one, since the last one that went */
    uint64_t skipped[WB_PUSH_SKIPPED_MAX]; /* the newest of them (at most WB_PUSH_SKIPPED_MAX),
                                              in ascending order */
    uint64_t failed;                       /* 1: the version failed (wb_endpoint_error) */
    uint64_t bytes;                        /* this rank's figures of its transfer: bytes written */
    uint64_t writes;
    uint64_t stage_ns[WB_STAGE_COUNT]; /* busy time per stage (enum wb_stage: h2d, gather, fuse,
                                          quant, write, barrier), summed over tasks */
    uint64_t xfer_ns;                  /* TRANSFER received -> its last write completed */
    uint64_t wait_ns;                  /* push -> its transfer started (or it was skipped) */
    uint64_t total_ns;                 /* push -> every rollout held it (or it failed, or
                                          was skipped) */
};
/* Trainers: the figures of a pushed version, once its outcome is known (WB_PUSH_DONE); 0,
 * -EAGAIN before, -EINVAL for a version never pushed or too old to be remembered (the
 * endpoint keeps the last 64 pushes). */
int wb_endpoint_push_stats(struct wb_endpoint *ep, uint64_t version, struct wb_push_stats *out);

/* Rollouts: waits until this rank holds `version` or a newer one complete. -WB_E_PEER when that
 * version failed (wb_endpoint_error() has the reason, and says whether the rank's tensors are
 * torn: see wb_endpoint_torn()), -ETIMEDOUT, or the code that stopped the endpoint
 * (-WB_E_ENDED: the controller ended the job; -WB_E_PEER: the controller unreachable). */
int wb_endpoint_wait(struct wb_endpoint *ep, uint64_t version, uint64_t timeout_ns);

/* The last complete version this rank holds (rollouts) or pushed successfully (trainers). */
uint64_t wb_endpoint_version(struct wb_endpoint *ep);

/* Rollouts: true from a failed transfer until a version completes — its bytes may have landed
 * in part, so the tensors hold neither that version nor wb_endpoint_version()'s whole. The
 * controller's status says "torn" for the rank meanwhile. */
bool wb_endpoint_torn(struct wb_endpoint *ep);

/* The message of the last failure on this endpoint ("" when none). Valid until the next call on
 * the endpoint from this thread. */
const char *wb_endpoint_error(struct wb_endpoint *ep);

/* Runs the endpoint on the calling thread until the controller says EXIT (0), refuses the
 * registration (-WB_E_CONFIG) or the token (-WB_E_TOKEN), or cannot be reached for give_up_ns
 * (-WB_E_PEER). What wb-agent does; not together with wb_endpoint_start. */
int wb_endpoint_run(struct wb_endpoint *ep);

/* Stops the thread, releases every registration and the transport (the caller's memory is left
 * alone), frees ep. NULL is a no-op. */
void wb_endpoint_close(struct wb_endpoint *ep);

/* ---------------------------------------------------------------- for language bindings
 *
 * The same calls with plain arguments, so that a binding (Python's ctypes) needs no copy of the
 * structs above. Strings may be NULL where the struct field may; role is "trainer" or
 * "rollout"; dtype any name wb_dtype_parse() accepts ("bfloat16", "torch.float8_e4m3fn", ...);
 * shape, box_off and box_ext have ndim entries; strides ndim entries or NULL. Errors as the
 * struct calls; wb_endpoint_open_args() explains a bad argument in *why (static text). */
int wb_endpoint_open_args(const char *controller, const char *role, uint32_t rank,
                          const char *token, int32_t device, const char *tx_domain,
                          const char *tx_extra, const char *dump, const char *trace,
                          uint64_t give_up_ns, struct wb_endpoint **out, const char **why);
int wb_endpoint_add_args(struct wb_endpoint *ep, const char *name, const char *dtype, uint32_t ndim,
                         const uint64_t *shape, const uint64_t *box_off, const uint64_t *box_ext,
                         const int64_t *strides, void *ptr, const int32_t *placement);

#ifdef __cplusplus
}
#endif

#endif /* WB_AGENT_H */
