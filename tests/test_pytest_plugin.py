"""`pytest --racecheck` (pytester): a racy test fails with the console report, a clean one passes."""
from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import pytest

pytest_plugins = ["pytester"]

TESTS = '''
import pytest
import torch
import racecheck


def test_racy(racecheck_session):
    rc = racecheck_session
    dm = rc.device_module
    plan = dm.Stream()
    rc.name_stream(plan, "plan_stream")
    seq_lens = racecheck.name(torch.zeros(8, device="cuda"), "seq_lens")
    plan.wait_stream(dm.current_stream())
    with dm.stream(plan):
        seq_lens.add_(1)          # written on plan_stream
    out = seq_lens * 2            # read on the default stream, no wait: RC001


def test_clean(racecheck_session):
    rc = racecheck_session
    dm = rc.device_module
    plan = dm.Stream()
    rc.name_stream(plan, "plan_stream")
    seq_lens = racecheck.name(torch.zeros(8, device="cuda"), "seq_lens")
    plan.wait_stream(dm.current_stream())
    with dm.stream(plan):
        seq_lens.add_(1)
    dm.current_stream().wait_stream(plan)
    out = seq_lens * 2


def test_plain_math():
    assert torch.ones(2).sum().item() == 2


@pytest.mark.racecheck(enabled=False)
def test_opted_out():
    import racecheck
    assert racecheck.active_session() is None
'''


@pytest.fixture(scope="module", autouse=True)
def _warm_session():
    """Import everything a session pulls in before pytester snapshots sys.modules: an inline run
    that imported torch submodules itself would drop them afterwards, and torch cannot register
    its operator libraries twice in one process."""
    import torch
    import racecheck
    with racecheck.session(device="sim", route_cuda=True) as rc:
        s = rc.device_module.Stream()
        with rc.device_module.stream(s):
            torch.zeros(2, device="cuda").add_(1)
        rc.device_module.synchronize()


@pytest.fixture
def suite(pytester):
    pytester.makepyfile(test_engine=TESTS)
    return pytester


def test_racy_fails_clean_passes(suite):
    result = suite.runpytest("--racecheck", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=3, failed=1)
    out = result.stdout.str()
    assert "test_racy" in out and "FAILED test_engine.py::test_racy" in out
    # the failure text is the console report
    result.stdout.fnmatch_lines(["*racecheck: * race finding(s) in test_engine.py::test_racy*",
                                 "*RC001 read-after-write on seq_lens*", "*plan_stream*", "*fix:*",
                                 "* finding*"])
    assert "FAILED test_engine.py::test_clean" not in out
    result.stdout.fnmatch_lines(["*= racecheck =*", "3 test(s) checked on sim: * finding(s) in 1 test(s)*"])


def test_inert_without_flag(suite):
    result = suite.runpytest("-p", "no:cacheprovider")
    # without --racecheck the session fixture has nothing to hand out: both session tests fail loudly
    result.assert_outcomes(passed=2, failed=2)
    result.stdout.fnmatch_lines(["*no active racecheck session*"])
    assert "checked on sim" not in result.stdout.str()


def test_marker_enables_one_test(pytester):
    pytester.makepyfile(test_one='''
import pytest, torch, racecheck

@pytest.mark.racecheck
def test_marked(racecheck_session):
    dm = racecheck_session.device_module
    s = dm.Stream()
    x = racecheck.name(torch.zeros(4, device="cuda"), "buf")
    with dm.stream(s):
        x.add_(1)
    x.mul_(2)
''')
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*on buf*"])


def test_reports_written_and_suppressions(suite, tmp_path):
    supp = tmp_path / "racecheck.supp"
    supp.write_text("RC003 kv_cache * # never matches: reported stale\n")
    sarif, junit, js = tmp_path / "r.sarif", tmp_path / "r.xml", tmp_path / "r.json"
    result = suite.runpytest("--racecheck", "-p", "no:cacheprovider", f"--racecheck-suppressions={supp}",
                             f"--racecheck-report=sarif={sarif}", f"--racecheck-report=junit={junit}",
                             f"--racecheck-report=json={js}")
    result.assert_outcomes(passed=3, failed=1)
    result.stdout.fnmatch_lines(["*stale suppression*kv_cache*", f"*report written: {sarif}*"])
    doc = json.loads(sarif.read_text())
    results = doc["runs"][0]["results"]
    assert results and all(r["properties"]["tensor"] == "seq_lens" for r in results)
    cases = {c.get("name"): c for c in ET.parse(junit).getroot().iter("testcase")}
    assert set(cases) == {"test_racy", "test_clean", "test_plain_math"}
    assert cases["test_racy"].find("failure") is not None and cases["test_clean"].find("failure") is None
    assert cases["test_racy"].get("file") == "test_engine.py"
    assert json.loads(js.read_text())["findings"]


def test_suppressed_race_passes(suite, tmp_path):
    supp = tmp_path / "racecheck.supp"
    supp.write_text("RC00* seq_lens test_engine.py:* # known upstream race, tracked elsewhere\n")
    result = suite.runpytest("--racecheck", "-p", "no:cacheprovider", f"--racecheck-suppressions={supp}")
    result.assert_outcomes(passed=4)
    result.stdout.fnmatch_lines(["*no races found (* suppressed, 0 baselined)*"])


def test_bad_options_are_usage_errors(suite, tmp_path):
    result = suite.runpytest("--racecheck", "--racecheck-report=xml=a.xml")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*racecheck*unknown format*"])
    bad = tmp_path / "bad.supp"
    bad.write_text("RC001 seq_lens\n")
    result = suite.runpytest("--racecheck", f"--racecheck-suppressions={bad}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR


def test_route_cuda_marker_off_keeps_cpu_tensors_as_device_memory(pytester):
    """Tests written against `racecheck_session.device_module` with CPU tensors opt out of
    routing; under routing (the default) a CPU tensor is host memory, as on a GPU machine."""
    pytester.makepyfile(test_style='''
import pytest, torch, racecheck

def _race(rc):
    dm = rc.device_module
    s = dm.Stream()
    x = racecheck.name(torch.zeros(4), "x")
    s.wait_stream(dm.current_stream())
    with dm.stream(s):
        x.add_(1)
    x.sum()

@pytest.mark.racecheck(route_cuda=False)
def test_device_module_style(racecheck_session):
    _race(racecheck_session)

def test_gpu_program_style(racecheck_session):
    _race(racecheck_session)      # x is host memory here: host work, never a stream race
''')
    result = pytester.runpytest("--racecheck", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, failed=1)
    assert "FAILED test_style.py::test_device_module_style" in result.stdout.str()
