/* planner_cli_test.c — wb-plan's diagnostics, exact to the byte: the warning for a BF16
 * rollout. Runs build/bin/wb-plan
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
 * status rc within `limit` seconds; returns its output (stdout and stderr). */
static const char *run_demo(int rc, double limit, const char *const *extra)
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
    uint64_t t0 = wb_now_ns();
    int got = wb_test_capture(run_argv, (void *)argv, out, sizeof(out));
    double s = (double)(wb_now_ns() - t0) * 1e-9;
    if (got != rc)
        wb_test_fail(__FILE__, __LINE__, "exit status %d, expected %d; output:\n%s", got, rc, out);
    if (s > limit)
        wb_test_fail(__FILE__, __LINE__, "took %.2f s, expected at most %.2f s", s, limit);
    return out;
}

#define DEMO(rc, limit, ...) run_demo(rc, limit, (const char *const[]){__VA_ARGS__, NULL})

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
    const char *o = DEMO(0, 5.0, "--config", cfg);
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
    o = DEMO(0, 5.0, "--mem-cap", "4MiB");
    CHECK(strstr(o, "\n  rollout dtype: fp8_e4m3 2.25 MiB in 8 tensors (+ 576 B of block "
                    "scales), bf16 1.01 MiB in 13 tensors\n") != NULL);
    CHECK(strstr(o, "warning") == NULL);
    free(cfg);
}

const struct wb_test wb_tests[] = {
    {"bf16_rollout_warning", test_bf16_rollout_warning, 0},
    {0},
};
