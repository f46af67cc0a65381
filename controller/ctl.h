/* ctl.h — private to controller/: the plan as the controller hands it out (per-agent setup
 * payloads already encoded), built once at start-up by plan.c. */
#ifndef WB_CTL_H
#define WB_CTL_H

#include "controller/controller.h"

struct ctl_blob {
    uint8_t *buf;
    size_t len;
};

struct ctl_plan {
    uint32_t ntrainers, nrollouts;
    struct ctl_blob *table;  /* [ntrainers] planner route-table envelope (empty: no model) */
    struct ctl_blob *shards; /* [ntrainers] msgpack array of [trainer tensor index,
                                wb_tensor_meta] for every shard the rank holds */
    struct ctl_blob *recv;   /* [nrollouts] planner receive-list envelope */
    char *summary;           /* human-readable plan summary (wb-ctl plan) */
};

/* The job file's model section as the planner's model source. */
struct wb_model_src;
void ctl_model_src(const struct wb_job *job, struct wb_model_src *src);

/* Loads the job's model and layouts, matches and plans. Every problem goes to el (naming the
 * tensor, file:line or rank); nothing is half-built on failure. */
int ctl_plan_build(const struct wb_job *job, struct ctl_plan *out, struct wb_errlist *el);
void ctl_plan_free(struct ctl_plan *p);

#endif /* WB_CTL_H */
