/* common_test.c — dtypes, error texts, the error list, logging levels, sizes and the GPU
 * helpers' behaviour on a machine without a GPU. */
#include "common/common.h"
#include "tests/wbtest.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

static void test_dtypes(void)
{
    static const struct {
        enum wb_dtype dt;
        const char *name;
        size_t size;
    } all[] = {
        {WB_DTYPE_BF16, "bf16", 2},         {WB_DTYPE_FP16, "fp16", 2}, {WB_DTYPE_FP32, "fp32", 4},
        {WB_DTYPE_FP8_E4M3, "fp8_e4m3", 1}, {WB_DTYPE_I32, "i32", 4},   {WB_DTYPE_I64, "i64", 8},
    };
    CHECK_INT(WB_ARRAY_LEN(all), WB_DTYPE_COUNT - 1); /* every dtype is covered here */
    for (size_t i = 0; i < WB_ARRAY_LEN(all); i++) {
        enum wb_dtype parsed;
        CHECK_STR(wb_dtype_name(all[i].dt), all[i].name);
        CHECK_INT(wb_dtype_size(all[i].dt), all[i].size);
        CHECK_INT(wb_dtype_parse(all[i].name, &parsed), 0);
        CHECK_INT(parsed, all[i].dt);
    }
    static const struct {
        const char *alias;
        enum wb_dtype dt;
    } aliases[] = {
        {"torch.bfloat16", WB_DTYPE_BF16},
        {"BF16", WB_DTYPE_BF16},
        {"float16", WB_DTYPE_FP16},
        {"F16", WB_DTYPE_FP16},
        {"torch.float32", WB_DTYPE_FP32},
        {"F32", WB_DTYPE_FP32},
        {"float8_e4m3fn", WB_DTYPE_FP8_E4M3},
        {"F8_E4M3", WB_DTYPE_FP8_E4M3},
        {"int32", WB_DTYPE_I32},
        {"I64", WB_DTYPE_I64},
    };
    for (size_t i = 0; i < WB_ARRAY_LEN(aliases); i++) {
        enum wb_dtype parsed = WB_DTYPE_INVALID;
        CHECK_INT(wb_dtype_parse(aliases[i].alias, &parsed), 0);
        CHECK_INT(parsed, aliases[i].dt);
    }
    enum wb_dtype untouched = WB_DTYPE_FP32;
    CHECK_INT(wb_dtype_parse("float8_e5m2", &untouched), -EINVAL);
    CHECK_INT(wb_dtype_parse("", &untouched), -EINVAL);
    CHECK_INT(wb_dtype_parse(NULL, &untouched), -EINVAL);
    CHECK_INT(untouched, WB_DTYPE_FP32);
    CHECK_INT(wb_dtype_size(WB_DTYPE_INVALID), 0);
    CHECK_INT(wb_dtype_size((enum wb_dtype)99), 0);
    CHECK_STR(wb_dtype_name((enum wb_dtype)99), "invalid");
}

static void test_strerror(void)
{
    CHECK_STR(wb_strerror(0), "success");
    CHECK_STR(wb_strerror(-EINVAL), "Invalid argument");
    CHECK_STR(wb_strerror(-EBADMSG), "Bad message");
    CHECK_STR(wb_strerror(-WB_E_CONFIG), "invalid configuration");
    CHECK_STR(wb_strerror(WB_E_BOUNDS), "write outside its destination region");
    CHECK_STR(wb_strerror(-WB_E_ENDED), "the job was shut down");
    CHECK_STR(wb_strerror(-WB_E_PEER), "peer died or stopped answering");
    CHECK_STR(wb_strerror(-WB_E_LAST), "unknown error");
    for (int e = WB_E_FIRST; e < WB_E_LAST; e++)
        CHECK(strcmp(wb_strerror(-e), "unknown error") != 0);
}

static void test_errlist(void)
{
    struct wb_errlist el;
    wb_errlist_init(&el);
    for (int i = 0; i < 20; i++)
        CHECK_INT(wb_errlist_add(&el, "tensor %d: %s", i, "bad"), 0);
    CHECK_INT(el.n, 20);
    CHECK_STR(el.msgs[0], "tensor 0: bad");
    CHECK_STR(el.msgs[19], "tensor 19: bad");
    const char *path = wb_test_write_file("el.txt", "");
    FILE *f = fopen(path, "w");
    wb_errlist_print(&el, "error: ", f);
    fclose(f);
    f = fopen(path, "r");
    char line[64];
    CHECK(fgets(line, sizeof(line), f));
    CHECK_STR(line, "error: tensor 0: bad\n");
    fclose(f);
    wb_errlist_free(&el);
    CHECK_INT(el.n, 0);
    CHECK(el.msgs == NULL);
}

static void emit_logs(void *level_env)
{
    if (level_env)
        setenv("WB_LOG", level_env, 1);
    else
        unsetenv("WB_LOG");
    wb_log(WB_LOG_DEBUG, "planner", "debug %d", 1);
    wb_log(WB_LOG_INFO, "agent", "info %s", "x");
    wb_log(WB_LOG_WARN, "transport", "warn");
    wb_log(WB_LOG_ERROR, "controller", "rank %d died", 3);
}

/* What wb_log writes, in a fresh process (the level is read once per process). */
static const char *log_output(const char *level_env)
{
    static char out[1024];
    CHECK_INT(wb_test_capture(emit_logs, (void *)level_env, out, sizeof(out)), 0);
    return out;
}

static void test_logging_levels(void)
{
    CHECK_STR(log_output(NULL), "wb warn transport: warn\nwb error controller: rank 3 died\n");
    CHECK_STR(log_output("debug"), "wb debug planner: debug 1\nwb info agent: info x\n"
                                   "wb warn transport: warn\nwb error controller: rank 3 died\n");
    CHECK_STR(log_output("ERROR"), "wb error controller: rank 3 died\n");
    CHECK_STR(log_output("off"), "");
    CHECK_STR(log_output("loud"), "wb warn common: WB_LOG=loud is not debug|info|warn|error|off\n"
                                  "wb warn transport: warn\nwb error controller: rank 3 died\n");
    enum wb_log_level l;
    CHECK_INT(wb_log_level_parse("info", &l), 0);
    CHECK_INT(l, WB_LOG_INFO);
    CHECK_INT(wb_log_level_parse("verbose", &l), -EINVAL);
}

static void test_fmt_bytes(void)
{
    char b[32];
    CHECK_STR(wb_fmt_bytes(0, b, sizeof(b)), "0 B");
    CHECK_STR(wb_fmt_bytes(1023, b, sizeof(b)), "1023 B");
    CHECK_STR(wb_fmt_bytes(1536, b, sizeof(b)), "1.50 KiB");
    CHECK_STR(wb_fmt_bytes(1ull << 40, b, sizeof(b)), "1.00 TiB");
    uint64_t a = wb_now_ns(), c = wb_now_ns();
    CHECK(c >= a);
}

static void test_grow(void)
{
    uint64_t *a = NULL;
    size_t n = 0, cap = 0;
    for (uint64_t i = 0; i < 1000; i++) {
        if (n == cap)
            CHECK_INT(wb_grow(&a, &cap, 4, sizeof(*a)), 0);
        a[n++] = i * i;
    }
    CHECK_U64(cap, 1024); /* 4, 8, ..., 1024 */
    CHECK_U64(a[999], 998001);
    size_t huge = SIZE_MAX / 4;
    uint64_t *keep = a;
    CHECK_INT(wb_grow(&a, &huge, 4, sizeof(*a)), -ENOMEM);
    CHECK(a == keep);
    CHECK_U64(huge, SIZE_MAX / 4);
    free(a);
}

/* Names from files others wrote are printed escaped: no control character, no terminal escape
 * sequence, no byte that is not UTF-8 reaches the output; UTF-8 text is kept as it is. */
static void test_esc(void)
{
    CHECK_STR(wb_esc("model.layers.0.mlp.gate.weight").s, "model.layers.0.mlp.gate.weight");
    CHECK_STR(wb_esc("a\nb\tc\rd\\e").s, "a\\nb\\tc\\rd\\\\e");
    CHECK_STR(wb_esc("\033[2J\033[31mred\033[0m\x7f\x01").s,
              "\\x1b[2J\\x1b[31mred\\x1b[0m\\x7f\\x01");
    CHECK_STR(wb_esc("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80").s,
              "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"); /* é € and an emoji */
    CHECK_STR(wb_esc("\xc2\x9b[31m").s, "\\xc2\\x9b[31m");  /* U+009B, the C1 CSI */
    /* not UTF-8: a lone C1 byte, a cut sequence, an overlong '/', a surrogate, past U+10FFFF */
    CHECK_STR(wb_esc("\x9b|\xc3|\xc0\xaf|\xed\xa0\x80|\xf4\x90\x80\x80").s,
              "\\x9b|\\xc3|\\xc0\\xaf|\\xed\\xa0\\x80|\\xf4\\x90\\x80\\x80");
    CHECK_STR(wb_esc(NULL).s, "(null)");
    CHECK_STR(wb_esc("").s, "");
    /* a result that fits is kept whole; a longer one is cut, "..." at its end */
    char in[2100], want[WB_ESC_MAX];
    memset(in, 'a', WB_ESC_MAX - 1);
    in[WB_ESC_MAX - 1] = 0;
    CHECK_STR(wb_esc(in).s, in);
    memset(in, 'a', sizeof(in) - 1);
    in[sizeof(in) - 1] = 0;
    memset(want, 'a', WB_ESC_MAX - 4);
    memcpy(want + WB_ESC_MAX - 4, "...", 4);
    CHECK_STR(wb_esc(in).s, want);
    for (size_t i = 0; i + 1 < sizeof(in); i++)
        in[i] = '\n'; /* 2 bytes each: 510 of them and "..." */
    CHECK_U64(strlen(wb_esc(in).s), 510 * 2 + 3);
    CHECK(strcmp(wb_esc(in).s + 1020, "...") == 0);
    /* into a buffer of the caller's: cut to fit, an escape never split */
    char small[9];
    CHECK_STR(wb_esc_str("abcdefgh", small, 9), "abcdefgh");
    CHECK_STR(wb_esc_str("abcdefghi", small, 9), "abcde...");
    CHECK_STR(wb_esc_str("ab\ncdefg", small, 9), "ab\\nc...");
    CHECK_STR(wb_esc_str("abcd\033", small, 9), "abcd\\x1b");
    CHECK_STR(wb_esc_str("abcde\033", small, 9), "abcde...");
    CHECK_STR(wb_esc_str("x", small, 3), "");
}

/* YAML nesting is bounded at 64 levels: 40,000 nested '[' took 42 s in libyaml's scanner and its
 * loader recurses per level; refused at the node that passes the bound, file and string alike. */
static void yaml_expect(const char *text, bool from_file, const char *want)
{
    struct wb_errlist el;
    wb_errlist_init(&el);
    struct wb_yaml *y = NULL;
    int r;
    char full[512];
    if (from_file) {
        const char *path = wb_test_write_file("deep.yaml", text);
        r = wb_yaml_load(path, &el, &y);
        if (want) {
            CHECK_INT(r, -WB_E_CONFIG);
            CHECK_INT(el.n, 1);
            snprintf(full, sizeof(full), "%s%s", path, want);
            CHECK_STR(el.msgs[0], full);
        }
    } else {
        r = wb_yaml_load_string("deep.yaml", text, &el, &y);
        if (want) {
            CHECK_INT(r, -WB_E_CONFIG);
            CHECK_INT(el.n, 1);
            snprintf(full, sizeof(full), "deep.yaml%s", want);
            CHECK_STR(el.msgs[0], full);
        }
    }
    if (!want) {
        CHECK_INT(r, 0);
        CHECK_INT(el.n, 0);
    }
    CHECK(want ? y == NULL : y != NULL);
    wb_yaml_free(y);
    wb_errlist_free(&el);
}

static void test_yaml_nesting(void)
{
    size_t n = 40000;
    char *flow = malloc(2 * n + 2);
    CHECK(flow != NULL);
    memset(flow, '[', n);
    memset(flow + n, ']', n);
    strcpy(flow + 2 * n, "\n");
    yaml_expect(flow, false, ":1:65: nested deeper than 64 levels");
    yaml_expect(flow, true, ":1:65: nested deeper than 64 levels");
    flow[64] = '1';
    memmove(flow + 65, flow + n, 64);
    strcpy(flow + 129, "\n");
    yaml_expect(flow, false, NULL); /* exactly 64 levels load */
    free(flow);
    /* block mappings, one level per line and two spaces of indent: the 65th key's value */
    char *block = malloc(70 * 140);
    CHECK(block != NULL);
    size_t at = 0;
    for (int i = 0; i < 65; i++)
        at += (size_t)sprintf(block + at, "%*sk%d:\n", 2 * i, "", i);
    sprintf(block + at, "%*sv\n", 2 * 65, "");
    yaml_expect(block, true, ":65:129: nested deeper than 64 levels");
    free(block);
}

static void test_gpu_helpers(void)
{
    int host = 0;
    CHECK(!wb_gpu_is_device_ptr(&host));
    CHECK(!wb_gpu_is_device_ptr(NULL));
    CHECK_INT(wb_gpu_ptr_device(&host), WB_GPU_HOST);
    CHECK_INT(wb_gpu_ptr_device(NULL), WB_GPU_HOST);
    CHECK_INT(wb_gpu_count(), wb_gpu_count()); /* asked once, the same answer */
    if (!wb_gpu_built())
        CHECK_INT(wb_gpu_count(), 0);
    else if (wb_gpu_count() == 0)
        wb_test_skip("built with CUDA but no GPU on this machine: device pointers not checked");
    CHECK(wb_gpu_count() >= 0);
}

/* SipHash-2-4 against the vectors of its paper (key 00..0f, messages 00 01 02 ... of every
 * length): the empty message, one byte, and the paper's worked example of 15 bytes. */
static void test_siphash(void)
{
    uint8_t key[WB_MAC_KEY_BYTES], msg[64];
    for (int i = 0; i < 16; i++)
        key[i] = (uint8_t)i;
    for (int i = 0; i < 64; i++)
        msg[i] = (uint8_t)i;
    CHECK_U64(wb_siphash(key, msg, 0), 0x726fdb47dd0e0e31ull);
    CHECK_U64(wb_siphash(key, msg, 1), 0x74f839c593dc67fdull);
    CHECK_U64(wb_siphash(key, msg, 15), 0xa129ca6149be45e5ull);
    /* one key bit changes everything */
    key[15] ^= 1;
    CHECK(wb_siphash(key, msg, 15) != 0xa129ca6149be45e5ull);
}

const struct wb_test wb_tests[] = {
    {"siphash", test_siphash, 0},
    {"dtypes", test_dtypes, 0},
    {"strerror", test_strerror, 0},
    {"errlist", test_errlist, 0},
    {"logging_levels", test_logging_levels, 0},
    {"fmt_bytes", test_fmt_bytes, 0},
    {"grow", test_grow, 0},
    {"gpu_helpers", test_gpu_helpers, 0},
    {"esc", test_esc, 0},
    {"yaml_nesting", test_yaml_nesting, 0},
    {0},
};
