/* The calibration's arithmetic (sim/model/calibrate.h), on synthetic
 * timings only (nothing here is timed): the least-squares fit recovers the
 * alpha and beta that made the timings; a topology fitted to a ring
 * exchange makes the schedule evaluator's ring all-reduce last exactly its
 * 2 (p - 1) measured steps; the local copies and message sizes per
 * algorithm. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "model/calibrate.h"

static void assert_rel(double got, double want, double tol, const char *what)
{
    if (!(fabs(got - want) <= tol * fabs(want) + 1e-18))
        fail_msg("%s: got %.17g, want %.17g (relative tolerance %g)", what, got, want, tol);
}

static void test_fit_exact(void **state)
{
    (void)state;
    const double alpha = 7.5e-6, beta = 1.0 / 3.2e9;
    double x[] = {64, 4096, 65536, 1 << 20, 4 << 20}, t[5];
    for (int i = 0; i < 5; i++)
        t[i] = alpha + x[i] * beta;
    double a = 0, b = 0;
    assert_int_equal(dsim_calib_fit_ab(x, t, 5, &a, &b), DSIM_OK);
    assert_rel(a, alpha, 1e-9, "alpha");
    assert_rel(b, beta, 1e-9, "beta");
}

static void test_fit_noise(void **state)
{
    (void)state;
    /* +-4 % alternating: the relative weighting keeps the small sizes'
     * intercept from being swamped by the large sizes' absolute residuals */
    const double alpha = 20e-6, beta = 1.0 / 1.5e9;
    double x[8], t[8];
    for (int i = 0; i < 8; i++) {
        x[i] = 64.0 * pow(4.0, i);
        t[i] = (alpha + x[i] * beta) * (i % 2 ? 1.04 : 0.96);
    }
    double a = 0, b = 0;
    assert_int_equal(dsim_calib_fit_ab(x, t, 8, &a, &b), DSIM_OK);
    assert_rel(a, alpha, 0.10, "alpha from noisy timings");
    assert_rel(b, beta, 0.10, "beta from noisy timings");
}

static void test_fit_clamps_and_refuses(void **state)
{
    (void)state;
    /* times that would put the intercept below zero: alpha 0, beta refitted */
    double x[] = {1000, 2000, 4000}, t[] = {0.5e-6, 1.5e-6, 3.5e-6};
    double a = -1, b = -1;
    assert_int_equal(dsim_calib_fit_ab(x, t, 3, &a, &b), DSIM_OK);
    assert_true(a == 0);
    assert_true(b > 0);
    /* one size cannot give two unknowns; a time of 0 is not a measurement */
    double one[] = {64, 64}, t1[] = {1e-6, 2e-6};
    assert_int_equal(dsim_calib_fit_ab(one, t1, 2, &a, &b), DSIM_EINVAL);
    assert_non_null(strstr(dsim_errmsg(), "two sizes"));
    double t0[] = {0, 1e-6};
    assert_int_equal(dsim_calib_fit_ab(x, t0, 2, &a, &b), DSIM_EINVAL);
    assert_non_null(strstr(dsim_errmsg(), "point 0"));
}

static dsim_calib calib(int ranks, int cores, double alpha_x)
{
    dsim_calib c = {.engine = "threads",
                    .transport = "inproc",
                    .cores = cores,
                    .ranks = ranks,
                    .alpha_x_s = alpha_x};
    return c;
}

/* A ring all-reduce of p blocks of msg bytes is p - 1 combining steps and
 * p - 1 copying steps of one block per rank: the model fitted to the
 * exchanges must give back 2 (p - 1) of them, whatever the cores. */
static void test_topology_reproduces_exchange(void **state)
{
    (void)state;
    int shapes[][2] = {{4, 2}, {4, 4}, {8, 2}, {2, 16}};
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
        int p = shapes[k][0], cores = shapes[k][1];
        dsim_calib c = calib(p, cores, 9e-6);
        size_t msg = (size_t)1 << 18;
        double tx = 61e-6, tr = 83e-6, s = 0;
        dsim_topology t;
        dsim_calib_topology(&c, p, msg, tx, tr, &t);
        assert_int_equal(dsim_cost_allreduce(&t, DSIM_ALGO_RING, msg * (size_t)p, 4, &s, NULL),
                         DSIM_OK);
        char what[64];
        snprintf(what, sizeof what, "ring of %d ranks on %d cores", p, cores);
        assert_rel(s, (p - 1) * (tx + tr), 1e-9, what);
    }
}

/* reduce_to_one on 4 ranks and 2 cores: rank 0 combines three messages one
 * after the other, then three copies leave it at once and take turns on the
 * two cores (not on a link of rank 0's: on one machine there is none). */
static void test_reduce_to_one_takes_turns_on_cores(void **state)
{
    (void)state;
    dsim_calib c = calib(4, 2, 10e-6);
    double tx = 410e-6, tr = 610e-6, s = 0;
    double mv = (tx - 10e-6) * 2 / 4, rd = (tr - 10e-6) * 2 / 4;
    dsim_topology t;
    dsim_calib_topology(&c, 4, 1 << 20, tx, tr, &t);
    assert_int_equal(dsim_cost_allreduce(&t, DSIM_ALGO_REDUCE_TO_ONE, 1 << 20, 4, &s, NULL),
                     DSIM_OK);
    assert_rel(s, (10e-6 + 3 * rd) + (10e-6 + 3 * mv / 2), 1e-9, "reduce_to_one");
}

static void test_predict_adds_local_copies(void **state)
{
    (void)state;
    dsim_calib c = calib(4, 2, 9e-6);
    size_t bytes = (size_t)4 << 20;
    dsim_calib_row at = {.algo = DSIM_ALGO_RING,
                         .bytes = bytes,
                         .msg = bytes / 4,
                         .xranks = 4,
                         .step_copy_s = 300e-6,
                         .step_reduce_s = 500e-6,
                         .copy_Bps = 20e9};
    double s = 0;
    assert_int_equal(dsim_calib_predict_at(&c, DSIM_ALGO_RING, bytes, &at, &s), DSIM_OK);
    /* 3 (tx + tr), plus 3/4 of the buffer copied on each of 4 ranks over 2 cores */
    assert_rel(s, 3 * (300e-6 + 500e-6) + 3.0 * (double)bytes / (20e9 * 2), 1e-9, "ring");
    /* reduce_to_one's copy lies on rank 0's path alone */
    at.algo = DSIM_ALGO_REDUCE_TO_ONE;
    at.msg = bytes;
    at.xranks = 2;
    double s2 = 0, bare = 0;
    dsim_topology t;
    dsim_calib_topology(&c, at.xranks, at.msg, at.step_copy_s, at.step_reduce_s, &t);
    assert_int_equal(dsim_cost_allreduce(&t, DSIM_ALGO_REDUCE_TO_ONE, bytes, 4, &bare, NULL),
                     DSIM_OK);
    assert_int_equal(dsim_calib_predict_at(&c, DSIM_ALGO_REDUCE_TO_ONE, bytes, &at, &s2), DSIM_OK);
    assert_rel(s2, bare + (double)bytes / 20e9, 1e-9, "reduce_to_one");
    /* a row calibrated with pairs carries their own latency, which stands
     * for the calibration's ring latency (9 us here) in its prediction */
    at = (dsim_calib_row){.algo = DSIM_ALGO_RHD,
                          .bytes = bytes,
                          .msg = bytes / 2,
                          .xranks = 4,
                          .pairs = 1,
                          .step_copy_s = 300e-6,
                          .step_reduce_s = 500e-6,
                          .copy_Bps = 20e9};
    double own = 0, ring_alpha = 0, want = 0;
    assert_int_equal(dsim_calib_predict_at(&c, DSIM_ALGO_RHD, bytes, &at, &ring_alpha), DSIM_OK);
    dsim_calib c1 = calib(4, 2, 1e-6);
    assert_int_equal(dsim_calib_predict_at(&c1, DSIM_ALGO_RHD, bytes, &at, &want), DSIM_OK);
    at.alpha_s = 1e-6;
    assert_int_equal(dsim_calib_predict_at(&c, DSIM_ALGO_RHD, bytes, &at, &own), DSIM_OK);
    assert_rel(own, want, 1e-12, "the pairs' own latency");
    assert_true(fabs(own - ring_alpha) > 1e-7 * ring_alpha);
    assert_true(c.alpha_x_s == 9e-6); /* the calibration itself unchanged */
}

static void test_message_sizes_and_copies(void **state)
{
    (void)state;
    assert_int_equal(dsim_calib_msg_bytes(DSIM_ALGO_RING, 4, 16384), 4096);
    assert_int_equal(dsim_calib_msg_bytes(DSIM_ALGO_RING, 3, 16), 8); /* 4 floats: blocks of 2 */
    assert_int_equal(dsim_calib_msg_bytes(DSIM_ALGO_RHD, 4, 16384), 8192);
    assert_int_equal(dsim_calib_msg_bytes(DSIM_ALGO_TREE, 4, 16384), 16384);
    assert_int_equal(dsim_calib_msg_bytes(DSIM_ALGO_REDUCE_TO_ONE, 8, 4), 4);
    assert_int_equal(dsim_calib_xranks(DSIM_ALGO_RING, 8), 8);
    assert_int_equal(dsim_calib_xranks(DSIM_ALGO_RHD, 5), 5);
    assert_int_equal(dsim_calib_xranks(DSIM_ALGO_TREE, 8), 2);
    assert_int_equal(dsim_calib_xranks(DSIM_ALGO_REDUCE_TO_ONE, 4), 2);
    /* rhd and recursive doubling pair their ranks (over a power of two) */
    assert_int_equal(dsim_calib_xpairs(DSIM_ALGO_RHD, 4), 1);
    assert_int_equal(dsim_calib_xpairs(DSIM_ALGO_RECURSIVE_DOUBLING, 8), 1);
    assert_int_equal(dsim_calib_xpairs(DSIM_ALGO_RHD, 6), 0);
    assert_int_equal(dsim_calib_xpairs(DSIM_ALGO_RHD, 2), 0);
    assert_int_equal(dsim_calib_xpairs(DSIM_ALGO_RING, 4), 0);
    assert_int_equal(dsim_calib_xpairs(DSIM_ALGO_TREE, 4), 0);
    int serial = -1;
    assert_true(dsim_calib_local_copy(DSIM_ALGO_RING, 4, 100, &serial) == 300 && serial == 0);
    assert_true(dsim_calib_local_copy(DSIM_ALGO_RHD, 4, 100, &serial) == 200 && serial == 0);
    assert_true(dsim_calib_local_copy(DSIM_ALGO_RHD, 6, 100, &serial) == 400 && serial == 0);
    assert_true(dsim_calib_local_copy(DSIM_ALGO_TREE, 5, 100, &serial) == 300 && serial == 1);
    assert_true(dsim_calib_local_copy(DSIM_ALGO_REDUCE_TO_ONE, 4, 100, &serial) == 100 &&
                serial == 1);
    assert_true(dsim_calib_local_copy(DSIM_ALGO_RING, 1, 100, &serial) == 0);
    /* the rates' buffers: the collective's working set spread over the cores */
    assert_int_equal(dsim_calib_rate_bytes(4, 2, (size_t)1 << 20), (size_t)2 << 20);
    assert_int_equal(dsim_calib_rate_bytes(4, 2, 16), 4096);
    assert_int_equal(dsim_calib_rate_bytes(128, 1, (size_t)1 << 30), (size_t)256 << 20);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fit_exact),
        cmocka_unit_test(test_fit_noise),
        cmocka_unit_test(test_fit_clamps_and_refuses),
        cmocka_unit_test(test_topology_reproduces_exchange),
        cmocka_unit_test(test_reduce_to_one_takes_turns_on_cores),
        cmocka_unit_test(test_predict_adds_local_copies),
        cmocka_unit_test(test_message_sizes_and_copies),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
