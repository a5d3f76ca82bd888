"""The adversarial sim executor: happens-before-consistent orders, races as wrong values.

Three properties on the public cases (tests/cases.py):
  * timing independence: the detector reports exactly the same findings in every order;
  * a race-free program computes the same values in every order;
  * a racy program computes a wrong value in some order, the same one every time for one plan.
"""
from __future__ import annotations

import threading

import pytest
import torch
from hypothesis import HealthCheck, given, settings

import racecheck
from racecheck.instrumentation.adversarial import AdversarialExecutor, PlanError, normalize_plan
from racecheck.instrumentation.delays import DelayPlanError, normalize_holds
from racecheck.drivers.fuzz import strategies as rs

from cases import EXPECTED
from helpers import in_session, pairs

SETTINGS = settings(max_examples=25, deadline=None, database=None, derandomize=True,
                    suppress_health_check=list(HealthCheck))

CLEAN = sorted(k for k, (_, exp) in EXPECTED.items() if not exp)


def _run(program, plan=None, eager=False):
    ex = None if eager else AdversarialExecutor(plan)
    kept = {}
    rc = in_session(lambda rc: kept.update(program(rc.device_module, "cpu") or {}), executor=ex)
    values = {k: v.clone() for k, v in sorted(kept.items())
              if isinstance(v, torch.Tensor) and k not in ("keep",)}
    return set(pairs(rc.findings)), values, rc, ex


def _equal(a: dict, b: dict) -> bool:
    if a.keys() != b.keys():
        return False
    for k in a:
        x, y = a[k], b[k]
        if x.shape != y.shape or x.dtype != y.dtype:
            return False
        if not torch.equal(x, y) and not (x.is_floating_point() and torch.allclose(x, y, equal_nan=True)):
            return False
    return True


# -- timing independence and clean programs ------------------------------------------------------

@pytest.mark.parametrize("case", sorted(EXPECTED))
@SETTINGS
@given(plan=rs.plans(max_step=40))
def test_findings_do_not_depend_on_the_order(case, plan):
    program, expected = EXPECTED[case]
    got, _, rc, ex = _run(program, plan)
    assert got == expected, [f.message() for f in rc.findings]
    assert not rc.internal_errors
    assert ex.pending() == 0


@pytest.mark.parametrize("case", CLEAN)
@SETTINGS
@given(plan=rs.plans(max_step=40))
def test_race_free_programs_compute_the_same_values_in_every_order(case, plan):
    program, _ = EXPECTED[case]
    _, eager_values, _, _ = _run(program, eager=True)
    _, values, rc, ex = _run(program, plan)
    assert _equal(values, eager_values)
    assert not ex.faults


# -- races become wrong values ---------------------------------------------------------------------

def p15_value(dm, device):
    """P15 keeping what the host read: a non-blocking D2H into pinned memory read before a sync."""
    x = racecheck.name(torch.full((8,), 3.0, device=device), "x")
    h = racecheck.name(torch.zeros(8, pin_memory=True), "h")
    dm.synchronize()
    h.copy_(x, non_blocking=True)
    seen = torch.tensor([h[0].item()])
    return {"seen": seen}


def p27_value(dm, device):
    """P27 keeping thread b's result."""
    x = racecheck.name(torch.zeros(8, device=device), "x")
    dm.synchronize()
    s, s2 = dm.Stream(), dm.Stream()
    out = {}

    def a():
        with dm.stream(s):
            x.add_(1)

    def b():
        with dm.stream(s2):
            out["y"] = x * 2

    for fn in (a, b):
        th = threading.Thread(target=fn)
        th.start()
        th.join()
    return out


VALUE_VISIBLE = {k: EXPECTED[k][0] for k in ("P01", "P09", "P11", "P14", "P17", "P18", "P21")}
VALUE_VISIBLE.update(P15=p15_value, P27=p27_value)


@pytest.mark.parametrize("case", sorted(VALUE_VISIBLE))
def test_races_show_up_as_wrong_values_in_some_order(case):
    """Search plans (as `racecheck fuzz` does) until one gives a value the eager run does not."""
    from hypothesis import find
    program = VALUE_VISIBLE[case]
    _, eager_values, _, _ = _run(program, eager=True)

    def wrong(plan):
        return not _equal(_run(program, plan)[1], eager_values)

    plan = find(rs.plans(max_step=40), wrong, settings=settings(max_examples=300, deadline=None,
                                                                database=None, derandomize=True))
    # ... reproducibly: the same plan gives the same wrong values every time
    _, v1, _, _ = _run(program, plan)
    _, v2, _, _ = _run(program, plan)
    assert not _equal(v1, eager_values) and _equal(v1, v2)


def test_the_empty_plan_runs_device_work_in_issue_order():
    for case in CLEAN + ["P08", "P19", "P22", "P24"]:
        program = EXPECTED[case][0]
        assert _equal(_run(program, {})[1], _run(program, eager=True)[1]), case


def test_a_hold_before_the_producer_exposes_the_race_and_before_the_consumer_hides_it():
    program = EXPECTED["P01"][0]            # x.add_(1) on stream #1, then y = x * 2 on the default stream
    eager = _run(program, eager=True)[1]
    late_producer = {"holds": [{"stream": "#1", "before_op": 0, "us": 50}]}
    late_consumer = {"holds": [{"stream": "default", "before_op": 2, "us": 50}]}
    assert not _equal(_run(program, late_producer)[1], eager)
    assert _equal(_run(program, late_consumer)[1], eager)


def test_a_fast_stream_runs_at_issue_and_a_slow_one_when_the_host_waits():
    program = EXPECTED["P01"][0]
    eager = _run(program, eager=True)[1]
    # stream #1 (the producer) above the host runs at once: the consumer sees its write
    assert _equal(_run(program, {"priorities": {"#1": 2}, "host": 1})[1], eager)
    # the default stream (the consumer) above everyone, the producer below the host: stale read
    assert not _equal(_run(program, {"priorities": {"#0": 3, "#1": 0}, "host": 1})[1], eager)


def test_change_points_demote_the_running_stream():
    def program(dm, device):
        s = dm.Stream()
        x = racecheck.name(torch.ones(8), "x")
        dm.synchronize()
        with dm.stream(s):
            x.add_(1)
            x.mul_(3)
        return {"y": x * 2}             # on the default stream, no wait: RC001

    eager = _run(program, eager=True)[1]
    plan = {"priorities": {"#1": 3}, "host": 1}       # s above the host: runs at issue
    assert _equal(_run(program, plan)[1], eager)
    # a change point right after s's first op demotes s below everyone: mul_ runs after y
    outcomes = {k: _equal(_run(program, dict(plan, change_points=[k]))[1], eager) for k in range(1, 10)}
    assert not all(outcomes.values()), outcomes


def test_wrong_values_are_reproducible():
    program = EXPECTED["P21"][0]
    plan = {"priorities": {"#0": 2}, "host": 1}
    runs = [_run(program, plan)[1] for _ in range(5)]
    assert all(_equal(runs[0], r) for r in runs)


# -- mechanics ------------------------------------------------------------------------------------

def test_outputs_exist_at_issue_and_are_filled_when_the_op_runs():
    ex = AdversarialExecutor({})
    with racecheck.session(device="sim", executor=ex) as rc:
        dm = rc.device_module
        s = dm.Stream()
        with dm.stream(s):
            a = torch.arange(6, dtype=torch.float32).reshape(2, 3)
            b = a.t() @ a
            idx = torch.tensor([1, 0])
            c = a[idx].sum(0)
        assert b.shape == (3, 3) and c.shape == (3,)
        assert ex.pending() > 0                        # nothing ran yet: s is slower than the host
        s.synchronize()
        assert ex.pending() == 0
        assert torch.equal(c, torch.tensor([3.0, 5.0, 7.0]))
        assert b[0, 0].item() == 9.0


def test_item_and_data_dependent_shapes_drain_their_stream():
    ex = AdversarialExecutor({})
    with racecheck.session(device="sim", executor=ex) as rc:
        x = torch.zeros(5)
        x[1] = 4.0
        x[3] = 2.0
        nz = torch.nonzero(x)                          # data-dependent shape: drains the stream
        assert nz.reshape(-1).tolist() == [1, 3]
        assert (x.sum() + 1).item() == 7.0
    assert not rc.internal_errors


def test_host_calls_that_read_no_tensor_do_not_drain_a_slow_stream():
    # dtype promotion and profiler ranges return Python values without touching device memory
    ex = AdversarialExecutor({"priorities": {"#0": -1}, "host": 0})
    with racecheck.session(device="sim", executor=ex, route_cuda=True):
        x = torch.zeros(4, device="cuda")
        torch.cuda.synchronize()
        x.add_(1)
        queued = ex.pending()
        assert queued
        assert torch.promote_types(torch.int32, torch.int64) is torch.int64
        with torch.profiler.record_function("step"):
            pass
        assert ex.pending() >= queued         # nothing ran: the add still waits for its turn
        torch.cuda.synchronize()
        assert x.tolist() == [1.0] * 4
    assert not ex.stats["sync_fallback"]


def test_pinned_host_reads_before_the_copy_runs_see_the_old_value():
    ex = AdversarialExecutor({})
    with racecheck.session(device="sim", executor=ex) as rc:
        dm = rc.device_module
        x = torch.full((4,), 3.0)
        h = torch.zeros(4, pin_memory=True)
        dm.synchronize()
        h.copy_(x, non_blocking=True)
        early = h[0].item()                            # a host read of pinned memory: no sync
        dm.synchronize()
        late = h[0].item()
    assert (early, late) == (0.0, 3.0)
    assert set(pairs(rc.findings)) == {("RC004", "unnamed tensor (storage #2, bytes 0..15)")} \
        or any(f.rule == "RC004" for f in rc.findings)


def test_seeded_random_ops_draw_the_same_numbers_in_any_order():
    def program(dm):
        s = dm.Stream()
        g = torch.Generator().manual_seed(7)
        torch.manual_seed(3)
        with dm.stream(s):
            a = torch.randn(4, 4)
            b = torch.empty(8).normal_(generator=g)
        c = torch.rand(3)
        dm.synchronize()
        return torch.cat([a.reshape(-1), b, c])

    with racecheck.session(device="sim") as rc:
        ref = program(rc.device_module).clone()
    for plan in ({}, {"priorities": {"#1": 0, "#0": 3}, "host": 1}, {"host": 5}):
        with racecheck.session(device="sim", executor=AdversarialExecutor(plan)) as rc:
            got = program(rc.device_module).clone()
        assert torch.equal(got, ref), plan


def test_a_dropped_tensor_is_freed_where_the_program_dropped_it():
    """RC005 depends on where the Free lands relative to later stream waits: queued work that
    still holds the storage must not move it (here the finding exists only if it does not move)."""
    def program(dm):
        s = dm.Stream()
        t = racecheck.name(torch.ones(64), "t")       # allocated on the default stream
        s.wait_stream(dm.current_stream())
        with dm.stream(s):
            u = t * 2                                  # used on s, no record_stream
        del t                                          # freed here, s's read unordered ...
        v = torch.zeros(64)                            # ... and the pool's stream goes on: RC005
        dm.current_stream().wait_stream(s)             # orders it only after that
        dm.synchronize()
        return u, v

    with racecheck.session(device="sim") as rc:
        program(rc.device_module)
    eager = set(pairs(rc.findings))
    assert ("RC005", "t") in eager
    for plan in ({}, {"host": 3}, {"priorities": {"#1": 3}, "host": 0}):
        ex = AdversarialExecutor(plan)
        with racecheck.session(device="sim", executor=ex) as rc:
            program(rc.device_module)
        assert set(pairs(rc.findings)) == eager, plan


def test_an_op_that_fails_when_its_turn_comes_is_a_fault_not_a_crash():
    ex = AdversarialExecutor({"priorities": {"#0": 3, "#1": 0}, "host": 1})
    with racecheck.session(device="sim", executor=ex) as rc:
        dm = rc.device_module
        s = dm.Stream()
        table = torch.arange(8.0)
        with dm.stream(s):
            idx = torch.tensor([2, 3]) + 0             # produced on s, still queued ...
        out = table[idx]                               # ... read on the default stream: poison index
        del out
    assert ex.faults and ex.faults[0]["op"] == "index"
    assert any(f.rule == "RC001" for f in rc.findings)


def test_graph_replays_queue_like_ops():
    ex = AdversarialExecutor({})
    with racecheck.session(device="sim", executor=ex) as rc:
        dm = rc.device_module
        inp = torch.ones(4)
        out = torch.zeros(4)
        g = dm.CUDAGraph()
        with dm.graph(g):
            out.copy_(inp * 2)
        inp.fill_(5)
        g.replay()
        assert ex.pending() >= 2
        dm.synchronize()
        assert out.tolist() == [10.0] * 4
    assert ex.stats["launches"] == 1


def test_plans_are_validated():
    assert normalize_plan(None)["holds"] == []
    assert normalize_plan({"priorities": [0, 2]})["priorities"] == {"#0": 0, "#1": 2}
    for bad in ([1], {"bogus": 1}, {"priorities": 3}, {"host": "x"},
                {"holds": [{"stream": "s", "us": 1}]}, {"holds": [{"stream": "s", "op": "a", "before_op": 1, "us": 1}]},
                {"holds": {"stream": "s"}}):
        with pytest.raises(PlanError):
            normalize_plan(bad)


@pytest.mark.parametrize("hold", [
    {"stream": "s", "before_op": 1, "us": -5},            # negative length
    {"stream": "s", "before_op": -1, "us": 5},            # not a launch count
    {"stream": "s", "before_op": 1.5, "us": 5},
    {"stream": "s", "before_op": 1, "us": 5, "extra": 1},  # unknown key
    {"stream": True, "before_op": 1, "us": 5},
])
def test_plan_holds_are_checked_as_strictly_as_delay_plans(hold):
    """One validation for holds: what a GPU delay plan rejects, a sim plan rejects too."""
    with pytest.raises(DelayPlanError):
        normalize_holds([hold])
    with pytest.raises(PlanError):
        normalize_plan({"holds": [hold]})


def test_plan_holds_take_the_delay_plans_canonical_form():
    hold = {"stream": 2, "before_op": 3, "us": 50}
    assert normalize_plan({"holds": [hold]})["holds"] == normalize_holds([hold]) == [
        {"stream": "#2", "us": 50.0, "before_op": 3}]


def test_plans_strategy_round_trips_through_json():
    import json

    @settings(max_examples=50, database=None, derandomize=True)
    @given(plan=rs.plans())
    def check(plan):
        assert normalize_plan(json.loads(json.dumps(plan))) == normalize_plan(plan)
    check()


def test_stream_names_and_creation_indices_address_the_same_stream():
    program = EXPECTED["P01"][0]

    def named(dm, device):
        s = dm.Stream()
        racecheck.active_session().name_stream(s, "producer")
        x = racecheck.name(torch.zeros(8), "x")
        dm.synchronize()
        with dm.stream(s):
            x.add_(1)
        return {"y": x * 2}

    by_index = _run(named, {"holds": [{"stream": "#1", "before_op": 0, "us": 50}]})[1]
    by_name = _run(named, {"holds": [{"stream": "producer", "before_op": 0, "us": 50}]})[1]
    assert _equal(by_index, by_name)
    assert not _equal(by_index, _run(program, eager=True)[1] | {"y": torch.full((8,), 2.0)})


def test_threads_share_one_executor():
    got, values, rc, ex = _run(p27_value, {"priorities": {"#2": 3}, "host": 1})
    assert ("RC001", "x") in got and not rc.internal_errors


def test_a_plan_from_serving_leaves_start_up_in_issue_order():
    """`from: serving`: until the program's `serving()` signal device work runs as issued (an
    engine's start-up); from then on the plan orders it."""
    late_producer = {"holds": [{"stream": "#1", "before_op": 0, "us": 50}]}
    program = EXPECTED["P01"][0]
    eager = _run(program, eager=True)[1]
    assert not _equal(_run(program, late_producer)[1], eager)
    # never signalled: the whole program is start-up, so it runs in issue order
    assert _equal(_run(program, dict(late_producer, **{"from": "serving"}))[1], eager)

    def serving_first(dm, device):
        dm_ex = ex_box[0]
        dm_ex.serving()
        return program(dm, device)
    ex_box = []
    ex = AdversarialExecutor(dict(late_producer, **{"from": "serving"}))
    ex_box.append(ex)
    with racecheck.session(device="sim", executor=ex) as rc:
        keep = serving_first(rc.device_module, "cpu")
    values = {k: v.clone() for k, v in sorted(keep.items()) if isinstance(v, torch.Tensor)}
    assert not _equal(values, eager), "after serving() the hold applies"


def test_plan_from_is_validated_and_canonical():
    assert "from" not in normalize_plan({"from": "start"})
    assert normalize_plan({"from": "serving"})["from"] == "serving"
    with pytest.raises(PlanError, match="'from'"):
        normalize_plan({"from": "later"})
