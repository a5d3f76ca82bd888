"""Command-line rough edges: --version, closed pipes, negative values, empty and cut files, wrapping."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from helpers import in_session
from test_fuzz_toy import toy_registered  # noqa: F401  (fixture: toy-pipeline registered)
from test_repro import _record
from racecheck import __version__
from racecheck.cli import main as cli
from racecheck.core.trace import Trace

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_version(capsys):
    assert cli.main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"racecheck {__version__}"


def test_a_closed_pipe_is_quiet_and_not_an_internal_error():
    code = ("import os, sys\n"
            "r, w = os.pipe(); os.close(r); os.dup2(w, 1)   # the reader is gone, as after `| head -1`\n"
            "from racecheck.cli.main import main\n"
            "sys.exit(main(['list', '--json']))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 141 and proc.stderr == "", proc.stderr


@pytest.mark.parametrize("argv, text", [
    (["fuzz", "eagle-v2", "--budget", "-5s"], "--budget '-5s': must be positive"),
    (["fuzz", "eagle-v2", "--max-examples", "-3"], "--max-examples must be >= 1"),
])
def test_negative_values_reach_their_own_check(capsys, argv, text):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert text in err and "expected one argument" not in err and len(err.splitlines()) == 1, err


def test_an_empty_trace_says_empty(tmp_path, capsys):
    p = tmp_path / "t.jsonl"
    p.write_text("")
    assert cli.main(["check", str(p)]) == 2
    err = capsys.readouterr().err.strip()
    assert "empty file" in err and "not JSON" not in err and len(err.splitlines()) == 1, err


def test_json_errors_read_naturally(tmp_path, capsys):
    p = tmp_path / "r.json"
    p.write_text('{"format": "abc')
    assert cli.main(["repro", str(p)]) == 2
    err = capsys.readouterr().err
    assert "at at" not in err and "starting at, line 1 column" in err, err
    p.write_text("\n")
    assert cli.main(["repro", str(p)]) == 2
    assert "is empty" in capsys.readouterr().err


def _racy(rc):
    import torch
    import racecheck
    dm = rc.device_module
    s = dm.Stream()
    x = racecheck.name(torch.zeros(8), "seq_lens")
    dm.synchronize()
    with dm.stream(s):
        x.add_(1)
    y = x * 2  # noqa: F841
    return locals()     # alive until the session ends


def test_a_trace_cut_at_a_line_boundary_is_flagged(tmp_path, capsys):
    p = tmp_path / "t.jsonl"
    in_session(_racy, record_trace=True).save_trace(str(p))
    assert Trace.is_complete(p)
    assert cli.main(["check", str(p)]) == 1
    assert "cut short" not in capsys.readouterr().err
    lines = p.read_text().splitlines(keepends=True)
    p.write_text("".join(lines[:-2]))             # the last event and the end line are gone
    assert not Trace.is_complete(p)
    cli.main(["check", str(p)])
    err = capsys.readouterr().err
    assert "warning" in err and "cut short" in err, err


def test_repro_panels_wrap_instead_of_cropping(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "60")
    path, out = _record(tmp_path)
    assert cli.main(["repro", path]) == 1
    text = capsys.readouterr().out
    words = set(re.findall(r"[^\s│╭╮╰╯─]+", text))
    [finding] = [f for f in out.findings if f.rule == "RC001"][:1]
    missing = [w for w in finding.suggestion.split() if w not in words]
    assert not missing, (missing, text)


@pytest.mark.parametrize("command", ["report", "baseline"])
def test_an_empty_findings_file_says_empty(tmp_path, capsys, command):
    p = tmp_path / "f.json"
    p.write_text("\n")
    assert cli.main([command, str(p)]) == 2
    err = capsys.readouterr().err.strip()
    assert "empty file" in err and len(err.splitlines()) == 1, err


@pytest.mark.parametrize("argv, text", [
    (["run", "eagle-v2", "--plan", "{not json"], "--plan: not a JSON object"),
    (["run", "eagle-v2", "--plan", '{"priorities": {"forward_stream": "fast"}}'], "--plan: "),
    (["run", "eagle-v2", "--device", "cuda", "--plan", "{}"], "--plan orders device work on sim only"),
])
def test_run_plan_errors_are_one_line(capsys, argv, text):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert text in err and len(err.splitlines()) == 1, err


def test_run_plan_from_a_file_is_shown_and_kept_in_the_repro_line(tmp_path, capsys):
    plan = tmp_path / "plan.json"
    plan.write_text('{"priorities": {"default": 3, "plan_stream": -1}, "host": 1}')
    code = cli.main(["run", "eagle-v2", "--variant", "no-draft_done_event", "--plan", str(plan)])
    out = capsys.readouterr().out
    assert code == 1 and "executor: adversarial, plan" in out
    assert "--plan" in out.split("repro:", 1)[1]


def test_run_saves_the_trace_check_reads(tmp_path, capsys):
    """`racecheck run --save-trace`: the instrumented run's trace, written by the process that ran
    it, gives the same findings when checked again offline."""
    import json
    trace = tmp_path / "run.jsonl"
    report = tmp_path / "run.json"
    assert cli.main(["run", "eagle-v2", "--variant", "no-draft_done_event", "--save-trace",
                     str(trace), "--report", f"json={report}"]) == 1
    checked = tmp_path / "check.json"
    assert cli.main(["check", str(trace), "--report", f"json={checked}"]) == 1
    fingerprints = [sorted(f["fingerprint"] for f in json.loads(p.read_text())["findings"])
                    for p in (report, checked)]
    assert fingerprints[0] and fingerprints[0] == fingerprints[1]


def test_run_refuses_a_trace_path_it_cannot_write_before_running(tmp_path, capsys):
    assert cli.main(["run", "eagle-v2", "--save-trace", str(tmp_path / "no" / "t.jsonl")]) == 2
    err = capsys.readouterr()
    assert "--save-trace" in err.err and "racecheck run eagle-v2 on" not in err.out
