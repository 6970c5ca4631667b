/* The model kernels: every set this CPU runs (dsim_model_kernels_list)
 * gives, bit for bit, the operations dsim/model.h's "Numerics" paragraph
 * documents, worked out here one scalar operation at a time: the forward
 * dot product in 8 partial sums combined by its fixed tree, the gradient
 * summed in example order and rounded once, the optimizers' scalar rules.
 * Shapes with widths that are not multiples of 8, batches that span the
 * kernels' blocks of examples, and buffers off their usual alignment. */
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
#include "dsim/optim.h"
#include "dsim/rng.h"
#include "dsim/strategy.h"

#define MAXW 300 /* widest layer of the shapes below */

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

/* The documented dot product. */
static double ref_dot(const float *w, const double *a, size_t in)
{
    double s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (size_t i = 0; i < in; i++)
        s[i % 8] += (double)w[i] * a[i];
    return ((s[0] + s[4]) + (s[2] + s[6])) + ((s[1] + s[5]) + (s[3] + s[7]));
}

/* One example's forward pass: acts[l] is the input of layer l, zs[l] its
 * output before the ReLU. */
static void ref_forward(const dsim_model_layout *lay, const float *p, const float *x,
                        double acts[][MAXW], double zs[][MAXW])
{
    for (size_t i = 0; i < lay->layer[0].in; i++)
        acts[0][i] = x[i];
    for (size_t l = 0; l < lay->n_layers; l++) {
        const dsim_model_layer *L = &lay->layer[l];
        for (size_t j = 0; j < L->out; j++)
            zs[l][j] = (double)p[L->b_off + j] + ref_dot(p + L->w_off + j * L->in, acts[l], L->in);
        if (l + 1 < lay->n_layers)
            for (size_t j = 0; j < L->out; j++)
                acts[l + 1][j] = zs[l][j] > 0.0 ? zs[l][j] : 0.0;
    }
}

/* The loss of one example and d loss / d z, as dsim/model.h defines them. */
static double ref_top(const dsim_model_spec *s, const double *z, const float *y, double *delta)
{
    size_t out = s->out_dim;
    if (dsim_model_loss(s) == DSIM_LOSS_MSE) {
        double sum = 0.0;
        for (size_t j = 0; j < out; j++) {
            double r = z[j] - (double)y[j];
            sum += r * r;
            delta[j] = 2.0 * r / (double)out;
        }
        return sum / (double)out;
    }
    size_t c = (size_t)y[0];
    double m = z[0];
    for (size_t j = 1; j < out; j++)
        if (z[j] > m)
            m = z[j];
    double se = 0.0;
    for (size_t j = 0; j < out; j++)
        se += exp(z[j] - m);
    double lse = m + log(se);
    for (size_t j = 0; j < out; j++)
        delta[j] = exp(z[j] - lse) - (j == c ? 1.0 : 0.0);
    return lse - z[c];
}

/* grad += scale * (the gradient summed in example order), rounded once. */
static double ref_loss_grad(const dsim_model_spec *s, const float *p, const float *x,
                            const float *y, size_t n, float scale, float *grad)
{
    dsim_model_layout lay;
    assert_int_equal(dsim_model_layout_of(s, &lay), DSIM_OK);
    double *acc = calloc(lay.n_params, sizeof(double));
    static double acts[DSIM_MODEL_MAX_HIDDEN + 1][MAXW], zs[DSIM_MODEL_MAX_HIDDEN + 1][MAXW];
    static double delta[MAXW], below[MAXW];
    assert_non_null(acc);
    size_t yd = dsim_model_y_dim(s), top = lay.n_layers - 1;
    double total = 0.0;
    for (size_t e = 0; e < n; e++) {
        ref_forward(&lay, p, x + e * s->in_dim, acts, zs);
        total += ref_top(s, zs[top], y + e * yd, delta);
        for (size_t l = lay.n_layers; l-- > 0;) {
            const dsim_model_layer *L = &lay.layer[l];
            for (size_t j = 0; j < L->out; j++) {
                acc[L->b_off + j] += delta[j];
                for (size_t i = 0; i < L->in; i++)
                    acc[L->w_off + j * L->in + i] += delta[j] * acts[l][i];
            }
            if (l == 0)
                break;
            for (size_t i = 0; i < L->in; i++) {
                double b = 0.0;
                for (size_t j = 0; j < L->out; j++)
                    b += (double)p[L->w_off + j * L->in + i] * delta[j];
                below[i] = zs[l - 1][i] > 0.0 ? b : 0.0;
            }
            memcpy(delta, below, L->in * sizeof(double));
        }
    }
    for (size_t k = 0; k < lay.n_params; k++)
        grad[k] = (float)((double)grad[k] + (double)scale * acc[k]);
    free(acc);
    return total;
}

typedef struct shape {
    dsim_model_spec s;
    size_t n;
} shape;

static const char *kernel_names[8];
static size_t n_kernels;

static int setup(void **state)
{
    (void)state;
    n_kernels = dsim_model_kernels_list(kernel_names, 8);
    return n_kernels >= 1 ? 0 : -1;
}

/* x, y, params for a shape: params random (non-zero biases), x normal,
 * labels valid; each buffer one float past a 64-byte boundary when off. */
static void fill(const shape *sh, dsim_rng *r, float *p, float *x, float *y)
{
    size_t P = dsim_model_num_params(&sh->s), yd = dsim_model_y_dim(&sh->s);
    assert_int_equal(dsim_model_init(&sh->s, p, r), DSIM_OK);
    for (size_t k = 0; k < P; k++)
        p[k] += (float)(0.05 * dsim_rng_normal(r));
    for (size_t i = 0; i < sh->n * sh->s.in_dim; i++)
        x[i] = (float)dsim_rng_normal(r);
    for (size_t e = 0; e < sh->n; e++)
        for (size_t j = 0; j < yd; j++)
            y[e * yd + j] = dsim_model_loss(&sh->s) == DSIM_LOSS_MSE
                                ? (float)dsim_rng_normal(r)
                                : (float)dsim_rng_below(r, sh->s.out_dim);
}

static void check_shape(const shape *sh, uint64_t seed)
{
    const dsim_model_spec *s = &sh->s;
    size_t P = dsim_model_num_params(s), yd = dsim_model_y_dim(s), n = sh->n;
    /* One float in: off the alignment malloc gives. */
    float *pb = malloc((P + 1) * sizeof(float)), *xb = malloc((n * s->in_dim + 1) * sizeof(float));
    float *yb = malloc((n * yd + 1) * sizeof(float)), *want = malloc(P * sizeof(float));
    float *got = malloc((P + 1) * sizeof(float)), *out = malloc(n * s->out_dim * sizeof(float));
    assert_true(pb && xb && yb && want && got && out);
    float *p = pb + 1, *x = xb + 1, *y = yb + 1, *g = got + 1;
    dsim_rng r;
    dsim_rng_init(&r, seed, "test.kernels", 0);
    fill(sh, &r, p, x, y);
    /* A gradient buffer that already holds something: the call adds to it. */
    for (size_t k = 0; k < P; k++)
        want[k] = (float)(0.01 * dsim_rng_normal(&r));
    float scale = 1.0f / (float)(n + 2);
    float *start = malloc(P * sizeof(float));
    assert_non_null(start);
    memcpy(start, want, P * sizeof(float));
    double ref_loss = ref_loss_grad(s, p, x, y, n, scale, want);

    dsim_model_layout lay;
    assert_int_equal(dsim_model_layout_of(s, &lay), DSIM_OK);
    for (size_t k = 0; k < n_kernels; k++) {
        assert_int_equal(dsim_model_kernels_use(kernel_names[k]), DSIM_OK);
        assert_string_equal(dsim_model_kernels(), kernel_names[k]);
        memcpy(g, start, P * sizeof(float));
        double loss = -1;
        assert_int_equal(dsim_model_loss_grad(s, p, x, y, n, scale, g, &loss), DSIM_OK);
        if (memcmp(&loss, &ref_loss, sizeof loss) != 0)
            fail_msg("%s kernels, %s %zu->%zu, n %zu: loss %.17g, documented %.17g",
                     kernel_names[k], dsim_model_kind_name(s->kind), s->in_dim, s->out_dim, n, loss,
                     ref_loss);
        for (size_t q = 0; q < P; q++)
            if (memcmp(&g[q], &want[q], sizeof(float)) != 0)
                fail_msg("%s kernels, %s %zu->%zu, n %zu: gradient %zu is %a, documented %a",
                         kernel_names[k], dsim_model_kind_name(s->kind), s->in_dim, s->out_dim, n,
                         q, (double)g[q], (double)want[q]);
        /* loss_grad_set: the bits of loss_grad into zeros, whatever grad held
         * (NaN here), a negative scale included (a +0 sum times it is -0). */
        for (int sign = -1; sign <= 1; sign += 2) {
            for (size_t q = 0; q < P; q++)
                g[q] = NAN;
            double ls = -1, lz = -2;
            assert_int_equal(dsim_model_loss_grad_set(s, p, x, y, n, (float)sign * scale, g, &ls),
                             DSIM_OK);
            float *z = calloc(P, sizeof(float));
            assert_non_null(z);
            assert_int_equal(dsim_model_loss_grad(s, p, x, y, n, (float)sign * scale, z, &lz),
                             DSIM_OK);
            assert_memory_equal(g, z, P * sizeof(float));
            assert_memory_equal(&ls, &lz, sizeof ls);
            free(z);
        }
        /* predict: the outputs of the documented forward pass, rounded. */
        assert_int_equal(dsim_model_predict(s, p, x, n, out), DSIM_OK);
        static double acts[DSIM_MODEL_MAX_HIDDEN + 1][MAXW], zs[DSIM_MODEL_MAX_HIDDEN + 1][MAXW];
        for (size_t e = 0; e < n; e++) {
            ref_forward(&lay, p, x + e * s->in_dim, acts, zs);
            for (size_t j = 0; j < s->out_dim; j++)
                assert_true(out[e * s->out_dim + j] == (float)zs[lay.n_layers - 1][j]);
        }
        /* eval: the same loss as loss_grad's. */
        double el = -1;
        assert_int_equal(dsim_model_eval(s, p, x, y, n, &el, NULL), DSIM_OK);
        assert_memory_equal(&el, &ref_loss, sizeof el);
    }
    assert_int_equal(dsim_model_kernels_use("auto"), DSIM_OK);
    free(pb);
    free(xb);
    free(yb);
    free(want);
    free(got);
    free(out);
    free(start);
}

static void test_documented_bits(void **state)
{
    (void)state;
    const shape shapes[] = {
        {spec_of(DSIM_MODEL_LINEAR, DSIM_LOSS_AUTO, 5, 3, 0, 0, 0), 7},
        {spec_of(DSIM_MODEL_LINEAR, DSIM_LOSS_AUTO, 1, 1, 0, 0, 0), 3},
        {spec_of(DSIM_MODEL_SOFTMAX, DSIM_LOSS_AUTO, 13, 4, 0, 0, 0), 1},
        {spec_of(DSIM_MODEL_SOFTMAX, DSIM_LOSS_AUTO, 8, 4, 0, 0, 0), 8},
        {spec_of(DSIM_MODEL_SOFTMAX, DSIM_LOSS_AUTO, 33, 10, 0, 0, 0), 65},
        {spec_of(DSIM_MODEL_MLP, DSIM_LOSS_AUTO, 9, 5, 1, 17, 0), 4},
        {spec_of(DSIM_MODEL_MLP, DSIM_LOSS_MSE, 3, 2, 2, 4, 5), 11},
        {spec_of(DSIM_MODEL_MLP, DSIM_LOSS_AUTO, 16, 3, 2, 24, 7), 130},
        {spec_of(DSIM_MODEL_MLP, DSIM_LOSS_AUTO, 120, 16, 2, 256, 128), 4},
        {spec_of(DSIM_MODEL_MLP, DSIM_LOSS_AUTO, 120, 16, 2, 256, 128), 69},
        {spec_of(DSIM_MODEL_MLP, DSIM_LOSS_MSE, 300, 1, 1, 1, 0), 5},
    };
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        check_shape(&shapes[i], 100 + i);
}

/* Every optimizer on every kernel set: the scalar rule of optim.c's header,
 * operand for operand, over enough parameters for the vector loops and a
 * tail. */
static void test_optimizers(void **state)
{
    (void)state;
    enum { NP = 8 * 5 + 3, STEPS = 3 };
    for (int kind = 0; kind < 7; kind++) {
        dsim_optim_spec sp;
        dsim_optim_spec_default(&sp, kind == 3   ? DSIM_OPTIM_MOMENTUM
                                     : kind == 4 ? DSIM_OPTIM_NADAM
                                     : kind == 5 ? DSIM_OPTIM_LAMB
                                     : kind == 6 ? DSIM_OPTIM_ADADELTA
                                                 : (dsim_optim_kind)kind);
        sp.nesterov = kind == 3;
        float g[STEPS][NP], p0[NP];
        dsim_rng r;
        dsim_rng_init(&r, 7 + (uint64_t)kind, "test.kernels.optim", 0);
        for (int k = 0; k < NP; k++)
            p0[k] = (float)dsim_rng_normal(&r);
        for (int t = 0; t < STEPS; t++)
            for (int k = 0; k < NP; k++)
                g[t][k] = (float)(0.1 * dsim_rng_normal(&r));
        /* The rules, one element at a time. */
        float want[NP], m[NP] = {0}, v[NP] = {0};
        memcpy(want, p0, sizeof want);
        const float lr = (float)sp.lr, mom = (float)sp.momentum;
        float up = 1.0f; /* Nadam's u_product */
        for (int t = 0; t < STEPS; t++) {
            const float nb1 = (float)sp.beta1, nb2 = (float)sp.beta2, ft = (float)(t + 1);
            const float ut = nb1 * (1.0f - 0.5f * powf(0.96f, ft));
            const float ut1 = nb1 * (1.0f - 0.5f * powf(0.96f, (float)(t + 2)));
            up = (up * nb1) * (1.0f - 0.5f * powf(0.96f, ft));
            if (sp.kind == DSIM_OPTIM_LAMB) { /* one variable: the whole buffer */
                const float c1 = 1.0f - powf(nb1, ft), c2 = 1.0f - powf(nb2, ft);
                float u[NP];
                double ww = 0, uu = 0;
                for (int k = 0; k < NP; k++) {
                    float gk = g[t][k];
                    m[k] += (gk - m[k]) * (float)(1.0 - sp.beta1);
                    v[k] += (gk * gk - v[k]) * (float)(1.0 - sp.beta2);
                    u[k] = (m[k] / c1) / (sqrtf(v[k] / c2) + (float)sp.epsilon);
                }
                for (int k = 0; k < NP; k++) {
                    ww += (double)want[k] * (double)want[k];
                    uu += (double)u[k] * (double)u[k];
                }
                const float rl = (sqrtf((float)ww) / sqrtf((float)uu)) * lr;
                for (int k = 0; k < NP; k++)
                    want[k] -= rl * u[k];
                continue;
            }
            double b1p = pow(sp.beta1, t + 1), b2p = pow(sp.beta2, t + 1);
            const float alpha = (float)(sp.lr * sqrt(1.0 - b2p) / (1.0 - b1p));
            const float omb1 = (float)(1.0 - sp.beta1), omb2 = (float)(1.0 - sp.beta2);
            const float eps = (float)sp.epsilon;
            for (int k = 0; k < NP; k++) {
                float gk = g[t][k];
                switch (sp.kind) {
                case DSIM_OPTIM_SGD:
                    want[k] -= lr * gk;
                    break;
                case DSIM_OPTIM_MOMENTUM:
                    m[k] = m[k] * mom + gk;
                    if (sp.nesterov)
                        want[k] -= gk * lr + m[k] * mom * lr;
                    else
                        want[k] -= lr * m[k];
                    break;
                case DSIM_OPTIM_ADAM:
                    m[k] += (gk - m[k]) * omb1;
                    v[k] += (gk * gk - v[k]) * omb2;
                    want[k] -= m[k] * alpha / (sqrtf(v[k]) + eps);
                    break;
                case DSIM_OPTIM_ADADELTA: { /* m: accumulated_grad, v: the deltas' */
                    const float rho = (float)sp.rho, omr = (float)(1.0 - sp.rho);
                    m[k] = rho * m[k] + omr * (gk * gk);
                    float d = -((sqrtf(v[k] + eps) * gk) / sqrtf(m[k] + eps));
                    v[k] = rho * v[k] + omr * (d * d);
                    want[k] += lr * d;
                    break;
                }
                case DSIM_OPTIM_NADAM: {
                    m[k] += (gk - m[k]) * (1.0f - nb1);
                    v[k] += (gk * gk - v[k]) * (1.0f - nb2);
                    float mh = (ut1 * m[k]) / (1.0f - up * ut1) + ((1.0f - ut) * gk) / (1.0f - up);
                    want[k] -= (mh * lr) / (sqrtf(v[k] / (1.0f - powf(nb2, ft))) + eps);
                    break;
                }
                default:
                    fail();
                }
            }
        }
        for (size_t kk = 0; kk < n_kernels; kk++) {
            assert_int_equal(dsim_model_kernels_use(kernel_names[kk]), DSIM_OK);
            dsim_optim *o = NULL;
            assert_int_equal(dsim_optim_create(&sp, NP, &o), DSIM_OK);
            float p[NP];
            memcpy(p, p0, sizeof p);
            for (int t = 0; t < STEPS; t++)
                assert_int_equal(dsim_optim_apply(o, p, g[t], NP), DSIM_OK);
            for (int k = 0; k < NP; k++)
                if (memcmp(&p[k], &want[k], sizeof(float)) != 0)
                    fail_msg("%s kernels, optimizer %s%s: parameter %d is %a, the rule gives %a",
                             kernel_names[kk], dsim_optim_kind_name(sp.kind),
                             sp.nesterov ? " (nesterov)" : "", k, (double)p[k], (double)want[k]);
            dsim_optim_destroy(o);
        }
        assert_int_equal(dsim_model_kernels_use("auto"), DSIM_OK);
    }
}

/* loss_grad_set of an empty batch sets the gradient to +0; NULL is refused. */
static void test_set_empty(void **state)
{
    (void)state;
    dsim_model_spec s = spec_of(DSIM_MODEL_SOFTMAX, DSIM_LOSS_AUTO, 3, 2, 0, 0, 0);
    float g[8];
    for (int k = 0; k < 8; k++)
        g[k] = -1.0f;
    double l = 5;
    assert_int_equal(dsim_model_loss_grad_set(&s, g, NULL, NULL, 0, 1.0f, g, &l), DSIM_OK);
    assert_true(l == 0.0);
    for (int k = 0; k < 8; k++)
        assert_true(g[k] == 0.0f && !signbit(g[k]));
    dsim_clear_error();
    assert_int_equal(dsim_model_loss_grad_set(&s, g, NULL, NULL, 0, 1.0f, NULL, &l), DSIM_EINVAL);
    assert_non_null(strstr(dsim_errmsg(), "grad"));
}

static void test_choosing(void **state)
{
    (void)state;
    const char *names[8];
    size_t n = dsim_model_kernels_list(names, 8);
    assert_true(n >= 1 && n <= 8);
    assert_string_equal(names[0], "generic"); /* every CPU runs the portable C */
    assert_int_equal(dsim_model_kernels_list(NULL, 0), n);
    /* auto is the fastest this CPU has: the last listed. */
    assert_int_equal(dsim_model_kernels_use(NULL), DSIM_OK);
    assert_string_equal(dsim_model_kernels(), names[n - 1]);
    dsim_clear_error();
    assert_int_equal(dsim_model_kernels_use("sse9"), DSIM_EINVAL);
    assert_non_null(strstr(dsim_errmsg(), "'sse9'"));
    assert_non_null(strstr(dsim_errmsg(), "generic"));
    assert_string_equal(dsim_model_kernels(), names[n - 1]); /* unchanged */
    print_message("kernels here: %zu, auto picks %s\n", n, dsim_model_kernels());
}

/* dsim_params_checksum as dsim export's manifest documents it, a byte and
 * a word at a time, against the library's (whichever lanes this CPU runs):
 * lengths around whole 64-byte blocks, and a large vector with every bit
 * of one parameter flipped in turn changing the result. */
static uint64_t cks_mix(uint64_t h)
{
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ull;
    return h ^ (h >> 33);
}

static uint64_t cks_documented(const float *p, size_t n)
{
    const unsigned char *b = (const unsigned char *)p;
    size_t len = 4 * n, whole = len / 64 * 64;
    uint64_t h[8];
    for (int k = 0; k < 8; k++)
        h[k] = 0xcbf29ce484222325ull + 0x9e3779b97f4a7c15ull * (uint64_t)k;
    for (size_t i = 0; i < whole; i += 8) {
        uint64_t w = 0;
        for (int j = 7; j >= 0; j--)
            w = w << 8 | b[i + (size_t)j];
        h[i / 8 % 8] = (h[i / 8 % 8] ^ w) * 0x100000001b3ull;
    }
    uint64_t r = (uint64_t)len;
    for (size_t i = whole; i < len; i++)
        r = (r ^ b[i]) * 0x100000001b3ull;
    for (int k = 0; k < 8; k++)
        r = cks_mix(r ^ cks_mix(h[k] + (uint64_t)k));
    return r;
}

static void test_params_checksum(void **state)
{
    (void)state;
    size_t big = 65936;
    float *p = malloc(big * sizeof *p);
    assert_non_null(p);
    dsim_rng rng;
    dsim_rng_init(&rng, 7, "test.checksum", 0);
    for (size_t i = 0; i < big; i++)
        p[i] = (float)dsim_rng_normal(&rng);
    size_t lens[] = {0, 1, 15, 16, 17, 31, 32, 33, 160, 1000, big};
    for (size_t i = 0; i < sizeof lens / sizeof *lens; i++)
        assert_true(dsim_params_checksum(p, lens[i]) == cks_documented(p, lens[i]));
    uint64_t base = dsim_params_checksum(p, big);
    uint32_t u;
    for (int bit = 0; bit < 32; bit++) {
        memcpy(&u, &p[big / 2], 4);
        u ^= 1u << bit;
        memcpy(&p[big / 2], &u, 4);
        uint64_t c = dsim_params_checksum(p, big);
        assert_true(c != base);
        assert_true(c == cks_documented(p, big));
        u ^= 1u << bit;
        memcpy(&p[big / 2], &u, 4);
    }
    assert_true(dsim_params_checksum(p, big) == base);
    free(p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_documented_bits), cmocka_unit_test(test_optimizers),
        cmocka_unit_test(test_set_empty),       cmocka_unit_test(test_choosing),
        cmocka_unit_test(test_params_checksum),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
