"""Footprint arithmetic: views, strides, transposes, index sets."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import racecheck
from racecheck.instrumentation.footprints import positions_to_ranges, strided_ranges
from racecheck.instrumentation.indexops import index_footprint, touched_positions

from helpers import pairs


def ranges_of(t):
    with racecheck.session() as rc:
        return rc.footprints.of(t).ranges


def elements(ranges, itemsize=4):
    out = set()
    for lo, hi in ranges:
        out.update(range(lo // itemsize, hi // itemsize))
    return out


def brute(t):
    """Storage elements of a view, by enumeration."""
    pos = set()
    for idx in torch.cartesian_prod(*[torch.arange(s) for s in t.shape]).reshape(-1, t.dim()).tolist() if t.dim() else [[]]:
        pos.add(t.storage_offset() + sum(i * s for i, s in zip(idx, t.stride())))
    return pos


def test_contiguous_is_one_interval():
    x = torch.zeros(16)
    assert ranges_of(x) == ((0, 64),)
    assert ranges_of(x[4:8]) == ((16, 32),)


def test_interleaved_views_are_disjoint():
    x = torch.zeros(16)
    a, b = elements(ranges_of(x[0::2])), elements(ranges_of(x[1::2]))
    assert a == set(range(0, 16, 2)) and b == set(range(1, 16, 2)) and not a & b


def test_transposed_column_is_exact():
    m = torch.zeros(4, 4)
    col0 = elements(ranges_of(m.t()[0]))
    assert col0 == {0, 4, 8, 12}  # column 0 of m
    assert elements(ranges_of(m[:, 1])) == {1, 5, 9, 13}


def test_broadcast_view_covers_each_byte_once():
    x = torch.zeros(4)
    assert ranges_of(x.expand(3, 4)) == ((0, 16),)


def test_huge_strided_view_is_covered_and_says_so():
    x = torch.zeros(20000)
    with racecheck.session() as rc:
        fp = rc.footprints.of(x[::2])
    assert fp.ranges == ((0, 4 * 19999),) and "bounding" in fp.approx


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_strided_ranges_match_enumeration(data):
    base = torch.zeros(6, 5, 4)
    dims = data.draw(st.permutations([0, 1, 2]))
    v = base.permute(*dims)
    sl = []
    for d in range(3):
        n = v.shape[d]
        start = data.draw(st.integers(0, n - 1))
        stop = data.draw(st.integers(start + 1, n))
        step = data.draw(st.integers(1, 3))
        sl.append(slice(start, stop, step))
    v = v[tuple(sl)]
    ranges, approx = strided_ranges(v.storage_offset(), v.shape, v.stride(), 4)
    assert approx is None
    assert elements(ranges) == brute(v)


def test_positions_to_ranges_merges_runs():
    assert positions_to_ranges(torch.tensor([5, 1, 2, 3, 9]), 4) == ((4, 16), (20, 24), (36, 40))


@settings(max_examples=100, deadline=None)
@given(rows=st.lists(st.integers(0, 7), min_size=1, max_size=6), transpose=st.booleans())
def test_fast_index_path_matches_general_path(rows, transpose):
    buf = torch.zeros(8, 8)
    view = buf.t() if transpose else buf
    idx = torch.tensor(rows)
    with racecheck.session() as rc:
        fast = index_footprint(rc.footprints, "index_select", view, (view, 0, idx))
        general = positions_to_ranges(touched_positions("index_select", view, (view, 0, idx)), 4)
        adv = index_footprint(rc.footprints, "index", view, (view, [idx]))
    assert fast.ranges == general == adv.ranges


def test_index_put_rows_and_bool_mask():
    buf = torch.zeros(8, 4)
    with racecheck.session() as rc:
        fp = index_footprint(rc.footprints, "index_put_", buf, (buf, [torch.tensor([0, 1])], None))
        mask = torch.zeros(8, dtype=torch.bool)
        mask[6] = True
        fpm = index_footprint(rc.footprints, "index", buf, (buf, [mask]))
        g = index_footprint(rc.footprints, "gather", buf, (buf, 1, torch.tensor([[0], [3]])))
    assert fp.ranges == ((0, 32),)
    assert fpm.ranges == ((96, 112),)
    assert elements(g.ranges) == {0, 7}


def test_bad_index_falls_back_to_whole_tensor():
    buf = torch.zeros(8, 4)
    with racecheck.session() as rc:
        fp = index_footprint(rc.footprints, "index_select", buf, (buf, 0, torch.tensor([99])))
    assert fp.ranges == ((0, 128),) and fp.approx


@pytest.mark.parametrize("op", ["index_copy_", "index_add_", "index_fill_"])
def test_inplace_index_ops_write_only_rows(op):
    with racecheck.session(record_trace=True) as rc:
        dm = rc.device_module
        s = dm.Stream()
        buf = racecheck.name(torch.zeros(8, 4), "buf")
        dm.synchronize()
        with dm.stream(s):
            if op == "index_fill_":
                buf.index_fill_(0, torch.tensor([0, 1]), 1.0)
            else:
                getattr(buf, op)(0, torch.tensor([0, 1]), torch.ones(2, 4))
        buf[4:8].sum()
        clean = list(rc.findings)
        buf[1].sum()
    assert clean == []
    assert pairs(rc.findings) == [("RC001", "buf")]


def test_inplace_metadata_ops_are_not_writes_and_refresh_the_footprint():
    with racecheck.session() as rc:
        dm = rc.device_module
        s = dm.Stream()
        m = racecheck.name(torch.zeros(4, 4), "m")
        col = m[:, 0]
        dm.synchronize()
        col.sum()                      # footprint of column 0 cached on `col`
        with dm.stream(s):
            col.unsqueeze_(0)          # metadata only
            m[:, 1].fill_(1)           # column 1 on s
        col.sum()                      # still column 0: no race
        assert rc.findings == []
        col.as_strided_((4,), (4,), 1)  # now column 1
        col.sum()
    assert pairs(rc.findings) == [("RC001", "m")]


def test_footprints_from_an_earlier_session_are_not_reused():
    x = torch.zeros(8)
    with racecheck.session() as rc1:
        a = rc1.footprints.of(x)
    with racecheck.session() as rc2:
        b = rc2.footprints.of(x)
    assert a is not b


def test_stack_capture_finds_the_first_user_frame_on_every_path():
    """The learned jump to the first user frame must not skip a user frame on a shorter path."""
    from racecheck.instrumentation import stacks
    from racecheck.core.trace import frame_info

    def via_torch_python_wrapper(x):
        return torch.functional.broadcast_tensors(x, x)  # an extra torch frame

    with racecheck.session(record_trace=True) as rc:
        x = torch.zeros(4)
        via_torch_python_wrapper(x)
        x.add_(1)   # shorter path afterwards
        x.add_(2)
    kernels = [e for e in rc.trace if type(e).__name__ == "Kernel" and e.op == "add_"]
    lines = [frame_info(k.stack[0])[2] for k in kernels]
    assert lines == ["test_stack_capture_finds_the_first_user_frame_on_every_path"] * 2
    assert stacks._offsets


def test_a_storage_dropped_with_no_python_frame_is_still_reported(monkeypatch):
    # CPython may run the weakref callback from C with no frame above it (GC at teardown)
    from racecheck.instrumentation import footprints

    def no_frame(depth=0):
        raise ValueError("call stack is not deep enough")
    from racecheck.core import native
    was = native.speedups is not None
    native.use(False)        # the Python registry (the C one asks the interpreter for the frame)
    try:
        reg = footprints.StorageRegistry(lambda sid, nbytes, host: None)
    finally:
        native.use(was)
    t = torch.zeros(4)
    sid, _ = reg.lookup(t)
    monkeypatch.setattr(footprints, "getframe", no_frame)
    del t
    assert list(reg.dead) == [(sid, ())]
