/* `dsim bench` end to end: runs the dsim executable (argv[1]) on small sizes
 * with the check on, over several rank counts, collectives, dtypes, ops,
 * algorithms and both transports, and asserts exit 0, the columns and a
 * correct row per size; that a corrupted result is caught (exit 1, #wrong >
 * 0); and that bad flags exit 2 naming the flag. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

static const char *cli_dsim;
/* The transport the header must name. */
static const char *cli_transport = "inproc";

typedef struct cli_out {
    int status; /* exit status, or -1 if it did not exit normally */
    char *out, *err;
} cli_out;

static char *cli_slurp(int fd)
{
    size_t cap = 4096, len = 0;
    char *buf = malloc(cap);
    assert_non_null(buf);
    for (;;) {
        if (len + 1024 > cap) {
            cap *= 2;
            buf = realloc(buf, cap);
            assert_non_null(buf);
        }
        ssize_t n = read(fd, buf + len, cap - len - 1);
        if (n <= 0)
            break;
        len += (size_t)n;
    }
    buf[len] = '\0';
    return buf;
}

/* Runs dsim with the NULL-terminated arguments; env is "NAME=value" or NULL.
 * stderr goes to a temporary file so that neither pipe can fill up while
 * the other is read. */
static cli_out cli_run(const char *env, ...)
{
    char *argv[48];
    int argc = 0;
    argv[argc++] = (char *)cli_dsim;
    va_list ap;
    va_start(ap, env);
    for (char *a; (a = va_arg(ap, char *)) != NULL && argc < 47;)
        argv[argc++] = a;
    va_end(ap);
    argv[argc] = NULL;

    int outp[2];
    assert_int_equal(pipe(outp), 0);
    FILE *errf = tmpfile();
    assert_non_null(errf);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        dup2(outp[1], 1);
        dup2(fileno(errf), 2);
        close(outp[0]);
        close(outp[1]);
        if (env)
            putenv((char *)env);
        execv(cli_dsim, argv);
        _exit(127);
    }
    close(outp[1]);
    cli_out r;
    r.out = cli_slurp(outp[0]);
    close(outp[0]);
    int st = 0;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    rewind(errf);
    r.err = cli_slurp(fileno(errf));
    fclose(errf);
    return r;
}

static void cli_free(cli_out *r)
{
    free(r->out);
    free(r->err);
}

/* Checks the header and the rows: one per expected size, nine columns,
 * algbw = size / time and busbw = algbw * factor (to the printed
 * precision), #wrong equal to want_wrong (-1: any positive number). */
static int cli_check_table(const cli_out *r, const size_t *sizes, int nsizes, const char *type,
                           const char *redop, double factor, long want_wrong)
{
    const char *cols[] = {"size",  "count", "type",   "redop", "time",
                          "algbw", "busbw", "#wrong", "%bound"};
    for (size_t i = 0; i < sizeof cols / sizeof cols[0]; i++)
        if (!strstr(r->out, cols[i]))
            fail_msg("column '%s' missing from:\n%s", cols[i], r->out);
    char tp[64];
    snprintf(tp, sizeof tp, "transport %s", cli_transport);
    assert_non_null(strstr(r->out, tp));
    assert_non_null(strstr(r->out, "engine threads"));
    assert_non_null(strstr(r->out, "copy bandwidth:"));
    char *copy = strdup(r->out);
    assert_non_null(copy);
    int rows = 0;
    char *save = NULL;
    for (char *line = strtok_r(copy, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        if (line[0] == '#')
            continue;
        char sz[32], cnt[32], ty[32], op[32], wr[32];
        double us, alg, bus, pct;
        int n = sscanf(line, "%31s %31s %31s %31s %lf %lf %lf %31s %lf", sz, cnt, ty, op, &us, &alg,
                       &bus, wr, &pct);
        if (n != 9)
            fail_msg("row '%s' does not have the nine columns", line);
        assert_true(rows < nsizes);
        assert_int_equal(strtoull(sz, NULL, 10), sizes[rows]);
        assert_string_equal(ty, type);
        assert_string_equal(op, redop);
        assert_true(us > 0 && pct >= 0);
        double want_alg = (double)sizes[rows] / (us * 1e3);
        /* The time is printed to 0.005 us at best. */
        double rel = 0.01 + 0.006 / us;
        if (fabs(alg - want_alg) > 0.006 + rel * want_alg ||
            fabs(bus - want_alg * factor) > 0.006 + rel * want_alg * factor)
            fail_msg("row '%s': algbw/busbw do not match size / time (factor %g)", line, factor);
        long w = strtol(wr, NULL, 10);
        if (want_wrong >= 0)
            assert_int_equal(w, want_wrong);
        else
            assert_true(w > 0);
        rows++;
    }
    free(copy);
    assert_int_equal(rows, nsizes);
    return rows;
}

static void test_allreduce_rank_counts(void **state)
{
    (void)state;
    static const char *ranks[] = {"1", "2", "3", "4"};
    static const size_t sizes[] = {1024, 8192, 65536};
    for (size_t i = 0; i < sizeof ranks / sizeof ranks[0]; i++) {
        cli_out r = cli_run(NULL, "bench", "allreduce", "-b", "1K", "-e", "64K", "-f", "8", "-n",
                            "2", "-w", "1", "-c", "1", "--ranks", ranks[i], NULL);
        if (r.status != 0)
            fail_msg("--ranks %s: exit %d\n%s%s", ranks[i], r.status, r.out, r.err);
        double n = atof(ranks[i]);
        cli_check_table(&r, sizes, 3, "float", "sum", 2 * (n - 1) / n, 0);
        char want[64];
        snprintf(want, sizeof want, "allreduce: %s ranks", ranks[i]);
        assert_non_null(strstr(r.out, want));
        assert_non_null(strstr(r.out, "Out of bounds values : 0 OK"));
        /* the latency floor beside the table: a positive time a call */
        const char *lat = strstr(r.out, "# 8-byte all-reduce   : ");
        if (!lat || !(atof(lat + strlen("# 8-byte all-reduce   : ")) > 0))
            fail_msg("--ranks %s: no 8-byte all-reduce latency in:\n%s", ranks[i], r.out);
        cli_free(&r);
    }
}

/* The processes engine over each transport it takes: shm by default. */
static void test_processes_transports(void **state)
{
    (void)state;
    static const char *asked[] = {NULL, "shm", "tcp"};
    static const char *want[] = {"transport shm", "transport shm", "transport tcp"};
    for (size_t i = 0; i < 3; i++) {
        cli_out r =
            asked[i] ? cli_run(NULL, "bench", "allreduce", "-b", "4K", "-e", "64K", "-f", "16",
                               "-n", "2", "-w", "1", "--ranks", "3", "--engine", "processes",
                               "--transport", asked[i], NULL)
                     : cli_run(NULL, "bench", "allreduce", "-b", "4K", "-e", "64K", "-f", "16",
                               "-n", "2", "-w", "1", "--ranks", "3", "--engine", "processes", NULL);
        if (r.status != 0 || !strstr(r.out, want[i]) ||
            !strstr(r.out, "Out of bounds values : 0 OK"))
            fail_msg("processes over %s: exit %d\n%s%s", asked[i] ? asked[i] : "(default)",
                     r.status, r.out, r.err);
        cli_free(&r);
    }
}

static void test_algorithms(void **state)
{
    (void)state;
    static const char *algos[] = {"ring", "rhd", "tree", "reduce_to_one"};
    static const size_t sizes[] = {4000, 64000};
    for (size_t i = 0; i < sizeof algos / sizeof algos[0]; i++) {
        for (int n = 3; n <= 4; n++) {
            char nr[8];
            snprintf(nr, sizeof nr, "%d", n);
            cli_out r = cli_run(NULL, "bench", "allreduce", "-b", "4000", "-e", "64000", "-f", "16",
                                "-n", "2", "-w", "1", "-d", "int32", "-o", "max", "--ranks", nr,
                                "--algo", algos[i], NULL);
            if (r.status != 0)
                fail_msg("--algo %s --ranks %d: exit %d\n%s%s", algos[i], n, r.status, r.out,
                         r.err);
            cli_check_table(&r, sizes, 2, "int32", "max", 2.0 * (n - 1) / n, 0);
            char want[64];
            snprintf(want, sizeof want, "algo %s", algos[i]);
            assert_non_null(strstr(r.out, want));
            cli_free(&r);
        }
    }
}

static void test_other_collectives(void **state)
{
    (void)state;
    /* reduce_scatter and allgather round 1000 B down to whole blocks: 3
     * ranks of 83 floats (996 B) or 41 doubles (984 B). */
    struct {
        const char *coll, *dtype, *op, *type, *redop;
        size_t size;
        double factor; /* nccl-tests' busbw factor at 3 ranks */
    } cases[] = {
        {"reduce_scatter", "float", "sum", "float", "sum", 996, 2.0 / 3},
        {"reduce_scatter", "half", "avg", "half", "avg", 996, 2.0 / 3},
        {"allgather", "double", "sum", "double", "none", 984, 2.0 / 3},
        {"broadcast", "bf16", "sum", "bfloat16", "none", 1000, 1.0},
        {"allreduce", "i64", "prod", "int64", "prod", 1000, 4.0 / 3},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        cli_out r =
            cli_run(NULL, "bench", cases[i].coll, "-b", "1000", "-e", "1000", "-n", "2", "-w", "1",
                    "-d", cases[i].dtype, "-o", cases[i].op, "-r", "2", "--ranks", "3", NULL);
        if (r.status != 0)
            fail_msg("%s: exit %d\n%s%s", cases[i].coll, r.status, r.out, r.err);
        cli_check_table(&r, &cases[i].size, 1, cases[i].type, cases[i].redop, cases[i].factor, 0);
        cli_free(&r);
    }
}

static void test_wrong_result_caught(void **state)
{
    (void)state;
    static const size_t sizes[] = {4096};
    cli_out r = cli_run("DSIM_BENCH_CORRUPT=1", "bench", "allreduce", "-b", "4K", "-e", "4K", "-n",
                        "1", "-w", "0", "--ranks", "2", NULL);
    assert_int_equal(r.status, 1);
    cli_check_table(&r, sizes, 1, "float", "sum", 1.0, 1);
    assert_non_null(strstr(r.out, "FAILED"));
    assert_non_null(strstr(r.err, "wrong"));
    cli_free(&r);

    /* With -c 0 nothing is checked, so nothing is reported wrong. */
    r = cli_run("DSIM_BENCH_CORRUPT=1", "bench", "allreduce", "-b", "4K", "-e", "4K", "-n", "1",
                "-w", "0", "-c", "0", "--ranks", "2", NULL);
    assert_int_equal(r.status, 0);
    assert_non_null(strstr(r.out, "N/A"));
    cli_free(&r);
}

/* The same check over tcp sockets (every rank still in this process). */
static void test_tcp_transport(void **state)
{
    (void)state;
    static const size_t sizes[] = {4096, 65536, 1048576};
    static const char *algos[] = {"ring", "rhd", "auto"};
    cli_transport = "tcp";
    for (size_t i = 0; i < sizeof algos / sizeof algos[0]; i++) {
        cli_out r =
            cli_run(NULL, "bench", "allreduce", "-b", "4K", "-e", "1M", "-f", "16", "-n", "2", "-w",
                    "1", "--ranks", "4", "--algo", algos[i], "--transport", "tcp", NULL);
        if (r.status != 0)
            fail_msg("--transport tcp --algo %s: exit %d\n%s%s", algos[i], r.status, r.out, r.err);
        cli_check_table(&r, sizes, 3, "float", "sum", 1.5, 0);
        assert_non_null(strstr(r.out, "Out of bounds values : 0 OK"));
        cli_free(&r);
    }
    static const size_t one[] = {4096};
    cli_out r = cli_run("DSIM_BENCH_CORRUPT=2", "bench", "allreduce", "-b", "4K", "-e", "4K", "-n",
                        "1", "-w", "0", "--ranks", "3", "--transport", "tcp", NULL);
    assert_int_equal(r.status, 1);
    cli_check_table(&r, one, 1, "float", "sum", 4.0 / 3, 1);
    cli_free(&r);
    cli_transport = "inproc";
}

static void test_bad_flags(void **state)
{
    (void)state;
    struct {
        const char *a, *b, *c;
        const char *want;
    } cases[] = {
        {"allreduce", "-b", "12Q", "12Q"},
        {"allreduce", "--bogus", "1", "--bogus"},
        {"allreduce", "-d", "complex", "complex"},
        {"allreduce", "--algo", "magic", "magic"},
        {"allreduce", "--transport", "udp", "udp"},
        {"allreduce", "-c", "2", "-c"},
        {"allreduce", "--ranks", "0", "--ranks"},
        {"broadcast", "-r", "9", "-r 9"},
        {"allgather", "--algo", "ring", "allreduce only"},
        {"scatter", "-n", "1", "scatter"},
        {"-n", "1", NULL, "name a collective"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        cli_out r = cli_run(NULL, "bench", cases[i].a, cases[i].b, cases[i].c, NULL);
        if (r.status != 2 || !strstr(r.err, cases[i].want))
            fail_msg("'%s %s %s': exit %d, stderr: %s", cases[i].a, cases[i].b,
                     cases[i].c ? cases[i].c : "", r.status, r.err);
        assert_string_equal(r.out, "");
        cli_free(&r);
    }
    cli_out r = cli_run(NULL, "bench", "--help", NULL);
    assert_int_equal(r.status, 0);
    assert_non_null(strstr(r.out, "--minbytes"));
    cli_free(&r);
}

/* dsim bench model: a row per shape and batch for every kernel set asked,
 * the comparisons, the optimizers; bad flags exit 2 naming them. */
static void test_model(void **state)
{
    (void)state;
    cli_out r = cli_run(NULL, "bench", "model", "--kernels", "all", "--compare", "--min-time",
                        "0.001", "--peak", "128", NULL);
    if (r.status != 0)
        fail_msg("exit %d, stderr: %s", r.status, r.err);
    assert_non_null(strstr(r.out, "single-core peak"));
    assert_non_null(strstr(r.out, "mlp 120-256-128-16"));
    assert_non_null(strstr(r.out, " generic "));
    assert_non_null(strstr(r.out, " loops "));
    assert_non_null(strstr(r.out, "optimizer adam"));
    /* every row of the 1024 x 100 job's model at batch 4 has a positive rate */
    int rows = 0;
    for (const char *p = r.out; (p = strstr(p, "mlp 120-256-128-16")); p++) {
        size_t params = 0, batch = 0;
        char how[16];
        double us = 0, g = 0;
        assert_int_equal(
            sscanf(p, "mlp 120-256-128-16 %zu %zu %15s %lf %lf", &params, &batch, how, &us, &g), 5);
        assert_int_equal(params, 65936);
        assert_true(us > 0 && g > 0);
        rows += batch == 4;
    }
    assert_true(rows >= 2); /* generic and loops at least */
    cli_free(&r);
    static const char *bad[][3] = {
        {"--kernels", "sse9", "sse9"},
        {"--min-time", "0", "--min-time"},
        {"--peak", "-3", "--peak"},
        {"--bogus", NULL, "--bogus"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        r = cli_run(NULL, "bench", "model", bad[i][0], bad[i][1], NULL);
        if (r.status != 2 || !strstr(r.err, bad[i][2]))
            fail_msg("'bench model %s': exit %d, stderr: %s", bad[i][0], r.status, r.err);
        cli_free(&r);
    }
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s PATH-TO-DSIM\n", argv[0]);
        return 2;
    }
    cli_dsim = argv[1];
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_allreduce_rank_counts),
        cmocka_unit_test(test_algorithms),
        cmocka_unit_test(test_other_collectives),
        cmocka_unit_test(test_wrong_result_caught),
        cmocka_unit_test(test_tcp_transport),
        cmocka_unit_test(test_processes_transports),
        cmocka_unit_test(test_bad_flags),
        cmocka_unit_test(test_model),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
