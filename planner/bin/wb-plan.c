/* wb-plan — the dry-run planner: given a model and two cluster layouts, print what a weight
 * update will cost (bytes per GPU, balance, mesh groups, entries, estimated time) and every
 * problem found, without any hardware. Also writes the plan as JSON and an SVG report. */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "planner/planner.h"

static const char usage[] =
    "usage: wb-plan --model FAMILY.yaml [--config config.json] --trainer T.yaml --rollout R.yaml\n"
    "               [--mode auto|direct|gather] [--mem-cap 1GiB] [--threads N] [--estimate]\n"
    "               [--json plan.json [--tables]] [--svg plan.svg] [--dump RANK] [--verify]\n"
    "               [--hw [trainer.|rollout.]KEY=VALUE] [--max-problems N] [--changed F] [--join]\n"
    "               [--relay off|chain|tree|auto [--relay-fanout K] [--relay-roots R]]\n"
    "       wb-plan --model FAMILY.yaml --trainer-inv T.json --rollout-inv R.json --trainer ...\n"
    "       wb-plan --dump-config\n"
    "\n"
    "Plans a trainer -> rollout weight transfer and prints a summary.\n"
    "  --model FILE        model family file (configs/models/): name templates and match rules\n"
    "  --config FILE       Hugging Face config.json giving the model's sizes (configs/hf/)\n"
    "  --var NAME=VALUE    a value for one of the model file's vars (repeatable), e.g. mtp=1\n"
    "  --naming NAME       the trainer naming (one of the model file's namings, e.g.\n"
    "                      megatron); default the file's first\n"
    "  --hw [trainer.|rollout.]KEY=VALUE\n"
    "                      a what-if over the layouts' hardware models (repeatable; both\n"
    "                      sides unless one is named), e.g. --hw nic_gbps=200: the keys of\n"
    "                      --dump-config's hardware section, applied before planning\n"
    "  --trainer-inv FILE  trainer inventory (YAML/JSON name -> {dtype, shape}) instead of\n"
    "  --rollout-inv FILE  rollout inventory      generating them from --model and --config\n"
    "  --trainer FILE      trainer layout: mesh, placement rules, residence, hardware\n"
    "  --rollout FILE      rollout layout: replicas, tp, ep, hardware\n"
    "  --mode MODE         direct: each owner writes its shard (amax exchange where FP8 blocks\n"
    "                      straddle owners); gather: the reference (full_tensor() first); auto\n"
    "                      (default): per tensor group whichever costs less on the hardware\n"
    "                      model, never slower than both plain modes by the estimate\n"
    "  --relay SHAPE       replicas relaying to replicas: off (default: the trainers write\n"
    "                      every replica), chain, tree (the trainers write only the roots,\n"
    "                      every other replica is written by its parent replica, rank by\n"
    "                      rank), auto (the shape with the lowest simulated time, off\n"
    "                      included; needs the layouts' hardware models)\n"
    "  --relay-fanout K    children per relaying replica of a tree (default 2)\n"
    "  --relay-roots R     replicas the trainers write (default 1; auto: tries 1, 2, 4, ...)\n"
    "  --mem-cap SIZE      executor temporary-memory cap per GPU (default 1GiB)\n"
    "  --threads N         threads building the tables (default: one per CPU, at most 8); the\n"
    "                      plan is the same for any number\n"
    "  --estimate          simulate the execution: time per phase and overall, lower bound\n"
    "  --changed F         estimate a delta update where a fraction F (0 < F <= 1) of the\n"
    "                      FP8/BF16 bytes changed (a record per write: 32-byte header, 5 bytes\n"
    "                      per changed byte; a write goes in full where its record is over half\n"
    "                      its size or not cheaper): bytes sent and time against a full update\n"
    "  --join              estimate catching up a replica that joins the running job: an\n"
    "                      update to that replica alone (nothing is re-planned: the plan\n"
    "                      covers every replica up to `replicas:`, the fleet's capacity)\n"
    "  --json FILE         write the plan summary as JSON (--tables: with every routing table\n"
    "                      and receive list, both inventories and every shard box: the file can\n"
    "                      be audited on its own, e.g. by tests/sh/plan_audit.py)\n"
    "  --svg FILE          bar charts of bytes per trainer and rollout GPU and the timeline\n"
    "  --dump RANK         print trainer RANK's routing table, one line per op and write\n"
    "  --verify            check the plan's invariants (bytes written once, sources held, ...)\n"
    "  --max-problems N    list at most N problems (default 20; 0: every one kept); all are\n"
    "                      counted\n"
    "  --dump-config       print the documented layout and hardware keys\n"
    "Input files and the --json/--svg paths are checked before anything is planned.\n"
    "Exit status: 0 ok, 1 a problem in the inputs (all problems are counted), 2 usage.\n";

struct args {
    const char *model, *config, *tinv, *rinv, *trainer, *rollout, *json, *svg, *naming;
    char vars[1024];
    const char *hw[32]; /* --hw [trainer.|rollout.]KEY=VALUE, in order */
    size_t nhw;
    enum wb_plan_mode mode;
    uint64_t mem_cap;
    uint32_t threads;
    bool estimate, tables, verify, join;
    double changed; /* --changed: > 0 asks for the delta estimate */
    long dump;
    size_t max_problems;
    struct wb_relay relay;
};

/* --hw: what-if values over the layouts' hardware models (both sides unless a side is named),
 * before planning: auto mode chooses by them too. */
static int apply_hw(const struct args *a, struct wb_model *md)
{
    for (size_t i = 0; i < a->nhw; i++) {
        char key[64], err[512];
        const char *eq = strchr(a->hw[i], '='), *k = a->hw[i];
        bool tr = true, ro = true;
        if (strncmp(k, "trainer.", 8) == 0)
            k += 8, ro = false;
        else if (strncmp(k, "rollout.", 8) == 0)
            k += 8, tr = false;
        snprintf(key, sizeof(key), "%.*s", (int)(eq - k), k);
        struct wb_hw *side[2] = {tr ? &md->tl.hw : NULL, ro ? &md->rl.hw : NULL};
        for (int s = 0; s < 2; s++) {
            if (!side[s])
                continue;
            if (side[s]->nic_gbps <= 0) {
                fprintf(stderr, "wb-plan: --hw %s: the %s layout has no hardware model to change\n",
                        a->hw[i], s ? "rollout" : "trainer");
                return -WB_E_CONFIG;
            }
            if (wb_hw_set(side[s], key, eq + 1, err, sizeof(err))) {
                fprintf(stderr, "wb-plan: --hw %s: %s\n", a->hw[i], err);
                return -WB_E_CONFIG;
            }
        }
    }
    return 0;
}

static int parse_args(int argc, char **argv, struct args *a)
{
    static const struct option opts[] = {
        {"model", required_argument, 0, 'm'},
        {"config", required_argument, 0, 'c'},
        {"var", required_argument, 0, 'a'},
        {"naming", required_argument, 0, 'N'},
        {"hw", required_argument, 0, 'H'},
        {"trainer-inv", required_argument, 0, 'T'},
        {"rollout-inv", required_argument, 0, 'R'},
        {"trainer", required_argument, 0, 't'},
        {"rollout", required_argument, 0, 'r'},
        {"mode", required_argument, 0, 'M'},
        {"mem-cap", required_argument, 0, 'C'},
        {"threads", required_argument, 0, 'n'},
        {"estimate", no_argument, 0, 'e'},
        {"changed", required_argument, 0, 'g'},
        {"join", no_argument, 0, 'J'},
        {"json", required_argument, 0, 'j'},
        {"tables", no_argument, 0, 'b'},
        {"svg", required_argument, 0, 's'},
        {"dump", required_argument, 0, 'd'},
        {"verify", no_argument, 0, 'v'},
        {"dump-config", no_argument, 0, 'D'},
        {"max-problems", required_argument, 0, 'P'},
        {"relay", required_argument, 0, 'L'},
        {"relay-fanout", required_argument, 0, 'F'},
        {"relay-roots", required_argument, 0, 'O'},
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    memset(a, 0, sizeof(*a));
    a->mode = WB_MODE_AUTO;
    a->mem_cap = 0; /* the planner's default */
    a->dump = -1;
    a->max_problems = 20;
    int c;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case 'm':
            a->model = optarg;
            break;
        case 'c':
            a->config = optarg;
            break;
        case 'N':
            a->naming = optarg;
            break;
        case 'a': {
            size_t len = strlen(a->vars);
            if ((size_t)snprintf(a->vars + len, sizeof(a->vars) - len, "%s%s", len ? "," : "",
                                 optarg) >= sizeof(a->vars) - len) {
                fprintf(stderr, "wb-plan: --var: too many values\n");
                return 2;
            }
            break;
        }
        case 'H':
            if (a->nhw == WB_ARRAY_LEN(a->hw)) {
                fprintf(stderr, "wb-plan: --hw: at most %zu\n", WB_ARRAY_LEN(a->hw));
                return 2;
            }
            if (!strchr(optarg, '=')) {
                fprintf(stderr, "wb-plan: --hw: expected [trainer.|rollout.]KEY=VALUE, got '%s'\n",
                        optarg);
                return 2;
            }
            a->hw[a->nhw++] = optarg;
            break;
        case 'T':
            a->tinv = optarg;
            break;
        case 'R':
            a->rinv = optarg;
            break;
        case 't':
            a->trainer = optarg;
            break;
        case 'r':
            a->rollout = optarg;
            break;
        case 'M':
            if (wb_plan_mode_parse(optarg, &a->mode)) {
                fprintf(stderr, "wb-plan: --mode: expected auto, direct or gather, got '%s'\n",
                        optarg);
                return 2;
            }
            break;
        case 'C':
            if (wb_parse_size(optarg, &a->mem_cap) || a->mem_cap == 0) {
                fprintf(stderr, "wb-plan: --mem-cap: expected a size such as 1GiB, got '%s'\n",
                        optarg);
                return 2;
            }
            break;
        case 'n': {
            char *end;
            unsigned long v = strtoul(optarg, &end, 10);
            if (*end || *optarg == '-' || v < 1 || v > 64) {
                fprintf(stderr, "wb-plan: --threads: expected a number from 1 to 64, got '%s'\n",
                        optarg);
                return 2;
            }
            a->threads = (uint32_t)v;
            break;
        }
        case 'e':
            a->estimate = true;
            break;
        case 'J':
            a->join = true;
            break;
        case 'L':
            if (wb_relay_kind_parse(optarg, &a->relay.kind)) {
                fprintf(stderr, "wb-plan: --relay: expected off, chain, tree or auto, got '%s'\n",
                        optarg);
                return 2;
            }
            break;
        case 'g': {
            char *end;
            a->changed = strtod(optarg, &end);
            if (end == optarg || *end || !(a->changed > 0 && a->changed <= 1)) {
                fprintf(stderr,
                        "wb-plan: --changed: expected a fraction of the bytes, 0 < F <= 1 "
                        "(0.002 for 0.2 %%), got '%s'\n",
                        optarg);
                return 2;
            }
            break;
        }
        case 'F':
        case 'O': {
            char *end;
            unsigned long v = strtoul(optarg, &end, 10);
            if (*end || !*optarg || *optarg == '-' || v < 1 || v > 65536) {
                fprintf(stderr,
                        "wb-plan: --relay-%s: expected a number from 1 to 65536, got '%s'\n",
                        c == 'F' ? "fanout" : "roots", optarg);
                return 2;
            }
            *(c == 'F' ? &a->relay.fanout : &a->relay.roots) = (uint32_t)v;
            break;
        }
        case 'j':
            a->json = optarg;
            break;
        case 'b':
            a->tables = true;
            break;
        case 's':
            a->svg = optarg;
            break;
        case 'd': {
            char *end;
            a->dump = strtol(optarg, &end, 10);
            if (*end || a->dump < 0) {
                fprintf(stderr, "wb-plan: --dump: expected a trainer rank, got '%s'\n", optarg);
                return 2;
            }
            break;
        }
        case 'v':
            a->verify = true;
            break;
        case 'P': {
            char *end;
            unsigned long long v = strtoull(optarg, &end, 10);
            if (*end || !*optarg || *optarg == '-') {
                fprintf(stderr, "wb-plan: --max-problems: expected a number (0: all), got '%s'\n",
                        optarg);
                return 2;
            }
            a->max_problems = v ? (size_t)v : SIZE_MAX;
            break;
        }
        case 'D':
            wb_layout_dump_docs(stdout);
            exit(0);
        case 'h':
            fputs(usage, stdout);
            exit(0);
        default:
            fputs(usage, stderr);
            return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "wb-plan: unexpected argument '%s'\n%s", argv[optind], usage);
        return 2;
    }
    const char *missing = !a->model                  ? "--model"
                          : !a->trainer              ? "--trainer"
                          : !a->rollout              ? "--rollout"
                          : (!a->tinv != !a->rinv)   ? "--trainer-inv with --rollout-inv"
                          : (!a->tinv && !a->config) ? "--config (or inventories)"
                                                     : NULL;
    if (missing) {
        fprintf(stderr, "wb-plan: missing %s\n%s", missing, usage);
        return 2;
    }
    if ((a->relay.fanout || a->relay.roots) && a->relay.kind == WB_PLAN_RELAY_OFF) {
        fprintf(stderr, "wb-plan: --relay-fanout and --relay-roots go with --relay chain, tree or "
                        "auto\n");
        return 2;
    }
    if (a->tables && !a->json) {
        fprintf(stderr, "wb-plan: --tables goes with --json FILE (it adds the tables to it)\n");
        return 2;
    }
    return 0;
}

/* Lists the first max problems of el (all of them are counted) and how many were left out. */
static int fail(struct wb_errlist *el, const char *what, size_t max)
{
    size_t n = wb_errlist_count(el), show = el->n < max ? el->n : max;
    fprintf(stderr, "wb-plan: %s: %zu problem%s\n", what, n, n == 1 ? "" : "s");
    for (size_t i = 0; i < show; i++)
        fprintf(stderr, "  %s\n", el->msgs[i]);
    if (n > show)
        fprintf(stderr, "  ... and %zu more, not listed%s\n", n - show,
                el->n > show ? " (--max-problems N lists more)" : "");
    return 1;
}

/* ---------------------------------------------------------------- files */

struct file_arg {
    const char *opt, *path;
    bool out;
    struct stat st;
    bool exists;
    int fd; /* outputs: open while the files are compared, so no inode is reused */
};

/* Every input must be a readable file and every output a file that can be written (created
 * and removed again when it does not exist yet), none of them the same file as another: all
 * of that is known before a minute of planning, so it is checked first. */
static void check_files(struct file_arg *f, size_t n, struct wb_errlist *el)
{
    for (size_t i = 0; i < n; i++) {
        if (!f[i].path)
            continue;
        f[i].exists = stat(f[i].path, &f[i].st) == 0;
        int e = errno;
        if (f[i].exists && S_ISDIR(f[i].st.st_mode)) {
            wb_errlist_add(el, "%s %s: is a directory, not a file", f[i].opt, f[i].path);
            continue;
        }
        if (!f[i].out) {
            if (!f[i].exists || access(f[i].path, R_OK) != 0)
                wb_errlist_add(el, "%s %s: cannot read: %s", f[i].opt, f[i].path,
                               strerror(f[i].exists ? errno : e));
            continue;
        }
        f[i].fd = open(f[i].path, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
        if (f[i].fd < 0)
            wb_errlist_add(el, "%s %s: cannot write: %s", f[i].opt, f[i].path, strerror(errno));
        else if (!f[i].exists)
            fstat(f[i].fd, &f[i].st);
    }
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j < n; j++)
            if (j != i && f[i].out && f[j].path && f[i].path && (f[j].out ? j < i : true) &&
                f[i].st.st_ino && f[i].st.st_dev == f[j].st.st_dev &&
                f[i].st.st_ino == f[j].st.st_ino)
                wb_errlist_add(el, "%s %s: is the same file as %s %s, which it would overwrite",
                               f[i].opt, f[i].path, f[j].opt, f[j].path);
    for (size_t i = 0; i < n; i++)
        if (f[i].out && f[i].fd >= 0) {
            if (!f[i].exists)
                unlink(f[i].path); /* created only to see that it can be */
            close(f[i].fd);
        }
}

int main(int argc, char **argv)
{
    struct args a;
    int rc = parse_args(argc, argv, &a);
    if (rc)
        return rc;
    struct wb_errlist el, est_el;
    wb_errlist_init(&el);
    wb_errlist_init(&est_el);
    struct wb_model md;
    struct wb_plan *plan = NULL;
    struct wb_estimate est;
    bool have_est = false;
    memset(&est, 0, sizeof(est));
    rc = 1;
    struct file_arg files[] = {
        {"--model", a.model, false, {0}, false, -1},
        {"--config", a.config, false, {0}, false, -1},
        {"--trainer", a.trainer, false, {0}, false, -1},
        {"--rollout", a.rollout, false, {0}, false, -1},
        {"--trainer-inv", a.tinv, false, {0}, false, -1},
        {"--rollout-inv", a.rinv, false, {0}, false, -1},
        {"--json", a.json, true, {0}, false, -1},
        {"--svg", a.svg, true, {0}, false, -1},
    };
    check_files(files, WB_ARRAY_LEN(files), &el);
    if (el.n) {
        fail(&el, "files", a.max_problems);
        wb_errlist_free(&el);
        return 1;
    }
    struct wb_model_src src = {.rules = a.model,
                               .config = a.config,
                               .vars = a.vars,
                               .naming = a.naming,
                               .trainer_inv = a.tinv,
                               .rollout_inv = a.rinv,
                               .trainer_layout = a.trainer,
                               .rollout_layout = a.rollout};
    if (wb_model_load(&src, &md, &el)) {
        fail(&el, "model and layouts", a.max_problems);
        wb_errlist_free(&el);
        return 1;
    }
    if (apply_hw(&a, &md)) {
        wb_model_free(&md);
        wb_errlist_free(&el);
        return 1;
    }
    if (a.dump >= 0 && (uint64_t)a.dump >= md.tl.world) {
        fprintf(stderr, "wb-plan: --dump %ld: the trainer has %u ranks (0 to %u)\n", a.dump,
                md.tl.world, md.tl.world - 1);
        wb_model_free(&md);
        wb_errlist_free(&el);
        return 1;
    }
    struct wb_plan_input in = wb_model_input(&md);
    /* lazy: every reader here takes the tables through wb_plan_table() */
    struct wb_plan_opts po = {
        .mode = a.mode, .mem_cap = a.mem_cap, .threads = a.threads, .lazy = true, .relay = a.relay};
    uint64_t t0 = wb_now_ns();
    /* refused as a job refuses it: a task over the cap would never start */
    if (wb_plan_build(&in, &po, &plan, &el) || wb_plan_check_cap(plan, &in, &el)) {
        fail(&el, "planning", a.max_problems);
        goto out;
    }
    double plan_s = (double)(wb_now_ns() - t0) * 1e-9;
    printf("wb-plan: %s (%s) -> %s, %zu trainer and %zu rollout tensors, planned in %.2f s\n",
           a.trainer, a.model, a.rollout, md.trainer.n, md.rollout.n, plan_s);
    wb_plan_print_summary(plan, &in, stdout);
    wb_relay_print(plan, stdout);
    char warn[512];
    if (wb_plan_dtype_warning(&in, warn, sizeof(warn)))
        fprintf(stderr, "wb-plan: warning: %s (--config %s)\n", warn, a.config ? a.config : "-");
    /* both: side by side (verify's problems first, and no estimate of a plan that fails it) */
    struct wb_plan_checks ck = {0};
    if (a.verify && a.estimate) {
        wb_plan_verify_estimate(plan, &in, &est, &el, &est_el, &ck);
    } else if (a.verify) {
        t0 = wb_now_ns();
        ck.verify_rc = wb_plan_verify(plan, &in, &el);
        ck.verify_s = (double)(wb_now_ns() - t0) * 1e-9;
    } else if (a.estimate) {
        t0 = wb_now_ns();
        ck.est_rc = wb_plan_estimate(plan, &in, &est, &est_el);
        ck.est_s = (double)(wb_now_ns() - t0) * 1e-9;
    }
    if (a.verify) {
        if (ck.verify_rc) {
            fail(&el, "verify", a.max_problems);
            goto out;
        }
        printf("  verify: ok (every destination byte written once, every source held%s) in "
               "%.2f s\n",
               plan->relay.kind != WB_PLAN_RELAY_OFF
                   ? "; relay: every replica written once, by the trainers or a parent "
                     "holding the same receive lists"
                   : "",
               ck.verify_s);
    }
    if (a.estimate) {
        if (ck.est_rc) {
            fail(&est_el, "estimate", a.max_problems);
            goto out;
        }
        have_est = true;
        wb_estimate_print(&est, plan, stdout);
        /* auto mode may have simulated this plan while choosing it: then this is a copy */
        printf("  (estimate in %.2f s)\n", ck.est_s);
    }
    if (a.changed > 0) {
        struct wb_delta_estimate de;
        if (wb_plan_estimate_delta(plan, &in, a.changed, &de, &est_el)) {
            fail(&est_el, "delta estimate", a.max_problems);
            goto out;
        }
        wb_delta_estimate_print(&de, stdout);
    }
    if (a.join) {
        struct wb_estimate je;
        uint64_t t0 = wb_now_ns();
        if (wb_plan_estimate_join(plan, &in, &je, &est_el)) {
            fail(&est_el, "join estimate", a.max_problems);
            goto out;
        }
        uint32_t nrep = wb_plan_replicas(plan);
        printf("join: a replica added while the job runs (within replicas: %u, the capacity the "
               "plan covers) is not re-planned: it is set up alone, then caught up from the "
               "trainers in %.3f s (one update to it alone; estimated in %.2f s)\n",
               nrep, je.total_s, (double)(wb_now_ns() - t0) / 1e9);
        wb_estimate_free(&je);
    }
    if (a.dump >= 0) {
        struct wb_plan_tbuf tb = {0};
        const struct wb_route_table *t = wb_plan_table(plan, (uint32_t)a.dump, &tb);
        if (!t) {
            fprintf(stderr, "wb-plan: --dump %ld: %s\n", a.dump, wb_strerror(-ENOMEM));
            wb_plan_tbuf_free(&tb);
            goto out;
        }
        wb_route_table_print(t, &in, stdout);
        wb_plan_tbuf_free(&tb);
    }
    if (a.json) {
        FILE *f = fopen(a.json, "w");
        int e = f ? wb_plan_write_json_est(plan, &in, a.tables, have_est ? &est : NULL, f) : -errno;
        if (f && fclose(f) && !e)
            e = -errno;
        if (e) {
            fprintf(stderr, "wb-plan: %s: %s\n", a.json, wb_strerror(e));
            goto out;
        }
    }
    if (a.svg) {
        FILE *f = fopen(a.svg, "w");
        int e = f ? wb_plan_write_svg(plan, have_est ? &est : NULL, f) : -errno;
        if (f && fclose(f) && !e)
            e = -errno;
        if (e) {
            fprintf(stderr, "wb-plan: %s: %s\n", a.svg, wb_strerror(e));
            goto out;
        }
    }
    rc = 0;
out:
    if (have_est)
        wb_estimate_free(&est);
    wb_plan_free(plan);
    wb_model_free(&md);
    wb_errlist_free(&el);
    wb_errlist_free(&est_el);
    return rc;
}
