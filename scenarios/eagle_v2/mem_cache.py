"""Request and token pools: `ReqToTokenPool` (row 0 reserved all-zero) and the KV slot allocator.

Both hand out the lowest free index, so a finished request's row and KV slots are the first ones
a joining request gets: that is where a missing WAR barrier really overlaps bytes.
"""
from __future__ import annotations

import bisect

import torch

import racecheck


class ReqToTokenPool:
    """`req_to_token[req_pool_idx, position] = kv slot`. Row 0 stays zero for padded graph rows."""

    def __init__(self, size: int, max_context_len: int, device: str):
        self.size = size
        self.max_context_len = max_context_len
        self.req_to_token = racecheck.name(
            torch.zeros((size + 1, max_context_len), dtype=torch.int32, device=device), "req_to_token")
        self.free_slots = list(range(1, size + 1))

    def available_size(self) -> int:
        return len(self.free_slots)

    def alloc(self, need_size: int):
        if need_size > len(self.free_slots):
            return None
        out, self.free_slots = self.free_slots[:need_size], self.free_slots[need_size:]
        return out

    def free(self, free_index: int) -> None:
        bisect.insort(self.free_slots, free_index)


class TokenToKVPoolAllocator:
    """Host free list of KV slots; slot 0 is the dummy slot padded rows write to."""

    def __init__(self, size: int):
        self.size = size
        self.free_pages = list(range(1, size + 1))

    def available_size(self) -> int:
        return len(self.free_pages)

    def alloc(self, need_size: int):
        if need_size > len(self.free_pages):
            return None
        out, self.free_pages = self.free_pages[:need_size], self.free_pages[need_size:]
        return out

    def free(self, indices) -> None:
        merged = sorted(self.free_pages + list(indices))
        self.free_pages = merged


class KVPools:
    """Target and draft KV caches, the hybrid model's per-request state and its per-draft-token states."""

    def __init__(self, num_slots: int, req_pool_size: int, device: str, num_draft_tokens: int):
        self.kv_cache = racecheck.name(torch.zeros(num_slots + 1, dtype=torch.int64, device=device),
                                       "kv_cache")
        self.draft_kv_cache = racecheck.name(
            torch.zeros(num_slots + 1, dtype=torch.int64, device=device), "draft_kv_cache")
        self.mamba_state = racecheck.name(
            torch.zeros(req_pool_size + 1, dtype=torch.int64, device=device), "mamba_state")
        self.intermediate_ssm_state = racecheck.name(
            torch.zeros((req_pool_size + 1, num_draft_tokens), dtype=torch.int64, device=device),
            "intermediate_ssm_state")
        self.mrope_position_delta = racecheck.name(
            torch.zeros(req_pool_size + 1, dtype=torch.int64, device=device), "mrope_position_delta")
