/* job_fuzz.c — a job file (wb_job_load: YAML, every key, durations, sizes, paths) from hostile
 * bytes: it loads or lists its problems, never crashes, and frees everything. */
#include "controller/controller.h"
#include "tests/fuzz/fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct wb_job job;
    struct wb_errlist el;
    wb_errlist_init(&el);
    if (wb_job_load(fuzz_file(data, size, ".yaml"), &job, &el) == 0)
        wb_job_free(&job);
    wb_errlist_free(&el);
    return 0;
}
