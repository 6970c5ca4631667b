/* The inline SVG plots of the HTML report (report_plot.h). */
#include "report_plot.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static const char *const rh_colors[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                                        "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};
#define RH_NCOLORS (sizeof rh_colors / sizeof rh_colors[0])

void rh_esc(FILE *f, const char *s)
{
    if (!s)
        return;
    for (; *s; s++) {
        switch (*s) {
        case '&':
            fputs("&amp;", f);
            break;
        case '<':
            fputs("&lt;", f);
            break;
        case '>':
            fputs("&gt;", f);
            break;
        case '"':
            fputs("&quot;", f);
            break;
        case '\'':
            fputs("&#39;", f);
            break;
        default:
            fputc(*s, f);
        }
    }
}

const char *rh_color(int i)
{
    return rh_colors[(size_t)(i < 0 ? 0 : i) % RH_NCOLORS];
}

/* ---- coordinates ---- */

/* The data length the axis shows: the range less its breaks. */
static double rh_kept(const rh_chart *c)
{
    double l = c->x1 - c->x0;
    for (int i = 0; i < c->n_brk; i++)
        l -= c->brk[i].b - c->brk[i].a;
    return l > 0 ? l : 1;
}

/* Plot units for the data (the plot's width less its breaks). */
static double rh_data_w(const rh_chart *c)
{
    return c->w - RH_ML - RH_MR - c->n_brk * RH_BREAK_W;
}

double rh_px(const rh_chart *c, double x)
{
    double pw = rh_data_w(c), l = rh_kept(c), px = RH_ML, prev = c->x0;
    for (int i = 0; i < c->n_brk; i++) {
        const rh_break *b = &c->brk[i];
        if (x <= b->a)
            return px + (x - prev) / l * pw;
        px += (b->a - prev) / l * pw;
        if (x < b->b)
            return px + (x - b->a) / (b->b - b->a) * RH_BREAK_W;
        px += RH_BREAK_W;
        prev = b->b;
    }
    return px + (x - prev) / l * pw;
}

double rh_py(const rh_chart *c, double y)
{
    return c->h - RH_MB - (y - c->y0) / (c->y1 - c->y0) * (c->h - RH_MT - RH_MB);
}

double rh_tick(double lo, double hi, int n)
{
    double raw = (hi - lo) / n;
    if (!(raw > 0) || !isfinite(raw))
        return 1;
    double p = pow(10, floor(log10(raw)));
    double m = raw / p;
    return (m < 1.5 ? 1 : m < 3.5 ? 2 : m < 7.5 ? 5 : 10) * p;
}

void rh_range_fix(double *lo, double *hi, bool from_zero)
{
    if (!isfinite(*lo) || !isfinite(*hi)) {
        *lo = 0;
        *hi = 1;
    }
    if (from_zero && *lo > 0)
        *lo = 0;
    if (*hi - *lo <= 0) {
        double d = fabs(*hi) > 0 ? fabs(*hi) * 0.1 : 1;
        *lo -= d;
        *hi += d;
    } else {
        double pad = (*hi - *lo) * 0.05;
        if (!(from_zero && *lo == 0))
            *lo -= pad;
        *hi += pad;
    }
}

static int rh_cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static int rh_cmp_brk(const void *a, const void *b)
{
    return rh_cmp_d(&((const rh_break *)a)->a, &((const rh_break *)b)->a);
}

void rh_time_breaks(rh_chart *c, double *t, size_t n)
{
    c->n_brk = 0;
    double span = c->x1 - c->x0;
    if (n < 2 || !(span > 0))
        return;
    qsort(t, n, sizeof *t, rh_cmp_d);
    rh_break cand[RH_MAX_BREAKS];
    int nc = 0;
    for (size_t i = 0; i + 1 < n; i++) {
        double d = t[i + 1] - t[i];
        if (!(d > 0.25 * span))
            continue;
        /* keep the longest RH_MAX_BREAKS */
        int at = nc < RH_MAX_BREAKS ? nc++ : -1;
        if (at < 0) {
            at = 0;
            for (int k = 1; k < nc; k++)
                if (cand[k].b - cand[k].a < cand[at].b - cand[at].a)
                    at = k;
            if (cand[at].b - cand[at].a >= d)
                continue;
        }
        cand[at] = (rh_break){t[i], t[i + 1]};
    }
    if (!nc)
        return;
    double gaps = 0;
    for (int k = 0; k < nc; k++)
        gaps += cand[k].b - cand[k].a;
    double kept = span - gaps;
    for (int k = 0; k < nc; k++) {
        double d = cand[k].b - cand[k].a;
        double m = fmin(0.03 * kept, 0.25 * d);
        cand[k].a += m;
        cand[k].b -= m;
    }
    qsort(cand, (size_t)nc, sizeof *cand, rh_cmp_brk);
    memcpy(c->brk, cand, (size_t)nc * sizeof *cand);
    c->n_brk = nc;
}

/* ---- drawing ---- */

void rh_svg_open(FILE *f, const rh_chart *c, const char *cls, size_t points, const char *title)
{
    fprintf(f,
            "<svg class=\"plot %s\" data-points=\"%zu\" data-breaks=\"%d\" viewBox=\"0 0 %d %d\" "
            "xmlns=\"http://www.w3.org/2000/svg\" role=\"img\">",
            cls, points, c->n_brk, c->w, c->h);
    fputs("<title>", f);
    rh_esc(f, title);
    fputs("</title>", f);
}

/* The x ticks of [lo, hi], a stretch of the axis about `share` of it. */
static void rh_xticks(FILE *f, const rh_chart *c, double lo, double hi, double share)
{
    int ph = c->h - RH_MT - RH_MB;
    int n = (int)lround(8 * share);
    double dx = rh_tick(lo, hi, n < 1 ? 1 : n);
    int drawn = 0;
    for (double x = ceil(lo / dx) * dx; x <= hi + dx * 1e-9 && drawn < 40; x += dx, drawn++) {
        double px = rh_px(c, x);
        fprintf(f,
                "<line class=\"grid\" x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\"/>"
                "<text class=\"tick\" x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">%.6g</text>",
                px, RH_MT, px, RH_MT + ph, px, RH_MT + ph + 16, fabs(x) < dx * 1e-9 ? 0 : x);
    }
}

static void rh_break_mark(FILE *f, const rh_chart *c, const rh_break *b)
{
    int ph = c->h - RH_MT - RH_MB;
    double x = rh_px(c, b->a), len = b->b - b->a;
    char txt[32];
    if (len >= 1)
        snprintf(txt, sizeof txt, "%.3g s", len);
    else
        snprintf(txt, sizeof txt, "%.3g ms", len * 1e3);
    fprintf(f,
            "<g class=\"break\"><rect x=\"%.1f\" y=\"%d\" width=\"%d\" height=\"%d\"><title>%s "
            "without records: the time axis is broken here</title></rect>"
            "<path d=\"M%.1f %d l6 -12 M%.1f %d l6 -12\"/>"
            "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">%s</text></g>",
            x, RH_MT, RH_BREAK_W, ph, txt, x + RH_BREAK_W / 2.0 - 6, RH_MT + ph + 6,
            x + RH_BREAK_W / 2.0, RH_MT + ph + 6, x + RH_BREAK_W / 2.0, RH_MT - 6, txt);
}

void rh_axes(FILE *f, const rh_chart *c, const char *xlabel, const char *ylabel, bool y_ticks)
{
    int pw = c->w - RH_ML - RH_MR, ph = c->h - RH_MT - RH_MB;
    fprintf(f, "<rect class=\"frame\" x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\"/>", RH_ML, RH_MT,
            pw, ph);
    double lo = c->x0, dw = rh_data_w(c), kept = rh_kept(c);
    for (int i = 0; i <= c->n_brk; i++) {
        double hi = i < c->n_brk ? c->brk[i].a : c->x1;
        rh_xticks(f, c, lo, hi, (hi - lo) / kept * dw / (RH_W - RH_ML - RH_MR));
        if (i < c->n_brk) {
            rh_break_mark(f, c, &c->brk[i]);
            lo = c->brk[i].b;
        }
    }
    if (y_ticks) {
        double dy = rh_tick(c->y0, c->y1, 5);
        for (double y = ceil(c->y0 / dy) * dy; y <= c->y1 + dy * 1e-9; y += dy) {
            double py = rh_py(c, y);
            fprintf(f,
                    "<line class=\"grid\" x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\"/>"
                    "<text class=\"tick\" x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%.6g</text>",
                    RH_ML, py, RH_ML + pw, py, RH_ML - 6, py + 4, fabs(y) < dy * 1e-9 ? 0 : y);
        }
    }
    fprintf(f, "<text class=\"label\" x=\"%d\" y=\"%d\" text-anchor=\"middle\">", RH_ML + pw / 2,
            c->h - 6);
    rh_esc(f, xlabel);
    fprintf(f,
            "</text><text class=\"label\" x=\"16\" y=\"%d\" text-anchor=\"middle\" "
            "transform=\"rotate(-90 16 %d)\">",
            RH_MT + ph / 2, RH_MT + ph / 2);
    rh_esc(f, ylabel);
    fputs("</text>", f);
}

size_t rh_series_points(const rh_series *s)
{
    size_t k = 0;
    for (size_t i = 0; i < s->n; i++)
        k += isfinite(s->y[i]) && isfinite(s->x[i]);
    return k;
}

/* Whether a break of the axis lies between xa and xb. */
static bool rh_across(const rh_chart *c, double xa, double xb)
{
    for (int i = 0; i < c->n_brk; i++)
        if ((xa <= c->brk[i].a && xb >= c->brk[i].b) || (xb <= c->brk[i].a && xa >= c->brk[i].b))
            return true;
    return false;
}

void rh_polylines(FILE *f, const rh_chart *c, const rh_series *s)
{
    size_t stride = s->n > RH_MAX_POINTS ? (s->n + RH_MAX_POINTS - 1) / RH_MAX_POINTS : 1;
    bool open = false;
    double last_x = NAN;
    for (size_t i = 0; i < s->n; i += stride) {
        bool ok = isfinite(s->y[i]) && isfinite(s->x[i]);
        if (open && (!ok || rh_across(c, last_x, s->x[i]))) {
            fputs("\"/>", f);
            open = false;
        }
        if (!ok)
            continue;
        if (!open) {
            fprintf(f, "<polyline class=\"series\" stroke=\"%s\"%s%s%s points=\"", s->color,
                    s->dash ? " stroke-dasharray=\"" : "", s->dash ? s->dash : "",
                    s->dash ? "\"" : "");
            open = true;
        } else {
            fputc(' ', f);
        }
        fprintf(f, "%.1f,%.1f", rh_px(c, s->x[i]), rh_py(c, s->y[i]));
        last_x = s->x[i];
    }
    if (open)
        fputs("\"/>", f);
}

void rh_legend(FILE *f, const rh_series *s, size_t n, const char *extra_name,
               const char *extra_color)
{
    fputs("<div class=\"legend\">", f);
    for (size_t i = 0; i < n; i++) {
        fprintf(f, "<span><i style=\"background:%s\"></i>", s[i].color);
        rh_esc(f, s[i].name);
        fputs("</span>", f);
    }
    if (extra_name) {
        fprintf(f, "<span><i style=\"background:%s\"></i>", extra_color);
        rh_esc(f, extra_name);
        fputs("</span>", f);
    }
    fputs("</div>", f);
}

/* The x and y ranges of the series (and hline); the points counted. */
static size_t rh_ranges(rh_chart *c, const rh_series *s, size_t n, double hline, bool from_zero)
{
    size_t pts = 0;
    for (size_t k = 0; k < n; k++) {
        pts += rh_series_points(&s[k]);
        for (size_t i = 0; i < s[k].n; i++) {
            if (!isfinite(s[k].y[i]) || !isfinite(s[k].x[i]))
                continue;
            c->x0 = fmin(c->x0, s[k].x[i]);
            c->x1 = fmax(c->x1, s[k].x[i]);
            c->y0 = fmin(c->y0, s[k].y[i]);
            c->y1 = fmax(c->y1, s[k].y[i]);
        }
    }
    if (isfinite(hline)) {
        c->y0 = fmin(c->y0, hline);
        c->y1 = fmax(c->y1, hline);
    }
    if (c->x0 > c->x1) {
        c->x0 = 0;
        c->x1 = 1;
    } else if (c->x1 == c->x0) {
        c->x1 = c->x0 + 1;
    }
    rh_range_fix(&c->y0, &c->y1, from_zero);
    return pts;
}

void rh_line_chart(FILE *f, const char *cls, const char *title, const char *note,
                   const char *xlabel, const char *ylabel, const rh_series *s, size_t n,
                   double hline, const char *hline_name, bool from_zero, bool breaks)
{
    rh_chart c = {
        .x0 = INFINITY, .x1 = -INFINITY, .y0 = INFINITY, .y1 = -INFINITY, .w = RH_W, .h = RH_H};
    size_t pts = rh_ranges(&c, s, n, hline, from_zero);
    if (breaks && pts > 1) {
        double *t = malloc(pts * sizeof *t);
        size_t k = 0;
        for (size_t j = 0; t && j < n; j++)
            for (size_t i = 0; i < s[j].n; i++)
                if (isfinite(s[j].y[i]) && isfinite(s[j].x[i]))
                    t[k++] = s[j].x[i];
        if (t)
            rh_time_breaks(&c, t, k);
        free(t);
    }
    fprintf(f, "<figure><figcaption>");
    rh_esc(f, title);
    fputs("</figcaption>", f);
    if (note)
        fprintf(f, "<p class=\"note\">%s</p>", note);
    rh_svg_open(f, &c, cls, pts, title);
    rh_axes(f, &c, xlabel, ylabel, true);
    for (size_t k = 0; k < n; k++)
        rh_polylines(f, &c, &s[k]);
    if (isfinite(hline))
        fprintf(f, "<line class=\"ref\" x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\"/>", RH_ML,
                rh_py(&c, hline), c.w - RH_MR, rh_py(&c, hline));
    if (pts == 0)
        fprintf(f,
                "<text class=\"empty\" x=\"%d\" y=\"%d\" text-anchor=\"middle\">no data "
                "stored</text>",
                c.w / 2, c.h / 2);
    fputs("</svg>", f);
    rh_legend(f, s, n, isfinite(hline) ? hline_name : NULL, "#444");
    fputs("</figure>\n", f);
}
