/* route.c — routing tables and receive lists on the wire: common's versioned msgpack envelope
 * around a map body ("format" first, then named arrays of compact struct arrays), and a
 * decoder that trusts nothing: every count is bounded before allocation, every index is
 * checked against its array, every box against its shape, every enum against its range.
 * Unknown map keys and extra trailing struct fields are skipped, so later formats can add
 * data without breaking older readers. Also the mode names and the free functions.
 *
 * Why compact arrays here and key/value tables in proto/: a Kimi-K2 plan has ten million
 * writes; naming every field of every record would triple the bytes handed out at setup. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "route/route.h"

/* ---------------------------------------------------------------- encode */

static void put_view(struct wb_mpw *w, const struct wb_rt_view *v)
{
    wb_mpw_array(w, 5);
    wb_mpw_u64(w, v->kind);
    wb_mpw_u64(w, v->tensor);
    wb_mpw_u64(w, v->off);
    wb_mpw_u64(w, v->dtype);
    wb_mpw_u64(w, v->shape);
}

static void put_op(struct wb_mpw *w, const struct wb_rt_op *o)
{
    switch (o->kind) {
    case WB_OP_H2D:
        wb_mpw_array(w, 5);
        wb_mpw_u64(w, o->kind);
        wb_mpw_u64(w, o->tensor);
        wb_mpw_u64(w, o->h2d.src_off);
        wb_mpw_u64(w, o->h2d.bytes);
        wb_mpw_u64(w, o->h2d.dst_off);
        break;
    case WB_OP_GATHER:
        wb_mpw_array(w, 9);
        wb_mpw_u64(w, o->kind);
        wb_mpw_u64(w, o->tensor);
        put_view(w, &o->gather.src);
        put_view(w, &o->gather.dst);
        wb_mpw_u64(w, o->gather.peer0);
        wb_mpw_u64(w, o->gather.npeers);
        wb_mpw_u64(w, o->gather.mesh);
        wb_mpw_u64(w, o->gather.seq);
        wb_mpw_u64(w, o->gather.bytes_in);
        break;
    case WB_OP_AMAX:
        wb_mpw_array(w, 10);
        wb_mpw_u64(w, o->kind);
        wb_mpw_u64(w, o->tensor);
        wb_mpw_u64(w, o->amax.peer0);
        wb_mpw_u64(w, o->amax.npeers);
        put_view(w, &o->amax.src);
        wb_mpw_u64(w, o->amax.src_box);
        wb_mpw_u64(w, o->amax.region);
        wb_mpw_u64(w, o->amax.blocks);
        wb_mpw_u64(w, o->amax.grid);
        wb_mpw_u64(w, o->amax.amax_off);
        break;
    case WB_OP_COPY:
    case WB_OP_CAST:
        wb_mpw_array(w, 6);
        wb_mpw_u64(w, o->kind);
        wb_mpw_u64(w, o->tensor);
        put_view(w, &o->copy.src);
        put_view(w, &o->copy.dst);
        wb_mpw_u64(w, o->copy.src_box);
        wb_mpw_u64(w, o->copy.dst_box);
        break;
    case WB_OP_QUANT:
        wb_mpw_array(w, 9);
        wb_mpw_u64(w, o->kind);
        wb_mpw_u64(w, o->tensor);
        put_view(w, &o->quant.src);
        put_view(w, &o->quant.dst);
        wb_mpw_u64(w, o->quant.src_box);
        wb_mpw_u64(w, o->quant.region);
        wb_mpw_u64(w, o->quant.grid);
        wb_mpw_u64(w, o->quant.scale_off);
        wb_mpw_u64(w, o->quant.amax_off);
        break;
    default:
        wb_mpw_array(w, 2);
        wb_mpw_u64(w, o->kind);
        wb_mpw_u64(w, o->tensor);
    }
}

static void put_expects(struct wb_mpw *w, const struct wb_rt_expect *e, uint32_t n)
{
    wb_mpw_array(w, n);
    for (uint32_t i = 0; i < n; i++) {
        wb_mpw_array(w, 4);
        wb_mpw_u64(w, e[i].tag);
        wb_mpw_u64(w, e[i].tensor);
        wb_mpw_u64(w, e[i].bytes);
        wb_mpw_u64(w, e[i].writes);
    }
}

void wb_route_table_encode(struct wb_mpw *w, const struct wb_route_table *t)
{
    wb_mpw_envelope(w, WB_MSG_ROUTE_TABLE);
    wb_mpw_map(w, 21);
    wb_mpw_str(w, "format");
    wb_mpw_u64(w, WB_PLAN_FORMAT);
    wb_mpw_str(w, "rank");
    wb_mpw_u64(w, t->rank);
    wb_mpw_str(w, "ntrainers");
    wb_mpw_u64(w, t->ntrainers);
    wb_mpw_str(w, "nrollouts");
    wb_mpw_u64(w, t->nrollouts);
    wb_mpw_str(w, "tag_bits");
    wb_mpw_u64(w, t->tag_bits);
    wb_mpw_str(w, "residence");
    wb_mpw_u64(w, t->residence);
    wb_mpw_str(w, "phases");
    wb_mpw_array(w, t->nphases);
    for (uint32_t i = 0; i < t->nphases; i++) {
        wb_mpw_array(w, 3);
        wb_mpw_u64(w, t->phases[i].task0);
        wb_mpw_u64(w, t->phases[i].ntasks);
        wb_mpw_bool(w, t->phases[i].barrier_after);
    }
    wb_mpw_str(w, "tasks");
    wb_mpw_array(w, t->ntasks);
    for (uint32_t i = 0; i < t->ntasks; i++) {
        const struct wb_rt_task *k = &t->tasks[i];
        wb_mpw_array(w, 11);
        wb_mpw_u64(w, k->mapping);
        wb_mpw_u64(w, k->item);
        wb_mpw_u64(w, k->phase);
        wb_mpw_u64(w, k->mesh);
        wb_mpw_u64(w, k->mode);
        wb_mpw_u64(w, k->tmp_bytes);
        wb_mpw_u64(w, k->op0);
        wb_mpw_u64(w, k->nops);
        wb_mpw_u64(w, k->write0);
        wb_mpw_u64(w, k->nwrites);
        wb_mpw_u64(w, k->write_bytes);
    }
    wb_mpw_str(w, "ops");
    wb_mpw_array(w, t->nops);
    for (uint32_t i = 0; i < t->nops; i++)
        put_op(w, &t->ops[i]);
    wb_mpw_str(w, "peers");
    wb_mpw_array(w, t->npeers);
    for (uint32_t i = 0; i < t->npeers; i++) {
        wb_mpw_array(w, 2);
        wb_mpw_u64(w, t->peers[i].rank);
        wb_mpw_u64(w, t->peers[i].box);
    }
    wb_mpw_str(w, "amax_peers");
    wb_mpw_array(w, t->namax_peers);
    for (uint32_t i = 0; i < t->namax_peers; i++) {
        const struct wb_rt_amax_peer *x = &t->amax_peers[i];
        wb_mpw_array(w, 4);
        wb_mpw_u64(w, x->rank);
        wb_mpw_u64(w, x->tag);
        wb_mpw_u64(w, x->peer_inbox_off);
        wb_mpw_u64(w, x->inbox_off);
    }
    wb_mpw_str(w, "boxes");
    wb_mpw_array(w, t->nboxes);
    for (uint32_t i = 0; i < t->nboxes; i++)
        wb_wire_put_box(w, &t->boxes[i]);
    wb_mpw_str(w, "shapes");
    wb_mpw_array(w, t->nshapes);
    for (uint32_t i = 0; i < t->nshapes; i++)
        wb_wire_put_shape(w, &t->shapes[i]);
    wb_mpw_str(w, "writes");
    wb_mpw_array(w, t->nwrites);
    for (uint32_t i = 0; i < t->nwrites; i++) {
        const struct wb_rt_write *x = &t->writes[i];
        wb_mpw_array(w, 9);
        wb_mpw_u64(w, x->src_off);
        wb_mpw_u64(w, x->dst_off);
        wb_mpw_u64(w, x->len);
        wb_mpw_u64(w, x->src_tensor);
        wb_mpw_u64(w, x->dst_rank);
        wb_mpw_u64(w, x->dst_tensor);
        wb_mpw_u64(w, x->tag);
        wb_mpw_u64(w, x->more);
        wb_mpw_u64(w, x->rank_step);
    }
    wb_mpw_str(w, "amax_inbox_bytes");
    wb_mpw_u64(w, t->amax_inbox_bytes);
    wb_mpw_str(w, "amax");
    put_expects(w, t->amax, t->namax);
    wb_mpw_str(w, "send_bytes");
    wb_mpw_u64(w, t->send_bytes);
    wb_mpw_str(w, "max_tmp_bytes");
    wb_mpw_u64(w, t->max_tmp_bytes);
    wb_mpw_str(w, "mem_cap");
    wb_mpw_u64(w, t->mem_cap);
    wb_mpw_str(w, "block");
    wb_mpw_u64(w, t->block);
    wb_mpw_str(w, "mode");
    wb_mpw_u64(w, t->mode);
}

void wb_recv_list_encode(struct wb_mpw *w, const struct wb_recv_list *r)
{
    wb_mpw_envelope(w, WB_MSG_RECV_LIST);
    wb_mpw_map(w, 10);
    wb_mpw_str(w, "format");
    wb_mpw_u64(w, WB_PLAN_FORMAT);
    wb_mpw_str(w, "rank");
    wb_mpw_u64(w, r->rank);
    wb_mpw_str(w, "replica");
    wb_mpw_u64(w, r->replica);
    wb_mpw_str(w, "tp_rank");
    wb_mpw_u64(w, r->tp_rank);
    wb_mpw_str(w, "ep_rank");
    wb_mpw_u64(w, r->ep_rank);
    wb_mpw_str(w, "tag_bits");
    wb_mpw_u64(w, r->tag_bits);
    wb_mpw_str(w, "local");
    wb_mpw_array(w, r->nlocal);
    for (uint32_t i = 0; i < r->nlocal; i++) {
        wb_mpw_array(w, 4);
        wb_mpw_u64(w, r->local[i].tensor);
        wb_mpw_u64(w, r->local[i].dtype);
        wb_wire_put_shape(w, &r->local[i].shape);
        wb_mpw_u64(w, r->local[i].bytes);
    }
    wb_mpw_str(w, "expect");
    put_expects(w, r->expect, r->nexpect);
    wb_mpw_str(w, "recv_bytes");
    wb_mpw_u64(w, r->recv_bytes);
    wb_mpw_str(w, "recv_writes");
    wb_mpw_u64(w, r->recv_writes);
}

/* ---------------------------------------------------------------- decode */

/* Opens a struct array of at least `fields` items; returns the extras to skip. */
static int open_struct(struct wb_mpr *r, uint32_t fields, uint32_t *extra)
{
    uint32_t n;
    if (wb_mpr_array(r, 64, &n) || n < fields)
        return -EBADMSG;
    *extra = n - fields;
    return 0;
}

static int skip_n(struct wb_mpr *r, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++)
        if (wb_mpr_skip(r))
            return -EBADMSG;
    return 0;
}

static int get_u32(struct wb_mpr *r, uint32_t *v)
{
    return wb_mpr_u32(r, v);
}

static int get_enum(struct wb_mpr *r, uint32_t lo, uint32_t hi, uint32_t *v)
{
    if (wb_mpr_u32(r, v) || *v < lo || *v > hi)
        return -EBADMSG;
    return 0;
}

static int get_view(struct wb_mpr *r, struct wb_rt_view *v)
{
    uint32_t extra, kind, dt;
    if (open_struct(r, 5, &extra) || get_enum(r, WB_BUF_PARAM, WB_BUF_TMP, &kind) ||
        get_u32(r, &v->tensor) || wb_mpr_u64(r, &v->off) ||
        get_enum(r, WB_DTYPE_BF16, WB_DTYPE_COUNT - 1, &dt) || get_u32(r, &v->shape) ||
        skip_n(r, extra))
        return -EBADMSG;
    v->kind = (enum wb_rt_buf_kind)kind;
    v->dtype = (enum wb_dtype)dt;
    return 0;
}

static int get_op(struct wb_mpr *r, struct wb_rt_op *o)
{
    uint32_t extra, kind, n;
    if (wb_mpr_array(r, 64, &n) || n < 2 || get_enum(r, WB_OP_H2D, WB_OP_QUANT, &kind) ||
        get_u32(r, &o->tensor))
        return -EBADMSG;
    o->kind = (enum wb_rt_op_kind)kind;
    static const uint32_t fields[] = {0, 5, 9, 10, 6, 6, 9};
    if (n < fields[kind])
        return -EBADMSG;
    extra = n - fields[kind];
    int e = 0;
    switch (o->kind) {
    case WB_OP_H2D:
        e = wb_mpr_u64(r, &o->h2d.src_off) || wb_mpr_u64(r, &o->h2d.bytes) ||
            wb_mpr_u64(r, &o->h2d.dst_off);
        break;
    case WB_OP_GATHER:
        e = get_view(r, &o->gather.src) || get_view(r, &o->gather.dst) ||
            get_u32(r, &o->gather.peer0) || get_u32(r, &o->gather.npeers) ||
            get_u32(r, &o->gather.mesh) || get_u32(r, &o->gather.seq) ||
            wb_mpr_u64(r, &o->gather.bytes_in);
        break;
    case WB_OP_AMAX:
        e = get_u32(r, &o->amax.peer0) || get_u32(r, &o->amax.npeers) ||
            get_view(r, &o->amax.src) || get_u32(r, &o->amax.src_box) ||
            get_u32(r, &o->amax.region) || get_u32(r, &o->amax.blocks) ||
            get_u32(r, &o->amax.grid) || wb_mpr_u64(r, &o->amax.amax_off);
        break;
    case WB_OP_COPY:
    case WB_OP_CAST:
        e = get_view(r, &o->copy.src) || get_view(r, &o->copy.dst) ||
            get_u32(r, &o->copy.src_box) || get_u32(r, &o->copy.dst_box);
        break;
    case WB_OP_QUANT:
        e = get_view(r, &o->quant.src) || get_view(r, &o->quant.dst) ||
            get_u32(r, &o->quant.src_box) || get_u32(r, &o->quant.region) ||
            get_u32(r, &o->quant.grid) || wb_mpr_u64(r, &o->quant.scale_off) ||
            wb_mpr_u64(r, &o->quant.amax_off);
        break;
    }
    return e || skip_n(r, extra) ? -EBADMSG : 0;
}

static int get_expects(struct wb_mpr *r, struct wb_rt_expect **out, uint32_t *n)
{
    if (wb_mpr_array(r, WB_WIRE_MAX_ARRAY, n))
        return -EBADMSG;
    *out = calloc(*n ? *n : 1, sizeof(**out));
    if (!*out)
        return -ENOMEM;
    for (uint32_t i = 0; i < *n; i++) {
        uint32_t extra;
        struct wb_rt_expect *e = &(*out)[i];
        if (open_struct(r, 4, &extra) || get_u32(r, &e->tag) || get_u32(r, &e->tensor) ||
            wb_mpr_u64(r, &e->bytes) || wb_mpr_u64(r, &e->writes) || skip_n(r, extra))
            return -EBADMSG;
    }
    return 0;
}

/* Allocates an array of n elements for a decode (n is already bounded). */
static void *alloc_n(uint32_t n, size_t elem)
{
    return calloc(n ? n : 1, elem);
}

static int decode_table_body(struct wb_mpr *r, struct wb_route_table *t)
{
    uint32_t npairs;
    if (wb_mpr_map(r, 64, &npairs))
        return -EBADMSG;
    char key[32];
    uint64_t format = 0;
    bool cap = false, block = false, mode = false; /* required since format 2 */
    for (uint32_t i = 0; i < npairs; i++) {
        if (wb_mpr_str(r, key, sizeof(key)))
            return -EBADMSG;
        int e = 0;
        if (strcmp(key, "format") == 0) {
            e = wb_mpr_u64(r, &format) || format != WB_PLAN_FORMAT ? -WB_E_VERSION : 0;
            if (e)
                return e;
        } else if (strcmp(key, "rank") == 0) {
            e = get_u32(r, &t->rank);
        } else if (strcmp(key, "ntrainers") == 0) {
            e = get_u32(r, &t->ntrainers);
        } else if (strcmp(key, "nrollouts") == 0) {
            e = get_u32(r, &t->nrollouts);
        } else if (strcmp(key, "tag_bits") == 0) {
            e = get_enum(r, 1, 32, &t->tag_bits);
        } else if (strcmp(key, "residence") == 0) {
            uint32_t v;
            e = get_enum(r, WB_RESIDE_GPU, WB_RESIDE_HOST, &v);
            t->residence = (enum wb_residence)v;
        } else if (strcmp(key, "phases") == 0 && !t->phases) {
            if (wb_mpr_array(r, WB_WIRE_MAX_ARRAY, &t->nphases))
                return -EBADMSG;
            if (!(t->phases = alloc_n(t->nphases, sizeof(*t->phases))))
                return -ENOMEM;
            for (uint32_t k = 0; k < t->nphases && !e; k++) {
                uint32_t extra;
                e = open_struct(r, 3, &extra) || get_u32(r, &t->phases[k].task0) ||
                    get_u32(r, &t->phases[k].ntasks) ||
                    wb_mpr_bool(r, &t->phases[k].barrier_after) || skip_n(r, extra);
            }
        } else if (strcmp(key, "tasks") == 0 && !t->tasks) {
            if (wb_mpr_array(r, WB_WIRE_MAX_ARRAY, &t->ntasks))
                return -EBADMSG;
            if (!(t->tasks = alloc_n(t->ntasks, sizeof(*t->tasks))))
                return -ENOMEM;
            for (uint32_t k = 0; k < t->ntasks && !e; k++) {
                struct wb_rt_task *x = &t->tasks[k];
                uint32_t extra, mode = 0;
                e = open_struct(r, 11, &extra) || get_u32(r, &x->mapping) || get_u32(r, &x->item) ||
                    get_u32(r, &x->phase) || get_u32(r, &x->mesh) ||
                    get_enum(r, WB_MODE_DIRECT, WB_MODE_GATHER, &mode) ||
                    wb_mpr_u64(r, &x->tmp_bytes) || get_u32(r, &x->op0) || get_u32(r, &x->nops) ||
                    get_u32(r, &x->write0) || get_u32(r, &x->nwrites) ||
                    wb_mpr_u64(r, &x->write_bytes) || skip_n(r, extra);
                x->mode = (enum wb_plan_mode)mode;
            }
        } else if (strcmp(key, "ops") == 0 && !t->ops) {
            if (wb_mpr_array(r, WB_WIRE_MAX_ARRAY, &t->nops))
                return -EBADMSG;
            if (!(t->ops = alloc_n(t->nops, sizeof(*t->ops))))
                return -ENOMEM;
            for (uint32_t k = 0; k < t->nops && !e; k++)
                e = get_op(r, &t->ops[k]);
        } else if (strcmp(key, "peers") == 0 && !t->peers) {
            if (wb_mpr_array(r, WB_WIRE_MAX_ARRAY, &t->npeers))
                return -EBADMSG;
            if (!(t->peers = alloc_n(t->npeers, sizeof(*t->peers))))
                return -ENOMEM;
            for (uint32_t k = 0; k < t->npeers && !e; k++) {
                uint32_t extra;
                e = open_struct(r, 2, &extra) || get_u32(r, &t->peers[k].rank) ||
                    get_u32(r, &t->peers[k].box) || skip_n(r, extra);
            }
        } else if (strcmp(key, "amax_peers") == 0 && !t->amax_peers) {
            if (wb_mpr_array(r, WB_WIRE_MAX_ARRAY, &t->namax_peers))
                return -EBADMSG;
            if (!(t->amax_peers = alloc_n(t->namax_peers, sizeof(*t->amax_peers))))
                return -ENOMEM;
            for (uint32_t k = 0; k < t->namax_peers && !e; k++) {
                struct wb_rt_amax_peer *x = &t->amax_peers[k];
                uint32_t extra;
                e = open_struct(r, 4, &extra) || get_u32(r, &x->rank) || get_u32(r, &x->tag) ||
                    wb_mpr_u64(r, &x->peer_inbox_off) || wb_mpr_u64(r, &x->inbox_off) ||
                    skip_n(r, extra);
            }
        } else if (strcmp(key, "boxes") == 0 && !t->boxes) {
            if (wb_mpr_array(r, WB_WIRE_MAX_ARRAY, &t->nboxes))
                return -EBADMSG;
            if (!(t->boxes = alloc_n(t->nboxes, sizeof(*t->boxes))))
                return -ENOMEM;
            for (uint32_t k = 0; k < t->nboxes && !e; k++)
                e = wb_wire_get_box(r, &t->boxes[k]);
        } else if (strcmp(key, "shapes") == 0 && !t->shapes) {
            if (wb_mpr_array(r, WB_WIRE_MAX_ARRAY, &t->nshapes))
                return -EBADMSG;
            if (!(t->shapes = alloc_n(t->nshapes, sizeof(*t->shapes))))
                return -ENOMEM;
            for (uint32_t k = 0; k < t->nshapes && !e; k++)
                e = wb_wire_get_shape(r, &t->shapes[k]);
        } else if (strcmp(key, "writes") == 0 && !t->writes) {
            if (wb_mpr_array(r, WB_WIRE_MAX_ARRAY, &t->nwrites))
                return -EBADMSG;
            if (!(t->writes = alloc_n(t->nwrites, sizeof(*t->writes))))
                return -ENOMEM;
            for (uint32_t k = 0; k < t->nwrites && !e; k++) {
                struct wb_rt_write *x = &t->writes[k];
                uint32_t extra;
                e = open_struct(r, 9, &extra) || wb_mpr_u64(r, &x->src_off) ||
                    wb_mpr_u64(r, &x->dst_off) || wb_mpr_u64(r, &x->len) ||
                    get_u32(r, &x->src_tensor) || get_u32(r, &x->dst_rank) ||
                    get_u32(r, &x->dst_tensor) || get_u32(r, &x->tag) || get_u32(r, &x->more) ||
                    get_u32(r, &x->rank_step) || skip_n(r, extra);
                e = e || x->src_off + x->len < x->src_off || x->dst_off + x->len < x->dst_off;
            }
        } else if (strcmp(key, "amax_inbox_bytes") == 0) {
            e = wb_mpr_u64(r, &t->amax_inbox_bytes);
        } else if (strcmp(key, "amax") == 0 && !t->amax) {
            e = get_expects(r, &t->amax, &t->namax);
        } else if (strcmp(key, "send_bytes") == 0) {
            e = wb_mpr_u64(r, &t->send_bytes);
        } else if (strcmp(key, "max_tmp_bytes") == 0) {
            e = wb_mpr_u64(r, &t->max_tmp_bytes);
        } else if (strcmp(key, "mem_cap") == 0) {
            e = wb_mpr_u64(r, &t->mem_cap) || t->mem_cap == 0;
            cap = true;
        } else if (strcmp(key, "block") == 0) {
            e = get_enum(r, WB_FP8_BLOCK, WB_FP8_BLOCK, &t->block);
            block = true;
        } else if (strcmp(key, "mode") == 0) {
            uint32_t v;
            e = get_enum(r, WB_MODE_AUTO, WB_MODE_GATHER, &v);
            t->mode = (enum wb_plan_mode)v;
            mode = true;
        } else {
            e = wb_mpr_skip(r);
        }
        if (e)
            return e < 0 ? e : -EBADMSG;
    }
    return format == WB_PLAN_FORMAT && cap && block && mode ? 0 : -EBADMSG;
}

/* ---------------------------------------------------------------- consistency */

static bool view_ok(const struct wb_route_table *t, const struct wb_rt_view *v)
{
    return v->shape < t->nshapes;
}

/* Box index valid and the box inside the view's shape. */
static bool box_in(const struct wb_route_table *t, const struct wb_rt_view *v, uint32_t b)
{
    return view_ok(t, v) && b < t->nboxes && t->boxes[b].ndim == t->shapes[v->shape].ndim &&
           wb_box_within(&t->shapes[v->shape], &t->boxes[b]);
}

static bool op_ok(const struct wb_route_table *t, const struct wb_rt_op *o)
{
    switch (o->kind) {
    case WB_OP_H2D:
        return o->h2d.src_off + o->h2d.bytes >= o->h2d.src_off;
    case WB_OP_GATHER:
        return view_ok(t, &o->gather.src) && view_ok(t, &o->gather.dst) &&
               o->gather.peer0 <= t->npeers && o->gather.npeers <= t->npeers - o->gather.peer0;
    case WB_OP_AMAX:
        return o->amax.npeers >= 1 && o->amax.peer0 <= t->namax_peers &&
               o->amax.npeers <= t->namax_peers - o->amax.peer0 &&
               box_in(t, &o->amax.src, o->amax.src_box) && o->amax.region < t->nboxes &&
               o->amax.blocks < t->nboxes && o->amax.grid < t->nboxes &&
               t->boxes[o->amax.region].ndim == t->boxes[o->amax.src_box].ndim;
    case WB_OP_COPY:
    case WB_OP_CAST:
        return box_in(t, &o->copy.src, o->copy.src_box) &&
               box_in(t, &o->copy.dst, o->copy.dst_box) &&
               wb_box_numel(&t->boxes[o->copy.src_box]) ==
                   wb_box_numel(&t->boxes[o->copy.dst_box]) &&
               (o->kind == WB_OP_CAST || o->copy.src.dtype == o->copy.dst.dtype);
    case WB_OP_QUANT:
        return box_in(t, &o->quant.src, o->quant.src_box) && view_ok(t, &o->quant.dst) &&
               o->quant.region < t->nboxes && o->quant.grid < t->nboxes &&
               wb_box_numel(&t->boxes[o->quant.region]) ==
                   wb_box_numel(&t->boxes[o->quant.src_box]) &&
               wb_shape_numel(&t->shapes[o->quant.dst.shape]) >=
                   wb_box_numel(&t->boxes[o->quant.region]);
    }
    return false;
}

/* Cross-checks indices once everything is read. */
static int check_table(const struct wb_route_table *t)
{
    if (t->rank >= t->ntrainers || t->tag_bits == 0)
        return -EBADMSG;
    uint32_t next = 0;
    for (uint32_t i = 0; i < t->nphases; i++) {
        if (t->phases[i].task0 != next || t->phases[i].ntasks > t->ntasks - next)
            return -EBADMSG;
        next += t->phases[i].ntasks;
    }
    if (next != t->ntasks)
        return -EBADMSG;
    for (uint32_t i = 0; i < t->ntasks; i++) {
        const struct wb_rt_task *k = &t->tasks[i];
        if (k->phase >= t->nphases || k->op0 > t->nops || k->nops > t->nops - k->op0 ||
            k->write0 > t->nwrites || k->nwrites > t->nwrites - k->write0)
            return -EBADMSG;
    }
    for (uint32_t i = 0; i < t->nops; i++)
        if (!op_ok(t, &t->ops[i]))
            return -EBADMSG;
    for (uint32_t i = 0; i < t->npeers; i++)
        if (t->peers[i].rank >= t->ntrainers || t->peers[i].box >= t->nboxes)
            return -EBADMSG;
    for (uint32_t i = 0; i < t->namax_peers; i++)
        if (t->amax_peers[i].rank >= t->ntrainers || t->amax_peers[i].rank == t->rank)
            return -EBADMSG;
    uint64_t tagmax = t->tag_bits >= 32 ? UINT32_MAX : (1ull << t->tag_bits) - 1;
    for (uint32_t i = 0; i < t->nwrites; i++) {
        const struct wb_rt_write *x = &t->writes[i];
        uint64_t last = x->dst_rank + (uint64_t)x->more * x->rank_step;
        if (last >= t->nrollouts || x->tag > tagmax || (x->more && !x->rank_step))
            return -EBADMSG;
    }
    return 0;
}

uint64_t wb_route_table_writes(const struct wb_route_table *t)
{
    uint64_t n = 0;
    for (uint32_t i = 0; i < t->nwrites; i++)
        n += wb_rt_copies(&t->writes[i]);
    return n;
}

int wb_route_table_expand(struct wb_route_table *t)
{
    uint64_t n = wb_route_table_writes(t);
    if (n == t->nwrites)
        return 0;
    if (n > WB_WIRE_MAX_ARRAY) /* the bound a table's writes had before records */
        return -EBADMSG;
    for (uint32_t i = 0; i < t->ntasks; i++)
        if (t->tasks[i].write0 > t->nwrites ||
            t->tasks[i].nwrites > t->nwrites - t->tasks[i].write0)
            return -EBADMSG;
    uint32_t *at = malloc(((size_t)t->nwrites + 1) * sizeof(uint32_t));
    struct wb_rt_write *w = malloc((size_t)n * sizeof(*w));
    if (!at || !w) {
        free(at);
        free(w);
        return -ENOMEM;
    }
    uint32_t k = 0;
    for (uint32_t i = 0; i < t->nwrites; i++) {
        const struct wb_rt_write *x = &t->writes[i];
        at[i] = k;
        for (uint32_t c = 0; c < wb_rt_copies(x); c++, k++) {
            w[k] = *x;
            w[k].dst_rank = wb_rt_copy_rank(x, c);
            w[k].more = w[k].rank_step = 0;
        }
    }
    at[t->nwrites] = k;
    for (uint32_t i = 0; i < t->ntasks; i++) {
        struct wb_rt_task *tk = &t->tasks[i];
        uint32_t a = at[tk->write0], z = at[tk->write0 + tk->nwrites];
        tk->write0 = a;
        tk->nwrites = z - a;
    }
    free(at);
    free(t->writes);
    t->writes = w;
    t->nwrites = k;
    return 0;
}

int wb_route_table_decode(const void *buf, size_t len, struct wb_route_table *out)
{
    struct wb_mpr r;
    wb_mpr_init(&r, buf, len);
    uint32_t type;
    int e = wb_mpr_envelope(&r, &type);
    if (e)
        return e;
    if (type != WB_MSG_ROUTE_TABLE)
        return -EBADMSG;
    struct wb_route_table t;
    memset(&t, 0, sizeof(t));
    e = decode_table_body(&r, &t);
    if (!e)
        e = wb_mpr_end(&r);
    if (!e)
        e = check_table(&t);
    if (!e)
        e = wb_route_table_expand(&t);
    if (e) {
        wb_route_table_free(&t);
        return e;
    }
    *out = t;
    return 0;
}

int wb_recv_list_decode(const void *buf, size_t len, struct wb_recv_list *out)
{
    struct wb_mpr r;
    wb_mpr_init(&r, buf, len);
    uint32_t type, npairs;
    int e = wb_mpr_envelope(&r, &type);
    if (e)
        return e;
    if (type != WB_MSG_RECV_LIST || wb_mpr_map(&r, 64, &npairs))
        return -EBADMSG;
    struct wb_recv_list v;
    memset(&v, 0, sizeof(v));
    uint64_t format = 0;
    char key[32];
    for (uint32_t i = 0; i < npairs && !e; i++) {
        if (wb_mpr_str(&r, key, sizeof(key))) {
            e = -EBADMSG;
            break;
        }
        if (strcmp(key, "format") == 0) {
            e = wb_mpr_u64(&r, &format) || format != WB_PLAN_FORMAT ? -WB_E_VERSION : 0;
        } else if (strcmp(key, "rank") == 0) {
            e = get_u32(&r, &v.rank);
        } else if (strcmp(key, "replica") == 0) {
            e = get_u32(&r, &v.replica);
        } else if (strcmp(key, "tp_rank") == 0) {
            e = get_u32(&r, &v.tp_rank);
        } else if (strcmp(key, "ep_rank") == 0) {
            e = get_u32(&r, &v.ep_rank);
        } else if (strcmp(key, "tag_bits") == 0) {
            e = get_enum(&r, 1, 32, &v.tag_bits);
        } else if (strcmp(key, "local") == 0 && !v.local) {
            if (wb_mpr_array(&r, WB_WIRE_MAX_ARRAY, &v.nlocal)) {
                e = -EBADMSG;
                break;
            }
            if (!(v.local = alloc_n(v.nlocal, sizeof(*v.local)))) {
                e = -ENOMEM;
                break;
            }
            for (uint32_t k = 0; k < v.nlocal && !e; k++) {
                uint32_t extra, dt = 0;
                struct wb_rt_local *l = &v.local[k];
                e = open_struct(&r, 4, &extra) || get_u32(&r, &l->tensor) ||
                    get_enum(&r, WB_DTYPE_BF16, WB_DTYPE_COUNT - 1, &dt) ||
                    wb_wire_get_shape(&r, &l->shape) || wb_mpr_u64(&r, &l->bytes) ||
                    skip_n(&r, extra);
                l->dtype = (enum wb_dtype)dt;
                e = e || l->bytes != wb_shape_numel(&l->shape) * wb_dtype_size(l->dtype);
                e = e ? -EBADMSG : 0;
            }
        } else if (strcmp(key, "expect") == 0 && !v.expect) {
            e = get_expects(&r, &v.expect, &v.nexpect);
        } else if (strcmp(key, "recv_bytes") == 0) {
            e = wb_mpr_u64(&r, &v.recv_bytes);
        } else if (strcmp(key, "recv_writes") == 0) {
            e = wb_mpr_u64(&r, &v.recv_writes);
        } else {
            e = wb_mpr_skip(&r);
        }
        if (e > 0)
            e = -EBADMSG;
    }
    if (!e && format != WB_PLAN_FORMAT)
        e = -EBADMSG;
    if (!e)
        e = wb_mpr_end(&r);
    if (e) {
        wb_recv_list_free(&v);
        return e;
    }
    *out = v;
    return 0;
}

/* ---------------------------------------------------------------- names and freeing */

const char *wb_plan_mode_name(enum wb_plan_mode m)
{
    static const char *const names[] = {"auto", "direct", "amax", "gather"};
    return (unsigned)m < 4 ? names[m] : "invalid";
}

int wb_plan_mode_parse(const char *s, enum wb_plan_mode *out)
{
    for (int m = 0; m < 4; m++)
        if (m != WB_MODE_AMAX && strcmp(s, wb_plan_mode_name((enum wb_plan_mode)m)) == 0) {
            *out = (enum wb_plan_mode)m;
            return 0;
        }
    return -EINVAL;
}

void wb_route_table_free(struct wb_route_table *t)
{
    if (!t)
        return;
    free(t->phases);
    free(t->tasks);
    free(t->ops);
    free(t->peers);
    free(t->amax_peers);
    free(t->boxes);
    free(t->shapes);
    free(t->writes);
    free(t->amax);
    memset(t, 0, sizeof(*t));
}

void wb_recv_list_free(struct wb_recv_list *r)
{
    if (!r)
        return;
    free(r->local);
    free(r->expect);
    memset(r, 0, sizeof(*r));
}
