"""The checker's state: the records it is made of, and the schema of a Checker's attributes.

Every attribute a `Checker` instance has is declared once, in FIELDS: its meaning, the concern
(module of this package) whose handlers change it, and whether the C engine
(racecheck/core/_engine.c) keeps it too, in which case the engine's export must rebuild it, under
the name C sets (`c_name`). `Checker.__init__` makes each field from here; FastChecker's handover
checks that the export rebuilt every exported one; tests/test_checker_engine.py compares every
field between the engine's export and the Python handlers, and fails on an attribute that is not
declared here.
"""
from __future__ import annotations

from collections import deque
from typing import NamedTuple

from racecheck.core.findings import FindingSet, Race
from racecheck.core.shadow import StorageShadow

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
    source: object = None       # the frame naming an unnamed block, read if it comes due


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


def _ctx_entry(e) -> _Ctx:
    t = type(e)
    if t is tuple:       # a kernel's access record
        return _Ctx(e[SEQ], "kernel", getattr(e[EV], "op", "kernel"), None, -1)
    if t is _CtxFree:
        return _Ctx(e.seq, "free", f"free storage #{e.block}", None, -1)
    return e


def _ctx_seq(e) -> int:
    return e[SEQ] if type(e) is tuple else e.seq


# ---- the schema ---------------------------------------------------------------------------------

# What a field is to the engine and to a comparison of two checkers:
STATE = "state"        # built by the events; the engine keeps its own and its export rebuilds it
PENDING = "pending"    # the Python checker's alone: empty until a finding could be made, which is
                       # where the engine hands over (so a new checker's value is the handover's)
CONFIG = "config"      # set by the caller (a constructor argument, or a class default a caller
                       # may override on the instance); FastChecker passes them on
DERIVED = "derived"    # made from the class at construction (nothing to compare)


class Field(NamedTuple):
    """One attribute of a Checker instance."""

    name: str
    concern: str       # the module of this package whose handlers change it
    type: str
    meaning: str
    role: str          # STATE, PENDING, CONFIG or DERIVED
    new: object = None     # makes its initial value; None: the constructor or the class sets it
    c_name: str = ""       # STATE: the attribute the engine's export sets (racecheck/core/_engine.c)


def _state(name, concern, type_, meaning, new):
    return Field(name, concern, type_, meaning, STATE, new, name)


FIELDS = (
    Field("context_window", "checker", "int", "entries kept per timeline for findings' context "
          "(a constructor argument)", CONFIG),
    Field("namer", "naming", "callable | None", "(storage, lo, hi) -> the program's own name for an "
          "unnamed tensor (instrumentation supplies it: the attribute holding the tensor); asked "
          "only when a finding is made", CONFIG, lambda: None),
    Field("settled", "report", "callable | None", "(rule, current Access, previous Access) -> "
          "True for a race its caller sets apart by rule and code site alone (a triaged upstream "
          "race): its finding is made without asking the namer, so nobody pays for a name no one "
          "reads", CONFIG, lambda: None),
    Field("merge_replays", "graphs", "bool", "merge a replay into shadow memory in one step where "
          "the per-op update could note nothing (a class default; False runs every replay op by "
          "op)", CONFIG),
    Field("merge_min_accesses", "graphs", "int", "... for graphs with at least this many captured "
          "accesses per interval of their replay footprint (a class default)", CONFIG),
    Field("_handlers", "checker", "dict[type, method]", "the handler of each event type (subclasses "
          "of an event type are added when first seen)", DERIVED),
    _state("_seq", "checker", "int", "events processed: the next event's trace position", int),
    _state("_tl", "timelines", "dict[tid, _Timeline]", "every timeline, in first-seen order", dict),
    _state("_streams", "timelines", "list[_Timeline]", "the stream timelines, first-seen order", list),
    _state("_main", "timelines", "_Timeline | None", "the first host timeline (new host timelines "
           "start with a copy of its clock)", lambda: None),
    _state("_shadow", "access", "dict[storage, StorageShadow]", "per storage, the last write and "
           "the reads per timeline of each byte segment", dict),
    _state("_records", "sync", "dict[event, _Recorded]", "the latest record of each event: the "
           "recording stream's clock then", dict),
    _state("_allocs", "memory", "dict[block, (stream, host)]", "the allocation stream of each live "
           "block the trace saw allocated", dict),
    _state("_recstreams", "memory", "dict[block, set[stream]]", "streams named by record_stream on "
           "a live block", dict),
    _state("_frees_open", "memory", "list[(_Timeline, _OpenFree)]", "RC005 hazards not judged yet, "
           "in free order (each also in its allocation stream's `frees`)", list),
    _state("_names", "naming", "dict[storage, list[_Name]]", "the named ranges of each storage", dict),
    _state("_name_order", "naming", "int", "NameTensor events seen (the latest name of a range "
           "wins ties)", int),
    _state("_unsited", "naming", "list[block]", "blocks allocated since the last op (that op "
           "describes them)", list),
    _state("_sites", "naming", "dict[block, (op, frames)]", "the first op touching each unnamed "
           "block, and its innermost frame", dict),
    _state("_graphs", "graphs", "dict[graph, _Graph]", "captured graphs", dict),
    _state("_readers", "graphs", "dict[storage, list[(graph, _GraphInput)]]", "the graphs reading "
           "each storage (the same lists the storages' shadows hold)", dict),
    _state("_tolerant", "graphs", "dict[storage, intervals]", "bytes declared stale-tolerant", dict),
    Field("finding_set", "report", "FindingSet", "findings made, deduplicated by signature",
          PENDING, FindingSet),
    Field("_pend", "report", "dict[key, _Noted]", "races noted during the current event (flushed "
          "at its end)", PENDING, dict),
    Field("_stale_open", "graphs", "list[_StaleIndex]", "stale declared-tolerant indices into "
          "memory not written since the capture yet", PENDING, list),
    Field("_stale_seen", "graphs", "set[signature]", "signatures of those ever opened", PENDING, set),
)

FIELD = {f.name: f for f in FIELDS}
EXPORTED = tuple(f for f in FIELDS if f.role == STATE)

# The classes the state is made of, by the name the engine asks for them when it builds it
CLASSES = {"_Timeline": _Timeline, "StorageShadow": StorageShadow, "_Ctx": _Ctx,
           "_CtxFree": _CtxFree, "_Recorded": _Recorded, "_NoopWait": _NoopWait, "_Graph": _Graph,
           "_GraphInput": _GraphInput, "_Replay": _Replay, "_Name": _Name}


def initialize(checker, exported: bool = True) -> None:
    """Every field's initial value on `checker`, except (exported=False) those the engine's
    export sets."""
    for f in FIELDS:
        if f.new is not None and (exported or f.role != STATE):
            setattr(checker, f.name, f.new())


def undeclared(checker) -> list:
    """Attributes of `checker` FIELDS does not declare."""
    return [name for name in vars(checker) if name not in FIELD]


def not_exported(checker) -> list:
    """Fields the engine's export should have set on `checker` and did not."""
    have = vars(checker)
    return [f.name for f in EXPORTED if f.name not in have]
