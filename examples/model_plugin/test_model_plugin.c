/* The conv1d model plugin, through dsim:
 *   - its gradient, as dsim_model_loss_grad returns it (scaled and rounded
 *     by dsim), agrees with finite differences of dsim_model_eval's loss;
 *   - the loader refuses what is not a model plugin, naming the file;
 *   - a scenario on .npy data with `model: {plugin: ...}` passes its
 *     checks (gradient consistency, shard coverage, convergence against the
 *     one-device reference) on every engine; `dsim export` writes the run;
 *     --no-plugins and a plugin whose loss does not fit the data are refused.
 * $DSIM_EXE is dsim, $DSIM_MODEL_PLUGIN the plugin, $DSIM_CUSTOM_PLUGIN a
 * shared object that is a strategy plugin, not a model one. */
#include <fcntl.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmocka.h>

#include "dsim/npy.h"
#include "dsim/rng.h"
#include "dsim/spi/model.h"

static const char *mp_exe, *mp_plugin, *mp_other;
static char mp_dir[] = "/tmp/dsim-model-plugin-XXXXXX";
static char mp_out[65536], mp_err[16384];

static const char *mp_path(int slot, const char *name)
{
    static char buf[8][600];
    snprintf(buf[slot], sizeof buf[slot], "%s/%s", mp_dir, name);
    return buf[slot];
}

static void mp_slurp(const char *path, char *buf, size_t cap)
{
    FILE *f = fopen(path, "rb");
    size_t n = f ? fread(buf, 1, cap - 1, f) : 0;
    buf[n] = '\0';
    if (f)
        fclose(f);
}

static int mp_run(const char *first, ...)
{
    char *args[16];
    int n = 0;
    args[n++] = (char *)mp_exe;
    va_list ap;
    va_start(ap, first);
    for (const char *a = first; a && n < 15; a = va_arg(ap, const char *))
        args[n++] = (char *)a;
    va_end(ap);
    args[n] = NULL;
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int o = open(mp_path(6, "stdout.txt"), O_WRONLY | O_CREAT | O_TRUNC, 0644);
        int e = open(mp_path(7, "stderr.txt"), O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (o < 0 || e < 0 || chdir(mp_dir) != 0)
            _exit(126);
        dup2(o, STDOUT_FILENO);
        dup2(e, STDERR_FILENO);
        execv(mp_exe, args);
        _exit(127);
    }
    int st = 0;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    mp_slurp(mp_path(6, "stdout.txt"), mp_out, sizeof mp_out);
    mp_slurp(mp_path(7, "stderr.txt"), mp_err, sizeof mp_err);
    printf("$ dsim %s ...: %d\n%s%s", first, WIFEXITED(st) ? WEXITSTATUS(st) : -1, mp_out, mp_err);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void mp_has(const char *hay, const char *needle)
{
    if (!strstr(hay, needle))
        fail_msg("expected '%s' in:\n%s", needle, hay);
}

static int mp_setup(void **state)
{
    (void)state;
    mp_exe = getenv("DSIM_EXE");
    mp_plugin = getenv("DSIM_MODEL_PLUGIN");
    mp_other = getenv("DSIM_CUSTOM_PLUGIN");
    return mp_exe && mp_plugin && mp_other && mkdtemp(mp_dir) ? 0 : -1;
}

static int mp_teardown(void **state)
{
    (void)state;
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", mp_dir);
    return system(cmd) == 0 ? 0 : -1;
}

static void test_gradient(void **state)
{
    (void)state;
    const dsim_model_ops *ops = NULL;
    assert_int_equal(dsim_model_load(mp_plugin, &ops), DSIM_OK);
    dsim_model_spec ms = {.kind = DSIM_MODEL_PLUGIN, .in_dim = 9, .out_dim = 3, .plugin = ops};
    assert_int_equal(dsim_model_validate(&ms), DSIM_OK);
    assert_int_equal(dsim_model_loss(&ms), DSIM_LOSS_XENT);
    assert_int_equal(dsim_model_y_dim(&ms), 1);
    size_t np = dsim_model_num_params(&ms);
    assert_int_equal(np, 4 * 3 + 4 + 3 * 4 * 7 + 3);
    float *p = malloc(np * sizeof *p), *g = malloc(np * sizeof *g);
    enum { N = 7 };
    float x[N * 9], y[N];
    assert_true(p && g);
    dsim_rng r;
    dsim_rng_init(&r, 42, "test", 0);
    assert_int_equal(dsim_model_init(&ms, p, &r), DSIM_OK);
    for (size_t i = 0; i < np; i++) /* biases off zero, so every ReLU matters */
        p[i] += (float)(0.1 * dsim_rng_normal(&r));
    for (int i = 0; i < N * 9; i++)
        x[i] = (float)dsim_rng_normal(&r);
    for (int e = 0; e < N; e++)
        y[e] = (float)(e % 3);
    double loss = 0;
    assert_int_equal(dsim_model_loss_grad_set(&ms, p, x, y, N, 0.5f, g, &loss), DSIM_OK);
    assert_true(loss > 0);
    double worst = 0;
    for (size_t k = 0; k < np; k++) {
        float keep = p[k], h = 1e-3f;
        double lp, lm;
        p[k] = keep + h;
        assert_int_equal(dsim_model_eval(&ms, p, x, y, N, &lp, NULL), DSIM_OK);
        p[k] = keep - h;
        assert_int_equal(dsim_model_eval(&ms, p, x, y, N, &lm, NULL), DSIM_OK);
        p[k] = keep;
        double fd = 0.5 * (lp - lm) / (2.0 * h), err = fabs(fd - g[k]) / fmax(1e-3, fabs(fd));
        worst = fmax(worst, err);
        if (err > 1e-3)
            fail_msg("parameter %zu: gradient %g, finite differences %g", k, (double)g[k], fd);
    }
    printf("conv1d: %zu parameters, worst relative gradient error %.2g\n", np, worst);
    /* accumulation adds to what is there; forward gives the logits */
    float *g2 = malloc(np * sizeof *g2), out[N * 3];
    assert_non_null(g2);
    memcpy(g2, g, np * sizeof *g2);
    assert_int_equal(dsim_model_loss_grad(&ms, p, x, y, N, 0.5f, g2, NULL), DSIM_OK);
    for (size_t k = 0; k < np; k++)
        assert_true(fabsf(g2[k] - 2 * g[k]) <= 1e-6f * fabsf(g[k]));
    assert_int_equal(dsim_model_predict(&ms, p, x, N, out), DSIM_OK);
    size_t correct = 0;
    assert_int_equal(dsim_model_eval(&ms, p, x, y, N, NULL, &correct), DSIM_OK);
    size_t mine = 0;
    for (int e = 0; e < N; e++) {
        int best = 0;
        for (int j = 1; j < 3; j++)
            if (out[e * 3 + j] > out[e * 3 + best])
                best = j;
        mine += best == (int)y[e];
    }
    assert_int_equal(correct, mine);
    free(p), free(g), free(g2);

    /* dsim does not know the plugin's layers: its variables, as messages
     * name them, are 8 spans of the buffer that cover it in order */
    dsim_model_var v[DSIM_MODEL_MAX_VARS];
    size_t nv = dsim_model_vars(&ms, v), at = 0;
    assert_int_equal(nv, DSIM_MODEL_MAX_VARS);
    for (size_t k = 0; k < nv; k++) {
        assert_int_equal(v[k].off, at);
        assert_true(v[k].len >= 1);
        char want[64];
        snprintf(want, sizeof want, "parameters %zu..%zu", at, at + v[k].len - 1);
        assert_string_equal(v[k].name, want);
        at += v[k].len;
    }
    assert_int_equal(at, np);
    char where[64];
    assert_string_equal(dsim_model_var_where(v, nv, np - 1, where, sizeof where), v[nv - 1].name);
}

static void test_refusals(void **state)
{
    (void)state;
    const dsim_model_ops *ops = NULL;
    assert_int_equal(dsim_model_load(mp_other, &ops), DSIM_EINVAL);
    mp_has(dsim_errmsg(), "is not a model plugin: it has no symbol 'dsim_model_plugin'");
    assert_int_equal(dsim_model_load(mp_path(0, "nothere.so"), &ops), DSIM_ENOENT);
    mp_has(dsim_errmsg(), "nothere.so");
    assert_int_equal(dsim_model_load(mp_plugin, &ops), DSIM_OK);
    dsim_model_ops bad = *ops;
    bad.size = 8;
    assert_int_equal(dsim_model_check_ops(&bad, "mine.so"), DSIM_EINVAL);
    mp_has(dsim_errmsg(), "mine.so: its table's size is 8 bytes");
    bad = *ops;
    bad.loss_grad = NULL;
    assert_int_equal(dsim_model_check_ops(&bad, "mine.so"), DSIM_EINVAL);
    mp_has(dsim_errmsg(), "no loss_grad, which is required");
    dsim_model_spec ms = {.kind = DSIM_MODEL_PLUGIN, .in_dim = 2, .out_dim = 3, .plugin = ops};
    assert_int_equal(dsim_model_validate(&ms), DSIM_EINVAL);
    mp_has(dsim_errmsg(), "shorter than the filters' width 3");
    ms.plugin = NULL;
    assert_int_equal(dsim_model_validate(&ms), DSIM_EINVAL);
    mp_has(dsim_errmsg(), "no ops table");
}

#define MP_EX 240
#define MP_F  12

static void mp_data(void)
{
    static float x[MP_EX * MP_F], yr[MP_EX];
    static int64_t y[MP_EX];
    dsim_rng r;
    dsim_rng_init(&r, 9, "data", 0);
    for (int e = 0; e < MP_EX; e++) {
        int cls = e % 3;
        /* class 0: a bump early, 1: late, 2: none; plus noise */
        for (int i = 0; i < MP_F; i++)
            x[e * MP_F + i] =
                (float)(0.3 * dsim_rng_normal(&r) + (cls == 0 && i >= 2 && i < 5 ? 1.0 : 0.0) +
                        (cls == 1 && i >= 7 && i < 10 ? 1.0 : 0.0));
        y[e] = cls;
        yr[e] = (float)cls * 0.5f;
    }
    uint64_t xs[2] = {MP_EX, MP_F}, ys = MP_EX;
    mkdir(mp_path(0, "data"), 0755);
    assert_int_equal(dsim_npy_write(mp_path(0, "data/x.npy"), DSIM_NPY_F32, xs, 2, x), DSIM_OK);
    assert_int_equal(dsim_npy_write(mp_path(0, "data/y.npy"), DSIM_NPY_I64, &ys, 1, y), DSIM_OK);
    assert_int_equal(dsim_npy_write(mp_path(0, "data/yr.npy"), DSIM_NPY_F32, &ys, 1, yr), DSIM_OK);
}

static const char *mp_scenario(const char *name, const char *ylabels)
{
    static char text[2048];
    snprintf(text, sizeof text,
             "name: %s\nseed: 4\ncluster: {hosts: 2, devices_per_host: 2}\n"
             "strategy: {name: multi_worker_mirrored}\nmodel: {plugin: %s}\n"
             "optimizer: {kind: sgd, learning_rate: 0.2}\n"
             "data: {source: {x: data/x.npy, y: data/%s}, files: 4, global_batch: 24, "
             "epochs: 3, shuffle: true}\n"
             "expect:\n  gradient_consistency: {}\n  shard_coverage: {}\n"
             "  convergence: {within_pct_of_reference: 1}\n",
             name, mp_plugin, ylabels);
    char file[64];
    snprintf(file, sizeof file, "%s.yaml", name);
    FILE *f = fopen(mp_path(1, file), "w");
    assert_non_null(f);
    fputs(text, f);
    assert_int_equal(fclose(f), 0);
    return mp_path(2, file);
}

static void test_every_engine(void **state)
{
    (void)state;
    mp_data();
    const char *scen = mp_scenario("conv", "y.npy");
    assert_int_equal(mp_run("validate", scen, NULL), 0);
    /* plan runs no plugin code: what the plugin computes is left open */
    assert_int_equal(mp_run("plan", scen, NULL), 0);
    mp_has(mp_out, "\"n_params\": null");
    mp_has(mp_out, "known once dsim run loads it");
    static const char *const engines[] = {"threads", "processes", "sim"};
    for (int i = 0; i < 3; i++) {
        assert_int_equal(mp_run("run", scen, "--engine", engines[i], "--db", "runs.db", NULL), 0);
        mp_has(mp_out, "conv: passed (3 of 3 checks met their expectation)");
    }
    /* the sim run, exported */
    assert_int_equal(mp_run("export", "3", "--db", "runs.db", "--to", "exported", NULL), 0);
    mp_has(mp_out, "stored checksums match");
    char man[4096];
    mp_slurp(mp_path(3, "exported/manifest.json"), man, sizeof man);
    mp_has(man, "\"kind\": \"plugin\"");
    mp_has(man, "model plugin conv1d");

    assert_int_equal(mp_run("run", scen, "--no-plugins", "--db", "none.db", NULL), 2);
    mp_has(mp_err, "model.plugin: the scenario names a model plugin");
    const char *reg = mp_scenario("conv_regression", "yr.npy");
    assert_int_equal(mp_run("run", reg, "--db", "none.db", NULL), 2);
    mp_has(mp_err, "model.plugin: conv1d trains with loss xent, which needs class labels");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gradient),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_every_engine),
    };
    return cmocka_run_group_tests(tests, mp_setup, mp_teardown);
}
