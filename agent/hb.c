/* hb.c — the endpoint's heartbeats. They go out from a thread of their own on a channel of their
 * own, so that no work of the loop (a setup registering gigabytes, a step slowed by CPU
 * pressure) delays them and gets a live process declared dead. The loop keeps the next beat
 * current (ag_hb_update) and learns from the same call what the beats heard; news it must act
 * on at once (the session lost, the job ending) wakes it through its wake-up eventfd. */
#include "agent/priv.h"

#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

struct ag_hb {
    const char *token; /* the endpoint's */
    int wake_fd;       /* the loop's */
    pthread_t thread;
    struct wb_chan chan;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct wb_body_heartbeat beat; /* under mu: the next heartbeat (session 0: none yet) */
    uint64_t period, wait;         /* under mu: heartbeat period, time to wait for a reply */
    uint64_t loop_sent_ns;         /* under mu: when the loop last sent the controller a request */
    uint64_t heard;                /* under mu: when the last heartbeat was answered */
    uint64_t lost;                 /* under mu: a session the controller said it lost */
    bool ended;                    /* under mu: the controller said the job is shutting down */
    bool quit;                     /* under mu */
};

static void wake(struct ag_hb *hb)
{
    uint64_t one = 1;
    if (write(hb->wake_fd, &one, sizeof(one)) < 0) { /* full: a wake-up is pending anyway */
    }
}

static bool hb_quitting(struct ag_hb *hb)
{
    pthread_mutex_lock(&hb->mu);
    bool q = hb->quit;
    pthread_mutex_unlock(&hb->mu);
    return q;
}

/* One heartbeat and its reply (0), in at most `wait` ns; given up at once when the loop ends. */
static int hb_call(struct ag_hb *hb, const struct wb_mpw *w, uint64_t wait, void **buf, size_t *len)
{
    uint64_t deadline = wb_now_ns() + wait;
    int rc = wb_chan_send(&hb->chan, w); /* EAGAIN: no connection (yet); the next beat tries */
    while (rc == 0 && (rc = wb_chan_try_recv(&hb->chan, buf, len)) == 0) {
        if (wb_now_ns() >= deadline || hb_quitting(hb))
            return -ETIMEDOUT;
        struct pollfd p = {.fd = hb->chan.fd, .events = POLLIN};
        poll(&p, 1, 20);
    }
    return rc < 0 ? rc : 0;
}

/* Two beats say the same (the session and every figure). */
static bool same_beat(const struct wb_body_heartbeat *a, const struct wb_body_heartbeat *b)
{
    return a->s.session == b->s.session && a->version == b->version &&
           a->in_flight == b->in_flight && a->done == b->done && a->total == b->total &&
           a->epoch == b->epoch && a->torn == b->torn && a->dropped == b->dropped &&
           a->commits == b->commits;
}

static void *hb_main(void *arg)
{
    struct ag_hb *hb = arg;
    struct wb_body_heartbeat sent = {0}; /* the last beat sent */
    pthread_mutex_lock(&hb->mu);
    while (!hb->quit) {
        struct timespec dl;
        clock_gettime(CLOCK_MONOTONIC, &dl);
        uint64_t ns = (uint64_t)dl.tv_nsec + hb->period;
        dl.tv_sec += (time_t)(ns / 1000000000ull);
        dl.tv_nsec = (long)(ns % 1000000000ull);
        while (!hb->quit && pthread_cond_timedwait(&hb->cv, &hb->mu, &dl) != ETIMEDOUT)
            ;
        if (hb->quit || !hb->beat.s.session)
            continue;
        struct wb_body_heartbeat b = hb->beat;
        uint64_t wait = hb->wait;
        /* The controller hears an agent on any request (an idle loop's poll goes out every
         * poll_hold). A beat that would say nothing new while the loop's requests flow is
         * skipped: an idle agent costs its polls only. Once the loop stops sending (blocked,
         * starved, stuck), the beats come again within three periods. */
        if (same_beat(&b, &sent) && wb_now_ns() - hb->loop_sent_ns < 3 * hb->period)
            continue;
        pthread_mutex_unlock(&hb->mu);
        struct wb_mpw w;
        void *buf = NULL;
        size_t len = 0;
        uint64_t heard = 0, lost = 0;
        bool ended = false;
        wb_mpw_init(&w);
        wb_msg_encode(&w, WB_MSG_HEARTBEAT, hb->token, &b);
        sent = b;
        if (hb_call(hb, &w, wait, &buf, &len) == 0) {
            struct wb_msg m;
            struct wb_body_error e;
            const char *why;
            char whybuf[64];
            if (wb_msg_open(buf, len, hb->token, &m, &why) == 0) {
                heard = wb_now_ns();
                if (m.type == WB_MSG_ERROR && wb_msg_decode(&m, &e, whybuf, sizeof(whybuf)) == 0) {
                    if (e.code == -WB_E_PEER)
                        lost = b.s.session;
                    else if (e.code == -WB_E_ENDED)
                        ended = true;
                }
            }
            wb_chan_free(buf);
        }
        wb_mpw_free(&w);
        pthread_mutex_lock(&hb->mu);
        if (heard)
            hb->heard = heard;
        if (lost)
            hb->lost = lost;
        if (ended)
            hb->ended = true;
        if (lost || ended) /* the loop acts on it now, not when it next wakes */
            wake(hb);
    }
    pthread_mutex_unlock(&hb->mu);
    return NULL;
}

int ag_hb_start(const char *controller, const char *token, uint64_t period_ns, int wake_fd,
                struct ag_hb **out)
{
    *out = NULL;
    struct ag_hb *hb = calloc(1, sizeof(*hb));
    if (!hb)
        return -ENOMEM;
    hb->token = token;
    hb->wake_fd = wake_fd;
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_mutex_init(&hb->mu, NULL);
    pthread_cond_init(&hb->cv, &ca);
    pthread_condattr_destroy(&ca);
    hb->period = hb->wait = period_ns;
    int rc = wb_chan_open(&hb->chan, controller, token);
    if (rc == 0 && (rc = -pthread_create(&hb->thread, NULL, hb_main, hb)) != 0)
        wb_chan_close(&hb->chan);
    if (rc) {
        pthread_cond_destroy(&hb->cv);
        pthread_mutex_destroy(&hb->mu);
        free(hb);
        return rc;
    }
    *out = hb;
    return 0;
}

void ag_hb_stop(struct ag_hb *hb)
{
    if (!hb)
        return;
    pthread_mutex_lock(&hb->mu);
    hb->quit = true;
    pthread_cond_broadcast(&hb->cv);
    pthread_mutex_unlock(&hb->mu);
    pthread_join(hb->thread, NULL); /* a call in flight gives up within 20 ms */
    wb_chan_close(&hb->chan);
    pthread_cond_destroy(&hb->cv);
    pthread_mutex_destroy(&hb->mu);
    free(hb);
}

void ag_hb_update(struct ag_hb *hb, const struct wb_body_heartbeat *b, uint64_t loop_sent_ns,
                  uint64_t period_ns, struct ag_hb_news *news)
{
    *news = (struct ag_hb_news){0};
    if (!hb)
        return;
    pthread_mutex_lock(&hb->mu);
    hb->beat = *b;
    hb->loop_sent_ns = loop_sent_ns;
    /* A beat waits for its answer at most until the next is due: the beats keep their pace
     * whatever the controller's, so a slow answer never makes this agent look silent. */
    hb->period = hb->wait = period_ns;
    news->heard = hb->heard;
    news->lost = hb->lost;
    news->ended = hb->ended;
    hb->lost = 0;
    pthread_mutex_unlock(&hb->mu);
}

bool ag_hb_connected(const struct ag_hb *hb)
{
    return hb && wb_chan_connected(&hb->chan);
}
