/* ckpt_common.h — what the checkpoint benchmarks (ckpt_bench, bcast_bench) share: the
 * checkpoint they write once and reuse, dropping its pages from the page cache (the cold
 * case), and the storage floor they measure against (a plain sequential read(2)). */
#ifndef WB_BENCH_CKPT_COMMON_H
#define WB_BENCH_CKPT_COMMON_H

#include "ckpt/ckpt.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

/* fsync (dirty pages cannot be dropped) and DONTNEED on every file; returns the fraction of
 * pages still resident afterwards. */
static double bench_drop_cache(const struct wb_ckpt *ck)
{
    uint64_t pages = 0, resident = 0;
    long ps = sysconf(_SC_PAGESIZE);
    for (size_t f = 0; f < ck->nfiles; f++) {
        int fd = open(ck->files[f].path, O_RDONLY);
        if (fd < 0)
            continue;
        fdatasync(fd);
        posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
        size_t len = ck->files[f].size;
        void *m = len ? mmap(NULL, len, PROT_READ, MAP_SHARED, fd, 0) : MAP_FAILED;
        if (m != MAP_FAILED) {
            size_t n = (len + (size_t)ps - 1) / (size_t)ps;
            unsigned char *v = malloc(n);
            if (v && mincore(m, len, v) == 0)
                for (size_t i = 0; i < n; i++)
                    resident += v[i] & 1;
            pages += n;
            free(v);
            munmap(m, len);
        }
        close(fd);
    }
    return pages ? (double)resident / (double)pages : 0.0;
}

/* The floor: read(2) of every file in turn, `chunk` bytes at a time (0: 8 MiB), into buf. */
static int bench_plain_read(const struct wb_ckpt *ck, char *buf, uint64_t chunk)
{
    if (!chunk)
        chunk = 8 << 20;
    size_t pos = 0;
    for (size_t f = 0; f < ck->nfiles; f++) {
        int fd = open(ck->files[f].path, O_RDONLY);
        if (fd < 0)
            return -errno;
        for (uint64_t left = ck->files[f].size; left;) {
            ssize_t n = read(fd, buf + pos, left < chunk ? left : chunk);
            if (n <= 0) {
                int e = n < 0 ? -errno : -EIO;
                close(fd);
                return e;
            }
            pos += (size_t)n;
            left -= (uint64_t)n;
        }
        close(fd);
    }
    return 0;
}

static int bench_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The checkpoint of inv in dir (`files` data files, synthetic values of `seed`): the one
 * there when it matches, else written anew. NULL after printing why (prog: "name: "). */
static struct wb_ckpt *bench_checkpoint(const char *dir, uint32_t files, uint64_t seed,
                                        const struct wb_inventory *inv, const char *prog)
{
    struct wb_errlist el;
    wb_errlist_init(&el);
    struct wb_ckpt *ck = NULL;
    if (wb_ckpt_open(dir, &ck, &el) == 0 && wb_ckpt_check(ck, inv, &el) == 0 &&
        ck->nfiles == files) {
        wb_errlist_free(&el);
        return ck;
    }
    wb_ckpt_close(ck);
    wb_errlist_free(&el);
    wb_errlist_init(&el);
    printf("writing the checkpoint into %s ...\n", dir);
    fflush(stdout);
    struct wb_ckpt_write_opts wo = {.seed = seed, .version = 1, .files = files};
    uint64_t t0 = wb_now_ns();
    int err = wb_ckpt_write(dir, inv, &wo, &el);
    if (!err)
        err = wb_ckpt_open(dir, &ck, &el);
    if (err) {
        wb_errlist_print(&el, prog, stderr);
        fprintf(stderr, "%s%s\n", prog, wb_strerror(err));
        wb_errlist_free(&el);
        return NULL;
    }
    double s = (double)(wb_now_ns() - t0) / 1e9;
    printf("  written: %.2f GB in %.1f s (synthetic values, %.2f GB/s)\n", (double)ck->bytes / 1e9,
           s, (double)ck->bytes / 1e9 / s);
    wb_errlist_free(&el);
    return ck;
}

#endif /* WB_BENCH_CKPT_COMMON_H */
