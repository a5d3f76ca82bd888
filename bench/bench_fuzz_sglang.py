"""Fuzzing throughput of the real engine against the model scenario, measured side by side.

    python bench/bench_fuzz_sglang.py [--budget 120] [--model-budget 20] [--seed 31] [--quick]

One process, one run after the other, each from a cold (in-memory) example database:

1. `racecheck fuzz eagle-v2` as shipped for `--model-budget` seconds: the model scenario's
   examples per second;
2. `racecheck fuzz sglang-eagle-v2` as shipped for `--budget` seconds: the real engine's examples
   per second, and request schedules (traffic phases) per second, one engine per example;
3. the ratio of the two, the issue's target being 1/10;
4. `--drop-sync` of the verify plan-stream wait (graphs on): seconds until the fuzzer finds the
   race (the target: under 60 s), from a cold database.

Before the timed runs the process is warmed as the CLI's would be after its first example
(sglang's dependencies imported once: scenarios/fresh.py), and that time is printed apart.
`--quick` (CI) shortens every budget; it asserts nothing.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def fuzz(scenario: str, budget: float, seed: int, fixed=None, first_only=False) -> dict:
    from racecheck.drivers.fuzz import FuzzTarget, Fuzzer, open_database
    target = FuzzTarget(scenario, fixed=fixed)
    with tempfile.TemporaryDirectory() as tmp:
        db = open_database(os.path.join(tmp, "db"))
        t0 = time.monotonic()
        rep = Fuzzer(target, database=db, findings_dir=os.path.join(tmp, "repros"),
                     budget_s=budget, seed=seed, first_only=first_only).run()
        wall = time.monotonic() - t0
    found = {k: f.seconds_to_find for k, f in rep.failures.items()}
    return {"scenario": scenario, "examples": rep.examples, "wall": wall,
            "per_s": rep.examples / wall if wall else 0.0, "found": found}


def phases_per_example(scenario: str, seed: int, n: int = 200) -> float:
    """Mean traffic phases of the strategy's examples (what one engine construction serves)."""
    from hypothesis import HealthCheck, given, settings

    from racecheck import scenarios
    from racecheck.drivers.fuzz import strategies
    from racecheck.scenarios.sglang.requests import parse_arrivals, phases
    sc = scenarios.get(scenario)
    counts = []

    @settings(max_examples=n, database=None, derandomize=True, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(ex=strategies.examples(sc))
    def draw(ex):
        cfg = sc.config(overrides=ex["config"])
        counts.append(len(phases(parse_arrivals(cfg["arrivals"]))))
    draw()
    return sum(counts) / len(counts)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", type=float, default=120.0, help="seconds of real-engine fuzzing")
    ap.add_argument("--model-budget", type=float, default=20.0)
    ap.add_argument("--drop-budget", type=float, default=180.0)
    ap.add_argument("--seed", type=int, default=31)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", metavar="FILE")
    args = ap.parse_args(argv)
    import importlib.util
    if importlib.util.find_spec("sglang") is None:
        print("bench_fuzz_sglang: sglang is not installed; skipped")
        return 0
    if args.quick:
        args.budget, args.model_budget, args.drop_budget = 15.0, 3.0, 15.0

    from racecheck import scenarios
    from racecheck.scenarios import fresh
    from racecheck.scenarios.sglang import SITE_VERIFY_PLAN_WAIT
    t0 = time.monotonic()
    fresh.warm(scenarios.get("sglang-eagle-v2"))
    warming = time.monotonic() - t0

    model = fuzz("eagle-v2", args.model_budget, args.seed)
    real = fuzz("sglang-eagle-v2", args.budget, args.seed)
    per_example = phases_per_example("sglang-eagle-v2", args.seed)
    drop = fuzz("sglang-eagle-v2", args.drop_budget, args.seed,
                fixed={"graphs": "on", "drop_sync": SITE_VERIFY_PLAN_WAIT}, first_only=True)
    first = min(drop["found"].values()) if drop["found"] else None

    ratio = real["per_s"] / model["per_s"] if model["per_s"] else 0.0
    print(f"warming the process (sglang's dependencies, once): {warming:.1f}s")
    print(f"eagle-v2 (model), as shipped: {model['examples']} examples in {model['wall']:.1f}s = "
          f"{model['per_s']:.2f}/s")
    print(f"sglang-eagle-v2, as shipped: {real['examples']} examples in {real['wall']:.1f}s = "
          f"{real['per_s']:.3f}/s (about {per_example:.2f} request schedules per example: "
          f"{real['per_s'] * per_example:.3f} schedules/s); failures: "
          f"{sorted(real['found']) or 'none'}")
    print(f"ratio real/model: 1/{1 / ratio:.0f}" if ratio else "ratio real/model: no examples")
    print("verify plan-stream wait dropped (graphs on): " +
          (f"found after {first:.1f}s ({sorted(drop['found'])[0]})" if first is not None
           else f"not found in {drop['wall']:.0f}s ({drop['examples']} examples)"))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"warming": warming, "model": model, "real": real, "ratio": ratio,
                       "phases_per_example": per_example, "drop": drop}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
