"""Host/device transfer helpers written the way the engine writes them.

On `sim` device tensors are CPU tensors, so a non-blocking D2H must be a copy into a pinned
buffer (`.to("cpu")` of a CPU tensor is a no-op); the same code is what runs on a GPU.
"""
from __future__ import annotations

import torch


def pinned_empty(ctx, shape, dtype) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype, pin_memory=ctx.pin)


def pinned_tensor(ctx, values, dtype) -> torch.Tensor:
    t = torch.tensor(values, dtype=dtype)
    return t.pin_memory() if ctx.pin else t


def h2d(ctx, values, dtype=torch.int64) -> torch.Tensor:
    """`torch.tensor(values, pin_memory=True).to(device, non_blocking=True)` on the current stream."""
    src = pinned_tensor(ctx, values, dtype)
    dst = torch.empty(src.shape, dtype=dtype, device=ctx.device)
    dst.copy_(src, non_blocking=True)
    return dst


def d2h(ctx, t: torch.Tensor) -> torch.Tensor:
    """`t.to("cpu", non_blocking=True)`: an async copy into a fresh pinned buffer."""
    out = pinned_empty(ctx, t.shape, t.dtype)
    out.copy_(t, non_blocking=True)
    return out


def record_stream_each(ctx, tensors, stream) -> None:
    """`spec_utils.record_stream_each`: tell the caching allocator `stream` uses these tensors."""
    if getattr(ctx.dm, "serial", False):
        return
    for t in tensors:
        if isinstance(t, torch.Tensor):
            t.record_stream(stream)


def new_graph(dm):
    """`torch.cuda.CUDAGraph()`, or `torch.npu.NPUGraph()` on Ascend (what NPUGraphRunner captures)."""
    cls = getattr(dm, "CUDAGraph", None) or getattr(dm, "NPUGraph")
    return cls()
