/* open.c — wb_ckpt_open(): find a checkpoint's files, parse and check every safetensors header
 * and the index, and build the tensor list, before a byte of data is read.
 *
 * A safetensors file is an 8-byte little-endian header length N, N bytes of JSON
 * ({"name": {"dtype": "BF16", "shape": [..], "data_offsets": [begin, end]}, ...,
 * "__metadata__": {string: string}}), then the data area; offsets are relative to the data
 * area. Everything a file claims is bounded before anything is allocated for it (the header
 * length against the file and WB_CKPT_MAX_HEADER, the tensor count against
 * WB_CKPT_MAX_TENSORS, dims and bytes against WB_INV_MAX_BYTES), and every problem of every
 * file is reported, so one run lists everything that is wrong with a checkpoint.
 *
 * The files are other people's: only regular files are read (opened without blocking, so a FIFO
 * or a device named by the index cannot hang the open), none that leads outside the checkpoint
 * folder (a symbolic link to /etc/..., say), and what they say — tensor names, file names,
 * JSON errors quoting them — is escaped in every message (wb_esc_str), so a name cannot forge a
 * line of output or send a terminal escape sequence. */
#include "ckpt/ckpriv.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* One tensor of a file's header while the file is checked. */
struct ent {
    const char *name; /* key inside the header's JSON (alive while the file is parsed) */
    enum wb_dtype dtype;
    struct wb_shape shape;
    uint64_t begin, end; /* relative to the data area */
};

/* One tensor -> file entry of the index, sorted by name for lookups. */
struct ixent {
    const char *name; /* key inside the index JSON */
    uint32_t file;
    bool found;
};

struct opener {
    struct wb_ckpt *ck;
    struct wb_errlist *el;
    int err;
    size_t nerr; /* problems reported so far */
    /* the index, when there is one */
    const char *ixname;
    json_t *ix;
    struct ixent *ixe;
    size_t nixe;
    bool *parsed; /* per file: its header was read, so the index can be checked against it */
    /* a checkpoint folder: its real path, where every file must lie; for a snapshot of the
     * Hugging Face cache (<repo>/snapshots/<rev>, whose files link to <repo>/blobs/) also
     * <repo>/blobs. NULL for a checkpoint named as one file. */
    char *root, *blobs;
};

static void fail(struct opener *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void fail(struct opener *o, const char *fmt, ...)
{
    va_list ap;
    char *msg = NULL, *esc = NULL;
    va_start(ap, fmt);
    int n = vasprintf(&msg, fmt, ap);
    va_end(ap);
    /* names and paths from the files, and JSON errors quoting them: escaped, the whole line */
    if (n >= 0 && (esc = malloc(4 * (size_t)n + 1)) != NULL)
        wb_errlist_add(o->el, "%s", wb_esc_str(msg, esc, 4 * (size_t)n + 1));
    free(msg);
    free(esc);
    o->nerr++;
    if (!o->err)
        o->err = -EBADMSG;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static int cmp_ixent(const void *a, const void *b)
{
    return strcmp(((const struct ixent *)a)->name, ((const struct ixent *)b)->name);
}

static int cmp_ent(const void *a, const void *b)
{
    const struct ent *x = a, *y = b;
    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    return x->end < y->end ? -1 : x->end > y->end;
}

static char *join(const char *dir, const char *name)
{
    char *s;
    if (asprintf(&s, "%s/%s", dir, name) < 0)
        return NULL;
    return s;
}

static int add_file(struct opener *o, const char *dir, const char *name)
{
    struct wb_ckpt *ck = o->ck;
    if (ck->nfiles >= WB_CKPT_MAX_FILES) {
        fail(o, "%s: more than %u files", ck->path, WB_CKPT_MAX_FILES);
        return o->err;
    }
    struct wb_ckpt_file *f = realloc(ck->files, (ck->nfiles + 1) * sizeof(*f));
    if (!f)
        return -ENOMEM;
    ck->files = f;
    f = &ck->files[ck->nfiles];
    memset(f, 0, sizeof(*f));
    f->fd = -1;
    f->name = strdup(name);
    f->path = dir ? join(dir, name) : strdup(name);
    ck->nfiles++;
    return f->name && f->path ? 0 : -ENOMEM;
}

/* ---------------------------------------------------------------- one file's header */

static bool get_u64(const json_t *v, uint64_t *out)
{
    if (!json_is_integer(v) || json_integer_value(v) < 0)
        return false;
    *out = (uint64_t)json_integer_value(v);
    return true;
}

/* Parses one tensor entry into e; false (with the message added) when it is unusable. */
static bool parse_ent(struct opener *o, const struct wb_ckpt_file *f, uint64_t data_len,
                      const char *name, const json_t *v, struct ent *e)
{
    memset(e, 0, sizeof(*e));
    e->name = name;
    size_t len = strlen(name);
    if (len == 0 || len >= WB_NAME_MAX) {
        fail(o, "%s: tensor name \"%.40s%s\" of %zu bytes (1 to %d allowed)", f->name, name,
             len > 40 ? "..." : "", len, WB_NAME_MAX - 1);
        return false;
    }
    const json_t *dt = json_object_get(v, "dtype"), *sh = json_object_get(v, "shape"),
                 *off = json_object_get(v, "data_offsets");
    bool ok = json_is_object(v) && json_is_string(dt) && json_is_array(sh) && json_is_array(off) &&
              json_array_size(off) == 2 && get_u64(json_array_get(off, 0), &e->begin) &&
              get_u64(json_array_get(off, 1), &e->end);
    for (size_t d = 0; ok && d < json_array_size(sh) && d < WB_MAX_DIMS; d++)
        ok = get_u64(json_array_get(sh, d), &e->shape.dim[d]);
    if (!ok) {
        fail(o,
             "%s: tensor \"%s\": expected {\"dtype\": string, \"shape\": [non-negative integers], "
             "\"data_offsets\": [begin, end]}",
             f->name, name);
        return false;
    }
    if (json_array_size(sh) > WB_MAX_DIMS) {
        fail(o, "%s: tensor \"%s\": %zu dims, at most %d are supported", f->name, name,
             json_array_size(sh), WB_MAX_DIMS);
        return false;
    }
    e->shape.ndim = (uint32_t)json_array_size(sh);
    if (wb_dtype_parse(json_string_value(dt), &e->dtype) != 0) {
        fail(o, "%s: tensor \"%s\": unknown dtype \"%.32s\" (BF16, F16, F32, F8_E4M3, I32 or I64)",
             f->name, name, json_string_value(dt));
        return false;
    }
    uint64_t need = wb_dtype_size(e->dtype);
    bool big = false;
    for (uint32_t d = 0; d < e->shape.ndim; d++)
        big |= e->shape.dim[d] > WB_INV_MAX_BYTES ||
               __builtin_mul_overflow(need, e->shape.dim[d], &need);
    char sbuf[128];
    wb_shape_str(&e->shape, sbuf, sizeof(sbuf));
    if (big || need > WB_INV_MAX_BYTES) {
        fail(o, "%s: tensor \"%s\": shape %s is over %llu bytes", f->name, name, sbuf,
             (unsigned long long)WB_INV_MAX_BYTES);
        return false;
    }
    if (e->end < e->begin) {
        fail(o, "%s: tensor \"%s\": data_offsets [%llu, %llu] end before they begin", f->name, name,
             (unsigned long long)e->begin, (unsigned long long)e->end);
        return false;
    }
    if (e->end > data_len) {
        fail(o, "%s: tensor \"%s\": data_offsets [%llu, %llu] run past the data area (%llu bytes)",
             f->name, name, (unsigned long long)e->begin, (unsigned long long)e->end,
             (unsigned long long)data_len);
        return false;
    }
    if (e->end - e->begin != need) {
        fail(o, "%s: tensor \"%s\": %llu bytes for %s %s, which needs %llu", f->name, name,
             (unsigned long long)(e->end - e->begin), wb_dtype_name(e->dtype), sbuf,
             (unsigned long long)need);
        return false;
    }
    return true;
}

static struct ixent *ix_find(struct opener *o, const char *name)
{
    struct ixent key = {.name = name};
    return o->nixe ? bsearch(&key, o->ixe, o->nixe, sizeof(key), cmp_ixent) : NULL;
}

/* The index's view of one tensor of file fi. */
static void ix_check(struct opener *o, uint32_t fi, const char *name)
{
    struct ixent *x = ix_find(o, name);
    const char *fname = o->ck->files[fi].name;
    if (!x)
        fail(o, "%s: tensor \"%s\" is not in %s", fname, name, o->ixname);
    else if (x->file != fi)
        fail(o, "%s: tensor \"%s\" is in this file, but %s puts it in %s", fname, name, o->ixname,
             o->ck->files[x->file].name);
    else
        x->found = true;
}

/* Appends the file's checked tensors to the checkpoint. */
static int add_tensors(struct opener *o, uint32_t fi, struct ent *e, size_t n)
{
    struct wb_ckpt *ck = o->ck;
    struct wb_ckpt_file *f = &ck->files[fi];
    struct wb_ckpt_loc *loc = realloc(ck->loc, (ck->inv.n + n + 1) * sizeof(*loc));
    if (!loc)
        return -ENOMEM;
    ck->loc = loc;
    for (size_t i = 0; i < n; i++) {
        int r = wb_inv_add(&ck->inv, e[i].name, e[i].dtype, &e[i].shape);
        if (r == -EEXIST) {
            ssize_t k = wb_inv_find(&ck->inv, e[i].name);
            fail(o, "%s: tensor \"%s\" is also in %s", f->name, e[i].name,
                 ck->files[ck->loc[k].file].name);
            continue;
        }
        if (r)
            return r;
        ck->loc[ck->inv.n - 1] =
            (struct wb_ckpt_loc){fi, f->data + e[i].begin, e[i].end - e[i].begin};
        ck->bytes += e[i].end - e[i].begin;
        f->ntensors++;
    }
    return 0;
}

int ck_read_full(int fd, void *buf, size_t len, uint64_t off)
{
    size_t got = 0;
    while (got < len) {
        ssize_t r = pread(fd, (char *)buf + got, len - got, (off_t)(off + got));
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return -errno;
        if (r == 0)
            return -EIO;
        got += (size_t)r;
    }
    return 0;
}

static const char *file_kind(mode_t m)
{
    return S_ISDIR(m)    ? "a directory"
           : S_ISFIFO(m) ? "a FIFO"
           : S_ISSOCK(m) ? "a socket"
           : S_ISCHR(m)  ? "a character device"
           : S_ISBLK(m)  ? "a block device"
                         : "not a regular file";
}

/* Whether path (a real path) is dir or lies under it. */
static bool under(const char *path, const char *dir)
{
    size_t n = strlen(dir);
    if (n == 1 && dir[0] == '/')
        return true;
    return strncmp(path, dir, n) == 0 && (path[n] == '/' || path[n] == 0);
}

/* Where the open descriptor fd really is (what it was opened through, links followed): the
 * kernel's name for it, or else the path resolved again. malloc'd; NULL when neither works. */
static char *real_path_of(int fd, const char *path)
{
    char link[64], buf[PATH_MAX];
    snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, buf, sizeof(buf) - 1);
    if (n > 0 && buf[0] == '/') {
        buf[n] = 0;
        return strdup(buf);
    }
    return realpath(path, NULL);
}

/* Opens a file of the checkpoint for reading: O_NONBLOCK, so that opening a FIFO or a device
 * cannot block, then only a regular file inside the checkpoint folder is kept (blocking again).
 * Returns the descriptor with *st filled, -ENOENT (not reported), -ENOMEM, or -1 with the
 * problem reported under `name`. */
static int open_checked(struct opener *o, const char *path, const char *name, struct stat *st)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0) {
        int e = errno;
        if (e == ENOENT)
            return -ENOENT;
        fail(o, "%s: cannot open: %s", name, strerror(e));
        return -1;
    }
    if (fstat(fd, st) != 0) {
        fail(o, "%s: cannot stat: %s", name, strerror(errno));
        close(fd);
        return -1;
    }
    if (!S_ISREG(st->st_mode)) {
        fail(o, "%s: %s, not a regular file", name, file_kind(st->st_mode));
        close(fd);
        return -1;
    }
    if (o->root) {
        char *real = real_path_of(fd, path);
        if (!real) {
            int e = errno;
            close(fd);
            if (e == ENOMEM)
                return -ENOMEM;
            fail(o, "%s: cannot resolve its path: %s", name, strerror(e));
            return -1;
        }
        bool inside = under(real, o->root) || (o->blobs && under(real, o->blobs));
        if (!inside)
            fail(o, "%s: leads to %s, outside the checkpoint folder %s", name, real, o->root);
        free(real);
        if (!inside) {
            close(fd);
            return -1;
        }
    }
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) != 0) {
        fail(o, "%s: fcntl: %s", name, strerror(errno));
        close(fd);
        return -1;
    }
    return fd;
}

/* Opens and checks file fi. Problems go to the list; the return is only for fatal errors
 * (out of memory). */
static int open_file(struct opener *o, uint32_t fi)
{
    struct wb_ckpt *ck = o->ck;
    struct wb_ckpt_file *f = &ck->files[fi];
    struct stat st;
    int fd = open_checked(o, f->path, f->name, &st);
    if (fd == -ENOENT && o->ix)
        return 0; /* reported once per file by the index check */
    if (fd == -ENOENT)
        fail(o, "%s: cannot open: %s", f->name, strerror(ENOENT));
    if (fd == -ENOMEM)
        return -ENOMEM;
    if (fd < 0)
        return 0;
    f->size = (uint64_t)st.st_size;
    uint8_t lenb[8];
    if (f->size < 8) {
        fail(o, "%s: truncated: %llu bytes, shorter than the 8-byte header length", f->name,
             (unsigned long long)f->size);
        close(fd);
        return 0;
    }
    int r = ck_read_full(fd, lenb, 8, 0);
    if (r) {
        fail(o, "%s: cannot read: %s", f->name, wb_strerror(r));
        close(fd);
        return 0;
    }
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--)
        hlen = hlen << 8 | lenb[i];
    if (hlen > f->size - 8) {
        fail(o, "%s: header length %llu runs past the end of the file (%llu bytes)", f->name,
             (unsigned long long)hlen, (unsigned long long)f->size);
        close(fd);
        return 0;
    }
    if (hlen > WB_CKPT_MAX_HEADER) {
        fail(o, "%s: header length %llu is over the limit of %llu bytes", f->name,
             (unsigned long long)hlen, (unsigned long long)WB_CKPT_MAX_HEADER);
        close(fd);
        return 0;
    }
    f->data = 8 + hlen;
    uint64_t data_len = f->size - f->data;
    char *hdr = malloc(hlen + 1);
    if (!hdr) {
        close(fd);
        return -ENOMEM;
    }
    if ((r = ck_read_full(fd, hdr, hlen, 8))) {
        fail(o, "%s: cannot read the header: %s", f->name, wb_strerror(r));
        free(hdr);
        close(fd);
        return 0;
    }
    json_error_t je;
    json_t *root = json_loadb(hdr, hlen, JSON_REJECT_DUPLICATES, &je);
    free(hdr);
    if (!root) {
        fail(o, "%s: header is not valid JSON: %s (line %d, column %d)", f->name, je.text, je.line,
             je.column);
        close(fd);
        return 0;
    }
    if (!json_is_object(root)) {
        fail(o, "%s: header is not a JSON object", f->name);
        json_decref(root);
        close(fd);
        return 0;
    }
    size_t count = json_object_size(root) - (json_object_get(root, "__metadata__") != NULL);
    if (count > WB_CKPT_MAX_TENSORS || ck->inv.n + count > WB_CKPT_MAX_TENSORS) {
        fail(o, "%s: %zu tensors, over the limit of %u in a checkpoint", f->name, count,
             WB_CKPT_MAX_TENSORS);
        json_decref(root);
        close(fd);
        return 0;
    }
    struct ent *e = calloc(count + 1, sizeof(*e));
    if (!e) {
        json_decref(root);
        close(fd);
        return -ENOMEM;
    }
    if (o->parsed)
        o->parsed[fi] = true;
    size_t n = 0;
    size_t before = o->nerr;
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v)
    {
        if (strcmp(key, "__metadata__") == 0) {
            bool ok = json_is_object(v);
            const char *mk;
            json_t *mv;
            if (ok)
                json_object_foreach(v, mk, mv) ok &= json_is_string(mv);
            if (!ok)
                fail(o, "%s: __metadata__ is not an object of strings", f->name);
            continue;
        }
        if (o->ix)
            ix_check(o, fi, key);
        if (parse_ent(o, f, data_len, key, v, &e[n]))
            n++;
    }
    /* overlaps: sorted by begin, each nonempty tensor must start at or after the furthest end
     * seen so far (the tensor that reached it is named) */
    qsort(e, n, sizeof(*e), cmp_ent);
    size_t far = SIZE_MAX;
    for (size_t i = 0; i < n; i++) {
        if (e[i].end == e[i].begin)
            continue;
        if (far != SIZE_MAX && e[i].begin < e[far].end)
            fail(o, "%s: tensors \"%s\" [%llu, %llu) and \"%s\" [%llu, %llu) overlap", f->name,
                 e[far].name, (unsigned long long)e[far].begin, (unsigned long long)e[far].end,
                 e[i].name, (unsigned long long)e[i].begin, (unsigned long long)e[i].end);
        if (far == SIZE_MAX || e[i].end > e[far].end)
            far = i;
    }
    r = 0;
    if (o->nerr == before)
        r = add_tensors(o, fi, e, n);
    free(e);
    json_decref(root);
    if (r || o->nerr != before) {
        close(fd);
        return r;
    }
    f->fd = fd;
    return 0;
}

/* ---------------------------------------------------------------- finding the files */

static bool safe_name(const char *s)
{
    if (!*s || *s == '/')
        return false;
    for (const char *p = s; *p;) {
        size_t n = strcspn(p, "/");
        if (n == 0 || (n == 2 && p[0] == '.' && p[1] == '.') || (n == 1 && p[0] == '.'))
            return false;
        p += n;
        if (*p)
            p++;
    }
    return true;
}

/* Reads the index: the set of files (sorted) and the tensor -> file entries. */
static int load_index(struct opener *o, const char *dir, const char *ixpath)
{
    struct stat st;
    int fd = open_checked(o, ixpath, o->ixname, &st);
    if (fd == -ENOMEM)
        return -ENOMEM;
    if (fd == -ENOENT)
        fail(o, "%s: cannot open: %s", o->ixname, strerror(ENOENT));
    if (fd < 0)
        return o->err;
    if ((uint64_t)st.st_size > WB_CKPT_MAX_INDEX) {
        fail(o, "%s: %llu bytes, over the limit of %llu", o->ixname, (unsigned long long)st.st_size,
             (unsigned long long)WB_CKPT_MAX_INDEX);
        close(fd);
        return o->err;
    }
    char *buf = malloc((size_t)st.st_size + 1);
    int r = buf ? ck_read_full(fd, buf, (size_t)st.st_size, 0) : -ENOMEM;
    close(fd);
    if (r) {
        free(buf);
        if (r == -ENOMEM)
            return r;
        fail(o, "%s: cannot read: %s", o->ixname, wb_strerror(r));
        return o->err;
    }
    json_error_t je;
    o->ix = json_loadb(buf, (size_t)st.st_size, JSON_REJECT_DUPLICATES, &je);
    free(buf);
    if (!o->ix) {
        fail(o, "%s: not valid JSON: %s (line %d, column %d)", o->ixname, je.text, je.line,
             je.column);
        return o->err;
    }
    json_t *wm = json_object_get(o->ix, "weight_map");
    if (!json_is_object(wm)) {
        fail(o, "%s: no \"weight_map\" object", o->ixname);
        return o->err;
    }
    size_t n = json_object_size(wm);
    if (n > WB_CKPT_MAX_TENSORS) {
        fail(o, "%s: %zu tensors, over the limit of %u", o->ixname, n, WB_CKPT_MAX_TENSORS);
        return o->err;
    }
    o->ixe = calloc(n + 1, sizeof(*o->ixe));
    const char **names = calloc(n + 1, sizeof(*names));
    if (!o->ixe || !names) {
        free(names);
        return -ENOMEM;
    }
    size_t nn = 0;
    const char *key;
    json_t *v;
    json_object_foreach(wm, key, v)
    {
        const char *file = json_string_value(v);
        if (!file) {
            fail(o, "%s: tensor \"%s\": the file name is not a string", o->ixname, key);
            continue;
        }
        if (!safe_name(file)) {
            fail(o, "%s: tensor \"%s\": file name \"%s\" is not a path inside the checkpoint",
                 o->ixname, key, file);
            continue;
        }
        o->ixe[o->nixe++] = (struct ixent){key, 0, false};
        names[nn++] = file;
    }
    if (o->err) {
        free(names);
        return o->err;
    }
    /* files: the distinct names, sorted */
    const char **sorted = malloc((nn + 1) * sizeof(*sorted));
    if (!sorted) {
        free(names);
        return -ENOMEM;
    }
    memcpy(sorted, names, nn * sizeof(*sorted));
    qsort(sorted, nn, sizeof(*sorted), cmp_str);
    for (size_t i = 0; i < nn && !r; i++)
        if (i == 0 || strcmp(sorted[i], sorted[i - 1]) != 0)
            r = add_file(o, dir, sorted[i]);
    for (size_t i = 0; i < o->nixe && !r; i++) {
        const char *fname = names[i];
        size_t lo = 0, hi = o->ck->nfiles;
        while (lo + 1 < hi) {
            size_t mid = (lo + hi) / 2;
            if (strcmp(o->ck->files[mid].name, fname) <= 0)
                lo = mid;
            else
                hi = mid;
        }
        o->ixe[i].file = (uint32_t)lo;
    }
    free(sorted);
    free(names);
    if (r)
        return r;
    qsort(o->ixe, o->nixe, sizeof(*o->ixe), cmp_ixent);
    if (o->ck->nfiles == 0)
        fail(o, "%s: the weight_map names no tensor", o->ixname);
    return o->err;
}

/* Every *.safetensors file of a directory without an index, sorted. */
static int scan_dir(struct opener *o, const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) {
        fail(o, "%s: cannot open: %s", dir, strerror(errno));
        return o->err;
    }
    char **names = NULL;
    size_t n = 0, cap = 0;
    int r = 0;
    struct dirent *de;
    while (!r && (de = readdir(d))) {
        size_t len = strlen(de->d_name);
        if (len <= 12 || strcmp(de->d_name + len - 12, ".safetensors") != 0 || de->d_name[0] == '.')
            continue;
        if (n >= WB_CKPT_MAX_FILES) {
            fail(o, "%s: more than %u files", dir, WB_CKPT_MAX_FILES);
            r = o->err;
            break;
        }
        if (n == cap && (r = wb_grow(&names, &cap, 16, sizeof(*names))))
            break;
        if (!(names[n] = strdup(de->d_name)))
            r = -ENOMEM;
        else
            n++;
    }
    closedir(d);
    if (!r && n == 0) {
        fail(o, "%s: no %s and no *.safetensors file", dir, WB_CKPT_INDEX);
        r = o->err;
    }
    if (n)
        qsort(names, n, sizeof(*names), cmp_str);
    for (size_t i = 0; i < n && !r; i++)
        r = add_file(o, dir, names[i]);
    for (size_t i = 0; i < n; i++)
        free(names[i]);
    free(names);
    return r;
}

/* The folder every file of a checkpoint folder must lie in: its real path, and for a snapshot of
 * the Hugging Face cache (<repo>/snapshots/<rev>/, whose files are links to <repo>/blobs/) that
 * blobs folder too. */
static int set_root(struct opener *o, const char *dir)
{
    if (!(o->root = realpath(dir, NULL))) {
        int e = errno;
        if (e == ENOMEM)
            return -ENOMEM;
        wb_errlist_add(o->el, "%s: %s", wb_esc(dir).s, strerror(e));
        return -e;
    }
    char *slash = strrchr(o->root, '/');
    if (!slash || slash == o->root)
        return 0;
    size_t plen = (size_t)(slash - o->root); /* <repo>/snapshots */
    if (plen < 10 || strncmp(o->root + plen - 10, "/snapshots", 10) != 0)
        return 0;
    char *blobs;
    if (asprintf(&blobs, "%.*s/blobs", (int)(plen - 10), o->root) < 0)
        return -ENOMEM;
    struct stat st;
    if (stat(blobs, &st) == 0 && S_ISDIR(st.st_mode))
        o->blobs = realpath(blobs, NULL);
    free(blobs);
    return 0;
}

void wb_ckpt_close(struct wb_ckpt *ck)
{
    if (!ck)
        return;
    for (size_t i = 0; i < ck->nfiles; i++) {
        if (ck->files[i].fd >= 0)
            close(ck->files[i].fd);
        free(ck->files[i].name);
        free(ck->files[i].path);
    }
    free(ck->files);
    free(ck->loc);
    wb_inv_free(&ck->inv);
    free(ck->path);
    free(ck);
}

int wb_ckpt_open(const char *path, struct wb_ckpt **out, struct wb_errlist *el)
{
    struct wb_ckpt *ck = calloc(1, sizeof(*ck));
    if (!ck || !(ck->path = strdup(path))) {
        free(ck);
        return -ENOMEM;
    }
    wb_inv_init(&ck->inv);
    struct opener o = {.ck = ck, .el = el};
    int r = 0;
    struct stat st;
    if (stat(path, &st) != 0) {
        r = -errno;
        wb_errlist_add(el, "%s: %s", wb_esc(path).s, strerror(errno));
        wb_ckpt_close(ck);
        return r;
    }
    char *ixpath = NULL;
    if (S_ISDIR(st.st_mode)) {
        if ((r = set_root(&o, path)) != 0 || !(ixpath = join(path, WB_CKPT_INDEX))) {
            free(o.root);
            free(o.blobs);
            wb_ckpt_close(ck);
            return r ? r : -ENOMEM;
        }
        if (access(ixpath, F_OK) == 0) {
            o.ixname = WB_CKPT_INDEX;
            r = load_index(&o, path, ixpath);
        } else {
            r = scan_dir(&o, path);
        }
    } else {
        r = add_file(&o, NULL, path);
    }
    free(ixpath);
    if (!r && o.ix && !(o.parsed = calloc(ck->nfiles + 1, sizeof(bool))))
        r = -ENOMEM;
    for (size_t i = 0; !r && i < ck->nfiles; i++)
        r = open_file(&o, (uint32_t)i);
    if (!r && o.ix) {
        /* a file the index names that is not there: once per file */
        for (size_t fi = 0; fi < ck->nfiles; fi++) {
            if (o.parsed[fi] || access(ck->files[fi].path, F_OK) == 0)
                continue;
            size_t cnt = 0;
            const char *first = NULL;
            for (size_t i = 0; i < o.nixe; i++)
                if (o.ixe[i].file == fi && !cnt++)
                    first = o.ixe[i].name;
            fail(&o, "%s: %s does not exist (the index puts %zu tensor%s there, \"%s\" first)",
                 WB_CKPT_INDEX, ck->files[fi].name, cnt, cnt == 1 ? "" : "s", first);
        }
        /* a tensor the index puts in a file that does not have it */
        for (size_t fi = 0; fi < ck->nfiles; fi++)
            for (size_t i = 0; o.parsed[fi] && i < o.nixe; i++)
                if (o.ixe[i].file == fi && !o.ixe[i].found)
                    fail(&o, "%s: no tensor \"%s\", which %s puts in this file", ck->files[fi].name,
                         o.ixe[i].name, WB_CKPT_INDEX);
    }
    r = r ? r : o.err;
    free(o.root);
    free(o.blobs);
    free(o.parsed);
    free(o.ixe);
    json_decref(o.ix);
    if (r) {
        wb_ckpt_close(ck);
        return r;
    }
    *out = ck;
    return 0;
}
