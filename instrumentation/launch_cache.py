"""Interpreted Triton launches replayed from their exact inputs (sim).

Triton's CPU interpreter is most of a real engine's run on sim, and an engine launches the same
kernel on the same bytes again and again: a graph runner's two warm-ups and its capture run one
forward three times per batch-size bucket. A launch is a deterministic function of its scalar
arguments, the layout of its tensor arguments and the bytes it loads, so a launch that meets a
recorded one on all three needs no interpretation: its stores are written back and its
footprints are the recorded ones, as Triton's own cache stands in for a compilation.

Exactness, by induction over the launch's loads: a load of a byte the launch has not stored yet
reads the byte as it was before the launch, which the check compares with the value the recorded
launch loaded; a load of a byte it stored reads what it stored, which is the recorded value
because every earlier load matched. So the recorded loads (first value per byte) equal to the
current bytes imply the same execution, the same stores and the same footprints. The check is
stronger than it needs to be where a launch loads a byte after storing it (a miss, never a wrong
hit).

Addresses are kept relative to each argument's storage, so a launch on tensors that the CPU
allocator placed elsewhere, laid out the same, still meets its record. Not replayed: kernels
that load pointers from memory (their reach is not their arguments), launches whose accesses
leave their arguments' storages, and arguments without a value-only key (an object whose repr
is its address, a grid computed by a function).
"""
from __future__ import annotations

import collections
import ctypes
import types

import numpy as np
import torch

from . import launch_store
from .addresses import StorageSpans

ENTRIES = 4096          # records kept per process (least recently met dropped first)
BYTES = 64 << 20        # and their arrays' bytes (a default sglang run keeps 159, 4.6 MB)
PER_KEY = 16            # records kept per kernel and argument layout


class Uncacheable(Exception):
    """A launch argument with no value-only key."""


def _scalar_key(v):
    if v is None or isinstance(v, (bool, int, str)):
        return (type(v).__name__, v)
    if isinstance(v, float):
        return ("float", repr(v))             # -0.0 and nan kept apart
    if isinstance(v, torch.dtype):
        return ("dtype", str(v))
    if isinstance(v, (tuple, list)):
        return (type(v).__name__, tuple(_scalar_key(x) for x in v))
    if isinstance(v, np.integer):
        return ("int", int(v))
    if type(v).__name__ == "constexpr" and hasattr(v, "value"):
        return ("constexpr", _scalar_key(v.value))
    dtype_name = getattr(v, "name", None)      # triton.language dtypes
    if type(v).__module__.startswith("triton.language") and isinstance(dtype_name, str):
        return ("tl", type(v).__name__, dtype_name)
    raise Uncacheable(type(v).__name__)


_WALKS: dict = {}       # kernel's Python function -> (functions, ((globals dict, name), ...))


def kernel_functions(fn) -> tuple:
    """The kernel's Python function and those of the @triton.jit functions it calls."""
    return _walk(fn)[0]


def _global_reads(fn) -> tuple:
    """The module globals a kernel and the @triton.jit functions it calls read by name, as
    (globals dict, name): the interpreter reads them at each launch, so their values are part
    of the launch (an engine's platform flag set after import, a constant patched by a test)."""
    return _walk(fn)[1]


def _walk(fn) -> tuple:
    top = getattr(fn, "fn", fn)
    got = _WALKS.get(top)
    if got is not None:
        return got
    funcs, reads, stack, seen = [], [], [top], set()
    while stack:
        f = stack.pop()
        if id(f) in seen or not hasattr(f, "__code__"):
            continue
        seen.add(id(f))
        funcs.append(f)
        g = f.__globals__
        for name in sorted(_code_names(f.__code__)):
            if name not in g:
                continue
            v = g[name]
            while hasattr(v, "fn") and not isinstance(v, types.ModuleType):
                v = v.fn                     # a @triton.jit callee (or its wrappers)
            if isinstance(v, types.FunctionType) and v is not g[name]:
                stack.append(v)
            elif not isinstance(v, (types.ModuleType, type, types.FunctionType,
                                    types.BuiltinFunctionType)):
                reads.append((g, name))
    got = _WALKS[top] = (tuple(funcs), tuple(reads))
    return got


def _code_names(code) -> set:
    names = set(code.co_names)
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            names |= _code_names(c)
    return names


class Layout:
    """The launch's key: its kernel, the globals it reads, grid and arguments, tensors by
    storage-relative layout. `bases` and `sizes`: the argument storages in order of first
    appearance."""

    __slots__ = ("key", "bases", "sizes", "name")

    def __init__(self, fn, grid, args, kwargs):
        if callable(grid):
            raise Uncacheable("grid function")
        self.name = None              # the key's name in a record folder, once asked
        self.bases: list = []
        self.sizes: list = []
        where: dict = {}

        def norm(v):
            if isinstance(v, torch.Tensor):
                st = v.untyped_storage()
                base = st.data_ptr()
                group = where.get(base)
                if group is None:
                    group = where[base] = len(self.bases)
                    self.bases.append(base)
                    self.sizes.append(st.nbytes())
                return ("T", group, v.data_ptr() - base, self.sizes[group], tuple(v.shape),
                        tuple(v.stride()), str(v.dtype))
            if isinstance(v, (tuple, list)) and any(isinstance(x, torch.Tensor) for x in v):
                return (type(v).__name__, tuple(norm(x) for x in v))
            return _scalar_key(v)
        self.key = (fn, tuple((name, _scalar_key(g[name])) for g, name in _global_reads(fn)),
                    _scalar_key(tuple(grid) if isinstance(grid, list) else grid),
                    tuple(norm(a) for a in args),
                    tuple(sorted((k, norm(v)) for k, v in kwargs.items())))

    def signature(self, spans) -> tuple:
        """Which argument storage, host or device, each of the launch's footprint spans is:
        a record's footprints name spans by position."""
        return tuple((self.bases.index(base) if base in self.bases else -1, host)
                     for base, _n, _sid, host in spans)

    def buffers(self) -> list:
        """Writable byte views of the argument storages."""
        return [np.frombuffer((ctypes.c_char * n).from_address(b), dtype=np.uint8) if n else
                np.zeros(0, np.uint8) for b, n in zip(self.bases, self.sizes)]


class Recorder:
    """What one interpreted launch loads (first value of each byte) and stores, per storage."""

    def __init__(self, layout: Layout, bufs: list):
        self.layout = layout
        self.bufs = bufs
        self._spans = StorageSpans(layout.bases, layout.sizes)
        self.loads: list = []          # (group, byte offsets, values) in load order
        self.stores: list = []         # (group, byte offsets)
        self.outside = False

    def note(self, kind: str, addrs, el: int) -> None:
        """`addrs`: element start addresses (uint64) of an access about to happen."""
        one = self._spans.holding(addrs.min(), addrs.max())
        if one is not None:
            self._add(kind, one, addrs, el)
            return
        groups = self._spans.locate(addrs)
        if (groups < 0).any():
            self.outside = True
            return
        for g in np.unique(groups):
            self._add(kind, int(g), addrs[groups == g], el)

    def _add(self, kind: str, g: int, addrs, el: int) -> None:
        offs = (addrs - np.uint64(self.layout.bases[g])).astype(np.int64)
        if el > 1:
            offs = (offs[:, None] + np.arange(el, dtype=np.int64)).reshape(-1)
        if "r" in kind:
            self.loads.append((g, offs, self.bufs[g][offs]))
        if "w" in kind:
            self.stores.append((g, offs))

    def record(self, footprints=None, spans=()) -> "Record | None":
        """The launch's record once it ran, or None where it cannot be replayed. Without
        `footprints` (a run for its values only) the record serves only such runs."""
        relative = None if footprints is None else _relative(footprints, spans)
        if self.outside or (footprints is not None and relative is None):
            return None
        loads = _first_per_byte(self.loads, values=True)
        stores = [(g, offs, self.bufs[g][offs].copy())
                  for g, offs in _first_per_byte(self.stores, values=False)]
        return Record(loads, stores, relative,
                      None if footprints is None else self.layout.signature(spans))


def _first_per_byte(parts, values: bool) -> list:
    by_group: dict = collections.defaultdict(list)
    for p in parts:
        by_group[p[0]].append(p)
    out = []
    for g, ps in sorted(by_group.items()):
        offs = np.concatenate([p[1] for p in ps])
        uniq, first = np.unique(offs, return_index=True)
        if values:
            out.append((g, uniq, np.concatenate([p[2] for p in ps])[first]))
        else:
            out.append((g, uniq))
    return out


def _relative(footprints, spans) -> tuple | None:
    """Each kind's footprints as (span index, ranges, approx), reads then writes; None where
    one is on a storage that is not an argument's."""
    index = {}
    for i, (_base, _n, sid, _host) in enumerate(spans):
        index.setdefault(sid, i)
    if any(f.storage not in index for fps in footprints for f in fps):
        return None
    return tuple(tuple((index[f.storage], f.ranges, f.approx) for f in fps) for fps in footprints)


class Record:
    """A launch's loads, stores and footprints, relative to its argument storages
    (`footprints` None: recorded by a run that logged values only)."""

    __slots__ = ("loads", "stores", "footprints", "spans", "nbytes")

    def __init__(self, loads, stores, footprints, spans=None):
        self.loads = loads
        self.stores = stores
        self.footprints = footprints
        self.spans = spans              # Layout.signature of the spans the footprints name
        self.nbytes = sum(a.nbytes for part in (loads, stores) for p in part for a in p[1:])

    def matches(self, bufs) -> bool:
        return all(np.array_equal(bufs[g][offs], vals) for g, offs, vals in self.loads)

    def replay(self, bufs, spans=(), footprint_type=None) -> tuple:
        """Write the recorded stores back; the footprints on the launch's storages (`spans`:
        (base, bytes, storage id, host) per tensor argument, as the launch logged them)."""
        for g, offs, vals in self.stores:
            bufs[g][offs] = vals
        if self.footprints is None or footprint_type is None:
            return ((), ())
        return tuple(tuple(footprint_type(spans[i][2], ranges, spans[i][3], approx)
                           for i, ranges, approx in fps) for fps in self.footprints)


class LaunchCache:
    """Records of interpreted launches: in memory per process (engines outlive sessions in a
    fuzzer), and in a folder shared by processes (launch_store.py)."""

    def __init__(self, entries: int = ENTRIES, per_key: int = PER_KEY, nbytes: int = BYTES):
        self._records: collections.OrderedDict = collections.OrderedDict()
        self._entries = entries
        self._per_key = per_key
        self._bytes = nbytes
        self.count = 0
        self.nbytes = 0
        self.hits = 0
        self.misses = 0
        self.skipped = 0

    def find(self, layout: Layout, bufs, spans=None) -> Record | None:
        """A record the launch meets; with `spans` (footprints wanted), one whose footprints
        name the same spans. Records other processes wrote are read where memory has none."""
        rec = self._find(layout, bufs, spans)
        if rec is None:
            folder = launch_store.current()
            name = self._name(folder, layout)
            if name is not None:
                new = folder.load(name)
                for parts in reversed(new):
                    self._remember(layout, Record(*parts))
                if new:
                    rec = self._find(layout, bufs, spans)
        return rec

    @staticmethod
    def _name(folder, layout: Layout) -> str | None:
        if folder is None:
            return None
        key = layout.key
        if layout.name is None and isinstance(key, tuple) and key:
            layout.name = folder.key_name(key, kernel_functions(key[0]))
        return layout.name

    def _find(self, layout: Layout, bufs, spans) -> Record | None:
        recs = self._records.get(layout.key)
        if recs is None:
            return None
        sig = None if spans is None else layout.signature(spans)
        for rec in recs:
            if (sig is None or (rec.footprints is not None and rec.spans == sig)) and \
                    rec.matches(bufs):
                self._records.move_to_end(layout.key)
                return rec
        return None

    def keep(self, layout: Layout, rec: Record) -> None:
        """Keep a new record, in memory and, where it has footprints, in the shared folder
        (a checked launch's record serves a run for values only too, not the other way)."""
        self._remember(layout, rec)
        if rec.footprints is None:
            return
        folder = launch_store.current()
        name = self._name(folder, layout)
        if name is not None:
            folder.save(name, (rec.loads, rec.stores, rec.footprints, rec.spans))

    def _remember(self, layout: Layout, rec: Record) -> None:
        recs = self._records.get(layout.key)
        if recs is None:
            recs = self._records[layout.key] = collections.deque(maxlen=self._per_key)
        else:
            self._records.move_to_end(layout.key)
            self._tally(recs, -1)
        recs.appendleft(rec)
        self._tally(recs, 1)
        while (self.count > self._entries or self.nbytes > self._bytes) and len(self._records) > 1:
            _, dropped = self._records.popitem(last=False)
            self._tally(dropped, -1)

    def _tally(self, recs, sign: int) -> None:
        self.count += sign * len(recs)
        self.nbytes += sign * sum(r.nbytes for r in recs)

    def clear(self) -> None:
        """Forget every record in memory, and the counts."""
        self._records.clear()
        launch_store.forget()
        self.count = self.nbytes = self.hits = self.misses = self.skipped = 0


CACHE = LaunchCache()
