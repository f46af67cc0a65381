/* controller_proto_test.c — the control-plane codec: token checks with their exact refusals,
 * envelope versions, key lookup that skips unknown keys, transfer stats, and the job file. */
#include "controller/controller.h"
#include "tests/wbtest.h"

#include <errno.h>
#include <stdlib.h>
#include <unistd.h>

static void test_token_roundtrip(void)
{
    struct wb_mpw w;
    struct wb_msg m;
    const char *why = NULL;
    wb_mpw_init(&w);
    wb_msg_begin(&w, WB_MSG_HEARTBEAT, "s3cret", 4);
    wb_msg_kstr(&w, "role", "rollout");
    wb_msg_ku64(&w, "rank", 7);
    wb_msg_kbool(&w, "in_flight", true);
    wb_msg_ki64(&w, "future_key", -3); /* a key this reader does not know */
    CHECK_INT(wb_mpw_finish(&w), 0);
    CHECK_INT(wb_msg_open(w.buf, w.len, "s3cret", &m, &why), 0);
    CHECK_INT(m.type, WB_MSG_HEARTBEAT);
    CHECK_INT(m.nkeys, 5);
    char role[16];
    uint64_t rank;
    bool fl = false;
    CHECK_INT(wb_msg_str(&m, "role", role, sizeof(role)), 0);
    CHECK_STR(role, "rollout");
    CHECK_INT(wb_msg_u64(&m, "rank", &rank), 0);
    CHECK_U64(rank, 7);
    CHECK_INT(wb_msg_bool(&m, "in_flight", &fl), 0);
    CHECK(fl);
    CHECK_INT(wb_msg_u64(&m, "absent", &rank), -ENOENT);
    CHECK_INT(wb_msg_u64(&m, "role", &rank), -EBADMSG); /* wrong type */
    CHECK(!wb_msg_has(&m, "absent"));
    CHECK(wb_msg_has(&m, "future_key"));

    CHECK_INT(wb_msg_open(w.buf, w.len, "s3creT", &m, &why), -WB_E_TOKEN);
    CHECK_STR(why, "refused: wrong cluster token");
    CHECK_INT(wb_msg_open(w.buf, w.len, "s3cret-longer", &m, &why), -WB_E_TOKEN);
    CHECK_STR(why, "refused: wrong cluster token");
    CHECK_INT(wb_msg_open(w.buf, w.len, NULL, &m, &why), 0); /* no check asked */
    wb_mpw_free(&w);
}

static void test_token_missing(void)
{
    struct wb_mpw w;
    struct wb_msg m;
    const char *why = NULL;
    wb_mpw_init(&w);
    wb_mpw_envelope(&w, WB_MSG_CTL_STATUS);
    wb_mpw_map(&w, 1);
    wb_msg_ku64(&w, "rank", 1);
    CHECK_INT(wb_msg_open(w.buf, w.len, "tok", &m, &why), -WB_E_TOKEN);
    CHECK_STR(why, "refused: message without a cluster token");
    wb_mpw_free(&w);

    /* token present but not first, or not a string */
    wb_mpw_init(&w);
    wb_mpw_envelope(&w, WB_MSG_CTL_STATUS);
    wb_mpw_map(&w, 1);
    wb_msg_ku64(&w, "token", 5);
    CHECK_INT(wb_msg_open(w.buf, w.len, "tok", &m, &why), -WB_E_TOKEN);
    CHECK_STR(why, "refused: wrong cluster token");
    wb_mpw_free(&w);
}

static void test_bad_envelopes(void)
{
    struct wb_msg m;
    const char *why = NULL;
    static const uint8_t junk[] = {0x93, 1, 2, 3};
    CHECK_INT(wb_msg_open(junk, sizeof(junk), "t", &m, &why), -EBADMSG);
    CHECK_STR(why, "refused: not a weightbridge message");

    struct wb_mpw w;
    wb_mpw_init(&w); /* version 2 of the envelope */
    wb_mpw_array(&w, 4);
    wb_mpw_u64(&w, WB_WIRE_MAGIC);
    wb_mpw_u64(&w, WB_WIRE_VERSION + 1);
    wb_mpw_u64(&w, WB_MSG_CTL_STATUS);
    wb_mpw_map(&w, 0);
    CHECK_INT(wb_msg_open(w.buf, w.len, "t", &m, &why), -WB_E_VERSION);
    CHECK_STR(why, "refused: unsupported message version");
    wb_mpw_free(&w);

    wb_mpw_init(&w); /* body not a map */
    wb_mpw_envelope(&w, WB_MSG_CTL_STATUS);
    wb_mpw_array(&w, 0);
    CHECK_INT(wb_msg_open(w.buf, w.len, "t", &m, &why), -EBADMSG);
    CHECK_STR(why, "refused: message body is not a map of at most 48 keys");
    wb_mpw_free(&w);

    wb_mpw_init(&w); /* truncated */
    wb_msg_begin(&w, WB_MSG_CTL_STATUS, "t", 1);
    wb_msg_kstr(&w, "a", "bcdef");
    CHECK_INT(wb_msg_open(w.buf, w.len - 2, "t", &m, &why), -EBADMSG);
    CHECK_STR(why, "refused: malformed message body");
    wb_mpw_free(&w);
}

static void test_error_and_index(void)
{
    struct wb_mpw w;
    struct wb_msg m, sub;
    const char *why;
    wb_mpw_init(&w);
    wb_msg_error(&w, "t", -WB_E_PEER, "trainer rank 1 died");
    CHECK_INT(wb_msg_open(w.buf, w.len, "t", &m, &why), 0);
    CHECK_INT(m.type, WB_MSG_ERROR);
    int64_t code;
    char msg[64];
    CHECK_INT(wb_msg_i64(&m, "code", &code), 0);
    CHECK_INT(code, -WB_E_PEER);
    CHECK_INT(wb_msg_str(&m, "msg", msg, sizeof(msg)), 0);
    CHECK_STR(msg, "trainer rank 1 died");
    wb_mpw_free(&w);

    wb_mpw_init(&w);
    wb_mpw_array(&w, 2);
    wb_mpw_map(&w, 1);
    wb_msg_ku64(&w, "version", 9);
    wb_mpw_map(&w, 0);
    struct wb_mpr r;
    uint32_t n;
    uint64_t v;
    wb_mpr_init(&r, w.buf, w.len);
    CHECK_INT(wb_mpr_array(&r, 4, &n), 0);
    CHECK_INT(wb_msg_index(&r, &sub), 0);
    CHECK_INT(wb_msg_u64(&sub, "version", &v), 0);
    CHECK_U64(v, 9);
    CHECK_INT(wb_msg_index(&r, &sub), 0);
    CHECK_INT(sub.nkeys, 0);
    CHECK_INT(wb_mpr_end(&r), 0);
    wb_mpw_free(&w);
}

static void test_stats(void)
{
    struct wb_xfer_stats s = {.rank = 3,
                              .bytes = 1ull << 33,
                              .writes = 17,
                              .tasks = 5,
                              .peak_tmp = 4096,
                              .cap = 8192,
                              .total_ns = 123456789};
    for (int i = 0; i < WB_STAGE_COUNT; i++)
        s.stage_ns[i] = 1000u * (unsigned)(i + 1);
    struct wb_mpw w;
    struct wb_mpr r;
    struct wb_xfer_stats t;
    wb_mpw_init(&w);
    wb_xfer_stats_put(&w, &s);
    wb_mpr_init(&r, w.buf, w.len);
    CHECK_INT(wb_xfer_stats_get(&r, &t), 0);
    CHECK_INT(wb_mpr_end(&r), 0);
    CHECK_MEM(&t, &s, sizeof(s));
    wb_mpr_init(&r, w.buf, w.len - 1);
    CHECK_INT(wb_xfer_stats_get(&r, &t), -EBADMSG);
    wb_mpw_free(&w);
    CHECK_STR(wb_stage_name(WB_STAGE_QUANT), "quant");
    CHECK_STR(wb_role_name(WB_ROLE_ROLLOUT), "rollout");
    enum wb_role role;
    CHECK_INT(wb_role_parse("trainer", &role), 0);
    CHECK_INT(role, WB_ROLE_TRAINER);
    CHECK_INT(wb_role_parse("learner", &role), -EINVAL);
}

static void test_job_load(void)
{
    const char *p = wb_test_write_file("job.yaml", "name: j1\n"
                                                   "token: abc\n"
                                                   "trainers: 4\n"
                                                   "rollouts: 2\n"
                                                   "mode: gather\n"
                                                   "mem_cap: 64KiB\n"
                                                   "dead_after: 2s\n");
    struct wb_job j;
    struct wb_errlist el;
    wb_errlist_init(&el);
    CHECK_INT(wb_job_load(p, &j, &el), 0);
    CHECK_STR(j.name, "j1");
    CHECK_STR(j.listen, "tcp://127.0.0.1:7420");
    CHECK_STR(j.token, "abc");
    CHECK_INT(j.mode, 3);
    CHECK_U64(j.mem_cap, 65536);
    CHECK_U64(j.dead_ns, 2000000000ull);
    CHECK_U64(j.heartbeat_ns, 200000000ull);
    CHECK_U64(j.trainers, 4);
    CHECK_STR(j.provider, "tcp");
    wb_job_free(&j);
    wb_errlist_free(&el);
}

/* model.vars reaches the rules and both generated inventories (controller/plan.c and the
 * reference load them the same way). */
static void test_job_model_vars(void)
{
    char cwd[256], text[4096];
    CHECK(getcwd(cwd, sizeof(cwd)) != NULL);
    const char *fmt_job = "token: t\n"
                          "model:\n"
                          "  rules: %s/configs/models/deepseek_v3.yaml\n"
                          "  hf_config: %s/configs/hf/DeepSeek-V3.json\n"
                          "  vars: \"%s\"\n"
                          "trainer_layout: %s/configs/jobs/demo/trainer.yaml\n"
                          "rollout_layout: %s/configs/jobs/demo/rollout.yaml\n";
    snprintf(text, sizeof(text), fmt_job, cwd, cwd, "mtp=1", cwd, cwd);
    const char *p = wb_test_write_file("vars.yaml", text);
    struct wb_job j;
    struct wb_errlist el;
    wb_errlist_init(&el);
    CHECK_INT(wb_job_load(p, &j, &el), 0);
    CHECK_STR(j.model.vars, "mtp=1");
    struct wb_ref *ref = NULL;
    CHECK_INT(wb_ref_load(&j, &ref, &el), 0);
    wb_ref_free(ref);
    wb_job_free(&j);
    snprintf(text, sizeof(text), fmt_job, cwd, cwd, "mtp=on", cwd, cwd);
    p = wb_test_write_file("vars.yaml", text);
    CHECK_INT(wb_job_load(p, &j, &el), 0);
    CHECK_INT(wb_ref_load(&j, &ref, &el), -WB_E_CONFIG);
    CHECK_INT(el.n, 1);
    CHECK_STR(el.msgs[0], "vars 'mtp=on': expected NAME=INTEGER[,NAME=INTEGER...]");
    wb_job_free(&j);
    wb_errlist_free(&el);
}

static void test_job_errors(void)
{
    struct wb_job j;
    struct wb_errlist el;
    char want[512];

    const char *p = wb_test_write_file("bad.yaml", "token: abc\n"
                                                   "trainers: 1\n"
                                                   "rollouts: 1\n"
                                                   "mode: fast\n"
                                                   "heartbeats: 1s\n");
    wb_errlist_init(&el);
    CHECK_INT(wb_job_load(p, &j, &el), -WB_E_CONFIG);
    CHECK_INT(el.n, 2);
    snprintf(want, sizeof(want),
             "%s:4:7: mode: expected one of auto|direct|amax|gather, got 'fast'", p);
    CHECK_STR(el.msgs[0], want);
    snprintf(want, sizeof(want), "%s:5:1: heartbeats: unknown key", p);
    CHECK_STR(el.msgs[1], want);
    wb_errlist_free(&el);

    p = wb_test_write_file("half.yaml", "token: abc\n"
                                        "model:\n"
                                        "  rules: r.yaml\n");
    wb_errlist_init(&el);
    CHECK_INT(wb_job_load(p, &j, &el), -WB_E_CONFIG);
    CHECK_INT(el.n, 4);
    snprintf(want, sizeof(want),
             "%s: model.trainer_inventory: required key missing (a model needs all of "
             "model.rules, model.trainer_inventory, model.rollout_inventory, trainer_layout and "
             "rollout_layout)",
             p);
    CHECK_STR(el.msgs[0], want);
    wb_errlist_free(&el);

    p = wb_test_write_file("notoken.yaml", "trainers: 1\nrollouts: 1\n");
    unsetenv("WB_TOKEN");
    wb_errlist_init(&el);
    CHECK_INT(wb_job_load(p, &j, &el), -WB_E_CONFIG);
    snprintf(want, sizeof(want),
             "%s: token: no cluster token (set token: in the file or $WB_TOKEN)", p);
    CHECK_STR(el.msgs[0], want);
    wb_errlist_free(&el);
    setenv("WB_TOKEN", "from-env", 1);
    wb_errlist_init(&el);
    CHECK_INT(wb_job_load(p, &j, &el), 0);
    CHECK_STR(j.token, "from-env");
    wb_job_free(&j);
    wb_errlist_free(&el);

    p = wb_test_write_file("nocount.yaml", "token: t\ntrainers: 2\n");
    wb_errlist_init(&el);
    CHECK_INT(wb_job_load(p, &j, &el), -WB_E_CONFIG);
    snprintf(want, sizeof(want), "%s: trainers, rollouts: a job without a model needs both counts",
             p);
    CHECK_STR(el.msgs[0], want);
    wb_errlist_free(&el);
}

const struct wb_test wb_tests[] = {
    {"token_roundtrip", test_token_roundtrip, 0},
    {"token_missing", test_token_missing, 0},
    {"bad_envelopes", test_bad_envelopes, 0},
    {"error_and_index", test_error_and_index, 0},
    {"stats", test_stats, 0},
    {"job_load", test_job_load, 0},
    {"job_model_vars", test_job_model_vars, 0},
    {"job_errors", test_job_errors, 0},
    {0},
};
