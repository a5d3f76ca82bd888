"""Findings: what the checker concludes, in the terms an engine developer reads.

Reports read only these objects (or their JSON form), never the trace or the checker.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

RULES = {
    "RC001": ("read-after-write", "read after write on another stream, unordered"),
    "RC002": ("write-after-read", "write after read on another stream, unordered"),
    "RC003": ("write-after-write", "write after write on another stream, unordered"),
    "RC004": ("host-device", "host and device unordered on host memory"),
    "RC005": ("allocator-reuse", "memory freed for reuse while another stream's access is unordered (missing record_stream)"),
    "RC006": ("stale-graph-input", "graph replay reads per-replay input elements not rewritten since the previous replay"),
    "RC007": ("graph-output-overwritten", "graph output read after a later replay of the same graph overwrote it"),
    "RC008": ("wait-before-record", "wait on an event never recorded (a no-op wait) that something relied on"),
    "DIFF": ("differential", "outputs differ from a serialized eager run of the same inputs"),
}


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
        return RULES.get(self.rule, ("", self.rule))[1]

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
