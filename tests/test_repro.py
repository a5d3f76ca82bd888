"""`racecheck repro FILE`: deterministic replay of repro records; bad files are one-line errors."""
from __future__ import annotations

import json
import os

import pytest

from test_fuzz_toy import toy_registered  # noqa: F401  (fixture: toy-pipeline registered)
from racecheck.cli import main as cli
from racecheck import scenarios
from racecheck.drivers.fuzz import (FORMAT, finding_key, load_record, make_record, record_filename, replay,
                             save_record)
from racecheck.core.errors import UsageError
from racecheck.drivers.fuzz import FuzzTarget

LATE_PRODUCER = {"priorities": {}, "host": 0, "change_points": [],
                 "holds": [{"stream": "side", "before_op": 0, "us": 5}]}


def _record(tmp_path, variant="no-event_fix", plan=None, key="RC001 buf", overrides=None):
    sc = scenarios.get("toy-pipeline")
    cfg = sc.config(variant, dict({"iterations": 1, "schedule": "0:+1"}, **(overrides or {})))
    target = FuzzTarget("toy-pipeline", variant)
    out = target.run({"config": cfg, "seed": 0, "plan": plan})
    rec = make_record(scenario="toy-pipeline", variant=variant, device="sim", seed=0, config=cfg, plan=plan,
                      key=key, findings=out.findings, diff_ok=out.result.diff_ok,
                      diff_detail=out.result.diff_detail)
    return save_record(rec, str(tmp_path)), out


def test_a_record_replays_to_the_same_finding_10_out_of_10(tmp_path, capsys):
    path, _ = _record(tmp_path)
    assert cli.main(["repro", path, "--repeat", "10"]) == 1
    out = capsys.readouterr().out
    assert "reproduced: RC001 buf (10/10 replays)" in out
    assert "RC001" in out and "buf" in out and "side" in out      # the finding is shown


def test_replays_are_deterministic_down_to_the_values(tmp_path):
    path, _ = _record(tmp_path, plan=LATE_PRODUCER, key="DIFF acc")
    rec = load_record(path)
    runs = [replay(rec) for _ in range(10)]
    assert all(r.reproduced for r in runs)
    assert len({json.dumps(r.outcome.result.outputs, sort_keys=True) for r in runs}) == 1


def test_the_wrong_value_is_shown_when_the_plan_makes_it_visible(tmp_path, capsys):
    path, out = _record(tmp_path, plan=LATE_PRODUCER, key="DIFF acc")
    assert not out.result.diff_ok
    assert cli.main(["repro", path]) == 1
    text = capsys.readouterr().out
    assert "wrong value" in text and "acc of request" in text and "reproduced: DIFF acc" in text


def test_a_fixed_program_no_longer_reproduces_exit_0(tmp_path, capsys):
    path, _ = _record(tmp_path)
    rec = json.loads(open(path).read())
    rec["config"]["event_fix"] = True                       # the fix landed
    with open(path, "w") as fh:
        json.dump(rec, fh)
    assert cli.main(["repro", path]) == 0
    assert "no longer reproduces: RC001 buf" in capsys.readouterr().out


def test_records_are_version_independent(tmp_path):
    path, _ = _record(tmp_path)
    rec = json.loads(open(path).read())
    rec["racecheck_version"] = "0.0.1"
    rec.pop("search", None)
    rec.pop("observed", None)
    rec.pop("created", None)
    with open(path, "w") as fh:
        json.dump(rec, fh)
    assert replay(load_record(path)).reproduced


def _write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text)
    return str(p)


@pytest.mark.parametrize("content, text", [
    ("{not json", "not a racecheck repro record (not JSON"),
    ("[1, 2]", "not a racecheck repro record"),
    ('{"traceEvents": []}', "not a racecheck repro record"),
    (json.dumps({"format": FORMAT, "format_version": 99, "scenario": "toy-pipeline", "config": {},
                 "failure": {"key": "RC001 buf"}}), "format_version 99"),
    (json.dumps({"format": FORMAT, "format_version": 1, "scenario": "toy-pipeline"}), "missing config, failure"),
    (json.dumps({"format": FORMAT, "format_version": 1, "scenario": "nope", "config": {},
                 "failure": {"key": "RC001 buf"}}), "unknown scenario"),
    (json.dumps({"format": FORMAT, "format_version": 1, "scenario": "toy-pipeline", "config": {},
                 "failure": {"key": "RC001 buf"}, "plan": {"host": "fast"}}), "bad executor plan"),
    (json.dumps({"format": FORMAT, "format_version": 1, "scenario": "toy-pipeline",
                 "config": {"iterations": "many"}, "failure": {"key": "RC001 buf"}}), "iterations"),
    ("\xff\xfe garbage", "not a racecheck repro record"),
])
def test_corrupt_or_foreign_files_are_one_line_usage_errors(tmp_path, capsys, content, text):
    path = _write(tmp_path, "x.json", content)
    assert cli.main(["repro", path]) == 2
    err = capsys.readouterr().err.strip()
    assert text in err and len(err.splitlines()) == 1, err


def test_missing_file_and_directory(tmp_path, capsys):
    assert cli.main(["repro", str(tmp_path / "nope.json")]) == 2
    assert "no such file" in capsys.readouterr().err
    assert cli.main(["repro", str(tmp_path)]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_load_record_raises_usage_error():
    with pytest.raises(UsageError):
        load_record(os.devnull)


def test_record_file_names_are_stable_per_failure():
    a = record_filename("eagle-v2", "no-futuremap_publish", "RC001 seq_lens")
    assert a == record_filename("eagle-v2", "no-futuremap_publish", "RC001 seq_lens")
    assert a != record_filename("eagle-v2", "no-futuremap_publish", "RC006 seq_lens")
    assert a.startswith("eagle-v2-no-futuremap_publish-RC001-seq_lens-") and a.endswith(".json")


def test_finding_keys_of_unnamed_tensors_do_not_carry_storage_numbers():
    from racecheck.core.findings import Access, Finding
    acc = Access(op="add_", stream="s", kind="read", location="x.py:3")
    f = Finding("RC001", "unnamed tensor (storage #12, bytes 0..7)", acc, acc, "")
    assert finding_key(f) == "RC001 unnamed@x.py:3"
    f = Finding("RC001", "unnamed tensor (first used by empty at eagle.py:322; bytes 0..31)", acc, acc, "")
    assert finding_key(f) == "RC001 unnamed@x.py:3"


def test_one_race_is_one_failure_whichever_name_its_tensor_got():
    """A holder's name and the creating statement's name of one tensor give one key (which of
    them a finding carries depends on the views alive when it is made); other identifiers, and
    names of another shape, stay apart."""
    from racecheck.core.findings import Access, Finding
    acc = Access(op="add_", stream="s", kind="read", location="x.py:3")

    def key(tensor, rule="RC001"):
        return finding_key(Finding(rule, tensor, acc, acc, ""))
    assert key("KVLocPlan.seq_lens") == key("resolve_seq_lens_cpu: batch.seq_lens") \
        == key("seq_lens") == key("f: self.seq_lens[0]") == "RC001 seq_lens"
    assert key("EagleVerifyInput.custom_mask") == key("ForwardMetadata.custom_mask")
    assert key("ForwardBatch.seq_lens") != key("ForwardBatch.seq_lens", "RC002")
    assert key("ForwardBatch.out_cache_loc") != key("ForwardBatch.seq_lens")
    assert key("try_small_copy(dst=...)") == "RC001 try_small_copy(dst=...)"
    assert key("draft: returned value") == "RC001 draft: returned value"
