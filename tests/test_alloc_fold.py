"""Allocations of an op's new outputs travel with its Kernel (trace.AllocKernel): the checker
reads one as the Alloc events and the Kernel it stands for, at the same trace positions, and
recorded or saved traces hold the expanded events, so the file format is unchanged."""
from __future__ import annotations

import io
import json

import torch

import racecheck
from racecheck.checker import Checker
from racecheck.trace import Alloc, AllocKernel, Footprint, Kernel, NameTimeline, Trace, expand


def _events():
    a = Footprint(1, ((0, 64),))
    t1 = Footprint(5, ((0, 64),))
    t2 = Footprint(6, ((0, 32),))
    return [NameTimeline(0, 0, "host", True), Alloc(0, 1, 1, 64), Kernel(0, 1, (), (a,), "fill_"),
            AllocKernel(0, 1, (a,), (t1, t2), "split_add", (("m.py", 3, "f"),),
                        ((5, 1, 64, False), (6, 1, 32, False))),
            Kernel(0, 2, (t2,), (), "sum", (("m.py", 4, "f"),))]


def test_checker_reads_alloc_kernel_as_its_expansion():
    evs = _events()
    folded = Checker().process_all(evs)
    plain = Checker().process_all(expand(evs))
    assert len(expand(evs)) == len(evs) + 2
    assert folded.events_processed == plain.events_processed == len(expand(evs))
    assert folded._allocs == plain._allocs and folded._sites == plain._sites
    one = Checker()
    for ev in evs:
        one.process(ev)
    assert one.events_processed == plain.events_processed
    got = [f.to_json() for f in folded.findings]
    assert got == [f.to_json() for f in plain.findings] == [f.to_json() for f in one.findings]
    assert got and got[0]["current"]["seq"] == 6     # the sum, after 2 Alloc positions


def test_saved_trace_is_expanded():
    buf = io.StringIO()
    Trace(_events()).dump(buf)
    lines = [json.loads(x) for x in buf.getvalue().splitlines()[1:]]
    assert [d["kind"] for d in lines] == ["name_timeline", "alloc", "kernel", "alloc", "alloc",
                                          "kernel", "kernel", "end"]
    assert lines[-1]["events"] == 7 and "allocs" not in lines[5]


def test_session_folds_temporaries_and_records_them_expanded():
    seen = []
    with racecheck.session(device="sim", record_trace=True) as rc:
        rec = rc.recorder
        real = rec.emit

        def spy(ev):
            seen.append(type(ev))
            real(ev)
        rec.emit = spy
        a, b = torch.ones(16), torch.ones(16)
        for _ in range(3):
            y = a + b            # a new storage: its Alloc goes with the add's Kernel
            z = y * 2            # noqa: F841
        pos = rec.position       # counts the queued Alloc positions too
        n = len(rc.trace.events)
        assert pos == n
        rec.emit = real
    assert AllocKernel in seen
    kinds = [type(e) for e in rc.trace.events]
    assert AllocKernel not in kinds
    for i, e in enumerate(rc.trace.events):      # each Alloc right before its creating kernel
        if type(e) is Alloc and i + 1 < len(kinds) and kinds[i + 1] is Kernel:
            assert e.block in {fp.storage for fp in rc.trace.events[i + 1].writes}
    offline = Checker().process_all(rc.trace.events)
    assert offline.events_processed == rc.checker.events_processed
    assert [f.to_json() for f in offline.findings] == [f.to_json() for f in rc.findings]
