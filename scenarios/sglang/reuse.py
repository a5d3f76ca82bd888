"""One engine, many request schedules: the sglang scenarios' engine process for the fuzzer.

A fuzz example of `sglang-eagle-v2` (or `sglang-overlap`) is a request schedule, an executor
plan and the engine's shape. Building the engine (ServerArgs, `Scheduler.__init__`, graph
capture) costs most of a run, and a server builds it once and then serves traffic. So the fuzzer
(racecheck/drivers/fuzz/engines.py) keeps one engine process per *engine shape* — every knob
but the traffic knobs `STRETCH_KNOBS` — and feeds each example's schedule into its running event
loop, as a server sees one burst of traffic after another: a *stretch*.

A stretch starts when the loop, idle, takes the next schedule (`begin`: the example's executor
plan takes over from here, counted as it would be on a fresh engine); it ends when every request
finished and the scheduler is idle (`end`): the device is synchronized, the caches are flushed
through sglang's own `Scheduler.flush_cache` (what its `/flush_cache` endpoint calls), and the
reply holds the outputs and what the checker reported *during* the stretch. The checker keeps its
state across stretches: happens-before is cumulative, as on a server, and every stretch is
ordered after the last by its end's synchronization.

The serialized reference of the same shape is a second such process (`reference_engine`).
"""
from __future__ import annotations

import json
import time
from dataclasses import replace

# knobs that are traffic, not construction: they change per stretch on one engine
STRETCH_KNOBS = ("arrivals", "shared_prefix", "prefix_len", "stop_token", "max_steps")
# the knobs of the engine's shape the fuzzer draws (the others are held: flavour, drop_sync)
SHAPE_KNOBS = ("graphs", "graph_bs", "plan_stream", "war_barrier", "forward_delay_us",
               "publish_delay_us", "seed", "topk", "steps", "draft_tokens")
# the engine is built for this many running requests (at least), so that every drawn schedule
# fits one engine (strategy.py: 4 groups of 6 per phase); a busier schedule gets its own engine
RUNNING_REQUESTS = 24


def max_running(cfg: dict) -> int:
    from .engine_run import shape_of
    return max(shape_of(cfg).max_running, RUNNING_REQUESTS)


def engine_key(cfg: dict) -> str:
    """What the engine is built from: the example's knobs but the traffic, and its size."""
    shape = {k: v for k, v in cfg.items() if k not in STRETCH_KNOBS}
    shape["max_running"] = max_running(cfg)
    return json.dumps(shape, sort_keys=True, default=str)


def stretch_schedule(cfg: dict, stretch: int) -> dict:
    """What the engine serves as its `stretch`-th schedule (server.StretchFeeder's `begin`):
    the schedule's arrivals, their request ids made unique on the engine (`s3.r0`)."""
    from .engine_run import arrivals_of
    arrivals = [replace(a, rid=f"s{stretch}.{a.rid}") for a in arrivals_of(cfg)]
    return {"arrivals": arrivals, "max_steps": cfg["max_steps"], "stop_token": cfg["stop_token"]}


def stretch_outputs(tokens: dict, stretch: int) -> dict:
    """The `stretch`-th schedule's outputs, by the schedule's own request ids."""
    prefix = f"s{stretch}."
    return {"output_ids": {rid[len(prefix):]: list(ids) for rid, ids in sorted(tokens.items())
                           if rid.startswith(prefix)}}


def _command(state: dict, command: dict) -> dict:
    state["stretch"] = state.get("stretch", -1) + 1
    got = stretch_schedule(command["cfg"], state["stretch"])
    state["rids"] = sorted(a.rid for a in got["arrivals"])
    return got


def flush_caches(scheduler, device: str = "cuda") -> bool:
    """Synchronize, then sglang's own cache flush (radix tree, request and KV pools, the draft
    worker's pools), then synchronize again: what follows starts from empty caches. `device`:
    the device module sglang's work runs on (sim routes `cuda`; Ascend's is `npu`)."""
    import torch
    module = torch.get_device_module(device)
    module.synchronize()
    flush = getattr(scheduler, "flush_cache", None)
    ok = bool(flush()) if flush is not None else False
    module.synchronize()
    return ok


def _new_executor(rc, plan, state: dict):
    """The stretch's own adversarial executor in place of the last one (whose queues are empty:
    the last stretch ended synchronized). Its stream names and per-stream op counts are those a
    fresh engine has at its first request, so a plan's holds and change points mean in a
    stretch what they mean on a fresh engine."""
    from racecheck.instrumentation.adversarial import AdversarialExecutor
    backend = rc.backend
    old = backend.executor
    old.sync_all()
    if "startup_ops" not in state:
        state["startup_ops"] = {tid: st.nops for tid, st in old._streams.items()}
    new = AdversarialExecutor(dict(plan or {}, **{"from": "serving"}))
    new._names = dict(old._names)
    backend.executor = new
    new.bind(backend)
    for tid, n in state["startup_ops"].items():
        new._stream(tid).nops = n
    if plan is not None:
        new.serving()
    # without a plan the stretch runs in issue order throughout (never `serving()`), as a fresh
    # run without a plan runs on the eager executor: holds (a forward delay) change nothing
    return new


def instrumented_engine(channel, sc, cfg: dict, device: str) -> None:
    """The engine process of the fuzzer (scenarios/fresh.py `Server`): one racecheck session,
    one sglang scheduler, a stretch per request until the channel closes. On sim each stretch
    runs under its example's executor plan; on a GPU the device runs the ops (a plan has no
    hold on them; the drawn delays are the engine's own knobs)."""
    import racecheck
    from racecheck.instrumentation.adversarial import AdversarialExecutor

    from . import engine_run
    started = time.perf_counter()
    sim = device == "sim"
    options = sc.session_options(cfg, device)
    if sim:
        options["executor"] = AdversarialExecutor({"from": "serving"})
    state: dict = {}
    with racecheck.session(device=device, **options) as rc:
        def begin(scheduler, command):
            now = time.perf_counter()
            if "built" not in state:
                state["built"] = state["construction"] = now - started
            state["t0"] = now
            state["findings"] = len(rc.findings)
            state["internal"] = len(rc.internal_errors)
            state["executor"] = _new_executor(rc, command.get("plan"), state) if sim else None
            return _command(state, command)

        def end(scheduler, timed_out, tokens):
            t1 = time.perf_counter()
            flushed = flush_caches(scheduler, "npu" if device == "npu" else "cuda")
            rc.backend.executor.sync_all()
            findings = rc.findings[state["findings"]:]
            t2 = time.perf_counter()
            executor = state["executor"]
            return {"outputs": stretch_outputs(tokens, state["stretch"]), "findings": findings,
                    "internal_errors": list(rc.internal_errors[state["internal"]:]),
                    "executor": executor.export() if executor is not None else {},
                    "sync_sites": rc.sync_sites.sites(),
                    "unmatched_drops": rc.sync_sites.unmatched_drops(),
                    "stats": {"events": rc.checker.events_processed},
                    "stretch": state["stretch"], "timed_out": timed_out, "flushed": flushed,
                    "seconds": {"construction": state.pop("construction", 0.0),
                                "stretch": t1 - state["t0"], "end": t2 - t1}}
        engine_run.serve_stretches(cfg, rc, channel, shape=_shape(cfg),
                                   begin=begin, end=end, gpu=not sim)


def reference_engine(channel, sc, cfg: dict) -> None:
    """The serialized reference of the same shape: the reference configuration (nothing
    dropped) in issue order, its own process, the same stretches; on the GPU, uninstrumented,
    where a fresh run's reference runs there (`engine_run.reference_on_gpu`), else routed
    through sim."""
    import contextlib

    import racecheck

    from . import engine_run
    started = time.perf_counter()
    ref = sc.reference_config(cfg)
    state: dict = {}
    sim = not engine_run.reference_on_gpu()
    session = racecheck.session(device="sim", route_cuda=True, check=False) if sim \
        else contextlib.nullcontext()                # values only
    with session as rc:
        def begin(scheduler, command):
            now = time.perf_counter()
            if "built" not in state:
                state["built"] = state["construction"] = now - started
            state["t0"] = now
            return _command(state, command)

        def end(scheduler, timed_out, tokens):
            t1 = time.perf_counter()
            flushed = flush_caches(scheduler)
            return {"outputs": stretch_outputs(tokens, state["stretch"]),
                    "timed_out": timed_out, "flushed": flushed,
                    "seconds": {"construction": state.pop("construction", 0.0),
                                "stretch": t1 - state["t0"]}}
        engine_run.serve_stretches(ref, rc, channel, shape=_shape(ref),
                                   begin=begin, end=end, gpu=not sim)


def _shape(cfg: dict):
    from .engine_run import shape_of
    return replace(shape_of(cfg), max_running=max_running(cfg))
