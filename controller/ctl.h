/* ctl.h — private to controller/: the plan as the controller hands it out (per-agent setup
 * payloads already encoded), built once at start-up by plan.c. */
#ifndef WB_CTL_H
#define WB_CTL_H

#include "controller/controller.h"

struct ctl_blob {
    uint8_t *buf;
    size_t len;
};

struct wb_model;
struct wb_trainer_layout;

struct ctl_plan {
    uint32_t ntrainers, nrollouts;
    bool has_model; /* false: control plane only (empty tables) */
    /* The job names no trainer layout: it is derived from the trainers' registrations, and
     * the tables exist only after ctl_plan_finish(). md holds the loaded model until then. */
    bool deferred;
    struct wb_model *md;
    struct ctl_blob *table;  /* [ntrainers] planner route-table envelope (empty: no model) */
    struct ctl_blob *shards; /* [ntrainers] msgpack array of [trainer tensor index,
                                wb_tensor_meta] for every shard the rank holds */
    struct ctl_blob *recv;   /* [nrollouts] planner receive-list envelope */
    struct ctl_blob *locals; /* [nrollouts] msgpack array of the names of each receive list's
                                local tensors, in its order */
    struct ctl_blob *sums;   /* [ntrainers] with verify: per table write, its checksum slot at
                                its rollout (u32 little-endian each) */
    /* with delta: per trainer, its slab (offset, size) in each rollout's delta inbox; per
     * rollout, each trainer's slab in it (u64 little-endian pairs; plan.c says the sizes) */
    struct ctl_blob *dslab_t, *dslab_r;
    /* Who may write what (PEERS hands out nothing more): per trainer, the (rollout rank << 32
     * | rollout tensor) pairs it writes, sorted; the trainers whose inboxes it writes
     * (gather and amax peers, [ntrainers * ntrainers]: t * ntrainers + peer); per rollout, the
     * trainers that write to it ([nrollouts * ntrainers]: g * ntrainers + t). */
    uint64_t **wkeys;
    size_t *nwkeys;
    uint8_t *tpeer_of;
    uint8_t *writer_of;
    char **rollout_names; /* [rollout inventory size] names, for registration checks */
    uint32_t nrollout_names;
    /* Trainer tensors of the model that no mapping uses (the family's `ignore:`), sorted: a
     * trainer may register them (a checkpoint reader's share holds them) and nothing is sent */
    char **ignored_names;
    uint32_t nignored_names;
    char *summary;        /* human-readable plan summary (wb-ctl plan) */
    uint64_t total_bytes; /* every write of a transfer */
    uint64_t *send_bytes; /* [ntrainers] */
    uint64_t mem_cap, largest_task;
};

/* The job file's model section as the planner's model source. */
struct wb_model_src;
void ctl_model_src(const struct wb_job *job, struct wb_model_src *src);

/* Loads the job's model and layouts, matches and plans. Every problem goes to el (naming the
 * tensor, file:line or rank); nothing is half-built on failure. o (may be NULL): a trainer
 * layout and inventory given by the embedding program. */
int ctl_plan_build(const struct wb_job *job, const struct wb_controller_opts *o,
                   struct ctl_plan *out, struct wb_errlist *el);
void ctl_plan_free(struct ctl_plan *p);
/* A deferred plan, once the trainer layout is known (it is taken over, *tl left zeroed): plans
 * and encodes; on failure p stays deferred and el says why. */
int ctl_plan_finish(const struct wb_job *job, struct ctl_plan *p, struct wb_trainer_layout *tl,
                    struct wb_errlist *el);

/* derive.c: a deferred plan, made from every trainer's registration (inv[r], mesh[r]: REGISTER's
 * inventory and mesh of trainer rank r): the trainer layout is derived from their placements,
 * then planned (ctl_plan_finish). Every problem goes to el; p stays deferred on failure. */
int ctl_plan_derive(const struct wb_job *job, struct ctl_plan *p, const struct wb_bytes *inv,
                    const struct wb_bytes *mesh, struct wb_errlist *el);

/* register.c: checks the tensors an agent registered (REGISTER.inv) against what the plan
 * expects of (role, rank). On success *detail (malloc'd, free it) holds one line per problem
 * and *nproblems their count (0: the registration is exactly right). -EBADMSG for a malformed
 * inventory, -ENOMEM. */
int ctl_check_registration(const struct ctl_plan *p, enum wb_role role, uint32_t rank,
                           const struct wb_bytes *inv, char **detail, uint32_t *nproblems);

/* register.c: the sources the trainers must read (wb_controller_opts.source, sources, parts),
 * copied. */
struct ctl_parts {
    uint32_t n;
    uint8_t *digests; /* 16 bytes each */
    char **what;
};
struct ctl_sources {
    char **id;               /* [n]: the source each trainer rank must read (n 0: any) */
    uint32_t n;              /* 1: one for every rank; else one per trainer rank */
    struct ctl_parts *parts; /* [n] or NULL */
};
int ctl_sources_init(struct ctl_sources *s, const struct wb_controller_opts *o);
/* 0 when trainer `rank` may register as reading source `have` (REGISTER.source, and its
 * REGISTER.digests); else -WB_E_CONFIG with the reason in msg: both sources and, where only
 * the content differs and the digests tell, how many parts differ and which comes first. */
int ctl_sources_check(const struct ctl_sources *s, uint32_t rank, const char *have,
                      const struct wb_bytes *digests, char *msg, size_t cap);
void ctl_sources_free(struct ctl_sources *s);

/* ---------------------------------------------------------------- serve.c */

/* The control connections (serve.c says why the controller speaks nng's REQ/REP wire protocol
 * itself): listening, the handshake, the binding checks; requests that pass come out as nng
 * messages whose header is the request id and whose pipe is the connection's id. */
struct ctl_serve;
struct ctl_serve_limits {
    uint64_t handshake_ns; /* a connection not introduced by then is closed */
    uint32_t max_held;     /* introduced connections (max_connections) */
    uint32_t max_pending;  /* connections not introduced yet, all peers */
    uint32_t max_per_peer; /* ... of one peer address */
};
typedef struct nng_tls_config nng_tls_config;
typedef struct nng_msg nng_msg;
/* Listens on url (tls: the server's TLS configuration for tls+tcp://, else NULL). On failure,
 * why says what nng said. */
int ctl_serve_open(struct ctl_serve **out, const char *url, nng_tls_config *tls, const char *token,
                   const struct ctl_serve_limits *lim, char *why, size_t cap);
/* Readable while requests are waiting. */
int ctl_serve_fd(const struct ctl_serve *s);
/* The next request, or NULL. */
nng_msg *ctl_serve_recv(struct ctl_serve *s);
/* Sends m (a request's message, its body replaced by the reply) back on its connection;
 * consumes m. -ENOTCONN when the connection is gone, -EAGAIN when its peer reads nothing. */
int ctl_serve_send(struct ctl_serve *s, nng_msg *m);
/* Closes connections past their handshake time; frees closed ones. */
void ctl_serve_tick(struct ctl_serve *s, uint64_t now);
/* The ids of introduced connections closed since the last call (at most cap). */
uint32_t ctl_serve_closed(struct ctl_serve *s, uint32_t *ids, uint32_t cap);
void ctl_serve_stats(struct ctl_serve *s, struct wb_conn_stats *out);
/* Closes every connection and the listener (waits for nng's callbacks to end). */
void ctl_serve_close(struct ctl_serve *s);

/* ---------------------------------------------------------------- metrics.c */

/* The opt-in Prometheus endpoint (job key metrics:): a thread of its own answers GET /metrics
 * with the last text published; the controller's loop never waits for it. */
struct ctl_metrics;
struct sockaddr_storage;
/* Parses HOST:PORT (an IPv4 address or [IPv6], a port 0-65535); -EINVAL with why. */
int ctl_metrics_addr(const char *s, struct sockaddr_storage *ss, unsigned *sslen, char *why,
                     size_t cap);
/* Listens on addr and starts the thread; on failure why says what went wrong. */
int ctl_metrics_open(struct ctl_metrics **out, const char *addr, char *why, size_t cap);
/* The port it listens on (a job asking for port 0 gets one of the kernel's). */
unsigned ctl_metrics_port(const struct ctl_metrics *m);
/* Replaces the exposition served; takes text over (malloc'd, len bytes). */
void ctl_metrics_publish(struct ctl_metrics *m, char *text, size_t len);
/* Stops the thread, closes every connection and the listener. NULL: nothing. */
void ctl_metrics_close(struct ctl_metrics *m);

#endif /* WB_CTL_H */
