"""The `sglang-eagle-v2` scenario: the installed sglang's own decode loop under racecheck.

As shipped it must be clean (graphs on and off); every seed, defined as a dropped
synchronization site of the real code, must be flagged with its rule and the engine's name
for the tensor. Needs sglang 0.5.23 (`pip install --no-deps sglang==0.5.23`) and triton.
"""
import fnmatch
import importlib.util
import json
import os
import subprocess
import sys

import pytest

from racecheck import scenarios

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("sglang") is None or importlib.util.find_spec("triton") is None,
    reason="needs sglang 0.5.23 (pip install --no-deps sglang==0.5.23) and racecheck[sglang,triton]; "
           "CI installs them")

SC = "sglang-eagle-v2"


def _run(variant=None, **overrides):
    sc = scenarios.get(SC)
    res = scenarios.run(sc, sc.config(variant=variant, overrides=overrides), device="sim")
    assert not res.internal_errors, res.internal_errors
    return res


@pytest.mark.parametrize("graphs", [True, False], ids=["graphs", "eager"])
def test_as_shipped_is_clean(graphs):
    res = _run(graphs=graphs)
    assert res.findings == [], "\n".join(f.message() for f in res.findings)
    assert res.diff_ok
    assert all(len(v) > 0 for v in res.outputs["output_ids"].values())


@pytest.mark.parametrize("variant", sorted(scenarios.get(SC).variants))
def test_every_seed_is_flagged_with_the_engines_name(variant):
    v = scenarios.get(SC).variant(variant)
    res = _run(variant)
    got = res.signature()
    missing = [(rule, pattern) for rule, pattern in v.expected
               if not any(r == rule and fnmatch.fnmatchcase(t, pattern) for r, t in got)]
    assert not missing, f"{variant}: missing {missing}; got {sorted(got)}"
    assert not res.unmatched_drops


def test_a_dropped_site_that_never_ran_is_reported():
    res = _run(drop_sync="sglang.srt.nowhere:nothing:wait_stream#0")
    assert res.unmatched_drops == ["sglang.srt.nowhere:nothing:wait_stream#0"]


def test_sites_have_stable_ids_across_runs():
    a = [s.id for s in _run().sync_sites]
    b = [s.id for s in _run().sync_sites]
    assert a == b
    assert "sglang.srt.speculative.eagle_worker_common:run_eagle_verify:wait_stream#0" in a
    assert any(":padding(req_pool_indices)#0" in i for i in a)


def test_an_upstream_refactor_fails_with_one_line():
    from racecheck.errors import UsageError
    from racecheck.scenarios.sglang import environment
    engine = environment.load()
    with pytest.raises(UsageError) as err:
        engine.need("eagle_worker_v2", "EAGLEWorkerV2.renamed_method")
    text = str(err.value)
    assert "EAGLEWorkerV2.renamed_method" in text and "0.5.23" in text and "\n" not in text


def test_mutate_cli_quick_against_the_shipped_table(tmp_path):
    out = tmp_path / "mutate.json"
    sarif = tmp_path / "mutate.sarif"
    proc = subprocess.run([sys.executable, "-m", "racecheck", "mutate", SC, "--quick",
                           "--json", str(out), "--sarif", str(sarif)],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(out.read_text())
    assert report["sites"] and all(s["verdict"] == "necessary" for s in report["sites"])
    assert json.loads(sarif.read_text())["version"] == "2.1.0"


def test_run_cli_drop_sync_flags_the_seed():
    site = "sglang.srt.speculative.eagle_worker_v2:EagleDraftWorker._draft_extend_for_decode:wait_stream#0"
    proc = subprocess.run([sys.executable, "-m", "racecheck", "run", SC, "--drop-sync", site],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert ".seq_lens" in proc.stdout


def test_the_pr_gate_template_commands(tmp_path):
    """ci/sglang-gate, as the workflow template runs it, against the installed sglang."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.run(["bash", os.path.join(root, "ci", "sglang-gate"), "--quick",
                           str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=1200,
                          env=dict(os.environ, PYTHON=sys.executable))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "sglang-eagle-v2" in proc.stdout
