/* The transport conformance suite's shared parts (conformance.c runs it):
 *   conformance.c         main, the job (a fabric of n ranks) and helpers
 *   conformance_order.c   ordering, many peers, truncation, the sideband,
 *                         polling, deadlines
 *   conformance_checks.c  abort, and the receive path's header checks
 *   conformance_calls.c   probing, reducing receives, cancel, waitall,
 *                         close, cancellation racing a copy, bad arguments
 * Worker threads never call cmocka asserts (they longjmp): they record the
 * first failure in their job and the main thread checks it. */
#ifndef DSIM_TEST_CONFORMANCE_H
#define DSIM_TEST_CONFORMANCE_H

#include <stddef.h>
#include <stdint.h>

#include "dsim/rt.h"
#include "dsim/spi/transport.h"
#include "dsim/transport.h"
#include "fault/fault.h"

#define MS      1000000LL
#define MAXR    16
#define LONG_NS (20000 * MS) /* "never" for waits that must succeed */

/* The backend under test, and whether every fabric runs under the fault
 * filter with no faults (conformance.c's main sets them). */
extern const char *tp_backend;
extern int tp_filtered;

typedef struct job {
    dsim_rt *rt;
    dsim_fabric *f;
    dsim_ep *ep[MAXR];
    int n;
    dsim_faults *fs;
} job;

/* conformance.c */
void job_open(job *j, int n);
void job_close(job *j);
int64_t dl(job *j, int64_t ns);
void fill_pattern(uint8_t *p, size_t n, uint32_t seed);
int check_pattern(const uint8_t *p, size_t n, uint32_t seed);
void xfer(job *j, int a, int b, uint32_t comm, uint32_t tag, size_t len, int recv_first);

/* conformance_order.c */
void test_order_per_peer_and_tag(void **state);
void test_any_tag_takes_oldest(void **state);
void test_zero_length(void **state);
void test_seq_tables_bounded(void **state);
void test_sizes_both_orders(void **state);
void test_multi_mib(void **state);
void test_many_peers_all_to_all(void **state);
void test_truncation(void **state);
void test_sideband(void **state);
void test_poll(void **state);
void test_deadline_names_peer(void **state);

/* conformance_checks.c */
void test_abort_wakes_waiters(void **state);
void test_ops_after_abort(void **state);
void test_concurrent_abort_visible_on_return(void **state);
void inject(job *j, int from, int to, const dsim_tp_hdr *h, const void *p, size_t len);
void test_stale_epoch_rejected(void **state);
void test_misrouted_rejected(void **state);
void test_duplicate_rejected(void **state);
void test_corrupt_rejected(void **state);
void test_payload_checksum(void **state);
void test_gap_fails_receive(void **state);
void test_gap_other_tag(void **state);

/* conformance_calls.c */
void test_probe_any(void **state);
void test_unreceived(void **state);
void test_irecv_reduce(void **state);
void test_irecv_reduce_from(void **state);
void test_cancel_pending(void **state);
void test_waitall(void **state);
void test_close_with_pending(void **state);
void test_cancel_races_copy(void **state);
void test_bad_arguments(void **state);

#endif
