#!/usr/bin/env python3
"""The exchange a run made, named where a run is shown.

scenarios/hierarchical_strategy.yaml runs the hierarchical example plugin
(reduce in each host, all-reduce among the hosts' leaders, broadcast back,
on sub-communicators it splits from the world). The store, the report and
the trace must name that exchange -- the collectives and the
sub-communicators, whole -- and not a world all-reduce algorithm; a
built-in strategy's run (quickstart) still names its algorithm.

    exchange_named.py DSIM SCENARIOS_DIR
"""
import json
import os
import re
import sqlite3
import subprocess
import sys
import tempfile

dsim, scenarios = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
failures = []
LABEL = re.compile(r"^reduce on sub-communicator (\d+) \(4 ranks\) \+ allreduce\(ring\) on "
                   r"sub-communicator (\d+) \(3 ranks\) \+ broadcast on sub-communicator (\d+) "
                   r"\(4 ranks\)$")


def check(cond, what):
    if not cond:
        failures.append(what)


def run(*args, cwd=None):
    p = subprocess.run([dsim, *args], capture_output=True, text=True, timeout=120, cwd=cwd)
    return p.returncode, p.stdout, p.stderr


with tempfile.TemporaryDirectory() as tmp:
    db = os.path.join(tmp, "x.db")
    rc, out, err = run("run", f"{scenarios}/hierarchical_strategy.yaml", "--db", db, cwd=tmp)
    check(rc == 0, f"the hierarchical plugin's run passes (rc {rc}): {out[-600:]}{err[-600:]}")
    rc, out, err = run("run", f"{scenarios}/quickstart.yaml", "--db", db, cwd=tmp)
    check(rc == 0, f"quickstart passes (rc {rc}): {err[-400:]}")

    con = sqlite3.connect(db)
    rows = dict(((r, n), u) for r, n, u in con.execute(
        "SELECT run_id, name, unit FROM metrics WHERE name IN ('exchange', 'allreduce_algorithm')"))
    con.close()
    label = rows.get((1, "exchange"))
    print("stored exchange:", label)
    m = LABEL.match(label or "")
    check(m is not None, f"the store names the plugin's exchange: {label}")
    check(m is None or (m.group(1) == m.group(3) and m.group(1) != m.group(2)),
          f"the host's sub-communicator twice, the leaders' another: {label}")
    check((1, "allreduce_algorithm") not in rows, "no world algorithm stored for the plugin's run")
    check(rows.get((2, "allreduce_algorithm")) in ("ring", "rhd", "tree", "hierarchical",
                                                          "recursive_doubling"),
          f"quickstart's algorithm stored: {rows.get((2, 'allreduce_algorithm'))}")

    html = os.path.join(tmp, "r.html")
    rc, out, err = run("report", "1", "--db", db, "-o", html)
    check(rc == 0, f"dsim report exits 0 ({err})")
    page = open(html).read() if os.path.exists(html) else ""
    check(label is not None and f"(exchange: {label})" in page,
          "the report names the exchange whole")
    check("(all-reduce: " not in page, "the report shows no world all-reduce for it")

    tr = os.path.join(tmp, "t.json")
    rc, out, err = run("trace", "1", "--db", db, "-o", tr)
    check(rc == 0, f"dsim trace exits 0 ({err})")
    names = set()
    if os.path.exists(tr):
        ev = json.load(open(tr))["traceEvents"]
        names = {e["name"] for e in ev if e.get("cat") == "collective"}
    print("trace's collective slices:", sorted(names))
    check(label is not None and f"allreduce ({label})" in names,
          f"the trace's gradient slices carry the exchange whole: {sorted(names)}")

for f in failures:
    print("FAIL:", f)
sys.exit(1 if failures else 0)
