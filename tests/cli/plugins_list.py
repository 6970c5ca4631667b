#!/usr/bin/env python3
"""`dsim list strategies` lists the strategy plugins of --plugin-dir and
$DSIM_PLUGIN_PATH with their summaries, without registering them.

A folder of this test holds the hierarchical example plugin, one that says
it was built against strategy ABI version 1, and a file that is no strategy
plugin. The listing (text and --json) must give the usable one's name,
summary and file, the version-1 one as refused with the version it has,
this library's and what to rebuild, and leave out the other; the same
through $DSIM_PLUGIN_PATH; a folder that is not there is bad input.

    plugins_list.py DSIM HIER_PLUGIN V1_PLUGIN
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

dsim, hier, v1 = sys.argv[1:4]
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)


def run(*args, env=None):
    p = subprocess.run([dsim, *args], capture_output=True, text=True, timeout=60, env=env)
    return p.returncode, p.stdout, p.stderr


with tempfile.TemporaryDirectory() as tmp:
    d = os.path.join(tmp, "plugins")
    os.mkdir(d)
    shutil.copy(hier, os.path.join(d, "libmy_hier.so"))
    shutil.copy(v1, os.path.join(d, "libold_abi.so"))
    with open(os.path.join(d, "libnot_a_plugin.so"), "w") as f:
        f.write("not an ELF object\n")

    rc, out, err = run("list", "strategies", "--plugin-dir", d)
    print(out)
    check(rc == 0, f"list strategies --plugin-dir exits 0 (got {rc}: {err})")
    check("multi_worker_mirrored" in out, "the built-ins are listed first")
    lines = out.splitlines()
    hl = [i for i, l in enumerate(lines) if l.startswith("hierarchical_leaders ")]
    check(len(hl) == 1 and "all-reduced among the hosts' leaders" in lines[hl[0]],
          "the plugin's name and summary on one line")
    check(hl and f"(plugin {d}/libmy_hier.so)" in lines[hl[0] + 1],
          "the plugin's file under it")
    refused = [l for l in lines if l.startswith("(refused)")]
    check(len(refused) == 1, f"one refused plugin: {refused}")
    if refused:
        r = refused[0]
        check("libold_abi.so' was built against strategy ABI version 1" in r,
              f"the refusal names the file and its version 1: {r}")
        check("this libdsim speaks version 2" in r, f"and this library's version: {r}")
        check("rebuild the plugin from its source" in r, f"and what to rebuild: {r}")
    check("libnot_a_plugin" not in out, "a file that is no strategy plugin is left out")

    rc, out, err = run("list", "strategies", "--json", f"--plugin-dir={d}")
    check(rc == 0, f"--json exits 0 ({err})")
    try:
        arr = json.loads(out)
    except ValueError:
        arr = []
        check(False, f"--json prints JSON: {out[:300]}")
    by = {os.path.basename(e.get("plugin") or ""): e for e in arr if e.get("plugin")}
    check(set(by) == {"libmy_hier.so", "libold_abi.so"}, f"two plugins in --json: {sorted(by)}")
    h, o = by.get("libmy_hier.so", {}), by.get("libold_abi.so", {})
    check(h.get("name") == "hierarchical_leaders" and h.get("usable") is True
          and h.get("abi_version") == 2 and h.get("refused") is None, f"the usable one: {h}")
    check(o.get("usable") is False and o.get("abi_version") == 1
          and "rebuild" in (o.get("refused") or ""), f"the version-1 one: {o}")
    check(any(e.get("name") == "mirrored" and "plugin" not in e for e in arr),
          "the built-ins are in --json too")

    env = dict(os.environ, DSIM_PLUGIN_PATH=f"/nonexistent-dsim-dir:{d}")
    rc, out, err = run("list", "strategies", env=env)
    check(rc == 0 and "hierarchical_leaders " in out and "(refused)" in out,
          f"$DSIM_PLUGIN_PATH is listed too (rc {rc}):\n{out[-800:]}")

    rc, out, err = run("list", "strategies", "--plugin-dir", os.path.join(tmp, "nothing-here"))
    check(rc == 2 and "--plugin-dir" in err and "nothing-here" in err,
          f"a folder that is not there is bad input (rc {rc}): {err}")

for f in failures:
    print("FAIL:", f)
sys.exit(1 if failures else 0)
