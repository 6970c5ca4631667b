/* dsim report: runs of the results store as one self-contained HTML page.
 *
 * Everything is in the file: the style sheet inline, the plots inline SVG
 * drawn here (report_plot.c), no script, no font, no network. Every piece
 * of text that comes from the store (scenario names, messages, event
 * details, the scenario file) is escaped. Each plot's <svg> carries
 * data-points="N", the number of data points it draws, and data-breaks,
 * the breaks of its time axis, so a test (or a person) can tell an empty
 * plot from a drawn one.
 *
 * The page is one column as wide as the window (up to 1,600 px); each
 * plot takes the column's width. A page for one run:
 *
 *   run N: scenario — status, seed, engine, strategy, time, version, and
 *     beside it the checks (name, result, measured, expected, message)
 *   first divergent step (replicas' checksums there), when there is one
 *   cold-start phases per replica and attempt (when phases were stored)
 *   faults and recovery: a lane per replica with its attempts and events
 *     (a long stretch without records is a break of the time axis), and
 *     the events as a table (folded when many and the run passed)
 *   the reduced loss over steps with the one-device reference's; each
 *     replica's local loss on an axis of its own (a replica's loss is its
 *     share of the global batch's: the reduced loss is their sum)
 *   examples/s over time, at the end of each step (breaks as above)
 *   step time per replica (every step a dot, box = middle half, tick =
 *     median; a replica whose median is over 1.5x the others' stands out)
 *   all-reduce share of step time per replica (when collectives were
 *     stored); the replica that waits least is a straggler
 *   the scenario file
 *
 * Several runs: a table comparing them and their reduced losses on one
 * plot, then each run's page, one after another. */
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "report.h"
#include "report_int.h"
#include "report_plot.h"
#include "diag/flight.h"

#define RH_STRAGGLER      1.5  /* a replica's median step time over this times the others' */
#define RH_COMM_FLAG      0.20 /* all-reduce share ARCHITECTURE.md §8 flags */
#define RH_MAX_EVENT_ROWS 200
/* a replica whose collective share is under this times the others' */
#define RH_WAIT_STRAGGLER 0.5
/* step-time differences under this are scheduling noise on a shared host */
#define RH_NOISE_MS 0.1

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
    fputs("</span></h2>\n<div class=\"top\"><table class=\"kv\">", f);
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
    const rp_metric *mp = rp_metric_find(r, "mixed_precision");
    if (mp && mp->unit) {
        const rp_metric *gd = rp_metric_find(r, "gradient_dtype");
        const rp_metric *sk = rp_metric_find(r, "skipped_steps");
        fputs("</td></tr><tr><th>precision</th><td>", f);
        rh_esc(f, mp->unit);
        if (gd && gd->unit) {
            fputs(", gradients all-reduced in ", f);
            rh_esc(f, gd->unit);
        }
        if (sk && sk->has_value)
            fprintf(f, ", %.0f step(s) skipped (non-finite gradient)", sk->value);
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
        {"final_loss_scale", "loss scale at the end"},
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

/* Loss: the reduced loss (what the strategy reports, one line per
 * attempt) with the one-device reference's, then each replica's local loss
 * on an axis of its own: a replica's loss is its share of the global
 * batch's, so the reduced loss is their sum, some N times the size of
 * each. */
static void rh_loss(FILE *f, const rp_run *r)
{
    int R = r->n_replicas;
    size_t ns = (size_t)R + 2; /* the replicas, the reduced loss, the reference */
    size_t cap = r->n_steps * 2 + 1 > r->n_ref + 1 ? r->n_steps * 2 + 1 : r->n_ref + 1;
    rh_series *s = calloc(ns, sizeof *s);
    char(*names)[48] = calloc(ns, sizeof *names);
    int *last_att = calloc(ns, sizeof *last_att);
    bool ok = s && names && last_att;
    for (size_t k = 0; ok && k < ns; k++) {
        s[k].x = malloc(cap * sizeof(double));
        s[k].y = malloc(cap * sizeof(double));
        ok = s[k].x && s[k].y;
    }
    fputs("<h3>loss</h3>\n", f);
    if (!ok) {
        fputs("<p class=\"note\">out of memory drawing the loss</p>\n", f);
        goto out;
    }
    rh_series *red = &s[R], *ref = &s[R + 1];
    for (size_t k = 0; k < (size_t)R; k++) {
        snprintf(names[k], sizeof names[k], "replica %zu (local)", k);
        s[k].name = names[k];
        s[k].color = rh_color((int)k);
    }
    *red = (rh_series){.name = "reduced (all replicas)", .color = "#000", .x = red->x, .y = red->y};
    *ref = (rh_series){
        .name = "one-device reference", .color = "#888", .dash = "4,3", .x = ref->x, .y = ref->y};
    int64_t red_last = -1;
    for (size_t i = 0; i < r->n_steps; i++) {
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
            if (red->n && p->step <= red_last) {
                red->x[red->n] = NAN;
                red->y[red->n++] = NAN;
            }
            red->x[red->n] = (double)p->step;
            red->y[red->n++] = p->reduced;
            red_last = p->step;
        }
    }
    for (size_t i = 0; i < r->n_ref; i++) {
        ref->x[ref->n] = r->ref_step[i];
        ref->y[ref->n++] = r->ref_loss[i];
    }
    const rp_metric *fin = rp_metric_find(r, "reference_final_loss");
    rh_line_chart(f, "loss",
                  "the loss the strategy reports (reduced over the replicas; a restart "
                  "starts a new line) and the one-device reference's",
                  NULL, "global step", "loss", red, r->n_ref ? 2 : 1,
                  fin && fin->has_value ? fin->value : NAN, "one-device reference, final loss",
                  false, false);
    char note[256];
    snprintf(note, sizeof note,
             "On an axis of its own: each replica's loss is its share of the global batch's "
             "(its examples' loss over the global batch), so the reduced loss above is the sum "
             "of these %d, about %d times the size of each.",
             R, R);
    rh_line_chart(f, "replicaloss", "each replica's local loss over steps", R > 1 ? note : NULL,
                  "global step", "local loss", s, (size_t)R, NAN, NULL, false, false);
out:
    for (size_t k = 0; s && k < ns; k++) {
        free(s[k].x);
        free(s[k].y);
    }
    free(s);
    free(names);
    free(last_att);
}

typedef struct rh_gstep {
    int attempt;
    int64_t step, t0, t1, examples;
} rh_gstep;

static int rh_cmp_gstep(const void *a, const void *b)
{
    const rh_gstep *x = a, *y = b;
    if (x->attempt != y->attempt)
        return x->attempt < y->attempt ? -1 : 1;
    return x->step < y->step ? -1 : x->step > y->step;
}

/* Examples/s over time: each global step (every replica's rows of it) ends
 * when its last replica ends it; the rate is the examples of a window of
 * steps over the time from the end of the step before the window to the
 * end of its last (a window of about a 48th of the steps, to smooth the
 * scheduling noise of one step). A restart starts a new line; a long
 * stretch without steps is a break of the time axis. */
static void rh_rate(FILE *f, const rp_run *r)
{
    rh_gstep *g = r->n_steps && r->has_times ? malloc(r->n_steps * sizeof *g) : NULL;
    size_t ng = 0;
    for (size_t i = 0; g && i < r->n_steps; i++) {
        const rp_step *p = &r->steps[i];
        g[ng++] = (rh_gstep){p->attempt, p->step, p->t0, p->t1, p->examples};
    }
    if (g)
        qsort(g, ng, sizeof *g, rh_cmp_gstep);
    size_t k = 0; /* merge a step's rows */
    for (size_t i = 0; i < ng; i++) {
        if (k && g[k - 1].attempt == g[i].attempt && g[k - 1].step == g[i].step) {
            g[k - 1].t0 = g[i].t0 < g[k - 1].t0 ? g[i].t0 : g[k - 1].t0;
            g[k - 1].t1 = g[i].t1 > g[k - 1].t1 ? g[i].t1 : g[k - 1].t1;
            g[k - 1].examples += g[i].examples;
        } else {
            g[k++] = g[i];
        }
    }
    size_t win = k / 48 > 1 ? k / 48 : 1;
    double *x = malloc((k + 1) * 2 * sizeof *x), *y = x ? x + k + 1 : NULL;
    size_t n = 0;
    for (size_t i = 0; x && i < k; i++) {
        /* the window (i - win, i] of this attempt */
        size_t first = i + 1 >= win ? i + 1 - win : 0;
        while (g[first].attempt != g[i].attempt)
            first++;
        if (first == i && i && g[i - 1].attempt != g[i].attempt && n) {
            x[n] = NAN; /* a restart */
            y[n++] = NAN;
        }
        int64_t from =
            first > 0 && g[first - 1].attempt == g[i].attempt ? g[first - 1].t1 : g[first].t0;
        int64_t ex = 0;
        for (size_t j = first; j <= i; j++)
            ex += g[j].examples;
        if (g[i].t1 <= from)
            continue;
        x[n] = rh_sec(r, g[i].t1);
        y[n++] = (double)ex / ((double)(g[i].t1 - from) / 1e9);
    }
    rh_series s = {
        .name = "examples/s (all replicas)", .color = rh_color(0), .x = x, .y = y, .n = x ? n : 0};
    fputs("<h3>throughput</h3>\n", f);
    rh_line_chart(f, "rate",
                  "examples/s over time, at the end of each step (a restart starts a new line; "
                  "a long stretch without steps is a break of the time axis, marked with its "
                  "length)",
                  NULL, "seconds since the run's first record", "examples/s", &s, 1, NAN, NULL,
                  true, true);
    free(x);
    free(g);
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
        fprintf(f, "<text class=\"tick%s\" x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%d%s%s</text>",
                strag ? " straggler" : "", RH_ML - 6, yc + 4, k, strag ? " slow" : "",
                strag ? "<title>a straggler: its median step time is over 1.5x the others'"
                        "</title>"
                      : "");
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

static size_t rh_events_count(const rp_run *r)
{
    size_t n = 0;
    for (size_t i = 0; i < r->n_events; i++)
        n += strcmp(r->events[i].kind, "phase") != 0;
    return n;
}

/* The events are shown open when they are few or tell of a failure. */
static bool rh_events_open(const rp_run *r)
{
    if (rh_events_count(r) <= 8)
        return true;
    return r->status && strcmp(r->status, "passed") != 0;
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

/* The timeline's breaks: stretches without a step's start or end, an
 * event or a failed collective's start or end. */
static void rh_timeline_breaks(const rp_run *r, rh_chart *c)
{
    size_t cap = 2 * r->n_steps + r->n_events + 2 * r->n_colls, n = 0;
    double *t = cap ? malloc(cap * sizeof *t) : NULL;
    if (!t)
        return;
    for (size_t i = 0; i < r->n_steps; i++) {
        t[n++] = rh_sec(r, r->steps[i].t0);
        t[n++] = rh_sec(r, r->steps[i].t1);
    }
    for (size_t i = 0; i < r->n_events; i++)
        if (strcmp(r->events[i].kind, "phase") != 0)
            t[n++] = rh_sec(r, r->events[i].t);
    for (size_t i = 0; i < r->n_colls; i++)
        if (r->colls[i].status != 0) {
            t[n++] = rh_sec(r, r->colls[i].t0);
            t[n++] = rh_sec(r, r->colls[i].t1);
        }
    rh_time_breaks(c, t, n);
    free(t);
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
    rh_timeline_breaks(r, &c);
    fputs("<figure><figcaption>a lane per replica: bars are runs of steps (one per attempt), "
          "thin red bars collectives that failed (from the call to the error), marks are "
          "events (red fault, orange error, green restart, blue checkpoint); a long stretch "
          "without records is a break of the time axis, marked with its length</figcaption>",
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
            fprintf(f,
                    "<details class=\"events\"%s><summary>events (%zu)</summary>"
                    "<table class=\"events\"><tr><th>time (s)</th><th>replica</th><th>kind</th>"
                    "<th>detail</th></tr>\n",
                    rh_events_open(r) ? " open" : "", rh_events_count(r));
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
        fputs("</table></details>\n", f);
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
    fputs("<div class=\"checkbox\">", f);
    rh_checks(f, r);
    fputs("</div></div>\n", f);
    rh_divergence(f, r);
    rh_desync(f, r);
    /* the tables before the plots: a page's first screens hold every
     * verdict and figure; then what happened first (why a run failed) */
    rh_cold_start(f, r);
    rh_timeline(f, r);
    rh_loss(f, r);
    rh_rate(f, r);
    rh_step_times(f, r);
    rh_comm_share(f, r);
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
        rh_line_chart(f, "loss", "reduced loss of each run over steps", NULL, "global step", "loss",
                      s, n, NAN, NULL, false, false);
    for (size_t i = 0; s && i < n; i++) {
        free(s[i].x);
        free(s[i].y);
    }
    free(s);
    free(names);
    fputs("</section>\n", f);
}

/* One column, as wide as the window (up to 1,600 px): the plots take its
 * width (their text then about the page's size), runs come one after
 * another, and long words in tables wrap instead of widening the page. */
static const char rh_style[] =
    "body{font:15px/1.45 system-ui,-apple-system,'Segoe UI',sans-serif;margin:0 auto;"
    "padding:16px;max-width:1600px;color:#222;background:#fff}\n"
    "h1{font-size:22px;margin:4px 0 8px}h2{font-size:19px;margin-top:20px}"
    "h3{font-size:16px;margin:18px 0 6px}\n"
    ".runs{display:block}\n"
    "section.run{min-width:0;border-top:3px solid #ddd;margin-top:28px;padding-top:4px}\n"
    ".top{display:flex;flex-wrap:wrap;gap:8px 32px;align-items:flex-start}\n"
    ".top>table.kv{flex:0 0 auto}.top>.checkbox{flex:1 1 560px;min-width:0}\n"
    "table{border-collapse:collapse;margin:4px 0;max-width:100%}td,th{border:1px solid #ddd;"
    "padding:3px 8px;text-align:left;vertical-align:top}\n"
    "td:last-child{overflow-wrap:anywhere}th{white-space:nowrap}\n"
    "table.kv th{background:#f5f5f5;font-weight:600;white-space:nowrap}\n"
    "tr.pass td:nth-child(2){color:#207020;font-weight:600}\n"
    "tr.fail td:nth-child(2){color:#b00020;font-weight:600}\n"
    "tr.ev-fault td{background:#fdecea}tr.ev-error td{background:#fff4e5}\n"
    ".status{padding:1px 8px;border-radius:8px;font-size:14px;background:#eee}\n"
    ".s-passed{background:#d8f0d8}.s-failed,.s-crashed,.s-hung,.s-error{background:#f8d0d0}\n"
    ".note{color:#555}.bad{color:#b00020}\n"
    "figure{margin:8px 0 16px}figcaption{font-size:14px;color:#444}"
    "figure>.note{margin:2px 0;font-size:14px}\n"
    "svg.plot{width:100%;height:auto;display:block}\n"
    "svg .frame{fill:none;stroke:#999}svg .grid{stroke:#eee}\n"
    "svg .tick{font-size:13px;fill:#555}svg .label{font-size:14px;fill:#333}\n"
    "svg .straggler{fill:#b00020;font-weight:600}\n"
    "svg .series{fill:none;stroke-width:2}\n"
    "svg .ref{stroke:#444;stroke-dasharray:2,3}\n"
    "svg .box{fill:#e8eef8;stroke:#7a8fb5}svg .median{stroke:#000;stroke-width:2}\n"
    "svg .bar{fill:#7aa6d8}svg .bar.over{fill:#d62728}\n"
    "svg .span{opacity:.35}svg .empty{fill:#999}svg .failed{fill:#d62728;opacity:.6}\n"
    "svg .break rect{fill:#f0f0f0}svg .break path{stroke:#555;stroke-width:1.5;fill:none}"
    "svg .break text{font-size:12px;fill:#555}\n"
    ".legend span{margin-right:14px;font-size:13px;white-space:nowrap;display:inline-block}\n"
    ".legend i{display:inline-block;width:10px;height:10px;margin-right:4px}\n"
    "details.events summary{cursor:pointer;color:#444}\n"
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
        fputs("<div class=\"runs\">\n", out);
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
