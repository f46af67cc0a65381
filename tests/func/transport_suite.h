/* transport_suite.h — the transport conformance suite, shared by two test programs:
 * transport_conf_test.c (every backend on this host) and transport_netns_test.c (tcp across two
 * network namespaces). One set of cases, run against every backend configuration, each case
 * between two real processes — a writer A and a destination B, forked, exchanging address
 * blobs and descriptors over a socketpair.
 *
 * Cases: sizes (content of many sizes checked), imm (counters with arrivals in any order, before
 * and after expect, reached exactly once, carried over), zero (zero-length and region-end
 * writes), bounds (violations rejected with exact errors, nothing posted, guard bytes intact),
 * eagain (thousands of writes outstanding, window above the provider's queue), killed (the
 * destination is SIGKILLed mid-stream: error completions, each write reported once, no hang),
 * two (several registrations in one buffer, each bounded by its own descriptor).
 *
 * Every wait has a deadline; no timing decides a result. A header with definitions because
 * the build links each test program from one source file (tests/{unit,func}/<name>_test.c).
 */
#ifndef WB_TRANSPORT_SUITE_H
#define WB_TRANSPORT_SUITE_H

#include "tests/txtest.h"
#include "tests/wbtest.h"
#include "transport/transport.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

enum { REGION = 8 << 20, GUARD = 4096, DEADLINE_S = 90 };

/* ---------------------------------------------------------------- backends */

struct bk {
    const char *name;
    const char *yaml;   /* transport config */
    const char *domain; /* its domain key, replaced inside network namespaces */
    enum wb_tx_mem mem;
    int gpus;       /* GPUs needed */
    bool kill_idle; /* see case_killed */
};

static const struct bk TCP = {
    .name = "tcp", .yaml = "backend: fabric\nprovider: tcp\n", .domain = "lo"};
static const struct bk TCP2 = {.name = "tcp-2rails",
                               .yaml =
                                   "backend: fabric\nprovider: tcp\nrails: 2\nshard_size: 256KiB\n",
                               .domain = "lo"};
/* libfabric 1.17's shm provider spins forever on the region lock of a peer killed inside its
 * progress call (seen here: pthread_spin_lock in fi_writedata). The killed case therefore stops
 * B's polling before the kill on shm; what is tested is that the writer notices the death. */
static const struct bk SHM = {
    .name = "shm", .yaml = "backend: fabric\nprovider: shm\n", .kill_idle = true};
/* The bounce/staging path on host memory, with few small chunks so they run out. */
static const struct bk STAGED = {.name = "tcp-staged",
                                 .yaml = "backend: fabric\nprovider: tcp\nstage_host: true\n"
                                         "bounce_size: 64KiB\nbounce_chunks: 4\n",
                                 .domain = "lo"};
/* GPU memory over providers without FI_HMEM (hmem: off makes sure of it): bounce chunks at the
 * writer, a host mirror and staged copies at the destination. */
static const struct bk TCP_GPU = {.name = "tcp-gpu",
                                  .yaml = "backend: fabric\nprovider: tcp\nrails: 2\n"
                                          "shard_size: 1MiB\nbounce_size: 256KiB\nhmem: off\n",
                                  .domain = "lo",
                                  .mem = WB_TX_MEM_CUDA,
                                  .gpus = 1};
static const struct bk SHM_GPU = {.name = "shm-gpu",
                                  .yaml = "backend: fabric\nprovider: shm\nhmem: off\n",
                                  .mem = WB_TX_MEM_CUDA,
                                  .gpus = 1,
                                  .kill_idle = true};
static const struct bk IPC = {.name = "cudaipc",
                              .yaml = "backend: cudaipc\nrails: 2\nshard_size: 1MiB\n",
                              .mem = WB_TX_MEM_CUDA,
                              .gpus = 2};

/* ---------------------------------------------------------------- plumbing */

struct side {
    const struct bk *bk;
    int role; /* 0 writer A, 1 destination B */
    const char *domain;
    int fd;  /* to the other side */
    int ctl; /* to the test process (B only) */
    const char *yaml_extra;
    struct wb_tx *tx;
    uint8_t *mem;   /* registered memory (device or host) */
    uint8_t *alloc; /* B: the allocation, GUARD bytes each side of mem */
    uint8_t *host;  /* host view: A fills it, B copies into it to check */
    struct wb_tx_mr *mr;
    struct wb_tx_rdesc desc; /* A: B's region */
    uint32_t peer;
};

static uint64_t deadline(void)
{
    return wb_now_ns() + (uint64_t)DEADLINE_S * 1000000000ull;
}
static bool expired(uint64_t d)
{
    return wb_now_ns() > d;
}

static uint8_t pattern(uint64_t i)
{
    return (uint8_t)((i * 2654435761u) >> 13);
}

static void send_all(int fd, const void *p, size_t n)
{
    const uint8_t *b = p;
    while (n) {
        ssize_t k = write(fd, b, n);
        if (k < 0 && errno == EINTR)
            continue;
        CHECK(k > 0);
        b += k;
        n -= (size_t)k;
    }
}

static void msg_send(int fd, const void *p, uint32_t n)
{
    send_all(fd, &n, sizeof(n));
    send_all(fd, p, n);
}

/* True when fd has data within ms milliseconds. */
static bool readable(int fd, int ms)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};
    return poll(&p, 1, ms) > 0;
}

static void recv_all(int fd, void *p, size_t n, uint64_t dl)
{
    uint8_t *b = p;
    while (n) {
        if (expired(dl))
            wb_test_fail(__FILE__, __LINE__, "timed out waiting for the other process");
        if (!readable(fd, 10))
            continue;
        ssize_t k = read(fd, b, n);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            wb_test_fail(__FILE__, __LINE__, "the other process closed the connection");
        b += k;
        n -= (size_t)k;
    }
}

static uint32_t msg_recv(int fd, void *p, uint32_t cap)
{
    uint32_t n;
    uint64_t dl = deadline();
    recv_all(fd, &n, sizeof(n), dl);
    CHECK(n <= cap);
    recv_all(fd, p, n, dl);
    return n;
}

/* A message that lets the other side stop waiting (a "step" of the case). */
static void step_send(struct side *s, uint32_t v)
{
    msg_send(s->fd, &v, sizeof(v));
}

/* Waits for a step message while polling the transport (progress for the other side). */
static uint32_t step_wait(struct side *s)
{
    struct wb_tx_event ev[64];
    uint64_t dl = deadline();
    while (!readable(s->fd, 0)) {
        CHECK(!expired(dl));
        ssize_t n = wb_tx_poll(s->tx, ev, 64);
        CHECK(n >= 0);
        for (ssize_t i = 0; i < n; i++)
            CHECK_INT(ev[i].err, 0);
        if (n == 0)
            sched_yield();
    }
    uint32_t v = 0;
    CHECK_INT(msg_recv(s->fd, &v, sizeof(v)), sizeof(v));
    return v;
}

static void side_open(struct side *s)
{
    char yaml[1024], dom[64] = "";
    const char *d = s->domain ? s->domain : s->bk->domain;
    if (d)
        snprintf(dom, sizeof(dom), "domain: %s\n", d);
    snprintf(yaml, sizeof(yaml), "%s%s%s%s", s->bk->yaml, dom, s->yaml_extra ? s->yaml_extra : "",
             s->bk == &IPC ? (s->role ? "device: 1\n" : "device: 0\n") : "");
    struct wb_errlist el;
    wb_errlist_init(&el);
    int r = wb_test_tx_open(yaml, &el, &s->tx);
    if (r)
        wb_errlist_print(&el, "    ", stderr);
    CHECK_INT(r, 0);
    wb_errlist_free(&el);

    /* Memory: A's source holds the pattern; B's region sits between guard bytes. */
    size_t len = REGION + 2 * GUARD;
    s->host = malloc(len);
    CHECK(s->host);
    int dev = s->bk->mem == WB_TX_MEM_CUDA ? s->role % (s->bk->gpus ? s->bk->gpus : 1) : -1;
    CHECK_INT(wb_tx_mem_alloc(s->bk->mem, dev, len, (void **)&s->alloc), 0);
    if (s->role == 0) {
        for (size_t i = 0; i < len; i++)
            s->host[i] = pattern(i);
        s->mem = s->alloc;
    } else {
        memset(s->host, 0xEE, len);
        s->mem = s->alloc + GUARD;
    }
    CHECK_INT(wb_tx_mem_copy(s->alloc, s->host, len), 0);
    CHECK_INT(wb_tx_mr_reg(s->tx, s->mem, s->role ? REGION : len,
                           s->role ? WB_TX_ACCESS_DST : WB_TX_ACCESS_SRC, &s->mr),
              0);

    /* Address blobs both ways, then B's descriptor to A. */
    struct wb_mpw w;
    wb_mpw_init(&w);
    CHECK_INT(wb_tx_addr(s->tx, &w), 0);
    msg_send(s->fd, w.buf, (uint32_t)w.len);
    wb_mpw_free(&w);
    uint8_t buf[4096];
    uint32_t n = msg_recv(s->fd, buf, sizeof(buf));
    struct wb_mpr rd;
    wb_mpr_init(&rd, buf, n);
    r = wb_tx_peer_add(s->tx, &rd, &s->peer);
    if (r)
        fprintf(stderr, "    peer_add: %s\n", wb_tx_errmsg(s->tx));
    CHECK_INT(r, 0);
    CHECK_INT(wb_mpr_end(&rd), 0);
    if (s->role == 1) {
        struct wb_tx_rdesc d;
        CHECK_INT(wb_tx_rdesc(s->tx, s->mr, &d), 0);
        wb_mpw_init(&w);
        wb_tx_rdesc_put(&w, &d);
        CHECK_INT(wb_mpw_finish(&w), 0);
        msg_send(s->fd, w.buf, (uint32_t)w.len);
        wb_mpw_free(&w);
    } else {
        n = msg_recv(s->fd, buf, sizeof(buf));
        wb_mpr_init(&rd, buf, n);
        CHECK_INT(wb_tx_rdesc_get(&rd, &s->desc), 0);
        CHECK_INT(wb_mpr_end(&rd), 0);
        CHECK_U64(s->desc.size, REGION);
        /* memory keys are random, not 1, 2, 3 ... (1 in 2^44 that this fails by chance) */
        for (uint32_t i = 0; s->desc.backend == WB_TX_FABRIC && i < s->desc.nrails; i++)
            CHECK(s->desc.rail[i].key > (1ull << 20));
    }
}

static void side_close(struct side *s)
{
    CHECK_INT(wb_tx_mr_dereg(s->tx, s->mr), 0);
    wb_tx_close(s->tx);
    wb_tx_mem_free(s->bk->mem, s->alloc);
    free(s->host);
}

/* B: copies the region (with guards) to host and checks [off, off+len) against A's pattern at
 * src_off. */
static void fetch(struct side *s)
{
    CHECK_INT(wb_tx_mem_copy(s->host, s->alloc, REGION + 2 * GUARD), 0);
}

static void check_landed(struct side *s, uint64_t dst_off, uint64_t src_off, uint64_t len)
{
    const uint8_t *r = s->host + GUARD;
    for (uint64_t k = 0; k < len; k++)
        if (r[dst_off + k] != pattern(src_off + k))
            wb_test_fail(__FILE__, __LINE__,
                         "byte %" PRIu64 " of the write [%" PRIu64 ", +%" PRIu64
                         ") is 0x%02x, expected 0x%02x",
                         k, dst_off, len, r[dst_off + k], pattern(src_off + k));
}

static void check_guards(struct side *s)
{
    for (size_t i = 0; i < GUARD; i++) {
        CHECK_INT(s->host[i], 0xEE);
        CHECK_INT(s->host[GUARD + REGION + i], 0xEE);
    }
}

/* A: polls until `want` write completions arrived (deadline); returns how many had errors. */
struct tally {
    uint64_t done, errors;
    int first_err;
};

static void drain_writes(struct side *s, struct tally *t, uint64_t want)
{
    struct wb_tx_event ev[256];
    uint64_t dl = deadline();
    while (t->done < want) {
        if (expired(dl))
            wb_test_fail(__FILE__, __LINE__, "%" PRIu64 " of %" PRIu64 " writes completed", t->done,
                         want);
        ssize_t n = wb_tx_poll(s->tx, ev, 256);
        CHECK(n >= 0);
        for (ssize_t i = 0; i < n; i++) {
            CHECK_INT(ev[i].kind, WB_TX_EV_WRITE);
            t->done++;
            if (ev[i].err) {
                t->errors++;
                if (!t->first_err)
                    t->first_err = ev[i].err;
            }
        }
        if (n == 0)
            sched_yield();
    }
}

static void write_one(struct side *s, uint64_t src_off, uint64_t dst_off, uint64_t len,
                      bool has_imm, uint32_t tag)
{
    struct wb_tx_write w = {.src = s->mr,
                            .src_off = src_off,
                            .peer = s->peer,
                            .dst = &s->desc,
                            .dst_off = dst_off,
                            .len = len,
                            .has_imm = has_imm,
                            .imm = tag};
    int r = wb_tx_write(s->tx, &w);
    if (r)
        fprintf(stderr, "    write: %s\n", wb_tx_errmsg(s->tx));
    CHECK_INT(r, 0);
}

/* B: polls until every expectation in `want` (tags with NULL-callback events) fired once. */
static void wait_imm(struct side *s, const uint32_t *tags, size_t n)
{
    bool got[64] = {0};
    size_t left = n;
    struct wb_tx_event ev[64];
    uint64_t dl = deadline();
    while (left) {
        if (expired(dl))
            wb_test_fail(__FILE__, __LINE__,
                         "%zu of %zu expectations reached (tag %u: %" PRIu64 " arrived)", n - left,
                         n, tags[0], wb_tx_imm_count(s->tx, tags[0]));
        ssize_t k = wb_tx_poll(s->tx, ev, 64);
        CHECK(k >= 0);
        for (ssize_t i = 0; i < k; i++) {
            CHECK_INT(ev[i].kind, WB_TX_EV_IMM);
            size_t j = 0;
            while (j < n && tags[j] != ev[i].tag)
                j++;
            if (j == n || got[j])
                wb_test_fail(__FILE__, __LINE__, "unexpected or repeated event for tag %u",
                             ev[i].tag);
            got[j] = true;
            left--;
        }
        if (k == 0)
            sched_yield();
    }
}

/* ---------------------------------------------------------------- cases */

/* Writes of many sizes, each with tag 1; B checks every byte once all n arrived. */
static const uint64_t sizes[] = {
    1, 7, 4095, 4096, 4097, 65536 + 3, (1 << 20), (1 << 20) + 1, 3u << 20 | 5, 1536 * 1024 + 17, 0};

static void sizes_plan(size_t i, uint64_t *src, uint64_t *dst)
{
    uint64_t d = 0;
    for (size_t k = 0; k < i; k++)
        d += (sizes[k] + 8191) & ~(uint64_t)4095; /* spaced: untouched bytes between */
    *dst = d;
    *src = 3 * i + 1; /* unaligned source offsets */
}

static void case_sizes(struct side *s)
{
    size_t n = 0;
    while (sizes[n])
        n++;
    if (s->role == 0) {
        for (size_t i = 0; i < n; i++) {
            uint64_t so, d;
            sizes_plan(i, &so, &d);
            write_one(s, so, d, sizes[i], true, 1);
        }
        struct tally t = {0};
        drain_writes(s, &t, n);
        CHECK_INT(t.errors, 0);
        CHECK_INT(step_wait(s), 1);
        return;
    }
    CHECK_INT(wb_tx_expect(s->tx, 1, n, NULL, NULL), 0);
    uint32_t tag = 1;
    wait_imm(s, &tag, 1);
    fetch(s);
    for (size_t i = 0; i < n; i++) {
        uint64_t so, d;
        sizes_plan(i, &so, &d);
        check_landed(s, d, so, sizes[i]);
        /* the bytes right after each write are untouched */
        CHECK_INT(s->host[GUARD + d + sizes[i]], 0xEE);
    }
    check_guards(s);
    CHECK_U64(wb_tx_imm_count(s->tx, 1), 0);
    step_send(s, 1);
}

/* Counters: 4 tags in interleaved writes (tag 13: immediates alone). B arms 10 and 11 before
 * anything arrives, lets all 200 of tag 12 arrive before arming it, arms 13 after a few. Then 5
 * more of tag 10 arrive after it was reached: counted for the next expectation, no event. */
static void cb_count(void *arg, uint32_t tag)
{
    int *hits = arg;
    hits[tag - 10]++;
}

static void case_imm(struct side *s)
{
    enum { N10 = 50, N11 = 1, N12 = 200, N13 = 10 };
    if (s->role == 0) {
        CHECK_INT(step_wait(s), 1); /* B has armed 10 and 11 */
        uint64_t nw = 0;
        for (int i = 0; i < N12; i++) {
            write_one(s, (uint64_t)i * 512, (uint64_t)i * 4096, 512 + (uint64_t)i, true, 12);
            nw++;
            if (i < N10) {
                write_one(s, 7, (1u << 20) + (uint64_t)i * 8192, 8000, true, 10);
                nw++;
            }
            if (i < N13) {
                CHECK_INT(wb_tx_write_imm(s->tx, s->peer, 13, NULL), 0);
                nw++;
            }
            if (i == 100) {
                write_one(s, 0, 4u << 20, 2u << 20, true, 11); /* a striped one */
                nw++;
            }
        }
        struct tally t = {0};
        drain_writes(s, &t, nw);
        CHECK_INT(t.errors, 0);
        CHECK_INT(step_wait(s), 2); /* B has seen everything */
        for (int i = 0; i < 5; i++)
            write_one(s, 7, (1u << 20) + (uint64_t)i * 8192, 8000, true, 10);
        drain_writes(s, &t, nw + 5);
        CHECK_INT(t.errors, 0);
        CHECK_INT(step_wait(s), 3);
        return;
    }
    int hits[4] = {0};
    CHECK_INT(wb_tx_expect(s->tx, 10, N10, cb_count, hits), 0);
    CHECK_INT(wb_tx_expect(s->tx, 11, N11, NULL, (void *)"eleven"), 0);
    CHECK_INT(wb_tx_expect(s->tx, 10, 1, NULL, NULL), -EBUSY);
    CHECK_STR(wb_tx_errmsg(s->tx), "expect: tag 10 is already armed (0 of 50 arrived)");
    step_send(s, 1);
    struct wb_tx_event ev[64];
    bool got11 = false, got12 = false, got13 = false, armed12 = false, armed13 = false;
    uint64_t dl = deadline();
    while (!(hits[0] && got11 && got12 && got13)) {
        if (expired(dl))
            wb_test_fail(__FILE__, __LINE__,
                         "counters: 10:%d 11:%d 12:%d(%" PRIu64 ") 13:%d(%" PRIu64 ")", hits[0],
                         got11, got12, wb_tx_imm_count(s->tx, 12), got13,
                         wb_tx_imm_count(s->tx, 13));
        ssize_t n = wb_tx_poll(s->tx, ev, 64);
        CHECK(n >= 0);
        for (ssize_t i = 0; i < n; i++) {
            CHECK_INT(ev[i].kind, WB_TX_EV_IMM);
            CHECK_INT(ev[i].err, 0);
            if (ev[i].tag == 11) {
                CHECK(!got11);
                CHECK_STR(ev[i].ctx, "eleven");
                got11 = true;
            } else if (ev[i].tag == 12) {
                CHECK(armed12 && !got12);
                got12 = true;
            } else if (ev[i].tag == 13) {
                CHECK(armed13 && !got13);
                got13 = true;
            } else {
                wb_test_fail(__FILE__, __LINE__, "event for tag %u", ev[i].tag);
            }
        }
        /* Arrivals before expect count: arm 12 only once all 200 are in. */
        if (!armed12 && wb_tx_imm_count(s->tx, 12) == N12) {
            CHECK_INT(wb_tx_expect(s->tx, 12, N12, NULL, NULL), 0);
            armed12 = true;
        }
        if (!armed13 && wb_tx_imm_count(s->tx, 13) >= 3) {
            CHECK_INT(wb_tx_expect(s->tx, 13, N13, NULL, NULL), 0);
            armed13 = true;
        }
        if (n == 0)
            sched_yield();
    }
    CHECK_INT(hits[0], 1);
    for (uint32_t t = 10; t <= 13; t++)
        CHECK_U64(wb_tx_imm_count(s->tx, t), 0);
    step_send(s, 2);
    /* 5 more of tag 10: counted, but nothing is armed, so no callback and no event. */
    dl = deadline();
    while (wb_tx_imm_count(s->tx, 10) < 5) {
        CHECK(!expired(dl));
        ssize_t n = wb_tx_poll(s->tx, ev, 64);
        CHECK_INT(n, 0);
    }
    CHECK_INT(hits[0], 1);
    CHECK_U64(wb_tx_imm_count(s->tx, 10), 5);
    /* Re-arming with those already in reaches at the next poll, once. */
    CHECK_INT(wb_tx_expect(s->tx, 10, 5, cb_count, hits), 0);
    CHECK_INT(hits[0], 1);
    CHECK_INT(wb_tx_poll(s->tx, ev, 64), 0);
    CHECK_INT(hits[0], 2);
    CHECK_INT(wb_tx_expect(s->tx, 14, 0, NULL, (void *)"zero"), 0);
    CHECK_INT(wb_tx_poll(s->tx, ev, 64), 1);
    CHECK_INT(ev[0].tag, 14);
    CHECK_STR(ev[0].ctx, "zero");
    fetch(s);
    for (int i = 0; i < N12; i++)
        check_landed(s, (uint64_t)i * 4096, (uint64_t)i * 512, 512 + (uint64_t)i);
    for (int i = 0; i < N10; i++)
        check_landed(s, (1u << 20) + (uint64_t)i * 8192, 7, 8000);
    check_landed(s, 4u << 20, 0, 2u << 20);
    step_send(s, 3);
}

/* Zero-length and region-end writes. */
static void case_zero(struct side *s)
{
    if (s->role == 0) {
        uint64_t end = REGION;
        write_one(s, 0, end, 0, true, 20);             /* 0 bytes at the very end, with imm */
        write_one(s, 0, 0, 0, true, 20);               /* 0 bytes at the start, with imm */
        write_one(s, 0, end, 0, false, 0);             /* 0 bytes at the end, no imm */
        write_one(s, 100, end - 4096, 4096, true, 21); /* ends exactly at the end */
        /* the very last byte, again: the same source byte, because the two writes may land in
         * either order (over two rails they do) */
        write_one(s, 100 + 4095, end - 1, 1, true, 21);
        struct wb_tx_write w = {.src = NULL, .peer = s->peer, .dst = &s->desc, .dst_off = end};
        CHECK_INT(wb_tx_write(s->tx, &w), 0); /* NULL source is fine for 0 bytes */
        w.dst_off = end + 1;
        CHECK_INT(wb_tx_write(s->tx, &w), -WB_E_BOUNDS);
        CHECK_STR(wb_tx_errmsg(s->tx),
                  "write: destination [8388609, +0) outside region 1 of 8388608 bytes");
        struct tally t = {0};
        drain_writes(s, &t, 6);
        CHECK_INT(t.errors, 0);
        CHECK_INT(step_wait(s), 1);
        return;
    }
    CHECK_INT(wb_tx_expect(s->tx, 20, 2, NULL, NULL), 0);
    CHECK_INT(wb_tx_expect(s->tx, 21, 2, NULL, NULL), 0);
    uint32_t tags[2] = {20, 21};
    wait_imm(s, tags, 2);
    fetch(s);
    check_landed(s, REGION - 4096, 100, 4096);
    check_landed(s, REGION - 1, 100 + 4095, 1);
    CHECK_INT(s->host[GUARD + REGION - 4097], 0xEE);
    check_guards(s);
    step_send(s, 1);
}

/* Violations return an error and post nothing: B finally sees tag 31 and 32 but never 30. */
static void case_bounds(struct side *s)
{
    if (s->role == 0) {
        struct wb_tx_write w = {.src = s->mr,
                                .peer = s->peer,
                                .dst = &s->desc,
                                .dst_off = REGION - 100,
                                .len = 101,
                                .has_imm = true,
                                .imm = 30};
        CHECK_INT(wb_tx_write(s->tx, &w), -WB_E_BOUNDS);
        CHECK_STR(wb_tx_errmsg(s->tx),
                  "write: destination [8388508, +101) outside region 1 of 8388608 bytes");
        w.dst_off = UINT64_MAX - 2; /* off + len wraps around */
        w.len = 4;
        CHECK_INT(wb_tx_write(s->tx, &w), -WB_E_BOUNDS);
        w.dst_off = 0;
        w.len = UINT64_MAX;
        CHECK_INT(wb_tx_write(s->tx, &w), -WB_E_BOUNDS);
        w.len = 4096;
        w.src_off = REGION + 2 * GUARD - 4095;
        CHECK_INT(wb_tx_write(s->tx, &w), -WB_E_BOUNDS);
        CHECK_STR(wb_tx_errmsg(s->tx),
                  "write: source [8392705, +4096) outside region 1 of 8396800 bytes");
        w.src_off = 0;
        w.peer = 7;
        CHECK_INT(wb_tx_write(s->tx, &w), -EINVAL);
        CHECK_STR(wb_tx_errmsg(s->tx), "write: unknown peer 7 (1 peers added)");
        CHECK_INT(wb_tx_write_imm(s->tx, 7, 30, NULL), -EINVAL);
        w.peer = s->peer;
        struct wb_tx_rdesc forged = s->desc;
        forged.owner ^= 2;
        w.dst = &forged;
        CHECK_INT(wb_tx_write(s->tx, &w), -EINVAL);
        CHECK_STR(wb_tx_errmsg(s->tx), "write: descriptor of region 1 does not belong to peer 0");
        forged = s->desc;
        forged.backend = forged.backend == WB_TX_FABRIC ? WB_TX_CUDAIPC : WB_TX_FABRIC;
        CHECK_INT(wb_tx_write(s->tx, &w), -EINVAL);
        w.dst = &s->desc;
        w.src = NULL;
        CHECK_INT(wb_tx_write(s->tx, &w), -EINVAL);
        CHECK_STR(wb_tx_errmsg(s->tx), "write: no source registration for 4096 bytes");
        struct wb_tx_stats st;
        CHECK_INT(wb_tx_stats(s->tx, &st), 0);
        CHECK_U64(st.writes, 0);
        write_one(s, 0, REGION - 4096, 4096, true, 31);
        CHECK_INT(wb_tx_write_imm(s->tx, s->peer, 32, NULL), 0);
        struct tally t = {0};
        drain_writes(s, &t, 2);
        CHECK_INT(t.errors, 0);
        CHECK_INT(wb_tx_stats(s->tx, &st), 0);
        CHECK_U64(st.writes, 2);
        CHECK_INT(step_wait(s), 1);
        return;
    }
    CHECK_INT(wb_tx_expect(s->tx, 31, 1, NULL, NULL), 0);
    CHECK_INT(wb_tx_expect(s->tx, 32, 1, NULL, NULL), 0);
    uint32_t tags[2] = {31, 32};
    wait_imm(s, tags, 2);
    /* A returned from its checks before posting anything valid, and the rejected writes were
     * never posted: no arrival of tag 30 can be in flight. */
    CHECK_U64(wb_tx_imm_count(s->tx, 30), 0);
    fetch(s);
    check_guards(s);
    check_landed(s, REGION - 4096, 0, 4096);
    for (size_t i = 0; i < REGION - 4096; i++)
        if (s->host[GUARD + i] != 0xEE)
            wb_test_fail(__FILE__, __LINE__, "byte %zu of the region was written", i);
    step_send(s, 1);
}

/* A view of the region (one tensor of an allocation registered whole): writes address it from
 * 0, land at its offset in the region, and are bounded by the view, not by the region. */
static void case_view(struct side *s)
{
    enum { VOFF = 3 * 4096 + 512, VLEN = 8192 };
    if (s->role == 0) {
        struct wb_tx_rdesc v;
        CHECK_INT(wb_tx_rdesc_view(&s->desc, VOFF, VLEN, &v), 0);
        CHECK_INT(wb_tx_rdesc_view(&s->desc, REGION - 10, 11, &v), -WB_E_BOUNDS);
        CHECK_INT(wb_tx_rdesc_view(&s->desc, VOFF, VLEN, &v), 0);
        struct wb_tx_write w = {.src = s->mr,
                                .src_off = 100,
                                .peer = s->peer,
                                .dst = &v,
                                .dst_off = 4096,
                                .len = 4097,
                                .has_imm = true,
                                .imm = 40};
        CHECK_INT(wb_tx_write(s->tx, &w), -WB_E_BOUNDS);
        CHECK_STR(wb_tx_errmsg(s->tx),
                  "write: destination [4096, +4097) outside region 1 of 8192 bytes");
        w.len = 4096; /* the view's last byte included */
        CHECK_INT(wb_tx_write(s->tx, &w), 0);
        w.src_off = 7;
        w.dst_off = 0;
        w.len = 1000;
        w.imm = 41;
        CHECK_INT(wb_tx_write(s->tx, &w), 0);
        struct tally t = {0};
        drain_writes(s, &t, 2);
        CHECK_INT(t.errors, 0);
        CHECK_INT(step_wait(s), 1);
        return;
    }
    CHECK_INT(wb_tx_expect(s->tx, 40, 1, NULL, NULL), 0);
    CHECK_INT(wb_tx_expect(s->tx, 41, 1, NULL, NULL), 0);
    uint32_t tags[2] = {40, 41};
    wait_imm(s, tags, 2);
    fetch(s);
    check_guards(s);
    check_landed(s, VOFF + 4096, 100, 4096);
    check_landed(s, VOFF, 7, 1000);
    for (size_t i = 0; i < REGION; i++) {
        bool in = (i >= VOFF && i < VOFF + 1000) || (i >= VOFF + 4096 && i < VOFF + VLEN);
        if (!in && s->host[GUARD + i] != 0xEE)
            wb_test_fail(__FILE__, __LINE__, "byte %zu outside the writes was written", i);
    }
    step_send(s, 1);
}

/* Thousands of writes queued before the first poll, with a window above the provider's queue
 * so the provider pushes back with -FI_EAGAIN. Slots are rewritten with the same bytes, so the
 * final content is defined whatever the order. */
static void case_eagain(struct side *s)
{
    enum { NW = 3000, SLOTS = 512 };
    if (s->role == 0) {
        for (int i = 0; i < NW; i++) {
            uint64_t k = (uint64_t)i % SLOTS;
            write_one(s, k * 4096 + 1, k * 4096, 4096, true, 40);
        }
        struct tally t = {0};
        drain_writes(s, &t, NW);
        CHECK_INT(t.errors, 0);
        struct wb_tx_stats st;
        CHECK_INT(wb_tx_stats(s->tx, &st), 0);
        CHECK_U64(st.writes, NW);
        printf("    %" PRIu64 " writes, provider pushed back %" PRIu64 " times\n", st.writes,
               st.eagain);
        CHECK_INT(step_wait(s), 1);
        return;
    }
    CHECK_INT(wb_tx_expect(s->tx, 40, NW, NULL, NULL), 0);
    uint32_t tag = 40;
    wait_imm(s, &tag, 1);
    CHECK_U64(wb_tx_imm_count(s->tx, 40), 0);
    fetch(s);
    for (uint64_t k = 0; k < SLOTS; k++)
        check_landed(s, k * 4096, k * 4096 + 1, 4096);
    step_send(s, 1);
}

/* B is SIGKILLed after 50 writes arrived; A keeps streaming and must get error completions,
 * each write reported exactly once, then refusals — and no hang. */
static void case_killed(struct side *s)
{
    enum { WINDOW = 256, SZ = 65536 };
    if (s->role == 1) {
        CHECK_INT(wb_tx_expect(s->tx, 50, 50, NULL, NULL), 0);
        uint32_t tag = 50;
        wait_imm(s, &tag, 1);
        char c = 'k';
        CHECK_INT(write(s->ctl, &c, 1), 1);
        struct wb_tx_event ev[64];
        for (;;) { /* until killed */
            if (!s->bk->kill_idle)
                (void)wb_tx_poll(s->tx, ev, 64);
            else
                usleep(1000);
        }
    }
    struct wb_tx_event ev[256];
    uint64_t posted = 0, done = 0, errors = 0, refused = 0;
    int first_err = 0;
    uint64_t dl = deadline();
    while (!errors && !refused) {
        if (expired(dl))
            wb_test_fail(__FILE__, __LINE__,
                         "no error %d s after the destination died (%" PRIu64 " posted)",
                         DEADLINE_S, posted);
        while (posted - done < WINDOW) {
            struct wb_tx_write w = {.src = s->mr,
                                    .src_off = (posted % 64) * SZ,
                                    .peer = s->peer,
                                    .dst = &s->desc,
                                    .dst_off = (posted % 64) * SZ,
                                    .len = SZ,
                                    .has_imm = true,
                                    .imm = 50};
            int r = wb_tx_write(s->tx, &w);
            if (r == -WB_E_PEER) {
                refused++;
                break;
            }
            CHECK_INT(r, 0);
            posted++;
        }
        ssize_t n = wb_tx_poll(s->tx, ev, 256);
        CHECK(n >= 0);
        for (ssize_t i = 0; i < n; i++) {
            CHECK_INT(ev[i].kind, WB_TX_EV_WRITE);
            done++;
            errors += ev[i].err != 0;
            if (ev[i].err && !first_err)
                first_err = ev[i].err;
        }
        if (n == 0)
            sched_yield();
    }
    /* Everything posted is reported, exactly once. */
    struct tally t = {.done = done, .errors = errors, .first_err = first_err};
    drain_writes(s, &t, posted);
    for (int i = 0; i < 50; i++)
        CHECK_INT(wb_tx_poll(s->tx, ev, 256), 0);
    CHECK(t.errors > 0 || refused > 0);
    struct wb_tx_write w = {
        .src = s->mr, .peer = s->peer, .dst = &s->desc, .len = 4096, .has_imm = true, .imm = 50};
    CHECK_INT(wb_tx_write(s->tx, &w), -WB_E_PEER);
    CHECK_INT(wb_tx_write_imm(s->tx, s->peer, 50, NULL), -WB_E_PEER);
    printf("    %" PRIu64 " writes: %" PRIu64 " completed with an error (first: %s)\n", posted,
           t.errors, wb_strerror(t.first_err));
}

/* Two more registrations inside B's region, each with its own descriptor: writes land at the
 * right place in each, and a write is bounded by its own descriptor even where memory goes on
 * (cudaipc: both descriptors name one allocation, which is opened once). */
static void case_two(struct side *s)
{
    enum { HALF = REGION / 2 };
    uint8_t buf[4096];
    struct wb_mpw w;
    struct wb_mpr r;
    if (s->role == 1) {
        struct wb_tx_mr *m[2];
        for (int i = 0; i < 2; i++) {
            CHECK_INT(wb_tx_mr_reg(s->tx, s->mem + i * HALF, HALF, WB_TX_ACCESS_DST, &m[i]), 0);
            struct wb_tx_rdesc d;
            CHECK_INT(wb_tx_rdesc(s->tx, m[i], &d), 0);
            wb_mpw_init(&w);
            wb_tx_rdesc_put(&w, &d);
            msg_send(s->fd, w.buf, (uint32_t)w.len);
            wb_mpw_free(&w);
        }
        CHECK_INT(wb_tx_expect(s->tx, 60, 2, NULL, NULL), 0);
        uint32_t tag = 60;
        wait_imm(s, &tag, 1);
        fetch(s);
        check_landed(s, 100, 11, 4096);
        check_landed(s, HALF + 200, 13, 4096);
        CHECK_INT(s->host[GUARD + 99], 0xEE);
        CHECK_INT(s->host[GUARD + HALF + 199], 0xEE);
        step_send(s, 1);
        CHECK_INT(step_wait(s), 2); /* A is done: the registrations can go */
        for (int i = 0; i < 2; i++)
            CHECK_INT(wb_tx_mr_dereg(s->tx, m[i]), 0);
        return;
    }
    struct wb_tx_rdesc d[2];
    for (int i = 0; i < 2; i++) {
        uint32_t n = msg_recv(s->fd, buf, sizeof(buf));
        wb_mpr_init(&r, buf, n);
        CHECK_INT(wb_tx_rdesc_get(&r, &d[i]), 0);
        CHECK_U64(d[i].size, HALF);
    }
    CHECK(d[0].id != d[1].id);
    struct wb_tx_write wr = {.src = s->mr,
                             .src_off = 11,
                             .peer = s->peer,
                             .dst = &d[0],
                             .dst_off = HALF - 10,
                             .len = 20,
                             .has_imm = true,
                             .imm = 60};
    CHECK_INT(wb_tx_write(s->tx, &wr), -WB_E_BOUNDS);
    wr.dst_off = 100;
    wr.len = 4096;
    CHECK_INT(wb_tx_write(s->tx, &wr), 0);
    wr.dst = &d[1];
    wr.src_off = 13;
    wr.dst_off = 200;
    CHECK_INT(wb_tx_write(s->tx, &wr), 0);
    struct tally t = {0};
    drain_writes(s, &t, 2);
    CHECK_INT(t.errors, 0);
    CHECK_INT(step_wait(s), 1);
    step_send(s, 2);
}

/* A fence behind 32 writes with immediates: once its completion is in, A tells B, and B —
 * polling no more — holds every byte of every write (the contract an aborting trainer relies
 * on before it reports drained). Whatever A's write completions said meanwhile. */
static void case_fence(struct side *s)
{
    enum { NW = 32, LEN = 64 << 10 };
    if (s->role == 0) {
        for (uint64_t i = 0; i < NW; i++)
            write_one(s, i * LEN + 3, i * LEN, LEN, true, 20);
        CHECK_INT(wb_tx_fence(s->tx, s->peer, (void *)"fence"), 0);
        struct wb_tx_event ev[64];
        uint64_t writes = 0, dl = deadline();
        bool fenced = false;
        while (!fenced || writes < NW) {
            CHECK(!expired(dl));
            ssize_t n = wb_tx_poll(s->tx, ev, 64);
            CHECK(n >= 0);
            for (ssize_t i = 0; i < n; i++) {
                CHECK_INT(ev[i].kind, WB_TX_EV_WRITE);
                CHECK_INT(ev[i].err, 0);
                if (ev[i].ctx) {
                    CHECK_STR(ev[i].ctx, "fence");
                    CHECK(!fenced);
                    fenced = true;
                    step_send(s, 2); /* at once: B checks what is placed now */
                } else {
                    writes++;
                }
            }
        }
        CHECK_INT(step_wait(s), 3);
        return;
    }
    CHECK_INT(step_wait(s), 2);
    fetch(s);
    for (uint64_t i = 0; i < NW; i++)
        check_landed(s, i * LEN, i * LEN + 3, LEN);
    check_guards(s);
    step_send(s, 3);
}

/* ---------------------------------------------------------------- two processes */

enum case_id { C_SIZES, C_IMM, C_ZERO, C_BOUNDS, C_EAGAIN, C_KILLED, C_TWO, C_VIEW, C_FENCE };

static void (*const cases[])(struct side *) = {case_sizes,  case_imm,    case_zero,
                                               case_bounds, case_eagain, case_killed,
                                               case_two,    case_view,   case_fence};

struct run {
    const struct bk *bk;
    enum case_id c;
    const char *netns[2];  /* network namespace per role, or NULL */
    const char *domain[2]; /* domain override per role (netns) */
};

static int gpu_count_probe(void)
{
    /* CUDA must not be initialized in the process that forks A and B. */
    pid_t pid = fork();
    if (pid == 0)
        _exit(wb_gpu_count() > 100 ? 100 : wb_gpu_count());
    int st = 0;
    waitpid(pid, &st, 0);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 0;
}

static void enter_netns(const char *name)
{
    char path[128];
    snprintf(path, sizeof(path), "/var/run/netns/%s", name);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    CHECK(fd >= 0);
    CHECK_INT(setns(fd, CLONE_NEWNET), 0);
    close(fd);
}

static void child(const struct run *rn, int role, int fd, int ctl)
{
    if (rn->netns[role])
        enter_netns(rn->netns[role]);
    const char *extra = rn->c == C_EAGAIN ? "window: 100000\npost_batch: 4096\n" : "";
    struct side s = {.bk = rn->bk,
                     .role = role,
                     .domain = rn->domain[role],
                     .fd = fd,
                     .ctl = ctl,
                     .yaml_extra = extra};
    side_open(&s);
    cases[rn->c](&s);
    side_close(&s);
    close(fd);
}

/* The shm provider names its region /dev/shm/<pid>:<n>:<n> and removes it at close; a process
 * killed with SIGKILL cannot, so the test removes the killed destination's (its pid is dead and
 * reaped, the files are garbage). */
static void remove_shm_of(pid_t pid)
{
    DIR *d = opendir("/dev/shm");
    if (!d)
        return;
    char prefix[32];
    int n = snprintf(prefix, sizeof(prefix), "%d:", (int)pid);
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (strncmp(e->d_name, prefix, (size_t)n) != 0)
            continue;
        char path[300];
        snprintf(path, sizeof(path), "/dev/shm/%s", e->d_name);
        unlink(path);
    }
    closedir(d);
}

static void run_pair(const struct run *rn)
{
    if (rn->bk->gpus) {
        int n = gpu_count_probe();
        if (n < rn->bk->gpus)
            wb_test_skip("%s needs %d GPU(s), this machine has %d", rn->bk->name, rn->bk->gpus, n);
    }
    int sv[2], ctl[2];
    CHECK_INT(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    CHECK_INT(pipe(ctl), 0);
    fflush(NULL);
    pid_t pid[2];
    for (int role = 0; role < 2; role++) {
        pid[role] = fork();
        CHECK(pid[role] >= 0);
        if (pid[role] == 0) {
            close(sv[1 - role]);
            close(ctl[0]);
            child(rn, role, sv[role], ctl[1]);
            exit(0); /* not _exit: LeakSanitizer checks at exit */
        }
    }
    close(sv[0]);
    close(sv[1]);
    close(ctl[1]);
    int st[2] = {0, 0};
    bool reaped[2] = {false, false}, killed = false;
    uint64_t dl = wb_now_ns() + (uint64_t)(DEADLINE_S + 30) * 1000000000ull;
    while (!reaped[0] || !reaped[1]) {
        char c;
        if (rn->c == C_KILLED && !killed && readable(ctl[0], 0) && read(ctl[0], &c, 1) == 1) {
            kill(pid[1], SIGKILL);
            killed = true;
        }
        for (int r = 0; r < 2; r++)
            if (!reaped[r] && waitpid(pid[r], &st[r], WNOHANG) == pid[r])
                reaped[r] = true;
        if (wb_now_ns() > dl) {
            for (int r = 0; r < 2; r++)
                if (!reaped[r])
                    kill(pid[r], SIGKILL);
            wb_test_fail(__FILE__, __LINE__, "the processes did not finish");
        }
        usleep(2000);
    }
    close(ctl[0]);
    if (killed)
        remove_shm_of(pid[1]);
    for (int r = 0; r < 2; r++) {
        if (r == 1 && killed) {
            CHECK(WIFSIGNALED(st[1]) && WTERMSIG(st[1]) == SIGKILL);
            continue;
        }
        if (WIFEXITED(st[r]) && WEXITSTATUS(st[r]) == 77)
            wb_test_skip("skipped in process %c", "AB"[r]);
        if (!WIFEXITED(st[r]) || WEXITSTATUS(st[r]) != 0)
            wb_test_fail(__FILE__, __LINE__, "process %c (%s) failed", "AB"[r],
                         r ? "destination" : "writer");
    }
    if (rn->c == C_KILLED)
        CHECK(killed);
}

#endif /* WB_TRANSPORT_SUITE_H */
