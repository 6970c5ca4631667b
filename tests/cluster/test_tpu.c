/* TPU slices (dsim/tpu.h): every accelerator type resolves to the hosts,
 * replicas and chips its generation gives; wrap-around by the generation's
 * rule; each replica's place (host, device, chip, core, coordinates) is
 * consistent both ways and host-major as TensorFlow numbers replicas; the
 * replicas' torus for the communicator; explicit shapes; bad names refused
 * with the accepted list. No TPU is involved: it is the arithmetic of a
 * slice's shape. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "dsim/err.h"
#include "dsim/tpu.h"

typedef struct slice_case {
    const char *name;
    int hosts, replicas_per_host, replicas, chips;
    int dims[3];
    int wrap[3];
} slice_case;

static const slice_case slice_cases[] = {
    {"v2-8", 1, 8, 8, 4, {2, 2, 1}, {0, 0, 0}},
    {"v2-512", 64, 8, 512, 256, {16, 16, 1}, {1, 1, 0}},
    {"v3-8", 1, 8, 8, 4, {2, 2, 1}, {0, 0, 0}},
    {"v3-32", 4, 8, 32, 16, {4, 4, 1}, {0, 0, 0}},
    {"v3-2048", 256, 8, 2048, 1024, {32, 32, 1}, {1, 1, 0}},
    {"v4-8", 1, 4, 4, 4, {2, 2, 1}, {0, 0, 0}},
    {"v4-32", 4, 4, 16, 16, {2, 2, 4}, {0, 0, 1}},
    {"v4-128", 16, 4, 64, 64, {4, 4, 4}, {1, 1, 1}},
    {"v4-256", 32, 4, 128, 128, {4, 4, 8}, {1, 1, 1}},
    {"v5e-1", 1, 1, 1, 1, {1, 1, 1}, {0, 0, 0}},
    {"v5e-8", 1, 8, 8, 8, {2, 4, 1}, {0, 0, 0}},
    {"v5e-16", 2, 8, 16, 16, {4, 4, 1}, {0, 0, 0}},
    {"v5litepod-256", 32, 8, 256, 256, {16, 16, 1}, {1, 1, 0}},
};

static void test_slices(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof slice_cases / sizeof slice_cases[0]; i++) {
        const slice_case *c = &slice_cases[i];
        dsim_tpu_topology t;
        if (dsim_tpu_topology_parse(c->name, &t) != DSIM_OK)
            fail_msg("%s: %s", c->name, dsim_errmsg());
        assert_int_equal(t.hosts, c->hosts);
        assert_int_equal(t.replicas_per_host, c->replicas_per_host);
        assert_int_equal(t.replicas, c->replicas);
        assert_int_equal(t.chips, c->chips);
        for (int d = 0; d < 3; d++) {
            assert_int_equal(t.dims[d], c->dims[d]);
            assert_int_equal(t.wrap[d], c->wrap[d]);
        }
    }
    /* every listed name resolves, and its count is its TensorCores (v2-v4)
     * or chips (v5e) */
    char names[DSIM_TPU_NAMES_MAX];
    dsim_tpu_names(DSIM_TPU_GEN_COUNT, names, sizeof names);
    int n = 0;
    for (char *save = NULL, *s = strtok_r(names, ", ", &save); s; s = strtok_r(NULL, ", ", &save)) {
        dsim_tpu_topology t;
        if (dsim_tpu_topology_parse(s, &t) != DSIM_OK)
            fail_msg("%s: %s", s, dsim_errmsg());
        const dsim_tpu_gen_info *gi = dsim_tpu_gen_get(t.gen);
        int count = atoi(strchr(s, '-') + 1);
        assert_int_equal(count, gi->name_counts_cores ? t.chips * gi->cores_per_chip : t.chips);
        assert_int_equal(t.replicas, t.chips * gi->replicas_per_chip);
        assert_string_equal(t.name, s);
        n++;
    }
    assert_true(n >= 30);
}

/* Host-major numbering, both ways, and a host's replicas on its own block. */
static void test_places(void **state)
{
    (void)state;
    static const char *const slices[] = {"v2-32", "v3-64", "v4-64", "v4-128", "v5e-32", "v5e-8"};
    for (size_t i = 0; i < sizeof slices / sizeof slices[0]; i++) {
        dsim_tpu_topology t;
        assert_int_equal(dsim_tpu_topology_parse(slices[i], &t), DSIM_OK);
        char *seen = calloc((size_t)t.chips * (size_t)t.replicas_per_chip, 1);
        for (int r = 0; r < t.replicas; r++) {
            dsim_tpu_place p;
            assert_int_equal(dsim_tpu_place_of(&t, r, &p), DSIM_OK);
            assert_int_equal(p.host, r / t.replicas_per_host);
            assert_int_equal(p.device, r % t.replicas_per_host);
            assert_int_equal(dsim_tpu_replica_at(&t, p.coords, p.core), r);
            assert_int_equal(p.chip,
                             p.coords[0] + t.dims[0] * (p.coords[1] + t.dims[1] * p.coords[2]));
            /* the host's block */
            for (int d = 0; d < 3; d++) {
                dsim_tpu_place p0;
                assert_int_equal(dsim_tpu_place_of(&t, p.host * t.replicas_per_host, &p0), DSIM_OK);
                assert_true(p.coords[d] - p0.coords[d] >= 0 &&
                            p.coords[d] - p0.coords[d] < t.host_dims[d]);
            }
            size_t k = (size_t)p.chip * (size_t)t.replicas_per_chip + (size_t)p.core;
            assert_int_equal(seen[k], 0);
            seen[k] = 1;
        }
        free(seen);
        dsim_tpu_place p;
        assert_int_equal(dsim_tpu_place_of(&t, t.replicas, &p), DSIM_EINVAL);
        int out[3] = {t.dims[0], 0, 0};
        assert_int_equal(dsim_tpu_replica_at(&t, out, 0), -1);
    }
    /* v3-32: the two cores of chip (1, 0) are replicas 2 and 3 of host 0;
     * host 1 holds the block at x = 2..3 */
    dsim_tpu_topology t;
    assert_int_equal(dsim_tpu_topology_parse("v3-32", &t), DSIM_OK);
    dsim_tpu_place p;
    assert_int_equal(dsim_tpu_place_of(&t, 3, &p), DSIM_OK);
    assert_int_equal(p.coords[0], 1);
    assert_int_equal(p.coords[1], 0);
    assert_int_equal(p.core, 1);
    assert_int_equal(dsim_tpu_place_of(&t, 8, &p), DSIM_OK);
    assert_int_equal(p.host, 1);
    assert_int_equal(p.coords[0], 2);
    assert_int_equal(p.coords[1], 0);
}

/* The replicas' torus: cores of a chip first, then x, y, z; every replica
 * at one place. */
static void test_torus(void **state)
{
    (void)state;
    dsim_tpu_topology t;
    int dims[DSIM_TPU_TORUS_DIMS], nd = 0;
    assert_int_equal(dsim_tpu_topology_parse("v3-32", &t), DSIM_OK);
    int at[64];
    dsim_tpu_torus(&t, dims, &nd, at);
    assert_int_equal(nd, 3);
    assert_int_equal(dims[0], 2);
    assert_int_equal(dims[1], 4);
    assert_int_equal(dims[2], 4);
    int seen[32] = {0};
    for (int pl = 0; pl < 32; pl++) {
        dsim_tpu_place p;
        assert_int_equal(dsim_tpu_place_of(&t, at[pl], &p), DSIM_OK);
        assert_int_equal(pl % 2, p.core);
        assert_int_equal((pl / 2) % 4, p.coords[0]);
        assert_int_equal(pl / 8, p.coords[1]);
        seen[at[pl]]++;
    }
    for (int r = 0; r < 32; r++)
        assert_int_equal(seen[r], 1);
    assert_int_equal(dsim_tpu_topology_parse("v4-128", &t), DSIM_OK);
    dsim_tpu_torus(&t, dims, &nd, NULL);
    assert_int_equal(nd, 3);
    assert_int_equal(dims[0] * dims[1] * dims[2], 64);
    assert_int_equal(dsim_tpu_topology_parse("v5e-1", &t), DSIM_OK);
    dsim_tpu_torus(&t, dims, &nd, at);
    assert_int_equal(nd, 0);
    /* hops: the short way round a wrapped dimension, straight on a mesh */
    assert_int_equal(dsim_tpu_topology_parse("v4-128", &t), DSIM_OK);
    int a[3] = {0, 0, 0}, b[3] = {3, 3, 2};
    assert_int_equal(dsim_tpu_hops(&t, a, b), 1 + 1 + 2);
    assert_int_equal(dsim_tpu_topology_parse("v3-32", &t), DSIM_OK);
    assert_int_equal(dsim_tpu_hops(&t, a, b), 3 + 3 + 2);
}

static void expect_err(dsim_err e, const char *text)
{
    assert_int_equal(e, DSIM_EINVAL);
    if (!strstr(dsim_errmsg(), text))
        fail_msg("expected \"%s\" in: %s", text, dsim_errmsg());
}

static void test_shapes_and_refusals(void **state)
{
    (void)state;
    dsim_tpu_topology t;
    assert_int_equal(dsim_tpu_topology_shape(DSIM_TPU_V4, "4x4x2", &t), DSIM_OK);
    assert_int_equal(t.chips, 32);
    assert_int_equal(t.hosts, 8);
    assert_string_equal(t.name, "v4-64");
    assert_int_equal(t.wrap[0], 1);
    assert_int_equal(t.wrap[2], 0);
    assert_int_equal(dsim_tpu_topology_shape(DSIM_TPU_V3, "8x4", &t), DSIM_OK);
    assert_int_equal(t.replicas, 64);
    assert_int_equal(dsim_tpu_topology_shape(DSIM_TPU_V5E, "2x2", &t), DSIM_OK);
    assert_int_equal(t.hosts, 1);

    expect_err(dsim_tpu_topology_parse("v3-16", &t),
               "no v3 slice has 16 TensorCores (accepted: v3-8, v3-32");
    expect_err(dsim_tpu_topology_parse("v6e-8", &t),
               "\"v6e\" is not a TPU generation dsim knows (accepted generations: v2, v3, v4, "
               "v5e");
    expect_err(dsim_tpu_topology_parse("v4", &t), "not an accelerator type such as v3-32");
    expect_err(dsim_tpu_topology_parse("v5e-12", &t), "no v5e slice has 12 chips");
    expect_err(dsim_tpu_topology_shape(DSIM_TPU_V4, "4x4", &t), "is not 3 chip dimensions");
    expect_err(dsim_tpu_topology_shape(DSIM_TPU_V3, "4x4x2", &t), "is not 2 chip dimensions");
    expect_err(dsim_tpu_topology_shape(DSIM_TPU_V4, "3x4x4", &t),
               "dimension x (3) is not a multiple of 2");
    expect_err(dsim_tpu_topology_shape(DSIM_TPU_V2, "32x16", &t),
               "dimension x is 32 chips, more than the pod's 16");
    expect_err(dsim_tpu_topology_shape(DSIM_TPU_V4, "0x4x4", &t), "each >= 1");
    dsim_tpu_gen g;
    assert_int_equal(dsim_tpu_gen_parse("V5litepod", &g), DSIM_OK);
    assert_int_equal(g, DSIM_TPU_V5E);
    assert_null(dsim_tpu_gen_get(DSIM_TPU_GEN_COUNT));
    for (int k = 0; k < DSIM_TPU_GEN_COUNT; k++) {
        const dsim_tpu_gen_info *gi = dsim_tpu_gen_get((dsim_tpu_gen)k);
        assert_true(gi->peak_bf16_flops > 1e13 && gi->ici_link_Bps > 1e10);
        assert_non_null(strstr(gi->source, "cloud.google.com/tpu/docs/"));
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_slices),
        cmocka_unit_test(test_places),
        cmocka_unit_test(test_torus),
        cmocka_unit_test(test_shapes_and_refusals),
    };
    return cmocka_run_group_tests_name("tpu", tests, NULL, NULL);
}
