"""Instrumentation: turns a running program's ops and synchronization calls into trace events.

Knows nothing of rules or findings. One backend per device kind (`base.Backend`): `sim` (virtual
streams over CPU tensors), `cuda` (NVIDIA and ROCm), `npu` (Ascend through torch_npu). Events go
to a `base.Sink` (the session's recorder).
"""
from __future__ import annotations


def make_backend(sink, device: str, *, executor=None, device_module=None, **options):
    if options.get("drop_sync") and device != "sim":
        from racecheck.core.errors import UsageError
        raise UsageError("dropping synchronization sites (drop_sync) is supported on sim")
    options.pop("drop_sync", None) if device != "sim" else None
    if device == "sim":
        from .sim import SimBackend
        return SimBackend(sink, executor=executor, **options)
    if device == "cuda":
        from .cuda import CudaBackend
        return CudaBackend(sink, device_module=device_module, **options)
    if device == "npu":
        from .npu import NpuBackend
        return NpuBackend(sink, device_module=device_module, **options)
    raise ValueError(f"unknown device {device!r}")


def install_session(backend, *, route_cuda: bool = False) -> list:
    """Start observing the program: tensor-method patches, the dispatch mode on this thread and on
    threads started later, the backend's own hooks and, on sim, torch.cuda routing. Returns the
    undo steps, to be run in reverse order."""
    import sys
    import threading

    from . import current
    from .interceptor import Interceptor
    from .patches import install_patches

    undo = []
    if route_cuda:
        from .routing import route_cuda_to
        undo.extend(route_cuda_to(backend))
    undo.extend(install_patches(backend))
    mode = Interceptor(backend)
    mode.__enter__()
    undo.append(lambda: mode.__exit__(None, None, None))
    prev_profile = threading.getprofile() if hasattr(threading, "getprofile") else None
    sink = backend.sink

    def thread_start(frame, event, arg):
        """First call in a thread started inside the session: put the interceptor on its stack."""
        sys.setprofile(None)
        if sink.checking and backend.installed:
            Interceptor(backend).__enter__()

    threading.setprofile(thread_start)
    undo.append(lambda: threading.setprofile(prev_profile))
    backend.install()
    backend.installed = True
    current.set_backend(backend)
    from .names import HolderNames
    sink.set_namer(HolderNames(backend.footprints.registry, moment=lambda: sink.position))
    undo.append(lambda: sink.set_namer(None))
    from .triton_kernels import TritonHook
    triton = TritonHook(backend)
    backend.kernels.install()
    undo.append(backend.kernels.uninstall)
    triton.install()
    undo.append(triton.uninstall)

    def uninstall():
        backend.installed = False
        current.set_backend(None)
        backend.uninstall()
    undo.append(uninstall)
    return undo
