#!/usr/bin/env python3
"""`dsim conformance`, run as a strategy author runs it.

usage: conformance.py CASE DSIM BUILD_DIR XSD [STRATEGY...]

  quick       the reduced battery on multi_worker_mirrored passes: exit 0,
              one row per quick case, every row "pass", the summary line,
              and JUnit XML (a testsuite per case and engine, a testcase per
              check) that parses and, where xmllint is, validates against
              sim/cli/junit.xsd
  full        the whole battery on each STRATEGY (a built-in name, or
              "parameter_server:async"): exit 0, no case failed; prints the
              battery's run time
  not_applicable
              cases a strategy cannot take are "n/a" with the reason, and
              <skipped> in JUnit: one_device has no peer to kill, mirrored
              no second worker to cut off, asynchronous parameter servers
              cannot replay a restore; exit 0
  planted     each planted bug fails the case it should and passes the
              catalogue's: a save() without the optimizer's slots fails
              checkpoint_restart (checkpoint_roundtrip); a strategy that
              ignores a failed collective fails kill_recovery; an all-reduce
              that drops the n % N tail passes catalogue_2x2 (36 parameters
              over 4 replicas) and fails the awkward shapes; a strategy that
              crashes is one failed case, not the end of the battery
  input_fn    a strategy that distributes its own input and refuses a global
              batch its replicas do not divide (TF's
              get_per_replica_batch_size) passes every case, run with the
              next multiple of the replicas and saying so (it failed 8 of
              15 by its refusal before); its planted bug (an uneven split's
              remainder dropped) still fails shard_coverage
  bad_input   no strategy, an unknown one, a missing plugin, an unknown case
              or engine, a bad --ps-mode, --timeout or --keep: exit 2 with a
              message; --list prints the battery
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET

CASE, DSIM, BUILD, XSD = sys.argv[1], *(os.path.abspath(a) for a in sys.argv[2:5])
STRATEGIES = sys.argv[5:]
failures = []
ROW = re.compile(r"^  (\w+) +(\S+) +(\S+) +(pass|FAIL|n/a|ERROR) +(.*)$")


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL: " + what)
    return cond


def conformance(args, cwd, timeout=600):
    t0 = time.monotonic()
    p = subprocess.run([DSIM, "conformance"] + args, cwd=cwd, capture_output=True,
                       timeout=timeout)
    out = p.stdout.decode("utf-8", "replace")
    err = p.stderr.decode("utf-8", "replace")
    print("$ dsim conformance %s  (exit %d, %.1f s)\n%s%s" %
          (" ".join(args), p.returncode, time.monotonic() - t0, out, err))
    rows = {}
    for line in out.splitlines():
        m = ROW.match(line)
        if m and m.group(1) != "CASE":
            rows[m.group(1)] = {"shape": m.group(2), "engines": m.group(3),
                                "verdict": m.group(4), "message": m.group(5)}
    return p.returncode, out, err, rows


def plugin(*parts):
    return os.path.join(BUILD, *parts)


def junit(path, label):
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError) as e:
        check(False, "%s: not readable XML: %s" % (label, e))
        return None
    check(root.tag == "testsuites", label + ": the root is <testsuites>")
    for ts in root.findall("testsuite"):
        cases = ts.findall("testcase")
        check(int(ts.get("tests")) == len(cases), "%s: %s tests=" % (label, ts.get("name")))
        check(int(ts.get("skipped")) == sum(c.find("skipped") is not None for c in cases),
              "%s: %s skipped=" % (label, ts.get("name")))
    xmllint = shutil.which("xmllint")
    if xmllint:
        p = subprocess.run([xmllint, "--noout", "--schema", XSD, path], capture_output=True)
        check(p.returncode == 0, "%s validates against %s: %s" % (label, XSD, p.stderr.decode()))
    else:
        print("# xmllint not found (Debian: libxml2-utils): schema validation skipped")
    return root


def case_quick(tmp):
    rc, out, err, rows = conformance(["multi_worker_mirrored", "--quick", "--junit",
                                      os.path.join(tmp, "q.xml")], tmp)
    check(rc == 0, "the quick battery on multi_worker_mirrored exits 0 (got %d)" % rc)
    want = {"catalogue_2x2", "uneven_2x3", "fewer_params", "checkpoint_restart", "kill_recovery"}
    check(set(rows) == want, "the quick cases: %s" % sorted(rows))
    check(all(r["verdict"] == "pass" for r in rows.values()), "every quick case passes")
    check(rows.get("catalogue_2x2", {}).get("engines") == "threads,processes,sim",
          "catalogue_2x2 runs on every engine")
    check(re.search(r"^multi_worker_mirrored: 5 cases: 5 passed, 0 failed, 0 n/a \([0-9.]+ s\)$",
                    out, re.M), "the summary line")
    root = junit(os.path.join(tmp, "q.xml"), "q.xml")
    if root is not None:
        names = [s.get("name") for s in root.findall("testsuite")]
        check("kill_recovery.sim" in names and "catalogue_2x2.processes" in names,
              "a testsuite per case and engine: %s" % names)
        ks = [s for s in root.findall("testsuite") if s.get("name") == "kill_recovery.sim"]
        if ks:
            # the case's expect list, in its order (checks judged by default may follow)
            names = [c.get("name") for c in ks[0].findall("testcase")]
            check(names[:2] == ["gradient_consistency", "node_loss"],
                  "a testcase per check of the case: %s" % names)
        check(root.get("failures") == "0" and root.get("errors") == "0", "no failure in JUnit")


def case_full(tmp):
    for spec in STRATEGIES:
        name, _, mode = spec.partition(":")
        args = [name] + (["--ps-mode", mode] if mode else [])
        t0 = time.monotonic()
        rc, out, err, rows = conformance(args, tmp)
        took = time.monotonic() - t0
        check(rc == 0, "the full battery on %s exits 0 (got %d)" % (spec, rc))
        check(len(rows) >= 15, "%s: every case has a row (%d)" % (spec, len(rows)))
        bad = [k for k, r in rows.items() if r["verdict"] in ("FAIL", "ERROR")]
        check(not bad, "%s: no case fails: %s" % (spec, bad))
        print("# battery time %s: %.1f s" % (spec, took))


def case_not_applicable(tmp):
    x = os.path.join(tmp, "na.xml")
    rc, out, err, rows = conformance(["one_device", "--case",
                                      "kill_recovery,straggler,partition,one_replica",
                                      "--junit", x], tmp)
    check(rc == 0, "n/a cases do not fail the battery (got %d)" % rc)
    for c in ("kill_recovery", "straggler"):
        r = rows.get(c, {})
        check(r.get("verdict") == "n/a" and "needs 2 or more replicas" in r.get("message", "")
              and "one_device runs exactly 1 replica" in r.get("message", ""),
              "%s is n/a for one_device, saying why: %s" % (c, r))
    check(rows.get("one_replica", {}).get("verdict") == "pass", "one_replica passes")
    root = junit(x, "na.xml")
    if root is not None:
        sk = [s for s in root.findall("testsuite") if s.get("skipped") == "1"]
        check(len(sk) == 3, "the n/a cases are skipped in JUnit (%d)" % len(sk))
        msg = sk[0].find("testcase/skipped").get("message") if sk else ""
        check("needs 2 or more" in msg, "the skipped message is the reason: %r" % msg)
    rc, out, err, rows = conformance(["mirrored", "--case", "partition,catalogue_2x2"], tmp)
    r = rows.get("partition", {})
    check(rc == 0 and r.get("verdict") == "n/a" and "2 or more workers" in r.get("message", ""),
          "partition is n/a for mirrored: %s" % r)
    check(rows.get("catalogue_2x2", {}).get("shape") == "1x4",
          "mirrored takes the 2 x 2 case as 1 x 4: %s" % rows.get("catalogue_2x2"))
    rc, out, err, rows = conformance(["parameter_server", "--ps-mode", "async", "--case",
                                      "checkpoint_restart,kill_recovery", "--engine", "sim"], tmp)
    r = rows.get("checkpoint_restart", {})
    check(rc == 0 and r.get("verdict") == "n/a" and "asynchronous" in r.get("message", ""),
          "checkpoint_restart is n/a for asynchronous parameter servers: %s" % r)
    check(rows.get("kill_recovery", {}).get("shape") == "2x2+2ps"
          and rows.get("kill_recovery", {}).get("verdict") == "pass",
          "parameter servers are added for parameter_server: %s" % rows.get("kill_recovery"))


def case_narrow(tmp):
    """bfloat16_allreduce: gradients all-reduced in bfloat16 with a restart
    pass for a strategy that all-reduces through dsim_strategy_allreduce_grad,
    and are n/a, saying why, for one that sends its gradients in float32 or
    a plugin that all-reduces them its own way."""
    rc, out, err, rows = conformance(["multi_worker_mirrored", "--case", "bfloat16_allreduce"],
                                     tmp)
    r = rows.get("bfloat16_allreduce", {})
    check(rc == 0 and r.get("verdict") == "pass" and "checkpoint_roundtrip" in r.get("message", ""),
          "bfloat16_allreduce passes on multi_worker_mirrored: %s" % r)
    rc, out, err, rows = conformance(["central_storage", "--case", "bfloat16_allreduce"], tmp)
    r = rows.get("bfloat16_allreduce", {})
    check(rc == 0 and r.get("verdict") == "n/a" and "sends them to its host's variables in "
          "float32" in r.get("message", ""), "n/a for central_storage, saying why: %s" % r)
    mine = plugin("examples", "custom_strategy", "libcustom_strategy.so")
    rc, out, err, rows = conformance([mine, "--case", "bfloat16_allreduce"], tmp)
    r = rows.get("bfloat16_allreduce", {})
    check(rc == 0 and r.get("verdict") == "n/a" and "ignores gradient_dtype bfloat16" in
          r.get("message", ""), "n/a for a plugin that all-reduces its own way: %s" % r)
    # global_clipnorm needs the whole gradient on a replica: n/a for the
    # parameter servers (each applies its shard), not refused
    rc, out, err, rows = conformance(["parameter_server", "--case", "global_clipnorm"], tmp)
    r = rows.get("global_clipnorm", {})
    check(rc == 0 and r.get("verdict") == "n/a" and "each apply their own shard" in
          r.get("message", ""), "global_clipnorm is n/a for parameter_server: %s" % r)


def case_planted(tmp):
    save = plugin("tests", "strategy", "libbroken_save_strategy.so")
    rc, out, err, rows = conformance([save, "--case", "catalogue_2x2,checkpoint_restart",
                                      "--engine", "threads,sim"], tmp)
    r = rows.get("checkpoint_restart", {})
    check(rc == 1, "broken_save fails the battery (got %d)" % rc)
    msg = r.get("message", "")
    # save() is blamed, not the restore of the file it wrote (whose slots,
    # left out, read as zero), even though the restart restored that file
    check(r.get("verdict") == "FAIL" and "checkpoint_roundtrip: save: " in msg
          and "save() must copy the optimizer's slots" in msg and "restore:" not in msg,
          "a save() without the optimizer's slots fails checkpoint_restart naming save(): %s" % r)
    check(rows.get("catalogue_2x2", {}).get("verdict") == "pass", "broken_save trains right")

    # the mirror image: save() right, create_variables drops the slots
    restore = plugin("tests", "strategy", "libbroken_restore_strategy.so")
    rc, out, err, rows = conformance([restore, "--case", "checkpoint_restart",
                                      "--engine", "threads"], tmp)
    msg = rows.get("checkpoint_restart", {}).get("message", "")
    check(rc == 1 and "checkpoint_roundtrip: restore: " in msg
          and "create_variables must take init->optim_state" in msg and "save:" not in msg,
          "a restore that drops the slots fails checkpoint_restart naming the restore: %s" % msg)

    abort = plugin("tests", "explore", "libignore_abort_strategy.so")
    rc, out, err, rows = conformance([abort, "--case", "catalogue_2x2,kill_recovery",
                                      "--engine", "sim"], tmp)
    r = rows.get("kill_recovery", {})
    check(rc == 1 and r.get("verdict") == "FAIL",
          "a strategy that ignores a failed collective fails kill_recovery: %s" % r)
    check(rows.get("catalogue_2x2", {}).get("verdict") == "pass", "ignore_abort passes unfaulted")

    tail = plugin("tests", "explore", "libtail_drop_strategy.so")
    rc, out, err, rows = conformance([tail, "--case",
                                      "catalogue_2x2,uneven_2x3,fewer_params,one_replica"], tmp)
    check(rc == 1, "tail_drop fails the battery (got %d)" % rc)
    check(rows.get("catalogue_2x2", {}).get("verdict") == "pass",
          "the tail bug hides at 36 parameters over 4 replicas")
    check(rows.get("one_replica", {}).get("verdict") == "pass", "one replica has no tail")
    for c in ("uneven_2x3", "fewer_params"):
        r = rows.get(c, {})
        check(r.get("verdict") == "FAIL" and "gradient_consistency" in r.get("message", "")
              and "diverged" in r.get("message", ""),
              "the tail-dropping all-reduce fails %s: %s" % (c, r))

    segv = plugin("tests", "harness", "libcrash_segv_strategy.so")
    rc, out, err, rows = conformance([segv, "--case", "catalogue_2x2,one_replica", "--engine",
                                      "threads"], tmp)
    r = rows.get("catalogue_2x2", {})
    check(rc == 1 and r.get("verdict") == "FAIL" and "crashed" in r.get("message", ""),
          "a crashing strategy is a failed case: %s" % r)
    check(rows.get("one_replica", {}).get("verdict") == "pass",
          "the battery goes on after a crash (replica 1 crashes; 1 x 1 has none)")


def case_bad_input(tmp):
    def bad(args, msg):
        p = subprocess.run([DSIM, "conformance"] + args, cwd=tmp, capture_output=True,
                           timeout=60)
        err = p.stderr.decode()
        check(p.returncode == 2 and msg in err,
              "dsim conformance %s: exit 2 and %r (got %d: %s)" % (args, msg, p.returncode, err))
    bad([], "which strategy?")
    bad(["no_such_strategy"], "no strategy named 'no_such_strategy'")
    bad([os.path.join(tmp, "libnone.so")], "not found")
    bad(["mirrored", "--case", "catalogue_2x2,nope"], "--case 'nope'")
    bad(["mirrored", "--engine", "warp"], "--engine 'warp'")
    bad(["parameter_server", "--ps-mode", "lazy"], "--ps-mode is 'lazy'")
    bad(["mirrored", "--timeout", "0"], "--timeout is '0'")
    bad(["mirrored", "--case"], "needs a value")
    bad(["mirrored", "extra"], "unexpected 'extra'")
    bad(["mirrored", "--keep", os.path.join(tmp, "nowhere")], "not a writable directory")
    p = subprocess.run([DSIM, "conformance", "--list"], capture_output=True, timeout=60)
    out = p.stdout.decode()
    check(p.returncode == 0 and "kill_recovery" in out and "checkpoint_restart" in out,
          "--list prints the battery")


def case_tpu(tmp):
    """A strategy that runs on TPU slices only is run on slices (it was n/a
    on every case): the built-in TPUStrategy passes, the planted TPU bugs
    fail."""
    cases = "one_replica,one_host_3,uneven_2x3,kill_recovery"
    rc, out, err, rows = conformance(["tpu", "--case", cases, "--engine", "sim,threads"], tmp)
    check(rc == 0, "the TPUStrategy passes the battery on slices (got %d)" % rc)
    want = {"one_replica": "v5e-1", "one_host_3": "v3-8", "uneven_2x3": "v4-16",
            "kill_recovery": "v4-16"}
    for c, slice_ in want.items():
        r = rows.get(c, {})
        check(r.get("verdict") == "pass" and r.get("shape") == slice_,
              "tpu runs %s on a %s and passes: %s" % (c, slice_, r))
    check("node_loss" in rows.get("kill_recovery", {}).get("message", ""),
          "kill_recovery judges node_loss on the slice")
    for bug in ("tpu_unmasked", "tpu_one_pipeline"):
        so = plugin("tests", "strategy", "lib%s_strategy.so" % bug)
        rc, out, err, rows = conformance([so, "--case", "uneven_2x3", "--engine", "sim"], tmp)
        r = rows.get("uneven_2x3", {})
        check(rc == 1 and r.get("verdict") == "FAIL" and r.get("shape") == "v4-16"
              and "gradient_consistency" in r.get("message", ""),
              "the planted %s fails on a slice: %s" % (bug, r))


def case_input_fn(tmp):
    ok = plugin("examples", "input_fn_strategy", "libinput_fn_strategy.so")
    rc, out, err, rows = conformance([ok], tmp)
    check(rc == 0, "the input_fn strategy passes the battery (got %d)" % rc)
    check(len(rows) >= 15, "every case has a row (%d)" % len(rows))
    bad = [k for k, r in rows.items() if r["verdict"] != "pass"]
    check(not bad, "no case fails or is n/a: %s" % bad)
    r = rows.get("one_host_3", {})
    check("global batch 33, not the case's 31: the strategy's input_fn refuses a batch its 3 "
          "replicas do not divide" in r.get("message", ""),
          "the fitted batch is said: %s" % r)
    check("not the case's" not in rows.get("catalogue_2x2", {}).get("message", "x"),
          "a batch the replicas divide is left as it is")
    drop = plugin("examples", "input_fn_strategy", "libinput_fn_drop_last_strategy.so")
    rc, out, err, rows = conformance([drop, "--case", "catalogue_2x2,uneven_2x3", "--engine",
                                      "sim"], tmp)
    check(rc == 1, "the dropped remainder fails the battery (got %d)" % rc)
    r = rows.get("uneven_2x3", {})
    check(r.get("verdict") == "FAIL" and "shard_coverage" in r.get("message", ""),
          "the dropped remainder fails uneven_2x3 by shard_coverage: %s" % r)


def main():
    tmp = tempfile.mkdtemp(prefix="dsim-conformance-test-")
    try:
        {"quick": case_quick, "full": case_full, "not_applicable": case_not_applicable,
         "planted": case_planted, "bad_input": case_bad_input, "tpu": case_tpu,
         "input_fn": case_input_fn, "narrow": case_narrow}[CASE](tmp)
        print("%d failure(s)" % len(failures))
        return 1 if failures else 0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
