/* Inside sim/report: the inline SVG plots of the HTML report.
 *
 * A plot is drawn in a coordinate system RH_W units wide and scaled by the
 * page to the width of its column (the style sheet gives it width 100%),
 * so the units are about pixels on a page some 1,200 to 1,400 pixels wide
 * and the text stays readable when the page is that wide.
 *
 * A time axis may have breaks: where nothing happened for a long stretch
 * (a second of failure detection between steps of a few milliseconds), the
 * stretch is drawn RH_BREAK_W units wide with a mark and its length
 * ("1.04 s without records") instead of squashing everything else into
 * spikes at both ends. rh_time_breaks finds such stretches. */
#ifndef DSIM_REPORT_PLOT_H
#define DSIM_REPORT_PLOT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#define RH_W          1200
#define RH_H          280
#define RH_ML         80 /* margins: left, right, top, bottom */
#define RH_MR         20
#define RH_MT         24
#define RH_MB         44
#define RH_BREAK_W    40 /* a break in the x axis */
#define RH_MAX_BREAKS 3
#define RH_MAX_POINTS 2000 /* per polyline; more are thinned evenly */

/* A stretch of the x axis drawn as a break: (a, b) in data units. */
typedef struct rh_break {
    double a, b;
} rh_break;

typedef struct rh_chart {
    double x0, x1, y0, y1; /* data range */
    int w, h;
    rh_break brk[RH_MAX_BREAKS]; /* in order, inside (x0, x1) */
    int n_brk;
} rh_chart;

void rh_esc(FILE *f, const char *s);
const char *rh_color(int i);

/* Data to plot coordinates (through the breaks). */
double rh_px(const rh_chart *c, double x);
double rh_py(const rh_chart *c, double y);

/* A tick spacing of 1, 2 or 5 times a power of ten giving about n ticks. */
double rh_tick(double lo, double hi, int n);
/* Pads a value range (and widens an empty one); from_zero keeps 0 in it. */
void rh_range_fix(double *lo, double *hi, bool from_zero);

/* Stretches of more than a quarter of [x0, x1] without any of the n
 * times t[] (sorted in place), at most RH_MAX_BREAKS, the longest, as
 * breaks of c (a little of each end kept, so the points beside a break
 * stay in sight). */
void rh_time_breaks(rh_chart *c, double *t, size_t n);

void rh_svg_open(FILE *f, const rh_chart *c, const char *cls, size_t points, const char *title);
/* The frame, the x ticks (each stretch between breaks its own), the y
 * ticks (y_ticks), the labels, and a mark for each break. */
void rh_axes(FILE *f, const rh_chart *c, const char *xlabel, const char *ylabel, bool y_ticks);

/* A series: points (x[i], y[i]); a NaN y breaks the line. */
typedef struct rh_series {
    const char *name;
    const char *color;
    const char *dash; /* stroke-dasharray or NULL */
    double *x, *y;
    size_t n;
} rh_series;

size_t rh_series_points(const rh_series *s);
/* The series as polylines; a line is broken at a NaN and across a break
 * of the x axis. */
void rh_polylines(FILE *f, const rh_chart *c, const rh_series *s);
void rh_legend(FILE *f, const rh_series *s, size_t n, const char *extra_name,
               const char *extra_color);

/* A line chart of the series in a <figure> with `title` as its caption
 * (escaped) and `note` after it (HTML, may be NULL); hline (finite) adds a
 * dotted horizontal line named hline_name. breaks: the x axis is time, and
 * long stretches without points are drawn as breaks. */
void rh_line_chart(FILE *f, const char *cls, const char *title, const char *note,
                   const char *xlabel, const char *ylabel, const rh_series *s, size_t n,
                   double hline, const char *hline_name, bool from_zero, bool breaks);

#endif
