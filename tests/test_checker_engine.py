"""The checker's C engine (racecheck/core/_engine.c) against the Python Checker it ports.

The engine handles a trace for as long as nothing could be reported, then exports its state into
a Python Checker that goes on. Two properties, on every trace here:
  * findings: FastChecker's equal the reference Checker's, field by field;
  * state: where the engine stopped (or at the end of a clean trace), the exported state equals,
    structure for structure, the state the Python handlers build on the same events: timelines,
    clocks, context windows, shadow segments and which records they share, graphs, allocations.
Traces: every public case, hand-built traces of every event kind, the EAGLE v2 scenario's
variants, and random traces drawn by Hypothesis. (tests/test_checker.py's trace builder also
compares the findings of both on every hand-built rule test.)
"""
from __future__ import annotations

import contextlib

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import racecheck
from racecheck.core import native
from racecheck.core.checker import Checker
from racecheck.core.checker import state as schema
from racecheck.core.trace import (Alloc, CapturedOp, Copy, EventRecord, Footprint, Free, GraphCapture,
                             GraphReplay, HostAccess, HostSync, Kernel, NameTensor, NameTimeline,
                             RecordStream, StaleTolerant, StreamWaitEvent, StreamWaitStream)

from cases import EXPECTED

pytestmark = pytest.mark.skipif(native.engine_built is None, reason="the C engine is not built here")


def reference(**kw) -> Checker:
    """The Python Checker with no C at all (instrumentation/_speedups.c's handlers off too)."""
    was = native.speedups is not None
    native.use(False)
    try:
        return Checker(**kw)
    finally:
        native.use(was)


def fast(**kw):
    from racecheck.core.fastchecker import FastChecker
    return FastChecker(engine=native.engine_built, **kw)


# -- comparable state ----------------------------------------------------------------------------

def _rec(r):
    if r is None:
        return None
    tid, clock, seq, ev, sub, host, graph = r
    return (tid, clock, seq, id(ev), None if sub is None else id(sub), host, graph)


def _ctx(e):
    return ("rec",) + _rec(e) if type(e) is tuple else (type(e).__name__,) + tuple(e)


def _tid(t):
    return None if t is None else t.tid


def _slots(obj, forms, skip=()):
    """Every slot of a state object, through its comparable form where it has one."""
    return {s: forms.get(s, lambda v: v)(getattr(obj, s)) for s in type(obj).__slots__ if s not in skip}


_TIMELINE = {"vc": dict, "jh": _tid, "ctx": lambda d: ([_ctx(e) for e in d], d.maxlen),
             "noop": lambda d: None if d is None else [(k, tuple(v)) for k, v in d.items()]}
_INPUT = {}
# `plan` is a cache the first replay makes from `ops` (the engine's export leaves it to the
# Python checker's next replay)
_GRAPH = {"ops": lambda ops: [id(o) for o in ops], "inputs": lambda d: {k: _slots(v, _INPUT) for k, v in d.items()},
          "last_replay": lambda r: None if r is None else (r.seq, r.tl, id(r.ev))}


def _states(states):
    return [None if s is None else (_rec(s[0]), [(k, _rec(v)) for k, v in s[1].items()]) for s in states]


def _shadows(d, c):
    return {st_: _slots(sh, {"bounds": list, "states": _states,
                             "readers": lambda r, st_=st_: r is c._readers.get(st_)})
            for st_, sh in d.items()}


def _readers(d, c):
    return {k: [(g, _slots(inp, _INPUT), inp is c._graphs[g].inputs.get(inp.storage) if g in c._graphs else None)
                for g, inp in v] for k, v in d.items()}


# Comparable forms of the fields whose values hold objects compared by identity (timelines,
# records of events); every other field of the schema is compared as it is.
FORMS = {
    "_tl": lambda d, c: [(tid, _slots(t, _TIMELINE)) for tid, t in d.items()],
    "_streams": lambda v, c: [t.tid for t in v],
    "_main": lambda v, c: _tid(v),
    "_shadow": _shadows,
    "_graphs": lambda d, c: {g: _slots(x, _GRAPH, skip=("plan",)) for g, x in d.items()},
    "_readers": _readers,
    "_frees_open": lambda v, c: [(a.tid, hz) for a, hz in v],
    "finding_set": lambda v, c: [f.to_json() for f in v],
}


def state(c: Checker) -> dict:
    """Every field of the checker's state schema (racecheck.core.checker.state), in comparable
    form; caller's settings and what the class derives are not state. Records are compared by
    content and event identity, and which segments share one record object is part of it."""
    undeclared = schema.undeclared(c)
    assert not undeclared, f"attributes missing from racecheck.core.checker.state.FIELDS: {undeclared}"
    out = {f.name: FORMS.get(f.name, lambda v, c: v)(getattr(c, f.name), c)
           for f in schema.FIELDS if f.role in (schema.STATE, schema.PENDING)}
    shared = {}
    for sh in c._shadow.values():
        for s in sh.states:
            if s is not None:
                for r in [s[0], *s[1].values()]:
                    if r is not None:
                        shared.setdefault(id(r), []).append(_rec(r))
    out["shared"] = sorted(sorted(v) for v in shared.values() if len(v) > 1)
    out["findings"] = [f.to_json() for f in c.findings]
    return out


def assert_same(events, compare_state=True) -> bool:
    """Findings of both checkers equal; the exported state equals the reference's where the engine
    stopped for good. True when the engine handled the whole trace alone (no race judged by the
    Python checker either)."""
    events = list(events)
    ref = reference().process_all(events)
    f = fast().process_all(events)
    assert [x.to_json() for x in f.findings] == [x.to_json() for x in ref.findings]
    assert f.events_processed == ref.events_processed == len(events)
    stop = f.handed_over_at if f.handed_over else len(events)
    if compare_state:
        head = events[:stop]
        g = fast().process_all(head)
        assert not g.handed_over
        per_op = reference()
        per_op.merge_replays = False        # a merged replay leaves the same state (test_replay_merge)
        assert state(g.python_checker()) == state(per_op.process_all(head))
    return not f.handed_over and not f.resumed


# -- public cases ------------------------------------------------------------------------------------

def _case_trace(case):
    program = EXPECTED[case][0]
    with racecheck.session(device="sim", record_trace=True) as rc:
        keep = program(rc.device_module, "cpu")  # noqa: F841 - tensors outlive the snippet
    return list(rc.trace.events)


@pytest.mark.parametrize("case", sorted(EXPECTED))
def test_public_case_every_prefix(case):
    events = _case_trace(case)
    clean = not EXPECTED[case][1]
    for n in range(1, len(events) + 1):
        assert_same(events[:n])
    # a clean program's trace never leaves C
    assert assert_same(events) or not clean


# -- scenario traces ---------------------------------------------------------------------------------

def _scenario_trace(name, variant, executor=None):
    from racecheck import scenarios
    from racecheck.scenarios.registry import RunContext
    sc = scenarios.get(name)
    cfg = sc.config(variant=variant)
    options = sc.session_options(cfg, "sim")
    if executor is not None:
        options["executor"] = executor
    with racecheck.session(device="sim", record_trace=True, **options) as rc:
        sc.run_once(cfg, RunContext(rc.device_module, "cpu", rc, pin=True, seed=0))
    return list(rc.trace.events)


def _variants(name):
    from racecheck import scenarios
    return [None, *scenarios.get(name).variants]


@pytest.mark.parametrize("variant", _variants("eagle-v2"))
def test_eagle_v2_variant(variant):
    from racecheck import scenarios
    events = _scenario_trace("eagle-v2", variant)
    stayed = assert_same(events)
    expected = scenarios.get("eagle-v2").variants[variant].expected if variant else []
    races = [rule for rule, _tensor in expected if rule != "DIFF"]
    assert stayed == (not races)      # a trace with nothing to report never leaves C


def test_eagle_v2_under_the_adversarial_executor():
    from racecheck.instrumentation.adversarial import AdversarialExecutor
    plan = {"priorities": {"#1": 5, "#2": 4, "#3": 3}, "host": 2, "change_points": [15, 60]}
    assert_same(_scenario_trace("eagle-v2", None, AdversarialExecutor(plan)))
    assert_same(_scenario_trace("eagle-v2", "no-futuremap_publish", AdversarialExecutor(plan)))


# -- events the engine leaves to Python ----------------------------------------------------------------

ST = (("/eng/model.py", 3, "step"),)


def test_malformed_event_fails_as_in_python():
    """A footprint the engine cannot read is handed over: the reference raises, as it would alone."""
    bad = Footprint(1, None)
    events = [Alloc(0, 1, 1, 32), Kernel(0, 1, (), (bad,), "k", ST)]
    with pytest.raises(TypeError):
        reference().process_all(events)
    f = fast()
    with pytest.raises(TypeError):
        f.process_all(events)
    assert f.handed_over and f.events_processed == 2      # counted, as Checker.process counts it


def test_unknown_event_type_is_handed_over():
    class Custom(Kernel):
        __slots__ = ()
    events = [Custom(0, 1, (), (Footprint(1, ((0, 8),)),), "k", ST)]
    f = fast().process_all(events)
    assert f.handed_over and f.handed_over_at == 0
    assert_same(events)


def test_iterator_resumes_after_the_handover():
    """The event the engine stops at and the rest of a one-shot iterator reach the Python checker."""
    class Custom(Kernel):
        __slots__ = ()
    x = Footprint(1, ((0, 8),))
    events = [NameTimeline(0, 1, "a"), NameTimeline(0, 2, "b"), Kernel(0, 1, (), (x,), "w", ST),
              Custom(0, 2, (x,), (), "r", ST), Kernel(0, 2, (x,), (), "r2", ST)]
    f = fast().process_all(iter(events))
    assert f.handed_over_at == 3 and f.handed_over_on == "Custom r" and f.events_processed == 5
    assert [x.rule for x in f.findings] == ["RC001"]


# -- races: judged by the Python checker, applied by the engine ----------------------------------------

def test_race_is_judged_by_python_and_the_engine_goes_on():
    x = Footprint(1, ((0, 8),))
    events = [NameTimeline(0, 1, "a"), NameTimeline(0, 2, "b"), Kernel(0, 1, (), (x,), "w", ST),
              Kernel(0, 2, (x,), (), "r", ST), Kernel(0, 2, (x,), (), "r2", ST)]
    f = fast().process_all(iter(events))
    assert not f.handed_over and f.resumed == 1 and f.resumed_on == "Kernel r"
    assert f.engine_path() == {"resumed": 1, "handed_over_at": None, "handed_over_on": None}
    assert f.events_processed == 5 and f._engine.events_processed == 5
    assert [x.rule for x in f.findings] == ["RC001"]
    assert not assert_same(events)


def _racing_steps(n, every=1):
    """n steps, each writing 8 bytes of x on `a` and reading them on `b` unordered: a new race
    (the next 8 bytes) every `every` steps, the same race again in between."""
    out = [NameTimeline(0, 1, "a"), NameTimeline(0, 2, "b"), Alloc(0, 1, 1, 8 * n),
           NameTensor(0, 1, 0, 8 * n, "x", 8, 4)]
    for i in range(n):
        lo = 8 * (i // every)
        x = Footprint(1, ((lo, lo + 8),))
        out += [Kernel(0, 1, (), (x,), f"w{i % 3}", ST), Kernel(0, 2, (x,), (), "r", ST),
                EventRecord(0, 9, 2, ST), StreamWaitEvent(0, 1, 9, ST)]
    return out


def test_a_race_noted_before_stays_in_c():
    """The Python checker judges each new race once; one it has noted before (the same key in
    the storage's StorageShadow.seen, which the engine keeps across resumes) the engine passes."""
    events = _racing_steps(12, every=3)
    f = fast().process_all(events)
    assert not f.handed_over and f.resumed == 4
    assert not assert_same(events)
    for n in range(1, len(events) + 1):
        assert_same(events[:n])


def test_a_race_noted_before_under_another_name_count_is_judged_again():
    events = _racing_steps(2, every=2)
    events[-4:-4] = [NameTensor(0, 1, 4, 8, "x_tail", 4, 4)]
    f = fast().process_all(events)
    assert f.resumed == 2
    assert_same(events)


def test_a_namer_that_raises_while_a_race_is_judged():
    """The reference raises where it would alone and takes the trace over from the next event."""
    def namer(storage, lo, hi):
        raise RuntimeError("namer broke")
    events = [e for e in _racing_steps(3) if type(e) is not NameTensor]
    ref, f = reference(), fast()
    ref.namer = f.namer = namer
    for checker in (ref, f):
        with pytest.raises(RuntimeError, match="namer broke"):
            checker.process_all(events)
    assert f.handed_over and f.handed_over_on == "Kernel r"
    assert f.events_processed == ref.events_processed
    ref.namer = f.namer = None
    rest = events[f.events_processed:]
    ref.process_all(rest)
    f.process_all(rest)
    assert [x.to_json() for x in f.findings] == [x.to_json() for x in ref.findings]
    assert state(f.python_checker()) == state(ref)


def test_a_trace_that_races_often_is_handed_over(monkeypatch):
    from racecheck.core import fastchecker
    monkeypatch.setattr(fastchecker, "RESUMES", 5)
    events = _racing_steps(9)
    f = fast().process_all(events)
    assert f.handed_over and f.resumed == 5 and f.handed_over_on == "Kernel r"
    assert_same(events)


def test_apply_takes_only_the_race_the_engine_stopped_at():
    x = Footprint(1, ((0, 8),))
    events = [Kernel(0, 1, (), (x,), "w", ST), Kernel(0, 2, (x,), (), "r", ST)]
    f = fast()
    with pytest.raises(RuntimeError, match="last stopped at on a race"):
        f._engine.apply(events[0])
    stop = f._engine.process_all(iter(events))
    assert stop is events[1] and f._engine.raced is stop
    with pytest.raises(RuntimeError, match="last stopped at on a race"):
        f._engine.apply(events[0])


# -- RC005 hazards: kept in C until one comes due -----------------------------------------------------

def _hazard_trace():
    """A block allocated on `main`, written there, read on `side` (ordered after the write), then
    freed by the host while the read is still unordered: an RC005 hazard on `main`."""
    x = Footprint(7, ((0, 32),))
    return [NameTimeline(0, 0, "host", True), NameTimeline(0, 1, "main"), NameTimeline(0, 2, "side"),
            Alloc(0, 7, 1, 32), NameTensor(0, 7, 0, 32, "kv", 8, 4),
            Kernel(0, 1, (), (x,), "fill", ST), EventRecord(0, 5, 1, ST),
            StreamWaitEvent(0, 2, 5, ST), Kernel(0, 2, (x,), (), "gather", ST),
            Free(0, 7, (("/eng/model.py", 9, "step"),))]


def test_hazard_that_closes_stays_in_c():
    """The allocation stream waits for the reader before its next work: no finding, and the
    engine never hands over (the real sglang loop's pattern)."""
    events = _hazard_trace() + [EventRecord(0, 6, 2, ST), StreamWaitEvent(0, 1, 6, ST),
                                Kernel(0, 1, (), (Footprint(8, ((0, 8),)),), "next", ST)]
    f = fast()
    f.process_all(events[:10])
    assert f._engine.hazards_open() == 1 and not f.handed_over
    assert assert_same(events)
    f.process_all(events[10:])
    assert f._engine.hazards_open() == 0 and not f.handed_over and f.findings == []


def test_hazard_that_comes_due_is_reported_by_the_reference():
    events = _hazard_trace() + [Kernel(0, 1, (), (Footprint(8, ((0, 8),)),), "reuse", ST)]
    assert not assert_same(events)
    f = fast().process_all(events)
    assert f.handed_over_on == "Kernel reuse"
    assert [(x.rule, x.tensor) for x in f.findings] == [("RC005", "kv")]


def test_hazard_open_when_findings_are_read():
    """Judged as if the trace ended there, on an export; the engine goes on after."""
    events = _hazard_trace()
    f = fast().process_all(events)
    assert not f.handed_over
    assert [(x.rule, x.tensor) for x in f.findings] == [("RC005", "kv")]   # as if the trace ended
    assert [x.to_json() for x in f.findings] == [x.to_json() for x in reference().process_all(events).findings]
    assert not f.handed_over and f._engine.hazards_open() == 1
    # the allocation stream catches up: the hazard closes, as in the reference
    more = [EventRecord(0, 6, 2, ST), StreamWaitEvent(0, 1, 6, ST),
            Kernel(0, 1, (), (Footprint(8, ((0, 8),)),), "next", ST)]
    f.process_all(more)
    ref = reference().process_all(events + more)
    assert f.findings == ref.findings == [] and not f.handed_over
    assert state(f.python_checker()) == state(ref)


def test_hazard_names_an_unnamed_block_through_the_namer():
    events = [e for e in _hazard_trace() if type(e) is not NameTensor]
    namer = lambda storage, lo, hi: "req_to_token" if storage == 7 else None   # noqa: E731
    ref = reference()
    ref.namer = namer
    f = fast()
    f.namer = namer
    ref.process_all(events)
    f.process_all(events)
    assert not f.handed_over
    assert [x.to_json() for x in f.findings] == [x.to_json() for x in ref.findings]
    assert [x.tensor for x in f.findings] == ["req_to_token"]


# -- RC006: stale bytes declared stale-tolerant ---------------------------------------------------------

def _padded_replays(index_role=False, tolerant=True):
    """A graph reads all 32 bytes of storage 20 every replay; before the second replay the
    program rewrites only the first 16 (the padding rows stay stale)."""
    inp = Footprint(20, ((0, 32),))
    read = inp.as_index_into(30) if index_role else inp
    events = [NameTimeline(0, 0, "host", True), NameTimeline(0, 1, "main"),
              NameTensor(0, 20, 0, 32, "input_ids", 8, 4),
              GraphCapture(0, 1, [CapturedOp((read,), (Footprint(21, ((0, 8),)),), "embed", ST)], ST)]
    if tolerant:
        events.append(StaleTolerant(0, 20, 16, 32))
    fill = Kernel(0, 1, (), (inp,), "fill", ST)
    refill = Kernel(0, 1, (), (Footprint(20, ((0, 16),)),), "fill_live_rows", ST)
    return events + [fill, GraphReplay(0, 1, 1, ST), refill, GraphReplay(0, 1, 1, ST)]


def test_tolerated_stale_padding_stays_in_c():
    assert assert_same(_padded_replays())
    assert reference().process_all(_padded_replays()).findings == []


def test_stale_padding_read_as_indices_is_judged_by_the_reference():
    """The stale index the Python checker holds open stays with it while the engine goes on:
    judged when findings are read (on an export) and at the Free of the memory it indexes (the
    engine stops there)."""
    events = _padded_replays(index_role=True)
    f = fast().process_all(events)
    assert not f.handed_over and f.resumed == 1 and f.resumed_on == "GraphReplay"
    assert f.findings == [] and f._judge._stale_open
    later = [Kernel(0, 1, (), (Footprint(30, ((0, 8),)),), "write_kv", ST),
             Kernel(0, 1, (), (Footprint(31, ((0, 8),)),), "other", ST)]
    f.process_all(later)
    assert [(x.rule, x.tensor) for x in f.findings] == [("RC006", "input_ids")]
    freed = events + [Alloc(0, 30, 1, 8)] + later + [Free(0, 30, ST), Kernel(0, 1, (), (Footprint(31, ((0, 8),)),), "next", ST)]
    for trace in (events, events + later, freed):
        assert not assert_same(trace)
    for n in range(1, len(freed) + 1):
        assert_same(freed[:n])
    f = fast().process_all(freed)
    assert not f.handed_over and f.resumed == 2 and not f._judge._stale_open


def test_undeclared_stale_padding_is_rc006():
    """Judged by the Python checker at the replay; the engine applies the replay and goes on."""
    events = _padded_replays(tolerant=False)
    events += [Kernel(0, 1, (), (Footprint(20, ((0, 16),)),), "fill_live_rows", ST),
               GraphReplay(0, 1, 1, ST), Kernel(0, 1, (Footprint(21, ((0, 8),)),), (), "sample", ST)]
    assert not assert_same(events)
    for n in range(1, len(events) + 1):
        assert_same(events[:n])
    f = fast().process_all(events)
    assert [(f.rule, f.tensor) for f in f.findings] == [("RC006", "input_ids")]
    assert not f.handed_over and f.resumed == 2 and f.resumed_on == "GraphReplay"


def test_bytes_a_graph_stages_itself_are_not_inputs_in_c():
    """The graph copies all 32 bytes of storage 20 from its staging buffer (22) before reading
    them; outside it only the first 16 are rewritten: no RC006, in C as in the reference."""
    stage = CapturedOp((Footprint(22, ((0, 32),)),), (Footprint(20, ((0, 32),), approx="capture"),),
                       "copy_", ST)
    embed = CapturedOp((Footprint(20, ((0, 32),)),), (Footprint(21, ((0, 8),)),), "embed", ST)
    events = [NameTimeline(0, 0, "host", True), NameTimeline(0, 1, "main"),
              NameTensor(0, 20, 0, 32, "input_ids", 8, 4), GraphCapture(0, 1, [stage, embed], ST)]
    for rows in (32, 16, 16):
        events += [Kernel(0, 1, (), (Footprint(20, ((0, rows),)),), "eager_fill", ST),
                   GraphReplay(0, 1, 1, ST)]
    assert assert_same(events)
    assert fast().process_all(events).findings == []


# -- random traces ---------------------------------------------------------------------------------

HOSTS, STREAMS, STORAGES, EVENTS, GRAPHS = (100, 101), (1, 2, 3), (10, 11, 12), (1, 2, 3), (1, 2)

stacks = st.integers(1, 4).map(lambda n: (("/eng/model.py", n, f"fn{n}"), ("/eng/loop.py", 7, "step")))
ranges = st.lists(st.tuples(st.integers(0, 4), st.integers(1, 3)).map(lambda p: (8 * p[0], 8 * (p[0] + p[1]))),
                  min_size=1, max_size=2).map(tuple)


@st.composite
def footprints(draw, host=False):
    return Footprint(draw(st.sampled_from(STORAGES)), draw(ranges), draw(st.booleans()) if host else False,
                     draw(st.sampled_from([None, None, None, "strided view"])),
                     draw(st.sampled_from([None, None, 0, 10, 40])))


fps = st.lists(footprints(), max_size=2).map(tuple)
thread = st.sampled_from(HOSTS)
stream = st.sampled_from(STREAMS)
captured = st.builds(CapturedOp, fps, fps, st.sampled_from(["mm", "add"]), stacks)

events = st.one_of(
    st.builds(Kernel, thread, stream, fps, fps, st.sampled_from(["k", "add_"]), stacks),
    st.builds(Kernel, thread, stream, fps, fps, st.sampled_from(["k", "add_"]), stacks),
    st.builds(Copy, thread, stream, footprints(True), footprints(True), st.booleans(), st.just("copy_"), stacks),
    st.builds(HostAccess, thread, fps, fps, st.just("item"), stacks),
    st.builds(EventRecord, thread, st.sampled_from(EVENTS), stream, stacks),
    st.builds(StreamWaitEvent, thread, stream, st.sampled_from(EVENTS), stacks),
    st.builds(StreamWaitStream, thread, stream, stream, stacks),
    st.builds(HostSync, thread, st.just("stream"), stream, stacks),
    st.builds(HostSync, thread, st.just("event"), st.sampled_from(EVENTS), stacks),
    st.builds(HostSync, thread, st.just("device"), st.sampled_from([None, 0, 1]), stacks),
    st.builds(Alloc, thread, st.sampled_from(STORAGES), st.sampled_from(STREAMS + (None,)),
              st.just(64), st.booleans()),
    st.builds(Free, thread, st.sampled_from(STORAGES), stacks),
    st.builds(RecordStream, thread, st.sampled_from(STORAGES), stream, stacks),
    st.builds(GraphCapture, thread, st.sampled_from(GRAPHS), st.lists(captured, max_size=3), stacks),
    st.builds(GraphReplay, thread, st.sampled_from(GRAPHS), stream, stacks),
    st.builds(GraphReplay, thread, st.sampled_from(GRAPHS), stream, stacks),
    st.builds(NameTensor, thread, st.sampled_from(STORAGES), st.sampled_from([0, 8]),
              st.sampled_from([16, 32]), st.sampled_from(["a", "b"]), st.sampled_from([0, 8]),
              st.just(4)),
    st.builds(StaleTolerant, thread, st.sampled_from(STORAGES), st.just(0), st.just(16)),
    st.builds(NameTimeline, thread, st.sampled_from(HOSTS + STREAMS), st.sampled_from(["x", "y"]),
              st.booleans(), st.sampled_from([None, 0, 1])),
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(events, min_size=10, max_size=60))
def test_random_traces(trace):
    assert_same(trace)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(events, min_size=5, max_size=40), st.integers(0, 3))
def test_random_traces_small_context_window(trace, window):
    ref = reference(context_window=window).process_all(trace)
    f = fast(context_window=window).process_all(trace)
    assert [x.to_json() for x in f.findings] == [x.to_json() for x in ref.findings]


def test_new_checker_follows_the_c_switch():
    from racecheck.core.fastchecker import FastChecker, new_checker
    with contextlib.ExitStack() as stack:
        was = native.speedups is not None
        stack.callback(native.use, was)
        native.use(True)
        assert isinstance(new_checker(), FastChecker)
        native.use(False)
        assert type(new_checker()) is Checker


def test_replacing_a_method_of_one_concern_runs_the_python_checker(monkeypatch):
    """The engine ports the methods the checker's concerns define: one replaced on its own class
    (not on Checker) is no longer what the engine runs."""
    from racecheck.core.checker.access import Accesses
    from racecheck.core.fastchecker import FastChecker, new_checker
    with native.using(True):
        assert isinstance(new_checker(), FastChecker)
        monkeypatch.setattr(Accesses, "_read", lambda self, *a: None)
        assert type(new_checker()) is Checker
        monkeypatch.undo()
        assert isinstance(new_checker(), FastChecker)


# -- the state schema: what the export rebuilds, and what the comparison above reads ------------------

def _exported(events) -> Checker:
    """The engine's state after `events` (up to where it stops), exported into a checker that has
    none of the exported fields beforehand."""
    from racecheck.core.fastchecker import _kit
    eng = native.engine_built.Engine(64, _kit())
    eng.process_all(iter(events), None)
    c = Checker.awaiting_export(64)
    eng.export(c)
    return c


@pytest.mark.parametrize("case", sorted(EXPECTED))
def test_the_export_sets_every_exported_field(case):
    c = _exported(_case_trace(case))
    assert schema.not_exported(c) == [] and schema.undeclared(c) == []


def test_the_export_after_eagle_v2_sets_every_exported_field():
    c = _exported(_scenario_trace("eagle-v2", None))
    assert schema.not_exported(c) == [] and c._graphs and c._readers


def test_an_exported_field_the_engine_does_not_set_fails_the_handover(monkeypatch):
    extra = schema.Field("_reuse_counts", "memory", "dict[block, int]", "reuses per block",
                         schema.STATE, dict, "_reuse_counts")
    monkeypatch.setattr(schema, "FIELDS", schema.FIELDS + (extra,))
    monkeypatch.setattr(schema, "EXPORTED", schema.EXPORTED + (extra,))
    x = Footprint(1, ((0, 8),))
    f = fast().process_all([Kernel(0, 1, (), (x,), "w", ST)])
    with pytest.raises(RuntimeError, match="did not export _reuse_counts"):
        f.process_all([Kernel(0, 2, (x,), (), "r", ST)])


def test_the_engine_sets_the_exported_fields_and_asks_for_the_classes_by_their_c_names():
    import pathlib
    core = pathlib.Path(__file__).resolve().parent.parent / "racecheck" / "core"
    src = "".join(p.read_text() for p in sorted(core.rglob("*.[ch]")))
    for f in schema.EXPORTED:
        assert f'"{f.c_name}"' in src, f.name
    for name in schema.CLASSES:
        assert f'"{name}"' in src, name


def test_the_comparison_fails_on_an_undeclared_attribute():
    class Counting(Checker):
        def _on_kernel(self, ev, seq):
            self._kernels = getattr(self, "_kernels", 0) + 1
            super()._on_kernel(ev, seq)

    c = Counting().process_all([Kernel(0, 1, (), (Footprint(1, ((0, 8),)),), "w", ST)])
    with pytest.raises(AssertionError, match="_kernels"):
        state(c)


def test_the_comparison_reads_every_state_field():
    """A field added to the schema is compared without a change here (FORMS only says how)."""
    c = reference().process_all(_hazard_trace())
    compared = set(state(c)) - {"shared", "findings"}
    assert compared == {f.name for f in schema.FIELDS if f.role in (schema.STATE, schema.PENDING)}
    assert set(FORMS) <= compared


def test_a_watched_free_that_opens_a_hazard_names_it_as_the_reference():
    """The Python checker judges the Free (a stale index points into the block) and the engine
    then applies it: the RC005 hazard the engine builds there still sees the block's name."""
    kv = Footprint(30, ((0, 8),))
    events = _padded_replays(index_role=True) + [
        NameTimeline(0, 2, "side"), Alloc(0, 30, 1, 8), NameTensor(0, 30, 0, 8, "kv", 8, 4),
        Kernel(0, 1, (), (kv,), "write_kv", ST), EventRecord(0, 5, 1, ST),
        StreamWaitEvent(0, 2, 5, ST), Kernel(0, 2, (kv,), (), "read_kv", ST), Free(0, 30, ST),
        Kernel(0, 1, (), (Footprint(31, ((0, 8),)),), "reuse", ST)]
    assert not assert_same(events)
    assert ("RC005", "kv") in [(x.rule, x.tensor) for x in fast().process_all(events).findings]
