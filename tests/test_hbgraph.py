"""The happens-before graph (racecheck.core.hbgraph, `racecheck explain`) agrees with the checker's clocks."""
from __future__ import annotations

import networkx as nx
from hypothesis import given, settings, strategies as st

from racecheck.cli import main as cli
from racecheck.core.checker import Checker
from racecheck.core.hbgraph import HBGraph
from racecheck.core.trace import (Copy, EventRecord, Footprint, HostAccess, HostSync, Kernel, NameTimeline,
                             StreamWaitEvent, StreamWaitStream)

from helpers import in_session

HOSTS = (100, 101)
STREAMS = (1, 2, 3)
EVENTS = (7, 8)


def _fp(host=False):
    return Footprint(1, ((0, 8),), host=host)


def _event(kind, host, a, b, ev):
    if kind == "kernel":
        return Kernel(host, a, (), (), "k")
    if kind == "record":
        return EventRecord(host, ev, a)
    if kind == "wait_event":
        return StreamWaitEvent(host, a, ev)
    if kind == "wait_stream":
        return StreamWaitStream(host, a, b)
    if kind == "sync_stream":
        return HostSync(host, "stream", a)
    if kind == "sync_event":
        return HostSync(host, "event", ev)
    if kind == "sync_device":
        return HostSync(host, "device", None)
    if kind == "host_access":
        return HostAccess(host, (), (), "item")
    return Copy(host, a, _fp(host=True), _fp(), kind == "copy_async")


programs = st.lists(st.tuples(
    st.sampled_from(["kernel", "kernel", "record", "wait_event", "wait_stream", "sync_stream", "sync_event",
                     "sync_device", "host_access", "copy_blocking", "copy_async"]),
    st.sampled_from(HOSTS[:1] * 3 + HOSTS[1:]), st.sampled_from(STREAMS), st.sampled_from(STREAMS),
    st.sampled_from(EVENTS)), min_size=2, max_size=30)


def _clocks(events):
    """(timeline, epoch, clock after) of every op, read from the checker's vector clocks."""
    c = Checker()
    out = {}
    for seq, ev in enumerate(events):
        c.process(ev)
        if isinstance(ev, (Kernel, Copy, HostAccess)):
            tid = ev.thread if isinstance(ev, HostAccess) else ev.stream
            vc = dict(c._tl[tid].vc)
            out[seq] = (tid, vc[tid], vc)
    return out


@settings(max_examples=150, deadline=None)
@given(programs)
def test_paths_exist_exactly_when_the_vector_clocks_order(program):
    events = [NameTimeline(HOSTS[0], HOSTS[0], "main", is_host=True)]
    events += [_event(*p) for p in program]
    clocks = _clocks(events)
    g = HBGraph(events)
    ops = sorted(clocks)
    for i, a in enumerate(ops):
        for b in ops[i + 1:]:
            tid, epoch, _ = clocks[a]
            ordered = epoch <= clocks[b][2].get(tid, 0)
            assert (g.path(a, b) is not None) == ordered, (a, b, program)


def test_graph_is_acyclic_and_paths_name_their_edges():
    events = [NameTimeline(100, 100, "main", is_host=True), NameTimeline(100, 1, "default"),
              NameTimeline(100, 2, "plan_stream"),
              Kernel(100, 1, (), (), "draft"), EventRecord(100, 7, 1), StreamWaitEvent(100, 2, 7),
              Kernel(100, 2, (), (), "prepare")]
    g = HBGraph(events)
    assert nx.is_directed_acyclic_graph(g.g)
    steps = g.path(3, 6)
    assert [s.timeline for s in steps] == ["default", "default", "plan_stream", "plan_stream"]
    assert [s.edge for s in steps][1:] == ["program order", "wait_event #7", "program order"]
    assert g.path(6, 3) is None


def _program(rc):
    import torch
    import racecheck
    dm = rc.device_module
    plan = dm.Stream()
    rc.name_stream(plan, "plan_stream")
    x = racecheck.name(torch.zeros(8), "seq_lens")
    y = racecheck.name(torch.zeros(8), "positions")
    dm.synchronize()
    with dm.stream(plan):
        x.add_(1)
        y.add_(1)
    e = dm.Event()
    e.record(plan)
    dm.current_stream().wait_event(e)
    y2 = y * 2                       # ordered by the event  # noqa: F841
    with dm.stream(plan):
        x.add_(1)
    x2 = x * 2                       # RC001: nothing orders it  # noqa: F841
    return locals()                  # alive until the session ends


def _trace(tmp_path):
    rc = in_session(_program, record_trace=True)
    path = tmp_path / "t.jsonl"
    rc.save_trace(str(path))
    return path, rc.findings


def test_explain_a_finding_and_an_ordered_pair(tmp_path, capsys):
    path, findings = _trace(tmp_path)
    [f] = [f for f in findings if f.rule == "RC001"]
    assert cli.main(["explain", str(path), "1"]) == 0
    out = capsys.readouterr().out
    assert "RC001 seq_lens" in out and "no happens-before path from previous to current" in out
    assert "the latest point of plan_stream ordered before current: record event" in out
    g = HBGraph.from_file(path)
    writes = [n for n, d in g.g.nodes(data=True) if d["what"] == "add_"]
    reads = [n for n, d in g.g.nodes(data=True) if d["what"] == "mul"]
    assert cli.main(["explain", str(path), "--between", str(writes[1]), str(reads[0])]) == 0
    out = capsys.readouterr().out
    assert "ordered: #" in out and "wait_event" in out and "plan_stream: record event" in out
    graphml = tmp_path / "hb.graphml"
    assert cli.main(["explain", str(path), f.fingerprint()[:6], "--graphml", str(graphml)]) == 0
    back = nx.read_graphml(graphml)
    marked = [n for n, d in back.nodes(data=True) if d["access"] == "yes"]
    assert sorted(marked) == sorted([str(f.previous.seq), str(f.current.seq)])


def test_explain_takes_findings_from_a_report(tmp_path, capsys):
    path, _ = _trace(tmp_path)
    report = tmp_path / "f.json"
    assert cli.main(["check", str(path), "--report", f"json={report}"]) == 1
    capsys.readouterr()
    assert cli.main(["explain", str(path), "--findings", str(report)]) == 0
    assert "no happens-before path" in capsys.readouterr().out


def test_explain_bad_input_is_one_line(tmp_path, capsys):
    path, _ = _trace(tmp_path)
    for argv in (["explain", str(path), "9"], ["explain", str(path), "zzzz"],
                 ["explain", str(tmp_path / "none.jsonl")], ["explain", str(path), "--between", "0", "99999"],
                 ["explain", str(path), "--radius", "-1"]):
        assert cli.main(argv) == 2, argv
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1, err
