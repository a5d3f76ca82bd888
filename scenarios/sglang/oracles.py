"""Value oracles read from sglang's own state once its loop has ended and the device is idle.

The token ids a request returns hide most wrong KV: a tiny model's argmax survives small errors,
and the KV a finished request leaves in the radix cache is read only by a later request that
shares its prefix. So a run also reports the target model's KV pool, slot by slot, and the
differential oracle compares it with the serialized run's: sglang allocates slots on the host
in the same order in both runs, so a slot whose KV differs holds a value no serialized run
computes (a forward that wrote into a row it should not have, or read indices being rewritten).
"""
from __future__ import annotations

import hashlib

from . import surface


def kv_cache(scheduler) -> dict | None:
    """{"N": digest of slot N's keys and values over every layer} for each slot a forward wrote
    (the pool starts zeroed), or None where the pool is not a per-layer key/value buffer pair.
    The first page is left out: sglang reserves it for the padded rows of graph batches, which
    write their dummy KV there."""
    pool = _target_pool(scheduler)
    if pool is None:
        return None
    import torch
    keys, values = (getattr(pool, name, None) for name in surface.KV_BUFFERS)
    if not keys or not values or len(keys) != len(values):
        return None
    slots = keys[0].shape[0]
    rows = torch.cat([b.reshape(slots, -1) for b in (*keys, *values)], dim=1)
    rows = rows.view(torch.uint8).cpu().numpy()
    reserved = int(getattr(pool, "page_size", 1) or 1)
    written = rows[reserved:].any(axis=1).nonzero()[0] + reserved
    return {str(int(slot)): hashlib.blake2b(rows[slot].tobytes(), digest_size=8).hexdigest()
            for slot in written}


def _target_pool(scheduler):
    obj = scheduler
    for name in surface.KV_POOL:
        obj = getattr(obj, name, None)
        if obj is None:
            return None
    return obj()
