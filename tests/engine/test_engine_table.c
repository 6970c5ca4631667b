/* The engine table (sim/engine/engine.h): the built-ins and their flags,
 * lookup by name with the accepted names in the error, the checks at
 * registration, an engine registered from outside taken by the scenario
 * parser and judged by its flags, the runtime's flags in dsim/spi/rt.h, and
 * the rank program on every engine that has one (rounds in order, every
 * rank's result, a stop). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "dsim/rt.h"
#include "dsim/spi/rt.h"
#include "engine/engine.h"
#include "engine/sim.h"
#include "scenario/scenario.h"

static void test_builtins(void **state)
{
    (void)state;
    const dsim_engine_ops *t, *p, *s;
    assert_int_equal(dsim_engine_find("threads", &t), DSIM_OK);
    assert_int_equal(dsim_engine_find("processes", &p), DSIM_OK);
    assert_int_equal(dsim_engine_find("sim", &s), DSIM_OK);
    const dsim_engine_ops *dflt;
    assert_int_equal(dsim_engine_find(NULL, &dflt), DSIM_OK);
    assert_ptr_equal(dflt, t);
    assert_true(t->flags & DSIM_ENGINE_ONE_SPACE);
    assert_false(t->flags & (DSIM_ENGINE_VIRTUAL_TIME | DSIM_ENGINE_FORKS));
    assert_true(p->flags & DSIM_ENGINE_FORKS);
    assert_true(p->flags & DSIM_ENGINE_REAL_LINKS);
    assert_false(p->flags & (DSIM_ENGINE_ONE_SPACE | DSIM_ENGINE_INPROC));
    assert_true(s->flags & DSIM_ENGINE_VIRTUAL_TIME);
    assert_true(s->flags & DSIM_ENGINE_DETERMINISTIC);
    assert_false(s->flags & (DSIM_ENGINE_TCP | DSIM_ENGINE_THREAD_PER_REPLICA));
    assert_ptr_equal(dsim_engine_with(DSIM_ENGINE_DETERMINISTIC), s);
    assert_ptr_equal(dsim_engine_with(DSIM_ENGINE_HOSTS), p);
    assert_null(dsim_engine_with(DSIM_ENGINE_FORKS | DSIM_ENGINE_VIRTUAL_TIME));
    char names[160];
    assert_string_equal(dsim_engine_names(0, false, names, sizeof names),
                        "threads, processes, sim");
    assert_string_equal(dsim_engine_names(0, true, names, sizeof names), "threads, processes");
    assert_string_equal(dsim_engine_names(DSIM_ENGINE_TCP, false, names, sizeof names),
                        "threads, processes");
    assert_int_equal(dsim_engine_find("warp9", &t), DSIM_ENOTSUP);
    assert_non_null(strstr(dsim_errmsg(), "warp9"));
    assert_non_null(strstr(dsim_errmsg(), "threads, processes, sim"));
}

/* The runtimes' own flags: what src/ asks instead of a name. */
static void test_runtime_flags(void **state)
{
    (void)state;
    assert_int_equal(dsim_sim_engine_register(), DSIM_OK);
    assert_true(dsim_rt_engine_flags("sim") & DSIM_RT_VIRTUAL_TIME);
    assert_true(dsim_rt_engine_flags("sim") & DSIM_RT_DETERMINISTIC);
    assert_false(dsim_rt_engine_flags("threads") & DSIM_RT_VIRTUAL_TIME);
    assert_false(dsim_rt_engine_flags(NULL) & DSIM_RT_VIRTUAL_TIME);
    assert_int_equal(dsim_rt_engine_flags("no-such-runtime"), 0);
}

static dsim_err warp_prepare(void)
{
    return DSIM_OK;
}

static dsim_err warp_train(const dsim_train_cfg *cfg, const dsim_engine_attempt *a,
                           dsim_train_result *res, dsim_engine_outcome *out)
{
    (void)cfg;
    (void)a;
    memset(res, 0, sizeof *res);
    dsim_engine_outcome_init(out);
    return DSIM_ERR(DSIM_ENOTSUP, -1, "warp does not train");
}

static void test_register(void **state)
{
    (void)state;
    dsim_engine_ops bad = {.size = sizeof bad - 1, .name = "warp"};
    assert_int_equal(dsim_engine_register(&bad), DSIM_EINVAL);
    assert_non_null(strstr(dsim_errmsg(), "size"));
    bad = (dsim_engine_ops){.size = sizeof bad,
                            .name = "warp",
                            .summary = "a test engine",
                            .runtime = "threads",
                            .prepare = warp_prepare};
    assert_int_equal(dsim_engine_register(&bad), DSIM_EINVAL);
    assert_non_null(strstr(dsim_errmsg(), "'train'"));
    static const dsim_engine_ops dup = {.size = sizeof dup,
                                        .name = "sim",
                                        .summary = "a second sim",
                                        .runtime = "sim",
                                        .prepare = warp_prepare,
                                        .train = warp_train};
    assert_int_equal(dsim_engine_register(&dup), DSIM_EINVAL);
    assert_non_null(strstr(dsim_errmsg(), "already registered"));

    /* one more engine: found by name, in the lists, taken by the scenario
     * parser, and judged by its flags (virtual time: a timing-only model
     * is runnable on it; no thread per replica: no such bound) */
    static const dsim_engine_ops warp = {.size = sizeof warp,
                                         .name = "warp",
                                         .summary = "a test engine",
                                         .flags = DSIM_ENGINE_VIRTUAL_TIME | DSIM_ENGINE_ONE_SPACE |
                                                  DSIM_ENGINE_INPROC,
                                         .runtime = "threads",
                                         .prepare = warp_prepare,
                                         .train = warp_train};
    assert_int_equal(dsim_engine_register(&warp), DSIM_OK);
    assert_int_equal(dsim_engine_register(&warp), DSIM_OK); /* the same table again */
    const dsim_engine_ops *w;
    assert_int_equal(dsim_engine_find("warp", &w), DSIM_OK);
    assert_ptr_equal(w, &warp);
    char names[160];
    assert_string_equal(dsim_engine_names(0, false, names, sizeof names),
                        "threads, processes, sim, warp");
    assert_string_equal(dsim_engine_names(DSIM_ENGINE_VIRTUAL_TIME, false, names, sizeof names),
                        "sim, warp");
    static const char text[] = "name: w\nengine: warp\ncluster: {hosts: 2048}\n"
                               "model: {synthetic: {parameters: 1000, flops_per_example: 1000}}\n";
    dsim_scenario *s = NULL;
    if (dsim_scenario_parse("w.yaml", text, strlen(text), &s) != DSIM_OK)
        fail_msg("engine: warp does not parse: %s", dsim_errmsg());
    assert_string_equal(dsim_scenario_engine(s), "warp");
    if (dsim_scenario_runnable(s) != DSIM_OK)
        fail_msg("warp's flags were not asked: %s", dsim_errmsg());
    dsim_scenario_free(s);
    /* the same file on threads: a thread per replica, and no virtual clock */
    static const char on_threads[] = "name: w\nengine: threads\ncluster: {hosts: 2048}\n";
    assert_int_equal(dsim_scenario_parse("t.yaml", on_threads, strlen(on_threads), &s), DSIM_OK);
    assert_int_equal(dsim_scenario_runnable(s), DSIM_ENOTSUP);
    assert_non_null(strstr(dsim_errmsg(), "replicas on engine threads"));
    dsim_scenario_free(s);
}

/* ---- the rank program ---- */

typedef struct ring_res {
    int rank, from, round;
    dsim_err err;
} ring_res;

/* Every rank sends round*100 + its rank to its right and receives from its
 * left. */
static void ring_main(dsim_ep *ep, int rank, int round, void *result, void *user)
{
    int n = *(const int *)user;
    ring_res *r = result;
    r->rank = rank;
    r->round = round;
    int out = round * 100 + rank, in = -1;
    dsim_req *q[2] = {NULL, NULL};
    int64_t dl = dsim_rt_deadline(dsim_ep_rt(ep), 20000000000LL);
    r->err = dsim_irecv(ep, (rank + n - 1) % n, 7, (uint32_t)round, &in, sizeof in, &q[0]);
    if (r->err == DSIM_OK)
        r->err = dsim_isend(ep, (rank + 1) % n, 7, (uint32_t)round, &out, sizeof out, &q[1]);
    if (r->err == DSIM_OK)
        r->err = dsim_waitall(q, 2, dl, NULL);
    r->from = in;
}

typedef struct ring_seen {
    int n, rounds_seen, stop_at;
    int bad;
} ring_seen;

static ring_seen ring_state;

static int ring_round(int round, const void *results, void *user)
{
    (void)user;
    ring_seen *s = &ring_state;
    const ring_res *r = results;
    if (round != s->rounds_seen)
        s->bad++;
    for (int k = 0; k < s->n; k++) {
        int left = (k + s->n - 1) % s->n;
        if (r[k].rank != k || r[k].round != round || r[k].err != DSIM_OK ||
            r[k].from != round * 100 + left)
            s->bad++;
    }
    s->rounds_seen++;
    return round == s->stop_at;
}

static void ring_on(const char *engine, const char *transport, int rounds, int stop_at)
{
    const dsim_engine_ops *e;
    assert_int_equal(dsim_engine_find(engine, &e), DSIM_OK);
    assert_non_null(e->ranks);
    static int n = 3;
    ring_state = (ring_seen){.n = n, .stop_at = stop_at};
    dsim_engine_ranks job = {.nranks = n,
                             .transport = transport,
                             .rounds = rounds,
                             .rank_main = ring_main,
                             .user = &n,
                             .result_size = sizeof(ring_res),
                             .on_round = ring_round};
    if (e->ranks(&job) != DSIM_OK)
        fail_msg("%s over %s: %s", engine, transport, dsim_errmsg());
    assert_int_equal(ring_state.bad, 0);
    assert_int_equal(ring_state.rounds_seen,
                     stop_at >= 0 && stop_at < rounds ? stop_at + 1 : rounds);
}

static void test_ranks(void **state)
{
    (void)state;
    ring_on("threads", "inproc", 3, -1);
    ring_on("threads", "tcp", 2, -1);
    ring_on("processes", "inproc", 3, -1); /* its ranks are processes: tcp whatever is asked */
    ring_on("threads", "inproc", 4, 1);    /* stopped after round 1 */
    ring_on("processes", NULL, 4, 0);      /* stopped after round 0; the ranks are ended */
    const dsim_engine_ops *s;
    assert_int_equal(dsim_engine_find("sim", &s), DSIM_OK);
    assert_null(s->ranks);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_builtins),
        cmocka_unit_test(test_runtime_flags),
        cmocka_unit_test(test_register),
        cmocka_unit_test(test_ranks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
