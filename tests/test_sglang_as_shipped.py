"""The as-shipped fuzz search of the real-engine scenarios draws only configurations some sglang
build runs (issue 28, point 1): no drawn example drops a synchronization site (the WAR barrier, a
padding write, a plan-stream wait), the WAR barrier stays on wherever sglang's default has it,
and the platform stays the runner's. A variant, `--drop-sync` or `--set drop_sync=` still drops
sites. Draws examples only: no engine runs, sglang need not be installed.
"""
import pytest
from hypothesis import HealthCheck, given, settings

from racecheck.drivers.fuzz import FuzzTarget
from racecheck.scenarios import sglang as sg
from racecheck.scenarios.sglang import strategy
from racecheck.scenarios.sglang.platform import WAR_BARRIER

SCENARIOS = ("sglang-eagle-v2", "sglang-overlap")
FLAVOURS = ("cuda", "hip", "npu")


def _examples(target, n):
    from racecheck.core.errors import UsageError
    out = []

    @settings(max_examples=n, database=None, derandomize=True, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(target.strategy())
    def collect(example):
        try:
            out.append((example, target.concrete_config(example)))
        except UsageError:       # rejected before any run, as the fuzzer does
            pass
    collect()
    return out


def _dropped(target, cfg):
    return target.sc.session_options(cfg, target.device).get("drop_sync", ())


@pytest.mark.parametrize("scenario", SCENARIOS)
@pytest.mark.parametrize("flavour", FLAVOURS)
def test_as_shipped_search_never_disables_shipped_synchronization(scenario, flavour):
    fixed = None if flavour == "cuda" else {"flavour": flavour}
    target = FuzzTarget(scenario, fixed=fixed)
    sc = target.sc
    # graphs is an engine-shape knob, varied by about one example in twenty (the search keeps
    # an engine's shape for many schedules): 300 examples see it both ways
    drawn = _examples(target, 300)
    assert len(drawn) > 240
    varied = set()
    for example, cfg in drawn:
        # the knobs the example sets are all shipped configurations (or held at the user's value)
        for name, value in example["config"].items():
            if value != sc.knobs[name].default and name not in (fixed or {}):
                varied.add(name)
        assert cfg["flavour"] == flavour and cfg["max_steps"] == sc.knobs["max_steps"].default
        assert not _dropped(target, cfg), example            # no site dropped (padding included)
        assert cfg["war_barrier"] in ("auto", "on")
        # the barrier sglang ships on cuda (is_cuda()) is on in every example
        assert WAR_BARRIER[cfg["flavour"]] or flavour != "cuda"
        barrier = WAR_BARRIER[cfg["flavour"]] or cfg["war_barrier"] == "on"
        assert barrier or not WAR_BARRIER[flavour]
    unclassified = varied - set(strategy.SHIPPED)
    assert not unclassified, f"drawn knobs not classified in strategy.SHIPPED: {unclassified}"
    assert not varied & set(strategy.HELD)
    # the search does explore: the shipped options are drawn both ways
    explored = {"arrivals", "graphs"} | ({"plan_stream"} if scenario == "sglang-eagle-v2" else set())
    assert explored <= varied, explored - varied


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_every_knob_is_classified(scenario):
    """A knob added to the scenarios must say whether the as-shipped search may vary it."""
    from racecheck import scenarios
    sc = scenarios.get(scenario)
    assert set(sc.knobs) <= set(strategy.SHIPPED) | set(strategy.HELD), \
        set(sc.knobs) - set(strategy.SHIPPED) - set(strategy.HELD)
    assert not set(strategy.SHIPPED) & set(strategy.HELD)
    # no knob has a value that removes the barrier: that is the variant no-war_barrier
    assert set(sc.knobs["war_barrier"].choices) == {"auto", "on"}


@pytest.mark.parametrize("scenario,variant", [("sglang-eagle-v2", "no-war_barrier"),
                                              ("sglang-eagle-v2", "no-verify_plan_wait"),
                                              ("sglang-overlap", "no-war_barrier")])
def test_a_variant_still_drops_its_site(scenario, variant):
    target = FuzzTarget(scenario, variant)
    want = target.sc.variant(variant).drop_sync
    for _example, cfg in _examples(target, 60):
        assert _dropped(target, cfg) == want


def test_an_explicit_drop_sync_still_drops_it():
    for fixed in ({"drop_sync": sg.SITE_WAR_BARRIER}, {"drop_sync": sg.SITE_WAR_BARRIER, "flavour": "hip"}):
        target = FuzzTarget("sglang-eagle-v2", fixed=fixed)
        for _example, cfg in _examples(target, 60):
            assert _dropped(target, cfg) == (sg.SITE_WAR_BARRIER,)
            assert cfg["flavour"] == fixed.get("flavour", "cuda")


def test_the_cli_keeps_the_runners_flavour():
    from racecheck.cli import main as cli
    from racecheck.cli.commands.fuzz_cmd import _fixed
    args = cli.build_parser().parse_args(["fuzz", "sglang-eagle-v2", "--set", "flavour=hip"])
    target = FuzzTarget(args.scenario, fixed=_fixed(args))
    assert all(cfg["flavour"] == "hip" for _e, cfg in _examples(target, 40))
