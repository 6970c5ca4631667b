#!/usr/bin/env python3
"""Timing-only runs of a synthetic model (model.synthetic) under the sim
engine, against the analytic evaluation of the same job by dsim whatif.

For each ResNet-50-sized what-if scenario (4 x 4 V100 over 1GbE, 10GbE,
100 Gb InfiniBand), `dsim run` must pass its checks, report
gradient_consistency not applicable, print the what-if line, and agree with
`dsim whatif` on the same file: step time and speed-up within 2 %, the
all-reduce share within 2 points, the same algorithm. The two evaluate the
same schedule (dsim's algorithm, NIC sharing, alpha-beta links) by different
means -- frames queued on links under a virtual clock against a step-by-step
formula -- and differ by the loss's 8-byte all-reduce and the frame headers
only. No run may hold the gradients: the largest child stays under 64 MiB
where one replica's gradients alone are 102 MB. Bad input exits 2 naming the
place and the fix.

    timing_only.py DSIM SCENARIOS_DIR
"""
import os
import re
import resource
import subprocess
import sys
import tempfile

dsim, scenarios = sys.argv[1], sys.argv[2]
failures = []
TOL_REL, TOL_SHARE = 0.02, 2.0


def check(cond, what):
    if not cond:
        failures.append(what)


def run(*args, cwd=None):
    p = subprocess.run([dsim, *args], capture_output=True, text=True, timeout=120, cwd=cwd)
    return p.returncode, p.stdout, p.stderr


def whatif_row(out, net):
    for line in out.splitlines():
        f = line.split()
        if len(f) >= 9 and f[0] == net:
            return {"algo": f[1], "allreduce": float(f[2]), "compute": float(f[3]),
                    "step": float(f[4]), "share": float(f[5].rstrip("%")),
                    "speedup": float(f[6])}
    return None


WHATIF = re.compile(r"what-if: step ([0-9.]+) ms \(compute ([0-9.]+) ms\), all-reduce ([0-9.]+) % "
                    r"of the step; speed-up ([0-9.]+)x over one (\w+) \(scaling efficiency "
                    r"([0-9.]+)\); all-reduce algorithm (\w+)")

with tempfile.TemporaryDirectory() as tmp:
    for net in ("1gbe", "10gbe", "ib100"):
        path = f"{scenarios}/whatif/resnet50_4x4_v100_{net}.yaml"
        rc, out, err = run("run", path, "--db", os.path.join(tmp, f"{net}.db"))
        check(rc == 0, f"{net}: dsim run exits 0 (got {rc}: {err[-400:]})")
        m = WHATIF.search(out)
        check(m is not None, f"{net}: dsim run prints the what-if line:\n{out[-1500:]}")
        check("figures: " in out and "NVIDIA Tesla V100 datasheet" in out and "source" not in "",
              f"{net}: a line on where the figures come from")
        check(re.search(r"gradient_consistency .* N/A\n\s+not applicable: a timing-only run", out)
              is not None, f"{net}: gradient_consistency is reported not applicable")
        rc, wout, werr = run("whatif", path)
        w = whatif_row(wout, net)
        check(rc == 0 and w is not None, f"{net}: dsim whatif prints a row ({werr})")
        if m and w:
            step, compute, share, speed = (float(m.group(i)) for i in (1, 2, 3, 4))
            algo = m.group(7)
            print(f"{net}: simulated step {step:.2f} ms share {share:.0f} % speed-up {speed:.2f} "
                  f"{algo}; analytic step {w['step']:.2f} ms share {w['share']:.0f} % speed-up "
                  f"{w['speedup']:.2f} {w['algo']}")
            check(abs(step - w["step"]) <= TOL_REL * w["step"],
                  f"{net}: step {step} ms within 2 % of the analytic {w['step']} ms")
            check(abs(compute - w["compute"]) <= 0.01 * w["compute"],
                  f"{net}: compute {compute} ms is the model's {w['compute']} ms")
            check(abs(share - w["share"]) <= TOL_SHARE,
                  f"{net}: share {share} % within 2 points of {w['share']} %")
            check(abs(speed - w["speedup"]) <= TOL_REL * w["speedup"],
                  f"{net}: speed-up {speed} within 2 % of {w['speedup']}")
            check(algo == w["algo"], f"{net}: the same algorithm ({algo}, {w['algo']})")
    maxrss_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    print(f"largest child: {maxrss_kib / 1024:.1f} MiB")
    check(maxrss_kib < 64 * 1024,
          f"no run holds the 102 MB of gradients: largest child {maxrss_kib / 1024:.1f} MiB")

    # 4,096 workers: dsim run executes itself again with huge pages for
    # malloc (sim jobs of 4,096 replicas or more); the run is stored and
    # reported once, and its trace is the one of a run without
    s4096 = f"{scenarios}/whatif/allreduce_4096_timing.yaml"
    hashes = []
    for hp in ("1", "0"):
        db = os.path.join(tmp, f"w4096_{hp}.db")
        env = dict(os.environ, DSIM_HUGEPAGES=hp)
        p = subprocess.run([dsim, "run", s4096, "--db", db], capture_output=True, text=True,
                           timeout=120, env=env)
        check(p.returncode == 0, f"4096 workers (DSIM_HUGEPAGES={hp}): exits 0 ({p.stderr[-300:]})")
        check(p.stdout.count("run 1 stored") == 1 and p.stdout.count("what-if: step") == 1,
              f"4096 workers (DSIM_HUGEPAGES={hp}): reported once:\n{p.stdout[-600:]}")
        m = re.search(r"trace ([0-9a-f]{16}) \((\d+) events\)", p.stdout)
        check(m is not None, f"4096 workers: a trace hash line")
        hashes.append(m.group(1) if m else None)
    check(hashes[0] == hashes[1] and hashes[0], f"4096 workers: the same trace either way {hashes}")

    # The hierarchical all-reduce against ring and rhd (reports/hierarchical.md):
    # every combination of the 4 x 4 and 16 x 8 files (10GbE and InfiniBand
    # between hosts, NVLink inside) simulated, each within 2 % of dsim whatif
    # --algo on the same cluster and network, with the algorithm it asked
    # for; the two levels ahead of rhd everywhere and of the ring where the
    # NIC is the bottleneck.
    COMBO = re.compile(r"^\w+\[preset=(\w+),intra=nvlink,strategy\.communication=(\w+)\] \(")
    for shape in ("4x4", "16x8"):
        path = f"{scenarios}/whatif/hierarchical_{shape}.yaml"
        rc, out, err = run("run", path, "--db", os.path.join(tmp, f"hier_{shape}.db"))
        check(rc == 0, f"hierarchical {shape}: dsim run exits 0 (got {rc}: {err[-400:]})")
        sim, cur = {}, None
        for line in out.splitlines():
            c = COMBO.match(line)
            if c:
                cur = (c.group(1), c.group(2))
            m = WHATIF.search(line)
            if m and cur:
                sim[cur] = (float(m.group(1)), m.group(7))
                cur = None
        check(len(sim) == 6, f"hierarchical {shape}: 6 what-if lines, got {sorted(sim)}")
        for algo in ("ring", "rhd", "hierarchical"):
            rc, wout, werr = run("whatif", path, "--network", "10gbe,ib100", "--algo", algo)
            for net in ("10gbe", "ib100"):
                w = whatif_row(wout, net)
                got = sim.get((net, algo))
                check(rc == 0 and w is not None and w["algo"] == algo,
                      f"hierarchical {shape} {net}: dsim whatif --algo {algo} prints its row "
                      f"({werr})")
                if not (w and got):
                    continue
                print(f"{shape} {net} {algo}: simulated step {got[0]:.2f} ms, analytic "
                      f"{w['step']:.2f} ms")
                check(got[1] == algo, f"{shape} {net}: the run used {got[1]}, not {algo}")
                check(abs(got[0] - w["step"]) <= TOL_REL * w["step"],
                      f"{shape} {net} {algo}: simulated step {got[0]} ms within 2 % of the "
                      f"analytic {w['step']} ms")
        for net in ("10gbe", "ib100"):
            h, r, d = (sim.get((net, a), (None,))[0] for a in ("hierarchical", "ring", "rhd"))
            if h is None or r is None or d is None:
                continue
            check(h < d, f"{shape} {net}: hierarchical {h} ms ahead of rhd {d} ms")
            if net == "10gbe" or shape == "4x4":
                check(h < r, f"{shape} {net}: hierarchical {h} ms ahead of the ring {r} ms")

    # A plugin's own exchange (examples/hierarchical_strategy: reduce in a
    # host, all-reduce among the leaders, broadcast back, on sub-
    # communicators) timed by dsim whatif running its schedule under sim:
    # rows that say so, the collectives it called named, and a time that
    # the leader scheme can have: not below dsim's own two-level all-reduce
    # (the same bytes through each NIC, more inside the host), within 25 %
    # of it.
    plug = f"{scenarios}/hierarchical_strategy.yaml"
    rc, pout, perr = run("whatif", plug, "--hosts", "4", "--devices", "4", "--params", "25.6M",
                         "--flops", "4.1G", "--batch", "512", "--network", "10gbe,ib100")
    check(rc == 0, f"whatif of the plugin exits 0 (got {rc}: {perr[-400:]})")
    check(re.search(r"exchange \(the plugin's own, timed under the sim engine with virtual "
                    r"payloads\): reduce on sub-communicator \d+ \(4 ranks\) \+ "
                    r"allreduce\(ring\) on sub-communicator \d+ \(4 ranks\) \+ broadcast on "
                    r"sub-communicator \d+ \(4 ranks\)", pout) is not None,
          f"whatif names the plugin's exchange:\n{pout[-1200:]}")
    rc, hout, _ = run("whatif", "--hosts", "4", "--devices", "4", "--params", "25.6M", "--flops",
                      "4.1G", "--batch", "512", "--network", "10gbe,ib100", "--algo",
                      "hierarchical")
    for net in ("10gbe", "ib100"):
        row = next((l.split() for l in pout.splitlines() if l.startswith(net + " ")), None)
        w = whatif_row(hout, net)
        check(row is not None and row[1:3] == ["(its", "own)"],
              f"whatif of the plugin: a row for {net} saying '(its own)': {row}")
        if row and w:
            x = float(row[3])
            print(f"plugin on 4x4 {net}: exchange {x:.3f} ms; hierarchical {w['allreduce']:.3f} ms")
            check(w["allreduce"] <= x <= 1.25 * w["allreduce"],
                  f"{net}: the plugin's exchange {x} ms against the two-level all-reduce's "
                  f"{w['allreduce']} ms")

    # A plugin whose exchange is one all-reduce on the world
    # (examples/custom_strategy: reduce_to_one): named so, and timed within
    # 2 % of the analytic reduce_to_one on the same cluster.
    rc, cout, cerr = run("whatif", f"{scenarios}/custom_strategy.yaml", "--hosts", "2",
                         "--devices", "2", "--params", "25.6M", "--network", "10gbe")
    check(rc == 0 and "allreduce(reduce_to_one) on the world communicator" in cout,
          f"whatif of custom_strategy names its world all-reduce (rc {rc}):\n{cout[-800:]}{cerr}")
    rc, aout, _ = run("whatif", "--hosts", "2", "--devices", "2", "--params", "25.6M",
                      "--network", "10gbe", "--algo", "reduce_to_one")
    row = next((l.split() for l in cout.splitlines() if l.startswith("10gbe ")), None)
    w = whatif_row(aout, "10gbe")
    if row and w:
        x = float(row[3])
        print(f"custom_strategy on 2x2 10gbe: exchange {x:.3f} ms; reduce_to_one "
              f"{w['allreduce']:.3f} ms")
        check(abs(x - w["allreduce"]) <= TOL_REL * w["allreduce"],
              f"custom_strategy's exchange {x} ms within 2 % of reduce_to_one's {w['allreduce']}")
    else:
        check(False, f"custom_strategy: rows to compare ({row}, {w})")

    # bad input: the place and the fix
    base = open(f"{scenarios}/whatif/resnet50_4x4_v100_ib100.yaml").read()
    cases = [
        (base.replace("engine: sim", "engine: threads"), "run", "use engine sim"),
        (base.replace("name: multi_worker_mirrored", "name: parameter_server\n  ps_mode: sync")
         .replace("devices_per_host: 4", "devices_per_host: 4\n  ps: 1"), "run",
         "all-reduce schedule of mirrored"),
        (base.replace("model:\n", "model:\n  kind: mlp\n"), "validate",
         "remove kind or synthetic"),
        (base.replace(", flops_per_example: 4.1G", ""), "validate",
         "model.synthetic.flops_per_example is missing"),
        (base.replace("25.6M", "25.6Q"), "validate", "accepted suffixes K, M, G, T"),
        (base.replace("device: v100", "device: tpu"), "validate", "a device preset"),
    ]
    for i, (text, cmd, needle) in enumerate(cases):
        p = os.path.join(tmp, f"bad{i}.yaml")
        with open(p, "w") as f:
            f.write(text)
        args = (cmd, p) if cmd == "validate" else (cmd, p, "--db", os.path.join(tmp, "bad.db"))
        rc, out, err = run(*args)
        both = out + err
        check(rc == 2 or (rc == 1 and needle in both),
              f"bad case {i}: exits 2 (got {rc}): {both[-300:]}")
        check(needle in both, f"bad case {i}: says '{needle}': {both[-400:]}")

for f in failures:
    print("FAIL:", f)
sys.exit(1 if failures else 0)
