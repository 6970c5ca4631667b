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

Then the layout at 1400 px, for one run and for three compared (the
quickstart, the node-loss run, and a run whose failed check has a long
message): a copy of each page with a script appended measures it in the
browser and writes what it found into the DOM. Checks: the page is no
wider than the window (scroll width = viewport width), every plot is at
least 80 % of the content's width, no element reaches past its section
and no table cell's text past its cell, the node-loss run's fault timeline
and throughput have a break where a second passes without records, the
per-replica losses are a plot of their own, and the cold-start table
begins within the first 2,600 px.

Exit 77 (skip) where no Chromium is installed (chromium, chromium-browser,
google-chrome, or $CHROMIUM).

usage: report_browser.py DSIM SCENARIO_DIR
"""
import json
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


# Appended to a copy of a page: measures its layout and writes the result
# into <pre id="layout"> for --dump-dom.
MEASURE = r"""<script>
(function () {
  var de = document.documentElement, body = document.body, cs = getComputedStyle(body);
  var content = body.clientWidth - parseFloat(cs.paddingLeft) - parseFloat(cs.paddingRight);
  var out = {viewport: de.clientWidth, scroll: de.scrollWidth, content: content,
             plots: [], over: [], cells: [], cold: [], breaks: {}};
  document.querySelectorAll("svg.plot").forEach(function (s) {
    var run = s.closest("section");
    out.plots.push({cls: s.getAttribute("class"), w: s.getBoundingClientRect().width,
                    run: run ? run.id : ""});
    out.breaks[(run ? run.id : "") + " " + s.getAttribute("class")] =
        +s.getAttribute("data-breaks");
  });
  document.querySelectorAll("section").forEach(function (sec) {
    var r = sec.getBoundingClientRect();
    sec.querySelectorAll("*").forEach(function (el) {
      if (el.closest("pre") || el.closest("details:not([open])") ||
          (el.closest("svg") && el.tagName.toLowerCase() != "svg"))
        return;
      var b = el.getBoundingClientRect();
      if (b.width > 0 && (b.right > r.right + 1 || b.left < r.left - 1))
        out.over.push(sec.id + " " + el.tagName + "." + el.className + " " +
                      (el.textContent || "").slice(0, 60));
    });
  });
  document.querySelectorAll("td, th").forEach(function (c) {
    if (c.closest("details:not([open])"))
      return;
    if (c.scrollWidth > c.clientWidth + 1)
      out.cells.push((c.textContent || "").slice(0, 60));
  });
  document.querySelectorAll("h3").forEach(function (h) {
    if (h.textContent == "cold start")
      out.cold.push(h.getBoundingClientRect().top + window.scrollY);
  });
  var pre = document.createElement("pre");
  pre.id = "layout";
  pre.textContent = JSON.stringify(out);
  body.appendChild(pre);
})();
</script>"""


def measure(exe, tmp, page, label):
    """The layout of `page` at 1400 px, as MEASURE reports it."""
    copy = os.path.join(tmp, "measured-" + os.path.basename(page))
    with open(page, encoding="utf-8") as f:
        html = f.read()
    with open(copy, "w", encoding="utf-8") as f:
        f.write(html.replace("</body>", MEASURE + "</body>"))
    rc, dom, err = chromium(exe, tmp, ["--hide-scrollbars", "--window-size=1400,900",
                                       "--virtual-time-budget=2000", "--dump-dom"],
                            "file://" + copy)
    m = re.search(r'<pre id="layout">([^<]*)</pre>', dom)
    if not check(rc == 0 and m, "%s: no layout measured (rc %d) %s" % (label, rc, err[-800:])):
        return None
    lay = json.loads(m.group(1).replace("&quot;", '"').replace("&amp;", "&"))
    check(lay["viewport"] == 1400, "%s: the viewport is %s px" % (label, lay["viewport"]))
    check(lay["scroll"] == lay["viewport"],
          "%s: the page is %s px wide in a %s px window" % (label, lay["scroll"], lay["viewport"]))
    narrow = [p for p in lay["plots"] if p["w"] < 0.8 * lay["content"]]
    check(lay["plots"] and not narrow,
          "%s: plots narrower than 80 %% of the content's %.0f px: %s" %
          (label, lay["content"], narrow[:4]))
    check(not lay["over"], "%s: elements past their section: %s" % (label, lay["over"][:5]))
    check(not lay["cells"], "%s: text past its table cell: %s" % (label, lay["cells"][:5]))
    check(lay["cold"] and lay["cold"][0] < 2600,
          "%s: the first cold-start table begins at %s px" % (label, lay["cold"][:1]))
    return lay


def layout_checks(exe, tmp):
    """One run and three compared, at 1400 px."""
    db = os.path.join(tmp, "layout.db")
    scen = [os.path.join(SCEN, "quickstart.yaml"),
            os.path.join(SCEN, "faults", "worker_dies_between_collectives.yaml"),
            os.path.join(SCEN, "custom_strategy_tail.yaml")]
    p = subprocess.run([DSIM, "run"] + scen + ["--db", db], cwd=tmp, capture_output=True,
                       timeout=300)
    if not check(p.returncode == 0, "dsim run for the layout: rc %d %s" %
                 (p.returncode, p.stderr.decode()[-800:])):
        return
    pages = {}
    for name, ids in (("one", ["2"]), ("three", ["1", "2", "3"])):
        pages[name] = os.path.join(tmp, name + ".html")
        q = subprocess.run([DSIM, "report"] + ids + ["--db", db, "-o", pages[name]], cwd=tmp,
                           capture_output=True, timeout=120)
        check(q.returncode == 0, "dsim report %s: rc %d" % (ids, q.returncode))
    one = measure(exe, tmp, pages["one"], "one run at 1400 px")
    three = measure(exe, tmp, pages["three"], "three runs at 1400 px")
    for lay, run in ((one, "run-2"), (three, "run-2")):
        if not lay:
            continue
        for cls in ("plot timeline", "plot rate"):
            check(lay["breaks"].get(run + " " + cls, 0) >= 1,
                  "the node-loss run's %s has no break over its detection gap: %s" %
                  (cls, lay["breaks"]))
        check(run + " plot replicaloss" in lay["breaks"],
              "the per-replica losses have no plot of their own")
    if three:
        check(len(three["cold"]) == 3, "three runs: %d cold-start tables" % len(three["cold"]))


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
        layout_checks(exe, tmp)
        print("%d failure(s)" % len(failures))
        return 1 if failures else 0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
