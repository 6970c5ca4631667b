/* The transport conformance suite, written once and run against every
 * backend: `conformance BACKEND` (registered once per backend in
 * meson.build). Exits 77 if BACKEND is not registered in this build.
 *
 * Worker threads never call cmocka asserts (they longjmp): they record the
 * first failure in their job and the main thread checks it. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <cmocka.h>

#include "dsim/err.h"
#include "dsim/log.h"
#include "dsim/rt.h"
#include "dsim/spi/transport.h"
#include "dsim/transport.h"
#include "conformance.h"
#include "fault/fault.h"

const char *tp_backend = "inproc";
/* `conformance BACKEND filter`: every fabric runs under the fault filter
 * with no faults (pass-through), which must change nothing. */
int tp_filtered;
/* `conformance BACKEND opts=OPTIONS`: the backend's options for every
 * fabric the suite opens without options of its own. */
static const char *tp_options;

static void job_filter(job *j, dsim_fabric_cfg *cfg);

static void job_open_opts(job *j, int n, const char *options)
{
    memset(j, 0, sizeof *j);
    assert_true(n <= MAXR);
    assert_int_equal(dsim_rt_create("threads", &j->rt), DSIM_OK);
    dsim_fabric_cfg cfg = {.backend = tp_backend, .nranks = n, .rt = j->rt, .options = options};
    job_filter(j, &cfg);
    assert_int_equal(dsim_fabric_open(&cfg, &j->f), DSIM_OK);
    j->n = n;
    for (int r = 0; r < n; r++) {
        assert_int_equal(dsim_ep_open(j->f, r, &j->ep[r]), DSIM_OK);
        assert_int_equal(dsim_ep_rank(j->ep[r]), r);
    }
}

void job_open(job *j, int n)
{
    job_open_opts(j, n, tp_options);
}

void job_close(job *j)
{
    for (int r = 0; r < j->n; r++)
        dsim_ep_close(j->ep[r]);
    dsim_fabric_close(j->f);
    dsim_rt_destroy(j->rt);
    dsim_faults_destroy(j->fs);
    j->fs = NULL;
}

int64_t dl(job *j, int64_t ns)
{
    return dsim_rt_deadline(j->rt, ns);
}

void fill_pattern(uint8_t *p, size_t n, uint32_t seed)
{
    uint32_t x = seed * 2654435761u + 1;
    for (size_t i = 0; i < n; i++) {
        x = x * 1103515245u + 12345u;
        p[i] = (uint8_t)(x >> 16);
    }
}

int check_pattern(const uint8_t *p, size_t n, uint32_t seed)
{
    uint32_t x = seed * 2654435761u + 1;
    for (size_t i = 0; i < n; i++) {
        x = x * 1103515245u + 12345u;
        if (p[i] != (uint8_t)(x >> 16))
            return 0;
    }
    return 1;
}

/* Sends one message from a to b and checks it arrives intact. */
void xfer(job *j, int a, int b, uint32_t comm, uint32_t tag, size_t len, int recv_first)
{
    uint8_t *s = calloc(len ? len : 1, 1), *d = malloc(len + 16);
    fill_pattern(s, len, (uint32_t)len + tag);
    memset(d, 0xEE, len + 16);
    dsim_req *rs = NULL, *rr = NULL;
    if (recv_first)
        assert_int_equal(dsim_irecv(j->ep[b], a, comm, tag, d, len + 16, &rr), DSIM_OK);
    assert_int_equal(dsim_isend(j->ep[a], b, comm, tag, s, len, &rs), DSIM_OK);
    if (!recv_first)
        assert_int_equal(dsim_irecv(j->ep[b], a, comm, tag, d, len + 16, &rr), DSIM_OK);
    size_t got = 12345;
    assert_int_equal(dsim_wait(rr, dl(j, LONG_NS), &got), DSIM_OK);
    assert_int_equal(dsim_wait(rs, dl(j, LONG_NS), NULL), DSIM_OK);
    assert_int_equal(got, len);
    assert_true(check_pattern(d, len, (uint32_t)len + tag));
    for (size_t i = len; i < len + 16; i++)
        assert_int_equal(d[i], 0xEE); /* nothing written past the message */
    free(s);
    free(d);
}

static void job_filter(job *j, dsim_fabric_cfg *cfg)
{
    if (!tp_filtered)
        return;
    assert_int_equal(dsim_faults_create(NULL, 0, 1, cfg->nranks, 1, 0, &j->fs), DSIM_OK);
    dsim_train_cfg tc;
    memset(&tc, 0, sizeof tc);
    dsim_faults_attach(j->fs, &tc);
    cfg->filter = tc.transport_filter;
    cfg->filter_user = tc.transport_filter_user;
}

int main(int argc, char **argv)
{
    if (argc > 1)
        tp_backend = argv[1];
    for (int a = 2; a < argc; a++) {
        if (strcmp(argv[a], "filter") == 0)
            tp_filtered = 1;
        else if (strncmp(argv[a], "opts=", 5) == 0)
            tp_options = argv[a] + 5;
    }
    int known = 0;
    for (const char *const *n = dsim_transport_names(); *n; n++)
        known |= strcmp(*n, tp_backend) == 0;
    if (!known) {
        fprintf(stderr, "transport backend '%s' is not in this build; skipping\n", tp_backend);
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_order_per_peer_and_tag),
        cmocka_unit_test(test_any_tag_takes_oldest),
        cmocka_unit_test(test_zero_length),
        cmocka_unit_test(test_seq_tables_bounded),
        cmocka_unit_test(test_sizes_both_orders),
        cmocka_unit_test(test_multi_mib),
        cmocka_unit_test(test_many_peers_all_to_all),
        cmocka_unit_test(test_truncation),
        cmocka_unit_test(test_sideband),
        cmocka_unit_test(test_poll),
        cmocka_unit_test(test_deadline_names_peer),
        cmocka_unit_test(test_abort_wakes_waiters),
        cmocka_unit_test(test_ops_after_abort),
        cmocka_unit_test(test_concurrent_abort_visible_on_return),
        cmocka_unit_test(test_stale_epoch_rejected),
        cmocka_unit_test(test_misrouted_rejected),
        cmocka_unit_test(test_duplicate_rejected),
        cmocka_unit_test(test_corrupt_rejected),
        cmocka_unit_test(test_payload_checksum),
        cmocka_unit_test(test_gap_fails_receive),
        cmocka_unit_test(test_gap_other_tag),
        cmocka_unit_test(test_probe_any),
        cmocka_unit_test(test_unreceived),
        cmocka_unit_test(test_irecv_reduce),
        cmocka_unit_test(test_irecv_reduce_from),
        cmocka_unit_test(test_cancel_pending),
        cmocka_unit_test(test_waitall),
        cmocka_unit_test(test_close_with_pending),
        cmocka_unit_test(test_cancel_races_copy),
        cmocka_unit_test(test_bad_arguments),
    };
    char name[64];
    snprintf(name, sizeof name, "conformance-%s", tp_backend);
    return cmocka_run_group_tests_name(name, tests, NULL, NULL);
}
