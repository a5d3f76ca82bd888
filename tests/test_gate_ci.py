"""ci/: the gate script (exit codes, reports, suppressions/baseline) and the workflow templates."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(__file__).parent / "data"
FINDINGS = DATA / "findings_eagle.json"
WORKFLOWS = sorted((ROOT / "ci" / "workflows").glob("*.yml"))


def gate(*args, env=None, cwd=None):
    return subprocess.run([sys.executable, str(ROOT / "ci" / "gate"), *map(str, args)], capture_output=True,
                          text=True, timeout=300, env=env, cwd=cwd)


class Result:
    def __init__(self, code, out, err):
        self.returncode, self.stdout, self.stderr = code, out, err


def gate_inproc(capsys, *args):
    """`python -m racecheck.cli.gate` in this process (the script itself is tested once, by subprocess)."""
    from racecheck.cli.gate import ci_main
    code = ci_main([str(a) for a in args])
    out, err = capsys.readouterr()
    return Result(code, out, " ".join(err.split()))


def test_gate_on_findings_writes_every_report(tmp_path):
    out = tmp_path / "out"
    r = gate("--findings", FINDINGS, "--out", out)
    assert r.returncode == 1, r.stderr
    for name in ("racecheck.sarif", "racecheck-junit.xml", "racecheck.html", "racecheck.perfetto.json",
                 "findings.json"):
        assert (out / name).stat().st_size > 100, name
    sarif = json.loads((out / "racecheck.sarif").read_text())
    assert len(sarif["runs"][0]["results"]) == 3
    assert sarif["runs"][0]["automationDetails"]["id"] == "racecheck-sim/"
    (case,) = ET.parse(out / "racecheck-junit.xml").getroot().iter("testcase")
    assert case.get("name") == "eagle-v2[no-mrope_recompute]" and case.find("failure") is not None
    assert "3 new, 0 suppressed, 0 baselined" in r.stderr


def test_gate_baseline_and_suppressions(tmp_path, capsys, monkeypatch):
    base = tmp_path / "baseline.json"
    from racecheck.reports import load_findings
    from racecheck.core.suppressions import baseline_document
    base.write_text(json.dumps(baseline_document(load_findings(FINDINGS))))
    summary = tmp_path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    r = gate_inproc(capsys, "--findings", FINDINGS, "--out", tmp_path / "o1", "--baseline", base)
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path / "o1" / "racecheck.sarif").read_text())["runs"][0]["results"] == []
    assert "No new races (0 suppressed, 3 baselined)" in summary.read_text()

    supp = tmp_path / "s.supp"
    supp.write_text("RC006 req_pool_indices * # padding rows point at slot 0\nRC002 kv_cache * # stale\n")
    r = gate_inproc(capsys, "--findings", FINDINGS, "--out", tmp_path / "o2", "--suppressions", supp)
    assert r.returncode == 1
    assert "stale suppression" in r.stderr and "kv_cache" in r.stderr
    results = json.loads((tmp_path / "o2" / "racecheck.sarif").read_text())["runs"][0]["results"]
    assert sorted(x["properties"]["tensor"] for x in results) == ["mrope_positions", "seq_lens"]
    everything = json.loads((tmp_path / "o2" / "findings.json").read_text())
    assert len(everything["findings"]) == 3, "the findings JSON keeps everything for re-gating"
    assert "| RC001 | `mrope_positions` |" in summary.read_text()


def test_gate_bad_input_exit_2(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text("[]")
    r = gate_inproc(capsys, "--findings", bad, "--out", tmp_path / "o")
    assert r.returncode == 2 and "not a racecheck findings file" in r.stderr
    supp = tmp_path / "s.supp"
    supp.write_text("RC001 x\n")
    r = gate_inproc(capsys, "--findings", FINDINGS, "--suppressions", supp, "--out", tmp_path / "o")
    assert r.returncode == 2 and "needs a reason" in r.stderr
    r = gate_inproc(capsys, "--no-such-flag")
    assert r.returncode == 2


# -- workflow templates ------------------------------------------------------------------------

def _load(path):
    doc = yaml.safe_load(path.read_text())
    # YAML 1.1 reads the bare key `on` as True
    if True in doc:
        doc["on"] = doc.pop(True)
    return doc


def test_workflows_exist():
    assert {p.name for p in WORKFLOWS} >= {"pr-gate.yml", "nightly-fuzz.yml"}


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_workflow_structure(path):
    doc = _load(path)
    assert doc.get("name")
    assert doc["on"], "trigger present"
    assert doc["permissions"]["security-events"] == "write"
    assert doc["jobs"]
    for job_id, job in doc["jobs"].items():
        assert "runs-on" in job, job_id
        assert job["steps"], job_id
        for step in job["steps"]:
            assert ("uses" in step) != ("run" in step), (job_id, step)
            if "uses" in step:
                assert re.match(r"^[\w.-]+/[\w./-]+@v?\d", step["uses"]), step["uses"]


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_workflow_uploads(path):
    text = path.read_text()
    doc = _load(path)
    steps = [s for j in doc["jobs"].values() for s in j["steps"]]
    sarif = [s for s in steps if s.get("uses", "").startswith("github/codeql-action/upload-sarif@")]
    assert sarif and all(s["with"]["sarif_file"].endswith(".sarif") and s["with"]["category"] for s in sarif)
    assert any(s.get("uses", "").startswith("actions/upload-artifact@") for s in steps)
    # the gate runs in the workflow, or in the ci/ script it calls
    scripts = [ROOT / "ci" / name for name in re.findall(r"ci/([\w-]+)", text) if (ROOT / "ci" / name).is_file()]
    assert "racecheck.cli.gate" in text or any("racecheck.cli.gate" in p.read_text() for p in scripts)
    checkout = str(path.resolve().parents[2])
    assert checkout not in text and "/root/" not in text, "no machine paths"


@pytest.mark.skipif(shutil.which("bash") is None, reason="bash not installed")
@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_workflow_scripts_parse_as_bash(path, tmp_path):
    doc = _load(path)
    for job in doc["jobs"].values():
        for i, step in enumerate(job["steps"]):
            if "run" not in step:
                continue
            script = re.sub(r"\$\{\{.*?\}\}", "X", step["run"])
            f = tmp_path / f"step{i}.sh"
            f.write_text(script)
            r = subprocess.run(["bash", "-n", str(f)], capture_output=True, text=True)
            assert r.returncode == 0, (step.get("name"), r.stderr)


def test_pr_gate_jobs():
    doc = _load(ROOT / "ci" / "workflows" / "pr-gate.yml")
    assert "pull_request" in doc["on"]
    assert doc["jobs"]["sim"]["runs-on"] == "ubuntu-latest"
    assert "gpu" in doc["jobs"]
    assert "--device sim" in json.dumps(doc["jobs"]["sim"]) and "--device cuda" in json.dumps(doc["jobs"]["gpu"])


def test_nightly_matrix_and_corpus():
    doc = _load(ROOT / "ci" / "workflows" / "nightly-fuzz.yml")
    assert "schedule" in doc["on"] and doc["on"]["schedule"][0]["cron"]
    job = doc["jobs"]["fuzz"]
    include = job["strategy"]["matrix"]["include"]
    platforms = {m["platform"]: m for m in include}
    assert {"nvidia", "rocm", "ascend"} <= set(platforms)
    assert platforms["ascend"]["device"] == "npu" and platforms["rocm"]["device"] == "cuda"
    assert all(m["runner"] for m in include)
    assert job["strategy"]["fail-fast"] is False
    downloads = [s for s in job["steps"] if s.get("uses", "").startswith("actions/download-artifact@")]
    assert downloads and downloads[0]["with"]["merge-multiple"] is True
    assert downloads[0]["with"]["pattern"] == "racecheck-corpus-*"
    uploads = [s for s in job["steps"] if "racecheck-corpus-" in str(s.get("with", {}).get("name", ""))]
    assert uploads
    assert "merge-corpus" in doc["jobs"]
    assert "secrets.RACECHECK_REDIS_URL" in doc["env"]["RACECHECK_REDIS_URL"]   # Redis where configured
    assert "RACECHECK_REDIS_URL" in json.dumps(job)


def test_gate_runs_repo_tests_under_racecheck(tmp_path, capsys):
    tests = tmp_path / "engine_tests"
    tests.mkdir()
    (tests / "test_overlap.py").write_text('''
import torch, racecheck

def test_unsynced_plan_stream(racecheck_session):
    plan = torch.cuda.Stream()
    racecheck_session.name_stream(plan, "plan_stream")
    positions = racecheck.name(torch.zeros(6, device="cuda"), "mrope_positions")
    plan.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(plan):
        positions.add_(1)
    positions.sum()

def test_fine():
    assert True
''')
    out = tmp_path / "out"
    r = gate_inproc(capsys, "--out", out, "--pytest", str(tests), "-p", "no:cacheprovider", "-q")
    assert r.returncode == 1, r.stderr
    cases = {c.get("name"): c for c in ET.parse(out / "racecheck-junit.xml").getroot().iter("testcase")}
    assert cases["test_unsynced_plan_stream"].find("failure") is not None
    assert cases["test_fine"].find("failure") is None
    assert (out / "pytest-junit.xml").exists()
    results = json.loads((out / "racecheck.sarif").read_text())["runs"][0]["results"]
    assert any(x["properties"]["tensor"] == "mrope_positions" for x in results)


def _have_run_command():
    import importlib.util
    return importlib.util.find_spec("racecheck.cli.commands.run_cmd") is not None


@pytest.mark.skipif(not _have_run_command(), reason="`racecheck run` not available")
def test_gate_runs_scenarios(tmp_path):
    out = tmp_path / "out"
    r = gate("--scenario", "eagle-v2", "--variant", "no-mrope_recompute", "--out", out)
    assert r.returncode in (0, 1), r.stderr
    names = [c.get("name") for c in ET.parse(out / "racecheck-junit.xml").getroot().iter("testcase")]
    assert names[:2] == ["eagle-v2", "eagle-v2[no-mrope_recompute]"]
    (fixed, broken) = [c for c in ET.parse(out / "racecheck-junit.xml").getroot().iter("testcase")][:2]
    assert broken.find("failure") is not None and r.returncode == 1


def test_sglang_gate_keeps_launch_records_between_runs(monkeypatch, tmp_path):
    """The gate's engine runs replay what earlier runs interpreted: the workflow caches the
    folder launch_store.py keeps records in (its default under the user's cache)."""
    from racecheck.instrumentation import launch_store
    monkeypatch.delenv(launch_store.ENV, raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert launch_store.folder() == str(tmp_path / ".cache" / "racecheck" / "triton-launches")
    doc = _load(ROOT / "ci" / "workflows" / "sglang-pr-gate.yml")
    steps = doc["jobs"]["racecheck"]["steps"]
    cache = [s for s in steps if s.get("uses", "").startswith("actions/cache@")]
    assert cache and cache[0]["with"]["path"] == "~/.cache/racecheck/triton-launches"
    assert cache[0]["with"]["restore-keys"]
    gate = next(i for i, s in enumerate(steps) if s.get("id") == "gate")
    assert steps.index(cache[0]) < gate
