"""Every row of docs/CASES.md on the sim backend: exactly the ground-truth verdict."""
import pytest

from cases import EXPECTED
from helpers import case_on_sim, messages, pairs


@pytest.mark.parametrize("case", sorted(EXPECTED))
def test_public_case_on_sim(case):
    program, expected = EXPECTED[case]
    rc = case_on_sim(program)
    assert set(pairs(rc.findings)) == expected, messages(rc.findings)
    assert not rc.internal_errors
