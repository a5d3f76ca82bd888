"""The dispatch mode: every ATen op becomes a trace event with exact footprints.

Backend-agnostic: the backend says which stream is current, whether a tensor is host memory,
and how an op executes (eagerly, or queued by an adversarial executor). One op costs one
classification lookup (cached per overload), one footprint per tensor argument (O(1) for
contiguous tensors), a short stack walk and one checker call.
"""
from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from racecheck.trace import CapturedOp, Copy, HostAccess, HostSync, Kernel

from . import stacks
from .classify import META, WRITE, classify, iter_out_tensors
from .indexops import index_footprint

BORN_ATTR = "_racecheck_born"


class Interceptor(TorchDispatchMode):
    """One per host thread; all of them feed the same session."""

    def __init__(self, session, backend):
        super().__init__()
        self.session = session
        self.backend = backend
        self.fp = session.footprints.of
        self.maker = session.footprints

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        s = self.session
        if kwargs is None:
            kwargs = {}
        if not s.checking:
            return self.backend.execute_plain(func, args, kwargs)
        try:
            plan = self._plan(func, args, kwargs)
        except Exception as exc:  # a bug in racecheck must never change the program's results
            s.internal_error(exc, f"while classifying {func}")
            return self.backend.execute_plain(func, args, kwargs)
        if plan is None:
            return self.backend.execute_plain(func, args, kwargs)
        return plan(func, args, kwargs)

    # -- op planning -------------------------------------------------------------------------

    def _plan(self, func, args, kwargs):
        oc = classify(func)
        if oc.is_view:
            return self._view
        if oc.no_access:
            return self.backend.special_ops.get(oc.name)
        if kwargs.get("pin_memory"):
            return self._pinned_factory
        if oc.is_copy:
            return self._copy
        if oc.is_scalar_read:
            return self._scalar_read
        return self._kernel

    def _view(self, func, args, kwargs):
        out = self.backend.execute_plain(func, args, kwargs)
        seq = self.session.position
        if isinstance(out, torch.Tensor):
            out.__dict__[BORN_ATTR] = seq
        elif isinstance(out, (list, tuple)):
            for t in out:
                if isinstance(t, torch.Tensor):
                    t.__dict__[BORN_ATTR] = seq
        return out

    def _pinned_factory(self, func, args, kwargs):
        kwargs = dict(kwargs)
        kwargs["pin_memory"] = False
        s = self.session
        with s.allocating_host():
            out = self.backend.execute_plain(func, args, kwargs)
            if isinstance(out, torch.Tensor):
                s.footprints.registry.lookup(out, host=True)
        return out

    def _copy(self, func, args, kwargs):
        s = self.session
        dst, src = args[0], args[1]
        non_blocking = bool(args[2]) if len(args) > 2 else bool(kwargs.get("non_blocking", False))
        if not isinstance(src, torch.Tensor):
            return self._kernel(func, args, kwargs)
        reg = self.maker.registry
        dst_host = reg.lookup(dst)[1]
        src_host = reg.lookup(src)[1]
        stack = stacks.capture()
        dfp, sfp = self.fp(dst), self.fp(src)
        capture = s.capture_state()
        if capture is not None:
            capture.add(CapturedOp((sfp,) if sfp else (), (dfp,) if dfp else (), "copy_", stack),
                        func, args, kwargs, dst)
            return self.backend.execute_plain(func, args, kwargs)
        thread = s.thread_tid()
        if dst_host and src_host:
            s.emit(HostAccess(thread, (sfp,) if sfp else (), (dfp,) if dfp else (), "copy_", stack))
            return self.backend.execute_plain(func, args, kwargs)
        stream = self.backend.current_stream_tid()
        if dfp is None or sfp is None:
            return self.backend.execute_plain(func, args, kwargs)
        if dst_host or src_host:
            s.emit(Copy(thread, stream, sfp, dfp, non_blocking, "copy_", stack))
            out = self.backend.execute(stream, func, args, kwargs)
            if not non_blocking:
                self.backend.host_wait_stream(stream)
            return out
        s.emit(Kernel(thread, stream, (sfp,), (dfp,), "copy_", stack))
        return self.backend.execute(stream, func, args, kwargs)

    def _scalar_read(self, func, args, kwargs):
        """`.item()`, `int(t)`, `float(t)`, `bool(t)`: a blocking D2H read, or a host read."""
        self.session.host_read(args[0], "item", stacks.capture())
        return self.backend.execute_plain(func, args, kwargs)

    def _kernel(self, func, args, kwargs):
        s = self.session
        oc = classify(func)
        fp = self.fp
        reads = []
        writes = []
        any_device = False
        any_tensor = False
        index = oc.index
        first = True
        nargs = len(args)
        for i, name, kwarg_only, role in oc.args:
            v = args[i] if (i < nargs and not kwarg_only) else (kwargs.get(name) if kwargs else None)
            if v is None:
                continue
            if isinstance(v, torch.Tensor):
                tensors = (v,)
            elif isinstance(v, (list, tuple)):
                tensors = [x for x in v if isinstance(x, torch.Tensor)]
            else:
                continue
            for t in tensors:
                any_tensor = True
                if role == META:
                    if not any_device and not self.maker.registry.is_host(t):
                        any_device = True
                    first = False
                    continue
                if first and index is not None:
                    if s.capture_state() is None:
                        f = index_footprint(self.maker, oc.name, t, args)
                    else:  # index values change between replays: a captured op covers all rows
                        f = fp(t)
                        if f is not None:
                            f.approx = "graph-captured index op: index values vary per replay; whole tensor used"
                else:
                    f = fp(t)
                first = False
                if f is None:
                    if not any_device and t.numel() == 0:
                        any_device = True
                    continue
                if not f.host:
                    any_device = True
                if role == WRITE:
                    writes.append(f)
                else:
                    reads.append(f)
        stack = stacks.capture()
        capture = s.capture_state()
        if any_tensor and not any_device:
            with s.allocating_host():
                out = self.backend.execute_plain(func, args, kwargs)
                for t in iter_out_tensors(oc, out):
                    f = fp(t)
                    if f is not None:
                        writes.append(f)
            if capture is None:
                s.emit(HostAccess(s.thread_tid(), tuple(reads), tuple(writes), oc.name, stack))
            return out
        if capture is not None:
            out = self.backend.execute_plain(func, args, kwargs)
            for t in iter_out_tensors(oc, out):
                f = fp(t)
                if f is not None:
                    writes.append(f)
            capture.add(CapturedOp(tuple(reads), tuple(writes), oc.name, stack), func, args, kwargs, out)
            return out
        stream = self.backend.current_stream_tid()
        hook = s.before_launch
        if hook is not None:
            hook(stream, oc.name)
        out = self.backend.execute(stream, func, args, kwargs)
        if oc.out_roles:
            for t in iter_out_tensors(oc, out):
                f = fp(t)
                if f is not None:
                    writes.append(f)
        s.emit(Kernel(s.thread_tid(), stream, tuple(reads), tuple(writes), oc.name, stack))
        if oc.data_dependent:
            self.backend.host_wait_stream(stream)
        return out
