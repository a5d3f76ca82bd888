"""Triton launches as device ops, with footprints read off the kernel's own source.

A launch `kernel[grid](*args)` bypasses the ATen dispatcher, so the dispatch mode never sees it.
For the session, `JITFunction.run` (and the interpreter's `InterpretedFunction.run`, which
autotuned and heuristics wrappers end in) become one `Kernel` event on the current stream:

* which tensor arguments are read and written comes from the kernel's source (`KernelAccess`):
  a pointer argument that reaches `tl.store` is written, one that reaches `tl.load` is read, an
  atomic does both; pointer arithmetic, block pointers, tensor descriptors and calls to other
  `@triton.jit` functions are followed; a loaded value is data, not a pointer. An argument whose
  use the analysis cannot follow (an unknown call, inline assembly) is read and written and the
  finding says so. Footprints cover the whole tensor (a kernel's offsets are runtime values).
* on sim the kernel runs in Triton's CPU interpreter (TRITON_INTERPRET semantics), with the
  session's dispatch mode off (its internal host copies are not the program's ops); autotuning
  takes the first config without benchmarking (a benchmark would time CPU work and synchronize).
  On a GPU the real kernel runs.
"""
from __future__ import annotations

import ast
import inspect
import textwrap
import threading

import torch

_LOADS = {"load"}
_STORES = {"store"}
_ATOMICS = {"atomic_add", "atomic_cas", "atomic_xchg", "atomic_max", "atomic_min", "atomic_and",
            "atomic_or", "atomic_xor", "atomic_fadd"}
_POINTER_MAKERS = {"make_block_ptr", "advance", "make_tensor_descriptor", "pointer_type",
                   "cast", "multiple_of", "max_contiguous", "max_constancy", "assume"}
_OPAQUE = {"inline_asm_elementwise", "extern_elementwise"}
_DESCRIPTOR_LOADS = {"load", "gather"}
_DESCRIPTOR_STORES = {"store", "scatter"}


class KernelAccess:
    """What one `@triton.jit` function does with each parameter: reads, writes, or unknown use
    (read and written, approximately). `returns` maps the function's result to parameters (for
    callers that use a helper's result as a pointer)."""

    __slots__ = ("name", "params", "reads", "writes", "unknown", "returns", "reason")

    def __init__(self, name, params, reads=(), writes=(), unknown=(), returns=(), reason=""):
        self.name = name
        self.params = tuple(params)
        self.reads = frozenset(reads)
        self.writes = frozenset(writes)
        self.unknown = frozenset(unknown)
        self.returns = frozenset(returns)
        self.reason = reason

    def __repr__(self):
        return (f"KernelAccess({self.name}: reads={sorted(self.reads)}, writes={sorted(self.writes)}"
                f", unknown={sorted(self.unknown)})")


_cache: dict = {}
_cache_lock = threading.Lock()


def kernel_function(kernel):
    """The Python function behind a JITFunction / InterpretedFunction / Autotuner / Heuristics."""
    seen = 0
    while not inspect.isfunction(kernel) and seen < 8:
        inner = getattr(kernel, "fn", None)
        if inner is None:
            return None
        kernel = inner
        seen += 1
    return kernel if inspect.isfunction(kernel) else None


def analyze(kernel) -> KernelAccess:
    """The access classification of a Triton kernel, computed once per function."""
    fn = kernel_function(kernel)
    if fn is None:
        return KernelAccess(getattr(kernel, "__name__", repr(kernel)), (),
                            reason="no Python source behind the kernel object")
    with _cache_lock:
        hit = _cache.get(fn)
    if hit is not None:
        return hit
    acc = _Analysis(fn, set()).run()
    with _cache_lock:
        _cache[fn] = acc
    return acc


def _resolve(node, scope):
    """The object an expression like `tl.load` or `helper` names in the kernel's scope, or None."""
    if isinstance(node, ast.Name):
        return scope.get(node.id)
    if isinstance(node, ast.Attribute):
        base = _resolve(node.value, scope)
        return getattr(base, node.attr, None) if base is not None else None
    return None


def _is_triton_language(obj) -> bool:
    mod = getattr(obj, "__module__", "") or ""
    return mod.startswith("triton.language") or mod.startswith("triton.experimental")


def _is_jit(obj) -> bool:
    return kernel_function(obj) is not None and type(obj).__module__.startswith("triton.")


class _Analysis:
    """Flow-insensitive pointer provenance: which parameters an expression's pointer may come
    from. Assignments only add provenance, so iterating the body to a fixed point is enough."""

    MAX_ROUNDS = 20

    def __init__(self, fn, stack: set):
        self.fn = fn
        self.stack = stack
        self.name = fn.__name__
        self.params = list(inspect.signature(fn).parameters)
        scope = dict(fn.__globals__)
        try:
            scope.update(inspect.getclosurevars(fn).nonlocals)
        except (TypeError, ValueError):
            pass
        self.scope = scope
        self.env = {p: {p} for p in self.params}
        self.reads, self.writes, self.unknown, self.returns = set(), set(), set(), set()
        self.changed = False

    def run(self) -> KernelAccess:
        try:
            src = textwrap.dedent(inspect.getsource(self.fn))
            tree = ast.parse(src)
        except (OSError, TypeError, SyntaxError, IndentationError) as exc:
            return KernelAccess(self.name, self.params, unknown=self.params,
                                reason=f"kernel source unavailable ({type(exc).__name__})")
        fdef = next((n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)), None)
        if fdef is None:
            return KernelAccess(self.name, self.params, unknown=self.params,
                                reason="no function definition in the kernel source")
        for a in fdef.args.args + fdef.args.kwonlyargs:
            if a.annotation is not None and ast.unparse(a.annotation).endswith("constexpr"):
                self.env[a.arg] = set()          # a compile-time constant is never a pointer
        self.stack.add(self.fn)
        try:
            for _ in range(self.MAX_ROUNDS):
                self.changed = False
                for stmt in fdef.body:
                    self.stmt(stmt)
                if not self.changed:
                    break
        finally:
            self.stack.discard(self.fn)
        params = set(self.params)
        return KernelAccess(self.name, self.params, self.reads & params, self.writes & params,
                            self.unknown & params, self.returns & params,
                            "its use of this argument could not be followed" if self.unknown else "")

    # -- statements --------------------------------------------------------------------------
    def bind(self, target, prov) -> None:
        if isinstance(target, ast.Name):
            cur = self.env.setdefault(target.id, set())
            if not prov <= cur:
                cur |= prov
                self.changed = True
        elif isinstance(target, (ast.Tuple, ast.List)):
            for t in target.elts:
                self.bind(t, prov)
        elif isinstance(target, ast.Starred):
            self.bind(target.value, prov)
        elif isinstance(target, (ast.Subscript, ast.Attribute)):
            self.expr(target.value)

    def stmt(self, s) -> None:
        if isinstance(s, ast.Assign):
            prov = self.expr(s.value)
            for t in s.targets:
                if isinstance(t, (ast.Tuple, ast.List)) and isinstance(s.value, (ast.Tuple, ast.List)) \
                        and len(t.elts) == len(s.value.elts):
                    for te, ve in zip(t.elts, s.value.elts):
                        self.bind(te, self.expr(ve))
                else:
                    self.bind(t, prov)
        elif isinstance(s, ast.AugAssign):
            self.bind(s.target, self.expr(s.value) | self.expr(s.target))
        elif isinstance(s, ast.AnnAssign):
            if s.value is not None:
                self.bind(s.target, self.expr(s.value))
        elif isinstance(s, (ast.For, ast.AsyncFor)):
            self.bind(s.target, self.expr(s.iter))
            for b in s.body + s.orelse:
                self.stmt(b)
        elif isinstance(s, ast.While):
            self.expr(s.test)
            for b in s.body + s.orelse:
                self.stmt(b)
        elif isinstance(s, ast.If):
            self.expr(s.test)
            for b in s.body + s.orelse:
                self.stmt(b)
        elif isinstance(s, (ast.With, ast.AsyncWith)):
            for item in s.items:
                self.expr(item.context_expr)
            for b in s.body:
                self.stmt(b)
        elif isinstance(s, ast.Return):
            if s.value is not None:
                prov = self.expr(s.value)
                if not prov <= self.returns:
                    self.returns |= prov
                    self.changed = True
        elif isinstance(s, ast.Expr):
            self.expr(s.value)
        elif isinstance(s, ast.Assert):
            self.expr(s.test)

    # -- expressions -------------------------------------------------------------------------
    def expr(self, e) -> set:
        if e is None:
            return set()
        if isinstance(e, ast.Name):
            return set(self.env.get(e.id, ()))
        if isinstance(e, ast.Constant):
            return set()
        if isinstance(e, ast.BinOp):
            return self.expr(e.left) | self.expr(e.right)
        if isinstance(e, ast.UnaryOp):
            return self.expr(e.operand)
        if isinstance(e, (ast.BoolOp, ast.Compare)):
            for v in (e.values if isinstance(e, ast.BoolOp) else [e.left, *e.comparators]):
                self.expr(v)
            return set()
        if isinstance(e, ast.IfExp):
            self.expr(e.test)
            return self.expr(e.body) | self.expr(e.orelse)
        if isinstance(e, ast.Subscript):
            self.expr(e.slice)
            return self.expr(e.value)
        if isinstance(e, ast.Attribute):
            return self.expr(e.value)
        if isinstance(e, (ast.Tuple, ast.List, ast.Set)):
            out = set()
            for x in e.elts:
                out |= self.expr(x)
            return out
        if isinstance(e, ast.Starred):
            return self.expr(e.value)
        if isinstance(e, ast.Slice):
            for x in (e.lower, e.upper, e.step):
                self.expr(x)
            return set()
        if isinstance(e, ast.Call):
            return self.call(e)
        if isinstance(e, (ast.ListComp, ast.GeneratorExp)):
            return self.expr(e.elt)
        return set()

    def _args(self, call) -> tuple:
        pos = [self.expr(a) for a in call.args]
        kw = {k.arg: self.expr(k.value) for k in call.keywords if k.arg is not None}
        for k in call.keywords:
            if k.arg is None:
                self.unknown |= self.expr(k.value)
        return pos, kw

    def _first(self, pos, kw, *names) -> set:
        if pos:
            return pos[0]
        for n in names:
            if n in kw:
                return kw[n]
        return set()

    def call(self, c) -> set:
        pos, kw = self._args(c)
        every = set().union(*pos, *kw.values()) if (pos or kw) else set()
        target = _resolve(c.func, self.scope)
        name = getattr(target, "__name__", None)
        if target is not None and _is_triton_language(target) and not _is_jit(target):
            if name in _LOADS:
                self.reads |= self._first(pos, kw, "pointer")
                return set()
            if name in _STORES:
                self.writes |= self._first(pos, kw, "pointer")
                return set()
            if name in _ATOMICS:
                p = self._first(pos, kw, "pointer")
                self.reads |= p
                self.writes |= p
                return set()
            if name in _OPAQUE:
                self.unknown |= every
                return set()
            if name in _POINTER_MAKERS:
                return self._first(pos, kw, "base", "ptr", "pointer", "input", "x")
            return every               # elementwise math, shapes, reductions: values flow through
        if target is not None and _is_jit(target):
            return self.jit_call(target, c, pos, kw)
        if isinstance(c.func, ast.Attribute) and target is None:
            # a method on a kernel value: pointer/value methods, or a tensor descriptor's I/O
            recv = self.expr(c.func.value)
            attr = c.func.attr
            if attr in _DESCRIPTOR_LOADS:
                self.reads |= recv
                return set()
            if attr in _DESCRIPTOR_STORES:
                self.writes |= recv
                return set()
            if attr.startswith("atomic_"):
                self.reads |= recv
                self.writes |= recv
                return set()
            return recv | every
        if target is not None and (target in (range, min, max, len, int, float, bool, abs)
                                   or getattr(target, "__module__", "") == "builtins"):
            return every
        if target is not None and _is_triton_language(target):
            return every
        self.unknown |= every           # a call the analysis cannot see into
        return every

    def jit_call(self, target, c, pos, kw) -> set:
        fn = kernel_function(target)
        if fn in self.stack:            # recursion: stay conservative
            self.unknown |= set().union(*pos, *kw.values()) if (pos or kw) else set()
            return set()
        with _cache_lock:
            callee = _cache.get(fn)
        if callee is None:
            callee = _Analysis(fn, self.stack).run()
            with _cache_lock:
                _cache[fn] = callee
        bound = {}
        for p, prov in zip(callee.params, pos):
            bound[p] = prov
        for k, prov in kw.items():
            bound[k] = prov
        out = set()
        for p, prov in bound.items():
            if p in callee.reads:
                self.reads |= prov
            if p in callee.writes:
                self.writes |= prov
            if p in callee.unknown:
                self.unknown |= prov
            if p in callee.returns:
                out |= prov
        return out


def launch_args(acc: KernelAccess, fn, args, kwargs) -> tuple:
    """(reads, writes, approx) tensors of one launch, bound to the kernel's parameters."""
    try:
        bound = inspect.signature(fn).bind_partial(*args, **{k: v for k, v in kwargs.items()
                                                              if k in acc.params})
    except TypeError:
        bound = None
    reads, writes, approx = [], [], []
    items = bound.arguments.items() if bound is not None else zip(acc.params, args)
    for name, value in items:
        for t in _tensors(value):
            if name in acc.unknown:
                reads.append(t)
                writes.append(t)
                approx.append(t)
                continue
            if name in acc.reads:
                reads.append(t)
            if name in acc.writes:
                writes.append(t)
    return reads, writes, approx


def _tensors(v):
    if isinstance(v, torch.Tensor):
        yield v
    elif isinstance(v, (tuple, list)):
        for x in v:
            yield from _tensors(x)
    else:
        base = getattr(v, "base", None)       # triton's reinterpret() wrapper, tensor descriptors
        if isinstance(base, torch.Tensor):
            yield base


class TritonHook:
    """Patches Triton's launch entry points for one session (see the module docstring)."""

    def __init__(self, backend):
        self.backend = backend
        self.launcher = backend.kernels
        self.interpret = backend.name == "sim"
        self._tls = threading.local()
        self._interpreted: dict = {}       # kernel function -> InterpretedFunction
        self._undo: list = []

    def install(self) -> None:
        try:
            from triton.runtime import jit as jit_mod
        except Exception:              # triton not installed (or broken): nothing launches Triton
            return
        classes = [jit_mod.JITFunction]
        try:
            from triton.runtime.interpreter import InterpretedFunction
            classes.append(InterpretedFunction)
        except Exception:
            InterpretedFunction = None
        self._InterpretedFunction = InterpretedFunction
        self._JITFunction = jit_mod.JITFunction
        for cls in classes:
            self._patch(cls, "run", self._make_run)
        if self.interpret:
            from triton.runtime import autotuner
            self._patch(autotuner.Autotuner, "_bench", lambda orig: _no_benchmark)

    def _patch(self, owner, name, make) -> None:
        orig = owner.__dict__[name]
        setattr(owner, name, make(orig))
        self._undo.append(lambda: setattr(owner, name, orig))

    def uninstall(self) -> None:
        while self._undo:
            self._undo.pop()()

    def _make_run(self, orig):
        hook = self

        def run(kernel, *args, grid, warmup, **kwargs):
            if warmup or getattr(hook._tls, "inside", False) or not hook.backend.sink.checking:
                return orig(kernel, *args, grid=grid, warmup=warmup, **kwargs)
            return hook.launch(orig, kernel, args, grid, kwargs)
        run.__wrapped__ = orig
        return run

    def launch(self, orig, kernel, args, grid, kwargs):
        acc = analyze(kernel)
        fn = kernel_function(kernel)
        reads, writes, unknown = launch_args(acc, fn, args, kwargs)
        approx = self.launcher.footprints(
            unknown, f"Triton kernel {acc.name}: {acc.reason or 'use not followed'}; whole tensor "
                     "read and written") if unknown else ()
        if self.interpret:
            def run():
                return self._interpret(fn, args, grid, kwargs)
        else:
            def run():
                self._tls.inside = True
                try:
                    return orig(kernel, *args, grid=grid, warmup=False, **kwargs)
                finally:
                    self._tls.inside = False
        return self.launcher.launch(acc.name, reads, writes, run, approx_reads=approx,
                                    approx_writes=approx)

    def _interpret(self, fn, args, grid, kwargs):
        """Run the kernel in Triton's CPU interpreter; nested @triton.jit calls are interpreted
        too (a kernel defined without TRITON_INTERPRET is a JITFunction, callable only on a GPU)."""
        from torch.utils._python_dispatch import _disable_current_modes
        interp = self._interpreted_fn(fn)
        JIT = self._JITFunction
        hook = self
        prev_call = JIT.__call__

        def device_call(jit, *a, **k):
            return hook._interpreted_fn(jit.fn)(*a, **k)
        self._tls.inside = True
        JIT.__call__ = device_call
        try:
            with _disable_current_modes():
                return interp.run(*args, grid=grid, warmup=False, **kwargs)
        finally:
            JIT.__call__ = prev_call
            self._tls.inside = False

    def _interpreted_fn(self, fn):
        f = self._interpreted.get(fn)
        if f is None:
            f = self._interpreted[fn] = self._InterpretedFunction(fn)
        return f


def _no_benchmark(*args, **kwargs):
    """Autotuning on sim: every config times the same, so the first one is chosen (benchmarking
    would run CPU work many times and synchronize the device)."""
    return [0.0, 0.0, 0.0]
