"""The happens-before order of a saved trace as a networkx graph, for explanations.

The checker keeps vector clocks because they are cheap online; to tell a person *why* two
accesses are ordered (or that nothing orders them) an explicit graph is clearer: one node per
trace event on its timeline (a stream or a host thread), and an edge for each ordering the
checker's model has (racecheck.core.checker's docstring):

* program order on each timeline;
* launch: the host's latest point before it issues device work -> that work;
* record -> wait: the latest record of an event -> a `wait_event` (or host `event.synchronize`)
  on it; a wait on a never-recorded event gets no edge (a no-op);
* `wait_stream`: the waitee's latest work -> the waiter;
* host syncs: the synchronized stream's (event's, every stream's) latest work -> the host;
  a blocking copy involving host memory -> the host after it;
* thread start: the main host thread's latest point -> a new host thread's first event.

Node ids are trace positions (`seq`, as in `Access.seq`); a blocking copy's host side is the
node `(seq, "host")`. Reachability in this graph is the checker's `c <= VC[T]` test.
"""
from __future__ import annotations

from dataclasses import dataclass

import networkx as nx

from racecheck.core.trace import (Alloc, Copy, EventRecord, Free, GraphCapture, GraphReplay, HostAccess, HostSync,
                    Kernel, NameTensor, NameTimeline, RecordStream, StreamWaitEvent, StreamWaitStream,
                    frame_info)

_HOST_ONLY = (HostAccess, HostSync, Alloc, Free, RecordStream, GraphCapture)


def _where(ev) -> str:
    if not ev.stack:
        return ""
    filename, line, fn = frame_info(ev.stack[0])
    return f"{filename.rsplit('/', 1)[-1]}:{line} in {fn}"


def _what(ev) -> str:
    if isinstance(ev, (Kernel, Copy, HostAccess)):
        return ev.op
    if isinstance(ev, GraphReplay):
        return f"replay graph {ev.graph}"
    if isinstance(ev, EventRecord):
        return f"record event #{ev.event}"
    if isinstance(ev, StreamWaitEvent):
        return f"wait_event #{ev.event}"
    if isinstance(ev, StreamWaitStream):
        return "wait_stream"
    if isinstance(ev, HostSync):
        return {"device": "device synchronize", "stream": "stream synchronize",
                "event": f"event #{ev.target} synchronize"}.get(ev.sync_kind, ev.sync_kind)
    return ev.kind


@dataclass
class Step:
    """One node of an explanation: where it ran and what it was."""
    node: object
    timeline: str
    what: str
    where: str
    edge: str           # how this step is ordered after the one before it ("" for the first)

    def text(self) -> str:
        at = f" at {self.where}" if self.where else ""
        via = f"  [{self.edge}]" if self.edge else ""
        return f"{self.timeline}: {self.what}{at}{via}"


class HBGraph:
    """Happens-before DAG of one trace; `path(a, b)` explains why a is ordered before b."""

    def __init__(self, events):
        self.g = nx.DiGraph()
        self._names: dict = {}
        self._hosts: set = set()
        self._devices: dict = {}
        self._last: dict = {}        # timeline -> latest node on it
        self._records: dict = {}     # event id -> latest record node
        self._main = None
        for seq, ev in enumerate(events):
            self._add(seq, ev)

    @classmethod
    def from_file(cls, path) -> "HBGraph":
        from racecheck.core.trace import Trace
        return cls(Trace.iter_file(path))

    # -- building -----------------------------------------------------------------------------
    def timeline_name(self, tid) -> str:
        name = self._names.get(tid)
        if name:
            return name
        return f"host {tid}" if tid in self._hosts else f"stream {tid}"

    def _host(self, tid, seq):
        if tid not in self._hosts:
            self._hosts.add(tid)
            if self._main is None:
                self._main = tid
            elif self._last.get(self._main) is not None:
                start = ("start", tid)
                self._node(start, tid, "thread start", "", seq - 0.5)
                self.g.add_edge(self._last[self._main], start, kind="thread start")
        return tid

    def _node(self, node, tid, what, where, order):
        self.g.add_node(node, timeline=tid, what=what, where=where, order=order)
        prev = self._last.get(tid)
        if prev is not None:
            self.g.add_edge(prev, node, kind="program order")
        self._last[tid] = node

    def _from(self, src, dst, kind):
        if src is not None and src != dst:
            self.g.add_edge(src, dst, kind=kind)

    def _add(self, seq, ev):
        if isinstance(ev, NameTimeline):
            self._host(ev.thread, seq)
            if ev.is_host:
                self._host(ev.timeline, seq)
            self._names[ev.timeline] = ev.name
            if ev.device is not None:
                self._devices[ev.timeline] = ev.device
            return
        if isinstance(ev, NameTensor):
            return
        host = self._host(ev.thread, seq)
        if isinstance(ev, _HOST_ONLY):
            self._node(seq, host, _what(ev), _where(ev), seq)
            if isinstance(ev, HostSync):
                self._host_sync(seq, ev)
            return
        stream = ev.waiter if isinstance(ev, StreamWaitStream) else ev.stream
        launch_from = self._last.get(host)
        self._node(seq, stream, _what(ev), _where(ev), seq)
        self._from(launch_from, seq, "launch")
        if isinstance(ev, EventRecord):
            self._records[ev.event] = seq
        elif isinstance(ev, StreamWaitEvent):
            self._from(self._records.get(ev.event), seq, f"wait_event #{ev.event}")
        elif isinstance(ev, StreamWaitStream):
            if ev.waitee != ev.waiter:
                self._from(self._last.get(ev.waitee), seq, "wait_stream")
        elif isinstance(ev, Copy) and not ev.non_blocking and (ev.src.host or ev.dst.host):
            done = (seq, "host")
            self._node(done, host, f"blocking {ev.op} done", _where(ev), seq + 0.5)
            self._from(seq, done, "blocking copy")

    def _host_sync(self, seq, ev):
        kind, target = ev.sync_kind, ev.target
        if kind == "stream":
            self._from(self._last.get(target), seq, "stream synchronize")
        elif kind == "event":
            self._from(self._records.get(target), seq, f"event #{target} synchronize")
        elif kind == "device":
            for tid, node in list(self._last.items()):
                if tid in self._hosts:
                    continue
                dev = self._devices.get(tid)
                if target is None or dev is None or dev == target:
                    self._from(node, seq, "device synchronize")

    # -- questions ------------------------------------------------------------------------------
    def _seq(self, node) -> float:
        return self.g.nodes[node]["order"]

    def _step(self, node, edge="") -> Step:
        d = self.g.nodes[node]
        return Step(node, self.timeline_name(d["timeline"]), d["what"], d["where"], edge)

    def path(self, a, b) -> list | None:
        """Steps of a shortest happens-before path from trace position a to b, or None."""
        for n in (a, b):
            if n not in self.g:
                raise KeyError(f"trace position {n} is not an op on a timeline")
        lo, hi = self._seq(a), self._seq(b)
        if hi < lo:
            return None
        window = self.g.subgraph(n for n, o in self.g.nodes(data="order") if lo <= o <= hi)
        try:
            nodes = nx.shortest_path(window, a, b)
        except nx.NetworkXNoPath:
            return None
        steps = [self._step(nodes[0])]
        for u, v in zip(nodes, nodes[1:]):
            steps.append(self._step(v, self.g.edges[u, v]["kind"]))
        return steps

    def horizon(self, b, timeline) -> Step | None:
        """The latest point of `timeline` that happens before b (what b's side knows of it)."""
        known = nx.ancestors(self.g, b)
        best = None
        for n in known:
            if self.g.nodes[n]["timeline"] == timeline and (best is None or self._seq(n) > self._seq(best)):
                best = n
        return self._step(best) if best is not None else None

    def timeline_of(self, node):
        return self.g.nodes[node]["timeline"]

    def neighbourhood(self, nodes, radius: int = 3) -> nx.DiGraph:
        """The subgraph within `radius` edges (either direction) of any of `nodes`."""
        und = self.g.to_undirected(as_view=True)
        keep = set()
        for n in nodes:
            keep |= set(nx.single_source_shortest_path_length(und, n, cutoff=radius))
        return self.g.subgraph(keep).copy()

    def write_graphml(self, graph: nx.DiGraph, path, marked=()) -> None:
        """GraphML with readable string attributes (yEd, Gephi, networkx.read_graphml)."""
        out = nx.DiGraph()
        for n, d in graph.nodes(data=True):
            out.add_node(str(n), timeline=self.timeline_name(d["timeline"]), what=d["what"],
                         where=d["where"], access=("yes" if n in marked else "no"))
        for u, v, d in graph.edges(data=True):
            out.add_edge(str(u), str(v), kind=d["kind"])
        nx.write_graphml(out, path)
