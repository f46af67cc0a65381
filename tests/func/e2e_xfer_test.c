/* e2e_xfer_test.c — the whole job with real data: wb-controller, 4 trainer agents and 2
 * rollout agents (real processes) move the demo model (Qwen3-MoE-shaped, BF16 FSDP 2 x EP 2 ->
 * FP8 TP 2) over libfabric's tcp and shm providers, in auto and gather mode, three versions;
 * after each transfer every byte every rollout holds is compared with the reference computed
 * here, independently of the planner and the executor (controller/verify.c: synthetic source,
 * fusion, quant's CPU reference, the rollout boxes). Also: the memory cap (peak <= cap, and a
 * cap that forces tasks to queue), a trainer killed mid-transfer (the failure names it, the
 * rollouts keep their version, the retry after a restart succeeds), a rollout's state dump
 * (SIGUSR1) checked rank by rank, and the same job with every process in its own network
 * namespace. Timing never decides a result. */
#include <fcntl.h>
#include <jansson.h>
#include <regex.h>

#include "tests/func/e2e_cluster.h"

/* The trainer's Chrome trace of version 3 (its --trace directory): complete events ("X") of
 * the stages, each span well-formed; returns a bit per stage seen. */
static unsigned check_trace(int trainer)
{
    char path[700];
    snprintf(path, sizeof(path), "%s/traces/trainer%d.v3.json", wb_test_tmpdir(), trainer);
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
        const char *cat = json_string_value(json_object_get(e, "cat"));
        CHECK(ph && json_string_value(json_object_get(e, "name")));
        if (strcmp(ph, "X"))
            continue;
        CHECK(cat != NULL);
        CHECK(json_number_value(json_object_get(e, "dur")) >= 0);
        CHECK(json_integer_value(json_object_get(e, "pid")) == trainer);
        CHECK(json_integer_value(json_object_get(json_object_get(e, "args"), "version")) == 3);
        for (int s = 0; s < WB_STAGE_COUNT; s++)
            if (!strcmp(cat, wb_stage_name((enum wb_stage)s)))
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
    stop(&c); /* a trace is written after its version's report: every one is in once they exit */
    unsigned seen = check_trace(0);
    CHECK(seen & (1u << WB_STAGE_WRITE));
    CHECK(seen & (1u << WB_STAGE_QUANT));
    if (!strcmp(mode, "gather")) /* the demo's gather plan has a barrier after phase 0 */
        CHECK((seen & (1u << WB_STAGE_GATHER)) && (seen & (1u << WB_STAGE_BARRIER)));
    if (host_resident)
        CHECK(seen & (1u << WB_STAGE_H2D));
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

/* Trainers holding FP32 masters (the layout says `dtype: fp32`; the synthetic source fills FP32
 * shards), FP16 ones with FP32 norms, and FP32 in host memory: the rollouts get every tensor cast
 * to BF16 or quantized from its BF16 cast, each byte checked by wb-ctl verify's reference. */
static void run_masters(const char *mode, bool host, const char *layout_extra)
{
    struct cluster c = {.provider = "tcp", .domain = "lo", .layout_extra = layout_extra};
    snprintf(c.url, sizeof(c.url), "tcp://127.0.0.1:%u", e2e_port(11));
    write_job(&c, mode, "4MiB", host);
    start(&c, NULL);
    uint64_t queued = 0;
    for (uint64_t v = 1; v <= 2; v++)
        transfer_ok(&c, v, &queued);
    char *out = NULL;
    CHECK_INT(ctl(&c, &out, "plan"), 0);
    CHECK_CONTAINS(out, host ? "11.01 MiB host-to-device" : "45 trainer tensors (");
    free(out);
    stop(&c);
}

static void test_fp32_masters(void)
{
    run_masters("auto", false, "dtype: fp32\n");
}

static void test_fp16_masters_fp32_norms_gather(void)
{
    run_masters("gather", false, "dtype: fp16\ndtypes: [{match: \"*norm*\", dtype: fp32}]\n");
}

static void test_fp32_masters_host(void)
{
    run_masters("auto", true, "dtype: fp32\n");
}

/* How many rollout rows of a wb-ctl status show `version` in their version column. */
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

/* Phi-3's fused trainer tensors (qkv_proj = [q; k; v], gate_up_proj = [gate; up]) cut by the
 * phi3 family's split rules into each TP 2 rollout's share of every component, FP8, from the
 * demo's FSDP 2 x EP 2 shards (amax exchanges where a shard edge cuts a block), by real
 * processes over tcp, auto and gather (each fused tensor gathered once for its components):
 * every rollout byte checked against the reference. */
static void test_phi3_split(void)
{
    static const char *const modes[] = {"auto", "gather"};
    char cwd[512], hf[700];
    CHECK(getcwd(cwd, sizeof(cwd)) != NULL);
    snprintf(hf, sizeof(hf), "%s/tests/fixtures/matcher/phi3-tiny-fp8.json", cwd);
    for (size_t m = 0; m < 2; m++) {
        struct cluster c = {.provider = "tcp",
                            .domain = "lo",
                            .rules = "configs/models/phi3.yaml",
                            .hf_config = hf};
        c.recv[0] = c.recv[1] = 1313472; /* wb-plan's recv_bytes for this model and layout */
        snprintf(c.url, sizeof(c.url), "tcp://127.0.0.1:%u", e2e_port(19 + (unsigned)m));
        write_job(&c, modes[m], "4MiB", false);
        start(&c, NULL);
        for (uint64_t v = 1; v <= 2; v++)
            transfer_ok(&c, v, NULL);
        stop(&c);
    }
}

/* gpt-oss's experts as Hugging Face holds them ([E, H, 2I] gate_up_proj, [E, I, H] down_proj),
 * transposed into vLLM's w13_weight [E, 2I, H] / w2_weight [E, H, I] (the family's permute
 * rules: PERMUTE ops before the writes), BF16 TP 2, from the demo's FSDP 2 x EP 2 shards (each
 * trainer one expert), by real processes over tcp, auto and gather: every rollout byte checked
 * against the reference, which transposes the synthetic source itself (controller/verify.c). */
static void test_gpt_oss_transposed(void)
{
    static const char *const modes[] = {"auto", "gather"};
    char cwd[512], hf[700];
    CHECK(getcwd(cwd, sizeof(cwd)) != NULL);
    snprintf(hf, sizeof(hf), "%s/tests/fixtures/matcher/gpt-oss-tiny.json", cwd);
    for (size_t m = 0; m < 2; m++) {
        struct cluster c = {.provider = "tcp",
                            .domain = "lo",
                            .rules = "configs/models/gpt_oss.yaml",
                            .hf_config = hf,
                            .first_tensor = "model.embedding.weight"};
        c.recv[0] = 2507288; /* wb-plan's recv_bytes for this model and layout */
        c.recv[1] = 2503192;
        snprintf(c.url, sizeof(c.url), "tcp://127.0.0.1:%u", e2e_port(31 + (unsigned)m));
        write_job(&c, modes[m], "4MiB", false);
        start(&c, NULL);
        for (uint64_t v = 1; v <= 2; v++)
            transfer_ok(&c, v, NULL);
        stop(&c);
    }
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

/* wb-agent's testing hook: SIGUSR1 to a rollout started with --dump writes its tensors as they
 * are now under <dump>/state/ and then its claim, "version V torn T in_flight F"; wb-ctl verify
 * --rank R checks that one rank's file against the reference (tests/sh/soak.sh does so after
 * every fault it injects). A flipped byte is named; a rank the job lacks is refused. */
static void test_state_dump(void)
{
    struct cluster c = {.provider = "tcp", .domain = "lo"};
    snprintf(c.url, sizeof(c.url), "tcp://127.0.0.1:%u", e2e_port(17));
    write_job(&c, "auto", "4MiB", false);
    start(&c, NULL);
    transfer_ok(&c, 1, NULL);
    char state[700], claim[760], bin[760], *out;
    snprintf(state, sizeof(state), "%s/state", c.dump);
    snprintf(claim, sizeof(claim), "%s/rollout1.txt", state);
    snprintf(bin, sizeof(bin), "%s/rollout1.v1.bin", state);
    CHECK_INT(kill(c.ag[NTR + 1], SIGUSR1), 0);
    for (int t = 0; t < 200 && access(claim, F_OK) != 0; t++)
        e2e_sleep_ms(50);
    CHECK_INT(e2e_run(&out, "cat %s", claim), 0);
    CHECK_STR(out, "version 1 torn 0 in_flight 0\n");
    free(out);
    CHECK_INT(
        e2e_run(&out, "wb-ctl verify --config %s --dump %s --version 1 --rank 1", c.job, state), 0);
    CHECK_STR(out, "verify version 1: rollout rank 1, 1711904 bytes, every byte equals the "
                   "reference\n");
    free(out);
    /* without --rank every rank's file is needed: rank 0 wrote none here */
    CHECK_INT(e2e_run(&out, "wb-ctl verify --config %s --dump %s --version 1", c.job, state), 1);
    CHECK_CONTAINS(out, "/state/rollout0.v1.bin: cannot open");
    free(out);
    /* the first byte of the first tensor (header: 8 + 4 bytes, entry: 4 + 8) flipped */
    FILE *f = fopen(bin, "r+b");
    CHECK(f != NULL);
    CHECK_INT(fseek(f, 24, SEEK_SET), 0);
    int b = fgetc(f);
    CHECK(b != EOF);
    CHECK_INT(fseek(f, 24, SEEK_SET), 0);
    CHECK_INT(fputc(b ^ 0x40, f), b ^ 0x40);
    CHECK_INT(fclose(f), 0);
    CHECK_INT(
        e2e_run(&out, "wb-ctl verify --config %s --dump %s --version 1 --rank 1", c.job, state), 1);
    CHECK_CONTAINS(out, "wb-ctl: verify: rollout rank 1, version 1: ");
    CHECK_CONTAINS(out, ": byte 0 is 0x");
    free(out);
    CHECK_INT(
        e2e_run(&out, "wb-ctl verify --config %s --dump %s --version 1 --rank 2", c.job, state), 2);
    CHECK_STR(out, "wb-ctl: verify: --rank 2: the job has 2 rollout ranks\n");
    free(out);
    stop(&c);
}

static bool matches(const char *text, const char *re)
{
    regex_t rx;
    if (regcomp(&rx, re, REG_EXTENDED))
        wb_test_fail(__FILE__, __LINE__, "bad regex %s", re);
    bool m = regexec(&rx, text, 0, NULL, 0) == 0;
    regfree(&rx);
    return m;
}

/* wb-ctl transfer under script(1), so its stdout is a terminal: a progress line rewritten in
 * place (bytes written of the plan's 3.27 MiB, rate) while the paced transfer runs, erased
 * before the result, which is then what a pipe gets; through a pipe, no progress at all. */
static void test_transfer_progress_terminal(void)
{
    if (system("script --version >/dev/null 2>&1") != 0)
        wb_test_skip("no script(1) (util-linux / bsdutils): scripts/deps.sh installs it");
    char why[300];
    if (!e2e_pty_possible(why, sizeof(why)))
        wb_test_skip("no pseudo-terminal can be made here (%s): script(1) needs one", why);
    struct cluster c = {.provider = "tcp", .domain = "lo"};
    snprintf(c.url, sizeof(c.url), "tcp://127.0.0.1:%u", e2e_port(17));
    write_job(&c, "auto", "4MiB", false);
    start(&c, "60ms"); /* paced: 21 tasks hold a transfer open for over a second */
    char cmd[1000];
    snprintf(cmd, sizeof(cmd), "%s/wb-ctl -c %s --timeout 60s transfer --version 1", e2e_bin(),
             c.url);
    char *argv[] = {"/usr/bin/env", "script", "-qfec", cmd, "/dev/null", NULL};
    static char tok[] = "WB_TOKEN=xfer-tok";
    char *env[] = {tok, NULL};
    CHECK_INT(e2e_wait(e2e_spawn("tty.log", env, argv), 60000), 0);
    char *out = e2e_slurp("tty.log");
    /* 3423808 bytes to write: the demo plan's two rollouts' DEMO_RECV */
    if (!matches(out, "\rtransfer 1: [0-9.]+ (B|KiB|MiB) / 3\\.27 MiB +[0-9]+\\.[0-9]%  "
                      "[0-9.]+ (B|KiB|MiB|GiB)/s\033\\[K"))
        wb_test_fail(__FILE__, __LINE__, "no progress line:\n%s", out);
    /* every line with numbers says the whole plan (none before every trainer reported) */
    int all = 0, whole = 0;
    for (const char *p = out; (p = strstr(p, " / ")); p++)
        all++;
    for (const char *p = out; (p = strstr(p, " / 3.27 MiB ")); p++)
        whole++;
    CHECK_INT(all, whole);
    /* erased, then the result as a pipe gets it (the terminal writes \r\n for \n) */
    CHECK_CONTAINS(out, "\033[K\r\033[Ktransfer 1: complete in ");
    CHECK_CONTAINS(out, "\r\nrollout 1: 1711904 bytes received\r\n");
    free(out);
    verify(&c, 1);

    CHECK_INT(ctl(&c, &out, "--timeout 60s transfer --version 2"), 0);
    CHECK(strncmp(out, "transfer 2: complete in ", 24) == 0);
    CHECK(!strchr(out, '\r') && !strchr(out, '\033'));
    CHECK_CONTAINS(out, "\nrollout 1: 1711904 bytes received\n");
    free(out);
    stop(&c);
}

const struct wb_test wb_tests[] = {
    {"padded_vocab", test_padded_vocab, 120},
    {"amax_three_peers", test_amax_three_peers, 120},
    {"phi3_split", test_phi3_split, 180},
    {"gpt_oss_transposed", test_gpt_oss_transposed, 180},
    {"controller_restart", test_controller_restart, 120},
    {"tcp_auto", test_tcp_auto, 120},
    {"tcp_gather", test_tcp_gather, 120},
    {"shm_auto", test_shm_auto, 120},
    {"shm_gather", test_shm_gather, 120},
    {"mem_cap", test_mem_cap, 120},
    {"shm_verify", test_shm_verify, 120},
    {"tcp_verify_gather", test_tcp_verify_gather, 120},
    {"fp32_masters", test_fp32_masters, 120},
    {"fp16_masters_fp32_norms_gather", test_fp16_masters_fp32_norms_gather, 120},
    {"fp32_masters_host", test_fp32_masters_host, 120},
    {"host_resident", test_host_resident, 120},
    {"tcp_two_rails", test_tcp_two_rails, 120},
    {"kill_trainer", test_kill_trainer, 120},
    {"transfer_progress_terminal", test_transfer_progress_terminal, 120},
    {"stray_write_detected", test_stray_write_detected, 120},
    {"state_dump", test_state_dump, 120},
    {"netns_tcp", test_netns_tcp, 120},
    {"netns_skip_cleans", test_netns_skip_cleans, 60},
    {0},
};
