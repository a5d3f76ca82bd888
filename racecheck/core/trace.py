"""Trace events: the contract between instrumentation and the checker.

Events are appended in host issue order. Each names the host thread that issued it (a host
timeline) and, for device work, the stream (a device timeline). Timelines, events, graphs and
storages are small integers assigned by the instrumentation; names travel as their own events.

Events are plain slotted objects so that building one costs little on the per-op path; every
event converts to and from a JSON object for `.jsonl` traces that can be re-checked offline.

The C code reads and writes the fields of events, footprints and captured ops by name: the
checker's engine finds each field's slot by its name (racecheck/core/_engine.c), the per-op path
makes events slot by slot (instrumentation/_speedups.c). Their `__slots__` are that declaration
(racecheck.core.cnames; tests/test_cnames.py checks the C's names against them).
"""
from __future__ import annotations

import json
from typing import IO, Iterable, Iterator

Ranges = tuple  # tuple[tuple[int, int], ...]: sorted, disjoint, half-open byte intervals
Frame = tuple  # (filename, lineno, function), or a raw (code object, bytecode offset) pair

_line_cache: dict = {}


def frame_info(fr) -> tuple:
    """(filename, lineno, function) of a stack entry.

    Instrumentation records raw (code, offset) pairs on the per-op path, because computing a
    line number costs more than the rest of the walk; the line is looked up only when a
    finding or a saved trace needs it.
    """
    if len(fr) == 3:
        return fr
    code, lasti = fr
    key = (id(code), lasti)
    hit = _line_cache.get(key)
    if hit is None or hit[0] is not code:
        line = code.co_firstlineno
        for start, end, ln in code.co_lines():
            if start <= lasti < end:
                if ln is not None:
                    line = ln
                break
        hit = _line_cache[key] = (code, (code.co_filename, line, code.co_name))
    return hit[1]


def stack_json(stack) -> list:
    return [list(frame_info(fr)) for fr in stack]


class Footprint:
    """Bytes of one storage an access touches.

    `approx` is None when the ranges are exact, otherwise a short reason the instrumentation
    had to cover more than the access really touches ("strided view", "index values unknown").
    `born` is the trace position at which the accessing view was created, when the instrumentation
    knows it: it lets the checker tell a view taken before a graph replay from one taken after.
    `index_into` is set on a read whose values the op uses as indices (an index role): the storage
    they select rows of, so that a stale index can be told from stale data (RC006).
    """

    __slots__ = ("storage", "ranges", "host", "approx", "born", "_as_index")
    index_into = None       # an IndexFootprint's slot; ordinary footprints pay nothing for it

    def __init__(self, storage: int, ranges: Ranges, host: bool = False,
                 approx: str | None = None, born: int | None = None):
        self.storage = storage
        self.ranges = ranges
        self.host = host
        self.approx = approx
        self.born = born

    def as_index_into(self, storage: int) -> "Footprint":
        """This read in an index role into `storage` (a copy, kept: footprints are cached per
        tensor, and an index tensor is often used again the same way)."""
        try:
            m = self._as_index
        except AttributeError:
            m = None
        if m is None or m.index_into != storage:
            m = self._as_index = IndexFootprint(self.storage, self.ranges, self.host, self.approx,
                                                self.born, storage)
        return m

    def nbytes(self) -> int:
        return sum(hi - lo for lo, hi in self.ranges)

    def to_json(self) -> dict:
        d = {"storage": self.storage, "ranges": [list(r) for r in self.ranges]}
        if self.host:
            d["host"] = True
        if self.approx:
            d["approx"] = self.approx
        if self.born is not None:
            d["born"] = self.born
        if self.index_into is not None:
            d["index_into"] = self.index_into
        return d

    @classmethod
    def from_json(cls, d: dict) -> "Footprint":
        ranges = tuple((int(lo), int(hi)) for lo, hi in d["ranges"])
        for lo, hi in ranges:
            if lo < 0 or hi < lo:
                raise ValueError(f"bad byte range [{lo}, {hi})")
        into = d.get("index_into")
        fp = Footprint(int(d["storage"]), ranges, bool(d.get("host", False)), d.get("approx"),
                       d.get("born"))
        return fp if into is None else fp.as_index_into(int(into))

    def __eq__(self, other):
        return isinstance(other, Footprint) and self.to_json() == other.to_json()

    def __repr__(self):
        return f"Footprint({self.to_json()})"


class IndexFootprint(Footprint):
    """A read whose values an index op uses as indices into storage `index_into`."""

    __slots__ = ("index_into",)

    def __init__(self, storage, ranges, host=False, approx=None, born=None, index_into=None):
        super().__init__(storage, ranges, host, approx, born)
        self.index_into = index_into


class Event:
    """Base of all trace events. `thread` is the issuing host timeline, `stack` a tuple of frames."""

    __slots__ = ("thread", "stack")
    kind = "event"
    fields: tuple = ()

    def to_json(self) -> dict:
        d = {"kind": self.kind, "thread": self.thread}
        for f in self.fields:
            v = getattr(self, f)
            if isinstance(v, Footprint):
                v = v.to_json()
            elif isinstance(v, tuple) and v and isinstance(v[0], Footprint):
                v = [x.to_json() for x in v]
            elif f == "ops":
                v = [op.to_json() for op in v]
            d[f] = v
        if self.stack:
            d["stack"] = stack_json(self.stack)
        return d

    def __repr__(self):
        return f"{type(self).__name__}({self.to_json()})"


def _fp_list(v) -> tuple:
    return tuple(Footprint.from_json(x) for x in v)


class Kernel(Event):
    """One device op on `stream`: it reads and writes the given footprints when it runs."""

    __slots__ = ("stream", "reads", "writes", "op")
    kind = "kernel"
    fields = ("stream", "reads", "writes", "op")

    def __init__(self, thread, stream, reads, writes, op, stack=()):
        # one attribute at a time: cheaper than a tuple assignment on the per-op path
        self.thread = thread
        self.stream = stream
        self.reads = reads
        self.writes = writes
        self.op = op
        self.stack = stack


class Copy(Event):
    """H2D/D2H/D2D copy on `stream`. A blocking copy that involves host memory also blocks the host."""

    __slots__ = ("stream", "src", "dst", "non_blocking", "op")
    kind = "copy"
    fields = ("stream", "src", "dst", "non_blocking", "op")

    def __init__(self, thread, stream, src, dst, non_blocking, op="copy_", stack=()):
        self.thread, self.stream, self.src, self.dst, self.non_blocking, self.op, self.stack = (
            thread, stream, src, dst, non_blocking, op, stack)


class EventRecord(Event):
    __slots__ = ("event", "stream")
    kind = "event_record"
    fields = ("event", "stream")

    def __init__(self, thread, event, stream, stack=()):
        self.thread, self.event, self.stream, self.stack = thread, event, stream, stack


class StreamWaitEvent(Event):
    __slots__ = ("stream", "event")
    kind = "stream_wait_event"
    fields = ("stream", "event")

    def __init__(self, thread, stream, event, stack=()):
        self.thread, self.stream, self.event, self.stack = thread, stream, event, stack


class StreamWaitStream(Event):
    __slots__ = ("waiter", "waitee")
    kind = "stream_wait_stream"
    fields = ("waiter", "waitee")

    def __init__(self, thread, waiter, waitee, stack=()):
        self.thread, self.waiter, self.waitee, self.stack = thread, waiter, waitee, stack


class HostSync(Event):
    """The host blocks until `target` completes: kind is device | stream | event.

    A successful `query()` is the same acquire edge. For kind=device, target is a device
    index, or None for every stream seen so far.
    """

    __slots__ = ("sync_kind", "target")
    kind = "host_sync"
    fields = ("sync_kind", "target")

    def __init__(self, thread, sync_kind, target, stack=()):
        self.thread, self.sync_kind, self.target, self.stack = thread, sync_kind, target, stack


class HostAccess(Event):
    """Host code touching host memory (pinned buffers, results of `.item()`)."""

    __slots__ = ("reads", "writes", "op")
    kind = "host_access"
    fields = ("reads", "writes", "op")

    def __init__(self, thread, reads, writes, op, stack=()):
        self.thread, self.reads, self.writes, self.op, self.stack = thread, reads, writes, op, stack


class Alloc(Event):
    """A storage comes to life on `stream` (its allocation stream, whose pool it returns to)."""

    __slots__ = ("block", "stream", "nbytes", "host")
    kind = "alloc"
    fields = ("block", "stream", "nbytes", "host")

    def __init__(self, thread, block, stream, nbytes, host=False, stack=()):
        self.thread = thread
        self.block = block
        self.stream = stream
        self.nbytes = nbytes
        self.host = host
        self.stack = stack


class Free(Event):
    __slots__ = ("block",)
    kind = "free"
    fields = ("block",)

    def __init__(self, thread, block, stack=()):
        self.thread = thread
        self.block = block
        self.stack = stack


class RecordStream(Event):
    """`t.record_stream(s)`: the allocator will not reuse `block` before `stream`'s work so far."""

    __slots__ = ("block", "stream")
    kind = "record_stream"
    fields = ("block", "stream")

    def __init__(self, thread, block, stream, stack=()):
        self.thread, self.block, self.stream, self.stack = thread, block, stream, stack


class CapturedOp:
    """One op recorded during graph capture: accesses it will make at every replay."""

    __slots__ = ("reads", "writes", "op", "stack")

    def __init__(self, reads, writes, op, stack=()):
        self.reads, self.writes, self.op, self.stack = reads, writes, op, stack

    def to_json(self) -> dict:
        return {"reads": [f.to_json() for f in self.reads],
                "writes": [f.to_json() for f in self.writes], "op": self.op,
                "stack": stack_json(self.stack)}

    @classmethod
    def from_json(cls, d) -> "CapturedOp":
        return cls(_fp_list(d.get("reads", [])), _fp_list(d.get("writes", [])), str(d["op"]),
                   tuple(tuple(fr) for fr in d.get("stack", [])))


class GraphCapture(Event):
    """End of a capture: nothing ran; `ops` are what each replay will do."""

    __slots__ = ("graph", "ops")
    kind = "graph_capture"
    fields = ("graph", "ops")

    def __init__(self, thread, graph, ops, stack=()):
        self.thread, self.graph, self.ops, self.stack = thread, graph, ops, stack


class GraphReplay(Event):
    __slots__ = ("graph", "stream")
    kind = "graph_replay"
    fields = ("graph", "stream")

    def __init__(self, thread, graph, stream, stack=()):
        self.thread, self.graph, self.stream, self.stack = thread, graph, stream, stack


class NameTensor(Event):
    """`racecheck.name(t, name)`: bytes [lo, hi) of `storage` are called `name`.

    `row_bytes` (bytes per leading-dimension row, 0 when not a matrix-like layout) and
    `itemsize` let findings speak in rows and elements instead of bytes.
    """

    __slots__ = ("storage", "lo", "hi", "name", "row_bytes", "itemsize")
    kind = "name_tensor"
    fields = ("storage", "lo", "hi", "name", "row_bytes", "itemsize")

    def __init__(self, thread, storage, lo, hi, name, row_bytes=0, itemsize=1, stack=()):
        self.thread, self.storage, self.lo, self.hi, self.name = thread, storage, lo, hi, name
        self.row_bytes, self.itemsize, self.stack = row_bytes, itemsize, stack


class StaleTolerant(Event):
    """`racecheck.stale_tolerant(t)`: bytes [lo, hi) of `storage`, a graph's per-replay input, may
    hold stale values in rows a replay does not refresh (padding whose results are discarded).
    A stale value there used as an index into memory the run mutates is still RC006."""

    __slots__ = ("storage", "lo", "hi")
    kind = "stale_tolerant"
    fields = ("storage", "lo", "hi")

    def __init__(self, thread, storage, lo, hi, stack=()):
        self.thread, self.storage, self.lo, self.hi, self.stack = thread, storage, lo, hi, stack


class NameTimeline(Event):
    """Human name of a timeline: a stream ("plan_stream", "default") or a host thread."""

    __slots__ = ("timeline", "name", "is_host", "device")
    kind = "name_timeline"
    fields = ("timeline", "name", "is_host", "device")

    def __init__(self, thread, timeline, name, is_host=False, device=None, stack=()):
        self.thread, self.timeline, self.name, self.is_host, self.device, self.stack = (
            thread, timeline, name, is_host, device, stack)


EVENT_TYPES = {cls.kind: cls for cls in (
    Kernel, Copy, EventRecord, StreamWaitEvent, StreamWaitStream, HostSync, HostAccess, Alloc,
    Free, RecordStream, GraphCapture, GraphReplay, NameTensor, StaleTolerant, NameTimeline)}

_FOOTPRINT_FIELDS = {"reads", "writes"}
_SINGLE_FOOTPRINT_FIELDS = {"src", "dst"}


class TraceFormatError(ValueError):
    """A trace file that is not a racecheck trace (bad JSON, unknown kind, missing field)."""


def event_from_json(d: dict) -> Event:
    if not isinstance(d, dict):
        raise TraceFormatError("each line must be a JSON object")
    kind = d.get("kind")
    cls = EVENT_TYPES.get(kind)
    if cls is None:
        raise TraceFormatError(f"unknown event kind {kind!r}")
    try:
        kwargs = {}
        for f in cls.fields:
            v = d[f] if f not in ("host", "non_blocking", "row_bytes", "itemsize", "is_host",
                                  "device") else d.get(f)
            if f in _FOOTPRINT_FIELDS:
                v = _fp_list(v)
            elif f in _SINGLE_FOOTPRINT_FIELDS:
                v = Footprint.from_json(v)
            elif f == "ops":
                v = [CapturedOp.from_json(x) for x in v]
            kwargs[f] = v
        for f, default in (("host", False), ("non_blocking", False), ("row_bytes", 0),
                           ("itemsize", 1), ("is_host", False)):
            if f in kwargs and kwargs[f] is None:
                kwargs[f] = default
        ev = cls(d["thread"], **kwargs)
        ev.stack = tuple(tuple(fr) for fr in d.get("stack", ()))
        return ev
    except (KeyError, TypeError, ValueError) as exc:
        raise TraceFormatError(f"malformed {kind} event: {exc!r}") from None


class Trace:
    """Append-only list of events in host issue order."""

    FORMAT = "racecheck-trace"
    VERSION = 1

    def __init__(self, events: Iterable[Event] = ()):
        self.events: list[Event] = list(events)

    def append(self, event: Event) -> None:
        self.events.append(event)

    def __iter__(self) -> Iterator[Event]:
        return iter(self.events)

    def __len__(self) -> int:
        return len(self.events)

    END = "end"     # the last line's kind: a file without it was cut short

    def dump(self, fp: IO[str]) -> None:
        fp.write(json.dumps({"format": self.FORMAT, "version": self.VERSION}) + "\n")
        for ev in self.events:
            fp.write(json.dumps(ev.to_json(), separators=(",", ":")) + "\n")
        fp.write(json.dumps({"kind": self.END, "events": len(self.events)}) + "\n")

    def save(self, path) -> None:
        """Write atomically: a crash leaves either the old file or the whole new one."""
        from racecheck.core.files import atomic_open
        with atomic_open(path) as fp:
            self.dump(fp)

    @classmethod
    def is_complete(cls, path) -> bool:
        """Does the file end with the end line `dump` writes (older traces and cut files do not)?"""
        with open(path, "rb") as fp:
            fp.seek(0, 2)
            fp.seek(max(0, fp.tell() - 256))
            tail = fp.read().decode("utf-8", "replace").strip().rsplit("\n", 1)[-1]
        try:
            last = json.loads(tail)
        except json.JSONDecodeError:
            return False
        return isinstance(last, dict) and last.get("kind") == cls.END

    @classmethod
    def iter_file(cls, path) -> Iterator[Event]:
        with open(path) as fp:
            first = fp.readline()
            if not first.strip():
                raise TraceFormatError(f"{path}: empty file, not a racecheck trace")
            try:
                header = json.loads(first)
            except json.JSONDecodeError:
                raise TraceFormatError(f"{path}: line 1 is not JSON") from None
            if not isinstance(header, dict) or header.get("format") != cls.FORMAT:
                raise TraceFormatError(f"{path}: not a racecheck trace (missing header line)")
            if header.get("version") != cls.VERSION:
                raise TraceFormatError(f"{path}: unsupported trace version {header.get('version')!r}")
            for lineno, line in enumerate(fp, start=2):
                if not line.strip():
                    continue
                try:
                    d = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise TraceFormatError(f"{path}:{lineno}: invalid JSON ({exc.msg})") from None
                if isinstance(d, dict) and d.get("kind") == cls.END:
                    continue
                try:
                    yield event_from_json(d)
                except TraceFormatError as exc:
                    raise TraceFormatError(f"{path}:{lineno}: {exc}") from None

    @classmethod
    def load(cls, path) -> "Trace":
        return cls(cls.iter_file(path))
