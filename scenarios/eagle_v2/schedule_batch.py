"""`Req` and `ScheduleBatch`: the scheduler's view of a batch, prepared on the schedule stream."""
from __future__ import annotations

import enum
from dataclasses import dataclass, field

import torch

from .model import IMG_LEN, make_prompt, prompt_mrope_positions
from .utils import h2d


class ForwardMode(enum.Enum):
    EXTEND = 1
    DECODE = 2
    TARGET_VERIFY = 3
    DRAFT_EXTEND_V2 = 4

    def is_extend(self) -> bool:
        return self is ForwardMode.EXTEND

    def is_decode(self) -> bool:
        return self is ForwardMode.DECODE


@dataclass(eq=False)
class Req:
    rid: int
    origin_input_ids: list
    max_new_tokens: int
    image_id: int | None = None
    image_start: int | None = None
    output_ids: list = field(default_factory=list)
    accept_lens: list = field(default_factory=list)
    req_pool_idx: int | None = None
    kv_slots: list = field(default_factory=list)     # host mirror of req_to_token[req_pool_idx]
    kv_allocated_len: int = 0
    kv_committed_len: int = 0
    finished_reason: str | None = None
    mrope_positions: list | None = None
    mrope_position_delta: int = 0

    @classmethod
    def new(cls, rid: int, seed: int, max_new_tokens: int, multimodal: bool) -> "Req":
        ids, image_id, start = make_prompt(seed, rid, multimodal)
        req = cls(rid, ids, max_new_tokens, image_id, start)
        req.mrope_positions, req.mrope_position_delta = prompt_mrope_positions(len(ids), start)
        return req

    def finished(self) -> bool:
        return self.finished_reason is not None

    def check_finished(self) -> bool:
        if len(self.output_ids) >= self.max_new_tokens:
            del self.output_ids[self.max_new_tokens:]
            self.finished_reason = "length"
        return self.finished()


class ScheduleBatch:
    """Device fields live on the schedule stream until `run_batch` hands them to the forward stream."""

    def __init__(self, reqs, forward_mode, ctx, pools, server_args):
        self.reqs = list(reqs)
        self.forward_mode = forward_mode
        self.ctx = ctx
        self.pools = pools
        self.server_args = server_args
        self.req_pool_indices = None
        self.req_pool_indices_cpu = [r.req_pool_idx for r in self.reqs]
        self.seq_lens = None
        self.seq_lens_cpu = None
        self.seq_lens_sum = None
        self.out_cache_loc = None
        self.input_ids = None
        self.spec_info = None
        # extend (prefill) only
        self.positions = None
        self.mrope_positions = None
        self.extend_batch_index = None
        self.image_ids = None
        self.image_token_index = None
        self.last_token_index = None
        self.extend_num_tokens = 0

    def batch_size(self) -> int:
        return len(self.reqs)

    def is_empty(self) -> bool:
        return not self.reqs

    # -- prefill ----------------------------------------------------------------------------------
    def prepare_for_extend(self) -> None:
        """Host bookkeeping + H2D of the prompt; `req_to_token` rows written on the schedule stream."""
        pools, rtp = self.pools, self.pools.req_to_token_pool
        ids, pos, m0, m1, m2, locs, rows, cols, bidx, img, imgk = ([] for _ in range(11))
        last, lens, deltas = [], [], []
        for b, req in enumerate(self.reqs):
            n = len(req.origin_input_ids)
            slots = pools.token_to_kv_pool_allocator.alloc(n)
            req.kv_slots = list(slots)
            req.kv_allocated_len = req.kv_committed_len = n
            for j, tok in enumerate(req.origin_input_ids):
                ids.append(tok), pos.append(j), locs.append(slots[j])
                rows.append(req.req_pool_idx), cols.append(j), bidx.append(b)
                in_image = req.image_start is not None and req.image_start <= j < req.image_start + IMG_LEN
                img.append(req.image_id if in_image else 0)
                imgk.append(j - req.image_start if in_image else 0)
            m0 += req.mrope_positions[0]
            m1 += req.mrope_positions[1]
            m2 += req.mrope_positions[2]
            last.append(len(ids) - 1), lens.append(n), deltas.append(req.mrope_position_delta)
        tok = h2d(self.ctx, [ids, pos, m0, m1, m2, locs, rows, cols, bidx, img, imgk])
        per_req = h2d(self.ctx, [self.req_pool_indices_cpu, lens, last, deltas])
        self.input_ids, self.positions = tok[0], tok[1]
        self.mrope_positions = tok[2:5]
        self.out_cache_loc, self.extend_batch_index = tok[5], tok[8]
        self.image_ids, self.image_token_index = tok[9], tok[10]
        self.req_pool_indices, self.seq_lens, self.last_token_index = per_req[0], per_req[1], per_req[2]
        self.seq_lens_cpu, self.seq_lens_sum = lens, sum(lens)
        self.extend_num_tokens = len(ids)
        rtp.req_to_token.index_put_((tok[6], tok[7]), self.out_cache_loc.to(torch.int32))
        if self.server_args.model_is_mrope:
            pools.mrope_position_delta.index_put_((per_req[0],), per_req[3])

    # -- decode -----------------------------------------------------------------------------------
    def prepare_for_decode(self) -> None:
        """`EagleDraftInputV2Mixin.prepare_for_decode`: pre-claim KV for two in-flight iterations.

        The host only knows lengths committed by results it has processed (one iteration behind
        when overlapped), so it allocates up to `committed + 2 * alloc_len_per_decode` and writes
        the new columns of `req_to_token` on the schedule stream.
        """
        self.forward_mode = ForwardMode.DECODE
        per = self.server_args.alloc_len_per_decode
        alloc = self.pools.token_to_kv_pool_allocator
        rows, cols, locs = [], [], []
        for req in self.reqs:
            cur = req.kv_allocated_len
            nxt = max(cur, req.kv_committed_len + 2 * per)
            req.kv_committed_len += 1
            if nxt > cur:
                slots = alloc.alloc(nxt - cur)
                req.kv_slots += slots
                req.kv_allocated_len = nxt
                rows += [req.req_pool_idx] * (nxt - cur)
                cols += list(range(cur, nxt))
                locs += slots
        self.out_cache_loc = None
        if locs:
            t = h2d(self.ctx, [rows, cols, locs])
            self.out_cache_loc = t[2]
            self.pools.req_to_token_pool.req_to_token.index_put_((t[0], t[1]), t[2].to(torch.int32))

    def filter_batch(self, keep_indices) -> None:
        if len(keep_indices) == len(self.reqs):
            return
        self.reqs = [self.reqs[i] for i in keep_indices]
        self.req_pool_indices_cpu = [self.req_pool_indices_cpu[i] for i in keep_indices]
        if not keep_indices:
            self.req_pool_indices = self.seq_lens = None
            self.seq_lens_cpu = None
            return
        keep = h2d(self.ctx, keep_indices)
        self.req_pool_indices = self.req_pool_indices[keep]
        self.seq_lens = self.seq_lens[keep]
        if self.seq_lens_cpu is not None:
            self.seq_lens_cpu = [self.seq_lens_cpu[i] for i in keep_indices]
        self.out_cache_loc = None

    def merge_batch(self, other: "ScheduleBatch") -> None:
        if self.is_empty():
            self.reqs = list(other.reqs)
            self.req_pool_indices_cpu = list(other.req_pool_indices_cpu)
            self.req_pool_indices, self.seq_lens = other.req_pool_indices, other.seq_lens
            self.seq_lens_cpu = other.seq_lens_cpu
            self.spec_info = other.spec_info
            return
        self.reqs += other.reqs
        self.req_pool_indices_cpu += other.req_pool_indices_cpu
        self.req_pool_indices = torch.cat([self.req_pool_indices, other.req_pool_indices])
        self.seq_lens = torch.cat([self.seq_lens, other.seq_lens])
        if self.seq_lens_cpu is not None and other.seq_lens_cpu is not None:
            self.seq_lens_cpu = self.seq_lens_cpu + other.seq_lens_cpu
        self.out_cache_loc = None

    def copy(self) -> "ScheduleBatch":
        """What `result_queue` keeps: the request list and mode, not the device fields."""
        c = ScheduleBatch(self.reqs, self.forward_mode, self.ctx, self.pools, self.server_args)
        c.out_cache_loc = self.out_cache_loc
        return c
