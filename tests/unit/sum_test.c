/* sum_test.c — wb_sum64 (common.h) against its definition written out here with plain XXH3
 * calls, for every length 0..5000, lengths around the chunk and group edges and a few MiB, at
 * every start alignment; one flipped byte anywhere changes it; and the chunk hash the GPU kernel
 * runs (common/sum64.h), compiled here for the CPU, against libxxhash for every tail length and
 * alignment, and whole batches indexed as the kernel's threads index them. The kernel itself
 * against wb_sum64: tests/unit/gpu_cuda_test.c (GPU machines). */
#include "common/common.h"
#include "common/sum64.h"
#include "tests/wbtest.h"

#include <stdlib.h>
#include <xxhash.h>

/* The definition: chunks of 4096 bytes, the last zero-padded, XXH3-64 each; then XXH3-64 with
 * seed n over the chunk hashes. */
static uint64_t reference(const uint8_t *p, size_t n)
{
    size_t nc = (n + 4095) / 4096;
    uint8_t *pad = calloc(nc ? nc * 4096 : 1, 1);
    uint64_t *h = malloc((nc ? nc : 1) * sizeof(uint64_t));
    CHECK(pad && h);
    memcpy(pad, p, n);
    for (size_t i = 0; i < nc; i++)
        h[i] = XXH3_64bits(pad + i * 4096, 4096);
    uint64_t r = XXH3_64bits_withSeed(h, nc * sizeof(uint64_t), n);
    free(pad);
    free(h);
    return r;
}

static void fill(uint8_t *p, size_t n, uint64_t seed)
{
    uint64_t x = seed;
    for (size_t i = 0; i < n; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        p[i] = (uint8_t)(x >> 56);
    }
}

static void test_definition(void)
{
    enum { SMALL = 5000 };
    uint8_t *buf = malloc(SMALL + 8);
    CHECK(buf);
    fill(buf, SMALL + 8, 1);
    for (size_t n = 0; n <= SMALL; n++) {
        CHECK_U64(wb_sum64(buf, n), reference(buf, n));
        CHECK_U64(wb_sum64(buf + 1 + n % 7, n), reference(buf + 1 + n % 7, n));
    }
    free(buf);
    /* around the outer hash's grouping (256 chunks) and a few MiB, every start alignment */
    static const size_t big[] = {
        255 * 4096,       256 * 4096 - 1,  256 * 4096, 256 * 4096 + 1,    257 * 4096,
        512 * 4096 + 100, (3u << 20) + 17, 4u << 20,   (5u << 20) + 4095,
    };
    size_t max = (5u << 20) + 4095 + 8;
    uint8_t *b = malloc(max);
    CHECK(b);
    fill(b, max, 2);
    for (size_t i = 0; i < WB_ARRAY_LEN(big); i++)
        for (size_t a = 0; a < 8; a += 3)
            CHECK_U64(wb_sum64(b + a, big[i]), reference(b + a, big[i]));
    /* zeros are not nothing: a trailing zero byte, or zeros only, change the value */
    memset(b, 0, 8192);
    CHECK(wb_sum64(b, 4095) != wb_sum64(b, 4096));
    CHECK(wb_sum64(b, 0) != wb_sum64(b, 1));
    CHECK(wb_sum64(b, 1) != wb_sum64(b, 2));
    free(b);
}

/* The chunk hashes and their combination give wb_sum64. */
static void test_combine(void)
{
    size_t n = 10 * 4096 + 123;
    uint8_t *b = malloc(n);
    uint64_t h[11];
    CHECK(b);
    fill(b, n, 3);
    CHECK_U64(wb_sum_nchunks(n), 11);
    for (size_t i = 0; i < 11; i++)
        h[i] = wb_sum64_chunk(b + i * 4096, n - i * 4096);
    CHECK_U64(wb_sum64_combine(h, n), wb_sum64(b, n));
    CHECK_U64(wb_sum64_combine(NULL, 0), wb_sum64(NULL, 0));
    free(b);
}

/* Every byte of a 3-chunk buffer, and a sample of a 3 MiB one, flipped (one bit, or all eight)
 * changes the checksum; flipping it back restores it. */
static void test_flipped_byte(void)
{
    size_t n = 3 * 4096 + 77;
    uint8_t *b = malloc(n);
    CHECK(b);
    fill(b, n, 4);
    uint64_t want = wb_sum64(b, n);
    for (size_t i = 0; i < n; i++) {
        uint8_t m = (uint8_t)(1u << (i % 8));
        b[i] ^= m;
        if (wb_sum64(b, n) == want)
            wb_test_fail(__FILE__, __LINE__, "flipping bit %zu of byte %zu left it unchanged",
                         i % 8, i);
        b[i] ^= m ^ 0xff;
        CHECK(wb_sum64(b, n) != want);
        b[i] ^= 0xff;
    }
    CHECK_U64(wb_sum64(b, n), want);
    free(b);
    n = (3u << 20) + 5;
    b = malloc(n);
    CHECK(b);
    fill(b, n, 5);
    want = wb_sum64(b, n);
    uint64_t x = 99;
    for (int k = 0; k < 300; k++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        size_t i = k == 0 ? 0 : k == 1 ? n - 1 : (size_t)(x >> 20) % n;
        b[i] ^= 0x10;
        CHECK(wb_sum64(b, n) != want);
        b[i] ^= 0x10;
    }
    CHECK_U64(wb_sum64(b, n), want);
    free(b);
}

/* The kernel's chunk hash (sum64.h) on the CPU equals libxxhash's for every tail length, at
 * every start alignment (whole-word and byte loads), and for whole chunks. */
static void test_device_chunk_on_cpu(void)
{
    uint8_t *b = aligned_alloc(64, 8192), pad[4096];
    CHECK(b);
    fill(b, 8192, 6);
    for (uint32_t valid = 1; valid <= 4096; valid++)
        for (uint32_t a = 0; a < 8; a++) {
            if (valid % 61 != 0 && valid > 80 && valid < 4000 && a != 0 && a != 3)
                continue; /* every length at alignments 0 and 3; a sample at the others */
            memset(pad, 0, sizeof(pad));
            memcpy(pad, b + a, valid);
            uint64_t want = XXH3_64bits(pad, 4096);
            uint64_t got = wb_sum_chunk(b + a, valid);
            if (got != want)
                wb_test_fail(__FILE__, __LINE__,
                             "chunk of %u bytes at alignment %u: %016" PRIx64 ", xxh3 %016" PRIx64,
                             valid, a, got, want);
            CHECK_U64(wb_sum64_chunk(b + a, valid), want);
        }
    free(b);
}

/* A batch as the kernel runs it — wb_sum_batch_chunk for every chunk index, the same code as a
 * GPU thread's, here on the CPU — then each piece's chunk hashes combined: wb_sum64 of every
 * piece, for batches of random lengths 0..70000 (empty pieces among them, first and last
 * too) at random offsets and alignments. */
static void test_batch_on_cpu(void)
{
    enum { BYTES = 1 << 20, MAXP = 300 };
    uint8_t *b = aligned_alloc(64, BYTES);
    struct wb_sum_slot *sl = calloc(MAXP, sizeof(*sl));
    uint64_t *h = malloc(((size_t)MAXP * 70001 / 4096 + MAXP) * sizeof(uint64_t));
    CHECK(b && sl && h);
    fill(b, BYTES, 7);
    uint64_t x = 5;
    for (int round = 0; round < 40; round++) {
        uint32_t n = 1 + (uint32_t)(round * 7 % MAXP);
        uint64_t total = 0;
        for (uint32_t i = 0; i < n; i++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            uint64_t len = (x >> 20) % 70001;
            if ((x >> 8) % 9 == 0 || (round % 5 == 0 && (i == 0 || i == n - 1)))
                len = 0;
            size_t off = (size_t)(x >> 40) % (BYTES - len);
            sl[i] = (struct wb_sum_slot){b + off, len, total};
            total += wb_sum_nchunks(len);
        }
        for (uint64_t t = 0; t < total; t++)
            h[t] = wb_sum_batch_chunk(sl, n, t);
        for (uint32_t i = 0; i < n; i++)
            if (wb_sum64_combine(h + sl[i].chunk0, sl[i].len) != wb_sum64(sl[i].p, sl[i].len))
                wb_test_fail(__FILE__, __LINE__, "round %d piece %u of %u (%" PRIu64 " bytes)",
                             round, i, n, sl[i].len);
    }
    free(b);
    free(sl);
    free(h);
}

const struct wb_test wb_tests[] = {
    {"definition", test_definition, 0},     {"combine", test_combine, 0},
    {"flipped_byte", test_flipped_byte, 0}, {"device_chunk_on_cpu", test_device_chunk_on_cpu, 0},
    {"batch_on_cpu", test_batch_on_cpu, 0}, {0},
};
