"""Names for tensors nobody named: the attribute, variable or dict key that holds them.

A finding on a storage with no `racecheck.name` asks `HolderNames.name_of(storage, lo, hi)`,
once per storage (only findings pay): the live tensors on that storage are found among the
garbage collector's objects, and the objects that refer to them say what the program calls them:

* an instance attribute: `ForwardBatch.seq_lens` (class name and attribute), or an element of
  a list or tuple an attribute holds: `MHATokenToKVPool.k_buffer[3]` (per-layer buffers),
* a variable in a running frame or a module, or a key of a plain dict: `seq_lens`,

preferring, in that order (an attribute before a list element), the holders of the tensor that
best covers the racing bytes. Explicit `racecheck.name` always wins (the checker asks only when
there is none).
"""
from __future__ import annotations

import gc
import itertools
import sys
import types

import torch

from .stacks import is_internal_file

_TENSOR_TYPES = {torch.Tensor: True, torch.nn.Parameter: True}
_ATTR, _ELEMENT, _VARIABLE, _KEY = 0, 1, 2, 3    # holder kinds, best first
ONE_PASS_PER_MOMENT = True      # bench/bench_sglang.py --naming compares with a pass per batch


class HolderNames:
    """`namer(storage, lo, hi)` for the checker (`Sink.set_namer`), with `prefetch(storages)`:
    the storages of one batch of findings are resolved in one pass over the collector's
    objects, which is what costs (a few tenths of a second in a large engine process), not once
    per storage and byte range. A name, once given to a (storage, bytes) pair, stays.

    `moment()` (the sink's position: events emitted so far) says whether the program has run
    since the last pass. While it has not (one flush of the checker's queue, however many
    findings it makes), its objects hold the tensors as they did, so holders found then are
    reused and only storages not yet looked for cost a pass."""

    def __init__(self, registry, moment=None):
        self.registry = registry
        self._moment = moment
        self._cache: dict = {}
        self._holders: dict = {}        # storage -> [(kind, view start, view end, name)]
        self._at = None                 # the moment the holders were found at
        self.passes = 0                 # walks over the collector's objects (bench, tests)

    def __call__(self, storage: int, lo: int = 0, hi: int | None = None) -> str | None:
        return self.name_of(storage, lo, hi)

    def name_of(self, storage: int, lo: int = 0, hi: int | None = None) -> str | None:
        key = (storage, lo, hi)
        if key in self._cache:
            return self._cache[key]
        try:
            self._look_for([storage], new_batch=False)
            name = self._best(self._holders[storage], lo, hi)
        except Exception:       # naming is a courtesy: never let it break a report
            name = None
        self._cache[key] = name
        return name

    def prefetch(self, storages) -> None:
        """A new batch of findings: find the holders of `storages` in one walk (those of
        earlier batches are forgotten once the program has run: it may hold its tensors
        differently now)."""
        try:
            self._look_for(storages, new_batch=True)
        except Exception:       # naming is a courtesy
            pass

    def _look_for(self, storages, *, new_batch: bool) -> None:
        """Holders of `storages`, walking only for those not found since the program last ran
        (without a moment: since the last batch of findings)."""
        if self._moment is not None and ONE_PASS_PER_MOMENT:
            now = self._moment()
            stale, self._at = now != self._at, now
        else:
            stale = new_batch
        if stale:
            self._holders = {}
        todo = [st for st in dict.fromkeys(storages) if st not in self._holders]
        if not todo:
            return
        try:
            self._holders.update(self._resolve(todo))
        finally:
            for st in todo:
                self._holders.setdefault(st, [])

    def forget(self, storage: int) -> None:
        for k in [k for k in self._cache if k[0] == storage]:
            del self._cache[k]
        self._holders.pop(storage, None)

    # -- resolution ----------------------------------------------------------------------------
    @staticmethod
    def _best(holders, lo, hi):
        """Covering views first, then the smallest, attributes before variables before keys,
        then the shortest name."""
        if not holders:
            return None

        def rank(h):
            kind, start, end, name = h
            covers = hi is None or (start <= lo and hi <= end)
            return (0 if covers else 1, end - start, kind, len(name), name)
        return min(holders, key=rank)[3]

    def _resolve(self, storages) -> dict:
        """storage -> [(holder kind, view start, view end, name)] for the live tensors on each."""
        want = {}
        for st in storages:
            cdata = self.registry.cdata_of(st)
            if cdata is not None:
                want[cdata] = st
        if not want:
            return {}
        self.passes += 1
        owner = {}              # id(tensor) -> storage
        tensors = []
        objects = gc.get_objects()
        # the tensors among them, picked without a Python step per object (hundreds of
        # thousands in an engine process)
        for o in itertools.compress(objects, map(_TENSOR_TYPES.get, map(type, objects))):
            st = want.get(o.untyped_storage()._cdata)
            if st is not None:
                owner[id(o)] = st
                tensors.append(o)
        del objects
        if not tensors:
            return {}
        span = {id(t): self._span(t) for t in tensors}
        ids = {id(t): t for t in tensors}
        out: dict = {}

        def add(t, kind, name):
            out.setdefault(owner[id(t)], []).append((kind, *span[id(t)], name))
        for name, t in self._frame_variables(ids):
            add(t, _VARIABLE, name)
        dicts = []              # (a dict holding it, key, tensor, suffix)
        seqs = []               # (a list or tuple holding it, "[i]", tensor)

        def held_by(ref, targets, found):
            """Whether `ref` is done with: a dict (each of `targets`, id -> (object, suffix),
            it holds under a string key goes to `found` as (dict, key, object, suffix)), or a
            holder that names nothing (a class, a module, a frame). Anything else is an
            instance, whose inline attributes the caller reads, or a list or tuple."""
            if isinstance(ref, dict):
                for k, v in ref.items():
                    hit = targets.get(id(v))
                    if hit is not None and v is hit[0] and isinstance(k, str):
                        found.append((ref, k, v, hit[1]))
                return True
            if isinstance(ref, (type, types.ModuleType, types.FrameType)):
                return True
            return False
        tensor_targets = {i: (t, "") for i, t in ids.items()}
        for ref in gc.get_referrers(*tensors):
            if held_by(ref, tensor_targets, dicts):
                continue
            if isinstance(ref, (list, tuple)):
                for i, v in enumerate(ref):
                    if id(v) in ids and v is ids[id(v)]:
                        seqs.append((ref, f"[{i}]", v))
                continue
            for k, v in getattr(ref, "__dict__", {}).items():
                if id(v) in ids and v is ids[id(v)]:
                    add(v, _ATTR, f"{type(ref).__name__}.{k}")
        if seqs:
            # the attribute (or variable, or key) that holds the list: one more walk, only
            # when a tensor is held in one
            by_seq = {id(q): (q, []) for q, _, _ in seqs}
            for q, suffix, v in seqs:
                by_seq[id(q)][1].append((suffix, v))
            seq_targets = {i: (q, "") for i, (q, _) in by_seq.items()}
            found = []
            for ref in gc.get_referrers(*[q for q, _ in by_seq.values()]):
                if held_by(ref, seq_targets, found) or isinstance(ref, (list, tuple)):
                    continue
                for k, v in getattr(ref, "__dict__", {}).items():
                    if id(v) in by_seq and v is by_seq[id(v)][0]:
                        for suffix, t in by_seq[id(v)][1]:
                            add(t, _ELEMENT, f"{type(ref).__name__}.{k}{suffix}")
            for d, k, q, _ in found:
                dicts.extend((d, k, t, suffix) for suffix, t in by_seq[id(q)][1])
        if dicts:
            owners = {}
            for o in gc.get_referrers(*{id(d): d for d, _, _, _ in dicts}.values()):
                d = getattr(o, "__dict__", None) if not isinstance(o, type) else None
                if isinstance(d, dict):
                    owners[id(d)] = o
            for d, k, v, suffix in dicts:
                o = owners.get(id(d))
                if isinstance(o, types.ModuleType):
                    add(v, _VARIABLE, k + suffix)
                elif o is not None:
                    add(v, _ELEMENT if suffix else _ATTR, f"{type(o).__name__}.{k}{suffix}")
                elif k.isidentifier():
                    add(v, _KEY, k + suffix)
        return out

    @staticmethod
    def _span(t) -> tuple:
        """The bytes of its storage a view covers."""
        itemsize = t.element_size()
        start = t.storage_offset() * itemsize
        end = start + max(1, t.numel()) * itemsize if t.is_contiguous() else \
            t.untyped_storage().nbytes()
        return start, end

    def _frame_variables(self, ids):
        """(variable, tensor) in the running frames of the program (racecheck's own skipped)."""
        f = sys._getframe(1)
        depth = 0
        while f is not None and depth < 64:
            if not is_internal_file(f.f_code.co_filename):
                for k, v in f.f_locals.items():
                    if id(v) in ids and v is ids[id(v)]:
                        yield k, v
            f = f.f_back
            depth += 1
