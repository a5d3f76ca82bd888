"""Findings: what the checker concludes, in the terms an engine developer reads.

Reports read only these objects (or their JSON form), never the trace or the checker.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

from . import rules
from .rules import RULES  # noqa: F401  (re-exported: ids in table order)



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
        import hashlib
        return hashlib.sha256("|".join(self.signature).encode()).hexdigest()[:16]

    def message(self) -> str:
        return (f"{self.rule} {self.title} on `{self.tensor}`: {self.current.describe()}; "
                f"previous {self.previous.describe()}")

    def to_json(self) -> dict:
        d = asdict(self)
        d["streams"] = list(self.streams)
        d["fingerprint"] = self.fingerprint()
        return d

    @classmethod
    def from_json(cls, d: dict) -> "Finding":
        def access(a):
            return Access(op=a["op"], stream=a["stream"], kind=a["kind"], location=a["location"],
                          function=a.get("function", ""), stack=tuple(a.get("stack", ())),
                          seq=a.get("seq", -1))
        ctx = tuple(ContextEvent(**c) for c in d.get("context", ()))
        return cls(rule=d["rule"], tensor=d["tensor"], current=access(d["current"]),
                   previous=access(d["previous"]), suggestion=d["suggestion"],
                   detail=d.get("detail", ""), approx=d.get("approx", ""), context=ctx,
                   missing_edge=tuple(d.get("missing_edge", ())))


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
