/* harness_test.c — the test harness itself: a failed check ends the test with status 1 and
 * says where, a skip ends it with status 77 and prints "skipped: <reason>", and a test that
 * returns passes. Each case runs in a child so the outcomes can be observed. The whole harness
 * (main(): directories, cleanups, limits) is run on this binary's own hidden tests, the ones
 * named "_...", which run only when named. */
#include "tests/wbtest.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

static void failing_int(void *arg)
{
    (void)arg;
    CHECK_INT(2 + 2, 5);
}
static void failing_str(void *arg)
{
    (void)arg;
    CHECK_STR("abc", "abd");
}
static void skipping(void *arg)
{
    (void)arg;
    wb_test_skip("no GPU on this machine");
}
static void passing(void *arg)
{
    (void)arg;
    CHECK_U64(1ull << 40, 1099511627776ull);
}

static void test_failed_check_exits_1(void)
{
    char out[512];
    CHECK_INT(wb_test_capture(failing_int, NULL, out, sizeof(out)), 1);
    CHECK(strstr(out, "harness_test.c:") != NULL);
    CHECK(strstr(out, "2 + 2 == 4, expected 5 == 5") != NULL);
    CHECK_INT(wb_test_capture(failing_str, NULL, out, sizeof(out)), 1);
    CHECK(strstr(out, "\"abc\"\n      expected \"abd\"") != NULL);
}

static void test_skip_exits_77(void)
{
    char out[512];
    CHECK_INT(wb_test_capture(skipping, NULL, out, sizeof(out)), 77);
    CHECK_STR(out, "skipped: no GPU on this machine\n");
}

static void test_pass_exits_0(void)
{
    char out[64];
    CHECK_INT(wb_test_capture(passing, NULL, out, sizeof(out)), 0);
    CHECK_STR(out, "");
}

/* ---------------------------------------------------------------- hidden: run by name below */

static void mark(void)
{
    const char *m = getenv("WB_HARNESS_MARK");
    FILE *f = m ? fopen(m, "w") : NULL;
    if (f)
        fclose(f);
}

/* Leaves a file in its directory and a cleanup registered, then ends as `how` says. */
static void with_tmp(const char *how)
{
    wb_test_write_file("left.txt", "something the test made\n");
    wb_test_cleanup(mark);
    if (strcmp(how, "fail") == 0)
        CHECK_INT(1, 2);
    if (strcmp(how, "skip") == 0)
        wb_test_skip("nothing to run here");
    if (strcmp(how, "hang") == 0)
        for (;;)
            pause();
}
static void hidden_fail(void)
{
    with_tmp("fail");
}
static void hidden_skip(void)
{
    with_tmp("skip");
}
static void hidden_hang(void)
{
    with_tmp("hang");
}
static void hidden_pass(void)
{
    with_tmp("pass");
}
static void hidden_sleep(void)
{
    sleep(2);
}

/* ---------------------------------------------------------------- the harness, run whole */

struct self {
    const char *test, *tmp, *mark, *scale, *keep;
};

static void run_self(void *arg)
{
    const struct self *s = arg;
    setenv("TMPDIR", s->tmp, 1);
    setenv("WB_HARNESS_MARK", s->mark, 1);
    if (s->scale)
        setenv("WB_TEST_TIME_SCALE", s->scale, 1);
    else
        unsetenv("WB_TEST_TIME_SCALE");
    if (s->keep)
        setenv("WB_TEST_KEEP", s->keep, 1);
    else
        unsetenv("WB_TEST_KEEP");
    execl("/proc/self/exe", "harness", s->test, (char *)NULL);
    _exit(127);
}

static bool empty_dir(const char *path)
{
    DIR *d = opendir(path);
    CHECK(d != NULL);
    struct dirent *e;
    bool empty = true;
    while ((e = readdir(d)))
        empty &= strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0;
    closedir(d);
    return empty;
}

/* Runs hidden test `name` in this binary (TMPDIR a fresh folder); returns its exit status and
 * output; *left says whether its directory is still there, *cleaned whether its cleanup ran. */
static int harness(const char *name, const char *scale, const char *keep, char *out, size_t cap,
                   bool *left, bool *cleaned)
{
    static int runs;
    char tmp[700], mk[700];
    runs++;
    snprintf(tmp, sizeof(tmp), "%s/%s.%d", wb_test_tmpdir(), name, runs);
    snprintf(mk, sizeof(mk), "%s/%s.%d.mark", wb_test_tmpdir(), name, runs);
    CHECK_INT(mkdir(tmp, 0755), 0);
    struct self s = {name, tmp, mk, scale, keep};
    int rc = wb_test_capture(run_self, &s, out, cap);
    *left = !empty_dir(tmp);
    *cleaned = access(mk, F_OK) == 0;
    return rc;
}

/* Whatever the outcome, the test's directory goes; its cleanups run unless it was killed. */
static void test_tmpdir_removed(void)
{
    char out[2048];
    bool left, cleaned;
    CHECK_INT(harness("_fail", NULL, NULL, out, sizeof(out), &left, &cleaned), 1);
    CHECK(strstr(out, "FAIL harness _fail (") && strstr(out, "\n0 passed, 1 failed, 0 skipped\n"));
    CHECK(!left && cleaned);
    CHECK_INT(harness("_skip", NULL, NULL, out, sizeof(out), &left, &cleaned), 0);
    CHECK(strstr(out, "skipped: nothing to run here\nSKIP harness _skip ("));
    CHECK(!left && cleaned);
    CHECK_INT(harness("_hang", NULL, NULL, out, sizeof(out), &left, &cleaned), 1);
    CHECK(strstr(out, "    timed out after 1 s\nFAIL harness _hang ("));
    CHECK(!left && !cleaned);
    CHECK_INT(harness("_pass", NULL, NULL, out, sizeof(out), &left, &cleaned), 0);
    CHECK(strstr(out, "ok harness _pass (") && strstr(out, "\n1 passed, 0 failed, 0 skipped\n"));
    CHECK(!left && cleaned);
    /* WB_TEST_KEEP=1 keeps a failed test's folder, for its logs, and says where */
    CHECK_INT(harness("_fail", NULL, "1", out, sizeof(out), &left, &cleaned), 1);
    CHECK(strstr(out, "\n    kept: ") != NULL);
    CHECK(left && cleaned);
}

/* $WB_TEST_TIME_SCALE stretches every limit: a test of 2 s with a limit of 1 s passes at 3x. */
static void test_time_scale(void)
{
    char out[2048];
    bool left, cleaned;
    CHECK_INT(harness("_sleep", NULL, NULL, out, sizeof(out), &left, &cleaned), 1);
    CHECK(strstr(out, "    timed out after 1 s\n"));
    CHECK_INT(harness("_sleep", "3", NULL, out, sizeof(out), &left, &cleaned), 0);
    CHECK(strstr(out, "\n1 passed, 0 failed, 0 skipped\n"));
}

/* Hidden tests are neither listed nor run unless named. */
static void list_self(void *arg)
{
    (void)arg;
    execl("/proc/self/exe", "harness", "-l", (char *)NULL);
    _exit(127);
}

static void test_hidden_not_listed(void)
{
    char out[2048];
    CHECK_INT(wb_test_capture(list_self, NULL, out, sizeof(out)), 0);
    CHECK(strstr(out, "pass_exits_0\n") != NULL);
    CHECK(strstr(out, "\n_") == NULL && out[0] != '_'); /* no name starts with '_' */
}

const struct wb_test wb_tests[] = {
    {"failed_check_exits_1", test_failed_check_exits_1, 0},
    {"skip_exits_77", test_skip_exits_77, 0},
    {"pass_exits_0", test_pass_exits_0, 0},
    {"tmpdir_removed", test_tmpdir_removed, 0},
    {"time_scale", test_time_scale, 0},
    {"hidden_not_listed", test_hidden_not_listed, 0},
    {"_fail", hidden_fail, 0},
    {"_skip", hidden_skip, 0},
    {"_hang", hidden_hang, 1},
    {"_pass", hidden_pass, 0},
    {"_sleep", hidden_sleep, 1},
    {0},
};
