/* plan_golden_test.c — the shipped scenarios' plans must not change by accident: a digest of
 * every routing table's and receive list's envelope encoding (in rank order, each prefixed by
 * its length) is compared with the value recorded when the plan was last changed on purpose.
 *
 * A refactor that moves code around leaves these digests alone; a change to what the planner
 * decides (or to the wire format) changes them, and then the new values are recorded here in
 * the same commit, with the reason in its message. */
#include "tests/unit/planner_fx.h"

struct scenario {
    const char *model, *config, *trainer, *rollout;
    uint64_t mem_cap;
};

static const struct scenario KIMI = {"configs/models/deepseek_v3.yaml",
                                     "configs/hf/Kimi-K2-Instruct.json",
                                     "configs/clusters/kimi-k2-trainer-256.yaml",
                                     "configs/clusters/kimi-k2-rollout-128.yaml", 1ull << 30};
static const struct scenario QWEN = {"configs/models/qwen3_moe.yaml",
                                     "configs/hf/Qwen3-235B-A22B-FP8.json",
                                     "configs/clusters/qwen3-235b-trainer-128.yaml",
                                     "configs/clusters/qwen3-235b-rollout-32.yaml", 1ull << 30};
static const struct scenario DEMO = {
    "configs/models/qwen3_moe.yaml", "configs/jobs/demo/config.json",
    "configs/jobs/demo/trainer.yaml", "configs/jobs/demo/rollout.yaml", 4ull << 20};

/* FNV-1a, 64 bits: enough to tell two plans apart, and no dependency. */
static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

static uint64_t digest_blob(uint64_t h, struct wb_mpw *w)
{
    uint64_t len = w->len;
    h = fnv(h, &len, sizeof(len));
    h = fnv(h, w->buf, w->len);
    wb_mpw_free(w);
    return h;
}

static void run(const struct scenario *sc, enum wb_plan_mode mode, uint64_t want)
{
    struct fx f;
    struct wb_model md;
    struct wb_model_src src = {.rules = sc->model,
                               .config = sc->config,
                               .trainer_layout = sc->trainer,
                               .rollout_layout = sc->rollout};
    fx_init(&f);
    fx_model(&f, &src, &md);
    struct wb_plan_opts o = {.mode = mode, .mem_cap = sc->mem_cap};
    struct wb_plan *p;
    if (wb_plan_build(&f.in, &o, &p, &f.el))
        wb_test_fail(__FILE__, __LINE__, "%s", fx_errors(&f.el));
    uint64_t h = 0xcbf29ce484222325ull;
    for (uint32_t r = 0; r < p->ntrainers; r++) {
        struct wb_mpw w = fx_encode_table(&pl_tables(p)[r]);
        h = digest_blob(h, &w);
    }
    for (uint32_t g = 0; g < p->nrollouts; g++) {
        struct wb_mpw w = fx_encode_recv(&p->recv[g]);
        h = digest_blob(h, &w);
    }
    printf("plan digest %#018" PRIx64 "\n", h);
    CHECK_U64(h, want);
    wb_plan_free(p);
    wb_model_free(&md);
    fx_free(&f);
}

static void test_kimi_auto(void)
{
    run(&KIMI, WB_MODE_AUTO, 0xbc1642cad0fd8080ull);
}
static void test_kimi_gather(void)
{
    run(&KIMI, WB_MODE_GATHER, 0xc05fc6f13e63a036ull);
}
static void test_qwen_auto(void)
{
    run(&QWEN, WB_MODE_AUTO, 0xd84ae2e5b687505cull);
}
static void test_qwen_gather(void)
{
    run(&QWEN, WB_MODE_GATHER, 0x3ba1c864f1efc831ull);
}
static void test_demo_auto(void)
{
    run(&DEMO, WB_MODE_AUTO, 0xc499d32f1ce9c039ull);
}
static void test_demo_gather(void)
{
    run(&DEMO, WB_MODE_GATHER, 0xba8dad358cbe0248ull);
}

const struct wb_test wb_tests[] = {
    {"kimi_k2_auto", test_kimi_auto, 300},
    {"kimi_k2_gather", test_kimi_gather, 300},
    {"qwen3_235b_auto", test_qwen_auto, 120},
    {"qwen3_235b_gather", test_qwen_gather, 120},
    {"demo_auto", test_demo_auto, 60},
    {"demo_gather", test_demo_gather, 60},
    {0},
};
