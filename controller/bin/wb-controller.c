/* wb-controller — the job's controller: loads the job file, matches and plans once, listens for
 * agents, hands out the plan and runs transfers when wb-ctl asks. */
#include "controller/controller.h"

#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f)
{
    fprintf(f, "usage: wb-controller --config JOB.yaml [--listen URL] [--dump-config]\n"
               "\n"
               "Listens for wb-agent processes (default tcp://127.0.0.1:7420), matches the\n"
               "model and plans the transfer once all expected agents registered, then runs\n"
               "transfers requested with `wb-ctl transfer --version N`.\n"
               "\n"
               "  -c, --config FILE   job file (see --dump-config for its keys)\n"
               "  -l, --listen URL    override the job's listen URL\n"
               "      --dump-config   print the job file's keys, defaults and docs\n"
               "  -h, --help          this text\n"
               "\n"
               "Environment: WB_TOKEN (cluster token when the job file has none), WB_LOG\n"
               "(debug|info|warn|error).\n");
}

int main(int argc, char **argv)
{
    static const struct option lo[] = {{"config", required_argument, 0, 'c'},
                                       {"listen", required_argument, 0, 'l'},
                                       {"dump-config", no_argument, 0, 'D'},
                                       {"help", no_argument, 0, 'h'},
                                       {0}};
    const char *config = NULL, *listen = NULL;
    int ch;
    while ((ch = getopt_long(argc, argv, "c:l:h", lo, NULL)) != -1) {
        switch (ch) {
        case 'c':
            config = optarg;
            break;
        case 'l':
            listen = optarg;
            break;
        case 'D':
            printf("# wb-controller job file\n");
            wb_cfg_dump(wb_job_fields, stdout);
            return 0;
        case 'h':
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
    }
    if (!config || optind != argc) {
        usage(stderr);
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    struct wb_errlist el;
    struct wb_job job;
    struct wb_controller *c;
    wb_errlist_init(&el);
    const char *step = "reading the job";
    int err = wb_job_load(config, &job, &el);
    if (err)
        goto fail;
    if (!*job.token) {
        wb_errlist_add(&el, "%s: token: no cluster token (set token: in the file or $WB_TOKEN)",
                       config);
        err = -WB_E_CONFIG;
        goto fail_job;
    }
    step = "starting the controller";
    if (listen) {
        char *l = strdup(listen);
        if (!l) {
            err = -ENOMEM;
            goto fail_job;
        }
        free(job.listen);
        job.listen = l;
    }
    err = wb_controller_create(&job, &c, &el);
    if (err)
        goto fail_job;
    fprintf(stderr, "wb-controller: job %s listening on %s\n", job.name, job.listen);
    err = wb_controller_run(c);
    wb_controller_destroy(c);
    wb_job_free(&job);
    wb_errlist_free(&el);
    return err ? 1 : 0;

fail_job:
    wb_job_free(&job);
fail:
    wb_errlist_print(&el, "wb-controller: ", stderr);
    if (!el.n) /* the message could not be built: at least the step */
        fprintf(stderr, "wb-controller: %s: %s while %s\n", config, wb_strerror(err), step);
    wb_errlist_free(&el);
    return 1;
}
