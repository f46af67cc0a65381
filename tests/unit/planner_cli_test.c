/* planner_cli_test.c — wb-plan's diagnostics, exact to the byte: bad files and options found
 * before anything is planned (each within a second), problem counts that count every problem
 * and say how many were not listed, and the warning for a BF16 rollout. Runs build/bin/wb-plan
 * (or $WB_BIN/wb-plan) from the repository root. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/common.h"
#include "tests/wbtest.h"

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

static char out[65536];

/* Runs wb-plan with the demo model and layouts plus `extra` (NULL-terminated), expects exit
 * status rc; returns its output (stdout and stderr). What ran is told by the output alone —
 * a check made "first" leaves no planning output — not by how long it took. */
static const char *run_demo(int rc, const char *const *extra)
{
    const char *argv[32] = {plan_bin(),
                            "--model",
                            "configs/models/qwen3_moe.yaml",
                            "--config",
                            "configs/jobs/demo/config.json",
                            "--trainer",
                            "configs/jobs/demo/trainer.yaml",
                            "--rollout",
                            "configs/jobs/demo/rollout.yaml"};
    size_t n = 9;
    for (size_t i = 0; extra[i]; i++) {
        /* a later --config/--trainer/--rollout replaces the demo's */
        bool replaced = false;
        for (size_t k = 1; k + 1 < 9; k += 2)
            if (strcmp(argv[k], extra[i]) == 0 && extra[i + 1]) {
                argv[k + 1] = extra[++i];
                replaced = true;
                break;
            }
        if (!replaced)
            argv[n++] = extra[i];
    }
    argv[n] = NULL;
    int got = wb_test_capture(run_argv, (void *)argv, out, sizeof(out));
    if (got != rc)
        wb_test_fail(__FILE__, __LINE__, "exit status %d, expected %d; output:\n%s", got, rc, out);
    return out;
}

#define DEMO(rc, ...) run_demo(rc, (const char *const[]){__VA_ARGS__, NULL})

/* ---------------------------------------------------------------- files, before planning */

static void test_outputs_checked_first(void)
{
    char missing[600];
    snprintf(missing, sizeof(missing), "%s/no/such/dir/plan.json", wb_test_tmpdir());
    const char *o = DEMO(1, "--json", missing, "--svg", wb_test_tmpdir());
    char want[2048];
    snprintf(want, sizeof(want),
             "wb-plan: files: 2 problems\n"
             "  --json %s: cannot write: No such file or directory\n"
             "  --svg %s: is a directory, not a file\n",
             missing, wb_test_tmpdir());
    CHECK_STR(o, want);
}

static void test_output_same_as_output(void)
{
    char *p = strdup(wb_test_write_file("plan.out", "keep me\n"));
    const char *o = DEMO(1, "--json", p, "--svg", p);
    char want[2048];
    snprintf(want, sizeof(want),
             "wb-plan: files: 1 problem\n"
             "  --svg %s: is the same file as --json %s, which it would overwrite\n",
             p, p);
    CHECK_STR(o, want);
    free(p);
}

static void test_output_same_as_input(void)
{
    /* through another name: a symbolic link to the demo's config.json */
    char link[600], cwd[400], target[800];
    CHECK(getcwd(cwd, sizeof(cwd)) != NULL);
    snprintf(link, sizeof(link), "%s/plan.json", wb_test_tmpdir());
    snprintf(target, sizeof(target), "%s/configs/jobs/demo/config.json", cwd);
    CHECK_INT(symlink(target, link), 0);
    const char *o = DEMO(1, "--json", link);
    char want[2048];
    snprintf(want, sizeof(want),
             "wb-plan: files: 1 problem\n"
             "  --json %s: is the same file as --config configs/jobs/demo/config.json, which it "
             "would overwrite\n",
             link);
    CHECK_STR(o, want);
}

static void test_new_output_left_alone(void)
{
    /* checking that an output can be created leaves no file behind when the plan fails */
    char json[600];
    snprintf(json, sizeof(json), "%s/new.json", wb_test_tmpdir());
    DEMO(1, "--json", json, "--rollout", "configs/jobs/demo/trainer.yaml");
    CHECK(access(json, F_OK) != 0);
}

static void test_inputs_checked_first(void)
{
    char missing[600];
    snprintf(missing, sizeof(missing), "%s/none.yaml", wb_test_tmpdir());
    const char *o = DEMO(1, "--config", "configs/hf", "--trainer", missing);
    char want[2048];
    snprintf(want, sizeof(want),
             "wb-plan: files: 2 problems\n"
             "  --config configs/hf: is a directory, not a file\n"
             "  --trainer %s: cannot read: No such file or directory\n",
             missing);
    CHECK_STR(o, want);
}

static void test_tables_without_json(void)
{
    CHECK_STR(DEMO(2, "--tables"),
              "wb-plan: --tables goes with --json FILE (it adds the tables to it)\n");
}

static void test_dump_rank_checked_first(void)
{
    CHECK_STR(DEMO(1, "--dump", "4"), "wb-plan: --dump 4: the trainer has 4 ranks (0 to 3)\n");
}

static void test_max_problems_value(void)
{
    CHECK_STR(DEMO(2, "--max-problems", "-1"),
              "wb-plan: --max-problems: expected a number (0: all), got '-1'\n");
}

static void test_layouts_swapped(void)
{
    CHECK_STR(DEMO(1, "--trainer", "configs/jobs/demo/rollout.yaml", "--rollout",
                   "configs/jobs/demo/trainer.yaml"),
              "wb-plan: model and layouts: 2 problems\n"
              "  configs/jobs/demo/rollout.yaml: a rollout layout (it has replicas:), given as the "
              "trainer layout (world_size:, mesh:, placements:)\n"
              "  configs/jobs/demo/trainer.yaml: a trainer layout (it has mesh:), given as the "
              "rollout layout (replicas:, tp:, ep:)\n");
}

static void test_config_not_json_once(void)
{
    /* both inventories come from the one config.json: its problem is reported once */
    const char *o = DEMO(1, "--config", "configs/jobs/demo/trainer.yaml");
    CHECK_STR(o, "wb-plan: model and layouts: 1 problem\n"
                 "  configs/jobs/demo/trainer.yaml:1:1: '[' or '{' expected near '#'\n");
}

static void test_too_many_rollout_gpus(void)
{
    char *r = strdup(wb_test_write_file("r.yaml", "replicas: 8193\ngpus_per_replica: 8\n"));
    const char *o = DEMO(1, "--rollout", r);
    char want[1024];
    snprintf(want, sizeof(want),
             "wb-plan: model and layouts: 1 problem\n"
             "  %s:1:1: replicas 8193 x gpus_per_replica 8 = 65544 rollout GPUs; at most 65536 "
             "are supported\n",
             r);
    CHECK_STR(o, want);
    free(r);
}

/* ---------------------------------------------------------------- counts */

/* Qwen3-235B on tp 3: 190 mappings cannot be split (2 per layer, embedding and head). All are
 * counted; the first 20 are listed, and the rest are said to be left out. */
static void test_problem_count(void)
{
    char *t = strdup(wb_test_write_file("t.yaml", "world_size: 8\n"
                                                  "mesh: [{name: dp, size: 8}]\n"
                                                  "placements: [{match: \"*\", place: {dp: "
                                                  "shard(0)}}]\n"));
    char *r = strdup(wb_test_write_file("r.yaml", "replicas: 1\ntp: 3\n"));
    const char *o =
        DEMO(1, "--config", "configs/hf/Qwen3-235B-A22B-FP8.json", "--trainer", t, "--rollout", r);
    const char *rule = "(rule configs/models/qwen3_moe.yaml:";
    char want[8192];
    size_t n = (size_t)snprintf(
        want, sizeof(want),
        "wb-plan: planning: 190 problems\n"
        "  model.embed_tokens.weight: tp 3 does not divide the 151936 rows along dim 0 padded to "
        "a multiple of 64 (151936 real) %s219)\n"
        "  lm_head.weight: tp 3 does not divide the 151936 rows along dim 0 padded to a multiple "
        "of 64 (151936 real) %s223)\n",
        rule, rule);
    for (int l = 0; l < 9; l++)
        n += (size_t)snprintf(want + n, sizeof(want) - n,
                              "  model.layers.%d.self_attn.qkv_proj.weight: tp 3 does not divide "
                              "the 64 heads of component [0, 8192) along dim 0 %s181)\n"
                              "  model.layers.%d.self_attn.o_proj.weight: tp 3 does not divide "
                              "component [0, 8192) (8192 elements) along dim 1 %s189)\n",
                              l, rule, l, rule);
    snprintf(want + n, sizeof(want) - n, "  ... and 170 more, not listed\n");
    CHECK_STR(o, want);
    free(t);
    free(r);
}

/* ---------------------------------------------------------------- dtype */

static void test_bf16_rollout_warning(void)
{
    /* the demo's config.json without its quantization_config: a BF16 rollout */
    char *cfg = strdup(wb_test_write_file(
        "config.json", "{\"architectures\": [\"Qwen3MoeForCausalLM\"], \"model_type\": "
                       "\"qwen3_moe\", \"decoder_sparse_step\": 1, \"head_dim\": 128,\n"
                       "\"hidden_size\": 256, \"intermediate_size\": 512, \"mlp_only_layers\": "
                       "[], \"moe_intermediate_size\": 256, \"num_attention_heads\": 4,\n"
                       "\"num_experts\": 4, \"num_experts_per_tok\": 2, \"num_hidden_layers\": 2, "
                       "\"num_key_value_heads\": 2, \"tie_word_embeddings\": false,\n"
                       "\"torch_dtype\": \"bfloat16\", \"vocab_size\": 1024}\n"));
    const char *o = DEMO(0, "--config", cfg);
    char want[1024];
    snprintf(want, sizeof(want),
             "wb-plan: warning: rollout weights are bf16, not FP8: each replica receives 5.51 MiB, "
             "about twice an FP8 rollout's bytes: the rollout's config.json has no "
             "quantization_config (--config %s)\n",
             cfg);
    CHECK(strstr(o, want) != NULL);
    CHECK(strstr(o, "\n  rollout dtype: bf16 5.51 MiB in 21 tensors\n"
                    "  warning: rollout weights are bf16, not FP8: each replica receives 5.51 "
                    "MiB, about twice an FP8 rollout's bytes: the rollout's config.json has no "
                    "quantization_config\n") != NULL);
    /* the FP8 demo: the dtypes, no warning */
    o = DEMO(0, "--mem-cap", "4MiB");
    CHECK(strstr(o, "\n  rollout dtype: fp8_e4m3 2.25 MiB in 8 tensors (+ 576 B of block "
                    "scales), bf16 1.01 MiB in 13 tensors\n") != NULL);
    CHECK(strstr(o, "warning") == NULL);
    free(cfg);
}

/* A cap below the largest task (the embedding gathered whole is 512 KiB): refused with the
 * bytes needed and the tensor, exit status 1, no plan printed; at those bytes it plans. */
static void test_cap_below_largest_task(void)
{
    const char *o = DEMO(1, "--mode", "gather", "--mem-cap", "256KiB");
    CHECK_STR(o, "wb-plan: planning: 1 problem\n"
                 "  mem_cap 256.00 KiB is below the 512.00 KiB the largest task needs "
                 "(model.embed_tokens.weight, gather on trainer rank 0; 16 task(s) over the cap): "
                 "set mem_cap to at least 524288 bytes\n");
    o = DEMO(0, "--mode", "gather", "--mem-cap", "524288");
    CHECK(strstr(o, "memory cap 512.00 KiB\n") != NULL);
    CHECK(strstr(o, "\n  largest task: 512.00 KiB of temporary memory\n") != NULL);
}

/* The estimate names the resource that bounds it, and --hw asks what-ifs of the hardware
 * model without editing the layouts (Qwen3-235B, 128 trainer GPUs -> 32 rollout GPUs, BF16:
 * each rollout GPU receives 54.91 GiB over 4 x 100 Gb/s NICs at 97 % of line rate). */
static void test_estimate_bound_and_hw(void)
{
#define BIG                                                                                        \
    "--config", "configs/hf/Qwen3-235B-A22B.json", "--trainer",                                    \
        "configs/clusters/qwen3-235b-trainer-128.yaml", "--rollout",                               \
        "configs/clusters/qwen3-235b-rollout-32.yaml", "--estimate"
    const char *o = DEMO(0, BIG);
    CHECK(strstr(o, "(lower bound 1.214 s, the busiest resource at full speed: rollout rank 0's "
                    "NIC ingress (replica 0, tp rank 0): 54.91 GiB at 48.5 GB/s)\n") != NULL);
    /* 200 Gb/s NICs on both sides: the same NIC, at twice the rate */
    o = DEMO(0, BIG, "--hw", "nic_gbps=200");
    CHECK(strstr(o, "(lower bound 0.607 s, the busiest resource at full speed: rollout rank 0's "
                    "NIC ingress (replica 0, tp rank 0): 54.91 GiB at 97.1 GB/s)\n") != NULL);
    /* faster rollout NICs only: the trainers' egress is the bound now */
    o = DEMO(0, BIG, "--hw", "rollout.nic_gbps=800");
    CHECK(strstr(o, "the busiest resource at full speed: trainer rank 8's NIC egress: 13.73 GiB "
                    "at 48.5 GB/s)\n") != NULL);
    o = DEMO(0, BIG, "--hw", "nic_gbps=800", "--hw", "trainer.h2d_GBps=10");
    CHECK(strstr(o, "the busiest resource at full speed: trainer rank 72's host-to-device "
                    "copies)\n") != NULL);
    /* in the JSON too */
    char json[600];
    snprintf(json, sizeof(json), "%s/est.json", wb_test_tmpdir());
    DEMO(0, BIG, "--hw", "nic_gbps=200", "--json", json);
    static char j[1 << 20]; /* the summary and the estimate come first */
    FILE *jf = fopen(json, "r");
    CHECK(jf != NULL);
    size_t jn = fread(j, 1, sizeof(j) - 1, jf);
    j[jn] = 0;
    fclose(jf);
    CHECK(strstr(j, ",\n\"estimate\":{\"total_s\":0.609") != NULL);
    CHECK(strstr(j, "\"lower_bound_s\":0.607205,\"bound\":\"rollout rank 0's NIC ingress (replica "
                    "0, tp rank 0): 54.91 GiB at 97.1 GB/s\"") != NULL);
    CHECK(strstr(j, "\"trainer\":{\"ranks\":128,\"end_s\":[") != NULL);
    /* bad what-ifs: named, nothing planned */
    o = DEMO(1, BIG, "--hw", "nic_gbs=200");
    CHECK_STR(o, "wb-plan: --hw nic_gbs=200: unknown hardware key \"nic_gbs\" (one of nic_gbps "
                 "nics_per_gpu nic_efficiency nvlink_GBps h2d_GBps copy_GBps quant_GBps "
                 "kernel_launch write_submit barrier collective_launch)\n");
    o = DEMO(1, BIG, "--hw", "rollout.nic_efficiency=2");
    CHECK_STR(o, "wb-plan: --hw rollout.nic_efficiency=2: nic_efficiency: must be in (0, 1], got "
                 "\"2\"\n");
    o = DEMO(1, BIG, "--hw", "barrier=soon");
    CHECK_STR(o, "wb-plan: --hw barrier=soon: barrier: expected a duration (2us, 1ms), got "
                 "\"soon\"\n");
    o = DEMO(2, BIG, "--hw", "nic_gbps");
    CHECK_STR(o, "wb-plan: --hw: expected [trainer.|rollout.]KEY=VALUE, got 'nic_gbps'\n");
#undef BIG
}

/* --changed F: a delta update's bytes and time against a full update's, on the shipped FP8
 * Qwen3-235B 128 -> 32 (both simulated in the same run); bad fractions refused before
 * anything is read, a layout without a hardware model named. */
static void test_delta_estimate(void)
{
    const char *o = DEMO(0, "--config", "configs/hf/Qwen3-235B-A22B-FP8.json", "--trainer",
                         "configs/clusters/qwen3-235b-trainer-128.yaml", "--rollout",
                         "configs/clusters/qwen3-235b-rollout-32.yaml", "--changed", "0.002");
    CHECK(strstr(o, "delta update (--changed 0.002: that fraction of FP8/BF16 bytes changed; a "
                    "record per write: 32-byte header, 5 bytes per changed byte):\n"
                    "  sent 9.11 GiB of a full update's 884.91 GiB (1.03 %)\n"
                    "  writes: 1266688 of 2502976 as deltas; in full: 1188160 not FP8/BF16 (block "
                    "scales), 48128 over half their size as a delta, 0 not cheaper as a delta\n"
                    "  estimate: 0.102 s against 0.614 s for a full update (0.166x); the busiest "
                    "rollout applies 0.126 ms of records\n") != NULL);
    o = DEMO(2, "--changed", "0");
    CHECK_STR(o, "wb-plan: --changed: expected a fraction of the bytes, 0 < F <= 1 (0.002 for 0.2 "
                 "%), got '0'\n");
    o = DEMO(2, "--changed", "1.5x");
    CHECK_STR(o, "wb-plan: --changed: expected a fraction of the bytes, 0 < F <= 1 (0.002 for 0.2 "
                 "%), got '1.5x'\n");
    o = DEMO(1, "--changed", "0.01");
    CHECK(strstr(o, "wb-plan: delta estimate: 1 problem\n  configs/jobs/demo/trainer.yaml: no "
                    "hardware model (a `hardware:` key) for the estimate\n") != NULL);
}

const struct wb_test wb_tests[] = {
    {"outputs_checked_first", test_outputs_checked_first, 0},
    {"output_same_as_output", test_output_same_as_output, 0},
    {"output_same_as_input", test_output_same_as_input, 0},
    {"new_output_left_alone", test_new_output_left_alone, 0},
    {"inputs_checked_first", test_inputs_checked_first, 0},
    {"tables_without_json", test_tables_without_json, 0},
    {"dump_rank_checked_first", test_dump_rank_checked_first, 0},
    {"max_problems_value", test_max_problems_value, 0},
    {"layouts_swapped", test_layouts_swapped, 0},
    {"config_not_json_once", test_config_not_json_once, 0},
    {"too_many_rollout_gpus", test_too_many_rollout_gpus, 0},
    {"problem_count", test_problem_count, 120},
    {"bf16_rollout_warning", test_bf16_rollout_warning, 0},
    {"cap_below_largest_task", test_cap_below_largest_task, 0},
    {"estimate_bound_and_hw", test_estimate_bound_and_hw, 60},
    {"delta_estimate", test_delta_estimate, 60},
    {0},
};
