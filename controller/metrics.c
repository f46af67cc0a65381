/* metrics.c — the opt-in Prometheus endpoint (job key metrics: HOST:PORT): a thread of its own
 * serves `GET /metrics` over plain sockets (HTTP/1.0 style: one request per connection, then
 * close) from the last text the controller's loop published.
 *
 * The loop never waits for a scraper: it renders the text itself (it owns the state) and swaps
 * it in under a mutex that the server holds only to copy it. The server bounds what a stranger
 * can cost: at most METRICS_CONNS connections at once (a newer one closes the oldest), a request
 * head of at most METRICS_REQ_MAX bytes, and METRICS_IDLE_MS for the whole exchange. */
#include "controller/ctl.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

enum { METRICS_CONNS = 16, METRICS_REQ_MAX = 4096, METRICS_IDLE_MS = 5000 };

struct mconn {
    int fd; /* -1: free */
    uint64_t t0;
    size_t got;
    char req[METRICS_REQ_MAX + 1];
    char *out; /* the response being written (malloc'd), NULL while reading */
    size_t outlen, sent;
};

struct ctl_metrics {
    int lfd;
    int wake[2]; /* a byte on wake[1] ends the thread */
    pthread_t th;
    pthread_mutex_t mu;
    char *text; /* the last published exposition */
    size_t len;
    struct mconn conns[METRICS_CONNS];
};

int ctl_metrics_addr(const char *s, struct sockaddr_storage *ss, unsigned *sslen, char *why,
                     size_t cap)
{
    const char *colon = strrchr(s, ':');
    char host[64];
    memset(ss, 0, sizeof(*ss));
    if (!colon || colon == s || (size_t)(colon - s) >= sizeof(host)) {
        snprintf(why, cap, "'%s' is not HOST:PORT (an IP address and a port, 127.0.0.1:9420)", s);
        return -EINVAL;
    }
    memcpy(host, s, (size_t)(colon - s));
    host[colon - s] = 0;
    char *end;
    errno = 0;
    unsigned long port = strtoul(colon + 1, &end, 10);
    if (!colon[1] || *end || errno || port > 65535 || colon[1] == '-' || colon[1] == '+') {
        snprintf(why, cap, "'%s': port '%s' is not a number from 0 to 65535", s, colon + 1);
        return -EINVAL;
    }
    struct sockaddr_in *a4 = (struct sockaddr_in *)ss;
    struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)ss;
    size_t hl = strlen(host);
    if (inet_pton(AF_INET, host, &a4->sin_addr) == 1) {
        a4->sin_family = AF_INET;
        a4->sin_port = htons((uint16_t)port);
        *sslen = sizeof(*a4);
        return 0;
    }
    if (hl > 2 && host[0] == '[' && host[hl - 1] == ']') {
        host[hl - 1] = 0;
        if (inet_pton(AF_INET6, host + 1, &a6->sin6_addr) == 1) {
            a6->sin6_family = AF_INET6;
            a6->sin6_port = htons((uint16_t)port);
            *sslen = sizeof(*a6);
            return 0;
        }
        host[hl - 1] = ']';
    }
    snprintf(why, cap, "'%s': host '%s' is not an IP address (127.0.0.1, [::1], 0.0.0.0)", s, host);
    return -EINVAL;
}

static void conn_close(struct mconn *k)
{
    if (k->fd >= 0)
        close(k->fd);
    free(k->out);
    k->fd = -1;
    k->out = NULL;
}

static void respond(struct ctl_metrics *m, struct mconn *k, int code, const char *reason,
                    const char *ctype, const char *body, size_t blen)
{
    char head[256];
    int hn = snprintf(head, sizeof(head),
                      "HTTP/1.0 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n"
                      "Connection: close\r\n\r\n",
                      code, reason, ctype, blen);
    (void)m;
    k->out = malloc((size_t)hn + blen);
    if (!k->out) {
        conn_close(k);
        return;
    }
    memcpy(k->out, head, (size_t)hn);
    memcpy(k->out + hn, body, blen);
    k->outlen = (size_t)hn + blen;
    k->sent = 0;
}

static void respond_text(struct ctl_metrics *m, struct mconn *k, int code, const char *reason)
{
    char body[80];
    int n = snprintf(body, sizeof(body), "%d %s\n", code, reason);
    respond(m, k, code, reason, "text/plain; charset=utf-8", body, (size_t)n);
}

/* A whole request head is in k->req: answer it. Only the request line matters. */
static void handle(struct ctl_metrics *m, struct mconn *k)
{
    char *eol = strpbrk(k->req, "\r\n");
    if (eol)
        *eol = 0;
    char method[16], path[256], ver[16], extra;
    int n = sscanf(k->req, "%15s %255s %15s %c", method, path, ver, &extra);
    if (n != 3 || strncmp(ver, "HTTP/1.", 7) != 0 || (ver[7] != '0' && ver[7] != '1') || ver[8]) {
        respond_text(m, k, 400, "Bad Request");
        return;
    }
    if (strcmp(method, "GET") != 0) {
        respond_text(m, k, 405, "Method Not Allowed");
        return;
    }
    char *q = strchr(path, '?');
    if (q)
        *q = 0;
    if (strcmp(path, "/metrics") != 0) {
        respond_text(m, k, 404, "Not Found");
        return;
    }
    pthread_mutex_lock(&m->mu);
    size_t len = m->len;
    char *copy = malloc(len ? len : 1);
    if (copy)
        memcpy(copy, m->text ? m->text : "", len);
    pthread_mutex_unlock(&m->mu);
    if (!copy) {
        respond_text(m, k, 503, "Service Unavailable");
        return;
    }
    respond(m, k, 200, "OK", "text/plain; version=0.0.4; charset=utf-8", copy, len);
    free(copy);
}

static void on_readable(struct ctl_metrics *m, struct mconn *k)
{
    ssize_t n = read(k->fd, k->req + k->got, METRICS_REQ_MAX - k->got);
    if (n <= 0) {
        if (n == 0 || (errno != EAGAIN && errno != EINTR))
            conn_close(k);
        return;
    }
    k->got += (size_t)n;
    k->req[k->got] = 0;
    if (strstr(k->req, "\r\n\r\n") || strstr(k->req, "\n\n")) {
        handle(m, k);
    } else if (memchr(k->req, 0, k->got)) {
        respond_text(m, k, 400, "Bad Request");
    } else if (k->got == METRICS_REQ_MAX) {
        respond_text(m, k, 431, "Request Header Fields Too Large");
    }
}

static void on_writable(struct mconn *k)
{
    ssize_t n = send(k->fd, k->out + k->sent, k->outlen - k->sent, MSG_NOSIGNAL);
    if (n < 0 && (errno == EAGAIN || errno == EINTR))
        return;
    if (n <= 0) {
        conn_close(k);
        return;
    }
    k->sent += (size_t)n;
    if (k->sent == k->outlen) {
        shutdown(k->fd, SHUT_WR);
        conn_close(k);
    }
}

static void on_accept(struct ctl_metrics *m, uint64_t now)
{
    for (;;) {
        int fd = accept4(m->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0)
            return;
        struct mconn *k = NULL, *oldest = &m->conns[0];
        for (size_t i = 0; i < METRICS_CONNS && !k; i++) {
            if (m->conns[i].fd < 0)
                k = &m->conns[i];
            else if (m->conns[i].t0 < oldest->t0)
                oldest = &m->conns[i];
        }
        if (!k) { /* full: the oldest goes, so that idle strangers cannot lock scrapers out */
            conn_close(oldest);
            k = oldest;
        }
        k->fd = fd;
        k->t0 = now;
        k->got = 0;
        k->req[0] = 0;
    }
}

static void *serve(void *arg)
{
    struct ctl_metrics *m = arg;
    for (;;) {
        struct pollfd p[METRICS_CONNS + 2];
        int idx[METRICS_CONNS];
        nfds_t np = 0;
        p[np++] = (struct pollfd){.fd = m->wake[0], .events = POLLIN};
        p[np++] = (struct pollfd){.fd = m->lfd, .events = POLLIN};
        for (int i = 0; i < METRICS_CONNS; i++)
            if (m->conns[i].fd >= 0) {
                idx[np - 2] = i;
                p[np++] = (struct pollfd){.fd = m->conns[i].fd,
                                          .events = m->conns[i].out ? POLLOUT : POLLIN};
            }
        poll(p, np, 250);
        if (p[0].revents)
            return NULL;
        uint64_t now = wb_now_ns();
        for (nfds_t j = 2; j < np; j++) {
            struct mconn *k = &m->conns[idx[j - 2]];
            if (p[j].revents & (POLLIN | POLLHUP | POLLERR) && !k->out)
                on_readable(m, k);
            if (k->fd >= 0 && k->out && p[j].revents & (POLLOUT | POLLHUP | POLLERR))
                on_writable(k);
        }
        for (int i = 0; i < METRICS_CONNS; i++)
            if (m->conns[i].fd >= 0 && now - m->conns[i].t0 > METRICS_IDLE_MS * 1000000ull)
                conn_close(&m->conns[i]);
        if (p[1].revents & POLLIN)
            on_accept(m, now);
    }
}

int ctl_metrics_open(struct ctl_metrics **out, const char *addr, char *why, size_t cap)
{
    struct sockaddr_storage ss;
    unsigned sslen;
    int err = ctl_metrics_addr(addr, &ss, &sslen, why, cap);
    if (err)
        return err;
    struct ctl_metrics *m = calloc(1, sizeof(*m));
    if (!m)
        return -ENOMEM;
    for (int i = 0; i < METRICS_CONNS; i++)
        m->conns[i].fd = -1;
    m->wake[0] = m->wake[1] = -1;
    int one = 1;
    m->lfd = socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (m->lfd < 0 || setsockopt(m->lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) != 0 ||
        bind(m->lfd, (struct sockaddr *)&ss, sslen) != 0 || listen(m->lfd, 16) != 0) {
        err = -errno;
        snprintf(why, cap, "metrics: cannot listen on %s: %s", addr, strerror(errno));
        goto err_close;
    }
    if (pipe2(m->wake, O_CLOEXEC) != 0) {
        err = -errno;
        snprintf(why, cap, "metrics: %s", strerror(errno));
        goto err_close;
    }
    pthread_mutex_init(&m->mu, NULL);
    if ((err = pthread_create(&m->th, NULL, serve, m)) != 0) {
        snprintf(why, cap, "metrics: cannot start its thread: %s", strerror(err));
        err = -err;
        pthread_mutex_destroy(&m->mu);
        goto err_close;
    }
    *out = m;
    return 0;

err_close:
    if (m->lfd >= 0)
        close(m->lfd);
    if (m->wake[0] >= 0) {
        close(m->wake[0]);
        close(m->wake[1]);
    }
    free(m);
    return err;
}

unsigned ctl_metrics_port(const struct ctl_metrics *m)
{
    struct sockaddr_storage ss;
    socklen_t len = sizeof(ss);
    if (getsockname(m->lfd, (struct sockaddr *)&ss, &len) != 0)
        return 0;
    return ss.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)&ss)->sin6_port)
                                    : ntohs(((struct sockaddr_in *)&ss)->sin_port);
}

void ctl_metrics_publish(struct ctl_metrics *m, char *text, size_t len)
{
    pthread_mutex_lock(&m->mu);
    char *old = m->text;
    m->text = text;
    m->len = len;
    pthread_mutex_unlock(&m->mu);
    free(old);
}

void ctl_metrics_close(struct ctl_metrics *m)
{
    if (!m)
        return;
    ssize_t n = write(m->wake[1], "x", 1);
    (void)n;
    pthread_join(m->th, NULL);
    for (int i = 0; i < METRICS_CONNS; i++)
        conn_close(&m->conns[i]);
    close(m->lfd);
    close(m->wake[0]);
    close(m->wake[1]);
    pthread_mutex_destroy(&m->mu);
    free(m->text);
    free(m);
}
