"""racecheck.drivers.mutate's report: regressions against a reviewed table, and SARIF that validates."""
import json
import pathlib

import jsonschema

from racecheck.drivers.mutate import NECESSARY, SILENT, MutationReport, SiteResult, to_sarif

DATA = pathlib.Path(__file__).parent / "data"


def _report(**verdicts) -> MutationReport:
    sites = [SiteResult(f"pkg.mod:fn:wait_stream#{i}", "wait_stream", f"mod.py:{10 + i}", 3,
                        verdict=v, exposes=[("RC001", "seq_lens")] if v == NECESSARY else [])
             for i, v in enumerate(verdicts.values())]
    return MutationReport("toy", {}, [], sites)


def test_a_necessary_site_turned_silent_or_gone_is_a_regression():
    before = _report(a=NECESSARY, b=NECESSARY, c=SILENT).to_json()
    now = _report(a=NECESSARY, b=SILENT)            # site #2 no longer runs
    assert now.regressions(before) == [("pkg.mod:fn:wait_stream#1", "now silent: dropping it exposes nothing")]
    before["sites"].append({"id": "pkg.mod:gone:wait_event#0", "verdict": NECESSARY})
    assert [i for i, _ in now.regressions(before)] == ["pkg.mod:fn:wait_stream#1",
                                                       "pkg.mod:gone:wait_event#0"]


def test_no_regression_when_necessary_sites_stay_necessary():
    before = _report(a=NECESSARY, b=SILENT).to_json()
    assert _report(a=NECESSARY, b=NECESSARY).regressions(before) == []


def test_sarif_validates_and_marks_regressions_as_errors():
    schema = json.loads((DATA / "sarif-schema-2.1.0.json").read_text())
    report = _report(a=NECESSARY, b=SILENT)
    doc = to_sarif(report, [("pkg.mod:fn:wait_stream#1", "now silent"), ("pkg.mod:gone:x#0", "gone")])
    jsonschema.validate(doc, schema)
    levels = [r["level"] for r in doc["runs"][0]["results"]]
    assert levels == ["note", "error", "error"]
