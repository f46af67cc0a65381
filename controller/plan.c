/* plan.c — builds the controller's plan from the job file: without a model, the control plane
 * alone (agents register, heartbeat, and run empty transfers); with a model, matcher + planner
 * produce one routing table per trainer and one receive list per rollout, encoded once here so
 * that handing them out later is a copy. */
#include "controller/ctl.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static int plan_empty(const struct wb_job *job, struct ctl_plan *p)
{
    p->ntrainers = (uint32_t)job->trainers;
    p->nrollouts = (uint32_t)job->rollouts;
    p->table = calloc(p->ntrainers, sizeof(*p->table));
    p->shards = calloc(p->ntrainers, sizeof(*p->shards));
    p->recv = calloc(p->nrollouts, sizeof(*p->recv));
    p->expect_bytes = calloc(p->nrollouts, sizeof(*p->expect_bytes));
    char text[256];
    snprintf(text, sizeof(text),
             "job %s: no model (control plane only): %u trainers, %u rollouts, 0 bytes\n",
             job->name, p->ntrainers, p->nrollouts);
    p->summary = strdup(text);
    if (!p->table || !p->shards || !p->recv || !p->expect_bytes || !p->summary)
        return -ENOMEM;
    return 0;
}

int ctl_plan_build(const struct wb_job *job, struct ctl_plan *out, struct wb_errlist *el)
{
    struct ctl_plan p;
    memset(&p, 0, sizeof(p));
    int err;
    if (!*job->model.rules) {
        err = plan_empty(job, &p);
    } else {
        wb_errlist_add(el, "%s: model planning is not available in this build", job->model.rules);
        err = -WB_E_PLAN;
    }
    if (err) {
        ctl_plan_free(&p);
        return err;
    }
    *out = p;
    return 0;
}

void ctl_plan_free(struct ctl_plan *p)
{
    for (uint32_t i = 0; p->table && i < p->ntrainers; i++) {
        free(p->table[i].buf);
        free(p->shards[i].buf);
    }
    for (uint32_t i = 0; p->recv && i < p->nrollouts; i++)
        free(p->recv[i].buf);
    free(p->table);
    free(p->shards);
    free(p->recv);
    free(p->expect_bytes);
    free(p->summary);
    memset(p, 0, sizeof(*p));
}
