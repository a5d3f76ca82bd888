"""Snapshot every verdict racecheck gives on its fixed workloads, to prove a refactor changes none.

    python scripts/verdicts.py snapshot before.json      # on the old tree
    python scripts/verdicts.py snapshot after.json       # on the new tree
    python scripts/verdicts.py compare before.json after.json
    python scripts/verdicts.py snapshot --gc-off out.json   # cyclic garbage collection off

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

import contextlib
import gc
import json
import os
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


def _scenarios() -> dict:
    from racecheck import scenarios
    from racecheck.instrumentation.adversarial import AdversarialExecutor

    out = {}
    for name in scenarios.names():
        sc = scenarios.get(name)
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


def snapshot(path: str) -> None:
    data = {**_cases(), **_scenarios()}
    with open(path, "w") as fp:
        json.dump(data, fp, indent=1, sort_keys=True)
    print(f"{len(data)} workloads, {sum(len(v) for v in data.values())} findings -> {path}")


def compare(a: str, b: str) -> int:
    with open(a) as fp:
        old = json.load(fp)
    with open(b) as fp:
        new = json.load(fp)
    bad = 0
    for key in sorted(set(old) | set(new)):
        if old.get(key) != new.get(key):
            bad += 1
            print(f"DIFFERENT: {key}")
    print(f"{len(old)} vs {len(new)} workloads; {bad} differ")
    return 1 if bad else 0


if __name__ == "__main__":
    if "--gc-off" in sys.argv:
        sys.argv.remove("--gc-off")
        GC_OFF = True
    if len(sys.argv) == 3 and sys.argv[1] == "snapshot":
        snapshot(sys.argv[2])
    elif len(sys.argv) == 4 and sys.argv[1] == "compare":
        sys.exit(compare(sys.argv[2], sys.argv[3]))
    else:
        sys.exit(__doc__)
