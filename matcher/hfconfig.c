/* hfconfig.c — a Hugging Face config.json read with jansson and flattened into named values
 * for the expression language: integers and booleans become integers, arrays of integers
 * become lists (for contains()), nested objects are reached with dots
 * ("quantization_config.quant_method"), nulls are left out so that defined() is false for
 * them, and everything else (floats, strings) is kept as text so a message can show it. */
#include "matcher/mpriv.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct flat {
    struct wb_jval *v;
    size_t n, cap;
};

static int push(struct flat *f, const char *name, const json_t *j)
{
    if (json_is_null(j))
        return 0;
    if (f->n == f->cap && wb_grow(&f->v, &f->cap, 64, sizeof(*f->v)) != 0)
        return -ENOMEM;
    struct wb_jval *v = &f->v[f->n];
    memset(v, 0, sizeof(*v));
    if (!(v->name = strdup(name)))
        return -ENOMEM;
    f->n++;
    if (json_is_integer(j)) {
        v->kind = WB_J_INT;
        v->i = (int64_t)json_integer_value(j);
        return 0;
    }
    if (json_is_boolean(j)) {
        v->kind = WB_J_INT;
        v->i = json_is_true(j);
        v->is_bool = true;
        return 0;
    }
    if (json_is_array(j)) {
        size_t n = json_array_size(j), k;
        for (k = 0; k < n && json_is_integer(json_array_get(j, k)); k++)
            ;
        if (k == n) {
            v->kind = WB_J_LIST;
            if (n && !(v->list = calloc(n, sizeof(*v->list))))
                return -ENOMEM;
            for (k = 0; k < n; k++)
                v->list[k] = (int64_t)json_integer_value(json_array_get(j, k));
            v->nlist = n;
            return 0;
        }
    }
    v->kind = WB_J_OTHER;
    if (json_is_real(j)) { /* "1e-06", not jansson's 17 digits */
        char num[64];
        snprintf(num, sizeof(num), "%g", json_real_value(j));
        v->text = strdup(num);
    } else {
        v->text = json_dumps(j, JSON_ENCODE_ANY | JSON_COMPACT);
        if (json_is_string(j) && !(v->str = strdup(json_string_value(j))))
            return -ENOMEM;
    }
    return v->text ? 0 : -ENOMEM;
}

static int flatten(struct flat *f, const char *prefix, const json_t *obj, const char *path,
                   struct wb_errlist *el)
{
    const char *key;
    json_t *val;
    json_object_foreach((json_t *)obj, key, val)
    {
        char name[512];
        if ((size_t)snprintf(name, sizeof(name), "%s%s%s", prefix, *prefix ? "." : "", key) >=
            sizeof(name)) {
            wb_errlist_add(el, "%s: key '%.40s...' is longer than %zu bytes", path, name,
                           sizeof(name) - 1);
            return -WB_E_CONFIG;
        }
        int r = json_is_object(val) ? flatten(f, name, val, path, el) : push(f, name, val);
        if (r)
            return r;
    }
    return 0;
}

static int cmp_jval(const void *a, const void *b)
{
    return strcmp(((const struct wb_jval *)a)->name, ((const struct wb_jval *)b)->name);
}

void mx_jcfg_free(struct wb_jcfg *c)
{
    if (!c)
        return;
    for (size_t i = 0; i < c->n; i++) {
        free(c->v[i].name);
        free(c->v[i].list);
        free(c->v[i].text);
        free(c->v[i].str);
    }
    free(c->v);
    free(c->path);
    free(c);
}

int mx_jcfg_load(const char *path, struct wb_jcfg **out, struct wb_errlist *el)
{
    json_error_t je;
    json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
    if (!root) {
        if (je.line < 0)
            wb_errlist_add(el, "%s: %s", path, je.text);
        else
            wb_errlist_add(el, "%s:%d:%d: %s", path, je.line, je.column, je.text);
        return -WB_E_CONFIG;
    }
    int r = -ENOMEM;
    struct wb_jcfg *c = calloc(1, sizeof(*c));
    struct flat f = {0};
    if (!c || !(c->path = strdup(path)))
        goto err;
    if (!json_is_object(root)) {
        wb_errlist_add(el, "%s: expected a JSON object at the top", path);
        r = -WB_E_CONFIG;
        goto err;
    }
    if ((r = flatten(&f, "", root, path, el)))
        goto err;
    if (f.n)
        qsort(f.v, f.n, sizeof(*f.v), cmp_jval);
    /* {"a.b": 1, "a": {"b": 2}} flattens to one name twice: which one an expression saw would
     * depend on the sort */
    for (size_t i = 1; i < f.n; i++)
        if (strcmp(f.v[i - 1].name, f.v[i].name) == 0) {
            wb_errlist_add(el, "%s: key '%s' is given twice (once with a dot in its name)", path,
                           f.v[i].name);
            r = -WB_E_CONFIG;
        }
    if (r)
        goto err;
    c->v = f.v;
    c->n = f.n;
    json_decref(root);
    *out = c;
    return 0;
err:
    json_decref(root);
    if (c) {
        c->v = f.v;
        c->n = f.n;
        mx_jcfg_free(c);
    } else {
        for (size_t i = 0; i < f.n; i++) {
            free(f.v[i].name);
            free(f.v[i].list);
            free(f.v[i].text);
            free(f.v[i].str);
        }
        free(f.v);
    }
    if (r == -ENOMEM)
        wb_errlist_add(el, "%s: out of memory", path);
    return r;
}

const struct wb_jval *mx_jcfg_get(const struct wb_jcfg *c, const char *name, size_t len)
{
    size_t lo = 0, hi = c->n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        int d = strncmp(c->v[mid].name, name, len);
        if (d == 0 && c->v[mid].name[len] != 0)
            d = 1;
        if (d == 0)
            return &c->v[mid];
        if (d < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}
