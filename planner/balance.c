/* balance.c — source selection: lower bound, reference greedy and the planner's assignment.
 * See balance.h for the model. The max-flow graph has one node per candidate set and per rank,
 * so it stays small (hundreds of nodes) however many demands there are. */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "planner/balance.h"

int pl_bal_init(struct balance *b, uint32_t nranks, uint32_t nphases)
{
    memset(b, 0, sizeof(*b));
    b->nranks = nranks;
    b->nphases = nphases ? nphases : 1;
    pl_vec_init(&b->sets, sizeof(struct bal_set));
    pl_vec_init(&b->set_ranks, sizeof(uint32_t));
    pl_vec_init(&b->demands, sizeof(struct bal_demand));
    pl_vec_init(&b->parts, sizeof(struct bal_part));
    b->base = calloc(nranks ? nranks : 1, sizeof(uint64_t));
    b->load = calloc(nranks ? nranks : 1, sizeof(uint64_t));
    b->pbase = calloc((size_t)b->nphases * nranks + 1, sizeof(uint64_t));
    b->hcap = 1024;
    b->hash = calloc(b->hcap, sizeof(uint32_t));
    if (!b->base || !b->load || !b->hash || !b->pbase) {
        pl_bal_free(b);
        return -ENOMEM;
    }
    return 0;
}

void pl_bal_free(struct balance *b)
{
    free(b->base);
    free(b->pbase);
    free(b->load);
    free(b->hash);
    pl_vec_free(&b->sets);
    pl_vec_free(&b->set_ranks);
    pl_vec_free(&b->demands);
    pl_vec_free(&b->parts);
    memset(b, 0, sizeof(*b));
}

static uint64_t hash_ranks(const uint32_t *r, uint32_t n)
{
    uint64_t h = 1469598103934665603ull ^ n;
    for (uint32_t i = 0; i < n; i++) {
        h ^= r[i];
        h *= 1099511628211ull;
    }
    return h;
}

static int rehash(struct balance *b)
{
    size_t cap = b->hcap * 2;
    uint32_t *h = calloc(cap, sizeof(uint32_t));
    if (!h)
        return -ENOMEM;
    for (size_t i = 0; i < b->sets.n; i++) {
        size_t j = VEC_AT(&b->sets, struct bal_set, i)->hash & (cap - 1);
        while (h[j])
            j = (j + 1) & (cap - 1);
        h[j] = (uint32_t)i + 1;
    }
    free(b->hash);
    b->hash = h;
    b->hcap = cap;
    return 0;
}

int64_t pl_bal_set(struct balance *b, const uint32_t *ranks, uint32_t n)
{
    uint64_t hv = hash_ranks(ranks, n);
    size_t j = hv & (b->hcap - 1);
    while (b->hash[j]) {
        const struct bal_set *s = VEC_AT(&b->sets, struct bal_set, b->hash[j] - 1);
        if (s->hash == hv && s->n == n &&
            (n == 0 ||
             memcmp(VEC_AT(&b->set_ranks, uint32_t, s->r0), ranks, n * sizeof(uint32_t)) == 0))
            return b->hash[j] - 1;
        j = (j + 1) & (b->hcap - 1);
    }
    if (pl_vec_reserve(&b->set_ranks, n))
        return -ENOMEM;
    struct bal_set s = {.r0 = (uint32_t)b->set_ranks.n, .n = n, .hash = hv};
    if (n)
        memcpy(VEC_AT(&b->set_ranks, uint32_t, b->set_ranks.n), ranks, n * sizeof(uint32_t));
    b->set_ranks.n += n;
    if (!pl_vec_push(&b->sets, &s))
        return -ENOMEM;
    b->hash[j] = (uint32_t)b->sets.n;
    if (b->sets.n * 2 > b->hcap && rehash(b))
        return -ENOMEM;
    return (int64_t)b->sets.n - 1;
}

int pl_bal_add(struct balance *b, uint32_t set, uint64_t bytes, uint32_t nunits, uint32_t group,
               uint32_t phase)
{
    struct bal_set *s = VEC_AT(&b->sets, struct bal_set, set);
    if (phase >= b->nphases)
        phase = b->nphases - 1;
    if (s->n == 1) {
        uint32_t r = *VEC_AT(&b->set_ranks, uint32_t, s->r0);
        b->base[r] += bytes;
        b->pbase[(size_t)phase * b->nranks + r] += bytes;
        return 1;
    }
    s->total += bytes;
    struct bal_demand d = {
        .bytes = bytes, .set = set, .nunits = nunits ? nunits : 1, .group = group, .phase = phase};
    return pl_vec_push(&b->demands, &d) ? 0 : -ENOMEM;
}

/* ---------------------------------------------------------------- max-flow (Dinic) */

struct fedge {
    uint32_t to, next;
    int64_t cap;
};

struct flow {
    uint32_t nn;
    struct vec e; /* struct fedge, paired: e ^ 1 is the reverse */
    uint32_t *head, *level, *it, *queue;
};

static int flow_init(struct flow *f, uint32_t nn)
{
    memset(f, 0, sizeof(*f));
    f->nn = nn;
    pl_vec_init(&f->e, sizeof(struct fedge));
    f->head = malloc(nn * sizeof(uint32_t));
    f->level = malloc(nn * sizeof(uint32_t));
    f->it = malloc(nn * sizeof(uint32_t));
    f->queue = malloc(nn * sizeof(uint32_t));
    if (!f->head || !f->level || !f->it || !f->queue)
        return -ENOMEM;
    memset(f->head, 0xff, nn * sizeof(uint32_t));
    return 0;
}

static void flow_free(struct flow *f)
{
    pl_vec_free(&f->e);
    free(f->head);
    free(f->level);
    free(f->it);
    free(f->queue);
}

static int flow_edge(struct flow *f, uint32_t a, uint32_t z, int64_t cap)
{
    struct fedge e1 = {z, f->head[a], cap}, e2 = {a, f->head[z], 0};
    if (!pl_vec_push(&f->e, &e1) || !pl_vec_push(&f->e, &e2))
        return -ENOMEM;
    f->head[a] = (uint32_t)f->e.n - 2;
    f->head[z] = (uint32_t)f->e.n - 1;
    return 0;
}

static bool flow_bfs(struct flow *f, uint32_t s, uint32_t t)
{
    struct fedge *E = f->e.p;
    memset(f->level, 0xff, f->nn * sizeof(uint32_t));
    uint32_t qh = 0, qt = 0;
    f->level[s] = 0;
    f->queue[qt++] = s;
    while (qh < qt) {
        uint32_t v = f->queue[qh++];
        for (uint32_t i = f->head[v]; i != UINT32_MAX; i = E[i].next)
            if (E[i].cap > 0 && f->level[E[i].to] == UINT32_MAX) {
                f->level[E[i].to] = f->level[v] + 1;
                f->queue[qt++] = E[i].to;
            }
    }
    return f->level[t] != UINT32_MAX;
}

/* Iterative blocking-flow DFS. */
static int64_t flow_dfs(struct flow *f, uint32_t s, uint32_t t)
{
    struct fedge *E = f->e.p;
    int64_t total = 0;
    uint32_t *stack = f->queue; /* edges on the current path */
    for (;;) {
        uint32_t depth = 0, v = s;
        for (;;) {
            if (v == t)
                break;
            uint32_t *i = &f->it[v];
            while (*i != UINT32_MAX && !(E[*i].cap > 0 && f->level[E[*i].to] == f->level[v] + 1))
                *i = E[*i].next;
            if (*i == UINT32_MAX) {
                if (depth == 0)
                    return total;
                f->level[v] = UINT32_MAX; /* dead end */
                depth--;
                v = E[stack[depth] ^ 1].to;
                f->it[v] = E[f->it[v]].next;
                continue;
            }
            stack[depth++] = *i;
            v = E[*i].to;
        }
        int64_t push = INT64_MAX;
        for (uint32_t k = 0; k < depth; k++)
            if (E[stack[k]].cap < push)
                push = E[stack[k]].cap;
        for (uint32_t k = 0; k < depth; k++) {
            E[stack[k]].cap -= push;
            E[stack[k] ^ 1].cap += push;
        }
        total += push;
    }
}

static int64_t flow_max(struct flow *f, uint32_t s, uint32_t t)
{
    int64_t total = 0;
    while (flow_bfs(f, s, t)) {
        memcpy(f->it, f->head, f->nn * sizeof(uint32_t));
        total += flow_dfs(f, s, t);
    }
    return total;
}

/* Builds the graph for load limit T; returns 1 when feasible, 0 when not, <0 on error. With
 * quota != NULL (per set-member slot, like set_ranks) the flows are written there. */
static int feasible(const struct balance *b, uint64_t T, uint64_t *quota, const uint64_t *base,
                    bool phase_only)
{
    uint32_t ns = (uint32_t)b->sets.n, nt = b->nranks;
    uint32_t S = ns + nt, Tn = S + 1;
    struct flow f;
    int r = flow_init(&f, Tn + 1);
    int64_t need = 0;
    for (uint32_t i = 0; !r && i < ns; i++) {
        const struct bal_set *s = VEC_AT(&b->sets, struct bal_set, i);
        uint64_t tot = phase_only ? s->ptotal : s->total;
        if (s->n < 2 || tot == 0)
            continue;
        need += (int64_t)tot;
        r = flow_edge(&f, S, i, (int64_t)tot);
        for (uint32_t k = 0; !r && k < s->n; k++)
            r = flow_edge(&f, i, ns + *VEC_AT(&b->set_ranks, uint32_t, s->r0 + k), INT64_MAX / 4);
    }
    for (uint32_t k = 0; !r && k < nt; k++) {
        if (base[k] > T) {
            flow_free(&f);
            return 0;
        }
        r = flow_edge(&f, ns + k, Tn, (int64_t)(T - base[k]));
    }
    if (r) {
        flow_free(&f);
        return r;
    }
    int64_t got = flow_max(&f, S, Tn);
    if (got == need && quota) {
        const struct fedge *E = f.e.p;
        for (uint32_t i = 0; i < ns; i++) {
            const struct bal_set *s = VEC_AT(&b->sets, struct bal_set, i);
            for (uint32_t k = 0; k < s->n; k++)
                quota[s->r0 + k] = 0;
            if (s->n < 2 || (phase_only ? s->ptotal : s->total) == 0)
                continue;
            /* Edges were added in member order; walk the node's list (reverse order). */
            uint32_t k = s->n;
            for (uint32_t e = f.head[i]; e != UINT32_MAX; e = E[e].next) {
                if (E[e].to == S || (e & 1))
                    continue;
                k--;
                quota[s->r0 + k] = (uint64_t)E[e ^ 1].cap; /* reverse capacity = flow */
            }
        }
    }
    flow_free(&f);
    return got == need;
}

/* ---------------------------------------------------------------- assignments */

static uint64_t part_bytes(const struct bal_demand *d, uint32_t u0, uint32_t u1)
{
    if (u0 == 0 && u1 == d->nunits)
        return d->bytes;
    return (uint64_t)((double)d->bytes * (u1 - u0) / d->nunits);
}

static int push_part(struct balance *b, struct bal_demand *d, uint32_t rank, uint32_t u0,
                     uint32_t u1)
{
    struct bal_part p = {rank, u0, u1};
    if (d->nparts == 0)
        d->part0 = (uint32_t)b->parts.n;
    d->nparts++;
    return pl_vec_push(&b->parts, &p) ? 0 : -ENOMEM;
}

static uint64_t max_of(const uint64_t *v, uint32_t n)
{
    uint64_t m = 0;
    for (uint32_t i = 0; i < n; i++)
        if (v[i] > m)
            m = v[i];
    return m;
}

/* The first candidate with the least load. Two passes (the minimum, then where it is) instead
 * of one running comparison: the comparisons of the first pass do not wait on each other. */
static uint32_t least_loaded(const uint64_t *load, const uint32_t *cand, uint32_t n)
{
    uint64_t m0 = load[cand[0]], m1 = m0;
    uint32_t k = 1;
    for (; k + 1 < n; k += 2) {
        uint64_t a = load[cand[k]], b = load[cand[k + 1]];
        m0 = a < m0 ? a : m0;
        m1 = b < m1 ? b : m1;
    }
    if (k < n && load[cand[k]] < m0)
        m0 = load[cand[k]];
    uint64_t m = m0 < m1 ? m0 : m1;
    for (k = 0; load[cand[k]] != m; k++)
        ;
    return cand[k];
}

/* The index of the first largest of q[0 .. n) (as least_loaded). */
static uint32_t largest(const int64_t *q, uint32_t n)
{
    int64_t m0 = q[0], m1 = m0;
    uint32_t k = 1;
    for (; k + 1 < n; k += 2) {
        m0 = q[k] > m0 ? q[k] : m0;
        m1 = q[k + 1] > m1 ? q[k + 1] : m1;
    }
    if (k < n && q[k] > m0)
        m0 = q[k];
    int64_t m = m0 > m1 ? m0 : m1;
    for (k = 0; q[k] != m; k++)
        ;
    return k;
}

/* The reference: each greedy group to the least-loaded candidate (lowest rank on ties), in
 * order. It only reads the demands' inputs and the sets' candidates, and writes rank[i]
 * (demand i's one part, all its units) and load, so it may run beside the phase solution. */
static void greedy(const struct balance *b, uint64_t *load, uint32_t *rank)
{
    memcpy(load, b->base, b->nranks * sizeof(uint64_t));
    const struct bal_demand *D = b->demands.p;
    for (size_t i = 0; i < b->demands.n;) {
        size_t j = i;
        while (j < b->demands.n && D[j].group == D[i].group)
            j++;
        const struct bal_set *s = VEC_AT(&b->sets, struct bal_set, D[i].set);
        const uint32_t *cand = VEC_AT(&b->set_ranks, uint32_t, s->r0);
        uint32_t best = least_loaded(load, cand, s->n);
        for (size_t k = i; k < j; k++) {
            /* A group whose demands have different sets (never produced) would be split. */
            const struct bal_set *sk = VEC_AT(&b->sets, struct bal_set, D[k].set);
            uint32_t rk =
                sk == s ? best : least_loaded(load, VEC_AT(&b->set_ranks, uint32_t, sk->r0), sk->n);
            rank[k] = rk;
            load[rk] += D[k].bytes;
        }
        i = j;
    }
}

/* The greedy's assignment as the output: one part per demand. */
static int use_greedy(struct balance *b, const uint32_t *rank)
{
    b->parts.n = 0;
    if (pl_vec_reserve(&b->parts, b->demands.n))
        return -ENOMEM;
    for (size_t i = 0; i < b->demands.n; i++) {
        struct bal_demand *d = VEC_AT(&b->demands, struct bal_demand, i);
        d->nparts = 0;
        if (push_part(b, d, rank[i], 0, d->nunits))
            return -ENOMEM;
    }
    return 0;
}

struct greedy_job {
    const struct balance *b;
    uint64_t *load;
    uint32_t *rank;
};

static void *greedy_main(void *arg)
{
    struct greedy_job *j = arg;
    greedy(j->b, j->load, j->rank);
    return NULL;
}

enum { FEW = 1024 }; /* distinct sizes up to which sort_few counts instead */
enum { AHEAD = 16 }; /* demands on whose memory is asked for early (random order) */

static int cmp_desc_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x > y ? -1 : x < y;
}

/* sort_desc_bytes for demands of at most FEW distinct sizes: one pass to number the sizes (a
 * small hash), their order, then one stable counting pass. false: more sizes than that. */
static bool sort_few(uint32_t *idx, uint32_t n, const struct bal_demand *D, uint32_t *tmp)
{
    enum { CAP = 2 * FEW };
    uint64_t key[CAP];
    uint32_t id[CAP], cnt[FEW + 1];
    uint64_t val[FEW];
    uint32_t nv = 0;
    memset(id, 0, sizeof(id));
    for (uint32_t i = 0; i < n; i++) {
        if (i + AHEAD < n) /* demands of a set lie far apart: ask early */
            __builtin_prefetch(&D[idx[i + AHEAD]]);
        uint64_t b = D[idx[i]].bytes;
        size_t h = (size_t)((b * 0x9E3779B97F4A7C15ull) >> 52) & (CAP - 1);
        while (id[h] && key[h] != b)
            h = (h + 1) & (CAP - 1);
        if (!id[h]) {
            if (nv == FEW)
                return false;
            key[h] = b;
            val[nv] = b;
            id[h] = ++nv;
        }
    }
    qsort(val, nv, sizeof(uint64_t), cmp_desc_u64);
    /* rank of each size in the descending order, through the hash */
    for (uint32_t r = 0; r < nv; r++) {
        size_t h = (size_t)((val[r] * 0x9E3779B97F4A7C15ull) >> 52) & (CAP - 1);
        while (key[h] != val[r])
            h = (h + 1) & (CAP - 1);
        id[h] = r + 1;
    }
    memset(cnt, 0, (nv + 1) * sizeof(uint32_t));
    for (uint32_t i = 0; i < n; i++) { /* each demand's rank, kept in tmp */
        if (i + AHEAD < n)
            __builtin_prefetch(&D[idx[i + AHEAD]]);
        uint64_t b = D[idx[i]].bytes;
        size_t h = (size_t)((b * 0x9E3779B97F4A7C15ull) >> 52) & (CAP - 1);
        while (key[h] != b)
            h = (h + 1) & (CAP - 1);
        tmp[i] = id[h] - 1;
        cnt[id[h]]++;
    }
    for (uint32_t r = 0; r < nv; r++)
        cnt[r + 1] += cnt[r];
    uint32_t *out = malloc((n ? n : 1) * sizeof(uint32_t));
    if (!out)
        return false;
    for (uint32_t i = 0; i < n; i++)
        out[cnt[tmp[i]]++] = idx[i];
    memcpy(idx, out, n * sizeof(uint32_t));
    free(out);
    return true;
}

/* Sorts demand indices by bytes, largest first, keeping the given order among equals
 * (sort_few when the sizes are few, else an LSD radix sort, 8 bits a pass, skipping the digits
 * all keys share; tmp holds n). Hundreds of thousands of demands of a few distinct sizes: a
 * comparison sort spends most of the balancer's time here. */
static void sort_desc_bytes(uint32_t *idx, uint32_t n, const struct bal_demand *D, uint32_t *tmp)
{
    if (n > 64 && sort_few(idx, n, D, tmp))
        return;
    uint64_t all = ~0ull, any = 0;
    for (uint32_t i = 0; i < n; i++) {
        all &= ~D[idx[i]].bytes;
        any |= ~D[idx[i]].bytes;
    }
    uint64_t differ = all ^ any;
    for (int shift = 0; shift < 64; shift += 8) {
        if (!((differ >> shift) & 0xff))
            continue;
        uint32_t count[257] = {0};
        for (uint32_t i = 0; i < n; i++)
            count[((~D[idx[i]].bytes >> shift) & 0xff) + 1]++;
        for (int d = 0; d < 256; d++)
            count[d + 1] += count[d];
        for (uint32_t i = 0; i < n; i++)
            tmp[count[(~D[idx[i]].bytes >> shift) & 0xff]++] = idx[i];
        memcpy(idx, tmp, n * sizeof(uint32_t));
    }
}

/* Fills the flow quotas set by set, largest demands first, splitting where a quota ends. The
 * phase's demands of set s are order[start[s] .. start[s + 1]), in demand order. */
static int quota_fill(struct balance *b, const uint64_t *quota, uint64_t *load, uint32_t *order,
                      const uint32_t *start)
{
    size_t nd = b->demands.n, ns = b->sets.n;
    struct bal_demand *D = b->demands.p;
    uint32_t *tmp = malloc((nd ? nd : 1) * sizeof(uint32_t));
    int64_t *rem = malloc((b->set_ranks.n ? b->set_ranks.n : 1) * sizeof(int64_t));
    int r = 0;
    if (!tmp || !rem) {
        r = -ENOMEM;
        goto out;
    }
    for (size_t i = 0; i < b->set_ranks.n; i++)
        rem[i] = (int64_t)quota[i];
    for (size_t s = 0; s < ns; s++) {
        const struct bal_set *set = VEC_AT(&b->sets, struct bal_set, s);
        const uint32_t *cand = VEC_AT(&b->set_ranks, uint32_t, set->r0);
        int64_t *q = &rem[set->r0];
        uint32_t a = start[s], z = start[s + 1];
        if (set->n > 1) /* one candidate takes every demand whole, in any order */
            sort_desc_bytes(order + a, z - a, D, tmp);
        for (uint32_t k = a; k < z; k++) {
            if (k + AHEAD < z)
                __builtin_prefetch(&D[order[k + AHEAD]], 1);
            struct bal_demand *d = &D[order[k]];
            d->nparts = 0;
            uint32_t u = 0;
            while (u < d->nunits) {
                uint32_t best = largest(q, set->n);
                uint64_t left = part_bytes(d, u, d->nunits);
                uint32_t u1 = d->nunits;
                if ((int64_t)left > q[best] && d->nunits > 1 && q[best] > 0) {
                    double per = (double)d->bytes / d->nunits;
                    uint32_t take = (uint32_t)((double)q[best] / per + 0.5);
                    if (take == 0)
                        take = 1;
                    if (u + take < d->nunits)
                        u1 = u + take;
                }
                uint64_t pb = part_bytes(d, u, u1);
                if (push_part(b, d, cand[best], u, u1)) {
                    r = -ENOMEM;
                    goto out;
                }
                q[best] -= (int64_t)pb;
                load[cand[best]] += pb;
                u = u1;
            }
        }
    }
out:
    free(tmp);
    free(rem);
    return r;
}

/* Moves whole parts off the busiest rank while that lowers the maximum: each round visits the
 * busiest rank's parts in part order. A rank's parts are listed once (`at`, counting sort by
 * rank) and the parts moved onto it since are kept beside (`in`); a round reads the two merged
 * and skips the parts that have moved away, so it visits exactly what a scan of every part for
 * that rank would, in the same order (at 32 Kimi-K2 replicas a scan is 5M parts, 64 times). */
struct moved_in {
    uint32_t *p;
    uint32_t n, cap;
};

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

/* Part p moved onto rank `best` (its list of parts moved in); false: no memory. */
static bool move_in(struct moved_in *mi, uint32_t p)
{
    if (mi->n == mi->cap) {
        uint32_t cap = mi->cap ? 2 * mi->cap : 16;
        uint32_t *q = realloc(mi->p, cap * sizeof(uint32_t));
        if (!q)
            return false;
        mi->p = q;
        mi->cap = cap;
    }
    mi->p[mi->n++] = p;
    return true;
}

static int improve(struct balance *b, uint64_t *load)
{
    int rc = -ENOMEM;
    struct bal_demand *D = b->demands.p;
    struct bal_part *P = b->parts.p;
    size_t nparts = b->parts.n;
    uint32_t nr = b->nranks;
    uint32_t *owner = malloc((nparts ? nparts : 1) * sizeof(uint32_t));
    uint32_t *at = malloc((nparts ? nparts : 1) * sizeof(uint32_t));
    size_t *r0 = calloc((size_t)nr + 2, sizeof(size_t));
    struct moved_in *in = calloc(nr ? nr : 1, sizeof(struct moved_in));
    if (!owner || !at || !r0 || !in)
        goto out;
    for (size_t i = 0; i < b->demands.n; i++)
        for (uint32_t k = 0; k < D[i].nparts; k++)
            owner[D[i].part0 + k] = (uint32_t)i;
    for (size_t p = 0; p < nparts; p++)
        r0[P[p].rank + 2]++;
    for (uint32_t r = 0; r < nr; r++)
        r0[r + 2] += r0[r + 1];
    for (size_t p = 0; p < nparts; p++) /* ascending part order within each rank */
        at[r0[P[p].rank + 1]++] = (uint32_t)p;
    for (int round = 0; round < 64; round++) {
        uint32_t top = 0;
        for (uint32_t r = 1; r < nr; r++)
            if (load[r] > load[top])
                top = r;
        bool moved = false;
        struct moved_in *mt = &in[top];
        if (mt->n > 1)
            qsort(mt->p, mt->n, sizeof(uint32_t), cmp_u32);
        size_t i = r0[top], iz = r0[top + 1];
        uint32_t j = 0, nmt = mt->n, last = UINT32_MAX;
        while (i < iz || j < nmt) {
            uint32_t p = j == nmt || (i < iz && at[i] <= mt->p[j]) ? at[i++] : mt->p[j++];
            if (p == last || P[p].rank != top)
                continue; /* listed twice, or moved away */
            last = p;
            const struct bal_demand *d = &D[owner[p]];
            uint64_t pb = part_bytes(d, P[p].u0, P[p].u1);
            const struct bal_set *s = VEC_AT(&b->sets, struct bal_set, d->set);
            const uint32_t *cand = VEC_AT(&b->set_ranks, uint32_t, s->r0);
            uint32_t best = top;
            for (uint32_t m = 0; m < s->n; m++)
                if (load[cand[m]] < load[best])
                    best = cand[m];
            if (best != top && load[best] + pb < load[top]) {
                if (!move_in(&in[best], p))
                    goto out;
                load[top] -= pb;
                load[best] += pb;
                P[p].rank = best;
                moved = true;
                if (load[top] < load[best])
                    break;
            }
        }
        if (!moved)
            break;
    }
    rc = 0;
out:
    if (in)
        for (uint32_t r = 0; r < nr; r++)
            free(in[r].p);
    free(in);
    free(r0);
    free(at);
    free(owner);
    return rc;
}

/* The smallest T (exact, in bytes) at which the demands (all, or the current phase's) fit
 * over `base`. */
static int min_feasible(const struct balance *b, const uint64_t *base, bool phase_only,
                        uint64_t total, uint64_t *out)
{
    uint32_t nt = b->nranks;
    uint64_t base_sum = 0;
    for (uint32_t r = 0; r < nt; r++)
        base_sum += base[r];
    uint64_t lo = max_of(base, nt), hi = lo + total;
    uint64_t avg = nt ? ceil_div(total + base_sum, nt) : 0;
    if (avg > lo)
        lo = avg;
    if (lo > hi)
        hi = lo;
    if (total > 0) {
        int f = feasible(b, lo, NULL, base, phase_only);
        if (f < 0)
            return f;
        if (f) {
            hi = lo;
        } else {
            while (hi - lo > 1) {
                uint64_t mid = lo + (hi - lo) / 2;
                f = feasible(b, mid, NULL, base, phase_only);
                if (f < 0)
                    return f;
                if (f)
                    hi = mid;
                else
                    lo = mid;
            }
        }
    }
    *out = hi;
    return 0;
}

int pl_bal_solve(struct balance *b, bool greedy_only)
{
    uint32_t nt = b->nranks;
    uint64_t total = 0;
    for (size_t i = 0; i < b->sets.n; i++)
        total += VEC_AT(&b->sets, struct bal_set, i)->total;

    /* Lower bound over all phases: binary search over T with the max-flow as the test. */
    int r0 = min_feasible(b, b->base, false, total, &b->lower_bound);
    if (r0)
        return r0;
    uint64_t *gload = malloc((nt ? nt : 1) * sizeof(uint64_t));
    uint64_t *quota = malloc((b->set_ranks.n ? b->set_ranks.n : 1) * sizeof(uint64_t));
    uint32_t *grank = malloc((b->demands.n ? b->demands.n : 1) * sizeof(uint32_t));
    uint32_t *order = NULL, *pstart = NULL; /* the phases' solution: demands by (phase, set) */
    uint64_t *ptot = NULL;
    int r = 0;
    if (!gload || !quota || !grank) {
        r = -ENOMEM;
        goto out;
    }
    if (greedy_only || b->demands.n == 0) {
        greedy(b, gload, grank);
        b->greedy_max = max_of(gload, nt);
        memcpy(b->load, gload, nt * sizeof(uint64_t));
        b->max_load = b->greedy_max;
        b->used_greedy = true;
        r = use_greedy(b, grank);
        goto out;
    }
    /* The reference greedy on a thread of its own while the phases are solved here (it reads
     * nothing they write). */
    struct greedy_job gj = {b, gload, grank};
    pthread_t th;
    bool side =
        sysconf(_SC_NPROCESSORS_ONLN) > 1 && pthread_create(&th, NULL, greedy_main, &gj) == 0;
    if (!side)
        greedy(b, gload, grank);
    b->parts.n = 0;
    memset(b->load, 0, nt * sizeof(uint64_t));
    /* The demands by (phase, set), each run in demand order, and their bytes: one pass for all
     * phases instead of three per phase (5M demands at 32 Kimi-K2 replicas). */
    size_t nd = b->demands.n, ns = b->sets.n, nk = (size_t)b->nphases * ns;
    const struct bal_demand *D = b->demands.p;
    order = malloc((nd ? nd : 1) * sizeof(uint32_t));
    pstart = calloc(nk + 2, sizeof(uint32_t));
    ptot = calloc(nk + 1, sizeof(uint64_t));
    if (!order || !pstart || !ptot)
        r = -ENOMEM;
    for (size_t i = 0; i < nd && !r; i++) {
        size_t key = (size_t)D[i].phase * ns + D[i].set;
        pstart[key + 2]++;
        ptot[key] += D[i].bytes;
    }
    for (size_t k = 0; k < nk && !r; k++)
        pstart[k + 2] += pstart[k + 1];
    for (size_t i = 0; i < nd && !r; i++) /* pstart[key + 1]: where key's next one goes */
        order[pstart[(size_t)D[i].phase * ns + D[i].set + 1]++] = (uint32_t)i;
    for (uint32_t ph = 0; ph < b->nphases && !r; ph++) {
        uint64_t ptotal = 0;
        for (size_t i = 0; i < ns; i++) {
            VEC_AT(&b->sets, struct bal_set, i)->ptotal = ptot[(size_t)ph * ns + i];
            ptotal += ptot[(size_t)ph * ns + i];
        }
        for (uint32_t k = 0; k < nt; k++)
            b->load[k] += b->pbase[(size_t)ph * nt + k];
        if (ptotal == 0)
            continue;
        uint64_t T;
        r = min_feasible(b, b->load, true, ptotal, &T);
        if (r)
            break;
        r = feasible(b, T, quota, b->load, true);
        if (r < 0)
            break;
        if (r == 0) { /* cannot happen: T was feasible */
            r = -WB_E_PLAN;
            break;
        }
        r = quota_fill(b, quota, b->load, order, pstart + (size_t)ph * ns);
    }
    if (!r)
        r = improve(b, b->load);
    if (side)
        pthread_join(th, NULL);
    if (r)
        goto out;
    b->greedy_max = max_of(gload, nt);
    b->max_load = max_of(b->load, nt);
    if (b->max_load > b->greedy_max) { /* never worse than the reference */
        memcpy(b->load, gload, nt * sizeof(uint64_t));
        b->max_load = b->greedy_max;
        b->used_greedy = true;
        r = use_greedy(b, grank);
    }
out:
    free(order);
    free(pstart);
    free(ptot);
    free(grank);
    free(gload);
    free(quota);
    return r;
}
