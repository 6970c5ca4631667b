#!/usr/bin/env python3
"""dsim whatif end to end: the table's figures follow the cost model (compute
from the device preset, all-reduce faster on faster networks, the best
algorithm never slower than the one chosen), a scenario's shape and model are
taken over, and bad input exits 2 with a message naming the flag.

    whatif_cli.py DSIM SCENARIOS_DIR
"""
import subprocess
import sys

dsim, scenarios = sys.argv[1], sys.argv[2]
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)


def run(*args):
    p = subprocess.run([dsim, "whatif", *args], capture_output=True, text=True, timeout=120)
    return p.returncode, p.stdout, p.stderr


def rows(out):
    table = {}
    for line in out.splitlines():
        f = line.split()
        if len(f) >= 9 and f[0] in ("loopback", "1gbe", "10gbe", "25gbe", "ib100", "pcie4",
                                   "nvlink", "nvlink3", "nvlink4"):
            table[f[0]] = {
                "algo": f[1], "allreduce": float(f[2]), "compute": float(f[3]),
                "step": float(f[4]), "share": float(f[5].rstrip("%")), "speedup": float(f[6]),
                "eff": float(f[7]), "best": f[8], "best_ms": float(f[9].strip("()")),
            }
    return table


rc, out, err = run("--network", "1gbe,10gbe,25gbe,ib100")
check(rc == 0, f"default what-if exits 0 (got {rc}: {err})")
t = rows(out)
check(set(t) == {"1gbe", "10gbe", "25gbe", "ib100"}, f"a row per network: {sorted(t)}")
if len(t) == 4:
    # ResNet-50-sized on V100: 3 x 4.1 GFLOP x 32 / (15.7 TFLOP/s x 0.3) = 83.57 ms
    check(all(abs(r["compute"] - 83.57) < 0.01 for r in t.values()),
          f"compute from the V100 preset: {[r['compute'] for r in t.values()]}")
    order = ["1gbe", "10gbe", "25gbe", "ib100"]
    for a, b in zip(order, order[1:]):
        check(t[a]["allreduce"] > t[b]["allreduce"], f"{a} all-reduce slower than {b}'s")
        check(t[a]["speedup"] < t[b]["speedup"], f"{a} speed-up below {b}'s")
    for n, r in t.items():
        check(abs(r["step"] - r["allreduce"] - r["compute"]) < 0.02, f"{n}: step = ar + compute")
        check(0 < r["share"] <= 100, f"{n}: share in (0, 100]")
        check(r["best_ms"] <= r["allreduce"] + 1e-9, f"{n}: the best algorithm is no slower")
        check(abs(r["eff"] - r["speedup"] / 16) < 0.01, f"{n}: efficiency = speedup / 16")
    check("one v100 on the whole global batch: 1337.07 ms" in out,
          "the one-device baseline is 4 x 4 x 32 x 3 x 4.1 GFLOP at 4.71 TFLOP/s")

# a forced algorithm is used, and a bigger NIC share shows: 1 device per host
rc, out, _ = run("--hosts", "16", "--devices", "1", "--network", "10gbe", "--algo", "ring")
r = rows(out).get("10gbe")
check(rc == 0 and r is not None and r["algo"] == "ring", "--algo ring is used")

# a scenario's shape and model: quickstart has 36 parameters on 2 x 2
rc, out, err = run(f"{scenarios}/quickstart.yaml", "--network", "loopback")
check(rc == 0, f"scenario what-if exits 0 ({err})")
check("2 host(s) x 2" in out and "36 parameters" in out, "shape and model from the scenario")

rc, out, _ = run("--presets")
check(rc == 0 and "source:" in out and "ib100" in out and "h100" in out, "--presets lists sources")

for args, needle in [
    (("--network", "2gbe"), "'2gbe' is not a link preset"),
    (("--params", "12Q"), "--params"),
    (("--hosts", "0"), "--hosts '0'"),
    (("--device", "tpu"), "--device 'tpu'"),
    (("--algo", "fastest"), "fastest"),
    (("--flops",), "needs a value"),
    (("--bogus",), "unknown option"),
    (("/nonexistent/x.yaml",), "x.yaml"),
]:
    rc, out, err = run(*args)
    check(rc == 2 and needle in err, f"{args}: exit 2 naming '{needle}' (got {rc}: {err.strip()})")

# --chakra: one trace per rank, Chakra's ET fields, the all-reduce after the
# compute and before the update
import json, os, tempfile
with tempfile.TemporaryDirectory() as d:
    rc, out, err = run("--hosts", "2", "--devices", "2", "--params", "1M", "--flops", "2M",
                       "--network", "10gbe", "--chakra", f"{d}/et")
    files = sorted(os.listdir(f"{d}/et")) if os.path.isdir(f"{d}/et") else []
    check(rc == 0 and files == [f"trace.{r}.json" for r in range(4)],
          f"--chakra writes trace.0..3.json ({rc}: {files} {err})")
    for f in files:
        doc = json.load(open(f"{d}/et/{f}"))
        nodes = {n["id"]: n for n in doc["nodes"]}
        check(doc["global_metadata"]["version"] == "0.0.4", f"{f}: ET version")
        ar = nodes.get(1, {})
        attrs = {a["name"]: a for a in ar.get("attr", [])}
        check(ar.get("type") == "COMM_COLL_NODE" and
              attrs.get("comm_type", {}).get("string_val") == "ALL_REDUCE" and
              attrs.get("comm_size", {}).get("int64_val") == 4_000_000,
              f"{f}: the all-reduce of 1M float32 gradients")
        check(ar.get("data_deps") == [0] and nodes.get(2, {}).get("data_deps") == [1],
              f"{f}: compute -> all-reduce -> update")
        fb = {a["name"]: a for a in nodes.get(0, {}).get("attr", [])}
        # 3 x 2 MFLOP x 32 examples per replica
        check(fb.get("num_ops", {}).get("int64_val") == 192_000_000, f"{f}: forward+backward ops")
    rc, out, err = run("--hosts", "65", "--devices", "64", "--chakra", f"{d}/big")
    check(rc == 2 and "4096" in err, "--chakra refuses more than 4096 ranks")

# dsim bench --model: the calibrated model beside each measured time
p = subprocess.run([dsim, "bench", "allreduce", "--ranks", "2", "-b", "4K", "-e", "16K", "-f", "2",
                    "-n", "3", "-w", "1", "--model", "1"], capture_output=True, text=True,
                   timeout=120)
model_rows = [l for l in p.stdout.splitlines()
              if l.startswith("#  ") and l.split()[1].isdigit()]
check(p.returncode == 0 and len(model_rows) == 3 and "mean absolute error" in p.stdout,
      f"bench --model prints a model row per size ({p.returncode}: {p.stdout[-400:]} {p.stderr})")
for l in model_rows:
    f = l.split()
    check(float(f[3]) > 0 and float(f[4]) > 0, f"measured and model times are positive: {l}")
p = subprocess.run([dsim, "bench", "allreduce", "--transport", "tcp", "--model", "1"],
                   capture_output=True, text=True, timeout=120)
check(p.returncode == 2 and "threads engine over inproc" in p.stderr,
      "--model over tcp on the threads engine is refused")

# the processes engine: one forked process per rank over shm, calibrated the
# same way (a ping-pong and replays of the algorithm's steps between processes)
p = subprocess.run([dsim, "bench", "allreduce", "--engine", "processes", "--ranks", "3", "-b", "4K",
                    "-e", "16K", "-f", "4", "-n", "3", "-w", "1", "--algo", "ring", "--model", "1"],
                   capture_output=True, text=True, timeout=120)
model_rows = [l for l in p.stdout.splitlines()
              if l.startswith("#  ") and l.split()[1].isdigit()]
check(p.returncode == 0 and "engine processes" in p.stdout and len(model_rows) == 2
      and "#wrong" in p.stdout,
      f"bench --engine processes --model 1 ({p.returncode}: {p.stdout[-600:]} {p.stderr})")
p = subprocess.run([dsim, "bench", "allreduce", "--engine", "fibers"], capture_output=True,
                   text=True, timeout=60)
check(p.returncode == 2 and "threads, processes" in p.stderr, "an unknown bench engine is refused")

# dsim calibrate: the calibration and its predictions, as JSON
p = subprocess.run([dsim, "calibrate", "--ranks", "3", "--algo", "ring,auto", "--sizes", "4K,64K",
                    "--json"], capture_output=True, text=True, timeout=120)
try:
    cal = json.loads(p.stdout)
except ValueError:
    cal = {}
preds = cal.get("predictions", [])
check(p.returncode == 0 and cal.get("engine") == "threads" and cal.get("ranks") == 3
      and len(preds) == 4 and all(x["seconds"] > 0 and x["exchange_s"] > 0 for x in preds)
      and cal.get("alpha_s", -1) >= 0 and cal.get("exchange_64B_s", 0) > 0,
      f"calibrate --json ({p.returncode}: {p.stdout[-600:]} {p.stderr})")
check([x["msg"] for x in preds if x["algo"] == "ring"] == [1368, 21848],
      f"ring's message is a third of the buffer (whole floats): {preds}")
check(cal.get("waits") == "hot", f"calibrate's waits are hot by default: {cal.get('waits')}")
check(all(x["pattern"] == x["algo"] and x["pattern_steps"] > 0 and x["pattern_64B_s"] > 0
          for x in preds), f"every row is fitted to its own algorithm's steps: {preds}")
# what a call takes beyond its steps: measured once per algorithm (both
# sizes of one algorithm carry the same figure) and part of the prediction
check(all(x.get("call_s", -1) >= 0 and x["seconds"] >= x["call_measured_s"] > 0 for x in preds)
      and len({x["call_s"] for x in preds if x["algo"] == "ring"}) == 1,
      f"every row has the per-call cost it was predicted with: {preds}")
# below 64 B a row is the library's call measured at its own size (a ring
# of one float a rank skips the empty blocks its replay sends)
p = subprocess.run([dsim, "calibrate", "--ranks", "3", "--algo", "ring", "--sizes", "8,4K",
                    "--json"], capture_output=True, text=True, timeout=120)
try:
    small = json.loads(p.stdout).get("predictions", [])
except ValueError:
    small = []
check(p.returncode == 0 and len(small) == 2 and small[0]["bytes"] == 8
      and small[0]["seconds"] == small[0]["call_measured_s"] > 0 and small[0]["call_s"] == 0
      and small[1]["call_s"] >= 0 and small[1]["seconds"] >= small[1]["call_measured_s"],
      f"calibrate --sizes 8,4K: the 8-byte row is its own call ({p.returncode}: {p.stdout[-800:]} "
      f"{p.stderr})")
# each algorithm's rows are fitted to its own steps, replayed over the
# ranks: ring's 2 (p - 1), rhd's 2 lg p, tree's 2 lg p, reduce_to_one's 2
p = subprocess.run([dsim, "calibrate", "--ranks", "4", "--algo", "ring,rhd,tree,reduce_to_one",
                    "--sizes", "16K", "--json"], capture_output=True, text=True, timeout=120)
try:
    pr = json.loads(p.stdout).get("predictions", [])
except ValueError:
    pr = []
pat = {x["algo"]: x for x in pr}
check(p.returncode == 0 and set(pat) == {"ring", "rhd", "tree", "reduce_to_one"}
      and {a: x["pattern_steps"] for a, x in pat.items()}
      == {"ring": 6, "rhd": 4, "tree": 4, "reduce_to_one": 2}
      and all(x["pattern"] == a and x["pattern_64B_s"] > 0 for a, x in pat.items())
      and pat["rhd"]["msg"] == 8192 and pat["ring"]["msg"] == 4096 and pat["tree"]["msg"] == 16384,
      f"calibrate --ranks 4: each algorithm replayed in its own steps ({p.returncode}: "
      f"{p.stdout[-600:]} {p.stderr})")
# over processes too, and where one rank receives from several in a step
# (reduce_to_one's root: three messages at once, each into a place of its own)
p = subprocess.run([dsim, "calibrate", "--engine", "processes", "--ranks", "4", "--algo",
                    "reduce_to_one", "--sizes", "4K,1M", "--json"], capture_output=True, text=True,
                   timeout=120)
try:
    pr = json.loads(p.stdout).get("predictions", [])
except ValueError:
    pr = []
check(p.returncode == 0 and len(pr) == 2
      and all(x["pattern_steps"] == 2 and x["seconds"] > 0 and x["exchange_reduce_s"] > 0
              for x in pr) and pr[1]["seconds"] > pr[0]["seconds"],
      f"calibrate --engine processes: reduce_to_one's replay ({p.returncode}: {p.stdout[-600:]} "
      f"{p.stderr})")
# --waits cold: the ranks sleep at once when they wait, as a step's collectives do
p = subprocess.run([dsim, "calibrate", "--ranks", "2", "--algo", "ring", "--sizes", "4K",
                    "--waits", "cold", "--json"], capture_output=True, text=True, timeout=120)
try:
    cold = json.loads(p.stdout)
except ValueError:
    cold = {}
check(p.returncode == 0 and cold.get("waits") == "cold" and cold.get("exchange_64B_s", 0) > 0,
      f"calibrate --waits cold ({p.returncode}: {p.stdout[-300:]} {p.stderr})")
for bad, why in ((["--engine", "sim"], "threads, processes"), (["--sizes", "6"], "float32"),
                 (["--algo", "bogus"], "reduce_to_one"), (["--ranks", "1"], "2 to"),
                 (["--waits", "warm"], "hot or cold"), (["--what"], "not an option")):
    p = subprocess.run([dsim, "calibrate"] + bad, capture_output=True, text=True, timeout=60)
    check(p.returncode == 2 and why in p.stderr, f"calibrate {bad} is refused naming {why!r}: "
          f"{p.returncode} {p.stderr}")

if failures:
    print("FAILED:\n  " + "\n  ".join(failures))
    sys.exit(1)
print("ok")
