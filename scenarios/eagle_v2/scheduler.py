"""`Scheduler`: the overlap event loop (schedule stream + forward stream) and the serialized loop.

Iteration N+1 of `event_loop_overlap`: `get_next_batch_to_run` (filter/merge,
`prepare_for_decode` writing `req_to_token` on the schedule stream), `run_batch` (resolve
`seq_lens`, enter the forward stream, forward, stash, `copy_to_cpu`), the WAR barrier, then the
result of batch N is processed on the host (`copy_done.synchronize()`, finishes, frees) while
forward N+1 may run.
"""
from __future__ import annotations

import collections
from functools import partial

from .eagle_worker_v2 import EagleWorkerV2
from .model import IMG_LEN, PROMPT_MAX_LEN
from .model_runner import PREFILL_TOKEN_BUCKETS, ModelRunner
from .overlap_utils import FutureMap
from .schedule_batch import ForwardMode, Req, ScheduleBatch
from .utils import record_stream_each

_SNAPSHOT_FIELDS = ("req_pool_indices", "seq_lens", "out_cache_loc", "input_ids", "spec_info",
                    "forward_mode")


class Scheduler:
    def __init__(self, ctx, server_args):
        self.ctx = ctx
        self.server_args = sa = server_args
        self.device_module = dm = ctx.dm
        lengths = [a.max_new_tokens if a.max_new_tokens is not None else max(1, sa.horizon - a.iteration)
                   for a in sa.schedule]
        prompt_max = PROMPT_MAX_LEN + IMG_LEN
        max_context_len = prompt_max + max(lengths) + 3 * sa.alloc_len_per_decode + 4
        self.req_pool_size = sa.max_running_requests + 2
        self.model_runner = ModelRunner(ctx, sa, max_context_len, self.req_pool_size,
                                        num_slots=self.req_pool_size * max_context_len)
        self.pools = self.model_runner.pools
        if sa.enable_overlap:
            self.schedule_stream = dm.Stream(priority=0)
            ctx.name_stream(self.schedule_stream, "schedule_stream")
            self.forward_stream = dm.Stream()
            ctx.name_stream(self.forward_stream, "forward_stream")
        else:
            self.schedule_stream = self.forward_stream = dm.current_stream()
        self.future_map = FutureMap(ctx, self.req_pool_size, sa.speculative_eagle_topk, sa.flavour,
                                    self.schedule_stream)
        self.worker = EagleWorkerV2(self.model_runner, ctx, sa)
        self.running_batch = ScheduleBatch([], ForwardMode.DECODE, ctx, self.pools, sa)
        self.waiting_queue = []
        self.arrivals = collections.deque(sa.schedule)
        self.lengths = collections.deque(lengths)
        self.last_batch = None
        self.result_queue = collections.deque()
        self.batch_record_buf = [None, None]
        self.batch_record_ct = 0
        self.next_rid = 0
        self.all_reqs = []
        self.probes = []
        self.max_iterations = 4 * (sa.horizon + max(lengths)) + 32
        dm.synchronize()

    # -- the loops --------------------------------------------------------------------------------
    def event_loop(self) -> dict:
        dm = self.device_module
        with dm.stream(self.schedule_stream):
            it = 0
            while True:
                self.recv_requests(it)
                if self.server_args.enable_overlap:
                    self._overlap_step()
                else:
                    self._normal_step()
                it += 1
                if self._idle():
                    break
                if it > self.max_iterations:
                    raise RuntimeError("eagle-v2 scenario did not drain (scheduler bug)")
        dm.synchronize()
        return self.outputs()

    def _overlap_step(self) -> None:
        batch = self.get_next_batch_to_run()
        if batch is not None:
            result = self.run_batch(batch)
            self._apply_war_barrier()
            self.result_queue.append((batch.copy(), result))
        if self.last_batch is not None:
            tmp_batch, tmp_result = self.result_queue.popleft()
            self.process_batch_result(tmp_batch, tmp_result)
        self.last_batch = batch

    def _apply_war_barrier(self) -> None:
        """Right after run_batch, before the previous result is processed (sglang 0.5.23's
        place): everything the schedule stream does next, freeing and reassigning rows
        included, waits for the forward just launched."""
        if self.server_args.war_barrier:
            self.schedule_stream.wait_stream(self.forward_stream)

    def _normal_step(self) -> None:
        batch = self.get_next_batch_to_run()
        if batch is not None:
            result = self.run_batch(batch)
            self.process_batch_result(batch, result)
        self.last_batch = batch

    def _idle(self) -> bool:
        return (not self.arrivals and not self.waiting_queue and self.last_batch is None
                and not self.result_queue and all(r.finished() for r in self.running_batch.reqs))

    # -- scheduling -------------------------------------------------------------------------------
    def recv_requests(self, it: int) -> None:
        while self.arrivals and self.arrivals[0].iteration <= it:
            a = self.arrivals.popleft()
            max_new_tokens = self.lengths.popleft()
            for _ in range(a.count):
                req = Req.new(self.next_rid, self.ctx.seed, max_new_tokens, self.server_args.multimodal)
                self.next_rid += 1
                self.waiting_queue.append(req)
                self.all_reqs.append(req)

    def get_next_batch_to_run(self):
        if self.last_batch is not None and self.last_batch.forward_mode.is_extend():
            self.running_batch.merge_batch(self.last_batch)
        new_batch = self.get_new_batch_prefill()
        if new_batch is not None:
            return new_batch
        if self.running_batch.reqs:
            self.update_running_batch(self.running_batch)
            if self.running_batch.reqs:
                return self.running_batch
        return None

    def update_running_batch(self, batch) -> None:
        keep = [i for i, r in enumerate(batch.reqs) if not r.finished()]
        batch.filter_batch(keep)
        if batch.reqs:
            batch.prepare_for_decode()

    def get_new_batch_prefill(self):
        if not self.waiting_queue:
            return None
        running = sum(1 for r in self.running_batch.reqs if not r.finished())
        rtp = self.model_runner.req_to_token_pool
        budget = PREFILL_TOKEN_BUCKETS[-1]
        admitted, tokens = [], 0
        for req in self.waiting_queue:
            n = len(req.origin_input_ids)
            if (running + len(admitted) + 1 > self.server_args.max_running_requests
                    or rtp.available_size() <= len(admitted) or tokens + n > budget):
                break
            admitted.append(req)
            tokens += n
        if not admitted:
            return None
        self.waiting_queue = self.waiting_queue[len(admitted):]
        for req, idx in zip(admitted, rtp.alloc(len(admitted))):
            req.req_pool_idx = idx
        batch = ScheduleBatch(admitted, ForwardMode.EXTEND, self.ctx, self.pools, self.server_args)
        batch.prepare_for_extend()
        return batch

    # -- run --------------------------------------------------------------------------------------
    def run_batch(self, batch):
        sa, dm = self.server_args, self.device_module
        if batch.forward_mode.is_decode():
            if sa.futuremap_publish:
                self.future_map.resolve_seq_lens_cpu(batch, sa.needs_cpu_seq_lens)
            elif sa.needs_cpu_seq_lens:
                batch.seq_lens_cpu = batch.seq_lens.tolist()
                batch.seq_lens_sum = sum(batch.seq_lens_cpu)
        with dm.stream(self.forward_stream):
            if sa.enable_overlap:
                self.forward_stream.wait_stream(self.schedule_stream)
            snapshot = {f: getattr(batch, f) for f in _SNAPSHOT_FIELDS}
            indices = batch.req_pool_indices
            if batch.forward_mode.is_decode():
                if sa.record_stream_keepalive:
                    record_stream_each(self.ctx, (indices,), self.forward_stream)
                batch.spec_info = self.future_map.resolve_future(indices)
            self.record_batch_in_overlap(batch, snapshot)
            on_publish = partial(self.future_map.publish, indices) if sa.futuremap_publish else None
            result = self.worker.forward_batch_generation(batch, on_publish=on_publish)
            if self.batch_record_buf[self.batch_record_ct] is not None:
                self.batch_record_buf[self.batch_record_ct].extend(result.extra_keep_alive_refs)
            result.copy_done = dm.Event()
            self.future_map.stash(indices, result.next_draft_input)
            result.copy_to_cpu(self.ctx)
            for f, v in snapshot.items():
                setattr(batch, f, v)
        if not sa.futuremap_publish:
            batch.seq_lens = result.new_seq_lens
        batch.input_ids = None
        result.next_draft_input.future_indices = indices
        batch.spec_info = result.next_draft_input
        if result.probes:
            self.probes.append(([r.rid for r in batch.reqs], result.probes))
        return result

    def record_batch_in_overlap(self, batch, snapshot) -> None:
        """The 2-slot ring that keeps this batch's tensors alive until forward N+2 is issued."""
        if not (self.server_args.enable_overlap and self.server_args.record_stream_keepalive):
            return
        self.batch_record_ct = (self.batch_record_ct + 1) % 2
        self.batch_record_buf[self.batch_record_ct] = [batch, snapshot]

    # -- results ----------------------------------------------------------------------------------
    def process_batch_result(self, batch, result) -> None:
        result.copy_done.synchronize()
        tokens = result.next_token_ids_cpu.tolist()
        if batch.forward_mode.is_extend():
            for req, tok in zip(batch.reqs, tokens):
                req.output_ids.append(tok)
                if req.check_finished():
                    self.release_kv_cache(req)
            return
        accept_lens = result.accept_lens_cpu.tolist()
        for req, row, accept_len in zip(batch.reqs, tokens, accept_lens):
            if req.finished():
                continue
            req.output_ids += row[:accept_len]
            req.accept_lens.append(accept_len)
            req.kv_committed_len += accept_len - 1
            if req.check_finished():
                self.release_kv_cache(req)

    def release_kv_cache(self, req) -> None:
        self.pools.token_to_kv_pool_allocator.free(req.kv_slots)
        self.model_runner.req_to_token_pool.free(req.req_pool_idx)
        req.kv_slots = []

    # -- outputs ----------------------------------------------------------------------------------
    def outputs(self) -> dict:
        out = {"output_ids": {}, "accept_lens": {}}
        for req in self.all_reqs:
            out["output_ids"][str(req.rid)] = list(req.output_ids)
            out["accept_lens"][str(req.rid)] = list(req.accept_lens)
        for rids, probes in self.probes:
            for name, t in probes.items():
                values = t.tolist()
                field = out.setdefault(name, {})
                for rid, v in zip(rids, values):
                    field[str(rid)] = v
        return out


def run_pipeline(cfg: dict, ctx) -> dict:
    from .server_args import ServerArgs
    return Scheduler(ctx, ServerArgs.from_config(cfg)).event_loop()
