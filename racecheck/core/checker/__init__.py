"""The happens-before checker: vector clocks per stream and per host thread, online.

    c = Checker()                 # Checker(context_window=64)
    c.process(event)              # one trace event at a time, in host issue order
    c.process_all(events)
    c.findings                    # list[Finding], deduplicated by signature, detection order
    c.timeline_name(tid)          # "plan_stream", or "stream 3" / "host 0" by default

The checker knows nothing of torch. Its findings depend only on the trace: no set iteration
order, object ids or timing decides what is reported or in which order.

Model (CUDA semantics)
----------------------
* Every host thread and every stream is a timeline with a vector clock VC[T] (dict tid -> int).
* Launch edge: device work issued by host H onto stream S first does VC[S] ⊔= VC[H] (work
  issued after a host sync is ordered after what the host learned). Done only when H's clock
  changed since S last joined it.
* Thread-start edge (approximation): a host timeline seen for the first time (as an event's
  `thread` or named host by NameTimeline) starts with a copy of the clock of the first host
  timeline ever seen (the session's main thread) at that moment. The real edge is
  `Thread.start()`, which precedes the new thread's first event; copying later can only add
  edges the main thread made between start() and that first event (possible false negatives,
  never false positives).
* Each Kernel / Copy / GraphReplay on S is one epoch: VC[S][S] += 1; its accesses carry
  (S, VC[S][S]). A HostAccess is one epoch of its host timeline.
* EventRecord snapshots VC[S] (re-recording overwrites); StreamWaitEvent joins the latest snapshot
  (a wait on a never-recorded event is a no-op, remembered for RC008); StreamWaitStream joins the
  waitee's clock; HostSync joins a stream's, an event's or every stream's clock into the host;
  a blocking copy involving host memory joins the stream into the host after the copy.
* An access (T, c) is ordered before the point VC iff c <= VC.get(T, 0).

Shadow memory (racecheck.core.shadow): per storage, sorted disjoint byte segments with the last write
and at most one read per timeline. Memory is bounded by the number of distinct access boundaries,
never by run length. (What does grow: one clock snapshot per distinct event id ever recorded,
since the trace has no "event destroyed"; instrumentation should reuse an Event object's id.)

Choices where the rules leave room
----------------------------------
* An op that races with one previous access under two rules (an in-place op reading then writing
  bytes another stream wrote) is reported once, under the first rule found (RC001 for its read).
* RC005 is checked only for device allocations the trace saw allocated (Alloc with host=False):
  pinned host blocks are protected by the host caching allocator's own stream events, and a block
  of unknown allocation stream cannot be judged.
* RC005 is judged when the freed block could first be reused, not at the free: a free while
  another stream's access is unordered opens a hazard on the allocation stream. The stream's next
  device work (kernel, copy, replay) reports it unless the stream caught up with that access
  (waits, or a host sync joined at launch) in between; hazards still open when the trace ends
  are reported by `findings` (the next allocation on that stream would reuse the block).
* RC006 looks at a graph input's bytes the graph actually reads: outside writes to other bytes of
  the same storage are not "refreshes" (a shared buffer pool does not make every graph's unread
  part look like a stale per-replay input).
* RC007: `Footprint.born` is the trace index the next event had when the view was created (the
  session's position), so a replay with seq >= born ran after the view was taken.
* HostSync(device, N) orders the streams named on device N and the streams of unknown device.
* A host-side no-op wait (event.synchronize() before any record) is named `event.synchronize`
  in RC008 findings; a stream-side one `wait_event`.
* RC008 comes with a race whose current side made a no-op wait meant to order the pair: on an
  event recorded later on the previous access's stream, covering that access; or on an event
  never recorded at all (a fresh Event, a stale handle), waited on after the previous access was
  issued. The latter names the first event recorded on that stream after the access, if any.
* Races already reported for the same segment and code sites are recognized cheaply before any
  Finding is built (racy loops cost little), per storage, dropped with the storage.

The package, by concern (as ThreadSanitizer keeps tsan_rtl_access, tsan_rtl_mutex, tsan_mman and
tsan_rtl_report apart): `Checker` is one object, its handlers mixed in from
  timelines  timelines, vector clocks, the launch edge
  access     kernels, copies, host accesses; shadow memory reads and writes (RC001-RC004)
  sync       event records, waits, host syncs; no-op waits (RC008)
  memory     allocations, frees, record_stream; RC005 hazards
  graphs     capture, replay (per op or merged), RC006, RC007, stale-tolerant indices
  naming     names of tensors and timelines, how a finding describes bytes and stacks
  report     races noted during an event, flushed into findings with their context
over the state declared in `state` (FIELDS: every attribute, and which of them the C engine's
export rebuilds). One object rather than objects per concern: the per-event path reads
`self._shadow`, `self._tl` directly, as fast as before the split (bench/bench_checker.py).
"""
from __future__ import annotations

from racecheck.core.checker import state
from racecheck.core.checker.access import Accesses
from racecheck.core.checker.graphs import Graphs
from racecheck.core.checker.memory import Memory
from racecheck.core.checker.naming import Names
from racecheck.core.checker.report import Reporting
from racecheck.core.checker.sync import Sync
from racecheck.core.checker.timelines import Timelines
from racecheck.core.findings import FindingSet, assign_groups
from racecheck.core.trace import (Alloc, Copy, EventRecord, Free, GraphCapture, GraphReplay,
                                  HostAccess, HostSync, Kernel, NameTensor, NameTimeline,
                                  RecordStream, StaleTolerant, StreamWaitEvent, StreamWaitStream)

__all__ = ["Checker"]

_SITED = (Kernel, Copy, HostAccess)    # events whose op names the storages allocated before it


class Checker(Timelines, Accesses, Sync, Memory, Graphs, Names, Reporting):
    # graph replays merged into shadow memory in one step where the per-op update could note
    # nothing (racecheck.core.replay); False runs every replay op by op (tests compare the two)
    merge_replays = True
    # ... for graphs with at least this many captured accesses per interval of their replay
    # footprint: a merged interval costs about what 2-3 per-op accesses cost (bench/sim_profile.py)
    merge_min_accesses = 3

    def __init__(self, context_window: int = 64):
        self._make(context_window, exported=True)

    @classmethod
    def awaiting_export(cls, context_window: int = 64) -> "Checker":
        """A checker without the state the C engine's export sets (FastChecker's handover)."""
        c = cls.__new__(cls)
        c._make(context_window, exported=False)
        return c

    def _make(self, context_window, exported: bool) -> None:
        self.context_window = int(context_window)
        state.initialize(self, exported)
        self._handlers = {
            Kernel: self._on_kernel, Copy: self._on_copy, EventRecord: self._on_record,
            StreamWaitEvent: self._on_wait_event, StreamWaitStream: self._on_wait_stream,
            HostSync: self._on_host_sync, HostAccess: self._on_host_access,
            Alloc: self._on_alloc, Free: self._on_free, RecordStream: self._on_record_stream,
            GraphCapture: self._on_capture, GraphReplay: self._on_replay,
            NameTensor: self._on_name_tensor, NameTimeline: self._on_name_timeline,
            StaleTolerant: self._on_stale_tolerant,
        }

    @property
    def findings(self) -> list:
        """Findings so far, as if the trace ended here (RC005 hazards still open included)."""
        if not self._frees_open and not self._stale_open:
            return assign_groups(self.finding_set.items)
        out = FindingSet(list(self.finding_set.items), set(self.finding_set._seen))
        for f in self._still_open():
            out.add(f)
        for hz in self._stale_open:
            if self._mutated_since(hz.into, hz.captured):
                out.add(hz.finding)
        return assign_groups(out.items)

    @property
    def events_processed(self) -> int:
        return self._seq

    def process(self, event) -> None:
        seq = self._seq
        self._seq = seq + 1
        h = self._handlers.get(type(event))
        if h is None:
            h = self._handler_for(event)
            if h is None:
                return
        h(event, seq)
        if self._pend:
            self._flush()
        if self._unsited and isinstance(event, _SITED):
            self._assign_sites(event)

    def process_all(self, events) -> "Checker":
        hget = self._handlers.get
        seq = self._seq
        try:
            for ev in events:
                s = seq
                seq += 1        # counted even if it raises, as in process()
                h = hget(type(ev))
                if h is None:
                    h = self._handler_for(ev)
                if h is not None:
                    h(ev, s)
                    if self._pend:
                        self._flush()
                    if self._unsited and isinstance(ev, _SITED):
                        self._assign_sites(ev)
        finally:
            # handlers take seq as an argument; the counter is only stored once
            self._seq = seq
        return self

    def stats(self) -> dict:
        """Sizes of the checker's state (to show memory stays flat)."""
        return {"events": self._seq, "timelines": len(self._tl), "storages": len(self._shadow),
                "segments": sum(len(s.states) for s in self._shadow.values()),
                "event_records": len(self._records), "graphs": len(self._graphs),
                "findings": len(self.finding_set)}

    def _handler_for(self, event):
        for cls in type(event).__mro__:
            h = self._handlers.get(cls)
            if h is not None:
                self._handlers[type(event)] = h
                return h
        return None
