"""What the fuzzer draws for eagle-v2 itself: the request schedule, graph buckets, spec shape.

The rest (feature knobs, fix switches, executor plans) is drawn generically from the knobs'
types (racecheck.drivers.fuzz.strategies). Which batch pattern exposes a variant's bug, and the smallest
one, is what fuzzing finds: these knobs are drawn even for a variant that sets them.
"""
from __future__ import annotations

from hypothesis import strategies as st

from ..serving import MAX_ITERATIONS, schedules, spec_params


@st.composite
def overrides(draw, sc, fixed: dict, explore: bool):
    """The schedule over the graph buckets always; the spec shape too when exploring."""
    buckets = list(fixed.get("buckets") or sc.knobs["buckets"].default)
    if isinstance(buckets, str):
        buckets = [int(x) for x in buckets.split(",") if x.strip()]
    k_it = sc.knobs["iterations"]
    max_it = min(k_it.maximum, MAX_ITERATIONS) if k_it.maximum else MAX_ITERATIONS
    sched = draw(schedules(buckets, max_iterations=max_it))
    cfg = {k: sched[k] for k in ("iterations", "schedule") if k not in fixed}
    if "buckets" not in fixed:
        cfg["buckets"] = buckets
    if explore:
        cfg.update({k: v for k, v in draw(spec_params(sc)).items() if k not in fixed})
    return cfg
