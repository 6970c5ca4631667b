/* Opening a results database: new, default path, migrated from versions 1
 * and 2, refused (newer schema, not SQLite, another application's SQLite) without
 * a byte changed; a run killed midway; a write that fails. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "dsim/err.h"
#include "dsim_config.h"
#include "store.h"
#include "store_int.h"
#include "store_util.h"

#if DSIM_HAVE_FIU
/* Without it fiu.h turns fiu_init into a no-op. */
#define FIU_ENABLE 1
#include <fiu-control.h>
#include <fiu.h>
#endif

static char tmpdir[4096];

static void db_path(char *buf, size_t n, const char *name)
{
    snprintf(buf, n, "%s/%s", tmpdir, name);
}

static bool file_exists(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0;
}

static dsim_run_id begin(dsim_store *st, const char *name)
{
    dsim_run_info ri = {.scenario = name, .engine = "threads", .seed = 1};
    dsim_run_id run = -1;
    assert_int_equal(dsim_store_begin_run(st, &ri, &run), DSIM_OK);
    return run;
}

static void write_file(const char *path, const void *data, size_t n)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, n, f), n);
    fclose(f);
}

/* Opening must refuse path with code, leave its bytes as they were, create
 * no journal next to it, and say why (every needle in the message). */
static void assert_refused_unchanged(const char *path, dsim_err code, const char *const *needles)
{
    size_t n0, n1;
    unsigned char *before = su_slurp(path, &n0);
    assert_non_null(before);
    dsim_store *st = (dsim_store *)0x1;
    assert_int_equal(dsim_store_open(path, &st), code);
    assert_null(st);
    for (const char *const *p = needles; *p; p++)
        if (!strstr(dsim_errmsg(), *p))
            fail_msg("message lacks \"%s\": %s", *p, dsim_errmsg());
    unsigned char *after = su_slurp(path, &n1);
    assert_non_null(after);
    assert_int_equal(n0, n1);
    assert_memory_equal(before, after, n0);
    char side[4200];
    snprintf(side, sizeof side, "%s-wal", path);
    assert_false(file_exists(side));
    snprintf(side, sizeof side, "%s-journal", path);
    assert_false(file_exists(side));
    free(before);
    free(after);
}

static void test_new_and_default_path(void **state)
{
    (void)state;
    char cwd[4096];
    assert_non_null(getcwd(cwd, sizeof cwd));
    char dir[4200];
    db_path(dir, sizeof dir, "cwd");
    assert_int_equal(mkdir(dir, 0700), 0);
    assert_int_equal(chdir(dir), 0);
    dsim_store *st;
    assert_int_equal(dsim_store_open(NULL, &st), DSIM_OK);
    assert_string_equal(dsim_store_path(st), "dsim.db");
    dsim_run_id run = begin(st, "default-path");
    assert_int_equal(dsim_store_end_run(st, run, DSIM_RUN_PASSED, NULL, 0), DSIM_OK);
    assert_int_equal(dsim_store_close(st), DSIM_OK);
    assert_int_equal(chdir(cwd), 0);

    char path[4300];
    snprintf(path, sizeof path, "%s/dsim.db", dir);
    /* Reopening a current database changes nothing in it. */
    size_t n0, n1;
    unsigned char *before = su_slurp(path, &n0);
    assert_int_equal(dsim_store_open(path, &st), DSIM_OK);
    assert_int_equal(dsim_store_close(st), DSIM_OK);
    unsigned char *after = su_slurp(path, &n1);
    assert_int_equal(n0, n1);
    assert_memory_equal(before, after, n0);
    free(before);
    free(after);
    sqlite3 *db = su_open(path);
    assert_int_equal(su_int(db, "SELECT count(*) FROM runs WHERE status='passed'"), 1);
    sqlite3_close(db);

    /* An empty file is a new database. */
    db_path(path, sizeof path, "empty.db");
    write_file(path, "", 0);
    assert_int_equal(dsim_store_open(path, &st), DSIM_OK);
    assert_int_equal(dsim_store_close(st), DSIM_OK);
    db = su_open(path);
    assert_int_equal(su_int(db, "PRAGMA user_version"), DSIM_STORE_SCHEMA_VERSION);
    sqlite3_close(db);

    /* A directory, a missing directory. */
    assert_int_equal(dsim_store_open(tmpdir, &st), DSIM_EINVAL);
    assert_non_null(strstr(dsim_errmsg(), "--db"));
    db_path(path, sizeof path, "no/such/dir/x.db");
    assert_int_equal(dsim_store_open(path, &st), DSIM_EIO);
    assert_non_null(strstr(dsim_errmsg(), path));
}

/* What dsim wrote as schema version 1 (no metrics, no run owner). */
static const char v1_schema[] =
    "CREATE TABLE runs (id INTEGER PRIMARY KEY, scenario TEXT NOT NULL, scenario_text TEXT,"
    "  seed INTEGER NOT NULL, engine TEXT NOT NULL, strategy TEXT, dsim_version TEXT NOT NULL,"
    "  config TEXT, status TEXT NOT NULL DEFAULT 'running'"
    "  CHECK (status IN ('running', 'passed', 'failed', 'error', 'unfinished')),"
    "  trace_hash TEXT, started_ns INTEGER NOT NULL, ended_ns INTEGER);"
    "CREATE TABLE replicas (run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,"
    "  replica INTEGER NOT NULL, worker INTEGER NOT NULL, device TEXT, host TEXT,"
    "  PRIMARY KEY (run_id, replica));"
    "CREATE TABLE steps (run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,"
    "  replica INTEGER NOT NULL, epoch INTEGER NOT NULL, step INTEGER NOT NULL, loss REAL,"
    "  reduced_loss REAL, checksum INTEGER, examples INTEGER NOT NULL,"
    "  t_start_ns INTEGER NOT NULL, t_end_ns INTEGER NOT NULL);"
    "CREATE INDEX steps_by_run ON steps(run_id, step, replica);"
    "CREATE TABLE collectives (run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,"
    "  replica INTEGER NOT NULL, op TEXT NOT NULL, algorithm TEXT, bytes INTEGER NOT NULL,"
    "  t_start_ns INTEGER NOT NULL, t_end_ns INTEGER NOT NULL, status INTEGER NOT NULL DEFAULT 0,"
    "  error TEXT);"
    "CREATE INDEX collectives_by_run ON collectives(run_id, op, algorithm);"
    "CREATE TABLE events (run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,"
    "  replica INTEGER, t_ns INTEGER NOT NULL, kind TEXT NOT NULL"
    "  CHECK (kind IN ('fault', 'error', 'restart', 'checkpoint', 'phase')), detail TEXT);"
    "CREATE INDEX events_by_run ON events(run_id, t_ns);"
    "CREATE TABLE checks (run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,"
    "  name TEXT NOT NULL, passed INTEGER NOT NULL CHECK (passed IN (0, 1)), measured REAL,"
    "  expected REAL, message TEXT);"
    "CREATE INDEX checks_by_run ON checks(run_id);"
    "CREATE VIEW run_summary AS SELECT r.id AS run_id, r.scenario, r.status FROM runs r;"
    "CREATE VIEW step_stats AS SELECT run_id, step, count(*) AS replicas FROM steps"
    "  GROUP BY run_id, step;"
    "PRAGMA application_id = 1685285229;" /* 0x6473696d */
    "PRAGMA user_version = 1;";

static const char v1_rows[] =
    "INSERT INTO runs VALUES (1, 'old-passed', 'name: old', 5, 'threads', 'mirrored', '0.0.9',"
    "  NULL, 'passed', 'abcd', 1000000000, 2000000000);"
    "INSERT INTO runs VALUES (2, 'old-killed', NULL, 6, 'sim', NULL, '0.0.9', '{}', 'running',"
    "  NULL, 3000000000, NULL);"
    "INSERT INTO replicas VALUES (1, 0, 0, 'CPU:0', 'h');"
    "INSERT INTO steps VALUES (1, 0, 0, 0, 2.5, 2.5, 77, 32, 0, 10);"
    "INSERT INTO steps VALUES (1, 0, 0, 1, 1.5, 1.5, 78, 32, 10, 20);"
    "INSERT INTO steps VALUES (2, 0, 0, 0, 9.0, 9.0, 79, 32, 0, 10);"
    "INSERT INTO checks VALUES (1, 'convergence', 1, 1.5, 2.0, NULL);"
    "INSERT INTO events VALUES (2, 0, 5, 'fault', 'kill');";

/* name|type|notnull|default|pk of every column of every table and view,
 * and the names of indexes, in a fixed order. */
static char *schema_shape(sqlite3 *db)
{
    sqlite3_stmt *s;
    assert_int_equal(
        sqlite3_prepare_v2(db,
                           "SELECT m.type || ' ' || m.name || ' ' || "
                           "coalesce(group_concat(p.name || '|' || p.type || '|' || "
                           "p.\"notnull\" || '|' || coalesce(p.dflt_value, '') || "
                           "'|' || p.pk, ','), '') "
                           "FROM sqlite_master m LEFT JOIN pragma_table_info(m.name) p "
                           "WHERE m.name NOT LIKE 'sqlite_%' "
                           "GROUP BY m.type, m.name ORDER BY m.type, m.name",
                           -1, &s, NULL),
        SQLITE_OK);
    size_t cap = 1 << 16, len = 0;
    char *out = calloc(1, cap);
    while (sqlite3_step(s) == SQLITE_ROW) {
        const char *row = (const char *)sqlite3_column_text(s, 0);
        size_t n = strlen(row);
        assert_true(len + n + 2 < cap);
        memcpy(out + len, row, n);
        len += n;
        out[len++] = '\n';
    }
    sqlite3_finalize(s);
    return out;
}

static void test_migrate_v1(void **state)
{
    (void)state;
    char path[4200], fresh[4200], buf[256];
    db_path(path, sizeof path, "v1.db");
    db_path(fresh, sizeof fresh, "fresh.db");
    sqlite3 *db;
    assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
    su_exec(db, v1_schema);
    su_exec(db, v1_rows);
    sqlite3_close(db);

    dsim_store *st;
    assert_int_equal(dsim_store_open(path, &st), DSIM_OK);
    /* Version 2 works on the migrated file: metrics and the run owner. */
    dsim_run_id run = begin(st, "after-migration");
    assert_int_equal(run, 3);
    assert_int_equal(dsim_store_metric(st, run, "m", 1.5, "s", -1), DSIM_OK);
    assert_int_equal(dsim_store_end_run(st, run, DSIM_RUN_PASSED, NULL, 0), DSIM_OK);
    assert_int_equal(dsim_store_close(st), DSIM_OK);

    db = su_open(path);
    assert_int_equal(su_int(db, "PRAGMA user_version"), DSIM_STORE_SCHEMA_VERSION);
    /* Old rows kept. */
    assert_string_equal(su_text(db, buf, sizeof buf, "SELECT status FROM runs WHERE id=1"),
                        "passed");
    assert_string_equal(su_text(db, buf, sizeof buf, "SELECT trace_hash FROM runs WHERE id=1"),
                        "abcd");
    assert_int_equal(su_int(db, "SELECT count(*) FROM steps"), 3);
    assert_int_equal(su_int(db, "SELECT checksum FROM steps WHERE run_id=1 AND step=1"), 78);
    assert_int_equal(su_int(db, "SELECT count(*) FROM events WHERE run_id=2"), 1);
    /* A version 1 run left running has no owner to ask: unfinished. */
    assert_string_equal(su_text(db, buf, sizeof buf, "SELECT status FROM runs WHERE id=2"),
                        "unfinished");
    assert_int_equal(su_int(db, "SELECT host IS NULL AND pid IS NULL FROM runs WHERE id=1"), 1);
    assert_int_equal(su_int(db, "SELECT pid FROM runs WHERE id=3"), getpid());
    assert_true(fabs(su_real(db, "SELECT value FROM metrics WHERE run_id=3") - 1.5) < 1e-12);
    /* The views are version 2's. */
    assert_int_equal(su_int(db, "SELECT steps FROM run_summary WHERE run_id=1"), 2);
    assert_int_equal(su_int(db, "SELECT examples FROM run_summary WHERE run_id=1"), 64);
    assert_int_equal(su_int(db, "SELECT checksums_agree FROM step_stats WHERE run_id=1 AND step=1"),
                     1);
    assert_string_equal(su_text(db, buf, sizeof buf, "PRAGMA integrity_check"), "ok");
    assert_int_equal(su_int(db, "PRAGMA foreign_key_check"), -999999);

    /* The same tables, columns, indexes and views as a new database. */
    assert_int_equal(dsim_store_open(fresh, &st), DSIM_OK);
    assert_int_equal(dsim_store_close(st), DSIM_OK);
    sqlite3 *dbf = su_open(fresh);
    char *a = schema_shape(db), *b = schema_shape(dbf);
    assert_string_equal(a, b);
    assert_non_null(strstr(a, "table metrics "));
    assert_non_null(strstr(a, "view collective_stats "));
    free(a);
    free(b);
    sqlite3_close(dbf);
    sqlite3_close(db);
}

/* Version 2 to 3 rebuilds the runs table (for 'hung' and 'crashed'): every
 * run and every row that references one stays, and the references still
 * cascade. */
static void test_migrate_v2(void **state)
{
    (void)state;
    char path[4200], fresh[4200], buf[256];
    db_path(path, sizeof path, "v2.db");
    db_path(fresh, sizeof fresh, "fresh3.db");
    sqlite3 *db;
    assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
    su_exec(db, "PRAGMA foreign_keys = ON");
    su_exec(db, store_migrations[0]);
    su_exec(db, store_migrations[1]);
    su_exec(db, "PRAGMA application_id = 1685285229; PRAGMA user_version = 2;");
    su_exec(db, "INSERT INTO runs (id, scenario, seed, engine, dsim_version, status, started_ns,"
                "  ended_ns, host, pid, pid_start) VALUES"
                "  (1, 'a', 1, 'threads', '0.1.0', 'passed', 1, 2, 'h', 1, 1),"
                "  (2, 'b', 2, 'threads', '0.1.0', 'failed', 3, 4, 'h', 1, 1),"
                "  (3, 'c', 3, 'threads', '0.1.0', 'unfinished', 5, NULL, 'h', 1, 1);"
                "INSERT INTO replicas VALUES (1, 0, 0, 'CPU:0', 'h');"
                "INSERT INTO steps VALUES (1, 0, 0, 0, 2.5, 2.5, 77, 32, 0, 10);"
                "INSERT INTO steps VALUES (2, 0, 0, 0, 1.5, 1.5, 78, 32, 0, 10);"
                "INSERT INTO events VALUES (3, 0, 5, 'error', 'x');"
                "INSERT INTO checks VALUES (2, 'convergence', 0, 1.5, 1.0, 'too high');"
                "INSERT INTO metrics VALUES (1, 'steps', 1, 'steps', NULL);");
    sqlite3_close(db);

    dsim_store *st;
    assert_int_equal(dsim_store_open(path, &st), DSIM_OK);
    dsim_run_id h = begin(st, "hangs"), c = begin(st, "crashes");
    assert_int_equal(h, 4);
    assert_int_equal(dsim_store_end_run(st, h, DSIM_RUN_HUNG, NULL, 0), DSIM_OK);
    assert_int_equal(dsim_store_end_run(st, c, DSIM_RUN_CRASHED, NULL, 0), DSIM_OK);
    assert_int_equal(dsim_store_end_run(st, begin(st, "x"), (dsim_run_status)99, NULL, 0),
                     DSIM_EINVAL);
    assert_int_equal(dsim_store_close(st), DSIM_OK);

    db = su_open(path);
    assert_int_equal(su_int(db, "PRAGMA user_version"), DSIM_STORE_SCHEMA_VERSION);
    assert_string_equal(su_text(db, buf, sizeof buf,
                                "SELECT group_concat(status, ',') FROM "
                                "(SELECT status FROM runs ORDER BY id)"),
                        "passed,failed,unfinished,hung,crashed,unfinished");
    assert_string_equal(dsim_run_status_name(DSIM_RUN_HUNG), "hung");
    assert_string_equal(dsim_run_status_name(DSIM_RUN_CRASHED), "crashed");
    assert_int_equal(su_int(db, "SELECT count(*) FROM steps"), 2);
    assert_int_equal(su_int(db, "SELECT count(*) FROM replicas"), 1);
    assert_int_equal(su_int(db, "SELECT count(*) FROM events WHERE run_id = 3"), 1);
    assert_int_equal(su_int(db, "SELECT count(*) FROM checks WHERE run_id = 2"), 1);
    assert_int_equal(su_int(db, "SELECT count(*) FROM metrics WHERE run_id = 1"), 1);
    assert_int_equal(su_int(db, "SELECT pid FROM runs WHERE id = 1"), 1);
    assert_int_equal(su_int(db, "SELECT steps FROM run_summary WHERE run_id = 1"), 1);
    assert_string_equal(su_text(db, buf, sizeof buf,
                                "SELECT status FROM run_summary WHERE "
                                "run_id = 4"),
                        "hung");
    assert_string_equal(su_text(db, buf, sizeof buf, "PRAGMA integrity_check"), "ok");
    assert_int_equal(su_int(db, "PRAGMA foreign_key_check"), -999999);
    /* the references still point at runs, and still cascade */
    su_exec(db, "PRAGMA foreign_keys = ON; DELETE FROM runs WHERE id = 1");
    assert_int_equal(su_int(db, "SELECT count(*) FROM steps"), 1);
    assert_int_equal(su_int(db, "SELECT count(*) FROM replicas"), 0);
    assert_int_equal(su_int(db, "SELECT count(*) FROM metrics"), 0);

    assert_int_equal(dsim_store_open(fresh, &st), DSIM_OK);
    assert_int_equal(dsim_store_close(st), DSIM_OK);
    sqlite3 *dbf = su_open(fresh);
    char *a = schema_shape(db), *b = schema_shape(dbf);
    assert_string_equal(a, b);
    free(a);
    free(b);
    sqlite3_close(dbf);
    sqlite3_close(db);
}

/* Version 4 to 5 adds reference_steps: the runs stay, a new run's reference
 * losses are stored (a second one for a step replaces the first; NaN is
 * NULL), and they go with their run. */
static void test_migrate_v4(void **state)
{
    (void)state;
    char path[4200], fresh[4200], buf[256];
    db_path(path, sizeof path, "v4.db");
    db_path(fresh, sizeof fresh, "fresh5.db");
    sqlite3 *db;
    assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
    su_exec(db, "PRAGMA foreign_keys = OFF");
    for (int k = 0; k < 4; k++)
        su_exec(db, store_migrations[k]);
    su_exec(db, "PRAGMA application_id = 1685285229; PRAGMA user_version = 4;");
    su_exec(db, "INSERT INTO runs (id, scenario, seed, engine, dsim_version, status, started_ns,"
                "  ended_ns, host, pid, pid_start) VALUES"
                "  (1, 'a', 1, 'threads', '0.1.0', 'passed', 1, 2, 'h', 1, 1);");
    sqlite3_close(db);

    dsim_store *st;
    assert_int_equal(dsim_store_open(path, &st), DSIM_OK);
    dsim_run_id run = begin(st, "ref");
    assert_int_equal(run, 2);
    assert_int_equal(dsim_store_reference_loss(st, run, 0, 1.5), DSIM_OK);
    assert_int_equal(dsim_store_reference_loss(st, run, 1, 9.0), DSIM_OK);
    assert_int_equal(dsim_store_reference_loss(st, run, 1, 1.25), DSIM_OK);
    assert_int_equal(dsim_store_reference_loss(st, run, 2, NAN), DSIM_OK);
    assert_int_equal(dsim_store_reference_loss(NULL, run, 0, 1), DSIM_EINVAL);
    assert_int_equal(dsim_store_end_run(st, run, DSIM_RUN_PASSED, NULL, 0), DSIM_OK);
    assert_int_equal(dsim_store_close(st), DSIM_OK);

    db = su_open(path);
    assert_int_equal(su_int(db, "PRAGMA user_version"), DSIM_STORE_SCHEMA_VERSION);
    assert_string_equal(su_text(db, buf, sizeof buf, "SELECT status FROM runs WHERE id = 1"),
                        "passed");
    assert_string_equal(
        su_text(db, buf, sizeof buf,
                "SELECT group_concat(step || ':' || ifnull(loss, 'null'), ' ') FROM "
                "(SELECT step, loss FROM reference_steps WHERE run_id = 2 ORDER BY step)"),
        "0:1.5 1:1.25 2:null");
    su_exec(db, "PRAGMA foreign_keys = ON; DELETE FROM runs WHERE id = 2");
    assert_int_equal(su_int(db, "SELECT count(*) FROM reference_steps"), 0);

    assert_int_equal(dsim_store_open(fresh, &st), DSIM_OK);
    assert_int_equal(dsim_store_close(st), DSIM_OK);
    sqlite3 *dbf = su_open(fresh);
    char *a = schema_shape(db), *b = schema_shape(dbf);
    assert_string_equal(a, b);
    assert_non_null(strstr(a, "table reference_steps "));
    free(a);
    free(b);
    sqlite3_close(dbf);
    sqlite3_close(db);
}

/* Version 5 to 6 adds messages: the runs and their reference losses stay,
 * a new run's frames are stored (unknown times as NULL), bad rows are
 * refused naming the store, and the frames go with their run. */
static void test_migrate_v5(void **state)
{
    (void)state;
    char path[4200], fresh[4200], buf[256];
    db_path(path, sizeof path, "v5.db");
    db_path(fresh, sizeof fresh, "fresh6.db");
    sqlite3 *db;
    assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
    su_exec(db, "PRAGMA foreign_keys = OFF");
    for (int k = 0; k < 5; k++)
        su_exec(db, store_migrations[k]);
    su_exec(db, "PRAGMA application_id = 1685285229; PRAGMA user_version = 5;");
    su_exec(db, "INSERT INTO runs (id, scenario, seed, engine, dsim_version, status, started_ns,"
                "  ended_ns, host, pid, pid_start) VALUES"
                "  (1, 'a', 1, 'threads', '0.1.0', 'passed', 1, 2, 'h', 1, 1);"
                "INSERT INTO reference_steps (run_id, step, loss) VALUES (1, 0, 2.5);");
    sqlite3_close(db);

    dsim_store *st;
    assert_int_equal(dsim_store_open(path, &st), DSIM_OK);
    dsim_run_id run = begin(st, "msgs");
    assert_int_equal(run, 2);
    dsim_msg_row m = {.attempt = 0,
                      .src = 0,
                      .dst = 1,
                      .comm_id = 1,
                      .tag = 7,
                      .seq = 1,
                      .bytes = 144,
                      .t_sent_ns = 100,
                      .t_recv_ns = 150};
    assert_int_equal(dsim_store_message(st, run, &m), DSIM_OK);
    m = (dsim_msg_row){.attempt = 1,
                       .src = 1,
                       .dst = 0,
                       .comm_id = 1,
                       .tag = 7,
                       .seq = 1,
                       .bytes = 8,
                       .t_sent_ns = 200,
                       .t_recv_ns = -1};
    assert_int_equal(dsim_store_message(st, run, &m), DSIM_OK);
    m.src = -1;
    assert_int_equal(dsim_store_message(st, run, &m), DSIM_EINVAL);
    assert_non_null(strstr(dsim_errmsg(), path));
    assert_int_equal(dsim_store_message(NULL, run, &m), DSIM_EINVAL);
    assert_int_equal(dsim_store_end_run(st, run, DSIM_RUN_PASSED, NULL, 0), DSIM_OK);
    assert_int_equal(dsim_store_close(st), DSIM_OK);

    db = su_open(path);
    assert_int_equal(su_int(db, "PRAGMA user_version"), DSIM_STORE_SCHEMA_VERSION);
    assert_int_equal(su_int(db, "SELECT count(*) FROM reference_steps WHERE run_id = 1"), 1);
    assert_string_equal(
        su_text(db, buf, sizeof buf,
                "SELECT group_concat(attempt || ':' || src || '>' || dst || ':' || bytes || ':' "
                "|| ifnull(t_sent_ns, 'null') || ':' || ifnull(t_recv_ns, 'null'), ' ') FROM "
                "(SELECT * FROM messages WHERE run_id = 2 ORDER BY rowid)"),
        "0:0>1:144:100:150 1:1>0:8:200:null");
    su_exec(db, "PRAGMA foreign_keys = ON; DELETE FROM runs WHERE id = 2");
    assert_int_equal(su_int(db, "SELECT count(*) FROM messages"), 0);

    assert_int_equal(dsim_store_open(fresh, &st), DSIM_OK);
    assert_int_equal(dsim_store_close(st), DSIM_OK);
    sqlite3 *dbf = su_open(fresh);
    char *a = schema_shape(db), *b = schema_shape(dbf);
    assert_string_equal(a, b);
    assert_non_null(strstr(a, "table messages "));
    free(a);
    free(b);
    sqlite3_close(dbf);
    sqlite3_close(db);
}

/* Version 6 to 7 says which checks were judged by default: an old row is
 * one the scenario named (0), a new row says what it was told. */
static void test_migrate_v6(void **state)
{
    (void)state;
    char path[4200], fresh[4200], buf[256];
    db_path(path, sizeof path, "v6.db");
    db_path(fresh, sizeof fresh, "fresh7.db");
    sqlite3 *db;
    assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
    su_exec(db, "PRAGMA foreign_keys = OFF");
    for (int k = 0; k < 6; k++)
        su_exec(db, store_migrations[k]);
    su_exec(db, "PRAGMA application_id = 1685285229; PRAGMA user_version = 6;");
    su_exec(db, "INSERT INTO runs (id, scenario, seed, engine, dsim_version, status, started_ns,"
                "  ended_ns, host, pid, pid_start) VALUES"
                "  (1, 'a', 1, 'threads', '0.1.0', 'passed', 1, 2, 'h', 1, 1);"
                "INSERT INTO checks (run_id, name, passed, measured, expected, message) VALUES"
                "  (1, 'shard_coverage', 1, 0, 0, 'ok');");
    sqlite3_close(db);

    dsim_store *st;
    assert_int_equal(dsim_store_open(path, &st), DSIM_OK);
    dsim_run_id run = begin(st, "defaults");
    assert_int_equal(run, 2);
    assert_int_equal(dsim_store_check_row(st, run, "node_loss", false, 1, 0.5, "slow", true),
                     DSIM_OK);
    assert_int_equal(dsim_store_check(st, run, "convergence", true, 0.1, 0.5, "ok"), DSIM_OK);
    assert_int_equal(dsim_store_end_run(st, run, DSIM_RUN_FAILED, NULL, 0), DSIM_OK);
    assert_int_equal(dsim_store_close(st), DSIM_OK);

    db = su_open(path);
    assert_int_equal(su_int(db, "PRAGMA user_version"), DSIM_STORE_SCHEMA_VERSION);
    assert_string_equal(su_text(db, buf, sizeof buf,
                                "SELECT group_concat(run_id || ':' || name || ':' || by_default, "
                                "' ') FROM (SELECT * FROM checks ORDER BY rowid)"),
                        "1:shard_coverage:0 2:node_loss:1 2:convergence:0");
    assert_int_equal(dsim_store_open(fresh, &st), DSIM_OK);
    assert_int_equal(dsim_store_close(st), DSIM_OK);
    sqlite3 *dbf = su_open(fresh);
    char *a = schema_shape(db), *b = schema_shape(dbf);
    assert_string_equal(a, b);
    free(a);
    free(b);
    sqlite3_close(dbf);
    sqlite3_close(db);
}

/* Version 3 to 4 adds flight_records: the runs stay, a flight record of a
 * new run is stored, and it goes with its run. */
static void test_migrate_v3(void **state)
{
    (void)state;
    char path[4200], fresh[4200], buf[256];
    db_path(path, sizeof path, "v3.db");
    db_path(fresh, sizeof fresh, "fresh4.db");
    sqlite3 *db;
    assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
    su_exec(db, "PRAGMA foreign_keys = OFF");
    for (int k = 0; k < 3; k++)
        su_exec(db, store_migrations[k]);
    su_exec(db, "PRAGMA application_id = 1685285229; PRAGMA user_version = 3;");
    su_exec(db, "INSERT INTO runs (id, scenario, seed, engine, dsim_version, status, started_ns,"
                "  ended_ns, host, pid, pid_start) VALUES"
                "  (1, 'a', 1, 'threads', '0.1.0', 'hung', 1, 2, 'h', 1, 1);"
                "INSERT INTO steps VALUES (1, 0, 0, 0, 2.5, 2.5, 77, 32, 0, 10);");
    sqlite3_close(db);

    dsim_store *st;
    assert_int_equal(dsim_store_open(path, &st), DSIM_OK);
    dsim_run_id run = begin(st, "flight");
    assert_int_equal(run, 2);
    dsim_flight_rec fr = {
        .replica = 3,
        .record_id = 8,
        .pg_id = 1,
        .collective_seq_id = 9,
        .profiling_name = "dsim:all_reduce",
        .input_count = 36,
        .input_dtype = "Float",
        .reduce_op = "sum",
        .root = -1,
        .algorithm = "tree",
        .state = "started",
        .waiting_for = 2,
        .error = "deadline passed",
        .time_created_ns = 100,
        .time_started_ns = 110,
        .time_completed_ns = -1,
    };
    assert_int_equal(dsim_store_flight(st, run, &fr), DSIM_OK);
    fr.state = NULL;
    assert_int_equal(dsim_store_flight(st, run, &fr), DSIM_EINVAL);
    fr.state = "started";
    fr.replica = -1;
    assert_int_equal(dsim_store_flight(st, run, &fr), DSIM_EINVAL);
    assert_int_equal(dsim_store_end_run(st, run, DSIM_RUN_FAILED, NULL, 0), DSIM_OK);
    assert_int_equal(dsim_store_close(st), DSIM_OK);

    db = su_open(path);
    assert_int_equal(su_int(db, "PRAGMA user_version"), DSIM_STORE_SCHEMA_VERSION);
    assert_string_equal(su_text(db, buf, sizeof buf, "SELECT status FROM runs WHERE id = 1"),
                        "hung");
    assert_int_equal(su_int(db, "SELECT count(*) FROM steps"), 1);
    assert_string_equal(
        su_text(db, buf, sizeof buf,
                "SELECT replica || ' ' || collective_seq_id || ' ' || profiling_name || ' ' || "
                "input_count || ' ' || input_dtype || ' ' || state || ' ' || waiting_for || ' ' || "
                "error || ' ' || (root IS NULL) || (time_discovered_completed_ns IS NULL) "
                "FROM flight_records WHERE run_id = 2"),
        "3 9 dsim:all_reduce 36 Float started 2 deadline passed 11");
    assert_string_equal(su_text(db, buf, sizeof buf, "PRAGMA integrity_check"), "ok");
    assert_int_equal(su_int(db, "PRAGMA foreign_key_check"), -999999);
    su_exec(db, "PRAGMA foreign_keys = ON; DELETE FROM runs WHERE id = 2");
    assert_int_equal(su_int(db, "SELECT count(*) FROM flight_records"), 0);

    assert_int_equal(dsim_store_open(fresh, &st), DSIM_OK);
    assert_int_equal(dsim_store_close(st), DSIM_OK);
    sqlite3 *dbf = su_open(fresh);
    char *a = schema_shape(db), *b = schema_shape(dbf);
    assert_string_equal(a, b);
    assert_non_null(strstr(a, "table flight_records "));
    free(a);
    free(b);
    sqlite3_close(dbf);
    sqlite3_close(db);
}

static void test_newer_refused(void **state)
{
    (void)state;
    char path[4200];
    db_path(path, sizeof path, "v999.db");
    sqlite3 *db;
    assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
    su_exec(db, "CREATE TABLE runs (id INTEGER PRIMARY KEY, future_column BLOB);"
                "INSERT INTO runs VALUES (1, x'00ff');"
                "PRAGMA application_id = 1685285229; PRAGMA user_version = 999;");
    sqlite3_close(db);
    char want[64];
    snprintf(want, sizeof want, "version %d", DSIM_STORE_SCHEMA_VERSION);
    const char *const needles[] = {path, "999", want, "upgrade dsim", "--db", NULL};
    assert_refused_unchanged(path, DSIM_EINVAL, needles);

    /* The same in WAL mode (as a newer dsim leaves it). */
    assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
    su_exec(db, "PRAGMA journal_mode = WAL");
    sqlite3_close(db);
    size_t n0, n1;
    unsigned char *before = su_slurp(path, &n0);
    dsim_store *st;
    assert_int_equal(dsim_store_open(path, &st), DSIM_EINVAL);
    unsigned char *after = su_slurp(path, &n1);
    assert_int_equal(n0, n1);
    assert_memory_equal(before, after, n0);
    free(before);
    free(after);
}

static void test_not_a_database_refused(void **state)
{
    (void)state;
    char path[4200];
    /* A text file (a scenario given as --db by mistake). */
    db_path(path, sizeof path, "scenario.yaml");
    const char yaml[] = "name: quickstart\nseed: 1\nengine: threads\n";
    write_file(path, yaml, sizeof yaml - 1);
    const char *const n1[] = {path, "not an SQLite file", "--db", NULL};
    assert_refused_unchanged(path, DSIM_EINVAL, n1);

    /* A few bytes. */
    db_path(path, sizeof path, "short.db");
    write_file(path, "SQLite", 6);
    assert_refused_unchanged(path, DSIM_EINVAL, n1 + 2);

    /* SQLite's header followed by garbage. */
    db_path(path, sizeof path, "garbage.db");
    char junk[4096];
    memset(junk, 0xA5, sizeof junk);
    memcpy(junk, "SQLite format 3", 16);
    write_file(path, junk, sizeof junk);
    const char *const n2[] = {path, "not a usable SQLite database", NULL};
    assert_refused_unchanged(path, DSIM_EINVAL, n2);

    /* Another application's SQLite database. */
    db_path(path, sizeof path, "other.db");
    sqlite3 *db;
    assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
    su_exec(db, "CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT);"
                "INSERT INTO notes (body) VALUES ('keep me');");
    sqlite3_close(db);
    const char *const n3[] = {path, "not a dsim results database", "--db", NULL};
    assert_refused_unchanged(path, DSIM_EINVAL, n3);

    /* ... and one that claims its own application_id. */
    assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
    su_exec(db, "PRAGMA application_id = 42; PRAGMA user_version = 1;");
    sqlite3_close(db);
    assert_refused_unchanged(path, DSIM_EINVAL, n3);
}

/* The child begins a run, commits steps 0..19, tells the parent, and keeps
 * recording until it is killed. */
static void killed_child(const char *path, int fd)
{
    dsim_store *st;
    dsim_run_info ri = {.scenario = "killed", .engine = "processes", .seed = 3};
    dsim_run_id run;
    if (dsim_store_open(path, &st) != DSIM_OK || dsim_store_begin_run(st, &ri, &run) != DSIM_OK)
        _exit(3);
    /* Bounded (about 20 s), in case the parent dies first. */
    for (int i = 0; i < 100000; i++) {
        dsim_step_rec s = {.replica = 0,
                           .step = i,
                           .loss = 100.0 - i,
                           .checksum = 1000u + i,
                           .examples = 4,
                           .t_start_ns = i,
                           .t_end_ns = i + 1};
        if (dsim_store_step(st, run, &s) != DSIM_OK)
            _exit(4);
        if (i == 19) {
            if (dsim_store_event(st, run, -1, i, DSIM_EVENT_CHECKPOINT, "step 19") != DSIM_OK ||
                dsim_store_flush(st) != DSIM_OK)
                _exit(5);
            char c = 'r';
            if (write(fd, &c, 1) != 1)
                _exit(6);
        }
        if (i > 19)
            usleep(200);
    }
}

static void test_killed_midway(void **state)
{
    (void)state;
    char path[4200], buf[64];
    db_path(path, sizeof path, "killed.db");
    int p[2];
    assert_int_equal(pipe(p), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(p[0]);
        killed_child(path, p[1]);
        _exit(7);
    }
    close(p[1]);
    char c = 0;
    ssize_t n = read(p[0], &c, 1);
    close(p[0]);
    kill(pid, SIGKILL);
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_int_equal(n, 1);
    assert_true(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);

    /* Before anyone reopens it through the store: still 'running'. */
    sqlite3 *db = su_open(path);
    assert_string_equal(su_text(db, buf, sizeof buf, "SELECT status FROM runs"), "running");
    assert_int_equal(su_int(db, "SELECT pid FROM runs"), pid);
    sqlite3_close(db);

    dsim_store *st;
    assert_int_equal(dsim_store_open(path, &st), DSIM_OK);
    assert_int_equal(dsim_store_close(st), DSIM_OK);
    db = su_open(path);
    assert_string_equal(su_text(db, buf, sizeof buf, "SELECT status FROM runs"), "unfinished");
    assert_string_equal(su_text(db, buf, sizeof buf, "SELECT status FROM run_summary"),
                        "unfinished");
    /* Everything committed before the kill, intact. */
    assert_true(su_int(db, "SELECT count(*) FROM steps") >= 20);
    assert_int_equal(su_int(db, "SELECT count(*) FROM steps WHERE step < 20 AND checksum = 1000 + "
                                "step AND loss = 100.0 - step AND examples = 4"),
                     20);
    assert_int_equal(su_int(db, "SELECT count(*) FROM events WHERE kind='checkpoint'"), 1);
    assert_int_equal(su_int(db, "SELECT ended_ns IS NULL FROM runs"), 1);
    assert_string_equal(su_text(db, buf, sizeof buf, "PRAGMA integrity_check"), "ok");
    sqlite3_close(db);
}

static void test_live_run_not_marked(void **state)
{
    (void)state;
    char path[4200], buf[64];
    db_path(path, sizeof path, "live.db");
    dsim_store *a, *b;
    assert_int_equal(dsim_store_open(path, &a), DSIM_OK);
    dsim_run_id run = begin(a, "live");
    /* Its process (this one) lives: a second open leaves it running. */
    assert_int_equal(dsim_store_open(path, &b), DSIM_OK);
    assert_int_equal(dsim_store_close(b), DSIM_OK);
    sqlite3 *db = su_open(path);
    assert_string_equal(su_text(db, buf, sizeof buf, "SELECT status FROM runs"), "running");
    /* A pid that is not this process's any more (same pid, other start). */
    su_exec(db, "INSERT INTO runs (scenario, seed, engine, dsim_version, started_ns, host, pid, "
                "pid_start) SELECT 'reused-pid', 0, 'threads', 'x', 0, host, pid, pid_start + 1 "
                "FROM runs");
    /* Closed without ending it: unfinished. */
    assert_int_equal(dsim_store_close(a), DSIM_OK);
    assert_string_equal(
        su_text(db, buf, sizeof buf, "SELECT status FROM runs WHERE id=%lld", (long long)run),
        "unfinished");
    assert_int_equal(dsim_store_open(path, &b), DSIM_OK);
    assert_int_equal(dsim_store_close(b), DSIM_OK);
    assert_string_equal(
        su_text(db, buf, sizeof buf, "SELECT status FROM runs WHERE scenario='reused-pid'"),
        "unfinished");
    sqlite3_close(db);
}

static void test_write_failure(void **state)
{
    (void)state;
#if !DSIM_HAVE_FIU
    skip();
#else
    char path[4200], buf[64];
    db_path(path, sizeof path, "fail.db");
    dsim_store *st;
    assert_int_equal(dsim_store_open(path, &st), DSIM_OK);
    dsim_run_id run = begin(st, "write-failure");
    dsim_step_rec s = {.replica = 0, .examples = 1};
    for (s.step = 0; s.step < 10; s.step++)
        assert_int_equal(dsim_store_step(st, run, &s), DSIM_OK);
    assert_int_equal(dsim_store_flush(st), DSIM_OK);

    /* The next batch finds the connection read-only: SQLite refuses it. */
    assert_int_equal(fiu_enable("dsim_store/readonly", 1, NULL, FIU_ONETIME), 0);
    assert_int_equal(dsim_store_step(st, run, &s), DSIM_OK);
    assert_int_equal(dsim_store_flush(st), DSIM_EIO);
    assert_non_null(strstr(dsim_errmsg(), path));
    assert_non_null(strstr(dsim_errmsg(), "readonly"));
    /* Sticky: every later call says so. */
    s.step++;
    assert_int_equal(dsim_store_step(st, run, &s), DSIM_EIO);
    assert_int_equal(dsim_store_flush(st), DSIM_EIO);
    assert_int_equal(dsim_store_end_run(st, run, DSIM_RUN_PASSED, NULL, 0), DSIM_EIO);
    assert_int_equal(dsim_store_close(st), DSIM_EIO);
    assert_non_null(strstr(dsim_errmsg(), path));
    fiu_disable("dsim_store/readonly");

    sqlite3 *db = su_open(path);
    assert_int_equal(su_int(db, "SELECT count(*) FROM steps"), 10);
    assert_string_equal(su_text(db, buf, sizeof buf, "PRAGMA integrity_check"), "ok");
    sqlite3_close(db);
#endif
}

int main(void)
{
#if DSIM_HAVE_FIU
    fiu_init(0);
#endif
    su_mkdtemp(tmpdir, sizeof tmpdir);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_new_and_default_path),
        cmocka_unit_test(test_migrate_v1),
        cmocka_unit_test(test_migrate_v2),
        cmocka_unit_test(test_migrate_v3),
        cmocka_unit_test(test_migrate_v4),
        cmocka_unit_test(test_migrate_v5),
        cmocka_unit_test(test_migrate_v6),
        cmocka_unit_test(test_newer_refused),
        cmocka_unit_test(test_not_a_database_refused),
        cmocka_unit_test(test_killed_midway),
        cmocka_unit_test(test_live_run_not_marked),
        cmocka_unit_test(test_write_failure),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    su_rmdir(tmpdir);
    return rc;
}
