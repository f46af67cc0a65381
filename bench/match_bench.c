/* match_bench.c — how long the matcher takes on the largest shipped model: Kimi-K2 (61 layers,
 * 384 routed experts: ~70k trainer tensors in Hugging Face naming, ~1.3k vLLM rollout tensors
 * with FP8 scales). Prints generation, rules-loading and matching times, and the match time as
 * a ratio of a baseline measured in the same run: one hash lookup per trainer tensor, the
 * least work any matcher that looks at every trainer tensor must do. The goal is < 0.5 s per
 * match on a 2-core machine. Other families are timed the same way for comparison.
 *
 * Usage: match_bench [--runs N] [--family FILE --config FILE]...   (run from the repo root) */
#include "matcher/matcher.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct job {
    const char *name, *family, *config;
};

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static double ms(uint64_t ns)
{
    return ns / 1e6;
}

static int run(const struct job *j, int runs, bool headline)
{
    struct wb_errlist el;
    wb_errlist_init(&el);
    struct wb_inventory t, r;
    wb_inv_init(&t);
    wb_inv_init(&r);
    struct wb_match_rules *rules = NULL;
    int rc = 1;
    uint64_t t0 = wb_now_ns();
    if (wb_inv_generate(j->family, j->config, "trainer", &t, &el))
        goto out;
    uint64_t t1 = wb_now_ns();
    if (wb_inv_generate(j->family, j->config, "rollout", &r, &el))
        goto out;
    uint64_t t2 = wb_now_ns();
    if (wb_match_rules_load(j->family, &rules, &el) ||
        wb_match_rules_bind_config(rules, j->config, &el))
        goto out;
    uint64_t t3 = wb_now_ns();

    uint64_t *base = calloc((size_t)runs, sizeof(*base));
    uint64_t *match = calloc((size_t)runs, sizeof(*match));
    size_t nmap = 0, found = 0;
    if (!base || !match) {
        free(base);
        free(match);
        goto out;
    }
    for (int i = 0; i < runs; i++) {
        uint64_t a = wb_now_ns();
        for (size_t k = 0; k < t.n; k++)
            found += wb_inv_find(&t, t.p[k].name) == (ssize_t)k;
        uint64_t b = wb_now_ns();
        struct wb_match *m = NULL;
        int e = wb_match_run(rules, &t, &r, &m, &el);
        uint64_t c = wb_now_ns();
        if (e) {
            free(base);
            free(match);
            goto out;
        }
        nmap = m->n;
        wb_match_free(m);
        base[i] = b - a;
        match[i] = c - b;
    }
    qsort(base, (size_t)runs, sizeof(*base), cmp_u64);
    qsort(match, (size_t)runs, sizeof(*match), cmp_u64);
    uint64_t bmed = base[runs / 2], mmed = match[runs / 2];
    printf("%-16s trainer %6zu  rollout %5zu  mappings %4zu | generate %7.1f + %5.1f ms, rules "
           "%4.1f ms | match median %7.1f ms (min %7.1f) = %5.1fx baseline %5.2f ms%s\n",
           j->name, t.n, r.n, nmap, ms(t1 - t0), ms(t2 - t1), ms(t3 - t2), ms(mmed), ms(match[0]),
           bmed ? (double)mmed / (double)bmed : 0.0, ms(bmed),
           found == t.n * (size_t)runs ? "" : " (lookup mismatch!)");
    if (headline)
        printf("goal: match Kimi-K2 in < 500 ms: %s (%.1f ms median of %d)\n",
               mmed < 500000000ull ? "met" : "NOT met", ms(mmed), runs);
    free(base);
    free(match);
    rc = 0;
out:
    if (rc)
        wb_errlist_print(&el, "match_bench: ", stderr);
    wb_match_rules_free(rules);
    wb_inv_free(&t);
    wb_inv_free(&r);
    wb_errlist_free(&el);
    return rc;
}

int main(int argc, char **argv)
{
    int runs = 5;
    struct job custom[16];
    int ncustom = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            printf("usage: %s [--runs N] [--family FILE --config FILE]...\n"
                   "Times inventory generation, rules loading and matching for the shipped\n"
                   "families (Kimi-K2 first), or for the given family/config pairs. Run from\n"
                   "the repository root. Prints match time as a ratio of a same-run baseline\n"
                   "(one hash lookup per trainer tensor).\n",
                   argv[0]);
            return 0;
        } else if (strcmp(argv[i], "--runs") == 0 && i + 1 < argc) {
            runs = atoi(argv[++i]);
            if (runs < 1 || runs > 1000) {
                fprintf(stderr, "match_bench: --runs must be 1..1000\n");
                return 2;
            }
        } else if (strcmp(argv[i], "--family") == 0 && i + 3 < argc &&
                   strcmp(argv[i + 2], "--config") == 0 && ncustom < 16) {
            custom[ncustom++] = (struct job){argv[i + 3], argv[i + 1], argv[i + 3]};
            i += 3;
        } else {
            fprintf(stderr, "match_bench: unknown argument '%s' (see --help)\n", argv[i]);
            return 2;
        }
    }
    if (ncustom) {
        for (int i = 0; i < ncustom; i++)
            if (run(&custom[i], runs, false))
                return 1;
        return 0;
    }
    static const struct job jobs[] = {
        {"Kimi-K2", "configs/models/deepseek_v3.yaml", "configs/hf/Kimi-K2-Instruct.json"},
        {"DeepSeek-V3", "configs/models/deepseek_v3.yaml", "configs/hf/DeepSeek-V3.json"},
        {"Qwen3-235B-A22B", "configs/models/qwen3_moe.yaml", "configs/hf/Qwen3-235B-A22B.json"},
        {"Qwen3-30B-A3B", "configs/models/qwen3_moe.yaml", "configs/hf/Qwen3-30B-A3B.json"},
        {"Qwen3-8B-FP8", "configs/models/qwen3.yaml", "configs/hf/Qwen3-8B-FP8.json"},
        {"Llama-3.1-8B", "configs/models/llama3.yaml", "configs/hf/Llama-3.1-8B.json"},
    };
    for (size_t i = 0; i < WB_ARRAY_LEN(jobs); i++)
        if (run(&jobs[i], runs, i == 0))
            return 1;
    return 0;
}
