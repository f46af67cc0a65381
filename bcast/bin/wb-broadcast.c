/* wb-broadcast — broadcast a Hugging Face safetensors checkpoint into a rollout fleet without a
 * trainer: reader processes read shares of the files and write them into the rollouts with the
 * plan, pipeline and transport of a training update.
 *
 * Today: --dry-run checks every file of the checkpoint and the checkpoint against its model
 * (every problem listed) and prints how the bytes would be shared over --readers readers.
 * Sending needs the endpoint API (a process registering its tensors and pushing them), which is
 * not wired yet: without --dry-run the program says so and exits 2. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckpt/ckpt.h"
#include "controller/controller.h"

static const char usage[] =
    "usage: wb-broadcast --checkpoint DIR --dry-run --model FAMILY.yaml [--config config.json]\n"
    "                    [--var NAME=VALUE] [--readers N] [--form auto|model|fp8] [--list]\n"
    "       wb-broadcast --checkpoint DIR --dry-run --job JOB.yaml [--readers N] ...\n"
    "\n"
    "Broadcasts a safetensors checkpoint to the rollouts of a job, read by N reader processes.\n"
    "  --checkpoint PATH  a directory with model.safetensors.index.json, a directory of\n"
    "                     *.safetensors files, or one .safetensors file\n"
    "  --dry-run          check the files and the checkpoint against the model (every problem\n"
    "                     is listed) and print the readers' shares; sends nothing\n"
    "  --model FILE       model family file (configs/models/): the trainer inventory the\n"
    "                     checkpoint must hold is generated from it and config.json\n"
    "  --config FILE      Hugging Face config.json (default: config.json in the checkpoint)\n"
    "  --var NAME=VALUE   a value for one of the model file's vars (repeatable), e.g. mtp=1\n"
    "  --job FILE         a job file instead: its model (rules, hf_config, vars or inventories)\n"
    "  --readers N        reader processes sharing the bytes (default 1)\n"
    "  --form FORM        auto (default): FP8 when the checkpoint holds FP8 tensors; model: the\n"
    "                     trainer inventory as generated; fp8: block-FP8 like the -FP8\n"
    "                     checkpoints (fp8_e4m3 values + FP32 _scale_inv, by the family's fp8\n"
    "                     rule)\n"
    "  --list             print every piece of every reader\n"
    "Exit status: 0 ok, 1 a problem with the checkpoint (all are listed), 2 usage, or sending\n"
    "asked for (not available yet).\n";

struct args {
    const char *ckpt, *model, *config, *job;
    char vars[1024];
    uint32_t readers;
    enum wb_ckpt_form form;
    bool dry, list;
};

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
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    memset(a, 0, sizeof(*a));
    a->readers = 1;
    int c;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case 'k':
            a->ckpt = optarg;
            break;
        case 'd':
            a->dry = true;
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
        case 'n': {
            char *end;
            unsigned long v = strtoul(optarg, &end, 10);
            if (*end || *optarg == '-' || !*optarg || v < 1 || v > WB_CKPT_MAX_READERS) {
                fprintf(stderr,
                        "wb-broadcast: --readers: expected a number from 1 to %u, got '%s'\n",
                        WB_CKPT_MAX_READERS, optarg);
                return 2;
            }
            a->readers = (uint32_t)v;
            break;
        }
        case 'f':
            if (strcmp(optarg, "auto") == 0)
                a->form = WB_CKPT_FORM_AUTO;
            else if (strcmp(optarg, "model") == 0)
                a->form = WB_CKPT_FORM_MODEL;
            else if (strcmp(optarg, "fp8") == 0)
                a->form = WB_CKPT_FORM_FP8;
            else {
                fprintf(stderr, "wb-broadcast: --form: expected auto, model or fp8, got '%s'\n",
                        optarg);
                return 2;
            }
            break;
        case 'l':
            a->list = true;
            break;
        case 'h':
            fputs(usage, stdout);
            exit(0);
        default:
            fputs(usage, stderr);
            return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "wb-broadcast: unexpected argument '%s'\n%s", argv[optind], usage);
        return 2;
    }
    const char *problem = !a->ckpt               ? "missing --checkpoint"
                          : !a->model && !a->job ? "missing --model or --job"
                          : a->model && a->job   ? "--model and --job exclude each other"
                          : a->job && (a->config || *a->vars) ? "--job gives config.json and vars"
                                                              : NULL;
    if (problem) {
        fprintf(stderr, "wb-broadcast: %s\n%s", problem, usage);
        return 2;
    }
    if (!a->dry) {
        fprintf(stderr, "wb-broadcast: sending needs the endpoint API, which is not wired yet; "
                        "--dry-run checks the checkpoint and prints the readers' shares\n");
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
            printf("  %s rows [%llu, %llu)", ck->inv.p[sh->piece[0].tensor].name,
                   (unsigned long long)sh->piece[0].row0,
                   (unsigned long long)(sh->piece[0].row0 + sh->piece[0].rows));
        putchar('\n');
        for (size_t i = 0; list && i < sh->n; i++) {
            const struct wb_ckpt_piece *p = &sh->piece[i];
            printf("         %s rows [%llu, %llu) bytes %llu\n", ck->inv.p[p->tensor].name,
                   (unsigned long long)p->row0, (unsigned long long)(p->row0 + p->rows),
                   (unsigned long long)p->bytes);
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
        printf("  %s:", ck->inv.p[p->tensor].name);
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

int main(int argc, char **argv)
{
    struct args a;
    int rc = parse_args(argc, argv, &a);
    if (rc)
        return rc;
    struct wb_errlist el;
    wb_errlist_init(&el);
    struct wb_job job;
    memset(&job, 0, sizeof(job));
    bool have_job = false;
    struct wb_model_src src = {.rules = a.model, .config = a.config, .vars = a.vars};
    char *ckcfg = NULL;
    if (a.job) {
        /* a dry run sends nothing, so the job's cluster token is not needed */
        if (!getenv("WB_TOKEN"))
            setenv("WB_TOKEN", "dry-run", 0);
        if (wb_job_load(a.job, &job, &el)) {
            rc = problems(&el, a.job);
            goto out;
        }
        have_job = true;
        src = (struct wb_model_src){.rules = job.model.rules,
                                    .config = job.model.hf_config,
                                    .vars = job.model.vars,
                                    .trainer_inv = job.model.trainer_inventory,
                                    .rollout_inv = job.model.rollout_inventory};
    } else if (!a.config) {
        /* config.json of the checkpoint itself */
        if (asprintf(&ckcfg, "%s/config.json", a.ckpt) < 0 || access(ckcfg, R_OK) != 0) {
            fprintf(stderr, "wb-broadcast: no --config and no readable config.json in %s\n",
                    a.ckpt);
            rc = 2;
            goto out;
        }
        src.config = ckcfg;
    }
    /* the files and the model, both, so that one run lists every problem of either */
    struct wb_ckpt *ck = NULL;
    struct wb_model md;
    int e1 = wb_ckpt_open(a.ckpt, &ck, &el);
    int e2 = wb_model_load(&src, &md, &el);
    if (e1 || e2) {
        rc = problems(&el, e1 && e2 ? "checkpoint and model" : e1 ? a.ckpt : "model");
        if (!e2)
            wb_model_free(&md);
        wb_ckpt_close(ck);
        goto out;
    }
    char b1[32];
    printf("checkpoint %s: %zu file%s, %zu tensors, %s (%llu B)\n", a.ckpt, ck->nfiles,
           ck->nfiles == 1 ? "" : "s", ck->inv.n, wb_fmt_bytes(ck->bytes, b1, sizeof(b1)),
           (unsigned long long)ck->bytes);
    int err;
    enum wb_ckpt_form used;
    err = wb_ckpt_check_model(ck, &md, a.form, &used, &el);
    printf("model %s (%s, form %s): %zu trainer tensors\n", src.rules,
           src.trainer_inv && *src.trainer_inv ? src.trainer_inv : src.config,
           wb_ckpt_form_name(used), md.trainer.n);
    if (err) {
        rc = problems(&el, "checkpoint against the model");
        goto out_ck;
    }
    printf("check: every tensor matches the model (name, dtype, shape)\n");
    struct wb_ckpt_shares s;
    if ((err = wb_ckpt_shares_make(ck, a.readers, &s))) {
        fprintf(stderr, "wb-broadcast: shares: %s\n", wb_strerror(err));
        rc = 1;
        goto out_ck;
    }
    print_shares(ck, &s, a.list);
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
