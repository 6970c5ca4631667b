/* The calibration's arithmetic (sim/model/calibrate.h), on synthetic
 * timings only (nothing here is timed): the least-squares fit recovers the
 * alpha and beta that made the timings; the patterns the algorithms' rows
 * are replayed in (who sends to whom in each step); a topology fitted to a
 * replay makes the schedule evaluator's all-reduce last what the replay's
 * steps say; the local copies and message sizes per algorithm. */
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

/* The transfers of step k of pt, as "s>d s>d ..." */
static void step_str(const dsim_cost_pattern *pt, int k, char *out, size_t cap)
{
    size_t n = 0;
    out[0] = 0;
    for (int i = pt->off[k]; i < pt->off[k + 1] && n < cap; i++)
        n += (size_t)snprintf(out + n, cap - n, "%s%d>%d", n ? " " : "", pt->src[i], pt->dst[i]);
}

static void test_patterns(void **state)
{
    (void)state;
    dsim_cost_pattern pt;
    char st[128];
    /* tree over 4: binomial reduce toward 0, then the broadcast back */
    assert_int_equal(dsim_cost_pattern_of(DSIM_ALGO_TREE, 4, &pt), DSIM_OK);
    assert_int_equal(pt.steps, 4);
    const char *tree[] = {"1>0 3>2", "2>0", "0>2", "0>1 2>3"};
    for (int k = 0; k < 4; k++) {
        step_str(&pt, k, st, sizeof st);
        assert_string_equal(st, tree[k]);
    }
    double kc = 0, kr = 0;
    dsim_calib_pattern_turns(&pt, 2, &kc, &kr);
    assert_true(kc == 4 && kr == 4); /* at most two transfers a step, on 2 cores */
    dsim_cost_pattern_free(&pt);
    assert_null(pt.off);
    /* ring over 5: 2 x 4 steps, every rank to its right */
    assert_int_equal(dsim_cost_pattern_of(DSIM_ALGO_RING, 5, &pt), DSIM_OK);
    assert_int_equal(pt.steps, 8);
    for (int k = 0; k < 8; k++) {
        assert_int_equal(pt.off[k + 1] - pt.off[k], 5);
        for (int i = pt.off[k]; i < pt.off[k + 1]; i++)
            assert_int_equal(pt.dst[i], (pt.src[i] + 1) % 5);
    }
    dsim_calib_pattern_turns(&pt, 2, &kc, &kr);
    assert_true(kc == 8 * 2.5 && kr == 8 * 2.5);
    dsim_cost_pattern_free(&pt);
    /* rhd over 4: partners at distance 2, then 1, then back */
    assert_int_equal(dsim_cost_pattern_of(DSIM_ALGO_RHD, 4, &pt), DSIM_OK);
    assert_int_equal(pt.steps, 4);
    int dist[] = {2, 1, 1, 2};
    for (int k = 0; k < 4; k++) {
        assert_int_equal(pt.off[k + 1] - pt.off[k], 4);
        for (int i = pt.off[k]; i < pt.off[k + 1]; i++)
            assert_int_equal(pt.dst[i], pt.src[i] ^ dist[k]);
    }
    dsim_cost_pattern_free(&pt);
    /* reduce_to_one over 4: rank 0 receives three at once, then sends three */
    assert_int_equal(dsim_cost_pattern_of(DSIM_ALGO_REDUCE_TO_ONE, 4, &pt), DSIM_OK);
    assert_int_equal(pt.steps, 2);
    step_str(&pt, 0, st, sizeof st);
    assert_string_equal(st, "1>0 2>0 3>0");
    step_str(&pt, 1, st, sizeof st);
    assert_string_equal(st, "0>1 0>2 0>3");
    dsim_calib_pattern_turns(&pt, 2, &kc, &kr);
    assert_true(kc == 1.5 + 1.5 && kr == 3 + 1.5); /* rank 0 combines three in turn */
    dsim_cost_pattern_free(&pt);
    /* AUTO is no algorithm; one rank has no steps */
    assert_int_equal(dsim_cost_pattern_of(DSIM_ALGO_AUTO, 4, &pt), DSIM_EINVAL);
    assert_non_null(strstr(dsim_errmsg(), "ranks"));
    assert_int_equal(dsim_cost_pattern_of(DSIM_ALGO_RING, 1, &pt), DSIM_EINVAL);
    assert_null(pt.off);
}

/* A ring all-reduce of p blocks of msg bytes is p - 1 combining steps and
 * p - 1 copying steps of one block per rank: the model fitted to replays of
 * the ring's 2 (p - 1) steps (all copying, all combining) must give back
 * half of each, whatever the cores. */
static void test_fit_reproduces_replay(void **state)
{
    (void)state;
    int shapes[][2] = {{4, 2}, {4, 4}, {8, 2}, {2, 16}};
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
        int p = shapes[k][0], cores = shapes[k][1];
        dsim_calib c = calib(p, cores, 9e-6);
        dsim_cost_pattern pt;
        assert_int_equal(dsim_cost_pattern_of(DSIM_ALGO_RING, p, &pt), DSIM_OK);
        size_t msg = (size_t)1 << 18;
        double alpha = 4e-6, tx = 2 * (p - 1) * 61e-6, tr = 2 * (p - 1) * 83e-6, mv, rd, s = 0;
        dsim_calib_fit_pattern(&pt, cores, alpha, tx, tr, &mv, &rd);
        dsim_topology t;
        dsim_calib_topology(&c, alpha, msg, mv, rd, &t);
        assert_int_equal(dsim_cost_allreduce(&t, DSIM_ALGO_RING, msg * (size_t)p, 4, &s, NULL),
                         DSIM_OK);
        char what[64];
        snprintf(what, sizeof what, "ring of %d ranks on %d cores", p, cores);
        assert_rel(s, (tx + tr) / 2, 1e-9, what);
        dsim_cost_pattern_free(&pt);
    }
}

/* reduce_to_one on 4 ranks and 2 cores: rank 0 combines three messages one
 * after the other, then three copies leave it at once and take turns on the
 * two cores (not on a link of rank 0's: on one machine there is none). */
static void test_reduce_to_one_takes_turns_on_cores(void **state)
{
    (void)state;
    dsim_calib c = calib(4, 2, 10e-6);
    dsim_cost_pattern pt;
    assert_int_equal(dsim_cost_pattern_of(DSIM_ALGO_REDUCE_TO_ONE, 4, &pt), DSIM_OK);
    double a = 5e-6, tx = 900e-6, tr = 1400e-6, mv, rd, s = 0;
    dsim_calib_fit_pattern(&pt, 2, a, tx, tr, &mv, &rd);
    assert_rel(mv, (tx - 2 * a) / 3, 1e-12, "one transfer's copy");
    assert_rel(rd, (tr - 2 * a) / 4.5, 1e-12, "one transfer's combine");
    dsim_topology t;
    dsim_calib_topology(&c, a, 1 << 20, mv, rd, &t);
    assert_int_equal(dsim_cost_allreduce(&t, DSIM_ALGO_REDUCE_TO_ONE, 1 << 20, 4, &s, NULL),
                     DSIM_OK);
    assert_rel(s, (a + 3 * rd) + (a + 3 * mv / 2), 1e-9, "reduce_to_one");
    /* a replay within its latency (noise) still gives positive rates */
    dsim_calib_fit_pattern(&pt, 2, a, 1e-6, 2e-6, &mv, &rd);
    assert_true(mv > 0 && rd > 0);
    dsim_cost_pattern_free(&pt);
}

static void test_predict_adds_local_copies(void **state)
{
    (void)state;
    dsim_calib c = calib(4, 2, 9e-6);
    size_t bytes = (size_t)4 << 20;
    double mv = 150e-6, rd = 250e-6, a = 3e-6;
    dsim_calib_row at = {.algo = DSIM_ALGO_RING,
                         .bytes = bytes,
                         .msg = bytes / 4,
                         .alpha_s = a,
                         .move_s = mv,
                         .red_s = rd,
                         .copy_Bps = 20e9};
    double s = 0;
    assert_int_equal(dsim_calib_predict_at(&c, DSIM_ALGO_RING, bytes, &at, &s), DSIM_OK);
    /* 3 steps of 4 combines and 3 of 4 copies on 2 cores, plus 3/4 of the
     * buffer copied on each of 4 ranks over 2 cores */
    assert_rel(s, 3 * (a + 2 * rd) + 3 * (a + 2 * mv) + 3.0 * (double)bytes / (20e9 * 2), 1e-9,
               "ring");
    /* a row with no latency of its own takes the calibration's ring one */
    double s9 = 0, own9 = 0;
    at.alpha_s = 0;
    assert_int_equal(dsim_calib_predict_at(&c, DSIM_ALGO_RING, bytes, &at, &s9), DSIM_OK);
    at.alpha_s = 9e-6;
    assert_int_equal(dsim_calib_predict_at(&c, DSIM_ALGO_RING, bytes, &at, &own9), DSIM_OK);
    assert_rel(s9, own9, 1e-12, "the ring's latency");
    assert_rel(s9 - s, 6 * (9e-6 - a), 1e-6, "six steps' latency");
    /* what a call costs beyond its steps is added once, whatever the size */
    double call = 0;
    at.alpha_s = a;
    at.call_s = 4e-6;
    assert_int_equal(dsim_calib_predict_at(&c, DSIM_ALGO_RING, bytes, &at, &call), DSIM_OK);
    assert_rel(call - s, 4e-6, 1e-6, "the call's own cost");
    /* never below the call measured at 64 B */
    at.call_s = 0;
    at.call_measured_s = 2 * s;
    assert_int_equal(dsim_calib_predict_at(&c, DSIM_ALGO_RING, bytes, &at, &call), DSIM_OK);
    assert_rel(call, 2 * s, 1e-12, "the call measured at 64 B");
    /* a few elements: the call measured at that size, whatever the rates */
    assert_int_equal(dsim_calib_predict_at(&c, DSIM_ALGO_RING, 8, &at, &call), DSIM_OK);
    assert_rel(call, 2 * s, 1e-12, "an 8-byte row");
    at.call_measured_s = 0;
    /* reduce_to_one's copy lies on rank 0's path alone */
    at = (dsim_calib_row){.algo = DSIM_ALGO_REDUCE_TO_ONE,
                          .bytes = bytes,
                          .msg = bytes,
                          .alpha_s = a,
                          .move_s = mv,
                          .red_s = rd,
                          .copy_Bps = 20e9};
    double s2 = 0, bare = 0;
    dsim_topology t;
    dsim_calib_topology(&c, a, at.msg, mv, rd, &t);
    assert_int_equal(dsim_cost_allreduce(&t, DSIM_ALGO_REDUCE_TO_ONE, bytes, 4, &bare, NULL),
                     DSIM_OK);
    assert_int_equal(dsim_calib_predict_at(&c, DSIM_ALGO_REDUCE_TO_ONE, bytes, &at, &s2), DSIM_OK);
    assert_rel(s2, bare + (double)bytes / 20e9, 1e-9, "reduce_to_one");
    /* a row that was never fitted is refused, not predicted from zeros */
    at.move_s = 0;
    assert_int_equal(dsim_calib_predict_at(&c, DSIM_ALGO_REDUCE_TO_ONE, bytes, &at, &s2),
                     DSIM_EINVAL);
    assert_non_null(strstr(dsim_errmsg(), "no fitted rates"));
}

static void test_message_sizes_and_copies(void **state)
{
    (void)state;
    assert_int_equal(dsim_calib_msg_bytes(DSIM_ALGO_RING, 4, 16384), 4096);
    assert_int_equal(dsim_calib_msg_bytes(DSIM_ALGO_RING, 3, 16), 8); /* 4 floats: blocks of 2 */
    assert_int_equal(dsim_calib_msg_bytes(DSIM_ALGO_RHD, 4, 16384), 8192);
    assert_int_equal(dsim_calib_msg_bytes(DSIM_ALGO_TREE, 4, 16384), 16384);
    assert_int_equal(dsim_calib_msg_bytes(DSIM_ALGO_REDUCE_TO_ONE, 8, 4), 4);
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
        cmocka_unit_test(test_patterns),
        cmocka_unit_test(test_fit_reproduces_replay),
        cmocka_unit_test(test_reduce_to_one_takes_turns_on_cores),
        cmocka_unit_test(test_predict_adds_local_copies),
        cmocka_unit_test(test_message_sizes_and_copies),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
