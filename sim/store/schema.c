/* The results schema as an ordered list of migrations.
 *
 * store_migrations[k] takes a database from user_version k to k+1. A new
 * database is built by running all of them from 0, so a migrated database
 * and a new one end up with the same tables, columns, indexes and views.
 * Never edit a migration that has shipped: append the next one and raise
 * DSIM_STORE_SCHEMA_VERSION. SCHEMA.md documents the result. */
#include "store_int.h"

/* Version 1: runs and what they recorded. */
static const char schema_v1[] =
    "CREATE TABLE runs (\n"
    "  id INTEGER PRIMARY KEY,\n"
    "  scenario TEXT NOT NULL,\n"
    "  scenario_text TEXT,\n"
    "  seed INTEGER NOT NULL,\n"
    "  engine TEXT NOT NULL,\n"
    "  strategy TEXT,\n"
    "  dsim_version TEXT NOT NULL,\n"
    "  config TEXT,\n"
    "  status TEXT NOT NULL DEFAULT 'running'\n"
    "    CHECK (status IN ('running', 'passed', 'failed', 'error', 'unfinished')),\n"
    "  trace_hash TEXT,\n"
    "  started_ns INTEGER NOT NULL,\n"
    "  ended_ns INTEGER\n"
    ");\n"
    "CREATE TABLE replicas (\n"
    "  run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,\n"
    "  replica INTEGER NOT NULL,\n"
    "  worker INTEGER NOT NULL,\n"
    "  device TEXT,\n"
    "  host TEXT,\n"
    "  PRIMARY KEY (run_id, replica)\n"
    ");\n"
    "CREATE TABLE steps (\n"
    "  run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,\n"
    "  replica INTEGER NOT NULL,\n"
    "  epoch INTEGER NOT NULL,\n"
    "  step INTEGER NOT NULL,\n"
    "  loss REAL,\n"
    "  reduced_loss REAL,\n"
    "  checksum INTEGER,\n"
    "  examples INTEGER NOT NULL,\n"
    "  t_start_ns INTEGER NOT NULL,\n"
    "  t_end_ns INTEGER NOT NULL\n"
    ");\n"
    "CREATE INDEX steps_by_run ON steps(run_id, step, replica);\n"
    "CREATE TABLE collectives (\n"
    "  run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,\n"
    "  replica INTEGER NOT NULL,\n"
    "  op TEXT NOT NULL,\n"
    "  algorithm TEXT,\n"
    "  bytes INTEGER NOT NULL,\n"
    "  t_start_ns INTEGER NOT NULL,\n"
    "  t_end_ns INTEGER NOT NULL,\n"
    "  status INTEGER NOT NULL DEFAULT 0,\n"
    "  error TEXT\n"
    ");\n"
    "CREATE INDEX collectives_by_run ON collectives(run_id, op, algorithm);\n"
    "CREATE TABLE events (\n"
    "  run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,\n"
    "  replica INTEGER,\n"
    "  t_ns INTEGER NOT NULL,\n"
    "  kind TEXT NOT NULL\n"
    "    CHECK (kind IN ('fault', 'error', 'restart', 'checkpoint', 'phase')),\n"
    "  detail TEXT\n"
    ");\n"
    "CREATE INDEX events_by_run ON events(run_id, t_ns);\n"
    "CREATE TABLE checks (\n"
    "  run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,\n"
    "  name TEXT NOT NULL,\n"
    "  passed INTEGER NOT NULL CHECK (passed IN (0, 1)),\n"
    "  measured REAL,\n"
    "  expected REAL,\n"
    "  message TEXT\n"
    ");\n"
    "CREATE INDEX checks_by_run ON checks(run_id);\n"
    "CREATE VIEW run_summary AS\n"
    "SELECT r.id AS run_id, r.scenario, r.engine, r.strategy, r.seed, r.status,\n"
    "  datetime(r.started_ns / 1000000000, 'unixepoch') AS started,\n"
    "  (r.ended_ns - r.started_ns) / 1e9 AS duration_s,\n"
    "  (SELECT count(DISTINCT s.step) FROM steps s WHERE s.run_id = r.id) AS steps,\n"
    "  (SELECT count(*) FROM checks c WHERE c.run_id = r.id AND NOT c.passed) AS checks_failed\n"
    "FROM runs r;\n"
    "CREATE VIEW step_stats AS\n"
    "SELECT run_id, step, count(*) AS replicas, min(loss) AS loss_min, max(loss) AS loss_max,\n"
    "  count(DISTINCT checksum) = 1 AS checksums_agree\n"
    "FROM steps GROUP BY run_id, step;\n"
    "CREATE VIEW collective_stats AS\n"
    "SELECT run_id, op, algorithm, count(*) AS calls, sum(bytes) AS bytes,\n"
    "  avg(t_end_ns - t_start_ns) AS mean_ns, max(t_end_ns - t_start_ns) AS max_ns\n"
    "FROM collectives GROUP BY run_id, op, algorithm;\n";

/* Version 2: metrics; the process that owns a running run (so that a run
 * whose process died can be told apart from one still going); the views a
 * report reads, widened. */
static const char schema_v2[] =
    "ALTER TABLE runs ADD COLUMN host TEXT;\n"
    "ALTER TABLE runs ADD COLUMN pid INTEGER;\n"
    "ALTER TABLE runs ADD COLUMN pid_start INTEGER;\n"
    /* A version 1 run still 'running' names no process that could still be
     * writing it. */
    "UPDATE runs SET status = 'unfinished' WHERE status = 'running';\n"
    "CREATE TABLE metrics (\n"
    "  run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,\n"
    "  name TEXT NOT NULL,\n"
    "  value REAL,\n"
    "  unit TEXT,\n"
    "  replica INTEGER\n"
    ");\n"
    "CREATE INDEX metrics_by_run ON metrics(run_id, name);\n"
    "DROP VIEW IF EXISTS run_summary;\n"
    "DROP VIEW IF EXISTS step_stats;\n"
    "DROP VIEW IF EXISTS collective_stats;\n"
    "CREATE VIEW run_summary AS\n"
    "SELECT r.id AS run_id, r.scenario, r.engine, r.strategy, r.seed, r.status,\n"
    "  datetime(r.started_ns / 1000000000, 'unixepoch') AS started,\n"
    "  (r.ended_ns - r.started_ns) / 1e9 AS duration_s,\n"
    "  (SELECT count(*) FROM replicas p WHERE p.run_id = r.id) AS replicas,\n"
    "  (SELECT count(DISTINCT s.step) FROM steps s WHERE s.run_id = r.id) AS steps,\n"
    "  (SELECT sum(s.examples) FROM steps s WHERE s.run_id = r.id) AS examples,\n"
    "  (SELECT s.reduced_loss FROM steps s WHERE s.run_id = r.id\n"
    "     ORDER BY s.step DESC, s.replica LIMIT 1) AS final_loss,\n"
    "  (SELECT count(*) FROM checks c WHERE c.run_id = r.id AND c.passed) AS checks_passed,\n"
    "  (SELECT count(*) FROM checks c WHERE c.run_id = r.id AND NOT c.passed) AS checks_failed,\n"
    "  (SELECT count(*) FROM events e WHERE e.run_id = r.id AND e.kind = 'fault') AS faults,\n"
    "  r.trace_hash, r.host, r.pid\n"
    "FROM runs r;\n"
    "CREATE VIEW step_stats AS\n"
    "SELECT s.run_id, s.step, min(s.epoch) AS epoch, count(*) AS replicas,\n"
    "  min(s.loss) AS loss_min, max(s.loss) AS loss_max,\n"
    "  max(s.reduced_loss) AS reduced_loss,\n"
    "  CASE WHEN count(s.checksum) = 0 THEN NULL\n"
    "       ELSE count(DISTINCT s.checksum) = 1 END AS checksums_agree,\n"
    "  sum(s.examples) AS examples,\n"
    "  max(s.t_end_ns) - min(s.t_start_ns) AS step_ns,\n"
    "  max(s.t_end_ns - s.t_start_ns) AS slowest_ns,\n"
    "  (SELECT s2.replica FROM steps s2 WHERE s2.run_id = s.run_id AND s2.step = s.step\n"
    "     ORDER BY s2.t_end_ns - s2.t_start_ns DESC, s2.replica LIMIT 1) AS slowest_replica\n"
    "FROM steps s GROUP BY s.run_id, s.step;\n"
    "CREATE VIEW collective_stats AS\n"
    "WITH d AS (\n"
    "  SELECT run_id, op, algorithm, bytes, status, t_end_ns - t_start_ns AS ns,\n"
    "    row_number() OVER (PARTITION BY run_id, op, algorithm\n"
    "                       ORDER BY t_end_ns - t_start_ns) AS rn,\n"
    "    count(*) OVER (PARTITION BY run_id, op, algorithm) AS n\n"
    "  FROM collectives\n"
    ")\n"
    "SELECT run_id, op, algorithm, count(*) AS calls, sum(status <> 0) AS failed,\n"
    "  sum(bytes) AS bytes, avg(ns) AS mean_ns,\n"
    "  min(CASE WHEN rn = (n + 1) / 2 THEN ns END) AS p50_ns, max(ns) AS max_ns\n"
    "FROM d GROUP BY run_id, op, algorithm;\n";

/* Version 3: runs may end 'hung' (the watchdog left a worker running) or
 * 'crashed' (the process died inside a run). The CHECK on runs.status can
 * only change by rebuilding the table (store_migrate turns foreign keys
 * off around it, so the other tables' rows stay). run_summary reads runs
 * and goes with it. */
static const char schema_v3[] =
    "CREATE TABLE runs_v3 (\n"
    "  id INTEGER PRIMARY KEY,\n"
    "  scenario TEXT NOT NULL,\n"
    "  scenario_text TEXT,\n"
    "  seed INTEGER NOT NULL,\n"
    "  engine TEXT NOT NULL,\n"
    "  strategy TEXT,\n"
    "  dsim_version TEXT NOT NULL,\n"
    "  config TEXT,\n"
    "  status TEXT NOT NULL DEFAULT 'running'\n"
    "    CHECK (status IN ('running', 'passed', 'failed', 'error', 'unfinished', 'hung',\n"
    "                      'crashed')),\n"
    "  trace_hash TEXT,\n"
    "  started_ns INTEGER NOT NULL,\n"
    "  ended_ns INTEGER,\n"
    "  host TEXT,\n"
    "  pid INTEGER,\n"
    "  pid_start INTEGER\n"
    ");\n"
    "INSERT INTO runs_v3 (id, scenario, scenario_text, seed, engine, strategy, dsim_version,\n"
    "  config, status, trace_hash, started_ns, ended_ns, host, pid, pid_start)\n"
    "SELECT id, scenario, scenario_text, seed, engine, strategy, dsim_version, config, status,\n"
    "  trace_hash, started_ns, ended_ns, host, pid, pid_start FROM runs;\n"
    "DROP VIEW IF EXISTS run_summary;\n"
    "DROP TABLE runs;\n"
    "ALTER TABLE runs_v3 RENAME TO runs;\n"
    "CREATE VIEW run_summary AS\n"
    "SELECT r.id AS run_id, r.scenario, r.engine, r.strategy, r.seed, r.status,\n"
    "  datetime(r.started_ns / 1000000000, 'unixepoch') AS started,\n"
    "  (r.ended_ns - r.started_ns) / 1e9 AS duration_s,\n"
    "  (SELECT count(*) FROM replicas p WHERE p.run_id = r.id) AS replicas,\n"
    "  (SELECT count(DISTINCT s.step) FROM steps s WHERE s.run_id = r.id) AS steps,\n"
    "  (SELECT sum(s.examples) FROM steps s WHERE s.run_id = r.id) AS examples,\n"
    "  (SELECT s.reduced_loss FROM steps s WHERE s.run_id = r.id\n"
    "     ORDER BY s.step DESC, s.replica LIMIT 1) AS final_loss,\n"
    "  (SELECT count(*) FROM checks c WHERE c.run_id = r.id AND c.passed) AS checks_passed,\n"
    "  (SELECT count(*) FROM checks c WHERE c.run_id = r.id AND NOT c.passed) AS checks_failed,\n"
    "  (SELECT count(*) FROM events e WHERE e.run_id = r.id AND e.kind = 'fault') AS faults,\n"
    "  r.trace_hash, r.host, r.pid\n"
    "FROM runs r;\n";

/* Version 4: the flight records of a run that failed or failed a check,
 * one row per recorded collective call per replica, with the field names
 * of PyTorch's NCCL flight recorder (sim/diag/flight.h writes the same as
 * JSON). */
static const char schema_v4[] =
    "CREATE TABLE flight_records (\n"
    "  run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,\n"
    "  replica INTEGER NOT NULL,\n"
    "  record_id INTEGER NOT NULL,\n"
    "  pg_id INTEGER NOT NULL,\n"
    "  collective_seq_id INTEGER NOT NULL,\n"
    "  profiling_name TEXT NOT NULL,\n"
    "  input_count INTEGER,\n"
    "  input_dtype TEXT,\n"
    "  reduce_op TEXT,\n"
    "  root INTEGER,\n"
    "  algorithm TEXT,\n"
    "  state TEXT NOT NULL CHECK (state IN ('scheduled', 'started', 'completed')),\n"
    "  waiting_for INTEGER,\n"
    "  error TEXT,\n"
    "  time_created_ns INTEGER NOT NULL,\n"
    "  time_discovered_started_ns INTEGER,\n"
    "  time_discovered_completed_ns INTEGER\n"
    ");\n"
    "CREATE INDEX flight_records_by_run ON flight_records(run_id, collective_seq_id, replica);\n";

/* Version 5: the one-device reference replay's loss per step, for the
 * report's loss plot. */
static const char schema_v5[] = "CREATE TABLE reference_steps (\n"
                                "  run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,\n"
                                "  step INTEGER NOT NULL,\n"
                                "  loss REAL,\n"
                                "  PRIMARY KEY (run_id, step)\n"
                                ");\n";

/* Version 6: the transport frames between ranks of a small run (sent and
 * arrived), for the trace's arrows from a send to its receive. */
static const char schema_v6[] = "CREATE TABLE messages (\n"
                                "  run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,\n"
                                "  attempt INTEGER NOT NULL,\n"
                                "  src INTEGER NOT NULL,\n"
                                "  dst INTEGER NOT NULL,\n"
                                "  comm_id INTEGER NOT NULL,\n"
                                "  tag INTEGER NOT NULL,\n"
                                "  seq INTEGER NOT NULL,\n"
                                "  bytes INTEGER NOT NULL,\n"
                                "  t_sent_ns INTEGER,\n"
                                "  t_recv_ns INTEGER\n"
                                ");\n"
                                "CREATE INDEX messages_by_run ON messages(run_id, t_sent_ns);\n";

/* Version 7: whether a check was judged by default (it applies to the run
 * and the scenario did not name it) rather than asked for by name. */
static const char schema_v7[] =
    "ALTER TABLE checks ADD COLUMN by_default INTEGER NOT NULL DEFAULT 0\n"
    "  CHECK (by_default IN (0, 1));\n";

/* Version 8: the variables after each step, for runs that keep them
 * (dsim run --keep-params): float32 in the machine's byte order. */
static const char schema_v8[] = "CREATE TABLE params (\n"
                                "  run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,\n"
                                "  step INTEGER NOT NULL,\n"
                                "  data BLOB NOT NULL,\n"
                                "  PRIMARY KEY (run_id, step)\n"
                                ");\n";

const char *const store_migrations[DSIM_STORE_SCHEMA_VERSION] = {
    schema_v1, schema_v2, schema_v3, schema_v4, schema_v5, schema_v6, schema_v7, schema_v8};
