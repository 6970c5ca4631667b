/* gradient_consistency on hand-made runs: it passes where it should, fails
 * where it should, and its message names the step, replica, variable or
 * parameter to look at, and the cause where one can be told. */
#include "fake_run.h"

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

/* Under an adaptive optimizer a part of the gradient scaled apart from the
 * rest hides in the variables: where the run and the reference still
 * stand at the same variables (a fresh run, replica 0 started from the
 * chief's initial values, no update before), the gradient's norm must be
 * one device's. */
static void test_gc_first_grad_hidden(void **state)
{
    (void)state;
    fake_run f;
    fake_init(&f, 2, 3);
    dsim_train_replica_end ends[2] = {{.created_checksum = 0xabc}, {.created_checksum = 0xabc}};
    double gn[6] = {0.87, 0.87, 1.0, 1.0, 1.0, 1.0}, gref[3] = {1.0, 1.0, 1.0};
    uint8_t sk[6] = {0}, skref[3] = {0};
    f.res.replicas = ends;
    f.res.initial_checksum = f.ref.initial_checksum = 0xabc;
    f.res.grad_norm = gn;
    f.ref.grad_norm = gref;
    f.res.mp_skipped = sk;
    f.ref.mp_skipped = skref;
    dsim_optim_spec_default(&f.cfg.optim, DSIM_OPTIM_ADAMAX);
    dsim_check_ctx ctx = fake_ctx(&f);
    double v[DSIM_CHECK_MAX_PARAMS];
    values_of(dsim_check_find("gradient_consistency"), v, NULL);
    dsim_check_result r = judge("gradient_consistency", &ctx, v);
    assert_false(r.passed);
    assert_true(fabs(r.measured - 0.13) < 1e-9);
    assert_has(r.message, "only because Adamax's update hardly depends on the gradient's size: "
                          "at global step 0, where the run and the reference stand at the same "
                          "variables, the gradient replica 0 applied has norm 0.87 and one "
                          "device's 1 (0.87 times it");
    /* a step both skipped (mixed precision) moves nothing: the first
     * update is judged */
    gn[0] = gref[0] = NAN;
    sk[0] = sk[1] = skref[0] = 1;
    gn[2] = 1.5;
    r = judge("gradient_consistency", &ctx, v);
    assert_false(r.passed);
    assert_has(r.message, "at global step 1, where the run and the reference stand");
    /* a zero gradient applied (a stale one, the first step's nothing) */
    gn[2] = 0.0;
    r = judge("gradient_consistency", &ctx, v);
    assert_false(r.passed);
    assert_has(r.message, "has norm 0 and one device's 1 (0 times it");
    /* within max_rel_error: rounding */
    gn[2] = 1.00001;
    assert_true(judge("gradient_consistency", &ctx, v).passed);
    gn[2] = 1.5;
    /* not said where the variables may differ already: another start, a
     * replica 0 that did not start from the chief's values, a restored run,
     * a first update one of the two skipped alone; nor under SGD, whose
     * variables show a wrong gradient */
    f.ref.initial_checksum = 0xabd;
    assert_true(judge("gradient_consistency", &ctx, v).passed);
    f.ref.initial_checksum = 0xabc;
    ends[0].created_checksum = 0xabd;
    assert_true(judge("gradient_consistency", &ctx, v).passed);
    ends[0].created_checksum = 0xabc;
    skref[0] = 0;
    assert_true(judge("gradient_consistency", &ctx, v).passed);
    skref[0] = 1;
    f.cfg.optim.kind = DSIM_OPTIM_SGD;
    assert_true(judge("gradient_consistency", &ctx, v).passed);
    f.cfg.optim.kind = DSIM_OPTIM_ADAMAX;
    assert_false(judge("gradient_consistency", &ctx, v).passed);
    f.res.first_step = f.ref.first_step = 4;
    assert_true(judge("gradient_consistency", &ctx, v).passed);
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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gc_pass),
        cmocka_unit_test(test_gc_loss),
        cmocka_unit_test(test_gc_diagnosis),
        cmocka_unit_test(test_gc_non_finite_fails),
        cmocka_unit_test(test_gc_divergence_names_step_and_replica),
        cmocka_unit_test(test_gc_reference_mismatch),
        cmocka_unit_test(test_gc_abs_floor_near_zero),
        cmocka_unit_test(test_gc_untraced),
        cmocka_unit_test(test_gc_first_grad_hidden),
        cmocka_unit_test(test_gc_bad_runs),
        cmocka_unit_test(test_gc_async_ps),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
