"""The `sim` backend: virtual streams, events and graphs over CPU tensors.

Its device module mirrors `torch.cuda` / `torch.get_device_module(device)` (Stream, Event,
current_stream, stream, set_stream, synchronize, CUDAGraph, graph, ...), so engine code written
against those names runs unchanged. CPU tensors created inside the session are device memory;
`pin_memory=True` at creation marks host memory.
"""
from __future__ import annotations

import contextlib
import threading

import torch
from torch.utils._python_dispatch import _disable_current_modes

from racecheck.core.trace import (EventRecord, GraphCapture, GraphReplay, HostSync, NameTimeline,
                             StreamWaitEvent, StreamWaitStream)

from . import stacks
from .base import Backend


class SimStream:
    """A virtual stream: a timeline of its own in the checker."""

    _backend = None  # bound per session by SimBackend

    def __init__(self, device=None, priority=0, *, _name=None, **_kwargs):
        b = self._backend
        self.tid = b.sink.new_timeline()
        self.priority = priority
        self.device = torch.device("cpu") if device is None else device
        b.streams[self.tid] = self
        b.sink.emit(NameTimeline(b.sink.thread_tid(), self.tid,
                                    _name or f"stream {len(b.streams) - 1}", False, 0))

    @property
    def stream_id(self) -> int:
        return self.tid

    cuda_stream = stream_id

    def wait_stream(self, stream) -> None:
        b = self._backend
        if b.sites.visit("wait_stream"):
            return
        b.sink.emit(StreamWaitStream(b.sink.thread_tid(), self.tid, stream.tid, stacks.capture()))
        b.executor.wait_stream(self.tid, stream.tid)

    def wait_event(self, event) -> None:
        if not self._backend.sites.visit("wait_event"):
            event._wait(self)

    def record_event(self, event=None):
        event = event if event is not None else self._backend.module.Event()
        if not self._backend.sites.visit("record", "record_event"):
            event._record(self)
        return event

    def synchronize(self) -> None:
        if not self._backend.sites.visit("synchronize"):
            self._backend.host_wait_stream(self.tid)

    def query(self) -> bool:
        b = self._backend
        done = b.executor.query_stream(self.tid)
        if done:
            b.sink.emit(HostSync(b.sink.thread_tid(), "stream", self.tid, stacks.capture()))
        return done

    def __enter__(self):
        self._prev = self._backend.current_stream()
        self._backend.set_stream(self)
        return self

    def __exit__(self, *exc):
        self._backend.set_stream(self._prev)

    def __repr__(self):
        return f"<sim Stream {self._backend.sink.timeline_name(self.tid)!r}>"


class SimEvent:
    _backend = None

    def __init__(self, enable_timing=False, blocking=False, interprocess=False, **_kwargs):
        self.eid = self._backend.sink.new_event_id()

    def record(self, stream=None) -> None:
        if not self._backend.sites.visit("record"):
            self._record(stream)

    def _record(self, stream=None) -> None:
        b = self._backend
        stream = stream if stream is not None else b.current_stream()
        b.sink.emit(EventRecord(b.sink.thread_tid(), self.eid, stream.tid, stacks.capture()))
        b.executor.record(self.eid, stream.tid)

    def wait(self, stream=None) -> None:
        if not self._backend.sites.visit("wait_event", "wait"):
            self._wait(stream)

    def _wait(self, stream=None) -> None:
        b = self._backend
        stream = stream if stream is not None else b.current_stream()
        b.sink.emit(StreamWaitEvent(b.sink.thread_tid(), stream.tid, self.eid, stacks.capture()))
        b.executor.wait_event(stream.tid, self.eid)

    def synchronize(self) -> None:
        b = self._backend
        if b.sites.visit("synchronize"):
            return
        b.executor.sync_event(self.eid)
        b.sink.emit(HostSync(b.sink.thread_tid(), "event", self.eid, stacks.capture()))

    def query(self) -> bool:
        b = self._backend
        done = b.executor.query_event(self.eid)
        if done:
            b.sink.emit(HostSync(b.sink.thread_tid(), "event", self.eid, stacks.capture()))
        return done

    def elapsed_time(self, end_event) -> float:
        return 0.0

    def __repr__(self):
        return f"<sim Event {self.eid}>"


class _Capture:
    """Ops recorded while a graph is being captured (they run once, like a warm-up)."""

    def __init__(self, graph):
        self.graph = graph
        self.ops = []
        self.thunks = []

    def add(self, captured, func, args, kwargs, out):
        self.ops.append(captured)
        self.thunks.append((func, args, kwargs, out))


def _rerun(thunks):
    """Replay: re-run captured ops; fresh results land in the tensors captured as outputs."""
    with _disable_current_modes():
        for func, args, kwargs, out in thunks:
            res = func(*args, **kwargs)
            if res is out:
                continue
            if isinstance(out, torch.Tensor) and isinstance(res, torch.Tensor):
                if res.data_ptr() != out.data_ptr():
                    out.copy_(res)
            elif isinstance(out, (list, tuple)):
                for o, r in zip(out, res):
                    if isinstance(o, torch.Tensor) and isinstance(r, torch.Tensor) and r.data_ptr() != o.data_ptr():
                        o.copy_(r)


class SimGraph:
    """`torch.cuda.CUDAGraph` look-alike: capture records, replay re-issues on the current stream."""

    _backend = None

    def __init__(self, keep_graph=False):
        self.gid = self._backend.sink.new_graph_id()
        self._thunks = None
        self._prev_capture = None

    def capture_begin(self, pool=None, capture_error_mode="global"):
        b = self._backend
        self._capture = _Capture(self)
        self._prev_capture = b.set_capture_state(self._capture)

    def capture_end(self):
        b = self._backend
        b.set_capture_state(self._prev_capture)
        self._thunks = self._capture.thunks
        b.sink.emit(GraphCapture(b.sink.thread_tid(), self.gid, list(self._capture.ops),
                                    stacks.capture()))

    def replay(self):
        b = self._backend
        if self._thunks is None:
            raise RuntimeError("replay() of a graph that was never captured")
        stream = b.current_stream()
        hook = b.before_launch
        if hook is not None:
            hook(stream.tid, "graph_replay")
        b.sink.emit(GraphReplay(b.sink.thread_tid(), self.gid, stream.tid, stacks.capture()))
        thunks = self._thunks
        b.executor.launch(stream.tid, lambda: _rerun(thunks))

    def reset(self):
        self._thunks = None

    def pool(self):
        return (0, self.gid)

    def enable_debug_mode(self):
        pass

    def debug_dump(self, path):
        pass


class _GraphContext:
    """`torch.cuda.graph(g)`: synchronize, capture on a side stream, restore the stream."""

    _backend = None

    def __init__(self, cuda_graph, pool=None, stream=None, capture_error_mode="global"):
        self.graph = cuda_graph
        self.capture_stream = stream

    def __enter__(self):
        b = self._backend
        b.module.synchronize()
        if self.capture_stream is None:
            self.capture_stream = b.capture_stream()
        self._prev = b.current_stream()
        b.set_stream(self.capture_stream)
        self.graph.capture_begin()
        return self.graph

    def __exit__(self, *exc):
        b = self._backend
        self.graph.capture_end()
        b.set_stream(self._prev)
        return False


class _StreamContext:
    _backend = None

    def __init__(self, stream):
        self.stream = stream

    def __enter__(self):
        b = self._backend
        self._prev = b.current_stream()
        if self.stream is not None:
            b.set_stream(self.stream)
        return self.stream

    def __exit__(self, *exc):
        self._backend.set_stream(self._prev)
        return False


SIM_CAPABILITY = (9, 0)          # reported like an H100 where programs branch on capability
SIM_MEMORY = 80 * (1 << 30)


class SimDeviceProperties:
    """`torch.cuda.get_device_properties()` look-alike for the one simulated device."""

    name = "racecheck sim"
    major, minor = SIM_CAPABILITY
    total_memory = SIM_MEMORY
    multi_processor_count = 132
    warp_size = 32
    gcnArchName = ""
    is_integrated = False

    def __repr__(self):
        return f"_SimDeviceProperties(name={self.name!r}, major={self.major}, minor={self.minor})"


class _SimCudart:
    """The CUDA runtime calls on host memory, on sim. Host memory (CPU placements, pinned or
    not) is already host memory in the model, so registering a range changes nothing the
    checker sees: each call succeeds (0, cudaSuccess)."""

    @staticmethod
    def cudaHostRegister(ptr, size, flags=0) -> int:
        return 0

    @staticmethod
    def cudaHostUnregister(ptr) -> int:
        return 0

    @staticmethod
    def cudaGetErrorString(code) -> str:
        return "cudaSuccess" if int(code) == 0 else f"cuda error {int(code)}"


_SIM_CUDART = _SimCudart()


class SimDeviceModule:
    """What `rc.device_module` returns on sim: the `torch.cuda` names, virtual underneath."""

    def __init__(self, backend):
        self._backend = backend
        bind = {"_backend": backend}
        self.Stream = type("Stream", (SimStream,), bind)
        self.Event = type("Event", (SimEvent,), bind)
        self.CUDAGraph = type("CUDAGraph", (SimGraph,), bind)
        self.graph = type("graph", (_GraphContext,), bind)
        self.StreamContext = type("StreamContext", (_StreamContext,), bind)

    def current_stream(self, device=None):
        return self._backend.current_stream()

    def default_stream(self, device=None):
        return self._backend.default_stream

    def set_stream(self, stream) -> None:
        self._backend.set_stream(stream)

    def stream(self, stream):
        return self.StreamContext(stream)

    def synchronize(self, device=None) -> None:
        b = self._backend
        if b.sites.visit("synchronize"):
            return
        b.executor.sync_all()
        b.emit_host_sync("device", None, skip=3)

    def is_available(self) -> bool:
        return True

    def device_count(self) -> int:
        return 1

    def current_device(self) -> int:
        return 0

    def set_device(self, device) -> None:
        pass

    def get_device_name(self, device=None) -> str:
        return "racecheck sim"

    def get_device_capability(self, device=None) -> tuple:
        return SIM_CAPABILITY

    def get_device_properties(self, device=None):
        return SimDeviceProperties()

    def mem_get_info(self, device=None) -> tuple:
        return (SIM_MEMORY, SIM_MEMORY)

    def is_initialized(self) -> bool:
        return True

    def init(self) -> None:
        pass

    def _lazy_init(self) -> None:
        pass

    def device(self, device):
        """`torch.cuda.device(i)`: one device, nothing to switch."""
        return contextlib.nullcontext()

    def is_current_stream_capturing(self) -> bool:
        return self._backend.capture_state() is not None

    def graph_pool_handle(self):
        return (0, 0)

    def empty_cache(self) -> None:
        pass

    def memory_allocated(self, device=None) -> int:
        return 0

    def max_memory_allocated(self, device=None) -> int:
        return 0

    def memory_reserved(self, device=None) -> int:
        return 0

    def reset_peak_memory_stats(self, device=None) -> None:
        pass

    def manual_seed(self, seed) -> None:
        """Device RNG state: sim ops draw from the CPU generator, which the program seeds itself."""

    manual_seed_all = manual_seed

    def cudart(self):
        """`torch.cuda.cudart()`: the runtime calls programs make on host memory themselves
        (`cudaHostRegister` pins an existing host buffer, as HiCache's host pool does)."""
        return _SIM_CUDART

    def _sleep(self, cycles: int) -> None:
        """`torch.cuda._sleep` look-alike: a delay on the current stream (adversarial executor only)."""
        b = self._backend
        b.executor.delay(b.current_stream().tid, cycles / 1000.0)

    def __repr__(self):
        return "<racecheck sim device module>"


class _ThreadStream(threading.local):
    stream = None


class SimBackend(Backend):
    name = "sim"
    device_type = "cpu"

    def __init__(self, sink, executor=None, drop_sync=()):
        super().__init__(sink, executor, drop_sync)
        self.streams: dict = {}
        self._tls = _ThreadStream()
        self.module = SimDeviceModule(self)
        self.default_stream = self.module.Stream(_name="default")
        self._capture_stream = None
        self.executor.bind(self)
        self.special_ops = {
            "is_pinned": self._is_pinned,
            "_pin_memory": self._pin,
            "pin_memory": self._pin,
        }

    # -- streams --------------------------------------------------------------------------------
    def current_stream(self):
        return self._tls.stream or self.default_stream

    def current_stream_tid(self) -> int:
        return (self._tls.stream or self.default_stream).tid

    def set_stream(self, stream) -> None:
        if stream is not None:
            self._tls.stream = stream

    def capture_stream(self):
        if self._capture_stream is None:
            self._capture_stream = self.module.Stream(_name="graph capture")
        return self._capture_stream

    # -- execution ------------------------------------------------------------------------------
    @staticmethod
    def execute_plain(func, args, kwargs):
        return func(*args, **kwargs)

    @property
    def runs_at_issue(self) -> bool:
        """execute(stream, func, args, kwargs) is func(*args, **kwargs) (the eager executor)."""
        return self.executor.eager

    def execute(self, stream_tid, func, args, kwargs):
        ex = self.executor
        if ex.eager:
            return func(*args, **kwargs)
        return ex.run(stream_tid, func, args, kwargs)

    def host_wait_stream(self, stream_tid) -> None:
        self.executor.sync_stream(stream_tid)
        self.emit_host_sync("stream", stream_tid, skip=4)

    # -- special ops ----------------------------------------------------------------------------
    def _is_pinned(self, func, args, kwargs):
        return self.footprints.registry.is_host(args[0])

    def _pin(self, func, args, kwargs):
        src = args[0]
        with _disable_current_modes():
            out = torch.empty_like(src)
            out.copy_(src)
        self.footprints.registry.lookup(out, host=True)
        return out

    def stream_index(self, tid) -> int | None:
        for k, t in enumerate(self.streams):
            if t == tid:
                return k
        return None

    def stream_of(self, stream) -> int | None:
        """Timeline id of a stream object the user passes (record_stream), or None if foreign."""
        if isinstance(stream, SimStream):
            return stream.tid
        return None
