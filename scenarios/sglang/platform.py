"""Platform flavours: make a CPU run take the branches sglang takes on CUDA, ROCm (HIP) or Ascend.

sglang decides its platform once, at import (`_is_cuda = is_cuda()` module globals), and at run
time through `tensor.is_cuda`, `current_platform.capabilities` and the scheduler's WAR-barrier
switch. On a CPU runner all of them say "not CUDA"; a flavour sets them for one run and restores
them afterwards. The flags are listed, per module, in `surface.PLATFORM_FLAGS`; a release that
lacks one of those modules or flags has no such branch, so it is skipped.

cuda  the fused Triton paths, FutureMap's pinned seq_lens mirror on a private stream,
      `record_stream` of cross-stream tensors, and the WAR barrier after every forward
      (`is_cuda()` in the scheduler; here through its switch SGLANG_ENABLE_WAR_BARRIER).
hip   the ROCm branches (`publish_ready.synchronize()` in `resolve_seq_lens_cpu`, lengths
      resolved inside the forward stream, synchronous result copies) and no WAR barrier.
npu   the Ascend branches of the speculative worker (mrope recompute after the plan-stream join,
      metadata ready only for graph replays, graph runners keep their own input buffers), no
      WAR barrier; Ascend tensors are not `is_cuda`. Where Ascend calls an op of its own (the
      verify's cache locations before 0.5.22, the greedy verify before 0.5.15), the kernel
      with the same inputs and outputs runs. On 0.5.12-0.5.15 the mrope recompute is gated on
      eagle_worker_v2's own flag, which there and later also picks Ascend's graph runners: it
      is set with graphs off only (`surface.PLATFORM_FLAGS_EAGER`).

Kernels sglang implements only as CUDA C++ (tree build, greedy verify) run as the Triton
versions sglang ships for XPU, on every flavour: same inputs, same outputs. Releases that ship no
Triton version (before 0.5.15) get racecheck's torch stand-ins instead (tree_ops.py).
"""
from __future__ import annotations

import contextlib
import importlib
import sys
import types

from . import surface
from .server import patched

FLAVOURS = ("cuda", "hip", "npu")
WAR_BARRIER = {"cuda": True, "hip": False, "npu": False}


def _module(name: str):
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


@contextlib.contextmanager
def flavour(name: str, graphs: bool = True):
    """Apply flavour `name` for a block (sglang imported, the scheduler not yet built); yields
    the names it set. `graphs`: the engine captures graphs (flags that would pick a platform's
    own graph runners stay unset then)."""
    if name not in FLAVOURS:
        raise ValueError(f"unknown platform flavour {name!r} (choose from {', '.join(FLAVOURS)})")
    applied = []
    flag_tables = [surface.PLATFORM_FLAGS[name]]
    if not graphs:
        flag_tables.append(surface.PLATFORM_FLAGS_EAGER.get(name, {}))
    with contextlib.ExitStack() as stack:
        for modname, flags in (item for table in flag_tables for item in table.items()):
            mod = _module(modname)
            for flag in flags:
                if mod is not None and flag in vars(mod):
                    stack.enter_context(patched(mod, flag, True))
                    applied.append(f"{modname}.{flag}")
        for modname, calls in surface.PLATFORM_CALLS.get(name, {}).items():
            mod = _module(modname)
            for call in calls:
                if mod is not None and call in vars(mod):
                    stack.enter_context(patched(mod, call, lambda: True))
                    applied.append(f"{modname}.{call}()")
        triton_tree = False
        for touch in surface.TRITON_TREE:
            if touch.exists():
                owner, flag = touch.owner_and_name()
                stack.enter_context(patched(owner, flag, True))
                applied.append(touch.target)
                triton_tree = True
        if not triton_tree:
            stack.enter_context(_tree_build_stand_in(applied))
            if name == "npu":
                stack.enter_context(_cuda_greedy_verify_on_npu(applied))
        stack.enter_context(_greedy_verify_in_triton(applied))
        if surface.CAPABILITIES.exists() and surface.CAPABILITIES_TYPE.exists():
            owner, attr = surface.CAPABILITIES.owner_and_name()
            Caps = surface.CAPABILITIES_TYPE.get()
            stack.enter_context(patched(owner, attr, Caps(
                supports_triton=True, graph_capture=True, piecewise_graph=True)))
            applied.append(surface.CAPABILITIES.target)
        if name == "npu":
            import torch
            stack.enter_context(patched(torch.Tensor, "is_cuda", property(lambda t: False)))
            stack.enter_context(_call_time_npu_probes(applied))
        yield applied


@contextlib.contextmanager
def _call_time_npu_probes(applied: list):
    """The functions of `surface.NPU_CALL_TIME_PROBES` that import `is_npu` when they run see
    True for the length of their call; every other caller keeps its own answer (a module
    imported later must not bind a patched probe)."""
    with contextlib.ExitStack() as stack:
        for touch in surface.NPU_CALL_TIME_PROBES:
            if not touch.exists():
                continue
            owner, attr = touch.owner_and_name()
            fn = vars(owner).get(attr)
            code = getattr(fn, "__code__", None)
            if code is None or surface.CALL_TIME_PROBE_MODULE not in code.co_names or \
                    "is_npu" not in code.co_names:
                continue
            stack.enter_context(patched(owner, attr, _probing_npu(fn)))
            applied.append(f"{touch.target}: is_npu() while it runs")
        yield


def _probing_npu(fn):
    import functools
    common = importlib.import_module(surface.CALL_TIME_PROBE_MODULE)

    @functools.wraps(fn)
    def on_npu(*args, **kwargs):
        with patched(common, "is_npu", lambda: True):
            return fn(*args, **kwargs)
    return on_npu


@contextlib.contextmanager
def _cuda_greedy_verify_on_npu(applied: list):
    """Before 0.5.15 sglang's greedy verify has a CUDA branch (sgl_kernel's op) and an Ascend one
    (sgl_kernel_npu's), no Triton one: on the npu flavour the CUDA branch runs, with racecheck's
    stand-in for that op (`_greedy_verify_stand_in`), the same inputs and outputs as Ascend's."""
    if not surface.NPU_GREEDY_VERIFY_BRANCH.exists():
        yield
        return
    owner, flag = surface.NPU_GREEDY_VERIFY_BRANCH.owner_and_name()
    with patched(owner, flag, True):
        applied.append(surface.NPU_GREEDY_VERIFY_BRANCH.target)
        yield


@contextlib.contextmanager
def _greedy_verify_in_triton(applied: list):
    """Releases whose CUDA branch of greedy verify imports a C++ op (`verify_tree_greedy` from
    sgl_kernel or sglang's JIT kernels) get sglang's own Triton version under that name."""
    eagle_utils = _module("sglang.srt.speculative.eagle_utils")
    if eagle_utils is None or "_is_cuda" not in vars(eagle_utils):
        yield
        return
    if not surface.VERIFY_GREEDY_TRITON.exists():
        with _greedy_verify_stand_in(applied):
            yield
        return
    triton_verify = surface.VERIFY_GREEDY_TRITON.get()

    def verify_tree_greedy(**kw):
        return triton_verify(**{k.replace("retrive_", "retrieve_"): v for k, v in kw.items()})
    with contextlib.ExitStack() as stack:
        for modname in ("sglang.kernels.ops.speculative.tree", "sgl_kernel"):
            mod = sys.modules.get(modname) or _module(modname)
            if mod is None:
                mod = types.ModuleType(modname)
                stack.enter_context(_in_sys_modules(modname, mod))
            stack.enter_context(patched(mod, "verify_tree_greedy", verify_tree_greedy))
            applied.append(f"{modname}.verify_tree_greedy -> Triton")
        yield


@contextlib.contextmanager
def _tree_build_stand_in(applied: list):
    """A release without sglang's Triton tree build (before 0.5.15) calls sgl_kernel's CUDA op
    under the name `sgl_build_tree_kernel_efficient`, bound only when the module was imported
    on CUDA/HIP: racecheck's torch stand-in (tree_ops.py), a declared kernel, is bound there."""
    if not surface.NATIVE_TREE_BUILD.exists():
        yield
        return
    from . import tree_ops
    owner, _name = surface.NATIVE_TREE_BUILD.owner_and_name()
    with patched(owner, "sgl_build_tree_kernel_efficient", tree_ops.build_tree_kernel_efficient):
        applied.append(f"{owner.__name__}.sgl_build_tree_kernel_efficient -> racecheck torch "
                       "stand-in")
        yield


@contextlib.contextmanager
def _greedy_verify_stand_in(applied: list):
    """A release without sglang's Triton greedy verify (before 0.5.15) imports sgl_kernel's
    `verify_tree_greedy` when it verifies on CUDA/HIP: racecheck's torch stand-in
    (tree_ops.py), a declared kernel, is that name."""
    if not surface.NATIVE_GREEDY_VERIFY.exists():
        yield
        return
    from . import tree_ops
    with contextlib.ExitStack() as stack:
        mod = sys.modules.get("sgl_kernel") or _module("sgl_kernel")
        if mod is None:
            mod = types.ModuleType("sgl_kernel")
            stack.enter_context(_in_sys_modules("sgl_kernel", mod))
        stack.enter_context(patched(mod, "verify_tree_greedy", tree_ops.verify_tree_greedy))
        applied.append("sgl_kernel.verify_tree_greedy -> racecheck torch stand-in")
        yield


@contextlib.contextmanager
def _in_sys_modules(name: str, mod):
    sys.modules[name] = mod
    try:
        yield
    finally:
        sys.modules.pop(name, None)
