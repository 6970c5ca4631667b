/* Reference models: layout, losses, exact gradients against finite
 * differences, loss scaling, determinism and bad input. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "dsim/err.h"
#include "dsim/model.h"
#include "dsim/rng.h"

/* |a - b| <= tol, in double (cmocka 1.1.5 compares only floats). */
#define assert_close(a, b, tol)                                                                    \
    do {                                                                                           \
        double ac_a_ = (a), ac_b_ = (b), ac_t_ = (tol);                                            \
        if (!(fabs(ac_a_ - ac_b_) <= ac_t_))                                                       \
            fail_msg("%s = %.17g, expected %.17g within %.3g", #a, ac_a_, ac_b_, ac_t_);           \
    } while (0)

static dsim_model_spec spec_of(dsim_model_kind kind, dsim_loss loss, size_t in, size_t out,
                               size_t nh, size_t h0, size_t h1)
{
    dsim_model_spec s;
    memset(&s, 0, sizeof s);
    s.kind = kind;
    s.loss = loss;
    s.in_dim = in;
    s.out_dim = out;
    s.n_hidden = nh;
    s.hidden[0] = h0;
    s.hidden[1] = h1;
    return s;
}

static void expect_einval(const dsim_model_spec *s, const char *word)
{
    dsim_clear_error();
    assert_int_equal(dsim_model_validate(s), DSIM_EINVAL);
    if (!strstr(dsim_errmsg(), word))
        fail_msg("message '%s' does not mention '%s'", dsim_errmsg(), word);
    assert_int_equal(dsim_model_num_params(s), 0);
    assert_int_equal(dsim_model_y_dim(s), 0);
}

static void test_validate_rejects_bad_specs(void **state)
{
    (void)state;
    dsim_model_spec s;
    s = spec_of(DSIM_MODEL_LINEAR, DSIM_LOSS_AUTO, 0, 2, 0, 0, 0);
    expect_einval(&s, "in_dim");
    s = spec_of(DSIM_MODEL_LINEAR, DSIM_LOSS_AUTO, 3, 0, 0, 0, 0);
    expect_einval(&s, "out_dim");
    s = spec_of(DSIM_MODEL_LINEAR, DSIM_LOSS_AUTO, (size_t)DSIM_MODEL_MAX_DIM + 1, 2, 0, 0, 0);
    expect_einval(&s, "in_dim");
    s = spec_of(DSIM_MODEL_SOFTMAX, DSIM_LOSS_AUTO, 3, 1, 0, 0, 0);
    expect_einval(&s, "2 classes");
    s = spec_of(DSIM_MODEL_LINEAR, DSIM_LOSS_XENT, 3, 2, 0, 0, 0);
    expect_einval(&s, "softmax or mlp");
    s = spec_of(DSIM_MODEL_SOFTMAX, DSIM_LOSS_MSE, 3, 2, 0, 0, 0);
    expect_einval(&s, "linear or mlp");
    s = spec_of(DSIM_MODEL_LINEAR, DSIM_LOSS_AUTO, 3, 2, 1, 4, 0);
    expect_einval(&s, "use kind mlp");
    s = spec_of(DSIM_MODEL_MLP, DSIM_LOSS_AUTO, 3, 2, 0, 0, 0);
    expect_einval(&s, "1 or 2 hidden");
    s = spec_of(DSIM_MODEL_MLP, DSIM_LOSS_AUTO, 3, 2, 3, 4, 4);
    expect_einval(&s, "1 or 2 hidden");
    s = spec_of(DSIM_MODEL_MLP, DSIM_LOSS_AUTO, 3, 2, 2, 4, 0);
    expect_einval(&s, "hidden[1]");
    s = spec_of((dsim_model_kind)7, DSIM_LOSS_AUTO, 3, 2, 0, 0, 0);
    expect_einval(&s, "kind");
    s = spec_of(DSIM_MODEL_LINEAR, (dsim_loss)9, 3, 2, 0, 0, 0);
    expect_einval(&s, "loss");
    /* Each dimension is allowed, their product is not. */
    s = spec_of(DSIM_MODEL_MLP, DSIM_LOSS_AUTO, 1u << 20, 2, 1, 1u << 12, 0);
    expect_einval(&s, "parameters");
    dsim_clear_error();
    assert_int_equal(dsim_model_validate(NULL), DSIM_EINVAL);

    /* And the accepted forms. */
    s = spec_of(DSIM_MODEL_MLP, DSIM_LOSS_MSE, 3, 1, 1, 4, 0);
    assert_int_equal(dsim_model_validate(&s), DSIM_OK);
    assert_int_equal(dsim_model_loss(&s), DSIM_LOSS_MSE);
    assert_int_equal(dsim_model_y_dim(&s), 1);
    s = spec_of(DSIM_MODEL_MLP, DSIM_LOSS_AUTO, 3, 5, 2, 4, 4);
    assert_int_equal(dsim_model_loss(&s), DSIM_LOSS_XENT);
    assert_int_equal(dsim_model_y_dim(&s), 1);
    s = spec_of(DSIM_MODEL_LINEAR, DSIM_LOSS_AUTO, 3, 5, 0, 0, 0);
    assert_int_equal(dsim_model_loss(&s), DSIM_LOSS_MSE);
    assert_int_equal(dsim_model_y_dim(&s), 5);
}

static void test_names_parse(void **state)
{
    (void)state;
    for (int k = 0; k < DSIM_MODEL_PLUGIN; k++) {
        dsim_model_kind out;
        assert_int_equal(dsim_model_kind_parse(dsim_model_kind_name((dsim_model_kind)k), &out),
                         DSIM_OK);
        assert_int_equal(out, k);
    }
    /* a plugin is named by its file, not by a kind */
    dsim_model_kind pk;
    assert_string_equal(dsim_model_kind_name(DSIM_MODEL_PLUGIN), "plugin");
    assert_int_equal(dsim_model_kind_parse("plugin", &pk), DSIM_EINVAL);
    assert_non_null(strstr(dsim_errmsg(), "model.plugin"));
    dsim_loss l;
    assert_int_equal(dsim_loss_parse("cross_entropy", &l), DSIM_OK);
    assert_int_equal(l, DSIM_LOSS_XENT);
    assert_int_equal(dsim_loss_parse("mse", &l), DSIM_OK);
    assert_int_equal(l, DSIM_LOSS_MSE);
    dsim_model_kind k;
    assert_int_equal(dsim_model_kind_parse("cnn", &k), DSIM_EINVAL);
    assert_non_null(strstr(dsim_errmsg(), "linear, softmax or mlp"));
    assert_int_equal(dsim_loss_parse("hinge", &l), DSIM_EINVAL);
}

static void test_layout(void **state)
{
    (void)state;
    dsim_model_layout lay;
    dsim_model_spec s = spec_of(DSIM_MODEL_LINEAR, DSIM_LOSS_AUTO, 3, 2, 0, 0, 0);
    assert_int_equal(dsim_model_layout_of(&s, &lay), DSIM_OK);
    assert_int_equal(lay.n_layers, 1);
    assert_int_equal(lay.n_params, 8);
    assert_int_equal(lay.layer[0].w_off, 0);
    assert_int_equal(lay.layer[0].b_off, 6);

    /* 4 -> 5 -> 3 -> 2: W1 20 @0, b1 5 @20, W2 15 @25, b2 3 @40, W3 6 @43, b3 2 @49. */
    s = spec_of(DSIM_MODEL_MLP, DSIM_LOSS_AUTO, 4, 2, 2, 5, 3);
    assert_int_equal(dsim_model_layout_of(&s, &lay), DSIM_OK);
    assert_int_equal(lay.n_layers, 3);
    assert_int_equal(lay.n_params, 51);
    assert_int_equal(dsim_model_num_params(&s), 51);
    size_t want[3][4] = {{4, 5, 0, 20}, {5, 3, 25, 40}, {3, 2, 43, 49}};
    for (int l = 0; l < 3; l++) {
        assert_int_equal(lay.layer[l].in, want[l][0]);
        assert_int_equal(lay.layer[l].out, want[l][1]);
        assert_int_equal(lay.layer[l].w_off, want[l][2]);
        assert_int_equal(lay.layer[l].b_off, want[l][3]);
    }
}

/* The variables messages name: each layer's kernel then its bias, in the
 * buffer's order, as the layout places them. */
static void test_vars(void **state)
{
    (void)state;
    dsim_model_var v[DSIM_MODEL_MAX_VARS];
    dsim_model_spec s = spec_of(DSIM_MODEL_MLP, DSIM_LOSS_AUTO, 4, 2, 2, 5, 3);
    assert_int_equal(dsim_model_vars(&s, v), 6);
    static const struct {
        size_t off, len;
        const char *name;
    } want[6] = {{0, 20, "layer 1's kernel [4 x 5]"},  {20, 5, "layer 1's bias [5]"},
                 {25, 15, "layer 2's kernel [5 x 3]"}, {40, 3, "layer 2's bias [3]"},
                 {43, 6, "layer 3's kernel [3 x 2]"},  {49, 2, "layer 3's bias [2]"}};
    for (int k = 0; k < 6; k++) {
        assert_int_equal(v[k].off, want[k].off);
        assert_int_equal(v[k].len, want[k].len);
        assert_string_equal(v[k].name, want[k].name);
    }
    s = spec_of(DSIM_MODEL_SOFTMAX, DSIM_LOSS_AUTO, 3, 4, 0, 0, 0);
    assert_int_equal(dsim_model_vars(&s, v), 2);
    assert_string_equal(v[1].name, "layer 1's bias [4]");
    assert_int_equal(v[1].off, 12);
    /* 4 -> 5 -> 3 -> 2 again: W2 is held 3 x 5 at 25, so 25 + 2 * 5 + 4 is
     * Keras's kernel[4, 2] */
    s = spec_of(DSIM_MODEL_MLP, DSIM_LOSS_AUTO, 4, 2, 2, 5, 3);
    size_t nv = dsim_model_vars(&s, v);
    char b[128];
    assert_string_equal(dsim_model_var_where(v, nv, 39, b, sizeof b),
                        "layer 2's kernel [5 x 3] at [4, 2]");
    assert_string_equal(dsim_model_var_where(v, nv, 0, b, sizeof b),
                        "layer 1's kernel [4 x 5] at [0, 0]");
    assert_string_equal(dsim_model_var_where(v, nv, 50, b, sizeof b), "layer 3's bias [2] at [1]");
    assert_string_equal(dsim_model_var_where(v, nv, 51, b, sizeof b), "");
    assert_string_equal(dsim_model_var_where(NULL, 0, 3, b, sizeof b), "");
    s = spec_of(DSIM_MODEL_SOFTMAX, DSIM_LOSS_AUTO, 3, 4, 0, 0, 0);
    s.in_dim = 0; /* refused by dsim_model_validate */
    assert_int_equal(dsim_model_vars(&s, v), 0);
    assert_int_equal(dsim_model_vars(NULL, v), 0);
}

/* Values worked out by hand. */
static void test_hand_computed_losses(void **state)
{
    (void)state;
    double loss;
    /* linear 1 -> 1, w 2, b 1, x 3, y 5: prediction 7, loss (7-5)^2 = 4,
     * d/dw = 2*2*3 = 12, d/db = 2*2 = 4. */
    dsim_model_spec s = spec_of(DSIM_MODEL_LINEAR, DSIM_LOSS_AUTO, 1, 1, 0, 0, 0);
    float p[2] = {2, 1}, x = 3, y = 5, g[2] = {0, 0};
    assert_int_equal(dsim_model_loss_grad(&s, p, &x, &y, 1, 1.0f, g, &loss), DSIM_OK);
    assert_true(loss == 4.0);
    assert_true(g[0] == 12.0f && g[1] == 4.0f);
    /* scale 0.5 adds half of it on top. */
    assert_int_equal(dsim_model_loss_grad(&s, p, &x, &y, 1, 0.5f, g, &loss), DSIM_OK);
    assert_true(g[0] == 18.0f && g[1] == 6.0f);

    /* MSE is the mean over outputs: W = I, b = 0, x = (1, 2), y = 0:
     * loss (1 + 4) / 2 = 2.5; dW row j = 2 r_j / 2 * x, db = r. */
    s = spec_of(DSIM_MODEL_LINEAR, DSIM_LOSS_AUTO, 2, 2, 0, 0, 0);
    float p2[6] = {1, 0, 0, 1, 0, 0}, x2[2] = {1, 2}, y2[2] = {0, 0}, g2[6] = {0};
    assert_int_equal(dsim_model_loss_grad(&s, p2, x2, y2, 1, 1.0f, g2, &loss), DSIM_OK);
    assert_true(loss == 2.5);
    float want2[6] = {1, 2, 2, 4, 1, 2};
    assert_memory_equal(g2, want2, sizeof want2);

    /* softmax 1 -> 2 with logits (0, ln 3): p = (1/4, 3/4); label 0:
     * loss ln 4, d logits = p - onehot = (-3/4, 3/4) = dW (x = 1) = db. */
    s = spec_of(DSIM_MODEL_SOFTMAX, DSIM_LOSS_AUTO, 1, 2, 0, 0, 0);
    float p3[4] = {0, 0, 0, (float)log(3.0)}, x3 = 1, y3 = 0, g3[4] = {0};
    assert_int_equal(dsim_model_loss_grad(&s, p3, &x3, &y3, 1, 1.0f, g3, &loss), DSIM_OK);
    assert_close(loss, log(4.0), 1e-7);
    float want3[4] = {-0.75f, 0.75f, -0.75f, 0.75f};
    for (int k = 0; k < 4; k++)
        assert_close(g3[k], want3[k], 1e-7);

    /* Logits 1000 apart: without the max subtraction exp overflows. Label 1
     * (the small logit): loss 1000, d logits (1, -1). Label 0: loss 0. */
    float p4[4] = {0, 0, 1000, 0}, y4 = 1, g4[4] = {0};
    assert_int_equal(dsim_model_loss_grad(&s, p4, &x3, &y4, 1, 1.0f, g4, &loss), DSIM_OK);
    assert_true(loss == 1000.0);
    float want4[4] = {1, -1, 1, -1};
    assert_memory_equal(g4, want4, sizeof want4);
    y4 = 0;
    memset(g4, 0, sizeof g4);
    assert_int_equal(dsim_model_loss_grad(&s, p4, &x3, &y4, 1, 1.0f, g4, &loss), DSIM_OK);
    assert_true(loss == 0.0);
    for (int k = 0; k < 4; k++)
        assert_true(isfinite(g4[k]) && fabsf(g4[k]) < 1e-30f);
}

/* The test's own forward pass, in double, written from the definitions in
 * dsim/model.h. Returns the example's loss; *margin receives the smallest
 * |pre-activation| of a hidden unit (how close the example is to a ReLU
 * kink), *argmax the top logit. */
static double ref_example(const dsim_model_spec *s, const dsim_model_layout *lay, const float *p,
                          const float *x, const float *y, double *margin, size_t *argmax)
{
    double a[64], z[64];
    for (size_t i = 0; i < s->in_dim; i++)
        a[i] = x[i];
    double m = INFINITY;
    for (size_t l = 0; l < lay->n_layers; l++) {
        const dsim_model_layer *L = &lay->layer[l];
        assert_true(L->in <= 64 && L->out <= 64);
        for (size_t j = 0; j < L->out; j++) {
            double v = p[L->b_off + j];
            for (size_t i = 0; i < L->in; i++)
                v += (double)p[L->w_off + j * L->in + i] * a[i];
            z[j] = v;
        }
        if (l + 1 < lay->n_layers) {
            for (size_t j = 0; j < L->out; j++) {
                m = fmin(m, fabs(z[j]));
                a[j] = z[j] > 0 ? z[j] : 0;
            }
        }
    }
    if (margin)
        *margin = m;
    size_t best = 0;
    for (size_t j = 1; j < s->out_dim; j++)
        if (z[j] > z[best])
            best = j;
    if (argmax)
        *argmax = best;
    if (dsim_model_loss(s) == DSIM_LOSS_MSE) {
        double sum = 0;
        for (size_t j = 0; j < s->out_dim; j++)
            sum += (z[j] - y[j]) * (z[j] - y[j]);
        return sum / (double)s->out_dim;
    }
    double se = 0;
    for (size_t j = 0; j < s->out_dim; j++)
        se += exp(z[j]);
    return log(se) - z[(size_t)y[0]];
}

/* A batch of n random examples for s; for an mlp every example is kept at
 * least `kink` away from every ReLU kink, so that the finite-difference
 * steps below never cross one. */
static void random_batch(const dsim_model_spec *s, const float *params, dsim_rng *r, size_t n,
                         double kink, float *x, float *y)
{
    dsim_model_layout lay;
    assert_int_equal(dsim_model_layout_of(s, &lay), DSIM_OK);
    size_t yd = dsim_model_y_dim(s);
    for (size_t e = 0; e < n; e++) {
        for (size_t j = 0; j < yd; j++)
            y[e * yd + j] = dsim_model_loss(s) == DSIM_LOSS_MSE
                                ? (float)dsim_rng_normal(r)
                                : (float)dsim_rng_below(r, s->out_dim);
        for (int tries = 0;; tries++) {
            assert_true(tries < 1000);
            for (size_t i = 0; i < s->in_dim; i++)
                x[e * s->in_dim + i] = (float)dsim_rng_normal(r);
            double margin;
            ref_example(s, &lay, params, x + e * s->in_dim, y + e * yd, &margin, NULL);
            if (margin >= kink)
                break;
        }
    }
}

/* Central differences on the library's own loss. The loss is computed in
 * double from float parameters, so the step is taken between the two float
 * neighbours pp and pm actually used and divided by their true distance.
 *
 * Tolerance: |g - fd| <= 2e-5 |fd| + 2e-6 * n. The analytic gradient is
 * exact up to one float rounding (6e-8 relative). The central difference
 * with step h ~ 1e-3 has truncation error h^2/6 |L'''|, about 1e-7 per
 * example for these O(1) inputs, plus cancellation error ~1e-16 |L| / h,
 * negligible. The bound is ~10x the worst error measured over all kinds
 * (printed below); a wrong term in any gradient is off by O(1e-2) or more. */
#define FD_H    0x1p-10
#define FD_RTOL 1e-5
#define FD_ATOL 5e-7

static void check_fd(const dsim_model_spec *s, uint64_t seed, size_t n, const char *what)
{
    dsim_model_layout lay;
    assert_int_equal(dsim_model_layout_of(s, &lay), DSIM_OK);
    size_t P = lay.n_params, yd = dsim_model_y_dim(s);
    float *params = malloc(P * sizeof(float));
    float *grad = calloc(P, sizeof(float));
    float *x = malloc(n * s->in_dim * sizeof(float));
    float *y = malloc(n * yd * sizeof(float));
    assert_non_null(params);
    assert_non_null(grad);
    assert_non_null(x);
    assert_non_null(y);
    dsim_rng r;
    dsim_rng_init(&r, seed, "test.fd", 0);
    for (size_t k = 0; k < P; k++)
        params[k] = (float)(0.6 * dsim_rng_normal(&r));
    random_batch(s, params, &r, n, 0.05, x, y);

    double L0;
    assert_int_equal(dsim_model_loss_grad(s, params, x, y, n, 1.0f, grad, &L0), DSIM_OK);
    double ref = 0;
    for (size_t e = 0; e < n; e++)
        ref += ref_example(s, &lay, params, x + e * s->in_dim, y + e * yd, NULL, NULL);
    assert_close(L0, ref, 1e-12 * (1 + fabs(ref)));

    double worst = 0, worst_abs = 0;
    for (size_t k = 0; k < P; k++) {
        float p = params[k];
        double h = FD_H * fmax(1.0, fabs(p));
        float pp = (float)(p + h), pm = (float)(p - h);
        double Lp, Lm;
        params[k] = pp;
        assert_int_equal(dsim_model_loss_grad(s, params, x, y, n, 1.0f, NULL, &Lp), DSIM_OK);
        params[k] = pm;
        assert_int_equal(dsim_model_loss_grad(s, params, x, y, n, 1.0f, NULL, &Lm), DSIM_OK);
        params[k] = p;
        double fd = (Lp - Lm) / ((double)pp - (double)pm);
        double err = fabs((double)grad[k] - fd);
        double tol = FD_RTOL * fabs(fd) + FD_ATOL * (double)n;
        if (err > tol)
            fail_msg("%s: param %zu: analytic %.9g, finite difference %.9g (error %.3g > %.3g)",
                     what, k, (double)grad[k], fd, err, tol);
        if (err / tol > worst)
            worst = err / tol;
        if (err > worst_abs)
            worst_abs = err;
    }
    print_message("fd %-22s %3zu params: max |g - fd| = %.2e, max error/tolerance = %.3f\n", what,
                  P, worst_abs, worst);
    free(params);
    free(grad);
    free(x);
    free(y);
}

static void test_fd_linear(void **state)
{
    (void)state;
    dsim_model_spec s = spec_of(DSIM_MODEL_LINEAR, DSIM_LOSS_AUTO, 5, 3, 0, 0, 0);
    check_fd(&s, 1, 7, "linear 5->3 mse");
}

static void test_fd_softmax(void **state)
{
    (void)state;
    dsim_model_spec s = spec_of(DSIM_MODEL_SOFTMAX, DSIM_LOSS_AUTO, 6, 4, 0, 0, 0);
    check_fd(&s, 2, 9, "softmax 6->4 xent");
}

static void test_fd_mlp1(void **state)
{
    (void)state;
    dsim_model_spec s = spec_of(DSIM_MODEL_MLP, DSIM_LOSS_AUTO, 4, 3, 1, 6, 0);
    check_fd(&s, 3, 8, "mlp 4-6-3 xent");
    s = spec_of(DSIM_MODEL_MLP, DSIM_LOSS_MSE, 4, 2, 1, 5, 0);
    check_fd(&s, 4, 8, "mlp 4-5-2 mse");
}

static void test_fd_mlp2(void **state)
{
    (void)state;
    dsim_model_spec s = spec_of(DSIM_MODEL_MLP, DSIM_LOSS_AUTO, 4, 3, 2, 6, 5);
    check_fd(&s, 5, 8, "mlp 4-6-5-3 xent");
    s = spec_of(DSIM_MODEL_MLP, DSIM_LOSS_MSE, 3, 2, 2, 4, 5);
    check_fd(&s, 6, 8, "mlp 3-4-5-2 mse");
}

typedef struct batch {
    dsim_model_spec s;
    size_t P, n, yd;
    float *params, *x, *y;
} batch;

static void batch_make(batch *b, dsim_model_spec s, size_t n, uint64_t seed)
{
    b->s = s;
    b->P = dsim_model_num_params(&s);
    b->n = n;
    b->yd = dsim_model_y_dim(&s);
    b->params = malloc(b->P * sizeof(float));
    b->x = malloc(n * s.in_dim * sizeof(float));
    b->y = malloc(n * b->yd * sizeof(float));
    assert_non_null(b->params);
    assert_non_null(b->x);
    assert_non_null(b->y);
    dsim_rng r;
    dsim_rng_init(&r, seed, "test.batch", 0);
    assert_int_equal(dsim_model_init(&s, b->params, &r), DSIM_OK);
    for (size_t k = 0; k < b->P; k++)
        b->params[k] += (float)(0.1 * dsim_rng_normal(&r)); /* non-zero biases too */
    random_batch(&s, b->params, &r, n, 0.0, b->x, b->y);
}

static void batch_free(batch *b)
{
    free(b->params);
    free(b->x);
    free(b->y);
}

static float *grad_of(const batch *b, size_t e0, size_t n, float scale, double *loss)
{
    float *g = calloc(b->P, sizeof(float));
    assert_non_null(g);
    assert_int_equal(dsim_model_loss_grad(&b->s, b->params, b->x + e0 * b->s.in_dim,
                                          b->y + e0 * b->yd, n, scale, g, loss),
                     DSIM_OK);
    return g;
}

static void test_scale_is_linear(void **state)
{
    (void)state;
    batch b;
    batch_make(&b, spec_of(DSIM_MODEL_MLP, DSIM_LOSS_AUTO, 5, 4, 2, 7, 6), 16, 11);
    double l1, lq, ls;
    float *g1 = grad_of(&b, 0, b.n, 1.0f, &l1);
    float *gq = grad_of(&b, 0, b.n, 0.25f, &lq);
    float *gs = grad_of(&b, 0, b.n, 1.0f / 7.0f, &ls);
    float *gn = grad_of(&b, 0, b.n, -1.0f, NULL);
    /* The loss sum is reported unscaled. */
    assert_true(l1 == lq && l1 == ls);
    for (size_t k = 0; k < b.P; k++) {
        /* A power of two scales the double sum exactly before its one
         * rounding, so the bits agree. */
        assert_true(gq[k] == 0.25f * g1[k]);
        assert_true(gn[k] == -g1[k]);
        /* Otherwise both are one rounding from the same double: within one
         * float ulp of each other. */
        double want = (double)g1[k] * (double)(1.0f / 7.0f);
        assert_true(fabs((double)gs[k] - want) <= 0x1p-23 * fabs(want));
    }
    /* Accumulation: grad_accum is added to, and a batch in two calls equals
     * the batch in one call up to the extra rounding of the first partial
     * sum (at most one ulp of each partial). */
    float *ga = grad_of(&b, 0, 6, 1.0f, NULL);
    float *gb = grad_of(&b, 6, b.n - 6, 1.0f, NULL);
    float *g2 = calloc(b.P, sizeof(float));
    assert_non_null(g2);
    assert_int_equal(dsim_model_loss_grad(&b.s, b.params, b.x, b.y, 6, 1.0f, g2, NULL), DSIM_OK);
    assert_int_equal(dsim_model_loss_grad(&b.s, b.params, b.x + 6 * b.s.in_dim, b.y + 6 * b.yd,
                                          b.n - 6, 1.0f, g2, NULL),
                     DSIM_OK);
    for (size_t k = 0; k < b.P; k++) {
        double bound = 0x1p-23 * (fabs(ga[k]) + fabs(ga[k] + gb[k])) + 1e-30;
        assert_true(fabs((double)g2[k] - (double)g1[k]) <= bound);
    }
    free(g1);
    free(gq);
    free(gs);
    free(gn);
    free(ga);
    free(gb);
    free(g2);
    batch_free(&b);
}

/* TF's loss scaling: R replicas each add (1/G) x their share; the SUM of
 * those equals the global batch's gradient scaled by 1/G up to the float
 * rounding of R partial sums. */
static void test_replica_sum_matches_global(void **state)
{
    (void)state;
    batch b;
    batch_make(&b, spec_of(DSIM_MODEL_SOFTMAX, DSIM_LOSS_AUTO, 6, 3, 0, 0, 0), 14, 12);
    const float scale = 1.0f / (float)b.n;
    double lg;
    float *global = grad_of(&b, 0, b.n, scale, &lg);
    size_t share[4] = {4, 4, 3, 3}; /* batch_sizes_for_worker for G = 14, N = 4 */
    float *sum = calloc(b.P, sizeof(float));
    float *mag = calloc(b.P, sizeof(float));
    assert_non_null(sum);
    assert_non_null(mag);
    double ls = 0;
    for (size_t r = 0, e0 = 0; r < 4; e0 += share[r], r++) {
        double l;
        float *g = grad_of(&b, e0, share[r], scale, &l);
        ls += l;
        for (size_t k = 0; k < b.P; k++) {
            sum[k] += g[k];
            mag[k] += fabsf(g[k]);
        }
        free(g);
    }
    assert_close(ls, lg, 1e-12 * lg);
    for (size_t k = 0; k < b.P; k++)
        assert_true(fabs((double)sum[k] - (double)global[k]) <= 8 * 0x1p-24 * (mag[k] + 1e-30));
    free(global);
    free(sum);
    free(mag);
    batch_free(&b);
}

static void test_deterministic(void **state)
{
    (void)state;
    batch b;
    batch_make(&b, spec_of(DSIM_MODEL_MLP, DSIM_LOSS_AUTO, 9, 5, 2, 16, 12), 64, 13);
    double l1, l2;
    float *g1 = grad_of(&b, 0, b.n, 1.0f / 64, &l1);
    float *g2 = grad_of(&b, 0, b.n, 1.0f / 64, &l2);
    assert_memory_equal(g1, g2, b.P * sizeof(float));
    assert_memory_equal(&l1, &l2, sizeof l1);
    /* Same values at other addresses (another replica's buffers, another
     * alignment) give the same bits. */
    float *p2 = malloc((b.P + 1) * sizeof(float));
    float *x2 = malloc((b.n * b.s.in_dim + 3) * sizeof(float));
    float *g3 = calloc(b.P + 1, sizeof(float));
    assert_non_null(p2);
    assert_non_null(x2);
    assert_non_null(g3);
    memcpy(p2 + 1, b.params, b.P * sizeof(float));
    memcpy(x2 + 3, b.x, b.n * b.s.in_dim * sizeof(float));
    double l3;
    assert_int_equal(dsim_model_loss_grad(&b.s, p2 + 1, x2 + 3, b.y, b.n, 1.0f / 64, g3 + 1, &l3),
                     DSIM_OK);
    assert_memory_equal(g1, g3 + 1, b.P * sizeof(float));
    assert_memory_equal(&l1, &l3, sizeof l1);
    free(p2);
    free(x2);
    free(g3);
    free(g1);
    free(g2);
    batch_free(&b);
}

static void test_bad_labels_leave_grad_untouched(void **state)
{
    (void)state;
    batch b;
    batch_make(&b, spec_of(DSIM_MODEL_SOFTMAX, DSIM_LOSS_AUTO, 3, 3, 0, 0, 0), 4, 14);
    float bad[] = {3.0f, 1.5f, -1.0f, NAN, INFINITY};
    float *g = calloc(b.P, sizeof(float));
    float *g0 = calloc(b.P, sizeof(float));
    assert_non_null(g);
    assert_non_null(g0);
    for (size_t k = 0; k < b.P; k++)
        g[k] = g0[k] = (float)k;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        float keep = b.y[2];
        b.y[2] = bad[i];
        double loss = 123;
        dsim_clear_error();
        assert_int_equal(dsim_model_loss_grad(&b.s, b.params, b.x, b.y, b.n, 1.0f, g, &loss),
                         DSIM_EINVAL);
        assert_non_null(strstr(dsim_errmsg(), "example 2"));
        assert_non_null(strstr(dsim_errmsg(), "class index"));
        assert_memory_equal(g, g0, b.P * sizeof(float));
        assert_int_equal(dsim_model_eval(&b.s, b.params, b.x, b.y, b.n, &loss, NULL), DSIM_EINVAL);
        b.y[2] = keep;
    }
    assert_int_equal(dsim_model_loss_grad(&b.s, b.params, b.x, b.y, b.n, NAN, g, NULL),
                     DSIM_EINVAL);
    assert_int_equal(dsim_model_loss_grad(&b.s, NULL, b.x, b.y, b.n, 1.0f, g, NULL), DSIM_EINVAL);
    assert_int_equal(dsim_model_loss_grad(&b.s, b.params, NULL, b.y, b.n, 1.0f, g, NULL),
                     DSIM_EINVAL);
    assert_memory_equal(g, g0, b.P * sizeof(float));

    /* An empty batch (a replica without data) adds nothing. */
    double loss = 5;
    assert_int_equal(dsim_model_loss_grad(&b.s, b.params, NULL, NULL, 0, 1.0f, g, &loss), DSIM_OK);
    assert_true(loss == 0.0);
    assert_memory_equal(g, g0, b.P * sizeof(float));
    free(g);
    free(g0);
    batch_free(&b);
}

static void test_predict_and_eval(void **state)
{
    (void)state;
    const dsim_model_spec specs[2] = {
        spec_of(DSIM_MODEL_MLP, DSIM_LOSS_AUTO, 5, 4, 1, 8, 0),
        spec_of(DSIM_MODEL_MLP, DSIM_LOSS_MSE, 5, 3, 2, 8, 6),
    };
    for (int t = 0; t < 2; t++) {
        batch b;
        batch_make(&b, specs[t], 40, 15 + t);
        dsim_model_layout lay;
        assert_int_equal(dsim_model_layout_of(&b.s, &lay), DSIM_OK);
        float *out = malloc(b.n * b.s.out_dim * sizeof(float));
        assert_non_null(out);
        assert_int_equal(dsim_model_predict(&b.s, b.params, b.x, b.n, out), DSIM_OK);
        double ref = 0;
        size_t correct = 0;
        for (size_t e = 0; e < b.n; e++) {
            size_t am;
            ref +=
                ref_example(&b.s, &lay, b.params, b.x + e * b.s.in_dim, b.y + e * b.yd, NULL, &am);
            if (t == 0)
                correct += am == (size_t)b.y[e];
            size_t best = 0;
            for (size_t j = 1; j < b.s.out_dim; j++)
                if (out[e * b.s.out_dim + j] > out[e * b.s.out_dim + best])
                    best = j;
            if (t == 0)
                assert_int_equal(best, am);
        }
        double loss, lg;
        size_t nc = 99;
        assert_int_equal(dsim_model_eval(&b.s, b.params, b.x, b.y, b.n, &loss, &nc), DSIM_OK);
        float *g = grad_of(&b, 0, b.n, 1.0f, &lg);
        assert_true(loss == lg);
        assert_close(loss, ref, 1e-12 * ref);
        assert_int_equal(nc, t == 0 ? correct : 0);
        free(g);
        free(out);
        batch_free(&b);
    }
}

static void test_init(void **state)
{
    (void)state;
    dsim_model_spec s = spec_of(DSIM_MODEL_MLP, DSIM_LOSS_AUTO, 30, 10, 2, 50, 20);
    dsim_model_layout lay;
    assert_int_equal(dsim_model_layout_of(&s, &lay), DSIM_OK);
    float *a = malloc(lay.n_params * sizeof(float));
    float *b = malloc(lay.n_params * sizeof(float));
    assert_non_null(a);
    assert_non_null(b);
    dsim_rng r;
    dsim_rng_init(&r, 7, "model.init", 0);
    assert_int_equal(dsim_model_init(&s, a, &r), DSIM_OK);
    dsim_rng_init(&r, 7, "model.init", 0);
    assert_int_equal(dsim_model_init(&s, b, &r), DSIM_OK);
    assert_memory_equal(a, b, lay.n_params * sizeof(float));
    dsim_rng_init(&r, 8, "model.init", 0);
    assert_int_equal(dsim_model_init(&s, b, &r), DSIM_OK);
    assert_memory_not_equal(a, b, lay.n_params * sizeof(float));
    for (size_t l = 0; l < lay.n_layers; l++) {
        const dsim_model_layer *L = &lay.layer[l];
        double limit = sqrt(6.0 / (double)(L->in + L->out)), sum2 = 0;
        size_t nw = L->in * L->out;
        for (size_t k = 0; k < nw; k++) {
            float w = a[L->w_off + k];
            assert_true(fabs(w) <= limit);
            sum2 += (double)w * w;
        }
        /* U(-l, l) has variance l^2/3; with >= 200 draws the sample variance
         * lies well within 30 % of it. */
        double var = sum2 / (double)nw;
        assert_true(fabs(var / (limit * limit / 3) - 1) < 0.3);
        for (size_t j = 0; j < L->out; j++)
            assert_true(a[L->b_off + j] == 0.0f);
    }
    assert_int_equal(dsim_model_init(&s, NULL, &r), DSIM_EINVAL);
    free(a);
    free(b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_validate_rejects_bad_specs),
        cmocka_unit_test(test_names_parse),
        cmocka_unit_test(test_layout),
        cmocka_unit_test(test_vars),
        cmocka_unit_test(test_hand_computed_losses),
        cmocka_unit_test(test_fd_linear),
        cmocka_unit_test(test_fd_softmax),
        cmocka_unit_test(test_fd_mlp1),
        cmocka_unit_test(test_fd_mlp2),
        cmocka_unit_test(test_scale_is_linear),
        cmocka_unit_test(test_replica_sum_matches_global),
        cmocka_unit_test(test_deterministic),
        cmocka_unit_test(test_bad_labels_leave_grad_untouched),
        cmocka_unit_test(test_predict_and_eval),
        cmocka_unit_test(test_init),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
