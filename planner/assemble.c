/* assemble.c — turns the builder's per-rank output into the plan's routing tables and receive
 * lists (ownership of the arrays moves to the plan), and frees plans. Split from plan.c, which
 * decides what goes where and calls it once pass 3 is done; it calls nothing else in the
 * builder. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "planner/build.h"

static uint32_t bits_for(uint64_t v)
{
    uint32_t b = 1;
    while (b < 32 && (v >> b))
        b++;
    return b;
}

static void *take(struct vec *v, uint32_t *n)
{
    void *p = v->p;
    *n = (uint32_t)v->n;
    v->p = NULL;
    v->n = v->cap = 0;
    return p;
}

int pl_finish_tables(struct plan_ctx *c, struct wb_plan *p)
{
    struct pl_plan *pp = pl_plan_of(p);
    uint32_t tag_bits = bits_for(c->in->rollout->n + 1);
    uint32_t tb2 = bits_for((uint64_t)c->next_tag + 1);
    if (tb2 > tag_bits)
        tag_bits = tb2;
    if (c->opts->lazy) {
        pp->lazy = calloc(1, sizeof(*pp->lazy));
        if (!pp->lazy || !(pp->lazy->t = calloc(c->nt ? c->nt : 1, sizeof(*pp->lazy->t))))
            return -ENOMEM;
    }
    for (uint32_t r = 0; r < c->nt; r++) {
        struct wb_route_table *t = &pp->tables[r];
        struct rank_out *ro = &c->ro[r];
        t->rank = r;
        t->ntrainers = c->nt;
        t->nrollouts = c->nr;
        t->tag_bits = tag_bits;
        t->residence = c->in->tl->residence;
        t->nphases = c->nphases;
        t->phases = calloc(c->nphases ? c->nphases : 1, sizeof(*t->phases));
        if (!t->phases)
            return -ENOMEM;
        t->tasks = take(&ro->tasks, &t->ntasks);
        t->ops = take(&ro->ops, &t->nops);
        t->peers = take(&ro->peers, &t->npeers);
        t->amax_peers = take(&ro->apeers, &t->namax_peers);
        if (ro->boxes.err || ro->shapes.err)
            return -ENOMEM;
        t->boxes = take(&ro->boxes.v, &t->nboxes);
        t->shapes = take(&ro->shapes.v, &t->nshapes);
        t->writes = take(&ro->writes, &t->nwrites);
        t->amax = take(&ro->amax, &t->namax);
        if (pp->lazy) {
            struct pl_lazy_table *lz = &pp->lazy->t[r];
            uint32_t npool;
            lz->seg = take(&ro->segs, &lz->nseg);
            lz->pool = take(&ro->pool, &npool);
            lz->nops = t->nops + ro->vops;
            lz->nwrites = t->nwrites + ro->vwrites;
            lz->namax = t->namax + ro->vamax;
            lz->napeers = t->namax_peers + ro->vapeers;
        }
        t->amax_inbox_bytes = c->inbox[r];
        t->send_bytes = ro->send;
        t->mem_cap = p->mem_cap;
        t->mode = p->mode;
        for (uint32_t ph = 0, k = 0; ph < c->nphases; ph++) {
            t->phases[ph].task0 = k;
            while (k < t->ntasks && t->tasks[k].phase == ph)
                k++;
            t->phases[ph].ntasks = k - t->phases[ph].task0;
            bool later = false;
            for (uint32_t q = ph + 1; q < c->nphases; q++)
                later |= c->phase_coll[q];
            t->phases[ph].barrier_after = c->phase_coll[ph] && later;
        }
        for (uint32_t k = 0; k < t->ntasks; k++)
            if (t->tasks[k].tmp_bytes > t->max_tmp_bytes)
                t->max_tmp_bytes = t->tasks[k].tmp_bytes;
        p->stats.send_bytes[r] = ro->send;
        p->stats.gather_in_bytes[r] = ro->gather_in;
        p->stats.gather_bytes += ro->gather_in;
        p->stats.h2d_bytes += ro->h2d;
        p->stats.tasks += t->ntasks;
        p->stats.ops += t->nops + ro->vops;
        p->stats.amax_peers += t->namax_peers + ro->vapeers;
        p->stats.writes += ro->nwrites;
        p->stats.records += t->nwrites + ro->vwrites;
        p->stats.total_bytes += ro->send;
        if (ro->send > p->stats.max_send)
            p->stats.max_send = ro->send;
    }
    const struct wb_match *mt = c->in->match;
    size_t nrt = c->in->rollout->n;
    for (uint32_t g = 0; g < c->nr; g++) {
        struct wb_recv_list *rv = &p->recv[g];
        uint32_t l = g % c->gpr;
        rv->rank = g;
        rv->replica = g / c->gpr;
        rv->tp_rank = l % c->in->rl->tp;
        rv->ep_rank = l % c->in->rl->ep;
        rv->tag_bits = tag_bits;
        struct vec loc, exp;
        pl_vec_init(&loc, sizeof(struct wb_rt_local));
        pl_vec_init(&exp, sizeof(struct wb_rt_expect));
        /* another replica's rank holds what replica 0's rank l holds: copied, not rebuilt */
        if (g >= c->gpr && pl_vec_reserve(&loc, p->recv[l].nlocal ? p->recv[l].nlocal : 1))
            goto nomem;
        if (g >= c->gpr) {
            memcpy(loc.p, p->recv[l].local, p->recv[l].nlocal * sizeof(struct wb_rt_local));
            loc.n = p->recv[l].nlocal;
        }
        for (size_t m = 0; m < mt->n && g < c->gpr; m++) {
            const struct rlocal *lo = &c->rloc[m * c->gpr + l];
            const struct wb_mapping *mp = &mt->map[m];
            if (lo->np == 0)
                continue;
            for (int s = 0; s < (mp->scale >= 0 ? 2 : 1); s++) {
                struct wb_rt_local e = {.tensor = s ? (uint32_t)mp->scale : mp->rollout};
                e.dtype = s ? WB_DTYPE_FP32 : c->in->rollout->p[e.tensor].dtype;
                e.shape = s ? lo->scale_shape : lo->shape;
                e.bytes = wb_shape_numel(&e.shape) * wb_dtype_size(e.dtype);
                if (!pl_vec_push(&loc, &e))
                    goto nomem;
            }
        }
        for (size_t k = 0; k < nrt; k++) {
            const struct wb_rt_expect e = {(uint32_t)k + 1, (uint32_t)k,
                                           c->recv[(size_t)g * nrt + k].bytes,
                                           c->recv[(size_t)g * nrt + k].writes};
            if (e.writes == 0)
                continue;
            if (!pl_vec_push(&exp, &e))
                goto nomem;
            rv->recv_bytes += e.bytes;
            rv->recv_writes += e.writes;
        }
        rv->local = take(&loc, &rv->nlocal);
        rv->expect = take(&exp, &rv->nexpect);
        p->stats.recv_bytes[g] = rv->recv_bytes;
        continue;
    nomem:
        pl_vec_free(&loc);
        pl_vec_free(&exp);
        return -ENOMEM;
    }
    p->nmeshes = (uint32_t)c->meshes.n;
    p->meshes = calloc(p->nmeshes ? p->nmeshes : 1, sizeof(*p->meshes));
    if (!p->meshes)
        return -ENOMEM;
    for (uint32_t i = 0; i < p->nmeshes; i++) {
        const struct mesh_int *m = VEC_AT(&c->meshes, struct mesh_int, i);
        p->meshes[i].phase = m->phase;
        p->meshes[i].ranks = malloc((m->n ? m->n : 1) * sizeof(uint32_t));
        if (!p->meshes[i].ranks)
            return -ENOMEM;
        memcpy(p->meshes[i].ranks, m->ranks, m->n * sizeof(uint32_t));
        p->meshes[i].n = m->n;
    }
    p->nphases = c->nphases;
    return 0;
}

void wb_plan_free(struct wb_plan *p)
{
    if (!p)
        return;
    struct pl_plan *pp = pl_plan_of(p);
    if (pp->tables)
        for (uint32_t r = 0; r < p->ntrainers; r++)
            wb_route_table_free(&pp->tables[r]);
    if (p->recv)
        for (uint32_t g = 0; g < p->nrollouts; g++)
            wb_recv_list_free(&p->recv[g]);
    free(pp->tables);
    free(p->recv);
    if (p->meshes)
        for (uint32_t i = 0; i < p->nmeshes; i++)
            free(p->meshes[i].ranks);
    free(p->meshes);
    free(p->stats.send_bytes);
    free(p->stats.recv_bytes);
    free(p->stats.gather_in_bytes);
    pl_lazy_free(pp->lazy, p->ntrainers);
    pl_est_memo_free(p);
    free(p->relay_tried);
    free(pp);
}
