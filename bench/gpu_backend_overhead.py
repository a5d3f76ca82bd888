"""Per-op cost of the `cuda` backend, broken down (each configuration in its own process).

    python bench/gpu_backend_overhead.py [--quick] [--json OUT.json]

Configurations:
  plain            no instrumentation
  trace-on         torch's GPU trace activated (every allocation, free, event and sync calls into
                   Python, as after any racecheck `cuda` session), no dispatch mode
  noop-mode        a do-nothing TorchDispatchMode (the floor for any dispatch-level tool)
  racecheck        racecheck.session(device="cuda")  (the default: the device module's wrappers)
  racecheck-cb     racecheck.session(device="cuda", callbacks=True)  (torch's GPU trace callbacks
                   + wrappers, the default before 2026-11-25)
Workloads:
  ops      20 small elementwise ops per iteration on the default stream (per-op cost)
  decode   the decode-like step of bench/gpu_overhead.py (plan stream, event, matmuls, .item())
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

CONFIGS = ("plain", "trace-on", "noop-mode", "racecheck", "racecheck-cb")
WORKLOADS = ("ops", "decode")
OPS_PER_ITER = 20


def _ops_step(torch):
    x = torch.randn(1024, device="cuda")
    y = torch.zeros(1024, device="cuda")

    def step():
        for _ in range(OPS_PER_ITER // 4):
            t = x * 2          # alloc + op
            y.add_(t)          # in-place
            t2 = y - x         # alloc + op
            y.copy_(t2)        # copy
        return None
    return step


def _decode_step(torch, dm):
    """The decode-like step of gpu_overhead.py (hidden 256 here: more launch-bound)."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from gpu_overhead import _decode_step_factory
    return _decode_step_factory(torch, dm, hidden=256)[0]


def worker(config: str, workload: str, iters: int) -> dict:
    import contextlib

    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    class NoopMode(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    ctx = contextlib.nullcontext()
    if config == "trace-on":
        torch._C._activate_gpu_trace()
    elif config == "noop-mode":
        ctx = NoopMode()
    elif config in ("racecheck", "racecheck-cb"):
        import racecheck
        opts = {"callbacks": True} if config == "racecheck-cb" else {}
        ctx = racecheck.session(device="cuda", **opts)
    with ctx:
        fn = _ops_step(torch) if workload == "ops" else _decode_step(torch, torch.cuda)
        for _ in range(20):
            fn()
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from gpu_overhead import timed_blocks
        dt = timed_blocks(fn, iters, torch.cuda.synchronize)
    findings = len(ctx.findings) if config.startswith("racecheck") else None
    errors = len(ctx.internal_errors) if config.startswith("racecheck") else None
    return {"config": config, "workload": workload, "us_per_iter": dt * 1e6,
            "findings": findings, "internal_errors": errors}


def run_worker(config, workload, iters):
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from gpu_overhead import run_worker as run_in_process
    return run_in_process(config, workload, iters, script=__file__)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--json")
    p.add_argument("--worker")
    p.add_argument("--workload", default="ops")
    p.add_argument("--iters", type=int, default=300)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--workloads", default=",".join(WORKLOADS))
    args = p.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args.worker, args.workload, args.iters)))
        return 0
    import torch
    if not torch.cuda.is_available():
        print("no GPU: nothing to measure")
        return 0
    rounds = 1 if args.quick else args.rounds
    iters = 100 if args.quick else 400
    samples: dict = {}
    for _ in range(rounds):
        for workload in args.workloads.split(","):
            for config in CONFIGS:
                r = run_worker(config, workload, iters)
                if r:
                    samples.setdefault((workload, config), []).append(r)
    rows = []
    for (workload, config), rs in samples.items():
        xs = [r["us_per_iter"] for r in rs]
        rows.append({"workload": workload, "config": config, "us_per_iter": statistics.median(xs),
                     "rounds_us": xs,
                     "findings": rs[-1]["findings"], "internal_errors": rs[-1]["internal_errors"]})
    base = {r["workload"]: r["us_per_iter"] for r in rows if r["config"] == "plain"}
    noop = {r["workload"]: r["us_per_iter"] for r in rows if r["config"] == "noop-mode"}
    print(f"device: {torch.cuda.get_device_name()}  torch {torch.__version__}  rounds {rounds}")
    print(f"{'workload':8s} {'config':15s} {'us/iter':>10s} {'x plain':>8s} {'x noop':>7s} {'us/op extra':>12s}")
    for r in sorted(rows, key=lambda r: (r["workload"], CONFIGS.index(r["config"]))):
        ratio = r["us_per_iter"] / base[r["workload"]] if r["workload"] in base else float("nan")
        r["x_plain"] = ratio
        r["x_noop"] = r["us_per_iter"] / noop[r["workload"]] if r["workload"] in noop else float("nan")
        extra = ""
        if r["workload"] == "ops" and "ops" in base:
            r["us_per_op_extra"] = (r["us_per_iter"] - base["ops"]) / OPS_PER_ITER
            extra = f"{r['us_per_op_extra']:12.2f}"
        print(f"{r['workload']:8s} {r['config']:15s} {r['us_per_iter']:10.1f} {ratio:8.2f} {r['x_noop']:7.2f} {extra}")
    if args.json:
        with open(args.json, "w") as fp:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                       "rows": rows}, fp, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
