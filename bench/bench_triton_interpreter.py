"""Triton's CPU interpreter under racecheck `sim`: builtins scanned once per session
(`instrumentation/triton_kernels.py`, `BUILTINS_ONCE`) against Triton's own scan at every launch
and nested `@triton.jit` call, side by side in one run.

    python bench/bench_triton_interpreter.py [--rounds 5] [--launches 40] [--sglang] [--quick]

Kernel: a small kernel whose programs call a `@triton.jit` helper (as sglang's do), `--launches`
launches per session, sessions alternating between the two settings; the median of the
per-round ratios. `--sglang` adds the real engine (`sglang-eagle-v2`, one short request, graphs
off; sglang installed): one fresh process per run, alternating, sglang's loop time from the
front door's clock, and whether tokens and findings are the same.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import subprocess
import sys
import time

import torch

if importlib.util.find_spec("triton") is not None:
    import triton
    import triton.language as tl

    @triton.jit
    def _shift(x, k):
        return x + k

    @triton.jit
    def add_shifted(src, dst, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        x = tl.load(src + offs, mask=mask)
        tl.store(dst + offs, _shift(x, 1.0), mask=mask)


ENGINE_CHILD = r"""
import json, sys, time
import racecheck
from racecheck import scenarios
from racecheck.instrumentation import triton_kernels
from racecheck.scenarios.registry import RunContext
from racecheck.scenarios.sglang import imports, server
from racecheck.scenarios.sglang.engine_run import _environment, _SIM_ENV, _import_quietly
triton_kernels.BUILTINS_ONCE = sys.argv[1] == "once"
imports.install()
with _environment(dict(_SIM_ENV)):
    _import_quietly()
sc = scenarios.get("sglang-eagle-v2")
cfg = sc.config(overrides={"graphs": False, "arrivals": "0:1x2"})
with racecheck.session(device="sim", **sc.session_options(cfg, "sim")) as rc:
    out = sc.run_once(cfg, RunContext(rc.device_module, "cpu", rc, pin=True, seed=0))
found = sorted(f"{f.rule} {f.tensor}" for f in rc.findings)
print("@@" + json.dumps({"loop": server.TIMINGS.get("loop"), "outputs": repr(out),
                         "findings": found}))
"""


def _session_seconds(once: bool, launches: int) -> float:
    from racecheck.instrumentation import triton_kernels

    import racecheck
    triton_kernels.BUILTINS_ONCE = once
    src = torch.arange(256, dtype=torch.float32)
    dst = torch.empty_like(src)
    with racecheck.session(device="sim"):
        t0 = time.perf_counter()
        for _ in range(launches):
            add_shifted[(8,)](src, dst, 256, BLOCK=32)
        seconds = time.perf_counter() - t0
    assert torch.equal(dst, src + 1)
    return seconds


def _engine(once: bool) -> dict:
    p = subprocess.run([sys.executable, "-c", ENGINE_CHILD, "once" if once else "each"],
                       capture_output=True, text=True, check=False)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("@@")]
    if not lines:
        raise SystemExit(f"engine run failed (exit {p.returncode}): {p.stderr[-2000:]}")
    return json.loads(lines[-1][2:])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--launches", type=int, default=40)
    ap.add_argument("--sglang", action="store_true")
    ap.add_argument("--quick", action="store_true", help="2 rounds of 5 launches (CI)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    if args.quick:
        args.rounds, args.launches = 2, 5
    if importlib.util.find_spec("triton") is None:
        print("bench_triton_interpreter: triton is not installed; skipped")
        return 0
    _session_seconds(True, 1)                          # Triton's own first-launch work
    per = {True: [], False: []}
    ratios = []
    for r in range(args.rounds):
        order = (False, True) if r % 2 == 0 else (True, False)
        got = {once: _session_seconds(once, args.launches) for once in order}
        for once, s in got.items():
            per[once].append(s / args.launches * 1e3)
        ratios.append(got[False] / got[True])
    result = {"kernel_ms_per_launch": {"scan_each_time": statistics.median(per[False]),
                                       "scanned_once": statistics.median(per[True])},
              "kernel_speedup": statistics.median(ratios), "rounds": args.rounds,
              "launches": args.launches}
    print(f"kernel launch under sim: Triton's scan {result['kernel_ms_per_launch']['scan_each_time']:.2f} ms, "
          f"scanned once {result['kernel_ms_per_launch']['scanned_once']:.2f} ms "
          f"(x{result['kernel_speedup']:.2f}, median of {args.rounds} rounds)")
    if args.sglang and importlib.util.find_spec("sglang") is None:
        print("bench_triton_interpreter: sglang is not installed; --sglang skipped")
    elif args.sglang:
        runs = {True: [], False: []}
        for r in range(max(2, args.rounds // 2)):
            for once in ((False, True) if r % 2 == 0 else (True, False)):
                runs[once].append(_engine(once))
        same = all(a["outputs"] == b["outputs"] and a["findings"] == b["findings"]
                   for a, b in zip(runs[True], runs[False]))
        loops = {k: [x["loop"] for x in v] for k, v in runs.items()}
        result["sglang_loop_s"] = {"scan_each_time": loops[False], "scanned_once": loops[True]}
        result["sglang_loop_speedup"] = statistics.median(loops[False]) / statistics.median(loops[True])
        result["sglang_same_outputs_and_findings"] = same
        print(f"sglang-eagle-v2 loop (one request, graphs off): Triton's scan "
              f"{statistics.median(loops[False]):.1f} s, scanned once "
              f"{statistics.median(loops[True]):.1f} s (x{result['sglang_loop_speedup']:.2f}); "
              f"same tokens and findings: {same}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(result, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
