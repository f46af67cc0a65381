/* wire.c — the msgpack wire codec: a writer on msgpack-c's packer and a bounds-checked,
 * zero-allocation pull reader, plus the encodings of the structs every part exchanges.
 *
 * Every message is the array [WB_WIRE_MAGIC, WB_WIRE_VERSION, type, body]. Decoders check
 * type, range and remaining length at every step and fail with -EBADMSG; a failed reader stays
 * failed so callers may read a whole struct and check once. */
#include "common/common.h"

#include <errno.h>
#include <msgpack.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- writer */

static int mpw_write(void *data, const char *buf, size_t len)
{
    struct wb_mpw *w = data;
    if (w->err)
        return -1;
    if (len == 0) /* nothing to append (and an empty writer has no buffer to point into) */
        return 0;
    if (w->len + len > w->cap) {
        size_t cap = w->cap ? w->cap : 256;
        while (cap < w->len + len)
            cap *= 2;
        uint8_t *nb = realloc(w->buf, cap);
        if (!nb) {
            w->err = -ENOMEM;
            return -1;
        }
        w->buf = nb;
        w->cap = cap;
    }
    memcpy(w->buf + w->len, buf, len);
    w->len += len;
    return 0;
}

/* msgpack_packer is two pointers; making one per call keeps struct wb_mpw free of msgpack-c
 * types, so the public header does not include msgpack.h. */
static msgpack_packer packer(struct wb_mpw *w)
{
    return (msgpack_packer){w, mpw_write};
}

void wb_mpw_init(struct wb_mpw *w)
{
    memset(w, 0, sizeof(*w));
}

void wb_mpw_free(struct wb_mpw *w)
{
    free(w->buf);
    memset(w, 0, sizeof(*w));
}

void wb_mpw_envelope(struct wb_mpw *w, uint32_t type)
{
    msgpack_packer pk = packer(w);
    msgpack_pack_array(&pk, 4);
    msgpack_pack_uint32(&pk, WB_WIRE_MAGIC);
    msgpack_pack_uint32(&pk, WB_WIRE_VERSION);
    msgpack_pack_uint32(&pk, type);
}

void wb_mpw_array(struct wb_mpw *w, uint32_t n)
{
    msgpack_packer pk = packer(w);
    msgpack_pack_array(&pk, n);
}

void wb_mpw_map(struct wb_mpw *w, uint32_t n)
{
    msgpack_packer pk = packer(w);
    msgpack_pack_map(&pk, n);
}

void wb_mpw_u64(struct wb_mpw *w, uint64_t v)
{
    msgpack_packer pk = packer(w);
    msgpack_pack_uint64(&pk, v);
}

void wb_mpw_i64(struct wb_mpw *w, int64_t v)
{
    msgpack_packer pk = packer(w);
    msgpack_pack_int64(&pk, v);
}

void wb_mpw_f64(struct wb_mpw *w, double v)
{
    msgpack_packer pk = packer(w);
    msgpack_pack_double(&pk, v);
}

void wb_mpw_bool(struct wb_mpw *w, bool v)
{
    msgpack_packer pk = packer(w);
    if (v)
        msgpack_pack_true(&pk);
    else
        msgpack_pack_false(&pk);
}

void wb_mpw_nil(struct wb_mpw *w)
{
    msgpack_packer pk = packer(w);
    msgpack_pack_nil(&pk);
}

void wb_mpw_strn(struct wb_mpw *w, const char *s, size_t n)
{
    msgpack_packer pk = packer(w);
    msgpack_pack_str(&pk, n);
    msgpack_pack_str_body(&pk, s, n);
}

void wb_mpw_str(struct wb_mpw *w, const char *s)
{
    wb_mpw_strn(w, s, strlen(s));
}

void wb_mpw_bin(struct wb_mpw *w, const void *p, size_t n)
{
    msgpack_packer pk = packer(w);
    msgpack_pack_bin(&pk, n);
    msgpack_pack_bin_body(&pk, p, n);
}

void wb_mpw_raw(struct wb_mpw *w, const void *p, size_t n)
{
    msgpack_packer pk = packer(w);
    msgpack_pack_bin_body(&pk, p, n); /* appends the bytes as they are */
}

/* ---------------------------------------------------------------- reader */

void wb_mpr_init(struct wb_mpr *r, const void *buf, size_t len)
{
    r->p = buf;
    r->left = buf ? len : 0;
    r->err = 0;
}

static int fail(struct wb_mpr *r)
{
    r->err = -EBADMSG;
    return -EBADMSG;
}

/* Consumes n bytes and returns a pointer to them, or NULL (reader failed). */
static const uint8_t *take(struct wb_mpr *r, size_t n)
{
    if (r->err || r->left < n) {
        fail(r);
        return NULL;
    }
    const uint8_t *p = r->p;
    r->p += n;
    r->left -= n;
    return p;
}

static uint64_t be(const uint8_t *p, unsigned n)
{
    uint64_t v = 0;
    for (unsigned i = 0; i < n; i++)
        v = v << 8 | p[i];
    return v;
}

/* Reads a big-endian unsigned of n bytes. */
static int take_be(struct wb_mpr *r, unsigned n, uint64_t *v)
{
    const uint8_t *p = take(r, n);
    if (!p)
        return -EBADMSG;
    *v = be(p, n);
    return 0;
}

static int peek(struct wb_mpr *r, uint8_t *tag)
{
    if (r->err || r->left == 0)
        return fail(r);
    *tag = r->p[0];
    return 0;
}

/* Reads any integer: *neg tells a negative value, held in *mag as two's complement int64. */
static int read_int(struct wb_mpr *r, uint64_t *v, bool *neg)
{
    const uint8_t *t = take(r, 1);
    if (!t)
        return -EBADMSG;
    uint8_t c = *t;
    *neg = false;
    if (c <= 0x7f) {
        *v = c;
        return 0;
    }
    if (c >= 0xe0) {
        *v = (uint64_t)(int64_t)(int8_t)c;
        *neg = true;
        return 0;
    }
    if (c >= 0xcc && c <= 0xcf)
        return take_be(r, 1u << (c - 0xcc), v);
    if (c >= 0xd0 && c <= 0xd3) {
        unsigned n = 1u << (c - 0xd0);
        uint64_t u;
        if (take_be(r, n, &u))
            return -EBADMSG;
        int64_t s = n == 1 ? (int8_t)u : n == 2 ? (int16_t)u : n == 4 ? (int32_t)u : (int64_t)u;
        *v = (uint64_t)s;
        *neg = s < 0;
        return 0;
    }
    return fail(r);
}

int wb_mpr_u64(struct wb_mpr *r, uint64_t *v)
{
    uint64_t x;
    bool neg;
    if (read_int(r, &x, &neg) || neg)
        return fail(r);
    *v = x;
    return 0;
}

int wb_mpr_u32(struct wb_mpr *r, uint32_t *v)
{
    uint64_t x;
    if (wb_mpr_u64(r, &x) || x > UINT32_MAX)
        return fail(r);
    *v = (uint32_t)x;
    return 0;
}

int wb_mpr_i64(struct wb_mpr *r, int64_t *v)
{
    uint64_t x;
    bool neg;
    if (read_int(r, &x, &neg) || (!neg && x > INT64_MAX))
        return fail(r);
    *v = (int64_t)x;
    return 0;
}

int wb_mpr_f64(struct wb_mpr *r, double *v)
{
    uint8_t c;
    if (peek(r, &c))
        return -EBADMSG;
    if (c == 0xca || c == 0xcb) {
        uint64_t u;
        take(r, 1);
        if (take_be(r, c == 0xca ? 4 : 8, &u))
            return -EBADMSG;
        if (c == 0xca) {
            uint32_t u32 = (uint32_t)u;
            float f;
            memcpy(&f, &u32, 4);
            *v = f;
        } else {
            memcpy(v, &u, 8);
        }
        return 0;
    }
    int64_t i; /* integers are accepted where a float is expected */
    if (wb_mpr_i64(r, &i))
        return -EBADMSG;
    *v = (double)i;
    return 0;
}

int wb_mpr_bool(struct wb_mpr *r, bool *v)
{
    const uint8_t *t = take(r, 1);
    if (!t || (*t != 0xc2 && *t != 0xc3))
        return fail(r);
    *v = *t == 0xc3;
    return 0;
}

bool wb_mpr_nil(struct wb_mpr *r)
{
    if (!r->err && r->left && r->p[0] == 0xc0) {
        take(r, 1);
        return true;
    }
    return false;
}

/* Header of a container or byte string: kind 'a' array, 'm' map, 's' str, 'b' bin. */
static int read_header(struct wb_mpr *r, char kind, uint64_t *n)
{
    const uint8_t *t = take(r, 1);
    if (!t)
        return -EBADMSG;
    uint8_t c = *t;
    switch (kind) {
    case 'a':
        if (c >= 0x90 && c <= 0x9f)
            return *n = c & 0x0f, 0;
        if (c == 0xdc || c == 0xdd)
            return take_be(r, c == 0xdc ? 2 : 4, n);
        break;
    case 'm':
        if (c >= 0x80 && c <= 0x8f)
            return *n = c & 0x0f, 0;
        if (c == 0xde || c == 0xdf)
            return take_be(r, c == 0xde ? 2 : 4, n);
        break;
    case 's':
        if (c >= 0xa0 && c <= 0xbf)
            return *n = c & 0x1f, 0;
        if (c >= 0xd9 && c <= 0xdb)
            return take_be(r, 1u << (c - 0xd9), n);
        break;
    case 'b':
        if (c >= 0xc4 && c <= 0xc6)
            return take_be(r, 1u << (c - 0xc4), n);
        break;
    }
    return fail(r);
}

int wb_mpr_array(struct wb_mpr *r, uint32_t max, uint32_t *n)
{
    uint64_t x;
    /* Each item takes at least one byte, so a count above the bytes left is a lie. */
    if (read_header(r, 'a', &x) || x > max || x > r->left)
        return fail(r);
    *n = (uint32_t)x;
    return 0;
}

int wb_mpr_map(struct wb_mpr *r, uint32_t max, uint32_t *n)
{
    uint64_t x;
    if (read_header(r, 'm', &x) || x > max || x > r->left / 2)
        return fail(r);
    *n = (uint32_t)x;
    return 0;
}

int wb_mpr_str(struct wb_mpr *r, char *buf, size_t cap)
{
    uint64_t n;
    if (read_header(r, 's', &n) || n >= cap)
        return fail(r);
    const uint8_t *p = take(r, (size_t)n);
    if (!p)
        return -EBADMSG;
    if (memchr(p, 0, (size_t)n)) /* embedded NUL would silently truncate a name */
        return fail(r);
    memcpy(buf, p, (size_t)n);
    buf[n] = 0;
    return 0;
}

int wb_mpr_bin(struct wb_mpr *r, const void **p, size_t *n, size_t max)
{
    uint8_t c;
    uint64_t len;
    if (peek(r, &c))
        return -EBADMSG;
    if (read_header(r, (c >= 0xc4 && c <= 0xc6) ? 'b' : 's', &len) || len > max)
        return fail(r);
    const uint8_t *q = take(r, (size_t)len);
    if (!q)
        return -EBADMSG;
    *p = q;
    *n = (size_t)len;
    return 0;
}

static int skip(struct wb_mpr *r, int depth)
{
    uint8_t c;
    uint64_t n;
    if (depth > 32 || peek(r, &c))
        return fail(r);
    if (c <= 0x7f || c >= 0xe0 || c == 0xc0 || c == 0xc2 || c == 0xc3)
        return take(r, 1) ? 0 : -EBADMSG;
    if ((c >= 0xcc && c <= 0xd3) || c == 0xca || c == 0xcb) {
        static const uint8_t width[] = {[0xca - 0xca] = 4, [0xcb - 0xca] = 8, [0xcc - 0xca] = 1,
                                        [0xcd - 0xca] = 2, [0xce - 0xca] = 4, [0xcf - 0xca] = 8,
                                        [0xd0 - 0xca] = 1, [0xd1 - 0xca] = 2, [0xd2 - 0xca] = 4,
                                        [0xd3 - 0xca] = 8};
        return take(r, 1u + width[c - 0xca]) ? 0 : -EBADMSG;
    }
    if ((c >= 0xa0 && c <= 0xbf) || (c >= 0xd9 && c <= 0xdb) || (c >= 0xc4 && c <= 0xc6)) {
        const void *p;
        size_t len;
        return wb_mpr_bin(r, &p, &len, SIZE_MAX);
    }
    if ((c >= 0x90 && c <= 0x9f) || c == 0xdc || c == 0xdd || (c >= 0x80 && c <= 0x8f) ||
        c == 0xde || c == 0xdf) {
        bool map = (c >= 0x80 && c <= 0x8f) || c == 0xde || c == 0xdf;
        if (read_header(r, map ? 'm' : 'a', &n) || n > r->left)
            return fail(r);
        for (uint64_t i = 0; i < (map ? 2 * n : n); i++)
            if (skip(r, depth + 1))
                return -EBADMSG;
        return 0;
    }
    /* ext types and the never-used 0xc1 are not part of our protocol */
    return fail(r);
}

int wb_mpr_skip(struct wb_mpr *r)
{
    return skip(r, 0);
}

int wb_mpr_end(const struct wb_mpr *r)
{
    return r->err || r->left ? -EBADMSG : 0;
}

int wb_mpr_envelope(struct wb_mpr *r, uint32_t *type)
{
    uint32_t n, magic, version, t;
    if (wb_mpr_array(r, 4, &n) || n != 4 || wb_mpr_u32(r, &magic) || magic != WB_WIRE_MAGIC)
        return fail(r);
    if (wb_mpr_u32(r, &version))
        return -EBADMSG;
    if (version != WB_WIRE_VERSION)
        return -WB_E_VERSION;
    if (wb_mpr_u32(r, &t))
        return -EBADMSG;
    *type = t;
    return 0;
}

/* ---------------------------------------------------------------- shared structs */

void wb_wire_put_shape(struct wb_mpw *w, const struct wb_shape *s)
{
    wb_mpw_array(w, s->ndim);
    for (uint32_t d = 0; d < s->ndim; d++)
        wb_mpw_u64(w, s->dim[d]);
}

int wb_wire_get_shape(struct wb_mpr *r, struct wb_shape *s)
{
    struct wb_shape t = {0};
    if (wb_mpr_array(r, WB_MAX_DIMS, &t.ndim))
        return -EBADMSG;
    for (uint32_t d = 0; d < t.ndim; d++)
        if (wb_mpr_u64(r, &t.dim[d]))
            return -EBADMSG;
    *s = t;
    return 0;
}

void wb_wire_put_box(struct wb_mpw *w, const struct wb_box *b)
{
    wb_mpw_array(w, 2 * b->ndim);
    for (uint32_t d = 0; d < b->ndim; d++) {
        wb_mpw_u64(w, b->off[d]);
        wb_mpw_u64(w, b->ext[d]);
    }
}

int wb_wire_get_box(struct wb_mpr *r, struct wb_box *b)
{
    struct wb_box t = {0};
    uint32_t n;
    if (wb_mpr_array(r, 2 * WB_MAX_DIMS, &n) || n % 2)
        return fail(r);
    t.ndim = n / 2;
    for (uint32_t d = 0; d < t.ndim; d++) {
        if (wb_mpr_u64(r, &t.off[d]) || wb_mpr_u64(r, &t.ext[d]))
            return -EBADMSG;
        if (t.off[d] + t.ext[d] < t.off[d]) /* wraps around */
            return fail(r);
    }
    *b = t;
    return 0;
}

void wb_wire_put_tensor_meta(struct wb_mpw *w, const struct wb_tensor_meta *t)
{
    wb_mpw_array(w, 4);
    wb_mpw_str(w, t->name);
    wb_mpw_u64(w, (uint64_t)t->dtype);
    wb_wire_put_shape(w, &t->shape);
    wb_wire_put_box(w, &t->box);
}

int wb_wire_get_tensor_meta(struct wb_mpr *r, struct wb_tensor_meta *t)
{
    struct wb_tensor_meta m;
    uint32_t n, dt;
    if (wb_mpr_array(r, 4, &n) || n != 4 || wb_mpr_str(r, m.name, sizeof(m.name)) ||
        wb_mpr_u32(r, &dt) || wb_wire_get_shape(r, &m.shape) || wb_wire_get_box(r, &m.box))
        return fail(r);
    if (dt == WB_DTYPE_INVALID || dt >= WB_DTYPE_COUNT || !wb_box_within(&m.shape, &m.box))
        return fail(r);
    m.dtype = (enum wb_dtype)dt;
    *t = m;
    return 0;
}
