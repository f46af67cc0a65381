/* yaml.c — YAML documents on libyaml with error locations, strict scalar parsing, and the
 * table-driven config loader: a table of rows {key, type, default, doc, offset} fills a struct,
 * reports every unknown, mistyped or missing key with file:line:col, and documents itself
 * (wb_cfg_dump) from the same rows. */
#include "common/common.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <yaml.h>

struct wb_yaml {
    yaml_document_t doc;
    char *path;
};

/* struct wb_ynode is libyaml's node; the cast is the only place the two names meet. */
static const yaml_node_t *YN(const struct wb_ynode *n)
{
    return (const yaml_node_t *)n;
}
static const struct wb_ynode *WN(const yaml_node_t *n)
{
    return (const struct wb_ynode *)n;
}

/* Mappings and sequences may nest this deep. libyaml's scanner walks every open flow level for
 * each token, so 40,000 nested '[' took 42 s to load (and its loader recurses); real configs
 * nest fewer than 10 levels. */
#define YAML_MAX_DEPTH 64

/* A first pass over the events that refuses a document nesting deeper than YAML_MAX_DEPTH at
 * the node that passes the bound; it stops there, so its cost stays linear. */
static int depth_check(const char *name, const char *text, size_t len, struct wb_errlist *el)
{
    yaml_parser_t p;
    if (!yaml_parser_initialize(&p))
        return -ENOMEM;
    yaml_parser_set_input_string(&p, (const unsigned char *)text, len);
    int depth = 0, r = 0;
    for (;;) {
        yaml_event_t ev;
        if (!yaml_parser_parse(&p, &ev))
            break; /* the loader reports syntax errors with their context */
        yaml_event_type_t t = ev.type;
        if ((t == YAML_SEQUENCE_START_EVENT || t == YAML_MAPPING_START_EVENT) &&
            ++depth > YAML_MAX_DEPTH) {
            wb_errlist_add(el, "%s:%zu:%zu: nested deeper than %d levels", name,
                           ev.start_mark.line + 1, ev.start_mark.column + 1, YAML_MAX_DEPTH);
            r = -WB_E_CONFIG;
        }
        if (t == YAML_SEQUENCE_END_EVENT || t == YAML_MAPPING_END_EVENT)
            depth--;
        yaml_event_delete(&ev);
        if (r || t == YAML_STREAM_END_EVENT)
            break;
    }
    yaml_parser_delete(&p);
    return r;
}

static int load(const char *name, const char *text, size_t len, struct wb_errlist *el,
                struct wb_yaml **out)
{
    int dr = depth_check(name, text, len, el);
    if (dr)
        return dr;
    struct wb_yaml *y = calloc(1, sizeof(*y));
    if (!y || !(y->path = strdup(name))) {
        free(y);
        return -ENOMEM;
    }
    yaml_parser_t p;
    if (!yaml_parser_initialize(&p)) {
        free(y->path);
        free(y);
        return -ENOMEM;
    }
    yaml_parser_set_input_string(&p, (const unsigned char *)text, len);
    int r = 0;
    if (!yaml_parser_load(&p, &y->doc)) {
        yaml_mark_t m = p.problem_mark;
        wb_errlist_add(el, "%s:%zu:%zu: %s%s%s", name, m.line + 1, m.column + 1,
                       p.problem ? p.problem : "YAML syntax error", p.context ? " " : "",
                       p.context ? p.context : "");
        free(y->path);
        free(y);
        r = -WB_E_CONFIG;
    }
    yaml_parser_delete(&p);
    if (r == 0)
        *out = y;
    return r;
}

int wb_yaml_load(const char *path, struct wb_errlist *el, struct wb_yaml **out)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        int e = errno;
        wb_errlist_add(el, "%s: cannot open: %s", path, strerror(e));
        return -e;
    }
    struct stat st;
    if (fstat(fileno(f), &st) == 0 && S_ISDIR(st.st_mode)) {
        fclose(f); /* libyaml would only say "input error" */
        wb_errlist_add(el, "%s: cannot read: %s", path, strerror(EISDIR));
        return -EISDIR;
    }
    /* read whole: the depth check and the loader each pass over it */
    char *text = NULL;
    size_t len = 0, cap = 0;
    int r = 0;
    for (;;) {
        if (len == cap && wb_grow(&text, &cap, 4096, 1) != 0) {
            r = -ENOMEM;
            break;
        }
        size_t n = fread(text + len, 1, cap - len, f);
        len += n;
        if (n == 0) {
            if (ferror(f)) {
                r = -EIO;
                wb_errlist_add(el, "%s: cannot read: %s", path, strerror(EIO));
            }
            break;
        }
    }
    fclose(f);
    if (r == 0)
        r = load(path, text, len, el, out);
    free(text);
    return r;
}

int wb_yaml_load_string(const char *name, const char *text, struct wb_errlist *el,
                        struct wb_yaml **out)
{
    return load(name, text, strlen(text), el, out);
}

void wb_yaml_free(struct wb_yaml *y)
{
    if (!y)
        return;
    yaml_document_delete(&y->doc);
    free(y->path);
    free(y);
}

const struct wb_ynode *wb_yaml_root(const struct wb_yaml *y)
{
    return WN(yaml_document_get_root_node((yaml_document_t *)&y->doc));
}

char *wb_yaml_where(const struct wb_yaml *y, const struct wb_ynode *n, char *buf, size_t cap)
{
    if (n)
        snprintf(buf, cap, "%s:%zu:%zu", y->path, YN(n)->start_mark.line + 1,
                 YN(n)->start_mark.column + 1);
    else
        snprintf(buf, cap, "%s", y->path);
    return buf;
}

enum wb_ynode_kind wb_ynode_kind(const struct wb_ynode *n)
{
    if (!n)
        return WB_YNODE_NONE;
    switch (YN(n)->type) {
    case YAML_SCALAR_NODE:
        return WB_YNODE_SCALAR;
    case YAML_SEQUENCE_NODE:
        return WB_YNODE_SEQ;
    case YAML_MAPPING_NODE:
        return WB_YNODE_MAP;
    default:
        return WB_YNODE_NONE;
    }
}

const char *wb_ynode_scalar(const struct wb_ynode *n)
{
    return wb_ynode_kind(n) == WB_YNODE_SCALAR ? (const char *)YN(n)->data.scalar.value : NULL;
}

size_t wb_ynode_len(const struct wb_ynode *n)
{
    switch (wb_ynode_kind(n)) {
    case WB_YNODE_SEQ:
        return (size_t)(YN(n)->data.sequence.items.top - YN(n)->data.sequence.items.start);
    case WB_YNODE_MAP:
        return (size_t)(YN(n)->data.mapping.pairs.top - YN(n)->data.mapping.pairs.start);
    default:
        return 0;
    }
}

static const struct wb_ynode *node_at(const struct wb_yaml *y, int index)
{
    return WN(yaml_document_get_node((yaml_document_t *)&y->doc, index));
}

const struct wb_ynode *wb_ynode_item(const struct wb_yaml *y, const struct wb_ynode *n, size_t i)
{
    if (wb_ynode_kind(n) != WB_YNODE_SEQ || i >= wb_ynode_len(n))
        return NULL;
    return node_at(y, YN(n)->data.sequence.items.start[i]);
}

void wb_ynode_pair(const struct wb_yaml *y, const struct wb_ynode *n, size_t i,
                   const struct wb_ynode **key, const struct wb_ynode **value)
{
    *key = *value = NULL;
    if (wb_ynode_kind(n) != WB_YNODE_MAP || i >= wb_ynode_len(n))
        return;
    yaml_node_pair_t *p = &YN(n)->data.mapping.pairs.start[i];
    *key = node_at(y, p->key);
    *value = node_at(y, p->value);
}

const struct wb_ynode *wb_ynode_get(const struct wb_yaml *y, const struct wb_ynode *map,
                                    const char *key)
{
    size_t n = wb_ynode_len(map);
    for (size_t i = 0; i < n; i++) {
        const struct wb_ynode *k, *v;
        wb_ynode_pair(y, map, i, &k, &v);
        const char *s = wb_ynode_scalar(k);
        if (s && strcmp(s, key) == 0)
            return v;
    }
    return NULL;
}

/* ---------------------------------------------------------------- scalars */

int wb_parse_i64(const char *s, int64_t *out)
{
    if (!s || !*s || isspace((unsigned char)*s))
        return -EINVAL;
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 0);
    if (errno || *end)
        return -EINVAL;
    *out = v;
    return 0;
}

int wb_parse_u64(const char *s, uint64_t *out)
{
    if (!s || !*s || !isdigit((unsigned char)*s)) /* strtoull accepts "-1" */
        return -EINVAL;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 0);
    if (errno || *end)
        return -EINVAL;
    *out = v;
    return 0;
}

int wb_parse_f64(const char *s, double *out)
{
    if (!s || !*s || isspace((unsigned char)*s))
        return -EINVAL;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || *end || !isfinite(v))
        return -EINVAL;
    *out = v;
    return 0;
}

int wb_parse_bool(const char *s, bool *out)
{
    static const char *const yes[] = {"true", "yes", "on", "1"};
    static const char *const no[] = {"false", "no", "off", "0"};
    for (size_t i = 0; s && i < 4; i++) {
        if (strcasecmp(s, yes[i]) == 0)
            return *out = true, 0;
        if (strcasecmp(s, no[i]) == 0)
            return *out = false, 0;
    }
    return -EINVAL;
}

/* Splits "1.5GiB" into a non-negative number and a unit suffix; the suffix is looked up in
 * units[] (NULL-terminated names with their multipliers). */
static int parse_with_unit(const char *s, const char *const *names, const double *mult,
                           double def_mult, double *out)
{
    if (!s || !isdigit((unsigned char)*s))
        return -EINVAL;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || !isfinite(v) || v < 0)
        return -EINVAL;
    while (*end == ' ')
        end++;
    if (!*end) {
        *out = v * def_mult;
        return 0;
    }
    for (size_t i = 0; names[i]; i++)
        if (strcmp(end, names[i]) == 0) {
            *out = v * mult[i];
            return 0;
        }
    return -EINVAL;
}

int wb_parse_size(const char *s, uint64_t *out)
{
    static const char *const names[] = {"B",   "K",  "KiB", "M",  "MiB", "G",  "GiB", "T",
                                        "TiB", "kB", "KB",  "MB", "GB",  "TB", NULL};
    static const double mult[] = {1,      0x1p10, 0x1p10, 0x1p20, 0x1p20, 0x1p30, 0x1p30,
                                  0x1p40, 0x1p40, 1e3,    1e3,    1e6,    1e9,    1e12};
    double v;
    if (parse_with_unit(s, names, mult, 1, &v) || v >= 0x1p64 || v != floor(v))
        return -EINVAL;
    *out = (uint64_t)v;
    return 0;
}

int wb_parse_duration(const char *s, uint64_t *out)
{
    static const char *const names[] = {"ns", "us", "ms", "s", "m", "min", NULL};
    static const double mult[] = {1, 1e3, 1e6, 1e9, 60e9, 60e9};
    double v;
    if (parse_with_unit(s, names, mult, 1e9, &v) || v >= 0x1p64)
        return -EINVAL;
    *out = (uint64_t)llround(v);
    return 0;
}

/* ---------------------------------------------------------------- config tables */

struct cfg_ctx {
    const struct wb_yaml *y;
    struct wb_errlist *el;
    int err;
};

static void cfg_error(struct cfg_ctx *c, const struct wb_ynode *at, const char *prefix,
                      const char *key, const char *fmt, ...) __attribute__((format(printf, 5, 6)));

static void cfg_error(struct cfg_ctx *c, const struct wb_ynode *at, const char *prefix,
                      const char *key, const char *fmt, ...)
{
    char where[512], msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    if (c->y)
        wb_yaml_where(c->y, at, where, sizeof(where));
    else
        snprintf(where, sizeof(where), "(defaults)");
    wb_errlist_add(c->el, "%s: %s%s%s: %s", where, prefix, *prefix ? "." : "", key, msg);
    c->err = -WB_E_CONFIG;
}

static const char *type_word(enum wb_cfg_type t)
{
    switch (t) {
    case WB_CFG_STR:
        return "a string";
    case WB_CFG_I64:
        return "an integer";
    case WB_CFG_U64:
        return "a non-negative integer";
    case WB_CFG_F64:
        return "a number";
    case WB_CFG_BOOL:
        return "true or false";
    case WB_CFG_SIZE:
        return "a size such as 4096, 64KiB or 1GiB";
    case WB_CFG_DURATION:
        return "a duration such as 250ms or 2s";
    case WB_CFG_ENUM:
        return "one of";
    case WB_CFG_SECTION:
        return "a mapping";
    default:
        return "a value";
    }
}

/* Stores scalar text s into the field; returns 0 or -EINVAL (wrong type). */
static int store_scalar(const struct wb_cfg_field *f, void *out, const char *s)
{
    char *p = (char *)out + f->offset;
    switch (f->type) {
    case WB_CFG_STR: {
        char *dup = strdup(s);
        if (!dup)
            return -ENOMEM;
        free(*(char **)p);
        *(char **)p = dup;
        return 0;
    }
    case WB_CFG_I64:
        return wb_parse_i64(s, (int64_t *)p);
    case WB_CFG_U64:
        return wb_parse_u64(s, (uint64_t *)p);
    case WB_CFG_F64:
        return wb_parse_f64(s, (double *)p);
    case WB_CFG_BOOL:
        return wb_parse_bool(s, (bool *)p);
    case WB_CFG_SIZE:
        return wb_parse_size(s, (uint64_t *)p);
    case WB_CFG_DURATION:
        return wb_parse_duration(s, (uint64_t *)p);
    case WB_CFG_ENUM:
        for (int i = 0; f->choices[i]; i++)
            if (strcmp(s, f->choices[i]) == 0) {
                *(int *)p = i;
                return 0;
            }
        return -EINVAL;
    default:
        return -EINVAL;
    }
}

int wb_cfg_defaults(const struct wb_cfg_field *table, void *out)
{
    for (const struct wb_cfg_field *f = table; f->key; f++) {
        char *p = (char *)out + f->offset;
        if (f->type == WB_CFG_SECTION) {
            int r = wb_cfg_defaults(f->sub, p);
            if (r)
                return r;
        } else if (f->type == WB_CFG_NODE) {
            *(const struct wb_ynode **)p = NULL;
        } else if (f->def) {
            int r = store_scalar(f, out, f->def);
            if (r)
                return r;
        }
    }
    return 0;
}

static void choices_str(const struct wb_cfg_field *f, char *buf, size_t cap)
{
    size_t pos = 0;
    buf[0] = 0;
    for (int i = 0; f->choices[i] && pos < cap; i++) {
        int n = snprintf(buf + pos, cap - pos, "%s%s", i ? "|" : "", f->choices[i]);
        if (n > 0)
            pos += (size_t)n;
    }
}

static void parse_map(struct cfg_ctx *c, const struct wb_ynode *node,
                      const struct wb_cfg_field *table, void *out, const char *prefix)
{
    size_t npairs = wb_ynode_len(node);
    size_t nrows = 0;
    while (table[nrows].key)
        nrows++;
    bool seen[nrows + 1];
    memset(seen, 0, sizeof(seen));

    for (size_t i = 0; i < npairs; i++) {
        const struct wb_ynode *k, *v;
        wb_ynode_pair(c->y, node, i, &k, &v);
        const char *key = wb_ynode_scalar(k);
        if (!key) {
            cfg_error(c, k, prefix, "?", "keys must be plain strings");
            continue;
        }
        size_t row = 0;
        while (row < nrows && strcmp(table[row].key, key) != 0)
            row++;
        if (row == nrows) {
            cfg_error(c, k, prefix, key, "unknown key");
            continue;
        }
        if (seen[row]) {
            cfg_error(c, k, prefix, key, "duplicate key");
            continue;
        }
        seen[row] = true;
        const struct wb_cfg_field *f = &table[row];
        char *p = (char *)out + f->offset;
        if (f->type == WB_CFG_NODE) {
            *(const struct wb_ynode **)p = v;
        } else if (f->type == WB_CFG_SECTION) {
            char sub[256];
            snprintf(sub, sizeof(sub), "%s%s%s", prefix, *prefix ? "." : "", key);
            if (wb_ynode_kind(v) == WB_YNODE_MAP)
                parse_map(c, v, f->sub, p, sub);
            else if (!(wb_ynode_kind(v) == WB_YNODE_SCALAR && !*wb_ynode_scalar(v)))
                cfg_error(c, v, prefix, key, "expected a mapping");
            else
                parse_map(c, NULL, f->sub, p, sub); /* "key:" with nothing = empty section */
        } else {
            const char *s = wb_ynode_scalar(v);
            int r = s ? store_scalar(f, out, s) : -EINVAL;
            if (r == -ENOMEM) {
                c->err = -ENOMEM;
            } else if (r) {
                char want[256];
                if (f->type == WB_CFG_ENUM)
                    choices_str(f, want, sizeof(want));
                else
                    snprintf(want, sizeof(want), "%s", type_word(f->type));
                cfg_error(c, v, prefix, key, "expected %s%s, got %s%s%s",
                          f->type == WB_CFG_ENUM ? "one of " : "", want, s ? "'" : "",
                          s                                  ? s
                          : wb_ynode_kind(v) == WB_YNODE_SEQ ? "a sequence"
                                                             : "a mapping",
                          s ? "'" : "");
            }
        }
    }
    for (size_t row = 0; row < nrows; row++) {
        const struct wb_cfg_field *f = &table[row];
        if (seen[row] || f->def)
            continue;
        if (f->type == WB_CFG_SECTION) { /* a required section that is absent: check its keys */
            char sub[256];
            snprintf(sub, sizeof(sub), "%s%s%s", prefix, *prefix ? "." : "", f->key);
            cfg_error(c, node, prefix, f->key, "required section missing");
            (void)sub;
            continue;
        }
        cfg_error(c, node, prefix, f->key, "required key missing");
    }
}

int wb_cfg_parse(const struct wb_yaml *y, const struct wb_ynode *node,
                 const struct wb_cfg_field *table, void *out, struct wb_errlist *el)
{
    int r = wb_cfg_defaults(table, out);
    if (r)
        return r;
    struct cfg_ctx c = {.y = y, .el = el};
    if (node && wb_ynode_kind(node) != WB_YNODE_MAP &&
        !(wb_ynode_kind(node) == WB_YNODE_SCALAR && !*wb_ynode_scalar(node))) {
        char where[512];
        wb_errlist_add(el, "%s: expected a mapping of keys",
                       wb_yaml_where(y, node, where, sizeof(where)));
        wb_cfg_free(table, out);
        return -WB_E_CONFIG;
    }
    parse_map(&c, wb_ynode_kind(node) == WB_YNODE_MAP ? node : NULL, table, out, "");
    if (c.err)
        wb_cfg_free(table, out); /* nothing half-applied stays allocated */
    return c.err;
}

void wb_cfg_free(const struct wb_cfg_field *table, void *out)
{
    for (const struct wb_cfg_field *f = table; f->key; f++) {
        char *p = (char *)out + f->offset;
        if (f->type == WB_CFG_STR) {
            free(*(char **)p);
            *(char **)p = NULL;
        } else if (f->type == WB_CFG_SECTION) {
            wb_cfg_free(f->sub, p);
        }
    }
}

static void dump(const struct wb_cfg_field *table, FILE *f, int indent)
{
    for (const struct wb_cfg_field *r = table; r->key; r++) {
        char kv[512], extra[256] = "";
        if (r->type == WB_CFG_SECTION) {
            snprintf(kv, sizeof(kv), "%*s%s:", indent, "", r->key);
        } else {
            const char *val = r->type == WB_CFG_NODE ? (r->def ? "<optional>" : "<required>")
                              : r->def               ? (*r->def ? r->def : "\"\"")
                                                     : "<required>";
            snprintf(kv, sizeof(kv), "%*s%s: %s", indent, "", r->key, val);
            if (r->type == WB_CFG_ENUM) {
                char ch[200];
                choices_str(r, ch, sizeof(ch));
                snprintf(extra, sizeof(extra), " (%s)", ch);
            }
        }
        fprintf(f, "%-32s # %s%s\n", kv, r->doc ? r->doc : "", extra);
        if (r->type == WB_CFG_SECTION)
            dump(r->sub, f, indent + 2);
    }
}

void wb_cfg_dump(const struct wb_cfg_field *table, void *file)
{
    dump(table, file ? file : stdout, 0);
}
