"""sglang's hierarchical KV cache (HiCache) through the front door: `sglang-hicache`.

The installed sglang with `enable_hierarchical_cache` on, under a device pool small enough that
shared prefixes are backed up to the pinned host pool, evicted, and loaded back: as shipped it
reports nothing but the triaged start-up race, the tokens equal those of a run whose prefixes
never leave the device, every token held on both tiers has equal copies, and a dropped HiCache
fence is flagged (and, under an order that exposes it, tears the two copies apart). The sim pieces it needs
(`torch.cuda.cudart()`, `torch.tensor(..., device="cuda")` as a blocking upload) are tested
without sglang. The engine runs need sglang and triton (scripts/setup.sh).
"""
import importlib.util

import pytest

from racecheck import scenarios

from helpers import frames

needs_sglang = pytest.mark.skipif(
    importlib.util.find_spec("sglang") is None or importlib.util.find_spec("triton") is None,
    reason="needs sglang and racecheck[sglang,triton] (scripts/setup.sh); CI installs them")

SC = "sglang-hicache"
LOAD_FENCE = "sglang.srt.managers.cache_controller:HiCacheController.start_loading:wait_stream#0"
WRITE_FENCE = "sglang.srt.managers.cache_controller:HiCacheController.start_writing:wait_stream#0"
LAYER_WAIT = "sglang.srt.managers.cache_controller:LayerLoadingEvent.wait:wait_event#0"
TRANSFER_START_WAIT = "sglang.srt.mem_cache.l2_transfer:L2TransferEngine._submission:wait#0"


def _run(variant=None, **overrides):
    sc = scenarios.get(SC)
    res = scenarios.run(sc, sc.config(variant=variant, overrides=overrides), device="sim")
    assert not res.internal_errors, res.internal_errors
    return res


# -- sim: what the host pool needs, without sglang ------------------------------------------------

def test_a_tensor_made_on_the_device_from_host_data_is_a_blocking_upload():
    """torch.tensor(data, device="cuda") copies from pageable host memory and the host waits
    (ATen's copy_ with non_blocking=False synchronizes the stream): a later stream's read of it
    is ordered."""
    import torch

    import racecheck
    with racecheck.session(device="sim", route_cuda=True) as rc:
        side = torch.cuda.Stream()
        table = torch.tensor([1, 2, 3], device="cuda")
        with torch.cuda.stream(side):
            table * 2
    assert rc.findings == []


def test_cudart_host_register_succeeds_on_sim():
    import torch

    import racecheck
    with racecheck.session(device="sim", route_cuda=True):
        host = torch.empty(16)
        cudart = torch.cuda.cudart()
        assert int(cudart.cudaHostRegister(host.data_ptr(), 64, 0)) == 0
        assert int(cudart.cudaHostUnregister(host.data_ptr())) == 0


def test_the_scenario_is_listed_with_its_knobs():
    sc = scenarios.get(SC)
    for knob in ("write_policy", "speculative", "graphs", "device_tokens", "host_ratio",
                 "layout", "io_backend", "families", "chunked_prefill"):
        assert knob in sc.knobs
    from racecheck.scenarios.sglang.hicache import server_args
    assert "chunked_prefill_size" not in server_args(sc.config())   # sglang's own default
    assert server_args(sc.config(overrides={"chunked_prefill": "8"}))["chunked_prefill_size"] == 8
    cfg = sc.config()
    assert cfg["write_policy"] == "write_through"          # sglang's default
    ref = sc.reference_config(cfg)
    assert ref["device_tokens"] > cfg["device_tokens"]    # the reference evicts nothing


def test_a_release_without_a_host_pool_module_is_refused_in_one_line(monkeypatch):
    from racecheck.scenarios.sglang import hicache, surface
    monkeypatch.setattr(surface, "HICACHE_HOST_POOLS", (
        surface.Touch("racecheck_no_such_module.host:Pool", "", optional=True),))
    with pytest.raises(surface.EngineMismatch, match="racecheck_no_such_module.host:Pool: "
                                                     "sglang-hicache drives sglang's host KV pool"):
        with hicache.stand_ins():
            pass


# -- the real engine ---------------------------------------------------------------------------

@needs_sglang
@pytest.mark.parametrize("policy", ["write_through", "write_back", "write_through_selective"])
def test_as_shipped_is_clean_and_kv_comes_back_from_host(policy):
    from racecheck.scenarios.sglang import hicache
    extra = {"arrivals": hicache.SELECTIVE_ARRIVALS} if policy == "write_through_selective" else {}
    res = _run(write_policy=policy, **extra)
    assert res.findings == [], "\n".join(f.message() for f in res.findings)
    # the tokens equal those of the run whose prefixes never left the device
    assert res.diff_ok, res.diff_detail
    moved = res.outputs["hicache"]
    assert moved["device_to_host"] > 0 and moved["host_to_device"] > 0, moved
    # every token the tree holds on both tiers has equal copies (diff_ok says so), and there are
    tiers = res.outputs["kv_tiers"]
    assert tiers and set(tiers.values()) == {"agree"}
    # only the triaged start-up race (FutureMap, built after the host pool's blocking uploads)
    assert res.known and all(any("overlap_utils.py:" in fr and fr.endswith(" in __init__")
                                 for fr in frames(f)) for f in res.known)


@needs_sglang
@pytest.mark.parametrize("site, rule", [
    # the forward's per-layer wait for the load-back: it reads KV rows still being loaded
    (LAYER_WAIT, "RC001"),
    # the transfer stream's wait for the schedule stream's start event: the copy reads the
    # indices the schedule stream is still uploading
    (TRANSFER_START_WAIT, "RC001"),
])
def test_a_dropped_hicache_fence_is_flagged(site, rule):
    res = _run(drop_sync=site)
    assert not res.unmatched_drops
    assert res.findings and any(f.rule == rule for f in res.findings), \
        sorted(res.signature())
    streams = {s for f in res.findings for s in f.streams}
    assert streams & {"host_to_device_stream", "device_to_host_stream"}, streams

@needs_sglang
def test_a_dropped_transfer_start_wait_tears_the_copies_apart_under_a_late_schedule_stream():
    """The value consequence, not only the finding: with the schedule stream's work run last,
    the transfer stream copies rows by indices not yet uploaded, and the tree then holds a token
    whose host copy is not its device copy (`kv_tiers`). The same order with the wait is clean."""
    from racecheck.instrumentation.adversarial import AdversarialExecutor, normalize_plan
    sc = scenarios.get(SC)
    plan = normalize_plan({"priorities": {"schedule_stream": -5}})

    def run(**overrides):
        res = scenarios.run(sc, sc.config(overrides=overrides), device="sim",
                            session_options={"executor": AdversarialExecutor(plan)})
        assert not res.internal_errors, res.internal_errors
        return res
    dropped = run(drop_sync=TRANSFER_START_WAIT)
    torn = [f for f in dropped.findings if f.rule == "DIFF" and f.tensor == "kv_tiers"]
    assert torn, dropped.diff_detail
    assert "its device and host copies of the KV differ" in torn[0].detail
    shipped = run()
    assert shipped.diff_ok, shipped.diff_detail
    assert set(shipped.outputs["kv_tiers"].values()) == {"agree"}


def test_the_fuzzer_draws_hicache_configurations_sglang_ships():
    from hypothesis import given, settings

    from racecheck.scenarios.sglang import hicache
    sc = scenarios.get(SC)
    seen = set()

    @settings(max_examples=30, database=None, deadline=None)
    @given(sc.strategy({}, True))
    def check(example):
        assert set(example) <= set(hicache.HICACHE_SHIPPED), example
        sc.config(overrides=example)                      # every draw is a valid configuration
        seen.add(example.get("write_policy", "write_through"))
    check()
    assert len(seen) >= 2
    # a fixed knob is never drawn
    fixed = sc.strategy({"write_policy": "write_back"}, True)

    @settings(max_examples=10, database=None, deadline=None)
    @given(fixed)
    def keeps(example):
        assert "write_policy" not in example
    keeps()
