"""The public cases and the backend checks on a real GPU (`cuda`: NVIDIA, or AMD under ROCm).

Skipped, with the reason shown, where torch sees no GPU (CI). `ci/gpu-check` runs these on a
GPU machine. Each case is run once outside any session first, so every kernel (and the sleep
kernel) is loaded before the checked run.
"""
import os
import sys

import pytest
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import racecheck  # noqa: E402

from cases import EXPECTED  # noqa: E402
from test_npu_standin import CHECKS, Ctx, run_case  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(),
                       reason="needs a CUDA or ROCm GPU (torch.cuda.is_available() is False)"),
]


class _Plain:
    """The device module for a warm-up run outside any session."""

    def __getattr__(self, name):
        return getattr(torch.cuda, name)


@pytest.fixture(scope="module")
def ctx():
    return Ctx("cuda")


@pytest.mark.parametrize("case", sorted(EXPECTED))
def test_public_case_on_cuda(ctx, case):
    program, _ = EXPECTED[case]
    keep = program(_Plain(), "cuda")       # warm-up: load every kernel the case launches
    del keep
    torch.cuda.synchronize()
    ok, detail = run_case(ctx, case)
    torch.cuda.synchronize()
    assert ok, detail


@pytest.mark.parametrize("name", sorted(n for n, (_f, d) in CHECKS.items() if "cuda" in d))
def test_cuda_backend(ctx, name):
    fn, _ = CHECKS[name]
    note = fn(ctx)
    torch.cuda.synchronize()
    if note and note.startswith("skipped"):
        pytest.skip(note)


def test_wrappers_only_by_default(ctx):
    """torch's GPU trace stays off unless asked for: once on, it taxes every allocation."""
    with ctx.session() as rc:
        assert not rc.backend._traced


def test_trace_callbacks_attached(ctx):
    with ctx.session(callbacks=True) as rc:
        traced = set(rc.backend._traced)
    assert {"event_record", "event_wait", "stream_synchronization", "device_synchronization",
            "event_synchronization"} <= traced, traced


def test_sleep_calibration_and_delay_length(ctx):
    from racecheck.instrumentation import delays
    rate = delays.calibrate(torch.cuda, torch.cuda.current_device())
    assert rate > 50, rate                      # cycles per microsecond (GHz clocks: ~1000-2000)
    with ctx.session() as rc:
        s = torch.cuda.Stream()
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record(s)
        racecheck.delay(s, 2000)
        e1.record(s)
        e1.synchronize()
        us = e0.elapsed_time(e1) * 1000.0
    assert 1500 <= us <= 4000, us
    assert not rc.internal_errors, rc.internal_errors


def test_delay_before_producer_shows_the_race_as_a_wrong_value(ctx):
    """A producer on a side stream, a consumer on default with no sync: with a delay before
    the producer the consumer reads the old value nearly always, and the race is flagged."""
    n = 1 << 20
    plan = [{"stream": "producer", "op": "fill_", "us": 3000}]
    stale = 0
    runs = 20
    x = torch.zeros(n, device="cuda")
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):              # warm-up outside the session
        x.fill_(1)
    x.sum()
    torch.cuda.synchronize()
    for _ in range(runs):
        x.zero_()
        torch.cuda.synchronize()
        with ctx.session(delay_plan=plan) as rc:
            racecheck.name(x, "x")
            rc.name_stream(s, "producer")
            with torch.cuda.stream(s):
                x.fill_(1)
            total = x.sum()
            torch.cuda.synchronize()
        stale += int(total.item() != n)
        assert ("RC001", "x") in {(f.rule, f.tensor) for f in rc.findings}
        assert not rc.internal_errors, rc.internal_errors
    assert stale >= 0.95 * runs, f"wrong values in {stale}/{runs} runs"


def _make_on_side(s, n):
    with torch.cuda.stream(s):
        positions = torch.zeros(n, device="cuda")
        positions.add_(1)
    return positions


def _consume_all(tensors):
    out = []
    for t in tensors:
        out.append(t * 2)
    return out


def test_temporaries_named_by_their_statement_on_cuda():
    """Issue 27's names for temporaries on the per-op path of a real GPU: the allocating
    statement names the tensor, once for every iteration, exactly as on sim."""
    def program():
        s = torch.cuda.Stream()
        torch.cuda.synchronize()
        for n in (4, 8, 12):
            _consume_all([_make_on_side(s, n)])
        torch.cuda.synchronize()
    program()                                   # warm-up outside the session
    with racecheck.session(device="cuda") as rc:
        program()
    assert not rc.internal_errors, rc.internal_errors
    rc001 = [f for f in rc.findings if f.rule == "RC001"]
    assert rc001 and {f.tensor for f in rc001} == {"_make_on_side: positions"}
    assert not any("unnamed" in f.tensor for f in rc.findings)
    from racecheck.core.findings import group_findings
    assert len(group_findings(rc001)) == 1
