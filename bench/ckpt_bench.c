/* ckpt_bench.c — reading a >= 1 GB safetensors checkpoint with our reader against the storage
 * floor measured in the same run.
 *
 * The floor: read(2) of each file from start to end into one buffer, the files one after the
 * other, in calls of the chunk size our reader uses (8 MiB; --chunk), as cat or dd would.
 * Ours: the checkpoint's shares for N readers, one thread each, every piece read with
 * wb_ckpt_read_piece into its place in one destination buffer (the tensors back to back), with
 * XXH3 checksums off and on, by pread (the default) and O_DIRECT. Both buffers are
 * touched before timing, so page faults of the destination are not measured. Every repetition
 * runs every case once (round-robin, forwards and backwards in turn), so drift in the machine's
 * load and the order of cases spread over all cases; medians are printed.
 *
 * Page cache: "cold" runs drop each file's clean pages first (fsync, then posix_fadvise
 * DONTNEED; how much stayed resident is measured with mincore and printed), "warm" runs read
 * right after a full read of the files. Cold on a VM can still be served by the host's cache:
 * compare cold GB/s with the device's rated speed before calling it the disk's.
 *
 * The checkpoint (default: the qwen3 family with tests/fixtures/ckpt/qwen3-1g.json, 1.28 GB in
 * 4 files) is written once into --dir with the synthetic source and reused while it matches. */
#include "bench/ckpt_common.h"
#include "ckpt/ckpt.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

struct opts {
    const char *dir, *rules, *config;
    uint32_t files;
    uint32_t readers[8];
    size_t nreaders;
    unsigned reps;
    uint64_t chunk;
    bool cold, warm;
};

static void usage(FILE *f)
{
    fprintf(f, "usage: ckpt_bench [--dir DIR] [--model FAMILY.yaml --config config.json] [--files "
               "N]\n"
               "                  [--readers 1,2,4] [--reps N] [--chunk SIZE] [--cold|--warm]\n"
               "  Reads a safetensors checkpoint with our reader (shares of N readers in threads,\n"
               "  checksums off and on, pread / O_DIRECT) and with a plain sequential\n"
               "  read(2) of each file in the same run, cold (page cache dropped per file) and\n"
               "  warm; prints GB/s and ratios to the plain read.\n"
               "  --dir DIR      where the checkpoint is written once and reused\n"
               "                 (default build/ckpt_bench)\n"
               "  --model/--config  the model (default configs/models/qwen3.yaml with\n"
               "                 tests/fixtures/ckpt/qwen3-1g.json, 1.28 GB)\n"
               "  --files N      data files when writing (default 4)\n"
               "  --readers L    reader counts (default 1,2,4)\n"
               "  --reps N       repetitions per case, the median is printed (default 3)\n"
               "  --chunk SIZE   bytes per read call of our reader (default 8MiB)\n"
               "  --cold|--warm  only one of the two (default both)\n");
}

static int parse(int argc, char **argv, struct opts *o)
{
    *o = (struct opts){.dir = "build/ckpt_bench",
                       .rules = "configs/models/qwen3.yaml",
                       .config = "tests/fixtures/ckpt/qwen3-1g.json",
                       .files = 4,
                       .readers = {1, 2, 4},
                       .nreaders = 3,
                       .reps = 3,
                       .cold = true,
                       .warm = true};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        uint64_t x;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            exit(0);
        } else if (strcmp(a, "--cold") == 0) {
            o->warm = false;
        } else if (strcmp(a, "--warm") == 0) {
            o->cold = false;
        } else if (v && strcmp(a, "--dir") == 0) {
            o->dir = argv[++i];
        } else if (v && strcmp(a, "--model") == 0) {
            o->rules = argv[++i];
        } else if (v && strcmp(a, "--config") == 0) {
            o->config = argv[++i];
        } else if (v && strcmp(a, "--files") == 0 && wb_parse_u64(v, &x) == 0 && x >= 1 &&
                   x <= 9999) {
            o->files = (uint32_t)x;
            i++;
        } else if (v && strcmp(a, "--reps") == 0 && wb_parse_u64(v, &x) == 0 && x >= 1 &&
                   x <= 100) {
            o->reps = (unsigned)x;
            i++;
        } else if (v && strcmp(a, "--chunk") == 0 && wb_parse_size(v, &x) == 0 && x >= 4096 &&
                   x <= (1ull << 30)) {
            o->chunk = x;
            i++;
        } else if (v && strcmp(a, "--readers") == 0) {
            o->nreaders = 0;
            char *s = strdup(argv[++i]), *save = NULL;
            for (char *t = strtok_r(s, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
                if (o->nreaders == WB_ARRAY_LEN(o->readers) || wb_parse_u64(t, &x) || x < 1 ||
                    x > 256) {
                    free(s);
                    fprintf(stderr, "ckpt_bench: --readers: up to 8 counts from 1 to 256\n");
                    return 2;
                }
                o->readers[o->nreaders++] = (uint32_t)x;
            }
            free(s);
        } else {
            usage(stderr);
            return 2;
        }
    }
    return 0;
}

/* ---------------------------------------------------------------- our reader */

struct job {
    const struct wb_ckpt *ck;
    const struct wb_ckpt_share *sh;
    const uint64_t *tstart; /* of each tensor in the destination */
    char *dst;
    struct wb_ckpt_io_opts io;
    bool sum;
    bool hash; /* wb_ckpt_share_hash of the share instead of reading it into dst */
    uint64_t acc;
    bool direct;
    int err;
};

static void *run_job(void *arg)
{
    struct job *j = arg;
    struct wb_ckpt_reader *r;
    if ((j->err = wb_ckpt_reader_open(j->ck, &j->io, &r)))
        return NULL;
    j->direct = wb_ckpt_reader_direct(r);
    if (j->hash) {
        struct wb_hash128 h;
        j->err = wb_ckpt_share_hash(j->ck, j->sh, r, &h, NULL);
        j->acc ^= h.b[0];
        wb_ckpt_reader_close(r);
        return NULL;
    }
    for (size_t i = 0; i < j->sh->n && !j->err; i++) {
        const struct wb_ckpt_piece *p = &j->sh->piece[i];
        uint64_t x = 0;
        j->err =
            wb_ckpt_read_piece(r, p, j->dst + j->tstart[p->tensor] + p->offset, j->sum ? &x : NULL);
        j->acc ^= x;
    }
    wb_ckpt_reader_close(r);
    return NULL;
}

static int ours(const struct wb_ckpt *ck, const struct wb_ckpt_shares *s, const uint64_t *tstart,
                char *dst, enum wb_ckpt_io_mode mode, uint64_t chunk, bool sum, bool hash,
                bool *direct)
{
    struct job jobs[256];
    pthread_t th[256];
    for (uint32_t k = 0; k < s->n; k++) {
        jobs[k] =
            (struct job){ck, &s->share[k], tstart, dst, {mode, chunk}, sum, hash, 0, false, 0};
        if (s->n == 1)
            run_job(&jobs[k]);
        else if (pthread_create(&th[k], NULL, run_job, &jobs[k]) != 0)
            return -EAGAIN;
    }
    int err = 0;
    for (uint32_t k = 0; k < s->n; k++) {
        if (s->n > 1)
            pthread_join(th[k], NULL);
        err = err ? err : jobs[k].err;
        *direct = jobs[k].direct;
    }
    return err;
}

/* ---------------------------------------------------------------- driver */

/* What our reader placed equals the file bytes the plain read got. */
static int verify(const struct wb_ckpt *ck, const uint64_t *tstart, const char *dst,
                  const char *plain)
{
    uint64_t fpos = 0;
    for (size_t f = 0; f < ck->nfiles; f++) {
        for (size_t t = 0; t < ck->inv.n; t++)
            if (ck->loc[t].file == f &&
                memcmp(dst + tstart[t], plain + fpos + ck->loc[t].offset, ck->loc[t].bytes)) {
                fprintf(stderr, "ckpt_bench: tensor %s differs\n", ck->inv.p[t].name);
                return -1;
            }
        fpos += ck->files[f].size;
    }
    return 0;
}

int main(int argc, char **argv)
{
    struct opts o;
    int rc = parse(argc, argv, &o);
    if (rc)
        return rc;
    struct wb_errlist el;
    wb_errlist_init(&el);
    struct wb_inventory inv;
    wb_inv_init(&inv);
    if (wb_inv_generate(o.rules, o.config, "trainer", &inv, &el)) {
        wb_errlist_print(&el, "ckpt_bench: ", stderr);
        return 1;
    }
    struct wb_ckpt *ck = bench_checkpoint(o.dir, o.files, 1, &inv, "ckpt_bench: ");
    if (!ck)
        return 1;
    uint64_t fbytes = 0;
    for (size_t f = 0; f < ck->nfiles; f++)
        fbytes += ck->files[f].size;
    uint64_t *tstart = malloc((ck->inv.n + 1) * sizeof(*tstart));
    for (size_t t = 0, pos = 0; t < ck->inv.n; pos += ck->loc[t].bytes, t++)
        tstart[t] = pos;
    char *plain = malloc(fbytes), *dst = malloc(ck->bytes);
    if (!plain || !dst || !tstart) {
        fprintf(stderr, "ckpt_bench: out of memory\n");
        return 1;
    }
    memset(plain, 1, fbytes);
    memset(dst, 1, ck->bytes);
    printf("checkpoint %s: %zu files, %zu tensors, %.3f GB of tensors (%.3f GB of files); %ld "
           "CPUs online\n",
           o.dir, ck->nfiles, ck->inv.n, (double)ck->bytes / 1e9, (double)fbytes / 1e9,
           sysconf(_SC_NPROCESSORS_ONLN));

    /* the cases: the floor, then ours (per readers count: pread with checksums off and on;
     * with one reader also O_DIRECT) */
    struct kase {
        char what[64];
        uint32_t n; /* 0: the plain read */
        enum wb_ckpt_io_mode mode;
        bool sum;
        bool hash; /* the broadcast's content hash (wb_ckpt_share_hash): a second pass */
        struct wb_ckpt_shares sh;
        double gbs[2][100]; /* cold, warm; per repetition */
    };
    static const enum wb_ckpt_io_mode modes[] = {WB_CKPT_IO_PREAD, WB_CKPT_IO_DIRECT};
    static const char *const mname[] = {"pread", "direct"};
    struct kase *cs = calloc(1 + 7 * o.nreaders, sizeof(*cs));
    size_t nc = 0;
    snprintf(cs[nc++].what, sizeof(cs[0].what), "plain read(2), %llu MiB calls",
             (unsigned long long)((o.chunk ? o.chunk : 8 << 20) >> 20));
    for (size_t ri = 0; ri < o.nreaders; ri++)
        for (int m = 0; m < (o.readers[ri] == 1 ? 2 : 1); m++)
            for (int sum = 0; sum < 2; sum++) {
                struct kase *k = &cs[nc++];
                k->n = o.readers[ri];
                k->mode = modes[m];
                k->sum = sum;
                snprintf(k->what, sizeof(k->what), "ours %-6s %3u reader%s xxh3 %s", mname[m], k->n,
                         k->n == 1 ? " " : "s", sum ? "on " : "off");
                if (wb_ckpt_shares_make(ck, k->n, &k->sh)) {
                    fprintf(stderr, "ckpt_bench: shares failed\n");
                    return 1;
                }
            }
    /* per readers count: the content hash a broadcast's readers and coordinator compute */
    for (size_t ri = 0; ri < o.nreaders; ri++) {
        struct kase *k = &cs[nc++];
        k->n = o.readers[ri];
        k->mode = WB_CKPT_IO_PREAD;
        k->hash = true;
        snprintf(k->what, sizeof(k->what), "content hash XXH3-128 %3u reader%s", k->n,
                 k->n == 1 ? " " : "s");
        if (wb_ckpt_shares_make(ck, k->n, &k->sh)) {
            fprintf(stderr, "ckpt_bench: shares failed\n");
            return 1;
        }
    }
    /* Round-robin: every repetition runs every case once, so that drift in what else the
     * machine does spreads over all cases alike, forwards and backwards in turn; the median
     * per case is printed. */
    double resident_max = 0;
    bool direct_used = false, verified = false;
    for (unsigned rep = 0; rep < o.reps; rep++) {
        for (int cache = 0; cache < 2; cache++) {
            if ((cache == 0 && !o.cold) || (cache == 1 && !o.warm))
                continue;
            for (size_t i = 0; i < nc; i++) {
                /* odd repetitions run the cases backwards: a case's neighbours warm the
                 * caches below ours (a VM host's) differently, and that should not favour
                 * one case */
                struct kase *k = &cs[rep % 2 ? nc - 1 - i : i];
                if (cache == 0) {
                    double res = bench_drop_cache(ck);
                    if (res > resident_max)
                        resident_max = res;
                } else {
                    bench_plain_read(ck, plain, o.chunk); /* warm the cache */
                }
                uint64_t t0 = wb_now_ns();
                bool direct = false;
                int err =
                    k->n ? ours(ck, &k->sh, tstart, dst, k->mode, o.chunk, k->sum, k->hash, &direct)
                         : bench_plain_read(ck, plain, o.chunk);
                double sec = (double)(wb_now_ns() - t0) / 1e9;
                if (err) {
                    fprintf(stderr, "ckpt_bench: read failed: %s\n", wb_strerror(err));
                    return 1;
                }
                direct_used |= direct;
                k->gbs[cache][rep] = (double)(k->n ? ck->bytes : fbytes) / 1e9 / sec;
                /* once: what our reader placed equals the file bytes the plain read got */
                if (k->n && !k->hash && !verified) {
                    bench_plain_read(ck, plain, o.chunk);
                    if (verify(ck, tstart, dst, plain))
                        return 1;
                    verified = true;
                }
            }
        }
    }
    printf("median of %u runs; GB = 1e9 bytes; ratio = GB/s over the plain read's in the same "
           "cache state\n",
           o.reps);
    printf("%-40s %10s %7s %10s %7s\n", "", "cold GB/s", "ratio", "warm GB/s", "ratio");
    double med[2][64] = {{0}};
    for (size_t c = 0; c < nc; c++)
        for (int cache = 0; cache < 2; cache++) {
            qsort(cs[c].gbs[cache], o.reps, sizeof(double), bench_cmp_double);
            med[cache][c] = cs[c].gbs[cache][o.reps / 2];
        }
    for (size_t c = 0; c < nc; c++) {
        printf("%-40s", cs[c].what);
        for (int cache = 0; cache < 2; cache++) {
            if (med[cache][c] > 0)
                printf(" %10.2f %7.2f", med[cache][c], med[cache][c] / med[cache][0]);
            else
                printf(" %10s %7s", "-", "-");
        }
        putchar('\n');
        wb_ckpt_shares_free(&cs[c].sh);
    }
    /* what the broadcast's content check costs: its pass over the share against reading the
     * share (pread, checksums off, the same readers count), as time over time */
    for (size_t c = 0; c < nc; c++) {
        if (!cs[c].hash)
            continue;
        for (size_t d = 0; d < nc; d++)
            if (cs[d].n == cs[c].n && !cs[d].hash && !cs[d].sum && cs[d].mode == WB_CKPT_IO_PREAD) {
                printf("content hash / read time, %u reader%s:", cs[c].n, cs[c].n == 1 ? "" : "s");
                for (int cache = 0; cache < 2; cache++)
                    if (med[cache][c] > 0)
                        printf(" %s %.2f", cache ? "warm" : "cold", med[cache][d] / med[cache][c]);
                putchar('\n');
            }
    }
    free(cs);
    if (o.cold)
        printf("cold: at most %.1f%% of the files' pages stayed resident after DONTNEED (a VM's "
               "host may still cache them)\n",
               100.0 * resident_max);
    printf("O_DIRECT: %s\n", direct_used ? "used" : "refused by the filesystem (buffered reads)");
    free(plain);
    free(dst);
    free(tstart);
    wb_ckpt_close(ck);
    wb_inv_free(&inv);
    wb_errlist_free(&el);
    return 0;
}
