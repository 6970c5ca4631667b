#!/usr/bin/env python3
"""`dsim report`, `dsim trace` and `dsim run --report`, run as a user runs them.

Runs the quickstart and a node-loss scenario into a fresh store with
--report, then checks: the last line printed is the report's path, next to
the store; the page is self-contained (no script, no external reference)
and its plots hold data; the node-loss run's fault and restart are on its
timeline; the trace is valid Chrome trace-event JSON (trace_check.py) with
a track of steps per replica, the fault and the restart; with collective
times in the store, the all-reduce share is drawn and the trace holds
paired flow arrows; every stored frame that arrived is an arrow from its
sender's track to its receiver's lasting as long as the store says (threads,
the node-loss run's both attempts, processes, sim); a processes run stores
its children's collectives, so its trace has collective slices for every
replica and its report the all-reduce share; a divergent checksum is named as the first divergent
step; text from the store is escaped; a long run's trace is sampled and
says so; several runs are compared; bad input (unknown run id, not a run
id, no store, a damaged store, an unwritable output) is a clear error with
exit status 2.

usage: report_cli.py DSIM SCENARIO_DIR
"""
import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import trace_check  # noqa: E402

DSIM, SCEN = (os.path.abspath(a) for a in sys.argv[1:3])
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL: " + what)
    return cond


def dsim(args, cwd):
    p = subprocess.run([DSIM] + args, cwd=cwd, capture_output=True, timeout=300)
    return p.returncode, p.stdout.decode("utf-8", "replace"), p.stderr.decode("utf-8", "replace")


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def plots(html):
    """{class: data-points} of each plot's <svg>."""
    out = {}
    for m in re.finditer(r'<svg class="plot ([a-z]+)" data-points="(\d+)"', html):
        out.setdefault(m.group(1), []).append(int(m.group(2)))
    return out


def self_contained(html, label):
    check("<script" not in html.lower(), label + ": has a <script>")
    for m in re.finditer(r'(?:src|href)\s*=\s*"([^"]*)"', html):
        check(m.group(1).startswith("#"), label + ": refers outside the page: " + m.group(1))
    check("url(" not in html and "@import" not in html, label + ": style loads something")
    for m in re.finditer(r"https?://[^\"' <]+", html):
        check(m.group(0) == "http://www.w3.org/2000/svg", label + ": names " + m.group(0))


def trace(tmp, db, run_id, name):
    out = os.path.join(tmp, name)
    rc, so, se = dsim(["trace", str(run_id), "--db", db, "-o", out], tmp)
    check(rc == 0 and so.strip() == out, "dsim trace %s: rc %d, %s %s" % (run_id, rc, so, se))
    doc = json.loads(read(out))
    errs = trace_check.errors(doc)
    check(not errs, "trace of run %s is not valid: %s" % (run_id, errs[:5]))
    return doc


def track_replica(tid):
    """The replica whose track (its own or its collectives') tid is."""
    return tid - (1 << 20) if tid >= (1 << 20) else tid - 1


def msg_flows(tmp, db, run_id, label):
    """The trace of a run has one arrow per stored frame that arrived, from
    the sender's track to the receiver's, as long as the stored times say;
    returns the trace."""
    doc = trace(tmp, db, run_id, "msgs-%s-%d.json" % (os.path.basename(db), run_id))
    con = sqlite3.connect(db)
    rows = con.execute("SELECT attempt, src, dst, comm_id, seq, t_sent_ns, t_recv_ns FROM "
                       "messages WHERE run_id = ? AND t_recv_ns IS NOT NULL AND t_sent_ns IS NOT "
                       "NULL", (run_id,)).fetchall()
    con.close()
    check(len(rows) > 0, "%s run %d: no messages stored" % (label, run_id))
    stored = {(a, s, d, c, q): (t1 - t0) / 1e3 for a, s, d, c, q, t0, t1 in rows}
    ms = [e for e in doc["traceEvents"] if e.get("cat") == "message"]
    st = {e["id"]: e for e in ms if e["ph"] == "s"}
    fi = {e["id"]: e for e in ms if e["ph"] == "f"}
    check(len(st) == len(stored) and set(st) == set(fi),
          "%s run %d: %d arrows (%d ends) for %d stored frames; %s" %
          (label, run_id, len(st), len(fi), len(stored), doc["otherData"].get("messages")))
    for i, s in st.items():
        f, a = fi[i], s["args"]
        key = (a["attempt"], track_replica(s["tid"]), track_replica(f["tid"]), a["comm"], a["seq"])
        check(key in stored, "%s run %d: arrow %s is no stored frame (tracks %d -> %d)" %
              (label, run_id, a, s["tid"], f["tid"]))
        check(abs((f["ts"] - s["ts"]) - stored[key]) < 1e-3 and f.get("bp") == "e",
              "%s run %d: arrow %s lasts %s us, the frame %s" %
              (label, run_id, a, f["ts"] - s["ts"], stored[key]))
    check(doc["otherData"]["messages"].startswith("%d arrows" % len(stored)),
          "%s run %d: otherData.messages: %s" % (label, run_id, doc["otherData"]["messages"]))
    return doc


def flow_rules():
    """trace_check.py finds what breaks the flow rules."""
    def doc(*flows):
        base = [{"name": "a", "ph": "X", "ts": 10, "dur": 10, "pid": 1, "tid": 1},
                {"name": "b", "ph": "X", "ts": 15, "dur": 10, "pid": 1, "tid": 2}]
        return {"traceEvents": base + [dict({"name": "m", "pid": 1}, **f) for f in flows]}

    def s(ts=12, tid=1, i=1, cat="message"):
        return {"ph": "s", "ts": ts, "tid": tid, "id": i, "cat": cat}

    def f(ts=16, tid=2, i=1, cat="message", bp="e"):
        e = {"ph": "f", "ts": ts, "tid": tid, "id": i, "cat": cat}
        if bp:
            e["bp"] = bp
        return e

    check(not trace_check.errors(doc(s(), f())), "trace_check: a good flow is refused: %s"
          % trace_check.errors(doc(s(), f())))
    for label, bad in (("an s without its f", doc(s())),
                       ("two f for one s", doc(s(), f(), f(ts=17))),
                       ("an f before its s", doc(s(ts=19, tid=1), f(ts=16))),
                       ("an s outside every slice", doc(s(ts=5), f())),
                       ("an f (bp e) outside every slice", doc(s(), f(ts=30))),
                       ("an f (next slice) with none after it", doc(s(), f(ts=30, bp=None))),
                       ("another cat at the end", doc(s(), f(cat="wait"))),
                       ("no cat", doc(s(cat=None), f(cat=None)))):
        check(trace_check.errors(bad), "trace_check: %s passes" % label)


def main():
    flow_rules()
    tmp = tempfile.mkdtemp(prefix="dsim-report-")
    try:
        db = os.path.join(tmp, "store", "runs.db")
        os.mkdir(os.path.dirname(db))
        quick = os.path.join(SCEN, "quickstart.yaml")
        loss = os.path.join(SCEN, "faults", "worker_dies_between_collectives.yaml")

        # dsim run --report: the last line is the path, next to the store
        rc, so, se = dsim(["run", quick, loss, "--db", db, "--report"], tmp)
        check(rc == 0, "dsim run --report: rc %d\n%s\n%s" % (rc, so, se))
        last = so.rstrip("\n").split("\n")[-1]
        want = os.path.join(os.path.dirname(db), "dsim-report-1-2.html")
        check(last == want, "dsim run --report: last line %r, wanted %r" % (last, want))
        check(os.path.isfile(want), "dsim run --report wrote no " + want)
        check("run 2 stored in" in so, "dsim run --report changed the table: " + so[-400:])
        rc, so, _ = dsim(["run", quick, "--db", db, "--report", "--json"], tmp)
        check(json.loads(so).get("report") == os.path.join(os.path.dirname(db),
                                                          "dsim-report-3.html"),
              "dsim run --report --json: no report in " + so[-300:])

        # a desynchronised strategy: its report carries the desync analysis
        # of the flight records the run left next to the store
        ddb = os.path.join(tmp, "desync", "d.db")
        os.mkdir(os.path.dirname(ddb))
        rc, so, se = dsim(["run", os.path.join(SCEN, "custom_strategy_mismatch.yaml"), "--db",
                           ddb], tmp)
        check(rc == 0, "custom_strategy_mismatch: rc %d\n%s\n%s" % (rc, so, se))
        dout = os.path.join(tmp, "desync.html")
        rc, so, se = dsim(["report", "last", "--db", ddb, "-o", dout], tmp)
        check(rc == 0, "dsim report of the desync run: rc %d %s" % (rc, se))
        dh = read(dout) if rc == 0 else ""
        check("collective calls (flight records)" in dh and
              "the first collective the ranks disagree about: #3" in dh and
              "dtype and count differ" in dh,
              "the desync run's report lacks the desync analysis")
        # ... and its trace carries each recorded call with its fingerprint
        tj = os.path.join(tmp, "desync.json")
        rc, so, se = dsim(["trace", "last", "--db", ddb, "-o", tj], tmp)
        fl = [e for e in json.loads(read(tj))["traceEvents"] if e.get("cat") == "flight"] \
            if rc == 0 else []
        check(rc == 0 and not trace_check.errors(json.loads(read(tj))),
              "the desync run's trace is not valid: %s" % se)
        check(any(e["args"].get("collective_seq_id") == 3 and "input_dtype" in e["args"] and
                  "input_count" in e["args"] for e in fl),
              "the desync run's trace lacks the flight records' fingerprints (%d slices)" % len(fl))
        check("collective calls (flight records)" not in read(want),
              "a run without flight records shows a desync section")

        con = sqlite3.connect(db)
        n_checks = con.execute("SELECT count(*) FROM checks WHERE run_id = 1").fetchone()[0]
        replicas = con.execute("SELECT count(*) FROM replicas WHERE run_id = 2").fetchone()[0]

        # one run: the page and its plots
        out = os.path.join(tmp, "one.html")
        rc, so, se = dsim(["report", "1", "--db", db, "-o", out], tmp)
        check(rc == 0 and so.strip() == out, "dsim report 1: rc %d %s %s" % (rc, so, se))
        html = read(out)
        self_contained(html, "report 1")
        nref = sqlite3.connect(db).execute(
            "SELECT count(*) FROM reference_steps WHERE run_id = 1").fetchone()[0]
        check(nref == 48, "the quickstart's reference losses stored: %d of 48 steps" % nref)
        check("</i>one-device reference</span>" in html,
              "report 1 draws no per-step reference loss")
        check(html.count('<tr class="pass">') + html.count('<tr class="fail">') == n_checks,
              "report 1: the checks table has not the %d stored checks" % n_checks)
        p = plots(html)
        for cls in ("loss", "rate", "steptime", "timeline"):
            check(p.get(cls) and p[cls][0] > 0, "report 1: plot %s has no data (%s)" % (cls, p))
        pl = re.findall(r'<polyline class="series"[^>]* points="([^"]*)"', html)
        check(len(pl) >= 2 and all(len(x.split()) >= 2 for x in pl[:2]),
              "report 1: the loss has no lines: %s" % pl[:2])
        check("seed" in html and "quickstart" in html, "report 1: no scenario or seed")
        check(p.get("comm") == [4], "report 1: no all-reduce share of 4 replicas: %s" % p)
        check("<th>rendezvous ms</th>" in html, "report 1: no cold-start phases")

        # the node-loss run: the fault and the restart, on the timeline too
        html2 = read(want)
        check("rank 3 killed" in html2 and "recovered after restarting" in html2,
              "report 1-2: the fault or the restart is missing")
        check(html2.count('<path class="mark"') >= 2, "report 1-2: no event marks")
        check("2 runs compared" in html2 and "comparison" in html2,
              "report 1-2: no comparison of the two runs")

        # the trace of the node-loss run
        doc = trace(tmp, db, 2, "t2.json")
        evs = doc["traceEvents"]
        steps = [e for e in evs if e["ph"] == "X" and e.get("cat") == "step"]
        check({e["tid"] for e in steps} == set(range(1, replicas + 1)),
              "trace 2: not a track of steps per replica: %s" % {e["tid"] for e in steps})
        check(any(e["ph"] == "i" and e.get("cat") == "fault" and e["tid"] == 4 for e in evs),
              "trace 2: no fault on replica 3's track")
        check(any(e["ph"] == "i" and e.get("cat") == "restart" for e in evs),
              "trace 2: no restart")
        check(any(e["ph"] == "B" and e["name"] == "attempt 1" for e in evs),
              "trace 2: no second attempt after the restart")
        check(doc["otherData"]["sampling"].startswith("none"), "trace 2: sampled")
        coll = [e for e in evs if e["ph"] == "X" and e.get("cat") == "collective"]
        check({e["tid"] for e in coll} == {(1 << 20) + k for k in range(replicas)},
              "trace 2: not a track of collectives per replica")
        check(any(e["ph"] == "s" for e in evs), "trace 2: no flow arrows")
        check(any(e["ph"] == "X" and e.get("cat") == "phase" and e["name"] == "create_variables"
                  for e in evs), "trace 2: no cold-start phases")
        check(any(e["ph"] == "i" and e.get("cat") == "checkpoint" for e in evs),
              "trace 2: no checkpoint writes")

        # arrows from each frame's send to its arrival, as stored
        msg_flows(tmp, db, 1, "threads")
        doc2m = msg_flows(tmp, db, 2, "threads, node loss")
        check(con.execute("SELECT count(DISTINCT attempt) FROM messages WHERE run_id = 2")
              .fetchone()[0] == 2, "run 2: no messages of the attempt after the restart")
        check(any(e.get("cat") == "message" and e["ph"] == "s" and e["args"]["attempt"] == 1
                  for e in doc2m["traceEvents"]), "trace 2: no arrows after the restart")

        # the processes engine: the children's phases reach the store, so
        # the trace has steps and collectives for every replica, and the
        # children's message halves join into arrows
        pdb = os.path.join(tmp, "procs", "p.db")
        os.mkdir(os.path.dirname(pdb))
        rc, so, se = dsim(["run", quick, "--engine", "processes", "--db", pdb], tmp)
        check(rc == 0, "quickstart on processes: rc %d\n%s\n%s" % (rc, so, se))
        pc = sqlite3.connect(pdb)
        preps = pc.execute("SELECT count(*) FROM replicas WHERE run_id = 1").fetchone()[0]
        check(pc.execute("SELECT engine FROM runs WHERE id = 1").fetchone()[0] == "processes",
              "the processes run is not stored as one")
        per = dict(pc.execute("SELECT replica, count(*) FROM collectives WHERE run_id = 1 AND "
                              "op = 'allreduce' AND status = 0 GROUP BY replica").fetchall())
        nsteps = pc.execute("SELECT count(DISTINCT step) FROM steps WHERE run_id = 1").fetchone()[0]
        check(preps == 4 and per == {k: nsteps for k in range(preps)},
              "processes run: all-reduce rows per replica %s, wanted %d each of %d" %
              (per, nsteps, preps))
        pdoc = msg_flows(tmp, pdb, 1, "processes")
        pevs = pdoc["traceEvents"]
        pcoll = {e["tid"] - (1 << 20) for e in pevs
                 if e["ph"] == "X" and e.get("cat") == "collective"}
        check(pcoll == set(range(preps)),
              "processes trace: collective slices for replicas %s of %d" % (pcoll, preps))
        check({e["tid"] - 1 for e in pevs if e["ph"] == "X" and e.get("cat") == "step"} ==
              set(range(preps)), "processes trace: not a track of steps per replica")
        check(any(e["ph"] == "X" and e.get("cat") == "phase" and e["name"] == "create_variables"
                  for e in pevs), "processes trace: no cold-start phases")
        pout = os.path.join(tmp, "procs.html")
        rc, so, se = dsim(["report", "1", "--db", pdb, "-o", pout], tmp)
        check(rc == 0 and plots(read(pout)).get("comm") == [preps],
              "processes report: no all-reduce share of %d replicas: %s %s" %
              (preps, plots(read(pout)) if rc == 0 else None, se))
        pc.close()

        # the sim engine: frames on the virtual clock
        sdb = os.path.join(tmp, "simeng", "s.db")
        os.mkdir(os.path.dirname(sdb))
        rc, so, se = dsim(["run", quick, "--engine", "sim", "--db", sdb], tmp)
        check(rc == 0, "quickstart on sim: rc %d\n%s\n%s" % (rc, so, se))
        msg_flows(tmp, sdb, 1, "sim")

        # the bound: a longer run keeps the first 256 frames of each link
        # and counts the rest; a job of more than 16 ranks keeps none
        long_yaml = os.path.join(tmp, "long.yaml")
        with open(quick, encoding="utf-8") as fh:
            text = fh.read()
        check("epochs: 3" in text, "quickstart.yaml no longer says epochs: 3")
        with open(long_yaml, "w", encoding="utf-8") as fh:
            fh.write(text.replace("name: quickstart", "name: quickstart_long")
                     .replace("epochs: 3", "epochs: 20"))
        rc, so, se = dsim(["run", long_yaml, "--engine", "sim", "--db", sdb], tmp)
        check(rc == 0, "the long quickstart on sim: rc %d\n%s\n%s" % (rc, so, se))
        sc = sqlite3.connect(sdb)
        per_link = sc.execute("SELECT max(n), max(top) FROM (SELECT count(*) AS n, max(seq) AS top "
                              "FROM messages WHERE run_id = 2 GROUP BY attempt, src, dst, "
                              "comm_id)").fetchone()
        left = sc.execute("SELECT value FROM metrics WHERE run_id = 2 AND name = "
                          "'messages_not_logged'").fetchone()
        check(per_link == (256, 256) and left and left[0] > 0,
              "long run: frames per link %s, not logged %s" % (per_link, left))
        ldoc = msg_flows(tmp, sdb, 2, "sim, long")
        check("%d later frames not stored" % left[0] in ldoc["otherData"]["messages"],
              "long run: the trace does not say how many frames were left out: %s" %
              ldoc["otherData"]["messages"])
        rc, so, se = dsim(["run", os.path.join(SCEN, "cold_start", "workers_64.yaml"),
                           "--engine", "sim", "--db", sdb], tmp)
        check(rc == 0, "workers_64 on sim: rc %d\n%s\n%s" % (rc, so, se))
        check(sc.execute("SELECT count(*) FROM messages WHERE run_id = 3").fetchone()[0] == 0,
              "a job of 64 ranks stored messages")
        wdoc = trace(tmp, sdb, 3, "w64.json")
        check(wdoc["otherData"]["messages"].startswith("none") and
              "at most 16 ranks" in wdoc["otherData"]["messages"],
              "workers_64: otherData.messages %s" % wdoc["otherData"]["messages"])
        sc.close()

        # collective times: the all-reduce share and flow arrows
        w = sqlite3.connect(db)
        w.execute("DELETE FROM collectives WHERE run_id = 1")
        rows = w.execute("SELECT replica, step FROM steps WHERE run_id = 1 "
                         "ORDER BY rowid").fetchall()
        reps1 = len({r for r, _ in rows})
        t_base = w.execute("SELECT min(t_start_ns) FROM steps WHERE run_id = 1").fetchone()[0]
        # call k of replica r enters at base + k ms + (R-1-r) us: replica 0 last
        w.executemany("INSERT INTO collectives (run_id, replica, op, algorithm, bytes, "
                      "t_start_ns, t_end_ns) VALUES (1, ?, 'allreduce', 'ring', 144, ?, ?)",
                      [(r, t_base + k * 1000000 + (reps1 - 1 - r) * 1000,
                        t_base + k * 1000000 + reps1 * 1000 + 500) for r, k in rows])
        # a divergent checksum at step 5 of run 3
        w.execute("UPDATE steps SET checksum = checksum + 1 WHERE run_id = 3 AND step = 5 "
                  "AND replica = 1")
        # text that must be escaped
        w.execute("INSERT INTO runs (scenario, scenario_text, seed, engine, dsim_version, "
                  "status, started_ns, ended_ns) VALUES ('<script>alert(\"x\")</script>&', "
                  "'name: </pre><b>', 1, 'threads', '0', 'failed', 0, 1)")
        rid = w.execute("SELECT max(id) FROM runs").fetchone()[0]
        w.execute("INSERT INTO checks (run_id, name, passed, message) VALUES "
                  "(?, 'convergence', 0, '<img src=x onerror=alert(1)>')", (rid,))
        w.execute("INSERT INTO events (run_id, replica, t_ns, kind, detail) VALUES "
                  "(?, 0, 5, 'fault', '</table><i>')", (rid,))
        # a long run: 12000 steps of one replica
        w.execute("INSERT INTO runs (scenario, seed, engine, dsim_version, status, started_ns) "
                  "VALUES ('long', 1, 'threads', '0', 'passed', 0)")
        lid = w.execute("SELECT max(id) FROM runs").fetchone()[0]
        w.executemany("INSERT INTO steps (run_id, replica, epoch, step, loss, examples, "
                      "t_start_ns, t_end_ns) VALUES (?, 0, 0, ?, 1.0, 4, ?, ?)",
                      [(lid, s, s * 1000, s * 1000 + 900) for s in range(12000)])
        w.commit()
        w.close()

        doc = trace(tmp, db, 1, "t1.json")
        evs = doc["traceEvents"]
        coll = [e for e in evs if e["ph"] == "X" and e.get("cat") == "collective"]
        fl = [e for e in evs if e["ph"] in ("s", "f") and e.get("cat") == "wait"]
        check(len(coll) == len(rows), "trace 1: %d collectives of %d" % (len(coll), len(rows)))
        calls = len(rows) // reps1
        check(len(fl) == 2 * calls * (reps1 - 1),
              "trace 1: %d flow events, wanted %d" % (len(fl), 2 * calls * (reps1 - 1)))
        # replica 0 enters every call last: the others wait for it
        check(all(e["tid"] == (1 << 20) + 0 for e in fl if e["ph"] == "s"),
              "trace 1: a flow does not start at the last replica to enter")
        out = os.path.join(tmp, "one-coll.html")
        dsim(["report", "1", "--db", db, "-o", out], tmp)
        p = plots(read(out))
        check(p.get("comm") == [reps1], "report 1: no all-reduce share plot: %s" % p)
        w = sqlite3.connect(db)
        w.execute("DELETE FROM collectives WHERE run_id = 1")
        w.commit()
        w.close()
        dsim(["report", "1", "--db", db, "-o", out], tmp)
        check("Not measured" in read(out), "report 1: a share drawn without collectives")

        out = os.path.join(tmp, "div.html")
        dsim(["report", "3", "--db", db, "-o", out], tmp)
        check("first differ after step 5" in read(out), "report 3: no first divergent step")

        out = os.path.join(tmp, "esc.html")
        rc, _, se = dsim(["report", str(rid), "--db", db, "-o", out], tmp)
        html = read(out) if rc == 0 else ""
        check(rc == 0, "report of the escaping run: " + se)
        check("<script" not in html and "<img" not in html and "</pre><b>" not in html and
              "</table><i>" not in html, "report: text from the store is not escaped")
        check("&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;&amp;" in html,
              "report: the escaped scenario name is missing")
        t = trace(tmp, db, rid, "esc.json")
        check(t["otherData"]["scenario"] == '<script>alert("x")</script>&',
              "trace: the scenario name did not survive")

        t = trace(tmp, db, lid, "long.json")
        n = sum(1 for e in t["traceEvents"] if e["ph"] == "X" and e.get("cat") == "step")
        check(0 < n <= 5000, "long trace: %d step slices" % n)
        check(t["otherData"]["sampling"].startswith("every 3-th"),
              "long trace: sampling not stated: " + t["otherData"]["sampling"])
        rc, so, se = dsim(["report", "last", "--db", db, "-o", os.path.join(tmp, "l.html")], tmp)
        check(rc == 0 and "long" in read(os.path.join(tmp, "l.html")), "report last: " + se)

        # a run of 2200 steps: collectives of every 3rd step, and it says so
        long_yaml = os.path.join(tmp, "long.yaml")
        with open(long_yaml, "w") as f:
            f.write("name: long_run\nseed: 3\nengine: threads\ncluster: {hosts: 1, "
                    "devices_per_host: 2}\nstrategy: {name: mirrored}\nmodel: {kind: softmax}\n"
                    "optimizer: {kind: sgd, learning_rate: 0.1}\ndata: {task: classification, "
                    "examples: 4400, features: 4, classes: 2, global_batch: 2, epochs: 1}\n")
        rc, so, se = dsim(["run", long_yaml, "--db", db, "--json"], tmp)
        lrun = json.loads(so)["runs"][0]["run_id"] if rc == 0 else -1
        c3 = sqlite3.connect(db)
        k = c3.execute("SELECT value FROM metrics WHERE run_id = ? AND name = "
                       "'collective_sampling'", (lrun,)).fetchone()
        ncoll = c3.execute("SELECT count(*) FROM collectives WHERE run_id = ?",
                           (lrun,)).fetchone()[0]
        c3.close()
        check(k == (3.0,), "long run: collective_sampling is %s, wanted 3" % (k,))
        check(ncoll == 2 * 2 * 734, "long run: %d collective rows, wanted %d" % (ncoll, 2936))
        out = os.path.join(tmp, "longrun.html")
        dsim(["report", str(lrun), "--db", db, "-o", out], tmp)
        check("from every k-th step" in read(out), "long run: the report hides the sampling")
        trace(tmp, db, lrun, "longrun.json")

        # bad input
        bad = os.path.join(tmp, "bad.db")
        with open(bad, "wb") as f:
            f.write(b"not a database at all\n" * 100)
        damaged = os.path.join(tmp, "damaged.db")
        con.close()
        c2 = sqlite3.connect(db)
        c2.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        c2.close()
        shutil.copy(db, damaged)
        with open(damaged, "r+b") as f:
            f.seek(4096 * 3)
            f.write(b"\xff" * 16384)
        for cmd in ("report", "trace"):
            cases = [
                ([cmd, "999", "--db", db], "run 999 is not in"),
                ([cmd, "x1", "--db", db], "is not a run id"),
                ([cmd, "1", "--db", os.path.join(tmp, "absent.db")], "no results store at"),
                ([cmd, "1", "--db", bad], "bad.db"),
                ([cmd, "1", "--db", damaged], "damaged.db"),
                ([cmd, "1", "--db", db, "-o", os.path.join(tmp, "no", "such", "x")],
                 "cannot write"),
                ([cmd, "--db", db], "which run?"),
                ([cmd, "1", "--bogus"], "unknown option"),
                ([cmd, "1", "-o"], "needs a value"),
            ]
            for args, want_msg in cases:
                rc, so, se = dsim(args, tmp)
                check(rc == 2 and want_msg in se and "\n" == se[-1:],
                      "%s: rc %d, stderr %r (wanted rc 2 and %r)" % (args, rc, se, want_msg))
        rc, so, se = dsim(["report", "999", "--db", db], tmp)
        check("dsim list runs" in se, "an unknown run id does not say how to list them: " + se)
        print("%d failure(s)" % len(failures))
        return 1 if failures else 0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
