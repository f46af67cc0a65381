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
 *
 * Push policies, with version 1 held in flight by the rollout's hook until the trainers say
 * (a file each), so that the order of events is fixed, not timed: "latest" (the default) —
 * the trainers push 2..20 in a tight loop behind it; 2..19 are skipped on both ranks, each in
 * favour of the next, version 20 carries the list, and the rollout ends with version 20's
 * bytes — with rank 1 pushing only after rank 0 pushed past every version, and with both ranks
 * at once; "queue" — every version is transferred in order, each checked byte for byte;
 * ranks pushing with different policies — the second push is refused, naming both ranks.
 */
#include "agent/agent.h"
#include "tests/func/e2e_proc.h"

#include <sys/wait.h>

enum { ROWS = 64, COLS = 32, NTRAINERS = 2, VERSIONS = 3, LATEST_LAST = 20, QUEUE_LAST = 5 };

/* What the forked processes do (set before they fork). */
enum push_mode {
    MODE_WAIT,           /* each version pushed once the previous one completed */
    MODE_LATEST_ORDERED, /* latest wins; rank 1 pushes 2..20 after rank 0 pushed past them all */
    MODE_LATEST_ANY,     /* latest wins; both ranks push 2..20 at once */
    MODE_QUEUE,          /* policy queue: 2..5 pushed while the one before is in flight */
};
static enum push_mode g_mode = MODE_WAIT;

static uint64_t last_version(void)
{
    return g_mode == MODE_WAIT ? VERSIONS : g_mode == MODE_QUEUE ? QUEUE_LAST : LATEST_LAST;
}

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

/* Marks between the processes: files in the test's directory. */
static void mark_path(char *path, size_t cap, const char *what, uint32_t rank)
{
    snprintf(path, cap, "%s/%s.%u", wb_test_tmpdir(), what, rank);
}

static void mark(const char *what, uint32_t rank)
{
    char path[700];
    mark_path(path, sizeof(path), what, rank);
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    fclose(f);
}

/* Waits for a mark; the limit only ends a hang. */
static int await_mark(const char *what, uint32_t rank)
{
    char path[700];
    mark_path(path, sizeof(path), what, rank);
    for (int i = 0; i < 30000; i++) {
        if (access(path, F_OK) == 0)
            return 0;
        usleep(10000);
    }
    fprintf(stderr, "no %s after 300 s\n", path);
    return 1;
}

static void fill(uint16_t *buf[2], const struct wb_box box[2], uint64_t v)
{
    for (unsigned t = 0; t < 2; t++) {
        uint64_t row = t == 0 ? COLS : 1, first = box[t].off[0] * row;
        for (uint64_t i = 0; i < wb_box_numel(&box[t]); i++)
            buf[t][i] = value(v, t, first + i);
    }
}

/* The bytes a trainer rank holds of both tensors: every one is written once (one replica). */
static uint64_t rank_bytes(void)
{
    return ((uint64_t)ROWS * COLS + COLS) / NTRAINERS * 2;
}

static int push_failed(struct wb_endpoint *ep, uint32_t rank, uint64_t v, const char *what, int rc)
{
    fprintf(stderr, "trainer %u: version %" PRIu64 ": %s: %d (%s): %s\n", rank, v, what, rc,
            rc < 0 ? wb_strerror(rc) : "skipped", wb_endpoint_error(ep));
    return 1;
}

/* A trainer rank under policy latest: version 1 is held in flight (the rollout's hook waits
 * for the "pushed" marks); 2..LAST are pushed without waiting; the tensors hold LAST's values
 * from before 2 is pushed, and are not changed after. */
static int trainer_latest(struct wb_endpoint *ep, uint32_t rank, uint16_t *buf[2],
                          const struct wb_box box[2])
{
    const uint64_t last = LATEST_LAST, sec = 1000000000ull;
    fill(buf, box, 1);
    CHECK_INT(wb_endpoint_push(ep, 1), 0);
    int rc = wb_endpoint_wait_push(ep, 1, WB_PUSH_SOURCES, 60 * sec);
    if (rc)
        return push_failed(ep, rank, 1, "sources", rc);
    if (g_mode == MODE_LATEST_ORDERED && rank == 1 && await_mark("pushed", 0))
        return 1;
    fill(buf, box, last);
    for (uint64_t v = 2; v <= last; v++)
        CHECK_INT(wb_endpoint_push(ep, v), 0);
    /* decided while 1 is in flight: nothing newer can start before it completes */
    for (uint64_t v = 2; v < last; v++) {
        struct wb_push_stats ps;
        rc = wb_endpoint_wait_push(ep, v, WB_PUSH_SOURCES, 60 * sec);
        if (rc != WB_PUSH_SKIPPED)
            return push_failed(ep, rank, v, "sources (expected skipped)", rc);
        rc = wb_endpoint_wait_push(ep, v, WB_PUSH_DONE, 60 * sec);
        if (rc != WB_PUSH_SKIPPED)
            return push_failed(ep, rank, v, "done (expected skipped)", rc);
        CHECK_INT(wb_endpoint_push_stats(ep, v, &ps), 0);
        CHECK_U64(ps.version, v);
        CHECK_U64(ps.skipped_by, v + 1);
        CHECK_U64(ps.failed, 0);
        CHECK_U64(ps.bytes, 0);
        CHECK_U64(ps.nskipped, 0);
    }
    mark("pushed", rank);
    struct wb_push_stats ps;
    CHECK_INT(wb_endpoint_push_stats(ep, last, &ps), -EAGAIN); /* 1 is still in flight */
    rc = wb_endpoint_wait_push(ep, 1, WB_PUSH_DONE, 60 * sec);
    if (rc)
        return push_failed(ep, rank, 1, "done", rc);
    CHECK_INT(wb_endpoint_push_stats(ep, 1, &ps), 0);
    CHECK_U64(ps.skipped_by, 0);
    CHECK_U64(ps.nskipped, 0);
    CHECK_U64(ps.bytes, rank_bytes());
    rc = wb_endpoint_wait_push(ep, last, WB_PUSH_SOURCES, 60 * sec);
    rc = rc ? rc : wb_endpoint_wait_push(ep, last, WB_PUSH_DONE, 60 * sec);
    if (rc)
        return push_failed(ep, rank, last, "done", rc);
    CHECK_INT(wb_endpoint_push_stats(ep, last, &ps), 0);
    CHECK_U64(ps.version, last);
    CHECK_U64(ps.skipped_by, 0);
    CHECK_U64(ps.failed, 0);
    CHECK_U64(ps.nskipped, last - 2);
    for (uint64_t i = 0; i < last - 2; i++)
        CHECK_U64(ps.skipped[i], i + 2);
    CHECK_U64(ps.bytes, rank_bytes());
    CHECK(ps.writes > 0);
    CHECK(ps.xfer_ns > 0 && ps.total_ns >= ps.wait_ns && ps.stage_ns[WB_STAGE_WRITE] > 0);
    CHECK_U64(wb_endpoint_version(ep), last);
    printf("trainer %u: versions 2..%" PRIu64 " skipped, %" PRIu64 " complete: %" PRIu64
           " bytes, waited %.3f s, total %.3f s\n",
           rank, last - 1, last, ps.bytes, (double)ps.wait_ns / 1e9, (double)ps.total_ns / 1e9);
    return 0;
}

/* Policy queue: each version's values are written once the previous one's sources are free,
 * and pushed while it is still in flight (version 1 held until every rank pushed 2). */
static int trainer_queue(struct wb_endpoint *ep, uint32_t rank, uint16_t *buf[2],
                         const struct wb_box box[2])
{
    const uint64_t last = QUEUE_LAST, sec = 1000000000ull;
    CHECK_INT(wb_endpoint_set_push_policy(ep, WB_PUSH_QUEUE), 0);
    for (uint64_t v = 1; v <= last; v++) {
        fill(buf, box, v);
        CHECK_INT(wb_endpoint_push(ep, v), 0);
        if (v == 2)
            mark("pushed", rank);
        int rc = wb_endpoint_wait_push(ep, v, WB_PUSH_SOURCES, 60 * sec);
        if (rc)
            return push_failed(ep, rank, v, "sources", rc);
    }
    CHECK_INT(wb_endpoint_set_push_policy(ep, WB_PUSH_LATEST), -EBUSY);
    for (uint64_t v = 1; v <= last; v++) {
        struct wb_push_stats ps;
        int rc = wb_endpoint_wait_push(ep, v, WB_PUSH_DONE, 60 * sec);
        if (rc)
            return push_failed(ep, rank, v, "done", rc);
        CHECK_INT(wb_endpoint_push_stats(ep, v, &ps), 0);
        CHECK_U64(ps.skipped_by, 0);
        CHECK_U64(ps.nskipped, 0);
        CHECK_U64(ps.bytes, rank_bytes());
    }
    CHECK_U64(wb_endpoint_version(ep), last);
    return 0;
}

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
    if (g_mode == MODE_LATEST_ORDERED || g_mode == MODE_LATEST_ANY)
        rc = trainer_latest(ep, rank, buf, box);
    else if (g_mode == MODE_QUEUE)
        rc = trainer_queue(ep, rank, buf, box);
    for (uint64_t v = 1; !rc && g_mode == MODE_WAIT && v <= VERSIONS; v++) {
        fill(buf, box, v);
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
    return rc;
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
    /* the versions that reach the rollout: every one, or 1 and the last (latest wins) */
    uint64_t want = g_mode == MODE_LATEST_ORDERED || g_mode == MODE_LATEST_ANY
                        ? (r->last ? last_version() : 1)
                        : r->last + 1;
    if (version != want) {
        snprintf(err, errcap, "hook for version %" PRIu64 " after %" PRIu64, version, r->last);
        return 1;
    }
    /* version 1 stays in flight until every trainer pushed what it pushes behind it */
    for (uint32_t t = 0; version == 1 && g_mode != MODE_WAIT && t < NTRAINERS; t++)
        if (await_mark("pushed", t)) {
            snprintf(err, errcap, "trainer %u never said it pushed", t);
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
    rc = rc ? rc : wb_endpoint_wait(ep, last_version(), 120ull * 1000000000);
    if (rc) {
        fprintf(stderr, "rollout: %s: %s\n", wb_strerror(rc), wb_endpoint_error(ep));
        return 1;
    }
    CHECK_U64(wb_endpoint_version(ep), last_version());
    CHECK(!wb_endpoint_torn(ep));
    char err[256];
    if (check_bytes(&r, last_version(), err, sizeof(err))) {
        fprintf(stderr, "rollout: after the last version: %s\n", err);
        return 1;
    }
    wb_endpoint_close(ep);
    printf("rollout: %" PRIu64 " versions checked by the hook\n", r.checked);
    CHECK_U64(r.checked,
              g_mode == MODE_LATEST_ORDERED || g_mode == MODE_LATEST_ANY ? 2 : last_version());
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

static void run_versions(enum push_mode mode, unsigned salt)
{
    char url[96];
    g_mode = mode;
    write_job(url, sizeof(url), salt);
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
    g_mode = MODE_WAIT;
}

static void test_versions(void)
{
    run_versions(MODE_WAIT, 11);
}

/* Latest wins, rank 1 pushing 2..20 only after rank 0 pushed past every one of them (so it
 * pushes versions the controller skipped already), and both ranks at once. */
static void test_latest_ordered(void)
{
    run_versions(MODE_LATEST_ORDERED, 13);
}

static void test_latest_any(void)
{
    run_versions(MODE_LATEST_ANY, 14);
}

static void test_queue(void)
{
    run_versions(MODE_QUEUE, 15);
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

/* Trainer rank r of mixed_policies: rank 0 pushes with policy queue, rank 1 with latest. The
 * rank whose push reaches the controller second is refused, naming both; the other's push
 * stands (it waits for its peer), until both close. */
static int trainer_mixed(const char *url, uint32_t rank)
{
    struct wb_endpoint *ep = open_ep(url, WB_ROLE_TRAINER, rank);
    static uint16_t buf[2][ROWS * COLS];
    for (unsigned t = 0; t < 2; t++) {
        struct wb_tensor_reg reg = {.name = NAMES[t], .dtype = WB_DTYPE_BF16, .ptr = buf[t]};
        set_shape(t, &reg.shape);
        trainer_box(t, rank, &reg.box);
        CHECK_INT(wb_endpoint_add(ep, &reg), 0);
    }
    CHECK_INT(wb_endpoint_set_push_policy(ep, (enum wb_push_policy)7), -EINVAL);
    CHECK_INT(wb_endpoint_set_push_policy(ep, rank == 0 ? WB_PUSH_QUEUE : WB_PUSH_LATEST), 0);
    CHECK_INT(wb_endpoint_start(ep, 0), 0); /* no rollout: the job never becomes ready */
    CHECK_INT(wb_endpoint_push(ep, 1), 0);
    uint32_t other = 1 - rank;
    char want[300];
    snprintf(want, sizeof(want),
             "version 1 failed: push: trainer rank %u pushes with policy %s, trainer rank %u "
             "with %s; every trainer uses the same push policy",
             rank, rank == 0 ? "queue" : "latest", other, other == 0 ? "queue" : "latest");
    char path[700];
    mark_path(path, sizeof(path), "refused", other);
    for (int i = 0; i < 30000; i++) { /* the limit only ends a hang */
        int rc = wb_endpoint_wait_push(ep, 1, WB_PUSH_DONE, 10000000);
        if (rc == -WB_E_PEER) {
            CHECK_STR(wb_endpoint_error(ep), want);
            mark("refused", rank);
            wb_endpoint_close(ep);
            return 0;
        }
        CHECK_INT(rc, -ETIMEDOUT);
        if (access(path, F_OK) == 0) { /* the other was refused: this one still stands */
            CHECK_INT(wb_endpoint_wait_push(ep, 1, WB_PUSH_DONE, 0), -ETIMEDOUT);
            wb_endpoint_close(ep);
            return 0;
        }
    }
    fprintf(stderr, "trainer %u: neither push was refused in 300 s\n", rank);
    return 1;
}

static void test_mixed_policies(void)
{
    char url[96];
    write_job(url, sizeof(url), 16);
    pid_t ctl = start_controller();
    pid_t tr[NTRAINERS];
    for (uint32_t r = 0; r < NTRAINERS; r++)
        tr[r] = fork_role(trainer_mixed, url, r);
    for (uint32_t r = 0; r < NTRAINERS; r++)
        CHECK_INT(e2e_wait(tr[r], 120000), 0);
    char p0[700], p1[700];
    mark_path(p0, sizeof(p0), "refused", 0);
    mark_path(p1, sizeof(p1), "refused", 1);
    CHECK((access(p0, F_OK) == 0) + (access(p1, F_OK) == 0) == 1); /* exactly one refused */
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

static int no_read(void *arg, uint32_t thread, uint32_t index, uint64_t off, uint64_t len,
                   void *dst, char *msg, size_t msgcap)
{
    (void)arg, (void)thread, (void)index, (void)off, (void)len, (void)dst;
    snprintf(msg, msgcap, "not read in this test");
    return -EIO;
}

/* A sourced trainer's digests (one per tensor, wb_endpoint_source.digests): a count without
 * memory is refused at once, and a count that is not the tensors' at the start. */
static void test_source_digests(void)
{
    uint8_t dig[2][16] = {{1}, {2}};
    struct wb_endpoint *ep = open_ep("tcp://127.0.0.1:1", WB_ROLE_TRAINER, 0);
    struct wb_endpoint_source src = {.read = no_read, .id = "ckpt", .ndigests = 2};
    CHECK_INT(wb_endpoint_set_source(ep, &src), -EINVAL);
    CHECK_STR(wb_endpoint_error(ep), "source: digests for 2 tensors, and no memory holding them");
    src.digests = dig[0];
    CHECK_INT(wb_endpoint_set_source(ep, &src), 0);
    struct wb_tensor_reg reg = {.name = NAMES[0], .dtype = WB_DTYPE_BF16};
    set_shape(0, &reg.shape);
    trainer_box(0, 0, &reg.box);
    CHECK_INT(wb_endpoint_add(ep, &reg), 0);
    CHECK_INT(wb_endpoint_start(ep, 0), -EINVAL);
    CHECK_STR(wb_endpoint_error(ep), "source: digests for 2 tensors, 1 added");
    wb_endpoint_close(ep);
}

const struct wb_test wb_tests[] = {
    {"local_checks", test_local_checks, 0},
    {"source_digests", test_source_digests, 0},
    {"refused", test_refused, 90},
    {"versions", test_versions, 180},
    {"latest_ordered", test_latest_ordered, 180},
    {"latest_any", test_latest_any, 180},
    {"queue", test_queue, 180},
    {"mixed_policies", test_mixed_policies, 180},
    {0},
};
