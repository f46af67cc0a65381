/* harness_test.c — the test harness itself: a failed check ends the test with status 1 and
 * says where, a skip ends it with status 77 and prints "skipped: <reason>", and a test that
 * returns passes. Each case runs in a child so the outcomes can be observed. */
#include "tests/wbtest.h"

#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

/* Runs fn in a child with stdout+stderr into a pipe; returns the exit status and the output. */
static int run_child(void (*fn)(void), char *out, size_t cap)
{
    int fds[2];
    CHECK_INT(pipe(fds), 0);
    fflush(NULL);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        dup2(fds[1], 1);
        dup2(fds[1], 2);
        fn();
        _exit(0);
    }
    close(fds[1]);
    size_t n = 0;
    ssize_t r;
    while (n + 1 < cap && (r = read(fds[0], out + n, cap - 1 - n)) > 0)
        n += (size_t)r;
    out[n] = 0;
    close(fds[0]);
    int st;
    CHECK_INT(waitpid(pid, &st, 0), pid);
    CHECK(WIFEXITED(st));
    return WEXITSTATUS(st);
}

static void failing_int(void)
{
    CHECK_INT(2 + 2, 5);
}
static void failing_str(void)
{
    CHECK_STR("abc", "abd");
}
static void skipping(void)
{
    wb_test_skip("no GPU on this machine");
}
static void passing(void)
{
    CHECK_U64(1ull << 40, 1099511627776ull);
}

static void test_failed_check_exits_1(void)
{
    char out[512];
    CHECK_INT(run_child(failing_int, out, sizeof(out)), 1);
    CHECK(strstr(out, "harness_test.c:") != NULL);
    CHECK(strstr(out, "2 + 2 == 4, expected 5 == 5") != NULL);
    CHECK_INT(run_child(failing_str, out, sizeof(out)), 1);
    CHECK(strstr(out, "\"abc\"\n      expected \"abd\"") != NULL);
}

static void test_skip_exits_77(void)
{
    char out[512];
    CHECK_INT(run_child(skipping, out, sizeof(out)), 77);
    CHECK_STR(out, "skipped: no GPU on this machine\n");
}

static void test_pass_exits_0(void)
{
    char out[64];
    CHECK_INT(run_child(passing, out, sizeof(out)), 0);
    CHECK_STR(out, "");
}

const struct wb_test wb_tests[] = {
    {"failed_check_exits_1", test_failed_check_exits_1, 0},
    {"skip_exits_77", test_skip_exits_77, 0},
    {"pass_exits_0", test_pass_exits_0, 0},
    {0},
};
