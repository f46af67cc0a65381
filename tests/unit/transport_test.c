/* transport_test.c — unit tests of transport/ that need no second process: the config table
 * (YAML, defaults, validation), opening errors per backend, the descriptor and address wire
 * codecs (malformed input), registration rules, immediate counters driven through two real
 * tcp transports in one process, zero-length writes, close with work still queued, and the
 * CUDA IPC mailbox (plain shared memory, so it runs without a GPU). The two-process behaviour
 * of every backend is in tests/func/transport_conf_test.c. */
#include "tests/txtest.h"
#include "tests/wbtest.h"
#include "transport/cudaipc/cudaipc.h"
#include "transport/transport.h"
#include "transport/tx_priv.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

/* ---------------------------------------------------------------- helpers */

static struct wb_tx *open_ok(const char *yaml)
{
    struct wb_errlist el;
    wb_errlist_init(&el);
    struct wb_tx *tx = NULL;
    int r = wb_test_tx_open(yaml, &el, &tx);
    if (r)
        wb_errlist_print(&el, "    ", stderr);
    CHECK_INT(r, 0);
    wb_errlist_free(&el);
    return tx;
}

/* Opens yaml expecting failure r with exactly one message msg. */
static void open_fails(const char *yaml, int r, const char *msg)
{
    struct wb_errlist el;
    wb_errlist_init(&el);
    struct wb_tx *tx = NULL;
    CHECK_INT(wb_test_tx_open(yaml, &el, &tx), r);
    CHECK(tx == NULL);
    CHECK_INT(el.n, 1);
    CHECK_STR(el.msgs[0], msg);
    wb_errlist_free(&el);
}

/* Adds b as a's peer (blob through the wire codec). */
static uint32_t connect(struct wb_tx *a, struct wb_tx *b)
{
    struct wb_mpw w;
    wb_mpw_init(&w);
    CHECK_INT(wb_tx_addr(b, &w), 0);
    struct wb_mpr r;
    wb_mpr_init(&r, w.buf, w.len);
    uint32_t peer = 99;
    CHECK_INT(wb_tx_peer_add(a, &r, &peer), 0);
    CHECK_INT(wb_mpr_end(&r), 0);
    wb_mpw_free(&w);
    return peer;
}

static const char *const TCP = "provider: tcp\ndomain: lo\n";

/* ---------------------------------------------------------------- config */

static void test_cfg_defaults(void)
{
    struct wb_tx_cfg c;
    memset(&c, 0, sizeof(c));
    CHECK_INT(wb_cfg_defaults(wb_tx_cfg_fields, &c), 0);
    CHECK_INT(c.backend, WB_TX_FABRIC);
    CHECK_STR(c.provider, "tcp");
    CHECK_STR(c.domain, "");
    CHECK_U64(c.rails, 0); /* the backend's own */
    CHECK_U64(c.shard_size, 1u << 20);
    CHECK_U64(c.window, 0);
    CHECK_U64(c.bounce_size, 2u << 20);
    CHECK_U64(c.bounce_chunks, 16);
    CHECK_U64(c.op_timeout, 30000000000ull);
    CHECK_INT(c.device, -1);
    CHECK_INT(c.hmem, WB_TX_HMEM_AUTO);
    CHECK(!c.stage_host);
    wb_cfg_free(wb_tx_cfg_fields, &c);
}

/* The table nests in a bigger config as a section, loaded by the common loader. */
struct agent_cfg {
    char *name;
    struct wb_tx_cfg tx;
};

static const struct wb_cfg_field agent_fields[] = {
    {"name", WB_CFG_STR, "agent", "agent name", offsetof(struct agent_cfg, name), NULL, NULL},
    {"transport", WB_CFG_SECTION, "", "data path", offsetof(struct agent_cfg, tx), NULL,
     wb_tx_cfg_fields},
    {0},
};

static void test_cfg_yaml_section(void)
{
    const char *path = wb_test_write_file("agent.yaml", "name: rollout-3\n"
                                                        "transport:\n"
                                                        "  backend: fabric\n"
                                                        "  provider: efa\n"
                                                        "  domain: rdmap16s27-rdm,rdmap32s27-rdm\n"
                                                        "  rails: 2\n"
                                                        "  shard_size: 4MiB\n"
                                                        "  op_timeout: 2.5s\n");
    struct wb_errlist el;
    wb_errlist_init(&el);
    struct wb_yaml *y = NULL;
    struct agent_cfg a;
    memset(&a, 0, sizeof(a));
    CHECK_INT(wb_yaml_load(path, &el, &y), 0);
    CHECK_INT(wb_cfg_parse(y, wb_yaml_root(y), agent_fields, &a, &el), 0);
    CHECK_STR(a.name, "rollout-3");
    CHECK_STR(a.tx.provider, "efa");
    CHECK_STR(a.tx.domain, "rdmap16s27-rdm,rdmap32s27-rdm");
    CHECK_U64(a.tx.rails, 2);
    CHECK_U64(a.tx.shard_size, 4u << 20);
    CHECK_U64(a.tx.op_timeout, 2500000000ull);
    CHECK_U64(a.tx.cq_batch, 64); /* default */
    wb_cfg_free(agent_fields, &a);
    wb_yaml_free(y);

    /* Unknown and mistyped keys are reported with their place. */
    memset(&a, 0, sizeof(a));
    CHECK_INT(wb_yaml_load_string("bad.yaml", "transport:\n  railz: 2\n  backend: nccl\n", &el, &y),
              0);
    CHECK_INT(wb_cfg_parse(y, wb_yaml_root(y), agent_fields, &a, &el), -WB_E_CONFIG);
    CHECK_INT(el.n, 2);
    CHECK_STR(el.msgs[0], "bad.yaml:2:3: transport.railz: unknown key");
    CHECK_STR(el.msgs[1],
              "bad.yaml:3:12: transport.backend: expected one of fabric|cudaipc|verbs, got 'nccl'");
    wb_cfg_free(agent_fields, &a);
    wb_yaml_free(y);
    wb_errlist_free(&el);
}

static void test_cfg_invalid(void)
{
    open_fails("rails: 9\n", -EINVAL, "transport.rails: 9 is outside 1..8");
    open_fails("shard_size: 100\n", -EINVAL, "transport.shard_size: 100 is below 4096 bytes");
    open_fails("bounce_size: 5000\n", -EINVAL,
               "transport.bounce_size: 5000 is not a multiple of 4096 bytes");
    open_fails("cq_batch: 5000\n", -EINVAL, "transport.cq_batch: 5000 is outside 1..1024");
}

/* ---------------------------------------------------------------- opening */

static void test_open_errors(void)
{
    open_fails("backend: verbs\n", -ENOTSUP,
               "transport.backend: 'verbs' (libibverbs RC) is not implemented yet; use 'fabric' "
               "with provider 'verbs;ofi_rxm'");
    open_fails("provider: nosuchprov\n", -WB_E_FABRIC,
               "transport.provider: 'nosuchprov' offers no FI_EP_RDM endpoint with RMA writes "
               "and messages: fi_getinfo: No data available");
    struct wb_errlist el;
    wb_errlist_init(&el);
    struct wb_tx *tx = NULL;
    CHECK_INT(wb_test_tx_open("provider: tcp\ndomain: nosuchif0\n", &el, &tx), -EINVAL);
    CHECK_INT(el.n, 1);
    const char *want = "transport.domain: provider 'tcp' has no domain 'nosuchif0' with remote CQ "
                       "data (it has: "; /* then this machine's interfaces */
    CHECK(strncmp(el.msgs[0], want, strlen(want)) == 0);
    wb_errlist_free(&el);
    if (!wb_gpu_built())
        open_fails("backend: cudaipc\n", -ENOTSUP,
                   "transport.backend: cudaipc needs a CUDA build (this one has CUDA=0)");
    else if (wb_gpu_count() == 0)
        open_fails("backend: cudaipc\n", -WB_E_NOGPU,
                   "transport.backend: cudaipc needs a GPU and none is usable");
}

/* A job names its data path by provider; the transport, not its caller, maps that to a
 * backend, and rails: 0 takes the backend's own default. */
static void test_cfg_provider(void)
{
    struct wb_tx_cfg c;
    memset(&c, 0, sizeof(c));
    CHECK_INT(wb_cfg_defaults(wb_tx_cfg_fields, &c), 0);
    CHECK_INT(wb_tx_cfg_provider(&c, "shm"), 0);
    CHECK_INT(c.backend, WB_TX_FABRIC);
    CHECK_STR(c.provider, "shm");
    CHECK_INT(wb_tx_cfg_provider(&c, "cuda_ipc"), 0);
    CHECK_INT(c.backend, WB_TX_CUDAIPC);
    CHECK_INT(wb_tx_cfg_provider(&c, "cudaipc"), 0);
    CHECK_INT(c.backend, WB_TX_CUDAIPC);
    CHECK_INT(wb_tx_cfg_provider(&c, "tcp"), 0);
    CHECK_INT(c.backend, WB_TX_FABRIC);
    free(c.domain);
    c.domain = strdup("lo");
    struct wb_errlist el;
    struct wb_tx *tx = NULL;
    struct wb_tx_caps caps;
    wb_errlist_init(&el);
    CHECK_INT(wb_tx_open(&c, &el, &tx), 0);
    CHECK_INT(wb_tx_query(tx, &caps), 0);
    CHECK_INT(caps.rails, 1);
    wb_tx_close(tx);
    wb_cfg_free(wb_tx_cfg_fields, &c);
    wb_errlist_free(&el);
}

static void test_query(void)
{
    struct wb_tx *tx = open_ok("provider: tcp\ndomain: lo\nrails: 2\n");
    struct wb_tx_caps c;
    CHECK_INT(wb_tx_query(tx, &c), 0);
    CHECK_STR(c.name, "fabric/tcp;ofi_rxm");
    CHECK_INT(c.rails, 2);
    CHECK_U64(c.max_write, UINT64_MAX);
    CHECK(c.max_op > 0);
    CHECK(c.mem_host);
    CHECK_INT(c.mem_cuda, wb_gpu_count() > 0);
    CHECK(!c.gpu_direct || c.mem_cuda); /* FI_HMEM only counts where CUDA memory exists */
    CHECK(c.needs_reg);
    CHECK(!c.same_host);
    CHECK_INT(c.imm_bits, 32);
    wb_tx_close(tx);
    tx = open_ok("provider: shm\n");
    CHECK_INT(wb_tx_query(tx, &c), 0);
    CHECK_STR(c.name, "fabric/shm");
    CHECK(c.same_host);
    wb_tx_close(tx);
}

/* ---------------------------------------------------------------- wire codecs */

static void test_rdesc_wire(void)
{
    struct wb_tx_rdesc d, e;
    memset(&d, 0, sizeof(d));
    d.backend = WB_TX_CUDAIPC;
    d.flags = WB_TX_RDESC_STAGED;
    d.owner = 0x1234567890abcdefull;
    d.id = 42;
    d.size = 1ull << 40;
    d.base = 4096;
    d.nrails = 3;
    for (int i = 0; i < 3; i++)
        d.rail[i].addr = 0x7f0000000000ull + (uint64_t)i, d.rail[i].key = 100u + (uint64_t)i;
    d.opaque_len = 64;
    for (int i = 0; i < 64; i++)
        d.opaque[i] = (uint8_t)i;
    struct wb_mpw w;
    wb_mpw_init(&w);
    wb_tx_rdesc_put(&w, &d);
    CHECK_INT(wb_mpw_finish(&w), 0);
    struct wb_mpr r;
    wb_mpr_init(&r, w.buf, w.len);
    memset(&e, 0xff, sizeof(e));
    CHECK_INT(wb_tx_rdesc_get(&r, &e), 0);
    CHECK_INT(wb_mpr_end(&r), 0);
    CHECK_MEM(&e, &d, sizeof(d));
    /* Every truncation is malformed, and leaves the output untouched. */
    for (size_t cut = 0; cut < w.len; cut++) {
        wb_mpr_init(&r, w.buf, cut);
        memset(&e, 0x5a, sizeof(e));
        CHECK_INT(wb_tx_rdesc_get(&r, &e), -EBADMSG);
        CHECK_INT(e.nrails, 0x5a5a5a5a);
    }
    wb_mpw_free(&w);

    /* Another version; too many rails; an opaque part too long; zero rails. */
    wb_mpw_init(&w);
    wb_mpw_array(&w, 9);
    wb_mpw_u64(&w, 3);
    for (int i = 0; i < 8; i++)
        wb_mpw_u64(&w, 0);
    wb_mpr_init(&r, w.buf, w.len);
    CHECK_INT(wb_tx_rdesc_get(&r, &e), -WB_E_VERSION);
    wb_mpw_free(&w);
    for (int variant = 0; variant < 3; variant++) {
        wb_mpw_init(&w);
        wb_mpw_array(&w, 9);
        for (int i = 0; i < 7; i++)
            wb_mpw_u64(&w, i == 0 ? 2 : 0);
        uint32_t nr = variant == 0 ? 9 : variant == 1 ? 1 : 0;
        wb_mpw_array(&w, nr);
        for (uint32_t i = 0; i < nr; i++) {
            wb_mpw_array(&w, 2);
            wb_mpw_u64(&w, 1);
            wb_mpw_u64(&w, 2);
        }
        uint8_t big[WB_TX_RDESC_OPAQUE + 1] = {0};
        wb_mpw_bin(&w, big, variant == 1 ? sizeof(big) : 4);
        wb_mpr_init(&r, w.buf, w.len);
        CHECK_INT(wb_tx_rdesc_get(&r, &e), -EBADMSG);
        wb_mpw_free(&w);
    }
}

static void test_addr_blob(void)
{
    struct wb_tx *a = open_ok(TCP), *s = open_ok("provider: shm\n");
    uint32_t peer;
    struct wb_mpw w;
    struct wb_mpr r;
    /* Its own blob. */
    wb_mpw_init(&w);
    CHECK_INT(wb_tx_addr(a, &w), 0);
    wb_mpr_init(&r, w.buf, w.len);
    CHECK_INT(wb_tx_peer_add(a, &r, &peer), -EEXIST);
    CHECK_STR(wb_tx_errmsg(a), "peer address: the blob is this transport's own");
    /* Every truncation is refused. */
    for (size_t cut = 0; cut < w.len; cut++) {
        wb_mpr_init(&r, w.buf, cut);
        CHECK(wb_tx_peer_add(a, &r, &peer) < 0);
    }
    wb_mpw_free(&w);
    /* Another provider. */
    wb_mpw_init(&w);
    CHECK_INT(wb_tx_addr(s, &w), 0);
    wb_mpr_init(&r, w.buf, w.len);
    CHECK_INT(wb_tx_peer_add(a, &r, &peer), -EPROTO);
    CHECK_STR(wb_tx_errmsg(a), "peer address: peer uses provider 'shm', this one 'tcp;ofi_rxm'");
    wb_mpw_free(&w);
    /* Another version, another backend. */
    wb_mpw_init(&w);
    wb_mpw_array(&w, 7);
    wb_mpw_u64(&w, 9);
    for (int i = 0; i < 6; i++)
        wb_mpw_u64(&w, 0);
    wb_mpr_init(&r, w.buf, w.len);
    CHECK_INT(wb_tx_peer_add(a, &r, &peer), -WB_E_VERSION);
    CHECK_STR(wb_tx_errmsg(a), "peer address: version 9, this build reads version 1");
    wb_mpw_free(&w);
    wb_mpw_init(&w);
    wb_mpw_array(&w, 7);
    wb_mpw_u64(&w, 1);
    wb_mpw_u64(&w, WB_TX_CUDAIPC);
    wb_mpw_u64(&w, 5);
    wb_mpw_str(&w, "host");
    wb_mpw_i64(&w, 1);
    wb_mpw_u64(&w, 1);
    wb_mpw_nil(&w);
    wb_mpr_init(&r, w.buf, w.len);
    CHECK_INT(wb_tx_peer_add(a, &r, &peer), -EPROTO);
    CHECK_STR(wb_tx_errmsg(a), "peer address: peer uses backend cudaipc, this one is fabric");
    wb_mpw_free(&w);
    wb_tx_close(a);
    wb_tx_close(s);
}

/* ---------------------------------------------------------------- in one process */

struct pair {
    struct wb_tx *a, *b;
    uint8_t *src, *dst;
    struct wb_tx_mr *smr, *dmr;
    struct wb_tx_rdesc d;
    uint32_t peer;
};

enum { PSZ = 1 << 20 };

/* Two transports, a -> b, with `size` bytes registered at each end (src: a pattern, dst:
 * zeros). */
static void pair_open_size(struct pair *p, const char *yaml, size_t size)
{
    memset(p, 0, sizeof(*p));
    p->a = open_ok(yaml);
    p->b = open_ok(yaml);
    p->peer = connect(p->a, p->b);
    CHECK_INT(p->peer, 0);
    CHECK_INT(connect(p->b, p->a), 0);
    p->src = malloc(size);
    p->dst = calloc(1, size);
    CHECK(p->src && p->dst);
    for (size_t i = 0; i < size; i++)
        p->src[i] = (uint8_t)(i % 251 + 1); /* never 0: a byte in place differs from none */
    CHECK_INT(wb_tx_mr_reg(p->a, p->src, size, WB_TX_ACCESS_SRC, &p->smr), 0);
    CHECK_INT(wb_tx_mr_reg(p->b, p->dst, size, WB_TX_ACCESS_DST, &p->dmr), 0);
    CHECK_INT(wb_tx_rdesc(p->b, p->dmr, &p->d), 0);
}

static void pair_open(struct pair *p, const char *yaml)
{
    pair_open_size(p, yaml, PSZ);
}

static void pair_close(struct pair *p)
{
    CHECK_INT(wb_tx_mr_dereg(p->a, p->smr), 0);
    CHECK_INT(wb_tx_mr_dereg(p->b, p->dmr), 0);
    wb_tx_close(p->a);
    wb_tx_close(p->b);
    free(p->src);
    free(p->dst);
}

/* Polls both until a has n write events (each without error) and b has `imm` events, calling
 * on_b(event, arg) for each of b's as it comes. */
static void pair_run_cb(struct pair *p, int n, int imm,
                        void (*on_b)(const struct wb_tx_event *, void *), void *arg)
{
    struct wb_tx_event ev[64];
    int got = 0, gimm = 0;
    while (got < n || gimm < imm) {
        ssize_t k = wb_tx_poll(p->a, ev, 64);
        CHECK(k >= 0);
        for (ssize_t i = 0; i < k; i++) {
            CHECK_INT(ev[i].kind, WB_TX_EV_WRITE);
            CHECK_INT(ev[i].err, 0);
            got++;
        }
        k = wb_tx_poll(p->b, ev, 64);
        CHECK(k >= 0);
        for (ssize_t i = 0; i < k; i++, gimm++)
            on_b(&ev[i], arg);
    }
    CHECK_INT(got, n);
    CHECK_INT(gimm, imm);
}

struct collect {
    struct wb_tx_event *out;
    int n;
};

static void collect(const struct wb_tx_event *ev, void *arg)
{
    struct collect *c = arg;
    c->out[c->n++] = *ev;
}

/* Polls both until a has n write events and b has `imm` IMM events (written to out). */
static void pair_run(struct pair *p, int n, int imm, struct wb_tx_event *out)
{
    struct collect c = {out, 0};
    pair_run_cb(p, n, imm, collect, &c);
}

static void test_register_rules(void)
{
    struct pair p;
    pair_open(&p, TCP);
    struct wb_tx_mr *m;
    struct wb_tx_rdesc d;
    CHECK_INT(wb_tx_mr_reg(p.a, p.src, 0, WB_TX_ACCESS_SRC, &m), -EINVAL);
    CHECK_INT(wb_tx_mr_reg(p.a, NULL, 10, WB_TX_ACCESS_SRC, &m), -EINVAL);
    CHECK_INT(wb_tx_mr_reg(p.a, p.src, 10, 0, &m), -EINVAL);
    CHECK_STR(wb_tx_errmsg(p.a), "register: need a pointer, a length and SRC/DST access");
    CHECK_INT(wb_tx_rdesc(p.a, p.smr, &d), -EINVAL);
    CHECK_STR(wb_tx_errmsg(p.a), "describe: region 1 is not registered as a write destination");
    CHECK_U64(p.smr->id, 1);
    CHECK(p.smr->mem == WB_TX_MEM_HOST && p.smr->device == -1);
    CHECK_U64(p.d.size, PSZ);
    CHECK_U64(p.d.owner, p.d.owner); /* opaque, but stable */
    CHECK_INT(p.d.nrails, 1);
    /* A destination region is not a write source. */
    struct wb_tx_write w = {
        .src = p.dmr, .peer = 0, .dst = &p.d, .len = 1, .has_imm = false, .ctx = NULL};
    CHECK_INT(wb_tx_write(p.b, &w), -EINVAL);
    CHECK_STR(wb_tx_errmsg(p.b),
              "write: descriptor of region 1 does not belong to peer 0"); /* its own region */
    /* Queued writes keep the source busy until they complete. */
    w = (struct wb_tx_write){.src = p.smr, .peer = p.peer, .dst = &p.d, .len = 4096};
    CHECK_INT(wb_tx_write(p.a, &w), 0);
    CHECK_INT(wb_tx_mr_dereg(p.a, p.smr), -EBUSY);
    CHECK_STR(wb_tx_errmsg(p.a), "deregister: region 1 has 1 operations in flight");
    struct wb_tx_event out[4];
    pair_run(&p, 1, 0, out);
    CHECK_MEM(p.dst, p.src, 4096);
    pair_close(&p);
}

static int cb_hits;
static void rearm_cb(void *arg, uint32_t tag)
{
    struct wb_tx *b = arg;
    cb_hits++;
    if (cb_hits == 1) /* re-arming from inside the callback is allowed */
        CHECK_INT(wb_tx_expect(b, tag, 2, rearm_cb, b), 0);
}

static void test_counters_inproc(void)
{
    struct pair p;
    pair_open(&p, TCP);
    struct wb_tx_event out[16];
    /* Arrivals before expect are counted. */
    for (int i = 0; i < 3; i++)
        CHECK_INT(wb_tx_write_imm(p.a, p.peer, 5, NULL), 0);
    pair_run(&p, 3, 0, out);
    struct wb_tx_event ev[8];
    while (wb_tx_imm_count(p.b, 5) < 3) {
        CHECK_INT(wb_tx_poll(p.b, ev, 8), 0);
    }
    CHECK_INT(wb_tx_expect(p.b, 5, 2, NULL, (void *)"five"), 0);
    CHECK_U64(wb_tx_imm_count(p.b, 5), 1); /* 2 taken by the reached expectation */
    CHECK_INT(wb_tx_poll(p.b, ev, 8), 1);
    CHECK_INT(ev[0].kind, WB_TX_EV_IMM);
    CHECK_INT(ev[0].tag, 5);
    CHECK_STR(ev[0].ctx, "five");
    CHECK_INT(wb_tx_poll(p.b, ev, 8), 0); /* once */
    /* A callback that re-arms: fires for 2, then for 2 more. */
    CHECK_INT(wb_tx_expect(p.b, 6, 2, rearm_cb, p.b), 0);
    for (int i = 0; i < 4; i++) {
        struct wb_tx_write w = {.src = p.smr,
                                .src_off = (uint64_t)i * 1000,
                                .peer = p.peer,
                                .dst = &p.d,
                                .dst_off = (uint64_t)i * 1000,
                                .len = 1000,
                                .has_imm = true,
                                .imm = 6};
        CHECK_INT(wb_tx_write(p.a, &w), 0);
    }
    pair_run(&p, 4, 0, out);
    while (cb_hits < 2) {
        CHECK_INT(wb_tx_poll(p.b, ev, 8), 0);
    }
    CHECK_INT(cb_hits, 2);
    CHECK_MEM(p.dst, p.src, 4000);
    /* A zero-length write without an immediate posts nothing and completes with its ctx. */
    struct wb_tx_write z = {.peer = p.peer, .dst = &p.d, .dst_off = PSZ, .ctx = (void *)"z"};
    CHECK_INT(wb_tx_write(p.a, &z), 0);
    CHECK_INT(wb_tx_poll(p.a, ev, 8), 1);
    CHECK_INT(ev[0].kind, WB_TX_EV_WRITE);
    CHECK_INT(ev[0].err, 0);
    CHECK_STR(ev[0].ctx, "z");
    struct wb_tx_stats st;
    CHECK_INT(wb_tx_stats(p.a, &st), 0);
    CHECK_U64(st.writes, 8);
    CHECK_U64(st.bytes, 4000);
    CHECK_U64(st.errors, 0);
    CHECK_INT(wb_tx_stats(p.b, &st), 0);
    CHECK_U64(st.imm_recv, 7);
    pair_close(&p);
}

/* ---------------------------------------------------------------- notes */

static struct wb_tx_note_stats note_stats(struct wb_tx *tx)
{
    struct wb_tx_note_stats st;
    wb_tx_note_stats(tx, &st);
    return st;
}

/* Every check an arrived note passes, one refusal each, counted by reason: a member's note
 * counts once (its replay does not), a stranger's, a flipped bit, a short one, another key's,
 * another version's, an ended attempt's and one arriving before its attempt began (kept, then
 * counted once it does) — with the transports' real peer tables (A is B's peer 0). */
static void test_notes_checked(void)
{
    struct pair p;
    pair_open(&p, TCP);
    struct wb_tx_attempt at = {.epoch = 0x1111, .version = 3, .max_tags = 4, .max_notes = 64};
    memset(at.key, 7, sizeof(at.key));
    CHECK_INT(wb_tx_attempt_begin(p.a, &at), 0);
    CHECK_INT(wb_tx_attempt_begin(p.b, &at), 0);
    CHECK_INT(wb_tx_attempt_begin(p.b, &at), -EALREADY);
    CHECK_U64(wb_tx_attempt_epoch(p.b), 0x1111);
    uint8_t n[WB_TXN_WIRE], m[WB_TXN_WIRE];
    struct wb_txn got;
    CHECK_INT(txi_note_make(p.a, p.peer, WB_TXN_COUNT, 5, 1, 0, 0, 0, n), WB_TXN_SHORT);
    CHECK_INT(txi_note_accept(p.b, n, sizeof(n), 0, &got), 1);
    CHECK_INT(got.tag, 5);
    CHECK_INT(got.seq, 0);
    CHECK_INT(txi_note_accept(p.b, n, sizeof(n), 0, &got), 0); /* replayed */
    CHECK_INT(txi_note_accept(p.b, n, sizeof(n), WB_TXN_NOBODY, &got), 0);
    memcpy(m, n, sizeof(m));
    m[4] ^= 1; /* a bit of the tag: the MAC no longer matches */
    CHECK_INT(txi_note_accept(p.b, m, sizeof(m), 0, &got), 0);
    CHECK_INT(txi_note_accept(p.b, n, sizeof(n) - 1, 0, &got), 0);
    /* the next note of (peer, tag) has the next sequence number: it counts */
    CHECK_INT(txi_note_make(p.a, p.peer, WB_TXN_COUNT, 5, 1, 0, 0, 0, m), WB_TXN_SHORT);
    CHECK_INT(txi_note_accept(p.b, m, sizeof(m), 0, &got), 1);
    CHECK_INT(got.seq, 1);
    struct wb_tx_note_stats st = note_stats(p.b);
    CHECK_U64(st.accepted, 2);
    CHECK_U64(st.replayed, 1);
    CHECK_U64(st.stranger, 1);
    CHECK_U64(st.forged, 2);
    /* made under another key, or for another version: forged */
    struct wb_tx_attempt other = at;
    other.key[0] ^= 1;
    CHECK_INT(wb_tx_attempt_begin(p.a, &(struct wb_tx_attempt){.epoch = 0x2222}), 0);
    CHECK_INT(wb_tx_attempt_begin(p.a, &other), 0);
    CHECK_INT(txi_note_make(p.a, p.peer, WB_TXN_COUNT, 6, 1, 0, 0, 0, m), WB_TXN_SHORT);
    CHECK_INT(txi_note_accept(p.b, m, sizeof(m), 0, &got), 0);
    other = at;
    other.version = 4;
    CHECK_INT(wb_tx_attempt_begin(p.a, &(struct wb_tx_attempt){.epoch = 0x3333}), 0);
    CHECK_INT(wb_tx_attempt_begin(p.a, &other), 0);
    CHECK_INT(txi_note_make(p.a, p.peer, WB_TXN_COUNT, 6, 1, 0, 0, 0, m), WB_TXN_SHORT);
    CHECK_INT(txi_note_accept(p.b, m, sizeof(m), 0, &got), 0);
    CHECK_U64(note_stats(p.b).forged, 4);
    /* B moves on to attempt 0x4444: the first attempt's notes are stale now */
    struct wb_tx_attempt next = at;
    next.epoch = 0x4444;
    CHECK_INT(wb_tx_attempt_begin(p.b, &next), 0);
    CHECK_INT(txi_note_accept(p.b, n, sizeof(n), 0, &got), 0);
    CHECK_U64(note_stats(p.b).stale, 1);
    /* A begins attempt 0x5555 before B: its note is kept, and counts once B begins it */
    struct wb_tx_attempt later = at;
    later.epoch = 0x5555;
    CHECK_INT(wb_tx_attempt_begin(p.a, &later), 0);
    CHECK_INT(txi_note_make(p.a, p.peer, WB_TXN_COUNT, 9, 1, 0, 0, 0, m), WB_TXN_SHORT);
    uint8_t *exact = malloc(WB_TXN_SHORT); /* as the last note of a message: nothing after it */
    CHECK(exact != NULL);
    memcpy(exact, m, WB_TXN_SHORT);
    CHECK_INT(txi_note_accept(p.b, exact, WB_TXN_SHORT, 0, &got), 0);
    free(exact);
    CHECK_U64(note_stats(p.b).early, 1);
    uint8_t back[WB_TXN_WIRE];
    uint32_t from = 99;
    CHECK_INT(txi_note_early(p.b, back, &from), 0); /* not B's attempt yet */
    CHECK_INT(wb_tx_attempt_begin(p.b, &later), 0);
    CHECK_INT(txi_note_early(p.b, back, &from), 1);
    CHECK_INT(from, 0);
    CHECK_INT(txi_note_accept(p.b, back, sizeof(back), from, &got), 1);
    CHECK_INT(got.tag, 9);
    /* without an attempt nothing counts and nothing is sent */
    wb_tx_attempt_end(p.b);
    CHECK_U64(wb_tx_attempt_epoch(p.b), 0);
    CHECK_INT(txi_note_accept(p.b, m, sizeof(m), 0, &got), 0);
    CHECK_INT(txi_note_make(p.b, 0, WB_TXN_COUNT, 1, 1, 0, 0, 0, m), -EPROTO);
    CHECK_INT(wb_tx_attempt_begin(p.b, &(struct wb_tx_attempt){.epoch = 0}), -EINVAL);
    pair_close(&p);
}

/* An attempt begun with peer_times records, per peer, the immediates its counted notes stood for
 * and when the first and the last came; refused notes do not count, the record outlives the
 * attempt's end and goes with the next attempt that does not ask for one. */
static void test_notes_peer_times(void)
{
    struct pair p;
    pair_open(&p, TCP);
    struct wb_tx_attempt at = {.epoch = 0x77, .version = 2, .peer_times = true};
    struct wb_tx_peer_notes pn;
    CHECK_INT(wb_tx_peer_notes(p.b, 0, &pn), -ENODATA); /* no attempt asked for it yet */
    CHECK_INT(wb_tx_attempt_begin(p.a, &at), 0);
    CHECK_INT(wb_tx_attempt_begin(p.b, &at), 0);
    CHECK_INT(wb_tx_peer_notes(p.b, 0, &pn), 0);
    CHECK_U64(pn.imms, 0);
    CHECK_U64(pn.first_ns, 0);
    CHECK_INT(wb_tx_peer_notes(p.b, 1, &pn), -EINVAL); /* B has one peer */
    uint8_t n[WB_TXN_WIRE], m[WB_TXN_WIRE];
    struct wb_txn got;
    uint64_t t0 = wb_now_ns();
    CHECK_INT(txi_note_make(p.a, p.peer, WB_TXN_COUNT, 5, 1, 0, 0, 0, n), WB_TXN_SHORT);
    CHECK_INT(txi_note_accept(p.b, n, sizeof(n), 0, &got), 1);
    CHECK_INT(txi_note_accept(p.b, n, sizeof(n), 0, &got), 0); /* replayed: not counted */
    CHECK_INT(txi_note_make(p.a, p.peer, WB_TXN_COUNT, 6, 5, 0, 0, 0, m), WB_TXN_SHORT);
    CHECK_INT(txi_note_accept(p.b, m, sizeof(m), 0, &got), 1); /* a batch of 5 */
    uint64_t t1 = wb_now_ns();
    CHECK_INT(wb_tx_peer_notes(p.b, 0, &pn), 0);
    CHECK_U64(pn.imms, 6);
    CHECK(t0 <= pn.first_ns && pn.first_ns <= pn.last_ns && pn.last_ns <= t1);
    wb_tx_attempt_end(p.b);
    CHECK_INT(wb_tx_peer_notes(p.b, 0, &pn), 0);
    CHECK_U64(pn.imms, 6);
    CHECK_INT(wb_tx_attempt_begin(p.b, &(struct wb_tx_attempt){.epoch = 0x78}), 0);
    CHECK_INT(wb_tx_peer_notes(p.b, 0, &pn), -ENODATA);
    pair_close(&p);
}

/* An attempt's tables are bounded by what it declared: a counter past max_tags is refused
 * (-ENOSPC) and an arrival that would need one is dropped and counted, never allocated. */
static void test_notes_bounded(void)
{
    struct pair p;
    pair_open(&p, TCP);
    struct wb_tx_attempt at = {.epoch = 77, .version = 1, .max_tags = 2, .max_notes = 3};
    CHECK_INT(wb_tx_attempt_begin(p.a, &at), 0);
    CHECK_INT(wb_tx_attempt_begin(p.b, &at), 0);
    CHECK_INT(wb_tx_expect(p.b, 1, 5, NULL, NULL), 0);
    CHECK_INT(wb_tx_expect(p.b, 2, 5, NULL, NULL), 0);
    CHECK_INT(wb_tx_expect(p.b, 3, 5, NULL, NULL), -ENOSPC);
    CHECK_STR(wb_tx_errmsg(p.b), "expect: tag 3: the attempt's 2 counters are in use");
    uint8_t n[WB_TXN_WIRE];
    struct wb_txn got;
    CHECK_INT(txi_note_make(p.a, p.peer, WB_TXN_COUNT, 3, 1, 0, 0, 0, n), WB_TXN_SHORT);
    CHECK_INT(txi_note_accept(p.b, n, sizeof(n), 0, &got), 1);
    txi_imm_arrived(p.b, 3, 1); /* no counter can be made for it */
    CHECK_U64(note_stats(p.b).full, 1);
    CHECK_U64(wb_tx_imm_count(p.b, 3), 0);
    /* the replay set holds max_notes: the fourth distinct note finds no room */
    for (int i = 0; i < 3; i++) {
        CHECK_INT(txi_note_make(p.a, p.peer, WB_TXN_COUNT, 1, 1, 0, 0, 0, n), WB_TXN_SHORT);
        (void)txi_note_accept(p.b, n, sizeof(n), 0, &got);
    }
    CHECK_U64(note_stats(p.b).full, 2);
    pair_close(&p);
}

/* Notes queued together to one peer go as one message of up to 16 (896 bytes), and each is
 * checked and counted on its own: 500 immediates queued before a poll leave in exactly 32
 * messages and count 500 at B. The walk over a message takes a note's length from its flags
 * and stops at a tail too short for one. */
static void test_notes_batched(void)
{
    struct pair p;
    pair_open(&p, TCP);
    struct wb_tx_attempt at = {.epoch = 5, .version = 1};
    CHECK_INT(wb_tx_attempt_begin(p.a, &at), 0);
    CHECK_INT(wb_tx_attempt_begin(p.b, &at), 0);
    CHECK_INT(wb_tx_expect(p.b, 9, 500, NULL, (void *)"nine"), 0);
    struct wb_tx_stats st0;
    CHECK_INT(wb_tx_stats(p.a, &st0), 0);
    for (int i = 0; i < 500; i++)
        CHECK_INT(wb_tx_write_imm(p.a, p.peer, 9, NULL), 0);
    struct wb_tx_event out[1];
    pair_run(&p, 500, 1, out);
    CHECK_STR(out[0].ctx, "nine");
    struct wb_tx_stats st;
    CHECK_INT(wb_tx_stats(p.a, &st), 0);
    CHECK_U64(st.ops_posted - st0.ops_posted, 32);
    CHECK_U64(note_stats(p.b).accepted, 500);

    uint8_t buf[3 * WB_TXN_WIRE];
    CHECK_INT(txi_note_make(p.a, p.peer, WB_TXN_COUNT, 1, 1, 0, 0, 0, buf), WB_TXN_SHORT);
    CHECK_INT(txi_note_make(p.a, p.peer, WB_TXN_COUNT | WB_TXN_COMMIT, 1, 1, 7, 0, 64,
                            buf + WB_TXN_SHORT),
              WB_TXN_WIRE);
    CHECK_U64(txi_note_size(buf, sizeof(buf)), WB_TXN_SHORT);
    CHECK_U64(txi_note_size(buf, WB_TXN_SHORT), WB_TXN_SHORT);
    CHECK_U64(txi_note_size(buf, WB_TXN_SHORT - 1), 0);
    CHECK_U64(txi_note_size(buf, 0), 0);
    CHECK_U64(txi_note_size(buf + WB_TXN_SHORT, WB_TXN_WIRE), WB_TXN_WIRE);
    CHECK_U64(txi_note_size(buf + WB_TXN_SHORT, WB_TXN_WIRE - 1), 0); /* a commit cut short */
    pair_close(&p);
}

/* A note is not queued behind data it does not follow: writes W1 (4 KiB, tag 1) then W2
 * (64 MiB, tag 2) to one peer over tcp, whose connection carries everything in order. With
 * inflight_bytes bounding the data handed to the provider, W1's note (sent once W1 left)
 * goes ahead of the W2 data still queued: it is read at B with nearly all of W2 yet to come,
 * so W2's last bytes are still zero when tag 1 is counted. Unbounded, all of W2 is posted at
 * once and the note is read behind it: W2 is whole when tag 1 is counted. Either way both
 * land whole and each tag counts once. */
struct ahead {
    const struct pair *p;
    uint64_t tail_from, tail_len;
    int counted;
    int64_t tail_at_one; /* bytes of W2's tail in place when tag 1 counted (-1: not yet) */
};

static void on_ahead(const struct wb_tx_event *ev, void *arg)
{
    struct ahead *h = arg;
    CHECK_INT(ev->kind, WB_TX_EV_IMM);
    if (strcmp(ev->ctx, "one") == 0) { /* how much of W2's tail is there now */
        CHECK_INT(h->counted, 0);
        h->tail_at_one = 0;
        for (uint64_t j = h->tail_from; j < h->tail_from + h->tail_len; j++)
            h->tail_at_one += h->p->dst[j] == h->p->src[j];
    }
    h->counted++;
}

static void notes_ahead(const char *yaml, bool ahead)
{
    enum { BIG = 64 << 20, SMALL = 4096 };
    struct pair p;
    pair_open_size(&p, yaml, BIG + SMALL);
    CHECK_INT(wb_tx_expect(p.b, 1, 1, NULL, (void *)"one"), 0);
    CHECK_INT(wb_tx_expect(p.b, 2, 1, NULL, (void *)"two"), 0);
    struct wb_tx_write w1 = {
        .src = p.smr, .peer = p.peer, .dst = &p.d, .len = SMALL, .has_imm = true, .imm = 1};
    struct wb_tx_write w2 = w1;
    w2.src_off = w2.dst_off = SMALL;
    w2.len = BIG;
    w2.imm = 2;
    CHECK_INT(wb_tx_write(p.a, &w1), 0);
    CHECK_INT(wb_tx_write(p.a, &w2), 0);
    struct ahead h = {&p, BIG, SMALL, 0, -1};
    pair_run_cb(&p, 2, 2, on_ahead, &h);
    CHECK(h.tail_at_one == (ahead ? 0 : SMALL));
    CHECK(memcmp(p.src, p.dst, BIG + SMALL) == 0);
    pair_close(&p);
}

static void test_notes_ahead(void)
{
    notes_ahead("provider: tcp\ndomain: lo\ninflight_bytes: 1MiB\n", true);
    notes_ahead("provider: tcp\ndomain: lo\ninflight_bytes: 0\n", false);
}

/* Progress writes (wb_tx_write.progress): the destination hears of each piece once it is
 * placed — its bytes are there when the hook runs — then the write counts once. 4 MiB at a
 * 1 MiB inflight_bytes go as 16 pieces of 256 KiB: 16 ranges covering exactly the write, at
 * the registration's offsets, all heard before the count. A staged destination (stage_host)
 * hears nothing and counts as ever. */
struct heard {
    uint32_t n, tag, at_count; /* pieces heard, their tag, how many when the write counted */
    uint64_t region, bytes, lo, hi;
    const struct pair *p;
    bool placed;
};

static void on_progress(void *arg, uint32_t tag, uint64_t region, uint64_t off, uint64_t len)
{
    struct heard *h = arg;
    h->n++;
    h->tag = tag;
    h->region = region;
    h->bytes += len;
    h->lo = off < h->lo ? off : h->lo;
    h->hi = off + len > h->hi ? off + len : h->hi;
    h->placed = h->placed && memcmp(h->p->dst + off, h->p->src + off, len) == 0;
}

static void on_seven(const struct wb_tx_event *ev, void *arg)
{
    struct heard *h = arg;
    CHECK_STR(ev->ctx, "seven");
    h->at_count = h->n;
}

static void progress_case(const char *yaml, uint32_t want_pieces)
{
    enum { SZ = 4 << 20, AT = 8192 };
    struct pair p;
    pair_open_size(&p, yaml, SZ + AT);
    struct heard h = {.lo = UINT64_MAX, .p = &p, .placed = true};
    wb_tx_on_progress(p.b, on_progress, &h);
    CHECK_INT(wb_tx_expect(p.b, 7, 1, NULL, (void *)"seven"), 0);
    struct wb_tx_write w = {.src = p.smr,
                            .src_off = AT,
                            .peer = p.peer,
                            .dst = &p.d,
                            .dst_off = AT,
                            .len = SZ,
                            .has_imm = true,
                            .imm = 7,
                            .progress = true};
    CHECK_INT(wb_tx_write(p.a, &w), 0);
    pair_run_cb(&p, 1, 1, on_seven, &h);
    CHECK_INT(h.at_count, want_pieces);
    CHECK_INT(h.n, want_pieces);
    if (want_pieces) {
        CHECK_INT(h.tag, 7);
        CHECK_U64(h.region, p.dmr->id);
        CHECK_U64(h.bytes, SZ);
        CHECK_U64(h.lo, AT);
        CHECK_U64(h.hi, AT + SZ);
        CHECK(h.placed);
    }
    CHECK(memcmp(p.src + AT, p.dst + AT, SZ) == 0);
    struct wb_tx_stats st;
    CHECK_INT(wb_tx_stats(p.b, &st), 0);
    CHECK_U64(st.progress_recv, want_pieces);
    pair_close(&p);
}

static void test_progress(void)
{
    progress_case("provider: tcp\ndomain: lo\ninflight_bytes: 1MiB\n", 16);
    progress_case("provider: tcp\ndomain: lo\ninflight_bytes: 1MiB\nstage_host: true\n", 0);
}

/* Over the wire: a stranger's notes (a transport B never added) are dropped and counted at
 * B's end by the provider's source address, whatever they claim; a closed window refuses a
 * write under its key (the writer's completion fails) and lands nothing; opened again under
 * the same key, A's write lands and counts. */
static void test_notes_wire(void)
{
    struct pair p;
    pair_open(&p, TCP);
    setenv("WB_TX_NOTES_DELIVERED", "1", 1);
    struct wb_tx *s = open_ok(TCP);
    unsetenv("WB_TX_NOTES_DELIVERED");
    uint32_t sp = connect(s, p.b); /* the stranger knows B's address; B does not know it */
    struct wb_tx_attempt at = {.epoch = 42, .version = 1};
    CHECK_INT(wb_tx_attempt_begin(p.a, &at), 0);
    CHECK_INT(wb_tx_attempt_begin(p.b, &at), 0);
    CHECK_INT(wb_tx_attempt_begin(s, &at), 0); /* even with the attempt's very key */
    CHECK_INT(wb_tx_expect(p.b, 7, 1, NULL, (void *)"seven"), 0);
    for (int i = 0; i < 100; i++)
        CHECK_INT(wb_tx_write_imm(s, sp, 7, NULL), 0);
    struct wb_tx_event ev[64];
    int done = 0;
    while (note_stats(p.b).stranger < 100 || done < 100) {
        CHECK_INT(wb_tx_poll(p.b, ev, 64), 0); /* nothing counts */
        ssize_t k = wb_tx_poll(s, ev, 64);
        CHECK(k >= 0);
        done += (int)k;
    }
    CHECK_U64(note_stats(p.b).stranger, 100);
    CHECK_U64(wb_tx_imm_count(p.b, 7), 0);
    /* the window: closed, the stranger's write under the real key is refused */
    CHECK_INT(wb_tx_mr_window(p.b, p.dmr, false), 0);
    uint8_t *junk = malloc(4096);
    CHECK(junk);
    memset(junk, 0xAA, 4096);
    struct wb_tx_mr *jm;
    CHECK_INT(wb_tx_mr_reg(s, junk, 4096, WB_TX_ACCESS_SRC, &jm), 0);
    /* The stranger sends delivery-complete (as on a provider that does not read a
     * connection in order), so its write's completion says what B did with it; the fence
     * behind it completes once B dealt with everything before it. */
    struct wb_tx_write w = {.src = jm,
                            .peer = sp,
                            .dst = &p.d,
                            .len = 4096,
                            .has_imm = true,
                            .imm = 7,
                            .ctx = (void *)"j"};
    CHECK_INT(wb_tx_write(s, &w), 0);
    CHECK_INT(wb_tx_fence(s, sp, (void *)"f"), 0);
    int err = 0, seen = 0;
    while (seen < 2) {
        wb_tx_poll(p.b, ev, 64);
        ssize_t k = wb_tx_poll(s, ev, 64);
        for (ssize_t i = 0; i < k; i++) {
            CHECK_INT(ev[i].kind, WB_TX_EV_WRITE);
            seen++;
            if (!strcmp(ev[i].ctx, "j"))
                err = ev[i].err;
        }
    }
    CHECK(err != 0);
    for (int i = 0; i < 4096; i++)
        CHECK_INT(p.dst[i], 0);
    /* open again: A's write and note land and count */
    CHECK_INT(wb_tx_mr_window(p.b, p.dmr, true), 0);
    struct wb_tx_write aw = {
        .src = p.smr, .peer = p.peer, .dst = &p.d, .len = 4096, .has_imm = true, .imm = 7};
    CHECK_INT(wb_tx_write(p.a, &aw), 0);
    struct wb_tx_event out[1];
    pair_run(&p, 1, 1, out);
    CHECK_INT(out[0].kind, WB_TX_EV_IMM);
    CHECK_STR(out[0].ctx, "seven");
    CHECK_MEM(p.dst, p.src, 4096);
    CHECK_INT(wb_tx_mr_dereg(s, jm), 0);
    wb_tx_close(s);
    free(junk);
    pair_close(&p);
}

/* Close right after queueing work (never polled), and with registrations left: no leak, no
 * crash (ASan checks both). */
static void test_close_with_work(void)
{
    struct pair p;
    pair_open(&p, "provider: tcp\ndomain: lo\nrails: 2\nshard_size: 64KiB\nstage_host: true\n");
    for (int i = 0; i < 20; i++) {
        struct wb_tx_write w = {
            .src = p.smr, .peer = p.peer, .dst = &p.d, .len = PSZ, .has_imm = true, .imm = 1};
        CHECK_INT(wb_tx_write(p.a, &w), 0);
    }
    struct wb_tx_event ev[8];
    for (int i = 0; i < 5; i++) {
        CHECK(wb_tx_poll(p.a, ev, 8) >= 0);
        CHECK(wb_tx_poll(p.b, ev, 8) >= 0);
    }
    wb_tx_close(p.a);
    wb_tx_close(p.b);
    free(p.src);
    free(p.dst);
}

/* ---------------------------------------------------------------- mailbox */

static uint32_t drained[8192];
static uint64_t drained_owner[8192];
static size_t ndrained;
/* A mailbox entry is a note (WB_MBOX_NOTE bytes); these tests put a number in its first four. */
static void take(void *arg, uint64_t owner, const void *note)
{
    (void)arg;
    uint32_t v;
    memcpy(&v, note, sizeof(v));
    if (ndrained < 8192) {
        drained_owner[ndrained] = owner;
        drained[ndrained++] = v;
    }
}

static int push_num(struct wb_mbox *m, uint32_t v)
{
    uint8_t note[WB_MBOX_NOTE] = {0};
    memcpy(note, &v, sizeof(v));
    return mbox_push(m, note);
}

static void test_mbox(void)
{
    struct wb_mbox own, w1, w2;
    CHECK_INT(mbox_create(&own, 0xabc), 0);
    CHECK_INT(mbox_open(&w1, "/wb-tx-no-such-mailbox", 1), -ENOENT);
    CHECK_INT(mbox_open(&w1, own.name, 1), 0);
    CHECK_INT(mbox_open(&w2, own.name, 2), 0);
    CHECK(w1.ring != w2.ring);
    for (uint32_t i = 0; i < WB_MBOX_DEPTH; i++)
        CHECK_INT(push_num(&w1, i), 0);
    CHECK_INT(push_num(&w1, 7), -EAGAIN); /* full */
    CHECK_INT(push_num(&w2, 100000), 0);
    ndrained = 0;
    CHECK_INT(mbox_drain(&own, take, NULL), WB_MBOX_DEPTH + 1);
    for (uint32_t i = 0; i < WB_MBOX_DEPTH; i++) { /* each ring in order, with its writer */
        size_t at = (size_t)(w1.ring < w2.ring ? i : i + 1);
        CHECK_INT(drained[at], i);
        CHECK_U64(drained_owner[at], mbox_writer_id(1));
    }
    CHECK_U64(drained_owner[w1.ring < w2.ring ? WB_MBOX_DEPTH : 0], mbox_writer_id(2));
    CHECK_INT(push_num(&w1, 7), 0); /* room again */
    /* Every ring taken: a 65th writer is refused, unless a writer is dead. */
    struct wb_mbox more[WB_MBOX_RINGS];
    int nmore = 0;
    while (nmore < WB_MBOX_RINGS && mbox_open(&more[nmore], own.name, 10 + nmore) == 0)
        nmore++;
    CHECK_INT(nmore, WB_MBOX_RINGS - 2);
    struct wb_mbox extra;
    CHECK_INT(mbox_open(&extra, own.name, 999), -EBUSY);
    /* A ring released with tags still queued is drained before it is handed out again. */
    mbox_close(&w1);
    CHECK_INT(mbox_open(&extra, own.name, 999), -EBUSY);
    ndrained = 0;
    CHECK_INT(mbox_drain(&own, take, NULL), 1);
    CHECK_INT(drained[0], 7);
    CHECK_INT(mbox_open(&extra, own.name, 999), 0);
    mbox_close(&extra);
    /* A writer process that died holding a ring: its ring is reclaimed. */
    mbox_close(&more[0]);
    pid_t pid = fork();
    if (pid == 0) {
        struct wb_mbox m;
        _exit(mbox_open(&m, own.name, 4242) == 0 ? 0 : 1); /* never closed */
    }
    int st;
    waitpid(pid, &st, 0);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    CHECK_INT(mbox_open(&extra, own.name, 5000), 0);
    mbox_close(&extra);
    for (int i = 1; i < nmore; i++)
        mbox_close(&more[i]);
    mbox_close(&w2);
    char name[WB_MBOX_NAME_MAX];
    snprintf(name, sizeof(name), "%s", own.name);
    mbox_close(&own);
    CHECK_INT(mbox_open(&w1, name, 1), -ENOENT); /* unlinked */
}

static void test_mbox_stale_sweep(void)
{
    int fds[2];
    CHECK_INT(pipe(fds), 0);
    pid_t pid = fork();
    if (pid == 0) { /* an owner killed without closing */
        struct wb_mbox m;
        if (mbox_create(&m, 77) != 0)
            _exit(1);
        CHECK_INT(write(fds[1], m.name, sizeof(m.name)), (int)sizeof(m.name));
        _exit(0);
    }
    char name[WB_MBOX_NAME_MAX];
    CHECK_INT(read(fds[0], name, sizeof(name)), (int)sizeof(name));
    int st;
    waitpid(pid, &st, 0);
    struct wb_mbox w;
    CHECK_INT(mbox_open(&w, name, 1), 0); /* still there */
    mbox_close(&w);
    struct wb_mbox own;
    CHECK_INT(mbox_create(&own, 78), 0); /* sweeps the dead owner's segment */
    CHECK_INT(mbox_open(&w, name, 1), -ENOENT);
    mbox_close(&own);
    close(fds[0]);
    close(fds[1]);
}

const struct wb_test wb_tests[] = {
    {"cfg_defaults", test_cfg_defaults, 0},
    {"cfg_yaml_section", test_cfg_yaml_section, 0},
    {"cfg_invalid", test_cfg_invalid, 0},
    {"open_errors", test_open_errors, 0},
    {"cfg_provider", test_cfg_provider, 0},
    {"query", test_query, 0},
    {"rdesc_wire", test_rdesc_wire, 0},
    {"addr_blob", test_addr_blob, 0},
    {"register_rules", test_register_rules, 120},
    {"counters_inproc", test_counters_inproc, 120},
    {"close_with_work", test_close_with_work, 120},
    {"notes_checked", test_notes_checked, 0},
    {"notes_bounded", test_notes_bounded, 0},
    {"notes_peer_times", test_notes_peer_times, 0},
    {"notes_batched", test_notes_batched, 0},
    {"notes_ahead", test_notes_ahead, 120},
    {"progress", test_progress, 120},
    {"notes_wire", test_notes_wire, 0},
    {"mbox", test_mbox, 0},
    {"mbox_stale_sweep", test_mbox_stale_sweep, 0},
    {0},
};
