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
"""
from __future__ import annotations

import os
from bisect import bisect_left, bisect_right
from collections import deque
from dataclasses import replace
from typing import NamedTuple

from racecheck.core.clocks import join
from racecheck.core.findings import Access, ContextEvent, FindingSet, Place, Race, assign_groups, describe
from racecheck.core.replay import RECIPES_KEPT, ReplayPlan, simulate, stable_form
from racecheck.core.shadow import (StorageShadow, iv_add, iv_intersect, iv_normalize, iv_subtract,
                     iv_union)
from racecheck.core.sourcenames import creation_name
from racecheck.core.trace import (frame_info, Alloc, Copy, EventRecord, Free, GraphCapture, GraphReplay, HostAccess,
                    HostSync, Kernel, NameTensor, NameTimeline, RecordStream, StaleTolerant,
                    StreamWaitEvent, StreamWaitStream)

__all__ = ["Checker"]

# An access record, one per device op (or per captured op of a replay) or host access: a plain
# tuple, because this is the hot path and on CPython 3.11 a NamedTuple costs three times as much to
# build and its indexing is not specialized (measured: bench_checker ~11% slower). Its fields,
# always read through these names (or unpacked):
#   TL timeline, CLOCK its epoch (ordered before VC iff clock <= VC[tl]), SEQ trace position,
#   EV the trace event, SUB the CapturedOp of a replay (else None), HOST a host access,
#   GRAPH the replayed graph (else None).
TL, CLOCK, SEQ, EV, SUB, HOST, GRAPH = range(7)


class _Ctx(NamedTuple):
    """A context entry of a timeline. A kernel's entry is its access record (a plain tuple: nothing
    to build on the hot path) and a free's a _CtxFree; `_ctx_entry` turns both into a _Ctx."""

    seq: int
    kind: str
    label: str
    peer: object     # the other timeline of a sync edge, or None
    edge: int        # seq of the event at the other end of that edge, or -1


class _CtxFree(NamedTuple):
    seq: int
    block: int


class _Recorded(NamedTuple):
    """The latest record of an event: the recording stream's clock then."""

    tl: int
    vc: dict
    seq: int
    stack: tuple


class _NoopWait(NamedTuple):
    seq: int
    stack: tuple
    host: bool       # event.synchronize() on the host, else a stream's wait_event


class _Name(NamedTuple):
    lo: int
    hi: int
    name: str
    row_bytes: int
    itemsize: int
    order: int


class _Replay(NamedTuple):
    seq: int
    tl: int
    ev: object


class _Noted(NamedTuple):
    """A race noted during the current event; `segs` collects its byte segments."""

    rule: str
    prev: tuple      # access records
    cur: tuple
    pw: bool
    cw: bool
    fp: object
    segs: list
    sh: StorageShadow


_new = tuple.__new__

MAX_STACK = 8
CONTEXT_CAP = 40
CONTEXT_BEFORE = 3          # events per timeline shown before the earlier access
NOOP_WAITS_KEPT = 64        # no-op waits remembered per timeline (for RC008)
_RACE_RULES = ("RC001", "RC002", "RC003", "RC004")
_SITED = (Kernel, Copy, HostAccess)    # events whose op names the storages allocated before it


class _Timeline:
    __slots__ = ("tid", "name", "is_host", "device", "vc", "ver", "jh", "jv", "ctx", "noop",
                 "frees")

    def __init__(self, tid, is_host, vc, window):
        self.tid = tid
        self.name = None
        self.is_host = is_host
        self.device = None
        self.vc = vc
        self.ver = 0          # host timelines: bumped whenever vc changes
        self.jh = None        # streams: host timeline last joined (launch edge) ...
        self.jv = -1          # ... and its version then
        self.ctx = deque(maxlen=window)   # _Ctx | access record (a kernel) | _CtxFree
        self.noop = None      # event -> _NoopWait made by this timeline
        self.frees = None     # allocation streams: RC005 hazards open on blocks freed to their pool


class _OpenFree(NamedTuple):
    """An RC005 hazard: a block went back to a pool while `tid`'s access (epoch `clock`) was
    unordered; judged when the pool's stream next issues work, or at the end of the trace."""

    tid: int
    clock: int
    host: int
    race: Race


class _StaleIndex(NamedTuple):
    """RC006 on stale declared-tolerant indices, due once `into` is written after `captured`."""

    into: int
    captured: int
    finding: object   # the Finding


class _GraphInput:
    """One storage a captured graph reads: its read ranges and the RC006 refresh state."""

    __slots__ = ("storage", "read", "ever", "fresh", "ops")

    def __init__(self, storage):
        self.storage = storage
        self.read = []       # bytes the graph reads (interval list)
        self.ever = []       # written outside the graph since capture, up to the previous replay
        self.fresh = []      # written outside the graph since the previous replay
        self.ops = []        # indices of captured ops reading this storage


class _Graph:
    __slots__ = ("gid", "ops", "inputs", "nreplays", "first_replay", "last_replay", "captured",
                 "plan")

    def __init__(self, gid, ops, captured):
        self.gid = gid
        self.ops = ops
        self.plan = None          # racecheck.core.replay.ReplayPlan, made at the first replay
        self.captured = captured  # seq of the capture: writes after it make memory "mutated"
        self.inputs = {}
        self.nreplays = 0
        self.first_replay = None
        self.last_replay = None   # _Replay


def _basename(path) -> str:
    return os.path.basename(str(path)) if path else "?"


def _fmt_stack(stack):
    """(location, function, frames) from a tuple of (filename, lineno, function) frames."""
    frames = []
    stack = tuple(frame_info(fr) if len(fr) == 2 else fr for fr in stack)
    for fr in stack[:MAX_STACK]:
        try:
            fn, line, func = fr[0], fr[1], fr[2]
        except (IndexError, TypeError, KeyError):
            frames.append(str(fr))
            continue
        frames.append(f"{_basename(fn)}:{line} in {func}")
    if not stack:
        return "", "", ()
    fr = stack[0]
    try:
        return f"{_basename(fr[0])}:{fr[1]}", str(fr[2]), tuple(frames)
    except (IndexError, TypeError, KeyError):
        return str(fr), "", tuple(frames)


def _span_text(a: int, b: int) -> str:
    return f"{a}" if a == b else f"{a}..{b}"


def _site(rec):
    """Cheap identity of the code that made an access (for quick dedup of repeated races)."""
    ev = rec[EV]
    sub = rec[SUB]
    first = ev.stack[0] if ev.stack else getattr(ev, "op", type(ev).__name__)
    if sub is None:
        return first
    return (first, sub.op, sub.stack[0] if sub.stack else None)


def _only_on(sh, tid) -> bool:
    """Every access in the shadow was made on timeline `tid` (a temporary that never left its
    allocation stream: freeing it cannot be RC005, no need for the full scan)."""
    for st in sh.states:
        if st is None:
            continue
        w = st[0]
        if w is not None and w[TL] != tid:
            return False
        for t in st[1]:
            if t != tid:
                return False
    return True


def _ctx_entry(e) -> _Ctx:
    t = type(e)
    if t is tuple:       # a kernel's access record
        return _Ctx(e[SEQ], "kernel", getattr(e[EV], "op", "kernel"), None, -1)
    if t is _CtxFree:
        return _Ctx(e.seq, "free", f"free storage #{e.block}", None, -1)
    return e


def _ctx_seq(e) -> int:
    return e[SEQ] if type(e) is tuple else e.seq


def _join_launch(s, h) -> None:
    """The launch edge: stream `s` joins host `h`'s clock (callers test that it changed)."""
    join(s.vc, h.vc)
    s.jh = h
    s.jv = h.ver


class Checker:
    # graph replays merged into shadow memory in one step where the per-op update could note
    # nothing (racecheck.core.replay); False runs every replay op by op (tests compare the two)
    merge_replays = True
    # ... for graphs with at least this many captured accesses per interval of their replay
    # footprint: a merged interval costs about what 2-3 per-op accesses cost (bench/sim_profile.py)
    merge_min_accesses = 3

    def __init__(self, context_window: int = 64):
        self.context_window = int(context_window)
        self.finding_set = FindingSet()
        # (storage, lo, hi) -> the program's own name for an unnamed tensor, or None; asked only
        # when a finding is made (instrumentation supplies it: the attribute holding the tensor)
        self.namer = None
        self._seq = 0
        self._tl: dict = {}            # tid -> _Timeline (first-seen order)
        self._streams: list = []       # stream timelines, first-seen order
        self._main = None              # first host timeline
        self._shadow: dict = {}        # storage -> StorageShadow
        self._names: dict = {}         # storage -> [_Name]
        self._name_order = 0
        self._records: dict = {}       # event -> _Recorded
        self._allocs: dict = {}        # block -> (allocation stream, host): one per storage, unpacked
        self._unsited: list = []       # blocks allocated since the last op (their creator is next)
        self._sites: dict = {}         # block -> (op, innermost frame) of the first op touching it
        self._recstreams: dict = {}    # block -> set of stream tids (membership only)
        self._graphs: dict = {}        # graph -> _Graph
        self._readers: dict = {}       # storage -> [(graph, _GraphInput)] shared with shadows
        self._pend: dict = {}          # races noted during the current event
        self._frees_open: list = []    # (allocation stream, _OpenFree) in free order
        self._tolerant: dict = {}      # storage -> byte intervals declared stale-tolerant
        self._stale_open: list = []    # _StaleIndex whose indexed memory was not written yet
        self._stale_seen: set = set()
        self._handlers = {
            Kernel: self._on_kernel, Copy: self._on_copy, EventRecord: self._on_record,
            StreamWaitEvent: self._on_wait_event, StreamWaitStream: self._on_wait_stream,
            HostSync: self._on_host_sync, HostAccess: self._on_host_access,
            Alloc: self._on_alloc, Free: self._on_free, RecordStream: self._on_record_stream,
            GraphCapture: self._on_capture, GraphReplay: self._on_replay,
            NameTensor: self._on_name_tensor, NameTimeline: self._on_name_timeline,
            StaleTolerant: self._on_stale_tolerant,
        }

    # ---- public API ---------------------------------------------------------------------------

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

    def _assign_sites(self, event) -> None:
        """Unnamed storages are described by the first op that touched them (stable across runs)."""
        site = (event.op, event.stack[:1])  # formatted only if a finding needs it
        for b in self._unsited:
            self._sites[b] = site
        self._unsited.clear()

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

    def timeline_name(self, tid) -> str:
        tl = self._tl.get(tid)
        if tl is not None:
            if tl.name:
                return tl.name
            return f"host {tid}" if tl.is_host else f"stream {tid}"
        return f"stream {tid}"

    def stats(self) -> dict:
        """Sizes of the checker's state (to show memory stays flat)."""
        return {"events": self._seq, "timelines": len(self._tl), "storages": len(self._shadow),
                "segments": sum(len(s.states) for s in self._shadow.values()),
                "event_records": len(self._records), "graphs": len(self._graphs),
                "findings": len(self.finding_set)}

    # ---- timelines ----------------------------------------------------------------------------

    def _handler_for(self, event):
        for cls in type(event).__mro__:
            h = self._handlers.get(cls)
            if h is not None:
                self._handlers[type(event)] = h
                return h
        return None

    def _new_host(self, tid) -> _Timeline:
        main = self._main
        vc = dict(main.vc) if main is not None else {}
        vc.setdefault(tid, 0)
        tl = _Timeline(tid, True, vc, self.context_window)
        self._tl[tid] = tl
        if main is None:
            self._main = tl
        return tl

    def _new_stream(self, tid) -> _Timeline:
        tl = _Timeline(tid, False, {tid: 0}, self.context_window)
        self._tl[tid] = tl
        self._streams.append(tl)
        return tl

    def _host(self, tid) -> _Timeline:
        tl = self._tl.get(tid)
        return tl if tl is not None else self._new_host(tid)

    def _stream(self, tid) -> _Timeline:
        tl = self._tl.get(tid)
        return tl if tl is not None else self._new_stream(tid)

    def _launch(self, ev) -> _Timeline:
        """Host timeline of ev; ev.stream's timeline joined with it (the launch edge)."""
        tls = self._tl
        h = tls.get(ev.thread)
        if h is None:
            h = self._new_host(ev.thread)
        s = tls.get(ev.stream)
        if s is None:
            s = self._new_stream(ev.stream)
        if s.jh is not h or s.jv != h.ver:
            _join_launch(s, h)
        return s

    # ---- device work --------------------------------------------------------------------------

    def _on_kernel(self, ev, seq):
        tls = self._tl
        h = tls.get(ev.thread)
        if h is None:
            h = self._new_host(ev.thread)
        s = tls.get(ev.stream)
        if s is None:
            s = self._new_stream(ev.stream)
        if s.jh is not h or s.jv != h.ver:
            _join_launch(s, h)
        vc = s.vc
        tid = s.tid
        c = vc[tid] + 1
        vc[tid] = c
        if s.frees:
            self._settle_frees(s, ev)
        rec = (tid, c, seq, ev, None, False, None)
        s.ctx.append(rec)      # a kernel's context entry is its record (see _ctx_entry)
        if ev.reads:
            self._read(ev.reads, rec, vc)
        if ev.writes:
            self._write(ev.writes, rec, vc, None)

    def _on_copy(self, ev, seq):
        s = self._launch(ev)
        if s.frees:
            self._settle_frees(s, ev)
        vc = s.vc
        tid = s.tid
        c = vc[tid] + 1
        vc[tid] = c
        src, dst = ev.src, ev.dst
        direction = ("H2H" if dst.host else "H2D") if src.host else ("D2H" if dst.host else "D2D")
        s.ctx.append(_new(_Ctx, (seq, "copy", f"{ev.op} {direction}", None, -1)))
        rec = (tid, c, seq, ev, None, False, None)
        self._read((src,), rec, vc)
        self._write((dst,), rec, vc, None)
        if not ev.non_blocking and (src.host or dst.host):
            h = self._tl[ev.thread]
            join(h.vc, vc)
            h.ver += 1
            h.ctx.append(_new(_Ctx, (seq, "sync", f"blocking {ev.op} {direction}", tid, seq)))

    def _on_host_access(self, ev, seq):
        h = self._host(ev.thread)
        vc = h.vc
        tid = h.tid
        c = vc.get(tid, 0) + 1
        vc[tid] = c
        h.ver += 1
        h.ctx.append(_new(_Ctx, (seq, "host", ev.op, None, -1)))
        rec = (tid, c, seq, ev, None, True, None)
        if ev.reads:
            self._read(ev.reads, rec, vc)
        if ev.writes:
            self._write(ev.writes, rec, vc, None)

    # ---- the hot path: shadow memory ----------------------------------------------------------

    def _new_shadow(self, storage) -> StorageShadow:
        sh = StorageShadow(storage, self._readers.get(storage))
        self._shadow[storage] = sh
        return sh

    def _read(self, fps, rec, vc):
        shadows = self._shadow
        vcget = vc.get
        tid = rec[TL]
        for fp in fps:
            sh = shadows.get(fp.storage)
            if sh is None:
                sh = self._new_shadow(fp.storage)
            states = sh.states
            bounds = sh.bounds
            for lo, hi in fp.ranges:
                # fast path: exactly one existing segment (a whole tensor accessed again)
                i = bisect_left(bounds, lo)
                if i + 1 < len(bounds) and bounds[i] == lo and bounds[i + 1] == hi:
                    st = states[i]
                    if st is not None:
                        w = st[0]
                        if w is not None:
                            if w[CLOCK] > vcget(w[TL], 0):
                                self._race(w, rec, True, False, fp, sh, lo, hi)
                            if w[GRAPH] is not None and fp.born is not None:
                                self._check_rc007(w, rec, fp, sh, lo, hi)
                        st[1][tid] = rec
                        continue
                self._read_span(fp, sh, lo, hi, rec, vc)

    def _read_span(self, fp, sh, lo, hi, rec, vc):
        """A read of [lo, hi) that is not one existing segment (shared with the C path)."""
        if lo >= hi:
            return
        vcget = vc.get
        tid = rec[TL]
        states = sh.states
        bounds = sh.bounds
        i, j = sh.span(lo, hi)
        for k in range(i, j):
            st = states[k]
            if st is None:
                states[k] = [None, {tid: rec}]
                continue
            w = st[0]
            if w is not None:
                if w[CLOCK] > vcget(w[TL], 0):
                    self._race(w, rec, True, False, fp, sh, bounds[k], bounds[k + 1])
                if w[GRAPH] is not None and fp.born is not None:
                    self._check_rc007(w, rec, fp, sh, bounds[k], bounds[k + 1])
            st[1][tid] = rec

    def _write(self, fps, rec, vc, graph):
        shadows = self._shadow
        vcget = vc.get
        for fp in fps:
            sh = shadows.get(fp.storage)
            if sh is None:
                sh = self._new_shadow(fp.storage)
            states = sh.states
            bounds = sh.bounds
            rd = sh.readers
            for lo, hi in fp.ranges:
                if lo >= hi:
                    continue
                i = bisect_left(bounds, lo)
                if not bounds:      # a storage's first access (a new temporary)
                    bounds.append(lo)
                    bounds.append(hi)
                    states.append([rec, {}])
                elif i + 1 < len(bounds) and bounds[i] == lo and bounds[i + 1] == hi \
                        and states[i] is not None:
                    # fast path: exactly one existing segment
                    st = states[i]
                    w = st[0]
                    if w is not None and w[CLOCK] > vcget(w[TL], 0):
                        self._race(w, rec, True, True, fp, sh, lo, hi)
                    r = st[1]
                    if r:
                        for pr in r.values():
                            if pr[CLOCK] > vcget(pr[TL], 0):
                                self._race(pr, rec, False, True, fp, sh, lo, hi)
                        r.clear()
                    st[0] = rec
                else:
                    self._write_span(fp, sh, lo, hi, rec, vc)
                if rd:
                    self._fresh_readers(rd, lo, hi, graph)

    def _write_span(self, fp, sh, lo, hi, rec, vc):
        """A write of [lo, hi) (lo < hi) that is not one existing segment (shared with the C path)."""
        vcget = vc.get
        states = sh.states
        bounds = sh.bounds
        i, j = sh.span(lo, hi)
        for k in range(i, j):
            st = states[k]
            if st is None:
                continue
            w = st[0]
            if w is not None and w[CLOCK] > vcget(w[TL], 0):
                self._race(w, rec, True, True, fp, sh, bounds[k], bounds[k + 1])
            r = st[1]
            if r:
                for pr in r.values():
                    if pr[CLOCK] > vcget(pr[TL], 0):
                        self._race(pr, rec, False, True, fp, sh, bounds[k], bounds[k + 1])
        sh.collapse(i, j, [rec, {}])

    @staticmethod
    def _fresh_readers(rd, lo, hi, graph):
        """Bytes a graph reads were written outside it (its inputs' freshness, racecheck.core.replay)."""
        for g, inp in rd:
            if g != graph:
                inp.fresh = iv_add(inp.fresh, lo, hi)

    # ---- synchronization ----------------------------------------------------------------------

    def _on_record(self, ev, seq):
        s = self._launch(ev)
        self._records[ev.event] = _new(_Recorded, (s.tid, dict(s.vc), seq, ev.stack))
        s.ctx.append(_new(_Ctx, (seq, "record", f"record event #{ev.event}", None, -1)))

    def _remember_noop(self, tl, event, seq, stack, host):
        noop = tl.noop
        if noop is None:
            noop = tl.noop = {}
        noop.pop(event, None)
        noop[event] = _NoopWait(seq, stack, host)
        if len(noop) > NOOP_WAITS_KEPT:
            del noop[next(iter(noop))]

    def _on_wait_event(self, ev, seq):
        s = self._launch(ev)
        r = self._records.get(ev.event)
        if r is None:
            self._remember_noop(s, ev.event, seq, ev.stack, False)
            s.ctx.append(_new(_Ctx, (seq, "wait", f"wait_event #{ev.event} (no-op: never recorded)", None, -1)))
            return
        join(s.vc, r.vc)
        s.ctx.append(_new(_Ctx, (seq, "wait", f"wait_event #{ev.event}", r.tl, r.seq)))

    def _on_wait_stream(self, ev, seq):
        h = self._host(ev.thread)
        s = self._stream(ev.waiter)
        if s.jh is not h or s.jv != h.ver:
            _join_launch(s, h)
        t = self._stream(ev.waitee)
        if t is not s:
            join(s.vc, t.vc)
        edge = _ctx_seq(t.ctx[-1]) if t.ctx else -1
        s.ctx.append(_new(_Ctx, (seq, "wait", "wait_stream", t.tid, edge)))

    def _on_host_sync(self, ev, seq):
        h = self._host(ev.thread)
        kind, target = ev.sync_kind, ev.target
        if kind == "stream":
            s = self._tl.get(target)
            if s is not None and s is not h:
                join(h.vc, s.vc)
                h.ctx.append(_new(_Ctx, (seq, "sync", "stream synchronize", s.tid,
                                         _ctx_seq(s.ctx[-1]) if s.ctx else -1)))
        elif kind == "event":
            r = self._records.get(target)
            if r is None:
                self._remember_noop(h, target, seq, ev.stack, True)
                h.ctx.append(_new(_Ctx, (seq, "sync", f"event #{target} synchronize (no-op: "
                                         f"never recorded)", None, -1)))
            else:
                join(h.vc, r.vc)
                h.ctx.append(_new(_Ctx, (seq, "sync", f"event #{target} synchronize", r.tl, r.seq)))
        elif kind == "device":
            for s in self._streams:
                if target is None or s.device is None or s.device == target:
                    join(h.vc, s.vc)
            h.ctx.append(_new(_Ctx, (seq, "sync", "device synchronize", None, -1)))
        h.ver += 1

    # ---- allocator ----------------------------------------------------------------------------

    def _on_alloc(self, ev, seq):
        tls = self._tl
        if ev.thread not in tls:
            self._new_host(ev.thread)
        stream = ev.stream
        if stream is not None and stream not in tls:
            self._new_stream(stream)
        blk = ev.block
        self._allocs[blk] = (stream, bool(ev.host))
        self._unsited.append(blk)
        self._shadow.pop(blk, None)
        if self._recstreams:
            self._recstreams.pop(blk, None)

    def _on_record_stream(self, ev, seq):
        self._host(ev.thread)
        self._recstreams.setdefault(ev.block, set()).add(ev.stream)

    def _on_free(self, ev, seq):
        h = self._tl.get(ev.thread)
        if h is None:
            h = self._new_host(ev.thread)
        blk = ev.block
        h.ctx.append(_new(_CtxFree, (seq, blk)))
        stream, host = self._allocs.pop(blk, None) or (None, True)
        if self._stale_open:
            self._settle_stale_indices(blk)
        sh = self._shadow.pop(blk, None)
        rs = (self._recstreams.pop(blk, None) or ()) if self._recstreams else ()
        if sh is not None and not host and stream is not None and not _only_on(sh, stream):
            self._check_rc005(ev, seq, h, blk, stream, sh, rs)
        if self._names:
            self._names.pop(blk, None)
        if self._tolerant:
            self._tolerant.pop(blk, None)
        self._sites.pop(blk, None)
        if self._readers:
            for _g, inp in self._readers.get(blk, ()):
                inp.ever = []
                inp.fresh = []

    def _open_free(self, a, hazard):
        if a.frees is None:
            a.frees = []
        a.frees.append(hazard)
        self._frees_open.append((a, hazard))

    def _settle_frees(self, a, ev):
        """The allocation stream `a` issues work that may reuse its freed blocks: every hazard
        it is still unordered with becomes a finding; the others closed when `a` caught up."""
        vc = a.vc
        for hz in a.frees:
            if hz.clock > vc.get(hz.tid, 0):
                loc = _fmt_stack(ev.stack)[0] if ev.stack else ""
                what = getattr(ev, "op", None) or f"replay of graph {getattr(ev, 'graph', '?')}"
                self.finding_set.add(describe(replace(hz.race, reuse=(what, loc))))
        a.frees = None
        self._frees_open = [(b, hz) for b, hz in self._frees_open if b is not a]

    def _still_open(self):
        """Findings of hazards open at the end of the trace so far (the next allocation on the
        stream would reuse the block), unless the stream or the freeing host caught up."""
        tls = self._tl
        for a, hz in self._frees_open:
            if hz.clock <= a.vc.get(hz.tid, 0):
                continue
            h = tls.get(hz.host)
            if h is not None and hz.clock <= h.vc.get(hz.tid, 0):
                continue
            yield describe(replace(hz.race, trace_end=True))

    def _check_rc005(self, ev, seq, h, blk, a_tid, sh, rs):
        a = self._tl.get(a_tid)
        avc = a.vc if a is not None else {}
        hvc = h.vc
        tls = self._tl
        items = []      # (record, kind, lo, hi): accesses the free is unordered with, in shadow order
        for lo, hi, st in sh.segments():
            recs = [(st[0], "write")] if st[0] is not None else []
            recs.extend((r, "read") for r in st[1].values())
            for rec, kind in recs:
                t = rec[TL]
                if t == a_tid or rec[HOST] or t in rs:
                    continue
                tl = tls.get(t)
                if tl is None or tl.is_host:
                    continue
                c = rec[CLOCK]
                if c <= hvc.get(t, 0) or c <= avc.get(t, 0):
                    continue
                items.append((rec, kind, lo, hi))
        for hazard in self._rc005_hazards(ev, seq, h.tid, blk, a_tid, items):
            self._open_free(a, hazard)

    def _rc005_hazards(self, ev, seq, h_tid, blk, a_tid, items) -> list:
        """The hazards a free opens: per timeline, its latest unordered access and the bytes.
        (The C engine calls this too, on a checker holding its timelines, to keep going.)"""
        found = {}    # T -> (latest rec, kind, ranges)
        for rec, kind, lo, hi in items:
            t = rec[TL]
            ent = found.get(t)
            if ent is None:
                found[t] = (rec, kind, [(lo, hi)])
            else:
                latest, lkind, ranges = ent
                if rec[SEQ] > latest[SEQ]:
                    latest, lkind = rec, kind
                found[t] = (latest, lkind, iv_add(ranges, lo, hi))
        out = []
        for t, (rec, kind, ranges) in sorted(found.items(), key=lambda x: x[1][0][SEQ]):
            place, _nm = self._describe(blk, ranges)
            loc, fn, frames = _fmt_stack(ev.stack)
            free = Access(op="free", stream=self.timeline_name(a_tid), kind="free", location=loc,
                          function=fn, stack=frames, seq=seq)
            race = Race("RC005", place, free, self._access(rec, kind),
                        context=self._context((t, a_tid, h_tid), rec[SEQ], seq),
                        approx=self._approx(rec, blk) or "", freer=self.timeline_name(h_tid))
            out.append(_OpenFree(t, rec[CLOCK], h_tid, race))
        return out

    # ---- graphs -------------------------------------------------------------------------------

    def _on_capture(self, ev, seq):
        h = self._host(ev.thread)
        g = ev.graph
        old = self._graphs.get(g)
        if old is not None:
            for st, inp in old.inputs.items():
                lst = self._readers.get(st)
                if lst:
                    lst[:] = [(g2, x) for g2, x in lst if x is not inp]
        gr = _Graph(g, list(ev.ops), seq)
        for idx, op in enumerate(gr.ops):
            for fp in op.reads:
                if fp.approx:
                    # A covering footprint (e.g. a gather whose rows change per replay) does not
                    # say which elements a replay reads: it cannot show stale padding rows.
                    continue
                inp = gr.inputs.get(fp.storage)
                if inp is None:
                    inp = gr.inputs[fp.storage] = _GraphInput(fp.storage)
                for lo, hi in fp.ranges:
                    inp.read = iv_add(inp.read, lo, hi)
                if not inp.ops or inp.ops[-1] != idx:
                    inp.ops.append(idx)
        for st, inp in gr.inputs.items():
            lst = self._readers.get(st)
            if lst is None:
                lst = self._readers[st] = []
            lst.append((g, inp))
            sh = self._shadow.get(st)
            if sh is not None:
                sh.readers = lst
        self._graphs[g] = gr
        h.ctx.append(_new(_Ctx, (seq, "capture", f"capture graph {g} ({len(gr.ops)} ops)", None, -1)))

    def _on_replay(self, ev, seq):
        s = self._launch(ev)
        if s.frees:
            self._settle_frees(s, ev)
        vc = s.vc
        tid = s.tid
        c = vc[tid] + 1
        vc[tid] = c
        g = ev.graph
        s.ctx.append(_new(_Ctx, (seq, "replay", f"replay graph {g}", None, -1)))
        gr = self._graphs.get(g)
        if gr is None:
            return
        if gr.inputs:
            self._check_rc006(gr, ev, seq, s)
        plan = gr.plan
        if plan is None:
            plan = gr.plan = ReplayPlan(gr.ops)
        if not (self.merge_replays and plan.accesses >= self.merge_min_accesses * plan.intervals
                and self._replay_merged(gr, plan, tid, c, seq, ev, vc)):
            self._replay_ops(gr.ops, tid, c, seq, ev, g, vc)
        gr.nreplays += 1
        if gr.first_replay is None:
            gr.first_replay = seq
        gr.last_replay = _new(_Replay, (seq, tid, ev))

    def _replay_ops(self, ops, tid, c, seq, ev, g, vc):
        """The per-op update of a replay: each captured op's accesses, in capture order."""
        for cop in ops:
            rec = (tid, c, seq, ev, cop, False, g)
            if cop.reads:
                self._read(cop.reads, rec, vc)
            if cop.writes:
                self._write(cop.writes, rec, vc, g)

    def _replay_merged(self, gr, plan, tid, c, seq, ev, vc) -> bool:
        """The replay merged into shadow memory in one step per interval of its footprint
        (racecheck.core.replay), when the per-op update could note nothing; False (nothing changed)
        when it could: the caller then runs the per-op update."""
        shadows = self._shadow
        vcget = vc.get
        graphs = self._graphs
        todo = []
        for sp in plan.storages:
            sh = shadows.get(sp.storage)
            if sh is None:
                bounds = states = ()
            else:
                bounds, states = sh.bounds, sh.states
            nst = len(states)
            born = sp.born
            if born is not None and sp.written and gr.first_replay is not None \
                    and seq >= born[0] and gr.first_replay < born[1]:
                return False         # a read of a view after the graph's own write: RC007 candidate
            for iv in sp.intervals:
                lo = iv.lo
                k0 = bisect_left(bounds, lo)
                st_ = iv.stable
                if st_ is not None and bounds[k0:k0 + len(st_[0])] == st_[0]:
                    # the structure the last replay left (segment for segment, in place)
                    pre = states[k0:k0 + len(st_[1])]
                    if None in pre:
                        st_ = None
                else:
                    st_ = None
                if st_ is None:
                    hi = iv.hi
                    k1 = bisect_right(bounds, hi)
                    pre = []
                    if k0 >= len(bounds) or bounds[k0] != lo:
                        pre.append(states[k0 - 1] if 0 < k0 <= nst else None)
                    for m in range(k0, k1):
                        if bounds[m] < hi:
                            pre.append(states[m] if m < nst else None)
                for st in pre:
                    if st is None:
                        continue
                    w = st[0]
                    if w is not None:
                        if w[CLOCK] > vcget(w[TL], 0):
                            return False
                        if born is not None and w[GRAPH] is not None and w[SEQ] >= born[0]:
                            g2 = graphs.get(w[GRAPH])
                            if g2 is not None and g2.first_replay is not None \
                                    and g2.first_replay < born[1]:
                                return False
                    if iv.has_write:
                        for r in st[1].values():
                            if r[CLOCK] > vcget(r[TL], 0):
                                return False
                if st_ is not None:
                    todo.append((iv, None, st_[1], pre))
                    continue
                key = (tuple(bounds[k0:k1]), tuple([st is None for st in pre]))
                recipe = iv.recipes.get(key)
                if recipe is None:
                    if len(iv.recipes) >= RECIPES_KEPT:
                        iv.recipes.clear()
                        iv.stables.clear()
                    recipe = iv.recipes[key] = simulate(iv, key[0], key[1])
                todo.append((iv, recipe, key, None))
        # nothing can be noted: apply
        g = gr.gid
        ops = gr.ops
        recs = [None] * plan.nops
        it = iter(todo)
        for sp in plan.storages:
            sh = shadows.get(sp.storage)
            if sh is None:
                sh = self._new_shadow(sp.storage)
            states = sh.states
            for _ in sp.intervals:
                iv, recipe, cells, pre = next(it)
                if recipe is None:
                    # in place, as the per-op update does it: each segment keeps its own reads
                    for st, (wk, wv, rp, rop) in zip(pre, cells):
                        if wk == 2:
                            w = recs[wv]
                            if w is None:
                                w = recs[wv] = (tid, c, seq, ev, ops[wv], False, g)
                            st[0] = w
                        d = st[1]
                        if rp < 0 and d:
                            d.clear()
                        if rop >= 0:
                            r = recs[rop]
                            if r is None:
                                r = recs[rop] = (tid, c, seq, ev, ops[rop], False, g)
                            d[tid] = r
                    continue
                key = cells
                inner, cells = recipe
                i, j = sh.span(iv.lo, iv.hi)
                pre = states[i:j]
                new = []
                for cell in cells:
                    if cell is None:
                        new.append(None)
                        continue
                    wk, wv, rp, rop = cell
                    if wk == 2:
                        w = recs[wv]
                        if w is None:
                            w = recs[wv] = (tid, c, seq, ev, ops[wv], False, g)
                    elif wk == 1:
                        w = pre[wv][0]
                    else:
                        w = None
                    d = dict(pre[rp][1]) if rp >= 0 else {}
                    if rop >= 0:
                        r = recs[rop]
                        if r is None:
                            r = recs[rop] = (tid, c, seq, ev, ops[rop], False, g)
                        d[tid] = r
                    new.append([w, d])
                sh.bounds[i + 1:j] = inner
                states[i:j] = new
                # the next replay finds this structure if nothing else touched these bytes
                stable = iv.stables.get(key, False)
                if stable is False:
                    stable = iv.stables[key] = stable_form(iv, recipe)
                iv.stable = stable
            rd = sh.readers
            if rd and sp.written:
                for g2, inp in rd:
                    if g2 != g:
                        for lo, hi in sp.written:
                            inp.fresh = iv_add(inp.fresh, lo, hi)
        return True

    def _check_rc006(self, gr, ev, seq, s):
        for st, inp in gr.inputs.items():
            if not inp.fresh:
                continue
            fresh = iv_intersect(inp.fresh, inp.read)
            if fresh and gr.nreplays > 0:
                stale = iv_subtract(iv_intersect(inp.read, inp.ever), fresh)
                tol = self._tolerant.get(st) if stale and self._tolerant else None
                if tol:
                    self._stale_indices(gr, inp, iv_intersect(stale, tol), fresh, ev, seq, s)
                    stale = iv_subtract(stale, tol)
                if stale:
                    self.finding_set.add(describe(self._report_rc006(gr, inp, stale, fresh, ev, seq, s)))
            inp.ever = iv_union(inp.ever, fresh)
            inp.fresh = []

    def _stale_indices(self, gr, inp, stale, fresh, ev, seq, s):
        """Stale declared-tolerant bytes are harmless data, unless a captured op reads them as
        indices into memory the run mutates: RC006 then, whether the write into that memory
        comes before this replay or after it (decided when findings are read)."""
        st = inp.storage
        for idx in inp.ops:
            for fp in gr.ops[idx].reads:
                into = fp.index_into
                if fp.storage != st or into is None:
                    continue
                used = iv_intersect(iv_normalize(fp.ranges), stale)
                if not used:
                    continue
                f = describe(self._report_rc006(
                    gr, inp, used, fresh, ev, seq, s, reader=gr.ops[idx],
                    index_use=(gr.ops[idx].op, self._storage_label(into))))
                hz = _StaleIndex(into, gr.captured, f)
                if self._mutated_since(into, gr.captured):
                    self.finding_set.add(f)
                elif f.signature not in self._stale_seen:
                    self._stale_seen.add(f.signature)
                    self._stale_open.append(hz)

    def _settle_stale_indices(self, blk):
        """`blk` dies: its write history goes, so stale indices into it are judged now."""
        keep = []
        for hz in self._stale_open:
            if hz.into != blk:
                keep.append(hz)
            elif self._mutated_since(blk, hz.captured):
                self.finding_set.add(hz.finding)
        self._stale_open = keep

    def _mutated_since(self, storage, seq) -> bool:
        sh = self._shadow.get(storage)
        if sh is None:
            return False
        for st in sh.states:
            if st is not None and st[0] is not None and st[0][SEQ] > seq:
                return True
        return False

    def _storage_label(self, storage) -> str:
        nm = self._name_for(storage, 0, 1 << 62)
        return f"`{nm.name}`" if nm is not None else f"storage #{storage}"

    def _report_rc006(self, gr, inp, stale, fresh, ev, seq, s, reader=None, index_use=()):
        g = gr.gid
        st = inp.storage
        place, nm = self._describe(st, stale)
        # the captured op reading the stale bytes
        cop = reader or gr.ops[inp.ops[0]]
        for idx in (() if reader is not None else inp.ops):
            op = gr.ops[idx]
            if any(iv_intersect(iv_normalize([r for fp in op.reads if fp.storage == st
                                              for r in fp.ranges]), stale)):
                cop = op
                break
        cur = self._access((s.tid, 0, seq, ev, cop, False, g), "read")
        prev = None
        prev_tid = s.tid
        prev_seq = gr.last_replay.seq if gr.last_replay else seq
        sh = self._shadow.get(st)
        if sh is not None:
            k = sh.find(stale[0][0])
            if k >= 0 and sh.states[k] is not None:
                w = sh.states[k][0]
                if w is not None and w[GRAPH] != g:
                    prev = self._access(w, "write")
                    prev_tid, prev_seq = w[TL], w[SEQ]
        if prev is None and gr.last_replay is not None:
            lseq, ltid, lev = gr.last_replay      # a _Replay
            loc, fn, frames = _fmt_stack(lev.stack)
            prev = Access(op=f"replay of graph {g}", stream=self.timeline_name(ltid),
                          kind="replay", location=loc, function=fn, stack=frames, seq=lseq)
            prev_tid, prev_seq = ltid, lseq
        return Race("RC006", place, cur, prev, context=self._context((prev_tid, s.tid), prev_seq, seq),
                    approx=self._fp_approx_in(cop, st) or "", graph=g,
                    fresh=self._units(fresh, nm, st), index_use=index_use)

    # ---- names --------------------------------------------------------------------------------

    def _on_name_tensor(self, ev, seq):
        self._host(ev.thread)
        lst = self._names.get(ev.storage)
        if lst is None:
            lst = self._names[ev.storage] = []
        self._name_order += 1
        entry = _Name(ev.lo, ev.hi, ev.name, ev.row_bytes or 0, ev.itemsize or 1, self._name_order)
        for i, e in enumerate(lst):
            if e.lo == ev.lo and e.hi == ev.hi:
                lst[i] = entry
                break
        else:
            lst.append(entry)

    def _on_stale_tolerant(self, ev, seq):
        self._host(ev.thread)
        self._tolerant[ev.storage] = iv_add(self._tolerant.get(ev.storage, []), ev.lo, ev.hi)

    def _on_name_timeline(self, ev, seq):
        self._host(ev.thread)
        tl = self._tl.get(ev.timeline)
        if tl is None:
            tl = self._new_host(ev.timeline) if ev.is_host else self._new_stream(ev.timeline)
        tl.name = ev.name
        if ev.device is not None:
            tl.device = ev.device

    def _name_for(self, storage, lo, hi):
        """The most specific (smallest, then latest) named range overlapping [lo, hi)."""
        best = None
        for e in self._names.get(storage, ()):
            if e.lo < hi and lo < e.hi:
                if best is None or (e.hi - e.lo, -e.order) < (best.hi - best.lo, -best.order):
                    best = e
        return best

    def _units(self, ranges, nm, storage) -> str:
        parts = []
        for lo, hi in ranges:
            if nm is not None:
                a, b = max(lo, nm.lo), min(hi, nm.hi)
                if a >= b:
                    a, b = lo, hi
                size = nm.row_bytes or nm.itemsize or 1
                parts.append(_span_text((a - nm.lo) // size, (b - 1 - nm.lo) // size))
            else:
                parts.append(_span_text(lo, hi - 1))
        return ", ".join(parts)

    def _describe(self, storage, ranges):
        """(Place of the ranges, name entry or None)."""
        lo, hi = ranges[0][0], ranges[-1][1]
        nm = self._name_for(storage, lo, hi)
        byte_text = ", ".join(_span_text(a, b - 1) for a, b in ranges)
        if nm is None and self.namer is not None:
            held = self.namer(storage, lo, hi)
            if held:
                return Place(held, storage, "bytes", byte_text, byte_text, True), None
        if nm is None:
            site = self._sites.get(storage)
            made = creation_name(site[1][0]) if site is not None and site[1] else None
            if made:
                return Place(made, storage, "bytes", byte_text, byte_text, True), None
            if site is not None:
                op, top = site
                loc = _fmt_stack(top)[0] if top else ""
                tensor = f"unnamed tensor (first used by {op}{' at ' + loc if loc else ''}; bytes {lo}..{hi - 1})"
            else:
                tensor = f"unnamed tensor (bytes {lo}..{hi - 1})"
            return Place(tensor, storage, "bytes", byte_text, byte_text, False), None
        unit = "rows" if nm.row_bytes else "elements"
        return Place(nm.name, storage, unit, self._units(ranges, nm, storage), byte_text, True), nm

    # ---- findings -----------------------------------------------------------------------------

    def _race(self, prev, cur, pw, cw, fp, sh, lo, hi):
        """An unordered conflicting pair on [lo, hi) of sh's storage: note it for this event."""
        if prev[HOST]:
            if cur[HOST]:
                return                      # host vs host: not our business
            rule = "RC004"
        elif cur[HOST]:
            rule = "RC004"
        elif not cw:
            rule = "RC001"
        elif pw:
            rule = "RC003"
        else:
            rule = "RC002"
        self._note(rule, (id(prev), sh.storage), prev, cur, pw, cw, fp, sh, lo, hi)

    def _check_rc007(self, w, cur, fp, sh, lo, hi):
        # born is the trace index the next event had when the view was created (the session's
        # position): a replay with seq >= born ran after the view was taken, one with seq < born
        # before it.
        born = fp.born
        if w[SEQ] < born:
            return
        gr = self._graphs.get(w[GRAPH])
        if gr is None or gr.first_replay is None or gr.first_replay >= born:
            return
        self._note("RC007", ("rc007", id(w), sh.storage), w, cur, True, False, fp, sh, lo, hi)

    def _note(self, rule, key, prev, cur, pw, cw, fp, sh, lo, hi):
        pend = self._pend
        ent = pend.get(key)
        if ent is not None and ent.rule != rule:
            # the same previous access already races with this op under another rule (an
            # in-place op reads then writes): report the first rule only
            return
        tl = self._tl.get(cur[TL])
        qk = (rule, lo, hi, _site(cur), _site(prev), len(self._names.get(sh.storage, ())),
              len(tl.noop) if tl is not None and tl.noop else 0)
        seen = sh.seen
        if seen is None:
            seen = sh.seen = set()
        new = qk not in seen
        if new:
            seen.add(qk)
        if ent is None:
            pend[key] = _new(_Noted, (rule, prev, cur, pw, cw, fp, [(lo, hi)] if new else [], sh))
        elif new:
            ent.segs.append((lo, hi))

    def _flush(self):
        pend = self._pend
        self._pend = {}
        prefetch = getattr(self.namer, "prefetch", None)
        if prefetch is not None and pend:
            # the program's names for this event's unnamed storages, found in one pass
            need = [e.sh.storage for e in pend.values()
                    if e.segs and not self._names.get(e.sh.storage)]
            if need:
                prefetch(need)
        for rule, prev, cur, pw, cw, fp, segs, sh in pend.values():
            if not segs:
                continue
            # group the racing segments by tensor name (a pool storage can hold several)
            groups = {}
            for lo, hi in segs:
                nm = self._name_for(sh.storage, lo, hi)
                k = nm.order if nm is not None else None
                groups.setdefault(k, []).append((lo, hi))
            for ranges in groups.values():
                ranges = iv_normalize(ranges)
                if rule == "RC007":
                    self._report_rc007(prev, cur, fp, sh.storage, ranges)
                else:
                    self._report_race(rule, prev, cur, pw, cw, fp, sh.storage, ranges)

    def _report_race(self, rule, prev, cur, pw, cw, fp, storage, ranges):
        place, _nm = self._describe(storage, ranges)
        race = Race(rule, place, self._access(cur, "write" if cw else "read"),
                    self._access(prev, "write" if pw else "read"),
                    context=self._context((prev[TL], cur[TL]), prev[SEQ], cur[SEQ]),
                    approx=fp.approx or self._approx(prev, storage) or "", host_current=cur[HOST])
        self.finding_set.add(describe(race))
        self._check_rc008(prev, cur, race)

    def _report_rc007(self, w, cur, fp, storage, ranges):
        place, _nm = self._describe(storage, ranges)
        race = Race("RC007", place, self._access(cur, "read"), self._access(w, "write"),
                    context=self._context((w[TL], cur[TL]), w[SEQ], cur[SEQ]),
                    approx=fp.approx or "", graph=w[GRAPH], overwritten_at=w[SEQ], born=fp.born)
        self.finding_set.add(describe(race))

    def _check_rc008(self, prev, cur, race):
        """No-op waits on the racing current side that were meant to order the pair: on an event
        recorded only later (after the previous access), or on one never recorded at all (a
        fresh Event, a stale handle) waited on after the previous access was issued."""
        b = self._tl.get(cur[TL])
        if b is None or not b.noop:
            return
        a_tid = prev[TL]
        for event, (wseq, wstack, host) in list(b.noop.items()):    # _NoopWait
            r = self._records.get(event)
            if r is None:
                if wseq > prev[SEQ]:
                    self._report_rc008(prev, cur, race, event, wseq, wstack, host, None)
            elif r.tl == a_tid and r.vc.get(a_tid, 0) >= prev[CLOCK]:
                self._report_rc008(prev, cur, race, event, wseq, wstack, host, r)

    def _report_rc008(self, prev, cur, race, event, wseq, wstack, host, r):
        b_tid = cur[TL]
        wloc, wfn, wframes = _fmt_stack(wstack)
        wait = Access(op="event.synchronize" if host else "wait_event",
                      stream=self.timeline_name(b_tid), kind="wait", location=wloc, function=wfn,
                      stack=wframes, seq=wseq)
        ctx = self._context((prev[TL], b_tid), min(wseq, prev[SEQ]), cur[SEQ])
        if r is not None:
            rloc, rfn, rframes = _fmt_stack(r.stack)
            record = Access(op="record", stream=self.timeline_name(r.tl), kind="record",
                            location=rloc, function=rfn, stack=rframes, seq=r.seq)
            noop = Race("RC008", race.place, wait, record, context=ctx, event=event,
                        host_wait=host, related=race.rule)
        else:
            noop = Race("RC008", race.place, wait, race.previous, context=ctx, event=event,
                        host_wait=host, related=race.rule, never_recorded=True,
                        instead=self._recorded_instead(prev, wseq))
        self.finding_set.add(describe(noop))

    def _recorded_instead(self, prev, before):
        """The first event recorded on prev's stream after it (and before `before`), if any."""
        a_tid, clock = prev[TL], prev[CLOCK]
        best = None
        for event, r in self._records.items():
            if r.tl == a_tid and r.vc.get(a_tid, 0) >= clock and r.seq < before:
                if best is None or r.seq < best[1]:
                    best = (event, r.seq)
        return best[0] if best is not None else None

    def _access(self, rec, kind) -> Access:
        ev = rec[EV]
        sub = rec[SUB]
        if sub is not None:
            op = f"{sub.op} (replay of graph {rec[GRAPH]})"
            outer, inner = tuple(ev.stack or ()), tuple(sub.stack or ())
            if len(outer) + len(inner) > MAX_STACK:      # keep some of both
                keep = min(len(inner), MAX_STACK // 2)
                outer, inner = outer[:MAX_STACK - keep], inner[:keep]
            stack = outer + inner
        else:
            op = getattr(ev, "op", "") or type(ev).kind
            stack = ev.stack or ()
        loc, fn, frames = _fmt_stack(stack)
        return Access(op=op, stream=self.timeline_name(rec[TL]), kind=kind, location=loc,
                      function=fn, stack=frames, seq=rec[SEQ])

    @staticmethod
    def _fp_approx_in(obj, storage):
        fps = []
        for f in ("reads", "writes"):
            fps.extend(getattr(obj, f, None) or ())
        for f in ("src", "dst"):
            v = getattr(obj, f, None)
            if v is not None:
                fps.append(v)
        for fp in fps:
            if fp.storage == storage and fp.approx:
                return fp.approx
        return None

    def _approx(self, rec, storage):
        sub = rec[SUB]
        return self._fp_approx_in(sub if sub is not None else rec[EV], storage)

    def _context(self, tids, start_seq, end_seq) -> tuple:
        """Recent events on the involved timelines (and sync edges into them), oldest first."""
        order = []
        for t in tids:
            if t not in order:
                order.append(t)
        tset = set(order)
        items = []          # (seq, raw context entry, timeline): entries made readable at the end
        for t in order:
            tl = self._tl.get(t)
            if tl is None:
                continue
            before = []
            for e in tl.ctx:
                s = _ctx_seq(e)
                if s > end_seq:
                    break
                if s < start_seq:
                    before.append((s, e, t))
                else:
                    items.append((s, e, t))
            items.extend(before[-CONTEXT_BEFORE:])
        for tl in self._tl.values():
            if tl.tid in tset:
                continue
            for e in tl.ctx:
                if type(e) is not _Ctx:
                    continue            # a kernel or a free: no peer
                if start_seq <= e.seq <= end_seq and e.peer in tset:
                    items.append((e.seq, e, tl.tid))
        items.sort(key=lambda x: x[0])
        if len(items) > CONTEXT_CAP:
            pre = [x for x in items if x[0] < start_seq]
            mid = [x for x in items if x[0] >= start_seq]
            room = CONTEXT_CAP - len(pre)
            if len(mid) > room:
                head = room // 3
                mid = mid[:head] + mid[len(mid) - (room - head):]
            items = pre + mid
        items = [(_ctx_entry(e), t) for _s, e, t in items]
        name = self.timeline_name
        return tuple(ContextEvent(seq=e.seq, timeline=name(t), kind=e.kind, label=e.label,
                                  peer=name(e.peer) if e.peer is not None else "", edge=e.edge)
                     for e, t in items)

