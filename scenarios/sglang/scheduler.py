"""sglang's overlap scheduler, driven through a scripted request schedule.

`Scheduler.event_loop_overlap` is an endless loop over a ZMQ inbox; its body is what matters
for stream ordering, and it runs here step for step (`OverlapScheduler.step`) on the schedule
stream, calling the real methods:

    get_next_batch_to_run      mirrored: merge the last prefill into the running batch
                               (`ScheduleBatch.merge_batch`), `filter_batch`, admit arriving
                               requests as a prefill (`ScheduleBatch.init_new`,
                               `prepare_for_extend`: `alloc_for_extend`, `write_cache_indices`),
                               else the real `update_running_batch` (`prepare_for_decode`)
    run_batch                  real: FutureMap resolve, forward_stream.wait_stream(schedule),
                               EAGLEWorkerV2.forward_batch_generation, publish, relay, copy
    _apply_war_barrier         real, after every run_batch, switched by the platform flavour
    process_batch_result_*     real (SchedulerBatchResultProcessor): copy_done.synchronize(),
                               commit tokens, finish requests, release_kv_cache (radix insert,
                               req-pool row freed)

The scheduler object is assembled with what those methods read (`Engine.assemble`); the model
is the tiny one of `model_runner`. Metrics and telemetry are not modelled (`_Ignored`).
"""
from __future__ import annotations

from array import array
from collections import deque
from dataclasses import dataclass, field
from types import SimpleNamespace

import torch

from .eagle_worker_v2 import make_workers
from .model_runner import CONTEXT_LEN, HIDDEN, VOCAB
from .oracles import KVWriteLog, radix_kv_mismatches


class _Ignored:
    """Metrics, tracing and other telemetry the scheduler reports to: accepts anything."""

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return self

    def __call__(self, *args, **kwargs):
        return self

    def __iadd__(self, other):
        return self

    __add__ = __radd__ = __mod__ = __iadd__

    def __bool__(self):
        return False

    def __int__(self):
        return 0

    def __iter__(self):
        return iter(())


@dataclass
class Arrival:
    """A request joining at `step`: prompt tokens and how many tokens it may generate."""

    step: int
    rid: str
    prompt: list
    max_new_tokens: int


@dataclass
class Output:
    """What the engine streamed for a finished request."""

    rid: str
    output_ids: list = field(default_factory=list)


class OutputCollector:
    """Stands in for the detokenizer connection: keeps each request's streamed tokens."""

    def __init__(self):
        self.outputs: dict = {}

    def stream_output(self, reqs, return_logprob=False, *args, **kwargs):
        for req in reqs:
            if req.finished():
                self.outputs[req.rid] = list(req.output_ids)


def declare_graph_inputs(engine, workers, name) -> None:
    """Name the decode registry's buffers as sglang names its slots (`graph.<slot>`), and tell
    racecheck which padded rows sglang means to leave stale, from sglang's own declarations:
    a slot whose `PaddingPolicy` does not reset the padded tail (KEEP_PAD, FOREACH_COPY,
    FILL_ONCE) and that is not in `INDEX_SEMANTIC_BUFFERS` (values that index memory). The draft
    runners keep no registry; their buffers of the same field names carry the same intent.
    Stale values read as indices into memory the run writes stay RC006 regardless."""
    import racecheck
    graph_runner = workers.target_runner.decode_cuda_graph_runner
    if graph_runner is None:
        return
    Policy = engine.need("cuda_graph_buffer_registry", "PaddingPolicy")
    index_semantic = engine.need("input_buffers", "INDEX_SEMANTIC_BUFFERS")
    keeps_tail = (Policy.KEEP_PAD, Policy.FOREACH_COPY, Policy.FILL_ONCE)
    registry = graph_runner.buffer_registry
    tolerant = set()
    for slot_name in registry.slot_names():
        slot = registry.get_slot(slot_name)
        if slot.buffer is None:
            continue
        name(slot.buffer, f"graph.{slot_name}")
        if slot.padding_policy in keeps_tail and slot_name not in index_semantic:
            tolerant.add(slot_name)
            racecheck.stale_tolerant(slot.buffer)
    for runner in (workers.draft.cuda_graph_runner,
                   workers.draft.cuda_graph_runner_for_draft_extend):
        buffers = getattr(runner, "buffers", None)
        for field_name in sorted(tolerant):
            buffer = getattr(buffers, field_name, None)
            if buffer is not None:
                racecheck.stale_tolerant(buffer)


class Pools(SimpleNamespace):
    """req_to_token_pool, allocator, target_kv, draft_kv, tree_cache."""


def make_pools(engine, *, rows: int, slots: int, radix: bool) -> Pools:
    ReqToTokenPool = engine.need("memory_pool", "ReqToTokenPool")
    MHATokenToKVPool = engine.need("memory_pool", "MHATokenToKVPool")
    Allocator = engine.need("allocator_token", "TokenToKVPoolAllocator")
    RadixCache = engine.need("radix_cache", "RadixCache")
    CacheInitParams = engine.need("cache_init_params", "CacheInitParams")

    def kv():
        return MHATokenToKVPool(size=slots, page_size=1, dtype=torch.float32, head_num=1,
                                head_dim=HIDDEN, layer_num=1, device="cuda",
                                enable_memory_saver=False, enable_alt_stream=False,
                                enable_kv_cache_copy=True)
    req_to_token_pool = ReqToTokenPool(size=rows, max_context_len=CONTEXT_LEN, device="cuda",
                                       enable_memory_saver=False)
    target_kv, draft_kv = kv(), kv()
    allocator = Allocator(size=slots, dtype=torch.float32, device="cuda", kvcache=target_kv,
                          need_sort=False)
    tree_cache = RadixCache(CacheInitParams(disable=not radix, req_to_token_pool=req_to_token_pool,
                                            token_to_kv_pool_allocator=allocator, page_size=1,
                                            is_eagle=True))
    return Pools(req_to_token_pool=req_to_token_pool, allocator=allocator, target_kv=target_kv,
                 draft_kv=draft_kv, tree_cache=tree_cache)


class OverlapScheduler:
    """One scripted run of the overlap scheduler (see the module docstring)."""

    def __init__(self, engine, rc, server_args, cfg, *, war_barrier: bool, name, delay=None):
        self.engine = engine
        self.cfg = cfg
        self.delay = delay
        dm = torch.get_device_module("cuda")
        self.pools = make_pools(engine, rows=cfg["max_running"] + 2, slots=cfg["kv_slots"],
                                radix=cfg["radix_cache"])
        name(self.pools.req_to_token_pool.req_to_token, "ReqToTokenPool.req_to_token")
        self.workers = make_workers(engine, server_args, topk=cfg["topk"], steps=cfg["steps"],
                                    draft_tokens=cfg["draft_tokens"], mrope=cfg["mrope"],
                                    graphs=cfg["graphs"], pools=self.pools)
        self.model_config = self.workers.target_runner.model_config
        self.kv_log = KVWriteLog()
        self.workers.target_runner.kv_write_log = self.kv_log
        declare_graph_inputs(engine, self.workers, name)
        self.outputs = OutputCollector()
        self.sched = self._assemble_scheduler(dm, war_barrier)
        self.sched.init_overlap()
        self.processor = self._assemble_processor()
        self.sched.batch_result_processor = self.processor
        self.EAGLE = engine.need("spec_info", "SpeculativeAlgorithm").EAGLE
        self.ScheduleBatch = engine.need("schedule_batch", "ScheduleBatch")
        self.running_batch = self.ScheduleBatch(reqs=[], batch_is_full=False)
        self.last_batch = None
        self.step_no = 0
        dm.synchronize()            # engine start-up (graph capture, pools) is done
        for stream, label in ((self.sched.schedule_stream, "schedule_stream"),
                              (self.sched.forward_stream, "forward_stream"),
                              (self.sched.copy_stream, "copy_stream"),
                              (self.workers.spec.plan_stream, "plan_stream(target)"),
                              (self.workers.draft.plan_stream, "plan_stream(draft)")):
            if stream is not None and rc is not None:
                rc.name_stream(stream, label)

    # -- assembly ------------------------------------------------------------------------------
    def _assemble_scheduler(self, dm, war_barrier):
        e = self.engine
        w = self.workers
        NULL = e.need("schedule_batch", "DisaggregationMode").NULL
        sched = e.assemble(
            "scheduler", "Scheduler",
            device="cuda", device_module=dm, enable_overlap=True, is_generation=True,
            spec_algorithm=e.need("spec_info", "SpeculativeAlgorithm").EAGLE,
            draft_worker=w.spec, tp_worker=w.target, model_worker=w.spec,
            req_to_token_pool=self.pools.req_to_token_pool,
            token_to_kv_pool_allocator=self.pools.allocator, tree_cache=self.pools.tree_cache,
            schedule_stream=dm.Stream(), forward_stream=dm.Stream(),
            _war_barrier_enabled=war_barrier, forward_ct=0, _sched_idled=False,
            processed_tokens_counter=0, scripted_scheduler_hook=None,
            profiler_manager=_Ignored(), metrics_reporter=_Ignored(), forward_sleep_time=None,
            disaggregation_mode=NULL, batch_record_buf=[None, None], batch_record_ct=0,
            enable_unified_memory=False, chunked_req=None, beam_coordinator=_Ignored(),
            enable_skip_finishing_decode=True, result_queue=deque(),
            new_token_ratio_tracker=_Ignored(), decode_offload_manager=None,
            enable_pdmux=False, pp_group=w.target.pp_group, scheduler_stage_metrics=None,
            enable_unified_cache_external_linker=False, attn_dp_enabled=False)
        return sched

    def _assemble_processor(self):
        e = self.engine
        NULL = e.need("schedule_batch", "DisaggregationMode").NULL
        return e.assemble(
            "batch_result_processor", "SchedulerBatchResultProcessor",
            is_generation=True, disaggregation_mode=NULL, enable_overlap=True,
            enable_overlap_mlx=False, model_config=self.model_config,
            token_to_kv_pool_allocator=self.pools.allocator, tree_cache=self.pools.tree_cache,
            hisparse_coordinator=None, req_to_token_pool=self.pools.req_to_token_pool,
            decode_offload_manager=None, metrics_collector=_Ignored(),
            metrics_reporter=_Ignored(), draft_worker=self.workers.spec,
            model_worker=self.workers.spec, logprob_result_processor=_Ignored(),
            output_streamer=self.outputs, beam_coordinator=_Ignored(),
            abort_request=lambda *a, **k: None)

    # -- requests ------------------------------------------------------------------------------
    def make_request(self, arrival: Arrival):
        e = self.engine
        SamplingParams = e.need("sampling_params", "SamplingParams")
        Req = e.need("schedule_batch", "Req")
        stop = self.cfg["stop_token"]
        sp = SamplingParams(max_new_tokens=arrival.max_new_tokens, temperature=0,
                            stop_token_ids=[stop] if stop >= 0 else None)
        sp.normalize(None)
        req = Req(arrival.rid, "", array("q", arrival.prompt), sp, vocab_size=VOCAB)
        req.init_next_round_input(self.pools.tree_cache)
        req.extend_end = len(req.full_untruncated_fill_ids)   # what PrefillAdder sets
        return req

    def prefill_batch(self, arrivals):
        reqs = [self.make_request(a) for a in arrivals]
        batch = self.ScheduleBatch.init_new(
            reqs, self.pools.req_to_token_pool, self.pools.allocator, self.pools.tree_cache,
            self.model_config, enable_overlap=True, spec_algorithm=self.EAGLE)
        batch.prepare_for_extend()
        for req in batch.reqs:
            self.kv_log.admit(self.step_no, req, self.pools.tree_cache.root_node)
        return batch

    # -- the loop ------------------------------------------------------------------------------
    def get_next_batch_to_run(self, arrivals):
        """Scheduler.get_next_batch_to_run for this run's shapes (no chunked prefill, DP,
        hisparse or grammar): the same ScheduleBatch calls in the same order."""
        running, last = self.running_batch, self.last_batch
        if last is not None and last.forward_mode.is_extend():
            last.filter_batch()
            if not last.is_empty() and last is not running:
                if running.is_empty():
                    running = last
                else:
                    running.merge_batch(last)
        running.filter_batch()
        self.running_batch = running
        if arrivals:
            return self.prefill_batch(arrivals)
        if running.is_empty():
            return None
        batch = self.sched.update_running_batch(running)
        return batch if batch is not None and not batch.is_empty() else None

    def step(self, arrivals) -> bool:
        """One iteration of event_loop_overlap; False when there was nothing to do."""
        s = self.sched
        self.step_no += 1
        self.kv_log.step = self.step_no
        batch = self.get_next_batch_to_run(arrivals)
        if batch is not None:
            if self.delay is not None:
                self.delay(s.forward_stream, self.cfg["forward_delay_us"])
            result = s.run_batch(batch)
            s._apply_war_barrier()
            s.result_queue.append((batch.copy(), result))
        if self.last_batch is not None:
            self.pop_and_process()
        self.last_batch = batch
        return batch is not None or bool(s.result_queue)

    def pop_and_process(self):
        batch, result = self.sched.result_queue.popleft()
        if batch.forward_mode.is_decode():
            self.processor.process_batch_result_decode(batch, result)
        else:
            self.processor.process_batch_result_prefill(batch, result)

    def run(self, arrivals: list, max_steps: int):
        """Run until every request finished (or max_steps); returns {rid: output ids}; the
        KV oracles are read afterwards (`kv_oracles`)."""
        pending = sorted(arrivals, key=lambda a: a.step)
        dm = torch.get_device_module("cuda")
        with dm.stream(self.sched.schedule_stream):
            for k in range(max_steps):
                now = [a for a in pending if a.step <= k]
                pending = [a for a in pending if a.step > k]
                busy = self.step(now)
                if not busy and not pending and self.running_batch.is_empty():
                    break
            while self.sched.result_queue:
                self.pop_and_process()
        dm.synchronize()
        self.kv_log.step = None
        return dict(self.outputs.outputs)

    def kv_oracles(self) -> dict:
        """The oracles' verdicts as output fields (oracles.py): empty when the KV is intact."""
        bad = radix_kv_mismatches(self.pools.tree_cache, self.pools.target_kv.get_key_buffer(0))
        return {"admissions": self.kv_log.admitted(),
                "prefix_overwrites": self.kv_log.prefix_overwrites(),
                "radix_kv": {"mismatched_slots": [slot for slot, *_ in bad]}}
