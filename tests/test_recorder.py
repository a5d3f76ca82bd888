"""When queued events reach the checker: at a host wait with a batch queued, at the cap, on read.

Checking a batch while the host is about to wait for the device overlaps the checker's work with
the device's; checking it mid-launch-sequence would delay the next launch. The policy is the same
in the recorder's C emitter and its Python reference.
"""
import pytest
import torch

import racecheck
from racecheck.core import native, recorder

PATHS = [pytest.param(True, id="c"), pytest.param(False, id="python")]


@pytest.fixture(params=PATHS)
def path(request):
    if request.param and native.built is None:
        pytest.skip("the C hot path is not built here")
    with native.using(request.param):
        yield request.param


def _checked(rc) -> int:
    return rc.recorder.seq          # events taken off the queue (reading it flushes nothing)


def test_launches_alone_stay_queued_until_a_host_wait(path):
    with racecheck.session(device="sim") as rc:
        x = torch.zeros(8)
        before = _checked(rc)
        for _ in range(recorder.BATCH + 8):
            x.add_(1)
        assert _checked(rc) == before, "a batch was checked between launches"
        assert x.sum().item() == 8 * (recorder.BATCH + 8)     # a host wait: the batch is checked
        assert _checked(rc) == rc.recorder.position
        assert rc.findings == [] and rc.internal_errors == []


def test_a_host_wait_with_few_events_queued_leaves_them_for_the_next(path):
    with racecheck.session(device="sim") as rc:
        x = torch.zeros(8)
        x.add_(1).sum().item()
        x.add_(1).sum().item()
        checked = _checked(rc)
        x.add_(1).sum().item()
        assert _checked(rc) == checked < rc.recorder.position
        assert rc.checker.events_processed == rc.recorder.position      # reading results flushes


def test_a_program_that_never_waits_is_checked_every_cap_events(path):
    with racecheck.session(device="sim") as rc:
        x = torch.zeros(8)
        for _ in range(recorder.CAP + 10):
            x.add_(1)
        assert recorder.CAP <= _checked(rc) < rc.recorder.position
        assert rc.findings == [] and rc.internal_errors == []


def test_a_race_is_found_whichever_event_ends_a_batch(path):
    """Where a batch ends changes when the checker runs, never what it finds."""
    found = []
    for pad in (0, 1, recorder.BATCH - 1, recorder.BATCH + 1):
        with racecheck.session(device="sim") as rc:
            dm = rc.device_module
            x = racecheck.name(torch.zeros(8), "x")
            y = torch.zeros(8)
            for _ in range(pad):
                y.add_(1)
            with dm.stream(dm.Stream()):
                x.add_(1)
            x.sum().item()
        found.append([(f.rule, f.tensor, f.message()) for f in rc.findings])
    assert found[0] and {f[:2] for f in found[0]} == {("RC001", "x")}
    assert all(f == found[0] for f in found), found


def test_a_session_that_does_not_check_routes_the_program_and_reports_nothing():
    """check=False (a scenario's reference run, which wants the program's values only): ops and
    Triton kernels run as under a checking session, the events are taken off the queue, and no
    finding is made or named."""
    triton = pytest.importorskip("triton")
    import triton.language as tl

    @triton.jit
    def scale(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * 3, mask=offs < n)

    def program(rc):
        dm = rc.device_module
        side = dm.Stream()
        x = torch.arange(64, dtype=torch.float32, device="cuda")
        out = torch.zeros(64, device="cuda")
        with dm.stream(side):
            scale[(4,)](x, out, 64, BLOCK=16)       # unordered with the read below: a race
        return (out + 1).cpu()
    results = {}
    for check in (True, False):
        with racecheck.session(device="sim", route_cuda=True, check=check) as rc:
            results[check] = (program(rc), [f.rule for f in rc.findings], rc.recorder.queue)
    assert torch.equal(results[True][0], results[False][0])
    assert results[True][1] and results[False][1] == []
    assert not results[False][2]                    # nothing left queued
