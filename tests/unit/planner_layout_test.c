/* planner_layout_test.c — cluster layout files: owners and boxes (FSDP2 chunking, nested
 * shards, pipeline stages, experts), and bad layouts rejected with exact messages. */
#include <errno.h>
#include <math.h>

#include "tests/unit/planner_fx.h"

/* Loads a trainer layout; returns the path it was written to. */
static const char *trainer_file(struct fx *f, const char *yaml, int expect_rc)
{
    const char *path = wb_test_write_file("trainer.yaml", yaml);
    CHECK_INT(wb_trainer_layout_load(path, &f->tl, &f->el), expect_rc);
    return path;
}

static const char *rollout_file(struct fx *f, const char *yaml, int expect_rc)
{
    const char *path = wb_test_write_file("rollout.yaml", yaml);
    CHECK_INT(wb_rollout_layout_load(path, &f->rl, &f->el), expect_rc);
    return path;
}

/* The owners of tensor t as "rank[box] ..." */
static const char *owners_str(struct fx *f, uint32_t t)
{
    static char buf[2048];
    struct wb_owner *o;
    uint32_t n;
    CHECK_INT(wb_trainer_owners(&f->tl, &f->ti, t, &o, &n, &f->el), 0);
    size_t pos = 0;
    buf[0] = 0;
    for (uint32_t i = 0; i < n; i++) {
        char b[128];
        pos += (size_t)snprintf(buf + pos, sizeof(buf) - pos, "%s%u%s", i ? " " : "", o[i].rank,
                                wb_box_str(&o[i].box, b, sizeof(b)));
    }
    free(o);
    return buf;
}

static void test_fsdp_chunks(void)
{
    struct fx f;
    fx_init(&f);
    trainer_file(&f,
                 "world_size: 4\n"
                 "gpus_per_node: 4\n"
                 "mesh: [{name: fsdp, size: 4}]\n"
                 "placements: [{match: \"*\", place: {fsdp: shard(0)}}]\n",
                 0);
    uint32_t a = fx_t(&f, "a", WB_DTYPE_BF16, fx_shape(1, 10));
    uint32_t b = fx_t(&f, "b", WB_DTYPE_BF16, fx_shape(2, 5, 3));
    uint32_t c = fx_t(&f, "c", WB_DTYPE_BF16, fx_shape(1, 2));
    /* torch.chunk: ceil(10/4) = 3 -> 3, 3, 3, 1; ceil(5/4) = 2 -> 2, 2, 1, 0 (left out) */
    CHECK_STR(owners_str(&f, a), "0[0:3] 1[3:6] 2[6:9] 3[9:10]");
    CHECK_STR(owners_str(&f, b), "0[0:2, 0:3] 1[2:4, 0:3] 2[4:5, 0:3]");
    CHECK_STR(owners_str(&f, c), "0[0:1] 1[1:2]");
    fx_free(&f);
}

static void test_nested_and_replicated(void)
{
    struct fx f;
    fx_init(&f);
    trainer_file(&f,
                 "world_size: 8\n"
                 "mesh: [{name: dp, size: 2}, {name: a, size: 2}, {name: b, size: 2}]\n"
                 "placements:\n"
                 "  - {match: \"two.*\", place: {a: shard(0), b: shard(0)}}\n"
                 "  - {match: \"cols\", place: {a: shard(1), b: replicate, dp: 1}}\n",
                 0);
    uint32_t t = fx_t(&f, "two.w", WB_DTYPE_BF16, fx_shape(1, 8));
    uint32_t u = fx_t(&f, "cols", WB_DTYPE_BF16, fx_shape(2, 2, 6));
    /* DTensor applies mesh dims in order: a splits [0, 8), b splits each half; dp replicates */
    CHECK_STR(owners_str(&f, t), "0[0:2] 1[2:4] 2[4:6] 3[6:8] 4[0:2] 5[2:4] 6[4:6] 7[6:8]");
    CHECK_STR(owners_str(&f, u), "4[0:2, 0:3] 5[0:2, 0:3] 6[0:2, 3:6] 7[0:2, 3:6]");
    fx_free(&f);
}

static void test_layers_and_experts(void)
{
    struct fx f;
    fx_init(&f);
    trainer_file(&f,
                 "world_size: 4\n"
                 "mesh: [{name: pp, size: 2}, {name: ep, size: 2}]\n"
                 "placements:\n"
                 "  - {match: \"layers.{layer}.experts.{expert}.*\", place: {pp: layer, ep: "
                 "expert}}\n"
                 "  - {match: \"layers.{layer}.*\", place: {pp: layer}}\n"
                 "  - {match: \"embed\", place: {pp: 0, ep: shard(0)}}\n"
                 "  - {match: \"*\", place: {pp: last}}\n",
                 0);
    char name[64];
    uint32_t first = (uint32_t)f.ti.n;
    for (int l = 0; l < 5; l++)
        for (int e = 0; e < 4; e++) {
            snprintf(name, sizeof(name), "layers.%d.experts.%d.w", l, e);
            fx_t(&f, name, WB_DTYPE_BF16, fx_shape(1, 4));
        }
    uint32_t attn = fx_t(&f, "layers.2.attn", WB_DTYPE_BF16, fx_shape(1, 4));
    uint32_t attn3 = fx_t(&f, "layers.3.attn", WB_DTYPE_BF16, fx_shape(1, 4));
    uint32_t emb = fx_t(&f, "embed", WB_DTYPE_BF16, fx_shape(1, 6));
    uint32_t head = fx_t(&f, "lm_head", WB_DTYPE_BF16, fx_shape(1, 4));
    /* 5 layers over 2 stages: layer * 2 / 5 -> 0,0,0,1,1; experts 0-1 on ep 0, 2-3 on ep 1 */
    CHECK_STR(owners_str(&f, first + 0), "0[0:4]");
    CHECK_STR(owners_str(&f, first + 3), "1[0:4]");
    CHECK_STR(owners_str(&f, first + 2 * 4 + 2), "1[0:4]");
    CHECK_STR(owners_str(&f, first + 3 * 4 + 1), "2[0:4]");
    CHECK_STR(owners_str(&f, attn), "0[0:4] 1[0:4]");
    CHECK_STR(owners_str(&f, attn3), "2[0:4] 3[0:4]");
    CHECK_STR(owners_str(&f, emb), "0[0:3] 1[3:6]");
    CHECK_STR(owners_str(&f, head), "2[0:4] 3[0:4]");
    fx_free(&f);
}

static void test_shipped_layouts_load(void)
{
    const char *files[] = {"configs/clusters/kimi-k2-trainer-256.yaml",
                           "configs/clusters/qwen3-235b-trainer-128.yaml"};
    const char *rfiles[] = {"configs/clusters/kimi-k2-rollout-128.yaml",
                            "configs/clusters/qwen3-235b-rollout-32.yaml"};
    for (int i = 0; i < 2; i++) {
        struct fx f;
        fx_init(&f);
        if (wb_trainer_layout_load(files[i], &f.tl, &f.el) ||
            wb_rollout_layout_load(rfiles[i], &f.rl, &f.el))
            wb_test_fail(__FILE__, __LINE__, "%s", fx_errors(&f.el));
        CHECK_INT(wb_layout_check(&f.tl, &f.rl, &f.el), 0);
        CHECK(f.tl.hw.nic_gbps > 0);
        CHECK(f.rl.hw.nic_gbps > 0);
        fx_free(&f);
    }
    struct fx f;
    fx_init(&f);
    CHECK_INT(wb_trainer_layout_load(files[0], &f.tl, &f.el), 0);
    CHECK_INT(f.tl.world, 256);
    CHECK_INT(f.tl.ndims, 3);
    CHECK_STR(f.tl.dim[2].name, "ep");
    CHECK_INT(f.tl.residence, WB_RESIDE_HOST);
    CHECK_STR(f.tl.hw.name, "h100-cx7-400g");
    CHECK_INT(f.tl.hw.nics_per_gpu, 1);
    CHECK(fabs(f.tl.hw.write_submit_s - 1.35e-6) < 1e-12);
    fx_free(&f);
}

/* ---------------------------------------------------------------- bad layouts */

static void expect_one(struct fx *f, const char *want)
{
    if (f->el.n != 1 || strcmp(f->el.msgs[0], want) != 0)
        wb_test_fail(__FILE__, __LINE__, "errors:\n%s\nexpected:\n%s", fx_errors(&f->el), want);
}

static void test_bad_world_size(void)
{
    struct fx f;
    fx_init(&f);
    const char *p = trainer_file(&f,
                                 "world_size: 8\n"
                                 "mesh: [{name: fsdp, size: 2}, {name: ep, size: 2}]\n"
                                 "placements: [{match: \"*\"}]\n",
                                 0);
    CHECK_INT(wb_layout_check(&f.tl, NULL, &f.el), -WB_E_PLAN);
    char want[512];
    snprintf(want, sizeof(want), "%s: world_size 8 != product of mesh dims fsdp 2 x ep 2 = 4", p);
    expect_one(&f, want);
    fx_free(&f);
}

static void test_bad_gpus_per_node(void)
{
    struct fx f;
    fx_init(&f);
    const char *p = trainer_file(&f,
                                 "world_size: 12\n"
                                 "gpus_per_node: 8\n"
                                 "mesh: [{name: fsdp, size: 12}]\n"
                                 "placements: [{match: \"*\"}]\n",
                                 0);
    CHECK_INT(wb_layout_check(&f.tl, NULL, &f.el), -WB_E_PLAN);
    char want[512];
    snprintf(want, sizeof(want), "%s: world_size 12 is not a multiple of gpus_per_node 8", p);
    expect_one(&f, want);
    fx_free(&f);
}

static void test_bad_experts_split(void)
{
    struct fx f;
    fx_init(&f);
    const char *p = trainer_file(&f,
                                 "world_size: 4\n"
                                 "mesh: [{name: ep, size: 4}]\n"
                                 "placements:\n"
                                 "  - match: \"e.{expert}\"\n"
                                 "    place: {ep: expert}\n",
                                 0);
    for (int e = 0; e < 6; e++) {
        char name[16];
        snprintf(name, sizeof(name), "e.%d", e);
        fx_t(&f, name, WB_DTYPE_BF16, fx_shape(1, 4));
    }
    struct wb_owner *o;
    uint32_t n;
    CHECK_INT(wb_trainer_owners(&f.tl, &f.ti, 0, &o, &n, &f.el), -WB_E_PLAN);
    char want[512];
    snprintf(want, sizeof(want), "%s:4: 6 experts (e.g. e.0) cannot be split evenly over ep = 4",
             p);
    expect_one(&f, want);
    fx_free(&f);
}

static void test_bad_tp_heads(void)
{
    struct fx f;
    fx_init(&f);
    trainer_file(&f,
                 "world_size: 2\nmesh: [{name: fsdp, size: 2}]\n"
                 "placements: [{match: \"*\", place: {fsdp: shard(0)}}]\n",
                 0);
    rollout_file(&f, "replicas: 1\ntp: 3\n", 0);
    uint32_t q = fx_t(&f, "q", WB_DTYPE_BF16, fx_shape(2, 8, 4));
    uint32_t r = fx_r(&f, "q_proj", WB_DTYPE_BF16, fx_shape(2, 8, 4));
    struct wb_mapping *m = fx_map(&f, r, -1, WB_XFORM_COPY, WB_SHARD_TP, 0);
    fx_comp_full(&f, m, q, fx_box(2, 0, 8, 0, 4));
    f.comps[0].heads = 4;
    struct wb_plan_opts o = {.mode = WB_MODE_AUTO, .mem_cap = 0};
    struct wb_plan *p;
    CHECK_INT(wb_plan_build(&f.in, &o, &p, &f.el), -WB_E_PLAN);
    expect_one(&f, "q_proj: tp 3 does not divide the 4 heads of component [0, 8) along dim 0 "
                   "(rule ?:0)");
    fx_free(&f);
}

static void test_bad_tp_replica(void)
{
    struct fx f;
    fx_init(&f);
    const char *p = rollout_file(&f, "replicas: 2\ngpus_per_replica: 4\ntp: 3\nep: 8\n", 0);
    CHECK_INT(wb_layout_check(NULL, &f.rl, &f.el), -WB_E_PLAN);
    char want[2][512];
    snprintf(want[0], sizeof(want[0]), "%s: tp 3 does not divide gpus_per_replica 4", p);
    snprintf(want[1], sizeof(want[1]),
             "%s: ep 8 with gpus_per_replica 4: vLLM's expert parallelism is off (ep 1) or spans "
             "the replica (ep = gpus_per_replica = tp x data-parallel size)",
             p);
    CHECK_INT(f.el.n, 2);
    CHECK_STR(f.el.msgs[0], want[0]);
    CHECK_STR(f.el.msgs[1], want[1]);
    fx_free(&f);
}

/* tp 8, ep 4 on 8 GPUs: vLLM has no such layout (its EP group is tp x dp, the whole replica) */
static void test_ep_not_replica(void)
{
    struct fx f;
    fx_init(&f);
    const char *p = rollout_file(&f, "replicas: 1\ngpus_per_replica: 8\ntp: 8\nep: 4\n", 0);
    CHECK_INT(wb_layout_check(NULL, &f.rl, &f.el), -WB_E_PLAN);
    char want[512];
    snprintf(want, sizeof(want),
             "%s: ep 4 with gpus_per_replica 8: vLLM's expert parallelism is off (ep 1) or spans "
             "the replica (ep = gpus_per_replica = tp x data-parallel size)",
             p);
    CHECK_INT(f.el.n, 1);
    CHECK_STR(f.el.msgs[0], want);
    fx_free(&f);
    /* tp 2 x data-parallel 4 with ep 8, and ep off: both vLLM layouts */
    const char *ok[] = {"replicas: 1\ngpus_per_replica: 8\ntp: 2\nep: 8\n",
                        "replicas: 1\ngpus_per_replica: 8\ntp: 8\nep: 1\n"};
    for (size_t i = 0; i < 2; i++) {
        fx_init(&f);
        rollout_file(&f, ok[i], 0);
        CHECK_INT(wb_layout_check(NULL, &f.rl, &f.el), 0);
        CHECK_INT(f.el.n, 0);
        fx_free(&f);
    }
}

static void test_bad_rollout_world(void)
{
    struct fx f;
    fx_init(&f);
    const char *p =
        rollout_file(&f, "replicas: 2\ngpus_per_replica: 4\nworld_size: 10\n", -WB_E_CONFIG);
    char want[512];
    snprintf(want, sizeof(want), "%s:1:1: world_size 10 != replicas 2 x gpus_per_replica 4 = 8", p);
    expect_one(&f, want);
    fx_free(&f);
}

static void test_bad_unknown_dim(void)
{
    struct fx f;
    fx_init(&f);
    const char *p = trainer_file(&f,
                                 "world_size: 4\n"
                                 "mesh: [{name: fsdp, size: 2}, {name: ep, size: 2}]\n"
                                 "placements:\n"
                                 "  - match: \"*\"\n"
                                 "    place: {tp: shard(0)}\n",
                                 -WB_E_CONFIG);
    char want[512];
    snprintf(want, sizeof(want),
             "%s:5:13: placements[0].place: unknown mesh dim 'tp' (mesh dims: fsdp, ep)", p);
    expect_one(&f, want);
    fx_free(&f);
}

static void test_bad_place_value(void)
{
    struct fx f;
    fx_init(&f);
    const char *p = trainer_file(&f,
                                 "world_size: 2\n"
                                 "mesh: [{name: fsdp, size: 2}]\n"
                                 "placements:\n"
                                 "  - match: \"*\"\n"
                                 "    place: {fsdp: shrd(0)}\n",
                                 -WB_E_CONFIG);
    char want[512];
    snprintf(want, sizeof(want),
             "%s:5:19: placements[0].place.fsdp: expected replicate, shard(N), layer, expert, N "
             "or last, got 'shrd(0)'",
             p);
    expect_one(&f, want);
    fx_free(&f);
}

static void test_bad_layer_capture(void)
{
    struct fx f;
    fx_init(&f);
    const char *p = trainer_file(&f,
                                 "world_size: 2\n"
                                 "mesh: [{name: pp, size: 2}]\n"
                                 "placements:\n"
                                 "  - match: \"model.*\"\n"
                                 "    place: {pp: layer}\n",
                                 -WB_E_CONFIG);
    char want[512];
    snprintf(want, sizeof(want),
             "%s:5:17: placements[0].place.pp: `layer` needs a {layer} capture in match "
             "'model.*'",
             p);
    expect_one(&f, want);
    fx_free(&f);
}

static void test_bad_duplicate_dim(void)
{
    struct fx f;
    fx_init(&f);
    const char *p = trainer_file(&f,
                                 "world_size: 4\n"
                                 "mesh:\n"
                                 "  - {name: fsdp, size: 2}\n"
                                 "  - {name: fsdp, size: 2}\n"
                                 "placements: [{match: \"*\"}]\n",
                                 -WB_E_CONFIG);
    char want[512];
    snprintf(want, sizeof(want), "%s:4:5: mesh[1].name: duplicate mesh dim 'fsdp'", p);
    expect_one(&f, want);
    fx_free(&f);
}

static void test_bad_no_rule(void)
{
    struct fx f;
    fx_init(&f);
    const char *p = trainer_file(&f,
                                 "world_size: 2\n"
                                 "mesh: [{name: fsdp, size: 2}]\n"
                                 "placements: [{match: \"model.*\"}]\n",
                                 0);
    fx_t(&f, "model.norm", WB_DTYPE_BF16, fx_shape(1, 4));
    fx_t(&f, "lm_head.weight", WB_DTYPE_BF16, fx_shape(1, 4));
    struct wb_owner *o;
    uint32_t n;
    CHECK_INT(wb_trainer_owners(&f.tl, &f.ti, 0, &o, &n, &f.el), -WB_E_PLAN);
    char want[512];
    snprintf(want, sizeof(want), "lm_head.weight: no placement rule matches (%s)", p);
    expect_one(&f, want);
    fx_free(&f);
}

static void test_bad_shard_dim(void)
{
    struct fx f;
    fx_init(&f);
    const char *p = trainer_file(&f,
                                 "world_size: 2\n"
                                 "mesh: [{name: fsdp, size: 2}]\n"
                                 "placements:\n"
                                 "  - {match: \"*\", place: {fsdp: shard(1)}}\n",
                                 0);
    fx_t(&f, "norm.weight", WB_DTYPE_BF16, fx_shape(1, 4));
    struct wb_owner *o;
    uint32_t n;
    CHECK_INT(wb_trainer_owners(&f.tl, &f.ti, 0, &o, &n, &f.el), -WB_E_PLAN);
    char want[512];
    snprintf(want, sizeof(want),
             "norm.weight: rule %s:4 shards dim 1 over fsdp but the tensor has 1 dim", p);
    expect_one(&f, want);
    fx_free(&f);
}

static void test_bad_pp_layers(void)
{
    struct fx f;
    fx_init(&f);
    const char *p = trainer_file(&f,
                                 "world_size: 4\n"
                                 "pp_layers: 1\n"
                                 "mesh: [{name: pp, size: 4}]\n"
                                 "placements:\n"
                                 "  - {match: \"layers.{layer}.w\", place: {pp: layer}}\n",
                                 0);
    CHECK_INT(wb_layout_check(&f.tl, NULL, &f.el), -WB_E_PLAN);
    char want[512];
    snprintf(want, sizeof(want), "%s:5: 1 layers cannot fill pp = 4 pipeline stages", p);
    expect_one(&f, want);
    fx_free(&f);
}

static void test_bad_layer_index(void)
{
    struct fx f;
    fx_init(&f);
    const char *p = trainer_file(&f,
                                 "world_size: 2\n"
                                 "pp_layers: 4\n"
                                 "mesh: [{name: pp, size: 2}]\n"
                                 "placements:\n"
                                 "  - {match: \"layers.{layer}.w\", place: {pp: layer}}\n",
                                 0);
    fx_t(&f, "layers.5.w", WB_DTYPE_BF16, fx_shape(1, 4));
    struct wb_owner *o;
    uint32_t n;
    CHECK_INT(wb_trainer_owners(&f.tl, &f.ti, 0, &o, &n, &f.el), -WB_E_PLAN);
    char want[512];
    snprintf(want, sizeof(want), "layers.5.w: layer 5 >= pp_layers 4 (%s)", p);
    expect_one(&f, want);
    fx_free(&f);
}

static void test_bad_missing_keys(void)
{
    struct fx f;
    fx_init(&f);
    const char *p = trainer_file(&f, "world_size: 2\nresidence: disk\n", -WB_E_CONFIG);
    char want[3][512];
    snprintf(want[0], sizeof(want[0]), "%s:2:12: residence: expected one of gpu|host, got 'disk'",
             p);
    snprintf(want[1], sizeof(want[1]), "%s:1:1: mesh: required key missing", p);
    snprintf(want[2], sizeof(want[2]), "%s:1:1: placements: required key missing", p);
    CHECK_INT(f.el.n, 3);
    for (int i = 0; i < 3; i++)
        CHECK_STR(f.el.msgs[i], want[i]);
    fx_free(&f);
}

static void test_bad_hardware(void)
{
    struct fx f;
    fx_init(&f);
    const char *p = trainer_file(&f,
                                 "world_size: 2\n"
                                 "mesh: [{name: fsdp, size: 2}]\n"
                                 "placements: [{match: \"*\"}]\n"
                                 "hardware: {nic_gbps: 0, nvlink_GBps: 394, h2d_GBps: 55,\n"
                                 "           copy_GBps: 2840, quant_GBps: 2020,\n"
                                 "           write_submit: 1us, barrier: 1ms}\n",
                                 -WB_E_CONFIG);
    char want[512];
    snprintf(want, sizeof(want), "%s:4:22: nic_gbps: must be a number > 0, got 0", p);
    expect_one(&f, want);
    fx_free(&f);
}

/* A hardware file's bad values are reported at their own lines (not at the file's first line),
 * every one of them; an absent key whose default is wrong points at the mapping. */
static void test_bad_hardware_file_lines(void)
{
    struct fx f;
    fx_init(&f);
    char *hw = strdup(wb_test_write_file("hw.yaml", "# a hardware model\n"
                                                    "name: test\n"
                                                    "nic_gbps: 400\n"
                                                    "nics_per_gpu: 0\n"
                                                    "nic_efficiency: 1.5\n"
                                                    "nvlink_GBps: 394\n"
                                                    "h2d_GBps: 0\n"
                                                    "copy_GBps: 2840\n"
                                                    "quant_GBps: 2020\n"
                                                    "write_submit: 1us\n"
                                                    "barrier: 1ms\n"));
    trainer_file(&f,
                 "world_size: 2\n"
                 "mesh: [{name: fsdp, size: 2}]\n"
                 "placements: [{match: \"*\"}]\n"
                 "hardware: hw.yaml\n",
                 -WB_E_CONFIG);
    char want[3][512];
    snprintf(want[0], sizeof(want[0]), "%s:4:15: nics_per_gpu: must be from 1 to 64, got 0", hw);
    snprintf(want[1], sizeof(want[1]), "%s:5:17: nic_efficiency: must be in (0, 1], got 1.5", hw);
    snprintf(want[2], sizeof(want[2]), "%s:7:11: h2d_GBps: must be a number > 0, got 0", hw);
    CHECK_INT(f.el.n, 3);
    for (int i = 0; i < 3; i++)
        CHECK_STR(f.el.msgs[i], want[i]);
    free(hw);
    fx_free(&f);
}

/* A hardware file that cannot be read is reported at the layout's `hardware:` line. */
static void test_bad_hardware_missing(void)
{
    struct fx f;
    fx_init(&f);
    const char *p = rollout_file(&f, "replicas: 1\n\nhardware: ../hw/none.yaml\n", -WB_E_CONFIG);
    char want[1024], dir[512];
    snprintf(dir, sizeof(dir), "%s", p);
    *strrchr(dir, '/') = 0;
    snprintf(want, sizeof(want),
             "%s:3:11: hardware: cannot read %s/../hw/none.yaml: No such file or directory", p,
             dir);
    expect_one(&f, want);
    fx_free(&f);
}

static void test_bad_shard_number(void)
{
    struct fx f;
    fx_init(&f);
    const char *p = trainer_file(&f,
                                 "world_size: 4\n"
                                 "mesh: [{name: fsdp, size: 2}, {name: ep, size: 2}]\n"
                                 "placements:\n"
                                 "  - {match: \"a.*\", place: {fsdp: shard(7), ep: shard(x)}}\n"
                                 "  - {match: \"*\", place: {ep: shard(}}\n",
                                 -WB_E_CONFIG);
    char want[3][512];
    snprintf(want[0], sizeof(want[0]),
             "%s:4:34: placements[0].place.fsdp: 'shard(7)': tensors have at most 6 dims, so "
             "shard takes a dim from 0 to 5",
             p);
    snprintf(want[1], sizeof(want[1]),
             "%s:4:48: placements[0].place.ep: 'shard(x)': shard takes the tensor dim it splits, "
             "a number from 0 to 5, as in shard(0)",
             p);
    snprintf(want[2], sizeof(want[2]),
             "%s:5:30: placements[1].place.ep: 'shard(': shard takes the tensor dim it splits, a "
             "number from 0 to 5, as in shard(0)",
             p);
    CHECK_INT(f.el.n, 3);
    for (int i = 0; i < 3; i++)
        CHECK_STR(f.el.msgs[i], want[i]);
    fx_free(&f);
}

static void test_bad_empty_match(void)
{
    struct fx f;
    fx_init(&f);
    const char *p = trainer_file(&f,
                                 "world_size: 2\n"
                                 "mesh: [{name: fsdp, size: 2}]\n"
                                 "placements:\n"
                                 "  - {match: \"\", place: {fsdp: shard(0)}}\n",
                                 -WB_E_CONFIG);
    char want[512];
    snprintf(want, sizeof(want),
             "%s:4:13: placements[0].match: the empty pattern matches no tensor (\"*\" matches "
             "every one)",
             p);
    expect_one(&f, want);
    fx_free(&f);
}

static void test_bad_trainer_world_limit(void)
{
    struct fx f;
    fx_init(&f);
    const char *p = trainer_file(&f,
                                 "world_size: 131072\n"
                                 "mesh: [{name: a, size: 65536}, {name: b, size: 2}]\n"
                                 "placements: [{match: \"*\"}]\n",
                                 -WB_E_CONFIG);
    char want[512];
    snprintf(want, sizeof(want), "%s:1:13: world_size: must be between 1 and 65536, got 131072", p);
    expect_one(&f, want);
    fx_free(&f);
}

/* A directory where a layout file belongs: said so, not libyaml's "input error". */
static void test_bad_layout_directory(void)
{
    struct fx f;
    fx_init(&f);
    CHECK_INT(wb_trainer_layout_load(wb_test_tmpdir(), &f.tl, &f.el), -EISDIR);
    char want[512];
    snprintf(want, sizeof(want), "%s: cannot read: Is a directory", wb_test_tmpdir());
    expect_one(&f, want);
    fx_free(&f);
}

/* Placement problems are all counted: the first 20 kept with their text, the rest counted. */
static void test_placement_problems_counted(void)
{
    struct fx f;
    fx_init(&f);
    const char *p = trainer_file(&f,
                                 "world_size: 2\n"
                                 "mesh: [{name: fsdp, size: 2}]\n"
                                 "placements: [{match: \"layers.*\"}]\n",
                                 0);
    for (int i = 0; i < 30; i++) {
        char name[32];
        snprintf(name, sizeof(name), "w%d", i);
        fx_t(&f, name, WB_DTYPE_BF16, fx_shape(1, 4));
    }
    struct wb_placement_map *pm;
    CHECK_INT(wb_placement_map_build(&f.tl, &f.ti, NULL, &pm, &f.el), -WB_E_PLAN);
    CHECK_INT(wb_errlist_count(&f.el), 30);
    CHECK_INT(f.el.n, 20);
    char want[512];
    snprintf(want, sizeof(want), "w19: no placement rule matches (%s)", p);
    CHECK_STR(f.el.msgs[19], want);
    fx_free(&f);
}

static void test_bad_fp8_tp_blocks(void)
{
    struct fx f;
    fx_init(&f);
    trainer_file(&f,
                 "world_size: 2\nmesh: [{name: fsdp, size: 2}]\n"
                 "placements: [{match: \"*\", place: {fsdp: shard(0)}}]\n",
                 0);
    rollout_file(&f, "replicas: 1\ntp: 4\n", 0);
    uint32_t t = fx_t(&f, "w", WB_DTYPE_BF16, fx_shape(2, 256, 128));
    uint32_t r = fx_r(&f, "w", WB_DTYPE_FP8_E4M3, fx_shape(2, 256, 128));
    uint32_t s = fx_r(&f, "w_scale", WB_DTYPE_FP32, fx_shape(2, 2, 1));
    struct wb_mapping *m = fx_map(&f, r, (int32_t)s, WB_XFORM_FP8_BLOCK, WB_SHARD_TP, 0);
    fx_comp_full(&f, m, t, fx_box(2, 0, 256, 0, 128));
    struct wb_plan_opts o = {.mode = WB_MODE_AUTO, .mem_cap = 0};
    struct wb_plan *p;
    CHECK_INT(wb_plan_build(&f.in, &o, &p, &f.el), -WB_E_PLAN);
    expect_one(&f, "w: tp 4 cuts component [0, 256) along dim 0 into 64-element pieces, not "
                   "whole 128-element FP8 blocks (rule ?:0)");
    fx_free(&f);
}

/* dtype / dtypes: the dtypes the trainers hold (FP32 masters, mixed): first matching rule, then
 * `dtype` for every other floating-point tensor; FP8 and integer tensors keep theirs. */
static void test_dtypes(void)
{
    struct fx f;
    fx_init(&f);
    trainer_file(&f,
                 "world_size: 2\n"
                 "mesh: [{name: fsdp, size: 2}]\n"
                 "placements: [{match: \"*\", place: {fsdp: shard(0)}}]\n"
                 "dtype: fp16\n"
                 "dtypes:\n"
                 "  - {match: \"*norm*\", dtype: fp32}\n"
                 "  - {match: \"layers.{layer}.attn.*\", dtype: bf16}\n",
                 0);
    CHECK_U64(f.tl.ndtypes, 3);
    CHECK_STR(f.tl.dtypes[0].pattern, "*norm*");
    CHECK_INT(f.tl.dtypes[0].line, 6);
    CHECK_INT(f.tl.dtypes[1].dtype, WB_DTYPE_BF16);
    CHECK_STR(f.tl.dtypes[2].pattern, "*");
    CHECK_INT(f.tl.dtypes[2].dtype, WB_DTYPE_FP16);
    CHECK_INT(f.tl.dtypes[2].line, 4);
    uint32_t norm = fx_t(&f, "layers.0.input_norm.weight", WB_DTYPE_BF16, fx_shape(1, 8));
    uint32_t attn = fx_t(&f, "layers.3.attn.q.weight", WB_DTYPE_FP32, fx_shape(2, 4, 8));
    uint32_t mlp = fx_t(&f, "layers.3.mlp.up.weight", WB_DTYPE_BF16, fx_shape(2, 4, 8));
    uint32_t bias = fx_t(&f, "layers.3.mlp.bias", WB_DTYPE_FP32, fx_shape(1, 4));
    uint32_t q8 = fx_t(&f, "layers.3.mlp.down.weight", WB_DTYPE_FP8_E4M3, fx_shape(2, 4, 8));
    uint32_t idx = fx_t(&f, "layers.3.mlp.index", WB_DTYPE_I32, fx_shape(1, 4));
    CHECK_INT(wb_trainer_layout_dtypes(&f.tl, &f.ti), 0);
    CHECK_INT(f.ti.p[norm].dtype, WB_DTYPE_FP32);
    CHECK_INT(f.ti.p[attn].dtype, WB_DTYPE_BF16);
    CHECK_INT(f.ti.p[mlp].dtype, WB_DTYPE_FP16);
    CHECK_INT(f.ti.p[bias].dtype, WB_DTYPE_FP16);
    CHECK_INT(f.ti.p[q8].dtype, WB_DTYPE_FP8_E4M3);
    CHECK_INT(f.ti.p[idx].dtype, WB_DTYPE_I32);
    fx_free(&f);

    /* without either key, the model's dtypes stay */
    fx_init(&f);
    trainer_file(&f,
                 "world_size: 2\n"
                 "mesh: [{name: fsdp, size: 2}]\n"
                 "placements: [{match: \"*\", place: {fsdp: shard(0)}}]\n",
                 0);
    CHECK_U64(f.tl.ndtypes, 0);
    norm = fx_t(&f, "n", WB_DTYPE_BF16, fx_shape(1, 8));
    CHECK_INT(wb_trainer_layout_dtypes(&f.tl, &f.ti), 0);
    CHECK_INT(f.ti.p[norm].dtype, WB_DTYPE_BF16);
    fx_free(&f);
}

static void test_bad_dtypes(void)
{
    static const char head[] = "world_size: 2\n"
                               "mesh: [{name: fsdp, size: 2}]\n"
                               "placements: [{match: \"*\", place: {fsdp: shard(0)}}]\n";
    char yaml[512], want[3][512];
    struct fx f;
    fx_init(&f);
    snprintf(yaml, sizeof(yaml), "%sdtype: fp8_e4m3\n", head);
    const char *p = trainer_file(&f, yaml, -WB_E_CONFIG);
    snprintf(want[0], sizeof(want[0]),
             "%s:4:8: dtype: expected one of model|bf16|fp16|fp32, got 'fp8_e4m3'", p);
    expect_one(&f, want[0]);
    fx_free(&f);

    fx_init(&f);
    snprintf(yaml, sizeof(yaml),
             "%sdtypes:\n"
             "  - {match: \"\", dtype: fp32}\n"
             "  - {match: \"*norm*\", dtype: float32}\n"
             "  - {match: \"*bias\"}\n",
             head);
    p = trainer_file(&f, yaml, -WB_E_CONFIG);
    snprintf(want[0], sizeof(want[0]),
             "%s:5:13: dtypes[0].match: the empty pattern matches no tensor (\"*\" matches every "
             "one)",
             p);
    snprintf(want[1], sizeof(want[1]),
             "%s:6:30: dtype: expected one of bf16|fp16|fp32, got 'float32'", p);
    snprintf(want[2], sizeof(want[2]), "%s:7:5: dtype: required key missing", p);
    CHECK_U64(f.el.n, 3);
    for (size_t i = 0; i < 3 && i < f.el.n; i++)
        CHECK_STR(f.el.msgs[i], want[i]);
    fx_free(&f);

    fx_init(&f);
    snprintf(yaml, sizeof(yaml), "%sdtypes: fp32\n", head);
    p = trainer_file(&f, yaml, -WB_E_CONFIG);
    snprintf(want[0], sizeof(want[0]),
             "%s:4:9: dtypes: expected a list of {match: PATTERN, dtype: fp32}", p);
    expect_one(&f, want[0]);
    fx_free(&f);
}

const struct wb_test wb_tests[] = {
    {"fsdp_chunks", test_fsdp_chunks, 0},
    {"nested_and_replicated", test_nested_and_replicated, 0},
    {"layers_and_experts", test_layers_and_experts, 0},
    {"shipped_layouts_load", test_shipped_layouts_load, 0},
    {"bad_world_size", test_bad_world_size, 0},
    {"bad_gpus_per_node", test_bad_gpus_per_node, 0},
    {"bad_experts_split", test_bad_experts_split, 0},
    {"bad_tp_heads", test_bad_tp_heads, 0},
    {"ep_not_replica", test_ep_not_replica, 0},
    {"bad_tp_replica", test_bad_tp_replica, 0},
    {"bad_rollout_world", test_bad_rollout_world, 0},
    {"bad_unknown_dim", test_bad_unknown_dim, 0},
    {"bad_place_value", test_bad_place_value, 0},
    {"bad_layer_capture", test_bad_layer_capture, 0},
    {"bad_duplicate_dim", test_bad_duplicate_dim, 0},
    {"bad_no_rule", test_bad_no_rule, 0},
    {"bad_shard_dim", test_bad_shard_dim, 0},
    {"bad_pp_layers", test_bad_pp_layers, 0},
    {"bad_layer_index", test_bad_layer_index, 0},
    {"bad_missing_keys", test_bad_missing_keys, 0},
    {"bad_hardware", test_bad_hardware, 0},
    {"bad_hardware_file_lines", test_bad_hardware_file_lines, 0},
    {"bad_hardware_missing", test_bad_hardware_missing, 0},
    {"bad_shard_number", test_bad_shard_number, 0},
    {"bad_empty_match", test_bad_empty_match, 0},
    {"bad_trainer_world_limit", test_bad_trainer_world_limit, 0},
    {"bad_layout_directory", test_bad_layout_directory, 0},
    {"placement_problems_counted", test_placement_problems_counted, 0},
    {"bad_fp8_tp_blocks", test_bad_fp8_tp_blocks, 0},
    {"dtypes", test_dtypes, 0},
    {"bad_dtypes", test_bad_dtypes, 0},
    {0},
};
