"""racecheck's C code, where it was built: the per-op hot path (instrumentation/_speedups.c) and the
checker's engine (racecheck/core/_engine.c).

The Python they port stays the reference and the fallback: a platform without a compiler gets a
working (slower) racecheck, and RACECHECK_PURE_PYTHON=1 (or `use(False)`, taking effect for
sessions and checkers made after it) switches both off, so that the two can be compared on the
same program (tests/test_native.py, tests/test_checker_engine.py, bench/bench_interception.py).

The decision is made here only: the instrumentation asks `speedups` when it builds a session's
objects (each installs a C piece only where its class's own method is the one the C ports), and
`racecheck.core.fastchecker.new_checker` asks `checker_engine()`. `built` and `engine_built` say
what the install compiled, whatever the switch.
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
_on = os.environ.get("RACECHECK_PURE_PYTHON", "") in ("", "0")
# what the instrumentation installs for a session made now: the per-op C module, or None
speedups = built if _on else None
_listeners: list = []


def checker_engine():
    """What a checker made now runs on: the C engine's module, or None (the Python Checker)."""
    return engine_built if _on else None


def use(on: bool) -> bool:
    """Switch the C code on (where built) or off; returns whether the hot path is on now."""
    global _on, speedups
    _on = bool(on)
    speedups = built if _on else None
    for listener in _listeners:
        listener(speedups)
    return speedups is not None


@contextlib.contextmanager
def using(on: bool):
    """`use(on)` for the duration of a `with` block (sessions and checkers made inside it)."""
    was = _on
    use(on)
    try:
        yield speedups is not None
    finally:
        use(was)


def on_change(listener) -> None:
    """Call listener(speedups or None) now and whenever `use` switches."""
    _listeners.append(listener)
    listener(speedups)
