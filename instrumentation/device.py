"""A real accelerator behind a torch device module (`torch.cuda`, `torch.npu`): what is observed.

`rc.device_module` is the runtime's own module, so engine code that calls `torch.cuda` or
`torch.get_device_module(...)` directly is seen the same way as code written against the
device module.

* ops: the shared dispatch-mode `Interceptor`; the stream an op runs on is the current stream of
  its tensors' device, looked up per op with one C call and a dict hit; streams are timelines
  keyed by (stream id, device index) because a stream id is only unique per device. The default
  stream is named "default" (device 0) or "cuda:1 default".
* host memory: CPU tensors, pinned or not (`StorageRegistry.host_of`). `non_blocking` copies
  between host memory and the device are asynchronous for the host; blocking copies, `.item()`,
  `.tolist()` and data-dependent shapes are host syncs.
* synchronization: thin wrappers on the device module's `Event` (record / wait / synchronize /
  query), `Stream` (synchronize / query; without callbacks `wait_stream` too, as one edge, not
  the record and wait of the event torch makes for it), `synchronize` and
  `torch.accelerator.synchronize`, live for the session. With `callbacks=True` (the backend's
  choice: see cuda.py and npu.py) the runtime's trace callbacks (`torch.cuda._gpu_trace`: event record / wait / synchronize, stream
  synchronize, device synchronize, event creation / deletion) report what they cover instead, C++
  callers included; they cannot be unregistered, so they are attached once per process and do
  nothing unless a session is active, and the wrappers stay for what no callback reports: a wait
  or synchronize on an event that was never recorded (the runtime fires nothing; the checker needs
  the no-op for RC008), and `Event.query()` / `Stream.query()` returning True (an acquire edge).
  Without callbacks an event's id lives on its Python object (no handle is ever reported, and a
  handle the runtime reuses is a new event); with them, on its runtime handle.
* graphs: `capture_begin/capture_end/replay` of the module's graph class are wrapped for the
  session: ops during capture become the graph's captured accesses (nothing executes), a replay is
  one `GraphReplay` on the current stream (one footprint pass per replay).
* `t.record_stream(s)`: `aten.record_stream` reaches the dispatch mode with a `torch.Stream`.
* index ops with device-resident index values: the index tensors are copied, on the op's own
  stream and ahead of it, into host memory with an event (no synchronization the program lacks);
  the op's footprint is resolved when that event has completed (`Sink.emit_pending`), at the
  latest at the session's end. Captured index ops and huge index sets cover the whole tensor and
  say so (`Footprint.approx`).

Tracing, once activated (`torch._C._activate_gpu_trace()`), stays on for the process: after the
session each traced event, every caching-allocator malloc and free included, costs a Python call.
"""
from __future__ import annotations

import gc
import operator
import threading

import torch
from torch.utils._python_dispatch import _disable_current_modes

from racecheck.core import native
from racecheck.core.cnames import read_by_c, read_by_c_globals
from racecheck.core.trace import (EventRecord, Footprint, GraphCapture, GraphReplay, Kernel, NameTimeline,
                             StreamWaitEvent, StreamWaitStream)

from . import stacks
from .base import Backend
from .delays import Sleeper
from .executor import Executor
from .footprints import MAX_INDEX_ELEMS, MAX_RUNS, positions_to_ranges, strided_ranges
from .indexops import index_footprint as _host_index_footprint

__all__ = ["DeviceBackend", "hook_trace"]

_ACTIVE = None              # the backend trace callbacks report to (None: callbacks do nothing)
read_by_c_globals(__name__, "_ACTIVE")      # the C wrappers (SyncHook) read it from globals()
read_by_c("stream_id", "device_index", "device_type")(torch.Stream)     # ... and these of streams
_HOOKED: dict = {}          # id(trace registry module) -> set of kinds racecheck is attached to
_HOOK_LOCK = threading.Lock()
_EID_ATTR = "_racecheck_eid"
_GID_ATTR = "_racecheck_gid"
MAX_SNAPSHOT_ELEMS = 1 << 16   # index elements copied per op; above this the whole tensor is used

_ADV_INDEX_OPS = ("index", "_unsafe_index", "index_put_", "_index_put_impl_")
_DIM_INDEX_OPS = ("index_select", "index_copy_", "index_add_", "index_fill_")
_GATHER_OPS = ("gather", "scatter_", "scatter_add_", "scatter_reduce_")

# The runtime events racecheck listens to: kind -> (handler name, number of arguments).
TRACE_KINDS = {
    "event_creation": "_cb_event_creation",
    "event_deletion": "_cb_event_deletion",
    "event_record": "_cb_event_record",
    "event_wait": "_cb_event_wait",
    "event_synchronization": "_cb_event_synchronization",
    "stream_synchronization": "_cb_stream_synchronization",
    "device_synchronization": "_cb_device_synchronization",
}


def _dispatcher(trace_id, handler):
    """A callback bound to one trace registry; it reaches the active backend only."""
    def cb(*args):
        b = _ACTIVE
        if b is not None and b._trace_id == trace_id:
            b._callback(handler, args)
    cb.__name__ = f"racecheck{handler}"
    return cb


def hook_trace(trace, style: str, activate) -> frozenset:
    """Attach racecheck's callbacks to a trace registry module once per process.

    style "gpu": `register_callback_for_<kind>(cb)` (torch.cuda._gpu_trace, torch.xpu._gpu_trace);
    style "npu": `register_callback_for_npu_<kind>(cb, name)` (torch_npu.utils._npu_trace).
    Returns the kinds attached (a kind whose registration function is missing is left to wrappers).
    """
    key = id(trace)
    with _HOOK_LOCK:
        done = _HOOKED.get(key)
        if done is not None:
            return done
        kinds = set()
        for kind, handler in TRACE_KINDS.items():
            if style == "npu":
                reg = getattr(trace, f"register_callback_for_npu_{kind}", None)
                if reg is not None:
                    reg(_dispatcher(key, handler), f"racecheck_{kind}")
                    kinds.add(kind)
            else:
                reg = getattr(trace, f"register_callback_for_{kind}", None)
                if reg is not None:
                    reg(_dispatcher(key, handler))
                    kinds.add(kind)
        if kinds and activate is not None:
            activate()
        done = _HOOKED[key] = frozenset(kinds)
        return done


class _Capture:
    """Ops recorded while a graph is captured: the accesses every replay will make."""

    __slots__ = ("graph", "ops", "prev", "gc_was_enabled")

    def __init__(self, graph, prev):
        self.graph, self.ops, self.prev = graph, [], prev
        self.gc_was_enabled = True

    def add(self, captured, func, args, kwargs, out):
        self.ops.append(captured)


class _DeferredFootprint(Footprint):
    """The whole indexed view for now; `resolver(kernel)` gives the exact rows when known."""

    __slots__ = ("resolver",)


class _DeviceExecutor(Executor):
    """Real devices run ops themselves; the session only needs finish() and delay()."""

    eager = True

    def __init__(self, backend):
        self.backend = backend

    def bind(self, backend) -> None:
        self.backend = backend

    def delay(self, stream, microseconds: float) -> None:
        self.backend.delay_tid(stream, microseconds)

    def finish(self) -> None:
        self.backend.finish_snapshots()


def _positions(offset, shape, stride):
    """Storage element index of every element of a view with this geometry (CPU int64)."""
    pos = torch.full((), offset, dtype=torch.int64)
    nd = len(shape)
    for d, (sz, st) in enumerate(zip(shape, stride)):
        view = [1] * nd
        view[d] = sz
        pos = pos + (torch.arange(sz, dtype=torch.int64) * st).reshape(view)
    return pos.expand(tuple(shape)) if nd else pos


# a storage first seen through a CPU tensor is host memory (a C call, no Python frame per storage)
_IS_CPU = operator.attrgetter("is_cpu")


@read_by_c("mute")
class _WrapperState(threading.local):
    """Per host thread, for the wrappers; class defaults keep a missing attribute (an exception
    raised and cleared) off every record, wait and replay."""

    mute = 0                # > 0 while racecheck itself calls the device module
    pending_eid = None      # the id a record wrapper hands to the runtime's creation callback


class DeviceBackend(Backend):
    """A real accelerator behind a torch device module (`torch.cuda`, `torch.npu`)."""

    name = "device"
    device_type = "cuda"            # torch.device type of device tensors
    stream_handle_attr = "cuda_stream"
    event_handle_attr = "cuda_event"
    graph_class_name = "CUDAGraph"
    strip_pin_memory = False        # pinned memory is real here (the interceptor keeps the flag)
    runs_at_issue = True            # the runtime queues the op itself
    host_wait_emits_only = True     # host_wait_stream only reports the HostSync

    def __init__(self, sink, module, *, trace=None, trace_style="gpu", trace_activate=None,
                 current_ids=None, callbacks=True):
        super().__init__(sink)
        self.module = module
        self.executor = _DeviceExecutor(self)
        self._tls = _WrapperState()
        self._trace = trace if callbacks else None
        self._trace_id = id(trace) if trace is not None else None
        self._trace_style = trace_style
        self._trace_activate = trace_activate
        self._traced: frozenset = frozenset()
        self._cur = current_ids or self._generic_current_ids
        self._tids: dict = {}        # (stream id, device index, device type) -> timeline
        self._keys: dict = {}        # timeline -> (stream id, device index, device type) or None
        self._by_handle: dict = {}   # (raw handle, device if handle == 0) -> timeline
        self._order: dict = {}       # timeline -> k ("#k": order of first sight)
        self._nstreams = 0
        self._eids: dict = {}        # raw event handle -> event id
        self._token = object()       # tags per-object ids with this session
        self._undo: list = []
        self._capturing = 0
        self._outstanding: set = set()   # snapshot events not resolved yet
        self._event_pool: list = []      # snapshot events and host buffers are reused, never freed
        self._host_pool: dict = {}       # during the session (a free fires allocator callbacks)
        self._sleeper = Sleeper(module, self.device_type)
        key = self._cur(-1)
        self._dtype = key[2]
        self.special_ops = {"record_stream": self._record_stream}
        if self.strip_pin_memory:
            self.special_ops["is_pinned"] = self._is_pinned
        self.footprints.registry.host_of = _IS_CPU
        fast = native.speedups
        if fast is not None:        # the two lookups every op makes, in C (known streams)
            cls = type(self)
            if cls.op_stream_tid is DeviceBackend.op_stream_tid:
                self.op_stream_tid = fast.StreamOf(
                    cur=self._cur, tids=self._tids, slow=DeviceBackend.op_stream_tid.__get__(self),
                    tensor=torch.Tensor, by_args=True)
            if cls.current_stream_tid is DeviceBackend.current_stream_tid:
                self.current_stream_tid = fast.StreamOf(
                    cur=self._cur, tids=self._tids,
                    slow=DeviceBackend.current_stream_tid.__get__(self), tensor=torch.Tensor,
                    by_args=False)

    # -- streams --------------------------------------------------------------------------------
    def _generic_current_ids(self, dev):
        s = self.module.current_stream(None if dev < 0 else dev)
        return (s.stream_id, s.device_index, s.device_type)

    def _current_device(self) -> int:
        return int(self.module.current_device())

    def current_stream_tid(self) -> int:
        key = self._cur(-1)
        tid = self._tids.get(key)
        return tid if tid is not None else self._register(key)

    def op_stream_tid(self, args, kwargs) -> int:
        """The stream an op runs on: the current stream of its first device tensor's device."""
        if args:
            a = args[0]     # the common case, a device tensor first: one C call, one dict hit
            if isinstance(a, torch.Tensor) and not a.is_cpu:
                key = self._cur(a.get_device())
                tid = self._tids.get(key)
                return tid if tid is not None else self._register(key)
        dev = -1
        for a in args:
            if isinstance(a, torch.Tensor):
                if not a.is_cpu:
                    dev = a.get_device()
                    break
            elif isinstance(a, (list, tuple)):
                for x in a:
                    if isinstance(x, torch.Tensor) and not x.is_cpu:
                        dev = x.get_device()
                        break
                if dev >= 0:
                    break
        else:
            d = kwargs.get("device") if kwargs else None
            if d is not None:
                if not isinstance(d, torch.device):
                    d = torch.device(d)
                if d.type == self.device_type and d.index is not None:
                    dev = d.index
        key = self._cur(dev)
        tid = self._tids.get(key)
        return tid if tid is not None else self._register(key)

    def stream_of(self, stream):
        """Timeline of a stream object (device-module stream or torch.Stream), None if foreign."""
        if stream is None:
            return None
        sid = getattr(stream, "stream_id", None)
        dev = getattr(stream, "device_index", None)
        if sid is None or dev is None:
            return None
        dt = getattr(stream, "device_type", None)
        if dt is not None and not isinstance(dt, int):
            dt = getattr(dt, "value", dt)
        if dt is not None and isinstance(dt, int) and dt != self._dtype:
            return None
        key = (sid, dev, self._dtype)
        tid = self._tids.get(key)
        return tid if tid is not None else self._register(key)

    def stream_index(self, tid):
        return self._order.get(tid)

    def _stream_name(self, key) -> str:
        sid, dev = key[0], key[1]
        prefix = "" if dev == 0 else f"{self.device_type}:{dev} "
        if sid == 0:
            return f"{prefix}default"
        self._nstreams += 1
        return f"{prefix}stream {self._nstreams}"

    def _handle_for(self, key):
        try:
            with self.muted():
                s = self.module.Stream(stream_id=key[0], device_index=key[1], device_type=key[2])
                return int(getattr(s, self.stream_handle_attr))
        except Exception:
            return None

    @staticmethod
    def _hkey(handle, dev):
        return (handle, dev if handle == 0 else None)

    def _new_timeline(self, name, dev) -> int:
        s = self.sink
        tid = s.new_timeline()
        self._order[tid] = len(self._order)
        s.emit(NameTimeline(s.thread_tid(), tid, name, False, dev))
        return tid

    def _register(self, key) -> int:
        s = self.sink
        with s.lock:
            tid = self._tids.get(key)
            if tid is not None:
                return tid
            handle = self._handle_for(key)
            hk = self._hkey(handle, key[1]) if handle is not None else None
            tid = self._by_handle.get(hk) if hk is not None else None
            if tid is None:
                tid = self._new_timeline(self._stream_name(key), key[1])
            self._tids[key] = tid
            self._keys[tid] = key
            if hk is not None:
                self._by_handle[hk] = tid
            return tid

    def _tid_of_handle(self, handle) -> int:
        dev = self._current_device() if handle == 0 else None
        hk = (handle, dev)
        tid = self._by_handle.get(hk)
        if tid is not None:
            return tid
        if handle == 0:                       # the null stream: the device's default stream
            return self._register((0, dev, self._dtype))
        s = self.sink
        with s.lock:
            tid = self._by_handle.get(hk)
            if tid is None:
                self._nstreams += 1
                tid = self._new_timeline(f"stream {self._nstreams}", None)
                self._by_handle[hk] = tid
                self._keys.setdefault(tid, None)
            return tid

    def _stream_obj(self, tid):
        key = self._keys.get(tid)
        if key is None:
            return None
        return self.module.Stream(stream_id=key[0], device_index=key[1], device_type=key[2])

    # -- events ---------------------------------------------------------------------------------
    def _eid_of_handle(self, h) -> int:
        eid = self._eids.get(h)
        if eid is None:
            eid = self._eids[h] = self.sink.new_event_id()
        return eid

    def _obj_eid(self, ev, create=True):
        d = ev.__dict__.get(_EID_ATTR)
        if d is not None and d[0] is self._token:
            return d[1]
        if not create:
            return None
        eid = self.sink.new_event_id()
        ev.__dict__[_EID_ATTR] = (self._token, eid)
        return eid

    def _eid_of(self, ev) -> int:
        h = getattr(ev, self.event_handle_attr, 0)
        if h:
            eid = self._eids.get(h)
            if eid is None:
                pre = self._obj_eid(ev, create=False)
                eid = self._eids[h] = pre if pre is not None else self.sink.new_event_id()
            return eid
        return self._obj_eid(ev)

    # -- trace callbacks ------------------------------------------------------------------------
    def _live(self) -> bool:
        return _ACTIVE is self and self.sink.checking and not getattr(self._tls, "mute", 0)

    def muted(self):
        return _Mute(self._tls)

    def _callback(self, handler, args) -> None:
        if not self._live():
            return
        try:
            getattr(self, handler)(*args)
        except Exception as exc:  # never let racecheck break the program
            self.sink.internal_error(exc, f"in trace callback {handler}")

    def _cb_event_creation(self, h):
        pre = getattr(self._tls, "pending_eid", None)
        if pre is not None:
            self._eids[h] = pre
        else:
            self._eids.pop(h, None)   # a reused handle is a new event

    def _cb_event_deletion(self, h):
        self._eids.pop(h, None)

    def _cb_event_record(self, h, sh):
        s = self.sink
        if self.capture_state() is not None:     # a node of the graph being captured
            return
        s.emit(EventRecord(s.thread_tid(), self._eid_of_handle(h), self._tid_of_handle(sh),
                           stacks.capture()))

    def _cb_event_wait(self, h, sh):
        s = self.sink
        if self.capture_state() is not None:
            return
        s.emit(StreamWaitEvent(s.thread_tid(), self._tid_of_handle(sh), self._eid_of_handle(h),
                               stacks.capture()))

    def _cb_event_synchronization(self, h):
        self.emit_host_sync("event", self._eid_of_handle(h))

    def _cb_stream_synchronization(self, sh):
        self.emit_host_sync("stream", self._tid_of_handle(sh))

    def _cb_device_synchronization(self):
        self.emit_host_sync("device", self._current_device())

    # -- wrappers (what no callback reports) ----------------------------------------------------
    def _patch(self, owner, name, make) -> None:
        had = name in getattr(owner, "__dict__", {})
        orig = getattr(owner, name)
        setattr(owner, name, make(orig))
        if had:
            self._undo.append(lambda: setattr(owner, name, orig))
        else:
            self._undo.append(lambda: delattr(owner, name))

    def _install_wrappers(self) -> None:
        b = self
        m = self.module
        traced = self._traced
        EH = self.event_handle_attr

        def cur_stream(stream):
            return stream if stream is not None else m.current_stream()

        def record_tid(stream):
            return b.current_stream_tid() if stream is None else b.stream_of(stream)

        def make_record(orig):
            if not traced:
                def record_untraced(ev, stream=None):
                    out = orig(ev, stream)
                    if b._live() and b.capture_state() is None:   # captured: a graph node
                        try:
                            s = b.sink
                            s.emit(EventRecord(s.thread_tid(), b._obj_eid(ev), record_tid(stream),
                                               stacks.capture()))
                        except Exception as exc:
                            b.sink.internal_error(exc, "in Event.record wrapper")
                    return out
                return record_untraced

            def record(ev, stream=None):
                if not b._live():
                    return orig(ev, stream)
                pre = None if getattr(ev, EH, 0) else b._obj_eid(ev, create=False)
                if "event_record" in traced:
                    b._tls.pending_eid = pre
                    try:
                        return orig(ev, stream)
                    finally:
                        b._tls.pending_eid = None
                out = orig(ev, stream)
                try:
                    h = getattr(ev, EH, 0)
                    if pre is not None and h:
                        b._eids.setdefault(h, pre)
                    s = b.sink
                    s.emit(EventRecord(s.thread_tid(), b._eid_of(ev), b.stream_of(cur_stream(stream)),
                                       stacks.capture()))
                except Exception as exc:
                    b.sink.internal_error(exc, "in Event.record wrapper")
                return out
            return record

        def make_wait(orig):
            def wait(ev, stream=None):
                created = getattr(ev, EH, 0)
                out = orig(ev, stream)
                if b._live() and not (created and "event_wait" in traced):
                    try:
                        s = b.sink
                        if b.capture_state() is None:
                            s.emit(StreamWaitEvent(s.thread_tid(), record_tid(stream),
                                                   b._eid_of(ev), stacks.capture()))
                    except Exception as exc:
                        b.sink.internal_error(exc, "in Event.wait wrapper")
                return out
            return wait

        def host_sync(kind, target, gate=lambda obj: True, only_if_true=False):
            """Wrap `orig(obj, *args)`: once it returned, report that the host waited for
            `target(obj, *args)`, when `gate(obj)` (taken before the call) allows it and, for a
            query, when the answer was True (a successful query is the same acquire edge)."""
            def make(orig):
                def wrapper(obj=None, *args):
                    allowed = gate(obj)
                    if not only_if_true and allowed:
                        b.sink.idle()
                    out = orig(obj, *args)
                    if allowed and (out or not only_if_true) and b._live():
                        t = target(obj, *args)
                        if t is not None:
                            b.emit_host_sync(kind, t)
                    return out
                wrapper.__wrapped__ = orig
                return wrapper
            return make

        def device_index(device=None):
            if device is None:
                return b._current_device()
            if isinstance(device, int):
                return device
            idx = torch.device(device).index
            return b._current_device() if idx is None else idx

        def device_sync(orig):
            """`synchronize(device=None)` (the module's, torch.accelerator's): the host waited for
            the device; by keyword too, which host_sync's positional wrapper does not take."""
            def synchronize(device=None):
                b.sink.idle()
                out = orig(device)
                if b._live():
                    b.emit_host_sync("device", device_index(device))
                return out
            synchronize.__wrapped__ = orig
            return synchronize

        def untraced(kind):
            """Events the runtime reports itself once created: the wrapper covers the rest."""
            return lambda ev: not (getattr(ev, EH, 0) and kind in traced)

        def make_wait_stream(orig):
            """`waiter.wait_stream(waitee)`: torch makes, records and waits on a new event; one
            edge says the same (the record and wait wrappers are muted meanwhile)."""
            def wait_stream(waiter, waitee):
                if not b._live() or b.capture_state() is not None:
                    return orig(waiter, waitee)
                with b.muted():
                    out = orig(waiter, waitee)
                try:
                    s = b.sink
                    s.emit(StreamWaitStream(s.thread_tid(), b.stream_of(waiter),
                                            b.stream_of(waitee), stacks.capture()))
                except Exception as exc:
                    b.sink.internal_error(exc, "in Stream.wait_stream wrapper")
                return out
            return wait_stream

        if native.speedups is not None and not traced:     # the same wrappers in C
            make_record = self._native_hook(1, EventRecord, _EID_ATTR, "in Event.record wrapper")
            make_wait = self._native_hook(2, StreamWaitEvent, _EID_ATTR, "in Event.wait wrapper")
            make_wait_stream = self._native_hook(4, StreamWaitStream, _EID_ATTR,
                                                 "in Stream.wait_stream wrapper")

        Event, Stream = m.Event, m.Stream
        self._patch(Event, "record", make_record)
        self._patch(Event, "wait", make_wait)
        if not traced:      # with trace callbacks, the runtime reports the record and the wait
            self._patch(Stream, "wait_stream", make_wait_stream)
        self._patch(Event, "synchronize",
                    host_sync("event", b._eid_of, untraced("event_synchronization")))
        self._patch(Event, "query",
                    host_sync("event", b._eid_of, lambda ev: getattr(ev, EH, 0), only_if_true=True))
        self._patch(Stream, "query", host_sync("stream", b.stream_of, only_if_true=True))
        if "stream_synchronization" not in traced:
            self._patch(Stream, "synchronize", host_sync("stream", b.stream_of))
        if "device_synchronization" not in traced:
            self._patch(m, "synchronize", device_sync)
            acc = getattr(torch, "accelerator", None)
            if acc is not None and hasattr(acc, "synchronize") and self._is_accelerator():
                self._patch(acc, "synchronize", device_sync)
        graph_cls = getattr(m, self.graph_class_name, None)
        if graph_cls is not None:
            self._install_graph_wrappers(graph_cls)
        # Tensor.record_stream must reach the real runtime (the allocator's bookkeeping) and
        # the dispatch mode (aten.record_stream), not the sim-style patch that swallows it.
        cur = torch.Tensor.record_stream
        orig = getattr(cur, "__wrapped__", None)
        if orig is not None:
            torch.Tensor.record_stream = orig
            self._undo.append(lambda: setattr(torch.Tensor, "record_stream", cur))

    def _install_graph_wrappers(self, cls) -> None:
        b = self

        def make_begin(orig):
            def capture_begin(g, *args, **kwargs):
                out = orig(g, *args, **kwargs)
                if b._live():
                    cap = _Capture(g, None)
                    cap.prev = b.set_capture_state(cap)
                    cap.gc_was_enabled = gc.isenabled()
                    # The instrumentation makes Python garbage on every op; a collection during
                    # capture can free a pinned host block (an event record on the capturing
                    # stream), which invalidates the program's capture.
                    gc.disable()
                    b._capturing += 1
                return out
            return capture_begin

        def make_end(orig):
            def capture_end(g):
                s = b.sink
                cap = b.capture_state()
                mine = isinstance(cap, _Capture) and cap.graph is g
                try:
                    out = orig(g)
                finally:
                    if mine:
                        b.set_capture_state(cap.prev)
                        b._capturing -= 1
                        if cap.gc_was_enabled:
                            gc.enable()
                if mine and b._live():
                    gid = s.new_graph_id()
                    g.__dict__[_GID_ATTR] = (b._token, gid)
                    s.emit(GraphCapture(s.thread_tid(), gid, list(cap.ops), stacks.capture()))
                return out
            return capture_end

        def make_replay(orig):
            def replay(g):
                d = g.__dict__.get(_GID_ATTR)
                if not (b._live() and d is not None and d[0] is b._token):
                    return orig(g)
                tid = b.current_stream_tid()
                hook = b.before_launch
                if hook is not None:
                    hook(tid, "graph_replay")
                out = orig(g)
                # reported once launched: its cost overlaps the graph's work, not delays it
                try:
                    s = b.sink
                    s.emit(GraphReplay(s.thread_tid(), d[1], tid, stacks.capture()))
                except Exception as exc:
                    b.sink.internal_error(exc, "in graph replay wrapper")
                return out
            return replay

        if native.speedups is not None:                   # the same wrapper in C
            make_replay = self._native_hook(3, GraphReplay, _GID_ATTR, "in graph replay wrapper")

        self._patch(cls, "capture_begin", make_begin)
        self._patch(cls, "capture_end", make_end)
        self._patch(cls, "replay", make_replay)

    def _native_hook(self, kind, event_type, attr, where):
        """`make(orig)` for `_patch`: a wrapper of `Event.record` (kind 1), `Event.wait` (2), a
        graph's `replay` (3) or `Stream.wait_stream` (4) in C (instrumentation/_speedups.c SyncHook),
        the Python ones' port for a backend without trace callbacks. `attr` names the per-object
        id (event or graph)."""
        fast = native.speedups
        sink = self.sink

        def make(orig):
            return fast.SyncHook(
                kind=kind, orig=orig, backend=self, globals=globals(), sink=sink, tls=self.tls,
                mute_tls=self._tls, token=self._token, attr=attr, tids=self._tids,
                dtype=self._dtype, stream_of=self.stream_of, current_tid=self.current_stream_tid,
                capture=stacks.capture, emit=sink.emit, event_type=event_type,
                internal_error=sink.internal_error, where=where)
        return make

    # -- special ops ----------------------------------------------------------------------------
    def _record_stream(self, func, args, kwargs):
        if self.capture_state() is None:
            try:
                self.record_stream(args[0], args[1])
            except Exception as exc:
                self.sink.internal_error(exc, "while recording record_stream")
        return func(*args, **kwargs)

    def _is_pinned(self, func, args, kwargs):
        return self.footprints.registry.is_host(args[0])

    # -- execution ------------------------------------------------------------------------------
    def host_wait_stream(self, stream_tid) -> None:
        self.emit_host_sync("stream", stream_tid, skip=4)

    # -- index footprints -----------------------------------------------------------------------
    def index_footprint(self, maker, name, t, args):
        """Exact rows when the index values are on the host; else a same-stream snapshot."""
        if t.is_cpu:
            return _host_index_footprint(maker, name, t, args)
        if name in _ADV_INDEX_OPS:
            idx = args[1] if len(args) > 1 else None
            idx = list(idx) if isinstance(idx, (list, tuple)) else None
        else:
            idx = [args[2]] if len(args) > 2 and isinstance(args[2], torch.Tensor) else None
        if not idx:
            return _host_index_footprint(maker, name, t, args)
        dev_idx = [x for x in idx if isinstance(x, torch.Tensor) and not x.is_cpu]
        if not dev_idx:
            return _host_index_footprint(maker, name, t, args)
        whole = maker.of(t)
        if whole is None:
            return None
        if sum(x.numel() for x in dev_idx) > MAX_SNAPSHOT_ELEMS:
            return maker.whole(t, "index set too large to snapshot; whole tensor used")
        try:
            return self._snapshot(maker, name, t, args, idx, whole)
        except Exception as exc:
            return maker.whole(t, f"index values could not be snapshotted ({type(exc).__name__}); "
                                  "whole tensor used")

    def _snapshot(self, maker, name, t, args, idx, whole):
        m = self.module
        dev = t.get_device()
        with self.muted(), _disable_current_modes():
            stream = m.current_stream(dev)
            copies = []
            bufs = []
            for x in idx:
                if isinstance(x, torch.Tensor) and not x.is_cpu:
                    buf = self._host_buffer(x.numel(), x.dtype)
                    h = buf[:x.numel()].view(x.shape)
                    h.copy_(x, non_blocking=True)
                    copies.append(h)
                    bufs.append(buf)
                else:
                    copies.append(x)
            ev = self._event_pool.pop() if self._event_pool else m.Event()
            ev.record(stream)
        self._outstanding.add(ev)
        geom = (t.storage_offset(), tuple(t.shape), tuple(t.stride()), t.element_size())
        dim = args[1] if name not in _ADV_INDEX_OPS else None
        fp = _DeferredFootprint(whole.storage, whole.ranges, whole.host,
                                "index values not resolved; whole tensor used", whole.born)
        where = (whole.storage, whole.ranges, whole.host, whole.born)
        backend = self
        # No reference cycles here: the closures never point back at `fp`, so the host copies
        # are released (and returned to the pool) by reference counting, never by a later GC
        # pass (a pinned free inside someone's graph capture would invalidate the capture).
        state = {"ev": ev, "copies": copies, "bufs": bufs}

        def resolver(kernel):
            def resolve():
                ev_ = state["ev"]
                if ev_ is None:
                    return None
                if backend._capturing or not backend._event_done(ev_):
                    return None
                backend._outstanding.discard(ev_)
                exact = backend._resolve_index(where, name, geom, dim, state["copies"])
                backend._event_pool.append(ev_)
                for b in state["bufs"]:
                    backend._host_pool.setdefault(b.dtype, []).append(b)
                state.update(ev=None, copies=None, bufs=())
                r = tuple(exact if isinstance(f, _DeferredFootprint) else f for f in kernel.reads)
                w = tuple(exact if isinstance(f, _DeferredFootprint) else f for f in kernel.writes)
                return Kernel(kernel.thread, kernel.stream, r, w, kernel.op, kernel.stack)
            return resolve

        fp.resolver = resolver
        return fp

    def _host_buffer(self, n, dtype):
        """A (pinned) host buffer of at least n elements, from the pool when one is free."""
        free = self._host_pool.get(dtype)
        if free:
            for i, b in enumerate(free):
                if b.numel() >= n:
                    return free.pop(i)
        size = max(64, 1 << max(0, n - 1).bit_length())
        return torch.empty(size, dtype=dtype, pin_memory=not self.strip_pin_memory)

    def _event_done(self, ev) -> bool:
        with self.muted():
            return bool(ev.query())

    def finish_snapshots(self) -> None:
        """Session end: every snapshot has landed (so every deferred footprint resolves)."""
        with self.muted():
            for ev in list(self._outstanding):
                try:
                    ev.synchronize()
                except Exception:
                    pass

    def _resolve_index(self, where, name, geom, dim, copies):
        storage, whole_ranges, host, born = where
        try:
            with self.internal_reads(), _disable_current_modes():
                ranges, approx = _index_ranges(name, geom, dim, copies)
        except Exception as exc:
            ranges, approx = None, f"index values could not be resolved ({type(exc).__name__})"
        if ranges is None:
            return Footprint(storage, whole_ranges, host,
                             (approx or "index values unknown") + "; whole tensor used", born)
        return Footprint(storage, ranges, host, approx, born)

    # -- delays ---------------------------------------------------------------------------------
    def prepare_delays(self) -> None:
        with self.muted():
            self._sleeper.prepare(self._current_device())

    def delay(self, stream, microseconds: float) -> None:
        if microseconds <= 0:
            return
        with self.muted():
            if stream is None:
                stream = self.module.current_stream()
            tid = self.stream_of(stream)
            if tid is None:
                return
            obj = stream if isinstance(stream, self.module.Stream) else self._stream_obj(tid)
            if obj is not None:
                self._sleeper.sleep(obj, obj.device_index, microseconds)

    def delay_tid(self, tid, microseconds: float) -> None:
        if microseconds <= 0:
            return
        with self.muted():
            obj = self._stream_obj(tid)
            if obj is not None:
                self._sleeper.sleep(obj, obj.device_index, microseconds)

    # -- lifetime -------------------------------------------------------------------------------
    def _is_accelerator(self) -> bool:
        """This backend's device type is torch's current accelerator (`torch.accelerator`)."""
        try:
            acc = torch.accelerator.current_accelerator()
        except Exception:
            return False
        return acc is not None and acc.type == self.device_type

    def install(self) -> None:
        global _ACTIVE
        if self._trace is not None:
            self._traced = hook_trace(self._trace, self._trace_style, self._trace_activate)
        if not self._traced:
            self._eid_of = self._obj_eid    # no handle is ever reported: ids live on the objects
        self._install_wrappers()
        _ACTIVE = self
        dev = self._current_device()
        self._register((0, dev, self._dtype))      # "#0" is the default stream
        self.current_stream_tid()

    def uninstall(self) -> None:
        global _ACTIVE
        if _ACTIVE is self:
            _ACTIVE = None
        while self._undo:
            self._undo.pop()()
        with self.muted():
            self._host_pool.clear()
            self._event_pool.clear()
            self._outstanding.clear()


class _Mute:
    __slots__ = ("tls",)

    def __init__(self, tls):
        self.tls = tls

    def __enter__(self):
        self.tls.mute = getattr(self.tls, "mute", 0) + 1

    def __exit__(self, *exc):
        self.tls.mute -= 1
        return False


def _index_ranges(name, geom, dim, copies):
    """(byte ranges, approx) touched by an index op, from host copies of its index values."""
    offset, shape, stride, itemsize = geom
    if not shape:
        return None, "indexed a 0-d tensor"
    # Fast path: whole rows selected along dim 0 (buf[idx], buf[idx] = v, index_select(0, idx)).
    rows = None
    if name in _ADV_INDEX_OPS and len(copies) == 1 and copies[0] is not None \
            and copies[0].dtype not in (torch.bool, torch.uint8):
        rows = copies[0]
    elif name in _DIM_INDEX_OPS and dim in (0, -len(shape)):
        rows = copies[0]
    if rows is not None:
        r = torch.unique(torch.remainder(rows.reshape(-1).to(torch.int64), shape[0]))
        row_runs, approx = strided_ranges(0, shape[1:], stride[1:], itemsize)
        if r.numel() * max(1, len(row_runs)) > MAX_RUNS * 4:
            lo = (offset + int(r.min()) * stride[0]) * itemsize
            hi = (offset + int(r.max()) * stride[0]) * itemsize + max(h for _, h in row_runs)
            return ((min(lo, hi), max(lo, hi)),), "many rows covered by their bounding interval"
        out = []
        step = stride[0] * itemsize
        base = offset * itemsize
        for k in r.tolist():
            b = base + k * step
            out.extend([b + lo, b + hi] for lo, hi in row_runs)
        out.sort()
        merged = []
        for lo, hi in out:
            if merged and lo <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], hi)
            else:
                merged.append([lo, hi])
        return tuple((lo, hi) for lo, hi in merged), approx
    numel = 1
    for n in shape:
        numel *= n
    if numel > MAX_INDEX_ELEMS:
        return None, "index op on a large tensor"
    pos = _positions(offset, shape, stride)
    if name in _ADV_INDEX_OPS:
        sel = torch.ops.aten.index.Tensor(pos, copies)
    elif name in _GATHER_OPS:
        index = copies[0] if copies[0].dim() else copies[0].reshape(1)
        sel = torch.ops.aten.gather.default(pos, dim, index.to(torch.int64))
    else:
        sel = torch.ops.aten.index_select.default(pos, dim, copies[0].reshape(-1).to(torch.int64))
    return positions_to_ranges(sel, itemsize), None
