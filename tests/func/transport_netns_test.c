/* transport_netns_test.c — the transport conformance suite (transport_suite.h) with the tcp
 * provider across two network namespaces joined by a veth pair: the namespaces, the link and
 * private 10.231.x addresses are created by the test inside those namespaces only, removed
 * afterwards (and, when an earlier run was killed, at the next run). Skipped with the reason
 * where namespaces cannot be made (not root, no iproute2, no CAP_SYS_ADMIN). */
#include "tests/func/transport_suite.h"

/* ---------------------------------------------------------------- network namespaces */

/* Removes namespaces left by earlier runs that were killed (their pid in the name is gone). */
static void sweep_netns(void)
{
    FILE *f = popen("ip netns list 2>/dev/null", "r");
    if (!f)
        return;
    char line[256];
    while (fgets(line, sizeof(line), f)) {
        int pid;
        char side;
        if (sscanf(line, "wbtx%d%c", &pid, &side) == 2 && kill(pid, 0) != 0 && errno == ESRCH)
            wb_test_sh("ip netns del wbtx%d%c", pid, side);
    }
    pclose(f);
}

static void netns_run(const struct bk *bk, enum case_id c)
{
    if (geteuid() != 0)
        wb_test_skip("network namespaces need root");
    sweep_netns();
    int id = getpid();
    char ns[2][32], veth[2][16];
    for (int r = 0; r < 2; r++) {
        snprintf(ns[r], sizeof(ns[r]), "wbtx%d%c", id, "ab"[r]);
        snprintf(veth[r], sizeof(veth[r]), "wbv%d%c", id % 1000000, "ab"[r]);
    }
    if (!wb_test_sh("ip netns add %s", ns[0]))
        wb_test_skip("cannot create network namespaces here (ip netns add failed)");
    bool ok = wb_test_sh("ip netns add %s", ns[1]) &&
              wb_test_sh("ip link add %s type veth peer name %s", veth[0], veth[1]) &&
              wb_test_sh("ip link set %s netns %s", veth[0], ns[0]) &&
              wb_test_sh("ip link set %s netns %s", veth[1], ns[1]);
    /* Private addresses, only inside the two private namespaces. */
    for (int r = 0; ok && r < 2; r++)
        ok = wb_test_sh("ip -n %s addr add 10.231.%d.%d/24 dev %s", ns[r], id % 200, r + 1,
                        veth[r]) &&
             wb_test_sh("ip -n %s link set %s up", ns[r], veth[r]) &&
             wb_test_sh("ip -n %s link set lo up", ns[r]);
    if (!ok) {
        wb_test_sh("ip netns del %s", ns[0]);
        wb_test_sh("ip netns del %s", ns[1]);
        wb_test_sh("ip link del %s", veth[0]);
        wb_test_skip("cannot wire two namespaces with a veth pair here");
    }
    /* The run happens in a child so that a failed check still reaches the cleanup below. */
    fflush(NULL);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        struct run rn = {.bk = bk, .c = c, .netns = {ns[0], ns[1]}, .domain = {veth[0], veth[1]}};
        run_pair(&rn);
        fflush(NULL);
        _exit(0);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    wb_test_sh("ip netns del %s", ns[0]);
    wb_test_sh("ip netns del %s", ns[1]);
    if (WIFEXITED(st) && WEXITSTATUS(st) == 77)
        wb_test_skip("skipped inside the namespaces");
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

/* ---------------------------------------------------------------- the table */

// clang-format off
static void tcp_sizes(void) { netns_run(&TCP, C_SIZES); }
static void tcp_imm(void) { netns_run(&TCP, C_IMM); }
static void tcp_zero(void) { netns_run(&TCP, C_ZERO); }
static void tcp_bounds(void) { netns_run(&TCP, C_BOUNDS); }
static void tcp_eagain(void) { netns_run(&TCP, C_EAGAIN); }
static void tcp_killed(void) { netns_run(&TCP, C_KILLED); }
static void tcp2_sizes(void) { netns_run(&TCP2, C_SIZES); }
static void tcp2_two(void) { netns_run(&TCP2, C_TWO); }
// clang-format on

const struct wb_test wb_tests[] = {
    {"tcp_sizes", tcp_sizes, 240},
    {"tcp_imm", tcp_imm, 240},
    {"tcp_zero", tcp_zero, 240},
    {"tcp_bounds", tcp_bounds, 240},
    {"tcp_eagain", tcp_eagain, 240},
    {"tcp_killed", tcp_killed, 240},
    {"tcp2_sizes", tcp2_sizes, 240},
    {"tcp2_two", tcp2_two, 240},
    {0},
};
