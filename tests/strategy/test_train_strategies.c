/* Every built-in strategy trains the softmax model on the threads engine
 * with 1, 2, 4 and 8 replicas; synchronous strategies keep bit-identical
 * replicas after every step and stay within the derived tolerance of the
 * single-device reference (strat_common.c); the asynchronous parameter
 * server converges and records staleness; a plugin that MEAN-reduces is
 * caught, the worked example passes. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <cmocka.h>

#include "dsim/spi/strategy.h"
#include "dsim/strategy.h"
#include "strat_common.h"

/* The precondition of the tolerance's derivation: lr * max|x~|^2 / 2 <= 2. */
static void check_tolerance_precondition(const dsim_train_cfg *cfg)
{
    const dsim_dataset *ds = cfg->dataset;
    double m = 0;
    for (size_t e = 0; e < ds->spec.n_examples; e++) {
        double s = 1.0;
        for (size_t i = 0; i < ds->spec.in_dim; i++)
            s += (double)ds->x[e * ds->spec.in_dim + i] * ds->x[e * ds->spec.in_dim + i];
        m = fmax(m, s);
    }
    assert_true(cfg->optim.lr * m / 2 <= 2.0);
}

/* Runs cfg and its reference; checks what every synchronous strategy owes:
 * every replica identical after every step (observer and result), within
 * the tolerance of the reference at every step, loss reduced and falling.
 * Returns the worst |run - ref| / tolerance. */
static double run_sync(dsim_train_cfg *cfg, const char *what)
{
    check_tolerance_precondition(cfg);
    dsim_train_result ref, run;
    assert_int_equal(dsim_train_reference(cfg, &ref), DSIM_OK);
    int N = cfg->hosts * cfg->devices_per_host;
    sc_observer obs;
    sc_observer_init(&obs, N, ref.steps);
    cfg->observer = sc_observe;
    cfg->observer_user = &obs;
    dsim_err e = dsim_train(cfg, &run);
    if (e != DSIM_OK)
        fail_msg("%s: %s", what, dsim_errmsg());
    assert_int_equal(run.num_replicas, N);
    assert_int_equal(run.steps, ref.steps);
    assert_int_equal(atomic_load(&obs.calls), (int)(ref.steps * (uint64_t)N));
    assert_int_equal(atomic_load(&obs.bad), 0);
    assert_true(sc_observer_in_sync(&obs));
    assert_true(run.in_sync_every_step);
    assert_true(run.replicas_agree);
    assert_int_equal(run.num_replicas_in_sync, N);
    /* every step's variable signatures kept, the same on every replica */
    size_t nv = run.n_vars;
    assert_true(nv >= 2);
    assert_int_equal(run.vars[nv - 1].off + run.vars[nv - 1].len, run.n_params);
    for (size_t k = 0; k < run.steps * (size_t)N; k++) {
        const uint16_t *row = run.var_sig + k * DSIM_MODEL_MAX_VARS;
        const uint16_t *r0 = run.var_sig + k / (size_t)N * (size_t)N * DSIM_MODEL_MAX_VARS;
        for (size_t v = 0; v < DSIM_MODEL_MAX_VARS; v++) {
            assert_true(v < nv ? row[v] != 0 : row[v] == 0);
            assert_int_equal(row[v], r0[v]);
        }
    }
    assert_true(run.loss_scale == 1.0f / (float)cfg->global_batch);
    /* The reduced loss is the global batch's mean loss, as the reference's. */
    for (uint64_t s = 0; s < run.steps; s++) {
        assert_false(isnan(run.loss[s]));
        assert_true(fabs(run.loss[s] - ref.loss[s]) <= 1e-4 * fmax(1.0, fabs(ref.loss[s])));
    }
    double ratio, abs_diff;
    sc_distance(cfg, &ref, &run, &ratio, &abs_diff);
    double tol = sc_tolerance(cfg, &ref, &run, run.steps, N);
    printf("# %-48s replicas %d: max |run-ref| %.3g (tolerance %.3g, ratio %.3g), loss %.4f -> "
           "%.4f\n",
           what, N, abs_diff, tol, ratio, run.initial_loss, run.final_loss);
    assert_true(ratio <= 1.0);
    assert_true(run.final_loss < run.initial_loss);
    sc_observer_free(&obs);
    dsim_train_result_free(&ref);
    dsim_train_result_free(&run);
    cfg->observer = NULL;
    cfg->observer_user = NULL;
    return ratio;
}

static void test_one_device(void **state)
{
    (void)state;
    dsim_train_cfg cfg;
    sc_cfg(&cfg, "one_device", 1, 1);
    run_sync(&cfg, "one_device 1x1");
    /* One replica sums exactly what the reference sums: the same bits. */
    dsim_train_result ref, run;
    assert_int_equal(dsim_train_reference(&cfg, &ref), DSIM_OK);
    assert_int_equal(dsim_train(&cfg, &run), DSIM_OK);
    dsim_params_diff d;
    dsim_params_compare(run.params, ref.params, ref.n_params, &d);
    assert_int_equal(d.n_diff, 0);
    assert_int_equal(run.placement, DSIM_PLACE_ONE_DEVICE);
    dsim_train_result_free(&ref);
    dsim_train_result_free(&run);
}

static void test_mirrored(void **state)
{
    (void)state;
    static const struct {
        int devices;
        dsim_algo algo;
    } cases[] = {
        {1, DSIM_ALGO_AUTO},
        {2, DSIM_ALGO_REDUCE_TO_ONE},
        {4, DSIM_ALGO_RING},
        {8, DSIM_ALGO_AUTO},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        dsim_train_cfg cfg;
        sc_cfg(&cfg, "mirrored", 1, cases[i].devices);
        cfg.communication = cases[i].algo;
        char what[96];
        snprintf(what, sizeof what, "mirrored 1x%d (%s)", cases[i].devices,
                 dsim_algo_name(cases[i].algo));
        run_sync(&cfg, what);
    }
}

static void test_multi_worker_mirrored(void **state)
{
    (void)state;
    static const struct {
        int hosts, devices;
        dsim_algo algo;
    } cases[] = {
        {1, 1, DSIM_ALGO_AUTO}, {2, 1, DSIM_ALGO_RHD}, {2, 2, DSIM_ALGO_TREE},
        {4, 2, DSIM_ALGO_RING}, {4, 2, DSIM_ALGO_RHD}, {4, 2, DSIM_ALGO_REDUCE_TO_ONE},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        dsim_train_cfg cfg;
        sc_cfg(&cfg, "multi_worker_mirrored", cases[i].hosts, cases[i].devices);
        cfg.communication = cases[i].algo;
        char what[96];
        snprintf(what, sizeof what, "multi_worker_mirrored %dx%d (%s)", cases[i].hosts,
                 cases[i].devices, dsim_algo_name(cases[i].algo));
        run_sync(&cfg, what);
    }
}

static void test_central_storage(void **state)
{
    (void)state;
    for (int d = 1; d <= 8; d *= 2) {
        dsim_train_cfg cfg;
        sc_cfg(&cfg, "central_storage", 1, d);
        char what[96];
        snprintf(what, sizeof what, "central_storage 1x%d", d);
        run_sync(&cfg, what);
    }
}

static void test_parameter_server_sync(void **state)
{
    (void)state;
    static const struct {
        int workers, ps;
    } cases[] = {{1, 1}, {2, 2}, {4, 1}, {8, 2}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        dsim_train_cfg cfg;
        sc_cfg(&cfg, "parameter_server", cases[i].workers, 1);
        cfg.num_ps = cases[i].ps;
        cfg.ps_mode = DSIM_PS_SYNC;
        char what[96];
        snprintf(what, sizeof what, "parameter_server sync %d workers, %d ps", cases[i].workers,
                 cases[i].ps);
        run_sync(&cfg, what);
        /* Every replica's contribution is recorded, none stale. */
        dsim_train_result run;
        assert_int_equal(dsim_train(&cfg, &run), DSIM_OK);
        assert_int_equal(run.n_updates, run.steps * (uint64_t)cases[i].workers * cases[i].ps);
        assert_int_equal(run.max_staleness, 0);
        assert_int_equal(run.placement, DSIM_PLACE_SHARDED);
        dsim_train_result_free(&run);
    }
}

/* Two devices per worker: replicas of one worker are separate clients. */
static void test_parameter_server_sync_devices(void **state)
{
    (void)state;
    dsim_train_cfg cfg;
    sc_cfg(&cfg, "parameter_server", 2, 2);
    cfg.num_ps = 2;
    run_sync(&cfg, "parameter_server sync 2x2, 2 ps");
}

static void test_parameter_server_async(void **state)
{
    (void)state;
    static const struct {
        int workers, ps;
    } cases[] = {{1, 1}, {2, 1}, {4, 2}, {8, 2}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int N = cases[i].workers, P = cases[i].ps;
        dsim_train_cfg cfg;
        sc_cfg(&cfg, "parameter_server", N, 1);
        cfg.num_ps = P;
        cfg.ps_mode = DSIM_PS_ASYNC;
        cfg.epochs = 3;
        dsim_train_result run;
        if (dsim_train(&cfg, &run) != DSIM_OK)
            fail_msg("async %d workers: %s", N, dsim_errmsg());
        /* TF's PS training: each update stands alone, averaged over the
         * replica's own share of the global batch. */
        assert_int_equal(run.num_replicas_in_sync, 1);
        assert_true(fabsf(run.loss_scale - (float)N / 32.0f) < 1e-6f);
        for (uint64_t s = 0; s < run.steps; s++)
            assert_true(isnan(run.loss[s])); /* async replicas do not reduce */
        /* Converges: well below the starting loss. */
        assert_true(run.final_loss < 0.75 * run.initial_loss);
        /* Every push was applied once: each server's versions 0..U-1. */
        uint64_t per_server = run.steps * (uint64_t)N;
        assert_int_equal(run.n_updates, per_server * (uint64_t)P);
        for (int s = 0; s < P; s++) {
            uint8_t *seen = calloc(per_server, 1);
            assert_non_null(seen);
            for (size_t u = 0; u < run.n_updates; u++) {
                const dsim_ps_update *up = &run.updates[u];
                if (up->server != s)
                    continue;
                assert_true(up->version_applied < per_server);
                assert_false(seen[up->version_applied]);
                seen[up->version_applied] = 1;
                assert_true(up->version_read <= up->version_applied);
                assert_int_equal(up->staleness, up->version_applied - up->version_read);
            }
            free(seen);
        }
        uint64_t stale = 0;
        for (size_t u = 0; u < run.n_updates; u++)
            stale += run.updates[u].staleness > 0;
        printf("# parameter_server async %d workers, %d ps: loss %.4f -> %.4f, %zu updates, %llu "
               "stale, max staleness %llu\n",
               N, P, run.initial_loss, run.final_loss, run.n_updates, (unsigned long long)stale,
               (unsigned long long)run.max_staleness);
        if (N == 1)
            assert_int_equal(run.max_staleness, 0); /* nobody else to race with */
        if (N >= 4)
            assert_true(run.max_staleness > 0);
        /* After the last push every replica pulled the same final values. */
        assert_true(run.replicas_agree);
        dsim_train_result_free(&run);
    }
}

/* Asynchronous replicas may end far apart: a straggler whose every step is
 * well inside the timeout must not fail the job because the replicas that
 * finished first wait for it longer than the timeout. Replica 1 sleeps 50 ms
 * per step and ends 800 ms after replica 0; the timeout is 400 ms. */
static void straggle(const dsim_train_step_info *info, void *user)
{
    (void)user;
    if (info->replica == 1) {
        struct timespec ts = {.tv_sec = 0, .tv_nsec = 50 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
}

static void test_parameter_server_async_straggler(void **state)
{
    (void)state;
    dsim_train_cfg cfg;
    sc_cfg(&cfg, "parameter_server", 2, 1);
    cfg.num_ps = 2;
    cfg.ps_mode = DSIM_PS_ASYNC;
    cfg.timeout_ns = 400LL * 1000 * 1000;
    cfg.observer = straggle;
    dsim_train_result run;
    if (dsim_train(&cfg, &run) != DSIM_OK)
        fail_msg("async with a straggler: %s", dsim_errmsg());
    assert_int_equal(run.steps, 16);
    /* Every push applied once, and every replica ends with the final values. */
    assert_int_equal(run.n_updates, 16 * 2 * 2);
    assert_true(run.replicas_agree);
    dsim_train_result_free(&run);
}

/* Partial and empty batches: TF's G=7 over 2x2, fewer examples than
 * replicas (G=6 over 8 devices: two idle every step), and a global batch
 * larger than the dataset. The scale stays 1/G throughout. */
static void test_partial_batches(void **state)
{
    (void)state;
    static const struct {
        const char *strategy;
        int hosts, devices;
        int64_t g;
        dsim_shard_policy policy;
    } cases[] = {
        {"multi_worker_mirrored", 2, 2, 7, DSIM_SHARD_FILE},
        {"multi_worker_mirrored", 2, 2, 7, DSIM_SHARD_DATA},
        {"mirrored", 1, 8, 6, DSIM_SHARD_AUTO},
        {"central_storage", 1, 4, 1000, DSIM_SHARD_AUTO},
        {"parameter_server", 2, 2, 30, DSIM_SHARD_OFF},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        dsim_train_cfg cfg;
        sc_cfg(&cfg, cases[i].strategy, cases[i].hosts, cases[i].devices);
        cfg.global_batch = cases[i].g;
        cfg.shard = cases[i].policy;
        cfg.num_ps = strcmp(cases[i].strategy, "parameter_server") == 0 ? 1 : 0;
        cfg.epochs = cases[i].g > 100 ? 8 : 1;
        char what[96];
        snprintf(what, sizeof what, "%s %dx%d G=%lld %s", cases[i].strategy, cases[i].hosts,
                 cases[i].devices, (long long)cases[i].g, dsim_shard_policy_name(cases[i].policy));
        run_sync(&cfg, what);
    }
}

/* Same configuration, same bits: run twice. */
static void test_deterministic(void **state)
{
    (void)state;
    static const char *const names[] = {"mirrored", "central_storage", "parameter_server"};
    for (size_t i = 0; i < 3; i++) {
        dsim_train_cfg cfg;
        sc_cfg(&cfg, names[i], i == 2 ? 4 : 1, i == 2 ? 1 : 4);
        cfg.num_ps = i == 2 ? 2 : 0;
        dsim_train_result a, b;
        assert_int_equal(dsim_train(&cfg, &a), DSIM_OK);
        assert_int_equal(dsim_train(&cfg, &b), DSIM_OK);
        assert_memory_equal(a.params, b.params, a.n_params * sizeof(float));
        assert_memory_equal(a.checksum, b.checksum, a.steps * 4 * sizeof(uint64_t));
        dsim_train_result_free(&a);
        dsim_train_result_free(&b);
    }
}

/* The worked example passes the same checks as the built-ins. */
static void test_example_plugin(void **state)
{
    (void)state;
    const char *path = sc_plugin("DSIM_CUSTOM_PLUGIN");
    if (!path)
        skip();
    dsim_train_cfg cfg;
    sc_cfg(&cfg, "custom_mirrored", 2, 2);
    cfg.plugin_path = path;
    run_sync(&cfg, "custom_mirrored (plugin) 2x2");
    cfg.plugin_path = NULL; /* registered now: the name alone is enough */
    cfg.hosts = 1;
    cfg.devices_per_host = 8;
    run_sync(&cfg, "custom_mirrored (plugin) 1x8");
    assert_true(dsim_strategy_exists("custom_mirrored"));
    assert_non_null(dsim_strategy_summary("custom_mirrored"));
}

/* The MEAN-reducing plugin keeps its replicas in sync (so that check alone
 * would pass it) but lands far outside the tolerance of the reference. */
static void test_wrong_plugin_caught(void **state)
{
    (void)state;
    const char *path = sc_plugin("DSIM_WRONG_PLUGIN");
    if (!path)
        skip();
    static const struct {
        int hosts, devices;
    } cases[] = {{1, 2}, {2, 2}, {4, 2}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        dsim_train_cfg cfg;
        sc_cfg(&cfg, "wrong_mean", cases[i].hosts, cases[i].devices);
        cfg.plugin_path = path;
        dsim_train_result ref, run;
        assert_int_equal(dsim_train_reference(&cfg, &ref), DSIM_OK);
        if (dsim_train(&cfg, &run) != DSIM_OK)
            fail_msg("wrong_mean: %s", dsim_errmsg());
        assert_true(run.in_sync_every_step);
        double ratio, abs_diff;
        sc_distance(&cfg, &ref, &run, &ratio, &abs_diff);
        double tol = sc_tolerance(&cfg, &ref, &run, run.steps, run.num_replicas);
        dsim_params_diff d;
        dsim_params_compare(run.params, ref.params, ref.n_params, &d);
        printf("# wrong_mean %dx%d: final max |run-ref| %.3g vs tolerance %.3g (%.0fx)\n",
               cases[i].hosts, cases[i].devices, d.max_abs, tol, d.max_abs / tol);
        assert_true(d.max_abs > 100.0 * tol);
        assert_true(ratio > 100.0);
        dsim_train_result_free(&ref);
        dsim_train_result_free(&run);
    }
}

/* Under adam the run keeps replica 0's gradient at each span's first step
 * (record_grads), and the replay that follows it compares one device's
 * gradient there: a right run within rounding, a row changed by 1e-3 of
 * it named by its row alone; bad calls refused with res zeroed. */
static void test_follow_run_grads(void **state)
{
    (void)state;
    for (uint32_t every = 1; every <= 3; every += 2) {
        dsim_train_cfg cfg;
        sc_cfg(&cfg, "multi_worker_mirrored", 2, 2);
        dsim_optim_spec_default(&cfg.optim, DSIM_OPTIM_ADAM);
        cfg.optim.lr = 0.01;
        cfg.trace_every = every;
        cfg.record_grads = true;
        dsim_train_result run, f;
        if (dsim_train(&cfg, &run) != DSIM_OK)
            fail_msg("adam run: %s", dsim_errmsg());
        size_t P = run.n_params;
        assert_non_null(run.trace_grad);
        assert_int_equal(run.trace_grad_rows, (run.steps + every - 1) / every);
        assert_int_equal(run.trace_rows, run.steps / every);
        for (size_t k = 0; k < run.trace_grad_rows * P; k++)
            assert_true(isfinite(run.trace_grad[k]));
        /* kept in spans: adam's slots before each span's first update too,
         * zero before the first, the running moments after (v >= 0) */
        if (every == 1) {
            assert_null(run.trace_slots);
        } else {
            assert_non_null(run.trace_slots);
            double m1 = 0;
            for (size_t k = 0; k < 2 * P; k++) {
                assert_true(run.trace_slots[k] == 0.0f);
                assert_true(run.trace_slots[2 * P + P + k / 2] >= 0.0f);
                m1 += fabs((double)run.trace_slots[2 * P + k / 2]);
            }
            assert_true(m1 > 0);
        }
        dsim_train_cfg fc = cfg;
        fc.record_params = false; /* the check's replay keeps no trace of its own */
        assert_int_equal(dsim_train_reference_follow_run(&fc, &run, &f), DSIM_OK);
        assert_non_null(f.follow_grad_dist);
        assert_non_null(f.follow_dist);
        assert_null(f.trace);
        double worst = 0;
        for (uint64_t j = 0; j < run.trace_grad_rows; j++) {
            assert_true(f.follow_grad_norm[j] > 0);
            /* the step before's gradient: only with every step kept, from
             * row 1, and a right run's is not it */
            if (every == 1 && j > 0)
                assert_true(f.follow_grad_prev[j] > 1e-3 * f.follow_grad_norm[j]);
            else
                assert_true(isnan(f.follow_grad_prev[j]));
            worst = fmax(worst, (f.follow_grad_dist[j] - 2 * f.follow_grad_ulps[j]) /
                                    f.follow_grad_norm[j]);
        }
        printf("# adam follow, trace every %u: %llu gradients compared, worst %.3g\n", every,
               (unsigned long long)run.trace_grad_rows, worst);
        assert_true(worst <= 1e-6);
        /* each span replayed from the run's variables and slots: its end
         * the run's, to rounding */
        for (uint64_t j = 0; every > 1 && j < run.trace_rows; j++)
            assert_true(f.follow_dist[j] - 2 * f.follow_ulps[j] <= 1e-6 * f.follow_path[j]);
        assert_null(f.follow_part);
        dsim_train_result_free(&f);
        /* the second replay (follow_parting): its span ends within
         * rounding of the first's, measured for every span */
        fc.follow_parting = true;
        assert_int_equal(dsim_train_reference_follow_run(&fc, &run, &f), DSIM_OK);
        assert_non_null(f.follow_part);
        for (uint64_t j = 0; j < run.trace_rows; j++)
            assert_true(isfinite(f.follow_part[j]) && f.follow_part[j] <= 1e-3 * f.follow_path[j]);
        dsim_train_result_free(&f);
        /* one row off by 1e-3 of itself: that row alone */
        for (size_t k = 0; k < P; k++)
            run.trace_grad[P + k] *= 1.001f;
        /* and three elements of the next doubled: those three, by 1 % */
        for (size_t k = 3; k <= 5; k++)
            run.trace_grad[2 * P + k] = 2.0f * run.trace_grad[2 * P + k] + 1.0f;
        assert_int_equal(dsim_train_reference_follow_run(&cfg, &run, &f), DSIM_OK);
        for (uint64_t j = 0; j < run.trace_grad_rows; j++) {
            double rel =
                (f.follow_grad_dist[j] - 2 * f.follow_grad_ulps[j]) / f.follow_grad_norm[j];
            if (j == 1)
                assert_true(rel > 5e-4 && rel < 2e-3);
            else if (j != 2)
                assert_true(rel <= 1e-6);
            assert_int_equal(f.follow_grad_off[j], j == 2 ? 3 : 0);
        }
        assert_int_equal(f.follow_grad_lo[2], 3);
        assert_int_equal(f.follow_grad_hi[2], 5);
        double whole1 = f.follow_grad_norm[1];
        dsim_train_result_free(&f);
        /* a row the run did not fill (NaN: no update given a gradient) is
         * not compared; one that holds parts (the replicas' optimizers of
         * parts, dsim_optim_set_part) is compared over those, against one
         * device's norm there: row 1 keeps its error in its second half,
         * row 2's doubled elements fall in its first */
        for (size_t k = 0; k < P; k++)
            run.trace_grad[k] = NAN;
        for (size_t k = 0; k < P / 2; k++)
            run.trace_grad[P + k] = run.trace_grad[2 * P + k] = NAN;
        assert_int_equal(dsim_train_reference_follow_run(&cfg, &run, &f), DSIM_OK);
        assert_true(isnan(f.follow_grad_dist[0]));
        assert_true(f.follow_grad_norm[1] > 0 && f.follow_grad_norm[1] < whole1);
        double rel1 = (f.follow_grad_dist[1] - 2 * f.follow_grad_ulps[1]) / f.follow_grad_norm[1];
        assert_true(rel1 > 5e-4 && rel1 < 2e-3);
        assert_int_equal(f.follow_grad_off[2], 0);
        assert_true(f.follow_grad_dist[2] - 2 * f.follow_grad_ulps[2] <=
                    1e-6 * f.follow_grad_norm[2]);
        dsim_train_result_free(&f);
        /* another trace_every than the run's, and no run: refused */
        cfg.trace_every = every + 1;
        assert_int_equal(dsim_train_reference_follow_run(&cfg, &run, &f), DSIM_EINVAL);
        assert_null(f.follow_dist);
        assert_non_null(strstr(f.error.msg, "trace_every"));
        dsim_train_result_free(&f);
        assert_int_equal(dsim_train_reference_follow_run(&cfg, NULL, &f), DSIM_EINVAL);
        assert_null(f.follow_dist);
        dsim_train_result_free(&f);
        dsim_train_result_free(&run);
    }
}

int main(void)
{
    if (!sc_dataset()) {
        fprintf(stderr, "cannot make the dataset: %s\n", dsim_errmsg());
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_one_device),
        cmocka_unit_test(test_mirrored),
        cmocka_unit_test(test_multi_worker_mirrored),
        cmocka_unit_test(test_central_storage),
        cmocka_unit_test(test_parameter_server_sync),
        cmocka_unit_test(test_parameter_server_sync_devices),
        cmocka_unit_test(test_parameter_server_async),
        cmocka_unit_test(test_parameter_server_async_straggler),
        cmocka_unit_test(test_partial_batches),
        cmocka_unit_test(test_deterministic),
        cmocka_unit_test(test_example_plugin),
        cmocka_unit_test(test_wrong_plugin_caught),
        cmocka_unit_test(test_follow_run_grads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
