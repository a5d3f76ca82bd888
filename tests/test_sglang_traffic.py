"""Traffic phases: one running engine sees one burst of requests after another (requests.py,
server.Feeder), without importing sglang (the Feeder's request factory is injectable)."""
import types

import pytest

from racecheck.scenarios.sglang.requests import format_arrivals, parse_arrivals, phases
from racecheck.scenarios.sglang.server import Arrival, Feeder


def test_phases_parse_and_format():
    groups = parse_arrivals("0:3x6|0:2x4;1:1x2+4")
    assert [(g.phase, g.step, g.count) for g in groups] == [(0, 0, 3), (1, 0, 2), (1, 1, 1)]
    assert format_arrivals(groups) == "0:3x6|0:2x4;1:1x2+4"
    assert [len(p) for p in phases(groups)] == [1, 2]
    assert format_arrivals(parse_arrivals("0:1x6+14;3:1x8+3")) == "0:1x6+14;3:1x8+3"
    with pytest.raises(ValueError, match="phase 2 of 2 has no requests"):
        parse_arrivals("0:1x2|")


class _Outputs:
    def __init__(self):
        self.finished = set()

    def drain(self):
        pass


def _feeder(text, max_steps=80):
    groups = parse_arrivals(text)
    arrivals, n = [], 0
    for g in groups:
        for _ in range(g.count):
            arrivals.append(Arrival(g.step, f"r{n}", [1, 2, 3], g.max_new_tokens, g.phase))
            n += 1
    out = _Outputs()
    return Feeder(arrivals, out, max_steps=max_steps, stop_token=-1,
                  make=lambda a, stop: a.rid), out


def test_a_phase_starts_after_the_last_one_finished():
    feeder, out = _feeder("0:2x4;2:1x1|0:1x2;1:1x2")
    sched = types.SimpleNamespace(gracefully_exit=False)
    seen = [feeder.arrivals(sched) for _ in range(3)]
    assert seen == [["r0", "r1"], [], ["r2"]]
    out.finished |= {"r0", "r1"}
    assert feeder.arrivals(sched) == []            # r2 still runs: phase 2 waits
    out.finished.add("r2")
    assert feeder.arrivals(sched) == ["r3"]        # step 4: phase 2 starts, its step 0
    assert feeder.arrivals(sched) == ["r4"]        # its step 1
    assert feeder.phase_starts == [0, 4]
    out.finished |= {"r3", "r4"}
    assert feeder.arrivals(sched) == [] and sched.gracefully_exit


def test_max_steps_counts_per_phase():
    feeder, out = _feeder("0:1x4|0:1x1", max_steps=3)
    sched = types.SimpleNamespace(gracefully_exit=False)
    assert feeder.arrivals(sched) == ["r0"]
    out.finished.add("r0")
    assert feeder.arrivals(sched) == ["r1"]        # phase 2 from step 1
    feeder.arrivals(sched)
    feeder.arrivals(sched)
    assert not sched.gracefully_exit               # 3 steps into phase 2, not yet 3 past it
    feeder.arrivals(sched)
    assert sched.gracefully_exit


def test_drawn_plans_for_the_engine_start_at_serving():
    from hypothesis import HealthCheck, given, settings

    from racecheck import scenarios
    from racecheck.drivers.fuzz import strategies as rs
    seen = []

    @settings(max_examples=30, database=None, derandomize=True, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(ex=rs.examples(scenarios.get("sglang-eagle-v2")))
    def draw(ex):
        seen.append(ex["plan"])
    draw()
    assert seen and all(p.get("from") == "serving" for p in seen)
