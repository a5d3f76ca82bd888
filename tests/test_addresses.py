"""StorageSpans: which storage each address of an interpreted launch's access falls in."""
from __future__ import annotations

import numpy as np

from racecheck.instrumentation.addresses import StorageSpans


def _u(*xs):
    return np.asarray(xs, dtype=np.uint64)


def test_addresses_by_span_in_the_order_given():
    spans = StorageSpans([300, 100, 200], [50, 100, 10])
    got = spans.locate(_u(100, 199, 200, 209, 210, 299, 300, 349, 350, 99, 0))
    assert got.tolist() == [1, 1, 2, 2, -1, -1, 0, 0, -1, -1, -1]


def test_empty_spans_hold_nothing_and_a_repeated_start_counts_once():
    spans = StorageSpans([100, 100, 100, 500], [0, 40, 40, 8])
    assert spans.locate(_u(100, 139, 140, 503)).tolist() == [1, 1, -1, 3]
    assert StorageSpans([], []).locate(_u(1, 2)).tolist() == [-1, -1]
    assert StorageSpans([], []).holding(1, 2) is None


def test_one_span_holding_a_whole_access():
    spans = StorageSpans([1000, 2000], [100, 100])
    assert spans.holding(1000, 1099) == 0
    assert spans.holding(2050, 2060) == 1
    assert spans.holding(1050, 2050) is None        # two storages: per address instead
    assert spans.holding(1100, 1100) is None        # the byte past the end
    assert spans.holding(999, 1000) is None


def test_addresses_near_the_top_of_the_address_space():
    top = np.iinfo(np.uint64).max - 64
    spans = StorageSpans([top], [32])
    assert spans.locate(_u(top, top + 31, top + 32)).tolist() == [0, 0, -1]
