"""On sim: RC008 for waits on events never recorded; RC005 naming where the tensor was freed."""
from __future__ import annotations

import torch

import racecheck

from helpers import pairs, recheck


def _program(dm, stale_handle):
    s = dm.Stream()
    x = racecheck.name(torch.zeros(8), "x")
    dm.synchronize()
    done = dm.Event()
    with dm.stream(s):
        x.add_(1)
        if stale_handle:
            done_now = dm.Event()              # the producer swapped in a new event ...
            done_now.record(s)
    dm.current_stream().wait_event(done)     # ... the consumer waits on the old one
    y = x * 2
    dm.synchronize()
    return x, y


def test_wait_on_a_fresh_event_is_rc008_next_to_the_race():
    with racecheck.session(device="sim") as rc:
        _program(rc.device_module, stale_handle=False)
    assert pairs(rc.findings) == [("RC001", "x"), ("RC008", "x")]
    f = rc.findings[1]
    assert f.current.location.startswith("test_rc005_rc008_sim.py:")
    assert "never recorded" in f.detail


def test_wait_on_a_stale_handle_names_the_recorded_event():
    with racecheck.session(device="sim") as rc:
        _program(rc.device_module, stale_handle=True)
    assert pairs(rc.findings) == [("RC001", "x"), ("RC008", "x")]
    assert "was recorded on" in rc.findings[1].detail and "instead" in rc.findings[1].detail


# -- where a tensor was freed (RC005 names the line) ------------------------------------------------

def _freed_while_used(dm, how):
    s = dm.Stream()
    t = racecheck.name(torch.ones(64), "t")
    dm.synchronize()
    with dm.stream(s):
        u = t * 2
    if how == "del":
        del t                                              # FREE-DEL
    elif how == "rebind":
        t = torch.zeros(1)                                 # FREE-REBIND
    return u


def _line(tag):
    import inspect
    src, start = inspect.getsourcelines(_freed_while_used)
    return start + next(i for i, ln in enumerate(src) if tag in ln)


def test_rc005_names_the_line_that_dropped_the_last_reference():
    for how, tag in (("del", "FREE-DEL"), ("rebind", "FREE-REBIND")):
        with racecheck.session(device="sim") as rc:
            u = _freed_while_used(rc.device_module, how)    # noqa: F841
        f = next(f for f in rc.findings if f.rule == "RC005")
        assert f.current.location == f"test_rc005_rc008_sim.py:{_line(tag)}", how
        assert f.current.function == "_freed_while_used" and f.current.stack


def test_free_site_survives_a_saved_trace(tmp_path):
    with racecheck.session(device="sim", record_trace=True) as rc:
        u = _freed_while_used(rc.device_module, "del")      # noqa: F841
    offline = recheck(rc, tmp_path / "t.jsonl")
    assert [f.to_json() for f in offline] == [f.to_json() for f in rc.findings]


# -- an unnamed freed tensor: its creating statement read only when the hazard comes due --------

def _scratch_freed_while_used(dm, catch_up):
    s = dm.Stream()
    scratch_rows = torch.ones(64)
    dm.synchronize()
    with dm.stream(s):
        u = scratch_rows * 2
    del scratch_rows
    if catch_up:
        dm.current_stream().wait_stream(s)
    torch.zeros(64).add_(1)                     # the allocation stream issues work
    return u


def test_a_hazards_source_is_read_only_when_it_comes_due(monkeypatch):
    from racecheck.core.checker import naming
    read = []
    real = naming.creation_name
    monkeypatch.setattr(naming, "creation_name", lambda frame: read.append(frame) or real(frame))
    with racecheck.session(device="sim") as rc:
        _scratch_freed_while_used(rc.device_module, catch_up=True)
    assert rc.findings == [] and read == []
    with racecheck.session(device="sim") as rc:
        _scratch_freed_while_used(rc.device_module, catch_up=False)
    assert pairs(rc.findings) == [("RC005", "_scratch_freed_while_used: scratch_rows")]
    assert len(read) == 1
