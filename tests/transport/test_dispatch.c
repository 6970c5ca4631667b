/* The transport dispatch layer itself: backend registration, the "not
 * supported" stubs, and the options helpers backends use. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <cmocka.h>

#include "dsim/err.h"
#include "dsim/rt.h"
#include "dsim/spi/transport.h"
#include "dsim/transport.h"

#define MS 1000000LL

/* A backend that holds every send until cancelled or the fabric closes: it
 * exercises the shared layer's handling of sends it does not queue itself,
 * and of a table with no optional members. */
static int hold_opened, hold_closed;

static dsim_err hold_fabric_open(dsim_fabric *f, const char *options)
{
    (void)f;
    (void)options;
    hold_opened++;
    return DSIM_OK;
}
static void hold_fabric_close(dsim_fabric *f)
{
    (void)f;
    hold_closed++;
}
static dsim_err hold_ep_open(dsim_ep *ep)
{
    (void)ep;
    return DSIM_OK;
}
static void hold_ep_close(dsim_ep *ep)
{
    (void)ep;
}
static dsim_req *hold_last;
static dsim_err hold_send(dsim_ep *ep, int to, const dsim_tp_hdr *hdr, const void *payload,
                          size_t len, dsim_req *req)
{
    (void)ep;
    (void)to;
    (void)hdr;
    (void)payload;
    (void)len;
    hold_last = req;
    return DSIM_OK;
}

static const struct dsim_tp_ops hold_ops = {
    .size = sizeof(struct dsim_tp_ops),
    .name = "test_hold",
    .fabric_open = hold_fabric_open,
    .fabric_close = hold_fabric_close,
    .ep_open = hold_ep_open,
    .ep_close = hold_ep_close,
    .send = hold_send,
};

static dsim_rt *hold_rt;

static void hold_finish_later(void *req)
{
    dsim_rt_sleep_until(hold_rt, dsim_rt_deadline(hold_rt, 100 * MS));
    DSIM_ERR(DSIM_EPEER, 1, "test: rank 1 unreachable");
    dsim_tp_complete(req, DSIM_EPEER);
}

static void test_register_checks_the_table(void **state)
{
    (void)state;
    assert_int_equal(dsim_transport_register(NULL), DSIM_EINVAL);
    struct dsim_tp_ops o = hold_ops;
    o.name = "test_nosend";
    o.send = NULL;
    assert_int_equal(dsim_transport_register(&o), DSIM_EINVAL);
    assert_non_null(strstr(dsim_errmsg(), "'send'"));
    o = hold_ops;
    o.name = "test_noopen";
    o.fabric_open = NULL;
    assert_int_equal(dsim_transport_register(&o), DSIM_EINVAL);
    assert_non_null(strstr(dsim_errmsg(), "fabric_open"));
    o = hold_ops;
    o.size = 8;
    assert_int_equal(dsim_transport_register(&o), DSIM_EINVAL);
    assert_non_null(strstr(dsim_errmsg(), "size"));
    o = hold_ops;
    o.name = "Bad Name";
    assert_int_equal(dsim_transport_register(&o), DSIM_EINVAL);
    o.name = NULL;
    assert_int_equal(dsim_transport_register(&o), DSIM_EINVAL);
    o.name = "inproc";
    assert_int_equal(dsim_transport_register(&o), DSIM_EINVAL);
    assert_non_null(strstr(dsim_errmsg(), "already registered"));
    /* None of the rejected tables was registered. */
    for (const char *const *n = dsim_transport_names(); *n; n++) {
        assert_string_not_equal(*n, "test_nosend");
        assert_string_not_equal(*n, "test_noopen");
    }
}

static void test_registered_backend_is_used(void **state)
{
    (void)state;
    assert_int_equal(dsim_transport_register(&hold_ops), DSIM_OK);
    assert_int_equal(dsim_transport_register(&hold_ops), DSIM_EINVAL);
    int found = 0, inproc = 0;
    for (const char *const *n = dsim_transport_names(); *n; n++) {
        found |= strcmp(*n, "test_hold") == 0;
        inproc |= strcmp(*n, "inproc") == 0;
    }
    assert_true(found);
    assert_true(inproc);

    dsim_rt *rt;
    assert_int_equal(dsim_rt_create("threads", &rt), DSIM_OK);
    dsim_fabric_cfg cfg = {.backend = "test_hold", .nranks = 2, .rt = rt};
    dsim_fabric *f;
    assert_int_equal(dsim_fabric_open(&cfg, &f), DSIM_OK);
    assert_int_equal(hold_opened, 1);
    assert_string_equal(dsim_fabric_backend(f), "test_hold");
    dsim_ep *e0;
    assert_int_equal(dsim_ep_open(f, 0, &e0), DSIM_OK);
    uint32_t v = 1;
    dsim_req *s;
    assert_int_equal(dsim_isend(e0, 1, 0, 0, &v, sizeof v, &s), DSIM_OK);
    assert_ptr_equal(hold_last, s);
    assert_false(dsim_req_done(s));
    /* cancel_send was left out: the stub says "in progress", so a wait that
     * times out still waits for the backend to finish the send (here with
     * an error, 100 ms later) before it frees the request. */
    hold_rt = rt;
    dsim_task *t;
    int64_t t0 = dsim_rt_now(rt);
    assert_int_equal(dsim_rt_spawn(rt, 1, hold_finish_later, s, &t), DSIM_OK);
    assert_int_equal(dsim_wait(s, dsim_rt_deadline(rt, 10 * MS), NULL), DSIM_EPEER);
    assert_true(dsim_rt_now(rt) - t0 >= 100 * MS);
    assert_string_equal(dsim_errmsg(), "test: rank 1 unreachable");
    assert_int_equal(dsim_last_error()->peer, 1);
    assert_int_equal(dsim_rt_join(rt, t), DSIM_OK);
    /* The abort stub has nothing to tell; the local revoke still works. */
    dsim_fabric_abort(f, 1, "test");
    assert_int_equal(dsim_isend(e0, 1, 0, 0, &v, sizeof v, &s), DSIM_EABORTED);
    dsim_ep_close(e0);
    dsim_fabric_close(f);
    assert_int_equal(hold_closed, 1);
    dsim_rt_destroy(rt);
}

static void test_options(void **state)
{
    (void)state;
    const char *cur = "a=1, bb=xyz,,c=";
    char k[8], v[8];
    assert_int_equal(dsim_tp_opt_next("t", &cur, k, sizeof k, v, sizeof v), 1);
    assert_string_equal(k, "a");
    assert_string_equal(v, "1");
    assert_int_equal(dsim_tp_opt_next("t", &cur, k, sizeof k, v, sizeof v), 1);
    assert_string_equal(k, "bb");
    assert_string_equal(v, "xyz");
    assert_int_equal(dsim_tp_opt_next("t", &cur, k, sizeof k, v, sizeof v), 1);
    assert_string_equal(k, "c");
    assert_string_equal(v, "");
    assert_int_equal(dsim_tp_opt_next("t", &cur, k, sizeof k, v, sizeof v), 0);
    cur = NULL;
    assert_int_equal(dsim_tp_opt_next("t", &cur, k, sizeof k, v, sizeof v), 0);
    cur = "novalue";
    assert_int_equal(dsim_tp_opt_next("t", &cur, k, sizeof k, v, sizeof v), -1);
    assert_non_null(strstr(dsim_errmsg(), "novalue"));
    cur = "=3";
    assert_int_equal(dsim_tp_opt_next("t", &cur, k, sizeof k, v, sizeof v), -1);
    cur = "muchtoolongkey=1";
    assert_int_equal(dsim_tp_opt_next("t", &cur, k, sizeof k, v, sizeof v), -1);

    size_t n = 0;
    assert_int_equal(dsim_tp_opt_size("t", "x", "65536", &n), DSIM_OK);
    assert_int_equal(n, 65536);
    assert_int_equal(dsim_tp_opt_size("t", "x", "64k", &n), DSIM_OK);
    assert_int_equal(n, 65536);
    assert_int_equal(dsim_tp_opt_size("t", "x", "2M", &n), DSIM_OK);
    assert_int_equal(n, 2u << 20);
    assert_int_equal(dsim_tp_opt_size("t", "x", "0", &n), DSIM_OK);
    assert_int_equal(n, 0);
    /* A blank before the number or a sign is not a byte count either (strtoull
     * alone would take " -5" as 2^64 - 5). */
    const char *bad[] = {"", "k", "-1", "12q", "1kk", "99999999999999999999", " -5", " 5", "+5"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        assert_int_equal(dsim_tp_opt_size("t", "x", bad[i], &n), DSIM_EINVAL);
    assert_non_null(strstr(dsim_errmsg(), "x="));
}

/* inproc's eager limit is an option: with eager_max=0 every message takes
 * the rendezvous path, which a send nobody receives makes visible. */
static void test_inproc_eager_max_option(void **state)
{
    (void)state;
    dsim_rt *rt;
    assert_int_equal(dsim_rt_create("threads", &rt), DSIM_OK);
    const char *opts[] = {NULL, "eager_max=0"};
    for (int i = 0; i < 2; i++) {
        dsim_fabric_cfg cfg = {.backend = "inproc", .nranks = 2, .rt = rt, .options = opts[i]};
        dsim_fabric *f;
        assert_int_equal(dsim_fabric_open(&cfg, &f), DSIM_OK);
        dsim_ep *e0, *e1;
        assert_int_equal(dsim_ep_open(f, 0, &e0), DSIM_OK);
        assert_int_equal(dsim_ep_open(f, 1, &e1), DSIM_OK);
        uint32_t v = 5;
        dsim_req *s;
        assert_int_equal(dsim_isend(e0, 1, 0, 0, &v, sizeof v, &s), DSIM_OK);
        assert_int_equal(dsim_req_done(s), i == 0);
        if (i == 1) {
            uint32_t got = 0;
            dsim_req *r;
            assert_int_equal(dsim_irecv(e1, 0, 0, 0, &got, sizeof got, &r), DSIM_OK);
            assert_int_equal(dsim_wait(r, DSIM_NO_DEADLINE, NULL), DSIM_OK);
            assert_int_equal(got, 5);
            assert_true(dsim_req_done(s));
        }
        assert_int_equal(dsim_wait(s, DSIM_NO_DEADLINE, NULL), DSIM_OK);
        dsim_ep_close(e0);
        dsim_ep_close(e1);
        dsim_fabric_close(f);
    }
    dsim_fabric_cfg cfg = {.backend = "inproc", .nranks = 2, .rt = rt, .options = "eager_max=lots"};
    dsim_fabric *f;
    assert_int_equal(dsim_fabric_open(&cfg, &f), DSIM_EINVAL);
    assert_non_null(strstr(dsim_errmsg(), "eager_max=lots"));
    cfg.options = "eager_max= -5";
    assert_int_equal(dsim_fabric_open(&cfg, &f), DSIM_EINVAL);
    dsim_rt_destroy(rt);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_register_checks_the_table),
        cmocka_unit_test(test_registered_backend_is_used),
        cmocka_unit_test(test_options),
        cmocka_unit_test(test_inproc_eager_max_option),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
