/* register.c — checks what an agent registers against what the plan expects of its rank: a
 * trainer rank must hold exactly the shards the layout gives it (name, dtype, global shape,
 * box), a rollout rank exactly the local tensors of its receive list (name, dtype, local shape).
 * Every missing, extra, duplicated or mis-described tensor is reported together, one line
 * each naming the rank, the tensor, what was expected and what came, so that a user fixes all
 * of them in one round; a refused agent gets nothing of the plan.
 *
 * The expectations are read back from the setup payloads the controller already encoded (the
 * trainers' shard lists, the rollouts' receive lists), so checking costs no memory of its own. */
#include "controller/ctl.h"
#include "route/route.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct entry {
    struct wb_reg_tensor t;
    bool matched;
};

static int cmp_entry(const void *a, const void *b)
{
    return strcmp(((const struct entry *)a)->t.meta.name, ((const struct entry *)b)->t.meta.name);
}

static int cmp_name(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Decodes the registered tensors. */
static int read_registered(const struct wb_bytes *inv, struct entry **out, uint32_t *n)
{
    struct wb_mpr r;
    uint32_t k = 0;
    wb_mpr_init(&r, inv->p, inv->n);
    if (inv->n && wb_mpr_array(&r, WB_WIRE_MAX_ARRAY, &k))
        return -EBADMSG;
    struct entry *e = calloc(k ? k : 1, sizeof(*e));
    if (!e)
        return -ENOMEM;
    for (uint32_t i = 0; i < k; i++)
        if (wb_reg_get(&r, &e[i].t)) {
            free(e);
            return -EBADMSG;
        }
    if (inv->n && wb_mpr_end(&r)) {
        free(e);
        return -EBADMSG;
    }
    qsort(e, k, sizeof(*e), cmp_entry);
    *out = e;
    *n = k;
    return 0;
}

/* The expected tensors of a trainer rank (its shard list) or a rollout rank (its locals). */
static int read_expected(const struct ctl_plan *p, enum wb_role role, uint32_t rank,
                         struct entry **out, uint32_t *n)
{
    struct entry *e = NULL;
    uint32_t k = 0;
    if (role == WB_ROLE_TRAINER) {
        struct wb_mpr r;
        wb_mpr_init(&r, p->shards[rank].buf, p->shards[rank].len);
        if (wb_mpr_array(&r, WB_WIRE_MAX_ARRAY, &k))
            return -EBADMSG;
        e = calloc(k ? k : 1, sizeof(*e));
        if (!e)
            return -ENOMEM;
        for (uint32_t i = 0; i < k; i++) {
            uint32_t two;
            uint64_t tensor;
            if (wb_mpr_array(&r, 2, &two) || two != 2 || wb_mpr_u64(&r, &tensor) ||
                wb_wire_get_tensor_meta(&r, &e[i].t.meta)) {
                free(e);
                return -EBADMSG;
            }
        }
    } else {
        struct wb_recv_list rl;
        int err = wb_recv_list_decode(p->recv[rank].buf, p->recv[rank].len, &rl);
        if (err)
            return err;
        k = rl.nlocal;
        e = calloc(k ? k : 1, sizeof(*e));
        for (uint32_t i = 0; e && i < k; i++) {
            struct wb_tensor_meta *m = &e[i].t.meta;
            snprintf(m->name, sizeof(m->name), "%s", p->rollout_names[rl.local[i].tensor]);
            m->dtype = rl.local[i].dtype;
            m->shape = rl.local[i].shape;
            m->box = wb_box_full(&m->shape);
        }
        wb_recv_list_free(&rl);
        if (!e)
            return -ENOMEM;
    }
    qsort(e, k, sizeof(*e), cmp_entry);
    *out = e;
    *n = k;
    return 0;
}

static const char *shape_s(const struct wb_shape *s, char *buf, size_t cap)
{
    return wb_shape_str(s, buf, cap);
}

static const char *box_s(const struct wb_box *b, char *buf, size_t cap)
{
    return wb_box_str(b, buf, cap);
}

static void describe(const struct wb_tensor_meta *m, enum wb_role role, char *buf, size_t cap)
{
    char a[160], b[320];
    if (role == WB_ROLE_TRAINER)
        snprintf(buf, cap, "%s %s box %s", wb_dtype_name(m->dtype), shape_s(&m->shape, a, 160),
                 box_s(&m->box, b, 320));
    else
        snprintf(buf, cap, "%s %s", wb_dtype_name(m->dtype), shape_s(&m->shape, a, 160));
}

static bool float_dtype(enum wb_dtype d)
{
    return d == WB_DTYPE_BF16 || d == WB_DTYPE_FP16 || d == WB_DTYPE_FP32;
}

/* Compares one matched pair; appends a line per difference. A trainer tensor registered in
 * another floating-point dtype than planned sets *held to it. */
static void compare(FILE *f, const char *who, enum wb_role role, const struct wb_reg_tensor *want,
                    const struct wb_reg_tensor *got, uint32_t *n, enum wb_dtype *held)
{
    char a[320], b[320];
    const char *name = got->meta.name;
    if (got->meta.dtype != want->meta.dtype) {
        enum wb_dtype g = got->meta.dtype, w = want->meta.dtype;
        if (role == WB_ROLE_TRAINER && float_dtype(g) && float_dtype(w))
            *held = g; /* FP32/FP16 masters: one hint line says how to plan for them */
        fprintf(f, "%s: %s: dtype %s, expected %s\n", who, name, wb_dtype_name(g),
                wb_dtype_name(w));
        (*n)++;
    }
    if (!wb_shape_eq(&got->meta.shape, &want->meta.shape)) {
        fprintf(f, "%s: %s: %sshape %s, expected %s\n", who, name,
                role == WB_ROLE_TRAINER ? "global " : "", shape_s(&got->meta.shape, a, sizeof(a)),
                shape_s(&want->meta.shape, b, sizeof(b)));
        (*n)++;
    } else if (!wb_box_eq(&got->meta.box, &want->meta.box)) {
        fprintf(f, "%s: %s: box %s, expected %s\n", who, name, box_s(&got->meta.box, a, sizeof(a)),
                box_s(&want->meta.box, b, sizeof(b)));
        (*n)++;
    }
    if (!wb_reg_contiguous(got)) {
        size_t pos = 0;
        for (uint32_t d = 0; d < got->meta.box.ndim && pos < sizeof(a); d++)
            pos += (size_t)snprintf(a + pos, sizeof(a) - pos, "%s%" PRId64, d ? ", " : "",
                                    got->strides[d]);
        fprintf(f,
                "%s: %s: strides [%s] are not contiguous row-major; register a contiguous tensor\n",
                who, name, a);
        (*n)++;
    }
}

static bool ignored(const struct ctl_plan *p, const char *name)
{
    return p->nignored_names &&
           bsearch(&name, p->ignored_names, p->nignored_names, sizeof(char *), cmp_name) != NULL;
}

int ctl_check_registration(const struct ctl_plan *p, enum wb_role role, uint32_t rank,
                           const struct wb_bytes *inv, char **detail, uint32_t *nproblems)
{
    struct entry *got = NULL, *want = NULL;
    uint32_t ng = 0, nw = 0, n = 0;
    enum wb_dtype held = WB_DTYPE_INVALID;
    char who[64], d[700];
    int err = read_registered(inv, &got, &ng);
    if (err)
        return err;
    if ((err = read_expected(p, role, rank, &want, &nw)) != 0) {
        free(got);
        return err;
    }
    snprintf(who, sizeof(who), "%s rank %u", wb_role_name(role), rank);
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f) {
        free(got);
        free(want);
        return -ENOMEM;
    }
    /* Both lists are sorted by name: one merge walk finds the pairs, the missing and the extra. */
    uint32_t i = 0, j = 0;
    while (i < ng || j < nw) {
        int c = i == ng ? 1 : j == nw ? -1 : strcmp(got[i].t.meta.name, want[j].t.meta.name);
        if (c < 0) {
            if (i + 1 < ng && strcmp(got[i].t.meta.name, got[i + 1].t.meta.name) == 0) {
                fprintf(f, "%s: %s: registered twice\n", who, got[i].t.meta.name);
                n++;
                while (i + 1 < ng && strcmp(got[i].t.meta.name, got[i + 1].t.meta.name) == 0)
                    i++;
            } else if (!got[i].matched && wb_box_numel(&got[i].t.meta.box) > 0 &&
                       !(role == WB_ROLE_TRAINER && ignored(p, got[i].t.meta.name))) {
                /* (an empty shard — a DTensor's last chunk, say — is no tensor at all; a tensor
                 * the model ignores, a DeepSeek MTP layer's copy of the embedding in a
                 * checkpoint reader's share, is one nothing reads) */
                fprintf(f, "%s: %s: registered, but the plan gives this rank no such tensor\n", who,
                        got[i].t.meta.name);
                n++;
            }
            i++;
        } else if (c > 0) {
            describe(&want[j].t.meta, role, d, sizeof(d));
            fprintf(f, "%s: %s: not registered (expected %s)\n", who, want[j].t.meta.name, d);
            n++;
            j++;
        } else {
            compare(f, who, role, &want[j].t, &got[i].t, &n, &held);
            got[i].matched = true;
            /* the same name again is a duplicate, reported when the walk moves past it */
            if (i + 1 < ng && strcmp(got[i].t.meta.name, got[i + 1].t.meta.name) == 0) {
                fprintf(f, "%s: %s: registered twice\n", who, got[i].t.meta.name);
                n++;
                while (i + 1 < ng && strcmp(got[i].t.meta.name, got[i + 1].t.meta.name) == 0)
                    i++;
            }
            i++;
            j++;
        }
    }
    if (held != WB_DTYPE_INVALID) /* a hint, not a problem of its own */
        fprintf(f,
                "%s: trainers holding %s parameters say so in the trainer layout (`dtype: %s`, or "
                "`dtypes:` per tensor), or leave trainer_layout out to plan for the dtypes they "
                "register; the rollouts get them cast\n",
                who, wb_dtype_name(held), wb_dtype_name(held));
    free(got);
    free(want);
    if (fclose(f)) {
        free(text);
        return -ENOMEM;
    }
    *nproblems = n;
    *detail = text;
    return 0;
}

/* ---------------------------------------------------------------- sources */

int ctl_sources_init(struct ctl_sources *s, const struct wb_controller_opts *o)
{
    memset(s, 0, sizeof(*s));
    if (!o || !(o->source || o->sources))
        return 0;
    uint32_t n = o->sources ? o->nsources : 1;
    if (!(s->id = calloc(n ? n : 1, sizeof(char *))))
        return -ENOMEM;
    s->n = n;
    for (uint32_t i = 0; i < n; i++)
        if (!(s->id[i] = strdup(o->sources ? o->sources[i] : o->source)))
            return -ENOMEM;
    if (!o->sources || !o->parts)
        return 0;
    if (!(s->parts = calloc(n ? n : 1, sizeof(*s->parts))))
        return -ENOMEM;
    for (uint32_t i = 0; i < n; i++) {
        const struct wb_source_parts *from = &o->parts[i];
        struct ctl_parts *to = &s->parts[i];
        if (!from->n)
            continue;
        to->digests = malloc((size_t)from->n * 16);
        to->what = calloc(from->n, sizeof(char *));
        if (!to->digests || !to->what)
            return -ENOMEM;
        to->n = from->n;
        memcpy(to->digests, from->digests, (size_t)from->n * 16);
        for (uint32_t k = 0; k < from->n; k++)
            if (!(to->what[k] = strdup(from->what[k])))
                return -ENOMEM;
    }
    return 0;
}

void ctl_sources_free(struct ctl_sources *s)
{
    for (uint32_t i = 0; s->id && i < s->n; i++)
        free(s->id[i]);
    for (uint32_t i = 0; s->parts && i < s->n; i++) {
        for (uint32_t k = 0; s->parts[i].what && k < s->parts[i].n; k++)
            free(s->parts[i].what[k]);
        free(s->parts[i].what);
        free(s->parts[i].digests);
    }
    free(s->id);
    free(s->parts);
    memset(s, 0, sizeof(*s));
}

/* The length of a source's identity before its content hash (" content " and what follows):
 * two sources alike up to there read the same files, headers and share. */
static size_t before_content(const char *id)
{
    const char *c = strstr(id, " content ");
    return c ? (size_t)(c - id) : strlen(id);
}

int ctl_sources_check(const struct ctl_sources *s, uint32_t rank, const char *have,
                      const struct wb_bytes *digests, char *msg, size_t cap)
{
    if (!s->n || (s->n > 1 && rank >= s->n))
        return 0;
    uint32_t k = s->n == 1 ? 0 : rank;
    const char *want = s->id[k];
    if (!strcmp(have, want))
        return 0;
    int len = snprintf(msg, cap, "register: trainer rank %u reads %s, the job moves %s", rank,
                       *have ? have : "its own memory", want);
    /* Only the content differs: the parts are the same pieces of the same tensors on both
     * sides, so their digests say which hold other bytes. */
    const struct ctl_parts *p = s->parts ? &s->parts[k] : NULL;
    size_t pre = before_content(want);
    if (!p || !p->n || digests->n != (size_t)p->n * 16 || pre != before_content(have) ||
        strncmp(have, want, pre) || len < 0 || (size_t)len >= cap)
        return -WB_E_CONFIG;
    const uint8_t *d = digests->p;
    uint32_t first = UINT32_MAX, ndiff = 0;
    for (uint32_t i = 0; i < p->n; i++)
        if (memcmp(d + (size_t)i * 16, p->digests + (size_t)i * 16, 16)) {
            first = ndiff++ ? first : i;
        }
    if (ndiff)
        snprintf(msg + len, cap - (size_t)len,
                 "; %u of the share's %u tensors differ, the first: %s", ndiff, p->n,
                 p->what[first]);
    return -WB_E_CONFIG;
}
