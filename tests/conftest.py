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


@pytest.fixture(autouse=True)
def _launch_records_folder_of_this_test(tmp_path_factory, monkeypatch):
    """Records kept on disk (instrumentation/launch_store.py) go to a folder of the test's own,
    which the processes it starts inherit."""
    from racecheck.instrumentation import launch_store
    monkeypatch.setenv(launch_store.ENV, str(tmp_path_factory.mktemp("launches")))
    yield
