/* permute_bench.c — what a transposed component costs on the CPU path: wb_permute (common.h,
 * the host executor's PERMUTE op) of gpt-oss-shaped BF16 expert shards against a memcpy of the
 * same bytes in the same run, as a ratio. The shapes are one FSDP shard of gpt-oss-20b's
 * experts (dims [0, 2, 1]: gate_up_proj [E, 2880, 5760] -> [E, 5760, 2880] and down_proj
 * [E, 2880, 2880]), a square and a thin matrix, and a 4-d permutation that keeps the last dim
 * (a row copy per outer index). Each number is the best of --reps runs; the arrays are touched
 * before the first so that page faults are not timed.
 *
 * Usage: build/bench/permute_bench [--reps N] [--experts E]   (E: experts per shard, default 2) */
#include "common/common.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct shape_case {
    const char *name;
    uint32_t ndim;
    uint64_t ext[4];
    uint8_t perm[4];
};

static double secs(uint64_t t0)
{
    return (double)(wb_now_ns() - t0) / 1e9;
}

int main(int argc, char **argv)
{
    int reps = 5;
    uint64_t experts = 2;
    static const struct option opts[] = {{"reps", required_argument, 0, 'r'},
                                         {"experts", required_argument, 0, 'e'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    int o;
    while ((o = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        int64_t v;
        switch (o) {
        case 'r':
            if (wb_parse_i64(optarg, &v) || v < 1 || v > 1000) {
                fprintf(stderr, "permute_bench: --reps '%s': expected 1..1000\n", optarg);
                return 2;
            }
            reps = (int)v;
            break;
        case 'e':
            if (wb_parse_i64(optarg, &v) || v < 1 || v > 32) {
                fprintf(stderr, "permute_bench: --experts '%s': expected 1..32\n", optarg);
                return 2;
            }
            experts = (uint64_t)v;
            break;
        case 'h':
            printf("usage: %s [--reps N] [--experts E]\n"
                   "Times wb_permute (the CPU executor's transpose) of BF16 gpt-oss-shaped\n"
                   "expert shards against memcpy of the same bytes; prints the ratio.\n",
                   argv[0]);
            return 0;
        default:
            return 2;
        }
    }
    const struct shape_case cases[] = {
        {"gate_up_proj [E,2880,5760] -> [E,5760,2880]", 3, {experts, 2880, 5760}, {0, 2, 1}},
        {"down_proj [E,2880,2880] -> [E,2880,2880]^T", 3, {experts, 2880, 2880}, {0, 2, 1}},
        {"square [4096,4096]^T", 2, {4096, 4096}, {1, 0}},
        {"thin [64,65536]^T", 2, {64, 65536}, {1, 0}},
        {"keeps last dim [8,64,32,1024]->[64,8,32,1024]", 4, {8, 64, 32, 1024}, {1, 0, 2, 3}},
    };
    printf("%-46s %10s %12s %12s %8s\n", "case (bf16)", "MiB", "memcpy GB/s", "permute GB/s",
           "ratio");
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        const struct shape_case *k = &cases[c];
        uint64_t n = 1;
        for (uint32_t d = 0; d < k->ndim; d++)
            n *= k->ext[d];
        size_t bytes = n * 2;
        uint16_t *src = malloc(bytes), *dst = malloc(bytes);
        if (!src || !dst) {
            fprintf(stderr, "permute_bench: no memory for %zu bytes\n", 2 * bytes);
            return 1;
        }
        for (uint64_t i = 0; i < n; i++)
            src[i] = (uint16_t)(i * 2654435761u >> 7);
        memset(dst, 0, bytes);
        double tc = 1e30, tp = 1e30;
        for (int r = 0; r < reps; r++) {
            uint64_t t0 = wb_now_ns();
            memcpy(dst, src, bytes);
            double t = secs(t0);
            tc = t < tc ? t : tc;
            t0 = wb_now_ns();
            int rc = wb_permute(dst, src, 2, k->ndim, k->ext, k->perm);
            t = secs(t0);
            if (rc) {
                fprintf(stderr, "permute_bench: %s: %s\n", k->name, wb_strerror(rc));
                return 1;
            }
            tp = t < tp ? t : tp;
        }
        printf("%-46s %10.1f %12.2f %12.2f %7.2fx\n", k->name, (double)bytes / (1 << 20),
               (double)bytes / tc / 1e9, (double)bytes / tp / 1e9, tp / tc);
        free(src);
        free(dst);
    }
    printf("ratio: permute time / memcpy time of the same bytes (best of %d)\n", reps);
    return 0;
}
