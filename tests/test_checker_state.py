"""The checker's state schema (racecheck.core.checker.state) against real Checker instances.

Every attribute a Checker has after a real trace (every public case, the EAGLE v2 scenario's
variants) is declared in FIELDS, so that the C engine's export and tests/test_checker_engine.py's
comparison, which both read FIELDS, cannot miss one. Python only: the engine's side is in
tests/test_checker_engine.py.
"""
from __future__ import annotations

import pathlib

import pytest

from racecheck.core import native
from racecheck.core.checker import Checker
from racecheck.core.checker import state as schema
from racecheck.core.trace import Alloc, Footprint, Kernel, NameTimeline

from cases import EXPECTED
from test_checker_engine import _case_trace, _scenario_trace, _variants

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "racecheck" / "core" / "checker"
ST = (("/eng/model.py", 3, "step"),)


def python_checker() -> Checker:
    with native.using(False):
        return Checker()


def _racy():
    x = Footprint(1, ((0, 8),))
    return [NameTimeline(0, 1, "a"), NameTimeline(0, 2, "b"), Alloc(0, 1, 1, 8),
            Kernel(0, 1, (), (x,), "w", ST), Kernel(0, 2, (x,), (), "r", ST)]


@pytest.mark.parametrize("case", sorted(EXPECTED))
def test_every_attribute_after_a_public_case_is_declared(case):
    c = python_checker().process_all(_case_trace(case))
    assert c.findings or not EXPECTED[case][1]
    assert schema.undeclared(c) == []


@pytest.mark.parametrize("variant", _variants("eagle-v2"))
def test_every_attribute_after_eagle_v2_is_declared(variant):
    c = python_checker().process_all(_scenario_trace("eagle-v2", variant))
    assert schema.undeclared(c) == []


def test_a_new_attribute_is_caught():
    class Counting(Checker):
        def _on_kernel(self, ev, seq):
            self._kernels = getattr(self, "_kernels", 0) + 1
            super()._on_kernel(ev, seq)

    assert schema.undeclared(Counting().process_all(_racy())) == ["_kernels"]
    c = Checker().process_all(_racy())
    c.retries = 3
    assert schema.undeclared(c) == ["retries"]


def test_a_new_checker_has_every_field_but_the_class_defaults():
    c = Checker(context_window=5)
    on_class = {f.name for f in schema.FIELDS if f.role == schema.CONFIG and f.name in vars(Checker)}
    assert on_class == {"merge_replays", "merge_min_accesses"}
    assert set(vars(c)) == {f.name for f in schema.FIELDS} - on_class
    assert c.context_window == 5 and c._tl == {} and c.namer is None


def test_awaiting_export_leaves_out_exactly_the_exported_fields():
    c = Checker.awaiting_export(7)
    assert schema.not_exported(c) == [f.name for f in schema.EXPORTED]
    assert set(vars(c)) == {f.name for f in schema.FIELDS if f.role != schema.STATE} - {
        "merge_replays", "merge_min_accesses"}


def test_the_schema_is_well_formed():
    concerns = {p.stem for p in PACKAGE.glob("*.py")} - {"__init__", "state"} | {"checker"}
    roles = {schema.STATE, schema.PENDING, schema.CONFIG, schema.DERIVED}
    assert len(schema.FIELD) == len(schema.FIELDS)
    for f in schema.FIELDS:
        assert f.concern in concerns and f.role in roles and f.type and f.meaning, f
        assert (f.c_name != "") == (f.role == schema.STATE), f
        assert f.role == schema.CONFIG or f.new is not None or f.name == "_handlers", f


def test_source_names_are_read_only_for_findings(monkeypatch):
    """Describing an unnamed tensor by its creating line reads source: only when a finding is made."""
    from racecheck.core.checker import naming
    calls = []
    real = naming.creation_name
    monkeypatch.setattr(naming, "creation_name", lambda fr: calls.append(fr) or real(fr))
    clean = _racy()[:4] + [Kernel(0, 1, (Footprint(1, ((0, 8),)),), (), "r", ST)]
    assert python_checker().process_all(clean).findings == []
    assert calls == []
    assert python_checker().process_all(_racy()).findings
    assert calls
