/* `dsim validate` and `dsim plan`, run as programs: exit status, what they
 * print, and the plan's JSON. The executable's path comes from $DSIM_EXE
 * (set by meson). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include <jansson.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "dsim/spi/rt.h"
#include "scenario/scenario.h"

static const char *cli_exe;
static char cli_dir[] = "/tmp/dsim-scen-cli-XXXXXX";

typedef struct cli_result {
    int status; /* exit status, or -1 if it did not exit normally */
    char out[1048576];
    char err[8192];
} cli_result;

static cli_result cli_res;

static void cli_slurp(FILE *f, char *buf, size_t cap)
{
    rewind(f);
    size_t n = fread(buf, 1, cap - 1, f);
    buf[n] = '\0';
    fclose(f);
}

/* Runs `dsim ARGS...` into cli_res. */
static cli_result *cli_run(const char *const *args)
{
    char *argv[16];
    int argc = 0;
    argv[argc++] = (char *)cli_exe;
    for (int i = 0; args[i]; i++) {
        assert_true(argc < 15);
        argv[argc++] = (char *)args[i];
    }
    argv[argc] = NULL;
    FILE *out = tmpfile(), *err = tmpfile();
    assert_non_null(out);
    assert_non_null(err);
    posix_spawn_file_actions_t fa;
    assert_int_equal(posix_spawn_file_actions_init(&fa), 0);
    assert_int_equal(posix_spawn_file_actions_adddup2(&fa, fileno(out), STDOUT_FILENO), 0);
    assert_int_equal(posix_spawn_file_actions_adddup2(&fa, fileno(err), STDERR_FILENO), 0);
    pid_t pid;
    int rc = posix_spawn(&pid, cli_exe, &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    assert_int_equal(rc, 0);
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    cli_res.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    cli_slurp(out, cli_res.out, sizeof cli_res.out);
    cli_slurp(err, cli_res.err, sizeof cli_res.err);
    return &cli_res;
}

/* Writes text to DIR/name and returns the path (static buffer per slot). */
static const char *cli_file(int slot, const char *name, const char *text)
{
    static char paths[8][256];
    snprintf(paths[slot], sizeof paths[slot], "%s/%s", cli_dir, name);
    FILE *f = fopen(paths[slot], "w");
    assert_non_null(f);
    assert_int_equal(fputs(text, f) >= 0, 1);
    assert_int_equal(fclose(f), 0);
    return paths[slot];
}

static const char good_yaml[] = "name: good\ncluster: {hosts: 2, devices_per_host: 2}\n"
                                "data: {examples: 14, files: 2, shard_policy: file, "
                                "global_batch: 7}\n";

static void test_validate(void **state)
{
    (void)state;
    const char *good = cli_file(0, "good.yaml", good_yaml);
    const char *bad = cli_file(1, "bad.yaml", "name: bad\ncluster:\n  hosts: two\n");
    const char *later = cli_file(2, "later.yaml", "name: later\ncluster: {hosts: 2048}\n");

    cli_result *r = cli_run((const char *[]){"validate", good, NULL});
    assert_int_equal(r->status, 0);
    char want[1024];
    /* it names no check: it says which are judged by default */
    snprintf(want, sizeof want,
             "%s: judged by default: gradient_consistency, shard_coverage (NAME: off under "
             "expect: leaves one out)\n%s: ok\n",
             good, good);
    assert_string_equal(r->out, want);

    r = cli_run((const char *[]){"validate", bad, NULL});
    assert_int_equal(r->status, 2);
    snprintf(want, sizeof want, "%s:3:10: cluster.hosts: 'two' is not a whole number", bad);
    if (!strstr(r->out, want))
        fail_msg("expected '%s' in: %s", want, r->out);

    /* well-formed but not runnable here: refused, with the place */
    r = cli_run((const char *[]){"validate", later, NULL});
    assert_int_equal(r->status, 2);
    snprintf(want, sizeof want,
             "%s:2:18: cluster: 2048 host(s) x 1 device(s) is 2048 replicas on engine threads",
             later);
    if (!strstr(r->out, want))
        fail_msg("expected '%s' in: %s", want, r->out);

    /* several files: each reported, 2 if any is bad; --quiet keeps the bad */
    r = cli_run((const char *[]){"validate", good, bad, later, NULL});
    assert_int_equal(r->status, 2);
    snprintf(want, sizeof want, "%s: ok\n", good);
    assert_non_null(strstr(r->out, want));
    assert_non_null(strstr(r->out, bad));
    assert_non_null(strstr(r->out, later));
    r = cli_run((const char *[]){"validate", "--quiet", good, bad, NULL});
    assert_int_equal(r->status, 2);
    assert_null(strstr(r->out, "ok"));
    assert_non_null(strstr(r->out, bad));
    r = cli_run((const char *[]){"validate", "--quiet", good, good, NULL});
    assert_int_equal(r->status, 0);
    assert_string_equal(r->out, "");

    /* each fault's detection bound; a loss never detected is a warning,
     * which --quiet still prints */
    const char *faults = cli_file(4, "faults.yaml",
                                  "name: faults\ncluster: {hosts: 4}\n"
                                  "strategy: {timeout: 0, health_check: {interval: 100ms, "
                                  "timeout: 50ms, retries: 2}}\n"
                                  "faults:\n"
                                  "  - {what: kill, at_step: 5, rank: 3}\n");
    const char *never = cli_file(5, "never.yaml",
                                 "name: never\ncluster: {hosts: 2}\n"
                                 "strategy: {timeout: 0s, health_check: {interval: 0}}\n"
                                 "faults:\n"
                                 "  - {what: kill, at_step: 5, worker: 1}\n");
    r = cli_run((const char *[]){"validate", faults, never, NULL});
    snprintf(want, sizeof want,
             "%s:5:5: faults[0] (kill rank 3 at step 5): a lost peer is detected within 210ms",
             faults);
    if (!strstr(r->out, want))
        fail_msg("expected '%s' in: %s", want, r->out);
    snprintf(want, sizeof want,
             "%s:5:5: warning: faults[0] (kill worker 1 at step 5): a lost peer is never "
             "detected: strategy.timeout is 0 (no deadline) and the health check is off",
             never);
    if (!strstr(r->out, want))
        fail_msg("expected '%s' in: %s", want, r->out);
    r = cli_run((const char *[]){"validate", "--quiet", faults, never, NULL});
    assert_null(strstr(r->out, "detected within"));
    assert_non_null(strstr(r->out, want));
    assert_null(strstr(r->out, "never fires")); /* step 5 is in the run */

    /* a fault at a step the job never reaches (4 steps: 0 to 3), by
     * at_step or at_phase with at_step: a warning with its place, which
     * --quiet prints; the last step in the run is none */
    const char *late = cli_file(7, "late.yaml",
                                "name: late\ncluster: {hosts: 2}\n"
                                "strategy: {timeout: 2s}\n"
                                "data: {examples: 64, files: 2, global_batch: 16, epochs: 1}\n"
                                "faults:\n"
                                "  - {what: kill, at_step: 3, worker: 1}\n"
                                "  - {what: kill, at_step: 4, worker: 1}\n"
                                "  - {what: kill, at_phase: allreduce, at_step: 40, worker: 0}\n");
    r = cli_run((const char *[]){"validate", "--quiet", late, NULL});
    assert_int_equal(r->status, 0);
    snprintf(want, sizeof want,
             "%s:7:5: warning: faults[1] (kill worker 1 at step 4) never fires: the job has 4 "
             "steps (0 to 3)",
             late);
    if (!strstr(r->out, want))
        fail_msg("expected '%s' in: %s", want, r->out);
    snprintf(want, sizeof want,
             "%s:8:5: warning: faults[2] (kill worker 0 at phase allreduce of step 40) never "
             "fires",
             late);
    if (!strstr(r->out, want))
        fail_msg("expected '%s' in: %s", want, r->out);
    assert_null(strstr(r->out, "faults[0] (kill worker 1 at step 3) never"));

    /* engine processes with more workers than the health check can answer
     * for on this machine's CPUs: a warning (with --quiet too); the same
     * job at the limit, or with the check off, none */
    int over = DSIM_SCEN_HEALTH_WORKERS_PER_CPU * dsim_rt_cpus() + 1;
    char text[512];
    snprintf(text, sizeof text,
             "name: crowded\nengine: processes\ncluster: {hosts: %d}\n"
             "data: {examples: %d, global_batch: %d, epochs: 1}\n",
             over, over, over);
    const char *crowded = cli_file(7, "crowded.yaml", text);
    r = cli_run((const char *[]){"validate", "--quiet", crowded, NULL});
    snprintf(want, sizeof want, "%s: warning: %d worker processes with the health check on share",
             crowded, over);
    if (over <= 4096 && !strstr(r->out, want))
        fail_msg("expected '%s' in: %s", want, r->out);
    snprintf(text, sizeof text,
             "name: crowded\nengine: processes\ncluster: {hosts: %d}\n"
             "strategy: {health_check: {interval: 0}}\n"
             "data: {examples: %d, global_batch: %d, epochs: 1}\n",
             over, over, over);
    crowded = cli_file(7, "crowded.yaml", text);
    r = cli_run((const char *[]){"validate", "--quiet", crowded, NULL});
    assert_null(strstr(r->out, "worker processes with the health check on"));
    snprintf(text, sizeof text,
             "name: crowded\nengine: processes\ncluster: {hosts: %d}\n"
             "data: {examples: %d, global_batch: %d, epochs: 1}\n",
             over - 1, over, over - 1);
    crowded = cli_file(7, "crowded.yaml", text);
    r = cli_run((const char *[]){"validate", "--quiet", crowded, NULL});
    assert_null(strstr(r->out, "worker processes with the health check on"));

    /* a checkpoint directory that does not exist: refused with its place */
    const char *nodir =
        cli_file(6, "nodir.yaml", "name: nodir\ncheckpoint:\n  path: /nonexistent-dsim/c.ckpt\n");
    r = cli_run((const char *[]){"validate", nodir, NULL});
    assert_int_equal(r->status, 2);
    snprintf(want, sizeof want,
             "%s:3:9: checkpoint.path: the directory '/nonexistent-dsim' of "
             "'/nonexistent-dsim/c.ckpt' does not exist",
             nodir);
    if (!strstr(r->out, want))
        fail_msg("expected '%s' in: %s", want, r->out);

    /* a file that is not there, no file, an unknown option */
    r = cli_run((const char *[]){"validate", "/nonexistent/x.yaml", NULL});
    assert_int_equal(r->status, 2);
    assert_non_null(strstr(r->out, "/nonexistent/x.yaml: cannot open"));
    r = cli_run((const char *[]){"validate", NULL});
    assert_int_equal(r->status, 2);
    assert_non_null(strstr(r->err, "no scenario file"));
    r = cli_run((const char *[]){"validate", "--strict", good, NULL});
    assert_int_equal(r->status, 2);
    assert_non_null(strstr(r->err, "--strict"));

    /* --defaults prints a scenario that validates and states the defaults */
    r = cli_run((const char *[]){"validate", "--defaults", NULL});
    assert_int_equal(r->status, 0);
    assert_non_null(strstr(r->out, "hosts: 1"));
    assert_non_null(strstr(r->out, "timeout: 30s"));
    dsim_scenario *s = NULL;
    if (dsim_scenario_parse("defaults", r->out, strlen(r->out), &s) != DSIM_OK)
        fail_msg("--defaults does not parse: %s", dsim_errmsg());
    assert_int_equal(dsim_scenario_runnable(s), DSIM_OK);
    dsim_scenario_free(s);
    const char *defs = cli_file(3, "defaults.yaml", r->out);
    r = cli_run((const char *[]){"validate", defs, NULL});
    assert_int_equal(r->status, 0);
}

static json_t *jpath(json_t *j, const char *a, const char *b, const char *c)
{
    j = json_object_get(j, a);
    if (b)
        j = json_object_get(j, b);
    if (c)
        j = json_object_get(j, c);
    return j;
}

static void test_plan(void **state)
{
    (void)state;
    const char *good = cli_file(0, "good.yaml", good_yaml);
    cli_result *r = cli_run((const char *[]){"plan", good, NULL});
    if (r->status != 0)
        fail_msg("dsim plan exited %d: %s", r->status, r->err);
    json_error_t je;
    json_t *j = json_loads(r->out, 0, &je);
    if (!j)
        fail_msg("not JSON (%s at line %d): %s", je.text, je.line, r->out);

    /* the cluster */
    assert_int_equal(json_integer_value(jpath(j, "cluster", "hosts", NULL)), 2);
    assert_int_equal(json_integer_value(jpath(j, "cluster", "devices_per_host", NULL)), 2);
    assert_int_equal(json_integer_value(jpath(j, "cluster", "num_replicas", NULL)), 4);
    assert_int_equal(json_integer_value(jpath(j, "cluster", "chief", "worker")), 0);
    json_t *reps = jpath(j, "cluster", "replicas", NULL);
    assert_int_equal(json_array_size(reps), 4);
    json_t *r3 = json_array_get(reps, 3);
    assert_int_equal(json_integer_value(json_object_get(r3, "worker")), 1);
    assert_int_equal(json_integer_value(json_object_get(r3, "device")), 1);
    assert_string_equal(json_string_value(jpath(j, "strategy", "name", NULL)),
                        "multi_worker_mirrored");
    assert_string_equal(json_string_value(jpath(j, "strategy", "communication", "requested")),
                        "auto");
    assert_non_null(json_string_value(jpath(j, "strategy", "communication", "applied")));

    /* the data plan: data.h's example G=7, W=2, R=2 over two files of 7 */
    json_t *d = json_object_get(j, "data");
    assert_string_equal(json_string_value(jpath(d, "shard_policy", "requested", NULL)), "file");
    assert_string_equal(json_string_value(jpath(d, "shard_policy", "applied", NULL)), "file");
    assert_int_equal(json_integer_value(json_object_get(d, "steps_per_epoch")), 2);
    json_t *bs = jpath(d, "first_epoch", "batch_sizes", NULL);
    static const int64_t want[2][4] = {{2, 2, 2, 1}, {2, 1, 2, 2}};
    assert_int_equal(json_array_size(bs), 2);
    for (size_t s = 0; s < 2; s++)
        for (size_t i = 0; i < 4; i++)
            assert_int_equal(json_integer_value(json_array_get(json_array_get(bs, s), i)),
                             want[s][i]);
    json_t *ws = json_object_get(d, "workers");
    assert_int_equal(json_array_size(ws), 2);
    for (size_t w = 0; w < 2; w++) {
        json_t *wo = json_array_get(ws, w);
        json_t *files = json_object_get(wo, "files");
        assert_int_equal(json_array_size(files), 1);
        assert_int_equal(json_integer_value(json_array_get(files, 0)), (json_int_t)w);
        json_t *el = json_object_get(wo, "elements");
        assert_int_equal(json_integer_value(json_object_get(el, "count")), 7);
        json_t *rg = json_array_get(json_object_get(el, "ranges"), 0);
        assert_int_equal(json_integer_value(json_array_get(rg, 0)), (json_int_t)(7 * w));
        assert_int_equal(json_integer_value(json_array_get(rg, 1)), (json_int_t)(7 * w + 6));
    }
    assert_true(json_is_null(json_object_get(j, "error")));
    assert_true(json_is_true(json_object_get(j, "runnable")));
    json_decref(j);

    /* --json is the same */
    r = cli_run((const char *[]){"plan", "--json", good, NULL});
    assert_int_equal(r->status, 0);
    j = json_loads(r->out, 0, &je);
    assert_non_null(j);
    json_decref(j);

    /* FILE with fewer files than workers: exit 2, the error in the JSON and
     * on stderr */
    const char *few = cli_file(
        1, "few.yaml", "name: few\ncluster: {hosts: 3}\ndata: {files: 2, shard_policy: file}\n");
    r = cli_run((const char *[]){"plan", few, NULL});
    assert_int_equal(r->status, 2);
    j = json_loads(r->out, 0, &je);
    if (!j)
        fail_msg("not JSON: %s", r->out);
    const char *err = json_string_value(json_object_get(j, "error"));
    assert_non_null(err);
    assert_non_null(strstr(err, "fewer than the 3 workers"));
    /* with the place of the data's layout */
    char want_at[600];
    snprintf(want_at, sizeof want_at, "%s:3:32: data: could not apply FILE sharding", few);
    if (!strstr(err, want_at) || !strstr(r->err, want_at))
        fail_msg("expected '%s' in: %s and %s", want_at, err, r->err);
    /* "runnable" agrees with the exit status */
    assert_true(json_is_false(json_object_get(j, "runnable")));
    const char *why = json_string_value(json_object_get(j, "not_runnable"));
    assert_non_null(why);
    assert_non_null(strstr(why, "fewer than the 3 workers"));
    json_decref(j);

    /* not runnable in this build: the same */
    const char *later = cli_file(
        3, "later.yaml",
        "name: later\ncluster: {hosts: 2048}\ndata: {shard_policy: data, global_batch: 4096}\n");
    r = cli_run((const char *[]){"plan", later, NULL});
    assert_int_equal(r->status, 2);
    j = json_loads(r->out, 0, &je);
    if (!j)
        fail_msg("not JSON: %s", r->out);
    assert_true(json_is_false(json_object_get(j, "runnable")));
    assert_non_null(
        strstr(json_string_value(json_object_get(j, "not_runnable")), "engine sim runs up to"));
    assert_true(json_is_null(json_object_get(j, "error")));
    json_decref(j);

    /* a file that does not parse: exit 2, the place on stderr, no JSON */
    const char *bad = cli_file(2, "bad.yaml", "name: bad\ndata: {epochs: 0}\n");
    r = cli_run((const char *[]){"plan", bad, NULL});
    assert_int_equal(r->status, 2);
    assert_string_equal(r->out, "");
    char want_err[512];
    snprintf(want_err, sizeof want_err, "%s:2:16: data.epochs", bad);
    assert_non_null(strstr(r->err, want_err));

    r = cli_run((const char *[]){"plan", NULL});
    assert_int_equal(r->status, 2);
    r = cli_run((const char *[]){"plan", good, bad, NULL});
    assert_int_equal(r->status, 2);
    assert_non_null(strstr(r->err, "one scenario at a time"));
}

/* A plugin named by a path out of the scenario's folder, or next to it:
 * validate and plan say which file dsim run will load and that loading it
 * runs its code (neither loads it: the "plugin" here is not even an ELF
 * file). */
static void test_plugin_notice(void **state)
{
    (void)state;
    char sc[300], lib[300], so[340], near[340], real[PATH_MAX], real_near[PATH_MAX];
    snprintf(sc, sizeof sc, "%s/sc", cli_dir);
    snprintf(lib, sizeof lib, "%s/lib", cli_dir);
    assert_int_equal(mkdir(sc, 0700), 0);
    assert_int_equal(mkdir(lib, 0700), 0);
    snprintf(so, sizeof so, "%s/libx.so", lib);
    snprintf(near, sizeof near, "%s/libx.so", sc);
    FILE *f = fopen(so, "w");
    assert_non_null(f);
    fclose(f);
    f = fopen(near, "w");
    assert_non_null(f);
    fclose(f);
    assert_non_null(realpath(so, real));
    assert_non_null(realpath(near, real_near));
    const char *up = cli_file(5, "sc/up.yaml",
                              "name: up\ncluster: {hosts: 2}\nstrategy:\n  name: mine\n"
                              "  plugin: ../lib/libx.so\n");
    const char *by = cli_file(6, "sc/by.yaml",
                              "name: by\ncluster: {hosts: 2}\nstrategy:\n  name: mine\n"
                              "  plugin: libx.so\n");
    char want[2 * PATH_MAX + 600];
    cli_result *r = cli_run((const char *[]){"validate", "--quiet", up, by, NULL});
    assert_int_equal(r->status, 0);
    snprintf(want, sizeof want,
             "%s:5:11: warning: strategy.plugin: 'dsim run' will load %s, outside the scenario "
             "file's folder (the path climbs out of it); loading a plugin runs its code",
             up, real);
    if (!strstr(r->out, want))
        fail_msg("expected '%s' in: %s", want, r->out);
    /* next to the file: a note, left out by --quiet */
    assert_null(strstr(r->out, real_near));
    r = cli_run((const char *[]){"validate", by, NULL});
    assert_int_equal(r->status, 0);
    snprintf(want, sizeof want,
             "%s:5:11: strategy.plugin: 'dsim run' will load %s; loading a plugin runs its code "
             "in the dsim process",
             by, real_near);
    if (!strstr(r->out, want))
        fail_msg("expected '%s' in: %s", want, r->out);
    r = cli_run((const char *[]){"plan", up, NULL});
    assert_int_equal(r->status, 0);
    json_error_t je;
    json_t *j = json_loads(r->out, 0, &je);
    assert_non_null(j);
    json_t *pl = json_object_get(j, "plugin");
    assert_non_null(pl);
    assert_string_equal(json_string_value(json_object_get(pl, "file")), real);
    assert_true(json_is_true(json_object_get(pl, "outside_scenario_folder")));
    assert_true(json_is_true(json_object_get(pl, "loading_runs_its_code")));
    json_decref(j);
    snprintf(want, sizeof want,
             "dsim plan: %s:5:11: warning: strategy.plugin: 'dsim run' will load %s", up, real);
    if (!strstr(r->err, want))
        fail_msg("expected '%s' in: %s", want, r->err);
}

static int cli_setup(void **state)
{
    (void)state;
    return mkdtemp(cli_dir) ? 0 : -1;
}

static int cli_teardown(void **state)
{
    (void)state;
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", cli_dir);
    return system(cmd) == 0 ? 0 : -1;
}

int main(void)
{
    cli_exe = getenv("DSIM_EXE");
    if (!cli_exe || !*cli_exe) {
        fprintf(stderr, "DSIM_EXE is not set; run through meson test\n");
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_validate),
        cmocka_unit_test(test_plan),
        cmocka_unit_test(test_plugin_notice),
    };
    return cmocka_run_group_tests(tests, cli_setup, cli_teardown);
}
