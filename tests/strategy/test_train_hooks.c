/* The driver's hooks: phases are announced in order, a replica the hooks
 * kill stops silently, and the survivors fail naming it instead of waiting
 * for it; a run where nobody dies is unchanged by hooks that say go. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>

#include "dsim/strategy.h"
#include "strat_common.h"

#define MAXR 8

typedef struct hook_state {
    int victim;          /* replica to kill, or -1 */
    dsim_phase at_phase; /* where */
    uint64_t at_step;    /* when (for per-step phases) */
    atomic_int seen[MAXR][DSIM_PHASE_COUNT];
    atomic_int out_of_order;
    int last[MAXR];
} hook_state;

static dsim_hook_action hs_phase(void *user, int r, dsim_phase p, uint64_t gs)
{
    hook_state *h = user;
    if (r < 0 || r >= MAXR || (int)p < 0 || p >= DSIM_PHASE_COUNT)
        return DSIM_HOOK_GO;
    atomic_fetch_add(&h->seen[r][p], 1);
    /* Within a replica phases never go back, except that a new step
     * starts again at compute. */
    if ((int)p < h->last[r] && p != DSIM_PHASE_COMPUTE)
        atomic_fetch_add(&h->out_of_order, 1);
    h->last[r] = (int)p;
    if (r == h->victim && p == h->at_phase && gs == h->at_step)
        return DSIM_HOOK_DIE;
    return DSIM_HOOK_GO;
}

static const dsim_train_hooks hs_hooks = {.size = sizeof(dsim_train_hooks), .phase = hs_phase};

static void hs_init(hook_state *h, int victim, dsim_phase p, uint64_t step)
{
    memset(h, 0, sizeof *h);
    h->victim = victim;
    h->at_phase = p;
    h->at_step = step;
}

static void test_hooks_go_changes_nothing(void **state)
{
    (void)state;
    dsim_train_cfg cfg;
    sc_cfg(&cfg, "multi_worker_mirrored", 2, 2);
    dsim_train_result plain, hooked;
    assert_int_equal(dsim_train(&cfg, &plain), DSIM_OK);
    hook_state h;
    hs_init(&h, -1, DSIM_PHASE_COUNT, 0);
    cfg.hooks = &hs_hooks;
    cfg.hooks_user = &h;
    assert_int_equal(dsim_train(&cfg, &hooked), DSIM_OK);
    assert_memory_equal(plain.params, hooked.params, plain.n_params * sizeof(float));
    for (int r = 0; r < 4; r++) {
        assert_int_equal(atomic_load(&h.seen[r][DSIM_PHASE_START]), 1);
        assert_int_equal(atomic_load(&h.seen[r][DSIM_PHASE_CREATE_VARIABLES]), 1);
        assert_int_equal(atomic_load(&h.seen[r][DSIM_PHASE_COMPUTE]), (int)hooked.steps);
        assert_int_equal(atomic_load(&h.seen[r][DSIM_PHASE_ALLREDUCE]), (int)hooked.steps);
        assert_int_equal(atomic_load(&h.seen[r][DSIM_PHASE_FINISH]), 1);
        assert_int_equal(atomic_load(&h.seen[r][DSIM_PHASE_RESTORE]), 0);
        assert_false(hooked.replicas[r].killed);
        assert_int_equal(hooked.replicas[r].status, DSIM_OK);
        assert_int_equal(hooked.replicas[r].phase, DSIM_PHASE_FINISH);
    }
    assert_int_equal(atomic_load(&h.out_of_order), 0);
    dsim_train_result_free(&plain);
    dsim_train_result_free(&hooked);
}

/* Kills replica 2 at the allreduce of step 3: the others must fail within
 * about the collective timeout, and the error must name rank 2. */
static void test_hooks_kill_is_a_silent_death(void **state)
{
    (void)state;
    dsim_train_cfg cfg;
    sc_cfg(&cfg, "multi_worker_mirrored", 2, 2);
    cfg.timeout_ns = 300 * 1000 * 1000LL;
    hook_state h;
    hs_init(&h, 2, DSIM_PHASE_ALLREDUCE, 3);
    cfg.hooks = &hs_hooks;
    cfg.hooks_user = &h;
    dsim_train_result res;
    dsim_err e = dsim_train(&cfg, &res);
    assert_int_not_equal(e, DSIM_OK);
    assert_int_equal(res.error.peer, 2);
    assert_true(res.replicas[2].killed);
    assert_int_equal(res.replicas[2].status, DSIM_OK);
    assert_int_equal(res.replicas[2].phase, DSIM_PHASE_ALLREDUCE);
    assert_int_equal(res.replicas[2].global_step, 3);
    int64_t died = res.replicas[2].t_end;
    for (int r = 0; r < 4; r++) {
        if (r == 2)
            continue;
        assert_false(res.replicas[r].killed);
        assert_int_not_equal(res.replicas[r].status, DSIM_OK);
        assert_true(res.replicas[r].msg[0] != '\0');
        /* detected within the timeout plus its grace (at most 2 s) */
        assert_true(res.replicas[r].t_end - died < cfg.timeout_ns + 2500LL * 1000 * 1000);
    }
    dsim_train_result_free(&res);
}

static void test_hooks_size_checked(void **state)
{
    (void)state;
    dsim_train_cfg cfg;
    sc_cfg(&cfg, "mirrored", 1, 2);
    dsim_train_hooks bad = hs_hooks;
    bad.size = 8;
    cfg.hooks = &bad;
    dsim_train_result res;
    assert_int_equal(dsim_train(&cfg, &res), DSIM_EINVAL);
    assert_non_null(strstr(res.error.msg, "hooks.size"));
    dsim_train_result_free(&res);
}

static void test_phase_names(void **state)
{
    (void)state;
    for (int p = 0; p < DSIM_PHASE_COUNT; p++) {
        dsim_phase back;
        assert_int_equal(dsim_phase_parse(dsim_phase_name((dsim_phase)p), &back), DSIM_OK);
        assert_int_equal((int)back, p);
    }
    dsim_phase x;
    assert_int_equal(dsim_phase_parse("allreduc", &x), DSIM_EINVAL);
    assert_string_equal(dsim_phase_name(DSIM_PHASE_COUNT), "unknown");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hooks_go_changes_nothing),
        cmocka_unit_test(test_hooks_kill_is_a_silent_death),
        cmocka_unit_test(test_hooks_size_checked),
        cmocka_unit_test(test_phase_names),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
