/* chan.c — the nng request channel agents and clients reach the controller through: a REQ
 * socket used one request at a time, non-blocking (send, then poll for the reply) or as a
 * blocking call with a time limit. */
#include "proto/proto.h"

#include <errno.h>
#include <nng/nng.h>
#include <nng/protocol/reqrep0/req.h>
#include <nng/supplemental/tls/tls.h>
#include <poll.h>
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
    if (strncmp(url, "tls+tcp://", 10) == 0) {
        int err = dial_tls(s, url);
        if (err) {
            nng_close(s);
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
    if (w->len > WB_CTL_MAX_MSG)
        return -EMSGSIZE;
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
