/* verify.c — the independent reference a transfer is checked against: what every byte of a
 * rollout rank's tensors must be after version N, computed without the planner or the executor.
 *
 * For each mapping of the match (matcher/): regenerate each component's trainer values from
 * the synthetic source (common/: deterministic per name, seed and version), place them in the
 * global rollout tensor (fusion, stacking), transform it whole with quant/'s CPU reference
 * (copy, cast, or FP8 128x128 block quantization with its scale tensor), then cut out the boxes
 * the rollout rank holds (wb_mapping_local()). The result is compared with the file a rollout
 * agent writes after each complete version (wb-agent --dump). */
#include "controller/ctl.h"
#include "matcher/matcher.h"
#include "planner/planner.h"
#include "quant/quant.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct wb_ref {
    uint64_t seed;
    uint64_t change_period; /* the job's synthetic_change (wb_job_change_period) */
    struct wb_model md;
};

int wb_ref_load(const struct wb_job *job, struct wb_ref **out, struct wb_errlist *el)
{
    if (!*job->model.rules) {
        wb_errlist_add(el, "job %s: no model: nothing to verify", job->name);
        return -EINVAL;
    }
    struct wb_ref *f = calloc(1, sizeof(*f));
    if (!f)
        return -ENOMEM;
    struct wb_model_src src;
    ctl_model_src(job, &src);
    f->seed = job->seed;
    f->change_period = wb_job_change_period(job);
    /* A job whose trainer layout is derived or laid out by a broadcast's coordinator: the
     * rollout layout alone says what each rollout holds. */
    bool rollout_only = !*job->trainer_layout;
    if (rollout_only)
        src.trainer_layout = src.rollout_layout = NULL;
    int err = wb_model_load(&src, &f->md, el);
    if (!err && rollout_only) {
        err = wb_rollout_layout_load(job->rollout_layout, &f->md.rl, el);
        f->md.have_layouts = err == 0; /* freed with the model; tl stays zeroed */
        if (err)
            wb_model_free(&f->md);
    }
    if (err) {
        free(f);
        return err;
    }
    *out = f;
    return 0;
}

void wb_ref_free(struct wb_ref *f)
{
    if (!f)
        return;
    wb_model_free(&f->md);
    free(f);
}

uint32_t wb_ref_nrollouts(const struct wb_ref *f)
{
    return f->md.rl.replicas * f->md.rl.gpus_per_replica;
}

/* One expected local tensor. */
struct expect {
    uint32_t tensor;
    uint64_t bytes;
    uint8_t *buf;
    uint8_t *mask; /* per byte, 1 where the reference knows it; NULL: every byte. Rows nothing
                      writes (vocab padding) hold whatever the engine put there. */
    bool seen;     /* found in the dump already */
};

/* Marks the bytes of box b (of a tensor of shape s, elem bytes per element) in mask. */
static int mark_box(uint8_t *mask, const struct wb_shape *s, const struct wb_box *b, size_t elem)
{
    struct wb_ranges it;
    int rc = wb_ranges_init(&it, s, b, elem);
    uint64_t off, len;
    while (!rc && wb_ranges_next(&it, &off, &len))
        memset(mask + off, 1, len);
    return rc;
}

/* The global rollout tensor of mapping m at `version`, transformed: values (dst dtype) and, for
 * FP8, the scale tensor. */
static int global_values(const struct wb_ref *f, const struct wb_mapping *m, uint64_t version,
                         uint8_t **vals, float **scales, char *msg, size_t cap)
{
    const struct wb_param *rp = &f->md.rollout.p[m->rollout];
    uint64_t n = wb_shape_numel(&rp->shape);
    size_t es = wb_dtype_size(m->src_dtype);
    uint8_t *g = calloc(n ? n : 1, es), *part = NULL;
    uint8_t *v = NULL;
    float *s = NULL;
    int rc = g ? 0 : -ENOMEM;
    for (uint32_t c = 0; !rc && c < m->ncomp; c++) {
        const struct wb_component *cp = &m->comp[c];
        const struct wb_param *tp = &f->md.trainer.p[cp->trainer];
        if (cp->trainer_scale >= 0 || m->fp8_scales) {
            snprintf(msg, cap, "%s: FP8 trainer checkpoints are not covered by the reference",
                     rp->name);
            rc = -ENOTSUP;
            break;
        }
        free(part);
        part = malloc(2 * wb_box_numel(&cp->src) * es + 1);
        rc = part ? wb_synth_fill_change(tp->name, f->seed, version, f->change_period, tp->dtype,
                                         &tp->shape, &cp->src, part)
                  : -ENOMEM;
        if (!rc && cp->permuted) { /* dst = src.permute(perm), packed in the upper half */
            uint8_t *t = part + wb_box_numel(&cp->src) * es;
            rc = wb_permute(t, part, es, cp->src.ndim, cp->src.ext, cp->perm);
            if (!rc)
                memcpy(part, t, wb_box_numel(&cp->src) * es);
        }
        if (!rc)
            rc = wb_quant_unpack(&(struct wb_quant_exec){WB_QUANT_HOST, NULL}, m->src_dtype,
                                 &rp->shape, &cp->dst, part, g);
        if (rc && !*msg)
            snprintf(msg, cap, "%.200s: component %.200s: %s", rp->name, tp->name, wb_strerror(rc));
    }
    free(part);
    const struct wb_quant_exec host = {WB_QUANT_HOST, NULL};
    if (!rc && m->xform == WB_XFORM_FP8_BLOCK) {
        uint32_t nd = rp->shape.ndim;
        uint64_t rows = nd >= 2 ? rp->shape.dim[nd - 2] : 1, cols = rp->shape.dim[nd - 1];
        uint64_t lead = (rows && cols) ? n / (rows * cols) : 0;
        uint64_t gs = wb_quant_blocks(rows) * wb_quant_blocks(cols);
        v = malloc(n ? n : 1);
        s = malloc(((lead && gs) ? lead * gs : 1) * sizeof(float));
        rc = v && s ? 0 : -ENOMEM;
        enum wb_dtype qt = m->src_dtype;
        if (!rc && qt == WB_DTYPE_FP32) {      /* quantized from its BF16 cast, as the agent does */
            for (uint64_t i = 0; i < n; i++) { /* in place: element i lands on bytes read already */
                float x;
                memcpy(&x, g + i * 4, 4);
                uint16_t h = wb_f32_to_bf16(x);
                memcpy(g + i * 2, &h, 2);
            }
            qt = WB_DTYPE_BF16;
            es = 2;
        }
        for (uint64_t l = 0; !rc && l < lead; l++)
            rc = wb_quant_fp8_block(&host, qt, g + l * rows * cols * es, rows, cols,
                                    v + l * rows * cols, s + l * gs);
    } else if (!rc && m->xform == WB_XFORM_CAST) {
        v = malloc((n ? n : 1) * wb_dtype_size(m->dst_dtype));
        rc = v ? wb_quant_cast(&host, m->src_dtype, g, m->dst_dtype, v, n) : -ENOMEM;
    } else if (!rc) {
        v = g;
        g = NULL;
    }
    free(g);
    if (rc) {
        free(v);
        free(s);
        if (!*msg)
            snprintf(msg, cap, "%s: %s", rp->name, wb_strerror(rc));
        return rc;
    }
    *vals = v;
    *scales = s;
    return 0;
}

/* Box `src` of the tensor (shape gs) at g into box `dst` of the tensor (shape ls) at l. */
static int move_box(enum wb_dtype dt, const struct wb_shape *gs, const struct wb_box *src,
                    const void *g, const struct wb_shape *ls, const struct wb_box *dst, void *l)
{
    const struct wb_quant_exec host = {WB_QUANT_HOST, NULL};
    void *tmp = malloc(wb_box_numel(src) * wb_dtype_size(dt) + 1);
    if (!tmp)
        return -ENOMEM;
    int rc = wb_quant_pack(&host, dt, gs, src, g, tmp);
    rc = rc ? rc : wb_quant_unpack(&host, dt, ls, dst, tmp, l);
    free(tmp);
    return rc;
}

static struct wb_shape scale_shape(const struct wb_shape *v, uint32_t block)
{
    struct wb_shape s = *v;
    for (uint32_t i = s.ndim >= 2 ? s.ndim - 2 : 0; i < s.ndim; i++)
        s.dim[i] = (s.dim[i] + block - 1) / block;
    return s;
}

/* What rollout rank `rank` holds of mapping k at `version`: its values and, FP8, its scales
 * (*n of them, 0 when the rank holds none of it). */
static int expect_one(const struct wb_ref *f, uint32_t rank, uint64_t version, size_t k,
                      struct expect out[2], uint32_t *n, char *msg, size_t cap)
{
    const struct wb_rollout_layout *rl = &f->md.rl;
    uint32_t local = rank % rl->gpus_per_replica;
    uint32_t tp_rank = local % rl->tp, ep_rank = local % rl->ep;
    const struct wb_mapping *m = &f->md.match->map[k];
    const struct wb_param *rp = &f->md.rollout.p[m->rollout];
    struct wb_shape ls;
    struct wb_local_piece pc[WB_MAX_PIECES];
    uint32_t np = 0;
    struct wb_errlist el;
    *n = 0;
    wb_errlist_init(&el);
    int rc = wb_mapping_local(f->md.match, &f->md.rollout, m, tp_rank, rl->tp, ep_rank, rl->ep, &ls,
                              pc, &np, &el);
    wb_errlist_free(&el);
    if (rc) {
        snprintf(msg, cap, "%s: rollout rank %u holds no valid split", rp->name, rank);
        return rc;
    }
    if (np == 0 || wb_shape_numel(&ls) == 0)
        return 0; /* this rank holds none of it that is written (as the planner) */
    uint64_t covered = 0;
    for (uint32_t p = 0; p < np; p++)
        covered += wb_box_numel(&pc[p].local);
    bool partial = covered != wb_shape_numel(&ls);
    uint8_t *gv = NULL;
    float *gsc = NULL;
    if ((rc = global_values(f, m, version, &gv, &gsc, msg, cap)) != 0)
        return rc;
    struct expect *v = &out[(*n)++];
    v->tensor = m->rollout;
    v->bytes = wb_shape_numel(&ls) * wb_dtype_size(m->dst_dtype);
    v->buf = calloc(1, v->bytes + 1);
    rc = v->buf ? 0 : -ENOMEM;
    for (uint32_t p = 0; !rc && p < np; p++)
        rc = move_box(m->dst_dtype, &rp->shape, &pc[p].global, gv, &ls, &pc[p].local, v->buf);
    if (!rc && partial) {
        v->mask = calloc(1, v->bytes + 1);
        rc = v->mask ? 0 : -ENOMEM;
        for (uint32_t p = 0; !rc && p < np; p++)
            rc = mark_box(v->mask, &ls, &pc[p].local, wb_dtype_size(m->dst_dtype));
    }
    if (!rc && m->scale >= 0 && gsc) {
        struct wb_shape gss = scale_shape(&rp->shape, m->block);
        struct wb_shape lss = scale_shape(&ls, m->block);
        struct expect *s = &out[(*n)++];
        s->tensor = (uint32_t)m->scale;
        s->bytes = wb_shape_numel(&lss) * sizeof(float);
        s->buf = calloc(1, s->bytes + 1);
        rc = s->buf ? 0 : -ENOMEM;
        for (uint32_t p = 0; !rc && p < np; p++) {
            struct wb_box gb, lb;
            rc = wb_scale_box(&pc[p].global, m->block, &gb);
            rc = rc ? rc : wb_scale_box(&pc[p].local, m->block, &lb);
            rc = rc ? rc : move_box(WB_DTYPE_FP32, &gss, &gb, gsc, &lss, &lb, s->buf);
        }
        if (!rc && partial) {
            s->mask = calloc(1, s->bytes + 1);
            rc = s->mask ? 0 : -ENOMEM;
            for (uint32_t p = 0; !rc && p < np; p++) {
                struct wb_box lb;
                rc = wb_scale_box(&pc[p].local, m->block, &lb);
                rc = rc ? rc : mark_box(s->mask, &lss, &lb, sizeof(float));
            }
        }
    }
    free(gv);
    free(gsc);
    if (rc && !*msg)
        snprintf(msg, cap, "%s: cannot cut rollout rank %u's boxes: %s", rp->name, rank,
                 wb_strerror(rc));
    return rc;
}

/* The mappings are independent: threads take them in turn (a model of tens of GB is regenerated
 * and quantized on every core), each into its own two slots. */
struct expect_job {
    const struct wb_ref *f;
    uint32_t rank;
    uint64_t version;
    size_t n;
    _Atomic size_t next;
    struct expect *slots; /* [2n] */
    uint32_t *count;      /* [n] */
    int *rc;              /* [n] */
    char (*msg)[512];     /* [n] */
};

static void *expect_worker(void *arg)
{
    struct expect_job *j = arg;
    for (;;) {
        size_t k = atomic_fetch_add(&j->next, 1);
        if (k >= j->n)
            return NULL;
        j->rc[k] = expect_one(j->f, j->rank, j->version, k, &j->slots[2 * k], &j->count[k],
                              j->msg[k], sizeof(j->msg[k]));
    }
}

/* Every local tensor rollout rank `rank` holds at `version`. */
static int expected(const struct wb_ref *f, uint32_t rank, uint64_t version, struct expect **out,
                    uint32_t *nout, char *msg, size_t cap)
{
    size_t n = f->md.match->n;
    struct expect_job j = {.f = f, .rank = rank, .version = version, .n = n};
    j.slots = calloc(2 * n + 1, sizeof(*j.slots));
    j.count = calloc(n + 1, sizeof(*j.count));
    j.rc = calloc(n + 1, sizeof(*j.rc));
    j.msg = calloc(n + 1, sizeof(*j.msg));
    int rc = j.slots && j.count && j.rc && j.msg ? 0 : -ENOMEM;
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    size_t nt = cpus < 1 ? 1 : cpus > 32 ? 32 : (size_t)cpus;
    pthread_t th[32];
    size_t started = 0;
    for (; !rc && started < nt && started < n; started++)
        if (pthread_create(&th[started], NULL, expect_worker, &j))
            break;
    if (!rc && started == 0)
        expect_worker(&j);
    for (size_t i = 0; i < started; i++)
        pthread_join(th[i], NULL);
    uint32_t ne = 0;
    for (size_t k = 0; !rc && k < n; k++) /* the first failing mapping names the problem */
        if (j.rc[k]) {
            rc = j.rc[k];
            snprintf(msg, cap, "%s", j.msg[k]);
        }
    for (size_t k = 0; j.slots && k < 2 * n; k++) {
        if (!j.slots[k].buf)
            continue;
        if (rc) {
            free(j.slots[k].buf);
            free(j.slots[k].mask);
        } else {
            j.slots[ne++] = j.slots[k];
        }
    }
    free(j.count);
    free(j.rc);
    free(j.msg);
    if (rc) {
        free(j.slots);
        return rc;
    }
    *out = j.slots;
    *nout = ne;
    return 0;
}

int wb_ref_check_dump(const struct wb_ref *f, uint32_t rank, uint64_t version, const char *path,
                      char *msg, size_t cap, uint64_t *bytes)
{
    struct expect *e = NULL;
    uint32_t ne = 0;
    msg[0] = 0;
    int rc = expected(f, rank, version, &e, &ne, msg, cap);
    if (rc)
        return rc;
    FILE *fp = fopen(path, "rb");
    char magic[8];
    uint32_t n = 0;
    uint64_t checked = 0;
    if (!fp) {
        snprintf(msg, cap, "%s: cannot open", path);
        rc = -ENOENT;
        goto out;
    }
    if (fread(magic, 1, 8, fp) != 8 || memcmp(magic, "WBDUMP1\n", 8) ||
        fread(&n, sizeof(n), 1, fp) != 1) {
        snprintf(msg, cap, "%s: not a rollout dump", path);
        rc = -EBADMSG;
        goto out;
    }
    uint32_t seen = 0;
    for (uint32_t i = 0; !rc && i < n; i++) {
        uint32_t tensor;
        uint64_t b;
        if (fread(&tensor, sizeof(tensor), 1, fp) != 1 || fread(&b, sizeof(b), 1, fp) != 1) {
            snprintf(msg, cap, "%s: truncated", path);
            rc = -EBADMSG;
            break;
        }
        struct expect *x = NULL;
        for (uint32_t k = 0; k < ne; k++)
            if (e[k].tensor == tensor)
                x = &e[k];
        const char *name = tensor < f->md.rollout.n ? f->md.rollout.p[tensor].name : "?";
        if (x && x->seen) { /* one tensor many times must not stand for the others */
            snprintf(msg, cap, "rollout rank %u: %s: in the dump twice", rank, name);
            rc = -WB_E_PLAN;
            break;
        }
        if (!x || x->bytes != b) {
            snprintf(msg, cap,
                     "rollout rank %u: %s: holds %" PRIu64 " bytes, the reference %" PRIu64, rank,
                     name, b, x ? x->bytes : 0);
            rc = -WB_E_PLAN;
            break;
        }
        uint8_t *got = malloc(b + 1);
        if (!got || fread(got, 1, b, fp) != b) {
            free(got);
            snprintf(msg, cap, "%s: truncated", path);
            rc = -EBADMSG;
            break;
        }
        for (uint64_t k = 0; k < b; k++)
            if (got[k] != x->buf[k] && (!x->mask || x->mask[k])) {
                snprintf(msg, cap,
                         "rollout rank %u, version %" PRIu64 ": %s: byte %" PRIu64
                         " is 0x%02x, the reference 0x%02x",
                         rank, version, name, k, got[k], x->buf[k]);
                rc = -WB_E_PLAN;
                break;
            }
        free(got);
        for (uint64_t k = 0; k < b; k++) /* the bytes compared (padding rows are not) */
            checked += !x->mask || x->mask[k];
        x->seen = true;
        seen++;
    }
    if (!rc && seen != ne) {
        snprintf(msg, cap, "rollout rank %u: holds %u tensors, the reference %u", rank, seen, ne);
        rc = -WB_E_PLAN;
    }
out:
    if (fp)
        fclose(fp);
    for (uint32_t i = 0; i < ne; i++) {
        free(e[i].buf);
        free(e[i].mask);
    }
    free(e);
    if (!rc && bytes)
        *bytes = checked;
    return rc;
}
