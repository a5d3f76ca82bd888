"""racecheck's C code, where it was built: the per-op hot path (instrumentation/_speedups.c) and the
checker's engine (racecheck/core/_engine.c).

The Python they port stays the reference and the fallback: a platform without a compiler gets a
working (slower) racecheck, and RACECHECK_PURE_PYTHON=1 (or `use(False)`, taking effect for
sessions and checkers made after it) switches both off, so that the two can be compared on the
same program (tests/test_native.py, tests/test_checker_engine.py, bench/bench_interception.py).
"""
from __future__ import annotations

import contextlib
import importlib
import os


def _load(module: str):
    try:
        return importlib.import_module(module)
    except ImportError:
        return None


# Loaded by name, each from the layer it ports: the switch lives here, in the lowest layer, so
# that the instrumentation's hot path and the checker's engine read one decision.
built = _load("racecheck.instrumentation._speedups")
engine_built = _load("racecheck.core._engine")
_pure = os.environ.get("RACECHECK_PURE_PYTHON", "") not in ("", "0")
speedups = None if _pure else built
engine = None if _pure else engine_built
_listeners: list = []


def use(on: bool) -> bool:
    """Switch the C code on (where built) or off; returns whether the hot path is on now."""
    global speedups, engine
    speedups = built if on else None
    engine = engine_built if on else None
    for listener in _listeners:
        listener(speedups)
    return speedups is not None


@contextlib.contextmanager
def using(on: bool):
    """`use(on)` for the duration of a `with` block (sessions and checkers made inside it)."""
    was = speedups is not None
    use(on)
    try:
        yield speedups is not None
    finally:
        use(was)


def on_change(listener) -> None:
    """Call listener(speedups or None) now and whenever `use` switches."""
    _listeners.append(listener)
    listener(speedups)
