/* msg.c — the control-plane codec: one field table per body type, and the one encoder and the
 * one decoder that walk them.
 *
 * Why tables instead of a hand-written reader per message: a field is declared once (key, type,
 * whether it is required, where it lives) and both directions follow from it, so an encoder
 * and a decoder can never disagree on a key, and every receiver gets the same exact errors for
 * an unknown, missing, mistyped or oversized field. The token check lives in one place
 * (wb_msg_open) that every receiver goes through. */
#include "proto/proto.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const role_names[WB_ROLE_COUNT] = {"trainer", "rollout"};

const char *wb_role_name(enum wb_role r)
{
    return (unsigned)r < WB_ROLE_COUNT ? role_names[r] : "unknown";
}

int wb_role_parse(const char *s, enum wb_role *out)
{
    for (int i = 0; i < WB_ROLE_COUNT; i++)
        if (strcmp(s, role_names[i]) == 0) {
            *out = (enum wb_role)i;
            return 0;
        }
    return -EINVAL;
}

const char *wb_token_resolve(const char *given)
{
    if (given && *given)
        return given;
    const char *env = getenv("WB_TOKEN");
    return env && *env ? env : NULL;
}

static const char *const stage_names[WB_STAGE_COUNT] = {"h2d",   "gather", "fuse",
                                                        "quant", "write",  "barrier"};

const char *wb_stage_name(enum wb_stage s)
{
    return (unsigned)s < WB_STAGE_COUNT ? stage_names[s] : "unknown";
}

/* ---------------------------------------------------------------- tables */

#define F(T, key, type, req, member)                                                               \
    {                                                                                              \
        key, type, req, offsetof(T, member), sizeof(((T *)0)->member)                              \
    }
/* The session header every agent call after REGISTER starts with. */
#define SESSION(T)                                                                                 \
    F(T, "role", WB_FIELD_STR, true, s.role), F(T, "rank", WB_FIELD_U64, true, s.rank),            \
        F(T, "session", WB_FIELD_U64, true, s.session)

static const struct wb_field f_error[] = {
    F(struct wb_body_error, "code", WB_FIELD_I64, true, code),
    F(struct wb_body_error, "msg", WB_FIELD_STR, true, msg),
    F(struct wb_body_error, "detail", WB_FIELD_BYTES, false, detail),
};
static const struct wb_field f_registered[] = {
    F(struct wb_body_registered, "session", WB_FIELD_U64, true, session),
    F(struct wb_body_registered, "heartbeat_ns", WB_FIELD_U64, true, heartbeat_ns),
    F(struct wb_body_registered, "dead_ns", WB_FIELD_U64, true, dead_ns),
    F(struct wb_body_registered, "poll_hold_ns", WB_FIELD_U64, true, poll_hold_ns),
};
static const struct wb_field f_commands[] = {
    F(struct wb_body_commands, "cmds", WB_FIELD_OBJ, true, cmds),
};
static const struct wb_field f_result[] = {
    F(struct wb_body_result, "version", WB_FIELD_U64, true, version),
    F(struct wb_body_result, "total_ns", WB_FIELD_U64, true, total_ns),
    F(struct wb_body_result, "gen", WB_FIELD_U64, true, gen),
    F(struct wb_body_result, "sent_ns", WB_FIELD_U64, false, sent_ns),
    F(struct wb_body_result, "received_ns", WB_FIELD_U64, false, received_ns),
    F(struct wb_body_result, "trainers", WB_FIELD_OBJ, true, trainers),
    F(struct wb_body_result, "rollout_bytes", WB_FIELD_OBJ, true, rollout_bytes),
    F(struct wb_body_result, "delta", WB_FIELD_BYTES, false, delta),
};
static const struct wb_field f_status[] = {
    F(struct wb_body_status, "job", WB_FIELD_STR, true, job),
    F(struct wb_body_status, "state", WB_FIELD_STR, true, state),
    F(struct wb_body_status, "gen", WB_FIELD_U64, true, gen),
    F(struct wb_body_status, "version", WB_FIELD_U64, true, version),
    F(struct wb_body_status, "in_flight", WB_FIELD_U64, true, in_flight),
    F(struct wb_body_status, "last_bytes", WB_FIELD_U64, false, last_bytes),
    F(struct wb_body_status, "last_full_bytes", WB_FIELD_U64, false, last_full_bytes),
    F(struct wb_body_status, "last_delta_rollouts", WB_FIELD_U64, false, last_delta_rollouts),
    F(struct wb_body_status, "agents", WB_FIELD_OBJ, true, agents),
    F(struct wb_body_status, "conns", WB_FIELD_OBJ, false, conns),
};
static const struct wb_field f_conn_stats[] = {
    F(struct wb_conn_stats, "held", WB_FIELD_U64, true, held),
    F(struct wb_conn_stats, "pending", WB_FIELD_U64, true, pending),
    F(struct wb_conn_stats, "max_held", WB_FIELD_U64, true, max_held),
    F(struct wb_conn_stats, "max_pending", WB_FIELD_U64, true, max_pending),
    F(struct wb_conn_stats, "accepted", WB_FIELD_U64, true, accepted),
    F(struct wb_conn_stats, "expired", WB_FIELD_U64, true, expired),
    F(struct wb_conn_stats, "evicted", WB_FIELD_U64, true, evicted),
    F(struct wb_conn_stats, "full", WB_FIELD_U64, true, full),
    F(struct wb_conn_stats, "oversized", WB_FIELD_U64, true, oversized),
    F(struct wb_conn_stats, "refused", WB_FIELD_U64, true, refused),
    F(struct wb_conn_stats, "unbound", WB_FIELD_U64, true, unbound),
};
static const struct wb_field f_welcome[] = {
    F(struct wb_body_welcome, "nonce", WB_FIELD_U64, true, nonce),
};
static const struct wb_field f_plan_info[] = {
    F(struct wb_body_plan_info, "summary", WB_FIELD_BYTES, true, summary),
};
static const struct wb_field f_register[] = {
    F(struct wb_body_register, "role", WB_FIELD_STR, true, role),
    F(struct wb_body_register, "rank", WB_FIELD_U64, true, rank),
    F(struct wb_body_register, "device", WB_FIELD_I64, true, device),
    F(struct wb_body_register, "host", WB_FIELD_STR, true, host),
    F(struct wb_body_register, "pid", WB_FIELD_U64, true, pid),
    F(struct wb_body_register, "synthetic", WB_FIELD_BOOL, false, synthetic),
    F(struct wb_body_register, "inv", WB_FIELD_OBJ, false, inv),
    F(struct wb_body_register, "mesh", WB_FIELD_OBJ, false, mesh),
    F(struct wb_body_register, "source", WB_FIELD_STR, false, source),
    F(struct wb_body_register, "digests", WB_FIELD_BYTES, false, digests),
    F(struct wb_body_register, "version", WB_FIELD_U64, false, version),
    F(struct wb_body_register, "session", WB_FIELD_U64, false, session),
    F(struct wb_body_register, "torn", WB_FIELD_BOOL, false, torn),
};
static const struct wb_field f_heartbeat[] = {
    SESSION(struct wb_body_heartbeat),
    F(struct wb_body_heartbeat, "version", WB_FIELD_U64, true, version),
    F(struct wb_body_heartbeat, "in_flight", WB_FIELD_BOOL, true, in_flight),
    F(struct wb_body_heartbeat, "done", WB_FIELD_U64, false, done),
    F(struct wb_body_heartbeat, "total", WB_FIELD_U64, false, total),
    F(struct wb_body_heartbeat, "epoch", WB_FIELD_U64, false, epoch),
    F(struct wb_body_heartbeat, "torn", WB_FIELD_BOOL, false, torn),
    F(struct wb_body_heartbeat, "commits", WB_FIELD_U64, false, commits),
    F(struct wb_body_heartbeat, "dropped", WB_FIELD_U64, false, dropped),
};
static const struct wb_field f_poll[] = {
    SESSION(struct wb_body_poll),
    F(struct wb_body_poll, "ack", WB_FIELD_U64, true, ack),
};
static const struct wb_field f_rep_setup[] = {
    SESSION(struct wb_body_rep_setup),
    F(struct wb_body_rep_setup, "gen", WB_FIELD_U64, true, gen),
    F(struct wb_body_rep_setup, "ok", WB_FIELD_BOOL, true, ok),
    F(struct wb_body_rep_setup, "err", WB_FIELD_STR, true, err),
    F(struct wb_body_rep_setup, "addr", WB_FIELD_BYTES, true, addr),
    F(struct wb_body_rep_setup, "regions", WB_FIELD_BYTES, true, regions),
};
static const struct wb_field f_rep_connected[] = {
    SESSION(struct wb_body_rep_connected),
    F(struct wb_body_rep_connected, "gen", WB_FIELD_U64, true, gen),
    F(struct wb_body_rep_connected, "ok", WB_FIELD_BOOL, true, ok),
    F(struct wb_body_rep_connected, "err", WB_FIELD_STR, true, err),
};
static const struct wb_field f_rep_sent[] = {
    SESSION(struct wb_body_rep_sent),
    F(struct wb_body_rep_sent, "version", WB_FIELD_U64, true, version),
    F(struct wb_body_rep_sent, "ok", WB_FIELD_BOOL, true, ok),
    F(struct wb_body_rep_sent, "err", WB_FIELD_STR, true, err),
    F(struct wb_body_rep_sent, "stats", WB_FIELD_OBJ, true, stats),
};
static const struct wb_field f_rep_received[] = {
    SESSION(struct wb_body_rep_received),
    F(struct wb_body_rep_received, "version", WB_FIELD_U64, true, version),
    F(struct wb_body_rep_received, "ok", WB_FIELD_BOOL, true, ok),
    F(struct wb_body_rep_received, "err", WB_FIELD_STR, true, err),
    F(struct wb_body_rep_received, "bytes", WB_FIELD_U64, true, bytes),
    F(struct wb_body_rep_received, "landed", WB_FIELD_OBJ, false, landed),
};
static const struct wb_field f_rep_committed[] = {
    SESSION(struct wb_body_rep_committed),
    F(struct wb_body_rep_committed, "version", WB_FIELD_U64, true, version),
    F(struct wb_body_rep_committed, "commits", WB_FIELD_U64, false, commits),
};
static const struct wb_field f_rep_drained[] = {
    SESSION(struct wb_body_rep_drained),
    F(struct wb_body_rep_drained, "version", WB_FIELD_U64, true, version),
};
static const struct wb_field f_leave[] = {
    SESSION(struct wb_body_leave),
};
static const struct wb_field f_push[] = {
    SESSION(struct wb_body_push),
    F(struct wb_body_push, "version", WB_FIELD_U64, true, version),
    F(struct wb_body_push, "queue", WB_FIELD_BOOL, false, queue),
};
static const struct wb_field f_skipped[] = {
    F(struct wb_body_skipped, "version", WB_FIELD_U64, true, version),
    F(struct wb_body_skipped, "by", WB_FIELD_U64, true, by),
};
static const struct wb_field f_ready[] = {
    F(struct wb_body_ready, "gen", WB_FIELD_U64, true, gen),
};
static const struct wb_field f_ctl_transfer[] = {
    F(struct wb_body_ctl_transfer, "version", WB_FIELD_U64, true, version),
    F(struct wb_body_ctl_transfer, "timeout_ns", WB_FIELD_U64, false, timeout_ns),
};
static const struct wb_field f_setup[] = {
    F(struct wb_body_setup, "gen", WB_FIELD_U64, true, gen),
    F(struct wb_body_setup, "seed", WB_FIELD_U64, true, seed),
    F(struct wb_body_setup, "provider", WB_FIELD_STR, true, provider),
    F(struct wb_body_setup, "trace", WB_FIELD_STR, true, trace),
    F(struct wb_body_setup, "trace_keep", WB_FIELD_U64, false, trace_keep),
    F(struct wb_body_setup, "job", WB_FIELD_STR, true, job),
    F(struct wb_body_setup, "plan", WB_FIELD_BYTES, true, plan),
    F(struct wb_body_setup, "shards", WB_FIELD_BYTES, false, shards),
    F(struct wb_body_setup, "locals", WB_FIELD_BYTES, false, locals),
    F(struct wb_body_setup, "verify", WB_FIELD_BOOL, false, verify),
    F(struct wb_body_setup, "sums", WB_FIELD_BYTES, false, sums),
    F(struct wb_body_setup, "delta", WB_FIELD_BOOL, false, delta),
    F(struct wb_body_setup, "delta_slabs", WB_FIELD_BYTES, false, delta_slabs),
    F(struct wb_body_setup, "change_period", WB_FIELD_U64, false, change_period),
};
static const struct wb_field f_peers[] = {
    F(struct wb_body_peers, "gen", WB_FIELD_U64, true, gen),
    F(struct wb_body_peers, "agents", WB_FIELD_OBJ, true, agents),
};
static const struct wb_field f_version[] = {
    F(struct wb_body_version, "version", WB_FIELD_U64, true, version),
};
static const struct wb_field f_version_epoch[] = {
    F(struct wb_body_version_epoch, "version", WB_FIELD_U64, true, version),
    F(struct wb_body_version_epoch, "epoch", WB_FIELD_U64, true, epoch),
    F(struct wb_body_version_epoch, "key", WB_FIELD_BYTES, false, key),
    F(struct wb_body_version_epoch, "timeout_ns", WB_FIELD_U64, false, timeout_ns),
    F(struct wb_body_version_epoch, "skip", WB_FIELD_OBJ, false, skip),
    F(struct wb_body_version_epoch, "delta", WB_FIELD_BYTES, false, delta),
    F(struct wb_body_version_epoch, "delta_base", WB_FIELD_U64, false, delta_base),
};
static const struct wb_field f_abort[] = {
    F(struct wb_body_abort, "version", WB_FIELD_U64, true, version),
    F(struct wb_body_abort, "reason", WB_FIELD_STR, true, reason),
};
static const struct wb_field f_stats[] = {
    F(struct wb_xfer_stats, "rank", WB_FIELD_U64, true, rank),
    F(struct wb_xfer_stats, "bytes", WB_FIELD_U64, true, bytes),
    F(struct wb_xfer_stats, "writes", WB_FIELD_U64, true, writes),
    F(struct wb_xfer_stats, "tasks", WB_FIELD_U64, true, tasks),
    F(struct wb_xfer_stats, "peak_tmp", WB_FIELD_U64, true, peak_tmp),
    F(struct wb_xfer_stats, "cap", WB_FIELD_U64, true, cap),
    F(struct wb_xfer_stats, "stage_ns", WB_FIELD_U64S, true, stage_ns),
    F(struct wb_xfer_stats, "total_ns", WB_FIELD_U64, true, total_ns),
    F(struct wb_xfer_stats, "mem_waits", WB_FIELD_U64, true, mem_waits),
    F(struct wb_xfer_stats, "full_bytes", WB_FIELD_U64, false, full_bytes),
    F(struct wb_xfer_stats, "delta_bytes", WB_FIELD_U64, false, delta_bytes),
    F(struct wb_xfer_stats, "delta_ok", WB_FIELD_U64, false, delta_ok),
};
static const struct wb_field f_agent_status[] = {
    F(struct wb_body_agent_status, "role", WB_FIELD_STR, true, role),
    F(struct wb_body_agent_status, "rank", WB_FIELD_U64, true, rank),
    F(struct wb_body_agent_status, "state", WB_FIELD_STR, true, state),
    F(struct wb_body_agent_status, "host", WB_FIELD_STR, true, host),
    F(struct wb_body_agent_status, "pid", WB_FIELD_U64, true, pid),
    F(struct wb_body_agent_status, "device", WB_FIELD_I64, true, device),
    F(struct wb_body_agent_status, "version", WB_FIELD_U64, true, version),
    F(struct wb_body_agent_status, "in_flight", WB_FIELD_BOOL, true, in_flight),
    F(struct wb_body_agent_status, "seen_ms", WB_FIELD_U64, true, seen_ms),
    F(struct wb_body_agent_status, "done", WB_FIELD_U64, false, done),
    F(struct wb_body_agent_status, "total", WB_FIELD_U64, false, total),
    F(struct wb_body_agent_status, "err", WB_FIELD_STR, false, err),
    F(struct wb_body_agent_status, "torn", WB_FIELD_BOOL, false, torn),
    F(struct wb_body_agent_status, "dropped", WB_FIELD_U64, false, dropped),
};
#undef SESSION
#undef F

struct spec {
    uint32_t type;
    const char *name;
    const struct wb_field *f;
    size_t n;
};

#define S(type, name, table)                                                                       \
    {                                                                                              \
        type, name, table, WB_ARRAY_LEN(table)                                                     \
    }
#define S0(type, name)                                                                             \
    {                                                                                              \
        type, name, NULL, 0                                                                        \
    }
static const struct spec specs[] = {
    S(WB_MSG_ERROR, "ERROR", f_error),
    S0(WB_MSG_OK, "OK"),
    S(WB_MSG_REGISTERED, "REGISTERED", f_registered),
    S(WB_MSG_COMMANDS, "COMMANDS", f_commands),
    S(WB_MSG_RESULT, "RESULT", f_result),
    S(WB_MSG_STATUS, "STATUS", f_status),
    S(WB_MSG_PLAN_INFO, "PLAN_INFO", f_plan_info),
    S(WB_MSG_WELCOME, "WELCOME", f_welcome),
    S(WB_MSG_REGISTER, "REGISTER", f_register),
    S(WB_MSG_HEARTBEAT, "HEARTBEAT", f_heartbeat),
    S(WB_MSG_POLL, "POLL", f_poll),
    S(WB_MSG_REP_SETUP, "REPORT_SETUP", f_rep_setup),
    S(WB_MSG_REP_CONNECTED, "REPORT_CONNECTED", f_rep_connected),
    S(WB_MSG_REP_SENT, "REPORT_SENT", f_rep_sent),
    S(WB_MSG_REP_RECEIVED, "REPORT_RECEIVED", f_rep_received),
    S(WB_MSG_REP_COMMITTED, "REPORT_COMMITTED", f_rep_committed),
    S(WB_MSG_PUSH, "PUSH", f_push),
    S(WB_MSG_REP_DRAINED, "REPORT_DRAINED", f_rep_drained),
    S(WB_MSG_LEAVE, "LEAVE", f_leave),
    S(WB_MSG_CTL_TRANSFER, "TRANSFER", f_ctl_transfer),
    S0(WB_MSG_CTL_STATUS, "STATUS_REQUEST"),
    S0(WB_MSG_CTL_PLAN, "PLAN_REQUEST"),
    S0(WB_MSG_CTL_SHUTDOWN, "SHUTDOWN"),
    S0(WB_MSG_HELLO, "HELLO"),
    S(WB_CMD_SETUP, "SETUP", f_setup),
    S(WB_CMD_PEERS, "PEERS", f_peers),
    S(WB_CMD_TRANSFER, "TRANSFER_COMMAND", f_version_epoch),
    S(WB_CMD_COMPLETE, "COMPLETE", f_version),
    S(WB_CMD_ABORT, "ABORT", f_abort),
    S0(WB_CMD_EXIT, "EXIT"),
    S(WB_CMD_READY, "READY", f_ready),
    S(WB_CMD_REFUSED, "REFUSED", f_error),
    S(WB_CMD_SKIPPED, "SKIPPED", f_skipped),
    S(WB_BODY_STATS, "STATS", f_stats),
    S(WB_BODY_AGENT_STATUS, "AGENT_STATUS", f_agent_status),
    S(WB_BODY_CONN_STATS, "CONN_STATS", f_conn_stats),
};
#undef S
#undef S0

static const struct spec *spec_of(uint32_t type)
{
    for (size_t i = 0; i < WB_ARRAY_LEN(specs); i++)
        if (specs[i].type == type)
            return &specs[i];
    return NULL;
}

const char *wb_msg_type_name(uint32_t type)
{
    const struct spec *s = spec_of(type);
    return s ? s->name : NULL;
}

const struct wb_field *wb_msg_fields(uint32_t type, size_t *n)
{
    const struct spec *s = spec_of(type);
    *n = s ? s->n : 0;
    return s ? s->f : NULL;
}

/* ---------------------------------------------------------------- encoding */

static void put_field(struct wb_mpw *w, const struct wb_field *f, const uint8_t *b)
{
    const void *at = b + f->off;
    wb_mpw_str(w, f->key);
    switch (f->type) {
    case WB_FIELD_U64:
        wb_mpw_u64(w, *(const uint64_t *)at);
        break;
    case WB_FIELD_I64:
        wb_mpw_i64(w, *(const int64_t *)at);
        break;
    case WB_FIELD_BOOL:
        wb_mpw_bool(w, *(const bool *)at);
        break;
    case WB_FIELD_STR:
        wb_mpw_strn(w, at, strnlen(at, f->size));
        break;
    case WB_FIELD_BYTES: {
        const struct wb_bytes *x = at;
        wb_mpw_bin(w, x->n ? x->p : "", x->n);
        break;
    }
    case WB_FIELD_OBJ: {
        const struct wb_bytes *x = at;
        if (x->n)
            wb_mpw_raw(w, x->p, x->n);
        else
            wb_mpw_nil(w); /* an object never written: reads back as absent content */
        break;
    }
    case WB_FIELD_U64S: {
        const uint64_t *v = at;
        uint32_t n = (uint32_t)(f->size / sizeof(uint64_t));
        wb_mpw_array(w, n);
        for (uint32_t i = 0; i < n; i++)
            wb_mpw_u64(w, v[i]);
        break;
    }
    }
}

static void put_map(struct wb_mpw *w, const struct spec *s, const char *token, const void *body)
{
    bool tok = token && s->type != WB_MSG_ERROR;
    wb_mpw_map(w, (uint32_t)s->n + (tok ? 1 : 0));
    if (tok) {
        wb_mpw_str(w, "token");
        wb_mpw_str(w, token);
    }
    for (size_t i = 0; i < s->n; i++)
        put_field(w, &s->f[i], body);
}

void wb_msg_encode(struct wb_mpw *w, uint32_t type, const char *token, const void *body)
{
    const struct spec *s = spec_of(type);
    if (!s) {
        w->err = w->err ? w->err : -EINVAL;
        return;
    }
    wb_mpw_envelope(w, type);
    put_map(w, s, token ? token : "", body);
}

void wb_body_put(struct wb_mpw *w, uint32_t type, const void *body)
{
    const struct spec *s = spec_of(type);
    if (!s) {
        w->err = w->err ? w->err : -EINVAL;
        return;
    }
    put_map(w, s, NULL, body);
}

void wb_msg_error(struct wb_mpw *w, int code, const char *msg)
{
    struct wb_body_error e = {.code = code};
    snprintf(e.msg, sizeof(e.msg), "%s", msg ? msg : "");
    wb_msg_encode(w, WB_MSG_ERROR, NULL, &e);
}

void wb_cmd_put(struct wb_mpw *w, uint64_t seq, uint32_t type, const void *body)
{
    wb_mpw_array(w, 3);
    wb_mpw_u64(w, seq);
    wb_mpw_u64(w, type);
    wb_body_put(w, type, body);
}

/* ---------------------------------------------------------------- decoding */

/* Compares in time independent of where the first difference lies. */
static bool token_eq(const void *a, size_t alen, const char *b)
{
    size_t blen = strlen(b);
    unsigned char diff = alen != blen;
    const unsigned char *x = a, *y = (const unsigned char *)b;
    for (size_t i = 0; i < alen && i < blen; i++)
        diff |= x[i] ^ y[i];
    return diff == 0;
}

int wb_msg_open(const void *buf, size_t len, const char *token, struct wb_msg *m, const char **why)
{
    struct wb_mpr r;
    uint32_t type, n;
    const char *w = NULL;
    wb_mpr_init(&r, buf, len);
    int err = wb_mpr_envelope(&r, &type);
    if (err) {
        w = err == -WB_E_VERSION ? "refused: unsupported message version"
                                 : "refused: not a weightbridge message";
    } else if (wb_mpr_map(&r, 64, &n)) {
        w = "refused: message body is not a map";
        err = -EBADMSG;
    } else if (type != WB_MSG_ERROR) {
        const void *k, *t;
        size_t kl, tl;
        struct wb_mpr save = r;
        if (n == 0 || wb_mpr_bin(&r, &k, &kl, 16) || kl != 5 || memcmp(k, "token", 5) != 0) {
            w = "refused: message without a cluster token";
            err = -WB_E_TOKEN;
            r = save;
        } else if (wb_mpr_bin(&r, &t, &tl, WB_WIRE_MAX_STR) || !token || !token_eq(t, tl, token)) {
            w = "refused: wrong cluster token";
            err = -WB_E_TOKEN;
        } else {
            n--;
        }
    }
    if (err) {
        if (why)
            *why = w;
        return err;
    }
    *m = (struct wb_msg){.type = type, .nkeys = n, .r = r};
    return 0;
}

static int get_field(struct wb_mpr *r, const struct wb_field *f, uint8_t *b)
{
    void *at = b + f->off;
    switch (f->type) {
    case WB_FIELD_U64:
        return wb_mpr_u64(r, at);
    case WB_FIELD_I64:
        return wb_mpr_i64(r, at);
    case WB_FIELD_BOOL:
        return wb_mpr_bool(r, at);
    case WB_FIELD_STR:
        return wb_mpr_str(r, at, f->size);
    case WB_FIELD_BYTES: {
        struct wb_bytes *x = at;
        return wb_mpr_bin(r, &x->p, &x->n, SIZE_MAX);
    }
    case WB_FIELD_OBJ: {
        struct wb_bytes *x = at;
        const uint8_t *p0 = r->p;
        if (wb_mpr_nil(r)) {
            *x = (struct wb_bytes){NULL, 0};
            return 0;
        }
        int err = wb_mpr_skip(r);
        *x = (struct wb_bytes){p0, (size_t)(r->p - p0)};
        return err;
    }
    case WB_FIELD_U64S: {
        uint64_t *v = at;
        uint32_t n, cap = (uint32_t)(f->size / sizeof(uint64_t));
        int err = wb_mpr_array(r, cap, &n);
        memset(v, 0, f->size);
        for (uint32_t i = 0; !err && i < n; i++)
            err = wb_mpr_u64(r, &v[i]);
        return err;
    }
    }
    return -EBADMSG;
}

static const char *const type_words[] = {
    [WB_FIELD_U64] = "an unsigned integer",
    [WB_FIELD_I64] = "an integer",
    [WB_FIELD_BOOL] = "a boolean",
    [WB_FIELD_STR] = "a string",
    [WB_FIELD_BYTES] = "a string or binary",
    [WB_FIELD_OBJ] = "an object",
    [WB_FIELD_U64S] = "an array of unsigned integers",
};

/* Reads n key/value pairs at r into a scratch copy of the body, then checks the required ones;
 * the caller's body changes only when everything held. */
static int get_pairs(struct wb_mpr *r, uint32_t n, const struct spec *s, void *body, char *why,
                     size_t cap)
{
    enum { MAX_BODY = 2048, MAX_FIELDS = 32 };
    _Alignas(max_align_t) uint8_t tmp[MAX_BODY];
    bool seen[MAX_FIELDS] = {false};
    size_t size = 0;
    for (size_t i = 0; i < s->n; i++)
        if (s->f[i].off + s->f[i].size > size)
            size = s->f[i].off + s->f[i].size;
    if (size > sizeof(tmp) || s->n > MAX_FIELDS) { /* a table too large for the scratch copy */
        snprintf(why, cap, "%s: body too large to decode", s->name);
        return -EINVAL;
    }
    memset(tmp, 0, size);
    for (uint32_t k = 0; k < n; k++) {
        const void *key;
        size_t kl;
        if (wb_mpr_bin(r, &key, &kl, 64)) {
            snprintf(why, cap, "%s: malformed field name", s->name);
            return -EBADMSG;
        }
        size_t i = 0;
        while (i < s->n && !(strlen(s->f[i].key) == kl && memcmp(s->f[i].key, key, kl) == 0))
            i++;
        if (i == s->n) {
            snprintf(why, cap, "%s: unknown field \"%.*s\"", s->name, (int)kl, (const char *)key);
            return -EBADMSG;
        }
        if (seen[i]) {
            snprintf(why, cap, "%s: field \"%s\" given twice", s->name, s->f[i].key);
            return -EBADMSG;
        }
        seen[i] = true;
        struct wb_mpr at = *r;
        if (get_field(r, &s->f[i], tmp)) {
            if (s->f[i].type == WB_FIELD_STR && wb_mpr_bin(&at, &key, &kl, SIZE_MAX) == 0)
                snprintf(why, cap, "%s: field \"%s\": longer than %zu bytes", s->name, s->f[i].key,
                         s->f[i].size - 1);
            else
                snprintf(why, cap, "%s: field \"%s\": expected %s", s->name, s->f[i].key,
                         type_words[s->f[i].type]);
            return -EBADMSG;
        }
    }
    for (size_t i = 0; i < s->n; i++)
        if (s->f[i].required && !seen[i]) {
            snprintf(why, cap, "%s: missing field \"%s\"", s->name, s->f[i].key);
            return -EBADMSG;
        }
    if (size)
        memcpy(body, tmp, size);
    return 0;
}

int wb_msg_decode(const struct wb_msg *m, void *body, char *why, size_t whycap)
{
    const struct spec *s = spec_of(m->type);
    if (!s) {
        snprintf(why, whycap, "refused: unknown message type %#x", m->type);
        return -EBADMSG;
    }
    struct wb_mpr r = m->r;
    int err = get_pairs(&r, m->nkeys, s, body, why, whycap);
    if (!err && wb_mpr_end(&r)) {
        snprintf(why, whycap, "%s: bytes after the body", s->name);
        err = -EBADMSG;
    }
    return err;
}

int wb_body_get(struct wb_mpr *r, uint32_t type, void *body, char *why, size_t whycap)
{
    const struct spec *s = spec_of(type);
    uint32_t n;
    if (!s) {
        snprintf(why, whycap, "unknown body type %#x", type);
        return -EBADMSG;
    }
    if (wb_mpr_map(r, 64, &n)) {
        snprintf(why, whycap, "%s: not a map", s->name);
        return -EBADMSG;
    }
    return get_pairs(r, n, s, body, why, whycap);
}

/* ---------------------------------------------------------------- connection binding */

void wb_bind_put(uint8_t out[WB_BIND_LEN], uint64_t nonce, uint64_t seq)
{
    uint32_t magic = WB_BIND_MAGIC, zero = 0;
    for (int i = 0; i < 4; i++) {
        out[i] = (uint8_t)(magic >> (8 * i));
        out[4 + i] = (uint8_t)(zero >> (8 * i));
    }
    for (int i = 0; i < 8; i++) {
        out[8 + i] = (uint8_t)(nonce >> (8 * i));
        out[16 + i] = (uint8_t)(seq >> (8 * i));
    }
}

int wb_bind_get(const void *p, size_t n, uint64_t *nonce, uint64_t *seq)
{
    const uint8_t *b = p;
    uint32_t magic = 0, zero = 0;
    uint64_t x = 0, s = 0;
    if (n < WB_BIND_LEN)
        return -EBADMSG;
    for (int i = 0; i < 4; i++) {
        magic |= (uint32_t)b[i] << (8 * i);
        zero |= (uint32_t)b[4 + i] << (8 * i);
    }
    for (int i = 0; i < 8; i++) {
        x |= (uint64_t)b[8 + i] << (8 * i);
        s |= (uint64_t)b[16 + i] << (8 * i);
    }
    if (magic != WB_BIND_MAGIC || zero != 0)
        return -EBADMSG;
    *nonce = x;
    *seq = s;
    return 0;
}

/* ---------------------------------------------------------------- registered tensors */

void wb_reg_put(struct wb_mpw *w, const struct wb_reg_tensor *t)
{
    wb_mpw_array(w, t->nplace ? 3 : 2);
    wb_wire_put_tensor_meta(w, &t->meta);
    if (!t->has_strides) {
        wb_mpw_nil(w);
    } else {
        wb_mpw_array(w, t->meta.box.ndim);
        for (uint32_t d = 0; d < t->meta.box.ndim; d++)
            wb_mpw_i64(w, t->strides[d]);
    }
    if (t->nplace) {
        wb_mpw_array(w, t->nplace);
        for (uint32_t d = 0; d < t->nplace; d++)
            wb_mpw_i64(w, t->place[d]);
    }
}

void wb_reg_mesh_put(struct wb_mpw *w, const struct wb_reg_mesh *m)
{
    wb_mpw_array(w, m->ndims);
    for (uint32_t d = 0; d < m->ndims; d++) {
        wb_mpw_array(w, 2);
        wb_mpw_str(w, m->name[d]);
        wb_mpw_u64(w, m->size[d]);
    }
}

int wb_reg_mesh_get(struct wb_mpr *r, struct wb_reg_mesh *out)
{
    struct wb_reg_mesh m;
    uint32_t two;
    memset(&m, 0, sizeof(m));
    if (wb_mpr_array(r, WB_REG_MESH_DIMS, &m.ndims) || m.ndims == 0)
        return -EBADMSG;
    for (uint32_t d = 0; d < m.ndims; d++)
        if (wb_mpr_array(r, 2, &two) || two != 2 || wb_mpr_str(r, m.name[d], WB_REG_MESH_NAME) ||
            wb_mpr_u32(r, &m.size[d]) || m.size[d] == 0)
            return -EBADMSG;
    *out = m;
    return 0;
}

int wb_reg_get(struct wb_mpr *r, struct wb_reg_tensor *t)
{
    struct wb_reg_tensor x;
    uint32_t k, n;
    memset(&x, 0, sizeof(x));
    if (wb_mpr_array(r, 3, &k) || k < 2 || wb_wire_get_tensor_meta(r, &x.meta))
        return -EBADMSG;
    if (!wb_mpr_nil(r)) {
        if (wb_mpr_array(r, WB_MAX_DIMS, &n) || n != x.meta.box.ndim)
            return -EBADMSG;
        for (uint32_t d = 0; d < n; d++)
            if (wb_mpr_i64(r, &x.strides[d]))
                return -EBADMSG;
        x.has_strides = true;
    }
    if (k == 3) {
        if (wb_mpr_array(r, WB_REG_MESH_DIMS, &x.nplace) || x.nplace == 0)
            return -EBADMSG;
        for (uint32_t d = 0; d < x.nplace; d++) {
            int64_t v;
            if (wb_mpr_i64(r, &v) || wb_reg_at_index(v) >= WB_REG_AT_MAX ||
                v >= (int64_t)x.meta.shape.ndim)
                return -EBADMSG;
            x.place[d] = (int32_t)v;
        }
    }
    *t = x;
    return 0;
}

bool wb_reg_contiguous(const struct wb_reg_tensor *t)
{
    if (!t->has_strides)
        return true;
    int64_t want = 1;
    for (uint32_t d = t->meta.box.ndim; d-- > 0;) {
        /* a dim of extent 1 may carry any stride (PyTorch leaves them arbitrary) */
        if (t->meta.box.ext[d] != 1 && t->strides[d] != want)
            return false;
        want *= (int64_t)t->meta.box.ext[d];
    }
    return true;
}

/* ---------------------------------------------------------------- commands */

int wb_cmd_reader_init(struct wb_cmd_reader *cr, const struct wb_bytes *cmds)
{
    wb_mpr_init(&cr->r, cmds->p, cmds->n);
    return wb_mpr_array(&cr->r, 1u << 16, &cr->left);
}

int wb_cmd_next(struct wb_cmd_reader *cr, uint64_t *seq, uint32_t *type, struct wb_mpr *body)
{
    uint32_t three;
    uint64_t t;
    if (!cr->left)
        return 0;
    cr->left--;
    if (wb_mpr_array(&cr->r, 3, &three) || three != 3 || wb_mpr_u64(&cr->r, seq) ||
        wb_mpr_u64(&cr->r, &t) || t > UINT32_MAX)
        return -EBADMSG;
    *body = cr->r;
    if (wb_mpr_skip(&cr->r))
        return -EBADMSG;
    *type = (uint32_t)t;
    return 1;
}
