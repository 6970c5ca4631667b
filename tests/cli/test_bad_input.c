/* Bad input a new user runs into, through the dsim command:
 *   - a scenario path that is not a regular file (a named pipe, a directory,
 *     a device) is refused at once by validate, plan and run, never waited
 *     on;
 *   - `--plugin-dir` means the same for validate, plan and run;
 *   - a plugin whose ops table names another strategy than the scenario's
 *     strategy.name is refused naming both;
 *   - `dsim run --no-plugins` refuses a scenario that names a plugin before
 *     anything is loaded or stored, and runs one that names none;
 *   - data.source files (.npy, CSV) that are malformed are refused by
 *     validate and run alike, naming the scenario's line, the file and what
 *     is wrong; paths are relative to the scenario file.
 *
 * $DSIM_EXE is the dsim executable, $DSIM_CUSTOM_PLUGIN the example plugin
 * (its table names the strategy custom_mirrored). */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

static const char *bi_exe, *bi_plugin;
static char bi_dir[] = "/tmp/dsim-bad-input-XXXXXX";
static char bi_out[65536], bi_err[16384];

static void bi_slurp(const char *path, char *buf, size_t cap)
{
    FILE *f = fopen(path, "rb");
    size_t n = f ? fread(buf, 1, cap - 1, f) : 0;
    buf[n] = '\0';
    if (f)
        fclose(f);
}

/* Runs dsim with the arguments (NULL-terminated) in bi_dir and returns its
 * exit status; fails the test if it has not ended within 20 s (a command
 * that waits on a pipe would never end). */
static int bi_run(const char *first, ...)
{
    char *args[24];
    int n = 0;
    args[n++] = (char *)bi_exe;
    va_list ap;
    va_start(ap, first);
    for (const char *a = first; a && n < 23; a = va_arg(ap, const char *))
        args[n++] = (char *)a;
    va_end(ap);
    args[n] = NULL;
    char out[512], err[512];
    snprintf(out, sizeof out, "%s/stdout.txt", bi_dir);
    snprintf(err, sizeof err, "%s/stderr.txt", bi_dir);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int o = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        int e = open(err, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (o < 0 || e < 0 || chdir(bi_dir) != 0)
            _exit(126);
        dup2(o, STDOUT_FILENO);
        dup2(e, STDERR_FILENO);
        execv(bi_exe, args);
        _exit(127);
    }
    int st = 0;
    for (int waited_ms = 0;; waited_ms += 10) {
        pid_t w = waitpid(pid, &st, WNOHANG);
        assert_true(w >= 0);
        if (w == pid)
            break;
        if (waited_ms >= 20000) {
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
            fail_msg("dsim %s %s did not end within 20 s", args[1], n > 2 ? args[2] : "");
        }
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    bi_slurp(out, bi_out, sizeof bi_out);
    bi_slurp(err, bi_err, sizeof bi_err);
    if (!WIFEXITED(st))
        fail_msg("dsim died of signal %d; stderr: %s", WTERMSIG(st), bi_err);
    return WEXITSTATUS(st);
}

static void bi_has(const char *text, const char *needle)
{
    if (!strstr(text, needle))
        fail_msg("output lacks \"%s\":\n%s", needle, text);
}

/* bi_dir/name (static buffer per slot) */
static const char *bi_path(int slot, const char *name)
{
    static char paths[8][512];
    snprintf(paths[slot], sizeof paths[slot], "%s/%s", bi_dir, name);
    return paths[slot];
}

static const char *bi_write(int slot, const char *name, const char *text)
{
    const char *p = bi_path(slot, name);
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    fputs(text, f);
    assert_int_equal(fclose(f), 0);
    return p;
}

static void bi_copy(const char *from, const char *to)
{
    FILE *in = fopen(from, "rb"), *out = fopen(to, "wb");
    assert_non_null(in);
    assert_non_null(out);
    char buf[65536];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, in)) > 0)
        assert_int_equal(fwrite(buf, 1, n, out), n);
    fclose(in);
    assert_int_equal(fclose(out), 0);
}

static const char bi_small[] = "  hosts: 1\n"
                               "  devices_per_host: 2\n"
                               "data: {examples: 64, features: 4, classes: 2, files: 2, "
                               "global_batch: 16, epochs: 1}\n"
                               "expect:\n"
                               "  gradient_consistency: {}\n";

/* A scenario of two replicas under `strategy` from `plugin` (NULL: none). */
static const char *bi_scenario(int slot, const char *file, const char *strategy, const char *plugin)
{
    char text[1024];
    if (plugin)
        snprintf(text, sizeof text, "name: %s\nstrategy: {name: %s, plugin: %s}\ncluster:\n%s",
                 strategy, strategy, plugin, bi_small);
    else
        snprintf(text, sizeof text, "name: %s\nstrategy: {name: %s}\ncluster:\n%s", strategy,
                 strategy, bi_small);
    return bi_write(slot, file, text);
}

/* ---- not a regular file ---- */

static void test_not_a_regular_file(void **state)
{
    (void)state;
    const char *fifo = bi_path(0, "pipe.yaml");
    unlink(fifo);
    if (mkfifo(fifo, 0600) != 0)
        fail_msg("mkfifo %s: %s", fifo, strerror(errno));
    const char *db = bi_path(1, "fifo.db");
    static const char *const cmds[] = {"validate", "plan", "run"};
    for (size_t i = 0; i < 3; i++) {
        int rc = i == 2 ? bi_run("run", fifo, "--db", db, NULL) : bi_run(cmds[i], fifo, NULL);
        assert_int_equal(rc, 2);
        char want[600];
        snprintf(want, sizeof want, "%s: is a named pipe, not a regular file", fifo);
        /* validate reports on stdout, the others on stderr */
        bi_has(i == 0 ? bi_out : bi_err, want);
    }
    /* nothing was stored: the store is opened only after every file loaded */
    assert_int_not_equal(access(db, F_OK), 0);
    unlink(fifo);

    assert_int_equal(bi_run("validate", bi_dir, NULL), 2);
    bi_has(bi_out, "is a directory, not a regular file");
    assert_int_equal(bi_run("run", "/dev/null", "--db", db, NULL), 2);
    bi_has(bi_err, "/dev/null: is a character device, not a regular file");
    assert_int_not_equal(access(db, F_OK), 0);
}

/* ---- plugins ---- */

static void test_plugin_dir(void **state)
{
    (void)state;
    if (!bi_plugin || !*bi_plugin)
        skip();
    /* the plugin under a file name only this folder has */
    const char *pdir = bi_path(0, "plugins");
    mkdir(pdir, 0755);
    char so[600];
    snprintf(so, sizeof so, "%s/libbad_input_example.so", pdir);
    bi_copy(bi_plugin, so);
    const char *sdir = bi_path(1, "scenarios");
    mkdir(sdir, 0755);
    const char *scen =
        bi_scenario(2, "scenarios/mine.yaml", "custom_mirrored", "libbad_input_example.so");

    /* without the folder: not found, and the message says where to add it */
    assert_int_equal(bi_run("validate", scen, NULL), 2);
    bi_has(bi_out, "'libbad_input_example.so' not found");
    bi_has(bi_out, "--plugin-dir");
    /* validate, plan and run all take --plugin-dir DIR and --plugin-dir=DIR */
    assert_int_equal(bi_run("validate", "--plugin-dir", pdir, scen, NULL), 0);
    bi_has(bi_out, ": ok");
    char eq[700];
    snprintf(eq, sizeof eq, "--plugin-dir=%s", pdir);
    assert_int_equal(bi_run("validate", eq, scen, NULL), 0);
    assert_int_equal(bi_run("plan", scen, "--plugin-dir", pdir, NULL), 0);
    bi_has(bi_out, "\"runnable\": true");
    assert_int_equal(bi_run("run", scen, "--plugin-dir", pdir, "--db", bi_path(3, "p.db"), NULL),
                     0);
    bi_has(bi_out, "custom_mirrored: passed");
    /* a path with a '/' is relative to the scenario file's folder, also when
     * the scenario is named without one (here: in the working folder) */
    bi_write(4, "rel.yaml",
             "name: rel\nstrategy: {name: custom_mirrored, plugin: "
             "plugins/libbad_input_example.so}\ncluster: {hosts: 1}\n");
    assert_int_equal(bi_run("validate", "rel.yaml", NULL), 0);
    bi_has(bi_out, "rel.yaml: ok");
    /* a value is required, and an empty one is refused */
    assert_int_equal(bi_run("validate", scen, "--plugin-dir", NULL), 2);
    bi_has(bi_err, "--plugin-dir needs a value");
    assert_int_equal(bi_run("validate", "--plugin-dir=", scen, NULL), 2);
    bi_has(bi_err, "--plugin-dir is ''");
}

static void test_plugin_name_mismatch(void **state)
{
    (void)state;
    if (!bi_plugin || !*bi_plugin)
        skip();
    /* the example's table names custom_mirrored */
    const char *scen = bi_scenario(0, "other.yaml", "other_name", bi_plugin);
    const char *db = bi_path(1, "mismatch.db");
    assert_int_equal(bi_run("run", scen, "--db", db, NULL), 2);
    bi_has(bi_err, "names its strategy 'custom_mirrored' in its ops table, not 'other_name'");
    bi_has(bi_err, "strategy.plugin");
    assert_int_not_equal(access(db, F_OK), 0);
}

static void test_no_plugins(void **state)
{
    (void)state;
    if (!bi_plugin || !*bi_plugin)
        skip();
    const char *with = bi_scenario(0, "with.yaml", "custom_mirrored", bi_plugin);
    const char *without = bi_scenario(1, "without.yaml", "mirrored", NULL);
    const char *db = bi_path(2, "noplug.db");
    /* refused before anything runs or is stored, even after a good file */
    assert_int_equal(bi_run("run", "--no-plugins", without, with, "--db", db, NULL), 2);
    char want[700];
    snprintf(want, sizeof want, "%s:2:43: strategy.plugin: the scenario names a plugin", with);
    bi_has(bi_err, want);
    bi_has(bi_err, "--no-plugins");
    assert_int_not_equal(access(db, F_OK), 0);
    assert_null(strstr(bi_out, "passed"));
    /* a scenario without a plugin runs as usual */
    assert_int_equal(bi_run("run", "--no-plugins", without, "--db", db, NULL), 0);
    bi_has(bi_out, "mirrored: passed");
    /* the help says why */
    assert_int_equal(bi_run("run", "--help", NULL), 0);
    bi_has(bi_out, "--no-plugins");
    bi_has(bi_out, "runs its code");
}

/* ---- data from files ---- */

/* A .npy file: the dict, then `bytes` of data (NULL: a pattern). */
static void bi_npy(const char *name, const char *dict, const void *data, size_t bytes)
{
    size_t dl = strlen(dict), total = (10 + dl + 1 + 63) / 64 * 64, hlen = total - 10;
    unsigned char *b = calloc(total + bytes + 1, 1);
    assert_non_null(b);
    memcpy(b, "\x93NUMPY\x01\x00", 8);
    b[8] = (unsigned char)hlen;
    b[9] = (unsigned char)(hlen >> 8);
    memcpy(b + 10, dict, dl);
    memset(b + 10 + dl, ' ', hlen - dl - 1);
    b[total - 1] = '\n';
    memcpy(b + total, data, bytes);
    FILE *f = fopen(bi_path(7, name), "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(b, 1, total + bytes, f), total + bytes);
    assert_int_equal(fclose(f), 0);
    free(b);
}

static void test_data_files(void **state)
{
    (void)state;
    mkdir(bi_path(0, "data"), 0755);
    mkdir(bi_path(0, "sc"), 0755);
    float x[64 * 4];
    int64_t y[64];
    for (int e = 0; e < 64; e++) {
        for (int i = 0; i < 4; i++)
            x[e * 4 + i] = (float)((e * 7 + i * 3) % 11) / 5.0f - 1.0f;
        y[e] = (x[e * 4] + x[e * 4 + 1] > 0) ? 1 : 0;
    }
    bi_npy("data/x.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (64, 4), }", x,
           sizeof x);
    bi_npy("data/y.npy", "{'descr': '<i8', 'fortran_order': False, 'shape': (64,), }", y, sizeof y);
    bi_npy("data/short.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (64, 4), }", x,
           sizeof x - 8);
    bi_npy("data/y63.npy", "{'descr': '<i8', 'fortran_order': False, 'shape': (63,), }", y,
           sizeof y - 8);
    bi_write(1, "data/bad.csv", "a,b,label\n1,2,0\n3,oops,1\n");
    static const char head[] = "name: files\nstrategy: {name: mirrored}\ncluster: {hosts: 1, "
                               "devices_per_host: 2}\nexpect: {gradient_consistency: {}, "
                               "shard_coverage: {}}\n";
    char text[1024];
    snprintf(text, sizeof text,
             "%sdata: {source: {x: ../data/x.npy, y: ../data/y.npy}, files: 2, "
             "global_batch: 16}\n",
             head);
    const char *good = bi_write(2, "sc/good.yaml", text);
    /* relative to the scenario's folder, not the working one */
    assert_int_equal(bi_run("validate", good, NULL), 0);
    bi_has(bi_out, "good.yaml: ok");
    const char *db = bi_path(3, "files.db");
    assert_int_equal(bi_run("run", good, "--db", db, NULL), 0);
    bi_has(bi_out, "files: passed");

    static const struct {
        const char *source, *needle;
    } bad[] = {
        {"{x: ../data/short.npy, y: ../data/y.npy}",
         "short.npy: truncated .npy file: shape (64, 4) of float32 needs 1024 bytes"},
        {"{x: ../data/x.npy, y: ../data/y63.npy}", "y63.npy: 63 labels, but"},
        {"{x: ../data/x.npy, y: ../data/nothere.npy}", "nothere.npy: no such file"},
        {"{x: ../data/y.npy, y: ../data/y.npy}", "features must be a 2-D array"},
        {"{csv: ../data/bad.csv, label_column: label}",
         "bad.csv:3: column 'b' (column 2) holds 'oops', not a number"},
        {"{csv: ../data/bad.csv}", "data.source.label_column is missing"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(text, sizeof text, "%sdata: {source: %s, global_batch: 16}\n", head,
                 bad[i].source);
        const char *scen = bi_write(4, "sc/bad.yaml", text);
        char where[600];
        snprintf(where, sizeof where, "%s:5:", scen);
        assert_int_equal(bi_run("validate", scen, NULL), 2);
        bi_has(bi_out, where);
        bi_has(bi_out, bad[i].needle);
        const char *bdb = bi_path(5, "bad.db");
        assert_int_equal(bi_run("run", scen, "--db", bdb, NULL), 2);
        bi_has(bi_err, where);
        bi_has(bi_err, bad[i].needle);
        assert_int_not_equal(access(bdb, F_OK), 0);
    }
    /* what the section says is checked against the files */
    snprintf(text, sizeof text,
             "%sdata: {source: {x: ../data/x.npy, y: ../data/y.npy}, examples: 100, "
             "global_batch: 16}\n",
             head);
    assert_int_equal(bi_run("validate", bi_write(4, "sc/bad.yaml", text), NULL), 2);
    bi_has(bi_out, "data.examples: 100, but the files hold 64 examples");
    snprintf(text, sizeof text,
             "%sdata: {source: {x: ../data/x.npy, y: ../data/y.npy}, noise: 0.1}\n", head);
    assert_int_equal(bi_run("validate", bi_write(4, "sc/bad.yaml", text), NULL), 2);
    bi_has(bi_out, "data.noise: noise draws synthetic labels");
    snprintf(text, sizeof text,
             "%sdata: {source: {x: ../data/x.npy, y: ../data/y.npy}, features: 7}\n", head);
    assert_int_equal(bi_run("validate", bi_write(4, "sc/bad.yaml", text), NULL), 2);
    bi_has(bi_out, "x.npy: the file has 4 features per example, but data.features says 7");
}

static int bi_setup(void **state)
{
    (void)state;
    return mkdtemp(bi_dir) ? 0 : -1;
}

static int bi_teardown(void **state)
{
    (void)state;
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", bi_dir);
    return system(cmd) == 0 ? 0 : -1;
}

int main(void)
{
    bi_exe = getenv("DSIM_EXE");
    bi_plugin = getenv("DSIM_CUSTOM_PLUGIN");
    if (!bi_exe || !*bi_exe) {
        fprintf(stderr, "DSIM_EXE is not set; run through meson test\n");
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_not_a_regular_file),   cmocka_unit_test(test_plugin_dir),
        cmocka_unit_test(test_plugin_name_mismatch), cmocka_unit_test(test_no_plugins),
        cmocka_unit_test(test_data_files),
    };
    return cmocka_run_group_tests(tests, bi_setup, bi_teardown);
}
