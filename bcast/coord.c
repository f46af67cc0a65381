/* coord.c — the broadcast's coordinator: check the checkpoint against the job's model, lay the
 * readers out, run the job's controller on a thread of this process, wait for every reader
 * and rollout, run the transfer with progress, resume an attempt an agent's death broke, and
 * summarize.
 *
 * The coordinator talks to its own controller as any client does (wb-ctl's messages over nng),
 * not through its memory: the controller's loop stays the only owner of its state, and what a
 * person sees is exactly what `wb-ctl status` would show.
 *
 * Nothing listens before every check passed: a bad checkpoint (each file, each tensor against
 * the model) or a plan the planner refuses ends the run with every problem listed, and no
 * reader or rollout can have been sent anything. */
#include "bcast/bpriv.h"

#include "planner/planner.h"

#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { AGENTS_MAX = 2 * WB_RANKS_MAX };

struct agent_view {
    bool trainer;
    uint32_t rank;
    char state[WB_ROLE_STR];
    uint64_t done, total;
    char err[WB_ERRMSG_MAX];
};

struct coord {
    const struct wb_bcast_opts *o;
    FILE *out;
    enum wb_bcast_progress mode;
    struct wb_controller *ctl;
    pthread_t th;
    bool running;
    int run_rc;
    struct wb_chan st, xf; /* status requests; the transfer request (held until it ends) */
    const char *token;
    uint32_t nt, nr;
    bool line_open; /* a live line is on screen */
    char state[WB_ROLE_STR];
    struct agent_view *av;
    uint32_t nav;
};

static void *ctl_main(void *arg)
{
    struct coord *c = arg;
    c->run_rc = wb_controller_run(c->ctl);
    return NULL;
}

/* A plain line (closing a live line first). */
static void say(struct coord *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void say(struct coord *c, const char *fmt, ...)
{
    if (c->line_open) {
        fputs("\n", c->out);
        c->line_open = false;
    }
    va_list ap;
    va_start(ap, fmt);
    fputs("wb-broadcast: ", c->out);
    vfprintf(c->out, fmt, ap);
    va_end(ap);
    fputc('\n', c->out);
    fflush(c->out);
}

/* ---------------------------------------------------------------- talking to the controller */

/* One request on the status channel; the reply (malloc'd, wb_chan_free) opened in *m. */
static int call(struct coord *c, uint32_t type, void **buf, struct wb_msg *m, char *why, size_t cap)
{
    struct wb_mpw w;
    size_t len = 0;
    const char *refused = "";
    wb_mpw_init(&w);
    wb_msg_encode(&w, type, c->token, NULL);
    int rc = wb_mpw_finish(&w);
    rc = rc ? rc : wb_chan_call(&c->st, &w, 10ull * 1000000000, buf, &len);
    wb_mpw_free(&w);
    if (rc) {
        snprintf(why, cap, "the controller did not answer: %s", wb_strerror(rc));
        return rc;
    }
    if ((rc = wb_msg_open(*buf, len, c->token, m, &refused)) != 0) {
        snprintf(why, cap, "%s", refused);
        wb_chan_free(*buf);
        *buf = NULL;
    }
    return rc;
}

/* The controller's state and every agent's (c->state, c->av). */
static int status(struct coord *c, char *why, size_t cap)
{
    void *buf = NULL;
    struct wb_msg m;
    struct wb_body_status st;
    int rc = call(c, WB_MSG_CTL_STATUS, &buf, &m, why, cap);
    if (rc)
        return rc;
    struct wb_mpr r;
    uint32_t n = 0;
    rc = m.type == WB_MSG_STATUS ? wb_msg_decode(&m, &st, why, cap) : -EBADMSG;
    if (!rc) {
        snprintf(c->state, sizeof(c->state), "%s", st.state);
        wb_mpr_init(&r, st.agents.p, st.agents.n);
        rc = wb_mpr_array(&r, AGENTS_MAX, &n);
    }
    for (uint32_t i = 0; !rc && i < n && i < c->nav; i++) {
        struct wb_body_agent_status a;
        if ((rc = wb_body_get(&r, WB_BODY_AGENT_STATUS, &a, why, cap)) != 0)
            break;
        struct agent_view *v = &c->av[i];
        v->trainer = strcmp(a.role, "trainer") == 0;
        v->rank = (uint32_t)a.rank;
        snprintf(v->state, sizeof(v->state), "%s", a.state);
        v->done = a.done;
        v->total = a.total;
        snprintf(v->err, sizeof(v->err), "%s", a.err);
    }
    if (rc && !*why)
        snprintf(why, cap, "the controller's status is malformed");
    wb_chan_free(buf);
    return rc;
}

/* "reader 1 (dead), rollout 3 (absent)": the agents not alive; "" when all are. */
static void missing(struct coord *c, char *buf, size_t cap)
{
    size_t pos = 0;
    buf[0] = 0;
    for (uint32_t i = 0; i < c->nav && pos + 48 < cap; i++) {
        const struct agent_view *v = &c->av[i];
        if (strcmp(v->state, "alive") == 0)
            continue;
        pos += (size_t)snprintf(buf + pos, cap - pos, "%s%s %u (%s)", pos ? ", " : "",
                                v->trainer ? "reader" : "rollout", v->rank,
                                strcmp(v->state, "absent") == 0 ? "not started" : v->state);
    }
}

/* Waits until the job is ready (every agent registered and set up). */
static int wait_ready(struct coord *c, uint64_t wait_ns, struct wb_errlist *el)
{
    uint64_t t0 = wb_now_ns();
    char why[WB_ERRMSG_MAX] = "", who[1024] = "", said[1024] = "";
    for (;;) {
        int rc = status(c, why, sizeof(why));
        if (rc) {
            wb_errlist_add(el, "%s", why);
            return rc;
        }
        if (strcmp(c->state, "ready") == 0)
            return 0;
        for (uint32_t i = 0; i < c->nav; i++)
            if (strcmp(c->av[i].state, "failed") == 0 ||  /* its setup will not mend itself */
                strcmp(c->av[i].state, "refused") == 0) { /* nor will its files */
                wb_errlist_add(el, "%s %u: %s", c->av[i].trainer ? "reader" : "rollout",
                               c->av[i].rank, c->av[i].err);
                return -WB_E_PEER;
            }
        missing(c, who, sizeof(who));
        if (*who && strcmp(who, said) != 0) {
            say(c, "waiting for %s", who);
            snprintf(said, sizeof(said), "%s", who);
        }
        if (wb_now_ns() - t0 > wait_ns) {
            char d[32];
            wb_errlist_add(el, "the job was not ready within %s: %s",
                           bc_fmt_secs((double)wait_ns / 1e9, d, sizeof(d)), *who ? who : c->state);
            return -ETIMEDOUT;
        }
        struct timespec ts = {0, 200 * 1000000};
        nanosleep(&ts, NULL);
    }
}

/* ---------------------------------------------------------------- progress */

static void show_progress(struct coord *c, uint64_t t0, uint64_t *next_plain, bool final)
{
    if (c->mode == WB_BCAST_PROGRESS_OFF)
        return;
    struct wb_bcast_progress_state s = {.elapsed_s = (double)(wb_now_ns() - t0) / 1e9};
    for (uint32_t i = 0; i < c->nav; i++) {
        const struct agent_view *v = &c->av[i];
        if (!v->trainer || !v->total)
            continue;
        s.done += v->done;
        s.total += v->total;
        double f = (double)v->done / (double)v->total;
        if (!s.have_slowest || f < s.slowest_frac) {
            s.have_slowest = true;
            s.slowest = v->rank;
            s.slowest_frac = f;
        }
    }
    if (!s.total)
        return; /* no heartbeat with figures yet */
    char line[256];
    wb_bcast_progress_line(&s, line, sizeof(line));
    if (c->mode == WB_BCAST_PROGRESS_LIVE) {
        fprintf(c->out, "\r%s\033[K", line);
        c->line_open = true;
        fflush(c->out);
    } else if (final || wb_now_ns() >= *next_plain) {
        fprintf(c->out, "wb-broadcast: [%6.1f s] %s\n", s.elapsed_s, line);
        fflush(c->out);
        *next_plain = wb_now_ns() + (c->o->period_ns ? c->o->period_ns : 2000000000ull);
    }
}

/* ---------------------------------------------------------------- one attempt */

/* The RESULT of an attempt into the result's per-reader figures. */
static int take_result(struct coord *c, const struct wb_msg *m, struct wb_bcast_result *res,
                       uint64_t *sent, char *why, size_t cap)
{
    struct wb_body_result b;
    struct wb_mpr r;
    uint32_t n = 0;
    int rc = wb_msg_decode(m, &b, why, cap);
    if (!rc) {
        wb_mpr_init(&r, b.trainers.p, b.trainers.n);
        rc = wb_mpr_array(&r, WB_RANKS_MAX, &n);
    }
    *sent = 0;
    for (uint32_t i = 0; !rc && i < n; i++) {
        struct wb_xfer_stats s;
        if ((rc = wb_body_get(&r, WB_BODY_STATS, &s, why, cap)) != 0 || s.rank >= c->nt)
            break;
        struct wb_bcast_reader_stats *x = &res->reader[s.rank];
        x->write_bytes += s.bytes;
        x->peak_tmp = s.peak_tmp > x->peak_tmp ? s.peak_tmp : x->peak_tmp;
        x->cap = s.cap;
        x->total_ns = s.total_ns;
        *sent += s.bytes;
    }
    return rc ? -EBADMSG : 0;
}

/* Runs transfer `version` once. 0 on success; -WB_E_PEER with the controller's reason in why. */
static int attempt(struct coord *c, uint64_t version, struct wb_bcast_result *res, uint64_t *sent,
                   char *why, size_t cap)
{
    uint64_t timeout = c->o->transfer_ns ? c->o->transfer_ns : 24ull * 3600 * 1000000000;
    struct wb_body_ctl_transfer b = {version, timeout};
    struct wb_mpw w;
    wb_mpw_init(&w);
    wb_msg_encode(&w, WB_MSG_CTL_TRANSFER, c->token, &b);
    int rc = wb_mpw_finish(&w);
    rc = rc ? rc : wb_chan_send(&c->xf, &w);
    wb_mpw_free(&w);
    if (rc) {
        snprintf(why, cap, "cannot ask the controller for the transfer: %s", wb_strerror(rc));
        return rc;
    }
    uint64_t period = c->o->period_ns ? c->o->period_ns : 2000000000ull;
    uint64_t t0 = wb_now_ns(), next_poll = 0, next_plain = t0 + period;
    *sent = 0;
    for (;;) {
        void *buf;
        size_t len;
        int got = wb_chan_try_recv(&c->xf, &buf, &len);
        if (got < 0) {
            snprintf(why, cap, "the controller's answer was lost: %s", wb_strerror(got));
            return got;
        }
        if (got == 1) {
            struct wb_msg m;
            const char *refused = "";
            rc = wb_msg_open(buf, len, c->token, &m, &refused);
            if (rc) {
                snprintf(why, cap, "%s", refused);
            } else if (m.type == WB_MSG_RESULT) {
                rc = take_result(c, &m, res, sent, why, cap);
                if (!rc && status(c, why, cap) == 0) { /* the last figures, for the line */
                    for (uint32_t i = 0; i < c->nav; i++)
                        c->av[i].done = c->av[i].total;
                    show_progress(c, t0, &next_plain, true);
                }
            } else {
                struct wb_body_error e;
                rc = -WB_E_PEER;
                if (m.type != WB_MSG_ERROR || wb_msg_decode(&m, &e, why, cap) != 0)
                    snprintf(why, cap, "the controller's answer is malformed");
                else
                    snprintf(why, cap, "%s", e.msg);
            }
            wb_chan_free(buf);
            return rc;
        }
        uint64_t now = wb_now_ns();
        if (now >= next_poll) {
            char w2[WB_ERRMSG_MAX];
            if (status(c, w2, sizeof(w2)) == 0)
                show_progress(c, t0, &next_plain, false);
            next_poll = now + (period < 250000000ull ? period : 250000000ull);
        }
        if (now - t0 > timeout + 30ull * 1000000000) {
            snprintf(why, cap, "the controller gave no outcome within %.0f s",
                     (double)timeout / 1e9);
            return -ETIMEDOUT;
        }
        struct pollfd p = {.fd = c->xf.fd, .events = POLLIN};
        poll(&p, 1, 50);
    }
}

/* ---------------------------------------------------------------- the run */

static int check_inputs(const struct wb_bcast_opts *o, struct wb_ckpt **ckp, struct wb_model *md,
                        struct wb_errlist *el)
{
    const struct wb_job *j = o->job;
    if (*j->trainer_layout) {
        wb_errlist_add(el,
                       "job %s: names a trainer_layout; a broadcast's readers are laid out "
                       "from the checkpoint",
                       j->name);
        return -WB_E_CONFIG;
    }
    if (!*j->model.rules || !*j->rollout_layout) {
        wb_errlist_add(el, "job %s: a broadcast needs model.rules and rollout_layout", j->name);
        return -WB_E_CONFIG;
    }
    struct wb_model_src src;
    memset(&src, 0, sizeof(src));
    src.rules = j->model.rules;
    src.config = j->model.hf_config;
    src.vars = j->model.vars;
    src.naming = j->model.naming;
    src.rollout_inv = j->model.rollout_inventory;
    /* the checkpoint and the model both, so that one run lists every problem of either */
    int e1 = wb_ckpt_open(o->checkpoint, ckp, el);
    int e2 = wb_model_load(&src, md, el);
    if (e1 || e2) {
        if (!e2)
            wb_model_free(md);
        wb_ckpt_close(*ckp);
        *ckp = NULL;
        return e1 ? e1 : e2;
    }
    enum wb_ckpt_form used;
    int err = wb_ckpt_check_model(*ckp, md, o->form, &used, el);
    if (err) {
        wb_model_free(md);
        wb_ckpt_close(*ckp);
        *ckp = NULL;
    }
    return err;
}

void wb_bcast_result_free(struct wb_bcast_result *r)
{
    free(r->reader);
    r->reader = NULL;
}

static void summary(struct coord *c, const struct wb_bcast_result *res)
{
    char a[32], b[32], d[32], e[32];
    double s = (double)res->total_ns / 1e9;
    say(c, "version %" PRIu64 " complete on %u rollouts in %.3f s (%u attempt%s)", res->version,
        res->rollouts, s, res->attempts, res->attempts == 1 ? "" : "s");
    say(c, "checkpoint %s at %s/s; %s written at %s/s", bc_fmt_dec(res->ckpt_bytes, a, sizeof(a)),
        bc_fmt_dec(s > 0 ? (uint64_t)((double)res->ckpt_bytes / s) : 0, b, sizeof(b)),
        bc_fmt_dec(res->write_bytes, d, sizeof(d)),
        bc_fmt_dec(s > 0 ? (uint64_t)((double)res->write_bytes / s) : 0, e, sizeof(e)));
    if (res->attempts > 1)
        say(c,
            "resumed: the later attempts wrote %" PRIu64 " of the plan's %" PRIu64
            " bytes (the rest had landed)",
            res->resent_bytes, res->plan_bytes);
    for (uint32_t r = 0; r < res->readers; r++) {
        const struct wb_bcast_reader_stats *x = &res->reader[r];
        say(c, "reader %u: read %s, wrote %" PRIu64 " bytes, peak memory %s of a %s cap", r,
            bc_fmt_dec(x->read_bytes, a, sizeof(a)), x->write_bytes,
            bc_fmt_dec(x->peak_tmp, b, sizeof(b)), bc_fmt_dec(x->cap, d, sizeof(d)));
    }
    if (c->o->verify)
        /* content hashes (before the transfer): every reader's share == the checkpoint's;
         * checksums (at every write): every rollout's bytes == what its reader sent */
        say(c, "verified: every reader's share hashed equal to the checkpoint and every write's "
               "checksum matched at its rollout");
}

/* What each reader's share holds piece by piece, for the controller (wb_source_parts): the
 * pieces' digests (filled by the share's content hash) and how a refusal names each — the
 * tensor, and its rows when the piece holds part of it. */
struct share_parts {
    uint32_t n;
    struct wb_source_parts *parts; /* [n] */
    struct wb_hash128 **hash;      /* [n][pieces] */
    char ***what;                  /* [n][pieces] */
};

_Static_assert(sizeof(struct wb_hash128) == 16, "a digest is 16 bytes, packed");

static void parts_free(struct share_parts *sp)
{
    for (uint32_t k = 0; k < sp->n; k++) {
        for (uint32_t i = 0; sp->what[k] && i < sp->parts[k].n; i++)
            free(sp->what[k][i]);
        free(sp->what[k]);
        free(sp->hash[k]);
    }
    free(sp->parts);
    free(sp->hash);
    free(sp->what);
    memset(sp, 0, sizeof(*sp));
}

static int parts_new(const struct wb_ckpt *ck, const struct wb_ckpt_shares *sh,
                     struct share_parts *sp)
{
    sp->parts = calloc(sh->n ? sh->n : 1, sizeof(*sp->parts));
    sp->hash = calloc(sh->n ? sh->n : 1, sizeof(*sp->hash));
    sp->what = calloc(sh->n ? sh->n : 1, sizeof(*sp->what));
    if (!sp->parts || !sp->hash || !sp->what)
        return -ENOMEM;
    sp->n = sh->n;
    for (uint32_t k = 0; k < sh->n; k++) {
        const struct wb_ckpt_share *s = &sh->share[k];
        sp->hash[k] = calloc(s->n ? s->n : 1, sizeof(struct wb_hash128));
        sp->what[k] = calloc(s->n ? s->n : 1, sizeof(char *));
        if (!sp->hash[k] || !sp->what[k])
            return -ENOMEM;
        sp->parts[k] = (struct wb_source_parts){.n = (uint32_t)s->n,
                                                .digests = sp->hash[k]->b,
                                                .what = (const char *const *)sp->what[k]};
        for (size_t i = 0; i < s->n; i++) {
            const struct wb_ckpt_piece *p = &s->piece[i];
            const struct wb_param *t = &ck->inv.p[p->tensor];
            bool whole = t->shape.ndim == 0 || p->rows == t->shape.dim[0];
            char w[WB_ESC_MAX + 64];
            if (whole)
                snprintf(w, sizeof(w), "%s", wb_esc(t->name).s);
            else
                snprintf(w, sizeof(w), "%s (rows %" PRIu64 "-%" PRIu64 ")", wb_esc(t->name).s,
                         p->row0, p->row0 + p->rows - 1);
            if (!(sp->what[k][i] = strdup(w)))
                return -ENOMEM;
        }
    }
    return 0;
}

int wb_bcast_run(const struct wb_bcast_opts *o, struct wb_bcast_result *res, struct wb_errlist *el)
{
    struct coord c = {.o = o, .out = o->out ? o->out : stdout, .token = o->job->token};
    struct wb_ckpt *ck = NULL;
    struct wb_model md;
    struct wb_ckpt_shares sh = {0};
    struct wb_trainer_layout tl;
    char id[WB_SOURCE_MAX], a[32], why[WB_ERRMSG_MAX] = "";
    char(*ids)[WB_SOURCE_MAX] = NULL;
    const char **idp = NULL;
    struct share_parts sp = {0};
    memset(res, 0, sizeof(*res));
    memset(&tl, 0, sizeof(tl));
    c.mode = o->progress;
    if (c.mode == WB_BCAST_PROGRESS_AUTO)
        c.mode = isatty(fileno(c.out)) ? WB_BCAST_PROGRESS_LIVE : WB_BCAST_PROGRESS_PLAIN;

    int err = check_inputs(o, &ck, &md, el);
    if (err)
        return err;
    say(&c, "checkpoint %s: %zu file%s, %zu tensors, %s; every tensor matches the model",
        wb_esc(o->checkpoint).s, ck->nfiles, ck->nfiles == 1 ? "" : "s", ck->inv.n,
        bc_fmt_dec(ck->bytes, a, sizeof(a)));
    wb_model_free(&md);
    if ((err = wb_ckpt_shares_make(ck, o->readers, &sh)) != 0 ||
        (err = wb_ckpt_fingerprint(ck, id, sizeof(id))) != 0) {
        wb_errlist_add(el, "%s: %s", wb_esc(o->checkpoint).s, wb_strerror(err));
        goto out;
    }
    if ((err = wb_ckpt_layout(ck, &sh, &tl, el)) != 0)
        goto out;
    /* Ground truth: the coordinator hashes every share of the checkpoint it was pointed at;
     * reader k must register the same fingerprint and the same content hash of share k. */
    if (!(ids = calloc(o->readers ? o->readers : 1, sizeof(*ids))) ||
        !(idp = calloc(o->readers ? o->readers : 1, sizeof(*idp))) ||
        (err = parts_new(ck, &sh, &sp)) != 0) {
        err = err ? err : -ENOMEM;
        goto out;
    }
    {
        struct wb_ckpt_reader *rd = NULL;
        struct wb_ckpt_io_opts io = {0};
        uint64_t t0 = wb_now_ns();
        err = wb_ckpt_reader_open(ck, &io, &rd);
        for (uint32_t k = 0; !err && k < sh.n; k++) {
            struct wb_hash128 h;
            char hex[33];
            if ((err = wb_ckpt_share_hash(ck, &sh.share[k], rd, &h, sp.hash[k])) != 0)
                break;
            /* what the reader registers (reader.c): well under WB_SOURCE_MAX */
            char t[2 * WB_SOURCE_MAX];
            snprintf(t, sizeof(t), "%s share %u/%u content %s", id, k, sh.n,
                     wb_hash128_hex(&h, hex));
            if (strlen(t) >= sizeof(ids[k])) {
                err = -ENAMETOOLONG;
                break;
            }
            memcpy(ids[k], t, strlen(t) + 1);
            idp[k] = ids[k];
        }
        wb_ckpt_reader_close(rd);
        if (err) {
            wb_errlist_add(el, "%s: hashing its contents: %s", wb_esc(o->checkpoint).s,
                           err == -EIO ? "a file is shorter than when it was opened"
                                       : wb_strerror(err));
            goto out;
        }
        say(&c, "content: %s hashed in %.3f s (XXH3-128 of each reader's share)",
            bc_fmt_dec(ck->bytes, a, sizeof(a)), (double)(wb_now_ns() - t0) / 1e9);
    }
    /* the controller: the checkpoint's tensors are the trainer inventory, its readers the
     * trainers; planned now, so that a refused plan stops everything before it listens */
    o->job->trainers = o->readers;
    o->job->verify = o->verify;
    struct wb_controller_opts co = {.trainer_layout = &tl,
                                    .trainer_inv = &ck->inv,
                                    .sources = (const char *const *)idp,
                                    .nsources = sh.n,
                                    .parts = sp.parts,
                                    .fit_largest_task = true};
    if ((err = wb_controller_create_opts(o->job, &co, &c.ctl, el)) != 0)
        goto out;
    struct wb_controller_plan_info pi;
    wb_controller_plan_info(c.ctl, &pi, NULL);
    c.nt = pi.ntrainers;
    c.nr = pi.nrollouts;
    res->plan_bytes = pi.bytes;
    res->version = o->version ? o->version : 1;
    res->ckpt_bytes = ck->bytes;
    res->readers = c.nt;
    res->rollouts = c.nr;
    res->reader = calloc(c.nt ? c.nt : 1, sizeof(*res->reader));
    c.nav = c.nt + c.nr;
    c.av = calloc(c.nav ? c.nav : 1, sizeof(*c.av));
    if (!res->reader || !c.av) {
        err = -ENOMEM;
        goto out;
    }
    for (uint32_t r = 0; r < c.nt; r++)
        res->reader[r].read_bytes = sh.share[r].bytes;
    char b[32];
    say(&c,
        "plan: %u reader%s -> %u rollouts, %s to write, %s memory cap per reader%s; "
        "controller on %s",
        c.nt, c.nt == 1 ? "" : "s", c.nr, bc_fmt_dec(res->plan_bytes, a, sizeof(a)),
        bc_fmt_dec(pi.mem_cap, b, sizeof(b)),
        pi.mem_cap > (o->job->mem_cap ? o->job->mem_cap : (uint64_t)WB_MEM_CAP_DEFAULT)
            ? " (raised to the largest task)"
            : "",
        o->job->listen);
    /* the channels first: once the thread runs, only a shutdown request through them ends it */
    if ((err = wb_chan_open(&c.st, o->job->listen, c.token)) != 0 ||
        (err = wb_chan_open(&c.xf, o->job->listen, c.token)) != 0) {
        wb_errlist_add(el, "controller %s: %s", o->job->listen, wb_strerror(err));
        goto out;
    }
    if (pthread_create(&c.th, NULL, ctl_main, &c)) {
        err = -EAGAIN;
        wb_errlist_add(el, "cannot start the controller's thread");
        goto out;
    }
    c.running = true;
    uint64_t wait = o->wait_ns ? o->wait_ns : 600ull * 1000000000;
    uint32_t most = o->attempts ? o->attempts : 4;
    uint64_t t0 = 0;
    for (;;) {
        if ((err = wait_ready(&c, wait, el)) != 0)
            goto out;
        if (!t0)
            t0 = wb_now_ns();
        res->attempts++;
        if (res->attempts > 1)
            say(&c, "attempt %u: resuming version %" PRIu64, res->attempts, res->version);
        uint64_t sent = 0;
        err = attempt(&c, res->version, res, &sent, why, sizeof(why));
        if (!err) {
            res->write_bytes += sent;
            if (res->attempts > 1)
                res->resent_bytes += sent;
            break;
        }
        /* What was written before the failure counts too (as far as the last heartbeats
         * said); the next attempt sends only what did not land. */
        for (uint32_t i = 0; i < c.nav; i++)
            if (c.av[i].trainer && c.av[i].rank < c.nt) {
                res->write_bytes += c.av[i].done;
                res->resent_bytes += res->attempts > 1 ? c.av[i].done : 0;
                res->reader[c.av[i].rank].write_bytes += c.av[i].done;
            }
        say(&c, "attempt %u failed: %s", res->attempts, why);
        /* Retried only when an agent died or restarted (the broken attempt is then resumed
         * once it is back); a checksum mismatch or a read error would fail again. A survivor
         * may report the failure (a write to the dead one failed) before the controller's
         * heartbeats declare the death: they are given the time to. */
        char who[1024] = "", w2[WB_ERRMSG_MAX];
        bool died = strstr(why, " died (") || strstr(why, " restarted");
        uint64_t until = wb_now_ns() + 2 * o->job->dead_ns + 1000000000ull;
        do {
            if (status(&c, w2, sizeof(w2)) == 0)
                missing(&c, who, sizeof(who));
            died |= *who != 0;
            struct timespec ts = {0, 200 * 1000000};
            if (!died)
                nanosleep(&ts, NULL);
        } while (!died && wb_now_ns() < until);
        if (!died || res->attempts >= most) {
            wb_errlist_add(el, "%s%s", why, died ? " (no attempts left)" : "");
            err = -WB_E_PEER;
            goto out;
        }
        if (*who)
            say(&c, "restart %s to resume; only what has not landed is sent again", who);
    }
    res->total_ns = wb_now_ns() - t0;
    summary(&c, res);
out:
    if (c.running) {
        /* the job ends: readers and rollout agents are told to exit */
        void *buf = NULL;
        struct wb_msg m;
        char w2[WB_ERRMSG_MAX];
        if (call(&c, WB_MSG_CTL_SHUTDOWN, &buf, &m, w2, sizeof(w2)) == 0)
            wb_chan_free(buf);
        pthread_join(c.th, NULL);
    }
    if (c.line_open)
        fputc('\n', c.out);
    wb_chan_close(&c.st);
    wb_chan_close(&c.xf);
    wb_controller_destroy(c.ctl);
    wb_trainer_layout_free(&tl);
    wb_ckpt_shares_free(&sh);
    wb_ckpt_close(ck);
    free(c.av);
    free(ids);
    free(idp);
    parts_free(&sp);
    return err;
}
