"""The recorder: where instrumentation's events go, in host issue order, on their way to the checker.

It owns the id spaces (timelines, events, graphs), the host-thread timelines, the queue that hands
events to the online checker in batches, the optional saved trace, and the list of racecheck's own
internal errors. It knows nothing of torch or of any backend: `racecheck.instrumentation.base.Sink`
is the interface instrumentation sees, and this class implements it.
"""
from __future__ import annotations

import collections
import threading
import traceback

from racecheck.core import native
from racecheck.core.cnames import read_by_c
from racecheck.core.fastchecker import new_checker
from racecheck.core.trace import (Copy, Free, GraphReplay, HostSync, Kernel, NameTimeline, StreamWaitEvent,
                    StreamWaitStream, Trace)

# Events reach the checker in batches: one tight loop over the checker's code and state costs far
# less than one visit per op. A batch is checked when the host is about to wait for the device (a
# `HostSync` is emitted or `idle()` called) and at least BATCH events are queued, so that the work
# overlaps the device's; at CAP events in any case (a program that never waits); and whenever
# anything reads the checker's results. 128, not 32: a decode step of ~27 events then checks every
# fourth or fifth host wait, not every other one (a flush and a batch have fixed costs).
BATCH = 128
CAP = 1024


@read_by_c("tid", "capture", "internal", "alloc_stream")
class ThreadState(threading.local):
    """Per host thread; class defaults keep lookups free of AttributeError (slow) on the hot path.

    `tid` is the thread's host timeline; `capture` the graph being captured on this thread (set by
    the backend); `internal` > 0 while racecheck itself reads tensors (not host reads);
    `alloc_stream` the stream of the op whose new outputs are being registered (the allocator
    took their memory there; None: the current stream)."""

    tid = None
    capture = None
    internal = 0
    alloc_stream = None


class _Unresolved:
    """A queued event whose footprints are not known yet; `resolve()` finishes it or says None."""

    __slots__ = ("event", "resolve")

    def __init__(self, event, resolve):
        self.event, self.resolve = event, resolve


@read_by_c("checking", "seq", "emit", "new_event_id", "thread_tid", "_busy", "flush_pending")
class Recorder:
    """Implements `Sink`: ids, host timelines, the ordered event queue, the checker behind it."""

    _busy = False       # an event is being processed or the queue flushed (this thread holds the lock)

    def __init__(self, *, record_trace: bool = False, check: bool = True):
        self._checker = new_checker()
        self._trace = Trace() if record_trace else None
        self.checking = True
        self.check_events = check       # False: events are taken off the queue unchecked
        self._internal_errors: list = []
        self.seq = 0
        self.lock = threading.RLock()
        self.tls = ThreadState()
        self._next_timeline = 0
        self._next_event = 0
        self._next_graph = 0
        self._host_threads = 0
        self.queue = collections.deque()      # events (or _Unresolved) not yet checked, in order
        self._unresolved = 0
        self._liveness = None          # executor hook: storage ids the program has dropped
        self._liveness_before = ()
        self._freed: set = set()       # storage ids whose Free was emitted early (by the hook)
        self.dead: collections.deque = collections.deque()   # (block, stack) that died, unreported
        self._fast_emit = None
        fast = native.speedups
        if fast is not None and type(self).emit is Recorder.emit:
            # emit's common case in C; the rest through the method below
            self.emit = self._fast_emit = fast.Emitter(
                self, self.queue, BATCH, CAP, HostSync, Recorder.emit.__get__(self), self.dead,
                self.tls, Free)

    def _divert(self) -> None:
        """Tell the C emit whether its common case holds (nothing unresolved, no liveness poll)."""
        if self._fast_emit is not None:
            self._fast_emit.divert = int(bool(self._unresolved or self._liveness is not None))

    def set_namer(self, namer) -> None:
        """`namer(storage, lo, hi) -> str | None`: the program's name for an unnamed tensor. A
        namer may also offer `prefetch(storages)`: the checker then asks for the storages of
        one event's findings together (a namer that walks the process's objects walks once)."""
        self._checker.namer = namer

    def set_settled(self, settled) -> None:
        """`settled(rule, current, previous) -> bool`: races the caller sets apart by rule and
        code site alone (racecheck.core.suppressions.settled_by); their findings are made
        without asking the namer."""
        self._checker.settled = settled

    # -- ids and timelines ----------------------------------------------------------------------
    def new_timeline(self) -> int:
        with self.lock:
            self._next_timeline += 1
            return self._next_timeline

    def new_event_id(self) -> int:
        with self.lock:
            self._next_event += 1
            return self._next_event

    def new_graph_id(self) -> int:
        with self.lock:
            self._next_graph += 1
            return self._next_graph

    def thread_tid(self) -> int:
        tid = self.tls.tid
        if tid is None:
            tid = self.tls.tid = self.new_timeline()
            name = "host" if self._host_threads == 0 else f"host:{threading.current_thread().name}"
            self._host_threads += 1
            self.emit(NameTimeline(tid, tid, name, True, None))
        return tid

    def timeline_name(self, tid: int) -> str:
        return self.checker.timeline_name(tid)

    # -- results --------------------------------------------------------------------------------
    @property
    def checker(self):
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

    def internal_error(self, exc: BaseException, where: str = "") -> None:
        """Stop checking; keep the program's results. The CLI reports this as exit 3."""
        self.checking = False
        self._internal_errors.append(f"{where}: {type(exc).__name__}: {exc}\n"
                                     + "".join(traceback.format_exception(exc)))

    # -- events ---------------------------------------------------------------------------------
    def emit(self, event) -> None:
        """Queue `event` for the checker, in host issue order (emitted while an event is being
        processed, by a runtime callback fired inside racecheck, it goes behind the others).

        The common case takes no lock: deque appends and pops are atomic, the queue is only
        ever taken from its left end, and the checker runs under the lock."""
        pending = self.queue
        if self._unresolved or self._liveness is not None:
            with self.lock:
                if self._liveness is not None and type(event) in self._liveness_before:
                    self._poll_liveness()
                if self.dead:
                    self._drain_dead()
                pending.append(event)
                n = len(pending)
                if (self._unresolved or n >= CAP or (n >= BATCH and type(event) is HostSync)) \
                        and not self._busy:
                    self.flush_pending()
            return
        if self.dead:
            self._drain_dead()
        pending.append(event)
        n = len(pending)
        if (n >= CAP or (n >= BATCH and type(event) is HostSync)) and not self._busy:
            self.flush_pending()

    def idle(self) -> None:
        """The host is about to wait for the device: check a batch now, while the device works."""
        if len(self.queue) >= BATCH and not self._busy:
            self.flush_pending()

    @property
    def position(self) -> int:
        """Trace index the next emitted event will have."""
        return self.seq + len(self.queue)

    def emit_pending(self, event, resolve) -> None:
        """Emit `event` whose footprints are not known yet (index values still on the device).

        `resolve()` returns None while the values are not available, else the finished event.
        Events after it wait in order behind it, so the checker still sees host issue order.
        """
        with self.lock:
            self.queue.append(_Unresolved(event, resolve))
            self._unresolved += 1
            self._divert()
            self.flush_pending()

    def flush_pending(self, force: bool = False) -> None:
        """Hand every event whose footprints are resolved to the checker, in order.

        With force=True the caller guarantees that all device work has completed (a device
        synchronize), so every resolver must succeed.
        """
        with self.lock:
            if self._busy:          # re-entered (from a resolver or a callback): the outer loop goes on
                return
            self._busy = True
            try:
                self._flush_locked(force)
            finally:
                self._busy = False

    def _flush_locked(self, force: bool) -> None:
        pending = self.queue
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
            self._divert()
            self._check([done])

    def _check(self, batch: list) -> None:
        """Record and check events taken off the queue, in order."""
        self.seq += len(batch)
        if self._trace is not None:
            self._trace.events.extend(batch)
        if self.checking and self.check_events:
            checker = self._checker
            start = checker.events_processed
            try:
                checker.process_all(batch)
            except Exception as exc:
                failed = batch[checker.events_processed - start - 1]
                self.internal_error(exc, f"while checking {type(failed).__name__}")

    def _drop_pending(self) -> None:
        self.queue.clear()
        self._unresolved = 0
        self._divert()

    # -- storage deaths -------------------------------------------------------------------------
    def set_liveness_poll(self, poll, before=(HostSync, StreamWaitEvent, StreamWaitStream, Kernel,
                                              Copy, GraphReplay)) -> None:
        """Executor hook (queued execution): `poll()` returns ids of storages the program has
        dropped while queued work still holds them. Polled before each event of a type in
        `before` (those that change the clocks a Free is checked against, and device work, which
        settles RC005 on the freed block's stream), so their Free reaches the checker where it
        would with eager execution, and not again when they really die."""
        self._liveness = poll
        self._liveness_before = tuple(before)
        self._divert()

    def _poll_liveness(self) -> None:
        try:
            early = self._liveness()
        except Exception as exc:
            self._liveness = None
            self._divert()
            self.internal_error(exc, "while polling storage liveness")
            return
        if early:
            dead = self.dead
            for sid in early:
                if sid not in self._freed:
                    dead.append((sid, ()))

    def _drain_dead(self) -> None:
        """Queue a Free for each storage that died (under the lock where a liveness poll is set:
        it shares the `_freed` set)."""
        dead = self.dead
        thread = self.tls.tid
        if thread is None:
            thread = self.thread_tid()
        freed = self._freed
        pending = self.queue
        while dead:
            sid, stack = dead.popleft()
            if self._liveness is not None:
                if sid in freed:
                    continue
                freed.add(sid)
            pending.append(Free(thread, sid, stack))

    def close(self) -> None:
        """End of the recording: every storage death reported, every queued event checked."""
        with self.lock:
            if self.dead:
                self._drain_dead()
            self.flush_pending(force=True)
        self.checking = False
