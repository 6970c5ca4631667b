/* A model plugin (dsim/spi/model.h): a one-dimensional convolution.
 *
 * Each example's in_dim features are read as a signal x[0..L). CONV_K
 * filters of width CONV_W slide over it (valid positions t = 0..M-1,
 * M = L - CONV_W + 1), each with a bias, then a ReLU; a dense layer maps the
 * K x M activations to out_dim logits; the loss is softmax cross-entropy
 * with integer class labels.
 *
 * Parameters, one float vector:
 *   cw  K x W   filter k's tap w at k*W + w
 *   cb  K       the filters' biases
 *   dw  out x (K*M), row-major: logit j's weight for activation (k, t) at
 *               off_dw + j*K*M + k*M + t
 *   db  out
 *
 * What dsim asks of a plugin: a table with size first and the required
 * members; deterministic results (every sum here runs in a fixed order, in
 * double); no mutable global state (it is called from several threads at
 * once). Build it as a shared module against libdsim's headers and name it
 * in a scenario: `model: {plugin: path/to/libconv1d_model.so}`. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsim/spi/model.h"

#define CONV_K 4
#define CONV_W 3

typedef struct conv_dims {
    size_t L, M, out, n_act;          /* signal, positions, classes, K*M */
    size_t off_cb, off_dw, off_db, n; /* offsets and the total */
} conv_dims;

static int conv_dims_of(const dsim_model_spec *spec, conv_dims *d)
{
    if (spec->in_dim < CONV_W)
        return 0;
    d->L = spec->in_dim;
    d->M = d->L - CONV_W + 1;
    d->out = spec->out_dim;
    d->n_act = (size_t)CONV_K * d->M;
    d->off_cb = (size_t)CONV_K * CONV_W;
    d->off_dw = d->off_cb + CONV_K;
    d->off_db = d->off_dw + d->out * d->n_act;
    d->n = d->off_db + d->out;
    return 1;
}

static size_t conv_num_params(const dsim_model_spec *spec, char *why, size_t cap)
{
    conv_dims d;
    if (!conv_dims_of(spec, &d)) {
        snprintf(why, cap, "a signal of %zu features is shorter than the filters' width %d",
                 spec->in_dim, CONV_W);
        return 0;
    }
    return d.n;
}

/* splitmix64: the plugin's own stream from dsim's seed. */
static uint64_t conv_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static double conv_uniform(uint64_t *s, double limit)
{
    return ((double)(conv_next(s) >> 11) / 9007199254740992.0 * 2.0 - 1.0) * limit;
}

static dsim_err conv_init(const dsim_model_spec *spec, float *p, uint64_t seed)
{
    conv_dims d;
    if (!conv_dims_of(spec, &d))
        return DSIM_ERR(DSIM_EINVAL, -1, "conv1d: in_dim %zu < %d", spec->in_dim, CONV_W);
    uint64_t s = seed;
    double lc = sqrt(6.0 / (CONV_W + 1)), ld = sqrt(6.0 / (double)(d.n_act + d.out));
    for (size_t i = 0; i < d.off_cb; i++)
        p[i] = (float)conv_uniform(&s, lc);
    memset(p + d.off_cb, 0, CONV_K * sizeof *p);
    for (size_t i = 0; i < d.out * d.n_act; i++)
        p[d.off_dw + i] = (float)conv_uniform(&s, ld);
    memset(p + d.off_db, 0, d.out * sizeof *p);
    return DSIM_OK;
}

/* One example forward: h (pre-activation, K*M), a (ReLU), z (logits). */
static void conv_forward1(const conv_dims *d, const float *p, const float *x, double *h, double *a,
                          double *z)
{
    for (size_t k = 0; k < CONV_K; k++)
        for (size_t t = 0; t < d->M; t++) {
            double v = p[d->off_cb + k];
            for (size_t w = 0; w < CONV_W; w++)
                v += (double)p[k * CONV_W + w] * (double)x[t + w];
            h[k * d->M + t] = v;
            a[k * d->M + t] = v > 0 ? v : 0;
        }
    for (size_t j = 0; j < d->out; j++) {
        const float *row = p + d->off_dw + j * d->n_act;
        double v = p[d->off_db + j];
        for (size_t i = 0; i < d->n_act; i++)
            v += (double)row[i] * a[i];
        z[j] = v;
    }
}

typedef struct conv_ws {
    double *h, *a, *z, *da;
} conv_ws;

static dsim_err conv_ws_get(const conv_dims *d, conv_ws *ws)
{
    ws->h = malloc((2 * d->n_act + d->out + d->n_act) * sizeof(double));
    if (!ws->h)
        return DSIM_ERR(DSIM_ENOMEM, -1, "conv1d: out of memory");
    ws->a = ws->h + d->n_act;
    ws->z = ws->a + d->n_act;
    ws->da = ws->z + d->out;
    return DSIM_OK;
}

/* The example's gradient added to g, with dz the softmax minus the label. */
static void conv_backward1(const conv_dims *d, const float *p, const float *x, const conv_ws *ws,
                           double *g)
{
    const double *dz = ws->z;
    for (size_t i = 0; i < d->n_act; i++)
        ws->da[i] = 0;
    for (size_t j = 0; j < d->out; j++) {
        const float *row = p + d->off_dw + j * d->n_act;
        double *grow = g + d->off_dw + j * d->n_act;
        g[d->off_db + j] += dz[j];
        for (size_t i = 0; i < d->n_act; i++) {
            grow[i] += dz[j] * ws->a[i];
            ws->da[i] += dz[j] * (double)row[i];
        }
    }
    for (size_t k = 0; k < CONV_K; k++)
        for (size_t t = 0; t < d->M; t++) {
            double dh = ws->h[k * d->M + t] > 0 ? ws->da[k * d->M + t] : 0.0;
            g[d->off_cb + k] += dh;
            for (size_t w = 0; w < CONV_W; w++)
                g[k * CONV_W + w] += dh * (double)x[t + w];
        }
}

static dsim_err conv_loss_grad(const dsim_model_spec *spec, const float *p, const float *x,
                               const float *y, size_t n, double *loss_sum, double *g)
{
    conv_dims d;
    if (!conv_dims_of(spec, &d))
        return DSIM_ERR(DSIM_EINVAL, -1, "conv1d: in_dim %zu < %d", spec->in_dim, CONV_W);
    conv_ws ws = {0};
    DSIM_CHECK(conv_ws_get(&d, &ws));
    if (g)
        memset(g, 0, d.n * sizeof *g);
    double total = 0;
    for (size_t e = 0; e < n; e++) {
        conv_forward1(&d, p, x + e * d.L, ws.h, ws.a, ws.z);
        size_t label = (size_t)y[e];
        double mx = ws.z[0], s = 0;
        for (size_t j = 1; j < d.out; j++)
            mx = ws.z[j] > mx ? ws.z[j] : mx;
        for (size_t j = 0; j < d.out; j++)
            s += exp(ws.z[j] - mx);
        total += mx + log(s) - ws.z[label];
        if (!g)
            continue;
        for (size_t j = 0; j < d.out; j++)
            ws.z[j] = exp(ws.z[j] - mx) / s - (j == label ? 1.0 : 0.0);
        conv_backward1(&d, p, x + e * d.L, &ws, g);
    }
    free(ws.h);
    *loss_sum = total;
    return DSIM_OK;
}

static dsim_err conv_forward(const dsim_model_spec *spec, const float *p, const float *x, size_t n,
                             float *out)
{
    conv_dims d;
    if (!conv_dims_of(spec, &d))
        return DSIM_ERR(DSIM_EINVAL, -1, "conv1d: in_dim %zu < %d", spec->in_dim, CONV_W);
    conv_ws ws = {0};
    DSIM_CHECK(conv_ws_get(&d, &ws));
    for (size_t e = 0; e < n; e++) {
        conv_forward1(&d, p, x + e * d.L, ws.h, ws.a, ws.z);
        for (size_t j = 0; j < d.out; j++)
            out[e * d.out + j] = (float)ws.z[j];
    }
    free(ws.h);
    return DSIM_OK;
}

static const dsim_model_ops conv1d_ops = {
    .size = sizeof(dsim_model_ops),
    .name = "conv1d",
    .loss = DSIM_LOSS_XENT,
    .num_params = conv_num_params,
    .init = conv_init,
    .loss_grad = conv_loss_grad,
    .forward = conv_forward,
};

__attribute__((visibility("default"))) const dsim_model_ops *dsim_model_plugin(uint32_t *abi)
{
    *abi = DSIM_MODEL_ABI_VERSION;
    return &conv1d_ops;
}
