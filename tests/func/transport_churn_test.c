/* transport_churn_test.c — closing and opening the transport again, in every state a data
 * connection can be in (issue #28: agents crashed in fi_close(ep) while setting up again after
 * their session was dropped, on links losing packets and CPUs starved).
 *
 * N real processes ("members") each run cycles: open a tcp transport, publish its address and
 * one destination region through the test process (a hub over socketpairs), add whoever else
 * published last (live, closed since, or killed: addresses may be stale), queue writes with
 * immediates and a fence to every peer, poll a number of times drawn per cycle (none at all:
 * closed before anything was posted; a few: connections still being made; hundreds: mid-send
 * and mid-receive; until every write reported: peers still writing into it), and close.
 * Every so many cycles a member is killed with SIGKILL partway through its writes and started
 * again. Where network namespaces can be made, the members sit in namespaces of their own
 * behind links whose queues drop what overflows (tc tbf with a small limit: this kernel has no
 * netem), and all of them share one CPU with a busy loop, so closes happen under loss and
 * starvation; elsewhere they run over loopback (said in the output).
 *
 * What is asserted: the cycles all ran; no member ended by a signal the test did not send; each
 * write reported at most once, with an error from the documented set; and at the end every
 * member, opened once more after all that, writes its pattern to every other and each byte and
 * each immediate count arrives exactly. Timing decides nothing: work is bounded by counts, and
 * the limits only end a hang.
 *
 * WB_CHURN_CYCLES (default 200) sets the number of cycles, for a longer run by hand. */
#include "tests/txtest.h"
#include "tests/wbtest.h"
#include "transport/transport.h"

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

enum {
    NMEMBERS = 4,
    REGION = 1 << 20,               /* each member's destination: NMEMBERS slices */
    SLICE = REGION / NMEMBERS,      /* what one writer owns in a destination */
    WRITES = 8,                     /* per peer and cycle */
    WLEN = SLICE / WRITES,          /* 32 KiB */
    MSG_MAX = 16384,                /* hub messages */
    KILL_EVERY = 25,                /* cycles between two kills */
    FINAL_POLLS = 20 * 1000 * 1000, /* bound of the final exchange's loops */
};

enum msg_type { M_HELLO = 1, M_PEERS, M_HOLD, M_DONE, M_FINAL, M_FINAL_OK, M_EXIT };

/* ---------------------------------------------------------------- hub messages */

struct msg {
    uint32_t type, n;
    uint8_t b[MSG_MAX];
};

static void msg_put(struct msg *m, const void *p, uint32_t len)
{
    CHECK(m->n + 4 + len <= sizeof(m->b));
    memcpy(m->b + m->n, &len, 4);
    memcpy(m->b + m->n + 4, p, len);
    m->n += 4 + len;
}

/* The next item at *off (its length into *len), or NULL past the end. */
static const uint8_t *msg_get(const struct msg *m, uint32_t *off, uint32_t *len)
{
    if (*off + 4 > m->n)
        return NULL;
    memcpy(len, m->b + *off, 4);
    CHECK(*off + 4 + *len <= m->n);
    const uint8_t *p = m->b + *off + 4;
    *off += 4 + *len;
    return p;
}

static bool msg_send(int fd, const struct msg *m)
{
    size_t len = 8 + m->n;
    ssize_t k;
    do
        k = send(fd, m, len, MSG_NOSIGNAL);
    while (k < 0 && errno == EINTR);
    return k == (ssize_t)len;
}

/* 1: a message, 0: the other side is gone, -1: nothing within ms. */
static int msg_recv(int fd, struct msg *m, int ms)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};
    int r = poll(&p, 1, ms);
    if (r <= 0)
        return -1;
    ssize_t k;
    do
        k = recv(fd, m, sizeof(*m), 0);
    while (k < 0 && errno == EINTR);
    if (k <= 0)
        return 0;
    CHECK(k >= 8 && (size_t)k == 8 + m->n);
    return 1;
}

/* ---------------------------------------------------------------- a member */

static uint64_t rnd_next(uint64_t *s)
{
    *s += 0x9e3779b97f4a7c15ull;
    uint64_t z = *s;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint8_t pattern(uint32_t writer, uint64_t i)
{
    return (uint8_t)(((i + 1) * 2654435761u + writer * 97u) >> 11);
}

struct member {
    int idx, fd;
    const char *domain;
    uint64_t rng;
    struct wb_tx *tx;
    uint8_t *src, *dst;
    struct wb_tx_mr *src_mr, *dst_mr;
    uint32_t npeers;
    uint32_t peer_idx[NMEMBERS]; /* transport peer -> member index */
    struct wb_tx_rdesc desc[NMEMBERS];
    uint8_t *seen; /* per write ctx: events seen */
    uint32_t nwrites;
    uint64_t events, errors;
};

/* op_timeout: what ends a write to a peer that closed since it published its address (its
 * connection refused, or its process gone) in the cycles; generous for the final exchange, where
 * every write must land. */
static void member_open(struct member *me, bool final)
{
    char yaml[256];
    snprintf(yaml, sizeof(yaml), "backend: fabric\nprovider: tcp\ndomain: %s\nop_timeout: %s\n",
             me->domain, final ? "120s" : "2s");
    struct wb_errlist el;
    wb_errlist_init(&el);
    int r = wb_test_tx_open(yaml, &el, &me->tx);
    if (r)
        wb_errlist_print(&el, "    ", stderr);
    CHECK_INT(r, 0);
    wb_errlist_free(&el);
    CHECK_INT(wb_tx_mr_reg(me->tx, me->src, SLICE, WB_TX_ACCESS_SRC, &me->src_mr), 0);
    CHECK_INT(wb_tx_mr_reg(me->tx, me->dst, REGION, WB_TX_ACCESS_DST, &me->dst_mr), 0);
    me->npeers = 0;
}

/* HELLO: this transport's address and region descriptor. */
static void member_hello_msg(struct member *me, struct msg *out)
{
    struct msg m = {.type = M_HELLO};
    struct wb_mpw w;
    wb_mpw_init(&w);
    CHECK_INT(wb_tx_addr(me->tx, &w), 0);
    msg_put(&m, w.buf, (uint32_t)w.len);
    wb_mpw_free(&w);
    struct wb_tx_rdesc d;
    CHECK_INT(wb_tx_rdesc(me->tx, me->dst_mr, &d), 0);
    wb_mpw_init(&w);
    wb_tx_rdesc_put(&w, &d);
    CHECK_INT(wb_mpw_finish(&w), 0);
    msg_put(&m, w.buf, (uint32_t)w.len);
    wb_mpw_free(&w);
    *out = m;
}

static void member_hello(struct member *me)
{
    static struct msg m;
    member_hello_msg(me, &m);
    CHECK(msg_send(me->fd, &m));
}

/* PEERS/FINAL: items [idx, addr, desc] per other member. */
static void member_add_peers(struct member *me, const struct msg *m, uint32_t off)
{
    uint32_t len = 0;
    const uint8_t *p;
    while ((p = msg_get(m, &off, &len)) != NULL) {
        CHECK_INT(len, 4);
        uint32_t idx;
        memcpy(&idx, p, 4);
        const uint8_t *a = msg_get(m, &off, &len);
        CHECK(a);
        struct wb_mpr r;
        wb_mpr_init(&r, a, len);
        uint32_t peer = 0;
        int e = wb_tx_peer_add(me->tx, &r, &peer);
        if (e)
            fprintf(stderr, "    member %d: peer_add: %s\n", me->idx, wb_tx_errmsg(me->tx));
        CHECK_INT(e, 0);
        CHECK_INT(peer, me->npeers);
        const uint8_t *d = msg_get(m, &off, &len);
        CHECK(d);
        wb_mpr_init(&r, d, len);
        CHECK_INT(wb_tx_rdesc_get(&r, &me->desc[peer]), 0);
        me->peer_idx[peer] = idx;
        me->npeers++;
    }
}

/* Queues WRITES writes with immediate (tag: this member's index + 1) to every peer, into this
 * member's slice of the peer's region, then a fence. ctx numbers every write of the cycle. */
static void member_write_all(struct member *me)
{
    me->nwrites = 0;
    for (uint32_t p = 0; p < me->npeers; p++) {
        for (uint32_t k = 0; k < WRITES; k++) {
            struct wb_tx_write w = {.src = me->src_mr,
                                    .src_off = (uint64_t)k * WLEN,
                                    .peer = p,
                                    .dst = &me->desc[p],
                                    .dst_off = (uint64_t)me->idx * SLICE + (uint64_t)k * WLEN,
                                    .len = WLEN,
                                    .has_imm = true,
                                    .imm = (uint32_t)me->idx + 1,
                                    .ctx = (void *)(uintptr_t)(me->nwrites + 1)};
            int e = wb_tx_write(me->tx, &w);
            if (e == -WB_E_PEER) /* failed already (in this cycle's polls: not yet here) */
                continue;
            CHECK_INT(e, 0);
            me->nwrites++;
        }
        int e = wb_tx_fence(me->tx, p, (void *)(uintptr_t)(me->nwrites + 1));
        if (e != -WB_E_PEER) {
            CHECK_INT(e, 0);
            me->nwrites++;
        }
    }
    memset(me->seen, 0, (size_t)NMEMBERS * (WRITES + 1) + 1);
    me->events = me->errors = 0;
}

/* One poll; checks every event. Returns the number of write events. */
static uint64_t member_poll(struct member *me, bool final)
{
    struct wb_tx_event ev[64];
    ssize_t n = wb_tx_poll(me->tx, ev, 64);
    CHECK(n >= 0);
    uint64_t writes = 0;
    for (ssize_t i = 0; i < n; i++) {
        if (ev[i].kind == WB_TX_EV_IMM)
            continue; /* counted by the caller through wb_tx_imm_count / expectations */
        CHECK_INT(ev[i].kind, WB_TX_EV_WRITE);
        uintptr_t c = (uintptr_t)ev[i].ctx;
        CHECK(c >= 1 && c <= me->nwrites);
        if (me->seen[c]++)
            wb_test_fail(__FILE__, __LINE__, "member %d: write %zu reported twice", me->idx,
                         (size_t)c);
        writes++;
        me->events++;
        if (ev[i].err) {
            me->errors++;
            /* a peer that closed or died: the provider's own error for the operation that
             * met it (-ECANCELED, -ECONNRESET...), -WB_E_PEER for the rest, -ETIMEDOUT */
            if (final || ev[i].err > 0)
                wb_test_fail(__FILE__, __LINE__, "member %d: write %zu failed: %d (%s)", me->idx,
                             (size_t)c, ev[i].err, wb_strerror(ev[i].err));
        }
    }
    if (n == 0)
        sched_yield();
    return writes;
}

static void member_close(struct member *me)
{
    /* deliberately no draining: whatever is in flight is cancelled by the close */
    wb_tx_close(me->tx);
    me->tx = NULL;
}

/* The number of polls before this cycle's close: none, a few, many, or until every write has
 * reported (then a few hundred more, while peers may still be writing here). */
static uint64_t polls_for(struct member *me, bool *until_done)
{
    uint64_t r = rnd_next(&me->rng);
    *until_done = false;
    switch (r % 4) {
    case 0:
        return 0;
    case 1:
        return 1 + (r >> 8) % 20;
    case 2:
        return 20 + (r >> 8) % 2000;
    default:
        *until_done = true;
        return 200 + (r >> 8) % 300;
    }
}

static void member_cycle(struct member *me, const struct msg *peers)
{
    uint32_t off = 0, len = 0;
    const uint8_t *kill_at = msg_get(peers, &off, &len); /* polls until SIGKILL, 0: none */
    CHECK(kill_at && len == 8);
    uint64_t kill;
    memcpy(&kill, kill_at, 8);
    member_add_peers(me, peers, off);
    member_write_all(me);
    bool until_done;
    uint64_t polls = polls_for(me, &until_done);
    if (kill)
        polls = kill, until_done = false;
    if (until_done) {
        /* bounded: a write to a peer that vanished fails by op_timeout at the latest */
        for (uint64_t k = 0; me->events < me->nwrites && k < FINAL_POLLS; k++)
            member_poll(me, false);
    }
    for (uint64_t k = 0; k < polls; k++)
        member_poll(me, false);
    if (kill)
        raise(SIGKILL);
    struct msg m = {.type = M_DONE};
    uint64_t stats[3] = {me->nwrites, me->events, me->errors};
    msg_put(&m, stats, sizeof(stats));
    member_close(me);
    CHECK(msg_send(me->fd, &m));
}

/* The final exchange: every peer gets this member's slice, all of it must land. */
static void member_final(struct member *me, const struct msg *peers)
{
    member_add_peers(me, peers, 0);
    CHECK_INT(me->npeers, NMEMBERS - 1);
    memset(me->dst, 0, REGION);
    member_write_all(me);
    CHECK_INT(me->nwrites, (NMEMBERS - 1) * (WRITES + 1));
    for (uint32_t p = 0; p < me->npeers; p++)
        CHECK_INT(wb_tx_expect(me->tx, me->peer_idx[p] + 1, WRITES, NULL, NULL), 0);
    uint32_t reached = 0;
    for (uint64_t k = 0; (me->events < me->nwrites || reached < me->npeers) && k < FINAL_POLLS;
         k++) {
        struct wb_tx_event ev[64];
        ssize_t n = wb_tx_poll(me->tx, ev, 64);
        CHECK(n >= 0);
        for (ssize_t i = 0; i < n; i++) {
            if (ev[i].kind == WB_TX_EV_IMM) {
                reached++;
                continue;
            }
            uintptr_t c = (uintptr_t)ev[i].ctx;
            CHECK(c >= 1 && c <= me->nwrites);
            CHECK_INT(me->seen[c]++, 0);
            CHECK_INT(ev[i].err, 0);
            me->events++;
        }
        if (n == 0)
            sched_yield();
    }
    CHECK_U64(me->events, me->nwrites);
    CHECK_INT(reached, me->npeers);
    for (uint32_t p = 0; p < me->npeers; p++) {
        uint32_t w = me->peer_idx[p];
        const uint8_t *s = me->dst + (size_t)w * SLICE;
        for (uint64_t i = 0; i < SLICE; i++)
            if (s[i] != pattern(w, i))
                wb_test_fail(__FILE__, __LINE__,
                             "member %d: byte %" PRIu64 " from member %u is 0x%02x, expected "
                             "0x%02x",
                             me->idx, i, w, s[i], pattern(w, i));
    }
    CHECK_INT(me->dst[(size_t)me->idx * SLICE], 0); /* its own slice: nobody wrote it */
    struct msg m = {.type = M_FINAL_OK};
    CHECK(msg_send(me->fd, &m));
    /* polled until everyone is done: the others' writes here need this side's progress */
    struct msg in;
    for (;;) {
        member_poll(me, true);
        int r = msg_recv(me->fd, &in, 0);
        if (r == 0 || (r == 1 && in.type == M_EXIT))
            break;
    }
    member_close(me);
}

static void member_main(int idx, int fd, const char *domain, uint64_t seed)
{
    struct member me = {.idx = idx, .fd = fd, .domain = domain, .rng = seed};
    me.src = malloc(SLICE);
    me.dst = malloc(REGION);
    me.seen = calloc((size_t)NMEMBERS * (WRITES + 1) + 1, 1);
    CHECK(me.src && me.dst && me.seen);
    for (uint64_t i = 0; i < SLICE; i++)
        me.src[i] = pattern((uint32_t)idx, i);
    for (;;) {
        member_open(&me, false);
        member_hello(&me);
        struct msg m;
        int r;
        while ((r = msg_recv(fd, &m, 1000)) < 0)
            ;
        CHECK_INT(r, 1);
        if (m.type == M_PEERS) {
            member_cycle(&me, &m);
            continue;
        }
        CHECK_INT(m.type, M_HOLD);
        /* closed once more with nothing posted, opened for the final exchange */
        member_close(&me);
        member_open(&me, true);
        member_hello(&me);
        while ((r = msg_recv(fd, &m, 1000)) < 0)
            ;
        CHECK_INT(r, 1);
        CHECK_INT(m.type, M_FINAL);
        member_final(&me, &m);
        break;
    }
    free(me.src);
    free(me.dst);
    free(me.seen);
}

/* ---------------------------------------------------------------- the hub (test process) */

static int netns_id;

static void netns_cleanup(void)
{
    wb_test_sh("ip netns del wbchub%d", netns_id);
    for (int k = 0; k < NMEMBERS; k++)
        wb_test_sh("ip netns del wbc%d-%d", netns_id, k);
}

/* Namespaces of runs that were killed (their pid in the name is gone). */
static void sweep_netns(void)
{
    FILE *f = popen("ip netns list 2>/dev/null", "r");
    if (!f)
        return;
    char line[256];
    while (fgets(line, sizeof(line), f)) {
        int pid, k;
        if ((sscanf(line, "wbchub%d", &pid) == 1 || sscanf(line, "wbc%d-%d", &pid, &k) == 2) &&
            kill(pid, 0) != 0 && errno == ESRCH) {
            line[strcspn(line, " \n")] = 0;
            wb_test_sh("ip netns del %s", line);
        }
    }
    pclose(f);
}

/* Members in namespaces of their own on a bridge; every link's queue (both ends) is a token
 * bucket with a small queue, which drops what overflows it. Returns false (nothing left
 * behind) where this machine cannot. */
static bool lossy_links(int id)
{
    if (geteuid() != 0 || !wb_test_sh("command -v ip") || !wb_test_sh("command -v tc"))
        return false;
    sweep_netns();
    if (!wb_test_sh("ip netns add wbchub%d", id))
        return false;
    netns_id = id;
    wb_test_cleanup(netns_cleanup);
    bool ok = wb_test_sh("ip -n wbchub%d link add wbbr type bridge", id) &&
              wb_test_sh("ip -n wbchub%d link set wbbr up", id);
    int net = id % 200 + 20;
    for (int k = 0; ok && k < NMEMBERS; k++) {
        ok = wb_test_sh("ip netns add wbc%d-%d", id, k) &&
             wb_test_sh("ip -n wbc%d-%d link add wb0 type veth peer name p%d netns wbchub%d", id, k,
                        k, id) &&
             wb_test_sh("ip -n wbchub%d link set p%d master wbbr", id, k) &&
             wb_test_sh("ip -n wbchub%d link set p%d up", id, k) &&
             wb_test_sh("ip -n wbc%d-%d addr add 10.214.%d.%d/24 dev wb0", id, k, net, k + 1) &&
             wb_test_sh("ip -n wbc%d-%d link set wb0 up", id, k) &&
             wb_test_sh("ip -n wbc%d-%d link set lo up", id, k) &&
             wb_test_sh(
                 "ip netns exec wbc%d-%d tc qdisc add dev wb0 root tbf rate 400mbit burst 32kb "
                 "limit 48kb",
                 id, k) &&
             wb_test_sh(
                 "ip netns exec wbchub%d tc qdisc add dev p%d root tbf rate 400mbit burst 32kb "
                 "limit 48kb",
                 id, k);
    }
    if (!ok)
        netns_cleanup();
    return ok;
}

static void enter_netns(int id, int k)
{
    char path[128];
    snprintf(path, sizeof(path), "/var/run/netns/wbc%d-%d", id, k);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    CHECK(fd >= 0);
    CHECK_INT(setns(fd, CLONE_NEWNET), 0);
    close(fd);
}

struct hub {
    bool netns;
    int id;
    pid_t pid[NMEMBERS];
    int fd[NMEMBERS];
    uint32_t gen[NMEMBERS];
    bool have[NMEMBERS], holding[NMEMBERS], final_hello[NMEMBERS], final_ok[NMEMBERS];
    struct msg hello[NMEMBERS]; /* each member's latest HELLO */
    pid_t busy;
};

static void spawn(struct hub *h, int k)
{
    int sv[2];
    CHECK_INT(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
    fflush(NULL);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        close(sv[0]);
        for (int j = 0; j < NMEMBERS; j++)
            if (j != k && h->fd[j] >= 0)
                close(h->fd[j]);
        if (h->netns) {
            enter_netns(h->id, k);
            cpu_set_t one; /* every member on CPU 0, with the busy loop */
            CPU_ZERO(&one);
            CPU_SET(0, &one);
            sched_setaffinity(0, sizeof(one), &one);
        }
        member_main(k, sv[1], h->netns ? "wb0" : "lo",
                    0x5eed0000ull + (uint64_t)k * 1000 + h->gen[k]);
        exit(0); /* not _exit: LeakSanitizer checks at exit */
    }
    close(sv[1]);
    h->pid[k] = pid;
    h->fd[k] = sv[0];
    h->have[k] = false;
}

/* PEERS or FINAL for member k: everyone else's latest HELLO. */
static void peers_msg(const struct hub *h, int k, uint32_t type, uint64_t kill_at, struct msg *m)
{
    m->type = type;
    m->n = 0;
    if (type == M_PEERS)
        msg_put(m, &kill_at, 8);
    for (int j = 0; j < NMEMBERS; j++) {
        if (j == k || !h->have[j])
            continue;
        uint32_t idx = (uint32_t)j;
        msg_put(m, &idx, 4);
        uint32_t off = 0, len = 0;
        const uint8_t *a = msg_get(&h->hello[j], &off, &len);
        msg_put(m, a, len);
        const uint8_t *d = msg_get(&h->hello[j], &off, &len);
        msg_put(m, d, len);
    }
}

static unsigned churn_cycles(void)
{
    const char *s = getenv("WB_CHURN_CYCLES");
    unsigned n = s ? (unsigned)strtoul(s, NULL, 10) : 200;
    return n ? n : 200;
}

static void test_churn(void)
{
    struct hub h;
    memset(&h, 0, sizeof(h));
    h.id = (int)getpid();
    h.netns = lossy_links(h.id);
    printf("    %s\n", h.netns ? "lossy links between network namespaces, one CPU shared with a "
                                 "busy loop"
                               : "loopback (no network namespaces here)");
    fflush(stdout);
    for (int k = 0; k < NMEMBERS; k++)
        h.fd[k] = -1;
    if (h.netns) {
        fflush(NULL);
        h.busy = fork();
        CHECK(h.busy >= 0);
        if (h.busy == 0) {
            cpu_set_t one;
            CPU_ZERO(&one);
            CPU_SET(0, &one);
            sched_setaffinity(0, sizeof(one), &one);
            for (volatile uint64_t x = 0;; x++)
                ;
        }
    }
    for (int k = 0; k < NMEMBERS; k++)
        spawn(&h, k);
    unsigned target = churn_cycles(), cycles = 0, kills = 0, holding = 0, oks = 0;
    uint64_t writes = 0, events = 0, errors = 0;
    uint64_t rng = 0xc0ffee;
    int victim = -1;
    bool final_sent = false;
    while (oks < NMEMBERS) {
        struct pollfd p[NMEMBERS];
        for (int k = 0; k < NMEMBERS; k++)
            p[k] = (struct pollfd){.fd = h.fd[k], .events = POLLIN};
        int r = poll(p, NMEMBERS, 1000);
        CHECK(r >= 0 || errno == EINTR);
        for (int k = 0; k < NMEMBERS; k++) {
            if (!(p[k].revents & (POLLIN | POLLHUP | POLLERR)))
                continue;
            struct msg m;
            int got = msg_recv(h.fd[k], &m, 0);
            if (got < 0)
                continue;
            if (got == 0) { /* it ended: killed by the test, or it failed */
                int st = 0;
                CHECK_INT(waitpid(h.pid[k], &st, 0), h.pid[k]);
                close(h.fd[k]);
                h.fd[k] = -1;
                if (k == victim && WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL) {
                    victim = -1;
                    h.gen[k]++;
                    spawn(&h, k);
                    continue;
                }
                if (WIFSIGNALED(st))
                    wb_test_fail(__FILE__, __LINE__, "member %d died of signal %d (%s)", k,
                                 WTERMSIG(st), strsignal(WTERMSIG(st)));
                wb_test_fail(__FILE__, __LINE__, "member %d exited with status %d", k,
                             WEXITSTATUS(st));
            }
            if (m.type == M_HELLO && h.holding[k]) { /* opened for the final exchange */
                CHECK(!h.final_hello[k]);
                h.hello[k] = m;
                h.final_hello[k] = true;
                holding++;
            } else if (m.type == M_HELLO) {
                h.hello[k] = m;
                h.have[k] = true;
                if (cycles >= target && victim < 0) {
                    struct msg hold = {.type = M_HOLD};
                    CHECK(msg_send(h.fd[k], &hold));
                    h.holding[k] = true;
                    continue;
                }
                uint64_t kill_at = 0;
                if (victim < 0 && cycles / KILL_EVERY > kills && cycles < target) {
                    victim = k;
                    kills++;
                    kill_at = 1 + rnd_next(&rng) % 400;
                }
                struct msg out;
                peers_msg(&h, k, M_PEERS, kill_at, &out);
                CHECK(msg_send(h.fd[k], &out));
            } else if (m.type == M_DONE) {
                uint64_t st[3];
                uint32_t off = 0, len = 0;
                const uint8_t *s = msg_get(&m, &off, &len);
                CHECK(s && len == sizeof(st));
                memcpy(st, s, sizeof(st));
                CHECK(st[1] <= st[0] && st[2] <= st[1]);
                writes += st[0], events += st[1], errors += st[2];
                cycles++;
            } else if (m.type == M_FINAL_OK) {
                CHECK(!h.final_ok[k]);
                h.final_ok[k] = true;
                oks++;
            } else {
                wb_test_fail(__FILE__, __LINE__, "member %d sent message type %u", k, m.type);
            }
        }
        if (!final_sent && holding == NMEMBERS) {
            for (int k = 0; k < NMEMBERS; k++) {
                struct msg out;
                peers_msg(&h, k, M_FINAL, 0, &out);
                CHECK(msg_send(h.fd[k], &out));
            }
            final_sent = true;
        }
    }
    struct msg bye = {.type = M_EXIT};
    for (int k = 0; k < NMEMBERS; k++)
        CHECK(msg_send(h.fd[k], &bye));
    for (int k = 0; k < NMEMBERS; k++) {
        int st = 0;
        CHECK_INT(waitpid(h.pid[k], &st, 0), h.pid[k]);
        if (WIFSIGNALED(st))
            wb_test_fail(__FILE__, __LINE__,
                         "member %d died of signal %d (%s) after the final "
                         "exchange",
                         k, WTERMSIG(st), strsignal(WTERMSIG(st)));
        CHECK_INT(WEXITSTATUS(st), 0);
        close(h.fd[k]);
    }
    if (h.busy > 0) {
        kill(h.busy, SIGKILL);
        waitpid(h.busy, NULL, 0);
    }
    printf("    %u cycles (%u members killed mid-transfer): %" PRIu64 " writes queued, %" PRIu64
           " reported before their transport closed (%" PRIu64 " failed: peer gone); final "
           "exchange exact\n",
           cycles, kills, writes, events, errors);
    CHECK(cycles >= target);
    CHECK_INT(kills, (target - 1) / KILL_EVERY);
}

/* A peer whose endpoint closed after it published its address: tcp;ofi_rxm refuses every write
 * to it (-FI_EAGAIN: it cannot connect, and tries again on each post), so op_timeout must count
 * for a write the provider never took, or the writer waits forever (it did: this test hung).
 * Each write is reported once, failed with -ETIMEDOUT, and the fence after them with -WB_E_PEER. */
static void test_closed_peer(void)
{
    struct member a = {.idx = 0, .fd = -1, .domain = "lo"},
                  b = {.idx = 1, .fd = -1, .domain = "lo"};
    struct member *ms[2] = {&a, &b};
    for (int k = 0; k < 2; k++) {
        ms[k]->src = calloc(SLICE, 1);
        ms[k]->dst = calloc(REGION, 1);
        ms[k]->seen = calloc((size_t)NMEMBERS * (WRITES + 1) + 1, 1);
        CHECK(ms[k]->src && ms[k]->dst && ms[k]->seen);
        member_open(ms[k], false);
    }
    static struct msg hello, peers;
    member_hello_msg(&b, &hello);
    peers.n = 0;
    uint32_t idx = 1, off = 0, len = 0;
    msg_put(&peers, &idx, 4);
    const uint8_t *p = msg_get(&hello, &off, &len);
    msg_put(&peers, p, len);
    p = msg_get(&hello, &off, &len);
    msg_put(&peers, p, len);
    member_add_peers(&a, &peers, 0);
    member_close(&b);
    member_write_all(&a);
    CHECK_INT(a.nwrites, WRITES + 1);
    uint64_t timedout = 0;
    for (uint64_t k = 0; a.events < a.nwrites && k < FINAL_POLLS; k++) {
        struct wb_tx_event ev[64];
        ssize_t n = wb_tx_poll(a.tx, ev, 64);
        CHECK(n >= 0);
        for (ssize_t i = 0; i < n; i++) {
            CHECK_INT(ev[i].kind, WB_TX_EV_WRITE);
            uintptr_t c = (uintptr_t)ev[i].ctx;
            CHECK(c >= 1 && c <= a.nwrites);
            CHECK_INT(a.seen[c]++, 0);
            /* the writes time out; the fence after them fails with its peer */
            CHECK_INT(ev[i].err, c <= WRITES ? -ETIMEDOUT : -WB_E_PEER);
            timedout += c <= WRITES;
            a.events++;
        }
        if (n == 0)
            sched_yield();
    }
    CHECK_U64(timedout, WRITES);
    member_close(&a);
    for (int k = 0; k < 2; k++) {
        free(ms[k]->src);
        free(ms[k]->dst);
        free(ms[k]->seen);
    }
}

const struct wb_test wb_tests[] = {
    {"closed_peer", test_closed_peer, 120},
    {"churn", test_churn, 900},
    {0},
};
