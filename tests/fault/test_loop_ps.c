/* Fault loop over the sends of a parameter-server job (ARCHITECTURE.md §6):
 * the 1st, 2nd, 3rd ... dsim_isend of a job of 2 workers and 2 parameter
 * servers (sync; async exchanges through the same client) fails in turn (the point dsim/tp/send, as
 * on a connection already reset), until a job makes no more. Each time dsim_train fails within the
 * bound, and every replica whose request to a server could not even start says which server, as
 * when the server's reply never comes ("PUSH request to parameter server 1 failed"): over tcp a
 * send to a server whose link broke fails at once, and a job that lost a server must name it
 * (scenarios/faults/ps_lost.yaml expects it). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <cmocka.h>

#include "dsim/strategy.h"
#include "dsim_config.h"
#include "strat_common.h"

#if DSIM_HAVE_FIU
#include "fiu_loop.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void ps_loop(dsim_ps_mode mode)
{
    int named = 0, k;
    for (k = 1;; k++) {
        dsim_train_cfg cfg;
        sc_cfg(&cfg, "parameter_server", 2, 1);
        cfg.num_ps = 2;
        cfg.ps_mode = mode;
        cfg.epochs = 1;
        cfg.stop_after = 2;
        cfg.timeout_ns = 1500LL * 1000 * 1000;
        dsim_train_result r;
        double t0 = now_s();
        fl_arm("dsim/tp/send", k, NULL);
        dsim_err e = dsim_train(&cfg, &r);
        fl_disarm();
        double dt = now_s() - t0;
        if (!fl_fired()) {
            if (e != DSIM_OK)
                fail_msg("nothing injected: %s", r.error.msg);
            assert_int_equal(fl_calls(), k - 1);
            dsim_train_result_free(&r);
            break;
        }
        if (e == DSIM_OK)
            fail_msg("send %d failed and the job went on as if nothing happened", k);
        if (dt > 8.0)
            fail_msg("send %d: the job took %.1f s to fail", k, dt);
        /* A replica whose send to a server failed names that server. */
        const char *m = r.error.msg;
        if (strstr(m, "parameter_server: replica") && strstr(m, "request to")) {
            if (!strstr(m, "request to parameter server "))
                fail_msg("send %d: '%s' does not name the server", k, m);
            named++;
        }
        if (k <= 3)
            printf("# send %d: %s\n", k, m);
        dsim_train_result_free(&r);
    }
    printf("# %d sends in the job; %d failures named a server's request\n", k - 1, named);
    assert_true(named > 0);
}

static void test_loop_ps_sync(void **state)
{
    (void)state;
    ps_loop(DSIM_PS_SYNC);
}

int main(void)
{
    fl_init();
    if (!sc_dataset()) {
        fprintf(stderr, "cannot make the dataset: %s\n", dsim_errmsg());
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_loop_ps_sync),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
#else
int main(void)
{
    printf("# built without libfiu: no fault points to loop over\n");
    return 77;
}
#endif
