/* wb-match — the matcher from the command line: generate or load the trainer and rollout
 * inventories, match them by a model-family file's rules, and print the result (counts, every
 * mapping with --list, a rollout rank's local pieces with --tp/--ep) or every problem found.
 * Exit status: 0 matched, 1 problems found, 2 bad usage. */
#include "matcher/matcher.h"

#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f, const char *prog)
{
    fprintf(f,
            "usage: %s --family FILE [--config CONFIG.json] [options]\n"
            "Matches trainer parameters (Hugging Face names) to rollout parameters (vLLM names)\n"
            "by the rules of a model-family file (configs/models/*.yaml).\n"
            "\n"
            "  --family FILE          model-family YAML: generators and rules\n"
            "  --config FILE          Hugging Face config.json for both sides\n"
            "  --trainer-config FILE  config.json for the trainer side only (default --config)\n"
            "  --trainer FILE         trainer inventory file (YAML/JSON) instead of generating\n"
            "  --rollout FILE         rollout inventory file instead of generating (it may\n"
            "                         hold part of the model: a rule matching none of it is\n"
            "                         no error)\n"
            "  --save-trainer FILE    write the trainer inventory (JSON) and continue\n"
            "  --save-rollout FILE    write the rollout inventory (JSON) and continue\n"
            "  --var NAME=VALUE       a value for one of the family file's vars (repeatable),\n"
            "                         e.g. --var mtp=1 (DeepSeek-V3's draft layer)\n"
            "  --list                 print every mapping\n"
            "  --tp N --ep N          print what rollout rank --rank holds of each mapping\n"
            "  --rank R               tp rank (and ep rank) for --tp/--ep (default 0)\n"
            "  --help                 this text\n",
            prog);
}

static const char *const kind_names[] = {"rename", "fuse", "stack", "unstack", "tie", "split"};
static const char *const xform_names[] = {"copy", "cast", "fp8-block"};

static void print_mapping(const struct wb_match *mt, const struct wb_inventory *t,
                          const struct wb_inventory *r, const struct wb_mapping *m)
{
    char a[128], b[128];
    const struct wb_param *R = &r->p[m->rollout];
    printf("%s %s %s <- %s", R->name, wb_dtype_name(R->dtype),
           wb_shape_str(&R->shape, a, sizeof(a)), kind_names[m->kind]);
    if (m->ncomp <= 4) {
        for (uint32_t i = 0; i < m->ncomp; i++) {
            const struct wb_param *T = &t->p[m->comp[i].trainer];
            struct wb_box full = wb_box_full(&T->shape);
            char box[256] = "";
            if (!wb_box_eq(&full, &m->comp[i].src)) /* a slice (unstacked, split) */
                wb_box_str(&m->comp[i].src, box, sizeof(box));
            printf("%s%s%s", i ? " + " : " ", T->name, box);
            for (uint32_t k = 0; m->comp[i].permuted && k < m->comp[i].dst.ndim; k++)
                printf("%s%u%s", k ? ", " : " permuted [", m->comp[i].perm[k],
                       k + 1 == m->comp[i].dst.ndim ? "]" : "");
        }
    } else {
        printf(" %u components (%s ... %s)", m->ncomp, t->p[m->comp[0].trainer].name,
               t->p[m->comp[m->ncomp - 1].trainer].name);
    }
    printf(" [%s %s->%s", xform_names[m->xform], wb_dtype_name(m->src_dtype),
           wb_dtype_name(m->dst_dtype));
    if (m->scale >= 0)
        printf(", scale %s %s", r->p[m->scale].name,
               wb_shape_str(&r->p[m->scale].shape, b, sizeof(b)));
    if (m->shard.kind == WB_SHARD_TP)
        printf(", tp dim %u", m->shard.dim);
    else if (m->shard.kind == WB_SHARD_EP)
        printf(", ep dim %u", m->shard.dim);
    printf(", rule %s:%u]\n", mt->rules_path, m->rule_line);
}

int main(int argc, char **argv)
{
    const char *family = NULL, *config = NULL, *tconfig = NULL, *tfile = NULL, *rfile = NULL;
    const char *save_t = NULL, *save_r = NULL;
    char vars[1024] = "";
    int list = 0, have_rank = 0;
    long tp = 0, ep = 0, rank = 0;
    static const struct option opts[] = {{"family", required_argument, 0, 'f'},
                                         {"config", required_argument, 0, 'c'},
                                         {"trainer-config", required_argument, 0, 'C'},
                                         {"trainer", required_argument, 0, 't'},
                                         {"rollout", required_argument, 0, 'r'},
                                         {"save-trainer", required_argument, 0, 'T'},
                                         {"save-rollout", required_argument, 0, 'R'},
                                         {"list", no_argument, 0, 'l'},
                                         {"tp", required_argument, 0, 'p'},
                                         {"ep", required_argument, 0, 'e'},
                                         {"rank", required_argument, 0, 'k'},
                                         {"var", required_argument, 0, 'v'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    int o;
    while ((o = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (o) {
        case 'f':
            family = optarg;
            break;
        case 'c':
            config = optarg;
            break;
        case 'C':
            tconfig = optarg;
            break;
        case 't':
            tfile = optarg;
            break;
        case 'r':
            rfile = optarg;
            break;
        case 'T':
            save_t = optarg;
            break;
        case 'R':
            save_r = optarg;
            break;
        case 'l':
            list = 1;
            break;
        case 'v': {
            size_t len = strlen(vars);
            if ((size_t)snprintf(vars + len, sizeof(vars) - len, "%s%s", len ? "," : "", optarg) >=
                sizeof(vars) - len) {
                fprintf(stderr, "wb-match: --var: too many values\n");
                return 2;
            }
            break;
        }
        case 'p':
        case 'e':
        case 'k': {
            /* whole-string integers only: "--tp abc" or "--tp 0" must not skip the check */
            const char *opt = o == 'p' ? "--tp" : o == 'e' ? "--ep" : "--rank";
            long lo = o == 'k' ? 0 : 1;
            int64_t v;
            if (wb_parse_i64(optarg, &v) || v < lo || v > 4096) {
                fprintf(stderr, "wb-match: %s '%s': expected an integer %ld..4096\n", opt, optarg,
                        lo);
                return 2;
            }
            *(o == 'p' ? &tp : o == 'e' ? &ep : &rank) = (long)v;
            have_rank |= o == 'k';
            break;
        }
        case 'h':
            usage(stdout, argv[0]);
            return 0;
        default:
            usage(stderr, argv[0]);
            return 2;
        }
    }
    if (!tconfig)
        tconfig = config;
    if (!family || (!tfile && !tconfig) || (!rfile && !config) || optind != argc) {
        usage(stderr, argv[0]);
        return 2;
    }
    /* a replica has max(tp, ep) GPUs (the planner's default gpus_per_replica): the rank must
     * be one of them, and both must divide it */
    long gpr = tp > ep ? tp : ep;
    if (have_rank && !gpr) {
        fprintf(stderr, "wb-match: --rank needs --tp or --ep\n");
        return 2;
    }
    if (gpr && ((tp && gpr % tp) || (ep && gpr % ep))) {
        fprintf(stderr, "wb-match: --tp %ld and --ep %ld: the smaller must divide the larger\n", tp,
                ep);
        return 2;
    }
    if (ep > 1 && tp > ep) { /* vLLM's expert-parallel group is tp x data-parallel size */
        fprintf(stderr,
                "wb-match: --tp %ld and --ep %ld: vLLM's expert parallelism is off (--ep 1) or "
                "spans the replica (--ep = tp x data-parallel size, at least --tp)\n",
                tp, ep);
        return 2;
    }
    if (gpr && rank >= gpr) {
        fprintf(stderr, "wb-match: --rank %ld: a replica of tp %ld / ep %ld has ranks 0..%ld\n",
                rank, tp ? tp : 1, ep ? ep : 1, gpr - 1);
        return 2;
    }
    struct wb_errlist el;
    wb_errlist_init(&el);
    struct wb_inventory t, r;
    wb_inv_init(&t);
    wb_inv_init(&r);
    struct wb_match_rules *rules = NULL;
    struct wb_match *m = NULL;
    int rc = 1, err = 0;
    if ((err = tfile ? wb_inv_load_file(tfile, &t, &el)
                     : wb_inv_generate_vars(family, tconfig, vars, "trainer", &t, &el)) ||
        (err = rfile ? wb_inv_load_file(rfile, &r, &el)
                     : wb_inv_generate_vars(family, config, vars, "rollout", &r, &el)))
        goto out;
    const char *save = NULL;
    if ((save_t && (err = wb_inv_save_file(save = save_t, &t))) ||
        (save_r && (err = wb_inv_save_file(save = save_r, &r)))) {
        wb_errlist_add(&el, "%s: cannot write the inventory: %s", save, wb_strerror(err));
        goto out;
    }
    if ((err = wb_match_rules_load(family, &rules, &el)))
        goto out;
    wb_match_rules_partial_rollout(rules, rfile != NULL); /* a file may hold part of the model */
    if ((err = wb_match_rules_set_vars(rules, vars, &el)) ||
        (config && (err = wb_match_rules_bind_config(rules, config, &el))) ||
        (err = wb_match_run(rules, &t, &r, &m, &el)))
        goto out;
    size_t kinds[6] = {0}, xf[3] = {0}, transposed = 0;
    for (size_t i = 0; i < m->n; i++) {
        kinds[m->map[i].kind]++;
        xf[m->map[i].xform]++;
        transposed += m->map[i].ncomp && m->map[i].comp[0].permuted;
    }
    printf("matched %zu rollout tensors (%zu in inventory) from %zu trainer tensors (%zu "
           "ignored)\n",
           m->n, r.n, t.n, m->nignored);
    printf("  rename %zu, fuse %zu, stack %zu, unstack %zu, tie %zu", kinds[0], kinds[1], kinds[2],
           kinds[3], kinds[4]);
    if (kinds[WB_MAP_SPLIT])
        printf(", split %zu", kinds[WB_MAP_SPLIT]);
    printf("; copy %zu, cast %zu, fp8-block %zu%s", xf[0], xf[1], xf[2], transposed ? "" : "\n");
    if (transposed)
        printf("; %zu transposed (not planned yet)\n", transposed);
    for (size_t i = 0; list && i < m->n; i++)
        print_mapping(m, &t, &r, &m->map[i]);
    if (tp || ep) {
        uint32_t ntp = tp ? (uint32_t)tp : 1, nep = ep ? (uint32_t)ep : 1;
        bool bad = false;
        for (size_t i = 0; i < m->n; i++) {
            struct wb_shape ls;
            struct wb_local_piece pc[WB_MAX_PIECES];
            uint32_t np;
            if ((err = wb_mapping_local(m, &r, &m->map[i], (uint32_t)rank % ntp, ntp,
                                        (uint32_t)rank % nep, nep, &ls, pc, &np, &el))) {
                if (err == -ENOMEM)
                    goto out;
                bad = true;
                continue;
            }
            if (!list)
                continue;
            char a[128], b[256];
            printf("  rank %ld: %s local %s:", rank, r.p[m->map[i].rollout].name,
                   wb_shape_str(&ls, a, sizeof(a)));
            for (uint32_t k = 0; k < np; k++)
                printf(" %s", wb_box_str(&pc[k].global, b, sizeof(b)));
            printf("\n");
        }
        if (bad)
            goto out;
        printf("rollout rank %ld of tp %u / ep %u: every mapping splits cleanly\n", rank, ntp, nep);
    }
    rc = 0;
out:
    if (rc) {
        fflush(stdout);
        /* a failure always says why: an allocation failure that could not even record its
         * message is still an error, never "0 problems" */
        if (el.n == 0)
            fprintf(stderr, "wb-match: %s\n", wb_strerror(err ? err : -ENOMEM));
        size_t shown = el.n < 40 ? el.n : 40;
        for (size_t i = 0; i < shown; i++)
            fprintf(stderr, "wb-match: %s\n", el.msgs[i]);
        fprintf(stderr, "wb-match: %zu problem%s%s\n", el.n ? el.n : 1,
                el.n == 1 || el.n == 0 ? "" : "s", shown < el.n ? " (the first 40 shown)" : "");
    }
    wb_match_free(m);
    wb_match_rules_free(rules);
    wb_inv_free(&t);
    wb_inv_free(&r);
    wb_errlist_free(&el);
    return rc;
}
