/* e2e_fleet_test.c — rollout replicas as independent units of completion, as real processes on
 * loopback (libfabric tcp, host memory): wb-controller, 4 trainer wb-agents of the demo model
 * and one wb-agent per rollout replica (a replica of one GPU, TP 1, so that each holds every
 * byte of the model). A replica that loses its rollout mid-transfer is dropped and the others
 * complete; the restarted rollout rejoins and is caught up without a controller restart; a
 * replica started while versions run joins, receives the current version and the next. Every
 * byte is checked against the reference (controller/verify.c, as `wb-ctl verify` does). */
#include "controller/controller.h"
#include "tests/func/e2e_proc.h"

#include <inttypes.h>
#include <sys/stat.h>

enum { NTR = 4, MAXRO = 6 };

/* The demo model's bytes at a rollout of TP 1 (less than twice the 1711904 of a TP 2 rank: TP 2
 * replicates some) */
enum { FLEET_RECV = 3416128 };

struct fleet {
    char url[96], job[700], dump[700];
    pid_t ctl, tr[NTR], ro[MAXRO];
};

static const char *TOK = "WB_TOKEN=fleet-tok";

static void fleet_job_tp(struct fleet *f, int replicas, int tp, int min_replicas)
{
    char cwd[512], rl[800], text[3000];
    CHECK(getcwd(cwd, sizeof(cwd)) != NULL);
    snprintf(text, sizeof(text), "replicas: %d\ngpus_per_replica: %d\ntp: %d\ngpus_per_node: %d\n",
             replicas, tp, tp, tp);
    snprintf(rl, sizeof(rl), "%s", wb_test_write_file("rollout.yaml", text));
    snprintf(f->url, sizeof(f->url), "tcp://127.0.0.1:%u", e2e_port(3));
    snprintf(text, sizeof(text),
             "name: fleet\nlisten: %s\nmodel:\n  rules: %s/configs/models/qwen3_moe.yaml\n"
             "  hf_config: %s/configs/jobs/demo/config.json\n"
             "trainer_layout: %s/configs/jobs/demo/trainer.yaml\nrollout_layout: %s\n"
             "mode: auto\nmem_cap: 4MiB\nseed: 7\nprovider: tcp\nheartbeat: 200ms\n"
             "min_replicas: %d\n",
             f->url, cwd, cwd, cwd, rl, min_replicas);
    snprintf(f->job, sizeof(f->job), "%s", wb_test_write_file("job.yaml", text));
    snprintf(f->dump, sizeof(f->dump), "%s/dump", wb_test_tmpdir());
    mkdir(f->dump, 0755);
}

static void fleet_job(struct fleet *f, int replicas, int min_replicas)
{
    fleet_job_tp(f, replicas, 1, min_replicas);
}

static pid_t fleet_agent(struct fleet *f, const char *role, int rank, const char *log)
{
    char path[600], rk[16];
    static char lvl[] = "WB_LOG=info";
    char *env[] = {(char *)TOK, lvl, NULL};
    snprintf(path, sizeof(path), "%s/wb-agent", e2e_bin());
    snprintf(rk, sizeof(rk), "%d", rank);
    /* lo: not whatever interface comes first (a test's veth pair may come and go meanwhile) */
    char *argv[] = {path,   "--role",      (char *)role, "--rank", rk,      "--controller",
                    f->url, "--tx-domain", "lo",         "--dump", f->dump, NULL};
    if (strcmp(role, "trainer") == 0)
        argv[9] = NULL; /* trainers dump nothing */
    return e2e_spawn(log, env, argv);
}

static pid_t fleet_rollout(struct fleet *f, int rank)
{
    char log[32];
    snprintf(log, sizeof(log), "rollout%d.log", rank);
    return fleet_agent(f, "rollout", rank, log);
}

static int fleet_ctl(struct fleet *f, char **out, const char *args)
{
    return e2e_run(out, "%s wb-ctl -c %s %s", TOK, f->url, args);
}

/* The status once it contains needle (fails the test after ms). */
static char *fleet_wait(struct fleet *f, const char *needle, unsigned ms)
{
    char *out = NULL;
    uint64_t end = wb_now_ns() + ms * 1000000ull; /* only ends a hang */
    do {
        free(out);
        fleet_ctl(f, &out, "--timeout 5s status");
        if (strstr(out, needle))
            return out;
        e2e_sleep_ms(100);
    } while (wb_now_ns() < end);
    char *log = e2e_slurp("controller.log");
    wb_test_fail(__FILE__, __LINE__, "status never said \"%s\":\n%s\ncontroller log:\n%s", needle,
                 out, log);
    return NULL;
}

/* The controller and the trainers, and the rollouts of ranks [0, nro). */
static void fleet_start(struct fleet *f, int nro)
{
    char path[600];
    static char lvl[] = "WB_LOG=info";
    char *env[] = {(char *)TOK, lvl, NULL};
    snprintf(path, sizeof(path), "%s/wb-controller", e2e_bin());
    char *argv[] = {path, "--config", f->job, NULL};
    f->ctl = e2e_spawn("controller.log", env, argv);
    for (int t = 0; t < NTR; t++) {
        char log[32];
        snprintf(log, sizeof(log), "trainer%d.log", t);
        f->tr[t] = fleet_agent(f, "trainer", t, log);
    }
    for (int r = 0; r < nro; r++)
        f->ro[r] = fleet_rollout(f, r);
    free(fleet_wait(f, ": ready (gen", 30000));
}

static void fleet_stop(struct fleet *f, int nro)
{
    char *out;
    CHECK_INT(fleet_ctl(f, &out, "shutdown"), 0);
    free(out);
    CHECK_INT(e2e_wait(f->ctl, 20000), 0);
    for (int t = 0; t < NTR; t++)
        CHECK_INT(e2e_wait(f->tr[t], 20000), 0);
    for (int r = 0; r < nro; r++)
        if (f->ro[r]) /* 0: exited before (drained) */
            CHECK_INT(e2e_wait(f->ro[r], 20000), 0);
}

/* Rollout `rank`'s dump of version v against the reference, every byte. */
static void fleet_verify(struct fleet *f, uint32_t rank, uint64_t v)
{
    struct wb_errlist el;
    struct wb_job job;
    struct wb_ref *ref = NULL;
    wb_errlist_init(&el);
    setenv("WB_TOKEN", "fleet-tok", 1);
    CHECK_INT(wb_job_load(f->job, &job, &el), 0);
    CHECK_INT(wb_ref_load(&job, &ref, &el), 0);
    char path[800], msg[512];
    uint64_t bytes = 0;
    snprintf(path, sizeof(path), "%s/rollout%u.v%" PRIu64 ".bin", f->dump, rank, v);
    int rc = wb_ref_check_dump(ref, rank, v, path, msg, sizeof(msg), &bytes);
    if (rc)
        wb_test_fail(__FILE__, __LINE__, "rollout %u, version %" PRIu64 ": %s", rank, v, msg);
    CHECK_U64(bytes, FLEET_RECV);
    wb_ref_free(ref);
    wb_job_free(&job);
    wb_errlist_free(&el);
}

static bool dumped(struct fleet *f, uint32_t rank, uint64_t v)
{
    char path[800];
    struct stat st;
    snprintf(path, sizeof(path), "%s/rollout%u.v%" PRIu64 ".bin", f->dump, rank, v);
    return stat(path, &st) == 0;
}

static void transfer_ok(struct fleet *f, uint64_t v, char **out)
{
    char args[80];
    snprintf(args, sizeof(args), "--timeout 60s transfer --version %" PRIu64, v);
    if (fleet_ctl(f, out, args))
        wb_test_fail(__FILE__, __LINE__, "transfer %" PRIu64 " failed:\n%s", v, *out);
}

/* (a) 3 replicas, min_replicas 2: rollout 1 is stopped before transfer 2 starts (so that the
 * transfer cannot finish without it) and killed once it is in flight: replicas 0 and 2
 * complete, every byte verified, "complete on 2 of 3 replicas". (b) The killed rank,
 * restarted, rejoins without a controller restart and is caught up with version 2 (verified);
 * version 3 lands on all three. */
static void test_drop_and_rejoin(void)
{
    struct fleet f = {0};
    char *out;
    fleet_job(&f, 3, 2);
    fleet_start(&f, 3);
    transfer_ok(&f, 1, &out);
    CHECK(!strstr(out, "replicas")); /* every replica took it: no fleet line */
    free(out);
    for (uint32_t r = 0; r < 3; r++)
        fleet_verify(&f, r, 1);

    kill(f.ro[1], SIGSTOP);
    char cmd[512];
    snprintf(cmd, sizeof(cmd), "%s/wb-ctl", e2e_bin());
    char *cargv[] = {cmd,   "-c",       f.url,       "--token", "fleet-tok", "--timeout",
                     "60s", "transfer", "--version", "2",       NULL};
    pid_t client = e2e_spawn("client.log", NULL, cargv);
    free(fleet_wait(&f, "in flight: 2", 10000));
    uint64_t t_kill = wb_now_ns();
    kill(f.ro[1], SIGKILL);
    CHECK_INT(e2e_wait(client, 60000), 0);
    printf("    kill -9 to the version complete on the other replicas: %.0f ms\n",
           (double)(wb_now_ns() - t_kill) / 1e6);
    CHECK_INT(e2e_wait(f.ro[1], 5000), 128 + SIGKILL);
    out = e2e_slurp("client.log");
    CHECK_CONTAINS(out, "transfer 2: complete in ");
    CHECK_CONTAINS(out,
                   "transfer 2: complete on 2 of 3 replicas (replica 1 dropped: rollout rank 1 "
                   "died (its connection closed))\n");
    CHECK_CONTAINS(out, "rollout 0: 3416128 bytes received\nrollout 1: 0 bytes received\n"
                        "rollout 2: 3416128 bytes received\n");
    free(out);
    fleet_verify(&f, 0, 2);
    fleet_verify(&f, 2, 2);
    CHECK(!dumped(&f, 1, 2));
    out = fleet_wait(&f, "version 2, in flight: none", 5000);
    CHECK_CONTAINS(out, "waiting for rollout rank 1 (dead)\nreplicas: 2 of 3 hold version 2 "
                        "(min_replicas 2); replica 1 dropped: rollout rank 1 died (its "
                        "connection closed)\n");
    CHECK_CONTAINS(out, "rollout      1 dead");
    free(out);
    out = e2e_slurp("controller.log");
    CHECK_CONTAINS(out, "transfer 2: replica 1 dropped: rollout rank 1 died (its connection "
                        "closed); 2 replicas go on");
    free(out);

    /* (b) the restarted rank: set up alone, caught up with version 2, then a member */
    f.ro[1] = fleet_rollout(&f, 1);
    out = fleet_wait(&f, "replicas: 3 of 3 hold version 2 (min_replicas 2); replica 1 joined in ",
                     30000);
    free(out);
    fleet_verify(&f, 1, 2);
    out = e2e_slurp("controller.log");
    CHECK_CONTAINS(out, "replica 1 joined in ");
    CHECK_CONTAINS(out, "transfer 2 started: a catch-up of 1 joining replica");
    CHECK(!strstr(out, "state ready -> waiting")); /* the others were not set up again */
    char *line = strstr(out, "replica 1 joined in ");
    printf("    %.*s\n", (int)strcspn(line, "\n"), line);
    free(out);
    CHECK_INT(waitpid(f.ctl, NULL, WNOHANG), 0); /* the same controller all along */
    transfer_ok(&f, 3, &out);
    CHECK(!strstr(out, "replicas"));
    free(out);
    for (uint32_t r = 0; r < 3; r++)
        fleet_verify(&f, r, 3);
    fleet_stop(&f, 3);
}

/* (c) capacity 4, min_replicas 3: the job runs on 3 replicas; a 4th started while versions run
 * joins at a version boundary, receives the current version and the next, verified. (d) One
 * is drained (wb-ctl drain) and the others go on. */
static void test_join_while_running(void)
{
    struct fleet f = {0};
    char *out;
    fleet_job(&f, 4, 3);
    fleet_start(&f, 3);
    out =
        fleet_wait(&f, "replicas: 3 of 4 hold version 0 (min_replicas 3); replica 3 absent", 5000);
    CHECK_CONTAINS(out, "waiting for rollout rank 3 (not registered)\n");
    free(out);
    transfer_ok(&f, 1, &out);
    CHECK_CONTAINS(out, "transfer 1: complete on 3 of 4 replicas (replica 3 absent)\n");
    free(out);
    f.ro[3] = fleet_rollout(&f, 3);
    for (uint64_t v = 2; v <= 3; v++) { /* versions go on while it registers and joins */
        transfer_ok(&f, v, &out);
        free(out);
    }
    out = fleet_wait(&f, "replicas: 4 of 4 hold version 3", 30000);
    CHECK_CONTAINS(out, "replica 3 joined in ");
    free(out);
    transfer_ok(&f, 4, &out);
    CHECK(!strstr(out, "replicas"));
    free(out);
    uint64_t first = 0; /* the version it was caught up with (or first took part in) */
    for (uint64_t v = 1; v <= 3 && !first; v++)
        if (dumped(&f, 3, v))
            first = v;
    CHECK(first >= 1);              /* 1: it joined before version 2 started (that waited for it) */
    fleet_verify(&f, 3, first);     /* the current version, caught up with */
    fleet_verify(&f, 3, first + 1); /* and the next, as a member */
    fleet_verify(&f, 3, 4);
    for (uint32_t r = 0; r < 3; r++)
        fleet_verify(&f, r, 4);
    out = e2e_slurp("controller.log");
    char *line = strstr(out, "replica 3 joined in ");
    CHECK(line != NULL);
    printf("    %.*s (first version held: %" PRIu64 ")\n", (int)strcspn(line, "\n"), line, first);
    free(out);

    /* (d) drain: replica 0 leaves on purpose, its rollout exits; the others go on. Draining a
     * second one would leave 2 whole replicas, fewer than min_replicas: refused, nothing done. */
    CHECK_INT(fleet_ctl(&f, &out, "drain --replica 0"), 0);
    CHECK_STR(out, "replica 0 drained: its rollouts were told to exit\n");
    free(out);
    CHECK_INT(e2e_wait(f.ro[0], 20000), 0);
    f.ro[0] = 0;
    CHECK_INT(fleet_ctl(&f, &out, "drain --replica 1"), 1);
    CHECK_STR(out, "wb-ctl: drain: replica 1: 2 whole replicas would be left, fewer than "
                   "min_replicas (3)\n");
    free(out);
    CHECK_INT(fleet_ctl(&f, &out, "drain --replica 7"), 1);
    CHECK_STR(out, "wb-ctl: drain: replica 7 is outside the job's 4 replicas\n");
    free(out);
    out = fleet_wait(&f, "replicas: 3 of 4 hold version 4 (min_replicas 3); replica 0 drained",
                     10000);
    CHECK_CONTAINS(out, "rollout      0 left");
    free(out);
    transfer_ok(&f, 5, &out);
    CHECK_CONTAINS(out, "transfer 5: complete on 3 of 4 replicas (replica 0 drained)\n");
    free(out);
    for (uint32_t r = 1; r < 4; r++)
        fleet_verify(&f, r, 5);
    CHECK(!dumped(&f, 0, 5));
    fleet_stop(&f, 4);
}

/* Replicas of two ranks (TP 2): one rank of replica 1 is killed mid-transfer; replica 0
 * completes, the surviving rank of replica 1 is told to abort once the transfer ended and says
 * torn (the attempt opened its windows); restarted, the dead rank and its survivor are caught up
 * together, and both hold the version. */
static void test_survivor_torn(void)
{
    struct fleet f = {0};
    char *out;
    fleet_job_tp(&f, 2, 2, 1);
    fleet_start(&f, 4);
    transfer_ok(&f, 1, &out);
    free(out);
    kill(f.ro[3], SIGSTOP);
    char cmd[512];
    snprintf(cmd, sizeof(cmd), "%s/wb-ctl", e2e_bin());
    char *cargv[] = {cmd,   "-c",       f.url,       "--token", "fleet-tok", "--timeout",
                     "60s", "transfer", "--version", "2",       NULL};
    pid_t client = e2e_spawn("client.log", NULL, cargv);
    free(fleet_wait(&f, "in flight: 2", 10000));
    kill(f.ro[3], SIGKILL);
    CHECK_INT(e2e_wait(client, 60000), 0);
    CHECK_INT(e2e_wait(f.ro[3], 5000), 128 + SIGKILL);
    out = e2e_slurp("client.log");
    CHECK_CONTAINS(out,
                   "transfer 2: complete on 1 of 2 replicas (replica 1 dropped: rollout rank 3 "
                   "died (its connection closed))\n");
    free(out);
    for (uint32_t r = 0; r < 2; r++) {
        char path[800], msg[512];
        struct wb_errlist el;
        struct wb_job job;
        struct wb_ref *ref = NULL;
        uint64_t bytes = 0;
        wb_errlist_init(&el);
        CHECK_INT(wb_job_load(f.job, &job, &el), 0);
        CHECK_INT(wb_ref_load(&job, &ref, &el), 0);
        snprintf(path, sizeof(path), "%s/rollout%u.v2.bin", f.dump, r);
        CHECK_INT(wb_ref_check_dump(ref, r, 2, path, msg, sizeof(msg), &bytes), 0);
        CHECK_U64(bytes, 1711904); /* a TP 2 rank of the demo */
        wb_ref_free(ref);
        wb_job_free(&job);
        wb_errlist_free(&el);
    }
    CHECK(!dumped(&f, 2, 2));
    out = fleet_wait(&f, "     torn        no", 10000); /* its ABORT came, the heartbeat says */
    CHECK_CONTAINS(out, "replicas: 1 of 2 hold version 2 (min_replicas 1); replica 1 dropped: "
                        "rollout rank 3 died (its connection closed)\n");
    CHECK_CONTAINS(out, "rollout      2 alive");
    free(out);
    f.ro[3] = fleet_rollout(&f, 3);
    out = fleet_wait(&f, "replicas: 2 of 2 hold version 2 (min_replicas 1); replica 1 joined in ",
                     30000);
    CHECK(!strstr(out, "torn"));
    free(out);
    for (uint32_t r = 2; r < 4; r++) {
        CHECK(dumped(&f, r, 2));
    }
    fleet_stop(&f, 4);
}

/* A rollout stopped (not killed) before a transfer: silent, suspect, it stalls the transfer
 * until its timeout; then its replica is dropped and the others complete. Continued, it is
 * told the attempt ended, and is caught up with the version it missed. */
static void test_stalled_dropped(void)
{
    struct fleet f = {0};
    char *out;
    fleet_job(&f, 3, 2);
    fleet_start(&f, 3);
    transfer_ok(&f, 1, &out);
    free(out);
    kill(f.ro[1], SIGSTOP);
    CHECK_INT(fleet_ctl(&f, &out, "--timeout 4s transfer --version 2"), 0);
    CHECK_CONTAINS(out,
                   "transfer 2: complete on 2 of 3 replicas (replica 1 dropped: rollout rank 1 "
                   "stalled (silent for ");
    CHECK_CONTAINS(out, " s at the timeout))\n");
    free(out);
    fleet_verify(&f, 0, 2);
    fleet_verify(&f, 2, 2);
    kill(f.ro[1], SIGCONT);
    out = fleet_wait(&f, "replicas: 3 of 3 hold version 2 (min_replicas 2)\n", 30000);
    CHECK(!strstr(out, "torn"));
    free(out);
    fleet_verify(&f, 1, 2);
    out = e2e_slurp("controller.log");
    CHECK_CONTAINS(out, "transfer 2 started: a catch-up of 1 joining replica");
    CHECK_CONTAINS(out, "replica 1 caught up with version 2 in ");
    free(out);
    transfer_ok(&f, 3, &out);
    CHECK(!strstr(out, "replicas"));
    free(out);
    for (uint32_t r = 0; r < 3; r++)
        fleet_verify(&f, r, 3);
    fleet_stop(&f, 3);
}

/* min_replicas beyond the fleet is refused where the job file sets it. */
static void test_min_replicas_config(void)
{
    struct fleet f = {0};
    struct wb_errlist el;
    struct wb_job job;
    struct wb_controller *c = NULL;
    fleet_job(&f, 2, 3);
    wb_errlist_init(&el);
    setenv("WB_TOKEN", "fleet-tok", 1);
    CHECK_INT(wb_job_load(f.job, &job, &el), 0);
    CHECK_INT(wb_controller_create(&job, &c, &el), -WB_E_CONFIG);
    CHECK_INT((int)el.n, 1);
    char want[900];
    snprintf(want, sizeof(want),
             "%s:13:15: min_replicas: 3 is more than the rollout layout's 2 replicas", f.job);
    CHECK_STR(el.msgs[0], want);
    wb_job_free(&job);
    wb_errlist_free(&el);
}

const struct wb_test wb_tests[] = {
    {"drop_and_rejoin", test_drop_and_rejoin, 180},
    {"join_and_drain", test_join_while_running, 180},
    {"survivor_torn", test_survivor_torn, 180},
    {"stalled_dropped", test_stalled_dropped, 180},
    {"min_replicas_config", test_min_replicas_config, 30},
    {0},
};
