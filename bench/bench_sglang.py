"""Where a run of the real sglang engine's time goes on a CPU (the front door, `sim`).

    python bench/bench_sglang.py [--scenario sglang-eagle-v2] [--set K=V ...] [--quick] [--naming]
                                 [--whole-run ROUNDS] [--freeze ROUNDS] [--replay ROUNDS]
                                 [--first-run ROUNDS]

Prints, for one configuration: the import of sglang's scheduler (with racecheck's shims), then
one `racecheck run` worth of work in a fresh process per phase split (scheduler construction,
graph capture included; sglang's event loop; the serialized reference run) and how many loop
iterations ran. Phases come from the front door's own clock (`server.TIMINGS`). `--quick` runs
the smallest schedule with graphs off (CI keeps the script working; it asserts nothing).

`--naming` adds, side by side (fresh processes, alternating, 2 rounds each), the loop with the
program's names for unnamed tensors found once per moment of the program (a checker flush)
against a walk of the collector's objects per batch of findings (`instrumentation/names.py`),
with the walks counted and the findings compared.

`--whole-run N` times a whole `racecheck run` (its warm-up, the instrumented run and its
reference side by side) in fresh processes, N rounds alternating: with the run-time cuts of
2026-11-27 (the interpreter's unread overflow checks skipped, names once per moment, the
reference unchecked) against all three off, in the same code. `--freeze N` compares engine
processes that freeze what they inherit (`scenarios/fresh.py`) with processes that do not: the
engine process's split (construction, loop, the collector's time, the objects in its reach),
then whole runs, N rounds each, alternating. `--replay N` does the same for Triton launches
replayed from recorded bytes (`instrumentation/launch_cache.py`), with records in the process's
memory only and with a folder of records an earlier run left (`launch_store.py`; a temporary
one, filled by one untimed run first), against every launch interpreted. Every other figure
is measured without records on disk (`RACECHECK_LAUNCH_RECORDS=off` unless set).

`--first-run N` is what a user sees, timed from the shell (`racecheck run` in a new process,
its own import included), N rounds each from an empty records folder: the machine's first run
(seed 0), runs with other traffic (seeds 1 and 2: the construction's launches replay, the
loop's see new tokens), seed 0 again; then the engine process's construction with graphs on
and off, so the captures are timed apart.

Then, side by side in one process: what importing sglang costs a forked engine process (every
run, instrumented or reference, is one) from a cold parent, and from a parent warmed by
`scenarios/fresh.py` (sglang's dependencies imported once; the child imports sglang itself).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

CHILD = r"""
import gc, json, sys, time
t0 = time.perf_counter()
import racecheck
from racecheck.instrumentation import launch_cache, names, triton_kernels
names.ONE_PASS_PER_MOMENT = len(sys.argv) < 4 or sys.argv[3] == "moment"
triton_kernels.LAUNCHES_REPLAYED = len(sys.argv) < 6 or sys.argv[5] != "interpreted"
from racecheck import scenarios
if len(sys.argv) > 4 and sys.argv[4] == "frozen":     # as a child forked from a warmed parent
    from racecheck.scenarios import fresh
    fresh.begin_engine_process(scenarios.get(sys.argv[1]))
collector = {"passes": 0, "seconds": 0.0}
_began = [0.0]
def _timed(phase, info):
    if phase == "start":
        _began[0] = time.perf_counter()
    else:
        collector["passes"] += 1
        collector["seconds"] += time.perf_counter() - _began[0]
gc.callbacks.append(_timed)
from racecheck.scenarios.sglang import imports, surface
from racecheck.scenarios.sglang.engine_run import _environment, _SIM_ENV, _import_quietly
imports.install()
with _environment(dict(_SIM_ENV)):
    _import_quietly()
t_import = time.perf_counter() - t0
sc = scenarios.get(sys.argv[1])
cfg = sc.config(overrides=json.loads(sys.argv[2]))
from racecheck.scenarios.registry import RunContext
from racecheck.scenarios.sglang import server
t1 = time.perf_counter()
with racecheck.session(device="sim", **sc.session_options(cfg, "sim")) as rc:
    namer = rc.checker.namer
    sc.run_once(cfg, RunContext(rc.device_module, "cpu", rc, pin=True, seed=0))
total = time.perf_counter() - t1
print(json.dumps({"import": t_import, "run": total, **server.TIMINGS,
                  "events": rc.checker.events_processed, "findings": len(rc.findings),
                  "found": sorted(f"{f.rule} {f.tensor}" for f in rc.findings),
                  "walks": getattr(namer, "passes", None), "collector": collector,
                  "objects": len(gc.get_objects()),
                  "launches": {"replayed": launch_cache.CACHE.hits,
                               "interpreted": launch_cache.CACHE.misses + launch_cache.CACHE.skipped}}))
"""


WHOLE = r"""
import sys, time
import racecheck
from racecheck.instrumentation import names, triton_kernels
from racecheck.scenarios import fresh
fresh.FREEZE_INHERITED = sys.argv[1] != "thaw"
triton_kernels.LAUNCHES_REPLAYED = sys.argv[1] != "interpret"    # "replay", "recorded": env
if sys.argv[1] == "off":
    triton_kernels.OVERFLOW_CHECKS_AS_COMPILED = False
    names.ONE_PASS_PER_MOMENT = False
    real = racecheck.session
    def session(*a, **k):
        k.pop("check", None)
        return real(*a, **k)
    racecheck.session = session
from racecheck.cli.main import main
t = time.perf_counter()
code = main(["run", *sys.argv[2:]])
print("@@", time.perf_counter() - t, code)
"""


WARM = r"""
import json, sys, time
from racecheck import scenarios
from racecheck.scenarios import fresh
sc = scenarios.get(sys.argv[1])

def child_import():
    t = time.perf_counter()
    sc.import_engine()
    return time.perf_counter() - t
cold = fresh.call(child_import)
t = time.perf_counter()
fresh.warm(sc)
warm_cost = time.perf_counter() - t
warm = fresh.call(child_import)
print(json.dumps({"cold": cold, "warm": warm, "warming": warm_cost}))
"""


def warm_imports(scenario: str) -> dict:
    p = subprocess.run([sys.executable, "-c", WARM, scenario], capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"bench_sglang: the import measurement failed:\n{p.stderr[-3000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def phase(scenario: str, cfg: dict, naming: str = "moment", inherited: str = "thawed",
          launches: str = "replayed", env: dict | None = None) -> dict:
    p = subprocess.run([sys.executable, "-c", CHILD, scenario, json.dumps(cfg), naming, inherited,
                        launches], capture_output=True, text=True, env=env)
    if p.returncode != 0:
        raise SystemExit(f"bench_sglang: the run failed:\n{p.stderr[-3000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def whole_run(scenario: str, cfg: dict, rounds: int, modes=("off", "on"), envs=None) -> None:
    import statistics
    sets = [a for k, v in cfg.items() for a in ("--set", f"{k}={v}")]
    got = {m: [] for m in modes}
    said = {m: set() for m in modes}
    for r in range(rounds):
        for how in (modes if r % 2 == 0 else modes[::-1]):
            p = subprocess.run([sys.executable, "-c", WHOLE, how, scenario, *sets],
                               capture_output=True, text=True, check=False,
                               env=(envs or {}).get(how))
            line = [ln for ln in p.stdout.splitlines() if ln.startswith("@@")]
            if not line or line[-1].split()[2] != "0":
                raise SystemExit(f"bench_sglang: racecheck run failed:\n{p.stdout[-2000:]}{p.stderr[-2000:]}")
            got[how].append(float(line[-1].split()[1]))
            said[how].add(_verdict(p.stdout))
    shown = " ".join(f"{k}={v}" for k, v in cfg.items()) or "(defaults)"
    med = {m: statistics.median(got[m]) for m in modes}
    label = {"off": "cuts off", "on": "on", "thaw": "children thawed", "freeze": "inherited frozen",
             "interpret": "every launch interpreted",
             "replay": "launches replayed (records in memory)",
             "recorded": "launches replayed (records of an earlier run on disk)"}
    parts = [f"{label[m]} {med[m]:.1f}s {[round(x, 1) for x in got[m]]}"
             + (f" (x{med[modes[0]] / med[m]:.2f})" if i else "") for i, m in enumerate(modes)]
    print(f"racecheck run {scenario} {shown}, {rounds} rounds: {', '.join(parts)}; same report: "
          f"{len(set().union(*said.values())) == 1}")


def freeze_split(scenario: str, cfg: dict, rounds: int) -> None:
    """The engine process's own split, thawed against frozen (alternating fresh processes)."""
    import statistics
    runs = {"thawed": [], "frozen": []}
    for r in range(rounds):
        for how in (("thawed", "frozen") if r % 2 == 0 else ("frozen", "thawed")):
            runs[how].append(phase(scenario, cfg, inherited=how))
    shown = " ".join(f"{k}={v}" for k, v in cfg.items()) or "(defaults)"
    for how, got in runs.items():
        med = {k: statistics.median(x[k] for x in got) for k in ("run", "construction", "loop")}
        gcs = statistics.median(x["collector"]["seconds"] for x in got)
        print(f"engine process {shown}, inherited objects {how}: run {med['run']:.1f}s "
              f"{[round(x['run'], 1) for x in got]} = construction {med['construction']:.1f}s + "
              f"loop {med['loop']:.1f}s; the collector {gcs:.1f}s in "
              f"{got[0]['collector']['passes']} passes; {got[0]['objects']} objects in its reach")
    same = len({json.dumps(x["found"]) for v in runs.values() for x in v}) == 1
    print(f"same findings, frozen or thawed: {same}")


def replay_split(scenario: str, cfg: dict, rounds: int, envs: dict) -> None:
    """The engine process's split with every Triton launch interpreted, against launches on
    recorded bytes replayed (instrumentation/launch_cache.py) from the process's own records,
    and from a folder an earlier run filled (launch_store.py), alternating fresh processes."""
    import statistics
    modes = ("interpreted", "replayed", "recorded")
    runs = {m: [] for m in modes}
    phase(scenario, cfg, inherited="frozen", launches="recorded", env=envs["recorded"])
    for r in range(rounds):
        for how in (modes if r % 2 == 0 else modes[::-1]):
            runs[how].append(phase(scenario, cfg, inherited="frozen", launches=how,
                                   env=envs[how]))
    shown = " ".join(f"{k}={v}" for k, v in cfg.items()) or "(defaults)"
    for how, got in runs.items():
        med = {k: statistics.median(x[k] for x in got) for k in ("run", "construction", "loop")}
        n = got[0]["launches"]
        print(f"engine process {shown}, launches {how}: run {med['run']:.1f}s "
              f"{[round(x['run'], 1) for x in got]} = construction {med['construction']:.1f}s + "
              f"loop {med['loop']:.1f}s; {n['replayed']} launches replayed, "
              f"{n['interpreted']} interpreted")
    same = len({json.dumps([x["found"], x["events"]]) for v in runs.values() for x in v}) == 1
    print(f"same events and findings, replayed or interpreted: {same}")


def replay(scenario: str, cfg: dict, rounds: int) -> None:
    import os
    import tempfile
    from racecheck.instrumentation import launch_store
    with tempfile.TemporaryDirectory(prefix="launch-records-") as folder:
        off = dict(os.environ, **{launch_store.ENV: "off"})
        envs = {"interpreted": off, "replayed": off,
                "recorded": dict(os.environ, **{launch_store.ENV: folder})}
        replay_split(scenario, cfg, rounds, envs)
        whole_run(scenario, cfg, rounds, ("interpret", "replay", "recorded"),
                  {"interpret": off, "replay": off, "recorded": envs["recorded"]})


def first_run(scenario: str, cfg: dict, rounds: int) -> None:
    import os
    import statistics
    import tempfile
    from racecheck.instrumentation import launch_store
    sets = [a for k, v in cfg.items() for a in ("--set", f"{k}={v}")]
    seeds = ("0", "1", "2", "0")
    got = {i: [] for i in range(len(seeds))}
    said = set()
    for _ in range(rounds):
        with tempfile.TemporaryDirectory(prefix="launch-records-") as folder:
            env = dict(os.environ, **{launch_store.ENV: folder})
            for i, seed in enumerate(seeds):
                t = time.perf_counter()
                p = subprocess.run([sys.executable, "-m", "racecheck", "run", scenario,
                                    "--seed", seed, *sets], capture_output=True, text=True,
                                   env=env, check=False)
                got[i].append(time.perf_counter() - t)
                if p.returncode != 0:
                    raise SystemExit(f"bench_sglang: racecheck run failed:\n{p.stdout[-2000:]}"
                                     f"{p.stderr[-2000:]}")
                said.add(_verdict(p.stdout).replace(f"seed {seed}", "seed N"))
    shown = " ".join(f"{k}={v}" for k, v in cfg.items()) or "(defaults)"
    names = ("the machine's first run (seed 0, no records)", "seed 1 after it", "seed 2",
             "seed 0 again")
    print(f"racecheck run {scenario} {shown} from the shell, {rounds} round(s) from an empty "
          "records folder: " + ", ".join(
              f"{n} {statistics.median(got[i]):.1f}s {[round(x, 1) for x in got[i]]}"
              for i, n in enumerate(names)) + f"; same report: {len(said) == 1}")
    split = {}
    for graphs in ("on", "off"):
        split[graphs] = phase(scenario, {**cfg, "graphs": graphs}, inherited="frozen")
    capture = split["on"]["construction"] - split["off"]["construction"]
    print(f"engine process, no records: construction {split['on']['construction']:.1f}s with "
          f"graphs, {split['off']['construction']:.1f}s without (the captures: {capture:.1f}s); "
          f"loop {split['on']['loop']:.1f}s / {split['off']['loop']:.1f}s")


def _verdict(out: str) -> str:
    """A run's report without its timings."""
    import re
    return "\n".join(re.sub(r"\([0-9.]+s\)", "", ln) for ln in out.splitlines()
                     if not ln.startswith("@@"))


def naming(scenario: str, cfg: dict) -> None:
    import statistics
    runs = {"moment": [], "batch": []}
    for r in range(2):
        for how in (("batch", "moment") if r % 2 == 0 else ("moment", "batch")):
            runs[how].append(phase(scenario, cfg, how))
    loop = {k: statistics.median(x["loop"] for x in v) for k, v in runs.items()}
    same = all(a["found"] == b["found"] for a, b in zip(runs["moment"], runs["batch"]))
    print(f"naming unnamed tensors ({' '.join(f'{k}={v}' for k, v in cfg.items())}): a walk per "
          f"batch of findings: loop {loop['batch']:.1f}s, {runs['batch'][0]['walks']} walks; once "
          f"per moment: loop {loop['moment']:.1f}s, {runs['moment'][0]['walks']} walks "
          f"(x{loop['batch'] / loop['moment']:.2f}); same findings: {same}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", default="sglang-eagle-v2")
    ap.add_argument("--set", action="append", default=[], metavar="KNOB=VALUE")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--whole-run", type=int, default=0, metavar="ROUNDS",
                    help="a whole racecheck run with the cuts off and on, alternating")
    ap.add_argument("--freeze", type=int, default=0, metavar="ROUNDS",
                    help="engine processes that freeze what they inherit against not: the "
                    "engine process's split, then whole runs, alternating")
    ap.add_argument("--replay", type=int, default=0, metavar="ROUNDS",
                    help="Triton launches on recorded bytes replayed against every launch "
                    "interpreted: the engine process's split, then whole runs, alternating")
    ap.add_argument("--first-run", type=int, default=0, metavar="ROUNDS",
                    help="from the shell: the machine's first run, runs with other traffic "
                    "after it, the first again; the captures timed apart")
    ap.add_argument("--naming", action="store_true", help="names once per moment against once "
                    "per batch of findings (graphs off unless --set)")
    args = ap.parse_args(argv)
    import importlib.util
    if importlib.util.find_spec("sglang") is None:
        print("bench_sglang: sglang is not installed; skipped")
        return 0
    import os
    os.environ.setdefault("RACECHECK_LAUNCH_RECORDS", "off")   # figures from a cold start
    cfg = dict(item.split("=", 1) for item in args.set)
    if args.quick:
        cfg = {"graphs": "off", "arrivals": "0:1x2", **cfg}
    t0 = time.perf_counter()
    got = phase(args.scenario, cfg)
    wall = time.perf_counter() - t0
    shown = " ".join(f"{k}={v}" for k, v in cfg.items()) or "(defaults)"
    print(f"{args.scenario} {shown}: process {wall:.1f}s = "
          f"import {got['import']:.1f}s + construction {got['construction']:.1f}s (graph capture "
          f"included) + loop {got['loop']:.1f}s ({got['iterations']} iterations, "
          f"{got['events']} events, {got['findings']} findings) + the rest")
    if args.whole_run:
        whole_run(args.scenario, cfg, args.whole_run)
    if args.freeze:
        freeze_split(args.scenario, cfg, args.freeze)
        whole_run(args.scenario, cfg, args.freeze, ("thaw", "freeze"))
    if args.replay:
        replay(args.scenario, cfg, args.replay)
    if args.first_run:
        first_run(args.scenario, cfg, args.first_run)
    if args.naming:
        naming(args.scenario, {"graphs": "off", **cfg})
    w = warm_imports(args.scenario)
    print(f"importing sglang in an engine process: cold parent {w['cold']:.1f}s, warmed parent "
          f"{w['warm']:.1f}s ({w['cold'] / max(w['warm'], 1e-9):.1f}x; warming, once per "
          f"process: {w['warming']:.1f}s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
