/* hfconfig_fuzz.c — a Hugging Face config.json from hostile bytes, through the shipped model
 * rules (the first byte picks the family): values are read, expressions over them evaluated and
 * tensors generated within their bounds, or the problems listed. Each family file is opened
 * once (the generator only reads it), so that an execution is the config's work alone. */
#include "matcher/matcher.h"
#include "matcher/mpriv.h"
#include "tests/fuzz/fuzz.h"

static const char *const FAMILIES[] = {
    "configs/models/qwen3_moe.yaml", "configs/models/deepseek_v3.yaml",
    "configs/models/llama3.yaml",    "configs/models/gpt_oss.yaml",
    "configs/models/phi3.yaml",
};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    enum { NFAM = sizeof(FAMILIES) / sizeof(FAMILIES[0]) };
    static struct wb_family *open[NFAM];
    size_t fi = data[0] % NFAM;
    const char *fam = FAMILIES[fi];
    if (!open[fi]) {
        struct wb_errlist el;
        wb_errlist_init(&el);
        if (mx_family_open(fam, &open[fi], &el))
            abort(); /* a shipped family file that does not load */
        wb_errlist_free(&el);
    }
    const char *path = fuzz_file(data + 1, size - 1, ".json");
    for (int side = 0; side < 2; side++) {
        struct wb_inventory inv;
        struct wb_errlist el;
        wb_inv_init(&inv);
        wb_errlist_init(&el);
        mx_inv_generate_family(open[fi], fam, path, NULL, NULL, side ? "rollout" : "trainer", &inv,
                               &el);
        wb_inv_free(&inv);
        wb_errlist_free(&el);
    }
    return 0;
}
