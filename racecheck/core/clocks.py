"""Vector clocks: plain dicts timeline -> counter, and the operations the checker needs.

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


def ordered(timeline: int, clock: int, vc: dict) -> bool:
    """Is the epoch (timeline, clock) ordered before the point whose clock is `vc`?"""
    return clock <= vc.get(timeline, 0)

