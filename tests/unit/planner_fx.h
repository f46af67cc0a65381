/* planner_fx.h — a small fixture for planner tests: hand-built inventories and matches (the
 * structs are public), layouts from YAML text, and a text dump of the tables. Header-only so
 * that each planner test binary can include it. */
#ifndef WB_PLANNER_FX_H
#define WB_PLANNER_FX_H

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "planner/plan_int.h" /* pl_tables(): the tests break plans on purpose */
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
static inline const char *fx_errors(const struct wb_errlist *el);

/* Loads a model (wb_model_load) and points f->in at it; fails the test with the problems. */
static inline void fx_model(struct fx *f, const struct wb_model_src *src, struct wb_model *md)
{
    if (wb_model_load(src, md, &f->el))
        wb_test_fail(__FILE__, __LINE__, "%s", fx_errors(&f->el));
    f->in = wb_model_input(md);
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
        wb_route_table_print(&pl_tables(p)[r], in, f);
    fclose(f);
    return buf;
}

/* Plans equal byte for byte: meshes, every routing table and receive list (their envelope
 * encodings), and the per-GPU figures. */

/* The envelope bytes of a table or receive list (every field, canonical); the caller frees
 * them with wb_mpw_free(). */
static inline struct wb_mpw fx_encode_table(const struct wb_route_table *t)
{
    struct wb_mpw w;
    wb_mpw_init(&w);
    wb_route_table_encode(&w, t);
    CHECK_INT(wb_mpw_finish(&w), 0);
    return w;
}

static inline struct wb_mpw fx_encode_recv(const struct wb_recv_list *r)
{
    struct wb_mpw w;
    wb_mpw_init(&w);
    wb_recv_list_encode(&w, r);
    CHECK_INT(wb_mpw_finish(&w), 0);
    return w;
}

static inline bool fx_same_bytes(struct wb_mpw *a, struct wb_mpw *b)
{
    bool same = a->len == b->len && memcmp(a->buf, b->buf, a->len) == 0;
    wb_mpw_free(a);
    wb_mpw_free(b);
    return same;
}

static inline void fx_check_same(const struct wb_plan *a, const struct wb_plan *b)
{
    CHECK_INT(a->ntrainers, b->ntrainers);
    CHECK_INT(a->nrollouts, b->nrollouts);
    CHECK_INT(a->nphases, b->nphases);
    CHECK_INT(a->nmeshes, b->nmeshes);
    for (uint32_t m = 0; m < a->nmeshes; m++) {
        CHECK_INT(a->meshes[m].n, b->meshes[m].n);
        CHECK_INT(a->meshes[m].phase, b->meshes[m].phase);
        CHECK(memcmp(a->meshes[m].ranks, b->meshes[m].ranks, a->meshes[m].n * 4) == 0);
    }
    struct wb_plan_tbuf ta = {0}, tb = {0}; /* either may be lazy */
    for (uint32_t r = 0; r < a->ntrainers; r++) {
        const struct wb_route_table *xa = wb_plan_table(a, r, &ta), *xb = wb_plan_table(b, r, &tb);
        CHECK(xa && xb);
        struct wb_mpw ea = fx_encode_table(xa), eb = fx_encode_table(xb);
        if (!fx_same_bytes(&ea, &eb))
            wb_test_fail(__FILE__, __LINE__, "trainer %u: tables differ", r);
        CHECK_U64(pl_tables(a)[r].max_tmp_bytes, pl_tables(b)[r].max_tmp_bytes);
        CHECK_U64(a->stats.send_bytes[r], b->stats.send_bytes[r]);
        CHECK_U64(a->stats.gather_in_bytes[r], b->stats.gather_in_bytes[r]);
    }
    wb_plan_tbuf_free(&ta);
    wb_plan_tbuf_free(&tb);
    for (uint32_t g = 0; g < a->nrollouts; g++) {
        struct wb_mpw ea = fx_encode_recv(&a->recv[g]), eb = fx_encode_recv(&b->recv[g]);
        if (!fx_same_bytes(&ea, &eb))
            wb_test_fail(__FILE__, __LINE__, "rollout %u: receive lists differ", g);
        CHECK_U64(a->stats.recv_bytes[g], b->stats.recv_bytes[g]);
    }
    const struct wb_plan_stats *x = &a->stats, *y = &b->stats;
    CHECK_U64(x->tensors, y->tensors);
    CHECK_U64(x->items, y->items);
    CHECK_U64(x->tasks, y->tasks);
    CHECK_U64(x->ops, y->ops);
    CHECK_U64(x->writes, y->writes);
    CHECK_U64(x->records, y->records);
    CHECK_U64(x->amax_peers, y->amax_peers);
    CHECK_U64(x->amax_ops, y->amax_ops);
    CHECK_U64(x->gathers, y->gathers);
    for (int m = 0; m < 4; m++)
        CHECK_U64(x->pieces[m], y->pieces[m]);
    CHECK_U64(x->total_bytes, y->total_bytes);
    CHECK_U64(x->gather_bytes, y->gather_bytes);
    CHECK_U64(x->h2d_bytes, y->h2d_bytes);
    CHECK_U64(x->lower_bound, y->lower_bound);
    CHECK_U64(x->greedy_max, y->greedy_max);
    CHECK_U64(x->max_send, y->max_send);
}

#endif /* WB_PLANNER_FX_H */
