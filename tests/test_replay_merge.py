"""Graph replays merged into shadow memory in one step (racecheck/core/replay.py) leave the state the
per-op update leaves, and give the same findings, on random traces and on the public cases."""
from __future__ import annotations

import random

from racecheck.core.checker import Checker
from racecheck.core.trace import (CapturedOp, EventRecord, Footprint, GraphCapture, GraphReplay,
                             HostSync, Kernel, NameTimeline, StreamWaitEvent)


def state(c: Checker):
    """The shadow memory as comparable data: boundaries, and per segment the write and reads,
    records numbered by first appearance (so which segments share a record is compared too)."""
    ids = {}

    def rec(r):
        if r is None:
            return None
        n = ids.setdefault(id(r), len(ids))
        return (n, r[0], r[1], r[2], id(r[3]), id(r[4]) if r[4] is not None else None, r[5], r[6])

    return {sid: (tuple(sh.bounds),
                  tuple(None if st is None else (rec(st[0]), tuple((t, rec(x)) for t, x in st[1].items()))
                        for st in sh.states))
            for sid, sh in c._shadow.items()}


def _ranges(rng, size=64):
    out = []
    lo = rng.randrange(0, size, 8)
    while lo < size and len(out) < 2:
        hi = min(size, lo + 8 * rng.randint(1, 3))
        out.append((lo, hi))
        lo = hi + 8 * rng.randint(0, 2)
    return tuple(out)


def _fp(rng, born=None):
    return Footprint(rng.randint(1, 4), _ranges(rng), born=born)


def random_trace(seed: int) -> list:
    rng = random.Random(seed)
    evs = [NameTimeline(0, 0, "host", True)]
    streams = [1, 2, 3]
    graphs = []
    for n in range(rng.randint(20, 60)):
        x = rng.random()
        s = rng.choice(streams)
        if x < 0.35:
            evs.append(Kernel(0, s, tuple(_fp(rng) for _ in range(rng.randint(0, 2))),
                              tuple(_fp(rng) for _ in range(rng.randint(0, 2))), f"k{n}",
                              (("t.py", n, "f"),)))
        elif x < 0.45:
            ops = [CapturedOp(tuple(_fp(rng, born=rng.choice([None, None, len(evs)]))
                                    for _ in range(rng.randint(0, 2))),
                              tuple(_fp(rng) for _ in range(rng.randint(0, 2))), f"c{n}.{k}",
                              (("g.py", k, "cap"),)) for k in range(rng.randint(1, 6))]
            g = rng.choice(graphs) if graphs and rng.random() < 0.2 else len(graphs) + 1
            if g not in graphs:
                graphs.append(g)
            evs.append(GraphCapture(0, g, ops))
        elif x < 0.75 and graphs:
            for _ in range(rng.randint(1, 4)):
                evs.append(GraphReplay(0, rng.choice(graphs), s, (("r.py", n, "loop"),)))
        elif x < 0.85:
            evs.append(EventRecord(0, n, s))
            evs.append(StreamWaitEvent(0, rng.choice(streams), n))
        else:
            evs.append(HostSync(0, "device", None))
    return evs


def _compare(evs):
    merged, per_op = Checker(), Checker()
    merged.merge_min_accesses = 0       # merge every replay that can be merged
    per_op.merge_replays = False
    used = 0
    orig = merged._replay_merged

    def counting(*a):
        nonlocal used
        r = orig(*a)
        used += r
        return r

    merged._replay_merged = counting
    for k, ev in enumerate(evs):
        merged.process(ev)
        per_op.process(ev)
        assert state(merged) == state(per_op), f"state differs after event {k}: {ev!r}"
    assert [f.to_json() for f in merged.findings] == [f.to_json() for f in per_op.findings]
    return used


def test_random_traces_same_state_and_findings():
    used = 0
    for seed in range(300):
        used += _compare(random_trace(seed))
    assert used > 100        # the merged path is taken, not only the fallback


def test_steady_replay_loop_is_merged_and_quotes_the_captured_op():
    a = Footprint(1, ((0, 64),))
    tmp = Footprint(2, ((0, 32),))
    out = Footprint(3, ((0, 64),))
    ops = [CapturedOp((a,), (tmp,), "mm", (("m.py", 1, "capture"),)),
           CapturedOp((tmp,), (out,), "relu", (("m.py", 2, "capture"),))]
    evs = [GraphCapture(0, 1, ops)]
    for i in range(5):
        evs.append(Kernel(0, 1, (), (a,), "fill_", (("m.py", 10, "loop"),)))
        evs.append(GraphReplay(0, 1, 1, (("m.py", 11, "loop"),)))
    # a side stream reads the output without waiting: RC001, quoting the captured relu
    evs.append(Kernel(0, 2, (out,), (), "sum", (("m.py", 20, "read"),)))
    assert _compare(evs) >= 4
    c = Checker()
    c.merge_min_accesses = 0
    (f,) = c.process_all(evs).findings
    assert f.rule == "RC001" and f.previous.op == "relu (replay of graph 1)"


def test_racy_replays_fall_back_to_per_op():
    # a replay racing with an unordered write on another stream takes the per-op path
    a = Footprint(1, ((0, 64),))
    ops = [CapturedOp((a,), (Footprint(2, ((0, 64),)),), "copy", ())]
    evs = [GraphCapture(0, 1, ops), Kernel(0, 2, (), (a,), "w", ()), GraphReplay(0, 1, 1, ())]
    assert _compare(evs) == 0
    assert [f.rule for f in Checker().process_all(evs).findings] == ["RC001"]


def test_merged_only_where_cheaper():
    # ops that each touch their own buffer once: per-op; ops coming back to one buffer: merged
    once = [CapturedOp((Footprint(k, ((0, 64),)),), (Footprint(10 + k, ((0, 64),)),), f"op{k}", ())
            for k in range(1, 4)]
    again = [CapturedOp((Footprint(1, ((0, 64),)),), (Footprint(2, ((0, 64),)),), f"op{k}", ())
             for k in range(4)]
    for ops, merged in ((once, False), (again, True)):
        c = Checker()
        used = []
        orig = c._replay_merged
        c._replay_merged = lambda *a: used.append(orig(*a)) or used[-1]
        c.process_all([GraphCapture(0, 1, ops), GraphReplay(0, 1, 1, ()), GraphReplay(0, 1, 1, ())])
        assert bool(used) is merged and all(used)
