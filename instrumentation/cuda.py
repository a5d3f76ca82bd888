"""The `cuda` backend: NVIDIA GPUs, and AMD GPUs under ROCm (where `torch.cuda` is HIP).

Everything is `DeviceBackend` (instrumentation/device.py) over `torch.cuda` and its trace registry
`torch.cuda._gpu_trace`; this module only names them and picks how synchronization is observed.

By default the device module's wrappers alone (`callbacks=False`): every `torch.cuda` Stream,
Event, graph and synchronize call goes through Python methods racecheck wraps, while torch's GPU
trace, once activated, stays on for the process and sends every caching-allocator malloc and
free through Python (2.3-2.7x on a launch-bound loop by itself). The trace callbacks are used
when synchronization happens in C++ where no wrapper sees it: an initialized process group
(NCCL streams and events), or `callbacks=True` (extensions that record or wait on events
themselves, `torch.Event`/`torch.Stream` instead of `torch.cuda`'s classes).
"""
from __future__ import annotations

import torch

from racecheck.core.errors import UsageError

from .device import DeviceBackend

__all__ = ["CudaBackend"]


class CudaBackend(DeviceBackend):
    """`torch.cuda` on NVIDIA (CUDA) and AMD (ROCm/HIP) GPUs."""

    name = "cuda"
    device_type = "cuda"
    stream_handle_attr = "cuda_stream"
    event_handle_attr = "cuda_event"
    graph_class_name = "CUDAGraph"

    def __init__(self, sink, device_module=None, callbacks=None, **options):
        if not torch.cuda.is_available():
            raise UsageError("device='cuda' needs a CUDA or ROCm GPU (torch.cuda.is_available() is False)")
        torch.cuda.init()
        module = device_module if device_module is not None else torch.cuda
        from torch.cuda import _gpu_trace
        get_cur = getattr(torch._C, "_cuda_getCurrentStream", None)
        if callbacks is None:
            callbacks = _collectives_initialized()
        super().__init__(sink, module, trace=_gpu_trace, trace_style="gpu",
                         trace_activate=torch._C._activate_gpu_trace,
                         current_ids=get_cur, callbacks=callbacks)

    def _current_device(self) -> int:
        return torch._C._cuda_getDevice()


def _collectives_initialized() -> bool:
    """A process group synchronizes its streams in C++: only the runtime's trace sees that."""
    dist = getattr(torch, "distributed", None)
    try:
        return bool(dist is not None and dist.is_available() and dist.is_initialized())
    except Exception:
        return False
