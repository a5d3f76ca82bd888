"""The `npu` backend's real code path against the CPU stand-in of torch_npu.

The stand-in (`racecheck.instrumentation.npu_standin`) registers device type "npu" and `torch.npu`
for the whole process (PrivateUse1 cannot be unregistered, and it makes "npu" the current
accelerator), so everything runs in one child process and the tests read its results. Two module
variants are exercised: with torch_npu's trace registry (`_npu_trace` callbacks) and without it
(the backend's wrappers). The checks are written against a device module and also run on a real
GPU (`tests/test_cuda_cases.py`).

Debug the child directly:  python tests/test_npu_standin.py --worker [check-or-case ...]
"""
from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import threading
import traceback

import pytest
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import racecheck  # noqa: E402

from cases import EXPECTED  # noqa: E402
from helpers import messages, pairs  # noqa: E402

# trace: torch_npu's trace registry; wrappers: none (the backend's wrappers); lagged: trace, and
# an event's query() stays False a few polls after its record (deferred index footprints resolve late)
VARIANTS = ("trace", "wrappers", "lagged")


class Compat:
    """The cases call `dm.CUDAGraph()`; torch_npu names it `NPUGraph`."""

    def __init__(self, m):
        self._m = m

    def __getattr__(self, name):
        if name == "CUDAGraph" and not hasattr(self._m, "CUDAGraph"):
            name = "NPUGraph"
        return getattr(self._m, name)


class Ctx:
    """Where checks run: a device kind and (npu) the device module to pass to the session."""

    def __init__(self, device, module=None, variant=""):
        self.device = device
        self.module = module
        self.variant = variant

    def session(self, **kw):
        if self.module is not None:
            kw.setdefault("device_module", self.module)
        return racecheck.session(device=self.device, **kw)

    def dm(self, rc):
        return Compat(rc.device_module)

    def dev(self, index=0):
        return f"{self.device}:{index}"

    def device_count(self):
        return int(torch.get_device_module(self.device).device_count()) if self.module is None \
            else int(self.module.device_count())


def run_case(ctx, cid):
    program, expected = EXPECTED[cid]
    with ctx.session() as rc:
        keep = program(ctx.dm(rc), ctx.device)  # noqa: F841 - tensors outlive the snippet
    got = set(pairs(rc.findings))
    detail = ""
    if got != expected:
        detail = (f"got {sorted(got)}, expected {sorted(expected)}\n"
                  + messages(rc.findings))
    if rc.internal_errors:
        detail += "\ninternal errors:\n" + "\n".join(rc.internal_errors)
    return (got == expected and not rc.internal_errors), detail


def case_trace(ctx, cid, c_path: bool):
    """The case's recorded trace and findings (JSON), with racecheck's C code on or off."""
    import json as _json
    import re
    from racecheck.core import native
    with native.using(c_path), ctx.session(record_trace=True) as rc:
        keep = EXPECTED[cid][0](ctx.dm(rc), ctx.device)  # noqa: F841
    events = [_json.loads(re.sub(r"Thread-\d+", "Thread-N", _json.dumps(e.to_json())))
              for e in rc.trace.events]
    return events, [f.to_json() for f in rc.findings]


# -- backend checks (generic over the device module) ------------------------------------------------

CHECKS: dict = {}


def check(devices=("npu", "cuda")):
    def deco(fn):
        CHECKS[fn.__name__[len("check_"):]] = (fn, devices)
        return fn
    return deco


def _clean(rc):
    assert not rc.internal_errors, "\n".join(rc.internal_errors)
    assert not rc.findings, messages(rc.findings)


def _names_of_kernel_streams(rc, op):
    from racecheck.core.trace import Kernel, NameTimeline
    names = {}
    for ev in rc.trace.events:
        if isinstance(ev, NameTimeline):
            names[ev.timeline] = ev.name
    return [names.get(ev.stream) for ev in rc.trace.events if isinstance(ev, Kernel) and ev.op == op]


@check()
def check_default_stream_named(ctx):
    with ctx.session(record_trace=True) as rc:
        x = torch.zeros(8, device=ctx.device)
        x.mul_(3)
    assert _names_of_kernel_streams(rc, "mul_") == ["default"], _names_of_kernel_streams(rc, "mul_")
    _clean(rc)


@check()
def check_cpu_factory_is_host_work(ctx):
    """sglang's graph runners make CPU mirrors with torch.full(..., device="cpu") and refill them
    on the host: no kernel on a stream, so no RC004 against the host's own writes."""
    with ctx.session(record_trace=True) as rc:
        mirror = torch.full((8,), 1, dtype=torch.int64, device="cpu")
        plain = torch.zeros(8)
        mirror.fill_(2)
        plain.add_(1)
    assert _names_of_kernel_streams(rc, "full") == [], _names_of_kernel_streams(rc, "full")
    _clean(rc)


@check()
def check_second_device_streams(ctx):
    if ctx.device_count() < 2:
        return "skipped: one device"
    with ctx.session(record_trace=True) as rc:
        dm = ctx.dm(rc)
        x1 = racecheck.name(torch.zeros(8, device=ctx.dev(1)), "x1")
        dm.synchronize(1)
        x1.mul_(2)                         # current device is 0: runs on device 1's stream
        s0, s1 = dm.Stream(device=0), dm.Stream(device=1)
        assert rc.backend.stream_of(s0) != rc.backend.stream_of(s1)
        assert rc.backend.stream_of(dm.default_stream(0)) != rc.backend.stream_of(dm.default_stream(1))
        s1.wait_stream(dm.current_stream(1))
        with dm.stream(s1):
            x1.add_(1)
        y = x1 * 2  # noqa: F841         # device 1's default stream, unordered with s1
    assert _names_of_kernel_streams(rc, "mul_") == [f"{ctx.device}:1 default"]
    assert sorted(pairs(rc.findings)) == [("RC001", "x1")], messages(rc.findings)
    f = rc.findings[0]
    assert f"{ctx.device}:1 default" in f.streams, f.streams
    assert not rc.internal_errors, rc.internal_errors


@check()
def check_outputs_allocated_on_the_ops_stream(ctx):
    """A new output's storage comes from the caching allocator of its op's device and stream: an
    op on device 1 while device 0 is current allocates on device 1's stream (not the current
    device's)."""
    if ctx.device_count() < 2:
        return "skipped: one device"
    with ctx.session(record_trace=True) as rc:
        x1 = torch.ones(8, device=ctx.dev(1))
        ctx.dm(rc).synchronize(1)
        y1 = x1 * 2                        # noqa: F841
    from racecheck.core.trace import Alloc, Kernel
    events = list(rc.trace.events)
    mul = next(e for e in events if isinstance(e, Kernel) and e.op == "mul")
    out = mul.writes[0].storage
    alloc = next(e for e in events if isinstance(e, Alloc) and e.block == out)
    assert alloc.stream == mul.stream, (alloc, mul)
    assert rc.timeline_name(mul.stream) == f"{ctx.device}:1 default", rc.timeline_name(mul.stream)
    _clean(rc)


@check()
def check_event_query_is_acquire(ctx):
    with ctx.session() as rc:
        dm = ctx.dm(rc)
        s, e = dm.Stream(), dm.Event()
        x = torch.zeros(8, device=ctx.device)
        dm.synchronize()
        with dm.stream(s):
            x.add_(1)
        e.record(s)
        while not e.query():
            pass
        y = x * 2  # noqa: F841
    _clean(rc)


@check()
def check_reused_event_handle_is_a_new_event(ctx):
    """The runtime gives a destroyed event's handle to the next event created (CUDA does; the
    stand-in mimics it). A wait on the new event is ordered after its own record, not the old
    event's: an event per step, as engines make them, must stay clean."""
    with ctx.session() as rc:
        dm = ctx.dm(rc)
        s = dm.Stream()
        x = torch.zeros(8, device=ctx.device)
        s.wait_stream(dm.current_stream())
        handles = []
        for _ in range(4):
            e = dm.Event()
            with dm.stream(s):
                x.add_(1)
            e.record(s)
            dm.current_stream().wait_event(e)
            y = x * 2  # noqa: F841
            s.wait_stream(dm.current_stream())
            handles.append(getattr(e, "npu_event", None) or getattr(e, "cuda_event", None))
            del e
            gc.collect()
        dm.synchronize()
    _clean(rc)
    if ctx.device == "npu":
        assert len(set(handles)) == 1, f"the stand-in did not reuse the handle: {handles}"


@check()
def check_stream_query_is_acquire(ctx):
    with ctx.session() as rc:
        dm = ctx.dm(rc)
        s = dm.Stream()
        x = torch.zeros(8, device=ctx.device)
        dm.synchronize()
        with dm.stream(s):
            x.add_(1)
        while not s.query():
            pass
        y = x * 2  # noqa: F841
    _clean(rc)


@check()
def check_item_is_host_sync(ctx):
    with ctx.session() as rc:
        dm = ctx.dm(rc)
        s = dm.Stream()
        x = torch.zeros(8, device=ctx.device)
        dm.synchronize()
        with dm.stream(s):
            x.add_(1)
            v = x[0].item()  # noqa: F841  (the host waits for s)
        y = x * 2  # noqa: F841            (launched after the host learned s's work)
    _clean(rc)


@check()
def check_device_synchronize_forms(ctx):
    """The device's synchronize by keyword and positionally, and torch.accelerator's, are host
    syncs (with the trace off they reach racecheck only through its wrappers)."""
    forms = [lambda dm: dm.synchronize(device=0), lambda dm: dm.synchronize(0),
             lambda dm: dm.synchronize(f"{ctx.device}:0")]
    acc = getattr(torch, "accelerator", None)
    cur = acc.current_accelerator() if acc is not None else None
    if ctx.device == "cuda" and cur is not None and cur.type == "cuda":   # the stand-in's C++
        forms.append(lambda dm: torch.accelerator.synchronize())          # side cannot sync
    for sync in forms:
        with ctx.session() as rc:
            dm = ctx.dm(rc)
            s = dm.Stream()
            x = torch.zeros(8, device=ctx.device)
            dm.synchronize()
            with dm.stream(s):
                x.add_(1)
            sync(dm)
            y = x * 2  # noqa: F841            (launched after the host waited for the device)
        _clean(rc)


@check()
def check_blocking_d2h_is_host_sync(ctx):
    with ctx.session() as rc:
        x = torch.ones(8, device=ctx.device)
        x.add_(1)
        c = x.cpu()
        c.add_(1)                          # host work on the copy: after the blocking copy
        d = x.to("cpu")
        d.mul_(2)
    _clean(rc)


@check()
def check_nonblocking_d2h_read_early(ctx):
    with ctx.session() as rc:
        x = torch.ones(8, device=ctx.device)
        c = racecheck.name(x.to("cpu", non_blocking=True), "c")
        c.add_(1)                          # no sync: the copy may still be in flight
    assert ("RC004", "c") in pairs(rc.findings), messages(rc.findings)
    assert not rc.internal_errors, rc.internal_errors


@check()
def check_record_stream_reaches_runtime(ctx):
    before = torch.Tensor.record_stream
    with ctx.session() as rc:
        assert not hasattr(torch.Tensor.record_stream, "__wrapped__"), "sim-style patch left on"
        dm = ctx.dm(rc)
        s = dm.Stream()
        t = torch.ones(64, device=ctx.device)
        dm.synchronize()
        s.wait_stream(dm.current_stream())
        with dm.stream(s):
            u = t * 2  # noqa: F841
        t.record_stream(s)
        del t
    assert torch.Tensor.record_stream is before
    _clean(rc)


@check()
def check_sessions_back_to_back(ctx):
    for cid in ("P01", "P02", "P18", "P01"):
        ok, detail = run_case(ctx, cid)
        assert ok, f"{cid}: {detail}"
    # outside a session the runtime's callbacks reach nothing
    dm = torch.get_device_module(ctx.device) if ctx.module is None else ctx.module
    s, e = dm.Stream(), dm.Event()
    e.record(s)
    e.wait(dm.current_stream())
    e.synchronize()
    dm.synchronize()


@check()
def check_delay_plan_applied(ctx):
    plan = [{"stream": "plan_stream", "before_op": 1, "us": 100},
            {"stream": "default", "op": "mul", "us": 10}]
    with ctx.session(delay_plan=plan) as rc:
        dm = ctx.dm(rc)
        s = dm.Stream()
        rc.name_stream(s, "plan_stream")
        x = torch.zeros(8, device=ctx.device)
        dm.synchronize()
        with dm.stream(s):
            x.add_(1)
            x.add_(1)
        dm.current_stream().wait_stream(s)
        y = x * 2  # noqa: F841
    applied = [(name, op, us) for name, _k, op, us in rc.before_launch.plan.applied]
    assert applied == [("plan_stream", "add_", 100.0), ("default", "mul", 10.0)], applied
    _clean(rc)
    if ctx.module is not None:          # the stand-in logs what `_sleep` was asked for
        rate = ctx.module.CYCLES_PER_US
        sleeps = ctx.module.runtime.sleeps[-2:]
        assert [c for _d, _s, c in sleeps] == [int(100 * rate), int(10 * rate)], sleeps


@check()
def check_delay_api(ctx):
    with ctx.session() as rc:
        dm = ctx.dm(rc)
        s = dm.Stream()
        racecheck.delay(s, 50)
        racecheck.delay(None, 5)
    assert not rc.internal_errors, rc.internal_errors
    if ctx.module is not None:
        rate = ctx.module.CYCLES_PER_US
        assert ctx.module.runtime.sleeps[-2][2] == int(50 * rate)
        assert ctx.module.runtime.sleeps[-2][1] == s.stream_id


@check(devices=("npu",))
def check_sleep_calibration(ctx):
    from racecheck.instrumentation import delays
    rate = delays.calibrate(ctx.module, 0)
    assert abs(rate - ctx.module.CYCLES_PER_US) < 1e-6 * ctx.module.CYCLES_PER_US, rate


@check()
def check_captured_index_op(ctx):
    with ctx.session() as rc:
        dm = ctx.dm(rc)
        idx = torch.zeros(4, dtype=torch.int64, device=ctx.device)
        table = torch.arange(32, dtype=torch.float32, device=ctx.device).reshape(8, 4)
        out = torch.zeros(4, 4, device=ctx.device)
        g = dm.CUDAGraph()
        with dm.graph(g):
            out.copy_(table[idx])
        idx.copy_(torch.arange(4, device=ctx.device))
        g.replay()
        dm.synchronize()
        o = out.sum().item()
    assert o == float(table[:4].sum())
    _clean(rc)


@check()
def check_index_values_on_device_are_exact(ctx):
    with ctx.session() as rc:
        dm = ctx.dm(rc)
        s = dm.Stream()
        buf = racecheck.name(torch.zeros(64, 4, device=ctx.device), "buf")
        idx = torch.tensor([3, 9, 40], device=ctx.device)
        other = torch.tensor([4, 10], device=ctx.device)
        v = torch.ones(3, 4, device=ctx.device)
        dm.synchronize()
        with dm.stream(s):
            buf.index_put_((idx,), v)
            r = buf.index_select(0, other)  # noqa: F841  disjoint rows, same stream
        y = buf[other]  # noqa: F841                      disjoint rows: no race
        z = buf[torch.tensor([9], device=ctx.device)]  # noqa: F841   row 9: a race
    assert sorted(pairs(rc.findings)) == [("RC001", "buf")], messages(rc.findings)
    assert not rc.findings[0].approx, rc.findings[0].approx
    assert not rc.internal_errors, rc.internal_errors


@check()
def check_threads_each_with_stream(ctx):
    with ctx.session() as rc:
        dm = ctx.dm(rc)
        x = torch.zeros(8, device=ctx.device)
        dm.synchronize()
        done = threading.Event()

        def worker():
            s = dm.Stream()
            with dm.stream(s):
                x.add_(1)
            s.synchronize()
            done.set()

        th = threading.Thread(target=worker)
        th.start()
        th.join()
        assert done.is_set()
    assert not rc.internal_errors, rc.internal_errors
    # the worker synchronized its stream, but the main thread never joined that knowledge
    # except through join(): racecheck's thread-start edge only, so x's write is unordered.
    assert [f.rule for f in rc.findings] in ([], ["RC001"]), messages(rc.findings)


@check()
def check_reentrant_emit(ctx):
    """A runtime callback may fire while racecheck resolves or processes an event (a pinned buffer
    freed inside racecheck records an allocator event): it must queue, not re-enter."""
    import weakref

    from racecheck.core.trace import HostSync, Kernel
    with ctx.session(record_trace=True) as rc:
        x = torch.zeros(8, device=ctx.device)
        thread = rc.recorder.thread_tid()
        stream = rc.backend.current_stream_tid()

        class Token:
            pass

        for k in range(3):
            tok = Token()
            weakref.finalize(tok, lambda: rc.recorder.emit(HostSync(thread, "stream", stream)))
            polls = {"n": 0}

            def resolve(tok=tok, polls=polls, k=k):
                polls["n"] += 1
                if polls["n"] == 1:
                    return None                       # values not there yet
                if k == 2 and polls["n"] == 2:
                    rc.recorder.emit(HostSync(thread, "device", None))    # a callback during a resolve
                return Kernel(thread, stream, (), (), f"deferred{k}")
            rc.recorder.emit_pending(None, resolve)
            del tok, resolve                          # the resolver holds the last reference
            x.add_(1)                                 # queued behind the deferred event
            rc.recorder.flush_pending()                        # resolves; freeing the resolver emits
    assert not rc.internal_errors, "\n".join(rc.internal_errors)
    ops = [getattr(e, "op", None) for e in rc.trace.events if isinstance(e, Kernel)]
    assert [o for o in ops if o and o.startswith("deferred")] == ["deferred0", "deferred1", "deferred2"]


@check()
def check_index_snapshots_freed_by_refcount(ctx):
    """Device-side index snapshots hold host buffers: they must be released by reference counting
    (a garbage-collector pass freeing pinned memory inside a graph capture breaks the capture)."""
    import gc

    from racecheck.instrumentation.device import _DeferredFootprint
    gc.collect()
    was = gc.isenabled()
    gc.disable()
    try:
        with ctx.session() as rc:
            dm = ctx.dm(rc)
            s = dm.Stream()
            buf = torch.zeros(16, 4, device=ctx.device)
            idx = torch.tensor([1, 2], device=ctx.device)
            dm.synchronize()
            s.wait_stream(dm.current_stream())
            with dm.stream(s):
                for _ in range(5):
                    y = buf[idx]
                    buf.index_put_((idx,), y + 1)
            dm.synchronize()
        assert not rc.internal_errors, rc.internal_errors
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        leaked = [o for o in gc.garbage if isinstance(o, _DeferredFootprint)]
        gc.garbage.clear()
    finally:
        gc.set_debug(0)
        if was:
            gc.enable()
    assert not leaked, f"{len(leaked)} deferred footprints only freed by the cycle collector"


@check()
def check_wait_stream_is_one_edge(ctx):
    """`a.wait_stream(b)` is one StreamWaitStream, not the record and wait of the event torch
    makes for it (with trace callbacks the runtime reports those two instead), in the C wrapper
    and its Python reference alike; a failure to report it is racecheck's, not the program's."""
    from racecheck.core import native
    from racecheck.core.trace import EventRecord, StreamWaitEvent, StreamWaitStream
    kinds = (EventRecord, StreamWaitEvent, StreamWaitStream)
    callbacks = ctx.variant in ("trace", "lagged")
    for on in (True, False):
        with native.using(on), ctx.session(record_trace=True) as rc:
            dm = ctx.dm(rc)
            s = dm.Stream()
            x = torch.zeros(8, device=ctx.device)
            s.wait_stream(dm.current_stream())
            with dm.stream(s):
                x.add_(1)
            dm.current_stream().wait_stream(s)
            y = x * 2
            assert y.sum().item() == 16
        _clean(rc)
        got = [type(ev).__name__ for ev in rc.trace.events if isinstance(ev, kinds)]
        if callbacks:
            assert "StreamWaitStream" not in got and got.count("EventRecord") == 2, got
        else:
            assert got == ["StreamWaitStream"] * 2, (on, got)
        if callbacks:
            continue
        with native.using(on), ctx.session() as rc:
            dm = ctx.dm(rc)
            s = dm.Stream()
            rc.recorder.dead.append(None)       # racecheck's own state broken: emit fails
            s.wait_stream(dm.current_stream())
            assert rc.backend._tls.mute == 0, "the record and wait wrappers stay muted"
        assert len(rc.internal_errors) == 1, rc.internal_errors
        assert rc.internal_errors[0].startswith("in Stream.wait_stream wrapper"), rc.internal_errors


@check(devices=("npu",))
def check_replay_is_reported_once_launched(ctx):
    """A replay's event is made after its launch (its cost overlaps the graph's work); a launch
    that raises reports nothing; racecheck failing to report one is an internal error, never the
    program's. The C wrapper and its Python reference alike."""
    from racecheck.core import native
    from racecheck.core.trace import GraphReplay
    cls = ctx.module.NPUGraph
    real = cls.replay
    launched = []
    rc = None

    def spy(g):
        launched.append(rc.recorder.position)
        if getattr(g, "fail", False):
            raise RuntimeError("launch failed")
        return real(g)

    cls.replay = spy
    try:
        for on in (True, False):
            launched.clear()
            with native.using(on), ctx.session(record_trace=True) as rc:
                dm = ctx.dm(rc)
                x = torch.zeros(8, device=ctx.device)
                s = dm.Stream()
                s.wait_stream(dm.current_stream())
                g = dm.CUDAGraph()
                with dm.stream(s):
                    g.capture_begin()
                    x.add_(1)
                    g.capture_end()
                dm.current_stream().wait_stream(s)
                start = x.sum().item()
                g.replay()
                g.fail = True
                try:
                    g.replay()
                except RuntimeError as exc:
                    assert str(exc) == "launch failed"
                else:
                    raise AssertionError("the failed launch did not raise")
                del g.fail
                rc.recorder.dead.append(None)   # racecheck's own state broken: emit fails
                g.replay()
                assert x.sum().item() == start + 16, "a replay did not run"
            replays = [i for i, ev in enumerate(rc.trace.events) if isinstance(ev, GraphReplay)]
            # (a storage's Free may be queued ahead of it, never the replay ahead of the launch)
            assert len(launched) == 3 and len(replays) == 1 and replays[0] >= launched[0], \
                (on, replays, launched)
            assert len(rc.internal_errors) == 1, rc.internal_errors
            assert rc.internal_errors[0].startswith("in graph replay wrapper"), rc.internal_errors
    finally:
        cls.replay = real


@check(devices=("npu",))
def check_queued_events_are_checked_before_the_host_waits(ctx):
    """`synchronize()` checks the queued batch before it waits, while the device works."""
    if ctx.variant != "wrappers":
        return "with trace callbacks the runtime reports the wait before waiting"
    from racecheck.core import recorder
    m = ctx.module
    real = m.synchronize
    at = []
    rc = None

    def spy(device=None):
        at.append((rc.recorder.seq, rc.recorder.position))
        return real(device)

    m.synchronize = spy
    try:
        with ctx.session() as rc:
            x = torch.zeros(8, device=ctx.device)
            for _ in range(recorder.BATCH + 8):
                x.add_(1)
            ctx.dm(rc).synchronize()
    finally:
        m.synchronize = real
    _clean(rc)
    assert len(at) == 1 and at[0][0] == at[0][1], at


@check(devices=("npu",))
def check_busy_kernel_without_sleep(ctx):
    """A torch_npu without `_sleep` (older CANN): delays become a calibrated busy kernel."""
    from racecheck.instrumentation import npu_standin
    mod = npu_standin.make_module(trace=ctx.variant != "wrappers", name="npu_without_sleep")
    del mod._sleep
    before = len(ctx.module.runtime.sleeps)
    plan = [{"stream": "default", "op": "mul", "us": 20}]
    with racecheck.session(device="npu", device_module=mod, delay_plan=plan) as rc:
        x = torch.ones(8, device="npu")
        racecheck.delay(rc.device_module.current_stream(), 30)
        y = x * 2  # noqa: F841
    assert not rc.internal_errors, rc.internal_errors
    assert not rc.findings, [f.message() for f in rc.findings]
    assert len(ctx.module.runtime.sleeps) == before          # no sleep kernel was asked for
    assert rc.backend._sleeper._busy, "the busy kernel was not used"
    assert [op for _n, _k, op, _us in rc.before_launch.plan.applied] == ["mul"]


def _fill_on_side(dm, s, dev, n):
    with dm.stream(s):
        positions = torch.zeros(n, device=dev)
        positions.add_(1)
    return positions


def _use_on_default(t):
    return t * 2


@check()
def check_temporaries_named_from_their_statement(ctx):
    """A temporary nobody holds when its finding is read is named by the statement that made it,
    the same with the per-op C path on or off, and the same in every iteration (whatever its
    size): one finding per rule."""
    from racecheck.core import native
    seen = []
    for on in (True, False):
        with native.using(on), ctx.session() as rc:
            dm = ctx.dm(rc)
            s = dm.Stream()
            dm.synchronize()
            for n in (8, 16, 24):
                _use_on_default(_fill_on_side(dm, s, ctx.dev(), n))
            dm.synchronize()
        seen.append(sorted(pairs(rc.findings)))
    assert seen[0] == seen[1], seen
    assert {t for _r, t in seen[0]} == {"_fill_on_side: positions"}, seen
    assert [r for r, _t in seen[0]].count("RC001") == 1, seen


# -- the child process ------------------------------------------------------------------------------

def worker(selected) -> dict:
    from racecheck.instrumentation import npu_standin
    npu = npu_standin.install()
    ctxs = {"trace": Ctx("npu", npu, "trace"),
            "wrappers": Ctx("npu", npu_standin.make_module(trace=False), "wrappers"),
            "lagged": Ctx("npu", npu, "lagged")}
    out = {"cases": {}, "checks": {}}
    for variant, ctx in ctxs.items():
        npu.runtime.lag = 3 if variant == "lagged" else 0
        out["cases"][variant] = {}
        out["checks"][variant] = {}
        for cid in sorted(EXPECTED):
            if selected and cid not in selected:
                continue
            try:
                ok, detail = run_case(ctx, cid)
            except Exception:
                ok, detail = False, traceback.format_exc()
            out["cases"][variant][cid] = {"ok": ok, "detail": detail}
            if variant == "wrappers":
                # the device backend's C code (plans, wrappers) against the Python it ports
                try:
                    (ce, cf), (pe, pf) = [case_trace(ctx, cid, on) for on in (True, False)]
                    same = ce == pe and cf == pf
                    detail = "" if same else f"C path trace/findings differ:\n{ce}\n{pe}\n{cf}\n{pf}"
                except Exception:
                    same, detail = False, traceback.format_exc()
                out.setdefault("native", {})[cid] = {"ok": same, "detail": detail}
        for name, (fn, devices) in CHECKS.items():
            if "npu" not in devices or (selected and name not in selected):
                continue
            try:
                note = fn(ctx)
                out["checks"][variant][name] = {"ok": True, "detail": note or ""}
            except Exception:
                out["checks"][variant][name] = {"ok": False, "detail": traceback.format_exc()}
    return out


_MARK = "RACECHECK-NPU-STANDIN-RESULTS "


@pytest.fixture(scope="module")
def results():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (HERE, env.get("PYTHONPATH", "")) if p)
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker"],
                          capture_output=True, text=True, timeout=900, env=env, cwd=HERE)
    for line in proc.stdout.splitlines():
        if line.startswith(_MARK):
            return json.loads(line[len(_MARK):])
    pytest.fail(f"the stand-in child failed (exit {proc.returncode}):\n{proc.stdout[-4000:]}\n"
                f"{proc.stderr[-4000:]}")


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("case", sorted(EXPECTED))
def test_public_case_on_npu_standin(results, variant, case):
    r = results["cases"][variant][case]
    assert r["ok"], r["detail"]


@pytest.mark.parametrize("case", sorted(EXPECTED))
def test_device_backend_c_path_records_the_python_trace(results, case):
    """On the device backend's wrapper path, the C plans and wrappers record the same trace and
    findings as the Python they port."""
    r = results["native"][case]
    assert r["ok"], r["detail"]


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("name", sorted(n for n, (_f, d) in CHECKS.items() if "npu" in d))
def test_npu_backend_on_standin(results, variant, name):
    r = results["checks"][variant][name]
    assert r["ok"], r["detail"]


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--worker"]
    res = worker(set(args))
    bad = [(v, k, r["detail"]) for part in ("cases", "checks") for v, d in res[part].items()
           for k, r in d.items() if not r["ok"]]
    for v, k, d in bad:
        print(f"FAIL {v} {k}\n{d}", file=sys.stderr)
    print(_MARK + json.dumps(res))
