"""The written interface between the session, its backend and the rest of instrumentation.

`Sink` is what instrumentation needs from the session's recorder (racecheck.core.recorder.Recorder
implements it): emit events in host issue order, hand out ids, say whether checking is on.
`Backend` is what a device kind provides (sim, cuda/ROCm, npu): which stream is current, how an op
executes, how the host waits. Hooks a backend may leave alone have defaults here, so nothing probes
a backend with getattr. Shared mechanics every backend needs (host reads, record_stream, host syncs,
capture state, allocations seen by the storage registry) live here once.
"""
from __future__ import annotations

import abc
import contextlib
from typing import Callable, Protocol

import torch

from racecheck.core import native
from racecheck.core.cnames import read_by_c
from racecheck.core.trace import Alloc, HostAccess, HostSync, Kernel, RecordStream

from . import stacks
from .executor import EagerExecutor, Executor
from .footprints import FootprintMaker, StorageRegistry
from .indexops import index_footprint as host_index_footprint
from .sites import SyncSites


@read_by_c("checking", "seq", "emit", "new_event_id", "thread_tid")
class Sink(Protocol):
    """Where instrumentation's events go (the session's recorder).

    The C hot path (instrumentation/_speedups.c) reads the names in @read_by_c of the sink it is
    given; `tls`, `dead` and `queue` the Python hands it when it builds its objects."""

    checking: bool          # False once racecheck hit an internal error: stop observing
    check_events: bool      # False: a run for its values only, whose events nobody checks
    lock: object            # an RLock held while events are ordered and checked
    tls: object             # thread-local: .tid (host timeline), .capture, .internal
    dead: object            # deque of (storage id, stack) that died and are not reported yet
    seq: int                # events taken off the queue so far
    queue: object           # deque of the events emitted and not checked yet (position is
                            # seq + len(queue): what C plans read without a Python call)

    def emit(self, event) -> None: ...
    def emit_pending(self, event, resolve: Callable) -> None: ...
    def idle(self) -> None: ...     # the host is about to wait for the device (check queued work)
    @property
    def position(self) -> int: ...
    def thread_tid(self) -> int: ...
    def new_timeline(self) -> int: ...
    def new_event_id(self) -> int: ...
    def new_graph_id(self) -> int: ...
    def timeline_name(self, tid: int) -> str: ...
    def internal_error(self, exc: BaseException, where: str = "") -> None: ...
    def set_liveness_poll(self, poll: Callable, before=...) -> None: ...
    def set_namer(self, namer: Callable | None) -> None: ...


class _InternalReads:
    """Context manager counting racecheck's own tensor reads on the current thread."""

    __slots__ = ("tls",)

    def __init__(self, tls):
        self.tls = tls

    def __enter__(self):
        self.tls.internal += 1

    def __exit__(self, *exc):
        self.tls.internal -= 1


@read_by_c("before_launch", "current_stream_tid")
class Backend(abc.ABC):
    """One device kind. Subclasses set `module` (the torch.cuda look-alike users get) and implement
    `current_stream_tid`, `stream_of` and `host_wait_stream`; everything else has a default.

    Optional capabilities, as class attributes or overrides:
      op_stream_tid(args, kwargs)   the stream an op runs on depends on its tensors' device
                                    (None: always the current stream)
      index_footprint(...)          exact rows of index ops (default: index values on the host)
      strip_pin_memory              a CPU-only torch cannot pin: drop the flag, tag host memory
      runs_at_issue                 execute() is a plain call (the fast plan calls the op itself)
      special_ops                   ATen op name -> handler, for ops that make no accesses
    """

    name = "base"
    module = None
    installed = False               # between install_session() and its undo
    routes_cuda = False             # sim standing in for torch.cuda (instrumentation/routing.py)
    op_stream_tid = None
    strip_pin_memory = True
    runs_at_issue = False
    host_wait_emits_only = False    # host_wait_stream(tid) does nothing but emit_host_sync("stream", tid)

    def __init__(self, sink: Sink, executor: Executor | None = None, drop_sync=()):
        self.sink = sink
        self.sites = SyncSites(drop_sync)         # synchronization sites run (and dropped)
        self.tls = sink.tls
        self.executor = executor if executor is not None else EagerExecutor()
        on_new = self._on_new_storage
        fast = native.speedups
        if fast is not None and type(self)._on_new_storage is Backend._on_new_storage:
            on_new = fast.AllocEmitter(sink, sink.tls, self, Alloc)    # the same, in C
        self.footprints = FootprintMaker(StorageRegistry(on_new, sink.dead))
        self.before_launch = None       # (stream tid, op name) -> None, called before each launch
        self.special_ops: dict = {}
        self._internal_reads = _InternalReads(sink.tls)
        from .kernels import KernelLauncher
        self.kernels = KernelLauncher(self)     # Triton launches, declared opaque kernels

    # -- what a backend must say ----------------------------------------------------------------
    @abc.abstractmethod
    def current_stream_tid(self) -> int:
        """Timeline of the current stream of the current device."""

    @abc.abstractmethod
    def stream_of(self, stream) -> int | None:
        """Timeline of a stream object the user passes, or None if it is not this backend's."""

    @abc.abstractmethod
    def host_wait_stream(self, stream_tid: int) -> None:
        """The host blocks until `stream_tid`'s work so far is done (a blocking D2H, `.item()`)."""

    # -- optional hooks -------------------------------------------------------------------------
    @staticmethod
    def execute_plain(func, args, kwargs):
        return func(*args, **kwargs)

    def execute(self, stream_tid, func, args, kwargs):
        return func(*args, **kwargs)

    def index_footprint(self, maker, name, t, args):
        return host_index_footprint(maker, name, t, args)

    def stream_index(self, tid) -> int | None:
        """k of "#k": the order in which this backend first saw the stream (delay plans)."""
        return None

    def delay(self, stream, microseconds: float) -> None:
        """Hold `stream` (a user stream object) back before its next launch."""
        tid = self.stream_of(stream)
        if tid is not None:
            self.delay_tid(tid, microseconds)

    def delay_tid(self, tid: int, microseconds: float) -> None:
        self.executor.delay(tid, microseconds)

    def prepare_delays(self) -> None:
        """Calibrate delays before the program runs (devices with a sleep kernel)."""

    def install(self) -> None:
        """Start observing (wrappers, runtime callbacks)."""

    def uninstall(self) -> None:
        """Stop observing; undo install()."""

    def finish(self) -> None:
        """Session end: complete whatever is still queued or outstanding."""
        self.executor.finish()

    # -- shared mechanics -----------------------------------------------------------------------
    def emit_host_sync(self, kind: str, target, skip: int = 3) -> None:
        """The host blocked until `target` (a stream tid, event id or device) completed."""
        s = self.sink
        s.emit(HostSync(s.thread_tid(), kind, target, stacks.capture(skip=skip)))

    def capture_state(self):
        return self.tls.capture

    def set_capture_state(self, state):
        prev = self.tls.capture
        self.tls.capture = state
        return prev

    def internal_reads(self):
        """racecheck reading tensor values for itself (index footprints): no host-read events."""
        return self._internal_reads

    @contextlib.contextmanager
    def allocating_host(self):
        reg = self.footprints.registry
        prev = reg.new_are_host
        reg.new_are_host = True
        try:
            yield
        finally:
            reg.new_are_host = prev

    def _on_new_storage(self, sid: int, nbytes: int, host: bool) -> None:
        s = self.sink
        thread = self.tls.tid
        if thread is None:
            thread = s.thread_tid()
        stream = self.tls.alloc_stream
        if stream is None:
            stream = self.current_stream_tid()
        s.emit(Alloc(thread, sid, stream, nbytes, host, ()))

    def host_read(self, t: torch.Tensor, op: str, stack=()) -> None:
        """A synchronizing host read (`.item()`, `.tolist()`, `.numpy()`, `int(t)`)."""
        s = self.sink
        if not s.checking or not isinstance(t, torch.Tensor) or t.numel() == 0:
            return
        if self.tls.internal or self.tls.capture is not None:
            return
        fp = self.footprints.of(t)
        if fp.host:
            s.emit(HostAccess(s.thread_tid(), (fp,), (), op, stack))
            return
        stream = self.current_stream_tid()
        s.emit(Kernel(s.thread_tid(), stream, (fp,), (), op, stack))
        self.host_wait_stream(stream)

    def record_stream(self, t: torch.Tensor, stream) -> None:
        """`t.record_stream(stream)`: the allocator keeps t's block until stream's work is done."""
        tid = self.stream_of(stream)
        if tid is None:
            from racecheck.core.errors import UsageError
            raise UsageError(f"{stream!r} is not a stream of this racecheck session")
        s = self.sink
        sid, _ = self.footprints.registry.lookup(t)
        s.emit(RecordStream(s.thread_tid(), sid, tid, stacks.capture()))
