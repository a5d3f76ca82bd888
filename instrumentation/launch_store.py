"""Launch records kept on disk, shared by every process of a machine (launch_cache.py).

A run's serialized reference and its instrumented run launch the same kernels on the same
bytes, and so do a second run of the same scenario, a mutation's variants and a fuzzer's
confirmation on a fresh engine, each in its own process. Records are kept under the user's
cache, as Triton keeps compiled kernels there: one file per record, in a folder per kernel and
argument layout, written atomically; a record read back is checked against the launch's bytes
like any other, so a record from another run can only be replayed where it is exact.

The kernel is named by its source and the sources of the @triton.jit functions it calls (what
Triton's own cache key is made of), and every record lives under a fingerprint of what decides its contents: Triton,
numpy, torch, Python, and the source of racecheck's recording. `RACECHECK_LAUNCH_RECORDS` names
another folder, or `off`.
"""
from __future__ import annotations

import hashlib
import os
import pickle
import sys
import tempfile

from racecheck.core.files import cache_dir

ENV = "RACECHECK_LAUNCH_RECORDS"
CAP = 512 << 20             # bytes kept in the folder; the least recently written go first
PER_KEY = 16                # records kept per kernel and argument layout
FORMAT = 1
_SUFFIX = ".rec"


def folder() -> str | None:
    """Where records are kept, or None (off)."""
    v = os.environ.get(ENV)
    if v is not None and v.strip().lower() in ("", "0", "off", "no", "false", "none"):
        return None
    if v:
        return v
    return cache_dir("triton-launches")


def _fingerprint() -> str:
    import numpy
    import torch
    import triton
    h = hashlib.sha256(repr((FORMAT, triton.__version__, numpy.__version__, torch.__version__,
                             sys.version)).encode())
    here = os.path.dirname(os.path.abspath(__file__))
    for name in ("launch_cache.py", "launch_store.py", "triton_kernels.py"):
        with open(os.path.join(here, name), "rb") as fh:
            h.update(fh.read())
    return h.hexdigest()[:16]


_NAMES: dict = {}      # kernel function -> its name across processes, or None


def _kernel_name(fn, functions) -> str | None:
    """The kernel's module, name and source, with those of the @triton.jit functions it calls
    (`functions`; what Triton's own cache key is made of)."""
    got = _NAMES.get(fn, False)
    if got is False:
        import inspect
        try:
            h = hashlib.sha256()
            for f in functions:
                h.update(f"{f.__module__}.{f.__qualname__}\n{inspect.getsource(f)}".encode())
            got = f"{fn.__module__}.{fn.__qualname__}:{h.hexdigest()}"
        except Exception:      # noqa: BLE001 - no source to name it by: records stay in memory
            got = None
        _NAMES[fn] = got
    return got


class RecordFolder:
    """The records of one folder, for one process: what it read is remembered per key, so a
    launch reads only records another process wrote since."""

    def __init__(self, root: str):
        self.root = root
        self.base = os.path.join(root, _fingerprint())
        self._read: dict = {}          # key name -> file names read or written
        self._pruned = False

    def key_name(self, key, functions=()) -> str | None:
        """A launch key's name across processes (None: kept in memory only); `functions`: the
        kernel's Python function and its @triton.jit callees'."""
        if not isinstance(key, tuple) or not key or not functions:
            return None
        kernel = _kernel_name(key[0], functions)
        if kernel is None:
            return None
        return hashlib.sha256(repr((kernel,) + key[1:]).encode()).hexdigest()

    def _dir(self, name: str) -> str:
        return os.path.join(self.base, name[:2], name)

    def load(self, name: str) -> list:
        """(loads, stores, footprints, spans) of the records of `name` not read yet, newest
        first; a file that cannot be read is passed over."""
        try:
            entries = [e for e in os.scandir(self._dir(name)) if e.name.endswith(_SUFFIX)]
        except OSError:
            return []
        seen = self._read.setdefault(name, set())
        out = []
        for e in sorted(entries, key=_mtime, reverse=True)[:PER_KEY]:
            if e.name in seen:
                continue
            seen.add(e.name)
            try:
                with open(e.path, "rb") as fh:
                    parts = pickle.load(fh)
                if isinstance(parts, tuple) and len(parts) == 4:
                    out.append(parts)
            except Exception:          # noqa: BLE001 - removed meanwhile, or not ours
                continue
        return out

    def save(self, name: str, parts: tuple) -> None:
        """Best effort: a record that cannot be written only costs a later launch its replay."""
        try:
            data = pickle.dumps(parts, protocol=pickle.HIGHEST_PROTOCOL)
            file = hashlib.sha256(data).hexdigest()[:32] + _SUFFIX
            self._read.setdefault(name, set()).add(file)
            d = self._dir(name)
            path = os.path.join(d, file)
            if os.path.exists(path):
                return
            os.makedirs(d, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=d, suffix=".tmp")
            try:
                with os.fdopen(fd, "wb") as fh:
                    fh.write(data)
                os.replace(tmp, path)
            except BaseException:
                _remove(tmp)
                raise
            entries = [e for e in os.scandir(d) if e.name.endswith(_SUFFIX)]
            for e in sorted(entries, key=_mtime)[:max(0, len(entries) - PER_KEY)]:
                _remove(e.path)
            if not self._pruned:
                self._pruned = True
                prune(self.root)
        except OSError:
            return


def prune(root: str, cap: int = CAP) -> None:
    """Remove the least recently written records until the folder holds under 3/4 of `cap`
    (records of other fingerprints, older, go first)."""
    files = []
    for dirpath, _dirs, names in os.walk(root):
        for n in names:
            p = os.path.join(dirpath, n)
            try:
                st = os.stat(p)
            except OSError:
                continue
            files.append((st.st_mtime, st.st_size, p))
    total = sum(f[1] for f in files)
    if total <= cap:
        return
    for _mt, size, p in sorted(files):
        if total <= cap * 3 // 4:
            break
        _remove(p)
        total -= size


def _mtime(entry) -> float:
    try:
        return entry.stat().st_mtime
    except OSError:
        return 0.0


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass


_FOLDERS: dict = {}


def forget() -> None:
    """Forget which records this process read (with the memory they were read into)."""
    _FOLDERS.clear()


def current() -> RecordFolder | None:
    """The folder records go to now (the environment can change between sessions)."""
    root = folder()
    if root is None:
        return None
    got = _FOLDERS.get(root)
    if got is None:
        try:
            got = _FOLDERS[root] = RecordFolder(root)
        except Exception:          # noqa: BLE001 - no Triton or numpy: nothing to keep
            return None
    return got
