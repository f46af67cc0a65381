/* siphash.c — SipHash-2-4 (Aumasson and Bernstein, "SipHash: a fast short-input PRF", 2012):
 * the keyed 64-bit MAC that authenticates what one agent tells another on the data plane (a
 * transfer attempt's notes and checksum records). Why SipHash and not XXH3 with a secret:
 * XXH3 is built for speed against accidental collisions, SipHash is a pseudorandom function
 * whose output an attacker who does not hold the key cannot predict or forge, at a cost of
 * about 100 ns for the 64-byte messages it authenticates here. Written from the paper; the
 * reference vectors are in tests/unit/common_test.c. */
#include "common/common.h"

#include <string.h>

static uint64_t rotl(uint64_t x, int b)
{
    return (x << b) | (x >> (64 - b));
}

static uint64_t le64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

struct sip {
    uint64_t v0, v1, v2, v3;
};

static void round_(struct sip *s)
{
    s->v0 += s->v1;
    s->v1 = rotl(s->v1, 13);
    s->v1 ^= s->v0;
    s->v0 = rotl(s->v0, 32);
    s->v2 += s->v3;
    s->v3 = rotl(s->v3, 16);
    s->v3 ^= s->v2;
    s->v0 += s->v3;
    s->v3 = rotl(s->v3, 21);
    s->v3 ^= s->v0;
    s->v2 += s->v1;
    s->v1 = rotl(s->v1, 17);
    s->v1 ^= s->v2;
    s->v2 = rotl(s->v2, 32);
}

static void absorb(struct sip *s, uint64_t m)
{
    s->v3 ^= m;
    round_(s);
    round_(s);
    s->v0 ^= m;
}

uint64_t wb_siphash(const uint8_t key[WB_MAC_KEY_BYTES], const void *msg, size_t len)
{
    uint64_t k0 = le64(key), k1 = le64(key + 8);
    struct sip s = {k0 ^ 0x736f6d6570736575ull, k1 ^ 0x646f72616e646f6dull,
                    k0 ^ 0x6c7967656e657261ull, k1 ^ 0x7465646279746573ull};
    const uint8_t *p = msg;
    size_t full = len / 8 * 8;
    for (size_t i = 0; i < full; i += 8)
        absorb(&s, le64(p + i));
    uint8_t last[8] = {0};
    memcpy(last, p + full, len - full);
    last[7] = (uint8_t)len;
    absorb(&s, le64(last));
    s.v2 ^= 0xff;
    for (int i = 0; i < 4; i++)
        round_(&s);
    return s.v0 ^ s.v1 ^ s.v2 ^ s.v3;
}
