/* chan.c — the nng request channel agents and clients reach the controller through: a REQ
 * socket used one request at a time, non-blocking (send, then poll for the reply) or as a
 * blocking call with a time limit. It introduces each connection (HELLO, proto.h) and binds
 * every request to it, so a request captured on the wire is refused on any other connection
 * and again on its own. */
#include "proto/proto.h"

#include <errno.h>
#include <nng/nng.h>
#include <nng/protocol/reqrep0/req.h>
#include <nng/supplemental/tls/tls.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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
    case NNG_EINVAL: /* a malformed argument: a URL without a scheme, say */
        return -EINVAL;
    case NNG_ECONNSHUT: /* the peer closed it: refused at its connection limit, say */
    case NNG_ECONNRESET:
        return -ECONNRESET;
    default:
        return -EIO;
    }
}

/* A tls+tcp:// controller: its certificate must be signed by the CA in $WB_TLS_CA (PEM) and
 * name $WB_TLS_SERVER_NAME, or else the URL's host — always one of them: without a name to
 * check, any certificate the CA ever signed would pass for the controller (and collect the
 * token from the first message). mbedtls compares the name with the certificate's DNS names
 * and its common name, as text (an IP address too; it does not read iPAddress entries). One
 * dial is tried at once, so that a certificate that does not verify is an error here rather
 * than endless silent retries; a controller not listening yet is dialled again in the
 * background as over tcp. */
static int dial_tls(nng_socket s, const char *url)
{
    const char *ca = getenv("WB_TLS_CA"), *env = getenv("WB_TLS_SERVER_NAME");
    char name[256] = "";
    if (!ca || !*ca) {
        wb_log(WB_LOG_ERROR, "chan",
               "%s: a tls+tcp:// controller needs $WB_TLS_CA, the PEM file of the CA that signed "
               "its certificate",
               url);
        return -WB_E_CONFIG;
    }
    if (env && *env) {
        snprintf(name, sizeof(name), "%s", env);
    } else {
        nng_url *u = NULL;
        if (nng_url_parse(&u, url) == 0 && u->u_hostname)
            snprintf(name, sizeof(name), "%s", u->u_hostname);
        if (u)
            nng_url_free(u);
    }
    if (!*name) {
        wb_log(WB_LOG_ERROR, "chan",
               "%s: names no host to check the controller's certificate against: set "
               "$WB_TLS_SERVER_NAME to the name its certificate carries",
               url);
        return -WB_E_CONFIG;
    }
    nng_tls_config *cfg;
    int rv = nng_tls_config_alloc(&cfg, NNG_TLS_MODE_CLIENT);
    if (rv)
        return nng_err(rv);
    rv = nng_tls_config_ca_file(cfg, ca);
    if (rv) {
        wb_log(WB_LOG_ERROR, "chan", "WB_TLS_CA %s: cannot load a CA certificate: %s", ca,
               nng_strerror(rv));
        nng_tls_config_free(cfg);
        return -WB_E_CONFIG;
    }
    nng_tls_config_auth_mode(cfg, NNG_TLS_AUTH_MODE_REQUIRED);
    if ((rv = nng_tls_config_server_name(cfg, name)) != 0) {
        nng_tls_config_free(cfg);
        return nng_err(rv);
    }
    for (int at_once = 1; at_once >= 0; at_once--) {
        nng_dialer d;
        rv = nng_dialer_create(&d, s, url);
        rv = rv ? rv : nng_dialer_set_ptr(d, NNG_OPT_TLS_CONFIG, cfg);
        rv = rv ? rv : nng_dialer_start(d, at_once ? 0 : NNG_FLAG_NONBLOCK);
        if (rv == 0 || !at_once)
            break;
        nng_dialer_close(d);
        if (rv == NNG_ECRYPTO || rv == NNG_EPEERAUTH) {
            wb_log(WB_LOG_ERROR, "chan",
                   "%s: the controller's certificate does not verify against WB_TLS_CA %s for the "
                   "name %s%s: %s",
                   url, ca, name, env && *env ? " ($WB_TLS_SERVER_NAME)" : " (the URL's host)",
                   nng_strerror(rv));
            break;
        }
    }
    nng_tls_config_free(cfg); /* the dialer holds its own reference */
    if (rv == NNG_ECRYPTO || rv == NNG_EPEERAUTH)
        return -EACCES;
    return rv == NNG_EADDRINVAL || rv == NNG_ENOTSUP ? -EINVAL : nng_err(rv);
}

/* What the channel keeps beyond the public struct: the token its HELLO carries, the nonce its
 * connection was given, and the request in flight (sent again after a new HELLO). */
struct wb_chan_state {
    char *token;
    uint64_t nonce;        /* 0: the connection is not introduced (yet) */
    uint32_t nonce_closed; /* connections closed when the nonce came: another closed since, it
                              belongs to a connection that is gone */
    uint64_t seq;          /* the last binding sequence number sent */
    uint8_t *req;          /* the request in flight, as the caller gave it */
    size_t req_len;
    bool hello;       /* the HELLO is what is outstanding; req goes once it is answered */
    bool lost;        /* nothing is outstanding (a send after an own reply failed): the
                         caller's request times out as a lost one */
    unsigned rehello; /* HELLOs sent again for the request in flight */
    bool hello_due;   /* a HELLO to send again could not go yet (no connection: the controller
                         restarting): sent by the next wb_chan_try_recv that can */
};

/* The channel's connections as nng's pipe callbacks see them. A pipe's removal is reported
 * once its addition began (ADD_PRE), whether or not it was ever fully added, so the two pair. */
struct wb_chan_pipes {
    _Atomic uint32_t up;     /* connections held now */
    _Atomic uint32_t closed; /* connections closed so far */
};

static void on_pipe(nng_pipe p, nng_pipe_ev ev, void *arg)
{
    struct wb_chan_pipes *cp = arg;
    (void)p;
    if (ev == NNG_PIPE_EV_ADD_PRE) {
        atomic_fetch_add(&cp->up, 1);
    } else {
        atomic_fetch_sub(&cp->up, 1);
        atomic_fetch_add(&cp->closed, 1);
    }
}

static void chan_state_free(struct wb_chan_state *st)
{
    if (st) {
        free(st->token);
        free(st->req);
        free(st);
    }
}

int wb_chan_open(struct wb_chan *c, const char *url, const char *token)
{
    nng_socket s;
    struct wb_chan_state *st = calloc(1, sizeof(*st));
    struct wb_chan_pipes *cp = calloc(1, sizeof(*cp));
    if (!st || !cp || !(st->token = strdup(token ? token : ""))) {
        free(st);
        free(cp);
        return -ENOMEM;
    }
    int fd, rv = nng_req0_open(&s);
    if (rv) {
        chan_state_free(st);
        free(cp);
        return nng_err(rv);
    }
    nng_pipe_notify(s, NNG_PIPE_EV_ADD_PRE, on_pipe, cp);
    nng_pipe_notify(s, NNG_PIPE_EV_REM_POST, on_pipe, cp);
    /* Resending would duplicate registers and reports at the controller: the agent resends
     * itself, knowing what is idempotent. */
    nng_socket_set_ms(s, NNG_OPT_REQ_RESENDTIME, NNG_DURATION_INFINITE);
    nng_socket_set_size(s, NNG_OPT_RECVMAXSZ, CHAN_MAX_MSG);
    nng_socket_set_ms(s, NNG_OPT_RECONNMINT, 20);
    nng_socket_set_ms(s, NNG_OPT_RECONNMAXT, 200);
    nng_socket_set_ms(s, NNG_OPT_SENDTIMEO, 200); /* send_raw's waiting sends */
    if (strncmp(url, "tls+tcp://", 10) == 0) {
        int err = dial_tls(s, url);
        if (err) {
            nng_close(s);
            chan_state_free(st);
            free(cp);
            return err;
        }
        rv = 0;
    } else {
        rv = nng_dial(s, url, NULL, NNG_FLAG_NONBLOCK);
    }
    if (rv == 0)
        rv = nng_socket_get_int(s, NNG_OPT_RECVFD, &fd);
    if (rv) {
        nng_close(s);
        chan_state_free(st);
        free(cp);
        return rv == NNG_EADDRINVAL || rv == NNG_ENOTSUP ? -EINVAL : nng_err(rv);
    }
    *c = (struct wb_chan){.sock = s.id, .fd = fd, .st = st, .pipes = cp};
    return 0;
}

void wb_chan_close(struct wb_chan *c)
{
    if (c->sock) {
        nng_close((nng_socket){.id = c->sock}); /* no pipe callback runs after it */
        c->sock = 0;
    }
    chan_state_free(c->st);
    c->st = NULL;
    free(c->pipes);
    c->pipes = NULL;
}

/* Sends [head, p]: at once or -EAGAIN (the caller's own sends), or waiting up to the socket's
 * send time (200 ms) for the connection to take it — the sends that follow an answer the
 * channel consumed itself: nng may not have put the connection back in its ready list yet
 * when the answer is handed over (seen on a loaded machine), and the caller is not there to
 * try again. */
static int send_raw(struct wb_chan *c, const void *head, size_t hn, const void *p, size_t n,
                    bool wait)
{
    nng_msg *m;
    int rv = nng_msg_alloc(&m, 0);
    if (rv)
        return nng_err(rv);
    if ((hn && (rv = nng_msg_append(m, head, hn)) != 0) ||
        (n && (rv = nng_msg_append(m, p, n)) != 0) ||
        (rv = nng_sendmsg((nng_socket){.id = c->sock}, m, wait ? 0 : NNG_FLAG_NONBLOCK)) != 0) {
        nng_msg_free(m);
        return nng_err(rv);
    }
    return 0;
}

/* The HELLO that introduces the connection (the request waits in st->req). */
static int send_hello(struct wb_chan *c, bool wait)
{
    struct wb_mpw w;
    wb_mpw_init(&w);
    wb_msg_encode(&w, WB_MSG_HELLO, c->st->token, NULL);
    int err = w.err ? w.err : send_raw(c, NULL, 0, w.buf, w.len, wait);
    wb_mpw_free(&w);
    if (!err)
        c->st->hello = true;
    return err;
}

/* The request in flight behind the connection's binding prefix. */
static int send_bound(struct wb_chan *c, bool wait)
{
    uint8_t head[WB_BIND_LEN];
    wb_bind_put(head, c->st->nonce, ++c->st->seq);
    int err = send_raw(c, head, sizeof(head), c->st->req, c->st->req_len, wait);
    if (!err)
        c->st->hello = false;
    return err;
}

bool wb_chan_connected(const struct wb_chan *c)
{
    return c->pipes && atomic_load(&c->pipes->up) > 0;
}

bool wb_chan_lost(const struct wb_chan *c)
{
    return c->busy && c->pipes && atomic_load(&c->pipes->closed) != c->closed_at_send;
}

int wb_chan_send(struct wb_chan *c, const struct wb_mpw *w)
{
    struct wb_chan_state *st = c->st;
    if (w->err)
        return w->err;
    if (w->len > WB_CTL_MAX_MSG)
        return -EMSGSIZE;
    /* Read before the send: a connection that closes after it counts against this request. */
    uint32_t closed = c->pipes ? atomic_load(&c->pipes->closed) : 0;
    uint8_t *copy = malloc(w->len ? w->len : 1);
    if (!copy)
        return -ENOMEM;
    memcpy(copy, w->buf, w->len);
    free(st->req);
    st->req = copy;
    st->req_len = w->len;
    st->rehello = 0;
    st->lost = false;
    st->hello_due = false;
    if (st->nonce && closed != st->nonce_closed)
        st->nonce = 0; /* the connection it bound is gone: introduce the next one */
    int err = st->nonce ? send_bound(c, false) : send_hello(c, false);
    if (err) {
        free(st->req);
        st->req = NULL;
        return err;
    }
    c->busy = true;
    c->sent_ns = wb_now_ns();
    c->closed_at_send = closed;
    return 0;
}

/* A reply that the channel handles itself: HELLO's WELCOME (the request goes out now), or the
 * controller saying the request came on a connection it is not bound to (its connection was
 * replaced: introduce the new one, send again). True when consumed. */
static bool chan_own_reply(struct wb_chan *c, const void *buf, size_t len)
{
    struct wb_chan_state *st = c->st;
    struct wb_msg m;
    const char *why;
    char msg[WB_ERRMSG_MAX];
    if (!st->req || wb_msg_open(buf, len, st->token, &m, &why))
        return false;
    if (st->hello && m.type == WB_MSG_WELCOME) {
        struct wb_body_welcome b;
        if (wb_msg_decode(&m, &b, msg, sizeof(msg)) || !b.nonce)
            return false;
        st->nonce = b.nonce;
        st->nonce_closed = c->pipes ? atomic_load(&c->pipes->closed) : 0;
        st->seq = 0;
        if (send_bound(c, true)) { /* not sent: the request times out as any lost one */
            st->nonce = 0;
            st->lost = true;
        }
        return true;
    }
    if (!st->hello && m.type == WB_MSG_ERROR && st->rehello < 3) {
        struct wb_body_error e;
        if (wb_msg_decode(&m, &e, msg, sizeof(msg)) || e.code != -WB_E_HELLO)
            return false;
        st->nonce = 0;
        st->rehello++;
        st->hello_due = send_hello(c, false) != 0;
        return true;
    }
    return false;
}

int wb_chan_try_recv(struct wb_chan *c, void **buf, size_t *len)
{
    for (;;) {
        void *p;
        size_t n;
        if (c->st->lost)
            return 0;
        /* A HELLO that found no connection: the socket dials again by itself, and the request
         * goes out behind the HELLO once one exists (the caller's deadline bounds the wait). */
        if (c->st->hello_due && send_hello(c, false) != 0)
            return 0;
        c->st->hello_due = false;
        int rv = nng_recv((nng_socket){.id = c->sock}, &p, &n, NNG_FLAG_ALLOC | NNG_FLAG_NONBLOCK);
        if (rv == NNG_EAGAIN)
            return 0;
        /* The connection closed under a HELLO (a controller evicts connections that have not
         * introduced themselves when strangers crowd it): nothing of the request was seen,
         * so introduce the next connection (the socket dials again) a few times. */
        if ((rv == NNG_ECONNSHUT || rv == NNG_ECONNRESET) && c->st->hello && c->st->rehello < 8) {
            c->st->rehello++;
            c->st->hello_due = true; /* sent at the top of the loop, or on a later call */
            continue;
        }
        if (rv)
            return nng_err(rv);
        if (chan_own_reply(c, p, n)) {
            nng_free(p, n);
            continue;
        }
        c->busy = false;
        c->st->hello = false;
        *buf = p;
        *len = n;
        return 1;
    }
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
