"""Platform flavours: make a CPU run take the branches sglang takes on CUDA, ROCm (HIP) or Ascend.

sglang decides its platform once, at import (`_is_cuda = is_cuda()` module globals), and at run
time through `tensor.is_cuda`, `current_platform.capabilities` and the scheduler's WAR-barrier
switch. On a CPU runner all of them say "not CUDA"; a flavour sets them for one run and restores
them afterwards. What each flavour changes on the speculative decode path:

cuda  the fused Triton paths (draft cache locations with positions, chain-tree build, verify
      commit, draft-extend layout), FutureMap's pinned seq_lens mirror on a private stream,
      `record_stream` of cross-stream tensors, the WAR barrier after every forward.
hip   the ROCm branches: `publish_ready.synchronize()` instead of a stream wait in
      `resolve_seq_lens_cpu`, GPU-only lengths resolved inside the forward stream
      (`stream_ordered=True`), synchronous result copies, and no WAR barrier (its default
      on ROCm: SGLANG_ENABLE_WAR_BARRIER unset).
npu   the Ascend branches of the speculative worker: mrope positions recomputed on the forward
      stream after the plan-stream join, metadata marked ready only for graph replays, graph
      runners keep their own input buffers (no process-wide sharing), no WAR barrier; Ascend
      tensors are not `is_cuda`, so the fused Triton paths are not taken.

Kernels sglang implements only as CUDA C++ (tvm-ffi: tree build, greedy verify) run as the
Triton versions sglang ships for XPU, on every flavour: same inputs, same outputs.
"""
from __future__ import annotations

import contextlib

import torch

from .environment import Engine, patched

FLAVOURS = ("cuda", "hip", "npu")

# module key -> flag names set True, per flavour (module globals read at call time)
_FLAGS = {
    "cuda": {
        "eagle_worker_v2": ("_is_cuda",), "eagle_utils": ("_is_cuda",),
        "spec_utils": ("_is_cuda",), "overlap_utils": ("_is_cuda",),
        "cache_locs": ("_is_cuda",), "allocation": ("_is_cuda",),
    },
    "hip": {
        "eagle_worker_v2": ("_is_hip",), "eagle_utils": ("_is_hip",),
        "spec_utils": ("_is_hip",), "overlap_utils": ("_is_hip",), "scheduler": ("_is_hip",),
        "forward_batch_info": ("_is_hip",), "cache_locs": ("_is_hip",),
        "allocation": ("_is_hip",),
    },
    "npu": {
        "eagle_worker_common": ("_is_npu",),
    },
}
# runtime probes called by name on the decode path
_CALLS = {
    "hip": {"forward_batch_info": ("is_hip",)},
    "npu": {"eagle_worker_common": ("is_npu",), "input_buffers": ("is_npu",)},
}
WAR_BARRIER = {"cuda": True, "hip": False, "npu": False}


@contextlib.contextmanager
def flavour(engine: Engine, name: str):
    """Apply flavour `name` for a block (sglang is imported; FutureMap not yet constructed)."""
    if name not in FLAVOURS:
        raise ValueError(f"unknown platform flavour {name!r} (choose from {', '.join(FLAVOURS)})")
    engine.MODULES.setdefault("allocation", "sglang.srt.mem_cache.allocation")
    with contextlib.ExitStack() as stack:
        for key, flags in _FLAGS[name].items():
            mod = engine.module(key)
            for flag in flags:
                engine.need(key, flag)
                stack.enter_context(patched(mod, flag, True))
        for key, calls in _CALLS.get(name, {}).items():
            mod = engine.module(key)
            for call in calls:
                engine.need(key, call)
                stack.enter_context(patched(mod, call, lambda: True))
        spec_tree = engine.module("spec_tree")
        engine.need("spec_tree", "_is_xpu")
        stack.enter_context(patched(spec_tree, "_is_xpu", True))     # Triton tree kernels
        platform = engine.need("platforms", "current_platform")
        Caps = engine.need("platform_interface", "PlatformCapabilities")
        stack.enter_context(patched(platform, "capabilities",
                                    Caps(supports_triton=True, graph_capture=True,
                                         piecewise_graph=True)))
        if name == "npu":
            stack.enter_context(patched(torch.Tensor, "is_cuda", property(lambda t: False)))
        yield WAR_BARRIER[name]
