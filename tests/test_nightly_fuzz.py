"""The nightly fuzz (issue 28, point 4): `racecheck fuzz` fails only on a new distinct failure
(known ones come from `--suppressions`/`--baseline`), and ci/workflows/nightly-fuzz.yml's fuzz
step, run here as written (on sim, with a real Redis server on a loopback port standing in for
the shared database), fuzzes the model and the real engine and leaves SARIF, findings and repro
records behind.
"""
from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from test_fuzz import _start_redis
from test_fuzz_toy import toy_registered  # noqa: F401  (autouse fixture: toy-pipeline registered)
from racecheck.cli import main as cli

ROOT = Path(__file__).resolve().parents[1]
WORKFLOW = ROOT / "ci" / "workflows" / "nightly-fuzz.yml"
KNOWN = ROOT / "ci" / "known-failures"


def _fuzz(capsys, *args):
    status = cli.main(["fuzz", "toy-pipeline", "--seed", "1", "--db", "none", "--quiet", *map(str, args)])
    return status, capsys.readouterr().out


# -- known failures: --suppressions / --baseline ------------------------------------------------

def test_a_known_failure_is_saved_and_listed_but_does_not_fail(tmp_path, capsys):
    supp = tmp_path / "known.supp"
    supp.write_text("RC001 buf  # the toy's missing event, documented\n")
    status, out = _fuzz(capsys, "--variant", "no-event_fix", "--first", "--budget", "10s",
                        "--findings-dir", tmp_path / "f", "--suppressions", supp,
                        "--report", f"json={tmp_path / 'all.json'}", "--report", f"sarif={tmp_path / 'new.sarif'}")
    assert status == 0, out
    assert "1 distinct failure(s), 1 known, 0 new" in out
    assert "RC001 buf: known (suppressed: the toy's missing event, documented)" in out
    assert len(list((tmp_path / "f").glob("*.json"))) == 1          # still shrunk and saved
    assert [f["tensor"] for f in json.loads((tmp_path / "all.json").read_text())["findings"]] == ["buf"]
    assert json.loads((tmp_path / "new.sarif").read_text())["runs"][0]["results"] == []
    # the same run without the file fails
    status, out = _fuzz(capsys, "--variant", "no-event_fix", "--first", "--budget", "10s",
                        "--findings-dir", tmp_path / "g")
    assert status == 1 and "RC001 buf: known" not in out and ", 1 known" not in out


def test_only_a_new_failure_fails(tmp_path, capsys):
    supp = tmp_path / "known.supp"
    supp.write_text("RC001 buf  # documented\n")
    status, out = _fuzz(capsys, "--draw-switches", "--budget", "5s", "--findings-dir", tmp_path,
                        "--suppressions", supp, "--report", f"sarif={tmp_path / 'new.sarif'}")
    assert status == 1, out
    assert "RC001 buf: known" in out and "RC004 h: first seen" in out
    results = json.loads((tmp_path / "new.sarif").read_text())["runs"][0]["results"]
    tensors = {r["properties"]["tensor"] for r in results}
    assert "h" in tensors and "buf" not in tensors


def test_a_baseline_makes_failures_known_with_workers(tmp_path, capsys):
    """Workers report their failures through records: known there too. (The model scenario: the
    toy is registered in this process only.) The second run's workers replay the saved failure."""
    common = ["fuzz", "eagle-v2", "--variant", "no-war_barrier", "--seed", "1", "--quiet",
              "--db", str(tmp_path / "db")]
    status = cli.main([*common, "--first", "--budget", "20s", "--findings-dir", str(tmp_path / "a"),
                       "--report", f"json={tmp_path / 'a.json'}"])
    assert status == 1, capsys.readouterr().out
    assert cli.main(["baseline", str(tmp_path / "a.json"), "-o", str(tmp_path / "base.json")]) == 0
    capsys.readouterr()
    status = cli.main([*common, "--budget", "3s", "--workers", "2", "--findings-dir", str(tmp_path / "b"),
                       "--baseline", str(tmp_path / "base.json")])
    out = capsys.readouterr().out
    assert status == 0, out
    assert "RC002 req_to_token: known (in the baseline)" in out


def test_a_bad_known_failures_file_is_a_usage_error_before_fuzzing(tmp_path, capsys):
    supp = tmp_path / "bad.supp"
    supp.write_text("RC001 buf\n")                              # no reason
    status = cli.main(["fuzz", "toy-pipeline", "--budget", "60s", "--suppressions", str(supp)])
    assert status == 2 and "needs a reason" in capsys.readouterr().err
    assert cli.main(["fuzz", "toy-pipeline", "--baseline", str(tmp_path / "none.json")]) == 2


def test_a_failure_without_findings_is_never_known():
    from racecheck.cli.commands.fuzz_cmd import known_failures
    from racecheck.core.findings import Access, Finding
    from racecheck.core.suppressions import parse_suppressions
    f = Finding(rule="RC001", tensor="buf", current=Access("op", "a", "read", "x.py:1"),
                previous=Access("op", "b", "write", "x.py:2"), suggestion="")
    everything = parse_suppressions("* *  # everything\n")
    got = known_failures({"RC001 buf": [f], "CRASH TypeError": [f], "FAULT index": []}, everything)
    assert set(got) == {"RC001 buf"}


@pytest.mark.parametrize("flavour", ["hip", "npu"])
def test_the_platforms_known_failures_cite_findings(flavour):
    from racecheck.core.suppressions import load_suppressions
    entries = load_suppressions(KNOWN / f"{flavour}.supp")
    assert entries and all("FINDINGS.md" in e.reason for e in entries)
    assert any(e.rule == "RC002" and e.tensor == "ReqToTokenPool.req_to_token" for e in entries)
    assert not (KNOWN / "cuda.supp").exists()     # nothing is known on cuda: every failure is new


# -- the workflow's fuzz step, on sim with a loopback Redis -------------------------------------

def _load_workflow():
    doc = yaml.safe_load(WORKFLOW.read_text())
    if True in doc:                       # YAML 1.1 reads the bare key `on` as True
        doc["on"] = doc.pop(True)
    return doc


def _fuzz_step(doc):
    job = doc["jobs"]["fuzz"]
    (step,) = [s for s in job["steps"] if "ci/nightly-fuzz" in s.get("run", "")]
    return job, step


def _resolve(value: str, matrix: dict, env: dict) -> str:
    """A workflow expression of the forms this workflow uses: matrix.X, env.X, `a || b`."""
    def one(m):
        out = ""
        for alt in m.group(1).split("||"):
            alt = alt.strip()
            kind, _, name = alt.partition(".")
            out = str({"matrix": matrix, "env": env}[kind].get(name, "") if kind in ("matrix", "env")
                      else alt.strip("'"))
            if out:
                break
        return out
    return re.sub(r"\$\{\{\s*(.*?)\s*\}\}", one, str(value))


def test_the_workflow_fuzzes_each_vendor_on_its_flavour_with_redis():
    doc = _load_workflow()
    job, step = _fuzz_step(doc)
    platforms = {m["platform"]: m for m in job["strategy"]["matrix"]["include"]}
    assert {p: (m["device"], m["flavour"]) for p, m in platforms.items()} == {
        "sim": ("sim", "cuda"), "nvidia": ("cuda", "cuda"), "rocm": ("cuda", "hip"), "ascend": ("npu", "npu")}
    assert set(doc["env"]["SCENARIOS"].split()) >= {"sglang-eagle-v2", "sglang-overlap", "sglang-hicache"}
    assert "secrets.RACECHECK_REDIS_URL" in doc["env"]["RACECHECK_REDIS_URL"]
    assert _resolve(step["env"]["DB"], {}, {"RACECHECK_REDIS_URL": "redis://r:6379/0", "CORPUS": "c"}) \
        == "redis://r:6379/0"
    assert _resolve(step["env"]["DB"], {}, {"RACECHECK_REDIS_URL": "", "CORPUS": "c"}) == "c"
    for key in ("DEVICE", "FLAVOUR", "PLATFORM"):
        assert step["env"][key] == "${{ matrix.%s }}" % key.lower()
    for (_, m) in platforms.items():
        known = KNOWN / f"{m['flavour']}.supp"
        assert m["flavour"] == "cuda" or known.exists()


def _have_engine():
    return importlib.util.find_spec("sglang") is not None and importlib.util.find_spec("triton") is not None


@pytest.mark.skipif(not _have_engine(), reason="needs sglang and racecheck[sglang,triton] (scripts/setup.sh); "
                                                "CI installs them")
def test_the_workflow_fuzz_step_runs_on_sim_with_a_loopback_redis(tmp_path):
    """The sim job's fuzz step as written: its `run` text in bash, its env from the sim matrix
    entry, the Redis URL of a real server on a loopback port in place of the secret, and a budget
    of one second per scenario (one example each: about a minute per engine scenario here)."""
    exe = shutil.which("redis-server")
    if exe is None:
        pytest.skip("redis-server not installed (Debian: apt-get install redis-server); CI installs it")
    pytest.importorskip("redis")
    import redis
    doc = _load_workflow()
    job, step = _fuzz_step(doc)
    (sim,) = [m for m in job["strategy"]["matrix"]["include"] if m["platform"] == "sim"]
    proc, url = _start_redis(exe)
    try:
        wf_env = dict(doc["env"], BUDGET="1s", RACECHECK_REDIS_URL=url)
        env = dict(os.environ, **{k: _resolve(v, sim, wf_env) for k, v in wf_env.items()})
        env.update({k: _resolve(v, sim, wf_env) for k, v in step["env"].items()})
        env.update(PYTHON=sys.executable, GITHUB_OUTPUT=str(tmp_path / "github_output"))
        assert env["DB"] == url and env["FLAVOUR"] == "cuda" and env["DEVICE"] == "sim"
        (tmp_path / "racecheck-src").symlink_to(ROOT, target_is_directory=True)
        # GitHub's shell for `run` steps
        r = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", step["run"]], cwd=tmp_path,
                           env=env, capture_output=True, text=True, timeout=900)
        log = r.stdout + r.stderr
        assert r.returncode == 0, log
        assert "code=0" in (tmp_path / "github_output").read_text(), log
        out = tmp_path / "racecheck-out"
        sarif = json.loads((out / "racecheck.sarif").read_text())
        assert sarif["runs"][0]["results"] == [] and \
            sarif["runs"][0]["automationDetails"]["id"].startswith("racecheck-sim")
        for sc in env["SCENARIOS"].split():
            doc_ = json.loads((out / "raw" / f"{sc}.json").read_text())
            assert doc_["findings"] == [], sc
            assert f"racecheck fuzz {sc}" in (out / "logs" / f"{sc}.log").read_text()
        assert "--set flavour=cuda" in log and (out / "repros").is_dir()
        # every fuzzer used the server (a clean run saves no example: Hypothesis keeps failures)
        assert log.count(f"database {url} (key racecheck/v2/") == len(env["SCENARIOS"].split()), log
        assert "racecheck/v2/sglang-eagle-v2/all-fixes{flavour=cuda}" in log
        assert redis.Redis.from_url(url).info("stats")["total_connections_received"] > len(env["SCENARIOS"].split())
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.mark.parametrize("flavour", ["hip", "npu"])
def test_the_missing_war_barrier_is_known_at_each_write_the_front_door_showed(flavour):
    """The RC002 pairs the real engine showed on the ROCm branches (fuzzed on an H200 with
    flavour=hip; the repro records' findings): the radix cache repointing a row, and, on a GPU
    where a Triton kernel's write covers its whole tensor, a new request's row written, both
    against the forward's KV-index read. Another site on the same tensor stays new."""
    from racecheck.core.findings import Access, Finding
    from racecheck.core.suppressions import load_suppressions
    entries = load_suppressions(KNOWN / f"{flavour}.supp")
    read = Access("pack_read_stream", "forward_stream", "read", "kv_index_translator.py:600",
                  "pack_read_stream")

    def known(location, function):
        f = Finding("RC002", "ReqToTokenPool.req_to_token",
                    Access("write", "schedule_stream", "write", location, function), read, "")
        return any(e.matches(f) for e in entries)
    assert known("memory_pool.py:414", "write")
    assert known("allocation.py:755", "assign_req_to_token_pool_func")
    assert known("allocation.py:79", "write_cache_indices")
    assert not known("scheduler.py:1200", "prepare_for_decode")
