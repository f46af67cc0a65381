/* wbtest.h — the project's small test harness.
 *
 * A test file defines `void test_x(void)` functions and one table
 *     const struct wb_test wb_tests[] = { {"x", test_x, 0}, ..., {0} };
 * and is linked with tests/wbtest.c, which supplies main(). Each test runs in a forked child
 * with a time limit (default 60 s, or the row's seconds), so a crash or a hang fails only that
 * test. A test fails by a failed check (the child exits at once), passes by returning, and skips
 * by calling wb_test_skip(). Output: one line per test, then "N passed, N failed, N skipped".
 * Whatever the outcome — pass, fail, skip, crash or time limit — the test's directory
 * (wb_test_tmpdir) is removed afterwards, and the cleanups it registered (wb_test_cleanup) run
 * unless it was killed.
 *
 * A limit is a hang guard, not a speed check: tests decide by what happened (counts, exact
 * errors), never by elapsed time, and limits are set for a loaded 2-core machine.
 * $WB_TEST_TIME_SCALE (a number >= 1) multiplies every limit, for machines slower than that.
 *
 * Usage: <test> [-l] [name...]   (-l lists the names; names select tests; a name starting with
 * '_' is a test of the harness itself, run only when named)
 * WB_TEST_NOFORK=1 runs tests in-process (for gdb).
 */
#ifndef WB_TEST_H
#define WB_TEST_H

#include <inttypes.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

struct wb_test {
    const char *name;
    void (*fn)(void);
    unsigned seconds; /* time limit; 0 = 60 */
};

extern const struct wb_test wb_tests[];

/* Ends the running test as failed, printing where and why. */
_Noreturn void wb_test_fail(const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Ends the running test as skipped with a reason. */
_Noreturn void wb_test_skip(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* A directory private to the running test (made before it starts, removed after it ended,
 * however it ended; WB_TEST_KEEP=1 keeps a failed test's, and says where). */
const char *wb_test_tmpdir(void);
/* Registers fn to run when the test ends — returns, fails a check or skips — in the process
 * that registered it (not in children it forked); the last registered runs first. For what a
 * test sets up outside its directory (network namespaces, say). At most 8. */
void wb_test_cleanup(void (*fn)(void));
/* Writes text to <tmpdir>/<name> and returns the path (valid until the test ends). */
const char *wb_test_write_file(const char *name, const char *text);

/* Runs the formatted shell command with its output discarded; true when it exited 0. */
bool wb_test_sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Runs fn(arg) in a forked child with its stdout and stderr captured into out (NUL-terminated,
 * truncated to cap-1 bytes); returns the child's exit status (fn returning = 0), or 128+signal. */
int wb_test_capture(void (*fn)(void *), void *arg, char *out, size_t cap);

/* Redirects this process's stderr into a file until wb_test_stderr_end(), which restores it
 * and returns what was written (NUL-terminated in buf) — for checking exact error messages
 * that a library logs. */
struct wb_test_stderr {
    int saved;
    char path[300];
};
void wb_test_stderr_begin(struct wb_test_stderr *c);
const char *wb_test_stderr_end(struct wb_test_stderr *c, char *buf, size_t cap);

#define CHECK(c)                                                                                   \
    do {                                                                                           \
        if (!(c))                                                                                  \
            wb_test_fail(__FILE__, __LINE__, "CHECK(%s)", #c);                                     \
    } while (0)

#define CHECK_INT(a, b)                                                                            \
    do {                                                                                           \
        long long wb_a_ = (long long)(a), wb_b_ = (long long)(b);                                  \
        if (wb_a_ != wb_b_)                                                                        \
            wb_test_fail(__FILE__, __LINE__, "%s == %lld, expected %s == %lld", #a, wb_a_, #b,     \
                         wb_b_);                                                                   \
    } while (0)

#define CHECK_U64(a, b)                                                                            \
    do {                                                                                           \
        uint64_t wb_a_ = (uint64_t)(a), wb_b_ = (uint64_t)(b);                                     \
        if (wb_a_ != wb_b_)                                                                        \
            wb_test_fail(__FILE__, __LINE__, "%s == %" PRIu64 ", expected %s == %" PRIu64, #a,     \
                         wb_a_, #b, wb_b_);                                                        \
    } while (0)

#define CHECK_STR(a, b)                                                                            \
    do {                                                                                           \
        const char *wb_a_ = (a), *wb_b_ = (b);                                                     \
        if (!wb_a_ || !wb_b_ || strcmp(wb_a_, wb_b_) != 0)                                         \
            wb_test_fail(__FILE__, __LINE__, "%s == \"%s\"\n      expected \"%s\"", #a,            \
                         wb_a_ ? wb_a_ : "(null)", wb_b_ ? wb_b_ : "(null)");                      \
    } while (0)

#define CHECK_MEM(a, b, n)                                                                         \
    do {                                                                                           \
        if (memcmp((a), (b), (n)) != 0)                                                            \
            wb_test_fail(__FILE__, __LINE__, "memory of %s differs from %s (%zu bytes)", #a, #b,   \
                         (size_t)(n));                                                             \
    } while (0)

#endif /* WB_TEST_H */
