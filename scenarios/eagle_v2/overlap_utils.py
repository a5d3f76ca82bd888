"""`FutureMap`: values the forward stream produces for the next iteration, keyed by req_pool_idx.

`publish` writes `new_seq_lens_buf` right after verify and re-records `publish_ready` on the
forward stream; the schedule stream waits on it before gathering `seq_lens` (#25879, #26380).
`stash`/`resolve_future` carry the draft state (bonus tokens, topk, hidden) and need no event:
both run on the forward stream, in FIFO order.
"""
from __future__ import annotations

import torch

import racecheck

from .utils import pinned_empty


class FutureMap:
    def __init__(self, ctx, req_pool_size: int, topk: int, flavour: str, schedule_stream):
        self.ctx = ctx
        self.device = ctx.device
        self.device_module = ctx.dm
        self.flavour = flavour
        self.schedule_stream = schedule_stream
        n = req_pool_size + 1
        self.new_seq_lens_buf = racecheck.name(torch.zeros(n, dtype=torch.int64, device=ctx.device),
                                               "new_seq_lens_buf")
        self.output_tokens_buf = racecheck.name(torch.zeros(n, dtype=torch.int64, device=ctx.device),
                                                "output_tokens_buf")
        self.topk_p_buf = racecheck.name(torch.zeros((n, topk), dtype=torch.float32, device=ctx.device),
                                         "topk_p_buf")
        self.topk_index_buf = racecheck.name(torch.zeros((n, topk), dtype=torch.int64, device=ctx.device),
                                             "topk_index_buf")
        self.hidden_states_buf = racecheck.name(torch.zeros(n, dtype=torch.int64, device=ctx.device),
                                                "hidden_states_buf")
        self.publish_ready = None
        self.fwd_prepare_d2h_stream = None
        if flavour == "cuda":
            self.fwd_prepare_d2h_stream = self.device_module.Stream()
            ctx.name_stream(self.fwd_prepare_d2h_stream, "fwd_prepare_d2h_stream")
            self.new_seq_lens_cpu_pinned = racecheck.name(pinned_empty(ctx, n, torch.int64),
                                                          "new_seq_lens_cpu_pinned")

    # -- forward stream ---------------------------------------------------------------------------
    def publish(self, indices, new_seq_lens) -> None:
        self.new_seq_lens_buf[indices] = new_seq_lens
        if self.publish_ready is None:
            self.publish_ready = self.device_module.Event()
        self.publish_ready.record()

    def stash(self, indices, draft_input) -> None:
        self.output_tokens_buf[indices] = draft_input.bonus_tokens
        self.topk_p_buf[indices] = draft_input.topk_p
        self.topk_index_buf[indices] = draft_input.topk_index
        self.hidden_states_buf[indices] = draft_input.hidden_states

    def resolve_future(self, indices):
        """`_resolve_spec_extras`: gather the draft input stashed by the previous forward."""
        from .eagle_worker_v2 import EagleDraftInput
        return EagleDraftInput(topk_p=self.topk_p_buf[indices], topk_index=self.topk_index_buf[indices],
                               hidden_states=self.hidden_states_buf[indices],
                               bonus_tokens=self.output_tokens_buf[indices], future_indices=indices)

    # -- schedule stream --------------------------------------------------------------------------
    def resolve_seq_lens_cpu(self, batch, needs_cpu_seq_lens: bool) -> None:
        """`batch.seq_lens` from `new_seq_lens_buf` once verify N has published, plus its CPU mirror."""
        fi = batch.req_pool_indices
        if self.flavour == "hip":
            self.publish_ready.synchronize()
        else:
            self.publish_ready.wait()
        batch.seq_lens = racecheck.name(self.new_seq_lens_buf[fi], "seq_lens")
        if not needs_cpu_seq_lens:
            batch.seq_lens_cpu = batch.seq_lens_sum = None
            return
        if self.fwd_prepare_d2h_stream is not None:
            d2h = self.fwd_prepare_d2h_stream
            d2h.wait_event(self.publish_ready)
            with self.device_module.stream(d2h):
                self.new_seq_lens_cpu_pinned.copy_(self.new_seq_lens_buf, non_blocking=True)
            d2h.synchronize()
            host = self.new_seq_lens_cpu_pinned.tolist()
            batch.seq_lens_cpu = [host[i] for i in batch.req_pool_indices_cpu]
        else:
            batch.seq_lens_cpu = batch.seq_lens.tolist()
        batch.seq_lens_sum = sum(batch.seq_lens_cpu)
