"""Hypothesis strategies for a serving loop's shape, for scenarios' `strategy()` hooks.

    from racecheck.scenarios import serving
    serving.schedules(buckets=[1, 2, 4, 8])       # {"iterations": n, "schedule": "0:+3x2;1:+2"}
    serving.batch_sizes([1, 2, 4, 8])             # sizes on both sides of every bucket
    serving.spec_params(sc)                       # {"steps", "topk", "draft_tokens"}

Requests join and finish over the iterations of a decode loop, and batch sizes straddle the
CUDA-graph buckets so that padding happens: the patterns behind stale-row and reuse races.
Schedules are text in the `ITER:+COUNT[xLIFE];...` form a scenario's `schedule` knob parses.
"""
from __future__ import annotations

from hypothesis import strategies as st

__all__ = ["batch_sizes", "schedules", "spec_params", "SCHEDULE_PATTERNS", "MAX_ITERATIONS"]

MAX_ITERATIONS = 8


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
