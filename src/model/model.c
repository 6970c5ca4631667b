/* Reference models: forward pass, exact gradients, initialisation.
 *
 * One routine serves all three kinds: a linear or softmax model is an MLP
 * without hidden layers, and only the loss at the top differs. Everything
 * between the float parameters and the float gradient is double so that the
 * gradient is the exact one rounded once, and so that a finite-difference
 * check can be made against the loss this file computes. */
#include <math.h>
#include <stdio.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "dsim/dtype.h"
#include "dsim/model.h"
#include "dsim/spi/model.h"
#include "model/kern.h"

static const char *const model_kind_names[DSIM_MODEL_KIND_COUNT] = {"linear", "softmax", "mlp",
                                                                    "plugin"};
static const char *const model_loss_names[DSIM_LOSS_COUNT] = {"auto", "mse", "xent"};

const char *dsim_model_kind_name(dsim_model_kind k)
{
    if ((unsigned)k >= DSIM_MODEL_KIND_COUNT)
        return "?";
    return model_kind_names[k];
}

dsim_err dsim_model_kind_parse(const char *s, dsim_model_kind *out)
{
    if (!s || !out)
        return DSIM_ERR(DSIM_EINVAL, -1, "dsim_model_kind_parse: NULL argument");
    for (int k = 0; k < DSIM_MODEL_PLUGIN; k++) {
        if (strcmp(s, model_kind_names[k]) == 0) {
            *out = (dsim_model_kind)k;
            return DSIM_OK;
        }
    }
    if (strcmp(s, "plugin") == 0)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "model kind plugin is given by its file: model: {plugin: libmine.so} "
                        "(model.plugin), or dsim_model_load in C");
    return DSIM_ERR(DSIM_EINVAL, -1, "unknown model kind '%s': use linear, softmax or mlp", s);
}

const char *dsim_loss_name(dsim_loss l)
{
    if ((unsigned)l >= DSIM_LOSS_COUNT)
        return "?";
    return model_loss_names[l];
}

dsim_err dsim_loss_parse(const char *s, dsim_loss *out)
{
    if (!s || !out)
        return DSIM_ERR(DSIM_EINVAL, -1, "dsim_loss_parse: NULL argument");
    for (int l = 0; l < DSIM_LOSS_COUNT; l++) {
        if (strcmp(s, model_loss_names[l]) == 0) {
            *out = (dsim_loss)l;
            return DSIM_OK;
        }
    }
    if (strcmp(s, "cross_entropy") == 0 || strcmp(s, "crossentropy") == 0) {
        *out = DSIM_LOSS_XENT;
        return DSIM_OK;
    }
    return DSIM_ERR(DSIM_EINVAL, -1, "unknown loss '%s': use mse, xent (cross_entropy) or auto", s);
}

static dsim_loss model_resolve_loss(const dsim_model_spec *spec)
{
    if (spec->loss != DSIM_LOSS_AUTO)
        return spec->loss;
    if (spec->kind == DSIM_MODEL_PLUGIN)
        return spec->plugin ? spec->plugin->loss : DSIM_LOSS_MSE;
    return spec->kind == DSIM_MODEL_LINEAR ? DSIM_LOSS_MSE : DSIM_LOSS_XENT;
}

/* Fills the layout of a spec whose fields are already known to be in range.
 * Sizes are bounded by DSIM_MODEL_MAX_DIM, so every product fits in 64 bits;
 * the total is checked against DSIM_MODEL_MAX_PARAMS. */
static dsim_err model_layout(const dsim_model_spec *spec, dsim_model_layout *lay)
{
    size_t dims[DSIM_MODEL_MAX_HIDDEN + 2];
    size_t nl = spec->n_hidden + 1;
    dims[0] = spec->in_dim;
    for (size_t h = 0; h < spec->n_hidden; h++)
        dims[h + 1] = spec->hidden[h];
    dims[nl] = spec->out_dim;

    memset(lay, 0, sizeof *lay);
    lay->n_layers = nl;
    uint64_t off = 0;
    for (size_t l = 0; l < nl; l++) {
        uint64_t w = (uint64_t)dims[l] * (uint64_t)dims[l + 1];
        lay->layer[l].in = dims[l];
        lay->layer[l].out = dims[l + 1];
        lay->layer[l].w_off = (size_t)off;
        off += w;
        lay->layer[l].b_off = (size_t)off;
        off += dims[l + 1];
        if (off > DSIM_MODEL_MAX_PARAMS)
            return DSIM_ERR(DSIM_EINVAL, -1,
                            "model has more than %zu parameters (layer %zu is %zu x %zu): "
                            "use smaller in_dim, hidden or out_dim",
                            (size_t)DSIM_MODEL_MAX_PARAMS, l + 1, dims[l + 1], dims[l]);
    }
    lay->n_params = (size_t)off;
    return DSIM_OK;
}

/* A plugin model's spec: its table, sizes, loss and parameter count. */
static dsim_err model_plugin_validate(const dsim_model_spec *spec)
{
    const dsim_model_ops *ops = spec->plugin;
    if (!ops)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "model kind plugin has no ops table (spec.plugin is NULL): load one "
                        "with dsim_model_load");
    DSIM_CHECK(dsim_model_check_ops(ops, ops->name ? ops->name : "model plugin"));
    if (spec->in_dim < 1 || spec->in_dim > DSIM_MODEL_MAX_DIM || spec->out_dim < 1 ||
        spec->out_dim > DSIM_MODEL_MAX_DIM)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "model plugin %s: in_dim %zu and out_dim %zu must be in 1..%u", ops->name,
                        spec->in_dim, spec->out_dim, DSIM_MODEL_MAX_DIM);
    if (spec->loss != DSIM_LOSS_AUTO && spec->loss != ops->loss)
        return DSIM_ERR(DSIM_EINVAL, -1, "model plugin %s trains with loss %s, not %s", ops->name,
                        model_loss_names[ops->loss], model_loss_names[spec->loss]);
    if (ops->loss == DSIM_LOSS_XENT && spec->out_dim < 2)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "model plugin %s: cross-entropy needs at least 2 classes, not %zu",
                        ops->name, spec->out_dim);
    if (spec->n_hidden != 0)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "model plugin %s: hidden layers belong to kind mlp; the plugin "
                        "chooses its own",
                        ops->name);
    char why[256] = "";
    size_t n = ops->num_params(spec, why, sizeof why);
    if (n == 0 || n > DSIM_MODEL_MAX_PARAMS)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "model plugin %s cannot take %zu features and %zu outputs%s%s", ops->name,
                        spec->in_dim, spec->out_dim, why[0] ? ": " : "",
                        why[0] ? why : (n ? "(too many parameters)" : ""));
    return DSIM_OK;
}

dsim_err dsim_model_validate(const dsim_model_spec *spec)
{
    if (!spec)
        return DSIM_ERR(DSIM_EINVAL, -1, "model spec is NULL");
    if ((unsigned)spec->kind >= DSIM_MODEL_KIND_COUNT)
        return DSIM_ERR(DSIM_EINVAL, -1, "model kind %d is not one of linear, softmax, mlp",
                        (int)spec->kind);
    if ((unsigned)spec->loss >= DSIM_LOSS_COUNT)
        return DSIM_ERR(DSIM_EINVAL, -1, "model loss %d is not one of auto, mse, xent",
                        (int)spec->loss);
    const char *kind = model_kind_names[spec->kind];
    if (spec->kind == DSIM_MODEL_PLUGIN)
        return model_plugin_validate(spec);
    if (spec->in_dim < 1 || spec->in_dim > DSIM_MODEL_MAX_DIM)
        return DSIM_ERR(DSIM_EINVAL, -1, "model in_dim %zu (features per example) must be in 1..%u",
                        spec->in_dim, DSIM_MODEL_MAX_DIM);
    if (spec->out_dim < 1 || spec->out_dim > DSIM_MODEL_MAX_DIM)
        return DSIM_ERR(DSIM_EINVAL, -1, "model out_dim %zu (outputs or classes) must be in 1..%u",
                        spec->out_dim, DSIM_MODEL_MAX_DIM);
    dsim_loss loss = model_resolve_loss(spec);
    if (spec->kind == DSIM_MODEL_LINEAR && loss != DSIM_LOSS_MSE)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "model kind linear trains with loss mse, not %s: for classification "
                        "use kind softmax or mlp",
                        model_loss_names[loss]);
    if (spec->kind == DSIM_MODEL_SOFTMAX && loss != DSIM_LOSS_XENT)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "model kind softmax trains with loss xent, not %s: for regression "
                        "use kind linear or mlp",
                        model_loss_names[loss]);
    if (loss == DSIM_LOSS_XENT && spec->out_dim < 2)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "model out_dim %zu: cross-entropy needs at least 2 classes", spec->out_dim);
    if (spec->kind == DSIM_MODEL_MLP) {
        if (spec->n_hidden < 1 || spec->n_hidden > DSIM_MODEL_MAX_HIDDEN)
            return DSIM_ERR(DSIM_EINVAL, -1, "model kind mlp needs 1 or 2 hidden layers, not %zu",
                            spec->n_hidden);
        for (size_t h = 0; h < spec->n_hidden; h++) {
            if (spec->hidden[h] < 1 || spec->hidden[h] > DSIM_MODEL_MAX_DIM)
                return DSIM_ERR(DSIM_EINVAL, -1, "model hidden[%zu] = %zu must be in 1..%u", h,
                                spec->hidden[h], DSIM_MODEL_MAX_DIM);
        }
    } else if (spec->n_hidden != 0) {
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "model kind %s has no hidden layers (n_hidden %zu): use kind mlp", kind,
                        spec->n_hidden);
    }
    dsim_model_layout lay;
    return model_layout(spec, &lay);
}

dsim_loss dsim_model_loss(const dsim_model_spec *spec)
{
    return model_resolve_loss(spec);
}

size_t dsim_model_y_dim(const dsim_model_spec *spec)
{
    if (dsim_model_validate(spec) != DSIM_OK)
        return 0;
    return model_resolve_loss(spec) == DSIM_LOSS_MSE ? spec->out_dim : 1;
}

size_t dsim_model_num_params(const dsim_model_spec *spec)
{
    if (spec && spec->kind == DSIM_MODEL_PLUGIN) {
        char why[8];
        return dsim_model_validate(spec) == DSIM_OK ? spec->plugin->num_params(spec, why, 8) : 0;
    }
    dsim_model_layout lay;
    if (dsim_model_layout_of(spec, &lay) != DSIM_OK)
        return 0;
    return lay.n_params;
}

dsim_err dsim_model_layout_of(const dsim_model_spec *spec, dsim_model_layout *out)
{
    DSIM_CHECK(dsim_model_validate(spec));
    if (!out)
        return DSIM_ERR(DSIM_EINVAL, -1, "dsim_model_layout_of: out is NULL");
    if (spec->kind == DSIM_MODEL_PLUGIN)
        return DSIM_ERR(DSIM_ENOTSUP, -1,
                        "model plugin %s lays its parameters out itself: it has no layers "
                        "dsim knows",
                        spec->plugin->name);
    return model_layout(spec, out);
}

_Static_assert(2 * (DSIM_MODEL_MAX_HIDDEN + 1) <= DSIM_MODEL_MAX_VARS,
               "every layer's kernel and bias must be a variable of its own");

size_t dsim_model_vars(const dsim_model_spec *spec, dsim_model_var out[DSIM_MODEL_MAX_VARS])
{
    if (!out || !spec || dsim_model_validate(spec) != DSIM_OK)
        return 0;
    size_t n = 0;
    if (spec->kind == DSIM_MODEL_PLUGIN) {
        size_t P = dsim_model_num_params(spec);
        size_t span = (P + DSIM_MODEL_MAX_VARS - 1) / DSIM_MODEL_MAX_VARS;
        for (size_t off = 0; off < P; off += span, n++) {
            size_t len = P - off < span ? P - off : span;
            out[n] = (dsim_model_var){.off = off, .len = len};
            snprintf(out[n].name, sizeof out[n].name, "parameters %zu..%zu", off, off + len - 1);
        }
        return n;
    }
    dsim_model_layout lay;
    if (model_layout(spec, &lay) != DSIM_OK)
        return 0;
    for (size_t l = 0; l < lay.n_layers; l++) {
        const dsim_model_layer *L = &lay.layer[l];
        out[n] = (dsim_model_var){.off = L->w_off, .len = L->in * L->out, .shape = {L->in, L->out}};
        snprintf(out[n++].name, sizeof out[0].name, "layer %zu's kernel [%zu x %zu]", l + 1, L->in,
                 L->out);
        out[n] = (dsim_model_var){.off = L->b_off, .len = L->out, .shape = {L->out, 0}};
        snprintf(out[n++].name, sizeof out[0].name, "layer %zu's bias [%zu]", l + 1, L->out);
    }
    return n;
}

const char *dsim_model_var_where(const dsim_model_var *v, size_t nv, size_t i, char *buf,
                                 size_t cap)
{
    if (!buf || cap == 0)
        return "";
    buf[0] = '\0';
    for (size_t k = 0; v && k < nv && k < DSIM_MODEL_MAX_VARS; k++) {
        if (i < v[k].off || i - v[k].off >= v[k].len)
            continue;
        size_t at = i - v[k].off;
        if (v[k].shape[1] > 0) /* a kernel, held units x inputs */
            snprintf(buf, cap, "%s at [%zu, %zu]", v[k].name, at % v[k].shape[0],
                     at / v[k].shape[0]);
        else if (v[k].shape[0] > 0)
            snprintf(buf, cap, "%s at [%zu]", v[k].name, at);
        else
            snprintf(buf, cap, "%s", v[k].name);
        break;
    }
    return buf;
}

dsim_err dsim_model_init(const dsim_model_spec *spec, float *params, dsim_rng *rng)
{
    if (spec && spec->kind == DSIM_MODEL_PLUGIN) {
        DSIM_CHECK(dsim_model_validate(spec));
        if (!params || !rng)
            return DSIM_ERR(DSIM_EINVAL, -1, "dsim_model_init: params and rng must not be NULL");
        return spec->plugin->init(spec, params, dsim_rng_next(rng));
    }
    dsim_model_layout lay;
    DSIM_CHECK(dsim_model_layout_of(spec, &lay));
    if (!params || !rng)
        return DSIM_ERR(DSIM_EINVAL, -1, "dsim_model_init: params and rng must not be NULL");
    for (size_t l = 0; l < lay.n_layers; l++) {
        const dsim_model_layer *L = &lay.layer[l];
        double limit = sqrt(6.0 / (double)(L->in + L->out));
        float *w = params + L->w_off;
        for (size_t k = 0; k < L->in * L->out; k++)
            w[k] = (float)((2.0 * dsim_rng_uniform(rng) - 1.0) * limit);
        memset(params + L->b_off, 0, L->out * sizeof(float));
    }
    return DSIM_OK;
}

/* Examples per block: the activations of a block stay in the caches, and
 * a batch of up to this many needs no double copy of the gradient. */
#define MODEL_BLOCK 64
/* The most doubles a block's activations may take (32 MiB): wider layers
 * get smaller blocks. The block size changes no result (the sums run in
 * example order across blocks). */
#define MODEL_BLOCK_DOUBLES ((size_t)1 << 22)

/* Scratch for one call: a block's activations and deltas, and the double
 * gradient sums when the batch spans blocks. */
typedef struct model_ws {
    dsim_model_layout lay;
    const kern_ops *k;
    size_t cap;                           /* examples per block */
    size_t ld[DSIM_MODEL_MAX_HIDDEN + 2]; /* row strides: ld[l] for layer l's input */
    double *a[DSIM_MODEL_MAX_HIDDEN + 1]; /* input of layer l (a[0] = x as double) */
    double *z[DSIM_MODEL_MAX_HIDDEN + 1]; /* output of layer l before the ReLU */
    double *delta[2];                     /* d loss / d z of a layer, and of the one below */
    double *acc;                          /* n_params, when the gradient spans blocks */
    double *block;
    /* Mixed precision (dsim_model_loss_grad_mixed): the compute dtype, DSIM_F32
     * for none, and the variables cast to it (wc, n_params floats). */
    dsim_dtype cd;
    float *wc;
} model_ws;

static dsim_err model_ws_init(model_ws *ws, const dsim_model_spec *spec, size_t n, int want_grad,
                              dsim_dtype cd)
{
    memset(ws, 0, sizeof *ws);
    ws->cd = cd;
    DSIM_CHECK(dsim_model_layout_of(spec, &ws->lay));
    const dsim_model_layout *lay = &ws->lay;
    ws->k = kern_get();
    size_t row = 0, widest = 0;
    ws->ld[0] = kern_ld(lay->layer[0].in);
    for (size_t l = 0; l < lay->n_layers; l++) {
        ws->ld[l + 1] = kern_ld(lay->layer[l].out);
        row += ws->ld[l] + ws->ld[l + 1];
        if (ws->ld[l + 1] > widest)
            widest = ws->ld[l + 1];
        if (ws->ld[l] > widest)
            widest = ws->ld[l];
    }
    if (want_grad)
        row += 2 * widest;
    size_t cap = MODEL_BLOCK_DOUBLES / row;
    cap = cap < 1 ? 1 : cap > MODEL_BLOCK ? MODEL_BLOCK : cap;
    ws->cap = cap < n ? cap : n;
    size_t total = ws->cap * row;
    ws->block = malloc(total * sizeof(double));
    /* Mixed precision rounds the gradient sums once, from double: they are
     * always kept whole. */
    bool acc = want_grad && (n > ws->cap || cd != DSIM_F32);
    if (acc)
        ws->acc = malloc(lay->n_params * sizeof(double));
    if (cd != DSIM_F32)
        ws->wc = malloc(lay->n_params * sizeof(float));
    if (!ws->block || (acc && !ws->acc) || (cd != DSIM_F32 && !ws->wc)) {
        free(ws->block);
        free(ws->acc);
        free(ws->wc);
        return DSIM_ERR(DSIM_ENOMEM, -1, "model scratch: cannot allocate %zu doubles",
                        total + (acc ? lay->n_params : 0));
    }
    double *p = ws->block;
    for (size_t l = 0; l < lay->n_layers; l++) {
        ws->a[l] = p;
        p += ws->cap * ws->ld[l];
        ws->z[l] = p;
        p += ws->cap * ws->ld[l + 1];
    }
    if (want_grad) {
        ws->delta[0] = p;
        p += ws->cap * widest;
        ws->delta[1] = p;
    }
    return DSIM_OK;
}

static void model_ws_free(model_ws *ws)
{
    free(ws->block);
    free(ws->acc);
    free(ws->wc);
    ws->block = NULL;
    ws->acc = NULL;
    ws->wc = NULL;
}

/* Rounds the first `width` values of n rows (stride ld) to the compute
 * dtype; nothing under float32. */
static void model_round_rows(const model_ws *ws, double *v, size_t ld, size_t width, size_t n)
{
    if (ws->cd == DSIM_F32)
        return;
    for (size_t e = 0; e < n; e++)
        dsim_dtype_round_n(ws->cd, v + e * ld, width);
}

/* The forward pass of nb <= cap examples; leaves the outputs (before any
 * loss) in ws->z[n_layers-1], row e at e * ws->ld[n_layers]. */
static void model_forward(model_ws *ws, const float *params, const float *x, size_t nb)
{
    const dsim_model_layout *lay = &ws->lay;
    size_t in = lay->layer[0].in, l0 = ws->ld[0];
    /* Rows padded with +0: dense_fwd reads whole lanes. */
    for (size_t e = 0; e < nb; e++) {
        for (size_t i = 0; i < in; i++)
            ws->a[0][e * l0 + i] = x[e * in + i];
        for (size_t i = in; i < l0; i++)
            ws->a[0][e * l0 + i] = 0.0;
    }
    /* Mixed precision: the layer's input cast to the compute dtype, the
     * variables cast as they are read (ws->wc), each layer's output rounded
     * once from its wide sum (as a tensor core accumulates), the ReLU after
     * it exact. */
    model_round_rows(ws, ws->a[0], l0, in, nb);
    if (ws->wc)
        params = ws->wc;
    for (size_t l = 0; l < lay->n_layers; l++) {
        const dsim_model_layer *L = &lay->layer[l];
        size_t lz = ws->ld[l + 1];
        ws->k->dense_fwd(params + L->w_off, params + L->b_off, L->in, L->out, ws->a[l], ws->ld[l],
                         nb, ws->z[l], lz);
        model_round_rows(ws, ws->z[l], lz, L->out, nb);
        if (l + 1 < lay->n_layers)
            ws->k->relu(ws->z[l], ws->a[l + 1], lz, L->out, nb);
    }
}

/* Loss of one example from the outputs z; when delta is not NULL it
 * receives d loss / d z. The label has been validated. */
static double model_loss_top(dsim_loss loss, const double *z, size_t out, const float *y,
                             double *delta)
{
    if (loss == DSIM_LOSS_MSE) {
        double sum = 0.0;
        for (size_t j = 0; j < out; j++) {
            double r = z[j] - (double)y[j];
            sum += r * r;
            if (delta)
                delta[j] = 2.0 * r / (double)out;
        }
        return sum / (double)out;
    }
    size_t c = (size_t)y[0];
    double m = z[0];
    for (size_t j = 1; j < out; j++)
        if (z[j] > m)
            m = z[j];
    double s = 0.0;
    for (size_t j = 0; j < out; j++)
        s += exp(z[j] - m);
    double lse = m + log(s);
    if (delta) {
        for (size_t j = 0; j < out; j++)
            delta[j] = exp(z[j] - lse) - (j == c ? 1.0 : 0.0);
    }
    return lse - z[c];
}

/* The gradient of a block of nb examples whose forward pass is in ws and
 * whose d loss / d outputs are in ws->delta[0] (row stride
 * ws->ld[n_layers]). The sums continue those of the blocks before (first:
 * none) and, after the last block, are rounded into grad once. */
static void model_backward(model_ws *ws, const float *params, size_t nb, int first, int last,
                           int set, float *grad, double scale)
{
    const dsim_model_layout *lay = &ws->lay;
    double *delta = ws->delta[0];
    double *below = ws->delta[1];
    /* Mixed precision keeps the sums in double (ws->acc) to the end, where
     * dsim_model_loss_grad_mixed rounds them once; the deltas it rounds
     * here, through the variables as cast (ws->wc). */
    bool mixed = ws->cd != DSIM_F32;
    if (ws->wc)
        params = ws->wc;
    for (size_t l = lay->n_layers; l-- > 0;) {
        const dsim_model_layer *L = &lay->layer[l];
        kern_wgrad_io io = {
            .from = first ? NULL : ws->acc + L->w_off,
            .to = ws->acc ? ws->acc + L->w_off : NULL,
            .final = last && !mixed,
            .set = set,
            .g = grad + L->w_off,
            .scale = scale,
        };
        ws->k->dense_wgrad(L->in, L->out, delta, ws->ld[l + 1], ws->a[l], ws->ld[l], nb, &io);
        if (l == 0)
            break;
        /* through the ReLU below: zero where its input was not positive */
        ws->k->dense_bwd(params + L->w_off, L->in, L->out, delta, ws->ld[l + 1], nb, ws->z[l - 1],
                         below, ws->ld[l]);
        model_round_rows(ws, below, ws->ld[l], L->in, nb);
        double *t = delta;
        delta = below;
        below = t;
    }
}

static dsim_err model_check_batch(const char *fn, const dsim_model_spec *spec, const float *params,
                                  const float *x, const float *y, size_t n)
{
    DSIM_CHECK(dsim_model_validate(spec));
    if (!params)
        return DSIM_ERR(DSIM_EINVAL, -1, "%s: params is NULL", fn);
    if (n > 0 && (!x || !y))
        return DSIM_ERR(DSIM_EINVAL, -1, "%s: x and y must not be NULL for %zu examples", fn, n);
    if (model_resolve_loss(spec) != DSIM_LOSS_XENT)
        return DSIM_OK;
    for (size_t e = 0; e < n; e++) {
        float v = y[e];
        if (!(v >= 0.0f && v < (float)spec->out_dim && v == floorf(v)))
            return DSIM_ERR(DSIM_EINVAL, -1,
                            "%s: example %zu has label %g, not a class index in [0, %zu) "
                            "(labels are class indices stored as float)",
                            fn, e, (double)v, spec->out_dim);
    }
    return DSIM_OK;
}

/* A plugin's loss and gradient sums, scaled and rounded once here. */
static dsim_err model_plugin_loss_grad(const dsim_model_spec *spec, const float *params,
                                       const float *x, const float *y, size_t n, float scale,
                                       int set, float *grad, double *loss_sum)
{
    size_t np = dsim_model_num_params(spec);
    double *g = grad ? calloc(np ? np : 1, sizeof *g) : NULL;
    if (grad && !g)
        return DSIM_ERR(DSIM_ENOMEM, -1, "model plugin %s: out of memory for %zu gradients",
                        spec->plugin->name, np);
    double total = 0.0;
    dsim_err e = spec->plugin->loss_grad(spec, params, x, y, n, &total, g);
    if (e == DSIM_OK && grad)
        for (size_t k = 0; k < np; k++)
            grad[k] = (float)((set ? 0.0 : (double)grad[k]) + (double)scale * g[k]);
    if (e == DSIM_OK && loss_sum)
        *loss_sum = total;
    free(g);
    return e;
}

/* dsim_model_loss_grad, and with set its form that overwrites the gradient
 * as if it had been +0 (dsim_model_loss_grad_set); with a compute dtype
 * other than float32, dsim_model_loss_grad_mixed (set only). */
static dsim_err model_loss_grad(const char *fn, const dsim_model_spec *spec, const float *params,
                                const float *x, const float *y, size_t n, float scale, int set,
                                dsim_dtype cd, float *grad, double *loss_sum)
{
    DSIM_CHECK(model_check_batch(fn, spec, params, x, y, n));
    if (!isfinite(scale))
        return DSIM_ERR(DSIM_EINVAL, -1, "%s: scale %g is not finite", fn, (double)scale);
    if (loss_sum)
        *loss_sum = 0.0;
    if (n == 0) {
        if (set && grad)
            memset(grad, 0, dsim_model_num_params(spec) * sizeof(float));
        return DSIM_OK;
    }
    if (spec->kind == DSIM_MODEL_PLUGIN)
        return model_plugin_loss_grad(spec, params, x, y, n, scale, set, grad, loss_sum);
    model_ws ws;
    DSIM_CHECK(model_ws_init(&ws, spec, n, grad != NULL, cd));
    size_t P = ws.lay.n_params;
    for (size_t k = 0; ws.wc && k < P; k++)
        ws.wc[k] = (float)dsim_dtype_round(cd, params[k]);
    dsim_loss loss = model_resolve_loss(spec);
    size_t in = spec->in_dim, out = spec->out_dim, yd = loss == DSIM_LOSS_MSE ? out : 1;
    size_t top = ws.lay.n_layers - 1, lt = ws.ld[top + 1];
    double total = 0.0;
    for (size_t e0 = 0; e0 < n; e0 += ws.cap) {
        size_t nb = n - e0 < ws.cap ? n - e0 : ws.cap;
        model_forward(&ws, params, x + e0 * in, nb);
        for (size_t e = 0; e < nb; e++)
            total += model_loss_top(loss, ws.z[top] + e * lt, out, y + (e0 + e) * yd,
                                    grad ? ws.delta[0] + e * lt : NULL);
        if (grad && cd != DSIM_F32) {
            /* The loss's gradient, times the (loss) scale, enters the
             * compute dtype once: Keras's cast of the outputs to float32
             * for the loss, differentiated. */
            for (size_t e = 0; e < nb; e++)
                for (size_t j = 0; j < out; j++)
                    ws.delta[0][e * lt + j] *= (double)scale;
            model_round_rows(&ws, ws.delta[0], lt, out, nb);
        }
        if (grad)
            model_backward(&ws, params, nb, e0 == 0, e0 + nb == n, set, grad, (double)scale);
    }
    /* Each layer's weight and bias gradients are its matmul's and its sum's
     * outputs in the compute dtype: rounded once from the sums over the
     * batch, then widened to float (exact) as the variables' gradient. */
    for (size_t k = 0; grad && cd != DSIM_F32 && k < P; k++)
        grad[k] = (float)dsim_dtype_round(cd, ws.acc[k]);
    if (loss_sum)
        *loss_sum = total;
    model_ws_free(&ws);
    return DSIM_OK;
}

dsim_err dsim_model_loss_grad(const dsim_model_spec *spec, const float *params, const float *x,
                              const float *y, size_t n, float scale, float *grad_accum,
                              double *loss_sum)
{
    return model_loss_grad("dsim_model_loss_grad", spec, params, x, y, n, scale, 0, DSIM_F32,
                           grad_accum, loss_sum);
}

dsim_err dsim_model_loss_grad_set(const dsim_model_spec *spec, const float *params, const float *x,
                                  const float *y, size_t n, float scale, float *grad,
                                  double *loss_sum)
{
    if (!grad)
        return DSIM_ERR(DSIM_EINVAL, -1, "dsim_model_loss_grad_set: grad is NULL");
    return model_loss_grad("dsim_model_loss_grad_set", spec, params, x, y, n, scale, 1, DSIM_F32,
                           grad, loss_sum);
}

dsim_err dsim_model_loss_grad_mixed(const dsim_model_spec *spec, dsim_dtype compute,
                                    const float *params, const float *x, const float *y, size_t n,
                                    float scale, float *grad, double *loss_sum)
{
    if (!grad)
        return DSIM_ERR(DSIM_EINVAL, -1, "dsim_model_loss_grad_mixed: grad is NULL");
    if (compute != DSIM_F32 && compute != DSIM_F16 && compute != DSIM_BF16)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "dsim_model_loss_grad_mixed: compute dtype %s is not float, half or "
                        "bfloat16",
                        dsim_dtype_name(compute));
    return model_loss_grad("dsim_model_loss_grad_mixed", spec, params, x, y, n, scale, 1, compute,
                           grad, loss_sum);
}

dsim_err dsim_model_predict(const dsim_model_spec *spec, const float *params, const float *x,
                            size_t n, float *out)
{
    DSIM_CHECK(dsim_model_validate(spec));
    if (!params || (n > 0 && (!x || !out)))
        return DSIM_ERR(DSIM_EINVAL, -1, "dsim_model_predict: params, x and out must not be NULL");
    if (n == 0)
        return DSIM_OK;
    if (spec->kind == DSIM_MODEL_PLUGIN) {
        if (!spec->plugin->forward)
            return DSIM_ERR(DSIM_ENOTSUP, -1,
                            "model plugin %s has no forward: it computes losses and gradients "
                            "only",
                            spec->plugin->name);
        return spec->plugin->forward(spec, params, x, n, out);
    }
    model_ws ws;
    DSIM_CHECK(model_ws_init(&ws, spec, n, 0, DSIM_F32));
    size_t top = ws.lay.n_layers - 1, lt = ws.ld[top + 1], od = spec->out_dim;
    for (size_t e0 = 0; e0 < n; e0 += ws.cap) {
        size_t nb = n - e0 < ws.cap ? n - e0 : ws.cap;
        model_forward(&ws, params, x + e0 * spec->in_dim, nb);
        for (size_t e = 0; e < nb; e++)
            for (size_t j = 0; j < od; j++)
                out[(e0 + e) * od + j] = (float)ws.z[top][e * lt + j];
    }
    model_ws_free(&ws);
    return DSIM_OK;
}

/* A plugin's evaluation: the loss from loss_grad, the accuracy from
 * forward when it has one. */
static dsim_err model_plugin_eval(const dsim_model_spec *spec, const float *params, const float *x,
                                  const float *y, size_t n, double *loss_sum, size_t *n_correct)
{
    double total = 0.0;
    DSIM_CHECK(spec->plugin->loss_grad(spec, params, x, y, n, &total, NULL));
    if (loss_sum)
        *loss_sum = total;
    if (!n_correct || spec->plugin->loss != DSIM_LOSS_XENT || !spec->plugin->forward)
        return DSIM_OK;
    size_t out = spec->out_dim, correct = 0;
    float *z = malloc(n * out * sizeof *z);
    if (!z)
        return DSIM_ERR(DSIM_ENOMEM, -1, "model plugin %s: out of memory evaluating %zu examples",
                        spec->plugin->name, n);
    dsim_err e = spec->plugin->forward(spec, params, x, n, z);
    for (size_t i = 0; e == DSIM_OK && i < n; i++) {
        size_t best = 0;
        for (size_t j = 1; j < out; j++)
            if (z[i * out + j] > z[i * out + best])
                best = j;
        correct += best == (size_t)y[i];
    }
    free(z);
    *n_correct = correct;
    return e;
}

dsim_err dsim_model_eval(const dsim_model_spec *spec, const float *params, const float *x,
                         const float *y, size_t n, double *loss_sum, size_t *n_correct)
{
    DSIM_CHECK(model_check_batch("dsim_model_eval", spec, params, x, y, n));
    if (loss_sum)
        *loss_sum = 0.0;
    if (n_correct)
        *n_correct = 0;
    if (n == 0)
        return DSIM_OK;
    if (spec->kind == DSIM_MODEL_PLUGIN)
        return model_plugin_eval(spec, params, x, y, n, loss_sum, n_correct);
    model_ws ws;
    DSIM_CHECK(model_ws_init(&ws, spec, n, 0, DSIM_F32));
    dsim_loss loss = model_resolve_loss(spec);
    size_t in = spec->in_dim, out = spec->out_dim, yd = loss == DSIM_LOSS_MSE ? out : 1;
    size_t top = ws.lay.n_layers - 1, lt = ws.ld[top + 1];
    double total = 0.0;
    size_t correct = 0;
    for (size_t e0 = 0; e0 < n; e0 += ws.cap) {
        size_t nb = n - e0 < ws.cap ? n - e0 : ws.cap;
        model_forward(&ws, params, x + e0 * in, nb);
        for (size_t e = 0; e < nb; e++) {
            const double *z = ws.z[top] + e * lt;
            total += model_loss_top(loss, z, out, y + (e0 + e) * yd, NULL);
            if (loss == DSIM_LOSS_XENT) {
                size_t best = 0;
                for (size_t j = 1; j < out; j++)
                    if (z[j] > z[best])
                        best = j;
                correct += best == (size_t)y[e0 + e];
            }
        }
    }
    if (loss_sum)
        *loss_sum = total;
    if (n_correct)
        *n_correct = correct;
    model_ws_free(&ws);
    return DSIM_OK;
}
