"""Delay plans: the format, validation, and how a session applies them (on sim here; the npu
stand-in and the GPU in test_npu_standin.py / test_cuda_cases.py)."""
import pytest
import torch

import racecheck
from racecheck.core.errors import UsageError
from racecheck.instrumentation.delays import DelayPlan, DelayPlanError, normalize_holds
from racecheck.instrumentation.executor import EagerExecutor


class RecordingExecutor(EagerExecutor):
    """Eager, but remembers what it was asked to delay."""

    def __init__(self):
        self.delays = []

    def delay(self, stream, microseconds):
        self.delays.append((stream, microseconds))


def test_normalize_accepts_the_executor_hold_format():
    holds = normalize_holds([{"stream": "plan_stream", "before_op": 3, "us": 200},
                             {"stream": 1, "op": "index_put_", "us": 5}])
    assert holds == [{"stream": "plan_stream", "before_op": 3, "us": 200.0},
                     {"stream": "#1", "op": "index_put_", "us": 5.0}]
    assert normalize_holds({"holds": holds, "priorities": {}}) == holds
    assert normalize_holds('[{"stream": "default", "op": "mul", "us": 1}]')[0]["op"] == "mul"
    assert normalize_holds(None) == []


@pytest.mark.parametrize("bad", [
    {"stream": "s", "us": 1},                                   # neither before_op nor op
    {"stream": "s", "op": "mul", "before_op": 1, "us": 1},      # both
    {"stream": "s", "op": "mul"},                               # no length
    {"stream": "s", "op": "mul", "us": "long"},
    {"stream": "s", "before_op": -1, "us": 1},
    {"stream": "s", "before_op": 1.5, "us": 1},
    {"stream": "s", "op": "mul", "us": -3},
    {"stream": None, "op": "mul", "us": 1},
    {"stream": "s", "op": "mul", "us": 1, "when": "now"},
    "not a hold",
])
def test_malformed_holds_are_usage_errors(bad):
    with pytest.raises(DelayPlanError):
        normalize_holds([bad])
    assert issubclass(DelayPlanError, UsageError)


def test_malformed_plan_fails_at_session_start():
    with pytest.raises(UsageError):
        with racecheck.session(device="sim", delay_plan=[{"stream": "s", "us": 1}]):
            pass
    with racecheck.session(device="sim") as rc:   # the failed start left no active session
        pass
    assert not rc.internal_errors


def _program(rc):
    dm = rc.device_module
    s = dm.Stream()
    rc.name_stream(s, "plan_stream")
    x = torch.zeros(8)
    i, v = torch.tensor([1]), torch.ones(1)
    dm.synchronize()
    with dm.stream(s):
        x.add_(1)          # plan_stream launch 0
        x.add_(1)          # plan_stream launch 1
        x.index_put_((i,), v)   # launch 2
    dm.current_stream().wait_stream(s)
    y = x * 2              # default: a mul
    return s, y


def test_plan_on_sim_reaches_the_executor():
    ex = RecordingExecutor()
    plan = [{"stream": "plan_stream", "before_op": 1, "us": 100},
            {"stream": "plan_stream", "op": "index_put_", "us": 7},
            {"stream": "default", "op": "mul", "us": 10},
            {"stream": "#1", "before_op": 0, "us": 3}]      # #1: the first stream created
    with racecheck.session(device="sim", executor=ex, delay_plan=plan) as rc:
        s, _ = _program(rc)
        s_tid = rc.backend.stream_of(s)
        d_tid = rc.backend.stream_of(rc.device_module.default_stream())
    assert ex.delays == [(s_tid, 3.0), (s_tid, 100.0), (s_tid, 7.0), (d_tid, 10.0)]
    applied = rc.before_launch.plan.applied
    assert [(n, k, op) for n, k, op, _ in applied[:3]] == [
        ("plan_stream", 0, "add_"), ("plan_stream", 1, "add_"), ("plan_stream", 2, "index_put_")]
    assert [(n, op) for n, _k, op, _ in applied[3:]] == [("default", "mul")]
    assert not rc.findings and not rc.internal_errors


def test_plan_chains_a_user_hook_and_empty_plan_changes_nothing():
    seen = []
    ex = RecordingExecutor()
    with racecheck.session(device="sim", executor=ex, delay_plan=[],
                           before_launch=lambda tid, op: seen.append(op)) as rc:
        _program(rc)
    assert ex.delays == [] and "mul" in seen
    seen.clear()
    with racecheck.session(device="sim", executor=ex,
                           delay_plan=[{"stream": "default", "op": "mul", "us": 1}],
                           before_launch=lambda tid, op: seen.append(op)) as rc:
        _program(rc)
    assert "mul" in seen and len(ex.delays) == 1


def test_plan_drives_the_adversarial_executor_holds():
    adversarial = pytest.importorskip("racecheck.instrumentation.adversarial")
    ex = adversarial.AdversarialExecutor()
    with racecheck.session(device="sim", executor=ex,
                           delay_plan=[{"stream": "plan_stream", "before_op": 0, "us": 50}]) as rc:
        _program(rc)
    assert ex.stats["holds"] == 1
    assert not rc.internal_errors


def test_delay_api_is_a_no_op_outside_a_session():
    racecheck.delay(object(), 10)       # nothing active: nothing happens


def test_plan_object_roundtrip():
    p = DelayPlan([{"stream": "default", "op": "mul", "us": 2}])
    assert DelayPlan.parse(p) is p and bool(p)
    assert p.to_json() == [{"stream": "default", "op": "mul", "us": 2.0}]
    assert not DelayPlan([])


def test_launches_during_graph_capture_are_counted_but_never_delayed():
    ex = RecordingExecutor()
    plan = [{"stream": "default", "op": "mul", "us": 5}, {"stream": "default", "before_op": 1, "us": 9}]
    with racecheck.session(device="sim", executor=ex, delay_plan=plan) as rc:
        dm = rc.device_module
        x = torch.ones(4)
        g = dm.CUDAGraph()
        with dm.graph(g):
            y = x * 2                    # launch 0, a "mul", captured: not delayed
        x.mul_(3)                        # launch 1 on default: delayed
        g.replay()
    assert [us for _, us in ex.delays] == [9.0] and not rc.internal_errors
    del y
