"""Console-script launchers (`racecheck`, `pytest` in the venv's bin) never show up in stacks."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

BIN = os.path.dirname(sys.executable)

PROGRAM = textwrap.dedent("""
    import torch
    def main():
        s = torch.cuda.Stream()
        x = torch.zeros(8, device="cuda")
        torch.cuda.synchronize()
        with torch.cuda.stream(s):
            x.add_(1)
        y = x * 2
    main()
""")

TEST = textwrap.dedent("""
    import torch
    def test_race():
        s = torch.cuda.Stream()
        x = torch.zeros(8, device="cuda")
        torch.cuda.synchronize()
        with torch.cuda.stream(s):
            x.add_(1)
        y = x * 2
""")


def _stacks(report) -> list:
    doc = json.loads(report.read_text())
    assert doc["findings"]
    return [frame for f in doc["findings"] for side in ("current", "previous")
            for frame in f[side].get("stack") or ()]


def _launcher(name):
    path = os.path.join(BIN, name)
    if not os.path.exists(path):
        pytest.skip(f"no {name} launcher next to the interpreter")
    return path


def test_racecheck_launcher_frame_is_left_out(tmp_path):
    prog = tmp_path / "prog.py"
    prog.write_text(PROGRAM)
    report = tmp_path / "f.json"
    proc = subprocess.run([_launcher("racecheck"), "exec", "--quiet", "--report", f"json={report}", "--",
                           "python", str(prog)], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert proc.returncode == 1, proc.stderr
    frames = _stacks(report)
    assert any(fr.startswith("prog.py:") for fr in frames)
    assert not [fr for fr in frames if fr.startswith("racecheck:")], frames


def test_pytest_launcher_frame_is_left_out(tmp_path):
    (tmp_path / "test_race.py").write_text(TEST)
    report = tmp_path / "f.json"
    proc = subprocess.run([_launcher("pytest"), "-q", "-p", "no:cacheprovider", "--racecheck",
                           f"--racecheck-report=json={report}", "test_race.py"],
                          capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    frames = _stacks(report)
    assert any(fr.startswith("test_race.py:") for fr in frames)
    assert not [fr for fr in frames if fr.split(":")[0] in ("pytest", "__main__.py")], frames
