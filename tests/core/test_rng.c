/* rng: the generator and the key derivation against independent reference
 * code, stream independence, and distribution checks with stated bounds.
 *
 * The statistical bounds are set at six standard deviations or more of the
 * statistic under a correct generator (a false alarm rate below 1e-8 for any
 * seed), yet far inside the error of a typical bug (a modulo bias, a lost
 * bit, an off-by-one range). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

#include <cmocka.h>

#include "dsim/rng.h"

/* xoshiro256** as published by Blackman and Vigna (prng.di.unimi.it). */
static uint64_t ref_rotl(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

static uint64_t ref_next(uint64_t s[4])
{
    const uint64_t result = ref_rotl(s[1] * 5, 7) * 9;
    const uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = ref_rotl(s[3], 45);
    return result;
}

static uint64_t ref_splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15u);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
    return z ^ (z >> 31);
}

static uint64_t ref_fnv1a(const unsigned char *p, size_t n)
{
    uint64_t h = 0xcbf29ce484222325u;
    for (size_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 0x100000001b3u;
    return h;
}

/* The documented key encoding: seed LE | purpose | 0 | worker LE. */
static void ref_init(uint64_t s[4], uint64_t seed, const char *purpose, uint64_t worker)
{
    unsigned char buf[256];
    size_t n = 0, len = strlen(purpose);
    for (int i = 0; i < 8; i++)
        buf[n++] = (unsigned char)(seed >> (8 * i));
    memcpy(buf + n, purpose, len);
    n += len;
    buf[n++] = 0;
    for (int i = 0; i < 8; i++)
        buf[n++] = (unsigned char)(worker >> (8 * i));
    uint64_t x = ref_fnv1a(buf, n);
    for (int i = 0; i < 4; i++)
        s[i] = ref_splitmix64(&x);
}

static void test_reference_vectors(void **state)
{
    (void)state;
    /* the references themselves, against published values */
    assert_true(ref_fnv1a((const unsigned char *)"", 0) == 0xcbf29ce484222325u);
    assert_true(ref_fnv1a((const unsigned char *)"a", 1) == 0xaf63dc4c8601ec8cu);
    assert_true(ref_fnv1a((const unsigned char *)"foobar", 6) == 0x85944171f73967e8u);
    uint64_t x = 0;
    assert_true(ref_splitmix64(&x) == 0xe220a8397b1dcdafu);

    /* the generator: state {1,2,3,4} gives 11520, 0, ... */
    dsim_rng r = {{1, 2, 3, 4}};
    uint64_t s[4] = {1, 2, 3, 4};
    assert_true(dsim_rng_next(&r) == 11520u);
    assert_true(dsim_rng_next(&r) == 0u);
    ref_next(s);
    ref_next(s);
    for (int i = 0; i < 1000; i++)
        assert_true(dsim_rng_next(&r) == ref_next(s));

    /* the key derivation */
    static const struct {
        uint64_t seed;
        const char *purpose;
        uint64_t worker;
    } keys[] = {{0, "", 0}, {42, "data.shuffle", 3}, {UINT64_MAX, "fault.drop", UINT64_MAX}};
    for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++) {
        dsim_rng_init(&r, keys[k].seed, keys[k].purpose, keys[k].worker);
        ref_init(s, keys[k].seed, keys[k].purpose, keys[k].worker);
        for (int i = 0; i < 4; i++)
            assert_true(r.s[i] == s[i]);
    }
    /* NULL purpose is the empty one */
    dsim_rng q;
    dsim_rng_init(&q, 7, NULL, 1);
    dsim_rng_init(&r, 7, "", 1);
    assert_memory_equal(q.s, r.s, sizeof q.s);
}

static int same_stream(dsim_rng a, dsim_rng b, int n)
{
    for (int i = 0; i < n; i++)
        if (dsim_rng_next(&a) != dsim_rng_next(&b))
            return 0;
    return 1;
}

static void test_stream_keys(void **state)
{
    (void)state;
    dsim_rng a, b;
    dsim_rng_init(&a, 1234, "data.shuffle", 5);
    dsim_rng_init(&b, 1234, "data.shuffle", 5);
    assert_true(same_stream(a, b, 1000));

    dsim_rng_init(&b, 1235, "data.shuffle", 5);
    assert_false(same_stream(a, b, 4));
    dsim_rng_init(&b, 1234, "data.shufflf", 5);
    assert_false(same_stream(a, b, 4));
    dsim_rng_init(&b, 1234, "data.shuffle", 6);
    assert_false(same_stream(a, b, 4));
    /* the separator keeps purpose and worker bytes apart */
    dsim_rng_init(&a, 1, "x", 0);
    dsim_rng_init(&b, 1, "x\001", 0);
    assert_false(same_stream(a, b, 4));

    /* neighbouring workers do not see shifted copies of one stream */
    dsim_rng w0, w1;
    dsim_rng_init(&w0, 9, "p", 0);
    dsim_rng_init(&w1, 9, "p", 1);
    uint64_t v0[64], v1[64];
    for (int i = 0; i < 64; i++) {
        v0[i] = dsim_rng_next(&w0);
        v1[i] = dsim_rng_next(&w1);
    }
    for (int i = 0; i < 64; i++)
        for (int j = 0; j < 64; j++)
            assert_true(v0[i] != v1[j]);
}

static void test_uniform(void **state)
{
    (void)state;
    enum { N = 100000 };
    dsim_rng r;
    dsim_rng_init(&r, 2024, "test.uniform", 0);
    double sum = 0;
    int low_bit = 0;
    for (int i = 0; i < N; i++) {
        double u = dsim_rng_uniform(&r);
        assert_true(u >= 0.0 && u < 1.0);
        double scaled = u * 0x1p53;
        assert_true(scaled == floor(scaled)); /* on the 2^-53 grid */
        low_bit |= (fmod(scaled, 2.0) == 1.0);
        sum += u;
    }
    /* the mean of N uniforms has sd 1/sqrt(12 N) = 0.00091; allow 6 sd */
    double mean = sum / N;
    assert_true(fabs(mean - 0.5) < 6 * sqrt(1.0 / 12.0 / N));
    /* all 53 bits are used: the lowest is set in about half the draws */
    assert_true(low_bit);
}

static void test_below(void **state)
{
    (void)state;
    dsim_rng r;
    dsim_rng_init(&r, 99, "test.below", 0);
    assert_true(dsim_rng_below(&r, 0) == 0);
    for (int i = 0; i < 100; i++)
        assert_true(dsim_rng_below(&r, 1) == 0);

    const uint64_t ns[] = {2, 3, 7, 1000, (UINT64_C(1) << 63) + 1, UINT64_MAX};
    for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++)
        for (int i = 0; i < 2000; i++)
            assert_true(dsim_rng_below(&r, ns[k]) < ns[k]);

    /* chi-square over 10 cells, 100000 draws: 9 degrees of freedom, mean 9,
     * sd 4.2; P(X > 50) is about 1e-7 */
    enum { N = 100000, K = 10 };
    long cell[K] = {0};
    for (int i = 0; i < N; i++)
        cell[dsim_rng_below(&r, K)]++;
    double chi = 0, e = (double)N / K;
    for (int k = 0; k < K; k++)
        chi += (cell[k] - e) * (cell[k] - e) / e;
    assert_true(chi < 50.0);

    /* modulo bias would show here: with n = 3 * 2^62, x % n maps the top
     * quarter of 64-bit values onto [0, 2^62), so P(v < 2^62) would be 1/2
     * instead of 1/3 (sd of the fraction over N draws: 0.0015) */
    const uint64_t n = UINT64_C(3) << 62;
    long lowcount = 0, mod3 = 0;
    for (int i = 0; i < N; i++) {
        uint64_t v = dsim_rng_below(&r, n);
        lowcount += v < (UINT64_C(1) << 62);
        mod3 += v % 3 == 0;
    }
    assert_true(fabs((double)lowcount / N - 1.0 / 3.0) < 0.01);
    /* a multiply-shift without the rejection step is biased too, in a
     * different pattern: floor(x * 3/4) hits multiples of 3 twice as often,
     * so P(v % 3 == 0) would be 1/2 */
    assert_true(fabs((double)mod3 / N - 1.0 / 3.0) < 0.01);
}

static void test_normal(void **state)
{
    (void)state;
    enum { N = 100000 };
    dsim_rng r, r2;
    dsim_rng_init(&r, 5, "test.normal", 2);
    r2 = r;
    double sum = 0, sum2 = 0;
    long within1 = 0;
    for (int i = 0; i < N; i++) {
        double z = dsim_rng_normal(&r);
        assert_true(z == dsim_rng_normal(&r2)); /* deterministic */
        assert_true(isfinite(z));
        sum += z;
        sum2 += z * z;
        within1 += fabs(z) <= 1.0;
    }
    double mean = sum / N, var = sum2 / N - mean * mean;
    /* sd of the mean 1/sqrt(N) = 0.0032; of the variance sqrt(2/N) = 0.0045;
     * of the fraction within one sd sqrt(p(1-p)/N) = 0.0015 */
    assert_true(fabs(mean) < 0.02);
    assert_true(fabs(var - 1.0) < 0.03);
    assert_true(fabs((double)within1 / N - 0.682689) < 0.01);
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static void test_shuffle(void **state)
{
    (void)state;
    enum { N = 1000 };
    uint64_t v[N], w[N];
    for (int i = 0; i < N; i++)
        v[i] = w[i] = (uint64_t)i * 7 + 3;
    dsim_rng r, r2;
    dsim_rng_init(&r, 11, "test.shuffle", 0);
    dsim_rng_init(&r2, 11, "test.shuffle", 0);
    dsim_rng_shuffle_u64(&r, v, N);
    dsim_rng_shuffle_u64(&r2, w, N);
    assert_memory_equal(v, w, sizeof v); /* deterministic */
    int moved = 0;
    for (int i = 0; i < N; i++)
        moved += v[i] != (uint64_t)i * 7 + 3;
    assert_true(moved > N / 2); /* expected N - 1 */
    qsort(v, N, sizeof v[0], cmp_u64);
    for (int i = 0; i < N; i++)
        assert_true(v[i] == (uint64_t)i * 7 + 3); /* a permutation */

    dsim_rng_shuffle_u64(&r, v, 0);
    dsim_rng_shuffle_u64(&r, v, 1);
    assert_true(v[0] == 3);

    /* all 6 orders of 3 elements, about equally often: chi-square with 5
     * degrees of freedom (mean 5, sd 3.2), P(X > 40) < 1e-6 */
    enum { T = 60000 };
    long seen[6] = {0};
    for (int t = 0; t < T; t++) {
        uint64_t p[3] = {0, 1, 2};
        dsim_rng_shuffle_u64(&r, p, 3);
        seen[p[0] * 2 + (p[1] > p[2])]++;
    }
    double chi = 0, e = T / 6.0;
    for (int k = 0; k < 6; k++)
        chi += (seen[k] - e) * (seen[k] - e) / e;
    assert_true(chi < 40.0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reference_vectors),
        cmocka_unit_test(test_stream_keys),
        cmocka_unit_test(test_uniform),
        cmocka_unit_test(test_below),
        cmocka_unit_test(test_normal),
        cmocka_unit_test(test_shuffle),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
