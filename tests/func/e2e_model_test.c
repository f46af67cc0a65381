/* e2e_model_test.c — the controller with a real model: the demo job (Qwen3-MoE-shaped, FSDP 2
 * x EP 2 -> TP 2 FP8) is matched and planned, agents receive and decode their routing tables,
 * shard lists and receive lists and reach "ready"; a controller given mismatched model files
 * refuses to start, naming the tensor, and sends nothing. */
#include "controller/controller.h"
#include "tests/func/e2e_proc.h"

static void test_mismatched_model(void)
{
    const char *ti = wb_test_write_file(
        "trainer.yaml", "model.embed_tokens.weight: {dtype: bf16, shape: [1024, 256]}\n");
    const char *ri = wb_test_write_file(
        "rollout.yaml", "model.embed_tokens.weight: {dtype: bf16, shape: [1024, 128]}\n");
    (void)ti;
    (void)ri;
    char job[4096], cwd[512];
    unsigned port = e2e_port(3);
    CHECK(getcwd(cwd, sizeof(cwd)) != NULL);
    snprintf(job, sizeof(job),
             "name: bad\nlisten: tcp://127.0.0.1:%u\ntoken: t\n"
             "model:\n  rules: %s/configs/models/qwen3_moe.yaml\n"
             "  trainer_inventory: trainer.yaml\n  rollout_inventory: rollout.yaml\n"
             "trainer_layout: %s/configs/jobs/demo/trainer.yaml\n"
             "rollout_layout: %s/configs/jobs/demo/rollout.yaml\n",
             port, cwd, cwd, cwd);
    const char *jp = wb_test_write_file("job.yaml", job);
    char *out;
    CHECK_INT(e2e_run(&out, "wb-controller --config %s", jp), 1);
    CHECK_CONTAINS(out, "wb-controller: ");
    CHECK_CONTAINS(out, "model.embed_tokens.weight");
    CHECK(!strstr(out, "listening"));
    free(out);
    /* nothing listens: a client gets no answer */
    CHECK_INT(e2e_run(&out, "WB_TOKEN=t wb-ctl -c tcp://127.0.0.1:%u --timeout 1s status", port),
              1);
    CHECK_CONTAINS(out, "no answer (timed out)");
    free(out);
}

static void test_demo_plan_setup(void)
{
    char url[64], cwd[512], job[600];
    unsigned port = e2e_port(4);
    snprintf(url, sizeof(url), "tcp://127.0.0.1:%u", port);
    CHECK(getcwd(cwd, sizeof(cwd)) != NULL);
    snprintf(job, sizeof(job), "%s/configs/jobs/demo.yaml", cwd);
    static char tok[] = "WB_TOKEN=demo-tok", lvl[] = "WB_LOG=info";
    char *env[] = {tok, lvl, NULL};
    char *cargv[] = {"wb-controller", "--config", job, "--listen", url, NULL};
    pid_t ctl = e2e_spawn("controller.log", env, cargv);
    pid_t ag[6];
    for (int i = 0; i < 6; i++) {
        char log[32], rk[16];
        snprintf(log, sizeof(log), "agent%d.log", i);
        snprintf(rk, sizeof(rk), "%d", i < 4 ? i : i - 4);
        char *argv[] = {"wb-agent", "--role", i < 4 ? "trainer" : "rollout",
                        "--rank",   rk,       "--controller",
                        url,        NULL};
        ag[i] = e2e_spawn(log, env, argv);
    }
    char *out = NULL;
    for (int t = 0; t < 100; t++) {
        free(out);
        e2e_run(&out, "WB_TOKEN=demo-tok wb-ctl -c %s --timeout 5s status", url);
        if (strstr(out, ": ready"))
            break;
        e2e_sleep_ms(100);
    }
    CHECK_CONTAINS(out, "job demo: ready (gen 1), version 0");
    free(out);
    CHECK_INT(e2e_run(&out, "WB_TOKEN=demo-tok wb-ctl -c %s plan", url), 0);
    CHECK_CONTAINS(out, "plan: mode auto, 4 trainer GPUs -> 2 rollout GPUs, memory cap 4.00 MiB");
    free(out);
    char *log = e2e_slurp("agent0.log");
    CHECK_CONTAINS(log, "trainer rank 0: 21 tasks");
    free(log);
    log = e2e_slurp("agent4.log");
    CHECK_CONTAINS(log, "rollout rank 0: ");
    CHECK_CONTAINS(log, " local tensors (");
    free(log);
    CHECK_INT(e2e_run(&out, "WB_TOKEN=demo-tok wb-ctl -c %s shutdown", url), 0);
    free(out);
    CHECK_INT(e2e_wait(ctl, 5000), 0);
    for (int i = 0; i < 6; i++)
        CHECK_INT(e2e_wait(ag[i], 5000), 0);
}

const struct wb_test wb_tests[] = {
    {"mismatched_model", test_mismatched_model, 60},
    {"demo_plan_setup", test_demo_plan_setup, 60},
    {0},
};
