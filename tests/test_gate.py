"""Suppressions, baselines and the gate: a gate fails only on findings neither suppressed nor baselined."""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from racecheck.cli import main as cli
from racecheck.core.errors import UsageError
from racecheck.core.findings import assign_groups
from racecheck.reports import load_findings
from racecheck.core.suppressions import (baseline_document, filter_findings, load_baseline, parse_suppressions)

from helpers import racecheck_cli

DATA = Path(__file__).parent / "data"
FINDINGS = DATA / "findings_eagle.json"


@pytest.fixture(scope="module")
def findings():
    return load_findings(FINDINGS)


def run_cli(argv, capsys):
    """Through racecheck.cli.main.main, in process."""
    code = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


# -- suppressions file --------------------------------------------------------------------------

def test_parse_suppressions():
    sups = parse_suppressions(
        "# header comment\n\n"
        "RC006 req_pool_indices eagle_v2.py:389   # padding rows point at slot 0 upstream\n"
        "RC00* seq_*  # FutureMap publish lands next week (owner: spec-decode)\n", source="x.supp")
    assert [(s.rule, s.tensor, s.location) for s in sups] == [
        ("RC006", "req_pool_indices", "eagle_v2.py:389"), ("RC00*", "seq_*", "*")]
    assert sups[0].reason.startswith("padding") and sups[0].source == "x.supp:3"


@pytest.mark.parametrize("line,needle", [
    ("RC001 seq_lens", "needs a reason"),
    ("RC001 seq_lens #   ", "needs a reason"),
    ("RC001 # why", "expected `RULE TENSOR_GLOB"),
    ("RC001 a b c # why", "expected `RULE TENSOR_GLOB"),
    ("race seq_lens # tsan habit", "unknown rule"),
])
def test_bad_suppression_lines(line, needle):
    with pytest.raises(UsageError, match=needle) as ei:
        parse_suppressions(f"RC001 ok # fine\n{line}\n", source="s.supp")
    assert "s.supp:2" in str(ei.value) and "\n" not in str(ei.value)


def test_suppression_matching(findings):
    mrope, reqpool, seq_lens = findings
    (s,) = parse_suppressions("RC006 req_pool_* eagle_v2.py:389 # padding")
    assert s.matches(reqpool) and not s.matches(mrope)
    (by_frame,) = parse_suppressions("RC001 * *compute_spec_mrope_positions # any frame")
    assert by_frame.matches(mrope) and not by_frame.matches(seq_lens)
    (deep,) = parse_suppressions("RC001 seq_lens scenarios/eagle_v2.py:230 # folder glob")
    assert deep.matches(seq_lens)
    (wrong_line,) = parse_suppressions("RC001 seq_lens eagle_v2.py:231 # other line")
    assert not wrong_line.matches(seq_lens)


def test_filter_findings_split_and_stale(findings, tmp_path):
    mrope, reqpool, seq_lens = findings
    supp = tmp_path / "racecheck.supp"
    supp.write_text("RC006 req_pool_indices * # padding rows point at reserved slot 0\n"
                    "RC003 kv_cache * # fixed long ago\n")
    base = tmp_path / "baseline.json"
    base.write_text(json.dumps(baseline_document([seq_lens, reqpool])))
    kept, suppressed, baselined, stale = filter_findings(findings, str(supp), str(base))
    assert kept == [mrope]
    assert suppressed == [reqpool], "a suppression wins over the baseline"
    assert baselined == [seq_lens]
    assert [s.tensor for s in stale] == ["kv_cache"]
    res = filter_findings(findings)
    assert res.kept == findings and res.exit_code == 1
    assert filter_findings(findings, baseline={f.fingerprint() for f in findings}).exit_code == 0


def test_baseline_roundtrip_then_new_race_fails(findings, tmp_path, capsys):
    """Done-when: a baseline taken on a variant makes the gate pass; a new race on top fails it."""
    base = tmp_path / "racecheck-baseline.json"
    code, out, _ = run_cli(["baseline", FINDINGS, "-o", base], capsys)
    assert code == 0 and "wrote 3 fingerprints" in out
    assert load_baseline(base) == ({f.fingerprint() for f in findings} |
                                   {f.group_id() for f in assign_groups(findings)})

    code, out, _ = run_cli(["report", FINDINGS, "--baseline", base], capsys)
    assert code == 0 and "no races found" in out and "3 baselined" in out

    # a new race on top: another missing synchronization (the same one on a new tensor joins
    # the accepted group, test_baseline_takes_a_group)
    new = replace(findings[0], tensor="mm_input_embeds",
                  current=replace(findings[0].current, location="eagle_v2.py:999", function="mix"))
    doc = json.loads(FINDINGS.read_text())
    doc["findings"].append(new.to_json())
    more = tmp_path / "more.json"
    more.write_text(json.dumps(doc))
    code, out, _ = run_cli(["report", more, "--baseline", base], capsys)
    assert code == 1 and "mm_input_embeds" in out and "1 finding" in out
    assert "on mrope_positions" not in out and "on mm_input_embeds" in out

    code, out, _ = run_cli(["report", more, "--baseline", base, "-f", "sarif"], capsys)
    results = json.loads(out)["runs"][0]["results"]
    assert code == 1 and [r["properties"]["tensor"] for r in results] == ["mm_input_embeds"]


def test_report_command_formats_and_exit_codes(tmp_path, capsys):
    for fmt in ("json", "sarif", "junit", "html", "perfetto"):
        out_file = tmp_path / f"r.{fmt}"
        code, _, err = run_cli(["report", FINDINGS, "--format", fmt, "-o", out_file], capsys)
        assert code == 1, err
        assert out_file.stat().st_size > 200
    code, out, _ = run_cli(["report", FINDINGS], capsys)
    assert code == 1 and "3 findings" in out and "RC001" in out
    code, _, _ = run_cli(["report", FINDINGS, "--report", f"html={tmp_path / 'x.html'}"], capsys)
    assert code == 1 and (tmp_path / "x.html").exists()


def test_report_command_stale_suppression_warns(tmp_path, capsys):
    supp = tmp_path / "s.supp"
    supp.write_text("RC00* * * # accept all for the demo\nRC005 kv_cache * # nothing matches this\n")
    code, out, err = run_cli(["report", FINDINGS, "--suppressions", supp], capsys)
    assert code == 0 and "3 suppressed" in out
    assert "stale suppression" in err and "kv_cache" in err


@pytest.mark.parametrize("make,needle", [
    (lambda p: p.write_text("{broken"), "not valid JSON"),
    (lambda p: p.write_text('{"version": "2.1.0", "runs": []}'), "not a racecheck findings file"),
    (lambda p: None, "no such file"),
])
def test_report_command_bad_input_exit_2(tmp_path, capsys, make, needle):
    p = tmp_path / "in.json"
    make(p)
    code, out, err = run_cli(["report", p], capsys)
    assert code == 2
    assert needle in " ".join(err.split()), err


def test_usage_error_is_one_line_even_when_long(tmp_path, capsys):
    """DESIGN: usage errors print one line (a long path must not be wrapped at 80 columns)."""
    p = tmp_path / ("deep-" * 12) / "in.json"
    code, _, err = run_cli(["report", p], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1, err


def test_bad_suppressions_or_baseline_exit_2(tmp_path, capsys):
    supp = tmp_path / "s.supp"
    supp.write_text("RC001 seq_lens\n")
    code, _, err = run_cli(["report", FINDINGS, "--suppressions", supp], capsys)
    assert code == 2 and "needs a reason" in err
    code, _, err = run_cli(["report", FINDINGS, "--baseline", FINDINGS], capsys)
    assert code == 2 and "not a racecheck baseline" in " ".join(err.split())
    code, _, err = run_cli(["report", FINDINGS, "--format", "xml"], capsys)
    assert code == 2
    code, _, err = run_cli(["report", FINDINGS, "--report", "xml=a.xml"], capsys)
    assert code == 2 and "unknown format" in err


def test_racecheck_report_subprocess(tmp_path):
    """The installed entry point, end to end."""
    r = racecheck_cli("report", FINDINGS, "-f", "junit", "-o", tmp_path / "j.xml")
    assert r.returncode == 1, r.stderr
    assert (tmp_path / "j.xml").read_text().count("<testcase") == 1


def test_baseline_takes_a_group(findings, tmp_path):
    """A baseline accepts root causes: a tensor that joins an accepted missing synchronization is
    baselined with it; a finding with no group peers is matched on its own fingerprint."""
    doc = baseline_document(findings[:1])
    joined = replace(findings[0], tensor="mm_input_embeds")
    assert joined.group_id() == findings[0].group_id()
    res = filter_findings([*findings, joined], baseline=doc)
    assert res.baselined == [findings[0], joined] and res.kept == findings[1:]
    old_style = {f.fingerprint() for f in findings[1:]}      # a baseline from before groups
    res = filter_findings(findings, baseline=old_style)
    assert res.kept == findings[:1] and res.baselined == findings[1:]


def test_suppression_takes_a_group(findings):
    """A suppression that matches one finding of a group suppresses the group (one fix), and
    nothing of another group."""
    joined = replace(findings[0], tensor="mm_input_embeds")
    sups = parse_suppressions(f"{findings[0].rule} {findings[0].tensor}  # accepted upstream\n")
    res = filter_findings([*findings, joined], suppressions=sups)
    assert res.suppressed == [findings[0], joined] and res.kept == findings[1:] and not res.stale
