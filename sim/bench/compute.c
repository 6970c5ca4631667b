/* The models' compute benchmark (compute.h). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench/compute.h"
#include "dsim/model.h"
#include "dsim/optim.h"
#include "dsim/rng.h"
#include "dsim_config.h"
#if DSIM_HAVE_BLAS
#include <cblas.h>
#endif

/* A model the catalogue trains, with the batch of one replica and the
 * global batch (what the one-device reference computes in one call). */
typedef struct bm_shape {
    const char *where;
    dsim_model_kind kind;
    size_t in, out, n_hidden, h0, h1;
    size_t replica_batch, global_batch;
} bm_shape;

static const bm_shape bm_shapes[] = {
    {"quickstart", DSIM_MODEL_SOFTMAX, 8, 4, 0, 0, 0, 8, 32},
    {"cold_start, faults", DSIM_MODEL_SOFTMAX, 64, 8, 0, 0, 0, 8, 32},
    {"one_device (adam)", DSIM_MODEL_MLP, 8, 4, 1, 16, 0, 32, 32},
    {"checkpoint_roundtrip", DSIM_MODEL_MLP, 32, 8, 2, 64, 64, 64, 256},
    {"mirrored (1 M params)", DSIM_MODEL_MLP, 64, 8, 2, 1024, 1024, 8, 32},
    {"whatif mlp_4x2", DSIM_MODEL_MLP, 64, 8, 2, 256, 256, 32, 256},
    {"scale mlp_1024x100", DSIM_MODEL_MLP, 120, 16, 2, 256, 128, 4, 4096},
    {"bench sim_scale", DSIM_MODEL_SOFTMAX, 1023, 64, 0, 0, 0, 1, 1024},
};
#define BM_N_SHAPES (sizeof bm_shapes / sizeof bm_shapes[0])

static double bm_cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

typedef struct bm_case {
    dsim_model_spec spec;
    size_t n, P;
    float *params, *x, *y, *grad;
} bm_case;

static int bm_case_make(bm_case *c, const bm_shape *sh, size_t n)
{
    memset(c, 0, sizeof *c);
    c->spec.kind = sh->kind;
    c->spec.in_dim = sh->in;
    c->spec.out_dim = sh->out;
    c->spec.n_hidden = sh->n_hidden;
    c->spec.hidden[0] = sh->h0;
    c->spec.hidden[1] = sh->h1;
    c->n = n;
    c->P = dsim_model_num_params(&c->spec);
    size_t yd = dsim_model_y_dim(&c->spec);
    c->params = malloc(c->P * sizeof(float));
    c->grad = calloc(c->P, sizeof(float));
    c->x = malloc(n * sh->in * sizeof(float));
    c->y = malloc(n * yd * sizeof(float));
    if (!c->P || !c->params || !c->grad || !c->x || !c->y)
        return -1;
    dsim_rng r;
    dsim_rng_init(&r, 26, "bench.model", 0);
    if (dsim_model_init(&c->spec, c->params, &r) != DSIM_OK)
        return -1;
    for (size_t i = 0; i < n * sh->in; i++)
        c->x[i] = (float)dsim_rng_normal(&r);
    for (size_t e = 0; e < n; e++)
        c->y[e] = (float)dsim_rng_below(&r, sh->out);
    return 0;
}

static void bm_case_free(bm_case *c)
{
    free(c->params);
    free(c->x);
    free(c->y);
    free(c->grad);
}

/* Floating-point operations of one loss_grad call: every layer's forward
 * product and weight gradient, and the deltas of every layer but the
 * first, 2 in out n each (biases, activations and the loss not counted). */
static double bm_flops(const bm_case *c)
{
    dsim_model_layout lay;
    if (dsim_model_layout_of(&c->spec, &lay) != DSIM_OK)
        return 0;
    double f = 0;
    for (size_t l = 0; l < lay.n_layers; l++)
        f += 2.0 * (double)lay.layer[l].in * (double)lay.layer[l].out * (double)c->n *
             (l == 0 ? 2.0 : 3.0);
    return f;
}

/* ---- the ways dsim does not compute them (--compare) --------------------- */

/* The loss of one example from its outputs z, and d loss / d z. */
static double bm_top(const dsim_model_spec *s, const double *z, const float *y, double *delta)
{
    size_t out = s->out_dim, c = (size_t)y[0];
    double m = z[0], se = 0.0;
    for (size_t j = 1; j < out; j++)
        m = z[j] > m ? z[j] : m;
    for (size_t j = 0; j < out; j++)
        se += exp(z[j] - m);
    double lse = m + log(se);
    for (size_t j = 0; j < out; j++)
        delta[j] = exp(z[j] - lse) - (j == c ? 1.0 : 0.0);
    return lse - z[c];
}

/* "loops": one example at a time, every sum a plain loop in double. */
static void bm_loops(const bm_case *c, double *ws)
{
    dsim_model_layout lay;
    (void)dsim_model_layout_of(&c->spec, &lay);
    size_t L = lay.n_layers, widest = 0;
    for (size_t l = 0; l < L; l++)
        widest = lay.layer[l].out > widest ? lay.layer[l].out : widest;
    widest = lay.layer[0].in > widest ? lay.layer[0].in : widest;
    double *acc = ws, *a[4], *z[4], *d0 = ws + c->P, *d1 = d0 + widest;
    double *p = d1 + widest;
    for (size_t l = 0; l < L; l++) {
        a[l] = p;
        p += lay.layer[l].in;
        z[l] = p;
        p += lay.layer[l].out;
    }
    memset(acc, 0, c->P * sizeof(double));
    for (size_t e = 0; e < c->n; e++) {
        for (size_t i = 0; i < lay.layer[0].in; i++)
            a[0][i] = c->x[e * lay.layer[0].in + i];
        for (size_t l = 0; l < L; l++) {
            const dsim_model_layer *Y = &lay.layer[l];
            for (size_t j = 0; j < Y->out; j++) {
                double s = c->params[Y->b_off + j];
                for (size_t i = 0; i < Y->in; i++)
                    s += (double)c->params[Y->w_off + j * Y->in + i] * a[l][i];
                z[l][j] = s;
                if (l + 1 < L)
                    a[l + 1][j] = s > 0.0 ? s : 0.0;
            }
        }
        double *delta = d0, *below = d1;
        (void)bm_top(&c->spec, z[L - 1], c->y + e, delta);
        for (size_t l = L; l-- > 0;) {
            const dsim_model_layer *Y = &lay.layer[l];
            for (size_t j = 0; j < Y->out; j++) {
                acc[Y->b_off + j] += delta[j];
                for (size_t i = 0; i < Y->in; i++)
                    acc[Y->w_off + j * Y->in + i] += delta[j] * a[l][i];
            }
            if (l == 0)
                break;
            for (size_t i = 0; i < Y->in; i++)
                below[i] = 0.0;
            for (size_t j = 0; j < Y->out; j++)
                for (size_t i = 0; i < Y->in; i++)
                    below[i] += (double)c->params[Y->w_off + j * Y->in + i] * delta[j];
            for (size_t i = 0; i < Y->in; i++)
                below[i] = z[l - 1][i] > 0.0 ? below[i] : 0.0;
            double *t = delta;
            delta = below;
            below = t;
        }
    }
    for (size_t k = 0; k < c->P; k++)
        c->grad[k] = (float)(0.0 + 1e-3 * acc[k]);
}

static size_t bm_loops_ws(const bm_case *c)
{
    dsim_model_layout lay;
    (void)dsim_model_layout_of(&c->spec, &lay);
    size_t w = lay.layer[0].in;
    for (size_t l = 0; l < lay.n_layers; l++)
        w += 2 * (lay.layer[l].in + lay.layer[l].out);
    return c->P + w;
}

#if DSIM_HAVE_BLAS
/* "openblas": each layer a dgemm over the whole batch, the float
 * parameters converted to double first (every call: they change every
 * step). */
static void bm_blas(const bm_case *c, double *ws)
{
    dsim_model_layout lay;
    (void)dsim_model_layout_of(&c->spec, &lay);
    size_t L = lay.n_layers, n = c->n;
    double *Wd = ws, *acc = ws + c->P, *p = acc + c->P, *a[4], *z[4];
    for (size_t k = 0; k < c->P; k++)
        Wd[k] = c->params[k];
    for (size_t l = 0; l < L; l++) {
        a[l] = p;
        p += n * lay.layer[l].in;
        z[l] = p;
        p += n * lay.layer[l].out;
    }
    size_t widest = 0;
    for (size_t l = 0; l < L; l++) {
        widest = lay.layer[l].out > widest ? lay.layer[l].out : widest;
        widest = lay.layer[l].in > widest ? lay.layer[l].in : widest;
    }
    double *d0 = p, *d1 = p + n * widest;
    for (size_t i = 0; i < n * lay.layer[0].in; i++)
        a[0][i] = c->x[i];
    for (size_t l = 0; l < L; l++) {
        const dsim_model_layer *Y = &lay.layer[l];
        for (size_t e = 0; e < n; e++)
            for (size_t j = 0; j < Y->out; j++)
                z[l][e * Y->out + j] = Wd[Y->b_off + j];
        cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)n, (int)Y->out, (int)Y->in, 1.0,
                    a[l], (int)Y->in, Wd + Y->w_off, (int)Y->in, 1.0, z[l], (int)Y->out);
        if (l + 1 < L)
            for (size_t k = 0; k < n * Y->out; k++)
                a[l + 1][k] = z[l][k] > 0.0 ? z[l][k] : 0.0;
    }
    size_t top = lay.layer[L - 1].out;
    for (size_t e = 0; e < n; e++)
        (void)bm_top(&c->spec, z[L - 1] + e * top, c->y + e, d0 + e * top);
    double *delta = d0, *below = d1;
    memset(acc, 0, c->P * sizeof(double));
    for (size_t l = L; l-- > 0;) {
        const dsim_model_layer *Y = &lay.layer[l];
        cblas_dgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)Y->out, (int)Y->in, (int)n, 1.0,
                    delta, (int)Y->out, a[l], (int)Y->in, 0.0, acc + Y->w_off, (int)Y->in);
        for (size_t e = 0; e < n; e++)
            for (size_t j = 0; j < Y->out; j++)
                acc[Y->b_off + j] += delta[e * Y->out + j];
        if (l == 0)
            break;
        cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)n, (int)Y->in, (int)Y->out, 1.0,
                    delta, (int)Y->out, Wd + Y->w_off, (int)Y->in, 0.0, below, (int)Y->in);
        for (size_t k = 0; k < n * Y->in; k++)
            below[k] = z[l - 1][k] > 0.0 ? below[k] : 0.0;
        double *t = delta;
        delta = below;
        below = t;
    }
    for (size_t k = 0; k < c->P; k++)
        c->grad[k] = (float)(0.0 + 1e-3 * acc[k]);
}

static size_t bm_blas_ws(const bm_case *c)
{
    dsim_model_layout lay;
    (void)dsim_model_layout_of(&c->spec, &lay);
    size_t widest = 0, acts = 0;
    for (size_t l = 0; l < lay.n_layers; l++) {
        widest = lay.layer[l].out > widest ? lay.layer[l].out : widest;
        widest = lay.layer[l].in > widest ? lay.layer[l].in : widest;
        acts += lay.layer[l].in + lay.layer[l].out;
    }
    return 2 * c->P + c->n * (acts + 2 * widest);
}

double dsim_bench_compute_peak(size_t m, const char **core)
{
    float *a = malloc(m * m * sizeof(float)), *b = malloc(m * m * sizeof(float));
    float *cc = malloc(m * m * sizeof(float));
    double best = 0;
    if (a && b && cc) {
        for (size_t i = 0; i < m * m; i++) {
            a[i] = (float)(i % 7) * 0.25f;
            b[i] = (float)(i % 5) * 0.5f;
        }
        for (int r = 0; r < 4; r++) {
            double t0 = bm_cpu_s();
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)m, (int)m, (int)m, 1.0f, a,
                        (int)m, b, (int)m, 0.0f, cc, (int)m);
            double g = 2.0 * (double)m * (double)m * (double)m / (bm_cpu_s() - t0) / 1e9;
            if (r > 0 && g > best) /* the first call warms up */
                best = g;
        }
    }
    free(a);
    free(b);
    free(cc);
    *core = openblas_get_corename();
    return best;
}
#else
double dsim_bench_compute_peak(size_t m, const char **core)
{
    (void)m;
    *core = NULL;
    return 0;
}
#endif

/* ---- timing ---------------------------------------------------------------- */

enum { BM_KERNELS, BM_LOOPS, BM_BLAS };

static void bm_call(int how, bm_case *c, double *ws)
{
    switch (how) {
    case BM_KERNELS:
        (void)dsim_model_loss_grad_set(&c->spec, c->params, c->x, c->y, c->n, 1e-3f, c->grad, NULL);
        break;
    case BM_LOOPS:
        bm_loops(c, ws);
        break;
#if DSIM_HAVE_BLAS
    case BM_BLAS:
        bm_blas(c, ws);
        break;
#endif
    default:
        break;
    }
}

/* CPU seconds per call: the best of 3 runs of at least min_s each. */
static double bm_time(int how, bm_case *c, double *ws, double min_s)
{
    double best = INFINITY;
    bm_call(how, c, ws);
    for (int r = 0; r < 3; r++) {
        size_t calls = 0;
        double t0 = bm_cpu_s(), t;
        do {
            bm_call(how, c, ws);
            calls++;
            t = bm_cpu_s() - t0;
        } while (t < min_s);
        if (t / (double)calls < best)
            best = t / (double)calls;
    }
    return best;
}

/* The optimizers on the 1024 x 100 job's parameters: nanoseconds per
 * parameter and bytes moved per second (read and write). */
static int bm_optim(const dsim_bench_compute *b)
{
    double min_s = b->min_s;
    int rc = 0;
    const size_t P = 65936;
    float *p = calloc(P, sizeof(float)), *g = calloc(P, sizeof(float));
    if (!p || !g) {
        free(p);
        free(g);
        return 1;
    }
    for (size_t k = 0; k < P; k++)
        g[k] = (float)(k % 13) * 1e-3f;
    static const struct {
        dsim_optim_kind kind;
        double bytes; /* per parameter: params, gradient, slots, read and written */
    } opts[] = {{DSIM_OPTIM_SGD, 12},     {DSIM_OPTIM_MOMENTUM, 20}, {DSIM_OPTIM_ADAM, 28},
                {DSIM_OPTIM_RMSPROP, 20}, {DSIM_OPTIM_ADAGRAD, 20},  {DSIM_OPTIM_LION, 20},
                {DSIM_OPTIM_ADAMAX, 28},  {DSIM_OPTIM_LAMB, 28},     {DSIM_OPTIM_NADAM, 28},
                {DSIM_OPTIM_ADADELTA, 28}};
    for (size_t i = 0; i < sizeof opts / sizeof opts[0] && rc == 0; i++) {
        dsim_optim_spec sp;
        dsim_optim_spec_default(&sp, opts[i].kind);
        dsim_optim *o = NULL;
        if (dsim_optim_create(&sp, P, &o) != DSIM_OK)
            continue;
        double best = INFINITY;
        for (int r = 0; r < 3; r++) {
            size_t calls = 0;
            double t0 = bm_cpu_s(), t;
            do {
                (void)dsim_optim_apply(o, p, g, P);
                calls++;
                t = bm_cpu_s() - t0;
            } while (t < min_s);
            best = t / (double)calls < best ? t / (double)calls : best;
        }
        dsim_optim_destroy(o);
        dsim_bench_optim_row row = {
            .kind = dsim_optim_kind_name(opts[i].kind),
            .params = P,
            .ns_per_param = best / (double)P * 1e9,
            .gbytes_s = opts[i].bytes * (double)P / best / 1e9,
        };
        rc = b->on_optim ? b->on_optim(&row, b->user) : 0;
    }
    free(p);
    free(g);
    return rc;
}

/* The model column: "mlp 120-256-128-16". */
static void bm_model_name(const bm_shape *sh, char *buf, size_t cap)
{
    if (sh->n_hidden == 0)
        snprintf(buf, cap, "%s %zu-%zu", dsim_model_kind_name(sh->kind), sh->in, sh->out);
    else if (sh->n_hidden == 1)
        snprintf(buf, cap, "mlp %zu-%zu-%zu", sh->in, sh->h0, sh->out);
    else
        snprintf(buf, cap, "mlp %zu-%zu-%zu-%zu", sh->in, sh->h0, sh->h1, sh->out);
}

static int bm_emit(const dsim_bench_compute *b, const bm_shape *sh, bm_case *c, int how,
                   const char *name, double *ws)
{
    dsim_bench_compute_row row = {
        .scenario = sh->where,
        .params = c->P,
        .batch = c->n,
        .how = name,
    };
    bm_model_name(sh, row.model, sizeof row.model);
    row.s_per_call = bm_time(how, c, ws, b->min_s);
    row.gflops = bm_flops(c) / row.s_per_call / 1e9;
    return b->on_row ? b->on_row(&row, b->user) : 0;
}

/* One shape at one batch: every kernel set, then the comparisons. */
static int bm_case_run(const dsim_bench_compute *b, const bm_shape *sh, size_t n)
{
    bm_case c;
    if (bm_case_make(&c, sh, n) != 0) {
        bm_case_free(&c);
        return 1;
    }
    int rc = 0;
    for (size_t k = 0; k < b->n_kernels && rc == 0; k++) {
        if (dsim_model_kernels_use(b->kernels[k]) != DSIM_OK)
            continue;
        rc = bm_emit(b, sh, &c, BM_KERNELS, dsim_model_kernels(), NULL);
    }
    if (b->compare && rc == 0) {
        double *ws = malloc(bm_loops_ws(&c) * sizeof(double));
        rc = ws ? bm_emit(b, sh, &c, BM_LOOPS, "loops", ws) : 1;
        free(ws);
#if DSIM_HAVE_BLAS
        ws = rc == 0 ? malloc(bm_blas_ws(&c) * sizeof(double)) : NULL;
        if (rc == 0)
            rc = ws ? bm_emit(b, sh, &c, BM_BLAS, "openblas", ws) : 1;
        free(ws);
#endif
    }
    bm_case_free(&c);
    return rc;
}

int dsim_bench_compute_run(const dsim_bench_compute *b)
{
    char keep[16];
    snprintf(keep, sizeof keep, "%s", dsim_model_kernels());
    int rc = 0;
    for (size_t s = 0; s < BM_N_SHAPES && rc == 0; s++) {
        const bm_shape *sh = &bm_shapes[s];
        rc = bm_case_run(b, sh, sh->replica_batch);
        if (rc == 0 && sh->global_batch != sh->replica_batch)
            rc = bm_case_run(b, sh, sh->global_batch);
        (void)dsim_model_kernels_use(keep);
    }
    return rc ? rc : bm_optim(b);
}
