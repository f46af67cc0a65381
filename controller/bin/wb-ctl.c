/* wb-ctl — the client of a running controller: trigger a transfer, show status, show the plan,
 * shut the job down. This is what an RL loop calls after each optimizer step. */
#include "controller/controller.h"

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static void usage(FILE *f)
{
    fprintf(f, "usage: wb-ctl [options] transfer --version N | status | plan | shutdown\n"
               "       wb-ctl verify --config JOB --dump DIR --version N [--rank R]\n"
               "\n"
               "  transfer --version N   run transfer N; prints per-GPU bytes, per-stage and\n"
               "                         total times; exit 1 with the reason when it fails;\n"
               "                         on a terminal, a progress line meanwhile (bytes\n"
               "                         written of the bytes to write, rate)\n"
               "  status                 controller state and every agent (rollouts: complete\n"
               "                         version and whether an update is in flight)\n"
               "  plan                   the plan summary\n"
               "  shutdown               stop the agents and the controller\n"
               "  verify                 check every rollout's dump of version N (wb-agent\n"
               "                         --dump DIR) against the reference computed from the\n"
               "                         job's model: synthetic source, fusion, quant CPU\n"
               "                         reference, rollout boxes; needs no controller\n"
               "                         (--rank R: only rollout rank R's dump, e.g. a state\n"
               "                         dump that wb-agent writes on SIGUSR1)\n"
               "\n"
               "  -c, --controller URL   default tcp://127.0.0.1:7420\n"
               "  -t, --token TOKEN      default $WB_TOKEN\n"
               "      --timeout DURATION how long to wait for the answer (default 120s)\n"
               "      --config JOB       verify: the job file\n"
               "      --dump DIR         verify: the rollouts' dump directory\n"
               "      --rank R           verify: only this rollout rank\n"
               "  -h, --help             this text\n");
}

static double ms(uint64_t ns)
{
    return (double)ns / 1e6;
}

static int print_result(const struct wb_msg *m, char *why, size_t cap)
{
    struct wb_body_result res;
    struct wb_mpr r;
    uint32_t n = 0;
    if (wb_msg_decode(m, &res, why, cap))
        return -EBADMSG;
    wb_mpr_init(&r, res.trainers.p, res.trainers.n);
    if (wb_mpr_array(&r, WB_RANKS_MAX, &n)) {
        snprintf(why, cap, "RESULT: trainers: not an array");
        return -EBADMSG;
    }
    printf("transfer %" PRIu64 ": complete in %.3f ms (trainers sent by %.3f ms, rollouts "
           "received by %.3f ms)\n",
           res.version, ms(res.total_ns), ms(res.sent_ns), ms(res.received_ns));
    printf("%-8s %12s %7s %6s %10s", "trainer", "bytes", "writes", "tasks", "peak_tmp");
    for (int s = 0; s < WB_STAGE_COUNT; s++)
        printf(" %8s", wb_stage_name(s));
    printf(" %9s %10s %6s\n", "total_ms", "mem_cap", "queued");
    struct wb_xfer_stats sum = {0};
    for (uint32_t i = 0; i < n; i++) {
        struct wb_xfer_stats s;
        if (wb_body_get(&r, WB_BODY_STATS, &s, why, cap))
            return -EBADMSG;
        printf("%-8" PRIu64 " %12" PRIu64 " %7" PRIu64 " %6" PRIu64 " %10" PRIu64, s.rank, s.bytes,
               s.writes, s.tasks, s.peak_tmp);
        for (int k = 0; k < WB_STAGE_COUNT; k++) {
            printf(" %8.3f", ms(s.stage_ns[k]));
            sum.stage_ns[k] += s.stage_ns[k];
        }
        printf(" %9.3f %10" PRIu64 " %6" PRIu64 "\n", ms(s.total_ns), s.cap, s.mem_waits);
        sum.bytes += s.bytes;
        sum.full_bytes += s.full_bytes;
        sum.mem_waits += s.mem_waits;
        sum.cap = s.cap > sum.cap ? s.cap : sum.cap;
        sum.writes += s.writes;
        sum.tasks += s.tasks;
        if (s.total_ns > sum.total_ns)
            sum.total_ns = s.total_ns;
        if (s.peak_tmp > sum.peak_tmp)
            sum.peak_tmp = s.peak_tmp;
    }
    printf("%-8s %12" PRIu64 " %7" PRIu64 " %6" PRIu64 " %10" PRIu64, "all", sum.bytes, sum.writes,
           sum.tasks, sum.peak_tmp);
    for (int k = 0; k < WB_STAGE_COUNT; k++)
        printf(" %8.3f", ms(sum.stage_ns[k]));
    printf(" %9.3f %10" PRIu64 " %6" PRIu64 "\n", ms(sum.total_ns), sum.cap, sum.mem_waits);
    if (res.delta.n) { /* a delta job: what was sent against a full update, who got deltas */
        printf("delta: %" PRIu64 " of a full update's %" PRIu64 " bytes (%.2f%%);", sum.bytes,
               sum.full_bytes, sum.full_bytes ? 100.0 * (double)sum.bytes / sum.full_bytes : 0.0);
        static const char *const how[] = {"full", "delta", "delta from some trainers"};
        for (size_t i = 0; i < res.delta.n; i++)
            printf("%s rollout %zu %s", i ? "," : "", i,
                   how[((const uint8_t *)res.delta.p)[i] % 3]);
        printf("\n");
    }
    wb_mpr_init(&r, res.rollout_bytes.p, res.rollout_bytes.n);
    if (wb_mpr_array(&r, WB_RANKS_MAX, &n) == 0)
        for (uint32_t i = 0; i < n; i++) {
            uint64_t b = 0;
            wb_mpr_u64(&r, &b);
            printf("rollout %u: %" PRIu64 " bytes received\n", i, b);
        }
    return 0;
}

static int print_status(const struct wb_msg *m, char *why, size_t cap)
{
    struct wb_body_status st;
    struct wb_mpr r;
    uint32_t n = 0;
    if (wb_msg_decode(m, &st, why, cap))
        return -EBADMSG;
    printf("job %s: %s (gen %" PRIu64 "), version %" PRIu64 ", in flight: ", st.job, st.state,
           st.gen, st.version);
    if (st.in_flight)
        printf("%" PRIu64 "\n", st.in_flight);
    else
        printf("none\n");
    if (st.last_full_bytes) /* a delta job */
        printf("version %" PRIu64 ": %" PRIu64 " of a full update's %" PRIu64
               " bytes written (%.2f%%), deltas to %" PRIu64 " rollout%s\n",
               st.version, st.last_bytes, st.last_full_bytes,
               100.0 * (double)st.last_bytes / st.last_full_bytes, st.last_delta_rollouts,
               st.last_delta_rollouts == 1 ? "" : "s");
    char missing[4096];
    /* every agent the job waits for (no "ready" in the line: scripts look for that word) */
    if (wb_status_missing(&st, missing, sizeof(missing)) > 0)
        printf("waiting for %s\n", missing);
    wb_mpr_init(&r, st.agents.p, st.agents.n);
    if (wb_mpr_array(&r, 2 * WB_RANKS_MAX, &n)) {
        snprintf(why, cap, "STATUS: agents: not an array");
        return -EBADMSG;
    }
    printf("%-8s %5s %-7s %-16s %8s %6s %8s %9s %8s %8s\n", "role", "rank", "state", "host", "pid",
           "device", "version", "in_flight", "seen_ms", "dropped");
    for (uint32_t i = 0; i < n; i++) {
        struct wb_body_agent_status a;
        if (wb_body_get(&r, WB_BODY_AGENT_STATUS, &a, why, cap))
            return -EBADMSG;
        printf("%-8s %5" PRIu64 " %-7s %-16s %8" PRIu64 " %6" PRId64, a.role, a.rank, a.state,
               a.host, a.pid, a.device);
        if (strcmp(a.role, "rollout") == 0 && a.torn) /* a failed transfer landed in part */
            printf(" %8s %9s", "torn", a.in_flight ? "yes" : "no");
        else if (strcmp(a.role, "rollout") == 0)
            printf(" %8" PRIu64 " %9s", a.version, a.in_flight ? "yes" : "no");
        else
            printf(" %8s %9s", "-", "-");
        printf(" %8" PRIu64 " %8" PRIu64 "\n", a.seen_ms, a.dropped);
        if (a.err[0])
            printf("         setup failed: %s\n", a.err);
    }
    struct wb_conn_stats cs;
    if (st.conns.n) {
        wb_mpr_init(&r, st.conns.p, st.conns.n);
        if (wb_body_get(&r, WB_BODY_CONN_STATS, &cs, why, cap))
            return -EBADMSG;
        printf("connections: %" PRIu64 " introduced (at most %" PRIu64 "), %" PRIu64
               " pending (at most %" PRIu64 "), %" PRIu64 " accepted; closed: %" PRIu64
               " silent past the handshake time, %" PRIu64 " evicted, %" PRIu64
               " over max_connections, %" PRIu64 " first frame too long, %" PRIu64
               " refused first message; messages refused: %" PRIu64 "\n",
               cs.held, cs.max_held, cs.pending, cs.max_pending, cs.accepted, cs.expired,
               cs.evicted, cs.full, cs.oversized, cs.refused, cs.unbound);
    }
    return 0;
}

/* ---------------------------------------------------------------- progress on a terminal
 *
 * While `transfer` waits for its answer on a terminal, a thread of its own asks the controller
 * for its status on a connection of its own a few times a second and rewrites one line: the
 * bytes the trainers wrote of the bytes to write (their heartbeats carry both), and the rate
 * since the request. The line is erased before the answer is printed, so what stays on the
 * screen is what a pipe gets. */

enum { PROGRESS_EVERY_MS = 250 };

struct progress {
    const char *url, *token;
    uint64_t version, t0;
    pthread_t th;
    atomic_bool stop;
    bool drawn;
};

/* From the status in m: whether the job's transfer in flight is version (*flying) and the
 * trainers' bytes written and to write (both 0 until every trainer's heartbeat said them);
 * false when m is no status. */
static bool progress_read(const struct wb_msg *m, uint64_t version, uint64_t *done, uint64_t *total,
                          bool *flying)
{
    struct wb_body_status st;
    struct wb_mpr r;
    uint32_t n = 0, silent = 0;
    char why[WB_ERRMSG_MAX];
    if (m->type != WB_MSG_STATUS || wb_msg_decode(m, &st, why, sizeof(why)))
        return false;
    *flying = st.in_flight == version;
    *done = *total = 0;
    wb_mpr_init(&r, st.agents.p, st.agents.n);
    if (wb_mpr_array(&r, 2 * WB_RANKS_MAX, &n))
        return false;
    for (uint32_t i = 0; i < n; i++) {
        struct wb_body_agent_status a;
        if (wb_body_get(&r, WB_BODY_AGENT_STATUS, &a, why, sizeof(why)))
            return false;
        if (strcmp(a.role, "trainer") == 0) {
            *done += a.done;
            *total += a.total;
            silent += a.total == 0;
        }
    }
    if (silent) /* a sum without a trainer's bytes would understate the whole */
        *done = *total = 0;
    return true;
}

static void progress_draw(struct progress *p, bool flying, uint64_t done, uint64_t total)
{
    char line[200], a[32], b[32], r[32];
    double s = (double)(wb_now_ns() - p->t0) / 1e9;
    if (!flying)
        snprintf(line, sizeof(line), "transfer %" PRIu64 ": waiting to start", p->version);
    else if (!total)
        snprintf(line, sizeof(line),
                 "transfer %" PRIu64 ": started, waiting for the trainers' counts", p->version);
    else
        snprintf(line, sizeof(line), "transfer %" PRIu64 ": %s / %s  %5.1f%%  %s/s", p->version,
                 wb_fmt_bytes(done, a, sizeof(a)), wb_fmt_bytes(total, b, sizeof(b)),
                 100.0 * (double)done / (double)total,
                 wb_fmt_bytes(s > 0 ? (uint64_t)((double)done / s) : 0, r, sizeof(r)));
    printf("\r%s\033[K", line);
    fflush(stdout);
    p->drawn = true;
}

static void *progress_run(void *arg)
{
    struct progress *p = arg;
    struct wb_chan ch;
    if (wb_chan_open(&ch, p->url, p->token))
        return NULL; /* no line: the answer says what went wrong */
    while (!atomic_load(&p->stop)) {
        struct wb_mpw w;
        void *buf = NULL;
        size_t len = 0;
        struct wb_msg m;
        const char *refused;
        uint64_t done, total;
        bool flying;
        wb_mpw_init(&w);
        wb_msg_encode(&w, WB_MSG_CTL_STATUS, p->token, NULL);
        int err = wb_chan_call(&ch, &w, 1000000000ull, &buf, &len);
        wb_mpw_free(&w);
        bool ok = !err && !wb_msg_open(buf, len, p->token, &m, &refused) &&
                  progress_read(&m, p->version, &done, &total, &flying);
        wb_chan_free(buf);
        if (!ok) /* refused (max_connections, say) or gone: no line rather than retries */
            break;
        if (!atomic_load(&p->stop))
            progress_draw(p, flying, done, total);
        for (int t = 0; t < PROGRESS_EVERY_MS && !atomic_load(&p->stop); t += 10)
            nanosleep(&(struct timespec){0, 10000000}, NULL);
    }
    wb_chan_close(&ch);
    return NULL;
}

/* Starts the line when stdout is a terminal (false: nothing started). */
static bool progress_start(struct progress *p, const char *url, const char *token, uint64_t version)
{
    if (!isatty(STDOUT_FILENO))
        return false;
    *p = (struct progress){.url = url, .token = token, .version = version, .t0 = wb_now_ns()};
    atomic_init(&p->stop, false);
    return pthread_create(&p->th, NULL, progress_run, p) == 0;
}

/* Stops it and erases the line. */
static void progress_stop(struct progress *p)
{
    atomic_store(&p->stop, true);
    pthread_join(p->th, NULL);
    if (p->drawn) {
        printf("\r\033[K");
        fflush(stdout);
    }
}

/* Sends req and prints the answer; prog (may be NULL): the progress line, stopped and erased
 * once the answer is in, before anything is printed. */
static int call_then(const char *url, const char *token, uint64_t timeout, struct wb_mpw *req,
                     struct progress *prog)
{
    struct wb_chan ch;
    void *buf = NULL;
    size_t len = 0;
    int err = wb_chan_open(&ch, url, token);
    if (err) {
        if (prog)
            progress_stop(prog);
        fprintf(stderr, "wb-ctl: %s: %s\n", url, wb_strerror(err));
        return 1;
    }
    err = wb_chan_call(&ch, req, timeout, &buf, &len);
    if (prog)
        progress_stop(prog);
    if (err) {
        fprintf(stderr, "wb-ctl: controller %s: %s\n", url,
                err == -ETIMEDOUT ? "no answer (timed out)"
                : err == -ECONNRESET
                    ? "it closed the connection without an answer (is it at its max_connections?)"
                    : wb_strerror(err));
        wb_chan_close(&ch);
        return 1;
    }
    struct wb_msg m;
    const char *refused = "";
    char why[WB_ERRMSG_MAX] = "";
    int rc = 1;
    if (wb_msg_open(buf, len, token, &m, &refused)) {
        fprintf(stderr, "wb-ctl: reply from %s: %s\n", url, refused);
    } else if (m.type == WB_MSG_ERROR) {
        struct wb_body_error e;
        if (wb_msg_decode(&m, &e, why, sizeof(why)) == 0)
            fprintf(stderr, "wb-ctl: %s\n", e.msg);
    } else if (m.type == WB_MSG_RESULT) {
        rc = print_result(&m, why, sizeof(why)) ? 1 : 0;
    } else if (m.type == WB_MSG_STATUS) {
        rc = print_status(&m, why, sizeof(why)) ? 1 : 0;
    } else if (m.type == WB_MSG_PLAN_INFO) {
        struct wb_body_plan_info pi;
        if (wb_msg_decode(&m, &pi, why, sizeof(why)) == 0) {
            fwrite(pi.summary.p, 1, pi.summary.n, stdout);
            rc = 0;
        }
    } else if (m.type == WB_MSG_OK) {
        rc = wb_msg_decode(&m, NULL, why, sizeof(why)) ? 1 : 0;
    }
    if (*why)
        fprintf(stderr, "wb-ctl: reply from %s: %s\n", url, why);
    wb_chan_free(buf);
    wb_chan_close(&ch);
    return rc;
}

/* verify: every rollout's dump of `version` against the reference, or only rollout rank `only`'s
 * (>= 0). */
static int verify(const char *config, const char *dump, uint64_t version, int64_t only)
{
    if (!config || !dump || !version) {
        fprintf(stderr, "wb-ctl: verify needs --config JOB, --dump DIR and --version N\n");
        return 2;
    }
    struct wb_errlist el;
    struct wb_job job;
    struct wb_ref *ref = NULL;
    wb_errlist_init(&el);
    int err = wb_job_load(config, &job, &el);
    if (!err) {
        err = wb_ref_load(&job, &ref, &el);
        wb_job_free(&job);
    }
    if (err) {
        wb_errlist_print(&el, "wb-ctl: ", stderr);
        wb_errlist_free(&el);
        return 1;
    }
    wb_errlist_free(&el);
    int rc = 0;
    uint64_t total = 0;
    uint32_t n = wb_ref_nrollouts(ref);
    if (only >= (int64_t)n) {
        fprintf(stderr, "wb-ctl: verify: --rank %" PRId64 ": the job has %u rollout ranks\n", only,
                n);
        wb_ref_free(ref);
        return 2;
    }
    for (uint32_t r = only >= 0 ? (uint32_t)only : 0; r < (only >= 0 ? (uint32_t)only + 1 : n);
         r++) {
        char path[4096], msg[512];
        uint64_t bytes = 0;
        snprintf(path, sizeof(path), "%s/rollout%u.v%" PRIu64 ".bin", dump, r, version);
        if (wb_ref_check_dump(ref, r, version, path, msg, sizeof(msg), &bytes)) {
            fprintf(stderr, "wb-ctl: verify: %s\n", msg);
            rc = 1;
        } else {
            total += bytes;
        }
    }
    if (!rc && only >= 0)
        printf("verify version %" PRIu64 ": rollout rank %" PRId64 ", %" PRIu64
               " bytes, every byte equals the reference\n",
               version, only, total);
    else if (!rc)
        printf("verify version %" PRIu64 ": %u rollouts, %" PRIu64
               " bytes, every byte equals the reference\n",
               version, n, total);
    wb_ref_free(ref);
    return rc;
}

/* LeakSanitizer, in the sanitizer builds (unused elsewhere): nng 1.5.2 keeps a request that
 * was being sent on a connection that closed under it (a controller evicts connections not
 * introduced yet while strangers crowd it; wb_chan introduces the next one) after the socket
 * is closed. Only allocations made inside libnng are exempt. */
const char *__lsan_default_suppressions(void);
const char *__lsan_default_suppressions(void)
{
    return "leak:libnng.so\n";
}

int main(int argc, char **argv)
{
    static const struct option lo[] = {{"controller", required_argument, 0, 'c'},
                                       {"token", required_argument, 0, 't'},
                                       {"timeout", required_argument, 0, 'T'},
                                       {"version", required_argument, 0, 'v'},
                                       {"config", required_argument, 0, 'J'},
                                       {"dump", required_argument, 0, 'U'},
                                       {"rank", required_argument, 0, 'R'},
                                       {"help", no_argument, 0, 'h'},
                                       {0}};
    const char *url = "tcp://127.0.0.1:7420", *token = NULL;
    const char *config = NULL, *dump = NULL;
    uint64_t timeout = 120ull * 1000000000, version = 0;
    int64_t rank = -1;
    int ch;
    while ((ch = getopt_long(argc, argv, "c:t:v:h", lo, NULL)) != -1) {
        switch (ch) {
        case 'c':
            url = optarg;
            break;
        case 't':
            token = optarg;
            break;
        case 'T':
            if (wb_parse_duration(optarg, &timeout)) {
                fprintf(stderr, "wb-ctl: --timeout: expected a duration, got '%s'\n", optarg);
                return 2;
            }
            if (timeout > WB_JOB_MAX_NS) {
                fprintf(stderr,
                        "wb-ctl: --timeout: %s is longer than the longest duration, %d days\n",
                        optarg, WB_JOB_MAX_DAYS);
                return 2;
            }
            break;
        case 'v':
            if (wb_parse_u64(optarg, &version) || version == 0) {
                fprintf(stderr, "wb-ctl: --version: expected a positive integer, got '%s'\n",
                        optarg);
                return 2;
            }
            break;
        case 'J':
            config = optarg;
            break;
        case 'U':
            dump = optarg;
            break;
        case 'R':
            if (wb_parse_i64(optarg, &rank) || rank < 0 || rank > UINT32_MAX) {
                fprintf(stderr, "wb-ctl: --rank: expected a rollout rank, got '%s'\n", optarg);
                return 2;
            }
            break;
        case 'h':
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
    }
    if (optind != argc - 1) {
        usage(stderr);
        return 2;
    }
    if (strcmp(argv[optind], "verify") == 0)
        return verify(config, dump, version, rank);
    if (rank >= 0) {
        fprintf(stderr, "wb-ctl: --rank is an option of verify\n");
        return 2;
    }
    if (!(token = wb_token_resolve(token))) {
        fprintf(stderr, "wb-ctl: no cluster token: give --token or set $WB_TOKEN\n");
        return 2;
    }
    const char *cmd = argv[optind];
    struct wb_mpw w;
    wb_mpw_init(&w);
    if (strcmp(cmd, "transfer") == 0) {
        if (!version) {
            fprintf(stderr, "wb-ctl: transfer needs --version N\n");
            return 2;
        }
        struct wb_body_ctl_transfer b = {version, timeout};
        wb_msg_encode(&w, WB_MSG_CTL_TRANSFER, token, &b);
        timeout += 5ull * 1000000000; /* the controller's own failure report comes first */
    } else if (strcmp(cmd, "status") == 0) {
        wb_msg_encode(&w, WB_MSG_CTL_STATUS, token, NULL);
    } else if (strcmp(cmd, "plan") == 0) {
        wb_msg_encode(&w, WB_MSG_CTL_PLAN, token, NULL);
    } else if (strcmp(cmd, "shutdown") == 0) {
        wb_msg_encode(&w, WB_MSG_CTL_SHUTDOWN, token, NULL);
    } else {
        fprintf(stderr, "wb-ctl: unknown command '%s'\n", cmd);
        usage(stderr);
        return 2;
    }
    struct progress prog;
    bool line = strcmp(cmd, "transfer") == 0 && progress_start(&prog, url, token, version);
    int rc = call_then(url, token, timeout, &w, line ? &prog : NULL);
    wb_mpw_free(&w);
    return rc;
}
