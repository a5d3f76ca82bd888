"""RC008 on sim for waits on events never recorded (issue: stale handles, fresh events)."""
from __future__ import annotations

import torch

import racecheck


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
    assert [(f.rule, f.tensor) for f in rc.findings] == [("RC001", "x"), ("RC008", "x")]
    f = rc.findings[1]
    assert f.current.location.startswith("test_rc008_sim.py:")
    assert "never recorded" in f.detail


def test_wait_on_a_stale_handle_names_the_recorded_event():
    with racecheck.session(device="sim") as rc:
        _program(rc.device_module, stale_handle=True)
    assert [(f.rule, f.tensor) for f in rc.findings] == [("RC001", "x"), ("RC008", "x")]
    assert "was recorded on" in rc.findings[1].detail and "instead" in rc.findings[1].detail
