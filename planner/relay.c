/* relay.c — replicas relaying to replicas (issue #30): the relay shapes, the forest of an
 * attempt over its member replicas, and the check that a forest writes every byte of every
 * replica once from a correct source.
 *
 * The forest is a pure function of the shape and the member set, so the controller, which
 * arranges each attempt's members, and the planner, whose estimate and verify assume all
 * capacity replicas are members, arrive at the same one. Why members in index order and roots
 * first: a replica that joins or is dropped moves the replicas after it by one place, which is
 * all a level-order layout can promise; a search for the forest that moves the fewest replicas
 * was rejected as state the controller would have to carry between attempts. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "planner/plan_int.h"

const char *const wb_relay_kind_names[] = {
    [WB_PLAN_RELAY_OFF] = "off",   [WB_PLAN_RELAY_CHAIN] = "chain", [WB_PLAN_RELAY_TREE] = "tree",
    [WB_PLAN_RELAY_AUTO] = "auto", [WB_PLAN_RELAY_AUTO + 1] = NULL,
};

int wb_relay_kind_parse(const char *s, enum wb_relay_kind *out)
{
    for (int k = 0; wb_relay_kind_names[k]; k++)
        if (strcmp(s, wb_relay_kind_names[k]) == 0) {
            *out = (enum wb_relay_kind)k;
            return 0;
        }
    return -EINVAL;
}

int wb_relay_resolve(const struct wb_relay *in, uint32_t replicas, struct wb_relay *out, char *err,
                     size_t cap)
{
    struct wb_relay r = *in;
    if ((unsigned)r.kind > WB_PLAN_RELAY_AUTO) {
        snprintf(err, cap, "relay: unknown kind %d (off, chain, tree or auto)", (int)r.kind);
        return -WB_E_CONFIG;
    }
    if (r.kind == WB_PLAN_RELAY_OFF) {
        if (r.fanout || r.roots) {
            snprintf(err, cap,
                     "relay off: a fanout (%" PRIu32 ") or roots (%" PRIu32
                     ") need relay chain, tree or auto",
                     r.fanout, r.roots);
            return -WB_E_CONFIG;
        }
        *out = (struct wb_relay){WB_PLAN_RELAY_OFF, 0, 0};
        return 0;
    }
    if (r.kind == WB_PLAN_RELAY_CHAIN && r.fanout > 1) {
        snprintf(err, cap,
                 "relay chain: fanout %" PRIu32 " (a chain has fanout 1; a tree has more)",
                 r.fanout);
        return -WB_E_CONFIG;
    }
    if (r.kind == WB_PLAN_RELAY_TREE && r.fanout == 1) {
        snprintf(err, cap, "relay tree: fanout 1 is a chain (relay chain), a tree has 2 or more");
        return -WB_E_CONFIG;
    }
    if (r.fanout > 64) {
        snprintf(err, cap, "relay fanout %" PRIu32 ": at most 64", r.fanout);
        return -WB_E_CONFIG;
    }
    if (r.roots > replicas) {
        snprintf(err, cap, "relay roots %" PRIu32 ": the rollout has %" PRIu32 " replica%s",
                 r.roots, replicas, replicas == 1 ? "" : "s");
        return -WB_E_CONFIG;
    }
    if (r.kind == WB_PLAN_RELAY_CHAIN)
        r.fanout = 1;
    else if (r.kind == WB_PLAN_RELAY_TREE && !r.fanout)
        r.fanout = 2;
    if (!r.roots && r.kind != WB_PLAN_RELAY_AUTO)
        r.roots = 1;
    *out = r;
    return 0;
}

void wb_relay_forest(const struct wb_relay *shape, uint32_t replicas, const bool *member,
                     uint32_t *parent)
{
    uint32_t roots = shape->kind == WB_PLAN_RELAY_OFF ? UINT32_MAX
                     : shape->roots                   ? shape->roots
                                                      : 1;
    uint32_t k = shape->fanout ? shape->fanout : 1;
    /* i: the place of member j among the members; q: the place of member jq, the parent of
     * the place being filled, which only moves forward ((i - roots) / k grows with i) */
    uint32_t i = 0, q = 0, jq = 0;
    while (jq < replicas && member && !member[jq])
        jq++;
    for (uint32_t j = 0; j < replicas; j++) {
        if (member && !member[j]) {
            parent[j] = WB_RELAY_ABSENT;
            continue;
        }
        if (i < roots) {
            parent[j] = WB_RELAY_ROOT;
        } else {
            for (uint32_t want = (i - roots) / k; q < want; q++)
                do
                    jq++;
                while (member && !member[jq]);
            parent[j] = jq;
        }
        i++;
    }
}

int wb_relay_forest_edges(const uint32_t *parent, uint32_t replicas, uint32_t **roots,
                          struct wb_relay_edge **edges, struct wb_relay_forest *f)
{
    uint32_t *r = malloc(((size_t)replicas + 1) * sizeof(uint32_t));
    struct wb_relay_edge *e = malloc(((size_t)replicas + 1) * sizeof(*e));
    if (!r || !e) {
        free(r);
        free(e);
        return -ENOMEM;
    }
    uint32_t nr = 0, ne = 0;
    for (uint32_t j = 0; j < replicas; j++)
        if (parent[j] == WB_RELAY_ROOT)
            r[nr++] = j;
        else if (parent[j] != WB_RELAY_ABSENT)
            e[ne++] = (struct wb_relay_edge){parent[j], j};
    *roots = r;
    *edges = e;
    *f = (struct wb_relay_forest){nr, r, ne, e};
    return 0;
}

/* The first difference between two receive lists, in words into buf; false when they hold the
 * same (local tensors and what completes an update). */
static bool recv_differs(const struct wb_recv_list *a, const struct wb_recv_list *b, char *buf,
                         size_t cap)
{
    if (a->nlocal != b->nlocal) {
        snprintf(buf, cap, "%" PRIu32 " local tensors against %" PRIu32, a->nlocal, b->nlocal);
        return true;
    }
    for (uint32_t i = 0; i < a->nlocal; i++) {
        const struct wb_rt_local *x = &a->local[i], *y = &b->local[i];
        bool same = x->tensor == y->tensor && x->dtype == y->dtype && x->bytes == y->bytes &&
                    x->shape.ndim == y->shape.ndim;
        for (uint32_t d = 0; same && d < x->shape.ndim; d++)
            same = x->shape.dim[d] == y->shape.dim[d];
        if (!same) {
            snprintf(buf, cap,
                     "local tensor %" PRIu32 ": rollout tensor %" PRIu32 " of %" PRIu64
                     " bytes against rollout tensor %" PRIu32 " of %" PRIu64 " bytes",
                     i, x->tensor, x->bytes, y->tensor, y->bytes);
            return true;
        }
    }
    if (a->nexpect != b->nexpect) {
        snprintf(buf, cap, "%" PRIu32 " expected tags against %" PRIu32, a->nexpect, b->nexpect);
        return true;
    }
    for (uint32_t i = 0; i < a->nexpect; i++) {
        const struct wb_rt_expect *x = &a->expect[i], *y = &b->expect[i];
        if (x->tag != y->tag || x->tensor != y->tensor || x->bytes != y->bytes ||
            x->writes != y->writes) {
            snprintf(buf, cap,
                     "tag %" PRIu32 " expects %" PRIu64 " bytes in %" PRIu64
                     " writes against tag %" PRIu32 ", %" PRIu64 " bytes in %" PRIu64 " writes",
                     x->tag, x->bytes, x->writes, y->tag, y->bytes, y->writes);
            return true;
        }
    }
    return false;
}

uint32_t wb_plan_replicas(const struct wb_plan *p)
{
    return p->nrollouts && p->recv ? p->recv[p->nrollouts - 1].replica + 1 : 0;
}

int wb_relay_verify(const struct wb_plan *p, const struct wb_relay_forest *f, struct wb_errlist *el)
{
    size_t before = wb_errlist_count(el);
    uint32_t nrep = wb_plan_replicas(p);
    uint32_t gpr = nrep ? p->nrollouts / nrep : 0;
    if (!nrep || gpr * nrep != p->nrollouts) {
        wb_errlist_add(el, "relay: the plan's %" PRIu32 " rollout ranks are not whole replicas",
                       p->nrollouts);
        return -WB_E_PLAN;
    }
    /* src[j]: the first source of replica j (WB_RELAY_ROOT: the trainers, else a parent),
     * WB_RELAY_ABSENT while none */
    uint32_t *src = malloc((size_t)nrep * sizeof(uint32_t));
    uint8_t *state = calloc(nrep, 1);
    if (!src || !state) {
        free(src);
        free(state);
        return -ENOMEM;
    }
    for (uint32_t j = 0; j < nrep; j++)
        src[j] = WB_RELAY_ABSENT;
    for (uint32_t i = 0; i < f->nroots; i++) {
        uint32_t j = f->roots[i];
        if (j >= nrep) {
            wb_errlist_add(
                el, "relay: root %" PRIu32 " is not a replica (the plan has %" PRIu32 ")", j, nrep);
            continue;
        }
        if (src[j] == WB_RELAY_ROOT)
            wb_errlist_add(el,
                           "relay: replica %" PRIu32 " is listed as a root twice: the "
                           "trainers would write it twice",
                           j);
        src[j] = WB_RELAY_ROOT;
    }
    for (uint32_t i = 0; i < f->nedges; i++) {
        uint32_t a = f->edges[i].parent, c = f->edges[i].child;
        if (a >= nrep || c >= nrep) {
            wb_errlist_add(el,
                           "relay: edge %" PRIu32 " -> %" PRIu32 ": replica %" PRIu32
                           " is not a replica (the plan has %" PRIu32 ")",
                           a, c, a >= nrep ? a : c, nrep);
            continue;
        }
        if (a == c) {
            wb_errlist_add(el, "relay: replica %" PRIu32 " relays to itself", a);
            continue;
        }
        if (src[c] == WB_RELAY_ROOT)
            wb_errlist_add(el,
                           "relay: replica %" PRIu32 " is written twice: by the trainers "
                           "(a root) and by replica %" PRIu32,
                           c, a);
        else if (src[c] != WB_RELAY_ABSENT)
            wb_errlist_add(el,
                           "relay: replica %" PRIu32 " is written twice: by replica %" PRIu32
                           " and by replica %" PRIu32,
                           c, src[c], a);
        else
            src[c] = a;
        /* congruence: the child's local rank l counts what its parent's local rank l counted */
        for (uint32_t l = 0; l < gpr; l++) {
            char why[256];
            if (recv_differs(&p->recv[a * gpr + l], &p->recv[c * gpr + l], why, sizeof(why))) {
                wb_errlist_add(el,
                               "relay: replica %" PRIu32 " cannot write replica %" PRIu32
                               ": local rank %" PRIu32 " (rollout rank %" PRIu32 " -> %" PRIu32
                               ") holds another receive list: %s",
                               a, c, l, a * gpr + l, c * gpr + l, why);
                break;
            }
        }
    }
    /* every replica with a parent reaches a root: walk up, marking (1: on the walk, 2: done) */
    for (uint32_t j = 0; j < nrep; j++) {
        if (state[j] || src[j] == WB_RELAY_ABSENT || src[j] == WB_RELAY_ROOT)
            continue;
        uint32_t x = j;
        while (src[x] != WB_RELAY_ROOT && src[x] != WB_RELAY_ABSENT && !state[x]) {
            state[x] = 1;
            x = src[x];
        }
        bool cycle = state[x] == 1, orphan = src[x] == WB_RELAY_ABSENT;
        if (cycle)
            wb_errlist_add(el,
                           "relay: replica %" PRIu32 " is on a relay cycle: no trainer's "
                           "bytes reach it",
                           x);
        else if (orphan)
            wb_errlist_add(el,
                           "relay: replica %" PRIu32 "'s bytes would come from replica %" PRIu32
                           ", which nothing writes (neither a root nor a child)",
                           j, x);
        for (uint32_t y = j; state[y] == 1; y = src[y])
            state[y] = 2;
    }
    free(src);
    free(state);
    return wb_errlist_count(el) > before ? -WB_E_PLAN : 0;
}

/* ---------------------------------------------------------------- auto */

/* relay auto: which shapes can win, by their lower bounds, then simulated. A shape's bound is
 * the busiest NIC under it: a trainer's egress to the roots (its bytes with every replica,
 * times roots / replicas: each replica's copy is balanced the same), a rollout's ingress, a
 * relaying rollout's egress (ingress times fanout). Chains of R roots for R a power of two
 * below the replicas, trees of fanout 2 the same, and off; a shape whose bound is not below
 * the best time simulated so far is not simulated (it cannot win), the others in the order
 * of their bounds, bounds within 1% of each other taken as equal and then more roots first
 * (fewer hops). The simulation decides, not the bound: a chain's hops cost time the bound does
 * not see. And once a shape simulates no more than 1% faster than the same kind with more
 * roots, fewer roots are not simulated: they add hops and take nothing off the busiest NIC
 * (a simulation of Kimi-K2 at 32 replicas is half a second; the choice stays within the 5 s
 * wb-plan is given at that size). */
struct cand {
    struct wb_relay shape;
    double bound;
    uint32_t bucket; /* bound / the least bound, in 1% steps */
};

static int cand_cmp(const void *a, const void *b)
{
    const struct cand *x = a, *y = b;
    if (x->bucket != y->bucket)
        return x->bucket < y->bucket ? -1 : 1;
    /* off: every replica a root */
    uint32_t rx = x->shape.kind == WB_PLAN_RELAY_OFF ? UINT32_MAX : x->shape.roots;
    uint32_t ry = y->shape.kind == WB_PLAN_RELAY_OFF ? UINT32_MAX : y->shape.roots;
    if (rx != ry)
        return rx > ry ? -1 : 1;
    return (int)x->shape.fanout - (int)y->shape.fanout;
}

int pl_relay_choose(struct wb_plan *p, const struct wb_plan_input *in)
{
    const struct wb_hw *th = &in->tl->hw, *rh = &in->rl->hw;
    uint32_t nrep = in->rl->replicas, want_roots = p->relay.roots;
    p->relay = (struct wb_relay){WB_PLAN_RELAY_OFF, 0, 0};
    if (nrep < 2 || th->nic_gbps <= 0 || rh->nic_gbps <= 0)
        return 0; /* nothing to relay, or no model to choose by: off */
    double te = th->nic_gbps * 1e9 / 8 * (double)th->nics_per_gpu * th->nic_efficiency;
    double re = rh->nic_gbps * 1e9 / 8 * (double)rh->nics_per_gpu * rh->nic_efficiency;
    uint64_t max_send = 0, max_recv = 0;
    for (uint32_t r = 0; r < p->ntrainers; r++)
        max_send = p->stats.send_bytes[r] > max_send ? p->stats.send_bytes[r] : max_send;
    for (uint32_t g = 0; g < p->nrollouts; g++)
        max_recv = p->stats.recv_bytes[g] > max_recv ? p->stats.recv_bytes[g] : max_recv;
    double t_send = (double)max_send / te, t_recv = (double)max_recv / re;
    struct cand c[2 * 32 + 1];
    size_t n = 0;
    c[n++] = (struct cand){{WB_PLAN_RELAY_OFF, 0, 0}, t_send > t_recv ? t_send : t_recv};
    for (uint32_t fan = 1; fan <= 2; fan++)
        for (uint32_t roots = 1; roots < nrep; roots *= 2) {
            uint32_t R = want_roots ? want_roots : roots;
            double b = t_send * R / nrep, relay_out = t_recv * fan;
            b = b > t_recv ? b : t_recv;
            b = b > relay_out ? b : relay_out;
            c[n++] =
                (struct cand){{fan == 1 ? WB_PLAN_RELAY_CHAIN : WB_PLAN_RELAY_TREE, fan, R}, b};
            if (want_roots)
                break;
        }
    double least = INFINITY;
    for (size_t i = 0; i < n; i++)
        least = c[i].bound < least ? c[i].bound : least;
    for (size_t i = 0; i < n; i++)
        c[i].bucket = least > 0 ? (uint32_t)fmin(1e6, floor((c[i].bound / least - 1) * 100)) : 0;
    qsort(c, n, sizeof(c[0]), cand_cmp);
    /* per kind (chain, with off as the chain whose every replica is a root; tree): its best
     * simulated time and, once a shape of it with fewer roots came out slower, those roots
     * (fewer are not simulated) */
    double kind_best[3] = {INFINITY, INFINITY, INFINITY};
    uint32_t kind_stop[3] = {0, 0, 0};
    p->relay_tried = calloc(n, sizeof(*p->relay_tried));
    if (!p->relay_tried)
        return -ENOMEM;
    struct wb_errlist quiet; /* a shape whose estimate fails is not chosen */
    wb_errlist_init(&quiet);
    struct wb_estimate best;
    memset(&best, 0, sizeof(best));
    double best_s = INFINITY;
    struct wb_relay best_shape = {WB_PLAN_RELAY_OFF, 0, 0};
    /* auto mode may have simulated the plan without relay while building it: that time is
     * known for free, it is what relay must beat, and wb-plan prints it beside the choice */
    bool off_known = pl_est_memo_has(p, in, &best_shape) &&
                     pl_estimate_relay(p, in, &best_shape, &best, &quiet) == 0;
    double off_s = off_known ? best.total_s : INFINITY;
    if (off_known) {
        best_s = off_s;
        kind_best[1] = off_s;
    }
    for (size_t i = 0; i < n; i++) {
        struct wb_relay_try *t = &p->relay_tried[p->nrelay_tried++];
        *t = (struct wb_relay_try){c[i].shape, INFINITY, c[i].bound};
        unsigned kd = c[i].shape.kind == WB_PLAN_RELAY_TREE ? 2 : 1;
        if (c[i].shape.kind == WB_PLAN_RELAY_OFF && off_known) {
            t->total_s = off_s;
            continue;
        }
        if (c[i].bound >= best_s) {
            t->skipped = WB_RELAY_TRY_BOUND;
            continue;
        }
        if (c[i].shape.kind != WB_PLAN_RELAY_OFF && c[i].shape.roots < kind_stop[kd]) {
            t->skipped = WB_RELAY_TRY_HOPS;
            continue;
        }
        struct wb_estimate e;
        uint64_t t0 = wb_now_ns();
        int rc = pl_estimate_relay(p, in, &c[i].shape, &e, &quiet);
        if (rc == -ENOMEM) {
            wb_errlist_free(&quiet);
            wb_estimate_free(&best);
            return rc;
        }
        if (rc)
            continue;
        t->total_s = e.total_s;
        if (e.total_s >= kind_best[kd] * 0.99) /* fewer roots did not pay: stop there */
            kind_stop[kd] = c[i].shape.roots;
        kind_best[kd] = e.total_s < kind_best[kd] ? e.total_s : kind_best[kd];
        wb_log(WB_LOG_DEBUG, "planner",
               "relay auto: %s fanout %u roots %u: %.4f s (bound %.4f s), "
               "simulated in %.2f s",
               wb_relay_kind_names[c[i].shape.kind], c[i].shape.fanout, c[i].shape.roots, e.total_s,
               c[i].bound, (double)(wb_now_ns() - t0) * 1e-9);
        if (e.total_s < best_s) {
            wb_estimate_free(&best);
            best = e;
            best_s = e.total_s;
            best_shape = c[i].shape;
        } else {
            wb_estimate_free(&e);
        }
    }
    wb_errlist_free(&quiet);
    p->relay = best_shape;
    if (best_s < INFINITY)
        pl_est_memo_set(p, in, &best); /* wb-plan --estimate asks for it again */
    return 0;
}

int pl_relay_verify_plan(const struct wb_plan *p, struct wb_errlist *el)
{
    uint32_t nrep = wb_plan_replicas(p);
    uint32_t *parent = malloc(((size_t)nrep + 1) * sizeof(uint32_t)), *roots = NULL;
    struct wb_relay_edge *edges = NULL;
    struct wb_relay_forest f;
    if (!parent)
        return -ENOMEM;
    wb_relay_forest(&p->relay, nrep, NULL, parent);
    int rc = wb_relay_forest_edges(parent, nrep, &roots, &edges, &f);
    if (!rc)
        rc = wb_relay_verify(p, &f, el);
    free(parent);
    free(roots);
    free(edges);
    return rc;
}

/* ---------------------------------------------------------------- words */

const char *wb_relay_str(const struct wb_relay *r, char *buf, size_t cap)
{
    uint32_t roots = r->roots ? r->roots : 1;
    if (r->kind == WB_PLAN_RELAY_CHAIN)
        snprintf(buf, cap, "chain, %" PRIu32 " root%s", roots, roots == 1 ? "" : "s");
    else if (r->kind == WB_PLAN_RELAY_TREE)
        snprintf(buf, cap, "tree of fanout %" PRIu32 ", %" PRIu32 " root%s", r->fanout, roots,
                 roots == 1 ? "" : "s");
    else
        snprintf(buf, cap, "%s", r->kind == WB_PLAN_RELAY_AUTO ? "auto" : "off");
    return buf;
}

/* The chain or subtree under replica j, "0 -> 8 -> 16" or "0 -> (1 -> (3, 4), 2)". */
static void print_tree(FILE *f, const uint32_t *parent, uint32_t n, uint32_t j, int depth)
{
    fprintf(f, "%" PRIu32, j);
    uint32_t kids = 0;
    for (uint32_t c = 0; c < n; c++)
        kids += parent[c] == j;
    if (!kids)
        return;
    fprintf(f, kids == 1 ? " -> " : " -> (");
    uint32_t k = 0;
    for (uint32_t c = 0; c < n; c++)
        if (parent[c] == j) {
            if (k++)
                fprintf(f, ", ");
            print_tree(f, parent, n, c, depth + 1);
        }
    if (kids > 1)
        fprintf(f, ")");
}

void wb_relay_print(const struct wb_plan *p, FILE *f)
{
    char b[64];
    if (p->relay_tried) {
        fprintf(f, "  relay auto: simulated");
        for (uint32_t i = 0; i < p->nrelay_tried; i++) {
            const struct wb_relay_try *t = &p->relay_tried[i];
            if (t->total_s == INFINITY)
                fprintf(f, "%s %s (not simulated: %s %.3f s)", i ? "," : "",
                        wb_relay_str(&t->shape, b, sizeof(b)),
                        t->skipped == WB_RELAY_TRY_HOPS    ? "fewer roots stopped paying, bound"
                        : t->skipped == WB_RELAY_TRY_BOUND ? "its bound is above the best,"
                                                           : "its estimate failed, bound",
                        t->bound_s);
            else
                fprintf(f, "%s %s %.3f s", i ? "," : "", wb_relay_str(&t->shape, b, sizeof(b)),
                        t->total_s);
        }
        fprintf(f, "\n");
    }
    if (p->relay.kind == WB_PLAN_RELAY_OFF) {
        if (p->relay_tried)
            fprintf(f, "  relay: off (chosen: the trainers write every replica)\n");
        return;
    }
    uint32_t nrep = wb_plan_replicas(p);
    uint32_t *parent = malloc(((size_t)nrep + 1) * sizeof(uint32_t));
    if (!parent)
        return;
    wb_relay_forest(&p->relay, nrep, NULL, parent);
    fprintf(f, "  relay: %s%s; the trainers write replica%s", wb_relay_str(&p->relay, b, sizeof(b)),
            p->relay_tried ? " (chosen)" : "", p->relay.roots == 1 ? "" : "s");
    uint32_t k = 0;
    for (uint32_t j = 0; j < nrep; j++)
        if (parent[j] == WB_RELAY_ROOT)
            fprintf(f, "%s %" PRIu32, k++ ? "," : "", j);
    fprintf(f, "\n    forest:");
    k = 0;
    for (uint32_t j = 0; j < nrep; j++)
        if (parent[j] == WB_RELAY_ROOT) {
            fprintf(f, "%s ", k++ ? ";" : "");
            print_tree(f, parent, nrep, j, 0);
        }
    fprintf(f, "\n");
    free(parent);
}
