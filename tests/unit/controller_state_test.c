/* controller_state_test.c — what the controller believes of an agent from its heartbeats and
 * reports, fed through wb_controller_feed (the socket's path without the network): a heartbeat
 * taken before a COMMITTED report but arriving after it (heartbeats have a connection of their
 * own) does not take the version or the torn flag back. */
#include "controller/controller.h"
#include "proto/proto.h"
#include "tests/wbtest.h"

#include <string.h>

static const char *const TOKEN = "state-token";

/* Feeds one message; the reply's type, its body decoded into *out (when out is not NULL). The
 * body may point into *rep, which the caller frees. */
static uint32_t feed_keep(struct wb_controller *c, uint32_t type, const void *body, void *out,
                          struct wb_mpw *rep)
{
    struct wb_mpw w;
    wb_mpw_init(&w);
    wb_mpw_init(rep);
    wb_msg_encode(&w, type, TOKEN, body);
    CHECK_INT(wb_mpw_finish(&w), 0);
    CHECK_INT(wb_controller_feed(c, w.buf, w.len, rep), 0);
    wb_mpw_free(&w);
    struct wb_msg m;
    const char *why = NULL;
    char err[256];
    CHECK_INT(wb_msg_open(rep->buf, rep->len, TOKEN, &m, &why), 0);
    if (out)
        CHECK_INT(wb_msg_decode(&m, out, err, sizeof(err)), 0);
    return m.type;
}

static uint32_t feed(struct wb_controller *c, uint32_t type, const void *body, void *out)
{
    struct wb_mpw rep;
    uint32_t t = feed_keep(c, type, body, out, &rep);
    wb_mpw_free(&rep);
    return t;
}

/* The status of rollout 0: its version, or UINT64_MAX when it says it is torn. */
static uint64_t rollout_version(struct wb_controller *c)
{
    struct wb_body_status st;
    struct wb_mpw rep;
    CHECK_INT(feed_keep(c, WB_MSG_CTL_STATUS, NULL, &st, &rep), WB_MSG_STATUS);
    struct wb_mpr r;
    uint32_t n = 0;
    char why[256];
    uint64_t v = 0;
    bool found = false;
    wb_mpr_init(&r, st.agents.p, st.agents.n);
    CHECK_INT(wb_mpr_array(&r, 16, &n), 0);
    for (uint32_t i = 0; i < n && !found; i++) {
        struct wb_body_agent_status a;
        CHECK_INT(wb_body_get(&r, WB_BODY_AGENT_STATUS, &a, why, sizeof(why)), 0);
        found = strcmp(a.role, "rollout") == 0 && a.rank == 0;
        v = a.torn ? UINT64_MAX : a.version;
    }
    wb_mpw_free(&rep);
    CHECK(found);
    return v;
}

static void test_stale_heartbeat(void)
{
    const char *path = wb_test_write_file("job.yaml", "name: state\n"
                                                      "listen: inproc://wb-ctl-state\n"
                                                      "token: state-token\n"
                                                      "trainers: 1\n"
                                                      "rollouts: 1\n"
                                                      "heartbeat: 100ms\n"
                                                      "dead_after: 10s\n"
                                                      "poll_hold: 0s\n");
    struct wb_job job;
    struct wb_errlist el;
    wb_errlist_init(&el);
    CHECK_INT(wb_job_load(path, &job, &el), 0);
    struct wb_controller *c;
    CHECK_INT(wb_controller_create(&job, &c, &el), 0);

    struct wb_body_register reg = {.role = "rollout", .device = -1, .host = "h", .pid = 1};
    struct wb_body_registered ok;
    CHECK_INT(feed(c, WB_MSG_REGISTER, &reg, &ok), WB_MSG_REGISTERED);
    struct wb_session s = {"rollout", 0, ok.session};

    struct wb_body_heartbeat hb = {.s = s, .version = 5, .commits = 1};
    feed(c, WB_MSG_HEARTBEAT, &hb, NULL);
    CHECK_U64(rollout_version(c), 5);
    /* the process committed its second version (outside a transfer of this controller: only
     * the count is taken) */
    struct wb_body_rep_committed cm = {.s = s, .version = 7, .commits = 2};
    feed(c, WB_MSG_REP_COMMITTED, &cm, NULL);
    /* a heartbeat taken before that report, arriving after it, says torn and version 3 */
    hb = (struct wb_body_heartbeat){.s = s, .version = 3, .torn = true, .commits = 1};
    feed(c, WB_MSG_HEARTBEAT, &hb, NULL);
    CHECK_U64(rollout_version(c), 5);
    /* one taken after it is believed, torn included */
    hb = (struct wb_body_heartbeat){.s = s, .version = 7, .commits = 2};
    feed(c, WB_MSG_HEARTBEAT, &hb, NULL);
    CHECK_U64(rollout_version(c), 7);
    hb.torn = true;
    feed(c, WB_MSG_HEARTBEAT, &hb, NULL);
    CHECK_U64(rollout_version(c), UINT64_MAX);
    wb_controller_destroy(c);
    wb_job_free(&job);
    wb_errlist_free(&el);
}

const struct wb_test wb_tests[] = {
    {"stale_heartbeat", test_stale_heartbeat, 30},
    {0},
};
