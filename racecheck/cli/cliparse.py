"""The argument parser every racecheck command line uses: a bad argument is a UsageError (exit 2).

Its own module, at the bottom of the CLI layer, so that `racecheck`, `racecheck-gate` and the
subcommands share it without importing each other.
"""
from __future__ import annotations

import argparse
import os
import re
import sys

from racecheck.core.errors import UsageError


class Parser(argparse.ArgumentParser):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # "-5s" is a value (for --budget to reject), not an unknown option
        self._negative_number_matcher = re.compile(r"^-\.?\d")

    def error(self, message):
        raise UsageError(f"{self.prog}: {message}")


def exit_now_after_engine(status: int) -> None:
    """A process that imported sglang can abort during interpreter teardown ("terminate called
    without an active exception": a native thread still joinable when its owner is destroyed),
    turning a finished run's status into 134; one that imported an engine's dependencies to
    fork its runs from (`scenarios/fresh.py`) spends seconds in teardown walking the millions
    of objects they made (3.4 s of a 36 s `racecheck run sglang-eagle-v2`). The work is done
    and reported: leave at once."""
    fresh = sys.modules.get("racecheck.scenarios.fresh")
    if "sglang" in sys.modules or (fresh is not None and fresh.warmed()):
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)
