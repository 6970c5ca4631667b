#!/usr/bin/env python3
"""The `dsim report` page in a real browser: headless Chromium.

Runs a node-loss scenario and the quickstart into a fresh store, writes the
comparison report, then has Chromium load it twice: once dumping the DOM
it built (--dump-dom) with the console logged to stderr, once taking a
screenshot. Checks: the page loaded (the DOM has the report's heading and
every run's section), the console shows no error (a script error, a
resource that failed to load, a parse error), every plot the browser
built holds data (its data-points and, for the line plots, polylines with
points), and the screenshot is a PNG of the window's size.

Exit 77 (skip) where no Chromium is installed (chromium, chromium-browser,
google-chrome, or $CHROMIUM).

usage: report_browser.py DSIM SCENARIO_DIR
"""
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile

DSIM, SCEN = (os.path.abspath(a) for a in sys.argv[1:3])
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL: " + what)
    return cond


def find_chromium():
    env = os.environ.get("CHROMIUM")
    if env:
        return env if shutil.which(env) else None
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        path = shutil.which(name)
        if path:
            return path
    return None


def chromium(exe, tmp, args, url):
    # a profile of its own: no state shared with other runs or users
    base = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
            "--user-data-dir=" + os.path.join(tmp, "profile"), "--enable-logging=stderr",
            "--v=0", "--allow-file-access-from-files"]
    p = subprocess.run(base + args + [url], capture_output=True, timeout=120)
    return p.returncode, p.stdout.decode("utf-8", "replace"), p.stderr.decode("utf-8", "replace")


def console_errors(stderr):
    """Console messages and load failures in Chromium's log."""
    bad = []
    for line in stderr.splitlines():
        if "CONSOLE" in line or "Uncaught" in line or "Failed to load resource" in line \
                or "net::ERR_" in line:
            bad.append(line)
    return bad


def main():
    exe = find_chromium()
    if not exe:
        print("SKIP: no Chromium (apt-get install chromium)")
        return 77
    tmp = tempfile.mkdtemp(prefix="dsim-browser-")
    try:
        db = os.path.join(tmp, "runs.db")
        scen = [os.path.join(SCEN, "quickstart.yaml"),
                os.path.join(SCEN, "faults", "worker_dies_between_collectives.yaml")]
        p = subprocess.run([DSIM, "run"] + scen + ["--db", db, "--report"], cwd=tmp,
                           capture_output=True, timeout=300)
        out = p.stdout.decode().rstrip("\n").split("\n")[-1]
        if not check(p.returncode == 0 and os.path.isfile(out),
                     "dsim run --report: rc %d, last line %r" % (p.returncode, out)):
            return 1
        url = "file://" + out

        rc, dom, err = chromium(exe, tmp, ["--dump-dom"], url)
        check(rc == 0, "chromium --dump-dom: rc %d\n%s" % (rc, err[-2000:]))
        check(not console_errors(err), "console errors: %s" % console_errors(err)[:5])
        check("dsim report: 2 runs compared" in dom, "the page did not load: " + dom[:300])
        check('id="run-1"' in dom and 'id="run-2"' in dom, "a run's section is missing")
        svgs = re.findall(r'<svg class="plot ([a-z]+)" data-points="(\d+)"', dom)
        kinds = {k for k, _ in svgs}
        check({"loss", "rate", "steptime", "timeline"} <= kinds,
              "plots missing from the DOM: %s" % sorted(kinds))
        empty = [k for k, n in svgs if int(n) == 0]
        check(not empty, "plots without data: %s" % empty)
        lines = re.findall(r'<polyline class="series"[^>]*points="([^"]*)"', dom)
        pts = [len(x.split()) for x in lines]
        check(len(lines) >= 5 and sum(pts) > 50,
              "the line plots hold too little: %d polylines, %s points" % (len(lines), pts[:8]))
        check(all(re.fullmatch(r"(-?[\d.]+,-?[\d.]+ ?)+", x) for x in lines),
              "a polyline's points are not numbers")
        check(len(re.findall(r'<circle class="dot"', dom)) > 20, "the step times have no dots")

        png = os.path.join(tmp, "shot.png")
        rc, _, err = chromium(exe, tmp, ["--hide-scrollbars", "--window-size=1200,900",
                                         "--screenshot=" + png], url)
        check(rc == 0 and os.path.isfile(png), "chromium --screenshot: rc %d %s" % (rc, err[-800:]))
        if os.path.isfile(png):
            with open(png, "rb") as f:
                head = f.read(24)
            check(head[:8] == b"\x89PNG\r\n\x1a\n", "the screenshot is not a PNG")
            w, h = struct.unpack(">II", head[16:24])
            check((w, h) == (1200, 900), "the screenshot is %dx%d" % (w, h))
            check(os.path.getsize(png) > 20000, "the screenshot is nearly empty")
        print("%d failure(s)" % len(failures))
        return 1 if failures else 0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
