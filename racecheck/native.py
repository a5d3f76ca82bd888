"""The per-op hot path in C (racecheck/_speedups.c), where it was built.

The Python it ports stays the reference and the fallback: a platform without a compiler gets a
working (slower) racecheck, and RACECHECK_PURE_PYTHON=1 (or `use(False)`, taking effect for
sessions started after it) switches the C path off, so that the two can be compared on the same
program (tests/test_native.py, bench/bench_interception.py).
"""
from __future__ import annotations

import os


def _load():
    try:
        from racecheck import _speedups
    except ImportError:
        return None
    return _speedups


built = _load()
speedups = None if os.environ.get("RACECHECK_PURE_PYTHON", "") not in ("", "0") else built
_listeners: list = []


def use(on: bool) -> bool:
    """Switch the C path on (where built) or off; returns whether it is on now."""
    global speedups
    speedups = built if on else None
    for listener in _listeners:
        listener(speedups)
    return speedups is not None


def on_change(listener) -> None:
    """Call listener(speedups or None) now and whenever `use` switches."""
    _listeners.append(listener)
    listener(speedups)
