/* e2e_cluster.h — the demo job as real processes, shared by the end-to-end tests of data
 * (e2e_xfer_test.c) and of attacks on it (e2e_attack_test.c): a job file with absolute paths,
 * wb-controller and 4 trainer + 2 rollout wb-agents on loopback, wb-ctl calls, and the check of
 * every rollout byte against the reference (controller/verify.c: the synthetic source, fusion,
 * the quant CPU reference, the rollout boxes — no planner or executor code). A header with
 * definitions because each test program is built from one source file. */
#ifndef WB_E2E_CLUSTER_H
#define WB_E2E_CLUSTER_H

#include "controller/controller.h"
#include "tests/func/e2e_proc.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <inttypes.h>
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
    const char *hf_config;    /* config.json of the model, or NULL: the demo's */
    const char *rules;        /* the model-family file, or NULL: qwen3_moe.yaml (the demo's) */
    const char *job_extra;    /* more lines for the job file, or NULL */
    const char *corrupt;      /* rollout 1 flips a byte of this tensor once it lands, or NULL */
    const char *trainer0_arg; /* one more argument for trainer 0 (--corrupt-delta=N), or NULL */
    uint64_t recv[NRO];       /* bytes each rollout receives per transfer; 0: the demo's */
    const char *peers_dir;    /* agents write the peer lists they get here ($WB_TEST_PEERS_OUT) */
    const char *device;       /* the agents' GPU (--device), or NULL: host memory */
    const char *layout_extra; /* more lines for the demo's trainer layout (dtype: fp32), or NULL */
    bool job_trace; /* agents get no --trace: the job file's trace: key decides (job_extra) */
    const char *first_tensor; /* the rollout's tensor 0, or NULL: model.embed_tokens.weight */
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
    if (host_resident || c->layout_extra) {
        const char *extra = c->layout_extra ? c->layout_extra : "";
        char *text = NULL, *dup;
        CHECK_INT(e2e_run(&text, "cat %s", layout), 0);
        CHECK((dup = malloc(strlen(text) + strlen(extra) + 32)) != NULL);
        sprintf(dup, "%s%s%s", text, host_resident ? "residence: host\n" : "", extra);
        snprintf(layout, sizeof(layout), "%s", wb_test_write_file("trainer.yaml", dup));
        free(dup);
        free(text);
    }
    snprintf(c->job, sizeof(c->job), "%s/job.yaml", wb_test_tmpdir());
    FILE *f = fopen(c->job, "w");
    CHECK(f != NULL);
    char hf[700], rules[700];
    if (c->hf_config)
        snprintf(hf, sizeof(hf), "%s", c->hf_config);
    else
        snprintf(hf, sizeof(hf), "%s/configs/jobs/demo/config.json", cwd);
    snprintf(rules, sizeof(rules), "%s/%s", cwd,
             c->rules ? c->rules : "configs/models/qwen3_moe.yaml");
    fprintf(f,
            "name: xfer\n"
            "model:\n"
            "  rules: %s\n"
            "  hf_config: %s\n"
            "trainer_layout: %s\n"
            "rollout_layout: %s/configs/jobs/demo/rollout.yaml\n"
            "mode: %s\nmem_cap: %s\nseed: 7\nprovider: %s\n"
            "heartbeat: 200ms\n%s",
            rules, hf, layout, cwd, mode, cap, c->provider, c->job_extra ? c->job_extra : "");
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
    char log[32], rk[16], path[600], ns[64], peers[700];
    static char lvl[] = "WB_LOG=info";
    snprintf(peers, sizeof(peers), "WB_TEST_PEERS_OUT=%s", c->peers_dir ? c->peers_dir : "");
    char *env[] = {(char *)TOK, lvl, peers, NULL};
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
    if (c->device) {
        argv[n++] = "--device";
        argv[n++] = (char *)c->device;
    }
    if (i >= NTR) {
        argv[n++] = "--dump";
        argv[n++] = c->dump;
    }
    if (c->corrupt && i == NTR + 1) {
        argv[n++] = "--corrupt";
        argv[n++] = (char *)c->corrupt;
    }
    if (c->trainer0_arg && i == 0)
        argv[n++] = (char *)c->trainer0_arg;
    char trace[700];
    if (i < NTR && !c->job_trace) { /* trainers' traces: <tmp>/traces/trainer<R>.v<N>.json */
        snprintf(trace, sizeof(trace), "%s/traces", wb_test_tmpdir());
        mkdir(trace, 0755);
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

/* The reference of the cluster's job (its job file loaded into job): free both with
 * ref_close(). */
struct refjob {
    struct wb_errlist el;
    struct wb_job job;
    struct wb_ref *ref;
};

static struct wb_ref *ref_open(struct cluster *c, struct refjob *r)
{
    r->ref = NULL;
    wb_errlist_init(&r->el);
    setenv("WB_TOKEN", "xfer-tok", 1);
    CHECK_INT(wb_job_load(c->job, &r->job, &r->el), 0);
    CHECK_INT(wb_ref_load(&r->job, &r->ref, &r->el), 0);
    return r->ref;
}

static void ref_close(struct refjob *r)
{
    wb_ref_free(r->ref);
    wb_job_free(&r->job);
    wb_errlist_free(&r->el);
}

/* Every rollout's dump of version v against the reference. */
static void verify(struct cluster *c, uint64_t v)
{
    struct refjob rj;
    struct wb_ref *ref = ref_open(c, &rj);
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
             tensor != 0       ? "?"
             : c->first_tensor ? c->first_tensor
                               : "model.embed_tokens.weight");
    CHECK_STR(msg, want);
    unlink(forged);
    ref_close(&rj);
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

__attribute__((unused)) static void transfer_ok(struct cluster *c, uint64_t v, uint64_t *queued)
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

/* How many rollout rows of a status show `version` (not every test asks). */
__attribute__((unused)) static int rollouts_at(const char *status, const char *version)
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

#endif /* WB_E2E_CLUSTER_H */
