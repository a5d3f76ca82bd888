"""The scenario registry API: names, knobs, switches, variants, config validation."""
import json

import pytest

from racecheck import scenarios
from racecheck.core.errors import UsageError
from racecheck.scenarios.eagle_v2.server_args import format_schedule, parse_schedule


@pytest.fixture(scope="module")
def sc():
    return scenarios.get("eagle-v2")


def test_names_and_get(sc):
    assert scenarios.names()[0] == "eagle-v2"          # built in first; tests may register toys
    assert sc.name == "eagle-v2"


def test_unknown_scenario_is_a_usage_error():
    with pytest.raises(UsageError, match=r"unknown scenario 'x' \(known: eagle-v2[,)]"):
        scenarios.get("x")


def test_register_adds_a_scenario(sc):
    toy = scenarios.Scenario("toy-registry-test", "", [], [], [], runner=None, resolve=dict,
                             reference=dict, diff_fields={})
    try:
        assert scenarios.register(toy) is toy
        assert scenarios.get("toy-registry-test") is toy and "toy-registry-test" in scenarios.names()
    finally:
        scenarios._SCENARIOS.pop("toy-registry-test", None)


def test_every_switch_is_a_knob_on_by_default(sc):
    assert sc.switches == ["draft_done_event", "mrope_recompute", "req_pool_padding_zero",
                           "futuremap_publish", "mm_input_copy", "war_barrier", "record_stream_keepalive"]
    cfg = sc.config()
    for name in sc.switches:
        assert cfg[name] is True, name


def test_one_variant_per_switch(sc):
    assert sorted(sc.variants) == sorted(f"no-{s}" for s in sc.switches)
    for name, v in sc.variants.items():
        assert v.overrides[name[3:]] is False
        assert v.expected, name
        sc.config(variant=name)          # every variant's settings validate


def test_defaults_are_concrete_and_json_friendly(sc):
    cfg = sc.config()
    assert cfg["draft_tokens"] == 1 + cfg["steps"] * cfg["topk"]
    assert cfg["seq_len_fill_value"] == 1
    assert json.loads(json.dumps(cfg)) == cfg
    assert json.loads(json.dumps(sc.to_json()))["name"] == "eagle-v2"


def test_strings_from_set_are_parsed(sc):
    cfg = sc.config(overrides={"plan_stream": "on", "topk": "2", "buckets": "8, 2,4", "graphs": "off"})
    assert cfg["plan_stream"] is True and cfg["graphs"] is False
    assert cfg["topk"] == 2 and cfg["draft_tokens"] == 1 + 3 * 2
    assert cfg["buckets"] == [2, 4, 8]


def test_variant_then_overrides(sc):
    cfg = sc.config(variant="no-mrope_recompute", overrides={"topk": "2"})
    assert cfg["mrope_recompute"] is False and cfg["plan_stream"] is True and cfg["mrope"] is True
    assert cfg["topk"] == 2


def test_auto_knobs_follow_the_flavour(sc):
    hip = sc.config(overrides={"flavour": "hip"})
    assert hip["war_barrier"] is False and hip["seq_len_fill_value"] == 1
    npu = sc.config(overrides={"flavour": "npu"})
    assert npu["war_barrier"] is False and npu["seq_len_fill_value"] == 0
    assert sc.config(overrides={"flavour": "hip", "war_barrier": "on"})["war_barrier"] is True


@pytest.mark.parametrize("overrides, message", [
    ({"nope": "1"}, r"unknown knob 'nope' for scenario 'eagle-v2'"),
    ({"plan_stream": "maybe"}, r"bad value 'maybe' for knob 'plan_stream': expected on or off"),
    ({"topk": "9"}, r"knob 'topk': must be <= 4"),
    ({"flavour": "tpu"}, r"knob 'flavour': choose from cuda, hip, npu"),
    ({"schedule": "0:3"}, r"knob 'schedule': schedule entry '0:3'"),
    ({"buckets": "0,2"}, r"knob 'buckets': bucket sizes must be >= 1"),
    ({"draft_tokens": "9"}, r"draft_tokens=9 exceeds 1 \+ steps \* topk = 4"),
])
def test_bad_config_is_one_clear_usage_error(sc, overrides, message):
    with pytest.raises(UsageError, match=message) as exc:
        sc.config(overrides=overrides)
    assert "\n" not in str(exc.value)


def test_unknown_variant(sc):
    with pytest.raises(UsageError, match=r"unknown variant 'no-such' of scenario 'eagle-v2' \(known: no-"):
        sc.config(variant="no-such")


def test_parse_sets():
    assert scenarios.parse_sets(["a=1", "b = on"]) == {"a": "1", "b": "on"}
    with pytest.raises(UsageError, match="expected KNOB=VALUE"):
        scenarios.parse_sets(["plan_stream"])


def test_schedule_round_trip():
    arrivals = parse_schedule("2:+1x3; 0:+3x8 6:+2")
    assert format_schedule(arrivals) == "0:+3x8;2:+1x3;6:+2"
    assert format_schedule(parse_schedule([[0, 3, 8], [6, 2, None]])) == "0:+3x8;6:+2"
    with pytest.raises(ValueError):
        parse_schedule("0:+0")


def _counting_scenario(reference):
    calls = []

    def runner(cfg, ctx):
        calls.append(ctx.session is not None)
        return {"out": {"r0": [1, 2]}}
    toy = scenarios.Scenario("toy-reference-test", "", [scenarios.Knob("k", 1, "int", "a knob")],
                             [], [], runner=runner, resolve=dict, reference=reference,
                             diff_fields={})
    return toy, calls


def test_a_run_of_its_own_reference_configuration_on_sim_is_its_own_reference():
    # issue order on sim: the serialized run would recompute the same values
    toy, calls = _counting_scenario(reference=dict)
    res = scenarios.run(toy, {}, device="sim")
    assert calls == [True] and res.diff_ok and res.reference_outputs == res.outputs


def test_the_reference_runs_where_it_can_differ():
    from racecheck.instrumentation.adversarial import AdversarialExecutor
    toy, calls = _counting_scenario(reference=lambda cfg: dict(cfg, k=2))   # another config
    scenarios.run(toy, {}, device="sim")
    assert calls == [True, False]
    toy, calls = _counting_scenario(reference=dict)                      # another order
    scenarios.run(toy, {}, device="sim", session_options={"executor": AdversarialExecutor({})})
    assert calls == [True, False]


def test_threads_asking_for_a_scenario_at_once_all_get_it(monkeypatch):
    """scripts/history.py --jobs summarizes runs on threads: a load finishing between another
    thread's lookup and its look at what is left to load made that thread's scenario unknown.
    The two threads are stepped into that order where nothing keeps them out of it."""
    import threading

    import racecheck.scenarios as registry
    from_spec, sources = registry._from_spec, registry._sources
    second_looked, first_done = threading.Event(), threading.Event()
    second = []

    def slow_from_spec(*args):
        second_looked.wait(0.5)        # the lock keeps the second thread out: go on alone
        return from_spec(*args)

    def late_sources():
        if threading.current_thread() in second:
            second_looked.set()
            first_done.wait(5)
        return sources()
    monkeypatch.setattr(registry, "_from_spec", slow_from_spec)
    monkeypatch.setattr(registry, "_sources", late_sources)
    monkeypatch.delitem(registry._SCENARIOS, "eagle-v2", raising=False)
    got, errors = [], []

    def ask():
        try:
            got.append(registry.get("eagle-v2").name)
        except Exception as exc:      # noqa: BLE001 (the failure under test)
            errors.append(exc)
    one, two = threading.Thread(target=ask), threading.Thread(target=ask)
    second.append(two)
    one.start()
    two.start()
    one.join()
    first_done.set()
    two.join()
    assert errors == [] and got == ["eagle-v2", "eagle-v2"]
