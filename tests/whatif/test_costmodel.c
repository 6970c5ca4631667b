/* The cost models: every all-reduce schedule evaluated under the alpha-beta
 * model equals Thakur, Rabenseifner & Gropp's closed form when every rank is
 * on a host of its own and the buffer splits evenly; NIC sharing between the
 * devices of a host; presets and count parsing. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "model/costmodel.h"

static void assert_close(double got, double want, const char *what)
{
    if (!(fabs(got - want) <= 1e-12 * fabs(want) + 1e-18))
        fail_msg("%s: schedule %.17g s, formula %.17g s", what, got, want);
}

static dsim_topology flat(int p, double alpha, double bw, double mem)
{
    dsim_link_model l = {"t", "test link", alpha, bw, "test"};
    dsim_device_model d = {"t", "test device", 1e12, 0.5, mem, "test"};
    dsim_topology t = {.hosts = p, .devices_per_host = 1, .intra = l, .inter = l, .device = d};
    return t;
}

static void test_formulas(void **state)
{
    (void)state;
    const dsim_algo algos[] = {DSIM_ALGO_RING, DSIM_ALGO_RHD, DSIM_ALGO_TREE,
                               DSIM_ALGO_REDUCE_TO_ONE};
    const int ps[] = {2, 3, 4, 5, 6, 7, 8, 12, 16, 64};
    const double alpha = 25e-6, bw = 1.25e9, mem = 900e9;
    /* 720720 = lcm(1..16); times 4, divisible by 64 too: every block the
     * schedules cut is whole */
    const size_t counts[] = {720720 * 4, 720720 * 64};
    for (size_t a = 0; a < sizeof algos / sizeof algos[0]; a++)
        for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++)
            for (size_t c = 0; c < 2; c++) {
                int p = ps[i];
                dsim_topology t = flat(p, alpha, bw, mem);
                double got = 0;
                int steps = 0;
                size_t bytes = counts[c] * 4;
                assert_int_equal(dsim_cost_allreduce(&t, algos[a], bytes, 4, &got, &steps),
                                 DSIM_OK);
                double want = dsim_cost_allreduce_formula(algos[a], p, (double)bytes, alpha,
                                                          1.0 / bw, 3.0 / mem);
                char what[96];
                snprintf(what, sizeof what, "%s, %d ranks, %zu bytes", dsim_algo_name(algos[a]), p,
                         bytes);
                assert_close(got, want, what);
                assert_true(steps > 0);
            }
    /* the step counts are the algorithms' own */
    dsim_topology t = flat(8, alpha, bw, mem);
    double s;
    int steps;
    assert_int_equal(dsim_cost_allreduce(&t, DSIM_ALGO_RING, 4096, 4, &s, &steps), DSIM_OK);
    assert_int_equal(steps, 14); /* 2 (p - 1) */
    assert_int_equal(dsim_cost_allreduce(&t, DSIM_ALGO_RHD, 4096, 4, &s, &steps), DSIM_OK);
    assert_int_equal(steps, 6); /* 2 lg p */
    assert_int_equal(dsim_cost_allreduce(&t, DSIM_ALGO_TREE, 4096, 4, &s, &steps), DSIM_OK);
    assert_int_equal(steps, 6);
    assert_int_equal(dsim_cost_allreduce(&t, DSIM_ALGO_REDUCE_TO_ONE, 4096, 4, &s, &steps),
                     DSIM_OK);
    assert_int_equal(steps, 2);
    /* one rank moves nothing */
    t = flat(1, alpha, bw, mem);
    assert_int_equal(dsim_cost_allreduce(&t, DSIM_ALGO_RING, 4096, 4, &s, &steps), DSIM_OK);
    assert_true(s == 0 && steps == 0);
}

/* 2 hosts x 2 devices, rhd: the distance-2 steps cross hosts with both
 * devices of a host at once (they share its NIC); the distance-1 steps stay
 * on the intra-host link. */
static void test_nic_sharing(void **state)
{
    (void)state;
    dsim_link_model nvl = {"i", "intra", 3e-6, 150e9, "test"};
    dsim_link_model eth = {"e", "inter", 20e-6, 1.175e9, "test"};
    dsim_device_model d = {"d", "dev", 15.7e12, 0.3, 900e9, "test"};
    dsim_topology t = {.hosts = 2, .devices_per_host = 2, .intra = nvl, .inter = eth, .device = d};
    double n = 4.0 * 1048576, g = 3.0 / 900e9, got = 0;
    assert_int_equal(dsim_cost_allreduce(&t, DSIM_ALGO_RHD, (size_t)n, 4, &got, NULL), DSIM_OK);
    double want = (20e-6 + (n / 2) * 2 / 1.175e9 + (n / 2) * g) /* halving, distance 2 */
                  + (3e-6 + (n / 4) / 150e9 + (n / 4) * g)      /* halving, distance 1 */
                  + (3e-6 + (n / 4) / 150e9)                    /* doubling, distance 1 */
                  + (20e-6 + (n / 2) * 2 / 1.175e9);            /* doubling, distance 2 */
    assert_close(got, want, "rhd, 2 hosts x 2 devices");
    /* the ring crosses each NIC once per step: no sharing, the slow link
     * sets every step */
    assert_int_equal(dsim_cost_allreduce(&t, DSIM_ALGO_RING, (size_t)n, 4, &got, NULL), DSIM_OK);
    want = 6 * (20e-6 + (n / 4) / 1.175e9) + 3 * (n / 4) * g;
    assert_close(got, want, "ring, 2 hosts x 2 devices");
    /* reduce_to_one: rank 0 takes rank 1's buffer over the intra link and
     * ranks 2 and 3's through its NIC at once */
    assert_int_equal(dsim_cost_allreduce(&t, DSIM_ALGO_REDUCE_TO_ONE, (size_t)n, 4, &got, NULL),
                     DSIM_OK);
    want = (20e-6 + 2 * n / 1.175e9 + 3 * n * g) + (20e-6 + 2 * n / 1.175e9);
    assert_close(got, want, "reduce_to_one, 2 hosts x 2 devices");
}

/* The hierarchical all-reduce on H hosts x L devices: (L-1) reduce-scatter
 * steps on the intra-host link with blocks of n/L, (H-1) reduce-scatter and
 * (H-1) all-gather steps across hosts with blocks of n/(LH), all L devices
 * of a host through its NIC at once, then (L-1) all-gather steps in the
 * host. That is the closed form decide.c weighs:
 *   2 (L-1) alpha_a + 2 (L-1)/L n / B_a + 2 (H-1) alpha_e + 2 (H-1)/H n / B_e
 * plus the reductions; and less than the ring and rhd on these links. */
static void test_hierarchical(void **state)
{
    (void)state;
    dsim_link_model nvl = {"i", "intra", 3e-6, 150e9, "test"};
    dsim_link_model eth = {"e", "inter", 20e-6, 1.175e9, "test"};
    dsim_device_model d = {"d", "dev", 15.7e12, 0.3, 900e9, "test"};
    static const int shapes[][2] = {{4, 4}, {3, 2}, {16, 8}, {2, 5}};
    double n = 4.0 * 240 * 4096, g = 3.0 / 900e9;
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
        int H = shapes[k][0], L = shapes[k][1];
        dsim_topology t = {
            .hosts = H, .devices_per_host = L, .intra = nvl, .inter = eth, .device = d};
        double got = 0, ring = 0, rhd = 0;
        int steps = 0;
        assert_int_equal(
            dsim_cost_allreduce(&t, DSIM_ALGO_HIERARCHICAL, (size_t)n, 4, &got, &steps), DSIM_OK);
        double bi = n / L, be = n / (L * H);
        double want = (L - 1) * (3e-6 + bi / 150e9 + bi * g)          /* reduce-scatter in host */
                      + (H - 1) * (20e-6 + L * be / 1.175e9 + be * g) /* across hosts */
                      + (H - 1) * (20e-6 + L * be / 1.175e9)          /* all-gather across */
                      + (L - 1) * (3e-6 + bi / 150e9);                /* all-gather in host */
        char what[64];
        snprintf(what, sizeof what, "hierarchical, %d hosts x %d devices", H, L);
        assert_close(got, want, what);
        assert_int_equal(steps, 2 * (L - 1) + 2 * (H - 1));
        assert_int_equal(dsim_cost_allreduce(&t, DSIM_ALGO_RING, (size_t)n, 4, &ring, NULL),
                         DSIM_OK);
        assert_int_equal(dsim_cost_allreduce(&t, DSIM_ALGO_RHD, (size_t)n, 4, &rhd, NULL), DSIM_OK);
        if (!(got < ring && got < rhd))
            fail_msg("%s: %.6g s, ring %.6g s, rhd %.6g s", what, got, ring, rhd);
    }
    /* a device per host, or one host: the ring's schedule */
    dsim_topology one = {
        .hosts = 1, .devices_per_host = 6, .intra = nvl, .inter = eth, .device = d};
    double a = 0, b = 0;
    assert_int_equal(dsim_cost_allreduce(&one, DSIM_ALGO_HIERARCHICAL, (size_t)n, 4, &a, NULL),
                     DSIM_OK);
    assert_int_equal(dsim_cost_allreduce(&one, DSIM_ALGO_RING, (size_t)n, 4, &b, NULL), DSIM_OK);
    assert_close(a, b, "hierarchical on one host");
}

/* auto by the model (decide.c): the fastest schedule that can run there, the
 * library's own pick on a tie; the decider asks with the communicator's
 * shape, takes half-precision sizes, and has no opinion on a shape it does
 * not know. */
static void test_decide(void **state)
{
    (void)state;
    dsim_topology t = {.hosts = 16,
                       .devices_per_host = 1,
                       .intra = *dsim_link_preset("nvlink"),
                       .inter = *dsim_link_preset("1gbe")};
    size_t bytes = 37408; /* under 64 KiB: the library's thresholds say tree */
    assert_int_equal(dsim_allreduce_decide_hosts(bytes, 16, 1), DSIM_ALGO_TREE);
    double best = 0, x = 0;
    dsim_algo a = dsim_cost_decide(&t, bytes, 4, &best);
    assert_int_not_equal(a, DSIM_ALGO_TREE);
    assert_int_not_equal(a, DSIM_ALGO_HIERARCHICAL); /* one device a host: cannot run */
    for (int k = DSIM_ALGO_AUTO + 1; k < DSIM_ALGO_COUNT; k++)
        if (k != DSIM_ALGO_HIERARCHICAL && k != DSIM_ALGO_TORUS &&
            dsim_cost_allreduce(&t, (dsim_algo)k, bytes, 4, &x, NULL) == DSIM_OK && x < best)
            fail_msg("%s takes %.6g s, auto's %s %.6g s", dsim_algo_name((dsim_algo)k), x,
                     dsim_algo_name(a), best);
    /* fast links: the thresholds' pick (recursive doubling, 16 ranks and 64
     * bytes) is as fast as anything, and stays */
    dsim_topology fast = t;
    fast.inter = *dsim_link_preset("nvlink");
    assert_int_equal(dsim_allreduce_decide_hosts(64, 16, 1), DSIM_ALGO_RECURSIVE_DOUBLING);
    assert_int_equal(dsim_cost_decide(&fast, 64, 4, NULL), DSIM_ALGO_RECURSIVE_DOUBLING);

    dsim_cost_decider *d = NULL;
    assert_int_equal(dsim_cost_decider_create(&t, &d), DSIM_OK);
    assert_int_equal(dsim_cost_decider_fn(d, bytes, 16, 16, 1), a);
    assert_int_equal(dsim_cost_decider_fn(d, bytes, 16, 16, 1), a); /* kept */
    /* 18,703 float16 values: not whole float32 elements, still decided */
    assert_int_equal(dsim_cost_decider_fn(d, 37406, 16, 16, 1),
                     dsim_cost_decide(&t, 37406, 2, NULL));
    /* a sub-communicator of 4 of the hosts asks with its own shape */
    dsim_topology four = t;
    four.hosts = 4;
    assert_int_equal(dsim_cost_decider_fn(d, bytes, 4, 4, 1),
                     dsim_cost_decide(&four, bytes, 4, NULL));
    /* shapes it does not know: no opinion */
    assert_int_equal(dsim_cost_decider_fn(d, bytes, 6, 0, 0), DSIM_ALGO_AUTO);
    assert_int_equal(dsim_cost_decider_fn(d, bytes, 6, 4, 2), DSIM_ALGO_AUTO);
    dsim_cost_decider_destroy(d);
}

static void test_presets_and_parsing(void **state)
{
    (void)state;
    const char *links[] = {"loopback", "1gbe", "10gbe", "25gbe", "ib100", "pcie4", "nvlink"};
    for (size_t i = 0; i < sizeof links / sizeof links[0]; i++) {
        const dsim_link_model *l = dsim_link_preset(links[i]);
        assert_non_null(l);
        assert_true(l->latency_s > 0 && l->bandwidth_Bps > 0);
        assert_true(strlen(l->source) > 10);
    }
    /* faster networks are faster */
    assert_true(dsim_link_preset("10gbe")->bandwidth_Bps >
                9 * dsim_link_preset("1gbe")->bandwidth_Bps);
    assert_true(dsim_link_preset("ib100")->latency_s < dsim_link_preset("10gbe")->latency_s);
    assert_null(dsim_link_preset("2gbe"));
    assert_non_null(dsim_device_preset("v100"));
    assert_true(dsim_device_preset("h100")->peak_flops > dsim_device_preset("v100")->peak_flops);
    const dsim_device_model *cpu = dsim_device_preset("cpu");
    assert_non_null(cpu);
    assert_true(cpu->peak_flops > 1e7 && cpu->mem_Bps > 1e8); /* measured, plausible */
    assert_null(dsim_device_preset("tpu"));
    size_t n = 0;
    while (dsim_device_preset_at(n))
        n++;
    assert_int_equal(n, 4 + DSIM_TPU_GEN_COUNT); /* v100, a100, h100, tpu-*, cpu */

    /* ResNet-50 on a V100: 4.1 GFLOP forward, 64 images: 3 x 4.1e9 x 64 /
     * (15.7e12 x 0.3) = 0.167 s */
    double c = dsim_cost_compute(dsim_device_preset("v100"), 4.1e9, 64);
    assert_true(fabs(c - 3 * 4.1e9 * 64 / (15.7e12 * 0.3)) < 1e-12);

    double v = 0;
    assert_int_equal(dsim_cost_parse_count("params", "25.6M", &v), DSIM_OK);
    assert_true(fabs(v - 25.6e6) < 1e-6);
    assert_int_equal(dsim_cost_parse_count("flops", "4.1G", &v), DSIM_OK);
    assert_true(fabs(v - 4.1e9) < 1e-3);
    assert_int_equal(dsim_cost_parse_count("x", "1e3", &v), DSIM_OK);
    assert_true(v == 1000);
    assert_int_equal(dsim_cost_parse_count("params", "12Q", &v), DSIM_EINVAL);
    assert_int_equal(dsim_cost_parse_count("params", "-3", &v), DSIM_EINVAL);
    assert_int_equal(dsim_cost_parse_count("params", "", &v), DSIM_EINVAL);
    assert_int_equal(dsim_cost_parse_count("params", "nan", &v), DSIM_EINVAL);

    /* bad topologies are refused, not evaluated */
    dsim_topology t = flat(4, 1e-6, 1e9, 1e9);
    double s;
    assert_int_equal(dsim_cost_allreduce(&t, DSIM_ALGO_RING, 4098, 4, &s, NULL), DSIM_EINVAL);
    t.inter.bandwidth_Bps = 0;
    assert_int_equal(dsim_cost_allreduce(&t, DSIM_ALGO_RING, 4096, 4, &s, NULL), DSIM_EINVAL);
    t = flat(4, 1e-6, 1e9, 1e9);
    assert_int_equal(dsim_cost_allreduce(&t, DSIM_ALGO_AUTO, 4096, 4, &s, NULL), DSIM_EINVAL);
}

/* Every algorithm src/coll runs has its cost (sim/model/algo_cost.c): a
 * schedule that agrees with its closed form, and what calibration needs;
 * auto, which is not an algorithm of its own, has none. */
static void test_every_algorithm_has_a_cost(void **state)
{
    (void)state;
    const double alpha = 10e-6, bw = 1e9, mem = 100e9;
    size_t bytes = (size_t)720720 * 4;
    for (int a = DSIM_ALGO_AUTO + 1; a < DSIM_ALGO_COUNT; a++) {
        for (int p = 2; p <= 9; p++) {
            dsim_topology t = flat(p, alpha, bw, mem);
            double got = 0;
            int steps = 0;
            assert_int_equal(dsim_cost_allreduce(&t, (dsim_algo)a, bytes, 4, &got, &steps),
                             DSIM_OK);
            double want = dsim_cost_allreduce_formula((dsim_algo)a, p, (double)bytes, alpha,
                                                      1.0 / bw, 3.0 / mem);
            char what[96];
            snprintf(what, sizeof what, "%s, %d ranks", dsim_algo_name((dsim_algo)a), p);
            assert_close(got, want, what);
            assert_true(steps > 0 && got > 0);
        }
    }
    dsim_topology t = flat(4, alpha, bw, mem);
    double s = 0;
    assert_int_equal(dsim_cost_allreduce(&t, DSIM_ALGO_AUTO, 4096, 4, &s, NULL), DSIM_EINVAL);
    assert_true(isnan(dsim_cost_allreduce_formula(DSIM_ALGO_AUTO, 4, 4096, alpha, 1, 1)));
    assert_int_equal(dsim_cost_allreduce(&t, DSIM_ALGO_COUNT, 4096, 4, &s, NULL), DSIM_EINVAL);
}

/* The torus all-reduce: without a torus it is a ring run both ways, which
 * over one NIC per rank costs what the ring costs; on a TPU slice each
 * link direction is its own, and a 4x4x4 torus (v4-128) costs exactly
 * 3 dimensions x (RS + AG) x 3 steps of one hop each, the bytes of each
 * dimension a quarter of the last's. */
static void test_torus(void **state)
{
    (void)state;
    const int ps[] = {2, 3, 4, 5, 8, 12, 16, 64};
    const double alpha = 25e-6, bw = 1.25e9, mem = 900e9;
    const size_t count = 720720 * 128; /* halves, then blocks of every p, whole */
    for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++) {
        dsim_topology t = flat(ps[i], alpha, bw, mem);
        double got = 0, want = dsim_cost_allreduce_formula(
                            DSIM_ALGO_TORUS, ps[i], (double)count * 4, alpha, 1.0 / bw, 3.0 / mem);
        assert_int_equal(dsim_cost_allreduce(&t, DSIM_ALGO_TORUS, count * 4, 4, &got, NULL),
                         DSIM_OK);
        assert_close(got, want, "torus without a torus");
    }

    dsim_tpu_topology v4;
    assert_int_equal(dsim_tpu_topology_parse("v4-128", &v4), DSIM_OK);
    dsim_topology t = {.hosts = v4.hosts, .devices_per_host = v4.replicas_per_host, .tpu = &v4};
    dsim_tpu_link_models(DSIM_TPU_V4, &t.ici, &t.on_chip);
    t.device = *dsim_tpu_device_model(DSIM_TPU_V4);
    t.intra = t.inter = t.ici;
    double S = 4.0 * 720720 * 64, a = t.ici.latency_s, b = 1.0 / t.ici.bandwidth_Bps;
    double g = 3.0 / t.device.mem_Bps;
    /* per dimension: 3 steps; each moves a quarter of each half of the
     * segment one hop (share 1), and the receiver combines both halves */
    double seg = S, want = 0;
    for (int d = 0; d < 3; d++) {
        double blk = seg / 2 / 4;
        want += 3 * (a + blk * b + 2 * blk * g); /* reduce-scatter */
        want += 3 * (a + blk * b);               /* all-gather */
        seg /= 4;
    }
    double got = 0, ring = 0;
    int steps = 0;
    assert_int_equal(dsim_cost_allreduce(&t, DSIM_ALGO_TORUS, (size_t)S, 4, &got, &steps), DSIM_OK);
    assert_close(got, want, "torus on v4-128");
    assert_int_equal(steps, 18);
    assert_int_equal(dsim_cost_allreduce(&t, DSIM_ALGO_RING, (size_t)S, 4, &ring, NULL), DSIM_OK);
    printf("# v4-128, %.0f MB: torus %.3f ms, ring %.3f ms\n", S / 1e6, got * 1e3, ring * 1e3);
    assert_true(got < ring);
    /* a slice with the wrong shape is refused */
    t.hosts = 3;
    assert_int_equal(dsim_cost_allreduce(&t, DSIM_ALGO_TORUS, (size_t)S, 4, &got, NULL),
                     DSIM_EINVAL);
    /* the presets carry their sources */
    const dsim_link_model *ici = dsim_link_preset("ici-v3");
    assert_non_null(ici);
    assert_true(ici->bandwidth_Bps == 1.0e11);
    assert_non_null(strstr(ici->source, "cloud.google.com/tpu/docs/v3"));
    assert_non_null(dsim_device_preset("tpu-v5e"));
    assert_true(dsim_device_preset("tpu-v4")->peak_flops == 275e12);
    assert_true(dsim_device_preset("tpu-v3")->peak_flops == 123e12 / 2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_formulas),
        cmocka_unit_test(test_nic_sharing),
        cmocka_unit_test(test_hierarchical),
        cmocka_unit_test(test_presets_and_parsing),
        cmocka_unit_test(test_every_algorithm_has_a_cost),
        cmocka_unit_test(test_torus),
        cmocka_unit_test(test_decide),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
