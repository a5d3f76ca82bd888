"""The picture model of one finding: lanes (streams), ops in issue order, sync edges, the racing pair.

Built only from Finding.context and the two accesses, so HTML and Perfetto draw the same thing.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from racecheck.core.findings import Access, Finding

SYNC_KINDS = {"record", "wait", "sync"}


@dataclass(frozen=True)
class Op:
    seq: int
    lane: str
    kind: str
    label: str
    role: str = ""        # "current" | "previous" | ""


@dataclass
class Timeline:
    lanes: list = field(default_factory=list)     # lane names, top to bottom
    ops: list = field(default_factory=list)       # Op, in seq order
    edges: list = field(default_factory=list)     # (from_seq, to_seq): record -> wait
    race: tuple = ()                              # (previous_seq, current_seq)
    missing: tuple = ()                           # (from_lane, to_lane) of the edge that would order the pair
    stubs: list = field(default_factory=list)     # (seq, peer_lane, incoming): a sync edge whose other end is not shown
    hidden: int = 0                               # context ops left out to keep the picture readable

    def op(self, seq: int) -> Op | None:
        for o in self.ops:
            if o.seq == seq:
                return o
        return None

    def column(self) -> dict:
        """seq -> column index (one column per op, issue order)."""
        return {o.seq: i for i, o in enumerate(self.ops)}


def _access_label(a: Access, tensor: str) -> str:
    return f"{a.op} ({a.kind} {tensor})"


MAX_OPS = 10


def _trim(ops: dict, keep: set, limit: int) -> set:
    """Seqs to show: the racing pair, then sync ops between them, then what lies nearest."""
    lo, hi = min(keep), max(keep)
    rest = [s for s in ops if s not in keep]

    def priority(s):
        between = lo <= s <= hi
        sync = ops[s].kind in SYNC_KINDS
        dist = 0 if between else min(abs(s - lo), abs(s - hi))
        return (not between, not sync, dist, s)

    return set(keep) | set(sorted(rest, key=priority)[:max(0, limit - len(keep))])


def build(f: Finding, max_ops: int = MAX_OPS) -> Timeline:
    ctx = sorted(f.context, key=lambda e: e.seq)
    by_seq = {e.seq: e for e in ctx}
    ops: dict[int, Op] = {e.seq: Op(e.seq, e.timeline, e.kind, e.label) for e in ctx}

    # Place the racing accesses: mark their context events, or add them when the context lacks them.
    top = max([e.seq for e in ctx] + [f.current.seq, f.previous.seq, 0])
    seqs = {}
    for role, a, fallback in (("previous", f.previous, top + 1), ("current", f.current, top + 2)):
        s = a.seq if a.seq >= 0 and a.seq not in seqs.values() else fallback
        old = ops.get(s)
        if old is not None and old.lane == a.stream:
            ops[s] = Op(s, old.lane, old.kind, old.label, role)
        else:
            if old is not None:  # seq collides with an unrelated event: append instead
                s = max(ops) + 1
            ops[s] = Op(s, a.stream, a.kind, _access_label(a, f.tensor), role)
        seqs[role] = s

    hidden = 0
    if max_ops and len(ops) > max_ops:
        shown = _trim(ops, set(seqs.values()), max_ops)
        hidden = len(ops) - len(shown)
        ops = {s: o for s, o in ops.items() if s in shown}

    lanes: list[str] = []
    for lane in [f.previous.stream, f.current.stream, *(o.lane for o in sorted(ops.values(), key=lambda o: o.seq))]:
        if lane and lane not in lanes:
            lanes.append(lane)
    for lane in (f.missing_edge or ()):
        if lane and lane not in lanes:
            lanes.append(lane)
    # the host lane, when present, goes last: it is rarely where the race is
    if "host" in lanes and lanes[-1] != "host" and "host" not in f.streams:
        lanes.remove("host")
        lanes.append("host")

    edges, stubs = [], []
    for e in ctx:
        if e.seq not in ops or e.edge < 0:
            continue
        if e.edge not in by_seq or e.edge not in ops:
            peer = e.peer or (by_seq[e.edge].timeline if e.edge in by_seq else "")
            if peer and e.kind in ("wait", "record"):
                if peer not in lanes:
                    lanes.append(peer)
                stubs.append((e.seq, peer, e.kind == "wait"))
            continue
        src, dst = (e.seq, e.edge) if e.kind == "record" else (e.edge, e.seq)
        if by_seq[src].kind == "wait" and by_seq[dst].kind == "record":
            src, dst = dst, src
        if (src, dst) not in edges:
            edges.append((src, dst))

    return Timeline(lanes=lanes, ops=sorted(ops.values(), key=lambda o: o.seq), edges=edges,
                    race=(seqs["previous"], seqs["current"]),
                    missing=tuple(f.missing_edge) if len(f.missing_edge or ()) == 2 else (),
                    stubs=stubs, hidden=hidden)
