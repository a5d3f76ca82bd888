"""`--drop-sync` on run and fuzz: any scenario's synchronization sites can be dropped."""
from helpers import racecheck_cli


def test_fuzz_with_dropped_waits_finds_a_race(tmp_path):
    proc = racecheck_cli("fuzz", "eagle-v2", "--drop-sync", "*:wait_*", "--max-examples", "5",
                         "--first", "--quiet", "--seed", "0", "--db", str(tmp_path / "db"),
                         "--findings-dir", str(tmp_path / "found"), cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "RC001" in proc.stdout and "reproduce: racecheck repro" in proc.stdout


def test_a_dropped_site_the_run_never_executed_is_a_usage_error_naming_the_closest(tmp_path):
    proc = racecheck_cli("run", "eagle-v2", "--drop-sync", "nowhere:nothing:wait_stream#0", cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "no synchronization site the run executed" in proc.stderr
    site = "racecheck.scenarios.eagle_v2.model_runner:ModelRunner.__init__:synchronize#0"
    typo = site.replace("#0", "#3")
    proc = racecheck_cli("run", "eagle-v2", "--drop-sync", typo, cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"closest: {site[:-1]}" in proc.stderr and proc.stderr.count("\n") == 1


def test_fuzz_with_a_site_no_example_executed_is_a_usage_error(tmp_path):
    proc = racecheck_cli("fuzz", "eagle-v2", "--drop-sync", "nowhere:nothing:wait_stream#0",
                         "--max-examples", "2", "--quiet", "--seed", "0", "--db", "none",
                         "--findings-dir", str(tmp_path / "found"), cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "no synchronization site the run executed" in proc.stderr


def test_the_fuzzers_detector_only_runs_drop_the_sites_too():
    from racecheck.drivers.fuzz import FuzzTarget
    clean = FuzzTarget("eagle-v2").run_detector_only({"config": {}})
    dropped = FuzzTarget("eagle-v2").run_detector_only({"config": {"drop_sync": "*:wait_*"}})
    assert clean.keys == [] and not clean.crash
    assert any(k.startswith("RC001") for k in dropped.keys), dropped.keys
