"""Ops noted below Python's dispatch: a C++ RecordFunction callback (`_op_observer.cpp`).

A TorchDispatchMode costs a Python frame per op before racecheck does anything (1.7x plain on
an eager decode step on an H100); a global RecordFunction callback that reads the same facts
costs about 1.2x. This module builds that callback as a torch C++ extension, against the torch
it runs with, into the user's cache (once per torch, Python and source), and reads what it
noted as `OpSeen` records: the ops a dispatch mode would see, in order, with every tensor's
storage, geometry and whether the schema writes it. The dispatch-mode interceptor stays the
reference and the path where the extension cannot be built.
"""
from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from typing import NamedTuple

from racecheck.core.files import cache_dir

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_op_observer.cpp")
NAME = "racecheck_op_observer"
ENV = "RACECHECK_OP_OBSERVER_DIR"        # where the built extension goes (default: user cache)


class TensorSeen(NamedTuple):
    arg: int            # argument position; outputs from OUTPUT on
    write: bool
    storage: int        # the storage's data pointer
    cdata: int          # its StorageImpl: `untyped_storage()._cdata`, the registry's key
    sid: int            # the registrar's id for the storage (-1 without one)
    storage_nbytes: int
    offset: int         # in elements
    sizes: tuple
    strides: tuple
    itemsize: int
    device: tuple       # (c10 device type, index)
    ranges: tuple       # the bytes it spans in its storage, as footprints.strided_ranges has them
    approx: bool        # ranges are the bounding interval (too many runs to list)

    @property
    def is_output(self) -> bool:
        return self.arg >= OUTPUT


class OpSeen(NamedTuple):
    number: int         # in the order noted, never restarting (deaths are placed by it)
    name: str           # "aten::add_.Tensor" (overload after the dot; "" for the default)
    thread: int
    stream: int         # the stream current on the op's device when it was called
    device: tuple
    tensors: tuple
    stack: tuple | None  # the program's frames (racecheck's stack capture), where asked for


OUTPUT = 1000


class BuildError(RuntimeError):
    """The extension could not be built here (no compiler, no torch headers)."""


_module = None
_why_not: str | None = None


def _folder() -> str:
    import torch
    with open(SOURCE, "rb") as fh:
        src = hashlib.sha256(fh.read()).hexdigest()[:16]
    key = f"torch{torch.__version__}-py{sys.version_info[0]}.{sys.version_info[1]}-{src}"
    return os.path.join(os.environ.get(ENV) or cache_dir("op-observer"), key.replace(os.sep, "_"))


def _built(folder: str) -> str | None:
    if not os.path.isdir(folder):
        return None
    for fn in os.listdir(folder):
        if fn.startswith(NAME) and fn.endswith((".so", ".pyd")):
            return os.path.join(folder, fn)
    return None


_SETUP = """
import sys
from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension
setup(name={name!r}, packages=[], py_modules=[], ext_modules=[CppExtension({name!r}, [{src!r}],
      extra_compile_args=["-O2", "-DNDEBUG"])],
      cmdclass={{"build_ext": BuildExtension.with_options(use_ninja=False)}},
      script_args=["-q", "build_ext", "--build-lib", {out!r}, "--build-temp", {tmp!r}])
"""


def build(folder: str | None = None) -> str:
    """Compile the extension (about a minute on two cores) unless built; its path."""
    folder = folder or _folder()
    found = _built(folder)
    if found:
        return found
    os.makedirs(os.path.dirname(folder), exist_ok=True)
    staging = tempfile.mkdtemp(prefix=".build-", dir=os.path.dirname(folder))
    try:
        code = _SETUP.format(name=NAME, src=SOURCE, out=staging,
                             tmp=os.path.join(staging, "tmp"))
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              cwd=staging)
        built = _built(staging)
        if done.returncode != 0 or built is None:
            tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
            raise BuildError(f"building the op observer failed: {tail[0]}")
        os.makedirs(folder, exist_ok=True)
        target = os.path.join(folder, os.path.basename(built))
        os.replace(built, target)        # atomic: another process may be building it too
        return target
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def load():
    """The extension module, built if needed; None where it cannot be (`why_not` says why)."""
    global _module, _why_not
    if _module is not None or _why_not is not None:
        return _module
    try:
        import torch  # noqa: F401 - libtorch's symbols first
        path = build()
        spec = importlib.util.spec_from_file_location(NAME, path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        _module = mod
    except Exception as exc:       # noqa: BLE001 - the dispatch-mode path stays
        _why_not = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return _module


def why_not() -> str | None:
    return _why_not


class Observer:
    """Notes the ops a dispatch mode would see while it is open; `drain()` hands them over in
    order. One at a time per process (the callback is global). `stacks`: each op also gets the
    program's frames as racecheck's per-op path captures them (the GIL taken per op).
    `registrar(storage) -> id`: called in the callback for a storage seen for the first time
    (a temporary may be born and die between two drains); it watches the storage die and then
    calls `forget(storage._cdata)`, stamping the death with `position()`. `prune`: while a
    seen op whose kernel has been met calling other ops runs, RecordFunction is off on its
    thread, so that those calls (never seen) cost nothing, the profiler's included; off, they
    fire and are dropped in the callback. Off by default: switching RecordFunction costs
    a rebuild of torch's per-thread callback list each way, and on the H200 micro loop that
    costs more than the nested calls it saves (docs/BENCHMARKS.md §3)."""

    def __init__(self, stacks: bool = False, limit: int = 6, registrar=None, prune: bool = False):
        mod = load()
        if mod is None:
            raise BuildError(_why_not or "the op observer is not available")
        self._mod = mod
        self._capture = None
        if stacks:
            from . import stacks as stack_capture
            self._capture = stack_capture.capture
        self._limit = limit
        self._registrar = registrar
        self._prune = prune

    def __enter__(self) -> "Observer":
        if self._mod.active():
            raise RuntimeError("an op observer is already open in this process")
        self._mod.drain()
        self._mod.start(self._capture, self._limit, self._registrar, self._prune)
        return self

    def __exit__(self, *exc) -> None:
        self._mod.stop()

    def drain(self) -> list:
        return [OpSeen(number, name, thread, stream, device,
                       tuple(TensorSeen(*t) for t in tensors), stack)
                for number, name, thread, stream, device, tensors, stack in self._mod.drain()]

    def forget(self, cdata: int) -> None:
        """A registered storage died: the next one at its address is registered anew."""
        self._mod.forget(cdata)

    def position(self) -> int:
        """Ops noted so far: a storage dying now died before op number `position()`."""
        return self._mod.position()

    @property
    def late(self) -> int:
        """Outputs of ops drained while they still ran (not noted)."""
        return self._mod.late()


@contextlib.contextmanager
def observing(stacks: bool = False, prune: bool = False):
    """`with observing() as seen:` the ops seen inside, in `seen` once the block ends."""
    seen: list = []
    with Observer(stacks=stacks, prune=prune) as obs:
        try:
            yield seen
        finally:
            seen.extend(obs.drain())
