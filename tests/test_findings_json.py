"""A finding's JSON form keeps the checker's structured conclusion (racecheck.core.findings.Race):
the bytes as data (`place`) and the rule's own facts (`facts`), not only the prose made of them."""
from __future__ import annotations

import json
from dataclasses import fields

import jsonschema
import pytest

import racecheck
from racecheck.core.findings import Access, ContextEvent, Finding, Place, Race, describe
from racecheck.reports import json_report

from cases import EXPECTED

# a value other than the default for every field of Race
EVERY = dict(rule="RC006", place=Place("seq_lens", 5, "rows", "3..7", "24..63", True),
             current=Access("embed", "default", "read", "m.py:9", "forward", ("m.py:9 in forward",), 40),
             previous=Access("fill_", "plan", "write", "m.py:3", "plan", ("m.py:3 in plan",), 12),
             context=(ContextEvent(12, "plan", "kernel", "fill_"),), approx="strided view",
             host_current=True, freer="host", reuse=("add_", "m.py:13"), trace_end=True, graph=2,
             fresh="rows 0..2", index_use=("gather", "`kv`"), overwritten_at=30, born=25, event=7,
             host_wait=True, related="RC001", never_recorded=True, instead=8)


def _round_trip(f: Finding) -> dict:
    d = json.loads(json.dumps(f.to_json()))
    assert Finding.from_json(d) == f
    jsonschema.validate(json.loads(json_report.render([f])), json_report.schema())
    return d


def test_every_field_of_a_race_reaches_json():
    assert set(EVERY) == {f.name for f in fields(Race)}, "a new Race field: give it a value here"
    d = _round_trip(describe(Race(**EVERY)))
    assert d["place"] == {"tensor": "seq_lens", "storage": 5, "unit": "rows", "spans": "3..7",
                          "byte_spans": "24..63", "named": True}
    own = {"rule", "place", "current", "previous", "context", "approx"}
    assert d["facts"] == {k: (list(v) if isinstance(v, tuple) else v)
                          for k, v in EVERY.items() if k not in own}
    assert d["rule"] == "RC006" and d["approx"] == "strided view" and d["current"]["seq"] == 40


def test_unset_facts_are_left_out():
    r = Race("RC001", EVERY["place"], EVERY["current"], EVERY["previous"])
    d = _round_trip(describe(r))
    assert d["facts"] == {} and d["place"]["storage"] == 5


def test_a_finding_without_a_race_and_an_old_file_read_back():
    old = describe(Race(**EVERY)).to_json()
    del old["place"], old["facts"]
    f = Finding.from_json(old)
    assert f.place is None and f.facts == ()
    _round_trip(f)


# the rule's facts each public case's findings carry, beyond rule, place and accesses
FACTS = {"RC004": {"host_current"}, "RC005": {"freer"}, "RC006": {"graph", "fresh"},
         "RC007": {"graph", "overwritten_at", "born"}, "RC008": {"event", "related"}}


@pytest.mark.parametrize("case", sorted(c for c, (_p, exp) in EXPECTED.items() if exp))
def test_public_case_findings_carry_their_facts(case):
    program = EXPECTED[case][0]
    with racecheck.session(device="sim") as rc:
        keep = program(rc.device_module, "cpu")  # noqa: F841 - tensors outlive the snippet
    assert rc.findings
    for f in rc.findings:
        d = _round_trip(f)
        assert d["place"]["tensor"] == f.tensor and isinstance(d["place"]["storage"], int)
        assert FACTS.get(f.rule, set()) <= set(d["facts"]), (f.rule, d["facts"])
