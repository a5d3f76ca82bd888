"""Every report format from the same findings: JSON and SARIF against their schemas, JUnit parsed,
Perfetto checked with the trace-event rules, console text readable."""
from __future__ import annotations

import json
import os
import xml.etree.ElementTree as ET
from pathlib import Path

import jsonschema
import pytest

from racecheck.core.errors import UsageError
from racecheck.core.findings import RULES, Access, ContextEvent, Finding, assign_groups
from racecheck.reports import (FORMATS, load_findings, parse_report_spec, render, render_text,
                               write_reports)
from racecheck.reports import json_report, perfetto, sarif

DATA = Path(__file__).parent / "data"
SARIF_SCHEMA = json.loads((DATA / "sarif-schema-2.1.0.json").read_text())


@pytest.fixture(scope="module")
def findings():
    return load_findings(DATA / "findings_eagle.json")


def sarif_errors(doc):
    v = jsonschema.Draft202012Validator(SARIF_SCHEMA)
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message[:200]}" for e in v.iter_errors(doc)]


def check_trace_events(trace: dict) -> None:
    """The trace-event rules Perfetto's JSON importer relies on."""
    events = trace["traceEvents"]
    assert isinstance(events, list) and events
    named = {(e["pid"], e["tid"]) for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    slices = [e for e in events if e["ph"] == "X"]
    assert slices
    for e in events:
        assert e.get("name"), e
        assert e["ph"] in {"M", "X", "s", "f", "i"}, e
        if e["ph"] != "M":
            assert isinstance(e["ts"], (int, float)) and e["ts"] >= 0
            assert (e["pid"], e["tid"]) in named, f"event on an unnamed track: {e}"
    for e in slices:
        assert isinstance(e["dur"], (int, float)) and e["dur"] > 0
    # no two slices overlap on one track (complete events must nest or not touch)
    by_track = {}
    for e in slices:
        by_track.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e["dur"]))
    for spans in by_track.values():
        spans.sort()
        for (a0, a1), (b0, b1) in zip(spans, spans[1:]):
            assert a1 <= b0
    # every flow start has exactly one end with the same id/cat/name, bound to enclosing slices
    starts = {(e["id"], e["cat"], e["name"]): e for e in events if e["ph"] == "s"}
    ends = {(e["id"], e["cat"], e["name"]): e for e in events if e["ph"] == "f"}
    assert len(starts) == sum(e["ph"] == "s" for e in events)
    assert starts.keys() == ends.keys()

    def enclosing(e):
        return [s for s in slices if (s["pid"], s["tid"]) == (e["pid"], e["tid"])
                and s["ts"] <= e["ts"] <= s["ts"] + s["dur"]]

    for key, s in starts.items():
        f = ends[key]
        assert f.get("bp") == "e"
        assert len(enclosing(s)) == 1 and len(enclosing(f)) == 1, key
        assert s["ts"] <= f["ts"]


# -- specs and atomic writes --------------------------------------------------------------------

@pytest.mark.parametrize("spec,expect", [("json=out.json", ("json", "out.json")),
                                         ("SARIF=a/b.sarif", ("sarif", "a/b.sarif")),
                                         ("console", ("console", "-")),
                                         ("html=r=1.html", ("html", "r=1.html"))])
def test_parse_report_spec(spec, expect):
    assert parse_report_spec(spec) == expect


@pytest.mark.parametrize("spec", ["xml=a.xml", "json", "json=", "", "=x"])
def test_bad_report_spec_is_usage_error_one_line(spec, findings, tmp_path):
    with pytest.raises(UsageError) as ei:
        write_reports(findings, [f"json={tmp_path / 'ok.json'}", spec])
    assert "\n" not in str(ei.value)
    assert not (tmp_path / "ok.json").exists(), "nothing is written when any spec is bad"


def test_write_reports_every_format(findings, tmp_path):
    specs = [f"{fmt}={tmp_path / ('r.' + fmt)}" for fmt in FORMATS]
    written = write_reports(findings, specs, {"scenario": "eagle-v2", "variant": "no-mrope_recompute"})
    assert len(written) == len(FORMATS)
    for p in written:
        assert os.path.getsize(p) > 200
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".racecheck-")], "temp files left behind"


def test_write_is_atomic_on_failure(findings, tmp_path, monkeypatch):
    target = tmp_path / "r.json"
    target.write_text("old")

    def boom(*a, **k):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(UsageError, match="No space left"):
        write_reports(findings, [f"json={target}"])
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]


# -- console ------------------------------------------------------------------------------------

def test_console_text(findings):
    text = render_text(findings, title="eagle-v2 [no-mrope_recompute]")
    for needle in ("RC001", "mrope_positions", "plan_stream", "forward_stream", "graph replay",
                   "eagle_v2.py:298", "compute_spec_mrope_positions", "fix:", "rows 0..5", "3 findings",
                   "approx:", "RC006", "req_pool_indices"):
        assert needle in text, needle
    assert render_text([]).strip().endswith("no races found")


# -- JSON ---------------------------------------------------------------------------------------

def test_json_roundtrip_and_schema(findings, tmp_path):
    doc = json.loads(render("json", findings, {"scenario": "eagle-v2"}))
    jsonschema.validate(doc, json_report.schema())
    assert doc["format"] == "racecheck-findings" and doc["version"] == 1
    assert doc["tool"]["name"] == "racecheck"
    p = tmp_path / "f.json"
    p.write_text(json.dumps(doc))
    back = load_findings(p)
    assert back == findings
    assert [f.fingerprint() for f in back] == [d["fingerprint"] for d in doc["findings"]]


def test_schema_is_package_data():
    from importlib import resources
    assert resources.files("racecheck.reports").joinpath("findings.schema.json").is_file()


@pytest.mark.parametrize("content,needle", [
    ("{not json", "not valid JSON"),
    ('{"format": "sarif"}', "not a racecheck findings file"),
    ('[1, 2]', "not a racecheck findings file"),
    ('{"format": "racecheck-findings", "version": 99, "findings": []}', "unsupported findings version"),
    ('{"format": "racecheck-findings", "version": 1, "tool": {"name": "x", "version": "1"},'
     ' "findings": [{"rule": "RC001"}]}', "invalid findings file"),
])
def test_load_findings_rejects_corrupt_or_foreign(tmp_path, content, needle):
    p = tmp_path / "bad.json"
    p.write_text(content)
    with pytest.raises(UsageError, match=needle) as ei:
        load_findings(p)
    assert "\n" not in str(ei.value)


def test_load_findings_missing_file(tmp_path):
    with pytest.raises(UsageError, match="no such file"):
        load_findings(tmp_path / "nope.json")


# -- SARIF --------------------------------------------------------------------------------------

def test_sarif_valid_against_official_schema(findings):
    doc = json.loads(render("sarif", findings, {"scenario": "eagle-v2", "variant": "no-mrope_recompute",
                                                "category": "racecheck-sim",
                                                "stale_suppressions": ["RC003 foo *  # old"]}))
    assert sarif_errors(doc) == []
    assert doc["version"] == "2.1.0" and doc["$schema"].endswith("sarif-2.1.0.json")
    run = doc["runs"][0]
    rules = run["tool"]["driver"]["rules"]
    assert [r["id"] for r in rules][:9] == list(RULES)
    for r in rules:  # GitHub requires these, non-empty
        assert r["shortDescription"]["text"] and r["fullDescription"]["text"] and r["help"]["text"]
        assert len(r["fullDescription"]["text"]) <= 1024
    res = run["results"]
    assert len(res) == len(findings)           # three root causes, one finding each
    [r0] = [r for r in res if r["properties"]["tensor"] == "mrope_positions"]
    assert r0["ruleId"] == "RC001" and rules[r0["ruleIndex"]]["id"] == "RC001"
    assert "mrope_positions" in r0["message"]["text"]
    loc = r0["locations"][0]["physicalLocation"]
    assert loc["artifactLocation"]["uri"] == "racecheck/scenarios/eagle_v2.py"
    assert loc["region"]["startLine"] == 412
    rel = r0["relatedLocations"][0]["physicalLocation"]
    assert rel["region"]["startLine"] == 298
    assert r0["partialFingerprints"]["racecheck/group/v1"] == assign_groups(findings)[0].group_id()
    assert r0["properties"]["fingerprints"] == [findings[0].fingerprint()]
    assert len(r0["codeFlows"][0]["threadFlows"]) == 2
    assert run["automationDetails"]["id"] == "racecheck-sim/"
    assert "stale suppression" in run["invocations"][0]["toolExecutionNotifications"][0]["message"]["text"]


def test_sarif_fingerprints_stable(findings):
    a = json.loads(render("sarif", findings))
    b = json.loads(render("sarif", list(reversed(findings))))
    fa = sorted(r["partialFingerprints"]["racecheck/group/v1"] for r in a["runs"][0]["results"])
    fb = sorted(r["partialFingerprints"]["racecheck/group/v1"] for r in b["runs"][0]["results"])
    assert fa == fb and len(set(fa)) == len(findings)


def test_sarif_edge_cases_still_valid(findings):
    bare = Finding(rule="RC008", tensor="draft_done", suggestion="record before waiting",
                   current=Access(op="wait_event", stream="plan_stream", kind="wait", location=""),
                   previous=Access(op="add_", stream="default", kind="write", location="/abs/x y.py:7:3"))
    nowhere = Finding(rule="DIFF", tensor="mm_input_embeds", suggestion="keep mm_input_embeds",
                      current=Access(op="replay", stream="default", kind="read", location=""),
                      previous=Access(op="replay", stream="default", kind="read", location=""))
    doc = sarif.to_sarif([bare, nowhere], suppressed=findings[:1], baselined=findings[1:2], root="/abs")
    assert sarif_errors(doc) == []
    res = doc["runs"][0]["results"]
    assert res[0]["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] == "x%20y.py"
    assert res[0]["locations"][0]["physicalLocation"]["region"] == {"startLine": 7, "startColumn": 3}
    assert res[2]["suppressions"][0]["kind"] == "external"
    assert res[3]["baselineState"] == "unchanged"


# -- JUnit --------------------------------------------------------------------------------------

def test_junit_cases_and_failures(findings):
    meta = {"scenario": "eagle-v2", "device": "sim", "cases": [
        {"name": "eagle-v2[all-fixes]", "fingerprints": [], "time": 1.5},
        {"name": "eagle-v2[no-mrope_recompute]", "fingerprints": [findings[0].fingerprint()], "file": "scenarios/eagle_v2.py"},
        {"name": "eagle-v2[no-req_pool_padding_zero]", "fingerprints": [findings[1].fingerprint()]},
        {"name": "eagle-v2[cuda]", "skipped": "no GPU"},
    ]}
    root = ET.fromstring(render("junit", findings, meta))
    assert root.tag == "testsuites"
    suite = root.find("testsuite")
    cases = suite.findall("testcase")
    names = [c.get("name") for c in cases]
    assert names[:4] == [c["name"] for c in meta["cases"]]
    assert names[4] == "eagle-v2", "unclaimed findings get their own case"
    assert suite.get("tests") == "5" and suite.get("failures") == "3" and suite.get("skipped") == "1"
    assert cases[0].find("failure") is None
    fail = cases[1].find("failure")
    assert fail.get("type") == "RC001" and "mrope_positions" in fail.get("message")
    assert "plan_stream" in fail.text and "fix:" in fail.text and "eagle_v2.py:298" in fail.text
    assert cases[1].get("file") == "scenarios/eagle_v2.py" and cases[1].get("classname") == "racecheck.sim"
    assert cases[3].find("skipped") is not None
    assert float(suite.get("time")) == pytest.approx(1.5)


def test_junit_clean_run_has_one_passing_case():
    root = ET.fromstring(render("junit", [], {"scenario": "eagle-v2", "variant": "all-fixes"}))
    (case,) = root.iter("testcase")
    assert case.get("name") == "eagle-v2[all-fixes]" and len(case) == 0


# -- Perfetto -----------------------------------------------------------------------------------

def test_perfetto_trace_event_rules(findings):
    trace = json.loads(render("perfetto", findings))
    check_trace_events(trace)
    ev = trace["traceEvents"]
    names = {e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "thread_name" and e["pid"] == 1}
    assert {"plan_stream", "forward_stream"} <= names
    race_flows = [e for e in ev if e["ph"] == "s" and e["cat"] == "race"]
    assert len(race_flows) == len(findings)
    sync_flows = [e for e in ev if e["ph"] == "s" and e["cat"] == "sync" and e["pid"] == 1]
    assert len(sync_flows) == 1, "record draft_done -> wait draft_done"
    racing = [e for e in ev if e["ph"] == "X" and e["pid"] == 1 and e["args"].get("race")]
    assert {e["args"]["race"] for e in racing} == {"current", "previous"}


def test_perfetto_without_context():
    f = Finding(rule="RC002", tensor="kv_cache", suggestion="wait",
                current=Access(op="copy_", stream="copy", kind="write", location="a.py:1"),
                previous=Access(op="bmm", stream="decode", kind="read", location="b.py:2"))
    check_trace_events(perfetto.to_trace([f]))


def test_timeline_handles_colliding_seqs():
    from racecheck.reports.timeline import build
    f = Finding(rule="RC001", tensor="t", suggestion="s",
                current=Access(op="mul", stream="a", kind="read", location="", seq=5),
                previous=Access(op="add_", stream="b", kind="write", location="", seq=5),
                context=(ContextEvent(seq=5, timeline="c", kind="kernel", label="other"),))
    tl = build(f)
    assert len({o.seq for o in tl.ops}) == len(tl.ops) == 3
    assert {tl.op(s).role for s in tl.race} == {"current", "previous"}
