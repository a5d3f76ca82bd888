"""sglang without the WAR barrier (its default on ROCm and Ascend): the schedule stream rewrites
`req_to_token` rows (the radix cache repointing a request's row at its slots) while a forward
launched before may still read them (docs/FINDINGS.md).

Run through sglang's own front door. Needs sglang and triton.
"""
import importlib.util
import subprocess
import sys

import pytest

from helpers import run_alone, what_ran

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("sglang") is None or importlib.util.find_spec("triton") is None,
    reason="needs sglang and racecheck[sglang,triton] (scripts/setup.sh); CI installs them")

SC = "sglang-eagle-v2"
RC002_ROW = ("RC002", "ReqToTokenPool.req_to_token")


def _run(variant, **overrides):
    res = run_alone(SC, variant, **overrides)
    assert not res.internal_errors, res.internal_errors
    return res


def test_rocm_as_shipped_hands_the_row_over_while_the_forward_reads_it():
    res = _run("rocm-prefix-reuse")
    rows = [f for f in res.findings if (f.rule, f.tensor) == RC002_ROW]
    assert rows, f"{[f.message() for f in res.findings]}{what_ran(res)}"
    assert all(f.current.stream == "schedule_stream" and f.previous.kind == "read"
               for f in rows), [f.message() for f in rows]
    assert res.diff_ok                                   # issue order: no wrong values


def test_sglangs_own_switch_puts_the_barrier_back_on_rocm():
    res = _run("rocm-prefix-reuse", war_barrier="on")
    assert RC002_ROW not in res.signature(), [f.message() for f in res.findings]


@pytest.mark.parametrize("sets, text", [
    (["flavour=npu", "topk=2"], "npu flavour is modelled with topk 1"),
    (["topk=2", "draft_tokens=3"], "need draft_tokens >= steps + 1"),
    (["war_barrier=off"], "choose from auto, on"),
])
def test_unsupported_combinations_are_one_line_usage_errors(sets, text):
    cmd = [sys.executable, "-m", "racecheck", "run", SC]
    for item in sets:
        cmd += ["--set", item]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert p.returncode == 2 and text in p.stderr, p.stdout + p.stderr
    assert len(p.stderr.strip().splitlines()) == 1
