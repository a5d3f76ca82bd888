"""`racecheck fuzz SCENARIO --every-variant` (the main job's tour) and scripts/setup.sh's choices."""
from __future__ import annotations

import json
import os
import stat
import subprocess

import pytest

from test_fuzz_toy import toy_registered  # noqa: F401  (fixture: toy-pipeline registered)
from racecheck.cli import main as cli

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_the_tour_shows_the_clean_pipeline_then_each_variant_found(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    status = cli.main(["fuzz", "toy-pipeline", "--every-variant", "--budget", "20s", "--db", "none",
                       "--seed", "1", "--quiet", "--report", "json=tour.json"])
    out = capsys.readouterr().out
    assert status == 0, out
    lines = out.splitlines()
    row = {ln.split()[0]: ln for ln in lines if ln.strip().startswith(("(all", "no-"))
           and "racecheck repro" not in ln}
    assert "clean" in row["(all"] and "yes" in row["(all"]
    assert "RC001 buf" in row["no-event_fix"] and "yes" in row["no-event_fix"]
    assert "RC004 h" in row["no-d2h_sync"] and "yes" in row["no-d2h_sync"]
    repros = [ln for ln in lines if "racecheck repro racecheck-findings/" in ln]
    assert len(repros) == 2 and all(os.path.exists(ln.split("racecheck repro ")[1]) for ln in repros)
    doc = json.loads((tmp_path / "tour.json").read_text())
    assert {(f["rule"], f["tensor"]) for f in doc["findings"]} == {("RC001", "buf"), ("RC004", "h")}


@pytest.mark.parametrize("extra", [["--variant", "no-event_fix"], ["--workers", "2"], ["--max-examples", "5"]])
def test_the_tour_picks_its_own_variants_and_limits(capsys, extra):
    assert cli.main(["fuzz", "toy-pipeline", "--every-variant", *extra]) == 2
    assert "--every-variant" in capsys.readouterr().err


STUB = """#!/usr/bin/env bash
echo "$*" >> "$STUB_LOG"
case "$*" in
  *"import torch; print"*) [ -n "${HAVE_TORCH:-}" ] && { echo 2.13.0+cpu; exit 0; }; exit 1;;
esac
exit 0
"""


def _setup(tmp_path, **env):
    """Run scripts/setup.sh against a stub interpreter that logs what it is asked to do."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    stub = venv / "bin" / "python"
    stub.write_text(STUB)
    stub.chmod(stub.stat().st_mode | stat.S_IEXEC)
    log = tmp_path / "log"
    proc = subprocess.run(["bash", os.path.join(ROOT, "scripts", "setup.sh")], capture_output=True, text=True,
                          env=dict(os.environ, VENV=str(venv), STUB_LOG=str(log), **env), timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout, [ln for ln in log.read_text().splitlines() if ln.startswith("-m pip")]


def test_setup_keeps_an_importable_torch(tmp_path):
    out, pip = _setup(tmp_path, HAVE_TORCH="1")
    assert "torch 2.13.0+cpu already importable, kept" in out
    assert not [p for p in pip if "torch==" in p], pip


def test_setup_installs_torch_from_the_chosen_index_with_progress(tmp_path):
    out, pip = _setup(tmp_path, TORCH_INDEX_URL="https://example.invalid/whl/cpu", TORCH_VERSION="2.13.0")
    [torch] = [p for p in pip if "torch==" in p]
    assert "--index-url https://example.invalid/whl/cpu" in torch and "torch==2.13.0" in torch
    assert all("-q" not in p.split() for p in pip) and all("--progress-bar on" in p for p in pip)
    assert any("-e .[test,triton,sglang]" in p for p in pip)


def test_setup_without_an_index_says_how_to_get_the_cpu_build(tmp_path):
    out, pip = _setup(tmp_path, SETUP_ENGINES="0")
    assert "TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu" in out
    assert any(p.endswith("-e .[test]") for p in pip)
