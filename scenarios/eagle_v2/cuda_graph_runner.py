"""Decode (target-verify) CUDA graph runner: batch-size buckets, static buffers, padding policy.

`replay_prepare` pads `raw_bs` up to the smallest captured bucket and fills every graph slot:
phase 1 resets each slot's tail `[raw:padded]` by its `PaddingPolicy`, phase 2 copies the head.
Outputs are `[:raw_num_token]` views of the static output buffers, valid until the next replay.

`input_ids` is zero-padded here, where the engine copies only the head (its padded rows' logits are
discarded): the tiny model reads every row, and only slots whose stale tails matter should be
candidates for RC006.
"""
from __future__ import annotations

import bisect
import enum
from dataclasses import dataclass

import torch

import racecheck

from .forward_batch_info import init_forward_metadata
from .piecewise_cuda_graph_runner import LogitsProcessorOutput
from .utils import new_graph


class PaddingPolicy(enum.Enum):
    ZERO = "zero"
    FILL_SENTINEL = "fill"
    FOREACH_COPY = "head-only"


@dataclass(frozen=True)
class GraphSlot:
    name: str
    per: str            # "req" | "token"
    policy: PaddingPolicy


class DecodeInputBuffers:
    """Static graph inputs sized for the largest bucket (`_allocate_decode_buffers`)."""

    def __init__(self, device, max_bs: int, num_tokens_per_bs: int, max_context_len: int,
                 seq_len_fill_value: int):
        n = max_bs * num_tokens_per_bs
        z = lambda *shape, dtype=torch.int64: torch.zeros(shape, dtype=dtype, device=device)  # noqa: E731
        self.input_ids = racecheck.name(z(n), "input_ids")
        self.positions = racecheck.name(z(n), "positions")
        self.mrope_positions = racecheck.name(z(3, n), "mrope_positions")
        self.out_cache_loc = racecheck.name(z(n), "out_cache_loc")
        self.seq_lens = racecheck.name(z(max_bs), "seq_lens")
        self.seq_lens.fill_(seq_len_fill_value)
        self.req_pool_indices = racecheck.name(z(max_bs), "req_pool_indices")
        self.custom_mask = racecheck.name(z(max_bs, num_tokens_per_bs, num_tokens_per_bs, dtype=torch.bool),
                                          "custom_mask")
        self.kv_indices = racecheck.name(z(max_bs, max_context_len), "kv_indices")
        self.seq_lens_cpu = [seq_len_fill_value] * max_bs


class CudaGraphRunner:
    """`DecodeCudaGraphRunner` in TARGET_VERIFY capture mode (num_tokens_per_bs = draft tokens)."""

    def __init__(self, model_runner, capture_bs, num_tokens_per_bs: int):
        self.model_runner = model_runner
        sa = model_runner.server_args
        self.ctx = model_runner.ctx
        self.device_module = self.ctx.dm
        self.capture_bs = sorted(capture_bs)
        self.max_bs = self.capture_bs[-1]
        self.num_tokens_per_bs = num_tokens_per_bs
        self.seq_len_fill_value = sa.seq_len_fill_value
        self.req_pool_padding_zero = sa.req_pool_padding_zero
        self.is_npu = sa.flavour == "npu"
        self.model_is_mrope = sa.model_is_mrope
        self.slots = [
            GraphSlot("input_ids", "token", PaddingPolicy.ZERO),
            GraphSlot("positions", "token", PaddingPolicy.ZERO),
            GraphSlot("out_cache_loc", "token", PaddingPolicy.ZERO),
            GraphSlot("seq_lens", "req", PaddingPolicy.FILL_SENTINEL),
            GraphSlot("req_pool_indices", "req",
                      PaddingPolicy.ZERO if sa.req_pool_padding_zero else PaddingPolicy.FOREACH_COPY),
            GraphSlot("custom_mask", "req", PaddingPolicy.ZERO),
        ]
        self.buffers = DecodeInputBuffers(self.ctx.device, self.max_bs, num_tokens_per_bs,
                                          model_runner.max_context_len, sa.seq_len_fill_value)
        n = self.max_bs * num_tokens_per_bs
        self.next_token_logits_buffer = racecheck.name(
            torch.zeros(n, dtype=torch.int64, device=self.ctx.device), "next_token_logits")
        self.hidden_states_buffer = racecheck.name(
            torch.zeros(n, dtype=torch.int64, device=self.ctx.device), "hidden_states")
        self.graphs = {}
        self.raw_bs = self.bs = 0
        self.capture()

    # -- capture --------------------------------------------------------------------------------
    def capture(self) -> None:
        dm = self.device_module
        for bs in self.capture_bs:
            g = new_graph(dm)
            with dm.graph(g):
                self._forward(bs)
            self.graphs[bs] = g
        dm.synchronize()

    def _forward(self, bs: int) -> None:
        b, n = self.buffers, bs * self.num_tokens_per_bs
        nxt, hidden = self.model_runner.model.forward_verify(
            input_ids=b.input_ids[:n], positions=b.positions[:n],
            mrope_positions=b.mrope_positions[:, :n] if self.model_is_mrope else None,
            out_cache_loc=b.out_cache_loc[:n], seq_lens=b.seq_lens[:bs],
            req_pool_indices=b.req_pool_indices[:bs], custom_mask=b.custom_mask[:bs],
            kv_indices=b.kv_indices[:bs], bs=bs, ndt=self.num_tokens_per_bs)
        self.next_token_logits_buffer[:n].copy_(nxt)
        self.hidden_states_buffer[:n].copy_(hidden)

    # -- replay ---------------------------------------------------------------------------------
    def can_run(self, forward_batch) -> bool:
        return forward_batch.batch_size <= self.max_bs

    def _pad_to_bucket(self, raw_bs: int) -> int:
        return self.capture_bs[bisect.bisect_left(self.capture_bs, raw_bs)]

    def populate_from_forward_batch(self, fb, raw_bs: int, bs: int) -> None:
        """`fill_from`: phase 1 resets padded tails by policy, phase 2 copies the raw head."""
        b, k = self.buffers, self.num_tokens_per_bs
        raw_n, n = raw_bs * k, bs * k
        if bs != raw_bs:
            for slot in self.slots:
                buf = getattr(b, slot.name)
                lo, hi = (raw_bs, bs) if slot.per == "req" else (raw_n, n)
                if slot.policy is PaddingPolicy.ZERO:
                    buf[lo:hi].zero_()
                elif slot.policy is PaddingPolicy.FILL_SENTINEL:
                    buf[lo:hi].fill_(self.seq_len_fill_value)
            if self.model_is_mrope:
                b.mrope_positions[:, raw_n:n].zero_()
            b.seq_lens_cpu[raw_bs:bs] = [self.seq_len_fill_value] * (bs - raw_bs)
        b.input_ids[:raw_n].copy_(fb.input_ids)
        b.positions[:raw_n].copy_(fb.positions)
        b.out_cache_loc[:raw_n].copy_(fb.out_cache_loc)
        b.seq_lens[:raw_bs].copy_(fb.seq_lens)
        b.req_pool_indices[:raw_bs].copy_(fb.req_pool_indices)
        b.custom_mask[:raw_bs].copy_(fb.custom_mask)
        if self.model_is_mrope and fb.mrope_positions is not None:
            b.mrope_positions[:, :raw_n].copy_(fb.mrope_positions)
        if fb.seq_lens_cpu is not None:
            b.seq_lens_cpu[:raw_bs] = list(fb.seq_lens_cpu)

    def replay_prepare(self, fb) -> None:
        """Pad, fill the graph slots and build the attention metadata (on the plan stream if any)."""
        raw_bs = fb.batch_size
        bs = self._pad_to_bucket(raw_bs)
        self.populate_from_forward_batch(fb, raw_bs, bs)
        b = self.buffers
        init_forward_metadata(self.model_runner.req_to_token_pool.req_to_token,
                              b.req_pool_indices[:bs], b.seq_lens[:bs],
                              self.model_runner.col_ids, out=b.kv_indices[:bs],
                              seq_lens_cpu=b.seq_lens_cpu[:bs] if fb.seq_lens_cpu is not None else None,
                              ctx=self.ctx)
        self.raw_bs, self.bs = raw_bs, bs

    def copy_mrope_positions(self, fb) -> None:
        """The NPU fix's pre-planned branch: the recomputed mrope positions into the graph slot."""
        raw_n = self.raw_bs * self.num_tokens_per_bs
        self.buffers.mrope_positions[:, :raw_n].copy_(fb.mrope_positions)

    def replay(self, fb, pre_planned: bool) -> LogitsProcessorOutput:
        if not pre_planned:
            self.replay_prepare(fb)
        else:
            raw_n = self.raw_bs * self.num_tokens_per_bs
            self.buffers.input_ids[:raw_n].copy_(fb.input_ids)
            self.buffers.positions[:raw_n].copy_(fb.positions)
        if self.is_npu:
            fb.seq_lens_cpu = fb.seq_lens.tolist()
        self.graphs[self.bs].replay()
        raw_n = self.raw_bs * self.num_tokens_per_bs
        return LogitsProcessorOutput(next_token_logits=self.next_token_logits_buffer[:raw_n],
                                     hidden_states=self.hidden_states_buffer[:raw_n])
