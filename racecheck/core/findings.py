"""Findings: what the checker concludes, in the terms an engine developer reads.

The checker emits a `Race` (the structured conclusion: rule, the bytes, both accesses, the facts
its rule needs, no prose), and `describe(race)` turns it into a `Finding` with its detail and its
suggested fix, as ThreadSanitizer separates ReportDesc from report printing. Reports read only
Findings (or their JSON form), never the trace or the checker.
"""
from __future__ import annotations

import hashlib
import re
from dataclasses import asdict, dataclass, field, fields, replace

from racecheck.core import rules
from racecheck.core.rules import RULES  # noqa: F401  (re-exported: ids in table order)



@dataclass(frozen=True)
class Access:
    """One side of a racing pair."""

    op: str                      # the device op ("add_", "copy_", "graph replay", "wait_event")
    stream: str                  # timeline name: "plan_stream", "default", "host"
    kind: str                    # "read" | "write" | "free" | "wait" | "record" | "replay"
    location: str                # "file.py:123" of the first user frame, "" when unknown
    function: str = ""           # enclosing user function, e.g. "compute_spec_mrope_positions"
    stack: tuple = ()            # ("file.py:123 in fn", ...) innermost first
    seq: int = -1                # position in the trace

    def describe(self) -> str:
        where = f" at {self.location}" if self.location else ""
        fn = f" in {self.function}" if self.function else ""
        return f"{self.kind} by {self.op} on {self.stream}{where}{fn}"


@dataclass(frozen=True)
class ContextEvent:
    """A trace event near the racing pair, for timeline pictures (lanes per stream)."""

    seq: int
    timeline: str
    kind: str                    # "kernel" | "copy" | "record" | "wait" | "sync" | "replay" | "host" | ...
    label: str
    peer: str = ""               # for waits/records: the other timeline of the edge
    edge: int = -1               # seq of the event at the other end of a sync edge, or -1


@dataclass(frozen=True)
class Finding:
    rule: str
    tensor: str
    current: Access
    previous: Access
    suggestion: str
    detail: str = ""             # which bytes/rows/elements, approximations
    approx: str = ""             # why the footprint covers more than the access, when it does
    context: tuple = ()          # tuple[ContextEvent, ...], oldest first
    missing_edge: tuple = ()     # (from_timeline, to_timeline): the edge that would order the pair
    where: str = ""              # the bytes, in the tensor's units ("rows 0..11 of `x` (bytes 0..95 ...)")
    group: str = field(default="", compare=False)   # root-cause group id (`assign_groups`)
    place: Place | None = None   # the same bytes as data: storage, unit, spans (None: an old file)
    facts: tuple = ()            # the rule's own facts (Race's fields past `approx`, those set),
                                 # as (name, value) pairs: a tool reads these, not the prose

    @property
    def streams(self) -> tuple:
        return (self.current.stream, self.previous.stream)

    @property
    def title(self) -> str:
        return rules.get(self.rule).title

    @property
    def signature(self) -> tuple:
        """Identity for deduplication, suppressions and baselines."""
        return (self.rule, self.tensor, self.current.location, self.previous.location)

    def fingerprint(self) -> str:
        return hashlib.sha256("|".join(self.signature).encode()).hexdigest()[:16]

    @property
    def group_key(self) -> tuple:
        """What makes this finding one fix with others when judged alone: the rule family, the
        code sites the fix goes to, the missing edge and the fix itself with the tensor's name
        taken out (a fix that differs in anything else, an event, rows, a host read or write, is
        another group). RC005's fix is per tensor (`record_stream` on the stream that used it,
        wherever it is freed): its findings on one edge are one group. `assign_groups` refines
        this for ordering races, where one wait can cover pairs whose sites differ."""
        if self.rule == "RC005":
            return ("RC005", "", "", *self.missing_edge,
                    _generic_fix(self.suggestion, self.tensor))
        return (_FAMILY.get(self.rule, self.rule), _by(self.current), _by(self.previous),
                *self.missing_edge, _generic_fix(self.suggestion, self.tensor))

    def group_id(self) -> str:
        """The group set over the whole run (`assign_groups`), else this finding's own."""
        return self.group or _hash(self.group_key)

    def message(self) -> str:
        return (f"{self.rule} {self.title} on `{self.tensor}`: {self.current.describe()}; "
                f"previous {self.previous.describe()}")

    def to_json(self) -> dict:
        d = asdict(self)
        d["facts"] = {name: value for name, value in self.facts}
        d["streams"] = list(self.streams)
        d["fingerprint"] = self.fingerprint()
        d["group"] = self.group_id()
        return d

    @classmethod
    def from_json(cls, d: dict) -> "Finding":
        def access(a):
            return Access(op=a["op"], stream=a["stream"], kind=a["kind"], location=a["location"],
                          function=a.get("function", ""), stack=tuple(a.get("stack", ())),
                          seq=a.get("seq", -1))
        ctx = tuple(ContextEvent(**c) for c in d.get("context", ()))
        place = d.get("place")
        return cls(rule=d["rule"], tensor=d["tensor"], current=access(d["current"]),
                   previous=access(d["previous"]), suggestion=d["suggestion"],
                   detail=d.get("detail", ""), approx=d.get("approx", ""), context=ctx,
                   missing_edge=tuple(d.get("missing_edge", ())), where=d.get("where", ""),
                   group=d.get("group", ""), place=Place(**place) if place else None,
                   facts=tuple((k, tuple(v) if isinstance(v, list) else v)
                               for k, v in d.get("facts", {}).items()))


@dataclass
class FindingSet:
    """Findings deduplicated by signature, in detection order."""

    items: list = field(default_factory=list)
    _seen: set = field(default_factory=set)

    def add(self, f: Finding) -> bool:
        sig = f.signature
        if sig in self._seen:
            return False
        self._seen.add(sig)
        self.items.append(f)
        return True

    def __iter__(self):
        return iter(self.items)

    def __len__(self):
        return len(self.items)


# RC001..RC003 share one fix (order the current side after the previous one): one family
_FAMILY = {"RC002": "RC001", "RC003": "RC001"}
_ORDERING = {"RC001", "RC002", "RC003"}


def rule_family(rule: str) -> str:
    """The rule whose fix stands for this one's (RC002 and RC003 are fixed as RC001 is)."""
    return _FAMILY.get(rule, rule)


def _hash(key) -> str:
    return hashlib.sha256("|".join(key).encode()).hexdigest()[:16]


def _generic_fix(fix: str, tensor: str) -> str:
    """The fix with the tensor's own name replaced, so a fix written per tensor ("call
    `x.record_stream(s)`") is the same for every tensor it covers."""
    if not tensor:
        return fix
    return re.sub(r"(?<![\w.])" + re.escape(tensor) + r"(?![\w])", "{tensor}", fix)


@dataclass
class FindingGroup:
    """Findings one synchronization fixes (same `Finding.group_key`), in detection order."""

    id: str
    findings: list

    @property
    def first(self) -> Finding:
        return self.findings[0]

    @property
    def rules(self) -> list:
        return sorted({f.rule for f in self.findings})

    @property
    def tensors(self) -> list:
        """Distinct tensors in detection order."""
        return list(dict.fromkeys(f.tensor for f in self.findings))

    @property
    def first_seq(self) -> int:
        """Where in the trace the missing edge is first needed (-1: unknown, from an old file)."""
        seqs = [f.current.seq for f in self.findings if f.current.seq >= 0]
        return min(seqs) if seqs else -1

    @property
    def suggestion(self) -> str:
        """The one synchronization that fixes every finding of the group: for ordering races
        whose sites differ, the wait goes after the last previous access and before the first
        current one of the group; otherwise the first finding's fix."""
        f = self.first
        sites = _wait_sites(self.findings)
        if sites is None or len({(_by(x.current), _by(x.previous)) for x in self.findings}) == 1:
            return f.suggestion
        return _race_fix(f.previous.stream, sites[0], f.current.stream, sites[1])


def _wait_sites(findings):
    """(after, before): the code sites between which one wait orders every pair, judged in the
    first iteration the pairs occur (the trace's issue order); None when not ordering races."""
    if not findings or any(f.rule not in _ORDERING or f.current.seq < 0 or f.previous.seq < 0
                           for f in findings):
        return None
    first = min(findings, key=lambda f: f.current.seq)
    stab = [f for f in findings if f.previous.seq < first.current.seq]
    last = max(stab, key=lambda f: f.previous.seq)
    return _by(last.previous), _by(first.current)


def assign_groups(findings) -> list:
    """The findings with their root-cause group set (those that carry one keep it).

    Ordering races (RC001..RC003) between the same two timelines are one fix when a single wait
    issued between them orders every pair: its previous accesses all issued before the wait,
    its current ones after. Pairs are taken in issue order and cut into the fewest such sets
    (greedy interval stabbing, earliest current access first); a set's id is its two sites, so
    the same missing wait in every loop iteration is one group. Every other finding groups by
    its own `group_key`."""
    findings = list(findings)
    todo: dict = {}
    for i, f in enumerate(findings):
        if f.group:
            continue
        if f.rule in _ORDERING and f.current.seq >= 0 and f.previous.seq >= 0:
            todo.setdefault((f.previous.stream, f.current.stream), []).append(i)
        else:
            findings[i] = replace(f, group=_hash(f.group_key))
    for (src, dst), idx in todo.items():
        left = sorted(idx, key=lambda i: (findings[i].current.seq, i))
        while left:
            cut = findings[left[0]].current.seq
            stab = [i for i in left if findings[i].previous.seq < cut]
            if not stab:           # the earliest current access precedes its own previous one
                stab = [left[0]]
            after, before = _wait_sites([findings[i] for i in stab])
            gid = _hash(("RC001", src, dst, after, before))
            for i in stab:
                findings[i] = replace(findings[i], group=gid)
            left = [i for i in left if i not in stab]
    return findings


def group_findings(findings) -> list:
    """Findings as root-cause groups (`assign_groups`), the one to fix first first: the earliest
    missing edge in the trace, then the group covering most tensors (detection order breaks
    ties)."""
    groups: dict = {}
    for f in assign_groups(findings):
        gid = f.group_id()
        g = groups.get(gid)
        if g is None:
            groups[gid] = FindingGroup(gid, [f])
        else:
            g.findings.append(f)
    order = list(groups.values())
    big = float("inf")
    order.sort(key=lambda g: (g.first_seq if g.first_seq >= 0 else big, -len(g.tensors)))
    return order


def group_of(findings) -> dict:
    """fingerprint -> group id, for reports that list findings one by one."""
    return {f.fingerprint(): f.group_id() for f in assign_groups(findings)}


# ---- the checker's structured conclusions, and their prose --------------------------------------

@dataclass(frozen=True)
class Place:
    """The bytes a finding is about, in the tensor's own units where it has a name."""

    tensor: str                  # "seq_lens", or "unnamed tensor (first used by ...)"
    storage: int
    unit: str                    # "rows" | "elements" | "bytes" (no shape known)
    spans: str                   # "3..7, 9" in `unit`
    byte_spans: str              # "24..63"
    named: bool                  # a name the program gave or the object holding the tensor

    def where(self) -> str:
        if not self.named:
            return f"bytes {self.byte_spans} of storage #{self.storage}"
        if self.unit == "bytes":
            return f"bytes {self.byte_spans} of `{self.tensor}` (storage #{self.storage})"
        return (f"{self.unit} {self.spans} of `{self.tensor}` "
                f"(bytes {self.byte_spans} of storage #{self.storage})")


@dataclass(frozen=True)
class Race:
    """A conclusion of the checker before any prose: the rule, the bytes, the two accesses (the
    missing edge runs from `previous`'s timeline to `current`'s) and the facts its rule needs."""

    rule: str
    place: Place
    current: Access
    previous: Access
    context: tuple = ()
    approx: str = ""
    host_current: bool = False   # RC004: the host side is the current access
    freer: str = ""              # RC005: the host timeline that dropped the tensor
    reuse: tuple = ()            # RC005: (op, location) the pool's stream issued before waiting
    trace_end: bool = False      # RC005: still open when the trace ends
    graph: object = None         # RC006, RC007
    fresh: str = ""              # RC006: what was rewritten since the previous replay
    index_use: tuple = ()        # RC006: (op, indexed memory) of a stale declared-tolerant index
    overwritten_at: int = -1     # RC007: seq of the replay that overwrote the output
    born: int = -1               # RC007: seq at which the view was taken
    event: object = None         # RC008: the waited event
    host_wait: bool = False      # RC008: event.synchronize() rather than wait_event
    related: str = ""            # RC008: the rule of the race the wait was meant to prevent
    never_recorded: bool = False  # RC008: the waited event was never recorded at all
    instead: object = None       # RC008: the event that was recorded instead, if known


def _by(a: Access) -> str:
    """How a fix names an access: its function; top-level code (`<module>`, a `<lambda>`) by
    file:line, which says where to put the synchronization; else the op."""
    if a.function and not a.function.startswith("<"):
        return a.function
    return a.location or a.function or a.op


def _race_texts(r: Race):
    c, p = r.current, r.previous
    detail = (f"{r.place.where()}: the {c.kind} on `{c.stream}` is not ordered after the {p.kind} "
              f"on `{p.stream}` (no event wait, stream wait or host sync between them)")
    return detail, _race_fix(p.stream, _by(p), c.stream, _by(c))


def _race_fix(src: str, after: str, dst: str, before: str) -> str:
    return (f"record an event on `{src}` after `{after}` and make `{dst}` wait on it "
            f"before `{before}` ({dst}.wait_event(e)), or {dst}.wait_stream({src})")


def _host_device_texts(r: Race):
    c, p, tensor = r.current, r.previous, r.place.tensor
    host, dev = (c, p) if r.host_current else (p, c)
    detail = (f"{r.place.where()}: the host {host.kind} on `{host.stream}` is not ordered with the "
              f"device {dev.kind} by `{dev.op}` on `{dev.stream}` (no synchronize on the copy's "
              f"stream or event in between)")
    if not r.host_current:
        fix = (f"order the host {p.kind} of `{tensor}` on `{p.stream}` before `{_by(c)}` is issued "
               f"on `{c.stream}` (join or signal the host thread `{p.stream}` before issuing it, or "
               f"issue it from `{p.stream}`)")
    elif c.kind == "read":
        fix = (f"synchronize on the copy (record an event after it on `{p.stream}` and call "
               f"event.synchronize()) before reading `{tensor}` on the host")
    else:
        fix = (f"wait for the copy (event.synchronize()) before overwriting `{tensor}` on the host, "
               f"or copy from a separate buffer")
    return detail, fix


def _reuse_texts(r: Race):
    c, p, tensor = r.current, r.previous, r.place.tensor
    detail = (f"{r.place.where()} freed by `{r.freer}` back to `{c.stream}`'s pool while the "
              f"{p.kind} by `{p.op}` on `{p.stream}` is not ordered before the free; a new "
              f"allocation on `{c.stream}` may reuse the bytes under it")
    if r.reuse:
        op, loc = r.reuse
        detail += (f"; `{c.stream}` then issued `{op}`{' at ' + loc if loc else ''} before "
                   f"waiting for `{p.stream}`")
    elif r.trace_end:
        detail += f"; the trace ends with `{c.stream}` still not ordered after it"
    fix = (f"call `{tensor}.record_stream({p.stream})` before freeing it, or keep a reference "
           f"until `{p.stream}`'s work completes")
    return detail, fix


def _stale_input_texts(r: Race):
    pl = r.place
    detail = (f"{pl.unit} {pl.spans} of {pl.tensor} were last written before the previous replay of "
              f"graph {r.graph}; since then only {r.fresh} were rewritten, so this replay reads "
              f"stale values there ({pl.where()})")
    if r.index_use:
        op, into = r.index_use
        detail += (f"; they are declared stale-tolerant, but `{op}` uses them as indices into "
                   f"{into}, which the run writes after the graph's capture")
    fix = f"rewrite (e.g. zero) the padded {pl.unit} {pl.spans} of `{pl.tensor}` before each replay"
    return detail, fix


def _overwritten_output_texts(r: Race):
    detail = (f"{r.place.where()} was overwritten by a later replay of graph {r.graph} (seq "
              f"{r.overwritten_at}) after the view read here was taken (seq {r.born}): it now holds "
              f"that replay's output, not the one the view was taken for")
    return detail, "consume or .clone() the output before the next replay of the graph"


def _noop_wait_texts(r: Race):
    c, p, e, tensor = r.current, r.previous, r.event, r.place.tensor
    how = f"event #{e}.synchronize()" if r.host_wait else f"`{c.stream}`.wait_event(#{e})"
    wat = f" at {c.location}" if c.location else ""
    if r.never_recorded:
        detail = (f"{how}{wat} waited on event #{e}, which was never recorded, so it was a no-op; "
                  f"it ran after the {p.kind} by `{p.op}` on `{p.stream}` that {r.related} reports "
                  f"on `{tensor}`, so the wait was meant to order it")
        if r.instead is not None:
            detail += f" (event #{r.instead} was recorded on `{p.stream}` instead)"
            fix = (f"wait on the event that is recorded (#{r.instead}, e.g. a handle refreshed "
                   f"after the producer swapped events) instead of #{e}{wat}")
        else:
            fix = (f"record event #{e} on `{p.stream}` after `{_by(p)}` before waiting on it{wat}: "
                   f"a wait on an event that was never recorded does nothing")
        return detail, fix
    rat = f" at {p.location}" if p.location else ""
    detail = (f"{how} ran before event #{e} was ever recorded, so it was a no-op; the later record "
              f"on `{p.stream}` covers the access {r.related} reports on `{tensor}`, so the wait "
              f"was meant to order it")
    fix = (f"record event #{e} before waiting on it (move the wait{wat} after "
           f"`e.record({p.stream})`{rat}): a wait on an event that was never recorded does nothing")
    return detail, fix


_TEXTS = {"RC001": _race_texts, "RC002": _race_texts, "RC003": _race_texts,
          "RC004": _host_device_texts, "RC005": _reuse_texts, "RC006": _stale_input_texts,
          "RC007": _overwritten_output_texts, "RC008": _noop_wait_texts}
_NOTE_APPROX = {"RC001", "RC002", "RC003", "RC004"}
# Race's fields a Finding keeps as its `facts` (the others are Finding fields of their own)
_FACTS = tuple(f for f in fields(Race) if f.name not in
               ("rule", "place", "current", "previous", "context", "approx"))


def _facts(r: Race) -> tuple:
    return tuple((f.name, getattr(r, f.name)) for f in _FACTS if getattr(r, f.name) != f.default)


def describe(r: Race) -> Finding:
    """The Finding for a Race: its detail and the smallest synchronization that would fix it."""
    detail, fix = _TEXTS[r.rule](r)
    if r.approx and r.rule in _NOTE_APPROX:
        detail += f"; footprint approximate ({r.approx}): the access may touch fewer bytes"
    return Finding(rule=r.rule, tensor=r.place.tensor, current=r.current, previous=r.previous,
                   suggestion=fix, detail=detail, approx=r.approx, context=r.context,
                   missing_edge=(r.previous.stream, r.current.stream), where=r.place.where(),
                   place=r.place, facts=_facts(r))


__all__ = ["Access", "ContextEvent", "Finding", "FindingGroup", "FindingSet", "Place", "Race",
           "assign_groups", "describe", "group_findings", "group_of", "rule_family"]
