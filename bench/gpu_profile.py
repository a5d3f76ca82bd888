"""Where racecheck's time goes on a GPU: in-process timings, primitive costs and cProfile.

    python bench/gpu_profile.py [--quick] [--json OUT.json] [--pstats DIR] [--callbacks]
                                [--statements] [--segments]

One process, configurations in this order (none of them activates torch's GPU trace, so they can
share it; `--callbacks` adds racecheck with trace callbacks last, which activates it for good):
plain, a do-nothing dispatch mode, racecheck `cuda`, racecheck `cuda` with its C hot path off
(the Python reference), rounds interleaved; ratios are also given per round (the configurations
of a round run back to back, so a noisy host disturbs a round's ratio less than a median). Then each workload once
more under racecheck with cProfile, the top functions by own time printed. The ratios here are a
guide for profiling; the reported figures come from gpu_overhead.py / gpu_backend_overhead.py
(one process per configuration).
"""
from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import json
import os
import pstats
import statistics
import sys
import time
import weakref

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def _workloads(torch):
    from gpu_backend_overhead import _ops_step
    from gpu_overhead import _decode_step_factory
    dm = torch.cuda
    step, graph_factory = _decode_step_factory(torch, dm)
    return {"ops": _ops_step(torch), "decode": step, "graph": graph_factory()}


def _time(fn, iters, torch, warmup=10):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(iters):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / iters * 1e6


def _statements(torch):
    """One callable per kind of statement the decode step makes (gpu_overhead's loop (a))."""
    dm = torch.cuda
    x = torch.randn(8, 512, device="cuda")
    w = torch.randn(512, 512, device="cuda")
    pos = torch.zeros(8, dtype=torch.int64, device="cuda")
    buf = torch.zeros(8, dtype=torch.int64, device="cuda")
    out = torch.zeros(8, 512, device="cuda")
    s = dm.Stream()
    ev = dm.Event()
    cur = dm.current_stream()
    s.wait_stream(cur)

    def in_stream():
        with dm.stream(s):
            pass

    g = dm.CUDAGraph()              # one captured in-place kernel: a replay's own cost
    gx = torch.zeros(8, 512, device="cuda")
    s.wait_stream(cur)
    with dm.stream(s):
        gx.add_(1)                  # warm-up off the capture, as torch asks
    cur.wait_stream(s)
    with dm.graph(g):
        gx.add_(1)
    return {
        "x @ w (a temporary)": lambda: x @ w,
        "torch.relu(x) (a temporary)": lambda: torch.relu(x),
        "pos + 1 (a temporary)": lambda: pos + 1,
        "pos.to(float32) (a temporary)": lambda: pos.to(torch.float32),
        "pos.add_(1) (in place)": lambda: pos.add_(1),
        "buf.copy_(pos)": lambda: buf.copy_(pos),
        "pos.unsqueeze(1) (a view)": lambda: pos.unsqueeze(1),
        "out[0, 0].item()": lambda: out[0, 0].item(),
        "with dm.stream(s)": in_stream,
        "ev.record(s)": lambda: ev.record(s),
        "cur.wait_event(ev)": lambda: cur.wait_event(ev),
        "s.wait_stream(cur)": lambda: s.wait_stream(cur),
        "dm.current_stream()": lambda: dm.current_stream(),
        "g.replay() (one captured kernel)": lambda: g.replay(),
    }


def statement_costs(torch, make_modes, rounds=5, iters=2000) -> list:
    """[(statement, {config: µs per call})]: min over rounds, configurations interleaved."""
    times: dict = {}
    for _ in range(rounds):
        for config, make in make_modes.items():
            with make() if make else contextlib.nullcontext():
                for name, fn in _statements(torch).items():
                    us = _time(fn, iters, torch, warmup=50)
                    cur = times.setdefault(name, {})
                    cur[config] = min(us, cur.get(config, us))
    return list(times.items())


def _segmented_loops(torch):
    """gpu_overhead's two loops, statement by statement, each followed by a clock read; they
    mirror `_decode_step_factory`'s step and graph step (keep them in step)."""
    from gpu_overhead import _decode_step_factory
    dm = torch.cuda
    step, graph_factory = _decode_step_factory(torch, dm)
    gstep = graph_factory()
    pc = time.perf_counter
    p = step.parts
    x, w1, w2, positions, plan_buf, out = (p[k] for k in ("x", "w1", "w2", "positions",
                                                          "plan_buf", "out"))
    plan_stream, ready = p["plan_stream"], p["ready"]
    decode_names = ("with dm.stream(plan_stream)", "positions + 1", "plan_buf.copy_(..), exit",
                    "ready.record(plan_stream)", "x @ w1", "torch.relu(..)", "h @ w2",
                    "wait_event(ready)", "positions.copy_(plan_buf)", "positions.unsqueeze(1)",
                    ".to(h.dtype)", "h + ..", "out.copy_(..)", "plan_stream.wait_stream(..)",
                    "out[0, 0]", ".item()")

    def decode(t):
        t0 = pc()
        ctx = dm.stream(plan_stream)
        ctx.__enter__()
        t1 = pc()
        nxt = positions + 1
        t2 = pc()
        plan_buf.copy_(nxt)
        ctx.__exit__(None, None, None)
        t3 = pc()
        ready.record(plan_stream)
        t4 = pc()
        h = x @ w1
        t5 = pc()
        h = torch.relu(h)
        t6 = pc()
        h = h @ w2
        t7 = pc()
        dm.current_stream().wait_event(ready)
        t8 = pc()
        positions.copy_(plan_buf)
        t9 = pc()
        u = positions.unsqueeze(1)
        t10 = pc()
        u = u.to(h.dtype)
        t11 = pc()
        y = h + u
        t12 = pc()
        out.copy_(y)
        t13 = pc()
        plan_stream.wait_stream(dm.current_stream())
        t14 = pc()
        v = out[0, 0]
        t15 = pc()
        v.item()
        t16 = pc()
        del nxt, h, u, y
        ts = (t0, t1, t2, t3, t4, t5, t6, t7, t8, t9, t10, t11, t12, t13, t14, t15, t16)
        for k in range(len(ts) - 1):
            t[k].append((ts[k + 1] - ts[k]) * 1e6)

    gpos, g, gout = gstep.parts
    graph_names = ("positions.add_(1)", "g.replay()", "out[0, 0]", ".item()")

    def graph(t):
        t0 = pc()
        gpos.add_(1)
        t1 = pc()
        g.replay()
        t2 = pc()
        v = gout[0, 0]
        t3 = pc()
        v.item()
        t4 = pc()
        for k, d in enumerate((t1 - t0, t2 - t1, t3 - t2, t4 - t3)):
            t[k].append(d * 1e6)
    return {"decode": (decode_names, decode, step), "graph": (graph_names, graph, gstep)}


def _total(segments: dict) -> float:
    return sum(mean for _median, mean in segments.values())


def loop_segments(torch, make_modes, rounds=3, iters=2000) -> dict:
    """{loop: {config: {statement: (median µs, mean µs)}}}: the host time of each statement
    of gpu_overhead's loops, taken inside the loop (a statement timed alone can cost less than
    inside its loop, where the host waits for the device and queued work is checked), from the
    round with the lowest total."""
    out: dict = {}
    for _ in range(rounds):
        for config, make in make_modes.items():
            with make() if make else contextlib.nullcontext():
                for loop, (names, timed, step) in _segmented_loops(torch).items():
                    for _ in range(50):
                        step()
                    torch.cuda.synchronize()
                    seg = [[] for _ in names]
                    for _ in range(iters):
                        timed(seg)
                    torch.cuda.synchronize()
                    got = {n: (statistics.median(xs), statistics.fmean(xs))
                           for n, xs in zip(names, seg)}
                    cur = out.setdefault(loop, {}).get(config)
                    if cur is None or _total(got) < _total(cur):
                        out[loop][config] = got
    return out


def _nothing(_ref) -> None:
    pass


def _primitives(torch, iters=20000):
    """µs per call of the C calls the backend makes per op (this machine's CPU)."""
    x = torch.zeros(1024, device="cuda")
    get_cur = torch._C._cuda_getCurrentStream
    calls = {
        "_cuda_getCurrentStream(-1)": lambda: get_cur(-1),
        "t.get_device()": x.get_device,
        "t.is_cpu": lambda: x.is_cpu,
        "t.data_ptr()": x.data_ptr,
        "t.untyped_storage()._cdata": lambda: x.untyped_storage()._cdata,
        "torch.empty_like (alloc+free)": lambda: torch.empty_like(x),
        # what registering a new storage adds: its Python storage object, a weak reference
        "empty_like + untyped_storage()": lambda: torch.empty_like(x).untyped_storage(),
        "empty_like + storage weakref": lambda: weakref.ref(torch.empty_like(x).untyped_storage(), _nothing),
        "x.add_(1)": lambda: x.add_(1),
    }
    out = {}
    for name, fn in calls.items():
        fn()
        t = time.perf_counter()
        for _ in range(iters):
            fn()
        out[name] = (time.perf_counter() - t) / iters * 1e6
    torch.cuda.synchronize()
    return out


# Own time (cProfile tottime) grouped by what the code is for; first matching pattern wins.
CATEGORIES = (
    ("checker (shadow memory, clocks)", ("racecheck/core/checker/", "racecheck/core/shadow.py",
                                         "racecheck/core/clocks.py")),
    ("event queue (recorder)", ("racecheck/core/recorder.py",)),
    ("event objects", ("racecheck/core/trace.py",)),
    ("stack capture", ("instrumentation/stacks.py",)),
    ("footprints, storage registry", ("instrumentation/footprints.py",)),
    ("dispatch mode, op plans", ("instrumentation/interceptor.py", "instrumentation/classify.py")),
    ("cuda backend (streams, wrappers, host reads)", ("instrumentation/device.py",
                                                     "instrumentation/base.py",
                                                     "instrumentation/cuda.py")),
    ("the loop itself (bench code)", ("bench/",)),
    ("torch Python (dispatch-mode glue, torch.cuda)", ("torch/",)),
)


# racecheck's C code, where cProfile sees it: a C function or method called from Python code.
# Called from C (a plan's stack capture, the dispatch entry calling a plan) it is invisible and
# counts for its caller: torch's C++ dispatch holds the C entry and plans of an op, the recorder
# the checker's engine.
C_CATEGORIES = (("_speedups.capture", "stack capture"),
                ("_engine.", "checker (shadow memory, clocks)"),
                ("_speedups.", "dispatch mode, op plans"))


def _category(filename: str) -> str:
    f = filename.replace("\\", "/")
    for name, pats in CATEGORIES:
        if any(pat in f for pat in pats):
            return name
    return "other Python"


def breakdown(stats: pstats.Stats) -> list:
    """[(category, seconds, share)] of own time. Torch's C functions (ops, launches, the C++
    side of dispatch) are their own category; other C functions (dict.get, ...) count for the
    code that called them, in proportion to the time spent under each caller."""
    total = 0.0
    sums: dict = {}
    for (filename, _line, name), (_cc, _nc, tt, _ct, callers) in stats.stats.items():
        total += tt
        if filename != "~":
            cat = _category(filename)
            sums[cat] = sums.get(cat, 0.0) + tt
        elif "_speedups." in name or "_engine." in name:
            cat = next(c for pat, c in C_CATEGORIES if pat in name)
            sums[cat] = sums.get(cat, 0.0) + tt
        elif "torch" in name:
            cat = "torch C++ (ops, launches, dispatch)"
            sums[cat] = sums.get(cat, 0.0) + tt
        else:
            under = sum(v[2] for v in callers.values()) or 1.0
            for (cfile, _l, _n), v in callers.items():
                cat = "torch C++ (ops, launches, dispatch)" if cfile == "~" else _category(cfile)
                sums[cat] = sums.get(cat, 0.0) + tt * v[2] / under
    return sorted(((c, t, t / total if total else 0.0) for c, t in sums.items()), key=lambda x: -x[1])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--json")
    p.add_argument("--pstats", help="folder for one .pstats file per workload")
    p.add_argument("--callbacks", action="store_true", help="also racecheck with trace callbacks")
    p.add_argument("--top", type=int, default=28)
    p.add_argument("--rounds", type=int, default=None, help="rounds of the timings (3; 1 with --quick)")
    p.add_argument("--statements", action="store_true", help="time each kind of statement alone")
    p.add_argument("--segments", action="store_true",
                   help="time each statement of gpu_overhead's loops inside the loop")
    args = p.parse_args(argv)
    import torch
    if not torch.cuda.is_available():
        print("no GPU: nothing to measure")
        return 0
    from torch.utils._python_dispatch import TorchDispatchMode

    import racecheck

    class NoopMode(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    iters = 100 if args.quick else 400
    rounds = args.rounds or (1 if args.quick else 3)
    prims = _primitives(torch, 2000 if args.quick else 20000)
    from racecheck.core import native

    @contextlib.contextmanager
    def python_path():
        with native.using(False), racecheck.session(device="cuda", callbacks=False) as rc:
            yield rc

    @contextlib.contextmanager
    def checking_off():
        """racecheck's dispatch entry and wrappers with checking off: what it costs to be there"""
        with racecheck.session(device="cuda", callbacks=False) as rc:
            rc.recorder.checking = False
            yield rc

    statements = []
    if args.statements:
        statements = statement_costs(torch, {
            "plain": None, "noop-mode": NoopMode, "racecheck-off": checking_off,
            "racecheck": lambda: racecheck.session(device="cuda", callbacks=False)},
            rounds=2 if args.quick else 5, iters=500 if args.quick else 2000)
        print(f"{'statement':34s} {'plain':>8s} {'noop':>8s} {'rc off':>8s} {'racecheck':>10s} "
              f"{'+ over noop':>12s}  (µs per call; rc off: racecheck with checking off)")
        for name, t in statements:
            print(f"{name:34s} {t['plain']:8.2f} {t['noop-mode']:8.2f} {t['racecheck-off']:8.2f} "
                  f"{t['racecheck']:10.2f} {t['racecheck'] - t['noop-mode']:+12.2f}", flush=True)
    segments = {}
    if args.segments:
        segments = loop_segments(torch, {
            "plain": None, "noop-mode": NoopMode,
            "racecheck": lambda: racecheck.session(device="cuda", callbacks=False)},
            rounds=2 if args.quick else 3, iters=500 if args.quick else 2000)
        for loop, by_config in segments.items():
            print(f"{loop} loop, each statement's host time inside the loop, µs: median / mean")
            cfgs = list(by_config)
            print(f"{'statement':28s} " + " ".join(f"{c:>17s}" for c in cfgs) + "  rc-noop (mean)")
            for name in by_config[cfgs[0]]:
                v = [by_config[c][name] for c in cfgs]
                print(f"{name:28s} " + " ".join(f"{m:7.2f} / {a:7.2f}" for m, a in v)
                      + f"  {by_config['racecheck'][name][1] - by_config['noop-mode'][name][1]:+7.2f}")
            tot = [_total(by_config[c]) for c in cfgs]
            print(f"{'sum of means':28s} " + " ".join(f"{x:17.2f}" for x in tot), flush=True)
    configs = ["plain", "noop-mode", "racecheck"] + (["racecheck-py"] if native.built else [])
    samples: dict = {}
    for _ in range(rounds):
        for config in configs:
            ctx = {"plain": None, "noop-mode": NoopMode,
                   "racecheck": lambda: racecheck.session(device="cuda", callbacks=False),
                   "racecheck-py": python_path}[config]
            cm = ctx() if ctx else None
            entered = cm.__enter__() if cm is not None else None
            try:
                for name, fn in _workloads(torch).items():
                    samples.setdefault((name, config), []).append(_time(fn, iters, torch))
            finally:
                if cm is not None:
                    cm.__exit__(None, None, None)
            if config.startswith("racecheck"):
                assert not entered.internal_errors, entered.internal_errors
    profiles = {}
    breakdowns = {}
    for name in ("ops", "decode", "graph"):
        with racecheck.session(device="cuda", callbacks=False) as rc:
            fn = _workloads(torch)[name]
            _time(fn, 20, torch)
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(iters):
                fn()
            rc.findings                       # drain the queue: the checker's share is counted
            prof.disable()
        buf = io.StringIO()
        st = pstats.Stats(prof, stream=buf)
        parts = breakdown(st)
        buf.write(f"own time by component ({iters} iterations under cProfile):\n")
        for cat, t, share in parts:
            buf.write(f"  {cat:48s} {t * 1e6 / iters:8.1f} us/iter  {share:6.1%}\n")
        st.sort_stats("tottime").print_stats(args.top)
        profiles[name] = buf.getvalue()
        breakdowns[name] = [{"component": c, "us_per_iter_profiled": t * 1e6 / iters, "share": sh}
                            for c, t, sh in parts]
        if args.pstats:
            os.makedirs(args.pstats, exist_ok=True)
            st.dump_stats(os.path.join(args.pstats, f"{name}.pstats"))
    if args.callbacks:
        with racecheck.session(device="cuda", callbacks=True):
            for name, fn in _workloads(torch).items():
                samples.setdefault((name, "racecheck+callbacks"), []).append(_time(fn, iters, torch))
    print(f"device: {torch.cuda.get_device_name()}  torch {torch.__version__}  rounds {rounds}")
    print("primitive costs (µs per call):")
    for k, v in prims.items():
        print(f"  {k:34s} {v:7.2f}")
    rows = []
    for (name, config), xs in sorted(samples.items()):
        rows.append({"workload": name, "config": config, "us_per_iter": statistics.median(xs),
                     "rounds_us": xs})
    base = {(r["workload"], r["config"]): r["us_per_iter"] for r in rows}
    print(f"{'workload':8s} {'config':20s} {'us/iter':>9s} {'x plain':>8s} {'x noop':>7s}")
    for r in rows:
        w = r["workload"]
        r["x_plain"] = r["us_per_iter"] / base[(w, "plain")]
        r["x_noop"] = r["us_per_iter"] / base[(w, "noop-mode")]
        noop_rounds = samples.get((w, "noop-mode"), [])
        r["x_noop_rounds"] = [a / b for a, b in zip(r["rounds_us"], noop_rounds)]
        per_round = " ".join(f"{x:.2f}" for x in r["x_noop_rounds"])
        print(f"{w:8s} {r['config']:20s} {r['us_per_iter']:9.1f} {r['x_plain']:8.2f} {r['x_noop']:7.2f}"
              f"  [x noop per round: {per_round}]")
    for name, text in profiles.items():
        print(f"\n---- cProfile, racecheck `cuda`, workload {name}, {iters} iterations ----")
        print("\n".join(text.splitlines()[:args.top + 24]))
    if args.json:
        with open(args.json, "w") as fp:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                       "primitives_us": prims, "rows": rows, "breakdown": breakdowns,
                       "statements_us": dict(statements), "loop_segments_us": segments,
                       "profiles": profiles}, fp, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
