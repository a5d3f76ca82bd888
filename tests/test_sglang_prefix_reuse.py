"""sglang without the WAR barrier (its default on ROCm and Ascend): the schedule stream rewrites
`req_to_token` rows (the radix cache repointing a request's row at its slots) while a forward
launched before may still read them (docs/FINDINGS.md).

Run through sglang's own front door. Needs sglang and triton.
"""
import importlib.util
import re
import subprocess
import sys

import pytest

from helpers import racecheck_cli, run_alone, what_ran

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


def test_held_right_after_the_publish_the_forward_still_changes_no_token_and_no_kv_slot():
    """docs/FINDINGS.md ("Why the values hold"): on the ROCm branches the host waits for the
    publish, so the window is what the forward runs after it. Held there (and deprioritized
    under the adversarial executor), the race is reported and the values, tokens and every KV
    slot, are still the serialized run's."""
    proc = racecheck_cli("run", SC, "--variant", "rocm-prefix-reuse", "--set",
                         "publish_delay_us=200000", "--plan",
                         '{"priorities": {"forward_stream": -1}}', timeout=900)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "ReqToTokenPool.req_to_token" in proc.stdout
    assert "differential: outputs equal the serialized run" in proc.stdout, proc.stdout[-2000:]
    holds = re.search(r"executor: (\d+) device ops ordered by the plan, (\d+) holds", proc.stdout)
    assert holds and int(holds.group(2)) > 0, proc.stdout[-2000:]


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
