/* io.c — reading tensor bytes into host memory, with XXH3-64 checksums computed chunk by chunk
 * while the chunk is still in cache.
 *
 * Two ways to read (bench/ckpt_bench.c measures them against a plain read(2) of the files):
 * pread(2) in large chunks straight into the caller's buffer (the default), and O_DIRECT into an
 * aligned bounce buffer (no page cache: a 2 TB checkpoint read once should not evict everything
 * else, and on fast NVMe arrays it avoids the kernel's copy). A reader is one thread's context;
 * the checkpoint's descriptors are shared (pread has no file position).
 *
 * There is no mmap mode any more: a mapped file that shrinks while it is copied kills the
 * process with SIGBUS, and checking the size first leaves the window open (someone truncates
 * between the check and the copy). Catching SIGBUS would mean owning the process's handler from
 * a library loaded into PyTorch and sanitizers, and jumping out of a memcpy on an I/O thread;
 * pread reads the same page cache and reports a short file as an error naming it. */
#include "ckpt/ckpriv.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>
#if defined(__x86_64__)
/* libxxhash's runtime dispatch: the AVX2/AVX-512 kernels where the CPU has them (the plain
 * entry points are SSE2 only, about half as fast). Same results. */
#include <xxh_x86dispatch.h>
#endif

enum { ALIGN = 4096, DEFAULT_CHUNK = 8 << 20, FD_UNTRIED = -1, FD_REFUSED = -2 };

struct wb_ckpt_reader {
    const struct wb_ckpt *ck;
    enum wb_ckpt_io_mode mode;
    uint64_t chunk;
    XXH3_state_t *xs;
    /* DIRECT */
    void *bounce; /* chunk + ALIGN bytes, ALIGN-aligned */
    int *dfd;     /* per file: an O_DIRECT descriptor, FD_UNTRIED or FD_REFUSED */
    bool direct;  /* the first file took O_DIRECT */
};

uint64_t wb_ckpt_xxh3(const void *p, size_t n)
{
    return XXH3_64bits(p, n);
}

/* The O_DIRECT descriptor of file fi, or -1 to read it buffered. The file is opened again by
 * its path, so only when that is still the file wb_ckpt_open() checked (same device and inode:
 * not a FIFO or another file put there since, and opened without blocking) is it used. */
static int direct_fd(struct wb_ckpt_reader *r, uint32_t fi)
{
    if (r->dfd[fi] == FD_UNTRIED) {
        const struct wb_ckpt_file *f = &r->ck->files[fi];
        int fd = open(f->path, O_RDONLY | O_CLOEXEC | O_DIRECT | O_NONBLOCK | O_NOCTTY);
        struct stat a, b;
        if (fd >= 0 && (fstat(fd, &a) != 0 || fstat(f->fd, &b) != 0 || a.st_dev != b.st_dev ||
                        a.st_ino != b.st_ino || !S_ISREG(a.st_mode))) {
            close(fd);
            fd = -1;
        }
        r->dfd[fi] = fd >= 0 ? fd : FD_REFUSED;
    }
    return r->dfd[fi] >= 0 ? r->dfd[fi] : -1;
}

int wb_ckpt_reader_open(const struct wb_ckpt *ck, const struct wb_ckpt_io_opts *o,
                        struct wb_ckpt_reader **out)
{
    struct wb_ckpt_io_opts def = {0};
    if (!o)
        o = &def;
    if ((o->mode != WB_CKPT_IO_PREAD && o->mode != WB_CKPT_IO_DIRECT) || o->chunk > (1ull << 32))
        return -EINVAL;
    struct wb_ckpt_reader *r = calloc(1, sizeof(*r));
    if (!r)
        return -ENOMEM;
    r->ck = ck;
    r->mode = o->mode;
    r->chunk = o->chunk ? (o->chunk + ALIGN - 1) / ALIGN * ALIGN : DEFAULT_CHUNK;
    int err = 0;
    if (!(r->xs = XXH3_createState()))
        err = -ENOMEM;
    if (!err && r->mode == WB_CKPT_IO_DIRECT) {
        if (posix_memalign(&r->bounce, ALIGN, r->chunk + ALIGN) != 0 ||
            !(r->dfd = malloc((ck->nfiles + 1) * sizeof(int))))
            err = -ENOMEM;
        for (size_t i = 0; !err && i < ck->nfiles; i++)
            r->dfd[i] = FD_UNTRIED;
        if (!err && ck->nfiles)
            r->direct = direct_fd(r, 0) >= 0;
    }
    if (err) {
        wb_ckpt_reader_close(r);
        return err;
    }
    *out = r;
    return 0;
}

void wb_ckpt_reader_close(struct wb_ckpt_reader *r)
{
    if (!r)
        return;
    for (size_t i = 0; r->dfd && i < r->ck->nfiles; i++)
        if (r->dfd[i] >= 0)
            close(r->dfd[i]);
    free(r->dfd);
    free(r->bounce);
    XXH3_freeState(r->xs);
    free(r);
}

bool wb_ckpt_reader_direct(const struct wb_ckpt_reader *r)
{
    return r->direct;
}

static int short_file(const struct wb_ckpt_reader *r, uint32_t fi, uint64_t pos)
{
    wb_log(WB_LOG_ERROR, "ckpt", "%s: ends before byte %llu; it changed since it was opened",
           wb_esc(r->ck->files[fi].name).s, (unsigned long long)pos);
    return -EIO;
}

/* pread into the bounce buffer: at least `need` bytes of the `want` asked for (the rest may
 * lie past the end of the file). Returns the bytes read or -errno. */
static ssize_t direct_read(int fd, void *buf, size_t want, uint64_t off, size_t need)
{
    size_t got = 0;
    while (got < need) {
        ssize_t n = pread(fd, (char *)buf + got, want - got, (off_t)(off + got));
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return -errno;
        if (n == 0)
            break;
        got += (size_t)n;
        if (got % ALIGN)
            break; /* end of file: O_DIRECT reads stop short only there */
    }
    return (ssize_t)got;
}

static int read_direct(struct wb_ckpt_reader *r, int fd, uint32_t fi, uint64_t pos, uint64_t len,
                       char *dst, bool sum)
{
    uint64_t a = pos / ALIGN * ALIGN;
    while (len) {
        uint64_t skip = pos - a;
        size_t want = (size_t)r->chunk;
        size_t need = (size_t)(skip + len < want ? skip + len : want);
        ssize_t got = direct_read(fd, r->bounce, want, a, need);
        if (got < 0)
            return (int)got;
        if ((size_t)got < need)
            return short_file(r, fi, a + (uint64_t)got);
        size_t n = need - (size_t)skip;
        memcpy(dst, (char *)r->bounce + skip, n);
        if (sum)
            XXH3_64bits_update(r->xs, dst, n);
        dst += n;
        pos += n;
        len -= n;
        a += want;
    }
    return 0;
}

int wb_ckpt_read(struct wb_ckpt_reader *r, size_t tensor, uint64_t off, uint64_t len, void *dst,
                 uint64_t *xxh3)
{
    const struct wb_ckpt *ck = r->ck;
    if (tensor >= ck->inv.n)
        return -EINVAL;
    const struct wb_ckpt_loc *l = &ck->loc[tensor];
    if (off > l->bytes || len > l->bytes - off)
        return -EINVAL;
    bool sum = xxh3 != NULL;
    if (sum)
        XXH3_64bits_reset(r->xs);
    uint32_t fi = l->file;
    const struct wb_ckpt_file *f = &ck->files[fi];
    uint64_t pos = l->offset + off;
    char *d = dst;
    int err = 0;
    if (r->mode == WB_CKPT_IO_DIRECT && len && direct_fd(r, fi) >= 0) {
        err = read_direct(r, r->dfd[fi], fi, pos, len, d, sum);
        if (err != -EINVAL)
            goto done;
        /* the filesystem took O_DIRECT at open but refuses the reads: buffered from now on */
        close(r->dfd[fi]);
        r->dfd[fi] = FD_REFUSED;
        if (sum)
            XXH3_64bits_reset(r->xs);
        err = 0;
    }
    for (uint64_t done = 0; done < len;) {
        size_t n = (size_t)(len - done < r->chunk ? len - done : r->chunk);
        err = ck_read_full(f->fd, d + done, n, pos + done);
        if (err == -EIO)
            err = short_file(r, fi, pos + done);
        if (err)
            return err;
        if (sum)
            XXH3_64bits_update(r->xs, d + done, n);
        done += n;
    }
done:
    if (!err && sum)
        *xxh3 = XXH3_64bits_digest(r->xs);
    return err;
}

int wb_ckpt_read_tensor(struct wb_ckpt_reader *r, size_t tensor, void *dst, uint64_t *xxh3)
{
    if (tensor >= r->ck->inv.n)
        return -EINVAL;
    return wb_ckpt_read(r, tensor, 0, r->ck->loc[tensor].bytes, dst, xxh3);
}

int wb_ckpt_read_piece(struct wb_ckpt_reader *r, const struct wb_ckpt_piece *p, void *dst,
                       uint64_t *xxh3)
{
    return wb_ckpt_read(r, p->tensor, p->offset, p->bytes, dst, xxh3);
}
