"""The front door, unchanged, on other sglang releases than the one in the test environment.

Each environment named in RACECHECK_SGLANG_RELEASES (`VERSION=VENV,...`, set up by
`SGLANG=VERSION VENV=DIR bash scripts/setup.sh`; .ci/run sets up the oldest supported release
and one from the middle) runs `racecheck run` as shipped and with one seed dropped, in its own
interpreter: the release's own imports, constructors and event loop.
"""
import json
import os
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SEED = "sglang.srt.speculative.eagle_worker_common:run_eagle_verify:wait_stream#0"


def _releases():
    out = []
    for item in filter(None, os.environ.get("RACECHECK_SGLANG_RELEASES", "").split(",")):
        version, _, venv = item.partition("=")
        out.append(pytest.param(version, os.path.abspath(venv), id=version))
    return out or [pytest.param(None, None, marks=pytest.mark.skip(
        reason="RACECHECK_SGLANG_RELEASES names no release environment (.ci/run sets two up)"))]


def _run(venv, tmp_path, *args):
    report = tmp_path / "run.json"
    proc = subprocess.run([os.path.join(venv, "bin", "python"), "-m", "racecheck", "run",
                           "sglang-eagle-v2", "--set", "graphs=off", "--all",
                           "--report", f"json={report}", *args],
                          capture_output=True, text=True, timeout=1500, cwd=ROOT)
    assert proc.returncode in (0, 1), proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads(report.read_text())
    return proc, {(f["rule"], f["tensor"]) for f in doc["findings"]}


@pytest.mark.parametrize("version,venv", _releases())
def test_the_release_runs_through_the_front_door(version, venv, tmp_path):
    import importlib.metadata  # noqa: F401  (the release's own version is what runs)
    probe = subprocess.run([os.path.join(venv, "bin", "python"), "-c",
                            "import importlib.metadata as m; print(m.version('sglang'))"],
                           capture_output=True, text=True, timeout=60)
    assert probe.stdout.strip() == version, probe.stdout + probe.stderr
    proc, shipped = _run(venv, tmp_path)
    assert "differential: outputs equal the serialized run" in proc.stdout, proc.stdout[-2000:]
    # what the release reports as shipped beyond the start-up writes is in docs/HISTORY.md
    startup = {f for f in shipped if f[0] in ("RC001", "RC003")}
    assert startup, "the start-up writes on the default stream are reported on every release"
    proc, dropped = _run(venv, tmp_path, "--set", "graphs=on", "--drop-sync", SEED)
    assert ("RC001", "ForwardBatch.positions") in dropped or \
        ("RC001", "ForwardBatch.input_ids") in dropped, sorted(dropped)
