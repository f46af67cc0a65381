/* planner_relay_test.c — replicas relaying to replicas in the planner (issue #30): the forest
 * of a shape over the member replicas, the shape's checks, the estimate of a chain and a tree
 * worked by hand, relay auto's choice, the verify of a forest (a replica written twice, from a
 * parent holding another receive list, a cycle), the plan JSON and wb-plan's flags. */
#include <errno.h>
#include <math.h>
#include <unistd.h>

#include "tests/unit/planner_fx.h"

/* 100 Gbps x 1 NIC at 100% (12.5 GB/s each way), no launch or post costs: times by hand. */
static const char HW_BY_HAND[] =
    "hardware: {nic_gbps: 100, nics_per_gpu: 1, nic_efficiency: 1.0,\n"
    "  nvlink_GBps: 400, h2d_GBps: 50, copy_GBps: 1000, quant_GBps: 1000,\n"
    "  kernel_launch: 0us, write_submit: 0us, barrier: 0ms,\n"
    "  collective_launch: 0us}\n";

/* One trainer GPU holding four BF16 tensors of 25 MB ([12500, 1000]), four rollout replicas of
 * one GPU each: every replica receives 100 MB in four entries of 2 ms on the wire. */
static void four_entries_case(struct fx *f)
{
    fx_init(f);
    char t[1024], r[1024];
    snprintf(t, sizeof(t),
             "world_size: 1\nmesh: [{name: dp, size: 1}]\n"
             "placements: [{match: \"*\"}]\n%s",
             HW_BY_HAND);
    snprintf(r, sizeof(r), "replicas: 4\n%s", HW_BY_HAND);
    CHECK_INT(fx_layouts(f, t, r), 0);
    const char *names[] = {"a", "b", "c", "d"};
    for (int i = 0; i < 4; i++) {
        uint32_t a = fx_t(f, names[i], WB_DTYPE_BF16, fx_shape(2, 12500, 1000));
        uint32_t b = fx_r(f, names[i], WB_DTYPE_BF16, fx_shape(2, 12500, 1000));
        struct wb_mapping *m = fx_map(f, b, -1, WB_XFORM_COPY, WB_SHARD_REPLICATE, 0);
        fx_comp_full(f, m, a, fx_box(2, 0, 12500, 0, 1000));
    }
}

static struct wb_plan *build_relay(struct fx *f, struct wb_relay relay)
{
    struct wb_plan_opts o = {.mode = WB_MODE_AUTO, .relay = relay};
    struct wb_plan *p = NULL;
    if (wb_plan_build(&f->in, &o, &p, &f->el))
        wb_test_fail(__FILE__, __LINE__, "%s", fx_errors(&f->el));
    return p;
}

static void test_forest_shapes(void)
{
    const uint32_t R = WB_RELAY_ROOT, A = WB_RELAY_ABSENT;
    uint32_t p[8];
    struct wb_relay chain = {WB_PLAN_RELAY_CHAIN, 1, 1};
    wb_relay_forest(&chain, 4, NULL, p);
    CHECK(p[0] == R && p[1] == 0 && p[2] == 1 && p[3] == 2);
    /* two roots: two chains interleaved, 0 -> 2 -> 4 and 1 -> 3 */
    struct wb_relay chain2 = {WB_PLAN_RELAY_CHAIN, 1, 2};
    wb_relay_forest(&chain2, 5, NULL, p);
    CHECK(p[0] == R && p[1] == R && p[2] == 0 && p[3] == 1 && p[4] == 2);
    /* a tree fills level by level */
    struct wb_relay tree = {WB_PLAN_RELAY_TREE, 2, 1};
    wb_relay_forest(&tree, 7, NULL, p);
    CHECK(p[0] == R && p[1] == 0 && p[2] == 0 && p[3] == 1 && p[4] == 1 && p[5] == 2 && p[6] == 2);
    /* members only: replica 1 left the attempt, 3 takes its place after 0 */
    bool member[4] = {true, false, true, true};
    wb_relay_forest(&chain, 4, member, p);
    CHECK(p[0] == R && p[1] == A && p[2] == 0 && p[3] == 2);
    /* off: every member a root */
    struct wb_relay off = {WB_PLAN_RELAY_OFF, 0, 0};
    wb_relay_forest(&off, 4, member, p);
    CHECK(p[0] == R && p[1] == A && p[2] == R && p[3] == R);
    /* the edges and roots the rollouts are told */
    uint32_t *roots;
    struct wb_relay_edge *edges;
    struct wb_relay_forest f;
    wb_relay_forest(&tree, 4, NULL, p);
    CHECK_INT(wb_relay_forest_edges(p, 4, &roots, &edges, &f), 0);
    CHECK_INT(f.nroots, 1);
    CHECK_INT(roots[0], 0);
    CHECK_INT(f.nedges, 3);
    CHECK(edges[0].parent == 0 && edges[0].child == 1 && edges[1].parent == 0 &&
          edges[1].child == 2 && edges[2].parent == 1 && edges[2].child == 3);
    free(roots);
    free(edges);
}

static void test_resolve(void)
{
    char err[256];
    struct wb_relay out;
    enum wb_relay_kind k;
    CHECK_INT(wb_relay_kind_parse("tree", &k), 0);
    CHECK_INT(k, WB_PLAN_RELAY_TREE);
    CHECK_INT(wb_relay_kind_parse("ring", &k), -EINVAL);
    CHECK_INT(
        wb_relay_resolve(&(struct wb_relay){WB_PLAN_RELAY_TREE, 0, 0}, 4, &out, err, sizeof(err)),
        0);
    CHECK(out.kind == WB_PLAN_RELAY_TREE && out.fanout == 2 && out.roots == 1);
    CHECK_INT(
        wb_relay_resolve(&(struct wb_relay){WB_PLAN_RELAY_CHAIN, 0, 3}, 4, &out, err, sizeof(err)),
        0);
    CHECK(out.kind == WB_PLAN_RELAY_CHAIN && out.fanout == 1 && out.roots == 3);
    struct {
        struct wb_relay in;
        const char *err;
    } bad[] = {
        {{WB_PLAN_RELAY_CHAIN, 3, 0},
         "relay chain: fanout 3 (a chain has fanout 1; a tree has more)"},
        {{WB_PLAN_RELAY_TREE, 1, 0},
         "relay tree: fanout 1 is a chain (relay chain), a tree has 2 or "
         "more"},
        {{WB_PLAN_RELAY_TREE, 2, 5}, "relay roots 5: the rollout has 4 replicas"},
        {{WB_PLAN_RELAY_OFF, 0, 2},
         "relay off: a fanout (0) or roots (2) need relay chain, tree or "
         "auto"},
    };
    for (size_t i = 0; i < WB_ARRAY_LEN(bad); i++) {
        CHECK_INT(wb_relay_resolve(&bad[i].in, 4, &out, err, sizeof(err)), -WB_E_CONFIG);
        CHECK_STR(err, bad[i].err);
    }
}

/* The estimate, worked by hand (four entries of 25 MB = 2 ms each on a 12.5 GB/s NIC; every
 * NIC sends and receives at that rate at once). A relay forwards what landed a piece at a time
 * (4 MiB = 0.3355 ms; a 25 MB write is 5 of them and 4,028,480 bytes = 0.3223 ms):
 *  - off: the trainer sends every entry to 4 replicas, 400 MB through one NIC: 32 ms.
 *  - chain of 4 (0 -> 1 -> 2 -> 3): the trainer sends 100 MB to replica 0 only, done at 8 ms;
 *    each hop forwards every piece as it landed at the rate it arrives, so replica h has its
 *    last byte one last piece later than the replica before: 8 + 0.3223 h ms, 8.967 ms for
 *    replica 3. A hop costs a piece's time, not an entry's (2 ms) or a replica's (8 ms).
 *  - tree of fanout 2 (0 -> (1 -> 3, 2)): replica 0 sends everything twice, its egress shared
 *    by its two children (6.25 GB/s each) from its first piece on: 0.3355 + 16 ms for 1 and 2,
 *    and replica 1's last piece reaches 3 at full rate 0.3223 ms later: 16.658 ms.
 *  - chain with 2 roots (0 -> 2, 1 -> 3): the trainer sends 200 MB, both roots done at 16 ms,
 *    their children one last piece later: 16.322 ms.
 * A forward is posted on the step after its piece landed and moves from the step after that,
 * so each hop may add two steps (dt). */
static void test_estimate_by_hand(void)
{
    struct fx f;
    four_entries_case(&f);
    struct wb_plan *p = build_relay(&f, (struct wb_relay){WB_PLAN_RELAY_OFF, 0, 0});
    struct {
        struct wb_relay shape;
        double want_s, bound_s;
        int hops;
    } c[] = {
        {{WB_PLAN_RELAY_OFF, 0, 0}, 0.032, 0.032, 0},
        {{WB_PLAN_RELAY_CHAIN, 1, 1}, 0.008967, 0.008, 3},
        {{WB_PLAN_RELAY_TREE, 2, 1}, 0.016658, 0.016, 2},
        {{WB_PLAN_RELAY_CHAIN, 1, 2}, 0.016322, 0.016, 1},
    };
    for (size_t i = 0; i < WB_ARRAY_LEN(c); i++) {
        struct wb_estimate e;
        CHECK_INT(pl_estimate_relay(p, &f.in, &c[i].shape, &e, &f.el), 0);
        CHECK(fabs(e.lower_bound_s - c[i].bound_s) < 1e-9);
        if (fabs(e.total_s - c[i].want_s) > (2 * c[i].hops + 1) * e.sample_dt + 1e-9)
            wb_test_fail(__FILE__, __LINE__, "shape %zu: %.6f s, by hand %.6f s (dt %.6f s)", i,
                         e.total_s, c[i].want_s, e.sample_dt);
        /* every replica's last byte, chain of 4: 8, 8.322, 8.645, 8.967 ms */
        if (i == 1)
            for (uint32_t g = 0; g < 4; g++)
                CHECK(fabs(e.rollout_end_s[g] - 0.008 - 0.00032228 * g) <=
                      (2 * g + 1) * e.sample_dt + 1e-9);
        wb_estimate_free(&e);
    }
    /* the plan's own relay is what wb_plan_estimate simulates */
    p->relay = (struct wb_relay){WB_PLAN_RELAY_CHAIN, 1, 1};
    struct wb_estimate e;
    CHECK_INT(wb_plan_estimate(p, &f.in, &e, &f.el), 0);
    CHECK(fabs(e.total_s - 0.008967) <= 7 * e.sample_dt + 1e-9);
    CHECK(strstr(e.bound, "NIC") != NULL);
    wb_estimate_free(&e);
    wb_plan_free(p);
    fx_free(&f);
}

/* A replica joining the running job is caught up by one update to it alone
 * (wb_plan_estimate_join): of the four replicas' plan, the trainer writes one replica's 100 MB
 * into its 12.5 GB/s NIC, 8 ms, whatever the plan's relay shape — against 32 ms for all four
 * without relay, 14 ms in a chain. */
static void test_join_by_hand(void)
{
    struct fx f;
    four_entries_case(&f);
    struct wb_plan *p = build_relay(&f, (struct wb_relay){WB_PLAN_RELAY_OFF, 0, 0});
    struct wb_relay shapes[] = {
        {WB_PLAN_RELAY_OFF, 0, 0}, {WB_PLAN_RELAY_CHAIN, 1, 1}, {WB_PLAN_RELAY_TREE, 2, 1}};
    for (size_t i = 0; i < WB_ARRAY_LEN(shapes); i++) {
        p->relay = shapes[i];
        struct wb_estimate e;
        CHECK_INT(wb_plan_estimate_join(p, &f.in, &e, &f.el), 0);
        if (fabs(e.total_s - 0.008) > 5 * e.sample_dt + 1e-9)
            wb_test_fail(__FILE__, __LINE__, "shape %zu: %.6f s, by hand 0.008 s (dt %.6f s)", i,
                         e.total_s, e.sample_dt);
        uint64_t written = 0;
        for (uint32_t q = 0; q < e.nphases; q++)
            written += e.phase[q].write_bytes;
        CHECK_U64(written, 100000000);
        CHECK(e.rollout_end_s[0] > 0);
        for (uint32_t g = 1; g < 4; g++) /* the other replicas are not in its attempt */
            CHECK(e.rollout_end_s[g] == 0);
        wb_estimate_free(&e);
    }
    wb_plan_free(p);
    fx_free(&f);
}

/* The ring flows of network gathers go through the same posting as relay forwards: a gather
 * plan still simulates as before (FSDP 4 over 4 nodes, 100 MB gathered whole: each member
 * receives the 75 MB it lacks from the previous one, 6 ms, then the four write their quarter
 * pieces of the one rollout GPU's 100 MB into its 12.5 GB/s NIC, 8 ms: 14 ms). */
static void test_gather_unchanged(void)
{
    struct fx f;
    fx_init(&f);
    char t[1024], r[1024];
    snprintf(t, sizeof(t),
             "world_size: 4\ngpus_per_node: 1\nmesh: [{name: fsdp, size: 4}]\n"
             "placements: [{match: \"*\", place: {fsdp: shard(0)}}]\n%s",
             HW_BY_HAND);
    snprintf(r, sizeof(r), "replicas: 1\n%s", HW_BY_HAND);
    CHECK_INT(fx_layouts(&f, t, r), 0);
    uint32_t a = fx_t(&f, "w", WB_DTYPE_BF16, fx_shape(2, 50000, 1000));
    uint32_t b = fx_r(&f, "w", WB_DTYPE_BF16, fx_shape(2, 50000, 1000));
    struct wb_mapping *m = fx_map(&f, b, -1, WB_XFORM_COPY, WB_SHARD_REPLICATE, 0);
    fx_comp_full(&f, m, a, fx_box(2, 0, 50000, 0, 1000));
    struct wb_plan_opts o = {.mode = WB_MODE_GATHER};
    struct wb_plan *p = NULL;
    CHECK_INT(wb_plan_build(&f.in, &o, &p, &f.el), 0);
    struct wb_estimate e;
    CHECK_INT(wb_plan_estimate(p, &f.in, &e, &f.el), 0);
    if (fabs(e.total_s - 0.014) > 5 * e.sample_dt + 1e-9)
        wb_test_fail(__FILE__, __LINE__, "%.6f s, by hand 0.014 s (dt %.6f s)", e.total_s,
                     e.sample_dt);
    wb_estimate_free(&e);
    wb_plan_free(p);
    fx_free(&f);
}

/* relay auto: the chain of one root (8.967 ms) beats off (32 ms: known from auto mode, which
 * simulated the plan while building it), and the shapes whose bound (16 ms) is above that are
 * not simulated. */
static void test_auto_choice(void)
{
    struct fx f;
    four_entries_case(&f);
    struct wb_plan *p = build_relay(&f, (struct wb_relay){WB_PLAN_RELAY_AUTO, 0, 0});
    CHECK_INT(p->relay.kind, WB_PLAN_RELAY_CHAIN);
    CHECK_INT(p->relay.fanout, 1);
    CHECK_INT(p->relay.roots, 1);
    CHECK_INT(p->nrelay_tried, 5);
    const struct wb_relay_try *t = p->relay_tried;
    /* simulated first: the least bound, 8 ms */
    CHECK(t[0].shape.kind == WB_PLAN_RELAY_CHAIN && t[0].shape.roots == 1);
    CHECK(fabs(t[0].total_s - 0.008967) < 0.00015);
    CHECK(fabs(t[0].bound_s - 0.008) < 1e-9);
    /* then the 16 ms bounds, more roots first, and off (32 ms): none simulated */
    CHECK(t[1].shape.kind == WB_PLAN_RELAY_CHAIN && t[1].shape.roots == 2);
    CHECK(t[2].shape.kind == WB_PLAN_RELAY_TREE && t[2].shape.roots == 2);
    CHECK(t[3].shape.kind == WB_PLAN_RELAY_TREE && t[3].shape.roots == 1);
    CHECK(t[4].shape.kind == WB_PLAN_RELAY_OFF);
    for (int i = 1; i < 4; i++) {
        CHECK(t[i].total_s == INFINITY);
        CHECK_INT(t[i].skipped, WB_RELAY_TRY_BOUND);
    }
    /* off's time is the one auto mode simulated while building the plan (kept with it) */
    CHECK(fabs(t[4].bound_s - 0.032) < 1e-9);
    CHECK(fabs(t[4].total_s - 0.032) < 0.0002);
    CHECK_INT(t[4].skipped, WB_RELAY_TRY_RUN);
    /* the chosen shape's estimate is kept: --estimate copies it */
    struct wb_estimate e;
    CHECK_INT(wb_plan_estimate(p, &f.in, &e, &f.el), 0);
    CHECK(e.total_s == t[0].total_s);
    wb_estimate_free(&e);
    /* and it verifies, the forest included */
    CHECK_INT(wb_plan_verify(p, &f.in, &f.el), 0);
    /* the JSON carries the shape, the forest and what auto simulated */
    char *buf = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&buf, &len);
    CHECK_INT(wb_plan_write_json(p, &f.in, false, m), 0);
    fclose(m);
    CHECK(strstr(buf, "\n\"relay\":{\"kind\":\"chain\",\"fanout\":1,\"roots\":1,"
                      "\"parent\":[-1,0,1,2],\"tried\":[{\"kind\":\"chain\",\"fanout\":1,"
                      "\"roots\":1,\"bound_s\":0.008,\"total_s\":0.00906") != NULL);
    free(buf);
    wb_plan_free(p);
    /* without a hardware model there is nothing to choose by: off */
    f.rl.hw.nic_gbps = 0;
    p = build_relay(&f, (struct wb_relay){WB_PLAN_RELAY_AUTO, 0, 0});
    CHECK_INT(p->relay.kind, WB_PLAN_RELAY_OFF);
    buf = NULL;
    m = open_memstream(&buf, &len);
    CHECK_INT(wb_plan_write_json(p, &f.in, false, m), 0);
    fclose(m);
    CHECK(strstr(buf, "\"relay\"") == NULL); /* relay off: the JSON as before */
    free(buf);
    wb_plan_free(p);
    fx_free(&f);
}

/* Exactly the messages of a verify of forest f. */
static void verify_says(const struct wb_plan *p, uint32_t nroots, const uint32_t *roots,
                        uint32_t nedges, const struct wb_relay_edge *edges, const char *want)
{
    struct wb_errlist el;
    wb_errlist_init(&el);
    struct wb_relay_forest f = {nroots, roots, nedges, edges};
    CHECK_INT(wb_relay_verify(p, &f, &el), want ? -WB_E_PLAN : 0);
    CHECK_STR(fx_errors(&el), want ? want : "");
    wb_errlist_free(&el);
}

static void test_verify_forest(void)
{
    struct fx f;
    four_entries_case(&f);
    struct wb_plan *p = build_relay(&f, (struct wb_relay){WB_PLAN_RELAY_CHAIN, 0, 0});
    CHECK_INT(wb_plan_verify(p, &f.in, &f.el), 0);
    uint32_t r0[] = {0}, r02[] = {0, 2}, r00[] = {0, 0}, r9[] = {9};
    struct wb_relay_edge chain[] = {{0, 1}, {1, 2}, {2, 3}};
    verify_says(p, 1, r0, 3, chain, NULL);
    /* a root that is also a child: the trainers and replica 1 both write replica 2 */
    verify_says(p, 2, r02, 3, chain,
                "relay: replica 2 is written twice: by the trainers (a root) and by replica 1");
    /* two parents */
    struct wb_relay_edge two[] = {{0, 1}, {0, 2}, {1, 3}, {2, 3}};
    verify_says(p, 1, r0, 4, two,
                "relay: replica 3 is written twice: by replica 1 and by replica 2");
    verify_says(p, 2, r00, 3, chain,
                "relay: replica 0 is listed as a root twice: the trainers would write it twice");
    /* a cycle nothing writes into, and a replica index past the plan */
    struct wb_relay_edge cyc[] = {{0, 1}, {2, 3}, {3, 2}};
    verify_says(p, 1, r0, 3, cyc,
                "relay: replica 2 is on a relay cycle: no trainer's bytes reach it");
    struct wb_relay_edge past[] = {{0, 4}};
    verify_says(p, 1, r9, 1, past,
                "relay: root 9 is not a replica (the plan has 4)\n"
                "relay: edge 0 -> 4: replica 4 is not a replica (the plan has 4)");
    /* a parent holding another receive list: replica 3's rank expects one write more */
    p->recv[3].expect[0].writes++;
    verify_says(p, 1, r0, 3, chain,
                "relay: replica 2 cannot write replica 3: local rank 0 (rollout rank 2 -> 3) "
                "holds another receive list: tag 1 expects 25000000 bytes in 1 writes against "
                "tag 1, 25000000 bytes in 2 writes");
    /* the plan's own forest is checked by wb_plan_verify */
    CHECK_INT(wb_plan_verify(p, &f.in, &f.el), -WB_E_PLAN);
    CHECK(strstr(fx_errors(&f.el), "relay: replica 2 cannot write replica 3") != NULL);
    p->recv[3].expect[0].writes--;
    /* a local tensor of another size: replica 1 can neither take 0's bytes nor give 2 its */
    p->recv[1].local[0].bytes += 2;
    verify_says(p, 1, r0, 3, chain,
                "relay: replica 0 cannot write replica 1: local rank 0 (rollout rank 0 -> 1) "
                "holds another receive list: local tensor 0: rollout tensor 0 of 25000000 bytes "
                "against rollout tensor 0 of 25000002 bytes\n"
                "relay: replica 1 cannot write replica 2: local rank 0 (rollout rank 1 -> 2) "
                "holds another receive list: local tensor 0: rollout tensor 0 of 25000002 bytes "
                "against rollout tensor 0 of 25000000 bytes");
    p->recv[1].local[0].bytes -= 2;
    wb_plan_free(p);
    fx_free(&f);
}

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
    char *bad[] = {exe, "--relay", "ring", NULL};
    CHECK_INT(wb_test_capture(run_argv, bad, out, sizeof(out)), 2);
    CHECK_STR(out, "wb-plan: --relay: expected off, chain, tree or auto, got 'ring'\n");
    char *fan[] = {exe, "--relay-fanout", "0", NULL};
    CHECK_INT(wb_test_capture(run_argv, fan, out, sizeof(out)), 2);
    CHECK_STR(out, "wb-plan: --relay-fanout: expected a number from 1 to 65536, got '0'\n");
    char *t = strdup(wb_test_write_file("t.yaml", "world_size: 1\n"
                                                  "mesh: [{name: fsdp, size: 1}]\n"
                                                  "placements: [{match: \"*\"}]\n"));
    char *r = strdup(wb_test_write_file("r.yaml", "replicas: 4\n"));
    char *ti = strdup(wb_test_write_file("ti.yaml", "w: {dtype: bf16, shape: [8, 4]}\n"));
    char *ri = strdup(wb_test_write_file("ri.yaml", "w: {dtype: bf16, shape: [8, 4]}\n"));
    char *alone[] = {exe,
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
                     "--relay-roots",
                     "2",
                     NULL};
    CHECK_INT(wb_test_capture(run_argv, alone, out, sizeof(out)), 2);
    CHECK_STR(out, "wb-plan: --relay-fanout and --relay-roots go with --relay chain, tree or "
                   "auto\n");
    char *roots[] = {exe,
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
                     "--relay",
                     "tree",
                     "--relay-roots",
                     "5",
                     NULL};
    CHECK_INT(wb_test_capture(run_argv, roots, out, sizeof(out)), 1);
    char want[1024];
    snprintf(want, sizeof(want),
             "wb-plan: planning: 1 problem\n  %s: relay roots 5: the rollout has 4 replicas\n", r);
    CHECK_STR(out, want);
    char *chain[] = {exe,
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
                     "--relay",
                     "chain",
                     "--relay-roots",
                     "2",
                     "--verify",
                     NULL};
    CHECK_INT(wb_test_capture(run_argv, chain, out, sizeof(out)), 0);
    CHECK(strstr(out, "  relay: chain, 2 roots; the trainers write replicas 0, 1\n"
                      "    forest: 0 -> 2; 1 -> 3\n") != NULL);
    CHECK(strstr(out, "  verify: ok (every destination byte written once, every source held; "
                      "relay: every replica written once, by the trainers or a parent holding "
                      "the same receive lists) in ") != NULL);
    /* --join: the catch-up of a joining replica, estimated; it needs the hardware models */
    char *join[] = {exe,
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
                    "--join",
                    NULL};
    CHECK_INT(wb_test_capture(run_argv, join, out, sizeof(out)), 1);
    snprintf(want, sizeof(want),
             "wb-plan: join estimate: 1 problem\n  %s: no hardware model (a `hardware:` key) for "
             "the estimate\n",
             t);
    CHECK(strstr(out, want) != NULL);
    char text[1024];
    snprintf(text, sizeof(text),
             "world_size: 1\nmesh: [{name: fsdp, size: 1}]\nplacements: [{match: \"*\"}]\n%s",
             HW_BY_HAND);
    char *th = strdup(wb_test_write_file("th.yaml", text));
    snprintf(text, sizeof(text), "replicas: 4\n%s", HW_BY_HAND);
    char *rh = strdup(wb_test_write_file("rh.yaml", text));
    join[4] = th;
    join[6] = rh;
    CHECK_INT(wb_test_capture(run_argv, join, out, sizeof(out)), 0);
    CHECK(strstr(out,
                 "join: a replica added while the job runs (within replicas: 4, the capacity "
                 "the plan covers) is not re-planned: it is set up alone, then caught up "
                 "from the trainers in 0.000 s (one update to it alone; estimated in ") != NULL);
    free(th);
    free(rh);
    free(t);
    free(r);
    free(ti);
    free(ri);
}

const struct wb_test wb_tests[] = {
    {"forest_shapes", test_forest_shapes, 0},
    {"resolve", test_resolve, 0},
    {"join_by_hand", test_join_by_hand, 0},
    {"estimate_by_hand", test_estimate_by_hand, 0},
    {"gather_unchanged", test_gather_unchanged, 0},
    {"auto_choice", test_auto_choice, 0},
    {"verify_forest", test_verify_forest, 0},
    {"cli", test_cli, 0},
    {0},
};
