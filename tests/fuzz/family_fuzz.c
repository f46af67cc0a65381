/* family_fuzz.c — a model-family file from hostile bytes: the rules load (every key, split
 * lists, shard forms, the shadow check over every pair of rules) or list their problems; a file
 * that loads generates both sides from a small Phi-3-shaped config.json and matches them (split
 * sizes, rules that build nothing), within the generator's and the shadow check's bounds. Never
 * a crash or a leak. */
#include "matcher/matcher.h"
#include "tests/fuzz/fuzz.h"

static const char *const CONFIG = "tests/fixtures/matcher/phi3-tiny-fp8.json";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *path = fuzz_file(data, size, ".yaml");
    struct wb_errlist el;
    wb_errlist_init(&el);
    struct wb_match_rules *r = NULL;
    if (wb_match_rules_load(path, &r, &el) == 0) {
        struct wb_inventory t, ro;
        wb_inv_init(&t);
        wb_inv_init(&ro);
        struct wb_match *m = NULL;
        /* a family with no model_type takes the config; with another one it is refused */
        if (wb_match_rules_bind_config(r, CONFIG, &el) == 0 &&
            wb_match_rules_generate(r, CONFIG, "trainer", &t, &el) == 0 &&
            wb_match_rules_generate(r, CONFIG, "rollout", &ro, &el) == 0 &&
            wb_match_run(r, &t, &ro, &m, &el) == 0)
            wb_match_free(m);
        wb_inv_free(&t);
        wb_inv_free(&ro);
        wb_match_rules_free(r);
    }
    wb_errlist_free(&el);
    return 0;
}
