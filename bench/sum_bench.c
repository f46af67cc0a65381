/* sum_bench.c — what a write checksum (wb_sum64, common.h) costs: on the host against plain
 * XXH3-64 of the same bytes, and on a GPU (when there is one) the batch kernel over 1 GiB of
 * device memory cut into pieces of 4 KiB .. 64 MiB, 8-byte aligned and not, against a D2D copy
 * of the same bytes in the same run (a copy reads and writes each byte: the HBM floor of a
 * pass over them is about half its time). Each number is the best of --reps runs.
 *
 * Usage: build/bench/sum_bench [--reps N] [--gib G]   (scripts/gpu/sum_check.sh runs it) */
#include "common/common.h"
#include "transport/transport.h"

#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>
#if defined(__x86_64__)
#include <xxh_x86dispatch.h> /* the XXH3 wb_sum64 uses (AVX2 where there is one) */
#endif

static double best_of(int reps, double (*fn)(void *), void *arg)
{
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        double t = fn(arg);
        if (t < best)
            best = t;
    }
    return best;
}

struct host_arg {
    const uint8_t *p;
    size_t n;
    uint64_t sink;
};

static double host_sum(void *a)
{
    struct host_arg *h = a;
    uint64_t t0 = wb_now_ns();
    h->sink ^= wb_sum64(h->p, h->n);
    return (double)(wb_now_ns() - t0) / 1e9;
}

static double host_xxh3(void *a)
{
    struct host_arg *h = a;
    uint64_t t0 = wb_now_ns();
    h->sink ^= XXH3_64bits(h->p, h->n);
    return (double)(wb_now_ns() - t0) / 1e9;
}

struct gpu_arg {
    struct wb_sum_gpu *g;
    struct wb_sum_piece *pc;
    size_t n;
    uint64_t *sums;
    int rc;
};

static double gpu_sum(void *a)
{
    struct gpu_arg *g = a;
    uint64_t t0 = wb_now_ns();
    int rc = wb_sum_gpu_run(g->g, g->pc, g->n, NULL, g->sums);
    if (rc)
        g->rc = rc;
    return (double)(wb_now_ns() - t0) / 1e9;
}

struct copy_arg {
    void *dst;
    const void *src;
    size_t n;
};

static double gpu_copy(void *a)
{
    struct copy_arg *c = a;
    uint64_t t0 = wb_now_ns();
    wb_tx_mem_copy_reps(c->dst, c->src, c->n, 1);
    return (double)(wb_now_ns() - t0) / 1e9;
}

int main(int argc, char **argv)
{
    int reps = 5;
    double gib = 1;
    static const struct option opts[] = {
        {"reps", required_argument, 0, 'r'}, {"gib", required_argument, 0, 'g'}, {0}};
    for (int c; (c = getopt_long(argc, argv, "", opts, NULL)) != -1;) {
        if (c == 'r')
            reps = atoi(optarg);
        else if (c == 'g')
            gib = atof(optarg);
        else {
            fprintf(stderr, "usage: sum_bench [--reps N] [--gib G]\n");
            return 2;
        }
    }
    size_t bytes = (size_t)(gib * (1u << 30)) / 4096 * 4096 + 4096;
    if (reps < 1 || gib <= 0) {
        fprintf(stderr, "sum_bench: --reps and --gib must be positive\n");
        return 2;
    }
    uint8_t *host = malloc(bytes);
    if (!host) {
        fprintf(stderr, "sum_bench: no memory for %zu bytes\n", bytes);
        return 1;
    }
    for (size_t i = 0; i < bytes; i++)
        host[i] = (uint8_t)(i * 2654435761u >> 13);
    size_t n = bytes - 4096;
    struct host_arg ha = {host, n, 0};
    double ts = best_of(reps, host_sum, &ha), tx = best_of(reps, host_xxh3, &ha);
    printf("host, %.2f GiB: wb_sum64 %.1f GB/s, plain XXH3-64 %.1f GB/s (wb_sum64 / XXH3 time "
           "%.2fx)\n",
           (double)n / (1u << 30), n / ts / 1e9, n / tx / 1e9, ts / tx);
    if (wb_gpu_count() <= 0) {
        printf("no GPU: the device part is not measured\n");
        free(host);
        return 0;
    }
    void *dev = NULL, *dev2 = NULL;
    struct wb_sum_gpu *g = NULL;
    int rc = wb_tx_mem_alloc(WB_TX_MEM_CUDA, -1, bytes, &dev);
    rc = rc ? rc : wb_tx_mem_alloc(WB_TX_MEM_CUDA, -1, bytes, &dev2);
    rc = rc ? rc : wb_tx_mem_copy(dev, host, bytes);
    rc = rc ? rc : wb_sum_gpu_new(&g);
    if (rc) {
        fprintf(stderr, "sum_bench: GPU setup: %s\n", wb_strerror(rc));
        return 1;
    }
    struct copy_arg ca = {dev2, dev, n};
    double tc = best_of(reps, gpu_copy, &ca);
    printf("GPU, %.2f GiB: D2D copy %.3f ms (%.0f GB/s read + write)\n", (double)n / (1u << 30),
           tc * 1e3, 2 * n / tc / 1e9);
    printf("%10s %8s %9s %10s %10s %12s %s\n", "piece", "pieces", "aligned", "ms", "GB/s",
           "vs copy time", "check");
    static const size_t psz[] = {4096, 65536, 1u << 20, 16u << 20, 64u << 20, 70001};
    size_t maxp = n / 4096;
    struct wb_sum_piece *pc = malloc(maxp * sizeof(*pc));
    uint64_t *sums = malloc(maxp * sizeof(uint64_t));
    int bad = 0;
    for (size_t s = 0; s < WB_ARRAY_LEN(psz) && pc && sums; s++)
        for (int al = 1; al >= 0; al--) {
            size_t np = n / psz[s], shift = al ? 0 : 1;
            for (size_t i = 0; i < np; i++)
                pc[i] = (struct wb_sum_piece){(uint8_t *)dev + i * psz[s] + shift, psz[s] - shift};
            struct gpu_arg ga = {g, pc, np, sums, 0};
            double t = best_of(reps, gpu_sum, &ga);
            size_t moved = np * (psz[s] - shift);
            /* a sample of the pieces against the host */
            bool ok = ga.rc == 0;
            for (size_t i = 0; ok && i < np; i += np / 7 + 1)
                ok = sums[i] == wb_sum64(host + i * psz[s] + shift, psz[s] - shift);
            bad |= !ok;
            printf("%10zu %8zu %9s %10.3f %10.0f %11.2fx %s\n", psz[s], np, al ? "yes" : "+1 byte",
                   t * 1e3, moved / t / 1e9, t / tc, ok ? "ok" : "MISMATCH");
        }
    wb_sum_gpu_free(g);
    wb_tx_mem_free(WB_TX_MEM_CUDA, dev);
    wb_tx_mem_free(WB_TX_MEM_CUDA, dev2);
    free(pc);
    free(sums);
    free(host);
    return bad;
}
