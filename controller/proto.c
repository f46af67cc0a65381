/* proto.c — the control-plane message codec: token-carrying bodies in common's versioned
 * envelope, a zero-copy key index for reading them, and the nng REQ channel agents and clients
 * use to reach the controller.
 *
 * Why a key index instead of one decoder per message: every message is a map, readers look up
 * the keys they need and ignore the rest, so adding a field never breaks an older peer, and the
 * token check lives in one place (wb_msg_open) that every receiver goes through. */
#include "controller/controller.h"

#include <errno.h>
#include <nng/nng.h>
#include <nng/protocol/reqrep0/req.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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

static const char *const stage_names[WB_STAGE_COUNT] = {"h2d",   "gather", "fuse",
                                                        "quant", "write",  "barrier"};

const char *wb_stage_name(enum wb_stage s)
{
    return (unsigned)s < WB_STAGE_COUNT ? stage_names[s] : "unknown";
}

/* ---------------------------------------------------------------- writing */

void wb_msg_begin(struct wb_mpw *w, uint32_t type, const char *token, uint32_t npairs)
{
    wb_mpw_envelope(w, type);
    wb_mpw_map(w, npairs + 1);
    wb_msg_kstr(w, "token", token ? token : "");
}

void wb_msg_kstr(struct wb_mpw *w, const char *key, const char *val)
{
    wb_mpw_str(w, key);
    wb_mpw_str(w, val ? val : "");
}

void wb_msg_ku64(struct wb_mpw *w, const char *key, uint64_t val)
{
    wb_mpw_str(w, key);
    wb_mpw_u64(w, val);
}

void wb_msg_ki64(struct wb_mpw *w, const char *key, int64_t val)
{
    wb_mpw_str(w, key);
    wb_mpw_i64(w, val);
}

void wb_msg_kf64(struct wb_mpw *w, const char *key, double val)
{
    wb_mpw_str(w, key);
    wb_mpw_f64(w, val);
}

void wb_msg_kbool(struct wb_mpw *w, const char *key, bool val)
{
    wb_mpw_str(w, key);
    wb_mpw_bool(w, val);
}

void wb_msg_kbin(struct wb_mpw *w, const char *key, const void *p, size_t n)
{
    wb_mpw_str(w, key);
    wb_mpw_bin(w, n ? p : "", n); /* an empty blob may come as NULL; memcpy must not see it */
}

void wb_msg_error(struct wb_mpw *w, const char *token, int code, const char *msg)
{
    wb_msg_begin(w, WB_MSG_ERROR, token, 2);
    wb_msg_ki64(w, "code", code);
    wb_msg_kstr(w, "msg", msg);
}

/* ---------------------------------------------------------------- reading */

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
    wb_mpr_init(&r, buf, len);
    int err = wb_mpr_envelope(&r, &type);
    if (err) {
        if (why)
            *why = err == -WB_E_VERSION ? "refused: unsupported message version"
                                        : "refused: not a weightbridge message";
        return err;
    }
    if (wb_mpr_map(&r, WB_MSG_MAX_KEYS, &n)) {
        if (why)
            *why = "refused: message body is not a map of at most 48 keys";
        return -EBADMSG;
    }
    struct wb_msg tmp = {.type = type, .nkeys = n};
    for (uint32_t i = 0; i < n; i++) {
        const void *k;
        size_t kl;
        if (wb_mpr_bin(&r, &k, &kl, 64))
            break;
        tmp.kv[i].key = k;
        tmp.kv[i].keylen = kl;
        tmp.kv[i].val = r;
        wb_mpr_skip(&r);
    }
    if (wb_mpr_end(&r)) {
        if (why)
            *why = "refused: malformed message body";
        return -EBADMSG;
    }
    if (token) {
        const void *t;
        size_t tl;
        if (n == 0 || tmp.kv[0].keylen != 5 || memcmp(tmp.kv[0].key, "token", 5) != 0) {
            if (why)
                *why = "refused: message without a cluster token";
            return -WB_E_TOKEN;
        }
        struct wb_mpr tv = tmp.kv[0].val;
        if (wb_mpr_bin(&tv, &t, &tl, WB_WIRE_MAX_STR) || !token_eq(t, tl, token)) {
            if (why)
                *why = "refused: wrong cluster token";
            return -WB_E_TOKEN;
        }
    }
    *m = tmp;
    return 0;
}

int wb_msg_index(struct wb_mpr *r, struct wb_msg *m)
{
    struct wb_msg tmp = {0};
    uint32_t n;
    if (wb_mpr_map(r, WB_MSG_MAX_KEYS, &n))
        return -EBADMSG;
    for (uint32_t i = 0; i < n; i++) {
        const void *k;
        size_t kl;
        if (wb_mpr_bin(r, &k, &kl, 64))
            return -EBADMSG;
        tmp.kv[i].key = k;
        tmp.kv[i].keylen = kl;
        tmp.kv[i].val = *r;
        if (wb_mpr_skip(r))
            return -EBADMSG;
    }
    tmp.nkeys = n;
    *m = tmp;
    return 0;
}

struct wb_mpr wb_msg_get(const struct wb_msg *m, const char *key)
{
    size_t kl = strlen(key);
    for (uint32_t i = 0; i < m->nkeys; i++)
        if (m->kv[i].keylen == kl && memcmp(m->kv[i].key, key, kl) == 0)
            return m->kv[i].val;
    struct wb_mpr failed = {.err = -EBADMSG};
    return failed;
}

bool wb_msg_has(const struct wb_msg *m, const char *key)
{
    struct wb_mpr r = wb_msg_get(m, key);
    return r.err == 0;
}

int wb_msg_u64(const struct wb_msg *m, const char *key, uint64_t *v)
{
    struct wb_mpr r = wb_msg_get(m, key);
    return r.err ? -ENOENT : wb_mpr_u64(&r, v);
}

int wb_msg_i64(const struct wb_msg *m, const char *key, int64_t *v)
{
    struct wb_mpr r = wb_msg_get(m, key);
    return r.err ? -ENOENT : wb_mpr_i64(&r, v);
}

int wb_msg_f64(const struct wb_msg *m, const char *key, double *v)
{
    struct wb_mpr r = wb_msg_get(m, key);
    return r.err ? -ENOENT : wb_mpr_f64(&r, v);
}

int wb_msg_bool(const struct wb_msg *m, const char *key, bool *v)
{
    struct wb_mpr r = wb_msg_get(m, key);
    return r.err ? -ENOENT : wb_mpr_bool(&r, v);
}

int wb_msg_str(const struct wb_msg *m, const char *key, char *buf, size_t cap)
{
    struct wb_mpr r = wb_msg_get(m, key);
    return r.err ? -ENOENT : wb_mpr_str(&r, buf, cap);
}

int wb_msg_bin(const struct wb_msg *m, const char *key, const void **p, size_t *n)
{
    struct wb_mpr r = wb_msg_get(m, key);
    return r.err ? -ENOENT : wb_mpr_bin(&r, p, n, SIZE_MAX);
}

/* ---------------------------------------------------------------- stats */

void wb_xfer_stats_put(struct wb_mpw *w, const struct wb_xfer_stats *s)
{
    wb_mpw_array(w, 9);
    wb_mpw_u64(w, s->rank);
    wb_mpw_u64(w, s->bytes);
    wb_mpw_u64(w, s->writes);
    wb_mpw_u64(w, s->tasks);
    wb_mpw_u64(w, s->peak_tmp);
    wb_mpw_u64(w, s->cap);
    wb_mpw_array(w, WB_STAGE_COUNT);
    for (int i = 0; i < WB_STAGE_COUNT; i++)
        wb_mpw_u64(w, s->stage_ns[i]);
    wb_mpw_u64(w, s->total_ns);
    wb_mpw_u64(w, s->mem_waits);
}

int wb_xfer_stats_get(struct wb_mpr *r, struct wb_xfer_stats *s)
{
    struct wb_xfer_stats t = {0};
    uint32_t n, ns;
    wb_mpr_array(r, 64, &n);
    if (n < 8) /* 8: before mem_waits; later versions only append */
        return -EBADMSG;
    wb_mpr_u32(r, &t.rank);
    wb_mpr_u64(r, &t.bytes);
    wb_mpr_u64(r, &t.writes);
    wb_mpr_u64(r, &t.tasks);
    wb_mpr_u64(r, &t.peak_tmp);
    wb_mpr_u64(r, &t.cap);
    wb_mpr_array(r, WB_STAGE_COUNT, &ns);
    for (uint32_t i = 0; i < ns; i++)
        wb_mpr_u64(r, &t.stage_ns[i]);
    wb_mpr_u64(r, &t.total_ns);
    if (n > 8)
        wb_mpr_u64(r, &t.mem_waits);
    for (uint32_t i = 9; i < n; i++)
        wb_mpr_skip(r);
    if (r->err)
        return r->err;
    *s = t;
    return 0;
}

/* ---------------------------------------------------------------- channel */

/* Plans and routing tables can be large; nng's 1 MiB default receive limit would drop them. */
enum { CHAN_MAX_MSG = 1 << 30 };

static int nng_err(int rv)
{
    switch (rv) {
    case 0:
        return 0;
    case NNG_ETIMEDOUT:
        return -ETIMEDOUT;
    case NNG_EAGAIN:
        return -EAGAIN;
    case NNG_ENOMEM:
        return -ENOMEM;
    default:
        return -EIO;
    }
}

int wb_chan_open(struct wb_chan *c, const char *url)
{
    nng_socket s;
    int fd, rv = nng_req0_open(&s);
    if (rv)
        return nng_err(rv);
    /* Resending would duplicate registers and reports at the controller: the agent resends
     * itself, knowing what is idempotent. */
    nng_socket_set_ms(s, NNG_OPT_REQ_RESENDTIME, NNG_DURATION_INFINITE);
    nng_socket_set_size(s, NNG_OPT_RECVMAXSZ, CHAN_MAX_MSG);
    nng_socket_set_ms(s, NNG_OPT_RECONNMINT, 20);
    nng_socket_set_ms(s, NNG_OPT_RECONNMAXT, 200);
    rv = nng_dial(s, url, NULL, NNG_FLAG_NONBLOCK);
    if (rv == 0)
        rv = nng_socket_get_int(s, NNG_OPT_RECVFD, &fd);
    if (rv) {
        nng_close(s);
        return rv == NNG_EADDRINVAL || rv == NNG_ENOTSUP ? -EINVAL : nng_err(rv);
    }
    *c = (struct wb_chan){.sock = s.id, .fd = fd};
    return 0;
}

void wb_chan_close(struct wb_chan *c)
{
    if (c->sock) {
        nng_close((nng_socket){.id = c->sock});
        c->sock = 0;
    }
}

int wb_chan_send(struct wb_chan *c, const struct wb_mpw *w)
{
    if (w->err)
        return w->err;
    int rv = nng_send((nng_socket){.id = c->sock}, w->buf, w->len, NNG_FLAG_NONBLOCK);
    if (rv)
        return nng_err(rv);
    c->busy = true;
    c->sent_ns = wb_now_ns();
    return 0;
}

int wb_chan_try_recv(struct wb_chan *c, void **buf, size_t *len)
{
    void *p;
    size_t n;
    int rv = nng_recv((nng_socket){.id = c->sock}, &p, &n, NNG_FLAG_ALLOC | NNG_FLAG_NONBLOCK);
    if (rv == NNG_EAGAIN)
        return 0;
    if (rv)
        return nng_err(rv);
    c->busy = false;
    *buf = p;
    *len = n;
    return 1;
}

void wb_chan_free(void *buf)
{
    if (buf)
        nng_free(buf, 0);
}

int wb_chan_call(struct wb_chan *c, const struct wb_mpw *w, uint64_t timeout_ns, void **buf,
                 size_t *len)
{
    uint64_t deadline = wb_now_ns() + timeout_ns;
    int err;
    /* The dial completes in the background: until a connection exists, sends say EAGAIN. */
    while ((err = wb_chan_send(c, w)) == -EAGAIN) {
        if (wb_now_ns() >= deadline)
            return -ETIMEDOUT;
        struct timespec ts = {0, 10000000};
        nanosleep(&ts, NULL);
    }
    if (err)
        return err;
    for (;;) {
        err = wb_chan_try_recv(c, buf, len);
        if (err)
            return err < 0 ? err : 0;
        uint64_t now = wb_now_ns();
        if (now >= deadline)
            return -ETIMEDOUT;
        uint64_t left_ms = (deadline - now) / 1000000 + 1;
        struct pollfd p = {.fd = c->fd, .events = POLLIN};
        poll(&p, 1, left_ms > 100 ? 100 : (int)left_ms);
    }
}
