/* chan.c — the nng request channel agents and clients reach the controller through: a REQ
 * socket used one request at a time, non-blocking (send, then poll for the reply) or as a
 * blocking call with a time limit. */
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
    case NNG_ECONNSHUT: /* the peer closed it: refused at its connection limit, say */
    case NNG_ECONNRESET:
        return -ECONNRESET;
    default:
        return -EIO;
    }
}

/* A tls+tcp:// controller: its certificate must be signed by the CA in $WB_TLS_CA (PEM) and
 * name $WB_TLS_SERVER_NAME, or else the URL's host. One dial is tried at once, so that a
 * certificate that does not verify is an error here rather than endless silent retries; a
 * controller not listening yet is dialled again in the background as over tcp. */
static int dial_tls(nng_socket s, const char *url)
{
    const char *ca = getenv("WB_TLS_CA"), *name = getenv("WB_TLS_SERVER_NAME");
    if (!ca || !*ca) {
        wb_log(WB_LOG_ERROR, "chan",
               "%s: a tls+tcp:// controller needs $WB_TLS_CA, the PEM file of the CA that signed "
               "its certificate",
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
    if (name && *name)
        nng_tls_config_server_name(cfg, name);
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
                   "%s: the controller's certificate does not verify against WB_TLS_CA %s%s%s: %s",
                   url, ca, name && *name ? " for the name " : "", name && *name ? name : "",
                   nng_strerror(rv));
            break;
        }
    }
    nng_tls_config_free(cfg); /* the dialer holds its own reference */
    if (rv == NNG_ECRYPTO || rv == NNG_EPEERAUTH)
        return -EACCES;
    return rv == NNG_EADDRINVAL || rv == NNG_ENOTSUP ? -EINVAL : nng_err(rv);
}

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

int wb_chan_open(struct wb_chan *c, const char *url)
{
    nng_socket s;
    struct wb_chan_pipes *cp = calloc(1, sizeof(*cp));
    if (!cp)
        return -ENOMEM;
    int fd, rv = nng_req0_open(&s);
    if (rv) {
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
    if (strncmp(url, "tls+tcp://", 10) == 0) {
        int err = dial_tls(s, url);
        if (err) {
            nng_close(s);
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
        free(cp);
        return rv == NNG_EADDRINVAL || rv == NNG_ENOTSUP ? -EINVAL : nng_err(rv);
    }
    *c = (struct wb_chan){.sock = s.id, .fd = fd, .pipes = cp};
    return 0;
}

void wb_chan_close(struct wb_chan *c)
{
    if (c->sock) {
        nng_close((nng_socket){.id = c->sock}); /* no pipe callback runs after it */
        c->sock = 0;
    }
    free(c->pipes);
    c->pipes = NULL;
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
    if (w->err)
        return w->err;
    if (w->len > WB_CTL_MAX_MSG)
        return -EMSGSIZE;
    /* Read before the send: a connection that closes after it counts against this request. */
    uint32_t closed = c->pipes ? atomic_load(&c->pipes->closed) : 0;
    int rv = nng_send((nng_socket){.id = c->sock}, w->buf, w->len, NNG_FLAG_NONBLOCK);
    if (rv)
        return nng_err(rv);
    c->busy = true;
    c->sent_ns = wb_now_ns();
    c->closed_at_send = closed;
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
