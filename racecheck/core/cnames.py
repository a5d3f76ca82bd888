"""The attribute names racecheck's C code reads of Python objects, declared where those are defined.

The C (instrumentation/_speedups.c, the checker's engine racecheck/core/_engine*.c) looks
attributes up by name: interned strings, slot offsets found by name. A rename on the Python side
breaks it without an error until that path runs (a missing slot even just sends the engine back to
Python, slower but silent). So each class the C reads says which of its attributes, beside its
definition:

    @read_by_c("checking", "seq", "emit")
    class Sink(Protocol): ...

and `read_by_c_globals(__name__, ...)` does the same for a module's globals. tests/test_cnames.py
parses the C sources for every name they look up and fails where one is declared nowhere, or where
a declared one is no longer an attribute of its owner. Event, footprint and captured-op fields
(racecheck.core.trace) are declared by their `__slots__`, and the checker's exported state by
racecheck.core.checker.state, which the same test reads.
"""
from __future__ import annotations

DECLARED: dict = {}     # owner (a class, or a module's name) -> names C reads of it


def read_by_c(*names: str):
    """Class decorator: C reads these attributes of the class's instances (or of the class)."""
    def declare(cls):
        DECLARED[cls] = DECLARED.get(cls, ()) + names
        return cls
    return declare


def read_by_c_globals(module: str, *names: str) -> None:
    """C reads these globals of `module` (through the globals() dict Python hands it)."""
    DECLARED[module] = DECLARED.get(module, ()) + names
