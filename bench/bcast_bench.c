/* bcast_bench.c — a checkpoint broadcast against the storage floor measured in the same run.
 *
 * The floor: read(2) of each file of the checkpoint from start to end, one after the other, in
 * 8 MiB calls (what cat or dd would do): no checkpoint can reach its rollouts faster than its
 * bytes come off the storage. The broadcast: wb-broadcast with --readers reader processes
 * into --rollouts rollout agents (one replica each, TP 1: every rollout receives the whole
 * checkpoint), real processes over the libfabric provider of --provider, timed by the
 * coordinator from its transfer request to "every rollout holds it" (process start and
 * registration left out; every write's checksum checked at its rollout unless --no-verify). The
 * ratio is checkpoint bytes per second of the broadcast over those of the floor.
 *
 * Every repetition runs the floor and each broadcast case once, in turn, so drift in the
 * machine's load spreads over all; medians are printed. "cold" drops the files' clean pages
 * first (fsync + posix_fadvise DONTNEED, residency measured with mincore), "warm" reads right
 * after a full read. On a VM a cold read may still come from the host's cache.
 *
 * The checkpoint (default: qwen3 with tests/fixtures/ckpt/qwen3-1g.json, 1.28 GB in 4 files)
 * is written once into --dir and reused while it matches. The programs come from $WB_BIN
 * (default build/bin). */
#include "bench/ckpt_common.h"
#include "ckpt/ckpt.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

struct opts {
    const char *dir, *rules, *config, *provider, *io, *device, *rdevice;
    uint32_t files, readers, rollouts, reps;
    bool cold, warm, verify, noverify;
};

static void usage(FILE *f)
{
    fprintf(
        f, "usage: bcast_bench [--dir DIR] [--model FAMILY.yaml --config config.json] [--files N]\n"
           "                   [--readers N] [--rollouts N] [--provider tcp|shm] [--io MODE]\n"
           "                   [--device D] [--rollout-device D] [--reps N] [--cold|--warm]\n"
           "                   [--verify|--no-verify]\n"
           "  Broadcasts a safetensors checkpoint with wb-broadcast (real processes) and reads\n"
           "  it with a plain sequential read(2) in the same run; prints GB/s of checkpoint and\n"
           "  the broadcast's ratio to the plain read, cold and warm.\n"
           "  --dir DIR        where the checkpoint is written once and reused\n"
           "                   (default build/bcast_bench)\n"
           "  --model/--config the model (default configs/models/qwen3.yaml with\n"
           "                   tests/fixtures/ckpt/qwen3-1g.json, 1.28 GB)\n"
           "  --files N        data files when writing (default 4)\n"
           "  --readers N      reader processes (default 1)\n"
           "  --rollouts N     rollout agents, each a whole copy (default 1)\n"
           "  --provider P     libfabric provider (default tcp; shm on one host)\n"
           "  --io MODE        the readers' reads: pread (default) or direct\n"
           "  --device D       readers copy to GPU D (default: host memory)\n"
           "  --rollout-device D  rollouts hold GPU D's memory (default: --device's)\n"
           "  --reps N         repetitions, the median is printed (default 3)\n"
           "  --cold|--warm    only one of the two (default both)\n"
           "  --verify|--no-verify  only with or without the rollouts' checksums (default\n"
           "                   both)\n");
}

static int parse(int argc, char **argv, struct opts *o)
{
    *o = (struct opts){.dir = "build/bcast_bench",
                       .rules = "configs/models/qwen3.yaml",
                       .config = "tests/fixtures/ckpt/qwen3-1g.json",
                       .provider = "tcp",
                       .io = "pread",
                       .files = 4,
                       .readers = 1,
                       .rollouts = 1,
                       .reps = 3,
                       .cold = true,
                       .warm = true,
                       .verify = true,
                       .noverify = true};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        uint64_t x;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            exit(0);
        } else if (strcmp(a, "--cold") == 0) {
            o->warm = false;
        } else if (strcmp(a, "--warm") == 0) {
            o->cold = false;
        } else if (strcmp(a, "--verify") == 0) {
            o->noverify = false;
        } else if (strcmp(a, "--no-verify") == 0) {
            o->verify = false;
        } else if (!v) {
            fprintf(stderr, "bcast_bench: %s needs a value\n", a);
            return 2;
        } else if (strcmp(a, "--dir") == 0) {
            o->dir = argv[++i];
        } else if (strcmp(a, "--model") == 0) {
            o->rules = argv[++i];
        } else if (strcmp(a, "--config") == 0) {
            o->config = argv[++i];
        } else if (strcmp(a, "--provider") == 0) {
            o->provider = argv[++i];
        } else if (strcmp(a, "--io") == 0) {
            o->io = argv[++i];
        } else if (strcmp(a, "--device") == 0) {
            o->device = argv[++i];
        } else if (strcmp(a, "--rollout-device") == 0) {
            o->rdevice = argv[++i];
        } else if (strcmp(a, "--files") == 0 || strcmp(a, "--readers") == 0 ||
                   strcmp(a, "--rollouts") == 0 || strcmp(a, "--reps") == 0) {
            if (wb_parse_u64(v, &x) || x < 1 || x > 64) {
                fprintf(stderr, "bcast_bench: %s: expected 1 to 64, got '%s'\n", a, v);
                return 2;
            }
            *(a[2] == 'f'   ? &o->files
              : a[3] == 'e' ? (a[4] == 'a' ? &o->readers : &o->reps)
                            : &o->rollouts) = (uint32_t)x;
            i++;
        } else {
            fprintf(stderr, "bcast_bench: unknown option %s\n", a);
            usage(stderr);
            return 2;
        }
    }
    return 0;
}

/* ---------------------------------------------------------------- the floor */

/* The floor: a plain sequential read(2) of every file into buf; seconds, or < 0. */
static double plain_read(const struct wb_ckpt *ck, char *buf)
{
    uint64_t t0 = wb_now_ns();
    if (bench_plain_read(ck, buf, 0))
        return -1;
    return (double)(wb_now_ns() - t0) / 1e9;
}

/* ---------------------------------------------------------------- the broadcast */

static pid_t spawn(const char *log, char *const argv[])
{
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        FILE *f = freopen(log, "w", stdout);
        if (!f || dup2(fileno(stdout), 2) < 0)
            _exit(126);
        setenv("WB_TOKEN", "bcast-bench", 1);
        execv(argv[0], argv);
        fprintf(stderr, "exec %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    return pid;
}

/* One broadcast; the coordinator's own time in seconds, or < 0 (its log says why). */
static double broadcast(const struct opts *o, const char *job, unsigned port, bool verify,
                        double *check_s)
{
    const char *bin = getenv("WB_BIN") && *getenv("WB_BIN") ? getenv("WB_BIN") : "build/bin";
    char prog[600], agent[600], url[64], clog[800], log[800], nr[16], rk[16];
    snprintf(prog, sizeof(prog), "%s/wb-broadcast", bin);
    snprintf(agent, sizeof(agent), "%s/wb-agent", bin);
    snprintf(url, sizeof(url), "tcp://127.0.0.1:%u", port);
    static unsigned run;
    run++;
    snprintf(clog, sizeof(clog), "%s.%u.coord.log", job, run);
    snprintf(nr, sizeof(nr), "%u", o->readers);
    char *cargv[] = {prog,
                     "--checkpoint",
                     (char *)o->dir,
                     "--job",
                     (char *)job,
                     "--listen",
                     url,
                     "--progress",
                     "off",
                     "--wait",
                     "60s",
                     "--readers",
                     nr,
                     verify ? NULL : "--no-verify",
                     NULL};
    pid_t coord = spawn(clog, cargv), pids[128];
    int n = 0;
    for (uint32_t r = 0; r < o->readers; r++) {
        snprintf(rk, sizeof(rk), "%u", r);
        snprintf(log, sizeof(log), "%s.%u.reader%u.log", job, run, r);
        char *argv[] = {prog,
                        "--reader",
                        "--checkpoint",
                        (char *)o->dir,
                        "--controller",
                        url,
                        "--rank",
                        rk,
                        "--readers",
                        nr,
                        "--io",
                        (char *)o->io,
                        o->device ? "--device" : NULL,
                        (char *)o->device,
                        NULL};
        pids[n++] = spawn(log, argv);
    }
    for (uint32_t r = 0; r < o->rollouts; r++) {
        snprintf(rk, sizeof(rk), "%u", r);
        snprintf(log, sizeof(log), "%s.%u.rollout%u.log", job, run, r);
        char *argv[] = {agent,
                        "--role",
                        "rollout",
                        "--rank",
                        rk,
                        "--controller",
                        url,
                        "--device",
                        o->rdevice ? (char *)o->rdevice : o->device ? (char *)o->device : "-1",
                        NULL};
        pids[n++] = spawn(log, argv);
    }
    int st;
    waitpid(coord, &st, 0);
    for (int i = 0; i < n; i++) {
        int s2;
        for (int t = 0; t < 1000 && waitpid(pids[i], &s2, WNOHANG) == 0; t++)
            usleep(10000);
        kill(pids[i], SIGKILL);
        waitpid(pids[i], &s2, 0);
    }
    double s = -1;
    FILE *f = fopen(clog, "r");
    char line[1024];
    while (f && fgets(line, sizeof(line), f)) {
        unsigned nro;
        double x;
        const char *p = strstr(line, "complete on ");
        if (p && sscanf(p, "complete on %u rollouts in %lf s", &nro, &x) == 2)
            s = x;
        const char *h = strstr(line, " hashed in ");
        if (h && sscanf(h, " hashed in %lf s", &x) == 1)
            *check_s = x;
    }
    if (f)
        fclose(f);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0 || s <= 0) {
        fprintf(stderr, "bcast_bench: the broadcast failed, see %s\n", clog);
        return -1;
    }
    return s;
}

/* ---------------------------------------------------------------- main */

static double median(double *v, unsigned n)
{
    qsort(v, n, sizeof(*v), bench_cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

int main(int argc, char **argv)
{
    struct opts o;
    int rc = parse(argc, argv, &o);
    if (rc)
        return rc;
    signal(SIGPIPE, SIG_IGN);
    struct wb_errlist el;
    struct wb_model md;
    wb_errlist_init(&el);
    struct wb_model_src src = {.rules = o.rules, .config = o.config};
    if (wb_model_load(&src, &md, &el)) {
        wb_errlist_print(&el, "bcast_bench: ", stderr);
        return 1;
    }
    struct wb_ckpt *ck = bench_checkpoint(o.dir, o.files, 42, &md.trainer, "bcast_bench: ");
    wb_model_free(&md);
    if (!ck)
        return 1;
    char job[700], rl[700], cwd[600];
    if (!getcwd(cwd, sizeof(cwd)))
        return 1;
    snprintf(rl, sizeof(rl), "bcast_bench.rollout.yaml"); /* beside the job file */
    snprintf(job, sizeof(job), "%s/bcast_bench.job.yaml", o.dir);
    char rlpath[800];
    snprintf(rlpath, sizeof(rlpath), "%s/%s", o.dir, rl);
    FILE *f = fopen(rlpath, "w");
    if (f) {
        fprintf(f, "replicas: %u\ngpus_per_replica: 1\ntp: 1\ngpus_per_node: 8\n", o.rollouts);
        fclose(f);
    }
    f = fopen(job, "w");
    if (!f)
        return 1;
    fprintf(f,
            "name: bcast-bench\nmodel:\n  rules: %s%s%s\n  hf_config: %s%s%s\ntrainers: %u\n"
            "rollout_layout: %s\nprovider: %s\n",
            o.rules[0] == '/' ? "" : cwd, o.rules[0] == '/' ? "" : "/", o.rules,
            o.config[0] == '/' ? "" : cwd, o.config[0] == '/' ? "" : "/", o.config, o.readers, rl,
            o.provider);
    fclose(f);
    char *buf = malloc(ck->bytes + (64 << 20));
    if (!buf)
        return 1;
    memset(buf, 0, ck->bytes + (64 << 20));
    printf("checkpoint %s: %.2f GB in %zu files; %u reader%s (%s%s) -> %u rollout%s (%s%s) over "
           "%s, reads by %s\n",
           o.dir, (double)ck->bytes / 1e9, ck->nfiles, o.readers, o.readers == 1 ? "" : "s",
           o.device ? "GPU " : "host memory", o.device ? o.device : "", o.rollouts,
           o.rollouts == 1 ? "" : "s", o.rdevice || o.device ? "GPU " : "host memory",
           o.rdevice  ? o.rdevice
           : o.device ? o.device
                      : "",
           o.provider, o.io);
    printf("%-22s %12s %14s %8s %10s %10s %10s\n", "case", "floor GB/s", "broadcast GB/s", "ratio",
           "resident", "check s", "check/fl");
    unsigned port = 20000 + (unsigned)getpid() % 12000; /* below the ephemeral ports */
    for (int cold = 0; cold < 2; cold++) {
        if ((cold && !o.cold) || (!cold && !o.warm))
            continue;
        double floor_s[64], b_s[2][64], c_s[2][64], resident = 0;
        unsigned nb[2] = {0, 0}, nf = 0;
        for (unsigned r = 0; r < o.reps; r++) {
            if (cold)
                resident += bench_drop_cache(ck);
            else
                plain_read(ck, buf);
            double s = plain_read(ck, buf);
            if (s > 0)
                floor_s[nf++] = s;
            for (int v = 0; v < 2; v++) {
                if ((v == 0 && !o.verify) || (v == 1 && !o.noverify))
                    continue;
                if (cold)
                    resident += bench_drop_cache(ck);
                double c = 0;
                double b = broadcast(&o, job, port++, v == 0, &c);
                if (b <= 0)
                    return 1;
                c_s[v][nb[v]] = c;
                b_s[v][nb[v]++] = b;
            }
        }
        double fl = (double)ck->bytes / median(floor_s, nf) / 1e9;
        for (int v = 0; v < 2; v++) {
            if (!nb[v])
                continue;
            double bc = (double)ck->bytes / median(b_s[v], nb[v]) / 1e9;
            char name[64];
            snprintf(name, sizeof(name), "%s, %s", cold ? "cold" : "warm",
                     v == 0 ? "verified" : "not verified");
            char res[32] = "-";
            if (cold)
                snprintf(res, sizeof(res), "%.0f%%",
                         100.0 * resident /
                             (double)(o.reps * (1 + (o.verify ? 1 : 0) + (o.noverify ? 1 : 0))));
            /* the content check (the coordinator hashing the checkpoint, before the transfer:
             * the readers hash their shares at the same time) in seconds, and over the floor's
             * read of the same bytes */
            double ck_s = median(c_s[v], nb[v]), fl_s = median(floor_s, nf);
            printf("%-22s %12.2f %14.2f %7.2fx %10s %10.3f %9.2fx\n", name, fl, bc, bc / fl, res,
                   ck_s, ck_s / fl_s);
        }
    }
    printf("(medians of %u; ratio = broadcast / floor, checkpoint bytes per second; cold: "
           "pages still resident after dropping; check s: the content hash before the transfer, "
           "not in the broadcast's time, and it leaves the pages it read in the cache; check/fl: "
           "its time over the floor's)\n",
           o.reps);
    free(buf);
    wb_ckpt_close(ck);
    return 0;
}
