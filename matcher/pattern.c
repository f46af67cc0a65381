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

/* ---------------------------------------------------------------- inclusion */

/* A pattern as a list of atoms over bytes: a literal byte, one digit, or a loop (any bytes, or
 * digits) that may also be skipped. {NAME} is a digit then a digit loop; * is an any-loop.
 * State k is "before atom k"; state n accepts. */
enum { ATOM_BYTE, ATOM_DIGIT, ATOM_LOOP_ANY, ATOM_LOOP_DIGIT };
struct atoms {
    uint8_t kind[2 * WB_NAME_MAX];
    uint8_t byte[2 * WB_NAME_MAX];
    size_t n;
};

static bool to_atoms(const struct wb_pat *p, struct atoms *a)
{
    a->n = 0;
    for (size_t i = 0; i < p->nseg; i++) {
        const struct wb_pat_seg *g = &p->seg[i];
        size_t need = g->kind == WB_SEG_LIT ? g->len : g->kind == WB_SEG_CAP ? 2 : 1;
        if (a->n + need > sizeof(a->kind))
            return false;
        if (g->kind == WB_SEG_LIT) {
            for (size_t k = 0; k < g->len; k++) {
                a->kind[a->n] = ATOM_BYTE;
                a->byte[a->n++] = (uint8_t)g->text[k];
            }
        } else if (g->kind == WB_SEG_CAP) {
            a->kind[a->n++] = ATOM_DIGIT;
            a->kind[a->n++] = ATOM_LOOP_DIGIT;
        } else {
            a->kind[a->n++] = ATOM_LOOP_ANY;
        }
    }
    return true;
}

enum { SET_WORDS = (2 * WB_NAME_MAX + 1 + 63) / 64 };
struct sset {
    uint64_t w[SET_WORDS];
};

static void set_add(struct sset *s, size_t k)
{
    s->w[k / 64] |= 1ull << (k % 64);
}
static bool set_has(const struct sset *s, size_t k)
{
    return s->w[k / 64] >> (k % 64) & 1;
}

/* Adds the states a loop lets one skip to. */
static void closure(const struct atoms *a, struct sset *s)
{
    for (size_t k = 0; k < a->n; k++)
        if (set_has(s, k) && a->kind[k] >= ATOM_LOOP_ANY)
            set_add(s, k + 1);
}

static struct sset step(const struct atoms *a, const struct sset *s, uint8_t c)
{
    struct sset o = {{0}};
    bool digit = c >= '0' && c <= '9';
    for (size_t k = 0; k < a->n; k++) {
        if (!set_has(s, k))
            continue;
        switch (a->kind[k]) {
        case ATOM_BYTE:
            if (a->byte[k] == c)
                set_add(&o, k + 1);
            break;
        case ATOM_DIGIT:
            if (digit)
                set_add(&o, k + 1);
            break;
        case ATOM_LOOP_ANY:
            set_add(&o, k);
            break;
        case ATOM_LOOP_DIGIT:
            if (digit)
                set_add(&o, k);
            break;
        }
    }
    closure(a, &o);
    return o;
}

struct spair {
    struct sset in, out;
};

/* The literal text a pattern's names all start (end) with: its first (last) segment when
 * literal. */
static const struct wb_pat_seg *lit_end(const struct wb_pat *p, bool last)
{
    const struct wb_pat_seg *g = &p->seg[last ? p->nseg - 1 : 0];
    return p->nseg && g->kind == WB_SEG_LIT ? g : NULL;
}

/* A quick necessary condition: outer's literal head (tail) is a head (tail) of inner's, since a
 * capture of inner may begin (end) with at least two different bytes, or none. */
static bool ends_agree(const struct wb_pat *outer, const struct wb_pat *inner)
{
    for (int last = 0; last < 2; last++) {
        const struct wb_pat_seg *o = lit_end(outer, last), *i = lit_end(inner, last);
        if (!o)
            continue;
        if (!i || i->len < o->len)
            return false;
        const char *at = last ? i->text + i->len - o->len : i->text;
        if (memcmp(at, o->text, o->len) != 0)
            return false;
    }
    return true;
}

static uint64_t pair_hash(const struct spair *p)
{
    uint64_t h = 0x9e3779b97f4a7c15ull;
    for (size_t w = 0; w < SET_WORDS; w++) {
        h = (h ^ p->in.w[w]) * 0x100000001b3ull;
        h = (h ^ p->out.w[w]) * 0x100000001b3ull;
        h ^= h >> 29;
    }
    return h;
}

int mx_pat_covers(const struct wb_pat *outer, const struct wb_pat *inner, uint64_t *budget)
{
    if (*budget == 0)
        return -E2BIG;
    --*budget;
    if (!ends_agree(outer, inner))
        return 0;
    /* Both patterns are regular; a byte that occurs in neither behaves as every other such
     * byte (digits apart, which captures see), so the bytes of both patterns' literals, one
     * other digit and one other non-digit make an alphabet on which the languages compare as
     * on all bytes. The search walks pairs of state sets (inner, outer) from the start (each
     * pair once: a hash set) and fails where inner accepts and outer does not. */
    enum { MAX_PAIRS = 1024, SLOTS = 2 * MAX_PAIRS };
    struct atoms *ai = malloc(sizeof(*ai)), *ao = malloc(sizeof(*ao));
    struct spair *seen = malloc(MAX_PAIRS * sizeof(*seen));
    uint16_t *slot = calloc(SLOTS, sizeof(*slot)); /* index + 1; 0: empty */
    int r = -ENOMEM;
    if (!ai || !ao || !seen || !slot)
        goto out;
    r = -E2BIG;
    if (!to_atoms(inner, ai) || !to_atoms(outer, ao))
        goto out;
    bool used[256] = {false};
    for (size_t k = 0; k < ai->n; k++)
        if (ai->kind[k] == ATOM_BYTE)
            used[ai->byte[k]] = true;
    for (size_t k = 0; k < ao->n; k++)
        if (ao->kind[k] == ATOM_BYTE)
            used[ao->byte[k]] = true;
    uint8_t alpha[256];
    size_t na = 0;
    bool other_digit = false, other = false;
    for (int c = 1; c < 256; c++) { /* names never hold NUL */
        bool digit = c >= '0' && c <= '9';
        if (used[c] || (digit && !other_digit) || (!digit && !other)) {
            alpha[na++] = (uint8_t)c;
            other_digit |= digit && !used[c];
            other |= !digit && !used[c];
        }
    }
    size_t nseen = 0, head = 0;
    seen[0] = (struct spair){{{0}}, {{0}}};
    set_add(&seen[0].in, 0);
    set_add(&seen[0].out, 0);
    closure(ai, &seen[0].in);
    closure(ao, &seen[0].out);
    slot[pair_hash(&seen[0]) % SLOTS] = 1;
    nseen = 1;
    r = 1;
    while (head < nseen && r == 1) {
        struct spair p = seen[head++];
        if (set_has(&p.in, ai->n) && !set_has(&p.out, ao->n)) {
            r = 0; /* a name inner matches and outer does not */
            break;
        }
        if (*budget < na) {
            r = -E2BIG; /* undecided: the caller's work is bounded */
            break;
        }
        *budget -= na;
        for (size_t x = 0; x < na && r == 1; x++) {
            struct spair q = {step(ai, &p.in, alpha[x]), step(ao, &p.out, alpha[x])};
            bool dead = true;
            for (size_t w = 0; w < SET_WORDS; w++)
                dead &= q.in.w[w] == 0;
            if (dead) /* no name of inner continues this way */
                continue;
            size_t h = pair_hash(&q) % SLOTS;
            while (slot[h] && memcmp(&seen[slot[h] - 1], &q, sizeof(q)) != 0)
                h = (h + 1) % SLOTS;
            if (slot[h])
                continue;
            if (nseen == MAX_PAIRS) {
                r = -E2BIG; /* undecided */
                break;
            }
            seen[nseen] = q;
            slot[h] = (uint16_t)++nseen;
        }
    }
out:
    free(ai);
    free(ao);
    free(seen);
    free(slot);
    return r;
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
