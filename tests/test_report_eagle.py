"""Done-when for issue 6: every format from the findings of a fix-off EAGLE v2 variant, checked;
baseline round trip (a baseline taken on a variant passes the gate, a new race on top fails it)."""
from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import jsonschema
import pytest

from racecheck.reports import FORMATS, load_findings, write_reports
from racecheck.reports import json_report
from racecheck.core.suppressions import baseline_document, filter_findings

scenarios = pytest.importorskip("racecheck.scenarios")
if not hasattr(scenarios, "get") or not hasattr(scenarios, "run"):
    pytest.skip("racecheck.scenarios has no get()/run() yet", allow_module_level=True)

from test_report_formats import check_trace_events, sarif_errors  # noqa: E402
from test_report_html import CHROMIUM, _chromium, count_color, read_png  # noqa: E402

VARIANT = "no-mrope_recompute"


def _run(variant):
    sc = scenarios.get("eagle-v2")
    return scenarios.run(sc, sc.config(variant=variant))


@pytest.fixture(scope="module")
def variant_findings():
    res = _run(VARIANT)
    assert res.findings, "a fix-off variant must have findings"   # which ones: the scenario tests
    return res.findings


@pytest.fixture(scope="module")
def reports(variant_findings, tmp_path_factory):
    out = tmp_path_factory.mktemp("eagle-reports")
    meta = {"scenario": "eagle-v2", "variant": VARIANT, "device": "sim"}
    write_reports(variant_findings, [f"{fmt}={out / ('report.' + fmt)}" for fmt in FORMATS], meta)
    return out


def test_json_against_schema(reports, variant_findings):
    doc = json.loads((reports / "report.json").read_text())
    jsonschema.validate(doc, json_report.schema())
    assert load_findings(reports / "report.json") == variant_findings


def test_sarif_against_schema(reports, variant_findings):
    doc = json.loads((reports / "report.sarif").read_text())
    assert sarif_errors(doc) == []
    results = doc["runs"][0]["results"]
    assert len(results) == len(variant_findings)
    for r in results:
        if "locations" in r:
            uri = r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"]
            assert not uri.startswith("/") and uri.endswith(".py"), uri
    assert any(r.get("relatedLocations") for r in results)


def test_junit_parsed(reports):
    root = ET.parse(reports / "report.junit").getroot()
    (case,) = root.iter("testcase")
    assert case.get("name") == f"eagle-v2[{VARIANT}]"
    assert case.find("failure") is not None and "fix:" in case.find("failure").text


def test_perfetto_loads(reports):
    check_trace_events(json.loads((reports / "report.perfetto").read_text()))


@pytest.mark.skipif(CHROMIUM is None, reason="headless Chromium not installed (apt-get install chromium)")
def test_html_screenshot_shows_timeline(reports, tmp_path, variant_findings):
    from racecheck.reports.html_report import CURRENT_COLOR, PREVIOUS_COLOR
    page = reports / "report.html"
    dom = _chromium(["--dump-dom", "--virtual-time-budget=2000", page.as_uri()], tmp_path)
    assert f"rendered {len(variant_findings)} timeline(s)" in dom.stdout
    # the screenshot: a page of the first race alone, so its timeline is in the first screenful
    from racecheck.reports import render
    first = next(f for f in variant_findings if f.rule != "DIFF")
    single = tmp_path / "first.html"
    single.write_text(render("html", [first], {"scenario": "eagle-v2", "variant": VARIANT}))
    shot = tmp_path / "eagle.png"
    _chromium([f"--screenshot={shot}", "--window-size=1400,800", single.as_uri()], tmp_path)
    _, _, pixels = read_png(shot)
    assert count_color(pixels, CURRENT_COLOR) > 1500 and count_color(pixels, PREVIOUS_COLOR) > 1500


def test_baseline_round_trip(variant_findings):
    base = baseline_document(variant_findings)
    assert filter_findings(variant_findings, baseline=base).exit_code == 0
    other = _run("no-futuremap_publish").findings          # a new race on top of the accepted ones
    new = [f for f in other if f.fingerprint() not in {g.fingerprint() for g in variant_findings}]
    assert new
    res = filter_findings([*variant_findings, *new], baseline=base)
    assert res.exit_code == 1 and res.kept == new

