/* pattern.c — tensor-name patterns with captures, as used by the rules:
 *   "model.layers.{L}.self_attn.qkv_proj.weight"   {L} captures a decimal integer
 *   "*.rotary_emb.inv_freq"                          * captures any text
 * A rule's rollout pattern captures; its trainer templates are the same syntax with the
 * captures substituted back ({L} -> "3", the i-th * -> the i-th * capture). Matching is a
 * small backtracking walk over the segments; names are short and rules few, and the rules
 * reject most names by their literal suffix before getting here. */
#include "matcher/mpriv.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void mx_pat_free(struct wb_pat *p)
{
    if (!p)
        return;
    for (size_t i = 0; i < p->nseg; i++)
        free(p->seg[i].text);
    free(p->seg);
    free(p->src);
    memset(p, 0, sizeof(*p));
}

int mx_pat_compile(const char *text, struct wb_pat *p, char *err, size_t errcap)
{
    memset(p, 0, sizeof(*p));
    size_t len = strlen(text);
    if (!len) {
        snprintf(err, errcap, "empty name pattern");
        return -EINVAL;
    }
    if (!(p->src = strdup(text)) || !(p->seg = calloc(len + 1, sizeof(*p->seg))))
        goto nomem;
    size_t ncap = 0;
    for (const char *s = text; *s;) {
        struct wb_pat_seg *g = &p->seg[p->nseg];
        if (*s == '{') {
            const char *end = strchr(s, '}');
            size_t n = end ? (size_t)(end - s - 1) : 0;
            bool ok = end && n > 0 && (isalpha((unsigned char)s[1]) || s[1] == '_');
            for (size_t i = 1; ok && i <= n; i++)
                ok = isalnum((unsigned char)s[i]) || s[i] == '_';
            if (!ok) {
                snprintf(err, errcap, "bad capture at column %zu of '%s' (want {NAME})",
                         (size_t)(s - text) + 1, text);
                goto inval;
            }
            if (p->nseg && p->seg[p->nseg - 1].kind != WB_SEG_LIT) {
                snprintf(err, errcap, "two captures in a row at column %zu of '%s'",
                         (size_t)(s - text) + 1, text);
                goto inval;
            }
            g->kind = WB_SEG_CAP;
            if (!(g->text = strndup(s + 1, n)))
                goto nomem;
            g->len = n;
            s = end + 1;
            ncap++;
        } else if (*s == '*') {
            if (p->nseg && p->seg[p->nseg - 1].kind != WB_SEG_LIT) {
                snprintf(err, errcap, "two captures in a row at column %zu of '%s'",
                         (size_t)(s - text) + 1, text);
                goto inval;
            }
            g->kind = WB_SEG_STAR;
            if (!(g->text = strdup("*")))
                goto nomem;
            g->len = 1;
            s++;
            p->nstar++;
            ncap++;
        } else {
            size_t n = strcspn(s, "{*");
            if (memchr(s, '}', n)) {
                snprintf(err, errcap, "'}' without '{' in '%s'", text);
                goto inval;
            }
            g->kind = WB_SEG_LIT;
            if (!(g->text = strndup(s, n)))
                goto nomem;
            g->len = n;
            s += n;
        }
        p->nseg++;
    }
    if (ncap > WB_PAT_MAX_CAPS) {
        snprintf(err, errcap, "more than %d captures in '%s'", WB_PAT_MAX_CAPS, text);
        goto inval;
    }
    return 0;
nomem:
    mx_pat_free(p);
    snprintf(err, errcap, "out of memory");
    return -ENOMEM;
inval:
    mx_pat_free(p);
    return -EINVAL;
}

static bool match_from(const struct wb_pat *p, size_t si, const char *s, struct wb_caps *c)
{
    if (si == p->nseg)
        return *s == 0;
    const struct wb_pat_seg *g = &p->seg[si];
    if (g->kind == WB_SEG_LIT)
        return strncmp(s, g->text, g->len) == 0 && match_from(p, si + 1, s + g->len, c);
    size_t slot = c->n++;
    c->name[slot] = g->text;
    c->at[slot] = s;
    if (g->kind == WB_SEG_CAP) {
        size_t nd = 0;
        while (isdigit((unsigned char)s[nd]))
            nd++;
        for (size_t k = nd; k >= 1; k--) { /* longest first */
            c->len[slot] = k;
            if (match_from(p, si + 1, s + k, c))
                return true;
        }
    } else {
        size_t n = strlen(s);
        for (size_t k = 0; k <= n; k++) { /* shortest first */
            c->len[slot] = k;
            if (match_from(p, si + 1, s + k, c))
                return true;
        }
    }
    c->n = slot;
    return false;
}

bool mx_pat_match(const struct wb_pat *p, const char *name, struct wb_caps *caps)
{
    caps->n = 0;
    return match_from(p, 0, name, caps);
}

bool mx_pat_has_cap(const struct wb_pat *p, const char *name)
{
    for (size_t i = 0; i < p->nseg; i++)
        if (p->seg[i].kind == WB_SEG_CAP && strcmp(p->seg[i].text, name) == 0)
            return true;
    return false;
}

int mx_pat_subst(const struct wb_pat *t, const struct wb_caps *caps, const char *override_name,
                 uint64_t override_value, char *buf, size_t cap)
{
    size_t pos = 0, star = 0;
    for (size_t i = 0; i < t->nseg; i++) {
        const struct wb_pat_seg *g = &t->seg[i];
        const char *src = g->text;
        size_t n = g->len;
        char num[24];
        if (g->kind == WB_SEG_CAP && override_name && strcmp(g->text, override_name) == 0) {
            n = (size_t)snprintf(num, sizeof(num), "%llu", (unsigned long long)override_value);
            src = num;
        } else if (g->kind != WB_SEG_LIT) {
            size_t k = 0, seen = 0;
            for (; k < caps->n; k++) {
                if (g->kind == WB_SEG_CAP && strcmp(caps->name[k], g->text) == 0)
                    break;
                if (g->kind == WB_SEG_STAR && strcmp(caps->name[k], "*") == 0 && seen++ == star)
                    break;
            }
            if (k == caps->n)
                return -ENOENT;
            if (g->kind == WB_SEG_STAR)
                star++;
            src = caps->at[k];
            n = caps->len[k];
        }
        if (pos + n >= cap)
            return -ENAMETOOLONG;
        memcpy(buf + pos, src, n);
        pos += n;
    }
    buf[pos] = 0;
    return 0;
}

void mx_name_label(const char *name, char *buf, size_t cap)
{
    /* the last dotted segment, or the one before it when the last is "weight", "bias", ... */
    const char *end = name + strlen(name);
    const char *last = strrchr(name, '.');
    if (last && (strcmp(last, ".weight") == 0 || strcmp(last, ".bias") == 0 ||
                 strncmp(last, ".weight_", 8) == 0)) {
        end = last;
        const char *p = end;
        while (p > name && p[-1] != '.')
            p--;
        snprintf(buf, cap, "%.*s", (int)(end - p), p);
        return;
    }
    snprintf(buf, cap, "%s", last ? last + 1 : name);
}
