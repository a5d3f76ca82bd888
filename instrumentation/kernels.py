"""Device work the dispatch mode does not classify by itself: opaque kernels and their coverage.

C++/CUDA extension ops without alias annotations, tvm-ffi and other JIT functions either bypass
the dispatcher or tell it nothing about what they write. `racecheck.kernel(...)` declares one:

    @racecheck.kernel(reads=["x"], writes=["out"])          # a Python launcher, decorated
    def scale(x, out): my_ext.scale(x, out)

    racecheck.kernel("sgl_kernel.build_tree", reads=[...], writes=[...],   # by import path
                     reference=torch_build_tree)            # what runs on sim (no CUDA there)

    racecheck.kernel("my_ext::scale", writes=["out"])       # a dispatcher op by qualified name

A declared launch is one `Kernel` event on the current stream with whole-tensor footprints of the
named arguments (and of the tensors it returns, which are written). On sim, `reference=` runs
instead of the real function when given. Launches racecheck cannot classify (custom dispatcher
ops whose schema declares no writes, and have no declaration) still run and are counted in
`Coverage`, which every report ends with: such a kernel's writes are invisible.
"""
from __future__ import annotations

import importlib
import inspect
import threading
from dataclasses import dataclass

import torch
from torch.utils._python_dispatch import _disable_current_modes

from racecheck.core.errors import UsageError
from racecheck.core.trace import CapturedOp, Footprint, Kernel

from . import current, stacks


@dataclass(frozen=True)
class KernelDecl:
    """What one opaque kernel reads and writes, by argument name."""

    target: str                  # "pkg.mod.fn", "ns::op", or the decorated function's qualname
    reads: tuple = ()
    writes: tuple = ()
    reference: object = None     # a torch implementation run on sim instead of the kernel
    name: str = ""               # the op name findings use

    @property
    def op(self) -> str:
        return self.name or self.target.rsplit(".", 1)[-1].rsplit("::", 1)[-1]


_lock = threading.Lock()
_by_path: dict = {}              # "pkg.mod.fn" -> KernelDecl (patched while a session runs)
_by_op: dict = {}                # "ns::op" -> KernelDecl (the interceptor's classification)


def kernel(target=None, *, reads=(), writes=(), reference=None, name=None):
    """Declare an opaque kernel's reads and writes (argument names); see the module docstring.

    With a string target: an import path ("pkg.mod.fn") patched for every session, or a
    dispatcher op ("ns::op"). Without one: a decorator for a Python function that launches it.
    """
    reads, writes = tuple(reads), tuple(writes)
    for n in reads + writes:
        if not isinstance(n, str) or not n:
            raise UsageError(f"racecheck.kernel: reads/writes name arguments, got {n!r}")
    if target is None:
        def decorate(fn):
            decl = KernelDecl(fn.__qualname__, reads, writes, reference, name or fn.__name__)
            _check_names(decl, fn)
            return _declared(fn, decl)
        return decorate
    if callable(target) and not isinstance(target, str):
        raise UsageError("racecheck.kernel: use @racecheck.kernel(reads=..., writes=...) to decorate")
    decl = KernelDecl(str(target), reads, writes, reference, name or "")
    with _lock:
        (_by_op if "::" in decl.target else _by_path)[decl.target] = decl
    b = current.backend()
    if b is not None and "::" not in decl.target:
        b.kernels.patch_path(decl)
    return decl


def declared_op(qualified_name: str) -> KernelDecl | None:
    """The declaration of a dispatcher op ("ns::op"), if any."""
    return _by_op.get(qualified_name)


def _check_names(decl: KernelDecl, fn) -> None:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return
    if any(p.kind == p.VAR_KEYWORD for p in params.values()):
        return
    missing = [n for n in decl.reads + decl.writes if n not in params]
    if missing:
        raise UsageError(f"racecheck.kernel({decl.target}): no argument named "
                         f"{', '.join(missing)} (has {', '.join(params)})")


def _declared(fn, decl: KernelDecl):
    """`fn` as a declared kernel: a plain call outside a session."""
    sig = None
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        pass

    def launch(*args, **kwargs):
        b = current.backend()
        if b is None or not b.sink.checking:
            return fn(*args, **kwargs)
        return b.kernels.launch_declared(decl, fn, sig, args, kwargs)
    launch.__wrapped__ = fn
    launch.__name__ = getattr(fn, "__name__", decl.op)
    launch.__qualname__ = getattr(fn, "__qualname__", decl.op)
    launch.__doc__ = getattr(fn, "__doc__", None)
    launch.racecheck_kernel = decl
    return launch


class Coverage:
    """Launches racecheck ran but could not classify: op -> [launches, first site]."""

    def __init__(self):
        self.unchecked: dict = {}

    def note(self, op: str, site: str) -> None:
        ent = self.unchecked.get(op)
        if ent is None:
            self.unchecked[op] = [1, site]
        else:
            ent[0] += 1

    def to_json(self) -> dict:
        return {"unchecked": [{"kernel": op, "launches": n, "site": site}
                              for op, (n, site) in sorted(self.unchecked.items())]}


class KernelLauncher:
    """One session's launches of non-ATen device work (Triton, declared kernels)."""

    def __init__(self, backend):
        self.backend = backend
        self.coverage = Coverage()
        self._undo: list = []

    # -- a launch ------------------------------------------------------------------------------
    def footprints(self, tensors, approx: str | None = None) -> tuple:
        of = self.backend.footprints.of
        out = []
        seen = set()
        for t in tensors:
            if not isinstance(t, torch.Tensor) or id(t) in seen:
                continue
            seen.add(id(t))
            f = of(t)
            if f is None:
                continue
            if approx:
                f = Footprint(f.storage, f.ranges, f.host, approx, f.born)
            out.append(f)
        return tuple(out)

    def launch(self, op: str, reads, writes, run, *, approx_reads=(), approx_writes=(),
               needs_result: bool = False):
        """Run `run()` as one device op on the current stream that reads and writes whole tensors.

        `approx_*` are footprints (already made) marked as covering more than the kernel may
        touch. With `needs_result` the host waits for the result (queued executors drain the
        stream first), and tensors it returns are written by the op."""
        b = self.backend
        sink = b.sink
        r = self.footprints(reads) + tuple(approx_reads)
        w = self.footprints(writes) + tuple(approx_writes)
        stack = stacks.capture()
        capture = b.tls.capture
        if capture is not None:
            out = run()
            w = w + self.footprints(_result_tensors(out)) if needs_result else w
            capture.add(CapturedOp(r, w, op, stack), _Thunk(run), (), {}, None)
            return out
        stream = b.current_stream_tid()
        hook = b.before_launch
        if hook is not None:
            hook(stream, op)
        thread = sink.thread_tid()
        ex = b.executor
        if needs_result:
            if not ex.eager:
                ex.sync_stream(stream)
            out = run()
            w = w + self.footprints(_result_tensors(out))
            sink.emit(Kernel(thread, stream, r, w, op, stack))
            return out
        sink.emit(Kernel(thread, stream, r, w, op, stack))
        if ex.eager:
            return run()
        ex.launch(stream, run, op)
        return None

    def launch_measured(self, op: str, run, whole, *, keep=None):
        """Run device work whose exact footprints are measured while it runs: `run()` returns
        (reads, writes) footprints. `whole()` gives covering footprints for a graph capture
        (a replay may touch other addresses). Queued executors resolve the event when it ran.

        `keep()`: storages a queued executor must keep alive until the work ran, for kernels
        that load pointers from memory: a tensor reached only through such a pointer is not an
        argument the queue holds, and a CPU allocator reuses its memory as soon as the program
        drops it (a GPU's stream-ordered caching allocator would not)."""
        b = self.backend
        sink = b.sink
        stack = stacks.capture()
        capture = b.tls.capture
        if capture is not None:
            r, w = whole()
            run()
            capture.add(CapturedOp(r, w, op, stack), _Thunk(run), (), {}, None)
            return None
        stream = b.current_stream_tid()
        hook = b.before_launch
        if hook is not None:
            hook(stream, op)
        thread = sink.thread_tid()
        ex = b.executor
        if ex.eager:
            r, w = run()
            sink.emit(Kernel(thread, stream, r, w, op, stack))
            return None
        box = []
        ex.launch(stream, lambda: box.append(run()), op, keep=keep() if keep is not None else ())

        def resolve():
            if not box:
                return None
            r, w = box[0]
            return Kernel(thread, stream, r, w, op, stack)
        sink.emit_pending(None, resolve)
        return None

    def launch_declared(self, decl: KernelDecl, fn, sig, args, kwargs, named=None):
        if named is None:
            named = {}
            if sig is not None:
                try:
                    named = sig.bind_partial(*args, **kwargs).arguments
                except TypeError:
                    named = {}
        reads = [t for n in decl.reads for t in _flat_tensors(named.get(n))]
        writes = [t for n in decl.writes for t in _flat_tensors(named.get(n))]
        impl = decl.reference if (decl.reference is not None and self.backend.name == "sim") else fn

        def run():
            with _disable_current_modes():
                return impl(*args, **kwargs)
        return self.launch(decl.op, reads, writes, run, needs_result=True)

    # -- declarations patched by import path ---------------------------------------------------
    def install(self) -> None:
        with _lock:
            decls = list(_by_path.values())
        for decl in decls:
            self.patch_path(decl)

    def patch_path(self, decl: KernelDecl) -> None:
        owner, attr = _import_owner(decl.target)
        orig = getattr(owner, attr)
        if getattr(orig, "racecheck_kernel", None) is not None:
            return
        sig = None
        try:
            sig = inspect.signature(orig)
        except (TypeError, ValueError):
            pass
        launcher = self

        def launch(*args, **kwargs):
            if not launcher.backend.sink.checking:
                return orig(*args, **kwargs)
            return launcher.launch_declared(decl, orig, sig, args, kwargs)
        launch.__wrapped__ = orig
        launch.racecheck_kernel = decl
        setattr(owner, attr, launch)
        self._undo.append(lambda: setattr(owner, attr, orig))

    def uninstall(self) -> None:
        while self._undo:
            self._undo.pop()()


class _Thunk:
    """A captured launch re-run at each sim graph replay (`sim._rerun` calls func())."""

    __slots__ = ("run",)

    def __init__(self, run):
        self.run = run

    def __call__(self):
        return self.run()


def _import_owner(path: str):
    """(object holding the attribute, attribute name) for "pkg.mod.Class.fn" or "pkg.mod.fn"."""
    parts = path.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        try:
            for p in parts[cut:-1]:
                obj = getattr(obj, p)
            getattr(obj, parts[-1])
        except AttributeError:
            break
        return obj, parts[-1]
    raise UsageError(f"racecheck.kernel: cannot find {path!r} to declare (not importable)")


def _flat_tensors(v):
    if isinstance(v, torch.Tensor):
        yield v
    elif isinstance(v, (list, tuple)):
        for x in v:
            yield from _flat_tensors(x)


def _result_tensors(out):
    return list(_flat_tensors(out))
