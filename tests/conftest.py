import os
import sys

sys.path.insert(0, os.path.dirname(__file__))

import pytest


@pytest.fixture(autouse=True)
def _launch_records_of_this_test_only():
    """Interpreted Triton launches are replayed from a per-process record
    (instrumentation/launch_cache.py): a test sees only its own launches recorded."""
    from racecheck.instrumentation import launch_cache
    launch_cache.CACHE.clear()
    yield
