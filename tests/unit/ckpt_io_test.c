/* ckpt_io_test.c — reading tensor bytes (pread, O_DIRECT; whole tensors and byte
 * ranges), XXH3-64 against known values, and the readers' shares with exact numbers (a small
 * checkpoint worked by hand, and the >= 1 GB fixture model's inventory, cross-checked by a
 * Python model of the cuts; no data is written for that one). */
#include "ckpt/ckpt.h"
#include "tests/wbtest.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

static const enum wb_ckpt_io_mode MODES[] = {WB_CKPT_IO_PREAD, WB_CKPT_IO_DIRECT};

static char *dir_of(const char *name)
{
    char *d;
    if (asprintf(&d, "%s/%s", wb_test_tmpdir(), name) < 0)
        wb_test_fail(__FILE__, __LINE__, "asprintf");
    return d;
}

static struct wb_ckpt *write_open(const char *name, const struct wb_inventory *inv, uint32_t files)
{
    char *d = dir_of(name);
    struct wb_errlist el;
    wb_errlist_init(&el);
    struct wb_ckpt_write_opts o = {.seed = 5, .version = 2, .files = files};
    CHECK_INT(wb_ckpt_write(d, inv, &o, &el), 0);
    struct wb_ckpt *ck = NULL;
    int r = wb_ckpt_open(d, &ck, &el);
    wb_errlist_print(&el, "    ", stderr);
    CHECK_INT(r, 0);
    wb_errlist_free(&el);
    free(d);
    return ck;
}

static void add(struct wb_inventory *inv, const char *name, enum wb_dtype dt, uint32_t ndim,
                uint64_t d0, uint64_t d1)
{
    struct wb_shape s = {ndim, {d0, d1}};
    CHECK_INT(wb_inv_add(inv, name, dt, &s), 0);
}

/* The whole file, read without the reader. */
static uint8_t *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    CHECK(f != NULL);
    fseek(f, 0, SEEK_END);
    *len = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *b = malloc(*len + 1);
    CHECK_INT(fread(b, 1, *len, f), *len);
    fclose(f);
    return b;
}

/* ---------------------------------------------------------------- checksums */

static void test_xxh3_known(void)
{
    /* the reference values of xxhsum -H3 0.8.1 */
    CHECK_U64(wb_ckpt_xxh3("", 0), 0x2d06800538d394c2ull);
    CHECK_U64(wb_ckpt_xxh3("abc", 3), 0x78af5f94892f3950ull);
    uint8_t *b = malloc(100000);
    for (int i = 0; i < 100000; i++)
        b[i] = (uint8_t)(i % 251);
    CHECK_U64(wb_ckpt_xxh3(b, 100000), 0x42c23aeead96750dull);
    free(b);
}

/* ---------------------------------------------------------------- reading */

static struct wb_inventory io_inv(void)
{
    struct wb_inventory inv;
    wb_inv_init(&inv);
    add(&inv, "a", WB_DTYPE_BF16, 2, 300, 77); /* 46200 B: many 4 KiB chunks, odd sizes */
    add(&inv, "b", WB_DTYPE_FP32, 1, 3, 0);
    add(&inv, "c", WB_DTYPE_FP16, 2, 1000, 33);
    add(&inv, "d", WB_DTYPE_FP8_E4M3, 2, 200, 130);
    add(&inv, "d_scale_inv", WB_DTYPE_FP32, 2, 2, 2);
    add(&inv, "e", WB_DTYPE_BF16, 1, 0, 0);
    return inv;
}

static void check_mode(const struct wb_ckpt *ck, enum wb_ckpt_io_mode mode, uint64_t chunk)
{
    struct wb_ckpt_io_opts o = {mode, chunk};
    struct wb_ckpt_reader *r;
    CHECK_INT(wb_ckpt_reader_open(ck, &o, &r), 0);
    if (mode == WB_CKPT_IO_DIRECT && !wb_ckpt_reader_direct(r))
        printf("    (O_DIRECT refused here: buffered reads)\n");
    size_t flen[8];
    uint8_t *file[8];
    for (size_t f = 0; f < ck->nfiles; f++)
        file[f] = slurp(ck->files[f].path, &flen[f]);
    for (size_t t = 0; t < ck->inv.n; t++) {
        const struct wb_ckpt_loc *l = &ck->loc[t];
        const uint8_t *want = file[l->file] + l->offset;
        uint8_t *got = malloc(l->bytes + 1);
        uint64_t sum = 1;
        CHECK_INT(wb_ckpt_read_tensor(r, t, got, &sum), 0);
        CHECK_MEM(got, want, l->bytes);
        CHECK_U64(sum, wb_ckpt_xxh3(want, l->bytes));
        /* byte ranges at odd places, with and without a checksum */
        uint64_t offs[] = {0, 1, 4095, 4097, l->bytes / 3, l->bytes};
        for (size_t i = 0; i < WB_ARRAY_LEN(offs); i++) {
            uint64_t off = offs[i] < l->bytes ? offs[i] : l->bytes;
            uint64_t len = (l->bytes - off) / 2 + (l->bytes > off);
            memset(got, 0, l->bytes + 1);
            CHECK_INT(wb_ckpt_read(r, t, off, len, got, &sum), 0);
            CHECK_MEM(got, want + off, len);
            CHECK_U64(sum, wb_ckpt_xxh3(want + off, len));
            CHECK_INT(wb_ckpt_read(r, t, off, len, got, NULL), 0);
            CHECK_MEM(got, want + off, len);
        }
        CHECK_INT(wb_ckpt_read(r, t, l->bytes, 1, got, NULL), -EINVAL);
        CHECK_INT(wb_ckpt_read(r, t, 1, l->bytes, got, NULL), -EINVAL);
        free(got);
    }
    uint8_t x;
    CHECK_INT(wb_ckpt_read(r, ck->inv.n, 0, 0, &x, NULL), -EINVAL);
    for (size_t f = 0; f < ck->nfiles; f++)
        free(file[f]);
    wb_ckpt_reader_close(r);
}

static void test_read_modes(void)
{
    struct wb_inventory inv = io_inv();
    struct wb_ckpt *ck = write_open("modes", &inv, 2);
    for (size_t m = 0; m < WB_ARRAY_LEN(MODES); m++) {
        check_mode(ck, MODES[m], 4096);
        check_mode(ck, MODES[m], 0);
        check_mode(ck, MODES[m], 5000); /* rounded up to 8 KiB */
    }
    struct wb_ckpt_reader *r;
    struct wb_ckpt_io_opts bad = {(enum wb_ckpt_io_mode)7, 0};
    CHECK_INT(wb_ckpt_reader_open(ck, &bad, &r), -EINVAL);
    bad.mode = (enum wb_ckpt_io_mode)1; /* what was the mmap mode */
    CHECK_INT(wb_ckpt_reader_open(ck, &bad, &r), -EINVAL);
    wb_ckpt_close(ck);
    wb_inv_free(&inv);
}

/* A file that shrank after it was opened: -EIO naming it, in every mode, never a short read. */
static void test_shrunk_file(void)
{
    struct wb_inventory inv = io_inv();
    struct wb_ckpt *ck = write_open("shrunk", &inv, 1);
    CHECK_INT(truncate(ck->files[0].path, (off_t)(ck->loc[2].offset + 10)), 0);
    for (size_t m = 0; m < WB_ARRAY_LEN(MODES); m++) {
        struct wb_ckpt_io_opts o = {MODES[m], 4096};
        struct wb_ckpt_reader *r;
        CHECK_INT(wb_ckpt_reader_open(ck, &o, &r), 0);
        uint8_t *b = malloc(ck->loc[2].bytes);
        struct wb_test_stderr cap;
        char msg[512];
        wb_test_stderr_begin(&cap);
        int err = wb_ckpt_read_tensor(r, 2, b, NULL);
        wb_test_stderr_end(&cap, msg, sizeof(msg));
        CHECK_INT(err, -EIO);
        CHECK(strstr(msg, "model.safetensors: ends before byte ") != NULL);
        CHECK(strstr(msg, "; it changed since it was opened") != NULL);
        CHECK_INT(wb_ckpt_read_tensor(r, 0, b, NULL), 0); /* what is still there reads */
        free(b);
        wb_ckpt_reader_close(r);
    }
    wb_ckpt_close(ck);
    wb_inv_free(&inv);
}

struct shrinker {
    const char *path;
    off_t to;
    unsigned spins;
};

static void *shrink(void *arg)
{
    struct shrinker *s = arg;
    for (volatile unsigned i = 0; i < s->spins; i++)
        ;
    if (truncate(s->path, s->to) != 0)
        abort();
    return NULL;
}

/* A file cut short while a tensor of it is being copied out (another thread truncates it at
 * some point of the copy): the read ends with -EIO naming the file or, when the copy was done
 * first, with every byte — never a fault (a mapping of the file would take SIGBUS here). */
static void test_shrinks_while_read(void)
{
    struct wb_inventory inv;
    wb_inv_init(&inv);
    add(&inv, "big", WB_DTYPE_BF16, 2, 1024, 1024); /* 2 MiB: 512 reads of 4 KiB */
    uint8_t *b = malloc(2 << 20);
    unsigned eio = 0, whole = 0;
    for (unsigned round = 0; round < 24; round++) {
        char name[32];
        snprintf(name, sizeof(name), "race%u", round);
        struct wb_ckpt *ck = write_open(name, &inv, 1);
        struct wb_ckpt_io_opts o = {MODES[round % 2], 4096};
        struct wb_ckpt_reader *r;
        CHECK_INT(wb_ckpt_reader_open(ck, &o, &r), 0);
        struct shrinker s = {ck->files[0].path, (off_t)(ck->loc[0].offset + (1 << 20)),
                             round * 200000u};
        pthread_t th;
        struct wb_test_stderr cap;
        char msg[512];
        wb_test_stderr_begin(&cap);
        CHECK_INT(pthread_create(&th, NULL, shrink, &s), 0);
        int err = wb_ckpt_read_tensor(r, 0, b, NULL);
        CHECK_INT(pthread_join(th, NULL), 0);
        wb_test_stderr_end(&cap, msg, sizeof(msg));
        if (err == -EIO) {
            CHECK(strstr(msg, "model.safetensors: ends before byte ") != NULL);
            eio++;
        } else {
            CHECK_INT(err, 0);
            whole++;
        }
        wb_ckpt_reader_close(r);
        wb_ckpt_close(ck);
    }
    CHECK_INT(eio + whole, 24);
    printf("    %u reads cut short (-EIO), %u done before the cut\n", eio, whole);
    free(b);
    wb_inv_free(&inv);
}

/* O_DIRECT opens a file again by its path: a FIFO put there since the checkpoint was opened
 * neither blocks the open nor is read — the reads go through the descriptor that was checked,
 * buffered, and give the file's bytes. */
static void test_direct_same_file(void)
{
    struct wb_inventory inv = io_inv();
    struct wb_ckpt *ck = write_open("swapped", &inv, 1);
    size_t len;
    uint8_t *want = slurp(ck->files[0].path, &len);
    CHECK_INT(unlink(ck->files[0].path), 0);
    CHECK_INT(mkfifo(ck->files[0].path, 0644), 0);
    struct wb_ckpt_io_opts o = {WB_CKPT_IO_DIRECT, 4096};
    struct wb_ckpt_reader *r;
    CHECK_INT(wb_ckpt_reader_open(ck, &o, &r), 0);
    CHECK(!wb_ckpt_reader_direct(r));
    uint8_t *got = malloc(ck->loc[0].bytes);
    CHECK_INT(wb_ckpt_read_tensor(r, 0, got, NULL), 0);
    CHECK_MEM(got, want + ck->loc[0].offset, ck->loc[0].bytes);
    free(got);
    free(want);
    wb_ckpt_reader_close(r);
    wb_ckpt_close(ck);
    wb_inv_free(&inv);
}

/* ---------------------------------------------------------------- shares */

static void check_piece(const struct wb_ckpt_shares *s, uint32_t k, size_t i, uint32_t tensor,
                        uint64_t row0, uint64_t rows, uint64_t offset, uint64_t bytes)
{
    CHECK(i < s->share[k].n);
    const struct wb_ckpt_piece *p = &s->share[k].piece[i];
    CHECK_INT(p->tensor, tensor);
    CHECK_U64(p->row0, row0);
    CHECK_U64(p->rows, rows);
    CHECK_U64(p->offset, offset);
    CHECK_U64(p->bytes, bytes);
}

/* Every byte of every tensor in exactly one piece, pieces in reading order; the pieces read
 * back give the tensor, each with the checksum of its own bytes. */
static void check_cover(const struct wb_ckpt *ck, const struct wb_ckpt_shares *s)
{
    uint64_t *next = calloc(ck->inv.n + 1, sizeof(*next));
    uint64_t sum = 0;
    size_t prev = 0;
    struct wb_ckpt_reader *r;
    CHECK_INT(wb_ckpt_reader_open(ck, NULL, &r), 0);
    for (uint32_t k = 0; k < s->n; k++) {
        uint64_t bytes = 0;
        for (size_t i = 0; i < s->share[k].n; i++) {
            const struct wb_ckpt_piece *p = &s->share[k].piece[i];
            CHECK(p->tensor >= prev);
            prev = p->tensor;
            CHECK_U64(p->offset, next[p->tensor]);
            next[p->tensor] += p->bytes;
            bytes += p->bytes;
            struct wb_box b = wb_ckpt_piece_box(ck, p);
            CHECK_U64(wb_box_numel(&b) * wb_dtype_size(ck->inv.p[p->tensor].dtype), p->bytes);
            uint8_t *got = malloc(p->bytes + 1), *whole = malloc(ck->loc[p->tensor].bytes + 1);
            uint64_t x = 0;
            CHECK_INT(wb_ckpt_read_piece(r, p, got, &x), 0);
            CHECK_INT(wb_ckpt_read_tensor(r, p->tensor, whole, NULL), 0);
            CHECK_MEM(got, whole + p->offset, p->bytes);
            CHECK_U64(x, wb_ckpt_xxh3(got, p->bytes));
            free(got);
            free(whole);
        }
        CHECK_U64(bytes, s->share[k].bytes);
        sum += bytes;
    }
    for (size_t t = 0; t < ck->inv.n; t++)
        CHECK_U64(next[t], ck->loc[t].bytes);
    CHECK_U64(sum, ck->bytes);
    CHECK_U64(s->total, ck->bytes);
    wb_ckpt_reader_close(r);
    free(next);
}

/* Worked by hand: a bf16 [10, 50] (1000 B, rows of 100), b fp32 [] (4), c bf16 [40, 25]
 * (2000, rows of 50), d fp32 [0] (0), e fp8 [256, 8] (2048, cut at 128-row blocks of 1024):
 * 5052 bytes. */
static void test_shares_exact(void)
{
    struct wb_inventory inv;
    wb_inv_init(&inv);
    add(&inv, "a", WB_DTYPE_BF16, 2, 10, 50);
    add(&inv, "b", WB_DTYPE_FP32, 0, 0, 0);
    add(&inv, "c", WB_DTYPE_BF16, 2, 40, 25);
    add(&inv, "d", WB_DTYPE_FP32, 1, 0, 0);
    add(&inv, "e", WB_DTYPE_FP8_E4M3, 2, 256, 8);
    struct wb_ckpt *ck = write_open("shares", &inv, 1);
    CHECK_U64(ck->bytes, 5052);
    struct wb_ckpt_shares s;
    /* 4 readers: ideal cuts 1263, 2526, 3789 -> c row 5 (1254; 1263 is 9 B past it), c row
     * 30 (2504; 22 B), e row 128 (4028; 239 B before it, 785 B after the row-0 edge) */
    CHECK_INT(wb_ckpt_shares_make(ck, 4, &s), 0);
    CHECK_INT(s.n, 4);
    CHECK_U64(s.share[0].bytes, 1254);
    CHECK_U64(s.share[1].bytes, 1250);
    CHECK_U64(s.share[2].bytes, 1524);
    CHECK_U64(s.share[3].bytes, 1024);
    CHECK_U64(s.max, 1524);
    CHECK_U64(s.min, 1024);
    CHECK_U64(s.slack, 1024);
    CHECK_INT(s.nsplit, 2);
    CHECK(s.max <= (s.total + 3) / 4 + s.slack);
    CHECK_INT(s.share[0].n, 3);
    check_piece(&s, 0, 0, 0, 0, 10, 0, 1000);
    check_piece(&s, 0, 1, 1, 0, 1, 0, 4);
    check_piece(&s, 0, 2, 2, 0, 5, 0, 250);
    CHECK_INT(s.share[1].n, 1);
    check_piece(&s, 1, 0, 2, 5, 25, 250, 1250);
    CHECK_INT(s.share[2].n, 3);
    check_piece(&s, 2, 0, 2, 30, 10, 1500, 500);
    check_piece(&s, 2, 1, 3, 0, 0, 0, 0);
    check_piece(&s, 2, 2, 4, 0, 128, 0, 1024);
    CHECK_INT(s.share[3].n, 1);
    check_piece(&s, 3, 0, 4, 128, 128, 1024, 1024);
    struct wb_box b = wb_ckpt_piece_box(ck, &s.share[1].piece[0]);
    char bs[64];
    CHECK_STR(wb_box_str(&b, bs, sizeof(bs)), "[5:30, 0:25]");
    check_cover(ck, &s);
    wb_ckpt_shares_free(&s);

    /* one reader: everything, nothing split */
    CHECK_INT(wb_ckpt_shares_make(ck, 1, &s), 0);
    CHECK_INT(s.share[0].n, 5);
    CHECK_U64(s.max, 5052);
    CHECK_U64(s.slack, 0);
    CHECK_INT(s.nsplit, 0);
    check_cover(ck, &s);
    wb_ckpt_shares_free(&s);

    /* more readers than rows: empty shares, still every byte once */
    CHECK_INT(wb_ckpt_shares_make(ck, 300, &s), 0);
    CHECK_U64(s.min, 0);
    CHECK_U64(s.max, 1024);
    check_cover(ck, &s);
    wb_ckpt_shares_free(&s);

    CHECK_INT(wb_ckpt_shares_make(ck, 0, &s), -EINVAL);
    CHECK_INT(wb_ckpt_shares_make(ck, WB_CKPT_MAX_READERS + 1, &s), -EINVAL);
    wb_ckpt_close(ck);
    wb_inv_free(&inv);
}

/* The >= 1 GB fixture model (tests/fixtures/ckpt/qwen3-1g.json, 1.28 GB, what the benchmark
 * reads): its tensors laid out as the writer lays them out, without writing them. The numbers
 * were also computed by an independent Python model of the cuts. */
static void test_shares_1g(void)
{
    struct wb_errlist el;
    wb_errlist_init(&el);
    struct wb_ckpt ck;
    memset(&ck, 0, sizeof(ck));
    wb_inv_init(&ck.inv);
    CHECK_INT(wb_inv_generate("configs/models/qwen3.yaml", "tests/fixtures/ckpt/qwen3-1g.json",
                              "trainer", &ck.inv, &el),
              0);
    CHECK_INT(ck.inv.n, 113);
    ck.loc = calloc(ck.inv.n, sizeof(*ck.loc));
    for (size_t i = 0; i < ck.inv.n; i++) {
        uint64_t b = wb_shape_numel(&ck.inv.p[i].shape) * wb_dtype_size(ck.inv.p[i].dtype);
        ck.loc[i] = (struct wb_ckpt_loc){0, ck.bytes, b};
        ck.bytes += b;
    }
    CHECK_U64(ck.bytes, 1275159552);
    struct {
        uint32_t n;
        uint64_t max, min, slack;
        size_t nsplit;
    } want[] = {
        {1, 1275159552, 1275159552, 0, 0},
        {3, 425056256, 425051136, 12288, 2},
        {8, 159396864, 159392256, 12288, 6},
        {64, 19931136, 19918848, 12288, 46},
    };
    for (size_t i = 0; i < WB_ARRAY_LEN(want); i++) {
        struct wb_ckpt_shares s;
        CHECK_INT(wb_ckpt_shares_make(&ck, want[i].n, &s), 0);
        CHECK_U64(s.max, want[i].max);
        CHECK_U64(s.min, want[i].min);
        CHECK_U64(s.slack, want[i].slack);
        CHECK_INT(s.nsplit, want[i].nsplit);
        uint64_t bound = (ck.bytes + want[i].n - 1) / want[i].n;
        CHECK(s.max <= bound + s.slack); /* within one row of total / N */
        uint64_t sum = 0;
        for (uint32_t k = 0; k < s.n; k++)
            sum += s.share[k].bytes;
        CHECK_U64(sum, ck.bytes);
        wb_ckpt_shares_free(&s);
    }
    free(ck.loc);
    wb_inv_free(&ck.inv);
    wb_errlist_free(&el);
}

const struct wb_test wb_tests[] = {
    {"xxh3_known", test_xxh3_known, 0},
    {"read_modes", test_read_modes, 0},
    {"shrunk_file", test_shrunk_file, 0},
    {"shares_exact", test_shares_exact, 0},
    {"shares_1g", test_shares_1g, 0},
    {"shrinks_while_read", test_shrinks_while_read, 0},
    {"direct_same_file", test_direct_same_file, 0},
    {0},
};
