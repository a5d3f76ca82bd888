"""Delay injection: `racecheck.delay(stream, us)` and delay plans, on every backend.

A delay holds a stream back before its next launch. Races show up as wrong values when the
*producer* is late: put delays before producers (a delay before the consumer hides a race).

Delay plan
----------
A list of holds, the format the sim adversarial executor's plan uses for its `holds`:

    [{"stream": "plan_stream", "before_op": 3, "us": 200},   # before the 4th launch on plan_stream
     {"stream": "default", "op": "index_put_", "us": 50},     # before every index_put_ on default
     {"stream": "#1", "op": "graph_replay", "us": 80}]        # "#k": the k-th stream the backend saw

`stream` is a stream's session name (`rc.name_stream(s, "plan_stream")`, "default") or "#k"
(#0 is the default stream); exactly one of `before_op` (0-based count of launches on that stream:
kernels, copies and graph replays) and `op` (the ATen op name, "copy_", or "graph_replay"; every
occurrence) is given; `us` is the length in microseconds. A whole executor plan (a dict with a
"holds" key) is accepted too. `racecheck.session(..., delay_plan=plan)` applies it through
`Session.before_launch`:

* sim: `executor.delay(stream, us)`, a hold in the adversarial executor's virtual time (the eager
  executor runs everything at issue, so there a delay changes nothing);
* cuda (NVIDIA and ROCm): `torch.cuda._sleep(cycles)` on the stream, cycles per microsecond
  calibrated per device with events (the rate differs between GPUs, and ROCm's gfx11 counts a
  constant-rate wall clock);
* npu: `torch_npu.npu._sleep(cycles)` where CANN provides it (aclnnSleep), calibrated the same way;
  a calibrated busy kernel (repeated small matmuls on a private buffer) otherwise.

Launches made while a graph is being captured count, but are never delayed: a sleep queued then
would either become part of the graph (every replay slowed) or break the capture; hold a graph's
work back with an `op: "graph_replay"` hold instead.

Warm every kernel before a delayed run (`warm_up(program)`): the first launch of a kernel that
is not loaded yet serializes streams and can hide the race the delay should expose.
"""
from __future__ import annotations

import os
import threading

import torch

from racecheck.core.errors import UsageError

__all__ = ["DelayPlan", "DelayPlanError", "normalize_holds", "Sleeper", "calibrate", "warm_up",
           "DEFAULT_CYCLES_PER_US"]

DEFAULT_CYCLES_PER_US = 1000.0       # used only when calibration is impossible
_RATES: dict = {}                    # (module name, device index) -> cycles per microsecond
_RATES_LOCK = threading.Lock()


class DelayPlanError(UsageError):
    """A malformed delay plan."""


def _number(v, what):
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise DelayPlanError(f"{what} must be a number, got {v!r}")
    return v


def normalize_holds(plan) -> list:
    """Validate a delay plan; return its holds in canonical form (raises DelayPlanError)."""
    if plan is None:
        return []
    if isinstance(plan, str):
        import json
        try:
            plan = json.loads(plan)
        except ValueError as exc:
            raise DelayPlanError(f"a delay plan given as text must be JSON: {exc}") from None
    if isinstance(plan, dict):
        if "holds" not in plan:
            raise DelayPlanError("a delay plan is a list of holds, or an object with a 'holds' list")
        plan = plan["holds"]
    if not isinstance(plan, (list, tuple)):
        raise DelayPlanError(f"a delay plan is a list of holds, got {type(plan).__name__}")
    out = []
    for h in plan:
        if not isinstance(h, dict) or "stream" not in h or "us" not in h:
            raise DelayPlanError("a hold is {'stream': S, 'before_op': K | 'op': NAME, 'us': N}, "
                                 f"got {h!r}")
        unknown = set(h) - {"stream", "before_op", "op", "us"}
        if unknown:
            raise DelayPlanError(f"unknown keys in hold {h!r}: {', '.join(sorted(unknown))}")
        if ("before_op" in h) == ("op" in h):
            raise DelayPlanError(f"a hold names exactly one of 'before_op' and 'op': {h!r}")
        stream = h["stream"]
        if isinstance(stream, bool) or not isinstance(stream, (str, int)):
            raise DelayPlanError(f"a hold's 'stream' is a name or '#k', got {stream!r}")
        hh = {"stream": f"#{stream}" if isinstance(stream, int) else str(stream),
              "us": float(_number(h["us"], "a hold's 'us'"))}
        if hh["us"] < 0:
            raise DelayPlanError(f"a hold's 'us' must be >= 0: {h!r}")
        if "before_op" in h:
            k = _number(h["before_op"], "a hold's 'before_op'")
            if int(k) != k or k < 0:
                raise DelayPlanError(f"'before_op' is a launch count (0, 1, ...): {h!r}")
            hh["before_op"] = int(k)
        else:
            hh["op"] = str(h["op"])
        out.append(hh)
    return out


class DelayPlan:
    """A validated delay plan; `hook(backend)` is what `Backend.before_launch` calls."""

    def __init__(self, holds):
        self.holds = normalize_holds(holds)
        self.applied: list = []        # (stream name, launch index, op name, us), capped

    @classmethod
    def parse(cls, plan) -> "DelayPlan":
        return plan if isinstance(plan, DelayPlan) else cls(plan)

    def __bool__(self):
        return bool(self.holds)

    def to_json(self) -> list:
        return [dict(h) for h in self.holds]

    def hook(self, backend, chain=None):
        """before_launch(stream_tid, op_name): count launches per stream, delay where planned."""
        by_index: dict = {}
        by_name: dict = {}
        for h in self.holds:
            if "before_op" in h:
                d = by_index.setdefault(h["stream"], {})
                d[h["before_op"]] = d.get(h["before_op"], 0.0) + h["us"]
            else:
                d = by_name.setdefault(h["stream"], {})
                d[h["op"]] = d.get(h["op"], 0.0) + h["us"]
        counts: dict = {}
        keys_of: dict = {}
        applied = self.applied
        sink = backend.sink
        if self.holds:
            backend.prepare_delays()   # calibrate now, before the program runs

        def before_launch(stream_tid, op_name):
            if chain is not None:
                chain(stream_tid, op_name)
            n = counts.get(stream_tid, 0)
            counts[stream_tid] = n + 1
            keys = keys_of.get(stream_tid)
            name = sink.timeline_name(stream_tid)
            if keys is None or keys[0] != name:
                k = backend.stream_index(stream_tid)
                keys = keys_of[stream_tid] = (name, f"#{k}" if k is not None else None)
            us = 0.0
            for key in keys:
                if key is None:
                    continue
                d = by_index.get(key)
                if d:
                    us += d.get(n, 0.0)
                d = by_name.get(key)
                if d:
                    us += d.get(op_name, 0.0)
            if us > 0 and backend.capture_state() is None:
                backend.delay_tid(stream_tid, us)
                if len(applied) < 10000:
                    applied.append((name, n, op_name, us))

        if not self.holds:
            return chain
        before_launch.plan = self          # rc.before_launch.plan.applied: what was delayed
        return before_launch


# -- sleeping on a device stream ------------------------------------------------------------------

def _event_us(module, e0, e1) -> float:
    e1.synchronize()
    return float(e0.elapsed_time(e1)) * 1000.0


def _measure_sleep(module, stream, cycles) -> float:
    e0 = module.Event(enable_timing=True)
    e1 = module.Event(enable_timing=True)
    with module.stream(stream):
        e0.record(stream)
        module._sleep(int(cycles))
        e1.record(stream)
    return _event_us(module, e0, e1)


def calibrate(module, device_index: int = 0, *, repeats: int = 5) -> float:
    """Cycles per microsecond of `module._sleep` on one device, measured with events.

    Cached per (module, device). `RACECHECK_SLEEP_CYCLES_PER_US` overrides the measurement.
    Runs on a private stream and synchronizes only that stream's events (call it before the
    program runs: `Sleeper.prepare`). Returns DEFAULT_CYCLES_PER_US when nothing can be measured.
    """
    env = os.environ.get("RACECHECK_SLEEP_CYCLES_PER_US")
    if env:
        return float(env)
    key = (getattr(module, "__name__", repr(module)), int(device_index))
    with _RATES_LOCK:
        if key in _RATES:
            return _RATES[key]
    rate = DEFAULT_CYCLES_PER_US
    try:
        stream = module.Stream(device=device_index)
        _measure_sleep(module, stream, 1000)          # loads the sleep kernel
        lo, hi = 20_000, 400_000
        slopes = []
        for _ in range(repeats):
            t_lo = _measure_sleep(module, stream, lo)
            t_hi = _measure_sleep(module, stream, hi)
            if t_hi > t_lo > 0:
                slopes.append((hi - lo) / (t_hi - t_lo))
        if slopes:
            slopes.sort()
            rate = slopes[len(slopes) // 2]
    except Exception:
        rate = DEFAULT_CYCLES_PER_US
    with _RATES_LOCK:
        _RATES[key] = rate
    return rate


class _BusyKernel:
    """A delay where the device has no sleep kernel: repeated small matmuls on a private buffer."""

    def __init__(self, module, device):
        self.module = module
        self.device = device
        self.a = torch.full((256, 256), 1e-3, device=device)
        self.out = torch.empty_like(self.a)
        self.us_per_iter = None

    def calibrate(self) -> float:
        m = self.module
        stream = m.Stream(device=self.device)
        with m.stream(stream):
            for _ in range(3):
                torch.mm(self.a, self.a, out=self.out)
            e0 = m.Event(enable_timing=True)
            e1 = m.Event(enable_timing=True)
            e0.record(stream)
            for _ in range(50):
                torch.mm(self.a, self.a, out=self.out)
            e1.record(stream)
        per = _event_us(m, e0, e1) / 50.0
        self.us_per_iter = per if per > 0 else 5.0
        return self.us_per_iter

    def run(self, us: float) -> None:
        if self.us_per_iter is None:
            self.calibrate()
        for _ in range(max(1, round(us / self.us_per_iter))):
            torch.mm(self.a, self.a, out=self.out)


class Sleeper:
    """Queues a delay of N microseconds on a device stream (the stream's own queue: host-async)."""

    def __init__(self, module, device_type: str):
        self.module = module
        self.device_type = device_type
        self.has_sleep = callable(getattr(module, "_sleep", None))
        self._busy: dict = {}
        self.rates: dict = {}          # device index -> cycles per microsecond (for reports)

    def prepare(self, device_index: int) -> None:
        if self.has_sleep:
            self.rates[device_index] = calibrate(self.module, device_index)
        else:
            self._busy_for(device_index)

    def _busy_for(self, device_index):
        b = self._busy.get(device_index)
        if b is None:
            b = self._busy[device_index] = _BusyKernel(
                self.module, torch.device(self.device_type, device_index))
            b.calibrate()
        return b

    def sleep(self, stream, device_index: int, us: float) -> None:
        """Delay `stream` (a device-module stream object) by about `us` microseconds."""
        from torch.utils._python_dispatch import _disable_current_modes
        m = self.module
        with _disable_current_modes(), m.stream(stream):
            if self.has_sleep:
                rate = self.rates.get(device_index)
                if rate is None:
                    rate = self.rates[device_index] = calibrate(m, device_index)
                m._sleep(max(1, int(us * rate)))
            else:
                self._busy_for(device_index).run(us)


def warm_up(program, *args, synchronize=None, **kwargs):
    """Run `program(*args, **kwargs)` once outside any session so every kernel it launches is
    loaded before a delayed run (a first launch serializes streams). Returns its result."""
    from . import current
    if current.backend() is not None:
        raise UsageError("warm_up() runs the program outside a racecheck session; call it before")
    out = program(*args, **kwargs)
    if synchronize is not None:
        synchronize()
    return out
