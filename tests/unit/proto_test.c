/* proto_test.c — the control-plane codec: every body type round-trips through its table, token
 * checks with their exact refusals (and an ERROR never carries the token), envelope versions,
 * and the exact errors for unknown, missing, duplicated, mistyped and oversized fields. */
#include "proto/proto.h"
#include "tests/wbtest.h"

#include <errno.h>
#include <nng/nng.h>
#include <nng/protocol/reqrep0/rep.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static void test_roundtrip(void)
{
    struct wb_body_heartbeat hb = {{"rollout", 7, 42}, 3, true, 5, 9, .torn = true, .commits = 4,
                                   .dropped = 262144},
                             back;
    struct wb_mpw w;
    struct wb_msg m;
    const char *why = NULL;
    char err[256];
    wb_mpw_init(&w);
    wb_msg_encode(&w, WB_MSG_HEARTBEAT, "s3cret", &hb);
    CHECK_INT(wb_mpw_finish(&w), 0);
    CHECK_INT(wb_msg_open(w.buf, w.len, "s3cret", &m, &why), 0);
    CHECK_INT(m.type, WB_MSG_HEARTBEAT);
    CHECK_INT(m.nkeys, 11);
    memset(&back, 0xee, sizeof(back));
    CHECK_INT(wb_msg_decode(&m, &back, err, sizeof(err)), 0);
    CHECK_STR(back.s.role, "rollout");
    CHECK_U64(back.s.rank, 7);
    CHECK_U64(back.s.session, 42);
    CHECK_U64(back.version, 3);
    CHECK(back.in_flight);
    CHECK_U64(back.done, 5);
    CHECK_U64(back.total, 9);
    CHECK(back.torn);
    CHECK_U64(back.commits, 4);
    CHECK_U64(back.dropped, 262144);

    CHECK_INT(wb_msg_open(w.buf, w.len, "s3creT", &m, &why), -WB_E_TOKEN);
    CHECK_STR(why, "refused: wrong cluster token");
    CHECK_INT(wb_msg_open(w.buf, w.len, "s3cret-longer", &m, &why), -WB_E_TOKEN);
    CHECK_STR(why, "refused: wrong cluster token");
    CHECK_INT(wb_msg_open(w.buf, w.len, NULL, &m, &why), -WB_E_TOKEN);
    CHECK_STR(why, "refused: wrong cluster token");
    wb_mpw_free(&w);
}

/* Every type with a table: a body of recognizable values survives encode + decode. */
static void test_every_table(void)
{
    static const uint32_t types[] = {
        WB_MSG_ERROR,        WB_MSG_REGISTERED,    WB_MSG_COMMANDS,      WB_MSG_RESULT,
        WB_MSG_STATUS,       WB_MSG_PLAN_INFO,     WB_MSG_REGISTER,      WB_MSG_HEARTBEAT,
        WB_MSG_POLL,         WB_MSG_REP_SETUP,     WB_MSG_REP_CONNECTED, WB_MSG_REP_SENT,
        WB_MSG_REP_RECEIVED, WB_MSG_REP_COMMITTED, WB_MSG_CTL_TRANSFER,  WB_MSG_REP_DRAINED,
        WB_CMD_SETUP,        WB_CMD_PEERS,         WB_CMD_TRANSFER,      WB_CMD_COMPLETE,
        WB_CMD_ABORT,        WB_BODY_STATS,        WB_BODY_AGENT_STATUS, WB_MSG_LEAVE};
    static const uint8_t obj[] = {0x92, 0x01, 0xa1, 'x'}; /* msgpack [1, "x"] */
    for (size_t t = 0; t < WB_ARRAY_LEN(types); t++) {
        size_t n;
        const struct wb_field *f = wb_msg_fields(types[t], &n);
        CHECK(f != NULL && n > 0);
        uint8_t body[2048], back[2048];
        memset(body, 0, sizeof(body));
        for (size_t i = 0; i < n; i++) {
            void *at = body + f[i].off;
            switch (f[i].type) {
            case WB_FIELD_U64:
            case WB_FIELD_I64:
                *(uint64_t *)at = 1000 + i;
                break;
            case WB_FIELD_BOOL:
                *(bool *)at = true;
                break;
            case WB_FIELD_STR:
                snprintf(at, f[i].size, "v%zu", i);
                break;
            case WB_FIELD_BYTES:
                *(struct wb_bytes *)at = (struct wb_bytes){"abc", 3};
                break;
            case WB_FIELD_OBJ:
                *(struct wb_bytes *)at = (struct wb_bytes){obj, sizeof(obj)};
                break;
            case WB_FIELD_U64S:
                for (size_t k = 0; k < f[i].size / 8; k++)
                    ((uint64_t *)at)[k] = 7 * k;
                break;
            }
        }
        struct wb_mpw w;
        struct wb_mpr r;
        char why[256];
        wb_mpw_init(&w);
        wb_body_put(&w, types[t], body);
        CHECK_INT(wb_mpw_finish(&w), 0);
        wb_mpr_init(&r, w.buf, w.len);
        memset(back, 0, sizeof(back));
        if (wb_body_get(&r, types[t], back, why, sizeof(why)))
            wb_test_fail(__FILE__, __LINE__, "%s: %s", wb_msg_type_name(types[t]), why);
        CHECK_INT(wb_mpr_end(&r), 0);
        for (size_t i = 0; i < n; i++) {
            const void *a = body + f[i].off, *b = back + f[i].off;
            if (f[i].type == WB_FIELD_BYTES || f[i].type == WB_FIELD_OBJ) {
                const struct wb_bytes *x = a, *y = b;
                CHECK_INT(x->n, y->n);
                CHECK(memcmp(x->p, y->p, x->n) == 0);
            } else if (memcmp(a, b, f[i].size) != 0) {
                wb_test_fail(__FILE__, __LINE__, "%s.%s differs after the round trip",
                             wb_msg_type_name(types[t]), f[i].key);
            }
        }
        wb_mpw_free(&w);
    }
    CHECK_STR(wb_msg_type_name(WB_MSG_REP_SENT), "REPORT_SENT");
    CHECK(wb_msg_type_name(0x1234) == NULL);
}

/* A hand-written message body with the given pairs after the token. */
static void raw_heartbeat(struct wb_mpw *w, int variant)
{
    wb_mpw_init(w);
    wb_mpw_envelope(w, WB_MSG_HEARTBEAT);
    uint32_t n = variant == 0 ? 7 : variant == 1 ? 5 : 6;
    wb_mpw_map(w, n);
    wb_mpw_str(w, "token");
    wb_mpw_str(w, "t");
    wb_mpw_str(w, "role");
    wb_mpw_str(w, variant == 4 ? "a-role-name-longer-than-16" : "trainer");
    wb_mpw_str(w, "rank");
    if (variant == 2)
        wb_mpw_str(w, "one");
    else
        wb_mpw_u64(w, 1);
    wb_mpw_str(w, "session");
    wb_mpw_u64(w, 9);
    wb_mpw_str(w, variant == 3 ? "rank" : "version");
    wb_mpw_u64(w, 2);
    if (variant != 1) {
        wb_mpw_str(w, "in_flight");
        wb_mpw_bool(w, false);
    }
    if (variant == 0) {
        wb_mpw_str(w, "colour");
        wb_mpw_str(w, "blue");
    }
}

static void test_field_errors(void)
{
    static const char *const want[] = {
        "HEARTBEAT: unknown field \"colour\"",
        "HEARTBEAT: missing field \"in_flight\"",
        "HEARTBEAT: field \"rank\": expected an unsigned integer",
        "HEARTBEAT: field \"rank\" given twice",
        "HEARTBEAT: field \"role\": longer than 15 bytes",
    };
    for (int v = 0; v < 5; v++) {
        struct wb_mpw w;
        struct wb_msg m;
        struct wb_body_heartbeat hb;
        const char *why;
        char err[256];
        raw_heartbeat(&w, v);
        CHECK_INT(wb_mpw_finish(&w), 0);
        CHECK_INT(wb_msg_open(w.buf, w.len, "t", &m, &why), 0);
        memset(&hb, 0x5a, sizeof(hb));
        CHECK_INT(wb_msg_decode(&m, &hb, err, sizeof(err)), -EBADMSG);
        CHECK_STR(err, want[v]);
        CHECK_INT(hb.s.role[0], 0x5a); /* nothing written on failure */
        wb_mpw_free(&w);
    }
}

static void test_token_missing(void)
{
    struct wb_mpw w;
    struct wb_msg m;
    const char *why = NULL;
    wb_mpw_init(&w);
    wb_mpw_envelope(&w, WB_MSG_CTL_STATUS);
    wb_mpw_map(&w, 1);
    wb_mpw_str(&w, "rank");
    wb_mpw_u64(&w, 1);
    CHECK_INT(wb_msg_open(w.buf, w.len, "tok", &m, &why), -WB_E_TOKEN);
    CHECK_STR(why, "refused: message without a cluster token");
    wb_mpw_free(&w);

    /* token present but not a string */
    wb_mpw_init(&w);
    wb_mpw_envelope(&w, WB_MSG_CTL_STATUS);
    wb_mpw_map(&w, 1);
    wb_mpw_str(&w, "token");
    wb_mpw_u64(&w, 5);
    CHECK_INT(wb_msg_open(w.buf, w.len, "tok", &m, &why), -WB_E_TOKEN);
    CHECK_STR(why, "refused: wrong cluster token");
    wb_mpw_free(&w);
}

static void test_error_has_no_token(void)
{
    struct wb_mpw w;
    struct wb_msg m;
    struct wb_body_error e;
    const char *why;
    char err[128];
    wb_mpw_init(&w);
    wb_msg_error(&w, -WB_E_PEER, "trainer rank 1 died");
    CHECK_INT(wb_mpw_finish(&w), 0);
    CHECK(memmem(w.buf, w.len, "token", 5) == NULL);
    CHECK_INT(wb_msg_open(w.buf, w.len, "any-token", &m, &why), 0);
    CHECK_INT(m.type, WB_MSG_ERROR);
    CHECK_INT(wb_msg_decode(&m, &e, err, sizeof(err)), 0);
    CHECK_INT(e.code, -WB_E_PEER);
    CHECK_STR(e.msg, "trainer rank 1 died");
    wb_mpw_free(&w);
    /* an encoder given a token for ERROR still leaves it out */
    wb_mpw_init(&w);
    wb_msg_encode(&w, WB_MSG_ERROR, "s3cret", &e);
    CHECK(memmem(w.buf, w.len, "s3cret", 6) == NULL);
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
    wb_mpw_init(&w); /* a later version of the envelope */
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
    CHECK_STR(why, "refused: message body is not a map");
    wb_mpw_free(&w);

    /* truncated: the envelope opens, the body does not decode */
    char err[128];
    wb_mpw_init(&w);
    wb_msg_encode(&w, WB_MSG_CTL_TRANSFER, "t", &(struct wb_body_ctl_transfer){5, 6});
    CHECK_INT(wb_msg_open(w.buf, w.len - 1, "t", &m, &why), 0);
    struct wb_body_ctl_transfer x;
    CHECK_INT(wb_msg_decode(&m, &x, err, sizeof(err)), -EBADMSG);
    CHECK_STR(err, "TRANSFER: field \"timeout_ns\": expected an unsigned integer");
    wb_mpw_free(&w);
}

static void test_commands(void)
{
    struct wb_mpw w;
    struct wb_body_setup su = {.gen = 4, .seed = 9, .plan = {"PLAN", 4}};
    snprintf(su.provider, sizeof(su.provider), "tcp");
    struct wb_body_abort ab = {.version = 3};
    snprintf(ab.reason, sizeof(ab.reason), "trainer rank 2 died");
    wb_mpw_init(&w);
    wb_mpw_array(&w, 3);
    wb_cmd_put(&w, 1, WB_CMD_SETUP, &su);
    wb_cmd_put(&w, 2, WB_CMD_ABORT, &ab);
    wb_cmd_put(&w, 3, WB_CMD_EXIT, NULL);
    CHECK_INT(wb_mpw_finish(&w), 0);
    struct wb_cmd_reader cr;
    struct wb_bytes all = {w.buf, w.len};
    CHECK_INT(wb_cmd_reader_init(&cr, &all), 0);
    uint64_t seq;
    uint32_t type;
    struct wb_mpr body;
    char why[128];
    CHECK_INT(wb_cmd_next(&cr, &seq, &type, &body), 1);
    CHECK_U64(seq, 1);
    CHECK_INT(type, WB_CMD_SETUP);
    struct wb_body_setup su2;
    CHECK_INT(wb_body_get(&body, type, &su2, why, sizeof(why)), 0);
    CHECK_U64(su2.gen, 4);
    CHECK_STR(su2.provider, "tcp");
    CHECK_INT(su2.plan.n, 4);
    CHECK(memcmp(su2.plan.p, "PLAN", 4) == 0);
    CHECK_INT(wb_cmd_next(&cr, &seq, &type, &body), 1);
    struct wb_body_abort ab2;
    CHECK_INT(wb_body_get(&body, type, &ab2, why, sizeof(why)), 0);
    CHECK_STR(ab2.reason, "trainer rank 2 died");
    CHECK_INT(wb_cmd_next(&cr, &seq, &type, &body), 1);
    CHECK_INT(type, WB_CMD_EXIT);
    CHECK_INT(wb_body_get(&body, type, NULL, why, sizeof(why)), 0);
    CHECK_INT(wb_cmd_next(&cr, &seq, &type, &body), 0);
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
                              .total_ns = 123456789,
                              .mem_waits = 2,
                              .full_bytes = 1ull << 34,
                              .delta_bytes = 77777,
                              .delta_ok = 1};
    for (int i = 0; i < WB_STAGE_COUNT; i++)
        s.stage_ns[i] = 1000u * (unsigned)(i + 1);
    struct wb_mpw w;
    struct wb_mpr r;
    struct wb_xfer_stats t;
    char why[128];
    wb_mpw_init(&w);
    wb_body_put(&w, WB_BODY_STATS, &s);
    wb_mpr_init(&r, w.buf, w.len);
    CHECK_INT(wb_body_get(&r, WB_BODY_STATS, &t, why, sizeof(why)), 0);
    CHECK_INT(wb_mpr_end(&r), 0);
    CHECK_MEM(&t, &s, sizeof(s));
    wb_mpr_init(&r, w.buf, w.len - 1);
    CHECK_INT(wb_body_get(&r, WB_BODY_STATS, &t, why, sizeof(why)), -EBADMSG);
    CHECK_STR(why, "STATS: field \"delta_ok\": expected an unsigned integer");
    wb_mpw_free(&w);
    CHECK_STR(wb_stage_name(WB_STAGE_QUANT), "quant");
    CHECK_STR(wb_role_name(WB_ROLE_ROLLOUT), "rollout");
    enum wb_role role;
    CHECK_INT(wb_role_parse("trainer", &role), 0);
    CHECK_INT(role, WB_ROLE_TRAINER);
    CHECK_INT(wb_role_parse("learner", &role), -EINVAL);
}

/* The line naming the agents a job waits for: groups of one role and state, ranks as ranges,
 * a line too long for the buffer cut with "...", and the same from a STATUS body. */
static void test_ranks_text(void)
{
    const struct wb_rank_state v[] = {
        {"trainer", 0, "not registered"}, {"trainer", 1, "not registered"},
        {"trainer", 2, "not registered"}, {"trainer", 5, "not registered"},
        {"trainer", 6, "dead"},           {"trainer", 7, "not registered"},
        {"rollout", 1, "left"},
    };
    char out[200];
    CHECK_INT(wb_ranks_text(v, 7, out, sizeof(out)), strlen(out));
    CHECK_STR(out, "trainer ranks 0-2, 5 (not registered); trainer rank 6 (dead); trainer rank 7 "
                   "(not registered); rollout rank 1 (left)");
    CHECK_INT(wb_ranks_text(v + 6, 1, out, sizeof(out)), 21);
    CHECK_STR(out, "rollout rank 1 (left)");
    CHECK_INT(wb_ranks_text(v, 0, out, sizeof(out)), 0);
    CHECK_STR(out, "");
    char small[16];
    CHECK_INT(wb_ranks_text(v, 4, small, sizeof(small)), 37);
    CHECK_STR(small, "trainer rank...");

    /* a STATUS body: alive, suspect and failed agents are there; absent, dead and left not */
    static const char *const states[] = {"alive", "absent", "absent", "suspect",
                                         "dead",  "failed", "left"};
    struct wb_mpw agents;
    wb_mpw_init(&agents);
    wb_mpw_array(&agents, 7);
    for (uint32_t i = 0; i < 7; i++) {
        struct wb_body_agent_status as = {.rank = i < 5 ? i : i - 5};
        snprintf(as.role, sizeof(as.role), "%s", i < 5 ? "trainer" : "rollout");
        snprintf(as.state, sizeof(as.state), "%s", states[i]);
        wb_body_put(&agents, WB_BODY_AGENT_STATUS, &as);
    }
    CHECK_INT(agents.err, 0);
    struct wb_body_status st = {.agents = {agents.buf, agents.len}};
    CHECK_INT(wb_status_missing(&st, out, sizeof(out)), 4);
    CHECK_STR(out, "trainer ranks 1-2 (not registered); trainer rank 4 (dead); rollout rank 1 "
                   "(left)");
    wb_mpw_free(&agents);
    st.agents = (struct wb_bytes){"\x01", 1}; /* not an array */
    CHECK_INT(wb_status_missing(&st, out, sizeof(out)), -EBADMSG);
}

/* ---------------------------------------------------------------- a channel across a restart */

/* The controller's side of a handshake, on a real nng REP socket: receives one message of
 * `type` (checked), then answers it with `reply` (0: no answer, the socket is closed). */
struct srv {
    char url[64];
    int ok;
};

static int srv_recv(nng_socket s, uint32_t type, uint8_t **body, size_t *len)
{
    void *p;
    size_t n;
    if (nng_recv(s, &p, &n, NNG_FLAG_ALLOC))
        return -1;
    struct wb_msg m;
    const char *why;
    size_t skip = type == WB_MSG_HELLO ? 0 : WB_BIND_LEN; /* later messages carry the binding */
    int rc = n >= skip && wb_msg_open((uint8_t *)p + skip, n - skip, "tok-1", &m, &why) == 0 &&
                     m.type == type
                 ? 0
                 : -1;
    if (body) {
        *body = p;
        *len = n;
    } else {
        nng_free(p, n);
    }
    return rc;
}

static int srv_send(nng_socket s, uint32_t type, const void *body)
{
    struct wb_mpw w;
    wb_mpw_init(&w);
    wb_msg_encode(&w, type, "tok-1", body);
    int rc = w.err ? -1 : nng_send(s, w.buf, w.len, 0) ? -1 : 0;
    wb_mpw_free(&w);
    return rc;
}

static void *srv_main(void *arg)
{
    struct srv *sv = arg;
    nng_socket s;
    /* the first controller: takes the HELLO and goes away without answering */
    if (nng_rep0_open(&s) || nng_socket_set_ms(s, NNG_OPT_RECVTIMEO, 10000) ||
        nng_listen(s, sv->url, NULL, 0) || srv_recv(s, WB_MSG_HELLO, NULL, NULL))
        return NULL;
    nng_close(s);
    struct timespec ts = {0, 700 * 1000000}; /* past the 200 ms a blocking send waits */
    nanosleep(&ts, NULL);
    /* the next one on the same address: WELCOME, then the request behind its binding */
    struct wb_body_welcome wel = {.nonce = 7};
    if (nng_rep0_open(&s) || nng_socket_set_ms(s, NNG_OPT_RECVTIMEO, 10000) ||
        nng_listen(s, sv->url, NULL, 0))
        return NULL;
    if (srv_recv(s, WB_MSG_HELLO, NULL, NULL) == 0 && srv_send(s, WB_MSG_WELCOME, &wel) == 0 &&
        srv_recv(s, WB_MSG_OK, NULL, NULL) == 0 && srv_send(s, WB_MSG_OK, NULL) == 0)
        sv->ok = 1;
    ts.tv_nsec = 100 * 1000000; /* the reply leaves before the socket closes */
    nanosleep(&ts, NULL);
    nng_close(s);
    return NULL;
}

/* A controller that goes away while a request's HELLO is unanswered, and another that comes
 * up on its address later than a send waits (200 ms): the HELLO goes again once it is up and
 * the request is answered. (The soak test saw wb-ctl wait out its whole timeout instead: the
 * HELLO that found no connection was given up, and every new connection stayed silent.) */
static void test_chan_hello_after_restart(void)
{
    struct srv sv = {0};
    snprintf(sv.url, sizeof(sv.url), "tcp://127.0.0.1:%d", 20000 + (int)(getpid() % 12000));
    pthread_t th;
    CHECK_INT(pthread_create(&th, NULL, srv_main, &sv), 0);
    struct wb_chan ch;
    CHECK_INT(wb_chan_open(&ch, sv.url, "tok-1"), 0);
    struct wb_mpw w;
    wb_mpw_init(&w);
    wb_msg_encode(&w, WB_MSG_OK, "tok-1", NULL);
    void *buf = NULL;
    size_t len = 0;
    int rc = wb_chan_call(&ch, &w, 8000000000ull, &buf, &len);
    pthread_join(th, NULL);
    CHECK_INT(rc, 0);
    CHECK_INT(sv.ok, 1);
    struct wb_msg m;
    const char *why;
    CHECK_INT(wb_msg_open(buf, len, "tok-1", &m, &why), 0);
    CHECK_INT(m.type, WB_MSG_OK);
    wb_chan_free(buf);
    wb_mpw_free(&w);
    wb_chan_close(&ch);
}

const struct wb_test wb_tests[] = {
    {"ranks_text", test_ranks_text, 0},
    {"roundtrip", test_roundtrip, 0},
    {"every_table", test_every_table, 0},
    {"field_errors", test_field_errors, 0},
    {"token_missing", test_token_missing, 0},
    {"error_has_no_token", test_error_has_no_token, 0},
    {"bad_envelopes", test_bad_envelopes, 0},
    {"commands", test_commands, 0},
    {"stats", test_stats, 0},
    {"chan_hello_after_restart", test_chan_hello_after_restart, 30},
    {0},
};
