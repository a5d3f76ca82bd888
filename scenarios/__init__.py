"""Scenario models of inference-engine pipelines, with every upstream fix as a switch.

    from racecheck import scenarios
    scenarios.names()                                   # ["eagle-v2", "sglang-eagle-v2", ...]
    sc = scenarios.get("eagle-v2")
    sc.knobs, sc.switches, sc.variants
    cfg = sc.config(variant="no-mrope_recompute", overrides={"topk": "2"})
    res = scenarios.run(sc, cfg, device="sim", seed=0)
    res.findings, res.diff_ok, res.ok

Where scenarios come from, in this order (docs/ARCHITECTURE.md, "How to add a scenario"):
  * the ones racecheck ships (`BUILTIN`);
  * installed packages, through the entry-point group `racecheck.scenarios`: an engine repository
    declares `my-scenario = "my_engine.racecheck_scenario:SCENARIO"` and `racecheck run
    my-scenario` finds it, without a fork of racecheck;
  * files or package folders named by `--scenario-path` or RACECHECK_SCENARIO_PATH (os.pathsep
    separated); such a module defines `SCENARIO` (or a list `SCENARIOS`);
  * `register(scenario)` from Python (tests, notebooks).
A scenario is loaded when first asked for by name; `names()` loads them all.
"""
from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import threading
import zlib

from racecheck.core.errors import UsageError

from .registry import (Knob, RunContext, RunResult, Scenario, Switch, Variant, compare_outputs,
                       parse_sets, reference_outputs, run, run_plain)

__all__ = ["names", "get", "register", "add_path", "run", "Knob", "Switch", "Variant", "Scenario", "RunResult",
           "RunContext", "parse_sets", "compare_outputs", "reference_outputs", "run_plain", "ENTRY_POINT_GROUP",
           "PATH_ENV"]

ENTRY_POINT_GROUP = "racecheck.scenarios"
PATH_ENV = "RACECHECK_SCENARIO_PATH"
# name -> "module:attribute", the entry-point form (these ship inside racecheck)
BUILTIN = {"eagle-v2": "racecheck.scenarios.eagle_v2:SCENARIO",
           "sglang-eagle-v2": "racecheck.scenarios.sglang:SCENARIO",
           "sglang-overlap": "racecheck.scenarios.sglang:OVERLAP_SCENARIO",
           "sglang-hicache": "racecheck.scenarios.sglang.hicache:SCENARIO"}

_SCENARIOS: dict = {}          # name -> Scenario, every one loaded so far
_paths_loaded: set = set()
_LOADING = threading.RLock()    # get/names: the check and the load are one step


def _from_spec(name: str, spec: str, origin: str) -> Scenario:
    module, _, attr = spec.partition(":")
    try:
        obj = importlib.import_module(module)
        for part in filter(None, attr.split(".")):
            obj = getattr(obj, part)
    except Exception as exc:
        raise UsageError(f"scenario '{name}' ({origin} {spec}) failed to load: {type(exc).__name__}: {exc}") from None
    if not isinstance(obj, Scenario):
        raise UsageError(f"scenario '{name}' ({origin} {spec}) is a {type(obj).__name__}, not a Scenario")
    if obj.name != name:
        raise UsageError(f"scenario '{name}' ({origin} {spec}) is named '{obj.name}'")
    return obj


def _entry_points() -> dict:
    from importlib.metadata import entry_points
    return {ep.name: ep.value for ep in entry_points(group=ENTRY_POINT_GROUP)}


def _sources() -> dict:
    """name -> (spec, origin) of every scenario not loaded yet."""
    out = {n: (s, "built in as") for n, s in BUILTIN.items()}
    for n, s in _entry_points().items():
        out.setdefault(n, (s, f"entry point {ENTRY_POINT_GROUP}"))
    return {n: v for n, v in out.items() if n not in _SCENARIOS}


def _load_paths() -> None:
    for path in filter(None, os.environ.get(PATH_ENV, "").split(os.pathsep)):
        if path not in _paths_loaded:
            _load_path(path)


def _load_path(path: str) -> None:
    """Import a scenario file or package folder and register what it defines."""
    full = os.path.abspath(path)
    init = os.path.join(full, "__init__.py")
    if os.path.isdir(full) and os.path.isfile(init):
        file, search = init, [full]
    elif os.path.isfile(full) and full.endswith(".py"):
        file, search = full, None
    else:
        raise UsageError(f"--scenario-path {path}: not a Python file or a package folder (with __init__.py)")
    stem = os.path.splitext(os.path.basename(full))[0]
    modname = f"racecheck_scenario_path_{zlib.crc32(full.encode()):08x}_{stem}"
    spec = importlib.util.spec_from_file_location(modname, file, submodule_search_locations=search)
    module = importlib.util.module_from_spec(spec)
    sys.modules[modname] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[modname]
        raise UsageError(f"--scenario-path {path}: {type(exc).__name__}: {exc}") from None
    found = getattr(module, "SCENARIOS", None) or [getattr(module, "SCENARIO", None)]
    found = [s for s in found if s is not None]
    if not found or not all(isinstance(s, Scenario) for s in found):
        raise UsageError(f"--scenario-path {path}: defines no SCENARIO (a Scenario) or SCENARIOS (a list of them)")
    _paths_loaded.add(path)
    for s in found:
        _SCENARIOS[s.name] = s


def add_path(path) -> None:
    """Load the scenarios of a file or package folder now, and in child processes (fuzz workers,
    the gate's runs) through RACECHECK_SCENARIO_PATH."""
    path = os.fspath(path)
    _load_path(path)
    current = [p for p in os.environ.get(PATH_ENV, "").split(os.pathsep) if p]
    if path not in current:
        os.environ[PATH_ENV] = os.pathsep.join(current + [path])


def register(scenario: Scenario) -> Scenario:
    """Add a scenario (a test's toy pipeline, an engine's own model) to the registry."""
    names()
    _SCENARIOS[scenario.name] = scenario
    return scenario


def names() -> list:
    """Every scenario's name, racecheck's own first (loads them all)."""
    with _LOADING:
        for name, (spec, origin) in _sources().items():
            _SCENARIOS[name] = _from_spec(name, spec, origin)
        _load_paths()
    order = list(BUILTIN)
    return [n for n in order if n in _SCENARIOS] + [n for n in _SCENARIOS if n not in order]


def get(name: str) -> Scenario:
    with _LOADING:      # threads asking at once (scripts/history.py --jobs) load each one once
        _load_paths()
        sc = _SCENARIOS.get(name)
        if sc is not None:
            return sc
        source = _sources().get(name)
        if source is None:
            raise UsageError(f"unknown scenario '{name}' (known: {', '.join(names())})")
        sc = _SCENARIOS[name] = _from_spec(name, *source)
        return sc
