/* sum64.h — private to common/ (and its tests): XXH3-64 (seed 0) of one 4096-byte chunk, the
 * building block of wb_sum64, written out as plain integer code that compiles both as C and as
 * CUDA device code, so the GPU kernel (sum.cu) is the very code tests/unit/common_test.c checks
 * against libxxhash on the CPU. The host's wb_sum64 itself calls libxxhash (vectorized).
 *
 * The chunk is XXH3's long-input path for a fixed length of 4096: 8 accumulators, 64-byte
 * stripes, 16 stripes per 1024-byte block and a scramble after each of the first three blocks;
 * then 15 stripes, the last stripe (bytes 4032..4095) with the secret at offset 121, and the
 * merge with the secret at offset 11 and start 4096 * PRIME64_1. With the length fixed, every
 * secret word is a constant (wb_sum_key), so after unrolling the device code reads no secret.
 *
 * Loads: a chunk of a piece that starts 8-byte aligned reads whole words (16-byte loads on the
 * device where it starts 16-byte aligned); the bytes past the piece's end count as zeros and
 * are never read (the last word is assembled from its bytes), nor is anything before the
 * piece's start. An unaligned piece is read byte by byte. */
#ifndef WB_COMMON_SUM64_H
#define WB_COMMON_SUM64_H

#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define WB_SUM_FN static __host__ __device__ __forceinline__
#else
#define WB_SUM_FN static inline
#endif
#ifdef __CUDA_ARCH__ /* the device pass unrolls, so that the secret words are constants */
#define WB_SUM_UNROLL _Pragma("unroll")
#else
#define WB_SUM_UNROLL
#endif

enum { WB_SUM_CHUNK_BYTES = 4096 };

/* The default secret's words at the offsets the 4096-byte path reads (little-endian):
 * 0..23: offset 8i (stripe s, lane j reads word s + j; the scramble reads 16..23);
 * 24..31: offset 121 + 8j (the last stripe); 32..39: offset 11 + 8j (the merge). */
WB_SUM_FN uint64_t wb_sum_key(unsigned i)
{
    const uint64_t k[40] = {
        0xbe4ba423396cfeb8ull, 0x1cad21f72c81017cull, 0xdb979083e96dd4deull, 0x1f67b3b7a4a44072ull,
        0x78e5c0cc4ee679cbull, 0x2172ffcc7dd05a82ull, 0x8e2443f7744608b8ull, 0x4c263a81e69035e0ull,
        0xcb00c391bb52283cull, 0xa32e531b8b65d088ull, 0x4ef90da297486471ull, 0xd8acdea946ef1938ull,
        0x3f349ce33f76faa8ull, 0x1d4f0bc7c7bbdcf9ull, 0x3159b4cd4be0518aull, 0x647378d9c97e9fc8ull,
        0xc3ebd33483acc5eaull, 0xeb6313faffa081c5ull, 0x49daf0b751dd0d17ull, 0x9e68d429265516d3ull,
        0xfca1477d58be162bull, 0xce31d07ad1b8f88full, 0x280416958f3acb45ull, 0x7e404bbbcafbd7afull,
        0xea647378d9c97e9full, 0xc5c3ebd33483acc5ull, 0x17eb6313faffa081ull, 0xd349daf0b751dd0dull,
        0x2b9e68d429265516ull, 0x8ffca1477d58be16ull, 0x45ce31d07ad1b8f8ull, 0xaf280416958f3acbull,
        0x6dd4de1cad21f72cull, 0xa44072db979083e9ull, 0xe679cb1f67b3b7a4ull, 0xd05a8278e5c0cc4eull,
        0x4608b82172ffcc7dull, 0x9035e08e2443f774ull, 0x52283c4c263a81e6ull, 0x65d088cb00c391bbull,
    };
    return k[i];
}

/* The 8 bytes at p + off as a little-endian word, bytes at or past `valid` as zeros. Mode 0:
 * any alignment (byte loads); 1 and 2: p is 8-byte aligned (whole words where they fit). On the
 * device the loads go through the read-only cache: nothing writes the bytes while they are
 * hashed. */
WB_SUM_FN uint64_t wb_sum_word(const uint8_t *p, uint32_t off, uint32_t valid, int mode)
{
    if (mode && off + 8 <= valid) {
#ifdef __CUDA_ARCH__
        return __ldg((const unsigned long long *)(p + off));
#else
        uint64_t v;
        memcpy(&v, p + off, 8);
        return v; /* the hosts weightbridge runs on are little-endian (proto.h) */
#endif
    }
    uint64_t v = 0;
    for (uint32_t b = 0; b < 8 && off + b < valid; b++)
#ifdef __CUDA_ARCH__
        v |= (uint64_t)__ldg(p + off + b) << (8 * b);
#else
        v |= (uint64_t)p[off + b] << (8 * b);
#endif
    return v;
}

/* The stripe's 8 words at chunk offset off. Mode 2 (p 16-byte aligned, a whole chunk): on the
 * device, 16-byte loads. */
WB_SUM_FN void wb_sum_words(uint64_t w[8], const uint8_t *p, uint32_t off, uint32_t valid, int mode)
{
#ifdef __CUDA_ARCH__
    if (mode == 2) {
        WB_SUM_UNROLL
        for (unsigned j = 0; j < 4; j++) {
            ulonglong2 v = __ldg((const ulonglong2 *)(p + off) + j);
            w[2 * j] = v.x;
            w[2 * j + 1] = v.y;
        }
        return;
    }
#endif
    WB_SUM_UNROLL
    for (unsigned j = 0; j < 8; j++)
        w[j] = wb_sum_word(p, off + 8 * j, valid, mode);
}

/* XXH3's accumulate of one stripe at chunk offset off; lane j takes secret word kbase + j. */
WB_SUM_FN void wb_sum_stripe(uint64_t acc[8], const uint8_t *p, uint32_t off, uint32_t valid,
                             int mode, unsigned kbase)
{
    uint64_t w[8];
    wb_sum_words(w, p, off, valid, mode);
    WB_SUM_UNROLL
    for (unsigned j = 0; j < 8; j++) {
        uint64_t k = w[j] ^ wb_sum_key(kbase + j);
        acc[j ^ 1] += w[j];
        acc[j] += (uint64_t)(uint32_t)k * (k >> 32);
    }
}

WB_SUM_FN uint64_t wb_sum_mul128_fold(uint64_t a, uint64_t b)
{
#ifdef __CUDA_ARCH__
    return (a * b) ^ __umul64hi(a, b);
#else
    unsigned __int128 r = (unsigned __int128)a * b;
    return (uint64_t)r ^ (uint64_t)(r >> 64);
#endif
}

/* XXH3_64bits (seed 0) of the chunk: `valid` bytes at p (1..4096), zeros after them. */
WB_SUM_FN uint64_t wb_sum_chunk_mode(const uint8_t *p, uint32_t valid, int mode)
{
    uint64_t acc[8] = {0xC2B2AE3Dull,         0x9E3779B185EBCA87ull, 0xC2B2AE3D27D4EB4Full,
                       0x165667B19E3779F9ull, 0x85EBCA77C2B2AE63ull, 0x85EBCA77ull,
                       0x27D4EB2F165667C5ull, 0x9E3779B1ull};
    for (uint32_t blk = 0; blk < 4; blk++) {
        WB_SUM_UNROLL
        for (unsigned s = 0; s < 16; s++) {
            if (blk == 3 && s == 15) /* the last block has 15 stripes, then the last stripe */
                break;
            wb_sum_stripe(acc, p, blk * 1024 + s * 64, valid, mode, s);
        }
        if (blk == 3)
            break;
        WB_SUM_UNROLL
        for (unsigned j = 0; j < 8; j++) { /* scramble */
            uint64_t a = acc[j];
            a ^= a >> 47;
            a ^= wb_sum_key(16 + j);
            acc[j] = a * 0x9E3779B1ull;
        }
    }
    wb_sum_stripe(acc, p, 4032u, valid, mode, 24);
    uint64_t r = (uint64_t)WB_SUM_CHUNK_BYTES * 0x9E3779B185EBCA87ull;
    WB_SUM_UNROLL
    for (unsigned i = 0; i < 4; i++)
        r += wb_sum_mul128_fold(acc[2 * i] ^ wb_sum_key(32 + 2 * i),
                                acc[2 * i + 1] ^ wb_sum_key(33 + 2 * i));
    r ^= r >> 37;
    r *= 0x165667919E3779F9ull;
    return r ^ (r >> 32);
}

/* The chunk's hash, taking the widest loads p allows (a whole aligned chunk checks no bounds). */
WB_SUM_FN uint64_t wb_sum_chunk(const uint8_t *p, uint32_t valid)
{
    if (((uintptr_t)p & 7) != 0)
        return wb_sum_chunk_mode(p, valid, 0);
    if (valid != WB_SUM_CHUNK_BYTES)
        return wb_sum_chunk_mode(p, valid, 1);
    if (((uintptr_t)p & 15) != 0)
        return wb_sum_chunk_mode(p, WB_SUM_CHUNK_BYTES, 1);
    return wb_sum_chunk_mode(p, WB_SUM_CHUNK_BYTES, 2);
}

/* A piece of a batch as the kernel sees it: where its bytes are, and its first chunk's index
 * among the batch's chunks (pieces in order, each wb_sum_nchunks(len) chunks). */
struct wb_sum_slot {
    const uint8_t *p;
    uint64_t len;
    uint64_t chunk0;
};

/* Where chunk t of a batch of n pieces starts and how many of its bytes are valid (t below the
 * batch's chunk count): the piece is the last one starting at or before t (pieces of no bytes
 * start where the next one does and are passed over). The kernel's lanes find their chunk by
 * it; sum_test runs it for every t on the CPU. */
WB_SUM_FN const uint8_t *wb_sum_batch_at(const struct wb_sum_slot *pieces, uint32_t n, uint64_t t,
                                         uint32_t *valid)
{
    uint32_t lo = 0, hi = n; /* the first piece with chunk0 > t is hi */
    while (lo < hi) {
        uint32_t mid = (lo + hi) / 2;
        if (pieces[mid].chunk0 <= t)
            lo = mid + 1;
        else
            hi = mid;
    }
    const struct wb_sum_slot *pc = &pieces[lo - 1];
    uint64_t at = (t - pc->chunk0) * WB_SUM_CHUNK_BYTES, left = pc->len - at;
    *valid = left < WB_SUM_CHUNK_BYTES ? (uint32_t)left : WB_SUM_CHUNK_BYTES;
    return pc->p + at;
}

/* The hash of chunk t of a batch (one thread's work in the kernel before it split chunks by
 * lane; sum_test checks the batch indexing with it). */
WB_SUM_FN uint64_t wb_sum_batch_chunk(const struct wb_sum_slot *pieces, uint32_t n, uint64_t t)
{
    uint32_t valid;
    const uint8_t *p = wb_sum_batch_at(pieces, n, t, &valid);
    return wb_sum_chunk(p, valid);
}

#endif /* WB_COMMON_SUM64_H */
