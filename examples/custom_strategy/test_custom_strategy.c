/* Your own strategy, checked from your own cmocka test: the plugin of this
 * folder run through the harness (harness/harness.h) on a scenario given as
 * text, judged by the checks of its expect: section. The test itself is
 * three lines; the scenario is the part you write for your strategy.
 *
 * The plugin is named by its file name: the harness finds it next to the
 * scenario's path, in $DSIM_PLUGIN_PATH, in this build tree or in the
 * installed plugin directory. Build it with meson (dependency('dsim-harness')
 * and cmocka) or: cc test_custom_strategy.c $(pkg-config --cflags --libs
 * dsim-harness cmocka). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>

#include "harness/harness.h"

static const char scenario[] = "name: custom_mirrored_2x2\n"
                               "cluster: {hosts: 2, devices_per_host: 2}\n"
                               "strategy: {name: custom_mirrored, plugin: libcustom_strategy.so}\n"
                               "data: {examples: 256, files: 4, global_batch: 32, epochs: 2}\n"
                               "expect:\n"
                               "  gradient_consistency: {max_rel_error: 1e-4}\n"
                               "  shard_coverage: {}\n"
                               "  convergence: {within_pct_of_reference: 1}\n";

static void test_custom_strategy(void **state)
{
    (void)state;
    dsim_harness_result r;
    assert_int_equal(dsim_harness_run_text("custom.yaml", scenario, strlen(scenario), NULL, &r),
                     DSIM_OK);
    assert_int_equal(r.n_failed, 0); /* every check met its expectation */
    dsim_harness_result_free(&r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_custom_strategy)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
