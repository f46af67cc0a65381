/* planner_stamp_test.c — templates (planner/stamp.c): a plan built with congruent items
 * stamped out from their representative must equal, byte for byte, the plan built by walking
 * and emitting every item. The case is a cut-down Kimi-K2 (DeepSeek-V3 architecture, FP8
 * rollout): 4 layers, 32 experts, FSDP rows of the down projection that straddle 128-row
 * blocks (amax exchanges), on 32 trainer GPUs (fsdp 4 x pp 2 x ep 4) and 2 rollout replicas
 * of 8 GPUs (tp 8, ep 8), in every mode and both residences. */
#include "planner/build.h"
#include "tests/unit/planner_fx.h"

static const char *const CONFIG =
    "{\"architectures\": [\"DeepseekV3ForCausalLM\"], \"model_type\": \"kimi_k2\",\n"
    " \"first_k_dense_replace\": 1, \"hidden_size\": 1792, \"intermediate_size\": 4096,\n"
    " \"kv_lora_rank\": 512, \"moe_intermediate_size\": 1024, \"moe_layer_freq\": 1,\n"
    " \"n_group\": 1, \"n_routed_experts\": 32, \"n_shared_experts\": 1,\n"
    " \"num_attention_heads\": 16, \"num_experts_per_tok\": 4, \"num_hidden_layers\": 4,\n"
    " \"num_key_value_heads\": 16, \"num_nextn_predict_layers\": 0, \"q_lora_rank\": 768,\n"
    " \"qk_nope_head_dim\": 128, \"qk_rope_head_dim\": 64, \"v_head_dim\": 128,\n"
    " \"vocab_size\": 4096, \"tie_word_embeddings\": false, \"torch_dtype\": \"bfloat16\",\n"
    " \"quantization_config\": {\"activation_scheme\": \"dynamic\", \"fmt\": \"e4m3\",\n"
    "   \"quant_method\": \"fp8\", \"weight_block_size\": [128, 128]}}\n";

static const char *const TRAINER = "world_size: 32\n"
                                   "gpus_per_node: 8\n"
                                   "residence: %s\n"
                                   "mesh:\n"
                                   "  - {name: fsdp, size: 4}\n"
                                   "  - {name: pp, size: 2}\n"
                                   "  - {name: ep, size: 4}\n"
                                   "placements:\n"
                                   "  - match: \"model.layers.{layer}.mlp.experts.{expert}.*\"\n"
                                   "    place: {fsdp: shard(0), pp: layer, ep: expert}\n"
                                   "  - match: \"model.layers.{layer}.*\"\n"
                                   "    place: {fsdp: replicate, pp: layer, ep: shard(0)}\n"
                                   "  - match: \"model.embed_tokens.*\"\n"
                                   "    place: {fsdp: replicate, pp: 0, ep: shard(0)}\n"
                                   "  - match: \"*\"\n"
                                   "    place: {fsdp: replicate, pp: last, ep: shard(0)}\n";

static const char *const ROLLOUT = "replicas: 2\n"
                                   "gpus_per_replica: 8\n"
                                   "tp: 8\n"
                                   "ep: 8\n"
                                   "gpus_per_node: 8\n"
                                   "world_size: 16\n";

static const char *const MODEL = "configs/models/deepseek_v3.yaml";

/* The case, loaded with the trainer's parameters in `residence` memory. */
struct kase {
    struct fx f;
    struct wb_model md;
    char *config, *tl;
};

static void case_load(struct kase *k, const char *residence)
{
    fx_init(&k->f);
    char trainer[2048];
    snprintf(trainer, sizeof(trainer), TRAINER, residence);
    k->config = strdup(wb_test_write_file("config.json", CONFIG)); /* static buffer */
    k->tl = strdup(wb_test_write_file("trainer.yaml", trainer));
    struct wb_model_src src = {.rules = MODEL,
                               .config = k->config,
                               .trainer_layout = k->tl,
                               .rollout_layout = wb_test_write_file("rollout.yaml", ROLLOUT)};
    fx_model(&k->f, &src, &k->md);
}

static void case_free(struct kase *k)
{
    wb_model_free(&k->md);
    fx_free(&k->f);
    free(k->config);
    free(k->tl);
}

/* Builds the case without templates in one thread (the reference), then with templates in 1,
 * 2 and 3 threads (ranks split along fsdp: 2 + 2, and 2 + 1 + 1), eagerly and lazily, and
 * compares each with the reference; returns the items stamped (one thread). */
static size_t run(enum wb_plan_mode mode, const char *residence)
{
    struct kase k;
    case_load(&k, residence);
    struct fx *f = &k.f;
    struct wb_plan_opts o = {.mode = mode, .mem_cap = 1ull << 30, .threads = 1};
    struct wb_plan *ps, *pw;
    size_t stamped = 0, none = 1;
    if (pl_plan_build(&f->in, &o, false, &pw, &none, &f->el))
        wb_test_fail(__FILE__, __LINE__, "%s", fx_errors(&f->el));
    CHECK_U64(none, 0);
    for (o.threads = 1; o.threads <= 3; o.threads++) {
        size_t n = 0;
        if (pl_plan_build(&f->in, &o, true, &ps, &n, &f->el))
            wb_test_fail(__FILE__, __LINE__, "%s", fx_errors(&f->el));
        fx_check_same(ps, pw);
        if (wb_plan_verify(ps, &f->in, &f->el))
            wb_test_fail(__FILE__, __LINE__, "verify:\n%s", fx_errors(&f->el));
        wb_plan_free(ps);
        /* lazy: stamped items' ops and records left as segments, the same once expanded */
        struct wb_plan_opts oz = o;
        oz.lazy = true;
        size_t nz = 0;
        if (pl_plan_build(&f->in, &oz, true, &ps, &nz, &f->el))
            wb_test_fail(__FILE__, __LINE__, "%s", fx_errors(&f->el));
        CHECK_U64(nz, n);
        fx_check_same(ps, pw);
        if (wb_plan_verify(ps, &f->in, &f->el))
            wb_test_fail(__FILE__, __LINE__, "verify (lazy):\n%s", fx_errors(&f->el));
        wb_plan_free(ps);
        if (o.threads == 1)
            stamped = n;
        else /* every thread stamps the same items */
            CHECK_U64(n, stamped);
    }
    wb_plan_free(pw);
    case_free(&k);
    return stamped;
}

/* The first table with a stamped segment that has AMAX exchanges, and that segment. */
static struct pl_seg *amax_segment(struct wb_plan *p, uint32_t *rank)
{
    for (uint32_t r = 0; r < p->ntrainers; r++)
        for (uint32_t g = 0; g < pl_lazy_of(p)->t[r].nseg; g++) {
            struct pl_seg *sg = &pl_lazy_of(p)->t[r].seg[g];
            for (uint32_t o = sg->op0; o < sg->op1; o++)
                if (pl_tables(p)[sg->src].ops[o].kind == WB_OP_AMAX && sg->src != r) {
                    *rank = r;
                    return sg;
                }
        }
    return NULL;
}

/* Verify of a lazy plan checks stamped tasks by their segment (lazy.c) and must still catch
 * what is wrong in a segment or in the rows it leaves to its table: each case breaks one. */
static void test_lazy_verify_catches(void)
{
    struct kase k;
    case_load(&k, "host");
    struct fx *f = &k.f;
    struct wb_plan_opts o = {
        .mode = WB_MODE_DIRECT, .mem_cap = 1ull << 30, .threads = 1, .lazy = true};
    for (int c = 0; c < 5; c++) {
        struct wb_plan *p;
        if (wb_plan_build(&f->in, &o, &p, &f->el))
            wb_test_fail(__FILE__, __LINE__, "%s", fx_errors(&f->el));
        uint32_t r = 0;
        struct pl_seg *sg = amax_segment(p, &r);
        CHECK(sg != NULL);
        const char *want = NULL;
        if (c == 0) { /* its records shifted to the next rollout rank */
            sg->dl++;
            want = "never written";
        } else if (c == 1) { /* its exchanges' tags */
            sg->tag_shift++;
            want = "amax";
        } else if (c == 4) { /* where its exchanges arrive */
            sg->inbox_shift += 4;
            want = "do not mirror";
        } else if (c == 2) { /* its trainer tensor renumbered to another's (the embedding,
                                which the rank holds too: its exchanges name it) */
            uint32_t *tm = pl_lazy_of(p)->t[r].pool + sg->map0;
            tm[1] = 0;
            want = "do not mirror";
        } else if (c == 3) { /* a renumbered box that is not the one it stands for */
            CHECK(sg->nbx > 1);
            uint32_t *bx = pl_lazy_of(p)->t[r].pool + sg->map0 + 2 * sg->ntm;
            uint32_t keep = bx[1];
            bx[1] = bx[3];
            bx[3] = keep;
            want = "do not mirror";
        }
        struct wb_errlist el;
        wb_errlist_init(&el);
        CHECK_INT(wb_plan_verify(p, &f->in, &el), -WB_E_PLAN);
        CHECK(el.n > 0);
        if (!strstr(el.msgs[0], want))
            wb_test_fail(__FILE__, __LINE__, "case %d: %s", c, el.msgs[0]);
        wb_errlist_free(&el);
        wb_plan_free(p);
    }
    case_free(&k);
}

static void test_auto_host(void)
{
    /* experts: 3 MoE layers x 2 expert mappings x 4 ep ranks, all but the first of each kind
     * stamped (both pipeline stages: the rank offset covers pp and ep): 22; and items whose
     * balanced demands got their representative's senders, shifted: 5 */
    CHECK_U64(run(WB_MODE_AUTO, "host"), 27);
}

static void test_auto_gpu(void)
{
    CHECK_U64(run(WB_MODE_AUTO, "gpu"), 27);
}

static void test_direct(void)
{
    CHECK_U64(run(WB_MODE_DIRECT, "host"), 27);
}

static void test_gather(void)
{
    /* gather items are balanced over their mesh: stamped where the balancer gave them their
     * representative's senders, shifted */
    CHECK_U64(run(WB_MODE_GATHER, "host"), 55);
}

const struct wb_test wb_tests[] = {
    {"auto_host", test_auto_host, 120},
    {"auto_gpu", test_auto_gpu, 120},
    {"direct", test_direct, 120},
    {"gather", test_gather, 120},
    {"lazy_verify_catches", test_lazy_verify_catches, 120},
    {0},
};
