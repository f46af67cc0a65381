/* route_test.c — the routing-table and receive-list codec (route/): a table holding every op
 * kind, a fanned-out write record and every array decodes to what was encoded (records
 * expanded), plans' tables and receive lists survive encode -> decode -> encode byte for byte,
 * later formats' additions (an unknown key, trailing record fields) are skipped, a PERMUTE op's
 * permutation is checked, and each
 * malformed body gets its exact error. That the encoding itself did not change is
 * plan_golden_test's digests of the shipped scenarios. */
#include "planner/planner.h"
#include "route/route.h"
#include "tests/wbtest.h"

#include <errno.h>
#include <stdlib.h>

/* ---------------------------------------------------------------- a table with everything */

static const struct wb_shape SHAPES[] = {{2, {4, 4}}};
static const struct wb_box BOXES[] = {{2, {0, 0}, {4, 4}}};
static const struct wb_rt_peer PEERS[] = {{1, 0}};
static const struct wb_rt_amax_peer APEERS[] = {{1, 3, 64, 128}};
static const struct wb_rt_phase PHASES[] = {{0, 1, true}};
static const struct wb_rt_expect AMAX[] = {{3, UINT32_MAX, 64, 1}};

#define VIEW(k, dt)                                                                                \
    {                                                                                              \
        .kind = k, .tensor = 0, .off = 8, .dtype = dt, .shape = 0                                  \
    }

static const struct wb_rt_op OPS[] = {
    {.kind = WB_OP_H2D, .tensor = 0, .h2d = {.src_off = 0, .bytes = 32, .dst_off = 16}},
    {.kind = WB_OP_GATHER,
     .tensor = 0,
     .gather = {.src = VIEW(WB_BUF_PARAM, WB_DTYPE_BF16),
                .dst = VIEW(WB_BUF_TMP, WB_DTYPE_BF16),
                .peer0 = 0,
                .npeers = 1,
                .mesh = 2,
                .seq = 5,
                .bytes_in = 99}},
    {.kind = WB_OP_AMAX,
     .tensor = 0,
     .amax = {.peer0 = 0,
              .npeers = 1,
              .src = VIEW(WB_BUF_TMP, WB_DTYPE_BF16),
              .src_box = 0,
              .region = 0,
              .blocks = 0,
              .grid = 0,
              .amax_off = 256}},
    {.kind = WB_OP_COPY,
     .tensor = 0,
     .copy = {.src = VIEW(WB_BUF_TMP, WB_DTYPE_BF16),
              .dst = VIEW(WB_BUF_TMP, WB_DTYPE_BF16),
              .src_box = 0,
              .dst_box = 0}},
    {.kind = WB_OP_CAST,
     .tensor = 0,
     .copy = {.src = VIEW(WB_BUF_TMP, WB_DTYPE_BF16),
              .dst = VIEW(WB_BUF_TMP, WB_DTYPE_FP32),
              .src_box = 0,
              .dst_box = 0}},
    {.kind = WB_OP_QUANT,
     .tensor = 0,
     .quant = {.src = VIEW(WB_BUF_TMP, WB_DTYPE_BF16),
               .dst = VIEW(WB_BUF_TMP, WB_DTYPE_FP8_E4M3),
               .src_box = 0,
               .region = 0,
               .grid = 0,
               .scale_off = 512,
               .amax_off = (uint64_t)WB_RT_NONE}},
};

static struct wb_rt_write WRITES[] = {
    {.src_off = 0,
     .dst_off = 4,
     .len = 32,
     .src_tensor = (uint32_t)WB_RT_TMP_SRC,
     .dst_rank = 0,
     .dst_tensor = 1,
     .tag = 2,
     .more = 1,
     .rank_step = 1},
};

static struct wb_rt_task TASKS[] = {
    {.mapping = 7,
     .item = 8,
     .phase = 0,
     .mesh = 2,
     .mode = WB_MODE_AMAX,
     .tmp_bytes = 4096,
     .op0 = 0,
     .nops = 6,
     .write0 = 0,
     .nwrites = 1,
     .write_bytes = 32},
};

static struct wb_route_table table(void)
{
    return (struct wb_route_table){
        .rank = 0,
        .ntrainers = 2,
        .nrollouts = 2,
        .tag_bits = 8,
        .residence = WB_RESIDE_HOST,
        .nphases = 1,
        .phases = (struct wb_rt_phase *)PHASES,
        .ntasks = 1,
        .tasks = TASKS,
        .nops = 6,
        .ops = (struct wb_rt_op *)OPS,
        .npeers = 1,
        .peers = (struct wb_rt_peer *)PEERS,
        .namax_peers = 1,
        .amax_peers = (struct wb_rt_amax_peer *)APEERS,
        .nboxes = 1,
        .boxes = (struct wb_box *)BOXES,
        .nshapes = 1,
        .shapes = (struct wb_shape *)SHAPES,
        .nwrites = 1,
        .writes = WRITES,
        .amax_inbox_bytes = 192,
        .namax = 1,
        .amax = (struct wb_rt_expect *)AMAX,
        .send_bytes = 64,
        .max_tmp_bytes = 4096,
        .mem_cap = 1 << 20,
        .mode = WB_MODE_DIRECT,
    };
}

static struct wb_mpw encode(const struct wb_route_table *t)
{
    struct wb_mpw w;
    wb_mpw_init(&w);
    wb_route_table_encode(&w, t);
    CHECK_INT(wb_mpw_finish(&w), 0);
    return w;
}

static void test_every_field(void)
{
    struct wb_route_table t = table(), d;
    struct wb_mpw w = encode(&t);
    CHECK_INT(wb_route_table_decode(w.buf, w.len, &d), 0);
    wb_mpw_free(&w);
    CHECK_INT(d.rank, 0);
    CHECK_INT(d.ntrainers, 2);
    CHECK_INT(d.nrollouts, 2);
    CHECK_INT(d.tag_bits, 8);
    CHECK_INT(d.residence, WB_RESIDE_HOST);
    CHECK_INT(d.nphases, 1);
    CHECK_MEM(d.phases, PHASES, sizeof(PHASES));
    CHECK_INT(d.nops, 6);
    CHECK_MEM(d.ops, OPS, sizeof(OPS));
    CHECK_INT(d.npeers, 1);
    CHECK_MEM(d.peers, PEERS, sizeof(PEERS));
    CHECK_INT(d.namax_peers, 1);
    CHECK_MEM(d.amax_peers, APEERS, sizeof(APEERS));
    CHECK_INT(d.nboxes, 1);
    CHECK_MEM(d.boxes, BOXES, sizeof(BOXES));
    CHECK_INT(d.nshapes, 1);
    CHECK_MEM(d.shapes, SHAPES, sizeof(SHAPES));
    CHECK_INT(d.namax, 1);
    CHECK_MEM(d.amax, AMAX, sizeof(AMAX));
    CHECK_U64(d.amax_inbox_bytes, 192);
    CHECK_U64(d.send_bytes, 64);
    CHECK_U64(d.max_tmp_bytes, 4096);
    CHECK_U64(d.mem_cap, 1 << 20);
    CHECK_INT(d.mode, WB_MODE_DIRECT);
    /* the record of 2 copies is 2 writes, and the task's range follows */
    CHECK_INT(d.nwrites, 2);
    for (uint32_t k = 0; k < 2; k++) {
        struct wb_rt_write x = WRITES[0];
        x.dst_rank = k;
        x.more = x.rank_step = 0;
        CHECK_MEM(&d.writes[k], &x, sizeof(x));
    }
    struct wb_rt_task tk = TASKS[0];
    tk.nwrites = 2;
    CHECK_INT(d.ntasks, 1);
    CHECK_MEM(d.tasks, &tk, sizeof(tk));
    wb_route_table_free(&d);
}

/* ---------------------------------------------------------------- plans */

static void round_trip(enum wb_plan_mode mode)
{
    struct wb_errlist el;
    wb_errlist_init(&el);
    struct wb_model md;
    struct wb_model_src src = {.rules = "configs/models/qwen3_moe.yaml",
                               .config = "configs/jobs/demo/config.json",
                               .trainer_layout = "configs/jobs/demo/trainer.yaml",
                               .rollout_layout = "configs/jobs/demo/rollout.yaml"};
    CHECK_INT(wb_model_load(&src, &md, &el), 0);
    struct wb_plan_input in = wb_model_input(&md);
    struct wb_plan_opts o = {.mode = mode, .mem_cap = 4 << 20};
    struct wb_plan *p;
    CHECK_INT(wb_plan_build(&in, &o, &p, &el), 0);
    struct wb_plan_tbuf tb = {0};
    uint64_t same = 0;
    for (uint32_t r = 0; r < p->ntrainers; r++) {
        const struct wb_route_table *t = wb_plan_table(p, r, &tb);
        CHECK(t != NULL);
        struct wb_mpw e1 = encode(t), e2, e3;
        struct wb_route_table d1, d2;
        CHECK_INT(wb_route_table_decode(e1.buf, e1.len, &d1), 0);
        CHECK_U64(d1.nwrites, wb_route_table_writes(t));
        e2 = encode(&d1);
        CHECK_INT(wb_route_table_decode(e2.buf, e2.len, &d2), 0);
        e3 = encode(&d2);
        /* a decoded table is expanded: from then on encoding is a fixed point */
        CHECK_U64(e2.len, e3.len);
        CHECK_MEM(e2.buf, e3.buf, e2.len);
        if (wb_route_table_writes(t) == t->nwrites) { /* no fan-out: the first bytes too */
            CHECK_U64(e1.len, e2.len);
            CHECK_MEM(e1.buf, e2.buf, e1.len);
            same++;
        }
        wb_mpw_free(&e1);
        wb_mpw_free(&e2);
        wb_mpw_free(&e3);
        wb_route_table_free(&d1);
        wb_route_table_free(&d2);
    }
    for (uint32_t g = 0; g < p->nrollouts; g++) {
        struct wb_mpw e1, e2;
        struct wb_recv_list d;
        wb_mpw_init(&e1);
        wb_recv_list_encode(&e1, &p->recv[g]);
        CHECK_INT(wb_mpw_finish(&e1), 0);
        CHECK_INT(wb_recv_list_decode(e1.buf, e1.len, &d), 0);
        wb_mpw_init(&e2);
        wb_recv_list_encode(&e2, &d);
        CHECK_INT(wb_mpw_finish(&e2), 0);
        CHECK_U64(e1.len, e2.len);
        CHECK_MEM(e1.buf, e2.buf, e1.len);
        wb_mpw_free(&e1);
        wb_mpw_free(&e2);
        wb_recv_list_free(&d);
    }
    printf("    %u tables (%" PRIu64 " without fan-out: identical bytes), %u receive lists\n",
           p->ntrainers, same, p->nrollouts);
    wb_plan_tbuf_free(&tb);
    wb_plan_free(p);
    wb_model_free(&md);
    wb_errlist_free(&el);
}

static void test_demo_auto(void)
{
    round_trip(WB_MODE_AUTO);
}

static void test_demo_gather(void)
{
    round_trip(WB_MODE_GATHER);
}

/* ---------------------------------------------------------------- malformed and later bodies */

/* The encoding of table() with the byte run `from` replaced by `to` (same length or not). */
static int decode_patched(const char *from, size_t nfrom, const char *to, size_t nto,
                          const char *append, size_t nappend)
{
    struct wb_route_table t = table(), d;
    struct wb_mpw w = encode(&t);
    uint8_t *buf = malloc(w.len + nto + nappend);
    CHECK(buf != NULL);
    uint8_t *at = memmem(w.buf, w.len, from, nfrom);
    CHECK(at != NULL);
    size_t pre = (size_t)(at - w.buf), post = w.len - pre - nfrom;
    memcpy(buf, w.buf, pre);
    memcpy(buf + pre, to, nto);
    memcpy(buf + pre + nto, at + nfrom, post);
    memcpy(buf + pre + nto + post, append, nappend);
    int rc = wb_route_table_decode(buf, pre + nto + post + nappend, &d);
    if (rc == 0)
        wb_route_table_free(&d);
    free(buf);
    wb_mpw_free(&w);
    return rc;
}

#define PATCH(from, to) decode_patched(from, sizeof(from) - 1, to, sizeof(to) - 1, "", 0)

static void test_malformed(void)
{
    /* the body is a map of 21 keys (map16), "format" first */
    CHECK_INT(PATCH("\xde\x00\x15\xa6"
                    "format\x04",
                    "\xde\x00\x15\xa6"
                    "format\x04"),
              0);
    CHECK_INT(PATCH("\xa6"
                    "format\x04",
                    "\xa6"
                    "format\x03"),
              -WB_E_VERSION);
    CHECK_INT(PATCH("\xa4mode\x01", "\xa4mode\x05"), -EBADMSG); /* out of range */
    CHECK_INT(PATCH("\xa4mode\x01", "\xa4mod_\x01"), -EBADMSG); /* required key missing */
    CHECK_INT(PATCH("\xa5"
                    "block\xcc\x80",
                    "\xa5"
                    "block\x40"),
              -EBADMSG); /* not 128 */
    CHECK_INT(PATCH("\xa7mem_cap\xce\x00\x10\x00\x00", "\xa7mem_cap\x00"), -EBADMSG);
    CHECK_INT(PATCH("\xa8tag_bits\x08", "\xa8tag_bits\x21"), -EBADMSG); /* 33 bits */
    /* a later format's unknown key, here appended as a 22nd pair, is skipped */
    CHECK_INT(decode_patched("\xde\x00\x15", 3, "\xde\x00\x16", 3, "\xa3new\x93\x01\x02\x03", 8),
              0);
    /* one pair short of what the map announced */
    CHECK_INT(PATCH("\xde\x00\x15", "\xde\x00\x16"), -EBADMSG);
    /* truncated anywhere */
    struct wb_route_table t = table(), d;
    struct wb_mpw w = encode(&t);
    for (size_t n = 0; n < w.len; n++)
        if (wb_route_table_decode(w.buf, n, &d) != -EBADMSG)
            wb_test_fail(__FILE__, __LINE__, "%zu of %zu bytes decoded", n, w.len);
    wb_mpw_free(&w);
    /* a write whose end wraps around */
    struct wb_rt_write keep = WRITES[0];
    WRITES[0].src_off = UINT64_MAX - 8;
    w = encode(&t);
    CHECK_INT(wb_route_table_decode(w.buf, w.len, &d), -EBADMSG);
    wb_mpw_free(&w);
    WRITES[0] = keep;
    /* a record with a trailing field of a later format: skipped */
    struct wb_mpw x;
    wb_mpw_init(&x);
    wb_mpw_array(&x, 4);
    wb_mpw_u64(&x, 0);
    wb_mpw_u64(&x, 1);
    wb_mpw_bool(&x, true);
    wb_mpw_u64(&x, 77);
    CHECK_INT(wb_mpw_finish(&x), 0);
    char from[] = "\xa6phases\x91\x93\x00\x01\xc3";
    char to[64];
    memcpy(to, "\xa6phases\x91", 8);
    memcpy(to + 8, x.buf, x.len);
    CHECK_INT(decode_patched(from, sizeof(from) - 1, to, 8 + x.len, "", 0), 0);
    wb_mpw_free(&x);
}

static void test_recv_list(void)
{
    static struct wb_rt_local local[] = {{3, WB_DTYPE_BF16, {2, {4, 8}}, 64}};
    static struct wb_rt_expect expect[] = {{4, 3, 64, 2}};
    struct wb_recv_list r = {.rank = 1,
                             .replica = 0,
                             .tp_rank = 1,
                             .ep_rank = 0,
                             .tag_bits = 12,
                             .nlocal = 1,
                             .local = local,
                             .nexpect = 1,
                             .expect = expect,
                             .recv_bytes = 64,
                             .recv_writes = 2},
                        d;
    struct wb_mpw w;
    wb_mpw_init(&w);
    wb_recv_list_encode(&w, &r);
    CHECK_INT(wb_mpw_finish(&w), 0);
    CHECK_INT(wb_recv_list_decode(w.buf, w.len, &d), 0);
    CHECK_INT(d.rank, 1);
    CHECK_INT(d.tp_rank, 1);
    CHECK_INT(d.tag_bits, 12);
    CHECK_INT(d.nlocal, 1);
    CHECK_MEM(d.local, local, sizeof(local));
    CHECK_INT(d.nexpect, 1);
    CHECK_MEM(d.expect, expect, sizeof(expect));
    CHECK_U64(d.recv_bytes, 64);
    CHECK_U64(d.recv_writes, 2);
    wb_recv_list_free(&d);
    wb_mpw_free(&w);
    local[0].bytes = 63; /* not shape x dtype */
    wb_mpw_init(&w);
    wb_recv_list_encode(&w, &r);
    CHECK_INT(wb_mpw_finish(&w), 0);
    CHECK_INT(wb_recv_list_decode(w.buf, w.len, &d), -EBADMSG);
    wb_mpw_free(&w);
}

/* A PERMUTE op (format 4 tables may carry one): its fields survive encode -> decode, and a
 * permutation that is none (a repeated dim, a dim past ndim, a bit above them), extents that
 * are not permuted, or a dtype change are refused as malformed. */
static uint32_t perm_of(uint32_t a, uint32_t b, uint32_t c)
{
    return a | b << 4 | c << 8;
}

static int decode_permute(uint32_t perm, uint32_t dst_box, enum wb_dtype dst_dt,
                          struct wb_rt_op *out)
{
    static const struct wb_shape sh[] = {{3, {2, 4, 6}}, {3, {2, 6, 4}}};
    static const struct wb_box bx[] = {{3, {0, 0, 0}, {2, 4, 6}}, {3, {0, 0, 0}, {2, 6, 4}}};
    struct wb_rt_op op = {.kind = WB_OP_PERMUTE,
                          .tensor = 0,
                          .permute = {.src = VIEW(WB_BUF_PARAM, WB_DTYPE_BF16),
                                      .dst = VIEW(WB_BUF_TMP, dst_dt),
                                      .src_box = 0,
                                      .dst_box = dst_box,
                                      .perm = perm}};
    op.permute.src.off = 0;
    op.permute.dst.shape = 1;
    struct wb_rt_task task = TASKS[0];
    task.nops = 1;
    struct wb_route_table t = table(), d;
    t.ops = &op;
    t.nops = 1;
    t.tasks = &task;
    t.boxes = (struct wb_box *)bx;
    t.nboxes = 2;
    t.shapes = (struct wb_shape *)sh;
    t.nshapes = 2;
    t.npeers = t.namax_peers = 0;
    struct wb_mpw w = encode(&t);
    int rc = wb_route_table_decode(w.buf, w.len, &d);
    wb_mpw_free(&w);
    if (rc == 0) {
        *out = d.ops[0];
        wb_route_table_free(&d);
    }
    return rc;
}

static void test_permute_op(void)
{
    struct wb_rt_op op;
    CHECK_INT(decode_permute(perm_of(0, 2, 1), 1, WB_DTYPE_BF16, &op), 0);
    CHECK_INT(op.kind, WB_OP_PERMUTE);
    CHECK_INT(op.permute.perm, perm_of(0, 2, 1));
    CHECK_INT(wb_rt_perm_dim(op.permute.perm, 1), 2);
    CHECK_INT(op.permute.src_box, 0);
    CHECK_INT(op.permute.dst_box, 1);
    CHECK_INT(op.permute.dst.kind, WB_BUF_TMP);
    CHECK_INT(op.permute.dst.shape, 1);
    CHECK_INT(decode_permute(perm_of(0, 2, 2), 1, WB_DTYPE_BF16, &op), -EBADMSG);
    CHECK_INT(decode_permute(perm_of(0, 3, 1), 1, WB_DTYPE_BF16, &op), -EBADMSG);
    CHECK_INT(decode_permute(perm_of(0, 2, 1) | 1u << 12, 1, WB_DTYPE_BF16, &op), -EBADMSG);
    CHECK_INT(decode_permute(perm_of(0, 1, 2), 1, WB_DTYPE_BF16, &op), -EBADMSG);
    CHECK_INT(decode_permute(perm_of(0, 2, 1), 0, WB_DTYPE_BF16, &op), -EBADMSG);
    CHECK_INT(decode_permute(perm_of(0, 2, 1), 1, WB_DTYPE_FP16, &op), -EBADMSG);
}

const struct wb_test wb_tests[] = {
    {"every_field", test_every_field, 0},
    {"demo_auto", test_demo_auto, 0},
    {"demo_gather", test_demo_gather, 0},
    {"malformed", test_malformed, 0},
    {"recv_list", test_recv_list, 0},
    {"permute_op", test_permute_op, 0},
    {0},
};
