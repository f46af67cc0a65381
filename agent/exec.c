/* exec.c — the trainer's pipelined executor: the routing table's tasks move through their stages
 * (H2D, gather or amax exchange with mesh members over the transport, fuse/pack, quantize,
 * writes, completion) under a temporary-memory cap, driven by a loop that never blocks.
 *
 * Order. Tasks start first-in first-out in table order (the table is grouped by phase), each
 * only when its TMP bytes fit in the arena (the cap); the peak is reported. A task then runs
 * its ops in order. Ops that only need local work run at once on the host, or are enqueued on
 * the executor's CUDA stream; before a step that hands memory to the transport or reads it on
 * the host the task records an event and waits for it without blocking the loop.
 *
 * Exchanges. GATHER: each member writes its shard into every other member's gather inbox
 * (section of the mesh, slot of the gather, place of the member) with an immediate counted
 * there; when a member's slot has all peers' parts it unpacks them into the full tensor. AMAX:
 * the rank computes its partial block amax once, writes it into every peer's amax inbox with
 * that exchange's tag and merges what arrives from each (on a GPU, by kernels reading the
 * device inbox). Both start only when the barriers of earlier phases completed.
 *
 * Barrier. As soon as a phase's last GATHER/AMAX op on this rank completed, the rank sends one
 * immediate to every other trainer; the barrier of the phase is complete when all of theirs
 * arrived. The writes of the phase keep going meanwhile (they overlap the barrier).
 *
 * Why no deadlock under the cap: tasks start in the same relative order on every member of a
 * mesh, a member sends its part as soon as its task starts, and inboxes are static, so the
 * k-th exchange of a mesh only waits for tasks that have already started everywhere. */
#include "agent/xfer.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* T_DIRECT: a task of the direct batch (direct.c), waiting for it to finish, then announcing
 * its writes; it holds no TMP memory. */
enum tstate { T_QUEUED = 0, T_RUN, T_DIRECT, T_WRITING, T_DONE };
enum { TMP_ALIGN = 256 };

struct task {
    enum tstate st;
    uint64_t tmp_off, tmp_len;
    uint32_t op, sub; /* current op (relative) and its step */
    void *ev;         /* GPU event being waited for */
    uint64_t writes_left;
    int span_stage;
    uint64_t span_t0;
    bool waited; /* could not start at once for lack of memory */
    bool h2d;    /* H2D copies issued on the copy stream that the kernel stream must follow */
    struct ag_io_req io;   /* a sourced trainer's read for the current H2D op */
    struct wb_sum_gpu *sg; /* verify, GPU: the batch of its write sums (sums_start) */
};

static const char *M = "agent";

/* sums_finish writes records as this struct, straight into the outbox's slots */
_Static_assert(sizeof(struct wb_sum_record) == WB_SUM_RECORD, "a checksum record is 64 bytes");
_Static_assert(offsetof(struct wb_sum_record, mac) == WB_SUM_RECORD_MACED, "the MAC follows");

/* ---------------------------------------------------------------- small helpers */

static void fail(struct data *d, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void fail(struct data *d, const char *fmt, ...)
{
    if (d->fail[0])
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(d->fail, sizeof(d->fail), fmt, ap);
    va_end(ap);
}

static void span_add(struct data *d, int stage, uint32_t task, uint64_t t0, uint64_t t1)
{
    if (stage < 0 || stage >= WB_STAGE_COUNT)
        return;
    d->stats.stage_ns[stage] += t1 - t0;
    if (d->nspans < SPAN_MAX)
        d->spans[d->nspans++] = (struct span){(uint8_t)stage, task, t0, t1};
}

static void span_open(struct data *d, struct task *t, uint32_t ti, int stage)
{
    if (t->span_stage == stage) /* still in it (a step that waits comes back here) */
        return;
    uint64_t now = wb_now_ns();
    if (t->span_stage >= 0)
        span_add(d, t->span_stage, ti, t->span_t0, now);
    t->span_stage = stage;
    t->span_t0 = now;
}

static void span_close(struct data *d, struct task *t, uint32_t ti)
{
    if (t->span_stage >= 0)
        span_add(d, t->span_stage, ti, t->span_t0, wb_now_ns());
    t->span_stage = -1;
}

/* ctx of a write: attempt, peer (role bit + rank) and task, so a late completion of an aborted
 * attempt is recognized and a failure names its peer. */
static void *wctx(const struct data *d, enum wb_role role, uint32_t rank, uint32_t task)
{
    uint64_t v = ((uint64_t)d->attempt << 56) | ((uint64_t)role << 55) |
                 ((uint64_t)(rank & 0x7fffff) << 32) | (uint64_t)task;
    return (void *)(uintptr_t)v;
}

/* ---------------------------------------------------------------- the TMP arena */

static uint64_t align_up(uint64_t v)
{
    return (v + TMP_ALIGN - 1) / TMP_ALIGN * TMP_ALIGN;
}

/* First fit among the running tasks' allocations (sorted by offset as they are found). */
static bool tmp_alloc(struct data *d, uint64_t len, uint64_t *off)
{
    uint64_t need = align_up(len ? len : 1), at = 0;
    for (;;) {
        bool moved = false;
        for (uint32_t i = 0; i < d->table.ntasks; i++) {
            struct task *t = &d->tasks[i];
            if ((t->st != T_RUN && t->st != T_WRITING) || !t->tmp_len)
                continue;
            uint64_t e = t->tmp_off + align_up(t->tmp_len);
            if (t->tmp_off < at + need && at < e) {
                at = e;
                moved = true;
            }
        }
        if (!moved)
            break;
    }
    if (at + need > d->tmp_size && !(at == 0 && len <= d->tmp_size))
        return false;
    *off = at;
    return true;
}

/* ---------------------------------------------------------------- setup */

/* Inbox layout: per mesh this rank gathers in, a section; per gather of the mesh (in phase,
 * seq order), a slot of the full tensor's size; per member, its packed box at the sum of the
 * lower members' box bytes. Every member of the mesh computes the same slots. */
static int layout_gathers(struct data *d)
{
    struct wb_route_table *t = &d->table;
    d->mx.gref = calloc(t->nops ? t->nops : 1, sizeof(*d->mx.gref));
    uint64_t members = 0, cursor = 0;
    for (uint32_t i = 0; i < t->nops; i++)
        if (t->ops[i].kind == WB_OP_GATHER)
            members += t->ops[i].gather.npeers;
    d->mx.moff = calloc(members ? members : 1, sizeof(uint64_t));
    if (!d->mx.gref || !d->mx.moff)
        return -ENOMEM;
    for (uint32_t ti = 0; ti < t->ntasks; ti++) {
        const struct wb_rt_task *tk = &t->tasks[ti];
        for (uint32_t k = 0; k < tk->nops; k++) {
            const struct wb_rt_op *op = &t->ops[tk->op0 + k];
            if (op->kind != WB_OP_GATHER)
                continue;
            const struct wb_rt_gather *g = &op->gather;
            struct gsec *s = NULL;
            for (uint32_t i = 0; i < d->mx.nsec; i++)
                if (d->mx.sec[i].mesh == g->mesh)
                    s = &d->mx.sec[i];
            if (!s) {
                struct gsec *ns = realloc(d->mx.sec, (d->mx.nsec + 1) * sizeof(*ns));
                if (!ns)
                    return -ENOMEM;
                d->mx.sec = ns;
                s = &d->mx.sec[d->mx.nsec++];
                *s = (struct gsec){.mesh = g->mesh, .phase = tk->phase};
            }
            struct gref *r = &d->mx.gref[tk->op0 + k];
            const struct wb_shape *full = wb_rt_shape(t, g->dst.shape);
            r->full_bytes = wb_shape_numel(full) * wb_dtype_size(g->dst.dtype);
            r->slot = s->tag; /* count of slots so far (section tags are assigned below) */
            r->slot_off = s->off;
            s->tag++;
            s->off += r->full_bytes;
            /* members in rank order, whatever order the table lists them in */
            uint32_t n = g->npeers;
            r->moff0 = cursor;
            cursor += n;
            for (uint32_t j = 0; j < n; j++) {
                uint64_t off = 0;
                for (uint32_t q = 0; q < n; q++) {
                    const struct wb_rt_peer *p = &t->peers[g->peer0 + q];
                    if (p->rank < t->peers[g->peer0 + j].rank)
                        off += wb_box_numel(wb_rt_box(t, p->box)) * wb_dtype_size(g->dst.dtype);
                }
                d->mx.moff[r->moff0 + j] = off;
            }
        }
    }
    /* Sections back to back, except that the inbox is reused after a barrier: a phase's
     * barrier completes only once every rank has unpacked its gathers of the phase, and no
     * rank sends a later phase's parts before that. A mesh lives in one phase, and sections
     * come in phase order. Tags: one per slot, never reused. */
    uint64_t off = 0, max = 0;
    uint32_t tag = 0, group = 0;
    for (uint32_t i = 0; i < d->mx.nsec; i++) {
        uint64_t size = d->mx.sec[i].off;
        uint32_t nslots = d->mx.sec[i].tag, g = 0;
        for (uint32_t p = 0; p < d->mx.sec[i].phase && p < t->nphases; p++)
            g += t->phases[p].barrier_after;
        if (g != group) {
            group = g;
            off = 0;
        }
        d->mx.sec[i].off = off;
        d->mx.sec[i].tag = tag;
        off += size;
        tag += nslots;
        if (off > max)
            max = off;
    }
    d->mx.inbox_bytes = max;
    return tag >= (1u << IMM_TAG_BITS) ? -E2BIG : 0;
}

static const struct gsec *sec_of(const struct gsec *sec, uint32_t n, uint32_t mesh)
{
    for (uint32_t i = 0; i < n; i++)
        if (sec[i].mesh == mesh)
            return &sec[i];
    return NULL;
}

int ag_exec_setup(struct data *d, char *err, size_t errcap)
{
    struct wb_route_table *t = &d->table;
    uint32_t np = t->nphases ? t->nphases : 1;
    d->tasks = calloc(t->ntasks ? t->ntasks : 1, sizeof(*d->tasks));
    d->mx.amax_out_off = calloc(t->nops ? t->nops : 1, sizeof(uint64_t));
    d->mx.gather_ready = calloc(t->nops ? t->nops : 1, 1);
    d->mx.barrier_done = calloc(np, 1);
    d->mx.barrier_issued = calloc(np, sizeof(bool));
    d->mx.barrier_t0 = calloc(np, sizeof(uint64_t));
    d->mx.gx_total = calloc(np, sizeof(uint32_t));
    d->mx.gx_done = calloc(np, sizeof(uint32_t));
    d->spans = calloc(SPAN_MAX, sizeof(*d->spans));
    if (!d->tasks || !d->mx.amax_out_off || !d->mx.gather_ready || !d->mx.barrier_done ||
        !d->mx.barrier_issued || !d->mx.barrier_t0 || !d->mx.gx_total || !d->mx.gx_done ||
        !d->spans)
        return -ENOMEM;
    int rc = layout_gathers(d);
    if (rc) {
        snprintf(err, errcap, "gather inbox layout: %s", wb_strerror(rc));
        return rc;
    }
    for (uint32_t i = 0; i < t->namax; i++)
        if (t->amax[i].tag > d->mx.max_amax_tag)
            d->mx.max_amax_tag = t->amax[i].tag;
    d->mx.amax_arrived = calloc(d->mx.max_amax_tag + 1, 1);
    if (!d->mx.amax_arrived)
        return -ENOMEM;
    for (uint32_t ti = 0; ti < t->ntasks; ti++) {
        const struct wb_rt_task *tk = &t->tasks[ti];
        for (uint32_t k = 0; k < tk->nops; k++) {
            const struct wb_rt_op *op = &t->ops[tk->op0 + k];
            if (op->kind == WB_OP_AMAX) {
                d->mx.amax_out_off[tk->op0 + k] = d->mx.amax_out_bytes;
                d->mx.amax_out_bytes += (ag_ops_amax_bytes(t, op) + 63) / 64 * 64;
            }
            if ((op->kind == WB_OP_AMAX || op->kind == WB_OP_GATHER) && tk->phase < np)
                d->mx.gx_total[tk->phase]++;
        }
    }
    for (uint32_t i = 0; i < t->ntasks; i++)
        if (t->tasks[i].nwrites > d->max_task_writes)
            d->max_task_writes = t->tasks[i].nwrites;
    d->akeys = calloc(d->max_task_writes ? d->max_task_writes : 1, sizeof(uint64_t));
    if (!d->akeys)
        return -ENOMEM;
    if (d->verify) {
        uint32_t nw = t->nwrites ? t->nwrites : 1, mw = d->max_task_writes ? d->max_task_writes : 1;
        d->sums.wsame = calloc(nw, sizeof(uint32_t));
        d->sums.wpiece = calloc(nw, sizeof(uint32_t));
        d->sums.spiece = calloc(mw, sizeof(*d->sums.spiece));
        if (!d->sums.wsame || !d->sums.wpiece || !d->sums.spiece)
            return -ENOMEM;
        int rc =
            d->gpu ? ag_host_alloc((size_t)nw * sizeof(*d->sums.srec), (void **)&d->sums.srec) : 0;
        if (rc) {
            snprintf(err, errcap, "checksum records' staging: %s", wb_strerror(rc));
            return rc;
        }
    }
    d->mx.amax_in_bytes = t->amax_inbox_bytes;
    d->cap = t->mem_cap;
    if (t->max_tmp_bytes > d->cap) {
        snprintf(err, errcap,
                 "memory cap %" PRIu64 " bytes is below the largest task's %" PRIu64 " bytes",
                 d->cap, t->max_tmp_bytes);
        return -EINVAL;
    }
    /* The arena never needs more than all tasks together. */
    uint64_t all = 0;
    for (uint32_t i = 0; i < t->ntasks; i++)
        all += align_up(t->tasks[i].tmp_bytes);
    d->tmp_size = all < d->cap ? all : d->cap;
    d->scratch_bytes = ag_ops_scratch_need(t);
    return 0;
}

/* A task's checksum batch, back to the free list (the next task hashing on the GPU takes it). */
static void sum_release(struct data *d, struct task *tk)
{
    if (tk->sg) {
        if (d->sums.nsum_free < d->sums.cap_sum_free ||
            !wb_grow(&d->sums.sum_free, &d->sums.cap_sum_free, 8, sizeof(*d->sums.sum_free)))
            d->sums.sum_free[d->sums.nsum_free++] = tk->sg;
        else
            wb_sum_gpu_free(tk->sg);
        tk->sg = NULL;
    }
}

/* What a task holds beyond its TMP bytes: its event and checksum batch. */
static void task_release(struct data *d, struct task *tk)
{
    ag_event_destroy(tk->ev);
    tk->ev = NULL;
    sum_release(d, tk);
}

void ag_exec_free(struct data *d)
{
    ag_direct_release(d);
    for (uint32_t i = 0; d->tasks && i < d->table.ntasks; i++)
        task_release(d, &d->tasks[i]);
    for (size_t i = 0; i < d->sums.nsum_free; i++)
        wb_sum_gpu_free(d->sums.sum_free[i]);
    free(d->sums.sum_free);
    free(d->sums.wsame);
    free(d->akeys);
    free(d->sums.wpiece);
    free(d->sums.spiece);
    ag_host_free(d->sums.srec);
    free(d->tasks);
    free(d->mx.amax_out_off);
    free(d->mx.gather_ready);
    free(d->mx.barrier_done);
    free(d->mx.barrier_issued);
    free(d->mx.barrier_t0);
    free(d->mx.gx_total);
    free(d->mx.gx_done);
    free(d->spans);
    free(d->task_label);
    free(d->mx.gref);
    free(d->mx.moff);
    free(d->mx.sec);
    free(d->mx.amax_arrived);
}

/* ---------------------------------------------------------------- immediates */

void ag_exec_imm(struct data *d, uint32_t imm)
{
    enum imm_kind kind = imm_kind_of(imm);
    uint32_t tag = imm_tag_of(imm);
    if (kind == IMM_READY && tag < d->table.nrollouts) {
        if (d->rready[tag] == 0) {
            d->rready[tag] = 1;
            d->rready_left--;
        }
    } else if (kind == IMM_AMAX && tag <= d->mx.max_amax_tag) {
        d->mx.amax_arrived[tag] = 1;
    } else if (kind == IMM_BARRIER && tag < d->table.nphases) {
        d->mx.barrier_done[tag] = 1;
    } else if (kind == IMM_GATHER) {
        for (uint32_t i = 0; i < d->table.nops; i++) {
            const struct wb_rt_op *op = &d->table.ops[i];
            if (op->kind != WB_OP_GATHER)
                continue;
            const struct gsec *s = sec_of(d->mx.sec, d->mx.nsec, op->gather.mesh);
            if (s && s->tag + d->mx.gref[i].slot == tag)
                d->mx.gather_ready[i] = 1;
        }
    }
}

static void on_imm(void *arg, uint32_t tag)
{
    ag_exec_imm(arg, tag);
}

static int expect(struct data *d, uint32_t imm, uint64_t n)
{
    return wb_tx_expect(d->tx, imm, n, on_imm, d);
}

int ag_exec_arm(struct data *d)
{
    struct wb_route_table *t = &d->table;
    uint32_t np = t->nphases;
    memset(d->mx.amax_arrived, 0, d->mx.max_amax_tag + 1);
    memset(d->mx.gather_ready, 0, t->nops ? t->nops : 1);
    memset(d->mx.barrier_done, 0, np ? np : 1);
    memset(d->mx.barrier_issued, 0, (np ? np : 1) * sizeof(bool));
    memset(d->mx.gx_done, 0, (np ? np : 1) * sizeof(uint32_t));
    d->rready_left = 0;
    for (uint32_t g = 0; g < t->nrollouts; g++)
        if (d->rready[g] != 2 && d->rout[g]) {
            d->rready[g] = 3; /* out of this attempt: never waited for */
        } else if (d->rready[g] != 2 && !(d->rrelay && d->rrelay[g])) { /* relayed: not written */
            d->rready[g] = 0;
            d->rready_left++;
        }
    int rc = 0;
    for (uint32_t g = 0; !rc && g < t->nrollouts; g++)
        if (d->rready[g] == 0 && !(d->rrelay && d->rrelay[g]))
            rc = expect(d, imm_make(IMM_READY, g), 1);
    for (uint32_t i = 0; !rc && i < t->namax; i++)
        rc = expect(d, imm_make(IMM_AMAX, t->amax[i].tag), t->amax[i].writes);
    for (uint32_t i = 0; !rc && i < t->nops; i++) {
        const struct wb_rt_op *op = &t->ops[i];
        if (op->kind != WB_OP_GATHER)
            continue;
        const struct gsec *s = sec_of(d->mx.sec, d->mx.nsec, op->gather.mesh);
        rc = expect(d, imm_make(IMM_GATHER, s->tag + d->mx.gref[i].slot), op->gather.npeers - 1);
    }
    for (uint32_t p = 0; !rc && p < np; p++)
        if (t->phases[p].barrier_after)
            rc = expect(d, imm_make(IMM_BARRIER, p), t->ntrainers - 1);
    if (rc)
        fail(d, "arming immediate counters: %s", wb_tx_errmsg(d->tx));
    return rc;
}

void ag_exec_rank_out(struct data *d, uint32_t g, uint8_t why)
{
    const struct wb_route_table *t = &d->table;
    if (g >= t->nrollouts)
        return;
    if (d->rout[g] == ROUT_IN) /* its writes not posted yet are never posted */
        for (uint32_t k = 0; k < t->nwrites; k++)
            if (t->writes[k].dst_rank == g)
                d->resume.wskip[k] = 1;
    if (why == ROUT_OUT || d->rout[g] == ROUT_IN)
        d->rout[g] = why;
    if (d->rready[g] == 0) { /* its "ready" is not waited for any more */
        d->rready[g] = 3;
        d->rready_left--;
    }
}

/* Every rollout the task writes to said it is ready (its windows are open). */
static bool writes_ready(const struct data *d, uint32_t ti)
{
    const struct wb_rt_task *rt = &d->table.tasks[ti];
    if (!d->rready_left)
        return true;
    for (uint32_t k = rt->write0; k < rt->write0 + rt->nwrites; k++)
        if (!d->resume.wskip[k] && d->rready[d->table.writes[k].dst_rank] != 1)
            return false;
    return true;
}

/* ---------------------------------------------------------------- start */

/* The direct batch, the whole of it first (it needs nothing the pipeline produces) — once every
 * rollout said it is ready: its kernels store into the rollouts' memory. */
static int direct_launch(struct data *d)
{
    if (d->rready_left || d->direct_off)
        return 0;
    int rc = ag_direct_launch(d);
    if (rc)
        fail(d, "direct path: launching its kernels: %s", wb_strerror(rc));
    return rc;
}

int ag_exec_start(struct data *d)
{
    struct wb_route_table *t = &d->table;
    for (uint32_t i = 0; i < t->ntasks; i++) /* what an aborted attempt left */
        task_release(d, &d->tasks[i]);
    memset(d->tasks, 0, t->ntasks * sizeof(*d->tasks));
    for (uint32_t i = 0; i < t->ntasks; i++)
        d->tasks[i].span_stage = -1;
    d->next_task = d->tasks_done = 0;
    d->tmp_used = d->peak_tmp = 0;
    /* what this attempt sends: a task whose writes all landed earlier is skipped whole, unless
     * it exchanges with mesh peers (they run it too: an exchange needs both sides) */
    d->resume.done_bytes = d->resume.total_bytes = 0;
    for (uint32_t i = 0; i < t->ntasks; i++) {
        const struct wb_rt_task *rt = &t->tasks[i];
        uint64_t bytes = 0;
        bool all = rt->nwrites > 0, coll = false;
        for (uint32_t k = 0; k < rt->nwrites; k++) {
            if (d->resume.wskip[rt->write0 + k])
                continue;
            all = false;
            bytes += t->writes[rt->write0 + k].len;
        }
        for (uint32_t k = 0; k < rt->nops; k++)
            coll |=
                t->ops[rt->op0 + k].kind == WB_OP_AMAX || t->ops[rt->op0 + k].kind == WB_OP_GATHER;
        d->resume.tskip[i] = all && !coll;
        d->resume.task_bytes[i] = bytes;
        d->resume.total_bytes += bytes;
    }
    d->next_start_ns = 0;
    d->stats = (struct wb_xfer_stats){.rank = d->rank, .cap = d->cap};
    for (uint32_t k = 0; k < t->nwrites; k++) /* what a full update writes */
        d->stats.full_bytes += t->writes[k].len;
    int rc = ag_direct_prepare(d);
    if (rc) {
        fail(d, "direct path: %s", wb_strerror(rc));
        return rc;
    }
    ag_direct_reset(d);
    return direct_launch(d);
}

/* ---------------------------------------------------------------- posting */

/* 0 when posted; 1 when not, its rollout being out of the attempt (dropped, or a write to it
 * failed: the controller drops its replica or ends the attempt); else a failure. */
static int post(struct data *d, struct task *tk, uint32_t ti, struct wb_tx_write *w,
                enum wb_role role, uint32_t rank)
{
    if (role == WB_ROLE_ROLLOUT && d->rout[rank])
        return 1;
    w->ctx = wctx(d, role, rank, ti);
    /* relaying: a root's rollout forwards each piece as soon as it is placed */
    w->progress = role == WB_ROLE_ROLLOUT && d->relaying;
    int rc = wb_tx_write(d->tx, w);
    if (rc && role == WB_ROLE_ROLLOUT && rc == -WB_E_PEER) {
        wb_log(WB_LOG_WARN, M,
               "trainer rank %u: rollout rank %u is gone (%s): nothing more is "
               "written to it",
               d->rank, rank, wb_tx_errmsg(d->tx));
        ag_exec_rank_out(d, rank, ROUT_LOST);
        return 1;
    }
    if (rc) {
        fail(d, "write to %s rank %u (%" PRIu64 " bytes at %" PRIu64 "): %s", wb_role_name(role),
             rank, w->len, w->dst_off, wb_tx_errmsg(d->tx));
        return rc;
    }
    tk->writes_left++;
    d->outstanding++;
    return 0;
}

/* The first byte of table write wr's source; NULL for a shard not held here. */
static const uint8_t *write_src(const struct data *d, const struct task *tk,
                                const struct wb_rt_write *wr)
{
    if (wr->src_tensor == (uint32_t)WB_RT_TMP_SRC)
        return (const uint8_t *)d->tmp + tk->tmp_off + wr->src_off;
    uint32_t s = wr->src_tensor < d->ntensors ? d->shard_of[wr->src_tensor] : 0;
    return s && d->shards[s - 1].ptr ? d->shards[s - 1].ptr + wr->src_off : NULL;
}

/* Verify, first half: the wb_sum64 of each of the task's writes, once per distinct source (the
 * same bytes go to every replica; an earlier write of the task with the same source, among the
 * 64 before it, lends its sum). GPU memory: one batch over the task's distinct sources,
 * enqueued behind the task's kernels, read once the task's event fired (sums_finish); host
 * memory (host-resident shards too): wb_sum64 at once. */
static int sums_start(struct data *d, struct task *tk, uint32_t ti)
{
    const struct wb_route_table *t = &d->table;
    const struct wb_rt_task *rt = &t->tasks[ti];
    uint32_t np = 0;
    for (uint32_t k = rt->write0; k < rt->write0 + rt->nwrites; k++) {
        const struct wb_rt_write *wr = &t->writes[k];
        if (d->resume.wskip[k]) /* landed in an earlier attempt of this version */
            continue;
        d->sums.wsame[k] = k;
        for (uint32_t j = k, n = 0; j-- > rt->write0 && n < 64; n++) {
            const struct wb_rt_write *o = &t->writes[j];
            if (!d->resume.wskip[j] && o->src_tensor == wr->src_tensor &&
                o->src_off == wr->src_off && o->len == wr->len) {
                d->sums.wsame[k] = d->sums.wsame[j];
                break;
            }
        }
        if (d->sums.wsame[k] != k)
            continue;
        const uint8_t *src = write_src(d, tk, wr);
        if (!src) {
            fail(d, "write source tensor %u is not held here", wr->src_tensor);
            return -EINVAL;
        }
        bool dev = d->gpu && (wr->src_tensor == (uint32_t)WB_RT_TMP_SRC || !d->param_host);
        d->sums.wpiece[k] = dev ? np : UINT32_MAX;
        if (dev)
            d->sums.spiece[np++] = (struct wb_sum_piece){src, wr->len};
        else
            d->sums.whash[k] = wb_sum64(src, wr->len);
    }
    if (!np)
        return 0;
    int rc = 0;
    if (d->sums.nsum_free)
        tk->sg = d->sums.sum_free[--d->sums.nsum_free];
    else
        rc = wb_sum_gpu_new(&tk->sg);
    rc = rc ? rc : wb_sum_gpu_launch(tk->sg, d->sums.spiece, np, d->stream);
    if (rc)
        fail(d, "task %u: checksums of its writes on the GPU: %s", ti, wb_strerror(rc));
    return rc;
}

/* Verify, second half: the sums of the task's writes, then their records (where each lands,
 * its sum) into the task's slots of the checksum outbox: GPU memory by one copy on the records'
 * own stream, which the task's event then waits for (nothing else queues there); host memory
 * at once. */
static int sums_finish(struct data *d, struct task *tk, uint32_t ti)
{
    const struct wb_route_table *t = &d->table;
    const struct wb_rt_task *rt = &t->tasks[ti];
    struct wb_sum_record *rec =
        d->gpu ? d->sums.srec : (struct wb_sum_record *)d->sums.sum_out; /* both [table.nwrites] */
    for (uint32_t k = rt->write0; k < rt->write0 + rt->nwrites; k++) {
        const struct wb_rt_write *wr = &t->writes[k];
        if (d->resume.wskip[k]) {
            rec[k] = (struct wb_sum_record){0};
            continue;
        }
        if (d->sums.wsame[k] != k)
            d->sums.whash[k] =
                d->sums.whash[d->sums.wsame[k]]; /* earlier in the task: already final */
        else if (d->sums.wpiece[k] != UINT32_MAX)
            d->sums.whash[k] = wb_sum_gpu_result(tk->sg, d->sums.wpiece[k]);
        rec[k] = (struct wb_sum_record){.dst_off = wr->dst_off,
                                        .len = wr->len,
                                        .sum = d->sums.whash[k],
                                        .trainer = d->rank,
                                        .tensor = wr->dst_tensor,
                                        .epoch = d->epoch,
                                        .version = d->version};
        rec[k].mac = wb_siphash(d->key, &rec[k], WB_SUM_RECORD_MACED);
    }
    sum_release(d, tk); /* its batch is read: free for the next task */
    if (!d->gpu)
        return 0;
    uint64_t at = (uint64_t)rt->write0 * WB_SUM_RECORD;
    int rc = ag_copy_async((uint8_t *)d->sums.sum_out + at, (uint8_t *)d->sums.srec + at,
                           (size_t)rt->nwrites * WB_SUM_RECORD, d->sum_stream);
    rc = rc ? rc : ag_event_record(d->sum_stream, &tk->ev);
    if (rc)
        fail(d, "task %u: checksum records: %s", ti, wb_strerror(rc));
    return rc;
}

/* Verify: write k's record (sums_finish put it in the outbox) into its rollout's checksum
 * inbox, counted there under the write's tag with the sum bit. */
static int post_record(struct data *d, struct task *tk, uint32_t ti, uint32_t k, struct peer *p)
{
    const struct wb_rt_write *wr = &d->table.writes[k];
    if (!p->has_sums) {
        fail(d, "rollout rank %u published no checksum inbox", wr->dst_rank);
        return -EINVAL;
    }
    struct wb_tx_write w = {.src = d->sums.sum_out_mr,
                            .src_off = (uint64_t)k * WB_SUM_RECORD,
                            .peer = p->idx,
                            .dst = &p->sums,
                            .dst_off = (uint64_t)d->sums.slot[k] * WB_SUM_RECORD,
                            .len = WB_SUM_RECORD,
                            .has_imm = true,
                            .imm = imm_make(IMM_DATA, wr->tag | IMM_SUM_BIT)};
    return post(d, tk, ti, &w, WB_ROLE_ROLLOUT, wr->dst_rank);
}

static int post_writes(struct data *d, struct task *tk, uint32_t ti)
{
    const struct wb_route_table *t = &d->table;
    const struct wb_rt_task *rt = &t->tasks[ti];
    if (d->verify && !d->gpu) { /* on the GPU, step_task did both before */
        int rc = sums_start(d, tk, ti);
        rc = rc ? rc : sums_finish(d, tk, ti);
        if (rc)
            return rc;
    }
    for (uint32_t k = 0; k < rt->nwrites; k++) {
        if (d->resume.wskip[rt->write0 + k]) /* landed in an earlier attempt of this version */
            continue;
        const struct wb_rt_write *wr = &t->writes[rt->write0 + k];
        struct peer *p = wr->dst_rank < t->nrollouts ? &d->rpeer[wr->dst_rank] : NULL;
        const struct wb_tx_rdesc *dst = NULL;
        for (uint32_t i = 0; p && p->present && i < p->nreg; i++)
            if (p->reg_tensor[i] == wr->dst_tensor)
                dst = &p->reg[i];
        if (!dst) {
            fail(d, "rollout rank %u has no registered region for tensor %u", wr->dst_rank,
                 wr->dst_tensor);
            return -EINVAL;
        }
        struct wb_tx_write w = {.peer = p->idx,
                                .dst = dst,
                                .dst_off = wr->dst_off,
                                .len = wr->len,
                                .has_imm = true,
                                .imm = imm_make(IMM_DATA, wr->tag)};
        if (wr->src_tensor == (uint32_t)WB_RT_TMP_SRC) {
            w.src = d->tmp_mr;
            w.src_off = tk->tmp_off + wr->src_off;
        } else {
            uint32_t s = wr->src_tensor < d->ntensors ? d->shard_of[wr->src_tensor] : 0;
            if (!s) {
                fail(d, "write source tensor %u is not held here", wr->src_tensor);
                return -EINVAL;
            }
            w.src = d->shards[s - 1].mr;
            w.src_off = d->shards[s - 1].mr_off + wr->src_off;
        }
        int rc = d->delta ? ag_delta_write(d, rt->write0 + k, write_src(d, tk, wr), p, &w) : 0;
        rc = rc < 0 ? rc : post(d, tk, ti, &w, WB_ROLE_ROLLOUT, wr->dst_rank);
        if (!rc && d->verify)
            rc = post_record(d, tk, ti, rt->write0 + k, p);
        if (rc > 0) /* its rollout is out of the attempt */
            continue;
        if (rc)
            return rc;
        d->stats.bytes += w.len;
        d->stats.writes++;
    }
    return 0;
}

/* GATHER, first half: my part into every other member's inbox slot. */
static int gather_send(struct data *d, struct task *tk, uint32_t ti, uint32_t opi)
{
    const struct wb_route_table *t = &d->table;
    const struct wb_rt_gather *g = &t->ops[opi].gather;
    const struct gref *r = &d->mx.gref[opi];
    uint32_t me = UINT32_MAX;
    for (uint32_t j = 0; j < g->npeers; j++)
        if (t->peers[g->peer0 + j].rank == d->rank)
            me = j;
    if (me == UINT32_MAX)
        return -EINVAL;
    uint64_t len =
        wb_box_numel(wb_rt_box(t, t->peers[g->peer0 + me].box)) * wb_dtype_size(g->src.dtype);
    struct wb_tx_write w = {.len = len, .has_imm = true};
    if (g->src.kind == WB_BUF_TMP) {
        w.src = d->tmp_mr;
        w.src_off = tk->tmp_off + g->src.off;
    } else {
        uint32_t s = d->shard_of[g->src.tensor];
        w.src = d->shards[s - 1].mr;
        w.src_off = d->shards[s - 1].mr_off + g->src.off;
    }
    for (uint32_t j = 0; j < g->npeers; j++) {
        uint32_t rank = t->peers[g->peer0 + j].rank;
        if (j == me)
            continue;
        struct peer *p = rank < t->ntrainers ? &d->tpeer[rank] : NULL;
        const struct gsec *s = p && p->present ? sec_of(p->sec, p->nsec, g->mesh) : NULL;
        if (!s || !p->has_inbox) {
            fail(d, "trainer rank %u published no gather inbox for mesh %u", rank, g->mesh);
            return -EINVAL;
        }
        w.peer = p->idx;
        w.dst = &p->inbox;
        w.dst_off = s->off + r->slot_off + d->mx.moff[r->moff0 + me];
        w.imm = imm_make(IMM_GATHER, s->tag + r->slot);
        int rc = post(d, tk, ti, &w, WB_ROLE_TRAINER, rank);
        if (rc)
            return rc;
    }
    return 0;
}

/* GATHER, second half: every member's part into the full tensor. */
static int gather_unpack(struct data *d, const struct opctx *c, uint32_t opi)
{
    const struct wb_route_table *t = &d->table;
    const struct wb_rt_op *op = &t->ops[opi];
    const struct wb_rt_gather *g = &op->gather;
    const struct gsec *s = sec_of(d->mx.sec, d->mx.nsec, g->mesh);
    for (uint32_t j = 0; j < g->npeers; j++) {
        const void *src;
        if (t->peers[g->peer0 + j].rank == d->rank)
            src = ag_ops_view_ptr(c, &g->src);
        else
            src = (uint8_t *)d->mx.inbox + s->off + d->mx.gref[opi].slot_off +
                  d->mx.moff[d->mx.gref[opi].moff0 + j];
        int rc = ag_ops_unpack_member(c, op, j, src);
        if (rc)
            return rc;
    }
    return 0;
}

static bool barriers_ok(const struct data *d, uint32_t phase)
{
    for (uint32_t p = 0; p < phase && p < d->table.nphases; p++)
        if (d->table.phases[p].barrier_after && !d->mx.barrier_done[p])
            return false;
    return true;
}

/* ---------------------------------------------------------------- stepping a task */

enum { STEP_WAIT = 0, STEP_NEXT = 1 };

/* Records an event (GPU) so the next step runs when the work issued so far is done. */
static int sync_point(struct data *d, struct task *tk)
{
    if (!d->gpu)
        return 0;
    return ag_event_record(d->stream, &tk->ev);
}

static int step_amax(struct data *d, struct task *tk, uint32_t ti, const struct opctx *c,
                     uint32_t opi)
{
    const struct wb_route_table *t = &d->table;
    const struct wb_rt_op *op = &t->ops[opi];
    const struct wb_rt_amax *a = &op->amax;
    uint64_t nb = ag_ops_amax_bytes(t, op);
    int rc = 0;
    switch (tk->sub) {
    case 0: { /* my region's partial amax, arranged over the op's blocks into the outbox */
        if (!barriers_ok(d, t->tasks[ti].phase))
            return STEP_WAIT;
        span_open(d, tk, ti, WB_STAGE_GATHER);
        float *out = (float *)((uint8_t *)d->mx.amax_out + d->mx.amax_out_off[opi]);
        if (d->gpu) { /* all on the device: one event, before the writes read the outbox */
            if ((rc = ag_ops_amax_partial(c, op, d->scratch[1], NULL)) != 0 ||
                (rc = ag_ops_amax_blocks(c, op, d->scratch[1], out)) != 0)
                return rc;
            tk->sub = 2;
            return (rc = sync_point(d, tk)) ? rc : STEP_WAIT;
        }
        /* host memory: partial and arrangement in this one call, through the host scratch
         * (its scratch_bytes cover the op's source box in FP32, more than its blocks) */
        if ((rc = ag_ops_amax_partial(c, op, d->scratch[1], d->hscratch)) != 0 ||
            (rc = ag_ops_amax_blocks(c, op, d->hscratch, out)) != 0)
            return rc;
        tk->sub = 2;
    }
    /* fall through */
    case 2: { /* the one partial to every peer */
        for (uint32_t k = 0; k < a->npeers; k++) {
            const struct wb_rt_amax_peer *pe = &t->amax_peers[a->peer0 + k];
            struct peer *p = &d->tpeer[pe->rank]; /* decode checked the rank */
            if (!p->present || !p->has_amax) {
                fail(d, "trainer rank %u published no amax inbox", pe->rank);
                return -EINVAL;
            }
            struct wb_tx_write w = {.src = d->mx.amax_out_mr,
                                    .src_off = d->mx.amax_out_off[opi],
                                    .peer = p->idx,
                                    .dst = &p->amaxbox,
                                    .dst_off = pe->peer_inbox_off,
                                    .len = nb,
                                    .has_imm = true,
                                    .imm = imm_make(IMM_AMAX, pe->tag)};
            if ((rc = post(d, tk, ti, &w, WB_ROLE_TRAINER, pe->rank)) != 0)
                return rc;
        }
        tk->sub = 3;
    }
    /* fall through */
    case 3: { /* every peer's partial, merged into the task's amax grid (on a GPU by a kernel
               * reading the device inbox, ahead of the QUANT op on the same stream) */
        const struct wb_rt_amax_peer *P = &t->amax_peers[a->peer0];
        for (uint32_t k = 0; k < a->npeers; k++)
            if (P[k].tag > d->mx.max_amax_tag || !d->mx.amax_arrived[P[k].tag])
                return STEP_WAIT;
        float *grid = (float *)(c->tmp + a->amax_off);
        for (uint32_t k = 0; k < a->npeers; k++)
            if ((rc = ag_ops_amax_into_grid(
                     c, op, (const float *)((uint8_t *)d->mx.amax_in + P[k].inbox_off), grid)) != 0)
                return rc;
        break;
    }
    }
    d->mx.gx_done[t->tasks[ti].phase]++;
    return STEP_NEXT;
}

static int step_gather(struct data *d, struct task *tk, uint32_t ti, const struct opctx *c,
                       uint32_t opi)
{
    int rc;
    switch (tk->sub) {
    case 0:
        if (!barriers_ok(d, d->table.tasks[ti].phase))
            return STEP_WAIT;
        span_open(d, tk, ti, WB_STAGE_GATHER);
        tk->sub = 1;
        if (d->gpu)
            return (rc = sync_point(d, tk)) ? rc : STEP_WAIT;
    /* fall through */
    case 1:
        if ((rc = gather_send(d, tk, ti, opi)) != 0)
            return rc;
        tk->sub = 2;
    /* fall through */
    case 2:
        if (!d->mx.gather_ready[opi])
            return STEP_WAIT;
        if ((rc = gather_unpack(d, c, opi)) != 0)
            return rc;
    }
    d->mx.gx_done[d->table.tasks[ti].phase]++;
    return STEP_NEXT;
}

/* H2D of a sourced shard: the bytes are read from the source on an I/O thread, into TMP (host
 * memory) or into its pinned mirror and then copied to the GPU. */
static int step_read(struct data *d, struct task *tk, const struct opctx *c,
                     const struct wb_rt_op *op, const struct shard *sh)
{
    const struct wb_rt_h2d *h = &op->h2d;
    if (tk->sub == 0) {
        if (!h->bytes)
            return STEP_NEXT;
        tk->io = (struct ag_io_req){.index = (uint32_t)sh->src_index,
                                    .off = h->src_off,
                                    .len = h->bytes,
                                    .dst = d->gpu ? d->stage + tk->tmp_off + h->dst_off
                                                  : c->tmp + h->dst_off};
        ag_io_submit(d->io, &tk->io);
        tk->sub = 1;
        return STEP_WAIT;
    }
    if (!ag_io_done(&tk->io))
        return STEP_WAIT;
    if (tk->io.rc) {
        fail(d, "trainer rank %u: reading %s: %s", d->rank, sh->meta.name, tk->io.msg);
        return tk->io.rc;
    }
    int rc = d->gpu ? ag_copy_async(c->tmp + h->dst_off, tk->io.dst, h->bytes, d->stream) : 0;
    return rc ? rc : STEP_NEXT;
}

static int cmp_key(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* A direct task once the batch is done: one immediate per write it stands for, counted at its
 * rollout exactly as the write's own would be — all of the task's writes to one rollout tensor
 * in one note (a note costs its MAC and a replay-set entry at each end, and a task's tiles
 * alternate between a tensor's values and its scales). */
static int announce_direct(struct data *d, struct task *tk, uint32_t ti)
{
    const struct wb_route_table *t = &d->table;
    const struct wb_rt_task *rt = &t->tasks[ti];
    span_open(d, tk, ti, WB_STAGE_WRITE);
    uint32_t nk = 0;
    for (uint32_t k = 0; k < rt->nwrites; k++) {
        const struct wb_rt_write *wr = &t->writes[rt->write0 + k];
        d->akeys[nk++] = (uint64_t)wr->dst_rank << 32 | wr->tag;
        if (!ag_direct_sent_delta(d)) /* else counted as stored, when the batch finished */
            d->stats.bytes += wr->len;
    }
    qsort(d->akeys, nk, sizeof(*d->akeys), cmp_key);
    for (uint32_t k = 0; k < nk;) {
        uint32_t n = 1, rank = (uint32_t)(d->akeys[k] >> 32), tag = (uint32_t)d->akeys[k];
        while (k + n < nk && d->akeys[k + n] == d->akeys[k])
            n++;
        if (d->rout[rank]) { /* dropped from the attempt meanwhile */
            k += n;
            continue;
        }
        int rc = wb_tx_write_imms(d->tx, d->rpeer[rank].idx, imm_make(IMM_DATA, tag), n,
                                  wctx(d, WB_ROLE_ROLLOUT, rank, ti));
        if (rc) {
            fail(d, "announcing writes to rollout rank %u: %s", rank, wb_tx_errmsg(d->tx));
            return rc;
        }
        tk->writes_left++;
        d->outstanding++;
        d->stats.writes += n;
        k += n;
    }
    tk->st = T_WRITING;
    return 0;
}

static int step_task(struct data *d, uint32_t ti)
{
    struct task *tk = &d->tasks[ti];
    const struct wb_rt_task *rt = &d->table.tasks[ti];
    struct opctx c = {d, tk, (uint8_t *)d->tmp + tk->tmp_off};
    if (tk->st == T_DIRECT) {
        if (!ag_direct_done(d))
            return 0;
        int r = announce_direct(d, tk, ti);
        if (r)
            return r;
    }
    if (tk->ev) {
        int r = ag_event_done(tk->ev);
        if (r <= 0)
            return r;
        ag_event_destroy(tk->ev);
        tk->ev = NULL;
    }
    while (tk->st == T_RUN && tk->op < rt->nops) {
        uint32_t opi = rt->op0 + tk->op;
        const struct wb_rt_op *op = &d->table.ops[opi];
        int r = 0;
        if (tk->h2d && op->kind != WB_OP_H2D) { /* the kernels read what the copies wrote */
            tk->h2d = false;
            if ((r = ag_stream_order(d->h2d_stream, d->stream)) != 0) {
                fail(d, "task %u: ordering its copies: %s", ti, wb_strerror(r));
                return r;
            }
        }
        switch (op->kind) {
        case WB_OP_H2D: { /* on the copy stream: the next task's copies overlap this one's kernels
                           */
            span_open(d, tk, ti, WB_STAGE_H2D);
            uint32_t s = d->shard_of[op->tensor];
            if (d->shards[s - 1].src_index >= 0) {
                r = step_read(d, tk, &c, op, &d->shards[s - 1]);
                break;
            }
            const uint8_t *src = (const uint8_t *)d->shards[s - 1].ptr + op->h2d.src_off;
            if (d->gpu) {
                r = ag_copy_async(c.tmp + op->h2d.dst_off, src, op->h2d.bytes, d->h2d_stream);
                tk->h2d = true;
            } else {
                memcpy(c.tmp + op->h2d.dst_off, src, op->h2d.bytes);
            }
            r = r ? r : STEP_NEXT;
            break;
        }
        case WB_OP_COPY:
        case WB_OP_CAST:
            span_open(d, tk, ti, WB_STAGE_FUSE);
            r = ag_ops_copy(&c, op);
            r = r ? r : STEP_NEXT;
            break;
        case WB_OP_PERMUTE: /* a layout change, like a fuse or pack */
            span_open(d, tk, ti, WB_STAGE_FUSE);
            r = ag_ops_permute(&c, op);
            r = r ? r : STEP_NEXT;
            break;
        case WB_OP_QUANT:
            span_open(d, tk, ti, WB_STAGE_QUANT);
            r = ag_ops_quant(&c, op);
            r = r ? r : STEP_NEXT;
            break;
        case WB_OP_GATHER:
            r = step_gather(d, tk, ti, &c, opi);
            break;
        case WB_OP_AMAX:
            r = step_amax(d, tk, ti, &c, opi);
            break;
        }
        if (r < 0) {
            fail(d, "task %u op %u (%s): %s", ti, tk->op,
                 op->kind == WB_OP_QUANT     ? "quantize"
                 : op->kind == WB_OP_GATHER  ? "gather"
                 : op->kind == WB_OP_AMAX    ? "amax"
                 : op->kind == WB_OP_PERMUTE ? "permute"
                                             : "copy",
                 wb_strerror(r));
            return r;
        }
        if (r == STEP_WAIT)
            return 0;
        if (!d->gpu)
            span_close(d, tk, ti);
        tk->op++;
        tk->sub = 0;
    }
    if (tk->st == T_RUN) { /* every op issued: wait for them, then write */
        if (d->gpu && tk->sub == 0) {
            tk->sub = 1;
            int r = tk->h2d ? ag_stream_order(d->h2d_stream, d->stream) : 0;
            tk->h2d = false;
            /* verify: the sums' kernel right behind the task's own, so the event covers both */
            r = r || !d->verify ? r : sums_start(d, tk, ti);
            r = r ? r : sync_point(d, tk);
            return r < 0 ? r : 0;
        }
        span_open(d, tk, ti, WB_STAGE_WRITE);
        if (d->gpu && d->verify && tk->sub == 1) { /* the sums are in: the records out first */
            tk->sub = 2;
            int r = sums_finish(d, tk, ti);
            return r < 0 ? r : 0;
        }
        if (!writes_ready(d, ti))
            return 0; /* a rollout it writes to has not opened its windows yet */
        tk->st = T_WRITING;
        int r = post_writes(d, tk, ti);
        if (r)
            return r;
    }
    if (tk->st == T_WRITING && tk->writes_left == 0) {
        span_close(d, tk, ti);
        tk->st = T_DONE;
        d->tmp_used -= tk->tmp_len;
        d->tasks_done++;
        d->resume.done_bytes += d->resume.task_bytes[ti];
    }
    return 0;
}

/* ---------------------------------------------------------------- the loop's step */

void ag_exec_event(struct data *d, const struct wb_tx_event *ev)
{
    if (ev->kind != WB_TX_EV_WRITE)
        return;
    uint64_t v = (uint64_t)(uintptr_t)ev->ctx;
    if (d->outstanding)
        d->outstanding--;
    if (v == UINT64_MAX) /* the warm-up immediate of ag_data_peers() */
        return;
    uint32_t ti = (uint32_t)v, rank = (uint32_t)(v >> 32) & 0x7fffff;
    enum wb_role role = (enum wb_role)((v >> 55) & 1);
    bool mine = d->active && ((v >> 56) & 0xff) == d->attempt;
    /* A failed write to a rollout ends that rollout's part, not the attempt: the controller
     * drops its replica (the report waits for that) or, where too few replicas would be left,
     * ends the attempt. A trainer's failure ends it here. */
    if (ev->err && mine && role == WB_ROLE_ROLLOUT && rank < d->table.nrollouts) {
        if (d->rout[rank] == ROUT_IN)
            wb_log(WB_LOG_WARN, M,
                   "trainer rank %u: a write to rollout rank %u failed: %s; nothing more is "
                   "written to it",
                   d->rank, rank,
                   ev->err == -WB_E_PEER ? "the peer died or failed" : wb_strerror(ev->err));
        ag_exec_rank_out(d, rank, ROUT_LOST);
    } else if (ev->err && mine) {
        fail(d, "write to %s rank %u failed: %s", wb_role_name(role), rank,
             ev->err == -WB_E_PEER ? "the peer died or failed" : wb_strerror(ev->err));
    }
    if (mine && ti < d->table.ntasks && d->tasks[ti].writes_left)
        d->tasks[ti].writes_left--;
}

static void issue_barriers(struct data *d)
{
    const struct wb_route_table *t = &d->table;
    for (uint32_t p = 0; p < t->nphases; p++) {
        if (!t->phases[p].barrier_after || d->mx.barrier_issued[p] ||
            d->mx.gx_done[p] < d->mx.gx_total[p])
            continue;
        d->mx.barrier_issued[p] = true;
        d->mx.barrier_t0[p] = wb_now_ns();
        for (uint32_t r = 0; r < t->ntrainers; r++) {
            if (r == d->rank)
                continue;
            struct peer *pp = &d->tpeer[r];
            int rc = pp->present ? wb_tx_write_imm(d->tx, pp->idx, imm_make(IMM_BARRIER, p),
                                                   wctx(d, WB_ROLE_TRAINER, r, UINT32_MAX))
                                 : -EINVAL;
            if (rc) {
                fail(d, "barrier after phase %u to trainer rank %u: %s", p, r,
                     pp->present ? wb_tx_errmsg(d->tx) : "no address");
                return;
            }
            d->outstanding++;
        }
    }
    /* a barrier's span: from issue to the last peer's arrival */
    for (uint32_t p = 0; p < t->nphases; p++)
        if (d->mx.barrier_issued[p] && d->mx.barrier_done[p] == 1) {
            d->mx.barrier_done[p] = 2;
            /* a barrier's span holds its phase where a task's holds the task */
            span_add(d, WB_STAGE_BARRIER, p, d->mx.barrier_t0[p], wb_now_ns());
        }
}

int ag_exec_step(struct data *d)
{
    const struct wb_route_table *t = &d->table;
    uint64_t now = wb_now_ns();
    if (d->fail[0])
        return 1;
    /* start tasks in order while their memory fits */
    while (d->next_task < t->ntasks) {
        struct task *tk = &d->tasks[d->next_task];
        uint64_t need = t->tasks[d->next_task].tmp_bytes, off = 0;
        if (d->resume
                .tskip[d->next_task]) { /* every write landed earlier: nothing to read or send */
            tk->st = T_DONE;
            d->tasks_done++;
            d->next_task++;
            continue;
        }
        if (!d->direct_off && ag_direct_has(d, d->next_task)) {
            tk->st = T_DIRECT;
            tk->span_stage = -1;
            d->next_task++;
            continue;
        }
        if (d->o->pace_ns && now < d->next_start_ns)
            break;
        if (need && !tmp_alloc(d, need, &off)) {
            if (!tk->waited) {
                tk->waited = true;
                d->stats.mem_waits++;
            }
            break;
        }
        tk->st = T_RUN;
        tk->tmp_off = off;
        tk->tmp_len = need;
        tk->span_stage = -1;
        d->tmp_used += need;
        if (d->tmp_used > d->peak_tmp)
            d->peak_tmp = d->tmp_used;
        /* The amax grids the task's AMAX ops merge into start at zero. Only the grids: on a
         * GPU this runs on the kernel stream while the task's H2D copies fill other TMP ranges
         * on the copy stream, which does not wait for it. */
        const struct wb_rt_task *rt = &t->tasks[d->next_task];
        for (uint32_t k = 0; k < rt->nops; k++) {
            const struct wb_rt_op *op = &t->ops[rt->op0 + k];
            if (op->kind != WB_OP_QUANT || op->quant.amax_off == (uint64_t)WB_RT_NONE)
                continue;
            uint64_t n = wb_box_numel(wb_rt_box(t, op->quant.grid)) * sizeof(float);
            if (op->quant.amax_off > need || n > need - op->quant.amax_off)
                continue; /* past the task's TMP: not ours to write */
            uint8_t *grid = (uint8_t *)d->tmp + off + op->quant.amax_off;
            if (d->gpu)
                ag_memset_async(grid, 0, n, d->stream);
            else
                memset(grid, 0, n);
        }
        d->next_task++;
        d->next_start_ns = now + d->o->pace_ns;
        if (d->o->pace_ns)
            break;
    }
    if (direct_launch(d))
        return 1;
    uint64_t dt0 = 0;
    int r = ag_direct_poll(d, &dt0);
    if (r < 0)
        fail(d, "direct path: its kernels failed: %s", wb_strerror(r));
    if (r > 0) {
        span_add(d, WB_STAGE_QUANT, UINT32_MAX, dt0, wb_now_ns());
        wb_log(WB_LOG_DEBUG, M, "trainer rank %u: direct batch done %.3f ms after the start",
               d->rank, (double)(wb_now_ns() - d->start_ns) / 1e6);
    }
    for (uint32_t i = 0; i < d->next_task && !d->fail[0]; i++) {
        if (d->tasks[i].st == T_DONE)
            continue;
        if (step_task(d, i) < 0)
            break;
    }
    issue_barriers(d);
    if (d->fail[0])
        return 1;
    if (d->tasks_done < t->ntasks)
        return 0;
    for (uint32_t p = 0; p < t->nphases; p++)
        if (t->phases[p].barrier_after && !d->mx.barrier_done[p])
            return 0;
    for (uint32_t g = 0; g < t->nrollouts; g++)
        if (d->rout[g] == ROUT_LOST) /* its replica's DROP (or the abort) comes next */
            return 0;
    wb_log(WB_LOG_DEBUG, M, "trainer rank %u: every write complete %.3f ms after the start",
           d->rank, (double)(wb_now_ns() - d->start_ns) / 1e6);
    d->stats.tasks = t->ntasks;
    d->stats.peak_tmp = d->peak_tmp;
    d->stats.cap = d->cap;
    return 1;
}

void ag_exec_abort(struct data *d)
{
    ag_direct_reset(d);
    if (d->io) /* reads not started are dropped; TMP waits for the running ones */
        ag_io_cancel(d->io);
    for (uint32_t i = 0; d->tasks && i < d->table.ntasks; i++) {
        ag_event_destroy(d->tasks[i].ev);
        d->tasks[i].ev = NULL;
    }
}
