/* report.c — the plan as an SVG report (bar charts of bytes per trainer and per rollout GPU,
 * and the simulated timeline). The JSON form is json.c's. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "planner/plan_int.h"

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
