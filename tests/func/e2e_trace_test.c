/* e2e_trace_test.c — the agents' Chrome traces with real processes: wb-controller, 4 trainer and
 * 2 rollout wb-agents over libfabric (the demo job, e2e_cluster.h) with the job's trace: key.
 * Five versions with trace_keep: 3 leave exactly the files of versions 3, 4 and 5 of every agent;
 * each is valid JSON whose events carry their version, the trainers' events together name every
 * trainer tensor of the model, each rollout's "landed" events name exactly the tensors its dump
 * holds, and each rollout shows its writers, its checksum batches and its version. A trace
 * directory that cannot be used is a warning naming it, and the transfers go on. Timing never
 * decides a result. */
#include <dirent.h>
#include <jansson.h>

#include "planner/planner.h"
#include "tests/func/e2e_cluster.h"

/* A set of names (the demo's are a few dozen). */
struct names {
    char **s;
    size_t n;
};

static bool names_has(const struct names *ns, const char *s)
{
    for (size_t i = 0; i < ns->n; i++)
        if (!strcmp(ns->s[i], s))
            return true;
    return false;
}

static void names_add(struct names *ns, const char *s)
{
    if (names_has(ns, s))
        return;
    ns->s = realloc(ns->s, (ns->n + 1) * sizeof(char *));
    CHECK(ns->s != NULL);
    ns->s[ns->n++] = strdup(s);
}

static void names_free(struct names *ns)
{
    for (size_t i = 0; i < ns->n; i++)
        free(ns->s[i]);
    free(ns->s);
    memset(ns, 0, sizeof(*ns));
}

/* a and b hold the same names; else the test fails naming one that differs. */
static void names_same(const struct names *a, const struct names *b, const char *what)
{
    for (size_t i = 0; i < a->n; i++)
        if (!names_has(b, a->s[i]))
            wb_test_fail(__FILE__, __LINE__, "%s: %s is in the trace, not expected", what, a->s[i]);
    for (size_t i = 0; i < b->n; i++)
        if (!names_has(a, b->s[i]))
            wb_test_fail(__FILE__, __LINE__, "%s: %s expected, not in the trace", what, b->s[i]);
}

/* The demo model's inventories (the job's rules and config.json). */
static void load_model(struct cluster *c, struct wb_model *md)
{
    struct refjob rj;
    ref_open(c, &rj);
    struct wb_model_src src = {.rules = rj.job.model.rules, .config = rj.job.model.hf_config};
    CHECK_INT(wb_model_load(&src, md, &rj.el), 0);
    ref_close(&rj);
}

/* The rollout tensors rollout `rank`'s dump of version v holds, by name (those with bytes). */
static void dump_names(struct cluster *c, const struct wb_model *md, int rank, uint64_t v,
                       struct names *out)
{
    char path[700];
    snprintf(path, sizeof(path), "%s/rollout%d.v%" PRIu64 ".bin", c->dump, rank, v);
    FILE *f = fopen(path, "rb");
    CHECK(f != NULL);
    char magic[8];
    uint32_t n;
    CHECK_INT(fread(magic, 1, 8, f) == 8 && fread(&n, 4, 1, f) == 1, 1);
    for (uint32_t i = 0; i < n; i++) {
        uint32_t tensor;
        uint64_t bytes;
        CHECK_INT(fread(&tensor, 4, 1, f) == 1 && fread(&bytes, 8, 1, f) == 1, 1);
        CHECK(tensor < md->rollout.n);
        if (bytes)
            names_add(out, md->rollout.p[tensor].name);
        CHECK_INT(fseek(f, (long)bytes, SEEK_CUR), 0);
    }
    fclose(f);
}

static json_t *load_trace(const char *dir, const char *role, int rank, uint64_t v)
{
    char path[800];
    snprintf(path, sizeof(path), "%s/%s%d.v%" PRIu64 ".json", dir, role, rank, v);
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    if (!root)
        wb_test_fail(__FILE__, __LINE__, "%s:%d: %s", path, je.line, je.text);
    json_t *od = json_object_get(root, "otherData");
    CHECK_STR(json_string_value(json_object_get(od, "role")), role);
    CHECK_INT(json_integer_value(json_object_get(od, "rank")), rank);
    CHECK_U64(json_integer_value(json_object_get(od, "version")), v);
    CHECK_STR(json_string_value(json_object_get(od, "outcome")), "complete");
    CHECK_STR(json_string_value(json_object_get(od, "job")), "xfer");
    CHECK_INT(json_integer_value(json_object_get(od, "events_dropped")), 0);
    return root;
}

/* Every event of a trace: its version, its pid, its tensors (args.tensors: 1 to 4 names, and
 * ntensors at least as many). */
static void each_event(json_t *root, int64_t pid, uint64_t v,
                       void (*fn)(json_t *e, const char *cat, json_t *args, void *arg), void *arg)
{
    json_t *ev = json_object_get(root, "traceEvents");
    CHECK(json_is_array(ev));
    size_t i;
    json_t *e;
    json_array_foreach(ev, i, e)
    {
        const char *ph = json_string_value(json_object_get(e, "ph"));
        CHECK(ph != NULL);
        CHECK_INT(json_integer_value(json_object_get(e, "pid")), pid);
        if (!strcmp(ph, "M"))
            continue;
        CHECK(!strcmp(ph, "X") || !strcmp(ph, "i"));
        json_t *args = json_object_get(e, "args");
        CHECK_U64(json_integer_value(json_object_get(args, "version")), v);
        json_t *t = json_object_get(args, "tensors");
        if (t) {
            CHECK(json_array_size(t) >= 1 && json_array_size(t) <= 4);
            CHECK(json_integer_value(json_object_get(args, "ntensors")) >=
                  (json_int_t)json_array_size(t));
        }
        const char *cat = json_string_value(json_object_get(e, "cat"));
        CHECK(cat != NULL);
        fn(e, cat, args, arg);
    }
}

static void trainer_event(json_t *e, const char *cat, json_t *args, void *arg)
{
    struct names *seen = arg;
    bool stage = !strcmp(cat, "version");
    for (int s = 0; s < WB_STAGE_COUNT; s++)
        stage |= !strcmp(cat, wb_stage_name((enum wb_stage)s));
    if (!stage)
        wb_test_fail(__FILE__, __LINE__, "a trainer event of category %s", cat);
    CHECK(json_number_value(json_object_get(e, "dur")) >= 0);
    size_t i;
    json_t *t;
    json_array_foreach(json_object_get(args, "tensors"), i, t)
        names_add(seen, json_string_value(t));
}

struct rollout_seen {
    struct names landed;
    unsigned writers, checked; /* a bit per trainer rank */
    unsigned versions, checks;
    uint64_t v;
};

static void rollout_event(json_t *e, const char *cat, json_t *args, void *arg)
{
    struct rollout_seen *rs = arg;
    const char *name = json_string_value(json_object_get(e, "name"));
    const char *ph = json_string_value(json_object_get(e, "ph"));
    if (!strcmp(cat, "landed")) {
        CHECK_STR(ph, "i");
        json_t *t = json_object_get(args, "tensors");
        CHECK_INT(json_array_size(t), 1);
        CHECK_STR(name, json_string_value(json_array_get(t, 0)));
        names_add(&rs->landed, name);
    } else if (!strcmp(cat, "writes")) {
        json_int_t r = json_integer_value(json_object_get(args, "trainer"));
        CHECK(r >= 0 && r < NTR);
        char want[48];
        if (!strcmp(ph, "X")) {
            snprintf(want, sizeof(want), "trainer %d", (int)r);
            CHECK_STR(name, want);
            CHECK(json_integer_value(json_object_get(args, "notes")) > 0);
            rs->writers |= 1u << r;
        } else {
            snprintf(want, sizeof(want), "trainer %d checked", (int)r);
            CHECK_STR(name, want);
            rs->checked |= 1u << r;
        }
    } else if (!strcmp(cat, "check")) {
        CHECK_STR(ph, "X");
        CHECK(json_integer_value(json_object_get(args, "bytes")) > 0);
        rs->checks++;
    } else if (!strcmp(cat, "version")) {
        char want[48];
        snprintf(want, sizeof(want), "version %" PRIu64, rs->v);
        if (!strcmp(name, want)) {
            CHECK_STR(json_string_value(json_object_get(args, "outcome")), "complete");
            CHECK_U64(json_integer_value(json_object_get(args, "bytes")), DEMO_RECV);
            rs->versions++;
        } else {
            CHECK_STR(name, "windows open, writers told");
        }
    } else {
        wb_test_fail(__FILE__, __LINE__, "a rollout event of category %s", cat);
    }
}

/* trace: DIR, trace_keep: 3, checksums on: five versions, each verified; once every agent
 * exited (a file is written after its version's report), DIR holds exactly versions 3-5 of
 * each agent, and their events say what moved. */
static void test_ring(void)
{
    char dir[700], extra[900];
    snprintf(dir, sizeof(dir), "%s/traces", wb_test_tmpdir());
    CHECK_INT(mkdir(dir, 0755), 0);
    snprintf(extra, sizeof(extra), "trace: %s\ntrace_keep: 3\nverify: true\n", dir);
    struct cluster c = {.provider = "tcp", .domain = "lo", .job_extra = extra, .job_trace = true};
    snprintf(c.url, sizeof(c.url), "tcp://127.0.0.1:%u", e2e_port(41));
    write_job(&c, "auto", "4MiB", false);
    start(&c, NULL);
    for (uint64_t v = 1; v <= 5; v++)
        transfer_ok(&c, v, NULL);
    stop(&c);

    /* the files: versions 3, 4 and 5 of every agent, nothing else (no temporary file left) */
    struct names files = {0}, want = {0};
    DIR *d = opendir(dir);
    CHECK(d != NULL);
    struct dirent *de;
    while ((de = readdir(d)) != NULL)
        if (strcmp(de->d_name, ".") && strcmp(de->d_name, ".."))
            names_add(&files, de->d_name);
    closedir(d);
    for (int i = 0; i < NTR + NRO; i++)
        for (int v = 3; v <= 5; v++) {
            char f[64];
            snprintf(f, sizeof(f), "%s%d.v%d.json", i < NTR ? "trainer" : "rollout",
                     i < NTR ? i : i - NTR, v);
            names_add(&want, f);
        }
    names_same(&files, &want, dir);
    CHECK_INT(files.n, 18);
    names_free(&files);
    names_free(&want);

    struct wb_model md;
    load_model(&c, &md);
    for (uint64_t v = 3; v <= 5; v++) {
        /* the trainers' events together name every trainer tensor of the model */
        struct names seen = {0}, all = {0};
        for (int r = 0; r < NTR; r++) {
            json_t *root = load_trace(dir, "trainer", r, v);
            each_event(root, r, v, trainer_event, &seen);
            json_decref(root);
        }
        for (size_t i = 0; i < md.trainer.n; i++)
            names_add(&all, md.trainer.p[i].name);
        names_same(&seen, &all, "the trainers' tensors");
        names_free(&seen);
        names_free(&all);
        /* each rollout: a landed event per tensor its dump holds, every writer's notes and
         * checks, checksum batches, its version */
        for (int r = 0; r < NRO; r++) {
            struct rollout_seen rs = {.v = v};
            struct names held = {0};
            json_t *root = load_trace(dir, "rollout", r, v);
            each_event(root, 100000 + r, v, rollout_event, &rs);
            json_decref(root);
            dump_names(&c, &md, r, v, &held);
            names_same(&rs.landed, &held, "a rollout's landed tensors");
            CHECK_INT(rs.writers, (1u << NTR) - 1);
            CHECK_INT(rs.checked, (1u << NTR) - 1);
            CHECK_INT(rs.versions, 1);
            CHECK(rs.checks >= 1);
            names_free(&rs.landed);
            names_free(&held);
        }
    }
    wb_model_free(&md);
}

/* A trace directory that is missing: every agent says so once, naming it, and writes nothing;
 * the transfer completes and verifies. A --trace that names a file is refused by wb-agent
 * before it starts. */
static void test_bad_dir(void)
{
    char dir[700], extra[900], *out;
    snprintf(dir, sizeof(dir), "%s/missing", wb_test_tmpdir());
    snprintf(extra, sizeof(extra), "trace: %s\n", dir);
    struct cluster c = {.provider = "tcp", .domain = "lo", .job_extra = extra, .job_trace = true};
    snprintf(c.url, sizeof(c.url), "tcp://127.0.0.1:%u", e2e_port(43));
    write_job(&c, "auto", "4MiB", false);
    start(&c, NULL);
    transfer_ok(&c, 1, NULL);
    stop(&c);
    for (int i = 0; i < NTR + NRO; i++) {
        char log[32], line[900];
        snprintf(log, sizeof(log), "agent%d.log", i);
        snprintf(line, sizeof(line),
                 "wb warn agent: %s rank %d: trace directory %s: No such file or directory; no "
                 "traces are written\n",
                 i < NTR ? "trainer" : "rollout", i < NTR ? i : i - NTR, dir);
        out = e2e_slurp(log);
        CHECK_CONTAINS(out, line);
        free(out);
    }
    struct stat st;
    CHECK(stat(dir, &st) != 0 && errno == ENOENT);

    const char *file = wb_test_write_file("not-a-dir", "x\n");
    CHECK_INT(
        e2e_run(&out, "wb-agent --role trainer --rank 0 --controller %s --trace %s", c.url, file),
        2);
    char want[900];
    snprintf(want, sizeof(want),
             "wb-agent: --trace %s: Not a directory (a directory to write traces into)\n", file);
    CHECK_STR(out, want);
    free(out);
}

const struct wb_test wb_tests[] = {
    {"ring", test_ring, 180},
    {"bad_dir", test_bad_dir, 120},
    {0},
};
