#!/usr/bin/env python3
"""dsim run is never silent while a job forms: with workers starting up to
2 s apart (faults/staggered_start.yaml), it prints who has taken a first
step and who is awaited, about once a second, before the first step line;
a job that forms at once prints no such line.

    forming.py DSIM SCENARIOS_DIR
"""
import subprocess
import sys
import tempfile

dsim, scen = sys.argv[1], sys.argv[2]
with tempfile.TemporaryDirectory() as d:
    p = subprocess.run([dsim, "run", f"{scen}/faults/staggered_start.yaml", "--db", f"{d}/a.db"],
                       capture_output=True, text=True, timeout=120)
    lines = p.stdout.splitlines()
    forming = [l for l in lines if l.startswith("forming the group")]
    first_step = next((i for i, l in enumerate(lines) if l.startswith("step ")), len(lines))
    ok = (p.returncode == 0 and forming and "awaiting replica" in forming[0]
          and "of 4 replicas" in forming[0]
          and lines.index(forming[0]) < first_step)
    p2 = subprocess.run([dsim, "run", f"{scen}/quickstart.yaml", "--db", f"{d}/b.db"],
                        capture_output=True, text=True, timeout=120)
    ok2 = p2.returncode == 0 and "forming the group" not in p2.stdout
if not ok or not ok2:
    print("FAILED:", p.returncode, forming[:3], p2.returncode, p.stdout[-500:])
    sys.exit(1)
print("ok:", forming[0])
