/* box_test.c — shapes, boxes, intersection/containment, and byte-range decomposition. */
#include "common/common.h"
#include "tests/wbtest.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

static struct wb_shape shape(uint32_t n, const uint64_t *d)
{
    struct wb_shape s = {.ndim = n};
    for (uint32_t i = 0; i < n; i++)
        s.dim[i] = d[i];
    return s;
}

static struct wb_box box(uint32_t n, const uint64_t *off, const uint64_t *ext)
{
    struct wb_box b = {.ndim = n};
    for (uint32_t i = 0; i < n; i++)
        b.off[i] = off[i], b.ext[i] = ext[i];
    return b;
}

/* Collects every range as "off+len" pairs into a string, for exact comparison. */
static const char *ranges_of(const struct wb_shape *s, const struct wb_box *b, size_t elem)
{
    static char out[4096];
    struct wb_ranges r;
    size_t pos = 0;
    out[0] = 0;
    CHECK_INT(wb_ranges_init(&r, s, b, elem), 0);
    uint64_t off, len, n = 0;
    while (wb_ranges_next(&r, &off, &len)) {
        pos += (size_t)snprintf(out + pos, sizeof(out) - pos, "%s%llu+%llu", n ? " " : "",
                                (unsigned long long)off, (unsigned long long)len);
        n++;
    }
    CHECK_U64(n, wb_ranges_count(&r));
    return out;
}

/* Marks every byte each range covers and checks the result equals the naive per-element walk
 * over the box: every element once, nothing else. */
static void check_ranges_exact(const struct wb_shape *s, const struct wb_box *b, size_t elem)
{
    uint64_t total = wb_shape_numel(s) * elem;
    unsigned char *got = calloc(total + 1, 1), *want = calloc(total + 1, 1);
    CHECK(got && want);
    struct wb_ranges r;
    CHECK_INT(wb_ranges_init(&r, s, b, elem), 0);
    uint64_t off, len, prev_end = 0, covered = 0;
    bool first = true;
    while (wb_ranges_next(&r, &off, &len)) {
        CHECK(first || off > prev_end); /* increasing, and maximal: never adjacent */
        first = false;
        for (uint64_t i = 0; i < len; i++)
            got[off + i]++;
        prev_end = off + len;
        covered += len;
    }
    CHECK_U64(covered, wb_box_numel(b) * elem);
    uint64_t idx[WB_MAX_DIMS] = {0};
    uint64_t n = wb_box_numel(b);
    for (uint64_t k = 0; k < n; k++) {
        uint64_t lin = 0;
        for (uint32_t d = 0; d < s->ndim; d++)
            lin = lin * s->dim[d] + b->off[d] + idx[d];
        for (size_t e = 0; e < elem; e++)
            want[lin * elem + e]++;
        for (uint32_t d = s->ndim; d-- > 0;) {
            if (++idx[d] < b->ext[d])
                break;
            idx[d] = 0;
        }
    }
    CHECK_MEM(got, want, total);
    free(got);
    free(want);
}

static void test_shape_basics(void)
{
    struct wb_shape s = shape(2, (uint64_t[]){4096, 128});
    char buf[64];
    CHECK_U64(wb_shape_numel(&s), 524288);
    CHECK_STR(wb_shape_str(&s, buf, sizeof(buf)), "[4096, 128]");
    struct wb_shape scalar = {0};
    CHECK_U64(wb_shape_numel(&scalar), 1);
    CHECK_STR(wb_shape_str(&scalar, buf, sizeof(buf)), "[]");
    CHECK(wb_shape_eq(&s, &s));
    struct wb_shape t = shape(2, (uint64_t[]){4096, 129});
    CHECK(!wb_shape_eq(&s, &t));
    CHECK_STR(wb_shape_str(&s, buf, 6), "[4096");
}

static void test_box_intersect(void)
{
    char buf[64];
    struct wb_box a = box(2, (uint64_t[]){0, 0}, (uint64_t[]){100, 50});
    struct wb_box b = box(2, (uint64_t[]){60, 10}, (uint64_t[]){100, 10});
    struct wb_box c;
    CHECK(wb_box_intersect(&a, &b, &c));
    CHECK_STR(wb_box_str(&c, buf, sizeof(buf)), "[60:100, 10:20]");
    CHECK_U64(wb_box_numel(&c), 400);
    /* touching edges do not intersect */
    struct wb_box d = box(2, (uint64_t[]){100, 0}, (uint64_t[]){5, 50});
    CHECK(!wb_box_intersect(&a, &d, &c));
    CHECK(wb_box_empty(&c));
    CHECK_STR(wb_box_str(&c, buf, sizeof(buf)), "[0:0, 0:0]");
    /* an empty box intersects nothing */
    struct wb_box e = box(2, (uint64_t[]){10, 10}, (uint64_t[]){0, 5});
    CHECK(!wb_box_intersect(&a, &e, &c));
    /* ndim mismatch */
    struct wb_box f = box(1, (uint64_t[]){0}, (uint64_t[]){5});
    CHECK(!wb_box_intersect(&a, &f, &c));
    /* 4-d */
    struct wb_box g = box(4, (uint64_t[]){0, 1, 2, 3}, (uint64_t[]){2, 2, 2, 2});
    struct wb_box h = box(4, (uint64_t[]){1, 0, 3, 0}, (uint64_t[]){5, 2, 1, 4});
    CHECK(wb_box_intersect(&g, &h, &c));
    CHECK_STR(wb_box_str(&c, buf, sizeof(buf)), "[1:2, 1:2, 3:4, 3:4]");
}

static void test_box_contains(void)
{
    struct wb_shape s = shape(3, (uint64_t[]){8, 4, 2});
    struct wb_box full = wb_box_full(&s);
    struct wb_box inner = box(3, (uint64_t[]){7, 3, 1}, (uint64_t[]){1, 1, 1});
    struct wb_box past = box(3, (uint64_t[]){7, 3, 1}, (uint64_t[]){1, 1, 2});
    struct wb_box empty = box(3, (uint64_t[]){100, 0, 0}, (uint64_t[]){0, 0, 0});
    CHECK(wb_box_contains(&full, &inner));
    CHECK(!wb_box_contains(&full, &past));
    CHECK(wb_box_contains(&inner, &empty));
    CHECK(wb_box_within(&s, &full));
    CHECK(!wb_box_within(&s, &past));
    struct wb_box rel = wb_box_relative(&inner, &full);
    CHECK(wb_box_eq(&rel, &inner));
    struct wb_box origin = box(3, (uint64_t[]){4, 2, 0}, (uint64_t[]){4, 2, 2});
    rel = wb_box_relative(&inner, &origin);
    struct wb_box want = box(3, (uint64_t[]){3, 1, 1}, (uint64_t[]){1, 1, 1});
    CHECK(wb_box_eq(&rel, &want));
    struct wb_box back = wb_box_shift(&rel, origin.off);
    CHECK(wb_box_eq(&back, &inner));
    struct wb_shape bs = wb_box_shape(&origin);
    CHECK_U64(bs.dim[0], 4);
    CHECK_U64(bs.dim[2], 2);
}

static void test_ranges_full_tensor(void)
{
    struct wb_shape s = shape(2, (uint64_t[]){3, 5});
    struct wb_box full = wb_box_full(&s);
    CHECK_STR(ranges_of(&s, &full, 2), "0+30");
    struct wb_shape s4 = shape(4, (uint64_t[]){2, 3, 4, 5});
    full = wb_box_full(&s4);
    CHECK_STR(ranges_of(&s4, &full, 4), "0+480");
}

static void test_ranges_rows_and_cols(void)
{
    struct wb_shape s = shape(2, (uint64_t[]){4, 6});
    /* whole rows 1..2: one run */
    struct wb_box rows = box(2, (uint64_t[]){1, 0}, (uint64_t[]){2, 6});
    CHECK_STR(ranges_of(&s, &rows, 2), "12+24");
    /* columns 2..4 of every row: one run per row */
    struct wb_box cols = box(2, (uint64_t[]){0, 2}, (uint64_t[]){4, 3});
    CHECK_STR(ranges_of(&s, &cols, 2), "4+6 16+6 28+6 40+6");
    /* the last element: a box at the tensor end */
    struct wb_box last = box(2, (uint64_t[]){3, 5}, (uint64_t[]){1, 1});
    CHECK_STR(ranges_of(&s, &last, 2), "46+2");
    /* the last row, whole */
    struct wb_box lastrow = box(2, (uint64_t[]){3, 0}, (uint64_t[]){1, 6});
    CHECK_STR(ranges_of(&s, &lastrow, 1), "18+6");
}

static void test_ranges_empty_and_errors(void)
{
    struct wb_shape s = shape(2, (uint64_t[]){4, 6});
    struct wb_box empty = box(2, (uint64_t[]){4, 0}, (uint64_t[]){0, 6});
    struct wb_ranges r;
    uint64_t off, len;
    CHECK_INT(wb_ranges_init(&r, &s, &empty, 2), 0);
    CHECK_U64(wb_ranges_count(&r), 0);
    CHECK(!wb_ranges_next(&r, &off, &len));
    struct wb_box outside = box(2, (uint64_t[]){3, 0}, (uint64_t[]){2, 6});
    CHECK_INT(wb_ranges_init(&r, &s, &outside, 2), -EINVAL);
    struct wb_box wrongdim = box(1, (uint64_t[]){0}, (uint64_t[]){1});
    CHECK_INT(wb_ranges_init(&r, &s, &wrongdim, 2), -EINVAL);
    struct wb_box ok = wb_box_full(&s);
    CHECK_INT(wb_ranges_init(&r, &s, &ok, 0), -EINVAL);
}

static void test_ranges_one_element_dims(void)
{
    /* [1, 5, 1, 3]: 1-element dims are "whole" and merge */
    struct wb_shape s = shape(4, (uint64_t[]){1, 5, 1, 3});
    struct wb_box b = box(4, (uint64_t[]){0, 1, 0, 0}, (uint64_t[]){1, 3, 1, 3});
    CHECK_STR(ranges_of(&s, &b, 2), "6+18");
    struct wb_box c = box(4, (uint64_t[]){0, 1, 0, 1}, (uint64_t[]){1, 3, 1, 1});
    CHECK_STR(ranges_of(&s, &c, 2), "8+2 14+2 20+2");
    struct wb_shape scalar = {0};
    struct wb_box sb = wb_box_full(&scalar);
    CHECK_STR(ranges_of(&scalar, &sb, 4), "0+4");
}

static void test_ranges_3d_4d(void)
{
    /* 3-d: experts [4, 6, 8]; experts 1..2, rows 2..4, all columns -> one run per expert */
    struct wb_shape s = shape(3, (uint64_t[]){4, 6, 8});
    struct wb_box b = box(3, (uint64_t[]){1, 2, 0}, (uint64_t[]){2, 3, 8});
    CHECK_STR(ranges_of(&s, &b, 2), "128+48 224+48");
    struct wb_box e = box(3, (uint64_t[]){1, 0, 0}, (uint64_t[]){2, 6, 8});
    CHECK_STR(ranges_of(&s, &e, 2), "96+192");
    struct wb_box c = box(3, (uint64_t[]){0, 0, 4}, (uint64_t[]){1, 2, 4});
    CHECK_STR(ranges_of(&s, &c, 1), "4+4 12+4");
    /* 4-d checked exhaustively against the per-element walk on many boxes */
    struct wb_shape s4 = shape(4, (uint64_t[]){3, 4, 2, 5});
    for (uint64_t o0 = 0; o0 < 3; o0++)
        for (uint64_t e1 = 1; e1 <= 4; e1++)
            for (uint64_t o3 = 0; o3 < 5; o3 += 2)
                for (uint64_t e3 = 1; o3 + e3 <= 5; e3++) {
                    struct wb_box x =
                        box(4, (uint64_t[]){o0, 4 - e1, 1, o3}, (uint64_t[]){3 - o0, e1, 1, e3});
                    check_ranges_exact(&s4, &x, 2);
                    struct wb_box y =
                        box(4, (uint64_t[]){o0, 0, 0, o3}, (uint64_t[]){1, e1, 2, e3});
                    check_ranges_exact(&s4, &y, 3);
                }
    struct wb_box full = wb_box_full(&s4);
    check_ranges_exact(&s4, &full, 2);
}

/* wb_permute against the definition, element by element: every permutation of 3 and 4 dims
 * (odd extents, so tiles end inside), 1/2/4/8-byte elements, against dst[i] = src[j] with
 * j[perm[k]] = i[k]; bad permutations and element sizes refused. */
static void check_permute(uint32_t nd, const uint64_t *ext, const uint8_t *perm, size_t el)
{
    uint64_t n = 1, sstr[WB_MAX_DIMS], e[WB_MAX_DIMS], dstr[WB_MAX_DIMS];
    for (uint32_t d = nd; d-- > 0;) {
        sstr[d] = n;
        n *= ext[d];
    }
    uint64_t m = 1;
    for (uint32_t k = nd; k-- > 0;) {
        e[k] = ext[perm[k]];
        dstr[k] = m;
        m *= e[k];
    }
    uint8_t *src = malloc(n * el), *dst = malloc(n * el);
    for (uint64_t i = 0; i < n * el; i++)
        src[i] = (uint8_t)(i * 31 + i / 7);
    CHECK_INT(wb_permute(dst, src, el, nd, ext, perm), 0);
    uint64_t bad = 0;
    for (uint64_t i = 0; i < n; i++) {
        uint64_t so = 0;
        for (uint32_t k = nd; k-- > 0;) {
            uint64_t ik = i / dstr[k] % e[k];
            so += ik * sstr[perm[k]];
        }
        bad += memcmp(dst + i * el, src + so * el, el) != 0;
    }
    CHECK_U64(bad, 0);
    free(src);
    free(dst);
}

static void test_permute(void)
{
    static const uint8_t p3[][3] = {{0, 1, 2}, {0, 2, 1}, {1, 0, 2},
                                    {1, 2, 0}, {2, 0, 1}, {2, 1, 0}};
    const uint64_t e3[3] = {3, 37, 70};
    for (size_t i = 0; i < WB_ARRAY_LEN(p3); i++)
        for (size_t el = 1; el <= 8; el *= 2)
            check_permute(3, e3, p3[i], el);
    const uint64_t e4[4] = {2, 5, 33, 3};
    const uint8_t p4[][4] = {{0, 1, 3, 2}, {3, 2, 1, 0}, {1, 3, 0, 2}, {2, 0, 3, 1}};
    for (size_t i = 0; i < WB_ARRAY_LEN(p4); i++)
        check_permute(4, e4, p4[i], 2);
    const uint64_t e2[2] = {129, 65}; /* a transpose across several tiles */
    check_permute(2, e2, (const uint8_t[]){1, 0}, 2);
    uint8_t a[8] = {0}, b[8];
    CHECK_INT(wb_permute(b, a, 2, 2, e2, (const uint8_t[]){1, 1}), -EINVAL);
    CHECK_INT(wb_permute(b, a, 2, 2, e2, (const uint8_t[]){0, 2}), -EINVAL);
    CHECK_INT(wb_permute(b, a, 3, 2, e2, (const uint8_t[]){1, 0}), -EINVAL);
    const uint64_t e0[2] = {0, 5}; /* empty: nothing written */
    CHECK_INT(wb_permute(b, a, 2, 2, e0, (const uint8_t[]){1, 0}), 0);
}

const struct wb_test wb_tests[] = {
    {"shape_basics", test_shape_basics, 0},
    {"box_intersect", test_box_intersect, 0},
    {"box_contains", test_box_contains, 0},
    {"ranges_full_tensor", test_ranges_full_tensor, 0},
    {"ranges_rows_and_cols", test_ranges_rows_and_cols, 0},
    {"ranges_empty_and_errors", test_ranges_empty_and_errors, 0},
    {"ranges_one_element_dims", test_ranges_one_element_dims, 0},
    {"ranges_3d_4d", test_ranges_3d_4d, 0},
    {"permute", test_permute, 0},
    {0},
};
