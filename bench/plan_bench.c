/* plan_bench.c — the planner on the shipped Kimi-K2 scenario (256 trainer GPUs FSDP 16 x PP 2
 * x EP 8 -> 128 rollout GPUs FP8, EP 32 x 4 replicas): wall time, peak RSS, and the busiest
 * sender against the lower bound and against the reference greedy computed in the same run.
 *
 * Each build runs in a forked child so that its peak RSS is its own (wait4's rusage); each mode
 * is built RUNS times with the default number of building threads (the median is reported) and
 * once with one thread. Goals (issue 4): plan <= 1 s, peak RSS <= 1 GiB, busiest sender <= 1.05 x
 * lower bound, and never worse than the greedy. The goals are printed beside the figures; timing
 * never decides the exit status. Usage: see --help. */
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "planner/planner.h"

static const char *const MODEL = "configs/models/deepseek_v3.yaml";
static const char *const CONFIG = "configs/hf/Kimi-K2-Instruct.json";
static const char *const TRAINER = "configs/clusters/kimi-k2-trainer-256.yaml";
static const char *const ROLLOUT = "configs/clusters/kimi-k2-rollout-128.yaml";

/* What a child reports to the parent through a pipe. */
struct result {
    double match_s, plan_s;
    uint64_t tasks, ops, writes;
    double max_lb, greedy_lb, max_greedy;
};

static int child(enum wb_plan_mode mode, uint32_t threads, int fd)
{
    struct wb_errlist el;
    wb_errlist_init(&el);
    struct wb_model md;
    struct wb_model_src src = {
        .rules = MODEL, .config = CONFIG, .trainer_layout = TRAINER, .rollout_layout = ROLLOUT};
    uint64_t t0 = wb_now_ns();
    if (wb_model_load(&src, &md, &el)) {
        wb_errlist_print(&el, "plan_bench: ", stderr);
        return 1;
    }
    uint64_t t1 = wb_now_ns();
    struct wb_plan_input in = wb_model_input(&md);
    struct wb_plan_opts o = {.mode = mode, .mem_cap = 0, .threads = threads};
    struct wb_plan *p;
    if (wb_plan_build(&in, &o, &p, &el)) {
        wb_errlist_print(&el, "plan_bench: ", stderr);
        return 1;
    }
    uint64_t t2 = wb_now_ns();
    const struct wb_plan_stats *s = &p->stats;
    double lb = (double)s->lower_bound;
    struct result res = {(double)(t1 - t0) * 1e-9,
                         (double)(t2 - t1) * 1e-9,
                         s->tasks,
                         s->ops,
                         s->writes,
                         (double)s->max_send / lb,
                         (double)s->greedy_max / lb,
                         (double)s->max_send / (double)s->greedy_max};
    if (write(fd, &res, sizeof(res)) != (ssize_t)sizeof(res))
        return 1;
    wb_plan_free(p);
    wb_model_free(&md);
    wb_errlist_free(&el);
    return 0;
}

/* Runs one build in a child; fills *res and *rss_gib. */
static int run(enum wb_plan_mode mode, uint32_t threads, struct result *res, double *rss_gib)
{
    int fds[2];
    if (pipe(fds)) {
        perror("plan_bench");
        return 1;
    }
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        close(fds[0]);
        _exit(child(mode, threads, fds[1]));
    }
    close(fds[1]);
    ssize_t got = pid < 0 ? -1 : read(fds[0], res, sizeof(*res));
    close(fds[0]);
    int st;
    struct rusage ru;
    if (pid < 0 || wait4(pid, &st, 0, &ru) < 0) {
        perror("plan_bench");
        return 1;
    }
    if (!WIFEXITED(st) || WEXITSTATUS(st) || got != (ssize_t)sizeof(*res))
        return 1;
    *rss_gib = (double)ru.ru_maxrss / (1024.0 * 1024.0);
    return 0;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

enum { RUNS = 3 };

int main(int argc, char **argv)
{
    uint32_t threads = 0;
    int i = 1;
    if (argc > 1 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)) {
        printf("usage: plan_bench [--threads N] [auto|direct|gather ...]\n"
               "Plans the shipped Kimi-K2 256 -> 128 scenario (run from the repository root)\n"
               "%d times per mode with N building threads (default: one per CPU, at most 8)\n"
               "and once with one thread, and prints the median wall time, peak RSS and the\n"
               "busiest sender against the lower bound and against the reference greedy\n"
               "computed in the same run. Default modes: auto gather.\n",
               RUNS);
        return 0;
    }
    if (argc > 2 && strcmp(argv[1], "--threads") == 0) {
        char *end;
        unsigned long v = strtoul(argv[2], &end, 10);
        if (*end || v < 1 || v > 64) {
            fprintf(stderr, "plan_bench: --threads: '%s' is not a number from 1 to 64\n", argv[2]);
            return 2;
        }
        threads = (uint32_t)v;
        i = 3;
    }
    const char *defaults[] = {"auto", "gather"};
    int n = argc > i ? argc - i : 2;
    cpu_set_t set;
    long ncpu = sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set)
                                                             : sysconf(_SC_NPROCESSORS_ONLN);
    printf("plan_bench: Kimi-K2 %s -> %s (%ld CPUs to run on; threads: %s)\n", TRAINER, ROLLOUT,
           ncpu, threads ? argv[2] : "one per CPU, at most 8");
    for (int k = 0; k < n; k++) {
        enum wb_plan_mode mode;
        const char *name = argc > i ? argv[i + k] : defaults[k];
        if (wb_plan_mode_parse(name, &mode)) {
            fprintf(stderr, "plan_bench: unknown mode '%s'\n", name);
            return 2;
        }
        struct result res[RUNS], one;
        double t[RUNS], rss = 0, rss1;
        for (int r = 0; r < RUNS; r++) {
            double g;
            if (run(mode, threads, &res[r], &g))
                return 1;
            t[r] = res[r].plan_s;
            rss = g > rss ? g : rss;
        }
        if (run(mode, 1, &one, &rss1))
            return 1;
        qsort(t, RUNS, sizeof(double), cmp_double);
        const struct result *s = &res[0];
        printf("mode %-6s inventories+match %.2f s | plan %.2f s median of %d (min %.2f, max %.2f; "
               "goal <= 1 s) | one thread %.2f s | %llu tasks, %llu ops, %llu writes\n",
               name, s->match_s, t[RUNS / 2], RUNS, t[0], t[RUNS - 1], one.plan_s,
               (unsigned long long)s->tasks, (unsigned long long)s->ops,
               (unsigned long long)s->writes);
        printf(
            "            busiest sender / lower bound = %.4f (goal <= 1.05) | reference greedy / "
            "lower bound = %.4f | ours / greedy = %.4f (goal <= 1)\n",
            s->max_lb, s->greedy_lb, s->max_greedy);
        printf("            peak RSS %.2f GiB (goal <= 1 GiB; includes inventories and match)\n",
               rss);
    }
    return 0;
}
