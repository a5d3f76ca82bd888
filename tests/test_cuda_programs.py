"""Every public case written against plain torch.cuda runs unchanged on this CPU-only machine,
with the verdict of its device-module twin: in a routed session, and under `racecheck exec`."""
import json
import os
import sys

import pytest

import cuda_programs
from cases import EXPECTED
from helpers import in_session, messages, pairs, racecheck_cli

HERE = os.path.dirname(os.path.abspath(__file__))


# Unnamed tensors are named by the tightest live view covering the racing bytes: P24 reads
# `o = static_out[:4]`, which its twin names by the whole buffer.
SAME_BYTES = {"o": "static_out"}


def verdict(found) -> set:
    """(rule, tensor); a freed tensor (RC005) has no live holder left to name it, so there only
    the rule counts (its twin names it with racecheck.name)."""
    return {(rule, "<freed>" if rule == "RC005" else SAME_BYTES.get(tensor, tensor))
            for rule, tensor in found}


@pytest.mark.parametrize("case", sorted(EXPECTED))
def test_plain_torch_cuda_case_in_a_routed_session(case):
    rc = in_session(lambda rc: cuda_programs.CASES[case](), route_cuda=True)
    got = verdict(pairs(rc.findings))
    assert got == verdict(EXPECTED[case][1]), messages(rc.findings)
    assert not rc.internal_errors


@pytest.mark.parametrize("case", sorted(EXPECTED))
def test_plain_torch_cuda_case_under_exec(case, tmp_path):
    out = tmp_path / "findings.json"
    proc = racecheck_cli("exec", "--report", f"json={out}", "--",
                         sys.executable, os.path.join(HERE, "cuda_programs.py"), case)
    expected = EXPECTED[case][1]
    assert proc.returncode == (1 if expected else 0), proc.stdout + proc.stderr
    found = verdict((f["rule"], f["tensor"]) for f in json.loads(out.read_text())["findings"])
    assert found == verdict(expected), proc.stdout
