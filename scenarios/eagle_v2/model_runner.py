"""`ModelRunner`: pools, the tiny target model, and its graph runners."""
from __future__ import annotations

import torch

import racecheck

from .cuda_graph_runner import CudaGraphRunner
from .mem_cache import KVPools, ReqToTokenPool, TokenToKVPoolAllocator
from .model import (MOD, IMG_TOKEN, SpecTree, draft_base, encoder_features, index_put_last_wins,
                    kv_value, rope_term, ssm_input, target_next, token_embedding)
from .piecewise_cuda_graph_runner import LogitsProcessorOutput, PiecewiseCudaGraphRunner

PREFILL_TOKEN_BUCKETS = (8, 16, 32, 64)


class TinyTargetModel:
    """The target model's forward passes over the pools (graph-capturable: no host reads)."""

    def __init__(self, runner):
        self.runner = runner
        self.pools = runner.pools

    def forward_verify(self, input_ids, positions, mrope_positions, out_cache_loc, seq_lens,
                       req_pool_indices, custom_mask, kv_indices, bs: int, ndt: int):
        """Target verify over the draft tree: KV write, prefix + tree attention, per-node ssm states."""
        pools = self.pools
        kv_new = kv_value(token_embedding(input_ids, positions), rope_term(positions, mrope_positions))
        pools.kv_cache.index_put_((out_cache_loc,), kv_new)
        ctx_kv = pools.kv_cache[kv_indices]
        visible = self.runner.col_ids.unsqueeze(0) < seq_lens.unsqueeze(1)
        prefix = (ctx_kv * self.runner.col_weight * visible).sum(1)
        tree = (custom_mask * (kv_new * (positions + 1)).view(bs, 1, ndt)).sum(2)
        attn = (prefix.unsqueeze(1) + tree) % MOD
        state = pools.mamba_state[req_pool_indices]
        path_input = (custom_mask * ssm_input(input_ids, positions).view(bs, 1, ndt)).sum(2)
        node_state = (state.unsqueeze(1) + path_input) % MOD
        index_put_last_wins(pools.intermediate_ssm_state, req_pool_indices, node_state)
        nxt = target_next(draft_base(input_ids, positions).view(bs, ndt), node_state, attn)
        return nxt.reshape(-1), node_state.reshape(-1)

    def forward_extend_embed(self, input_ids, positions, mrope_positions, image_ids, image_token_index):
        """The prefill graph piece: embeddings with the encoder's features merged in, KV values."""
        text = token_embedding(input_ids, positions)
        embeds = torch.where(input_ids == IMG_TOKEN, encoder_features(image_ids, image_token_index), text)
        return embeds, kv_value(embeds, rope_term(positions, mrope_positions))

    def extend_attention(self, fb, kv_values):
        """Eager attention of the prompt: KV write, per-request digest into the mamba state."""
        self.pools.kv_cache.index_put_((fb.out_cache_loc,), kv_values)
        contrib = kv_values * (fb.positions + 1) % MOD
        acc = torch.zeros(fb.batch_size, dtype=torch.int64, device=contrib.device)
        state = acc.index_add_(0, fb.extend_batch_index, contrib) % MOD
        self.pools.mamba_state.index_put_((fb.req_pool_indices,), state)
        last_ids = fb.input_ids[fb.last_token_index]
        last_pos = fb.positions[fb.last_token_index]
        return target_next(draft_base(last_ids, last_pos), state, state), state

    def forward_extend(self, fb) -> LogitsProcessorOutput:
        embeds, kv = self.forward_extend_embed(fb.input_ids, fb.positions, fb.mrope_positions,
                                               fb.image_ids, fb.image_token_index)
        next_token_ids, hidden = self.extend_attention(fb, kv)
        return LogitsProcessorOutput(next_token_logits=next_token_ids, hidden_states=hidden,
                                     mm_input_embeds=embeds)


class ModelRunner:
    def __init__(self, ctx, server_args, max_context_len: int, req_pool_size: int, num_slots: int):
        self.ctx = ctx
        self.device = ctx.device
        self.server_args = server_args
        self.model_is_mrope = server_args.model_is_mrope
        self.max_context_len = max_context_len
        self.req_to_token_pool = ReqToTokenPool(req_pool_size, max_context_len, ctx.device)
        self.pools = KVPools(num_slots, req_pool_size, ctx.device, server_args.speculative_num_draft_tokens)
        self.pools.req_to_token_pool = self.req_to_token_pool
        self.pools.token_to_kv_pool_allocator = TokenToKVPoolAllocator(num_slots)
        self.col_ids = racecheck.name(torch.arange(max_context_len, dtype=torch.int64, device=ctx.device),
                                      "col_ids")
        self.col_weight = racecheck.name(self.col_ids + 1, "col_weight")
        self.spec_tree = SpecTree(server_args.speculative_eagle_topk, server_args.speculative_num_steps,
                                  server_args.speculative_num_draft_tokens)
        self.tree = self.spec_tree.tensors(ctx.device)
        self.model = TinyTargetModel(self)
        self.graph_runner = None
        self.piecewise_runner = None
        ctx.dm.synchronize()
        if server_args.cuda_graph:
            self.graph_runner = CudaGraphRunner(self, server_args.cuda_graph_bs,
                                                server_args.speculative_num_draft_tokens)
            self.piecewise_runner = PiecewiseCudaGraphRunner(self, PREFILL_TOKEN_BUCKETS)
        ctx.dm.synchronize()

    def forward_extend(self, fb) -> LogitsProcessorOutput:
        if self.piecewise_runner is not None and self.piecewise_runner.can_run(fb):
            return self.piecewise_runner.replay(fb)
        return self.model.forward_extend(fb)
