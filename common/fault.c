/* fault.c — the fault build's counters (common/fault.h) and the allocation wrappers: the fault
 * build renames every allocation call in our objects (not this one's) to __wrap_<name>, so only
 * our code's allocations are counted; libfabric, nng, libyaml and the CUDA runtime allocate as
 * always. Empty in every other build. */
#ifdef WB_FAULT
#include "common/fault.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *const kind_name[WB_FAULT_NKINDS] = {"alloc", "post", "cuda"};
static _Atomic uint64_t seen[WB_FAULT_NKINDS];
static uint64_t target[WB_FAULT_NKINDS]; /* 0: none */
static atomic_bool fired;
static pthread_once_t once = PTHREAD_ONCE_INIT;
static bool trace;

/* The sanitizers' stack printer (the fault build always has them): WB_FAULT_TRACE=1 shows where
 * the injected failure happened. */
void __sanitizer_print_stack_trace(void) __attribute__((weak));

static void fault_report(void)
{
    const char *path = getenv("WB_FAULT_COUNT");
    if (!path || !*path)
        return;
    int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0)
        return;
    dprintf(fd, "alloc=%llu post=%llu cuda=%llu fired=%d\n",
            (unsigned long long)atomic_load(&seen[WB_FAULT_ALLOC]),
            (unsigned long long)atomic_load(&seen[WB_FAULT_POST]),
            (unsigned long long)atomic_load(&seen[WB_FAULT_CUDA]), atomic_load(&fired) ? 1 : 0);
    close(fd);
}

/* WB_FAULT=KIND:N. Read once, without allocating (it runs inside the first malloc). */
static void fault_init(void)
{
    const char *s = getenv("WB_FAULT");
    for (int k = 0; s && k < WB_FAULT_NKINDS; k++) {
        size_t n = strlen(kind_name[k]);
        if (strncmp(s, kind_name[k], n) == 0 && s[n] == ':') {
            char *end;
            unsigned long long v = strtoull(s + n + 1, &end, 10);
            if (*end == '\0' && v > 0)
                target[k] = v;
        }
    }
    trace = getenv("WB_FAULT_TRACE") != NULL;
    atexit(fault_report);
}

bool wb_fault_hit(enum wb_fault_kind kind)
{
    pthread_once(&once, fault_init);
    uint64_t n = atomic_fetch_add(&seen[kind], 1) + 1;
    if (n != target[kind])
        return false;
    atomic_store(&fired, true);
    if (trace && __sanitizer_print_stack_trace) {
        fprintf(stderr, "weightbridge fault: %s %llu fails here:\n", kind_name[kind],
                (unsigned long long)n);
        __sanitizer_print_stack_trace();
    }
    return true;
}

/* Make sure a run that allocates nothing of ours still reports. */
__attribute__((constructor)) static void fault_start(void)
{
    pthread_once(&once, fault_init);
}

void *__wrap_malloc(size_t n);
void *__wrap_calloc(size_t k, size_t n);
void *__wrap_realloc(void *p, size_t n);
char *__wrap_strdup(const char *s);
char *__wrap_strndup(const char *s, size_t n);
int __wrap_posix_memalign(void **p, size_t align, size_t n);
void *__wrap_aligned_alloc(size_t align, size_t n);
int __wrap_vasprintf(char **s, const char *fmt, va_list ap);
int __wrap_asprintf(char **s, const char *fmt, ...);
FILE *__wrap_open_memstream(char **buf, size_t *len);

static bool alloc_fails(void)
{
    if (!wb_fault_hit(WB_FAULT_ALLOC))
        return false;
    errno = ENOMEM;
    return true;
}

void *__wrap_malloc(size_t n)
{
    return alloc_fails() ? NULL : malloc(n);
}

void *__wrap_calloc(size_t k, size_t n)
{
    return alloc_fails() ? NULL : calloc(k, n);
}

void *__wrap_realloc(void *p, size_t n)
{
    return alloc_fails() ? NULL : realloc(p, n);
}

char *__wrap_strdup(const char *s)
{
    return alloc_fails() ? NULL : strdup(s);
}

char *__wrap_strndup(const char *s, size_t n)
{
    return alloc_fails() ? NULL : strndup(s, n);
}

int __wrap_posix_memalign(void **p, size_t align, size_t n)
{
    return alloc_fails() ? ENOMEM : posix_memalign(p, align, n);
}

void *__wrap_aligned_alloc(size_t align, size_t n)
{
    return alloc_fails() ? NULL : aligned_alloc(align, n);
}

int __wrap_vasprintf(char **s, const char *fmt, va_list ap)
{
    return alloc_fails() ? -1 : vasprintf(s, fmt, ap);
}

int __wrap_asprintf(char **s, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int r = alloc_fails() ? -1 : vasprintf(s, fmt, ap);
    va_end(ap);
    return r;
}

FILE *__wrap_open_memstream(char **buf, size_t *len)
{
    return alloc_fails() ? NULL : open_memstream(buf, len);
}
#else
typedef int wb_fault_off; /* ISO C wants a declaration in every translation unit */
#endif
