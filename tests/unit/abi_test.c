/* abi_test.c — the contract between the C library and the Python package (python/weightbridge),
 * checked rather than trusted: Python declares the structs it passes by pointer
 * (ctypes.Structure) and copies the constants it compares return values with, so a field added
 * in C and not in Python, or an error code Python lacks, would go unnoticed until a caller read
 * garbage. This test writes what the compiler knows — sizeof and every field's offset and size
 * of those structs, every project error code by name, the constants Python copies — to a JSON
 * file, and tests/sh/abi_check.py imports the package against this build's libweightbridge.so
 * and compares (it also reads the structs' fields from the public headers, so a field missing
 * from the table below fails too). The error-code table is checked against common.h's range at
 * compile time: a new code does not build until it is listed here, and then Python must have it.
 */
#include "agent/agent.h"
#include "common/common.h"
#include "planner/planner.h"
#include "route/route.h"
#include "tests/wbtest.h"

#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

struct named {
    const char *name;
    long long value;
};

static const struct named errcodes[] = {
    {"WB_E_CONFIG", WB_E_CONFIG},   {"WB_E_MATCH", WB_E_MATCH},   {"WB_E_PLAN", WB_E_PLAN},
    {"WB_E_VERSION", WB_E_VERSION}, {"WB_E_TOKEN", WB_E_TOKEN},   {"WB_E_PEER", WB_E_PEER},
    {"WB_E_CUDA", WB_E_CUDA},       {"WB_E_FABRIC", WB_E_FABRIC}, {"WB_E_NOGPU", WB_E_NOGPU},
    {"WB_E_BOUNDS", WB_E_BOUNDS},   {"WB_E_ENDED", WB_E_ENDED},   {"WB_E_HELLO", WB_E_HELLO},
};
_Static_assert(sizeof(errcodes) / sizeof(errcodes[0]) == WB_E_LAST - WB_E_FIRST,
               "every project error code (common.h) is listed here, so Python is checked for it");

/* Constants the Python package copies (python/weightbridge/_lib.py, _adapter.py). */
static const struct named consts[] = {
    {"WB_PUSH_SOURCES", WB_PUSH_SOURCES}, {"WB_PUSH_DONE", WB_PUSH_DONE},
    {"WB_PUSH_SKIPPED", WB_PUSH_SKIPPED}, {"WB_PUSH_LATEST", WB_PUSH_LATEST},
    {"WB_PUSH_QUEUE", WB_PUSH_QUEUE},     {"WB_PUSH_SKIPPED_MAX", WB_PUSH_SKIPPED_MAX},
    {"WB_STAGE_COUNT", WB_STAGE_COUNT},   {"WB_FP8_BLOCK", WB_FP8_BLOCK},
};

struct field {
    const char *name;
    size_t off, size;
};

#define FIELD(T, f)                                                                                \
    {                                                                                              \
#f, offsetof(T, f), sizeof(((T *)0)->f)                                                    \
    }

static const struct field plan_opts[] = {
    FIELD(struct wb_plan_opts, mode),    FIELD(struct wb_plan_opts, mem_cap),
    FIELD(struct wb_plan_opts, threads), FIELD(struct wb_plan_opts, lazy),
    FIELD(struct wb_plan_opts, fit_cap), FIELD(struct wb_plan_opts, relay),
};

static const struct field model_src[] = {
    FIELD(struct wb_model_src, rules),          FIELD(struct wb_model_src, config),
    FIELD(struct wb_model_src, vars),           FIELD(struct wb_model_src, trainer_config),
    FIELD(struct wb_model_src, trainer_inv),    FIELD(struct wb_model_src, rollout_inv),
    FIELD(struct wb_model_src, trainer_layout), FIELD(struct wb_model_src, rollout_layout),
    FIELD(struct wb_model_src, trainer_mem),    FIELD(struct wb_model_src, naming),
};

static const struct field push_stats[] = {
    FIELD(struct wb_push_stats, version),  FIELD(struct wb_push_stats, skipped_by),
    FIELD(struct wb_push_stats, nskipped), FIELD(struct wb_push_stats, skipped),
    FIELD(struct wb_push_stats, failed),   FIELD(struct wb_push_stats, bytes),
    FIELD(struct wb_push_stats, writes),   FIELD(struct wb_push_stats, stage_ns),
    FIELD(struct wb_push_stats, xfer_ns),  FIELD(struct wb_push_stats, wait_ns),
    FIELD(struct wb_push_stats, total_ns),
};

static void put_named(FILE *f, const char *key, const struct named *v, size_t n)
{
    fprintf(f, "  \"%s\": {", key);
    for (size_t i = 0; i < n; i++)
        fprintf(f, "%s\"%s\": %lld", i ? ", " : "", v[i].name, v[i].value);
    fprintf(f, "},\n");
}

static void put_struct(FILE *f, const char *name, const char *header, size_t size,
                       const struct field *v, size_t n, bool last)
{
    fprintf(f, "    \"%s\": {\"header\": \"%s\", \"size\": %zu, \"fields\": [", name, header, size);
    for (size_t i = 0; i < n; i++)
        fprintf(f, "%s[\"%s\", %zu, %zu]", i ? ", " : "", v[i].name, v[i].off, v[i].size);
    fprintf(f, "]}%s\n", last ? "" : ",");
}

static const char *write_facts(void)
{
    static char path[512];
    snprintf(path, sizeof(path), "%s/abi.json", wb_test_tmpdir());
    FILE *f = fopen(path, "w");
    CHECK(f);
    fprintf(f, "{\n");
    put_named(f, "errors", errcodes, sizeof(errcodes) / sizeof(errcodes[0]));
    put_named(f, "consts", consts, sizeof(consts) / sizeof(consts[0]));
    fprintf(f, "  \"modes\": {");
    for (int m = WB_MODE_AUTO; m <= WB_MODE_GATHER; m++) {
        enum wb_plan_mode parsed;
        bool accepted = wb_plan_mode_parse(wb_plan_mode_name((enum wb_plan_mode)m), &parsed) == 0;
        fprintf(f, "%s\"%s\": [%d, %s]", m ? ", " : "", wb_plan_mode_name((enum wb_plan_mode)m), m,
                accepted ? "true" : "false");
    }
    fprintf(f, "},\n  \"structs\": {\n");
    put_struct(f, "wb_plan_opts", "planner/planner.h", sizeof(struct wb_plan_opts), plan_opts,
               sizeof(plan_opts) / sizeof(plan_opts[0]), false);
    put_struct(f, "wb_model_src", "planner/planner.h", sizeof(struct wb_model_src), model_src,
               sizeof(model_src) / sizeof(model_src[0]), false);
    put_struct(f, "wb_push_stats", "agent/agent.h", sizeof(struct wb_push_stats), push_stats,
               sizeof(push_stats) / sizeof(push_stats[0]), true);
    fprintf(f, "  }\n}\n");
    CHECK(fclose(f) == 0);
    return path;
}

/* The sanitizer runtime the library was built with, for preloading into python3 (as
 * tests/sh/python_test.sh does); "" for a plain build. */
static void asan_runtime(const char *so, char *out, size_t cap)
{
    out[0] = 0;
    char cmd[1200];
    snprintf(cmd, sizeof(cmd), "ldd '%s' 2>/dev/null | awk '/libasan/ {print $3}'", so);
    FILE *p = popen(cmd, "r");
    CHECK(p);
    if (fgets(out, (int)cap, p))
        out[strcspn(out, "\n")] = 0;
    pclose(p);
}

static void test_python_ctypes(void)
{
    struct stat st;
    if (system("python3 -c 'import ctypes, json' >/dev/null 2>&1") != 0)
        wb_test_skip("no python3 with ctypes");
    CHECK(stat("tests/sh/abi_check.py", &st) == 0); /* run from the repository root */
    const char *bin = getenv("WB_BIN");
    char so[1024], asan[1024];
    snprintf(so, sizeof(so), "%s/../lib/libweightbridge.so", bin ? bin : "build/bin");
    if (stat(so, &st) != 0)
        wb_test_fail(__FILE__, __LINE__, "%s: no shared library (set WB_BIN)", so);
    asan_runtime(so, asan, sizeof(asan));
    const char *facts = write_facts();
    char cmd[4096];
    snprintf(cmd, sizeof(cmd),
             "WB_LIBRARY='%s' %s%s%s ASAN_OPTIONS=detect_leaks=0 python3 tests/sh/abi_check.py "
             "'%s' 2>&1",
             so, *asan ? "LD_PRELOAD='" : "", asan, *asan ? "'" : "", facts);
    FILE *p = popen(cmd, "r");
    CHECK(p);
    char line[1024];
    while (fgets(line, sizeof(line), p))
        printf("    %s", line);
    int rc = pclose(p);
    CHECK_INT(rc, 0);
}

const struct wb_test wb_tests[] = {
    {"python_ctypes", test_python_ctypes, 0},
    {0},
};
