/* ckpt_open_test.c — wb_ckpt_open(): a good checkpoint's tensor list, and the exact error for
 * every kind of bad file (each case makes its own broken file), all reported before any data is
 * read. */
#include "ckpt/ckpt.h"
#include "tests/wbtest.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

/* <tmpdir>/<name>, created as a directory. */
static char *case_dir(const char *name)
{
    char *d;
    if (asprintf(&d, "%s/%s", wb_test_tmpdir(), name) < 0 || mkdir(d, 0755) != 0)
        wb_test_fail(__FILE__, __LINE__, "mkdir %s", name);
    return d;
}

static void put(const char *dir, const char *file, const void *p, size_t n)
{
    char path[1024];
    snprintf(path, sizeof(path), "%s/%s", dir, file);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(p, 1, n, f) != n || fclose(f) != 0)
        wb_test_fail(__FILE__, __LINE__, "cannot write %s", path);
}

/* A safetensors file: the header as given (its length as the prefix unless hlen != 0), then
 * `data` bytes 0, 1, 2, ... */
static void st_len(const char *dir, const char *file, const char *hdr, uint64_t hlen, size_t data)
{
    size_t n = strlen(hdr);
    uint8_t *b = malloc(8 + n + data + 1);
    uint64_t len = hlen ? hlen : n;
    for (int i = 0; i < 8; i++)
        b[i] = (uint8_t)(len >> (8 * i));
    memcpy(b + 8, hdr, n);
    for (size_t i = 0; i < data; i++)
        b[8 + n + i] = (uint8_t)i;
    put(dir, file, b, 8 + n + data);
    free(b);
}

static void st(const char *dir, const char *file, const char *hdr, size_t data)
{
    st_len(dir, file, hdr, 0, data);
}

/* Opens path and checks the return and the exact list of messages (NULL-terminated). */
static void expect(const char *path, int code, const char *const *msgs)
{
    struct wb_errlist el;
    wb_errlist_init(&el);
    struct wb_ckpt *ck = NULL;
    int r = wb_ckpt_open(path, &ck, &el);
    size_t n = 0;
    while (msgs[n])
        n++;
    for (size_t i = 0; i < el.n && i < n; i++)
        CHECK_STR(el.msgs[i], msgs[i]);
    if (el.n != n)
        wb_errlist_print(&el, "    got: ", stderr);
    CHECK_INT(el.n, n);
    CHECK_INT(r, code);
    CHECK(ck == NULL);
    wb_errlist_free(&el);
}

#define EXPECT(path, code, ...) expect(path, code, (const char *const[]){__VA_ARGS__, NULL})

static const char GOOD[] = "{\"__metadata__\":{\"format\":\"pt\"},"
                           "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]},"
                           "\"a\":{\"dtype\":\"BF16\",\"shape\":[2,2],\"data_offsets\":[0,8]},"
                           "\"s\":{\"dtype\":\"F8_E4M3\",\"shape\":[],\"data_offsets\":[16,17]},"
                           "\"z\":{\"dtype\":\"I64\",\"shape\":[0,3],\"data_offsets\":[17,17]}}";

static void test_good_single_file(void)
{
    char *d = case_dir("good");
    st(d, "model.safetensors", GOOD, 17);
    char path[1024];
    snprintf(path, sizeof(path), "%s/model.safetensors", d);
    struct wb_errlist el;
    wb_errlist_init(&el);
    struct wb_ckpt *ck;
    CHECK_INT(wb_ckpt_open(path, &ck, &el), 0);
    CHECK_INT(el.n, 0);
    CHECK_INT(ck->nfiles, 1);
    CHECK_STR(ck->files[0].name, path);
    CHECK_U64(ck->files[0].size, 8 + strlen(GOOD) + 17);
    CHECK_U64(ck->files[0].data, 8 + strlen(GOOD));
    CHECK_INT(ck->files[0].ntensors, 4);
    CHECK_INT(ck->inv.n, 4);
    CHECK_U64(ck->bytes, 17);
    /* reading order: by offset */
    const char *names[] = {"a", "b", "s", "z"};
    const enum wb_dtype dts[] = {WB_DTYPE_BF16, WB_DTYPE_FP32, WB_DTYPE_FP8_E4M3, WB_DTYPE_I64};
    const uint64_t offs[] = {0, 8, 16, 17}, lens[] = {8, 8, 1, 0};
    for (int i = 0; i < 4; i++) {
        CHECK_STR(ck->inv.p[i].name, names[i]);
        CHECK_INT(ck->inv.p[i].dtype, dts[i]);
        CHECK_U64(ck->loc[i].offset, ck->files[0].data + offs[i]);
        CHECK_U64(ck->loc[i].bytes, lens[i]);
        CHECK_INT(ck->loc[i].file, 0);
    }
    char sb[64];
    CHECK_STR(wb_shape_str(&ck->inv.p[0].shape, sb, sizeof(sb)), "[2, 2]");
    CHECK_STR(wb_shape_str(&ck->inv.p[2].shape, sb, sizeof(sb)), "[]");
    CHECK_STR(wb_shape_str(&ck->inv.p[3].shape, sb, sizeof(sb)), "[0, 3]");
    CHECK_INT(wb_inv_find(&ck->inv, "s"), 2);
    wb_ckpt_close(ck);
    /* the directory holding it opens the same file, named relative to the directory */
    CHECK_INT(wb_ckpt_open(d, &ck, &el), 0);
    CHECK_STR(ck->files[0].name, "model.safetensors");
    CHECK_INT(ck->inv.n, 4);
    wb_ckpt_close(ck);
    wb_errlist_free(&el);
    free(d);
}

static void test_truncated(void)
{
    char *d = case_dir("trunc");
    put(d, "a.safetensors", "\x10\0\0\0\0", 5);
    EXPECT(d, -EBADMSG, "a.safetensors: truncated: 5 bytes, shorter than the 8-byte header length");
    free(d);
}

static void test_header_past_end(void)
{
    char *d = case_dir("past");
    st_len(d, "a.safetensors", "{}", 1000, 4);
    EXPECT(d, -EBADMSG,
           "a.safetensors: header length 1000 runs past the end of the file (14 bytes)");
    free(d);
}

/* A header length over the limit in a file large enough to hold it: refused before the header
 * is allocated or read (the file is sparse). */
static void test_header_over_limit(void)
{
    char *d = case_dir("limit");
    st_len(d, "a.safetensors", "{}", 150000000, 0);
    char path[1024];
    snprintf(path, sizeof(path), "%s/a.safetensors", d);
    CHECK_INT(truncate(path, 200000000), 0);
    EXPECT(d, -EBADMSG,
           "a.safetensors: header length 150000000 is over the limit of 100000000 bytes");
    free(d);
}

static void test_invalid_json(void)
{
    char *d = case_dir("json");
    st(d, "a.safetensors", "{\"a\": {\"dtype\": \"BF16\",", 0);
    st(d, "b.safetensors", "[1, 2]", 0);
    st(d, "c.safetensors",
       "{\"a\":{\"dtype\":\"BF16\",\"shape\":[1],\"data_offsets\":[0,2]},"
       "\"a\":{\"dtype\":\"BF16\",\"shape\":[1],\"data_offsets\":[2,4]}}",
       4);
    EXPECT(d, -EBADMSG,
           "a.safetensors: header is not valid JSON: string or '}' expected near end of file "
           "(line 1, column 23)",
           "b.safetensors: header is not a JSON object",
           "c.safetensors: header is not valid JSON: duplicate object key near '\"a\"' (line 1, "
           "column 58)");
    free(d);
}

/* 40,000 nested '[' in a header or an index: jansson stops at its depth bound (2048), an
 * exact error, not a deep recursion. */
static void test_deep_json(void)
{
    enum { DEPTH = 40000 };
    char *deep = malloc(2 * DEPTH + 64);
    CHECK(deep != NULL);
    int n = sprintf(deep, "{\"a\": ");
    memset(deep + n, '[', DEPTH);
    memset(deep + n + DEPTH, ']', DEPTH);
    strcpy(deep + n + 2 * DEPTH, "}");
    char *d = case_dir("deep");
    st(d, "a.safetensors", deep, 0);
    EXPECT(d, -EBADMSG,
           "a.safetensors: header is not valid JSON: maximum parsing depth reached near '[' "
           "(line 1, column 2054)");
    free(d);
    d = case_dir("deepix");
    put(d, WB_CKPT_INDEX, deep, strlen(deep));
    EXPECT(d, -EBADMSG,
           "model.safetensors.index.json: not valid JSON: maximum parsing depth reached near '[' "
           "(line 1, column 2054)");
    free(d);
    free(deep);
}

static void test_offsets(void)
{
    char *d = case_dir("offsets");
    st(d, "a.safetensors",
       "{\"a\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[4,0]},"
       "\"b\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[4,8]},"
       "\"c\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[8,12]}}",
       10);
    EXPECT(d, -EBADMSG, "a.safetensors: tensor \"a\": data_offsets [4, 0] end before they begin",
           "a.safetensors: tensor \"c\": data_offsets [8, 12] run past the data area (10 bytes)");
    free(d);
}

static void test_overlap(void)
{
    char *d = case_dir("overlap");
    st(d, "a.safetensors",
       "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
       "\"b\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[4,8]},"
       "\"c\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[12,16]},"
       "\"d\":{\"dtype\":\"BF16\",\"shape\":[0],\"data_offsets\":[6,6]},"
       "\"e\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[16,20]}}",
       20);
    EXPECT(d, -EBADMSG, "a.safetensors: tensors \"a\" [0, 16) and \"b\" [4, 8) overlap",
           "a.safetensors: tensors \"a\" [0, 16) and \"c\" [12, 16) overlap");
    free(d);
}

static void test_length_and_dtype(void)
{
    char *d = case_dir("length");
    st(d, "a.safetensors",
       "{\"a\":{\"dtype\":\"BF16\",\"shape\":[3],\"data_offsets\":[0,4]},"
       "\"b\":{\"dtype\":\"F64\",\"shape\":[1],\"data_offsets\":[4,12]},"
       "\"c\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1],\"data_offsets\":[12,16]},"
       "\"d\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[16,20]},"
       "\"e\":{\"dtype\":\"F32\",\"data_offsets\":[20,24]},"
       "\"f\":[1,2],"
       "\"g\":{\"dtype\":\"F32\",\"shape\":[1099511627776,1099511627776],\"data_offsets\":[0,0]},"
       "\"__metadata__\":{\"format\":1}}",
       24);
    EXPECT(d, -EBADMSG, "a.safetensors: tensor \"a\": 4 bytes for bf16 [3], which needs 6",
           "a.safetensors: tensor \"b\": unknown dtype \"F64\" (BF16, F16, F32, F8_E4M3, I32 or "
           "I64)",
           "a.safetensors: tensor \"c\": 7 dims, at most 6 are supported",
           "a.safetensors: tensor \"d\": expected {\"dtype\": string, \"shape\": [non-negative "
           "integers], \"data_offsets\": [begin, end]}",
           "a.safetensors: tensor \"e\": expected {\"dtype\": string, \"shape\": [non-negative "
           "integers], \"data_offsets\": [begin, end]}",
           "a.safetensors: tensor \"f\": expected {\"dtype\": string, \"shape\": [non-negative "
           "integers], \"data_offsets\": [begin, end]}",
           "a.safetensors: tensor \"g\": shape [1099511627776, 1099511627776] is over "
           "281474976710656 bytes",
           "a.safetensors: __metadata__ is not an object of strings");
    free(d);
}

static void test_duplicate_across_files(void)
{
    char *d = case_dir("dup");
    st(d, "a.safetensors", "{\"x\":{\"dtype\":\"BF16\",\"shape\":[1],\"data_offsets\":[0,2]}}", 2);
    st(d, "b.safetensors",
       "{\"y\":{\"dtype\":\"BF16\",\"shape\":[1],\"data_offsets\":[0,2]},"
       "\"x\":{\"dtype\":\"BF16\",\"shape\":[1],\"data_offsets\":[2,4]}}",
       4);
    put(d, "notes.txt", "x", 1);
    EXPECT(d, -EBADMSG, "b.safetensors: tensor \"x\" is also in a.safetensors");
    free(d);
}

static const char INDEX[] = "{\"metadata\": {\"total_size\": 8},\n"
                            " \"weight_map\": {\"a\": \"m-1.safetensors\", \"b\": "
                            "\"m-1.safetensors\", \"c\": \"m-2.safetensors\", \"d\": "
                            "\"m-3.safetensors\", \"e\": \"m-3.safetensors\"}}";

static void test_index(void)
{
    char *d = case_dir("index");
    put(d, WB_CKPT_INDEX, INDEX, strlen(INDEX));
    /* m-1 lacks b and holds x (not in the index) and c (the index puts it in m-2); m-3 is
     * missing; a stray file the index does not name is not read */
    st(d, "m-1.safetensors",
       "{\"a\":{\"dtype\":\"BF16\",\"shape\":[1],\"data_offsets\":[0,2]},"
       "\"x\":{\"dtype\":\"BF16\",\"shape\":[1],\"data_offsets\":[2,4]},"
       "\"c\":{\"dtype\":\"BF16\",\"shape\":[1],\"data_offsets\":[4,6]}}",
       6);
    st(d, "m-2.safetensors", "{\"c\":{\"dtype\":\"BF16\",\"shape\":[1],\"data_offsets\":[0,2]}}",
       2);
    put(d, "stray.safetensors", "junk", 4);
    EXPECT(
        d, -EBADMSG, "m-1.safetensors: tensor \"x\" is not in model.safetensors.index.json",
        "m-1.safetensors: tensor \"c\" is in this file, but model.safetensors.index.json puts "
        "it in m-2.safetensors",
        "model.safetensors.index.json: m-3.safetensors does not exist (the index puts 2 "
        "tensors there, \"d\" first)",
        "m-1.safetensors: no tensor \"b\", which model.safetensors.index.json puts in this file");
    free(d);
}

static void test_index_bad(void)
{
    char *d = case_dir("ixbad");
    const char *ix = "{\"weight_map\": {\"a\": \"../m.safetensors\", \"b\": 3, \"c\": \"/etc/x\"}}";
    put(d, WB_CKPT_INDEX, ix, strlen(ix));
    EXPECT(d, -EBADMSG,
           "model.safetensors.index.json: tensor \"a\": file name \"../m.safetensors\" is not a "
           "path inside the checkpoint",
           "model.safetensors.index.json: tensor \"b\": the file name is not a string",
           "model.safetensors.index.json: tensor \"c\": file name \"/etc/x\" is not a path inside "
           "the checkpoint");
    free(d);
    d = case_dir("ixbad2");
    put(d, WB_CKPT_INDEX, "{\"metadata\": {}}", 16);
    EXPECT(d, -EBADMSG, "model.safetensors.index.json: no \"weight_map\" object");
    free(d);
    d = case_dir("ixbad3");
    put(d, WB_CKPT_INDEX, "{\"weight_map\": {", 16);
    EXPECT(d, -EBADMSG,
           "model.safetensors.index.json: not valid JSON: string or '}' expected near end of file "
           "(line 1, column 16)");
    free(d);
}

/* Every file is checked: one run lists the problems of all of them. */
static void test_all_reported(void)
{
    char *d = case_dir("all");
    put(d, "a.safetensors", "abc", 3);
    st(d, "b.safetensors", "{\"x\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[0,2]}}", 2);
    st(d, "c.safetensors", "{\"y\":{\"dtype\":\"BF16\",\"shape\":[1],\"data_offsets\":[0,2]}}", 2);
    st(d, "d.safetensors", "{\"y\":{\"dtype\":\"BF16\",\"shape\":[1],\"data_offsets\":[0,2]}}", 2);
    EXPECT(d, -EBADMSG, "a.safetensors: truncated: 3 bytes, shorter than the 8-byte header length",
           "b.safetensors: tensor \"x\": 2 bytes for bf16 [2], which needs 4",
           "d.safetensors: tensor \"y\" is also in c.safetensors");
    free(d);
}

static void test_paths(void)
{
    char *d = case_dir("empty");
    char want[1200];
    snprintf(want, sizeof(want), "%s: no model.safetensors.index.json and no *.safetensors file",
             d);
    EXPECT(d, -EBADMSG, want);
    char missing[1100];
    snprintf(missing, sizeof(missing), "%s/none", d);
    snprintf(want, sizeof(want), "%s: No such file or directory", missing);
    EXPECT(missing, -ENOENT, want);
    free(d);
}

/* A name of WB_NAME_MAX bytes or more cannot be registered anywhere: refused here. */
static void test_long_name(void)
{
    char *d = case_dir("long");
    char hdr[1024], name[301];
    memset(name, 'n', 300);
    name[300] = 0;
    snprintf(hdr, sizeof(hdr), "{\"%s\":{\"dtype\":\"BF16\",\"shape\":[1],\"data_offsets\":[0,2]}}",
             name);
    st(d, "a.safetensors", hdr, 2);
    EXPECT(
        d, -EBADMSG,
        "a.safetensors: tensor name \"nnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnn...\" of 300 bytes "
        "(1 to 255 allowed)");
    free(d);
}

/* Only regular files are read: a FIFO (which would block open(2) until a writer came), a
 * directory or a device named by the index or found in the folder is refused, named, at once. */
static void test_not_regular(void)
{
    char *d = case_dir("fifo");
    const char *ix = "{\"weight_map\": {\"a\": \"m-1.safetensors\", \"b\": \"m-2.safetensors\", "
                     "\"c\": \"m-3.safetensors\"}}";
    put(d, WB_CKPT_INDEX, ix, strlen(ix));
    char path[1200];
    snprintf(path, sizeof(path), "%s/m-1.safetensors", d);
    CHECK_INT(mkfifo(path, 0644), 0);
    snprintf(path, sizeof(path), "%s/m-2.safetensors", d);
    CHECK_INT(mkdir(path, 0755), 0);
    snprintf(path, sizeof(path), "%s/m-3.safetensors", d);
    CHECK_INT(symlink("/dev/null", path), 0);
    EXPECT(d, -EBADMSG, "m-1.safetensors: a FIFO, not a regular file",
           "m-2.safetensors: a directory, not a regular file",
           "m-3.safetensors: a character device, not a regular file");
    free(d);
    /* the index itself, and a folder without one */
    d = case_dir("fifo-index");
    snprintf(path, sizeof(path), "%s/%s", d, WB_CKPT_INDEX);
    CHECK_INT(mkfifo(path, 0644), 0);
    EXPECT(d, -EBADMSG, "model.safetensors.index.json: a FIFO, not a regular file");
    free(d);
    d = case_dir("fifo-scan");
    snprintf(path, sizeof(path), "%s/x.safetensors", d);
    CHECK_INT(mkfifo(path, 0644), 0);
    EXPECT(d, -EBADMSG, "x.safetensors: a FIFO, not a regular file");
    free(d);
}

/* A file that leads outside the checkpoint folder (a symbolic link, or a link on its way) is
 * refused, named with where it leads, before a byte of it is read; links that stay inside are
 * followed, and so are a Hugging Face cache snapshot's links into its repository's blobs/. */
static void test_links_outside(void)
{
    char *out = case_dir("outside"), *d = case_dir("links");
    st(out, "m.safetensors", "{\"a\":{\"dtype\":\"BF16\",\"shape\":[1],\"data_offsets\":[0,2]}}",
       2);
    char *inner = case_dir("links/real");
    st(inner, "m-3.safetensors",
       "{\"c\":{\"dtype\":\"BF16\",\"shape\":[1],\"data_offsets\":[0,2]}}", 2);
    const char *ix = "{\"weight_map\": {\"a\": \"m-1.safetensors\", \"b\": \"sub/m.safetensors\", "
                     "\"c\": \"m-3.safetensors\"}}";
    put(d, WB_CKPT_INDEX, ix, strlen(ix));
    char path[1200], target[1200], want1[3000], want2[3000];
    snprintf(path, sizeof(path), "%s/m-1.safetensors", d);
    snprintf(target, sizeof(target), "%s/m.safetensors", out);
    CHECK_INT(symlink(target, path), 0);
    snprintf(path, sizeof(path), "%s/sub", d);
    CHECK_INT(symlink("../outside", path), 0); /* a folder on the way */
    snprintf(path, sizeof(path), "%s/m-3.safetensors", d);
    CHECK_INT(symlink("real/m-3.safetensors", path), 0); /* inside: fine */
    char *rd = realpath(d, NULL), *rt = realpath(target, NULL);
    CHECK(rd && rt);
    snprintf(want1, sizeof(want1), "m-1.safetensors: leads to %s, outside the checkpoint folder %s",
             rt, rd);
    snprintf(want2, sizeof(want2),
             "sub/m.safetensors: leads to %s, outside the checkpoint folder %s", rt, rd);
    EXPECT(d, -EBADMSG, want1, want2);
    /* the index itself */
    char *d2 = case_dir("links-index");
    snprintf(path, sizeof(path), "%s/%s", d2, WB_CKPT_INDEX);
    snprintf(target, sizeof(target), "%s/%s", d, WB_CKPT_INDEX);
    CHECK_INT(symlink(target, path), 0);
    char *rd2 = realpath(d2, NULL), *ri = realpath(target, NULL);
    snprintf(want1, sizeof(want1),
             "model.safetensors.index.json: leads to %s, outside the checkpoint folder %s", ri,
             rd2);
    EXPECT(d2, -EBADMSG, want1);
    /* a Hugging Face cache repository: snapshots/<rev>/ links into blobs/ */
    free(case_dir("hf"));
    char *blobs = case_dir("hf/blobs");
    free(case_dir("hf/snapshots"));
    char *rev = case_dir("hf/snapshots/0123abcd");
    st(blobs, "9f86d081", GOOD, 17);
    snprintf(path, sizeof(path), "%s/model.safetensors", rev);
    CHECK_INT(symlink("../../blobs/9f86d081", path), 0);
    struct wb_errlist el;
    wb_errlist_init(&el);
    struct wb_ckpt *ck = NULL;
    CHECK_INT(wb_ckpt_open(rev, &ck, &el), 0);
    CHECK_INT(ck->inv.n, 4);
    wb_ckpt_close(ck);
    /* ... but nothing else outside the snapshot */
    snprintf(path, sizeof(path), "%s/other.safetensors", rev);
    snprintf(target, sizeof(target), "%s/m.safetensors", out);
    CHECK_INT(symlink(target, path), 0);
    char *rr = realpath(rev, NULL);
    snprintf(want1, sizeof(want1),
             "other.safetensors: leads to %s, outside the checkpoint folder %s", rt, rr);
    EXPECT(rev, -EBADMSG, want1);
    wb_errlist_free(&el);
    free(rr);
    free(rev);
    free(blobs);
    free(rd2);
    free(ri);
    free(d2);
    free(rd);
    free(rt);
    free(inner);
    free(d);
    free(out);
}

/* Names and file names from the files are escaped in every message: a newline or a terminal
 * escape sequence in them cannot forge a line of output or reach the terminal. */
static void test_names_escaped(void)
{
    char *d = case_dir("esc");
    st(d, "a.safetensors",
       "{\"evil\\n  fake: line\\u001b[31m\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[0,"
       "2]}}",
       2);
    EXPECT(d, -EBADMSG,
           "a.safetensors: tensor \"evil\\n  fake: line\\x1b[31m\": 2 bytes for bf16 [2], which "
           "needs 4");
    free(d);
    d = case_dir("esc-index");
    const char *ix = "{\"weight_map\": {\"t\\r\": \"m\\n\\u001b]0;x\\u0007.safetensors\"}}";
    put(d, WB_CKPT_INDEX, ix, strlen(ix));
    EXPECT(d, -EBADMSG,
           "model.safetensors.index.json: m\\n\\x1b]0;x\\x07.safetensors does not exist (the index "
           "puts 1 tensor there, \"t\\r\" first)");
    free(d);
}

const struct wb_test wb_tests[] = {
    {"good_single_file", test_good_single_file, 0},
    {"truncated", test_truncated, 0},
    {"header_past_end", test_header_past_end, 0},
    {"header_over_limit", test_header_over_limit, 0},
    {"invalid_json", test_invalid_json, 0},
    {"deep_json", test_deep_json, 0},
    {"offsets", test_offsets, 0},
    {"overlap", test_overlap, 0},
    {"length_and_dtype", test_length_and_dtype, 0},
    {"duplicate_across_files", test_duplicate_across_files, 0},
    {"index", test_index, 0},
    {"index_bad", test_index_bad, 0},
    {"all_reported", test_all_reported, 0},
    {"paths", test_paths, 0},
    {"long_name", test_long_name, 0},
    {"not_regular", test_not_regular, 0},
    {"links_outside", test_links_outside, 0},
    {"names_escaped", test_names_escaped, 0},
    {0},
};
