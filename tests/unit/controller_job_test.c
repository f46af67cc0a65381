/* controller_job_test.c — the job file: defaults, every key, and the exact errors of bad ones. */
#include "controller/controller.h"
#include "controller/ctl.h"
#include "tests/wbtest.h"

#include <errno.h>
#include <stdlib.h>
#include <unistd.h>

static void test_job_load(void)
{
    const char *p = wb_test_write_file("job.yaml", "name: j1\n"
                                                   "token: abc\n"
                                                   "trainers: 4\n"
                                                   "rollouts: 2\n"
                                                   "mode: gather\n"
                                                   "mem_cap: 64KiB\n"
                                                   "dead_after: 2s\n");
    struct wb_job j;
    struct wb_errlist el;
    wb_errlist_init(&el);
    CHECK_INT(wb_job_load(p, &j, &el), 0);
    CHECK_STR(j.name, "j1");
    CHECK_STR(j.listen, "tcp://127.0.0.1:7420");
    CHECK_STR(j.token, "abc");
    CHECK_INT(j.mode, 3);
    CHECK_U64(j.mem_cap, 65536);
    CHECK_U64(j.dead_ns, 2000000000ull);
    CHECK_U64(j.heartbeat_ns, 200000000ull);
    CHECK_U64(j.trainers, 4);
    CHECK_INT(j.relay, WB_RELAY_OFF); /* today's behaviour unless the job asks */
    CHECK_U64(j.relay_fanout, 2);
    CHECK_U64(j.relay_roots, 1);
    CHECK_STR(j.provider, "tcp");
    wb_job_free(&j);
    wb_errlist_free(&el);
}

/* Liveness: silent 1.5 s an agent is suspect, 10 s dead (defaults); each stage must be longer
 * than a heartbeat's gap, and the error names the value's line and column. */
static void test_job_liveness(void)
{
    const char *p = wb_test_write_file("live.yaml", "token: t\ntrainers: 1\nrollouts: 1\n");
    struct wb_job j;
    struct wb_errlist el;
    char want[1200];
    wb_errlist_init(&el);
    CHECK_INT(wb_job_load(p, &j, &el), 0);
    CHECK_U64(j.heartbeat_ns, 200000000ull);
    CHECK_U64(j.suspect_ns, 1500000000ull);
    CHECK_U64(j.dead_ns, 10000000000ull);
    wb_job_free(&j);
    wb_errlist_free(&el);

    /* suspect_after at or past dead_after: no suspect stage, and no error */
    p = wb_test_write_file("live.yaml", "token: t\ntrainers: 1\nrollouts: 1\nheartbeat: 100ms\n"
                                        "suspect_after: 2s\ndead_after: 1s\n");
    wb_errlist_init(&el);
    CHECK_INT(wb_job_load(p, &j, &el), 0);
    CHECK_U64(j.suspect_ns, 2000000000ull);
    CHECK_U64(j.dead_ns, 1000000000ull);
    wb_job_free(&j);
    wb_errlist_free(&el);

    p = wb_test_write_file("live.yaml", "token: t\ntrainers: 1\nrollouts: 1\nheartbeat: 500ms\n"
                                        "suspect_after: 400ms\ndead_after: 500ms\n");
    wb_errlist_init(&el);
    CHECK_INT(wb_job_load(p, &j, &el), -WB_E_CONFIG);
    CHECK_INT(el.n, 2);
    snprintf(want, sizeof(want), "%s:6:13: dead_after: must be longer than heartbeat", p);
    CHECK_STR(el.msgs[0], want);
    snprintf(want, sizeof(want), "%s:5:16: suspect_after: must be longer than heartbeat", p);
    CHECK_STR(el.msgs[1], want);
    wb_errlist_free(&el);
}

/* model.vars reaches the rules and both generated inventories (controller/plan.c and the
 * reference load them the same way). */
static void test_job_model_vars(void)
{
    char cwd[256], text[4096];
    CHECK(getcwd(cwd, sizeof(cwd)) != NULL);
    const char *fmt_job = "token: t\n"
                          "model:\n"
                          "  rules: %s/configs/models/deepseek_v3.yaml\n"
                          "  hf_config: %s/configs/hf/DeepSeek-V3.json\n"
                          "  vars: \"%s\"\n"
                          "trainer_layout: %s/configs/jobs/demo/trainer.yaml\n"
                          "rollout_layout: %s/configs/jobs/demo/rollout.yaml\n";
    snprintf(text, sizeof(text), fmt_job, cwd, cwd, "mtp=1", cwd, cwd);
    const char *p = wb_test_write_file("vars.yaml", text);
    struct wb_job j;
    struct wb_errlist el;
    wb_errlist_init(&el);
    CHECK_INT(wb_job_load(p, &j, &el), 0);
    CHECK_STR(j.model.vars, "mtp=1");
    struct wb_ref *ref = NULL;
    CHECK_INT(wb_ref_load(&j, &ref, &el), 0);
    wb_ref_free(ref);
    wb_job_free(&j);
    snprintf(text, sizeof(text), fmt_job, cwd, cwd, "mtp=on", cwd, cwd);
    p = wb_test_write_file("vars.yaml", text);
    CHECK_INT(wb_job_load(p, &j, &el), 0);
    CHECK_INT(wb_ref_load(&j, &ref, &el), -WB_E_CONFIG);
    CHECK_INT(el.n, 1);
    CHECK_STR(el.msgs[0], "vars 'mtp=on': expected NAME=INTEGER[,NAME=INTEGER...]");
    wb_job_free(&j);
    wb_errlist_free(&el);
}

static void test_job_errors(void)
{
    struct wb_job j;
    struct wb_errlist el;
    char want[512];

    const char *p = wb_test_write_file("bad.yaml", "token: abc\n"
                                                   "trainers: 1\n"
                                                   "rollouts: 1\n"
                                                   "mode: fast\n"
                                                   "heartbeats: 1s\n");
    wb_errlist_init(&el);
    CHECK_INT(wb_job_load(p, &j, &el), -WB_E_CONFIG);
    CHECK_INT(el.n, 2);
    snprintf(want, sizeof(want),
             "%s:4:7: mode: expected one of auto|direct|amax|gather, got 'fast'", p);
    CHECK_STR(el.msgs[0], want);
    snprintf(want, sizeof(want), "%s:5:1: heartbeats: unknown key", p);
    CHECK_STR(el.msgs[1], want);
    wb_errlist_free(&el);

    p = wb_test_write_file("half.yaml", "token: abc\n"
                                        "model:\n"
                                        "  rules: r.yaml\n");
    wb_errlist_init(&el);
    CHECK_INT(wb_job_load(p, &j, &el), -WB_E_CONFIG);
    CHECK_INT(el.n, 4);
    snprintf(want, sizeof(want),
             "%s: model.trainer_inventory: required key missing (a model needs all of "
             "model.rules, model.trainer_inventory, model.rollout_inventory, trainer_layout and "
             "rollout_layout)",
             p);
    CHECK_STR(el.msgs[0], want);
    wb_errlist_free(&el);

    p = wb_test_write_file("notoken.yaml", "trainers: 1\nrollouts: 1\n");
    unsetenv("WB_TOKEN");
    wb_errlist_init(&el);
    /* loading needs no token (wb-ctl verify, a dry run send nothing); serving does */
    CHECK_INT(wb_job_load(p, &j, &el), 0);
    CHECK_STR(j.token, "");
    struct wb_controller *c = NULL;
    CHECK_INT(wb_controller_create(&j, &c, &el), -WB_E_CONFIG);
    CHECK(c == NULL);
    CHECK_INT(el.n, 1);
    CHECK_STR(el.msgs[0],
              "job job: token: no cluster token (set token: in the job file or $WB_TOKEN)");
    wb_job_free(&j);
    wb_errlist_free(&el);
    setenv("WB_TOKEN", "from-env", 1);
    wb_errlist_init(&el);
    CHECK_INT(wb_job_load(p, &j, &el), 0);
    CHECK_STR(j.token, "from-env");
    wb_job_free(&j);
    wb_errlist_free(&el);

    /* amax is a mode the planner chooses, not one a job asks for (route's one list of names) */
    p = wb_test_write_file("amax.yaml", "token: t\ntrainers: 1\nrollouts: 1\nmode: amax\n");
    wb_errlist_init(&el);
    CHECK_INT(wb_job_load(p, &j, &el), -WB_E_CONFIG);
    CHECK_INT(el.n, 1);
    snprintf(want, sizeof(want),
             "%s:4:7: mode: amax is what the planner chooses where FP8 blocks straddle owners, "
             "not a request: ask for direct (it falls back to amax there)",
             p);
    CHECK_STR(el.msgs[0], want);
    wb_errlist_free(&el);

    /* traces kept per agent: at least one version; the default is 8 */
    p = wb_test_write_file("keep.yaml", "token: t\ntrainers: 1\nrollouts: 1\ntrace: /tmp\n"
                                        "trace_keep: 0\n");
    wb_errlist_init(&el);
    CHECK_INT(wb_job_load(p, &j, &el), -WB_E_CONFIG);
    CHECK_INT(el.n, 1);
    snprintf(want, sizeof(want), "%s:5:13: trace_keep: 0 versions (1 to 1000000)", p);
    CHECK_STR(el.msgs[0], want);
    wb_errlist_free(&el);
    p = wb_test_write_file("keep8.yaml", "token: t\ntrainers: 1\nrollouts: 1\ntrace: t\n");
    wb_errlist_init(&el);
    CHECK_INT(wb_job_load(p, &j, &el), 0);
    CHECK_U64(j.trace_keep, 8);
    snprintf(want, sizeof(want), "%s/t", wb_test_tmpdir()); /* relative to the job file */
    CHECK_STR(j.trace, want);
    wb_job_free(&j);
    wb_errlist_free(&el);

    p = wb_test_write_file("nocount.yaml", "token: t\ntrainers: 2\n");
    wb_errlist_init(&el);
    CHECK_INT(wb_job_load(p, &j, &el), -WB_E_CONFIG);
    snprintf(want, sizeof(want), "%s: trainers, rollouts: a job without a model needs both counts",
             p);
    CHECK_STR(el.msgs[0], want);
    wb_errlist_free(&el);
}

/* A job that moves BF16 to its rollout: the plan summary (wb-ctl plan) says the rollout dtype
 * and warns, and the controller logs the warning when it plans. */
static void test_job_bf16_warning(void)
{
    char cwd[256], text[4096];
    CHECK(getcwd(cwd, sizeof(cwd)) != NULL);
    /* the demo's config.json without its quantization_config */
    char *cfg = strdup(wb_test_write_file(
        "config.json", "{\"architectures\": [\"Qwen3MoeForCausalLM\"], \"model_type\": "
                       "\"qwen3_moe\", \"decoder_sparse_step\": 1, \"head_dim\": 128,\n"
                       "\"hidden_size\": 256, \"intermediate_size\": 512, \"mlp_only_layers\": "
                       "[], \"moe_intermediate_size\": 256, \"num_attention_heads\": 4,\n"
                       "\"num_experts\": 4, \"num_experts_per_tok\": 2, \"num_hidden_layers\": 2, "
                       "\"num_key_value_heads\": 2, \"tie_word_embeddings\": false,\n"
                       "\"torch_dtype\": \"bfloat16\", \"vocab_size\": 1024}\n"));
    snprintf(text, sizeof(text),
             "name: bf16job\n"
             "token: t\n"
             "model:\n"
             "  rules: %s/configs/models/qwen3_moe.yaml\n"
             "  hf_config: %s\n"
             "trainer_layout: %s/configs/jobs/demo/trainer.yaml\n"
             "rollout_layout: %s/configs/jobs/demo/rollout.yaml\n",
             cwd, cfg, cwd, cwd);
    const char *p = wb_test_write_file("job.yaml", text);
    struct wb_job j;
    struct wb_errlist el;
    wb_errlist_init(&el);
    CHECK_INT(wb_job_load(p, &j, &el), 0);
    setenv("WB_LOG", "warn", 1);
    struct wb_test_stderr cap;
    wb_test_stderr_begin(&cap);
    struct ctl_plan plan;
    struct wb_controller_opts o = {0};
    int rc = ctl_plan_build(&j, &o, &plan, &el);
    char err[4096];
    wb_test_stderr_end(&cap, err, sizeof(err));
    CHECK_INT(rc, 0);
    const char *warn = "rollout weights are bf16, not FP8: each replica receives 5.51 MiB, about "
                       "twice an FP8 rollout's bytes: the rollout's config.json has no "
                       "quantization_config";
    char want[2048];
    snprintf(want, sizeof(want), "wb warn controller: job bf16job: %s (model.hf_config %s)\n", warn,
             cfg);
    CHECK_STR(err, want);
    snprintf(want, sizeof(want), "\n  rollout dtype: bf16 5.51 MiB in 21 tensors\n  warning: %s\n",
             warn);
    CHECK(strstr(plan.summary, want) != NULL);
    ctl_plan_free(&plan);
    wb_job_free(&j);
    wb_errlist_free(&el);
    free(cfg);
}

/* A job whose mem_cap is below its largest task (the demo's embedding gathered whole: 512 KiB)
 * is refused when it is planned — the controller does not start — with the bytes needed, not
 * left to agents that would never become ready; at those bytes it plans with that cap. */
static void test_job_cap_below_largest_task(void)
{
    char cwd[256], text[4096];
    CHECK(getcwd(cwd, sizeof(cwd)) != NULL);
    for (int fits = 0; fits < 2; fits++) {
        snprintf(text, sizeof(text),
                 "name: capjob\n"
                 "token: t\n"
                 "mode: gather\n"
                 "mem_cap: %s\n"
                 "model:\n"
                 "  rules: %s/configs/models/qwen3_moe.yaml\n"
                 "  hf_config: %s/configs/jobs/demo/config.json\n"
                 "trainer_layout: %s/configs/jobs/demo/trainer.yaml\n"
                 "rollout_layout: %s/configs/jobs/demo/rollout.yaml\n",
                 fits ? "512KiB" : "256KiB", cwd, cwd, cwd, cwd);
        const char *p = wb_test_write_file("job.yaml", text);
        struct wb_job j;
        struct wb_errlist el;
        wb_errlist_init(&el);
        CHECK_INT(wb_job_load(p, &j, &el), 0);
        struct ctl_plan plan;
        struct wb_controller_opts o = {0};
        int rc = ctl_plan_build(&j, &o, &plan, &el);
        if (fits) {
            CHECK_INT(rc, 0);
            CHECK_U64(plan.mem_cap, 512 << 10);
            CHECK_U64(plan.largest_task, 512 << 10);
            ctl_plan_free(&plan);
        } else {
            CHECK_INT(rc, -WB_E_PLAN);
            CHECK_INT(el.n, 1);
            CHECK_STR(el.msgs[0], "mem_cap 256.00 KiB is below the 512.00 KiB the largest task "
                                  "needs (model.embed_tokens.weight, gather on trainer rank 0; 16 "
                                  "task(s) over the cap): set mem_cap to at least 524288 bytes");
        }
        wb_job_free(&j);
        wb_errlist_free(&el);
    }
}

const struct wb_test wb_tests[] = {
    {"job_load", test_job_load, 0},
    {"job_liveness", test_job_liveness, 0},
    {"job_model_vars", test_job_model_vars, 0},
    {"job_errors", test_job_errors, 0},
    {"job_bf16_warning", test_job_bf16_warning, 0},
    {"job_cap_below_largest_task", test_job_cap_below_largest_task, 0},
    {0},
};
