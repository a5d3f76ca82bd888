"""Per-op interception cost on `sim`, side by side with its anchors, in one run.

Configurations, measured in interleaved rounds so drift hits all of them alike:
  plain      no instrumentation
  noop-mode  a TorchDispatchMode that only calls the op (the floor of any dispatch-mode tool)
  racecheck  racecheck.session(device="sim") (interception + footprints + stacks + online checker)
  racecheck-py  the same with the C hot path off (racecheck.core.native.use(False)): the Python
             reference it ports
  racecheck-routed  racecheck.session(device="sim", route_cuda=True): the same ops on tensors
             placed on "cuda" through torch.cuda routing (made inside the session each round)
  csan       PyTorch's CUDA Stream Sanitizer decision logic (torch.cuda._sanitizer's own dispatch
             mode and event handler) driven on CPU tensors that claim to be CUDA tensors

Workloads: an in-place add on a 64-element tensor, a small decode-like step (matmul, add,
index_select, copy into a buffer), and an op that makes a temporary (`t = a * 2`: a new storage
registered, its Alloc, footprint, shadow and Free), each called from Python stacks of depth 1,
10 and 30 (CSAN's cost grows with stack depth; racecheck's stack capture stops after a few user
frames).

    python bench/bench_interception.py [--quick] [--json OUT.json]
"""
from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time

import torch
from torch.utils._python_dispatch import TorchDispatchMode

import racecheck


class NoopMode(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


class _FakeStream:
    cuda_stream = 7


@contextlib.contextmanager
def csan_on_cpu():
    """CSAN's real Python logic on CPU: tensors report is_cuda, the current stream is fixed."""
    import torch.cuda._sanitizer as csan
    orig_is_cuda = torch.Tensor.is_cuda
    orig_current = torch.cuda.current_stream
    torch.Tensor.is_cuda = property(lambda self: True)
    torch.cuda.current_stream = lambda device=None: _FakeStream()
    mode = csan.CUDASanitizerDispatchMode()
    try:
        with mode:
            yield
    finally:
        torch.Tensor.is_cuda = orig_is_cuda
        torch.cuda.current_stream = orig_current


@contextlib.contextmanager
def racecheck_sim():
    with racecheck.session(device="sim") as rc:
        yield rc


@contextlib.contextmanager
def racecheck_python():
    from racecheck.core import native
    was = native.speedups is not None
    native.use(False)
    try:
        with racecheck.session(device="sim") as rc:
            yield rc
    finally:
        native.use(was)


@contextlib.contextmanager
def racecheck_routed():
    with racecheck.session(device="sim", route_cuda=True) as rc:
        yield rc


CONFIGS = {
    "plain": contextlib.nullcontext,
    "noop-mode": NoopMode,
    "racecheck": racecheck_sim,
    "racecheck-py": racecheck_python,
    "racecheck-routed": racecheck_routed,
    "csan": csan_on_cpu,
}
# configurations whose workload tensors are placed on "cuda" inside the session (routing)
ROUTED = {"racecheck-routed"}


def make_workloads(device=None):
    a, b = torch.ones(64, device=device), torch.ones(64, device=device)
    w = torch.randn(16, 16, device=device)
    h = torch.randn(4, 16, device=device)
    table = torch.randn(32, 16, device=device)
    idx = torch.tensor([1, 5, 7, 9], device=device)
    buf = torch.zeros(4, 16, device=device)

    def add_op():
        a.add_(b)

    def decode_step():
        y = h @ w
        y = y + 1.0
        rows = table.index_select(0, idx)
        buf.copy_(y + rows)

    def temporary():
        t = a * 2           # a new tensor each call, dropped by the next
        return t

    return {"add_": (add_op, 1), "decode-step": (decode_step, 5), "temporary": (temporary, 1)}


def at_depth(depth, fn, n):
    if depth <= 1:
        t = time.perf_counter()
        for _ in range(n):
            fn()
        return time.perf_counter() - t
    return at_depth(depth - 1, fn, n)


def measure(quick: bool):
    n = 300 if quick else 3000
    rounds = 3 if quick else 9
    depths = (1, 10, 30)
    workloads = make_workloads()
    results = {}
    for wname, (fn, ops_per_call) in workloads.items():
        for depth in depths:
            samples = {c: [] for c in CONFIGS}
            for _ in range(rounds):
                for cname, ctx in CONFIGS.items():
                    with ctx():
                        run = fn
                        if cname in ROUTED:     # the same ops on tensors placed on "cuda"
                            run = make_workloads("cuda")[wname][0]
                        at_depth(depth, run, max(20, n // 10))  # warm up
                        dt = at_depth(depth, run, n)
                    samples[cname].append(dt / (n * ops_per_call) * 1e6)
            results[(wname, depth)] = {c: statistics.median(v) for c, v in samples.items()}
    return results


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="few iterations: checks the script works")
    p.add_argument("--json", help="write the numbers to this file")
    args = p.parse_args(argv)
    from rich.console import Console
    from rich.table import Table
    results = measure(args.quick)
    table = Table(title="sim: µs per op (median), added over plain, and ratio to the do-nothing mode's cost")
    for col in ("workload", "stack depth", "plain", "noop-mode +", "racecheck +", "Python path +",
                "routed +", "csan +", "racecheck / noop", "csan / racecheck"):
        table.add_column(col, justify="right", overflow="fold")
    out = []
    for (wname, depth), r in results.items():
        plain = r["plain"]
        added = {c: r[c] - plain for c in r}
        table.add_row(wname, str(depth), f"{plain:.2f}", f"{added['noop-mode']:.2f}",
                      f"{added['racecheck']:.2f}", f"{added['racecheck-py']:.2f}",
                      f"{added['racecheck-routed']:.2f}",
                      f"{added['csan']:.2f}",
                      f"{added['racecheck'] / max(added['noop-mode'], 1e-9):.2f}x",
                      f"{added['csan'] / max(added['racecheck'], 1e-9):.1f}x")
        out.append({"workload": wname, "depth": depth, "us_per_op": r, "added_us": added})
    Console().print(table)
    if args.json:
        with open(args.json, "w") as fp:
            json.dump(out, fp, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
