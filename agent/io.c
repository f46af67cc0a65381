/* io.c — a sourced trainer's reads (wb_endpoint_set_source), on I/O threads of their own.
 *
 * The executor's loop never blocks (heartbeats, transport progress and every other task go
 * through it), while a read from storage takes as long as the storage needs: so each H2D op of
 * a sourced shard becomes a request queued here, read by one of the source's threads straight
 * into the task's temporary memory, and the task polls for it. Reads of later tasks proceed
 * while earlier tasks' writes are in flight, which is how a broadcast keeps both the storage
 * and the network busy. Requests are served first-in first-out: tasks start in table order, so
 * the files are read in the order the plan lists them. */
#include "agent/xfer.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct io_thread {
    struct ag_io *io;
    uint32_t index;
    pthread_t th;
};

struct ag_io {
    struct wb_endpoint_source src;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct ag_io_req *head, *tail; /* queued, not started */
    uint32_t queued, running;
    bool stop;
    uint32_t nthreads;
    struct io_thread *threads;
};

static void finish(struct ag_io_req *r, int rc)
{
    r->rc = rc;
    __atomic_store_n(&r->state, AG_IO_DONE, __ATOMIC_RELEASE);
}

static void *io_main(void *arg)
{
    struct io_thread *t = arg;
    struct ag_io *io = t->io;
    pthread_mutex_lock(&io->mu);
    for (;;) {
        while (!io->head && !io->stop)
            pthread_cond_wait(&io->cv, &io->mu);
        if (!io->head) /* stopping, nothing left */
            break;
        struct ag_io_req *r = io->head;
        io->head = r->next;
        if (!io->head)
            io->tail = NULL;
        io->queued--;
        io->running++;
        pthread_mutex_unlock(&io->mu);
        r->msg[0] = 0;
        int rc = io->src.read(io->src.arg, t->index, r->index, r->off, r->len, r->dst, r->msg,
                              sizeof(r->msg));
        if (rc && !r->msg[0])
            snprintf(r->msg, sizeof(r->msg), "%s", wb_strerror(rc));
        pthread_mutex_lock(&io->mu);
        io->running--;
        finish(r, rc);
        pthread_cond_broadcast(&io->cv);
    }
    pthread_mutex_unlock(&io->mu);
    return NULL;
}

int ag_io_open(const struct wb_endpoint_source *src, struct ag_io **out)
{
    struct ag_io *io = calloc(1, sizeof(*io));
    if (!io)
        return -ENOMEM;
    io->src = *src;
    io->nthreads = src->threads ? src->threads : 1;
    io->threads = calloc(io->nthreads, sizeof(*io->threads));
    if (!io->threads) {
        free(io);
        return -ENOMEM;
    }
    pthread_mutex_init(&io->mu, NULL);
    pthread_cond_init(&io->cv, NULL);
    uint32_t started = 0;
    for (; started < io->nthreads; started++) {
        io->threads[started] = (struct io_thread){io, started, 0};
        if (pthread_create(&io->threads[started].th, NULL, io_main, &io->threads[started]))
            break;
    }
    io->nthreads = started;
    if (!started) {
        ag_io_close(io);
        return -EAGAIN;
    }
    *out = io;
    return 0;
}

void ag_io_submit(struct ag_io *io, struct ag_io_req *r)
{
    r->next = NULL;
    r->rc = 0;
    __atomic_store_n(&r->state, AG_IO_QUEUED, __ATOMIC_RELAXED);
    pthread_mutex_lock(&io->mu);
    if (io->tail)
        io->tail->next = r;
    else
        io->head = r;
    io->tail = r;
    io->queued++;
    pthread_cond_signal(&io->cv);
    pthread_mutex_unlock(&io->mu);
}

bool ag_io_done(const struct ag_io_req *r)
{
    return __atomic_load_n(&r->state, __ATOMIC_ACQUIRE) == AG_IO_DONE;
}

void ag_io_cancel(struct ag_io *io)
{
    pthread_mutex_lock(&io->mu);
    for (struct ag_io_req *r = io->head; r;) {
        struct ag_io_req *next = r->next;
        snprintf(r->msg, sizeof(r->msg), "cancelled");
        finish(r, -ECANCELED);
        r = next;
    }
    io->head = io->tail = NULL;
    io->queued = 0;
    pthread_mutex_unlock(&io->mu);
}

uint32_t ag_io_busy(struct ag_io *io)
{
    pthread_mutex_lock(&io->mu);
    uint32_t n = io->queued + io->running;
    pthread_mutex_unlock(&io->mu);
    return n;
}

void ag_io_close(struct ag_io *io)
{
    if (!io)
        return;
    ag_io_cancel(io);
    pthread_mutex_lock(&io->mu);
    io->stop = true;
    pthread_cond_broadcast(&io->cv);
    pthread_mutex_unlock(&io->mu);
    for (uint32_t i = 0; i < io->nthreads; i++)
        pthread_join(io->threads[i].th, NULL);
    pthread_cond_destroy(&io->cv);
    pthread_mutex_destroy(&io->mu);
    free(io->threads);
    free(io);
}
