/* The device layer on one backend, named by argv[1] (host or cuda; argv[2]
 * optional open options such as streams=deferred): enumeration, memory and
 * its error paths, copies, peers, streams and events, every (dtype, op)
 * reduction against the host library's kernels and against exact
 * arithmetic, the documented f16/bf16 rounding, and checksums.
 *
 * The gpu suite runs it with "cuda"; with no CUDA device (or no CUDA in the
 * build) it prints why ("no CUDA device: ...") and exits 77 (skipped). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <pthread.h>

#include "dev_common.h"
#include "dsim/strategy.h"

static const char *backend = "host";
static const char *options;
static int n_devices;

static dsim_device *dev_open(void)
{
    dsim_device *d = NULL;
    assert_int_equal(dsim_device_open(backend, 0, options, &d), DSIM_OK);
    return d;
}

static void dev_close(dsim_device *d)
{
    assert_int_equal(dsim_device_close(d), DSIM_OK);
}

static void *dev_alloc(dsim_device *d, size_t bytes)
{
    void *p = NULL;
    assert_int_equal(dsim_device_alloc(d, bytes, &p), DSIM_OK);
    assert_non_null(p);
    return p;
}

static void test_enumerate(void **state)
{
    (void)state;
    const char *const *names = dsim_device_backends();
    assert_string_equal(names[0], "host");
    int n = -1;
    char why[256];
    assert_int_equal(dsim_device_count(backend, &n, why, sizeof why), DSIM_OK);
    assert_true(n >= 1);
    assert_string_equal(why, "");
    for (int i = 0; i < n; i++) {
        dsim_device_info in;
        assert_int_equal(dsim_device_query(backend, i, &in), DSIM_OK);
        assert_string_equal(in.backend, backend);
        assert_int_equal(in.index, i);
        assert_true(strlen(in.name) > 0);
        assert_true(in.total_bytes > 0);
        assert_true(in.multiprocessors > 0);
        if (strcmp(backend, "cuda") == 0) {
            assert_true(in.cc_major * 10 + in.cc_minor >= 70);
            assert_true(in.mem_bw_gbs > 0);
            assert_true(strlen(in.bus_id) > 0);
        }
        int yes = 0;
        assert_int_equal(dsim_device_can_access_peer(backend, i, i, &yes), DSIM_OK);
        assert_int_equal(yes, 1);
    }
    dsim_device_info in;
    assert_int_equal(dsim_device_query(backend, n, &in), DSIM_EINVAL);
    assert_true(dev_msg_has("out of range"));
    assert_int_equal(dsim_device_query(backend, -1, &in), DSIM_EINVAL);
    int none = -1;
    assert_int_equal(dsim_device_count("nope", &none, NULL, 0), DSIM_ENOENT);
    assert_true(dev_msg_has("no device backend named 'nope'"));
    assert_int_equal(none, 0);
    assert_int_equal(dsim_device_count(NULL, &none, NULL, 0), DSIM_EINVAL);
    dsim_device *d = NULL;
    assert_int_equal(dsim_device_open(backend, n, NULL, &d), DSIM_EINVAL);
    assert_null(d);
    assert_int_equal(dsim_device_open(backend, 0, "no_such_option=1", &d), DSIM_EINVAL);
    assert_true(dev_msg_has("no_such_option"));
    d = dev_open();
    const dsim_device_info *gi = dsim_device_get_info(d);
    assert_string_equal(gi->backend, backend);
    dev_close(d);
}

static void test_memory(void **state)
{
    (void)state;
    dsim_device *d = dev_open();
    unsigned char *p = dev_alloc(d, 1000);
    assert_int_equal((uintptr_t)p % 256, 0);
    size_t n = 0, b = 0;
    dsim_device_mem_live(d, &n, &b);
    assert_int_equal(n, 1);
    assert_int_equal(b, 1000);
    void *q = NULL;
    assert_int_equal(dsim_device_alloc(d, 0, &q), DSIM_EINVAL);
    assert_true(dev_msg_has("0 bytes"));
    assert_null(q);
    assert_int_equal(dsim_device_alloc(d, (size_t)1 << 60, &q), DSIM_EINVAL);
    assert_int_equal(dsim_device_free(d, p + 8), DSIM_EINVAL);
    assert_true(dev_msg_has("inside an allocation"));
    int local = 0;
    assert_int_equal(dsim_device_free(d, &local), DSIM_EINVAL);
    assert_true(dev_msg_has("not inside any live allocation"));
    assert_int_equal(dsim_device_free(d, NULL), DSIM_OK);
    assert_int_equal(dsim_device_free(d, p), DSIM_OK);
    assert_int_equal(dsim_device_free(d, p), DSIM_EINVAL);
    assert_true(dev_msg_has("freed already"));
    dsim_device_mem_live(d, &n, &b);
    assert_int_equal(n + b, 0);

    void *h = NULL;
    int pinned = -1;
    assert_int_equal(dsim_device_host_alloc(d, 4096, &h, &pinned), DSIM_OK);
    assert_int_equal(pinned, strcmp(backend, "cuda") == 0);
    memset(h, 1, 4096);
    assert_int_equal(dsim_device_host_free(d, h), DSIM_OK);
    assert_int_equal(dsim_device_host_free(d, h), DSIM_EINVAL);
    assert_true(dev_msg_has("not a live host buffer"));
    dev_close(d);

    /* Closing with things left: released, and said. */
    d = dev_open();
    (void)dev_alloc(d, 64);
    (void)dev_alloc(d, 64);
    dsim_stream *s = NULL;
    dsim_event *e = NULL;
    assert_int_equal(dsim_stream_create(d, &s), DSIM_OK);
    assert_int_equal(dsim_event_create(d, &e), DSIM_OK);
    assert_int_equal(dsim_device_host_alloc(d, 64, &h, NULL), DSIM_OK);
    assert_int_equal(dsim_device_close(d), DSIM_ESTATE);
    assert_true(dev_msg_has("2 allocations (128 bytes), 1 host buffer, 1 stream and 1 event"));
    assert_int_equal(dsim_device_close(NULL), DSIM_OK);
}

static void test_copies(void **state)
{
    (void)state;
    dsim_device *d = dev_open();
    enum { N = 4096 };
    unsigned char *a = dev_alloc(d, N), *b = dev_alloc(d, N);
    unsigned char src[N], dst[N];
    for (int i = 0; i < N; i++)
        src[i] = (unsigned char)dev_rand();
    assert_int_equal(dsim_device_copy_h2d(d, a, src, N, NULL), DSIM_OK);
    assert_int_equal(dsim_device_copy_d2h(d, dst, a, N, NULL), DSIM_OK);
    assert_memory_equal(dst, src, N);
    assert_int_equal(dsim_device_copy_d2d(d, b, d, a, N, NULL), DSIM_OK);
    assert_int_equal(dsim_device_memset(d, b, 0x5a, 100, NULL), DSIM_OK);
    memset(dst, 0, N);
    assert_int_equal(dsim_device_copy_d2h(d, dst, b, N, NULL), DSIM_OK);
    for (int i = 0; i < 100; i++)
        assert_int_equal(dst[i], 0x5a);
    assert_memory_equal(dst + 100, src + 100, N - 100);
    /* Sub-ranges are fine; past the end is not. */
    assert_int_equal(dsim_device_copy_d2h(d, dst, a + 1000, 3096, NULL), DSIM_OK);
    assert_memory_equal(dst, src + 1000, 3096);
    assert_int_equal(dsim_device_copy_h2d(d, a + 4000, src, 200, NULL), DSIM_EINVAL);
    assert_true(dev_msg_has("past the end"));
    assert_int_equal(dsim_device_copy_d2h(d, dst, src, 10, NULL), DSIM_EINVAL);
    assert_true(dev_msg_has("not inside any live allocation"));
    assert_int_equal(dsim_device_copy_h2d(d, a, b, 10, NULL), DSIM_EINVAL);
    assert_true(dev_msg_has("should be host memory"));
    assert_int_equal(dsim_device_copy_d2h(d, b + 8, a, 10, NULL), DSIM_EINVAL);
    assert_int_equal(dsim_device_copy_d2d(d, a + 1, d, a, 100, NULL), DSIM_EINVAL);
    assert_true(dev_msg_has("overlap in part"));
    assert_int_equal(dsim_device_copy_d2d(d, a, d, a, 100, NULL), DSIM_OK);
    assert_int_equal(dsim_device_copy_h2d(d, NULL, NULL, 0, NULL), DSIM_OK);
    assert_int_equal(dsim_device_copy_h2d(d, a, NULL, 10, NULL), DSIM_EINVAL);
    assert_int_equal(dsim_device_memset(d, a + N - 1, 0, 2, NULL), DSIM_EINVAL);

    /* A stream of another device is refused. */
    dsim_device *o = dev_open();
    dsim_stream *os = NULL;
    assert_int_equal(dsim_stream_create(o, &os), DSIM_OK);
    assert_int_equal(dsim_device_copy_h2d(d, a, src, 10, os), DSIM_EINVAL);
    assert_true(dev_msg_has("the stream belongs to"));
    assert_int_equal(dsim_stream_destroy(os), DSIM_OK);
    dev_close(o);
    assert_int_equal(dsim_device_free(d, a), DSIM_OK);
    assert_int_equal(dsim_device_free(d, b), DSIM_OK);
    dev_close(d);
}

/* Two devices (indices 0 and 1 where there are two, else two handles of
 * device 0): copies between them, and reductions reading the other's
 * memory only once it is an enabled peer. */
static void test_peers(void **state)
{
    (void)state;
    int second = n_devices > 1 ? 1 : 0;
    dsim_device *d0 = dev_open(), *d1 = NULL;
    assert_int_equal(dsim_device_open(backend, second, options, &d1), DSIM_OK);
    enum { N = 1000 };
    float *x0 = dev_alloc(d0, N * 4), *x1 = dev_alloc(d1, N * 4);
    float h0[N], h1[N], out[N], ref[N];
    dev_fill(DSIM_F32, h0, N, DSIM_SUM);
    dev_fill(DSIM_F32, h1, N, DSIM_SUM);
    assert_int_equal(dsim_device_copy_h2d(d0, x0, h0, sizeof h0, NULL), DSIM_OK);
    assert_int_equal(dsim_device_copy_h2d(d1, x1, h1, sizeof h1, NULL), DSIM_OK);
    assert_int_equal(dsim_device_copy_d2d(d0, x0, d1, x1, sizeof h1, NULL), DSIM_OK);
    assert_int_equal(dsim_device_copy_d2h(d0, out, x0, sizeof out, NULL), DSIM_OK);
    assert_memory_equal(out, h1, sizeof out);
    assert_int_equal(dsim_device_copy_d2d(d0, x0, d1, x1, sizeof h1 + 4, NULL), DSIM_EINVAL);
    assert_int_equal(dsim_device_copy_h2d(d0, x0, h0, sizeof h0, NULL), DSIM_OK);

    assert_int_equal(dsim_device_reduce(d0, x0, x1, N, DSIM_F32, DSIM_SUM, NULL), DSIM_EINVAL);
    assert_true(dev_msg_has("dsim_device_enable_peer"));
    dsim_err e = dsim_device_enable_peer(d0, d1);
    if (e == DSIM_ENOTSUP) {
        print_message("peer access %s:0 -> %s:%d not possible here: %s\n", backend, backend, second,
                      dsim_errmsg());
    } else {
        assert_int_equal(e, DSIM_OK);
        assert_int_equal(dsim_device_enable_peer(d0, d1), DSIM_OK); /* idempotent */
        assert_int_equal(dsim_device_reduce(d0, x0, x1, N, DSIM_F32, DSIM_SUM, NULL), DSIM_OK);
        memcpy(ref, h0, sizeof ref);
        assert_int_equal(dsim_reduce_local(ref, h1, N, DSIM_F32, DSIM_SUM), DSIM_OK);
        assert_int_equal(dsim_device_copy_d2h(d0, out, x0, sizeof out, NULL), DSIM_OK);
        assert_int_equal(dev_diff(DSIM_F32, out, ref, N), -1);
        /* Output on a peer is not allowed: outputs stay on the device. */
        assert_int_equal(dsim_device_reduce(d0, x1, x0, N, DSIM_F32, DSIM_SUM, NULL), DSIM_EINVAL);
    }
    assert_int_equal(dsim_device_free(d1, x1), DSIM_OK);
    dev_close(d1);
    /* d1 is gone from d0's peers; its memory is no input any more. */
    assert_int_equal(dsim_device_reduce(d0, x0, x1, N, DSIM_F32, DSIM_SUM, NULL), DSIM_EINVAL);
    assert_int_equal(dsim_device_free(d0, x0), DSIM_OK);
    dev_close(d0);
}

static void test_streams_events(void **state)
{
    (void)state;
    dsim_device *d = dev_open();
    enum { N = 1 << 16 };
    float *a = dev_alloc(d, N * 4), *b = dev_alloc(d, N * 4);
    float *src = malloc(N * 4), *dst = malloc(N * 4), *ref = malloc(N * 4);
    assert_non_null(src);
    assert_non_null(dst);
    assert_non_null(ref);
    dev_fill(DSIM_F32, src, N, DSIM_SUM);
    dsim_stream *s1 = NULL, *s2 = NULL;
    dsim_event *e1 = NULL, *e2 = NULL, *e3 = NULL, *never = NULL;
    assert_int_equal(dsim_stream_create(d, &s1), DSIM_OK);
    assert_int_equal(dsim_stream_create(d, &s2), DSIM_OK);
    assert_int_equal(dsim_event_create(d, &e1), DSIM_OK);
    assert_int_equal(dsim_event_create(d, &e2), DSIM_OK);
    assert_int_equal(dsim_event_create(d, &e3), DSIM_OK);
    assert_int_equal(dsim_event_create(d, &never), DSIM_OK);

    /* s1 writes a, s2 reads it after an event: the order holds across
     * streams without a host-side wait. */
    assert_int_equal(dsim_event_record(e2, s1), DSIM_OK);
    assert_int_equal(dsim_device_copy_h2d(d, a, src, N * 4, s1), DSIM_OK);
    assert_int_equal(dsim_device_copy_d2d(d, b, d, a, N * 4, s1), DSIM_OK);
    assert_int_equal(dsim_device_reduce(d, b, a, N, DSIM_F32, DSIM_SUM, s1), DSIM_OK);
    assert_int_equal(dsim_event_record(e1, s1), DSIM_OK);
    assert_int_equal(dsim_stream_wait_event(s2, e1), DSIM_OK);
    assert_int_equal(dsim_device_copy_d2h(d, dst, b, N * 4, s2), DSIM_OK);
    assert_int_equal(dsim_event_record(e3, s2), DSIM_OK);
    assert_int_equal(dsim_stream_sync(s2), DSIM_OK);
    memcpy(ref, src, N * 4);
    assert_int_equal(dsim_reduce_local(ref, src, N, DSIM_F32, DSIM_SUM), DSIM_OK);
    assert_int_equal(dev_diff(DSIM_F32, dst, ref, N), -1);

    int done = 0, idle = 0;
    assert_int_equal(dsim_event_sync(e1), DSIM_OK);
    assert_int_equal(dsim_event_query(e1, &done), DSIM_OK);
    assert_int_equal(done, 1);
    assert_int_equal(dsim_stream_query(s1, &idle), DSIM_OK);
    assert_int_equal(idle, 1);
    double ms = -1;
    assert_int_equal(dsim_event_elapsed_ms(e2, e1, &ms), DSIM_OK);
    assert_true(ms >= 0);

    /* Never recorded: nothing to wait for; no time to give. */
    assert_int_equal(dsim_event_sync(never), DSIM_OK);
    assert_int_equal(dsim_event_query(never, &done), DSIM_OK);
    assert_int_equal(done, 1);
    assert_int_equal(dsim_stream_wait_event(s1, never), DSIM_OK);
    assert_int_equal(dsim_event_elapsed_ms(never, e1, &ms), DSIM_ESTATE);
    assert_true(dev_msg_has("never recorded"));
    assert_int_equal(dsim_event_record(NULL, s1), DSIM_EINVAL);

    /* An event recorded on the NULL stream is complete at once. */
    assert_int_equal(dsim_event_record(e2, NULL), DSIM_OK);
    assert_int_equal(dsim_event_query(e2, &done), DSIM_OK);
    assert_int_equal(done, 1);

    /* Destroying a stream waits for its work. */
    memset(dst, 0, N * 4);
    assert_int_equal(dsim_device_copy_h2d(d, a, ref, N * 4, s1), DSIM_OK);
    assert_int_equal(dsim_stream_destroy(s1), DSIM_OK);
    assert_int_equal(dsim_device_copy_d2h(d, dst, a, N * 4, NULL), DSIM_OK);
    assert_int_equal(dev_diff(DSIM_F32, dst, ref, N), -1);
    assert_int_equal(dsim_stream_sync(NULL), DSIM_OK);
    assert_int_equal(dsim_stream_destroy(NULL), DSIM_OK);

    assert_int_equal(dsim_stream_destroy(s2), DSIM_OK);
    assert_int_equal(dsim_event_destroy(e1), DSIM_OK);
    assert_int_equal(dsim_event_destroy(e2), DSIM_OK);
    assert_int_equal(dsim_event_destroy(e3), DSIM_OK);
    assert_int_equal(dsim_event_destroy(never), DSIM_OK);
    assert_int_equal(dsim_device_free(d, a), DSIM_OK);
    assert_int_equal(dsim_device_free(d, b), DSIM_OK);
    dev_close(d);
    free(src);
    free(dst);
    free(ref);
}

/* Every dtype and op, 1 to 40 inputs (beyond one batch of 32), against the
 * host library's left fold, then the MEAN finish against
 * dsim_reduce_finish, and the pairwise form against dsim_reduce_local. */
static void test_reduce_matrix(void **state)
{
    (void)state;
    static const int ns[] = {1, 2, 3, 7, 33, 40};
    static const size_t counts[] = {1, 17, 1000, 4099};
    enum { MAXN = 40, MAXC = 4099 };
    dsim_device *d = dev_open();
    void *dev_in[MAXN], *host_in[MAXN];
    for (int k = 0; k < MAXN; k++) {
        dev_in[k] = dev_alloc(d, MAXC * 8);
        host_in[k] = malloc(MAXC * 8);
        assert_non_null(host_in[k]);
    }
    void *dev_out = dev_alloc(d, MAXC * 8);
    void *got = malloc(MAXC * 8), *ref = malloc(MAXC * 8);
    assert_non_null(got);
    assert_non_null(ref);
    int checked = 0;
    for (size_t ti = 0; ti < sizeof dev_all_types / sizeof *dev_all_types; ti++) {
        for (size_t oi = 0; oi < sizeof dev_all_ops / sizeof *dev_all_ops; oi++) {
            for (size_t ni = 0; ni < sizeof ns / sizeof *ns; ni++) {
                dsim_dtype t = dev_all_types[ti];
                dsim_op op = dev_all_ops[oi];
                int n = ns[ni];
                size_t count = counts[(ti + oi + ni) % 4], bytes = count * dsim_dtype_size(t);
                for (int k = 0; k < n; k++) {
                    dev_fill(t, host_in[k], count, op);
                    assert_int_equal(dsim_device_copy_h2d(d, dev_in[k], host_in[k], bytes, NULL),
                                     DSIM_OK);
                }
                assert_int_equal(dsim_device_reduce_n(d, dev_out, (const void *const *)dev_in, n,
                                                      count, t, op, NULL),
                                 DSIM_OK);
                assert_int_equal(dsim_device_copy_d2h(d, got, dev_out, bytes, NULL), DSIM_OK);
                dev_ref_fold(ref, host_in, n, count, t, op);
                if (dev_diff(t, got, ref, count) != -1)
                    fail_msg("%s %s over %d inputs differs", dsim_dtype_name(t), dsim_op_name(op),
                             n);
                assert_int_equal(dsim_device_reduce_finish(d, dev_out, count, t, op, n + 1, NULL),
                                 DSIM_OK);
                assert_int_equal(dsim_device_copy_d2h(d, got, dev_out, bytes, NULL), DSIM_OK);
                assert_int_equal(dsim_reduce_finish(ref, count, t, op, n + 1), DSIM_OK);
                assert_int_equal(dev_diff(t, got, ref, count), -1);
                checked++;
            }
            /* Pairwise, in place. */
            dsim_dtype t = dev_all_types[ti];
            dsim_op op = dev_all_ops[oi];
            size_t count = 777, bytes = count * dsim_dtype_size(t);
            dev_fill(t, host_in[0], count, op);
            dev_fill(t, host_in[1], count, op);
            assert_int_equal(dsim_device_copy_h2d(d, dev_in[0], host_in[0], bytes, NULL), DSIM_OK);
            assert_int_equal(dsim_device_copy_h2d(d, dev_in[1], host_in[1], bytes, NULL), DSIM_OK);
            assert_int_equal(dsim_device_reduce(d, dev_in[0], dev_in[1], count, t, op, NULL),
                             DSIM_OK);
            assert_int_equal(dsim_device_copy_d2h(d, got, dev_in[0], bytes, NULL), DSIM_OK);
            assert_int_equal(dsim_reduce_local(host_in[0], host_in[1], count, t, op), DSIM_OK);
            assert_int_equal(dev_diff(t, got, host_in[0], count), -1);
        }
    }
    print_message("%d (dtype, op, inputs) reductions equal the host library's\n", checked);
    for (int k = 0; k < MAXN; k++) {
        assert_int_equal(dsim_device_free(d, dev_in[k]), DSIM_OK);
        free(host_in[k]);
    }
    assert_int_equal(dsim_device_free(d, dev_out), DSIM_OK);
    free(got);
    free(ref);
    dev_close(d);
}

/* out the same range as input k: the first batch, a middle input, and one
 * past the first batch (done through a temporary). */
static void test_reduce_aliasing(void **state)
{
    (void)state;
    enum { N = 40, C = 513 };
    dsim_device *d = dev_open();
    void *dev_in[N], *host_in[N];
    void *got = malloc(C * 4), *ref = malloc(C * 4);
    assert_non_null(got);
    assert_non_null(ref);
    for (int k = 0; k < N; k++) {
        dev_in[k] = dev_alloc(d, C * 4);
        host_in[k] = malloc(C * 4);
        assert_non_null(host_in[k]);
    }
    static const int alias_at[] = {0, 2, 35};
    for (size_t a = 0; a < sizeof alias_at / sizeof *alias_at; a++) {
        for (int k = 0; k < N; k++) {
            dev_fill(DSIM_F32, host_in[k], C, DSIM_SUM);
            assert_int_equal(dsim_device_copy_h2d(d, dev_in[k], host_in[k], C * 4, NULL), DSIM_OK);
        }
        void *out = dev_in[alias_at[a]];
        assert_int_equal(dsim_device_reduce_n(d, out, (const void *const *)dev_in, N, C, DSIM_F32,
                                              DSIM_SUM, NULL),
                         DSIM_OK);
        assert_int_equal(dsim_device_copy_d2h(d, got, out, C * 4, NULL), DSIM_OK);
        dev_ref_fold(ref, host_in, N, C, DSIM_F32, DSIM_SUM);
        assert_int_equal(dev_diff(DSIM_F32, got, ref, C), -1);
    }
    /* Partial overlap has no meaningful result: refused. */
    const void *ins[2] = {dev_in[0], (const char *)dev_in[0] + 4};
    assert_int_equal(dsim_device_reduce_n(d, dev_in[0], ins, 2, 8, DSIM_F32, DSIM_SUM, NULL),
                     DSIM_EINVAL);
    assert_true(dev_msg_has("overlaps the output in part"));
    for (int k = 0; k < N; k++) {
        assert_int_equal(dsim_device_free(d, dev_in[k]), DSIM_OK);
        free(host_in[k]);
    }
    free(got);
    free(ref);
    dev_close(d);
}

/* Values whose results are exact in every dtype (eighths; integers), so the
 * reference is plain arithmetic in double. */
static void test_reduce_plain_reference(void **state)
{
    (void)state;
    enum { N = 3, C = 300 };
    dsim_device *d = dev_open();
    for (size_t ti = 0; ti < sizeof dev_all_types / sizeof *dev_all_types; ti++) {
        dsim_dtype t = dev_all_types[ti];
        size_t es = dsim_dtype_size(t);
        for (size_t oi = 0; oi < sizeof dev_all_ops / sizeof *dev_all_ops; oi++) {
            dsim_op op = dev_all_ops[oi];
            double v[N][C], want[C];
            unsigned char host[N][C * 8], got[C * 8], wantb[C * 8];
            void *dv[N];
            for (int k = 0; k < N; k++) {
                for (int i = 0; i < C; i++) {
                    /* Every partial result fits bf16's 8 bits. */
                    int lim = op == DSIM_PROD ? 12 : 40;
                    int r = (int)(dev_rand() % (uint64_t)(2 * lim + 1)) - lim;
                    v[k][i] = dsim_dtype_is_float(t) ? r / 8.0 : r;
                    dsim_dtype_set(t, host[k], (size_t)i, v[k][i]);
                }
                dv[k] = dev_alloc(d, C * es);
                assert_int_equal(dsim_device_copy_h2d(d, dv[k], host[k], C * es, NULL), DSIM_OK);
            }
            for (int i = 0; i < C; i++) {
                double x = v[0][i];
                for (int k = 1; k < N; k++) {
                    double y = v[k][i];
                    x = op == DSIM_MAX    ? (x > y ? x : y)
                        : op == DSIM_MIN  ? (x < y ? x : y)
                        : op == DSIM_PROD ? x * y
                                          : x + y;
                }
                want[i] = op == DSIM_MEAN ? x / N : x;
                dsim_dtype_set(t, wantb, (size_t)i, want[i]);
            }
            assert_int_equal(
                dsim_device_reduce_n(d, dv[0], (const void *const *)dv, N, C, t, op, NULL),
                DSIM_OK);
            assert_int_equal(dsim_device_reduce_finish(d, dv[0], C, t, op, N, NULL), DSIM_OK);
            assert_int_equal(dsim_device_copy_d2h(d, got, dv[0], C * es, NULL), DSIM_OK);
            if (dev_diff(t, got, wantb, C) != -1)
                fail_msg("%s %s differs from exact arithmetic", dsim_dtype_name(t),
                         dsim_op_name(op));
            for (int k = 0; k < N; k++)
                assert_int_equal(dsim_device_free(d, dv[k]), DSIM_OK);
        }
    }
    dev_close(d);
}

/* One reduction of n f16/bf16 values (given as floats) on the device. */
static uint16_t half_reduce(dsim_device *d, dsim_dtype t, dsim_op op, const float *v, int n)
{
    uint16_t h[8], r = 0;
    void *dv[8];
    for (int k = 0; k < n; k++) {
        h[k] = t == DSIM_F16 ? dsim_f32_to_f16(v[k]) : dsim_f32_to_bf16(v[k]);
        dv[k] = dev_alloc(d, 2);
        assert_int_equal(dsim_device_copy_h2d(d, dv[k], &h[k], 2, NULL), DSIM_OK);
    }
    assert_int_equal(dsim_device_reduce_n(d, dv[0], (const void *const *)dv, n, 1, t, op, NULL),
                     DSIM_OK);
    assert_int_equal(dsim_device_reduce_finish(d, dv[0], 1, t, op, n, NULL), DSIM_OK);
    assert_int_equal(dsim_device_copy_d2h(d, &r, dv[0], 2, NULL), DSIM_OK);
    for (int k = 0; k < n; k++)
        assert_int_equal(dsim_device_free(d, dv[k]), DSIM_OK);
    return r;
}

/* The documented half-precision behaviour: each step rounds to the type
 * (a left fold), never an f32 accumulation across inputs; MEAN divides the
 * rounded sum once; NaN results are quiet. */
static void test_half_rounding(void **state)
{
    (void)state;
    dsim_device *d = dev_open();
    /* f16: 2048 + 1 = 2049 is a tie between 2048 and 2050: even, 2048; + 1
     * again: 2048. Accumulated in f32 it would be 2050 (0x6801). */
    const float f16_tie[] = {2048, 1, 1};
    assert_int_equal(half_reduce(d, DSIM_F16, DSIM_SUM, f16_tie, 3), 0x6800);
    /* bf16 (8 significant bits): 256 + 1 + 1 is 256 step by step, not 258. */
    const float bf16_tie[] = {256, 1, 1};
    assert_int_equal(half_reduce(d, DSIM_BF16, DSIM_SUM, bf16_tie, 3), 0x4380);
    /* Ties to even upwards: (1 + 2^-7) + 2^-8 lies halfway to 1 + 2^-6. */
    const float bf16_up[] = {1.0078125f, 0.00390625f};
    assert_int_equal(half_reduce(d, DSIM_BF16, DSIM_SUM, bf16_up, 2), 0x3f82);
    /* Overflow to infinity, and the subnormal step. */
    const float f16_big[] = {65504, 65504};
    assert_int_equal(half_reduce(d, DSIM_F16, DSIM_SUM, f16_big, 2), 0x7c00);
    const float f16_tiny[] = {5.9604645e-8f, 5.9604645e-8f};
    assert_int_equal(half_reduce(d, DSIM_F16, DSIM_SUM, f16_tiny, 2), 0x0002);
    /* MEAN: the sum (5, exact) divided by 3 once, rounded once. */
    const float mean[] = {1, 2, 2};
    assert_int_equal(half_reduce(d, DSIM_F16, DSIM_MEAN, mean, 3), dsim_f32_to_f16(5.0f / 3.0f));
    assert_int_equal(half_reduce(d, DSIM_BF16, DSIM_MEAN, mean, 3), dsim_f32_to_bf16(5.0f / 3.0f));
    /* NaN: MAX keeps it (quiet, its sign kept); SUM makes the canonical one. */
    const float nan_max[] = {1, -NAN, 3};
    assert_int_equal(half_reduce(d, DSIM_F16, DSIM_MAX, nan_max, 3) & 0xfe00, 0xfe00);
    const float inf_sum[] = {INFINITY, -INFINITY};
    assert_int_equal(half_reduce(d, DSIM_F16, DSIM_SUM, inf_sum, 2), 0x7e00);
    assert_int_equal(half_reduce(d, DSIM_BF16, DSIM_SUM, inf_sum, 2), 0x7fc0);
    dev_close(d);
}

/* The device checksum equals dsim_params_checksum of the same floats in
 * host memory, chunk boundaries (1 MiB) included. */
static void test_checksum(void **state)
{
    (void)state;
    static const size_t ns[] = {1, 3, 16, 17, 1000, 262144, 300001};
    dsim_device *d = dev_open();
    uint64_t got = 0;
    assert_int_equal(dsim_device_checksum(d, NULL, 0, &got), DSIM_OK);
    assert_true(got == dsim_params_checksum(NULL, 0));
    for (size_t i = 0; i < sizeof ns / sizeof *ns; i++) {
        size_t n = ns[i];
        float *h = malloc(n * 4);
        assert_non_null(h);
        dev_fill(DSIM_F32, h, n, DSIM_SUM);
        float *p = dev_alloc(d, n * 4);
        assert_int_equal(dsim_device_copy_h2d(d, p, h, n * 4, NULL), DSIM_OK);
        assert_int_equal(dsim_device_checksum(d, p, n * 4, &got), DSIM_OK);
        assert_true(got == dsim_params_checksum(h, n));
        /* Any change shows: one bit of one element. */
        uint32_t u;
        memcpy(&u, &h[n / 2], 4);
        u ^= 1;
        memcpy(&h[n / 2], &u, 4);
        assert_int_equal(dsim_device_copy_h2d(d, p, h, n * 4, NULL), DSIM_OK);
        uint64_t changed = 0;
        assert_int_equal(dsim_device_checksum(d, p, n * 4, &changed), DSIM_OK);
        assert_true(changed == dsim_params_checksum(h, n));
        assert_true(changed != got);
        assert_int_equal(dsim_device_checksum(d, p, n * 4 + 1, &got), DSIM_EINVAL);
        assert_int_equal(dsim_device_free(d, p), DSIM_OK);
        free(h);
    }
    dev_close(d);
}

static void test_reduce_errors(void **state)
{
    (void)state;
    dsim_device *d = dev_open();
    float *a = dev_alloc(d, 64 * 4), *b = dev_alloc(d, 64 * 4);
    assert_int_equal(dsim_device_reduce(d, a, b, 64, (dsim_dtype)99, DSIM_SUM, NULL), DSIM_EINVAL);
    assert_true(dev_msg_has("invalid dtype"));
    assert_int_equal(dsim_device_reduce(d, a, b, 64, DSIM_F32, (dsim_op)42, NULL), DSIM_EINVAL);
    assert_true(dev_msg_has("invalid op"));
    assert_int_equal(dsim_device_reduce(d, a, b, 65, DSIM_F32, DSIM_SUM, NULL), DSIM_EINVAL);
    assert_true(dev_msg_has("past the end"));
    assert_int_equal(dsim_device_reduce(d, a, b, SIZE_MAX / 2, DSIM_F32, DSIM_SUM, NULL),
                     DSIM_EINVAL);
    assert_true(dev_msg_has("overflows"));
    float host[64];
    assert_int_equal(dsim_device_reduce(d, a, host, 64, DSIM_F32, DSIM_SUM, NULL), DSIM_EINVAL);
    assert_true(dev_msg_has("the input"));
    const void *ins[2] = {a, b};
    assert_int_equal(dsim_device_reduce_n(d, a, ins, 0, 64, DSIM_F32, DSIM_SUM, NULL), DSIM_EINVAL);
    assert_true(dev_msg_has("n is 0"));
    assert_int_equal(dsim_device_reduce_n(d, a, NULL, 2, 64, DSIM_F32, DSIM_SUM, NULL),
                     DSIM_EINVAL);
    assert_int_equal(dsim_device_reduce_finish(d, a, 64, DSIM_F32, DSIM_MEAN, 0, NULL),
                     DSIM_EINVAL);
    assert_true(dev_msg_has("nranks is 0"));
    assert_int_equal(dsim_device_reduce_finish(d, host, 64, DSIM_F32, DSIM_MEAN, 2, NULL),
                     DSIM_EINVAL);
    /* Nothing to do is fine, with any pointers. */
    assert_int_equal(dsim_device_reduce(d, NULL, NULL, 0, DSIM_F32, DSIM_SUM, NULL), DSIM_OK);
    assert_int_equal(dsim_device_reduce_finish(d, host, 64, DSIM_F32, DSIM_SUM, 4, NULL), DSIM_OK);
    assert_int_equal(dsim_device_reduce(NULL, a, b, 64, DSIM_F32, DSIM_SUM, NULL), DSIM_EINVAL);
    assert_int_equal(dsim_device_free(d, a), DSIM_OK);
    assert_int_equal(dsim_device_free(d, b), DSIM_OK);
    dev_close(d);
}

/* Several threads on one device at once, each with its own stream and
 * buffers (allocation table, streams list and the own stream shared). */
typedef struct dev_worker {
    dsim_device *d;
    int id, bad;
} dev_worker;

static void *dev_worker_main(void *arg)
{
    dev_worker *w = arg;
    enum { C = 2048 };
    float a[C], b[C], got[C];
    dsim_stream *s = NULL;
    if (dsim_stream_create(w->d, &s) != DSIM_OK) {
        w->bad = 1;
        return NULL;
    }
    for (int it = 0; it < 40 && !w->bad; it++) {
        for (int i = 0; i < C; i++) {
            a[i] = (float)(w->id * 1000 + it + i);
            b[i] = (float)i;
        }
        void *da = NULL, *db = NULL;
        w->bad |= dsim_device_alloc(w->d, sizeof a, &da) != DSIM_OK;
        w->bad |= dsim_device_alloc(w->d, sizeof b, &db) != DSIM_OK;
        if (w->bad)
            break;
        w->bad |= dsim_device_copy_h2d(w->d, da, a, sizeof a, s) != DSIM_OK;
        w->bad |= dsim_device_copy_h2d(w->d, db, b, sizeof b, it % 2 ? s : NULL) != DSIM_OK;
        w->bad |= dsim_device_reduce(w->d, da, db, C, DSIM_F32, DSIM_SUM, s) != DSIM_OK;
        w->bad |= dsim_device_copy_d2h(w->d, got, da, sizeof got, s) != DSIM_OK;
        w->bad |= dsim_stream_sync(s) != DSIM_OK;
        for (int i = 0; i < C && !w->bad; i++)
            w->bad |= got[i] != a[i] + b[i];
        w->bad |= dsim_device_free(w->d, da) != DSIM_OK;
        w->bad |= dsim_device_free(w->d, db) != DSIM_OK;
    }
    w->bad |= dsim_stream_destroy(s) != DSIM_OK;
    return NULL;
}

static void test_threads(void **state)
{
    (void)state;
    enum { T = 4 };
    dsim_device *d = dev_open();
    pthread_t th[T];
    dev_worker w[T];
    for (int t = 0; t < T; t++) {
        w[t] = (dev_worker){.d = d, .id = t};
        assert_int_equal(pthread_create(&th[t], NULL, dev_worker_main, &w[t]), 0);
    }
    for (int t = 0; t < T; t++) {
        assert_int_equal(pthread_join(th[t], NULL), 0);
        assert_int_equal(w[t].bad, 0);
    }
    size_t n = 1;
    dsim_device_mem_live(d, &n, NULL);
    assert_int_equal(n, 0);
    dev_close(d);
}

/* Skips (77) unless backend has a device; says why. */
static int dev_skip_without_devices(void)
{
    char why[256] = "";
    dsim_err e = dsim_device_count(backend, &n_devices, why, sizeof why);
    if (e == DSIM_ENOENT) {
        printf("no CUDA device: %s\n", dsim_errmsg());
        return 1;
    }
    if (e != DSIM_OK) {
        printf("dsim_device_count(%s) failed: %s\n", backend, dsim_errmsg());
        exit(1);
    }
    if (n_devices == 0) {
        printf("%s\n", why);
        return 1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    if (argc > 1)
        backend = argv[1];
    if (argc > 2)
        options = argv[2];
    if (dev_skip_without_devices())
        return 77;
    printf("device tests on %s (%d device%s)%s%s\n", backend, n_devices, n_devices == 1 ? "" : "s",
           options ? ", options " : "", options ? options : "");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_enumerate),       cmocka_unit_test(test_memory),
        cmocka_unit_test(test_copies),          cmocka_unit_test(test_peers),
        cmocka_unit_test(test_streams_events),  cmocka_unit_test(test_reduce_matrix),
        cmocka_unit_test(test_reduce_aliasing), cmocka_unit_test(test_reduce_plain_reference),
        cmocka_unit_test(test_half_rounding),   cmocka_unit_test(test_checksum),
        cmocka_unit_test(test_reduce_errors),   cmocka_unit_test(test_threads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
