"""Does the missing WAR edge corrupt shared-prefix requests on a GPU? (docs/FINDINGS.md)

    python3 bench/gpu_prefix_reuse.py --bundle BUNDLE --out OUT [--runs N] [--delay-us US]
    python3 bench/gpu_prefix_reuse.py --dry ...              # print the plan, run nothing

The front door (sglang's own scheduler and event loop) on the `rocm-prefix-reuse` workload (a
request finishes and its req_to_token row goes to a request with a 12-token cached prefix while
the forward launched before may still read the row; later requests share that prefix), run N
times without racecheck per configuration, the forward stream held back by a sleep kernel before
each `run_batch` (`forward_delay_us`: the window a long forward opens):

    control               sglang-eagle-v2, cuda branches: the WAR barrier after every forward
    rocm branches         the hip flavour as shipped: no barrier
    rocm + env switch     the hip flavour with SGLANG_ENABLE_WAR_BARRIER=1
    rocm, no delay        the hip flavour, forward not held
    overlap control/rocm  sglang-overlap (no speculative decoding), the same workload

Per run: whether any request's tokens differ from the control's undelayed run. Then racecheck
`cuda` runs: the rocm branches as shipped, and the cuda branches with the barrier's wait dropped
(`drop_sync`, the `no-war_barrier` variant) and the forward held: findings and wrong values.
Every run is one engine process (bench/gpu_sglang.py's `Runner`). BUNDLE is as for
bench/gpu_sglang.py. Writes OUT/gpu_prefix_reuse.json and prints a table.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

PREFIX_ARRIVALS = "0:1x6+14;3:1x8+3;8:1x4+14;12:1x4+14"     # scenarios/sglang PREFIX_REUSE
EAGLE = {"topk": 1, "prefix_len": 12, "arrivals": PREFIX_ARRIVALS}
OVERLAP = {"prefix_len": 12, "arrivals": PREFIX_ARRIVALS}

# (name, scenario, knob settings, forward held?)
CONFIGS = [
    ("control (cuda, barrier on)", "sglang-eagle-v2", {"flavour": "cuda"}, True),
    ("rocm branches (no barrier)", "sglang-eagle-v2", {"flavour": "hip"}, True),
    ("rocm + SGLANG_ENABLE_WAR_BARRIER", "sglang-eagle-v2", {"flavour": "hip", "war_barrier": "on"},
     True),
    ("rocm branches, no delay", "sglang-eagle-v2", {"flavour": "hip"}, False),
    ("overlap control (cuda)", "sglang-overlap", {"flavour": "cuda"}, True),
    ("overlap rocm branches", "sglang-overlap", {"flavour": "hip"}, True),
]
# racecheck `cuda` runs: (name, scenario, settings, forward held?)
CHECKED = [
    ("racecheck: rocm branches", "sglang-eagle-v2", {"flavour": "hip"}, False),
    ("racecheck: overlap, rocm branches", "sglang-overlap", {"flavour": "hip"}, False),
]


def _base(scenario: str, graphs: bool) -> dict:
    return dict(EAGLE if scenario == "sglang-eagle-v2" else OVERLAP, graphs=graphs)


def plan(runs: int, delay_us: int, graphs: bool, only: str | None = None) -> list:
    """[(kind, name, spec)] in run order: the references first, then N runs per configuration,
    then the racecheck runs (`only`: the configurations whose name has it)."""
    configs = [c for c in CONFIGS if only is None or only in c[0]]
    checked = [c for c in CHECKED if only is None or only in c[0]]
    needed = {c[1] for c in configs + checked}
    out = [("reference", sc, {"scenario": sc, "mode": "plain",
                              "set": dict(_base(sc, graphs), flavour="cuda")})
           for sc in ("sglang-eagle-v2", "sglang-overlap") if sc in needed]
    for name, sc, sets, held in configs:
        spec = {"scenario": sc, "mode": "plain",
                "set": dict(_base(sc, graphs), forward_delay_us=delay_us if held else 0, **sets)}
        out.extend(("plain", name, spec) for _ in range(runs))
    for name, sc, sets, held in checked:
        out.append(("racecheck", name, {"scenario": sc, "mode": "racecheck", "set": dict(
            _base(sc, graphs), forward_delay_us=delay_us if held else 0, **sets)}))
    return out


def table(data: dict) -> str:
    lines = [f"{data['gpu']}, torch {data['torch']}, {data['runs']} runs per configuration, "
             f"forward held {data['delay_us']} us before each run_batch, graphs "
             f"{'on' if data['graphs'] else 'off'}, runs by {data['how']}",
             "| configuration | tokens differ | errors | s/run |", "| --- | --- | --- | --- |"]
    for r in data["configs"]:
        lines.append(f"| {r['name']} | {r['differ']}/{r['n']} | {r['errors'][:1]} | "
                     f"{r.get('seconds_per_run') or 0:.2f} |")
    for r in data["checked"]:
        lines.append(f"| {r['name']} | outputs differ: {r.get('differ')} | findings "
                     f"{r.get('findings')} known {r.get('known')} {r.get('error', '')} | "
                     f"{r.get('run_s') or 0:.2f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bundle", default=None)
    ap.add_argument("--out", default=".")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--delay-us", type=int, default=20_000)
    ap.add_argument("--graphs", action="store_true", help="decode graphs on (slower: capture)")
    ap.add_argument("--device", default="cuda", choices=("cuda", "sim"))
    ap.add_argument("--no-fork", action="store_true")
    ap.add_argument("--dry", action="store_true")
    ap.add_argument("--only", default=None, help="configurations whose name has this")
    args = ap.parse_args(argv)
    steps = plan(args.runs, args.delay_us, args.graphs, args.only)
    if args.dry:
        for kind, name, spec in steps:
            print(f"{kind} {name}: {json.dumps(spec)}")
        return 0
    from gpu_sglang import _PARENT, Runner, install
    site = install(args.bundle) if args.bundle else None
    runner = Runner(args.device, site, fork=not args.no_fork)   # keeps the racecheck it was given
    import torch
    data = {"delay_us": args.delay_us, "runs": args.runs, "graphs": args.graphs,
            "how": runner.how, "parent": _PARENT, "torch": torch.__version__, "configs": [],
            "checked": [],
            "gpu": torch.cuda.get_device_name() if args.device == "cuda" else "sim"}
    refs, rows = {}, {}
    for kind, name, spec in steps:
        got = runner.run(spec)
        brief = {k: got.get(k) for k in ("run_s", "findings", "error") if k in got}
        if kind != "reference":
            brief["differ"] = got.get("outputs") != refs.get(spec["scenario"])
        print(f"@@ {kind} {name} {json.dumps(brief)[:400]}", flush=True)
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "gpu_prefix_reuse.json"), "w") as fh:   # so far
            json.dump(dict(data, rows=rows, references=refs), fh, default=str)
        if kind == "reference":
            refs[name] = got.get("outputs")
            data.setdefault("references", {})[name] = got.get("outputs") or got.get("error")
            continue
        ref = refs.get(spec["scenario"])
        if kind == "plain":
            row = rows.setdefault(name, {"name": name, "set": spec["set"], "n": 0, "differ": 0,
                                         "errors": [], "examples": [], "seconds": 0.0})
            if "error" in got:
                row["errors"].append(got["error"])
                continue
            row["n"] += 1
            row["seconds"] += got["run_s"]
            if got["outputs"] != ref:
                row["differ"] += 1
                if len(row["examples"]) < 2:
                    row["examples"].append(got["outputs"])
        else:
            data["checked"].append({"name": name, "set": spec["set"],
                                    "differ": None if "error" in got else got["outputs"] != ref,
                                    **{k: got.get(k) for k in ("findings", "known", "run_s",
                                                               "internal_errors", "error",
                                                               "details")}})
    for row in rows.values():
        if row["n"]:
            row["seconds_per_run"] = row.pop("seconds") / row["n"]
        data["configs"].append(row)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "gpu_prefix_reuse.json"), "w") as fh:
        json.dump(data, fh, indent=1, default=str)
    print(table(data))
    return 0


if __name__ == "__main__":
    sys.exit(main())
