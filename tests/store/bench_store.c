/* Throughput of step rows: the store (queue + batching writer) against the
 * naive way, one transaction per row on the caller's thread, on the same
 * schema, pragmas and disk.
 *
 * usage: bench_store [ROWS [NAIVE_ROWS]]   (default 200000, 20000) */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <sqlite3.h>

#include "dsim/err.h"
#include "store.h"
#include "store_util.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static dsim_step_rec mkstep(int replica, int64_t step)
{
    dsim_step_rec s = {.replica = replica,
                       .epoch = 0,
                       .step = step,
                       .loss = 1.0 / (double)(step + 1),
                       .reduced_loss = 0.5,
                       .checksum = (uint64_t)step * 0x9E3779B97F4A7C15ull,
                       .examples = 32,
                       .t_start_ns = step * 1000,
                       .t_end_ns = step * 1000 + 900};
    return s;
}

typedef struct prod {
    dsim_store *st;
    dsim_run_id run;
    int replica, nthreads;
    int64_t rows;
    int failed;
} prod;

/* Each producer is a replica; steps go round-robin as a training loop
 * would emit them. */
static void *producer(void *p)
{
    prod *a = p;
    for (int64_t i = a->replica; i < a->rows; i += a->nthreads) {
        dsim_step_rec s = mkstep(a->replica, i / a->nthreads);
        if (dsim_store_step(a->st, a->run, &s) != DSIM_OK) {
            a->failed = 1;
            break;
        }
    }
    return NULL;
}

static int bench_store(const char *path, int nthreads, int64_t rows, double *rate, double *enq_rate)
{
    dsim_store *st;
    if (dsim_store_open(path, &st) != DSIM_OK) {
        fprintf(stderr, "%s\n", dsim_errmsg());
        return 1;
    }
    dsim_run_info ri = {.scenario = "bench", .engine = "threads"};
    dsim_run_id run;
    if (dsim_store_begin_run(st, &ri, &run) != DSIM_OK) {
        fprintf(stderr, "%s\n", dsim_errmsg());
        return 1;
    }
    pthread_t th[64];
    prod args[64];
    double t0 = now_s();
    for (int i = 0; i < nthreads; i++) {
        args[i] = (prod){.st = st, .run = run, .replica = i, .nthreads = nthreads, .rows = rows};
        pthread_create(&th[i], NULL, producer, &args[i]);
    }
    int failed = 0;
    for (int i = 0; i < nthreads; i++) {
        pthread_join(th[i], NULL);
        failed |= args[i].failed;
    }
    double t1 = now_s();
    dsim_err e = dsim_store_flush(st);
    double t2 = now_s();
    if (failed || e != DSIM_OK ||
        dsim_store_end_run(st, run, DSIM_RUN_PASSED, NULL, 0) != DSIM_OK ||
        dsim_store_close(st) != DSIM_OK) {
        fprintf(stderr, "store failed: %s\n", dsim_errmsg());
        return 1;
    }
    sqlite3 *db = su_open(path);
    int64_t n = su_int(db, "SELECT count(*) FROM steps WHERE run_id=%lld", (long long)run);
    sqlite3_close(db);
    if (n != rows) {
        fprintf(stderr, "store committed %lld rows of %lld\n", (long long)n, (long long)rows);
        return 1;
    }
    *rate = (double)rows / (t2 - t0);
    *enq_rate = (double)rows / (t1 - t0);
    return 0;
}

/* One autocommit INSERT per row, same statement and pragmas as the store. */
static int bench_naive(const char *path, int64_t rows, double *rate)
{
    dsim_store *st;
    dsim_run_id run;
    dsim_run_info ri = {.scenario = "bench-naive", .engine = "threads"};
    if (dsim_store_open(path, &st) != DSIM_OK || dsim_store_begin_run(st, &ri, &run) != DSIM_OK ||
        dsim_store_end_run(st, run, DSIM_RUN_PASSED, NULL, 0) != DSIM_OK ||
        dsim_store_close(st) != DSIM_OK) {
        fprintf(stderr, "%s\n", dsim_errmsg());
        return 1;
    }
    sqlite3 *db = su_open(path);
    su_exec(db, "PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL; "
                "PRAGMA foreign_keys = ON");
    sqlite3_stmt *s;
    if (sqlite3_prepare_v2(db,
                           "INSERT INTO steps (run_id, replica, epoch, step, loss, reduced_loss, "
                           "checksum, examples, t_start_ns, t_end_ns) VALUES "
                           "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                           -1, &s, NULL) != SQLITE_OK) {
        fprintf(stderr, "%s\n", sqlite3_errmsg(db));
        return 1;
    }
    double t0 = now_s();
    for (int64_t i = 0; i < rows; i++) {
        dsim_step_rec r = mkstep((int)(i % 8), i / 8);
        sqlite3_bind_int64(s, 1, run);
        sqlite3_bind_int(s, 2, r.replica);
        sqlite3_bind_int(s, 3, r.epoch);
        sqlite3_bind_int64(s, 4, r.step);
        sqlite3_bind_double(s, 5, r.loss);
        sqlite3_bind_double(s, 6, r.reduced_loss);
        sqlite3_bind_int64(s, 7, (int64_t)r.checksum);
        sqlite3_bind_int64(s, 8, r.examples);
        sqlite3_bind_int64(s, 9, r.t_start_ns);
        sqlite3_bind_int64(s, 10, r.t_end_ns);
        if (sqlite3_step(s) != SQLITE_DONE) {
            fprintf(stderr, "%s\n", sqlite3_errmsg(db));
            return 1;
        }
        sqlite3_reset(s);
    }
    double t1 = now_s();
    sqlite3_finalize(s);
    sqlite3_close(db);
    *rate = (double)rows / (t1 - t0);
    return 0;
}

int main(int argc, char **argv)
{
    int64_t rows = argc > 1 ? atoll(argv[1]) : 200000;
    int64_t naive_rows = argc > 2 ? atoll(argv[2]) : 20000;
    if (rows <= 0 || naive_rows <= 0) {
        fprintf(stderr, "usage: %s [ROWS [NAIVE_ROWS]] (both > 0)\n", argv[0]);
        return 2;
    }
    char dir[4096], path[4200];
    su_mkdtemp(dir, sizeof dir);
    double naive = 0, r1 = 0, e1 = 0, r8 = 0, e8 = 0;
    int rc = 0;
    snprintf(path, sizeof path, "%s/naive.db", dir);
    rc |= bench_naive(path, naive_rows, &naive);
    snprintf(path, sizeof path, "%s/store1.db", dir);
    rc |= bench_store(path, 1, rows, &r1, &e1);
    snprintf(path, sizeof path, "%s/store8.db", dir);
    rc |= bench_store(path, 8, rows, &r8, &e8);
    su_rmdir(dir);
    if (rc)
        return 1;
    printf("step rows/s, WAL, synchronous=NORMAL (%lld rows; naive %lld rows)\n", (long long)rows,
           (long long)naive_rows);
    printf("  naive: one transaction per row       %12.0f\n", naive);
    printf("  store: 1 producer, enqueue + flush   %12.0f  (x%.1f; enqueue alone %.0f/s)\n", r1,
           r1 / naive, e1);
    printf("  store: 8 producers, enqueue + flush  %12.0f  (x%.1f; enqueue alone %.0f/s)\n", r8,
           r8 / naive, e8);
    return 0;
}
