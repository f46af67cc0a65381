/* e2e_proc.h — helpers of the end-to-end tests: start the real programs (wb-controller,
 * wb-agent, wb-ctl from $WB_BIN, default build/bin) as child processes with their output in
 * the test's directory, run wb-ctl and capture what it prints, wait with time limits, and
 * kill every child when the test ends. Header-only: each test binary includes it once. */
#ifndef WB_E2E_PROC_H
#define WB_E2E_PROC_H

#include "tests/wbtest.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

enum { E2E_MAX_CHILDREN = 32 };

static pid_t e2e_children[E2E_MAX_CHILDREN];
static int e2e_nchildren;

static const char *e2e_bin(void)
{
    const char *b = getenv("WB_BIN");
    return b && *b ? b : "build/bin";
}

static void e2e_sleep_ms(unsigned ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000};
    nanosleep(&ts, NULL);
}

static void e2e_kill_all(void)
{
    for (int i = 0; i < e2e_nchildren; i++)
        if (e2e_children[i] > 0) {
            kill(e2e_children[i], SIGKILL);
            waitpid(e2e_children[i], NULL, 0);
            e2e_children[i] = 0;
        }
}

/* Starts argv[0] (a program name under $WB_BIN, or a path with '/') with stdout and stderr in
 * <tmpdir>/<log>. Environment additions "K=V" may be given in env (NULL-terminated, or NULL). */
static pid_t e2e_spawn(const char *log, char *const env[], char *const argv[])
{
    static bool registered;
    if (!registered) {
        atexit(e2e_kill_all);
        registered = true;
    }
    char path[1024], logpath[1024];
    if (strchr(argv[0], '/'))
        snprintf(path, sizeof(path), "%s", argv[0]);
    else
        snprintf(path, sizeof(path), "%s/%s", e2e_bin(), argv[0]);
    snprintf(logpath, sizeof(logpath), "%s/%s", wb_test_tmpdir(), log);
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0)
        wb_test_fail(__FILE__, __LINE__, "fork: %s", strerror(errno));
    if (pid == 0) {
        FILE *f = freopen(logpath, "a", stdout);
        if (!f || dup2(fileno(stdout), 2) < 0)
            _exit(126);
        for (int i = 0; env && env[i]; i++)
            putenv(env[i]);
        execv(path, argv);
        fprintf(stderr, "exec %s: %s\n", path, strerror(errno));
        _exit(127);
    }
    if (e2e_nchildren < E2E_MAX_CHILDREN)
        e2e_children[e2e_nchildren++] = pid;
    return pid;
}

/* Waits for pid to exit within ms; returns its exit status (128+signal when killed), or -1
 * after killing it when the time ran out. */
static int e2e_wait(pid_t pid, unsigned ms)
{
    int st;
    for (unsigned t = 0;; t += 10) {
        pid_t r = waitpid(pid, &st, WNOHANG);
        if (r == pid)
            break;
        if (t >= ms) {
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
            st = -1;
            break;
        }
        e2e_sleep_ms(10);
    }
    for (int i = 0; i < e2e_nchildren; i++)
        if (e2e_children[i] == pid)
            e2e_children[i] = 0;
    if (st == -1)
        return -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* Runs a shell command line (programs found in $WB_BIN first) and captures its output
 * (stdout and stderr) into a malloc'd string; returns the exit status. */
static int e2e_run(char **out, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int e2e_run(char **out, const char *fmt, ...)
{
    char cmd[4096], full[4600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof(cmd), fmt, ap);
    va_end(ap);
    snprintf(full, sizeof(full), "PATH=\"%s:$PATH\" timeout -s KILL 120 env %s 2>&1", e2e_bin(),
             cmd);
    FILE *p = popen(full, "r");
    if (!p)
        wb_test_fail(__FILE__, __LINE__, "popen: %s", strerror(errno));
    size_t cap = 4096, len = 0;
    char *buf = malloc(cap);
    size_t n;
    while (buf && (n = fread(buf + len, 1, cap - len - 1, p)) > 0) {
        len += n;
        if (cap - len < 1024) {
            cap *= 2;
            buf = realloc(buf, cap);
        }
    }
    if (!buf)
        wb_test_fail(__FILE__, __LINE__, "out of memory");
    buf[len] = 0;
    int st = pclose(p);
    *out = buf;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* The contents of <tmpdir>/<name> (malloc'd, "" when absent). */
static char *e2e_slurp(const char *name)
{
    char path[1024];
    snprintf(path, sizeof(path), "%s/%s", wb_test_tmpdir(), name);
    FILE *f = fopen(path, "r");
    char *buf = calloc(1, 1 << 20);
    if (!buf)
        wb_test_fail(__FILE__, __LINE__, "out of memory");
    if (f) {
        size_t n = fread(buf, 1, (1 << 20) - 1, f);
        buf[n] = 0;
        fclose(f);
    }
    return buf;
}

/* A TCP port for this test process (tests run in parallel binaries; the pid spreads them). */
/* A port to listen on: below Linux's ephemeral range (32768-60999), where the kernel picks the
 * local ports of outgoing connections and of libfabric's own listeners — a port taken there
 * would keep a test's controller from listening. */
static unsigned e2e_port(unsigned salt)
{
    return 20000u + ((unsigned)getpid() * 7u + salt * 101u) % 12000u;
}

#define CHECK_CONTAINS(hay, needle)                                                                \
    do {                                                                                           \
        const char *h_ = (hay), *n_ = (needle);                                                    \
        if (!strstr(h_, n_))                                                                       \
            wb_test_fail(__FILE__, __LINE__, "output lacks \"%s\":\n%s", n_, h_);                  \
    } while (0)

#endif /* WB_E2E_PROC_H */

/* Whether a pseudo-terminal can be made here, as script(1) makes one; why not in why. A root
 * without a devpts instance at /dev/pts (a container's, say) has /dev/ptmx but no terminals. */
static inline bool e2e_pty_possible(char *why, size_t cap)
{
    int m = posix_openpt(O_RDWR | O_NOCTTY);
    if (m < 0) {
        snprintf(why, cap, "posix_openpt: %s", strerror(errno));
        return false;
    }
    const char *name = grantpt(m) == 0 && unlockpt(m) == 0 ? ptsname(m) : NULL;
    int sl = name ? open(name, O_RDWR | O_NOCTTY) : -1;
    if (sl < 0)
        snprintf(why, cap, "%s: %s", name ? name : "grantpt/unlockpt", strerror(errno));
    else
        close(sl);
    close(m);
    return sl >= 0;
}
