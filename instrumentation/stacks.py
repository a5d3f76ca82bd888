"""Cheap source locations for accesses.

The per-op path keeps only (filename, line, function) of the first few frames outside torch,
racecheck's own machinery and the standard library's plumbing; formatting happens only when a
finding is made. Frames themselves are never kept (they would keep tensors alive).
"""
from __future__ import annotations

import os
import sys

import torch

_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep


def _package_dir(name: str) -> str | None:
    import importlib.util
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return os.path.abspath(list(spec.submodule_search_locations)[0]) + os.sep


# racecheck's machinery is internal; its scenarios are user code (they model the engine).
_OWN_DIRS = tuple(d for d in (os.path.dirname(os.path.abspath(__file__)) + os.sep,
                              _package_dir("racecheck")) if d)
_USER_DIRS = tuple(d for d in (_package_dir("racecheck.scenarios"),) if d)
_STDLIB_PLUMBING = ("contextlib.py", "threading.py", "functools.py", "runpy.py", "weakref.py")
# Test runners' own frames are never the user's code.
_RUNNER_DIRS = tuple(d for d in (_package_dir("_pytest"), _package_dir("pluggy")) if d)
_internal: dict = {}

_extra_internal: list = []


def mark_internal(directory: str) -> None:
    """Treat frames under `directory` as racecheck machinery (e.g. an installed package path)."""
    _extra_internal.append(os.path.abspath(directory) + os.sep)
    _internal.clear()


def _is_internal(filename: str) -> bool:
    if filename.startswith(_TORCH_DIR) or filename.startswith("<frozen"):
        return True
    for d in _OWN_DIRS:
        if filename.startswith(d):
            return not any(filename.startswith(u) for u in _USER_DIRS)
    for d in _RUNNER_DIRS:
        if filename.startswith(d):
            return True
    for d in _extra_internal:
        if filename.startswith(d):
            return True
    return os.path.basename(filename) in _STDLIB_PLUMBING


def capture(limit: int = 6, skip: int = 2) -> tuple:
    """Innermost-first user frames as raw (code, bytecode offset) pairs."""
    try:
        f = sys._getframe(skip)
    except ValueError:
        return ()
    out = []
    internal = _internal  # keyed by filename: str hashes are cached, code-object hashes are not
    while f is not None:
        code = f.f_code
        fn = code.co_filename
        inside = internal.get(fn)
        if inside is None:
            inside = internal[fn] = _is_internal(fn)
        if not inside:
            out.append((code, f.f_lasti))  # line resolved lazily: racecheck.trace.frame_info
            if len(out) >= limit:
                break
        f = f.f_back
    return tuple(out)
