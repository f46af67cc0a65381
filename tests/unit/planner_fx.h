/* planner_fx.h — a small fixture for planner tests: hand-built inventories and matches (the
 * structs are public), layouts from YAML text, and a text dump of the tables. Header-only so
 * that each planner test binary can include it. */
#ifndef WB_PLANNER_FX_H
#define WB_PLANNER_FX_H

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "planner/planner.h"
#include "tests/wbtest.h"

enum { FX_MAX_MAPS = 16, FX_MAX_COMPS = 64 };

struct fx {
    struct wb_inventory ti, ri;
    struct wb_match mt;
    struct wb_mapping maps[FX_MAX_MAPS];
    struct wb_component comps[FX_MAX_COMPS];
    uint32_t ncomps;
    struct wb_trainer_layout tl;
    struct wb_rollout_layout rl;
    struct wb_plan_input in;
    struct wb_errlist el;
};

static inline void fx_init(struct fx *f)
{
    memset(f, 0, sizeof(*f));
    wb_inv_init(&f->ti);
    wb_inv_init(&f->ri);
    wb_errlist_init(&f->el);
    f->mt.map = f->maps;
    f->in.trainer = &f->ti;
    f->in.rollout = &f->ri;
    f->in.match = &f->mt;
    f->in.tl = &f->tl;
    f->in.rl = &f->rl;
}

static inline void fx_free(struct fx *f)
{
    wb_inv_free(&f->ti);
    wb_inv_free(&f->ri);
    wb_trainer_layout_free(&f->tl);
    wb_rollout_layout_free(&f->rl);
    wb_errlist_free(&f->el);
}

static inline struct wb_shape fx_shape(uint32_t ndim, ...)
{
    struct wb_shape s = {.ndim = ndim};
    va_list ap;
    va_start(ap, ndim);
    for (uint32_t d = 0; d < ndim; d++)
        s.dim[d] = va_arg(ap, uint64_t);
    va_end(ap);
    return s;
}

static inline struct wb_box fx_box(uint32_t ndim, ...)
{
    struct wb_box b = {.ndim = ndim};
    va_list ap;
    va_start(ap, ndim);
    for (uint32_t d = 0; d < ndim; d++) {
        b.off[d] = va_arg(ap, uint64_t);
        b.ext[d] = va_arg(ap, uint64_t);
    }
    va_end(ap);
    return b;
}

static inline uint32_t fx_t(struct fx *f, const char *name, enum wb_dtype dt, struct wb_shape s)
{
    CHECK_INT(wb_inv_add(&f->ti, name, dt, &s), 0);
    return (uint32_t)f->ti.n - 1;
}

static inline uint32_t fx_r(struct fx *f, const char *name, enum wb_dtype dt, struct wb_shape s)
{
    CHECK_INT(wb_inv_add(&f->ri, name, dt, &s), 0);
    return (uint32_t)f->ri.n - 1;
}

/* A mapping; components follow with fx_comp. */
static inline struct wb_mapping *fx_map(struct fx *f, uint32_t rollout, int32_t scale,
                                        enum wb_xform x, enum wb_shard_kind sk, uint32_t dim)
{
    CHECK(f->mt.n < FX_MAX_MAPS);
    struct wb_mapping *m = &f->maps[f->mt.n++];
    memset(m, 0, sizeof(*m));
    m->rollout = rollout;
    m->scale = scale;
    m->xform = x;
    m->dst_dtype = f->ri.p[rollout].dtype;
    m->shard.kind = sk;
    m->shard.dim = dim;
    m->shard.ep1_tp_dim = -1;
    m->block = scale >= 0 ? 128 : 0;
    m->comp = &f->comps[f->ncomps];
    return m;
}

static inline void fx_comp(struct fx *f, struct wb_mapping *m, uint32_t trainer, struct wb_box src,
                           struct wb_box dst)
{
    CHECK(f->ncomps < FX_MAX_COMPS);
    struct wb_component *c = &f->comps[f->ncomps++];
    memset(c, 0, sizeof(*c));
    c->trainer = trainer;
    c->src = src;
    c->dst = dst;
    c->trainer_scale = -1;
    m->src_dtype = f->ti.p[trainer].dtype;
    m->ncomp++;
}

/* A whole-tensor component. */
static inline void fx_comp_full(struct fx *f, struct wb_mapping *m, uint32_t trainer,
                                struct wb_box dst)
{
    fx_comp(f, m, trainer, wb_box_full(&f->ti.p[trainer].shape), dst);
}

static inline int fx_layouts(struct fx *f, const char *trainer_yaml, const char *rollout_yaml)
{
    int r =
        wb_trainer_layout_load(wb_test_write_file("trainer.yaml", trainer_yaml), &f->tl, &f->el);
    if (r)
        return r;
    return wb_rollout_layout_load(wb_test_write_file("rollout.yaml", rollout_yaml), &f->rl, &f->el);
}

/* All messages of el joined by newlines (static buffer). */
static inline const char *fx_errors(const struct wb_errlist *el)
{
    static char buf[8192];
    size_t pos = 0;
    buf[0] = 0;
    for (size_t i = 0; i < el->n && pos < sizeof(buf); i++)
        pos += (size_t)snprintf(buf + pos, sizeof(buf) - pos, "%s%s", i ? "\n" : "", el->msgs[i]);
    return buf;
}

/* The dump of every rank's table (malloc'd). */
static inline char *fx_dump(const struct wb_plan *p, const struct wb_plan_input *in)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    CHECK(f != NULL);
    for (uint32_t r = 0; r < p->ntrainers; r++)
        wb_route_table_print(&p->tables[r], in, f);
    fclose(f);
    return buf;
}

#endif /* WB_PLANNER_FX_H */
