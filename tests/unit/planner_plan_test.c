/* planner_plan_test.c — the plan around the tables: wire round trips and malformed input,
 * balancing against the reference greedy and the lower bound, verify catching broken plans,
 * the estimate on a case worked by hand, and the wb-plan CLI's exit codes and messages. */
#include <errno.h>
#include <math.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tests/unit/planner_sim.h"

static const char *const FSDP4 = "world_size: 4\n"
                                 "gpus_per_node: 4\n"
                                 "mesh: [{name: fsdp, size: 4}]\n"
                                 "placements:\n"
                                 "  - {match: \"*\", place: {fsdp: shard(0)}}\n";

/* FP8 amax case + a BF16 tensor + a fused pair, 2 replicas of TP 2: exercises most ops. */
static void mixed_case(struct fx *f, bool host)
{
    fx_init(f);
    CHECK_INT(fx_layouts(f, FSDP4, "replicas: 2\ntp: 2\n"), 0);
    if (host)
        f->tl.residence = WB_RESIDE_HOST;
    uint32_t w = fx_t(f, "w", WB_DTYPE_BF16, fx_shape(2, 256, 256));
    uint32_t rw = fx_r(f, "w", WB_DTYPE_FP8_E4M3, fx_shape(2, 256, 256));
    uint32_t rs = fx_r(f, "w_scale", WB_DTYPE_FP32, fx_shape(2, 2, 2));
    struct wb_mapping *m = fx_map(f, rw, (int32_t)rs, WB_XFORM_FP8_BLOCK, WB_SHARD_TP, 1);
    fx_comp_full(f, m, w, fx_box(2, 0, 256, 0, 256));
    uint32_t n = fx_t(f, "norm", WB_DTYPE_BF16, fx_shape(1, 10));
    uint32_t rn = fx_r(f, "norm", WB_DTYPE_BF16, fx_shape(1, 10));
    m = fx_map(f, rn, -1, WB_XFORM_COPY, WB_SHARD_REPLICATE, 0);
    fx_comp_full(f, m, n, fx_box(1, 0, 10));
    uint32_t g = fx_t(f, "gate", WB_DTYPE_BF16, fx_shape(2, 6, 4));
    uint32_t u = fx_t(f, "up", WB_DTYPE_BF16, fx_shape(2, 6, 4));
    uint32_t gu = fx_r(f, "gate_up", WB_DTYPE_BF16, fx_shape(2, 12, 4));
    m = fx_map(f, gu, -1, WB_XFORM_COPY, WB_SHARD_TP, 0);
    fx_comp_full(f, m, g, fx_box(2, 0, 6, 0, 4));
    fx_comp_full(f, m, u, fx_box(2, 6, 6, 0, 4));
}

static struct wb_plan *build(struct fx *f, enum wb_plan_mode mode)
{
    struct wb_plan_opts o = {.mode = mode, .mem_cap = 0};
    struct wb_plan *p;
    if (wb_plan_build(&f->in, &o, &p, &f->el))
        wb_test_fail(__FILE__, __LINE__, "plan: %s", fx_errors(&f->el));
    return p;
}

static void test_mixed_all_modes(void)
{
    for (int host = 0; host < 2; host++) {
        struct fx f;
        mixed_case(&f, host);
        enum wb_plan_mode modes[] = {WB_MODE_AUTO, WB_MODE_DIRECT, WB_MODE_GATHER};
        for (int i = 0; i < 3; i++) {
            struct wb_plan *p = sim_plan_check(&f, modes[i]);
            CHECK_INT(wb_plan_verify(p, &f.in, &f.el), 0);
            wb_plan_free(p);
        }
        fx_free(&f);
    }
}

/* ---------------------------------------------------------------- wire */

static bool tables_equal(const struct wb_route_table *a, const struct wb_route_table *b)
{
#define SAME_ARR(field, n)                                                                         \
    (a->n == b->n && (a->n == 0 || memcmp(a->field, b->field, a->n * sizeof(*a->field)) == 0))
    bool ok = a->rank == b->rank && a->ntrainers == b->ntrainers && a->nrollouts == b->nrollouts &&
              a->tag_bits == b->tag_bits && a->residence == b->residence &&
              a->amax_inbox_bytes == b->amax_inbox_bytes && a->send_bytes == b->send_bytes &&
              a->max_tmp_bytes == b->max_tmp_bytes && SAME_ARR(phases, nphases) &&
              SAME_ARR(tasks, ntasks) && SAME_ARR(peers, npeers) && SAME_ARR(boxes, nboxes) &&
              SAME_ARR(shapes, nshapes) && SAME_ARR(writes, nwrites) && SAME_ARR(amax, namax) &&
              SAME_ARR(amax_peers, namax_peers) && a->nops == b->nops;
#undef SAME_ARR
    for (uint32_t i = 0; ok && i < a->nops; i++) {
        const struct wb_rt_op *x = &a->ops[i], *y = &b->ops[i];
        ok = x->kind == y->kind && x->tensor == y->tensor;
        switch (x->kind) {
        case WB_OP_H2D:
            ok = ok && !memcmp(&x->h2d, &y->h2d, sizeof(x->h2d));
            break;
        case WB_OP_GATHER:
            ok = ok && !memcmp(&x->gather.src, &y->gather.src, sizeof(x->gather.src)) &&
                 !memcmp(&x->gather.dst, &y->gather.dst, sizeof(x->gather.dst)) &&
                 x->gather.peer0 == y->gather.peer0 && x->gather.npeers == y->gather.npeers &&
                 x->gather.mesh == y->gather.mesh && x->gather.seq == y->gather.seq &&
                 x->gather.bytes_in == y->gather.bytes_in;
            break;
        case WB_OP_AMAX:
            ok = ok && x->amax.peer0 == y->amax.peer0 && x->amax.npeers == y->amax.npeers &&
                 !memcmp(&x->amax.src, &y->amax.src, sizeof(x->amax.src)) &&
                 x->amax.src_box == y->amax.src_box && x->amax.region == y->amax.region &&
                 x->amax.blocks == y->amax.blocks && x->amax.grid == y->amax.grid &&
                 x->amax.amax_off == y->amax.amax_off;
            break;
        case WB_OP_COPY:
        case WB_OP_CAST:
            ok = ok && !memcmp(&x->copy.src, &y->copy.src, sizeof(x->copy.src)) &&
                 !memcmp(&x->copy.dst, &y->copy.dst, sizeof(x->copy.dst)) &&
                 x->copy.src_box == y->copy.src_box && x->copy.dst_box == y->copy.dst_box;
            break;
        case WB_OP_PERMUTE:
            ok = ok && !memcmp(&x->permute.src, &y->permute.src, sizeof(x->permute.src)) &&
                 !memcmp(&x->permute.dst, &y->permute.dst, sizeof(x->permute.dst)) &&
                 x->permute.src_box == y->permute.src_box &&
                 x->permute.dst_box == y->permute.dst_box && x->permute.perm == y->permute.perm;
            break;
        case WB_OP_QUANT:
            ok = ok && !memcmp(&x->quant.src, &y->quant.src, sizeof(x->quant.src)) &&
                 !memcmp(&x->quant.dst, &y->quant.dst, sizeof(x->quant.dst)) &&
                 x->quant.src_box == y->quant.src_box && x->quant.region == y->quant.region &&
                 x->quant.grid == y->quant.grid && x->quant.scale_off == y->quant.scale_off &&
                 x->quant.amax_off == y->quant.amax_off;
            break;
        }
    }
    return ok;
}

static void test_wire_roundtrip(void)
{
    struct fx f;
    mixed_case(&f, true);
    enum wb_plan_mode modes[] = {WB_MODE_AUTO, WB_MODE_GATHER};
    for (int mi = 0; mi < 2; mi++) {
        struct wb_plan *p = build(&f, modes[mi]);
        for (uint32_t r = 0; r < p->ntrainers; r++) {
            struct wb_mpw w;
            wb_mpw_init(&w);
            wb_route_table_encode(&w, &pl_tables(p)[r]);
            CHECK_INT(wb_mpw_finish(&w), 0);
            struct wb_route_table t;
            CHECK_INT(wb_route_table_decode(w.buf, w.len, &t), 0);
            /* decoding expands the replica fan-out: the plan's table, expanded */
            uint64_t nw = wb_route_table_writes(&pl_tables(p)[r]);
            CHECK(mi != 0 || r != 0 || nw > pl_tables(p)[r].nwrites); /* 2 replicas fan out */
            CHECK_INT(wb_route_table_expand(&pl_tables(p)[r]), 0);
            CHECK_U64(pl_tables(p)[r].nwrites, nw);
            CHECK(tables_equal(&t, &pl_tables(p)[r]));
            /* every truncation is refused, never crashes */
            for (size_t cut = 0; cut < w.len; cut += (w.len > 400 ? 7 : 1)) {
                struct wb_route_table u;
                CHECK(wb_route_table_decode(w.buf, cut, &u) < 0);
            }
            wb_route_table_free(&t);
            wb_mpw_free(&w);
        }
        for (uint32_t g = 0; g < p->nrollouts; g++) {
            struct wb_mpw w;
            wb_mpw_init(&w);
            wb_recv_list_encode(&w, &p->recv[g]);
            CHECK_INT(wb_mpw_finish(&w), 0);
            struct wb_recv_list v;
            CHECK_INT(wb_recv_list_decode(w.buf, w.len, &v), 0);
            const struct wb_recv_list *o = &p->recv[g];
            CHECK(v.rank == o->rank && v.replica == o->replica && v.tp_rank == o->tp_rank &&
                  v.ep_rank == o->ep_rank && v.recv_bytes == o->recv_bytes &&
                  v.recv_writes == o->recv_writes && v.nlocal == o->nlocal &&
                  v.nexpect == o->nexpect);
            CHECK(v.nlocal == 0 || memcmp(v.local, o->local, v.nlocal * sizeof(*v.local)) == 0);
            CHECK(v.nexpect == 0 ||
                  memcmp(v.expect, o->expect, v.nexpect * sizeof(*v.expect)) == 0);
            /* a receive list is not a routing table */
            struct wb_route_table t;
            CHECK_INT(wb_route_table_decode(w.buf, w.len, &t), -EBADMSG);
            wb_recv_list_free(&v);
            wb_mpw_free(&w);
        }
        wb_plan_free(p);
    }
    fx_free(&f);
}

/* A table whose indices point outside their arrays is refused. */
static void test_wire_bad_indices(void)
{
    struct fx f;
    mixed_case(&f, false);
    struct wb_plan *p = build(&f, WB_MODE_AUTO);
    struct wb_route_table *t = &pl_tables(p)[0];
    CHECK(t->ntasks > 0 && t->nwrites > 0 && t->namax_peers > 0);
    struct wb_rt_op *am = NULL; /* the first AMAX op */
    for (uint32_t o = 0; o < t->nops && !am; o++)
        am = t->ops[o].kind == WB_OP_AMAX ? &t->ops[o] : NULL;
    CHECK(am != NULL);
    struct {
        const char *what;
        void (*mutate)(struct wb_route_table *);
    } cases[] = {
        {"task op range", NULL},
        {"write rank", NULL},
        {"phase", NULL},
        {"fan-out without a rank step", NULL},
        {"fan-out past the last rank", NULL},
        {"amax peers past their array", NULL},
        {"amax op without a peer", NULL},
        {"amax peer is the rank itself", NULL},
    };
    for (int i = 0; i < 8; i++) {
        struct wb_rt_task save_task = t->tasks[0];
        struct wb_rt_write save_write = t->writes[0];
        struct wb_rt_phase save_phase = t->phases[0];
        struct wb_rt_amax save_amax = am->amax;
        struct wb_rt_amax_peer save_peer = t->amax_peers[0];
        if (i == 0)
            t->tasks[0].nops = t->nops + 1;
        if (i == 1)
            t->writes[0].dst_rank = t->nrollouts;
        if (i == 2)
            t->phases[0].ntasks = t->ntasks + 5;
        if (i == 3) {
            t->writes[0].more = 1;
            t->writes[0].rank_step = 0;
        }
        if (i == 4) {
            t->writes[0].more = t->nrollouts;
            t->writes[0].rank_step = 1;
        }
        if (i == 5)
            am->amax.npeers = t->namax_peers - am->amax.peer0 + 1;
        if (i == 6)
            am->amax.npeers = 0;
        if (i == 7)
            t->amax_peers[0].rank = t->rank;
        struct wb_mpw w;
        wb_mpw_init(&w);
        wb_route_table_encode(&w, t);
        struct wb_route_table u;
        if (wb_route_table_decode(w.buf, w.len, &u) != -EBADMSG)
            wb_test_fail(__FILE__, __LINE__, "%s: decoded", cases[i].what);
        wb_mpw_free(&w);
        t->tasks[0] = save_task;
        t->writes[0] = save_write;
        t->phases[0] = save_phase;
        am->amax = save_amax;
        t->amax_peers[0] = save_peer;
    }
    /* another version of the envelope */
    struct wb_mpw w;
    wb_mpw_init(&w);
    wb_route_table_encode(&w, t);
    CHECK(w.len > 6);
    uint8_t *b = w.buf;
    /* [magic (uint32: 0xce + 4), version (fixint 1)] */
    CHECK_INT(b[0], 0x94);
    CHECK_INT(b[6], 1);
    b[6] = 2;
    struct wb_route_table u;
    CHECK_INT(wb_route_table_decode(w.buf, w.len, &u), -WB_E_VERSION);
    wb_mpw_free(&w);
    wb_plan_free(p);
    fx_free(&f);
}

/* ---------------------------------------------------------------- balance */

/* 4 replicas (dp) of 2-way shards, 3 tensors of different sizes, 3 rollout replicas that
 * need everything: the reference greedy is not optimal; the plan splits demands to reach the
 * lower bound (within 5%). */
static void test_balance(void)
{
    struct fx f;
    fx_init(&f);
    CHECK_INT(fx_layouts(&f,
                         "world_size: 8\ngpus_per_node: 8\n"
                         "mesh: [{name: dp, size: 4}, {name: fsdp, size: 2}]\n"
                         "placements: [{match: \"*\", place: {fsdp: shard(0), dp: replicate}}]\n",
                         "replicas: 3\n"),
              0);
    uint64_t rows[] = {100000, 60000, 35000};
    for (int i = 0; i < 3; i++) {
        char name[16];
        snprintf(name, sizeof(name), "t%d", i);
        uint32_t t = fx_t(&f, name, WB_DTYPE_BF16, fx_shape(2, rows[i], 64));
        uint32_t r = fx_r(&f, name, WB_DTYPE_BF16, fx_shape(2, rows[i], 64));
        struct wb_mapping *m = fx_map(&f, r, -1, WB_XFORM_COPY, WB_SHARD_REPLICATE, 0);
        fx_comp_full(&f, m, t, fx_box(2, 0, rows[i], 0, 64));
    }
    struct wb_plan *p = build(&f, WB_MODE_AUTO);
    const struct wb_plan_stats *s = &p->stats;
    /* 3 replicas x (1000+600+350) rows x 128 B over 8 senders */
    CHECK_U64(s->total_bytes, 3ull * 195000 * 128);
    CHECK_U64(s->lower_bound, 3ull * 195000 * 128 / 8);
    CHECK(s->max_send <= s->greedy_max);
    CHECK(s->greedy_max > s->lower_bound);
    CHECK((double)s->max_send <= 1.05 * (double)s->lower_bound);
    for (uint32_t r = 0; r < 8; r++)
        CHECK(s->send_bytes[r] > 0);
    CHECK_INT(wb_plan_verify(p, &f.in, &f.el), 0);
    wb_plan_free(p);
    fx_free(&f);
}

/* verify's destination check by replica classes (verify_dest.c) where records reach some of
 * the replicas: it shows a correct plan, and sends a broken one to the exact check, which names
 * the bytes. 4 trainer replicas serve 3 rollout replicas, so a tensor's copies come from
 * different senders and records fan out to one or two replicas. */
static void test_verify_replica_classes(void)
{
    struct fx f;
    fx_init(&f);
    CHECK_INT(fx_layouts(&f,
                         "world_size: 8\ngpus_per_node: 8\n"
                         "mesh: [{name: dp, size: 4}, {name: fsdp, size: 2}]\n"
                         "placements: [{match: \"*\", place: {fsdp: shard(0), dp: replicate}}]\n",
                         "replicas: 3\n"),
              0);
    uint64_t rows[] = {100000, 60000, 35000};
    for (int i = 0; i < 3; i++) {
        char name[16];
        snprintf(name, sizeof(name), "t%d", i);
        uint32_t t = fx_t(&f, name, WB_DTYPE_BF16, fx_shape(2, rows[i], 64));
        uint32_t r = fx_r(&f, name, WB_DTYPE_BF16, fx_shape(2, rows[i], 64));
        struct wb_mapping *m = fx_map(&f, r, -1, WB_XFORM_COPY, WB_SHARD_REPLICATE, 0);
        fx_comp_full(&f, m, t, fx_box(2, 0, rows[i], 0, 64));
    }
    struct wb_plan *p = build(&f, WB_MODE_AUTO);
    CHECK_INT(p->nrollouts, 3);
    struct wb_rt_write *one = NULL; /* a record reaching one replica */
    uint32_t some = 0, all = 0;
    for (uint32_t r = 0; r < p->ntrainers; r++)
        for (uint32_t i = 0; i < pl_tables(p)[r].nwrites; i++) {
            struct wb_rt_write *x = &pl_tables(p)[r].writes[i];
            some += x->more < 2;
            all += x->more == 2;
            if (!x->more && x->len > 1 && !one)
                one = x;
        }
    CHECK(some > 0 && one != NULL);
    CHECK_INT(pl_verify_dest_fast(p, &f.in), 1);
    CHECK_INT(wb_plan_verify(p, &f.in, &f.el), 0);
    /* the record's copy sent to the next replica: written twice there, never in its own */
    uint32_t g = one->dst_rank, h = (g + 1) % 3;
    const char *name = f.ri.p[one->dst_tensor].name;
    char twice[512], never[512];
    snprintf(twice, sizeof(twice), "rollout rank %u %s: bytes [%llu, %llu) written twice", h, name,
             (unsigned long long)one->dst_off, (unsigned long long)(one->dst_off + one->len));
    snprintf(never, sizeof(never), "rollout rank %u %s: bytes [%llu, %llu) never written", g, name,
             (unsigned long long)one->dst_off, (unsigned long long)(one->dst_off + one->len));
    one->dst_rank = h;
    CHECK_INT(pl_verify_dest_fast(p, &f.in), 0);
    CHECK_INT(wb_plan_verify(p, &f.in, &f.el), -WB_E_PLAN);
    bool saw_twice = false, saw_never = false;
    for (size_t i = 0; i < f.el.n; i++) {
        saw_twice |= strcmp(f.el.msgs[i], twice) == 0;
        saw_never |= strcmp(f.el.msgs[i], never) == 0;
    }
    CHECK(saw_twice && saw_never);
    one->dst_rank = g;
    wb_errlist_free(&f.el);
    wb_errlist_init(&f.el);
    /* one byte short: its last byte never written in that one replica */
    one->len -= 1;
    CHECK_INT(pl_verify_dest_fast(p, &f.in), 0);
    CHECK_INT(wb_plan_verify(p, &f.in, &f.el), -WB_E_PLAN);
    snprintf(never, sizeof(never), "rollout rank %u %s: bytes [%llu, %llu) never written", g, name,
             (unsigned long long)(one->dst_off + one->len),
             (unsigned long long)(one->dst_off + one->len + 1));
    CHECK_INT(f.el.n, 1);
    CHECK_STR(f.el.msgs[0], never);
    one->len += 1;
    CHECK_INT(pl_verify_dest_fast(p, &f.in), 1);
    wb_plan_free(p);
    fx_free(&f);
}

/* ---------------------------------------------------------------- refused, not planned */

/* A family's match planned over 2 FSDP trainers and a TP 2 rollout; returns the plan's error. */
static int plan_family(struct fx *f, const char *family, const char *config)
{
    fx_init(f);
    struct wb_match_rules *rules = NULL;
    struct wb_match *mt = NULL;
    if (fx_layouts(f,
                   "world_size: 2\ngpus_per_node: 2\nmesh: [{name: fsdp, size: 2}]\n"
                   "placements: [{match: \"*\", place: {fsdp: shard(0)}}]\n",
                   "replicas: 1\ntp: 2\n") ||
        wb_inv_generate(family, config, "trainer", &f->ti, &f->el) ||
        wb_inv_generate(family, config, "rollout", &f->ri, &f->el) ||
        wb_match_rules_load(family, &rules, &f->el) ||
        wb_match_rules_bind_config(rules, config, &f->el) ||
        wb_match_run(rules, &f->ti, &f->ri, &mt, &f->el))
        wb_test_fail(__FILE__, __LINE__, "%s", fx_errors(&f->el));
    f->in.match = mt;
    struct wb_plan_opts o = {.mode = WB_MODE_AUTO, .mem_cap = 0};
    struct wb_plan *p = NULL;
    int r = wb_plan_build(&f->in, &o, &p, &f->el);
    CHECK(p == NULL || r == 0);
    if (p)
        CHECK_INT(wb_plan_verify(p, &f->in, &f->el), 0);
    wb_plan_free(p);
    wb_match_free(mt);
    wb_match_rules_free(rules);
    return r;
}

static void test_gpt_oss_planned(void)
{
    /* gpt-oss-20b's transposed experts (refused until transposes were planned): the whole
     * model plans, and the plan verifies (planner_permute_test executes small ones) */
    FILE *fp = fopen("configs/hf/gpt-oss-20b.json", "r");
    CHECK(fp);
    char buf[8192], out[8192];
    size_t n = fread(buf, 1, sizeof(buf) - 1, fp);
    fclose(fp);
    buf[n] = 0;
    char *a = strstr(buf, "  \"quantization_config\": {"), *z = a ? strstr(a, "  },\n") : NULL;
    CHECK(a && z);
    snprintf(out, sizeof(out), "%.*s%s", (int)(a - buf), buf, z + 5);
    char cfg[512];
    snprintf(cfg, sizeof(cfg), "%s", wb_test_write_file("gpt-oss-bf16.json", out));
    struct fx f;
    CHECK_INT(plan_family(&f, "configs/models/gpt_oss.yaml", cfg), 0);
    CHECK_INT(f.el.n, 0);
    fx_free(&f);
}

/* One stacked-experts tensor, 4 x 256 x 512 BF16 (1 MiB), sharded over 4 trainers and gathered
 * whole for 2 rollout replicas: a task of 1 MiB of temporary memory that no cut makes smaller. */
static void experts_case(struct fx *f)
{
    fx_init(f);
    CHECK_INT(fx_layouts(f, FSDP4, "replicas: 2\ntp: 1\n"), 0);
    uint32_t t = fx_t(f, "model.layers.0.mlp.experts.w13", WB_DTYPE_BF16, fx_shape(3, 4, 256, 512));
    uint32_t r = fx_r(f, "model.layers.0.mlp.experts.w13", WB_DTYPE_BF16, fx_shape(3, 4, 256, 512));
    struct wb_mapping *m = fx_map(f, r, -1, WB_XFORM_COPY, WB_SHARD_REPLICATE, 0);
    fx_comp_full(f, m, t, fx_box(3, 0, 4, 0, 256, 0, 512));
}

/* A memory cap below the largest task: a plan to be executed is refused, naming the tensor,
 * the cap and the bytes needed (the builder leaves it as it is); at exactly those bytes it
 * fits; opts.fit_cap makes them the cap of the plan and of every table, and changes nothing
 * else. */
static void test_cap_below_largest_task(void)
{
    struct fx f;
    experts_case(&f);
    struct wb_plan *p = NULL, *fit = NULL;
    struct wb_plan_opts o = {.mode = WB_MODE_GATHER, .mem_cap = 512 << 10};
    CHECK_INT(wb_plan_build(&f.in, &o, &p, &f.el), 0);
    CHECK_U64(pl_tables(p)[0].max_tmp_bytes, 1 << 20);
    CHECK_INT(wb_plan_check_cap(p, &f.in, &f.el), -WB_E_PLAN);
    CHECK_U64(p->mem_cap, 512 << 10);
    CHECK_INT(f.el.n, 1);
    CHECK_STR(f.el.msgs[0], "mem_cap 512.00 KiB is below the 1.00 MiB the largest task needs "
                            "(model.layers.0.mlp.experts.w13, gather on trainer rank 0; 4 task(s) "
                            "over the cap): set mem_cap to at least 1048576 bytes");
    o.fit_cap = true;
    CHECK_INT(wb_plan_build(&f.in, &o, &fit, &f.el), 0);
    CHECK_INT(f.el.n, 1);
    CHECK_U64(fit->mem_cap, 1 << 20);
    struct wb_plan_tbuf tb = {0};
    for (uint32_t r = 0; r < fit->ntrainers; r++) {
        const struct wb_route_table *t = wb_plan_table(fit, r, &tb);
        CHECK_U64(t->mem_cap, 1 << 20);
        /* the plan the unfitted cap gives, but for the cap */
        struct wb_route_table same = *t;
        same.mem_cap = pl_tables(p)[r].mem_cap;
        struct wb_mpw ea = fx_encode_table(&same), eb = fx_encode_table(&pl_tables(p)[r]);
        CHECK(fx_same_bytes(&ea, &eb));
    }
    wb_plan_tbuf_free(&tb);
    CHECK_INT(wb_plan_check_cap(fit, &f.in, &f.el), 0);
    CHECK_INT(wb_plan_verify(fit, &f.in, &f.el), 0);
    wb_plan_free(fit);
    wb_plan_free(p);
    fx_free(&f);

    experts_case(&f);
    o.mem_cap = 1 << 20;
    o.fit_cap = false;
    CHECK_INT(wb_plan_build(&f.in, &o, &p, &f.el), 0);
    CHECK_INT(wb_plan_check_cap(p, &f.in, &f.el), 0);
    CHECK_U64(p->mem_cap, 1 << 20);
    CHECK_INT(f.el.n, 0);
    wb_plan_free(p);
    fx_free(&f);
}

/* ---------------------------------------------------------------- verify */

static void test_verify_catches(void)
{
    struct fx f;
    mixed_case(&f, false);
    struct wb_plan *p = build(&f, WB_MODE_AUTO);
    CHECK_INT(wb_plan_verify(p, &f.in, &f.el), 0);
    /* a write moved by one byte: one range written twice, one never */
    struct wb_rt_write *w = NULL;
    uint32_t rank = 0;
    for (uint32_t r = 0; r < p->ntrainers && !w; r++)
        for (uint32_t i = 0; i < pl_tables(p)[r].nwrites && !w; i++)
            if (pl_tables(p)[r].writes[i].dst_off > 0 &&
                pl_tables(p)[r].writes[i].dst_tensor == f.ri.n - 1) {
                w = &pl_tables(p)[r].writes[i];
                rank = r;
            }
    CHECK(w != NULL);
    (void)rank;
    w->dst_off -= 1;
    CHECK_INT(wb_plan_verify(p, &f.in, &f.el), -WB_E_PLAN);
    CHECK(f.el.n >= 1);
    char want[512];
    snprintf(want, sizeof(want), "rollout rank %u gate_up: bytes [%llu, %llu) written twice",
             w->dst_rank, (unsigned long long)w->dst_off, (unsigned long long)w->dst_off + 1);
    CHECK_STR(f.el.msgs[0], want);
    w->dst_off += 1;
    wb_errlist_free(&f.el);
    wb_errlist_init(&f.el);
    /* a write reading past its shard */
    for (uint32_t r = 0; r < p->ntrainers; r++)
        for (uint32_t i = 0; i < pl_tables(p)[r].nwrites; i++)
            if (pl_tables(p)[r].writes[i].src_tensor != (uint32_t)WB_RT_TMP_SRC) {
                pl_tables(p)[r].writes[i].src_off += 1u << 20;
                CHECK_INT(wb_plan_verify(p, &f.in, &f.el), -WB_E_PLAN);
                snprintf(want, sizeof(want), "rank %u: write %u (to rank %u", r, i,
                         pl_tables(p)[r].writes[i].dst_rank);
                CHECK(strncmp(f.el.msgs[0], want, strlen(want)) == 0);
                CHECK(strstr(f.el.msgs[0], "reads bytes it does not hold") != NULL);
                pl_tables(p)[r].writes[i].src_off -= 1u << 20;
                r = p->ntrainers;
                break;
            }
    wb_errlist_free(&f.el);
    wb_errlist_init(&f.el);
    /* an amax exchange whose two sides disagree on an inbox, then one without its mirror */
    struct wb_rt_amax_peer *am = NULL;
    uint32_t ar = 0;
    for (uint32_t r = 0; r < p->ntrainers && !am; r++)
        for (uint32_t o = 0; o < pl_tables(p)[r].nops && !am; o++)
            if (pl_tables(p)[r].ops[o].kind == WB_OP_AMAX) {
                am = &pl_tables(p)[r].amax_peers[pl_tables(p)[r].ops[o].amax.peer0];
                ar = r;
            }
    CHECK(am != NULL);
    uint32_t lo = ar < am->rank ? ar : am->rank, hi = ar ^ am->rank ^ lo;
    am->inbox_off += 16;
    CHECK_INT(wb_plan_verify(p, &f.in, &f.el), -WB_E_PLAN);
    CHECK_INT(f.el.n, 1);
    snprintf(want, sizeof(want), "amax exchange tag %u: ranks %u and %u do not mirror each other",
             am->tag, lo, hi);
    CHECK_STR(f.el.msgs[0], want);
    am->inbox_off -= 16;
    wb_errlist_free(&f.el);
    wb_errlist_init(&f.el);
    uint32_t tag = am->tag;
    am->tag = 1u << 20; /* past every tag the plan has */
    CHECK_INT(wb_plan_verify(p, &f.in, &f.el), -WB_E_PLAN);
    CHECK_INT(f.el.n, 2);
    snprintf(want, sizeof(want), "rank %u: amax exchange tag %u has no mirror", ar ^ lo ^ hi, tag);
    CHECK_STR(f.el.msgs[0], want);
    snprintf(want, sizeof(want), "rank %u: amax exchange tag %u has no mirror", ar, 1u << 20);
    CHECK_STR(f.el.msgs[1], want);
    am->tag = tag;
    wb_errlist_free(&f.el);
    wb_errlist_init(&f.el);
    /* an exchange that takes another pair's tag, on the same side (lower rank) as that pair's */
    struct wb_rt_amax_peer *other = NULL;
    for (uint32_t r = 0; r < p->ntrainers && !other; r++)
        for (uint32_t k = 0; k < pl_tables(p)[r].namax_peers && !other; k++) {
            struct wb_rt_amax_peer *x = &pl_tables(p)[r].amax_peers[k];
            if (x->tag != tag && (r < x->rank) == (ar < am->rank))
                other = x;
        }
    CHECK(other != NULL);
    am->tag = other->tag;
    CHECK_INT(wb_plan_verify(p, &f.in, &f.el), -WB_E_PLAN);
    snprintf(want, sizeof(want), "amax tag %u used by more than two exchanges (rank ", other->tag);
    bool found = false;
    for (size_t i = 0; i < f.el.n; i++)
        found |= strncmp(f.el.msgs[i], want, strlen(want)) == 0;
    CHECK(found);
    am->tag = tag;
    wb_errlist_free(&f.el);
    wb_errlist_init(&f.el);
    /* an amax op whose peers run past the table's */
    struct wb_rt_op *ao = NULL;
    uint32_t aoi = 0;
    for (uint32_t o = 0; o < pl_tables(p)[ar].nops && !ao; o++)
        if (pl_tables(p)[ar].ops[o].kind == WB_OP_AMAX)
            ao = &pl_tables(p)[ar].ops[aoi = o];
    uint32_t np = ao->amax.npeers;
    ao->amax.npeers = pl_tables(p)[ar].namax_peers + 1;
    CHECK_INT(wb_plan_verify(p, &f.in, &f.el), -WB_E_PLAN);
    snprintf(want, sizeof(want), "rank %u: op %u (amax) on %s lists peers [%u, +%u) of its %u", ar,
             aoi, f.in.trainer->p[ao->tensor].name, ao->amax.peer0, ao->amax.npeers,
             pl_tables(p)[ar].namax_peers);
    CHECK_STR(f.el.msgs[0], want);
    ao->amax.npeers = np;
    wb_errlist_free(&f.el);
    wb_errlist_init(&f.el);
    /* a record fanned out without a rank step, then one past the last rollout rank */
    struct wb_rt_write *fw = &pl_tables(p)[0].writes[0], keep = *fw;
    fw->more = 3;
    fw->rank_step = 0;
    CHECK_INT(wb_plan_verify(p, &f.in, &f.el), -WB_E_PLAN);
    CHECK_STR(f.el.msgs[0], "rank 0: write 0 fans out to 3 more replicas with no rank step");
    wb_errlist_free(&f.el);
    wb_errlist_init(&f.el);
    fw->more = 1;
    fw->rank_step = p->nrollouts;
    CHECK_INT(wb_plan_verify(p, &f.in, &f.el), -WB_E_PLAN);
    snprintf(want, sizeof(want), "rank 0: write 0 to rollout rank %u of %u",
             keep.dst_rank + p->nrollouts, p->nrollouts);
    CHECK_STR(f.el.msgs[0], want);
    *fw = keep;
    wb_plan_free(p);
    fx_free(&f);
}

/* Every violation is counted, however many: the first 20 are kept with their text. */
static void test_verify_counts_all(void)
{
    struct fx f;
    mixed_case(&f, false);
    struct wb_plan *p = build(&f, WB_MODE_AUTO);
    uint64_t n = 0;
    for (uint32_t r = 0; r < p->ntrainers; r++)
        for (uint32_t i = 0; i < pl_tables(p)[r].nwrites; i++, n++)
            pl_tables(p)[r].writes[i].src_off += 1ull << 40;
    CHECK(n > 20);
    CHECK_U64(n, p->stats.records);
    CHECK(p->stats.writes > p->stats.records); /* records fan out to the replicas */
    CHECK_INT(wb_plan_verify(p, &f.in, &f.el), -WB_E_PLAN);
    CHECK_U64(wb_errlist_count(&f.el), n);
    CHECK_INT(f.el.n, 20);
    char want[256];
    snprintf(want, sizeof(want), "rank 0: write 0 (to rank %u ",
             pl_tables(p)[0].writes[0].dst_rank);
    CHECK(strncmp(f.el.msgs[0], want, strlen(want)) == 0);
    wb_plan_free(p);
    fx_free(&f);
}

/* ---------------------------------------------------------------- estimate */

/* 100 Gbps x 1 NIC at 100%, no launch or post costs: times by hand. */
static const char HW_BY_HAND[] =
    "hardware: {nic_gbps: 100, nics_per_gpu: 1, nic_efficiency: 1.0,\n"
    "  nvlink_GBps: 400, h2d_GBps: 50, copy_GBps: 1000, quant_GBps: 1000,\n"
    "  kernel_launch: 0us, write_submit: 0us, barrier: 0ms,\n"
    "  collective_launch: 0us}\n";

/* One BF16 tensor [rows, cols] on layouts with the hardware above, the rollout's copy sharded
 * as `shard` along dim 0. */
static void one_tensor_case(struct fx *f, const char *trainer, const char *rollout, uint64_t rows,
                            uint64_t cols, enum wb_shard_kind shard)
{
    fx_init(f);
    char t[1024], r[1024];
    snprintf(t, sizeof(t), "%s%s", trainer, HW_BY_HAND);
    snprintf(r, sizeof(r), "%s%s", rollout, HW_BY_HAND);
    CHECK_INT(fx_layouts(f, t, r), 0);
    uint32_t a = fx_t(f, "w", WB_DTYPE_BF16, fx_shape(2, rows, cols));
    uint32_t b = fx_r(f, "w", WB_DTYPE_BF16, fx_shape(2, rows, cols));
    struct wb_mapping *m = fx_map(f, b, -1, WB_XFORM_COPY, shard, 0);
    fx_comp_full(f, m, a, fx_box(2, 0, rows, 0, cols));
}

static void test_estimate_by_hand(void)
{
    struct fx f;
    /* 1 trainer -> 1 rollout, 100 MB BF16, 100 Gbps x 1 NIC at 100%: 8 ms of wire time */
    one_tensor_case(&f,
                    "world_size: 1\nmesh: [{name: dp, size: 1}]\nplacements: [{match: \"*\"}]\n",
                    "replicas: 1\n", 50000, 1000, WB_SHARD_REPLICATE);
    struct wb_plan *p = build(&f, WB_MODE_AUTO);
    struct wb_estimate e;
    CHECK_INT(wb_plan_estimate(p, &f.in, &e, &f.el), 0);
    CHECK(fabs(e.lower_bound_s - 0.008) < 1e-9);
    CHECK(fabs(e.total_s - 0.008) <= 2 * e.sample_dt + 1e-9);
    wb_estimate_free(&e);
    wb_plan_free(p);
    /* host residence: 100 MB at 50 GB/s = 2 ms of H2D before the wire */
    f.tl.residence = WB_RESIDE_HOST;
    p = build(&f, WB_MODE_AUTO);
    CHECK_INT(wb_plan_estimate(p, &f.in, &e, &f.el), 0);
    CHECK(fabs(e.total_s - 0.010) <= 2 * e.sample_dt + 1e-9);
    wb_estimate_free(&e);
    wb_plan_free(p);
    fx_free(&f);
}

/* A delta update by hand (wb_plan_estimate_delta): 100 MB BF16, 1 trainer -> 1 rollout at
 * 12.5 GB/s, copies at 1 TB/s. At 0.2 % changed the one write sends a record of ceil(0.002 x
 * 10^8) = 200,000 changed bytes x 5 + a 32-byte header = 1,000,032 bytes: 80 us on the wire
 * after the trainer's compare with its shadow (2 x 100 MB at 1 TB/s = 200 us), then the
 * rollout's apply (the record read + 200 KB written at 1 TB/s = 1.2 us): 281.2 us against 8 ms. */
static void test_estimate_delta_by_hand(void)
{
    struct fx f;
    one_tensor_case(&f,
                    "world_size: 1\nmesh: [{name: dp, size: 1}]\nplacements: [{match: \"*\"}]\n",
                    "replicas: 1\n", 50000, 1000, WB_SHARD_REPLICATE);
    struct wb_plan *p = build(&f, WB_MODE_AUTO);
    struct wb_delta_estimate d;
    CHECK_INT(wb_plan_estimate_delta(p, &f.in, 0.002, &d, &f.el), 0);
    CHECK_U64(d.full_bytes, 100000000);
    CHECK_U64(d.sent_bytes, 1000032);
    CHECK_U64(d.writes, 1);
    CHECK_U64(d.delta_writes, 1);
    CHECK_U64(d.full_other + d.full_over_half + d.full_not_cheaper, 0);
    CHECK_INT((int)d.entry_bytes, 5);
    CHECK_INT((int)d.header_bytes, 32);
    CHECK(fabs(d.full_s - 0.008) <= 2 * 20e-6); /* the simulation's steps: 20 us at least */
    CHECK(fabs(d.delta_s - 0.0002812) <= 2 * d.step_s + 1e-9);
    CHECK(fabs(d.apply_s - 1.200032e-6) < 1e-15);
    /* 20 % changed: a 100 MB record is over half the write; it goes in full, after the compare */
    CHECK_INT(wb_plan_estimate_delta(p, &f.in, 0.2, &d, &f.el), 0);
    CHECK_U64(d.sent_bytes, 100000000);
    CHECK_U64(d.full_over_half, 1);
    CHECK_U64(d.delta_writes, 0);
    CHECK(fabs(d.delta_s - 0.0082) <= 2 * d.step_s + 1e-9);
    CHECK(d.apply_s == 0);
    /* a rollout that applies at 1 MB/s: 1.2 s of apply against 7.92 ms saved, so in full */
    f.rl.hw.copy_Bps = 1e6;
    CHECK_INT(wb_plan_estimate_delta(p, &f.in, 0.002, &d, &f.el), 0);
    CHECK_U64(d.sent_bytes, 100000000);
    CHECK_U64(d.full_not_cheaper, 1);
    CHECK(fabs(d.delta_s - 0.0082) <= 2 * d.step_s + 1e-9);
    f.rl.hw.copy_Bps = 1e12;
    /* the fraction is checked */
    CHECK_INT(wb_plan_estimate_delta(p, &f.in, 0, &d, &f.el), -EINVAL);
    CHECK_STR(fx_errors(&f.el), "changed fraction 0: must be in (0, 1]");
    wb_plan_free(p);
    fx_free(&f);
    /* 2 replicas: one record, two copies; each rollout applies its own payload */
    one_tensor_case(&f,
                    "world_size: 1\nmesh: [{name: dp, size: 1}]\nplacements: [{match: \"*\"}]\n",
                    "replicas: 2\n", 50000, 1000, WB_SHARD_REPLICATE);
    p = build(&f, WB_MODE_AUTO);
    CHECK_INT(wb_plan_estimate_delta(p, &f.in, 0.002, &d, &f.el), 0);
    CHECK_U64(d.full_bytes, 200000000);
    CHECK_U64(d.sent_bytes, 2000064);
    CHECK_U64(d.writes, 2);
    CHECK_U64(d.delta_writes, 2);
    CHECK(fabs(d.full_s - 0.016) <= 2 * 20e-6);
    CHECK(fabs(d.delta_s - 0.0003612) <= 2 * d.step_s + 1e-9);
    CHECK(fabs(d.apply_s - 1.200032e-6) < 1e-15);
    wb_plan_free(p);
    fx_free(&f);
}

/* wb_plan_verify_estimate: both results as the two calls give them; a plan that fails verify
 * gets verify's own problems and no estimate. */
static void test_verify_estimate_together(void)
{
    struct fx f;
    one_tensor_case(&f, FSDP4, "replicas: 2\ntp: 2\n", 4096, 1024, WB_SHARD_TP);
    struct wb_plan *p = build(&f, WB_MODE_AUTO);
    struct wb_estimate alone, both;
    CHECK_INT(wb_plan_estimate(p, &f.in, &alone, &f.el), 0);
    struct wb_errlist vel, eel;
    wb_errlist_init(&vel);
    wb_errlist_init(&eel);
    struct wb_plan_checks ck;
    wb_plan_verify_estimate(p, &f.in, &both, &vel, &eel, &ck);
    CHECK_INT(ck.verify_rc, 0);
    CHECK_INT(ck.est_rc, 0);
    CHECK_INT((int)vel.n, 0);
    CHECK_INT((int)eel.n, 0);
    CHECK(ck.verify_s >= 0 && ck.est_s >= 0);
    CHECK(both.total_s == alone.total_s);
    CHECK(both.lower_bound_s == alone.lower_bound_s);
    CHECK_INT((int)both.nsamples, (int)alone.nsamples);
    wb_estimate_free(&both);
    wb_estimate_free(&alone);
    /* one write a byte short: verify's message, and the simulation stopped */
    struct wb_rt_write *w = &pl_tables(p)[0].writes[0];
    w->len -= 1;
    CHECK_INT(wb_plan_verify(p, &f.in, &f.el), -WB_E_PLAN);
    CHECK_INT((int)f.el.n, 1);
    wb_plan_verify_estimate(p, &f.in, &both, &vel, &eel, &ck);
    CHECK_INT(ck.verify_rc, -WB_E_PLAN);
    CHECK_INT(ck.est_rc, -ECANCELED);
    CHECK_INT((int)vel.n, 1);
    CHECK_STR(vel.msgs[0], f.el.msgs[0]);
    CHECK(strstr(vel.msgs[0], "never written") != NULL);
    CHECK_INT((int)eel.n, 0);
    wb_errlist_free(&vel);
    wb_errlist_free(&eel);
    wb_plan_free(p);
    fx_free(&f);
}

/* An estimate kept with the plan (auto mode's simulation of its choice) is handed out, copied,
 * only for the hardware, node size and cap it was made with; anything else simulates again. */
static bool same_estimate(const struct wb_estimate *a, const struct wb_estimate *b, uint32_t nt,
                          uint32_t nr)
{
    return a->total_s == b->total_s && a->lower_bound_s == b->lower_bound_s &&
           strcmp(a->bound, b->bound) == 0 && a->nphases == b->nphases &&
           a->nsamples == b->nsamples && a->peak_tmp_bytes == b->peak_tmp_bytes &&
           memcmp(a->phase, b->phase, a->nphases * sizeof(*a->phase)) == 0 &&
           memcmp(a->trainer_end_s, b->trainer_end_s, nt * sizeof(double)) == 0 &&
           memcmp(a->wait_s, b->wait_s, nt * sizeof(double)) == 0 &&
           memcmp(a->rollout_end_s, b->rollout_end_s, nr * sizeof(double)) == 0 &&
           memcmp(a->egress_Bps, b->egress_Bps, a->nsamples * sizeof(double)) == 0;
}

static void test_estimate_memo(void)
{
    struct fx f;
    one_tensor_case(&f, FSDP4, "replicas: 2\ntp: 2\n", 4096, 1024, WB_SHARD_TP);
    struct wb_plan *p = build(&f, WB_MODE_AUTO);
    struct wb_estimate fresh, kept, got;
    CHECK_INT(wb_plan_estimate(p, &f.in, &fresh, &f.el), 0);
    CHECK_INT(wb_plan_estimate(p, &f.in, &kept, &f.el), 0);
    kept.total_s = 123.0; /* marked: a copy of it shows it was not simulated again */
    pl_est_memo_set(p, &f.in, &kept);
    CHECK(kept.phase == NULL && kept.trainer_end_s == NULL);
    CHECK_INT(wb_plan_estimate(p, &f.in, &got, &f.el), 0);
    CHECK(got.total_s == 123.0);
    got.total_s = fresh.total_s;
    CHECK(same_estimate(&got, &fresh, p->ntrainers, p->nrollouts));
    CHECK(got.phase != pl_plan_of(p)->memo->e.phase); /* a copy, freed on its own */
    wb_estimate_free(&got);
    /* with verify: verify's result, then the copy */
    struct wb_errlist vel, eel;
    wb_errlist_init(&vel);
    wb_errlist_init(&eel);
    struct wb_plan_checks ck;
    wb_plan_verify_estimate(p, &f.in, &got, &vel, &eel, &ck);
    CHECK_INT(ck.verify_rc, 0);
    CHECK_INT(ck.est_rc, 0);
    CHECK(got.total_s == 123.0);
    wb_estimate_free(&got);
    /* other hardware, node size or cap: simulated again */
    double gbps = f.tl.hw.nic_gbps;
    f.tl.hw.nic_gbps = gbps * 2;
    CHECK_INT(wb_plan_estimate(p, &f.in, &got, &f.el), 0);
    CHECK(got.total_s != 123.0);
    wb_estimate_free(&got);
    f.tl.hw.nic_gbps = gbps;
    uint32_t gpn = f.tl.gpus_per_node;
    f.tl.gpus_per_node = gpn + 1;
    CHECK_INT(wb_plan_estimate(p, &f.in, &got, &f.el), 0);
    CHECK(got.total_s != 123.0);
    wb_estimate_free(&got);
    f.tl.gpus_per_node = gpn;
    p->mem_cap += 1;
    CHECK_INT(wb_plan_estimate(p, &f.in, &got, &f.el), 0);
    CHECK(got.total_s == fresh.total_s);
    wb_estimate_free(&got);
    p->mem_cap -= 1;
    /* a plan that fails verify: no estimate, memo or not */
    pl_tables(p)[0].writes[0].len -= 1;
    wb_plan_verify_estimate(p, &f.in, &got, &vel, &eel, &ck);
    CHECK_INT(ck.verify_rc, -WB_E_PLAN);
    CHECK_INT(ck.est_rc, -ECANCELED);
    CHECK(strstr(vel.msgs[0], "never written") != NULL);
    wb_errlist_free(&vel);
    wb_errlist_free(&eel);
    wb_estimate_free(&fresh);
    wb_plan_free(p); /* frees the memo */
    fx_free(&f);
}

static void test_estimate_needs_hardware(void)
{
    struct fx f;
    mixed_case(&f, false);
    struct wb_plan *p = build(&f, WB_MODE_AUTO);
    struct wb_estimate e;
    CHECK_INT(wb_plan_estimate(p, &f.in, &e, &f.el), -WB_E_CONFIG);
    char want[512];
    snprintf(want, sizeof(want), "%s: no hardware model (a `hardware:` key) for the estimate",
             f.tl.path);
    CHECK_INT(f.el.n, 1);
    CHECK_STR(f.el.msgs[0], want);
    wb_plan_free(p);
    fx_free(&f);
}

/* ---------------------------------------------------------------- CLI */

static char bin[512];

static const char *plan_bin(void)
{
    const char *dir = getenv("WB_BIN");
    snprintf(bin, sizeof(bin), "%s/wb-plan", dir ? dir : "build/bin");
    if (access(bin, X_OK) != 0)
        wb_test_skip("%s not built", bin);
    return bin;
}

static void run_argv(void *arg)
{
    char **argv = arg;
    execv(argv[0], argv);
    _exit(127);
}

static void test_cli(void)
{
    char *exe = (char *)plan_bin();
    char out[16384];
    char *help[] = {exe, "--help", NULL};
    CHECK_INT(wb_test_capture(run_argv, help, out, sizeof(out)), 0);
    CHECK(strncmp(out, "usage: wb-plan --model", 22) == 0);
    char *bad[] = {exe, "--mode", "fast", NULL};
    CHECK_INT(wb_test_capture(run_argv, bad, out, sizeof(out)), 2);
    CHECK_STR(out, "wb-plan: --mode: expected auto, direct or gather, got 'fast'\n");
    char *threads[] = {exe, "--threads", "0", NULL};
    CHECK_INT(wb_test_capture(run_argv, threads, out, sizeof(out)), 2);
    CHECK_STR(out, "wb-plan: --threads: expected a number from 1 to 64, got '0'\n");
    char *t = strdup(wb_test_write_file("t.yaml", "world_size: 8\n"
                                                  "mesh: [{name: fsdp, size: 4}]\n"
                                                  "placements: [{match: \"*\"}]\n"));
    char *r = strdup(wb_test_write_file("r.yaml", "replicas: 1\ntp: 3\ngpus_per_replica: 4\n"));
    char *ti = strdup(wb_test_write_file("ti.yaml", "w: {dtype: bf16, shape: [8, 4]}\n"));
    char *ri = strdup(wb_test_write_file("ri.yaml", "w: {dtype: bf16, shape: [8, 4]}\n"));
    char *plan[] = {exe,
                    "--model",
                    "configs/models/qwen3.yaml",
                    "--trainer",
                    t,
                    "--rollout",
                    r,
                    "--trainer-inv",
                    ti,
                    "--rollout-inv",
                    ri,
                    NULL};
    CHECK_INT(wb_test_capture(run_argv, plan, out, sizeof(out)), 1);
    char want[2048];
    snprintf(want, sizeof(want),
             "wb-plan: model and layouts: 2 problems\n"
             "  %s: world_size 8 != product of mesh dims fsdp 4 = 4\n"
             "  %s: tp 3 does not divide gpus_per_replica 4\n",
             t, r);
    CHECK_STR(out, want);
    /* --var reaches both generated inventories */
    char *t1 = strdup(wb_test_write_file("t1.yaml", "world_size: 1\n"
                                                    "mesh: [{name: fsdp, size: 1}]\n"
                                                    "placements: [{match: \"*\"}]\n"));
    char *r1 = strdup(wb_test_write_file("r1.yaml", "replicas: 1\n"));
    char *var[] = {exe,
                   "--model",
                   "configs/models/deepseek_v3.yaml",
                   "--config",
                   "configs/hf/DeepSeek-V3.json",
                   "--trainer",
                   t1,
                   "--rollout",
                   r1,
                   "--var",
                   "mpt=1",
                   NULL};
    CHECK_INT(wb_test_capture(run_argv, var, out, sizeof(out)), 1);
    CHECK_STR(out, "wb-plan: model and layouts: 1 problem\n"
                   "  vars 'mpt=1': 'mpt' is not one of configs/models/deepseek_v3.yaml's vars "
                   "(mtp, all_layers)\n");
    free(t1);
    free(r1);
    free(t);
    free(r);
    free(ti);
    free(ri);
}

const struct wb_test wb_tests[] = {
    {"mixed_all_modes", test_mixed_all_modes, 0},
    {"wire_roundtrip", test_wire_roundtrip, 0},
    {"wire_bad_indices", test_wire_bad_indices, 0},
    {"balance", test_balance, 0},
    {"gpt_oss_planned", test_gpt_oss_planned, 0},
    {"cap_below_largest_task", test_cap_below_largest_task, 0},
    {"verify_catches", test_verify_catches, 0},
    {"verify_counts_all", test_verify_counts_all, 0},
    {"verify_replica_classes", test_verify_replica_classes, 0},
    {"estimate_by_hand", test_estimate_by_hand, 0},
    {"estimate_delta_by_hand", test_estimate_delta_by_hand, 0},
    {"verify_estimate_together", test_verify_estimate_together, 0},
    {"estimate_memo", test_estimate_memo, 0},
    {"estimate_needs_hardware", test_estimate_needs_hardware, 0},
    {"cli", test_cli, 0},
    {0},
};
