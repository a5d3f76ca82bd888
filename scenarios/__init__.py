"""Scenario models of inference-engine pipelines, with every upstream fix as a switch.

    from racecheck import scenarios
    scenarios.names()                                   # ["eagle-v2"]
    sc = scenarios.get("eagle-v2")
    sc.knobs, sc.switches, sc.variants
    cfg = sc.config(variant="no-mrope_recompute", overrides={"topk": "2"})
    res = scenarios.run(sc, cfg, device="sim", seed=0)
    res.findings, res.diff_ok, res.ok
"""
from __future__ import annotations

from racecheck.errors import UsageError

from .registry import (Knob, RunContext, RunResult, Scenario, Switch, Variant, compare_outputs,
                       parse_sets, reference_outputs, run, run_plain)

__all__ = ["names", "get", "register", "run", "Knob", "Switch", "Variant", "Scenario", "RunResult", "RunContext",
           "parse_sets", "compare_outputs", "reference_outputs", "run_plain"]

_SCENARIOS: dict = {}


def _load() -> dict:
    if not _SCENARIOS:
        from .eagle_v2 import SCENARIO as eagle_v2
        from .sglang import SCENARIO as sglang_eagle_v2
        for sc in (eagle_v2, sglang_eagle_v2):
            _SCENARIOS[sc.name] = sc
    return _SCENARIOS


def register(scenario: Scenario) -> Scenario:
    """Add a scenario (a test's toy pipeline, an engine's own model) to the registry."""
    _load()[scenario.name] = scenario
    return scenario


def names() -> list:
    return list(_load())


def get(name: str) -> Scenario:
    sc = _load().get(name)
    if sc is None:
        raise UsageError(f"unknown scenario '{name}' (known: {', '.join(_load())})")
    return sc
