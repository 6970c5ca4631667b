/* libFuzzer target: the scenario parser (sim/scenario). Every input must
 * parse, or be refused with DSIM_EINVAL and a message that starts with
 * f.yaml:LINE:COLUMN inside the text; one that parses is checked for
 * runnability, its faults' detection bounds are computed and, when small
 * enough to be quick, it is planned (dsim plan). Crashes, leaks and
 * undefined behaviour are the sanitizers' to report.
 *
 * Seeds: scenarios/ and scenarios/faults/ (see tests/fuzz/README.md). */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <jansson.h>

#include "dsim/log.h"
#include "scenario/plan.h"
#include "scenario/scenario.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* A broken promise: abort, so that libFuzzer keeps the input. */
#define FZ_REQUIRE(cond)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "fuzz_scenario: %s failed: %s\n", #cond, dsim_errmsg());               \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int quiet;
    if (!quiet) {
        dsim_log_set_level(DSIM_LOG_ERROR);
        quiet = 1;
    }
    const char *text = (const char *)data;
    dsim_scenario *s = NULL;
    dsim_err e = dsim_scenario_parse("f.yaml", text, size, &s);
    if (e != DSIM_OK) {
        FZ_REQUIRE(s == NULL);
        FZ_REQUIRE(e == DSIM_EINVAL || e == DSIM_ENOMEM);
        if (e == DSIM_ENOMEM)
            return 0;
        int line = 0, col = 0, n = 0;
        const char *m = dsim_errmsg();
        FZ_REQUIRE(sscanf(m, "f.yaml:%d:%d: %n", &line, &col, &n) == 2 && n > 0);
        /* lines as YAML counts them: LF, CR LF, a lone CR, and NEL, LS, PS
         * in UTF-8 each end one */
        int lines = 1;
        for (size_t i = 0; i < size; i++) {
            uint8_t c = data[i];
            lines += c == '\n' || (c == '\r' && (i + 1 == size || data[i + 1] != '\n'));
            lines += c == 0xc2 && i + 1 < size && data[i + 1] == 0x85;
            lines += c == 0xe2 && i + 2 < size && data[i + 1] == 0x80 &&
                     (data[i + 2] == 0xa8 || data[i + 2] == 0xa9);
        }
        FZ_REQUIRE(line >= 1 && col >= 1 && line <= lines + 1);
        return 0;
    }
    FZ_REQUIRE(s != NULL);
    (void)dsim_scenario_runnable(s);
    for (size_t i = 0; i < s->n_faults; i++) {
        dsim_fault_detection d;
        dsim_scenario_fault_detection(s, i, &d);
    }
    const dsim_train_cfg *t = &s->train;
    if (t->data.n_examples <= 4096 && (long long)t->hosts * t->devices_per_host <= 64 &&
        t->epochs <= 100) {
        json_t *j = NULL;
        dsim_err pe = dsim_scenario_plan(s, &j);
        FZ_REQUIRE(pe != DSIM_ENOMEM && j != NULL);
        json_decref(j);
    }
    dsim_scenario_free(s);
    return 0;
}
