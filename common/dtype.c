/* dtype.c — element types: sizes, canonical names, and parsing of the names PyTorch,
 * safetensors and Hugging Face configs use. */
#include "common/common.h"

#include <errno.h>
#include <strings.h>

static const struct {
    const char *name;
    size_t size;
} dtypes[WB_DTYPE_COUNT] = {
    [WB_DTYPE_INVALID] = {"invalid", 0},   [WB_DTYPE_BF16] = {"bf16", 2},
    [WB_DTYPE_FP16] = {"fp16", 2},         [WB_DTYPE_FP32] = {"fp32", 4},
    [WB_DTYPE_FP8_E4M3] = {"fp8_e4m3", 1}, [WB_DTYPE_I32] = {"i32", 4},
    [WB_DTYPE_I64] = {"i64", 8},
};

static const struct {
    const char *alias;
    enum wb_dtype dt;
} aliases[] = {
    {"bf16", WB_DTYPE_BF16},         {"bfloat16", WB_DTYPE_BF16},
    {"fp16", WB_DTYPE_FP16},         {"f16", WB_DTYPE_FP16},
    {"float16", WB_DTYPE_FP16},      {"half", WB_DTYPE_FP16},
    {"fp32", WB_DTYPE_FP32},         {"f32", WB_DTYPE_FP32},
    {"float32", WB_DTYPE_FP32},      {"float", WB_DTYPE_FP32},
    {"fp8_e4m3", WB_DTYPE_FP8_E4M3}, {"fp8", WB_DTYPE_FP8_E4M3},
    {"f8_e4m3", WB_DTYPE_FP8_E4M3},  {"float8_e4m3fn", WB_DTYPE_FP8_E4M3},
    {"e4m3", WB_DTYPE_FP8_E4M3},     {"i32", WB_DTYPE_I32},
    {"int32", WB_DTYPE_I32},         {"i64", WB_DTYPE_I64},
    {"int64", WB_DTYPE_I64},         {"long", WB_DTYPE_I64},
};

size_t wb_dtype_size(enum wb_dtype dt)
{
    return (unsigned)dt < WB_DTYPE_COUNT ? dtypes[dt].size : 0;
}

const char *wb_dtype_name(enum wb_dtype dt)
{
    return (unsigned)dt < WB_DTYPE_COUNT ? dtypes[dt].name : "invalid";
}

int wb_dtype_parse(const char *s, enum wb_dtype *out)
{
    if (!s)
        return -EINVAL;
    if (strncasecmp(s, "torch.", 6) == 0)
        s += 6;
    for (size_t i = 0; i < WB_ARRAY_LEN(aliases); i++)
        if (strcasecmp(s, aliases[i].alias) == 0) {
            *out = aliases[i].dt;
            return 0;
        }
    return -EINVAL;
}
