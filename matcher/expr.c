/* expr.c — the integer expression language of model-family files, and name templates.
 *
 * Grammar (C precedence, lowest first):
 *   cond  := or ('?' cond ':' cond)?
 *   or    := and ('||' and)*            and := cmp ('&&' cmp)*
 *   cmp   := rel (('=='|'!=') rel)*      rel := add (('<'|'<='|'>'|'>=') add)*
 *   add   := mul (('+'|'-') mul)*        mul := unary (('*'|'/'|'%') unary)*
 *   unary := ('-'|'!') unary | atom
 *   atom  := INT | NAME | NAME '(' args ')' | '(' cond ')'
 * NAME is [A-Za-z_][A-Za-z0-9_.]* (dots reach into nested config objects). Functions:
 * min(a,b), max(a,b), ceil_div(a,b), defined(name), contains(list, x), boolean(name) (the field
 * as a truth value, refused unless config.json has it as true/false or a job value is 0/1).
 * Values are int64; every + - * checks overflow, / and % check for zero and truncate like C.
 * config.json booleans are truth values: conditions, == and != take them, arithmetic and
 * numbers (shapes, loop bounds, names) do not.
 * An expression compiles once into a node array and is evaluated many times (the generator
 * evaluates shapes ~100k times for Kimi-K2), so evaluation does no allocation.
 * Parsing and evaluation recurse, so nesting is bounded: an expression whose parentheses, unary
 * operators, ternaries or operator chains nest deeper than EXPR_MAX_DEPTH is refused when it is
 * compiled (real family files nest fewer than 10 levels). */
#include "matcher/mpriv.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EXPR_MAX_DEPTH 200

enum xop {
    X_NUM,
    X_NAME,
    X_NEG,
    X_NOT,
    X_MUL,
    X_DIV,
    X_MOD,
    X_ADD,
    X_SUB,
    X_LT,
    X_LE,
    X_GT,
    X_GE,
    X_EQ,
    X_NE,
    X_AND,
    X_OR,
    X_COND,
    X_MIN,
    X_MAX,
    X_CEILDIV,
    X_DEFINED,
    X_CONTAINS,
    X_BOOLEAN,
};

struct xnode {
    enum xop op;
    int32_t a, b, c; /* child node indexes */
    uint32_t depth;  /* 1 + the deepest child's: bounds eval()'s recursion */
    int64_t num;
    uint32_t name_off, name_len; /* X_NAME, X_DEFINED, X_CONTAINS (the list name) */
};

struct wb_expr {
    char *text;
    struct xnode *n;
    size_t nn, cap;
    int32_t root;
};

/* ---------------------------------------------------------------- parser */

struct parser {
    struct wb_expr *e;
    const char *s;
    size_t pos;
    char *err;
    size_t errcap;
    int failed;
    unsigned nest; /* parse_cond/parse_unary calls in progress */
};

static void skip_ws(struct parser *p)
{
    while (p->s[p->pos] == ' ' || p->s[p->pos] == '\t')
        p->pos++;
}

static int fail(struct parser *p, const char *what)
{
    if (!p->failed) {
        char tok[32];
        if (!p->s[p->pos])
            snprintf(tok, sizeof(tok), "end of expression");
        else if (isalnum((unsigned char)p->s[p->pos]) || p->s[p->pos] == '_') {
            size_t n = 0;
            while (n < sizeof(tok) - 3 && (isalnum((unsigned char)p->s[p->pos + n]) ||
                                           p->s[p->pos + n] == '_' || p->s[p->pos + n] == '.'))
                n++;
            snprintf(tok, sizeof(tok), "'%.*s'", (int)n, p->s + p->pos);
        } else
            snprintf(tok, sizeof(tok), "'%c'", p->s[p->pos]);
        snprintf(p->err, p->errcap, "%s %s at column %zu", what, tok, p->pos + 1);
        p->failed = 1;
    }
    return -1;
}

static int too_deep(struct parser *p)
{
    if (!p->failed) {
        snprintf(p->err, p->errcap, "expression nested deeper than %d levels at column %zu",
                 EXPR_MAX_DEPTH, p->pos + 1);
        p->failed = 1;
    }
    return -1;
}

static int32_t add_node3(struct parser *p, enum xop op, int32_t a, int32_t b, int32_t c)
{
    struct wb_expr *e = p->e;
    uint32_t depth = 0;
    int32_t kids[3] = {a, b, c};
    for (int k = 0; k < 3; k++)
        if (kids[k] >= 0 && e->n[kids[k]].depth > depth)
            depth = e->n[kids[k]].depth;
    if (++depth > EXPR_MAX_DEPTH)
        return too_deep(p);
    if (e->nn == e->cap && wb_grow(&e->n, &e->cap, 16, sizeof(*e->n)) != 0) {
        snprintf(p->err, p->errcap, "out of memory");
        p->failed = 1;
        return -1;
    }
    e->n[e->nn] = (struct xnode){.op = op, .a = a, .b = b, .c = c, .depth = depth};
    return (int32_t)e->nn++;
}

static int32_t add_node(struct parser *p, enum xop op, int32_t a, int32_t b)
{
    return add_node3(p, op, a, b, -1);
}

static bool accept(struct parser *p, const char *tok)
{
    skip_ws(p);
    size_t n = strlen(tok);
    if (strncmp(p->s + p->pos, tok, n) != 0)
        return false;
    /* "<" must not swallow "<=", "!" must not swallow "!=" */
    if (n == 1 && (tok[0] == '<' || tok[0] == '>' || tok[0] == '!' || tok[0] == '=') &&
        p->s[p->pos + 1] == '=')
        return false;
    p->pos += n;
    return true;
}

static int32_t parse_cond(struct parser *p);

static int32_t parse_name_or_call(struct parser *p)
{
    size_t start = p->pos;
    while (isalnum((unsigned char)p->s[p->pos]) || p->s[p->pos] == '_' || p->s[p->pos] == '.')
        p->pos++;
    size_t len = p->pos - start;
    skip_ws(p);
    if (p->s[p->pos] != '(') {
        int32_t n = add_node(p, X_NAME, -1, -1);
        if (n >= 0) {
            p->e->n[n].name_off = (uint32_t)start;
            p->e->n[n].name_len = (uint32_t)len;
        }
        return n;
    }
    static const struct {
        const char *name;
        enum xop op;
        int nargs;
    } fns[] = {{"min", X_MIN, 2},         {"max", X_MAX, 2},           {"ceil_div", X_CEILDIV, 2},
               {"defined", X_DEFINED, 1}, {"contains", X_CONTAINS, 2}, {"boolean", X_BOOLEAN, 1}};
    size_t f = 0;
    while (f < WB_ARRAY_LEN(fns) &&
           !(strlen(fns[f].name) == len && strncmp(fns[f].name, p->s + start, len) == 0))
        f++;
    if (f == WB_ARRAY_LEN(fns)) {
        p->pos = start;
        return fail(p, "unknown function");
    }
    p->pos++; /* '(' */
    int32_t args[2] = {-1, -1};
    uint32_t name_off = 0, name_len = 0;
    for (int i = 0; i < fns[f].nargs; i++) {
        if (i && !accept(p, ","))
            return fail(p, "expected ',' but found");
        skip_ws(p);
        if (i == 0 &&
            (fns[f].op == X_DEFINED || fns[f].op == X_CONTAINS || fns[f].op == X_BOOLEAN)) {
            /* the first argument is a field name, not a value */
            if (!(isalpha((unsigned char)p->s[p->pos]) || p->s[p->pos] == '_'))
                return fail(p, "expected a field name but found");
            name_off = (uint32_t)p->pos;
            while (isalnum((unsigned char)p->s[p->pos]) || p->s[p->pos] == '_' ||
                   p->s[p->pos] == '.')
                p->pos++;
            name_len = (uint32_t)(p->pos - name_off);
            continue;
        }
        args[i] = parse_cond(p);
        if (args[i] < 0)
            return -1;
    }
    if (!accept(p, ")"))
        return fail(p, "expected ')' but found");
    int32_t n = add_node(p, fns[f].op, args[0], args[1]);
    if (n >= 0) {
        p->e->n[n].name_off = name_off;
        p->e->n[n].name_len = name_len;
    }
    return n;
}

static int32_t parse_atom(struct parser *p)
{
    skip_ws(p);
    char c = p->s[p->pos];
    if (isdigit((unsigned char)c)) {
        size_t start = p->pos;
        int64_t v = 0;
        while (isdigit((unsigned char)p->s[p->pos])) {
            if (__builtin_mul_overflow(v, 10, &v) ||
                __builtin_add_overflow(v, p->s[p->pos] - '0', &v)) {
                p->pos = start;
                return fail(p, "number too large:");
            }
            p->pos++;
        }
        if (isalpha((unsigned char)p->s[p->pos]) || p->s[p->pos] == '_')
            return fail(p, "unexpected");
        int32_t n = add_node(p, X_NUM, -1, -1);
        if (n >= 0)
            p->e->n[n].num = v;
        return n;
    }
    if (isalpha((unsigned char)c) || c == '_')
        return parse_name_or_call(p);
    if (c == '(') {
        p->pos++;
        int32_t n = parse_cond(p);
        if (n < 0)
            return -1;
        if (!accept(p, ")"))
            return fail(p, "expected ')' but found");
        return n;
    }
    return fail(p, "unexpected");
}

static int32_t parse_unary(struct parser *p)
{
    enum xop op;
    if (accept(p, "-"))
        op = X_NEG;
    else if (accept(p, "!"))
        op = X_NOT;
    else
        return parse_atom(p);
    if (++p->nest > EXPR_MAX_DEPTH)
        return too_deep(p);
    int32_t a = parse_unary(p);
    p->nest--;
    return a < 0 ? -1 : add_node(p, op, a, -1);
}

static int32_t parse_mul(struct parser *p)
{
    int32_t a = parse_unary(p);
    while (a >= 0) {
        enum xop op;
        if (accept(p, "*"))
            op = X_MUL;
        else if (accept(p, "/"))
            op = X_DIV;
        else if (accept(p, "%"))
            op = X_MOD;
        else
            break;
        int32_t b = parse_unary(p);
        a = b < 0 ? -1 : add_node(p, op, a, b);
    }
    return a;
}

static int32_t parse_add(struct parser *p)
{
    int32_t a = parse_mul(p);
    while (a >= 0) {
        enum xop op;
        if (accept(p, "+"))
            op = X_ADD;
        else if (accept(p, "-"))
            op = X_SUB;
        else
            break;
        int32_t b = parse_mul(p);
        a = b < 0 ? -1 : add_node(p, op, a, b);
    }
    return a;
}

/* C precedence: relational operators bind tighter than equality ones */
static int32_t parse_rel(struct parser *p)
{
    static const struct {
        const char *tok;
        enum xop op;
    } ops[] = {{"<=", X_LE}, {">=", X_GE}, {"<", X_LT}, {">", X_GT}};
    int32_t a = parse_add(p);
    for (bool more = true; a >= 0 && more;) {
        more = false;
        for (size_t i = 0; i < WB_ARRAY_LEN(ops); i++)
            if (accept(p, ops[i].tok)) {
                int32_t b = parse_add(p);
                a = b < 0 ? -1 : add_node(p, ops[i].op, a, b);
                more = true;
                break;
            }
    }
    return a;
}

static int32_t parse_cmp(struct parser *p)
{
    int32_t a = parse_rel(p);
    while (a >= 0) {
        enum xop op;
        if (accept(p, "=="))
            op = X_EQ;
        else if (accept(p, "!="))
            op = X_NE;
        else
            break;
        int32_t b = parse_rel(p);
        a = b < 0 ? -1 : add_node(p, op, a, b);
    }
    return a;
}

static int32_t parse_and(struct parser *p)
{
    int32_t a = parse_cmp(p);
    while (a >= 0 && accept(p, "&&")) {
        int32_t b = parse_cmp(p);
        a = b < 0 ? -1 : add_node(p, X_AND, a, b);
    }
    return a;
}

static int32_t parse_or(struct parser *p)
{
    int32_t a = parse_and(p);
    while (a >= 0 && accept(p, "||")) {
        int32_t b = parse_and(p);
        a = b < 0 ? -1 : add_node(p, X_OR, a, b);
    }
    return a;
}

static int32_t parse_cond3(struct parser *p)
{
    int32_t a = parse_or(p);
    if (a < 0 || !accept(p, "?"))
        return a;
    int32_t b = parse_cond(p);
    if (b < 0)
        return -1;
    if (!accept(p, ":"))
        return fail(p, "expected ':' but found");
    int32_t c = parse_cond(p);
    if (c < 0)
        return -1;
    return add_node3(p, X_COND, a, b, c);
}

/* Every nesting ('(', a function's argument, a ternary's branch) passes here. */
static int32_t parse_cond(struct parser *p)
{
    if (++p->nest > EXPR_MAX_DEPTH)
        return too_deep(p);
    int32_t n = parse_cond3(p);
    p->nest--;
    return n;
}

int mx_expr_compile(const char *text, struct wb_expr **out, char *err, size_t errcap)
{
    struct wb_expr *e = calloc(1, sizeof(*e));
    if (!e || !(e->text = strdup(text))) {
        free(e);
        snprintf(err, errcap, "out of memory");
        return -ENOMEM;
    }
    struct parser p = {.e = e, .s = e->text, .err = err, .errcap = errcap};
    skip_ws(&p);
    if (!p.s[p.pos]) {
        fail(&p, "empty expression:");
    } else {
        e->root = parse_cond(&p);
        skip_ws(&p);
        if (e->root >= 0 && p.s[p.pos])
            fail(&p, "unexpected");
    }
    if (p.failed) {
        mx_expr_free(e);
        return -EINVAL;
    }
    *out = e;
    return 0;
}

void mx_expr_free(struct wb_expr *e)
{
    if (!e)
        return;
    free(e->n);
    free(e->text);
    free(e);
}

const char *mx_expr_text(const struct wb_expr *e)
{
    return e->text;
}

/* ---------------------------------------------------------------- evaluation */

struct ectx {
    const struct wb_expr *e;
    struct wb_xenv *env;
    char *err;
    size_t errcap;
};

/* A value and whether it is a config.json boolean (true/false): booleans are truth values for
 * conditions (!, &&, ||, ?:, comparisons) but never numbers, so that "num_hidden_layers: true"
 * is an error instead of one layer. `name` is the field it came from, for messages. */
struct xval {
    int64_t v;
    const char *name; /* non-NULL: a boolean read from this field */
    size_t len;
};

static int eval(struct ectx *x, int32_t i, struct xval *out);

static int not_a_number(struct ectx *x, const struct xval *v)
{
    snprintf(x->err, x->errcap, "field '%.*s' is a boolean (%s), not a number", (int)v->len,
             v->name, v->v ? "true" : "false");
    return -EINVAL;
}

/* Looks a name up: loop variables, config, derived values. Returns 0, -ENOENT, or an error
 * of evaluating the derived value. A config list or non-integer is reported as -EINVAL. */
static int lookup(struct ectx *x, const char *name, size_t len, struct xval *out)
{
    struct wb_xenv *env = x->env;
    *out = (struct xval){0};
    for (size_t i = 0; i < env->nvars; i++)
        if (strlen(env->vars[i].name) == len && memcmp(env->vars[i].name, name, len) == 0) {
            out->v = env->vars[i].value;
            return 0;
        }
    for (size_t i = 0; i < env->nsets; i++)
        if (strlen(env->sets[i].name) == len && memcmp(env->sets[i].name, name, len) == 0) {
            out->v = env->sets[i].value;
            return 0;
        }
    const struct wb_jval *v = env->cfg ? mx_jcfg_get(env->cfg, name, len) : NULL;
    if (v) {
        if (v->kind == WB_J_INT) {
            out->v = v->i;
            if (v->is_bool) {
                out->name = v->name;
                out->len = strlen(v->name);
            }
            return 0;
        }
        snprintf(x->err, x->errcap, "field '%.*s' is not an integer (%s)", (int)len, name,
                 v->kind == WB_J_LIST ? "a list" : v->text);
        return -EINVAL;
    }
    for (size_t i = 0; i < env->nderived; i++) {
        const struct wb_xderived *d = &env->derived[i];
        if (strlen(d->name) != len || memcmp(d->name, name, len) != 0)
            continue;
        if (env->depth > 16) {
            snprintf(x->err, x->errcap, "'%s' is defined in terms of itself (%s)", d->name,
                     d->where);
            return -EINVAL;
        }
        env->depth++;
        struct ectx sub = {.e = d->e, .env = env, .err = x->err, .errcap = x->errcap};
        int r = eval(&sub, d->e->root, out);
        env->depth--;
        return r;
    }
    snprintf(x->err, x->errcap, "missing field '%.*s'", (int)len, name);
    return -ENOENT;
}

static int eval(struct ectx *x, int32_t i, struct xval *out)
{
    const struct xnode *n = &x->e->n[i];
    const char *name = x->e->text + n->name_off;
    struct xval a = {0}, b = {0};
    int r;
    *out = (struct xval){0};
    switch (n->op) {
    case X_NUM:
        out->v = n->num;
        return 0;
    case X_NAME:
        return lookup(x, name, n->name_len, out);
    case X_DEFINED: {
        const struct wb_jval *v = x->env->cfg ? mx_jcfg_get(x->env->cfg, name, n->name_len) : NULL;
        if (v) {
            out->v = 1;
            return 0;
        }
        for (size_t k = 0; k < x->env->nvars; k++)
            if (strlen(x->env->vars[k].name) == n->name_len &&
                memcmp(x->env->vars[k].name, name, n->name_len) == 0) {
                out->v = 1;
                return 0;
            }
        for (size_t k = 0; k < x->env->nsets; k++)
            if (strlen(x->env->sets[k].name) == n->name_len &&
                memcmp(x->env->sets[k].name, name, n->name_len) == 0) {
                out->v = 1;
                return 0;
            }
        /* a nested object counts as defined when any of its fields is */
        if (x->env->cfg)
            for (size_t k = 0; k < x->env->cfg->n; k++) {
                const char *f = x->env->cfg->v[k].name;
                if (strncmp(f, name, n->name_len) == 0 && f[n->name_len] == '.') {
                    out->v = 1;
                    return 0;
                }
            }
        out->v = 0;
        return 0;
    }
    case X_BOOLEAN: {
        /* "tie_word_embeddings: 2" is not a boolean: refused instead of read as true */
        if ((r = lookup(x, name, n->name_len, &a)))
            return r;
        bool job = false; /* a loop variable or a job's value: 0 or 1 */
        for (size_t k = 0; k < x->env->nvars; k++)
            job |= strlen(x->env->vars[k].name) == n->name_len &&
                   memcmp(x->env->vars[k].name, name, n->name_len) == 0;
        for (size_t k = 0; k < x->env->nsets; k++)
            job |= strlen(x->env->sets[k].name) == n->name_len &&
                   memcmp(x->env->sets[k].name, name, n->name_len) == 0;
        const struct wb_jval *v = x->env->cfg ? mx_jcfg_get(x->env->cfg, name, n->name_len) : NULL;
        if (!job && v && !v->is_bool) {
            snprintf(x->err, x->errcap,
                     "field '%.*s' is %" PRId64 ", not a boolean (true or false)", (int)n->name_len,
                     name, a.v);
            return -EINVAL;
        }
        if (a.v != 0 && a.v != 1) {
            snprintf(x->err, x->errcap, "'%.*s' is %" PRId64 ", not a boolean (0 or 1)",
                     (int)n->name_len, name, a.v);
            return -EINVAL;
        }
        *out = a;
        return 0;
    }
    case X_CONTAINS: {
        const struct wb_jval *v = x->env->cfg ? mx_jcfg_get(x->env->cfg, name, n->name_len) : NULL;
        if (!v) {
            snprintf(x->err, x->errcap, "missing field '%.*s'", (int)n->name_len, name);
            return -ENOENT;
        }
        if (v->kind != WB_J_LIST) {
            snprintf(x->err, x->errcap, "field '%.*s' is not a list of integers", (int)n->name_len,
                     name);
            return -EINVAL;
        }
        if ((r = eval(x, n->b, &a))) /* a is the value looked for */
            return r;
        if (a.name)
            return not_a_number(x, &a);
        out->v = 0;
        for (size_t k = 0; k < v->nlist; k++)
            if (v->list[k] == a.v)
                out->v = 1;
        return 0;
    }
    case X_AND:
    case X_OR:
        if ((r = eval(x, n->a, &a)))
            return r;
        if ((n->op == X_AND && !a.v) || (n->op == X_OR && a.v)) {
            out->v = n->op == X_OR;
            return 0;
        }
        if ((r = eval(x, n->b, &b)))
            return r;
        out->v = b.v != 0;
        return 0;
    case X_COND:
        if ((r = eval(x, n->a, &a)))
            return r;
        return eval(x, a.v ? n->b : n->c, out);
    default:
        break;
    }
    if ((r = eval(x, n->a, &a)))
        return r;
    if (n->op == X_NOT) {
        out->v = !a.v;
        return 0;
    }
    if (n->op == X_NEG) {
        if (a.name)
            return not_a_number(x, &a);
        if (a.v == INT64_MIN)
            goto overflow;
        out->v = -a.v;
        return 0;
    }
    if ((r = eval(x, n->b, &b)))
        return r;
    bool cmp = n->op == X_EQ || n->op == X_NE;
    if (!cmp && (a.name || b.name)) /* == and != compare a boolean with 0/1; nothing else may */
        return not_a_number(x, a.name ? &a : &b);
    int64_t *o = &out->v;
    switch (n->op) {
    case X_ADD:
        if (__builtin_add_overflow(a.v, b.v, o))
            goto overflow;
        return 0;
    case X_SUB:
        if (__builtin_sub_overflow(a.v, b.v, o))
            goto overflow;
        return 0;
    case X_MUL:
        if (__builtin_mul_overflow(a.v, b.v, o))
            goto overflow;
        return 0;
    case X_DIV:
    case X_MOD:
    case X_CEILDIV:
        if (b.v == 0) {
            snprintf(x->err, x->errcap, "division by zero");
            return -EDOM;
        }
        if (a.v == INT64_MIN && b.v == -1)
            goto overflow;
        if (n->op == X_DIV)
            *o = a.v / b.v;
        else if (n->op == X_MOD)
            *o = a.v % b.v;
        else
            *o = a.v / b.v + ((a.v % b.v != 0) && ((a.v < 0) == (b.v < 0)));
        return 0;
    case X_MIN:
        *o = a.v < b.v ? a.v : b.v;
        return 0;
    case X_MAX:
        *o = a.v > b.v ? a.v : b.v;
        return 0;
    case X_LT:
        *o = a.v < b.v;
        return 0;
    case X_LE:
        *o = a.v <= b.v;
        return 0;
    case X_GT:
        *o = a.v > b.v;
        return 0;
    case X_GE:
        *o = a.v >= b.v;
        return 0;
    case X_EQ:
        *o = a.v == b.v;
        return 0;
    case X_NE:
        *o = a.v != b.v;
        return 0;
    default:
        snprintf(x->err, x->errcap, "internal error: bad node");
        return -EINVAL;
    }
overflow:
    snprintf(x->err, x->errcap, "integer overflow");
    return -ERANGE;
}

int mx_expr_eval(const struct wb_expr *e, struct wb_xenv *env, int64_t *out, char *err,
                 size_t errcap)
{
    struct ectx x = {.e = e, .env = env, .err = err, .errcap = errcap};
    struct xval v;
    int r = eval(&x, e->root, &v);
    if (r == 0)
        *out = v.v;
    return r;
}

int mx_expr_eval_num(const struct wb_expr *e, struct wb_xenv *env, int64_t *out, char *err,
                     size_t errcap)
{
    struct ectx x = {.e = e, .env = env, .err = err, .errcap = errcap};
    struct xval v;
    int r = eval(&x, e->root, &v);
    if (r == 0 && v.name)
        r = not_a_number(&x, &v);
    if (r == 0)
        *out = v.v;
    return r;
}

/* ---------------------------------------------------------------- templates */

struct tpiece {
    char *lit; /* literal text (when e is NULL) */
    size_t len;
    struct wb_expr *e; /* {expression} */
};

struct wb_tmpl {
    struct tpiece *p;
    size_t n;
};

void mx_tmpl_free(struct wb_tmpl *t)
{
    if (!t)
        return;
    for (size_t i = 0; i < t->n; i++) {
        free(t->p[i].lit);
        mx_expr_free(t->p[i].e);
    }
    free(t->p);
    free(t);
}

int mx_tmpl_compile(const char *text, struct wb_tmpl **out, char *err, size_t errcap)
{
    struct wb_tmpl *t = calloc(1, sizeof(*t));
    size_t len = strlen(text);
    if (!t || !(t->p = calloc(len + 1, sizeof(*t->p)))) {
        free(t);
        snprintf(err, errcap, "out of memory");
        return -ENOMEM;
    }
    const char *s = text;
    while (*s) {
        struct tpiece *pc = &t->p[t->n];
        if (*s == '{') {
            const char *end = strchr(s, '}');
            if (!end) {
                snprintf(err, errcap, "'{' without '}' at column %zu", (size_t)(s - text) + 1);
                goto err;
            }
            char inner[256], sub[200];
            snprintf(inner, sizeof(inner), "%.*s", (int)(end - s - 1), s + 1);
            if (mx_expr_compile(inner, &pc->e, sub, sizeof(sub))) {
                snprintf(err, errcap, "in '{%s}': %s", inner, sub);
                goto err;
            }
            t->n++;
            s = end + 1;
            continue;
        }
        if (*s == '}') {
            snprintf(err, errcap, "'}' without '{' at column %zu", (size_t)(s - text) + 1);
            goto err;
        }
        size_t n = strcspn(s, "{}");
        if (!(pc->lit = strndup(s, n))) {
            snprintf(err, errcap, "out of memory");
            goto err;
        }
        pc->len = n;
        t->n++;
        s += n;
    }
    *out = t;
    return 0;
err:
    mx_tmpl_free(t);
    return -EINVAL;
}

int mx_tmpl_render(const struct wb_tmpl *t, struct wb_xenv *env, char *buf, size_t cap, char *err,
                   size_t errcap)
{
    size_t pos = 0;
    for (size_t i = 0; i < t->n; i++) {
        const struct tpiece *pc = &t->p[i];
        char num[24];
        const char *src = pc->lit;
        size_t n = pc->len;
        if (pc->e) {
            int64_t v;
            int r = mx_expr_eval_num(pc->e, env, &v, err, errcap);
            if (r)
                return r;
            n = (size_t)snprintf(num, sizeof(num), "%lld", (long long)v);
            src = num;
        }
        if (pos + n >= cap) {
            snprintf(err, errcap, "name longer than %zu bytes", cap - 1);
            return -ENAMETOOLONG;
        }
        memcpy(buf + pos, src, n);
        pos += n;
    }
    buf[pos] = 0;
    return 0;
}
