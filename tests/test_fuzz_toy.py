"""A tiny two-race scenario for the fuzzer's own tests (fast: a few milliseconds per run).

A side stream writes a batch buffer each iteration; the default stream accumulates it (RC001 on
`buf` without the event fix); the result goes to pinned memory with a non-blocking copy that the
host reads (RC004 on `h` without the sync fix). `register()` adds `toy-pipeline` to the registry;
test modules using it do so through the `toy_registered` fixture (module scope).
"""
from __future__ import annotations

import pytest
import torch

import racecheck
from racecheck import scenarios
from racecheck.scenarios.registry import Knob, Scenario, Switch, Variant

NMAX = 8


def parse_schedule(text):
    out = []
    for part in str(text).replace(" ", "").split(";"):
        if not part:
            continue
        it, rest = part.split(":+")
        count, _, life = rest.partition("x")
        out.append((int(it), int(count), int(life) if life else None))
    if not out:
        raise ValueError("empty schedule")
    return out


def _schedule(value):
    parse_schedule(value)
    return str(value)


def runner(cfg, ctx):
    dm = ctx.dm
    side = dm.Stream()
    ctx.name_stream(side, "side")
    buf = racecheck.name(torch.zeros(NMAX), "buf")
    acc = racecheck.name(torch.zeros(NMAX), "acc")
    ev = dm.Event()
    arrivals = parse_schedule(cfg["schedule"])
    live = []                                   # remaining lifetimes (None = to the horizon)
    for it in range(cfg["iterations"]):
        for a_it, count, life in arrivals:
            if a_it == it:
                live.extend([life] * count)
        live = live[:NMAX]
        n = len(live)
        if n:
            side.wait_stream(dm.current_stream())     # the previous accumulate read buf
            with dm.stream(side):
                buf[:n].fill_(float(it + 1))
            if cfg["event_fix"]:
                ev.record(side)
                dm.current_stream().wait_event(ev)
            acc[:n] += buf[:n]
        live = [x - 1 if x is not None else None for x in live]
        live = [x for x in live if x is None or x > 0]
    h = racecheck.name(torch.zeros(NMAX, pin_memory=ctx.pin), "h")
    h.copy_(acc, non_blocking=True)
    if cfg["d2h_sync"]:
        dm.current_stream().synchronize()
    vals = h.tolist()
    dm.synchronize()
    return {"acc": {str(i): vals[i] for i in range(NMAX)}}


SWITCHES = [Switch("event_fix", "toy", "buf", "RC001", "side stream event before the accumulate"),
            Switch("d2h_sync", "toy", "h", "RC004", "synchronize before reading the pinned result")]

KNOBS = [
    Knob("iterations", 3, "int", "iterations", minimum=1, maximum=8),
    Knob("schedule", "0:+2", "str", "arrivals ITER:+COUNT[xLIFE]", validator=_schedule),
    Knob("scale", "x1", "choice", "an irrelevant feature knob", choices=("x1", "x2")),
    Knob("event_fix", True, "bool", "fix switch"),
    Knob("d2h_sync", True, "bool", "fix switch"),
]

VARIANTS = [Variant("no-event_fix", {"event_fix": False}, [("RC001", "buf")], "no event"),
            Variant("no-d2h_sync", {"d2h_sync": False}, [("RC004", "h")], "no sync")]


def _reference(cfg):
    return dict(cfg, event_fix=True, d2h_sync=True)


def _strategy(sc, fixed, explore):
    """The toy's own draws: requests joining and finishing over the iterations."""
    from racecheck.scenarios.serving import schedules
    return schedules().map(lambda s: {k: v for k, v in s.items() if k not in fixed})


SCENARIO = Scenario("toy-pipeline", "two-stream toy for the fuzzer's tests", KNOBS, SWITCHES, VARIANTS,
                    runner=runner, resolve=lambda c: c, reference=_reference, diff_fields={},
                    strategy=_strategy, drawn_knobs=("iterations", "schedule"))


def register():
    """Add toy-pipeline to the registry (tests and their worker processes call this)."""
    scenarios.names()                           # load the built-in scenarios first
    scenarios._SCENARIOS[SCENARIO.name] = SCENARIO


def unregister():
    scenarios._SCENARIOS.pop(SCENARIO.name, None)


@pytest.fixture(scope="module", autouse=True)
def toy_registered():
    register()
    yield
    unregister()


def test_toy_variants_show_their_races_and_the_fixed_toy_is_clean():
    sc = scenarios.get("toy-pipeline")
    assert scenarios.run(sc, sc.config()).ok
    for v in sc.variants.values():
        got = scenarios.run(sc, sc.config(variant=v.name)).signature()
        assert set(map(tuple, v.expected)) <= got
