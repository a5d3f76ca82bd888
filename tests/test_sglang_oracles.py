"""The KV oracle (scenarios/sglang/oracles.py) and how the differential oracle reports its field.

The oracle reads only the pool's per-layer key and value buffers through the scheduler's
allocator, so a pool of plain tensors stands in for sglang's here; the real engine's KV field is
checked in test_scenario_sglang.py."""
import types

import torch

from racecheck.scenarios import compare_outputs
from racecheck.scenarios.sglang import _DIFF_FIELDS
from racecheck.scenarios.sglang.oracles import kv_cache


def _scheduler(slots=9, layers=2, heads=2, dim=4, page_size=1):
    pool = types.SimpleNamespace(
        page_size=page_size,
        k_buffer=[torch.zeros(slots, heads, dim) for _ in range(layers)],
        v_buffer=[torch.zeros(slots, heads, dim) for _ in range(layers)])
    allocator = types.SimpleNamespace(get_kvcache=lambda: pool)
    return types.SimpleNamespace(token_to_kv_pool_allocator=allocator), pool


def test_every_written_slot_has_a_digest_of_all_its_layers():
    scheduler, pool = _scheduler()
    pool.k_buffer[0][3] = 1.0
    pool.v_buffer[1][5, 1, 2] = -2.0
    first = kv_cache(scheduler)
    assert sorted(first) == ["3", "5"]                      # never-written slots stay zero
    pool.k_buffer[1][5, 0, 0] = 7.0                          # another layer of slot 5
    second = kv_cache(scheduler)
    assert second["3"] == first["3"] and second["5"] != first["5"]


def test_the_reserved_padding_page_is_left_out():
    scheduler, pool = _scheduler(page_size=2)
    for slot in (0, 1, 2):
        pool.k_buffer[0][slot] = float(slot + 1)
    assert sorted(kv_cache(scheduler)) == ["2"]


def test_a_pool_without_key_and_value_buffers_reports_no_field():
    scheduler, pool = _scheduler()
    del pool.k_buffer
    assert kv_cache(scheduler) is None
    assert kv_cache(types.SimpleNamespace()) is None


def test_a_changed_slot_is_reported_by_slot():
    got = {"output_ids": {"0": [1, 2]}, "kv_cache": {"3": "aa", "5": "bb"}}
    ref = {"output_ids": {"0": [1, 2]}, "kv_cache": {"3": "aa", "5": "cc", "6": "dd"}}
    diffs = compare_outputs(got, ref, _DIFF_FIELDS)
    assert diffs == [("kv_cache", "kv_cache of slot 5: bb != serialized cc"),
                     ("kv_cache", "kv_cache of slot 6: None != serialized dd")]
    assert compare_outputs(got, dict(ref, kv_cache=got["kv_cache"]), _DIFF_FIELDS) == []
    # without the scenario's fields the keys are requests, as before
    assert compare_outputs({"output_ids": {"0": [1]}}, {"output_ids": {"0": [2]}}) == \
        [("output_ids", "output_ids of request 0: first difference at index 0: [1] != "
                        "serialized [2] (lengths 1 and 1)")]
