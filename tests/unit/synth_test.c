/* synth_test.c — the synthetic parameter source (deterministic, shard-consistent), the
 * BF16/FP16 conversions it uses (common/fpbits.h), and the launcher-environment rank discovery. */
#include "agent/agent.h"
#include "tests/wbtest.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static void test_deterministic(void)
{
    float a = wb_synth_value("model.layers.0.mlp.gate_proj.weight", 7, 3, 12345);
    float b = wb_synth_value("model.layers.0.mlp.gate_proj.weight", 7, 3, 12345);
    CHECK(a == b);
    CHECK(a != wb_synth_value("model.layers.0.mlp.gate_proj.weight", 7, 4, 12345));
    CHECK(a != wb_synth_value("model.layers.0.mlp.gate_proj.weight", 8, 3, 12345));
    CHECK(a != wb_synth_value("model.layers.0.mlp.up_proj.weight", 7, 3, 12345));
    /* magnitudes stay within [2^-6, 2^2] */
    for (uint64_t i = 0; i < 1000; i++) {
        float v = wb_synth_value("t", 1, 1, i);
        CHECK(v >= -4.0f && v < 4.0f);
    }
}

static void test_box_matches_full(void)
{
    struct wb_shape s = {.ndim = 3, .dim = {4, 6, 10}};
    uint64_t n = wb_shape_numel(&s);
    uint16_t *full = malloc(n * 2), *part = malloc(n * 2);
    struct wb_box all = wb_box_full(&s);
    CHECK_INT(wb_synth_fill("w", 1, 2, WB_DTYPE_BF16, &s, &all, full), 0);
    for (uint64_t i = 0; i < n; i++)
        CHECK_INT(full[i], wb_f32_to_bf16(wb_synth_value("w", 1, 2, i)));
    struct wb_box b = {.ndim = 3, .off = {1, 2, 3}, .ext = {2, 3, 5}};
    CHECK_INT(wb_synth_fill("w", 1, 2, WB_DTYPE_BF16, &s, &b, part), 0);
    uint64_t k = 0;
    for (uint64_t i = 1; i < 3; i++)
        for (uint64_t j = 2; j < 5; j++)
            for (uint64_t l = 3; l < 8; l++)
                CHECK_INT(part[k++], full[(i * 6 + j) * 10 + l]);
    struct wb_box out = {.ndim = 3, .off = {3, 0, 0}, .ext = {2, 1, 1}};
    CHECK_INT(wb_synth_fill("w", 1, 2, WB_DTYPE_BF16, &s, &out, part), -EINVAL);
    CHECK_INT(wb_synth_fill("w", 1, 2, WB_DTYPE_FP8_E4M3, &s, &b, part), -EINVAL);
    float *f = malloc(n * 4);
    CHECK_INT(wb_synth_fill("w", 1, 2, WB_DTYPE_FP32, &s, &all, f), 0);
    CHECK(f[17] == wb_synth_value("w", 1, 2, 17));
    free(f);
    free(full);
    free(part);
}

/* synthetic_change: with period P every element draws a new value exactly once in any P
 * consecutive versions (at a phase of its own), the rest stay bit for bit; a shard's fill is
 * the whole tensor's slice; period 0 is the plain source. */
static void test_change_period(void)
{
    enum { N = 256, P = 8 };
    struct wb_shape s = {.ndim = 2, .dim = {N, N}};
    struct wb_box all = {.ndim = 2, .off = {0, 0}, .ext = {N, N}};
    float *prev = malloc(N * N * 4), *cur = malloc(N * N * 4), *part = malloc(N * N * 4);
    uint8_t *times = calloc(N * N, 1);
    CHECK(prev && cur && part && times);
    CHECK_INT(wb_synth_fill_change("w", 5, 3, 0, WB_DTYPE_FP32, &s, &all, cur), 0);
    CHECK_INT(wb_synth_fill("w", 5, 3, WB_DTYPE_FP32, &s, &all, prev), 0);
    CHECK_MEM(cur, prev, N * N * 4);
    CHECK_INT(wb_synth_fill_change("w", 5, 1, P, WB_DTYPE_FP32, &s, &all, prev), 0);
    uint64_t total = 0;
    for (uint64_t v = 2; v <= P + 1; v++) {
        CHECK_INT(wb_synth_fill_change("w", 5, v, P, WB_DTYPE_FP32, &s, &all, cur), 0);
        uint64_t n = 0;
        for (uint32_t i = 0; i < N * N; i++)
            if (memcmp(&cur[i], &prev[i], 4)) {
                n++;
                times[i]++;
            }
        CHECK(n > N * N / P / 2 && n < N * N / P * 2); /* about 1/P of them each version */
        total += n;
        memcpy(prev, cur, N * N * 4);
    }
    CHECK_U64(total, N * N);
    for (uint32_t i = 0; i < N * N; i++)
        CHECK_INT(times[i], 1);
    struct wb_box b = {.ndim = 2, .off = {100, 7}, .ext = {50, 60}};
    CHECK_INT(wb_synth_fill_change("w", 5, P + 1, P, WB_DTYPE_FP32, &s, &b, part), 0);
    for (uint32_t r = 0; r < 50; r++)
        CHECK_MEM(&part[r * 60], &cur[(100 + r) * N + 7], 60 * 4);
    free(prev);
    free(cur);
    free(part);
    free(times);
}

static void test_half_conversions(void)
{
    CHECK_INT(wb_f32_to_bf16(1.0f), 0x3f80);
    CHECK_INT(wb_f32_to_bf16(-2.0f), 0xc000);
    CHECK_INT(wb_f32_to_bf16(1.00390625f), 0x3f80); /* tie -> even (down) */
    CHECK_INT(wb_f32_to_bf16(1.01171875f), 0x3f82); /* tie -> even (up) */
    CHECK(wb_bf16_to_f32(0x3f81) == 1.0078125f);
    CHECK_INT(wb_f32_to_fp16(1.0f), 0x3c00);
    CHECK_INT(wb_f32_to_fp16(65504.0f), 0x7bff);
    CHECK_INT(wb_f32_to_fp16(65520.0f), 0x7c00);
    CHECK_INT(wb_f32_to_fp16(5.9604645e-8f), 0x0001);  /* smallest subnormal */
    CHECK_INT(wb_f32_to_fp16(1.00048828125f), 0x3c00); /* tie -> even */
    CHECK(wb_fp16_to_f32(0x3555) == 0.333251953125f);
    CHECK(wb_fp16_to_f32(0x0001) == 5.9604645e-8f);
}

static void test_launch_env(void)
{
    struct wb_launch_env e;
    const char *bad = NULL;
    unsetenv("RANK");
    unsetenv("LOCAL_RANK");
    unsetenv("WORLD_SIZE");
    unsetenv("SLURM_PROCID");
    unsetenv("SLURM_LOCALID");
    unsetenv("SLURM_NTASKS");
    CHECK_INT(wb_launch_env_read(&e, &bad), 0);
    CHECK_STR(e.source, "none");
    CHECK_INT(e.rank, -1);
    setenv("SLURM_PROCID", "5", 1);
    setenv("SLURM_LOCALID", "1", 1);
    setenv("SLURM_NTASKS", "8", 1);
    CHECK_INT(wb_launch_env_read(&e, &bad), 0);
    CHECK_STR(e.source, "slurm");
    CHECK_INT(e.rank, 5);
    CHECK_INT(e.local_rank, 1);
    CHECK_INT(e.world, 8);
    setenv("RANK", "2", 1); /* torchrun wins */
    setenv("LOCAL_RANK", "x", 1);
    CHECK_INT(wb_launch_env_read(&e, &bad), -EINVAL);
    CHECK_STR(bad, "LOCAL_RANK");
    setenv("LOCAL_RANK", "2", 1);
    setenv("WORLD_SIZE", "4", 1);
    CHECK_INT(wb_launch_env_read(&e, &bad), 0);
    CHECK_STR(e.source, "torchrun");
    CHECK_INT(e.rank, 2);
    CHECK_INT(e.local_rank, 2);
    CHECK_INT(e.world, 4);
}

const struct wb_test wb_tests[] = {
    {"deterministic", test_deterministic, 0}, {"box_matches_full", test_box_matches_full, 0},
    {"change_period", test_change_period, 0}, {"half_conversions", test_half_conversions, 0},
    {"launch_env", test_launch_env, 0},       {0},
};
