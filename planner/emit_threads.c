/* emit_threads.c — pass 3 over every item (pl_emit_all) and the per-rank tables it fills. Each
 * rank's tables are reserved up front from the representatives' output (presize), then every
 * item is walked and emitted in order, by one thread or by several that split the trainer
 * ranks between them (a thread fills only its ranks' tables, and keeps its own counters,
 * receive counts and inbox cursors, advancing them for every rank alike, so the tables come
 * out the same for any number of threads). Also each context's scratch and counters. */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "planner/build.h"

/* Per-rank output under construction: n empty tables. */
struct rank_out *pl_rank_outs_new(uint32_t n)
{
    struct rank_out *ro = calloc(n ? n : 1, sizeof(*ro));
    for (uint32_t k = 0; ro && k < n; k++) {
        pl_vec_init(&ro[k].tasks, sizeof(struct wb_rt_task));
        pl_vec_init(&ro[k].ops, sizeof(struct wb_rt_op));
        pl_vec_init(&ro[k].writes, sizeof(struct wb_rt_write));
        pl_vec_init(&ro[k].peers, sizeof(struct wb_rt_peer));
        pl_vec_init(&ro[k].amax, sizeof(struct wb_rt_expect));
        pl_vec_init(&ro[k].apeers, sizeof(struct wb_rt_amax_peer));
        pl_intern_init(&ro[k].boxes, sizeof(struct wb_box));
        pl_intern_init(&ro[k].shapes, sizeof(struct wb_shape));
        pl_vec_init(&ro[k].segs, sizeof(struct pl_seg));
        pl_vec_init(&ro[k].pool, sizeof(uint32_t));
    }
    return ro;
}

/* Empties a table, keeping its arrays' memory. */
static void rank_out_reset(struct rank_out *ro)
{
    ro->tasks.n = ro->ops.n = ro->writes.n = ro->peers.n = ro->amax.n = ro->apeers.n = 0;
    ro->segs.n = ro->pool.n = 0;
    ro->vops = ro->vwrites = ro->vamax = ro->vapeers = 0;
    pl_intern_free(&ro->boxes);
    pl_intern_free(&ro->shapes);
    pl_intern_init(&ro->boxes, sizeof(struct wb_box));
    pl_intern_init(&ro->shapes, sizeof(struct wb_shape));
    for (int k = 0; k < PEER_CACHE; k++)
        ro->pcache[k].n = 0; /* indices into the tables just reset */
    ro->send = ro->gather_in = ro->h2d = ro->nwrites = 0;
}

void pl_rank_outs_free(struct rank_out *ro, uint32_t n)
{
    for (uint32_t r = 0; ro && r < n; r++) {
        pl_vec_free(&ro[r].tasks);
        pl_vec_free(&ro[r].ops);
        pl_vec_free(&ro[r].writes);
        pl_vec_free(&ro[r].peers);
        pl_vec_free(&ro[r].amax);
        pl_vec_free(&ro[r].apeers);
        pl_intern_free(&ro[r].boxes);
        pl_intern_free(&ro[r].shapes);
        pl_vec_free(&ro[r].segs);
        pl_vec_free(&ro[r].pool);
        for (int k = 0; k < PEER_CACHE; k++)
            free(ro[r].pcache[k].pe);
    }
    free(ro);
}

/* Pass 3 over every item, filling the tables of the ranks this context owns. */
static int emit_pass(struct plan_ctx *c)
{
    c->next_tag = 0;
    c->gathers = c->amax_ops = 0;
    c->demand_cursor = 0;
    pl_stamp_pass_reset(c, 3);
    for (size_t i = 0; i < c->items.n; i++) {
        int r = pl_stamp_emit_apply(c, (uint32_t)i);
        if (r > 0)
            continue;
        uint32_t group = 0; /* pass 1's greedy groups are not needed here */
        if (!r)
            r = pl_walk_item(c, VEC_AT(&c->items, struct item, i), true, &group);
        if (!r)
            r = pl_stamp_emit_begin(c, (uint32_t)i);
        if (!r)
            r = pl_emit_item(c, (uint32_t)i);
        if (!r)
            r = pl_stamp_emit_end(c, (uint32_t)i);
        if (r)
            return r;
    }
    return 0;
}

uint32_t pl_plan_threads_default(void)
{
    cpu_set_t set; /* the CPUs this process may run on (taskset, cgroup cpusets) */
    long n = sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set)
                                                          : sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : n > 8 ? 8 : (uint32_t)n;
}

/* Splits the ranks among up to `want` emission threads along one mesh dim that no placement
 * rule fixes (a Shard or Replicate dim everywhere): templates shift owners only along fixed
 * dims, so a stamped item's source and target ranks then belong to the same thread. Returns
 * the number of parts (1: no split) and fills part[]. */
static uint32_t split_ranks(const struct plan_ctx *c, uint32_t want, uint8_t *part)
{
    const struct wb_trainer_layout *tl = c->in->tl;
    uint32_t best = UINT32_MAX, size = 1;
    for (uint32_t d = 0; d < tl->ndims; d++) {
        bool fixed = false;
        for (size_t k = 0; k < tl->nrules && !fixed; k++) {
            enum wb_place_kind kind = tl->rules[k].place[d].kind;
            fixed = !pl_place_splits(kind) && kind != WB_PLACE_REPLICATE;
        }
        if (!fixed && tl->dim[d].size > size) {
            best = d;
            size = tl->dim[d].size;
        }
    }
    uint32_t n = want < size ? want : size;
    if (best == UINT32_MAX || n < 2)
        return 1;
    for (uint32_t r = 0; r < c->nt; r++)
        part[r] = (uint8_t)((r / c->pm->stride[best]) % size * n / size);
    return n;
}

struct emit_thread {
    struct plan_ctx c;
    struct wb_errlist el;
    pthread_t th;
    int r;
};

/* Maps the pages of [p, p + n) now, in one call: the tables are gigabytes at 1024 GPUs, and
 * the kernel fills a page faster asked for a range than faulted in one by one. A kernel
 * without MADV_POPULATE_WRITE (before 5.14) leaves them to fault. */
static void populate(void *p, size_t n)
{
#ifdef MADV_POPULATE_WRITE
    uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t a = ((uintptr_t)p + pg - 1) & ~(pg - 1), z = ((uintptr_t)p + n) & ~(pg - 1);
    if (p && z > a)
        (void)madvise((void *)a, z - a, MADV_POPULATE_WRITE);
#else
    (void)p;
    (void)n;
#endif
}

static void *emit_thread_main(void *arg)
{
    struct emit_thread *t = arg;
    struct plan_ctx *c = &t->c;
    for (uint32_t r = 0; r < c->nt; r++) {
        struct rank_out *ro = &c->ro[r];
        if (!owns(c, r))
            continue;
        populate(VEC_AT(&ro->ops, struct wb_rt_op, ro->ops.n),
                 ro->want_ops * sizeof(struct wb_rt_op));
        populate(VEC_AT(&ro->writes, struct wb_rt_write, ro->writes.n),
                 ro->want_writes * sizeof(struct wb_rt_write));
    }
    t->r = emit_pass(c);
    return NULL;
}

void pl_scratch_init(struct plan_ctx *c)
{
    c->recv = NULL;
    c->rcls = NULL;
    c->gather_seq = NULL;
    c->phase_coll = NULL;
    c->inbox = NULL;
    pl_vec_init(&c->sub, sizeof(struct subpiece));
    pl_vec_init(&c->asg, sizeof(struct assign));
    pl_vec_init(&c->xc, sizeof(struct xchg));
    pl_vec_init(&c->icomp, sizeof(struct icomp));
    pl_vec_init(&c->ibox, sizeof(struct wb_box));
    pl_vec_init(&c->iset, sizeof(int64_t));
    pl_vec_init(&c->dem, sizeof(struct dem));
    pl_vec_init(&c->sd, sizeof(struct sd));
    pl_vec_init(&c->xmine, sizeof(uint32_t));
}

void pl_scratch_free(struct plan_ctx *c)
{
    free(c->recv);
    free(c->rcls);
    free(c->gather_seq);
    free(c->phase_coll);
    free(c->inbox);
    pl_vec_free(&c->sub);
    pl_vec_free(&c->asg);
    pl_vec_free(&c->xc);
    pl_vec_free(&c->icomp);
    pl_vec_free(&c->ibox);
    pl_vec_free(&c->iset);
    pl_vec_free(&c->dem);
    pl_vec_free(&c->sd);
    pl_vec_free(&c->xmine);
}

/* Pass 3's counters, zeroed: receive counts, gather ordinals, collective phases, inbox
 * cursors. */
static int counters_reset(struct plan_ctx *c)
{
    free(c->recv);
    free(c->rcls);
    free(c->gather_seq);
    free(c->phase_coll);
    free(c->inbox);
    c->recv = pl_zalloc((size_t)c->nr * c->in->rollout->n + 1, sizeof(*c->recv));
    c->rcls = pl_zalloc((size_t)c->gpr * c->in->rollout->n + 1, sizeof(*c->rcls));
    c->gather_seq = calloc(c->meshes.n + 1, sizeof(uint32_t));
    c->phase_coll = calloc(c->nphases + 1, sizeof(bool));
    c->inbox = calloc(c->nt + 1, sizeof(uint64_t));
    return c->recv && c->rcls && c->gather_seq && c->phase_coll && c->inbox ? 0 : -ENOMEM;
}

static void emit_thread_free(struct emit_thread *t)
{
    struct plan_ctx *w = &t->c;
    pl_scratch_free(w);
    pl_vec_free(&w->st.reps);
    pl_vec_free(&w->st.p3rk);
    pl_vec_free(&w->st.p3u32);
    wb_errlist_free(&t->el);
}

/* A thread's context: the shared read-only state of c, its own scratch, counters and
 * template records (the representatives' pass-1 records are copied). */
static int emit_thread_init(struct emit_thread *t, const struct plan_ctx *c, const uint8_t *part,
                            uint32_t me)
{
    struct plan_ctx *w = &t->c;
    *w = *c;
    wb_errlist_init(&t->el);
    w->el = &t->el;
    w->part = part;
    w->me = me;
    pl_scratch_init(w);
    pl_vec_init(&w->st.reps, c->st.reps.elem);
    pl_vec_init(&w->st.p3rk, c->st.p3rk.elem);
    pl_vec_init(&w->st.p3u32, sizeof(uint32_t));
    if (counters_reset(w) || pl_vec_reserve(&w->st.reps, c->st.reps.n))
        return -ENOMEM;
    if (c->st.reps.n)
        memcpy(w->st.reps.p, c->st.reps.p, c->st.reps.n * c->st.reps.elem);
    w->st.reps.n = c->st.reps.n;
    return 0;
}

/* Reserves each rank's tables for what pass 3 will append to them. An item with a
 * representative (stamp.c) appends at each mesh position what its representative appends at
 * that position (exactly so when it is stamped; about so when the balancer gave it other
 * senders), so each representative is emitted once into scratch tables and counted. Tables
 * grown step by step instead are copied at every step and their pages faulted again. */
static int presize(struct plan_ctx *c)
{
    enum { NV = 6 }; /* tasks, ops, writes, peers, amax, amax peers */
    struct emit_thread t;
    memset(&t, 0, sizeof(t));
    int r = emit_thread_init(&t, c, NULL, 0);
    struct plan_ctx *w = &t.c;
    w->ro = r ? NULL : pl_rank_outs_new(c->nt);
    uint64_t *need = calloc((size_t)c->nt * NV + 1, sizeof(uint64_t));
    int64_t *first = malloc((c->items.n + 1) * sizeof(int64_t)); /* rep item -> its counts */
    struct vec cnt; /* uint64_t[NV] per mesh position of each representative */
    pl_vec_init(&cnt, NV * sizeof(uint64_t));
    if (!r && (!w->ro || !need || !first))
        r = -ENOMEM;
    for (size_t i = 0; !r && i < c->items.n; i++)
        first[i] = -1;
    for (size_t i = 0; !r && i < c->items.n; i++) {
        int64_t dr;
        int64_t x = pl_stamp_rep_of(c, (uint32_t)i, &dr);
        if (x < 0)
            continue;
        const struct item *it = VEC_AT(&c->items, struct item, x);
        const struct mesh_int *mesh = VEC_AT(&c->meshes, struct mesh_int, it->mesh);
        const uint32_t *ranks = mesh->ranks;
        uint32_t n = mesh->n;
        if (first[x] < 0) { /* the representative itself: emit it into scratch, count */
            uint32_t group = 0;
            w->demand_cursor = c->dem0[x];
            if ((r = pl_walk_item(w, it, true, &group)) || (r = pl_emit_item(w, (uint32_t)x)) ||
                (r = pl_vec_reserve(&cnt, n)))
                break;
            first[x] = (int64_t)cnt.n;
            for (uint32_t k = 0; k < n; k++) {
                struct rank_out *ro = &w->ro[ranks[k]];
                uint64_t *v = VEC_AT(&cnt, uint64_t, NV * cnt.n++);
                v[0] = ro->tasks.n;
                v[1] = ro->ops.n;
                v[2] = ro->writes.n;
                v[3] = ro->peers.n;
                v[4] = ro->amax.n;
                v[5] = ro->apeers.n;
                rank_out_reset(ro);
            }
        }
        /* a lazy plan keeps only a stamped item's tasks and gather peers (v[0], v[3]) */
        bool lazy = c->opts->lazy && x != (int64_t)i;
        for (uint32_t k = 0; k < n; k++) {
            const uint64_t *v = VEC_AT(&cnt, uint64_t, NV * (first[x] + k));
            uint64_t *d = &need[NV * (size_t)((int64_t)ranks[k] + dr)];
            for (int j = 0; j < NV; j++)
                if (!lazy || j == 0 || j == 3)
                    d[j] += v[j];
        }
    }
    for (uint32_t k = 0; !r && k < c->nt; k++) {
        struct rank_out *ro = &c->ro[k];
        const uint64_t *d = &need[NV * (size_t)k];
        ro->want_ops = d[1];
        ro->want_writes = d[2];
        if (pl_vec_reserve(&ro->tasks, d[0]) || pl_vec_reserve(&ro->ops, d[1]) ||
            pl_vec_reserve(&ro->writes, d[2]) || pl_vec_reserve(&ro->peers, d[3]) ||
            pl_vec_reserve(&ro->amax, d[4]) || pl_vec_reserve(&ro->apeers, d[5]))
            r = -ENOMEM;
    }
    pl_rank_outs_free(w->ro, c->nt);
    w->ro = NULL;
    for (size_t m = 0; m < t.el.n; m++)
        wb_errlist_add(c->el, "%s", t.el.msgs[m]);
    emit_thread_free(&t);
    pl_vec_free(&cnt);
    free(need);
    free(first);
    return r;
}

static int emit_all(struct plan_ctx *c);

/* Pass 3: resets the tables and emits every item, in c->opts->threads threads (rank
 * partitions, see split_ranks) or in this one. A rebuild with the greedy's assignment
 * replays it. */
int pl_emit_all(struct plan_ctx *c)
{
    int r = emit_all(c);
    if (r)
        return r;
    /* what records fanned out to every replica bring, to each replica's rank */
    size_t nrt = c->in->rollout->n;
    for (uint32_t g = 0; g < c->nr; g++) {
        const struct recv_count *k = &c->rcls[(size_t)(g % c->gpr) * nrt];
        struct recv_count *d = &c->recv[(size_t)g * nrt];
        for (size_t t = 0; t < nrt; t++) {
            d[t].bytes += k[t].bytes;
            d[t].writes += k[t].writes;
        }
    }
    return 0;
}

static int emit_all(struct plan_ctx *c)
{
    size_t nrt = c->in->rollout->n;
    if (counters_reset(c))
        return -ENOMEM;
    for (uint32_t r = 0; r < c->nt; r++)
        rank_out_reset(&c->ro[r]);
    uint64_t tp0 = wb_now_ns();
    int r = presize(c);
    wb_log(WB_LOG_DEBUG, "planner", "emit: presized in %.3f s", (double)(wb_now_ns() - tp0) * 1e-9);
    if (r)
        return r;
    uint32_t want = c->opts->threads ? c->opts->threads : pl_plan_threads_default();
    uint8_t *part = malloc(c->nt + 1);
    if (!part)
        return -ENOMEM;
    uint32_t n = want > 1 ? split_ranks(c, want, part) : 1;
    if (n == 1) {
        free(part);
        return emit_pass(c);
    }
    struct emit_thread *T = calloc(n, sizeof(*T));
    if (!T) {
        free(part);
        return -ENOMEM;
    }
    r = 0;
    uint32_t made = 0;
    for (; made < n && !r; made++)
        r = emit_thread_init(&T[made], c, part, made);
    bool *started = calloc(n, sizeof(bool));
    if (!r && !started)
        r = -ENOMEM;
    for (uint32_t k = 1; k < n && !r; k++)
        started[k] = pthread_create(&T[k].th, NULL, emit_thread_main, &T[k]) == 0;
    for (uint32_t k = 0; k < n && !r; k++) /* parts no thread took run here, in turn */
        if (!started[k])
            emit_thread_main(&T[k]);
    for (uint32_t k = 1; k < n && started; k++)
        if (started[k])
            pthread_join(T[k].th, NULL);
    free(started);
    for (uint32_t k = 0; k < n && !r; k++)
        r = T[k].r;
    if (!r) { /* every thread advanced the tags, gather ordinals and inbox cursors alike */
        const struct plan_ctx *w0 = &T[0].c;
        c->next_tag = w0->next_tag;
        memcpy(c->gather_seq, w0->gather_seq, c->meshes.n * sizeof(uint32_t));
        memcpy(c->inbox, w0->inbox, c->nt * sizeof(uint64_t));
        c->gathers = c->amax_ops = 0;
        c->st.stamped = w0->st.stamped; /* every thread stamps the same items */
        for (uint32_t k = 0; k < n; k++) {
            const struct plan_ctx *w = &T[k].c;
            c->gathers += w->gathers;
            c->amax_ops += w->amax_ops;
            for (uint32_t ph = 0; ph < c->nphases; ph++)
                c->phase_coll[ph] |= w->phase_coll[ph];
            for (size_t i = 0; i < (size_t)c->nr * nrt; i++) {
                c->recv[i].bytes += w->recv[i].bytes;
                c->recv[i].writes += w->recv[i].writes;
            }
            for (size_t i = 0; i < (size_t)c->gpr * nrt; i++) {
                c->rcls[i].bytes += w->rcls[i].bytes;
                c->rcls[i].writes += w->rcls[i].writes;
            }
        }
    }
    for (uint32_t k = 0; k < made; k++) {
        for (size_t m = 0; m < T[k].el.n; m++)
            wb_errlist_add(c->el, "%s", T[k].el.msgs[m]);
        emit_thread_free(&T[k]);
    }
    free(T);
    free(part);
    return r;
}
