/* serve.c — the controller's end of the control connections, on nng's stream layer.
 *
 * Why not a REP socket: nng's socket layer reads each frame whole (up to the socket's
 * receive limit, 64 MiB here) before its protocol sees it, keeps a TCP connection that never
 * finishes the SP handshake for its own 10 s (TLS: until the TLS handshake gives up), and
 * counts every connection alike, so strangers that connect and say nothing fill
 * max_connections and lock out the agents and wb-ctl (issue #28). Here the controller speaks
 * the same wire protocol itself (the 8-byte SP header, then frames of a 64-bit big-endian
 * length, the REQ's 4-byte request id and the body), so that it decides before reading:
 *
 *  - a connection is *pending* from its accept until a HELLO with the token (proto.h), and is
 *    closed if that has not happened within the job's handshake time, TLS handshake included;
 *  - a pending connection's frame may be at most WB_HELLO_MAX bytes: a longer one is closed
 *    from its length, before anything of it is read or allocated;
 *  - pending connections have their own places (max_pending, of which max_pending_per_peer
 *    per peer address); a newer one evicts the one that got least far (silent first), then the
 *    oldest, so idle strangers can be pushed out but
 *    never push anyone else out: introduced connections (max_connections) are a separate
 *    pool that only a token holder enters;
 *  - a pending connection's first message that is no HELLO with the token is answered with
 *    the refusal and closed: a stranger's flood costs one small message per connection, is
 *    never queued for the event loop and is counted (STATUS.conns);
 *  - every message on an introduced connection carries its nonce and a growing sequence
 *    number (proto.h), checked here: another connection's message or a replay is refused.
 *
 * Requests that pass reach the controller's loop as nng messages (the request id in the
 * header, the connection's id as the pipe), as from a raw REP socket; replies go back through
 * ctl_serve_send(). nng's callbacks run on its threads: one mutex guards everything here; the
 * loop learns of queued requests through a pipe's read end. */
#include "controller/ctl.h"

#include <errno.h>
#include <fcntl.h>
#include <nng/nng.h>
#include <nng/supplemental/tls/tls.h>
#include <nng/supplemental/util/platform.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum conn_state { CS_NEGO, CS_PENDING, CS_HELD, CS_CLOSED };
enum rx_phase { RX_SP, RX_LEN, RX_BODY };
enum { SP_REQ0 = 0x30, SP_REP0 = 0x31, TX_QUEUE_MAX = 16, BOUNCES_MAX = 3 };

struct txbuf {
    struct txbuf *next;
    size_t len;
    uint8_t buf[];
};

struct conn {
    struct ctl_serve *s;
    struct conn *next; /* in s->conns, then in s->dead */
    uint32_t id;
    nng_stream *st;
    nng_aio *rx, *tx;
    enum conn_state state;
    bool rx_busy, tx_busy;
    /* refused: answered why and read on only to see it closed (closing at once would race
     * the answer: nng's REQ fails a request whose connection closes before it is handed the
     * reply); whatever comes next closes it, and so does the handshake time */
    bool refused;
    uint8_t peer[16]; /* the peer's address (port left out): per-peer places */
    uint64_t order;   /* accept order: the oldest pending one is evicted first */
    uint64_t deadline;
    /* receiving */
    enum rx_phase phase;
    uint8_t hdr[8];
    uint8_t *body;
    size_t want, got;
    unsigned bounces; /* bound messages answered "HELLO first" while pending */
    /* binding (proto.h) */
    uint64_t nonce, seq;
    /* sending */
    struct txbuf *txq, *txlast;
    size_t txoff;
    unsigned ntx;
};

struct ctl_serve {
    pthread_mutex_t mu;
    nng_stream_listener *l;
    nng_aio *acc;
    char *token;
    struct ctl_serve_limits lim;
    struct conn *conns, *dead;
    uint32_t next_id, npending;
    uint64_t order;
    bool closing;
    /* requests for the loop */
    nng_msg **q;
    size_t qhead, qn, qcap;
    int pfd[2];
    bool signalled;
    uint32_t closed[256]; /* introduced connections closed since the loop last asked */
    uint32_t nclosed;
    struct wb_conn_stats stats;
};

static uint64_t be64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v = v << 8 | p[i];
    return v;
}

static void put_be(uint8_t *p, uint64_t v, int n)
{
    for (int i = n - 1; i >= 0; i--, v >>= 8)
        p[i] = (uint8_t)v;
}

/* ---------------------------------------------------------------- under s->mu */

static void rx_start(struct conn *c)
{
    nng_iov iov = {.iov_buf = (c->phase == RX_BODY ? c->body : c->hdr) + c->got,
                   .iov_len = c->want - c->got};
    nng_aio_set_iov(c->rx, 1, &iov);
    c->rx_busy = true;
    nng_stream_recv(c->st, c->rx);
}

static void tx_start(struct conn *c)
{
    nng_iov iov = {.iov_buf = c->txq->buf + c->txoff, .iov_len = c->txq->len - c->txoff};
    nng_aio_set_iov(c->tx, 1, &iov);
    c->tx_busy = true;
    nng_stream_send(c->st, c->tx);
}

static bool pending(const struct conn *c)
{
    return c->state == CS_NEGO || c->state == CS_PENDING;
}

/* Closes c's stream (its operations end with an error; the last one moves c to s->dead). */
static void conn_close(struct conn *c)
{
    struct ctl_serve *s = c->s;
    if (c->state == CS_CLOSED)
        return;
    if (pending(c))
        s->npending--;
    if (c->state == CS_HELD) {
        s->stats.held--;
        if (s->nclosed < WB_ARRAY_LEN(s->closed))
            s->closed[s->nclosed++] = c->id;
    }
    c->state = CS_CLOSED;
    nng_stream_close(c->st);
}

static void conn_maybe_dead(struct conn *c)
{
    struct ctl_serve *s = c->s;
    if (c->state != CS_CLOSED || c->rx_busy || c->tx_busy)
        return;
    for (struct conn **p = &s->conns; *p; p = &(*p)->next)
        if (*p == c) {
            *p = c->next;
            c->next = s->dead;
            s->dead = c;
            return;
        }
}

/* Queues a frame [length, request id, body] to c. */
static int conn_send(struct conn *c, const uint8_t id[4], const void *body, size_t n)
{
    if (c->state == CS_CLOSED)
        return -ENOTCONN;
    if (c->ntx >= TX_QUEUE_MAX) /* a peer that does not read: its replies are dropped */
        return -EAGAIN;
    struct txbuf *t = malloc(sizeof(*t) + 12 + n);
    if (!t)
        return -ENOMEM;
    t->next = NULL;
    t->len = 12 + n;
    put_be(t->buf, 4 + n, 8);
    memcpy(t->buf + 8, id, 4);
    if (n)
        memcpy(t->buf + 12, body, n);
    if (c->txlast)
        c->txlast->next = t;
    else
        c->txq = t;
    c->txlast = t;
    c->ntx++;
    if (!c->tx_busy)
        tx_start(c);
    return 0;
}

static void conn_send_msg(struct conn *c, const uint8_t id[4], uint32_t type, const void *body,
                          int code, const char *why)
{
    struct wb_mpw w;
    wb_mpw_init(&w);
    if (type == WB_MSG_ERROR)
        wb_msg_error(&w, code, why);
    else
        wb_msg_encode(&w, type, c->s->token, body);
    if (!w.err)
        conn_send(c, id, w.buf, w.len);
    wb_mpw_free(&w);
}

static void introduce(struct conn *c, const uint8_t id[4])
{
    struct ctl_serve *s = c->s;
    if (c->state != CS_HELD) {
        if (s->stats.held >= s->lim.max_held) {
            s->stats.full++;
            conn_send_msg(c, id, WB_MSG_ERROR, NULL, -EBUSY,
                          "the controller holds max_connections introduced connections");
            c->refused = true;
            return;
        }
        s->npending--;
        s->stats.held++;
        if (s->stats.held > s->stats.max_held)
            s->stats.max_held = s->stats.held;
        c->state = CS_HELD;
    }
    do
        c->nonce = wb_random_u64();
    while (!c->nonce);
    c->seq = 0;
    struct wb_body_welcome b = {.nonce = c->nonce};
    conn_send_msg(c, id, WB_MSG_WELCOME, &b, 0, NULL);
}

static void enqueue(struct ctl_serve *s, nng_msg *m)
{
    if (s->qn == s->qcap) {
        size_t cap = s->qcap ? 2 * s->qcap : 64;
        nng_msg **q = malloc(cap * sizeof(*q));
        if (!q) {
            nng_msg_free(m);
            return;
        }
        for (size_t i = 0; i < s->qn; i++)
            q[i] = s->q[(s->qhead + i) % s->qcap];
        free(s->q);
        s->q = q;
        s->qcap = cap;
        s->qhead = 0;
    }
    s->q[(s->qhead + s->qn++) % s->qcap] = m;
    if (!s->signalled) {
        s->signalled = true;
        ssize_t k = write(s->pfd[1], "r", 1);
        (void)k; /* the pipe is empty when not signalled */
    }
}

/* A whole frame arrived in c->body (c->want bytes). */
static void on_frame(struct conn *c)
{
    struct ctl_serve *s = c->s;
    const uint8_t *id = c->body, *p = c->body + 4;
    size_t n = c->want - 4;
    struct wb_msg m;
    const char *why = NULL;
    uint64_t nonce, seq;
    if (c->refused) {
        conn_close(c);
        return;
    }
    if (!(id[0] & 0x80)) { /* not a REQ's request id: not our peer */
        s->stats.refused += c->state != CS_HELD;
        conn_close(c);
        return;
    }
    bool bound = wb_bind_get(p, n, &nonce, &seq) == 0;
    if (!bound) {
        int err = wb_msg_open(p, n, s->token, &m, &why);
        if (!err && m.type == WB_MSG_HELLO) {
            introduce(c, id);
            return;
        }
        if (c->state != CS_HELD) {
            s->stats.refused++;
            conn_send_msg(c, id, WB_MSG_ERROR, NULL, err ? err : -WB_E_HELLO,
                          err ? why : "refused: a connection's first message is HELLO");
            c->refused = true;
            return;
        }
        s->stats.unbound++;
        conn_send_msg(c, id, WB_MSG_ERROR, NULL, -WB_E_HELLO,
                      "refused: a message without its connection's binding");
        return;
    }
    if (c->state != CS_HELD) { /* a channel whose connection was replaced: introduce it */
        if (++c->bounces > BOUNCES_MAX) {
            s->stats.refused++;
            conn_close(c);
            return;
        }
        conn_send_msg(c, id, WB_MSG_ERROR, NULL, -WB_E_HELLO,
                      "this connection is not introduced: HELLO first");
        return;
    }
    if (nonce != c->nonce || seq <= c->seq) {
        s->stats.unbound++;
        conn_send_msg(c, id, WB_MSG_ERROR, NULL, -WB_E_HELLO,
                      nonce != c->nonce ? "refused: another connection's message"
                                        : "refused: a replayed message (sequence number not new)");
        return;
    }
    c->seq = seq;
    nng_msg *msg;
    if (nng_msg_alloc(&msg, 0) != 0 || nng_msg_header_append(msg, id, 4) != 0 ||
        nng_msg_append(msg, p + WB_BIND_LEN, n - WB_BIND_LEN) != 0) {
        if (msg)
            nng_msg_free(msg);
        return;
    }
    nng_msg_set_pipe(msg, (nng_pipe){.id = c->id});
    enqueue(s, msg);
}

/* ---------------------------------------------------------------- nng callbacks */

static void on_rx(void *arg)
{
    struct conn *c = arg;
    struct ctl_serve *s = c->s;
    pthread_mutex_lock(&s->mu);
    c->rx_busy = false;
    int rv = nng_aio_result(c->rx);
    if (rv || c->state == CS_CLOSED) {
        conn_close(c);
        goto out;
    }
    c->got += nng_aio_count(c->rx);
    if (c->got < c->want) {
        rx_start(c);
        goto out;
    }
    if (c->phase == RX_SP) {
        const uint8_t *h = c->hdr;
        if (h[0] || h[1] != 'S' || h[2] != 'P' || h[3] || h[4] || h[5] != SP_REQ0 || h[6] || h[7]) {
            s->stats.refused++;
            conn_close(c);
            goto out;
        }
        c->state = CS_PENDING;
    } else if (c->phase == RX_LEN) {
        uint64_t len = be64(c->hdr);
        uint64_t max = c->state == CS_HELD ? (uint64_t)WB_CTL_MAX_MSG + WB_BIND_LEN + 4
                                           : (uint64_t)WB_HELLO_MAX;
        if (len > max || len < 4) {
            s->stats.oversized += len > max && c->state != CS_HELD;
            conn_close(c);
            goto out;
        }
        if (!(c->body = malloc(len))) {
            conn_close(c);
            goto out;
        }
        c->phase = RX_BODY;
        c->want = len;
        c->got = 0;
        rx_start(c);
        goto out;
    } else {
        on_frame(c);
        free(c->body);
        c->body = NULL;
        if (c->state == CS_CLOSED)
            goto out;
    }
    c->phase = RX_LEN;
    c->want = 8;
    c->got = 0;
    rx_start(c);
out:
    conn_maybe_dead(c);
    pthread_mutex_unlock(&s->mu);
}

static void on_tx(void *arg)
{
    struct conn *c = arg;
    struct ctl_serve *s = c->s;
    pthread_mutex_lock(&s->mu);
    c->tx_busy = false;
    if (nng_aio_result(c->tx) || c->state == CS_CLOSED) {
        conn_close(c);
        goto out;
    }
    c->txoff += nng_aio_count(c->tx);
    if (c->txoff == c->txq->len) {
        struct txbuf *t = c->txq;
        if (!(c->txq = t->next))
            c->txlast = NULL;
        free(t);
        c->ntx--;
        c->txoff = 0;
    }
    if (c->txq)
        tx_start(c);
out:
    conn_maybe_dead(c);
    pthread_mutex_unlock(&s->mu);
}

/* How far a pending connection got: 0 silent, 1 sent the SP header, 2 is sending a frame. A
 * client of ours sends its SP header as it connects and its HELLO with its first request;
 * the connections that said nothing go first. */
static int progress(const struct conn *c)
{
    return c->state == CS_NEGO ? 0 : c->phase == RX_BODY || c->got ? 2 : 1;
}

/* The pending connection to evict (of peer, when not NULL): the least advanced, then the
 * oldest; *count says how many are pending. */
static struct conn *weakest_pending(struct ctl_serve *s, const uint8_t *peer, uint32_t *count)
{
    struct conn *o = NULL;
    *count = 0;
    for (struct conn *c = s->conns; c; c = c->next)
        if (pending(c) && (!peer || memcmp(c->peer, peer, sizeof(c->peer)) == 0)) {
            ++*count;
            if (!o || progress(c) < progress(o) ||
                (progress(c) == progress(o) && c->order < o->order))
                o = c;
        }
    return o;
}

static void conn_new(struct ctl_serve *s, nng_stream *st)
{
    struct conn *c = calloc(1, sizeof(*c));
    if (!c || nng_aio_alloc(&c->rx, on_rx, c) != 0 || nng_aio_alloc(&c->tx, on_tx, c) != 0) {
        if (c) {
            nng_aio_free(c->rx);
            free(c);
        }
        nng_stream_close(st);
        nng_stream_free(st);
        return;
    }
    c->s = s;
    c->st = st;
    nng_sockaddr sa;
    if (nng_stream_get_addr(st, NNG_OPT_REMADDR, &sa) == 0) {
        if (sa.s_family == NNG_AF_INET)
            memcpy(c->peer, &sa.s_in.sa_addr, 4);
        else if (sa.s_family == NNG_AF_INET6)
            memcpy(c->peer, sa.s_in6.sa_addr, 16);
    }
    pthread_mutex_lock(&s->mu);
    s->stats.accepted++;
    uint32_t n;
    struct conn *o = weakest_pending(s, c->peer, &n);
    if (n >= s->lim.max_per_peer) {
        s->stats.evicted++;
        conn_close(o);
    } else if (s->npending >= s->lim.max_pending && (o = weakest_pending(s, NULL, &n)) != NULL) {
        s->stats.evicted++;
        conn_close(o);
    }
    c->id = ++s->next_id ? s->next_id : ++s->next_id;
    c->order = ++s->order;
    c->deadline = wb_now_ns() + s->lim.handshake_ns;
    c->state = CS_NEGO;
    s->npending++;
    if (s->npending > s->stats.max_pending)
        s->stats.max_pending = s->npending;
    c->next = s->conns;
    s->conns = c;
    static const uint8_t sp[8] = {0, 'S', 'P', 0, 0, SP_REP0, 0, 0};
    struct txbuf *t = malloc(sizeof(*t) + sizeof(sp));
    if (t) {
        *t = (struct txbuf){.len = sizeof(sp)};
        memcpy(t->buf, sp, sizeof(sp));
        c->txq = c->txlast = t;
        c->ntx = 1;
        tx_start(c);
        c->phase = RX_SP;
        c->want = 8;
        rx_start(c);
    } else {
        conn_close(c);
    }
    pthread_mutex_unlock(&s->mu);
}

static void on_accept(void *arg)
{
    struct ctl_serve *s = arg;
    int rv = nng_aio_result(s->acc);
    if (rv == 0)
        conn_new(s, nng_aio_get_output(s->acc, 0));
    pthread_mutex_lock(&s->mu);
    bool go = !s->closing && rv != NNG_ECLOSED;
    pthread_mutex_unlock(&s->mu);
    if (rv && go)
        nng_msleep(10); /* out of descriptors, say: no busy loop */
    if (go)
        nng_stream_listener_accept(s->l, s->acc);
}

/* ---------------------------------------------------------------- the loop's side */

static void reap(struct ctl_serve *s)
{
    pthread_mutex_lock(&s->mu);
    struct conn *d = s->dead;
    s->dead = NULL;
    pthread_mutex_unlock(&s->mu);
    while (d) {
        struct conn *next = d->next;
        nng_aio_free(d->rx); /* waits for a callback still returning */
        nng_aio_free(d->tx);
        nng_stream_free(d->st);
        while (d->txq) {
            struct txbuf *t = d->txq;
            d->txq = t->next;
            free(t);
        }
        free(d->body);
        free(d);
        d = next;
    }
}

int ctl_serve_open(struct ctl_serve **out, const char *url, nng_tls_config *tls, const char *token,
                   const struct ctl_serve_limits *lim, char *why, size_t cap)
{
    struct ctl_serve *s = calloc(1, sizeof(*s));
    int rv;
    if (!s || !(s->token = strdup(token))) {
        free(s);
        return -ENOMEM;
    }
    s->lim = *lim;
    pthread_mutex_init(&s->mu, NULL);
    if (pipe2(s->pfd, O_NONBLOCK | O_CLOEXEC) != 0) {
        snprintf(why, cap, "a pipe: %s", strerror(errno));
        rv = -errno;
        goto err_free;
    }
    if ((rv = nng_stream_listener_alloc(&s->l, url)) != 0 ||
        (tls && (rv = nng_stream_listener_set_ptr(s->l, NNG_OPT_TLS_CONFIG, tls)) != 0) ||
        (rv = nng_stream_listener_listen(s->l)) != 0 ||
        (rv = nng_aio_alloc(&s->acc, on_accept, s)) != 0) {
        snprintf(why, cap, "%s", nng_strerror(rv));
        rv = rv == NNG_EADDRINUSE ? -EADDRINUSE : -EINVAL;
        goto err_listener;
    }
    nng_stream_listener_accept(s->l, s->acc);
    *out = s;
    return 0;

err_listener:
    nng_stream_listener_free(s->l);
    close(s->pfd[0]);
    close(s->pfd[1]);
err_free:
    pthread_mutex_destroy(&s->mu);
    free(s->token);
    free(s);
    return rv;
}

int ctl_serve_fd(const struct ctl_serve *s)
{
    return s->pfd[0];
}

nng_msg *ctl_serve_recv(struct ctl_serve *s)
{
    nng_msg *m = NULL;
    pthread_mutex_lock(&s->mu);
    if (s->qn) {
        m = s->q[s->qhead];
        s->qhead = (s->qhead + 1) % s->qcap;
        s->qn--;
    }
    if (!s->qn && s->signalled) {
        char b[16];
        while (read(s->pfd[0], b, sizeof(b)) > 0)
            ;
        s->signalled = false;
    }
    pthread_mutex_unlock(&s->mu);
    return m;
}

int ctl_serve_send(struct ctl_serve *s, nng_msg *m)
{
    uint32_t id = (uint32_t)nng_pipe_id(nng_msg_get_pipe(m));
    int err = -ENOTCONN;
    if (nng_msg_header_len(m) != 4) {
        nng_msg_free(m);
        return -EINVAL;
    }
    pthread_mutex_lock(&s->mu);
    for (struct conn *c = s->conns; c; c = c->next)
        if (c->id == id) {
            if (c->state == CS_HELD)
                err = conn_send(c, nng_msg_header(m), nng_msg_body(m), nng_msg_len(m));
            break;
        }
    pthread_mutex_unlock(&s->mu);
    nng_msg_free(m);
    return err;
}

void ctl_serve_tick(struct ctl_serve *s, uint64_t now)
{
    pthread_mutex_lock(&s->mu);
    for (struct conn *c = s->conns, *next; c; c = next) {
        next = c->next;
        if (pending(c) && now >= c->deadline) {
            s->stats.expired++;
            conn_close(c);
            conn_maybe_dead(c);
        }
    }
    pthread_mutex_unlock(&s->mu);
    reap(s);
}

uint32_t ctl_serve_closed(struct ctl_serve *s, uint32_t *ids, uint32_t cap)
{
    pthread_mutex_lock(&s->mu);
    uint32_t n = s->nclosed < cap ? s->nclosed : cap;
    memcpy(ids, s->closed, n * sizeof(*ids));
    memmove(s->closed, s->closed + n, (s->nclosed - n) * sizeof(*ids));
    s->nclosed -= n;
    pthread_mutex_unlock(&s->mu);
    return n;
}

void ctl_serve_stats(struct ctl_serve *s, struct wb_conn_stats *out)
{
    pthread_mutex_lock(&s->mu);
    *out = s->stats;
    out->pending = s->npending;
    pthread_mutex_unlock(&s->mu);
}

void ctl_serve_close(struct ctl_serve *s)
{
    if (!s)
        return;
    pthread_mutex_lock(&s->mu);
    s->closing = true;
    pthread_mutex_unlock(&s->mu);
    nng_stream_listener_close(s->l);
    nng_aio_stop(s->acc);
    for (;;) {
        pthread_mutex_lock(&s->mu);
        for (struct conn *c = s->conns, *next; c; c = next) {
            next = c->next;
            conn_close(c);
            conn_maybe_dead(c);
        }
        bool empty = !s->conns;
        pthread_mutex_unlock(&s->mu);
        reap(s);
        if (empty)
            break;
        nng_msleep(1); /* the closed streams' operations are ending */
    }
    nng_aio_free(s->acc);
    nng_stream_listener_free(s->l);
    for (size_t i = 0; i < s->qn; i++)
        nng_msg_free(s->q[(s->qhead + i) % s->qcap]);
    free(s->q);
    close(s->pfd[0]);
    close(s->pfd[1]);
    pthread_mutex_destroy(&s->mu);
    free(s->token);
    free(s);
}
