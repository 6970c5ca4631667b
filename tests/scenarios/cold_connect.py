#!/usr/bin/env python3
"""Cold start's connection set-up per peer (scenarios/cold_start/connections_*):
measured on the processes engine (tcp), modelled by the network model under
sim (two round trips per link between hosts, exactly), judged by cold_start's
max_connect_s, stored per replica; a bound where nothing connects (threads
on inproc) is refused with the reason, and a bound under the model fails.

    cold_connect.py DSIM SCENARIOS_DIR
"""
import json
import sqlite3
import subprocess
import sys
import tempfile

dsim, scen = sys.argv[1], sys.argv[2]
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)


def run(path, db, *extra):
    return subprocess.run([dsim, "run", path, "--db", db, *extra], capture_output=True,
                          text=True, timeout=120)


def connects(db):
    c = sqlite3.connect(db)
    rid = c.execute("SELECT max(id) FROM runs").fetchone()[0]
    rows = c.execute("SELECT replica, detail FROM events WHERE run_id = ? AND kind = 'phase'",
                     (rid,)).fetchall()
    c.close()
    out = {}
    for rep, detail in rows:
        try:
            d = json.loads(detail)
        except ValueError:
            continue
        if d.get("cold_start") == "phases" and "connect" in d:
            out[rep] = d["connect"]
    return out


with tempfile.TemporaryDirectory() as d:
    modelled = f"{scen}/cold_start/connections_modelled.yaml"
    p = run(modelled, f"{d}/m.db")
    check(p.returncode == 0, f"modelled: passes ({p.stdout[-400:]})")
    check("connection(s) set up (modelled), the slowest 8e-05 s" in p.stdout,
          f"modelled: the check reports the model's 4 x 20 us ({p.stdout[-400:]})")
    cm = connects(f"{d}/m.db")
    check(len(cm) > 0, "modelled: replicas' connections are stored")
    # 10GbE: 20 us a way; two round trips; devices of a host connect nothing
    for rep, c in cm.items():
        check(c["modelled"] is True, f"modelled: replica {rep} says modelled")
        check(abs(c["slowest_s"] - 80e-6) < 1e-12, f"modelled: replica {rep} slowest {c['slowest_s']}")
        check(c["slowest_peer"] // 2 != rep // 2,
              f"modelled: replica {rep}'s connection goes to another host ({c['slowest_peer']})")
        check(abs(c["total_s"] - 80e-6 * c["connections"]) < 1e-12,
              f"modelled: replica {rep} total {c['total_s']} for {c['connections']}")

    # The same bound halved: the model's 80 us is over it.
    text = open(modelled).read().replace("max_connect_s: 0.0001", "max_connect_s: 0.00005")
    tight = f"{d}/tight.yaml"
    open(tight, "w").write(text)
    p = run(tight, f"{d}/t.db")
    check(p.returncode != 0, "tight: a connection over its bound fails the run")
    check("OVER its bound" in p.stdout, f"tight: names the slow connection ({p.stdout[-400:]})")

    tcp = f"{scen}/cold_start/connections_tcp.yaml"
    p = run(tcp, f"{d}/p.db")
    check(p.returncode == 0, f"tcp: passes ({p.stdout[-400:]}{p.stderr[-400:]})")
    cp = connects(f"{d}/p.db")
    check(len(cp) > 0, "tcp: replicas' connections are stored")
    for rep, c in cp.items():
        check(c["modelled"] is False, f"tcp: replica {rep} measured, not modelled")
        check(0 < c["slowest_s"] < 2 and c["connections"] >= 1,
              f"tcp: replica {rep}: {c}")
        check(0 <= c["slowest_peer"] < 4 and c["slowest_peer"] != rep,
              f"tcp: replica {rep} names a peer ({c['slowest_peer']})")

    # On threads the ranks share memory: a bound on connections is not met
    # in silence.
    p = run(tcp, f"{d}/th.db", "--engine", "threads", "--transport", "inproc")
    check(p.returncode != 0, "threads: max_connect_s with no connection fails")
    check("no connection was set up" in p.stdout, f"threads: says why ({p.stdout[-400:]})")

for f in failures:
    print("FAIL:", f)
print(f"{len(failures)} failure(s)")
sys.exit(1 if failures else 0)
