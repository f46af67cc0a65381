/* inventory.c — parameter inventories: a list of (name, dtype, global shape) with a hash index
 * on the name, filled by run-time registration (wb_inv_add), by an inventory file, or by the
 * generator (generate.c). The index is open addressing over FNV-1a hashes, rebuilt on growth,
 * so a 70k-tensor Kimi-K2 inventory costs one probe or two per lookup. */
#include "matcher/mpriv.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct wb_inv_index {
    uint32_t *slot; /* parameter index + 1; 0 = empty */
    uint64_t *hash; /* per parameter, so a rebuild does not rehash names */
    size_t cap;     /* power of two */
};

static uint64_t fnv1a(const char *s)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
    return h;
}

void wb_inv_init(struct wb_inventory *inv)
{
    memset(inv, 0, sizeof(*inv));
}

void wb_inv_free(struct wb_inventory *inv)
{
    if (inv->index) {
        free(inv->index->slot);
        free(inv->index->hash);
        free(inv->index);
    }
    free(inv->p);
    memset(inv, 0, sizeof(*inv));
}

static ssize_t find_hashed(const struct wb_inventory *inv, const char *name, uint64_t h)
{
    const struct wb_inv_index *x = inv->index;
    if (!x || !x->cap)
        return -1;
    for (size_t i = h & (x->cap - 1);; i = (i + 1) & (x->cap - 1)) {
        uint32_t s = x->slot[i];
        if (!s)
            return -1;
        if (x->hash[s - 1] == h && strcmp(inv->p[s - 1].name, name) == 0)
            return (ssize_t)(s - 1);
    }
}

ssize_t wb_inv_find(const struct wb_inventory *inv, const char *name)
{
    return find_hashed(inv, name, fnv1a(name));
}

/* Makes room for one more parameter: the array and the hash table (kept at most half full). */
static int grow(struct wb_inventory *inv)
{
    if (!inv->index && !(inv->index = calloc(1, sizeof(*inv->index))))
        return -ENOMEM;
    struct wb_inv_index *x = inv->index;
    if (inv->n == inv->cap) {
        size_t cap = inv->cap ? inv->cap * 2 : 64;
        struct wb_param *p = realloc(inv->p, cap * sizeof(*p));
        if (!p)
            return -ENOMEM;
        inv->p = p;
        uint64_t *h = realloc(x->hash, cap * sizeof(*h));
        if (!h)
            return -ENOMEM;
        x->hash = h;
        inv->cap = cap;
    }
    if ((inv->n + 1) * 2 > x->cap) {
        size_t cap = x->cap ? x->cap * 2 : 128;
        uint32_t *slot = calloc(cap, sizeof(*slot));
        if (!slot)
            return -ENOMEM;
        for (size_t k = 0; k < inv->n; k++) {
            size_t i = x->hash[k] & (cap - 1);
            while (slot[i])
                i = (i + 1) & (cap - 1);
            slot[i] = (uint32_t)(k + 1);
        }
        free(x->slot);
        x->slot = slot;
        x->cap = cap;
    }
    return 0;
}

int wb_inv_add(struct wb_inventory *inv, const char *name, enum wb_dtype dt,
               const struct wb_shape *shape)
{
    size_t len = strlen(name);
    if (!len || len >= WB_NAME_MAX || wb_dtype_size(dt) == 0 || shape->ndim > WB_MAX_DIMS ||
        inv->n >= UINT32_MAX - 1)
        return -EINVAL;
    /* every later product of dims, offsets and element sizes stays far from 2^64 */
    uint64_t bytes = wb_dtype_size(dt);
    for (uint32_t d = 0; d < shape->ndim; d++)
        if (shape->dim[d] > WB_INV_MAX_BYTES ||
            (shape->dim[d] && __builtin_mul_overflow(bytes, shape->dim[d], &bytes)))
            return -EOVERFLOW;
    if (bytes > WB_INV_MAX_BYTES)
        return -EOVERFLOW;
    uint64_t h = fnv1a(name);
    if (find_hashed(inv, name, h) >= 0)
        return -EEXIST;
    int r = grow(inv);
    if (r)
        return r;
    struct wb_param *p = &inv->p[inv->n];
    memcpy(p->name, name, len + 1);
    p->dtype = dt;
    p->shape = *shape;
    struct wb_inv_index *x = inv->index;
    x->hash[inv->n] = h;
    size_t i = h & (x->cap - 1);
    while (x->slot[i])
        i = (i + 1) & (x->cap - 1);
    x->slot[i] = (uint32_t)(inv->n + 1);
    inv->n++;
    return 0;
}

/* ---------------------------------------------------------------- inventory files */

static void where(const struct wb_yaml *y, const struct wb_ynode *n, char *buf, size_t cap)
{
    wb_yaml_where(y, n, buf, cap);
}

/* Parses [a, b, ...] into a shape. */
static int parse_dims(const struct wb_yaml *y, const struct wb_ynode *n, const char *name,
                      struct wb_shape *s, struct wb_errlist *el)
{
    char at[512];
    where(y, n, at, sizeof(at));
    if (wb_ynode_kind(n) != WB_YNODE_SEQ) {
        wb_errlist_add(el, "%s: %s: shape must be a list of sizes such as [4096, 128]", at, name);
        return -WB_E_CONFIG;
    }
    size_t nd = wb_ynode_len(n);
    if (nd > WB_MAX_DIMS) {
        wb_errlist_add(el, "%s: %s: %zu dimensions, at most %d supported", at, name, nd,
                       WB_MAX_DIMS);
        return -WB_E_CONFIG;
    }
    s->ndim = (uint32_t)nd;
    for (size_t i = 0; i < nd; i++) {
        const struct wb_ynode *d = wb_ynode_item(y, n, i);
        const char *txt = wb_ynode_scalar(d);
        if (!txt || wb_parse_u64(txt, &s->dim[i])) {
            where(y, d, at, sizeof(at));
            wb_errlist_add(el, "%s: %s: dimension %zu must be a non-negative integer, got '%s'", at,
                           name, i, txt ? txt : "a collection");
            return -WB_E_CONFIG;
        }
    }
    return 0;
}

static int parse_entry(const struct wb_yaml *y, const struct wb_ynode *v, const char *name,
                       enum wb_dtype *dt, struct wb_shape *s, struct wb_errlist *el)
{
    char at[512];
    const struct wb_ynode *dnode = NULL, *snode = NULL;
    where(y, v, at, sizeof(at));
    if (wb_ynode_kind(v) == WB_YNODE_SEQ && wb_ynode_len(v) == 2) {
        dnode = wb_ynode_item(y, v, 0);
        snode = wb_ynode_item(y, v, 1);
    } else if (wb_ynode_kind(v) == WB_YNODE_MAP) {
        for (size_t i = 0; i < wb_ynode_len(v); i++) {
            const struct wb_ynode *k, *val;
            wb_ynode_pair(y, v, i, &k, &val);
            const char *key = wb_ynode_scalar(k);
            if (key && strcmp(key, "dtype") == 0)
                dnode = val;
            else if (key && strcmp(key, "shape") == 0)
                snode = val;
            else {
                where(y, k, at, sizeof(at));
                wb_errlist_add(el, "%s: %s: unknown key '%s' (expected dtype, shape)", at, name,
                               key ? key : "?");
                return -WB_E_CONFIG;
            }
        }
        if (!dnode || !snode) {
            wb_errlist_add(el, "%s: %s: needs both dtype and shape", at, name);
            return -WB_E_CONFIG;
        }
    } else {
        wb_errlist_add(el, "%s: %s: expected {dtype: bf16, shape: [a, b]} or [bf16, [a, b]]", at,
                       name);
        return -WB_E_CONFIG;
    }
    const char *dts = wb_ynode_scalar(dnode);
    if (!dts || wb_dtype_parse(dts, dt)) {
        where(y, dnode, at, sizeof(at));
        wb_errlist_add(el, "%s: %s: unknown dtype '%s'", at, name, dts ? dts : "?");
        return -WB_E_CONFIG;
    }
    return parse_dims(y, snode, name, s, el);
}

static int load_file(const char *path, struct wb_inventory *inv, struct wb_errlist *el);

int wb_inv_load_file(const char *path, struct wb_inventory *inv, struct wb_errlist *el)
{
    size_t before = el->n;
    int r = load_file(path, inv, el);
    if (r == -ENOMEM && el->n == before)
        wb_errlist_add(el, "%s: out of memory loading the inventory", path);
    return r;
}

static int load_file(const char *path, struct wb_inventory *inv, struct wb_errlist *el)
{
    struct wb_yaml *y;
    int r = wb_yaml_load(path, el, &y);
    if (r)
        return r;
    struct wb_inventory tmp;
    wb_inv_init(&tmp);
    uint32_t *lines = NULL;
    const struct wb_ynode *root = wb_yaml_root(y);
    size_t n = wb_ynode_len(root);
    char at[512];
    if (wb_ynode_kind(root) != WB_YNODE_MAP) {
        wb_errlist_add(el, "%s: expected a mapping of tensor name -> {dtype, shape}",
                       wb_yaml_where(y, root, at, sizeof(at)));
        r = -WB_E_CONFIG;
        goto out;
    }
    if (!(lines = calloc(n + 1, sizeof(*lines)))) {
        r = -ENOMEM;
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        const struct wb_ynode *k, *v;
        wb_ynode_pair(y, root, i, &k, &v);
        const char *name = wb_ynode_scalar(k);
        where(y, k, at, sizeof(at));
        if (!name || !*name || strlen(name) >= WB_NAME_MAX) {
            wb_errlist_add(el, "%s: tensor names must be non-empty strings under %d bytes", at,
                           WB_NAME_MAX);
            r = -WB_E_CONFIG;
            continue;
        }
        enum wb_dtype dt;
        struct wb_shape s;
        if (parse_entry(y, v, name, &dt, &s, el)) {
            r = -WB_E_CONFIG;
            continue;
        }
        ssize_t prev = wb_inv_find(&tmp, name);
        if (prev >= 0) {
            wb_errlist_add(el, "%s: duplicate tensor name '%s' (first at line %u)", at, name,
                           lines[prev]);
            r = -WB_E_CONFIG;
            continue;
        }
        int a = wb_inv_add(&tmp, name, dt, &s);
        if (a == -EOVERFLOW) {
            char sh[160];
            wb_errlist_add(el, "%s: %s %s: more than 2^48 bytes (%s)", at, name,
                           wb_shape_str(&s, sh, sizeof(sh)), wb_dtype_name(dt));
            r = -WB_E_CONFIG;
            continue;
        }
        if (a) {
            r = a;
            wb_errlist_add(el, "%s: %s: %s", at, name, wb_strerror(a));
            goto out;
        }
        /* the line of the key, for duplicate messages: parse it back from "file:line:col" */
        const char *colon = strrchr(at, ':');
        const char *p = colon;
        while (p > at && p[-1] != ':')
            p--;
        lines[tmp.n - 1] = (uint32_t)strtoul(p, NULL, 10);
    }
    if (r == 0) {
        wb_inv_free(inv);
        *inv = tmp;
        tmp.index = NULL;
        tmp.p = NULL;
    }
out:
    free(lines);
    wb_inv_free(&tmp);
    wb_yaml_free(y);
    return r;
}

int wb_inv_save_file(const char *path, const struct wb_inventory *inv)
{
    FILE *f = fopen(path, "w");
    if (!f)
        return -errno;
    fprintf(f, "{\n");
    for (size_t i = 0; i < inv->n; i++) {
        const struct wb_param *p = &inv->p[i];
        fprintf(f, "  \"%s\": [\"%s\", [", p->name, wb_dtype_name(p->dtype));
        for (uint32_t d = 0; d < p->shape.ndim; d++)
            fprintf(f, "%s%llu", d ? ", " : "", (unsigned long long)p->shape.dim[d]);
        fprintf(f, "]]%s\n", i + 1 < inv->n ? "," : "");
    }
    fprintf(f, "}\n");
    int r = ferror(f) ? -EIO : 0;
    if (fclose(f) && !r)
        r = -errno;
    return r;
}
