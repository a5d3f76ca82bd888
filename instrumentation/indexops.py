"""Exact footprints of index ops: only the rows/elements the index values select.

Fast path (the common case: one index tensor selecting slices along one dim, as in
`buf[idx]`, `buf[idx] = v`, `index_select`, `index_copy_`): the footprint of one slice is
computed once and shifted per selected index, in plain Python. General path (several index
tensors, gather/scatter): index a tensor of storage positions shaped like `self` with the same
indices; the result is exactly the set of storage elements the op touches.
"""
from __future__ import annotations

import torch

from racecheck.core.trace import Footprint

from .footprints import MAX_INDEX_ELEMS, FootprintMaker, _merge, element_positions

MAX_FAST_INDICES = 4096
_tolist = torch._C.TensorBase.tolist     # racecheck's own read: not the session's patched method


def _slice_dim_and_index(name, self_t, args):
    """(dim, index tensor) when the op selects whole slices along one dim, else None."""
    if name in ("index", "_unsafe_index", "index_put_", "_index_put_impl_"):
        indices = args[1]
        found = None
        for d, ix in enumerate(indices):
            if ix is None:
                continue
            if found is not None:
                return None
            found = (d, ix)
        if found is None:
            return None
        d, ix = found
        if ix.dtype == torch.bool:
            if ix.dim() != 1:
                return None
            ix = ix.nonzero().reshape(-1)
        return found[0], ix
    if name in ("index_select", "index_copy_", "index_add_", "index_fill_"):
        d = args[1]
        return (d + self_t.dim() if d < 0 else d), args[2]
    return None


def _fast(maker: FootprintMaker, name, self_t, args):
    sel = _slice_dim_and_index(name, self_t, args)
    if sel is None:
        return None
    d, ix = sel
    if ix.numel() > MAX_FAST_INDICES or d >= self_t.dim():
        return None
    size = self_t.shape[d]
    rows = set()
    for r in _tolist(ix if ix.dim() == 1 else ix.reshape(-1)):
        r = int(r)
        if r < 0:
            r += size
        if not 0 <= r < size:
            raise IndexError(f"index {r} is out of bounds for dimension {d} with size {size}")
        rows.add(r)
    if not rows:
        return ()
    base, step = maker.slice_ranges(self_t, d)
    if base is None:
        return None
    if len(base) == 1:
        return _shifted(rows, base[0], step)
    return _merge([[lo + r * step, hi + r * step] for r in rows for lo, hi in base])


def _shifted(rows, base, step: int) -> tuple:
    """Merged byte ranges of [lo, hi) shifted by r * step for each row r (step >= 0, so
    sorted rows give sorted ranges: the same result as `_merge`, without its sort)."""
    lo0, hi0 = base
    out = []
    last = -1
    for r in sorted(rows):
        lo = lo0 + r * step
        hi = hi0 + r * step
        if lo <= last:
            if hi > last:
                out[-1] = (out[-1][0], hi)
                last = hi
        else:
            out.append((lo, hi))
            last = hi
    return tuple(out)


def touched_positions(name: str, self_t: torch.Tensor, args) -> torch.Tensor:
    pos = element_positions(self_t)
    if name in ("index", "_unsafe_index", "index_put_", "_index_put_impl_"):
        return torch.ops.aten.index.Tensor(pos, args[1])
    dim, index = args[1], args[2]
    if name in ("gather", "scatter_", "scatter_add_", "scatter_reduce_"):
        if index.dim() == 0:
            index = index.reshape(1)
        return torch.ops.aten.gather.default(pos, dim, index)
    return torch.ops.aten.index_select.default(pos, dim, index.reshape(-1))


def index_footprint(maker: FootprintMaker, name: str, self_t: torch.Tensor, args):
    """Footprint of the indexed part of `self_t`; the whole view when the indices can't be read."""
    if self_t.numel() == 0:
        return None
    try:
        ranges = _fast(maker, name, self_t, args)
        if ranges is not None:
            if not ranges:
                return None
            sid, host = maker.registry.lookup(self_t)
            return Footprint(sid, ranges, host)
        if self_t.numel() > MAX_INDEX_ELEMS:
            raise ValueError("too large")
        pos = touched_positions(name, self_t, args)
    except (RuntimeError, IndexError, TypeError, ValueError):
        return maker.whole(self_t, "index values could not be resolved; whole tensor used")
    return maker.of_positions(self_t, pos)
