"""CUDA-graph input buffers as sglang declares them (releases with the buffer registry).

sglang says per input slot what happens to the padded rows of a replay (`PaddingPolicy`):
reset them (ZERO, FILL_SENTINEL) or leave them as the previous replay wrote them (KEEP_PAD,
FOREACH_COPY, FILL_ONCE: "caller proves the padded tail will not be read"). racecheck takes that
declaration as sglang makes it: a kept tail is stale-tolerant, except for inputs whose values
index memory (`INDEX_SEMANTIC_BUFFERS`), where a stale value would be read as an address. A stale
tail read as indices into memory the run writes stays RC006 whatever was declared.
"""
from __future__ import annotations

import contextlib
import sys

from . import surface
from .server import patched


@contextlib.contextmanager
def declared_graph_inputs():
    """Each registered slot's buffer is named `graph.<slot>`, and declared stale-tolerant where
    sglang's own padding policy keeps the tail."""
    if not surface.REGISTER_SLOT.exists():
        yield
        return
    import racecheck
    Registry, name = surface.REGISTER_SLOT.owner_and_name()
    register_slot = surface.REGISTER_SLOT.get()
    Policy = surface.PADDING_POLICY.get()
    keeps_tail = {getattr(Policy, p) for p in ("KEEP_PAD", "FOREACH_COPY", "FILL_ONCE")
                  if hasattr(Policy, p)}
    index_semantic = surface.INDEX_SEMANTIC.get() if surface.INDEX_SEMANTIC.exists() else ()

    def declaring_register_slot(registry, slot, *args, **kwargs):
        out = register_slot(registry, slot, *args, **kwargs)
        buffer = getattr(slot, "buffer", None)
        if buffer is not None:
            racecheck.name(buffer, f"graph.{slot.name}")
            if slot.padding_policy in keeps_tail and slot.name not in index_semantic:
                racecheck.stale_tolerant(buffer)
        return out
    with patched(Registry, name, declaring_register_slot):
        yield


@contextlib.contextmanager
def padding_sites(sites):
    """Each slot's padding write is the synchronization site `...fill_from:padding(<slot>)#0`,
    dropped like a wait (the padded rows then keep what the previous replay left there)."""
    if not surface.RESET_PADDING.exists():
        yield
        return
    GraphSlot, name = surface.RESET_PADDING.owner_and_name()
    reset_padding = surface.RESET_PADDING.get()
    Policy = surface.PADDING_POLICY.get()
    writes = {getattr(Policy, p) for p in ("ZERO", "FILL_SENTINEL") if hasattr(Policy, p)}

    def reset_padding_site(slot, raw_n, padded_n):
        if raw_n < padded_n and slot.buffer is not None and slot.padding_policy in writes \
                and sites.visit("padding", f"padding({slot.name})", sys._getframe(1)):
            return None
        return reset_padding(slot, raw_n, padded_n)
    with patched(GraphSlot, name, reset_padding_site):
        yield
