"""A captured graph's replay footprint: every replay merged into shadow memory in one step.

Replaying a graph used to run the shadow-memory update once per captured op. All of a replay's
accesses share one timeline and one clock, so none of them can race with another; a replay can
only race with what its bytes held before it. `ReplayPlan` precomputes, per storage, the union
of the captured ops' byte intervals (the replay footprint) and, for each interval, the ops'
ranges in the order the per-op update visits them.

The checker merges a replay when the graph has at least `Checker.merge_min_accesses` captured
accesses (byte ranges) per interval: merging an interval costs about what two or three per-op
accesses cost, so a graph whose ops each touch their own buffers once gains nothing, while one
whose ops keep coming back to the same buffers (a workspace, a residual stream) replays in time
proportional to its intervals instead of its accesses.

At a replay, `Checker._replay_merged` first reads the shadow state under every interval without
changing it: if any earlier access there is unordered with the replaying stream (a race the
per-op update would note), or a graph write there could make an RC007 candidate, the replay
takes the per-op path, unchanged. Otherwise the per-op update could not note anything, and its
result is a function of the segment boundaries inside the interval and of which of those
segments were never accessed: `simulate` runs the per-op update once on stand-in states for
that structure and records the result as a recipe (new boundaries; per segment, where its last
write and its reads come from: an earlier state or captured op k). Recipes are cached per
interval and structure, so a steady replay loop simulates once and then rebuilds each interval
with one slice assignment, one record per captured op shared by every segment that op wrote or
read last (the attribution findings quote: op name, stack, clock, trace position). An interval
that still has the boundaries its previous replay left, and whose recipe gives them back
(`stable_form`), is updated in place, segment by segment, as the per-op update does.

The result is the state the per-op update leaves, segment for segment: same boundaries, same
record objects shared between the same segments, same read order per segment.
"""
from __future__ import annotations

from bisect import bisect_left

from racecheck.core.shadow import StorageShadow, iv_add

RECIPES_KEPT = 8        # recipes cached per interval; beyond this the cache starts over


class _Interval:
    """One interval of a storage's replay footprint and the captured accesses inside it."""

    __slots__ = ("lo", "hi", "actions", "has_write", "recipes", "stables", "stable")

    def __init__(self, lo, hi):
        self.lo = lo
        self.hi = hi
        self.actions = []        # (op index, is_write, lo, hi) in per-op update order
        self.has_write = False
        self.recipes = {}        # structure key -> (inner boundaries, cells)
        self.stables = {}        # structure key -> stable_form of its recipe
        self.stable = None       # stable_form of the last replay's result


class _StoragePlan:
    __slots__ = ("storage", "intervals", "written", "born")

    def __init__(self, storage):
        self.storage = storage
        self.intervals = []      # _Interval, by address
        self.written = []        # union of the graph's write ranges (interval list)
        self.born = None         # (min, max) `born` of the graph's reads of views here


class ReplayPlan:
    """Per storage (first-access order), the union of a graph's captured accesses."""

    __slots__ = ("storages", "nops", "accesses", "intervals")

    def __init__(self, ops):
        self.nops = len(ops)
        plans = {}
        order = []
        actions = []     # (storage, op index, is_write, lo, hi) in per-op update order
        for k, cop in enumerate(ops):
            for is_write, fps in ((False, cop.reads), (True, cop.writes)):
                for fp in fps:
                    sp = plans.get(fp.storage)
                    if sp is None:
                        sp = plans[fp.storage] = _StoragePlan(fp.storage)
                        order.append(sp)
                    if not is_write and fp.born is not None:
                        b = fp.born
                        sp.born = (b, b) if sp.born is None else (min(sp.born[0], b),
                                                                  max(sp.born[1], b))
                    for lo, hi in fp.ranges:
                        if lo < hi:
                            actions.append((sp, k, is_write, lo, hi))
                            if is_write:
                                sp.written = iv_add(sp.written, lo, hi)
        union = {}
        for sp, _k, _w, lo, hi in actions:
            union[sp.storage] = iv_add(union.get(sp.storage, []), lo, hi)
        for sp in order:
            sp.intervals = [_Interval(lo, hi) for lo, hi in union.get(sp.storage, ())]
        for sp, k, is_write, lo, hi in actions:
            ivs = sp.intervals
            iv = ivs[bisect_left([x.hi for x in ivs], hi)] if len(ivs) > 1 else ivs[0]
            iv.actions.append((k, is_write, lo, hi))
            if is_write:
                iv.has_write = True
        self.storages = order
        self.accesses = len(actions)
        self.intervals = sum(len(sp.intervals) for sp in order)


_TID = object()     # the replaying stream's key in stand-in read sets
_PRE = object()     # "the reads this segment held before the replay"


def simulate(iv, inner, absent):
    """The per-op update of `iv`'s actions on a stand-in structure: `inner` the boundaries in
    [lo, hi], `absent[p]` whether piece p (of the pieces covering [lo, hi)) was never accessed.

    Returns (boundaries strictly inside (lo, hi), cells), a cell per resulting segment:
    (w kind, w index, pre piece whose reads it keeps or -1, op reading last or -1), w kind 0 no
    write, 1 the pre piece's write, 2 captured op's write; or None for a segment never accessed.
    """
    lo, hi = iv.lo, iv.hi
    b = list(inner)
    if not b or b[0] != lo:
        b.insert(0, lo - 1)      # stands for the segment lo falls in (cut at lo copies it)
    if b[-1] != hi:
        b.append(hi + 1)
    pre_w = [("pre", p) for p in range(len(absent))]
    states = [None if a else [pre_w[p], {_PRE: p}] for p, a in enumerate(absent)]
    sh = StorageShadow(0)
    sh.bounds, sh.states = b, states
    ops = {}
    for k, is_write, rlo, rhi in iv.actions:
        op = ops.get(k)
        if op is None:
            op = ops[k] = ("op", k)
        i = bisect_left(b, rlo)
        one = i + 1 < len(b) and b[i] == rlo and b[i + 1] == rhi
        if not is_write:                                     # Checker._read
            if one and states[i] is not None:
                states[i][1][_TID] = op
                continue
            i, j = sh.span(rlo, rhi)
            for m in range(i, j):
                st = states[m]
                if st is None:
                    states[m] = [None, {_TID: op}]
                else:
                    st[1][_TID] = op
        elif one and states[i] is not None:                  # Checker._write, one segment
            st = states[i]
            st[1].clear()
            st[0] = op
        else:
            i, j = sh.span(rlo, rhi)
            sh.collapse(i, j, [op, {}])
    a = b.index(lo)
    z = b.index(hi)
    pre_of = {id(w): p for p, w in enumerate(pre_w)}
    cells = []
    for st in states[a:z]:
        if st is None:
            cells.append(None)
            continue
        w, r = st
        if w is None:
            wk, wv = 0, -1
        elif w[0] == "pre":
            wk, wv = 1, pre_of[id(w)]
        else:
            wk, wv = 2, w[1]
        rp = r.get(_PRE, -1)
        rop = r[_TID][1] if _TID in r else -1
        cells.append((wk, wv, rp, rop))
    return tuple(b[a + 1:z]), tuple(cells)


def stable_form(iv, recipe):
    """(boundaries [lo, ..., hi], cells) when replaying `iv` on the structure its last replay
    left gives that same structure back, each segment keeping its own write or reads or taking
    a captured op's: the next replay that finds those boundaries (and no never-accessed
    segment) can then update the segments in place. None otherwise."""
    inner, cells = recipe
    simulated = simulate(iv, (iv.lo, *inner, iv.hi), (False,) * (len(inner) + 1))
    if simulated[0] != inner:
        return None
    for k, cell in enumerate(simulated[1]):
        if cell is None:
            return None
        wk, wv, rp, _rop = cell
        if (wk == 1 and wv != k) or wk == 0 or rp not in (-1, k):
            return None
    return [iv.lo, *inner, iv.hi], simulated[1]
