/* fabric_dl.c — loading libfabric at the first fabric open, without changing the process's
 * signal handlers.
 *
 * Why it is loaded here and not linked: Debian's libfabric has the psm and psm2 providers built
 * in, so it needs libpsm_infinipath and libinfinipath, and libinfinipath's constructor installs
 * its own "print a backtrace and exit" handler for SIGINT, SIGILL, SIGABRT, SIGBUS, SIGSEGV and
 * SIGTERM when the library is loaded. Linked (a DT_NEEDED entry), that happens before main() of
 * a C program and inside ctypes.CDLL() of `import weightbridge`: Ctrl-C then exits 1 without
 * KeyboardInterrupt and without running `finally:`, and SIGTERM can hang in the handler's exit.
 * Nothing we run before a constructor of a library we depend on exists, so the library is
 * loaded with dlopen when a fabric transport is first opened, after:
 *   - IPATH_NO_BACKTRACE=1, libinfinipath's switch for that handler (set only where the
 *     environment has no value: it is read in the constructor, so it must be set before the
 *     load; libpsm2's handlers are opt-in, HFI_BACKTRACE, and left as they are);
 *   - saving every signal's disposition, put back after the load for any signal whose
 *     disposition changed (a libinfinipath whose switch is set elsewhere, a provider in a
 *     plugin library). Handlers nobody changed are not touched, so a handler the application
 *     installs on another thread meanwhile is not undone.
 * txi_fabric_open (fabric.c) does the same around everything else an open calls — fi_getinfo,
 * fi_fabric, fi_domain, endpoints —, since providers also install handlers when they open
 * (libfabric 1.17's shm: SIGINT, SIGBUS, SIGSEGV and SIGTERM, to unlink its shared memory).
 * The functions libfabric exports that this backend calls are these five; everything else
 * (fi_domain, fi_endpoint, fi_write…) is an inline call through the objects' ops tables.
 * The handle is process-wide by nature (a library is loaded once per process) and is never
 * closed: libfabric keeps provider state until exit. */
#include "transport/fabric/fabric.h"

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void fab_sig_save(struct fab_sigs *s)
{
    memset(s, 0, sizeof(*s));
    for (int sig = 1; sig < FAB_NSIG; sig++)
        s->have[sig] = sigaction(sig, NULL, &s->act[sig]) == 0;
}

/* Two dispositions are the same when handler, flags and mask are. */
static bool sig_same(const struct sigaction *a, const struct sigaction *b)
{
    /* sa_handler and sa_sigaction share their storage (a union in glibc) */
    if (a->sa_flags != b->sa_flags || a->sa_handler != b->sa_handler)
        return false;
    for (int sig = 1; sig < FAB_NSIG; sig++)
        if (sigismember(&a->sa_mask, sig) != sigismember(&b->sa_mask, sig))
            return false;
    return true;
}

int fab_sig_restore(const struct fab_sigs *s)
{
    int n = 0;
    for (int sig = 1; sig < FAB_NSIG; sig++) {
        struct sigaction now;
        if (!s->have[sig] || sigaction(sig, NULL, &now) != 0 || sig_same(&now, &s->act[sig]))
            continue;
        if (sigaction(sig, &s->act[sig], NULL) == 0)
            n++;
    }
    return n;
}

static struct {
    pthread_once_t once;
    void *h;
    char err[256];
    int (*getinfo)(uint32_t, const char *, const char *, uint64_t, const struct fi_info *,
                   struct fi_info **);
    void (*freeinfo)(struct fi_info *);
    struct fi_info *(*dupinfo)(const struct fi_info *);
    int (*fabric)(struct fi_fabric_attr *, struct fid_fabric **, void *);
    const char *(*strerror)(int);
} fab_dl = {.once = PTHREAD_ONCE_INIT};

static void dl_load(void)
{
    setenv("IPATH_NO_BACKTRACE", "1", 0);
    struct fab_sigs s;
    fab_sig_save(&s);
    void *h = dlopen("libfabric.so.1", RTLD_NOW | RTLD_LOCAL);
    fab_sig_keep(&s, "loading libfabric");
    if (!h) {
        snprintf(fab_dl.err, sizeof(fab_dl.err), "cannot load libfabric.so.1: %s", dlerror());
        return;
    }
    /* dlsym returns void *; POSIX guarantees it converts to a function pointer. */
    *(void **)&fab_dl.getinfo = dlsym(h, "fi_getinfo");
    *(void **)&fab_dl.freeinfo = dlsym(h, "fi_freeinfo");
    *(void **)&fab_dl.dupinfo = dlsym(h, "fi_dupinfo");
    *(void **)&fab_dl.fabric = dlsym(h, "fi_fabric");
    *(void **)&fab_dl.strerror = dlsym(h, "fi_strerror");
    if (!fab_dl.getinfo || !fab_dl.freeinfo || !fab_dl.dupinfo || !fab_dl.fabric ||
        !fab_dl.strerror) {
        snprintf(fab_dl.err, sizeof(fab_dl.err), "libfabric.so.1 lacks fi_getinfo/fi_fabric");
        return;
    }
    fab_dl.h = h;
}

const char *fab_dl_open(void)
{
    pthread_once(&fab_dl.once, dl_load);
    return fab_dl.h ? NULL : fab_dl.err;
}

void fab_sig_keep(const struct fab_sigs *s, const char *after)
{
    int n = fab_sig_restore(s);
    if (n)
        wb_log(WB_LOG_DEBUG, "transport", "fabric: %d signal handler(s) put back after %s", n,
               after);
}

int fab_getinfo(uint32_t version, const struct fi_info *hints, struct fi_info **info)
{
    return fab_dl.getinfo(version, NULL, NULL, 0, hints, info);
}

int fab_fabric_open(struct fi_fabric_attr *attr, struct fid_fabric **fabric)
{
    return fab_dl.fabric(attr, fabric, NULL);
}

struct fi_info *fab_dupinfo(const struct fi_info *info)
{
    return fab_dl.dupinfo(info);
}

void fab_freeinfo(struct fi_info *info)
{
    if (info)
        fab_dl.freeinfo(info);
}

const char *fab_strerror(int e)
{
    return fab_dl.h ? fab_dl.strerror(e) : strerror(e);
}
