"""Fuzzing throughput of the real engine against the model scenario, measured side by side.

    python bench/bench_fuzz_sglang.py [--budget 120] [--fresh-budget 120] [--model-budget 20]
                                      [--seed 31] [--quick]

One process, one run after the other, each from a cold (in-memory) example database:

1. `racecheck fuzz eagle-v2` as shipped for `--model-budget` seconds: the model scenario's
   examples per second;
2. `racecheck fuzz sglang-eagle-v2` as shipped for `--budget` seconds, examples as stretches of
   open engines (one engine, many schedules: racecheck/drivers/fuzz/engines.py): the real
   engine's examples per second, request schedules per second, and the time split (engine
   construction, stretch, the stretch's end, waiting for the reference);
3. the same for `--fresh-budget` seconds with a fresh engine per example (what every example
   cost before engines were reused; 0 skips it);
4. the ratios to the model's rate, the issue's target being 1/10;
5. `--drop-sync` of the verify plan-stream wait (graphs on): seconds until the fuzzer finds the
   race (the target: under 60 s), from a cold database (sim only: dropping sites is sim's).

`--device cuda` runs 1-3 on a GPU: engines in new interpreters (a process that initialized
CUDA cannot fork), the reference engine on the GPU uninstrumented, as a fresh run's is there.

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

# the checkout last: an installed racecheck (a GPU machine's) comes first
sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def fuzz(scenario: str, budget: float, seed: int, fixed=None, first_only=False,
         reuse=True, device: str = "sim") -> dict:
    from racecheck.drivers.fuzz import FuzzTarget, Fuzzer, open_database
    target = FuzzTarget(scenario, fixed=fixed, device=device)
    with tempfile.TemporaryDirectory() as tmp:
        db = open_database(os.path.join(tmp, "db"))
        t0 = time.monotonic()
        rep = Fuzzer(target, database=db, findings_dir=os.path.join(tmp, "repros"),
                     budget_s=budget, seed=seed, first_only=first_only,
                     reuse_engines=reuse).run()
        wall = time.monotonic() - t0
    found = {k: f.seconds_to_find for k, f in rep.failures.items()}
    engines = {k: f.outcome.engine for k, f in rep.failures.items()}
    return {"scenario": scenario, "examples": rep.examples, "wall": wall,
            "per_s": rep.examples / wall if wall else 0.0, "found": found,
            "engines": rep.engines, "found_on": engines}


def split(real: dict) -> str:
    """Mean seconds per engine construction and per stretch, from the pool's counts."""
    e = real.get("engines") or {}
    if not e.get("stretches"):
        return "no stretch ran"
    sec, n = e["seconds"], e["stretches"]
    built = e["engines_built"]
    return (f"{built} engines built for {n} stretches ({e['references_built']} reference engines,"
            f" {e['retired']} closed after a failure); per construction "
            f"{sec['construction'] / max(built, 1):.1f}s, per stretch {sec['stretch'] / n:.1f}s "
            f"(the online checker included), its end (synchronize, flush_cache, findings) "
            f"{sec['end'] / n:.2f}s, waiting for the reference {sec['reference_wait'] / n:.1f}s,"
            f" the parent's comparison {sec['parent'] / n:.3f}s; confirmations on a fresh engine:"
            f" {e.get('confirmations')}")


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
    ap.add_argument("--fresh-budget", type=float, default=120.0,
                    help="seconds of real-engine fuzzing with a fresh engine per example (0: skip)")
    ap.add_argument("--model-budget", type=float, default=20.0)
    ap.add_argument("--drop-budget", type=float, default=180.0)
    ap.add_argument("--seed", type=int, default=31)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--device", default="sim", choices=("sim", "cuda"),
                    help="where the examples run (cuda: a GPU, the reference on it uninstrumented)")
    ap.add_argument("--json", metavar="FILE")
    args = ap.parse_args(argv)
    os.environ.setdefault("RACECHECK_LAUNCH_RECORDS", "off")   # no records of earlier runs
    import importlib.util
    if importlib.util.find_spec("sglang") is None:
        print("bench_fuzz_sglang: sglang is not installed; skipped")
        return 0
    if args.quick:
        args.budget, args.model_budget, args.drop_budget = 15.0, 3.0, 15.0
        args.fresh_budget = min(args.fresh_budget, 15.0)

    from racecheck import scenarios
    from racecheck.scenarios import fresh
    from racecheck.scenarios.sglang import SITE_VERIFY_PLAN_WAIT
    t0 = time.monotonic()
    fresh.warm(scenarios.get("sglang-eagle-v2"))
    warming = time.monotonic() - t0

    dev = args.device
    model = fuzz("eagle-v2", args.model_budget, args.seed, device=dev)
    real = fuzz("sglang-eagle-v2", args.budget, args.seed, device=dev)
    before = fuzz("sglang-eagle-v2", args.fresh_budget, args.seed, reuse=False, device=dev) \
        if args.fresh_budget > 0 else None
    per_example = phases_per_example("sglang-eagle-v2", args.seed)
    # dropping a synchronization site is a sim run's (a GPU run keeps the engine's own)
    drop = fuzz("sglang-eagle-v2", args.drop_budget, args.seed,
                fixed={"graphs": "on", "drop_sync": SITE_VERIFY_PLAN_WAIT},
                first_only=True) if dev == "sim" else None
    first = min(drop["found"].values()) if drop and drop["found"] else None

    ratio = real["per_s"] / model["per_s"] if model["per_s"] else 0.0
    print(f"device: {dev}")
    print(f"warming the process (sglang's dependencies, once): {warming:.1f}s")
    print(f"eagle-v2 (model), as shipped: {model['examples']} examples in {model['wall']:.1f}s = "
          f"{model['per_s']:.2f}/s")
    print(f"sglang-eagle-v2, as shipped, engines reused: {real['examples']} examples in "
          f"{real['wall']:.1f}s = {real['per_s']:.3f}/s (about {per_example:.2f} request schedules"
          f" per example: {real['per_s'] * per_example:.3f} schedules/s); failures: "
          f"{sorted(real['found']) or 'none'}")
    print(f"  time split: {split(real)}")
    if before is not None:
        print(f"sglang-eagle-v2, as shipped, a fresh engine per example: {before['examples']} "
              f"examples in {before['wall']:.1f}s = {before['per_s']:.3f}/s; failures: "
              f"{sorted(before['found']) or 'none'}")
    print(f"ratio real/model: 1/{1 / ratio:.1f}" if ratio else "ratio real/model: no examples")
    if before is not None and before["per_s"] and model["per_s"]:
        print(f"ratio real/model with a fresh engine per example: "
              f"1/{model['per_s'] / before['per_s']:.0f}; reuse speed-up "
              f"{real['per_s'] / before['per_s']:.1f}x")
    if drop is None:
        print("verify plan-stream wait dropped: a sim search (dropping sites is sim's)")
    else:
        print("verify plan-stream wait dropped (graphs on): " +
              (f"found after {first:.1f}s ({sorted(drop['found'])[0]}; "
               f"{next(iter(drop['found_on'].values()), '')})" if first is not None
               else f"not found in {drop['wall']:.0f}s ({drop['examples']} examples)"))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"device": dev, "warming": warming, "model": model, "real": real,
                       "fresh": before, "ratio": ratio,
                       "phases_per_example": per_example, "drop": drop}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
