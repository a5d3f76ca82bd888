"""A serial device module: the `torch.cuda` names over plain CPU tensors, one implicit stream.

The differential oracle's reference run uses it outside any racecheck session: every op runs
in program order, so streams, events and waits have nothing to order.
"""
from __future__ import annotations

import contextlib


class SerialStream:
    def __init__(self, device=None, priority=0, **_kwargs):
        self.priority = priority

    def wait_stream(self, stream) -> None:
        pass

    def wait_event(self, event) -> None:
        pass

    def record_event(self, event=None):
        event = event if event is not None else SerialEvent()
        event.record(self)
        return event

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True


class SerialEvent:
    def __init__(self, enable_timing=False, blocking=False, interprocess=False):
        pass

    def record(self, stream=None) -> None:
        pass

    def wait(self, stream=None) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True


class SerialGraph:
    """Graphs are not used by the serialized run; capture/replay still work (replay re-calls)."""

    def __init__(self, keep_graph=False):
        self._fn = None

    def replay(self) -> None:
        if self._fn is not None:
            self._fn()


class SerialDeviceModule:
    Stream = SerialStream
    Event = SerialEvent
    CUDAGraph = SerialGraph
    serial = True

    def __init__(self):
        self._stream = SerialStream()

    def current_stream(self, device=None):
        return self._stream

    def default_stream(self, device=None):
        return self._stream

    def set_stream(self, stream) -> None:
        pass

    def stream(self, stream):
        return contextlib.nullcontext(stream)

    def synchronize(self, device=None) -> None:
        pass

    @contextlib.contextmanager
    def graph(self, g, pool=None, stream=None):
        yield g

    def is_available(self) -> bool:
        return True

    def __repr__(self):
        return "<serial device module>"
