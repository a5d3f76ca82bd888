"""Tensor methods that bypass the dispatcher but must count as device/host events.

`Tensor.tolist()` and `.numpy()` read data without an ATen op; `Tensor.record_stream(s)` must
accept the session's streams. Each patch lives only for the session's lifetime.
"""
from __future__ import annotations

import torch

from . import stacks


def install_patches(session) -> list:
    undo = []

    def patch(name, make):
        orig = getattr(torch.Tensor, name)
        setattr(torch.Tensor, name, make(orig))
        undo.append(lambda: setattr(torch.Tensor, name, orig))

    def host_reader(op):
        def make(orig):
            def method(self, *args, **kwargs):
                if session.checking and not session._tls.internal:
                    try:
                        session.host_read(self, op, stacks.capture())
                    except Exception as exc:
                        session.internal_error(exc, f"while instrumenting .{op}()")
                return orig(self, *args, **kwargs)
            method.__name__ = op
            method.__wrapped__ = orig
            return method
        return make

    patch("tolist", host_reader("tolist"))
    patch("numpy", host_reader("numpy"))

    def make_record_stream(orig):
        def record_stream(self, stream):
            if session.backend.stream_of(stream) is not None:
                if session.checking:
                    session.record_stream(self, stream)
                return None
            return orig(self, stream)
        record_stream.__wrapped__ = orig
        return record_stream

    patch("record_stream", make_record_stream)
    return undo
