"""One run of an sglang scenario: the process set up as sglang's server sets it up on the chosen
platform, then the front door (`server.serve`) with the run's request schedule."""
from __future__ import annotations

import contextlib
import os
import warnings

from . import surface
from .requests import parse_arrivals, phases, prompts
from .server import VOCAB, Arrival, Shape, patched, serve

# What sglang reads from the environment, per run (restored afterwards). The plan stream and
# spec v2 are server options sglang exposes as environment switches.
_SIM_ENV = {
    "TRITON_INTERPRET": "1",                            # Triton kernels in the CPU interpreter
    # the Rust radix tree core checks the real tensor device (the CPU) against the allocator's
    # routed cuda:0; sglang's Python tree core is the same tree
    "SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND": "python",
    # fused ops (rms norm, rotary, activation) take their torch implementations, as on a
    # platform without the CUDA extension
    "SGLANG_FORCE_FUSED_OP_BACKEND": "torch",
}
# On a GPU: the same, but sglang's Triton kernels compile for the device
_GPU_ENV = {k: v for k, v in _SIM_ENV.items() if k != "TRITON_INTERPRET"}


@contextlib.contextmanager
def gpu_platform_view():
    """On a GPU, sglang sees the platform a CPU run shows it: its own probes (`is_cuda()` reads
    `torch.version.cuda`, `is_hip()` `torch.version.hip`) say "not a CUDA/ROCm build" while it
    imports and runs. It then takes the paths it takes on sim (its Triton kernels, on the GPU
    now, and torch ops), not those that need its CUDA-only native packages (sgl_kernel,
    flashinfer, the JIT kernels), which a GPU runner without sglang's CUDA wheels lacks; and the
    platform branches racecheck models come from the flavour (`platform.py`), as on sim, with
    the WAR barrier through sglang's own switch. torch itself reads these two only at CUDA
    initialization (a capability warning) and in extension builds."""
    import torch
    old = (torch.version.cuda, torch.version.hip)
    torch.version.cuda = torch.version.hip = None
    try:
        yield
    finally:
        torch.version.cuda, torch.version.hip = old


def import_sglang(gpu: bool) -> None:
    """Import sglang's scheduler as a run does (shims, environment, platform view): a caller that
    times the import apart (bench/gpu_sglang.py) calls this before the run."""
    from . import imports
    imports.install()
    with _environment(dict(_GPU_ENV if gpu else _SIM_ENV)), \
            (gpu_platform_view() if gpu else contextlib.nullcontext()):
        _import_quietly()


# What a sibling scenario adds to a run (sglang-hicache registers its own): `extension(cfg)` is
# None, or (a context manager around the run, `on_start(rc, scheduler)` once it is built).
RUN_EXTENSIONS: list = []


def reference_on_gpu() -> bool:
    """Whether a reference run (nothing instrumented) runs on this machine's GPU: a CUDA or ROCm
    machine, where a run routed through sim would see a CUDA build of torch and take sglang's
    CUDA-only paths."""
    import torch
    return torch.cuda.is_available()


def run_pipeline(cfg: dict, ctx) -> dict:
    """Under the caller's session (sim routing torch.cuda, or a real GPU); without one (the
    reference run) in a private sim session, or uninstrumented where a GPU is present."""
    if ctx.session is not None:
        return _run(cfg, ctx.session, gpu=ctx.session.device != "sim")
    from racecheck.session import active_session
    if active_session() is None and reference_on_gpu():            # a real GPU, uninstrumented
        return _run(cfg, None, gpu=True)
    import racecheck
    # routed through sim for sglang's CUDA code, its values only: nothing checks its events
    with racecheck.session(device="sim", route_cuda=True, check=False) as rc:
        return _run(cfg, rc, gpu=False)


def shape_of(cfg: dict) -> Shape:
    busiest = max(sum(g.count for g in phase) for phase in phases(parse_arrivals(cfg["arrivals"])))
    return Shape(speculative=cfg.get("speculative", True), topk=cfg.get("topk", 1),
                 steps=cfg.get("steps", 3), draft_tokens=cfg.get("draft_tokens", 4),
                 graphs=cfg["graphs"], graph_bs=list(cfg["graph_bs"]),
                 max_running=max(max(cfg["graph_bs"]), busiest),
                 seed=cfg["seed"], page_size=cfg.get("page_size", 1),
                 mrope=cfg.get("mrope", False), extra=dict(cfg.get("server_args") or {}))


def arrivals_of(cfg: dict) -> list:
    groups = parse_arrivals(cfg["arrivals"])
    phase_of = [g.phase for g in groups for _ in range(g.count)]
    return [Arrival(step, rid, prompt, new, phase) for (step, rid, prompt, new), phase in
            zip(prompts(groups, seed=cfg["seed"], shared_prefix=cfg["shared_prefix"],
                        vocab=VOCAB, prefix_len=cfg["prefix_len"],
                        families=cfg.get("families", 1)), phase_of)]


def _run(cfg: dict, rc, *, gpu: bool) -> dict:
    from .oracles import kv_cache, kv_tiers
    built, held = [], []
    with _engine(cfg, rc, gpu=gpu) as on_start:
        def started(scheduler):
            built.append(scheduler)
            on_start(scheduler)
        outputs, _info = serve(shape_of(cfg), arrivals_of(cfg), max_steps=cfg["max_steps"],
                               stop_token=cfg["stop_token"], on_start=started,
                               on_done=lambda scheduler: held.append(kv_tiers(scheduler)))
        kv = kv_cache(built[0]) if built else None
        tiers = held[0]() if held and held[0] is not None else None
    return {"output_ids": outputs, **({"kv_cache": kv} if kv is not None else {}),
            **({"kv_tiers": tiers} if tiers is not None else {})}


def serve_stretches(cfg: dict, rc, channel, *, shape: Shape, begin, end,
                    gpu: bool = False) -> None:
    """One engine of `cfg`'s shape serving request schedules from `channel` until it is closed
    (scenarios/sglang/reuse.py): sglang's event loop runs throughout, idle between schedules.
    `gpu`: on a real device (bench/gpu_sglang.py's interleaved stretches), `rc` may be None."""
    from .server import StretchFeeder

    def feeder(outputs, on_first):
        return StretchFeeder(outputs, channel, begin=begin, end=end, on_first=on_first)
    with _engine(cfg, rc, gpu=gpu) as on_start:
        serve(shape, [], max_steps=cfg["max_steps"], on_start=on_start, feeder=feeder)


@contextlib.contextmanager
def _engine(cfg: dict, rc, *, gpu: bool):
    """The process set up for sglang's scheduler of `cfg` (environment, imports, flavour,
    patches); yields the `on_start(scheduler)` hook the loop's first iteration calls."""
    if not gpu and not getattr(rc, "route_cuda", False):
        from racecheck.core.errors import UsageError
        raise UsageError("the sglang scenarios run sglang's CUDA code: on sim they need "
                         "torch.cuda routing (their default)")
    from . import imports, platform
    imports.install()
    env = dict(_SIM_ENV) if not gpu else dict(_GPU_ENV)
    if cfg.get("speculative", True):
        # spec v2 is always on from 0.5.14 (before: surface.SPEC_V2_SWITCH, below); the plan
        # streams are an option every release has, off by default
        env["SGLANG_ENABLE_OVERLAP_PLAN_STREAM"] = "1" if cfg.get("plan_stream", True) else "0"
    war_barrier = platform.WAR_BARRIER[cfg["flavour"]] or cfg.get("war_barrier") == "on"
    # is_cuda() is False on a CPU: the cuda flavour's barrier comes through sglang's own switch
    env["SGLANG_ENABLE_WAR_BARRIER"] = "1" if war_barrier else None
    with contextlib.ExitStack() as stack:
        stack.enter_context(_environment(env))
        if gpu:
            stack.enter_context(gpu_platform_view())
        stack.enter_context(_no_progress_bars())
        stack.enter_context(warnings.catch_warnings())
        # Triton's interpreter evaluates masked-off lanes too (inf - inf in attention masks)
        warnings.filterwarnings("ignore", category=RuntimeWarning, module="triton")
        surface.check_release()
        _import_quietly()
        missing = surface.missing()
        if missing:
            raise surface.mismatch(f"no {missing[0]}")
        if cfg.get("speculative", True) and surface.SPEC_V2_SWITCH.exists():
            # before 0.5.14: spec v2 behind sglang's own switch (off by default up to 0.5.10)
            stack.enter_context(_environment({"SGLANG_ENABLE_SPEC_V2": "1"}))
        stack.enter_context(platform.flavour(cfg["flavour"], graphs=cfg["graphs"]))
        starts = []
        for extension in RUN_EXTENSIONS:
            got = extension(cfg)
            if got is not None:
                context, on_start_too = got
                stack.enter_context(context)
                starts.append(on_start_too)
        if rc is not None:
            from .graph_inputs import declared_graph_inputs, padding_sites
            stack.enter_context(declared_graph_inputs())
            if rc.device == "sim":
                stack.enter_context(padding_sites(rc.sync_sites))
        if cfg.get("forward_delay_us"):
            stack.enter_context(_forward_delay(_delay(rc, gpu), cfg["forward_delay_us"]))
        if cfg.get("publish_delay_us"):
            stack.enter_context(_publish_delay(_delay(rc, gpu), cfg["publish_delay_us"]))

        # start-up is over when the loop first asks for requests: an execution-order plan
        # `from: serving` (the fuzzer's, for these scenarios) orders only the traffic
        executor = getattr(getattr(rc, "backend", None), "executor", None)

        def on_start(scheduler):
            if hasattr(executor, "serving"):
                executor.serving()
            if rc is not None:
                name_streams(rc, scheduler)
                for on_start_too in starts:
                    on_start_too(rc, scheduler)
        yield on_start


def name_streams(rc, scheduler) -> None:
    """The scheduler's streams under the names sglang gives them (`surface.STREAMS`), and
    tensors several objects hold under their owner's name (`surface.TENSORS`)."""
    import racecheck
    for label, paths in surface.STREAMS:
        for path in paths:
            obj = _attr_path(scheduler, path)
            if obj is not None:
                rc.name_stream(obj, label)
                break
    for label, path in surface.TENSORS:
        tensor = _attr_path(scheduler, path)
        if tensor is not None:
            racecheck.name(tensor, label)


def _attr_path(obj, path: str):
    for part in path.split("."):
        obj = getattr(obj, part, None)
    return obj


@contextlib.contextmanager
def _environment(values: dict):
    old = {k: os.environ.get(k) for k in values}
    for k, v in values.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextlib.contextmanager
def _no_progress_bars():
    """Graph-capture progress bars (tqdm) write to the terminal a checker's report goes to."""
    import tqdm.std
    init = tqdm.std.tqdm.__init__

    def quiet_init(self, *args, **kwargs):
        kwargs["disable"] = True
        init(self, *args, **kwargs)
    with patched(tqdm.std.tqdm, "__init__", quiet_init):
        yield


def _import_quietly() -> None:
    """sglang logs GPU probes it cannot make on a CPU while it imports; they are not the run's."""
    import logging
    previous = logging.root.manager.disable
    logging.disable(logging.WARNING)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            surface.ENTRY.get()
    finally:
        logging.disable(previous)


@contextlib.contextmanager
def _forward_delay(delay, us: int):
    """Hold the forward stream `us` before every batch sglang launches (`forward_delay_us`)."""
    Scheduler, name = surface.RUN_BATCH.owner_and_name()
    run_batch = surface.RUN_BATCH.get()

    def delayed_run_batch(scheduler, *args, **kwargs):
        delay(scheduler.forward_stream, us)
        return run_batch(scheduler, *args, **kwargs)
    with patched(Scheduler, name, delayed_run_batch):
        yield


@contextlib.contextmanager
def _publish_delay(delay, us: int):
    """Hold the stream that publishes seq_lens `us` right after `FutureMap.publish` recorded
    `publish_ready` (`publish_delay_us`): the schedule stream, which waits only for the
    publish, runs ahead of what the forward launches after it (the draft extend)."""
    if not surface.PUBLISH.exists():
        raise surface.mismatch("publish_delay_us needs FutureMap.publish (sglang 0.5.13 and "
                               "later)")
    import torch
    FutureMap, name = surface.PUBLISH.owner_and_name()
    publish = surface.PUBLISH.get()

    def held_publish(future_map, *args, **kwargs):
        out = publish(future_map, *args, **kwargs)
        delay(torch.get_device_module("cuda").current_stream(), us)
        return out
    with patched(FutureMap, name, held_publish):
        yield


def _delay(rc, gpu: bool):
    """Through the session (a GPU sleep, or a hold under sim's adversarial executor), or a
    calibrated sleep kernel on a GPU run without racecheck."""
    if rc is not None or not gpu:
        import racecheck
        return racecheck.delay
    import torch

    from racecheck.instrumentation.delays import Sleeper
    sleeper = Sleeper(torch.cuda, "cuda")
    sleeper.prepare(torch.cuda.current_device())
    return lambda stream, us: sleeper.sleep(stream, torch.cuda.current_device(), us)
