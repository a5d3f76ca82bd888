"""Hypothesis strategies for everything a fuzz example depends on.

    from racecheck.drivers.fuzz import strategies as rs
    rs.examples(sc, variant="no-futuremap_publish")    # {"config": {...}, "seed": 0, "plan": {...}}
    rs.configs(sc)                                      # knob overrides
    rs.knob_values(knob)                                # one knob's values, from its type
    rs.plans()                                          # adversarial executor plan
    rs.holds()                                          # a delay plan (also valid on GPUs)

What is specific to a scenario (a request schedule, its graph buckets, a speculative-decoding
shape) comes from the scenario's `strategy()` hook; everything else is drawn here from the knobs'
types. Everything drawn is concrete and JSON-friendly, so a failing example is written out as a
repro record and replayed without Hypothesis.

Shrinking. Hypothesis shrinks the choice sequence in order, earlier choices first, toward the first
branch of `one_of`/`sampled_from`, toward 0/min for integers and toward short lists. So examples
draw, in this order: whether to explore, the scenario's own draws (for eagle-v2: iterations, the
request schedule with fewest arrivals, fewest requests and shortest lives, the bucket list, the
spec shape), the feature knobs (each shrinks to its default), the fix switches (shrink to "fix
on"), and last the executor plan (shrinks to no priorities, no change points, no holds: device
work in issue order). A minimal failing example is then: fewest iterations and requests,
smallest batch, everything else at its default, and the simplest schedule of streams that still
shows the bug.
"""
from __future__ import annotations

from hypothesis import strategies as st

__all__ = ["knob_values", "switches", "plans", "holds", "configs", "examples", "HOLD_US"]

# Hold lengths (microseconds): log-spaced, as a GPU needs >= ~100 us to expose a late producer.
HOLD_US = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000)
MAX_STREAMS = 6


def knob_values(knob) -> st.SearchStrategy:
    """Values of one knob, shrinking toward its default ("auto" included)."""
    t = knob.type
    d = knob.default
    # one_of(just(default), everything): the default 50% of the time plus its share of the rest,
    # so most examples run the configured pipeline and the rest explore around it.
    if t == "bool":
        if isinstance(d, bool):
            return st.one_of(st.just(d), st.sampled_from([d, not d]))
        return st.one_of(st.just(d), st.booleans())
    if t == "choice":
        choices = list(knob.choices)
        if d in choices:
            choices.remove(d)
            choices.insert(0, d)
            return st.one_of(st.just(d), st.sampled_from(choices))
        return st.sampled_from(choices)
    if t == "int":
        lo = knob.minimum if knob.minimum is not None else 0
        hi = knob.maximum if knob.maximum is not None else lo + 8
        if isinstance(d, int) and not isinstance(d, bool) and lo <= d <= hi:
            return st.one_of(st.just(d), st.integers(lo, hi))
        if d is not None and not isinstance(d, int):
            return st.one_of(st.just(d), st.integers(lo, hi))
        return st.integers(lo, hi)
    return st.just(d)


def switches(sc, *, draw: bool = False, fixed: dict | None = None) -> st.SearchStrategy:
    """Fix switches: the given values (a variant's), else on, or drawn (each shrinking to on, so a
    minimal example turns off only the fixes it needs off).

    "On" is True even where the knob's default is "auto" (a fix the engine applies on some devices
    only): all fixes on means every fix applied, on every device flavour.
    """
    fixed = dict(fixed or {})
    names = list(sc.switches)
    if not draw:
        return st.just({n: fixed.get(n, True) for n in names})
    parts = {n: (st.just(fixed[n]) if n in fixed else st.sampled_from([True, False])) for n in names}
    return st.fixed_dictionaries(parts)


@st.composite
def holds(draw, *, max_holds: int = 2, max_streams: int = MAX_STREAMS, names=()):
    """A delay plan: which stream is held back, before which of its launches, for how long."""
    streams = [f"#{k}" for k in range(max_streams)] + [str(n) for n in names]
    out = []
    for _ in range(draw(st.integers(0, max_holds))):
        out.append({"stream": draw(st.sampled_from(streams)),
                    "before_op": draw(st.one_of(st.integers(0, 15), st.integers(0, 400))),
                    "us": draw(st.sampled_from(HOLD_US))})
    return out


@st.composite
def plans(draw, *, max_streams: int = MAX_STREAMS, max_change_points: int = 2, max_step: int = 3000,
          max_holds: int = 2):
    """An adversarial-executor plan (PCT): stream and host priorities, change points, holds.

    Priorities are per stream creation index ("#k"); a stream ranked above the host runs as soon
    as it has work, one ranked at or below it only when the host waits. Depth-d bugs need d-1
    change points (PCT); two cover the depth-3 bugs controlled-scheduling studies report.
    """
    prios = draw(st.lists(st.integers(0, 3), max_size=max_streams))
    host = draw(st.integers(0, 3))
    cps = draw(st.lists(st.one_of(st.integers(1, 64), st.integers(1, max_step)),
                        max_size=max_change_points, unique=True))
    hh = draw(holds(max_holds=max_holds, max_streams=max_streams))
    return {"priorities": {f"#{k}": p for k, p in enumerate(prios) if p}, "host": host,
            "change_points": sorted(cps), "holds": hh}


def _kept_shape(draw, sc, variant, base: dict) -> dict:
    """For a scenario whose examples share an engine per shape (`sc.shape_knobs`: the knobs its
    engine is built from, racecheck/drivers/fuzz/engines.py), an exploring example varies that
    shape only one time in `sc.shape_odds` and otherwise only the traffic: the configured shape's
    values, to hold like fixed ones. Drawn as one integer that shrinks toward keeping the shape."""
    shape = [k for k in getattr(sc, "shape_knobs", ()) if k in sc.knobs and k not in base]
    odds = int(getattr(sc, "shape_odds", 1))
    if not shape or odds <= 1 or draw(st.integers(0, odds - 1)) == odds - 1:
        return {}
    configured = sc.config(variant, base)
    return {k: configured[k] for k in shape}


@st.composite
def configs(draw, sc, variant=None, *, draw_switches: bool = False, fixed: dict | None = None):
    """Knob overrides for `sc.config(variant, overrides)`: the scenario's own draws (its
    `strategy()` hook), feature knobs, switches.

    First one choice, whether to explore: about half the examples vary the feature knobs (and the
    scenario's shape), the other half run the configured pipeline; drawn first, so shrinking
    drops every deviation the failure does not need in one step.
    """
    drawn = set(sc.drawn_knobs)
    base = {}
    if variant:
        base.update({k: v for k, v in sc.variant(variant).overrides.items() if k not in drawn})
    base.update(fixed or {})
    explore = draw(st.booleans())
    keep = _kept_shape(draw, sc, variant, base) if explore else {}
    own = sc.strategy(dict(base, **keep), explore)
    cfg = dict(draw(own)) if own is not None else {}
    switch_names = set(sc.switches)
    if explore:
        for name, knob in sc.knobs.items():
            if name in drawn or name in switch_names or name in base or name in keep:
                continue
            value = draw(knob_values(knob))
            if value != knob.default:     # a default set explicitly would undo what a variant
                cfg[name] = value          # sets otherwise (its dropped synchronization sites)
    sw = draw(switches(sc, draw=draw_switches, fixed={k: v for k, v in base.items() if k in switch_names}))
    cfg.update({k: v for k, v in sw.items() if k not in base})
    cfg.update(base)
    return cfg


@st.composite
def examples(draw, sc, variant=None, *, device: str = "sim", draw_switches: bool = False,
             fixed: dict | None = None, draw_plan: bool = True):
    """One fuzz example: {"config": knob overrides, "seed": 0, "plan": executor plan or None}.

    On sim the plan is a whole adversarial-executor plan (from the program's start, or, for a
    scenario with `plan_from = "serving"`, from its engine's first request); on a GPU/NPU only
    its holds are drawn (a delay plan: `racecheck.session(delay_plan=...)` sleeps on the held
    streams)."""
    cfg = draw(configs(sc, variant, draw_switches=draw_switches, fixed=fixed))
    plan = None
    if draw_plan:
        if device == "sim":
            # one_of(empty, drawn): the shrinker drops a plan the failure does not need in one step
            plan = draw(st.one_of(st.just(None), plans())) or {
                "priorities": {}, "host": 0, "change_points": [], "holds": []}
            if getattr(sc, "plan_from", "start") == "serving":
                plan = dict(plan, **{"from": "serving"})      # the engine's start-up in order
        else:   # a real device schedules itself: draw only the delays (slept on the streams)
            plan = {"priorities": {}, "host": 0, "change_points": [], "holds": draw(holds())}
    return {"config": cfg, "seed": 0, "plan": plan}
