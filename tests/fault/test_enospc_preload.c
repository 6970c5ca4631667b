/* A real POSIX failure, from outside the program: `dsim run` of a scenario
 * that checkpoints, under libfiu's POSIX preload (fiu-run -x) with every
 * write(2) failing with ENOSPC (errno 28). dsim must exit non-zero saying
 * which checkpoint file could not be written and why ("No space left on
 * device"), leave no temporary file, and keep the run in the results store,
 * marked failed or error, with the error event.
 *
 * Narrow enough: the point posix/io/rw/write covers write(2) only; SQLite
 * writes its database and WAL with pwrite64 (posix/io/rw/pwrite), and
 * stdio's own writes do not go through the interposed symbol, so in a
 * threads-engine run the only write(2) is the checkpoint's. The run found
 * in the store afterwards is the proof.
 *
 * Under AddressSanitizer (the sanitizer build) the preload cannot come
 * before the sanitizer's runtime: fiu's malloc wrapper would run before
 * the runtime is set up. fiu-run sets LD_PRELOAD itself, so there the test
 * makes fiu-run's environment itself (the libraries fiu-run -n names, after
 * the runtime this test was loaded with) and runs dsim directly; either way
 * LeakSanitizer is told that fiu_run_preload.so keeps a string for good.
 *
 * argv[1]: the dsim executable; argv[2]: fiu-run (empty or missing: skip,
 * 77). */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <link.h>
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

#include <sqlite3.h>

static const char *pl_dsim, *pl_fiu_run;
static char pl_dir[256];

#define PL_ENABLE "enable name=posix/io/rw/write,failinfo=28"

/* The AddressSanitizer runtime this process was loaded with, if any. */
static char pl_asan[1024];

static int pl_find_asan(struct dl_phdr_info *info, size_t size, void *data)
{
    (void)size;
    (void)data;
    if (info->dlpi_name && strstr(info->dlpi_name, "libasan.so")) {
        snprintf(pl_asan, sizeof pl_asan, "%s", info->dlpi_name);
        return 1;
    }
    return 0;
}

/* The libraries fiu-run -x preloads, as its dry run (-n) prints them. */
static void pl_fiu_preloads(char *buf, size_t cap)
{
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "'%s' -n -x -f '' -c '%s' true", pl_fiu_run, PL_ENABLE);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    char line[1024];
    buf[0] = '\0';
    while (fgets(line, sizeof line, p)) {
        const char *v = strstr(line, "LD_PRELOAD=\"");
        if (v) {
            v += strlen("LD_PRELOAD=\"");
            snprintf(buf, cap, "%.*s", (int)strcspn(v, "\""), v);
        }
    }
    pclose(p);
    if (!buf[0])
        fail_msg("%s -n did not say what it preloads", pl_fiu_run);
}

static void pl_append_env(const char *name, const char *item)
{
    const char *old = getenv(name);
    char v[2048];
    snprintf(v, sizeof v, "%s%s%s", old ? old : "", old && *old ? ":" : "", item);
    setenv(name, v, 1);
}

#define PL_SCENARIO                                                                                \
    "name: enospc\n"                                                                               \
    "seed: 3\n"                                                                                    \
    "engine: threads\n"                                                                            \
    "cluster: {hosts: 2, devices_per_host: 1}\n"                                                   \
    "strategy: {name: multi_worker_mirrored}\n"                                                    \
    "model: {kind: softmax}\n"                                                                     \
    "optimizer: {kind: sgd, learning_rate: 0.5}\n"                                                 \
    "data: {examples: 128, features: 4, classes: 3, files: 4, global_batch: 16, epochs: 1}\n"      \
    "checkpoint: {path: ck/enospc.ckpt, every: 2}\n"                                               \
    "expect:\n"                                                                                    \
    "  gradient_consistency: {}\n"

static char *pl_slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return strdup("");
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    assert_non_null(b);
    size_t got = fread(b, 1, (size_t)n, f);
    b[got] = '\0';
    fclose(f);
    return b;
}

/* Runs argv in pl_dir with stdout and stderr to one file; returns the exit
 * status and the output in *out (malloc'ed). */
static int pl_run(char *const *argv, char **out)
{
    char log[300];
    snprintf(log, sizeof log, "%s/out.txt", pl_dir);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int o = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (o < 0 || chdir(pl_dir) != 0)
            _exit(126);
        dup2(o, STDOUT_FILENO);
        dup2(o, STDERR_FILENO);
        pl_append_env("LSAN_OPTIONS", "suppressions=lsan.supp");
        execv(argv[0], argv);
        _exit(127);
    }
    int st = 0;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    *out = pl_slurp(log);
    if (WIFSIGNALED(st)) {
        printf("%s\n", *out);
        free(*out);
        fail_msg("%s died of signal %d", argv[0], WTERMSIG(st));
    }
    return WEXITSTATUS(st);
}

static void pl_has(const char *text, const char *needle)
{
    if (!strstr(text, needle))
        fail_msg("output lacks \"%s\":\n%s", needle, text);
}

static long long pl_sql_int(sqlite3 *db, const char *sql)
{
    sqlite3_stmt *q = NULL;
    if (sqlite3_prepare_v2(db, sql, -1, &q, NULL) != SQLITE_OK)
        fail_msg("%s: %s", sql, sqlite3_errmsg(db));
    long long v = -1;
    if (sqlite3_step(q) == SQLITE_ROW)
        v = sqlite3_column_int64(q, 0);
    sqlite3_finalize(q);
    return v;
}

static void pl_path(char *buf, size_t cap, const char *name)
{
    snprintf(buf, cap, "%s/%s", pl_dir, name);
}

static void test_enospc_on_the_checkpoint(void **state)
{
    (void)state;
    char scen[300], db[300], ck[300], tmp[300];
    pl_path(scen, sizeof scen, "enospc.yaml");
    pl_path(db, sizeof db, "results.db");
    pl_path(ck, sizeof ck, "ck/enospc.ckpt");
    pl_path(tmp, sizeof tmp, "ck/enospc.ckpt.tmp");
    FILE *f = fopen(scen, "w");
    assert_non_null(f);
    fputs(PL_SCENARIO, f);
    fclose(f);
    char ckdir[300];
    pl_path(ckdir, sizeof ckdir, "ck");
    assert_int_equal(mkdir(ckdir, 0755), 0);

    /* libfiu's preload keeps the enable string for good. */
    char supp[300];
    pl_path(supp, sizeof supp, "lsan.supp");
    f = fopen(supp, "w");
    assert_non_null(f);
    fputs("leak:fiu_run_preload.so\nleak:fiu_posix_preload.so\n", f);
    fclose(f);

    /* Without the preload the scenario passes and writes its checkpoint. */
    char *out = NULL;
    char *plain[] = {(char *)pl_dsim, "run", "enospc.yaml", "--db", "plain.db", NULL};
    int rc = pl_run(plain, &out);
    if (rc != 0)
        fail_msg("the scenario fails without a fault (exit %d):\n%s", rc, out);
    free(out);
    assert_int_equal(access(ck, F_OK), 0);
    assert_int_equal(unlink(ck), 0);

    /* Every write(2) fails with ENOSPC. -f "": no remote-control FIFOs. */
    char *argv[] = {(char *)pl_fiu_run, "-x",  "-f",          "",     "-c",         PL_ENABLE,
                    (char *)pl_dsim,    "run", "enospc.yaml", "--db", "results.db", NULL};
    dl_iterate_phdr(pl_find_asan, NULL);
    if (pl_asan[0]) {
        /* What fiu-run would export, with the sanitizer's runtime first. */
        char libs[1024], preload[2200];
        pl_fiu_preloads(libs, sizeof libs);
        snprintf(preload, sizeof preload, "%s %s", pl_asan, libs);
        printf("# under AddressSanitizer: LD_PRELOAD=\"%s\" instead of fiu-run\n", preload);
        setenv("FIU_ENABLE", PL_ENABLE, 1);
        setenv("FIU_CTRL_FIFO", "", 1);
        setenv("LD_PRELOAD", preload, 1);
        rc = pl_run(argv + 6, &out);
        unsetenv("LD_PRELOAD");
        unsetenv("FIU_ENABLE");
        unsetenv("FIU_CTRL_FIFO");
    } else {
        rc = pl_run(argv, &out);
    }
    const char *why = strstr(out, "checkpoint:") ? strstr(out, "checkpoint:") : out;
    printf("# exit %d; %.*s\n", rc, (int)strcspn(why, "\n"), why);
    if (rc == 0)
        fail_msg("dsim exited 0 though its checkpoint could not be written:\n%s", out);
    pl_has(out, "ck/enospc.ckpt");
    pl_has(out, strerror(ENOSPC));
    free(out);
    assert_int_not_equal(access(tmp, F_OK), 0); /* no temporary file left */
    assert_int_not_equal(access(ck, F_OK), 0);  /* the first write failed: none at all */

    /* The store kept the run, marked as not passed, with why. */
    sqlite3 *h = NULL;
    assert_int_equal(sqlite3_open_v2(db, &h, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
    assert_int_equal(pl_sql_int(h, "SELECT count(*) FROM runs"), 1);
    assert_int_equal(pl_sql_int(h, "SELECT count(*) FROM runs WHERE status IN ('failed', 'error')"),
                     1);
    assert_int_equal(pl_sql_int(h, "SELECT count(*) FROM events WHERE kind = 'error' AND detail "
                                   "LIKE '%No space left on device%' AND detail LIKE "
                                   "'%ck/enospc.ckpt%'"),
                     1);
    sqlite3_stmt *q = NULL;
    assert_int_equal(sqlite3_prepare_v2(h, "PRAGMA integrity_check", -1, &q, NULL), SQLITE_OK);
    assert_int_equal(sqlite3_step(q), SQLITE_ROW);
    assert_string_equal((const char *)sqlite3_column_text(q, 0), "ok");
    sqlite3_finalize(q);
    sqlite3_close(h);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s DSIM [FIU-RUN]\n", argv[0]);
        return 2;
    }
    /* Run from a scratch folder: the path must not be relative. */
    static char dsim_abs[4096];
    if (!realpath(argv[1], dsim_abs)) {
        fprintf(stderr, "%s: %s\n", argv[1], strerror(errno));
        return 2;
    }
    pl_dsim = dsim_abs;
    pl_fiu_run = argc > 2 ? argv[2] : "";
    if (!*pl_fiu_run || access(pl_fiu_run, X_OK) != 0) {
        printf("# fiu-run is not installed (Debian: fiu-utils); skipped\n");
        return 77;
    }
    const char *t = getenv("TMPDIR");
    snprintf(pl_dir, sizeof pl_dir, "%s/dsim-enospc-XXXXXX", t && *t ? t : "/tmp");
    if (!mkdtemp(pl_dir))
        return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_enospc_on_the_checkpoint),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", pl_dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", pl_dir);
    return rc;
}
