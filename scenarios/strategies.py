"""Hypothesis strategies for everything a scenario run depends on.

    from racecheck.scenarios import strategies as rs
    rs.examples(sc, variant="no-futuremap_publish")    # {"config": {...}, "seed": 0, "plan": {...}}
    rs.configs(sc)                                      # knob overrides (schedule included)
    rs.schedules(buckets=[1, 2, 4, 8])                  # {"iterations": n, "schedule": "0:+3x2;1:+2"}
    rs.batch_sizes([1, 2, 4, 8])                        # sizes on both sides of every bucket
    rs.spec_params(sc)                                  # {"steps", "topk", "draft_tokens"}
    rs.plans()                                          # adversarial executor plan
    rs.holds()                                          # a delay plan (also valid on GPUs)

Everything drawn is concrete and JSON-friendly, so a failing example is written out as a repro
record and replayed without Hypothesis.

Shrinking. Hypothesis shrinks the choice sequence in order, earlier choices first, toward the first
branch of `one_of`/`sampled_from`, toward 0/min for integers and toward short lists. So examples
draw, in this order: the number of iterations, the request schedule (fewest arrivals, fewest
requests, shortest lives), the bucket list, spec parameters, the feature knobs (each shrinks to
its default), the fix switches (shrink to "fix on"), and last the executor plan (shrinks to no
priorities, no change points, no holds: device work in issue order). A minimal failing example
is then: fewest iterations and requests, smallest batch, everything else at its default, and the
simplest schedule of streams that still shows the bug.
"""
from __future__ import annotations

from hypothesis import strategies as st

__all__ = ["knob_values", "switches", "batch_sizes", "schedules", "spec_params", "plans", "holds",
           "configs", "examples", "HOLD_US", "SPECIAL_KNOBS", "STRUCTURAL_KNOBS"]

# Knobs with a structure of their own (drawn by the strategies below, not from their type).
SPECIAL_KNOBS = ("iterations", "schedule", "buckets", "steps", "topk", "draft_tokens")
# Hold lengths (microseconds): log-spaced, as a GPU needs >= ~100 us to expose a late producer.
HOLD_US = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000)
MAX_STREAMS = 6
MAX_ITERATIONS = 8
# A variant's settings that the fuzzer draws itself: which batch pattern exposes the bug (and the
# smallest one) is what fuzzing finds; the variant's switches and feature flags stay fixed.
STRUCTURAL_KNOBS = ("iterations", "schedule", "buckets", "steps", "topk", "draft_tokens")


def _knob(sc, name):
    return getattr(sc, "knobs", {}).get(name)


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
    names = list(getattr(sc, "switches", ()))
    if not draw:
        return st.just({n: fixed.get(n, True) for n in names})
    parts = {n: (st.just(fixed[n]) if n in fixed else st.sampled_from([True, False])) for n in names}
    return st.fixed_dictionaries(parts)


def batch_sizes(buckets, *, maximum: int | None = None) -> st.SearchStrategy:
    """Batch sizes on both sides of every graph bucket (so padding happens), smallest first."""
    buckets = sorted({int(b) for b in buckets}) or [1]
    top = maximum if maximum is not None else buckets[-1]
    cand = set()
    for b in buckets:
        cand.update((b - 1, b, b + 1))
    cand = sorted(c for c in cand if 1 <= c <= top)
    return st.one_of(st.sampled_from(cand), st.integers(1, top)) if cand else st.integers(1, top)


def _format_schedule(arrivals) -> str:
    return ";".join(f"{i}:+{c}" + (f"x{life}" if life else "") for i, c, life in arrivals)


SCHEDULE_PATTERNS = ("independent", "shrink-in-bucket", "join-after-finish")


@st.composite
def schedules(draw, buckets=(1, 2, 4, 8), *, max_iterations: int = MAX_ITERATIONS,
              max_arrivals: int = 3, capacity: int | None = None):
    """{"iterations": n, "schedule": "ITER:+COUNT[xLIFE];..."}: requests joining and finishing.

    The number of iterations is drawn first, then a pattern (shrinking toward "independent"):
      independent        groups arrive anywhere with any lifetime;
      join-after-finish  a group finishes and a new one joins right after, taking over its rows
                         and KV slots while the forward that still ran the old one may be in flight;
      shrink-in-bucket   two groups share a graph bucket and one finishes: the smaller batch
                         replays in the same bucket, so its padding rows keep stale entries.
    A pattern raises the iteration count to what it needs. More groups may join anywhere. Counts
    straddle the buckets (padding); total requests stay within `capacity` (the largest bucket by
    default); the first group arrives at iteration 0.
    """
    cap = capacity if capacity is not None else max(buckets)
    bs = sorted({int(b) for b in buckets})
    n = draw(st.integers(1, max_iterations))
    # the risky patterns twice as likely as "independent" (which stays the shrink target)
    pattern = draw(st.sampled_from(SCHEDULE_PATTERNS + SCHEDULE_PATTERNS[1:]))
    arrivals = []
    if pattern == "join-after-finish" and cap >= 2:
        c = draw(batch_sizes(bs, maximum=cap - 1))
        life = draw(st.integers(1, 2))
        join = life + draw(st.integers(1, 2))
        c2 = draw(st.integers(1, cap - c))
        arrivals += [(0, c, life), (join, c2, None)]
        n = max(n, join + 2)
    elif pattern == "shrink-in-bucket" and cap >= 2:
        def lower_of(b):
            return max([x for x in bs if x < b] or [0])
        big = [b for b in bs if b <= cap and b - lower_of(b) >= 2]    # room for two sizes
        if big:
            b = draw(st.sampled_from(big))
            lower = lower_of(b)
            total = draw(st.integers(lower + 2, b))                    # both sizes in bucket b
            stay = draw(st.integers(lower + 1, total - 1))
            life = draw(st.integers(1, 2))
            arrivals += [(0, stay, None), (0, total - stay, life)]
            n = max(n, life + 2)
    used = sum(c for _, c, _ in arrivals)
    lo = 0 if arrivals else 1
    for _ in range(draw(st.integers(lo, max(lo, max_arrivals - len(arrivals))))):
        if used >= cap:
            break
        it = 0 if not arrivals else draw(st.one_of(st.just(0), st.integers(0, n - 1)))
        c = draw(batch_sizes(bs, maximum=cap - used))
        life = draw(st.one_of(st.none(), st.integers(1, 2), st.integers(1, n)))
        arrivals.append((it, c, life))
        used += c
    # a lifetime reaching the horizon is no lifetime: one canonical form per schedule (shrinks cleanly)
    arrivals = [(i, c, life if life is not None and i + life < n else None) for i, c, life in arrivals]
    arrivals.sort(key=lambda a: a[0])
    return {"iterations": n, "schedule": _format_schedule(arrivals)}


@st.composite
def spec_params(draw, sc=None):
    """Speculative-decoding shape: steps, topk (1 = chain, >1 = tree) and draft tokens."""
    k_steps, k_topk, k_draft = _knob(sc, "steps"), _knob(sc, "topk"), _knob(sc, "draft_tokens")
    steps_d = k_steps.default if k_steps is not None and isinstance(k_steps.default, int) else 3
    steps_hi = k_steps.maximum if k_steps is not None and k_steps.maximum else 4
    steps = draw(st.one_of(st.just(steps_d), st.integers(1, max(steps_hi, steps_d))))
    topks = [1, 2, 4]
    if k_topk is not None and k_topk.type == "choice":
        topks = [int(c) for c in k_topk.choices]
    if k_topk is not None and isinstance(k_topk.default, int) and k_topk.default in topks:
        topks.remove(k_topk.default)
        topks.insert(0, k_topk.default)
    topk = draw(st.sampled_from(topks))
    out = {"steps": steps, "topk": topk}
    if k_draft is None or k_draft.default == "auto":
        if topk == 1:
            out["draft_tokens"] = "auto" if k_draft is not None else steps + 1
        else:
            out["draft_tokens"] = draw(st.one_of(st.just("auto"), st.integers(2, steps * topk + 1)))
    else:
        out["draft_tokens"] = steps + 1 if topk == 1 else draw(st.integers(2, steps * topk + 1))
    return out


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


@st.composite
def configs(draw, sc, variant=None, *, draw_switches: bool = False, fixed: dict | None = None):
    """Knob overrides for `sc.config(variant, overrides)`: schedule, buckets, spec, features, switches."""
    fixed = dict(fixed or {})
    base = {}
    if variant:
        base.update({k: v for k, v in sc.variant(variant).overrides.items() if k not in STRUCTURAL_KNOBS})
    base.update(fixed)
    knobs = dict(getattr(sc, "knobs", {}))
    cfg = {}
    bucket_knob = knobs.get("buckets")
    buckets = list(base.get("buckets") or (bucket_knob.default if bucket_knob is not None else [1, 2, 4, 8]))
    if isinstance(buckets, str):
        buckets = [int(x) for x in buckets.split(",") if x.strip()]
    if "iterations" in knobs or "schedule" in knobs:
        k_it = knobs.get("iterations")
        max_it = min(k_it.maximum, MAX_ITERATIONS) if k_it is not None and k_it.maximum else MAX_ITERATIONS
        sched = draw(schedules(buckets, max_iterations=max_it))
        if "iterations" in knobs and "iterations" not in base:
            cfg["iterations"] = sched["iterations"]
        if "schedule" in knobs and "schedule" not in base:
            cfg["schedule"] = sched["schedule"]
    if bucket_knob is not None and "buckets" not in base:
        cfg["buckets"] = buckets
    # Explore the knobs (spec shape, features) in about half the examples; the other half run the
    # configured pipeline. Drawn as one choice first, so that shrinking drops every deviation the
    # failure does not need in one step.
    explore = draw(st.booleans())
    switch_names = set(getattr(sc, "switches", ()))
    if explore:
        if any(k in knobs for k in ("steps", "topk", "draft_tokens")):
            sp = draw(spec_params(sc))
            for k, v in sp.items():
                if k in knobs and k not in base:
                    cfg[k] = v
        for name, knob in knobs.items():
            if name in SPECIAL_KNOBS or name in switch_names or name in base:
                continue
            cfg[name] = draw(knob_values(knob))
    sw = draw(switches(sc, draw=draw_switches, fixed={k: v for k, v in base.items() if k in switch_names}))
    cfg.update({k: v for k, v in sw.items() if k not in base})
    cfg.update(base)
    return cfg


@st.composite
def examples(draw, sc, variant=None, *, device: str = "sim", draw_switches: bool = False,
             fixed: dict | None = None, draw_plan: bool = True):
    """One fuzz example: {"config": knob overrides, "seed": 0, "plan": executor plan or None}.

    On sim the plan is a whole adversarial-executor plan; on a GPU/NPU only its holds are drawn
    (a delay plan: `racecheck.session(delay_plan=...)` sleeps on the held streams)."""
    cfg = draw(configs(sc, variant, draw_switches=draw_switches, fixed=fixed))
    plan = None
    if draw_plan:
        if device == "sim":
            # one_of(empty, drawn): the shrinker drops a plan the failure does not need in one step
            plan = draw(st.one_of(st.just(None), plans())) or {
                "priorities": {}, "host": 0, "change_points": [], "holds": []}
        else:   # a real device schedules itself: draw only the delays (slept on the streams)
            plan = {"priorities": {}, "host": 0, "change_points": [], "holds": draw(holds())}
    return {"config": cfg, "seed": 0, "plan": plan}
