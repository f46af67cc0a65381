/* controller_state_test.c — what the controller believes of an agent from its heartbeats and
 * reports, fed through wb_controller_feed (the socket's path without the network): a heartbeat
 * taken before a COMMITTED report but arriving after it (heartbeats have a connection of their
 * own) does not take the version or the torn flag back; a version whose attempt failed in its
 * commit phase is not taken as complete from the rollout that committed it. */
#include "controller/controller.h"
#include "proto/proto.h"
#include "tests/wbtest.h"

#include <string.h>
#include <time.h>

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

/* A controller of the job file `yaml` (written as `name`), fed by hand. */
static struct wb_controller *ctl_open(const char *name, const char *yaml, struct wb_job *job)
{
    struct wb_errlist el;
    struct wb_controller *c = NULL;
    wb_errlist_init(&el);
    CHECK_INT(wb_job_load(wb_test_write_file(name, yaml), job, &el), 0);
    CHECK_INT(wb_controller_create(job, &c, &el), 0);
    wb_errlist_free(&el);
    return c;
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
    struct wb_job job;
    struct wb_controller *c = ctl_open("job.yaml",
                                       "name: state\n"
                                       "listen: tcp://127.0.0.1:0\n"
                                       "token: state-token\n"
                                       "trainers: 1\n"
                                       "rollouts: 1\n"
                                       "heartbeat: 100ms\n"
                                       "dead_after: 10s\n"
                                       "poll_hold: 0s\n",
                                       &job);

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
}

/* Feeds one message whose replies (none, one, or several: a held client's answer may come with
 * it) are not looked at. */
static void feed_any(struct wb_controller *c, uint32_t type, const void *body)
{
    struct wb_mpw w, rep;
    wb_mpw_init(&w);
    wb_mpw_init(&rep);
    wb_msg_encode(&w, type, TOKEN, body);
    CHECK_INT(wb_mpw_finish(&w), 0);
    CHECK_INT(wb_controller_feed(c, w.buf, w.len, &rep), 0);
    wb_mpw_free(&w);
    wb_mpw_free(&rep);
}

/* The controller's status: its state and last complete version. */
static void ctl_state(struct wb_controller *c, char *state, size_t cap, uint64_t *version)
{
    struct wb_body_status st;
    struct wb_mpw rep;
    CHECK_INT(feed_keep(c, WB_MSG_CTL_STATUS, NULL, &st, &rep), WB_MSG_STATUS);
    snprintf(state, cap, "%s", st.state);
    *version = st.version;
    wb_mpw_free(&rep);
}

/* Transfer 1 fails in its commit phase: every trainer sent, every rollout counted, rollout 0
 * committed, then rollout 1 fell silent (dead) before it committed. The client was told the
 * version failed; rollout 0's heartbeats keep saying it holds version 1, but the controller
 * does not take that for its last complete version (rollout 1, restarted, would not hold it),
 * and a retry of version 1 is not refused as old. (It was: issue #27's soak test found it.) */
static void test_failed_commit_phase(void)
{
    struct wb_job job;
    struct wb_controller *c = ctl_open("job2.yaml",
                                       "name: state\n"
                                       "listen: tcp://127.0.0.1:0\n"
                                       "token: state-token\n"
                                       "trainers: 1\n"
                                       "rollouts: 2\n"
                                       "heartbeat: 50ms\n"
                                       "dead_after: 300ms\n"
                                       "poll_hold: 0s\n",
                                       &job);
    struct wb_session s[3];
    const char *role[3] = {"trainer", "rollout", "rollout"};
    for (int i = 0; i < 3; i++) {
        struct wb_body_register reg = {.device = -1, .host = "h", .pid = 1 + (uint64_t)i};
        snprintf(reg.role, sizeof(reg.role), "%s", role[i]);
        reg.rank = i == 2 ? 1 : 0;
        struct wb_body_registered ok;
        CHECK_INT(feed(c, WB_MSG_REGISTER, &reg, &ok), WB_MSG_REGISTERED);
        s[i] = (struct wb_session){.rank = reg.rank, .session = ok.session};
        snprintf(s[i].role, sizeof(s[i].role), "%s", role[i]);
    }
    char state[32];
    uint64_t version;
    ctl_state(c, state, sizeof(state), &version);
    CHECK_STR(state, "setup");
    for (int i = 0; i < 3; i++)
        feed_any(c, WB_MSG_REP_SETUP, &(struct wb_body_rep_setup){.s = s[i], .gen = 1, .ok = true});
    for (int i = 0; i < 3; i++)
        feed_any(c, WB_MSG_REP_CONNECTED,
                 &(struct wb_body_rep_connected){.s = s[i], .gen = 1, .ok = true});
    ctl_state(c, state, sizeof(state), &version);
    CHECK_STR(state, "ready");
    feed_any(c, WB_MSG_CTL_TRANSFER,
             &(struct wb_body_ctl_transfer){.version = 1, .timeout_ns = 10000000000ull});
    feed_any(c, WB_MSG_REP_SENT, &(struct wb_body_rep_sent){.s = s[0], .version = 1, .ok = true});
    for (int i = 1; i < 3; i++)
        feed_any(c, WB_MSG_REP_RECEIVED,
                 &(struct wb_body_rep_received){.s = s[i], .version = 1, .ok = true});
    /* COMPLETE went out; rollout 0 commits, rollout 1 never does */
    feed_any(c, WB_MSG_REP_COMMITTED,
             &(struct wb_body_rep_committed){.s = s[1], .version = 1, .commits = 1});
    struct wb_body_heartbeat tr = {.s = s[0]}, ro = {.s = s[1], .version = 1, .commits = 1};
    for (int t = 0; t < 12; t++) { /* 600 ms: rollout 1 is dead after 300 */
        feed_any(c, WB_MSG_HEARTBEAT, &tr);
        feed_any(c, WB_MSG_HEARTBEAT, &ro);
        nanosleep(&(struct timespec){0, 50000000}, NULL);
    }
    /* the trainer's writes of the attempt are over: the teardown ends, the client learns */
    feed_any(c, WB_MSG_REP_DRAINED, &(struct wb_body_rep_drained){.s = s[0], .version = 1});
    for (int t = 0; t < 3; t++) /* after the teardown: rollout 0 still holds version 1 */
        feed_any(c, WB_MSG_HEARTBEAT, &ro);
    ctl_state(c, state, sizeof(state), &version);
    CHECK_STR(state, "waiting");
    CHECK_U64(version, 0);
    struct wb_body_error e;
    CHECK_INT(feed(c, WB_MSG_CTL_TRANSFER,
                   &(struct wb_body_ctl_transfer){.version = 1, .timeout_ns = 10000000000ull}, &e),
              WB_MSG_ERROR);
    CHECK_STR(e.msg, "not ready: waiting for rollout rank 1 (dead)");
    wb_controller_destroy(c);
    wb_job_free(&job);
}

/* Silence counts only while the controller listens: after 1.5 s in which it did not turn (a
 * starved or stopped controller; dead_after 300 ms, 1.2 s in setup) both agents are alive, and the
 * first to be heard does not see the other declared dead. Silence while it turns still kills: the
 * rollout silent for 1.5 s of the trainer's heartbeats is dead (the job is in setup, which allows
 * four times dead_after). */
static void test_controller_stall(void)
{
    struct wb_job job;
    struct wb_controller *c = ctl_open("job3.yaml",
                                       "name: state\n"
                                       "listen: tcp://127.0.0.1:0\n"
                                       "token: state-token\n"
                                       "trainers: 1\n"
                                       "rollouts: 1\n"
                                       "heartbeat: 50ms\n"
                                       "dead_after: 300ms\n"
                                       "poll_hold: 0s\n",
                                       &job);
    struct wb_session s[2];
    const char *role[2] = {"trainer", "rollout"};
    for (int i = 0; i < 2; i++) {
        struct wb_body_register reg = {.device = -1, .host = "h", .pid = 1 + (uint64_t)i};
        snprintf(reg.role, sizeof(reg.role), "%s", role[i]);
        struct wb_body_registered ok;
        CHECK_INT(feed(c, WB_MSG_REGISTER, &reg, &ok), WB_MSG_REGISTERED);
        s[i] = (struct wb_session){.rank = 0, .session = ok.session};
        snprintf(s[i].role, sizeof(s[i].role), "%s", role[i]);
    }
    struct wb_body_heartbeat tr = {.s = s[0]}, ro = {.s = s[1]};
    nanosleep(&(struct timespec){1, 500000000}, NULL); /* the controller does not turn */
    CHECK_INT(feed(c, WB_MSG_HEARTBEAT, &tr, NULL), WB_MSG_OK);
    CHECK_INT(feed(c, WB_MSG_HEARTBEAT, &ro, NULL), WB_MSG_OK); /* not "unknown session" */
    for (int t = 0; t < 30; t++) { /* 1.5 s of turns: dead after 4 x 300 ms (in setup) */
        CHECK_INT(feed(c, WB_MSG_HEARTBEAT, &tr, NULL), WB_MSG_OK);
        nanosleep(&(struct timespec){0, 50000000}, NULL);
    }
    struct wb_body_error e;
    CHECK_INT(feed(c, WB_MSG_HEARTBEAT, &ro, &e), WB_MSG_ERROR);
    char want[128];
    snprintf(want, sizeof(want), "rollout rank 0: unknown session %llu: register again",
             (unsigned long long)s[1].session);
    CHECK_STR(e.msg, want);
    wb_controller_destroy(c);
    wb_job_free(&job);
}

const struct wb_test wb_tests[] = {
    {"controller_stall", test_controller_stall, 30},
    {"stale_heartbeat", test_stale_heartbeat, 30},
    {"failed_commit_phase", test_failed_commit_phase, 30},
    {0},
};
