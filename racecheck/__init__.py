"""racecheck: find stream-synchronization races in PyTorch inference engines.

    import racecheck
    with racecheck.session(device="sim") as rc:
        dm = rc.device_module
        ...
    rc.findings
"""
from __future__ import annotations

from racecheck.core.findings import Access, Finding
from racecheck.session import Session, active_session, session

__version__ = "0.1.0"

__all__ = ["session", "Session", "name", "stale_tolerant", "delay", "kernel", "Finding", "Access",
           "active_session", "__version__"]


def name(t, name: str):
    """Give a tensor's bytes a name for findings (`seq_lens`, `req_pool_indices`). Returns `t`."""
    s = active_session()
    if s is not None and s.checking:
        try:
            s.name(t, name)
        except Exception as exc:
            s.internal_error(exc, "while naming a tensor")
    return t


def stale_tolerant(t):
    """Declare a graph input buffer's rows stale-tolerant. Returns `t`.

    For an engine whose graphs read padded rows it does not rewrite before each replay by design
    (their results are discarded, e.g. `input_ids`' unused tail): stale reads of these bytes are
    then not RC006, except when a stale value is used as an index into memory the run writes
    after the graph's capture (`req_pool_indices` selecting `req_to_token` rows), which stays RC006.
    """
    s = active_session()
    if s is not None and s.checking:
        try:
            s.stale_tolerant(t)
        except Exception as exc:
            s.internal_error(exc, "while declaring a stale-tolerant tensor")
    return t


def delay(stream, microseconds: float) -> None:
    """Hold `stream` back for about `microseconds` before its next op (a no-op outside a session).

    On a GPU this queues a sleep kernel on the stream; on `sim` the adversarial executor
    deprioritizes the stream. Put delays before producers: a delay on the consumer hides races.
    """
    s = active_session()
    if s is not None:
        s.backend.delay(stream, microseconds)


def kernel(target=None, *, reads=(), writes=(), reference=None, name=None):
    """Declare an opaque kernel's reads and writes (see racecheck.instrumentation.kernels)."""
    from racecheck.instrumentation.kernels import kernel as declare
    return declare(target, reads=reads, writes=writes, reference=reference, name=name)
