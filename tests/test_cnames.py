"""The names racecheck's C code reads of Python objects are declared on the Python side, and exist.

The C looks attributes up by name, so a rename on either side must fail here rather than at the
first run of that path (or, in the engine, silently: a field it cannot find sends every such event
back to Python). The C sources are parsed:

* instrumentation/_speedups.c and racecheck/core/_engine.c intern every name they look up in one
  list, `I(var, "name")` (`V(...)`: a string used as a value, not an attribute); each must be
  declared with racecheck.core.cnames (`@read_by_c`), be a trace field (racecheck.core.trace's
  `__slots__`), or a builtin container's method;
* the engine reads event fields through `field(e, E_KIND, ev, F_NAME)`: each F_NAME must be a slot
  of that event class; the classes it asks the kit for must be in racecheck.core.fastchecker's
  kit; the attributes its export sets on the Checker must be the exported fields of the checker's
  state schema, and those it sets on the state's records attributes of their classes.

Conversely every declared name must still be an attribute of its owner and still be read by C.
"""
from __future__ import annotations

import ast
import collections
import importlib
import inspect
import os
import re
import sys
import textwrap

import pytest

from racecheck.core import cnames, trace

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SPEEDUPS = os.path.join(ROOT, "instrumentation", "_speedups.c")
CORE = os.path.join(ROOT, "racecheck", "core")
ENGINE = sorted(os.path.join(CORE, f) for f in os.listdir(CORE)
                if f.startswith("_engine") and f.endswith((".c", ".h")))
# modules whose classes carry @read_by_c declarations
DECLARING = ("racecheck.instrumentation.base", "racecheck.instrumentation.device",
             "racecheck.instrumentation.footprints", "racecheck.core.recorder")
# names the C reads of Python's own types
BUILTINS = {"append": collections.deque, "popleft": collections.deque, "format": str,
            "__dict__": type}

INTERNED = re.compile(r'\bI\((\w+), "([^"]+)"\)')
LITERAL_ATTR = re.compile(r'\b(?:PyObject_GetAttrString|PyObject_SetAttrString|set_attr_new|'
                          r'PyObject_CallMethod)\((\w+), "(\w+)"')


def source(*paths) -> str:
    text = ""
    for path in paths:
        with open(path, encoding="utf-8") as fh:
            text += fh.read()
    return text


def interned(text) -> set:
    return {name for _var, name in INTERNED.findall(text)}


def c_array(text, name) -> list:
    m = re.search(r"\b%s\[\w*\] = \{(.*?)\};" % name, text, re.S)
    assert m, f"{name} not found in the engine's C"
    return re.findall(r'"(\w+)"', m.group(1))


def c_enum(text, first) -> list:
    m = re.search(r"enum \{\s*(%s\b.*?)\}" % first, text, re.S)
    assert m, f"the enum starting {first} not found"
    return [n.strip() for n in m.group(1).split(",") if n.strip()]


def trace_classes() -> dict:
    return {n: c for n, c in vars(trace).items()
            if isinstance(c, type) and c.__module__ == trace.__name__}


def slots(cls) -> set:
    out = set()
    for k in cls.__mro__:
        s = vars(k).get("__slots__", ())
        out |= {s} if isinstance(s, str) else set(s)
    return out


def trace_fields() -> set:
    out = set()
    for cls in trace_classes().values():
        out |= slots(cls) | {n for n in vars(cls) if not n.startswith("__")}
    return out


def instance_attributes(cls) -> set:
    """Attributes a class's own methods assign on self, and its annotated ones."""
    out = set()
    for k in cls.__mro__:
        out |= set(vars(k).get("__annotations__", {}))
        top = k.__module__.split(".")[0]
        if top in sys.stdlib_module_names or top in ("builtins", "torch"):
            continue
        tree = ast.parse(textwrap.dedent(inspect.getsource(k)))
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) \
                    and isinstance(node.value, ast.Name) and node.value.id == "self":
                out.add(node.attr)
    return out


def has(owner, name) -> bool:
    if isinstance(owner, str):
        return hasattr(sys.modules[owner], name)
    return hasattr(owner, name) or name in instance_attributes(owner)


def declared() -> dict:
    for module in DECLARING:
        importlib.import_module(module)
    return cnames.DECLARED


def undeclared(names, decl: dict) -> set:
    """C names that no declaration, trace field or builtin covers."""
    known = {n for ns in decl.values() for n in ns} | trace_fields() | set(BUILTINS)
    return set(names) - known


def test_builtins_have_the_names():
    assert all(hasattr(t, n) for n, t in BUILTINS.items())


def test_every_name_the_hot_path_reads_is_declared():
    text = source(SPEEDUPS)
    names = interned(text)
    assert {"checking", "_busy", "stream_id", "thread"} <= names       # the parse sees the list
    assert not LITERAL_ATTR.findall(text), "look names up through the interned list"
    assert not undeclared(names, declared())


def test_every_declared_name_exists_on_its_owner():
    missing = [f"{getattr(o, '__qualname__', o)}.{n}" for o, ns in declared().items() for n in ns
               if not has(o, n)]
    assert not missing, "declared as read by C but not there: " + ", ".join(missing)


def test_every_declared_name_is_read_by_c():
    read = interned(source(SPEEDUPS, *ENGINE))
    stale = [f"{getattr(o, '__qualname__', o)}.{n}" for o, ns in declared().items() for n in ns
             if n not in read]
    assert not stale, "declared as read by C, but no C reads it: " + ", ".join(stale)


def test_a_rename_on_either_side_is_caught():
    class Renamed:
        def __init__(self):
            self.sequence = 0
    decl = {Renamed: ("seq",)}
    assert not has(Renamed, "seq") and has(Renamed, "sequence")
    assert undeclared({"seq", "sequence"}, decl) == {"sequence"}


def test_the_engine_reads_each_event_field_from_a_class_that_has_it():
    text = source(*ENGINE)
    kinds, fields = c_enum(text, "E_KERNEL"), c_enum(text, "F_THREAD")
    classes, names = c_array(text, "EVENT_CLASSES"), c_array(text, "FIELD_NAMES")
    assert kinds[-1] == "E_N" and fields[-1] == "F_N"
    assert len(classes) == len(kinds) - 1 and len(names) == len(fields) - 1
    by_name = trace_classes()
    reads = set(re.findall(r"\bfield\(e, (E_\w+), \w+, (F_\w+)\)", text))
    assert len(reads) > 40
    bad = []
    for kind, f in sorted(reads):
        cls, name = by_name[classes[kinds.index(kind)]], names[fields.index(f)]
        if name not in slots(cls):
            bad.append(f"{cls.__name__}.{name}")
    assert not bad, "the engine reads fields these event classes lack: " + ", ".join(bad)
    assert set(c_array(text, "FP_FIELDS")) <= slots(trace.Footprint)
    assert set(c_array(text, "COP_FIELDS")) <= slots(trace.CapturedOp)


def test_the_engine_interns_only_known_names():
    text = source(*ENGINE)
    assert not undeclared(interned(text), {})


def test_the_engine_asks_the_kit_for_what_it_has():
    from racecheck.core.fastchecker import _kit
    text = source(*ENGINE)
    asked = set(re.findall(r'\bkit\(\w+(?:->\w+)?, "(\w+)"\)', text))
    asked |= set(re.findall(r'PyDict_GetItemString\(kitd, "(\w+)"\)', text))
    asked |= set(c_array(text, "EVENT_CLASSES"))
    assert {"_Timeline", "Checker", "Kernel", "Footprint"} <= asked
    assert asked <= set(_kit()), sorted(asked - set(_kit()))


def test_the_engine_sets_the_state_the_checker_declares():
    state = pytest.importorskip("racecheck.core.checker.state",
                                reason="the checker's state schema is not in this tree")
    text = source(*ENGINE)
    literal = LITERAL_ATTR.findall(text)
    on_checker = {name for recv, name in literal if recv == "c"}
    assert on_checker == {f.c_name for f in state.EXPORTED}
    records = set()
    for cls in state.CLASSES.values():
        records |= slots(cls) | set(getattr(cls, "_fields", ())) | instance_attributes(cls)
    others = {name for recv, name in literal if recv != "c"} - set(BUILTINS)
    assert others <= records, sorted(others - records)
