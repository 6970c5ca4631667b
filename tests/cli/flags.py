#!/usr/bin/env python3
"""Every command's help and its refusals of bad flags and bad input, as a
user meets them: each case runs `dsim ARGS` and checks the exit status (0,
1 or 2) and a phrase of what it printed (stdout for help and listings,
stderr for refusals), so a message that loses its place or its fix fails
here.

    flags.py DSIM SCENARIO_DIR
"""
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile

DSIM = os.path.abspath(sys.argv[1])
SCEN = os.path.abspath(sys.argv[2])
QUICK = os.path.join(SCEN, "quickstart.yaml")
failures = []
ran = 0


def run(args, env=None, cwd=None, timeout=120):
    """In the scratch folder unless told otherwise: what dsim writes next to
    it (checkpoints, traces) goes there."""
    e = dict(os.environ)
    e.update(env or {})
    p = subprocess.run([DSIM] + args, capture_output=True, text=True, env=e, cwd=cwd or tmp,
                       timeout=timeout)
    return p.returncode, p.stdout, p.stderr


def case(args, status, where, *phrases, env=None, cwd=None):
    """dsim ARGS must exit with `status` and print every phrase on `where`
    ('out' or 'err')."""
    global ran
    ran += 1
    rc, out, err = run(args, env=env, cwd=cwd)
    text = out if where == "out" else err
    bad = []
    if rc != status:
        bad.append("exit %d, expected %d" % (rc, status))
    for ph in phrases:
        if ph not in text:
            bad.append("no %r on std%s" % (ph, where))
    if bad:
        failures.append("dsim %s: %s\n  stdout: %s\n  stderr: %s" %
                        (" ".join(args), "; ".join(bad), out[-600:], err[-600:]))


def write(path, text):
    with open(path, "w") as f:
        f.write(text)
    return path


tmp = tempfile.mkdtemp(prefix="dsim-flags-")
try:
    db = os.path.join(tmp, "runs.db")
    rc, out, err = run(["run", QUICK, "--db", db], cwd=tmp)
    if rc != 0:
        print("FAIL: the quickstart does not run: %s" % err)
        sys.exit(1)
    notdb = write(os.path.join(tmp, "notdb.db"), "this is not SQLite\n" * 100)
    hosts_file = write(os.path.join(tmp, "hosts.txt"), "# a comment\n\n127.0.0.1\n")
    no_hosts = write(os.path.join(tmp, "nohosts.txt"), "# nothing\n\n")
    sim_yaml = write(os.path.join(tmp, "sim.yaml"),
                     "name: simq\nengine: sim\ncluster: {hosts: 2, devices_per_host: 1}\n"
                     "strategy: {name: multi_worker_mirrored}\n")

    # ---- dsim itself ----
    case([], 2, "err", "usage: dsim <command>")
    case(["--help"], 0, "out", "usage: dsim <command>", "'dsim --version' prints the version")
    case(["-h"], 0, "out", "usage: dsim <command>")
    case(["--version"], 0, "out", "dsim ")
    case(["help"], 0, "out", "usage: dsim <command>")
    case(["help", "frobnicate"], 2, "err", "dsim: unknown command 'frobnicate'")
    case(["frobnicate"], 2, "err", "dsim: unknown command 'frobnicate'; run 'dsim --help'")
    # every command's help, both ways
    for cmd, phrase in [("run", "usage: dsim run"), ("validate", "usage: dsim validate"),
                        ("plan", "usage: dsim plan"), ("list", "usage: dsim list"),
                        ("report", "usage: dsim report"), ("trace", "dsim trace"),
                        ("replay", "usage: dsim replay"), ("explore", "usage: dsim explore"),
                        ("whatif", "usage: dsim whatif"), ("bench", "usage: dsim bench"),
                        ("calibrate", "usage: dsim calibrate"), ("cluster", "usage: dsim cluster"),
                        ("worker", "usage: dsim worker"), ("export", "usage: dsim export")]:
        case(["help", cmd], 0, "out", phrase)
        case([cmd, "--help"], 0, "out", phrase)

    # ---- run ----
    case(["run", "--engine"], 2, "err", "dsim run: --engine needs a value")
    case(["run", "--engine", "gpu"], 2, "err", "--engine is 'gpu' (accepted: threads")
    # the transport: the flag, the scenario key, each refused where the engine cannot take it
    case(["run", QUICK, "--transport", "udp"], 2, "err",
         "--transport is 'udp' (accepted: inproc, shm, tcp)")
    case(["run", QUICK, "--engine", "sim", "--transport", "shm"], 2, "err",
         "transport shm needs real threads and wall-clock time; engine sim (overridden)")
    quick_text = open(QUICK).read()
    tp_inproc = write(os.path.join(tmp, "tp_inproc.yaml"),
                      quick_text.replace("engine: threads", "engine: processes\ntransport: inproc"))
    case(["run", tp_inproc, "--db", os.path.join(tmp, "tp.db")], 2, "err",
         "tp_inproc.yaml:10:12: transport inproc joins ranks of one address space; engine "
         "processes (line 9)")
    tp_bad = write(os.path.join(tmp, "tp_bad.yaml"),
                   quick_text.replace("engine: threads", "engine: processes\ntransport: rdma"))
    case(["validate", tp_bad], 2, "out", "tp_bad.yaml:10:12: transport: 'rdma' is not a transport")
    case(["run", QUICK, "--engine", "processes", "--db", os.path.join(tmp, "tp.db")], 0, "out",
         "engine processes over shm")
    case(["run", QUICK, "--engine", "processes", "--transport", "tcp", "--db",
          os.path.join(tmp, "tp.db")], 0, "out", "engine processes over tcp")
    case(["run", QUICK, "--transport", "shm", "--db", os.path.join(tmp, "tp.db")], 0, "out",
         "engine threads over shm")
    case(["run", "--seed", "-3"], 2, "err", "--seed is '-3' (accepted: a whole number")
    case(["run", "--seed", "x"], 2, "err", "--seed is 'x'")
    case(["run", "--combination", "-1"], 2, "err", "--combination is '-1'")
    case(["run", "--db", ""], 2, "err", "--db is empty")
    case(["run", "--plugin-dir", ""], 2, "err", "--plugin-dir is ''")
    case(["run", "--frob"], 2, "err", "unknown option '--frob'", "see 'dsim run --help'")
    case(["run", "--json", "--tap"], 2, "err", "--json and --tap both print on standard output")
    case(["run", QUICK, "--combination", "3", "--db", db], 2, "err",
         "--combination 3 does not exist; the file makes 1 run (0..0)")
    case(["run", os.path.join(tmp, "absent.yaml"), "--db", db], 2, "err", "cannot open")
    case(["run", QUICK, "--db", notdb], 2, "err", "notdb.db")
    case(["run", QUICK, "--db", os.path.join(tmp, "no", "such", "dir.db")], 2, "err",
         "cannot open results database")
    case(["run", QUICK, "--report", "--json", "--db", os.path.join(tmp, "rep.db")], 0, "out",
         '"report"', "dsim-report-1.html")
    case(["run", QUICK, "--junit", os.path.join(tmp, "nodir", "j.xml"), "--db", db], 2, "err",
         "--junit is", "(accepted: a file path in a writable folder)")

    # ---- run: the CI reports ----
    junit = os.path.join(tmp, "j.xml")
    faulty = os.path.join(SCEN, "faults", "worker_dies_between_collectives.yaml")
    case(["run", faulty, "--junit", junit, "--db", db], 0, "out", "run ")
    with open(junit) as f:
        xml = f.read()
    for want in ("<system-out>", "restart", "worker_dies_between_collectives"):
        if want not in xml:
            failures.append("junit of a run with faults lacks %r: %s" % (want, xml[:400]))
    ran += 1
    broken = write(os.path.join(tmp, "broken.yaml"),
                   "name: broken\ncluster: {hosts: 2, devices_per_host: 1}\n"
                   "data: {examples: 64, files: 1, shard_policy: file}\n"
                   "expect:\n  shard_coverage: {}\n")
    case(["run", broken, "--junit", junit, "--db", db], 1, "out", "fewer than the 2 workers")
    with open(junit) as f:
        xml = f.read()
    for want in ('<failure message="the run failed before it could be judged: could not apply '
                 'FILE sharding', "<system-err>the run ended with an error: could not apply"):
        if want not in xml:
            failures.append("junit of a run that failed lacks %r: %s" % (want, xml[:900]))
    ran += 1
    # without checks to fail, the run itself is the test case, failed
    unjudged = write(os.path.join(tmp, "unjudged.yaml"),
                     "name: unjudged\ncluster: {hosts: 2, devices_per_host: 1}\n"
                     "data: {examples: 64, files: 1, shard_policy: file}\n")
    case(["run", unjudged, "--junit", junit, "--db", db], 1, "out", "unjudged")
    with open(junit) as f:
        xml = f.read()
    if ('<testcase name="run"' not in xml or
            '<failure message="the run failed: could not apply FILE sharding' not in xml):
        failures.append("junit of an unjudged run that failed lacks its case: %s" % xml[:900])
    ran += 1
    os.mkdir(os.path.join(tmp, "adir"))
    case(["run", QUICK, "--junit", os.path.join(tmp, "adir"), "--db", db], 2, "err",
         "could not write the JUnit report")
    ran += 1
    with open("/dev/full", "w") as full:
        p = subprocess.run([DSIM, "run", QUICK, "--tap", "--db", db], stdout=full,
                           stderr=subprocess.PIPE, text=True, cwd=tmp)
    if p.returncode != 2 or "could not write the TAP stream" not in p.stderr:
        failures.append("dsim run --tap > /dev/full: exit %d, %s" % (p.returncode, p.stderr[-300:]))

    # a file name no XML may hold as it is: markup, a tab, a newline, a
    # control byte, bytes that are not UTF-8, an overlong and a surrogate;
    # the JUnit report still parses and says it; TAP keeps one line a test
    odd = os.path.join(tmp.encode(), b"we>ird\tna\nme\x01\xff\xc0\xaf\xed\xa0\x80#1.yaml")
    with open(QUICK, "rb") as f, open(odd, "wb") as g:
        g.write(f.read())
    p = subprocess.run([DSIM.encode(), b"run", odd, b"--junit", junit.encode(), b"--tap",
                        b"--db", db.encode()], capture_output=True, cwd=tmp)
    ran += 1
    import xml.dom.minidom
    try:
        doc = xml.dom.minidom.parse(junit)
        props = [pr.getAttribute("value") for pr in doc.getElementsByTagName("property")
                 if pr.getAttribute("name") == "file"]
        if p.returncode != 0 or not props or "we>ird\tna\nme" not in props[0] \
                or "\ufffd" not in props[0]:
            failures.append("junit of an oddly named file: exit %d, file %r" %
                            (p.returncode, props[:1]))
    except Exception as ex:
        failures.append("junit of an oddly named file does not parse: %s" % ex)
    tap_lines = [l for l in p.stdout.split(b"\n") if l.startswith(b"ok ")]
    if len(tap_lines) != 3 or any(b"#1" in l.split(b" - ")[1].split(b" # ")[0] for l in tap_lines):
        failures.append("TAP of an oddly named file: %r" % p.stdout[:600])

    # on a terminal: one progress line rewritten in place ("\r", erase to
    # the end of the line), closed before the table
    import pty
    mfd, sfd = pty.openpty()
    p = subprocess.Popen([DSIM, "run", QUICK, "--db", db], stdout=sfd, stderr=sfd, cwd=tmp)
    os.close(sfd)
    seen = b""
    while True:
        try:
            chunk = os.read(mfd, 65536)
        except OSError:
            break
        if not chunk:
            break
        seen += chunk
    p.wait()
    os.close(mfd)
    ran += 1
    if p.returncode != 0 or b"\rstep " not in seen or b"\x1b[K" not in seen \
            or b"CHECK" not in seen:
        failures.append("dsim run on a terminal: exit %d, %r" % (p.returncode, seen[-400:]))

    # ---- validate / plan ----
    case(["validate"], 2, "err", "no scenario file given")
    case(["validate", "--frob"], 2, "err", "unknown option '--frob'", "--limits")
    case(["validate", "--plugin-dir"], 2, "err", "--plugin-dir needs a value")
    case(["validate", "--defaults", QUICK], 2, "err", "--defaults takes no files")
    case(["validate", "--limits", "--defaults"], 2, "err", "takes no files and no other listing")
    case(["validate", "--limits"], 0, "out", "| `cluster.hosts` | 1 .. ")
    case(["validate", "-q", QUICK], 0, "out")
    case(["validate", "--", QUICK], 0, "out", "quickstart.yaml: ok")
    case(["plan"], 2, "err", "no scenario given")
    case(["plan", "--frob"], 2, "err", "unknown option '--frob'")
    case(["plan", "--plugin-dir"], 2, "err", "--plugin-dir needs a value")
    case(["plan", QUICK, QUICK], 2, "err", "one scenario at a time")
    case(["plan", os.path.join(tmp, "absent.yaml")], 2, "err", "absent.yaml")

    # ---- list ----
    case(["list"], 2, "err", "what to list?", "strategies, algorithms, checks, runs, faults")
    case(["list", "things"], 2, "err", "cannot list 'things'")
    case(["list", "runs", "checks"], 2, "err", "one thing at a time")
    case(["list", "--frob"], 2, "err", "unknown option '--frob'")
    case(["list", "runs", "--db"], 2, "err", "--db needs a path")
    case(["list", "runs", "--db="], 2, "err", "--db is empty")
    case(["list", "runs", "--limit", "0"], 2, "err", "--limit is '0'")
    case(["list", "runs", "--limit"], 2, "err", "--limit is ''")
    case(["list", "runs", "--db", os.path.join(tmp, "none.db")], 2, "err",
         "no results store at", "run 'dsim run' first")
    case(["list", "runs", "--db", notdb], 2, "err", "notdb.db")
    case(["list", "runs", "--db=" + db, "--limit=1"], 0, "out", "quickstart", "passed")
    case(["list", "runs", "--db", db, "--json"], 0, "out", '"scenario": "quickstart"')
    empty = os.path.join(tmp, "empty.db")
    case(["list", "runs", "--db", os.path.join(tmp, "rep.db"), "--limit", "1"], 0, "out",
         "quickstart")
    for what in ("strategies", "algorithms", "faults"):
        rc, out, err = run(["list", what, "--json"])
        ran_ok = rc == 0 and isinstance(json.loads(out), list)
        if not ran_ok:
            failures.append("dsim list %s --json: exit %d, %s" % (what, rc, out[:200]))

    # ---- trace / report ----
    case(["trace"], 2, "err")
    case(["trace", "desync"], 2, "err", "name a run id")
    case(["trace", "desync", "1", "--db"], 2, "err", "--db needs a path")
    case(["trace", "desync", "--frob"], 2, "err", "unknown option '--frob'")
    case(["trace", "desync", "1", "2"], 2, "err", "one run at a time")
    case(["trace", "desync", "1", "--db", db], 2, "err", "no flight records at",
         "a run writes them only when it fails")
    case(["trace", "desync", os.path.join(tmp, "none.json")], 2, "err", "none.json")
    case(["trace", "1", "2", "--db", db], 2, "err", "one run at a time")
    case(["trace", "99", "--db", db], 2, "err", "99")
    # dsim trace desync on flight records of each shape it explains
    def entry(seq, state, coll=1, count=4, waiting=None, error=None):
        d = {"fingerprint": {"comm_id": 1, "coll": coll, "op": 0, "dtype": 0, "count": count,
                             "root": -1, "algo": 1}}
        if waiting is not None:
            d["waiting_for"] = waiting
        if error:
            d["error"] = error
        return {"collective_seq_id": seq, "state": state, "dsim": d}

    def flight(name, ranks, error="the job failed"):
        path = os.path.join(tmp, name + ".json")
        with open(path, "w") as f:
            json.dump({"run_id": 7, "scenario": name, "error": error, "ranks": ranks}, f)
        return path

    done2 = [entry(1, "completed"), entry(2, "completed")]
    case(["trace", "desync", flight("clean", [{"rank": 0, "calls": 2, "entries": done2},
                                              {"rank": 1, "calls": 2, "entries": done2}])],
         0, "out", "run 7 (clean): 2 ranks, calls 1..2 recorded", "the run failed: the job failed",
         "every rank completed every recorded collective: no desynchronisation")
    case(["trace", "desync", flight("left", [{"rank": 0, "calls": 2, "entries": done2},
                                             {"rank": 1, "calls": 2, "entries": [],
                                              "left_running": "in compute at step 3"}])],
         0, "out", "the watchdog left 1 rank running", "rank 1: in compute at step 3",
         "verdict: the rank above never returned")
    case(["trace", "desync", flight("differ", [
        {"rank": 0, "calls": 2, "entries": [entry(1, "completed"), entry(2, "started", waiting=1)]},
        {"rank": 1, "calls": 2, "entries": [entry(1, "completed"),
                                            entry(2, "started", coll=3, count=8, error="aborted")]},
        {"rank": 2, "calls": 2, "entries": [entry(1, "completed"), entry(2, "started", waiting=1)]},
        {"rank": 3, "calls": 1, "entries": [entry(1, "completed")]}])],
         0, "out", "the first collective the ranks disagree about: #2",
         "rank 1 called broadcast #2 with 8 float32 from root -1 (sum, ring) instead "
         "(collective and count differ): aborted",
         "rank 0 started it and was waiting for rank 1, not done",
         "rank 3 never called it: rank 3's last call was #1",
         "verdict: the ranks disagree about call #2",
         "(the ranks that never called it were still in an earlier call")
    case(["trace", "desync", flight("stalled", [
        {"rank": 0, "calls": 2, "entries": [entry(1, "completed"), entry(2, "completed")]},
        {"rank": 1, "calls": 2, "entries": [entry(1, "completed"), entry(2, "started", waiting=2)]},
        {"rank": 2, "calls": 2, "entries": [entry(1, "completed"),
                                            entry(2, "scheduled", error="peer 1 is down")]},
        {"rank": 3, "calls": 2, "entries": [entry(2, "completed")], "left_running": "x"}])],
         0, "out", "the first collective not every rank completed: #2",
         "rank 1 started it and was waiting for rank 2, not done",
         "rank 2 entered it; it ended with: peer 1 is down",
         "verdict: every rank joined call #2 but it did not complete everywhere")
    case(["trace", "desync", flight("missing", [
        {"rank": 0, "calls": 2, "entries": done2},
        {"rank": 1, "calls": 1, "entries": [], "left_running": "in its own code"},
        {"rank": 2, "calls": 2, "entries": done2}])],
         0, "out", "the first collective not every rank completed: #2",
         "ranks 0 and 2 completed it",
         "rank 1 never called it: rank 1 was left running by the watchdog after 1 call, its "
         "recorder not read: in its own code",
         "rank 1: not read (left running after 1 calls)")
    case(["trace", "desync", flight("nocall", [
        {"rank": 0, "calls": 1, "entries": [entry(1, "completed")]},
        {"rank": 1, "calls": 0, "entries": []}])],
         0, "out", "rank 1 never called it: rank 1 made no collective call",
         "verdict: call #1 was never made by the rank named above: it was stuck before it")
    case(["trace", "desync", write(os.path.join(tmp, "notjson.json"), "{ no")], 2, "err",
         "not a flight record file")
    case(["trace", "desync", write(os.path.join(tmp, "noranks.json"), '{"ranks": []}')], 2,
         "err", 'no "ranks" array')
    case(["report", "--db", db, "--frob"], 2, "err", "--frob")
    case(["report", "99", "--db", db], 2, "err", "99")

    # ---- replay ----
    case(["replay"], 2, "err", "which run?")
    case(["replay", "--db"], 2, "err", "--db needs a path")
    case(["replay", "1", "2"], 2, "err", "unexpected '2'")
    case(["replay", "x1"], 2, "err", "RUN_ID is 'x1'")
    case(["replay", "1", "--db", notdb], 2, "err", "notdb.db")
    case(["replay", "99", "--db", db], 2, "err", "99")
    case(["replay", "1", "--db", db], 2, "err", "threads")  # only sim runs replay
    simdb = os.path.join(tmp, "sim.db")
    rc, out, err = run(["run", sim_yaml, "--db", simdb], cwd=tmp)
    if rc != 0:
        failures.append("the sim scenario did not run: %s" % err)
    case(["replay", "1", "--db", simdb], 0, "out", "trace matches")
    # ---- export ----
    case(["export"], 2, "err", "which run?")
    case(["export", "1"], 2, "err", "give --to DIR")
    case(["export", "1", "--to"], 2, "err", "--to needs a path")
    case(["export", "1", "--db"], 2, "err", "--db needs a path")
    case(["export", "1", "2", "--to", tmp], 2, "err", "unexpected '2'")
    case(["export", "x1", "--to", tmp], 2, "err", "RUN_ID is 'x1'")
    case(["export", "1", "--to", tmp, "--frob"], 2, "err", "unexpected '--frob'")
    case(["export", "1", "--db", notdb, "--to", tmp], 2, "err", "notdb.db")
    case(["export", "99", "--db", simdb, "--to", tmp], 2, "err", "there is no run 99")
    case(["export", "1", "--db", simdb, "--to", os.path.join(tmp, "exported")], 0, "out",
         "stored checksums match")
    # the sim engine's knobs, misset: a warning naming the value and the default taken
    case(["run", sim_yaml, "--db", simdb], 0, "err",
         # the default taken: 256 KiB, more in a sanitizer build
         "DSIM_SIM_STACK_KIB is '1': not a number of KiB in 16..65536; using ",
         "DSIM_SIM_GUARDED_STACKS is 'many': not a count in 0..30000; using 8192",
         "DSIM_SIM_STALL_S is 'x': not a number of seconds > 0; using 60",
         env={"DSIM_SIM_STALL_S": "x", "DSIM_SIM_STACK_KIB": "1",
              "DSIM_SIM_GUARDED_STACKS": "many"})

    # ---- whatif ----
    case(["whatif", "--frob"], 2, "err", "unknown option '--frob'")
    case(["whatif", "--hosts"], 2, "err", "--hosts needs a value")
    case(["whatif", "--hosts", "0"], 2, "err", "--hosts '0' is not a whole number in 1..")
    case(["whatif", "--batch", "x"], 2, "err", "--batch 'x'")
    case(["whatif", QUICK, QUICK], 2, "err", "one scenario at a time")
    case(["whatif", "--params", "0"], 2, "err", "--params")
    case(["whatif", "--params", "2T"], 2, "err", "--params must be between 1 and 1T")
    case(["whatif", "--device", "tpu"], 2, "err", "--device 'tpu' is not a preset")
    case(["whatif", "--network", "carrier_pigeon"], 2, "err", "is not a link preset")
    case(["whatif", "--intra", "carrier_pigeon"], 2, "err", "--intra 'carrier_pigeon'")
    case(["whatif", "--chakra", "/proc/no/such"], 2, "err", "--chakra")
    case(["whatif", "--presets"], 0, "out", "nvlink")

    # ---- bench / calibrate ----
    case(["bench", "--frob"], 2, "err", "--frob")
    case(["bench"], 2, "err", "name a collective: allreduce")
    case(["bench", "allreduce", "--engine", "gpu"], 2, "err", "gpu")
    case(["bench", "allreduce", "--ranks", "0"], 2, "err", "--ranks")
    case(["bench", "allreduce", "--ranks", "2", "-b", "4", "-e", "4", "-d", "double", "-n", "2"],
         0, "out", "# 4 B: too small for whole double elements on 2 ranks; skipped")
    case(["bench", "allreduce", "--ranks", "2", "-b", "64", "-e", "64"], 2, "err",
         "DSIM_BENCH_CORRUPT='x' is not a rank", env={"DSIM_BENCH_CORRUPT": "x"})
    case(["bench", "allgather", "--model", "1"], 2, "err", "--model 1 models allreduce")
    case(["calibrate", "--frob"], 2, "err", "--frob")
    case(["calibrate", "--ranks"], 2, "err", "--ranks needs a value")
    case(["calibrate", "--engine", "sim"], 2, "err", "sim")
    case(["calibrate", "--algo", ""], 2, "err", "dsim calibrate: --algo needs a value")
    case(["calibrate", "--algo=,", "--sizes", "4K"], 2, "err",
         "--algo and --sizes need at least one entry each")
    case(["calibrate", "--ranks", "2", "--algo", "ring", "--sizes", "4K"], 0, "out",
         "# dsim calibrate: engine threads", "ring")

    # ---- cluster ----
    case(["cluster", "--frob"], 2, "err", "--frob")
    case(["cluster"], 0, "out", '"source": "local"', env={"TF_CONFIG": ""})
    case(["cluster"], 2, "err", "TF_CONFIG", env={"TF_CONFIG": "{not json"})
    case(["cluster"], 0, "out", "worker",
         env={"TF_CONFIG": '{"cluster": {"worker": ["a:1", "b:1"]}, '
                           '"task": {"type": "worker", "index": 1}}'})

    # ---- worker ----
    case(["worker"], 2, "err", "give the scenario file")
    case(["worker", QUICK, QUICK], 2, "err", "one scenario per job")
    case(["worker", QUICK, "--frob"], 2, "err", "unknown option '--frob'")
    case(["worker", QUICK, "--port"], 2, "err", "--port needs a value")
    case(["worker", QUICK, "--port", "0"], 2, "err", "--port is '0' (accepted: 1..65535)")
    case(["worker", QUICK, "--timeout", "-1"], 2, "err", "--timeout is '-1'")
    case(["worker", os.path.join(tmp, "absent.yaml")], 2, "err", "absent.yaml")
    case(["worker", QUICK], 2, "err", "TF_CONFIG is not set and no launcher's rank is",
         env={"TF_CONFIG": ""})
    # the quickstart's 2 hosts: 2 tasks
    launcher = {"TF_CONFIG": "", "OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2",
                "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}
    case(["worker", QUICK, "--print-tf-config"], 0, "out", '"worker":["127.0.0.1:2222"',
         '"task":{"type":"worker","index":0}', env=launcher)
    case(["worker", QUICK, "--print-tf-config", "--hosts", "@" + hosts_file], 0, "out",
         "127.0.0.1:2222", env=launcher)
    case(["worker", QUICK, "--print-tf-config", "--hosts", "@" + no_hosts], 2, "err",
         "lists no host", env=launcher)
    case(["worker", QUICK, "--print-tf-config", "--hosts", "@" + os.path.join(tmp, "x")], 2,
         "err", "cannot open it", env=launcher)
    case(["worker", QUICK, "--print-tf-config", "--hosts", "a,b,c"], 2, "err",
         "--hosts names 3 hosts but the job has 2 tasks", env=launcher)
    case(["worker", QUICK, "--print-tf-config", "--hosts", "a,"], 2, "err",
         "has an empty entry", env=launcher)
    case(["worker", QUICK, "--print-tf-config", "--hosts", "h0,h1"], 0, "out",
         '"h0:2222"', env=dict(launcher, OMPI_COMM_WORLD_RANK="1"))
    case(["worker", QUICK, "--print-tf-config", "--port", "65534"], 2, "err",
         "past port 65535", env=launcher)
    case(["worker", QUICK, "--print-tf-config"], 2, "err", "are not a rank below a size",
         env=dict(launcher, OMPI_COMM_WORLD_RANK="2"))
    case(["worker", QUICK, "--print-tf-config"], 2, "err",
         "placed the tasks on more than one node", env=dict(launcher, OMPI_COMM_WORLD_LOCAL_SIZE="1"))
    # the launch line of the launcher in use first
    case(["worker", QUICK, "--print-tf-config"], 2, "err", "so start 2 task(s): srun -n 2",
         "(mpirun -np 2 ...",
         env={"TF_CONFIG": "", "SLURM_PROCID": "0", "SLURM_NTASKS": "3", "SLURM_NNODES": "1"})
    case(["worker", QUICK, "--print-tf-config"], 2, "err", "so start 2 task(s): mpirun -np 2",
         "(srun -n 2 ...", env=dict(launcher, OMPI_COMM_WORLD_SIZE="3",
                                    OMPI_COMM_WORLD_LOCAL_SIZE="3"))
    case(["worker", QUICK, "--print-tf-config", "--reshape"], 2, "err", "cannot be split evenly",
         env={"TF_CONFIG": "", "SLURM_PROCID": "0", "SLURM_NTASKS": "3", "SLURM_NNODES": "1"})
    case(["worker", QUICK, "--print-tf-config", "--reshape"], 0, "err", "ANOTHER JOB",
         env={"TF_CONFIG": "", "SLURM_PROCID": "0", "SLURM_NTASKS": "4", "SLURM_NNODES": "1"})
    case(["worker", QUICK, "--print-tf-config"], 0, "out", '"index":0',
         env={"TF_CONFIG": "", "PMI_RANK": "0", "PMI_SIZE": "2", "MPI_LOCALNRANKS": "2"})
    case(["worker", QUICK, "--print-tf-config"], 2, "err", "TF_CONFIG",
         env={"TF_CONFIG": "{\"cluster\": 3}"})
    # addresses that cannot work, refused with the task and the address
    port = 30000 + (os.getpid() % 400) * 6

    def tf(hosts, index):
        return {"TF_CONFIG": json.dumps({"cluster": {"worker": hosts},
                                         "task": {"type": "worker", "index": index}})}
    case(["worker", QUICK, "--timeout", "1"], 2, "err",
         "cannot resolve host 'nohost.invalid'",
         env=tf(["nohost.invalid:%d" % port, "nohost.invalid:%d" % (port + 3)], 0))
    case(["worker", QUICK, "--timeout", "1"], 2, "err", "its ranks need ports 65535..65537",
         "choose a lower port", env=tf(["127.0.0.1:65535", "127.0.0.1:%d" % port], 0))
    case(["worker", QUICK, "--timeout", "1"], 1, "err",
         "could not reach the chief at [::1]:%d within 1 s" % (port + 2),
         env=tf(["[::1]:%d" % port, "[::1]:%d" % (port + 3)], 1))
finally:
    shutil.rmtree(tmp, ignore_errors=True)

for f in failures:
    print("FAIL: " + f)
print("%d cases, %d failed" % (ran, len(failures)))
sys.exit(1 if failures else 0)
