/* planner_test.c — exact routing tables for small hand-worked cases, and the same cases run
 * through the CPU executor simulation in every mode (every rollout byte checked). */
#include "tests/unit/planner_sim.h"

static const char *const FSDP2 = "world_size: 2\n"
                                 "gpus_per_node: 2\n"
                                 "mesh: [{name: fsdp, size: 2}]\n"
                                 "placements:\n"
                                 "  - {match: \"*\", place: {fsdp: shard(0)}}\n";

static char *plan_dump(struct fx *f, enum wb_plan_mode mode)
{
    struct wb_plan_opts o = {.mode = mode, .mem_cap = 0};
    struct wb_plan *p;
    if (wb_plan_build(&f->in, &o, &p, &f->el))
        wb_test_fail(__FILE__, __LINE__, "plan: %s", fx_errors(&f->el));
    char *d = fx_dump(p, &f->in);
    wb_plan_free(p);
    return d;
}

static void run_all_modes(struct fx *f)
{
    enum wb_plan_mode modes[] = {WB_MODE_AUTO, WB_MODE_DIRECT, WB_MODE_GATHER};
    for (int i = 0; i < 3; i++)
        wb_plan_free(sim_plan_check(f, modes[i]));
}

/* 2 trainers FSDP (rows) -> 2 rollouts TP along dim 1 (row-parallel o_proj). */
static void case_fsdp2_tp2(struct fx *f)
{
    fx_init(f);
    CHECK_INT(fx_layouts(f, FSDP2, "replicas: 1\ntp: 2\n"), 0);
    uint32_t t = fx_t(f, "wo", WB_DTYPE_BF16, fx_shape(2, 4, 8));
    uint32_t r = fx_r(f, "o_proj", WB_DTYPE_BF16, fx_shape(2, 4, 8));
    struct wb_mapping *m = fx_map(f, r, -1, WB_XFORM_COPY, WB_SHARD_TP, 1);
    fx_comp_full(f, m, t, fx_box(2, 0, 4, 0, 8));
}

static void test_fsdp2_tp2(void)
{
    struct fx f;
    case_fsdp2_tp2(&f);
    char *d = plan_dump(&f, WB_MODE_AUTO);
    CHECK_STR(d, "rank 0: 1 phases, 1 tasks, 0 ops, 4 writes, 32 bytes, inbox 0\n"
                 "phase 0: 1 tasks\n"
                 "  task o_proj direct tmp 0\n"
                 "    write param wo +0 -> r0 o_proj +0 len 8 tag 1\n"
                 "    write param wo +16 -> r0 o_proj +8 len 8 tag 1\n"
                 "    write param wo +8 -> r1 o_proj +0 len 8 tag 1\n"
                 "    write param wo +24 -> r1 o_proj +8 len 8 tag 1\n"
                 "rank 1: 1 phases, 1 tasks, 0 ops, 4 writes, 32 bytes, inbox 0\n"
                 "phase 0: 1 tasks\n"
                 "  task o_proj direct tmp 0\n"
                 "    write param wo +0 -> r0 o_proj +16 len 8 tag 1\n"
                 "    write param wo +16 -> r0 o_proj +24 len 8 tag 1\n"
                 "    write param wo +8 -> r1 o_proj +16 len 8 tag 1\n"
                 "    write param wo +24 -> r1 o_proj +24 len 8 tag 1\n");
    free(d);
    run_all_modes(&f);
    fx_free(&f);
}

static const char *const FSDP4 = "world_size: 4\n"
                                 "gpus_per_node: 4\n"
                                 "mesh: [{name: fsdp, size: 4}]\n"
                                 "placements:\n"
                                 "  - {match: \"*\", place: {fsdp: shard(0)}}\n";

/* Uneven FSDP shards: 6 rows over 4 ranks are 2, 2, 2, 0 rows (torch.chunk). Rollout TP 2
 * along rows: rank 0 rows 0-2, rank 1 rows 3-5. */
static void case_uneven(struct fx *f)
{
    fx_init(f);
    CHECK_INT(fx_layouts(f, FSDP4, "replicas: 1\ntp: 2\n"), 0);
    uint32_t t = fx_t(f, "w", WB_DTYPE_BF16, fx_shape(2, 6, 4));
    uint32_t r = fx_r(f, "w", WB_DTYPE_BF16, fx_shape(2, 6, 4));
    struct wb_mapping *m = fx_map(f, r, -1, WB_XFORM_COPY, WB_SHARD_TP, 0);
    fx_comp_full(f, m, t, fx_box(2, 0, 6, 0, 4));
}

/* Fused qkv, TP 2 per component: rollout rank g holds q rows [2g, 2g+2), k row g, v row g. */
static void case_qkv(struct fx *f)
{
    fx_init(f);
    CHECK_INT(fx_layouts(f, FSDP2, "replicas: 1\ntp: 2\n"), 0);
    uint32_t q = fx_t(f, "q", WB_DTYPE_BF16, fx_shape(2, 4, 2));
    uint32_t k = fx_t(f, "k", WB_DTYPE_BF16, fx_shape(2, 2, 2));
    uint32_t v = fx_t(f, "v", WB_DTYPE_BF16, fx_shape(2, 2, 2));
    uint32_t r = fx_r(f, "qkv", WB_DTYPE_BF16, fx_shape(2, 8, 2));
    struct wb_mapping *m = fx_map(f, r, -1, WB_XFORM_COPY, WB_SHARD_TP, 0);
    fx_comp_full(f, m, q, fx_box(2, 0, 4, 0, 2));
    fx_comp_full(f, m, k, fx_box(2, 4, 2, 0, 2));
    fx_comp_full(f, m, v, fx_box(2, 6, 2, 0, 2));
}

/* Experts e.0..e.3 split over EP 2 (trainer); stacked [4, 2, 2] rollout tensor split over EP
 * 2: rollout rank g holds experts 2g, 2g+1. */
static void case_experts(struct fx *f)
{
    fx_init(f);
    CHECK_INT(fx_layouts(f,
                         "world_size: 2\ngpus_per_node: 2\nmesh: [{name: ep, size: 2}]\n"
                         "placements:\n  - {match: \"e.{expert}\", place: {ep: expert}}\n",
                         "replicas: 1\nep: 2\n"),
              0);
    uint32_t r = fx_r(f, "w", WB_DTYPE_BF16, fx_shape(3, 4, 2, 2));
    struct wb_mapping *m = fx_map(f, r, -1, WB_XFORM_COPY, WB_SHARD_EP, 0);
    for (uint64_t e = 0; e < 4; e++) {
        char name[16];
        snprintf(name, sizeof(name), "e.%u", (unsigned)e);
        uint32_t t = fx_t(f, name, WB_DTYPE_BF16, fx_shape(2, 2, 2));
        fx_comp_full(f, m, t, fx_box(3, e, 1, 0, 2, 0, 2));
    }
}

/* One BF16 trainer tensor `tname` [rows, cols] -> FP8 rollout tensor `rname` with its block
 * scales `rname`_scale, sharded over the rollout as `shard` along `dim`. */
static void fp8_case(struct fx *f, const char *trainer, const char *rollout, const char *tname,
                     const char *rname, uint64_t rows, uint64_t cols, enum wb_shard_kind shard,
                     uint32_t dim)
{
    fx_init(f);
    CHECK_INT(fx_layouts(f, trainer, rollout), 0);
    char sname[64];
    snprintf(sname, sizeof(sname), "%s_scale", rname);
    uint32_t t = fx_t(f, tname, WB_DTYPE_BF16, fx_shape(2, rows, cols));
    uint32_t r = fx_r(f, rname, WB_DTYPE_FP8_E4M3, fx_shape(2, rows, cols));
    uint32_t s = fx_r(f, sname, WB_DTYPE_FP32, fx_shape(2, (rows + 127) / 128, (cols + 127) / 128));
    struct wb_mapping *m = fx_map(f, r, (int32_t)s, WB_XFORM_FP8_BLOCK, shard, dim);
    fx_comp_full(f, m, t, fx_box(2, 0, rows, 0, cols));
}

/* FP8 with 64-row FSDP shards: every 128-row block straddles two owners -> amax mode. */
static void case_fp8_straddle(struct fx *f)
{
    fp8_case(f, FSDP4, "replicas: 1\n", "w", "w", 256, 128, WB_SHARD_REPLICATE, 0);
}

static const char *const EXPECT_UNEVEN =
    "rank 0: 1 phases, 1 tasks, 0 ops, 1 writes, 16 bytes, inbox 0\n"
    "phase 0: 1 tasks\n"
    "  task w direct tmp 0\n"
    "    write param w +0 -> r0 w +0 len 16 tag 1\n"
    "rank 1: 1 phases, 1 tasks, 0 ops, 2 writes, 16 bytes, inbox 0\n"
    "phase 0: 1 tasks\n"
    "  task w direct tmp 0\n"
    "    write param w +0 -> r0 w +16 len 8 tag 1\n"
    "    write param w +8 -> r1 w +0 len 8 tag 1\n"
    "rank 2: 1 phases, 1 tasks, 0 ops, 1 writes, 16 bytes, inbox 0\n"
    "phase 0: 1 tasks\n"
    "  task w direct tmp 0\n"
    "    write param w +0 -> r1 w +8 len 16 tag 1\n"
    "rank 3: 1 phases, 0 tasks, 0 ops, 0 writes, 0 bytes, inbox 0\n"
    "phase 0: 0 tasks\n";

static const char *const EXPECT_QKV =
    "rank 0: 1 phases, 1 tasks, 0 ops, 3 writes, 16 bytes, inbox 0\n"
    "phase 0: 1 tasks\n"
    "  task qkv direct tmp 0\n"
    "    write param q +0 -> r0 qkv +0 len 8 tag 1\n"
    "    write param k +0 -> r0 qkv +8 len 4 tag 1\n"
    "    write param v +0 -> r0 qkv +12 len 4 tag 1\n"
    "rank 1: 1 phases, 1 tasks, 0 ops, 3 writes, 16 bytes, inbox 0\n"
    "phase 0: 1 tasks\n"
    "  task qkv direct tmp 0\n"
    "    write param q +0 -> r1 qkv +0 len 8 tag 1\n"
    "    write param k +0 -> r1 qkv +8 len 4 tag 1\n"
    "    write param v +0 -> r1 qkv +12 len 4 tag 1\n";

static const char *const EXPECT_EXPERTS =
    "rank 0: 1 phases, 1 tasks, 0 ops, 2 writes, 16 bytes, inbox 0\n"
    "phase 0: 1 tasks\n"
    "  task w direct tmp 0\n"
    "    write param e.0 +0 -> r0 w +0 len 8 tag 1\n"
    "    write param e.1 +0 -> r0 w +8 len 8 tag 1\n"
    "rank 1: 1 phases, 1 tasks, 0 ops, 2 writes, 16 bytes, inbox 0\n"
    "phase 0: 1 tasks\n"
    "  task w direct tmp 0\n"
    "    write param e.2 +0 -> r1 w +0 len 8 tag 1\n"
    "    write param e.3 +0 -> r1 w +8 len 8 tag 1\n";

static const char *const EXPECT_FP8_STRADDLE =
    "rank 0: 1 phases, 1 tasks, 2 ops, 2 writes, 8196 bytes, inbox 16\n"
    "phase 0: 1 tasks\n"
    "  task w amax tmp 8704\n"
    "    amax w region [0:64, 0:128] blocks [0:1, 0:1] grid [0:1, 0:1] amax 0 peers 1 (tag 1 inbox "
    "0 peer-inbox 0)\n"
    "    quant w param w bf16 [64, 128][0:64, 0:128] region [0:64, 0:128] -> tmp 256 scales tmp "
    "8448 grid [0:1, 0:1] amax 0\n"
    "    write tmp 256 -> r0 w +0 len 8192 tag 1\n"
    "    write tmp 8448 -> r0 w_scale +0 len 4 tag 2\n"
    "rank 1: 1 phases, 1 tasks, 2 ops, 1 writes, 8192 bytes, inbox 16\n"
    "phase 0: 1 tasks\n"
    "  task w amax tmp 8704\n"
    "    amax w region [64:128, 0:128] blocks [0:1, 0:1] grid [0:1, 0:1] amax 0 peers 0 (tag 1 "
    "inbox 0 peer-inbox 0)\n"
    "    quant w param w bf16 [64, 128][0:64, 0:128] region [64:128, 0:128] -> tmp 256 scales tmp "
    "8448 grid [0:1, 0:1] amax 0\n"
    "    write tmp 256 -> r0 w +8192 len 8192 tag 1\n"
    "rank 2: 1 phases, 1 tasks, 2 ops, 2 writes, 8196 bytes, inbox 16\n"
    "phase 0: 1 tasks\n"
    "  task w amax tmp 8704\n"
    "    amax w region [128:192, 0:128] blocks [1:2, 0:1] grid [1:2, 0:1] amax 0 peers 3 (tag 2 "
    "inbox 0 peer-inbox 0)\n"
    "    quant w param w bf16 [64, 128][0:64, 0:128] region [128:192, 0:128] -> tmp 256 scales tmp "
    "8448 grid [1:2, 0:1] amax 0\n"
    "    write tmp 256 -> r0 w +16384 len 8192 tag 1\n"
    "    write tmp 8448 -> r0 w_scale +4 len 4 tag 2\n"
    "rank 3: 1 phases, 1 tasks, 2 ops, 1 writes, 8192 bytes, inbox 16\n"
    "phase 0: 1 tasks\n"
    "  task w amax tmp 8704\n"
    "    amax w region [192:256, 0:128] blocks [1:2, 0:1] grid [1:2, 0:1] amax 0 peers 2 (tag 2 "
    "inbox 0 peer-inbox 0)\n"
    "    quant w param w bf16 [64, 128][0:64, 0:128] region [192:256, 0:128] -> tmp 256 scales tmp "
    "8448 grid [1:2, 0:1] amax 0\n"
    "    write tmp 256 -> r0 w +24576 len 8192 tag 1\n";

static const char *const EXPECT_FSDP2_TP2_GATHER =
    "rank 0: 1 phases, 1 tasks, 1 ops, 4 writes, 32 bytes, inbox 0\n"
    "phase 0: 1 tasks\n"
    "  task o_proj gather tmp 256\n"
    "    gather wo seq 0 from param wo bf16 [2, 8] peers 0[0:2, 0:8] 1[2:4, 0:8] -> tmp 0 bf16 [4, "
    "8] in 32\n"
    "    write tmp 0 -> r0 o_proj +0 len 8 tag 1\n"
    "    write tmp 16 -> r0 o_proj +8 len 8 tag 1\n"
    "    write tmp 32 -> r0 o_proj +16 len 8 tag 1\n"
    "    write tmp 48 -> r0 o_proj +24 len 8 tag 1\n"
    "rank 1: 1 phases, 1 tasks, 1 ops, 4 writes, 32 bytes, inbox 0\n"
    "phase 0: 1 tasks\n"
    "  task o_proj gather tmp 256\n"
    "    gather wo seq 0 from param wo bf16 [2, 8] peers 0[0:2, 0:8] 1[2:4, 0:8] -> tmp 0 bf16 [4, "
    "8] in 32\n"
    "    write tmp 8 -> r1 o_proj +0 len 8 tag 1\n"
    "    write tmp 24 -> r1 o_proj +8 len 8 tag 1\n"
    "    write tmp 40 -> r1 o_proj +16 len 8 tag 1\n"
    "    write tmp 56 -> r1 o_proj +24 len 8 tag 1\n";

static const char *const EXPECT_FP8_STRADDLE_HOST =
    "rank 0: 1 phases, 1 tasks, 3 ops, 2 writes, 8196 bytes, inbox 16\n"
    "phase 0: 1 tasks\n"
    "  task w amax tmp 25088\n"
    "    h2d w +0 len 16384 -> tmp 0\n"
    "    amax w region [0:64, 0:128] blocks [0:1, 0:1] grid [0:1, 0:1] amax 16384 peers 1 (tag 1 "
    "inbox 0 peer-inbox 0)\n"
    "    quant w tmp 0 bf16 [64, 128][0:64, 0:128] region [0:64, 0:128] -> tmp 16640 scales tmp "
    "24832 grid [0:1, 0:1] amax 16384\n"
    "    write tmp 16640 -> r0 w +0 len 8192 tag 1\n"
    "    write tmp 24832 -> r0 w_scale +0 len 4 tag 2\n"
    "rank 1: 1 phases, 1 tasks, 3 ops, 1 writes, 8192 bytes, inbox 16\n"
    "phase 0: 1 tasks\n"
    "  task w amax tmp 25088\n"
    "    h2d w +0 len 16384 -> tmp 0\n"
    "    amax w region [64:128, 0:128] blocks [0:1, 0:1] grid [0:1, 0:1] amax 16384 peers 0 (tag 1 "
    "inbox 0 peer-inbox 0)\n"
    "    quant w tmp 0 bf16 [64, 128][0:64, 0:128] region [64:128, 0:128] -> tmp 16640 scales tmp "
    "24832 grid [0:1, 0:1] amax 16384\n"
    "    write tmp 16640 -> r0 w +8192 len 8192 tag 1\n"
    "rank 2: 1 phases, 1 tasks, 3 ops, 2 writes, 8196 bytes, inbox 16\n"
    "phase 0: 1 tasks\n"
    "  task w amax tmp 25088\n"
    "    h2d w +0 len 16384 -> tmp 0\n"
    "    amax w region [128:192, 0:128] blocks [1:2, 0:1] grid [1:2, 0:1] amax 16384 peers 3 (tag "
    "2 inbox 0 peer-inbox 0)\n"
    "    quant w tmp 0 bf16 [64, 128][0:64, 0:128] region [128:192, 0:128] -> tmp 16640 scales tmp "
    "24832 grid [1:2, 0:1] amax 16384\n"
    "    write tmp 16640 -> r0 w +16384 len 8192 tag 1\n"
    "    write tmp 24832 -> r0 w_scale +4 len 4 tag 2\n"
    "rank 3: 1 phases, 1 tasks, 3 ops, 1 writes, 8192 bytes, inbox 16\n"
    "phase 0: 1 tasks\n"
    "  task w amax tmp 25088\n"
    "    h2d w +0 len 16384 -> tmp 0\n"
    "    amax w region [192:256, 0:128] blocks [1:2, 0:1] grid [1:2, 0:1] amax 16384 peers 2 (tag "
    "2 inbox 0 peer-inbox 0)\n"
    "    quant w tmp 0 bf16 [64, 128][0:64, 0:128] region [192:256, 0:128] -> tmp 16640 scales tmp "
    "24832 grid [1:2, 0:1] amax 16384\n"
    "    write tmp 16640 -> r0 w +24576 len 8192 tag 1\n";

/* Exact table, then the same case in every mode through the simulated executor. */
static void check_case(void (*mk)(struct fx *), enum wb_plan_mode mode, bool host,
                       const char *expect)
{
    struct fx f;
    mk(&f);
    if (host)
        f.tl.residence = WB_RESIDE_HOST;
    char *d = plan_dump(&f, mode);
    CHECK_STR(d, expect);
    free(d);
    run_all_modes(&f);
    fx_free(&f);
}

static void test_uneven(void)
{
    check_case(case_uneven, WB_MODE_AUTO, false, EXPECT_UNEVEN);
}
static void test_qkv(void)
{
    check_case(case_qkv, WB_MODE_AUTO, false, EXPECT_QKV);
}
static void test_experts(void)
{
    check_case(case_experts, WB_MODE_AUTO, false, EXPECT_EXPERTS);
}
static void test_fp8_straddle(void)
{
    check_case(case_fp8_straddle, WB_MODE_AUTO, false, EXPECT_FP8_STRADDLE);
}
static void test_fp8_straddle_host(void)
{
    check_case(case_fp8_straddle, WB_MODE_AUTO, true, EXPECT_FP8_STRADDLE_HOST);
}
/* FP8 with 32-row FSDP shards of 128-row blocks: four owners share each block row, so each
 * rank has one AMAX op listing its three fellow owners (one partial, three exchanges), not
 * three ops. Rank 5's table exactly; every mode through the simulated executor. */
static void case_fp8_four_owners(struct fx *f)
{
    fp8_case(f,
             "world_size: 8\ngpus_per_node: 8\nmesh: [{name: fsdp, size: 8}]\n"
             "placements:\n  - {match: \"*\", place: {fsdp: shard(0)}}\n",
             "replicas: 1\n", "w", "w", 256, 128, WB_SHARD_REPLICATE, 0);
}

static void test_fp8_four_owners(void)
{
    struct fx f;
    case_fp8_four_owners(&f);
    char *d = plan_dump(&f, WB_MODE_AUTO);
    const char *r5 = strstr(d, "rank 5:"), *r6 = strstr(d, "rank 6:");
    CHECK(r5 != NULL && r6 != NULL);
    char *t5 = strndup(r5, (size_t)(r6 - r5));
    CHECK_STR(t5, "rank 5: 1 phases, 1 tasks, 2 ops, 1 writes, 4096 bytes, inbox 48\n"
                  "phase 0: 1 tasks\n"
                  "  task w amax tmp 4608\n"
                  "    amax w region [160:192, 0:128] blocks [1:2, 0:1] grid [1:2, 0:1] amax 0 "
                  "peers 4 (tag 7 inbox 0 peer-inbox 0) 6 (tag 10 inbox 16 peer-inbox 16) 7 "
                  "(tag 11 inbox 32 peer-inbox 16)\n"
                  "    quant w param w bf16 [32, 128][0:32, 0:128] region [160:192, 0:128] -> "
                  "tmp 256 scales tmp 4352 grid [1:2, 0:1] amax 0\n"
                  "    write tmp 256 -> r0 w +20480 len 4096 tag 1\n");
    free(t5);
    free(d);
    run_all_modes(&f);
    fx_free(&f);
}

static void test_gather_mode(void)
{
    check_case(case_fsdp2_tp2, WB_MODE_GATHER, false, EXPECT_FSDP2_TP2_GATHER);
}

/* FP8 row-parallel weight (the rollout splits columns) from row shards of whole block rows: each
 * rank quantizes each column slab on its own, straight into a packed buffer, so every
 * destination gets one data write and one scale write and no COPY repacks anything. */
static void case_fp8_cols(struct fx *f)
{
    fp8_case(f, FSDP2, "replicas: 1\ntp: 2\n", "wo", "o_proj", 256, 512, WB_SHARD_TP, 1);
}

static void test_fp8_cols(void)
{
    struct fx f;
    case_fp8_cols(&f);
    char *d = plan_dump(&f, WB_MODE_AUTO);
    CHECK_STR(d, "rank 0: 1 phases, 1 tasks, 2 ops, 4 writes, 65552 bytes, inbox 0\n"
                 "phase 0: 1 tasks\n"
                 "  task o_proj direct tmp 66048\n"
                 "    quant wo param wo bf16 [128, 512][0:128, 0:256] region [0:128, 0:256] -> tmp "
                 "0 scales tmp 32768 grid [0:1, 0:2] amax -\n"
                 "    quant wo param wo bf16 [128, 512][0:128, 256:512] region [0:128, 256:512] -> "
                 "tmp 33024 scales tmp 65792 grid [0:1, 2:4] amax -\n"
                 "    write tmp 0 -> r0 o_proj +0 len 32768 tag 1\n"
                 "    write tmp 32768 -> r0 o_proj_scale +0 len 8 tag 2\n"
                 "    write tmp 33024 -> r1 o_proj +0 len 32768 tag 1\n"
                 "    write tmp 65792 -> r1 o_proj_scale +0 len 8 tag 2\n"
                 "rank 1: 1 phases, 1 tasks, 2 ops, 4 writes, 65552 bytes, inbox 0\n"
                 "phase 0: 1 tasks\n"
                 "  task o_proj direct tmp 66048\n"
                 "    quant wo param wo bf16 [128, 512][0:128, 0:256] region [128:256, 0:256] -> "
                 "tmp 0 scales tmp 32768 grid [1:2, 0:2] amax -\n"
                 "    quant wo param wo bf16 [128, 512][0:128, 256:512] region [128:256, 256:512] "
                 "-> tmp 33024 scales tmp 65792 grid [1:2, 2:4] amax -\n"
                 "    write tmp 0 -> r0 o_proj +32768 len 32768 tag 1\n"
                 "    write tmp 32768 -> r0 o_proj_scale +8 len 8 tag 2\n"
                 "    write tmp 33024 -> r1 o_proj +32768 len 32768 tag 1\n"
                 "    write tmp 65792 -> r1 o_proj_scale +8 len 8 tag 2\n");
    free(d);
    run_all_modes(&f);
    fx_free(&f);
}

/* A vocab-padded embedding (vLLM pads the vocab to a multiple of 64, then splits it): 130
 * rows [130, 4] pad to 192, 48 per rank over tp 4. Rank 2 gets rows 96..129 at the start of
 * its 48-row local tensor, rank 3 only padding: it receives nothing, and the padding rows of
 * rank 2 are never written (the simulation checks they keep their poison). */
static void case_vocab_pad(struct fx *f)
{
    fx_init(f);
    CHECK_INT(fx_layouts(f, FSDP2, "replicas: 1\ntp: 4\n"), 0);
    uint32_t t = fx_t(f, "embed", WB_DTYPE_BF16, fx_shape(2, 130, 4));
    uint32_t r = fx_r(f, "embed", WB_DTYPE_BF16, fx_shape(2, 130, 4));
    struct wb_mapping *m = fx_map(f, r, -1, WB_XFORM_COPY, WB_SHARD_TP, 0);
    m->shard.pad = 64;
    fx_comp_full(f, m, t, fx_box(2, 0, 130, 0, 4));
}

static void test_vocab_pad(void)
{
    struct fx f;
    case_vocab_pad(&f);
    enum wb_plan_mode modes[] = {WB_MODE_AUTO, WB_MODE_DIRECT, WB_MODE_GATHER};
    for (int i = 0; i < 3; i++) {
        struct wb_plan *p = sim_plan_check(&f, modes[i]);
        CHECK_INT(wb_plan_verify(p, &f.in, &f.el), 0);
        for (uint32_t g = 0; g < 3; g++) {
            CHECK_INT(p->recv[g].nlocal, 1);
            CHECK_U64(p->recv[g].local[0].bytes, 48 * 4 * 2); /* padded local tensor */
            CHECK_U64(p->recv[g].local[0].shape.dim[0], 48);
            CHECK_U64(p->recv[g].recv_bytes, (g < 2 ? 48 : 34) * 4 * 2);
        }
        CHECK_INT(p->recv[3].nlocal, 0);
        CHECK_U64(p->recv[3].recv_bytes, 0);
        wb_plan_free(p);
    }
    fx_free(&f);
}

const struct wb_test wb_tests[] = {
    {"fp8_cols", test_fp8_cols, 0},
    {"vocab_pad", test_vocab_pad, 0},
    {"uneven_shards", test_uneven, 0},
    {"fused_qkv_tp", test_qkv, 0},
    {"experts_ep", test_experts, 0},
    {"fp8_straddle_amax", test_fp8_straddle, 0},
    {"fp8_straddle_amax_host", test_fp8_straddle_host, 0},
    {"fp8_four_owners", test_fp8_four_owners, 0},
    {"gather_mode", test_gather_mode, 0},
    {"fsdp2_tp2", test_fsdp2_tp2, 0},
    {0},
};
