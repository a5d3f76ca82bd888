"""Cheap source locations for accesses.

The per-op path keeps only (filename, line, function) of the first few frames outside torch,
racecheck's own machinery and the standard library's plumbing; formatting happens only when a
finding is made. Frames themselves are never kept (they would keep tensors alive).
"""
from __future__ import annotations

import os
import sys

import torch

from racecheck.core import native

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
# Test runners' own frames are never the user's code, nor is a kernel compiler's launch path
# (a Triton launch is located at the program's `kernel[grid](...)` line).
_RUNNER_DIRS = tuple(d for d in (_package_dir("_pytest"), _package_dir("pluggy"), _package_dir("pytest"),
                                 _package_dir("triton")) if d)


def _launcher_dirs() -> tuple:
    """Where pip puts console-script launchers (`racecheck`, `pytest`): the interpreter's scripts dirs."""
    import sysconfig
    dirs = {os.path.dirname(os.path.abspath(sys.executable)), os.path.join(sys.prefix, "bin")}
    try:
        dirs.add(sysconfig.get_path("scripts"))
    except KeyError:
        pass
    return tuple(os.path.abspath(d) + os.sep for d in dirs if d)


_LAUNCHER_DIRS = _launcher_dirs()


def _is_launcher(filename: str) -> bool:
    """A console-script launcher's frame (`racecheck:8 in <module>`): a file without a .py suffix
    in a scripts dir; it only calls into its package, so it is never the program's code."""
    return filename.startswith(_LAUNCHER_DIRS) and not filename.endswith(".py") \
        and os.path.dirname(filename) + os.sep in _LAUNCHER_DIRS


_internal: dict = {}

def _is_internal(filename: str) -> bool:
    if filename.startswith(_TORCH_DIR) or filename.startswith("<frozen"):
        return True
    for d in _OWN_DIRS:
        if filename.startswith(d):
            return not any(filename.startswith(u) for u in _USER_DIRS)
    for d in _RUNNER_DIRS:
        if filename.startswith(d):
            return True
    return os.path.basename(filename) in _STDLIB_PLUMBING or _is_launcher(filename)


def is_internal_file(filename: str) -> bool:
    """Is this file racecheck's machinery, torch, or plumbing (not the program's code)?"""
    inside = _internal.get(filename)
    if inside is None:
        inside = _internal[filename] = _is_internal(filename)
    return inside


def _inside(code, internal=_internal) -> bool:
    fn = code.co_filename
    inside = internal.get(fn)
    if inside is None:
        inside = internal[fn] = _is_internal(fn)
    return inside


# Caller code -> how many internal frames lie between `skip` and the first user frame. From a
# given racecheck call site (the dispatch mode, a stream method) that count is fixed, and
# `sys._getframe(n)` jumps there without materializing the frame objects in between (which is
# what makes a plain `f_back` walk cost microseconds on the per-op path).
_offsets: dict = {}


def capture(limit: int = 6, skip: int = 2) -> tuple:
    """Innermost-first user frames as raw (code, bytecode offset) pairs (lines resolved lazily
    by racecheck.core.trace.frame_info)."""
    getframe = sys._getframe
    key = id(getframe(1).f_code)
    off = _offsets.get(key)
    if off is not None:
        try:
            if off:
                below = getframe(skip + off - 1)
                # the frame just inside must be ours, or the path is shallower than the one learned
                inside = _internal.get(below.f_code.co_filename)
                f = below.f_back if (inside or (inside is None and _inside(below.f_code))) else None
            else:
                f = getframe(skip)
        except ValueError:
            f = None
        if f is not None:
            inside = _internal.get(f.f_code.co_filename)
            if inside is False or (inside is None and not _inside(f.f_code)):
                return _walk(f, limit)
    try:
        f = getframe(skip)
    except ValueError:
        return ()
    depth = 0
    while f is not None and _inside(f.f_code):
        f = f.f_back
        depth += 1
    if f is None:
        return ()
    _offsets[key] = depth
    return _walk(f, limit)


def drop_site(limit: int = 4) -> tuple:
    """Where the caller (a weakref callback) was triggered: the frame that dropped the last
    reference. One frame when that is user code (the common case, and cheap: every temporary
    dies somewhere), else the user frames above racecheck's or torch's."""
    f = sys._getframe(2)
    code = f.f_code
    if _internal.get(code.co_filename) is False:
        return ((code, f.f_lasti),)
    return capture(limit, 3)


# First user frame (code id, bytecode offset) -> the stack captured there last: a loop issuing
# an op from one line sees the same frames again and again, and comparing them costs less than
# building (and later freeing) new tuples. Entries hold their code objects (no id is reused).
_last: dict = {}
_LAST_LIMIT = 4096


def _walk(f, limit: int, internal=_internal) -> tuple:
    """Up to `limit` user frames from the user frame f outwards."""
    get = internal.get
    code = f.f_code
    site = (id(code), f.f_lasti)
    prev = _last.get(site)
    out = []
    if prev is not None and prev[0][0] is code:
        n = len(prev)
        k = 1
        if k == limit:
            return prev[:1]
        f = f.f_back
        while True:
            while f is not None:          # to the next user frame
                inside = get(f.f_code.co_filename)
                if inside is None:
                    inside = _inside(f.f_code)
                if not inside:
                    break
                f = f.f_back
            if f is None:
                if k == n:
                    return prev
                break
            if k == n or f.f_code is not prev[k][0] or f.f_lasti != prev[k][1]:
                break
            k += 1
            if k == limit:
                return prev if n == k else prev[:k]
            f = f.f_back
        out = list(prev[:k])
    while f is not None:
        code = f.f_code
        inside = get(code.co_filename)
        if inside is None:
            inside = _inside(code)
        if not inside:
            out.append((code, f.f_lasti))
            if len(out) >= limit:
                break
        f = f.f_back
    out = tuple(out)
    if len(_last) >= _LAST_LIMIT:
        _last.clear()
    _last[site] = out
    return out


_py_capture = capture


def _use_native(fast) -> None:
    """capture() in C (instrumentation/_speedups.c) over the same caches, or the Python above."""
    global capture
    if fast is not None and hasattr(fast, "capture"):
        fast.stack_setup(_internal, _offsets, _last, _inside, _LAST_LIMIT)
        capture = fast.capture
    else:
        capture = _py_capture


native.on_change(_use_native)


def site(skip: int = 3) -> str:
    """"file.py:123" of the first user frame (for coverage notes; not on the per-op path)."""
    from racecheck.core.trace import frame_info
    frames = capture(limit=1, skip=skip)
    if not frames:
        return ""
    filename, line, _fn = frame_info(frames[0])
    return f"{os.path.basename(filename)}:{line}"
