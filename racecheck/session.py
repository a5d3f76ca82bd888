"""`racecheck.session(...)`: instrumentation + trace + online checker for one block of code.

The session owns the id spaces (timelines, events, graphs), the host-thread timelines, the
storage registry and the lock that puts events in host issue order. It never raises on a race:
findings are collected, deduplicated and read from `rc.findings` afterwards. A bug inside
racecheck turns checking off and is kept in `rc.internal_errors`; the program runs on unchanged.
"""
from __future__ import annotations

import collections
import contextlib
import sys
import threading
import traceback

import torch

from .checker import Checker
from .errors import UsageError
from .trace import (Alloc, Free, HostAccess, HostSync, Kernel, NameTensor, NameTimeline, RecordStream,
                    StreamWaitEvent, StreamWaitStream, Trace)

DEVICES = ("sim", "cuda", "npu")
# Events reach the checker in batches of this many (or sooner, when anything reads its results):
# one tight loop over the checker's code and state costs far less than one visit per op.
BATCH = 128

_active = None
_active_lock = threading.Lock()


class _ThreadState(threading.local):
    """Per host thread; class defaults keep lookups free of AttributeError (slow) on the hot path."""

    tid = None
    capture = None
    internal = 0      # > 0 while racecheck itself reads tensors (index footprints): not host reads


def active_session():
    return _active


class _InternalReads:
    """Context manager counting racecheck's own tensor reads on the current thread."""

    __slots__ = ("tls",)

    def __init__(self, tls):
        self.tls = tls

    def __enter__(self):
        self.tls.internal += 1

    def __exit__(self, *exc):
        self.tls.internal -= 1


class _Unresolved:
    """A queued event whose footprints are not known yet; `resolve()` finishes it or says None."""

    __slots__ = ("event", "resolve")

    def __init__(self, event, resolve):
        self.event, self.resolve = event, resolve


class Session:
    _busy = False       # an event is being processed or the pending queue flushed (this thread holds the lock)
    def __init__(self, device: str = "sim", *, executor=None, record_trace: bool = False,
                 before_launch=None, delay_plan=None, device_module=None, **backend_options):
        if device not in DEVICES:
            raise UsageError(f"unknown device {device!r} (choose from {', '.join(DEVICES)})")
        self.device = device
        self._checker = Checker()
        self._trace = Trace() if record_trace else None
        self.checking = True
        self._internal_errors: list = []
        self.before_launch = before_launch
        self.delay_plan = delay_plan
        self.seq = 0
        self._lock = threading.RLock()
        self._tls = _ThreadState()
        self._internal_reads = _InternalReads(self._tls)
        self._next_timeline = 0
        self._next_event = 0
        self._next_graph = 0
        self._host_threads = 0
        self._executor = executor
        self._device_module_override = device_module
        self._backend_options = backend_options
        self._patches: list = []
        self._modes: list = []
        self._pending = collections.deque()   # events (or _Unresolved) not yet checked, in order
        self._unresolved = 0
        self._liveness = None          # executor hook: storage ids the program has dropped
        self._freed: set = set()       # storage ids whose Free was emitted early (by the hook)
        self.backend = None
        from racecheck.instrumentation.footprints import FootprintMaker, StorageRegistry
        self.footprints = FootprintMaker(StorageRegistry(self._on_new_storage))
        self._dead = self.footprints.registry.dead

    # -- ids and timelines ----------------------------------------------------------------------
    def new_timeline(self) -> int:
        with self._lock:
            self._next_timeline += 1
            return self._next_timeline

    def new_event_id(self) -> int:
        with self._lock:
            self._next_event += 1
            return self._next_event

    def new_graph_id(self) -> int:
        with self._lock:
            self._next_graph += 1
            return self._next_graph

    def thread_tid(self) -> int:
        tid = self._tls.tid
        if tid is None:
            tid = self._tls.tid = self.new_timeline()
            name = "host" if self._host_threads == 0 else f"host:{threading.current_thread().name}"
            self._host_threads += 1
            self.emit(NameTimeline(tid, tid, name, True, None))
        return tid

    def timeline_name(self, tid: int) -> str:
        return self.checker.timeline_name(tid)

    # -- events ---------------------------------------------------------------------------------
    @property
    def checker(self) -> Checker:
        """The online checker, once every event emitted so far has reached it."""
        self.flush_pending()
        return self._checker

    @property
    def trace(self):
        """The recorded Trace (record_trace=True), else None."""
        self.flush_pending()
        return self._trace

    @property
    def internal_errors(self) -> list:
        self.flush_pending()
        return self._internal_errors

    def emit(self, event) -> None:
        """Queue `event` for the checker, in host issue order (emitted while an event is being
        processed, by a runtime callback fired inside racecheck, it goes behind the others).

        The common case takes no lock: deque appends and pops are atomic, the queue is only
        ever taken from its left end, and the checker runs under the lock."""
        pending = self._pending
        if self._unresolved or self._liveness is not None:
            with self._lock:
                if self._liveness is not None and type(event) in self._liveness_before:
                    self._poll_liveness()
                if self._dead:
                    self._drain_dead()
                pending.append(event)
                if (self._unresolved or len(pending) >= BATCH) and not self._busy:
                    self.flush_pending()
            return
        if self._dead:
            self._drain_dead()
        pending.append(event)
        if len(pending) >= BATCH and not self._busy:
            self.flush_pending()

    @property
    def position(self) -> int:
        """Trace index the next emitted event will have."""
        return self.seq + len(self._pending)

    def emit_pending(self, event, resolve) -> None:
        """Emit `event` whose footprints are not known yet (index values still on the device).

        `resolve()` returns None while the values are not available, else the finished event.
        Events after it wait in order behind it, so the checker still sees host issue order.
        """
        with self._lock:
            self._pending.append(_Unresolved(event, resolve))
            self._unresolved += 1
            self.flush_pending()

    def flush_pending(self, force: bool = False) -> None:
        """Hand every event whose footprints are resolved to the checker, in order.

        With force=True the caller guarantees that all device work has completed (a device
        synchronize), so every resolver must succeed.
        """
        with self._lock:
            if self._busy:          # re-entered (from a resolver or a callback): the outer loop goes on
                return
            self._busy = True
            try:
                self._flush_locked(force)
            finally:
                self._busy = False

    def _flush_locked(self, force: bool) -> None:
        pending = self._pending
        while pending:
            if not self._unresolved:
                take = pending.popleft     # (not list() then clear(): another thread may append)
                self._check([take() for _ in range(len(pending))])
                continue            # runtime callbacks may have queued more meanwhile
            batch = []
            while pending and type(pending[0]) is not _Unresolved:
                batch.append(pending.popleft())
            if batch:
                self._check(batch)
                continue
            try:
                done = pending[0].resolve()
            except Exception as exc:
                self.internal_error(exc, "while resolving a deferred footprint")
                self._drop_pending()
                return
            if done is None:
                if not force:
                    return
                self.internal_error(RuntimeError("unresolvable deferred footprint"), "flush")
                self._drop_pending()
                return
            pending.popleft()
            self._unresolved -= 1
            self._check([done])

    def _check(self, batch: list) -> None:
        """Record and check events taken off the queue, in order."""
        self.seq += len(batch)
        if self._trace is not None:
            self._trace.events.extend(batch)
        if self.checking:
            checker = self._checker
            start = checker.events_processed
            try:
                checker.process_all(batch)
            except Exception as exc:
                failed = batch[checker.events_processed - start - 1]
                self.internal_error(exc, f"while checking {type(failed).__name__}")

    def _drop_pending(self) -> None:
        self._pending.clear()
        self._unresolved = 0

    def set_liveness_poll(self, poll, before=(HostSync, StreamWaitEvent, StreamWaitStream)) -> None:
        """Executor hook (queued execution): `poll()` returns ids of storages the program has
        dropped while queued work still holds them. Polled before each event of a type in
        `before` (those that change the clocks a Free is checked against), so their Free reaches
        the checker where it would with eager execution, and not again when they really die."""
        self._liveness = poll
        self._liveness_before = tuple(before)

    def _poll_liveness(self) -> None:
        try:
            early = self._liveness()
        except Exception as exc:
            self._liveness = None
            self.internal_error(exc, "while polling storage liveness")
            return
        if early:
            dead = self._dead
            for sid in early:
                if sid not in self._freed:
                    dead.append(sid)

    def _drain_dead(self) -> None:
        """Queue a Free for each storage that died (under the lock where a liveness poll is set:
        it shares the `_freed` set)."""
        dead = self._dead
        thread = self._tls.tid
        if thread is None:
            thread = self.thread_tid()
        freed = self._freed
        pending = self._pending
        while dead:
            sid = dead.popleft()
            if self._liveness is not None:
                if sid in freed:
                    continue
                freed.add(sid)
            pending.append(Free(thread, sid, ()))

    def _on_new_storage(self, sid: int, nbytes: int, host: bool) -> None:
        stream = self.backend.current_stream_tid() if self.backend is not None else 0
        thread = self._tls.tid
        if thread is None:
            thread = self.thread_tid()
        self.emit(Alloc(thread, sid, stream, nbytes, host, ()))

    def internal_error(self, exc: BaseException, where: str = "") -> None:
        """Stop checking; keep the program's results. The CLI reports this as exit 3."""
        self.checking = False
        self._internal_errors.append(f"{where}: {type(exc).__name__}: {exc}\n"
                                    + "".join(traceback.format_exception(exc)))

    # -- per-thread state -----------------------------------------------------------------------
    def capture_state(self):
        return self._tls.capture

    def set_capture_state(self, state):
        prev = self._tls.capture
        self._tls.capture = state
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

    # -- user API -------------------------------------------------------------------------------
    @property
    def device_module(self):
        return self.backend.module

    @property
    def findings(self) -> list:
        return list(self.checker.findings)

    def name(self, t: torch.Tensor, name: str) -> None:
        if not isinstance(t, torch.Tensor) or t.numel() == 0:
            return
        fp = self.footprints.of(t)
        lo = min(r[0] for r in fp.ranges)
        hi = max(r[1] for r in fp.ranges)
        row_bytes = t.stride(0) * t.element_size() if t.dim() > 1 else t.element_size()
        self.emit(NameTensor(self.thread_tid(), fp.storage, lo, hi, str(name), row_bytes,
                             t.element_size(), ()))

    def name_stream(self, stream, name: str) -> None:
        tid = self._stream_tid(stream)
        self.emit(NameTimeline(self.thread_tid(), tid, str(name), False, None))
        notify = getattr(getattr(self.backend, "executor", None), "stream_named", None)
        if notify is not None:
            notify(tid, str(name))

    def _stream_tid(self, stream) -> int:
        tid = self.backend.stream_of(stream)
        if tid is None:
            raise UsageError(f"{stream!r} is not a stream of this racecheck session")
        return tid

    def host_read(self, t: torch.Tensor, op: str, stack=()) -> None:
        """A synchronizing host read (`.item()`, `.tolist()`, `.numpy()`, `int(t)`)."""
        if not self.checking or not isinstance(t, torch.Tensor) or t.numel() == 0:
            return
        if self._tls.internal or self.capture_state() is not None:
            return
        fp = self.footprints.of(t)
        if fp.host:
            self.emit(HostAccess(self.thread_tid(), (fp,), (), op, stack))
            return
        stream = self.backend.current_stream_tid()
        self.emit(Kernel(self.thread_tid(), stream, (fp,), (), op, stack))
        self.backend.host_wait_stream(stream)

    def record_stream(self, t: torch.Tensor, stream) -> None:
        tid = self._stream_tid(stream)
        sid, _ = self.footprints.registry.lookup(t)
        from racecheck.instrumentation import stacks
        self.emit(RecordStream(self.thread_tid(), sid, tid, stacks.capture()))

    def save_trace(self, path) -> None:
        trace = self.trace
        if trace is None:
            raise UsageError("the session was not started with record_trace=True")
        trace.save(path)

    # -- lifetime -------------------------------------------------------------------------------
    def __enter__(self):
        global _active
        with _active_lock:
            if _active is not None:
                raise RuntimeError("a racecheck session is already active")
            _active = self
        try:
            from racecheck.instrumentation import make_backend
            self.backend = make_backend(self, self.device, executor=self._executor,
                                        device_module=self._device_module_override,
                                        **self._backend_options)
            if self.delay_plan is not None:   # delays before chosen launches, on every backend
                from racecheck.instrumentation.delays import DelayPlan
                self.before_launch = DelayPlan.parse(self.delay_plan).hook(
                    self, chain=self.before_launch)
            self.thread_tid()
            self._install()
        except BaseException:
            with _active_lock:
                _active = None
            raise
        return self

    def __exit__(self, exc_type, exc, tb):
        global _active
        try:
            try:
                self.backend.executor.finish()
                self.flush_pending(force=True)
            except Exception as e:
                self.internal_error(e, "while finishing queued work")
            self._uninstall()
            with self._lock:
                if self._dead:
                    self._drain_dead()
                    self.flush_pending(force=True)
            self.checking = False
        finally:
            with _active_lock:
                _active = None
        return False

    def _install(self) -> None:
        from racecheck.instrumentation.interceptor import Interceptor
        from racecheck.instrumentation.patches import install_patches
        self._patches = install_patches(self)
        mode = Interceptor(self, self.backend)
        mode.__enter__()
        self._modes.append(mode)
        self._prev_threading_profile = threading.getprofile() if hasattr(threading, "getprofile") else None
        threading.setprofile(self._thread_start_hook)
        self.backend.install()

    def _uninstall(self) -> None:
        self.backend.uninstall()
        threading.setprofile(self._prev_threading_profile)
        while self._modes:
            self._modes.pop().__exit__(None, None, None)
        for undo in reversed(self._patches):
            undo()
        self._patches = []

    def _thread_start_hook(self, frame, event, arg):
        """First call in a thread started inside the session: put the interceptor on its mode stack."""
        sys.setprofile(None)
        if _active is self and self.checking:
            from racecheck.instrumentation.interceptor import Interceptor
            Interceptor(self, self.backend).__enter__()


def session(device: str = "sim", **options) -> Session:
    """Context manager: `with racecheck.session(device="sim") as rc: ...; rc.findings`."""
    return Session(device, **options)
