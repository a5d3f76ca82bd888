"""The per-op fast paths record exactly what the generic paths record.

Interception cost matters (every op of the program goes through it), so the interceptor has a
precompiled plan for plain kernels, the session hands events to the checker in batches and
stack capture reuses a stack that repeats. None of that may change a trace or a finding.
"""
import pytest
import torch

import racecheck
from racecheck.instrumentation import interceptor, stacks


def _program(dm):
    s = dm.Stream()
    a, b = torch.ones(8), torch.ones(8)
    with dm.stream(s):
        a.add_(b)                                   # positional tensors: the fast plan
    c = a + 1.0                                     # a Python scalar where the schema says Tensor
    torch.mm(torch.ones(2, 3), torch.ones(3, 2))
    e = torch.empty(0)
    e + 1                                           # an empty tensor: the generic path
    h = torch.ones(4, pin_memory=True)              # a pinned factory
    h.add_(1)                                       # host memory only: HostAccess
    torch.add(a, b, out=c)                          # a tensor passed by keyword
    torch.where(a > 0, a, b)
    torch.addcmul(torch.zeros(8), a, b, value=2)
    torch.max(a.reshape(2, 4), 0)                   # two outputs
    torch.clamp(a, min=b)                           # a trailing optional tensor left out
    torch.nn.functional.layer_norm(torch.ones(2, 4), (4,))   # optional tensors passed as None
    torch.ones(6, 4).index_select(0, torch.tensor([1, 3]))
    g = dm.CUDAGraph()
    with dm.graph(g):                               # graph capture: the generic path
        c.mul_(2)
    g.replay()
    dm.synchronize()
    return a, b, c, h


def _trace():
    with racecheck.session(device="sim", record_trace=True) as rc:
        keep = _program(rc.device_module)  # noqa: F841
    return [ev.to_json() for ev in rc.trace], [(f.rule, f.tensor, f.current.seq) for f in rc.findings]


def test_fast_plans_record_what_the_generic_path_records(monkeypatch):
    runs = []
    for generic in (False, True):
        if generic:
            monkeypatch.setattr(interceptor, "_fast_kernel",
                                lambda icp, oc, func: interceptor._generic_kernel(icp, oc))
        runs.append(_trace())                       # one call site: the stacks compare too
    assert runs[0] == runs[1]
    assert runs[0][1]                               # the stream race on `a` is found


def test_findings_read_during_the_session_include_every_event_so_far():
    with racecheck.session(device="sim", record_trace=True) as rc:
        dm = rc.device_module
        s = dm.Stream()
        x = racecheck.name(torch.zeros(8), "x")
        with dm.stream(s):
            x.add_(1)
        assert [(f.rule, f.tensor) for f in rc.findings] == [("RC001", "x")]
        assert rc.checker.events_processed == len(rc.trace) == rc.recorder.position


def test_a_checker_bug_mid_batch_stops_checking_and_names_the_event(monkeypatch):
    from racecheck.core.checker import Checker
    calls = []
    orig = Checker._on_kernel

    def flaky(self, ev, seq):
        calls.append(ev.op)
        if len(calls) == 3:
            raise RuntimeError("boom")
        return orig(self, ev, seq)

    monkeypatch.setattr(Checker, "_on_kernel", flaky)
    with racecheck.session(device="sim") as rc:
        x = torch.zeros(8)
        for _ in range(5):
            x.add_(1)
    assert x.tolist() == [5.0] * 8                  # the program's results are unchanged
    assert len(rc.internal_errors) == 1
    assert rc.internal_errors[0].startswith("while checking Kernel: RuntimeError: boom")
    assert len(calls) == 3                          # nothing checked after the failure


def _op_from(x):
    x.add_(1)


def _caller_one(x):
    _op_from(x)


def _caller_two(x):
    _op_from(x)


def test_a_repeated_stack_is_reused_but_never_stale():
    from racecheck.core.trace import frame_info
    with racecheck.session(device="sim", record_trace=True) as rc:
        x = torch.zeros(4)
        order = (_caller_one, _caller_one, _caller_one, _caller_two, _caller_one)
        for caller in order:
            caller(x)
    kernels = [e for e in rc.trace if type(e).__name__ == "Kernel" and e.op == "add_"]
    assert [frame_info(k.stack[1])[2] for k in kernels] == [c.__name__ for c in order]
    assert kernels[1].stack is kernels[2].stack     # the same frames again: the same tuple
    assert kernels[2].stack[1:] != kernels[3].stack[1:]
    assert stacks._last


def test_torch_compile_never_traces_the_dispatch_mode():
    """Dynamo must not compile racecheck's own frames: the mode runs its body with Dynamo's frame
    callback off (what torch's own wrapper does, for less per op)."""
    pytest.importorskip("torch._dynamo")

    def f(x, y):
        return (x * 2 + y).sin()

    compiled = torch.compile(f, backend="eager")
    with racecheck.session(device="sim") as rc:
        dm = rc.device_module
        x, y = torch.ones(8), racecheck.name(torch.ones(8), "y")
        with dm.stream(dm.Stream()):
            y.add_(1)
        out = compiled(x, y)
    assert torch.equal(out, f(x, y))
    assert ("RC001", "y") in {(g.rule, g.tensor) for g in rc.findings}
    assert not rc.internal_errors
