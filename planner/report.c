/* report.c — the plan as JSON (jansson) and as an SVG report (bar charts of bytes per trainer
 * and per rollout GPU, and the simulated timeline).
 *
 * JSON: the summary is one jansson object; with tables, each routing table and receive list
 * is built and written one at a time, so a 10-million-write plan never sits twice in memory. */
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "planner/plan_int.h"

static json_t *u64_array(const uint64_t *v, uint32_t n)
{
    json_t *a = json_array();
    for (uint32_t i = 0; a && i < n; i++)
        json_array_append_new(a, json_integer((json_int_t)v[i]));
    return a;
}

static json_t *box_json(const struct wb_box *b)
{
    json_t *a = json_array();
    for (uint32_t d = 0; a && d < b->ndim; d++)
        json_array_append_new(
            a, json_pack("[I,I]", (json_int_t)b->off[d], (json_int_t)(b->off[d] + b->ext[d])));
    return a;
}

static json_t *shape_json(const struct wb_shape *s)
{
    json_t *a = json_array();
    for (uint32_t d = 0; a && d < s->ndim; d++)
        json_array_append_new(a, json_integer((json_int_t)s->dim[d]));
    return a;
}

static json_t *view_json(const struct wb_route_table *t, const struct wb_rt_view *v)
{
    return json_pack("{s:s,s:I,s:I,s:s,s:o}", "buf", v->kind == WB_BUF_PARAM ? "param" : "tmp",
                     "tensor", (json_int_t)v->tensor, "off", (json_int_t)v->off, "dtype",
                     wb_dtype_name(v->dtype), "shape", shape_json(&t->shapes[v->shape]));
}

static json_t *op_json(const struct wb_route_table *t, const struct wb_rt_op *o)
{
    const struct wb_box *B = t->boxes;
    switch (o->kind) {
    case WB_OP_H2D:
        return json_pack("{s:s,s:I,s:I,s:I,s:I}", "op", "h2d", "tensor", (json_int_t)o->tensor,
                         "src_off", (json_int_t)o->h2d.src_off, "bytes", (json_int_t)o->h2d.bytes,
                         "dst_off", (json_int_t)o->h2d.dst_off);
    case WB_OP_GATHER: {
        json_t *peers = json_array();
        for (uint32_t i = 0; peers && i < o->gather.npeers; i++) {
            const struct wb_rt_peer *pe = &t->peers[o->gather.peer0 + i];
            json_array_append_new(peers, json_pack("{s:I,s:o}", "rank", (json_int_t)pe->rank, "box",
                                                   box_json(&B[pe->box])));
        }
        return json_pack("{s:s,s:I,s:o,s:o,s:o,s:I,s:I,s:I}", "op", "gather", "tensor",
                         (json_int_t)o->tensor, "src", view_json(t, &o->gather.src), "dst",
                         view_json(t, &o->gather.dst), "peers", peers, "mesh",
                         (json_int_t)o->gather.mesh, "seq", (json_int_t)o->gather.seq, "bytes_in",
                         (json_int_t)o->gather.bytes_in);
    }
    case WB_OP_AMAX:
        return json_pack(
            "{s:s,s:I,s:I,s:I,s:o,s:o,s:o,s:o,s:I,s:I,s:I,s:o}", "op", "amax", "tensor",
            (json_int_t)o->tensor, "peer", (json_int_t)o->amax.peer, "tag", (json_int_t)o->amax.tag,
            "src", view_json(t, &o->amax.src), "src_box", box_json(&B[o->amax.src_box]), "region",
            box_json(&B[o->amax.region]), "blocks", box_json(&B[o->amax.blocks]), "peer_inbox_off",
            (json_int_t)o->amax.peer_inbox_off, "inbox_off", (json_int_t)o->amax.inbox_off,
            "amax_off",
            (json_int_t)(o->amax.amax_off == (uint64_t)WB_RT_NONE ? -1
                                                                  : (json_int_t)o->amax.amax_off),
            "grid", box_json(&B[o->amax.grid]));
    case WB_OP_COPY:
    case WB_OP_CAST:
        return json_pack("{s:s,s:I,s:o,s:o,s:o,s:o}", "op", o->kind == WB_OP_COPY ? "copy" : "cast",
                         "tensor", (json_int_t)o->tensor, "src", view_json(t, &o->copy.src),
                         "src_box", box_json(&B[o->copy.src_box]), "dst",
                         view_json(t, &o->copy.dst), "dst_box", box_json(&B[o->copy.dst_box]));
    case WB_OP_QUANT:
        return json_pack(
            "{s:s,s:I,s:o,s:o,s:o,s:o,s:o,s:I,s:I}", "op", "quant", "tensor", (json_int_t)o->tensor,
            "src", view_json(t, &o->quant.src), "src_box", box_json(&B[o->quant.src_box]), "dst",
            view_json(t, &o->quant.dst), "region", box_json(&B[o->quant.region]), "grid",
            box_json(&B[o->quant.grid]), "scale_off", (json_int_t)o->quant.scale_off, "amax_off",
            (json_int_t)(o->quant.amax_off == (uint64_t)WB_RT_NONE
                             ? -1
                             : (json_int_t)o->quant.amax_off));
    }
    return json_null();
}

static json_t *table_json(const struct wb_route_table *t, const struct wb_plan_input *in)
{
    json_t *tasks = json_array(), *phases = json_array(), *amax = json_array();
    for (uint32_t i = 0; i < t->nphases; i++)
        json_array_append_new(phases,
                              json_pack("{s:I,s:I,s:b}", "task0", (json_int_t)t->phases[i].task0,
                                        "ntasks", (json_int_t)t->phases[i].ntasks, "barrier_after",
                                        t->phases[i].barrier_after));
    for (uint32_t k = 0; k < t->ntasks; k++) {
        const struct wb_rt_task *T = &t->tasks[k];
        json_t *ops = json_array(), *writes = json_array();
        for (uint32_t o = T->op0; o < T->op0 + T->nops; o++)
            json_array_append_new(ops, op_json(t, &t->ops[o]));
        for (uint32_t w = T->write0; w < T->write0 + T->nwrites; w++) {
            const struct wb_rt_write *x = &t->writes[w];
            json_array_append_new(writes,
                                  json_pack("[I,I,I,I,I,I,I]",
                                            (json_int_t)(x->src_tensor == (uint32_t)WB_RT_TMP_SRC
                                                             ? -1
                                                             : (json_int_t)x->src_tensor),
                                            (json_int_t)x->src_off, (json_int_t)x->dst_rank,
                                            (json_int_t)x->dst_tensor, (json_int_t)x->dst_off,
                                            (json_int_t)x->len, (json_int_t)x->tag));
        }
        const char *rn = in && T->mapping < in->match->n
                             ? in->rollout->p[in->match->map[T->mapping].rollout].name
                             : "?";
        json_array_append_new(
            tasks,
            json_pack("{s:I,s:s,s:I,s:I,s:s,s:I,s:I,s:o,s:o}", "mapping", (json_int_t)T->mapping,
                      "rollout", rn, "phase", (json_int_t)T->phase, "mesh", (json_int_t)T->mesh,
                      "mode", wb_plan_mode_name(T->mode), "tmp_bytes", (json_int_t)T->tmp_bytes,
                      "write_bytes", (json_int_t)T->write_bytes, "ops", ops, "writes", writes));
    }
    for (uint32_t i = 0; i < t->namax; i++)
        json_array_append_new(amax, json_pack("{s:I,s:I}", "tag", (json_int_t)t->amax[i].tag,
                                              "bytes", (json_int_t)t->amax[i].bytes));
    return json_pack("{s:I,s:I,s:s,s:I,s:I,s:I,s:o,s:o,s:o,s:s}", "rank", (json_int_t)t->rank,
                     "tag_bits", (json_int_t)t->tag_bits, "residence",
                     t->residence == WB_RESIDE_HOST ? "host" : "gpu", "send_bytes",
                     (json_int_t)t->send_bytes, "max_tmp_bytes", (json_int_t)t->max_tmp_bytes,
                     "amax_inbox_bytes", (json_int_t)t->amax_inbox_bytes, "phases", phases, "tasks",
                     tasks, "amax", amax, "writes_are",
                     "[src_tensor (-1: tmp), src_off, dst_rank, dst_tensor, dst_off, len, tag]");
}

static json_t *recv_json(const struct wb_recv_list *r, const struct wb_plan_input *in)
{
    json_t *local = json_array(), *expect = json_array();
    for (uint32_t i = 0; i < r->nlocal; i++)
        json_array_append_new(local, json_pack("{s:s,s:I,s:s,s:o,s:I}", "name",
                                               in ? in->rollout->p[r->local[i].tensor].name : "?",
                                               "tensor", (json_int_t)r->local[i].tensor, "dtype",
                                               wb_dtype_name(r->local[i].dtype), "shape",
                                               shape_json(&r->local[i].shape), "bytes",
                                               (json_int_t)r->local[i].bytes));
    for (uint32_t i = 0; i < r->nexpect; i++)
        json_array_append_new(expect,
                              json_pack("{s:I,s:I,s:I,s:I}", "tag", (json_int_t)r->expect[i].tag,
                                        "tensor", (json_int_t)r->expect[i].tensor, "bytes",
                                        (json_int_t)r->expect[i].bytes, "writes",
                                        (json_int_t)r->expect[i].writes));
    return json_pack("{s:I,s:I,s:I,s:I,s:I,s:I,s:o,s:o}", "rank", (json_int_t)r->rank, "replica",
                     (json_int_t)r->replica, "tp_rank", (json_int_t)r->tp_rank, "ep_rank",
                     (json_int_t)r->ep_rank, "recv_bytes", (json_int_t)r->recv_bytes, "recv_writes",
                     (json_int_t)r->recv_writes, "local", local, "expect", expect);
}

int wb_plan_write_json(const struct wb_plan *p, const struct wb_plan_input *in, bool tables,
                       FILE *f)
{
    const struct wb_plan_stats *s = &p->stats;
    json_t *meshes = json_array();
    for (uint32_t i = 0; i < p->nmeshes; i++) {
        json_t *ranks = json_array();
        for (uint32_t k = 0; k < p->meshes[i].n; k++)
            json_array_append_new(ranks, json_integer(p->meshes[i].ranks[k]));
        json_array_append_new(meshes, json_pack("{s:I,s:o}", "phase",
                                                (json_int_t)p->meshes[i].phase, "ranks", ranks));
    }
    json_t *stats = json_pack(
        "{s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:{s:I,s:I,s:I},s:I,s:I,s:I,s:I,s:I,s:I}", "tensors",
        (json_int_t)s->tensors, "mappings", (json_int_t)s->mappings, "items", (json_int_t)s->items,
        "tasks", (json_int_t)s->tasks, "ops", (json_int_t)s->ops, "writes", (json_int_t)s->writes,
        "gathers", (json_int_t)s->gathers, "amax_ops", (json_int_t)s->amax_ops, "pieces", "direct",
        (json_int_t)s->pieces[WB_MODE_DIRECT], "amax", (json_int_t)s->pieces[WB_MODE_AMAX],
        "gather", (json_int_t)s->pieces[WB_MODE_GATHER], "total_bytes", (json_int_t)s->total_bytes,
        "gather_bytes", (json_int_t)s->gather_bytes, "h2d_bytes", (json_int_t)s->h2d_bytes,
        "lower_bound", (json_int_t)s->lower_bound, "greedy_max", (json_int_t)s->greedy_max,
        "max_send", (json_int_t)s->max_send);
    json_t *root =
        json_pack("{s:I,s:s,s:I,s:I,s:I,s:I,s:o,s:o,s:o,s:o,s:o}", "format",
                  (json_int_t)WB_PLAN_FORMAT, "mode", wb_plan_mode_name(p->mode), "mem_cap",
                  (json_int_t)p->mem_cap, "ntrainers", (json_int_t)p->ntrainers, "nrollouts",
                  (json_int_t)p->nrollouts, "nphases", (json_int_t)p->nphases, "stats", stats,
                  "send_bytes", u64_array(s->send_bytes, p->ntrainers), "recv_bytes",
                  u64_array(s->recv_bytes, p->nrollouts), "gather_in_bytes",
                  u64_array(s->gather_in_bytes, p->ntrainers), "meshes", meshes);
    if (!root)
        return -ENOMEM;
    char *text = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    if (!text)
        return -ENOMEM;
    size_t n = strlen(text);
    int rc = 0;
    if (!tables) {
        if (fprintf(f, "%s\n", text) < 0)
            rc = -EIO;
        free(text);
        return rc;
    }
    /* the summary without its closing brace, then the tables one at a time */
    if (fwrite(text, 1, n - 1, f) != n - 1 || fputs(",\"tables\":[", f) < 0)
        rc = -EIO;
    free(text);
    for (uint32_t r = 0; r < p->ntrainers && !rc; r++) {
        json_t *t = table_json(&p->tables[r], in);
        if (!t || (r && fputc(',', f) == EOF) || json_dumpf(t, f, JSON_COMPACT))
            rc = t ? -EIO : -ENOMEM;
        json_decref(t);
    }
    if (!rc && fputs("],\"receive\":[", f) < 0)
        rc = -EIO;
    for (uint32_t g = 0; g < p->nrollouts && !rc; g++) {
        json_t *t = recv_json(&p->recv[g], in);
        if (!t || (g && fputc(',', f) == EOF) || json_dumpf(t, f, JSON_COMPACT))
            rc = t ? -EIO : -ENOMEM;
        json_decref(t);
    }
    if (!rc && fputs("]}\n", f) < 0)
        rc = -EIO;
    return rc;
}

/* ---------------------------------------------------------------- SVG */

static void svg_bars(FILE *f, double x0, double y0, double w, double h, const uint64_t *v,
                     uint32_t n, uint64_t line, const char *title, const char *color)
{
    uint64_t mx = line;
    for (uint32_t i = 0; i < n; i++)
        mx = v[i] > mx ? v[i] : mx;
    if (mx == 0)
        mx = 1;
    char a[32], b[32];
    fprintf(f, "<text x='%.0f' y='%.0f' font-size='14'>%s (max %s)</text>\n", x0, y0 - 6, title,
            wb_fmt_bytes(mx, a, sizeof(a)));
    fprintf(f, "<rect x='%.0f' y='%.0f' width='%.0f' height='%.0f' fill='none' stroke='#999'/>\n",
            x0, y0, w, h);
    double bw = n ? w / n : w;
    for (uint32_t i = 0; i < n; i++) {
        double bh = h * (double)v[i] / (double)mx;
        fprintf(f, "<rect x='%.2f' y='%.2f' width='%.2f' height='%.2f' fill='%s'/>\n", x0 + i * bw,
                y0 + h - bh, bw > 1.5 ? bw - 0.5 : bw, bh, color);
    }
    if (line) {
        double ly = y0 + h - h * (double)line / (double)mx;
        fprintf(f,
                "<line x1='%.0f' y1='%.2f' x2='%.0f' y2='%.2f' stroke='red' "
                "stroke-dasharray='4'/><text x='%.0f' y='%.2f' font-size='11' "
                "fill='red'>lower bound %s</text>\n",
                x0, ly, x0 + w, ly, x0 + w - 160, ly - 3, wb_fmt_bytes(line, b, sizeof(b)));
    }
}

static void svg_series(FILE *f, double x0, double y0, double w, double h, const double *v,
                       uint32_t n, double vmax, const char *color)
{
    if (!n)
        return;
    fprintf(f, "<polyline fill='none' stroke='%s' stroke-width='1' points='", color);
    uint32_t stride = n > 2000 ? n / 2000 : 1;
    for (uint32_t i = 0; i < n; i += stride) {
        double s = 0;
        uint32_t k = 0;
        for (; k < stride && i + k < n; k++)
            s += v[i + k];
        fprintf(f, "%.1f,%.1f ", x0 + w * i / n, y0 + h - h * (s / k) / vmax);
    }
    fprintf(f, "'/>\n");
}

int wb_plan_write_svg(const struct wb_plan *p, const struct wb_estimate *e, FILE *f)
{
    const double W = 1000, H = 220, M = 40;
    double height = M + 2 * (H + M) + (e ? H + M : 0);
    fprintf(f,
            "<svg xmlns='http://www.w3.org/2000/svg' width='%.0f' height='%.0f' "
            "font-family='sans-serif'>\n<rect width='100%%' height='100%%' fill='white'/>\n",
            W + 2 * M, height);
    char title[160];
    snprintf(title, sizeof(title), "bytes sent per trainer GPU (%u GPUs, mode %s)", p->ntrainers,
             wb_plan_mode_name(p->mode));
    svg_bars(f, M, M, W, H, p->stats.send_bytes, p->ntrainers, p->stats.lower_bound, title,
             "#4477aa");
    snprintf(title, sizeof(title), "bytes received per rollout GPU (%u GPUs)", p->nrollouts);
    svg_bars(f, M, M + H + M, W, H, p->stats.recv_bytes, p->nrollouts, 0, title, "#228833");
    if (e) {
        double y0 = M + 2 * (H + M), vmax = 1;
        for (uint32_t i = 0; i < e->nsamples; i++) {
            vmax = e->egress_Bps[i] > vmax ? e->egress_Bps[i] : vmax;
            vmax = e->ingress_Bps[i] > vmax ? e->ingress_Bps[i] : vmax;
            vmax = e->gather_Bps[i] > vmax ? e->gather_Bps[i] : vmax;
        }
        fprintf(f,
                "<text x='%.0f' y='%.0f' font-size='14'>simulated timeline: %.3f s (lower bound "
                "%.3f s); aggregate throughput, max %.1f TB/s: <tspan fill='#4477aa'>trainer "
                "egress to rollouts</tspan>, <tspan fill='#228833'>rollout ingress</tspan>, "
                "<tspan fill='#cc6677'>gathers between trainers</tspan></text>\n",
                M, y0 - 6, e->total_s, e->lower_bound_s, vmax / 1e12);
        fprintf(f,
                "<rect x='%.0f' y='%.0f' width='%.0f' height='%.0f' fill='none' "
                "stroke='#999'/>\n",
                M, y0, W, H);
        for (uint32_t q = 0; q < e->nphases; q++) {
            if (e->total_s <= 0 || isinf(e->phase[q].start_s))
                continue;
            double x = M + W * e->phase[q].start_s / e->total_s;
            fprintf(f,
                    "<line x1='%.1f' y1='%.0f' x2='%.1f' y2='%.0f' stroke='#888' "
                    "stroke-dasharray='2'/><text x='%.1f' y='%.0f' font-size='11'>phase "
                    "%u</text>\n",
                    x, y0, x, y0 + H, x + 3, y0 + 12 + 12 * q, q);
        }
        svg_series(f, M, y0, W, H, e->egress_Bps, e->nsamples, vmax, "#4477aa");
        svg_series(f, M, y0, W, H, e->ingress_Bps, e->nsamples, vmax, "#228833");
        svg_series(f, M, y0, W, H, e->gather_Bps, e->nsamples, vmax, "#cc6677");
    }
    return fprintf(f, "</svg>\n") < 0 ? -EIO : 0;
}
