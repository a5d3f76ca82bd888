"""The dispatch mode: every ATen op becomes a trace event with exact footprints.

Backend-agnostic: the backend says which stream is current, whether a tensor is host memory,
and how an op executes (eagerly, or queued by an adversarial executor). One op costs one
classification lookup (cached per overload), one footprint per tensor argument (O(1) for
contiguous tensors), a short stack walk and one checker call.
"""
from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from racecheck.trace import CapturedOp, Copy, HostAccess, Kernel

from . import stacks
from .classify import META, READ_WRITE, WRITE, classify, iter_out_tensors
from .indexops import index_footprint

BORN_ATTR = "_racecheck_born"


def _place(role, f, reads, writes) -> None:
    if role != WRITE:
        reads.append(f)
    if role != 0:  # READ
        writes.append(f)


def _blocking_transfer(kwargs, reads, writes) -> bool:
    """`t.to("cpu")` / `h.to(device)` without non_blocking: the host waits for the copy."""
    if kwargs.get("non_blocking"):
        return False
    return any(f.host for f in reads) or any(f.host for f in writes)


class Interceptor(TorchDispatchMode):
    """One per host thread; all of them feed the same session."""

    def __init__(self, session, backend):
        super().__init__()
        self.session = session
        self.backend = backend
        self.fp = session.footprints.of
        self.maker = session.footprints
        self._plans: dict = {}
        # Optional backend hooks (real devices): the stream an op runs on depends on its tensors'
        # device; index values may live on the device (footprint resolved later); pinned memory
        # is real there (sim strips the flag: a CPU-only torch cannot pin).
        self._op_stream = getattr(backend, "op_stream_tid", None)
        self._index_fp = getattr(backend, "index_footprint", None) or index_footprint
        self._strip_pin = getattr(backend, "strip_pin_memory", True)

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
        if oc.has_pin_memory and kwargs.get("pin_memory"):
            return self._pinned_factory
        plan = self._plans.get(func)
        if plan is None:
            plan = self._plans[func] = self._plan_for(oc)
        return plan

    def _plan_for(self, oc):
        if oc.metadata_inplace:
            return self._metadata_inplace
        if oc.is_view:
            return self._view
        if oc.no_access:
            return self.backend.special_ops.get(oc.name)
        if oc.is_copy:
            return self._copy
        if oc.is_scalar_read:
            return self._scalar_read
        return self._kernel

    def _metadata_inplace(self, func, args, kwargs):
        out = self.backend.execute_plain(func, args, kwargs)
        self.maker.forget(args[0])
        return out

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
        if self._strip_pin:
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
        stream = (self._op_stream((src, dst), None) if self._op_stream is not None
                  else self.backend.current_stream_tid())
        if dfp is None or sfp is None:
            return self.backend.execute_plain(func, args, kwargs)
        hook = s.before_launch
        if hook is not None:
            hook(stream, "copy_")
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
        deferred = None
        pend = None
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
                    if s.capture_state() is None and self._deferred():
                        # Queued execution: the index values are final only when the op runs.
                        self.maker.registry.lookup(t)
                        deferred = (role, len(writes) if role == WRITE else len(reads))
                        first = False
                        any_device = any_device or not self.maker.registry.is_host(t)
                        continue
                    if s.capture_state() is None:
                        with s.internal_reads():
                            f = self._index_fp(self.maker, oc.name, t, args)
                        if f is not None and hasattr(f, "resolver"):
                            pend = f     # index values still on the device: resolved later
                    else:  # index values change between replays: a captured op covers all rows
                        f = self.maker.whole(
                            t, "graph-captured index op: index values vary per replay; whole tensor used")
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
                elif role == READ_WRITE:
                    reads.append(f)
                    writes.append(f)
                else:
                    reads.append(f)
        stack = stacks.capture()
        capture = s.capture_state()
        if any_tensor and not any_device:
            if deferred is not None:     # host memory only: runs now, its indices are final
                role, pos = deferred
                t0 = args[0]
                with s.internal_reads():
                    f = index_footprint(self.maker, oc.name, t0, args)
                if f is not None:
                    _place(role, f, reads, writes)
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
        stream = (self._op_stream(args, kwargs) if self._op_stream is not None
                  else self.backend.current_stream_tid())
        hook = s.before_launch
        if hook is not None:
            hook(stream, oc.name)
        if deferred is not None:
            return self._deferred_index_kernel(func, args, kwargs, oc, stream, reads, writes,
                                               deferred, stack)
        out = self.backend.execute(stream, func, args, kwargs)
        if oc.out_roles:
            for t in iter_out_tensors(oc, out):
                f = fp(t)
                if f is not None:
                    writes.append(f)
        ev = Kernel(s.thread_tid(), stream, tuple(reads), tuple(writes), oc.name, stack)
        if pend is None:
            s.emit(ev)
        else:
            s.emit_pending(ev, pend.resolver(ev))
        if oc.data_dependent or (oc.name == "_to_copy" and _blocking_transfer(kwargs, reads, writes)):
            self.backend.host_wait_stream(stream)
        return out

    # -- queued executors (sim's adversarial executor) ------------------------------------------

    def _deferred(self) -> bool:
        return getattr(getattr(self.backend, "executor", None), "deferred_footprints", False)

    def _deferred_index_kernel(self, func, args, kwargs, oc, stream, reads, writes, deferred, stack):
        """An index op under a queued executor: its footprint is taken when it runs (when its
        index values are final); the Kernel still reaches the checker in host issue order."""
        s = self.session
        maker, name = self.maker, oc.name
        box = []

        def snapshot(qargs, qkwargs):   # the executor calls this right before the op runs
            with s.internal_reads():
                box.append(index_footprint(maker, name, qargs[0], qargs))

        out = self.backend.executor.run(stream, func, args, kwargs, on_execute=snapshot)
        if oc.out_roles:
            for t in iter_out_tensors(oc, out):
                f = self.fp(t)
                if f is not None:
                    writes.append(f)
        role, pos = deferred
        thread = s.thread_tid()

        def resolve():
            if not box:
                return None
            f = box[0]
            r, w = list(reads), list(writes)
            if f is not None:
                _place(role, f, r, w)
            return Kernel(thread, stream, tuple(r), tuple(w), name, stack)

        s.emit_pending(None, resolve)
        return out
