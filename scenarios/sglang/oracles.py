"""Value oracles on the KV cache: did a race land KV writes in a shared radix-cache prefix?

The happens-before checker says two accesses are unordered; these say what an order did. Both
read device memory only after the run's final synchronize, so they never change the schedule
they observe, and both become output fields that the differential oracle compares with the
serialized run of the same schedule:

* `prefix_overwrites` intersects the target model's KV write locations with each admitted
  request's radix-cache prefix slots. A request admitted at loop step j matched slots the tree
  held after the results of step j-2; no forward launched at step j-1 or later owns them, so a
  write there means a forward took its write locations from a `req_to_token` row that had
  already been handed to the new request.
* `radix_kv` checks what the tree promises: the target KV of every cached token is the one the
  tiny model computes for that token at that position (`13 * token + position`). A mismatch is
  corrupted prefix KV that every later request with the prefix reads.

Both assume the run evicted nothing from the tree (the scenario's KV pool is sized for its
schedules); a slot reused after eviction would be a legitimate write.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch


def expected_key(token: int, position: int) -> int:
    """The key the tiny model writes for `token` at `position` (model_runner.TinyModel)."""
    return 13 * token + position


@dataclass
class KVWriteLog:
    """The target model's KV write locations per forward, tagged with the loop step that
    launched the forward. `record` copies the locations on the forward's own stream, so the
    copy holds the values the forward used, whatever the order the streams ran in."""

    step: int | None = None            # None outside the scheduler loop (start-up, capture)
    writes: list = field(default_factory=list)           # [(step, tensor of slots)]
    admissions: list = field(default_factory=list)   # [(step, rid, row, prefix_len, values)]

    def record(self, out_cache_loc) -> None:
        if self.step is not None and out_cache_loc is not None and out_cache_loc.numel():
            self.writes.append((self.step, out_cache_loc.clone()))

    def admit(self, step: int, req, root) -> None:
        """Keep the tree values the request matched (from its last matched node up; the
        tensors themselves, so a later split of those nodes does not matter)."""
        values, node = [], req.last_node if req.prefix_len else None
        while node is not None and node is not root:
            values.append(node.value)
            node = node.parent
        self.admissions.append((step, req.rid, int(req.kv.req_pool_idx), req.prefix_len,
                                values[::-1]))

    def prefix_overwrites(self) -> dict:
        """{rid: sorted prefix slots a forward launched at or after the step before the
        request's admission wrote}; read after the final synchronize."""
        written = [(step, set(loc.tolist())) for step, loc in self.writes]
        out = {}
        for step, rid, _row, prefix_len, values in self.admissions:
            if not prefix_len:
                continue
            slots = set(torch.cat(values).tolist()[:prefix_len])
            hit = set()
            for w_step, locs in written:
                if w_step >= step - 1:
                    hit |= slots & locs
            if hit:
                out[rid] = sorted(hit)
        return out


    def admitted(self) -> dict:
        """{rid: [loop step, req_to_token row, radix-cache prefix length]} per admission."""
        return {rid: [step, row, prefix_len]
                for step, rid, row, prefix_len, _values in self.admissions}


def radix_kv_mismatches(tree_cache, key_buffer) -> list:
    """[(slot, position, expected key, found key)] for every cached token whose target KV is
    not the one the model computed for it."""
    keys = key_buffer.reshape(key_buffer.shape[0], -1)[:, 0]
    root = tree_cache.root_node
    bad = []
    stack = [(root, 0)]
    while stack:
        node, depth = stack.pop()
        slots = node.value.tolist() if node is not root and node.value is not None else []
        if slots:
            tokens = list(node.key.token_ids)[:len(slots)]
            found = keys[torch.as_tensor(slots, dtype=torch.int64)].to(torch.int64).tolist()
            for i, (tok, slot, got) in enumerate(zip(tokens, slots, found)):
                want = expected_key(int(tok), depth + i)
                if got != want:
                    bad.append((slot, depth + i, want, got))
        stack.extend((child, depth + len(slots)) for child in node.children.values())
    return sorted(bad)
