/* wbtest.c — main() of every test binary: runs the wb_tests[] table, each test in a forked
 * child with a time limit and a directory of its own (made before, removed after, whatever the
 * outcome), and prints one line per test and the closing tally. */
#include "wbtest.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

enum { EXIT_SKIP = 77, MAX_CLEANUPS = 8 };

static char tmpdir[256];
static struct {
    void (*fn)(void);
    pid_t pid;
} cleanups[MAX_CLEANUPS];
static int ncleanups;

void wb_test_cleanup(void (*fn)(void))
{
    if (ncleanups == MAX_CLEANUPS)
        wb_test_fail(__FILE__, __LINE__, "more than %d cleanups", MAX_CLEANUPS);
    cleanups[ncleanups].fn = fn;
    cleanups[ncleanups].pid = getpid();
    ncleanups++;
}

/* The cleanups this process registered, last first; each is taken off before it runs, so one
 * that fails a check is not run again by that failure. */
static void run_cleanups(void)
{
    pid_t me = getpid();
    while (ncleanups > 0) {
        ncleanups--;
        if (cleanups[ncleanups].pid == me)
            cleanups[ncleanups].fn();
    }
}

_Noreturn void wb_test_fail(const char *file, int line, const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "    %s:%d: ", file, line);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    fflush(NULL);
    run_cleanups();
    fflush(NULL);
    _exit(1);
}

_Noreturn void wb_test_skip(const char *fmt, ...)
{
    va_list ap;
    printf("skipped: ");
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    putchar('\n');
    fflush(NULL);
    run_cleanups();
    fflush(NULL);
    _exit(EXIT_SKIP);
}

/* Makes the test's directory: 0, or -errno (tmpdir is then empty). */
static int make_tmpdir(void)
{
    const char *base = getenv("TMPDIR");
    snprintf(tmpdir, sizeof(tmpdir), "%s/wbtest.XXXXXX", base && *base ? base : "/tmp");
    if (mkdtemp(tmpdir))
        return 0;
    tmpdir[0] = 0;
    return -errno;
}

const char *wb_test_tmpdir(void)
{
    int e;
    if (!tmpdir[0] && (e = make_tmpdir()) != 0) /* in-process runs make it on first use */
        wb_test_fail(__FILE__, __LINE__, "mkdtemp: %s", strerror(-e));
    return tmpdir;
}

const char *wb_test_write_file(const char *name, const char *text)
{
    static char path[512];
    snprintf(path, sizeof(path), "%s/%s", wb_test_tmpdir(), name);
    FILE *f = fopen(path, "w");
    if (!f || fputs(text, f) < 0 || fclose(f) != 0)
        wb_test_fail(__FILE__, __LINE__, "cannot write %s", path);
    return path;
}

int wb_test_capture(void (*fn)(void *), void *arg, char *out, size_t cap)
{
    int fds[2];
    if (pipe(fds) != 0)
        wb_test_fail(__FILE__, __LINE__, "pipe: %s", strerror(errno));
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0)
        wb_test_fail(__FILE__, __LINE__, "fork: %s", strerror(errno));
    if (pid == 0) {
        close(fds[0]);
        dup2(fds[1], 1);
        dup2(fds[1], 2);
        fn(arg);
        fflush(NULL);
        _exit(0);
    }
    close(fds[1]);
    size_t n = 0;
    ssize_t r;
    char sink[256];
    while ((r = read(fds[0], n + 1 < cap ? out + n : sink,
                     n + 1 < cap ? cap - 1 - n : sizeof(sink))) > 0)
        if (n + 1 < cap)
            n += (size_t)r;
    if (cap)
        out[n] = 0;
    close(fds[0]);
    int st;
    if (waitpid(pid, &st, 0) != pid)
        wb_test_fail(__FILE__, __LINE__, "waitpid: %s", strerror(errno));
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

void wb_test_stderr_begin(struct wb_test_stderr *c)
{
    snprintf(c->path, sizeof(c->path), "%s/stderr", wb_test_tmpdir());
    fflush(stderr);
    int fd = open(c->path, O_CREAT | O_TRUNC | O_WRONLY, 0600);
    CHECK(fd >= 0);
    c->saved = dup(2);
    CHECK(c->saved >= 0 && dup2(fd, 2) == 2);
    close(fd);
}

const char *wb_test_stderr_end(struct wb_test_stderr *c, char *buf, size_t cap)
{
    fflush(stderr);
    CHECK(dup2(c->saved, 2) == 2);
    close(c->saved);
    FILE *f = fopen(c->path, "r");
    CHECK(f);
    size_t n = fread(buf, 1, cap - 1, f);
    buf[n] = 0;
    fclose(f);
    return buf;
}

static int remove_one(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    remove(path);
    return 0;
}

static void remove_tmpdir(void)
{
    if (!tmpdir[0])
        return;
    nftw(tmpdir, remove_one, 16, FTW_DEPTH | FTW_PHYS);
    if (access(tmpdir, F_OK) == 0)
        fprintf(stderr, "    warning: could not remove %s\n", tmpdir);
    tmpdir[0] = 0;
}

/* $WB_TEST_TIME_SCALE: every limit times this (>= 1), for machines slower than the loaded
 * 2-core one the limits are set for. */
static double time_scale(void)
{
    const char *s = getenv("WB_TEST_TIME_SCALE");
    char *end;
    double v = s && *s ? strtod(s, &end) : 1.0;
    return s && *s && *end == 0 && v >= 1.0 && v <= 1000.0 ? v : 1.0;
}

static bool selected(const char *name, int argc, char **argv)
{
    if (argc <= 1)
        return name[0] != '_'; /* tests of the harness itself run only when named */
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], name) == 0)
            return true;
    return false;
}

static int run_child(const struct wb_test *t);

/* 0 pass, 1 fail, EXIT_SKIP skip. */
static int run_one(const struct wb_test *t)
{
    if (getenv("WB_TEST_NOFORK")) {
        t->fn();
        run_cleanups();
        remove_tmpdir();
        return 0;
    }
    int e = make_tmpdir();
    if (e) {
        fprintf(stderr, "    mkdtemp: %s\n", strerror(-e));
        return 1;
    }
    int r = run_child(t);
    if (r == 1 && getenv("WB_TEST_KEEP") && *getenv("WB_TEST_KEEP")) {
        fprintf(stderr, "    kept: %s\n", tmpdir); /* its logs, for a look */
        tmpdir[0] = 0;
        return r;
    }
    remove_tmpdir(); /* also after a failure, a skip, a crash or the time limit */
    return r;
}

/* The test in a child of its own, within its time limit. */
static int run_child(const struct wb_test *t)
{
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) {
        fprintf(stderr, "    fork: %s\n", strerror(errno));
        return 1;
    }
    if (pid == 0) {
        setpgid(0, 0); /* the test and whatever it forks form one group we can kill */
        t->fn();
        run_cleanups();
        fflush(NULL);
        exit(0);
    }
    setpgid(pid, pid);
    unsigned limit = (unsigned)((t->seconds ? t->seconds : 60) * time_scale());
    struct timespec start, now;
    clock_gettime(CLOCK_MONOTONIC, &start);
    for (;;) {
        int st;
        pid_t r = waitpid(pid, &st, WNOHANG);
        if (r == pid) {
            kill(-pid, SIGKILL); /* leftovers of the test's own children */
            if (WIFEXITED(st))
                return WEXITSTATUS(st) == 0 ? 0 : WEXITSTATUS(st) == EXIT_SKIP ? EXIT_SKIP : 1;
            fprintf(stderr, "    killed by signal %d (%s)\n", WTERMSIG(st),
                    strsignal(WTERMSIG(st)));
            return 1;
        }
        clock_gettime(CLOCK_MONOTONIC, &now);
        if (now.tv_sec - start.tv_sec >= (time_t)limit) {
            kill(-pid, SIGKILL);
            waitpid(pid, &st, 0);
            fprintf(stderr, "    timed out after %u s\n", limit);
            return 1;
        }
        nanosleep(&(struct timespec){0, 2000000}, NULL);
    }
}

int main(int argc, char **argv)
{
    int passed = 0, failed = 0, skipped = 0;
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc > 1 && strcmp(argv[1], "-l") == 0) {
        for (const struct wb_test *t = wb_tests; t->name; t++)
            if (t->name[0] != '_')
                puts(t->name);
        return 0;
    }
    const char *prog = strrchr(argv[0], '/') ? strrchr(argv[0], '/') + 1 : argv[0];
    for (const struct wb_test *t = wb_tests; t->name; t++) {
        if (!selected(t->name, argc, argv))
            continue;
        printf("%s %s ...\n", prog, t->name);
        struct timespec a, b;
        clock_gettime(CLOCK_MONOTONIC, &a);
        int r = run_one(t);
        clock_gettime(CLOCK_MONOTONIC, &b);
        double ms = (double)(b.tv_sec - a.tv_sec) * 1e3 + (double)(b.tv_nsec - a.tv_nsec) / 1e6;
        const char *word = r == 0 ? "ok" : r == EXIT_SKIP ? "SKIP" : "FAIL";
        printf("%s %s %s (%.0f ms)\n", word, prog, t->name, ms);
        if (r == 0)
            passed++;
        else if (r == EXIT_SKIP)
            skipped++;
        else
            failed++;
    }
    printf("%d passed, %d failed, %d skipped\n", passed, failed, skipped);
    return failed ? 1 : 0;
}

bool wb_test_sh(const char *fmt, ...)
{
    char cmd[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof(cmd), fmt, ap);
    va_end(ap);
    strncat(cmd, " >/dev/null 2>&1", sizeof(cmd) - strlen(cmd) - 1);
    return system(cmd) == 0;
}
