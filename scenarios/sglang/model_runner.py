"""A tiny deterministic model behind sglang's own runner interfaces.

What a real model does that matters for stream ordering is kept, with sglang's own parts where
they exist: the KV cache is sglang's `MHATokenToKVPool` (written at `out_cache_loc`, read through
the attention metadata); the attention backend is built on sglang's `AttentionBackend` and plans
its metadata with sglang's Triton kv-indices kernel from `req_to_token`; the graph runner
captures `TinyModel.forward` like any model's. The arithmetic is small and exact, and the next
token depends on every context token's KV, so a KV row read at the wrong moment changes tokens:

    next(token, position, context) = (7 * token + 3 * position + 2 * sum of context keys) mod V

(the context keys are read twice: through the backend's planned kv_indices and through the
request's req_to_token row, as the two kinds of attention kernels reach the KV cache)

with key(token, position) = 13 * token + position. The draft model differs from the target at
every fifth position, so accept lengths vary from step to step.
"""
from __future__ import annotations

import torch

VOCAB = 64
HIDDEN = 8
CONTEXT_LEN = 64
DRAFT_DISAGREES_EVERY = 5


class Layer:
    """What `MHATokenToKVPool.set_kv_buffer` reads from a RadixAttention layer."""

    def __init__(self, layer_id: int):
        self.layer_id = layer_id


def make_attention_backend(engine, runner):
    """A `TinyAttnBackend` on sglang's `AttentionBackend` (the class is built at run time: the
    base comes from the installed sglang)."""
    Base = engine.need("base_attn_backend", "AttentionBackend")
    from sglang.kernels.ops.attention.kv_indices import create_flashinfer_kv_indices_triton

    class TinyAttnBackend(Base):
        """Plans kv_indices (CSR over each request's context) from req_to_token and seq_lens,
        as the Triton/FlashInfer backends do; graphs read static copies filled out of graph."""

        needs_cpu_seq_lens = False
        stands_in_for = "an attention backend"
        max_context_len = CONTEXT_LEN

        def __init__(self, runner, steps: int = 1):
            self.runner = runner
            self.attn_backends = [self] * max(1, steps)     # the draft's per-step backends
            self.kv_indptr = None
            self.kv_indices = None
            self.graph_kv_indptr = None
            self.graph_kv_indices = None
            self.current = (None, None)

        def _plan(self, fb, indptr_out=None, indices_out=None):
            pool = self.runner.req_to_token_pool.req_to_token
            bs = fb.batch_size
            lens = fb.seq_lens[:bs].to(torch.int32)
            indptr = indptr_out if indptr_out is not None else torch.zeros(
                bs + 1, dtype=torch.int32, device=lens.device)
            torch.cumsum(lens, dim=0, out=indptr[1:bs + 1])
            # zeros past the planned entries: this model gathers the whole buffer (a real
            # attention kernel reads only up to indptr[bs]), so every entry is planned each time
            if indices_out is None:
                indices_out = torch.zeros(pool.shape[1] * bs, dtype=torch.int64,
                                          device=lens.device)
            else:
                indices_out.zero_()
            if bs:
                create_flashinfer_kv_indices_triton[(bs,)](
                    pool, fb.req_pool_indices, lens, indptr, None, indices_out, pool.shape[1])
            return indptr, indices_out

        def init_forward_metadata(self, fb):
            """Eager forwards plan into fresh buffers."""
            self.kv_indptr, self.kv_indices = self._plan(fb)
            self.current = (self.kv_indptr, self.kv_indices)

        def init_forward_metadata_out_graph(self, fb, in_capture: bool = False):
            """Graph runners plan into the static buffers their graphs read (at capture, and
            before each replay: on the plan stream when the runner pre-plans)."""
            self._plan(fb, self.graph_kv_indptr, self.graph_kv_indices)
            self.current = (self.graph_kv_indptr, self.graph_kv_indices)

        def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int):
            ctx = self.runner.req_to_token_pool.req_to_token.shape[1]
            dev = self.runner.req_to_token_pool.req_to_token.device
            self.graph_kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=dev)
            self.graph_kv_indices = torch.zeros(max_bs * ctx, dtype=torch.int64, device=dev)
            import racecheck
            racecheck.name(self.graph_kv_indptr, "attn_backend.graph_kv_indptr")
            racecheck.name(self.graph_kv_indices, "attn_backend.graph_kv_indices")

        def get_cuda_graph_seq_len_fill_value(self):
            return 1

        def update_verify_buffers_to_fill_after_draft(self, verify_input, graph_bs):
            pass

        def metadata(self):
            """The buffers of the latest plan (a graph's static ones, or the eager ones)."""
            return self.current

    return TinyAttnBackend(runner)


class TinyModel(torch.nn.Module):
    """Writes this step's keys at `out_cache_loc`, attends over each request's context keys
    through the backend's kv_indices, returns one-hot logits of the next token."""

    shared_experts_config = None
    hot_token_id = None
    stands_in_for = "the model"

    def __init__(self, runner, *, is_draft: bool):
        super().__init__()
        self.runner = runner
        self.is_draft = is_draft
        self.layer = Layer(0)

    def forward(self, input_ids, positions, forward_batch, **kwargs):
        r = self.runner
        fb = forward_batch
        LogitsProcessorOutput = r.engine.need("logits_processor", "LogitsProcessorOutput")
        ids = input_ids.to(torch.int64)
        pos = positions.to(torch.int64)
        n = ids.shape[0]
        bs = fb.batch_size
        keys = (13 * ids + pos).to(torch.float32).view(n, 1, 1).expand(n, 1, HIDDEN).contiguous()
        r.token_to_kv_pool.set_kv_buffer(self.layer, fb.out_cache_loc, keys, keys)
        key_buf = r.token_to_kv_pool.get_key_buffer(0)[:, 0, 0]
        indptr, indices = r.attn_backend.metadata()
        # each request attends over its committed context: the prefix before this forward
        fm = fb.forward_mode
        prefill = fm.is_extend() and not fm.is_target_verify()
        prefix = (fb.extend_prefix_lens if prefill else fb.seq_lens)[:bs].to(torch.int64)
        ctx_keys = key_buf[indices.long()]
        cum = torch.cat([torch.zeros(1, device=ctx_keys.device), torch.cumsum(ctx_keys, 0)])
        starts = indptr[:bs].to(torch.int64)
        ctx = (cum[starts + prefix] - cum[starts]).to(torch.int64)
        # and through the request's own req_to_token row, as paged attention kernels index it
        # in the graph (a padded row's req_pool_indices entry is read here too)
        rows = r.req_to_token_pool.req_to_token[fb.req_pool_indices[:bs].to(torch.int64)]
        in_context = torch.arange(rows.shape[1], device=rows.device) < prefix.unsqueeze(1)
        ctx = ctx + (key_buf[rows.to(torch.int64)] * in_context).sum(1).to(torch.int64)
        token = torch.arange(n, device=ids.device)
        ends = None
        if prefill:
            ends = torch.cumsum(fb.extend_seq_lens[:bs].to(torch.int64), 0)
            owner = torch.searchsorted(ends, token, right=True).clamp_(max=max(bs - 1, 0))
        else:
            owner = torch.div(token, max(1, n // max(1, bs)), rounding_mode="floor").clamp_(
                max=max(bs - 1, 0))
        nxt = (7 * ids + 3 * pos + ctx[owner]) % VOCAB if bs else (7 * ids + 3 * pos) % VOCAB
        if self.is_draft:
            nxt = (nxt + (pos % DRAFT_DISAGREES_EVERY == 0).to(torch.int64)) % VOCAB
        hidden = keys[:, 0, :]
        if prefill:                      # the logits processor keeps each request's last token
            last = ends - 1
            nxt = nxt[last]
            if fb.capture_hidden_mode is not None and not fb.capture_hidden_mode.is_full():
                hidden = hidden[last]
        logits = torch.zeros(nxt.shape[0], VOCAB, device=ids.device).scatter_(
            1, nxt.unsqueeze(1), 10.0)
        return LogitsProcessorOutput(next_token_logits=logits, hidden_states=hidden)


class TinyModelRunner:
    """The model runner of one worker (target or draft): what sglang's decode path reads of a
    `ModelRunner`, and its `forward` (graph replay when the graph runner takes the batch, else
    attention planning and the model, as `ModelRunner._forward_raw` does)."""

    stands_in_for = "sglang.srt.model_executor.model_runner.ModelRunner"
    BORROWED = ("decode_num_tokens_per_req",)     # ModelRunner methods that run as they are

    def __init__(self, engine, *, is_draft: bool, req_to_token_pool, token_to_kv_pool,
                 token_to_kv_pool_allocator, server_args, steps: int, mrope: bool):
        self.engine = engine
        self.is_draft_worker = is_draft
        self.device = "cuda"
        self.gpu_id = 0
        self.dtype = torch.float32
        self.kv_cache_dtype = torch.float32
        self.server_args = server_args
        self.spec_algorithm = engine.need("spec_info", "SpeculativeAlgorithm").EAGLE
        self.req_to_token_pool = req_to_token_pool
        self.token_to_kv_pool = token_to_kv_pool
        self.token_to_kv_pool_allocator = token_to_kv_pool_allocator
        self.model_config = _model_config(engine, mrope=mrope)
        self.model = TinyModel(self, is_draft=is_draft)
        self.attn_backend = make_attention_backend(engine, self)
        self.attn_backend.attn_backends = [self.attn_backend] * max(1, steps)
        self.decode_attn_backend = self.attn_backend
        self.decode_attn_backend_group = [self.attn_backend]
        self.prefill_attention_backend_str = "triton"
        self.decode_cuda_graph_runner = None
        self.kv_write_log = None            # oracles.KVWriteLog, set on the target's runner
        KVIndexTranslator = engine.need("kv_index_translator", "KVIndexTranslator")
        self.kv_index_translator = KVIndexTranslator(
            req_to_token=req_to_token_pool.req_to_token,
            token_to_kv_pool_allocator=token_to_kv_pool_allocator,
            token_to_kv_pool=token_to_kv_pool, page_size=1, device="cuda",
            is_draft_worker=is_draft)
        GraphSharedOutput = engine.need("graph_shared_output", "GraphSharedOutput")
        # rows for the largest decode graph bucket's logits, as ModelRunner.max_decode_logits_rows
        # sizes it (bucket x draft tokens; the draft graphs need bucket x topk)
        decode = getattr(getattr(server_args, "cuda_graph_config", None), "decode", None)
        buckets = list(getattr(decode, "bs", None) or [1])
        per_req = max(int(server_args.speculative_num_draft_tokens or 1),
                      int(server_args.speculative_eagle_topk or 1))
        self.graph_shared_output = GraphSharedOutput(device="cuda",
                                                     max_rows=max(64, max(buckets) * per_req))
        self.shared_read_done_event = None
        self.lora_manager = None
        self.canary_manager = None
        self.watermark_state = None
        self.hisparse_coordinator = None
        self.device_timer = None
        self.ngram_embedding_manager = _Disabled()
        self.capture_head_hooks = []
        self.capture_tail_hooks = []
        self.pp_group = engine.module("runtime_context").get_parallel().pp_group
        import types
        for name in self.BORROWED:
            method = engine.need("model_runner", f"ModelRunner.{name}")
            setattr(self, name, types.MethodType(method, self))

    # -- what graph runners and workers call ---------------------------------------------------
    def forward(self, forward_batch, **kwargs):
        ModelRunnerOutput = self.engine.need("model_runner", "ModelRunnerOutput")
        g = self.decode_cuda_graph_runner
        fb = forward_batch
        if g is not None and fb.forward_mode.is_cuda_graph() and g.can_run_graph(fb):
            out, graph = g.execute(fb), True
        else:
            if fb.needs_forward_metadata_init():
                self.attn_backend.init_forward_metadata(fb)
            out, graph = self.model.forward(fb.input_ids, fb.positions, fb), False
        if self.kv_write_log is not None:
            self.kv_write_log.record(fb.out_cache_loc)
        return ModelRunnerOutput(logits_output=out, can_run_graph=graph)

    def sample(self, logits_output, forward_batch):
        """Greedy sampling (every request here is greedy)."""
        return torch.argmax(logits_output.next_token_logits, dim=-1)

    def attn_tp_sequence_sharded(self, num_tokens) -> bool:
        return False

    def get_pp_proxy_topk_size(self):
        return None

    def get_pp_proxy_residual_num_blocks(self):
        return None

    def get_pp_proxy_dspark_hidden_size(self):
        return None

    def get_aux_hidden_states_width(self):
        return None

    def _elastic_cuda_graph_enabled(self) -> bool:
        return False


class _Disabled:
    enabled = False


class TinyModelConfig:
    """The `ModelConfig` fields the decode path reads, for the tiny model."""

    stands_in_for = "sglang.srt.configs.model_config.ModelConfig"
    hidden_size = HIDDEN
    vocab_size = VOCAB
    dtype = torch.float32
    context_len = CONTEXT_LEN
    is_multimodal = False
    is_encoder_decoder = False
    num_nextn_predict_layers = None
    attention_arch = None
    is_hybrid_swa = False
    requires_mm_token_modalities = False
    linear_attn_registry_result = None
    self_opened_think_start_ids = None
    think_end_ids = None
    spec_hidden_size = HIDDEN
    quantization = None

    def __init__(self, *, mrope: bool):
        from transformers import LlamaConfig
        self.model_is_mrope = mrope
        self.hf_config = LlamaConfig(vocab_size=VOCAB, hidden_size=HIDDEN,
                                     intermediate_size=2 * HIDDEN, num_hidden_layers=1,
                                     num_attention_heads=1, num_key_value_heads=1,
                                     architectures=["LlamaForCausalLM"])
        self.hf_text_config = self.hf_config


def _model_config(engine, *, mrope: bool):
    return TinyModelConfig(mrope=mrope)
