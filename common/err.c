/* err.c — error texts, the error list used by checks that report everything at once, and the
 * leveled logger. */
#include "common/common.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const project_errors[WB_E_LAST - WB_E_FIRST] = {
    [WB_E_CONFIG - WB_E_FIRST] = "invalid configuration",
    [WB_E_MATCH - WB_E_FIRST] = "trainer and rollout parameters do not match",
    [WB_E_PLAN - WB_E_FIRST] = "layout cannot be planned",
    [WB_E_VERSION - WB_E_FIRST] = "unsupported wire message version",
    [WB_E_TOKEN - WB_E_FIRST] = "wrong or missing cluster token",
    [WB_E_PEER - WB_E_FIRST] = "peer died or stopped answering",
    [WB_E_CUDA - WB_E_FIRST] = "CUDA runtime error",
    [WB_E_FABRIC - WB_E_FIRST] = "libfabric error",
    [WB_E_NOGPU - WB_E_FIRST] = "no usable GPU",
    [WB_E_BOUNDS - WB_E_FIRST] = "write outside its destination region",
    [WB_E_ENDED - WB_E_FIRST] = "the job was shut down",
    [WB_E_HELLO - WB_E_FIRST] = "control message not bound to its connection",
};

const char *wb_strerror(int err)
{
    if (err < 0)
        err = -err;
    if (err == 0)
        return "success";
    if (err >= WB_E_FIRST && err < WB_E_LAST)
        return project_errors[err - WB_E_FIRST];
    if (err < WB_E_FIRST)
        return strerror(err);
    return "unknown error";
}

void wb_errlist_init(struct wb_errlist *el)
{
    memset(el, 0, sizeof(*el));
}

int wb_errlist_vadd(struct wb_errlist *el, const char *fmt, va_list ap)
{
    if (el->n == el->cap && wb_grow(&el->msgs, &el->cap, 8, sizeof(*el->msgs)) != 0)
        return -ENOMEM;
    char *s;
    if (vasprintf(&s, fmt, ap) < 0)
        return -ENOMEM;
    el->msgs[el->n++] = s;
    return 0;
}

int wb_errlist_add(struct wb_errlist *el, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int r = wb_errlist_vadd(el, fmt, ap);
    va_end(ap);
    return r;
}

void wb_errlist_drop(struct wb_errlist *el, size_t k)
{
    el->dropped += k;
}

void wb_errlist_print(const struct wb_errlist *el, const char *prefix, void *file)
{
    for (size_t i = 0; i < el->n; i++)
        fprintf(file ? file : stderr, "%s%s\n", prefix ? prefix : "", el->msgs[i]);
    if (el->dropped)
        fprintf(file ? file : stderr, "%s... and %zu more\n", prefix ? prefix : "", el->dropped);
}

void wb_errlist_free(struct wb_errlist *el)
{
    for (size_t i = 0; i < el->n; i++)
        free(el->msgs[i]);
    free(el->msgs);
    memset(el, 0, sizeof(*el));
}

static const char *const level_names[] = {"debug", "info", "warn", "error", "off"};

int wb_log_level_parse(const char *s, enum wb_log_level *out)
{
    for (int i = 0; i <= WB_LOG_OFF; i++)
        if (strcasecmp(s, level_names[i]) == 0) {
            *out = (enum wb_log_level)i;
            return 0;
        }
    if (strcasecmp(s, "warning") == 0) {
        *out = WB_LOG_WARN;
        return 0;
    }
    return -EINVAL;
}

/* The one piece of process-wide state: the level, read from the environment once. A racing
 * first read by two threads stores the same value twice, which is harmless. */
static volatile int cached_level = -1;

enum wb_log_level wb_log_level(void)
{
    int l = cached_level;
    if (l < 0) {
        enum wb_log_level parsed = WB_LOG_WARN;
        const char *env = getenv("WB_LOG");
        if (env && *env && wb_log_level_parse(env, &parsed) != 0)
            fprintf(stderr, "wb warn common: WB_LOG=%s is not debug|info|warn|error|off\n", env);
        cached_level = l = (int)parsed;
    }
    return (enum wb_log_level)l;
}

void wb_log(enum wb_log_level level, const char *module, const char *fmt, ...)
{
    if (level < wb_log_level() || level >= WB_LOG_OFF)
        return;
    char line[1024];
    int n = snprintf(line, sizeof(line), "wb %s %s: ", level_names[level], module);
    va_list ap;
    va_start(ap, fmt);
    if (n > 0 && (size_t)n < sizeof(line))
        vsnprintf(line + n, sizeof(line) - (size_t)n, fmt, ap);
    va_end(ap);
    fprintf(stderr, "%s\n", line); /* one call, so lines of concurrent processes don't mix */
}
