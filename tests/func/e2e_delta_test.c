/* e2e_delta_test.c — delta updates (issue #34) with real processes: wb-controller, 4 trainer
 * and 2 rollout wb-agents move the demo model over libfabric's tcp and shm providers for 50
 * versions of a synthetic source that changes 0.2 % of its elements per version, with delta:
 * true and verify: true. After every complete version each rollout's bytes are compared with
 * the full-update reference computed here (controller/verify.c: the synthetic source, fusion,
 * quant's CPU reference — no planner, executor or delta code), and the result's delta line is
 * checked: what was sent against a full update, and which rollouts got deltas. On the way:
 * versions that are multiples of delta_full_every go full; trainer 0 leaves a changed byte out
 * of version 20's deltas (--corrupt-delta, a shadow that no longer matches the rollouts): the
 * checksums fail the version, the rollouts say they are torn, the retry is a full update and
 * the versions after it deltas again; rollout 1 is killed before version 30 and comes back
 * empty: version 30 goes full, 31 deltas again. Timing never decides a result. */
#include "tests/func/e2e_cluster.h"

enum { VERSIONS = 50, BAD = 20, REJOIN = 30, FULL_EVERY = 16 };

/* The "delta:" line of a transfer result: bytes sent, a full update's, and per rollout what it
 * got ('d' delta, 'f' full, 's' deltas from some trainers). */
static void delta_line(const char *out, uint64_t *sent, uint64_t *full, char mode[NRO])
{
    const char *l = strstr(out, "\ndelta: ");
    if (!l || sscanf(l + 8, "%" SCNu64 " of a full update's %" SCNu64, sent, full) != 2)
        wb_test_fail(__FILE__, __LINE__, "no delta line:\n%s", out);
    const char *end = strchr(l + 1, '\n');
    for (int r = 0; r < NRO; r++) {
        char key[32];
        snprintf(key, sizeof(key), "rollout %d ", r);
        const char *p = strstr(l, key);
        if (!p || (end && p > end))
            wb_test_fail(__FILE__, __LINE__, "the delta line names no rollout %d:\n%s", r, l);
        p += strlen(key);
        mode[r] = !strncmp(p, "delta from some", 15) ? 's'
                  : !strncmp(p, "delta", 5)          ? 'd'
                  : !strncmp(p, "full", 4)           ? 'f'
                                                     : '?';
    }
}

/* Transfer v, which must complete; its delta line, then every byte against the reference. */
static void transfer_v(struct cluster *c, uint64_t v, uint64_t *sent, char mode[NRO])
{
    char *out, args[64];
    uint64_t full = 0;
    snprintf(args, sizeof(args), "--timeout 60s transfer --version %" PRIu64, v);
    if (ctl(c, &out, args))
        wb_test_fail(__FILE__, __LINE__, "transfer %" PRIu64 " failed:\n%s", v, out);
    delta_line(out, sent, &full, mode);
    CHECK_U64(full, recv_bytes(c, 0) + recv_bytes(c, 1));
    CHECK(*sent > 0 && *sent <= full);
    free(out);
    verify(c, v);
}

/* Waits until `wb-ctl status` holds want (at most 15 s: a time limit that only ends a hang). */
static char *status_until(struct cluster *c, const char *want)
{
    char *out = NULL;
    for (int t = 0; t < 150; t++) {
        free(out);
        ctl(c, &out, "--timeout 5s status");
        if (strstr(out, want))
            return out;
        e2e_sleep_ms(100);
    }
    wb_test_fail(__FILE__, __LINE__, "status never said \"%s\":\n%s", want, out);
    return NULL;
}

static void run_delta(const char *provider, const char *domain, unsigned salt)
{
    struct cluster c = {.provider = provider,
                        .domain = domain,
                        .trainer0_arg = "--corrupt-delta=20",
                        .job_extra = "verify: true\ndelta: true\ndelta_full_every: 16\n"
                                     "synthetic_change: 0.002\n"};
    snprintf(c.url, sizeof(c.url), "tcp://127.0.0.1:%u", e2e_port(salt));
    write_job(&c, "auto", "4MiB", false);
    start(&c, NULL);
    const uint64_t full = recv_bytes(&c, 0) + recv_bytes(&c, 1);
    uint64_t sent, deltas = 0, delta_bytes = 0;
    char mode[NRO], *out;
    bool after_resume = false; /* the last attempt skipped what had landed: shadows not whole */
    for (uint64_t v = 1; v <= VERSIONS; v++) {
        if (v == REJOIN) { /* rollout 1 dies and comes back empty: every agent is set up again */
            CHECK_INT(kill(c.ag[NTR + 1], SIGKILL), 0);
            CHECK_INT(e2e_wait(c.ag[NTR + 1], 5000), 128 + SIGKILL);
            free(status_until(&c, ": waiting"));
            c.ag[NTR + 1] = spawn_agent(&c, NTR + 1, NULL);
            free(status_until(&c, ": ready"));
        }
        if (v == BAD) { /* version 20's deltas miss a changed byte: the checksums catch it */
            char args[64];
            snprintf(args, sizeof(args), "--timeout 60s transfer --version %" PRIu64, v);
            CHECK(ctl(&c, &out, args) != 0);
            CHECK_CONTAINS(out, "transfer 20 failed");
            CHECK_CONTAINS(out, "do not match their checksum");
            CHECK_CONTAINS(out, "written by trainer rank 0");
            free(out);
            free(status_until(&c, "version 19, in flight: none"));
            /* the rollouts the attempt reached say so until a version completes on them */
            int torn = 0;
            for (int t = 0; t < 30 && torn < NRO; t++) {
                ctl(&c, &out, "status");
                torn = rollouts_at(out, "torn");
                free(out);
                if (torn < NRO)
                    e2e_sleep_ms(100);
            }
            CHECK_INT(torn, NRO);
        }
        transfer_v(&c, v, &sent, mode);
        /* who gets what: full at the start, on delta_full_every, after the failed attempt
         * (the retry), after a rollout rejoined (every trainer set up again has no shadow),
         * and after a resumed retry (the trainers' shadows were not rebuilt whole) */
        bool want_full = v == 1 || v % FULL_EVERY == 0 || v == BAD || v == REJOIN || after_resume;
        for (int r = 0; r < NRO; r++)
            if (mode[r] != (want_full ? 'f' : 'd'))
                wb_test_fail(__FILE__, __LINE__,
                             "version %" PRIu64 ": rollout %d got %c, expected %s (sent %" PRIu64
                             " of %" PRIu64 ")",
                             v, r, mode[r], want_full ? "full" : "delta", sent, full);
        if (v == BAD) {
            after_resume = sent < full; /* what landed of version 20 was not sent again */
            CHECK(sent > 0);
        } else if (want_full) {
            after_resume = false;
            CHECK_U64(sent, full);
        } else { /* a small fraction changed: far less than a full update, never nothing */
            CHECK(sent > 0 && sent * 10 < full);
            deltas++;
            delta_bytes += sent;
        }
    }
    /* versions 2-15, 17-19, 21 or 22-29, 31, 33-47, 49-50 went as deltas */
    CHECK(deltas >= 40);
    ctl(&c, &out, "status");
    char want[128];
    snprintf(want, sizeof(want), "version 50: %" PRIu64 " of a full update's %" PRIu64 " bytes",
             sent, full);
    CHECK_CONTAINS(out, want);
    CHECK_CONTAINS(out, "deltas to 2 rollouts");
    CHECK_INT(rollouts_at(out, "50"), NRO);
    free(out);
    printf("  %s: %" PRIu64 " delta versions, %.2f%% of a full update's bytes on average\n",
           provider, deltas, 100.0 * (double)delta_bytes / (double)deltas / (double)full);
    stop(&c);
}

static void test_tcp(void)
{
    run_delta("tcp", "lo", 51);
}

static void test_shm(void)
{
    run_delta("shm", NULL, 53);
}

/* A delta job without its base: the job keys are checked, naming the file and line. */
static void test_bad_keys(void)
{
    char *out = NULL;
    const char *job = wb_test_write_file("bad.yaml", "name: x\ntrainers: 1\nrollouts: 1\n"
                                                     "delta: true\ndelta_full_every: 0\n"
                                                     "synthetic_change: 1.5\n");
    char cmd[900];
    snprintf(cmd, sizeof(cmd), "%s wb-controller --config %s --listen tcp://127.0.0.1:%u", TOK, job,
             e2e_port(55));
    CHECK_INT(e2e_run(&out, "%s", cmd), 1);
    CHECK_CONTAINS(out, "bad.yaml:5:19: delta_full_every: must be at least 1\n");
    CHECK_CONTAINS(out, "bad.yaml:6:19: synthetic_change: 1.5 is not a fraction (0 to 1)");
    free(out);
}

const struct wb_test wb_tests[] = {
    {"tcp", test_tcp, 420},
    {"shm", test_shm, 420},
    {"bad_keys", test_bad_keys, 30},
    {0},
};
