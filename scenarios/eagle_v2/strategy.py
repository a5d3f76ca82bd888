"""What the fuzzer draws for eagle-v2 itself: the request schedule, graph buckets, spec shape.

The rest (feature knobs, fix switches, executor plans) is drawn generically from the knobs'
types (racecheck.fuzz.strategies). Which batch pattern exposes a variant's bug, and the smallest
one, is what fuzzing finds: these knobs are drawn even for a variant that sets them.
"""
from __future__ import annotations

from hypothesis import strategies as st

from ..batching import MAX_ITERATIONS, schedules

def _knob(sc, name):
    return sc.knobs.get(name)


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
