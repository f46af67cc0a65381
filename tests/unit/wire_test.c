/* wire_test.c — msgpack envelope and shared-struct round trips, and malformed input: every
 * truncated, oversized or garbage message must fail with -EBADMSG without over-reading (the
 * test build runs under ASan, and inputs are copied to exact-size heap buffers so a read one
 * byte past the end is caught). */
#include "common/common.h"
#include "tests/wbtest.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

enum { MSG_META = 7 };

static struct wb_tensor_meta sample_meta(void)
{
    struct wb_tensor_meta t = {.dtype = WB_DTYPE_BF16};
    snprintf(t.name, sizeof(t.name), "model.layers.3.mlp.experts.17.gate_proj.weight");
    t.shape.ndim = 2;
    t.shape.dim[0] = 768;
    t.shape.dim[1] = 2048;
    t.box = wb_box_full(&t.shape);
    t.box.off[0] = 384;
    t.box.ext[0] = 384;
    return t;
}

/* Encodes envelope(MSG_META, [meta, -5, 2.5, true, nil, bin"\x01\x02"]). */
static void encode_sample(struct wb_mpw *w)
{
    struct wb_tensor_meta t = sample_meta();
    wb_mpw_init(w);
    wb_mpw_envelope(w, MSG_META);
    wb_mpw_array(w, 6);
    wb_wire_put_tensor_meta(w, &t);
    wb_mpw_i64(w, -5);
    wb_mpw_f64(w, 2.5);
    wb_mpw_bool(w, true);
    wb_mpw_nil(w);
    wb_mpw_bin(w, "\x01\x02", 2);
    CHECK_INT(wb_mpw_finish(w), 0);
}

/* Decodes what encode_sample wrote; returns 0 or the first error. */
static int decode_sample(const void *buf, size_t len, struct wb_tensor_meta *t)
{
    struct wb_mpr r;
    uint32_t type, n;
    int64_t i;
    double f;
    bool b;
    const void *bin;
    size_t binlen;
    wb_mpr_init(&r, buf, len);
    int e = wb_mpr_envelope(&r, &type);
    if (e)
        return e;
    if (type != MSG_META || wb_mpr_array(&r, 16, &n) || n != 6)
        return -EBADMSG;
    if (wb_wire_get_tensor_meta(&r, t) || wb_mpr_i64(&r, &i) || wb_mpr_f64(&r, &f) ||
        wb_mpr_bool(&r, &b) || !wb_mpr_nil(&r) || wb_mpr_bin(&r, &bin, &binlen, 16))
        return -EBADMSG;
    if (i != -5 || f != 2.5 || !b || binlen != 2 || memcmp(bin, "\x01\x02", 2) != 0)
        return -EBADMSG;
    return wb_mpr_end(&r);
}

/* Decodes a copy of the bytes in an exact-size heap buffer. */
static int decode_exact(const void *bytes, size_t len)
{
    void *copy = malloc(len ? len : 1);
    CHECK(copy);
    memcpy(copy, bytes, len);
    struct wb_tensor_meta t;
    int r = decode_sample(copy, len, &t);
    free(copy);
    return r;
}

static void test_roundtrip(void)
{
    struct wb_mpw w;
    encode_sample(&w);
    struct wb_tensor_meta t, want = sample_meta();
    CHECK_INT(decode_sample(w.buf, w.len, &t), 0);
    CHECK_STR(t.name, want.name);
    CHECK_INT(t.dtype, WB_DTYPE_BF16);
    CHECK(wb_shape_eq(&t.shape, &want.shape));
    CHECK(wb_box_eq(&t.box, &want.box));
    wb_mpw_free(&w);
}

static void test_integers_all_widths(void)
{
    static const int64_t vals[] = {
        0,   1,    127,  128,    255,    256,       65535,     65536,      -1,        -32,
        -33, -128, -129, -32768, -32769, INT32_MIN, INT32_MAX, 4294967296, INT64_MIN, INT64_MAX};
    struct wb_mpw w;
    wb_mpw_init(&w);
    wb_mpw_array(&w, WB_ARRAY_LEN(vals) + 1);
    for (size_t i = 0; i < WB_ARRAY_LEN(vals); i++)
        wb_mpw_i64(&w, vals[i]);
    wb_mpw_u64(&w, UINT64_MAX);
    struct wb_mpr r;
    uint32_t n;
    wb_mpr_init(&r, w.buf, w.len);
    CHECK_INT(wb_mpr_array(&r, 100, &n), 0);
    CHECK_INT(n, WB_ARRAY_LEN(vals) + 1);
    for (size_t i = 0; i < WB_ARRAY_LEN(vals); i++) {
        int64_t v;
        CHECK_INT(wb_mpr_i64(&r, &v), 0);
        CHECK_INT(v, vals[i]);
    }
    uint64_t u;
    CHECK_INT(wb_mpr_u64(&r, &u), 0);
    CHECK_U64(u, UINT64_MAX);
    CHECK_INT(wb_mpr_end(&r), 0);
    /* a negative value is not a u64; UINT64_MAX is not an i64 */
    struct wb_mpr r2;
    wb_mpr_init(&r2, "\xff", 1);
    CHECK_INT(wb_mpr_u64(&r2, &u), -EBADMSG);
    int64_t v;
    wb_mpr_init(&r2, "\xcf\xff\xff\xff\xff\xff\xff\xff\xff", 9);
    CHECK_INT(wb_mpr_i64(&r2, &v), -EBADMSG);
    wb_mpr_init(&r2, "\xce\x00\x01\x00\x00", 5); /* 65536 does not fit a u32... it does */
    uint32_t u32;
    CHECK_INT(wb_mpr_u32(&r2, &u32), 0);
    CHECK_INT(u32, 65536);
    wb_mpr_init(&r2, "\xcf\x00\x00\x00\x01\x00\x00\x00\x00", 9);
    CHECK_INT(wb_mpr_u32(&r2, &u32), -EBADMSG);
    wb_mpw_free(&w);
}

static void test_every_truncation_rejected(void)
{
    struct wb_mpw w;
    encode_sample(&w);
    for (size_t len = 0; len < w.len; len++)
        if (decode_exact(w.buf, len) != -EBADMSG)
            wb_test_fail(__FILE__, __LINE__, "truncated to %zu of %zu bytes was accepted", len,
                         w.len);
    CHECK_INT(decode_exact(w.buf, w.len), 0);
    wb_mpw_free(&w);
}

static void test_trailing_bytes_rejected(void)
{
    struct wb_mpw w;
    encode_sample(&w);
    uint8_t *b = malloc(w.len + 1);
    memcpy(b, w.buf, w.len);
    b[w.len] = 0xc0;
    CHECK_INT(decode_exact(b, w.len + 1), -EBADMSG);
    free(b);
    wb_mpw_free(&w);
}

/* Opens an envelope and decodes exactly one tensor meta from an exact-size heap copy. */
static int decode_meta_exact(const void *bytes, size_t len, struct wb_tensor_meta *t)
{
    void *copy = malloc(len ? len : 1);
    CHECK(copy);
    memcpy(copy, bytes, len);
    struct wb_mpr r;
    uint32_t type;
    wb_mpr_init(&r, copy, len);
    int e = wb_mpr_envelope(&r, &type);
    if (!e)
        e = wb_wire_get_tensor_meta(&r, t);
    if (!e)
        e = wb_mpr_end(&r);
    free(copy);
    return e;
}

#define ENV "\x94\xce\x57\x42\x0a\x0b\x01\x07"

/* Each case is envelope + one tensor meta, malformed in exactly one way; the first is valid
 * (name "x", bf16, shape [4], box [0:4]) so the others fail for their own reason. */
static void test_malformed_rejected(void)
{
    static const struct {
        const char *why;
        const char *bytes;
        size_t len;
    } cases[] = {
        {"empty input", "", 0},
        {"not an array", "\xc0", 1},
        {"wrong magic", "\x94\xce\x57\x42\x0a\x0c\x01\x07\x94\xa1x\x01\x91\x04\x92\x00\x04", 17},
        {"envelope of 3 items", "\x93\xce\x57\x42\x0a\x0b\x01\x07", 8},
        {"meta array32 claims 4G items", ENV "\xdd\xff\xff\xff\xff", 13},
        {"map where array expected", ENV "\x84\xa1x\x01\x91\x04\x92\x00\x04", 17},
        {"str32 name claims 4 GiB", ENV "\x94\xdb\xff\xff\xff\xff\x01\x91\x04\x92\x00\x04", 20},
        {"name longer than WB_NAME_MAX", ENV "\x94\xda\x01\x00", 12},
        {"reserved byte 0xc1", ENV "\xc1", 9},
        {"dtype out of range", ENV "\x94\xa1x\x63\x91\x04\x92\x00\x04", 17},
        {"dtype 0 (invalid)", ENV "\x94\xa1x\x00\x91\x04\x92\x00\x04", 17},
        {"negative dtype", ENV "\x94\xa1x\xff\x91\x04\x92\x00\x04", 17},
        {"shape of 7 dims",
         ENV "\x94\xa1x\x01\x97\x01\x01\x01\x01\x01\x01\x01\x9e"
             "\x00\x01\x00\x01\x00\x01\x00\x01\x00\x01\x00\x01\x00\x01",
         36},
        {"box with odd item count", ENV "\x94\xa1x\x01\x91\x04\x93\x00\x04\x00", 18},
        {"box outside the shape", ENV "\x94\xa1x\x01\x91\x04\x92\x03\x02", 17},
        {"box offset wraps around",
         ENV "\x94\xa1x\x01\x91\x04\x92\xcf\xff\xff\xff\xff\xff"
             "\xff\xff\xff\x02",
         25},
        {"box ndim differs from shape", ENV "\x94\xa1x\x01\x91\x04\x94\x00\x04\x00\x01", 19},
        {"string with embedded NUL", ENV "\x94\xa3x\x00y\x01\x91\x04\x92\x00\x04", 19},
        {"float where int expected", ENV "\x94\xa1x\x01\x91\xca\x40\x80\x00\x00\x92\x00\x04", 21},
        {"truncated inside the box", ENV "\x94\xa1x\x01\x91\x04\x92\x00", 16},
        {"trailing byte", ENV "\x94\xa1x\x01\x91\x04\x92\x00\x04\xc0", 18},
    };
    struct wb_tensor_meta t;
    CHECK_INT(decode_meta_exact(ENV "\x94\xa1x\x01\x91\x04\x92\x00\x04", 17, &t), 0);
    CHECK_STR(t.name, "x");
    CHECK_U64(t.box.ext[0], 4);
    for (size_t i = 0; i < WB_ARRAY_LEN(cases); i++) {
        int r = decode_meta_exact(cases[i].bytes, cases[i].len, &t);
        if (r != -EBADMSG)
            wb_test_fail(__FILE__, __LINE__, "case '%s' returned %d, expected -EBADMSG",
                         cases[i].why, r);
    }
}

static void test_version_mismatch(void)
{
    /* version 2 of the envelope: a distinct error, so peers can say what is wrong */
    static const char msg[] = "\x94\xce\x57\x42\x0a\x0b\x02\x07\x90";
    CHECK_INT(decode_exact(msg, sizeof(msg) - 1), -WB_E_VERSION);
    CHECK_STR(wb_strerror(-WB_E_VERSION), "unsupported wire message version");
}

static void test_garbage_never_crashes(void)
{
    /* Deterministic pseudo-random garbage, with and without a valid envelope prefix. */
    uint64_t x = 88172645463325252ull;
    static const uint8_t head[] = {0x94, 0xce, 0x57, 0x42, 0x0a, 0x0b, 0x01, 0x07};
    for (int iter = 0; iter < 20000; iter++) {
        size_t len = (size_t)(iter % 64);
        uint8_t buf[80];
        size_t start = iter & 1 ? sizeof(head) : 0;
        memcpy(buf, head, start);
        for (size_t i = 0; i < len; i++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            buf[start + i] = (uint8_t)x;
        }
        int r = decode_exact(buf, start + len);
        CHECK(r == -EBADMSG || r == -WB_E_VERSION || r == 0);
        struct wb_mpr rd;
        wb_mpr_init(&rd, buf, start + len);
        while (wb_mpr_skip(&rd) == 0)
            ;
        CHECK_INT(rd.err, -EBADMSG);
    }
}

static void test_skip_and_limits(void)
{
    struct wb_mpw w;
    wb_mpw_init(&w);
    wb_mpw_map(&w, 2);
    wb_mpw_str(&w, "a");
    wb_mpw_array(&w, 2);
    wb_mpw_f64(&w, 1.0);
    wb_mpw_str(&w, "xyz");
    wb_mpw_str(&w, "b");
    wb_mpw_u64(&w, 1u << 20);
    wb_mpw_u64(&w, 9);
    struct wb_mpr r;
    uint64_t v;
    wb_mpr_init(&r, w.buf, w.len);
    CHECK_INT(wb_mpr_skip(&r), 0);
    CHECK_INT(wb_mpr_u64(&r, &v), 0);
    CHECK_U64(v, 9);
    CHECK_INT(wb_mpr_end(&r), 0);
    /* a map count above the caller's limit */
    uint32_t n;
    wb_mpr_init(&r, w.buf, w.len);
    CHECK_INT(wb_mpr_map(&r, 1, &n), -EBADMSG);
    /* a failed reader stays failed */
    CHECK_INT(wb_mpr_u64(&r, &v), -EBADMSG);
    /* strings: exactly cap-1 fits, cap does not */
    char s[4];
    wb_mpr_init(&r, "\xa3xyz", 4);
    CHECK_INT(wb_mpr_str(&r, s, 4), 0);
    CHECK_STR(s, "xyz");
    wb_mpr_init(&r, "\xa4wxyz", 5);
    CHECK_INT(wb_mpr_str(&r, s, 4), -EBADMSG);
    /* 40 nested arrays exceed the skip depth */
    uint8_t deep[41];
    memset(deep, 0x91, 40);
    deep[40] = 0xc0;
    wb_mpr_init(&r, deep, sizeof(deep));
    CHECK_INT(wb_mpr_skip(&r), -EBADMSG);
    wb_mpw_free(&w);
}

const struct wb_test wb_tests[] = {
    {"roundtrip", test_roundtrip, 0},
    {"integers_all_widths", test_integers_all_widths, 0},
    {"every_truncation_rejected", test_every_truncation_rejected, 0},
    {"trailing_bytes_rejected", test_trailing_bytes_rejected, 0},
    {"malformed_rejected", test_malformed_rejected, 0},
    {"version_mismatch", test_version_mismatch, 0},
    {"garbage_never_crashes", test_garbage_never_crashes, 0},
    {"skip_and_limits", test_skip_and_limits, 0},
    {0},
};
