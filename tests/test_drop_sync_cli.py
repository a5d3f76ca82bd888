"""`--drop-sync` on run and fuzz: any scenario's synchronization sites can be dropped."""
import subprocess
import sys


def _racecheck(*args, cwd):
    return subprocess.run([sys.executable, "-m", "racecheck", *args], capture_output=True,
                          text=True, timeout=300, cwd=cwd)


def test_fuzz_with_dropped_waits_finds_a_race(tmp_path):
    proc = _racecheck("fuzz", "eagle-v2", "--drop-sync", "*:wait_*", "--max-examples", "5",
                      "--first", "--quiet", "--seed", "0", "--db", str(tmp_path / "db"),
                      "--findings-dir", str(tmp_path / "found"), cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "RC001" in proc.stdout and "reproduce: racecheck repro" in proc.stdout


def test_run_with_an_unknown_site_pattern_is_clean_and_says_so(tmp_path):
    proc = _racecheck("run", "eagle-v2", "--drop-sync", "nowhere:nothing:wait_stream#0", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "matched no synchronization site" in proc.stdout


def test_the_fuzzers_detector_only_runs_drop_the_sites_too():
    from racecheck.fuzz import FuzzTarget
    clean = FuzzTarget("eagle-v2").run_detector_only({"config": {}})
    dropped = FuzzTarget("eagle-v2").run_detector_only({"config": {"drop_sync": "*:wait_*"}})
    assert clean.keys == [] and not clean.crash
    assert any(k.startswith("RC001") for k in dropped.keys), dropped.keys
