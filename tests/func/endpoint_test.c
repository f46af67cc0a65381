/* endpoint_test.c — the endpoint API (agent/agent.h) from C, as a trainer or an engine links it:
 * a real wb-controller and real processes, each opening an endpoint with wb_endpoint_open() and
 * registering tensors it holds in its own host memory (tests/python covers the same calls
 * through ctypes). Two trainer ranks (FSDP 2, shard(0)) hold halves of a BF16 embedding and of
 * a norm; one rollout rank holds both whole; the trainers push three versions, changing their
 * values after each version's WB_PUSH_SOURCES, and the rollout's post-update hook checks every
 * byte of every version against the values written here (independently of the planner), before
 * the version is reported complete. Also: a registration the controller refuses comes back from
 * wb_endpoint_start() as -WB_E_CONFIG naming the tensor, and the checks wb_endpoint_add() makes
 * itself return their exact errors.
 */
#include "agent/agent.h"
#include "tests/func/e2e_proc.h"

#include <sys/wait.h>

enum { ROWS = 64, COLS = 32, NTRAINERS = 2, VERSIONS = 3 };

static const char *const NAMES[] = {"model.embed_tokens.weight", "model.norm.weight"};

/* The BF16 bits of element i of tensor t at version v: finite, and different for every
 * version, tensor and element within a row of the test. */
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

/* The rows (dim 0) trainer rank r holds of tensor t: shard(0) over 2 ranks. */
static void trainer_box(unsigned t, uint32_t r, struct wb_box *b)
{
    struct wb_shape s;
    set_shape(t, &s);
    memset(b, 0, sizeof(*b));
    b->ndim = s.ndim;
    for (uint32_t d = 0; d < s.ndim; d++)
        b->ext[d] = s.dim[d];
    b->ext[0] = s.dim[0] / NTRAINERS;
    b->off[0] = r * b->ext[0];
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
    wb_test_write_file("trainer.yaml", "world_size: 2\ngpus_per_node: 2\n"
                                       "mesh:\n  - {name: fsdp, size: 2}\n"
                                       "placements:\n  - match: \"*\"\n"
                                       "    place: {fsdp: shard(0)}\n");
    wb_test_write_file("rollout.yaml", "replicas: 1\ngpus_per_replica: 1\ntp: 1\n"
                                       "gpus_per_node: 1\n");
    snprintf(text, sizeof(text),
             "name: endpoint\nlisten: %s\ntoken: ep-tok\n"
             "model:\n  rules: %s/configs/models/qwen3_moe.yaml\n"
             "  trainer_inventory: trainer_inv.yaml\n  rollout_inventory: rollout_inv.yaml\n"
             "trainer_layout: trainer.yaml\nrollout_layout: rollout.yaml\n"
             "mode: auto\nmem_cap: 1MiB\nprovider: tcp\nheartbeat: 200ms\n",
             url, cwd);
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
        .role = role, .rank = rank, .device = -1, .controller = url, .token = "ep-tok"};
    struct wb_endpoint *ep = NULL;
    CHECK_INT(wb_endpoint_open(&o, &ep), 0);
    return ep;
}

/* ---------------------------------------------------------------- the processes */

/* A trainer rank: registers its shards, pushes every version, refilling after SOURCES. */
static int trainer_main(const char *url, uint32_t rank)
{
    struct wb_endpoint *ep = open_ep(url, WB_ROLE_TRAINER, rank);
    uint16_t *buf[2];
    struct wb_box box[2];
    for (unsigned t = 0; t < 2; t++) {
        trainer_box(t, rank, &box[t]);
        CHECK((buf[t] = malloc(wb_box_numel(&box[t]) * 2)) != NULL);
    }
    for (unsigned t = 0; t < 2; t++) {
        struct wb_tensor_reg reg = {.name = NAMES[t], .dtype = WB_DTYPE_BF16, .box = box[t]};
        set_shape(t, &reg.shape);
        reg.ptr = buf[t];
        CHECK_INT(wb_endpoint_add(ep, &reg), 0);
    }
    int rc = wb_endpoint_start(ep, 30ull * 1000000000);
    if (rc) {
        fprintf(stderr, "trainer %u: start: %s: %s\n", rank, wb_strerror(rc),
                wb_endpoint_error(ep));
        return 1;
    }
    for (uint64_t v = 1; v <= VERSIONS; v++) {
        for (unsigned t = 0; t < 2; t++) {
            uint64_t row = t == 0 ? COLS : 1, first = box[t].off[0] * row;
            for (uint64_t i = 0; i < wb_box_numel(&box[t]); i++)
                buf[t][i] = value(v, t, first + i);
        }
        CHECK_INT(wb_endpoint_push(ep, v), 0);
        rc = wb_endpoint_wait_push(ep, v, WB_PUSH_SOURCES, 30ull * 1000000000);
        rc = rc ? rc : wb_endpoint_wait_push(ep, v, WB_PUSH_DONE, 30ull * 1000000000);
        if (rc) {
            fprintf(stderr, "trainer %u: version %" PRIu64 ": %s: %s\n", rank, v, wb_strerror(rc),
                    wb_endpoint_error(ep));
            return 1;
        }
        CHECK_U64(wb_endpoint_version(ep), v);
    }
    wb_endpoint_close(ep);
    free(buf[0]);
    free(buf[1]);
    return 0;
}

struct rollout {
    uint16_t *buf[2];
    uint64_t checked; /* versions the hook found exact */
    uint64_t last;
};

/* Every byte of both tensors against the values of `version`. */
static int check_bytes(const struct rollout *r, uint64_t version, char *err, size_t errcap)
{
    for (unsigned t = 0; t < 2; t++)
        for (uint64_t i = 0; i < numel(t); i++)
            if (r->buf[t][i] != value(version, t, i)) {
                snprintf(err, errcap, "%s[%" PRIu64 "] = 0x%04x, version %" PRIu64 " wrote 0x%04x",
                         NAMES[t], i, r->buf[t][i], version, value(version, t, i));
                return 1;
            }
    return 0;
}

static int hook(void *arg, uint64_t version, char *err, size_t errcap)
{
    struct rollout *r = arg;
    if (version != r->last + 1) {
        snprintf(err, errcap, "hook for version %" PRIu64 " after %" PRIu64, version, r->last);
        return 1;
    }
    r->last = version;
    if (check_bytes(r, version, err, errcap))
        return 1;
    r->checked++;
    return 0;
}

static int rollout_main(const char *url)
{
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
    int rc = wb_endpoint_start(ep, 30ull * 1000000000);
    rc = rc ? rc : wb_endpoint_wait(ep, VERSIONS, 60ull * 1000000000);
    if (rc) {
        fprintf(stderr, "rollout: %s: %s\n", wb_strerror(rc), wb_endpoint_error(ep));
        return 1;
    }
    CHECK_U64(wb_endpoint_version(ep), VERSIONS);
    CHECK(!wb_endpoint_torn(ep));
    char err[256];
    if (check_bytes(&r, VERSIONS, err, sizeof(err))) {
        fprintf(stderr, "rollout: after the last version: %s\n", err);
        return 1;
    }
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

static int rollout_role(const char *url, uint32_t rank)
{
    (void)rank;
    return rollout_main(url);
}

/* ---------------------------------------------------------------- tests */

static void test_versions(void)
{
    char url[96];
    write_job(url, sizeof(url), 11);
    pid_t ctl = start_controller();
    pid_t ro = fork_role(rollout_role, url, 0);
    pid_t tr[NTRAINERS];
    for (uint32_t r = 0; r < NTRAINERS; r++)
        tr[r] = fork_role(trainer_main, url, r);
    int st[NTRAINERS + 1];
    for (uint32_t r = 0; r < NTRAINERS; r++)
        st[r] = e2e_wait(tr[r], 120000);
    st[NTRAINERS] = e2e_wait(ro, 120000);
    for (uint32_t r = 0; r <= NTRAINERS; r++)
        if (st[r] != 0)
            wb_test_fail(__FILE__, __LINE__, "%s %u exited %d; controller log:\n%s",
                         r < NTRAINERS ? "trainer" : "rollout", r < NTRAINERS ? r : 0, st[r],
                         e2e_slurp("controller.log"));
    char *out;
    CHECK_INT(e2e_run(&out, "WB_TOKEN=ep-tok wb-ctl -c %s --timeout 30s shutdown", url), 0);
    free(out);
    CHECK_INT(e2e_wait(ctl, 30000), 0);
}

/* A trainer registering a norm of the wrong shape is refused, with the tensor named. */
static void test_refused(void)
{
    char url[96];
    write_job(url, sizeof(url), 12);
    pid_t ctl = start_controller();
    struct wb_endpoint *ep = open_ep(url, WB_ROLE_TRAINER, 0);
    static uint16_t buf[COLS];
    struct wb_tensor_reg reg = {.name = NAMES[1], .dtype = WB_DTYPE_BF16, .ptr = buf};
    reg.shape.ndim = reg.box.ndim = 1;
    reg.shape.dim[0] = 2 * COLS; /* the inventory says COLS */
    reg.box.ext[0] = COLS;
    CHECK_INT(wb_endpoint_add(ep, &reg), 0);
    int rc = wb_endpoint_start(ep, 30ull * 1000000000);
    CHECK_INT(rc, -WB_E_CONFIG);
    CHECK_CONTAINS(wb_endpoint_error(ep), NAMES[1]);
    CHECK_CONTAINS(wb_endpoint_error(ep), "embed_tokens"); /* missing: refused together */
    wb_endpoint_close(ep);
    kill(ctl, SIGTERM);
    e2e_wait(ctl, 30000);
}

/* What wb_endpoint_add() and wb_endpoint_open() check themselves, with no controller. */
static void test_local_checks(void)
{
    struct wb_endpoint_opts bad = {
        .role = WB_ROLE_TRAINER, .device = -1, .controller = "nowhere", .token = "t"};
    struct wb_endpoint *ep = NULL;
    CHECK_INT(wb_endpoint_open(&bad, &ep), -EINVAL);
    CHECK(ep == NULL);
    ep = open_ep("tcp://127.0.0.1:1", WB_ROLE_TRAINER, 0);
    static uint16_t buf[ROWS * COLS];
    struct wb_tensor_reg reg = {.name = NAMES[0], .dtype = WB_DTYPE_BF16, .ptr = buf};
    set_shape(0, &reg.shape);
    trainer_box(0, 0, &reg.box);
    CHECK_INT(wb_endpoint_add(ep, &reg), 0);
    CHECK_INT(wb_endpoint_add(ep, &reg), -EEXIST);
    CHECK_CONTAINS(wb_endpoint_error(ep), NAMES[0]);
    struct wb_tensor_reg out = reg;
    out.name = NAMES[1];
    set_shape(1, &out.shape);
    out.box.ndim = 1;
    out.box.off[0] = 1;
    out.box.ext[0] = COLS; /* one past the end */
    CHECK_INT(wb_endpoint_add(ep, &out), -EINVAL);
    CHECK_CONTAINS(wb_endpoint_error(ep), NAMES[1]);
    struct wb_tensor_reg null = reg;
    null.name = "lm_head.weight";
    null.ptr = NULL;
    CHECK_INT(wb_endpoint_add(ep, &null), -EINVAL);
    CHECK_CONTAINS(wb_endpoint_error(ep), "lm_head.weight");
    wb_endpoint_close(ep);
}

const struct wb_test wb_tests[] = {
    {"local_checks", test_local_checks, 0},
    {"refused", test_refused, 90},
    {"versions", test_versions, 180},
    {0},
};
