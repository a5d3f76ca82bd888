"""The argument parser every racecheck command line uses: a bad argument is a UsageError (exit 2).

Its own module, at the bottom of the CLI layer, so that `racecheck`, `racecheck-gate` and the
subcommands share it without importing each other.
"""
from __future__ import annotations

import argparse
import re

from .errors import UsageError


class Parser(argparse.ArgumentParser):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # "-5s" is a value (for --budget to reject), not an unknown option
        self._negative_number_matcher = re.compile(r"^-\.?\d")

    def error(self, message):
        raise UsageError(f"{self.prog}: {message}")
