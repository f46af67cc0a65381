/* wb-ckpt-write — writes a real safetensors checkpoint of a model with the synthetic source's
 * values (ckpt/write.c): what the demo, the broadcast tests and the benchmarks broadcast, and
 * what `wb-ctl verify` can check rollouts against (the values are those a synthetic trainer of
 * the same seed holds at the same version; an FP8 checkpoint holds their block quantization). */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/ckpt.h"

static const char usage[] =
    "usage: wb-ckpt-write --model FAMILY.yaml --config config.json --out DIR [--files N]\n"
    "                     [--seed S] [--version V] [--form model|fp8] [--var NAME=VALUE]\n"
    "\n"
    "Writes a safetensors checkpoint of the model's trainer tensors with synthetic values.\n"
    "  --model FILE      model family file (configs/models/)\n"
    "  --config FILE     Hugging Face config.json (also copied into DIR as config.json)\n"
    "  --out DIR         created when missing\n"
    "  --files N         data files (default 1: one model.safetensors; more: an index)\n"
    "  --seed S          synthetic source seed (default 42, the demo job's)\n"
    "  --version V       synthetic source version (default 1)\n"
    "  --form FORM       model (default: the trainer inventory, BF16 for most families) or\n"
    "                    fp8 (fp8_e4m3 values + FP32 _scale_inv, like the -FP8 checkpoints)\n"
    "  --var NAME=VALUE  a value for one of the model file's vars (repeatable)\n"
    "Exit status: 0 ok, 1 a problem (named), 2 usage.\n";

static int copy_file(const char *from, const char *dir)
{
    char to[4096];
    snprintf(to, sizeof(to), "%s/config.json", dir);
    FILE *a = fopen(from, "rb"), *b = a ? fopen(to, "wb") : NULL;
    char buf[65536];
    size_t n;
    int rc = a && b ? 0 : -1;
    while (!rc && (n = fread(buf, 1, sizeof(buf), a)) > 0)
        rc = fwrite(buf, 1, n, b) == n ? 0 : -1;
    if (a)
        fclose(a);
    if (b && fclose(b))
        rc = -1;
    if (rc)
        fprintf(stderr, "wb-ckpt-write: cannot copy %s to %s\n", from, to);
    return rc;
}

int main(int argc, char **argv)
{
    static const struct option lo[] = {
        {"model", required_argument, 0, 'm'}, {"config", required_argument, 0, 'c'},
        {"out", required_argument, 0, 'o'},   {"files", required_argument, 0, 'f'},
        {"seed", required_argument, 0, 's'},  {"version", required_argument, 0, 'v'},
        {"form", required_argument, 0, 'F'},  {"var", required_argument, 0, 'a'},
        {"help", no_argument, 0, 'h'},        {0, 0, 0, 0},
    };
    const char *model = NULL, *config = NULL, *out = NULL;
    char vars[1024] = "";
    struct wb_ckpt_write_opts wo = {.seed = 42, .version = 1, .files = 1};
    enum wb_ckpt_form form = WB_CKPT_FORM_MODEL;
    int c;
    while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
        uint64_t v;
        switch (c) {
        case 'm':
            model = optarg;
            break;
        case 'c':
            config = optarg;
            break;
        case 'o':
            out = optarg;
            break;
        case 'f':
        case 's':
        case 'v':
            if (wb_parse_u64(optarg, &v) || (c == 'f' && (v < 1 || v > WB_CKPT_MAX_FILES))) {
                fprintf(stderr, "wb-ckpt-write: --%s: expected %s, got '%s'\n",
                        c == 'f'   ? "files"
                        : c == 's' ? "seed"
                                   : "version",
                        c == 'f' ? "a number of files from 1" : "a non-negative integer", optarg);
                return 2;
            }
            if (c == 'f')
                wo.files = (uint32_t)v;
            else
                *(c == 's' ? &wo.seed : &wo.version) = v;
            break;
        case 'F':
            if (strcmp(optarg, "model") == 0)
                form = WB_CKPT_FORM_MODEL;
            else if (strcmp(optarg, "fp8") == 0)
                form = WB_CKPT_FORM_FP8;
            else {
                fprintf(stderr, "wb-ckpt-write: --form: expected model or fp8, got '%s'\n", optarg);
                return 2;
            }
            break;
        case 'a': {
            size_t len = strlen(vars);
            snprintf(vars + len, sizeof(vars) - len, "%s%s", len ? "," : "", optarg);
            break;
        }
        case 'h':
            fputs(usage, stdout);
            return 0;
        default:
            fputs(usage, stderr);
            return 2;
        }
    }
    if (optind < argc || !model || !config || !out) {
        fprintf(stderr, "wb-ckpt-write: %s\n%s",
                optind < argc ? "unexpected argument" : "--model, --config and --out are needed",
                usage);
        return 2;
    }
    struct wb_errlist el;
    struct wb_model md;
    struct wb_inventory inv;
    wb_errlist_init(&el);
    wb_inv_init(&inv);
    struct wb_model_src src = {.rules = model, .config = config, .vars = vars};
    int err = wb_model_load(&src, &md, &el);
    if (!err) {
        err = wb_ckpt_expected(&md, form, &inv, &el);
        err = err ? err : wb_ckpt_write(out, &inv, &wo, &el);
        err = err ? err : copy_file(config, out);
        wb_model_free(&md);
    }
    if (err) {
        wb_errlist_print(&el, "wb-ckpt-write: ", stderr);
        if (!el.n)
            fprintf(stderr, "wb-ckpt-write: %s\n", wb_strerror(err));
    } else {
        uint64_t bytes = 0;
        for (size_t i = 0; i < inv.n; i++)
            bytes += wb_shape_numel(&inv.p[i].shape) * wb_dtype_size(inv.p[i].dtype);
        printf("wrote %s: %zu tensors, %llu bytes in %u file%s (form %s, seed %llu, version "
               "%llu)\n",
               out, inv.n, (unsigned long long)bytes, wo.files ? wo.files : 1,
               wo.files > 1 ? "s" : "", wb_ckpt_form_name(form), (unsigned long long)wo.seed,
               (unsigned long long)wo.version);
    }
    wb_inv_free(&inv);
    wb_errlist_free(&el);
    return err ? 1 : 0;
}
