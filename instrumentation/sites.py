"""Synchronization sites: every place a program synchronizes, named stably, and droppable.

A site is where the program's own code calls a synchronization: `Stream.wait_stream`,
`Stream.wait_event` / `Event.wait`, `Event.record`, `synchronize` (stream, event, device),
`Tensor.record_stream`, or an operation a scenario registers as a site (graph-input padding
writes). Its id is

    module:qualname:method#k        e.g. sglang.srt.speculative.eagle_worker_common:run_eagle_verify:wait_stream#0

from the first frame of the program's code: the module, the enclosing function's qualified name,
the method, and k, the method's occurrence among that function's calls of it (read from the
function's bytecode, so the id does not change when other code moves). Sync mutation analysis
runs a program once listing the sites it executed, then again with each site dropped:
a dropped wait, record, synchronize or record_stream does nothing (a no-op on the device too);
a dropped registered operation is skipped.
"""
from __future__ import annotations

import dis
import fnmatch
import os
import sys
import threading
from dataclasses import dataclass, field

from racecheck.core.errors import UsageError

from .stacks import is_internal_file


@dataclass
class Site:
    """One synchronization site a run executed."""

    id: str
    kind: str                 # wait_stream, wait_event, record, synchronize, record_stream, padding
    location: str             # "file.py:123"
    calls: int = 0
    dropped: int = 0

    def to_json(self) -> dict:
        return {"id": self.id, "kind": self.kind, "location": self.location, "calls": self.calls}


@dataclass
class SyncSites:
    """The sites of one session: what ran, and which to drop (ids or fnmatch patterns)."""

    drop: tuple = ()
    executed: dict = field(default_factory=dict)     # id -> Site, in first-execution order

    def __post_init__(self):
        self.drop = tuple(str(d) for d in self.drop)
        for d in self.drop:
            if ":" not in d:
                raise UsageError(f"--drop-sync {d!r}: a site id is module:function:method#k "
                                 "(list them with `racecheck mutate SCENARIO --list`)")
        self._exact = frozenset(d for d in self.drop if not any(c in d for c in "*?["))
        self._patterns = tuple(d for d in self.drop if d not in self._exact)
        self._lock = threading.Lock()

    def visit(self, kind: str, method: str | None = None, frame=None) -> bool:
        """Note that the program is at a site of `kind` now; True when it is to be dropped.
        `frame`: the caller that owns the site, for wrappers a scenario installs itself."""
        where = frame if frame is not None else _user_frame()
        if where is None:
            return False
        site_id, location = where_to_site(where, method or kind)
        with self._lock:
            s = self.executed.get(site_id)
            if s is None:
                s = self.executed[site_id] = Site(site_id, kind, location)
            s.calls += 1
            drop = site_id in self._exact or any(fnmatch.fnmatchcase(site_id, p)
                                                 for p in self._patterns)
            if drop:
                s.dropped += 1
            return drop

    def sites(self) -> list:
        return list(self.executed.values())

    def unmatched_drops(self) -> list:
        """Drop requests no executed site matched (a typo, or code that moved)."""
        out = []
        for d in self.drop:
            if not any(fnmatch.fnmatchcase(s, d) for s in self.executed):
                out.append(d)
        return out


_occurrences: dict = {}       # (code, method) -> sorted offsets of the method's name loads
_named: dict = {}             # (code, bytecode offset, method) -> (site id, location)
_NAMED_LIMIT = 4096


def _user_frame():
    f = sys._getframe(2)
    while f is not None:
        if not is_internal_file(f.f_code.co_filename):
            return f
        f = f.f_back
    return None


def where_to_site(f, method: str) -> tuple:
    """(site id, "file.py:line") of a synchronization called from frame f."""
    code = f.f_code
    named = (code, f.f_lasti, method)      # a loop passes the same site again and again
    hit = _named.get(named)
    if hit is not None:
        return hit
    key = (code, method)
    offs = _occurrences.get(key)
    if offs is None:
        offs = _occurrences[key] = [ins.offset for ins in dis.get_instructions(code)
                                    if ins.argval == method and ins.opname in
                                    ("LOAD_ATTR", "LOAD_METHOD", "LOAD_GLOBAL", "LOAD_NAME")]
    k = 0
    for i, o in enumerate(offs):
        if o <= f.f_lasti:
            k = i
    module = f.f_globals.get("__name__", "?")
    qual = getattr(code, "co_qualname", code.co_name)
    hit = f"{module}:{qual}:{method}#{k}", f"{os.path.basename(code.co_filename)}:{f.f_lineno}"
    if len(_named) >= _NAMED_LIMIT:
        _named.clear()
    _named[named] = hit
    return hit
