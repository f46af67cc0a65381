/* e2e_xfer_test.c — the whole job with real data: wb-controller, 4 trainer agents and 2
 * rollout agents (real processes) move the demo model (Qwen3-MoE-shaped, BF16 FSDP 2 x EP 2 ->
 * FP8 TP 2) over libfabric's tcp and shm providers, in auto and gather mode, three versions;
 * after each transfer every byte every rollout holds is compared with the reference computed
 * here, independently of the planner and the executor (controller/verify.c: synthetic source,
 * fusion, quant's CPU reference, the rollout boxes). Also: the memory cap (peak <= cap, and a
 * cap that forces tasks to queue), a trainer killed mid-transfer (the failure names it, the
 * rollouts keep their version, the retry after a restart succeeds), and the same job with every
 * process in its own network namespace. Timing never decides a result. */
#include "controller/controller.h"
#include "tests/func/e2e_proc.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <inttypes.h>
#include <jansson.h>
#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>
#include <sys/stat.h>

enum { NTR = 4, NRO = 2 };

struct cluster {
    char url[96], job[600], dump[600];
    const char *provider, *domain;
    const char *tx_extra; /* more transport settings for the agents, or NULL */
    pid_t ctl, ag[NTR + NRO];
    const char *netns_fmt; /* "wbx%d-%d": per-process namespace names, or NULL */
    int id;
    uint64_t cap;
    const char *hf_config; /* config.json of the model, or NULL: the demo's */
    const char *job_extra; /* more lines for the job file, or NULL */
    const char *corrupt;   /* rollout 1 flips a byte of this tensor once it lands, or NULL */
    uint64_t recv[NRO];    /* bytes each rollout receives per transfer; 0: the demo's */
};

/* The demo plan's bytes per rollout. */
enum { DEMO_RECV = 1711904 };

static uint64_t recv_bytes(const struct cluster *c, int r)
{
    return c->recv[r] ? c->recv[r] : DEMO_RECV;
}

static const char *TOK = "WB_TOKEN=xfer-tok";

/* The demo job with absolute paths, the provider, mode and cap of the case; with host_resident
 * the trainers' parameters live in host memory (FSDP CPU offload: every task starts with H2D). */
static void write_job(struct cluster *c, const char *mode, const char *cap, bool host_resident)
{
    char cwd[512], layout[700];
    CHECK(getcwd(cwd, sizeof(cwd)) != NULL);
    snprintf(layout, sizeof(layout), "%s/configs/jobs/demo/trainer.yaml", cwd);
    if (host_resident) {
        char *text = NULL, *dup;
        CHECK_INT(e2e_run(&text, "cat %s", layout), 0);
        CHECK((dup = malloc(strlen(text) + 32)) != NULL);
        sprintf(dup, "%sresidence: host\n", text);
        snprintf(layout, sizeof(layout), "%s", wb_test_write_file("trainer.yaml", dup));
        free(dup);
        free(text);
    }
    snprintf(c->job, sizeof(c->job), "%s/job.yaml", wb_test_tmpdir());
    FILE *f = fopen(c->job, "w");
    CHECK(f != NULL);
    char hf[700];
    if (c->hf_config)
        snprintf(hf, sizeof(hf), "%s", c->hf_config);
    else
        snprintf(hf, sizeof(hf), "%s/configs/jobs/demo/config.json", cwd);
    fprintf(f,
            "name: xfer\n"
            "model:\n"
            "  rules: %s/configs/models/qwen3_moe.yaml\n"
            "  hf_config: %s\n"
            "trainer_layout: %s\n"
            "rollout_layout: %s/configs/jobs/demo/rollout.yaml\n"
            "mode: %s\nmem_cap: %s\nseed: 7\nprovider: %s\n"
            "heartbeat: 200ms\ndead_after: 1500ms\n%s",
            cwd, hf, layout, cwd, mode, cap, c->provider, c->job_extra ? c->job_extra : "");
    fclose(f);
    snprintf(c->dump, sizeof(c->dump), "%s/dump", wb_test_tmpdir());
    mkdir(c->dump, 0755);
    CHECK_INT(wb_parse_size(cap, &c->cap), 0);
}

/* Runs wb-ctl (inside the controller's namespace when there is one). */
static int ctl(struct cluster *c, char **out, const char *args)
{
    if (c->netns_fmt) {
        char ns[64];
        snprintf(ns, sizeof(ns), c->netns_fmt, c->id, 0);
        return e2e_run(out, "%s ip netns exec %s %s/wb-ctl -c %s %s", TOK, ns, e2e_bin(), c->url,
                       args);
    }
    return e2e_run(out, "%s wb-ctl -c %s %s", TOK, c->url, args);
}

static pid_t spawn_agent(struct cluster *c, int i, const char *extra)
{
    char log[32], rk[16], path[600], ns[64];
    static char lvl[] = "WB_LOG=info";
    char *env[] = {(char *)TOK, lvl, NULL};
    snprintf(log, sizeof(log), "agent%d.log", i);
    snprintf(rk, sizeof(rk), "%d", i < NTR ? i : i - NTR);
    snprintf(path, sizeof(path), "%s/wb-agent", e2e_bin());
    snprintf(ns, sizeof(ns), c->netns_fmt ? c->netns_fmt : "-", c->id, i + 1);
    char *argv[28];
    int n = 0;
    if (c->netns_fmt) {
        argv[n++] = "/usr/bin/env";
        argv[n++] = "ip";
        argv[n++] = "netns";
        argv[n++] = "exec";
        argv[n++] = ns;
    }
    argv[n++] = path;
    argv[n++] = "--role";
    argv[n++] = i < NTR ? "trainer" : "rollout";
    argv[n++] = "--rank";
    argv[n++] = rk;
    argv[n++] = "--controller";
    argv[n++] = c->url;
    if (c->domain) {
        argv[n++] = "--tx-domain";
        argv[n++] = (char *)c->domain;
    }
    if (c->tx_extra) {
        argv[n++] = "--tx-extra";
        argv[n++] = (char *)c->tx_extra;
    }
    if (i >= NTR) {
        argv[n++] = "--dump";
        argv[n++] = c->dump;
    }
    if (c->corrupt && i == NTR + 1) {
        argv[n++] = "--corrupt";
        argv[n++] = (char *)c->corrupt;
    }
    char trace[700];
    if (i < NTR) {
        snprintf(trace, sizeof(trace), "%s/trainer%d.trace.json", wb_test_tmpdir(), i);
        argv[n++] = "--trace";
        argv[n++] = trace;
    }
    if (extra && i < NTR) {
        argv[n++] = "--pace";
        argv[n++] = (char *)extra;
    }
    argv[n] = NULL;
    return e2e_spawn(log, env, argv);
}

static void start(struct cluster *c, const char *pace)
{
    char path[600], ns[64];
    static char lvl[] = "WB_LOG=info";
    char *env[] = {(char *)TOK, lvl, NULL};
    snprintf(path, sizeof(path), "%s/wb-controller", e2e_bin());
    snprintf(ns, sizeof(ns), c->netns_fmt ? c->netns_fmt : "-", c->id, 0);
    char *nsargv[] = {"/usr/bin/env", "ip",   "netns",    "exec", ns,  path,
                      "--config",     c->job, "--listen", c->url, NULL};
    char *argv[] = {path, "--config", c->job, "--listen", c->url, NULL};
    c->ctl = e2e_spawn("controller.log", env, c->netns_fmt ? nsargv : argv);
    for (int i = 0; i < NTR + NRO; i++)
        c->ag[i] = spawn_agent(c, i, pace);
    char *out = NULL;
    for (int t = 0; t < 150; t++) {
        free(out);
        if (waitpid(c->ctl, NULL, WNOHANG) == c->ctl) { /* it could not listen, say */
            char *log = e2e_slurp("controller.log");
            wb_test_fail(__FILE__, __LINE__, "the controller exited:\n%s", log);
        }
        ctl(c, &out, "--timeout 5s status");
        if (strstr(out, ": ready"))
            break;
        e2e_sleep_ms(100);
    }
    if (!strstr(out, ": ready")) {
        char *log = e2e_slurp("controller.log");
        wb_test_fail(__FILE__, __LINE__, "not ready:\n%s\ncontroller log:\n%s", out, log);
    }
    free(out);
}

static void stop(struct cluster *c)
{
    char *out;
    CHECK_INT(ctl(c, &out, "shutdown"), 0);
    free(out);
    CHECK_INT(e2e_wait(c->ctl, 10000), 0);
    for (int i = 0; i < NTR + NRO; i++)
        CHECK_INT(e2e_wait(c->ag[i], 10000), 0);
}

/* Every rollout's dump of version v against the reference. */
static void verify(struct cluster *c, uint64_t v)
{
    struct wb_errlist el;
    struct wb_job job;
    struct wb_ref *ref = NULL;
    wb_errlist_init(&el);
    setenv("WB_TOKEN", "xfer-tok", 1);
    CHECK_INT(wb_job_load(c->job, &job, &el), 0);
    CHECK_INT(wb_ref_load(&job, &ref, &el), 0);
    CHECK_INT(wb_ref_nrollouts(ref), NRO);
    uint64_t total = 0;
    for (uint32_t r = 0; r < NRO; r++) {
        char path[700], msg[512];
        uint64_t bytes = 0;
        snprintf(path, sizeof(path), "%s/rollout%u.v%" PRIu64 ".bin", c->dump, r, v);
        int rc = wb_ref_check_dump(ref, r, v, path, msg, sizeof(msg), &bytes);
        if (rc)
            wb_test_fail(__FILE__, __LINE__, "version %" PRIu64 ": %s", v, msg);
        total += bytes;
    }
    CHECK_U64(total, recv_bytes(c, 0) + recv_bytes(c, 1)); /* the demo: 2 x 1711904 */

    /* a dump that holds its first tensor as many times as it holds tensors is refused */
    char path[700], forged[760], msg[512];
    snprintf(path, sizeof(path), "%s/rollout0.v%" PRIu64 ".bin", c->dump, v);
    snprintf(forged, sizeof(forged), "%s.forged", path);
    FILE *in = fopen(path, "rb"), *out = fopen(forged, "wb");
    CHECK(in && out);
    uint8_t head[12], ent[12];
    uint32_t n, tensor;
    uint64_t b;
    CHECK_INT(fread(head, 1, 12, in) == 12 && fread(ent, 1, 12, in) == 12, 1);
    memcpy(&n, head + 8, 4);
    memcpy(&tensor, ent, 4);
    memcpy(&b, ent + 4, 8);
    uint8_t *data = malloc(b);
    CHECK_INT(fread(data, 1, b, in) == b, 1);
    fwrite(head, 1, 12, out);
    for (uint32_t i = 0; i < n; i++) {
        fwrite(ent, 1, 12, out);
        fwrite(data, 1, b, out);
    }
    free(data);
    fclose(in);
    fclose(out);
    uint64_t bytes = 0;
    CHECK_INT(wb_ref_check_dump(ref, 0, v, forged, msg, sizeof(msg), &bytes), -WB_E_PLAN);
    char want[256];
    snprintf(want, sizeof(want), "rollout rank 0: %s: in the dump twice",
             tensor == 0 ? "model.embed_tokens.weight" : "?");
    CHECK_STR(msg, want);
    unlink(forged);
    wb_ref_free(ref);
    wb_job_free(&job);
    wb_errlist_free(&el);
}

/* The "all" row of a transfer result: peak_tmp, mem_cap and queued columns. */
static void result_row(const char *out, uint64_t *bytes, uint64_t *peak, uint64_t *cap,
                       uint64_t *queued)
{
    const char *all = strstr(out, "\nall ");
    if (!all)
        wb_test_fail(__FILE__, __LINE__, "no totals row:\n%s", out);
    uint64_t writes, tasks;
    double st[WB_STAGE_COUNT + 1];
    int n = sscanf(all + 5,
                   "%" SCNu64 " %" SCNu64 " %" SCNu64 " %" SCNu64
                   " %lf %lf %lf %lf %lf %lf %lf %" SCNu64 " %" SCNu64,
                   bytes, &writes, &tasks, peak, &st[0], &st[1], &st[2], &st[3], &st[4], &st[5],
                   &st[6], cap, queued);
    if (n != 13)
        wb_test_fail(__FILE__, __LINE__, "cannot read the totals row:\n%s", all);
}

static void transfer_ok(struct cluster *c, uint64_t v, uint64_t *queued)
{
    char *out, args[64];
    snprintf(args, sizeof(args), "--timeout 60s transfer --version %" PRIu64, v);
    int rc = ctl(c, &out, args);
    if (rc)
        wb_test_fail(__FILE__, __LINE__, "transfer %" PRIu64 " failed:\n%s", v, out);
    uint64_t bytes, peak, cap, q;
    result_row(out, &bytes, &peak, &cap, &q);
    CHECK_U64(bytes, recv_bytes(c, 0) + recv_bytes(c, 1));
    CHECK_U64(cap, c->cap);
    CHECK(peak > 0 && peak <= cap);
    char line[64];
    for (int r = 0; r < NRO; r++) {
        snprintf(line, sizeof(line), "rollout %d: %" PRIu64 " bytes received", r, recv_bytes(c, r));
        CHECK_CONTAINS(out, line);
    }
    free(out);
    if (queued)
        *queued += q;
    verify(c, v);
    ctl(c, &out, "status");
    char want[64];
    snprintf(want, sizeof(want), "version %" PRIu64 ", in flight: none", v);
    CHECK_CONTAINS(out, want);
    free(out);
}

/* The trainer's Chrome trace: complete events ("X") of the stages, each span well-formed;
 * returns a bit per stage seen. */
static unsigned check_trace(int trainer)
{
    char path[700];
    snprintf(path, sizeof(path), "%s/trainer%d.trace.json", wb_test_tmpdir(), trainer);
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    if (!root)
        wb_test_fail(__FILE__, __LINE__, "%s:%d: %s", path, je.line, je.text);
    json_t *ev = json_object_get(root, "traceEvents");
    CHECK(json_is_array(ev));
    unsigned seen = 0;
    for (size_t i = 0; i < json_array_size(ev); i++) {
        json_t *e = json_array_get(ev, i);
        const char *ph = json_string_value(json_object_get(e, "ph"));
        const char *name = json_string_value(json_object_get(e, "name"));
        CHECK(ph && name);
        if (strcmp(ph, "X"))
            continue;
        CHECK(json_number_value(json_object_get(e, "dur")) >= 0);
        CHECK(json_integer_value(json_object_get(e, "pid")) == trainer);
        for (int s = 0; s < WB_STAGE_COUNT; s++)
            if (!strcmp(name, wb_stage_name((enum wb_stage)s)))
                seen |= 1u << s;
    }
    json_decref(root);
    return seen;
}

static void run_case_job(const char *provider, const char *domain, const char *mode,
                         const char *cap, bool expect_queueing, bool host_resident,
                         const char *tx_extra, const char *job_extra)
{
    struct cluster c = {
        .provider = provider, .domain = domain, .tx_extra = tx_extra, .job_extra = job_extra};
    snprintf(c.url, sizeof(c.url), "tcp://127.0.0.1:%u", e2e_port(11));
    write_job(&c, mode, cap, host_resident);
    start(&c, NULL);
    uint64_t queued = 0;
    for (uint64_t v = 1; v <= 3; v++)
        transfer_ok(&c, v, &queued);
    if (expect_queueing && queued == 0)
        wb_test_fail(__FILE__, __LINE__, "cap %s forced no task to wait for memory", cap);
    unsigned seen = check_trace(0);
    CHECK(seen & (1u << WB_STAGE_WRITE));
    CHECK(seen & (1u << WB_STAGE_QUANT));
    if (!strcmp(mode, "gather")) /* the demo's gather plan has a barrier after phase 0 */
        CHECK((seen & (1u << WB_STAGE_GATHER)) && (seen & (1u << WB_STAGE_BARRIER)));
    if (host_resident)
        CHECK(seen & (1u << WB_STAGE_H2D));
    stop(&c);
}

static void run_case_x(const char *provider, const char *domain, const char *mode, const char *cap,
                       bool expect_queueing, bool host_resident, const char *tx_extra)
{
    run_case_job(provider, domain, mode, cap, expect_queueing, host_resident, tx_extra, NULL);
}

static void run_case(const char *provider, const char *domain, const char *mode, const char *cap,
                     bool expect_queueing, bool host_resident)
{
    run_case_x(provider, domain, mode, cap, expect_queueing, host_resident, NULL);
}

static void test_tcp_auto(void)
{
    run_case("tcp", "lo", "auto", "4MiB", false, false);
}

static void test_tcp_gather(void)
{
    run_case("tcp", "lo", "gather", "4MiB", false, false);
}

static void test_shm_auto(void)
{
    run_case("shm", NULL, "auto", "4MiB", false, false);
}

static void test_shm_gather(void)
{
    run_case("shm", NULL, "gather", "4MiB", false, false);
}

/* verify: true — every write followed by its checksum record, every tensor checked at its
 * rollout before it counts: three versions in both modes (gather: writes from TMP; auto: the
 * same shard bytes to both TP ranks' replicas, hashed once), under a cap that makes tasks wait
 * (their checksum scratch is shared). */
static void test_shm_verify(void)
{
    run_case_job("shm", NULL, "auto", "4MiB", false, false, NULL, "verify: true\n");
}

static void test_tcp_verify_gather(void)
{
    run_case_job("tcp", "lo", "gather", "700KiB", true, false, NULL, "verify: true\n");
}

/* The largest gather task needs 641 KiB: with a 700 KiB cap tasks must wait for each other. */
static void test_mem_cap(void)
{
    run_case("tcp", "lo", "gather", "700KiB", true, false);
}

/* Two rails (endpoints) per agent, writes split in 64 KiB shards striped over them. */
static void test_tcp_two_rails(void)
{
    run_case_x("tcp", "lo", "auto", "4MiB", false, false, "rails: 2\nshard_size: 64KiB");
}

/* Parameters in host memory: tasks copy their shards to TMP first (H2D), in both modes. */
static void test_host_resident(void)
{
    run_case("tcp", "lo", "auto", "4MiB", false, true);
}

/* How many rollout rows of a wb-ctl status show `version` in their version column. */
static int rollouts_at(const char *status, const char *version)
{
    int n = 0;
    for (const char *p = status; (p = strstr(p, "\nrollout ")); p++) {
        char role[16], state[16], host[64], v[16];
        int rank, pid, dev;
        if (sscanf(p + 1, "%15s %d %15s %63s %d %d %15s", role, &rank, state, host, &pid, &dev,
                   v) == 7)
            n += strcmp(v, version) == 0;
    }
    return n;
}

/* kill -9 a trainer while transfer 2 runs: the failure names it within the timeout, the
 * rollouts keep version 1, and after a restart transfer 2 succeeds with correct bytes. */
static void test_kill_trainer(void)
{
    struct cluster c = {.provider = "tcp", .domain = "lo"};
    snprintf(c.url, sizeof(c.url), "tcp://127.0.0.1:%u", e2e_port(12));
    write_job(&c, "auto", "4MiB", false);
    start(&c, "60ms"); /* paced: 21 tasks hold a transfer open for about a second */
    transfer_ok(&c, 1, NULL);
    char cmd[700], *out;
    snprintf(cmd, sizeof(cmd), "%s/wb-ctl", e2e_bin());
    static char tok[] = "WB_TOKEN=xfer-tok";
    char *env[] = {tok, NULL};
    char *argv[] = {cmd, "-c", c.url, "--timeout", "20s", "transfer", "--version", "2", NULL};
    pid_t client = e2e_spawn("transfer2.log", env, argv);
    e2e_sleep_ms(400);
    CHECK_INT(kill(c.ag[2], SIGKILL), 0);
    CHECK_INT(e2e_wait(c.ag[2], 5000), 128 + SIGKILL);
    CHECK_INT(e2e_wait(client, 60000), 1);
    out = e2e_slurp("transfer2.log");
    CHECK_CONTAINS(out, "transfer 2 failed");
    CHECK_CONTAINS(out, "trainer rank 2");
    /* failed for the kill, not at the transfer timeout ("timed out after 20.0 s waiting for") */
    CHECK(!strstr(out, "timed out"));
    free(out);
    ctl(&c, &out, "status");
    CHECK_CONTAINS(out, "version 1, in flight: none");
    CHECK(strstr(out, "rollout      0 alive") && strstr(out, "rollout      1 alive"));
    free(out);
    /* the rollouts no longer claim version 1: parts of version 2 landed over it (they say so
     * in their next heartbeat) */
    int torn = 0;
    for (int t = 0; t < 30 && torn < 2; t++) {
        e2e_sleep_ms(100);
        ctl(&c, &out, "status");
        torn = rollouts_at(out, "torn");
        free(out);
    }
    CHECK_INT(torn, 2);
    char path[700];
    snprintf(path, sizeof(path), "%s/rollout0.v2.bin", c.dump);
    CHECK(access(path, F_OK) != 0); /* never published */
    /* The controller may have failed the transfer on the survivors' reports before its own
     * heartbeat check declared the rank dead: wait for that, then restart it. */
    for (int t = 0; t < 100; t++) {
        ctl(&c, &out, "--timeout 5s status");
        bool waiting = strstr(out, ": waiting") != NULL;
        free(out);
        if (waiting)
            break;
        e2e_sleep_ms(100);
    }
    c.ag[2] = spawn_agent(&c, 2, "1ms");
    for (int t = 0; t < 150; t++) {
        ctl(&c, &out, "--timeout 5s status");
        bool ready = strstr(out, ": ready") != NULL;
        free(out);
        if (ready)
            break;
        e2e_sleep_ms(100);
    }
    /* Version 2 again: resumed. The synthetic source's bytes of a version are fixed, so what
     * landed at the rollouts before the kill (whole rollout tensors, every write of them
     * counted) is not sent again; the dumps hold every byte all the same. */
    CHECK_INT(ctl(&c, &out, "--timeout 60s transfer --version 2"), 0);
    uint64_t bytes, peak, cap, q, full = recv_bytes(&c, 0) + recv_bytes(&c, 1);
    result_row(out, &bytes, &peak, &cap, &q);
    free(out);
    CHECK(bytes > 0 && bytes < full);
    verify(&c, 2);
    ctl(&c, &out, "status"); /* whole again */
    CHECK_INT(rollouts_at(out, "2"), 2);
    free(out);
    stop(&c);
}

/* The controller dies after version 1 and comes back: the agents register again, the rollouts
 * are set up again keeping their tensors (their weights, not zeroed memory), the controller
 * goes on from version 1 (which it refuses again), and version 2 lands with every byte right. */
static void test_controller_restart(void)
{
    struct cluster c = {.provider = "tcp", .domain = "lo"};
    snprintf(c.url, sizeof(c.url), "tcp://127.0.0.1:%u", e2e_port(14));
    write_job(&c, "auto", "4MiB", false);
    start(&c, NULL);
    transfer_ok(&c, 1, NULL);
    CHECK_INT(kill(c.ctl, SIGKILL), 0);
    CHECK_INT(e2e_wait(c.ctl, 5000), 128 + SIGKILL);
    char path[600];
    static char lvl[] = "WB_LOG=info";
    char *env[] = {(char *)TOK, lvl, NULL};
    snprintf(path, sizeof(path), "%s/wb-controller", e2e_bin());
    char *argv[] = {path, "--config", c.job, "--listen", c.url, NULL};
    c.ctl = e2e_spawn("controller2.log", env, argv);
    char *out = NULL;
    for (int t = 0; t < 150; t++) {
        free(out);
        ctl(&c, &out, "--timeout 5s status");
        if (strstr(out, ": ready"))
            break;
        e2e_sleep_ms(100);
    }
    CHECK_CONTAINS(out, "version 1, in flight: none");
    CHECK_INT(rollouts_at(out, "1"), 2);
    free(out);
    for (int r = 0; r < NRO; r++) {
        char log[32], want[96];
        snprintf(log, sizeof(log), "agent%d.log", NTR + r);
        char *text = e2e_slurp(log);
        snprintf(want, sizeof(want), "rollout rank %d: re-setup kept its ", r);
        CHECK_CONTAINS(text, want);
        CHECK_CONTAINS(text, " tensors and their weights\n");
        free(text);
    }
    CHECK_INT(ctl(&c, &out, "transfer --version 1"), 1);
    CHECK_STR(out, "wb-ctl: version 1 is not newer than the last complete version 1\n");
    free(out);
    transfer_ok(&c, 2, NULL);
    stop(&c);
}

/* ---------------------------------------------------------------- network namespaces */

static bool sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static bool sh(const char *fmt, ...)
{
    char cmd[512], full[600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof(cmd), fmt, ap);
    va_end(ap);
    snprintf(full, sizeof(full), "%s >/dev/null 2>&1", cmd);
    return system(full) == 0;
}

/* Namespaces of earlier runs whose test process is gone. */
static void sweep_netns(void)
{
    FILE *f = popen("ip netns list 2>/dev/null", "r");
    char line[256];
    while (f && fgets(line, sizeof(line), f)) {
        int pid, k;
        if (sscanf(line, "wbx%d-%d", &pid, &k) == 2 && kill(pid, 0) != 0)
            sh("ip netns del wbx%d-%d", pid, k);
        if (sscanf(line, "wbxhub%d", &pid) == 1 && kill(pid, 0) != 0)
            sh("ip netns del wbxhub%d", pid);
    }
    if (f)
        pclose(f);
}

static int netns_id;

/* Runs when the test ends — passed, failed a check or skipped (wb_test_cleanup; atexit would
 * miss the last two, which end with _exit): agents first, then the namespaces. */
static void netns_cleanup(void)
{
    e2e_kill_all();
    for (int k = 0; k <= NTR + NRO; k++)
        sh("ip netns del wbx%d-%d", netns_id, k);
    sh("ip netns del wbxhub%d", netns_id);
}

/* Each process in its own namespace (controller: 0, agents 1..6), each joined by a veth pair
 * to a bridge that lives in a hub namespace of its own; addresses 10.213.<id>.<k+1>/24 exist
 * only inside these namespaces. */
static void test_netns_tcp(void)
{
    int id = (int)getpid();
    if (geteuid() != 0 || !sh("command -v ip"))
        wb_test_skip("network namespaces need root and the ip command (iproute2)");
    sweep_netns();
    char hub[32], ns[NTR + NRO + 1][32];
    snprintf(hub, sizeof(hub), "wbxhub%d", id);
    if (!sh("ip netns add %s", hub))
        wb_test_skip("cannot create network namespaces here (ip netns add failed)");
    netns_id = id;
    wb_test_cleanup(netns_cleanup); /* from here on, a skip or a failed check deletes them */
    bool ok = sh("ip -n %s link add wbbr type bridge", hub) && sh("ip -n %s link set wbbr up", hub);
    int net = id % 200 + 20;
    for (int k = 0; ok && k <= NTR + NRO; k++) {
        snprintf(ns[k], sizeof(ns[k]), "wbx%d-%d", id, k);
        ok = sh("ip netns add %s", ns[k]) &&
             sh("ip -n %s link add wb0 type veth peer name p%d netns %s", ns[k], k, hub) &&
             sh("ip -n %s link set p%d master wbbr", hub, k) &&
             sh("ip -n %s link set p%d up", hub, k) &&
             sh("ip -n %s addr add 10.213.%d.%d/24 dev wb0", ns[k], net, k + 1) &&
             sh("ip -n %s link set wb0 up", ns[k]) && sh("ip -n %s link set lo up", ns[k]);
    }
    if (!ok)
        wb_test_skip("cannot wire namespaces with veth pairs and a bridge here");
    struct cluster c = {.provider = "tcp", .domain = "wb0", .netns_fmt = "wbx%d-%d", .id = id};
    snprintf(c.url, sizeof(c.url), "tcp://10.213.%d.1:%u", net, 7420);
    write_job(&c, "auto", "4MiB", false);
    start(&c, NULL);
    for (uint64_t v = 1; v <= 2; v++)
        transfer_ok(&c, v, NULL);
    stop(&c);
}

static void netns_tcp_in_child(void *arg)
{
    setenv("PATH", (const char *)arg, 1);
    printf("pid %d\n", (int)getpid()); /* what names its namespaces */
    fflush(stdout);
    test_netns_tcp();
}

/* The skip taken when namespaces can be made but not wired (here an `ip` that refuses veth
 * pairs, first on PATH) deletes what it made: no namespace of that run is left. */
static void test_netns_skip_cleans(void)
{
    if (geteuid() != 0 || !sh("command -v ip"))
        wb_test_skip("network namespaces need root and the ip command (iproute2)");
    char *real = NULL;
    CHECK_INT(e2e_run(&real, "sh -c 'command -v ip'"), 0);
    real[strcspn(real, "\n")] = 0;
    char bin[700], script[1500], path[4096];
    snprintf(bin, sizeof(bin), "%s/fakebin", wb_test_tmpdir());
    CHECK_INT(mkdir(bin, 0755), 0);
    snprintf(script, sizeof(script),
             "#!/bin/sh\ncase \"$*\" in *\"type veth\"*) exit 1;; esac\nexec %s \"$@\"\n", real);
    free(real);
    const char *ip = wb_test_write_file("fakebin/ip", script);
    CHECK_INT(chmod(ip, 0755), 0);
    snprintf(path, sizeof(path), "%s:%s", bin, getenv("PATH") ? getenv("PATH") : "/usr/bin:/bin");
    char out[2048];
    CHECK_INT(wb_test_capture(netns_tcp_in_child, path, out, sizeof(out)), 77);
    int pid = 0;
    CHECK(sscanf(out, "pid %d\n", &pid) == 1 && pid > 0);
    CHECK_STR(strchr(out, '\n') + 1,
              "skipped: cannot wire namespaces with veth pairs and a bridge here\n");
    char *list = NULL, hub[32], first[32];
    CHECK_INT(e2e_run(&list, "ip netns list"), 0);
    snprintf(hub, sizeof(hub), "wbxhub%d", pid);
    snprintf(first, sizeof(first), "wbx%d-0", pid);
    if (strstr(list, hub) || strstr(list, first))
        wb_test_fail(__FILE__, __LINE__, "namespaces of the skipped run are left:\n%s", list);
    free(list);
}

/* The demo's config.json with one setting changed (`from` -> `to`, the same length), written
 * to the test's directory as `name`; its path into hf. */
static void demo_config_with(const char *name, const char *from, const char *to, char *hf,
                             size_t cap)
{
    char *text = NULL;
    CHECK_INT(e2e_run(&text, "cat configs/jobs/demo/config.json"), 0);
    char *at = strstr(text, from);
    CHECK(at != NULL && strlen(from) == strlen(to));
    memcpy(at, to, strlen(to));
    snprintf(hf, cap, "%s", wb_test_write_file(name, text));
    free(text);
}

/* The demo job with the config.json hf, over tcp in auto mode: two transfers, every byte
 * checked; recv0/recv1 the bytes each rollout receives. */
static void run_variant(const char *hf, uint64_t recv0, uint64_t recv1, unsigned port_salt)
{
    struct cluster c = {.provider = "tcp", .domain = "lo", .hf_config = hf};
    c.recv[0] = recv0;
    c.recv[1] = recv1;
    snprintf(c.url, sizeof(c.url), "tcp://127.0.0.1:%u", e2e_port(port_salt));
    write_job(&c, "auto", "4MiB", false);
    start(&c, NULL);
    for (uint64_t v = 1; v <= 2; v++)
        transfer_ok(&c, v, NULL);
    stop(&c);
}

/* A vocab that is not a multiple of 64: vLLM pads 1000 rows to 1024 and splits that, 512 rows
 * per rank; rollout 1 receives rows 512..999 of the embedding and the LM head (24 x 256 x 2
 * bytes less of each) and its last 24 rows are padding nobody writes, which the reference
 * leaves out of the comparison. */
static void test_padded_vocab(void)
{
    char hf[700];
    demo_config_with("config.json", "\"vocab_size\": 1024", "\"vocab_size\": 1000", hf, sizeof(hf));
    run_variant(hf, DEMO_RECV, DEMO_RECV - 2 * 24 * 256 * 2, 13);
}

/* Hidden size 128: o_proj's 4-way row shards are 32 rows, so four trainers share each 128-row
 * FP8 block row and each has one AMAX op with three peers (one partial amax, sent to three
 * ranks, three partials merged). Every rollout byte is checked against the reference. */
static void test_amax_three_peers(void)
{
    char hf[700];
    demo_config_with("config_h128.json", "\"hidden_size\": 256", "\"hidden_size\": 128", hf,
                     sizeof(hf));
    run_variant(hf, 856464, 856464, 16);
}

/* ---------------------------------------------------------------- strangers */

/* The TCP ports process pid listens on: its sockets' inodes found in /proc/net/tcp. */
static int listen_ports(pid_t pid, uint16_t *ports, int cap)
{
    char dir[64], link[64], path[330];
    unsigned long inodes[256];
    int ni = 0, np = 0;
    snprintf(dir, sizeof(dir), "/proc/%d/fd", (int)pid);
    DIR *d = opendir(dir);
    CHECK(d != NULL);
    for (struct dirent *e; (e = readdir(d)) && ni < 256;) {
        snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
        ssize_t n = readlink(path, link, sizeof(link) - 1);
        if (n > 0) {
            link[n] = 0;
            if (sscanf(link, "socket:[%lu]", &inodes[ni]) == 1)
                ni++;
        }
    }
    closedir(d);
    FILE *f = fopen("/proc/net/tcp", "r");
    CHECK(f != NULL);
    char line[512];
    while (fgets(line, sizeof(line), f) && np < cap) {
        unsigned port, st;
        unsigned long inode;
        if (sscanf(line, " %*d: %*x:%x %*x:%*x %x %*x:%*x %*x:%*x %*x %*d %*d %lu", &port, &st,
                   &inode) != 3 ||
            st != 0x0A)
            continue;
        for (int i = 0; i < ni; i++)
            if (inodes[i] == inode)
                ports[np++] = (uint16_t)port;
    }
    fclose(f);
    return np;
}

/* What a stranger's libfabric client managed: writes the target accepted, and refusals by
 * their error (libfabric tcp: the target drops the connection of a write under an unknown key,
 * so the writer sees it cancelled). */
struct stray {
    int accepted, cancelled, other;
};

/* One write of 4 KiB of 0xAA with an immediate under `key` at `addr`, on a connection of its
 * own (the target drops a connection that wrote under a wrong key), delivery complete: the
 * completion says what the target did with it. */
static void stray_write(struct fid_domain *dom, const struct fi_info *info, uint16_t port,
                        uint64_t addr, uint64_t key, struct stray *st)
{
    static uint8_t junk[4096];
    memset(junk, 0xAA, sizeof(junk));
    struct fid_cq *cq;
    struct fid_av *av;
    struct fid_ep *ep;
    struct fid_mr *mr;
    struct fi_cq_attr cqa = {.format = FI_CQ_FORMAT_DATA, .size = 64, .wait_obj = FI_WAIT_NONE};
    struct fi_av_attr ava = {.type = FI_AV_TABLE};
    CHECK_INT(fi_cq_open(dom, &cqa, &cq, NULL), 0);
    CHECK_INT(fi_av_open(dom, &ava, &av, NULL), 0);
    CHECK_INT(fi_endpoint(dom, (struct fi_info *)info, &ep, NULL), 0);
    CHECK_INT(fi_ep_bind(ep, &cq->fid, FI_TRANSMIT | FI_RECV), 0);
    CHECK_INT(fi_ep_bind(ep, &av->fid, 0), 0);
    CHECK_INT(fi_enable(ep), 0);
    CHECK_INT(fi_mr_reg(dom, junk, sizeof(junk), FI_WRITE, 0, 0, 0, &mr, NULL), 0);
    if (info->domain_attr->mr_mode & FI_MR_ENDPOINT) {
        CHECK_INT(fi_mr_bind(mr, &ep->fid, 0), 0);
        CHECK_INT(fi_mr_enable(mr), 0);
    }
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    fi_addr_t peer;
    CHECK_INT(fi_av_insert(av, &sa, 1, &peer, 0, NULL), 1);
    struct fi_context2 ctx;
    struct iovec iov = {junk, sizeof(junk)};
    void *desc = fi_mr_desc(mr);
    struct fi_rma_iov rma = {.addr = addr, .len = sizeof(junk), .key = key};
    struct fi_msg_rma msg = {.msg_iov = &iov,
                             .desc = &desc,
                             .iov_count = 1,
                             .addr = peer,
                             .rma_iov = &rma,
                             .rma_iov_count = 1,
                             .context = &ctx,
                             .data = 0x01000001u};
    ssize_t e; /* a write that is never answered is a hang: the test's time limit ends it */
    while ((e = fi_writemsg(ep, &msg, FI_REMOTE_CQ_DATA | FI_DELIVERY_COMPLETE | FI_COMPLETION)) ==
           -FI_EAGAIN) {
        struct fi_cq_data_entry ce;
        fi_cq_read(cq, &ce, 1);
    }
    if (e) {
        st->other++;
    } else {
        for (;;) { /* every write is answered */
            struct fi_cq_data_entry ce;
            ssize_t n = fi_cq_read(cq, &ce, 1);
            if (n == 1) {
                st->accepted++;
                break;
            }
            if (n == -FI_EAVAIL) {
                struct fi_cq_err_entry ee = {0};
                fi_cq_readerr(cq, &ee, 0);
                if (ee.err == FI_ECANCELED)
                    st->cancelled++;
                else
                    st->other++;
                break;
            }
        }
    }
    fi_close(&mr->fid);
    fi_close(&ep->fid);
    fi_close(&av->fid);
    fi_close(&cq->fid);
}

/* A stranger who can reach the rollout's data port (libfabric tcp on 127.0.0.1:port) writes
 * under keys 0..63 and 64 random ones, each at offset 0 and at a heap-like address. */
static void stranger(uint16_t port, struct stray *st)
{
    struct fi_info *hints = fi_allocinfo(), *info = NULL;
    CHECK(hints != NULL);
    hints->ep_attr->type = FI_EP_RDM;
    hints->caps = FI_RMA | FI_WRITE;
    hints->mode = FI_CONTEXT | FI_CONTEXT2;
    hints->domain_attr->mr_mode =
        FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_ENDPOINT;
    hints->fabric_attr->prov_name = strdup("tcp");
    hints->domain_attr->name = strdup("lo");
    CHECK_INT(fi_getinfo(FI_VERSION(1, 17), NULL, NULL, 0, hints, &info), 0);
    fi_freeinfo(hints);
    struct fid_fabric *fab;
    struct fid_domain *dom;
    CHECK_INT(fi_fabric(info->fabric_attr, &fab, NULL), 0);
    CHECK_INT(fi_domain(fab, info, &dom, NULL), 0);
    uint64_t addrs[2] = {0, (uint64_t)(uintptr_t)info}; /* offset mode; a plausible heap */
    for (int i = 0; i < 128; i++) {
        uint64_t key = i < 64 ? (uint64_t)i : wb_random_u64();
        for (int a = 0; a < 2; a++)
            stray_write(dom, info, port, addrs[a], key, st);
    }
    fi_close(&dom->fid);
    fi_close(&fab->fid);
    fi_freeinfo(info);
}

/* Item 2 of the red team's list: anyone who reached a rollout's data port wrote its weights
 * under keys 1, 2, 3 ... during a transfer that then reported complete. Now keys are random
 * 64-bit values: a stranger's 256 writes per data port during version 2 (a process of its own,
 * libfabric tcp, keys 0..63 and 64 random ones, each on a connection of its own) are all
 * refused by the target, and every byte each rollout holds is the reference's. */
static void test_stranger_write(void)
{
    struct cluster c = {.provider = "tcp", .domain = "lo", .job_extra = "verify: true\n"};
    snprintf(c.url, sizeof(c.url), "tcp://127.0.0.1:%u", e2e_port(14));
    write_job(&c, "auto", "4MiB", false);
    start(&c, "30ms"); /* paced: a transfer stays open while the stranger writes */
    transfer_ok(&c, 1, NULL);
    uint16_t ports[8];
    int np = listen_ports(c.ag[NTR], ports, 8);
    CHECK(np >= 1);
    char cmd[700];
    snprintf(cmd, sizeof(cmd), "%s/wb-ctl", e2e_bin());
    char *env[] = {(char *)TOK, NULL};
    char *argv[] = {cmd, "-c", c.url, "--timeout", "60s", "transfer", "--version", "2", NULL};
    pid_t client = e2e_spawn("transfer2.log", env, argv);
    int fds[2];
    CHECK_INT(pipe(fds), 0);
    pid_t s = fork();
    CHECK(s >= 0);
    if (s == 0) { /* the stranger: its own process */
        close(fds[0]);
        struct stray total = {0};
        for (int i = 0; i < np; i++)
            stranger(ports[i], &total);
        _exit(write(fds[1], &total, sizeof(total)) == sizeof(total) ? 0 : 1);
    }
    close(fds[1]);
    struct stray got = {0};
    CHECK_INT(read(fds[0], &got, sizeof(got)), sizeof(got));
    close(fds[0]);
    CHECK_INT(e2e_wait(s, 30000), 0);
    CHECK_INT(got.accepted, 0);
    CHECK_INT(got.other, 0);
    CHECK_INT(got.cancelled, 256 * np);
    CHECK_INT(e2e_wait(client, 60000), 0);
    char *out = e2e_slurp("transfer2.log");
    CHECK_CONTAINS(out, "transfer 2: complete in");
    free(out);
    verify(&c, 2);
    stop(&c);
}

/* A write that does land where it should not (here: rollout 1 flips the first byte of a tensor
 * once its writes are in, as a stray write would) fails the version with the rollout, the
 * tensor and the bytes named; the rollout says it is torn, not version 1; the retry is whole. */
static void test_stray_write_detected(void)
{
    struct cluster c = {.provider = "tcp",
                        .domain = "lo",
                        .job_extra = "verify: true\n",
                        .corrupt = "model.layers.1.mlp.experts.w2_weight"};
    snprintf(c.url, sizeof(c.url), "tcp://127.0.0.1:%u", e2e_port(15));
    write_job(&c, "auto", "4MiB", false);
    start(&c, NULL);
    char *out;
    CHECK_INT(ctl(&c, &out, "--timeout 60s transfer --version 1"), 1);
    CHECK_CONTAINS(out, "transfer 1 failed");
    CHECK_CONTAINS(out, "rollout rank 1");
    CHECK_CONTAINS(out, "model.layers.1.mlp.experts.w2_weight: bytes [0, ");
    CHECK_CONTAINS(out, "written by trainer rank");
    CHECK_CONTAINS(out, "do not match their checksum");
    free(out);
    int torn = 0;
    for (int t = 0; t < 30 && torn < 1; t++) {
        ctl(&c, &out, "status");
        torn = rollouts_at(out, "torn");
        free(out);
        if (!torn)
            e2e_sleep_ms(100);
    }
    CHECK(torn >= 1);
    /* The byte is flipped once: the retry (resumed: what landed and checked is not sent
     * again) leaves every byte right. */
    CHECK_INT(ctl(&c, &out, "--timeout 60s transfer --version 1"), 0);
    CHECK_CONTAINS(out, "transfer 1: complete in");
    free(out);
    verify(&c, 1);
    ctl(&c, &out, "status");
    CHECK_INT(rollouts_at(out, "1"), 2);
    free(out);
    stop(&c);
}

const struct wb_test wb_tests[] = {
    {"padded_vocab", test_padded_vocab, 120},
    {"amax_three_peers", test_amax_three_peers, 120},
    {"controller_restart", test_controller_restart, 120},
    {"tcp_auto", test_tcp_auto, 120},
    {"tcp_gather", test_tcp_gather, 120},
    {"shm_auto", test_shm_auto, 120},
    {"shm_gather", test_shm_gather, 120},
    {"mem_cap", test_mem_cap, 120},
    {"shm_verify", test_shm_verify, 120},
    {"tcp_verify_gather", test_tcp_verify_gather, 120},
    {"host_resident", test_host_resident, 120},
    {"tcp_two_rails", test_tcp_two_rails, 120},
    {"kill_trainer", test_kill_trainer, 120},
    {"stranger_write", test_stranger_write, 120},
    {"stray_write_detected", test_stray_write_detected, 120},
    {"netns_tcp", test_netns_tcp, 120},
    {"netns_skip_cleans", test_netns_skip_cleans, 60},
    {0},
};
