/* planner_rows_test.c — the trainer side of a checkpoint broadcast: tensors placed by explicit
 * row ranges (each reader holds the rows its byte range of the files covers) and FP8
 * checkpoints copied into FP8 rollouts (values and their scale tensors, placed apart). Plans
 * are executed on the CPU and every rollout byte is compared with a reference
 * (planner_sim.h), and checked by wb_plan_verify. */
#include "tests/unit/planner_sim.h"

/* Owners of trainer tensor t as "rank[box] ...". */
static const char *owners_str(struct fx *f, uint32_t t)
{
    static char buf[1024];
    struct wb_owner *o;
    uint32_t n;
    CHECK_INT(wb_trainer_owners(&f->tl, &f->ti, t, &o, &n, &f->el), 0);
    size_t pos = 0;
    buf[0] = 0;
    for (uint32_t i = 0; i < n; i++) {
        char b[128];
        pos += (size_t)snprintf(buf + pos, sizeof(buf) - pos, "%s%u%s", i ? " " : "", o[i].rank,
                                wb_box_str(&o[i].box, b, sizeof(b)));
    }
    free(o);
    return buf;
}

/* A layout of `readers` readers from per-tensor placements: INDEX k (whole tensor on reader
 * k, cuts NULL) or ROWS with the given cuts. */
struct placed {
    const char *name;
    int32_t index;       /* >= 0: INDEX */
    const uint64_t *cut; /* ROWS */
};

static int reader_layout(struct fx *f, uint32_t readers, const struct placed *p, size_t n)
{
    struct wb_mesh_dim dim = {.size = readers};
    snprintf(dim.name, sizeof(dim.name), "reader");
    const char *names[16];
    struct wb_placement place[16];
    const uint64_t *rows[16];
    CHECK(n <= 16);
    for (size_t i = 0; i < n; i++) {
        names[i] = p[i].name;
        place[i] = p[i].index >= 0 ? (struct wb_placement){WB_PLACE_INDEX, (uint32_t)p[i].index}
                                   : (struct wb_placement){WB_PLACE_ROWS, 0};
        rows[i] = p[i].index >= 0 ? NULL : p[i].cut;
    }
    return wb_trainer_layout_from_placements(1, &dim, 0, WB_RESIDE_HOST, n, names, place, rows,
                                             "the readers", &f->tl, &f->el);
}

static void test_rows_bf16_to_fp8(void)
{
    /* w is cut inside its first FP8 block row (rows 100 | 412): readers 0 and 1 exchange the
     * block's partial amax; up is split 3 | 3 between readers 1 and 2; norm and gate sit whole
     * on one reader each. Two replicas of TP 2. */
    struct fx f;
    fx_init(&f);
    uint32_t w = fx_t(&f, "w", WB_DTYPE_BF16, fx_shape(2, 512, 256));
    uint32_t n = fx_t(&f, "norm", WB_DTYPE_BF16, fx_shape(1, 10));
    uint32_t g = fx_t(&f, "gate", WB_DTYPE_BF16, fx_shape(2, 6, 4));
    uint32_t u = fx_t(&f, "up", WB_DTYPE_BF16, fx_shape(2, 6, 4));
    uint32_t rw = fx_r(&f, "w", WB_DTYPE_FP8_E4M3, fx_shape(2, 512, 256));
    uint32_t rs = fx_r(&f, "w_scale", WB_DTYPE_FP32, fx_shape(2, 4, 2));
    uint32_t rn = fx_r(&f, "norm", WB_DTYPE_BF16, fx_shape(1, 10));
    uint32_t gu = fx_r(&f, "gate_up", WB_DTYPE_BF16, fx_shape(2, 12, 4));
    struct wb_mapping *m = fx_map(&f, rw, (int32_t)rs, WB_XFORM_FP8_BLOCK, WB_SHARD_TP, 1);
    fx_comp_full(&f, m, w, fx_box(2, 0, 512, 0, 256));
    m = fx_map(&f, rn, -1, WB_XFORM_COPY, WB_SHARD_REPLICATE, 0);
    fx_comp_full(&f, m, n, fx_box(1, 0, 10));
    m = fx_map(&f, gu, -1, WB_XFORM_COPY, WB_SHARD_TP, 0);
    fx_comp_full(&f, m, g, fx_box(2, 0, 6, 0, 4));
    fx_comp_full(&f, m, u, fx_box(2, 6, 6, 0, 4));
    static const uint64_t wcut[] = {0, 100, 512, 512}, ucut[] = {0, 0, 3, 6};
    const struct placed pl[] = {
        {"w", -1, wcut}, {"norm", 2, NULL}, {"gate", 0, NULL}, {"up", -1, ucut}};
    CHECK_INT(reader_layout(&f, 3, pl, 4), 0);
    struct wb_errlist el;
    wb_errlist_init(&el);
    CHECK_INT(
        wb_rollout_layout_load(wb_test_write_file("r.yaml", "replicas: 2\ntp: 2\n"), &f.rl, &el),
        0);
    wb_errlist_free(&el);
    CHECK_STR(owners_str(&f, w), "0[0:100, 0:256] 1[100:512, 0:256]");
    CHECK_STR(owners_str(&f, u), "1[0:3, 0:4] 2[3:6, 0:4]");
    CHECK_STR(owners_str(&f, n), "2[0:10]");
    CHECK_STR(owners_str(&f, g), "0[0:6, 0:4]");
    struct wb_plan *p = sim_plan_check(&f, WB_MODE_AUTO);
    CHECK_INT(wb_plan_verify(p, &f.in, &f.el), 0);
    /* per replica: w's values 512x256 + scales 4x2x4 B and gate_up 96 B split over its two
     * GPUs; the replicated norm's 20 B to each of the four */
    CHECK_U64(p->stats.total_bytes, 2 * (512 * 256 + 32 + 96) + 4 * 20);
    /* reader 0: w rows 0-99 and the scales of the blocks whose origin is in them (block row
     * 0: 2 blocks), gate; reader 1: rows 100-511 and block rows 1-3, up's first 3 rows;
     * reader 2: norm and up's last 3 rows */
    CHECK_U64(pl_tables(p)[0].send_bytes, 2 * (100 * 256 + 2 * 4 + 48));
    CHECK_U64(pl_tables(p)[1].send_bytes, 2 * (412 * 256 + 6 * 4 + 24));
    CHECK_U64(pl_tables(p)[2].send_bytes, 4 * 20 + 2 * 24);
    CHECK_U64(p->stats.amax_ops, 2); /* the straddled block row, one op on each side */
    CHECK_INT(pl_tables(p)[0].residence, WB_RESIDE_HOST);
    wb_plan_free(p);
    fx_free(&f);
}

static void test_rows_errors(void)
{
    struct fx f;
    fx_init(&f);
    fx_t(&f, "w", WB_DTYPE_BF16, fx_shape(2, 512, 256));
    fx_t(&f, "v", WB_DTYPE_BF16, fx_shape(2, 8, 8));
    static const uint64_t short_cut[] = {0, 100, 500}, falling[] = {0, 6, 4};
    const struct placed pl[] = {{"w", -1, short_cut}, {"v", -1, falling}};
    CHECK_INT(reader_layout(&f, 2, pl, 2), 0);
    struct wb_placement_map *pm;
    CHECK_INT(wb_placement_map_build(&f.tl, &f.ti, NULL, &pm, &f.el), -WB_E_PLAN);
    CHECK_INT(f.el.n, 2);
    CHECK_STR(f.el.msgs[0], "w: explicit rows over reader do not cut its 512 rows along dim 0 "
                            "into 2 rising ranges from 0 (the readers)");
    CHECK_STR(f.el.msgs[1], "v: explicit rows over reader do not cut its 8 rows along dim 0 into "
                            "2 rising ranges from 0 (the readers)");
    fx_free(&f);
    /* ROWS without cuts */
    fx_init(&f);
    struct wb_mesh_dim dim = {.size = 2};
    snprintf(dim.name, sizeof(dim.name), "reader");
    const char *names[] = {"w"};
    struct wb_placement place = {WB_PLACE_ROWS, 0};
    CHECK_INT(wb_trainer_layout_from_placements(1, &dim, 0, WB_RESIDE_HOST, 1, names, &place, NULL,
                                                "the readers", &f.tl, &f.el),
              -WB_E_CONFIG);
    CHECK_STR(fx_errors(&f.el),
              "the readers: w: placed by explicit rows along mesh dim reader without them");
    fx_free(&f);
}

/* An FP8 checkpoint (values fp8_e4m3 + FP32 _scale_inv) into FP8 rollouts: q and k fused, TP 2
 * per component; the values and their scales sit on different readers, q's values split. */
static void test_fp8_checkpoint_copy(void)
{
    const char *fam = wb_test_write_file(
        "ckpt.yaml", "family: ckpt\n"
                     "quant: {fp8: [\"*_proj.weight\"]}\n"
                     "trainer:\n"
                     "  - fp8: 1\n"
                     "    tensors: {a.q_proj.weight: [512, 256], a.k_proj.weight: [256, 256]}\n"
                     "  - tensors: {a.norm.weight: [256]}\n"
                     "rollout:\n"
                     "  - fp8: 1\n"
                     "    tensors: {a.qk_proj.weight: [768, 256]}\n"
                     "  - tensors: {a.norm.weight: [256]}\n"
                     "rules:\n"
                     "  - rollout: a.qk_proj.weight\n"
                     "    from: [a.q_proj.weight, a.k_proj.weight]\n"
                     "    shard: {tp: 0}\n"
                     "  - rollout: \"*\"\n"
                     "    from: \"*\"\n");
    char fam_path[512], cfg[512];
    snprintf(fam_path, sizeof(fam_path), "%s", fam);
    snprintf(cfg, sizeof(cfg), "%s", wb_test_write_file("c.json", "{}"));
    struct fx f;
    fx_init(&f);
    struct wb_match_rules *rules = NULL;
    struct wb_match *mt = NULL;
    if (wb_inv_generate(fam_path, cfg, "trainer", &f.ti, &f.el) ||
        wb_inv_generate(fam_path, cfg, "rollout", &f.ri, &f.el) ||
        wb_match_rules_load(fam_path, &rules, &f.el) ||
        wb_match_run(rules, &f.ti, &f.ri, &mt, &f.el))
        wb_test_fail(__FILE__, __LINE__, "%s", fx_errors(&f.el));
    f.in.match = mt;
    /* the value mapping copies FP8 bytes and keeps the block edge; the scales have their own */
    CHECK_INT(mt->n, 3);
    const struct wb_mapping *v = NULL, *sc = NULL;
    for (size_t i = 0; i < mt->n; i++) {
        if (strcmp(f.ri.p[mt->map[i].rollout].name, "a.qk_proj.weight") == 0)
            v = &mt->map[i];
        if (strcmp(f.ri.p[mt->map[i].rollout].name, "a.qk_proj.weight_scale_inv") == 0)
            sc = &mt->map[i];
    }
    CHECK(v && sc);
    CHECK_INT(v->xform, WB_XFORM_COPY);
    CHECK_INT(v->scale, -1);
    CHECK_INT(v->block, 128);
    CHECK(!v->fp8_scales && sc->fp8_scales);
    CHECK_INT(sc->xform, WB_XFORM_COPY);
    CHECK_INT(sc->src_dtype, WB_DTYPE_FP32);
    CHECK_INT(sc->ncomp, 2);
    CHECK_STR(f.ti.p[sc->comp[1].trainer].name, "a.k_proj.weight_scale_inv");
    char b[128];
    CHECK_STR(wb_box_str(&sc->comp[1].dst, b, sizeof(b)), "[4:6, 0:2]");
    CHECK_INT(sc->shard.kind, WB_SHARD_TP);
    static const uint64_t qcut[] = {0, 256, 512};
    const struct placed pl[] = {{"a.q_proj.weight", -1, qcut},
                                {"a.q_proj.weight_scale_inv", 1, NULL},
                                {"a.k_proj.weight", 1, NULL},
                                {"a.k_proj.weight_scale_inv", 0, NULL},
                                {"a.norm.weight", 0, NULL}};
    CHECK_INT(reader_layout(&f, 2, pl, 5), 0);
    CHECK_INT(
        wb_rollout_layout_load(wb_test_write_file("r.yaml", "replicas: 2\ntp: 2\n"), &f.rl, &f.el),
        0);
    struct wb_plan *p = sim_plan_check(&f, WB_MODE_AUTO);
    CHECK_INT(wb_plan_verify(p, &f.in, &f.el), 0);
    /* values 768x256 + scales 6x2x4 B per replica, the replicated norm's 512 B to all four */
    CHECK_U64(p->stats.total_bytes, 2 * (768 * 256 + 48) + 4 * 512);
    CHECK_U64(pl_tables(p)[0].send_bytes, 2 * (256 * 256 + 2 * 2 * 4) + 4 * 512);
    CHECK_U64(pl_tables(p)[1].send_bytes, 2 * (256 * 256 + 256 * 256 + 4 * 2 * 4));
    CHECK_U64(p->stats.amax_ops, 0);
    /* every rollout rank holds its TP half of values and scales: rank 1 of a replica holds q
     * rows 256-511 and k rows 128-255, scale rows 2-3 and 5 */
    const struct wb_recv_list *rv = &p->recv[1];
    CHECK_INT(rv->nlocal, 3);
    wb_plan_free(p);
    wb_match_free(mt);
    wb_match_rules_free(rules);
    fx_free(&f);
}

const struct wb_test wb_tests[] = {
    {"rows_bf16_to_fp8", test_rows_bf16_to_fp8, 0},
    {"rows_errors", test_rows_errors, 0},
    {"fp8_checkpoint_copy", test_fp8_checkpoint_copy, 0},
    {0},
};
