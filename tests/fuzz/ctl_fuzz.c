/* ctl_fuzz.c — every message handler of the controller on hostile conversations: a controller
 * (a control-plane job: 2 trainers, 2 rollouts, no model) is fed a sequence of messages built
 * from the input through wb_controller_feed (the socket's path without the network), each
 * answered before the next, with its timers run between them. A record of the input is either a
 * whole message as raw bytes, or a message of one of the types the controller handles whose every
 * field (the body tables of proto/) takes a value from the input: small numbers, roles, strings,
 * raw msgpack for nested objects, and for "session" one the controller handed out to an earlier
 * REGISTER of this conversation (or a made-up one), so that the handlers past the session check run
 * too. Each input starts a new controller: a crash reproduces from its input alone. */
#include "controller/controller.h"
#include "proto/proto.h"
#include "tests/fuzz/fuzz.h"

#include <string.h>

static const char *const TOKEN = "fuzz-token";
static struct wb_job job;
static bool job_ok;

static const uint32_t TYPES[] = {
    WB_MSG_REGISTER,      WB_MSG_HEARTBEAT,    WB_MSG_POLL,         WB_MSG_REP_SETUP,
    WB_MSG_REP_CONNECTED, WB_MSG_REP_SENT,     WB_MSG_REP_RECEIVED, WB_MSG_REP_COMMITTED,
    WB_MSG_PUSH,          WB_MSG_CTL_TRANSFER, WB_MSG_CTL_STATUS,   WB_MSG_CTL_PLAN,
    WB_MSG_CTL_SHUTDOWN,  WB_MSG_LEAVE,        WB_MSG_CTL_DRAIN,
};
enum { NTYPES = sizeof(TYPES) / sizeof(TYPES[0]), MAX_SESSIONS = 8 };

/* The input, read from the front. */
struct in {
    const uint8_t *p;
    size_t n;
};

static uint8_t take8(struct in *in)
{
    if (!in->n)
        return 0;
    in->n--;
    return *in->p++;
}

static const uint8_t *take(struct in *in, size_t *len)
{
    size_t want = take8(in);
    if (want > in->n)
        want = in->n;
    const uint8_t *p = in->p;
    in->p += want;
    in->n -= want;
    *len = want;
    return p;
}

/* A value for a U64 field: mostly small, sometimes one of the edges. */
static uint64_t pick_u64(struct in *in, const char *key, const uint64_t *sessions, size_t ns)
{
    uint8_t b = take8(in);
    if (strcmp(key, "session") == 0 && ns && b < 200)
        return sessions[b % ns];
    switch (b >> 6) {
    case 0:
        return b & 3;
    case 1:
        return b & 63;
    case 2:
        return (uint64_t)take8(in) << 8 | take8(in);
    default:
        return b & 1 ? UINT64_MAX : (uint64_t)1 << (b & 63);
    }
}

/* Fills body (a struct of type's table) from the input. Strings and byte fields point into
 * the input or into scratch. */
static void fill(uint32_t type, void *body, struct in *in, const uint64_t *sessions, size_t ns)
{
    size_t nf = 0;
    const struct wb_field *f = wb_msg_fields(type, &nf);
    for (size_t i = 0; f && i < nf; i++) {
        uint8_t *at = (uint8_t *)body + f[i].off;
        switch (f[i].type) {
        case WB_FIELD_U64: {
            uint64_t v = pick_u64(in, f[i].key, sessions, ns);
            memcpy(at, &v, 8);
            break;
        }
        case WB_FIELD_I64: {
            int64_t v = (int8_t)take8(in);
            memcpy(at, &v, 8);
            break;
        }
        case WB_FIELD_BOOL:
            *(bool *)at = take8(in) & 1;
            break;
        case WB_FIELD_STR: {
            uint8_t b = take8(in);
            const char *fixed = b % 4 == 0 ? "trainer" : b % 4 == 1 ? "rollout" : NULL;
            size_t len;
            const uint8_t *p = fixed ? (const uint8_t *)fixed : take(in, &len);
            if (fixed)
                len = strlen(fixed);
            if (len >= f[i].size)
                len = f[i].size - 1;
            memcpy(at, p, len);
            at[len] = 0;
            break;
        }
        case WB_FIELD_BYTES:
        case WB_FIELD_OBJ: {
            struct wb_bytes b;
            size_t len;
            b.p = take(in, &len);
            b.n = len;
            if (f[i].type == WB_FIELD_OBJ && len == 0) { /* one msgpack nil */
                static const uint8_t nil = 0xc0;
                b.p = &nil;
                b.n = 1;
            }
            memcpy(at, &b, sizeof(b));
            break;
        }
        case WB_FIELD_U64S: {
            size_t k = take8(in) % (f[i].size / 8 + 1);
            for (size_t j = 0; j < k; j++) {
                uint64_t v = pick_u64(in, "", sessions, ns);
                memcpy(at + 8 * j, &v, 8);
            }
            break;
        }
        }
    }
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    static const char text[] = "name: fuzz\nlisten: tcp://127.0.0.1:0\ntoken: fuzz-token\n"
                               "trainers: 2\nrollouts: 2\nheartbeat: 100ms\ndead_after: 1s\n"
                               "poll_hold: 0s\n";
    const char *path = fuzz_file((const uint8_t *)text, sizeof(text) - 1, ".yaml");
    struct wb_errlist el;
    wb_errlist_init(&el);
    job_ok = wb_job_load(path, &job, &el) == 0;
    wb_errlist_free(&el);
    setenv("WB_LOG", "off", 0); /* the refusals are the point: keep them quiet */
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!job_ok)
        abort();
    struct wb_controller *c;
    struct wb_errlist el;
    wb_errlist_init(&el);
    if (wb_controller_create(&job, &c, &el))
        abort(); /* the same job every time: it must always start */
    wb_errlist_free(&el);
    uint64_t sessions[MAX_SESSIONS];
    size_t ns = 0;
    struct in in = {data, size};
    for (int m = 0; m < 32 && in.n; m++) {
        uint8_t sel = take8(&in);
        struct wb_mpw w, rep;
        wb_mpw_init(&w);
        wb_mpw_init(&rep);
        uint32_t type = TYPES[sel % NTYPES];
        if (sel >= 0xf0) { /* raw bytes */
            size_t len;
            const uint8_t *p = take(&in, &len);
            wb_mpw_raw(&w, p, len);
        } else {
            uint8_t body[4096] __attribute__((aligned(16)));
            memset(body, 0, sizeof(body));
            fill(type, body, &in, sessions, ns);
            wb_msg_encode(&w, type, TOKEN, body);
        }
        if (!w.err && wb_controller_feed(c, w.buf, w.len, &rep) == 0 && !rep.err) {
            struct wb_msg msg;
            const char *why;
            struct wb_body_registered r;
            char w2[256];
            if (wb_msg_open(rep.buf, rep.len, TOKEN, &msg, &why) == 0 &&
                msg.type == WB_MSG_REGISTERED && wb_msg_decode(&msg, &r, w2, sizeof(w2)) == 0 &&
                ns < MAX_SESSIONS)
                sessions[ns++] = r.session;
        }
        wb_mpw_free(&w);
        wb_mpw_free(&rep);
    }
    wb_controller_destroy(c);
    return 0;
}
