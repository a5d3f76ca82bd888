"""Does the missing WAR edge corrupt shared-prefix KV on a GPU? (docs/FINDINGS.md)

    python3 bench/gpu_prefix_reuse.py --bundle BUNDLE --out OUT [--runs N] [--delay-us US]

The `sglang-eagle-v2` workload of the `rocm-prefix-reuse` variant (a short request ends on a
stop token and rides one more forward; a long request with a 12-token cached prefix takes its
req_to_token row at once; a later request shares that prefix), run N times uninstrumented per
configuration, with the forward stream held back by a sleep kernel before each run_batch:

    control           cuda branches, WAR barrier on (upstream's CUDA build)
    barrier off       cuda branches, `_apply_war_barrier` a no-op
    rocm branches     hip flavour (upstream's ROCm build: no barrier unless SGLANG_ENABLE_WAR_BARRIER)
    rocm + env fix    hip flavour with the barrier on (SGLANG_ENABLE_WAR_BARRIER=1)
    barrier off, no delay

Per run: whether the KV oracles saw writes in the shared prefix's slots (`prefix_overwrites`),
corrupted cached KV (`radix_kv`), and whether any request's tokens differ from the control's
first run without delay. One racecheck `cuda` run of the rocm configuration checks that the
detector names the race on the GPU too. BUNDLE is as for bench/gpu_sglang.py. Writes
OUT/gpu_prefix_reuse.json and prints a table.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

CONFIGS = [
    ("control (cuda, barrier on)", {"flavour": "cuda"}, True),
    ("barrier off (cuda branches)", {"flavour": "cuda", "war_barrier": "off"}, True),
    ("rocm branches (no barrier)", {"flavour": "hip"}, True),
    ("rocm + SGLANG_ENABLE_WAR_BARRIER", {"flavour": "hip", "war_barrier": "on"}, True),
    ("barrier off, no delay", {"flavour": "cuda", "war_barrier": "off"}, False),
]


def child(runs: int, delay_us: int, graphs: bool) -> dict:
    import torch

    from racecheck import scenarios
    from racecheck.scenarios.sglang import PREFIX_REUSE

    sc = scenarios.get("sglang-eagle-v2")
    base = dict(PREFIX_REUSE, graphs=graphs)
    t0 = time.perf_counter()
    reference = scenarios.run_plain(sc, sc.config(overrides=dict(base, flavour="cuda")),
                                    device="cuda")
    torch.cuda.synchronize()
    out = {"delay_us": delay_us, "runs": runs, "graphs": graphs,
           "reference": reference, "first_run_s": time.perf_counter() - t0,
           "gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "configs": []}
    for name, sets, delayed in CONFIGS:
        cfg = sc.config(overrides=dict(base, forward_delay_us=delay_us if delayed else 0, **sets))
        row = {"name": name, "set": dict(sets, forward_delay_us=cfg["forward_delay_us"]),
               "overwritten": 0, "corrupted": 0, "tokens_differ": 0, "examples": []}
        try:
            t0 = time.perf_counter()
            for _ in range(runs):
                got = scenarios.run_plain(sc, cfg, device="cuda")
                hit = bool(got["prefix_overwrites"])
                bad = bool(got["radix_kv"]["mismatched_slots"])
                differ = got["output_ids"] != reference["output_ids"]
                row["overwritten"] += hit
                row["corrupted"] += bad
                row["tokens_differ"] += differ
                if (hit or bad or differ) and len(row["examples"]) < 2:
                    row["examples"].append({k: got[k] for k in ("output_ids", "prefix_overwrites",
                                                                "radix_kv")})
            row["seconds_per_run"] = (time.perf_counter() - t0) / runs
        except Exception as exc:
            import traceback
            row["error"] = f"{type(exc).__name__}: {exc}"
            row["traceback"] = traceback.format_exc()[-3000:]
        out["configs"].append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "examples"}), flush=True)
    try:
        res = scenarios.run(sc, sc.config(overrides=dict(base, flavour="hip")), device="cuda")
        out["racecheck_rocm"] = {"findings": sorted({(f.rule, f.tensor) for f in res.findings}),
                                 "internal_errors": [e.splitlines()[0] for e in res.internal_errors],
                                 "seconds": res.seconds}
    except Exception as exc:
        out["racecheck_rocm"] = {"error": f"{type(exc).__name__}: {exc}"}
    print(json.dumps(out["racecheck_rocm"]), flush=True)
    return out


def table(data: dict) -> str:
    lines = [f"{data['gpu']}, torch {data['torch']}, {data['runs']} runs per configuration, "
             f"forward held {data['delay_us']} us before each run_batch, graphs "
             f"{'on' if data['graphs'] else 'off'}",
             "| configuration | prefix KV written | cached KV corrupted | tokens differ | s/run |",
             "| --- | --- | --- | --- | --- |"]
    for r in data["configs"]:
        if "error" in r:
            lines.append(f"| {r['name']} | error: {r['error']} | | | |")
            continue
        n = data["runs"]
        lines.append(f"| {r['name']} | {r['overwritten']}/{n} | {r['corrupted']}/{n} | "
                     f"{r['tokens_differ']}/{n} | {r['seconds_per_run']:.2f} |")
    lines.append(f"racecheck cuda, rocm branches: {data.get('racecheck_rocm')}")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bundle", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--delay-us", type=int, default=20_000)
    ap.add_argument("--graphs", action="store_true", help="decode graphs on (slower: capture)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    path = os.path.join(args.out, "gpu_prefix_reuse.json")
    if args.child:
        data = child(args.runs, args.delay_us, args.graphs)
        with open(path, "w") as fh:
            json.dump(data, fh, indent=1)
        print(table(data))
        return 0
    from gpu_sglang import child_env, install
    site = install(args.bundle)
    os.makedirs(args.out, exist_ok=True)
    env = child_env(site)                          # keeps the racecheck this process was given
    cmd = [sys.executable, os.path.abspath(__file__), "--child", "--bundle", args.bundle,
           "--out", args.out, "--runs", str(args.runs), "--delay-us", str(args.delay_us)]
    return subprocess.run(cmd + (["--graphs"] if args.graphs else []), env=env).returncode


if __name__ == "__main__":
    sys.exit(main())
