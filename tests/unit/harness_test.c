/* harness_test.c — the test harness itself: a failed check ends the test with status 1 and
 * says where, a skip ends it with status 77 and prints "skipped: <reason>", and a test that
 * returns passes. Each case runs in a child so the outcomes can be observed. */
#include "tests/wbtest.h"

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

const struct wb_test wb_tests[] = {
    {"failed_check_exits_1", test_failed_check_exits_1, 0},
    {"skip_exits_77", test_skip_exits_77, 0},
    {"pass_exits_0", test_pass_exits_0, 0},
    {0},
};
