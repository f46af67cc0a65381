/* endpoint_at_test.c — the placement "at coordinate i" (wb_reg_at, agent/agent.h) from C: real
 * processes registering through the endpoint API with a real wb-controller whose job names no
 * trainer layout, so the layout is derived from the placements (controller/derive.c).
 *
 * pp_tp: four trainers on a (pp 2, tp 2) mesh hold a pipeline's two ends — the embedding only on
 * stage 0 (at 0 on pp, split by rows over tp: Shard(0)), the final norm only on stage 1 (at 1 on
 * pp, replicated over tp) — and the other stage registers nothing of it. One rollout rank holds
 * both whole; its post-update hook checks every byte of two versions against the values written
 * here. misplaced: a rank registering the embedding "at 0" from stage 1 is refused, every rank
 * told with the rank, the tensor and both coordinates named. missing: a stage-0 rank that leaves
 * its shard of the embedding out is refused, its shard named. local_checks: a coordinate past
 * the mesh dim's size is refused by wb_endpoint_add() itself.
 */
#include "agent/agent.h"
#include "tests/func/e2e_proc.h"

#include <sys/wait.h>

enum { ROWS = 64, COLS = 32, PP = 2, TP = 2, NTRAINERS = PP * TP, VERSIONS = 2 };

static const char *const NAMES[] = {"model.embed_tokens.weight", "model.norm.weight"};

/* What the trainers do wrong (set before they fork). */
enum fault { FAULT_NONE, FAULT_MISPLACED, FAULT_MISSING };
static enum fault g_fault = FAULT_NONE;

/* The BF16 bits of element i of tensor t at version v. */
static uint16_t value(uint64_t v, unsigned t, uint64_t i)
{
    return (uint16_t)(0x3c00u + ((v * 131u + t * 17u + i * 7u) & 0x3ffu));
}

static uint64_t numel(unsigned t)
{
    return t == 0 ? (uint64_t)ROWS * COLS : COLS;
}

static void set_shape(unsigned t, struct wb_shape *s)
{
    memset(s, 0, sizeof(*s));
    s->ndim = t == 0 ? 2 : 1;
    s->dim[0] = t == 0 ? ROWS : COLS;
    s->dim[1] = t == 0 ? COLS : 0;
}

static void write_job(char *url, size_t cap, unsigned salt)
{
    char cwd[512], text[2048];
    CHECK(getcwd(cwd, sizeof(cwd)) != NULL);
    snprintf(url, cap, "tcp://127.0.0.1:%u", e2e_port(salt));
    char inv[256];
    snprintf(inv, sizeof(inv),
             "model.embed_tokens.weight: {dtype: bf16, shape: [%d, %d]}\n"
             "model.norm.weight: {dtype: bf16, shape: [%d]}\n",
             ROWS, COLS, COLS);
    wb_test_write_file("trainer_inv.yaml", inv);
    wb_test_write_file("rollout_inv.yaml", inv);
    wb_test_write_file("rollout.yaml", "replicas: 1\ngpus_per_replica: 1\ntp: 1\n"
                                       "gpus_per_node: 1\n");
    snprintf(text, sizeof(text),
             "name: endpoint-at\nlisten: %s\ntoken: at-tok\n"
             "model:\n  rules: %s/configs/models/qwen3.yaml\n"
             "  trainer_inventory: trainer_inv.yaml\n  rollout_inventory: rollout_inv.yaml\n"
             "trainers: %d\nrollout_layout: rollout.yaml\n"
             "mode: auto\nmem_cap: 1MiB\nprovider: tcp\nheartbeat: 200ms\n",
             url, cwd, NTRAINERS);
    wb_test_write_file("job.yaml", text);
}

static pid_t start_controller(void)
{
    char job[600];
    snprintf(job, sizeof(job), "%s/job.yaml", wb_test_tmpdir());
    char *argv[] = {"wb-controller", "--config", job, NULL};
    return e2e_spawn("controller.log", NULL, argv);
}

static struct wb_endpoint *open_ep(const char *url, enum wb_role role, uint32_t rank)
{
    struct wb_endpoint_opts o = {
        .role = role, .rank = rank, .device = -1, .controller = url, .token = "at-tok"};
    struct wb_endpoint *ep = NULL;
    CHECK_INT(wb_endpoint_open(&o, &ep), 0);
    return ep;
}

static void set_mesh(struct wb_endpoint *ep)
{
    const char *names[] = {"pp", "tp"};
    const uint32_t sizes[] = {PP, TP};
    CHECK_INT(wb_endpoint_set_mesh(ep, 2, names, sizes), 0);
}

/* ---------------------------------------------------------------- the processes */

/* A mark between the processes: a file in the test's directory. */
static void mark_path(char *path, size_t cap, const char *what)
{
    snprintf(path, cap, "%s/%s", wb_test_tmpdir(), what);
}

/* Waits for a mark; the limit only ends a hang. */
static int await_mark(const char *what)
{
    char path[700];
    mark_path(path, sizeof(path), what);
    for (int i = 0; i < 30000; i++) {
        if (access(path, F_OK) == 0)
            return 0;
        usleep(10000);
    }
    fprintf(stderr, "no %s after 300 s\n", path);
    return 1;
}

/* With FAULT_MISSING only rank 1 is refused; the others start without waiting for the job to
 * be ready (it never is) and close once rank 1 has seen its refusal. */
static int start(struct wb_endpoint *ep, bool refused)
{
    if (g_fault != FAULT_MISSING || refused)
        return wb_endpoint_start(ep, 60ull * 1000000000);
    int rc = wb_endpoint_start(ep, 0);
    return rc ? rc : await_mark("refused");
}

/* Trainer rank r is at (pp r / TP, tp r % TP). Stage 0 holds the embedding's rows by tp rank,
 * stage 1 the whole norm. With FAULT_MISPLACED rank 2 (stage 1) also registers an embedding
 * shard "at 0"; with FAULT_MISSING rank 1 (stage 0) leaves its shard out. */
static int trainer_main(const char *url, uint32_t rank)
{
    uint32_t stage = rank / TP, tp = rank % TP;
    struct wb_endpoint *ep = open_ep(url, WB_ROLE_TRAINER, rank);
    set_mesh(ep);
    static uint16_t emb[ROWS / TP * COLS], norm[COLS];
    struct wb_tensor_reg e = {.name = NAMES[0], .dtype = WB_DTYPE_BF16, .ptr = emb};
    set_shape(0, &e.shape);
    e.box.ndim = 2;
    e.box.off[0] = tp * (ROWS / TP);
    e.box.ext[0] = ROWS / TP;
    e.box.ext[1] = COLS;
    const int32_t e_place[] = {wb_reg_at(0), 0};
    e.placement = e_place;
    struct wb_tensor_reg n = {.name = NAMES[1], .dtype = WB_DTYPE_BF16, .ptr = norm};
    set_shape(1, &n.shape);
    n.box.ndim = 1;
    n.box.ext[0] = COLS;
    const int32_t n_place[] = {wb_reg_at(1), WB_REG_REPLICATE};
    n.placement = n_place;
    bool reg_emb = stage == 0 ? !(g_fault == FAULT_MISSING && rank == 1)
                              : g_fault == FAULT_MISPLACED && rank == 2;
    if (reg_emb)
        CHECK_INT(wb_endpoint_add(ep, &e), 0);
    if (stage == 1)
        CHECK_INT(wb_endpoint_add(ep, &n), 0);
    int rc = start(ep, g_fault == FAULT_MISSING && rank == 1);
    if (g_fault != FAULT_NONE) {
        /* refused, every rank (misplaced) or the rank that left its shard out (missing) */
        const char *want =
            g_fault == FAULT_MISPLACED
                ? "trainer rank 2: model.embed_tokens.weight: placed at coordinate 0 of mesh dim "
                  "pp, but the rank is at coordinate 1 there; only the ranks at 0 register it"
                : "trainer rank 1: model.embed_tokens.weight: not registered (expected bf16 "
                  "[64, 32] box [32:64, 0:32])";
        if (g_fault == FAULT_MISSING && rank != 1) {
            wb_endpoint_close(ep);
            return rc;
        }
        if (rc != -WB_E_CONFIG || !strstr(wb_endpoint_error(ep), want)) {
            fprintf(stderr, "trainer %u: start returned %d (%s), expected a refusal with\n  %s\n",
                    rank, rc, wb_endpoint_error(ep), want);
            return 1;
        }
        if (g_fault == FAULT_MISSING) {
            char path[700];
            mark_path(path, sizeof(path), "refused");
            FILE *f = fopen(path, "w");
            CHECK(f != NULL);
            fclose(f);
        }
        wb_endpoint_close(ep);
        return 0;
    }
    if (rc) {
        fprintf(stderr, "trainer %u: start: %s: %s\n", rank, wb_strerror(rc),
                wb_endpoint_error(ep));
        return 1;
    }
    for (uint64_t v = 1; v <= VERSIONS; v++) {
        for (uint64_t i = 0; stage == 0 && i < (uint64_t)ROWS / TP * COLS; i++)
            emb[i] = value(v, 0, e.box.off[0] * COLS + i);
        for (uint64_t i = 0; stage == 1 && i < COLS; i++)
            norm[i] = value(v, 1, i);
        CHECK_INT(wb_endpoint_push(ep, v), 0);
        rc = wb_endpoint_wait_push(ep, v, WB_PUSH_DONE, 60ull * 1000000000);
        if (rc) {
            fprintf(stderr, "trainer %u: version %" PRIu64 ": %s: %s\n", rank, v, wb_strerror(rc),
                    wb_endpoint_error(ep));
            return 1;
        }
    }
    wb_endpoint_close(ep);
    return 0;
}

struct rollout {
    uint16_t *buf[2];
    uint64_t checked;
};

static int hook(void *arg, uint64_t version, char *err, size_t errcap)
{
    struct rollout *r = arg;
    for (unsigned t = 0; t < 2; t++)
        for (uint64_t i = 0; i < numel(t); i++)
            if (r->buf[t][i] != value(version, t, i)) {
                snprintf(err, errcap, "%s[%" PRIu64 "] = 0x%04x, version %" PRIu64 " wrote 0x%04x",
                         NAMES[t], i, r->buf[t][i], version, value(version, t, i));
                return 1;
            }
    r->checked++;
    return 0;
}

static int rollout_main(const char *url, uint32_t rank)
{
    (void)rank;
    struct wb_endpoint *ep = open_ep(url, WB_ROLE_ROLLOUT, 0);
    struct rollout r = {0};
    for (unsigned t = 0; t < 2; t++) {
        struct wb_tensor_reg reg = {.name = NAMES[t], .dtype = WB_DTYPE_BF16};
        set_shape(t, &reg.shape);
        reg.box.ndim = reg.shape.ndim;
        for (uint32_t d = 0; d < reg.shape.ndim; d++)
            reg.box.ext[d] = reg.shape.dim[d];
        CHECK((r.buf[t] = calloc(numel(t), 2)) != NULL);
        reg.ptr = r.buf[t];
        CHECK_INT(wb_endpoint_add(ep, &reg), 0);
    }
    wb_endpoint_set_hook(ep, hook, &r);
    int rc = start(ep, false);
    if (g_fault != FAULT_NONE) { /* refused with every agent (misplaced), or never ready */
        if (g_fault == FAULT_MISPLACED ? rc != -WB_E_CONFIG : rc != 0) {
            fprintf(stderr, "rollout: start returned %d (%s)\n", rc, wb_endpoint_error(ep));
            return 1;
        }
        wb_endpoint_close(ep);
        return 0;
    }
    rc = rc ? rc : wb_endpoint_wait(ep, VERSIONS, 120ull * 1000000000);
    if (rc) {
        fprintf(stderr, "rollout: %s: %s\n", wb_strerror(rc), wb_endpoint_error(ep));
        return 1;
    }
    CHECK_U64(wb_endpoint_version(ep), VERSIONS);
    wb_endpoint_close(ep);
    printf("rollout: %" PRIu64 " versions checked by the hook\n", r.checked);
    CHECK_U64(r.checked, VERSIONS);
    free(r.buf[0]);
    free(r.buf[1]);
    return 0;
}

static pid_t fork_role(int (*fn)(const char *, uint32_t), const char *url, uint32_t rank)
{
    fflush(NULL);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0)
        _exit(fn(url, rank));
    if (e2e_nchildren < E2E_MAX_CHILDREN)
        e2e_children[e2e_nchildren++] = pid;
    return pid;
}

/* ---------------------------------------------------------------- tests */

static void run(enum fault fault, unsigned salt)
{
    char url[96];
    g_fault = fault;
    write_job(url, sizeof(url), salt);
    pid_t ctl = start_controller();
    pid_t ro = fork_role(rollout_main, url, 0);
    pid_t tr[NTRAINERS];
    for (uint32_t r = 0; r < NTRAINERS; r++)
        tr[r] = fork_role(trainer_main, url, r);
    for (uint32_t r = 0; r < NTRAINERS; r++) {
        int st = e2e_wait(tr[r], 180000);
        if (st != 0)
            wb_test_fail(__FILE__, __LINE__, "trainer %u exited %d; controller log:\n%s", r, st,
                         e2e_slurp("controller.log"));
    }
    int st = e2e_wait(ro, 180000);
    if (st != 0)
        wb_test_fail(__FILE__, __LINE__, "rollout exited %d; controller log:\n%s", st,
                     e2e_slurp("controller.log"));
    if (fault == FAULT_NONE) {
        char *out;
        CHECK_INT(e2e_run(&out, "WB_TOKEN=at-tok wb-ctl -c %s --timeout 30s shutdown", url), 0);
        free(out);
        CHECK_INT(e2e_wait(ctl, 30000), 0);
    } else {
        kill(ctl, SIGTERM);
        e2e_wait(ctl, 30000);
    }
    g_fault = FAULT_NONE;
}

static void test_pp_tp(void)
{
    run(FAULT_NONE, 31);
}

static void test_misplaced(void)
{
    run(FAULT_MISPLACED, 32);
}

static void test_missing(void)
{
    run(FAULT_MISSING, 33);
}

/* What wb_endpoint_add() checks itself, with no controller. */
static void test_local_checks(void)
{
    struct wb_endpoint *ep = open_ep("tcp://127.0.0.1:1", WB_ROLE_TRAINER, 0);
    set_mesh(ep);
    static uint16_t norm[COLS];
    struct wb_tensor_reg n = {.name = NAMES[1], .dtype = WB_DTYPE_BF16, .ptr = norm};
    set_shape(1, &n.shape);
    n.box.ndim = 1;
    n.box.ext[0] = COLS;
    const int32_t past[] = {wb_reg_at(PP), WB_REG_REPLICATE};
    n.placement = past;
    CHECK_INT(wb_endpoint_add(ep, &n), -EINVAL);
    CHECK_STR(wb_endpoint_error(ep),
              "model.norm.weight: placement on mesh dim pp: at coordinate 2, but the dim has 2 "
              "(0..1)");
    const int32_t dim1[] = {WB_REG_REPLICATE, 1}; /* a 1-dim norm has no dim 1 */
    n.placement = dim1;
    CHECK_INT(wb_endpoint_add(ep, &n), -EINVAL);
    CHECK_STR(wb_endpoint_error(ep),
              "model.norm.weight: placement on mesh dim tp: 1 is neither replicate (-1), at a "
              "coordinate (-2 - i) nor a dim of the tensor");
    const int32_t ok[] = {wb_reg_at(PP - 1), WB_REG_REPLICATE};
    n.placement = ok;
    CHECK_INT(wb_endpoint_add(ep, &n), 0);
    CHECK_INT((int)wb_reg_at_index(wb_reg_at(7)), 7);
    CHECK_INT((int)wb_reg_at_index(WB_REG_REPLICATE), -1);
    CHECK_INT((int)wb_reg_at_index(0), -1);
    CHECK_INT((int)wb_reg_at_index(INT64_MIN), WB_REG_AT_MAX);
    wb_endpoint_close(ep);
}

const struct wb_test wb_tests[] = {
    {"local_checks", test_local_checks, 0},
    {"pp_tp", test_pp_tp, 240},
    {"misplaced", test_misplaced, 240},
    {"missing", test_missing, 240},
    {0},
};
