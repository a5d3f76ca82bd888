"""Happens-before checker: vector clocks, shadow memory, every rule, event semantics.

Traces are built by hand with the trace event classes (no torch). The docs/CASES.md rows a
checker can decide from a trace alone are mirrored here as P01..P27 (graphs:
tests/test_checker_graphs.py).
"""
from __future__ import annotations

import argparse
import json
import re

import pytest

from racecheck.core import clocks, native
from racecheck.core.checker import Checker
from racecheck.core.fastchecker import FastChecker
from racecheck.core.shadow import (StorageShadow, iv_add, iv_intersect, iv_normalize, iv_subtract,
                              iv_union)
from racecheck.core.trace import (Alloc, Copy, EventRecord, Footprint, Free, HostAccess, HostSync,
                             Kernel, NameTensor, NameTimeline, RecordStream, StreamWaitEvent,
                             StreamWaitStream, Trace, TraceFormatError)

H, H2 = 0, 50                 # host threads
D, S, S2 = 1, 2, 3            # default stream, side streams
X, Y, Z, BUF, HB = 10, 11, 12, 13, 14   # storages


def fp(storage, lo=0, hi=32, **kw):
    return Footprint(storage, ((lo, hi),), **kw)


def fpr(storage, ranges, **kw):
    return Footprint(storage, tuple(ranges), **kw)


class TB:
    """Trace builder: streams default/s/s2 and the main host thread are named up front."""

    def __init__(self, sync_after_setup=True):
        self.events = []
        self.line = 100
        self.add(NameTimeline(H, H, "main", True))
        for tid, name in ((D, "default"), (S, "s"), (S2, "s2")):
            self.add(NameTimeline(H, tid, name))
        self.sync_after_setup = sync_after_setup

    def add(self, ev):
        self.events.append(ev)
        return len(self.events) - 1

    def stack(self, fn, file="/eng/model.py"):
        self.line += 1
        return ((file, self.line, fn), ("/eng/loop.py", 7, "step"))

    def tensor(self, sid, nbytes=32, name=None, stream=D, host=False, row_bytes=0, itemsize=4,
               thread=H):
        self.add(Alloc(thread, sid, stream, nbytes, host))
        if name:
            self.add(NameTensor(thread, sid, 0, nbytes, name, row_bytes, itemsize))
        return sid

    def k(self, stream, r=(), w=(), op="k", fn=None, thread=H):
        return self.add(Kernel(thread, stream, tuple(r), tuple(w), op, self.stack(fn or op)))

    def copy(self, stream, src, dst, non_blocking=True, fn="copy", thread=H):
        return self.add(Copy(thread, stream, src, dst, non_blocking, "copy_", self.stack(fn)))

    def record(self, event, stream, thread=H):
        return self.add(EventRecord(thread, event, stream, self.stack("record")))

    def wait(self, stream, event, thread=H):
        return self.add(StreamWaitEvent(thread, stream, event, self.stack("wait")))

    def wait_stream(self, waiter, waitee, thread=H):
        return self.add(StreamWaitStream(thread, waiter, waitee, self.stack("wait_stream")))

    def sync(self, kind="device", target=None, thread=H):
        return self.add(HostSync(thread, kind, target, self.stack("sync")))

    def host(self, r=(), w=(), op="item", fn=None, thread=H):
        return self.add(HostAccess(thread, tuple(r), tuple(w), op, self.stack(fn or op)))

    def free(self, block, thread=H):
        return self.add(Free(thread, block, self.stack("release")))

    def check(self, **kw):
        """The reference Checker on this trace. Where the C engine is built, FastChecker must give
        the same findings, field by field (tests/test_checker_engine.py compares their states)."""
        ref = Checker(**kw).process_all(self.events)
        if native.checker_engine() is not None:
            fast = FastChecker(**kw).process_all(self.events)
            assert [f.to_json() for f in fast.findings] == [f.to_json() for f in ref.findings]
        return ref

    def findings(self, **kw):
        return self.check(**kw).findings


def rules(findings):
    return [(f.rule, f.tensor) for f in findings]


def synced(tb, *tensors):
    for sid, name in tensors:
        tb.tensor(sid, name=name)
        tb.k(D, w=[fp(sid)], op="fill_", fn="init")
    tb.sync()
    return tb


# ---- vector clocks ----------------------------------------------------------------------------

def test_clock_join_and_order():
    a = {1: 3, 2: 1}
    assert clocks.join(a, {2: 5, 3: 1}) is True
    assert a == {1: 3, 2: 5, 3: 1}
    assert clocks.join(a, {1: 2}) is False
    assert clocks.ordered(1, 3, {1: 3}) and not clocks.ordered(1, 4, {1: 3})
    assert not clocks.ordered(7, 1, {1: 9})


def test_interval_helpers():
    assert iv_add([], 0, 4) == [(0, 4)]
    assert iv_add([(0, 4)], 1, 3) == [(0, 4)]
    assert iv_add([(0, 4), (8, 12)], 4, 8) == [(0, 12)]
    assert iv_add([(0, 4), (8, 12)], 20, 24) == [(0, 4), (8, 12), (20, 24)]
    assert iv_add([(8, 12)], 0, 2) == [(0, 2), (8, 12)]
    assert iv_union([(0, 2)], [(2, 4), (6, 8)]) == [(0, 4), (6, 8)]
    assert iv_intersect([(0, 10)], [(2, 4), (8, 12)]) == [(2, 4), (8, 10)]
    assert iv_subtract([(0, 10)], [(2, 4), (8, 12)]) == [(0, 2), (4, 8)]
    assert iv_subtract([(0, 4)], [(0, 4)]) == []
    assert iv_normalize([(8, 9), (0, 4), (3, 6)]) == [(0, 6), (8, 9)]


def test_shadow_segments_split_and_collapse():
    sh = StorageShadow(1)
    assert sh.span(0, 32) == (0, 1)
    sh.states[0] = ["w0", {}]
    assert sh.span(0, 32) == (0, 1)            # the common case: one existing segment
    assert sh.span(8, 16) == (1, 2)            # split in the middle: 3 segments
    assert sh.bounds == [0, 8, 16, 32]
    assert all(s == ["w0", {}] for s in sh.states)
    assert sh.states[0] is not sh.states[1]    # copied on split, never shared
    assert sh.span(0, 32) == (0, 3)
    sh.collapse(0, 3, ["w1", {}])
    assert sh.bounds == [0, 32] and len(sh) == 1
    assert sh.span(40, 48) == (2, 3)           # beyond the end: a gap segment in between
    assert sh.bounds == [0, 32, 40, 48] and sh.states[1] is None
    assert sh.span(-8, 0) == (0, 1)            # before the start
    assert sh.find(35) == 2 and sh.find(100) == -1 and sh.find(-100) == -1


# ---- docs/CASES.md rows -----------------------------------------------------------------------

def test_p01_write_on_side_stream_read_on_default():
    tb = synced(TB(), (X, "x"))
    tb.k(S, r=[fp(X)], w=[fp(X)], op="add_", fn="draft")
    tb.k(D, r=[fp(X)], w=[fp(Y)], op="mul", fn="verify")
    fs = tb.findings()
    assert rules(fs) == [("RC001", "x")]
    f = fs[0]
    assert f.streams == ("default", "s")
    assert f.current.kind == "read" and f.previous.kind == "write"
    assert f.current.op == "mul" and f.current.function == "verify"
    assert f.current.location.startswith("model.py:")
    assert f.current.stack[0].endswith("in verify") and f.current.stack[1] == "loop.py:7 in step"
    assert f.missing_edge == ("s", "default")
    assert "record an event on `s` after `draft`" in f.suggestion
    assert "`default` wait on it before `verify`" in f.suggestion
    assert "default.wait_stream(s)" in f.suggestion
    assert f.current.seq > f.previous.seq >= 0


def test_p02_event_orders():
    tb = synced(TB(), (X, "x"))
    tb.k(S, r=[fp(X)], w=[fp(X)], op="add_")
    tb.record(1, S)
    tb.wait(D, 1)
    tb.k(D, r=[fp(X)], w=[fp(Y)], op="mul")
    assert tb.findings() == []


def test_p03_wait_stream_orders():
    tb = synced(TB(), (X, "x"))
    tb.k(S, r=[fp(X)], w=[fp(X)], op="add_")
    tb.wait_stream(D, S)
    tb.k(D, r=[fp(X)], w=[fp(Y)], op="mul")
    assert tb.findings() == []


def test_p04_stream_synchronize_then_launch_orders():
    tb = synced(TB(), (X, "x"))
    tb.k(S, r=[fp(X)], w=[fp(X)], op="add_")
    tb.sync("stream", S)
    tb.k(S2, r=[fp(X)], w=[fp(Y)], op="mul")
    assert tb.findings() == []


def test_launch_before_host_sync_is_not_ordered():
    tb = synced(TB(), (X, "x"))
    tb.k(S, w=[fp(X)], op="fill_")
    tb.k(S2, r=[fp(X)], w=[fp(Y)], op="mul")     # issued before the sync
    tb.sync("stream", S)
    assert rules(tb.findings()) == [("RC001", "x")]


def test_p05_device_synchronize():
    tb = synced(TB(), (X, "x"))
    tb.k(S, r=[fp(X)], w=[fp(X)], op="add_")
    tb.sync("device", None)
    tb.k(S2, r=[fp(X)], w=[fp(Y)], op="mul")
    assert tb.findings() == []


def test_device_synchronize_by_index_covers_only_that_device():
    tb = TB()
    tb.add(NameTimeline(H, 20, "gpu1", False, 1))
    tb.add(NameTimeline(H, 21, "gpu1_side", False, 1))
    tb.add(NameTimeline(H, 22, "gpu0", False, 0))
    synced(tb, (X, "x"), (Y, "y"))
    tb.k(22, w=[fp(X)], op="fill_")
    tb.k(20, w=[fp(Y)], op="fill_")
    tb.sync("device", 1)
    tb.k(21, r=[fp(X)], w=[fp(Z)], op="read_x")   # gpu0's write: not synchronized
    tb.k(21, r=[fp(Y)], w=[fp(Z)], op="read_y")   # gpu1's write: synchronized
    fs = tb.findings()
    assert rules(fs) == [("RC001", "x")]
    assert fs[0].previous.stream == "gpu0"


def test_p06_event_synchronize():
    tb = synced(TB(), (X, "x"))
    tb.k(S, r=[fp(X)], w=[fp(X)], op="add_")
    tb.record(1, S)
    tb.sync("event", 1)
    tb.k(D, r=[fp(X)], w=[fp(Y)], op="mul")
    assert tb.findings() == []


def test_p07_reads_only():
    tb = synced(TB(), (X, "x"))
    tb.k(S, r=[fp(X)], w=[fp(Y)], op="add")
    tb.k(D, r=[fp(X)], w=[fp(Z)], op="add")
    assert tb.findings() == []


def test_p08_write_after_read():
    tb = synced(TB(), (X, "x"))
    tb.k(D, r=[fp(X)], w=[fp(Y)], op="add", fn="consume")
    tb.k(S, w=[fp(X)], op="zero_", fn="reset")
    fs = tb.findings()
    assert rules(fs) == [("RC002", "x")]
    assert fs[0].current.kind == "write" and fs[0].previous.kind == "read"
    assert fs[0].streams == ("s", "default")


def test_p09_write_after_write():
    tb = synced(TB(), (X, "x"))
    tb.k(D, w=[fp(X)], op="fill_")
    tb.k(S, w=[fp(X)], op="fill_")
    assert rules(tb.findings()) == [("RC003", "x")]


def test_inplace_op_reports_read_only_once():
    tb = synced(TB(), (X, "x"))
    tb.k(S, w=[fp(X)], op="fill_")
    tb.k(D, r=[fp(X)], w=[fp(X)], op="add_")     # reads then writes the same bytes
    assert rules(tb.findings()) == [("RC001", "x")]


def test_p10_interleaved_slices_do_not_conflict():
    tb = synced(TB(), (X, "x"))
    even = [(i, i + 4) for i in range(0, 32, 8)]
    odd = [(i + 4, i + 8) for i in range(0, 32, 8)]
    tb.k(S, w=[fpr(X, even)], op="fill_")
    tb.k(S2, w=[fpr(X, odd)], op="fill_")
    c = tb.check()
    assert c.findings == []
    assert len(c._shadow[X].states) == 8        # split exactly at the element boundaries


def test_p11_overlapping_slices_conflict_with_exact_bytes():
    tb = TB()
    tb.tensor(X, 32, "x", itemsize=4)
    tb.k(D, w=[fp(X)], op="fill_")
    tb.sync()
    tb.k(S, w=[fp(X, 0, 16)], op="fill_")
    tb.k(D, r=[fp(X, 8, 24)], w=[fp(Y)], op="sum")
    fs = tb.findings()
    assert rules(fs) == [("RC001", "x")]
    assert "elements 2..3 of `x`" in fs[0].detail and "bytes 8..15" in fs[0].detail


def test_partial_overlap_splits_segments_correctly():
    tb = synced(TB(), (X, "x"))
    tb.k(S, w=[fp(X, 8, 16)], op="fill_")
    c = tb.check()
    assert c._shadow[X].bounds == [0, 8, 16, 32]
    # the other two segments keep the synchronized initial write: reading them is clean
    tb.k(S2, r=[fp(X, 0, 8)], w=[fp(Y)], op="a")
    tb.k(S2, r=[fp(X, 16, 32)], w=[fp(Y)], op="b")
    assert tb.findings() == []
    tb.k(S2, r=[fp(X, 12, 20)], w=[fp(Y)], op="c")
    fs = tb.findings()
    assert rules(fs) == [("RC001", "x")] and "bytes 12..15" in fs[0].detail
    # a whole-tensor write collapses everything back into one segment
    tb.sync()
    tb.k(D, w=[fp(X)], op="zero_")
    assert tb.check()._shadow[X].bounds == [0, 32]


def test_p12_columns_of_a_matrix_do_not_conflict():
    tb = synced(TB(), (X, "m"))                 # 4x4 float32
    col0 = [(r * 16, r * 16 + 4) for r in range(4)]
    col1 = [(r * 16 + 4, r * 16 + 8) for r in range(4)]
    tb.tensor(X, 64, "m", row_bytes=16)
    tb.k(D, w=[fp(X, 0, 64)], op="fill_")
    tb.sync()
    tb.k(S, w=[fpr(X, col0)], op="fill_")
    tb.k(D, r=[fpr(X, col1)], w=[fp(Y)], op="sum")
    assert tb.findings() == []


def test_p13_p14_index_rows():
    def run(read_rows):
        tb = TB()
        tb.tensor(BUF, 8 * 16, "buf", row_bytes=16)
        tb.k(D, w=[fp(BUF, 0, 128)], op="zero_")
        tb.sync()
        tb.k(S, w=[fpr(BUF, [(0, 32)])], op="index_put_")
        tb.k(D, r=[fpr(BUF, [(r * 16, r * 16 + 16) for r in read_rows])], w=[fp(Y)], op="index")
        return tb.findings()
    assert run([5, 6]) == []
    fs = run([1, 7])
    assert rules(fs) == [("RC001", "buf")]
    assert "rows 1 of `buf`" in fs[0].detail


def test_p15_host_read_after_non_blocking_d2h():
    tb = synced(TB(), (X, "x"))
    tb.tensor(HB, 32, "h", host=True)
    tb.copy(D, fp(X), fp(HB, host=True), non_blocking=True, fn="copy_to_cpu")
    tb.host(r=[fp(HB, 0, 4, host=True)], op="item", fn="process_result")
    fs = tb.findings()
    assert rules(fs) == [("RC004", "h")]
    f = fs[0]
    assert f.current.stream == "main" and f.previous.stream == "default"
    assert f.current.kind == "read" and f.previous.kind == "write"
    assert "synchronize on the copy" in f.suggestion and "`default`" in f.suggestion
    assert "before reading `h` on the host" in f.suggestion


def test_p16_event_sync_before_host_read():
    tb = synced(TB(), (X, "x"))
    tb.tensor(HB, 32, "h", host=True)
    tb.copy(D, fp(X), fp(HB, host=True), non_blocking=True)
    tb.record(1, D)
    tb.sync("event", 1)
    tb.host(r=[fp(HB, 0, 4, host=True)])
    assert tb.findings() == []


def test_blocking_copy_blocks_the_host():
    tb = synced(TB(), (X, "x"))
    tb.tensor(HB, 32, "h", host=True)
    tb.copy(D, fp(X), fp(HB, host=True), non_blocking=False)
    tb.host(r=[fp(HB, host=True)])
    assert tb.findings() == []


def test_p17_host_overwrites_h2d_source():
    tb = synced(TB(), (X, "x"))
    tb.tensor(HB, 32, "h", host=True)
    tb.host(w=[fp(HB, host=True)], op="fill_")
    tb.copy(D, fp(HB, host=True), fp(X), non_blocking=True)
    tb.host(w=[fp(HB, host=True)], op="fill_", fn="refill")
    fs = tb.findings()
    assert rules(fs) == [("RC004", "h")]
    assert fs[0].current.kind == "write" and fs[0].previous.kind == "read"
    assert "before overwriting `h` on the host" in fs[0].suggestion


def test_device_op_after_host_write_is_ordered_by_launch():
    tb = TB()
    tb.tensor(HB, 32, "h", host=True)
    tb.host(w=[fp(HB, host=True)], op="fill_")
    tb.copy(S, fp(HB, host=True), fp(X), non_blocking=True)
    assert tb.findings() == []


def test_device_copy_of_host_memory_another_thread_wrote_rc004():
    tb = TB()
    tb.tensor(HB, 32, "h", host=True)
    tb.tensor(X, 32, "x")
    tb.host(w=[fp(HB, host=True)], op="fill_", fn="producer", thread=H2)   # worker thread
    tb.copy(S, fp(HB, host=True), fp(X), non_blocking=True, fn="upload")   # main, no join
    fs = tb.findings()
    assert rules(fs) == [("RC004", "h")]
    assert fs[0].current.stream == "s" and fs[0].previous.stream == "host 50"
    assert "order the host write of `h`" in fs[0].suggestion


def test_host_vs_host_is_never_reported():
    tb = TB()
    tb.tensor(HB, 32, "h", host=True)
    tb.host(w=[fp(HB, host=True)], op="fill_")
    tb.host(r=[fp(HB, host=True)], op="read", thread=H2)
    tb.host(w=[fp(HB, host=True)], op="fill_", thread=H2)
    assert tb.findings() == []


def test_p18_wait_before_record_is_a_noop_and_rc008_names_it():
    tb = synced(TB(), (X, "x"))
    wait_seq = tb.wait(D, 7)                    # never recorded yet: a no-op
    tb.k(S, r=[fp(X)], w=[fp(X)], op="add_", fn="draft")
    rec_seq = tb.record(7, S)
    tb.k(D, r=[fp(X)], w=[fp(Y)], op="mul", fn="verify")
    fs = tb.findings()
    assert rules(fs) == [("RC001", "x"), ("RC008", "x")]
    f = fs[1]
    assert f.current.op == "wait_event" and f.current.kind == "wait"
    assert f.current.stream == "default" and f.current.seq == wait_seq
    assert f.previous.op == "record" and f.previous.kind == "record"
    assert f.previous.stream == "s" and f.previous.seq == rec_seq
    assert "before waiting on it" in f.suggestion and "e.record(s)" in f.suggestion
    assert f.missing_edge == ("s", "default")
    # the no-op wait shows in the picture
    assert any(c.kind == "wait" and "no-op" in c.label for c in f.context)


def test_noop_wait_not_relied_on_gives_no_rc008():
    tb = synced(TB(), (X, "x"))
    tb.wait(D, 7)                                # no-op ...
    tb.record(7, S2)                             # ... but the event belongs to another stream
    tb.k(S, w=[fp(X)], op="fill_")
    tb.k(D, r=[fp(X)], w=[fp(Y)], op="mul")
    assert rules(tb.findings()) == [("RC001", "x")]
    tb2 = synced(TB(), (X, "x"))
    tb2.wait(D, 7)
    tb2.record(7, S)                             # recorded before the write: does not cover it
    tb2.k(S, w=[fp(X)], op="fill_")
    tb2.k(D, r=[fp(X)], w=[fp(Y)], op="mul")
    assert rules(tb2.findings()) == [("RC001", "x")]


def test_rc008_wait_on_an_event_never_recorded():
    tb = synced(TB(), (X, "x"))
    tb.k(S, w=[fp(X)], op="fill_", fn="draft")
    wait_seq = tb.wait(D, 9)                     # a fresh Event(): never recorded at all
    tb.k(D, r=[fp(X)], w=[fp(Y)], op="mul", fn="verify")
    fs = tb.findings()
    assert rules(fs) == [("RC001", "x"), ("RC008", "x")]
    f = fs[1]
    assert f.current.op == "wait_event" and f.current.seq == wait_seq
    assert f.previous.op == "fill_" and f.previous.stream == "s" and f.previous.kind == "write"
    assert "event #9, which was never recorded" in f.detail and "RC001" in f.detail
    assert "record event #9 on `s` after `draft` before waiting on it" in f.suggestion
    assert f.missing_edge == ("s", "default")


def test_rc008_names_the_event_recorded_instead():
    tb = synced(TB(), (X, "x"))
    tb.k(S, w=[fp(X)], op="fill_", fn="draft")
    tb.record(4, S)                              # the producer swapped in a new event ...
    tb.wait(D, 9)                                # ... the consumer kept the stale handle
    tb.k(D, r=[fp(X)], w=[fp(Y)], op="mul")
    fs = tb.findings()
    assert rules(fs) == [("RC001", "x"), ("RC008", "x")]
    assert "event #4 was recorded on `s` instead" in fs[1].detail
    assert "wait on the event that is recorded (#4" in fs[1].suggestion


def test_rc008_never_recorded_needs_the_wait_after_the_access_and_a_race():
    tb = synced(TB(), (X, "x"))
    tb.wait(D, 9)                                # before the write: could not have ordered it
    tb.k(S, w=[fp(X)], op="fill_")
    tb.k(D, r=[fp(X)], w=[fp(Y)], op="mul")
    assert rules(tb.findings()) == [("RC001", "x")]
    tb2 = synced(TB(), (X, "x"))
    tb2.k(S, w=[fp(X)], op="fill_")
    tb2.wait(D, 9)                               # a no-op wait, but the pair is ordered anyway
    tb2.wait_stream(D, S)
    tb2.k(D, r=[fp(X)], w=[fp(Y)], op="mul")
    assert tb2.findings() == []
    tb3 = synced(TB(), (X, "x"))
    tb3.k(S, w=[fp(X)], op="fill_")
    tb3.wait(S2, 9)                              # the no-op wait is on another stream
    tb3.k(D, r=[fp(X)], w=[fp(Y)], op="mul")
    assert rules(tb3.findings()) == [("RC001", "x")]


def test_host_event_sync_before_record_rc008():
    tb = synced(TB(), (X, "x"))
    tb.tensor(HB, 32, "h", host=True)
    tb.sync("event", 3)                          # no-op host wait
    tb.copy(S, fp(X), fp(HB, host=True), non_blocking=True)
    tb.record(3, S)
    tb.host(r=[fp(HB, host=True)])
    fs = tb.findings()
    assert rules(fs) == [("RC004", "h"), ("RC008", "h")]
    assert fs[1].current.kind == "wait" and fs[1].current.stream == "main"


def test_re_record_moves_the_event():
    # a wait binds to the latest record at call time
    tb = synced(TB(), (X, "x"), (Y, "y"))
    tb.k(S, w=[fp(X)], op="fill_x")
    tb.record(1, S)
    tb.k(S, w=[fp(Y)], op="fill_y")
    tb.record(1, S)                              # re-record: now covers fill_y too
    tb.wait(D, 1)
    tb.k(D, r=[fp(X), fp(Y)], w=[fp(Z)], op="use")
    assert tb.findings() == []

    tb = synced(TB(), (X, "x"), (Y, "y"))
    tb.k(S, w=[fp(X)], op="fill_x")
    tb.record(1, S)
    tb.wait(D, 1)                                # binds to the first record
    tb.k(S, w=[fp(Y)], op="fill_y")
    tb.record(1, S)                              # too late for the wait above
    tb.k(D, r=[fp(X), fp(Y)], w=[fp(Z)], op="use")
    assert rules(tb.findings()) == [("RC001", "y")]


def test_wait_context_edge_points_at_the_record():
    tb = synced(TB(), (X, "x"), (Y, "y"))
    tb.k(S, w=[fp(Y)], op="fill_y")
    rec = tb.record(1, S)
    tb.wait(D, 1)
    tb.k(S2, w=[fp(X)], op="fill_x")
    tb.wait_stream(D, S)
    tb.k(D, r=[fp(X)], w=[fp(Z)], op="use")
    fs = tb.findings()
    assert rules(fs) == [("RC001", "x")]
    waits = [c for c in fs[0].context if c.kind == "wait"]
    # the context shows default's waits (an edge from s) and s2's kernel
    assert any(c.edge == rec and c.peer == "s" for c in waits)
    assert [c.seq for c in fs[0].context] == sorted(c.seq for c in fs[0].context)
    assert {c.timeline for c in fs[0].context} <= {"default", "s2"}
    assert fs[0].context[-1].label == "use"


def test_context_is_capped():
    tb = synced(TB(), (X, "x"))
    tb.k(S, w=[fp(X)], op="fill_")
    for _ in range(100):
        tb.k(D, w=[fp(Y)], op="busy")
        tb.k(S, w=[fp(Z)], op="busy")
    tb.k(D, r=[fp(X)], w=[fp(Y)], op="use")
    f = tb.findings()[0]
    assert 0 < len(f.context) <= 40
    assert f.context[-1].label == "use"


def test_p19_p20_free_without_and_with_record_stream():
    def run(record_stream, host_sync=False, wait=False):
        tb = TB()
        tb.tensor(X, 32, "t", stream=D)
        tb.k(D, w=[fp(X)], op="ones")
        tb.sync()
        tb.k(S, r=[fp(X)], w=[fp(Y)], op="mul", fn="side_work")
        if record_stream:
            tb.add(RecordStream(H, X, S, ()))
        if host_sync:
            tb.sync("stream", S)
        if wait:
            tb.record(4, S)
            tb.wait(D, 4)
        tb.free(X)
        return tb.findings()
    fs = run(False)
    assert rules(fs) == [("RC005", "t")]
    f = fs[0]
    assert f.current.op == "free" and f.current.kind == "free" and f.current.stream == "default"
    assert f.current.function == "release"
    assert f.previous.stream == "s" and f.previous.op == "mul" and f.previous.kind == "read"
    assert "`t.record_stream(s)`" in f.suggestion and "`s`'s work completes" in f.suggestion
    assert f.missing_edge == ("s", "default")
    assert run(True) == []
    assert run(False, host_sync=True) == []
    assert run(False, wait=True) == []         # the allocation stream waited: ordered


def _free_then(after):
    """t allocated on D, read on S, freed unordered; then `after(tb)`; findings."""
    tb = TB()
    tb.tensor(X, 32, "t", stream=D)
    tb.k(D, w=[fp(X)], op="ones")
    tb.sync()
    tb.k(S, r=[fp(X)], w=[fp(Y)], op="mul", fn="side_work")
    tb.free(X)
    after(tb)
    return tb.findings()


def test_rc005_reported_when_the_pool_stream_works_before_waiting():
    fs = _free_then(lambda tb: (tb.k(D, w=[fp(Z)], op="reuse", fn="next_step"),
                                tb.wait_stream(D, S)))
    assert rules(fs) == [("RC005", "t")]
    assert "`default` then issued `reuse` at model.py" in fs[0].detail
    assert fs[0].previous.op == "mul" and fs[0].current.kind == "free"


def test_rc005_closes_when_the_pool_stream_waits_before_working():
    assert _free_then(lambda tb: (tb.wait_stream(D, S), tb.k(D, w=[fp(Z)], op="reuse"))) == []
    assert _free_then(lambda tb: (tb.record(7, S), tb.wait(D, 7), tb.k(D, w=[fp(Z)]))) == []
    # a host sync with the reading stream: the next launch on the pool's stream joins it
    assert _free_then(lambda tb: (tb.sync("stream", S), tb.k(D, w=[fp(Z)]))) == []
    # work on other streams does not reuse the default stream's pool
    assert _free_then(lambda tb: (tb.k(S2, w=[fp(Z)]), tb.wait_stream(D, S))) == []


def test_rc005_open_at_the_end_of_the_trace():
    fs = _free_then(lambda tb: None)
    assert rules(fs) == [("RC005", "t")]
    assert "the trace ends with `default` still not ordered after it" in fs[0].detail
    # ordered by the end, though no work followed: closed
    assert _free_then(lambda tb: tb.wait_stream(D, S)) == []
    assert _free_then(lambda tb: tb.sync()) == []


def test_rc005_open_hazard_is_not_kept_once_settled():
    tb = TB()
    tb.tensor(X, 32, "t", stream=D)
    tb.k(D, w=[fp(X)], op="ones")
    tb.sync()
    tb.k(S, r=[fp(X)], w=[fp(Y)], op="mul")
    tb.free(X)
    c = tb.check()
    assert rules(c.findings) == [("RC005", "t")]       # open: reported as of now
    tb2 = TB()
    tb2.events = list(tb.events)
    tb2.wait_stream(D, S)
    tb2.k(D, w=[fp(Z)], op="later")
    assert tb2.findings() == []                          # the same trace, caught up later


def test_plan_stream_freeing_temporaries_then_waiting_is_clean():
    tb = TB()
    for i in range(3):
        tb.tensor(100 + i, 32, f"tmp{i}", stream=S)
        tb.k(S, w=[fp(100 + i)], op="plan")              # planned on s (its pool)
        tb.wait_stream(D, S)
        tb.k(D, r=[fp(100 + i)], w=[fp(Y)], op="forward")
        tb.free(100 + i)                                 # dropped while forward may read it
        tb.wait_stream(S, D)                             # every later use starts with the join
    assert tb.findings() == []


def test_rc005_once_per_stream_and_state_dropped():
    tb = TB()
    tb.tensor(X, 64, "t")
    tb.k(D, w=[fp(X, 0, 64)], op="ones")
    tb.sync()
    tb.k(S, r=[fp(X, 0, 32)], w=[fp(Y)], op="a")
    tb.k(S, r=[fp(X, 32, 64)], w=[fp(Y)], op="b")
    tb.wait_stream(S2, S)
    tb.k(S2, w=[fp(X, 0, 8)], op="c")
    tb.free(X)
    # the same storage id allocated again: no history inherited
    tb.tensor(X, 64, "t2", stream=S)
    tb.k(S, r=[fp(X, 0, 64)], w=[fp(Y)], op="d")
    c = tb.check()
    fs = c.findings
    assert [(f.rule, f.previous.stream) for f in fs] == [("RC005", "s"), ("RC005", "s2")]
    assert fs[0].previous.op == "b"             # the latest unordered access of that stream
    assert c._names[X][0][2] == "t2"


def test_free_on_host_memory_and_unknown_alloc_are_not_rc005():
    tb = TB()
    tb.tensor(HB, 32, "h", host=True)
    tb.copy(S, fp(HB, host=True), fp(X), non_blocking=True)
    tb.free(HB)
    tb.k(S, w=[fp(Y)], op="w")
    tb.free(Y)                                   # never allocated in the trace
    assert tb.findings() == []


def test_p26_two_host_threads_own_streams_own_tensors():
    tb = synced(TB(), (X, "x"), (Y, "y"))
    tb.k(S, r=[fp(X)], w=[fp(X)], op="add_", thread=H)
    tb.k(S2, r=[fp(Y)], w=[fp(Y)], op="add_", thread=H2)
    tb.k(S, r=[fp(X)], w=[fp(Z)], op="mul", thread=H)
    assert tb.findings() == []


def test_p27_two_host_threads_race():
    tb = synced(TB(), (X, "x"))
    tb.add(NameTimeline(H, H2, "worker", True))
    tb.k(S, w=[fp(X)], op="fill_", thread=H)
    tb.k(S2, r=[fp(X)], w=[fp(Y)], op="mul", thread=H2)
    fs = tb.findings()
    assert rules(fs) == [("RC001", "x")]
    assert fs[0].streams == ("s2", "s")


def test_new_host_thread_starts_from_main_clock():
    tb = TB()
    tb.tensor(X, 32, "x")
    tb.k(S, w=[fp(X)], op="fill_")
    tb.sync()                                    # main learns s's write ...
    tb.k(S2, r=[fp(X)], w=[fp(Y)], op="mul", thread=H2)   # ... and the new thread inherits it
    assert tb.findings() == []


def test_names_most_specific_and_unnamed():
    tb = TB()
    tb.tensor(BUF, 64, "pool")
    tb.add(NameTensor(H, BUF, 16, 32, "seq_lens", 0, 4))
    tb.k(D, w=[fp(BUF, 0, 64)], op="zero_")
    tb.sync()
    tb.k(S, w=[fp(BUF, 16, 24)], op="fill_")
    tb.k(D, r=[fp(BUF, 16, 32)], w=[fp(Y)], op="use")
    tb.k(S, w=[fp(Z, 0, 8)], op="fill_")
    tb.k(D, r=[fp(Z, 0, 8)], w=[fp(Y)], op="use2")
    fs = tb.findings()
    assert rules(fs) == [("RC001", "seq_lens"), ("RC001", "unnamed tensor (bytes 0..7)")]
    assert "elements 0..1 of `seq_lens`" in fs[0].detail


def test_approx_footprint_is_said():
    tb = synced(TB(), (X, "x"))
    tb.k(S, w=[fp(X, approx="strided view")], op="fill_")
    tb.k(D, r=[fp(X)], w=[fp(Y)], op="use")
    f = tb.findings()[0]
    assert f.approx == "strided view" and "approximate" in f.detail


def test_dedup_in_a_loop():
    tb = synced(TB(), (X, "x"))
    stack_w = (("/eng/model.py", 5, "draft"),)
    stack_r = (("/eng/model.py", 9, "verify"),)
    for _ in range(20):
        tb.add(Kernel(H, S, (), (fp(X),), "fill_", stack_w))
        tb.add(Kernel(H, D, (fp(X),), (fp(Y),), "use", stack_r))
        tb.add(Kernel(H, D, (), (fp(X),), "clobber", (("/eng/model.py", 12, "post"),)))
    fs = tb.findings()
    assert [f.rule for f in fs] == ["RC001", "RC003", "RC003"]
    assert len({f.signature for f in fs}) == len(fs)


def test_same_timeline_is_always_ordered():
    tb = TB()
    tb.tensor(X, 32, "x")
    for _ in range(5):
        tb.k(S, r=[fp(X)], w=[fp(X)], op="add_")
    assert tb.findings() == []


def test_state_stays_flat_with_run_length():
    def run(n):
        tb = synced(TB(), (X, "x"), (Y, "y"))
        tb.tensor(HB, 32, "h", host=True)
        st_a = (("/eng/a.py", 1, "a"),)
        st_b = (("/eng/b.py", 2, "b"),)
        for i in range(n):
            tb.add(Kernel(H, S, (fp(X, 0, 16),), (fp(Y),), "a", st_a))
            tb.add(EventRecord(H, 1, S, st_a))
            tb.add(StreamWaitEvent(H, D, 1, st_b))
            tb.add(Kernel(H, D, (fp(Y, 8, 24),), (fp(X),), "b", st_b))
            tb.add(Copy(H, D, fp(X), fp(HB, host=True), True, "copy_", st_b))
            tb.add(HostAccess(H, (fp(HB, host=True),), (), "item", st_b))   # racy, deduped
            tb.add(StreamWaitStream(H, S, D, st_a))
        c = tb.check()
        st = c.stats()
        return st["segments"], st["event_records"], st["findings"], len(c._shadow[X].seen or ())
    assert run(50) == run(2000)


def test_unknown_event_types_are_skipped():
    class Custom:
        thread = 0
    c = Checker()
    c.process_all([Custom(), Kernel(H, S, (), (fp(X),), "k")])
    c.process(Custom())
    assert c.events_processed == 3 and c.findings == []


def test_timeline_names_default():
    c = Checker()
    c.process_all([Kernel(4, 9, (), (fp(X),), "k")])
    assert c.timeline_name(4) == "host 4" and c.timeline_name(9) == "stream 9"
    c.process(NameTimeline(4, 9, "plan_stream"))
    assert c.timeline_name(9) == "plan_stream"


# ---- determinism and traces -------------------------------------------------------------------

def racy_trace():
    tb = synced(TB(), (X, "x"), (Y, "y"))
    tb.tensor(HB, 32, "h", host=True)
    tb.wait(D, 9)
    for i in range(3):
        tb.k(S, w=[fp(X, 0, 16)], op="fill_")
        tb.record(9, S)
        tb.k(S2, r=[fp(X)], w=[fp(Y)], op="mul")
        tb.k(D, r=[fp(Y, 8, 24)], w=[fp(X, 8, 16)], op="add")
        tb.copy(D, fp(X), fp(HB, host=True))
        tb.host(r=[fp(HB, host=True)])
    tb.free(Y)
    return tb.events


def test_deterministic_and_independent_of_ids():
    ev = racy_trace()
    a = [f.to_json() for f in Checker().process_all(ev).findings]
    b = [f.to_json() for f in Checker().process_all(ev).findings]
    assert a == b and len(a) >= 5
    # the same program with every id renumbered gives the same findings
    remap = {H: 70, D: 80, S: 81, S2: 82, X: 90, Y: 91, Z: 92, HB: 93, BUF: 94, 9: 95}
    moved = []
    for e in ev:
        d = e.to_json()
        for key in ("thread", "stream", "timeline", "block", "event", "waiter", "waitee",
                    "storage"):
            if isinstance(d.get(key), int):
                d[key] = remap.get(d[key], d[key])
        for key in ("reads", "writes"):
            for f in d.get(key, ()):
                f["storage"] = remap[f["storage"]]
        for key in ("src", "dst"):
            if key in d:
                d[key]["storage"] = remap[d[key]["storage"]]
        moved.append(d)
    from racecheck.core.trace import event_from_json
    c = [f.to_json() for f in Checker().process_all(event_from_json(d) for d in moved).findings]
    back = {v: k for k, v in remap.items()}

    def norm(text):
        return re.sub(r"#(\d+)", lambda m: f"#{back.get(int(m.group(1)), m.group(1))}", text)
    assert [(x["rule"], x["tensor"], norm(x["detail"]), norm(x["suggestion"]), x["current"],
             x["previous"]) for x in c] == \
        [(x["rule"], x["tensor"], x["detail"], x["suggestion"], x["current"], x["previous"])
         for x in a]
    assert [[dict(e, label=norm(e["label"])) for e in x["context"]] for x in c] == \
        [list(x["context"]) for x in a]


def test_jsonl_round_trip_gives_same_findings(tmp_path):
    ev = racy_trace()
    p = tmp_path / "t.jsonl"
    Trace(ev).save(p)
    loaded = Trace.load(p)
    a = [f.to_json() for f in Checker().process_all(ev).findings]
    b = [f.to_json() for f in Checker().process_all(loaded).findings]
    assert a == b and a


def test_online_equals_offline():
    ev = racy_trace()
    c = Checker()
    for e in ev:
        c.process(e)
    assert [f.to_json() for f in c.findings] == \
        [f.to_json() for f in Checker().process_all(ev).findings]


def test_bad_trace_json_raises_trace_format_error(tmp_path):
    p = tmp_path / "bad.jsonl"
    p.write_text('{"format": "racecheck-trace", "version": 1}\n{"kind": "kernel", oops\n')
    with pytest.raises(TraceFormatError):
        Checker().process_all(Trace.iter_file(p))
    p.write_text('{"format": "racecheck-trace", "version": 1}\n{"kind": "kernel", "thread": 0}\n')
    with pytest.raises(TraceFormatError):
        Trace.load(p)
    p.write_text("not json\n")
    with pytest.raises(TraceFormatError):
        Trace.load(p)


# ---- the offline command ----------------------------------------------------------------------

def _args(*argv):
    from racecheck.cli.commands import check_cmd
    p = argparse.ArgumentParser()
    check_cmd.add_arguments(p)
    return check_cmd, p.parse_args(list(argv))


def test_check_cmd_findings_and_clean(tmp_path, capsys):
    racy = tmp_path / "racy.jsonl"
    Trace(racy_trace()).save(racy)
    mod, args = _args(str(racy))
    assert args.report == []
    assert mod.main(args) == 1
    out = capsys.readouterr().out
    assert "RC001" in out
    clean = tmp_path / "clean.jsonl"
    tb = synced(TB(), (X, "x"))
    Trace(tb.events).save(clean)
    mod, args = _args(str(clean), "--report", "json=out.json", "--report", "sarif=o.sarif")
    assert args.report == ["json=out.json", "sarif=o.sarif"]
    args.report = []
    assert mod.main(args) == 0


def test_check_cmd_bad_input_is_usage_error(tmp_path):
    from racecheck.core.errors import UsageError
    mod, args = _args(str(tmp_path / "missing.jsonl"))
    with pytest.raises(UsageError, match="not found"):
        mod.main(args)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"format": "racecheck-trace", "version": 1}\n{"kind": "warp"}\n')
    mod, args = _args(str(bad))
    with pytest.raises(UsageError) as ei:
        mod.main(args)
    assert "\n" not in str(ei.value) and "bad.jsonl:2" in str(ei.value)
    bad.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(UsageError):
        mod.main(args)


def test_findings_json_round_trip():
    from racecheck.core.findings import Finding
    for f in Checker().process_all(racy_trace()).findings:
        d = json.loads(json.dumps(f.to_json()))
        assert Finding.from_json(d) == f


def test_unnamed_tensor_is_described_by_its_first_op_stably():
    """Fingerprints of unnamed tensors must not depend on storage ids (baselines key on them):
    they are named by what holds them in the program, else by their first op."""
    def run():
        with racecheck.session() as rc:
            dm = rc.device_module
            s = dm.Stream()
            x = torch.zeros(8)
            dm.synchronize()
            with dm.stream(s):
                x.add_(1)
            x * 2
        return rc.findings
    import torch
    import racecheck
    torch.zeros(100)  # shift storage numbering between the two runs
    a = run()
    b = run()
    assert [f.tensor for f in a] == [f.tensor for f in b]
    assert a[0].tensor == "x"             # the variable holding it (no racecheck.name needed)
    assert a[0].fingerprint() == b[0].fingerprint()
