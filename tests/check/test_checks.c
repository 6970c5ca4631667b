/* The built-in checks and the expect-list runner on hand-made runs: each
 * check passes where it should, fails where it should, and its message
 * names the step, replica, parameter or example ids to look at. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "check/check.h"
#include "check/check_int.h"
#include "dsim/data.h"
#include "dsim/strategy.h"
#include "scenario/scenario.h"

#define NP 4

static void assert_has(const char *text, const char *needle)
{
    if (strstr(text, needle) == NULL)
        fail_msg("message \"%s\" lacks \"%s\"", text, needle);
}

/* A finished run of `replicas` replicas (1 device each) and `steps` steps
 * whose replicas agree after every step. */
typedef struct fake_run {
    dsim_train_result res, ref;
    dsim_train_cfg cfg;
    float params[NP], ref_params[NP];
    uint64_t checksum[64];
} fake_run;

static void fake_init(fake_run *f, int replicas, uint64_t steps)
{
    memset(f, 0, sizeof *f);
    dsim_train_cfg_init(&f->cfg);
    f->cfg.strategy = "mirrored";
    f->cfg.hosts = replicas;
    f->cfg.devices_per_host = 1;
    for (int i = 0; i < NP; i++)
        f->params[i] = f->ref_params[i] = 0.25f * (float)(i + 1);
    assert_true((size_t)replicas * steps <= 64);
    for (uint64_t s = 0; s < steps; s++)
        for (int r = 0; r < replicas; r++)
            f->checksum[s * (uint64_t)replicas + (uint64_t)r] = 0x1000 + s;
    dsim_train_result *r = &f->res;
    snprintf(r->strategy, sizeof r->strategy, "mirrored");
    r->num_workers = replicas;
    r->devices_per_host = 1;
    r->num_replicas = replicas;
    r->num_replicas_in_sync = replicas;
    r->steps = steps;
    r->n_params = NP;
    r->params = f->params;
    r->checksum = f->checksum;
    r->replicas_agree = true;
    r->in_sync_every_step = true;
    r->final_loss = 0.5;
    r->initial_loss = 1.4;
    f->ref.num_replicas = 1;
    f->ref.steps = steps;
    f->ref.n_params = NP;
    f->ref.params = f->ref_params;
    f->ref.final_loss = 0.5;
}

static dsim_check_ctx fake_ctx(fake_run *f)
{
    dsim_check_ctx c = {
        .cfg = &f->cfg,
        .run = &f->res,
        .reference = &f->ref,
        .run_err = DSIM_OK,
    };
    return c;
}

/* The check's defaults, with overrides as key/value pairs ending in NULL. */
static void values_of(const dsim_check_ops *ops, double *v, ...)
{
    for (int i = 0; i < ops->n_params; i++)
        v[i] = ops->params[i].def;
    va_list ap;
    va_start(ap, v);
    const char *key;
    while ((key = va_arg(ap, const char *)) != NULL) {
        double x = va_arg(ap, double);
        int k = dsim_check_param_index(ops, key);
        assert_true(k >= 0);
        v[k] = x;
    }
    va_end(ap);
}

static dsim_check_result judge(const char *name, const dsim_check_ctx *ctx, const double *v)
{
    const dsim_check_ops *ops = dsim_check_find(name);
    assert_non_null(ops);
    assert_true(ops->available);
    dsim_check_result r;
    memset(&r, 0, sizeof r);
    assert_int_equal(ops->run(ctx, v, &r), DSIM_OK);
    assert_true(r.message[0] != '\0');
    return r;
}

/* ---- registry ---- */

static void test_registry(void **state)
{
    (void)state;
    const char *avail[] = {
        "gradient_consistency", "shard_coverage", "convergence",         "node_loss",
        "cold_start",           "performance",    "checkpoint_roundtrip"};
    for (size_t i = 0; i < sizeof avail / sizeof avail[0]; i++) {
        const dsim_check_ops *c = dsim_check_find(avail[i]);
        assert_non_null(c);
        assert_true(c->available);
        assert_non_null(c->run);
        assert_int_equal(c->size, sizeof(dsim_check_ops));
    }
    assert_null(dsim_check_find("gradient"));
    assert_int_equal(dsim_check_count(), 7);
    for (size_t i = 0; i < dsim_check_count(); i++) {
        const dsim_check_ops *c = dsim_check_at(i);
        for (int k = 0; k < c->n_params; k++) {
            const dsim_check_param *p = &c->params[k];
            assert_true(p->min <= p->max);
            if (!isnan(p->def))
                assert_true(p->def >= p->min && p->def <= p->max);
        }
    }
}

/* ---- gradient_consistency ---- */

/* The reported loss is the sum of the local losses, or not. */
static void test_gc_loss(void **state)
{
    (void)state;
    fake_run f;
    fake_init(&f, 4, 3);
    double local[12], loss[3];
    for (int s = 0; s < 3; s++) {
        loss[s] = 0;
        for (int k = 0; k < 4; k++) {
            local[s * 4 + k] = 0.1 * (s + 1) + 0.01 * k;
            loss[s] += local[s * 4 + k];
        }
    }
    f.res.local_loss = local;
    f.res.loss = loss;
    dsim_check_ctx ctx = fake_ctx(&f);
    const dsim_check_ops *gc = dsim_check_find("gradient_consistency");
    double v[DSIM_CHECK_MAX_PARAMS];
    values_of(gc, v, NULL);
    dsim_check_result r = judge("gradient_consistency", &ctx, v);
    assert_true(r.passed);

    /* a reduce that averages where SUM was asked */
    loss[1] /= 4;
    r = judge("gradient_consistency", &ctx, v);
    assert_false(r.passed);
    assert_has(r.message, "the loss the strategy reports at global step 1");
    assert_has(r.message, "ratio 0.25");
    assert_has(r.message, "averaged (MEAN) where the driver asked for SUM");
    assert_true(fabs(r.measured - 0.75) < 1e-9);

    /* a reduce that does not combine at all */
    loss[1] = local[4];
    r = judge("gradient_consistency", &ctx, v);
    assert_false(r.passed);
    assert_has(r.message, "replica 0's own local loss");

    /* not reduced (asynchronous servers): not judged */
    loss[1] = NAN;
    r = judge("gradient_consistency", &ctx, v);
    assert_true(r.passed);
}

static void test_gc_pass(void **state)
{
    (void)state;
    fake_run f;
    fake_init(&f, 4, 3);
    /* a rounding-sized difference passes */
    f.params[2] = nextafterf(f.ref_params[2], 2.0f);
    dsim_check_ctx ctx = fake_ctx(&f);
    double v[DSIM_CHECK_MAX_PARAMS];
    values_of(dsim_check_find("gradient_consistency"), v, NULL);
    dsim_check_result r = judge("gradient_consistency", &ctx, v);
    assert_true(r.passed);
    assert_true(r.measured == 0);
    assert_true(r.expected == 1e-4);
    assert_has(r.message, "bit-identical");
}

/* Both runs blew up: NaN equals NaN in the comparison, but it is no pass. */
static void test_gc_non_finite_fails(void **state)
{
    (void)state;
    fake_run f;
    fake_init(&f, 2, 2);
    f.params[3] = f.ref_params[3] = NAN;
    dsim_check_ctx ctx = fake_ctx(&f);
    double v[DSIM_CHECK_MAX_PARAMS];
    values_of(dsim_check_find("gradient_consistency"), v, NULL);
    dsim_check_result r = judge("gradient_consistency", &ctx, v);
    assert_false(r.passed);
    assert_has(r.message, "parameter 3 is nan");
    assert_has(r.message, "diverged");
}

static void test_gc_divergence_names_step_and_replica(void **state)
{
    (void)state;
    fake_run f;
    fake_init(&f, 4, 3);
    f.res.first_step = 10;
    f.ref.first_step = 10; /* both end at global step 13 */
    f.res.in_sync_every_step = false;
    f.checksum[1 * 4 + 3] ^= 0xff; /* step 1 (global 11), replica 3 */
    f.checksum[2 * 4 + 2] ^= 0xff;
    dsim_check_ctx ctx = fake_ctx(&f);
    double v[DSIM_CHECK_MAX_PARAMS];
    values_of(dsim_check_find("gradient_consistency"), v, NULL);
    dsim_check_result r = judge("gradient_consistency", &ctx, v);
    assert_false(r.passed);
    assert_has(r.message, "global step 11");
    assert_has(r.message, "replica 3 (worker 3, device 0)");
    assert_has(r.message, "1 of 4 replicas differ");
    assert_null(strstr(r.message, "variables")); /* no signatures kept */

    /* with the variables' signatures, the ones that part are named: one,
     * two, or every one */
    uint16_t sig[12 * DSIM_MODEL_MAX_VARS] = {0};
    dsim_model_spec ms = {
        .kind = DSIM_MODEL_MLP, .in_dim = 3, .out_dim = 2, .n_hidden = 1, .hidden = {4}};
    f.res.n_vars = dsim_model_vars(&ms, f.res.vars);
    assert_int_equal(f.res.n_vars, 4);
    for (size_t k = 0; k < 12; k++)
        for (size_t v = 0; v < 4; v++)
            sig[k * DSIM_MODEL_MAX_VARS + v] = (uint16_t)(100 + v);
    f.res.var_sig = sig;
    sig[(1 * 4 + 3) * DSIM_MODEL_MAX_VARS + 3] = 7;
    r = judge("gradient_consistency", &ctx, v);
    assert_has(r.message, "of the model's 4 variables, only layer 2's bias [2] (parameters "
                          "24..25) differs;");
    sig[(1 * 4 + 3) * DSIM_MODEL_MAX_VARS + 0] = 7;
    r = judge("gradient_consistency", &ctx, v);
    assert_has(r.message, "only layer 1's kernel [3 x 4] (parameters 0..11) and layer 2's bias "
                          "[2] (parameters 24..25) differ;");
    for (size_t k = 0; k < 4; k++)
        sig[(1 * 4 + 3) * DSIM_MODEL_MAX_VARS + k] = 7;
    r = judge("gradient_consistency", &ctx, v);
    assert_has(r.message, "every one of the model's 4 variables differs");
    sig[(1 * 4 + 0) * DSIM_MODEL_MAX_VARS + 2] = 0; /* a step not kept: nothing said */
    r = judge("gradient_consistency", &ctx, v);
    assert_null(strstr(r.message, "variables"));
    assert_has(r.message, "1 of 4 replicas differ");

    /* with bit identity not required, the reference decides */
    values_of(dsim_check_find("gradient_consistency"), v, "bit_identical", 0.0, NULL);
    r = judge("gradient_consistency", &ctx, v);
    assert_true(r.passed);
    assert_has(r.message, "not required");
}

static void test_gc_reference_mismatch(void **state)
{
    (void)state;
    fake_run f;
    fake_init(&f, 2, 2);
    f.params[1] = f.ref_params[1] * 0.5f; /* what MEAN over 2 replicas looks like */
    dsim_check_ctx ctx = fake_ctx(&f);
    double v[DSIM_CHECK_MAX_PARAMS];
    values_of(dsim_check_find("gradient_consistency"), v, NULL);
    dsim_check_result r = judge("gradient_consistency", &ctx, v);
    assert_false(r.passed);
    assert_true(fabs(r.measured - 0.5) < 1e-9);
    assert_has(r.message, "1 of 4 parameters");
    assert_has(r.message, "parameter 1 is 0.25");
    assert_has(r.message, "reference 0.5");
    /* where the run says what its model's variables are, the parameter is
     * placed in them (a linear model of 1 feature and 2 outputs) */
    dsim_model_spec lin = {.kind = DSIM_MODEL_LINEAR, .in_dim = 1, .out_dim = 2};
    f.res.n_vars = dsim_model_vars(&lin, f.res.vars);
    r = judge("gradient_consistency", &ctx, v);
    assert_has(r.message, "worst: parameter 1 (layer 1's kernel [1 x 2] at [0, 1]) is 0.25");

    /* a looser bound accepts it */
    values_of(dsim_check_find("gradient_consistency"), v, "max_rel_error", 0.6, NULL);
    r = judge("gradient_consistency", &ctx, v);
    assert_true(r.passed);

    /* a large absolute floor accepts it too; then nothing counts as beyond it */
    values_of(dsim_check_find("gradient_consistency"), v, "max_abs_error", 1.0, NULL);
    r = judge("gradient_consistency", &ctx, v);
    assert_true(r.passed);
    assert_true(r.measured == 0);
}

/* How a run's updates differ from the reference's, from both traces: the
 * reference takes steps of u[s]; the run takes steps `run_upd(s, u)`. */
typedef struct diag_traces {
    float init[NP], ref_init[NP];
    float run[3 * NP], ref[3 * NP];
} diag_traces;

static void diag_fill(fake_run *f, diag_traces *t, int replicas, void (*upd)(int s, float *u))
{
    static const float u0[3][NP] = {
        {0.10f, -0.20f, 0.05f, 0.30f}, {0.08f, -0.15f, 0.07f, 0.21f}, {0.06f, -0.11f, 0.02f, 0.2f}};
    fake_init(f, replicas, 3);
    for (int i = 0; i < NP; i++)
        t->init[i] = t->ref_init[i] = 0.5f + 0.25f * (float)i;
    float a[NP], b[NP];
    memcpy(a, t->init, sizeof a);
    memcpy(b, t->init, sizeof b);
    for (int s = 0; s < 3; s++) {
        float u[NP];
        memcpy(u, u0[s], sizeof u);
        upd(s, u);
        for (int i = 0; i < NP; i++) {
            a[i] += u[i];
            b[i] += u0[s][i];
        }
        memcpy(t->run + s * NP, a, sizeof a);
        memcpy(t->ref + s * NP, b, sizeof b);
    }
    memcpy(f->params, a, sizeof a);
    memcpy(f->ref_params, b, sizeof b);
    f->res.trace = t->run;
    f->res.initial_params = t->init;
    f->ref.trace = t->ref;
    f->ref.initial_params = t->ref_init;
}

static void diag_quarter(int s, float *u)
{
    (void)s;
    for (int i = 0; i < NP; i++)
        u[i] *= 0.25f;
}
static void diag_times4(int s, float *u)
{
    (void)s;
    for (int i = 0; i < NP; i++)
        u[i] *= 4.0f;
}
static void diag_stale(int s, float *u)
{
    static const float prev[2][NP] = {{0.10f, -0.20f, 0.05f, 0.30f}, {0.08f, -0.15f, 0.07f, 0.21f}};
    for (int i = 0; i < NP; i++)
        u[i] = s == 0 ? 0.0f : prev[s - 1][i];
}
static void diag_tail(int s, float *u)
{
    (void)s;
    u[3] *= 0.25f; /* the last parameter averaged */
}
static void diag_skewed(int s, float *u)
{
    (void)s;
    u[0] *= 0.6f; /* a sum that lacks one replica's part: smaller, and turned */
    u[1] *= 0.9f;
    u[2] *= 0.5f;
    u[3] *= 0.75f;
}
static void diag_late(int s, float *u)
{
    if (s == 2)
        for (int i = 0; i < NP; i++)
            u[i] *= 0.5f;
}

static dsim_check_result diag_judge(fake_run *f)
{
    dsim_check_ctx ctx = fake_ctx(f);
    double v[DSIM_CHECK_MAX_PARAMS];
    values_of(dsim_check_find("gradient_consistency"), v, NULL);
    dsim_check_result r = judge("gradient_consistency", &ctx, v);
    assert_false(r.passed);
    return r;
}

static void test_gc_diagnosis(void **state)
{
    (void)state;
    fake_run f;
    diag_traces t;
    diag_fill(&f, &t, 4, diag_quarter);
    dsim_check_result r = diag_judge(&f);
    assert_has(r.message, "From global step 0 the run's updates are 0.25 times the reference's");
    assert_has(r.message, "averaged again over the replicas (MEAN where SUM is right");

    diag_fill(&f, &t, 4, diag_times4);
    r = diag_judge(&f);
    assert_has(r.message, "updates are 4 times the reference's");
    assert_has(r.message, "summed where each already stood for the whole batch");

    diag_fill(&f, &t, 4, diag_stale);
    r = diag_judge(&f);
    assert_has(r.message, "The run is stale by one step: it applied no update at global step 0");

    diag_fill(&f, &t, 4, diag_tail);
    r = diag_judge(&f);
    assert_has(r.message, "1 of 4 parameters are updated differently");
    assert_has(r.message, "parameters 3..3, whose update is 0.25 times");
    assert_has(r.message, "Only part of the buffer was reduced");

    diag_fill(&f, &t, 4, diag_late);
    r = diag_judge(&f);
    assert_has(r.message, "From global step 2 the run's updates are 0.5 times");

    diag_fill(&f, &t, 4, diag_skewed);
    r = diag_judge(&f);
    assert_has(r.message, "not in its direction");
    assert_has(r.message, "one of the 4 replicas' gradients is probably missing");

    /* other initial variables */
    diag_fill(&f, &t, 4, diag_quarter);
    t.init[2] += 1.0f;
    r = diag_judge(&f);
    assert_has(r.message, "started from other variables than the reference (parameter 2");
    assert_has(r.message, "create_variables");

    /* traces kept every 3 steps: the updates of each 3 steps compared */
    diag_fill(&f, &t, 4, diag_quarter);
    f.res.trace = t.run + 2 * NP;
    f.ref.trace = t.ref + 2 * NP;
    f.res.trace_every = f.ref.trace_every = 3;
    f.res.trace_rows = f.ref.trace_rows = 1;
    r = diag_judge(&f);
    assert_has(r.message, "From global steps 0..2 the run's updates are 0.25 times");
    /* ... and kept alike in the run and the reference, or not compared */
    f.ref.trace_every = 1;
    r = diag_judge(&f);
    assert_has(r.message, "variables were not kept");

    /* without traces, nothing is guessed */
    diag_fill(&f, &t, 4, diag_quarter);
    f.res.trace = NULL;
    r = diag_judge(&f);
    assert_has(r.message, "variables were not kept");
}

/* A model too large for the harness to keep a step of (no trace) that ends
 * beyond tolerance: step 0's gradient, where run and reference stand at
 * the same variables, is judged by its norm; the rest is not judged. */
static void test_gc_untraced(void **state)
{
    (void)state;
    fake_run f;
    fake_init(&f, 2, 2);
    size_t P = DSIM_CHECK_TRACE_MAX / 4 + 1;
    f.cfg.optim.kind = DSIM_OPTIM_ADAM;
    float *a = calloc(P, sizeof(float)), *b = calloc(P, sizeof(float));
    assert_non_null(a);
    assert_non_null(b);
    for (size_t i = 0; i < P; i++)
        a[i] = b[i] = 1.0f;
    a[P - 3] = 1.5f;
    double gn[4] = {2.0, 2.0, 1.0, 1.0}, gref[2] = {2.0, 1.1};
    f.res.params = a;
    f.ref.params = b;
    f.res.n_params = f.ref.n_params = P;
    f.res.grad_norm = gn;
    f.ref.grad_norm = gref;
    dsim_check_ctx ctx = fake_ctx(&f);
    double v[DSIM_CHECK_MAX_PARAMS];
    values_of(dsim_check_find("gradient_consistency"), v, NULL);
    dsim_check_result r = judge("gradient_consistency", &ctx, v);
    assert_true(r.not_judged);
    assert_false(r.passed);
    assert_has(r.message, "not judged: the run ends 0.333 (relative) from the one-device "
                          "reference, parameter 2097150");
    assert_has(r.message, "this model's 2097153 parameters (and under adam its gradient and two "
                          "slots) are more than the 8388608 floats");
    assert_has(r.message, "at global step 0, where both stand at the same variables, has one "
                          "device's norm (0 relative apart)");
    assert_has(r.message, "a model of at most 2097152 parameters has its steps judged");
    /* RMSprop centered and with momentum: three slots a step besides the
     * variables and the gradient */
    f.cfg.optim.kind = DSIM_OPTIM_RMSPROP;
    f.cfg.optim.momentum = 0.5;
    f.cfg.optim.centered = 1;
    r = judge("gradient_consistency", &ctx, v);
    assert_true(r.not_judged);
    assert_has(r.message, "(and under rmsprop its gradient and three slots)");
    assert_has(r.message, "a model of at most 1677721 parameters has its steps judged");
    f.cfg.optim.kind = DSIM_OPTIM_ADAM;
    /* step 0's gradient half one device's: averaged again over 2 replicas */
    gn[0] = 1.0;
    r = judge("gradient_consistency", &ctx, v);
    assert_false(r.not_judged);
    assert_false(r.passed);
    assert_has(r.message, "the gradient replica 0 applied has norm 1 and one device's 2 (0.5 "
                          "times it");
    assert_has(r.message, "averaged again over the replicas");
    /* no norm to compare (a sharded optimizer's replica 0 applies a part) */
    gn[0] = NAN;
    r = judge("gradient_consistency", &ctx, v);
    assert_true(r.not_judged);
    assert_null(strstr(r.message, "global step 0"));
    /* under sgd a model of that size is kept: a run without its trace
     * (not asked for) is judged as before */
    f.cfg.optim.kind = DSIM_OPTIM_SGD;
    r = judge("gradient_consistency", &ctx, v);
    assert_false(r.not_judged);
    assert_has(r.message, "the variables were not kept step by step");
    /* within tolerance: judged as any run */
    f.cfg.optim.kind = DSIM_OPTIM_ADAM;
    a[P - 3] = 1.0f;
    r = judge("gradient_consistency", &ctx, v);
    assert_true(r.passed);
    assert_false(r.not_judged);
    free(a);
    free(b);
}

static void test_gc_abs_floor_near_zero(void **state)
{
    (void)state;
    fake_run f;
    fake_init(&f, 2, 1);
    f.params[0] = 1e-9f;
    f.ref_params[0] = 2e-9f; /* relative error 0.5, absolute 1e-9 */
    dsim_check_ctx ctx = fake_ctx(&f);
    double v[DSIM_CHECK_MAX_PARAMS];
    values_of(dsim_check_find("gradient_consistency"), v, NULL);
    assert_true(judge("gradient_consistency", &ctx, v).passed);
    values_of(dsim_check_find("gradient_consistency"), v, "max_abs_error", 0.0, NULL);
    dsim_check_result r = judge("gradient_consistency", &ctx, v);
    assert_false(r.passed);
    assert_has(r.message, "parameter 0");
}

static void test_gc_bad_runs(void **state)
{
    (void)state;
    fake_run f;
    double v[DSIM_CHECK_MAX_PARAMS];
    values_of(dsim_check_find("gradient_consistency"), v, NULL);

    fake_init(&f, 2, 2);
    f.params[3] = NAN;
    dsim_check_ctx ctx = fake_ctx(&f);
    dsim_check_result r = judge("gradient_consistency", &ctx, v);
    assert_false(r.passed);
    assert_has(r.message, "parameter 3");

    fake_init(&f, 2, 2);
    f.ref.n_params = 3;
    ctx = fake_ctx(&f);
    r = judge("gradient_consistency", &ctx, v);
    assert_false(r.passed);
    assert_has(r.message, "4 parameters but the reference has 3");

    fake_init(&f, 2, 2);
    f.ref.steps = 3;
    ctx = fake_ctx(&f);
    r = judge("gradient_consistency", &ctx, v);
    assert_false(r.passed);
    assert_has(r.message, "2 steps");

    fake_init(&f, 2, 2);
    ctx = fake_ctx(&f);
    ctx.reference = NULL;
    r = judge("gradient_consistency", &ctx, v);
    assert_false(r.passed);
    assert_has(r.message, "no one-device reference");

    fake_init(&f, 2, 2);
    f.res.replicas_agree = false;
    ctx = fake_ctx(&f);
    r = judge("gradient_consistency", &ctx, v);
    assert_false(r.passed);
    assert_has(r.message, "ended with different parameters");
}

static void test_gc_async_ps(void **state)
{
    (void)state;
    fake_run f;
    fake_init(&f, 2, 3);
    snprintf(f.res.strategy, sizeof f.res.strategy, "parameter_server");
    f.cfg.strategy = "parameter_server";
    f.cfg.num_ps = 1;
    f.cfg.ps_mode = DSIM_PS_ASYNC;
    f.res.num_ps = 1;
    f.res.max_staleness = 2;
    f.res.in_sync_every_step = false;
    f.checksum[3] ^= 1;
    f.params[0] = f.ref_params[0] * 1.5f; /* far from the synchronous replay */
    dsim_check_ctx ctx = fake_ctx(&f);
    double v[DSIM_CHECK_MAX_PARAMS];
    values_of(dsim_check_find("gradient_consistency"), v, NULL);
    dsim_check_result r = judge("gradient_consistency", &ctx, v);
    assert_true(r.passed);
    assert_true(isnan(r.expected));
    assert_true(r.measured > 0.3);
    assert_has(r.message, "asynchronous");
    assert_has(r.message, "max staleness 2");

    f.res.replicas_agree = false;
    r = judge("gradient_consistency", &ctx, v);
    assert_false(r.passed);
    assert_has(r.message, "(NO)");

    /* the same run, synchronous, is judged in full */
    f.res.replicas_agree = true;
    f.cfg.ps_mode = DSIM_PS_SYNC;
    r = judge("gradient_consistency", &ctx, v);
    assert_false(r.passed);
    assert_has(r.message, "replica 1");
}

/* ---- shard_coverage ---- */

/* A ledger of 2 workers x 1 device, 8 examples, 1 epoch: each step both
 * replicas read 2 ids. counts[id] reads of id; a replica's reads are dealt
 * in order. */
static dsim_ledger *ledger_of(const int *reader, size_t n_reads, int workers, uint32_t epochs)
{
    dsim_ledger *l = NULL;
    assert_int_equal(dsim_ledger_create(8, epochs, workers, 1, &l), DSIM_OK);
    for (uint32_t e = 0; e < epochs; e++) {
        uint64_t step[8] = {0};
        for (size_t i = 0; i < n_reads; i++) {
            if (reader[i] < 0)
                continue;
            uint64_t id = i % 8;
            assert_int_equal(dsim_ledger_record(l, reader[i], e, step[reader[i]]++, &id, 1),
                             DSIM_OK);
        }
    }
    return l;
}

static void test_sc_exact(void **state)
{
    (void)state;
    int reader[8] = {0, 1, 0, 1, 0, 1, 0, 1};
    fake_run f;
    fake_init(&f, 2, 4);
    f.res.shard_applied = DSIM_SHARD_DATA;
    f.res.ledger = ledger_of(reader, 8, 2, 2);
    f.cfg.epochs = 2;
    dsim_check_ctx ctx = fake_ctx(&f);
    double v[DSIM_CHECK_MAX_PARAMS];
    values_of(dsim_check_find("shard_coverage"), v, NULL);
    dsim_check_result r = judge("shard_coverage", &ctx, v);
    assert_true(r.passed);
    assert_true(r.measured == 0);
    assert_has(r.message, "every example read once");
    dsim_ledger_destroy(f.res.ledger);
}

static void test_sc_duplicates_and_misses(void **state)
{
    (void)state;
    /* ids 0..7 by reader; then id 0 and 1 again (i = 8, 9 wrap to 0, 1) */
    int reader[10] = {0, 1, 0, 1, 0, 1, 0, 1, 1, 0};
    fake_run f;
    fake_init(&f, 2, 5);
    f.res.shard_applied = DSIM_SHARD_FILE;
    f.res.ledger = ledger_of(reader, 10, 2, 1);
    dsim_check_ctx ctx = fake_ctx(&f);
    double v[DSIM_CHECK_MAX_PARAMS];
    values_of(dsim_check_find("shard_coverage"), v, NULL);
    dsim_check_result r = judge("shard_coverage", &ctx, v);
    assert_false(r.passed);
    assert_true(r.measured == 2);
    assert_true(r.expected == 0);
    assert_has(r.message, "2 of 8 examples read more than once");
    assert_has(r.message, "example 0 by replicas 0 and 1; example 1 by replicas 0 and 1. The same "
                          "replicas read each of these: their shards overlap");
    dsim_ledger_destroy(f.res.ledger);

    /* ids 3 and 6 never read */
    int missing[8] = {0, 1, 0, -1, 0, 1, -1, 1};
    f.res.ledger = ledger_of(missing, 8, 2, 1);
    r = judge("shard_coverage", &ctx, v);
    assert_false(r.passed);
    assert_true(r.measured == 2);
    assert_has(r.message, "2 of 8 examples read less than once");
    assert_has(r.message, "ids 3, 6)");
    values_of(dsim_check_find("shard_coverage"), v, "max_misses", 2.0, NULL);
    r = judge("shard_coverage", &ctx, v);
    assert_true(r.passed);
    dsim_ledger_destroy(f.res.ledger);
}

/* Who read a duplicate, readably: replicas with their workers, a replica
 * that read the same example twice. */
static void test_sc_duplicate_readers(void **state)
{
    (void)state;
    dsim_ledger *l = NULL;
    /* 2 workers x 2 devices; example 5 read by replicas 1 and 2, example 6
     * by replica 3 twice, the rest once */
    assert_int_equal(dsim_ledger_create(8, 1, 2, 2, &l), DSIM_OK);
    uint64_t a[] = {0, 1, 5}, b[] = {2, 3}, c[] = {4, 5}, d[] = {6, 7, 6};
    assert_int_equal(dsim_ledger_record(l, 1, 0, 0, a, 3), DSIM_OK);
    assert_int_equal(dsim_ledger_record(l, 0, 0, 0, b, 2), DSIM_OK);
    assert_int_equal(dsim_ledger_record(l, 2, 0, 0, c, 2), DSIM_OK);
    assert_int_equal(dsim_ledger_record(l, 3, 0, 0, d, 3), DSIM_OK);
    fake_run f;
    fake_init(&f, 4, 1);
    f.res.devices_per_host = 2;
    f.res.num_workers = 2;
    f.cfg.hosts = 2;
    f.cfg.devices_per_host = 2;
    f.res.shard_applied = DSIM_SHARD_DATA;
    f.res.ledger = l;
    dsim_check_ctx ctx = fake_ctx(&f);
    double v[DSIM_CHECK_MAX_PARAMS];
    values_of(dsim_check_find("shard_coverage"), v, NULL);
    dsim_check_result r = judge("shard_coverage", &ctx, v);
    assert_false(r.passed);
    assert_has(r.message, "2 of 8 examples read more than once");
    assert_has(r.message, "example 5 by replicas 1 and 2 (workers 0 and 1)");
    assert_has(r.message, "example 6 by replica 3 (worker 1) 2 times");
    dsim_ledger_destroy(l);
}

static void test_sc_policy_off(void **state)
{
    (void)state;
    /* both workers read every id once: once per worker */
    int reader[16] = {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1};
    fake_run f;
    fake_init(&f, 2, 8);
    f.res.ledger = ledger_of(reader, 16, 2, 1);
    f.res.shard_applied = DSIM_SHARD_OFF;
    dsim_check_ctx ctx = fake_ctx(&f);
    double v[DSIM_CHECK_MAX_PARAMS];
    values_of(dsim_check_find("shard_coverage"), v, NULL);
    dsim_check_result r = judge("shard_coverage", &ctx, v);
    assert_true(r.passed);
    assert_has(r.message, "once per worker");

    /* the same reads under a sharding policy are all duplicates */
    f.res.shard_applied = DSIM_SHARD_DATA;
    r = judge("shard_coverage", &ctx, v);
    assert_false(r.passed);
    assert_true(r.measured == 8);
    dsim_ledger_destroy(f.res.ledger);

    /* under OFF, one worker reading only half is a miss of half */
    int half[12] = {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1};
    f.res.ledger = ledger_of(half, 12, 2, 1);
    f.res.shard_applied = DSIM_SHARD_OFF;
    r = judge("shard_coverage", &ctx, v);
    assert_false(r.passed);
    assert_has(r.message, "read less than once per worker");
    assert_has(r.message, "ids 4, 5, 6, 7)");
    dsim_ledger_destroy(f.res.ledger);
}

static void test_sc_idle_and_imbalance(void **state)
{
    (void)state;
    dsim_ledger *l = NULL;
    assert_int_equal(dsim_ledger_create(8, 1, 2, 1, &l), DSIM_OK);
    /* replica 0 reads 3 ids a step for 2 steps, replica 1 reads 2 then none */
    uint64_t a[3] = {0, 1, 2}, b[3] = {3, 4, 5}, c[2] = {6, 7};
    assert_int_equal(dsim_ledger_record(l, 0, 0, 0, a, 3), DSIM_OK);
    assert_int_equal(dsim_ledger_record(l, 1, 0, 0, c, 2), DSIM_OK);
    assert_int_equal(dsim_ledger_record(l, 0, 0, 1, b, 3), DSIM_OK);
    assert_int_equal(dsim_ledger_record(l, 1, 0, 1, NULL, 0), DSIM_OK);
    fake_run f;
    fake_init(&f, 2, 2);
    f.res.ledger = l;
    f.res.shard_applied = DSIM_SHARD_FILE;
    dsim_check_ctx ctx = fake_ctx(&f);
    double v[DSIM_CHECK_MAX_PARAMS];
    values_of(dsim_check_find("shard_coverage"), v, NULL);
    assert_true(judge("shard_coverage", &ctx, v).passed); /* no limits by default */

    values_of(dsim_check_find("shard_coverage"), v, "max_idle", 0.0, NULL);
    dsim_check_result r = judge("shard_coverage", &ctx, v);
    assert_false(r.passed);
    assert_true(r.measured == 1);
    assert_has(r.message, "step 1 replica 1");

    values_of(dsim_check_find("shard_coverage"), v, "max_imbalance", 2.0, NULL);
    r = judge("shard_coverage", &ctx, v);
    assert_false(r.passed);
    assert_true(r.measured == 3);
    assert_has(r.message, "replica 0 read 6 examples, replica 1 read 2");
    values_of(dsim_check_find("shard_coverage"), v, "max_imbalance", 3.0, NULL);
    assert_true(judge("shard_coverage", &ctx, v).passed);

    /* no ledger: nothing to judge */
    f.res.ledger = NULL;
    r = judge("shard_coverage", &ctx, v);
    assert_false(r.passed);
    assert_has(r.message, "no coverage ledger");
    dsim_ledger_destroy(l);
}

/* ---- naming lost ranks ---- */

static void test_ranks_text(void **state)
{
    (void)state;
    char buf[160];
    bool lost[8] = {false};
    dsim_check_ranks_text(lost, 8, 6, 2, buf, sizeof buf);
    assert_string_equal(buf, "no rank");
    lost[2] = lost[3] = true;
    dsim_check_ranks_text(lost, 8, 6, 2, buf, sizeof buf);
    assert_string_equal(buf, "ranks 2-3 (worker 1)");
    lost[3] = false;
    dsim_check_ranks_text(lost, 8, 6, 2, buf, sizeof buf);
    assert_string_equal(buf, "rank 2 (worker 1)");
    lost[1] = lost[3] = lost[5] = lost[6] = true;
    dsim_check_ranks_text(lost, 8, 6, 2, buf, sizeof buf);
    assert_string_equal(buf, "ranks 1 (worker 0), 2-3 (worker 1), 5 (worker 2) and parameter "
                             "server 0 (rank 6)");
}

/* ---- convergence ---- */

static void test_convergence(void **state)
{
    (void)state;
    fake_run f;
    fake_init(&f, 2, 2);
    f.res.final_loss = 0.51;
    f.ref.final_loss = 0.5;
    dsim_check_ctx ctx = fake_ctx(&f);
    const dsim_check_ops *ops = dsim_check_find("convergence");
    double v[DSIM_CHECK_MAX_PARAMS];

    values_of(ops, v, NULL);
    dsim_check_result r = judge("convergence", &ctx, v);
    assert_false(r.passed);
    assert_has(r.message, "max_final_loss");
    assert_has(r.message, "within_pct_of_reference");
    assert_false(ops->wants_reference(v));

    values_of(ops, v, "max_final_loss", 0.6, NULL);
    r = judge("convergence", &ctx, v);
    assert_true(r.passed);
    assert_true(r.measured == 0.51 && r.expected == 0.6);
    values_of(ops, v, "max_final_loss", 0.5, NULL);
    r = judge("convergence", &ctx, v);
    assert_false(r.passed);
    assert_has(r.message, "ABOVE max_final_loss 0.5");

    values_of(ops, v, "within_pct_of_reference", 5.0, NULL);
    assert_true(ops->wants_reference(v));
    r = judge("convergence", &ctx, v);
    assert_true(r.passed);
    assert_true(fabs(r.expected - 0.525) < 1e-12);
    values_of(ops, v, "within_pct_of_reference", 1.0, NULL);
    r = judge("convergence", &ctx, v);
    assert_false(r.passed);
    assert_has(r.message, "2% above");

    /* two-sided: 7 % below the reference is outside a 1 % band too */
    f.res.final_loss = 0.465;
    values_of(ops, v, "within_pct_of_reference", 1.0, NULL);
    r = judge("convergence", &ctx, v);
    assert_false(r.passed);
    assert_has(r.message, "7% below the one-device reference's 0.5 (OUTSIDE the 1% allowed either "
                          "side)");
    assert_has(r.message, "did not compute what they compute");
    assert_true(fabs(r.expected - 0.495) < 1e-12);
    values_of(ops, v, "within_pct_of_reference", 8.0, NULL);
    r = judge("convergence", &ctx, v);
    assert_true(r.passed);
    assert_has(r.message, "within the 8% allowed either side");
    /* asynchronous parameter servers: every replica's gradient an update
     * of its own, so no wrong reduction is suspected */
    f.cfg.num_ps = 1;
    f.cfg.ps_mode = DSIM_PS_ASYNC;
    f.cfg.optim.kind = DSIM_OPTIM_ADAM;
    values_of(ops, v, "within_pct_of_reference", 1.0, NULL);
    r = judge("convergence", &ctx, v);
    assert_false(r.passed);
    assert_has(r.message, "asynchronous parameter servers apply each replica's gradient as an "
                          "update of its own (2 a global step");
    assert_has(r.message, "an adaptive or momentum optimizer");
    assert_null(strstr(r.message, "did not compute what they compute"));
    f.cfg.num_ps = 0;
    f.cfg.ps_mode = DSIM_PS_SYNC;
    f.cfg.optim.kind = DSIM_OPTIM_SGD;
    f.res.final_loss = 0.51;

    /* both: the tighter bound is shown and both must hold */
    values_of(ops, v, "within_pct_of_reference", 5.0, "max_final_loss", 0.52, NULL);
    r = judge("convergence", &ctx, v);
    assert_true(r.passed);
    assert_true(r.expected == 0.52);
    values_of(ops, v, "within_pct_of_reference", 5.0, "max_final_loss", 0.505, NULL);
    assert_false(judge("convergence", &ctx, v).passed);

    ctx.reference = NULL;
    values_of(ops, v, "within_pct_of_reference", 5.0, NULL);
    r = judge("convergence", &ctx, v);
    assert_false(r.passed);
    assert_has(r.message, "no one-device reference");

    f.res.final_loss = NAN;
    values_of(ops, v, "max_final_loss", 10.0, NULL);
    r = judge("convergence", &ctx, v);
    assert_false(r.passed);
    assert_has(r.message, "diverged");
}

/* ---- the expect-list runner ---- */

static dsim_expect expect_of(const char *name, int expect_fail, ...)
{
    dsim_expect e;
    memset(&e, 0, sizeof e);
    e.check = dsim_check_find(name);
    assert_non_null(e.check);
    for (int i = 0; i < e.check->n_params; i++)
        e.values[i] = e.check->params[i].def;
    va_list ap;
    va_start(ap, expect_fail);
    const char *key;
    while ((key = va_arg(ap, const char *)) != NULL) {
        int k = dsim_check_param_index(e.check, key);
        assert_true(k >= 0);
        e.values[k] = va_arg(ap, double);
    }
    va_end(ap);
    e.expect_fail = expect_fail != 0;
    return e;
}

static void test_run_all_expect_fail(void **state)
{
    (void)state;
    fake_run f;
    fake_init(&f, 2, 2);
    f.params[0] = 2 * f.ref_params[0]; /* gradient_consistency fails for real */
    dsim_expect ex[3] = {
        expect_of("gradient_consistency", true, NULL),
        expect_of("convergence", false, "max_final_loss", 1.0, NULL),
        expect_of("convergence", true, "max_final_loss", 1.0, NULL),
    };
    dsim_scenario s;
    memset(&s, 0, sizeof s);
    s.expect = ex;
    s.n_expect = 3;
    dsim_check_ctx ctx = fake_ctx(&f);
    ctx.scenario = &s;
    assert_true(dsim_check_needs_reference(&s));
    assert_int_equal(dsim_check_outcome_count(&s), 3);
    dsim_check_outcome out[3];
    size_t n = 0, failed = 0;
    assert_int_equal(dsim_check_run_all(&ctx, out, &n, &failed), DSIM_OK);
    assert_int_equal(n, 3);
    assert_int_equal(failed, 1);
    /* expected to fail and failed: met */
    assert_string_equal(out[0].name, "gradient_consistency");
    assert_true(out[0].expect_fail);
    assert_false(out[0].check_passed);
    assert_true(out[0].passed);
    assert_has(out[0].result.message, "failed as expected");
    assert_true(out[1].passed);
    /* expected to fail but passed: not met */
    assert_true(out[2].check_passed);
    assert_false(out[2].passed);
    assert_has(out[2].result.message, "expected to fail, but passed");

    /* a run that did not finish fails every row, expect_fail ones too */
    ctx.run_err = DSIM_ETIMEDOUT;
    snprintf(f.res.error.msg, sizeof f.res.error.msg, "replica 2 timed out in allreduce");
    assert_int_equal(dsim_check_run_all(&ctx, out, &n, &failed), DSIM_OK);
    assert_int_equal(failed, 3);
    for (size_t i = 0; i < 3; i++) {
        assert_false(out[i].passed);
        assert_has(out[i].result.message, "replica 2 timed out");
    }
}

static void test_run_all_expect_error(void **state)
{
    (void)state;
    fake_run f;
    fake_init(&f, 2, 0);
    dsim_expect ex[1] = {expect_of("gradient_consistency", false, NULL)};
    dsim_scenario s;
    memset(&s, 0, sizeof s);
    s.expect = ex;
    s.n_expect = 1;
    s.expect_error = "fewer than the";
    assert_false(dsim_check_needs_reference(&s));
    assert_int_equal(dsim_check_outcome_count(&s), 1);
    dsim_check_ctx ctx = fake_ctx(&f);
    ctx.scenario = &s;
    dsim_check_outcome out[1];
    size_t n = 0, failed = 0;

    ctx.run_err = DSIM_EINVAL;
    snprintf(f.res.error.msg, sizeof f.res.error.msg,
             "the dataset has 2 file(s), fewer than the 4 workers");
    assert_int_equal(dsim_check_run_all(&ctx, out, &n, &failed), DSIM_OK);
    assert_int_equal(n, 1);
    assert_int_equal(failed, 0);
    assert_string_equal(out[0].name, "error");
    assert_true(out[0].passed);
    assert_has(out[0].result.message, "2 file(s)");

    snprintf(f.res.error.msg, sizeof f.res.error.msg, "out of memory");
    assert_int_equal(dsim_check_run_all(&ctx, out, &n, &failed), DSIM_OK);
    assert_int_equal(failed, 1);
    assert_has(out[0].result.message, "does not contain \"fewer than the\"");

    ctx.run_err = DSIM_OK;
    assert_int_equal(dsim_check_run_all(&ctx, out, &n, &failed), DSIM_OK);
    assert_int_equal(failed, 1);
    assert_has(out[0].result.message, "the run succeeded");
}

/* No expect section: nothing is judged, but a run that failed is a failure. */
static void test_run_all_no_expectations(void **state)
{
    (void)state;
    fake_run f;
    fake_init(&f, 2, 0);
    dsim_scenario s;
    memset(&s, 0, sizeof s);
    assert_false(dsim_check_needs_reference(&s));
    assert_int_equal(dsim_check_outcome_count(&s), 1);
    dsim_check_ctx ctx = fake_ctx(&f);
    ctx.scenario = &s;
    dsim_check_outcome out[1];
    size_t n = 9, failed = 9;
    assert_int_equal(dsim_check_run_all(&ctx, out, &n, &failed), DSIM_OK);
    assert_int_equal(n, 0);
    assert_int_equal(failed, 0);

    ctx.run_err = DSIM_ENOMEM;
    snprintf(f.res.error.msg, sizeof f.res.error.msg, "cannot allocate 4294967296 examples");
    assert_int_equal(dsim_check_run_all(&ctx, out, &n, &failed), DSIM_OK);
    assert_int_equal(n, 1);
    assert_int_equal(failed, 1);
    assert_string_equal(out[0].name, "run");
    assert_false(out[0].passed);
    assert_has(out[0].result.message, "the run failed: cannot allocate");
}

static void test_run_all_unavailable_and_reference(void **state)
{
    (void)state;
    fake_run f;
    fake_init(&f, 2, 2);
    /* every built-in check runs: a table declared for scenarios but not yet
     * runnable stands in for one */
    static const dsim_check_ops later = {
        .size = sizeof(dsim_check_ops), .name = "later", .summary = "not yet", .available = false};
    dsim_expect ex[2] = {
        expect_of("convergence", true, NULL),
        expect_of("convergence", false, "max_final_loss", 1.0, NULL),
    };
    ex[0].check = &later;
    dsim_scenario s;
    memset(&s, 0, sizeof s);
    s.expect = ex;
    s.n_expect = 2;
    /* convergence with only a bound does not need the reference */
    assert_false(dsim_check_needs_reference(&s));
    ex[1] = expect_of("convergence", false, "within_pct_of_reference", 10.0, NULL);
    assert_true(dsim_check_needs_reference(&s));

    dsim_check_ctx ctx = fake_ctx(&f);
    ctx.scenario = &s;
    dsim_check_outcome out[2];
    size_t n = 0, failed = 0;
    assert_int_equal(dsim_check_run_all(&ctx, out, &n, &failed), DSIM_OK);
    assert_int_equal(failed, 1);
    /* an unavailable check cannot meet "expect: fail" */
    assert_false(out[0].passed);
    assert_has(out[0].result.message, "not available");
    assert_true(out[1].passed);

    assert_int_equal(dsim_check_run_all(NULL, out, &n, &failed), DSIM_EINVAL);
}

/* ---- performance ---- */

/* node_loss on a job whose broken attempt failed before any replica started
 * (a setup error, no node lost): it says so, rather than calling the
 * replicas stuck; a replica that is stuck stays reported as one. */
static void test_node_loss_setup_failure(void **state)
{
    (void)state;
    fake_run f;
    fake_init(&f, 4, 0);
    dsim_train_replica_end ends[4];
    memset(ends, 0, sizeof ends);
    dsim_train_result broken = f.res;
    broken.replicas = ends;
    snprintf(broken.error.msg, sizeof broken.error.msg,
             "mirrored runs on one worker without parameter servers");
    dsim_check_faults fx = {.broken = &broken,
                            .broken_err = DSIM_EINVAL,
                            .lost_rank = -1,
                            .t_loss = -1,
                            .bound_ns = 1000000000};
    dsim_check_ctx ctx = fake_ctx(&f);
    ctx.run = &broken;
    ctx.run_err = DSIM_EINVAL;
    ctx.faults = &fx;
    ctx.n_faults = 1;
    const dsim_check_ops *ops = dsim_check_find("node_loss");
    double v[DSIM_CHECK_MAX_PARAMS];
    values_of(ops, v, NULL);
    dsim_check_result r = judge("node_loss", &ctx, v);
    assert_false(r.passed);
    assert_has(r.message, "failed before its replicas started: mirrored runs on one worker");
    if (strstr(r.message, "never returned") || strstr(r.message, "rank -1"))
        fail_msg("a setup failure read as a hang: %s", r.message);
    /* the same ends with a replica the watchdog found stuck: a hang */
    fx.broken_err = DSIM_EHUNG;
    ctx.run_err = DSIM_EHUNG;
    ends[2].status = DSIM_EHUNG;
    r = judge("node_loss", &ctx, v);
    assert_false(r.passed);
    assert_has(r.message, "replica 0 never returned");
}

/* What a saved checkpoint's wrong optimizer slots look like: none copied,
 * one replica's shard of a sharded state (ZeRO) with the rest zero, or
 * other values. Adam: 2 slot arrays of 6 parameters. */
static void test_saved_slots(void **state)
{
    (void)state;
    float want[12], got[12];
    for (int i = 0; i < 12; i++)
        want[i] = 0.5f + (float)i;
    want[4] = want[10] = 0.0f; /* a parameter whose moments are legitimately 0 */
    dsim_train_result ref = {.optim_state = want, .optim_state_len = 12, .optim_step = 7};
    dsim_checkpoint ck = {.n_params = 6,
                          .optim_state = got,
                          .optim_state_len = 12,
                          .optim_step = 7,
                          .global_step = 7};
    char msg[1024];
    const char *which;
    double m;
    dsim_optim_spec adam, mom, ada;
    dsim_optim_spec_default(&adam, DSIM_OPTIM_ADAM);
    dsim_optim_spec_default(&mom, DSIM_OPTIM_MOMENTUM);
    dsim_optim_spec_default(&ada, DSIM_OPTIM_ADAGRAD);

    memset(got, 0, sizeof got);
    assert_true(
        ck_judge_saved_optimizer(&ck, &ref, &adam, 1e-6, 1e-4, msg, sizeof msg, &which, &m));
    assert_string_equal(which, "optimizer state");
    assert_has(msg, "restored without them, Adam's moments restart from zero");

    /* parameters 3..5 (shard 1 of 2, with the zero one inside it) */
    memset(got, 0, sizeof got);
    for (int s = 0; s < 2; s++)
        for (int p = 3; p < 6; p++)
            got[s * 6 + p] = want[s * 6 + p];
    assert_true(
        ck_judge_saved_optimizer(&ck, &ref, &adam, 1e-6, 1e-4, msg, sizeof msg, &which, &m));
    assert_has(msg, "Only the slots of parameters 3..5 (3 of 6) were saved, the rest are zero");
    assert_null(strstr(msg, "restart from zero"));

    /* the same shard, but one value outside it is not zero: not a shard */
    got[1] = 9.0f;
    assert_true(ck_judge_saved_optimizer(&ck, &ref, &mom, 1e-6, 1e-4, msg, sizeof msg, &which, &m));
    assert_null(strstr(msg, "Only the slots"));
    assert_has(msg, "restored from these, the momentum resumes from other values");

    /* all right: nothing to say */
    memcpy(got, want, sizeof got);
    assert_false(
        ck_judge_saved_optimizer(&ck, &ref, &adam, 1e-6, 1e-4, msg, sizeof msg, &which, &m));
    /* Adagrad's accumulators saved right but started at 0, not init's
     * 0.1: the replay's less 0.1 at every parameter (one slot of 12) */
    dsim_checkpoint ck1 = ck;
    ck1.n_params = 12;
    for (int i = 0; i < 12; i++)
        got[i] = want[i] - 0.1f;
    assert_true(
        ck_judge_saved_optimizer(&ck1, &ref, &ada, 1e-6, 1e-4, msg, sizeof msg, &which, &m));
    assert_has(msg, "less initial_accumulator_value (0.1) at every parameter: save() copied "
                    "them, but they started at 0");
    /* off by other amounts: save() is what differs */
    got[3] = want[3] - 0.3f;
    assert_true(
        ck_judge_saved_optimizer(&ck1, &ref, &ada, 1e-6, 1e-4, msg, sizeof msg, &which, &m));
    assert_null(strstr(msg, "started at 0"));
    assert_has(msg, "Adagrad's accumulators resume from other values");
}

static void test_performance(void **state)
{
    (void)state;
    fake_run f;
    fake_init(&f, 4, 5);
    /* steps 1..4 count (step 0 is warm-up): 10 ms each, 3 ms of it in the
     * exchange; replica 2 computes 28 ms against the others' 7 */
    int64_t step[20], comm[20], ref_step[5] = {0}, ref_comm[5] = {0};
    for (int k = 0; k < 5; k++)
        for (int r = 0; r < 4; r++) {
            step[k * 4 + r] = k == 0 ? 1000000000 : 10000000;
            comm[k * 4 + r] = k == 0 ? 0 : 3000000;
        }
    f.res.step_ns = step;
    f.res.comm_ns = comm;
    f.ref.step_ns = ref_step;
    f.ref.comm_ns = ref_comm;
    const dsim_check_ops *ops = dsim_check_find("performance");
    double v[DSIM_CHECK_MAX_PARAMS];
    dsim_check_ctx ctx = fake_ctx(&f);

    values_of(ops, v, NULL); /* max share 0.2 */
    ctx.host_cpus = 4;
    dsim_check_result r = judge("performance", &ctx, v);
    assert_false(r.passed);
    assert_true(fabs(r.measured - 0.3) < 1e-12);
    assert_has(r.message, "all-reduce takes 30 %");
    assert_null(strstr(r.message, "took turns"));
    /* more replicas than CPUs on a wall-clock engine: the share measures
     * the host's time-sharing, so it is not judged (N/A), and said why */
    ctx.host_cpus = 2;
    r = judge("performance", &ctx, v);
    assert_true(r.not_judged);
    assert_has(r.message, "not judged: its 4 replicas took turns on this host's 2 CPUs (engine "
                          "threads), so each one's wait for the others' compute counted as "
                          "all-reduce (30 % of step time)");
    assert_has(r.message, "engine sim times the job");
    f.cfg.engine = "processes";
    assert_has(judge("performance", &ctx, v).message, "(engine processes)");
    f.cfg.engine = "sim"; /* virtual time: no turns to speak of, judged */
    r = judge("performance", &ctx, v);
    assert_false(r.not_judged);
    assert_false(r.passed);
    assert_null(strstr(r.message, "took turns"));
    f.cfg.engine = NULL;
    ctx.host_cpus = 4;
    assert_false(judge("performance", &ctx, v).not_judged);
    /* and through the expect list: N/A, neither passed nor failed, an
     * expectation to fail included */
    ctx.host_cpus = 2;
    for (int want_fail = 0; want_fail < 2; want_fail++) {
        dsim_expect ex = expect_of("performance", want_fail, NULL);
        dsim_scenario sc;
        memset(&sc, 0, sizeof sc);
        sc.expect = &ex;
        sc.n_expect = 1;
        dsim_check_ctx c2 = ctx;
        c2.scenario = &sc;
        dsim_check_outcome out;
        size_t n = 0, failed = 0;
        assert_int_equal(dsim_check_run_all(&c2, &out, &n, &failed), DSIM_OK);
        assert_int_equal(n, 1);
        assert_int_equal(failed, 0);
        assert_true(out.not_applicable);
        assert_true(out.passed);
        assert_has(out.result.message, "not judged: its 4 replicas took turns");
    }
    ctx.host_cpus = 4;

    values_of(ops, v, "max_allreduce_share", 0.5, NULL);
    r = judge("performance", &ctx, v);
    assert_true(r.passed);
    assert_has(r.message, "all-reduce 30 %");

    /* a straggler: replica 2 computes 4x the others */
    for (int k = 1; k < 5; k++)
        step[k * 4 + 2] = 31000000; /* 28 ms compute + 3 ms exchange */
    values_of(ops, v, "max_allreduce_share", 0.5, "max_straggler_factor", 2.0, NULL);
    r = judge("performance", &ctx, v);
    assert_false(r.passed);
    assert_true(fabs(r.measured - 4.0) < 1e-12);
    assert_has(r.message, "replica 2 is a straggler");
    assert_has(r.message, "4.00x");
    assert_null(strstr(r.message, "took turns"));
    /* taking turns (4 replicas on 2 CPUs), 4x is within the 2 x 2 that
     * waiting for a CPU explains: not judged, and said why */
    ctx.host_cpus = 2;
    r = judge("performance", &ctx, v);
    assert_false(r.passed);
    assert_true(r.not_judged);
    assert_true(fabs(r.measured - 4.0) < 1e-12 && r.expected == 2.0);
    assert_has(r.message, "not judged: replica 2 computes 4.00x the other replicas' median "
                          "(max_straggler_factor 2), but its 4 replicas took turns on this "
                          "host's 2 CPUs (engine threads), so one that waited for a CPU "
                          "mid-compute looks slow, up to 4x here (2 x 2 replicas a CPU)");
    /* beyond it, the replica is slow of its own: it fails */
    values_of(ops, v, "max_allreduce_share", 0.5, "max_straggler_factor", 1.5, NULL);
    r = judge("performance", &ctx, v);
    assert_false(r.passed);
    assert_false(r.not_judged);
    assert_has(r.message, "replica 2 is a straggler");
    assert_has(r.message, "took turns on this host's 2 CPUs (engine threads), so one that waited "
                          "for a CPU mid-compute looks slow, but by at most the 2 replicas a "
                          "CPU ran: this one is slower than that");
    ctx.host_cpus = 4;
    values_of(ops, v, "max_allreduce_share", 0.5, "max_straggler_factor", 5.0, NULL);
    assert_true(judge("performance", &ctx, v).passed);
    /* taking turns, the straggler alone is judged: no straggler passes */
    ctx.host_cpus = 2;
    r = judge("performance", &ctx, v);
    assert_true(r.passed);
    assert_false(r.not_judged);
    assert_true(fabs(r.measured - 4.0) < 1e-12 && r.expected == 5.0);
    assert_has(r.message, "no straggler: the slowest replica, 2, computes 4.00x");
    assert_has(r.message, "the all-reduce share and scaling efficiency not judged");
    ctx.host_cpus = 4;

    /* scaling: one device takes 62 ms a step; 4 replicas take 31 (the
     * slowest): 62 / (4 x 31) = 0.5 */
    for (int k = 0; k < 5; k++)
        ref_step[k] = 62000000;
    values_of(ops, v, "max_allreduce_share", 0.5, "min_scaling_efficiency", 0.6, NULL);
    r = judge("performance", &ctx, v);
    assert_false(r.passed);
    assert_true(fabs(r.measured - 0.5) < 1e-12);
    assert_has(r.message, "scaling efficiency 0.50 with 4 replicas");
    values_of(ops, v, "max_allreduce_share", 0.5, "min_scaling_efficiency", 0.4, NULL);
    r = judge("performance", &ctx, v);
    assert_true(r.passed);
    assert_has(r.message, "scaling efficiency 0.50");
    assert_true(ops->wants_reference(v));

    /* no step times (a run that kept none): not judged as a pass */
    f.res.step_ns = NULL;
    r = judge("performance", &ctx, v);
    assert_false(r.passed);
    assert_has(r.message, "no step times");
    /* without the reference, efficiency cannot be judged */
    f.res.step_ns = step;
    ctx.reference = NULL;
    r = judge("performance", &ctx, v);
    assert_false(r.passed);
    assert_has(r.message, "one-device replay");
}

/* cold_start: the slowest replica of each phase and the total, against
 * the bounds; no bound set, or no replica that took a step, is a failure
 * that says what to do. */
static void test_cold_start(void **state)
{
    (void)state;
    fake_run f;
    fake_init(&f, 2, 2);
    dsim_train_replica_end ends[2];
    memset(ends, 0, sizeof ends);
    const int64_t S = 1000000000LL;
    f.res.t_start = 10 * S;
    for (int i = 0; i < 2; i++) {
        ends[i].t_first[DSIM_PHASE_START] = 10 * S + i * S;    /* 0 s, 1 s late */
        ends[i].t_first[DSIM_PHASE_RENDEZVOUS] = 12 * S;       /* waits */
        ends[i].t_first[DSIM_PHASE_CREATE_VARIABLES] = 13 * S; /* rendezvous 1 s */
        ends[i].t_first[DSIM_PHASE_COMPUTE] = 13 * S + S / 2;  /* broadcast 0.5 s */
        ends[i].t_first_step = 14 * S + i * (S / 4);           /* 4 s, 4.25 s */
    }
    f.res.replicas = ends;
    const dsim_check_ops *cs = dsim_check_find("cold_start");
    assert_non_null(cs);
    double v[DSIM_CHECK_MAX_PARAMS];
    for (int k = 0; k < DSIM_CHECK_MAX_PARAMS; k++)
        v[k] = NAN;
    dsim_check_ctx ctx = fake_ctx(&f);
    dsim_check_result res;
    /* no bound */
    assert_int_equal(cs->run(&ctx, v, &res), DSIM_OK);
    assert_false(res.passed);
    assert_has(res.message, "max_first_step_s");
    /* max_first_step_s 5: the total is 4.25 s, replica 1 last */
    v[dsim_check_param_index(cs, "max_first_step_s")] = 5;
    assert_int_equal(cs->run(&ctx, v, &res), DSIM_OK);
    assert_true(res.passed);
    assert_true(fabs(res.measured - 4.25) < 1e-9);
    assert_has(res.message, "replica 1 last");
    assert_has(res.message, "start 1 s (replica 1)");
    /* growth: 2 + 1 x 2 workers = 4 s is tighter and missed */
    v[dsim_check_param_index(cs, "total_base_s")] = 2;
    v[dsim_check_param_index(cs, "total_per_worker_s")] = 1;
    assert_int_equal(cs->run(&ctx, v, &res), DSIM_OK);
    assert_false(res.passed);
    assert_true(fabs(res.expected - 4) < 1e-9);
    assert_has(res.message, "OVER the 4 s allowed");
    /* a phase bound alone: the broadcast took 0.5 s */
    for (int k = 0; k < DSIM_CHECK_MAX_PARAMS; k++)
        v[k] = NAN;
    v[dsim_check_param_index(cs, "max_broadcast_s")] = 0.25;
    assert_int_equal(cs->run(&ctx, v, &res), DSIM_OK);
    assert_false(res.passed);
    assert_has(res.message, "broadcast 0.5 s (replica 0) OVER its bound");
    /* nobody took a first step */
    ends[0].t_first_step = ends[1].t_first_step = 0;
    assert_int_equal(cs->run(&ctx, v, &res), DSIM_OK);
    assert_false(res.passed);
    assert_has(res.message, "never formed");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_registry),
        cmocka_unit_test(test_cold_start),
        cmocka_unit_test(test_gc_pass),
        cmocka_unit_test(test_gc_loss),
        cmocka_unit_test(test_gc_diagnosis),
        cmocka_unit_test(test_gc_non_finite_fails),
        cmocka_unit_test(test_gc_divergence_names_step_and_replica),
        cmocka_unit_test(test_gc_reference_mismatch),
        cmocka_unit_test(test_gc_abs_floor_near_zero),
        cmocka_unit_test(test_gc_untraced),
        cmocka_unit_test(test_gc_bad_runs),
        cmocka_unit_test(test_gc_async_ps),
        cmocka_unit_test(test_sc_exact),
        cmocka_unit_test(test_sc_duplicates_and_misses),
        cmocka_unit_test(test_sc_duplicate_readers),
        cmocka_unit_test(test_sc_policy_off),
        cmocka_unit_test(test_sc_idle_and_imbalance),
        cmocka_unit_test(test_convergence),
        cmocka_unit_test(test_ranks_text),
        cmocka_unit_test(test_node_loss_setup_failure),
        cmocka_unit_test(test_performance),
        cmocka_unit_test(test_saved_slots),
        cmocka_unit_test(test_run_all_expect_fail),
        cmocka_unit_test(test_run_all_expect_error),
        cmocka_unit_test(test_run_all_no_expectations),
        cmocka_unit_test(test_run_all_unavailable_and_reference),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
