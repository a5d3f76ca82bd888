"""`racecheck fuzz`: finding, shrinking, saving; databases (directory, union, Redis); workers.

Runs against `toy-pipeline` (tests/test_fuzz_toy.py), a two-race scenario that runs in a few
milliseconds, so every path is exercised for real within CI time.
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time

import pytest

from test_fuzz_toy import toy_registered  # noqa: F401  (fixture: toy-pipeline registered)
from racecheck.cli import main as cli
from racecheck.drivers.fuzz import (FuzzTarget, Fuzzer, WorkerSpec, database_key, open_database, parse_budget,
                            run_workers)

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def _fuzz(variant="no-event_fix", db=":memory:", tmp=None, **kw):
    target = FuzzTarget("toy-pipeline", variant, draw_switches=kw.pop("draw_switches", False))
    database = open_database(db) if isinstance(db, str) else db
    kw.setdefault("budget_s", 5.0)
    return Fuzzer(target, database=database, findings_dir=str(tmp) if tmp else None, **kw).run(), database


# -- finding and shrinking ------------------------------------------------------------------------

def test_finds_the_race_and_shrinks_it_to_the_smallest_run(tmp_path):
    rep, _ = _fuzz(tmp=tmp_path, first_only=True, seed=1)
    ff = rep.failures["RC001 buf"]
    assert ff.shrunk
    cfg = ff.example["config"]
    assert (cfg["iterations"], cfg["schedule"]) == (1, "0:+1")          # fewest iterations, one request
    assert ff.example["plan"] == {"priorities": {}, "host": 0, "change_points": [], "holds": []}
    rec = json.loads(open(ff.path).read())
    assert rec["format"] == "racecheck-repro" and rec["failure"]["key"] == "RC001 buf"
    assert rec["config"]["event_fix"] is False and rec["config"]["iterations"] == 1
    assert rec["failure"]["rule"] == "RC001" and rec["failure"]["tensor"] == "buf"
    assert [p for p in os.listdir(tmp_path) if p.endswith(".tmp")] == []  # atomic writes


def test_every_distinct_failure_is_shrunk_and_saved(tmp_path):
    rep, _ = _fuzz(None, tmp=tmp_path, draw_switches=True, budget_s=20.0, seed=3,
                   stop_when={"RC001 buf", "RC004 h"}, stop_when_all=True)
    assert {"RC001 buf", "RC004 h"} <= set(rep.failures)
    for key in ("RC001 buf", "RC004 h"):
        ff = rep.failures[key]
        assert ff.example["config"]["iterations"] == 1 and ff.example["config"]["schedule"] == "0:+1", key
        assert os.path.exists(ff.path)
    # the minimal example for each turns off only the fix it needs off
    assert rep.failures["RC001 buf"].example["config"]["d2h_sync"] is True
    assert rep.failures["RC004 h"].example["config"]["event_fix"] is True


def test_no_example_runs_in_full_twice():
    """Hypothesis ends every failure with a final replay of its minimal example; an example that
    already ran in full (found and not shrunk further, here all of them: the knobs are fixed at
    the smallest run) gives its outcome again rather than running the engine a second time."""
    target = FuzzTarget("toy-pipeline", "no-event_fix",
                        fixed={"iterations": 1, "schedule": "0:+1"})
    runs = []
    real_run = target.run

    def counting_run(example):
        runs.append(json.dumps(example, sort_keys=True))
        return real_run(example)
    target.run = counting_run
    rep = Fuzzer(target, database=None, findings_dir=None, budget_s=5.0, seed=1,
                 first_only=True).run()
    assert rep.failures and runs
    assert len(runs) == len(set(runs)), "an example ran in full twice"


def test_a_wrong_value_is_found_with_the_plan_that_shows_it(tmp_path):
    rep, _ = _fuzz(tmp=tmp_path, budget_s=20.0, seed=2, stop_when={"DIFF acc"})
    ff = rep.failures["DIFF acc"]
    assert ff.example["config"]["iterations"] == 1
    assert ff.example["plan"] != {"priorities": {}, "host": 0, "change_points": [], "holds": []}
    assert "serialized" in ff.outcome.wrong_values()


def test_a_seeded_search_is_reproducible():
    runs = [_fuzz(budget_s=20.0, seed=2, stop_when={"DIFF acc"})[0] for _ in range(2)]
    a, b = (r.failures["DIFF acc"] for r in runs)
    assert (a.examples_to_find, a.example) == (b.examples_to_find, b.example)
    assert runs[0].examples == runs[1].examples


def test_all_fixes_on_is_clean_and_the_budget_stops_the_run():
    _fuzz(None, budget_s=None, max_examples=1)          # warm up (first session: imports)
    t0 = time.monotonic()
    rep, _ = _fuzz(None, budget_s=2.0)
    assert rep.failures == {} and rep.examples > 20
    assert time.monotonic() - t0 < 2.0 + 0.5
    rep2, _ = _fuzz(None, budget_s=None, max_examples=30)
    assert rep2.failures == {} and 30 <= rep2.examples <= 40


# -- Hypothesis settings and the database key ------------------------------------------------------

def test_database_key_is_stable_and_names_scenario_and_variant():
    from hypothesis.database import InMemoryExampleDatabase
    assert database_key("eagle-v2", "no-x") == b"racecheck/v2/eagle-v2/no-x"
    assert database_key("eagle-v2") == b"racecheck/v2/eagle-v2/all-fixes"
    assert database_key("eagle-v2", draw_switches=True, device="cuda") == b"racecheck/v2/eagle-v2/all-fixes+switches@cuda"
    db = InMemoryExampleDatabase()
    _fuzz(db=db, first_only=True)
    assert b"racecheck/v2/toy-pipeline/no-event_fix" in db.data


def test_knobs_the_user_fixed_make_another_target():
    from racecheck.drivers.fuzz import record_filename
    assert database_key("eagle-v2", fixed={"graphs": False, "drop_sync": "m:f:wait#0"}) == \
        b"racecheck/v2/eagle-v2/all-fixes{drop_sync=m:f:wait#0,graphs=off}"
    shipped = record_filename("eagle-v2", None, "RC001 x")
    dropped = record_filename("eagle-v2", None, "RC001 x", {"drop_sync": "m:f:wait#0"})
    assert shipped.startswith("eagle-v2-all-fixes-RC001") and "-all-fixes-set-" in dropped
    assert record_filename("eagle-v2", None, "RC001 x", {"drop_sync": "m:f:wait#0"}) == dropped
    # values given as text on the command line are compared as the knobs' own values
    t = FuzzTarget("eagle-v2", fixed={"graphs": "off"})
    assert t.fixed == {"graphs": False} and t.key.endswith(b"{graphs=off}")


def test_the_racecheck_profile_is_loaded_and_the_previous_one_restored():
    from hypothesis import settings
    before = settings.get_current_profile_name()
    seen = {}
    rep, _ = _fuzz(first_only=True, on_progress=lambda *a: seen.setdefault(
        "profile", settings.get_current_profile_name()))
    assert seen["profile"] == "racecheck"
    assert settings.get_current_profile_name() == before


def _cli_subprocess(args, cwd, env_extra=None, timeout=120):
    env = dict(os.environ)
    env["PYTHONPATH"] = HERE + os.pathsep + env.get("PYTHONPATH", "")
    env.update(env_extra or {})
    code = ("import sys, test_fuzz_toy; test_fuzz_toy.register(); from racecheck.cli.main import main; "
            "sys.exit(main(sys.argv[1:]))")
    return subprocess.run([sys.executable, "-c", code, *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


def test_ci_environment_does_not_turn_the_database_off(tmp_path):
    """Hypothesis loads its `ci` profile (no database) when CI is set; racecheck's profile wins."""
    env = {"CI": "true", "GITHUB_ACTIONS": "true"}
    r = _cli_subprocess(["fuzz", "toy-pipeline", "--variant", "no-event_fix", "--first", "--budget", "10s",
                         "--db", str(tmp_path / "db"), "--findings-dir", str(tmp_path / "repros")],
                        tmp_path, env)
    assert r.returncode == 1, r.stdout + r.stderr
    assert any(os.scandir(tmp_path / "db")), "the example database stayed empty under CI=true"
    assert "racecheck repro " in r.stdout


# -- the command line -------------------------------------------------------------------------------

def test_cli_fuzz_prints_the_reproduction_command_and_exits_1(tmp_path, capsys):
    status = cli.main(["fuzz", "toy-pipeline", "--variant", "no-event_fix", "--first", "--budget", "10s",
                       "--db", str(tmp_path / "db"), "--findings-dir", str(tmp_path / "r"), "--seed", "4",
                       "--report", f"json={tmp_path / 'f.json'}"])
    out = capsys.readouterr().out
    assert status == 1
    line = [ln for ln in out.splitlines() if "reproduce: racecheck repro " in ln][0]
    path = line.split("racecheck repro ", 1)[1].strip()
    assert os.path.exists(path)
    assert "distinct failure" in out and "examples" in out
    assert json.loads((tmp_path / "f.json").read_text())["findings"][0]["rule"] == "RC001"


def test_cli_fuzz_clean_exit_0(tmp_path, capsys):
    status = cli.main(["fuzz", "toy-pipeline", "--max-examples", "20", "--db", "none",
                       "--findings-dir", str(tmp_path)])
    assert status == 0
    assert "0 distinct failure" in capsys.readouterr().out


@pytest.mark.parametrize("argv, text", [
    (["fuzz", "no-such-scenario"], "unknown scenario"),
    (["fuzz", "toy-pipeline", "--variant", "no-such"], "unknown variant"),
    (["fuzz", "toy-pipeline", "--budget", "soon"], "--budget"),
    (["fuzz", "toy-pipeline", "--max-examples", "0"], "--max-examples"),
    (["fuzz", "toy-pipeline", "--db", "redis://127.0.0.1:1/0"], "cannot reach Redis"),
    (["fuzz", "toy-pipeline", "--db", "ftp://x/y"], "unsupported URL"),
])
def test_cli_fuzz_usage_errors_are_one_line_exit_2(argv, text, capsys):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert text in err and len(err.splitlines()) == 1


def test_parse_budget():
    assert parse_budget("60s") == 60 and parse_budget("5m") == 300 and parse_budget("1h") == 3600
    assert parse_budget("90") == 90 and parse_budget("250ms") == 0.25


# -- fleets: shared databases ------------------------------------------------------------------------

def test_a_saved_failure_is_replayed_first_by_the_next_run(tmp_path):
    db = str(tmp_path / "db")
    first, _ = _fuzz(db=db, first_only=True, seed=5)
    assert "RC001 buf" in first.failures
    second, _ = _fuzz(db=db, first_only=True, seed=6)
    assert second.replayed_first and second.first_example_failed
    assert second.failures["RC001 buf"].examples_to_find == 1


def test_every_known_failure_is_replayed_before_searching(tmp_path):
    db = str(tmp_path / "db")
    both = {"RC001 buf", "RC004 h"}
    first, _ = _fuzz(None, db=db, draw_switches=True, budget_s=20.0, seed=3, stop_when=both,
                     stop_when_all=True)
    assert both <= set(first.failures)
    second, _ = _fuzz(None, db=db, draw_switches=True, budget_s=20.0, seed=4, stop_when=both,
                      stop_when_all=True)
    assert second.replayed_first
    n = len(first.failures)
    assert all(second.failures[k].examples_to_find <= n for k in both), \
        {k: v.examples_to_find for k, v in second.failures.items()}


def test_directory_databases_merge_by_plain_union(tmp_path):
    a, b, merged = tmp_path / "a", tmp_path / "b", tmp_path / "merged"
    _fuzz("no-event_fix", db=str(a), first_only=True, seed=7)
    _fuzz("no-d2h_sync", db=str(b), first_only=True, seed=8)
    for src in (a, b):                                  # what the nightly merge job does
        shutil.copytree(src, merged, dirs_exist_ok=True)
    for variant in ("no-event_fix", "no-d2h_sync"):
        rep, _ = _fuzz(variant, db=str(merged), first_only=True)
        assert rep.replayed_first and rep.first_example_failed, variant


def _start_redis(exe):
    """redis-server on a free loopback port, no persistence: (process, url)."""
    import redis
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no", "--daemonize", "no"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    client = redis.Redis(host="127.0.0.1", port=port)
    for _ in range(200):
        try:
            client.ping()
            return proc, f"redis://127.0.0.1:{port}/0"
        except redis.ConnectionError:
            time.sleep(0.05)
    proc.kill()
    pytest.fail("redis-server did not start")


@pytest.fixture(scope="module")
def redis_url():
    exe = shutil.which("redis-server")
    if exe is None:
        pytest.skip("redis-server not installed (Debian: apt-get install redis-server); CI installs it")
    pytest.importorskip("redis", reason="the redis client is needed (pip install 'racecheck[redis]')")
    proc, url = _start_redis(exe)
    yield url
    proc.terminate()
    proc.wait(timeout=10)


def test_redis_database_shares_failures_between_runs(redis_url, tmp_path):
    first, db = _fuzz(db=redis_url, tmp=tmp_path, first_only=True, seed=9)
    assert "RC001 buf" in first.failures
    import redis
    keys = redis.Redis.from_url(redis_url).keys("*")
    assert any(b"racecheck/v2/toy-pipeline/no-event_fix" in k for k in keys), keys
    second, _ = _fuzz(db=redis_url, first_only=True, seed=10)
    assert second.replayed_first and second.first_example_failed


def test_cli_fuzz_with_redis(redis_url, tmp_path, capsys):
    status = cli.main(["fuzz", "toy-pipeline", "--variant", "no-d2h_sync", "--first", "--budget", "10s",
                       "--db", redis_url, "--findings-dir", str(tmp_path)])
    assert status == 1 and "RC004 h" in capsys.readouterr().out


def _spec(db, tmp, **kw):
    spec = {"scenario": "toy-pipeline", "variant": "no-event_fix", "device": "sim", "draw_switches": False,
            "db": db, "seed": None, "findings_dir": str(tmp), "budget_s": 10.0, "max_examples": None,
            "first_only": True, "imports": ("test_fuzz_toy:register",)}
    spec.update(kw)
    return WorkerSpec(**spec)


def test_workers_share_one_database(tmp_path):
    """Worker A finds and saves a failure; then every worker of a fleet replays it first.
    On Redis when a redis-server is installed, else on a directory database."""
    exe = shutil.which("redis-server")
    if exe is not None:
        db = _start_redis(exe)
    else:
        db = (None, str(tmp_path / "db"))
    proc, url = db
    try:
        found = []
        done, errors = run_workers(_spec(url, tmp_path / "a", seed=11), 1, on_found=found.append)
        assert not errors and found and found[0].key == "RC001 buf" and found[0].worker == 0
        done, errors = run_workers(_spec(url, tmp_path / "b", seed=12), 2)
        assert not errors and len(done) == 2
        for k, d in done.items():
            assert d.worker == k and d.replayed_first and d.first_example_failed, d
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=10)


def test_a_variants_dropped_sites_stay_dropped_in_every_example():
    """Explored examples draw every knob; one left at its default must not undo the variant's
    drop_sync (set apart from its overrides), else half the examples would fuzz the fixed code."""
    from hypothesis import HealthCheck, given, settings

    from racecheck.drivers.fuzz import strategies as rs
    from racecheck.scenarios import Scenario, Variant
    from test_fuzz_toy import KNOBS, SWITCHES, runner

    site = "prog:step:wait_stream#0"
    sc = Scenario("toy-drop", "", KNOBS, SWITCHES, [Variant("no-wait", {}, [], "drops a wait", drop_sync=(site,))],
                  runner=runner, resolve=lambda c: c, reference=dict, diff_fields={})
    explored = []

    @settings(max_examples=40, database=None, derandomize=True, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(ex=rs.examples(sc, "no-wait"))
    def check(ex):
        explored.append("scale" in ex["config"] or ex["config"].get("event_fix") is not None)
        assert sc.config("no-wait", ex["config"])["drop_sync"] == site
    check()
    assert any(explored)
