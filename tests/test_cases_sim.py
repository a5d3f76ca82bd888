"""Every row of docs/CASES.md on the sim backend: exactly the ground-truth verdict."""
import pytest

import racecheck

from cases import EXPECTED


@pytest.mark.parametrize("case", sorted(EXPECTED))
def test_public_case_on_sim(case):
    program, expected = EXPECTED[case]
    with racecheck.session(device="sim") as rc:
        keep = program(rc.device_module, "cpu")  # noqa: F841 - tensors outlive the snippet
    got = {(f.rule, f.tensor) for f in rc.findings}
    assert got == expected, "\n".join(f.message() for f in rc.findings)
    assert not rc.internal_errors
