/* route.c — routing tables and receive lists on the wire: common's versioned msgpack envelope
 * around a map body ("format" first, then named arrays of compact struct arrays), and a
 * decoder that trusts nothing: every count is bounded before allocation, every index is
 * checked against its array, every box against its shape, every enum against its range.
 * Unknown map keys and extra trailing struct fields are skipped, so later formats can add
 * data without breaking older readers. Also the mode names and the free functions.
 *
 * Why compact arrays here and key/value tables in proto/: a Kimi-K2 plan has ten million
 * writes; naming every field of every record would triple the bytes handed out at setup. The
 * codec is table-driven all the same: each record's fields and each body's keys are rows
 * below, walked by one encoder and one decoder (the bytes are those of the hand-written codec
 * this replaced: plan_golden_test's digests did not change). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "route/route.h"

/* ---------------------------------------------------------------- tables
 *
 * Like proto/'s codec, a field is declared once, in a table row, and the one encoder and the one
 * decoder below walk the rows: neither can disagree with the other on a key, a field's place in
 * a record or a record's length, and no count is written by hand. A row is a field of a record
 * (a compact msgpack array: its place is its index) or a key of a body (a map). */

enum rt_type {
    RT_U32,   /* uint32_t */
    RT_U64,   /* uint64_t */
    RT_BOOL,  /* bool */
    RT_ENUM,  /* an enum (4 bytes) in [lo, hi] */
    RT_REC,   /* a nested record (sub) */
    RT_BOX,   /* struct wb_box (common's wire form) */
    RT_SHAPE, /* struct wb_shape */
    RT_OP,    /* struct wb_rt_op: kind, tensor, then the kind's record */
    RT_ARRAY, /* body keys only: count (uint32_t at off) and array (pointer at ptr) of elem */
    RT_CONST, /* body keys only: the constant lo, stored nowhere; a decoder refuses another */
};

struct rt_record;

struct rt_field {
    enum rt_type type;
    size_t off;
    uint32_t lo, hi;             /* RT_ENUM's range */
    const struct rt_record *sub; /* RT_REC, and RT_ARRAY's elements when they are records */
};

/* A record: its fields in wire order, and a check of the decoded whole (or NULL). */
struct rt_record {
    const struct rt_field *f;
    uint32_t n;
    bool (*ok)(const void *rec);
};

/* A key of a body map. */
struct rt_key {
    const char *key;
    struct rt_field f;
    size_t ptr, elem;   /* RT_ARRAY: where the array pointer lives, element size */
    enum rt_type etype; /* RT_ARRAY: element type (RT_REC with f.sub, RT_BOX, RT_SHAPE, RT_OP) */
    bool required;      /* a table without it is refused */
    bool nonzero;       /* 0 is refused */
};

_Static_assert(sizeof(enum wb_plan_mode) == sizeof(uint32_t) &&
                   sizeof(enum wb_rt_buf_kind) == sizeof(uint32_t) &&
                   sizeof(enum wb_dtype) == sizeof(uint32_t) &&
                   sizeof(enum wb_residence) == sizeof(uint32_t),
               "RT_ENUM fields are stored as 4 bytes");

#define N(a) ((uint32_t)(sizeof(a) / sizeof((a)[0])))
#define U32(T, m)                                                                                  \
    {                                                                                              \
        RT_U32, offsetof(T, m), 0, 0, NULL                                                         \
    }
#define U64(T, m)                                                                                  \
    {                                                                                              \
        RT_U64, offsetof(T, m), 0, 0, NULL                                                         \
    }
#define ENUM(T, m, lo, hi)                                                                         \
    {                                                                                              \
        RT_ENUM, offsetof(T, m), lo, hi, NULL                                                      \
    }
#define REC(T, m, sub)                                                                             \
    {                                                                                              \
        RT_REC, offsetof(T, m), 0, 0, sub                                                          \
    }

static const struct rt_field view_f[] = {
    ENUM(struct wb_rt_view, kind, WB_BUF_PARAM, WB_BUF_TMP),
    U32(struct wb_rt_view, tensor),
    U64(struct wb_rt_view, off),
    ENUM(struct wb_rt_view, dtype, WB_DTYPE_BF16, WB_DTYPE_COUNT - 1),
    U32(struct wb_rt_view, shape),
};
static const struct rt_record view_r = {view_f, N(view_f), NULL};

/* The op records, after the kind and tensor every op starts with (offsets in struct wb_rt_op). */
static const struct rt_field h2d_f[] = {
    U64(struct wb_rt_op, h2d.src_off),
    U64(struct wb_rt_op, h2d.bytes),
    U64(struct wb_rt_op, h2d.dst_off),
};
static const struct rt_field gather_f[] = {
    REC(struct wb_rt_op, gather.src, &view_r), REC(struct wb_rt_op, gather.dst, &view_r),
    U32(struct wb_rt_op, gather.peer0),        U32(struct wb_rt_op, gather.npeers),
    U32(struct wb_rt_op, gather.mesh),         U32(struct wb_rt_op, gather.seq),
    U64(struct wb_rt_op, gather.bytes_in),
};
static const struct rt_field amax_f[] = {
    U32(struct wb_rt_op, amax.peer0),        U32(struct wb_rt_op, amax.npeers),
    REC(struct wb_rt_op, amax.src, &view_r), U32(struct wb_rt_op, amax.src_box),
    U32(struct wb_rt_op, amax.region),       U32(struct wb_rt_op, amax.blocks),
    U32(struct wb_rt_op, amax.grid),         U64(struct wb_rt_op, amax.amax_off),
};
static const struct rt_field copy_f[] = {
    REC(struct wb_rt_op, copy.src, &view_r),
    REC(struct wb_rt_op, copy.dst, &view_r),
    U32(struct wb_rt_op, copy.src_box),
    U32(struct wb_rt_op, copy.dst_box),
};
static const struct rt_field quant_f[] = {
    REC(struct wb_rt_op, quant.src, &view_r), REC(struct wb_rt_op, quant.dst, &view_r),
    U32(struct wb_rt_op, quant.src_box),      U32(struct wb_rt_op, quant.region),
    U32(struct wb_rt_op, quant.grid),         U64(struct wb_rt_op, quant.scale_off),
    U64(struct wb_rt_op, quant.amax_off),
};
static const struct rt_field permute_f[] = {
    REC(struct wb_rt_op, permute.src, &view_r), REC(struct wb_rt_op, permute.dst, &view_r),
    U32(struct wb_rt_op, permute.src_box),      U32(struct wb_rt_op, permute.dst_box),
    U32(struct wb_rt_op, permute.perm),
};
/* Indexed by enum wb_rt_op_kind (COPY and CAST share one record). */
static const struct rt_record op_r[] = {
    [WB_OP_H2D] = {h2d_f, N(h2d_f), NULL},
    [WB_OP_GATHER] = {gather_f, N(gather_f), NULL},
    [WB_OP_AMAX] = {amax_f, N(amax_f), NULL},
    [WB_OP_COPY] = {copy_f, N(copy_f), NULL},
    [WB_OP_CAST] = {copy_f, N(copy_f), NULL},
    [WB_OP_QUANT] = {quant_f, N(quant_f), NULL},
    [WB_OP_PERMUTE] = {permute_f, N(permute_f), NULL},
};

static const struct rt_field phase_f[] = {
    U32(struct wb_rt_phase, task0),
    U32(struct wb_rt_phase, ntasks),
    {RT_BOOL, offsetof(struct wb_rt_phase, barrier_after), 0, 0, NULL},
};
static const struct rt_record phase_r = {phase_f, N(phase_f), NULL};

static const struct rt_field task_f[] = {
    U32(struct wb_rt_task, mapping),
    U32(struct wb_rt_task, item),
    U32(struct wb_rt_task, phase),
    U32(struct wb_rt_task, mesh),
    ENUM(struct wb_rt_task, mode, WB_MODE_DIRECT, WB_MODE_GATHER),
    U64(struct wb_rt_task, tmp_bytes),
    U32(struct wb_rt_task, op0),
    U32(struct wb_rt_task, nops),
    U32(struct wb_rt_task, write0),
    U32(struct wb_rt_task, nwrites),
    U64(struct wb_rt_task, write_bytes),
};
static const struct rt_record task_r = {task_f, N(task_f), NULL};

static const struct rt_field peer_f[] = {
    U32(struct wb_rt_peer, rank),
    U32(struct wb_rt_peer, box),
};
static const struct rt_record peer_r = {peer_f, N(peer_f), NULL};

static const struct rt_field amax_peer_f[] = {
    U32(struct wb_rt_amax_peer, rank),
    U32(struct wb_rt_amax_peer, tag),
    U64(struct wb_rt_amax_peer, peer_inbox_off),
    U64(struct wb_rt_amax_peer, inbox_off),
};
static const struct rt_record amax_peer_r = {amax_peer_f, N(amax_peer_f), NULL};

static bool write_ok(const void *rec)
{
    const struct wb_rt_write *x = rec;
    return x->src_off + x->len >= x->src_off && x->dst_off + x->len >= x->dst_off;
}

static const struct rt_field write_f[] = {
    U64(struct wb_rt_write, src_off),   U64(struct wb_rt_write, dst_off),
    U64(struct wb_rt_write, len),       U32(struct wb_rt_write, src_tensor),
    U32(struct wb_rt_write, dst_rank),  U32(struct wb_rt_write, dst_tensor),
    U32(struct wb_rt_write, tag),       U32(struct wb_rt_write, more),
    U32(struct wb_rt_write, rank_step),
};
static const struct rt_record write_r = {write_f, N(write_f), write_ok};

static const struct rt_field expect_f[] = {
    U32(struct wb_rt_expect, tag),
    U32(struct wb_rt_expect, tensor),
    U64(struct wb_rt_expect, bytes),
    U64(struct wb_rt_expect, writes),
};
static const struct rt_record expect_r = {expect_f, N(expect_f), NULL};

static bool local_ok(const void *rec)
{
    const struct wb_rt_local *l = rec;
    return l->bytes == wb_shape_numel(&l->shape) * wb_dtype_size(l->dtype);
}

static const struct rt_field local_f[] = {
    U32(struct wb_rt_local, tensor),
    ENUM(struct wb_rt_local, dtype, WB_DTYPE_BF16, WB_DTYPE_COUNT - 1),
    {RT_SHAPE, offsetof(struct wb_rt_local, shape), 0, 0, NULL},
    U64(struct wb_rt_local, bytes),
};
static const struct rt_record local_r = {local_f, N(local_f), local_ok};

/* A body key of a scalar field, an array of records or an array of boxes, shapes or ops. */
#define KEY(k, field)                                                                              \
    {                                                                                              \
        k, field, 0, 0, RT_U32, false, false                                                       \
    }
#define KEY_ARRAY(T, k, n, arr, etype, sub)                                                        \
    {                                                                                              \
        k, {RT_ARRAY, offsetof(T, n), 0, 0, sub}, offsetof(T, arr), sizeof(*((T *)0)->arr), etype, \
            false, false                                                                           \
    }

/* The "format" key comes first in every body and is handled by the walkers themselves. */
static const struct rt_key table_keys[] = {
    KEY("rank", U32(struct wb_route_table, rank)),
    KEY("ntrainers", U32(struct wb_route_table, ntrainers)),
    KEY("nrollouts", U32(struct wb_route_table, nrollouts)),
    KEY("tag_bits", ENUM(struct wb_route_table, tag_bits, 1, 32)),
    KEY("residence", ENUM(struct wb_route_table, residence, WB_RESIDE_GPU, WB_RESIDE_HOST)),
    KEY_ARRAY(struct wb_route_table, "phases", nphases, phases, RT_REC, &phase_r),
    KEY_ARRAY(struct wb_route_table, "tasks", ntasks, tasks, RT_REC, &task_r),
    KEY_ARRAY(struct wb_route_table, "ops", nops, ops, RT_OP, NULL),
    KEY_ARRAY(struct wb_route_table, "peers", npeers, peers, RT_REC, &peer_r),
    KEY_ARRAY(struct wb_route_table, "amax_peers", namax_peers, amax_peers, RT_REC, &amax_peer_r),
    KEY_ARRAY(struct wb_route_table, "boxes", nboxes, boxes, RT_BOX, NULL),
    KEY_ARRAY(struct wb_route_table, "shapes", nshapes, shapes, RT_SHAPE, NULL),
    KEY_ARRAY(struct wb_route_table, "writes", nwrites, writes, RT_REC, &write_r),
    KEY("amax_inbox_bytes", U64(struct wb_route_table, amax_inbox_bytes)),
    KEY_ARRAY(struct wb_route_table, "amax", namax, amax, RT_REC, &expect_r),
    KEY("send_bytes", U64(struct wb_route_table, send_bytes)),
    KEY("max_tmp_bytes", U64(struct wb_route_table, max_tmp_bytes)),
    {"mem_cap", U64(struct wb_route_table, mem_cap), 0, 0, RT_U32, true, true},
    /* The FP8 block edge of QUANT and AMAX ops: on the wire since format 2, so that an
     * executor built for another edge refuses the table; in no struct (WB_FP8_BLOCK). */
    {"block", {RT_CONST, 0, WB_FP8_BLOCK, WB_FP8_BLOCK, NULL}, 0, 0, RT_U32, true, false},
    {"mode", ENUM(struct wb_route_table, mode, WB_MODE_AUTO, WB_MODE_GATHER), 0, 0, RT_U32, true,
     false},
};

static const struct rt_key recv_keys[] = {
    KEY("rank", U32(struct wb_recv_list, rank)),
    KEY("replica", U32(struct wb_recv_list, replica)),
    KEY("tp_rank", U32(struct wb_recv_list, tp_rank)),
    KEY("ep_rank", U32(struct wb_recv_list, ep_rank)),
    KEY("tag_bits", ENUM(struct wb_recv_list, tag_bits, 1, 32)),
    KEY_ARRAY(struct wb_recv_list, "local", nlocal, local, RT_REC, &local_r),
    KEY_ARRAY(struct wb_recv_list, "expect", nexpect, expect, RT_REC, &expect_r),
    KEY("recv_bytes", U64(struct wb_recv_list, recv_bytes)),
    KEY("recv_writes", U64(struct wb_recv_list, recv_writes)),
};
_Static_assert(N(table_keys) < 64 && N(recv_keys) < 64, "required keys are tracked in a mask");

/* ---------------------------------------------------------------- encode */

static uint32_t get32(const void *base, size_t off)
{
    uint32_t v;
    memcpy(&v, (const char *)base + off, sizeof(v));
    return v;
}

static uint64_t get64(const void *base, size_t off)
{
    uint64_t v;
    memcpy(&v, (const char *)base + off, sizeof(v));
    return v;
}

static void put_record(struct wb_mpw *w, const struct rt_record *rec, const void *base);
static void put_op(struct wb_mpw *w, const struct wb_rt_op *o);

static void put_value(struct wb_mpw *w, const struct rt_field *f, const void *base)
{
    const char *p = (const char *)base + f->off;
    switch (f->type) {
    case RT_U32:
    case RT_ENUM:
        wb_mpw_u64(w, get32(base, f->off));
        break;
    case RT_U64:
        wb_mpw_u64(w, get64(base, f->off));
        break;
    case RT_BOOL:
        wb_mpw_bool(w, *(const bool *)p);
        break;
    case RT_REC:
        put_record(w, f->sub, p);
        break;
    case RT_BOX:
        wb_wire_put_box(w, (const struct wb_box *)p);
        break;
    case RT_SHAPE:
        wb_wire_put_shape(w, (const struct wb_shape *)p);
        break;
    case RT_OP:
        put_op(w, (const struct wb_rt_op *)p);
        break;
    case RT_CONST:
        wb_mpw_u64(w, f->lo);
        break;
    case RT_ARRAY:
        break; /* body keys only: put_body */
    }
}

static void put_record(struct wb_mpw *w, const struct rt_record *rec, const void *base)
{
    wb_mpw_array(w, rec->n);
    for (uint32_t i = 0; i < rec->n; i++)
        put_value(w, &rec->f[i], base);
}

static const struct rt_record *op_record(uint32_t kind)
{
    return kind >= WB_OP_H2D && kind <= WB_OP_PERMUTE ? &op_r[kind] : NULL;
}

static void put_op(struct wb_mpw *w, const struct wb_rt_op *o)
{
    const struct rt_record *rec = op_record(o->kind);
    wb_mpw_array(w, 2 + (rec ? rec->n : 0));
    wb_mpw_u64(w, o->kind);
    wb_mpw_u64(w, o->tensor);
    for (uint32_t i = 0; rec && i < rec->n; i++)
        put_value(w, &rec->f[i], o);
}

/* A body: "format" first, then every key of the table in order. */
static void put_body(struct wb_mpw *w, const struct rt_key *keys, uint32_t nkeys, const void *base)
{
    wb_mpw_map(w, 1 + nkeys);
    wb_mpw_str(w, "format");
    wb_mpw_u64(w, WB_PLAN_FORMAT);
    for (uint32_t i = 0; i < nkeys; i++) {
        const struct rt_key *k = &keys[i];
        wb_mpw_str(w, k->key);
        if (k->f.type != RT_ARRAY) {
            put_value(w, &k->f, base);
            continue;
        }
        uint32_t n = get32(base, k->f.off);
        const char *arr;
        memcpy(&arr, (const char *)base + k->ptr, sizeof(arr));
        struct rt_field e = {k->etype, 0, 0, 0, k->f.sub};
        wb_mpw_array(w, n);
        for (uint32_t j = 0; j < n; j++)
            put_value(w, &e, arr + (size_t)j * k->elem);
    }
}

void wb_route_table_encode(struct wb_mpw *w, const struct wb_route_table *t)
{
    wb_mpw_envelope(w, WB_MSG_ROUTE_TABLE);
    put_body(w, table_keys, N(table_keys), t);
}

void wb_recv_list_encode(struct wb_mpw *w, const struct wb_recv_list *r)
{
    wb_mpw_envelope(w, WB_MSG_RECV_LIST);
    put_body(w, recv_keys, N(recv_keys), r);
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

static int get_record(struct wb_mpr *r, const struct rt_record *rec, void *base);
static int get_op(struct wb_mpr *r, struct wb_rt_op *o);

/* One value into base + f->off; -EBADMSG when it is missing, mistyped or out of range. */
static int get_value(struct wb_mpr *r, const struct rt_field *f, void *base)
{
    char *p = (char *)base + f->off;
    uint32_t v32;
    switch (f->type) {
    case RT_U32:
    case RT_ENUM:
        if (wb_mpr_u32(r, &v32) || (f->type == RT_ENUM && (v32 < f->lo || v32 > f->hi)))
            return -EBADMSG;
        memcpy(p, &v32, sizeof(v32));
        return 0;
    case RT_U64:
        return wb_mpr_u64(r, (uint64_t *)p) ? -EBADMSG : 0;
    case RT_BOOL:
        return wb_mpr_bool(r, (bool *)p) ? -EBADMSG : 0;
    case RT_REC:
        return get_record(r, f->sub, p);
    case RT_BOX:
        return wb_wire_get_box(r, (struct wb_box *)p) ? -EBADMSG : 0;
    case RT_SHAPE:
        return wb_wire_get_shape(r, (struct wb_shape *)p) ? -EBADMSG : 0;
    case RT_OP:
        return get_op(r, (struct wb_rt_op *)p);
    case RT_CONST:
        return wb_mpr_u32(r, &v32) || v32 != f->lo ? -EBADMSG : 0;
    case RT_ARRAY:
        break;
    }
    return -EBADMSG;
}

/* A record of at least its fields (later formats may append some: skipped), then its check. */
static int get_record(struct wb_mpr *r, const struct rt_record *rec, void *base)
{
    uint32_t extra;
    if (open_struct(r, rec->n, &extra))
        return -EBADMSG;
    for (uint32_t i = 0; i < rec->n; i++)
        if (get_value(r, &rec->f[i], base))
            return -EBADMSG;
    if (skip_n(r, extra) || (rec->ok && !rec->ok(base)))
        return -EBADMSG;
    return 0;
}

static int get_op(struct wb_mpr *r, struct wb_rt_op *o)
{
    uint32_t n, kind;
    if (wb_mpr_array(r, 64, &n) || n < 2 || wb_mpr_u32(r, &kind) || !op_record(kind) ||
        wb_mpr_u32(r, &o->tensor))
        return -EBADMSG;
    o->kind = (enum wb_rt_op_kind)kind;
    const struct rt_record *rec = op_record(kind);
    if (n < 2 + rec->n)
        return -EBADMSG;
    for (uint32_t i = 0; i < rec->n; i++)
        if (get_value(r, &rec->f[i], o))
            return -EBADMSG;
    return skip_n(r, n - 2 - rec->n);
}

/* An array key: bounded count, then the elements into a new array (n ? n : 1 elements, so a
 * decoded empty array is still "seen"). */
static int get_array(struct wb_mpr *r, const struct rt_key *k, void *base)
{
    uint32_t n;
    if (wb_mpr_array(r, WB_WIRE_MAX_ARRAY, &n))
        return -EBADMSG;
    char *arr = calloc(n ? n : 1, k->elem);
    if (!arr)
        return -ENOMEM;
    memcpy((char *)base + k->f.off, &n, sizeof(n));
    memcpy((char *)base + k->ptr, &arr, sizeof(arr));
    struct rt_field e = {k->etype, 0, 0, 0, k->f.sub};
    for (uint32_t j = 0; j < n; j++)
        if (get_value(r, &e, arr + (size_t)j * k->elem))
            return -EBADMSG;
    return 0;
}

/* A body map into base: "format" must be WB_PLAN_FORMAT (-WB_E_VERSION), every required key
 * present, each array key read once (a repeat is skipped, as unknown keys are). */
static int get_body(struct wb_mpr *r, const struct rt_key *keys, uint32_t nkeys, void *base)
{
    uint32_t npairs;
    if (wb_mpr_map(r, 64, &npairs))
        return -EBADMSG;
    char key[32];
    uint64_t format = 0, seen = 0, required = 0;
    for (uint32_t i = 0; i < nkeys; i++)
        required |= keys[i].required ? 1ull << i : 0;
    for (uint32_t p = 0; p < npairs; p++) {
        if (wb_mpr_str(r, key, sizeof(key)))
            return -EBADMSG;
        if (strcmp(key, "format") == 0) {
            if (wb_mpr_u64(r, &format) || format != WB_PLAN_FORMAT)
                return -WB_E_VERSION;
            continue;
        }
        const struct rt_key *k = NULL;
        for (uint32_t i = 0; i < nkeys && !k; i++)
            if (strcmp(key, keys[i].key) == 0)
                k = &keys[i];
        int e;
        if (!k) {
            e = wb_mpr_skip(r) ? -EBADMSG : 0;
        } else if (k->f.type == RT_ARRAY) {
            void *have;
            memcpy(&have, (char *)base + k->ptr, sizeof(have));
            e = have ? (wb_mpr_skip(r) ? -EBADMSG : 0) : get_array(r, k, base);
        } else {
            e = get_value(r, &k->f, base);
            if (!e && k->nonzero && get64(base, k->f.off) == 0)
                e = -EBADMSG;
        }
        if (e)
            return e;
        if (k)
            seen |= 1ull << (k - keys);
    }
    return format == WB_PLAN_FORMAT && (seen & required) == required ? 0 : -EBADMSG;
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

/* A permute op: same dtype and ndim, perm a permutation of the dims, extents permuted. */
static bool permute_ok(const struct wb_route_table *t, const struct wb_rt_permute *p)
{
    if (!box_in(t, &p->src, p->src_box) || !box_in(t, &p->dst, p->dst_box) ||
        p->src.dtype != p->dst.dtype)
        return false;
    const struct wb_box *s = &t->boxes[p->src_box], *d = &t->boxes[p->dst_box];
    if (s->ndim != d->ndim || (s->ndim < 8 && p->perm >> (4 * s->ndim)))
        return false;
    uint32_t seen = 0;
    for (uint32_t k = 0; k < d->ndim; k++) {
        uint32_t j = wb_rt_perm_dim(p->perm, k);
        if (j >= s->ndim || seen >> j & 1 || d->ext[k] != s->ext[j])
            return false;
        seen |= 1u << j;
    }
    return true;
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
    case WB_OP_PERMUTE:
        return permute_ok(t, &o->permute);
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
    e = get_body(&r, table_keys, N(table_keys), &t);
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
    uint32_t type;
    int e = wb_mpr_envelope(&r, &type);
    if (e)
        return e;
    if (type != WB_MSG_RECV_LIST)
        return -EBADMSG;
    struct wb_recv_list v;
    memset(&v, 0, sizeof(v));
    e = get_body(&r, recv_keys, N(recv_keys), &v);
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

const char *const wb_plan_mode_names[] = {
    [WB_MODE_AUTO] = "auto",     [WB_MODE_DIRECT] = "direct", [WB_MODE_AMAX] = "amax",
    [WB_MODE_GATHER] = "gather", [WB_MODE_GATHER + 1] = NULL,
};

const char *wb_plan_mode_name(enum wb_plan_mode m)
{
    return (unsigned)m <= WB_MODE_GATHER ? wb_plan_mode_names[m] : "invalid";
}

int wb_plan_mode_parse(const char *s, enum wb_plan_mode *out)
{
    for (int m = 0; wb_plan_mode_names[m]; m++)
        if (m != WB_MODE_AMAX && strcmp(s, wb_plan_mode_names[m]) == 0) {
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
