/* Judging a finished run against its scenario's expect list (scenario.h):
 * each check it names runs (sim/check), and its verdict is held against
 * what the scenario expects of it; or the run's error against expect.error.
 * It sits above both the checks and the parser, so that the checks need
 * nothing from the scenario but what their context carries. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "scenario/scenario.h"

/* Writes a message into msg[cap], cut if need be (a long peer message is
 * cut rather than refused by -Wformat-truncation). */
static void judge_msg(char *msg, size_t cap, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void judge_msg(char *msg, size_t cap, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, cap, fmt, ap);
    va_end(ap);
}

bool dsim_check_needs_reference(const dsim_scenario *s)
{
    if (!s || s->expect_error)
        return false;
    for (size_t i = 0; i < s->n_expect; i++) {
        const dsim_check_ops *c = s->expect[i].check;
        if (!c || !c->available)
            continue;
        if (c->wants_reference ? (c->needs_reference || c->wants_reference(s->expect[i].values))
                               : c->needs_reference)
            return true;
    }
    return false;
}

size_t dsim_check_outcome_count(const dsim_scenario *s)
{
    if (!s)
        return 0;
    /* Without expectations a failed run still gets one row, "run". */
    return s->expect_error ? 1 : s->n_expect ? s->n_expect : 1;
}

static void expect_set(dsim_check_outcome *o, const char *name, bool expect_fail)
{
    memset(o, 0, sizeof *o);
    o->name = name;
    o->expect_fail = expect_fail;
    o->result.measured = NAN;
    o->result.expected = NAN;
}

static void expect_error_row(const dsim_check_ctx *ctx, dsim_check_outcome *o)
{
    const char *want = ctx->scenario->expect_error;
    expect_set(o, "error", false);
    const char *got = ctx->run ? ctx->run->error.msg : "";
    if (ctx->run_err == DSIM_OK) {
        judge_msg(o->result.message, sizeof o->result.message,
                  "the run succeeded, but the scenario expects it to fail with an error "
                  "containing \"%s\"",
                  want);
    } else if (!strstr(got, want)) {
        judge_msg(o->result.message, sizeof o->result.message,
                  "the run failed as expected, but with \"%s\" (%s), which does not contain "
                  "\"%s\"",
                  got, dsim_strerror(ctx->run_err), want);
    } else {
        o->check_passed = true;
        judge_msg(o->result.message, sizeof o->result.message, "failed as expected: %s", got);
    }
    o->result.passed = o->check_passed;
    o->passed = o->check_passed;
}

/* The scenario has faults and node_loss is judged (named or by default). */
static bool judge_faults_judged(const dsim_scenario *s)
{
    for (size_t i = 0; s->n_faults && i < s->n_expect; i++)
        if (s->expect[i].check && s->expect[i].check->judges_failed_runs)
            return true;
    return false;
}

dsim_err dsim_check_run_all(const dsim_check_ctx *ctx, dsim_check_outcome *out, size_t *n_out,
                            size_t *n_failed)
{
    if (!ctx || !ctx->scenario || !ctx->run || !out || !n_out || !n_failed)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "dsim_check_run_all needs a scenario, a run and room for the outcomes");
    const dsim_scenario *s = ctx->scenario;
    /* what the checks read of the scenario: its faults (node_loss) */
    dsim_check_ctx cx = *ctx;
    cx.n_faults = s->n_faults;
    *n_out = 0;
    *n_failed = 0;
    if (s->expect_error) {
        expect_error_row(ctx, &out[0]);
        *n_out = 1;
        *n_failed = out[0].passed ? 0 : 1;
        return DSIM_OK;
    }
    for (size_t i = 0; i < s->n_expect; i++) {
        const dsim_expect *e = &s->expect[i];
        dsim_check_outcome *o = &out[i];
        const dsim_check_ops *c = e->check;
        expect_set(o, c ? c->name : "?", e->expect_fail);
        o->by_default = e->by_default;
        char *msg = o->result.message;
        size_t cap = sizeof o->result.message;
        bool judged = false;
        if (!c) {
            judge_msg(msg, cap, "no check given");
        } else if (ctx->run_err != DSIM_OK && !c->judges_failed_runs && e->by_default &&
                   (ctx->run_err == DSIM_EHUNG || !judge_faults_judged(s))) {
            /* A check the scenario does not name says nothing about a run
             * that did not finish: the run's own row (or its hang report)
             * says it failed. */
            continue;
        } else if (ctx->run_err == DSIM_EHUNG && !c->judges_failed_runs) {
            /* the hang is told once, by the run's own report */
            judge_msg(msg, cap,
                      "not judged: the run hung, so there is no finished run to judge (the "
                      "run's hang report says where each worker was)");
        } else if (ctx->run_err != DSIM_OK && !c->judges_failed_runs && e->by_default) {
            /* Neither passed nor failed: the faults were meant to break the
             * run, and node_loss judges what they did. A check the scenario
             * names still fails on a run that did not finish. */
            judge_msg(msg, cap,
                      "not judged: the faults broke the run before it finished (%s), and "
                      "node_loss judges what they did; %s judges a finished run",
                      dsim_strerror(ctx->run_err), c->name);
            o->not_applicable = true;
            o->check_passed = true;
            o->passed = true;
            (*n_out)++;
            continue;
        } else if (ctx->run_err != DSIM_OK && !c->judges_failed_runs) {
            o->run_failed = true;
            judge_msg(msg, cap, "the run failed before it could be judged: %s (%s)",
                      ctx->run->error.msg[0] ? ctx->run->error.msg : "no message",
                      dsim_strerror(ctx->run_err));
        } else if (!c->available || !c->run) {
            judge_msg(msg, cap, "the %s check is not available in this build yet", c->name);
        } else if (s->train.synthetic_params > 0 && !c->judges_timing_only) {
            /* Neither passed nor failed: there is nothing to judge. */
            judge_msg(msg, cap,
                      "not applicable: a timing-only run (model.synthetic) moves no "
                      "numbers -- no parameters, gradients, losses or examples -- so %s "
                      "has nothing to compare; run a real model for it",
                      c->name);
            o->not_applicable = true;
            o->check_passed = !o->expect_fail;
            o->passed = true;
            (*n_out)++;
            continue;
        } else {
            dsim_check_result r;
            memset(&r, 0, sizeof r);
            r.measured = NAN;
            r.expected = NAN;
            dsim_err err = c->run(&cx, e->values, &r);
            if (err != DSIM_OK) {
                r.passed = false;
                judge_msg(r.message, sizeof r.message, "the check could not run: %s (%s)",
                          dsim_errmsg(), dsim_strerror(err));
            }
            o->result = r;
            o->check_passed = r.passed;
            judged = err == DSIM_OK;
            if (judged && r.not_judged) {
                /* neither passed nor failed, whatever the expectation */
                o->not_applicable = true;
                o->check_passed = !o->expect_fail;
                o->passed = true;
                (*n_out)++;
                continue;
            }
        }
        /* An unavailable check, a check that could not run or a failed run
         * is a failure whatever the expectation: only a check's own verdict
         * on a finished run can meet expect_fail. */
        o->passed = judged && o->check_passed != o->expect_fail;
        if (judged && o->expect_fail && !o->check_passed) {
            char tmp[sizeof o->result.message];
            judge_msg(tmp, sizeof tmp, "failed as expected: %s", o->result.message);
            memcpy(o->result.message, tmp, sizeof tmp);
        } else if (judged && o->expect_fail && o->check_passed) {
            char tmp[sizeof o->result.message];
            judge_msg(tmp, sizeof tmp, "expected to fail, but passed: %s", o->result.message);
            memcpy(o->result.message, tmp, sizeof tmp);
        }
        if (!o->passed)
            (*n_failed)++;
        (*n_out)++;
    }
    /* A scenario without expectations (or only checks judged by default,
     * which judge a finished run) asks at least that the run complete. */
    if (*n_out == 0 && ctx->run_err != DSIM_OK) {
        dsim_check_outcome *o = &out[0];
        expect_set(o, "run", false);
        judge_msg(o->result.message, sizeof o->result.message, "the run failed: %s (%s)",
                  ctx->run->error.msg[0] ? ctx->run->error.msg : "no message",
                  dsim_strerror(ctx->run_err));
        *n_out = 1;
        *n_failed = 1;
    }
    return DSIM_OK;
}
