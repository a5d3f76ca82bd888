"""GPU overhead, side by side in one run: plain, do-nothing dispatch mode, CSAN, racecheck `cuda`.

Each configuration runs in its own worker process (CSAN's trace callbacks cannot be removed once
registered, so sharing a process would tax the configurations measured after it); rounds are
interleaved so clock and thermal drift hit every configuration alike. Within a process the figure is
the median of 5 timed blocks; across processes, the median of the rounds (their spread is printed).

Workloads:
  eager   a decode-like step: small matmuls on the main stream, metadata prepared on a plan
          stream and joined with an event, one host sync (`.item()`) per iteration
  graph   the same step captured once in a CUDA graph and replayed each iteration
  eagle   the EAGLE v2 scenario, all fixes on, a few iterations (racecheck vs its own plain run)

`--in-process` runs plain, the do-nothing mode and racecheck in one process instead, a timed block
of each in turn (15 rounds by default), and gives the median of the per-round ratios: on a shared
host whose speed drifts between processes, the figure to read. `--observer` adds the op observer
below Python's dispatch (instrumentation/op_observer.py) noting every op, its notes handed to
Python once per step, without and with each op's stack: the floor of a per-op path without a
dispatch mode; and its cost split: `op-observer-pruned` (RecordFunction off inside seen ops
that nest), `op-observer-discard` (notes dropped in C each step: the handover to Python apart),
`op-observer-events` (with stacks, storages registered where first seen, every note made into
a trace `Kernel` with its footprints in Python each step: the least a Python consumer pays).

racecheck runs with its defaults (on `cuda`: the device module's wrappers, torch's GPU trace off,
the C hot path where it was built); `racecheck-py` the same with the C hot path off (the Python
it ports); `racecheck-cb` (on request) with `callbacks=True` (torch's GPU trace callbacks too).

    python bench/gpu_overhead.py [--quick] [--json OUT.json] [--rounds N] [--workloads eager,graph,eagle]
                                 [--cpus 4,5] [--in-process [--split]]
                                 [--configs plain,noop-mode,csan,racecheck,racecheck-py]
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
import types

CONFIGS = ("plain", "noop-mode", "csan", "racecheck", "racecheck-py")
OPTIONAL = ("racecheck-cb",)    # --configs adds it
WORKLOADS = ("eager", "graph")


def _decode_step_factory(torch, dm, hidden=512, batch=8):
    w1 = torch.randn(hidden, hidden, device="cuda") / hidden ** 0.5
    w2 = torch.randn(hidden, hidden, device="cuda") / hidden ** 0.5
    x = torch.randn(batch, hidden, device="cuda")
    positions = torch.zeros(batch, dtype=torch.int64, device="cuda")
    plan_buf = torch.zeros(batch, dtype=torch.int64, device="cuda")
    out = torch.zeros(batch, hidden, device="cuda")
    plan_stream = dm.Stream()
    ready = dm.Event()
    plan_stream.wait_stream(dm.current_stream())  # the buffers above were made on the main stream

    def step():
        with dm.stream(plan_stream):
            plan_buf.copy_(positions + 1)
        ready.record(plan_stream)
        h = torch.relu(x @ w1)
        h = h @ w2
        dm.current_stream().wait_event(ready)
        positions.copy_(plan_buf)
        out.copy_(h + positions.unsqueeze(1).to(h.dtype))
        plan_stream.wait_stream(dm.current_stream())
        return out[0, 0].item()
    step.parts = dict(x=x, w1=w1, w2=w2, positions=positions, plan_buf=plan_buf, out=out,
                      plan_stream=plan_stream, ready=ready)

    def graph_step_factory():
        static = {}
        g = dm.CUDAGraph()
        s = dm.Stream()
        s.wait_stream(dm.current_stream())
        with dm.stream(s):
            for _ in range(2):
                h = torch.relu(x @ w1) @ w2
                out.copy_(h + positions.unsqueeze(1).to(h.dtype))
        dm.current_stream().wait_stream(s)
        with dm.graph(g):
            h = torch.relu(x @ w1) @ w2
            out.copy_(h + positions.unsqueeze(1).to(h.dtype))
        static["g"] = g

        def gstep():
            positions.add_(1)
            static["g"].replay()
            return out[0, 0].item()
        gstep.parts = (positions, g, out)       # for timing the statements inside the loop
        return gstep

    return step, graph_step_factory


def _noop_mode():
    """The do-nothing dispatch mode: the floor of any dispatch-mode tool."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class NoopMode(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))
    return NoopMode()


def worker(config: str, workload: str, iters: int) -> dict:
    import torch

    ctx = contextlib.nullcontext()
    if config == "noop-mode":
        ctx = _noop_mode()
    elif config == "csan":
        import torch.cuda._sanitizer as csan
        csan.enable_cuda_sanitizer()
    elif config in ("racecheck", "racecheck-cb", "racecheck-py"):
        import racecheck
        from racecheck.core import native
        native.use(config != "racecheck-py")
        if config != "racecheck-py" and native.built is None:
            raise SystemExit("racecheck's C hot path is not built here")
        ctx = racecheck.session(device="cuda", **({"callbacks": True} if config == "racecheck-cb" else {}))
    dm = torch.cuda
    with ctx:
        step, graph_factory = _decode_step_factory(torch, dm)
        fn = step if workload == "eager" else graph_factory()
        for _ in range(20):
            fn()
        dt = timed_blocks(fn, iters, torch.cuda.synchronize, blocks=1 if config == "csan" else BLOCKS)
    findings = handover = None
    if config.startswith("racecheck"):
        findings = len(ctx.findings)
        checker = ctx.recorder.checker
        at = getattr(checker, "handed_over_at", None)
        if at is not None:       # the C engine gave the run to the Python checker (slower)
            handover = f"event {at}: {checker.handed_over_on}"
        if getattr(checker, "resumed", 0):      # races the Python checker judged alone
            handover = f"{handover or 'none'}; {checker.resumed} races judged, the first " \
                       f"{checker.resumed_on}"
    return {"config": config, "workload": workload, "ms_per_iter": dt * 1e3, "findings": findings,
            "handover": handover}


BLOCKS = 5      # timed blocks per process; the median block is the process's figure


class _DroppingChecker:
    """Takes the recorder's batches and checks nothing: what emitting events costs by itself."""

    events_processed = 0

    def process_all(self, batch):
        self.events_processed += len(batch)
        return self


@contextlib.contextmanager
def _split_mode(ctx, config):
    """--split's two partial racecheck configurations (bench-only: the recorder's checker is
    swapped through its private attribute for the block, and put back before the session ends)."""
    if config == "racecheck-off":
        ctx.recorder.checking = False       # the dispatch mode's own floor: ops run unrecorded
        try:
            yield
        finally:
            ctx.recorder.checking = True
    elif config == "racecheck-unchecked":
        rec = ctx.recorder
        real, rec._checker = rec._checker, _DroppingChecker()
        try:
            yield
        finally:
            rec.queue.clear()
            rec._checker = real
    else:
        yield


@contextlib.contextmanager
def _observed(stacks=False, prune=False, registrar=None):
    """The op observer on, its notes drained raw each step (what handing them over costs);
    `stacks`: each op's frames captured too (the GIL taken per op); `prune`: RecordFunction
    off inside seen ops that nest."""
    from racecheck.instrumentation import op_observer
    mod = op_observer.load()
    if mod is None:
        raise SystemExit(f"the op observer did not build: {op_observer.why_not()}")
    with op_observer.Observer(stacks=stacks, prune=prune, registrar=registrar) as obs:
        if registrar is not None:
            registrar.observer = obs
        yield types.SimpleNamespace(
            discard=mod.discard,
            drain=mod.drain if registrar is None else (lambda: registrar.drain(mod)))


class _Events:
    """What a consumer of the notes in Python would pay at the least: storages registered where
    first seen (an id, a weakref that forgets it), and every note made into a trace `Kernel`
    with its footprints each step; the events are kept and dropped, not checked."""

    def __init__(self):
        import weakref
        self._ref = weakref.ref
        self.observer = None
        self.next = 0
        self.refs: dict = {}
        self.events: list = []

    def __call__(self, storage):
        sid, self.next = self.next, self.next + 1
        cdata = storage._cdata
        refs = self.refs

        def died(_ref, sid=sid, cdata=cdata):
            refs.pop(sid, None)
            self.observer.forget(cdata)
        refs[sid] = self._ref(storage, died)
        return sid

    def drain(self, mod):
        from racecheck.core.trace import Footprint, Kernel
        out = self.events
        for _number, name, thread, stream, _device, tensors, stack in mod.drain():
            reads, writes = [], []
            for t in tensors:
                f = Footprint(t[4], t[11], t[10][0] == 0, "strided view" if t[12] else None)
                (writes if t[1] else reads).append(f)
            out.append(Kernel(thread, stream, tuple(reads), tuple(writes), name, stack or ()))
        out.clear()


def in_process(workloads, rounds: int, iters: int, split: bool = False,
               observer: bool = False) -> list:
    """plain, the do-nothing mode and racecheck in one process, a timed block of each in turn,
    `rounds` times: each round's ratios compare blocks run within a fraction of a second of each
    other on the same CPU, which a shared host's drift between processes does not reach (none of
    the three activates torch's GPU trace, so they can share a process). `split` adds racecheck
    with checking off and racecheck with its events dropped unchecked: where its time goes."""
    import torch

    import racecheck

    contexts = {"plain": contextlib.nullcontext, "noop-mode": _noop_mode,
                "racecheck": lambda: racecheck.session(device="cuda")}
    if split:
        contexts["racecheck-off"] = contexts["racecheck-unchecked"] = contexts["racecheck"]
    if observer:
        contexts["op-observer"] = _observed
        contexts["op-observer-stacks"] = lambda: _observed(stacks=True)
        contexts["op-observer-pruned"] = lambda: _observed(prune=True)
        contexts["op-observer-discard"] = _observed      # notes dropped in C, not handed over
        contexts["op-observer-events"] = lambda: _observed(stacks=True, registrar=_Events())
    rows = []
    for workload in workloads:
        per = {c: [] for c in contexts}
        for _ in range(rounds):
            for config, make in contexts.items():
                with make() as ctx, _split_mode(ctx, config):
                    step, graph_factory = _decode_step_factory(torch, torch.cuda)
                    fn = step if workload == "eager" else graph_factory()
                    if config.startswith("op-observer"):
                        fn = _draining(fn, ctx.discard if config.endswith("discard")
                                       else ctx.drain)
                    for _ in range(20):
                        fn()
                    per[config].append(timed_blocks(fn, iters, torch.cuda.synchronize, blocks=1))
                if config == "racecheck" and ctx.findings:
                    raise SystemExit(f"racecheck reported {len(ctx.findings)} findings")
        base = {"plain": per["plain"], "noop": per["noop-mode"]}
        for config, xs in per.items():
            rows.append({"workload": workload, "config": config,
                         "ms_per_iter": statistics.median(xs) * 1e3,
                         **{f"x_{b}_rounds": [m / n for m, n in zip(xs, ys)] for b, ys in base.items()}})
    return rows


def _draining(fn, drain):
    def step():
        out = fn()
        drain()
        return out
    return step


def timed_blocks(fn, iters, sync, blocks=BLOCKS) -> float:
    """Seconds per call of fn: median over `blocks` blocks of `iters` calls (a hiccup of the
    shared host spoils one block, not the figure)."""
    times = []
    for _ in range(blocks):
        sync()
        t = time.perf_counter()
        for _ in range(iters):
            fn()
        sync()
        times.append((time.perf_counter() - t) / iters)
    return statistics.median(times)


def eagle_worker(config: str, iters: int) -> dict:
    from racecheck import scenarios
    sc = scenarios.get("eagle-v2")
    cfg = sc.config(overrides={"iterations": iters})
    t = time.perf_counter()
    if config == "racecheck":
        res = scenarios.run(sc, cfg, device="cuda")
        n = len(res.findings)
    else:
        res = scenarios.run_plain(sc, cfg, device="cuda")
        n = None
    return {"config": config, "workload": "eagle", "ms_per_iter": (time.perf_counter() - t) / iters * 1e3,
            "findings": n}


def run_worker(config, workload, iters, script=__file__) -> dict | None:
    """Run one configuration in a fresh process of `script`; its last stdout line is JSON."""
    cmd = [sys.executable, os.path.abspath(script), "--worker", config, "--workload", workload,
           "--iters", str(iters)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        sys.stderr.write(f"[{config}/{workload}] failed:\n{p.stderr[-2000:]}\n")
        return None
    return json.loads(p.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--json")
    p.add_argument("--rounds", type=int, default=None)
    p.add_argument("--worker")
    p.add_argument("--workload", default="eager")
    p.add_argument("--iters", type=int, default=200)
    p.add_argument("--cpus", help="run every process on these CPUs (e.g. 4,5): a shared host "
                   "schedules unpinned processes unevenly, which spreads the figures")
    p.add_argument("--workloads", default=",".join(WORKLOADS + ("eagle",)),
                   help="comma-separated, of eager, graph, eagle")
    p.add_argument("--in-process", action="store_true",
                   help="plain, do-nothing mode and racecheck in one process, blocks interleaved "
                   "(--rounds of them, 15 by default): per-round ratios a noisy host disturbs less")
    p.add_argument("--split", action="store_true",
                   help="with --in-process: also racecheck with checking off, and with its events "
                   "dropped unchecked (the dispatch floor, emission, checking)")
    p.add_argument("--observer", action="store_true",
                   help="with --in-process: also the op observer below Python's dispatch")
    p.add_argument("--configs", default=",".join(CONFIGS),
                   help=f"comma-separated, of {', '.join(CONFIGS + OPTIONAL)}")
    args = p.parse_args(argv)
    configs = tuple(c for c in args.configs.split(",") if c)
    if args.cpus:       # inherited by the worker processes
        os.sched_setaffinity(0, {int(c) for c in args.cpus.split(",")})
    workloads = tuple(w for w in args.workloads.split(",") if w)
    if args.worker:
        if args.workload == "eagle":
            print(json.dumps(eagle_worker(args.worker, args.iters)))
        else:
            print(json.dumps(worker(args.worker, args.workload, args.iters)))
        return 0
    import torch
    if not torch.cuda.is_available():
        print("no GPU: nothing to measure")
        return 0
    iters = 50 if args.quick else 300
    if args.in_process:
        rows = in_process([w for w in WORKLOADS if w in workloads], args.rounds or 15, iters,
                          split=args.split, observer=args.observer)
        print(f"device: {torch.cuda.get_device_name()}  torch {torch.__version__}  in one process, "
              f"rounds {args.rounds or 15}  cpus {args.cpus or 'any'}")
        print(f"{'workload':10s} {'config':19s} {'ms/iter':>10s} {'x plain':>8s} {'x noop':>7s}  "
              "(medians of the per-round ratios; quartiles in brackets)")
        for r in rows:
            cells = []
            for b in ("plain", "noop"):
                xs = sorted(r[f"x_{b}_rounds"])
                q = statistics.quantiles(xs, n=4) if len(xs) > 1 else [xs[0]] * 3
                r[f"x_{b}"] = statistics.median(xs)
                cells.append(f"{r[f'x_{b}']:.2f} [{q[0]:.2f}-{q[2]:.2f}]")
            print(f"{r['workload']:10s} {r['config']:19s} {r['ms_per_iter']:10.3f}  " + "  ".join(cells))
        if args.json:
            with open(args.json, "w") as fp:
                json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                           "in_process": True, "rows": rows}, fp, indent=2)
        return 0
    rounds = args.rounds or (1 if args.quick else 3)
    samples: dict = {}
    for rnd in range(rounds):
        for workload in (w for w in WORKLOADS if w in workloads):
            for config in configs:
                r = run_worker(config, workload, iters)
                if r:
                    samples.setdefault((workload, config), []).append(r)
        for config in ("plain", "racecheck") if "eagle" in workloads else ():
            r = run_worker(config, "eagle", 10 if args.quick else 20)
            if r:
                samples.setdefault(("eagle", config), []).append(r)
        print(f"round {rnd + 1}: "
              + ", ".join(f"{w}/{c} {rs[-1]['ms_per_iter']:.3f}" for (w, c), rs in samples.items()),
              flush=True)
    rows = []
    for (workload, config), rs in samples.items():
        xs = [r["ms_per_iter"] for r in rs]
        rows.append({"workload": workload, "config": config, "ms_per_iter": statistics.median(xs),
                     "rounds_ms": xs, "findings": rs[-1]["findings"],
                     "handovers": [r.get("handover") for r in rs]})
    plain = {r["workload"]: r["ms_per_iter"] for r in rows if r["config"] == "plain"}
    noop = {r["workload"]: r["ms_per_iter"] for r in rows if r["config"] == "noop-mode"}
    print(f"device: {torch.cuda.get_device_name()}  torch {torch.__version__}  rounds {rounds}  cpus {args.cpus or 'any'}")
    print(f"{'workload':10s} {'config':12s} {'ms/iter':>10s} {'rounds min-max':>16s} {'x plain':>8s} {'x noop':>7s} findings")
    order = CONFIGS + OPTIONAL
    per_round = {(w, c): [r["ms_per_iter"] for r in rs] for (w, c), rs in samples.items()}
    for r in sorted(rows, key=lambda r: (r["workload"], order.index(r["config"]) if r["config"] in order else 9)):
        ratio = r["ms_per_iter"] / plain[r["workload"]] if r["workload"] in plain else float("nan")
        r["x_plain"] = ratio
        r["x_noop"] = r["ms_per_iter"] / noop[r["workload"]] if r["workload"] in noop else float("nan")
        spread = f"{min(r['rounds_ms']):.3f}-{max(r['rounds_ms']):.3f}"
        # ratios within each round (the configurations of one round ran back to back)
        mine = per_round[(r["workload"], r["config"])]
        base = per_round.get((r["workload"], "noop-mode"), [])
        r["x_noop_rounds"] = [m / b for m, b in zip(mine, base)]
        r["x_plain_rounds"] = [m / b for m, b in zip(mine, per_round.get((r["workload"], "plain"), []))]
        rounds_txt = " ".join(f"{x:.2f}" for x in r["x_noop_rounds"])
        print(f"{r['workload']:10s} {r['config']:12s} {r['ms_per_iter']:10.3f} {spread:>16s} {ratio:8.2f} {r['x_noop']:7.2f} {r['findings']}  [x noop per round: {rounds_txt}]")
    for r in rows:
        if any(r["handovers"]):
            print(f"{r['workload']}/{r['config']}: the C engine handed over to the Python checker "
                  f"in {sum(map(bool, r['handovers']))} of {len(r['handovers'])} rounds: "
                  + "; ".join(h or "-" for h in r["handovers"]))
    if args.json:
        with open(args.json, "w") as fp:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}, fp, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
