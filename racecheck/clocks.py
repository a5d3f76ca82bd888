"""Vector clocks: plain dicts timeline -> counter, and the few operations the checker needs.

A missing entry means 0. Clocks are mutable dicts on purpose: the checker joins in place on the
hot path and copies only where a snapshot is needed (event records, new host threads).
"""
from __future__ import annotations

VectorClock = dict  # dict[int, int]


def join(dst: dict, src: dict) -> bool:
    """dst ⊔= src (pointwise max) in place; True when dst changed."""
    changed = False
    get = dst.get
    for k, v in src.items():
        if v > get(k, 0):
            dst[k] = v
            changed = True
    return changed


def joined(a: dict, b: dict) -> dict:
    """A new clock a ⊔ b."""
    out = dict(a)
    join(out, b)
    return out


def leq(a: dict, b: dict) -> bool:
    """a ⊑ b: every component of a is <= the one of b (a happens-before-or-equals b)."""
    get = b.get
    return all(v <= get(k, 0) for k, v in a.items())


def ordered(timeline: int, clock: int, vc: dict) -> bool:
    """Is the epoch (timeline, clock) ordered before the point whose clock is `vc`?"""
    return clock <= vc.get(timeline, 0)


def concurrent(a: dict, b: dict) -> bool:
    """Neither a ⊑ b nor b ⊑ a."""
    return not leq(a, b) and not leq(b, a)
