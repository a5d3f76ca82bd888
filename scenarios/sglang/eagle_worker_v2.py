"""sglang's EAGLE v2 workers, put together around the tiny model.

`EAGLEWorkerV2.__init__` builds a draft `TpModelWorker`, which loads a model and joins process
groups; `EagleDraftWorker.__init__` does the same for the draft. Here the real classes are
assembled with the attributes their constructors would set (each mirrors a line of sglang's
`__init__`, in the same order), and the real set-up methods run where they exist
(`_rebuild_topk1_chain_buffers`, `_init_dsa_index_share_state`, `get_plan_stream`, and the
graph runners' own constructors, which capture). Every method of the decode loop then runs unchanged.
"""
from __future__ import annotations

from types import SimpleNamespace

from .model_runner import TinyModelRunner


class Workers(SimpleNamespace):
    """target (TpModelWorker), draft (EagleDraftWorker), spec (EAGLEWorkerV2), and pools."""


def make_tp_worker(engine, runner, *, is_draft: bool):
    """A `TpModelWorker` around `runner`: what `forward_batch_generation` reads."""
    rc = engine.module("runtime_context")
    return engine.assemble(
        "tp_worker", "TpModelWorker",
        _model_runner=runner, model_config=runner.model_config, device="cuda", gpu_id=0,
        random_seed=0, is_draft_worker=is_draft, pp_group=rc.get_parallel().pp_group,
        hicache_layer_transfer_counter=None, dllm_algorithm=None, enable_overlap=True,
        enable_spec=True, model_runner_list=None)


def make_workers(engine, server_args, *, topk: int, steps: int, draft_tokens: int, mrope: bool,
                 graphs: bool, pools) -> Workers:
    target_runner = TinyModelRunner(
        engine, is_draft=False, req_to_token_pool=pools.req_to_token_pool,
        token_to_kv_pool=pools.target_kv, token_to_kv_pool_allocator=pools.allocator,
        server_args=server_args, steps=1, mrope=mrope)
    draft_runner = TinyModelRunner(
        engine, is_draft=True, req_to_token_pool=pools.req_to_token_pool,
        token_to_kv_pool=pools.draft_kv, token_to_kv_pool_allocator=pools.allocator,
        server_args=server_args, steps=steps, mrope=mrope)
    target = make_tp_worker(engine, target_runner, is_draft=False)
    draft_tp = make_tp_worker(engine, draft_runner, is_draft=True)
    EAGLE = engine.need("spec_info", "SpeculativeAlgorithm").EAGLE
    get_plan_stream = engine.need("spec_utils", "get_plan_stream")
    default_tree_mask_mode = engine.need("eagle_utils", "default_tree_mask_mode")
    DraftBase = engine.need("eagle_worker_v2", "EagleDraftWorker").__mro__[1]

    # EagleDraftWorker.__init__ / alloc_memory_pool / init_attention_backend, as sglang runs them
    draft = engine.assemble(
        "eagle_worker_v2", "EagleDraftWorker",
        server_args=server_args, gpu_id=0, nccl_port=0, target_worker=target, device="cuda",
        topk=topk, speculative_num_steps=steps, speculative_num_draft_tokens=draft_tokens,
        speculative_algorithm=EAGLE,
        parallel_layout=SimpleNamespace(tp_group=None, disable_cp=False, local_dp=True),
        draft_worker=draft_tp, draft_runner=draft_runner, dsa_extend_topk_buf=None,
        req_to_token_pool=pools.req_to_token_pool, token_to_kv_pool_allocator=pools.allocator,
        hot_token_id=None, draft_attn_backend=draft_runner.attn_backend,
        draft_extend_attn_backend=draft_runner.attn_backend,
        cuda_graph_runner=None, cuda_graph_runner_for_draft_extend=None)
    DraftBase.__init__(draft)
    draft._rebuild_topk1_chain_buffers()
    draft._init_dsa_index_share_state()
    draft.tree_mask_mode = default_tree_mask_mode()
    draft.plan_stream, draft.plan_stream_ctx = get_plan_stream("cuda")
    draft_runner.draft_attn_backend = draft.draft_attn_backend

    # EAGLEWorkerV2.__init__
    spec = engine.assemble(
        "eagle_worker_v2", "EAGLEWorkerV2",
        server_args=server_args, topk=topk, speculative_num_steps=steps,
        speculative_num_draft_tokens=draft_tokens, gpu_id=0, device="cuda",
        _target_worker=target, page_size=1, speculative_algorithm=EAGLE,
        enable_dp_spec_prefill_coordination=False, _hosts_draft=True, _draft_worker=draft,
        adaptive_controller=None, req_to_token_pool=pools.req_to_token_pool,
        token_to_kv_pool_allocator=pools.allocator)
    engine.need("eagle_worker_v2", "BaseSpecWorker").__init__(spec)
    import torch
    spec.num_new_pages_per_topk = torch.empty((), dtype=torch.int64, device="cuda")
    spec.extend_lens = torch.empty((), dtype=torch.int64, device="cuda")
    spec.plan_stream, spec.plan_stream_ctx = get_plan_stream("cuda")

    if graphs:
        DecodeCudaGraphRunner = engine.need("decode_cuda_graph_runner", "DecodeCudaGraphRunner")
        target_runner.decode_cuda_graph_runner = DecodeCudaGraphRunner(
            target_runner, speculative_num_steps=steps, speculative_num_draft_tokens=draft_tokens)
        # EagleDraftWorker._capture_cuda_graphs on a CUDA machine with a graph-capable backend
        # (its backend-type check would import CUDA-only backends here)
        DraftRunner = engine.need("draft_cuda_graph_runner", "EAGLEDraftCudaGraphRunner")
        ExtendRunner = engine.need("draft_extend_cuda_graph_runner",
                                   "EAGLEDraftExtendCudaGraphRunner")
        draft.cuda_graph_runner = DraftRunner(draft) if steps > 1 else None
        draft.cuda_graph_runner_for_draft_extend = ExtendRunner(draft)
    return Workers(target=target, draft=draft, spec=spec, target_runner=target_runner,
                   draft_runner=draft_runner)
