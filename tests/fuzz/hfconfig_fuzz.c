/* hfconfig_fuzz.c — a Hugging Face config.json from hostile bytes, through the shipped model
 * rules (the first byte picks the family): values are read, expressions over them evaluated and
 * tensors generated within their bounds, or the problems listed. */
#include "matcher/matcher.h"
#include "tests/fuzz/fuzz.h"

static const char *const FAMILIES[] = {
    "configs/models/qwen3_moe.yaml",
    "configs/models/deepseek_v3.yaml",
    "configs/models/llama3.yaml",
    "configs/models/gpt_oss.yaml",
};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    const char *fam = FAMILIES[data[0] % (sizeof(FAMILIES) / sizeof(FAMILIES[0]))];
    if (access(fam, R_OK))
        return 0;
    const char *path = fuzz_file(data + 1, size - 1, ".json");
    for (int side = 0; side < 2; side++) {
        struct wb_inventory inv;
        struct wb_errlist el;
        wb_inv_init(&inv);
        wb_errlist_init(&el);
        wb_inv_generate(fam, path, side ? "rollout" : "trainer", &inv, &el);
        wb_inv_free(&inv);
        wb_errlist_free(&el);
    }
    return 0;
}
