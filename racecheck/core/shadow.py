"""Shadow memory: bounded per-byte-segment access history, FastTrack style.

Each storage (allocation) has a `StorageShadow`: sorted, contiguous segment boundaries
`bounds[0] < bounds[1] < ... < bounds[n]` and `states[k]` for the bytes [bounds[k], bounds[k+1]).
A state is `None` (bytes never accessed: a gap) or a two-item list `[last_write, reads]` where
`last_write` is an access record or None and `reads` a dict timeline -> access record (at most one
read per timeline: a later read on the same timeline replaces the earlier).

Segments are split only where access boundaries fall, so the common case (a whole contiguous
tensor accessed again and again) is one segment found with one bisect. Writes that cover several
segments collapse them into one, and merge with equal neighbours, so state stays flat.

Also here: small helpers on interval lists (sorted, disjoint, half-open `(lo, hi)` tuples).
"""
from __future__ import annotations

from bisect import bisect_left, bisect_right


def _copy_state(s):
    return None if s is None else [s[0], dict(s[1])]


class StorageShadow:
    __slots__ = ("storage", "bounds", "states", "readers", "seen")

    def __init__(self, storage: int, readers=None):
        self.storage = storage
        self.bounds: list = []
        self.states: list = []
        # graphs reading this storage: list of (graph id, _GraphInput) shared with the checker
        self.readers = readers
        # quick dedup keys of races already reported on this storage (dropped with the storage)
        self.seen = None

    def __len__(self):
        return len(self.states)

    def _cut(self, x: int) -> int:
        """Make x a boundary; return its index in bounds."""
        b = self.bounds
        i = bisect_left(b, x)
        n = len(b)
        if i < n and b[i] == x:
            return i
        if i == 0:
            b.insert(0, x)
            self.states.insert(0, None)
            return 0
        if i == n:
            b.append(x)
            self.states.append(None)
            return i
        b.insert(i, x)
        st = self.states
        st.insert(i, _copy_state(st[i - 1]))
        return i

    def span(self, lo: int, hi: int):
        """Segment indices [i, j) covering exactly [lo, hi) (lo < hi), splitting as needed."""
        b = self.bounds
        n = len(b)
        i = bisect_left(b, lo)
        if i < n and b[i] == lo:
            if i + 1 < n and b[i + 1] == hi:
                return i, i + 1
            j = bisect_left(b, hi, i + 1)
            if j < n and b[j] == hi:
                return i, j
            return i, self._cut(hi)
        if not n:
            b.append(lo)
            b.append(hi)
            self.states.append(None)
            return 0, 1
        i = self._cut(lo)
        j = self._cut(hi)
        return i, j

    def collapse(self, i: int, j: int, state) -> int:
        """Replace segments [i, j) by one segment holding `state`; merge equal neighbours.

        Returns the index of the resulting segment.
        """
        b, st = self.bounds, self.states
        if j - i > 1:
            del b[i + 1:j]
            del st[i + 1:j]
        st[i] = state
        w = state[0]
        if not state[1]:
            # the right neighbour first, so index i stays valid
            if i + 1 < len(st):
                nb = st[i + 1]
                if nb is not None and nb[0] is w and not nb[1]:
                    del b[i + 1]
                    del st[i + 1]
            if i > 0:
                nb = st[i - 1]
                if nb is not None and nb[0] is w and not nb[1]:
                    del b[i]
                    del st[i]
                    i -= 1
        return i

    def find(self, x: int) -> int:
        """Index of the segment containing byte x, or -1."""
        b = self.bounds
        i = bisect_right(b, x) - 1
        if i < 0 or i >= len(self.states):
            return -1
        return i

    def segments(self):
        """(lo, hi, state) for every accessed segment, in byte order."""
        b = self.bounds
        for k, s in enumerate(self.states):
            if s is not None:
                yield b[k], b[k + 1], s


# ---- interval lists -------------------------------------------------------------------------

def iv_add(ivs: list, lo: int, hi: int) -> list:
    """ivs ∪ [lo, hi), returning a list (ivs itself when already covered)."""
    if lo >= hi:
        return ivs
    n = len(ivs)
    if n == 1:
        a, b = ivs[0]
        if a <= lo and hi <= b:
            return ivs
    elif n == 0:
        return [(lo, hi)]
    # general merge
    out = []
    placed = False
    for a, b in ivs:
        if b < lo:
            out.append((a, b))
        elif hi < a:
            if not placed:
                out.append((lo, hi))
                placed = True
            out.append((a, b))
        else:
            lo, hi = min(lo, a), max(hi, b)
    if not placed:
        out.append((lo, hi))
    return out


def iv_union(x: list, y: list) -> list:
    out = list(x)
    for lo, hi in y:
        out = iv_add(out, lo, hi)
    return out


def iv_intersect(x, y) -> list:
    out = []
    i = j = 0
    while i < len(x) and j < len(y):
        lo = max(x[i][0], y[j][0])
        hi = min(x[i][1], y[j][1])
        if lo < hi:
            out.append((lo, hi))
        if x[i][1] < y[j][1]:
            i += 1
        else:
            j += 1
    return out


def iv_subtract(x, y) -> list:
    out = []
    for lo, hi in x:
        cur = lo
        for a, b in y:
            if b <= cur or a >= hi:
                continue
            if a > cur:
                out.append((cur, a))
            cur = max(cur, b)
            if cur >= hi:
                break
        if cur < hi:
            out.append((cur, hi))
    return out


def iv_normalize(ranges) -> list:
    out: list = []
    for lo, hi in sorted(ranges):
        out = iv_add(out, lo, hi)
    return out
