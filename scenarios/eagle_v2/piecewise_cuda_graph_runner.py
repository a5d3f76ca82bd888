"""Piecewise (prefill) CUDA graph runner and `LogitsProcessorOutput`.

The graph piece embeds the prompt (merging the vision encoder's features into `input_embeds`)
and computes the KV values; attention runs eagerly between pieces, as in the engine. `replay`
rebuilds a `LogitsProcessorOutput` whose `mm_input_embeds` is a `[:raw_num_tokens]` view of the
piece's static output buffer: kept only with the #23613 fix (`mm_input_copy`), dropped without it.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Any

import torch

import racecheck

from .utils import new_graph


@dataclass(eq=False)
class LogitsProcessorOutput:
    next_token_logits: Any
    hidden_states: Any = None
    mm_input_embeds: Any = None


class PiecewiseCudaGraphRunner:
    def __init__(self, model_runner, capture_num_tokens):
        self.model_runner = model_runner
        self.ctx = model_runner.ctx
        self.device_module = self.ctx.dm
        sa = model_runner.server_args
        self.mm_input_copy = sa.mm_input_copy
        self.model_is_mrope = sa.model_is_mrope
        self.capture_num_tokens = sorted(capture_num_tokens)
        n = self.capture_num_tokens[-1]
        z = lambda *shape: torch.zeros(shape, dtype=torch.int64, device=self.ctx.device)  # noqa: E731
        self.input_ids = racecheck.name(z(n), "extend.input_ids")
        self.positions = racecheck.name(z(n), "extend.positions")
        self.mrope_positions = racecheck.name(z(3, n), "extend.mrope_positions")
        self.image_ids = racecheck.name(z(n), "extend.image_ids")
        self.image_token_index = racecheck.name(z(n), "extend.image_token_index")
        self.input_embeds = racecheck.name(z(n), "mm_input_embeds")
        self.kv_values = racecheck.name(z(n), "extend.kv_values")
        self.graphs = {}
        self.capture()

    def capture(self) -> None:
        dm = self.device_module
        model = self.model_runner.model
        for n in self.capture_num_tokens:
            g = new_graph(dm)
            with dm.graph(g):
                embeds, kv = model.forward_extend_embed(
                    self.input_ids[:n], self.positions[:n],
                    self.mrope_positions[:, :n] if self.model_is_mrope else None,
                    self.image_ids[:n], self.image_token_index[:n])
                self.input_embeds[:n].copy_(embeds)
                self.kv_values[:n].copy_(kv)
            self.graphs[n] = g
        dm.synchronize()

    def can_run(self, forward_batch) -> bool:
        return forward_batch.extend_num_tokens <= self.capture_num_tokens[-1]

    def replay(self, fb) -> LogitsProcessorOutput:
        raw = fb.extend_num_tokens
        n = self.capture_num_tokens[bisect.bisect_left(self.capture_num_tokens, raw)]
        static = [self.input_ids, self.positions, self.image_ids, self.image_token_index]
        if n != raw:
            for buf in static:
                buf[raw:n].zero_()
            if self.model_is_mrope:
                self.mrope_positions[:, raw:n].zero_()
        for buf, src in zip(static, (fb.input_ids, fb.positions, fb.image_ids, fb.image_token_index)):
            buf[:raw].copy_(src)
        if self.model_is_mrope:
            self.mrope_positions[:, :raw].copy_(fb.mrope_positions)
        self.graphs[n].replay()
        next_token_ids, hidden = self.model_runner.model.extend_attention(fb, self.kv_values[:raw])
        output = LogitsProcessorOutput(next_token_logits=next_token_ids, hidden_states=hidden)
        if self.mm_input_copy:
            output.mm_input_embeds = self.input_embeds[:raw]
        return output
