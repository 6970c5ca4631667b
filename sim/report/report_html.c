/* dsim report: runs of the results store as one self-contained HTML page.
 *
 * Everything is in the file: the style sheet inline, the plots inline SVG
 * drawn here, no script, no font, no network. Every piece of text that
 * comes from the store (scenario names, messages, event details, the
 * scenario file) is escaped. Each plot's <svg> carries data-points="N", the
 * number of data points it draws, so a test (or a person) can tell an empty
 * plot from a drawn one.
 *
 * A page for one run:
 *
 *   run N: scenario — status, seed, engine, strategy, time, version
 *   checks (name, result, measured, expected, message)
 *   first divergent step (replicas' checksums there), when there is one
 *   faults and recovery: a lane per replica with its attempts and events,
 *     and the events as a table
 *   loss per replica over steps (+ the reduced loss, + the reference's
 *     final loss as a line: the store keeps the reference's final loss only)
 *   examples/s over time
 *   step time per replica (every step a dot, box = middle half, tick =
 *     median; a replica whose median is over 1.5x the others' stands out)
 *   all-reduce share of step time per replica (when collectives were
 *     stored); the replica that waits least is a straggler
 *   cold-start phases per replica and attempt (when phases were stored)
 *   the scenario file
 *
 * Several runs: a table comparing them, their reduced losses on one plot,
 * then each run's page side by side. */
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "report.h"
#include "report_int.h"
#include "diag/flight.h"

#define RH_W              640
#define RH_H              260
#define RH_ML             64 /* margins: left, right, top, bottom */
#define RH_MR             16
#define RH_MT             28
#define RH_MB             40
#define RH_MAX_POINTS     2000 /* per polyline; more are thinned evenly */
#define RH_RATE_BUCKETS   48
#define RH_STRAGGLER      1.5  /* a replica's median step time over this times the others' */
#define RH_COMM_FLAG      0.20 /* all-reduce share ARCHITECTURE.md §8 flags */
#define RH_MAX_EVENT_ROWS 200
/* a replica whose collective share is under this times the others' */
#define RH_WAIT_STRAGGLER 0.5
/* step-time differences under this are scheduling noise on a shared host */
#define RH_NOISE_MS 0.1

static const char *const rh_colors[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                                        "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};
#define RH_NCOLORS (sizeof rh_colors / sizeof rh_colors[0])

static void rh_esc(FILE *f, const char *s)
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

static const char *rh_color(int i)
{
    return rh_colors[(size_t)(i < 0 ? 0 : i) % RH_NCOLORS];
}

/* ---- plots ---- */

typedef struct rh_chart {
    double x0, x1, y0, y1; /* data range */
    int w, h;
} rh_chart;

static double rh_px(const rh_chart *c, double x)
{
    return RH_ML + (x - c->x0) / (c->x1 - c->x0) * (c->w - RH_ML - RH_MR);
}

static double rh_py(const rh_chart *c, double y)
{
    return c->h - RH_MB - (y - c->y0) / (c->y1 - c->y0) * (c->h - RH_MT - RH_MB);
}

/* A tick spacing of 1, 2 or 5 times a power of ten giving about n ticks. */
static double rh_tick(double lo, double hi, int n)
{
    double raw = (hi - lo) / n;
    if (!(raw > 0) || !isfinite(raw))
        return 1;
    double p = pow(10, floor(log10(raw)));
    double m = raw / p;
    return (m < 1.5 ? 1 : m < 3.5 ? 2 : m < 7.5 ? 5 : 10) * p;
}

static void rh_range_fix(double *lo, double *hi, bool from_zero)
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

static void rh_svg_open(FILE *f, const rh_chart *c, const char *cls, size_t points,
                        const char *title)
{
    fprintf(f,
            "<svg class=\"plot %s\" data-points=\"%zu\" viewBox=\"0 0 %d %d\" "
            "xmlns=\"http://www.w3.org/2000/svg\" role=\"img\">",
            cls, points, c->w, c->h);
    fputs("<title>", f);
    rh_esc(f, title);
    fputs("</title>", f);
}

static void rh_axes(FILE *f, const rh_chart *c, const char *xlabel, const char *ylabel,
                    bool y_ticks)
{
    int pw = c->w - RH_ML - RH_MR, ph = c->h - RH_MT - RH_MB;
    fprintf(f, "<rect class=\"frame\" x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\"/>", RH_ML, RH_MT,
            pw, ph);
    double dx = rh_tick(c->x0, c->x1, 6);
    for (double x = ceil(c->x0 / dx) * dx; x <= c->x1 + dx * 1e-9; x += dx) {
        double px = rh_px(c, x);
        fprintf(f,
                "<line class=\"grid\" x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\"/>"
                "<text class=\"tick\" x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">%.6g</text>",
                px, RH_MT, px, RH_MT + ph, px, RH_MT + ph + 14, fabs(x) < dx * 1e-9 ? 0 : x);
    }
    if (y_ticks) {
        double dy = rh_tick(c->y0, c->y1, 5);
        for (double y = ceil(c->y0 / dy) * dy; y <= c->y1 + dy * 1e-9; y += dy) {
            double py = rh_py(c, y);
            fprintf(f,
                    "<line class=\"grid\" x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\"/>"
                    "<text class=\"tick\" x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%.6g</text>",
                    RH_ML, py, RH_ML + pw, py, RH_ML - 4, py + 4, fabs(y) < dy * 1e-9 ? 0 : y);
        }
    }
    fprintf(f, "<text class=\"label\" x=\"%d\" y=\"%d\" text-anchor=\"middle\">", RH_ML + pw / 2,
            c->h - 6);
    rh_esc(f, xlabel);
    fprintf(f,
            "</text><text class=\"label\" x=\"12\" y=\"%d\" text-anchor=\"middle\" "
            "transform=\"rotate(-90 12 %d)\">",
            RH_MT + ph / 2, RH_MT + ph / 2);
    rh_esc(f, ylabel);
    fputs("</text>", f);
}

/* A series: points (x[i], y[i]); a NaN y breaks the line. */
typedef struct rh_series {
    const char *name;
    const char *color;
    const char *dash; /* stroke-dasharray or NULL */
    double *x, *y;
    size_t n;
} rh_series;

static size_t rh_series_points(const rh_series *s)
{
    size_t k = 0;
    for (size_t i = 0; i < s->n; i++)
        k += isfinite(s->y[i]) && isfinite(s->x[i]);
    return k;
}

static void rh_polylines(FILE *f, const rh_chart *c, const rh_series *s)
{
    size_t stride = s->n > RH_MAX_POINTS ? (s->n + RH_MAX_POINTS - 1) / RH_MAX_POINTS : 1;
    bool open = false;
    for (size_t i = 0; i < s->n; i += stride) {
        if (!isfinite(s->y[i]) || !isfinite(s->x[i])) {
            if (open)
                fputs("\"/>", f);
            open = false;
            continue;
        }
        if (!open) {
            fprintf(f, "<polyline class=\"series\" stroke=\"%s\"%s%s%s points=\"", s->color,
                    s->dash ? " stroke-dasharray=\"" : "", s->dash ? s->dash : "",
                    s->dash ? "\"" : "");
            open = true;
        } else {
            fputc(' ', f);
        }
        fprintf(f, "%.1f,%.1f", rh_px(c, s->x[i]), rh_py(c, s->y[i]));
    }
    if (open)
        fputs("\"/>", f);
}

static void rh_legend(FILE *f, const rh_series *s, size_t n, const char *extra_name,
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

/* A line chart of the series; hline (finite) adds a dotted horizontal line. */
static void rh_line_chart(FILE *f, const char *cls, const char *title, const char *xlabel,
                          const char *ylabel, const rh_series *s, size_t n, double hline,
                          const char *hline_name, bool from_zero)
{
    rh_chart c = {
        .x0 = INFINITY, .x1 = -INFINITY, .y0 = INFINITY, .y1 = -INFINITY, .w = RH_W, .h = RH_H};
    size_t pts = 0;
    for (size_t k = 0; k < n; k++) {
        pts += rh_series_points(&s[k]);
        for (size_t i = 0; i < s[k].n; i++) {
            if (!isfinite(s[k].y[i]) || !isfinite(s[k].x[i]))
                continue;
            c.x0 = fmin(c.x0, s[k].x[i]);
            c.x1 = fmax(c.x1, s[k].x[i]);
            c.y0 = fmin(c.y0, s[k].y[i]);
            c.y1 = fmax(c.y1, s[k].y[i]);
        }
    }
    if (isfinite(hline)) {
        c.y0 = fmin(c.y0, hline);
        c.y1 = fmax(c.y1, hline);
    }
    if (c.x0 > c.x1) {
        c.x0 = 0;
        c.x1 = 1;
    } else if (c.x1 == c.x0) {
        c.x1 = c.x0 + 1;
    }
    rh_range_fix(&c.y0, &c.y1, from_zero);
    fprintf(f, "<figure><figcaption>");
    rh_esc(f, title);
    fputs("</figcaption>", f);
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

/* ---- one run ---- */

static int rh_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double rh_quantile(const double *sorted, size_t n, double q)
{
    if (n == 0)
        return NAN;
    double pos = q * (double)(n - 1);
    size_t i = (size_t)pos;
    double frac = pos - (double)i;
    return i + 1 < n ? sorted[i] * (1 - frac) + sorted[i + 1] * frac : sorted[i];
}

static double rh_sec(const rp_run *r, int64_t t)
{
    return (double)(t - r->t_origin) / 1e9;
}

static void rh_fmt_num(FILE *f, bool has, double v)
{
    if (has && isfinite(v))
        fprintf(f, "%.6g", v);
    else
        fputs("&ndash;", f);
}

static void rh_run_header(FILE *f, const rp_run *r)
{
    fprintf(f, "<h2>run %" PRId64 ": ", r->id);
    rh_esc(f, r->scenario);
    fprintf(f, " <span class=\"status s-");
    rh_esc(f, r->status);
    fputs("\">", f);
    rh_esc(f, r->status);
    fputs("</span></h2>\n<table class=\"kv\">", f);
    fprintf(f, "<tr><th>seed</th><td>%" PRIu64 "</td></tr>", r->seed);
    fputs("<tr><th>engine</th><td>", f);
    rh_esc(f, r->engine);
    fputs("</td></tr><tr><th>strategy</th><td>", f);
    rh_esc(f, r->strategy ? r->strategy : "");
    /* the exchange the run made: one all-reduce on the world (its
     * algorithm), or the strategy's own collectives */
    const rp_metric *alg = rp_metric_find(r, "allreduce_algorithm");
    const rp_metric *xch = rp_metric_find(r, "exchange");
    if (xch && xch->unit) {
        fputs(" (exchange: ", f);
        rh_esc(f, xch->unit);
        fputs(")", f);
    } else if (alg && alg->unit) {
        fputs(" (all-reduce: ", f);
        rh_esc(f, alg->unit);
        fputs(")", f);
    }
    fputs("</td></tr><tr><th>replicas</th>", f);
    fprintf(f, "<td>%d</td></tr><tr><th>started (UTC)</th><td>", r->n_replicas);
    rh_esc(f, r->started);
    fputs("</td></tr><tr><th>duration</th><td>", f);
    if (r->has_duration)
        fprintf(f, "%.3f s", r->duration_s);
    else
        fputs("not ended", f);
    fputs("</td></tr>", f);
    static const char *const shown[][2] = {
        {"steps", "steps"},
        {"examples_per_s", "examples/s"},
        {"initial_loss", "initial loss"},
        {"final_loss", "final loss"},
        {"reference_final_loss", "reference final loss"},
    };
    for (size_t i = 0; i < sizeof shown / sizeof shown[0]; i++) {
        const rp_metric *m = rp_metric_find(r, shown[i][0]);
        if (!m)
            continue;
        fprintf(f, "<tr><th>%s</th><td>", shown[i][1]);
        rh_fmt_num(f, m->has_value, m->value);
        fputs("</td></tr>", f);
    }
    fputs("<tr><th>dsim</th><td>", f);
    rh_esc(f, r->version);
    fputs("</td></tr></table>\n", f);
}

static void rh_checks(FILE *f, const rp_run *r)
{
    fputs("<h3>checks</h3>\n", f);
    if (r->n_checks == 0) {
        fputs("<p class=\"note\">No checks stored: the scenario has no <code>expect:</code> "
              "section, or the run ended before it was judged.</p>\n",
              f);
        return;
    }
    fputs("<table class=\"checks\"><tr><th>check</th><th>result</th><th>measured</th>"
          "<th>expected</th><th>message</th></tr>\n",
          f);
    for (size_t i = 0; i < r->n_checks; i++) {
        const rp_check *c = &r->checks[i];
        fprintf(f, "<tr class=\"%s\"><td>", c->passed ? "pass" : "fail");
        rh_esc(f, c->name);
        fprintf(f, "</td><td>%s</td><td>", c->passed ? "PASS" : "FAIL");
        rh_fmt_num(f, c->has_measured, c->measured);
        fputs("</td><td>", f);
        rh_fmt_num(f, c->has_expected, c->expected);
        fputs("</td><td>", f);
        rh_esc(f, c->message);
        fputs("</td></tr>\n", f);
    }
    fputs("</table>\n", f);
}

static void rh_divergence(FILE *f, const rp_run *r)
{
    int64_t d = rp_first_divergent_step(r);
    bool failed = r->status && strcmp(r->status, "passed") != 0;
    if (d < 0) {
        if (failed)
            fputs("<h3>first divergent step</h3><p class=\"note\">None: at every stored step "
                  "all replicas reported the same parameter checksum.</p>\n",
                  f);
        return;
    }
    fprintf(f,
            "<h3>first divergent step</h3><p class=\"bad\">The replicas' parameters first "
            "differ after step %" PRId64 ". Checksums there:</p>\n"
            "<table class=\"checks\"><tr><th>replica</th><th>attempt</th><th>checksum</th>"
            "<th>loss</th></tr>\n",
            d);
    for (size_t i = 0; i < r->n_steps; i++) {
        const rp_step *s = &r->steps[i];
        if (s->step != d)
            continue;
        fprintf(f, "<tr><td>%d</td><td>%d</td><td><code>%016" PRIx64 "</code></td><td>", s->replica,
                s->attempt, s->has_checksum ? s->checksum : 0);
        rh_fmt_num(f, s->has_loss, s->loss);
        fputs("</td></tr>\n", f);
    }
    fputs("</table>\n", f);
}

/* Loss per replica (a line per replica and attempt), the reduced loss. */
static void rh_loss(FILE *f, const rp_run *r)
{
    int R = r->n_replicas;
    /* the replicas, the reduced loss, and the one-device reference's */
    size_t ns = (size_t)R + (r->n_ref ? 2 : 1);
    size_t cap = r->n_steps * 2 + 1 > r->n_ref + 1 ? r->n_steps * 2 + 1 : r->n_ref + 1;
    rh_series *s = calloc(ns, sizeof *s);
    char(*names)[48] = calloc(ns, sizeof *names);
    bool ok = s && names;
    for (size_t k = 0; ok && k < ns; k++) {
        s[k].x = malloc(cap * sizeof(double));
        s[k].y = malloc(cap * sizeof(double));
        ok = s[k].x && s[k].y;
    }
    if (!ok) {
        fputs("<p class=\"note\">out of memory drawing the loss</p>\n", f);
    } else {
        int *last_att = calloc(ns, sizeof *last_att);
        int64_t red_last = -1;
        for (size_t k = 0; k < (size_t)R; k++) {
            snprintf(names[k], sizeof names[k], "replica %zu (local)", k);
            s[k].name = names[k];
            s[k].color = rh_color((int)k);
        }
        s[R].name = "reduced (all replicas)";
        s[R].color = "#000";
        s[R].dash = "5,3";
        for (size_t i = 0; last_att && i < r->n_steps; i++) {
            const rp_step *p = &r->steps[i];
            if (p->replica < 0 || p->replica >= R)
                continue;
            rh_series *q = &s[p->replica];
            if (p->attempt != last_att[p->replica] && q->n) {
                q->x[q->n] = NAN; /* a restart: a new line from where it resumed */
                q->y[q->n++] = NAN;
            }
            last_att[p->replica] = p->attempt;
            q->x[q->n] = (double)p->step;
            q->y[q->n++] = p->has_loss ? p->loss : NAN;
            /* the reduced loss is the same on every replica: replica 0's */
            if (p->replica == 0 && p->has_reduced) {
                rh_series *t = &s[R];
                if (t->n && p->step <= red_last) {
                    t->x[t->n] = NAN;
                    t->y[t->n++] = NAN;
                }
                t->x[t->n] = (double)p->step;
                t->y[t->n++] = p->reduced;
                red_last = p->step;
            }
        }
        free(last_att);
        if (r->n_ref) {
            rh_series *t = &s[R + 1];
            t->name = "one-device reference";
            t->color = "#888";
            t->dash = "2,2";
            for (size_t i = 0; i < r->n_ref; i++) {
                t->x[t->n] = r->ref_step[i];
                t->y[t->n++] = r->ref_loss[i];
            }
        }
        const rp_metric *ref = rp_metric_find(r, "reference_final_loss");
        fputs("<h3>loss</h3>\n", f);
        rh_line_chart(f, "loss", "loss per replica over steps (a restart starts a new line)",
                      "global step", "loss", s, ns, ref && ref->has_value ? ref->value : NAN,
                      "one-device reference, final loss", false);
    }
    for (size_t k = 0; s && k < ns; k++) {
        free(s[k].x);
        free(s[k].y);
    }
    free(s);
    free(names);
}

/* Examples/s: examples of the steps that ended in each of RH_RATE_BUCKETS
 * equal slices of the run, over the slice's length. */
static void rh_rate(FILE *f, const rp_run *r)
{
    double x[RH_RATE_BUCKETS], y[RH_RATE_BUCKETS];
    size_t n = 0;
    if (r->n_steps && r->has_times) {
        int64_t lo = INT64_MAX, hi = INT64_MIN;
        for (size_t i = 0; i < r->n_steps; i++) {
            lo = r->steps[i].t0 < lo ? r->steps[i].t0 : lo;
            hi = r->steps[i].t1 > hi ? r->steps[i].t1 : hi;
        }
        double span = (double)(hi - lo);
        if (span > 0) {
            double w = span / RH_RATE_BUCKETS, ex[RH_RATE_BUCKETS] = {0};
            for (size_t i = 0; i < r->n_steps; i++) {
                size_t b = (size_t)((double)(r->steps[i].t1 - lo) / w);
                ex[b < RH_RATE_BUCKETS ? b : RH_RATE_BUCKETS - 1] += (double)r->steps[i].examples;
            }
            for (size_t b = 0; b < RH_RATE_BUCKETS; b++) {
                x[n] = ((double)lo + w * ((double)b + 0.5) - (double)r->t_origin) / 1e9;
                y[n++] = ex[b] / (w / 1e9);
            }
        }
    }
    rh_series s = {
        .name = "examples/s (all replicas)", .color = rh_color(0), .x = x, .y = y, .n = n};
    fputs("<h3>throughput</h3>\n", f);
    rh_line_chart(f, "rate", "examples/s over time", "seconds since the run's first record",
                  "examples/s", &s, 1, NAN, NULL, true);
}

/* Step time per replica: a row per replica, a dot per step. */
static void rh_step_times(FILE *f, const rp_run *r)
{
    int R = r->n_replicas;
    fputs("<h3>step time per replica</h3>\n", f);
    if (R == 0 || r->n_steps == 0) {
        fputs("<p class=\"note\">No steps stored.</p>\n", f);
        return;
    }
    double **v = calloc((size_t)R, sizeof *v);
    size_t *cnt = calloc((size_t)R, sizeof *cnt);
    double *med = calloc((size_t)R, sizeof *med);
    bool ok = v && cnt && med;
    for (int k = 0; ok && k < R; k++)
        ok = (v[k] = malloc((r->n_steps + 1) * sizeof(double))) != NULL;
    if (!ok) {
        fputs("<p class=\"note\">out of memory drawing the step times</p>\n", f);
        goto out;
    }
    double hi = 0;
    for (size_t i = 0; i < r->n_steps; i++) {
        const rp_step *p = &r->steps[i];
        if (p->replica < 0 || p->replica >= R)
            continue;
        double ms = (double)(p->t1 - p->t0) / 1e6;
        v[p->replica][cnt[p->replica]++] = ms;
        hi = fmax(hi, ms);
    }
    for (int k = 0; k < R; k++) {
        qsort(v[k], cnt[k], sizeof(double), rh_cmp_double);
        med[k] = rh_quantile(v[k], cnt[k], 0.5);
    }
    int row = 22;
    rh_chart c = {.x0 = 0,
                  .x1 = hi > 0 ? hi * 1.05 : 1,
                  .y0 = 0,
                  .y1 = R,
                  .w = RH_W,
                  .h = RH_MT + RH_MB + row * R};
    size_t pts = 0;
    for (int k = 0; k < R; k++)
        pts += cnt[k];
    fputs("<figure><figcaption>step time per replica: a dot per step, the box the middle half, "
          "the bar the median</figcaption>",
          f);
    rh_svg_open(f, &c, "steptime", pts, "step time per replica");
    rh_axes(f, &c, "step time (ms)", "replica", false);
    size_t stride = r->n_steps > RH_MAX_POINTS ? r->n_steps / RH_MAX_POINTS + 1 : 1;
    int n_strag = 0;
    for (int k = 0; k < R; k++) {
        /* the others' median: a straggler is slow against the rest */
        double others = 0;
        size_t no = 0;
        for (int j = 0; j < R; j++)
            if (j != k && cnt[j]) {
                others += med[j];
                no++;
            }
        others = no ? others / (double)no : NAN;
        bool strag = cnt[k] && no && isfinite(others) && med[k] > RH_STRAGGLER * others &&
                     med[k] - others > RH_NOISE_MS;
        n_strag += strag;
        double yc = RH_MT + row * (k + 0.5);
        fprintf(f, "<text class=\"tick%s\" x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%s%d</text>",
                strag ? " straggler" : "", RH_ML - 4, yc + 4, strag ? "straggler " : "", k);
        if (!cnt[k])
            continue;
        double q1 = rh_quantile(v[k], cnt[k], 0.25), q3 = rh_quantile(v[k], cnt[k], 0.75);
        fprintf(f,
                "<rect class=\"box\" x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%d\"/>"
                "<line class=\"median\" x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>",
                rh_px(&c, q1), yc - row * 0.35, fmax(rh_px(&c, q3) - rh_px(&c, q1), 1.0),
                (int)(row * 0.7), rh_px(&c, med[k]), yc - row * 0.45, rh_px(&c, med[k]),
                yc + row * 0.45);
        for (size_t i = 0; i < cnt[k]; i += stride)
            fprintf(f, "<circle class=\"dot\" cx=\"%.1f\" cy=\"%.1f\" r=\"2\" fill=\"%s\"/>",
                    rh_px(&c, v[k][i]), yc + (double)((i * 7) % 9 - 4), rh_color(k));
    }
    fputs("</svg></figure>\n<table class=\"checks\"><tr><th>replica</th><th>steps</th>"
          "<th>median ms</th><th>p90 ms</th><th>max ms</th></tr>\n",
          f);
    for (int k = 0; k < R; k++) {
        fprintf(f, "<tr><td>%d</td><td>%zu</td><td>%.3f</td><td>%.3f</td><td>%.3f</td></tr>\n", k,
                cnt[k], med[k], rh_quantile(v[k], cnt[k], 0.9), cnt[k] ? v[k][cnt[k] - 1] : NAN);
    }
    fputs("</table>\n", f);
    if (n_strag)
        fprintf(f,
                "<p class=\"bad\">%d replica(s) with a median step time over %.1fx the other "
                "replicas' (and %.1f ms longer).</p>\n",
                n_strag, RH_STRAGGLER, RH_NOISE_MS);
    fputs("<p class=\"note\">In a synchronous strategy every replica waits for the slowest "
          "at each all-reduce, so step times even out: a straggler shows in the all-reduce "
          "share below, as the replica that waits least.</p>\n",
          f);
out:
    for (int k = 0; v && k < R; k++)
        free(v[k]);
    free(v);
    free(cnt);
    free(med);
}

static void rh_comm_share(FILE *f, const rp_run *r)
{
    fputs("<h3>all-reduce share of step time</h3>\n", f);
    if (r->n_colls == 0) {
        fputs("<p class=\"note\">Not measured: this run stored no per-collective times "
              "(the <code>collectives</code> table has no rows for it).</p>\n",
              f);
        return;
    }
    int R = r->n_replicas;
    double *cs = calloc((size_t)R + 1, sizeof *cs), *ss = calloc((size_t)R + 1, sizeof *ss);
    if (!cs || !ss) {
        free(cs);
        free(ss);
        fputs("<p class=\"note\">out of memory</p>\n", f);
        return;
    }
    /* a call that failed belongs to no completed step */
    for (size_t i = 0; i < r->n_colls; i++)
        if (r->colls[i].replica >= 0 && r->colls[i].replica < R && r->colls[i].status == 0)
            cs[r->colls[i].replica] += (double)(r->colls[i].t1 - r->colls[i].t0);
    /* a long run keeps the collectives of every k-th step: its steps too */
    const rp_metric *sm = rp_metric_find(r, "collective_sampling");
    int64_t k = sm && sm->has_value && sm->value >= 1 ? (int64_t)sm->value : 1;
    for (size_t i = 0; i < r->n_steps; i++)
        if (r->steps[i].replica >= 0 && r->steps[i].replica < R && r->steps[i].step % k == 0)
            ss[r->steps[i].replica] += (double)(r->steps[i].t1 - r->steps[i].t0);
    int row = 22;
    rh_chart c = {.x0 = 0, .x1 = 1, .y0 = 0, .y1 = R, .w = RH_W, .h = RH_MT + RH_MB + row * R};
    fprintf(f,
            "<figure><figcaption>time in collectives / time in steps, per replica (the line: "
            "20 %%)%s</figcaption>",
            k > 1 ? "; from every k-th step, as stored" : "");
    rh_svg_open(f, &c, "comm", (size_t)R, "all-reduce share");
    rh_axes(f, &c, "share of step time", "replica", false);
    for (int k = 0; k < R; k++) {
        double share = ss[k] > 0 ? fmin(cs[k] / ss[k], 1.0) : 0;
        double yc = RH_MT + row * (k + 0.5);
        fprintf(f,
                "<text class=\"tick\" x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%d</text>"
                "<rect class=\"bar%s\" x=\"%d\" y=\"%.1f\" width=\"%.1f\" height=\"%d\">"
                "<title>replica %d: %.1f %%</title></rect>",
                RH_ML - 4, yc + 4, k, share > RH_COMM_FLAG ? " over" : "", RH_ML, yc - row * 0.35,
                rh_px(&c, share) - RH_ML, (int)(row * 0.7), k, share * 100);
    }
    fprintf(f, "<line class=\"ref\" x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\"/></svg></figure>\n",
            rh_px(&c, RH_COMM_FLAG), RH_MT, rh_px(&c, RH_COMM_FLAG), c.h - RH_MB);
    /* A straggler waits least: the others wait for it in every collective. */
    double *sh = calloc((size_t)R + 1, sizeof *sh);
    int n_strag = 0;
    for (int a = 0; sh && a < R; a++)
        sh[a] = ss[a] > 0 ? fmin(cs[a] / ss[a], 1.0) : NAN;
    for (int a = 0; sh && a < R && R >= 2; a++) {
        double others = 0;
        int no = 0;
        for (int b = 0; b < R; b++)
            if (b != a && isfinite(sh[b])) {
                others += sh[b];
                no++;
            }
        if (!no || !isfinite(sh[a]) || sh[a] >= RH_WAIT_STRAGGLER * (others / no))
            continue;
        if (n_strag++ == 0)
            fputs("<p class=\"bad\">", f);
        fprintf(f,
                "Replica %d is a straggler: it spends %.0f %% of its step time in collectives, "
                "the others %.0f %% on average; they wait for it. ",
                a, sh[a] * 100, others / no * 100);
    }
    if (n_strag)
        fputs("</p>\n", f);
    free(sh);
    fputs("<p class=\"note\">Collectives as stored: with dsim's own driver, the "
          "<code>allreduce</code> phase (apply_gradients: the gradients' reduction and the "
          "update) and the <code>reduce_loss</code> phase of each step, per replica. A replica "
          "that waits long here waits for a slower one.</p>\n",
          f);
    free(cs);
    free(ss);
}

static const char *rh_event_color(const char *kind)
{
    if (strcmp(kind, "fault") == 0)
        return "#d62728";
    if (strcmp(kind, "error") == 0)
        return "#ff7f0e";
    if (strcmp(kind, "restart") == 0)
        return "#2ca02c";
    if (strcmp(kind, "checkpoint") == 0)
        return "#1f77b4";
    return "#7f7f7f";
}

/* Faults and recovery: a lane per replica (and one for the job) with each
 * attempt's span of steps and the events as marks. */
static void rh_timeline(FILE *f, const rp_run *r)
{
    int R = r->n_replicas;
    fputs("<h3>faults and recovery</h3>\n", f);
    if (!r->has_times) {
        fputs("<p class=\"note\">Nothing with a time was stored.</p>\n", f);
        return;
    }
    int row = 20;
    rh_chart c = {.x0 = 0,
                  .x1 = fmax(rh_sec(r, r->t_last), 1e-6) * 1.02,
                  .y0 = 0,
                  .y1 = R + 1,
                  .w = RH_W,
                  .h = RH_MT + RH_MB + row * (R + 1)};
    size_t pts = 0;
    for (size_t i = 0; i < r->n_events; i++)
        pts += strcmp(r->events[i].kind, "phase") != 0;
    fputs("<figure><figcaption>a lane per replica: bars are runs of steps (one per attempt), "
          "thin red bars collectives that failed (from the call to the error), marks are "
          "events (red fault, orange error, green restart, blue checkpoint)</figcaption>",
          f);
    /* spans: per replica and attempt, first start to last end */
    for (int k = 0; k < R; k++) {
        int att = -1;
        for (size_t i = 0; i < r->n_steps; i++)
            if (r->steps[i].replica == k && r->steps[i].attempt != att) {
                att = r->steps[i].attempt;
                pts++;
            }
    }
    rh_svg_open(f, &c, "timeline", pts, "faults and recovery");
    rh_axes(f, &c, "seconds since the run's first record", "", false);
    for (int k = -1; k < R; k++) {
        double yc = RH_MT + row * (k + 1.5);
        if (k < 0)
            fprintf(f, "<text class=\"tick\" x=\"%d\" y=\"%.1f\" text-anchor=\"end\">job</text>",
                    RH_ML - 4, yc + 4);
        else
            fprintf(f,
                    "<text class=\"tick\" x=\"%d\" y=\"%.1f\" text-anchor=\"end\">replica "
                    "%d</text>",
                    RH_ML - 4, yc + 4, k);
        if (k < 0)
            continue;
        int att = -1;
        int64_t a0 = 0, a1 = 0;
        for (size_t i = 0; i <= r->n_steps; i++) {
            const rp_step *p = i < r->n_steps ? &r->steps[i] : NULL;
            if (p && p->replica != k)
                continue;
            if (!p || p->attempt != att) {
                if (att >= 0)
                    fprintf(f,
                            "<rect class=\"span\" x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" "
                            "height=\"%d\" fill=\"%s\"><title>replica %d, attempt %d: steps "
                            "%.3f s to %.3f s</title></rect>",
                            rh_px(&c, rh_sec(r, a0)), yc - row * 0.3,
                            fmax(rh_px(&c, rh_sec(r, a1)) - rh_px(&c, rh_sec(r, a0)), 1.0),
                            (int)(row * 0.6), rh_color(k), k, att, rh_sec(r, a0), rh_sec(r, a1));
                if (!p)
                    break;
                att = p->attempt;
                a0 = p->t0;
                a1 = p->t1;
            }
            a0 = p->t0 < a0 ? p->t0 : a0;
            a1 = p->t1 > a1 ? p->t1 : a1;
        }
    }
    /* collectives that failed: how long each survivor waited before it
     * gave up */
    for (size_t i = 0; i < r->n_colls; i++) {
        const rp_coll *fc = &r->colls[i];
        if (fc->status == 0 || fc->replica < 0 || fc->replica >= R)
            continue;
        double yc = RH_MT + row * (fc->replica + 1.5);
        fprintf(f,
                "<rect class=\"failed\" x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%d\">"
                "<title>replica %d: %s failed after %.3f s</title></rect>",
                rh_px(&c, rh_sec(r, fc->t0)), yc - row * 0.2,
                fmax(rh_px(&c, rh_sec(r, fc->t1)) - rh_px(&c, rh_sec(r, fc->t0)), 1.0),
                (int)(row * 0.4), fc->replica, fc->op, (double)(fc->t1 - fc->t0) / 1e9);
    }
    for (size_t i = 0; i < r->n_events; i++) {
        const rp_event *e = &r->events[i];
        if (strcmp(e->kind, "phase") == 0)
            continue; /* in the cold-start table */
        int lane = e->replica >= 0 && e->replica < R ? e->replica : -1;
        double yc = RH_MT + row * (lane + 1.5), x = rh_px(&c, rh_sec(r, e->t));
        fprintf(f, "<path class=\"mark\" d=\"M%.1f %.1fl5 -8h-10z\" fill=\"%s\"><title>", x, yc + 4,
                rh_event_color(e->kind));
        fprintf(f, "%.3f s ", rh_sec(r, e->t));
        rh_esc(f, e->kind);
        fputs(": ", f);
        rh_esc(f, e->detail);
        fputs("</title></path>", f);
    }
    fputs("</svg></figure>\n", f);
    size_t shown = 0, left = 0;
    for (size_t i = 0; i < r->n_events; i++) {
        const rp_event *e = &r->events[i];
        if (strcmp(e->kind, "phase") == 0)
            continue;
        if (shown == RH_MAX_EVENT_ROWS) {
            left++;
            continue;
        }
        if (shown++ == 0)
            fputs("<table class=\"events\"><tr><th>time (s)</th><th>replica</th><th>kind</th>"
                  "<th>detail</th></tr>\n",
                  f);
        fprintf(f, "<tr class=\"ev-");
        rh_esc(f, e->kind);
        fprintf(f, "\"><td>%.3f</td><td>", rh_sec(r, e->t));
        if (e->replica >= 0)
            fprintf(f, "%d", e->replica);
        else
            fputs("job", f);
        fputs("</td><td>", f);
        rh_esc(f, e->kind);
        fputs("</td><td>", f);
        rh_esc(f, e->detail);
        fputs("</td></tr>\n", f);
    }
    if (shown)
        fputs("</table>\n", f);
    else
        fputs("<p class=\"note\">No faults, errors, restarts or checkpoints were stored for "
              "this run.</p>\n",
              f);
    if (left)
        fprintf(f,
                "<p class=\"note\">%zu more events: <code>SELECT * FROM events WHERE run_id "
                "= %" PRId64 "</code></p>\n",
                left, r->id);
}

/* Cold start: per replica and attempt (a 'start' phase begins one), how
 * long each phase took, and when its first step ended. */
static void rh_cold_start(FILE *f, const rp_run *r)
{
    static const char *const phases[] = {"start", "rendezvous", "restore", "create_variables"};
    enum { NPH = sizeof phases / sizeof phases[0] };
    bool any = false;
    for (size_t i = 0; i < r->n_events && !any; i++)
        any = strcmp(r->events[i].kind, "phase") == 0;
    if (!any)
        return;
    fputs("<h3>cold start</h3>\n<table class=\"checks\"><tr><th>replica</th><th>attempt</th>", f);
    for (size_t k = 0; k < NPH; k++)
        fprintf(f, "<th>%s ms</th>", phases[k]);
    fputs("<th>first step done (s)</th></tr>\n", f);
    for (int rep = 0; rep < r->n_replicas; rep++) {
        int att = -1;
        double ms[NPH];
        int64_t t_start = 0;
        for (size_t i = 0; i <= r->n_events; i++) {
            const rp_event *e = i < r->n_events ? &r->events[i] : NULL;
            if (e && (e->replica != rep || strcmp(e->kind, "phase") != 0 || !e->detail))
                continue;
            json_t *d = e ? json_loads(e->detail, 0, NULL) : NULL;
            const char *ph = d ? json_string_value(json_object_get(d, "phase")) : NULL;
            json_t *dur = d ? json_object_get(d, "dur_ns") : NULL;
            if (!e || (ph && strcmp(ph, "start") == 0)) {
                if (att >= 0) {
                    fprintf(f, "<tr><td>%d</td><td>%d</td>", rep, att);
                    for (size_t k = 0; k < NPH; k++) {
                        fputs("<td>", f);
                        rh_fmt_num(f, !isnan(ms[k]), ms[k]);
                        fputs("</td>", f);
                    }
                    /* the attempt's first step: the first one that started after it */
                    int64_t done = -1;
                    for (size_t j = 0; j < r->n_steps && done < 0; j++)
                        if (r->steps[j].replica == rep && r->steps[j].t0 >= t_start)
                            done = r->steps[j].t1;
                    fputs("<td>", f);
                    rh_fmt_num(f, done >= 0, done >= 0 ? rh_sec(r, done) : NAN);
                    fputs("</td></tr>\n", f);
                }
                if (!e) {
                    json_decref(d);
                    break;
                }
                att++;
                t_start = e->t;
                for (size_t k = 0; k < NPH; k++)
                    ms[k] = NAN;
            }
            for (size_t k = 0; ph && att >= 0 && k < NPH; k++)
                if (strcmp(ph, phases[k]) == 0 && json_is_integer(dur))
                    ms[k] = (double)json_integer_value(dur) / 1e6;
            json_decref(d);
        }
    }
    fputs("</table>\n", f);
}

/* A failed run's flight records, when they were written: the desync
 * analysis of `dsim trace desync`, as it prints it. */
static void rh_desync(FILE *f, const rp_run *r)
{
    if (access(r->flight_path, R_OK) != 0)
        return;
    char *text = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&text, &len);
    if (!m)
        return;
    dsim_desync sum;
    memset(&sum, 0, sizeof sum);
    dsim_err e = dsim_flight_desync(r->flight_path, m, &sum);
    fclose(m);
    fputs("<h3>collective calls (flight records)</h3>\n", f);
    if (e != DSIM_OK) {
        fputs("<p class=\"note\">The flight records could not be read: ", f);
        rh_esc(f, dsim_errmsg());
        fputs("</p>\n", f);
    } else {
        fprintf(f, "<p class=\"%s\">", sum.seq ? "bad" : "note");
        if (sum.seq)
            fprintf(f,
                    "Collective #%" PRIu64 " is the first that not every rank completed: %d "
                    "rank(s) never called it, %d waited in it, %d called another one, %d "
                    "failed in it.",
                    sum.seq, sum.n_missing, sum.n_waiting, sum.n_different, sum.n_failed);
        else
            fputs("Every rank completed every recorded call.", f);
        fputs(" The analysis of <code>dsim trace desync</code>:</p><pre>", f);
        rh_esc(f, text ? text : "");
        fputs("</pre>\n", f);
    }
    free(text);
}

static void rh_run_section(FILE *f, const rp_run *r)
{
    fprintf(f, "<section class=\"run\" id=\"run-%" PRId64 "\">\n", r->id);
    rh_run_header(f, r);
    rh_checks(f, r);
    rh_divergence(f, r);
    rh_desync(f, r);
    /* what happened first: why a run failed is there */
    rh_timeline(f, r);
    rh_loss(f, r);
    rh_rate(f, r);
    rh_step_times(f, r);
    rh_comm_share(f, r);
    rh_cold_start(f, r);
    if (r->text) {
        fputs("<details><summary>scenario file</summary><pre>", f);
        rh_esc(f, r->text);
        fputs("</pre></details>\n", f);
    }
    fputs("</section>\n", f);
}

/* ---- several runs ---- */

static void rh_compare(FILE *f, const rp_run *runs, size_t n)
{
    fputs("<section class=\"compare\"><h2>comparison</h2>\n<table class=\"checks\"><tr><th></th>",
          f);
    for (size_t i = 0; i < n; i++)
        fprintf(f, "<th><a href=\"#run-%" PRId64 "\">run %" PRId64 "</a></th>", runs[i].id,
                runs[i].id);
    fputs("</tr>\n", f);
    static const char *const rows[] = {"scenario", "status",        "engine",      "strategy",
                                       "seed",     "checks failed", "duration (s)"};
    for (size_t k = 0; k < sizeof rows / sizeof rows[0]; k++) {
        fprintf(f, "<tr><th>%s</th>", rows[k]);
        for (size_t i = 0; i < n; i++) {
            const rp_run *r = &runs[i];
            fputs("<td>", f);
            switch (k) {
            case 0:
                rh_esc(f, r->scenario);
                break;
            case 1:
                rh_esc(f, r->status);
                break;
            case 2:
                rh_esc(f, r->engine);
                break;
            case 3:
                rh_esc(f, r->strategy);
                break;
            case 4:
                fprintf(f, "%" PRIu64, r->seed);
                break;
            case 5: {
                size_t bad = 0;
                for (size_t c = 0; c < r->n_checks; c++)
                    bad += !r->checks[c].passed;
                fprintf(f, "%zu of %zu", bad, r->n_checks);
                break;
            }
            default:
                rh_fmt_num(f, r->has_duration, r->duration_s);
            }
            fputs("</td>", f);
        }
        fputs("</tr>\n", f);
    }
    static const char *const mets[][2] = {{"examples_per_s", "examples/s"},
                                          {"final_loss", "final loss"},
                                          {"reference_final_loss", "reference final loss"},
                                          {"steps", "steps"}};
    for (size_t k = 0; k < sizeof mets / sizeof mets[0]; k++) {
        fprintf(f, "<tr><th>%s</th>", mets[k][1]);
        for (size_t i = 0; i < n; i++) {
            const rp_metric *m = rp_metric_find(&runs[i], mets[k][0]);
            fputs("<td>", f);
            rh_fmt_num(f, m && m->has_value, m ? m->value : NAN);
            fputs("</td>", f);
        }
        fputs("</tr>\n", f);
    }
    fputs("</table>\n", f);
    /* reduced loss of each run over steps (replica 0's rows) */
    rh_series *s = calloc(n, sizeof *s);
    char(*names)[96] = calloc(n, sizeof *names);
    bool ok = s && names;
    for (size_t i = 0; ok && i < n; i++) {
        const rp_run *r = &runs[i];
        s[i].x = malloc((r->n_steps * 2 + 1) * sizeof(double));
        s[i].y = malloc((r->n_steps * 2 + 1) * sizeof(double));
        if (!(ok = s[i].x && s[i].y))
            break;
        snprintf(names[i], sizeof names[i], "run %" PRId64 ": %.60s", r->id,
                 r->scenario ? r->scenario : "");
        s[i].name = names[i];
        s[i].color = rh_color((int)i);
        int att = 0;
        for (size_t j = 0; j < r->n_steps; j++) {
            const rp_step *p = &r->steps[j];
            if (p->replica != 0)
                continue;
            if (p->attempt != att && s[i].n) {
                s[i].x[s[i].n] = NAN;
                s[i].y[s[i].n++] = NAN;
            }
            att = p->attempt;
            s[i].x[s[i].n] = (double)p->step;
            s[i].y[s[i].n++] = p->has_reduced ? p->reduced : (p->has_loss ? p->loss : NAN);
        }
    }
    if (ok)
        rh_line_chart(f, "loss", "reduced loss of each run over steps", "global step", "loss", s, n,
                      NAN, NULL, false);
    for (size_t i = 0; s && i < n; i++) {
        free(s[i].x);
        free(s[i].y);
    }
    free(s);
    free(names);
    fputs("</section>\n", f);
}

static const char rh_style[] =
    "body{font:14px/1.4 system-ui,-apple-system,'Segoe UI',sans-serif;margin:16px;color:#222;"
    "background:#fff}\n"
    "h1{font-size:20px}h2{font-size:17px;margin-top:24px}h3{font-size:15px;margin:18px 0 6px}\n"
    ".runs{display:grid;gap:24px}\n"
    "section.run{min-width:0}\n"
    "table{border-collapse:collapse;margin:4px 0}td,th{border:1px solid #ddd;padding:2px 6px;"
    "text-align:left;vertical-align:top}\n"
    "table.kv th{background:#f5f5f5;font-weight:600}\n"
    "tr.pass td:nth-child(2){color:#207020;font-weight:600}\n"
    "tr.fail td:nth-child(2){color:#b00020;font-weight:600}\n"
    "tr.ev-fault td{background:#fdecea}tr.ev-error td{background:#fff4e5}\n"
    ".status{padding:1px 8px;border-radius:8px;font-size:13px;background:#eee}\n"
    ".s-passed{background:#d8f0d8}.s-failed,.s-crashed,.s-hung,.s-error{background:#f8d0d0}\n"
    ".note{color:#555}.bad{color:#b00020}\n"
    "figure{margin:6px 0}figcaption{font-size:13px;color:#444}\n"
    "svg.plot{width:100%;max-width:760px;height:auto;display:block}\n"
    "svg .frame{fill:none;stroke:#999}svg .grid{stroke:#eee}\n"
    "svg .tick{font-size:10px;fill:#555}svg .label{font-size:11px;fill:#333}\n"
    "svg .straggler{fill:#b00020;font-weight:600}\n"
    "svg .series{fill:none;stroke-width:1.5}\n"
    "svg .ref{stroke:#444;stroke-dasharray:2,3}\n"
    "svg .box{fill:#e8eef8;stroke:#7a8fb5}svg .median{stroke:#000;stroke-width:2}\n"
    "svg .bar{fill:#7aa6d8}svg .bar.over{fill:#d62728}\n"
    "svg .span{opacity:.35}svg .empty{fill:#999}svg .failed{fill:#d62728;opacity:.6}\n"
    ".legend span{margin-right:12px;font-size:12px;white-space:nowrap}\n"
    ".legend i{display:inline-block;width:10px;height:10px;margin-right:4px}\n"
    "pre{background:#f7f7f7;padding:8px;overflow:auto;font-size:12px}\n";

typedef struct rh_args {
    const char *db;
    const int64_t *ids;
    size_t n;
} rh_args;

static dsim_err rh_render(FILE *out, void *arg)
{
    const rh_args *a = arg;
    if (a->n == 0)
        return DSIM_ERR(DSIM_EINVAL, -1, "no run to report; name a run id ('dsim list runs')");
    sqlite3 *h = NULL;
    dsim_err e = rp_db_open(a->db, &h);
    if (e != DSIM_OK)
        return e;
    rp_run *runs = calloc(a->n, sizeof *runs);
    if (!runs) {
        sqlite3_close(h);
        return DSIM_ERR(DSIM_ENOMEM, -1, "out of memory");
    }
    size_t loaded = 0;
    for (; loaded < a->n && e == DSIM_OK; loaded++)
        e = rp_run_load(h, a->db, a->ids[loaded], &runs[loaded]);
    sqlite3_close(h);
    if (e == DSIM_OK) {
        fputs("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n"
              "<meta name=\"viewport\" content=\"width=device-width,initial-scale=1\">\n<title>"
              "dsim report: ",
              out);
        for (size_t i = 0; i < a->n; i++) {
            fprintf(out, "%srun %" PRId64 " ", i ? ", " : "", runs[i].id);
            rh_esc(out, runs[i].scenario);
        }
        fprintf(out, "</title>\n<style>\n%s</style></head><body>\n<h1>dsim report: ", rh_style);
        if (a->n == 1) {
            fprintf(out, "run %" PRId64 " (", runs[0].id);
            rh_esc(out, runs[0].scenario);
            fputs(")", out);
        } else {
            fprintf(out, "%zu runs compared", a->n);
        }
        fputs("</h1>\n<p class=\"note\">from <code>", out);
        rh_esc(out, a->db);
        fputs("</code>; times are on each run's engine clock, from its first record.</p>\n", out);
        if (a->n > 1)
            rh_compare(out, runs, a->n);
        fprintf(out,
                "<div class=\"runs\" style=\"grid-template-columns:repeat(%zu,minmax(520px,1fr))"
                "\">\n",
                a->n);
        for (size_t i = 0; i < a->n; i++)
            rh_run_section(out, &runs[i]);
        fputs("</div>\n</body></html>\n", out);
    }
    for (size_t i = 0; i < loaded; i++)
        rp_run_free(&runs[i]);
    free(runs);
    return e;
}

dsim_err dsim_report_html(const char *db_path, const int64_t *ids, size_t n, FILE *out)
{
    rh_args a = {db_path, ids, n};
    return rh_render(out, &a);
}

dsim_err dsim_report_html_write(const char *db_path, const int64_t *ids, size_t n,
                                const char *out_path)
{
    rh_args a = {db_path, ids, n};
    return rp_write_file(out_path, rh_render, &a);
}
