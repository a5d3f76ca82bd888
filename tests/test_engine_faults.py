"""The checker's C engine under failing allocations: every error path ends in an exception, not a crash.

Tests that compare the engine with the Python checker run the paths where every allocation
succeeds; the error paths (one per allocation: hash maps, records, clocks, the objects the export
builds, the Python it calls back) run only when memory runs out. CPython's _testcapi.set_nomemory
fails the k-th allocation from a point on, so each run here fails exactly one, k = 0, 1, 2, ...
until a run no longer reaches k: the engine must raise MemoryError (never return an error without
an exception, never crash), and what it made before the failure must go with it: the trace's events
end with the references they had (a record, an exported tuple or a context entry left behind holds
one), and so does a run the failure did not stop. Failures inside the Python the engine calls back
(the kit's classes, the RC005 hazard builder) are CPython's own error paths: only their exception
is checked, and the next run is measured from what they left (CPython 3.11 keeps the arguments of
a function whose closure cell fails to allocate on entry, the RC005 builder's _context among them).
Each run is measured after a collection, so that garbage cycles of the run before (a Checker and
its bound handlers) do not count; everything older than the loop is frozen out of the collector
so that a collection costs only what the run made. scripts/sanitize.sh runs this file under
AddressSanitizer, where a double free or a use after free on an error path is a report.
"""
from __future__ import annotations

import gc
import sys

import pytest

import racecheck
from racecheck.core import native
from racecheck.core.checker import Checker
from racecheck.core.fastchecker import _kit
from racecheck.core.trace import (Alloc, CapturedOp, EventRecord, Footprint, Free, GraphCapture,
                                  GraphReplay, Kernel, NameTensor, NameTimeline, StaleTolerant,
                                  StreamWaitEvent)

from cases import EXPECTED

_testcapi = pytest.importorskip("_testcapi")
pytestmark = pytest.mark.skipif(native.engine_built is None, reason="the C engine is not built here")

ST = (("/eng/model.py", 1, "step"),)


def _case(name):
    with racecheck.session(device="sim", record_trace=True) as rc:
        keep = EXPECTED[name][0](rc.device_module, "cpu")  # noqa: F841 - tensors outlive the snippet
    return list(rc.trace.events)


def _hazard_and_graph():
    """An RC005 hazard the engine keeps open (the reference code builds it through a callback),
    names, a stale-tolerant declaration and a graph replayed twice, then a race (the export)."""
    x, y, z = Footprint(7, ((0, 32),)), Footprint(8, ((0, 32),)), Footprint(9, ((0, 16),))
    op = CapturedOp((y,), (z,), "mm", ST)
    return [NameTimeline(0, 0, "host", True), NameTimeline(0, 1, "main"), NameTimeline(0, 2, "side"),
            Alloc(0, 7, 1, 32), NameTensor(0, 7, 0, 32, "kv", 8, 4), StaleTolerant(0, 8, 16, 32),
            Kernel(0, 1, (), (x, y), "fill", ST), EventRecord(0, 5, 1, ST),
            StreamWaitEvent(0, 2, 5, ST), Kernel(0, 2, (x,), (), "gather", ST), Free(0, 7, ST),
            GraphCapture(0, 3, (op,), ST), GraphReplay(0, 3, 1, ST),
            Kernel(0, 1, (), (Footprint(8, ((0, 16),)),), "refill", ST), GraphReplay(0, 3, 1, ST),
            Kernel(0, 2, (), (z,), "race", ST)]


# a race (the export), an RC005 hazard, record_stream, graphs replayed clean and racing
TRACES = dict({"hazard-and-graph": _hazard_and_graph},
              **{case: (lambda case=case: _case(case)) for case in ("P01", "P19", "P20", "P21", "P25")})


def _run(events, fail_at):
    """The engine on `events`, going on past each race as FastChecker's resume does (an export,
    the race applied, the Python's notes kept, frees watched), then its final export; allocation
    `fail_at` fails. The exception raised, or None when the run did not reach that allocation."""
    engine = native.engine_built.Engine(64, _kit())
    target = Checker.awaiting_export(64)
    it = iter(events)
    _testcapi.set_nomemory(fail_at, fail_at + 1)
    try:
        stop = engine.process_all(it, None)
        while stop is not None and engine.raced is stop:
            judge = Checker.awaiting_export(64)
            engine.export(judge)
            engine.apply(stop, None)
            for sh in judge._shadow.values():
                sh.seen = {("RC001", 0, 8)}
            engine.keep_seen(judge)
            engine.watch_frees([7, 8])
            stop = engine.process_all(it, None)
        engine.export(target)
        return None
    except BaseException as exc:   # noqa: BLE001 - any exception is the finding here
        return exc
    finally:
        _testcapi.remove_mem_hooks()


def _refs(events) -> list:
    return [sys.getrefcount(ev) for ev in events]


def _leaked(before, after) -> str:
    return ", ".join(f"event {i} {b} -> {a}" for i, (b, a) in enumerate(zip(before, after)) if a != b)


@pytest.fixture
def collector():
    """Explicit collections only, each over what was made since this point (gc.freeze)."""
    gc.collect()
    gc.freeze()
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()
        gc.unfreeze()


@pytest.mark.parametrize("name", sorted(TRACES))
def test_each_failing_allocation_raises_memory_error_and_leaks_nothing(name, collector):
    events = TRACES[name]()
    assert _run(events, 1 << 30) is None
    failures, k, quiet = 0, 0, 0
    while quiet < 50:       # past the last allocation a run makes, or one whose failure is handled
        gc.collect()        # the run before's garbage cycles (and at first the session's)
        before = _refs(events)
        exc = _run(events, k)
        checked = exc is None
        if exc is None:
            quiet += 1
        else:
            quiet = 0
            failures += 1
            assert isinstance(exc, MemoryError), f"allocation {k}: {exc!r}"
            checked = exc.__traceback__.tb_next is None     # not raised in Python the engine called
            del exc
        gc.collect()
        after = _refs(events)
        assert not checked or after == before, \
            f"allocation {k}: references to events leaked ({_leaked(before, after)})"
        k += 1
    assert failures > 50, "the failures did not reach the engine"
