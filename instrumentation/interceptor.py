"""The dispatch mode: every ATen op becomes a trace event with exact footprints.

Backend-agnostic: the backend says which stream is current, whether a tensor is host memory,
and how an op executes (eagerly, or queued by an adversarial executor). One op costs one plan
lookup (a plan is made once per overload; plain kernels get one compiled for their signature),
one footprint per tensor argument (cached on the tensor), a short stack walk and one queued
event (the session hands events to the checker in batches).
"""
from __future__ import annotations

import linecache
from types import MethodType

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from racecheck.core.trace import CapturedOp, Copy, HostAccess, HostSync, Kernel

from racecheck.core import native

from . import stacks
from .classify import META, READ_WRITE, WRITE, classify, iter_out_tensors
from .footprints import CACHE_ATTR
from .indexops import index_footprint
from .kernels import declared_op
from .routing import is_cuda_device

_CPU = torch.device("cpu")
_TORCH_NAMESPACES = frozenset({"aten", "prims", "_c10d_functional", "c10d", "profiler", "debugprims",
                               "rngprims", "quantized", "_quantized", "higher_order"})
HOST, DEVICE = "host", "device"     # where an op's results go when routing says so

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


def _dynamo_guard():
    """(set_eval_frame, skip_code) from torch's C API, or None where this torch lacks them.

    TorchDispatchMode wraps every `__torch_dispatch__` in `torch._disable_dynamo` so that
    torch.compile never traces into a mode; that Python wrapper is a sizeable part of what a
    do-nothing mode costs per op. The same guarantee for less: the method's code is marked
    skipped for Dynamo, and the method runs its body with the frame callback switched off.
    """
    try:
        from torch._C._dynamo import eval_frame as ef
        strategy = ef._FrameExecStrategy(ef._FrameAction.SKIP, ef._FrameAction.DEFAULT)
        return ef.set_eval_frame, lambda code: ef.set_code_exec_strategy(code, strategy)
    except (ImportError, AttributeError, TypeError, RuntimeError):
        return None


_GUARD = _dynamo_guard()
_set_eval_frame = _GUARD[0] if _GUARD is not None else (lambda callback: None)


class Interceptor(TorchDispatchMode):
    """One per host thread; all of them feed the same session."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return _GUARD is None     # torch's own (slower) wrapper only where ours is unavailable

    def __init__(self, backend):
        super().__init__()
        self.sink = backend.sink
        self.backend = backend
        self.fp = backend.footprints.of
        self.maker = backend.footprints
        self._plans: dict = {}       # id(func) -> plan; the OpOverload is kept alive in _funcs
        self._funcs: list = []
        # Backend capabilities (real devices): the stream an op runs on depends on its tensors'
        # device; index values may live on the device (footprint resolved later); pinned memory
        # is real there (sim strips the flag: a CPU-only torch cannot pin).
        self._op_stream = backend.op_stream_tid
        self._index_fp = backend.index_footprint
        self._strip_pin = backend.strip_pin_memory
        self._queued = backend.executor.deferred_footprints
        # Stack capture in a C plan starts this many frames out: past the Python frame of
        # __torch_dispatch__, unless the entry below is in C (then the program's frame is next).
        self._plan_skip = 2
        # plans whose common case has a C version (instrumentation/_speedups.c SpecialPlan)
        self._native_special = (self._copy, self._view, self._scalar_read)
        # the C path as the switch stood when the session was made (racecheck.core.native)
        self._speedups = fast = native.speedups
        if fast is not None and type(self).__torch_dispatch__ is Interceptor.__torch_dispatch__:
            entry = fast.Dispatch(sink=self.sink, plans=self._plans, slow=self._dispatch_slow,
                                  plain=backend.execute_plain,
                                  set_eval_frame=_GUARD[0] if _GUARD is not None else None)
            self.__torch_dispatch__ = MethodType(entry, self)
            self._plan_skip = 1

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        prior = _set_eval_frame(None)
        try:
            if kwargs is None:
                kwargs = {}
            if not self.sink.checking:
                return self.backend.execute_plain(func, args, kwargs)
            plan = self._plans.get(id(func))
            if plan is None:
                return self._dispatch_slow(func, args, kwargs)
            return plan(func, args, kwargs)
        finally:
            _set_eval_frame(prior)

    def _dispatch_slow(self, func, args, kwargs):
        """An op seen for the first time: make its plan (kept per overload), then run it. (The C
        entry, instrumentation/_speedups.c's Dispatch, comes here too.)"""
        try:
            plan = self._plan(func)
        except Exception as exc:  # a bug in racecheck must never change the program's results
            self.sink.internal_error(exc, f"while classifying {func}")
            return self.backend.execute_plain(func, args, kwargs)
        return plan(func, args, kwargs)

    # -- op planning -------------------------------------------------------------------------

    def _plan(self, func):
        oc = classify(func)
        plan = self._special_plan(oc)
        if plan is not None and self._speedups is not None and plan in self._native_special:
            plan = _native_special_plan(self._speedups, self, oc, func, plan)
        if plan is None:        # a kernel; its plan checks pin_memory itself (no wrapper frame)
            fast = oc.plain_args is not None and not oc.data_dependent
            plan = _fast_kernel(self, oc, func) if fast else _generic_kernel(self, oc)
        elif oc.has_pin_memory:
            plan = self._unless_pinned(plan)
        if oc.has_device and self.backend.routes_cuda:
            plan = self._placed(plan, oc)
        elif oc.has_device and not oc.args and self.maker.registry.host_of is not None:
            plan = self._host_factory(plan, oc)
        if func.namespace not in _TORCH_NAMESPACES:
            plan = self._custom(func, oc, plan)
        self._funcs.append(func)
        self._plans[id(func)] = plan
        return plan

    def _special_plan(self, oc):
        if oc.metadata_inplace:
            return self._metadata_inplace
        if oc.is_view:
            return self._view
        if oc.no_access:
            return self.backend.special_ops.get(oc.name) or self.backend.execute_plain
        if oc.is_copy:
            return self._copy
        if oc.is_scalar_read:
            return self._scalar_read
        return None

    def _custom(self, func, oc, plan):
        """An extension op: its declaration (`racecheck.kernel("ns::op", ...)`) says what it
        reads and writes; one whose schema declares no writes and that has no declaration runs
        as usual and is counted in the coverage (its writes, if any, are invisible)."""
        qualified = func._schema.name
        decl = declared_op(qualified)
        kernels = self.backend.kernels
        if decl is not None:
            names = [a.name for a in func._schema.arguments]

            def plan_declared(func, args, kwargs):
                named = dict(zip(names, args))
                named.update(kwargs)
                return kernels.launch_declared(decl, func, None, args, kwargs, named=named)
            return plan_declared
        if any(role in (WRITE, READ_WRITE) for *_, role in oc.args) or oc.no_access or oc.is_view:
            return plan

        def plan_unchecked(func, args, kwargs):
            kernels.coverage.note(qualified, stacks.site())
            return plan(func, args, kwargs)
        return plan_unchecked

    def _placed(self, plan, oc):
        """torch.cuda routing: `device="cuda"` makes sim device memory, the CPU host memory (a
        factory with no device is a host tensor, as on a GPU machine; `*_like`/`new_*` without
        one follow their input)."""
        kernel = self._kernel
        allocating_host = self.backend.allocating_host
        inherits = bool(oc.args)

        def plan_placed(func, args, kwargs):
            d = kwargs.get("device")
            if is_cuda_device(d):
                kwargs = dict(kwargs)
                kwargs["device"] = _CPU
                return kernel(func, args, kwargs, oc, place=DEVICE)
            if d is None and inherits:
                return plan(func, args, kwargs)
            if kwargs.get("pin_memory"):
                return plan(func, args, kwargs)
            with allocating_host():
                return kernel(func, args, kwargs, oc, place=HOST)
        return plan_placed

    def _host_factory(self, plan, oc):
        """On a GPU backend a factory placed on the CPU (`torch.full(..., device="cpu")`, or no
        device) runs on the host: host work, not a kernel on a stream. No device at dispatch
        means the CPU, exactly: `torch.set_default_device` and `with torch.device(...)` act at
        the torch-function level and fill in `device` before the op reaches dispatch, and a
        factory called from C++ without one allocates on the CPU (no per-op
        `torch.get_default_device()`, a Python function-mode walk)."""
        kernel = self._kernel

        def plan_factory(func, args, kwargs):
            d = kwargs.get("device")
            if (d is None or getattr(d, "type", d) == "cpu") and not kwargs.get("pin_memory"):
                return kernel(func, args, kwargs, oc, place=HOST)
            return plan(func, args, kwargs)
        return plan_factory

    def _unless_pinned(self, plan):
        pinned = self._pinned_factory

        def plan_or_pinned(func, args, kwargs):
            if kwargs.get("pin_memory"):
                return pinned(func, args, kwargs)
            return plan(func, args, kwargs)
        return plan_or_pinned

    def _metadata_inplace(self, func, args, kwargs):
        out = self.backend.execute_plain(func, args, kwargs)
        self.maker.forget(args[0])
        return out

    def _view(self, func, args, kwargs):
        out = self.backend.execute_plain(func, args, kwargs)
        seq = self.sink.position
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
        with self.backend.allocating_host():
            out = self.backend.execute_plain(func, args, kwargs)
            if isinstance(out, torch.Tensor):
                self.maker.registry.lookup(out, host=True)
        return out

    def _copy(self, func, args, kwargs):
        s = self.sink
        b = self.backend
        dst, src = args[0], args[1]
        non_blocking = bool(args[2]) if len(args) > 2 else bool(kwargs.get("non_blocking", False))
        if not isinstance(src, torch.Tensor):
            return self._kernel(func, args, kwargs)
        reg = self.maker.registry
        dfp = self.fp(dst)       # registers the storage, unless the tensor is empty
        dst_host = dfp.host if dfp is not None else reg.lookup(dst)[1]
        sfp = self.fp(src)
        src_host = sfp.host if sfp is not None else reg.lookup(src)[1]
        stack = stacks.capture()
        thread = s.thread_tid()
        if dst_host and src_host:
            # host memory to host memory is host work, also while a graph is being captured:
            # it runs once, now, and is no node of the graph
            s.emit(HostAccess(thread, (sfp,) if sfp else (), (dfp,) if dfp else (), "copy_", stack))
            return self.backend.execute_plain(func, args, kwargs)
        capture = b.tls.capture
        if capture is not None:
            capture.add(CapturedOp((sfp,) if sfp else (), (dfp,) if dfp else (), "copy_", stack),
                        func, args, kwargs, dst)
            return self.backend.execute_plain(func, args, kwargs)
        stream = (self._op_stream((src, dst), None) if self._op_stream is not None
                  else self.backend.current_stream_tid())
        if dfp is None or sfp is None:
            return self.backend.execute_plain(func, args, kwargs)
        hook = b.before_launch
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
        self.backend.host_read(args[0], "item", stacks.capture())
        return self.backend.execute_plain(func, args, kwargs)

    def _kernel(self, func, args, kwargs, oc=None, place=None):
        s = self.sink
        b = self.backend
        if oc is None:
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
        capture = b.tls.capture     # an op cannot start or end a capture
        irole = oc.index_role       # (index argument, indexed argument) of an index op
        ix_at = into = None
        lead_host = None            # where the op's first tensor lives (see _lifted_scalar)
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
                    if capture is None and self._queued:
                        # Queued execution: the index values are final only when the op runs.
                        into = self.maker.registry.lookup(t)[0]
                        deferred = (role, len(writes) if role == WRITE else len(reads))
                        first = False
                        any_device = any_device or not self.maker.registry.is_host(t)
                        continue
                    if capture is None:
                        with b.internal_reads():
                            f = self._index_fp(self.maker, oc.name, t, args)
                        if f is not None and hasattr(f, "resolver"):
                            pend = f     # index values still on the device: resolved later
                    else:  # index values change between replays: a captured op covers all rows
                        f = self.maker.whole(
                            t, "graph-captured index op: index values vary per replay; whole tensor used")
                else:
                    if lead_host is not None and t.dim() == 0 and \
                            not self.maker.registry.is_registered(t):
                        self._lifted_scalar(t, lead_host)
                    f = fp(t)
                first = False
                if f is None:
                    if not any_device and t.numel() == 0:
                        any_device = True
                    continue
                if lead_host is None:
                    lead_host = f.host
                if not f.host:
                    any_device = True
                if irole is not None:
                    if name == irole[1]:
                        into = f.storage
                    elif name == irole[0] and role != WRITE:
                        ix_at = (ix_at or []) + [len(reads)]   # where its read goes next
                if role == WRITE:
                    writes.append(f)
                elif role == READ_WRITE:
                    reads.append(f)
                    writes.append(f)
                else:
                    reads.append(f)
        if irole is not None and ix_at and into is not None:
            for k in ix_at:
                if reads[k].storage != into:
                    reads[k] = reads[k].as_index_into(into)
        stack = stacks.capture()
        if place is HOST or (any_tensor and not any_device and place is not DEVICE):
            if deferred is not None:     # host memory only: runs now, its indices are final
                role, pos = deferred
                t0 = args[0]
                with b.internal_reads():
                    f = index_footprint(self.maker, oc.name, t0, args)
                if f is not None:
                    _place(role, f, reads, writes)
            with b.allocating_host():
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
        hook = b.before_launch
        if hook is not None:
            hook(stream, oc.name)
        if deferred is not None:
            return self._deferred_index_kernel(func, args, kwargs, oc, stream, reads, writes,
                                               deferred, stack)
        out = self.backend.execute(stream, func, args, kwargs)
        if oc.out_roles:
            self._outputs(oc, out, stream, writes)
        ev = Kernel(s.thread_tid(), stream, tuple(reads), tuple(writes), oc.name, stack)
        if pend is None:
            s.emit(ev)
        else:
            s.emit_pending(ev, pend.resolver(ev))
        if oc.data_dependent or (oc.name == "_to_copy" and _blocking_transfer(kwargs, reads, writes)):
            self.backend.host_wait_stream(stream)
        return out

    def _lifted_scalar(self, t, host: bool) -> None:
        """A 0-dim tensor no op made: a Python number that the op's binding turned into a tensor
        without a dispatch (`t[idx] = False` hands index_put_ such a value). PyTorch makes it on
        the device of the tensor it is combined with, so it lives where the op's first tensor
        does: on sim every tensor is CPU memory, and one first seen here would pass for device
        memory, making a host-only op a kernel on the current stream."""
        self.maker.registry.lookup(t, host=host)

    def _outputs(self, oc, out, stream, writes) -> None:
        """The footprints of an op's outputs, their new storages allocated on the op's stream."""
        tls = self.backend.tls
        tls.alloc_stream = stream
        try:
            for t in iter_out_tensors(oc, out):
                f = self.fp(t)
                if f is not None:
                    writes.append(f)
        finally:
            tls.alloc_stream = None

    # -- queued executors (sim's adversarial executor) ------------------------------------------

    def _deferred_index_kernel(self, func, args, kwargs, oc, stream, reads, writes, deferred, stack):
        """An index op under a queued executor: its footprint is taken when it runs (when its
        index values are final); the Kernel still reaches the checker in host issue order."""
        s = self.sink
        maker, name = self.maker, oc.name
        box = []
        internal_reads = self.backend.internal_reads

        def snapshot(qargs, qkwargs):   # the executor calls this right before the op runs
            with internal_reads():
                box.append(index_footprint(maker, name, qargs[0], qargs))

        out = self.backend.executor.run(stream, func, args, kwargs, on_execute=snapshot)
        if oc.out_roles:
            self._outputs(oc, out, stream, writes)
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


if _GUARD is not None:
    _GUARD[1](Interceptor.__torch_dispatch__.__code__)


def _generic_kernel(icp: Interceptor, oc):
    kernel = icp._kernel
    pinned = icp._pinned_factory if oc.has_pin_memory else None

    def plan(func, args, kwargs):
        if pinned is not None and kwargs.get("pin_memory"):
            return pinned(func, args, kwargs)
        return kernel(func, args, kwargs, oc)
    return plan


def _fast_kernel(icp: Interceptor, oc, func):
    """The plan of an op whose tensor arguments are all positional single tensors.

    Compiled once per op overload with the argument unpacking unrolled (the roles are known, so
    no loop and no role tests per call), and the device path taken directly; anything unusual
    (graph capture, host memory, an empty tensor, a tensor passed by keyword, an omitted trailing
    argument) goes to the generic `Interceptor._kernel`, which recomputes the same footprints
    from the tensors' caches.
    """
    backend = icp.backend
    s = icp.sink
    fast = icp._speedups
    if fast is not None and len(oc.plain_args) <= 16:
        return _native_plan(fast, icp, oc, func)
    env = {
        "s": s, "b": backend, "tls": backend.tls, "fp": icp.fp, "tok": icp.maker.token, "attr": CACHE_ATTR,
        "tensor": torch.Tensor, "oc": oc, "names": _plan_names(oc), "name": oc.name,
        "kernel": icp._kernel, "pinned": icp._pinned_factory if oc.has_pin_memory else None,
        "capture": stacks.capture, "current": backend.current_stream_tid,
        "op_stream": icp._op_stream, "execute": backend.execute, "emit": s.emit,
        "call": getattr(func, "_op", func),     # the C++ op behind the OpOverload: a frame less
        "iter_out_tensors": iter_out_tensors, "Kernel": Kernel, "_present": _present,
    }
    src = _plan_source(oc, backend.runs_at_issue, icp._op_stream is not None)
    # Named after this file, so that stack capture counts the plan's frame as racecheck's own;
    # its source goes to linecache, so that a traceback through it (an op that raises) reads well.
    filename = f"{__file__}:plan[{oc.name}]"
    linecache.cache[filename] = (len(src), None, src.splitlines(True), filename)
    exec(compile(src, filename, "exec"), env)
    return env["plan"]


def _native_plan(fast, icp: Interceptor, oc, func):
    """The same plan as `_plan_source` writes, in C (instrumentation/_speedups.c)."""
    backend = icp.backend
    fp = icp.fp

    def outs(out):
        return _present(*map(fp, iter_out_tensors(oc, out)))
    by_device = icp._op_stream is not None
    roles = {WRITE: 1, READ_WRITE: 2}
    return fast.FastPlan(
        pinned=icp._pinned_factory if oc.has_pin_memory else None, names=_plan_names(oc),
        kernel=icp._kernel, oc=oc, tls=backend.tls, fp=fp,
        capture=stacks.capture, stream_fn=icp._op_stream if by_device else backend.current_stream_tid,
        by_device=by_device, backend=backend, call=getattr(func, "_op", func),
        direct=bool(backend.runs_at_issue), execute=backend.execute,
        out_mode=1 if oc.out_roles == (WRITE,) else (2 if WRITE in oc.out_roles else 0),
        outs=outs, sink=icp.sink, emit=icp.sink.emit, kernel_type=Kernel, name=oc.name,
        tensor=torch.Tensor, need=_args_needed(oc),
        spec=tuple((i, roles.get(role, 0)) for i, role in oc.plain_args), skip=icp._plan_skip)


def _plan_names(oc) -> frozenset:
    """Keyword arguments that send a call to the generic path: a tensor passed by keyword, and
    for `_to_copy` a device (a transfer that may involve the host and block it; without one the
    copy stays on its tensor's device, a plain kernel)."""
    return oc.arg_names | {"device"} if oc.name == "_to_copy" else frozenset(oc.arg_names)


def _native_special_plan(fast, icp: Interceptor, oc, func, slow):
    """`_copy`, `_view` or `_scalar_read`, their common case in C; `slow` (the Python plan) for
    the rest (host memory, an empty tensor, a capture, racecheck's own reads)."""
    backend = icp.backend
    kind = 1 if slow == icp._copy else 2 if slow == icp._view else 3
    by_device = kind == 1 and icp._op_stream is not None
    # a device backend's host wait only reports the HostSync: made in C with the read's stack
    wait = None if backend.host_wait_emits_only else backend.host_wait_stream
    return fast.SpecialPlan(
        kind=kind, slow=slow, tls=backend.tls, fp=icp.fp, capture=stacks.capture,
        stream_fn=icp._op_stream if by_device else backend.current_stream_tid, by_device=by_device,
        backend=backend, call=getattr(func, "_op", func), direct=bool(backend.runs_at_issue),
        execute=backend.execute, sink=icp.sink, emit=icp.sink.emit, kernel_type=Kernel,
        host_sync_type=HostSync, name="copy_" if kind == 1 else "item", tensor=torch.Tensor,
        pending=icp.sink.queue, born_attr=BORN_ATTR, wait=wait,
        skip=icp._plan_skip)


def _args_needed(oc) -> int:
    """Positional arguments a fast plan reads (a shorter call takes the generic path)."""
    return max((i for i, _ in oc.plain_args), default=-1) + 1


def _present(*fps) -> tuple:
    return tuple(f for f in fps if f is not None)


_ARG = """\
    t = args[{i}]
    if isinstance(t, tensor):
        hit = t.__dict__.get(attr)
        if hit is not None and hit[0] == tok and hit[1] == t.data_ptr():
            {f} = hit[2]
        else:
            {f} = fp(t)
            if {f} is None:
                return kernel(func, args, kwargs, oc)
        if {f}.host:
            return kernel(func, args, kwargs, oc)
    else:
        {f} = None      # a Python scalar (or None) where the schema says Tensor"""


def _plan_source(oc, direct: bool, by_device: bool) -> str:
    """Source of a fast plan for `oc` (see _fast_kernel)."""
    fs = [f"f{k}" for k in range(len(oc.plain_args))]
    reads = [f for f, (_, role) in zip(fs, oc.plain_args) if role != WRITE]
    writes = [f for f, (_, role) in zip(fs, oc.plain_args) if role in (WRITE, READ_WRITE)]
    need = _args_needed(oc)
    src = ["def plan(func, args, kwargs):",
           "    if kwargs:",
           "        if pinned is not None and kwargs.get('pin_memory'):",
           "            return pinned(func, args, kwargs)",
           "        if not names.isdisjoint(kwargs):",
           "            return kernel(func, args, kwargs, oc)",
           "    if tls.capture is not None" + (f" or len(args) < {need}:" if need else ":"),
           "        return kernel(func, args, kwargs, oc)"]
    src += [_ARG.format(i=i, f=f) for f, (i, _) in zip(fs, oc.plain_args)]
    src += ["    stack = capture()",
            "    stream = " + ("op_stream(args, kwargs)" if by_device else "current()"),
            "    hook = b.before_launch",
            "    if hook is not None:",
            "        hook(stream, name)",
            "    out = " + ("call(*args, **kwargs)" if direct
                           else "execute(stream, func, args, kwargs)")]
    src += [f"    reads = ({''.join(f + ', ' for f in reads)})",
            f"    writes = ({''.join(f + ', ' for f in writes)})"]
    if fs:
        src += [f"    if {' or '.join(f + ' is None' for f in fs)}:",
                f"        reads = _present({', '.join(reads)})",
                f"        writes = _present({', '.join(writes)})"]
    # new output storages are allocated on the op's stream (Interceptor._outputs)
    if oc.out_roles == (WRITE,):
        src += ["    tls.alloc_stream = stream",
                "    try:",
                "        if isinstance(out, tensor):",
                "            f = fp(out)",
                "            if f is not None:",
                "                writes += (f,)",
                "        else:",
                "            writes += _present(*map(fp, iter_out_tensors(oc, out)))",
                "    finally:",
                "        tls.alloc_stream = None"]
    elif WRITE in oc.out_roles:
        src += ["    tls.alloc_stream = stream",
                "    try:",
                "        writes += _present(*map(fp, iter_out_tensors(oc, out)))",
                "    finally:",
                "        tls.alloc_stream = None"]
    src += ["    thread = tls.tid",
            "    if thread is None:",
            "        thread = s.thread_tid()",
            "    emit(Kernel(thread, stream, reads, writes, name, stack))",
            "    return out"]
    return "\n".join(src) + "\n"
