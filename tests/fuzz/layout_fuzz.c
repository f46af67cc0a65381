/* layout_fuzz.c — trainer and rollout layout files (planner/: meshes, placement rules,
 * hardware) from hostile bytes: each loads or lists its problems, never crashes. */
#include "planner/planner.h"
#include "tests/fuzz/fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *path = fuzz_file(data, size, ".yaml");
    struct wb_errlist el;
    wb_errlist_init(&el);
    struct wb_trainer_layout t;
    if (wb_trainer_layout_load(path, &t, &el) == 0)
        wb_trainer_layout_free(&t);
    struct wb_rollout_layout r;
    if (wb_rollout_layout_load(path, &r, &el) == 0)
        wb_rollout_layout_free(&r);
    wb_errlist_free(&el);
    return 0;
}
