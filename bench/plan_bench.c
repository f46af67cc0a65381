/* plan_bench.c — the planner on the shipped Kimi-K2 scenario (256 trainer GPUs FSDP 16 x PP 2
 * x EP 8 -> 128 rollout GPUs FP8, EP 32 x 4 replicas): wall time, peak RSS, and the busiest
 * sender against the lower bound and against the reference greedy computed in the same run.
 *
 * Each mode runs in a forked child so that its peak RSS is its own (wait4's rusage).
 * Goals (issue 4): plan <= 1 s, peak RSS <= 1 GiB, busiest sender <= 1.05 x lower bound, and
 * never worse than the greedy. Usage: plan_bench [auto|direct|gather ...] (default: auto gather).
 */
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

static int child(enum wb_plan_mode mode)
{
    struct wb_errlist el;
    wb_errlist_init(&el);
    struct wb_trainer_layout tl;
    struct wb_rollout_layout rl;
    struct wb_inventory ti, ri;
    struct wb_match_rules *rules = NULL;
    struct wb_match *mt = NULL;
    wb_inv_init(&ti);
    wb_inv_init(&ri);
    uint64_t t0 = wb_now_ns();
    if (wb_trainer_layout_load(TRAINER, &tl, &el) || wb_rollout_layout_load(ROLLOUT, &rl, &el) ||
        wb_inv_generate(MODEL, CONFIG, "trainer", &ti, &el) ||
        wb_inv_generate(MODEL, CONFIG, "rollout", &ri, &el) ||
        wb_match_rules_load(MODEL, &rules, &el) || wb_match_rules_bind_config(rules, CONFIG, &el) ||
        wb_match_run(rules, &ti, &ri, &mt, &el)) {
        wb_errlist_print(&el, "plan_bench: ", stderr);
        return 1;
    }
    uint64_t t1 = wb_now_ns();
    struct wb_plan_input in = {&ti, &ri, mt, &tl, &rl};
    struct wb_plan_opts o = {mode, 1ull << 30};
    struct wb_plan *p;
    if (wb_plan_build(&in, &o, &p, &el)) {
        wb_errlist_print(&el, "plan_bench: ", stderr);
        return 1;
    }
    uint64_t t2 = wb_now_ns();
    const struct wb_plan_stats *s = &p->stats;
    double lb = (double)s->lower_bound;
    printf("mode %-6s inventories+match %.2f s | plan %.2f s (goal <= 1 s) | %llu tasks, %llu "
           "ops, %llu writes\n",
           wb_plan_mode_name(mode), (double)(t1 - t0) * 1e-9, (double)(t2 - t1) * 1e-9,
           (unsigned long long)s->tasks, (unsigned long long)s->ops, (unsigned long long)s->writes);
    printf("            busiest sender / lower bound = %.4f (goal <= 1.05) | reference greedy / "
           "lower bound = %.4f | ours / greedy = %.4f (goal <= 1)\n",
           (double)s->max_send / lb, (double)s->greedy_max / lb,
           (double)s->max_send / (double)s->greedy_max);
    fflush(stdout);
    wb_plan_free(p);
    wb_match_free(mt);
    wb_match_rules_free(rules);
    wb_inv_free(&ti);
    wb_inv_free(&ri);
    wb_trainer_layout_free(&tl);
    wb_rollout_layout_free(&rl);
    wb_errlist_free(&el);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc > 1 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)) {
        printf("usage: plan_bench [auto|direct|gather ...]\n"
               "Plans the shipped Kimi-K2 256 -> 128 scenario (run from the repository root)\n"
               "and prints wall time, peak RSS and balance against the lower bound and the\n"
               "reference greedy measured in the same run.\n");
        return 0;
    }
    const char *defaults[] = {"auto", "gather"};
    int n = argc > 1 ? argc - 1 : 2;
    printf("plan_bench: Kimi-K2 %s -> %s\n", TRAINER, ROLLOUT);
    int rc = 0;
    for (int i = 0; i < n; i++) {
        enum wb_plan_mode mode;
        const char *name = argc > 1 ? argv[i + 1] : defaults[i];
        if (wb_plan_mode_parse(name, &mode)) {
            fprintf(stderr, "plan_bench: unknown mode '%s'\n", name);
            return 2;
        }
        fflush(stdout);
        pid_t pid = fork();
        if (pid == 0)
            _exit(child(mode));
        int st;
        struct rusage ru;
        if (pid < 0 || wait4(pid, &st, 0, &ru) < 0) {
            perror("plan_bench");
            return 1;
        }
        if (!WIFEXITED(st) || WEXITSTATUS(st)) {
            rc = 1;
            continue;
        }
        printf("            peak RSS %.2f GiB (goal <= 1 GiB; includes inventories and match)\n",
               (double)ru.ru_maxrss / (1024.0 * 1024.0));
    }
    return rc;
}
