/* json.c — wb_plan_write_json(): the plan as JSON that can be audited on its own.
 *
 * With tables the file holds everything a reader needs to check the plan without this code:
 * both inventories (names, dtypes, shapes), every trainer tensor's owners and the shard box
 * each holds, the mappings, every routing table (ops and writes in compact arrays whose
 * layouts are described in the file's "layouts" key) and every receive list (local tensors,
 * the bytes of each that must be written, the counts per tag). It is one JSON document, laid
 * out one inventory entry, table or receive list per line so that a reader can stream it;
 * tests/sh/plan_audit.py is such a reader.
 *
 * It is written by hand into a buffer (no JSON objects are built): Kimi-K2 256 -> 128 has 10.5M
 * writes and 2.9M ops; building jansson objects for them took 38 s and 1.07 GB of text. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "planner/plan_int.h"

/* 6: the component map of every mapping and the global boxes of every rollout rank's local
 * tensors (what a reader needs to check what each write means, not only where it lands); 5:
 * an amax op lists its peers; 4: write records with their replica fan-out; 3: self-contained,
 * compact arrays; 2: jansson objects */
enum { JSON_FORMAT = 6 };

struct jw {
    FILE *f;
    size_t n;
    int err;
    char buf[1 << 16];
};

static void jw_flush(struct jw *w)
{
    if (w->n && !w->err && fwrite(w->buf, 1, w->n, w->f) != w->n)
        w->err = -EIO;
    w->n = 0;
}

static inline void jw_need(struct jw *w, size_t n)
{
    if (w->n + n > sizeof(w->buf))
        jw_flush(w);
}

static void jw_raw(struct jw *w, const char *s)
{
    size_t n = strlen(s);
    if (n > sizeof(w->buf) / 2) {
        jw_flush(w);
        if (!w->err && fwrite(s, 1, n, w->f) != n)
            w->err = -EIO;
        return;
    }
    jw_need(w, n);
    memcpy(w->buf + w->n, s, n);
    w->n += n;
}

static inline void jw_ch(struct jw *w, char c)
{
    jw_need(w, 1);
    w->buf[w->n++] = c;
}

static inline void jw_u64(struct jw *w, uint64_t v)
{
    char t[24];
    int k = 0;
    do {
        t[k++] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    jw_need(w, 24);
    while (k)
        w->buf[w->n++] = t[--k];
}

/* A value that may be "none" (WB_RT_NONE / WB_RT_TMP_SRC): -1. */
static inline void jw_opt(struct jw *w, uint64_t v, uint64_t none)
{
    if (v == none)
        jw_raw(w, "-1");
    else
        jw_u64(w, v);
}

/* ,v */
static inline void jw_cu(struct jw *w, uint64_t v)
{
    jw_ch(w, ',');
    jw_u64(w, v);
}

static void jw_str(struct jw *w, const char *s)
{
    jw_ch(w, '"');
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') {
            jw_ch(w, '\\');
            jw_ch(w, (char)c);
        } else if (c < 0x20) {
            char e[8];
            snprintf(e, sizeof(e), "\\u%04x", c);
            jw_raw(w, e);
        } else {
            jw_ch(w, (char)c);
        }
    }
    jw_ch(w, '"');
}

static void jw_u64s(struct jw *w, const uint64_t *v, uint32_t n)
{
    jw_ch(w, '[');
    for (uint32_t i = 0; i < n; i++) {
        if (i)
            jw_ch(w, ',');
        jw_u64(w, v[i]);
    }
    jw_ch(w, ']');
}

static void jw_shape(struct jw *w, const struct wb_shape *s)
{
    jw_ch(w, '[');
    for (uint32_t d = 0; d < s->ndim; d++) {
        if (d)
            jw_ch(w, ',');
        jw_u64(w, s->dim[d]);
    }
    jw_ch(w, ']');
}

/* [[off, end], ...] per dim */
static void jw_box(struct jw *w, const struct wb_box *b)
{
    jw_ch(w, '[');
    for (uint32_t d = 0; d < b->ndim; d++) {
        jw_raw(w, d ? ",[" : "[");
        jw_u64(w, b->off[d]);
        jw_cu(w, b->off[d] + b->ext[d]);
        jw_ch(w, ']');
    }
    jw_ch(w, ']');
}

/* ---------------------------------------------------------------- layouts */

static const char *const layouts[][2] = {
    {"trainer_tensors", "[name, dtype, shape, shard class (-1: not placed), [rank, shard, ...]]: "
                        "every owner (rank) with the index of the shard it holds"},
    {"shard_classes", "per class, the box of each shard: [[off, end] per dim]"},
    {"rollout_tensors", "[name, dtype, shape]"},
    {"mappings", "[rollout tensor, scale tensor (-1: none), transform, [trainer tensor, ...]]"},
    {"table.phases", "[task0, ntasks, barrier_after (0/1)]"},
    {"table.boxes", "the boxes ops and peers refer to by index: [[off, end] per dim]"},
    {"table.shapes", "the shapes views refer to by index"},
    {"table.tasks", "[mapping, item, phase, mesh, mode, tmp_bytes, write_bytes, op0, nops, write0, "
                    "nwrites]"},
    {"table.writes", "flat, 9 numbers a write record: src_tensor (-1: the task's TMP), src_off, "
                     "dst_rank, dst_tensor, dst_off, len, tag, more, rank_step: the record "
                     "stands for more + 1 writes of the same bytes, to dst_rank + k * rank_step "
                     "for k = 0..more (one per rollout replica)"},
    {"table.amax", "[tag, bytes, writes]: what arrives in the amax inbox"},
    {"view", "[buffer (0: PARAM, the rank's shard of tensor; 1: the task's TMP), tensor, off, "
             "dtype, shape index]"},
    {"op.h2d", "[\"h2d\", tensor, src_off, bytes, dst_off]"},
    {"op.gather", "[\"gather\", tensor, src view, dst view, mesh, seq, bytes_in, [rank, box "
                  "index, ...] (every member, this rank included)]"},
    {"op.amax", "[\"amax\", tensor, src view, src_box, region, blocks, grid, amax_off (-1: "
                "none), [peer, tag, peer_inbox_off, inbox_off, ...] (every peer sharing the "
                "blocks)] (boxes are indices)"},
    {"op.copy", "[\"copy\" or \"cast\", tensor, src view, src_box, dst view, dst_box]"},
    {"op.permute", "[\"permute\", tensor, src view, src_box, dst view, dst_box, perm]: dst "
                   "dim k is src dim perm[k] (a transposed component; the ops after it that "
                   "name the tensor speak of it permuted: regions, blocks and grids)"},
    {"op.quant", "[\"quant\", tensor, src view, src_box, dst view, region, grid, scale_off, "
                 "amax_off (-1: none)]: FP8 values at dst, FP32 scales (grid extents) at "
                 "scale_off"},
    {"receive.local", "[tensor, dtype, local shape, bytes, written]: written = the bytes the "
                      "plan writes, a prefix (less than bytes only for vocab padding rows)"},
    {"receive.expect", "[tag, tensor, bytes, writes]"},
    {"components", "per mapping (in the order of mappings): [[trainer tensor, src box, dst box, "
                   "perm], ...]: the trainer tensor's src box (trainer coordinates) is the "
                   "rollout tensor's dst box (rollout coordinates; a stacked component has one "
                   "more leading dim of extent 1, an unstacked one one less); perm [] unless "
                   "transposed (rollout dim k is trainer dim perm[k]); a mapping of FP8 scales "
                   "counts in 128x128 blocks"},
    {"rollout_boxes",
     "per (tp rank, ep rank): {tp_rank, ep_rank, ranks (the rollout ranks "
     "holding these local tensors, one per replica), local: [[tensor, local shape, "
     "[[global box, local box], ...]], ...]}: the box of the global rollout tensor each "
     "piece holds and where it lies in the local tensor (a scale tensor's in "
     "blocks); elements no piece covers are never written (vocab padding, a "
     "tensor only tp rank 0 holds)"},
};

/* ---------------------------------------------------------------- tables */

static void jw_view(struct jw *w, const struct wb_rt_view *v)
{
    jw_raw(w, v->kind == WB_BUF_PARAM ? "[0," : "[1,");
    jw_u64(w, v->tensor);
    jw_cu(w, v->off);
    jw_raw(w, ",\"");
    jw_raw(w, wb_dtype_name(v->dtype));
    jw_raw(w, "\",");
    jw_u64(w, v->shape);
    jw_ch(w, ']');
}

static void jw_op(struct jw *w, const struct wb_route_table *t, const struct wb_rt_op *o)
{
    switch (o->kind) {
    case WB_OP_H2D:
        jw_raw(w, "[\"h2d\",");
        jw_u64(w, o->tensor);
        jw_cu(w, o->h2d.src_off);
        jw_cu(w, o->h2d.bytes);
        jw_cu(w, o->h2d.dst_off);
        break;
    case WB_OP_GATHER:
        jw_raw(w, "[\"gather\",");
        jw_u64(w, o->tensor);
        jw_ch(w, ',');
        jw_view(w, &o->gather.src);
        jw_ch(w, ',');
        jw_view(w, &o->gather.dst);
        jw_cu(w, o->gather.mesh);
        jw_cu(w, o->gather.seq);
        jw_cu(w, o->gather.bytes_in);
        jw_raw(w, ",[");
        for (uint32_t i = 0; i < o->gather.npeers; i++) {
            const struct wb_rt_peer *pe = &t->peers[o->gather.peer0 + i];
            if (i)
                jw_ch(w, ',');
            jw_u64(w, pe->rank);
            jw_cu(w, pe->box);
        }
        jw_ch(w, ']');
        break;
    case WB_OP_AMAX:
        jw_raw(w, "[\"amax\",");
        jw_u64(w, o->tensor);
        jw_ch(w, ',');
        jw_view(w, &o->amax.src);
        jw_cu(w, o->amax.src_box);
        jw_cu(w, o->amax.region);
        jw_cu(w, o->amax.blocks);
        jw_cu(w, o->amax.grid);
        jw_ch(w, ',');
        jw_opt(w, o->amax.amax_off, (uint64_t)WB_RT_NONE);
        jw_raw(w, ",[");
        for (uint32_t i = 0; i < o->amax.npeers; i++) {
            const struct wb_rt_amax_peer *pe = &t->amax_peers[o->amax.peer0 + i];
            if (i)
                jw_ch(w, ',');
            jw_u64(w, pe->rank);
            jw_cu(w, pe->tag);
            jw_cu(w, pe->peer_inbox_off);
            jw_cu(w, pe->inbox_off);
        }
        jw_ch(w, ']');
        break;
    case WB_OP_COPY:
    case WB_OP_CAST:
        jw_raw(w, o->kind == WB_OP_COPY ? "[\"copy\"," : "[\"cast\",");
        jw_u64(w, o->tensor);
        jw_ch(w, ',');
        jw_view(w, &o->copy.src);
        jw_cu(w, o->copy.src_box);
        jw_ch(w, ',');
        jw_view(w, &o->copy.dst);
        jw_cu(w, o->copy.dst_box);
        break;
    case WB_OP_PERMUTE: {
        const struct wb_rt_permute *pm = &o->permute;
        jw_raw(w, "[\"permute\",");
        jw_u64(w, o->tensor);
        jw_ch(w, ',');
        jw_view(w, &pm->src);
        jw_cu(w, pm->src_box);
        jw_ch(w, ',');
        jw_view(w, &pm->dst);
        jw_cu(w, pm->dst_box);
        jw_raw(w, ",[");
        for (uint32_t k = 0; k < wb_rt_box(t, pm->dst_box)->ndim; k++) {
            if (k)
                jw_ch(w, ',');
            jw_u64(w, wb_rt_perm_dim(pm->perm, k));
        }
        jw_ch(w, ']');
        break;
    }
    case WB_OP_QUANT:
        jw_raw(w, "[\"quant\",");
        jw_u64(w, o->tensor);
        jw_ch(w, ',');
        jw_view(w, &o->quant.src);
        jw_cu(w, o->quant.src_box);
        jw_ch(w, ',');
        jw_view(w, &o->quant.dst);
        jw_cu(w, o->quant.region);
        jw_cu(w, o->quant.grid);
        jw_cu(w, o->quant.scale_off);
        jw_ch(w, ',');
        jw_opt(w, o->quant.amax_off, (uint64_t)WB_RT_NONE);
        break;
    default:
        jw_raw(w, "[\"?\"");
    }
    jw_ch(w, ']');
}

static void jw_table(struct jw *w, const struct wb_route_table *t)
{
    jw_raw(w, "{\"rank\":");
    jw_u64(w, t->rank);
    jw_raw(w, ",\"tag_bits\":");
    jw_u64(w, t->tag_bits);
    jw_raw(w,
           t->residence == WB_RESIDE_HOST ? ",\"residence\":\"host\"" : ",\"residence\":\"gpu\"");
    jw_raw(w, ",\"send_bytes\":");
    jw_u64(w, t->send_bytes);
    jw_raw(w, ",\"max_tmp_bytes\":");
    jw_u64(w, t->max_tmp_bytes);
    jw_raw(w, ",\"mem_cap\":");
    jw_u64(w, t->mem_cap);
    jw_raw(w, ",\"amax_inbox_bytes\":");
    jw_u64(w, t->amax_inbox_bytes);
    jw_raw(w, ",\"phases\":[");
    for (uint32_t i = 0; i < t->nphases; i++) {
        jw_raw(w, i ? ",[" : "[");
        jw_u64(w, t->phases[i].task0);
        jw_cu(w, t->phases[i].ntasks);
        jw_raw(w, t->phases[i].barrier_after ? ",1]" : ",0]");
    }
    jw_raw(w, "],\"boxes\":[");
    for (uint32_t i = 0; i < t->nboxes; i++) {
        if (i)
            jw_ch(w, ',');
        jw_box(w, &t->boxes[i]);
    }
    jw_raw(w, "],\"shapes\":[");
    for (uint32_t i = 0; i < t->nshapes; i++) {
        if (i)
            jw_ch(w, ',');
        jw_shape(w, &t->shapes[i]);
    }
    jw_raw(w, "],\"tasks\":[");
    for (uint32_t k = 0; k < t->ntasks; k++) {
        const struct wb_rt_task *T = &t->tasks[k];
        jw_raw(w, k ? ",[" : "[");
        jw_u64(w, T->mapping);
        jw_cu(w, T->item);
        jw_cu(w, T->phase);
        jw_cu(w, T->mesh);
        jw_raw(w, ",\"");
        jw_raw(w, wb_plan_mode_name(T->mode));
        jw_ch(w, '"');
        jw_cu(w, T->tmp_bytes);
        jw_cu(w, T->write_bytes);
        jw_cu(w, T->op0);
        jw_cu(w, T->nops);
        jw_cu(w, T->write0);
        jw_cu(w, T->nwrites);
        jw_ch(w, ']');
    }
    jw_raw(w, "],\"ops\":[");
    for (uint32_t o = 0; o < t->nops; o++) {
        if (o)
            jw_ch(w, ',');
        jw_op(w, t, &t->ops[o]);
    }
    jw_raw(w, "],\"writes\":[");
    for (uint32_t i = 0; i < t->nwrites; i++) {
        const struct wb_rt_write *x = &t->writes[i];
        if (i)
            jw_ch(w, ',');
        jw_opt(w, x->src_tensor, (uint32_t)WB_RT_TMP_SRC);
        jw_cu(w, x->src_off);
        jw_cu(w, x->dst_rank);
        jw_cu(w, x->dst_tensor);
        jw_cu(w, x->dst_off);
        jw_cu(w, x->len);
        jw_cu(w, x->tag);
        jw_cu(w, x->more);
        jw_cu(w, x->rank_step);
    }
    jw_raw(w, "],\"amax\":[");
    for (uint32_t i = 0; i < t->namax; i++) {
        jw_raw(w, i ? ",[" : "[");
        jw_u64(w, t->amax[i].tag);
        jw_cu(w, t->amax[i].bytes);
        jw_cu(w, t->amax[i].writes);
        jw_ch(w, ']');
    }
    jw_raw(w, "]}");
}

/* [[global box, local box], ...] of one local tensor: the matcher's split of its mapping at
 * this rank (wb_mapping_local), in blocks for a scale tensor. [] when no mapping builds it. */
static void jw_pieces(struct jw *w, const struct wb_recv_list *r, const struct wb_plan_input *in,
                      const uint32_t *map_of, const struct wb_rt_local *lo)
{
    uint32_t mi = map_of[lo->tensor];
    struct wb_local_piece pc[WB_MAX_PIECES];
    uint32_t np = 0;
    struct wb_shape ls;
    if (mi != UINT32_MAX) {
        const struct wb_mapping *m = &in->match->map[mi];
        struct wb_errlist el;
        wb_errlist_init(&el);
        if (wb_mapping_local(in->match, in->rollout, m, r->tp_rank, in->rl->tp, r->ep_rank,
                             in->rl->ep, &ls, pc, &np, &el))
            np = 0; /* a plan was built, so this does not fail */
        wb_errlist_free(&el);
        if (lo->tensor != m->rollout) /* the scale tensor: the blocks of each value piece */
            for (uint32_t k = 0; k < np; k++)
                if (wb_scale_box(&pc[k].global, m->block, &pc[k].global) ||
                    wb_scale_box(&pc[k].local, m->block, &pc[k].local))
                    np = 0;
    }
    jw_ch(w, '[');
    for (uint32_t k = 0; k < np; k++) {
        jw_raw(w, k ? ",[" : "[");
        jw_box(w, &pc[k].global);
        jw_ch(w, ',');
        jw_box(w, &pc[k].local);
        jw_ch(w, ']');
    }
    jw_ch(w, ']');
}

static void jw_recv(struct jw *w, const struct wb_recv_list *r, const struct wb_plan_input *in,
                    const uint32_t *map_of)
{
    jw_raw(w, "{\"rank\":");
    jw_u64(w, r->rank);
    jw_raw(w, ",\"replica\":");
    jw_u64(w, r->replica);
    jw_raw(w, ",\"tp_rank\":");
    jw_u64(w, r->tp_rank);
    jw_raw(w, ",\"ep_rank\":");
    jw_u64(w, r->ep_rank);
    jw_raw(w, ",\"tag_bits\":");
    jw_u64(w, r->tag_bits);
    jw_raw(w, ",\"recv_bytes\":");
    jw_u64(w, r->recv_bytes);
    jw_raw(w, ",\"recv_writes\":");
    jw_u64(w, r->recv_writes);
    jw_raw(w, ",\"local\":[");
    for (uint32_t i = 0; i < r->nlocal; i++) {
        const struct wb_rt_local *lo = &r->local[i];
        jw_raw(w, i ? ",[" : "[");
        jw_u64(w, lo->tensor);
        jw_raw(w, ",\"");
        jw_raw(w, wb_dtype_name(lo->dtype));
        jw_raw(w, "\",");
        jw_shape(w, &lo->shape);
        jw_cu(w, lo->bytes);
        jw_cu(w, in && map_of ? pl_local_written(in, map_of, r, lo) : lo->bytes);
        jw_ch(w, ']');
    }
    jw_raw(w, "],\"expect\":[");
    for (uint32_t i = 0; i < r->nexpect; i++) {
        const struct wb_rt_expect *e = &r->expect[i];
        jw_raw(w, i ? ",[" : "[");
        jw_u64(w, e->tag);
        jw_cu(w, e->tensor);
        jw_cu(w, e->bytes);
        jw_cu(w, e->writes);
        jw_ch(w, ']');
    }
    jw_raw(w, "]}");
}

/* The rollout side's global boxes, once per (tp rank, ep rank): replicas hold the same local
 * tensors. Written before the tables, so that a reader streaming the file knows, when it
 * reads a write, which elements of which global rollout tensor its bytes land on. */
static void jw_rollout_boxes(struct jw *w, const struct wb_plan *p, const struct wb_plan_input *in,
                             const uint32_t *map_of)
{
    jw_raw(w, ",\n\"rollout_boxes\":[");
    bool first = true;
    for (uint32_t g = 0; g < p->nrollouts; g++) {
        const struct wb_recv_list *r = &p->recv[g];
        bool seen = false;
        for (uint32_t h = 0; h < g && !seen; h++)
            seen = p->recv[h].tp_rank == r->tp_rank && p->recv[h].ep_rank == r->ep_rank;
        if (seen)
            continue;
        jw_raw(w, first ? "\n{\"tp_rank\":" : ",\n{\"tp_rank\":");
        first = false;
        jw_u64(w, r->tp_rank);
        jw_raw(w, ",\"ep_rank\":");
        jw_u64(w, r->ep_rank);
        jw_raw(w, ",\"ranks\":[");
        for (uint32_t h = g, n = 0; h < p->nrollouts; h++)
            if (p->recv[h].tp_rank == r->tp_rank && p->recv[h].ep_rank == r->ep_rank) {
                if (n++)
                    jw_ch(w, ',');
                jw_u64(w, h);
            }
        jw_raw(w, "],\"local\":[");
        for (uint32_t i = 0; i < r->nlocal; i++) {
            jw_raw(w, i ? ",[" : "[");
            jw_u64(w, r->local[i].tensor);
            jw_ch(w, ',');
            jw_shape(w, &r->local[i].shape);
            jw_ch(w, ',');
            jw_pieces(w, r, in, map_of, &r->local[i]);
            jw_ch(w, ']');
        }
        jw_raw(w, "]}");
    }
    jw_raw(w, "]");
}

/* ---------------------------------------------------------------- inputs */

static void jw_inventory(struct jw *w, const struct wb_inventory *inv, const char *key)
{
    jw_raw(w, ",\n\"");
    jw_raw(w, key);
    jw_raw(w, "\":[");
    for (size_t t = 0; t < inv->n; t++) {
        jw_raw(w, t ? ",\n[" : "\n[");
        jw_str(w, inv->p[t].name);
        jw_raw(w, ",\"");
        jw_raw(w, wb_dtype_name(inv->p[t].dtype));
        jw_raw(w, "\",");
        jw_shape(w, &inv->p[t].shape);
        jw_ch(w, ']');
    }
    jw_raw(w, "]");
}

/* What decides a tensor's shard boxes: the rule and the shape (placement.c). */
struct shard_key {
    int32_t rule;
    struct wb_shape shape;
};

/* Every trainer tensor a mapping uses, with its owners and their shards; the shard boxes are
 * written once per (rule, shape) class. */
static int jw_trainer(struct jw *w, const struct wb_plan_input *in)
{
    const struct wb_inventory *ti = in->trainer;
    bool *used = calloc(ti->n + 1, sizeof(bool));
    uint32_t *cls = malloc((ti->n + 1) * sizeof(uint32_t));
    struct wb_placement_map *pm = NULL;
    struct wb_errlist el;
    wb_errlist_init(&el);
    struct intern classes;
    pl_intern_init(&classes, sizeof(struct shard_key));
    struct vec firsts; /* per class: a tensor of it */
    pl_vec_init(&firsts, sizeof(uint32_t));
    int r = used && cls ? 0 : -ENOMEM;
    for (size_t m = 0; !r && m < in->match->n; m++)
        for (uint32_t k = 0; k < in->match->map[m].ncomp; k++)
            used[in->match->map[m].comp[k].trainer] = true;
    if (!r)
        r = wb_placement_map_build(in->tl, ti, used, &pm, &el);
    for (size_t t = 0; !r && t < ti->n; t++) {
        cls[t] = UINT32_MAX;
        if (pm->place[t].rule < 0)
            continue;
        struct shard_key key;
        memset(&key, 0, sizeof(key));
        key.rule = pm->place[t].rule;
        key.shape.ndim = ti->p[t].shape.ndim;
        for (uint32_t d = 0; d < key.shape.ndim && d < WB_MAX_DIMS; d++)
            key.shape.dim[d] = ti->p[t].shape.dim[d];
        size_t before = classes.v.n;
        cls[t] = pl_intern_bytes(&classes, &key);
        uint32_t t32 = (uint32_t)t;
        if (classes.err || (classes.v.n > before && !pl_vec_push(&firsts, &t32)))
            r = -ENOMEM;
    }
    if (!r) {
        jw_raw(w, ",\n\"shard_classes\":[");
        for (size_t c = 0; c < firsts.n; c++) {
            uint32_t t = *VEC_AT(&firsts, uint32_t, c);
            const struct tplace *tp = &pm->place[t];
            uint32_t ns = pl_place_nshards(pm, tp);
            jw_raw(w, c ? ",\n[" : "\n[");
            for (uint32_t s = 0; s < ns; s++) {
                if (s)
                    jw_ch(w, ',');
                struct wb_box b = pl_place_shard_box(pm, tp, &ti->p[t].shape, s);
                jw_box(w, &b);
            }
            jw_ch(w, ']');
        }
        jw_raw(w, "],\n\"trainer_tensors\":[");
        for (size_t t = 0; t < ti->n; t++) {
            jw_raw(w, t ? ",\n[" : "\n[");
            jw_str(w, ti->p[t].name);
            jw_raw(w, ",\"");
            jw_raw(w, wb_dtype_name(ti->p[t].dtype));
            jw_raw(w, "\",");
            jw_shape(w, &ti->p[t].shape);
            if (cls[t] == UINT32_MAX) {
                jw_raw(w, ",-1,[]]");
                continue;
            }
            jw_cu(w, cls[t]);
            jw_raw(w, ",[");
            const struct tplace *tp = &pm->place[t];
            uint32_t nr = pl_place_nranks(pm, tp);
            bool first = true;
            for (uint32_t i = 0; i < nr; i++) {
                struct wb_box b;
                uint32_t shard;
                uint32_t rank = pl_place_rank(pm, tp, &ti->p[t].shape, i, &b, &shard, NULL);
                if (wb_box_empty(&b) && b.ndim > 0)
                    continue; /* not an owner: its chunk is empty */
                if (!first)
                    jw_ch(w, ',');
                first = false;
                jw_u64(w, rank);
                jw_cu(w, shard);
            }
            jw_raw(w, "]]");
        }
        jw_raw(w, "]");
    }
    wb_placement_map_free(pm);
    wb_errlist_free(&el);
    pl_intern_free(&classes);
    pl_vec_free(&firsts);
    free(used);
    free(cls);
    return r;
}

static void jw_mappings(struct jw *w, const struct wb_match *mt)
{
    jw_raw(w, ",\n\"mappings\":[");
    for (size_t m = 0; m < mt->n; m++) {
        const struct wb_mapping *mp = &mt->map[m];
        jw_raw(w, m ? ",\n[" : "\n[");
        jw_u64(w, mp->rollout);
        jw_ch(w, ',');
        if (mp->scale < 0)
            jw_raw(w, "-1");
        else
            jw_u64(w, (uint64_t)mp->scale);
        jw_raw(w, mp->xform == WB_XFORM_FP8_BLOCK ? ",\"fp8_block\",[" : ",\"copy\",[");
        for (uint32_t k = 0; k < mp->ncomp; k++) {
            if (k)
                jw_ch(w, ',');
            jw_u64(w, mp->comp[k].trainer);
        }
        jw_raw(w, "]]");
    }
    jw_raw(w, "]");
}

/* Per mapping, its components: which trainer tensor's box lands at which box of the rollout
 * tensor (the matcher's wb_component), so that a reader can check what each write holds. */
static void jw_components(struct jw *w, const struct wb_match *mt)
{
    jw_raw(w, ",\n\"components\":[");
    for (size_t m = 0; m < mt->n; m++) {
        const struct wb_mapping *mp = &mt->map[m];
        jw_raw(w, m ? ",\n[" : "\n[");
        for (uint32_t k = 0; k < mp->ncomp; k++) {
            const struct wb_component *c = &mp->comp[k];
            jw_raw(w, k ? ",[" : "[");
            jw_u64(w, c->trainer);
            jw_ch(w, ',');
            jw_box(w, &c->src);
            jw_ch(w, ',');
            jw_box(w, &c->dst);
            jw_raw(w, ",[");
            for (uint32_t d = 0; c->permuted && d < c->dst.ndim; d++) {
                if (d)
                    jw_ch(w, ',');
                jw_u64(w, c->perm[d]);
            }
            jw_raw(w, "]]");
        }
        jw_ch(w, ']');
    }
    jw_raw(w, "]");
}

/* ---------------------------------------------------------------- the document */

/* Format, mode, cap, the summary figures, per-rank totals and the meshes. */
static void jw_summary(struct jw *w, const struct wb_plan *p)
{
    const struct wb_plan_stats *s = &p->stats;
    jw_raw(w, "{\"format\":");
    jw_u64(w, JSON_FORMAT);
    jw_raw(w, ",\"wire_format\":");
    jw_u64(w, WB_PLAN_FORMAT);
    jw_raw(w, ",\"mode\":\"");
    jw_raw(w, wb_plan_mode_name(p->mode));
    jw_raw(w, "\",\"mem_cap\":");
    jw_u64(w, p->mem_cap);
    jw_raw(w, ",\"ntrainers\":");
    jw_u64(w, p->ntrainers);
    jw_raw(w, ",\"nrollouts\":");
    jw_u64(w, p->nrollouts);
    jw_raw(w, ",\"nphases\":");
    jw_u64(w, p->nphases);
    jw_raw(w, ",\n\"stats\":{\"tensors\":");
    jw_u64(w, s->tensors);
    jw_raw(w, ",\"mappings\":");
    jw_u64(w, s->mappings);
    jw_raw(w, ",\"items\":");
    jw_u64(w, s->items);
    jw_raw(w, ",\"tasks\":");
    jw_u64(w, s->tasks);
    jw_raw(w, ",\"ops\":");
    jw_u64(w, s->ops);
    jw_raw(w, ",\"writes\":");
    jw_u64(w, s->writes);
    jw_raw(w, ",\"write_records\":");
    jw_u64(w, s->records);
    jw_raw(w, ",\"gathers\":");
    jw_u64(w, s->gathers);
    jw_raw(w, ",\"amax_ops\":");
    jw_u64(w, s->amax_ops);
    jw_raw(w, ",\"amax_exchanges\":");
    jw_u64(w, s->amax_peers);
    jw_raw(w, ",\"pieces\":{\"direct\":");
    jw_u64(w, s->pieces[WB_MODE_DIRECT]);
    jw_raw(w, ",\"amax\":");
    jw_u64(w, s->pieces[WB_MODE_AMAX]);
    jw_raw(w, ",\"gather\":");
    jw_u64(w, s->pieces[WB_MODE_GATHER]);
    jw_raw(w, "},\"total_bytes\":");
    jw_u64(w, s->total_bytes);
    jw_raw(w, ",\"gather_bytes\":");
    jw_u64(w, s->gather_bytes);
    jw_raw(w, ",\"h2d_bytes\":");
    jw_u64(w, s->h2d_bytes);
    jw_raw(w, ",\"lower_bound\":");
    jw_u64(w, s->lower_bound);
    jw_raw(w, ",\"greedy_max\":");
    jw_u64(w, s->greedy_max);
    jw_raw(w, ",\"max_send\":");
    jw_u64(w, s->max_send);
    jw_raw(w, "},\n\"send_bytes\":");
    jw_u64s(w, s->send_bytes, p->ntrainers);
    jw_raw(w, ",\n\"recv_bytes\":");
    jw_u64s(w, s->recv_bytes, p->nrollouts);
    jw_raw(w, ",\n\"gather_in_bytes\":");
    jw_u64s(w, s->gather_in_bytes, p->ntrainers);
    jw_raw(w, ",\n\"meshes\":[");
    for (uint32_t i = 0; i < p->nmeshes; i++) {
        jw_raw(w, i ? ",{\"phase\":" : "{\"phase\":");
        jw_u64(w, p->meshes[i].phase);
        jw_raw(w, ",\"ranks\":[");
        for (uint32_t k = 0; k < p->meshes[i].n; k++) {
            if (k)
                jw_ch(w, ',');
            jw_u64(w, p->meshes[i].ranks[k]);
        }
        jw_raw(w, "]}");
    }
    jw_raw(w, "]");
}

/* Both cluster layouts, the FP8 block edge and the layouts of the compact arrays below. */
static void jw_layouts(struct jw *w, const struct wb_plan_input *in)
{
    const struct wb_trainer_layout *tl = in->tl;
    const struct wb_rollout_layout *rl = in->rl;
    jw_raw(w, ",\n\"trainer_layout\":{\"world_size\":");
    jw_u64(w, tl->world);
    jw_raw(w, ",\"gpus_per_node\":");
    jw_u64(w, tl->gpus_per_node);
    jw_raw(w,
           tl->residence == WB_RESIDE_HOST ? ",\"residence\":\"host\"" : ",\"residence\":\"gpu\"");
    jw_raw(w, ",\"mesh\":[");
    for (uint32_t d = 0; d < tl->ndims; d++) {
        jw_raw(w, d ? ",[" : "[");
        jw_str(w, tl->dim[d].name);
        jw_cu(w, tl->dim[d].size);
        jw_ch(w, ']');
    }
    jw_raw(w, "]},\n\"rollout_layout\":{\"replicas\":");
    jw_u64(w, rl->replicas);
    jw_raw(w, ",\"gpus_per_replica\":");
    jw_u64(w, rl->gpus_per_replica);
    jw_raw(w, ",\"tp\":");
    jw_u64(w, rl->tp);
    jw_raw(w, ",\"ep\":");
    jw_u64(w, rl->ep);
    jw_raw(w, "},\n\"fp8_block\":");
    jw_u64(w, WB_FP8_BLOCK);
    /* op.permute only where the match transposes: the files of plans without one stay as they
     * were before transposes were planned (their hashes are pinned, tests/sh/plan_hashes.txt) */
    bool transposes = false;
    for (size_t m = 0; m < in->match->n && !transposes; m++)
        for (uint32_t k = 0; k < in->match->map[m].ncomp; k++)
            transposes |= in->match->map[m].comp[k].permuted;
    jw_raw(w, ",\n\"layouts\":{");
    for (size_t i = 0; i < WB_ARRAY_LEN(layouts); i++) {
        if (!transposes && strcmp(layouts[i][0], "op.permute") == 0)
            continue;
        if (i)
            jw_raw(w, ",\n");
        jw_str(w, layouts[i][0]);
        jw_ch(w, ':');
        jw_str(w, layouts[i][1]);
    }
    jw_raw(w, "}");
}

static void jw_f(struct jw *w, double v)
{
    char b[40];
    snprintf(b, sizeof(b), "%.6g", isfinite(v) ? v : 0.0);
    jw_raw(w, b);
}

static void jw_fs(struct jw *w, const char *key, const double *v, uint32_t n)
{
    jw_raw(w, ",\"");
    jw_raw(w, key);
    jw_raw(w, "\":[");
    for (uint32_t i = 0; i < n; i++) {
        if (i)
            jw_ch(w, ',');
        jw_f(w, v[i]);
    }
    jw_ch(w, ']');
}

/* The estimate (wb-plan --estimate): the time, its lower bound and the resource that sets it,
 * the phases, and where each trainer's time went (seconds; per rank, in rank order). */
static void jw_estimate(struct jw *w, const struct wb_estimate *e, const struct wb_plan *p)
{
    jw_raw(w, ",\n\"estimate\":{\"total_s\":");
    jw_f(w, e->total_s);
    jw_raw(w, ",\"lower_bound_s\":");
    jw_f(w, e->lower_bound_s);
    jw_raw(w, ",\"bound\":");
    jw_str(w, e->bound);
    jw_raw(w, ",\"peak_tmp_bytes\":");
    jw_u64(w, e->peak_tmp_bytes);
    jw_raw(w, ",\"phases\":[");
    for (uint32_t q = 0; q < e->nphases; q++) {
        const struct wb_est_phase *ph = &e->phase[q];
        jw_raw(w, q ? ",{\"start_s\":" : "{\"start_s\":");
        jw_f(w, ph->start_s == INFINITY ? 0.0 : ph->start_s);
        jw_raw(w, ",\"end_s\":");
        jw_f(w, ph->end_s);
        const struct {
            const char *k;
            uint64_t v;
        } b[] = {
            {"write_bytes", ph->write_bytes},       {"gather_bytes", ph->gather_bytes},
            {"h2d_bytes", ph->h2d_bytes},           {"quant_bytes", ph->quant_bytes},
            {"max_send_bytes", ph->max_send_bytes}, {"max_gather_bytes", ph->max_gather_bytes}};
        for (size_t i = 0; i < WB_ARRAY_LEN(b); i++) {
            jw_raw(w, ",\"");
            jw_raw(w, b[i].k);
            jw_raw(w, "\":");
            jw_u64(w, b[i].v);
        }
        jw_ch(w, '}');
    }
    jw_raw(w, "],\"trainer\":{\"ranks\":");
    jw_u64(w, p->ntrainers);
    jw_fs(w, "end_s", e->trainer_end_s, p->ntrainers);
    jw_fs(w, "h2d_s", e->busy_h2d_s, p->ntrainers);
    jw_fs(w, "gpu_s", e->busy_gpu_s, p->ntrainers);
    jw_fs(w, "gather_s", e->busy_gather_s, p->ntrainers);
    jw_fs(w, "cpu_s", e->busy_submit_s, p->ntrainers);
    jw_fs(w, "wait_s", e->wait_s, p->ntrainers);
    jw_raw(w, "},\"rollout\":{\"ranks\":");
    jw_u64(w, p->nrollouts);
    jw_fs(w, "end_s", e->rollout_end_s, p->nrollouts);
    jw_raw(w, "}}");
}

/* The relay (a plan with one, or whose relay auto chose): the shape, the forest over every
 * replica ("parent": -1 for a root, the writing replica otherwise) and auto's simulated
 * shapes. A plan without relay asked has no "relay" key, so its JSON is as before. */
static void jw_relay(struct jw *w, const struct wb_plan *p)
{
    if (p->relay.kind == WB_PLAN_RELAY_OFF && !p->relay_tried)
        return;
    jw_raw(w, ",\n\"relay\":{\"kind\":");
    jw_str(w, wb_relay_kind_names[p->relay.kind]);
    jw_raw(w, ",\"fanout\":");
    jw_u64(w, p->relay.fanout);
    jw_raw(w, ",\"roots\":");
    jw_u64(w, p->relay.roots);
    uint32_t nrep = wb_plan_replicas(p);
    uint32_t *parent = malloc(((size_t)nrep + 1) * sizeof(uint32_t));
    if (!parent) {
        w->err = -ENOMEM;
        return;
    }
    wb_relay_forest(&p->relay, nrep, NULL, parent);
    jw_raw(w, ",\"parent\":[");
    for (uint32_t j = 0; j < nrep; j++) {
        if (j)
            jw_ch(w, ',');
        if (parent[j] == WB_RELAY_ROOT)
            jw_raw(w, "-1");
        else
            jw_u64(w, parent[j]);
    }
    free(parent);
    jw_raw(w, "],\"tried\":[");
    for (uint32_t i = 0; i < p->nrelay_tried; i++) {
        const struct wb_relay_try *t = &p->relay_tried[i];
        jw_raw(w, i ? ",{\"kind\":" : "{\"kind\":");
        jw_str(w, wb_relay_kind_names[t->shape.kind]);
        jw_raw(w, ",\"fanout\":");
        jw_u64(w, t->shape.fanout);
        jw_raw(w, ",\"roots\":");
        jw_u64(w, t->shape.roots);
        jw_raw(w, ",\"bound_s\":");
        jw_f(w, t->bound_s);
        jw_raw(w, ",\"total_s\":");
        if (t->total_s == INFINITY)
            jw_raw(w, "null");
        else
            jw_f(w, t->total_s);
        jw_ch(w, '}');
    }
    jw_raw(w, "]}");
}

int wb_plan_write_json(const struct wb_plan *p, const struct wb_plan_input *in, bool tables,
                       FILE *f)
{
    return wb_plan_write_json_est(p, in, tables, NULL, f);
}

int wb_plan_write_json_est(const struct wb_plan *p, const struct wb_plan_input *in, bool tables,
                           const struct wb_estimate *est, FILE *f)
{
    struct jw *w = malloc(sizeof(*w));
    if (!w)
        return -ENOMEM;
    w->f = f;
    w->n = 0;
    w->err = 0;
    jw_summary(w, p);
    jw_relay(w, p);
    if (est)
        jw_estimate(w, est, p);
    int rc = 0;
    uint32_t *map_of = NULL;
    if (tables && in) {
        jw_layouts(w, in);
        jw_inventory(w, in->rollout, "rollout_tensors");
        jw_mappings(w, in->match);
        rc = jw_trainer(w, in);
        map_of = pl_rollout_mapping_of(in);
        if (!rc && !map_of)
            rc = -ENOMEM;
        if (!rc) {
            jw_components(w, in->match);
            jw_rollout_boxes(w, p, in, map_of);
        }
    }
    if (tables && !rc) {
        jw_raw(w, ",\n\"tables\":[");
        struct wb_plan_tbuf tb = {0};
        for (uint32_t r = 0; r < p->ntrainers && !w->err && !rc; r++) {
            jw_raw(w, r ? ",\n" : "\n");
            const struct wb_route_table *t = wb_plan_table(p, r, &tb);
            if (t)
                jw_table(w, t);
            else
                rc = -ENOMEM;
        }
        wb_plan_tbuf_free(&tb);
        jw_raw(w, "],\n\"receive\":[");
        for (uint32_t g = 0; g < p->nrollouts && !w->err; g++) {
            jw_raw(w, g ? ",\n" : "\n");
            jw_recv(w, &p->recv[g], in, map_of);
        }
        jw_raw(w, "]");
    }
    jw_raw(w, "}\n");
    jw_flush(w);
    if (!rc)
        rc = w->err;
    free(map_of);
    free(w);
    return rc;
}
