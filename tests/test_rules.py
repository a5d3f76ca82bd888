"""racecheck.rules is the one home of rule texts: README, findings and reports read from it."""
from __future__ import annotations

import os
import pathlib

from racecheck import rules
from racecheck.findings import Access, Finding
from racecheck.reports import sarif
from racecheck.reports._common import rule_name, rule_title

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_every_public_rule_and_the_internal_one():
    assert [r for r in rules.RULES] == [f"RC00{i}" for i in range(1, 9)] + ["DIFF"]
    assert [r.id for r in rules.RULES.values() if r.internal] == ["DIFF"]
    for r in rules.RULES.values():
        assert r.name and r.title and r.description and r.help, r.id


def test_readme_table_is_the_rules_module():
    text = (ROOT / "README.md").read_text()
    assert rules.readme_table() in text


def test_unknown_rule_gets_a_placeholder():
    r = rules.get("RC999")
    assert (r.id, r.name, r.title) == ("RC999", "rc999", "RC999")
    assert not rules.is_rule_id("RC999") and rules.is_rule_id("RC006") and rules.is_rule_id("DIFF")


def test_findings_and_reports_read_the_rules_module():
    a = Access(op="add_", stream="s", kind="write", location="m.py:1")
    f = Finding(rule="RC005", tensor="t", current=a, previous=a, suggestion="keep it")
    assert f.title == rules.RULES["RC005"].title
    assert rule_name("RC006") == "stale-graph-input" and rule_title("RC006") == rules.RULES["RC006"].title
    d = sarif.rule_descriptor("RC008")
    assert d["help"]["text"] == rules.RULES["RC008"].help
    assert d["fullDescription"]["text"] == rules.RULES["RC008"].description
    assert sarif.rule_descriptor("RC008") is d                   # built once


def test_no_rule_prose_outside_the_rules_module():
    for folder in ("racecheck", "reports"):
        for path in (ROOT / folder).rglob("*.py"):
            if path.name == "rules.py":
                continue
            src = path.read_text()
            for r in rules.RULES.values():
                assert r.help[:60] not in src, (os.fspath(path), r.id)
                assert r.description[:60] not in src, (os.fspath(path), r.id)
