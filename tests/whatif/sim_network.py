#!/usr/bin/env python3
"""The network model under the sim engine: the what-if scenarios' virtual
all-reduce time (step minus compute, medians, from the store's metrics)
against the alpha-beta evaluation of the same ring by dsim whatif, per
network; faster networks give shorter exchanges; and a job without
cluster.network is unchanged by it (no link takes virtual time).

    sim_network.py DSIM SCENARIOS_DIR
"""
import os
import sqlite3
import subprocess
import sys
import tempfile

dsim, scen = sys.argv[1], sys.argv[2]
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)


def metrics(db):
    c = sqlite3.connect(db)
    rid = c.execute("SELECT max(id) FROM runs").fetchone()[0]
    m = dict(c.execute("SELECT name, value FROM metrics WHERE run_id = ?", (rid,)).fetchall())
    c.close()
    return m


comm = {}
with tempfile.TemporaryDirectory() as d:
    for net in ("1gbe", "10gbe", "ib100"):
        path = f"{scen}/whatif/mlp_4x2_{net}.yaml"
        db = f"{d}/{net}.db"
        p = subprocess.run([dsim, "run", path, "--db", db], capture_output=True, text=True,
                           timeout=300)
        check(p.returncode == 0, f"{net}: the scenario meets its expectations ({p.stdout[-300:]})")
        m = metrics(db)
        sim_ms = 1e3 * (m["step_time_median"] - m["compute_time_median"])
        comm[net] = sim_ms
        w = subprocess.run([dsim, "whatif", path, "--network", net, "--intra", "nvlink",
                            "--algo", "ring", "--device", "h100"], capture_output=True,
                           text=True, timeout=60)
        row = [l.split() for l in w.stdout.splitlines() if l.startswith(net + " ")]
        check(w.returncode == 0 and row, f"{net}: dsim whatif prints a row")
        if row:
            model_ms = float(row[0][2])
            err = (sim_ms - model_ms) / model_ms
            print(f"{net}: sim {sim_ms:.3f} ms, alpha-beta {model_ms:.3f} ms, {100 * err:+.0f} %")
            # the sim adds the loss's reduction and fingerprint frames and lets
            # ranks run ahead of the lock-step the formula assumes
            check(abs(err) < 0.35, f"{net}: sim within 35 % of the alpha-beta time ({err:+.2f})")
    check(comm.get("1gbe", 0) > comm.get("10gbe", 0) > comm.get("ib100", 0) > 0,
          f"faster networks exchange faster: {comm}")

    # without cluster.network: the exchange takes no virtual time at all
    plain = f"{d}/plain.yaml"
    text = open(f"{scen}/whatif/mlp_4x2_10gbe.yaml").read()
    text = text.replace("  network: {preset: 10gbe, intra: nvlink}\n", "")
    text = text.replace("performance: {max_allreduce_share: 0.5}", "performance: {max_allreduce_share: 1}")
    open(plain, "w").write(text)
    p = subprocess.run([dsim, "run", plain, "--db", f"{d}/plain.db"], capture_output=True,
                       text=True, timeout=300)
    m = metrics(f"{d}/plain.db")
    check(p.returncode == 0 and m["allreduce_share"] < 0.01,
          f"no network model: no virtual time in the exchange ({m.get('allreduce_share')})")
    # the processes engine's links are real: the model is refused there
    p = subprocess.run([dsim, "validate", f"{scen}/whatif/mlp_4x2_10gbe.yaml"], capture_output=True,
                       text=True, timeout=60)
    check(p.returncode == 0, "the what-if scenarios validate")
    p = subprocess.run([dsim, "run", f"{scen}/whatif/mlp_4x2_10gbe.yaml", "--engine", "processes",
                        "--db", f"{d}/proc.db"], capture_output=True, text=True, timeout=60)
    check(p.returncode == 2 and "links are real" in (p.stdout + p.stderr),
          f"cluster.network on the processes engine is refused ({p.returncode})")

if failures:
    print("FAILED:\n  " + "\n  ".join(failures))
    sys.exit(1)
print("ok")
