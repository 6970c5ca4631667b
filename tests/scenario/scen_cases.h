/* Helpers the scenario tests share: a file that must parse, and a table of
 * files that must be refused, each with the FILE:LINE:COL its message
 * starts with and words it must hold (the place and the fix). */
#ifndef DSIM_TESTS_SCEN_CASES_H
#define DSIM_TESTS_SCEN_CASES_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <cmocka.h>

#include "scenario/scenario.h"

typedef struct scen_err_case {
    const char *yaml;
    int line, col;        /* where in t.yaml the message points */
    const char *words[3]; /* what it must say, up to 3 */
} scen_err_case;

static inline dsim_scenario *scen_parse_ok(const char *text)
{
    dsim_scenario *s = NULL;
    if (dsim_scenario_parse("t.yaml", text, strlen(text), &s) != DSIM_OK)
        fail_msg("unexpected error: %s\n--- in:\n%s", dsim_errmsg(), text);
    return s;
}

static inline void scen_expect_errors(const scen_err_case *cases, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        const scen_err_case *c = &cases[i];
        dsim_scenario *s = NULL;
        dsim_err e = dsim_scenario_parse("t.yaml", c->yaml, strlen(c->yaml), &s);
        if (e != DSIM_EINVAL)
            fail_msg("case %zu: expected DSIM_EINVAL, got %d (%s)", i, (int)e, dsim_errmsg());
        char where[64];
        snprintf(where, sizeof where, "t.yaml:%d:%d: ", c->line, c->col);
        const char *msg = dsim_errmsg();
        if (strncmp(msg, where, strlen(where)) != 0)
            fail_msg("case %zu: expected '%s' first, got: %s", i, where, msg);
        for (int k = 0; k < 3 && c->words[k]; k++)
            if (!strstr(msg, c->words[k]))
                fail_msg("case %zu: expected '%s' in: %s", i, c->words[k], msg);
    }
}

#endif
