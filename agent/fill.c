/* fill.c — the synthetic "optimizer step": a version's weights in a synthetic trainer's shards,
 * from the synthetic source. It runs between transfers, never inside one: after a version is
 * sent the next one (version + 1) is filled at once, so a transfer of it starts from ready
 * shards; a transfer of another version waits for its fill (data.c decides which). Shards in
 * GPU memory are filled by the synthetic source's kernel on the executor's stream (an event
 * tells when); shards in host memory by a thread, so heartbeats and commands keep flowing while
 * gigabytes are generated. */
#include "agent/xfer.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct ag_fill {
    struct ag_fill_src src;
    /* the version the shards hold (0: none), and a fill under way (GPU: an event after its
     * kernels; host memory: a thread) for want, 0 when none */
    uint64_t have, want, t0;
    void *ev;
    pthread_t thread;
    bool thread_on;
    _Atomic int state; /* thread: 0 running, 1 done, negative errno */
    char err[256];
};

int ag_fill_new(const struct ag_fill_src *src, struct ag_fill **out)
{
    struct ag_fill *f = calloc(1, sizeof(*f));
    if (!f)
        return -ENOMEM;
    f->src = *src;
    *out = f;
    return 0;
}

uint64_t ag_fill_have(const struct ag_fill *f)
{
    return f->have;
}

uint64_t ag_fill_want(const struct ag_fill *f)
{
    return f->want;
}

uint64_t ag_fill_t0(const struct ag_fill *f)
{
    return f->t0;
}

struct fill_job {
    struct ag_fill *f;
    _Atomic uint32_t next;
    _Atomic int rc;
};

/* Shards in turn, until none is left or one failed (its name in f->err). */
static void *fill_worker(void *arg)
{
    struct fill_job *j = arg;
    struct ag_fill *f = j->f;
    for (;;) {
        uint32_t i = atomic_fetch_add(&j->next, 1);
        if (i >= f->src.nshards || atomic_load(&j->rc))
            return NULL;
        const struct shard *s = &f->src.shards[i];
        int rc =
            wb_synth_fill_change(s->meta.name, f->src.seed, f->want, f->src.change_period,
                                 s->meta.dtype, &s->meta.shape, &s->meta.box, f->src.host + s->off);
        int none = 0;
        if (rc && atomic_compare_exchange_strong(&j->rc, &none, rc))
            snprintf(f->err, sizeof(f->err), "%.200s: cannot generate %s values", s->meta.name,
                     wb_dtype_name(s->meta.dtype));
    }
}

/* The fill thread: the shards on up to 16 threads (half the CPUs, so the agents' loops and the
 * trainer's own work keep theirs). */
static void *fill_main(void *arg)
{
    struct ag_fill *f = arg;
    struct fill_job j = {.f = f};
    long cpus = sysconf(_SC_NPROCESSORS_ONLN) / 2;
    uint32_t n = cpus < 1 ? 1 : cpus > 16 ? 16 : (uint32_t)cpus, started = 0;
    pthread_t th[16];
    for (; started + 1 < n; started++)
        if (pthread_create(&th[started], NULL, fill_worker, &j))
            break;
    fill_worker(&j);
    for (uint32_t i = 0; i < started; i++)
        pthread_join(th[i], NULL);
    int rc = atomic_load(&j.rc);
    atomic_store(&f->state, rc ? rc : 1);
    return NULL;
}

int ag_fill_begin(struct ag_fill *f, uint64_t version, char *err, size_t errcap)
{
    f->t0 = wb_now_ns();
    f->want = version;
    f->have = 0;
    if (f->src.host) {
        f->err[0] = 0;
        atomic_store(&f->state, 0);
        int rc = pthread_create(&f->thread, NULL, fill_main, f);
        if (rc) {
            snprintf(err, errcap, "cannot start the synthetic source's thread: %s", strerror(rc));
            f->want = 0;
            return -rc;
        }
        f->thread_on = true;
        return 0;
    }
    if (f->src.change_period) { /* its kernel draws every element anew */
        snprintf(err, errcap, "synthetic_change: not available for shards in GPU memory");
        f->want = 0;
        return -ENOTSUP;
    }
    for (uint32_t i = 0; i < f->src.nshards; i++) {
        const struct shard *s = &f->src.shards[i];
        int rc = wb_synth_fill_async(s->meta.name, f->src.seed, version, s->meta.dtype,
                                     &s->meta.shape, &s->meta.box, s->ptr, f->src.stream);
        if (rc) {
            snprintf(err, errcap, "%.200s: cannot generate %s values on GPU %d: %s", s->meta.name,
                     wb_dtype_name(s->meta.dtype), f->src.device, wb_strerror(rc));
            f->want = 0;
            return rc;
        }
    }
    int rc = ag_event_record(f->src.stream, &f->ev);
    if (rc) {
        snprintf(err, errcap, "synthetic source: %s", wb_strerror(rc));
        f->want = 0;
    }
    return rc;
}

int ag_fill_poll(struct ag_fill *f, char *err, size_t errcap)
{
    if (!f->want)
        return 1;
    int rc;
    if (f->thread_on) {
        rc = atomic_load(&f->state);
        if (rc == 0)
            return 0;
        pthread_join(f->thread, NULL);
        f->thread_on = false;
        if (rc < 0)
            snprintf(err, errcap, "%s", f->err);
    } else {
        rc = ag_event_done(f->ev);
        if (rc == 0)
            return 0;
        ag_event_destroy(f->ev);
        f->ev = NULL;
        if (rc < 0)
            snprintf(err, errcap, "synthetic source on GPU %d: %s", f->src.device, wb_strerror(rc));
    }
    f->have = rc < 0 ? 0 : f->want;
    f->want = 0;
    return rc < 0 ? rc : 1;
}

void ag_fill_free(struct ag_fill *f)
{
    if (!f)
        return;
    if (f->thread_on)
        pthread_join(f->thread, NULL);
    ag_event_destroy(f->ev);
    free(f);
}
