"""Tensor -> Footprint: storage identity and the exact bytes a view covers.

Memory is identified by storage (one id per storage lifetime, never by `data_ptr()` of a view)
and byte intervals. Contiguous views are one interval (the hot path). Strided views are
enumerated into runs when that is cheap and covered by their bounding interval otherwise,
which the footprint says. Index ops resolve their index values into the exact rows/elements.
"""
from __future__ import annotations

import itertools
import sys
import weakref
from collections import deque

import torch

from racecheck.core import native
from racecheck.core.cnames import read_by_c
from racecheck.core.trace import Footprint

from .stacks import _internal as internal_files, drop_site

MAX_RUNS = 4096          # above this many runs a strided view is covered by its bounding interval
MAX_INDEX_ELEMS = 1 << 20  # above this many touched positions an index op covers the whole view
_CACHE_LIMIT = 8192
_FREE_FRAMES = 4   # frames kept of where a storage died
getframe = sys._getframe
CACHE_ATTR = "_racecheck_fp"
_tokens = itertools.count(1)

# What the C hot path (instrumentation/_speedups.c) reads of torch's tensors and storages, as the
# Python here does: footprints, registration, a tensor's device
read_by_c("numel", "is_contiguous", "untyped_storage", "element_size", "storage_offset", "_is_view",
          "data_ptr", "get_device", "is_cpu")(torch.Tensor)
read_by_c("_cdata", "nbytes")(torch.UntypedStorage)


@read_by_c("_next", "_by_cdata", "_cdata_of", "host_sids", "dead", "_on_new", "new_are_host", "host_of")
class StorageRegistry:
    """Assigns ids to storages and notices when they die.

    Weak references to `untyped_storage()` tie history to a storage's lifetime, so a new
    tensor at a reused address never inherits stale accesses. Deaths are queued (a weakref
    callback may fire anywhere, even inside the checker) and drained by the session.
    """

    def __init__(self, on_new, dead: deque | None = None):
        self._on_new = on_new            # on_new(sid, nbytes, host) -> None
        self._by_cdata: dict = {}        # cdata -> (sid, weakref, host)
        self._cdata_of: dict = {}        # sid -> cdata, while the storage lives
        self._next = 1
        self.dead: deque = deque() if dead is None else dead   # (sid, stack) died, not yet reported
        self.host_sids: set = set()
        self.new_are_host = False        # storages first seen now are host memory (host ops)
        self.host_of = None              # backend's classifier for storages first seen (cuda: t.is_cpu)
        fast = native.speedups
        if fast is not None and hasattr(fast, "Registrar") \
                and type(self).register is StorageRegistry.register:
            self.register = fast.Registrar(self)     # the same, in C

    def lookup(self, t: torch.Tensor, host: bool = False):
        """(sid, is_host) of t's storage, registering it on first sight."""
        st = t.untyped_storage()
        entry = self._by_cdata.get(st._cdata)
        if entry is not None:
            return entry[0], entry[2]
        return self.register(t, st, host)

    def register(self, t: torch.Tensor, st, host: bool = False):
        """(sid, is_host) of a storage `st` (t's) not seen before."""
        key = st._cdata
        host = host or self.new_are_host or (self.host_of is not None and self.host_of(t))
        sid = self._next
        self._next += 1
        by_cdata, dead, host_sids, cdata_of = self._by_cdata, self.dead, self.host_sids, self._cdata_of

        def _died(_ref, key=key, sid=sid):
            cur = by_cdata.get(key)
            if cur is not None and cur[0] == sid:
                del by_cdata[key]
            cdata_of.pop(sid, None)
            host_sids.discard(sid)
            # CPython runs this where the last reference went: the `del`, the rebinding, the
            # return that dropped the tensor (RC005 names that line); one user frame is enough
            try:
                f = getframe(1)
            except ValueError:          # dropped from C with no Python frame (GC at teardown)
                dead.append((sid, ()))
                return
            code = f.f_code
            if internal_files.get(code.co_filename) is False:
                dead.append((sid, ((code, f.f_lasti),)))
            else:
                dead.append((sid, drop_site(_FREE_FRAMES)))

        self._by_cdata[key] = (sid, weakref.ref(st, _died), host)
        cdata_of[sid] = key
        if host:
            host_sids.add(sid)
        self._on_new(sid, st.nbytes(), host)
        return sid, host

    def live_spans(self) -> list:
        """(first byte address, nbytes, sid, host) of every live registered storage."""
        out = []
        for sid, ref, host in list(self._by_cdata.values()):
            st = ref()
            if st is not None:
                out.append((st.data_ptr(), st.nbytes(), sid, host))
        return out

    def live_storages(self) -> list:
        """Every live registered storage (strong references)."""
        out = []
        for _sid, ref, _host in list(self._by_cdata.values()):
            st = ref()
            if st is not None:
                out.append(st)
        return out

    def cdata_of(self, sid: int) -> int | None:
        """C handle of a live storage by its id (names for findings)."""
        return self._cdata_of.get(sid)

    def sid_of_cdata(self, cdata: int) -> int | None:
        """Storage id of a live storage by its C handle (`untyped_storage()._cdata`), if known."""
        entry = self._by_cdata.get(cdata)
        return entry[0] if entry is not None else None

    def is_registered(self, t: torch.Tensor) -> bool:
        return t.untyped_storage()._cdata in self._by_cdata

    def is_known_device(self, t: torch.Tensor) -> bool:
        entry = self._by_cdata.get(t.untyped_storage()._cdata)
        return entry is not None and not entry[2]

    def is_host(self, t: torch.Tensor) -> bool:
        entry = self._by_cdata.get(t.untyped_storage()._cdata)
        if entry is None:
            return self.host_of is not None and self.host_of(t)
        return entry[2]


def _merge(ranges):
    ranges.sort()
    out = []
    for lo, hi in ranges:
        if out and lo <= out[-1][1]:
            if hi > out[-1][1]:
                out[-1][1] = hi
        else:
            out.append([lo, hi])
    return tuple((lo, hi) for lo, hi in out)


def strided_ranges(offset: int, sizes, strides, itemsize: int):
    """Byte ranges of a strided view, exact when at most MAX_RUNS runs; else (cover, approx)."""
    dims = [(sz, st) for sz, st in zip(sizes, strides) if sz != 1]
    if any(sz == 0 for sz in sizes):
        return (), None
    if not dims:
        return ((offset * itemsize, (offset + 1) * itemsize),), None
    lo_el = offset + sum((sz - 1) * st for sz, st in dims if st < 0)
    hi_el = offset + sum((sz - 1) * st for sz, st in dims if st > 0) + 1
    dims = [(sz, abs(st)) for sz, st in dims if st != 0]  # broadcast dims repeat the same bytes
    if not dims:
        return ((offset * itemsize, (offset + 1) * itemsize),), None
    dims.sort(key=lambda d: d[1])
    # Fold the innermost dims into one contiguous run while they tile without gaps.
    run = 1
    i = 0
    while i < len(dims) and dims[i][1] == run:
        run *= dims[i][0]
        i += 1
    outer = dims[i:]
    nruns = 1
    for sz, _ in outer:
        nruns *= sz
    if nruns > MAX_RUNS:
        return ((lo_el * itemsize, hi_el * itemsize),), "strided view covered by its bounding interval"
    starts = [lo_el]
    for sz, st in outer:
        starts = [s + k * st for s in starts for k in range(sz)]
    return _merge([[s * itemsize, (s + run) * itemsize] for s in starts]), None


def positions_to_ranges(pos: torch.Tensor, itemsize: int):
    """Sorted distinct element positions -> merged byte ranges."""
    if pos.numel() == 0:
        return ()
    u = torch.unique(pos.reshape(-1))
    if u.numel() == 1:
        p = int(u[0])
        return ((p * itemsize, (p + 1) * itemsize),)
    breaks = torch.nonzero(u[1:] - u[:-1] != 1).reshape(-1)
    starts = torch.cat([u[:1], u[breaks + 1]]).tolist()
    ends = torch.cat([u[breaks], u[-1:]]).tolist()
    return tuple((s * itemsize, (e + 1) * itemsize) for s, e in zip(starts, ends))


def element_positions(t: torch.Tensor) -> torch.Tensor:
    """Storage element index of every element of `t`, shaped like `t` (for index-op footprints)."""
    pos = torch.full((), t.storage_offset(), dtype=torch.int64)
    for d, (sz, st) in enumerate(zip(t.shape, t.stride())):
        shape = [1] * t.dim()
        shape[d] = sz
        pos = pos + (torch.arange(sz, dtype=torch.int64) * st).reshape(shape)
    return pos.expand(t.shape) if t.dim() else pos


class FootprintMaker:
    """Computes footprints; contiguous tensors take the O(1) path, strided ones are cached."""

    def __init__(self, registry: StorageRegistry):
        self.registry = registry
        self.token = next(_tokens)       # cache entries of another session's maker are stale
        self._by_cdata = registry._by_cdata
        self._cache: dict = {}
        self._slices: dict = {}
        self.born_attr = "_racecheck_born"
        fast = native.speedups
        if fast is not None and type(self).of is FootprintMaker.of:
            # `of` in C: the cache, and contiguous tensors (the rest through _compute)
            self.of = fast.Footprints(by_cdata=self._by_cdata, register=registry.register,
                                      compute=self._compute, footprint_type=Footprint,
                                      token=self.token, attr=CACHE_ATTR, born_attr=self.born_attr)

    def of(self, t: torch.Tensor) -> Footprint | None:
        """Footprint of a whole view. Cached on the tensor while its data pointer is unchanged
        (in-place metadata ops drop the cache: see `forget`); footprints are never mutated."""
        d = t.__dict__
        hit = d.get(CACHE_ATTR)
        if hit is not None and hit[0] == self.token and hit[1] == t.data_ptr():
            return hit[2]
        fp = self._compute(t)
        if fp is not None:
            d[CACHE_ATTR] = (self.token, t.data_ptr(), fp)
        return fp

    @staticmethod
    def forget(t: torch.Tensor) -> None:
        t.__dict__.pop(CACHE_ATTR, None)

    def whole(self, t: torch.Tensor, approx: str) -> Footprint | None:
        """The whole view, marked as covering more than the access touches."""
        fp = self.of(t)
        return None if fp is None else Footprint(fp.storage, fp.ranges, fp.host, approx, fp.born)

    def _compute(self, t: torch.Tensor) -> Footprint | None:
        n = t.numel()
        if n == 0:
            return None
        st = t.untyped_storage()
        entry = self._by_cdata.get(st._cdata)
        if entry is None:
            sid, host = self.registry.register(t, st)
        else:
            sid, host = entry[0], entry[2]
        itemsize = t.element_size()
        off = t.storage_offset()
        born = t.__dict__.get("_racecheck_born") if t._is_view() else None
        if t.is_contiguous():
            return Footprint(sid, ((off * itemsize, (off + n) * itemsize),), host, None, born)
        key = (off, t.shape, t.stride(), itemsize)
        hit = self._cache.get(key)
        if hit is None:
            if len(self._cache) > _CACHE_LIMIT:
                self._cache.clear()
            hit = self._cache[key] = strided_ranges(off, t.shape, t.stride(), itemsize)
        return Footprint(sid, hit[0], host, hit[1], born)

    def slice_ranges(self, t: torch.Tensor, d: int):
        """(byte ranges of t's first slice along dim d, bytes between slices), or (None, None)
        when that slice is not exact; cached per view geometry (index ops on one buffer repeat)."""
        itemsize = t.element_size()
        key = (t.storage_offset(), t.shape, t.stride(), itemsize, d)
        hit = self._slices.get(key)
        if hit is None:
            sizes = list(t.shape)
            strides = list(t.stride())
            sizes[d] = 1
            base, approx = strided_ranges(key[0], sizes, strides, itemsize)
            hit = (None, None) if approx is not None else (base, strides[d] * itemsize)
            if len(self._slices) > _CACHE_LIMIT:
                self._slices.clear()
            self._slices[key] = hit
        return hit

    def of_positions(self, t: torch.Tensor, pos: torch.Tensor) -> Footprint | None:
        """Footprint of the storage elements `pos` of t's storage."""
        if pos.numel() == 0:
            return None
        sid, host = self.registry.lookup(t)
        if pos.numel() > MAX_INDEX_ELEMS:
            fp = self.of(t)
            return Footprint(fp.storage, fp.ranges, host, "index set too large; whole view used", fp.born)
        return Footprint(sid, positions_to_ranges(pos, t.element_size()), host)
