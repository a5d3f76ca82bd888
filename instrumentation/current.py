"""The backend installed right now, for entry points that program code calls directly.

`racecheck.kernel(...)` declarations and `warm_up()` run outside the interceptor and need to know
whether a session is observing the program; they ask here rather than reaching up to the session
that installed the backend. One backend at a time, like one session at a time.
"""
from __future__ import annotations

_backend = None


def backend():
    """The installed backend, or None outside a session."""
    return _backend


def set_backend(b) -> None:
    global _backend
    _backend = b
