/* wb-agent — a synthetic worker on one trainer or rollout GPU: an endpoint (agent/agent.h) that
 * holds what the plan assigns its rank instead of a process's own tensors, with trainer values
 * from the synthetic source, for the demo, tests and benchmarks. It registers with the
 * controller and executes (trainer) or receives (rollout) every transfer. Started by hand, by a
 * script, or by torchrun / srun (the rank and local GPU then come from the launcher's
 * environment). */
#include "agent/agent.h"
#include "agent/priv.h" /* ag_state_request: a testing hook of the program, not the API */

#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f)
{
    fprintf(
        f,
        "usage: wb-agent --role trainer|rollout [--rank R] --controller URL [options]\n"
        "\n"
        "  -r, --role ROLE         trainer or rollout\n"
        "  -n, --rank R            rank within the role (default: $RANK (torchrun) or\n"
        "                          $SLURM_PROCID (Slurm))\n"
        "  -c, --controller URL    controller address (default tcp://127.0.0.1:7420)\n"
        "  -d, --device D          GPU index (default: $LOCAL_RANK / $SLURM_LOCALID when\n"
        "                          a GPU exists, else host memory)\n"
        "  -t, --token TOKEN       cluster token (default $WB_TOKEN)\n"
        "      --trace DIR         write a Chrome trace (Perfetto) of each version into DIR\n"
        "                          (<role><rank>.v<N>.json, the job's trace_keep newest kept;\n"
        "                          instead of the job's trace: directory)\n"
        "      --give-up DURATION  exit when the controller cannot be reached (no connection)\n"
        "                          this long (trainers: 30s; rollouts: never, they keep the\n"
        "                          weights and wait); a slow controller is waited for\n"
        "      --pace DURATION     testing: wait this long before each task starts\n"
        "      --tx-domain NAME    transport domain: NIC or interface (tcp: e.g. lo, eth0)\n"
        "      --tx-extra YAML     more transport settings, e.g. 'hmem: off' or\n"
        "                          $'rails: 2\\nshard_size: 1MiB' (keys: transport/transport.h)\n"
        "      --dump DIR          rollouts: write DIR/rollout<rank>.v<N>.bin after each\n"
        "                          complete version (wb-ctl verify checks them)\n"
        "      --dump-from N       only versions N and later (a large model's last one)\n"
        "                          (testing: SIGUSR1 writes the tensors as they are, and the\n"
        "                          version and torn flag claimed, under DIR/state/)\n"
        "      --corrupt TENSOR    testing (rollouts of a job that verifies): flip a byte of\n"
        "                          TENSOR once it landed, before it is checked\n"
        "      --corrupt-delta N   testing (trainers of a delta job): in version N, leave a\n"
        "                          changed byte out of the deltas, as a wrong shadow would\n"
        "  -h, --help              this text\n");
}

static struct wb_endpoint *g_ep; /* for the SIGUSR1 handler */

static void on_usr1(int sig)
{
    (void)sig;
    if (g_ep)
        ag_state_request(g_ep);
}

int main(int argc, char **argv)
{
    static const struct option lo[] = {{"role", required_argument, 0, 'r'},
                                       {"rank", required_argument, 0, 'n'},
                                       {"controller", required_argument, 0, 'c'},
                                       {"device", required_argument, 0, 'd'},
                                       {"token", required_argument, 0, 't'},
                                       {"trace", required_argument, 0, 'T'},
                                       {"give-up", required_argument, 0, 'G'},
                                       {"pace", required_argument, 0, 'P'},
                                       {"tx-domain", required_argument, 0, 'D'},
                                       {"dump", required_argument, 0, 'U'},
                                       {"dump-from", required_argument, 0, 'F'},
                                       {"tx-extra", required_argument, 0, 'X'},
                                       {"corrupt", required_argument, 0, 'K'},
                                       {"corrupt-delta", required_argument, 0, 'Y'},
                                       {"help", no_argument, 0, 'h'},
                                       {0}};
    struct wb_endpoint_opts o = {
        .device = -1, .controller = "tcp://127.0.0.1:7420", .synthetic = true};
    const char *role = NULL;
    int64_t rank = -1, device = -2;
    int ch;
    while ((ch = getopt_long(argc, argv, "r:n:c:d:t:h", lo, NULL)) != -1) {
        switch (ch) {
        case 'r':
            role = optarg;
            break;
        case 'n':
            if (wb_parse_i64(optarg, &rank) || rank < 0 || rank > UINT32_MAX) {
                fprintf(stderr, "wb-agent: --rank: expected a non-negative integer, got '%s'\n",
                        optarg);
                return 2;
            }
            break;
        case 'c':
            o.controller = optarg;
            break;
        case 'd':
            if (wb_parse_i64(optarg, &device) || device < -1 || device > INT32_MAX) {
                fprintf(stderr, "wb-agent: --device: expected a GPU index or -1, got '%s'\n",
                        optarg);
                return 2;
            }
            break;
        case 't':
            o.token = optarg;
            break;
        case 'T': {
            int e = wb_endpoint_trace_check(optarg);
            if (e) {
                fprintf(stderr, "wb-agent: --trace %s: %s (a directory to write traces into)\n",
                        optarg, wb_strerror(e));
                return 2;
            }
            o.trace = optarg;
            break;
        }
        case 'G':
        case 'P': {
            uint64_t ns;
            if (wb_parse_duration(optarg, &ns)) {
                fprintf(stderr, "wb-agent: --%s: expected a duration such as 2s, got '%s'\n",
                        ch == 'G' ? "give-up" : "pace", optarg);
                return 2;
            }
            *(ch == 'G' ? &o.give_up_ns : &o.pace_ns) = ns;
            break;
        }
        case 'D':
            o.tx_domain = optarg;
            break;
        case 'U':
            o.dump = optarg;
            break;
        case 'F':
        case 'Y': {
            char *end;
            errno = 0;
            unsigned long long v = strtoull(optarg, &end, 10);
            if (errno || end == optarg || *end || *optarg == '-') {
                fprintf(stderr, "wb-agent: --%s: '%s' is not a version number\n",
                        ch == 'F' ? "dump-from" : "corrupt-delta", optarg);
                return 2;
            }
            *(ch == 'F' ? &o.dump_from : &o.corrupt_delta) = v;
            break;
        }
        case 'X':
            o.tx_extra = optarg;
            break;
        case 'K':
            o.corrupt = optarg;
            break;
        case 'h':
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
    }
    if (!role || optind != argc) {
        usage(stderr);
        return 2;
    }
    if (wb_role_parse(role, &o.role)) {
        fprintf(stderr, "wb-agent: --role: expected trainer or rollout, got '%s'\n", role);
        return 2;
    }
    struct wb_launch_env env;
    const char *bad = NULL;
    if (wb_launch_env_read(&env, &bad)) {
        fprintf(stderr, "wb-agent: $%s is not a non-negative integer\n", bad);
        return 2;
    }
    if (rank < 0)
        rank = env.rank;
    if (rank < 0) {
        fprintf(stderr, "wb-agent: no rank: give --rank, or start under torchrun ($RANK) or "
                        "srun ($SLURM_PROCID)\n");
        return 2;
    }
    o.rank = (uint32_t)rank;
    if (device == -2)
        device = wb_gpu_count() > 0 ? (env.local_rank >= 0 ? env.local_rank : 0) : -1;
    o.device = (int32_t)device;
    if (!(o.token = wb_token_resolve(o.token))) {
        fprintf(stderr, "wb-agent: no cluster token: give --token or set $WB_TOKEN\n");
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    struct wb_endpoint *ep;
    int err = wb_endpoint_open(&o, &ep);
    if (err) {
        fprintf(stderr, "wb-agent: cannot reach %s: %s\n", o.controller, wb_strerror(err));
        return 1;
    }
    g_ep = ep;
    if (o.dump) {
        struct sigaction sa = {.sa_handler = on_usr1};
        sigemptyset(&sa.sa_mask);
        sa.sa_flags = SA_RESTART;
        sigaction(SIGUSR1, &sa, NULL);
    }
    err = wb_endpoint_run(ep);
    if (err)
        fprintf(stderr, "wb-agent: %s\n", wb_endpoint_error(ep));
    wb_endpoint_close(ep);
    return err ? 1 : 0;
}
