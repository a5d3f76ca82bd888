"""The C hot path (instrumentation/_speedups.c) against the Python it ports.

Each public case runs twice, C path on and off: the recorded traces (every event with its
footprints and formatted stacks) and the findings must be equal field by field. Stack capture
is compared call by call, through the caches both implementations share.
"""
import json
import os
import re
import sys

import pytest
import torch

import racecheck
from racecheck.core import native
from racecheck.instrumentation import stacks

from cases import EXPECTED

needs_c = pytest.mark.skipif(native.built is None, reason="the C hot path is not built here")


def test_ci_builds_the_c_path():
    if not os.environ.get("CI"):
        pytest.skip("only CI promises a compiler")
    assert native.built is not None, "racecheck._speedups was not compiled by the install"
    assert native.engine_built is not None, "racecheck._engine was not compiled by the install"


def test_switching_it_off_restores_the_python_reference():
    with native.using(False):
        assert stacks.capture is stacks._py_capture
        from racecheck.core.checker import Checker
        c = Checker()
        assert "process_all" not in vars(c) and "_read" not in vars(c)


def _run(program, on: bool):
    with native.using(on), racecheck.session(device="sim", record_trace=True) as rc:
        keep = program(rc.device_module, "cpu")  # noqa: F841 - tensors outlive the snippet
    # a host thread's timeline is named after its Python thread, numbered process-wide
    events = [json.loads(re.sub(r"Thread-\d+", "Thread-N", json.dumps(e.to_json())))
              for e in rc.trace.events]
    return events, [f.to_json() for f in rc.findings], rc.internal_errors


@needs_c
@pytest.mark.parametrize("case", sorted(EXPECTED))
def test_public_case_same_trace_and_findings(case):
    program, _expected = EXPECTED[case]
    # one call site for both runs: their stacks reach into this frame
    (c_events, c_findings, c_errors), (py_events, py_findings, py_errors) = [
        _run(program, on) for on in (True, False)]
    assert not c_errors and not py_errors
    assert c_events == py_events
    assert c_findings == py_findings


# -- stacks ---------------------------------------------------------------------------------------

def _both(limit=6, skip=2):
    """What each implementation captures from here (this frame is the 'plan' frame)."""
    return native.built.capture(limit, skip), stacks._py_capture(limit, skip)


def _at_depth(n, fn):
    if n == 0:
        return fn()
    return _at_depth(n - 1, fn)


@needs_c
@pytest.mark.parametrize("limit", [1, 2, 6])
@pytest.mark.parametrize("depth", [0, 3, 12])
def test_stack_capture_matches_python(limit, depth):
    for _ in range(3):      # first call walks; later ones take the learned offset and _last
        c, py = _at_depth(depth, lambda: _both(limit))
        assert c == py
        assert len(c) == min(limit, len(c)) and all(isinstance(code, type(_both.__code__))
                                                    for code, _ in c)


@needs_c
def test_stack_capture_two_sites_in_one_loop():
    out = []
    for _ in range(3):
        out.append(_both())
        out.append(_both())        # another line: another bytecode offset, another _last entry
    for c, py in out:
        assert c == py
    assert out[0][0] != out[1][0]
    assert out[0][0] == out[2][0] == out[4][0]


@needs_c
def test_stack_capture_keywords_and_shallow_stacks():
    c = native.built.capture(limit=2, skip=2)
    assert c == stacks._py_capture(2, 2)
    assert native.built.capture(1, 10_000) == ()     # deeper than the stack: nothing
    with pytest.raises(TypeError):
        native.built.capture(1, 2, 3)


# -- the plan of a plain kernel -----------------------------------------------------------------

def _ops(dm, device):
    a = torch.ones(16)
    b = torch.ones(16)
    s = dm.Stream()
    out = torch.empty(16)
    a.add_(b)                       # in place
    c = a + b                       # a new temporary
    torch.add(a, b, out=out)        # out= by keyword: the generic path
    d = a.mul(2.0)                  # a scalar where the schema has Scalar
    with dm.stream(s):
        e = torch.where(a > 0, a, b)
    h = torch.mm(torch.ones(4, 4), torch.ones(4, 4))
    parts = torch.split(torch.arange(16.0), 4)
    f = torch.cat(parts)            # a tensor list
    g = torch.addcmul(a, b, c, value=0.5)
    return a, b, c, d, e, f, g, h, out


@needs_c
def test_plain_kernels_record_the_same_events():
    (c_events, c_findings, _), (py_events, py_findings, _) = [_run(_ops, on) for on in (True, False)]
    assert c_events == py_events
    assert c_findings == py_findings
    assert any(e.get("op") == "add_" for e in c_events)



@needs_c
def test_a_reassigned_tensor_method_is_called_by_the_c_path(monkeypatch):
    """The C footprints call torch's methods without a name lookup while the tensor type is
    unchanged; reassigning one (as a patch or a debugger does) must reach them at once."""
    calls = []
    orig = torch.Tensor.storage_offset

    def counted(self):
        calls.append(1)
        return orig(self)

    with native.using(True), racecheck.session(device="sim") as rc:
        a = torch.zeros(8)
        (a + 1).add_(1)                 # the cache holds torch.Tensor's methods from here
        monkeypatch.setattr(torch.Tensor, "storage_offset", counted)
        b = a + 2                       # a new output: its footprint reads storage_offset()
        monkeypatch.undo()
        c = a + 3
    assert calls, "the C path did not see the reassigned method"
    assert b.tolist() == [2.0] * 8 and c.tolist() == [3.0] * 8
    assert rc.findings == [] and rc.internal_errors == []

@pytest.mark.skipif(native.engine_built is None, reason="the C engine is not built here")
def test_a_checker_error_in_c_still_names_the_event(monkeypatch):
    """The engine failing to hand its state over (here: a class of the Python state that raises)
    is an internal error naming the event, and the program's results are unchanged."""
    from racecheck.core import fastchecker as engine

    def broken_timeline(*args):
        raise RuntimeError("boom")

    kit = engine._kit
    monkeypatch.setattr(engine, "_kit", lambda: dict(kit(), _Timeline=broken_timeline))
    with native.using(True), racecheck.session(device="sim") as rc:
        dm = rc.device_module
        x = torch.zeros(8)
        y = torch.zeros(8)
        dm.synchronize()
        with dm.stream(dm.Stream()):
            x.add_(1)
        y.add_(x)                   # unordered read: the engine hands over here
    assert y.tolist() == [1.0] * 8
    assert len(rc.internal_errors) == 1
    assert rc.internal_errors[0].startswith("while checking Kernel: RuntimeError: boom")


def test_pure_python_switch_from_the_environment():
    import subprocess
    code = ("from racecheck.core import native; from racecheck.core.fastchecker import new_checker; "
            "print(native.speedups is None, native.checker_engine() is None, type(new_checker()).__name__)")
    env = dict(os.environ, RACECHECK_PURE_PYTHON="1")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "True True Checker"


# -- the switch: one decision, read when a session or a checker is made --------------------------

def test_the_switch_answers_both_questions():
    from racecheck.core.checker import Checker
    from racecheck.core.fastchecker import FastChecker, new_checker
    with native.using(False):
        assert native.speedups is None and native.checker_engine() is None
        assert type(new_checker()) is Checker
        with racecheck.session(device="sim") as rc:
            pass
        assert type(rc.checker) is Checker and rc.recorder._fast_emit is None
    with native.using(True):
        assert native.speedups is native.built
        assert native.checker_engine() is native.engine_built
        if native.engine_built is not None:
            assert isinstance(new_checker(), FastChecker)


@needs_c
def test_a_session_keeps_the_c_path_it_was_made_with():
    """Switching inside a session changes nothing of it: ops first planned after the switch still
    get the C plans the session was made with."""
    from torch.utils._python_dispatch import _get_current_dispatch_mode
    with native.using(True), racecheck.session(device="sim") as rc:
        mode = _get_current_dispatch_mode()
        with native.using(False):
            a = torch.ones(4)
            a.addcmul_(a, a)            # an op this session had not planned yet
        plans = list(mode._plans.values())
    assert mode._speedups is native.built
    assert any(isinstance(p, native.built.FastPlan) for p in plans)
    assert rc.recorder._fast_emit is not None
    assert a.tolist() == [2.0] * 4 and rc.findings == []
