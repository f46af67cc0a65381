/* wb-match — the matcher from the command line: generate or load the trainer and rollout
 * inventories, match them by a model-family file's rules, and print the result (counts, every
 * mapping with --list, a rollout rank's local pieces with --tp/--ep) or every problem found.
 * With --check-semantics it runs the semantic check instead (matcher/semantic/semcheck.py:
 * a tiny model of the family moved by the job's own programs, then one forward over the
 * trainer's tensors as Hugging Face reads them and over the rollout's as vLLM reads them).
 * Exit status: 0 matched (the check passed), 1 problems found, 2 bad usage. */
#include "matcher/matcher.h"

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <libgen.h>
#include <limits.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

static void usage(FILE *f, const char *prog)
{
    fprintf(
        f,
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
        "                         e.g. --var mtp=1 (DeepSeek-V3's draft layer), --var\n"
        "                         mesh_tp=2 (a Megatron trainer's TP size)\n"
        "  --naming NAME          the trainer naming (one of the family file's namings:, e.g.\n"
        "                         megatron); default the file's first\n"
        "  --list                 print every mapping\n"
        "  --tp N --ep N          print what rollout rank --rank holds of each mapping\n"
        "  --rank R               tp rank (and ep rank) for --tp/--ep (default 0)\n"
        "  --help                 this text\n"
        "\n"
        "Semantic check (shapes cannot tell k from v, gate from up, or a square matrix from\n"
        "its transpose; this runs the model):\n"
        "  --check-semantics      make a tiny model of --config's structure, give the family's\n"
        "                         trainer tensors random values, move them with wb-broadcast\n"
        "                         and wb-agent (matcher, planner, executor, libfabric) into a\n"
        "                         rollout of --tp ranks (default 2; --ep N: expert parallel),\n"
        "                         and compare one forward over the trainer's tensors read as\n"
        "                         Hugging Face reads them with the same forward over each\n"
        "                         rollout rank's tensors read as vLLM reads them: the first\n"
        "                         layer and tensor that differ are named, exit status 1\n"
        "  --dtype bf16|fp8|both  the rollout's weights (default both; fp8 where the family\n"
        "                         has FP8 rules)\n"
        "  --seed N               the random values' seed (default 1)\n"
        "  --gate-up ORDER        how the trainer's fused experts (gpt-oss gate_up_proj) order\n"
        "                         gate and up along their last dim: interleaved (default:\n"
        "                         what transformers' GptOssExperts reads) or halves ([gate |\n"
        "                         up], how other fused MoE experts are held): whether the\n"
        "                         family is right for a checkpoint that holds them so\n"
        "  --keep DIR             keep the tiny model, job, logs and dumps in DIR\n"
        "  The forward code is semcheck.py and its modules: $WB_SEMANTIC_DIR, else\n"
        "  PREFIX/share/weightbridge/semantic beside an installed bin/wb-match (make install\n"
        "  puts them there), else matcher/semantic of the checkout wb-match was built in. It\n"
        "  runs with $WB_PYTHON, else the first of python3 and /usr/bin/python3 that has\n"
        "  numpy, and the wb-broadcast and wb-agent beside wb-match.\n",
        prog);
}

/* ---------------------------------------------------------------- the semantic check */

/* Does `python -c "import numpy"` succeed (output discarded)? */
static int has_numpy(const char *python)
{
    posix_spawn_file_actions_t fa;
    if (posix_spawn_file_actions_init(&fa))
        return 0;
    posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
    char *argv[] = {(char *)python, "-c", "import numpy", NULL};
    pid_t pid;
    int st = -1;
    int rc = posix_spawnp(&pid, python, &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    if (rc || waitpid(pid, &st, 0) != pid)
        return 0;
    return WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

static int is_file(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

struct sem_opts {
    const char *family, *config, *dtype, *seed, *keep, *naming, *gate_up;
    const char *vars[64];
    int nvars;
    long tp, ep;
};

/* Finds the forward code and a python3 with numpy, and becomes the check (exec): its exit
 * status is wb-match's. Returns only on failure (1). */
static int check_semantics(const struct sem_opts *o)
{
    char exe[PATH_MAX], bindir[PATH_MAX], script[PATH_MAX + 64], tried[4 * PATH_MAX] = "";
    ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    if (n <= 0) {
        fprintf(stderr, "wb-match: --check-semantics: cannot find my own program: %s\n",
                strerror(errno));
        return 1;
    }
    exe[n] = 0;
    snprintf(bindir, sizeof(bindir), "%s", dirname(exe));
    const char *env = getenv("WB_SEMANTIC_DIR");
    /* an installed bin/ has share/ beside it; a build's bin/ is build/bin or build/<x>/bin */
    const char *dirs[] = {env, "../share/weightbridge/semantic", "../../matcher/semantic",
                          "../../../matcher/semantic"};
    script[0] = 0;
    for (size_t i = 0; i < sizeof(dirs) / sizeof(dirs[0]) && !script[0]; i++) {
        if (!dirs[i] || !*dirs[i])
            continue;
        char c[PATH_MAX + 64];
        bool rel = i > 0; /* $WB_SEMANTIC_DIR as given; the others beside my program */
        snprintf(c, sizeof(c), "%s%s%s/semcheck.py", rel ? bindir : "", rel ? "/" : "", dirs[i]);
        size_t len = strlen(tried);
        snprintf(tried + len, sizeof(tried) - len, "%s%s", len ? ", " : "", c);
        if (is_file(c))
            snprintf(script, sizeof(script), "%s", c);
        if (i == 0) /* $WB_SEMANTIC_DIR, when set, is the only place */
            break;
    }
    if (!script[0]) {
        fprintf(stderr,
                "wb-match: --check-semantics: the forward code (semcheck.py) is not in %s; "
                "make install puts it in PREFIX/share/weightbridge/semantic, or set "
                "WB_SEMANTIC_DIR\n",
                tried);
        return 1;
    }
    const char *pys[] = {getenv("WB_PYTHON"), "python3", "/usr/bin/python3"};
    const char *python = NULL;
    for (size_t i = 0; i < 3 && !python; i++) {
        if (pys[i] && *pys[i] && has_numpy(pys[i]))
            python = pys[i];
        if (i == 0 && pys[0] && *pys[0] && !python) {
            fprintf(stderr, "wb-match: --check-semantics: WB_PYTHON=%s cannot import numpy\n",
                    pys[0]);
            return 1;
        }
    }
    if (!python) {
        fprintf(stderr, "wb-match: --check-semantics: no python3 with numpy (tried python3 and "
                        "/usr/bin/python3; on Debian: apt-get install python3-numpy)\n");
        return 1;
    }
    char tp[24], ep[24];
    snprintf(tp, sizeof(tp), "%ld", o->tp);
    snprintf(ep, sizeof(ep), "%ld", o->ep);
    const char *argv[32 + 2 * 64];
    int k = 0;
    const char *fixed[] = {python,     script,    "--bin",   bindir,   "--family", o->family,
                           "--config", o->config, "--dtype", o->dtype, "--tp",     tp,
                           "--ep",     ep,        "--seed",  o->seed};
    for (size_t i = 0; i < sizeof(fixed) / sizeof(fixed[0]); i++)
        argv[k++] = fixed[i];
    for (int i = 0; i < o->nvars; i++) {
        argv[k++] = "--var";
        argv[k++] = o->vars[i];
    }
    if (o->keep) {
        argv[k++] = "--keep";
        argv[k++] = o->keep;
    }
    if (o->naming) {
        argv[k++] = "--naming";
        argv[k++] = o->naming;
    }
    if (o->gate_up) {
        argv[k++] = "--gate-up";
        argv[k++] = o->gate_up;
    }
    argv[k] = NULL;
    fflush(stdout);
    execvp(python, (char *const *)argv);
    fprintf(stderr, "wb-match: --check-semantics: cannot run %s: %s\n", python, strerror(errno));
    return 1;
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
    const char *save_t = NULL, *save_r = NULL, *naming = NULL;
    char vars[1024] = "";
    int list = 0, have_rank = 0, check = 0;
    long tp = 0, ep = 0, rank = 0;
    struct sem_opts so = {.dtype = "both", .seed = "1"};
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
                                         {"naming", required_argument, 0, 'n'},
                                         {"check-semantics", no_argument, 0, 'S'},
                                         {"dtype", required_argument, 0, 'D'},
                                         {"seed", required_argument, 0, 's'},
                                         {"keep", required_argument, 0, 'K'},
                                         {"gate-up", required_argument, 0, 'G'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    int o;
    while ((o = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (o) {
        case 'f':
            family = optarg;
            break;
        case 'n':
            naming = so.naming = optarg;
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
        case 'S':
            check = 1;
            break;
        case 'D':
            if (strcmp(optarg, "bf16") && strcmp(optarg, "fp8") && strcmp(optarg, "both")) {
                fprintf(stderr, "wb-match: --dtype '%s': expected bf16, fp8 or both\n", optarg);
                return 2;
            }
            so.dtype = optarg;
            break;
        case 's': {
            int64_t v;
            if (wb_parse_i64(optarg, &v) || v < 0 || v > 0x7fffffff) {
                fprintf(stderr, "wb-match: --seed '%s': expected an integer 0..2147483647\n",
                        optarg);
                return 2;
            }
            so.seed = optarg;
            break;
        }
        case 'K':
            so.keep = optarg;
            break;
        case 'G':
            if (strcmp(optarg, "interleaved") && strcmp(optarg, "halves")) {
                fprintf(stderr, "wb-match: --gate-up '%s': expected interleaved or halves\n",
                        optarg);
                return 2;
            }
            so.gate_up = optarg;
            break;
        case 'v': {
            if (so.nvars < (int)(sizeof(so.vars) / sizeof(so.vars[0])))
                so.vars[so.nvars++] = optarg;
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
    if (!check && (strcmp(so.dtype, "both") || strcmp(so.seed, "1") || so.keep || so.gate_up)) {
        fprintf(stderr,
                "wb-match: --dtype, --seed, --keep and --gate-up go with --check-semantics\n");
        return 2;
    }
    if (check) {
        const char *na = tfile            ? "--trainer"
                         : rfile          ? "--rollout"
                         : tconfig        ? "--trainer-config"
                         : save_t         ? "--save-trainer"
                         : save_r         ? "--save-rollout"
                         : list           ? "--list"
                         : have_rank      ? "--rank"
                         : optind != argc ? argv[optind]
                                          : NULL;
        if (na) {
            fprintf(stderr,
                    "wb-match: --check-semantics: %s does not go with it (the check generates "
                    "both inventories from --family and a tiny model of --config)\n",
                    na);
            return 2;
        }
        if (!family || !config) {
            fprintf(stderr, "wb-match: --check-semantics needs --family and --config\n");
            return 2;
        }
        so.family = family;
        so.config = config;
        so.tp = tp ? tp : 2;
        so.ep = ep ? ep : 1;
        return check_semantics(&so);
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
                     : wb_inv_generate_named(family, tconfig, vars, naming, "trainer", &t, &el)) ||
        (err = rfile ? wb_inv_load_file(rfile, &r, &el)
                     : wb_inv_generate_named(family, config, vars, naming, "rollout", &r, &el)))
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
        (err = wb_match_rules_set_naming(rules, naming, &el)) ||
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
