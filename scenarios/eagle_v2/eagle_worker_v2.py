"""`EagleWorkerV2`: draft -> verify (under `plan_stream_ctx`) -> publish -> draft-extend.

Runs on the forward stream (the worker's "current" stream). With the plan stream on, verify and
draft-extend metadata prep run on `plan_stream` and the forward stream joins it before using them.

Plan-stream edges in this model:
* `plan_stream.wait_stream(current)` at the start of a decode forward, before the draft is issued:
  plan work comes after the schedule stream's prep and the previous forward (the producer edge
  #28034 proposes; EAGLE at the snapshot has none). It does not order the draft.
* `draft_done_event` (#21940, reverted upstream): an event after `draft()`, waited on by the plan
  stream before `replay_prepare` copies the draft's `draft_token`/`positions`/`tree_mask` into the
  graph buffers; and likewise an event after sampling before the draft-extend prep reads `predict`
  (the same missing producer edge, open issue #40025).
* `mrope_recompute` (#23423, NPU only upstream): `init_new` on the plan stream computes
  `mrope_positions` (text rows: a view of the draft's `positions`) before any wait; the fix
  defers it to the forward stream after the join and copies the result into the graph buffer.
  Upstream the fix coexisted with #21940's wait, so here that wait comes after `init_new`.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any

import torch

import racecheck

from .forward_batch_info import ForwardBatch, init_forward_metadata
from .model import (MOD, VOCAB, draft_base, draft_kv_value, kv_value, rope_term, ssm_input,
                    token_embedding)
from .piecewise_cuda_graph_runner import LogitsProcessorOutput
from .schedule_batch import ForwardMode
from .utils import d2h, record_stream_each


@dataclass(eq=False)
class EagleDraftInput:
    topk_p: Any
    topk_index: Any
    hidden_states: Any
    bonus_tokens: Any
    future_indices: Any = None


@dataclass(eq=False)
class EagleVerifyInput:
    draft_token: Any
    positions: Any
    tree_mask: Any
    draft_cache_loc: Any = None


@dataclass(eq=False)
class GenerationBatchResult:
    logits_output: Any
    next_token_ids: Any
    accept_lens: Any
    new_seq_lens: Any
    next_draft_input: Any = None
    bonus_tokens: Any = None
    accept_index: Any = None
    last_node: Any = None
    extra_keep_alive_refs: list = field(default_factory=list)
    probes: dict = field(default_factory=dict)
    copy_done: Any = None
    next_token_ids_cpu: Any = None
    accept_lens_cpu: Any = None

    def copy_to_cpu(self, ctx) -> None:
        """Non-blocking D2H of what the host needs, then `copy_done` on the forward stream."""
        self.next_token_ids_cpu = d2h(ctx, self.next_token_ids)
        if self.accept_lens is not None:
            self.accept_lens_cpu = d2h(ctx, self.accept_lens)
        self.copy_done.record()


def _get_plan_stream(ctx, enabled: bool):
    if not enabled:
        return None, contextlib.nullcontext()
    plan_stream = ctx.dm.Stream()
    ctx.name_stream(plan_stream, "plan_stream")
    return plan_stream, ctx.dm.stream(plan_stream)


class EagleWorkerV2:
    def __init__(self, model_runner, ctx, server_args):
        self.model_runner = model_runner
        self.ctx = ctx
        self.device = ctx.device
        self.device_module = ctx.dm
        self.server_args = server_args
        self.pools = model_runner.pools
        self.req_to_token = model_runner.req_to_token_pool.req_to_token
        self.topk = server_args.speculative_eagle_topk
        self.steps = server_args.speculative_num_steps
        self.ndt = server_args.speculative_num_draft_tokens
        self.tree = model_runner.tree
        self.width = model_runner.spec_tree.width
        self.plan_stream, self.plan_stream_ctx = _get_plan_stream(ctx, server_args.enable_plan_stream)
        self.keepalive = server_args.record_stream_keepalive
        dev = ctx.device
        self.draft_cols = torch.arange(self.steps * self.topk, dtype=torch.int64, device=dev)
        self.draft_depth = self.draft_cols // self.topk + 1
        self.verify_cols = torch.arange(self.ndt, dtype=torch.int64, device=dev)
        self.arange_bs = torch.arange(server_args.max_running_requests + 2, dtype=torch.int64, device=dev)
        self.topk_p_template = 1.0 / (torch.arange(self.topk, dtype=torch.float32, device=dev) + 1.0)
        self._draft_done_event = None
        self._verify_done_event = None

    # -- entry ------------------------------------------------------------------------------------
    def forward_batch_generation(self, batch, on_publish=None) -> GenerationBatchResult:
        if batch.forward_mode.is_extend():
            return self._forward_extend(batch, on_publish)
        dm = self.device_module
        if self.plan_stream is not None:
            self.plan_stream.wait_stream(dm.current_stream())
        verify_input = self.draft(batch)
        if self.plan_stream is not None and self.server_args.draft_done_event:
            self._draft_done_event = dm.Event()
            self._draft_done_event.record()
        result, verify_forward_batch = self.verify(batch, verify_input)
        if on_publish is not None:
            on_publish(result.new_seq_lens)
        result.next_draft_input, extend_forward_batch = self._draft_extend_for_decode(batch, result)
        if self.keepalive:
            result.extra_keep_alive_refs = [verify_forward_batch, extend_forward_batch, verify_input]
        return result

    def _forward_extend(self, batch, on_publish) -> GenerationBatchResult:
        fb = ForwardBatch.init_new(batch, self.model_runner)
        logits_output = self.model_runner.forward_extend(fb)
        new_seq_lens = batch.seq_lens
        if on_publish is not None:
            on_publish(new_seq_lens)
        next_draft_input, probes = self._draft_extend_for_prefill(batch, fb, logits_output)
        result = GenerationBatchResult(logits_output, next_token_ids=logits_output.next_token_logits,
                                       accept_lens=None, new_seq_lens=new_seq_lens,
                                       next_draft_input=next_draft_input, probes=probes)
        if self.keepalive:
            result.extra_keep_alive_refs = [fb]
        return result

    # -- draft ------------------------------------------------------------------------------------
    def draft(self, batch) -> EagleVerifyInput:
        """`prepare_for_draft` + the draft steps + `build_tree`, all on the forward stream."""
        spec = batch.spec_info
        seq_lens, req_pool_indices = batch.seq_lens, batch.req_pool_indices
        draft_cache_loc = self.req_to_token[req_pool_indices.unsqueeze(1),
                                            seq_lens.unsqueeze(1) + self.draft_cols].to(torch.int64)
        state = (spec.hidden_states + ssm_input(spec.bonus_tokens, seq_lens)).unsqueeze(1)
        positions = (seq_lens + 1).unsqueeze(1)
        tokens = spec.topk_index
        level_tokens = [tokens]
        for _ in range(1, self.steps):
            parent = tokens[:, :1]
            state = state + ssm_input(parent, positions)
            tokens = (draft_base(parent, positions) + state + self.tree["cand"]).remainder_(VOCAB)
            level_tokens.append(tokens)
            positions.add_(1)
        draft_tokens = torch.cat(level_tokens, dim=1)
        draft_positions = seq_lens.unsqueeze(1) + self.draft_depth
        self.pools.draft_kv_cache.index_put_((draft_cache_loc,),
                                             draft_kv_value(draft_tokens, draft_positions))
        return self.build_tree(batch, spec.bonus_tokens, draft_tokens, draft_cache_loc)

    def build_tree(self, batch, bonus_tokens, draft_tokens, draft_cache_loc) -> EagleVerifyInput:
        """`build_tree_kernel_efficient`: `draft_token`, `positions`, `tree_mask` of the verify tree."""
        bs, ndt = batch.batch_size(), self.ndt
        tokens = torch.cat([bonus_tokens.unsqueeze(1), draft_tokens], dim=1)[:, :ndt]
        draft_token = racecheck.name(tokens.reshape(-1), "draft_token")
        positions = racecheck.name((batch.seq_lens.unsqueeze(1) + self.tree["depth"]).reshape(-1),
                                   "positions")
        tree_mask = racecheck.name(self.tree["mask"].unsqueeze(0).repeat(bs, 1, 1), "tree_mask")
        return EagleVerifyInput(draft_token, positions, tree_mask, draft_cache_loc)

    # -- verify -----------------------------------------------------------------------------------
    def verify(self, batch, verify_input):
        dm = self.device_module
        fwd_stream = dm.current_stream()
        sa = self.server_args
        if self.keepalive:
            record_stream_each(self.ctx, (batch.seq_lens, batch.req_pool_indices, verify_input.draft_token,
                                          verify_input.positions, verify_input.tree_mask), fwd_stream)
        with self.plan_stream_ctx:
            verify_forward_batch, can_run_graph = self.eagle_prepare_for_verify(batch, verify_input)
        if self.keepalive:
            record_stream_each(self.ctx, (batch.input_ids, batch.out_cache_loc), fwd_stream)
        if self.plan_stream is not None:
            dm.current_stream().wait_stream(self.plan_stream)
            if sa.model_is_mrope and sa.mrope_recompute:
                verify_forward_batch.compute_spec_mrope_positions(self.model_runner, batch)
                if can_run_graph:
                    self.model_runner.graph_runner.copy_mrope_positions(verify_forward_batch)
        fb = verify_forward_batch
        if can_run_graph:
            logits_output = self.model_runner.graph_runner.replay(fb, pre_planned=True)
        else:
            nxt, hidden = self.model_runner.model.forward_verify(
                input_ids=fb.input_ids, positions=fb.positions, mrope_positions=fb.mrope_positions,
                out_cache_loc=fb.out_cache_loc, seq_lens=fb.seq_lens,
                req_pool_indices=fb.req_pool_indices, custom_mask=fb.custom_mask,
                kv_indices=fb.kv_indices, bs=fb.batch_size, ndt=self.ndt)
            logits_output = LogitsProcessorOutput(next_token_logits=nxt, hidden_states=hidden)
        result = self.eagle_sample(batch, fb, logits_output)
        if self.plan_stream is not None and sa.draft_done_event:
            self._verify_done_event = dm.Event()
            self._verify_done_event.record()
        return result, verify_forward_batch

    def eagle_prepare_for_verify(self, batch, verify_input):
        """Verify metadata prep (plan stream if enabled): cache locs, ForwardBatch, graph buffers."""
        sa = self.server_args
        batch.input_ids = verify_input.draft_token
        cols = batch.seq_lens.unsqueeze(1) + self.verify_cols
        batch.out_cache_loc = racecheck.name(
            self.req_to_token[batch.req_pool_indices.unsqueeze(1), cols].to(torch.int64).reshape(-1),
            "out_cache_loc")
        batch.forward_mode = ForwardMode.TARGET_VERIFY
        batch.spec_info = verify_input
        defer_mrope = self.plan_stream is not None and sa.mrope_recompute
        fb = ForwardBatch.init_new(batch, self.model_runner, defer_mrope=defer_mrope)
        if self.plan_stream is not None and sa.draft_done_event:
            self.plan_stream.wait_event(self._draft_done_event)
        graph_runner = self.model_runner.graph_runner
        can_run_graph = graph_runner is not None and graph_runner.can_run(fb)
        if can_run_graph:
            graph_runner.replay_prepare(fb)
        else:
            fb.kv_indices = init_forward_metadata(self.req_to_token, fb.req_pool_indices, fb.seq_lens,
                                                  self.model_runner.col_ids, seq_lens_cpu=fb.seq_lens_cpu,
                                                  ctx=self.ctx)
        return fb, can_run_graph

    def eagle_sample(self, batch, fb, logits_output) -> GenerationBatchResult:
        """Greedy tree acceptance: the longest chain whose draft tokens the target predicted."""
        bs, ndt, tree = fb.batch_size, self.ndt, self.tree
        target = logits_output.next_token_logits.view(bs, ndt)
        draft = fb.input_ids.view(bs, ndt)
        match = draft == target.index_select(1, tree["parent"])
        accepted_depth = match.index_select(1, tree["chain"]).to(torch.int64).cumprod(1).sum(1)
        cols = tree["path_cols"].unsqueeze(0)
        depth = accepted_depth.unsqueeze(1)
        accept_index = torch.where(cols <= depth, tree["chain_path"].unsqueeze(0), -1)
        accept_lens = accepted_depth + 1
        if self.topk > 1:
            side = tree["side"][accepted_depth]
            parent = tree["chain_path"][accepted_depth.clamp(max=self.width - 1)].unsqueeze(1)
            side_match = (side >= 0) & (draft.gather(1, side.clamp(min=0)) == target.gather(1, parent))
            hit = side_match.any(1)
            first = side.gather(1, side_match.to(torch.int64).argmax(1, keepdim=True))
            accept_index = torch.where((cols == depth + 1) & hit.unsqueeze(1), first, accept_index)
            accept_lens = accept_lens + hit.to(torch.int64)
            self._finalize_accept_tree_path(fb, accept_index)
        accept_lens = racecheck.name(accept_lens, "accept_lens")
        last_node = accept_index.gather(1, (accept_lens - 1).unsqueeze(1))
        self.commit_mamba_states_after_verify(fb, last_node)
        valid = accept_index >= 0
        accepted = target.gather(1, accept_index.clamp(min=0))
        predict = racecheck.name(torch.where(valid, accepted, 0).to(torch.int32), "predict")
        bonus_tokens = accepted.gather(1, (accept_lens - 1).unsqueeze(1)).squeeze(1)
        new_seq_lens = racecheck.name(batch.seq_lens + accept_lens, "seq_lens")
        result = GenerationBatchResult(logits_output, next_token_ids=predict, accept_lens=accept_lens,
                                       new_seq_lens=new_seq_lens, bonus_tokens=bonus_tokens,
                                       accept_index=accept_index)
        result.last_node = last_node.squeeze(1)
        return result

    def commit_mamba_states_after_verify(self, fb, last_node) -> None:
        """The recurrent state after the last accepted node becomes the request's state."""
        pools = self.pools
        rows = fb.req_pool_indices.unsqueeze(1)
        pools.mamba_state[fb.req_pool_indices] = pools.intermediate_ssm_state[rows, last_node].squeeze(1)

    def _finalize_accept_tree_path(self, fb, accept_index) -> None:
        """topk > 1: move the accepted nodes' KV to the front columns, in path order."""
        loc = fb.out_cache_loc.view(fb.batch_size, self.ndt)
        src = loc.gather(1, accept_index.clamp(min=0))
        valid = accept_index >= 0
        kv_cache = self.pools.kv_cache
        values = kv_cache[src]
        dst = torch.where(valid, loc[:, : self.width], 0)
        kv_cache.index_put_((dst.reshape(-1),), torch.where(valid, values, 0).reshape(-1))

    # -- draft extend -----------------------------------------------------------------------------
    def _draft_extend_for_decode(self, batch, result):
        """Draft forward over the accepted tokens; the next draft input for the FutureMap."""
        dm = self.device_module
        bs, width = batch.batch_size(), self.width
        select_index = self.arange_bs[:bs] * self.ndt + result.last_node
        with self.plan_stream_ctx:
            if self.plan_stream is not None and self.server_args.draft_done_event:
                self.plan_stream.wait_event(self._verify_done_event)
            fb = self.prepare_for_draft_extend(batch, result)
        if self.plan_stream is not None:
            dm.current_stream().wait_stream(self.plan_stream)
            if self.keepalive:
                record_stream_each(self.ctx, (fb.input_ids, fb.positions, fb.seq_lens), dm.current_stream())
        loc = batch.out_cache_loc.view(bs, self.ndt)[:, :width]
        self.pools.draft_kv_cache.index_put_((loc,), draft_kv_value(fb.input_ids, fb.positions))
        hidden = result.logits_output.hidden_states[select_index]
        bonus = result.bonus_tokens
        topk_index = self._first_level_candidates(bonus, result.new_seq_lens, hidden)
        topk_p = self.topk_p_template.unsqueeze(0).expand(bs, self.topk)
        return EagleDraftInput(topk_p, topk_index, hidden, bonus), fb

    def _first_level_candidates(self, bonus, bonus_positions, state):
        """topk guesses for the token after `bonus`, from the state after consuming it."""
        after = state + ssm_input(bonus, bonus_positions)
        return (draft_base(bonus, bonus_positions).add_(after).unsqueeze(1) + self.tree["cand"]) % VOCAB

    def prepare_for_draft_extend(self, batch, result) -> ForwardBatch:
        bs = batch.batch_size()
        fb = ForwardBatch(forward_mode=ForwardMode.DRAFT_EXTEND_V2, batch_size=bs,
                          req_pool_indices=batch.req_pool_indices, out_cache_loc=batch.out_cache_loc)
        fb.input_ids = racecheck.name(result.next_token_ids.to(torch.int64).view(bs, self.width), "input_ids")
        fb.positions = racecheck.name(batch.seq_lens.unsqueeze(1) + self.tree["path_cols"], "positions")
        fb.seq_lens = batch.seq_lens + self.width
        return fb

    def _draft_extend_for_prefill(self, batch, fb, logits_output):
        """Draft over the prompt; reuses the target's `mm_input_embeds` for the image tokens."""
        embeds = logits_output.mm_input_embeds
        if embeds is None:
            embeds = token_embedding(fb.input_ids, fb.positions)
        pos1 = fb.positions + 1
        self.pools.draft_kv_cache.index_put_((fb.out_cache_loc,), draft_kv_value(fb.input_ids, fb.positions))
        kv = kv_value(embeds, rope_term(fb.positions, fb.mrope_positions))
        bs = fb.batch_size
        acc = torch.zeros(bs, dtype=torch.int64, device=kv.device)
        hidden = acc.index_add_(0, fb.extend_batch_index, kv * pos1 % MOD) % MOD
        bonus = logits_output.next_token_logits
        topk_index = self._first_level_candidates(bonus, fb.seq_lens, hidden)
        topk_p = self.topk_p_template.unsqueeze(0).expand(bs, self.topk)
        probes = {}
        if self.server_args.multimodal:
            digest = torch.zeros(bs, dtype=torch.int64, device=kv.device)
            probes["mm_input_embeds"] = digest.index_add_(0, fb.extend_batch_index, embeds * pos1 % MOD) % MOD
        return EagleDraftInput(topk_p, topk_index, hidden, bonus), probes
