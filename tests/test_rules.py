"""racecheck.core.rules is the one home of rule texts: README, findings and reports read from it."""
from __future__ import annotations

import os
import pathlib

from racecheck.core import rules
from racecheck.core.findings import Access, Finding
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


def test_the_checker_emits_structure_and_the_findings_layer_writes_the_prose():
    from racecheck.core.findings import Place, Race, describe
    src = "".join(p.read_text() for p in (ROOT / "racecheck" / "core" / "checker").glob("*.py"))
    assert "def _on_kernel" in src          # the checker's own source, wherever it lives
    for phrase in ("record an event on", ".record_stream({", "rewrite (e.g. zero)", ".clone()",
                   "is not ordered after the", "never recorded does nothing"):
        assert phrase not in src, phrase
    place = Place("seq_lens", 5, "rows", "3..7", "24..63", True)
    w = Access(op="fill_", stream="plan_stream", kind="write", location="m.py:3", function="plan")
    r = Access(op="mul", stream="default", kind="read", location="m.py:9", function="use")
    f = describe(Race("RC001", place, r, w, approx="strided view"))
    assert f.tensor == "seq_lens" and f.missing_edge == ("plan_stream", "default")
    assert f.suggestion.startswith("record an event on `plan_stream` after `plan`")
    assert f.detail.startswith("rows 3..7 of `seq_lens` (bytes 24..63 of storage #5): the read")
    assert "footprint approximate (strided view)" in f.detail
    free = Access(op="free", stream="default", kind="free", location="m.py:12")
    f5 = describe(Race("RC005", place, free, r, freer="host", reuse=("add_", "m.py:13")))
    assert "`default` then issued `add_` at m.py:13 before waiting for `default`" in f5.detail
    assert "footprint approximate" not in describe(Race("RC005", place, free, r, approx="x")).detail
    unnamed = Place("unnamed tensor (bytes 0..7)", 9, "bytes", "0..7", "0..7", False)
    assert unnamed.where() == "bytes 0..7 of storage #9"


def test_fixes_for_top_level_code_name_file_and_line():
    from racecheck.core.findings import Place, Race, describe
    place = Place("x", 1, "elements", "0..7", "0..31", True)
    w = Access(op="add_", stream="s", kind="write", location="prog.py:7", function="<module>")
    r = Access(op="mul", stream="default", kind="read", location="prog.py:9", function="<module>")
    f = describe(Race("RC001", place, r, w))
    assert "after `prog.py:7`" in f.suggestion and "before `prog.py:9`" in f.suggestion
    assert "<module>" not in f.suggestion
    lam = Access(op="mul", stream="default", kind="read", location="", function="<lambda>")
    assert "before `<lambda>`" in describe(Race("RC001", place, lam, w)).suggestion
    fn = Access(op="mul", stream="default", kind="read", location="m.py:3", function="verify")
    assert "before `verify`" in describe(Race("RC001", place, fn, w)).suggestion


def test_top_level_program_fix_on_sim(tmp_path):
    import racecheck
    prog = tmp_path / "prog.py"
    prog.write_text("import torch, racecheck\n"
                    "dm = rc.device_module\n"
                    "s = dm.Stream()\n"
                    "x = racecheck.name(torch.zeros(8), 'x')\n"
                    "dm.synchronize()\n"
                    "with dm.stream(s):\n"
                    "    x.add_(1)\n"
                    "y = x * 2\n"
                    "dm.synchronize()\n")
    with racecheck.session(device="sim") as rc:
        exec(compile(prog.read_text(), str(prog), "exec"), {"rc": rc})
    f = rc.findings[0]
    assert f.rule == "RC001" and f.current.function == "<module>"
    assert "after `prog.py:7`" in f.suggestion and "before `prog.py:8`" in f.suggestion
