"""`racecheck list` and `racecheck run` on the eagle-v2 scenario."""
import json

import pytest

from racecheck.cli.main import main

def test_list_shows_scenarios_knobs_switches_variants(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    for text in ("eagle-v2", "plan_stream", "buckets", "draft_done_event", "#21940",
                 "no-mrope_recompute", "no-war_barrier"):
        assert text in out, text


def test_list_json(capsys):
    assert main(["list", "eagle-v2", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    [sc] = doc["scenarios"]
    assert sc["name"] == "eagle-v2"
    assert {v["name"] for v in sc["variants"]} >= {"no-mm_input_copy", "no-req_pool_padding_zero"}
    assert {k["name"] for k in sc["knobs"]} >= {"plan_stream", "schedule", "war_barrier"}


def test_run_variant_shows_its_bug_with_no_other_flag(capsys, tmp_path):
    report = tmp_path / "f.json"
    assert main(["run", "eagle-v2", "--variant", "no-mrope_recompute", "--report", f"json={report}"]) == 1
    out = capsys.readouterr().out
    assert "RC001" in out and "compute_spec_mrope_positions" in out and "plan_stream" in out
    assert "repro: racecheck run eagle-v2 --variant no-mrope_recompute" in out
    doc = json.loads(report.read_text())
    assert any(f["rule"] == "RC001" and f["tensor"] == "mrope_positions" for f in doc["findings"])


def test_run_lost_field_fails_on_the_differential_oracle(capsys):
    assert main(["run", "eagle-v2", "--variant", "no-mm_input_copy"]) == 1
    out = capsys.readouterr().out
    assert "differential: MISMATCH" in out and "mm_input_embeds" in out


def test_plain_run_is_clean(capsys, tmp_path):
    report = tmp_path / "f.json"
    code = main(["run", "eagle-v2", "--set", "plan_stream=on", "--report", f"json={report}"])
    out = capsys.readouterr().out
    findings = json.loads(report.read_text())["findings"]
    assert "differential: outputs equal the serialized run" in out
    assert findings == []
    assert code == 0, out


@pytest.mark.parametrize("argv, message", [
    (["run", "eagle-v3"], "unknown scenario 'eagle-v3' (known: eagle-v2"),
    (["run", "eagle-v2", "--variant", "no-such"], "unknown variant 'no-such' of scenario 'eagle-v2'"),
    (["run", "eagle-v2", "--set", "nope=1"], "unknown knob 'nope' for scenario 'eagle-v2'"),
    (["run", "eagle-v2", "--set", "topk=x"], "bad value 'x' for knob 'topk'"),
    (["run", "eagle-v2", "--set", "plan_stream"], "expected KNOB=VALUE"),
    (["run", "eagle-v2", "--seed", "abc"], "--seed 'abc': expected an integer"),
    (["list", "nope"], "unknown scenario 'nope'"),
])
def test_usage_errors_exit_2_with_one_line(capsys, argv, message):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err
    assert len(err.strip().splitlines()) == 1, err
