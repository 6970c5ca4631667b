#!/usr/bin/env python3
"""Validates a Chrome trace-event JSON file against the format's rules
(the "Trace Event Format" document that chrome://tracing and Perfetto's
JSON importer follow).

Checked: the JSON Object Format ({"traceEvents": [...]}, optional
displayTimeUnit "ms"/"ns"); every event has ph, ts, pid, tid and name of
the right types, ts >= 0; ph is a known phase; X events have dur >= 0;
per (pid, tid) track, in timestamp order (stable), B/E pairs nest (an E
closes the innermost open B; names match where the E names one) and none
stays open; B/E and X slices on one track nest properly (no partial
overlap); instant events' scope s is g, p or t; flow events s/f come in
pairs with the same cat and id (a cat is required), the s no later than
its f, the s inside a slice of its own track and the f too when it binds
to the enclosing slice (bp "e"), else before a slice of its track (flows
bind to slices); M metadata
events name processes and threads with args.name.

usage: trace_check.py FILE.json   (exit 0 valid, 1 invalid: the reasons)
As a module: errors(doc) returns the list of reasons, empty when valid.
"""
import json
import sys

# the phases the format defines: duration, complete, instant, counter,
# async, flow, sample, object, metadata, mark, context
PHASES = {"B", "E", "X", "i", "I", "C", "b", "n", "e", "S", "T", "p", "F", "s", "t", "f", "P",
          "N", "O", "D", "M", "V", "v", "R", "c", "(", ")"}
EPS = 1e-6


def errors(doc):
    errs = []
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        return ["the top level is not an object with a traceEvents array"]
    if "displayTimeUnit" in doc and doc["displayTimeUnit"] not in ("ms", "ns"):
        errs.append("displayTimeUnit is %r (accepted: ms, ns)" % doc["displayTimeUnit"])
    evs = doc["traceEvents"]
    tracks = {}
    flows = {}
    for i, e in enumerate(evs):
        where = "event %d (%s)" % (i, json.dumps(e)[:120])
        if not isinstance(e, dict):
            errs.append(where + ": not an object")
            continue
        ok = True
        for key, types in (("ph", str), ("name", str), ("pid", int), ("tid", int),
                           ("ts", (int, float))):
            if key not in e:
                errs.append(where + ": no " + key)
                ok = False
            elif not isinstance(e[key], types) or isinstance(e[key], bool):
                errs.append(where + ": %s has the wrong type" % key)
                ok = False
        if not ok:
            continue
        ph = e["ph"]
        if ph not in PHASES:
            errs.append(where + ": unknown phase %r" % ph)
        if e["ts"] < 0:
            errs.append(where + ": ts < 0")
        if ph == "X":
            d = e.get("dur")
            if not isinstance(d, (int, float)) or d < 0:
                errs.append(where + ": X event without a dur >= 0")
        if ph in ("i", "I") and e.get("s", "t") not in ("g", "p", "t"):
            errs.append(where + ": instant scope %r (accepted: g, p, t)" % e.get("s"))
        if ph == "M":
            if e["name"] in ("process_name", "thread_name") and not isinstance(
                    (e.get("args") or {}).get("name"), str):
                errs.append(where + ": %s without args.name" % e["name"])
            continue
        if ph in ("s", "f", "t"):
            if "id" not in e:
                errs.append(where + ": flow event without id")
            else:
                flows.setdefault((e.get("cat"), str(e["id"])), []).append((i, e))
        tracks.setdefault((e["pid"], e["tid"]), []).append((i, e))

    slices = {}
    for key, lst in tracks.items():
        lst.sort(key=lambda p: (p[1]["ts"], p[0]))
        stack = []  # open B events: (name, ts)
        spans = []
        for i, e in lst:
            ph = e["ph"]
            if ph == "B":
                stack.append((e["name"], e["ts"], i))
            elif ph == "E":
                if not stack:
                    errs.append("track %s: E '%s' at %s closes nothing" % (key, e["name"], e["ts"]))
                    continue
                name, ts, bi = stack.pop()
                if e.get("name") and e["name"] != name:
                    errs.append("track %s: E '%s' closes B '%s'" % (key, e["name"], name))
                spans.append((ts, e["ts"], bi))
            elif ph == "X":
                spans.append((e["ts"], e["ts"] + e["dur"], i))
        for name, ts, _ in stack:
            errs.append("track %s: B '%s' at %s never ends" % (key, name, ts))
        # proper nesting of all slices on the track
        spans.sort(key=lambda s: (s[0], -s[1], s[2]))
        open_ = []
        for s0, s1, idx in spans:
            while open_ and open_[-1][1] <= s0 + EPS:
                open_.pop()
            if open_ and s1 > open_[-1][1] + EPS:
                errs.append("track %s: slice of event %d [%s, %s] overlaps [%s, %s] without "
                            "nesting" % (key, idx, s0, s1, open_[-1][0], open_[-1][1]))
            open_.append((s0, s1))
        slices[key] = spans

    def inside(e):
        return any(s0 - EPS <= e["ts"] <= s1 + EPS for s0, s1, _ in slices.get((e["pid"], e["tid"]), []))

    def next_slice(e):
        return any(s0 + EPS >= e["ts"] for s0, _, _ in slices.get((e["pid"], e["tid"]), []))

    for (cat, fid), lst in flows.items():
        phs = [e["ph"] for _, e in lst]
        if phs.count("s") != 1 or phs.count("f") != 1:
            errs.append("flow cat=%s id=%s: %d start(s), %d finish(es) (wanted one of each)"
                        % (cat, fid, phs.count("s"), phs.count("f")))
            continue
        s = next(e for _, e in lst if e["ph"] == "s")
        f = next(e for _, e in lst if e["ph"] == "f")
        if s["ts"] > f["ts"] + EPS:
            errs.append("flow cat=%s id=%s: starts at %s after it ends at %s"
                        % (cat, fid, s["ts"], f["ts"]))
        if cat is None:
            errs.append("flow id=%s: no cat (a flow is matched by cat and id)" % fid)
        # s binds to the enclosing slice; f too with bp "e", else to the
        # next slice that begins on its track
        for e in (s, f):
            if e["ph"] == "f" and e.get("bp") != "e":
                if not next_slice(e):
                    errs.append("flow cat=%s id=%s: its f at %s (binding: next slice) has no "
                                "slice after it on its track" % (cat, fid, e["ts"]))
            elif not inside(e):
                errs.append("flow cat=%s id=%s: its %s at %s is in no slice of its track"
                            % (cat, fid, e["ph"], e["ts"]))
    return errs


def main():
    with open(sys.argv[1], encoding="utf-8") as fh:
        doc = json.load(fh)
    errs = errors(doc)
    for e in errs[:50]:
        print(e)
    if errs:
        print("%d problem(s)" % len(errs))
        return 1
    print("valid: %d events" % len(doc["traceEvents"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
