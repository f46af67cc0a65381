/* sum.c — wb_sum64 on the host: the checksum of a write's bytes (common.h has its definition).
 *
 * Why not plain XXH3-64 of the bytes: that is one sequential pass, so on a GPU it is one
 * thread's work (or a copy to the host, as the agent did). Hashing 4 KiB chunks independently
 * and then hashing the chunks' hashes gives a GPU kernel one thread per chunk (sum.cu) and the
 * same value here; the length is the seed of the outer hash, so pieces differing only by
 * trailing zeros differ. */
#include "common/common.h"

#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t on the stack */
#include <xxhash.h>
#if defined(__x86_64__)
/* libxxhash's runtime dispatch: AVX2/AVX-512 where the CPU has them (the plain entry points
 * are SSE2 only, about half as fast). Same results. */
#include <xxh_x86dispatch.h>
#endif

#include <string.h>

uint64_t wb_sum64_chunk(const void *p, uint64_t valid)
{
    if (valid >= WB_SUM_CHUNK)
        return XXH3_64bits(p, WB_SUM_CHUNK);
    uint8_t pad[WB_SUM_CHUNK]; /* the tail, zero-padded to a whole chunk */
    memcpy(pad, p, valid);
    memset(pad + valid, 0, WB_SUM_CHUNK - valid);
    return XXH3_64bits(pad, WB_SUM_CHUNK);
}

uint64_t wb_sum64_combine(const uint64_t *chunks, uint64_t n)
{
    return XXH3_64bits_withSeed(chunks, wb_sum_nchunks(n) * sizeof(uint64_t), n);
}

uint64_t wb_sum64(const void *p, size_t n)
{
    enum { GROUP = 256 }; /* chunk hashes fed to the outer hash at a time (2 KiB of stack) */
    const uint8_t *b = p;
    uint64_t nc = wb_sum_nchunks(n), h[GROUP];
    if (nc <= GROUP) { /* most writes: one call of the outer hash */
        for (uint64_t i = 0; i < nc; i++)
            h[i] = wb_sum64_chunk(b + i * WB_SUM_CHUNK, n - i * WB_SUM_CHUNK);
        return wb_sum64_combine(h, n);
    }
    XXH3_state_t st; /* streaming gives the one-shot value (xxhash guarantees it) */
    XXH3_INITSTATE(&st);
    XXH3_64bits_reset_withSeed(&st, n);
    for (uint64_t i = 0; i < nc;) {
        uint64_t k = nc - i < GROUP ? nc - i : GROUP;
        for (uint64_t j = 0; j < k; j++, i++)
            h[j] = wb_sum64_chunk(b + i * WB_SUM_CHUNK, n - i * WB_SUM_CHUNK);
        XXH3_64bits_update(&st, h, k * sizeof(uint64_t));
    }
    return XXH3_64bits_digest(&st);
}
