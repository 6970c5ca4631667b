/* Optimizers against their update rules worked out in double, slot state,
 * checkpoint restore and bad specs. */
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
#include "dsim/optim.h"

#define N     3
#define STEPS 4

static const float w0[N] = {0.5f, -1.25f, 2.0f};
/* Gradients of mixed sign and size; step 3 flips signs so momentum and
 * Adam's first moment have to turn around. */
static const float gs[STEPS][N] = {
    {0.25f, -2.0f, 1e-3f},
    {0.5f, -1.0f, 3e-3f},
    {-0.75f, 0.5f, -2e-3f},
    {0.125f, 4.0f, 1e-3f},
};

/* The float updates round at most a handful of times per step, 2^-24
 * relative each; over four steps that is below 1e-6 of the weights'
 * magnitude. A wrong coefficient (lr, momentum, a missing bias correction,
 * epsilon inside or outside the square root) moves a weight by 1e-4 or more
 * in these cases. */
#define TOL 1e-6

static void check_close(const char *what, int step, const float *got, const double *want, size_t n)
{
    for (size_t k = 0; k < n; k++) {
        double tol = TOL * (1.0 + fabs(want[k]));
        if (!(fabs((double)got[k] - want[k]) <= tol))
            fail_msg("%s after step %d, element %zu: got %.9g, expected %.9g", what, step + 1, k,
                     (double)got[k], want[k]);
    }
}

static void expect_bad(const dsim_optim_spec *s, const char *word);

/* A spec refused with its field at unit_off (beta1, beta2 or rho) at 1,
 * the message naming `word`, and refused with epsilon 0. */
static void refuses_one_and_no_epsilon(dsim_optim_spec s, size_t unit_off, const char *word)
{
    dsim_optim_spec b = s;
    *(double *)(void *)((char *)&b + unit_off) = 1.0;
    expect_bad(&b, word);
    b = s;
    b.epsilon = 0.0;
    expect_bad(&b, "epsilon");
}

/* A kind's name both ways, its defaults into *s, and that it is adaptive
 * with two slots (the newer Keras 3 kinds). */
static void adaptive_two_slots(const char *name, dsim_optim_kind want, dsim_optim_spec *s)
{
    dsim_optim_kind kind;
    assert_int_equal(dsim_optim_kind_parse(name, &kind), DSIM_OK);
    assert_int_equal(kind, want);
    assert_string_equal(dsim_optim_kind_name(kind), name);
    dsim_optim_spec_default(s, want);
    assert_true(dsim_optim_is_adaptive(s));
    assert_int_equal(dsim_optim_rule_slots(s), 2);
}

static dsim_optim *make(const dsim_optim_spec *s)
{
    dsim_optim *o = NULL;
    assert_int_equal(dsim_optim_create(s, N, &o), DSIM_OK);
    assert_non_null(o);
    return o;
}

static void test_sgd(void **state)
{
    (void)state;
    dsim_optim_spec s;
    dsim_optim_spec_default(&s, DSIM_OPTIM_SGD);
    s.lr = 0.1;
    dsim_optim *o = make(&s);
    assert_int_equal(dsim_optim_state_len(o), 0);
    assert_null(dsim_optim_state(o));
    float w[N];
    double ref[N];
    for (int k = 0; k < N; k++)
        ref[k] = w[k] = w0[k];
    for (int t = 0; t < STEPS; t++) {
        assert_int_equal(dsim_optim_apply(o, w, gs[t], N), DSIM_OK);
        for (int k = 0; k < N; k++)
            ref[k] = ref[k] - 0.1 * gs[t][k];
        check_close("sgd w", t, w, ref, N);
        assert_int_equal(dsim_optim_step(o), t + 1);
    }
    dsim_optim_destroy(o);
}

static void run_momentum(int nesterov)
{
    dsim_optim_spec s;
    dsim_optim_spec_default(&s, DSIM_OPTIM_MOMENTUM);
    assert_true(s.momentum == 0.9 && s.lr == 0.01 && s.nesterov == 0);
    s.lr = 0.1;
    s.momentum = 0.8;
    s.nesterov = nesterov;
    dsim_optim *o = make(&s);
    assert_int_equal(dsim_optim_state_len(o), N);
    float w[N];
    double ref[N], v[N] = {0, 0, 0};
    for (int k = 0; k < N; k++)
        ref[k] = w[k] = w0[k];
    for (int t = 0; t < STEPS; t++) {
        assert_int_equal(dsim_optim_apply(o, w, gs[t], N), DSIM_OK);
        for (int k = 0; k < N; k++) {
            double g = gs[t][k];
            v[k] = 0.8 * v[k] + g;
            /* Nesterov looks ahead: the step uses g + momentum * v. */
            ref[k] -= nesterov ? 0.1 * (g + 0.8 * v[k]) : 0.1 * v[k];
        }
        check_close(nesterov ? "nesterov w" : "momentum w", t, w, ref, N);
        check_close("momentum accum", t, dsim_optim_state(o), v, N);
    }
    dsim_optim_destroy(o);
}

static void test_momentum(void **state)
{
    (void)state;
    run_momentum(0);
}

static void test_nesterov(void **state)
{
    (void)state;
    run_momentum(1);
}

static void run_adam(double lr, double eps)
{
    dsim_optim_spec s;
    dsim_optim_spec_default(&s, DSIM_OPTIM_ADAM);
    s.lr = lr;
    s.epsilon = eps;
    dsim_optim *o = make(&s);
    assert_int_equal(dsim_optim_state_len(o), 2 * N);
    float w[N];
    double ref[N], m[N] = {0}, v[N] = {0};
    for (int k = 0; k < N; k++)
        ref[k] = w[k] = w0[k];
    const double b1 = 0.9, b2 = 0.999;
    for (int t = 0; t < STEPS; t++) {
        assert_int_equal(dsim_optim_apply(o, w, gs[t], N), DSIM_OK);
        for (int k = 0; k < N; k++) {
            double g = gs[t][k];
            m[k] = b1 * m[k] + (1 - b1) * g;
            v[k] = b2 * v[k] + (1 - b2) * g * g;
            /* Kingma & Ba's form with bias-corrected moments. TF and Keras fold
             * the corrections into the step size and add epsilon to sqrt(v)
             * = sqrt(v_hat) * sqrt(1 - beta2^t) ("epsilon hat"), so in terms
             * of v_hat epsilon appears divided by sqrt(1 - beta2^t). */
            double c2 = 1 - pow(b2, t + 1);
            double mhat = m[k] / (1 - pow(b1, t + 1));
            double vhat = v[k] / c2;
            ref[k] -= lr * mhat / (sqrt(vhat) + eps / sqrt(c2));
        }
        check_close("adam w", t, w, ref, N);
        check_close("adam m", t, dsim_optim_state(o), m, N);
        check_close("adam v", t, dsim_optim_state(o) + N, v, N);
        assert_int_equal(dsim_optim_step(o), t + 1);
    }
    dsim_optim_destroy(o);
}

static void test_adam(void **state)
{
    (void)state;
    dsim_optim_spec s;
    dsim_optim_spec_default(&s, DSIM_OPTIM_ADAM);
    assert_true(s.lr == 0.001 && s.beta1 == 0.9 && s.beta2 == 0.999 && s.epsilon == 1e-7);
    run_adam(0.001, 1e-7);
    /* A large epsilon makes where it is added visible. */
    run_adam(0.05, 0.1);

    /* The first step by hand, defaults, w 0, g 2e-5 (small enough for
     * epsilon to matter): m = 2e-6, v = 4e-13, sqrt(v) = 6.32455532e-7,
     * alpha = 0.001 sqrt(0.001) / 0.1, step = alpha m / (sqrt(v) + 1e-7)
     * = 0.001 * 6.32455532e-7 / 7.32455532e-7 = 8.634729405e-4. (Epsilon
     * added to sqrt(v_hat) instead would give 9.95e-4, none 1e-3.) */
    dsim_optim *o = NULL;
    dsim_optim_spec_default(&s, DSIM_OPTIM_ADAM);
    assert_int_equal(dsim_optim_create(&s, 1, &o), DSIM_OK);
    float w = 0.0f, g = 2e-5f;
    assert_int_equal(dsim_optim_apply(o, &w, &g, 1), DSIM_OK);
    assert_true(fabs((double)w + 8.634729405e-4) < 1e-6 * 8.634729405e-4);
    dsim_optim_destroy(o);
}

/* Keras 3's RMSprop worked out in double: epsilon inside the square root,
 * momentum on the increment, the centered variance; the slots in Keras's
 * order (velocity, momentum, average gradient). */
static void run_rmsprop(double lr, double rho, double mom, int centered, double eps)
{
    dsim_optim_spec s;
    dsim_optim_spec_default(&s, DSIM_OPTIM_RMSPROP);
    s.lr = lr;
    s.rho = rho;
    s.momentum = mom;
    s.centered = centered;
    s.epsilon = eps;
    dsim_optim *o = make(&s);
    const size_t slots = 1 + (mom > 0) + (centered != 0);
    assert_int_equal(dsim_optim_rule_slots(&s), slots);
    assert_int_equal(dsim_optim_state_len(o), slots * N);
    float w[N];
    double ref[N], v[N] = {0}, m[N] = {0}, a[N] = {0};
    for (int k = 0; k < N; k++)
        ref[k] = w[k] = w0[k];
    for (int t = 0; t < STEPS; t++) {
        assert_int_equal(dsim_optim_apply(o, w, gs[t], N), DSIM_OK);
        for (int k = 0; k < N; k++) {
            double g = gs[t][k], d;
            v[k] = rho * v[k] + (1 - rho) * g * g;
            if (centered) {
                a[k] = rho * a[k] + (1 - rho) * g;
                d = v[k] - a[k] * a[k] + eps;
            } else {
                d = v[k] + eps;
            }
            double inc = lr * g / sqrt(d);
            if (mom > 0) {
                m[k] = mom * m[k] + inc;
                ref[k] -= m[k];
            } else {
                ref[k] -= inc;
            }
        }
        const float *st = dsim_optim_state(o);
        check_close("rmsprop w", t, w, ref, N);
        check_close("rmsprop velocity", t, st, v, N);
        if (mom > 0)
            check_close("rmsprop momentum", t, st + N, m, N);
        if (centered)
            check_close("rmsprop average gradient", t, st + (mom > 0 ? 2 : 1) * N, a, N);
    }
    dsim_optim_destroy(o);
}

static void test_rmsprop(void **state)
{
    (void)state;
    dsim_optim_spec s;
    dsim_optim_spec_default(&s, DSIM_OPTIM_RMSPROP);
    assert_true(s.lr == 0.001 && s.rho == 0.9 && s.momentum == 0.0 && s.epsilon == 1e-7 &&
                !s.centered);
    assert_true(dsim_optim_is_adaptive(&s));
    run_rmsprop(0.001, 0.9, 0.0, 0, 1e-7);
    run_rmsprop(0.01, 0.8, 0.9, 0, 1e-7);
    run_rmsprop(0.01, 0.9, 0.5, 1, 1e-7);
    run_rmsprop(0.01, 0.95, 0.0, 1, 1e-7);
    /* A large epsilon makes where it is added visible. */
    run_rmsprop(0.05, 0.9, 0.0, 0, 0.1);

    /* The first step by hand, defaults, w 0, g 2e-5: v = 0.1 g^2 = 4e-11,
     * step = 0.001 * 2e-5 / sqrt(4e-11 + 1e-7) = 6.32329e-5 (epsilon added
     * outside the root, 0.001 * 2e-5 / (6.3246e-6 + 1e-7) = 3.1130e-3). */
    dsim_optim *o = NULL;
    assert_int_equal(dsim_optim_create(&s, 1, &o), DSIM_OK);
    float w = 0.0f, g = 2e-5f;
    assert_int_equal(dsim_optim_apply(o, &w, &g, 1), DSIM_OK);
    double want = -0.001 * 2e-5 / sqrt(4e-11 + 1e-7);
    assert_true(fabs((double)w - want) < 1e-6 * fabs(want));
    dsim_optim_destroy(o);
}

static void run_adagrad(double lr, double init, double eps)
{
    dsim_optim_spec s;
    dsim_optim_spec_default(&s, DSIM_OPTIM_ADAGRAD);
    s.lr = lr;
    s.initial_accumulator_value = init;
    s.epsilon = eps;
    dsim_optim *o = make(&s);
    assert_int_equal(dsim_optim_state_len(o), N);
    float w[N];
    double ref[N], acc[N];
    for (int k = 0; k < N; k++) {
        ref[k] = w[k] = w0[k];
        acc[k] = (float)init;
    }
    check_close("adagrad initial accumulator", -1, dsim_optim_state(o), acc, N);
    for (int t = 0; t < STEPS; t++) {
        assert_int_equal(dsim_optim_apply(o, w, gs[t], N), DSIM_OK);
        for (int k = 0; k < N; k++) {
            double g = gs[t][k];
            acc[k] += g * g;
            ref[k] -= lr * g / sqrt(acc[k] + eps);
        }
        check_close("adagrad w", t, w, ref, N);
        check_close("adagrad accumulator", t, dsim_optim_state(o), acc, N);
    }
    /* reset: the accumulators start over at their initial value */
    dsim_optim_reset(o);
    for (int k = 0; k < N; k++)
        assert_true(dsim_optim_state(o)[k] == (float)init);
    dsim_optim_destroy(o);
}

static void test_adagrad(void **state)
{
    (void)state;
    dsim_optim_spec s;
    dsim_optim_spec_default(&s, DSIM_OPTIM_ADAGRAD);
    assert_true(s.lr == 0.001 && s.initial_accumulator_value == 0.1 && s.epsilon == 1e-7);
    assert_true(dsim_optim_is_adaptive(&s));
    assert_int_equal(dsim_optim_rule_slots(&s), 1);
    run_adagrad(0.001, 0.1, 1e-7);
    run_adagrad(0.1, 0.0, 1e-7);
    run_adagrad(0.05, 2.5, 0.1);
    /* what a fresh job's variables start with: the accumulators at their
     * initial value, gradient accumulation's slot at 0 */
    s.initial_accumulator_value = 0.25;
    s.gradient_accumulation_steps = 2;
    float st[2 * N];
    memset(st, 0xff, sizeof st);
    assert_int_equal(dsim_optim_slots_per_param(&s), 2);
    dsim_optim_init_state(&s, N, st);
    for (int k = 0; k < N; k++) {
        assert_true(st[k] == 0.25f);
        assert_true(st[N + k] == 0.0f);
    }
    dsim_optim_spec_default(&s, DSIM_OPTIM_MOMENTUM);
    assert_false(dsim_optim_is_adaptive(&s));
    dsim_optim_spec_default(&s, DSIM_OPTIM_SGD);
    assert_false(dsim_optim_is_adaptive(&s));
    assert_int_equal(dsim_optim_rule_slots(&s), 0);
}

/* Keras's SGD(momentum=, nesterov=) in double: the velocity holds each
 * step's own rate, so a rate that changes between steps (a schedule)
 * leaves the earlier steps' part as it was, where TF1's momentum kind
 * rescales all of it. */
static void test_sgd_momentum(void **state)
{
    (void)state;
    for (int nesterov = 0; nesterov < 2; nesterov++) {
        dsim_optim_spec s;
        dsim_optim_spec_default(&s, DSIM_OPTIM_SGD);
        assert_int_equal(dsim_optim_rule_slots(&s), 0);
        s.momentum = 0.9;
        s.nesterov = nesterov;
        s.schedule.kind = DSIM_LR_PIECEWISE; /* 0.1 for steps 0..1, then 0.01 */
        s.schedule.n_values = 2;
        s.schedule.boundaries[0] = 1;
        s.schedule.values[0] = 0.1;
        s.schedule.values[1] = 0.01;
        assert_int_equal(dsim_optim_rule_slots(&s), 1);
        dsim_optim *o = make(&s);
        assert_int_equal(dsim_optim_state_len(o), N);
        float w[N];
        double ref[N], v[N] = {0};
        for (int k = 0; k < N; k++)
            ref[k] = w[k] = w0[k];
        for (int t = 0; t < STEPS; t++) {
            double lr = t <= 1 ? 0.1 : 0.01;
            assert_int_equal(dsim_optim_apply(o, w, gs[t], N), DSIM_OK);
            for (int k = 0; k < N; k++) {
                double g = gs[t][k];
                v[k] = 0.9 * v[k] - lr * g;
                ref[k] += nesterov ? 0.9 * v[k] - lr * g : v[k];
            }
            check_close("sgd momentum w", t, w, ref, N);
            check_close("sgd momentum velocity", t, dsim_optim_state(o), v, N);
        }
        dsim_optim_destroy(o);
    }
}

/* Keras 3's Lion in double: each step moves every weight by exactly lr
 * against the sign of its interpolated momentum. */
static void test_lion(void **state)
{
    (void)state;
    dsim_optim_spec s;
    dsim_optim_spec_default(&s, DSIM_OPTIM_LION);
    assert_true(s.lr == 0.001 && s.beta1 == 0.9 && s.beta2 == 0.99);
    assert_true(dsim_optim_is_adaptive(&s));
    assert_int_equal(dsim_optim_rule_slots(&s), 1);
    s.lr = 0.01;
    s.beta2 = 0.5;
    dsim_optim *o = make(&s);
    assert_int_equal(dsim_optim_state_len(o), N);
    float w[N];
    double ref[N], m[N] = {0};
    for (int k = 0; k < N; k++)
        ref[k] = w[k] = w0[k];
    for (int t = 0; t < STEPS; t++) {
        assert_int_equal(dsim_optim_apply(o, w, gs[t], N), DSIM_OK);
        for (int k = 0; k < N; k++) {
            double g = gs[t][k], c = 0.9 * m[k] + 0.1 * g;
            ref[k] -= 0.01 * (c > 0 ? 1.0 : c < 0 ? -1.0 : 0.0);
            m[k] = 0.5 * m[k] + 0.5 * g;
        }
        check_close("lion w", t, w, ref, N);
        check_close("lion momentum", t, dsim_optim_state(o), m, N);
    }
    dsim_optim_destroy(o);
    /* a zero interpolation moves nothing; NaN stays NaN, as TF's sign */
    assert_int_equal(dsim_optim_create(&s, 1, &o), DSIM_OK);
    float w1 = 1.0f, g0 = 0.0f, gn = NAN;
    assert_int_equal(dsim_optim_apply(o, &w1, &g0, 1), DSIM_OK);
    assert_true(w1 == 1.0f);
    assert_int_equal(dsim_optim_apply(o, &w1, &gn, 1), DSIM_OK);
    assert_true(isnan(w1));
    dsim_optim_destroy(o);
}

/* One update of one parameter with a NaN gradient: the variable and slot
 * `slot` (of the maximum) come out NaN. */
static void expect_nan_slot(const dsim_optim_spec *s, size_t slot)
{
    dsim_optim *o = NULL;
    assert_int_equal(dsim_optim_create(s, 1, &o), DSIM_OK);
    float w = 1.0f, g = NAN;
    assert_int_equal(dsim_optim_apply(o, &w, &g, 1), DSIM_OK);
    assert_true(isnan(dsim_optim_state(o)[slot]) && isnan(w));
    dsim_optim_destroy(o);
}

/* Keras's Adam(amsgrad=True) worked out in double: the running maximum of
 * v in the denominator, in a third slot. beta2 0.5 lets v fall as the
 * gradients shrink, so that the maximum is not v (the run differs from
 * plain Adam's). */
static void test_amsgrad(void **state)
{
    (void)state;
    dsim_optim_spec s;
    dsim_optim_spec_default(&s, DSIM_OPTIM_ADAM);
    assert_int_equal(s.amsgrad, 0);
    s.amsgrad = 1;
    s.lr = 0.05;
    s.beta2 = 0.5;
    assert_true(dsim_optim_is_adaptive(&s));
    assert_int_equal(dsim_optim_rule_slots(&s), 3);
    dsim_optim *o = make(&s), *plain = NULL;
    s.amsgrad = 0;
    plain = make(&s);
    assert_int_equal(dsim_optim_state_len(o), 3 * N);
    float w[N], wp[N];
    double ref[N], m[N] = {0}, v[N] = {0}, vh[N] = {0};
    for (int k = 0; k < N; k++)
        ref[k] = w[k] = wp[k] = w0[k];
    int below = 0;
    for (int t = 0; t < STEPS; t++) {
        assert_int_equal(dsim_optim_apply(o, w, gs[t], N), DSIM_OK);
        assert_int_equal(dsim_optim_apply(plain, wp, gs[t], N), DSIM_OK);
        double alpha = 0.05 * sqrt(1 - pow(0.5, t + 1)) / (1 - pow(0.9, t + 1));
        for (int k = 0; k < N; k++) {
            double g = gs[t][k];
            m[k] = 0.9 * m[k] + 0.1 * g;
            v[k] = 0.5 * v[k] + 0.5 * g * g;
            below += v[k] < vh[k];
            vh[k] = fmax(vh[k], v[k]);
            ref[k] -= m[k] * alpha / (sqrt(vh[k]) + 1e-7);
        }
        const float *st = dsim_optim_state(o);
        check_close("amsgrad w", t, w, ref, N);
        check_close("amsgrad m", t, st, m, N);
        check_close("amsgrad v", t, st + N, v, N);
        check_close("amsgrad vhat", t, st + 2 * N, vh, N);
    }
    assert_true(below > 0);                    /* the maximum mattered ... */
    assert_true(memcmp(w, wp, sizeof w) != 0); /* ... and moved the variables */
    dsim_optim_destroy(o);
    dsim_optim_destroy(plain);
    /* a NaN gradient makes v and its maximum NaN, as TF's maximum does */
    s.amsgrad = 1;
    expect_nan_slot(&s, 2);
    s.amsgrad = 2;
    assert_int_equal(dsim_optim_validate(&s), DSIM_EINVAL);
}

/* Keras 3's Adamax worked out in double: m as Adam's, u = max(beta2 u,
 * |g|), the step lr m / ((1 - beta1^t) (u + epsilon)). */
static void test_adamax(void **state)
{
    (void)state;
    dsim_optim_spec s;
    adaptive_two_slots("adamax", DSIM_OPTIM_ADAMAX, &s);
    assert_true(s.lr == 0.001 && s.beta1 == 0.9 && s.beta2 == 0.999 && s.epsilon == 1e-7);
    s.lr = 0.02;
    s.beta2 = 0.6; /* u decays below a later |g| and above a smaller one */
    s.epsilon = 1e-3;
    dsim_optim *o = make(&s);
    assert_int_equal(dsim_optim_state_len(o), 2 * N);
    float w[N];
    double ref[N], m[N] = {0}, u[N] = {0};
    for (int k = 0; k < N; k++)
        ref[k] = w[k] = w0[k];
    for (int t = 0; t < STEPS; t++) {
        assert_int_equal(dsim_optim_apply(o, w, gs[t], N), DSIM_OK);
        for (int k = 0; k < N; k++) {
            double g = gs[t][k];
            m[k] = 0.9 * m[k] + 0.1 * g;
            u[k] = fmax(0.6 * u[k], fabs(g));
            ref[k] -= 0.02 * m[k] / ((1 - pow(0.9, t + 1)) * (u[k] + 1e-3));
        }
        check_close("adamax w", t, w, ref, N);
        check_close("adamax m", t, dsim_optim_state(o), m, N);
        check_close("adamax u", t, dsim_optim_state(o) + N, u, N);
    }
    dsim_optim_destroy(o);
    /* NaN on either side of the maximum is the result, as TF's */
    expect_nan_slot(&s, 1);
    refuses_one_and_no_epsilon(s, offsetof(dsim_optim_spec, beta2), "adamax: beta2");
}

/* Keras 3's Lamb on a model of two variables (2 parameters, then 1):
 * Adam's bias-corrected update scaled per variable by |w| / |u|; a
 * variable whose norm is 0 moves by the plain update. An optimizer of a
 * part that cuts a variable is refused, one of whole variables runs, and
 * variables that do not add up to the model are an error. */
static void test_lamb(void **state)
{
    (void)state;
    dsim_optim_spec s;
    adaptive_two_slots("lamb", DSIM_OPTIM_LAMB, &s);
    assert_true(s.lr == 0.001 && s.beta1 == 0.9 && s.beta2 == 0.999 && s.epsilon == 1e-7);
    assert_string_equal(dsim_optim_slot_name(&s, 1), "v");
    s.lr = 0.05;
    s.n_vars = 2;
    s.var_len[0] = 2;
    s.var_len[1] = 1;
    dsim_optim *o = make(&s);
    float w[N];
    double ref[N], m[N] = {0}, v[N] = {0};
    for (int k = 0; k < N; k++)
        ref[k] = w[k] = w0[k];
    w[2] = 0.0f; /* the second variable starts at 0: ratio 1 */
    ref[2] = 0.0;
    for (int t = 0; t < STEPS; t++) {
        assert_int_equal(dsim_optim_apply(o, w, gs[t], N), DSIM_OK);
        double c1 = 1 - pow(0.9, t + 1), c2 = 1 - pow(0.999, t + 1), u[N];
        for (int k = 0; k < N; k++) {
            double g = gs[t][k];
            m[k] = 0.9 * m[k] + 0.1 * g;
            v[k] = 0.999 * v[k] + 0.001 * g * g;
            u[k] = (m[k] / c1) / (sqrt(v[k] / c2) + 1e-7);
        }
        for (int a = 0, len = 2; a < N; a += len, len = 1) {
            double ww = 0, uu = 0;
            for (int k = a; k < a + len; k++) {
                ww += ref[k] * ref[k];
                uu += u[k] * u[k];
            }
            double r = ww > 0 && uu > 0 ? sqrt(ww) / sqrt(uu) : 1.0;
            for (int k = a; k < a + len; k++)
                ref[k] -= r * 0.05 * u[k];
        }
        check_close("lamb w", t, w, ref, N);
        check_close("lamb m", t, dsim_optim_state(o), m, N);
        check_close("lamb v", t, dsim_optim_state(o) + N, v, N);
    }
    dsim_optim_destroy(o);
    /* a part of parameters 1..2 cuts the first variable; 2..2 holds the
     * second whole */
    dsim_optim *p = NULL;
    assert_int_equal(dsim_optim_create(&s, 2, &p), DSIM_OK);
    assert_int_equal(dsim_optim_set_part(p, 1, N), DSIM_OK);
    float two[2] = {1.0f, 2.0f};
    assert_int_equal(dsim_optim_apply(p, two, gs[0], 2), DSIM_ENOTSUP);
    assert_non_null(strstr(dsim_errmsg(), "cuts variable 0 (parameters 0..1)"));
    dsim_optim_destroy(p);
    assert_int_equal(dsim_optim_create(&s, 1, &p), DSIM_OK);
    assert_int_equal(dsim_optim_set_part(p, 2, N), DSIM_OK);
    assert_int_equal(dsim_optim_apply(p, two, gs[0], 1), DSIM_OK);
    dsim_optim_destroy(p);
    /* variables of 2 + 2 for a model of 3 */
    s.var_len[1] = 2;
    o = make(&s);
    assert_int_equal(dsim_optim_apply(o, w, gs[0], N), DSIM_EINVAL);
    assert_non_null(strstr(dsim_errmsg(), "variables hold 4 parameters, the model 3"));
    dsim_optim_destroy(o);
    s.var_len[1] = 0;
    assert_int_equal(dsim_optim_validate(&s), DSIM_EINVAL);
    s.var_len[1] = 1;
    s.beta1 = 1.0;
    assert_int_equal(dsim_optim_validate(&s), DSIM_EINVAL);
}

/* Keras 3's Nadam worked out in double: u(j) = beta1 (1 - 0.5 0.96^j), its
 * running product over the update steps, Nesterov's look-ahead m_hat. With
 * gradient accumulation over k steps the product takes the update steps'
 * u alone, while t counts every step; a rate that steps back (a restore to
 * an earlier step) computes the product anew. */
static void nadam_ref(int k, double *w, double *m, double *v, double *up, int t, const float *g)
{
    const double b1 = 0.9, b2 = 0.999, lr = 0.05, eps = 1e-7;
    double ut = b1 * (1 - 0.5 * pow(0.96, t + 1)), ut1 = b1 * (1 - 0.5 * pow(0.96, t + 2));
    *up *= ut;
    for (int i = 0; i < N; i++) {
        double gi = g[i] / k;
        m[i] = b1 * m[i] + (1 - b1) * gi;
        v[i] = b2 * v[i] + (1 - b2) * gi * gi;
        double mh = ut1 * m[i] / (1 - *up * ut1) + (1 - ut) * gi / (1 - *up);
        w[i] -= lr * mh / (sqrt(v[i] / (1 - pow(b2, t + 1))) + eps);
    }
}

static void test_nadam(void **state)
{
    (void)state;
    dsim_optim_spec s;
    adaptive_two_slots("nadam", DSIM_OPTIM_NADAM, &s);
    assert_true(s.lr == 0.001 && s.beta1 == 0.9 && s.beta2 == 0.999 && s.epsilon == 1e-7);
    assert_string_equal(dsim_optim_slot_name(&s, 0), "m");
    assert_string_equal(dsim_optim_slot_name(&s, 1), "v");
    s.lr = 0.05;
    for (int k = 1; k <= 2; k++) {
        s.gradient_accumulation_steps = k == 1 ? 0 : k;
        dsim_optim *o = make(&s);
        float w[N], keep[N], ks[2 * N + N];
        double ref[N], m[N] = {0}, v[N] = {0}, up = 1;
        for (int i = 0; i < N; i++)
            ref[i] = w[i] = w0[i];
        float acc[N] = {0};
        for (int t = 0; t < STEPS; t++) {
            if (t == 1) { /* the state before step 2, for the restore below */
                memcpy(keep, w, sizeof keep);
                memcpy(ks, dsim_optim_state(o), dsim_optim_state_len(o) * sizeof(float));
            }
            assert_int_equal(dsim_optim_apply(o, w, gs[t], N), DSIM_OK);
            for (int i = 0; i < N; i++)
                acc[i] += gs[t][i];
            if ((t + 1) % k != 0)
                continue;
            nadam_ref(k, ref, m, v, &up, t, acc);
            memset(acc, 0, sizeof acc);
            check_close("nadam w", t, w, ref, N);
            check_close("nadam m", t, dsim_optim_state(o), m, N);
            check_close("nadam v", t, dsim_optim_state(o) + N, v, N);
        }
        /* back to step 1: the product made anew gives the same steps */
        float again[N];
        memcpy(again, keep, sizeof again);
        assert_int_equal(dsim_optim_set_state(o, ks, dsim_optim_state_len(o), 1), DSIM_OK);
        for (int t = 1; t < STEPS; t++)
            assert_int_equal(dsim_optim_apply(o, again, gs[t], N), DSIM_OK);
        assert_memory_equal(again, w, sizeof w);
        dsim_optim_destroy(o);
    }
    /* the product is the schedule's: without it (Adam's bias correction of
     * m alone) the weights part from these by far more than rounding */
    dsim_optim_spec a = s;
    a.kind = DSIM_OPTIM_ADAM;
    a.gradient_accumulation_steps = 0;
    s.gradient_accumulation_steps = 0;
    dsim_optim *on = make(&s), *oa = make(&a);
    float wn[N], wa[N];
    memcpy(wn, w0, sizeof wn);
    memcpy(wa, w0, sizeof wa);
    for (int t = 0; t < STEPS; t++) {
        assert_int_equal(dsim_optim_apply(on, wn, gs[t], N), DSIM_OK);
        assert_int_equal(dsim_optim_apply(oa, wa, gs[t], N), DSIM_OK);
    }
    assert_true(fabsf(wn[0] - wa[0]) > 1e-3f);
    dsim_optim_destroy(on);
    dsim_optim_destroy(oa);
    refuses_one_and_no_epsilon(s, offsetof(dsim_optim_spec, beta1), "nadam: beta1");
}

/* Keras 3's Adadelta worked out in double: running averages of the squared
 * gradients and of the squared steps, each step's size their roots' ratio
 * (epsilon inside both roots), rho 0.95 by default. */
static void test_adadelta(void **state)
{
    (void)state;
    dsim_optim_spec s;
    adaptive_two_slots("adadelta", DSIM_OPTIM_ADADELTA, &s);
    assert_true(s.lr == 0.001 && s.rho == 0.95 && s.epsilon == 1e-7);
    assert_string_equal(dsim_optim_slot_name(&s, 0), "accumulated_grad");
    assert_string_equal(dsim_optim_slot_name(&s, 1), "accumulated_delta_var");
    s.lr = 1.0;
    s.rho = 0.9;
    s.epsilon = 1e-3; /* large enough that a wrong place for it shows */
    dsim_optim *o = make(&s);
    float w[N];
    double ref[N], ag[N] = {0}, ad[N] = {0};
    for (int k = 0; k < N; k++)
        ref[k] = w[k] = w0[k];
    for (int t = 0; t < STEPS; t++) {
        assert_int_equal(dsim_optim_apply(o, w, gs[t], N), DSIM_OK);
        for (int k = 0; k < N; k++) {
            double g = gs[t][k];
            ag[k] = 0.9 * ag[k] + 0.1 * g * g;
            double d = -(sqrt(ad[k] + 1e-3) * g) / sqrt(ag[k] + 1e-3);
            ad[k] = 0.9 * ad[k] + 0.1 * d * d;
            ref[k] += d;
        }
        check_close("adadelta w", t, w, ref, N);
        check_close("adadelta accumulated_grad", t, dsim_optim_state(o), ag, N);
        check_close("adadelta accumulated_delta_var", t, dsim_optim_state(o) + N, ad, N);
    }
    dsim_optim_destroy(o);
    refuses_one_and_no_epsilon(s, offsetof(dsim_optim_spec, rho), "adadelta: rho");
}

/* The slots as Keras names them, in the layout's order */
static void test_slot_names(void **state)
{
    (void)state;
    dsim_optim_spec s;
    dsim_optim_spec_default(&s, DSIM_OPTIM_ADAM);
    s.amsgrad = 1;
    s.gradient_accumulation_steps = 2;
    assert_string_equal(dsim_optim_slot_name(&s, 0), "m");
    assert_string_equal(dsim_optim_slot_name(&s, 1), "v");
    assert_string_equal(dsim_optim_slot_name(&s, 2), "vhat");
    assert_string_equal(dsim_optim_slot_name(&s, 3), "gradient accumulator");
    dsim_optim_spec_default(&s, DSIM_OPTIM_RMSPROP);
    s.centered = 1;
    assert_string_equal(dsim_optim_slot_name(&s, 1), "average gradient");
    s.momentum = 0.5;
    assert_string_equal(dsim_optim_slot_name(&s, 1), "momentum");
    assert_string_equal(dsim_optim_slot_name(&s, 2), "average gradient");
    dsim_optim_spec_default(&s, DSIM_OPTIM_ADAMAX);
    assert_string_equal(dsim_optim_slot_name(&s, 1), "u");
    dsim_optim_spec_default(&s, DSIM_OPTIM_ADAGRAD);
    assert_string_equal(dsim_optim_slot_name(&s, 0), "accumulator");
    assert_string_equal(dsim_optim_slot_name(NULL, 0), "?");
}

/* A replica restored from a checkpoint (step + slots) continues exactly as
 * the one that never stopped; without the slots it does not. */
static void test_checkpoint_restore(void **state)
{
    (void)state;
    for (int i = 0; i <= DSIM_OPTIM_KIND_COUNT; i++) {
        dsim_optim_spec s;
        /* past the kinds: adam with amsgrad, whose third slot must travel too */
        const int ams = i == DSIM_OPTIM_KIND_COUNT, kind = ams ? DSIM_OPTIM_ADAM : i;
        dsim_optim_spec_default(&s, (dsim_optim_kind)kind);
        s.amsgrad = ams;
        s.lr = 0.05;
        dsim_optim *a = make(&s), *b = make(&s), *c = make(&s);
        float wa[N], wb[N], wc[N];
        memcpy(wa, w0, sizeof wa);
        for (int t = 0; t < 2; t++)
            assert_int_equal(dsim_optim_apply(a, wa, gs[t], N), DSIM_OK);
        size_t len = dsim_optim_state_len(a);
        const int two = kind == DSIM_OPTIM_ADAM || kind == DSIM_OPTIM_ADAMAX ||
                        kind == DSIM_OPTIM_LAMB || kind == DSIM_OPTIM_NADAM ||
                        kind == DSIM_OPTIM_ADADELTA;
        assert_int_equal(len, kind == DSIM_OPTIM_SGD ? 0 : ams ? 3 * N : two ? 2 * N : N);
        assert_int_equal(dsim_optim_set_state(b, dsim_optim_state(a), len, dsim_optim_step(a)),
                         DSIM_OK);
        assert_int_equal(dsim_optim_step(b), 2);
        memcpy(wb, wa, sizeof wb);
        memcpy(wc, wa, sizeof wc);
        for (int t = 2; t < STEPS; t++) {
            assert_int_equal(dsim_optim_apply(a, wa, gs[t], N), DSIM_OK);
            assert_int_equal(dsim_optim_apply(b, wb, gs[t], N), DSIM_OK);
            assert_int_equal(dsim_optim_apply(c, wc, gs[t], N), DSIM_OK);
        }
        assert_memory_equal(wa, wb, sizeof wa);
        /* Lion moves each weight by lr against a sign, which a momentum
         * restarted from zero does not flip on these gradients */
        if (kind == DSIM_OPTIM_SGD)
            assert_memory_equal(wa, wc, sizeof wa);
        else if (kind != DSIM_OPTIM_LION)
            assert_memory_not_equal(wa, wc, sizeof wa);
        else
            assert_memory_not_equal(dsim_optim_state(a), dsim_optim_state(c), len * sizeof(float));
        /* reset = freshly created. */
        dsim_optim_reset(a);
        assert_int_equal(dsim_optim_step(a), 0);
        dsim_optim *f = make(&s);
        memcpy(wa, w0, sizeof wa);
        memcpy(wb, w0, sizeof wb);
        assert_int_equal(dsim_optim_apply(a, wa, gs[0], N), DSIM_OK);
        assert_int_equal(dsim_optim_apply(f, wb, gs[0], N), DSIM_OK);
        assert_memory_equal(wa, wb, sizeof wa);
        dsim_clear_error();
        assert_int_equal(dsim_optim_set_state(b, NULL, len + 1, 0), DSIM_EINVAL);
        assert_non_null(strstr(dsim_errmsg(), "expected"));
        dsim_optim_destroy(a);
        dsim_optim_destroy(b);
        dsim_optim_destroy(c);
        dsim_optim_destroy(f);
    }
}

static void expect_bad(const dsim_optim_spec *s, const char *word)
{
    static int sentinel;
    dsim_optim *o = (dsim_optim *)(void *)&sentinel; /* must be cleared on failure */
    dsim_clear_error();
    assert_int_equal(dsim_optim_create(s, N, &o), DSIM_EINVAL);
    assert_null(o);
    if (!strstr(dsim_errmsg(), word))
        fail_msg("message '%s' does not mention '%s'", dsim_errmsg(), word);
}

/* Keras's schedules worked out in double: float32 rounding is within 1e-6
 * relative of them; a wrong step (off by one), boundary (< against <=) or
 * formula is off by far more. */
static void check_rate(const dsim_optim_spec *s, uint64_t step, double want)
{
    double got = (double)dsim_optim_lr_at(s, step);
    if (!(fabs(got - want) <= 1e-6 * fabs(want) + 1e-12))
        fail_msg("schedule %s at step %llu: rate %.9g, expected %.9g",
                 dsim_lr_kind_name(s->schedule.kind), (unsigned long long)step, got, want);
}

static void test_schedules(void **state)
{
    (void)state;
    dsim_optim_spec s;
    dsim_optim_spec_default(&s, DSIM_OPTIM_SGD);
    s.lr = 0.1;
    check_rate(&s, 0, 0.1);
    check_rate(&s, 1000, 0.1);

    s.schedule =
        (dsim_lr_schedule){.kind = DSIM_LR_EXPONENTIAL, .decay_steps = 4, .decay_rate = 0.5};
    assert_int_equal(dsim_optim_validate(&s), DSIM_OK);
    check_rate(&s, 0, 0.1);
    check_rate(&s, 2, 0.1 * pow(0.5, 0.5));
    check_rate(&s, 10, 0.1 * pow(0.5, 2.5));
    s.schedule.staircase = 1;
    check_rate(&s, 3, 0.1);
    check_rate(&s, 4, 0.05);
    check_rate(&s, 11, 0.025);

    s.schedule = (dsim_lr_schedule){
        .kind = DSIM_LR_PIECEWISE, .n_values = 3, .boundaries = {2, 5}, .values = {1.0, 0.5, 0.1}};
    assert_int_equal(dsim_optim_validate(&s), DSIM_OK);
    const double pw[] = {1.0, 1.0, 1.0, 0.5, 0.5, 0.5, 0.1, 0.1};
    for (uint64_t k = 0; k < 8; k++)
        check_rate(&s, k, pw[k]);

    s.schedule = (dsim_lr_schedule){
        .kind = DSIM_LR_POLYNOMIAL, .decay_steps = 10, .end_lr = 0.01, .power = 1.0};
    check_rate(&s, 0, 0.1);
    check_rate(&s, 5, 0.055);
    check_rate(&s, 10, 0.01);
    check_rate(&s, 25, 0.01);
    s.schedule.power = 2.0;
    check_rate(&s, 5, 0.09 * 0.25 + 0.01);
    s.schedule.power = 1.0;
    s.schedule.cycle = 1; /* step 15 decays over 20 steps, step 0 over 10 */
    check_rate(&s, 0, 0.1);
    check_rate(&s, 15, 0.09 * 0.25 + 0.01);
    check_rate(&s, 20, 0.01);

    s.lr = 1.0;
    s.schedule =
        (dsim_lr_schedule){.kind = DSIM_LR_INVERSE_TIME, .decay_steps = 2, .decay_rate = 0.5};
    check_rate(&s, 3, 1.0 / 1.75);
    check_rate(&s, 4, 0.5);
    s.schedule.staircase = 1;
    check_rate(&s, 3, 1.0 / 1.5);

    const double pi = 3.14159265358979323846;
    s.schedule = (dsim_lr_schedule){.kind = DSIM_LR_COSINE, .decay_steps = 10, .alpha = 0.2};
    check_rate(&s, 0, 1.0);
    check_rate(&s, 3, 0.8 * 0.5 * (1 + cos(pi * 0.3)) + 0.2);
    check_rate(&s, 10, 0.2);
    check_rate(&s, 99, 0.2);
    /* warmup from 0 (allowed there alone) to 2 over 4 steps, then decay */
    s.lr = 0.0;
    s.schedule = (dsim_lr_schedule){.kind = DSIM_LR_COSINE,
                                    .decay_steps = 8,
                                    .warmup = 1,
                                    .warmup_target = 2.0,
                                    .warmup_steps = 4};
    assert_int_equal(dsim_optim_validate(&s), DSIM_OK);
    check_rate(&s, 0, 1e-30);
    check_rate(&s, 1, 0.5);
    check_rate(&s, 4, 2.0);
    check_rate(&s, 8, 1.0);
    check_rate(&s, 50, 1e-30);

    /* Keras's CosineDecayRestarts: periods of 3, 6, 12 steps (t_mul 2),
     * each restart at m_mul times the last one's rate, alpha the floor */
    s.lr = 1.0;
    s.schedule = (dsim_lr_schedule){.kind = DSIM_LR_COSINE_RESTARTS,
                                    .decay_steps = 3,
                                    .t_mul = 2.0,
                                    .m_mul = 0.5,
                                    .alpha = 0.1};
    assert_int_equal(dsim_optim_validate(&s), DSIM_OK);
    check_rate(&s, 0, 1.0);
    check_rate(&s, 2, 0.9 * 0.5 * (1 + cos(pi * 2.0 / 3.0)) + 0.1);
    check_rate(&s, 3, 0.9 * 0.5 + 0.1);                                  /* the first restart */
    check_rate(&s, 6, 0.9 * 0.5 * 0.5 * (1 + cos(pi * 0.5)) + 0.1);      /* halfway in 3..9 */
    check_rate(&s, 9, 0.9 * 0.25 + 0.1);                                 /* the second */
    check_rate(&s, 20, 0.9 * 0.125 * (1 + cos(pi * 11.0 / 12.0)) + 0.1); /* 9..21 */
    /* t_mul 1: periods of equal length */
    s.schedule.t_mul = 1.0;
    s.schedule.m_mul = 1.0;
    check_rate(&s, 4, 0.9 * 0.5 * (1 + cos(pi / 3.0)) + 0.1);
    check_rate(&s, 300, 1.0);

    /* the update takes the rate of the optimizer's step; a skipped step
     * (a loss scale's) moves the schedule on */
    dsim_optim_spec_default(&s, DSIM_OPTIM_SGD);
    s.lr = 0.5;
    s.schedule = (dsim_lr_schedule){.kind = DSIM_LR_PIECEWISE,
                                    .n_values = 3,
                                    .boundaries = {0, 2},
                                    .values = {0.5, 0.25, 0.125}};
    dsim_optim *o = make(&s);
    float w[N];
    double want[N];
    memcpy(w, w0, sizeof w);
    for (size_t k = 0; k < N; k++)
        want[k] = w0[k];
    const double rate[STEPS] = {0.5, 0.25, 0.125, 0.125}; /* steps 0, 1, 3, 4 */
    for (int t = 0; t < STEPS; t++) {
        if (t == 2)
            dsim_optim_skip(o); /* step 2 */
        assert_int_equal(dsim_optim_apply(o, w, gs[t], N), DSIM_OK);
        for (size_t k = 0; k < N; k++)
            want[k] -= rate[t] * gs[t][k];
        check_close("sgd with a piecewise schedule", t, w, want, N);
    }
    dsim_optim_destroy(o);

    /* names round-trip; an unknown one names the known */
    for (int k = 0; k < DSIM_LR_KIND_COUNT; k++) {
        dsim_lr_kind back = DSIM_LR_KIND_COUNT;
        assert_int_equal(dsim_lr_kind_parse(dsim_lr_kind_name((dsim_lr_kind)k), &back), DSIM_OK);
        assert_int_equal(back, k);
    }
    dsim_lr_kind back;
    assert_int_equal(dsim_lr_kind_parse("step_decay", &back), DSIM_EINVAL);
    assert_non_null(strstr(dsim_errmsg(), "cosine_decay"));
}

static void test_bad_schedules(void **state)
{
    (void)state;
    dsim_optim_spec s;
    dsim_optim_spec_default(&s, DSIM_OPTIM_ADAM);
    s.schedule = (dsim_lr_schedule){.kind = DSIM_LR_EXPONENTIAL, .decay_rate = 0.5};
    expect_bad(&s, "decay_steps must be > 0");
    s.schedule.decay_steps = 3;
    s.schedule.decay_rate = 0;
    expect_bad(&s, "decay_rate");
    s.schedule = (dsim_lr_schedule){.kind = DSIM_LR_PIECEWISE, .n_values = 1, .values = {0.1}};
    expect_bad(&s, "1 values");
    s.schedule = (dsim_lr_schedule){
        .kind = DSIM_LR_PIECEWISE, .n_values = 3, .boundaries = {5, 5}, .values = {1, 0.5, 0.1}};
    expect_bad(&s, "strictly increasing");
    s.schedule.boundaries[1] = 6;
    s.schedule.values[2] = 0;
    expect_bad(&s, "values[2]");
    s.schedule = (dsim_lr_schedule){.kind = DSIM_LR_POLYNOMIAL, .decay_steps = 3, .power = 0};
    expect_bad(&s, "power");
    s.schedule = (dsim_lr_schedule){.kind = DSIM_LR_COSINE, .decay_steps = 3, .alpha = 1.5};
    expect_bad(&s, "alpha");
    s.schedule.alpha = 0;
    s.schedule.warmup = 1;
    expect_bad(&s, "warmup_target");
    s.schedule = (dsim_lr_schedule){
        .kind = DSIM_LR_COSINE_RESTARTS, .decay_steps = 3, .t_mul = 0.5, .m_mul = 1.0};
    expect_bad(&s, "t_mul 0.5 must be 1 or more");
    s.schedule.t_mul = 2.0;
    s.schedule.m_mul = 0.0;
    expect_bad(&s, "m_mul 0 must be a positive number");
    s.schedule.m_mul = 1.0;
    s.schedule.decay_steps = 0;
    expect_bad(&s, "decay_steps must be > 0");
    s.schedule.decay_steps = 3;
    s.schedule.warmup = 1;
    expect_bad(&s, "no warmup");
    s.schedule = (dsim_lr_schedule){.kind = (dsim_lr_kind)9};
    expect_bad(&s, "schedule kind 9");
    /* a rate of 0 is refused without a warmup to start */
    dsim_optim_spec_default(&s, DSIM_OPTIM_SGD);
    s.lr = 0;
    s.schedule = (dsim_lr_schedule){.kind = DSIM_LR_COSINE, .decay_steps = 3};
    expect_bad(&s, "lr 0");
}

/* Keras 3's gradient_accumulation_steps: the parameters move every k-th
 * step by (g + acc) / k; the accumulator is the optimizer's last slot (so a
 * checkpoint between updates resumes it); Adam's t and the schedule count
 * every step. */
static void test_accumulation(void **state)
{
    (void)state;
    dsim_optim_spec s;
    dsim_optim_spec_default(&s, DSIM_OPTIM_SGD);
    s.lr = 0.5;
    s.gradient_accumulation_steps = 3;
    assert_int_equal(dsim_optim_slots_per_param(&s), 1);
    dsim_optim *o = make(&s);
    assert_int_equal(dsim_optim_state_len(o), N);
    float w[N];
    memcpy(w, w0, sizeof w);
    for (int t = 0; t < 2; t++) {
        assert_int_equal(dsim_optim_apply(o, w, gs[t], N), DSIM_OK);
        assert_memory_equal(w, w0, sizeof w); /* accumulated: no update */
    }
    assert_int_equal(dsim_optim_step(o), 2);
    const float *acc = dsim_optim_state(o);
    for (size_t k = 0; k < N; k++)
        assert_true(acc[k] == gs[1][k] + gs[0][k]);
    /* a checkpoint taken here resumes the accumulation */
    float saved[N];
    memcpy(saved, acc, sizeof saved);
    dsim_optim *r = make(&s);
    assert_int_equal(dsim_optim_set_state(r, saved, N, 2), DSIM_OK);
    float wr[N];
    memcpy(wr, w0, sizeof wr);
    assert_int_equal(dsim_optim_apply(o, w, gs[2], N), DSIM_OK);
    assert_int_equal(dsim_optim_apply(r, wr, gs[2], N), DSIM_OK);
    double want[N];
    for (size_t k = 0; k < N; k++) {
        want[k] = (double)w0[k] - 0.5 * (((double)gs[0][k] + gs[1][k] + gs[2][k]) / 3.0);
        assert_true(dsim_optim_state(o)[k] == 0.0f); /* zeroed after the update */
    }
    check_close("sgd, 3 steps accumulated", 2, w, want, N);
    assert_memory_equal(w, wr, sizeof w);
    dsim_optim_destroy(r);
    dsim_optim_destroy(o);

    /* Adam: bias correction at t = 2 (both steps counted), slots then acc */
    dsim_optim_spec_default(&s, DSIM_OPTIM_ADAM);
    s.lr = 0.1;
    s.gradient_accumulation_steps = 2;
    o = make(&s);
    assert_int_equal(dsim_optim_state_len(o), 3 * N);
    memcpy(w, w0, sizeof w);
    assert_int_equal(dsim_optim_apply(o, w, gs[0], N), DSIM_OK);
    assert_int_equal(dsim_optim_apply(o, w, gs[1], N), DSIM_OK);
    for (size_t k = 0; k < N; k++) {
        double g = ((double)gs[0][k] + gs[1][k]) / 2.0, m = 0.1 * g, v = 0.001 * g * g;
        double alpha = 0.1 * sqrt(1.0 - 0.999 * 0.999) / (1.0 - 0.9 * 0.9);
        want[k] = (double)w0[k] - m * alpha / (sqrt(v) + 1e-7);
    }
    check_close("adam, 2 steps accumulated", 1, w, want, N);
    dsim_optim_destroy(o);

    /* a global clip takes the accumulated gradient's norm: dsim_optim_apply
     * computes it; a part's dsim_optim_apply_norm cannot, and says so */
    dsim_optim_spec_default(&s, DSIM_OPTIM_SGD);
    s.lr = 1.0;
    s.global_clipnorm = 1.3; /* the average's norm is 1.55, the second gradient's 1.12 */
    s.gradient_accumulation_steps = 2;
    o = make(&s);
    memcpy(w, w0, sizeof w);
    assert_int_equal(dsim_optim_apply(o, w, gs[0], N), DSIM_OK);
    assert_int_equal(dsim_optim_apply(o, w, gs[1], N), DSIM_OK);
    double d2 = 0;
    for (size_t k = 0; k < N; k++)
        d2 += ((double)w[k] - w0[k]) * ((double)w[k] - w0[k]);
    assert_true(fabs(sqrt(d2) - 1.3) < 1e-5); /* moved by the clip norm: clipped */
    assert_int_equal(dsim_optim_apply_norm(o, w, gs[2], N, 1.0), DSIM_OK);
    dsim_clear_error();
    assert_int_equal(dsim_optim_apply_norm(o, w, gs[3], N, 1.0), DSIM_ENOTSUP);
    assert_non_null(strstr(dsim_errmsg(), "clipvalue"));
    dsim_optim_destroy(o);

    dsim_optim_spec_default(&s, DSIM_OPTIM_SGD);
    s.gradient_accumulation_steps = -1;
    expect_bad(&s, "gradient_accumulation_steps");
    s.gradient_accumulation_steps = DSIM_OPTIM_MAX_ACCUMULATION + 1;
    expect_bad(&s, "gradient_accumulation_steps");
}

static void test_bad_specs(void **state)
{
    (void)state;
    dsim_optim_spec s;
    const double bad_lr[] = {0.0, -0.1, NAN, INFINITY, 1e-60, 1e300};
    for (size_t i = 0; i < sizeof bad_lr / sizeof bad_lr[0]; i++) {
        dsim_optim_spec_default(&s, DSIM_OPTIM_SGD);
        s.lr = bad_lr[i];
        expect_bad(&s, "lr");
    }
    dsim_optim_spec_default(&s, DSIM_OPTIM_MOMENTUM);
    s.momentum = 1.0;
    expect_bad(&s, "momentum");
    s.momentum = -0.5;
    expect_bad(&s, "momentum");
    s.momentum = 0.9;
    s.nesterov = 2;
    expect_bad(&s, "nesterov");
    dsim_optim_spec_default(&s, DSIM_OPTIM_ADAM);
    s.beta1 = 1.0;
    expect_bad(&s, "beta1");
    dsim_optim_spec_default(&s, DSIM_OPTIM_ADAM);
    s.beta2 = NAN;
    expect_bad(&s, "beta2");
    dsim_optim_spec_default(&s, DSIM_OPTIM_ADAM);
    s.epsilon = 0.0;
    expect_bad(&s, "epsilon");
    dsim_optim_spec_default(&s, DSIM_OPTIM_RMSPROP);
    s.rho = 1.0;
    expect_bad(&s, "rho");
    dsim_optim_spec_default(&s, DSIM_OPTIM_RMSPROP);
    s.momentum = -0.1;
    expect_bad(&s, "momentum");
    dsim_optim_spec_default(&s, DSIM_OPTIM_RMSPROP);
    s.centered = 3;
    expect_bad(&s, "centered");
    dsim_optim_spec_default(&s, DSIM_OPTIM_RMSPROP);
    s.epsilon = 0.0;
    expect_bad(&s, "rmsprop: epsilon");
    dsim_optim_spec_default(&s, DSIM_OPTIM_ADAGRAD);
    s.initial_accumulator_value = -0.1;
    expect_bad(&s, "initial_accumulator_value");
    s.initial_accumulator_value = NAN;
    expect_bad(&s, "initial_accumulator_value");
    dsim_optim_spec_default(&s, DSIM_OPTIM_ADAGRAD);
    s.epsilon = NAN;
    expect_bad(&s, "adagrad: epsilon");
    dsim_optim_spec_default(&s, DSIM_OPTIM_LION);
    s.beta1 = 0.0;
    expect_bad(&s, "SignSGD");
    dsim_optim_spec_default(&s, DSIM_OPTIM_LION);
    s.beta2 = 1.0;
    expect_bad(&s, "lion: beta2");
    dsim_optim_spec_default(&s, DSIM_OPTIM_SGD);
    s.kind = DSIM_OPTIM_KIND_COUNT;
    expect_bad(&s, "kind");
    dsim_optim_spec_default(&s, DSIM_OPTIM_SGD);
    s.momentum = 1.0;
    expect_bad(&s, "sgd: momentum");
    /* Fields another kind uses are not checked. */
    dsim_optim_spec_default(&s, DSIM_OPTIM_SGD);
    s.beta1 = 7;
    s.epsilon = -1;
    dsim_optim *o = NULL;
    assert_int_equal(dsim_optim_create(&s, N, &o), DSIM_OK);
    float w[N] = {0}, g[N] = {0};
    dsim_clear_error();
    assert_int_equal(dsim_optim_apply(o, w, g, N + 1), DSIM_EINVAL);
    assert_non_null(strstr(dsim_errmsg(), "created for 3"));
    assert_int_equal(dsim_optim_step(o), 0);
    dsim_optim_destroy(o);
    assert_int_equal(dsim_optim_create(&s, 0, &o), DSIM_EINVAL);

    dsim_optim_kind k;
    assert_int_equal(dsim_optim_kind_parse("adam", &k), DSIM_OK);
    assert_int_equal(k, DSIM_OPTIM_ADAM);
    assert_string_equal(dsim_optim_kind_name(DSIM_OPTIM_MOMENTUM), "momentum");
    assert_int_equal(dsim_optim_kind_parse("rmsprop", &k), DSIM_OK);
    assert_int_equal(k, DSIM_OPTIM_RMSPROP);
    assert_string_equal(dsim_optim_kind_name(DSIM_OPTIM_ADAGRAD), "adagrad");
    assert_int_equal(dsim_optim_kind_parse("sophia", &k), DSIM_EINVAL);
    assert_non_null(
        strstr(dsim_errmsg(), "adam, adamax, nadam, rmsprop, adagrad, adadelta, lion or lamb"));
}

/* An optimizer of a part of a model says which part: inside the model, or
 * refused with the bounds named; its updates are those of any optimizer of
 * that many parameters. */
static void test_set_part(void **state)
{
    (void)state;
    dsim_optim_spec s;
    dsim_optim_spec_default(&s, DSIM_OPTIM_ADAM);
    s.lr = 0.1;
    dsim_optim *a = NULL, *b = NULL;
    assert_int_equal(dsim_optim_create(&s, 4, &a), DSIM_OK);
    assert_int_equal(dsim_optim_create(&s, 4, &b), DSIM_OK);
    assert_int_equal(dsim_optim_set_part(b, 6, 10), DSIM_OK);
    assert_int_equal(dsim_optim_set_part(b, 0, 4), DSIM_OK);
    dsim_clear_error();
    assert_int_equal(dsim_optim_set_part(b, 7, 10), DSIM_EINVAL);
    assert_non_null(strstr(dsim_errmsg(), "[7, 11) are not a part of a model of 10"));
    assert_int_equal(dsim_optim_set_part(b, 0, 3), DSIM_EINVAL);
    assert_int_equal(dsim_optim_set_part(b, SIZE_MAX, 10), DSIM_EINVAL);
    assert_int_equal(dsim_optim_set_part(b, 0, 0), DSIM_EINVAL);
    assert_int_equal(dsim_optim_set_part(NULL, 0, 4), DSIM_EINVAL);
    assert_int_equal(dsim_optim_set_part(b, 2, 6), DSIM_OK);
    float wa[4] = {1, -2, 3, 0.5f}, wb[4] = {1, -2, 3, 0.5f};
    const float g[3][4] = {{0.1f, -0.2f, 0.3f, 0}, {1e-3f, 2, -1, 0.25f}, {-5, 0, 7, 1}};
    for (int t = 0; t < 3; t++) {
        assert_int_equal(dsim_optim_apply(a, wa, g[t], 4), DSIM_OK);
        assert_int_equal(dsim_optim_apply(b, wb, g[t], 4), DSIM_OK);
    }
    assert_memory_equal(wa, wb, sizeof wa);
    assert_memory_equal(dsim_optim_state(a), dsim_optim_state(b), 8 * sizeof(float));
    dsim_optim_destroy(a);
    dsim_optim_destroy(b);
}

/* One SGD step with lr 1 and the spec's clip: the update is the clipped
 * gradient. */
static void sgd_clip_step(dsim_optim_spec *s, const float *g, size_t n, float *update)
{
    dsim_optim *o = NULL;
    float *w = calloc(n, sizeof(float));
    assert_non_null(w);
    assert_int_equal(dsim_optim_create(s, n, &o), DSIM_OK);
    assert_int_equal(dsim_optim_apply(o, w, g, n), DSIM_OK);
    for (size_t i = 0; i < n; i++)
        update[i] = -w[i];
    dsim_optim_destroy(o);
    free(w);
}

/* Keras's global_clipnorm and clipvalue (dsim/optim.h). */
static void test_clip(void **state)
{
    (void)state;
    dsim_optim_spec s;
    dsim_optim_spec_default(&s, DSIM_OPTIM_SGD);
    s.lr = 1.0;
    /* 3-4-12-84: norm 85 */
    const float g[4] = {3.0f, -4.0f, 12.0f, 84.0f};
    assert_true(dsim_optim_grad_sqsum(g, 4) == 85.0 * 85.0);
    float u[5];
    s.global_clipnorm = 8.5; /* scale 0.1 */
    sgd_clip_step(&s, g, 4, u);
    for (int i = 0; i < 4; i++)
        assert_true(u[i] == g[i] * (float)(8.5 / 85.0));
    s.global_clipnorm = 85.0; /* at the norm: untouched */
    sgd_clip_step(&s, g, 4, u);
    assert_memory_equal(u, g, 4 * sizeof(float));
    s.global_clipnorm = 1000.0;
    sgd_clip_step(&s, g, 4, u);
    assert_memory_equal(u, g, 4 * sizeof(float));
    /* a norm that is not finite: NaN everywhere, as Keras */
    const float ginf[2] = {INFINITY, 1.0f};
    s.global_clipnorm = 1.0;
    sgd_clip_step(&s, ginf, 2, u);
    assert_true(isnan(u[0]) && isnan(u[1]));
    /* by value: clamped element by element, NaN kept */
    s.global_clipnorm = 0.0;
    s.clipvalue = 5.0;
    const float gv[5] = {3.0f, -4.0f, 12.0f, -84.0f, NAN};
    sgd_clip_step(&s, gv, 5, u);
    assert_true(u[0] == 3.0f && u[1] == -4.0f && u[2] == 5.0f && u[3] == -5.0f && isnan(u[4]));

    /* Keras's clipnorm: each variable by its own norm (variables of 2 and
     * 2: norms 5 and 84.86), (g * c) / max(n, c) in float; a variable
     * under the norm untouched, one of zeros stays zero */
    s.clipvalue = 0.0;
    s.clipnorm = 6.0;
    s.n_vars = 2;
    s.var_len[0] = s.var_len[1] = 2;
    sgd_clip_step(&s, g, 4, u);
    const float n2 = (float)sqrt(12.0 * 12.0 + 84.0 * 84.0);
    assert_true(u[0] == g[0] && u[1] == g[1]);
    assert_true(u[2] == (g[2] * 6.0f) / n2 && u[3] == (g[3] * 6.0f) / n2);
    const float gz[4] = {0.0f, 0.0f, 12.0f, 84.0f};
    sgd_clip_step(&s, gz, 4, u);
    assert_true(u[0] == 0.0f && u[1] == 0.0f && u[3] == (84.0f * 6.0f) / n2);
    /* a NaN in a variable makes it NaN, and only it */
    const float gn[4] = {NAN, 1.0f, 3.0f, 4.0f};
    sgd_clip_step(&s, gn, 4, u);
    assert_true(isnan(u[0]) && isnan(u[1]) && u[2] == 3.0f && u[3] == 4.0f);
    /* one of the three clips at most */
    s.global_clipnorm = 1.0;
    assert_int_equal(dsim_optim_validate(&s), DSIM_EINVAL);
    assert_non_null(strstr(dsim_errmsg(), "only one of clipvalue"));
    s.global_clipnorm = 0.0;
    /* an optimizer of a part that cuts a variable cannot take its norm */
    dsim_optim *cut = NULL;
    assert_int_equal(dsim_optim_create(&s, 3, &cut), DSIM_OK);
    assert_int_equal(dsim_optim_set_part(cut, 1, 4), DSIM_OK);
    float w3[3] = {0, 0, 0};
    assert_int_equal(dsim_optim_apply(cut, w3, g, 3), DSIM_ENOTSUP);
    assert_non_null(strstr(dsim_errmsg(), "clipnorm needs the variable's whole norm"));
    dsim_optim_destroy(cut);
    s.clipnorm = 0.0;
    s.n_vars = 0;

    /* a part of the model clipped by the whole gradient's norm */
    dsim_optim *o = NULL;
    s.clipvalue = 0.0;
    s.global_clipnorm = 8.5;
    assert_int_equal(dsim_optim_create(&s, 2, &o), DSIM_OK);
    float w[2] = {0, 0};
    double whole = sqrt(dsim_optim_grad_sqsum(g, 2) + dsim_optim_grad_sqsum(g + 2, 2));
    assert_true(whole == 85.0);
    assert_int_equal(dsim_optim_apply_norm(o, w, g, 2, whole), DSIM_OK);
    assert_true(-w[0] == g[0] * (float)0.1 && -w[1] == g[1] * (float)0.1);
    /* by its own norm (5), the part would be scaled by 1.7 -- not at all */
    w[0] = w[1] = 0;
    assert_int_equal(dsim_optim_apply(o, w, g, 2), DSIM_OK);
    assert_true(-w[0] == g[0] && -w[1] == g[1]);
    dsim_optim_destroy(o);
    assert_true(dsim_optim_needs_global_norm(&s));
    s.global_clipnorm = 0;
    assert_false(dsim_optim_needs_global_norm(&s));

    /* the sum's order: 8 lanes (i mod 8), the fixed tree */
    float big[11];
    double l[8] = {0};
    for (int i = 0; i < 11; i++) {
        big[i] = (float)(i % 3 ? 1e8 : 1e-3) * (float)(i + 1);
        l[i % 8] += (double)big[i] * big[i];
    }
    double want = ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
    assert_memory_equal(&(double){dsim_optim_grad_sqsum(big, 11)}, &want, sizeof want);

    /* weight decay (Keras's, decoupled): w - (w * wd) * lr, then the update */
    dsim_optim_spec_default(&s, DSIM_OPTIM_SGD);
    s.lr = 0.5;
    s.weight_decay = 0.125;
    o = NULL;
    assert_int_equal(dsim_optim_create(&s, 2, &o), DSIM_OK);
    float wd[2] = {3.0f, -1.0f};
    const float gd[2] = {0.25f, 1.0f};
    assert_int_equal(dsim_optim_apply(o, wd, gd, 2), DSIM_OK);
    for (int i = 0; i < 2; i++) {
        float w = i ? -1.0f : 3.0f;
        w = w - w * 0.125f * 0.5f;
        w -= 0.5f * gd[i];
        assert_true(wd[i] == w);
    }
    assert_true(wd[0] == 3.0f - 0.1875f - 0.125f);
    dsim_optim_destroy(o);
    s.weight_decay = -0.1;
    expect_bad(&s, "weight_decay");
    s.weight_decay = NAN;
    expect_bad(&s, "weight_decay");

    /* bad: negative, not finite, both at once */
    dsim_optim_spec_default(&s, DSIM_OPTIM_ADAM);
    s.clipvalue = -1;
    expect_bad(&s, "clipvalue");
    s.clipvalue = NAN;
    expect_bad(&s, "clipvalue");
    s.clipvalue = 1e-60; /* 0 in float: would zero every gradient */
    expect_bad(&s, "clipvalue");
    s.clipvalue = 0;
    s.global_clipnorm = INFINITY;
    expect_bad(&s, "global_clipnorm");
    s.global_clipnorm = 1;
    s.clipvalue = 1;
    expect_bad(&s, "only one of clipvalue");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sgd),
        cmocka_unit_test(test_momentum),
        cmocka_unit_test(test_nesterov),
        cmocka_unit_test(test_adam),
        cmocka_unit_test(test_rmsprop),
        cmocka_unit_test(test_adagrad),
        cmocka_unit_test(test_lion),
        cmocka_unit_test(test_amsgrad),
        cmocka_unit_test(test_adamax),
        cmocka_unit_test(test_lamb),
        cmocka_unit_test(test_nadam),
        cmocka_unit_test(test_adadelta),
        cmocka_unit_test(test_slot_names),
        cmocka_unit_test(test_sgd_momentum),
        cmocka_unit_test(test_checkpoint_restore),
        cmocka_unit_test(test_bad_specs),
        cmocka_unit_test(test_schedules),
        cmocka_unit_test(test_bad_schedules),
        cmocka_unit_test(test_accumulation),
        cmocka_unit_test(test_set_part),
        cmocka_unit_test(test_clip),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
