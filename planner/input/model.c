/* model.c — wb_model_load(): the one way every program, benchmark and test gets from files to
 * what the planner needs — model rules, the trainer and rollout inventories (generated from
 * config.json or read from files), the match between them, and the two cluster layouts.
 *
 * Written once here because the order matters and was easy to get subtly different in eight
 * places: the rules must be bound to config.json before matching (shard expressions read its
 * values), and the layouts are checked against each other before anyone plans with them. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "planner/planner.h"

static bool given(const char *s)
{
    return s && *s;
}

static int load_inventory(const struct wb_model_src *src, struct wb_match_rules *rules,
                          const char *side, const char *file, const char *config,
                          struct wb_inventory *inv, struct wb_errlist *el)
{
    if (side[0] == 't' && src->trainer_mem) {
        const struct wb_inventory *m = src->trainer_mem;
        for (size_t i = 0; i < m->n; i++) {
            int err = wb_inv_add(inv, m->p[i].name, m->p[i].dtype, &m->p[i].shape);
            if (err)
                return err;
        }
        return 0;
    }
    if (given(file))
        return wb_inv_load_file(file, inv, el);
    if (!given(config)) {
        wb_errlist_add(el, "model: the %s inventory needs config.json or an inventory file", side);
        return -WB_E_CONFIG;
    }
    /* from the family file the rules were read from, config.json parsed once for the load */
    return wb_match_rules_generate(rules, config, side, inv, el);
}

/* Both inventories usually come from the same config.json: a problem with the file itself (not
 * JSON, a field missing) would be reported once per side. Drops the messages after n1 that
 * repeat one of [n0, n1). */
static void dedupe(struct wb_errlist *el, size_t n0, size_t n1)
{
    size_t keep = n1;
    for (size_t i = n1; i < el->n; i++) {
        bool dup = false;
        for (size_t j = n0; j < n1 && !dup; j++)
            dup = strcmp(el->msgs[i], el->msgs[j]) == 0;
        if (dup)
            free(el->msgs[i]);
        else
            el->msgs[keep++] = el->msgs[i];
    }
    el->n = keep;
}

int wb_model_load(const struct wb_model_src *src, struct wb_model *out, struct wb_errlist *el)
{
    struct wb_model m;
    memset(&m, 0, sizeof(m));
    wb_inv_init(&m.trainer);
    wb_inv_init(&m.rollout);
    const char *tconfig = given(src->trainer_config) ? src->trainer_config : src->config;
    int err = 0;
    if (!given(src->rules)) {
        wb_errlist_add(el, "model: no model rules given");
        err = -WB_E_CONFIG;
    }
    if (!err && given(src->trainer_layout) != given(src->rollout_layout)) {
        wb_errlist_add(el, "model: a trainer layout and a rollout layout go together");
        err = -WB_E_CONFIG;
    }
    /* Layouts first: they are small, and a layout problem explains everything after it. Both
     * files (and both inventories) are read even when the first fails, so that every problem
     * of the input is reported at once. */
    if (!err && given(src->trainer_layout)) {
        int e1 = wb_trainer_layout_load(src->trainer_layout, &m.tl, el);
        int e2 = wb_rollout_layout_load(src->rollout_layout, &m.rl, el);
        err = e1 ? e1 : e2;
        m.have_layouts = true;
        err = err ? err : wb_layout_check(&m.tl, &m.rl, el);
    }
    /* The rules (and the job's vars) before the inventories: a bad family file or var is then
     * reported once, not once per generated side. */
    err = err ? err : wb_match_rules_load(src->rules, &m.rules, el);
    if (!err && given(src->vars))
        err = wb_match_rules_set_vars(m.rules, src->vars, el);
    if (!err && given(src->naming))
        err = wb_match_rules_set_naming(m.rules, src->naming, el);
    /* a rollout inventory file may hold part of the model: rules for the rest are no typo */
    if (!err && given(src->rollout_inv))
        wb_match_rules_partial_rollout(m.rules, true);
    if (!err) {
        size_t n0 = el->n;
        int e1 = load_inventory(src, m.rules, "trainer", src->trainer_inv, tconfig, &m.trainer, el);
        size_t n1 = el->n;
        /* both sides generated from one config.json fail alike: say it once */
        bool same = !given(src->trainer_inv) && !src->trainer_mem && !given(src->rollout_inv) &&
                    tconfig && src->config && strcmp(tconfig, src->config) == 0;
        int e2 = e1 && same ? 0
                            : load_inventory(src, m.rules, "rollout", src->rollout_inv, src->config,
                                             &m.rollout, el);
        err = e1 ? e1 : e2;
        dedupe(el, n0, n1);
    }
    /* the dtypes the trainers hold, where the layout says (FP32 masters): before matching,
     * which decides per tensor between a copy, a cast and a quantization from them */
    if (!err && m.have_layouts)
        err = wb_trainer_layout_dtypes(&m.tl, &m.trainer);
    if (!err && given(src->config))
        err = wb_match_rules_bind_config(m.rules, src->config, el);
    err = err ? err : wb_match_run(m.rules, &m.trainer, &m.rollout, &m.match, el);
    if (err) {
        wb_model_free(&m);
        memset(out, 0, sizeof(*out));
        return err;
    }
    *out = m;
    return 0;
}

void wb_model_free(struct wb_model *m)
{
    if (m->have_layouts) {
        wb_rollout_layout_free(&m->rl);
        wb_trainer_layout_free(&m->tl);
    }
    wb_match_free(m->match);
    wb_inv_free(&m->rollout);
    wb_inv_free(&m->trainer);
    wb_match_rules_free(m->rules);
    memset(m, 0, sizeof(*m));
}

int wb_plan_json(const struct wb_model_src *src, const struct wb_plan_opts *opts, bool tables,
                 char **json, char **errors)
{
    struct wb_errlist el;
    struct wb_model md;
    struct wb_plan *p = NULL;
    char *text = NULL;
    size_t len = 0;
    *json = *errors = NULL;
    wb_errlist_init(&el);
    int err = wb_model_load(src, &md, &el);
    if (!err && !md.have_layouts) {
        wb_errlist_add(&el, "plan: the trainer and rollout layouts are required");
        err = -WB_E_CONFIG;
    }
    struct wb_plan_input in = wb_model_input(&md);
    err = err ? err : wb_plan_build(&in, opts, &p, &el);
    if (!err) {
        FILE *f = open_memstream(&text, &len);
        err = f ? wb_plan_write_json(p, &in, tables, f) : -ENOMEM;
        if (f && fclose(f) && !err)
            err = -ENOMEM;
    }
    if (err) {
        free(text);
        text = NULL;
        FILE *f = open_memstream(errors, &len);
        if (f) {
            wb_errlist_print(&el, "", f);
            fclose(f);
        }
    }
    *json = text;
    wb_plan_free(p);
    wb_model_free(&md);
    wb_errlist_free(&el);
    return err;
}
