"""Triton's CPU interpreter under racecheck `sim`, with and without racecheck's cuts
(`instrumentation/triton_kernels.py`), side by side in one run:
- `BUILTINS_ONCE`: builtins scanned once per session, not at every launch and nested
  `@triton.jit` call;
- `OVERFLOW_CHECKS_AS_COMPILED`: no integer-overflow checks computed for a `device_assert`
  that drops them (a launch without `debug`, as compiled on a GPU);
- `LANGUAGE_ONCE_PER_LAUNCH`: a nested `@triton.jit` call does not patch the language the
  launch already patched;
- `DTYPES_MEMOIZED`: a value's numpy dtype looked up, not worked out per value;
- `TYPES_MEMOIZED`: a value's block type and shape made once per element type and shape, not
  built per value;
- `BINARY_CHECKS_MEMOIZED`: a binary op's type checks (promotion, casts, broadcast) worked out
  once per pair of operand types, not per op.

    python bench/bench_triton_interpreter.py [--rounds 5] [--launches 40] [--quick]
        [--sglang [--graphs on|off] [--compare SETTING SETTING]]

Kernel: a small kernel whose programs do integer index arithmetic and call a `@triton.jit`
helper (as sglang's do), `--launches` launches per session, sessions rotating through the
settings; per setting the median per launch, and the median of the per-round ratios to
Triton's own interpreter. `--sglang` adds the real engine (`sglang-eagle-v2`, default
schedule, graphs off unless `--graphs on`; sglang installed): one fresh process per run, two
settings alternating (default: Triton's interpreter as is against all six cuts), the engine's
construction (graph captures included) and loop from the front door's clock, and whether
tokens and findings are the same.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
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
        offs = (offs * 3 - offs * 2) + 0 * n            # index arithmetic, as attention does
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
for name, on in zip(json.loads(sys.argv[1]), json.loads(sys.argv[2])):
    setattr(triton_kernels, name, on)
imports.install()
with _environment(dict(_SIM_ENV)):
    _import_quietly()
sc = scenarios.get("sglang-eagle-v2")
cfg = sc.config(overrides={"graphs": sys.argv[3] == "on"})
with racecheck.session(device="sim", **sc.session_options(cfg, "sim")) as rc:
    out = sc.run_once(cfg, RunContext(rc.device_module, "cpu", rc, pin=True, seed=0))
found = sorted(f"{f.rule} {f.tensor}" for f in rc.findings)
print("@@" + json.dumps({"loop": server.TIMINGS.get("loop"),
                         "construction": server.TIMINGS.get("construction"), "outputs": repr(out),
                         "findings": found}))
"""


SWITCHES = ("BUILTINS_ONCE", "OVERFLOW_CHECKS_AS_COMPILED", "LANGUAGE_ONCE_PER_LAUNCH",
            "DTYPES_MEMOIZED", "TYPES_MEMOIZED", "BINARY_CHECKS_MEMOIZED")
SETTINGS = {                   # name -> the six switches, in SWITCHES' order
    "triton": (False, False, False, False, False, False),
    "builtins once": (True, False, False, False, False, False),
    "overflow as compiled": (False, True, False, False, False, False),
    "both": (True, True, False, False, False, False),
    "language once per launch": (False, False, True, False, False, False),
    "dtypes memoized": (False, False, False, True, False, False),
    "types memoized": (False, False, False, False, True, False),
    "binary checks memoized": (False, False, False, False, False, True),
    "all four": (True, True, True, True, False, False),
    "all five": (True, True, True, True, True, False),
    "all six": (True, True, True, True, True, True),
}


def _session_seconds(setting: str, launches: int) -> float:
    from racecheck.instrumentation import triton_kernels

    import racecheck
    for name, on in zip(SWITCHES, SETTINGS[setting]):
        setattr(triton_kernels, name, on)
    # the same launch on the same bytes would replay its record (launch_cache.py) after the
    # first: every launch here is interpreted
    triton_kernels.LAUNCHES_REPLAYED = False
    src = torch.arange(256, dtype=torch.float32)
    dst = torch.empty_like(src)
    with racecheck.session(device="sim"):
        t0 = time.perf_counter()
        for _ in range(launches):
            add_shifted[(8,)](src, dst, 256, BLOCK=32)
        seconds = time.perf_counter() - t0
    assert torch.equal(dst, src + 1)
    return seconds


def _engine(setting: str, graphs: bool) -> dict:
    p = subprocess.run([sys.executable, "-c", ENGINE_CHILD, json.dumps(SWITCHES),
                        json.dumps(SETTINGS[setting]), "on" if graphs else "off"],
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
    ap.add_argument("--graphs", choices=("on", "off"), default="off")
    ap.add_argument("--compare", nargs=2, choices=list(SETTINGS), default=("triton", "all six"),
                    metavar="SETTING", help="the two settings the engine runs compare")
    ap.add_argument("--quick", action="store_true", help="4 rounds of 5 launches (CI)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    os.environ.setdefault("RACECHECK_LAUNCH_RECORDS", "off")   # no records of earlier runs
    if args.quick:
        args.rounds, args.launches = 4, 5
    if importlib.util.find_spec("triton") is None:
        print("bench_triton_interpreter: triton is not installed; skipped")
        return 0
    _session_seconds("both", 1)                        # Triton's own first-launch work
    names = list(SETTINGS)
    per = {name: [] for name in names}
    ratios = {name: [] for name in names}
    for r in range(args.rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        got = {name: _session_seconds(name, args.launches) for name in order}
        for name, s in got.items():
            per[name].append(s / args.launches * 1e3)
            ratios[name].append(got["triton"] / s)
    result = {"kernel_ms_per_launch": {n: statistics.median(v) for n, v in per.items()},
              "kernel_speedup": {n: statistics.median(v) for n, v in ratios.items()},
              "rounds": args.rounds, "launches": args.launches}
    print(f"kernel launch under sim, median of {args.rounds} rounds: " + ", ".join(
        f"{n} {result['kernel_ms_per_launch'][n]:.2f} ms (x{result['kernel_speedup'][n]:.2f})"
        for n in names))
    if args.sglang and importlib.util.find_spec("sglang") is None:
        print("bench_triton_interpreter: sglang is not installed; --sglang skipped")
    elif args.sglang:
        base, cut = args.compare
        runs = {base: [], cut: []}
        for r in range(max(2, args.rounds // 2)):
            for setting in ((base, cut) if r % 2 == 0 else (cut, base)):
                runs[setting].append(_engine(setting, args.graphs == "on"))
        same = all(a["outputs"] == b["outputs"] and a["findings"] == b["findings"]
                   for a, b in zip(runs[base], runs[cut]))
        eng = {}
        for phase in ("construction", "loop"):
            got = {k: [x[phase] for x in v] for k, v in runs.items()}
            eng[phase] = {"seconds": got, "speedup": statistics.median(got[base])
                          / statistics.median(got[cut])}
        result["sglang"] = {"graphs": args.graphs, "compare": [base, cut], **eng,
                            "same_outputs_and_findings": same}
        print(f"sglang-eagle-v2 (graphs {args.graphs}), {base} against {cut}: " + "; ".join(
            f"{phase} {statistics.median(e['seconds'][base]):.1f} s against "
            f"{statistics.median(e['seconds'][cut]):.1f} s (x{e['speedup']:.2f})"
            for phase, e in eng.items()) + f"; same tokens and findings: {same}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(result, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
