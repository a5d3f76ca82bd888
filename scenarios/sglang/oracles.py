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
    buffers = _kv_buffers(pool)
    if buffers is None:
        return None
    rows = _as_bytes(_device_rows(*buffers))
    reserved = int(getattr(pool, "page_size", 1) or 1)
    written = rows[reserved:].any(axis=1).nonzero()[0] + reserved
    return {str(int(slot)): _digest(rows[slot]) for slot in written}


def _target_pool(scheduler):
    get_kvcache = _walk(scheduler, surface.KV_POOL)
    return None if get_kvcache is None else get_kvcache()


def _kv_buffers(pool):
    """(per-layer key buffers, per-layer value buffers) of a pool, or None."""
    keys, values = (getattr(pool, name, None) for name in surface.KV_BUFFERS)
    if not keys or not values or len(keys) != len(values):
        return None
    return keys, values


def kv_tiers(scheduler):
    """What `tiers()` reads, taken while sglang still holds it (its shutdown releases the host
    pool): a callable giving the tiers' verdict once the device is idle, or None without a host
    tier."""
    root = _walk(scheduler, surface.TREE_ROOT)
    host = _walk(scheduler, surface.HOST_POOL)
    buffers = _kv_buffers(_target_pool(scheduler))
    if root is None or host is None or buffers is None:
        return None
    host = _walk(host, surface.HOST_POOL_IN_GROUP) or host
    buf, layout = getattr(host, surface.HOST_KV_BUFFER, None), getattr(host, "layout", None)
    if buf is None:
        return None
    tree = _walk(scheduler, surface.TREE_ROOT[:-1])
    return lambda: tiers(root, _device_rows(*buffers), _host_rows(buf, layout), _pending(tree))


def tiers(root, device_rows, host_rows, pending=frozenset()) -> dict | None:
    """{"P:H": "agree"} for each token the radix tree under `root` holds on both the device and
    the host, keyed by its path (P tokens deep, H a hash of the path), with the two digests
    instead of "agree" where the copies differ; None for a host layout not read here.

    A radix node's KV never changes while the tree holds it, so its host copy equals its device
    copy in any correct run, whatever the timing: a backup that read device rows after they were
    reused, or a load-back that brought stale or torn host rows into the device, breaks it. The
    check needs no reference run, which matters here: the serialized reference has a larger pool
    (other slots, other batches), and float32 KV is not bit-identical across batch sizes.
    Nodes in `pending` (ids of nodes whose transfer sglang has not acknowledged) are skipped:
    sglang itself does not rely on their copies yet."""
    if host_rows is None:
        return None
    device = _as_bytes(device_rows)
    host = _as_bytes(host_rows.to(device_rows.dtype))
    out = {}
    stack = [(child, b"", 0) for child in root.children.values()]
    while stack:
        node, path, depth = stack.pop()
        in_flight = id(node) in pending or any(getattr(node, mark, None) is not None
                                               for mark in surface.NODE_PENDING_MARKS)
        slots, host_indices = (None, None) if in_flight else \
            (_indices(t) for t in _kv_locations(node))
        entries = _entries(node.key)
        for i, entry in enumerate(entries):
            path = hashlib.blake2b(path + repr(entry).encode(), digest_size=8).digest()
            if slots is None or host_indices is None or i >= min(len(slots), len(host_indices)):
                continue
            on_device, on_host = _digest(device[slots[i]]), _digest(host[host_indices[i]])
            out[f"{depth + i + 1}:{path.hex()}"] = "agree" if on_device == on_host else \
                f"device {on_device}, host {on_host}"
        stack.extend((child, path, depth + len(entries)) for child in node.children.values())
    return out


def _pending(tree) -> frozenset:
    """ids of the tree nodes held by sglang's maps of unacknowledged transfers (each value a
    node, or a tuple or record holding nodes)."""
    found = set()

    def visit(value, depth):
        if hasattr(value, "children") and hasattr(value, "key"):
            found.add(id(value))
        elif depth < 3 and isinstance(value, (tuple, list, set)):
            for v in value:
                visit(v, depth + 1)
        elif depth < 3 and hasattr(value, "__dict__") and not isinstance(value, type):
            for v in vars(value).values():
                visit(v, depth + 1)
    for name in surface.TREE_PENDING_MAPS:
        table = getattr(tree, name, None)
        if isinstance(table, dict):
            for value in list(table.values()):
                visit(value, 0)
    return frozenset(found)


def _walk(obj, names):
    for name in names:
        obj = getattr(obj, name, None)
        if obj is None:
            return None
    return obj


def _device_rows(keys, values):
    """The pool's KV as one row per slot: keys over the layers, then values."""
    import torch
    slots = keys[0].shape[0]
    return torch.cat([b.reshape(slots, -1) for b in (*keys, *values)], dim=1)


def _host_rows(buf, layout):
    """The host pool's KV as one row per host index, in the device rows' order (keys over the
    layers, then values), or None for a layout not read here."""
    if buf.dim() < 5:
        return None
    if layout == "layer_first":          # [2, layers, size, heads, dim]
        rows = buf.permute(2, 0, 1, 3, 4)
    elif layout == "page_first":         # [2, size, layers, heads, dim]
        rows = buf.permute(1, 0, 2, 3, 4)
    elif layout == "page_first_direct" and buf.dim() == 6:   # [2, pages, layers, page, heads, dim]
        rows = buf.permute(1, 3, 0, 2, 4, 5)
        rows = rows.reshape(rows.shape[0] * rows.shape[1], *rows.shape[2:])
    else:
        return None
    return rows.reshape(rows.shape[0], -1)


def _kv_locations(node):
    """(device slots, host indices) of a tree node's tokens, each a tensor or None."""
    import sys
    components = getattr(node, surface.NODE_FULL_COMPONENT, None)
    if components is not None:
        kinds = getattr(sys.modules.get(type(node).__module__), "ComponentType", None)
        node = components[int(kinds.FULL) if kinds is not None else 0]
    return getattr(node, "value", None), getattr(node, "host_value", None)


def _indices(t):
    return None if t is None else [int(i) for i in t.reshape(-1).tolist()]


def _entries(key) -> list:
    """A node key's entries as the tree matches them: tokens, or token pairs where EAGLE keys
    the tree by bigrams."""
    if key is None:
        return []
    raw = list(key.raw_token_ids()) if hasattr(key, "raw_token_ids") else \
        list(getattr(key, "token_ids", key))
    extra = getattr(key, "extra_key", None)
    n = len(key)
    if getattr(key, "is_bigram", False):
        entries = [(raw[i], raw[i + 1]) for i in range(n)]
    else:
        entries = raw[:n]
    return [(extra, e) for e in entries] if extra is not None else entries


def _as_bytes(rows):
    """Rows of KV as a numpy array of their bytes, one row per slot or host index."""
    import torch
    return rows.contiguous().view(torch.uint8).cpu().numpy()


def _digest(row) -> str:
    return hashlib.blake2b(row.tobytes(), digest_size=8).hexdigest()
