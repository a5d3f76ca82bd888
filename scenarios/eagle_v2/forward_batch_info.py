"""`ForwardBatch`: what one model forward reads, built from a ScheduleBatch (`init_new`)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

import racecheck

from .schedule_batch import ForwardMode
from .utils import h2d


@dataclass(eq=False)
class ForwardBatch:
    forward_mode: ForwardMode
    batch_size: int
    input_ids: Any = None
    req_pool_indices: Any = None
    seq_lens: Any = None
    out_cache_loc: Any = None
    positions: Any = None
    mrope_positions: Any = None
    custom_mask: Any = None
    kv_indices: Any = None
    seq_lens_cpu: Any = None
    seq_lens_sum: int | None = None
    spec_info: Any = None
    # extend
    extend_batch_index: Any = None
    image_ids: Any = None
    image_token_index: Any = None
    last_token_index: Any = None
    extend_num_tokens: int = 0

    @classmethod
    def init_new(cls, batch, model_runner, defer_mrope: bool = False) -> "ForwardBatch":
        """Engine `ForwardBatch.init_new`; on mrope models it computes `mrope_positions` here."""
        ret = cls(forward_mode=batch.forward_mode, batch_size=batch.batch_size(),
                  input_ids=batch.input_ids, req_pool_indices=batch.req_pool_indices,
                  seq_lens=batch.seq_lens, out_cache_loc=batch.out_cache_loc,
                  seq_lens_cpu=batch.seq_lens_cpu, seq_lens_sum=batch.seq_lens_sum,
                  spec_info=batch.spec_info)
        if batch.forward_mode.is_extend():
            ret.positions = batch.positions
            ret.mrope_positions = batch.mrope_positions if model_runner.model_is_mrope else None
            ret.extend_batch_index = batch.extend_batch_index
            ret.image_ids, ret.image_token_index = batch.image_ids, batch.image_token_index
            ret.last_token_index = batch.last_token_index
            ret.extend_num_tokens = batch.extend_num_tokens
            return ret
        spec = batch.spec_info
        if spec is not None and getattr(spec, "positions", None) is not None:
            ret.positions = spec.positions
            ret.custom_mask = getattr(spec, "tree_mask", None)
            if model_runner.model_is_mrope and not defer_mrope:
                ret.compute_spec_mrope_positions(model_runner, batch)
        return ret

    def compute_spec_mrope_positions(self, model_runner, batch) -> None:
        """mrope positions of the draft tree.

        A text token's three mrope axes all equal its 1-D position, so the text rows are a
        stride-0 view of the spec `positions` (upstream's text-only fast path returns just that
        view); a batch with images shifts each request's rows by its `mrope_position_delta`.
        """
        text = racecheck.name(self.positions.view(1, -1).expand(3, -1), "mrope_positions")
        if all(r.image_id is None for r in batch.reqs):
            self.mrope_positions = text
            return
        ndt = self.positions.numel() // self.batch_size
        delta = model_runner.pools.mrope_position_delta[batch.req_pool_indices]
        per_token = delta.unsqueeze(1).expand(-1, ndt).reshape(1, -1)
        self.mrope_positions = racecheck.name(text + per_token, "mrope_positions")


def init_forward_metadata(req_to_token, req_pool_indices, seq_lens, col_ids, out=None,
                          seq_lens_cpu=None, ctx=None):
    """Attention metadata out of graph: each row's KV slots `req_to_token[r, :seq_len]` (clamped).

    A backend that plans on the host (#26128) takes the lengths from the `seq_lens_cpu` mirror,
    uploaded without a host sync: a stale mirror gives a wrong KV range, as it would for the
    engine's attention plan.
    """
    if seq_lens_cpu is not None:
        seq_lens = h2d(ctx, seq_lens_cpu)
    last = (seq_lens - 1).clamp(min=0)
    cols = torch.minimum(col_ids.unsqueeze(0), last.unsqueeze(1))
    kv_indices = req_to_token[req_pool_indices.unsqueeze(1), cols]
    if out is None:
        return kv_indices.to(torch.int64)
    out.copy_(kv_indices)
    return out
