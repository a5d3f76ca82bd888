"""Instrumentation: turns a running program's ops and synchronization calls into trace events.

Knows nothing of rules or findings. One backend per device kind: `sim` (virtual streams over CPU
tensors), `cuda` (NVIDIA and ROCm), `npu` (Ascend through torch_npu).
"""
from __future__ import annotations


def make_backend(session, device: str, *, executor=None, device_module=None, **options):
    if device == "sim":
        from .sim import SimBackend
        return SimBackend(session, executor=executor, **options)
    if device == "cuda":
        from .cuda import CudaBackend
        return CudaBackend(session, **options)
    if device == "npu":
        from .npu import NpuBackend
        return NpuBackend(session, device_module=device_module, **options)
    raise ValueError(f"unknown device {device!r}")
