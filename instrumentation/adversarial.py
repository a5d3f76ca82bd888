"""An adversarial executor for `sim`: stream queues run in an order a plan chooses.

The eager executor runs every op when the host issues it, which is all the happens-before
checker needs. This one queues device work per stream and runs it later, in an order chosen
by a *plan*, always consistent with the happens-before edges the program created:

* FIFO per stream;
* `Event.record` / `wait_event` (a wait is satisfied when the record it saw at issue time ran;
  a wait on a never-recorded event is a no-op, as on the device);
* `wait_stream` (the waiter waits for everything the waitee had been given so far);
* host synchronization (`Stream.synchronize`, `Event.synchronize`, `synchronize()`, `query()`,
  blocking copies, `.item()` / `.tolist()`, data-dependent output shapes) runs what the host
  waits for before the host continues;
* host work on pinned memory runs at once on the host, so a host read before the D2H copy has
  run sees the old value: the race becomes a wrong value.

The plan (a JSON-friendly dict, drawn by Hypothesis in `racecheck fuzz`, stored in repro records)
is PCT-style: every stream and the host have a priority; at each scheduling point the
highest-priority runnable stream goes first, a stream ranked above the host runs as soon as it
has work (a fast stream), one ranked below only when the host waits (a slow stream); at each
change point the task that just ran drops below everyone. Holds hold a stream back before a
given op for a number of virtual microseconds (one op or host step = one microsecond), like
`torch.cuda._sleep` placed before it on a GPU. Ties go to the work issued first, so the empty
plan (all priorities 0, no change points, no holds) runs device work in issue order.

    plan = {"priorities": {"plan_stream": 2, "#0": 1}, "host": 0,
            "change_points": [17], "holds": [{"stream": "default", "before_op": 3, "us": 50}]}
    with racecheck.session(device="sim", executor=AdversarialExecutor(plan)) as rc: ...

Streams are named by their session name ("plan_stream", "default") or "#k", the k-th stream the
backend created (#0 is the default stream). `priorities` may also be a list indexed by k.

Out-of-place ops get their outputs at issue time (shapes from a meta-device run, contents a
poison value: NaN, True, or the most negative integer) and the real result is copied in when the
op runs; in-place ops run only when their turn comes. An op that raises when it finally runs
(an out-of-range index read from a racing buffer, say) is recorded in `faults`, like an illegal
memory access on a GPU, and the program goes on.

The detector's verdict does not depend on the plan: the checker sees events in host issue
order; index ops have their footprints resolved when they run (when their index values are
final) and handed to the checker in host order (`Session.emit_pending`); a storage the program
dropped while queued work still holds it is reported freed when the program dropped it.
"""
from __future__ import annotations

import contextlib
import threading
from collections import deque

import torch
from torch.utils._python_dispatch import _disable_current_modes

from .classify import WRITE, classify
from .delays import DelayPlanError, normalize_holds
from .executor import Executor

__all__ = ["AdversarialExecutor", "normalize_plan", "plan_text", "PlanError"]

_DEMOTED = -1_000_000          # a change point's priority (times its rank): below every plan's

# In-place ops that change a tensor's metadata (shape, strides), not its data: run at issue.
_METADATA_INPLACE = {"transpose_", "t_", "squeeze_", "unsqueeze_", "as_strided_", "swapdims_",
                     "swapaxes_", "resize_as_", "_resize_output_", "set_", "resize_", "detach_",
                     "requires_grad_", "rename_", "refine_names"}
# Factories with no defined contents: nothing to run later.
_UNINITIALIZED = {"empty", "empty_strided", "empty_like", "new_empty", "new_empty_strided",
                  "empty_permuted"}


class PlanError(ValueError):
    """A malformed executor plan."""


def _num(v, what):
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise PlanError(f"{what} must be a number, got {v!r}")
    return v


def plan_text(plan) -> str:
    """A plan as one line of JSON: how command lines and reports show it."""
    import json
    return json.dumps(plan, separators=(",", ":"))


def normalize_plan(plan) -> dict:
    """Validate a plan and return it in canonical JSON form (raises PlanError)."""
    if plan is None:
        plan = {}
    if not isinstance(plan, dict):
        raise PlanError(f"an executor plan is a JSON object, got {type(plan).__name__}")
    unknown = set(plan) - {"priorities", "host", "change_points", "holds", "from"}
    if unknown:
        raise PlanError(f"unknown plan keys: {', '.join(sorted(unknown))}")
    prios = plan.get("priorities", {}) or {}
    if isinstance(prios, (list, tuple)):
        prios = {f"#{k}": p for k, p in enumerate(prios)}
    if not isinstance(prios, dict):
        raise PlanError("plan 'priorities' must be an object {stream: priority} or a list")
    out_prios = {}
    for k, v in prios.items():
        out_prios[str(k)] = _num(v, f"priority of {k!r}")
    host = _num(plan.get("host", 0), "plan 'host'")
    cps = plan.get("change_points", []) or []
    if not isinstance(cps, (list, tuple)):
        raise PlanError("plan 'change_points' must be a list of step numbers")
    cps = sorted(int(_num(c, "a change point")) for c in cps)
    holds = plan.get("holds", []) or []
    if not isinstance(holds, (list, tuple)):
        raise PlanError("plan 'holds' must be a list of holds")
    try:
        holds = normalize_holds(holds)          # one validation for sim plans and GPU delay plans
    except DelayPlanError as exc:
        raise PlanError(str(exc)) from None
    out = {"priorities": out_prios, "host": host, "change_points": cps, "holds": holds}
    start = plan.get("from", "start")
    if start not in ("start", "serving"):
        raise PlanError(f"plan 'from' is \"start\" or \"serving\", got {start!r}")
    if start == "serving":
        # the program's start-up runs in issue order; the plan orders what follows the
        # program's `serving()` signal (an engine harness gives it before the first request)
        out["from"] = "serving"
    return out


# -- queue items ----------------------------------------------------------------------------------

class _Item:
    __slots__ = ("seq", "stream", "done")

    def __init__(self, seq, stream):
        self.seq = seq
        self.stream = stream
        self.done = False


class _Op(_Item):
    __slots__ = ("func", "args", "kwargs", "fresh", "on_execute", "rng", "name", "index", "held")

    def __init__(self, seq, stream, func, args, kwargs, fresh, on_execute, rng, name, index):
        super().__init__(seq, stream)
        self.func, self.args, self.kwargs = func, args, kwargs
        self.fresh = fresh            # list of (return position, issued output tensor)
        self.on_execute = on_execute
        self.rng = rng                # (generator, state at issue) for seeded random ops
        self.name = name
        self.index = index            # k: the k-th op of its stream


class _Launch(_Item):
    __slots__ = ("thunk", "name", "index", "held", "keep")

    def __init__(self, seq, stream, thunk, name, index):
        super().__init__(seq, stream)
        self.thunk, self.name, self.index = thunk, name, index
        self.held = ()
        self.keep = ()


class _Record(_Item):
    __slots__ = ("event",)

    def __init__(self, seq, stream, event):
        super().__init__(seq, stream)
        self.event = event


class _Wait(_Item):
    __slots__ = ("dep",)

    def __init__(self, seq, stream, dep):
        super().__init__(seq, stream)
        self.dep = dep                # the item that must have run


class _Hold(_Item):
    __slots__ = ("us", "release")

    def __init__(self, seq, stream, us):
        super().__init__(seq, stream)
        self.us = us
        self.release = None           # virtual time at which the hold ends, once it started


class _Stream:
    __slots__ = ("tid", "index", "queue", "prio", "nops", "last")

    def __init__(self, tid, index, prio):
        self.tid = tid
        self.index = index
        self.queue = deque()
        self.prio = prio
        self.nops = 0
        self.last = None              # last item given to this stream (for wait_stream / sync)


def _poison(t: torch.Tensor) -> None:
    if t.numel() == 0:
        return
    if t.is_floating_point() or t.is_complex():
        t.fill_(float("nan"))
    elif t.dtype == torch.bool:
        t.fill_(True)
    else:
        t.fill_(torch.iinfo(t.dtype).min)


_NULL = contextlib.nullcontext()


def _nomodes():
    """Run plain torch (no dispatch modes): a no-op inside __torch_dispatch__, where ours is off."""
    if torch._C._len_torch_dispatch_stack() == 0:
        return _NULL
    return _disable_current_modes()


def _spec_key(v):
    """Hashable description of an argument's geometry (for the output-shape cache), or raise."""
    if isinstance(v, torch.Tensor):
        return (tuple(v.shape), v.stride(), v.dtype, v.storage_offset() != 0)
    if isinstance(v, (list, tuple)):
        return (type(v).__name__,) + tuple(_spec_key(x) for x in v)
    if v is None or isinstance(v, (bool, int, float, str, torch.dtype, torch.device, torch.layout,
                                   torch.memory_format)):
        return (type(v).__name__, v)
    raise TypeError("unhashable argument")


_SPEC_CACHE_LIMIT = 16384
_spec_cache: dict = {}


def _to_meta(v):
    if isinstance(v, torch.Tensor):
        return torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device="meta")
    if isinstance(v, (list, tuple)):
        return type(v)(_to_meta(x) for x in v)
    return v


class _OpInfo:
    """Per-overload facts the executor needs, computed once."""

    __slots__ = ("name", "sync", "direct", "alias_of", "random", "reads_inputs", "has_device_kw",
                 "single", "functional")

    def __init__(self, func):
        oc = classify(func)
        schema = func._schema
        self.name = oc.name
        rets = schema.returns
        self.single = len(rets) == 1
        # Results the host sees at once (bool/int/float) computed from tensors: the stream must
        # be drained first. Ops that take no tensor (`promote_types`, the profiler's
        # `record_function`) read no device memory and wait for nothing, as on a GPU.
        takes_tensors = any("Tensor" in str(a.type) for a in schema.arguments)
        self.sync = oc.data_dependent or takes_tensors and any(
            not str(r.type).startswith(("Tensor", "Optional[Tensor]", "List[Tensor]"))
            for r in rets)
        returns_tensors = any("Tensor" in str(r.type) for r in rets)
        self.direct = (oc.name in _METADATA_INPLACE or oc.name in _UNINITIALIZED
                       or not takes_tensors and not returns_tensors)
        args = schema.arguments
        alias_of = []
        for r in rets:
            ai = r.alias_info
            pos = None
            if ai is not None:
                sets = set(ai.before_set)
                for i, a in enumerate(args):
                    if a.alias_info is not None and a.alias_info.is_write and set(a.alias_info.before_set) & sets:
                        pos = (i, a.name, a.kwarg_only)
                        break
                if pos is None:
                    self.direct = True          # a view-like return we cannot map: run at once
            alias_of.append(pos)
        self.alias_of = tuple(alias_of)
        self.random = torch.Tag.nondeterministic_seeded in func.tags
        self.reads_inputs = any(role != WRITE for _, _, _, role in oc.args)
        # no argument written, nothing random: running it changes nothing but its fresh outputs
        self.functional = not self.random and not any(
            a.alias_info is not None and a.alias_info.is_write for a in args) and all(
            p is None for p in alias_of)
        self.has_device_kw = any(a.name == "device" for a in args)


_infos: dict = {}


def _info(func) -> _OpInfo:
    i = _infos.get(func)
    if i is None:
        i = _infos[func] = _OpInfo(func)
    return i


def _arg(args, kwargs, pos):
    i, name, kwarg_only = pos
    if not kwarg_only and i < len(args):
        return args[i]
    return kwargs.get(name)


def _iter_tensors(v):
    if isinstance(v, torch.Tensor):
        yield v
    elif isinstance(v, (list, tuple)):
        for x in v:
            yield from _iter_tensors(x)
    elif isinstance(v, dict):
        for x in v.values():
            yield from _iter_tensors(x)


def _storage_use_count_offset() -> int | None:
    """use_count(storage) minus live tensors, once the storage's Python object exists (or None)."""
    try:
        t = torch.zeros(1)
        st = t.untyped_storage()
        cdata = st._cdata
        del st
        base = torch._C._storage_Use_Count(cdata)
        v = t.view(1)
        if torch._C._storage_Use_Count(cdata) != base + 1:
            return None
        del v
        return base - 1
    except Exception:
        return None


class AdversarialExecutor(Executor):
    """Queues device work per stream; runs it in a plan-chosen order consistent with happens-before."""

    eager = False
    deferred_footprints = True     # index ops: resolve footprints when the op runs

    def __init__(self, plan=None):
        self.plan = normalize_plan(plan)
        self._lock = threading.RLock()
        self._seq = 0
        self._streams: dict = {}           # tid -> _Stream
        self._names: dict = {}             # tid -> name
        self._records: dict = {}           # event id -> latest _Record
        self._vt = 0.0                     # virtual time (microseconds)
        self._step = 0                     # scheduling steps taken (host steps and device items)
        self._host_prio = self.plan["host"]
        self._cps = deque(self.plan["change_points"])
        self._demotions = 0
        self._holds_by_index: dict = {}    # stream key -> {op index: us}
        self._holds_by_name: dict = {}     # stream key -> {op name: us}
        for h in self.plan["holds"]:
            if "before_op" in h:
                d = self._holds_by_index.setdefault(h["stream"], {})
                d[h["before_op"]] = d.get(h["before_op"], 0) + h["us"]
            else:
                d = self._holds_by_name.setdefault(h["stream"], {})
                d[h["op"]] = d.get(h["op"], 0) + h["us"]
        self._busy = False                 # inside a drain (no re-entrant scheduling)
        self.faults: list = []             # ops that raised when they finally ran
        self.stats = {"ops": 0, "launches": 0, "queued_max": 0, "sync_fallback": {},
                      "steps": 0, "holds": 0, "early_frees": 0}
        self.order: list = []              # (stream name, op name) in execution order, capped
        self.keep_order = 0                # how many executed ops to remember in `order`
        # liveness of storages only queued work still holds
        self._held: dict = {}              # storage cdata -> [aliases queued, reported dead]
        self._uc_offset = _storage_use_count_offset()
        self._track = False
        self._registry = None
        self._in_issue_order = self.plan.get("from") == "serving"     # until `serving()`

    # -- binding and names ---------------------------------------------------------------------
    def __getstate__(self) -> dict:
        """A plan crossing into a new interpreter (a run spawned rather than forked): the
        executor as made, before `bind`; its lock is made again there."""
        state = dict(self.__dict__)
        state.pop("_lock", None)
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.RLock()

    def bind(self, backend) -> None:
        self.backend = backend
        self._registry = backend.footprints.registry
        for tid in list(backend.streams):
            self._stream(tid)
        self._names[backend.default_stream.tid] = "default"
        if self._uc_offset is not None:
            self._track = True
            backend.sink.set_liveness_poll(self._poll_dead)

    def stream_named(self, tid, name) -> None:
        with self._lock:
            self._names[tid] = str(name)
            st = self._streams.get(tid)
            if st is not None and st.prio is not None and st.prio > _DEMOTED:
                st.prio = None             # resolve again: the plan may name it

    def stream_name(self, tid) -> str:
        name = self._names.get(tid)
        if name is None:
            st = self._streams.get(tid)
            name = f"#{st.index}" if st is not None else f"stream {tid}"
        return name

    def _stream(self, tid) -> _Stream:
        st = self._streams.get(tid)
        if st is None:
            # "#k": the k-th stream the backend created (#0 is the default stream)
            index = self.backend.stream_index(tid)
            if index is None:
                index = len(self._streams)
            st = self._streams[tid] = _Stream(tid, index, None)
        return st

    def _prio(self, st: _Stream):
        if st.prio is None:
            p = self.plan["priorities"]
            name = self._names.get(st.tid)
            v = p.get(name) if name is not None else None
            if v is None:
                v = p.get(f"#{st.index}", 0)
            st.prio = v
        return st.prio

    def _hold_for(self, st: _Stream, index: int, name: str):
        keys = (self._names.get(st.tid), f"#{st.index}")
        us = 0
        for k in keys:
            if k is None:
                continue
            d = self._holds_by_index.get(k)
            if d and index in d:
                us += d[index]
            d = self._holds_by_name.get(k)
            if d and name in d:
                us += d[name]
        return us

    # -- issue -----------------------------------------------------------------------------------
    def _next_seq(self):
        self._seq += 1
        return self._seq

    def _enqueue(self, st: _Stream, item) -> None:
        st.queue.append(item)
        st.last = item
        n = sum(len(s.queue) for s in self._streams.values()) if self.stats["queued_max"] < 4096 else 0
        if n > self.stats["queued_max"]:
            self.stats["queued_max"] = n

    def _issue_hold(self, st, index, name):
        us = self._hold_for(st, index, name)
        if us > 0:
            self._enqueue(st, _Hold(self._next_seq(), st, us))
            self.stats["holds"] += 1

    def run(self, stream, func, args, kwargs, on_execute=None):
        with self._lock:
            info = _info(func)
            st = self._stream(stream)
            index = st.nops            # every call is one launch (as `Session.before_launch` counts)
            st.nops += 1
            self._issue_hold(st, index, info.name)
            if info.sync:
                # The host needs the result now (a data-dependent shape or a Python scalar).
                self._drain_for(st.last)
                if on_execute is not None:
                    on_execute(args, kwargs)
                out = self._direct(func, args, kwargs)
                self._host_step()
                return out
            if info.direct:
                if on_execute is not None:
                    on_execute(args, kwargs)
                out = self._direct(func, args, kwargs)
                self._host_step()
                return out
            rng = None
            if info.random:
                if info.reads_inputs:
                    self._fallback(st, info, "random op reading inputs")
                    if on_execute is not None:
                        on_execute(args, kwargs)
                    out = self._direct(func, args, kwargs)
                    self._host_step()
                    return out
                rng = self._advance_rng(func, args, kwargs, info)
            try:
                result, fresh = self._issue_outputs(func, args, kwargs, info)
            except Exception:
                # No meta kernel (or a value-dependent check): run it where the stream is now.
                self._fallback(st, info, "no meta shape")
                if on_execute is not None:
                    on_execute(args, kwargs)
                out = self._direct(func, args, kwargs)
                self._host_step()
                return out
            held = []
            with _nomodes():
                qargs = self._alias(tuple(args), held)
                qkwargs = {k: self._alias(v, held) for k, v in kwargs.items()} if kwargs else {}
                qfresh = [(pos, self._alias(t, held)) for pos, t in fresh]
            item = _Op(self._next_seq(), st, func, qargs, qkwargs, qfresh, on_execute, rng, info.name, index)
            item.held = held
            self._enqueue(st, item)
            self._host_step()
            return result

    def _fallback(self, st, info, why):
        fb = self.stats["sync_fallback"]
        fb[info.name] = fb.get(info.name, 0) + 1
        self._drain_for(st.last)

    def _direct(self, func, args, kwargs):
        with _nomodes():
            return func(*args, **kwargs)

    def _advance_rng(self, func, args, kwargs, info):
        gen = kwargs.get("generator")
        g = gen if gen is not None else torch.default_generator
        state = g.get_state()
        with _nomodes():
            try:
                # Consume exactly what the op consumes, on scratch memory (a fill: shape only).
                a = tuple(torch.empty_like(x) if isinstance(x, torch.Tensor) else x for x in args)
                func(*a, **kwargs)
            except Exception:
                pass
        return (g, state)

    def _output_specs(self, func, args, kwargs, info):
        """Per return: None (aliases an argument), ("t", shape, stride, dtype) or ("l", [...])."""
        key = None
        try:
            key = (func, _spec_key(args), tuple((k, _spec_key(v)) for k, v in sorted(kwargs.items())))
            hit = _spec_cache.get(key)
            if hit is not None:
                return hit
        except TypeError:
            key = None
        metas = None
        if info.functional:
            # Cheapest for small CPU tensors: run it once on the current (maybe stale) values;
            # the output geometry does not depend on them (data-dependent ops never get here).
            try:
                with _nomodes():
                    metas = func(*args, **kwargs)
            except Exception:
                metas = None
        if metas is None:
            margs = _to_meta(args)
            mkwargs = {k: _to_meta(v) for k, v in kwargs.items()}
            if info.has_device_kw and ("device" in mkwargs or not any(
                    True for _ in _iter_tensors((args, kwargs)))):
                mkwargs["device"] = torch.device("meta")
            with _nomodes():
                metas = func(*margs, **mkwargs)
        if info.single:
            metas = (metas,)
        specs = []
        for k, pos in enumerate(info.alias_of):
            if pos is not None:
                specs.append(None)
                continue
            m = metas[k]
            if isinstance(m, torch.Tensor):
                specs.append(("t", tuple(m.shape), m.stride(), m.dtype))
            elif isinstance(m, (list, tuple)):
                specs.append(("l", [(tuple(x.shape), x.stride(), x.dtype) for x in m]))
            else:
                raise TypeError("non-tensor result")
        specs = tuple(specs)
        if key is not None:
            if len(_spec_cache) > _SPEC_CACHE_LIMIT:
                _spec_cache.clear()
            _spec_cache[key] = specs
        return specs

    def _issue_outputs(self, func, args, kwargs, info):
        """(what the op returns now, [(position, issued tensor)] to fill when it runs)."""
        specs = self._output_specs(func, args, kwargs, info) if any(
            p is None for p in info.alias_of) else (None,) * len(info.alias_of)
        results = []
        fresh = []
        with _nomodes():
            for k, pos in enumerate(info.alias_of):
                if pos is not None:
                    results.append(_arg(args, kwargs, pos))
                    continue
                sp = specs[k]
                if sp[0] == "t":
                    t = torch.empty_strided(sp[1], sp[2], dtype=sp[3], device="cpu")
                    _poison(t)
                    fresh.append((k, t))
                    results.append(t)
                else:
                    lst = []
                    for j, (shape, stride, dtype) in enumerate(sp[1]):
                        t = torch.empty_strided(shape, stride, dtype=dtype, device="cpu")
                        _poison(t)
                        fresh.append(((k, j), t))
                        lst.append(t)
                    results.append(lst)
        if not info.alias_of:
            return None, fresh
        if info.single:
            return results[0], fresh
        return tuple(results), fresh

    def launch(self, stream, thunk, name: str = "graph_replay", keep=()) -> None:
        """Queue `thunk()`; `keep`: storages it reaches that the program may drop meanwhile
        (held like an op's arguments, and reported freed when the program dropped them)."""
        with self._lock:
            st = self._stream(stream)
            index = st.nops
            st.nops += 1
            self._issue_hold(st, index, name)
            item = _Launch(self._next_seq(), st, thunk, name, index)
            if keep:
                held = []
                with _nomodes():
                    item.keep = [self._alias(torch.empty(0, dtype=torch.uint8, device=s.device)
                                             .set_(s), held) for s in keep]
                item.held = held
            self._enqueue(st, item)
            self._host_step()

    def record(self, event, stream) -> None:
        with self._lock:
            st = self._stream(stream)
            item = _Record(self._next_seq(), st, event)
            self._records[event] = item
            self._enqueue(st, item)
            self._host_step()

    def wait_event(self, stream, event) -> None:
        with self._lock:
            rec = self._records.get(event)
            if rec is None or rec.done:
                return                   # a wait before any record is a no-op, as on the device
            st = self._stream(stream)
            self._enqueue(st, _Wait(self._next_seq(), st, rec))
            self._host_step()

    def wait_stream(self, waiter, waitee) -> None:
        with self._lock:
            dep = self._stream(waitee).last
            if dep is None or dep.done:
                return
            st = self._stream(waiter)
            self._enqueue(st, _Wait(self._next_seq(), st, dep))
            self._host_step()

    def delay(self, stream, microseconds: float) -> None:
        with self._lock:
            if microseconds > 0:
                st = self._stream(stream)
                self._enqueue(st, _Hold(self._next_seq(), st, float(microseconds)))
                self.stats["holds"] += 1

    # -- host synchronization ---------------------------------------------------------------------
    def sync_stream(self, stream) -> None:
        with self._lock:
            self._drain_for(self._stream(stream).last)

    def sync_event(self, event) -> None:
        with self._lock:
            self._drain_for(self._records.get(event))

    def sync_all(self) -> None:
        with self._lock:
            self._schedule(lambda: not any(s.queue for s in self._streams.values()))

    def query_stream(self, stream) -> bool:
        self.sync_stream(stream)
        return True

    def query_event(self, event) -> bool:
        self.sync_event(event)
        return True

    def finish(self) -> None:
        self.sync_all()

    def _drain_for(self, item) -> None:
        if item is None or item.done:
            return
        self._schedule(lambda: item.done)

    # -- phases of the program ------------------------------------------------------------------
    def serving(self) -> None:
        """The program's start-up is over. A plan `from: serving` applies from here on (device
        work ran as it was issued until now: an engine's start-up, whose races are another
        question than its serving's, as on an idle GPU)."""
        with self._lock:
            if self._in_issue_order:
                self.sync_all()
                self._in_issue_order = False

    # -- scheduling ---------------------------------------------------------------------------------
    def _host_step(self) -> None:
        """The host took a step: advance time; fast streams (ranked above the host) run."""
        if self._busy:
            return
        if self._in_issue_order:
            self._schedule(lambda: not any(s.queue for s in self._streams.values()))
            return
        self._vt += 1.0
        self._take_step(None)
        self._schedule(None)

    def _take_step(self, st) -> None:
        self._step += 1
        self.stats["steps"] = self._step
        cps = self._cps
        while cps and cps[0] <= self._step:
            cps.popleft()
            self._demotions += 1
            low = _DEMOTED * self._demotions
            if st is None:
                self._host_prio = low
            else:
                st.prio = low

    def _enabled(self, st: _Stream) -> bool:
        head = st.queue[0]
        if isinstance(head, _Wait):
            return head.dep.done
        if isinstance(head, _Hold):
            if head.release is None:
                head.release = self._vt + head.us
            return self._vt >= head.release
        return True

    def _schedule(self, until) -> None:
        """Run device items. until=None: only fast streams (the host is not waiting)."""
        if self._busy:
            if until is not None and not until():
                raise RuntimeError("racecheck adversarial executor: re-entrant wait")
            return
        self._busy = True
        try:
            with _nomodes():
                while True:
                    if until is not None and until():
                        return
                    best = None
                    best_key = None
                    waiting_hold = None
                    for st in self._streams.values():
                        if not st.queue:
                            continue
                        p = self._prio(st)
                        if until is None and p <= self._host_prio:
                            continue
                        if not self._enabled(st):
                            head = st.queue[0]
                            if isinstance(head, _Hold) and (waiting_hold is None or head.release < waiting_hold):
                                waiting_hold = head.release
                            continue
                        key = (p, -st.queue[0].seq)
                        if best_key is None or key > best_key:
                            best, best_key = st, key
                    if best is None:
                        if waiting_hold is not None and until is not None:
                            self._vt = waiting_hold      # nothing else can run: time passes
                            continue
                        if until is None:
                            return
                        raise RuntimeError("racecheck adversarial executor: the host waits for "
                                           "work that can never run")
                    self._execute(best)
        finally:
            self._busy = False

    def _execute(self, st: _Stream) -> None:
        item = st.queue.popleft()
        if isinstance(item, _Op):
            self._run_op(item)
            self._vt += 1.0
            self.stats["ops"] += 1
        elif isinstance(item, _Launch):
            try:
                item.thunk()
            except Exception as exc:
                self._fault(item, exc)
            self._vt += 1.0
            self.stats["launches"] += 1
        item.done = True
        if isinstance(item, (_Op, _Launch)):
            if self.keep_order and len(self.order) < self.keep_order:
                self.order.append((self.stream_name(st.tid), item.name))
            self._take_step(st)
            if isinstance(item, _Op):
                self._release(item)
            else:
                self._release_held(item.held)
                item.thunk = None
                item.held = item.keep = ()

    def _run_op(self, item: _Op) -> None:
        if item.on_execute is not None:
            try:
                item.on_execute(item.args, item.kwargs)
            except Exception as exc:
                self._fault(item, exc, where="resolving its footprint")
        g_saved = None
        if item.rng is not None:
            g, state = item.rng
            g_saved = (g, g.get_state())
            g.set_state(state)
        try:
            res = item.func(*item.args, **item.kwargs)
        except Exception as exc:
            self._fault(item, exc)
            return
        finally:
            if g_saved is not None:
                g_saved[0].set_state(g_saved[1])
        if item.fresh:
            if _infos[item.func].single:
                res = (res,)
            for pos, out in item.fresh:
                try:
                    r = res[pos] if isinstance(pos, int) else res[pos[0]][pos[1]]
                    if r is not out:
                        out.copy_(r)
                except Exception as exc:
                    self._fault(item, exc, where="copying its result")

    def _fault(self, item, exc, where="running") -> None:
        if len(self.faults) < 100:
            self.faults.append({"op": getattr(item, "name", "?"), "stream": self.stream_name(item.stream.tid),
                                "error": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}",
                                "where": where})

    # -- liveness: storages only queued work still holds -----------------------------------------
    # Queued items hold aliases (their own tensor objects over the same storages), never the
    # program's tensors; so use_count(storage) - aliases held here is what the program holds.
    def _alias(self, v, held):
        """The queue's own tensor object over v's storage (same geometry); notes the storage."""
        if isinstance(v, torch.Tensor):
            a = v.detach()
            if self._track:
                cdata = v.untyped_storage()._cdata
                entry = self._held.get(cdata)
                if entry is None:
                    entry = self._held[cdata] = [0, False]
                entry[0] += 1
                held.append(cdata)
            return a
        if isinstance(v, (list, tuple)):
            return type(v)(self._alias(x, held) for x in v)
        return v

    def _release(self, item: _Op) -> None:
        self._release_held(item.held)
        item.args = item.kwargs = None
        item.fresh = ()
        item.on_execute = None
        item.held = ()

    def _release_held(self, cdatas) -> None:
        held = self._held
        for cdata in cdatas:
            entry = held.get(cdata)
            if entry is None:
                continue
            entry[0] -= 1
            if entry[0] <= 0:
                del held[cdata]

    def _poll_dead(self) -> list:
        """Storage ids the program dropped while only queued ops still hold them (reported once)."""
        held = self._held
        if not held:
            return ()
        off = self._uc_offset
        uc = torch._C._storage_Use_Count
        sid_of = self._registry.sid_of_cdata
        dead = []
        for cdata, entry in held.items():
            if entry[1]:
                continue
            if uc(cdata) - off <= entry[0]:
                sid = sid_of(cdata)
                entry[1] = True
                if sid is not None:
                    dead.append(sid)
        if dead:
            self.stats["early_frees"] += len(dead)
        return dead

    # -- introspection ------------------------------------------------------------------------------
    def pending(self) -> int:
        return sum(len(s.queue) for s in self._streams.values())

    def describe(self) -> dict:
        adopted = getattr(self, "_adopted", None)
        if adopted is not None:
            return dict(adopted)
        return {"plan": self.plan, "faults": list(self.faults), "stats": dict(self.stats),
                "streams": {self.stream_name(t): s.index for t, s in self._streams.items()}}

    def export(self) -> dict:
        """What a run under this executor in another process leaves for `adopt`."""
        return self.describe()

    def adopt(self, state: dict) -> None:
        """The run happened in a child process (one engine per process): its faults, stats and
        streams as this executor's."""
        self.faults[:] = state["faults"]
        self.stats = dict(state["stats"])
        self._adopted = dict(state)
