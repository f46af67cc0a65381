/* check.c — a checkpoint against its model: the checkpoint plays the trainer's role, so its
 * tensors must be the trainer inventory the model rules generate from config.json.
 *
 * Official FP8 checkpoints (Qwen3-8B-FP8, DeepSeek-V3) hold the linear layers as fp8_e4m3 with
 * FP32 <name>_scale_inv tensors of 128x128 blocks, while the families generate BF16 trainer
 * inventories (what a trainer holds). Which trainer tensors are FP8 in such a checkpoint is
 * exactly what the family's fp8 rule says of the rollout tensors built from them, so the FP8
 * form is derived from the match: every trainer component of a mapping that FP8-quantizes. */
#include "ckpt/ckpriv.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *wb_ckpt_form_name(enum wb_ckpt_form f)
{
    switch (f) {
    case WB_CKPT_FORM_AUTO:
        return "auto";
    case WB_CKPT_FORM_MODEL:
        return "model";
    case WB_CKPT_FORM_FP8:
        return "fp8";
    }
    return "invalid";
}

/* The scale suffix the rules use: the rollout scale name minus its value name. */
static const char *scale_suffix(const struct wb_model *m, const struct wb_mapping *mp)
{
    const char *v = m->rollout.p[mp->rollout].name, *s = m->rollout.p[mp->scale].name;
    size_t n = strlen(v);
    return strncmp(v, s, n) == 0 && s[n] ? s + n : "_scale_inv";
}

int wb_ckpt_expected(const struct wb_model *m, enum wb_ckpt_form form, struct wb_inventory *out,
                     struct wb_errlist *el)
{
    if (form != WB_CKPT_FORM_MODEL && form != WB_CKPT_FORM_FP8)
        return -EINVAL;
    const struct wb_inventory *tr = &m->trainer;
    /* per trainer tensor: NULL, or the scale suffix of the FP8 mapping it feeds */
    const char **fp8 = calloc(tr->n + 1, sizeof(*fp8));
    uint32_t *block = calloc(tr->n + 1, sizeof(*block));
    if (!fp8 || !block) {
        free(fp8);
        free(block);
        return -ENOMEM;
    }
    for (size_t i = 0; form == WB_CKPT_FORM_FP8 && m->match && i < m->match->n; i++) {
        const struct wb_mapping *mp = &m->match->map[i];
        if (mp->xform != WB_XFORM_FP8_BLOCK || mp->scale < 0)
            continue;
        for (uint32_t c = 0; c < mp->ncomp; c++) {
            uint32_t t = mp->comp[c].trainer;
            if (tr->p[t].shape.ndim >= 2) {
                fp8[t] = scale_suffix(m, mp);
                block[t] = mp->block;
            }
        }
    }
    struct wb_inventory inv;
    wb_inv_init(&inv);
    int err = 0;
    for (size_t t = 0; !err && t < tr->n; t++) {
        const struct wb_param *p = &tr->p[t];
        if (!fp8[t]) {
            err = wb_inv_add(&inv, p->name, p->dtype, &p->shape);
            continue;
        }
        struct wb_box full = wb_box_full(&p->shape), sbox;
        char sname[WB_NAME_MAX + 64];
        snprintf(sname, sizeof(sname), "%s%s", p->name, fp8[t]);
        err = wb_inv_add(&inv, p->name, WB_DTYPE_FP8_E4M3, &p->shape);
        if (!err && (err = wb_scale_box(&full, block[t], &sbox)) == 0) {
            struct wb_shape ss = wb_box_shape(&sbox);
            err = wb_inv_add(&inv, sname, WB_DTYPE_FP32, &ss);
        }
        if (err == -EEXIST || err == -EINVAL) {
            wb_errlist_add(el, "%s: its FP8 scale tensor %s %s", p->name, sname,
                           err == -EEXIST ? "is also a tensor of the model"
                                          : "has a name that is too long");
            err = -WB_E_MATCH;
        }
    }
    free(fp8);
    free(block);
    if (err) {
        wb_inv_free(&inv);
        return err;
    }
    wb_inv_free(out);
    *out = inv;
    return 0;
}

static void describe(const struct wb_param *p, char *buf, size_t cap)
{
    char s[128];
    snprintf(buf, cap, "%s %s", wb_dtype_name(p->dtype), wb_shape_str(&p->shape, s, sizeof(s)));
}

int wb_ckpt_check(const struct wb_ckpt *ck, const struct wb_inventory *want, struct wb_errlist *el)
{
    size_t bad = 0;
    char a[160], b[160];
    for (size_t i = 0; i < ck->inv.n; i++) {
        const struct wb_param *p = &ck->inv.p[i];
        const char *file = ck->files[ck->loc[i].file].name;
        ssize_t j = wb_inv_find(want, p->name);
        if (j < 0) {
            describe(p, a, sizeof(a));
            wb_errlist_add(el, "extra tensor \"%s\" (%s, in %s): the model has no such tensor",
                           wb_esc(p->name).s, a, wb_esc(file).s);
            bad++;
            continue;
        }
        const struct wb_param *q = &want->p[j];
        bool dt = p->dtype != q->dtype, sh = !wb_shape_eq(&p->shape, &q->shape);
        if (dt && sh) {
            describe(p, a, sizeof(a));
            describe(q, b, sizeof(b));
        } else if (dt) {
            snprintf(a, sizeof(a), "dtype %s", wb_dtype_name(p->dtype));
            snprintf(b, sizeof(b), "%s", wb_dtype_name(q->dtype));
        } else if (sh) {
            snprintf(a, sizeof(a), "shape ");
            wb_shape_str(&p->shape, a + 6, sizeof(a) - 6);
            wb_shape_str(&q->shape, b, sizeof(b));
        } else {
            continue;
        }
        wb_errlist_add(el, "tensor \"%s\" (in %s): %s, the model expects %s", wb_esc(p->name).s,
                       wb_esc(file).s, a, b);
        bad++;
    }
    for (size_t j = 0; j < want->n; j++) {
        if (wb_inv_find(&ck->inv, want->p[j].name) >= 0)
            continue;
        describe(&want->p[j], b, sizeof(b));
        wb_errlist_add(el, "missing tensor \"%s\": the model expects %s", want->p[j].name, b);
        bad++;
    }
    return bad ? -WB_E_MATCH : 0;
}

int wb_ckpt_check_model(const struct wb_ckpt *ck, const struct wb_model *m, enum wb_ckpt_form form,
                        enum wb_ckpt_form *used, struct wb_errlist *el)
{
    if (form == WB_CKPT_FORM_AUTO) {
        bool ck8 = false, tr8 = false;
        for (size_t i = 0; i < ck->inv.n && !ck8; i++)
            ck8 = ck->inv.p[i].dtype == WB_DTYPE_FP8_E4M3;
        for (size_t i = 0; i < m->trainer.n && !tr8; i++)
            tr8 = m->trainer.p[i].dtype == WB_DTYPE_FP8_E4M3;
        form = ck8 && !tr8 ? WB_CKPT_FORM_FP8 : WB_CKPT_FORM_MODEL;
    }
    if (used)
        *used = form;
    struct wb_inventory want;
    wb_inv_init(&want);
    int err = wb_ckpt_expected(m, form, &want, el);
    if (!err)
        err = wb_ckpt_check(ck, &want, el);
    wb_inv_free(&want);
    return err;
}
