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


# -- the tiers oracle: a hierarchical cache's host copy of each token equals its device copy ----

class _Node:
    """A radix tree node as the oracle reads it: a key of tokens, device slots, host indices."""

    def __init__(self, tokens=(), slots=None, host=None):
        self.key = list(tokens)
        self.value = None if slots is None else torch.tensor(slots)
        self.host_value = None if host is None else torch.tensor(host)
        self.children = {}

    def add(self, child):
        self.children[len(self.children)] = child
        return child


def _tiers_engine(layout="page_first", slots=8, host_size=8, layers=2, heads=1, dim=4):
    """A scheduler with a device pool, a host pool in `layout`, and a tree whose two nodes hold
    tokens [5, 6] at slots 1, 2 (host 3, 4) and then [7] at slot 3 (host 5), copies equal."""
    scheduler, pool = _scheduler(slots=slots, layers=layers, heads=heads, dim=dim)
    for slot in range(slots):
        for layer in range(layers):
            pool.k_buffer[layer][slot] = slot * 10 + layer
            pool.v_buffer[layer][slot] = -(slot * 10 + layer)
    shape = (2, layers, host_size, heads, dim) if layout == "layer_first" else \
        (2, host_size, layers, heads, dim)
    buf = torch.zeros(shape)
    root = _Node()
    first = root.add(_Node([5, 6], slots=[1, 2], host=[3, 4]))
    first.add(_Node([7], slots=[3], host=[5]))
    for slot, index in ((1, 3), (2, 4), (3, 5)):
        _host_row(buf, layout, index).copy_(_device_row(pool, slot))
    controller = types.SimpleNamespace(mem_pool_host=types.SimpleNamespace(
        kv_buffer=buf, layout=layout))
    scheduler.tree_cache = types.SimpleNamespace(root_node=root, cache_controller=controller)
    return scheduler, pool, buf, first


def _device_row(pool, slot):
    return torch.stack([torch.stack([b[slot] for b in pool.k_buffer]),
                        torch.stack([b[slot] for b in pool.v_buffer])])


def _host_row(buf, layout, index):
    return buf[:, :, index] if layout == "layer_first" else buf[:, index]


def _verdict(scheduler):
    from racecheck.scenarios.sglang.oracles import kv_tiers
    return kv_tiers(scheduler)()


def test_every_token_on_both_tiers_agrees_in_either_host_layout():
    for layout in ("page_first", "layer_first"):
        scheduler, *_ = _tiers_engine(layout)
        got = _verdict(scheduler)
        assert sorted(k.split(":")[0] for k in got) == ["1", "2", "3"], layout
        assert set(got.values()) == {"agree"}


def test_a_host_row_that_is_not_the_device_row_is_reported_by_token_path():
    scheduler, pool, buf, _ = _tiers_engine()
    ok = _verdict(scheduler)
    buf[1, 4] += 1.0                        # the values of token 6's host copy (host index 4)
    got = _verdict(scheduler)
    bad = [k for k, v in got.items() if v != "agree"]
    assert len(bad) == 1 and bad[0].startswith("2:") and bad[0] in ok
    assert got[bad[0]].startswith("device ") and ", host " in got[bad[0]]
    diffs = compare_outputs({"kv_tiers": got}, {}, _DIFF_FIELDS)
    assert diffs == [("kv_tiers", f"kv_tiers of token path {bad[0]}: its device and host "
                                  f"copies of the KV differ ({got[bad[0]]})")]


def test_the_path_names_the_token_by_its_prefix_not_its_slot():
    scheduler, _, _, first = _tiers_engine()
    moved, _, _, other = _tiers_engine()
    other.value = torch.tensor([2, 1])      # same tokens, other slots and host rows
    other.host_value = torch.tensor([4, 3])
    assert set(_verdict(scheduler)) == set(_verdict(moved))
    first.key = [5, 9]                     # another prefix: the paths under it change
    assert len(set(_verdict(scheduler)) & set(_verdict(moved))) == 1


def test_nodes_with_a_transfer_in_flight_or_one_tier_are_not_checked():
    scheduler, pool, buf, first = _tiers_engine()
    buf.zero_()                            # no host row holds its device row
    scheduler.tree_cache.ongoing_write_through = {7: (first, 2, [first])}
    first.children[0].write_through_pending_id = 3
    assert _verdict(scheduler) == {}
    del scheduler.tree_cache.ongoing_write_through
    first.host_value = None                # evicted from the host / never backed up
    first.children[0].value = None         # evicted from the device
    assert _verdict(scheduler) == {}


def test_unified_tree_nodes_and_host_pool_groups_are_read_too():
    scheduler, pool, buf, first = _tiers_engine()
    plain = _verdict(scheduler)
    full = types.SimpleNamespace(value=first.value, host_value=first.host_value)
    first.component_data = [full, types.SimpleNamespace(value=None, host_value=None)]
    first.value = first.host_value = None  # a unified node keeps them per component
    host = scheduler.tree_cache.cache_controller.mem_pool_host
    scheduler.tree_cache.cache_controller.mem_pool_host = types.SimpleNamespace(
        anchor_entry=types.SimpleNamespace(host_pool=host))
    assert _verdict(scheduler) == plain


def test_bigram_keys_name_token_pairs():
    from racecheck.scenarios.sglang.oracles import _entries

    class Key:
        def __init__(self, raw, bigram):
            self.token_ids, self.is_bigram, self.extra_key = raw, bigram, None

        def __len__(self):
            return len(self.token_ids) - 1 if self.is_bigram else len(self.token_ids)
    assert _entries(Key([1, 2, 3], True)) == [(1, 2), (2, 3)]
    assert _entries(Key([1, 2, 3], False)) == [1, 2, 3]
    assert _entries(None) == []


def test_without_a_host_tier_there_is_no_field():
    from racecheck.scenarios.sglang.oracles import kv_tiers
    scheduler, pool = _scheduler()
    assert kv_tiers(scheduler) is None
    engine, *_ = _tiers_engine()
    engine.tree_cache.cache_controller.mem_pool_host.layout = "page_head"
    assert _verdict(engine) is None


def test_an_invariant_field_is_checked_in_the_run_whatever_the_reference_holds():
    fields = {"kv_tiers": {"key": "token path", "expect": "agree", "describe": "copies differ"}}
    got = {"kv_tiers": {"1:aa": "agree", "2:bb": "device x, host y"}}
    want = [("kv_tiers", "kv_tiers of token path 2:bb: copies differ (device x, host y)")]
    assert compare_outputs(got, {}, fields) == want
    assert compare_outputs(got, got, fields) == want          # the reference's own is no excuse
    assert compare_outputs({"kv_tiers": {"1:aa": "agree"}}, got, fields) == []
