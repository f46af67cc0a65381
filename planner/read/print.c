/* print.c — text forms of a plan: the summary wb-plan prints, and a one-line-per-op dump of a
 * routing table (wb-plan --dump RANK, and the exact-table unit tests). */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "planner/plan_int.h"

static const char *tname(const struct wb_plan_input *in, uint32_t t)
{
    return in && t < in->trainer->n ? in->trainer->p[t].name : "?";
}

static const char *rname(const struct wb_plan_input *in, uint32_t t)
{
    return in && t < in->rollout->n ? in->rollout->p[t].name : "?";
}

static void print_view(FILE *f, const struct wb_plan_input *in, const struct wb_route_table *t,
                       const struct wb_rt_view *v)
{
    char s[160];
    if (v->kind == WB_BUF_PARAM)
        fprintf(f, "param %s", tname(in, v->tensor));
    else
        fprintf(f, "tmp %" PRIu64, v->off);
    fprintf(f, " %s %s", wb_dtype_name(v->dtype),
            wb_shape_str(wb_rt_shape(t, v->shape), s, sizeof(s)));
}

static void print_off(FILE *f, uint64_t off)
{
    if (off == (uint64_t)WB_RT_NONE)
        fprintf(f, "-");
    else
        fprintf(f, "%" PRIu64, off);
}

void wb_route_table_print(const struct wb_route_table *t, const struct wb_plan_input *in, FILE *f)
{
    char a[160], b[160], c[160];
    fprintf(
        f,
        "rank %u: %u phases, %u tasks, %u ops, %u writes, %" PRIu64 " bytes, inbox %" PRIu64 "\n",
        t->rank, t->nphases, t->ntasks, t->nops, t->nwrites, t->send_bytes, t->amax_inbox_bytes);
    for (uint32_t ph = 0; ph < t->nphases; ph++) {
        const struct wb_rt_phase *P = &t->phases[ph];
        fprintf(f, "phase %u: %u tasks%s\n", ph, P->ntasks, P->barrier_after ? ", barrier" : "");
        for (uint32_t k = P->task0; k < P->task0 + P->ntasks; k++) {
            const struct wb_rt_task *T = &t->tasks[k];
            const char *mname = in && T->mapping < in->match->n
                                    ? rname(in, in->match->map[T->mapping].rollout)
                                    : "?";
            fprintf(f, "  task %s %s tmp %" PRIu64 "\n", mname, wb_plan_mode_name(T->mode),
                    T->tmp_bytes);
            for (uint32_t o = T->op0; o < T->op0 + T->nops; o++) {
                const struct wb_rt_op *op = &t->ops[o];
                const char *tn = tname(in, op->tensor);
                switch (op->kind) {
                case WB_OP_H2D:
                    fprintf(f, "    h2d %s +%" PRIu64 " len %" PRIu64 " -> tmp %" PRIu64 "\n", tn,
                            op->h2d.src_off, op->h2d.bytes, op->h2d.dst_off);
                    break;
                case WB_OP_GATHER:
                    fprintf(f, "    gather %s seq %u from ", tn, op->gather.seq);
                    print_view(f, in, t, &op->gather.src);
                    fprintf(f, " peers");
                    for (uint32_t p = 0; p < op->gather.npeers; p++) {
                        const struct wb_rt_peer *pe = &t->peers[op->gather.peer0 + p];
                        fprintf(f, " %u%s", pe->rank,
                                wb_box_str(wb_rt_box(t, pe->box), a, sizeof(a)));
                    }
                    fprintf(f, " -> ");
                    print_view(f, in, t, &op->gather.dst);
                    fprintf(f, " in %" PRIu64 "\n", op->gather.bytes_in);
                    break;
                case WB_OP_AMAX:
                    fprintf(f, "    amax %s region %s blocks %s grid %s amax ", tn,
                            wb_box_str(wb_rt_box(t, op->amax.region), a, sizeof(a)),
                            wb_box_str(wb_rt_box(t, op->amax.blocks), b, sizeof(b)),
                            wb_box_str(wb_rt_box(t, op->amax.grid), c, sizeof(c)));
                    print_off(f, op->amax.amax_off);
                    fprintf(f, " peers");
                    for (uint32_t p = 0; p < op->amax.npeers; p++) {
                        const struct wb_rt_amax_peer *pe = &t->amax_peers[op->amax.peer0 + p];
                        fprintf(f, " %u (tag %u inbox %" PRIu64 " peer-inbox %" PRIu64 ")",
                                pe->rank, pe->tag, pe->inbox_off, pe->peer_inbox_off);
                    }
                    fprintf(f, "\n");
                    break;
                case WB_OP_COPY:
                case WB_OP_CAST:
                    fprintf(f, "    %s %s ", op->kind == WB_OP_COPY ? "copy" : "cast", tn);
                    print_view(f, in, t, &op->copy.src);
                    fprintf(f, "%s -> ", wb_box_str(wb_rt_box(t, op->copy.src_box), a, sizeof(a)));
                    print_view(f, in, t, &op->copy.dst);
                    fprintf(f, "%s\n", wb_box_str(wb_rt_box(t, op->copy.dst_box), a, sizeof(a)));
                    break;
                case WB_OP_PERMUTE:
                    fprintf(f, "    permute %s ", tn);
                    print_view(f, in, t, &op->permute.src);
                    fprintf(f, "%s -> ",
                            wb_box_str(wb_rt_box(t, op->permute.src_box), a, sizeof(a)));
                    print_view(f, in, t, &op->permute.dst);
                    fprintf(f, "%s dims [",
                            wb_box_str(wb_rt_box(t, op->permute.dst_box), a, sizeof(a)));
                    for (uint32_t k = 0; k < wb_rt_box(t, op->permute.dst_box)->ndim; k++)
                        fprintf(f, "%s%u", k ? ", " : "", wb_rt_perm_dim(op->permute.perm, k));
                    fprintf(f, "]\n");
                    break;
                case WB_OP_QUANT:
                    fprintf(f, "    quant %s ", tn);
                    print_view(f, in, t, &op->quant.src);
                    fprintf(f,
                            "%s region %s -> tmp %" PRIu64 " scales tmp %" PRIu64 " grid %s amax ",
                            wb_box_str(wb_rt_box(t, op->quant.src_box), a, sizeof(a)),
                            wb_box_str(wb_rt_box(t, op->quant.region), b, sizeof(b)),
                            op->quant.dst.off, op->quant.scale_off,
                            wb_box_str(wb_rt_box(t, op->quant.grid), c, sizeof(c)));
                    print_off(f, op->quant.amax_off);
                    fprintf(f, "\n");
                    break;
                }
            }
            for (uint32_t w = T->write0; w < T->write0 + T->nwrites; w++) {
                const struct wb_rt_write *x = &t->writes[w];
                if (x->src_tensor == (uint32_t)WB_RT_TMP_SRC)
                    fprintf(f, "    write tmp %" PRIu64, x->src_off);
                else
                    fprintf(f, "    write param %s +%" PRIu64, tname(in, x->src_tensor),
                            x->src_off);
                fprintf(f, " -> r%u %s +%" PRIu64 " len %" PRIu64 " tag %u", x->dst_rank,
                        rname(in, x->dst_tensor), x->dst_off, x->len, x->tag);
                if (x->more)
                    fprintf(f, " (and %u more replicas, rank step %u)", x->more, x->rank_step);
                fprintf(f, "\n");
            }
        }
    }
}

/* ---------------------------------------------------------------- summary */

static void minmeanmax(const uint64_t *v, uint32_t n, uint64_t *mn, double *mean, uint64_t *mx)
{
    uint64_t lo = UINT64_MAX, hi = 0;
    double s = 0;
    for (uint32_t i = 0; i < n; i++) {
        lo = v[i] < lo ? v[i] : lo;
        hi = v[i] > hi ? v[i] : hi;
        s += (double)v[i];
    }
    *mn = n ? lo : 0;
    *mx = hi;
    *mean = n ? s / n : 0;
}

/* The rollout's bytes per dtype (one copy of the model: every mapping's value tensor), and the
 * FP8 block scales apart. */
struct dtype_bytes {
    uint64_t bytes[WB_DTYPE_COUNT], count[WB_DTYPE_COUNT];
    uint64_t scale_bytes, scales;
};

static void rollout_dtypes(const struct wb_plan_input *in, struct dtype_bytes *d)
{
    memset(d, 0, sizeof(*d));
    for (size_t m = 0; m < in->match->n; m++) {
        const struct wb_mapping *mp = &in->match->map[m];
        const struct wb_param *v = &in->rollout->p[mp->rollout];
        if ((unsigned)v->dtype < WB_DTYPE_COUNT) {
            d->bytes[v->dtype] += wb_shape_numel(&v->shape) * wb_dtype_size(v->dtype);
            d->count[v->dtype]++;
        }
        if (mp->scale >= 0) {
            const struct wb_param *s = &in->rollout->p[mp->scale];
            d->scale_bytes += wb_shape_numel(&s->shape) * wb_dtype_size(s->dtype);
            d->scales++;
        }
    }
}

bool wb_plan_dtype_warning(const struct wb_plan_input *in, char *buf, size_t cap)
{
    struct dtype_bytes d;
    rollout_dtypes(in, &d);
    if (d.count[WB_DTYPE_FP8_E4M3] || !d.count[WB_DTYPE_BF16])
        return false;
    uint64_t total = 0;
    for (int t = 0; t < WB_DTYPE_COUNT; t++)
        total += d.bytes[t];
    char a[32];
    snprintf(buf, cap,
             "rollout weights are bf16, not FP8: each replica receives %s, about twice an FP8 "
             "rollout's bytes: the rollout's config.json has no quantization_config",
             wb_fmt_bytes(total, a, sizeof(a)));
    return true;
}

void wb_plan_print_summary(const struct wb_plan *p, const struct wb_plan_input *in, FILE *f)
{
    char a[32], b[32], c[32], d[32];
    const struct wb_plan_stats *s = &p->stats;
    uint64_t mn, mx;
    double mean;
    fprintf(f, "plan: mode %s, %u trainer GPUs -> %u rollout GPUs, memory cap %s\n",
            wb_plan_mode_name(p->mode), p->ntrainers, p->nrollouts,
            wb_fmt_bytes(p->mem_cap, a, sizeof(a)));
    uint64_t tbytes = 0; /* of the trainer tensors read, each once (stats.tensors) */
    uint8_t *seen = in ? calloc(in->trainer->n + 1, 1) : NULL;
    for (size_t m = 0; seen && m < in->match->n; m++)
        for (uint32_t k = 0; k < in->match->map[m].ncomp; k++) {
            uint32_t t = in->match->map[m].comp[k].trainer;
            const struct wb_param *tp = &in->trainer->p[t];
            tbytes += seen[t] ? 0 : wb_shape_numel(&tp->shape) * wb_dtype_size(tp->dtype);
            seen[t] = 1;
        }
    free(seen);
    fprintf(f,
            "  tensors: %" PRIu64 " trainer tensors (%s) in %" PRIu64 " mappings, %" PRIu64
            " items\n",
            s->tensors, wb_fmt_bytes(tbytes, a, sizeof(a)), s->mappings, s->items);
    if (in) {
        struct dtype_bytes d;
        rollout_dtypes(in, &d);
        fprintf(f, "  rollout dtype:");
        /* FP8 first, then the others in enum order */
        static const enum wb_dtype order[] = {WB_DTYPE_FP8_E4M3, WB_DTYPE_BF16, WB_DTYPE_FP16,
                                              WB_DTYPE_FP32,     WB_DTYPE_I32,  WB_DTYPE_I64};
        bool first = true;
        for (size_t i = 0; i < WB_ARRAY_LEN(order); i++) {
            enum wb_dtype t = order[i];
            if (!d.count[t])
                continue;
            fprintf(f, "%s %s %s in %" PRIu64 " tensor%s", first ? "" : ",", wb_dtype_name(t),
                    wb_fmt_bytes(d.bytes[t], a, sizeof(a)), d.count[t], d.count[t] == 1 ? "" : "s");
            if (t == WB_DTYPE_FP8_E4M3 && d.scales)
                fprintf(f, " (+ %s of block scales)", wb_fmt_bytes(d.scale_bytes, b, sizeof(b)));
            first = false;
        }
        fprintf(f, "%s\n", first ? " none" : "");
        char w[512];
        if (wb_plan_dtype_warning(in, w, sizeof(w)))
            fprintf(f, "  warning: %s\n", w);
    }
    fprintf(f, "  meshes: %u in %u mesh groups (phases):", p->nmeshes, p->nphases);
    for (uint32_t ph = 0; ph < p->nphases; ph++) {
        uint32_t n = 0, sz = 0;
        for (uint32_t i = 0; i < p->nmeshes; i++)
            if (p->meshes[i].phase == ph) {
                n++;
                sz = p->meshes[i].n > sz ? p->meshes[i].n : sz;
            }
        fprintf(f, "%s %u meshes of <= %u ranks", ph ? ";" : "", n, sz);
    }
    fprintf(f, "\n");
    fprintf(f,
            "  pieces (item x rollout GPU): %" PRIu64 " direct, %" PRIu64 " amax, %" PRIu64
            " gather\n",
            s->pieces[WB_MODE_DIRECT], s->pieces[WB_MODE_AMAX], s->pieces[WB_MODE_GATHER]);
    fprintf(f,
            "  entries: %" PRIu64 " tasks, %" PRIu64 " ops (%" PRIu64 " gathers, %" PRIu64
            " amax ops of %" PRIu64 " exchanges), %" PRIu64 " writes in %" PRIu64 " records\n",
            s->tasks, s->ops, s->gathers, s->amax_ops, s->amax_peers, s->writes, s->records);
    fprintf(f, "  bytes: %s written, %s gathered, %s host-to-device\n",
            wb_fmt_bytes(s->total_bytes, a, sizeof(a)), wb_fmt_bytes(s->gather_bytes, b, sizeof(b)),
            wb_fmt_bytes(s->h2d_bytes, c, sizeof(c)));
    minmeanmax(s->send_bytes, p->ntrainers, &mn, &mean, &mx);
    uint32_t idle = 0;
    for (uint32_t r = 0; r < p->ntrainers; r++)
        idle += s->send_bytes[r] == 0;
    fprintf(f, "  per sender: min %s, mean %s, max %s (%u of %u senders idle)\n",
            wb_fmt_bytes(mn, a, sizeof(a)), wb_fmt_bytes((uint64_t)mean, b, sizeof(b)),
            wb_fmt_bytes(mx, c, sizeof(c)), idle, p->ntrainers);
    minmeanmax(s->recv_bytes, p->nrollouts, &mn, &mean, &mx);
    fprintf(f, "  per receiver: min %s, mean %s, max %s\n", wb_fmt_bytes(mn, a, sizeof(a)),
            wb_fmt_bytes((uint64_t)mean, b, sizeof(b)), wb_fmt_bytes(mx, c, sizeof(c)));
    double lb = (double)s->lower_bound;
    fprintf(f,
            "  balance: busiest sender %s = %.4f x lower bound %s; reference greedy %s = %.4f x\n",
            wb_fmt_bytes(s->max_send, a, sizeof(a)), lb > 0 ? (double)s->max_send / lb : 1.0,
            wb_fmt_bytes(s->lower_bound, b, sizeof(b)), wb_fmt_bytes(s->greedy_max, d, sizeof(d)),
            lb > 0 ? (double)s->greedy_max / lb : 1.0);
    uint64_t tmax = 0;
    for (uint32_t r = 0; r < p->ntrainers; r++)
        tmax = pl_tables(p)[r].max_tmp_bytes > tmax ? pl_tables(p)[r].max_tmp_bytes : tmax;
    fprintf(f, "  largest task: %s of temporary memory%s\n", wb_fmt_bytes(tmax, a, sizeof(a)),
            tmax > p->mem_cap ? " (over the cap: a job refuses this plan)" : "");
}
