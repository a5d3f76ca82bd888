"""Time and examples to first detection of every fix-off variant, from a cold database.

    python bench/bench_fuzz.py                 # every variant of eagle-v2, 5 seeds, 10 s budget each
    python bench/bench_fuzz.py --quick         # 2 seeds (CI)
    python bench/bench_fuzz.py --variant no-futuremap_publish --seeds 10 --json out.json

For each (variant, seed) the fuzzer starts from an empty example database and runs until one of
the variant's expected failures (its `expected` (rule, tensor) pairs) is found *and* shrunk and
saved as a repro record, or the budget runs out. Reported per variant (medians over seeds):
time to first detection, examples to first detection, time until the shrunk repro was written,
and the shrunk example's size (iterations, requests). Each saved repro is then replayed
`--replays` times (default 10) to check that it reproduces every time. Runs happen in one
warm process (the first run of a process pays about 2 s of imports and first-session set-up,
measured separately and printed as "start-up").
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def _requests(schedule: str) -> int:
    n = 0
    for part in str(schedule).split(";"):
        if ":+" in part:
            n += int(part.split(":+")[1].split("x")[0])
    return n


def run_one(scenario, variant, seed, budget, replays):
    from racecheck import scenarios
    from racecheck.drivers.fuzz import FuzzTarget, Fuzzer, load_record, open_database, replay
    from racecheck.drivers.fuzz.keys import expected_key
    sc = scenarios.get(scenario)
    wanted = {expected_key(r, t) for r, t in sc.variant(variant).expected}
    target = FuzzTarget(scenario, variant)
    with tempfile.TemporaryDirectory() as tmp:
        db = open_database(os.path.join(tmp, "db"))           # cold database
        t0 = time.monotonic()
        rep = Fuzzer(target, database=db, findings_dir=os.path.join(tmp, "repros"), budget_s=budget,
                     seed=seed, stop_when=wanted).run()
        wall = time.monotonic() - t0
        hit = [rep.failures[k] for k in wanted if k in rep.failures]
        if not hit:
            return {"variant": variant, "seed": seed, "found": False, "wall": wall, "examples": rep.examples}
        ff = min(hit, key=lambda f: f.seconds_to_repro)
        cfg = ff.example["config"]
        rec = load_record(ff.path)
        ok = sum(replay(rec).reproduced for _ in range(replays))
        return {"variant": variant, "seed": seed, "found": True, "key": ff.key,
                "detect_s": ff.seconds_to_find, "examples": ff.examples_to_find,
                "repro_s": ff.seconds_to_repro, "wall": wall,
                "iterations": cfg.get("iterations"), "requests": _requests(cfg.get("schedule", "")),
                "schedule": cfg.get("schedule"), "plan": ff.example.get("plan"),
                "replays": f"{ok}/{replays}"}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenario", default="eagle-v2")
    ap.add_argument("--variant", action="append", default=[], help="only these variants (repeatable)")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--budget", type=float, default=10.0, help="seconds per run (the target: 10)")
    ap.add_argument("--replays", type=int, default=10)
    ap.add_argument("--quick", action="store_true", help="2 seeds, 3 replays (CI)")
    ap.add_argument("--json", metavar="FILE", help="also write the raw results as JSON")
    args = ap.parse_args(argv)
    if args.quick:
        args.seeds, args.replays = 2, 3

    t0 = time.monotonic()
    from racecheck import scenarios
    sc = scenarios.get(args.scenario)
    variants = args.variant or list(sc.variants)
    # start-up: imports + a first session (paid once per process; the CLI pays it too)
    from racecheck.drivers.fuzz import FuzzTarget
    FuzzTarget(args.scenario).run({"config": {"iterations": 1, "schedule": "0:+1"}, "seed": 0, "plan": {}})
    startup = time.monotonic() - t0

    from rich.console import Console
    from rich.table import Table
    con = Console(width=max(140, Console().width))
    results = []
    for v in variants:
        for seed in range(args.seeds):
            r = run_one(args.scenario, v, seed, args.budget, args.replays)
            results.append(r)
            con.print(f"  {v} seed {seed}: " + (f"{r['key']} after {r['examples']} examples, "
                                                 f"{r['detect_s']:.2f}s; shrunk repro at {r['repro_s']:.2f}s "
                                                 f"(iterations={r['iterations']}, requests={r['requests']}), "
                                                 f"replays {r['replays']}" if r["found"]
                                                 else f"NOT FOUND in {r['wall']:.1f}s ({r['examples']} examples)"),
                      markup=False, soft_wrap=True)

    table = Table(title=f"racecheck fuzz {args.scenario}: first detection from a cold database "
                        f"({args.seeds} seeds, budget {args.budget:g}s, start-up {startup:.1f}s not included)")
    for col in ("variant", "found", "median detect s", "median examples", "median shrunk repro s",
                "max shrunk repro s", "shrunk iterations/requests", "replays"):
        table.add_column(col)
    for v in variants:
        rs = [r for r in results if r["variant"] == v]
        found = [r for r in rs if r["found"]]
        if not found:
            table.add_row(v, f"0/{len(rs)}", "-", "-", "-", "-", "-", "-")
            continue
        sizes = sorted({(r["iterations"], r["requests"]) for r in found})
        table.add_row(v, f"{len(found)}/{len(rs)}",
                      f"{statistics.median(r['detect_s'] for r in found):.2f}",
                      f"{statistics.median(r['examples'] for r in found):g}",
                      f"{statistics.median(r['repro_s'] for r in found):.2f}",
                      f"{max(r['repro_s'] for r in found):.2f}",
                      ", ".join(f"{i}/{n}" for i, n in sizes),
                      ", ".join(sorted({r["replays"] for r in found})))
    con.print(table)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"startup_s": startup, "budget_s": args.budget, "results": results}, fh, indent=2)
    missed = [r for r in results if not r["found"]]
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
