#!/usr/bin/env python3
"""`dsim run --junit FILE` and `dsim run --tap`, checked as CI tools read them.

JUnit: the file is well-formed XML (Python's parser), has the attributes CI
tools require (testsuites/testsuite/testcase name, classname, time; failure
and error message and type), its counts agree with its testcases, every
failed check is a <failure> carrying the check's message, a file that
cannot be loaded is an <error>, markup and control characters in names are
escaped; and, where xmllint is installed, it validates against
sim/cli/junit.xsd. TAP: standard output is TAP 13 only (numbered results, a
"# " comment under each, the plan last), the table goes to stderr.

usage: ci_output.py DSIM SCENARIO_DIR WRONG_PLUGIN XSD
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET

DSIM, SCEN, WRONG, XSD = (os.path.abspath(a) for a in sys.argv[1:5])
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL: " + what)


def run(args, cwd):
    p = subprocess.run([DSIM, "run"] + args, cwd=cwd, capture_output=True, timeout=120)
    return p.returncode, p.stdout.decode("utf-8", "replace"), p.stderr.decode("utf-8", "replace")


def junit_checks(path, label):
    """Parses the file and checks what every CI tool relies on; returns the root."""
    with open(path, "rb") as f:
        data = f.read()
    try:
        root = ET.fromstring(data)
    except ET.ParseError as e:
        check(False, "%s: not well-formed XML: %s" % (label, e))
        return None
    check(root.tag == "testsuites", label + ": the root is <testsuites>")
    for a in ("name", "tests", "failures", "errors", "time"):
        check(a in root.attrib, "%s: <testsuites> has %s" % (label, a))
    total = {"tests": 0, "failures": 0, "errors": 0}
    for ts in root.findall("testsuite"):
        n = ts.get("name")
        for a in ("name", "tests", "failures", "errors", "skipped", "time", "timestamp",
                  "hostname", "id", "package"):
            check(ts.get(a) not in (None, ""), "%s: testsuite %r has %s" % (label, n, a))
        cases = ts.findall("testcase")
        fails = [c for c in cases if c.find("failure") is not None]
        errs = [c for c in cases if c.find("error") is not None]
        skips = [c for c in cases if c.find("skipped") is not None]
        check(int(ts.get("skipped")) == len(skips), "%s: %r skipped= agrees" % (label, n))
        check(int(ts.get("tests")) == len(cases), "%s: %r tests= counts its testcases" % (label, n))
        check(int(ts.get("failures")) == len(fails), "%s: %r failures= agrees" % (label, n))
        check(int(ts.get("errors")) == len(errs), "%s: %r errors= agrees" % (label, n))
        float(ts.get("time"))
        for c in cases:
            for a in ("name", "classname", "time"):
                check(c.get(a) not in (None, ""), "%s: a testcase of %r has %s" % (label, n, a))
            float(c.get("time"))
            for p in list(c.findall("failure")) + list(c.findall("error")):
                check(p.get("message"), "%s: %s/%s has a message" % (label, n, c.get("name")))
                check(p.get("type"), "%s: %s/%s has a type" % (label, n, c.get("name")))
        check(ts.find("properties") is not None, label + ": <properties>")
        check(ts.find("system-out") is not None and ts.find("system-err") is not None,
              label + ": <system-out> and <system-err>")
        total["tests"] += len(cases)
        total["failures"] += len(fails)
        total["errors"] += len(errs)
    for k, v in total.items():
        check(int(root.get(k)) == v, "%s: <testsuites> %s= is the sum (%s)" % (label, k, v))
    xmllint = shutil.which("xmllint")
    if xmllint:
        p = subprocess.run([xmllint, "--noout", "--schema", XSD, path], capture_output=True)
        check(p.returncode == 0, "%s: validates against %s: %s" % (label, XSD, p.stderr.decode()))
    else:
        print("# xmllint not found (Debian: libxml2-utils): schema validation skipped")
    return root


def main():
    tmp = tempfile.mkdtemp(prefix="dsim-ci-output-")
    try:
        quick = os.path.join(SCEN, "quickstart.yaml")
        # a failing check, a check expected to fail, and a scenario without
        # checks whose name needs escaping
        bad = os.path.join(tmp, "wrong.yaml")
        with open(bad, "w") as f:
            f.write("name: wrong_for_junit\n"
                    "strategy: {name: wrong_mean, plugin: %s}\n"
                    "cluster: {hosts: 1, devices_per_host: 2}\n"
                    "data: {examples: 64, features: 4, classes: 2, files: 2, global_batch: 16,"
                    " epochs: 1}\n"
                    "expect:\n"
                    "  gradient_consistency: {}\n"
                    "  shard_coverage: {expect: fail}\n" % WRONG)
        odd = os.path.join(tmp, "odd.yaml")
        with open(odd, "w") as f:
            f.write("name: no_checks\n"
                    "cluster: {hosts: 1}\n"
                    "data: {examples: 32, features: 4, classes: 2, global_batch: 8, epochs: 1}\n"
                    "expect: {gradient_consistency: off, shard_coverage: off}\n")
        # a scenario that names no check: the ones that apply, by default
        dflt = os.path.join(tmp, "dflt.yaml")
        with open(dflt, "w") as f:
            f.write("name: by_default\n"
                    "cluster: {hosts: 1}\n"
                    "data: {examples: 32, features: 4, classes: 2, global_batch: 8, epochs: 1}\n")

        # a check that cannot judge the run (no fault fires): skipped
        never = os.path.join(tmp, "never.yaml")
        with open(never, "w") as f:
            f.write("name: never_fires\n"
                    "cluster: {hosts: 2, devices_per_host: 2}\n"
                    "strategy: {name: multi_worker_mirrored, timeout: 2s}\n"
                    "data: {examples: 64, features: 4, classes: 2, files: 4, global_batch: 16,"
                    " epochs: 1}\n"
                    "faults: [{what: kill, at_step: 500, rank: 1}]\n"
                    "expect: {node_loss: {}, gradient_consistency: {}}\n")

        j1 = os.path.join(tmp, "run.xml")
        rc, out, err = run([quick, bad, odd, dflt, never, "--db", os.path.join(tmp, "a.db"),
                            "--junit", j1], tmp)
        check(rc == 1, "a failed check exits 1 with --junit (got %d): %s" % (rc, err))
        check("CHECK" in out, "the table still goes to stdout without --tap")
        root = junit_checks(j1, "run.xml")
        if root is not None:
            suites = root.findall("testsuite")
            check([s.get("name") for s in suites][:2] == ["quickstart", "wrong_for_junit"],
                  "a testsuite per scenario, in order")
            q = suites[0]
            check([c.get("name") for c in q.findall("testcase")] ==
                  ["gradient_consistency", "shard_coverage", "convergence"],
                  "one testcase per check of quickstart")
            check(all(c.get("classname") == "dsim.quickstart" for c in q.findall("testcase")),
                  "classname dsim.SCENARIO")
            w = {c.get("name"): c for c in suites[1].findall("testcase")}
            gc = w.get("gradient_consistency")
            f = gc.find("failure") if gc is not None else None
            check(f is not None, "the failed check is a <failure>")
            if f is not None:
                check("reference" in f.get("message") and "MEAN" in f.get("message"),
                      "the failure's message is the check's sentence: %r" % f.get("message"))
                check("measured" in (f.text or ""), "the failure's text has the figures")
            sc = w.get("shard_coverage")
            f = sc.find("failure") if sc is not None else None
            check(f is not None and f.get("type") == "expected_failure",
                  "a check expected to fail that passed is a failure of type expected_failure")
            o = suites[2]
            oc = o.findall("testcase")
            check(len(oc) == 1 and oc[0].get("name") == "run" and len(list(oc[0])) == 0,
                  "a scenario without checks is one passed testcase 'run'")
            check("checks_by_default" not in
                  {p.get("name") for p in q.find("properties")},
                  "a scenario that names its checks has none by default")
            d = suites[3]
            check([c.get("name") for c in d.findall("testcase")] ==
                  ["gradient_consistency", "shard_coverage"],
                  "a scenario that names no check is judged by the ones that apply")
            dprops = {p.get("name"): p.get("value") for p in d.find("properties")}
            check(dprops.get("checks_by_default") == "gradient_consistency,shard_coverage",
                  "the suite says which checks ran by default: %r" % dprops)
            check("pass*" in out and "judged by default" in out,
                  "the table marks the checks judged by default")
            nv = {c.get("name"): c for c in suites[4].findall("testcase")}
            sk = nv["node_loss"].find("skipped") if "node_loss" in nv else None
            check(sk is not None and "none of the 1 fault(s) fired" in sk.get("message", ""),
                  "a check that could not judge the run is <skipped> with its reason")
            check(suites[4].get("skipped") == "1" and root.get("skipped") == "1" and
                  nv.get("gradient_consistency") is not None and
                  len(list(nv["gradient_consistency"])) == 0,
                  "counted as skipped; the judged check passed")
            props = {p.get("name"): p.get("value") for p in q.find("properties")}
            check(props.get("strategy") == "multi_worker_mirrored" and props.get("run_id") == "1",
                  "properties name the strategy and the run: %r" % props)

        # the schema is not vacuous: a testcase without classname is refused
        xmllint = shutil.which("xmllint")
        if xmllint and os.path.exists(j1):
            with open(j1) as f:
                text = f.read()
            cut = os.path.join(tmp, "cut.xml")
            with open(cut, "w") as f:
                f.write(text.replace(' classname="dsim.quickstart"', "", 1))
            p = subprocess.run([xmllint, "--noout", "--schema", XSD, cut], capture_output=True)
            check(p.returncode != 0 and b"classname" in p.stderr,
                  "a testcase without classname fails the schema")

        # a file that cannot be loaded: an <error>, exit 2, nothing run; its
        # name needs escaping
        broken = os.path.join(tmp, "broken <&\"'\x01\u00e9.yaml")
        with open(broken, "w") as f:
            f.write("name: broken\ncluster: {hosts: two}\n")
        j2 = os.path.join(tmp, "load.xml")
        rc, out, err = run([quick, broken, "--db", os.path.join(tmp, "b.db"), "--junit", j2], tmp)
        check(rc == 2, "a file that does not load exits 2 (got %d)" % rc)
        root = junit_checks(j2, "load.xml")
        if root is not None:
            suites = root.findall("testsuite")
            shown = broken.replace("\x01", "\ufffd")
            check(len(suites) == 1 and suites[0].get("name") == shown,
                  "one suite, the file; markup escaped, a control character replaced: %r"
                  % (suites[0].get("name") if suites else None))
            e = suites[0].find("testcase/error") if suites else None
            check(e is not None and (shown + ":2:18: cluster.hosts") in e.get("message"),
                  "the load error with FILE:LINE:COLUMN: %r" % (e.get("message") if e is not None
                                                                 else None))
            check(root.get("errors") == "1" and root.get("tests") == "1", "counted as an error")
        check(not os.path.exists(os.path.join(tmp, "b.db")), "nothing ran")

        # a folder that does not exist: refused before anything runs
        rc, out, err = run([quick, "--db", os.path.join(tmp, "c.db"), "--junit",
                            os.path.join(tmp, "no", "such", "x.xml")], tmp)
        check(rc == 2 and "--junit" in err, "an unwritable --junit path exits 2: %s" % err)
        check(not os.path.exists(os.path.join(tmp, "c.db")), "refused before running")

        # TAP: stdout is TAP only
        rc, out, err = run([quick, bad, never, "--db", os.path.join(tmp, "d.db"), "--tap"], tmp)
        check(rc == 1, "--tap: a failed check exits 1 (got %d)" % rc)
        lines = out.splitlines()
        check(lines and lines[0] == "TAP version 13", "TAP version 13 first: %r" % lines[:1])
        results = [l for l in lines if re.match(r"^(not )?ok \d+ ", l)]
        others = [l for l in lines[1:] if l not in results and not l.startswith("# ")]
        check(others == ["1..%d" % len(results)], "only results, comments and the plan: %r"
              % others)
        check(lines and lines[-1] == "1..8", "the plan last, 3 + 2 + 3 tests: %r" % lines[-1:])
        nums = [int(re.match(r"^(?:not )?ok (\d+)", l).group(1)) for l in results]
        check(nums == list(range(1, len(results) + 1)), "numbered 1..N")
        check("ok 1 - quickstart: gradient_consistency" in lines, "ok NAME: CHECK")
        check("not ok 4 - wrong_for_junit: gradient_consistency" in lines, "not ok for a failure")
        check("ok 6 - never_fires: node_loss # SKIP not judged" in lines,
              "a check that could not judge the run: ok with TAP's SKIP directive")
        check("CHECK" in err and "CHECK" not in out, "the table goes to stderr")

        rc, out, err = run([quick, "--tap", "--json"], tmp)
        check(rc == 2 and "--tap" in err and out == "", "--tap with --json is refused")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if failures:
        print("%d problem(s)" % len(failures))
        return 1
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
