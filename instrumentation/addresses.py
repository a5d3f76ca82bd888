"""Which storage an address falls in, for the accesses an interpreted Triton launch logs.

A launch's loads and stores arrive as raw element addresses; both the footprints of the launch
and its replay record need them per storage, relative to the storage's first byte. Storages
are disjoint in memory, so one binary search per address over their sorted starts says which.
"""
from __future__ import annotations

import numpy as np


class StorageSpans:
    """Disjoint spans `[base, base + size)`, indexed in the order given; empty ones hold no
    address, and of spans starting at one address (one storage given twice) the first counts."""

    __slots__ = ("_order", "_starts", "_ends")

    def __init__(self, bases, sizes):
        bases = np.asarray(bases, dtype=np.uint64).reshape(-1)
        sizes = np.asarray(sizes, dtype=np.uint64).reshape(-1)
        given = np.nonzero(sizes > 0)[0]
        order = given[np.argsort(bases[given], kind="stable")]
        starts = bases[order]
        first = np.ones(starts.size, dtype=bool)
        first[1:] = starts[1:] != starts[:-1]
        self._order = order[first]
        self._starts = starts[first]
        self._ends = self._starts + sizes[self._order]

    def locate(self, addrs) -> np.ndarray:
        """Per address (uint64), the index of the span holding it, -1 where none does."""
        addrs = np.asarray(addrs, dtype=np.uint64)
        if self._starts.size == 0:
            return np.full(addrs.shape, -1, dtype=np.int64)
        k = np.searchsorted(self._starts, addrs, side="right").astype(np.int64) - 1
        at = np.maximum(k, 0)
        inside = (k >= 0) & (addrs < self._ends[at])
        return np.where(inside, self._order[at], -1)

    def holding(self, lo, hi) -> int | None:
        """The span holding every address from `lo` to `hi`, if one does (the common case: a
        launch's access to one tensor)."""
        if self._starts.size == 0:
            return None
        k = int(np.searchsorted(self._starts, np.uint64(lo), side="right")) - 1
        if k >= 0 and np.uint64(hi) < self._ends[k]:
            return int(self._order[k])
        return None
