/* trace.c — an agent's Chrome traces (JSON, open in Perfetto or chrome://tracing): one file per
 * version in the trace directory, <role><rank>.v<version>.json, the last `keep` versions of
 * the agent kept and the older ones removed; and what a trainer's executor spans become in
 * them (a rollout's events are made by rollout.c, which holds what they are made of).
 *
 * Nothing here runs while bytes move. The executor and the rollout record times as they go
 * (exec.c's spans, rollout.c's arrivals and checks); once a version ended here and its report
 * left, the agent hands them over as events (ag_trace_begin/add/end), and a thread of this
 * file's formats and writes the file and prunes the directory, so the loop is free for the
 * next version at once. Why not one file holding the last N versions: it would be rewritten
 * whole every version, and Perfetto shows one version per file more plainly anyway.
 *
 * What an event names: its label — a name shown on the slice and a JSON fragment of
 * arguments: the tensors it moves (at most AG_TRACE_NAMES names, and how many there are in
 * all) and whatever its maker adds. Labels of the setup (a trainer's tasks, a rollout's
 * tensors) are made once per setup; labels of a version (its outcome, a rollout's writers)
 * with the version. Names are escaped for JSON (quotes, backslashes, control characters; a
 * byte that is not UTF-8 becomes U+FFFD), so any tensor name gives a valid file.
 *
 * A directory that cannot be written is said once (a warning naming it) and traces are off
 * for that setup; a file that cannot be written is said and skipped. A trace never fails a
 * transfer. */
#include "agent/xfer.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *M = "agent";

enum {
    VLABEL = 1u << 31,     /* a label of the version's pool, not the setup's */
    MAX_EVENTS = 1u << 20, /* events of one version at most (the rest are counted, dropped) */
};

/* Labels: each a name and an arguments fragment, NUL-terminated in buf. */
struct pool {
    char *buf;
    size_t len, cap;
    uint32_t *off; /* [2 * n]: name, args */
    uint32_t n, capn;
    bool failed; /* out of memory once: labels made after it are missing */
};

struct track {
    uint32_t tid;
    char name[64], cat[32];
};

/* What the writer thread takes: one version's file, with everything it needs but the setup's
 * labels and tracks (read-only while a thread runs: settle() joins it before they change). */
struct job {
    struct ag_trace *t;
    uint64_t version, epoch;
    struct ag_tev *ev;
    uint32_t nev;
    uint64_t dropped;
    struct pool vl;
    bool ok;
    char why[512];
};

struct ag_trace {
    char dir[1024];
    char prefix[32]; /* "trainer3" */
    uint32_t keep;
    enum wb_role role;
    uint32_t rank;
    int64_t pid;
    char job_name[128];
    struct pool sl; /* the setup's labels */
    struct track *tracks;
    uint32_t ntracks;
    /* the version being handed over */
    struct job cur;
    uint32_t capev;
    bool open;
    /* the writer thread */
    pthread_t th;
    bool running;
};

/* ---------------------------------------------------------------- JSON text */

static bool reserve(struct pool *p, size_t more)
{
    if (p->len + more + 1 <= p->cap)
        return true;
    size_t cap = p->cap ? p->cap : 4096;
    while (cap < p->len + more + 1)
        cap *= 2;
    char *b = realloc(p->buf, cap);
    if (!b)
        return false;
    p->buf = b;
    p->cap = cap;
    return true;
}

static void put(struct pool *p, const char *s, size_t n)
{
    if (p->failed || !reserve(p, n)) {
        p->failed = true;
        return;
    }
    memcpy(p->buf + p->len, s, n);
    p->len += n;
    p->buf[p->len] = 0;
}

static void put_str(struct pool *p, const char *s)
{
    put(p, s, strlen(s));
}

/* The length of the valid UTF-8 sequence at s (1 to 4), or 0. */
static size_t utf8_len(const unsigned char *s)
{
    unsigned c = s[0];
    if (c >= 0xc2 && c <= 0xdf)
        return (s[1] & 0xc0) == 0x80 ? 2 : 0;
    if (c >= 0xe0 && c <= 0xef) {
        unsigned lo = c == 0xe0 ? 0xa0 : 0x80, hi = c == 0xed ? 0x9f : 0xbf;
        return s[1] >= lo && s[1] <= hi && (s[2] & 0xc0) == 0x80 ? 3 : 0;
    }
    if (c >= 0xf0 && c <= 0xf4) {
        unsigned lo = c == 0xf0 ? 0x90 : 0x80, hi = c == 0xf4 ? 0x8f : 0xbf;
        return s[1] >= lo && s[1] <= hi && (s[2] & 0xc0) == 0x80 && (s[3] & 0xc0) == 0x80 ? 4 : 0;
    }
    return 0;
}

/* s as the inside of a JSON string. */
static void put_esc(struct pool *p, const char *s)
{
    for (const unsigned char *u = (const unsigned char *)s; *u;) {
        char e[8];
        if (*u == '"' || *u == '\\') {
            e[0] = '\\';
            e[1] = (char)*u++;
            put(p, e, 2);
        } else if (*u < 0x20 || *u == 0x7f) {
            snprintf(e, sizeof(e), "\\u%04x", *u++);
            put(p, e, 6);
        } else if (*u < 0x80) {
            put(p, (const char *)u++, 1);
        } else {
            size_t n = utf8_len(u);
            if (n) {
                put(p, (const char *)u, n);
                u += n;
            } else {
                put(p, "\\ufffd", 6);
                u++;
            }
        }
    }
}

static void pool_free(struct pool *p)
{
    free(p->buf);
    free(p->off);
    memset(p, 0, sizeof(*p));
}

static uint32_t pool_add(struct pool *p, const struct ag_trace_label_in *in)
{
    if (p->failed)
        return AG_TRACE_NONE;
    if (p->n == p->capn) {
        uint32_t c = p->capn ? 2 * p->capn : 64;
        uint32_t *o = realloc(p->off, 2 * (size_t)c * sizeof(uint32_t));
        if (!o) {
            p->failed = true;
            return AG_TRACE_NONE;
        }
        p->off = o;
        p->capn = c;
    }
    uint32_t n = in->n < AG_TRACE_NAMES ? in->n : AG_TRACE_NAMES;
    uint32_t total = in->total > n ? in->total : n;
    size_t name_at = p->len;
    if (in->name) {
        put_esc(p, in->name);
    } else if (n) {
        put_esc(p, in->tensors[0]);
        if (total > 1) {
            char more[32];
            snprintf(more, sizeof(more), " +%u", total - 1);
            put_str(p, more);
        }
    }
    put(p, "", 1); /* the name's NUL, kept in the buffer */
    size_t args_at = p->len;
    if (n) {
        put_str(p, "\"tensors\":[");
        for (uint32_t i = 0; i < n; i++) {
            put_str(p, i ? ",\"" : "\"");
            put_esc(p, in->tensors[i]);
            put_str(p, "\"");
        }
        char tail[48];
        snprintf(tail, sizeof(tail), "],\"ntensors\":%u", total);
        put_str(p, tail);
    }
    if (in->args && *in->args) {
        if (n)
            put_str(p, ",");
        put_str(p, in->args);
    }
    put(p, "", 1);
    if (p->failed || args_at > UINT32_MAX)
        return AG_TRACE_NONE;
    p->off[2 * p->n] = (uint32_t)name_at;
    p->off[2 * p->n + 1] = (uint32_t)args_at;
    return p->n++;
}

/* ---------------------------------------------------------------- the file */

static const struct track *track_of(const struct ag_trace *t, uint32_t tid)
{
    for (uint32_t i = 0; i < t->ntracks; i++)
        if (t->tracks[i].tid == tid)
            return &t->tracks[i];
    return NULL;
}

static void label_of(const struct ag_trace *t, const struct job *j, uint32_t label,
                     const char **name, const char **args)
{
    const struct pool *p = label & VLABEL ? &j->vl : &t->sl;
    uint32_t i = label & ~VLABEL;
    *name = "?";
    *args = "";
    if (label == AG_TRACE_NONE || i >= p->n)
        return;
    *name = p->buf + p->off[2 * i];
    *args = p->buf + p->off[2 * i + 1];
}

/* Writes the version's file: events in the order given (Perfetto sorts them). */
static int write_file(const struct ag_trace *t, const struct job *j, FILE *f)
{
    fprintf(f, "{\"traceEvents\":[\n");
    fprintf(f,
            "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%" PRId64
            ",\"args\":{\"name\":\"%s %u\"}}",
            t->pid, wb_role_name(t->role), t->rank);
    fprintf(f,
            ",\n{\"name\":\"process_sort_index\",\"ph\":\"M\",\"pid\":%" PRId64
            ",\"args\":{\"sort_index\":%" PRId64 "}}",
            t->pid, t->pid);
    for (uint32_t i = 0; i < t->ntracks; i++)
        fprintf(f,
                ",\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%" PRId64
                ",\"tid\":%u,\"args\":{\"name\":\"%s\"}}",
                t->pid, t->tracks[i].tid, t->tracks[i].name);
    for (uint32_t i = 0; i < j->nev; i++) {
        const struct ag_tev *e = &j->ev[i];
        const struct track *tr = track_of(t, e->tid);
        const char *name, *args;
        label_of(t, j, e->label, &name, &args);
        fprintf(f, ",\n{\"name\":\"%s\",\"cat\":\"%s\",", name, tr ? tr->cat : "weightbridge");
        if (e->instant)
            fprintf(f, "\"ph\":\"i\",\"s\":\"t\",\"ts\":%.3f,", (double)e->t0 / 1e3);
        else
            fprintf(f, "\"ph\":\"X\",\"ts\":%.3f,\"dur\":%.3f,", (double)e->t0 / 1e3,
                    (double)(e->t1 > e->t0 ? e->t1 - e->t0 : 0) / 1e3);
        fprintf(f, "\"pid\":%" PRId64 ",\"tid\":%u,\"args\":{\"version\":%" PRIu64, t->pid, e->tid,
                j->version);
        if (e->task >= 0)
            fprintf(f, ",\"task\":%d", e->task);
        fprintf(f, "%s%s}}", *args ? "," : "", args);
    }
    struct pool why = {0};
    put_esc(&why, j->why);
    struct pool job = {0};
    put_esc(&job, t->job_name);
    fprintf(f,
            "\n],\"displayTimeUnit\":\"ms\",\"otherData\":{\"job\":\"%s\",\"role\":\"%s\","
            "\"rank\":%u,\"version\":%" PRIu64 ",\"epoch\":\"%016" PRIx64
            "\",\"outcome\":\"%s\",\"error\":\"%s\",\"events\":%u,\"events_dropped\":%" PRIu64
            "}}\n",
            job.buf ? job.buf : "", wb_role_name(t->role), t->rank, j->version, j->epoch,
            j->ok ? "complete" : "failed", why.buf ? why.buf : "", j->nev, j->dropped);
    pool_free(&why);
    pool_free(&job);
    return ferror(f) ? -EIO : 0;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* The version of a file name "<prefix>.v<digits>.json", or false. */
static bool version_of(const char *name, const char *prefix, uint64_t *v)
{
    size_t n = strlen(prefix);
    if (strncmp(name, prefix, n) || name[n] != '.' || name[n + 1] != 'v')
        return false;
    const char *s = name + n + 2;
    uint64_t x = 0;
    const char *d = s;
    while (*d >= '0' && *d <= '9') {
        if (x > (UINT64_MAX - 9) / 10)
            return false;
        x = x * 10 + (uint64_t)(*d++ - '0');
    }
    if (d == s || strcmp(d, ".json"))
        return false;
    *v = x;
    return true;
}

/* Removes this agent's files of all but the newest `keep` versions (by version number: a
 * version written again replaces its file, and versions only grow). */
static void prune(const struct ag_trace *t)
{
    DIR *dir = opendir(t->dir);
    if (!dir)
        return;
    uint64_t *v = NULL;
    size_t n = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(dir)) != NULL) {
        uint64_t x;
        if (!version_of(e->d_name, t->prefix, &x))
            continue;
        if (n == cap) {
            size_t c = cap ? 2 * cap : 32;
            uint64_t *nv = realloc(v, c * sizeof(*v));
            if (!nv)
                break;
            v = nv;
            cap = c;
        }
        v[n++] = x;
    }
    closedir(dir);
    if (n > t->keep) {
        qsort(v, n, sizeof(*v), cmp_u64);
        for (size_t i = 0; i < n - t->keep; i++) {
            char path[1200];
            snprintf(path, sizeof(path), "%s/%s.v%" PRIu64 ".json", t->dir, t->prefix, v[i]);
            if (unlink(path) && errno != ENOENT)
                wb_log(WB_LOG_WARN, M, "%s rank %u: trace %s: cannot remove it: %s",
                       wb_role_name(t->role), t->rank, path, strerror(errno));
        }
    }
    free(v);
}

/* Writes the job's file under a temporary name and renames it into place, so a reader never
 * sees half a file; then prunes. */
static void write_job(struct job *j)
{
    const struct ag_trace *t = j->t;
    char path[1200], tmp[1300];
    uint64_t t0 = wb_now_ns();
    snprintf(path, sizeof(path), "%s/%s.v%" PRIu64 ".json", t->dir, t->prefix, j->version);
    snprintf(tmp, sizeof(tmp), "%s/.%s.v%" PRIu64 ".json.%d.tmp", t->dir, t->prefix, j->version,
             (int)getpid());
    /* the directory comes from the job: the file is not opened through a link planted there */
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0644);
    FILE *f = fd < 0 ? NULL : fdopen(fd, "w");
    int rc = f ? write_file(t, j, f) : -errno;
    if (!f && fd >= 0)
        close(fd);
    if (f && fclose(f) && !rc)
        rc = -errno;
    if (!rc && rename(tmp, path))
        rc = -errno;
    if (rc) {
        if (fd >= 0)
            unlink(tmp);
        wb_log(WB_LOG_WARN, M, "%s rank %u: trace %s: cannot write it: %s", wb_role_name(t->role),
               t->rank, path, wb_strerror(rc));
        return;
    }
    prune(t);
    wb_log(WB_LOG_DEBUG, M, "%s rank %u: trace %s written (%u events) in %.2f ms",
           wb_role_name(t->role), t->rank, path, j->nev, (double)(wb_now_ns() - t0) / 1e6);
}

static void job_free(struct job *j)
{
    free(j->ev);
    pool_free(&j->vl);
    memset(j, 0, sizeof(*j));
}

static void *writer_main(void *arg)
{
    struct job *j = arg;
    write_job(j);
    job_free(j);
    free(j);
    return NULL;
}

/* The writer thread is done: the setup's labels and tracks may change. */
static void settle(struct ag_trace *t)
{
    if (t->running)
        pthread_join(t->th, NULL);
    t->running = false;
}

/* ---------------------------------------------------------------- calls */

int wb_endpoint_trace_check(const char *dir)
{
    struct stat st;
    if (!dir || !*dir)
        return -ENOENT;
    if (stat(dir, &st))
        return -errno;
    if (!S_ISDIR(st.st_mode))
        return -ENOTDIR;
    if (strlen(dir) >= sizeof(((struct ag_trace *)0)->dir))
        return -ENAMETOOLONG;
    return access(dir, W_OK | X_OK) ? -errno : 0;
}

int ag_trace_new(const char *dir, uint32_t keep, const char *job, enum wb_role role, uint32_t rank,
                 struct ag_trace **out)
{
    *out = NULL;
    if (!dir || !*dir)
        return 0;
    int e = wb_endpoint_trace_check(dir);
    if (e) {
        wb_log(WB_LOG_WARN, M, "%s rank %u: trace directory %s: %s; no traces are written",
               wb_role_name(role), rank, dir, strerror(-e));
        return 0;
    }
    struct ag_trace *t = calloc(1, sizeof(*t));
    if (!t)
        return -ENOMEM;
    snprintf(t->dir, sizeof(t->dir), "%s", dir);
    snprintf(t->prefix, sizeof(t->prefix), "%s%u", wb_role_name(role), rank);
    snprintf(t->job_name, sizeof(t->job_name), "%s", job ? job : "");
    t->keep = keep ? keep : AG_TRACE_KEEP_DEFAULT;
    t->role = role;
    t->rank = rank;
    t->pid = role == WB_ROLE_ROLLOUT ? AG_TRACE_ROLLOUT_PID + (int64_t)rank : (int64_t)rank;
    *out = t;
    return 0;
}

void ag_trace_free(struct ag_trace *t)
{
    if (!t)
        return;
    settle(t);
    job_free(&t->cur);
    pool_free(&t->sl);
    free(t->tracks);
    free(t);
}

void ag_trace_track(struct ag_trace *t, uint32_t tid, const char *name, const char *cat)
{
    if (!t)
        return;
    settle(t);
    for (uint32_t i = 0; i < t->ntracks; i++)
        if (t->tracks[i].tid == tid)
            return;
    struct track *n = realloc(t->tracks, (t->ntracks + 1) * sizeof(*n));
    if (!n)
        return;
    t->tracks = n;
    struct track *k = &n[t->ntracks++];
    k->tid = tid;
    struct pool p = {0};
    put_esc(&p, name);
    snprintf(k->name, sizeof(k->name), "%s", p.buf ? p.buf : "");
    pool_free(&p);
    snprintf(k->cat, sizeof(k->cat), "%s", cat);
}

uint32_t ag_trace_label(struct ag_trace *t, bool per_version, const struct ag_trace_label_in *in)
{
    if (!t)
        return AG_TRACE_NONE;
    if (per_version) {
        uint32_t l = pool_add(&t->cur.vl, in);
        return l == AG_TRACE_NONE ? l : l | VLABEL;
    }
    settle(t);
    return pool_add(&t->sl, in);
}

void ag_trace_begin(struct ag_trace *t, uint64_t version, uint64_t epoch)
{
    if (!t)
        return;
    job_free(&t->cur);
    t->capev = 0;
    t->cur.t = t;
    t->cur.version = version;
    t->cur.epoch = epoch;
    t->open = true;
}

void ag_trace_add(struct ag_trace *t, const struct ag_tev *e)
{
    if (!t || !t->open)
        return;
    struct job *j = &t->cur;
    if (j->nev == t->capev) {
        uint32_t c = t->capev ? 2 * t->capev : 1024;
        struct ag_tev *n = c <= MAX_EVENTS ? realloc(j->ev, c * sizeof(*n)) : NULL;
        if (!n) {
            j->dropped++;
            return;
        }
        j->ev = n;
        t->capev = c;
    }
    j->ev[j->nev++] = *e;
}

void ag_trace_end(struct ag_trace *t, bool ok, const char *why)
{
    if (!t || !t->open)
        return;
    t->open = false;
    settle(t); /* one file at a time: the last version's, if it is still being written */
    struct job *j = malloc(sizeof(*j));
    if (!j) {
        job_free(&t->cur);
        return;
    }
    *j = t->cur;
    memset(&t->cur, 0, sizeof(t->cur));
    t->capev = 0;
    j->ok = ok;
    snprintf(j->why, sizeof(j->why), "%s", why ? why : "");
    if (pthread_create(&t->th, NULL, writer_main, j) == 0) {
        t->running = true;
        return;
    }
    writer_main(j); /* no thread: written here, still after the version's report */
}

/* ---------------------------------------------------------------- a trainer's events */

enum { TRACK_VERSION = WB_STAGE_COUNT }; /* the stages' tracks are their numbers */

/* Trainer tensor k's name (a shard's), or "trainer tensor k" in buf. */
static const char *tensor_name(const struct data *d, uint32_t k, char *buf, size_t cap)
{
    if (k < d->ntensors && d->shard_of[k])
        return d->shards[d->shard_of[k] - 1].meta.name;
    snprintf(buf, cap, "trainer tensor %u", k);
    return buf;
}

/* One label per task: the trainer tensors its ops and writes read (in order of first use), the
 * bytes it writes and its mode; and the barriers' and the direct batch's. Once per setup. */
void ag_trace_trainer_setup(struct data *d)
{
    const struct wb_route_table *t = &d->table;
    if (!d->trace)
        return;
    for (int s = 0; s < WB_STAGE_COUNT; s++)
        ag_trace_track(d->trace, (uint32_t)s, wb_stage_name((enum wb_stage)s),
                       wb_stage_name((enum wb_stage)s));
    ag_trace_track(d->trace, TRACK_VERSION, "version", "version");
    uint32_t maxt = d->ntensors;
    for (uint32_t i = 0; i < t->nops; i++)
        maxt = t->ops[i].tensor >= maxt ? t->ops[i].tensor + 1 : maxt;
    for (uint32_t i = 0; i < t->nwrites; i++)
        if (t->writes[i].src_tensor != (uint32_t)WB_RT_TMP_SRC && t->writes[i].src_tensor >= maxt)
            maxt = t->writes[i].src_tensor + 1;
    uint32_t *seen = calloc(maxt ? maxt : 1, sizeof(uint32_t)); /* task + 1 that named it */
    d->task_label = malloc((t->ntasks ? t->ntasks : 1) * sizeof(uint32_t));
    if (!seen || !d->task_label) {
        free(seen);
        free(d->task_label);
        d->task_label = NULL;
        return; /* spans of tasks go unnamed ("?"); the transfer is unaffected */
    }
    for (uint32_t ti = 0; ti < t->ntasks; ti++) {
        const struct wb_rt_task *k = &t->tasks[ti];
        char buf[AG_TRACE_NAMES][32], args[96];
        const char *names[AG_TRACE_NAMES];
        uint32_t n = 0, total = 0;
        for (uint32_t j = 0; j < k->nops + k->nwrites; j++) {
            uint32_t tn = j < k->nops ? t->ops[k->op0 + j].tensor
                                      : t->writes[k->write0 + j - k->nops].src_tensor;
            if (tn == (uint32_t)WB_RT_TMP_SRC || seen[tn] == ti + 1)
                continue;
            seen[tn] = ti + 1;
            if (n < AG_TRACE_NAMES) {
                names[n] = tensor_name(d, tn, buf[n], sizeof(buf[n]));
                n++;
            }
            total++;
        }
        snprintf(args, sizeof(args), "\"mode\":\"%s\",\"phase\":%u,\"bytes\":%" PRIu64,
                 wb_plan_mode_name(k->mode), k->phase, k->write_bytes);
        struct ag_trace_label_in in = {
            .name = n ? NULL : "task", .tensors = names, .n = n, .total = total, .args = args};
        d->task_label[ti] = ag_trace_label(d->trace, false, &in);
    }
    free(seen);
    d->label_direct =
        ag_trace_label(d->trace, false, &(struct ag_trace_label_in){.name = "direct batch"});
    d->label_barrier = AG_TRACE_NONE;
    for (uint32_t p = 0; p < t->nphases; p++) { /* phase p's is label_barrier + p */
        char name[48], args[32];
        snprintf(name, sizeof(name), "barrier after phase %u", p);
        snprintf(args, sizeof(args), "\"phase\":%u", p);
        uint32_t l = ag_trace_label(d->trace, false,
                                    &(struct ag_trace_label_in){.name = name, .args = args});
        if (p == 0)
            d->label_barrier = l;
    }
}

/* The attempt that ended: its version on a track of its own, and each recorded span on its
 * stage's track, named by its task's label. */
void ag_trace_trainer(struct data *d)
{
    if (!d->trace)
        return;
    char args[256];
    ag_trace_begin(d->trace, d->version, d->epoch);
    snprintf(args, sizeof(args),
             "\"bytes\":%" PRIu64 ",\"writes\":%" PRIu64 ",\"tasks\":%u,\"peak_tmp\":%" PRIu64
             ",\"mem_cap\":%" PRIu64 ",\"mem_waits\":%" PRIu64 ",\"outcome\":\"%s\"",
             d->stats.bytes, d->stats.writes, d->table.ntasks, d->peak_tmp, d->cap,
             d->stats.mem_waits, d->last_ok ? "complete" : "failed");
    char name[48];
    snprintf(name, sizeof(name), "version %" PRIu64, d->version);
    uint32_t lv =
        ag_trace_label(d->trace, true, &(struct ag_trace_label_in){.name = name, .args = args});
    ag_trace_add(
        d->trace,
        &(struct ag_tev){
            .t0 = d->start_ns, .t1 = d->end_ns, .tid = TRACK_VERSION, .label = lv, .task = -1});
    for (uint32_t i = 0; i < d->nspans; i++) {
        const struct span *sp = &d->spans[i];
        struct ag_tev e = {.t0 = sp->t0, .t1 = sp->t1, .tid = sp->stage, .task = -1};
        if (sp->stage == WB_STAGE_BARRIER) /* its task field holds the phase */
            e.label =
                d->label_barrier == AG_TRACE_NONE ? AG_TRACE_NONE : d->label_barrier + sp->task;
        else if (sp->task == UINT32_MAX)
            e.label = d->label_direct;
        else {
            e.label = d->task_label ? d->task_label[sp->task] : AG_TRACE_NONE;
            e.task = (int32_t)sp->task;
        }
        ag_trace_add(d->trace, &e);
    }
    ag_trace_end(d->trace, d->last_ok, d->fail);
}
