/* A program of a project that uses dsim: runs two scenarios through the
 * harness (no results store) and prints each check: one with a built-in
 * strategy, one with this project's plugin (argv[1], its path).
 *
 *   consumer PLUGIN.so     exit 0 when every check met its expectation */
#include <stdio.h>
#include <string.h>

#include "dsim/strategy.h"
#include "harness/harness.h"

static int consumer_run(const char *name, const char *text)
{
    dsim_harness_result r;
    dsim_err e = dsim_harness_run_text(name, text, strlen(text), NULL, &r);
    if (e != DSIM_OK) {
        fprintf(stderr, "%s: %s\n", name, r.harness_msg[0] ? r.harness_msg : dsim_errmsg());
        dsim_harness_result_free(&r);
        return 2;
    }
    for (size_t i = 0; i < r.n_checks; i++)
        printf("%s: %-22s %s  %s\n", name, r.checks[i].name, r.checks[i].passed ? "PASS" : "FAIL",
               r.checks[i].result.message);
    int rc = r.n_checks > 0 && r.n_failed == 0 ? 0 : 1;
    printf("%s: %zu of %zu checks met their expectation, %llu steps\n", name,
           r.n_checks - r.n_failed, r.n_checks, (unsigned long long)r.steps);
    dsim_harness_result_free(&r);
    return rc;
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: consumer PLUGIN.so\n");
        return 2;
    }
    static const char builtin[] = "name: builtin\n"
                                  "cluster: {hosts: 2, devices_per_host: 2}\n"
                                  "strategy: {name: multi_worker_mirrored}\n"
                                  "data: {examples: 256, files: 4, global_batch: 32, epochs: 2}\n"
                                  "expect:\n"
                                  "  gradient_consistency: {max_rel_error: 1e-4}\n"
                                  "  shard_coverage: {}\n";
    char own[1024];
    snprintf(own, sizeof own,
             "name: own\n"
             "cluster: {hosts: 2, devices_per_host: 2}\n"
             "strategy: {name: consumer_mirrored, plugin: %s}\n"
             "data: {examples: 256, files: 4, global_batch: 32, epochs: 2}\n"
             "expect:\n"
             "  gradient_consistency: {max_rel_error: 1e-4}\n"
             "  convergence: {within_pct_of_reference: 1}\n",
             argv[1]);
    int a = consumer_run("builtin.yaml", builtin);
    int b = consumer_run("own.yaml", own);
    return a > b ? a : b;
}
