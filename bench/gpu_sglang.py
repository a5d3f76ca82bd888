"""The real sglang engine (the front door) on a GPU: what runs, findings, overhead.

    python3 bench/gpu_sglang.py --bundle BUNDLE --out OUT [--runs N] [--only NAME] [--profile]
                                [--profile-loop] [--thaw]
    python3 bench/gpu_sglang.py --device sim --out OUT --runs 1 --only "cuda, eager" --quick
    python3 bench/gpu_sglang.py --dry ...                      # print the plan, run nothing

sglang refuses a second `Scheduler` in one process, so every engine run here is one process:
a child forked from a parent that imported sglang without touching CUDA (the import is paid
once, a fork costs milliseconds), or, where the parent's import did initialize CUDA (a fork
would then be unsafe), a fresh `python3 bench/gpu_sglang.py --one SPEC` per run.

Per configuration (`CONFIGS`): one plain warm-up run (Triton compiles sglang's kernels for the
GPU into its on-disk cache), then N rounds of
  plain      the engine without racecheck;
  nothing    the engine under a do-nothing TorchDispatchMode (the floor of any dispatch-level
             tool);
  racecheck  the engine under racecheck `cuda` (findings; the triaged upstream races apart);
  observer   (on request, `--modes`) the engine under the op observer below Python's dispatch
             with stacks, its notes handed over at every `run_batch` (the floor of a per-op
             path without a dispatch mode; instrumentation/op_observer.py);
  observer-nostacks, observer-pruned  (on request) the same without stacks, and with
             RecordFunction off inside seen ops that nest (`prune`): its cost split;
  observer-discard  (on request) without stacks, its notes dropped in C instead of handed
             over (the floor of a per-op path whose notes never become Python objects);
each run timed by the front door's own clock: construction (model load, pools, graph capture)
apart from sglang's event loop, whose iterations (one `run_batch` each) are timed too: with
graphs on, the loop is the steady state of graph replays. `--profile` adds one racecheck run
per configuration under cProfile, its time split by component (racecheck's checker, its
interception, sglang, torch, Triton), and its whole profile in OUT/profile-CONFIG.pstats;
`--profile-loop` profiles that run from the loop's first `run_batch` on (no construction, no
capture: the steady state). `--interleaved ROUNDS` instead builds one engine per configuration
and serves the schedule as stretches of its running loop (the fuzzer's way,
scenarios/sglang/reuse.py), each stretch under one of --modes in turn, after a plain warm-up:
per-round ratios from one process. A racecheck session spans an engine, so `racecheck` in
--modes is a second engine, built and served the same stretches under one session: its
stretches over the first engine's plain ones (two processes, each in its steady state).

BUNDLE (a GPU machine without a package index; `scripts/gpu_bundle.sh` makes one): `sglang.txz`
(or .tgz: sglang's Python sources and its dist-info) and `wheels/` (its light dependencies, and
nvidia-ml-py: with NVML the parent
names the GPU without initializing CUDA, so runs can fork; the JSON's `parent` says what
happened), installed into BUNDLE/site, which goes
first on the path; the racecheck this process was given (PYTHONPATH, with its C code built)
next; the source tree last. Writes OUT/gpu_sglang.json and prints a table.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tarfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))

CONFIGS = [
    {"name": "cuda, eager", "scenario": "sglang-eagle-v2",
     "set": {"graphs": False, "flavour": "cuda"}},
    {"name": "cuda, graphs", "scenario": "sglang-eagle-v2",
     "set": {"graphs": True, "flavour": "cuda"}},
    {"name": "hip, graphs", "scenario": "sglang-eagle-v2",
     "set": {"graphs": True, "flavour": "hip"}},
    {"name": "overlap, graphs", "scenario": "sglang-overlap",
     "set": {"graphs": True, "flavour": "cuda"}},
]
QUICK = {"arrivals": "0:1x2"}                  # --quick: one short request (sim checks)
MODES = ("plain", "nothing", "racecheck")
OPTIONAL_MODES = ("observer", "observer-nostacks", "observer-pruned", "observer-discard")
OBSERVERS = {"observer": {"stacks": True}, "observer-nostacks": {"stacks": False},
             "observer-pruned": {"stacks": True, "prune": True},
             "observer-discard": {"stacks": False}}
DISCARDED = {"observer-discard"}           # notes dropped in C: no handover to Python


# -- the bundle -------------------------------------------------------------------------------

def install(bundle: str) -> str:
    site = os.path.join(bundle, "site")
    if os.path.isdir(os.path.join(site, "sglang")):
        return site
    os.makedirs(site, exist_ok=True)
    wheels = os.path.join(bundle, "wheels")
    found = sorted(os.path.join(wheels, f) for f in os.listdir(wheels) if f.endswith(".whl"))
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
                    "--no-compile", "--target", site, *found], check=False)
    for name in ("sglang.txz", "sglang.tgz"):
        path = os.path.join(bundle, name)
        if os.path.exists(path):
            with tarfile.open(path) as tf:
                tf.extractall(site)
            break
    return site


def child_env(site: str | None) -> dict:
    """A child's environment: the bundle first; then whatever racecheck this process was
    given (an install with its C code built); the source tree last, as a fallback."""
    inherited = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return dict(os.environ, PYTHONPATH=os.pathsep.join(
        ([site] if site else []) + [*inherited, os.path.dirname(HERE)]))


# -- one engine run (in its own process) ------------------------------------------------------

class _Steps:
    """Times each iteration of sglang's loop: a stamp at every `Scheduler.run_batch` call."""

    def __init__(self, on_first=None, each=None):
        self.stamps = []
        self.on_first = on_first
        self.each = each

    @contextlib.contextmanager
    def installed(self):
        from racecheck.scenarios.sglang import surface
        from racecheck.scenarios.sglang.server import patched
        owner, name = surface.RUN_BATCH.owner_and_name()
        run_batch = surface.RUN_BATCH.get()
        stamps = self.stamps

        def timed(scheduler, *args, **kwargs):
            if not stamps and self.on_first is not None:
                self.on_first()
            if self.each is not None:
                self.each()
            stamps.append(time.perf_counter())
            return run_batch(scheduler, *args, **kwargs)
        with patched(owner, name, timed):
            yield

    def summary(self) -> dict:
        gaps = [b - a for a, b in zip(self.stamps, self.stamps[1:])]
        late = gaps[len(gaps) // 2:]                 # the later half: decode, the steady state
        return {"batches": len(self.stamps),
                "step_median_ms": 1e3 * statistics.median(late) if late else None}


def _noop_mode():
    from torch.utils._python_dispatch import TorchDispatchMode

    class Nothing(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))
    return Nothing()


class _Commands:
    """The stretches' channel inside one process: commands in, replies kept."""

    def __init__(self, commands):
        self.commands = list(commands)
        self.replies: list = []

    def recv(self):
        return self.commands.pop(0) if self.commands else None

    def send(self, reply) -> None:
        self.replies.append(reply)


def _observer(mode: str):
    """(an observer of `mode`, its handover: the notes taken raw, or dropped in C), built and
    loaded before any clock starts."""
    from racecheck.instrumentation import op_observer
    mod = op_observer.load()
    return op_observer.Observer(**OBSERVERS[mode]), \
        mod.discard if mode in DISCARDED else mod.drain


def _mode_context(mode: str):
    """(context to enter for a stretch under `mode`, what to call before its clock stops)."""
    if mode == "nothing":
        return _noop_mode(), None
    if mode in OBSERVERS:      # handed over inside the timing, as the separate runs' `_Steps` do
        return _observer(mode)
    return contextlib.nullcontext(), None


def interleaved(spec: dict) -> dict:
    """One engine, the same request schedule served again and again as stretches of its running
    event loop (scenarios/sglang/reuse.py), each under one of `modes` in turn, `rounds` rounds
    after a plain warm-up stretch, caches flushed through sglang's own API between them. The
    ratios compare stretches seconds apart on one engine: runs in separate processes spread by
    up to a third on this loop. A racecheck session cannot be switched per stretch: `modes ==
    ["racecheck"]` is an engine of its own, built and run under one session, every stretch
    (its warm-up too) checked; its stretches are compared with another engine's plain ones."""
    import torch

    from racecheck import scenarios
    from racecheck.scenarios.sglang import engine_run, reuse
    device = spec.get("device", "cuda")
    modes = list(spec["modes"])
    checked = modes == ["racecheck"]
    out = {"mode": "interleaved", "modes": modes, "stretches": []}
    try:
        sc = scenarios.get(spec["scenario"])
        engine_run.import_sglang(gpu=device != "sim")
        cfg = sc.config(overrides=spec["set"])
        order = [modes[0] if checked else "plain"] + [
            m for r in range(spec["rounds"]) for m in modes[r % len(modes):] + modes[:r % len(modes)]]
        channel = _Commands({"mode": m, "round": (k - 1) // len(modes) if k else -1}
                            for k, m in enumerate(order))
        state: dict = {}
        dm = torch.get_device_module("cuda")
        profiler = None
        if checked and spec.get("profile"):       # the timed stretches only, warm-up apart
            import cProfile
            profiler = cProfile.Profile()

        def begin(scheduler, command):
            k = state["k"] = state.get("k", -1) + 1
            if profiler is not None and command["round"] >= 0:
                profiler.enable()
            context, state["before_stop"] = _mode_context(command["mode"])
            state["stack"] = contextlib.ExitStack()
            state["stack"].enter_context(context)
            state["command"] = command
            state["t0"] = time.perf_counter()
            return reuse.stretch_schedule(cfg, k)

        def end(scheduler, timed_out, tokens):
            if state["before_stop"] is not None:
                state["before_stop"]()
            dm.synchronize()
            seconds = time.perf_counter() - state["t0"]
            if profiler is not None:
                profiler.disable()
            state["stack"].close()
            reuse.flush_caches(scheduler)
            return dict(state["command"], seconds=seconds, timed_out=timed_out,
                        outputs=reuse.stretch_outputs(tokens, state["k"]))
        shape = engine_run.shape_of(cfg)
        if checked:
            import racecheck
            from racecheck.scenarios.registry import split_known
            with racecheck.session(device=device, **sc.session_options(cfg, device)) as rc:
                engine_run.serve_stretches(cfg, rc, channel, shape=shape, begin=begin, end=end,
                                           gpu=device != "sim")
            new, known = split_known(sc, rc.findings)
            out["findings"] = sorted({f"{f.rule} {f.tensor}" for f in new})
            out["known"] = len(known)
            if profiler is not None:
                out["profile"] = components(profiler)
                if spec.get("profile_file"):
                    profiler.dump_stats(spec["profile_file"])
        elif device == "sim":
            import racecheck
            with racecheck.session(device="sim", route_cuda=True, check=False) as rc:
                engine_run.serve_stretches(cfg, rc, channel, shape=shape, begin=begin, end=end)
        else:
            engine_run.serve_stretches(cfg, None, channel, shape=shape, begin=begin, end=end,
                                       gpu=True)
        out["stretches"] = channel.replies
    except BaseException as exc:           # noqa: BLE001 - report what did not run, and why
        import traceback
        out["error"] = f"{type(exc).__name__}: {exc}"[:600]
        out["traceback"] = traceback.format_exc()[-3000:]
    return out


def _stretches(rows: list, reference) -> dict:
    return {"n": len(rows), "seconds": statistics.median(r["seconds"] for r in rows),
            "outputs_differ": sum(r["outputs"] != reference for r in rows),
            "timed_out": sum(bool(r["timed_out"]) for r in rows)}


def interleaved_summary(got: dict, checked: dict | None = None) -> dict:
    """Per mode: stretch seconds (median) and the median of its per-round ratios to plain; with
    `checked` (the racecheck engine's stretches), racecheck's median stretch over plain's, two
    engines in turn (range: its fastest and slowest stretch over plain's median)."""
    rows = [r for r in got.get("stretches", []) if r.get("round", -1) >= 0]
    warm = [r for r in got.get("stretches", []) if r.get("round", -1) < 0]
    reference = warm[0]["outputs"] if warm else None
    plain = {r["round"]: r["seconds"] for r in rows if r["mode"] == "plain"}
    s = {}
    theirs = [r for r in (checked or {}).get("stretches", []) if r.get("round", -1) >= 0]
    if theirs and plain:
        base = statistics.median(plain.values())
        secs = sorted(r["seconds"] for r in theirs)
        s["racecheck"] = dict(_stretches(theirs, reference),
                              x_plain=statistics.median(secs) / base,
                              x_plain_range=[secs[0] / base, secs[-1] / base],
                              findings=checked.get("findings"), known=checked.get("known"),
                              across_engines=True)
    for m in got.get("modes", []):
        mine = [r for r in rows if r["mode"] == m]
        if not mine:
            continue
        ratios = sorted(r["seconds"] / plain[r["round"]] for r in mine if r["round"] in plain)
        s[m] = dict(_stretches(mine, reference),
                    x_plain=statistics.median(ratios) if ratios else None,
                    x_plain_range=[ratios[0], ratios[-1]] if ratios else None)
    return s


def one_run(spec: dict) -> dict:
    """One engine run: spec = {scenario, set, mode, device, profile?}. Never raises."""
    if spec["mode"] == "interleaved":
        return interleaved(spec)
    import torch

    from racecheck.core import native

    from racecheck import scenarios
    from racecheck.scenarios.registry import RunContext, _instrumented, split_known
    from racecheck.scenarios.sglang import server
    out = {"mode": spec["mode"], "c_hot_path": native.speedups is not None,
           "c_engine": native.checker_engine() is not None}
    device = spec.get("device", "cuda")
    try:
        from racecheck.scenarios import fresh
        from racecheck.scenarios.sglang.engine_run import import_sglang
        sc = scenarios.get(spec["scenario"])
        if spec.get("thaw"):
            fresh.FREEZE_INHERITED = False
        elif "sglang" not in sys.modules:     # a new interpreter starts as `racecheck run`'s do
            fresh.begin_engine_process(sc)
        import_sglang(gpu=device != "sim")    # as a run imports it (a no-op once imported)
        cfg = sc.config(overrides=spec["set"])
        profiler = None
        if spec.get("profile"):
            import cProfile
            profiler = cProfile.Profile()
        observer = drain = None
        if spec["mode"] in OBSERVERS:
            observer, drain = _observer(spec["mode"])
        steps = _Steps(on_first=profiler.enable if spec.get("profile") == "loop" else None,
                       each=drain)
        server.TIMINGS.clear()
        t0 = time.perf_counter()
        with steps.installed():
            if spec["mode"] == "racecheck":
                if profiler is not None and spec["profile"] != "loop":
                    profiler.enable()
                try:
                    res = _instrumented(sc, cfg, device, 0, sc.session_options(cfg, device))
                finally:
                    if profiler is not None:
                        profiler.disable()
                outputs = res.outputs
                new, known = split_known(sc, res.findings)
                out["findings"] = sorted({f"{f.rule} {f.tensor}" for f in new})
                out["known"] = sorted({f"{f.rule} {f.tensor}" for f in known})
                out["details"] = [{"message": f.message(), "fix": f.suggestion}
                                  for f in new[:4]]
                out["internal_errors"] = [e.splitlines()[0] for e in res.internal_errors]
                out["events"] = res.stats.get("events")
                out["engine"] = res.engine
            else:
                ctx = RunContext(None, device if device != "sim" else "cpu", None,
                                 pin=device != "sim")
                mode = _noop_mode() if spec["mode"] == "nothing" else (
                    observer if observer is not None else contextlib.nullcontext())
                with mode:
                    outputs = sc.run_once(cfg, ctx)
        if device != "sim":
            torch.cuda.synchronize()
        out["run_s"] = time.perf_counter() - t0
        out.update({k: server.TIMINGS.get(k) for k in ("construction", "loop", "iterations")})
        out.update(steps.summary())
        out["outputs"] = outputs
        if profiler is not None:
            out["profile"] = components(profiler)
            if spec.get("profile_file"):            # callers and all: `python -m pstats FILE`
                profiler.dump_stats(spec["profile_file"])
    except BaseException as exc:           # noqa: BLE001 - report what did not run, and why
        import traceback
        out["error"] = f"{type(exc).__name__}: {exc}"[:600]
        out["traceback"] = traceback.format_exc()[-3000:]
    return out


_COMPONENTS = [   # (component, substrings of a function's file path), first match wins
    ("racecheck checker", ("racecheck/core/checker/", "racecheck/core/fastchecker.py", "racecheck/core/clocks.py",
                           "racecheck/core/rules.py", "racecheck/core/shadow.py", "racecheck/core/recorder.py",
                           "racecheck/core/findings.py", "racecheck/core/sourcenames.py",
                           "racecheck/core/suppressions.py")),
    ("racecheck interception", ("racecheck/instrumentation/", "/instrumentation/",
                                "racecheck/session.py", "racecheck/core/native.py")),
    ("racecheck other", ("racecheck/",)),
    ("sglang", ("/sglang/",)),
    ("triton", ("/triton/",)),
    ("torch", ("/torch/",)),
]


def components(profiler) -> dict:
    """Own time (tottime) per component, and the top functions."""
    import pstats
    stats = pstats.Stats(profiler)
    split, top = {}, []
    for (path, line, fn), (_cc, _nc, tt, _ct, _callers) in stats.stats.items():
        comp = "built-ins and C" if path.startswith("~") or path.startswith("<") else "other"
        for name, keys in _COMPONENTS:
            if any(k in path for k in keys):
                comp = name
                break
        split[comp] = split.get(comp, 0.0) + tt
        top.append((tt, f"{os.path.basename(path)}:{line}({fn})", comp))
    top.sort(reverse=True)
    return {"seconds": {k: round(v, 4) for k, v in sorted(split.items(), key=lambda kv: -kv[1])},
            "top": [{"s": round(t, 4), "fn": f, "component": c} for t, f, c in top[:25]]}


# -- the parent: one process per run ----------------------------------------------------------

_PARENT: dict = {}          # why the parent's import could (not) be forked from: in the JSON


@contextlib.contextmanager
def _first_cuda_init(torch):
    """Where CUDA was first initialized while the parent imported sglang (the stack), if it
    was: what to fix so that runs can fork."""
    original = torch.cuda._lazy_init

    def noted():
        if "cuda_init" not in _PARENT and not torch.cuda.is_initialized():
            import traceback
            _PARENT["cuda_init"] = [ln.strip() for ln in traceback.format_stack(limit=12)[:-1]]
        return original()
    torch.cuda._lazy_init = noted
    try:
        yield
    finally:
        torch.cuda._lazy_init = original


@contextlib.contextmanager
def _name_without_cuda_init(torch, device: str):
    """sglang's platform discovery asks for the device's name at import
    (`torch.cuda.get_device_name`), which initializes CUDA, after which a forked child cannot
    use the GPU: in the parent, the name comes from NVML instead (no CUDA context)."""
    if device == "sim":
        yield
        return
    try:
        import pynvml
        pynvml.nvmlInit()
    except Exception as exc:                # noqa: BLE001 - no NVML: CUDA is initialized
        _PARENT["nvml"] = f"unavailable ({type(exc).__name__}: {exc}); put nvidia-ml-py in wheels/"
        yield
        return
    _PARENT["nvml"] = "used"

    def name(dev=None):
        index = getattr(dev, "index", dev)
        handle = pynvml.nvmlDeviceGetHandleByIndex(int(index or 0))
        got = pynvml.nvmlDeviceGetName(handle)
        return got.decode() if isinstance(got, bytes) else got
    original = torch.cuda.get_device_name
    torch.cuda.get_device_name = name
    try:
        yield
    finally:
        torch.cuda.get_device_name = original


class Runner:
    """Runs `one_run` specs one engine per process: forked from this process when it imported
    sglang without initializing CUDA, else a fresh interpreter per run."""

    def __init__(self, device: str, site: str | None, fork: bool = True):
        self.device = device
        self.site = site
        self.import_s = None
        self.how = "subprocess"
        self.runs = 0
        self.fork_error = None
        if fork and hasattr(os, "fork"):
            t0 = time.perf_counter()
            if site:
                sys.path.insert(0, site)
            os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")  # probe without init
            import torch

            from racecheck.scenarios.sglang.engine_run import import_sglang
            with _name_without_cuda_init(torch, device), _first_cuda_init(torch):
                import_sglang(gpu=device != "sim")
            self.import_s = time.perf_counter() - t0
            if device == "sim" or not torch.cuda.is_initialized():
                self.how = "fork"

    def run(self, spec: dict) -> dict:
        spec = dict(spec, device=self.device)
        t0 = time.perf_counter()
        if self.how == "fork":
            from racecheck.scenarios import fresh
            try:
                got = fresh.call(one_run, spec)
            except Exception as exc:       # noqa: BLE001 - a child that died
                got = {"mode": spec["mode"], "error": f"{type(exc).__name__}: {exc}"}
            self.runs += 1
            if self.runs == 1 and "error" in got and "cuda" in got["error"].lower():
                # the parent's import left CUDA state a forked child cannot use: fresh
                # interpreters from now on
                self.fork_error = got["error"]
                self.how = "subprocess"
                return self.run(spec)
        else:
            p = subprocess.run([sys.executable, os.path.abspath(__file__), "--one",
                                json.dumps(spec)], capture_output=True, text=True,
                               env=child_env(self.site))
            lines = [ln for ln in p.stdout.splitlines() if ln.startswith("@@run ")]
            got = json.loads(lines[-1][6:]) if lines else {
                "mode": spec["mode"], "error": f"exit {p.returncode}: {p.stderr[-1500:]}"}
        got["process_s"] = time.perf_counter() - t0
        return got


def plan(configs: list, runs: int, profile, modes=MODES) -> list:
    """[(config, spec)] in run order: a warm-up, then rounds of every mode, then profiles."""
    out = []
    for c in configs:
        base = {"scenario": c["scenario"], "set": c["set"]}
        out.append((c, dict(base, mode="plain", warmup=True)))
        for _ in range(runs):
            out.extend((c, dict(base, mode=m)) for m in modes)
        if profile:
            out.append((c, dict(base, mode="racecheck", profile=profile)))
    return out


def summarize(c: dict, rows: list) -> dict:
    s = {"name": c["name"], "scenario": c["scenario"], "set": c["set"]}
    warm = [r for r in rows if r.get("warmup")]
    timed = [r for r in rows if not r.get("warmup") and not r.get("profiled")]
    reference = (warm[0] if warm else {}).get("outputs")
    s["errors"] = sorted({r["error"] for r in rows if "error" in r})
    for m in MODES + OPTIONAL_MODES:
        ok = [r for r in timed if r["mode"] == m and "error" not in r]
        if not ok:
            continue
        s[m] = {k: statistics.median(r[k] for r in ok)
                for k in ("construction", "loop", "step_median_ms", "run_s") if ok[0].get(k)
                is not None}
        s[m]["n"] = len(ok)
        s[m]["outputs_differ"] = sum(r["outputs"] != reference for r in ok)
    rc = [r for r in timed if r["mode"] == "racecheck" and "error" not in r]
    if rc:
        s["findings"] = rc[0]["findings"]
        s["known"] = rc[0]["known"]
        s["events"] = rc[0].get("events")
        s["engine"] = rc[0].get("engine")
        s["c_hot_path"], s["c_engine"] = rc[0]["c_hot_path"], rc[0]["c_engine"]
        s["internal_errors"] = rc[0]["internal_errors"]
    prof = [r for r in rows if r.get("profiled") and "profile" in r]
    if prof:
        s["profile"] = prof[0]["profile"]
        s["profile_loop_s"] = prof[0].get("loop")
    for m in ("nothing", "racecheck") + OPTIONAL_MODES:
        if m in s and "plain" in s:
            for k in ("loop", "step_median_ms", "construction"):
                if s[m].get(k) and s["plain"].get(k):
                    s[m][f"{k}_x"] = round(s[m][k] / s["plain"][k], 3)
    return s


def table(data: dict) -> str:
    lines = [f"{data.get('gpu')}, torch {data.get('torch')}, sglang {data.get('sglang')}, "
             f"{data['runs']} rounds, runs by {data['how']} (import {data.get('import_s')}), "
             f"inherited objects {data.get('inherited')}",
             "| configuration | mode | construction s | loop s | step ms | loop x | step x | "
             "outputs differ |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for s in data["configs"]:
        for m in MODES + OPTIONAL_MODES:
            r = s.get(m)
            if r is None:
                continue
            lines.append(f"| {s['name']} | {m} | {r.get('construction', 0):.2f} | "
                         f"{r.get('loop', 0):.3f} | {r.get('step_median_ms') or 0:.2f} | "
                         f"{r.get('loop_x', '')} | {r.get('step_median_ms_x', '')} | "
                         f"{r['outputs_differ']}/{r['n']} |")
        lines.append(f"|  {s['name']} | findings {s.get('findings')} known {s.get('known')} "
                     f"events {s.get('events')} C {s.get('c_hot_path')}/{s.get('c_engine')} "
                     f"engine {s.get('engine')} "
                     f"errors {s['errors'][:2]} | | | | | | |")
        if "profile" in s:
            lines.append(f"|  {s['name']} | profile (loop {s.get('profile_loop_s')}) "
                         f"{s['profile']['seconds']} | | | | | | |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bundle", default=None)
    ap.add_argument("--out", default=".")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--only", default=None, help="configurations whose name has this")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--profile-loop", action="store_true", help="the profiled run from the "
                    "loop's first batch on")
    ap.add_argument("--modes", default=",".join(MODES), help="of " + ",".join(MODES + OPTIONAL_MODES))
    ap.add_argument("--device", default="cuda", choices=("cuda", "sim"))
    ap.add_argument("--quick", action="store_true", help="one short request per run")
    ap.add_argument("--no-fork", action="store_true", help="a fresh interpreter per run")
    ap.add_argument("--dry", action="store_true", help="print the run plan and stop")
    ap.add_argument("--thaw", action="store_true", help="engine processes leave what they "
                    "inherit in the collector's reach (scenarios/fresh.py), as before 2026-11-28")
    ap.add_argument("--interleaved", type=int, default=0, metavar="ROUNDS",
                    help="one engine per configuration, the schedule served ROUNDS times under "
                    "each of --modes in turn: ratios from one process (racecheck: an engine of its "
                    "own, against the first's plain stretches)")
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.one is not None:
        print("@@run " + json.dumps(one_run(json.loads(args.one))), flush=True)
        return 0
    configs = [dict(c, set=dict(c["set"], **(QUICK if args.quick else {}))) for c in CONFIGS
               if args.only is None or args.only in c["name"]]
    if args.interleaved:
        modes = [m for m in args.modes.split(",") if m != "racecheck"]
        steps = [(c, {"scenario": c["scenario"], "set": c["set"], "mode": "interleaved",
                      "modes": modes, "rounds": args.interleaved}) for c in configs]
        if "racecheck" in args.modes.split(","):     # an engine of its own, after plain's
            steps = [st for c, spec in steps for st in (
                (c, spec), (c, dict(spec, modes=["racecheck"],
                                    profile=bool(args.profile or args.profile_loop))))]
    else:
        steps = plan(configs, args.runs, "loop" if args.profile_loop else args.profile,
                     tuple(args.modes.split(",")))
    if args.thaw:
        steps = [(c, dict(spec, thaw=True)) for c, spec in steps]
    steps = [(c, dict(spec, profile_file=os.path.abspath(os.path.join(
        args.out, "profile-" + c["name"].replace(", ", "-") + ".pstats"))))
        if spec.get("profile") else (c, spec) for c, spec in steps]
    if args.dry:
        for c, spec in steps:
            print(f"{c['name']}: {json.dumps(spec)}")
        return 0
    site = install(args.bundle) if args.bundle else None
    if args.thaw:
        from racecheck.scenarios import fresh
        fresh.FREEZE_INHERITED = False
    runner = Runner(args.device, site, fork=not args.no_fork)
    import torch
    data = {"runs": args.runs, "how": runner.how, "import_s": runner.import_s,
            "inherited": "thawed" if args.thaw else "frozen",
            "device": args.device, "torch": torch.__version__, "configs": [],
            "gpu": torch.cuda.get_device_name() if args.device == "cuda" else "sim"}
    with contextlib.suppress(Exception):
        import importlib.metadata
        data["sglang"] = importlib.metadata.version("sglang")
    os.makedirs(args.out, exist_ok=True)
    rows: dict = {}
    for c, spec in steps:
        got = runner.run(spec)
        got.update({k: spec[k] for k in ("warmup",) if k in spec})
        if spec.get("profile"):
            got["profiled"] = True
        rows.setdefault(c["name"], []).append(got)
        brief = {k: got.get(k) for k in ("mode", "construction", "loop", "step_median_ms",
                                         "process_s", "findings", "error") if k in got}
        print(f"@@ {c['name']} {json.dumps(brief)[:500]}", flush=True)
        with open(os.path.join(args.out, "gpu_sglang.json"), "w") as fh:   # so far
            json.dump(dict(data, raw=rows, how=runner.how, fork_error=runner.fork_error,
                           parent=_PARENT), fh, default=str)
    if args.interleaved:
        data["interleaved"] = {c["name"]: interleaved_summary(
            rows[c["name"]][0], rows[c["name"]][1] if len(rows[c["name"]]) > 1 else None)
            for c in configs if c["name"] in rows}
        data["raw"] = rows
        with open(os.path.join(args.out, "gpu_sglang.json"), "w") as fh:
            json.dump(data, fh, indent=1, default=str)
        for name, per in data["interleaved"].items():
            errors = [r.get("error") for r in rows[name] if r.get("error")]
            print(f"{name}: " + ("; ".join(errors) if errors else ""))
            prof = [r.get("profile") for r in rows[name] if r.get("profile")]
            if prof:
                print(f"  racecheck's stretches profiled: {json.dumps(prof[0]['seconds'])}; top: "
                      + "; ".join(f"{t['fn']} {t['s']}" for t in prof[0]["top"][:12]))
            for m, r in per.items():
                print(f"  {m:20s} n={r['n']} {r['seconds']:.3f} s  x plain {r['x_plain']}"
                      f" {r['x_plain_range']}  outputs differ {r['outputs_differ']}"
                      f" timed out {r['timed_out']}"
                      + (f"  (another engine; findings {r['findings']}, {r['known']} triaged)"
                         if r.get("across_engines") else ""))
        return 0
    for c in configs:
        data["configs"].append(summarize(c, rows.get(c["name"], [])))
    data["raw"] = rows
    data["how"], data["fork_error"], data["parent"] = runner.how, runner.fork_error, _PARENT
    with open(os.path.join(args.out, "gpu_sglang.json"), "w") as fh:
        json.dump(data, fh, indent=1, default=str)
    print(table(data))
    return 0


if __name__ == "__main__":
    sys.exit(main())
