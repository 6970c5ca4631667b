/* dsim export, run as a program on a run trained on .npy files:
 *   - the files are what the manifest says: x.npy and y.npy are the data
 *     given, every epoch's batches hold every example once, the manifest's
 *     checksums are dsim_params_checksum of the parameter files;
 *   - the files alone replay the run: the optimizer steps taken here with
 *     libdsim's model and optimizer from initial_params.npy and
 *     batches.npy give reference_final_params.npy and the optimizer state
 *     bit for bit, and final_params.npy within 1e-6; --per-step's last row
 *     is final_params.npy;
 *   - refusals (exit 2, a message naming what is wrong): no such run, no
 *     --to, a run with faults, its data file gone, a folder that cannot be
 *     made.
 * $DSIM_EXE is the dsim executable. */
#include <fcntl.h>
#include <inttypes.h>
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

#include <jansson.h>

#include "dsim/model.h"
#include "dsim/npy.h"
#include "store.h"
#include "dsim/optim.h"
#include "dsim/strategy.h"

#define N_EX 96
#define N_F  5
#define N_C  3

static const char *ex_exe;
static char ex_dir[] = "/tmp/dsim-export-XXXXXX";
static char ex_out[65536], ex_err[16384];
static float ex_x[N_EX * N_F];
static int64_t ex_y[N_EX];

static const char *ex_path(int slot, const char *name)
{
    static char buf[8][600];
    snprintf(buf[slot], sizeof buf[slot], "%s/%s", ex_dir, name);
    return buf[slot];
}

static void ex_slurp(const char *path, char *buf, size_t cap)
{
    FILE *f = fopen(path, "rb");
    size_t n = f ? fread(buf, 1, cap - 1, f) : 0;
    buf[n] = '\0';
    if (f)
        fclose(f);
}

/* dsim with the arguments (NULL-terminated), in ex_dir; its exit status. */
static int ex_run(const char *first, ...)
{
    char *args[16];
    int n = 0;
    args[n++] = (char *)ex_exe;
    va_list ap;
    va_start(ap, first);
    for (const char *a = first; a && n < 15; a = va_arg(ap, const char *))
        args[n++] = (char *)a;
    va_end(ap);
    args[n] = NULL;
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int o = open(ex_path(6, "stdout.txt"), O_WRONLY | O_CREAT | O_TRUNC, 0644);
        int e = open(ex_path(7, "stderr.txt"), O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (o < 0 || e < 0 || chdir(ex_dir) != 0)
            _exit(126);
        dup2(o, STDOUT_FILENO);
        dup2(e, STDERR_FILENO);
        execv(ex_exe, args);
        _exit(127);
    }
    int st = 0;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    ex_slurp(ex_path(6, "stdout.txt"), ex_out, sizeof ex_out);
    ex_slurp(ex_path(7, "stderr.txt"), ex_err, sizeof ex_err);
    printf("$ dsim %s ...: %d\n%s%s", first, WIFEXITED(st) ? WEXITSTATUS(st) : -1, ex_out, ex_err);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void ex_has(const char *hay, const char *needle)
{
    if (!strstr(hay, needle))
        fail_msg("expected '%s' in:\n%s", needle, hay);
}

static void ex_write(const char *name, const char *text)
{
    FILE *f = fopen(ex_path(0, name), "w");
    assert_non_null(f);
    fputs(text, f);
    assert_int_equal(fclose(f), 0);
}

/* A whole .npy file: its header and a malloc'd copy of its data. */
static void *ex_npy(const char *dir, const char *name, dsim_npy_header *h)
{
    char path[700];
    snprintf(path, sizeof path, "%s/%s/%s", ex_dir, dir, name);
    FILE *f = fopen(path, "rb");
    if (!f)
        fail_msg("%s: not written", path);
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc((size_t)len + 1);
    assert_non_null(b);
    assert_int_equal(fread(b, 1, (size_t)len, f), (size_t)len);
    fclose(f);
    assert_int_equal(dsim_npy_parse_header(path, b, (size_t)len, (uint64_t)len, h), DSIM_OK);
    void *d = malloc(h->data_bytes + 1);
    assert_non_null(d);
    memcpy(d, b + h->data_offset, h->data_bytes);
    free(b);
    return d;
}

static uint64_t ex_hex(json_t *o, const char *key)
{
    const char *s = json_string_value(json_object_get(o, key));
    assert_non_null(s);
    return strtoull(s, NULL, 16);
}

static int ex_setup(void **state)
{
    (void)state;
    ex_exe = getenv("DSIM_EXE");
    if (!ex_exe || !mkdtemp(ex_dir))
        return -1;
    for (int e = 0; e < N_EX; e++) {
        double s = 0;
        for (int i = 0; i < N_F; i++) {
            ex_x[e * N_F + i] = (float)sin(e * 1.7 + i * 0.9);
            s += ex_x[e * N_F + i] * (i - 2);
        }
        ex_y[e] = s > 0.4 ? 2 : s > -0.4 ? 1 : 0;
    }
    uint64_t xs[2] = {N_EX, N_F}, ys = N_EX;
    char p[600];
    snprintf(p, sizeof p, "%s/data", ex_dir);
    mkdir(p, 0755);
    snprintf(p, sizeof p, "%s/sc", ex_dir);
    mkdir(p, 0755);
    if (dsim_npy_write(ex_path(0, "data/x.npy"), DSIM_NPY_F32, xs, 2, ex_x) != DSIM_OK ||
        dsim_npy_write(ex_path(1, "data/y.npy"), DSIM_NPY_I64, &ys, 1, ex_y) != DSIM_OK)
        return -1;
    return 0;
}

static int ex_teardown(void **state)
{
    (void)state;
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", ex_dir);
    return system(cmd) == 0 ? 0 : -1;
}

static const char ex_scen[] =
    "name: exported\nseed: 5\ncluster: {hosts: 2, devices_per_host: 2}\n"
    "strategy: {name: multi_worker_mirrored}\nmodel: {kind: mlp, hidden: [6]}\n"
    "optimizer: {kind: momentum, learning_rate: 0.2, momentum: 0.9}\n"
    "data: {source: {x: ../data/x.npy, y: ../data/y.npy}, files: 4, global_batch: 16, "
    "epochs: 2}\nexpect: {gradient_consistency: {}, shard_coverage: {}}\n";

/* Every epoch's batches hold every example exactly once. */
static void ex_check_batches(const int64_t *b, const int64_t *sz, const dsim_npy_header *h,
                             uint64_t per_epoch)
{
    uint64_t steps = h->shape[0], R = h->shape[1], w = h->shape[2];
    assert_int_equal(steps % per_epoch, 0);
    for (uint64_t ep = 0; ep < steps / per_epoch; ep++) {
        int seen[N_EX] = {0};
        for (uint64_t s = ep * per_epoch; s < (ep + 1) * per_epoch; s++)
            for (uint64_t r = 0; r < R; r++) {
                int64_t n = sz[s * R + r];
                assert_true(n >= 0 && (uint64_t)n <= w);
                for (uint64_t i = 0; i < w; i++) {
                    int64_t id = b[(s * R + r) * w + i];
                    if (i >= (uint64_t)n) {
                        assert_int_equal(id, -1);
                        continue;
                    }
                    assert_true(id >= 0 && id < N_EX);
                    seen[id]++;
                }
            }
        for (int e = 0; e < N_EX; e++)
            assert_int_equal(seen[e], 1);
    }
}

static void test_export_replays(void **state)
{
    (void)state;
    ex_write("sc/run.yaml", ex_scen);
    assert_int_equal(ex_run("run", "sc/run.yaml", "--db", "runs.db", NULL), 0);
    assert_int_equal(ex_run("export", "1", "--db", "runs.db", "--to", "out", "--per-step", NULL),
                     0);
    ex_has(ex_out, "stored checksums match");

    json_error_t je;
    char mp[700];
    snprintf(mp, sizeof mp, "%s/out/manifest.json", ex_dir);
    json_t *man = json_load_file(mp, 0, &je);
    assert_non_null(man);
    json_t *bat = json_object_get(man, "batching");
    uint64_t per_epoch = (uint64_t)json_integer_value(json_object_get(bat, "steps_per_epoch"));
    float scale = (float)json_real_value(json_object_get(bat, "loss_scale"));
    assert_true(scale == 1.0f / 16.0f);
    assert_int_equal(
        json_integer_value(json_object_get(json_object_get(man, "verification"), "differing")), 0);

    dsim_npy_header hx, hy, hi, hf, hr, ho, hb, hs, hp;
    float *x = ex_npy("out", "x.npy", &hx);
    int64_t *y = ex_npy("out", "y.npy", &hy);
    float *init = ex_npy("out", "initial_params.npy", &hi);
    float *fin = ex_npy("out", "final_params.npy", &hf);
    float *rfin = ex_npy("out", "reference_final_params.npy", &hr);
    float *ost = ex_npy("out", "final_optim_state.npy", &ho);
    int64_t *b = ex_npy("out", "batches.npy", &hb);
    int64_t *sz = ex_npy("out", "batch_sizes.npy", &hs);
    float *per = ex_npy("out", "params_per_step.npy", &hp);
    /* the data as given */
    assert_int_equal(hx.type, DSIM_NPY_F32);
    assert_int_equal(hx.shape[0], N_EX);
    assert_int_equal(hx.shape[1], N_F);
    assert_memory_equal(x, ex_x, sizeof ex_x);
    assert_int_equal(hy.type, DSIM_NPY_I64);
    assert_memory_equal(y, ex_y, sizeof ex_y);
    /* the batches */
    assert_int_equal(hb.ndim, 3);
    assert_int_equal(hb.shape[1], 4);
    ex_check_batches(b, sz, &hb, per_epoch);
    /* the checksums the manifest gives */
    dsim_model_spec ms = {.kind = DSIM_MODEL_MLP, .in_dim = N_F, .out_dim = N_C, .n_hidden = 1};
    ms.hidden[0] = 6;
    size_t np = dsim_model_num_params(&ms);
    assert_int_equal(hi.count, np);
    json_t *cs = json_object_get(man, "checksum");
    assert_true(ex_hex(cs, "initial") == dsim_params_checksum(init, np));
    assert_true(ex_hex(cs, "final") == dsim_params_checksum(fin, np));

    /* the files alone replay the run */
    dsim_optim_spec os;
    dsim_optim_spec_default(&os, DSIM_OPTIM_MOMENTUM);
    os.lr = 0.2;
    os.momentum = 0.9;
    dsim_optim *opt = NULL;
    assert_int_equal(dsim_optim_create(&os, np, &opt), DSIM_OK);
    float *p = malloc(np * sizeof *p), *g = malloc(np * sizeof *g);
    float *bx = malloc(16 * N_F * sizeof *bx), *by = malloc(16 * sizeof *by);
    assert_true(p && g && bx && by);
    memcpy(p, init, np * sizeof *p);
    uint64_t steps = hb.shape[0], R = hb.shape[1], w = hb.shape[2];
    for (uint64_t s = 0; s < steps; s++) {
        size_t n = 0;
        for (uint64_t r = 0; r < R; r++)
            for (int64_t i = 0; i < sz[s * R + r]; i++, n++) {
                int64_t id = b[(s * R + r) * w + (uint64_t)i];
                memcpy(bx + n * N_F, x + id * N_F, N_F * sizeof *bx);
                by[n] = (float)y[id];
            }
        assert_int_equal(dsim_model_loss_grad_set(&ms, p, bx, by, n, scale, g, NULL), DSIM_OK);
        assert_int_equal(dsim_optim_apply(opt, p, g, np), DSIM_OK);
    }
    assert_memory_equal(p, rfin, np * sizeof *p);
    assert_int_equal(ho.count, dsim_optim_state_len(opt));
    assert_memory_equal(ost, dsim_optim_state(opt), ho.count * sizeof(float));
    double worst = 0;
    for (size_t k = 0; k < np; k++)
        worst = fmax(worst, fabs((double)p[k] - fin[k]));
    printf("replayed %" PRIu64 " steps: largest difference from final_params.npy %.3g\n", steps,
           worst);
    assert_true(worst <= 1e-6);
    assert_int_equal(hp.shape[0], steps);
    assert_memory_equal(per + (steps - 1) * np, fin, np * sizeof *fin);

    dsim_optim_destroy(opt);
    free(p), free(g), free(bx), free(by);
    free(x), free(y), free(init), free(fin), free(rfin), free(ost), free(b), free(sz), free(per);
    json_decref(man);
}

/* dsim run --keep-params: the store holds the variables of every step
 * (the params table), and dsim export writes them without --per-step, the
 * same bits as the run trained again gives. */
static void test_keep_params(void **state)
{
    (void)state;
    ex_write("sc/kept.yaml", ex_scen);
    assert_int_equal(ex_run("run", "sc/kept.yaml", "--db", "kept.db", "--keep-params", NULL), 0);
    dsim_model_spec ms = {.kind = DSIM_MODEL_MLP, .in_dim = N_F, .out_dim = N_C, .n_hidden = 1};
    ms.hidden[0] = 6;
    size_t np = dsim_model_num_params(&ms);
    char db[700];
    snprintf(db, sizeof db, "%s/kept.db", ex_dir);
    float *rows = NULL;
    uint64_t n = 0;
    assert_int_equal(dsim_store_read_params(db, 1, np, &rows, &n), DSIM_OK);
    assert_non_null(rows);
    assert_true(n > 2); /* the initial variables and every step's */
    /* a run without the flag keeps none */
    assert_int_equal(ex_run("run", "sc/kept.yaml", "--db", "kept.db", NULL), 0);
    float *none = NULL;
    uint64_t n2 = 7;
    assert_int_equal(dsim_store_read_params(db, 2, np, &none, &n2), DSIM_OK);
    assert_null(none);
    assert_int_equal(n2, 0);
    /* the size must be the model's */
    float *bad = NULL;
    uint64_t n3 = 0;
    assert_int_equal(dsim_store_read_params(db, 1, np + 1, &bad, &n3), DSIM_EPROTO);

    assert_int_equal(ex_run("export", "1", "--db", "kept.db", "--to", "kept", NULL), 0);
    ex_has(ex_out, "steps' variables the run kept");
    dsim_npy_header hp, hf, hi;
    float *per = ex_npy("kept", "params_per_step.npy", &hp);
    float *fin = ex_npy("kept", "final_params.npy", &hf);
    float *init = ex_npy("kept", "initial_params.npy", &hi);
    assert_int_equal(hp.shape[0], n - 1);
    assert_int_equal(hp.shape[1], np);
    assert_memory_equal(rows, init, np * sizeof(float));
    assert_memory_equal(per, rows + np, (n - 1) * np * sizeof(float));
    assert_memory_equal(per + (n - 2) * np, fin, np * sizeof(float));
    free(rows), free(per), free(fin), free(init);
}

static void test_export_refusals(void **state)
{
    (void)state;
    ex_write("sc/run.yaml", ex_scen);
    assert_int_equal(ex_run("run", "sc/run.yaml", "--db", "refuse.db", NULL), 0);
    assert_int_equal(ex_run("export", "9", "--db", "refuse.db", "--to", "o9", NULL), 2);
    ex_has(ex_err, "there is no run 9");
    assert_int_equal(ex_run("export", "1", "--db", "refuse.db", NULL), 2);
    ex_has(ex_err, "give --to DIR");
    assert_int_equal(ex_run("export", "1", "--db", "refuse.db", "--to", "no/such/dir", NULL), 2);
    ex_has(ex_err, "no/such/dir: cannot create the folder");

    /* a run with faults */
    char text[1024];
    snprintf(text, sizeof text, "%sfaults:\n  - {what: slow, at_step: 0, rank: 1, factor: 2}\n",
             ex_scen);
    ex_write("sc/faulty.yaml", text);
    assert_int_equal(ex_run("run", "sc/faulty.yaml", "--db", "refuse.db", NULL), 0);
    assert_int_equal(ex_run("export", "2", "--db", "refuse.db", "--to", "o2", NULL), 2);
    ex_has(ex_err, "injects faults");

    /* the data file is gone */
    char keep[700];
    snprintf(keep, sizeof keep, "%s.kept", ex_path(0, "data/y.npy"));
    assert_int_equal(rename(ex_path(1, "data/y.npy"), keep), 0);
    assert_int_equal(ex_run("export", "1", "--db", "refuse.db", "--to", "o1", NULL), 2);
    ex_has(ex_err, "y.npy: no such file");
    assert_int_equal(rename(keep, ex_path(1, "data/y.npy")), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_export_replays),
        cmocka_unit_test(test_keep_params),
        cmocka_unit_test(test_export_refusals),
    };
    return cmocka_run_group_tests(tests, ex_setup, ex_teardown);
}
