"""Triton launches as device ops, with footprints read off the kernel's own source.

A launch `kernel[grid](*args)` bypasses the ATen dispatcher, so the dispatch mode never sees it.
For the session, `JITFunction.run` (and the interpreter's `InterpretedFunction.run`, which
autotuned and heuristics wrappers end in) become one `Kernel` event on the current stream:

* which tensor arguments are read and written comes from the kernel's source (`KernelAccess`):
  a pointer argument that reaches `tl.store` is written, one that reaches `tl.load` is read, an
  atomic does both; pointer arithmetic, block pointers, tensor descriptors and calls to other
  `@triton.jit` functions are followed; a loaded value is data, not a pointer. An argument whose
  use the analysis cannot follow (an unknown call, inline assembly) is read and written and the
  finding says so. On a GPU footprints cover the whole tensor (a kernel's offsets are runtime
  values), and a finding says that too.
* on sim the kernel runs in Triton's CPU interpreter (TRITON_INTERPRET semantics), with the
  session's dispatch mode off (its internal host copies are not the program's ops); autotuning
  takes the first config without benchmarking (a benchmark would time CPU work and synchronize).
  On a GPU the real kernel runs.
"""
from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import textwrap
import threading

import torch

from racecheck.core.trace import Footprint

from . import launch_cache
from .addresses import StorageSpans

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

    __slots__ = ("name", "params", "reads", "writes", "unknown", "returns", "reason", "indirect")

    def __init__(self, name, params, reads=(), writes=(), unknown=(), returns=(), reason="",
                 indirect=False):
        self.name = name
        self.params = tuple(params)
        self.reads = frozenset(reads)
        self.writes = frozenset(writes)
        self.unknown = frozenset(unknown)
        self.returns = frozenset(returns)
        self.reason = reason
        self.indirect = indirect

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


def analyze(kernel, consts: dict | None = None) -> KernelAccess:
    """The access classification of a Triton kernel; `consts` are the launch's values of its
    `tl.constexpr` parameters, which decide `if` branches (a dummy argument passed to a disabled
    branch is not accessed). Computed once per function and constexpr values."""
    fn = kernel_function(kernel)
    if fn is None:
        return KernelAccess(getattr(kernel, "__name__", repr(kernel)), (),
                            reason="no Python source behind the kernel object")
    return _analysis_of(fn, consts or {}, set())


class _Variants:
    """One kernel function's analyses. An analysis depends on the constexpr values it looked up
    (its `if` tests, and the arguments it passes to nested `@triton.jit` calls), not on every
    constexpr the launch gives: analyses are kept by the names they asked about, and a launch
    that agrees on those names' values reuses one (a batch size passed as a constexpr does not
    make a kernel new)."""

    __slots__ = ("const_params", "defaults", "by_names")

    def __init__(self, const_params, defaults):
        self.const_params = frozenset(const_params)
        self.defaults = dict(defaults)
        self.by_names: dict = {}        # names asked, sorted -> {their values: KernelAccess}

    def value(self, name, given):
        if name not in self.const_params:
            return _UNKNOWN
        if name in given:
            return _unwrap_constexpr(given[name])
        return self.defaults.get(name, _UNKNOWN)

    def find(self, given):
        for names, table in self.by_names.items():
            hit = table.get(_hashable(tuple(self.value(n, given) for n in names)))
            if hit is not None:
                return hit
        return None

    def keep(self, asked, values, acc) -> None:
        self.by_names.setdefault(asked, {})[_hashable(values)] = acc


def _hashable(values: tuple) -> tuple:
    try:
        hash(values)
        return values
    except TypeError:
        return tuple(repr(v) for v in values)


def _analysis_of(fn, consts: dict, stack: set) -> KernelAccess:
    with _cache_lock:
        variants = _cache.get(fn)
        hit = variants.find(consts) if variants is not None else None
    if hit is not None:
        return hit
    analysis = _Analysis(fn, stack, consts)
    acc = analysis.run()
    asked = tuple(sorted(analysis.consts.asked))
    values = tuple(dict.get(analysis.consts, n, _UNKNOWN) for n in asked)
    with _cache_lock:
        variants = _cache.get(fn)
        if variants is None:
            variants = _cache[fn] = _Variants(analysis.const_params, analysis.defaults)
        variants.keep(asked, values, acc)
    return acc


class _Asked(dict):
    """Constexpr values that note which names an analysis looked up."""

    __slots__ = ("asked",)

    def __init__(self):
        super().__init__()
        self.asked: set = set()

    def get(self, key, default=None):
        self.asked.add(key)
        return super().get(key, default)


_UNKNOWN = object()


def _const_eval(e, consts):
    """The value of an expression built from constants and constexpr parameters, or _UNKNOWN."""
    if isinstance(e, ast.Constant):
        return e.value
    if isinstance(e, ast.Name):
        return consts.get(e.id, _UNKNOWN)
    if isinstance(e, ast.UnaryOp):
        v = _const_eval(e.operand, consts)
        if v is _UNKNOWN:
            return v
        if isinstance(e.op, ast.Not):
            return not v
        if isinstance(e.op, ast.USub):
            return -v
        return _UNKNOWN
    if isinstance(e, ast.BoolOp):
        vals = [_const_eval(v, consts) for v in e.values]
        if any(v is _UNKNOWN for v in vals):
            return _UNKNOWN
        return all(vals) if isinstance(e.op, ast.And) else any(vals)
    if isinstance(e, ast.Compare) and len(e.ops) == 1:
        a, b = _const_eval(e.left, consts), _const_eval(e.comparators[0], consts)
        if a is _UNKNOWN or b is _UNKNOWN:
            return _UNKNOWN
        op = e.ops[0]
        try:
            if isinstance(op, ast.Eq):
                return a == b
            if isinstance(op, ast.NotEq):
                return a != b
            if isinstance(op, ast.Lt):
                return a < b
            if isinstance(op, ast.LtE):
                return a <= b
            if isinstance(op, ast.Gt):
                return a > b
            if isinstance(op, ast.GtE):
                return a >= b
            if isinstance(op, ast.Is):
                return a is b
            if isinstance(op, ast.IsNot):
                return a is not b
        except TypeError:
            return _UNKNOWN
    return _UNKNOWN


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

    def __init__(self, fn, stack: set, consts: dict | None = None):
        self.fn = fn
        self.stack = stack
        self.consts = _Asked()
        self.const_params = set()
        self.defaults: dict = {}
        self.name = fn.__name__
        self.params = list(_signature(fn).parameters)
        scope = dict(fn.__globals__)
        try:
            scope.update(inspect.getclosurevars(fn).nonlocals)
        except (TypeError, ValueError):
            pass
        self.scope = scope
        self.env = {p: {p} for p in self.params}
        self.reads, self.writes, self.unknown, self.returns = set(), set(), set(), set()
        self.indirect = False           # a load/store through a pointer no argument gave
        self.changed = False
        self._given = dict(consts or {})

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
        defaults = dict(zip([a.arg for a in fdef.args.args][-len(fdef.args.defaults):],
                            fdef.args.defaults)) if fdef.args.defaults else {}
        for a in fdef.args.args + fdef.args.kwonlyargs:
            if a.annotation is not None and ast.unparse(a.annotation).endswith("constexpr"):
                self.env[a.arg] = set()          # a compile-time constant is never a pointer
                self.const_params.add(a.arg)
                if a.arg in self._given:
                    self.consts[a.arg] = _unwrap_constexpr(self._given[a.arg])
                elif a.arg in defaults:
                    v = _const_eval(defaults[a.arg], {})
                    if v is not _UNKNOWN:
                        self.consts[a.arg] = self.defaults[a.arg] = v
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
                            "its use of this argument could not be followed" if self.unknown else "",
                            self.indirect)

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
            taken = _const_eval(s.test, self.consts)
            self.expr(s.test)
            branch = s.body + s.orelse if taken is _UNKNOWN else (s.body if taken else s.orelse)
            for b in branch:
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
            taken = _const_eval(e.test, self.consts)
            self.expr(e.test)
            if taken is not _UNKNOWN:
                return self.expr(e.body if taken else e.orelse)
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

    def _access(self, prov, read=False, write=False) -> None:
        if not prov:
            self.indirect = True        # e.g. a pointer loaded from a table of data_ptr()s
        if read:
            self.reads |= prov
        if write:
            self.writes |= prov

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
                self._access(self._first(pos, kw, "pointer"), read=True)
                return set()
            if name in _STORES:
                self._access(self._first(pos, kw, "pointer"), write=True)
                return set()
            if name in _ATOMICS:
                self._access(self._first(pos, kw, "pointer"), read=True, write=True)
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
        consts = {}
        params = list(_signature(fn).parameters)
        for p, a in zip(params, c.args):
            v = _const_eval(a, self.consts)
            if v is not _UNKNOWN:
                consts[p] = v
        for k in c.keywords:
            if k.arg is not None:
                v = _const_eval(k.value, self.consts)
                if v is not _UNKNOWN:
                    consts[k.arg] = v
        callee = _analysis_of(fn, consts, self.stack)
        self.indirect = self.indirect or callee.indirect
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


@functools.lru_cache(maxsize=4096)
def _signature(fn) -> inspect.Signature:
    """A kernel function's signature, read once: every launch binds its arguments to it."""
    return inspect.signature(fn)


class _Binder:
    """A kernel's arguments bound to its parameter names, as `Signature.bind_partial` binds
    them, without building a BoundArguments per launch (a launch binds twice: its constexprs,
    then its tensors). Kernels take plain named parameters; any other signature (`*args`,
    keyword-only, positional-only) is left to `inspect`."""

    __slots__ = ("sig", "names", "known", "defaults", "constexprs", "plain")

    def __init__(self, sig: inspect.Signature):
        self.sig = sig
        params = sig.parameters
        self.names = tuple(params)
        self.known = frozenset(params)
        self.plain = all(p.kind is p.POSITIONAL_OR_KEYWORD for p in params.values())
        self.defaults = {n: p.default for n, p in params.items() if p.default is not p.empty}
        self.constexprs = tuple(n for n, p in params.items() if "constexpr" in str(
            p.annotation if isinstance(p.annotation, str)
            else getattr(p.annotation, "__name__", repr(p.annotation))))

    def bind(self, args, kwargs) -> dict:
        """name -> value of the arguments given (TypeError as `bind_partial` raises it)."""
        if not self.plain:
            return dict(self.sig.bind_partial(*args, **{k: v for k, v in kwargs.items()
                                                   if k in self.known}).arguments)
        if len(args) > len(self.names):
            raise TypeError("too many positional arguments")
        bound = dict(zip(self.names, args))
        for k, v in kwargs.items():
            if k in self.known:
                if k in bound:
                    raise TypeError(f"multiple values for argument {k!r}")
                bound[k] = v
        return bound


@functools.lru_cache(maxsize=4096)
def _binder(fn) -> _Binder:
    return _Binder(_signature(fn))


def _unwrap_constexpr(v):
    return getattr(v, "value", v) if type(v).__name__ == "constexpr" else v


def launch_consts(fn, args, kwargs) -> dict:
    """Values the launch gives the kernel's `tl.constexpr` parameters (defaults included)."""
    try:
        binder = _binder(fn)
        bound = binder.bind(args, kwargs)
    except (TypeError, ValueError):
        return {}
    out = {}
    for name in binder.constexprs:
        if name in bound:
            v = bound[name]
        elif name in binder.defaults:
            v = binder.defaults[name]
        else:
            continue
        v = _unwrap_constexpr(v)
        if v is None or isinstance(v, (bool, int, float, str)):
            out[name] = v
    return out


def launch_args(acc: KernelAccess, fn, args, kwargs) -> tuple:
    """(reads, writes, approx) tensors of one launch, bound to the kernel's parameters."""
    try:
        bound = _binder(fn).bind(args, {k: v for k, v in kwargs.items() if k in acc.params})
    except (TypeError, ValueError):
        bound = None
    reads, writes, approx = [], [], []
    items = bound.items() if bound is not None else zip(acc.params, args)
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


BUILTINS_ONCE = True        # bench/bench_triton_interpreter.py compares with Triton's own scan
OVERFLOW_CHECKS_AS_COMPILED = True      # the same bench compares with the interpreter's own
LANGUAGE_ONCE_PER_LAUNCH = True         # the same bench compares with a patch per nested call
DTYPES_MEMOIZED = True                  # and with a numpy dtype worked out per value
TYPES_MEMOIZED = True                   # and with block types and shapes built per value
BINARY_CHECKS_MEMOIZED = True           # and with a binary op's type checks worked out per op
LAUNCHES_REPLAYED = True                # launch_cache: a launch on recorded bytes is not interpreted


def _builtins_scanned_once(orig):
    """Triton's interpreter finds the builtins of `triton.language` (and its tensor classes) by
    scanning them (`inspect.getmembers`) at every launch and at every nested `@triton.jit` call,
    to swap in their interpreted versions: a tenth of the real engine's loop on sim
    (bench/bench_triton_interpreter.py). The builtins a module or class defines do not change,
    so each is scanned once, at a launch (nothing swapped in yet), and later calls swap in the
    names found then."""
    from triton.language import core
    from triton.runtime import interpreter
    scanned: dict = {}          # id(module or class) -> (it, its builtins' names)

    def patch_builtin(pkg, builder, scope):
        got = scanned.get(id(pkg))
        if got is None or got[0] is not pkg:
            names = tuple(name for name, member in inspect.getmembers(pkg)
                          if core.is_builtin(member))
            if not names:               # already swapped in: nothing to learn from this scan
                return orig(pkg, builder, scope)
            got = scanned[id(pkg)] = (pkg, names)
        for name in got[1]:
            member = getattr(pkg, name)
            if core.is_builtin(member):
                interpreter._patch_attr(pkg, name, member, builder, scope)
    return patch_builtin


_STARTING = object()


def _language_once_per_launch(orig, tls):
    """Triton's interpreter swaps its interpreted builtins into `triton.language` at a launch
    (and restores them at its end), and again at every nested `@triton.jit` call, where they
    are already in place: a nested call's swap finds nothing left to swap and sets the same
    tensor and core patches again, and its scope is never restored. Inside a launch made
    through this hook (`tls.langs` set), a nested call whose language modules the launch
    already patched skips that work; a module the launch did not patch is patched as Triton
    would."""
    import triton.language as tl
    from triton.runtime import interpreter
    modules = {id(tl), id(tl.core)}

    def patch_lang(fn):
        state = getattr(tls, "langs", None)
        if state is None:                       # not a launch of this session: Triton's way
            return orig(fn)
        langs = frozenset(id(v) for v in fn.__globals__.values() if id(v) in modules)
        if state is not _STARTING and langs <= state:
            return interpreter._LangPatchScope()
        scope = orig(fn)
        tls.langs = langs if state is _STARTING else state | langs
        return scope
    return patch_lang


def _dtypes_memoized(orig):
    """The interpreter maps a Triton type to its numpy dtype by building a table per call, for
    every value an interpreted op makes: the answer depends on the element type alone."""
    from triton.language import core
    memo: dict = {}

    def np_dtype(tt):
        key = tt.element_ty if isinstance(tt, core.block_type) else tt
        if isinstance(key, core.pointer_type):      # unhashable; every pointer is an address
            key = core.pointer_type
        got = memo.get(key)
        if got is None:
            got = memo[key] = orig(tt)
        return got
    return np_dtype


def _memo_of(obj, own: tuple, core):
    """What another object made alike can take from a freshly made `obj`: (name, value, is a
    Triton tuple) for its attributes but `own`; None where one of them is not a value of a
    kind Triton never changes once made (a Triton tuple is copied on the way out, its items
    and type shared)."""
    kinds = (core.tuple, core.constexpr, int, str, tuple)
    got = [(k, v, type(v) is core.tuple) for k, v in obj.__dict__.items() if k not in own]
    return got if all(type(v) in kinds for _k, v, _t in got) else None


def _take(obj, memo: list, Tuple) -> None:
    d = obj.__dict__
    for k, v, is_tuple in memo:
        if is_tuple:
            c = object.__new__(Tuple)
            c.__dict__.update(v.__dict__)
            c.values = list(v.values)
            v = c
        d[k] = v


def _block_types_memoized(orig):
    """Every value an interpreted op makes gets a `block_type`, whose constructor unwraps the
    shape, builds it as a Triton tuple (its tuple type worked out per dimension), validates it
    and formats its name: about a tenth of an interpreted engine process. What it computes
    depends on the element type and the dimensions alone, so it is done once per pair."""
    from triton.language import core
    Tuple, Constexpr = core.tuple, core.constexpr
    memo: dict = {}

    def init(self, element_ty, shape):
        vals = shape.values if type(shape) is Tuple else shape
        name = getattr(element_ty, "name", None)
        if type(vals) not in (list, tuple) or type(name) is not str:
            return orig(self, element_ty, shape)
        dims = []
        for v in vals:
            if type(v) is Constexpr:
                v = v.value
            if type(v) is not int:
                return orig(self, element_ty, shape)
            dims.append(v)
        key = (type(element_ty), name, getattr(element_ty, "address_space", None), *dims)
        got = memo.get(key)
        if got is None:
            orig(self, element_ty, shape)
            if len(memo) >= 4096:
                memo.clear()
            memo[key] = _memo_of(self, ("element_ty",), core) or False
            return None
        if got is False:
            return orig(self, element_ty, shape)
        _take(self, got, Tuple)
        self.element_ty = element_ty
        return None
    return init


def _tensor_shapes_memoized(orig):
    """A Triton value's constructor builds its shape as a Triton tuple of constexprs (a tuple
    type worked out per dimension) and its element count, per value: the same for every value
    of a shape. Its handle, type and dtype are its own."""
    from triton.language import core
    Tuple = core.tuple
    memo: dict = {}

    def init(self, handle, type_):
        if type_.is_block():
            shape = type_.shape          # a block type's dimensions: ints, unwrapped
            if type(shape) is not Tuple:
                return orig(self, handle, type_)
            dims = tuple(shape.values)
        else:
            dims = ()
        got = memo.get(dims)
        if got is None:
            orig(self, handle, type_)
            if len(memo) >= 4096:
                memo.clear()
            memo[dims] = _memo_of(self, ("handle", "type", "dtype"), core) or False
            return None
        if got is False:
            return orig(self, handle, type_)
        _take(self, got, Tuple)
        self.handle = handle
        self.type = type_
        self.dtype = type_.scalar
        return None
    return init


def _operand_kind(sem, v, Number, Tensor, classes):
    """What a binary op's type checks read of an operand: a value's type (class and name; the
    name spells shape, element type and const-ness, as block types' own memo keys them), or a
    Python number's class and the type Triton gives it. None: anything else (Triton decides)."""
    if type(v) is Tensor:
        ty = v.type
        if type(ty) not in classes:
            return None
        return type(ty), ty.name, getattr(ty.scalar, "address_space", None)
    if isinstance(v, Number):
        return type(v), sem.to_tensor_type(v).name
    return None


def _broadcast_steps(before, after) -> tuple:
    """How Triton's broadcast took an operand of type `before` to `after`: a splat, or new
    leading axes then a broadcast; the block types are made again per value."""
    if not after.is_block():
        return ()
    shape = list(after.get_block_shapes())
    if not before.is_block():
        return (("splat", shape),)
    have = list(before.get_block_shapes())
    steps = []
    while len(have) < len(shape):
        have = [1] + have
        steps.append(("expand", list(have)))
    if have != shape:
        steps.append(("broadcast", shape))
    return tuple(steps)


def _binary_checks_memoized(orig):
    """Every binary op of an interpreted kernel (`+`, `*`, `<`, `&`, ...) goes through Triton's
    type checks: the computation type by the promotion rules, a cast of each side, then a
    broadcast worked out dimension by dimension on Triton tuples: half of an engine process's
    interpreting by a profile, for decisions that depend on the operands' types alone. They are
    made once per pair of types (and flags) by Triton itself; later ops of the pair replay the
    casts and builder calls Triton made. A Python number's own checks (negative into an
    unsigned type, out of range) run per value, through Triton's own code; an op Triton rejects
    is never memoized, so it raises as before."""
    import numbers

    from triton.language import core
    Number, Tensor, BlockType = numbers.Number, core.tensor, core.block_type
    classes = (core.dtype, core.pointer_type, core.block_type)
    memo: dict = {}

    def impl(self, lhs, rhs, allow_lhs_ptr=False, allow_rhs_ptr=False, arithmetic_check=True,
             div_or_mod=False):
        lk = _operand_kind(self, lhs, Number, Tensor, classes)
        rk = lk and _operand_kind(self, rhs, Number, Tensor, classes)
        if rk is None:
            return orig(self, lhs, rhs, allow_lhs_ptr, allow_rhs_ptr, arithmetic_check,
                        div_or_mod)
        key = (lk, rk, allow_lhs_ptr, allow_rhs_ptr, arithmetic_check, div_or_mod)
        plan = memo.get(key)
        if plan is None:
            out = orig(self, lhs, rhs, allow_lhs_ptr, allow_rhs_ptr, arithmetic_check,
                       div_or_mod)
            if len(memo) >= 4096:
                memo.clear()
            memo[key] = _binary_plan(self, (lhs, rhs), out, arithmetic_check, Number)
            return out
        ret, sides = plan
        return tuple(_replay_side(self, v, ret, cast, steps, Number, BlockType)
                     for v, (cast, steps) in zip((lhs, rhs), sides))
    return impl


def _binary_plan(sem, operands, out, arithmetic_check: bool, Number):
    """(the computation type or None, per side (whether it is cast, its broadcast steps))."""
    kinds = [sem.to_tensor_type(v) if isinstance(v, Number) else v.type for v in operands]
    if arithmetic_check and not kinds[0].scalar.is_ptr() and not kinds[1].scalar.is_ptr():
        ret = out[0].type.scalar
    else:
        ret = None
    sides = []
    for v, ty, after in zip(operands, kinds, out):
        cast = ret is not None and (isinstance(v, Number) or ty.scalar != ret)
        before = ty if not cast else (ty.with_element_ty(ret) if ty.is_block() else ret)
        sides.append((cast, _broadcast_steps(before, after.type)))
    return ret, tuple(sides)


def _replay_side(sem, v, ret, cast, steps, Number, BlockType):
    if ret is None:
        v = sem.to_tensor(v)
    elif cast:
        v = sem._cast_to_computation_type(v, ret)      # a number's range checks, per value
    for what, shape in steps:
        ty = BlockType(v.type.scalar, shape)
        if what == "splat":
            handle = sem.builder.create_splat(ty.to_ir(sem.builder), v.handle)
        elif what == "expand":
            handle = sem.builder.create_expand_dims(v.handle, 0)
        else:
            handle = sem.builder.create_broadcast(v.handle, shape)
        v = sem.make_tensor(handle, ty)
    return v


def _memoized_inits_agree(core, block_init, tensor_init) -> bool:
    """Whether the memoized constructors make what Triton's make, on this Triton (a release
    whose constructors set other attributes keeps its own)."""
    def state(obj):
        return {k: dict(v.__dict__) if type(v) is core.tuple else v
                for k, v in obj.__dict__.items()}
    try:
        for elt, dims in ((core.float32, [4, 8]), (core.int32, [4, 8]),
                          (core.pointer_type(core.float16), [16]), (core.int64, [16])):
            for _ in range(2):                    # a miss, then a hit
                want, got = object.__new__(core.block_type), object.__new__(core.block_type)
                core.block_type.__dict__["__init__"](want, elt, list(dims))
                block_init(got, elt, list(dims))
                if state(want) != state(got):
                    return False
                for ty in (want, elt):
                    a, b = object.__new__(core.tensor), object.__new__(core.tensor)
                    core.tensor.__dict__["__init__"](a, "handle", ty)
                    tensor_init(b, "handle", ty)
                    if state(a) != state(b):
                        return False
        return True
    except Exception:          # noqa: BLE001 - another Triton: its own constructors
        return False


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
            from triton.runtime.interpreter import InterpreterBuilder
            self._patch(autotuner.Autotuner, "_bench", lambda orig: _no_benchmark)
            for name, kind in _MEMORY_OPS.items():
                self._patch(InterpreterBuilder, name, lambda orig, kind=kind: _logged(orig, kind))
            if BUILTINS_ONCE:
                from triton.runtime import interpreter
                if callable(interpreter.__dict__.get("_patch_builtin")) and \
                        callable(interpreter.__dict__.get("_patch_attr")):
                    self._patch(interpreter, "_patch_builtin", _builtins_scanned_once)
            if OVERFLOW_CHECKS_AS_COMPILED:
                self._overflow_checks_as_compiled()
            from triton.runtime import interpreter
            if LANGUAGE_ONCE_PER_LAUNCH and callable(interpreter.__dict__.get("_patch_lang")) \
                    and isinstance(interpreter.__dict__.get("_LangPatchScope"), type):
                self._patch(interpreter, "_patch_lang",
                            lambda orig: _language_once_per_launch(orig, self._tls))
            if DTYPES_MEMOIZED and callable(interpreter.__dict__.get("_get_np_dtype")):
                self._patch(interpreter, "_get_np_dtype", _dtypes_memoized)
            if TYPES_MEMOIZED:
                self._memoize_types()
            if BINARY_CHECKS_MEMOIZED:
                self._memoize_binary_checks()

    def _memoize_types(self) -> None:
        from triton.language import core
        block_init = _block_types_memoized(core.block_type.__dict__["__init__"])
        tensor_init = _tensor_shapes_memoized(core.tensor.__dict__["__init__"])
        if _memoized_inits_agree(core, block_init, tensor_init):
            self._patch(core.block_type, "__init__", lambda orig: block_init)
            self._patch(core.tensor, "__init__", lambda orig: tensor_init)

    def _memoize_binary_checks(self) -> None:
        try:
            from triton.language.semantic import TritonSemantic
            found = callable(TritonSemantic.__dict__.get("binary_op_type_checking_impl"))
        except Exception:          # another Triton's interpreter: keep its behaviour
            return
        if found:
            self._patch(TritonSemantic, "binary_op_type_checking_impl", _binary_checks_memoized)

    def _overflow_checks_as_compiled(self) -> None:
        """Triton's integer-overflow check computes each `+`, `-`, `*` again in int64, then
        hands the result to `device_assert`, which drops it unless the kernel is compiled with
        `debug`: on a GPU the unused check is dead code the compiler removes. The interpreter
        has no `debug` but computes each check, about a third of an interpreted attention
        kernel's time for a value nobody reads; without `debug` it now skips them."""
        try:
            from triton.runtime.interpreter import interpreter_builder as builder
            opts = builder.options
            if opts.debug or not opts.sanitize_overflow:
                return
            builder.options = dataclasses.replace(opts, sanitize_overflow=False)
        except Exception:          # another Triton's interpreter: keep its behaviour
            return
        self._undo.append(lambda: setattr(builder, "options", opts))

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
        fn = kernel_function(kernel)
        if self.interpret and not self.backend.sink.check_events:
            # a run for its values only (a scenario's reference): no footprints to log
            return self.launcher.launch(getattr(fn, "__name__", "triton"), (), (),
                                        lambda: self._values_only(fn, args, grid, kwargs))
        acc = analyze(kernel, launch_consts(fn, args, kwargs))
        if self.interpret:
            return self._launch_measured(acc, fn, args, grid, kwargs)
        reads, writes, unknown = launch_args(acc, fn, args, kwargs)
        approx = self.launcher.footprints(
            unknown, f"Triton kernel {acc.name}: {acc.reason or 'use not followed'}; whole tensor "
                     "read and written") if unknown else ()
        # On a GPU the kernel's offsets are runtime values: each footprint is the whole tensor
        # argument, which a finding must say (sim's interpreter gives the bytes themselves).
        opaque = {id(t) for t in unknown}
        whole = f"Triton kernel {acc.name} on a GPU: its whole tensor argument (offsets are " \
                "runtime values; sim gives the exact bytes)"
        approx_reads = self.launcher.footprints(
            [t for t in reads if id(t) not in opaque], whole) + approx
        approx_writes = self.launcher.footprints(
            [t for t in writes if id(t) not in opaque], whole) + approx
        if acc.indirect:
            self.launcher.coverage.note(f"{acc.name} (Triton: pointers loaded from memory)",
                                        _site())

        def run():
            self._tls.inside = True
            try:
                return orig(kernel, *args, grid=grid, warmup=False, **kwargs)
            finally:
                self._tls.inside = False
        return self.launcher.launch(acc.name, (), (), run, approx_reads=approx_reads,
                                    approx_writes=approx_writes)

    def _launch_measured(self, acc, fn, args, grid, kwargs):
        """sim: the interpreter says which bytes the kernel touched; whole tensors from the
        source analysis stand in for a graph capture (a replay may touch other bytes)."""
        launcher = self.launcher
        reg = self.backend.footprints.registry
        spans = []
        for t in _tensors_of(args, kwargs):
            f = self.backend.footprints.of(t)     # registered at issue, in host order
            if f is not None:
                st = t.untyped_storage()
                spans.append((st.data_ptr(), st.nbytes(), f.storage, f.host))

        def run():
            return self._replayed_or_interpreted(fn, args, grid, kwargs, acc.indirect, spans, reg)

        def whole():
            reads, writes, unknown = launch_args(acc, fn, args, kwargs)
            why = f"Triton kernel {acc.name} in a captured graph: whole tensors"
            r = launcher.footprints(list(reads) + list(unknown), why)
            w = launcher.footprints(list(writes) + list(unknown), why)
            return r, w
        keep = reg.live_storages if acc.indirect else None
        return launcher.launch_measured(acc.name, run, whole, keep=keep)

    def _values_only(self, fn, args, grid, kwargs):
        """A launch whose footprints nobody reads."""
        indirect = analyze(fn, launch_consts(fn, args, kwargs)).indirect
        self._replayed_or_interpreted(fn, args, grid, kwargs, indirect)

    def _replayed_or_interpreted(self, fn, args, grid, kwargs, indirect, spans=None,
                                 registry=None):
        """Replay the record of a launch that loaded these bytes, else interpret the launch and
        record it for the next one. With a `registry` (a checked launch) the footprints are
        returned; without, the launch is run for its values only (its record carries none)."""
        checked = registry is not None
        layout = bufs = None
        if LAUNCHES_REPLAYED and not indirect:
            layout, bufs, rec = _replay_lookup(fn, grid, args, kwargs,
                                               spans if checked else None)
            if rec is not None:
                return rec.replay(bufs, spans, Footprint) if checked else rec.replay(bufs)
        recorder = launch_cache.Recorder(layout, bufs) if layout is not None else None
        if not checked and recorder is None:
            return self._interpret(fn, args, grid, kwargs)
        log = _AccessLog(recorder)
        _log_tls.log = log
        try:
            self._interpret(fn, args, grid, kwargs)
        finally:
            _log_tls.log = None
        fps = log.footprints(spans, registry) if checked else None
        if recorder is not None:
            _keep_record(layout, recorder, fps, spans or ())
        return fps

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
        self._tls.langs = _STARTING
        JIT.__call__ = device_call
        try:
            with _disable_current_modes():
                return interp.run(*args, grid=grid, warmup=False, **kwargs)
        finally:
            JIT.__call__ = prev_call
            self._tls.inside = False
            self._tls.langs = None

    def _interpreted_fn(self, fn):
        f = self._interpreted.get(fn)
        if f is None:
            f = self._interpreted[fn] = self._InterpretedFunction(fn)
        return f


_MEMORY_OPS = {"create_masked_load": "r", "create_masked_store": "w", "create_atomic_rmw": "rw",
               "create_atomic_cas": "rw"}
_log_tls = threading.local()


def _logged(orig, kind):
    """An interpreter memory op that notes the addresses it touches (masked-off lanes excluded)."""
    def op(builder, *args, **kwargs):
        log = getattr(_log_tls, "log", None)
        if log is not None:
            if orig.__name__ == "create_atomic_rmw":
                ptrs, mask = args[1], args[3]
            elif orig.__name__ == "create_atomic_cas":
                ptrs, mask = args[0], None
            elif orig.__name__ == "create_masked_store":
                ptrs, mask = args[0], args[2]
            else:
                ptrs, mask = args[0], args[1]
            log.note(kind, ptrs, mask)
        return orig(builder, *args, **kwargs)
    op.__wrapped__ = orig
    op.__name__ = orig.__name__
    return op


class _AccessLog:
    """Addresses one interpreted launch loaded and stored, turned into exact footprints."""

    def __init__(self, recorder=None):
        self.parts = {"r": [], "w": []}
        self.recorder = recorder           # launch_cache.Recorder: the bytes themselves

    def note(self, kind, ptrs, mask) -> None:
        import numpy as np
        el = max(1, ptrs.get_element_ty().primitive_bitwidth // 8)
        addrs = ptrs.data.reshape(-1)
        if mask is not None:
            m = np.broadcast_to(mask.data, ptrs.data.shape).reshape(-1).astype(bool)
            addrs = addrs[m]
        if addrs.size == 0:
            return
        addrs = addrs.astype(np.uint64)
        for k in kind:
            self.parts[k].append((addrs, el))
        if self.recorder is not None:
            try:
                self.recorder.note(kind, addrs, el)
            except Exception:      # noqa: BLE001 - a record is optional; the launch goes on
                self.recorder.outside = True

    def footprints(self, spans, registry) -> tuple:
        return self._map("r", spans, registry), self._map("w", spans, registry)

    def _map(self, kind, spans, registry) -> tuple:
        import numpy as np
        parts = self.parts[kind]
        if not parts:
            return ()
        starts = np.concatenate([a for a, _ in parts])
        ends = np.concatenate([a + np.uint64(el) for a, el in parts])
        out = []
        left = np.arange(starts.size)
        for pool in (spans, None):
            if left.size == 0:
                break
            if pool is None:           # pointers not passed as arguments (tables of data_ptr()s)
                pool = registry.live_spans()
            pool = list(pool)
            where = StorageSpans([p[0] for p in pool], [p[1] for p in pool]).locate(starts[left])
            for i in np.unique(where[where >= 0]):       # in the pool's order
                m = left[where == i]
                base, _nbytes, sid, host = pool[i]
                ranges = _merge_ranges(starts[m] - np.uint64(base), ends[m] - np.uint64(base))
                out.append(Footprint(sid, ranges, host))
            left = left[where < 0]
        return tuple(out)


def _merge_ranges(starts, ends) -> tuple:
    import numpy as np
    order = np.argsort(starts, kind="stable")
    s = starts[order].astype(np.int64)
    e = np.maximum.accumulate(ends[order].astype(np.int64))
    breaks = np.nonzero(s[1:] > e[:-1])[0] + 1
    firsts = np.concatenate(([0], breaks))
    lasts = np.concatenate((breaks - 1, [s.size - 1]))
    return tuple((int(s[a]), int(e[b])) for a, b in zip(firsts, lasts))


def _replay_lookup(fn, grid, args, kwargs, spans=None) -> tuple:
    """(layout, its byte views, the matching record or None); (None, None, None) where the
    launch cannot be replayed. `spans`: the launch's footprint spans, where it wants
    footprints."""
    cache = launch_cache.CACHE
    try:
        layout = launch_cache.Layout(fn, grid, args, kwargs)
        hash(layout.key)
        bufs = layout.buffers()
        rec = cache.find(layout, bufs, spans)
    except Exception:          # noqa: BLE001 - Uncacheable, an unhashable value: interpreted
        cache.skipped += 1
        return None, None, None
    if rec is None:
        cache.misses += 1
    else:
        cache.hits += 1
    return layout, bufs, rec


def _keep_record(layout, recorder, footprints=None, spans=()) -> None:
    try:
        rec = recorder.record(footprints, spans)
        if rec is not None:
            launch_cache.CACHE.keep(layout, rec)
    except Exception:          # noqa: BLE001 - a record is optional; the launch has run
        pass


def _tensors_of(args, kwargs):
    seen = set()
    for v in list(args) + list(kwargs.values()):
        for t in _tensors(v):
            if id(t) not in seen:
                seen.add(id(t))
                yield t


def _site() -> str:
    from .stacks import site
    return site(skip=4)


def _no_benchmark(*args, **kwargs):
    """Autotuning on sim: every config times the same, so the first one is chosen (benchmarking
    would run CPU work many times and synchronize the device)."""
    return [0.0, 0.0, 0.0]
