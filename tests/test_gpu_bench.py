"""The GPU benches of the real engine (bench/gpu_sglang.py, bench/gpu_prefix_reuse.py): their run
plans and summaries, without an engine run (`--device sim` runs them for real, slowly)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench")
sys.path.insert(0, BENCH)

import gpu_prefix_reuse  # noqa: E402
import gpu_sglang  # noqa: E402


def test_plan_warms_up_then_interleaves_modes_then_profiles():
    c = gpu_sglang.CONFIGS[0]
    steps = [spec for _, spec in gpu_sglang.plan([c], runs=2, profile=True)]
    assert steps[0] == dict(scenario=c["scenario"], set=c["set"], mode="plain", warmup=True)
    assert [s["mode"] for s in steps[1:7]] == list(gpu_sglang.MODES) * 2
    assert steps[-1].get("profile") and steps[-1]["mode"] == "racecheck"


def test_every_config_is_one_engine_per_run_and_valid():
    from racecheck import scenarios
    for c in gpu_sglang.CONFIGS:
        scenarios.get(c["scenario"]).config(overrides=c["set"])
    for _, _, spec in gpu_prefix_reuse.plan(runs=1, delay_us=100, graphs=False):
        scenarios.get(spec["scenario"]).config(overrides=spec["set"])
        assert "drop_sync" not in spec["set"], spec     # dropping sites is a sim-only knob


def test_summary_ratios_and_differing_outputs():
    c = gpu_sglang.CONFIGS[0]
    out = {"output_ids": {"0": [1, 2]}}
    rows = [dict(mode="plain", warmup=True, outputs=out, loop=9.0, construction=9.0)]
    for m, loop in (("plain", 1.0), ("nothing", 1.5), ("racecheck", 2.0)):
        rows.append(dict(mode=m, outputs=out if m != "nothing" else {"output_ids": {}},
                         loop=loop, construction=1.0, step_median_ms=loop, run_s=loop,
                         findings=[], known=[], c_hot_path=True, c_engine=True,
                         internal_errors=[]))
    s = gpu_sglang.summarize(c, rows)
    assert s["racecheck"]["loop_x"] == 2.0 and s["nothing"]["loop_x"] == 1.5
    assert s["nothing"]["outputs_differ"] == 1 and s["racecheck"]["outputs_differ"] == 0
    assert "| cuda, eager | racecheck |" in gpu_sglang.table(
        {"runs": 1, "how": "fork", "configs": [s]})


@pytest.mark.parametrize("script", ["gpu_sglang.py", "gpu_prefix_reuse.py"])
def test_dry_prints_the_plan(script):
    p = subprocess.run([sys.executable, os.path.join(BENCH, script), "--dry", "--runs", "1"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert "sglang-eagle-v2" in p.stdout


def test_child_env_keeps_the_given_pythonpath(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", "/given/racecheck")
    parts = gpu_sglang.child_env("/bundle/site")["PYTHONPATH"].split(os.pathsep)
    assert parts[:2] == ["/bundle/site", "/given/racecheck"]


def test_interleaved_summary_ratios_per_round():
    out = {"output_ids": {"0": [1, 2]}}
    got = {"modes": ["plain", "nothing"], "stretches": [
        dict(mode="plain", round=-1, seconds=5.0, outputs=out, timed_out=False),
        dict(mode="plain", round=0, seconds=1.0, outputs=out, timed_out=False),
        dict(mode="nothing", round=0, seconds=1.5, outputs=out, timed_out=False),
        dict(mode="nothing", round=1, seconds=3.0, outputs={}, timed_out=False),
        dict(mode="plain", round=1, seconds=2.0, outputs=out, timed_out=False)]}
    s = gpu_sglang.interleaved_summary(got)
    assert s["plain"]["n"] == 2 and s["plain"]["x_plain"] == 1.0
    assert s["nothing"]["x_plain"] == 1.5 and s["nothing"]["outputs_differ"] == 1


def test_interleaved_stretches_on_one_engine_on_sim(tmp_path):
    """The schedule served under each mode in turn by one engine (sim: mechanics, not times)."""
    p = subprocess.run([sys.executable, os.path.join(BENCH, "gpu_sglang.py"), "--device", "sim",
                        "--quick", "--only", "cuda, eager", "--interleaved", "1", "--modes",
                        "plain,nothing,racecheck", "--profile", "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    import json
    data = json.load(open(tmp_path / "gpu_sglang.json"))
    got, checked = data["raw"]["cuda, eager"]
    assert "error" not in got, got.get("traceback")
    assert [r["mode"] for r in got["stretches"]] == ["plain", "plain", "nothing"]
    # racecheck: an engine of its own under one session, warm-up included
    assert "error" not in checked, checked.get("traceback")
    assert [r["mode"] for r in checked["stretches"]] == ["racecheck", "racecheck"]
    assert checked["profile"]["seconds"] and (tmp_path / "profile-cuda-eager.pstats").exists()
    per = data["interleaved"]["cuda, eager"]
    assert per["nothing"]["outputs_differ"] == 0 and per["nothing"]["timed_out"] == 0
    assert per["racecheck"]["outputs_differ"] == 0 and per["racecheck"]["findings"] == []
    assert per["racecheck"]["across_engines"]


def test_interleaved_summary_racecheck_against_the_other_engine():
    out = {"output_ids": {"0": [1, 2]}}
    got = {"modes": ["plain"], "stretches": [
        dict(mode="plain", round=-1, seconds=5.0, outputs=out, timed_out=False),
        dict(mode="plain", round=0, seconds=1.0, outputs=out, timed_out=False),
        dict(mode="plain", round=1, seconds=3.0, outputs=out, timed_out=False)]}
    checked = {"modes": ["racecheck"], "findings": [], "known": 2, "stretches": [
        dict(mode="racecheck", round=-1, seconds=9.0, outputs=out, timed_out=False),
        dict(mode="racecheck", round=0, seconds=3.0, outputs=out, timed_out=False),
        dict(mode="racecheck", round=1, seconds=5.0, outputs={}, timed_out=False)]}
    r = gpu_sglang.interleaved_summary(got, checked)["racecheck"]
    assert r["x_plain"] == 2.0 and r["x_plain_range"] == [1.5, 2.5]
    assert r["outputs_differ"] == 1 and r["known"] == 2
