"""Exact footprints of index ops: only the rows/elements the index values select.

The trick: index a tensor of storage positions shaped like `self` with the same indices;
the result is exactly the set of storage elements the op touches.
"""
from __future__ import annotations

import torch

from .footprints import FootprintMaker, element_positions


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
    try:
        pos = touched_positions(name, self_t, args)
    except (RuntimeError, IndexError, TypeError):
        fp = maker.of(self_t)
        if fp is not None:
            fp.approx = "index values could not be resolved; whole tensor used"
        return fp
    return maker.of_positions(self_t, pos)
