/* What only the host backend and the shared layer have: deferred streams
 * (work runs when waited for, so a missing synchronisation shows on a CPU),
 * DSIM_HOST_DEVICES, the registry's checks of a backend's table, the "not
 * supported" answers of a backend without the optional members, the copy
 * staged through host memory between its devices, and the message for a
 * cuda backend that is not built. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "dev_common.h"
#include "dsim/spi/device.h"

static dsim_device *open_host(const char *options)
{
    dsim_device *d = NULL;
    assert_int_equal(dsim_device_open("host", 0, options, &d), DSIM_OK);
    return d;
}

static void *alloc(dsim_device *d, size_t bytes)
{
    void *p = NULL;
    assert_int_equal(dsim_device_alloc(d, bytes, &p), DSIM_OK);
    return p;
}

/* Deferred streams: a read before the sync sees the old bytes; the sync,
 * an event wait, a free or a destroy runs the work, in stream order. */
static void test_deferred(void **state)
{
    (void)state;
    dsim_device *d = open_host("streams=deferred");
    enum { N = 256 };
    unsigned char *a = alloc(d, N), *b = alloc(d, N);
    unsigned char src[N], src2[N], dst[N];
    for (int i = 0; i < N; i++) {
        src[i] = (unsigned char)i;
        src2[i] = (unsigned char)(255 - i);
    }
    dsim_stream *s1 = NULL, *s2 = NULL;
    assert_int_equal(dsim_stream_create(d, &s1), DSIM_OK);
    assert_int_equal(dsim_stream_create(d, &s2), DSIM_OK);

    memset(dst, 0, N);
    assert_int_equal(dsim_device_copy_h2d(d, a, src, N, s1), DSIM_OK);
    assert_int_equal(dsim_device_copy_d2h(d, dst, a, N, s1), DSIM_OK);
    for (int i = 0; i < N; i++)
        assert_int_equal(dst[i], 0); /* nothing ran yet */
    assert_int_equal(dsim_stream_sync(s1), DSIM_OK);
    assert_memory_equal(dst, src, N);

    /* s2 waits for s1 through an event; syncing s2 alone runs s1 first. */
    dsim_event *e = NULL;
    assert_int_equal(dsim_event_create(d, &e), DSIM_OK);
    assert_int_equal(dsim_device_copy_h2d(d, b, src2, N, s1), DSIM_OK);
    assert_int_equal(dsim_event_record(e, s1), DSIM_OK);
    int done = 1;
    assert_int_equal(dsim_stream_wait_event(s2, e), DSIM_OK);
    assert_int_equal(dsim_device_copy_d2h(d, dst, b, N, s2), DSIM_OK);
    assert_int_equal(dsim_stream_sync(s2), DSIM_OK);
    assert_memory_equal(dst, src2, N);
    assert_int_equal(dsim_event_query(e, &done), DSIM_OK);
    assert_int_equal(done, 1);

    /* A NULL-stream call is not ordered with queued work: it runs now, the
     * queued copy later (when s1 is synchronised). */
    assert_int_equal(dsim_device_copy_h2d(d, a, src, N, s1), DSIM_OK);
    assert_int_equal(dsim_device_copy_h2d(d, a, src2, N, NULL), DSIM_OK);
    assert_int_equal(dsim_device_copy_d2h(d, dst, a, N, NULL), DSIM_OK);
    assert_memory_equal(dst, src2, N);
    assert_int_equal(dsim_stream_sync(s1), DSIM_OK);
    assert_int_equal(dsim_device_copy_d2h(d, dst, a, N, NULL), DSIM_OK);
    assert_memory_equal(dst, src, N);

    /* An event recorded again captures the new point; one destroyed with
     * its record still queued is simply gone. */
    assert_int_equal(dsim_device_memset(d, a, 7, N, s1), DSIM_OK);
    assert_int_equal(dsim_event_record(e, s1), DSIM_OK);
    assert_int_equal(dsim_event_sync(e), DSIM_OK);
    assert_int_equal(dsim_device_copy_d2h(d, dst, a, 1, NULL), DSIM_OK);
    assert_int_equal(dst[0], 7);
    assert_int_equal(dsim_device_memset(d, a, 9, N, s1), DSIM_OK);
    assert_int_equal(dsim_event_record(e, s1), DSIM_OK);
    assert_int_equal(dsim_event_destroy(e), DSIM_OK);
    assert_int_equal(dsim_stream_sync(s1), DSIM_OK);

    /* A free waits for queued work that uses the buffer (as cudaFree). */
    /* (N bytes hold N / 4 int32: a count of N runs past the end.) */
    assert_int_equal(dsim_device_reduce(d, a, b, N, DSIM_I32, DSIM_SUM, s2), DSIM_EINVAL);
    assert_int_equal(dsim_device_reduce(d, a, b, N / 4, DSIM_I32, DSIM_SUM, s2), DSIM_OK);
    assert_int_equal(dsim_device_free(d, b), DSIM_OK);
    assert_int_equal(dsim_device_copy_d2h(d, dst, a, N, NULL), DSIM_OK);
    int32_t x[N / 4], y[N / 4];
    memset(x, 9, sizeof x);
    memcpy(y, src2, sizeof y);
    assert_int_equal(dsim_reduce_local(x, y, N / 4, DSIM_I32, DSIM_SUM), DSIM_OK);
    assert_memory_equal(dst, x, N);

    /* Work queued behind a stream that is destroyed still runs. */
    assert_int_equal(dsim_device_copy_h2d(d, a, src, N, s2), DSIM_OK);
    assert_int_equal(dsim_stream_destroy(s2), DSIM_OK);
    assert_int_equal(dsim_device_copy_d2h(d, dst, a, N, NULL), DSIM_OK);
    assert_memory_equal(dst, src, N);
    assert_int_equal(dsim_stream_destroy(s1), DSIM_OK);
    assert_int_equal(dsim_device_free(d, a), DSIM_OK);
    assert_int_equal(dsim_device_close(d), DSIM_OK);
}

/* A stream on a deferred device waiting for an event of a synchronous one,
 * and the reverse. */
static void test_mixed_modes(void **state)
{
    (void)state;
    dsim_device *lazy = open_host("streams=deferred"), *eager = open_host("streams=sync");
    unsigned char *a = alloc(lazy, 64), dst[64] = {0}, src[64];
    memset(src, 3, sizeof src);
    dsim_stream *ls = NULL, *es = NULL;
    dsim_event *le = NULL, *ee = NULL;
    assert_int_equal(dsim_stream_create(lazy, &ls), DSIM_OK);
    assert_int_equal(dsim_stream_create(eager, &es), DSIM_OK);
    assert_int_equal(dsim_event_create(lazy, &le), DSIM_OK);
    assert_int_equal(dsim_event_create(eager, &ee), DSIM_OK);
    assert_int_equal(dsim_device_copy_h2d(lazy, a, src, 64, ls), DSIM_OK);
    assert_int_equal(dsim_event_record(le, ls), DSIM_OK);
    /* The synchronous stream runs at once, so it runs what it waits for. */
    assert_int_equal(dsim_stream_wait_event(es, le), DSIM_OK);
    assert_int_equal(dsim_event_record(ee, es), DSIM_OK);
    assert_int_equal(dsim_stream_wait_event(ls, ee), DSIM_OK);
    assert_int_equal(dsim_device_copy_d2h(lazy, dst, a, 64, NULL), DSIM_OK);
    assert_memory_equal(dst, src, 64);
    assert_int_equal(dsim_device_free(lazy, a), DSIM_OK);
    assert_int_equal(dsim_device_close(lazy), DSIM_ESTATE); /* stream and event left */
    assert_int_equal(dsim_device_close(eager), DSIM_ESTATE);
}

static void test_host_devices_env(void **state)
{
    (void)state;
    int n = 0;
    assert_int_equal(setenv("DSIM_HOST_DEVICES", "3", 1), 0);
    assert_int_equal(dsim_device_count("host", &n, NULL, 0), DSIM_OK);
    assert_int_equal(n, 3);
    dsim_device *d = NULL;
    assert_int_equal(dsim_device_open("host", 2, NULL, &d), DSIM_OK);
    assert_int_equal(dsim_device_get_info(d)->index, 2);
    assert_int_equal(dsim_device_close(d), DSIM_OK);
    assert_int_equal(setenv("DSIM_HOST_DEVICES", "many", 1), 0);
    assert_int_equal(dsim_device_count("host", &n, NULL, 0), DSIM_EINVAL);
    assert_true(dev_msg_has("DSIM_HOST_DEVICES='many'"));
    assert_int_equal(setenv("DSIM_HOST_DEVICES", "65", 1), 0);
    assert_int_equal(dsim_device_count("host", &n, NULL, 0), DSIM_EINVAL);
    assert_int_equal(unsetenv("DSIM_HOST_DEVICES"), 0);
    assert_int_equal(dsim_device_count("host", &n, NULL, 0), DSIM_OK);
    assert_int_equal(n, 1);
}

/* ---- a backend with the required members only ---- */

static dsim_err min_count(int *count, char *why, size_t why_cap)
{
    (void)why;
    (void)why_cap;
    *count = 2;
    return DSIM_OK;
}

static dsim_err min_query(int index, dsim_device_info *out)
{
    snprintf(out->name, sizeof out->name, "minimal %d", index);
    return DSIM_OK;
}

static dsim_err min_open(dsim_device *d, int index, const char *options)
{
    (void)d;
    (void)index;
    (void)options;
    return DSIM_OK;
}

static void min_close(dsim_device *d)
{
    (void)d;
}

static dsim_err min_alloc(dsim_device *d, size_t bytes, void **ptr)
{
    (void)d;
    *ptr = aligned_alloc(256, (bytes + 255) / 256 * 256);
    return *ptr ? DSIM_OK : DSIM_ENOMEM;
}

static dsim_err min_free(dsim_device *d, void *ptr)
{
    (void)d;
    free(ptr);
    return DSIM_OK;
}

static dsim_err min_copy(dsim_stream *s, dsim_copy_kind kind, void *dst, const void *src,
                         size_t bytes)
{
    (void)s;
    (void)kind;
    memmove(dst, src, bytes);
    return DSIM_OK;
}

static dsim_err min_stream(dsim_stream *s)
{
    (void)s;
    return DSIM_OK;
}

static void min_stream_destroy(dsim_stream *s)
{
    (void)s;
}

static dsim_err min_event(dsim_event *e)
{
    (void)e;
    return DSIM_OK;
}

static void min_event_destroy(dsim_event *e)
{
    (void)e;
}

static dsim_err min_record(dsim_event *e, dsim_stream *s)
{
    (void)e;
    (void)s;
    return DSIM_OK;
}

static dsim_err min_reduce(dsim_stream *s, void *out, const void *const *ins, int n, size_t count,
                           dsim_dtype t, dsim_op op)
{
    (void)s;
    size_t bytes = count * dsim_dtype_size(t);
    void *tmp = malloc(bytes);
    if (!tmp)
        return DSIM_ENOMEM;
    memcpy(tmp, ins[0], bytes);
    for (int k = 1; k < n; k++)
        (void)dsim_reduce_local(tmp, ins[k], count, t, op);
    memcpy(out, tmp, bytes);
    free(tmp);
    return DSIM_OK;
}

static dsim_err min_div(dsim_stream *s, void *buf, size_t count, dsim_dtype t, int nranks)
{
    (void)s;
    return dsim_reduce_finish(buf, count, t, DSIM_MEAN, nranks);
}

static const struct dsim_device_ops min_ops = {
    .size = sizeof(struct dsim_device_ops),
    .name = "minimal",
    .count = min_count,
    .query = min_query,
    .open = min_open,
    .close = min_close,
    .alloc = min_alloc,
    .free = min_free,
    .copy = min_copy,
    .stream_create = min_stream,
    .stream_destroy = min_stream_destroy,
    .stream_sync = min_stream,
    .event_create = min_event,
    .event_destroy = min_event_destroy,
    .event_record = min_record,
    .event_sync = min_event,
    .reduce = min_reduce,
    .reduce_div = min_div,
};

static void test_registry(void **state)
{
    (void)state;
    assert_int_equal(dsim_device_register(NULL), DSIM_EINVAL);
    struct dsim_device_ops bad = min_ops;
    bad.size = 8;
    assert_int_equal(dsim_device_register(&bad), DSIM_EINVAL);
    assert_true(dev_msg_has("ops->size is 8"));
    bad = min_ops;
    bad.name = "Not-Valid";
    assert_int_equal(dsim_device_register(&bad), DSIM_EINVAL);
    assert_true(dev_msg_has("'Not-Valid' is not valid"));
    bad = min_ops;
    bad.reduce = NULL;
    assert_int_equal(dsim_device_register(&bad), DSIM_EINVAL);
    assert_true(dev_msg_has("required member 'reduce'"));
    bad = min_ops;
    bad.host_alloc = min_alloc;
    assert_int_equal(dsim_device_register(&bad), DSIM_EINVAL);
    assert_true(dev_msg_has("host_alloc without host_free"));
    bad = min_ops;
    bad.name = "host";
    assert_int_equal(dsim_device_register(&bad), DSIM_EINVAL);
    assert_true(dev_msg_has("already registered"));

    assert_int_equal(dsim_device_register(&min_ops), DSIM_OK);
    int found = 0;
    for (const char *const *n = dsim_device_backends(); *n; n++)
        found |= strcmp(*n, "minimal") == 0;
    assert_true(found);
}

/* The optional members it lacks answer "not supported", naming the call
 * and the backend; what the shared layer can do without them still works. */
static void test_not_supported(void **state)
{
    (void)state;
    dsim_device *d0 = NULL, *d1 = NULL;
    assert_int_equal(dsim_device_open("minimal", 0, NULL, &d0), DSIM_OK);
    assert_int_equal(dsim_device_open("minimal", 1, NULL, &d1), DSIM_OK);
    enum { N = 3000000 }; /* more than one staging chunk */
    unsigned char *a = alloc(d0, N), *b = alloc(d1, N);
    unsigned char *src = malloc(N), *dst = malloc(N);
    assert_non_null(src);
    assert_non_null(dst);
    for (size_t i = 0; i < N; i++)
        src[i] = (unsigned char)(i * 7);
    assert_int_equal(dsim_device_memset(d0, a, 0, N, NULL), DSIM_ENOTSUP);
    assert_true(dev_msg_has("'minimal' has no memset"));
    dsim_stream *s = NULL;
    dsim_event *e = NULL, *e2 = NULL;
    assert_int_equal(dsim_stream_create(d0, &s), DSIM_OK);
    assert_int_equal(dsim_event_create(d0, &e), DSIM_OK);
    assert_int_equal(dsim_event_create(d0, &e2), DSIM_OK);
    int flag = 0;
    assert_int_equal(dsim_stream_query(s, &flag), DSIM_ENOTSUP);
    assert_true(dev_msg_has("dsim_stream_query"));
    assert_int_equal(dsim_event_record(e, s), DSIM_OK);
    assert_int_equal(dsim_event_record(e2, s), DSIM_OK);
    assert_int_equal(dsim_stream_wait_event(s, e), DSIM_ENOTSUP);
    assert_true(dev_msg_has("dsim_event_sync"));
    assert_int_equal(dsim_event_query(e, &flag), DSIM_ENOTSUP);
    double ms = 0;
    assert_int_equal(dsim_event_elapsed_ms(e, e2, &ms), DSIM_ENOTSUP);
    assert_true(dev_msg_has("does not time events"));
    assert_int_equal(dsim_device_enable_peer(d0, d1), DSIM_ENOTSUP);
    assert_true(dev_msg_has("staged through host memory"));
    int yes = 1;
    assert_int_equal(dsim_device_can_access_peer("minimal", 0, 1, &yes), DSIM_OK);
    assert_int_equal(yes, 0);
    /* Between its devices: staged through host memory, in chunks. */
    assert_int_equal(dsim_device_copy_h2d(d1, b, src, N, NULL), DSIM_OK);
    assert_int_equal(dsim_device_copy_d2d(d0, a, d1, b, N, s), DSIM_OK);
    assert_int_equal(dsim_device_copy_d2h(d0, dst, a, N, NULL), DSIM_OK);
    assert_memory_equal(dst, src, N);
    /* Plain host memory stands in for page-locked memory. */
    void *h = NULL;
    int pinned = -1;
    assert_int_equal(dsim_device_host_alloc(d0, 100, &h, &pinned), DSIM_OK);
    assert_int_equal(pinned, 0);
    assert_int_equal(dsim_device_host_free(d0, h), DSIM_OK);
    /* Copies between backends are refused with the way round. */
    dsim_device *hd = open_host(NULL);
    unsigned char *c = alloc(hd, 16);
    assert_int_equal(dsim_device_copy_d2d(hd, c, d0, a, 16, NULL), DSIM_EINVAL);
    assert_true(dev_msg_has("different backends"));
    assert_int_equal(dsim_device_enable_peer(hd, d0), DSIM_EINVAL);
    assert_int_equal(dsim_device_free(hd, c), DSIM_OK);
    assert_int_equal(dsim_device_close(hd), DSIM_OK);
    assert_int_equal(dsim_event_destroy(e), DSIM_OK);
    assert_int_equal(dsim_event_destroy(e2), DSIM_OK);
    assert_int_equal(dsim_stream_destroy(s), DSIM_OK);
    assert_int_equal(dsim_device_free(d0, a), DSIM_OK);
    assert_int_equal(dsim_device_free(d1, b), DSIM_OK);
    assert_int_equal(dsim_device_close(d0), DSIM_OK);
    assert_int_equal(dsim_device_close(d1), DSIM_OK);
    free(src);
    free(dst);
}

/* In a build without CUDA, asking for it says how to get it. */
static void test_cuda_absent(void **state)
{
    (void)state;
    int have = 0;
    for (const char *const *n = dsim_device_backends(); *n; n++)
        have |= strcmp(*n, "cuda") == 0;
    int count = -1;
    char why[256] = "";
    dsim_err e = dsim_device_count("cuda", &count, why, sizeof why);
    if (have) {
        /* Built with CUDA: a count, and a reason when it is 0. */
        assert_int_equal(e, DSIM_OK);
        assert_true(count > 0 || strncmp(why, "no CUDA device: ", 16) == 0);
        print_message("cuda: %d device(s) %s\n", count, why);
    } else {
        assert_int_equal(e, DSIM_ENOENT);
        assert_true(dev_msg_has("not in this build"));
        assert_true(dev_msg_has("-Dcuda=enabled"));
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_deferred),         cmocka_unit_test(test_mixed_modes),
        cmocka_unit_test(test_host_devices_env), cmocka_unit_test(test_registry),
        cmocka_unit_test(test_not_supported),    cmocka_unit_test(test_cuda_absent),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
