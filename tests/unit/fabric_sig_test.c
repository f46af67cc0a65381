/* fabric_sig_test.c — opening a fabric transport leaves the process's signal handlers as they
 * were (issue #31 item 3): Debian's libfabric loads libinfinipath, whose constructor installs
 * handlers for SIGINT, SIGTERM, SIGSEGV…; transport/fabric/fabric_dl.c loads libfabric at the
 * first open with IPATH_NO_BACKTRACE set and every disposition saved and put back. The first
 * tests open a real tcp transport in a process that had its own handlers; the others test the
 * save/restore helper by itself, since with the environment set the real load changes nothing
 * for it to restore. */
#include "tests/txtest.h"
#include "tests/wbtest.h"
#include "transport/fabric/fabric.h"
#include "transport/transport.h"

#include <dlfcn.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void on_sig(int sig)
{
    (void)sig;
}

static void on_sig_info(int sig, siginfo_t *si, void *uc)
{
    (void)sig, (void)si, (void)uc;
}

/* The test's own record of every disposition (independent of fab_sig_save). */
struct snap {
    struct sigaction a[NSIG];
    int ok[NSIG];
};

static void snap_take(struct snap *s)
{
    memset(s, 0, sizeof(*s));
    for (int sig = 1; sig < NSIG; sig++)
        s->ok[sig] = sigaction(sig, NULL, &s->a[sig]) == 0;
}

/* The number of signals whose handler, flags or mask differ between a and b. */
static int snap_diff(const struct snap *a, const struct snap *b)
{
    int n = 0;
    for (int sig = 1; sig < NSIG; sig++) {
        CHECK_INT(a->ok[sig], b->ok[sig]);
        if (!a->ok[sig])
            continue;
        const struct sigaction *x = &a->a[sig], *y = &b->a[sig];
        bool same = x->sa_handler == y->sa_handler && x->sa_flags == y->sa_flags;
        for (int m = 1; m < NSIG && same; m++)
            same = sigismember(&x->sa_mask, m) == sigismember(&y->sa_mask, m);
        if (!same) {
            fprintf(stderr, "    signal %d (%s) changed\n", sig, strsignal(sig));
            n++;
        }
    }
    return n;
}

static void set_handler(int sig, void (*fn)(int), int flags, int masked)
{
    struct sigaction a;
    memset(&a, 0, sizeof(a));
    a.sa_handler = fn;
    a.sa_flags = flags;
    sigemptyset(&a.sa_mask);
    if (masked)
        sigaddset(&a.sa_mask, masked);
    CHECK_INT(sigaction(sig, &a, NULL), 0);
}

static bool loaded(const char *lib)
{
    void *h = dlopen(lib, RTLD_NOW | RTLD_NOLOAD);
    if (h)
        dlclose(h);
    return h != NULL;
}

static void open_close(const char *yaml)
{
    struct wb_errlist el;
    wb_errlist_init(&el);
    struct wb_tx *tx = NULL;
    int r = wb_test_tx_open(yaml, &el, &tx);
    if (r)
        wb_errlist_print(&el, "    ", stderr);
    CHECK_INT(r, 0);
    wb_errlist_free(&el);
    wb_tx_close(tx);
}

/* The application's handlers (and SIG_IGN, and the defaults of the rest) are what they were
 * after a tcp transport opened and closed, and after a second one (libfabric already loaded).
 * The load is real: libfabric and, where installed, libinfinipath are in the process only after
 * the open. */
static void test_open_keeps_handlers(void)
{
    unsetenv("IPATH_NO_BACKTRACE");
    set_handler(SIGINT, on_sig, 0, 0);
    set_handler(SIGTERM, on_sig, SA_RESTART, SIGINT);
    set_handler(SIGUSR1, SIG_IGN, 0, 0);
    struct sigaction si;
    memset(&si, 0, sizeof(si));
    si.sa_sigaction = on_sig_info;
    si.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&si.sa_mask);
    CHECK_INT(sigaction(SIGILL, &si, NULL), 0);
    CHECK(!loaded("libfabric.so.1"));
    bool psm = !loaded("libinfinipath.so.4") &&
               (access("/lib/x86_64-linux-gnu/libinfinipath.so.4", F_OK) == 0 ||
                access("/usr/lib/x86_64-linux-gnu/libinfinipath.so.4", F_OK) == 0);
    struct snap before, after;
    snap_take(&before);
    open_close("provider: tcp\ndomain: lo\n");
    CHECK(loaded("libfabric.so.1"));
    if (psm)
        CHECK(loaded("libinfinipath.so.4"));
    snap_take(&after);
    CHECK_INT(snap_diff(&before, &after), 0);
    CHECK_STR(getenv("IPATH_NO_BACKTRACE"), "1");
    open_close("provider: shm\n");
    snap_take(&after);
    CHECK_INT(snap_diff(&before, &after), 0);
    if (!psm)
        printf("    (libinfinipath is not installed: only the save/restore path ran)\n");
}

/* A value the user gave IPATH_NO_BACKTRACE is theirs: it is not overwritten. */
static void test_open_keeps_user_env(void)
{
    setenv("IPATH_NO_BACKTRACE", "yes", 1);
    set_handler(SIGINT, on_sig, 0, 0);
    struct snap before, after;
    snap_take(&before);
    open_close("provider: tcp\ndomain: lo\n");
    snap_take(&after);
    CHECK_INT(snap_diff(&before, &after), 0);
    CHECK_STR(getenv("IPATH_NO_BACKTRACE"), "yes");
}

/* The helper puts back exactly what changed between save and restore — a handler, flags only,
 * a mask only, a handler installed where there was the default — and touches nothing else. */
static void test_save_restore(void)
{
    set_handler(SIGINT, on_sig, 0, 0);
    set_handler(SIGTERM, on_sig, 0, 0);
    set_handler(SIGHUP, on_sig, 0, 0);
    set_handler(SIGUSR2, on_sig, 0, 0);
    set_handler(SIGALRM, SIG_DFL, 0, 0);
    struct snap before, after;
    snap_take(&before);
    struct fab_sigs *s = malloc(sizeof(*s));
    CHECK(s != NULL);
    fab_sig_save(s);
    CHECK(s->have[SIGINT] && s->have[SIGTERM] && s->have[SIGRTMAX]);
    CHECK(!s->have[SIGKILL] || s->act[SIGKILL].sa_handler == SIG_DFL);
    set_handler(SIGINT, SIG_IGN, 0, 0);            /* another handler */
    set_handler(SIGTERM, on_sig, SA_RESETHAND, 0); /* flags only */
    set_handler(SIGHUP, on_sig, 0, SIGQUIT);       /* mask only */
    set_handler(SIGALRM, on_sig, SA_SIGINFO, 0);   /* the default replaced */
    CHECK_INT(fab_sig_restore(s), 4);
    snap_take(&after);
    CHECK_INT(snap_diff(&before, &after), 0);
    /* nothing changed since: nothing put back */
    CHECK_INT(fab_sig_restore(s), 0);
    /* a handler changed after the save and changed back is not touched either */
    set_handler(SIGUSR2, SIG_IGN, 0, 0);
    set_handler(SIGUSR2, on_sig, 0, 0);
    CHECK_INT(fab_sig_restore(s), 0);
    free(s);
}

const struct wb_test wb_tests[] = {
    {"open_keeps_handlers", test_open_keeps_handlers, 120},
    {"open_keeps_user_env", test_open_keeps_user_env, 120},
    {"save_restore", test_save_restore, 0},
    {0},
};
