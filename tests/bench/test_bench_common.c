/* The benchmark's shared parts (sim/bench/bench_common.c): flag parsing, the
 * size sweep, the bandwidth formulas, and that the verifiable inputs give
 * exactly the expected results when reduced with libdsim's own kernels in
 * any rank order, for every dtype and op. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "bench_common.h"

static void test_parse_size(void **state)
{
    (void)state;
    size_t v = 0;
    assert_int_equal(bench_parse_size("16M", &v), 0);
    assert_true(v == (size_t)16 << 20);
    assert_int_equal(bench_parse_size("1k", &v), 0);
    assert_true(v == 1024);
    assert_int_equal(bench_parse_size("2G", &v), 0);
    assert_true(v == (size_t)2 << 30);
    assert_int_equal(bench_parse_size("16MB", &v), 0);
    assert_true(v == (size_t)16 << 20);
    assert_int_equal(bench_parse_size("123", &v), 0);
    assert_true(v == 123);
    const char *bad[] = {
        "", "-1", "+1", "12Q", "1.5M", "M", "16MX", "99999999999999999999", "17179869184G"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        assert_int_equal(bench_parse_size(bad[i], &v), -1);
}

/* Runs bench_parse on a NULL-terminated list; returns its status and
 * leaves what it wrote to err in msg. */
static int parse_list(unsigned flags, bench_opts *o, char *msg, size_t cap, ...)
{
    char *argv[32];
    int argc = 0;
    argv[argc++] = "bench";
    va_list ap;
    va_start(ap, cap);
    for (char *a; (a = va_arg(ap, char *)) != NULL && argc < 31;)
        argv[argc++] = a;
    va_end(ap);
    argv[argc] = NULL;
    bench_opts_default(o);
    char *buf = NULL;
    size_t len = 0;
    FILE *err = open_memstream(&buf, &len);
    assert_non_null(err);
    int rc = bench_parse("dsim bench", argc, argv, 1, flags, o, err);
    fclose(err);
    snprintf(msg, cap, "%s", buf ? buf : "");
    free(buf);
    return rc;
}

static void test_parse_flags(void **state)
{
    (void)state;
    bench_opts o;
    char msg[512];
    assert_int_equal(parse_list(BENCH_FLAG_DSIM, &o, msg, sizeof msg, "reduce_scatter", "-b", "1K",
                                "-e64K", "--stepfactor=4", "--iters", "7", "-w", "0", "-c", "0",
                                "-o", "avg", "-d", "bf16", "--ranks", "3", "--algo", "ring", "-r",
                                "2", NULL),
                     0);
    assert_string_equal(msg, "");
    assert_true(o.have_coll);
    assert_int_equal(o.coll, BENCH_REDUCE_SCATTER);
    assert_true(o.minbytes == 1024 && o.maxbytes == 65536 && o.stepfactor == 4);
    assert_int_equal(o.iters, 7);
    assert_int_equal(o.warmup, 0);
    assert_int_equal(o.check, 0);
    assert_int_equal(o.op, DSIM_MEAN);
    assert_int_equal(o.dtype, DSIM_BF16);
    assert_int_equal(o.ranks, 3);
    assert_string_equal(o.algo, "ring");
    assert_int_equal(o.root, 2);

    /* Defaults when nothing is given. */
    assert_int_equal(parse_list(0, &o, msg, sizeof msg, NULL), 0);
    assert_false(o.have_coll);
    assert_true(o.minbytes == (size_t)32 << 20 && o.iters == 20 && o.warmup == 5 && o.check == 1);
}

static void test_parse_errors(void **state)
{
    (void)state;
    bench_opts o;
    char msg[512];
    struct {
        const char *a, *b;
        const char *want1, *want2; /* both must appear in the message */
    } cases[] = {
        {"-b", "12Q", "-b", "12Q"},
        {"-e", "0", "-e", "K, M or G"},
        {"-f", "1", "-f", "2"},
        {"-n", "0", "-n", "1 to"},
        {"-w", "-1", "-w", "0 to"},
        {"-c", "2", "-c", "0 or 1"},
        {"-o", "xor", "xor", "sum, prod, min, max, avg"},
        {"-d", "complex", "complex", "bfloat16"},
        {"--ranks", "0", "--ranks", "1 to 128"},
        {"--ranks", "500", "--ranks", "500"},
        {"--bogus", "1", "--bogus", "unknown flag"},
        {"frobnicate", NULL, "frobnicate", "allgather"},
        {"-b", NULL, "-b needs a value", "size"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int rc = parse_list(BENCH_FLAG_DSIM, &o, msg, sizeof msg, cases[i].a, cases[i].b, NULL);
        assert_int_equal(rc, 2);
        assert_non_null(strstr(msg, cases[i].want1));
        assert_non_null(strstr(msg, cases[i].want2));
        assert_non_null(strstr(msg, "dsim bench"));
    }
    /* --ranks and --algo belong to dsim only. */
    assert_int_equal(parse_list(0, &o, msg, sizeof msg, "--ranks", "4", NULL), 2);
    assert_non_null(strstr(msg, "unknown flag"));
    assert_int_equal(parse_list(0, &o, msg, sizeof msg, "-b", "64M", "-e", "16M", NULL), 2);
    assert_non_null(strstr(msg, "-e"));
    assert_non_null(strstr(msg, "below -b"));
    assert_int_equal(parse_list(0, &o, msg, sizeof msg, "allreduce", "broadcast", NULL), 2);
}

static void test_sizes(void **state)
{
    (void)state;
    bench_size s = bench_size_for(BENCH_REDUCE_SCATTER, 1000, 3, DSIM_F32);
    assert_true(s.rank_count == 83 && s.count == 249 && s.bytes == 996);
    s = bench_size_for(BENCH_ALLGATHER, 1000, 3, DSIM_F64);
    assert_true(s.rank_count == 41 && s.count == 123 && s.bytes == 984);
    s = bench_size_for(BENCH_ALLREDUCE, 1001, 3, DSIM_F16);
    assert_true(s.rank_count == 500 && s.count == 500 && s.bytes == 1000);
    s = bench_size_for(BENCH_ALLGATHER, 8, 4, DSIM_F32);
    assert_true(s.bytes == 0);

    bench_opts o;
    bench_opts_default(&o);
    o.minbytes = (size_t)16 << 20;
    o.maxbytes = (size_t)64 << 20;
    o.stepfactor = 4;
    assert_int_equal(bench_nsteps(&o), 2);
    assert_true(bench_step_bytes(&o, 1) == (size_t)64 << 20);
    o.minbytes = 3;
    o.maxbytes = 100;
    o.stepfactor = 2;
    assert_int_equal(bench_nsteps(&o), 6); /* 3 6 12 24 48 96 */
    assert_true(bench_step_bytes(&o, 5) == 96);
    o.minbytes = o.maxbytes = SIZE_MAX;
    assert_int_equal(bench_nsteps(&o), 1); /* no overflow past the top */
}

static void test_bandwidth_formulas(void **state)
{
    (void)state;
    assert_true(bench_busbw_factor(BENCH_ALLREDUCE, 4) == 1.5);
    assert_true(bench_busbw_factor(BENCH_REDUCE_SCATTER, 4) == 0.75);
    assert_true(bench_busbw_factor(BENCH_ALLGATHER, 8) == 0.875);
    assert_true(bench_busbw_factor(BENCH_BROADCAST, 8) == 1.0);
    assert_true(bench_busbw_factor(BENCH_ALLREDUCE, 1) == 0.0);
    assert_true(bench_traffic_bytes(BENCH_ALLREDUCE, 4, 1000) == 8000.0);
    assert_true(bench_traffic_bytes(BENCH_REDUCE_SCATTER, 4, 1000) == 5000.0);
    assert_true(bench_traffic_bytes(BENCH_ALLGATHER, 4, 1000) == 5000.0);
    assert_true(bench_traffic_bytes(BENCH_BROADCAST, 4, 1000) == 4000.0);

    /* 1e6 B allreduce over 4 ranks in 1 ms at 2e9 B/s copied: algbw 1 GB/s,
     * busbw 1.5, bound 8e6 B of traffic / 4e9 B/s = 2 ms -> 200 %. */
    bench_row r = {.sz = {1000000, 250000, 250000}, .seconds = 1e-3};
    bench_row_finish(&r, BENCH_ALLREDUCE, 4, 2e9);
    assert_true(r.algbw > 0.999 && r.algbw < 1.001);
    assert_true(r.busbw > 1.499 && r.busbw < 1.501);
    assert_true(r.pct_bound > 199.9 && r.pct_bound < 200.1);

    double bw = bench_copy_bandwidth((size_t)8 << 20, 2);
    assert_true(bw > 1e8); /* any machine copies more than 100 MB/s */
}

static void test_row_format(void **state)
{
    (void)state;
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    assert_non_null(f);
    bench_opts o;
    bench_opts_default(&o);
    bench_print_header(f, &o, 5e9, (size_t)128 << 20, "test timing");
    bench_row r = {.sz = {4096, 1024, 1024},
                   .dtype = DSIM_F32,
                   .redop = "sum",
                   .seconds = 12.5e-6,
                   .checked = 1,
                   .wrong = 3};
    bench_row_finish(&r, BENCH_ALLREDUCE, 2, 5e9);
    bench_print_row(f, &r);
    r.checked = 0;
    bench_print_row(f, &r);
    fclose(f);
    assert_non_null(strstr(buf, "copy bandwidth: 5.00 GB/s"));
    assert_non_null(strstr(buf, "#wrong  %bound"));
    assert_non_null(strstr(buf, "test timing"));
    /* Two data lines, nine columns each; #wrong 3, then N/A. */
    int rows = 0;
    for (char *line = strtok(buf, "\n"); line; line = strtok(NULL, "\n")) {
        if (line[0] == '#')
            continue;
        char size[32], count[32], type[32], op[32], us[32], alg[32], bus[32], wr[32], pct[32];
        assert_int_equal(sscanf(line, "%31s %31s %31s %31s %31s %31s %31s %31s %31s", size, count,
                                type, op, us, alg, bus, wr, pct),
                         9);
        assert_string_equal(size, "4096");
        assert_string_equal(type, "float");
        assert_string_equal(us, "12.50");
        assert_string_equal(wr, rows == 0 ? "3" : "N/A");
        rows++;
    }
    assert_int_equal(rows, 2);
    free(buf);
}

/* Reduces every rank's input with libdsim's kernels, in rank order and in
 * reverse, and checks that bench_check_output finds nothing wrong, then one
 * wrong element after one is changed. */
static void check_reduce_exact(bench_coll c, dsim_dtype t, dsim_op op, int n)
{
    bench_size sz = bench_size_for(c, 3000 * dsim_dtype_size(t), n, t);
    size_t es = dsim_dtype_size(t);
    size_t in_n = bench_in_count(c, &sz);
    double *scratch = malloc(BENCH_CHUNK * sizeof *scratch);
    unsigned char *in = malloc(in_n * es), *fwd = malloc(in_n * es), *rev = malloc(in_n * es);
    assert_non_null(scratch);
    assert_non_null(in);
    assert_non_null(fwd);
    assert_non_null(rev);
    for (int k = 0; k < n; k++) {
        int rf = k, rr = n - 1 - k;
        bench_fill(c, op, t, n, 0, rf, &sz, k == 0 ? fwd : in, scratch);
        if (k > 0)
            assert_int_equal(dsim_reduce_local(fwd, in, in_n, t, op), DSIM_OK);
        bench_fill(c, op, t, n, 0, rr, &sz, k == 0 ? rev : in, scratch);
        if (k > 0)
            assert_int_equal(dsim_reduce_local(rev, in, in_n, t, op), DSIM_OK);
    }
    assert_int_equal(dsim_reduce_finish(fwd, in_n, t, op, n), DSIM_OK);
    assert_int_equal(dsim_reduce_finish(rev, in_n, t, op, n), DSIM_OK);
    /* Every allreduce rank checks against the same expectation: the first
     * and last rank stand for all (keeps 128 ranks fast). */
    for (int rank = 0; rank < n; rank += c == BENCH_ALLREDUCE && n > 2 ? n - 1 : 1) {
        size_t off = c == BENCH_REDUCE_SCATTER ? (size_t)rank * sz.rank_count * es : 0;
        size_t wrong = 99;
        assert_int_equal(bench_check_output(c, op, t, n, 0, rank, &sz, fwd + off, &wrong), 0);
        if (wrong != 0)
            fail_msg("%s %s %s over %d ranks: %zu wrong on rank %d", bench_coll_name(c),
                     dsim_dtype_name(t), dsim_op_name(op), n, wrong, rank);
        assert_int_equal(bench_check_output(c, op, t, n, 0, rank, &sz, rev + off, &wrong), 0);
        assert_int_equal(wrong, 0);
    }
    fwd[es * 5] ^= 0x40;
    size_t wrong = 0;
    assert_int_equal(bench_check_output(c, op, t, n, 0, 0, &sz, fwd, &wrong), 0);
    assert_int_equal(wrong, 1);
    free(scratch);
    free(in);
    free(fwd);
    free(rev);
}

static void test_reduce_inputs_exact(void **state)
{
    (void)state;
    static const int ranks[] = {1, 2, 3, 4, 7, 64, 128};
    for (int t = 0; t < DSIM_DTYPE_COUNT; t++)
        for (int op = 0; op < DSIM_OP_COUNT; op++)
            for (size_t k = 0; k < sizeof ranks / sizeof ranks[0]; k++) {
                check_reduce_exact(BENCH_ALLREDUCE, (dsim_dtype)t, (dsim_op)op, ranks[k]);
                if (ranks[k] <= 7)
                    check_reduce_exact(BENCH_REDUCE_SCATTER, (dsim_dtype)t, (dsim_op)op, ranks[k]);
            }
}

/* Allgather and broadcast move data: assemble the result by hand. */
static void test_data_inputs(void **state)
{
    (void)state;
    int n = 3;
    dsim_dtype t = DSIM_BF16;
    size_t es = dsim_dtype_size(t);
    double scratch[BENCH_CHUNK];
    bench_size sz = bench_size_for(BENCH_ALLGATHER, 600, n, t);
    unsigned char *all = malloc(sz.count * es);
    assert_non_null(all);
    for (int r = 0; r < n; r++)
        bench_fill(BENCH_ALLGATHER, DSIM_SUM, t, n, 0, r, &sz, all + (size_t)r * sz.rank_count * es,
                   scratch);
    size_t wrong = 9;
    assert_int_equal(bench_check_output(BENCH_ALLGATHER, DSIM_SUM, t, n, 0, 2, &sz, all, &wrong),
                     0);
    assert_int_equal(wrong, 0);
    /* Blocks swapped: every element of both blocks that differ is wrong. */
    memcpy(all, all + sz.rank_count * es, sz.rank_count * es);
    assert_int_equal(bench_check_output(BENCH_ALLGATHER, DSIM_SUM, t, n, 0, 2, &sz, all, &wrong),
                     0);
    assert_true(wrong > sz.rank_count / 2);
    free(all);

    /* Broadcast: a non-root's starting pattern is wrong everywhere, the
     * root's is right. */
    sz = bench_size_for(BENCH_BROADCAST, 512, n, t);
    unsigned char *buf = malloc(sz.count * es);
    assert_non_null(buf);
    bench_fill(BENCH_BROADCAST, DSIM_SUM, t, n, 1, 0, &sz, buf, scratch);
    assert_int_equal(bench_check_output(BENCH_BROADCAST, DSIM_SUM, t, n, 1, 0, &sz, buf, &wrong),
                     0);
    assert_int_equal(wrong, sz.count);
    bench_fill(BENCH_BROADCAST, DSIM_SUM, t, n, 1, 1, &sz, buf, scratch);
    assert_int_equal(bench_check_output(BENCH_BROADCAST, DSIM_SUM, t, n, 1, 0, &sz, buf, &wrong),
                     0);
    assert_int_equal(wrong, 0);
    free(buf);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse_size),          cmocka_unit_test(test_parse_flags),
        cmocka_unit_test(test_parse_errors),        cmocka_unit_test(test_sizes),
        cmocka_unit_test(test_bandwidth_formulas),  cmocka_unit_test(test_row_format),
        cmocka_unit_test(test_reduce_inputs_exact), cmocka_unit_test(test_data_inputs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
