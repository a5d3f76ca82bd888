"""Tensor methods that bypass the dispatcher but must count as device/host events.

`Tensor.tolist()` and `.numpy()` read data without an ATen op; `Tensor.record_stream(s)` must
accept the session's streams. Each patch lives only for the session's lifetime.
"""
from __future__ import annotations

import torch

from . import stacks


def install_patches(backend) -> list:
    undo = []
    sink, tls = backend.sink, backend.tls

    def patch(name, make):
        orig = getattr(torch.Tensor, name)
        setattr(torch.Tensor, name, make(orig))
        undo.append(lambda: setattr(torch.Tensor, name, orig))

    def host_reader(op):
        def make(orig):
            def method(self, *args, **kwargs):
                if sink.checking and not tls.internal:
                    try:
                        backend.host_read(self, op, stacks.capture())
                    except Exception as exc:
                        sink.internal_error(exc, f"while instrumenting .{op}()")
                return orig(self, *args, **kwargs)
            method.__name__ = op
            method.__wrapped__ = orig
            return method
        return make

    patch("tolist", host_reader("tolist"))
    patch("numpy", host_reader("numpy"))

    def make_record_stream(orig):
        def record_stream(self, stream):
            if backend.stream_of(stream) is not None:
                if sink.checking and not backend.sites.visit("record_stream"):
                    backend.record_stream(self, stream)
                return None
            return orig(self, stream)
        record_stream.__wrapped__ = orig
        return record_stream

    patch("record_stream", make_record_stream)
    return undo
