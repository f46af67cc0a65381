/* wb-broadcast — broadcast a Hugging Face safetensors checkpoint into a rollout fleet without a
 * trainer: reader processes read shares of the files and write them into the rollouts with the
 * plan, pipeline and transports of a training update (bcast/bcast.h).
 *
 * Three modes: the coordinator (--job: checks the checkpoint against the job's model, runs the
 * job's controller, waits for the readers and rollouts, runs and watches the transfer), a
 * reader (--reader: one per node or GPU, as many as --readers), and --dry-run (checks and
 * prints the readers' shares and the plan, sending nothing). */
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "agent/agent.h"
#include "bcast/bcast.h"

static const char usage[] =
    "usage: wb-broadcast --checkpoint DIR --dry-run --model FAMILY.yaml [--config config.json]\n"
    "                    [--var NAME=VALUE] [--readers N] [--form auto|model|fp8] [--list]\n"
    "       wb-broadcast --checkpoint DIR --dry-run --job JOB.yaml [--readers N] ...\n"
    "       wb-broadcast --checkpoint DIR --job JOB.yaml [--readers N] [options]\n"
    "       wb-broadcast --checkpoint DIR --reader --controller URL [--rank R] [--readers N]\n"
    "                    [reader options]\n"
    "\n"
    "Broadcasts a safetensors checkpoint to the rollouts of a job, read by N reader processes\n"
    "(one per node or GPU) that write their shares into the rollouts like a training update.\n"
    "  --checkpoint PATH  a directory with model.safetensors.index.json, a directory of\n"
    "                     *.safetensors files, or one .safetensors file\n"
    "  --readers N        reader processes sharing the bytes (default 1; with --job, the job's\n"
    "                     trainers: when it gives them; readers: $WORLD_SIZE / $SLURM_NTASKS)\n"
    "  --form FORM        auto (default): FP8 when the checkpoint holds FP8 tensors; model: the\n"
    "                     trainer inventory as generated; fp8: block-FP8 like the -FP8\n"
    "                     checkpoints (fp8_e4m3 values + FP32 _scale_inv, by the family's fp8\n"
    "                     rule); FP8 values and scales go to FP8 rollouts as they are\n"
    "Dry run (sends nothing):\n"
    "  --dry-run          check the files and the checkpoint against the model (every problem\n"
    "                     is listed) and print the readers' shares, and with --job the plan\n"
    "  --model FILE       model family file (configs/models/): the trainer inventory the\n"
    "                     checkpoint must hold is generated from it and config.json\n"
    "  --config FILE      Hugging Face config.json (default: config.json in the checkpoint)\n"
    "  --var NAME=VALUE   a value for one of the model file's vars (repeatable), e.g. mtp=1\n"
    "  --list             print every piece of every reader\n"
    "Coordinator (--job JOB.yaml: the model, the rollout layout, listen URL and token; it\n"
    "names no trainer_layout):\n"
    "  --listen URL       where the controller listens (default: the job's listen)\n"
    "  --version N        the version the rollouts hold afterwards (default 1)\n"
    "  --wait DURATION    how long to wait for every reader and rollout, at the start and\n"
    "                     for one that died to be restarted (default 10m)\n"
    "  --attempts N       attempts at most; a failed one whose agent died is resumed once it\n"
    "                     is back, sending only what had not landed (default 4)\n"
    "  --timeout DURATION an attempt not done by then fails (default 24h)\n"
    "  --mem-cap SIZE     readers' temporary memory (default: the job's mem_cap, else 1GiB)\n"
    "  --progress MODE    auto (default: a live line on a terminal, else plain), live (one\n"
    "                     line rewritten in place), plain (a line every --period) or off\n"
    "  --period DURATION  plain progress lines this often (default 2s)\n"
    "  --no-verify        skip the checksum check of every write at its rollout\n"
    "Reader (--reader):\n"
    "  --controller URL   the coordinator's controller\n"
    "  --rank R           this reader (default: $RANK (torchrun) or $SLURM_PROCID)\n"
    "  --device D         GPU the reads are copied to (default: host memory)\n"
    "  --io MODE          pread (default) or direct (O_DIRECT: no page cache)\n"
    "  --io-threads N     reading threads (default 2)\n"
    "  --tx-domain NAME   transport domain: NIC or interface\n"
    "  --tx-extra YAML    more transport settings (keys: transport/transport.h)\n"
    "  --trace DIR        a Chrome trace (Perfetto) of the transfer's stages, named by\n"
    "                     tensor, into DIR/trainer<R>.v<version>.json\n"
    "  --pace DURATION    testing: wait this long before each task starts\n"
    "Every process takes the cluster token from --token, else $WB_TOKEN (the coordinator:\n"
    "--token, else the job's token: key, else $WB_TOKEN; --dry-run needs none).\n"
    "Exit status: 0 ok, 1 a problem with the checkpoint, the model or the plan (all are\n"
    "listed; nothing was sent) or a failed broadcast (the reason names the tensor and rank),\n"
    "2 usage.\n";

enum mode { MODE_NONE = 0, MODE_DRY, MODE_RUN, MODE_READER };

struct args {
    const char *ckpt, *model, *config, *job, *listen, *controller, *token, *tx_domain, *tx_extra,
        *trace;
    char vars[1024];
    uint32_t readers, attempts, io_threads;
    bool readers_given, no_verify;
    int64_t rank, device;
    uint64_t version, wait_ns, timeout_ns, mem_cap, pace_ns, period_ns;
    enum wb_ckpt_form form;
    enum wb_ckpt_io_mode io;
    enum wb_bcast_progress progress;
    enum mode mode;
    bool list;
};

static int bad(const char *opt, const char *want, const char *got)
{
    fprintf(stderr, "wb-broadcast: --%s: expected %s, got '%s'\n", opt, want, got);
    return 2;
}

static int parse_u32(const char *opt, const char *s, uint32_t lo, uint32_t hi, uint32_t *out)
{
    uint64_t v;
    char want[64];
    snprintf(want, sizeof(want), "a number from %u to %u", lo, hi);
    if (*s == '-' || wb_parse_u64(s, &v) || v < lo || v > hi)
        return bad(opt, want, s);
    *out = (uint32_t)v;
    return 0;
}

static int set_mode(struct args *a, enum mode m, const char *opt)
{
    if (a->mode && a->mode != m) {
        fprintf(stderr,
                "wb-broadcast: --%s: --dry-run, --reader and running a job exclude each "
                "other\n%s",
                opt, usage);
        return 2;
    }
    a->mode = m;
    return 0;
}

static int parse_args(int argc, char **argv, struct args *a)
{
    static const struct option opts[] = {
        {"checkpoint", required_argument, 0, 'k'},
        {"dry-run", no_argument, 0, 'd'},
        {"model", required_argument, 0, 'm'},
        {"config", required_argument, 0, 'c'},
        {"var", required_argument, 0, 'a'},
        {"job", required_argument, 0, 'j'},
        {"readers", required_argument, 0, 'n'},
        {"form", required_argument, 0, 'f'},
        {"list", no_argument, 0, 'l'},
        {"listen", required_argument, 0, 'L'},
        {"version", required_argument, 0, 'V'},
        {"wait", required_argument, 0, 'W'},
        {"attempts", required_argument, 0, 'A'},
        {"timeout", required_argument, 0, 'T'},
        {"mem-cap", required_argument, 0, 'M'},
        {"progress", required_argument, 0, 'p'},
        {"period", required_argument, 0, 'E'},
        {"no-verify", no_argument, 0, 'N'},
        {"reader", no_argument, 0, 'R'},
        {"controller", required_argument, 0, 'C'},
        {"rank", required_argument, 0, 'r'},
        {"device", required_argument, 0, 'D'},
        {"io", required_argument, 0, 'i'},
        {"io-threads", required_argument, 0, 'I'},
        {"tx-domain", required_argument, 0, 'x'},
        {"tx-extra", required_argument, 0, 'X'},
        {"trace", required_argument, 0, 'e'},
        {"pace", required_argument, 0, 'P'},
        {"token", required_argument, 0, 't'},
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    memset(a, 0, sizeof(*a));
    a->readers = 1;
    a->rank = -1;
    a->device = -1;
    int c, r;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        r = 0;
        switch (c) {
        case 'k':
            a->ckpt = optarg;
            break;
        case 'd':
            r = set_mode(a, MODE_DRY, "dry-run");
            break;
        case 'm':
            a->model = optarg;
            break;
        case 'c':
            a->config = optarg;
            break;
        case 'a': {
            size_t len = strlen(a->vars);
            if ((size_t)snprintf(a->vars + len, sizeof(a->vars) - len, "%s%s", len ? "," : "",
                                 optarg) >= sizeof(a->vars) - len) {
                fprintf(stderr, "wb-broadcast: --var: too many values\n");
                return 2;
            }
            break;
        }
        case 'j':
            a->job = optarg;
            break;
        case 'n':
            r = parse_u32("readers", optarg, 1, WB_CKPT_MAX_READERS, &a->readers);
            a->readers_given = true;
            break;
        case 'f':
            if (strcmp(optarg, "auto") == 0)
                a->form = WB_CKPT_FORM_AUTO;
            else if (strcmp(optarg, "model") == 0)
                a->form = WB_CKPT_FORM_MODEL;
            else if (strcmp(optarg, "fp8") == 0)
                a->form = WB_CKPT_FORM_FP8;
            else
                r = bad("form", "auto, model or fp8", optarg);
            break;
        case 'l':
            a->list = true;
            break;
        case 'L':
            a->listen = optarg;
            break;
        case 'V':
            if (wb_parse_u64(optarg, &a->version) || a->version == 0)
                r = bad("version", "a positive integer", optarg);
            break;
        case 'W':
        case 'T':
        case 'P':
        case 'E': {
            uint64_t ns;
            const char *o = c == 'W' ? "wait" : c == 'T' ? "timeout" : c == 'P' ? "pace" : "period";
            if (wb_parse_duration(optarg, &ns) || (c == 'E' && ns == 0))
                r = bad(o, "a duration such as 30s", optarg);
            *(c == 'W'   ? &a->wait_ns
              : c == 'T' ? &a->timeout_ns
              : c == 'P' ? &a->pace_ns
                         : &a->period_ns) = ns;
            break;
        }
        case 'A':
            r = parse_u32("attempts", optarg, 1, 1000, &a->attempts);
            break;
        case 'M':
            if (wb_parse_size(optarg, &a->mem_cap) || a->mem_cap == 0)
                r = bad("mem-cap", "a size such as 256MiB", optarg);
            break;
        case 'p':
            if (strcmp(optarg, "auto") == 0)
                a->progress = WB_BCAST_PROGRESS_AUTO;
            else if (strcmp(optarg, "live") == 0)
                a->progress = WB_BCAST_PROGRESS_LIVE;
            else if (strcmp(optarg, "plain") == 0)
                a->progress = WB_BCAST_PROGRESS_PLAIN;
            else if (strcmp(optarg, "off") == 0)
                a->progress = WB_BCAST_PROGRESS_OFF;
            else
                r = bad("progress", "auto, live, plain or off", optarg);
            break;
        case 'N':
            a->no_verify = true;
            break;
        case 'R':
            r = set_mode(a, MODE_READER, "reader");
            break;
        case 'C':
            a->controller = optarg;
            break;
        case 'r':
            if (wb_parse_i64(optarg, &a->rank) || a->rank < 0 || a->rank >= WB_CKPT_MAX_READERS)
                r = bad("rank", "a reader rank from 0", optarg);
            break;
        case 'D':
            if (wb_parse_i64(optarg, &a->device) || a->device < -1 || a->device > INT32_MAX)
                r = bad("device", "a GPU index or -1", optarg);
            break;
        case 'i':
            if (strcmp(optarg, "pread") == 0)
                a->io = WB_CKPT_IO_PREAD;
            else if (strcmp(optarg, "direct") == 0)
                a->io = WB_CKPT_IO_DIRECT;
            else if (strcmp(optarg, "mmap") == 0) {
                fprintf(stderr, "wb-broadcast: --io mmap is no longer offered: a checkpoint file "
                                "that shrinks while it is mapped kills the reader (SIGBUS); pread "
                                "(the default) reads the same page cache\n");
                r = 2;
            } else
                r = bad("io", "pread or direct", optarg);
            break;
        case 'I':
            r = parse_u32("io-threads", optarg, 1, 64, &a->io_threads);
            break;
        case 'x':
            a->tx_domain = optarg;
            break;
        case 'X':
            a->tx_extra = optarg;
            break;
        case 'e': {
            int e = wb_endpoint_trace_check(optarg);
            if (e) {
                fprintf(stderr, "wb-broadcast: --trace %s: %s (a directory to write traces into)\n",
                        optarg, wb_strerror(e));
                return 2;
            }
            a->trace = optarg;
            break;
        }
        case 't':
            a->token = optarg;
            break;
        case 'h':
            fputs(usage, stdout);
            exit(0);
        default:
            fputs(usage, stderr);
            return 2;
        }
        if (r)
            return r;
    }
    if (optind < argc) {
        fprintf(stderr, "wb-broadcast: unexpected argument '%s'\n%s", argv[optind], usage);
        return 2;
    }
    if (!a->mode && (a->job || a->ckpt))
        a->mode = MODE_RUN;
    const char *problem = NULL;
    if (!a->ckpt)
        problem = "missing --checkpoint";
    else if (a->mode == MODE_DRY)
        problem = !a->model && !a->job                ? "missing --model or --job"
                  : a->model && a->job                ? "--model and --job exclude each other"
                  : a->job && (a->config || *a->vars) ? "--job gives config.json and vars"
                                                      : NULL;
    else if (a->mode == MODE_RUN)
        problem = !a->job ? "missing --job (or --dry-run, or --reader)"
                  : a->model || a->config || *a->vars
                      ? "--model, --config and --var are for --dry-run: the job gives the model"
                      : NULL;
    else if (a->mode == MODE_READER)
        problem = !a->controller ? "missing --controller" : NULL;
    if (problem) {
        fprintf(stderr, "wb-broadcast: %s\n%s", problem, usage);
        return 2;
    }
    return 0;
}

static int problems(struct wb_errlist *el, const char *what)
{
    fprintf(stderr, "wb-broadcast: %s: %zu problem%s\n", what, el->n, el->n == 1 ? "" : "s");
    wb_errlist_print(el, "  ", stderr);
    return 1;
}

static void print_shares(const struct wb_ckpt *ck, const struct wb_ckpt_shares *s, bool list)
{
    char b1[32], b2[32], b3[32];
    double mean = (double)s->total / s->n;
    uint64_t bound = s->total / s->n + (s->total % s->n != 0);
    printf("%u reader%s: max %s (%llu B), mean %s, min %s; max/mean %.4f; max - ceil(total/N) "
           "= %llu B, one row of a cut tensor <= %llu B\n",
           s->n, s->n == 1 ? "" : "s", wb_fmt_bytes(s->max, b1, sizeof(b1)),
           (unsigned long long)s->max, wb_fmt_bytes((uint64_t)mean, b2, sizeof(b2)),
           wb_fmt_bytes(s->min, b3, sizeof(b3)), mean > 0 ? s->max / mean : 1.0,
           (unsigned long long)(s->max > bound ? s->max - bound : 0), (unsigned long long)s->slack);
    printf("  reader %15s  %7s  %6s  first piece\n", "bytes", "share", "pieces");
    for (uint32_t k = 0; k < s->n; k++) {
        const struct wb_ckpt_share *sh = &s->share[k];
        printf("  %6u %15llu  %6.2f%%  %6zu", k, (unsigned long long)sh->bytes,
               s->total ? 100.0 * (double)sh->bytes / (double)s->total : 0.0, sh->n);
        if (sh->n)
            printf("  %s rows [%llu, %llu)", wb_esc(ck->inv.p[sh->piece[0].tensor].name).s,
                   (unsigned long long)sh->piece[0].row0,
                   (unsigned long long)(sh->piece[0].row0 + sh->piece[0].rows));
        putchar('\n');
        for (size_t i = 0; list && i < sh->n; i++) {
            const struct wb_ckpt_piece *p = &sh->piece[i];
            printf("         %s rows [%llu, %llu) bytes %llu\n",
                   wb_esc(ck->inv.p[p->tensor].name).s, (unsigned long long)p->row0,
                   (unsigned long long)(p->row0 + p->rows), (unsigned long long)p->bytes);
        }
    }
    printf("tensors split over readers: %zu\n", s->nsplit);
    if (list || s->nsplit == 0)
        return;
    /* each split tensor: its row ranges and readers */
    for (uint32_t k = 0; k < s->n; k++) {
        const struct wb_ckpt_share *sh = &s->share[k];
        if (!sh->n)
            continue;
        const struct wb_ckpt_piece *p = &sh->piece[sh->n - 1];
        uint64_t rows = ck->inv.p[p->tensor].shape.ndim ? ck->inv.p[p->tensor].shape.dim[0] : 1;
        if (p->row0 + p->rows == rows || p->bytes == 0)
            continue; /* the tensor ends in this share */
        printf("  %s:", wb_esc(ck->inv.p[p->tensor].name).s);
        for (uint32_t j = k; j < s->n; j++) {
            const struct wb_ckpt_share *o = &s->share[j];
            const struct wb_ckpt_piece *q = j == k                                    ? p
                                            : o->n && o->piece[0].tensor == p->tensor ? &o->piece[0]
                                                                                      : NULL;
            if (!q)
                continue;
            printf(" rows [%llu, %llu) reader %u;", (unsigned long long)q->row0,
                   (unsigned long long)(q->row0 + q->rows), j);
            if (q->row0 + q->rows == rows)
                break;
        }
        putchar('\n');
    }
}

/* With a job: the readers' layout and the plan, as the coordinator would make them. */
static int print_plan(const struct wb_job *job, const struct wb_ckpt *ck, const struct wb_model *md,
                      const struct wb_ckpt_shares *s, struct wb_errlist *el)
{
    struct wb_model m = *md; /* borrowed: the layouts are this function's */
    memset(&m.tl, 0, sizeof(m.tl));
    memset(&m.rl, 0, sizeof(m.rl));
    int err = wb_ckpt_layout(ck, s, &m.tl, el);
    err = err ? err : wb_rollout_layout_load(job->rollout_layout, &m.rl, el);
    err = err ? err : wb_layout_check(&m.tl, &m.rl, el);
    struct wb_plan *p = NULL;
    struct wb_plan_input in = wb_model_input(&m);
    /* the cap fitted to the largest task, as the coordinator's plan has it */
    struct wb_plan_opts po = {
        .mode = (enum wb_plan_mode)job->mode, .mem_cap = job->mem_cap, .fit_cap = true};
    err = err ? err : wb_plan_build(&in, &po, &p, el);
    if (!err) {
        printf("plan for the readers (%s):\n", job->rollout_layout);
        wb_plan_print_summary(p, &in, stdout);
    }
    wb_plan_free(p);
    wb_trainer_layout_free(&m.tl);
    wb_rollout_layout_free(&m.rl);
    return err;
}

static int dry_run(const struct args *a)
{
    struct wb_errlist el;
    wb_errlist_init(&el);
    struct wb_job job;
    memset(&job, 0, sizeof(job));
    bool have_job = false;
    struct wb_model_src src = {.rules = a->model, .config = a->config, .vars = a->vars};
    char *ckcfg = NULL;
    int rc = 0;
    if (a->job) {
        /* a dry run sends nothing: the job's cluster token is not needed (nor asked for) */
        if (wb_job_load(a->job, &job, &el)) {
            rc = problems(&el, a->job);
            goto out;
        }
        have_job = true;
        src = (struct wb_model_src){.rules = job.model.rules,
                                    .config = job.model.hf_config,
                                    .vars = job.model.vars,
                                    .naming = job.model.naming,
                                    .rollout_inv = job.model.rollout_inventory};
    } else if (!a->config) {
        /* config.json of the checkpoint itself */
        if (asprintf(&ckcfg, "%s/config.json", a->ckpt) < 0 || access(ckcfg, R_OK) != 0) {
            fprintf(stderr, "wb-broadcast: no --config and no readable config.json in %s\n",
                    wb_esc(a->ckpt).s);
            rc = 2;
            goto out;
        }
        src.config = ckcfg;
    }
    /* the files and the model, both, so that one run lists every problem of either */
    struct wb_ckpt *ck = NULL;
    struct wb_model md;
    int e1 = wb_ckpt_open(a->ckpt, &ck, &el);
    int e2 = wb_model_load(&src, &md, &el);
    if (e1 || e2) {
        rc = problems(&el, e1 && e2 ? "checkpoint and model" : e1 ? wb_esc(a->ckpt).s : "model");
        if (!e2)
            wb_model_free(&md);
        wb_ckpt_close(ck);
        goto out;
    }
    char b1[32];
    printf("checkpoint %s: %zu file%s, %zu tensors, %s (%llu B)\n", wb_esc(a->ckpt).s, ck->nfiles,
           ck->nfiles == 1 ? "" : "s", ck->inv.n, wb_fmt_bytes(ck->bytes, b1, sizeof(b1)),
           (unsigned long long)ck->bytes);
    int err;
    enum wb_ckpt_form used;
    err = wb_ckpt_check_model(ck, &md, a->form, &used, &el);
    printf("model %s (%s, form %s): %zu trainer tensors\n", src.rules, src.config,
           wb_ckpt_form_name(used), md.trainer.n);
    if (err) {
        rc = problems(&el, "checkpoint against the model");
        goto out_ck;
    }
    printf("check: every tensor matches the model (name, dtype, shape)\n");
    struct wb_ckpt_shares s;
    uint32_t readers =
        a->readers_given || !have_job || !job.trainers ? a->readers : (uint32_t)job.trainers;
    if ((err = wb_ckpt_shares_make(ck, readers, &s))) {
        fprintf(stderr, "wb-broadcast: shares: %s\n", wb_strerror(err));
        rc = 1;
        goto out_ck;
    }
    print_shares(ck, &s, a->list);
    if (have_job && *job.rollout_layout) {
        /* the plan matches the checkpoint's own tensors (FP8 ones are copied) */
        struct wb_model_src cs = src;
        struct wb_model cm;
        cs.trainer_mem = &ck->inv;
        if (wb_model_load(&cs, &cm, &el) == 0) {
            if (print_plan(&job, ck, &cm, &s, &el))
                rc = problems(&el, "plan");
            wb_model_free(&cm);
        } else {
            rc = problems(&el, "plan");
        }
    }
    wb_ckpt_shares_free(&s);
out_ck:
    wb_model_free(&md);
    wb_ckpt_close(ck);
out:
    if (have_job)
        wb_job_free(&job);
    free(ckcfg);
    wb_errlist_free(&el);
    return rc;
}

static int run(const struct args *a)
{
    struct wb_errlist el;
    struct wb_job job;
    wb_errlist_init(&el);
    int err = wb_job_load(a->job, &job, &el);
    if (err) {
        int rc = problems(&el, a->job);
        wb_errlist_free(&el);
        return rc;
    }
    /* --token, else the job's token:, else $WB_TOKEN (which wb_job_load fell back to) */
    if (a->token) {
        free(job.token);
        job.token = strdup(a->token);
    }
    if (!job.token || !*job.token) {
        fprintf(stderr,
                "wb-broadcast: %s: token: no cluster token (give --token, set token: in "
                "the job file or $WB_TOKEN)\n",
                a->job);
        wb_job_free(&job);
        wb_errlist_free(&el);
        return 1;
    }
    if (a->listen) {
        free(job.listen);
        job.listen = strdup(a->listen);
    }
    if (a->mem_cap)
        job.mem_cap = a->mem_cap;
    struct wb_bcast_opts o = {.checkpoint = a->ckpt,
                              .job = &job,
                              .readers = a->readers_given || !job.trainers ? a->readers
                                                                           : (uint32_t)job.trainers,
                              .form = a->form,
                              .version = a->version,
                              .wait_ns = a->wait_ns,
                              .attempts = a->attempts,
                              .transfer_ns = a->timeout_ns,
                              .verify = !a->no_verify,
                              .progress = a->progress,
                              .period_ns = a->period_ns};
    struct wb_bcast_result res;
    int rc = 0;
    if (!job.listen) {
        fprintf(stderr, "wb-broadcast: out of memory\n");
        rc = 1;
    } else if ((err = wb_bcast_run(&o, &res, &el)) != 0) {
        fflush(stdout);
        if (err == -EBADMSG || err == -WB_E_MATCH || err == -WB_E_PLAN || err == -WB_E_CONFIG ||
            (el.n && err != -WB_E_PEER && err != -ETIMEDOUT))
            fprintf(stderr, "wb-broadcast: %zu problem%s; nothing was sent\n", el.n,
                    el.n == 1 ? "" : "s");
        else
            fprintf(stderr, "wb-broadcast: the broadcast failed\n");
        wb_errlist_print(&el, "  ", stderr);
        if (!el.n)
            fprintf(stderr, "  %s\n", wb_strerror(err));
        rc = 1;
    }
    wb_bcast_result_free(&res);
    wb_job_free(&job);
    wb_errlist_free(&el);
    return rc;
}

static int reader(struct args *a)
{
    struct wb_launch_env env;
    const char *badvar = NULL;
    if (wb_launch_env_read(&env, &badvar)) {
        fprintf(stderr, "wb-broadcast: $%s is not a non-negative integer\n", badvar);
        return 2;
    }
    if (a->rank < 0)
        a->rank = env.rank;
    if (a->rank < 0) {
        fprintf(stderr, "wb-broadcast: no reader rank: give --rank, or start under torchrun "
                        "($RANK) or srun ($SLURM_PROCID)\n");
        return 2;
    }
    if (!a->readers_given && env.world > 0)
        a->readers = (uint32_t)env.world;
    if ((uint64_t)a->rank >= a->readers) {
        fprintf(stderr, "wb-broadcast: --rank %lld: there are %u readers (ranks 0 to %u)\n",
                (long long)a->rank, a->readers, a->readers - 1);
        return 2;
    }
    const char *token = wb_token_resolve(a->token);
    if (!token) {
        fprintf(stderr, "wb-broadcast: no cluster token: give --token or set $WB_TOKEN\n");
        return 2;
    }
    struct wb_bcast_reader_opts o = {.checkpoint = a->ckpt,
                                     .controller = a->controller,
                                     .token = token,
                                     .rank = (uint32_t)a->rank,
                                     .readers = a->readers,
                                     .device = (int32_t)a->device,
                                     .io = {.mode = a->io},
                                     .io_threads = a->io_threads,
                                     .tx_domain = a->tx_domain,
                                     .tx_extra = a->tx_extra,
                                     .trace = a->trace,
                                     .pace_ns = a->pace_ns};
    struct wb_errlist el;
    wb_errlist_init(&el);
    int err = wb_bcast_reader_run(&o, &el);
    if (err) {
        fprintf(stderr, "wb-broadcast: reader %u: %zu problem%s\n", o.rank, el.n,
                el.n == 1 ? "" : "s");
        wb_errlist_print(&el, "  ", stderr);
        if (!el.n)
            fprintf(stderr, "  %s\n", wb_strerror(err));
    }
    wb_errlist_free(&el);
    return err ? 1 : 0;
}

int main(int argc, char **argv)
{
    struct args a;
    int rc = parse_args(argc, argv, &a);
    if (rc)
        return rc;
    signal(SIGPIPE, SIG_IGN);
    /* the coordinator reports what its embedded controller would log as warnings itself */
    if (a.mode == MODE_RUN && !getenv("WB_LOG"))
        setenv("WB_LOG", "error", 0);
    switch (a.mode) {
    case MODE_DRY:
        return dry_run(&a);
    case MODE_READER:
        return reader(&a);
    default:
        return run(&a);
    }
}
