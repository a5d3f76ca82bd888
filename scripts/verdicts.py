"""Snapshot every verdict racecheck gives on its fixed workloads, to prove a refactor changes none.

    python scripts/verdicts.py snapshot before.json      # on the old tree
    python scripts/verdicts.py snapshot after.json       # on the new tree
    python scripts/verdicts.py compare before.json after.json
    python scripts/verdicts.py snapshot --gc-off out.json   # cyclic garbage collection off
    python scripts/verdicts.py snapshot --no-engines out.json   # scenarios that run an installed
                                                                # engine (sglang) left out
    python scripts/verdicts.py compare --loose before.json after.json

`--loose` compares what a change of file layout or of the JSON form leaves alone: line numbers
in locations and stacks, fingerprints (made from locations) and fields only the newer snapshot
has are not compared; rules, tensors, streams, kinds, ops, functions and counts are.

Workloads whose tensors sit in reference cycles (sglang's objects) see those storages die when
Python's cyclic garbage collector runs, which depends on how many objects everything in the
process allocated, racecheck's checker included: a checker that allocates differently moves
those `Free` events, and with them the trace positions findings quote. `--gc-off` keeps the
collector off while each workload runs (and collects after it), so that two versions of the
checker are compared on the same traces.

Workloads: every public case on sim, every variant of every built-in
scenario (eager executor, and the adversarial executor with a fixed plan seed), and each case's
trace saved as JSON lines and re-checked offline. Findings are compared field by field
(Finding.to_json(): rule, tensor, both accesses with stacks, suggestion, detail, context).
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import re
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))


GC_OFF = False


@contextlib.contextmanager
def _workload():
    if not GC_OFF:
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
        gc.collect()


def _findings(fs) -> list:
    return [f.to_json() for f in fs]


def _cases() -> dict:
    import racecheck
    from cases import EXPECTED
    from racecheck.core.fastchecker import new_checker
    from racecheck.core.trace import Trace

    out = {}
    for cid in sorted(EXPECTED):
        program = EXPECTED[cid][0]
        with _workload(), racecheck.session(device="sim", record_trace=True) as rc:
            keep = program(rc.device_module, "cpu")  # noqa: F841
        out[f"sim/{cid}"] = _findings(rc.findings)
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "t.jsonl")
            rc.save_trace(path)
            out[f"offline/{cid}"] = _findings(new_checker().process_all(Trace.iter_file(path)).findings)
    return out


# A fixed adversarial plan: side streams first, the host late, two priority change points.
PLAN = {"priorities": {"#1": 5, "#2": 4, "#3": 3}, "host": 2, "change_points": [15, 60]}


def _scenarios(engines: bool = True) -> dict:
    from racecheck import scenarios
    from racecheck.instrumentation.adversarial import AdversarialExecutor

    out = {}
    for name in scenarios.names():
        sc = scenarios.get(name)
        if not engines and getattr(sc, "engine_version", None) is not None:
            continue
        for variant in [None, *sc.variants]:
            cfg = sc.config(variant=variant)
            label = f"{name}/{variant or 'all-fixes'}"
            with _workload():
                res = scenarios.run(sc, cfg, device="sim", seed=0)
            out[f"eager/{label}"] = _findings(res.findings)
            ex = AdversarialExecutor(PLAN)
            with _workload():
                res = scenarios.run(sc, cfg, device="sim", seed=0, session_options={"executor": ex})
            out[f"adversarial/{label}"] = _findings(res.findings)
    return out


def snapshot(path: str, engines: bool = True) -> None:
    data = {**_cases(), **_scenarios(engines)}
    with open(path, "w") as fp:
        json.dump(data, fp, indent=1, sort_keys=True)
    print(f"{len(data)} workloads, {sum(len(v) for v in data.values())} findings -> {path}")


def _loose(old_finding: dict, new_finding: dict) -> tuple:
    """Both findings as `--loose` compares them: the older one's fields, no fingerprint, no
    line numbers."""
    keys = [k for k in old_finding if k != "fingerprint"]

    def strip(f):
        return json.loads(re.sub(r"\.py:\d+", ".py:N", json.dumps({k: f.get(k) for k in keys})))
    return strip(old_finding), strip(new_finding)


def compare(a: str, b: str, loose: bool = False) -> int:
    with open(a) as fp:
        old = json.load(fp)
    with open(b) as fp:
        new = json.load(fp)
    bad = 0
    for key in sorted(set(old) | set(new)):
        x, y = old.get(key), new.get(key)
        if loose and x is not None and y is not None and len(x) == len(y):
            same = all(p == q for p, q in (_loose(f, g) for f, g in zip(x, y)))
        else:
            same = x == y
        if not same:
            bad += 1
            print(f"DIFFERENT: {key}")
    print(f"{len(old)} vs {len(new)} workloads, {sum(map(len, old.values()))} vs "
          f"{sum(map(len, new.values()))} findings; {bad} differ"
          + (" (loose: line numbers, fingerprints and added fields not compared)" if loose else ""))
    return 1 if bad else 0


def main(argv=None) -> int:
    global GC_OFF
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True)
    snap = sub.add_parser("snapshot", help="write every verdict to a JSON file")
    snap.add_argument("out")
    snap.add_argument("--gc-off", action="store_true", help="cyclic garbage collection off")
    snap.add_argument("--no-engines", action="store_true",
                      help="leave out the scenarios that run an installed engine (sglang)")
    cmp = sub.add_parser("compare", help="compare two snapshots (exit 1 if any workload differs)")
    cmp.add_argument("before")
    cmp.add_argument("after")
    cmp.add_argument("--loose", action="store_true",
                     help="ignore line numbers, fingerprints and fields only the newer one has")
    args = ap.parse_args(argv)
    if args.command == "snapshot":
        GC_OFF = args.gc_off
        snapshot(args.out, engines=not args.no_engines)
        return 0
    return compare(args.before, args.after, args.loose)


if __name__ == "__main__":
    sys.exit(main())
