"""The `npu` backend: Ascend NPUs through torch_npu's `torch.npu` module.

The same code as the `cuda` backend (`DeviceBackend`) with torch_npu's names: `npu_stream` /
`npu_event` handles, `NPUGraph`, `torch_npu._C._npu_getCurrentStream`, and torch_npu's own trace
registry `torch_npu.utils._npu_trace` (`register_callback_for_npu_*(cb, name)`, activated with
`torch_npu._C._activate_npu_trace`), which core PyTorch's `torch.<device>._gpu_trace` lookup does
not find. Where a torch_npu build has no such registry, or `callbacks=False` is passed (torch_npu's
task queue may fire runtime callbacks from its launch thread, out of the program's order), thin
wrappers of `Event.record/wait/synchronize`, `Stream.synchronize` and `torch.npu.synchronize`
report the same edges from the calling thread.

`racecheck.session(device="npu", device_module=m)` runs against any module with torch_npu's API
surface: in CI, the stand-in `racecheck.instrumentation.npu_standin` (device type "npu" emulated
over CPU tensors), on Ascend runners the real `torch.npu`. Delays use `torch_npu.npu._sleep`
(CANN's aclnnSleep) where present, a calibrated busy kernel otherwise.
"""
from __future__ import annotations

import importlib

import torch

from racecheck.core.errors import UsageError

from .device import DeviceBackend

__all__ = ["NpuBackend"]


def _import(name):
    try:
        return importlib.import_module(name)
    except Exception:
        return None


class NpuBackend(DeviceBackend):
    name = "npu"
    device_type = "npu"
    stream_handle_attr = "npu_stream"
    event_handle_attr = "npu_event"
    graph_class_name = "NPUGraph"

    def __init__(self, sink, device_module=None, callbacks=None, **options):
        torch_npu = None
        if device_module is None:
            torch_npu = _import("torch_npu")
            device_module = getattr(torch, "npu", None)
            if torch_npu is None or device_module is None:
                raise UsageError("device='npu' needs torch_npu (or pass device_module=, e.g. the "
                                 "stand-in racecheck.instrumentation.npu_standin.install())")
        m = device_module
        # A stand-in says it runs on CPU tensors: it cannot pin memory.
        self.strip_pin_memory = bool(getattr(m, "EMULATED_ON_CPU", False))
        c_mod = getattr(m, "_C", None)
        if c_mod is None and torch_npu is None and not self.strip_pin_memory:
            torch_npu = _import("torch_npu")
        if c_mod is None and torch_npu is not None:
            c_mod = getattr(torch_npu, "_C", None)
        trace = getattr(m, "_npu_trace", None)
        style = "npu"
        if trace is None:
            trace = getattr(m, "_gpu_trace", None)
            style = "gpu"
        if trace is None and torch_npu is not None:
            trace = _import("torch_npu.utils._npu_trace")
            style = "npu"
        activate = None
        if c_mod is not None and hasattr(c_mod, "_activate_npu_trace"):
            def activate(c=c_mod):
                c._activate_npu_trace(0)           # 0: stream-check mode
        elif style == "npu":
            trace = None                           # callbacks would never fire
        get_cur = getattr(c_mod, "_npu_getCurrentStream", None) if c_mod is not None else None
        use_callbacks = trace is not None if callbacks is None else bool(callbacks and trace is not None)
        lazy = getattr(m, "_lazy_init", None)
        if callable(lazy):
            lazy()
        super().__init__(sink, m, trace=trace, trace_style=style, trace_activate=activate,
                         current_ids=get_cur, callbacks=use_callbacks)
