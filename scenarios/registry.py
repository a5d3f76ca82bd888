"""Scenario registry: knobs, fix switches, variants, and one run with both oracles.

Everything here is JSON-friendly (plain dicts, lists, strings, ints, bools) so the CLI, the fuzzer
and repro records can pass configurations around as text.
"""
from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from racecheck.core.devices import check_device
from racecheck.core.errors import UsageError
from racecheck.core.findings import Access, Finding

_BOOL_TRUE = {"on", "true", "yes", "1"}
_BOOL_FALSE = {"off", "false", "no", "0"}


@dataclass(frozen=True)
class Knob:
    """One setting of a scenario. `type` is "bool", "int", "choice", "int-list" or "str"."""

    name: str
    default: Any
    type: str
    help: str
    choices: tuple = ()
    validator: Callable | None = None   # value -> normalized value; raises ValueError with a reason
    minimum: int | None = None
    maximum: int | None = None

    def parse(self, value):
        """A concrete, validated value from a CLI string or a Python value."""
        try:
            v = self._convert(value)
            if self.validator is not None:
                v = self.validator(v)
        except (TypeError, ValueError) as exc:
            raise UsageError(f"bad value {value!r} for knob '{self.name}': {exc}") from None
        return v

    def _convert(self, value):
        t = self.type
        if t == "bool":
            if isinstance(value, bool):
                return value
            s = str(value).strip().lower()
            if s in _BOOL_TRUE:
                return True
            if s in _BOOL_FALSE:
                return False
            raise ValueError("expected on or off")
        if t == "int":
            if isinstance(value, bool):
                raise ValueError("expected an integer")
            v = int(str(value).strip(), 0) if isinstance(value, str) else int(value)
            if self.minimum is not None and v < self.minimum:
                raise ValueError(f"must be >= {self.minimum}")
            if self.maximum is not None and v > self.maximum:
                raise ValueError(f"must be <= {self.maximum}")
            return v
        if t == "choice":
            s = str(value).strip().lower()
            if s not in self.choices:
                raise ValueError(f"choose from {', '.join(self.choices)}")
            return s
        if t == "int-list":
            if isinstance(value, str):
                parts = [p for p in value.replace(" ", "").split(",") if p]
                vals = [int(p) for p in parts]
            else:
                vals = [int(v) for v in value]
            if not vals:
                raise ValueError("expected a comma-separated list of integers")
            return vals
        return value if not isinstance(value, str) else value.strip()

    def describe_type(self) -> str:
        if self.type == "choice":
            return "|".join(self.choices)
        if self.type == "bool":
            return "on|off"
        if self.type == "int":
            lo = "" if self.minimum is None else str(self.minimum)
            hi = "" if self.maximum is None else str(self.maximum)
            return f"int {lo}..{hi}" if (lo or hi) else "int"
        return self.type

    def format(self, value) -> str:
        if isinstance(value, bool):
            return "on" if value else "off"
        if isinstance(value, (list, tuple)):
            return ",".join(str(v) for v in value)
        return str(value)

    def to_json(self) -> dict:
        return {"name": self.name, "default": self.default, "type": self.type, "help": self.help,
                "choices": list(self.choices), "minimum": self.minimum, "maximum": self.maximum}


@dataclass(frozen=True)
class Switch:
    """An upstream fix the scenario models; on by default, a variant turns it off."""

    name: str
    upstream: str
    tensor: str
    rule: str
    help: str

    def to_json(self) -> dict:
        return {"name": self.name, "upstream": self.upstream, "tensor": self.tensor, "rule": self.rule,
                "help": self.help}


@dataclass(frozen=True)
class Variant:
    """The pipeline with one fix switch off, under the knob settings where the engine has that bug.

    `expected` lists (rule, tensor) pairs that must be among the findings; `also` lists pairs that
    may additionally appear (secondary symptoms of the same missing edge). `value_visible` is
    False where the race, though real, cannot change this model's outputs (`why_benign` says why):
    the manifestation measurement expects wrong values only from the others.
    """

    name: str
    overrides: dict
    expected: list
    description: str
    also: list = field(default_factory=list)
    value_visible: bool = True
    why_benign: str = ""
    drop_sync: tuple = ()       # synchronization sites the variant drops (engine code unchanged)

    def to_json(self) -> dict:
        return {"name": self.name, "overrides": dict(self.overrides),
                "drop_sync": list(self.drop_sync),
                "expected": [list(p) for p in self.expected], "also": [list(p) for p in self.also],
                "description": self.description, "value_visible": self.value_visible,
                "why_benign": self.why_benign}


@dataclass
class RunResult:
    """One scenario run: detector findings plus the differential verdict."""

    scenario: str
    config: dict
    device: str
    seed: int
    findings: list
    outputs: dict
    reference_outputs: dict
    diff_ok: bool
    diff_detail: str
    internal_errors: list = field(default_factory=list)
    seconds: float = 0.0
    stats: dict = field(default_factory=dict)
    sync_sites: list = field(default_factory=list)      # [Site] the run executed (sim)
    unmatched_drops: list = field(default_factory=list)  # drop_sync entries no site matched
    known: list = field(default_factory=list)   # findings of the scenario's triaged upstream races

    @property
    def ok(self) -> bool:
        return not self.findings and self.diff_ok

    @property
    def race_findings(self) -> list:
        return [f for f in self.findings if f.rule != "DIFF"]

    def signature(self) -> set:
        return {(f.rule, f.tensor) for f in self.findings}

    def to_json(self) -> dict:
        return {"scenario": self.scenario, "config": self.config, "device": self.device,
                "seed": self.seed, "findings": [f.to_json() for f in self.findings],
                "outputs": self.outputs, "reference_outputs": self.reference_outputs,
                "diff_ok": self.diff_ok, "diff_detail": self.diff_detail,
                "internal_errors": list(self.internal_errors), "seconds": self.seconds,
                "stats": dict(self.stats), "known_findings": [f.to_json() for f in self.known]}


def _registered(name: str) -> "Scenario":
    """The scenario registered as `name` (the registry is the package's, `racecheck.scenarios`,
    which imports this module)."""
    return sys.modules[__package__].get(name)


class Scenario:
    """A named pipeline model: knobs (incl. one per fix switch), variants and a run function.

    `runner(cfg, ctx)` runs the pipeline once on `ctx` (device module, device string, session or
    None) and returns its outputs as a JSON-friendly dict of {field: {request: value}}.
    `resolve(cfg)` fills in knob values that depend on others ("auto") and checks combinations.
    `reference(cfg)` is the serialized configuration the differential oracle compares against.
    `diff_fields` (a dict, or a function returning one on first use) says, per output field, which
    engine function produces and consumes it, for DIFF findings.
    `session_options(cfg, device)` (optional) returns what its runs on `device` need from
    racecheck.session (e.g. torch.cuda routing on sim); the sites cfg drops are added to them.
    `strategy(sc, fixed, explore)` (optional) returns a Hypothesis strategy of the overrides of
    the knobs named in `drawn_knobs`: what only the scenario knows how to draw well (a request
    schedule, graph buckets); see `Scenario.strategy`. Other knobs are drawn from their types.
    """

    def __init__(self, name: str, description: str, knobs: list, switches: list, variants: list,
                 runner: Callable, resolve: Callable, reference: Callable, diff_fields,
                 session_options: Callable | None = None, strategy: Callable | None = None,
                 drawn_knobs: tuple = ()):
        self.name = name
        self.description = description
        self.knobs = {k.name: k for k in knobs}
        self.knobs.setdefault(DROP_SYNC.name, DROP_SYNC)
        self._session_options = session_options
        self.switch_info = {s.name: s for s in switches}
        self.switches = [s.name for s in switches]
        self.variants = {v.name: v for v in variants}
        self._runner = runner
        self._resolve = resolve
        self._reference = reference
        self._diff_fields = diff_fields
        self._strategy = strategy
        self.drawn_knobs = tuple(drawn_knobs)
        unknown = [k for k in self.drawn_knobs if k not in self.knobs]
        if unknown:
            raise ValueError(f"scenario {name!r}: drawn_knobs names no knob {', '.join(unknown)}")

    def __reduce__(self):
        # to another process by its registered name: its functions need not pickle
        return (_registered, (self.name,))

    def strategy(self, fixed: dict, explore: bool):
        """The fuzzer's hook: a strategy of overrides for `drawn_knobs`, or None (draw none).

        `fixed` holds the values the run must keep (a variant's, the user's): leave those keys
        out. `explore` False means the example runs the configured pipeline, so draw only what
        must vary for the scenario to be exercised at all (its batch schedule); True means vary
        the rest of its shape too. Called only while fuzzing (Hypothesis need not be importable
        otherwise).
        """
        if self._strategy is None:
            return None
        return self._strategy(self, fixed, explore)

    @property
    def diff_fields(self) -> dict:
        if callable(self._diff_fields):
            self._diff_fields = self._diff_fields()
        return self._diff_fields

    def __repr__(self):
        return f"<scenario {self.name}>"

    def defaults(self) -> dict:
        return {k: v.default for k, v in self.knobs.items()}

    def variant(self, name: str) -> Variant:
        v = self.variants.get(name)
        if v is None:
            raise UsageError(f"unknown variant '{name}' of scenario '{self.name}' "
                             f"(known: {', '.join(self.variants)})")
        return v

    def config(self, variant: str | None = None, overrides: dict | None = None) -> dict:
        """Validated concrete knob values: defaults, then the variant's settings, then overrides."""
        raw = self.defaults()
        if variant:
            v = self.variant(variant)
            raw.update(v.overrides)
            raw[DROP_SYNC.name] = ",".join(v.drop_sync)
        for key, value in (overrides or {}).items():
            if key not in self.knobs:
                raise UsageError(f"unknown knob '{key}' for scenario '{self.name}' "
                                 f"(known: {', '.join(self.knobs)})")
            raw[key] = value
        cfg = {}
        for key, knob in self.knobs.items():
            value = raw[key]
            cfg[key] = value if value == "auto" and _allows_auto(knob) else knob.parse(value)
        try:
            return self._resolve(cfg)
        except ValueError as exc:
            raise UsageError(f"scenario '{self.name}': {exc}") from None

    def reference_config(self, cfg: dict) -> dict:
        return self._reference(dict(cfg, **{DROP_SYNC.name: ""}))

    def session_options(self, cfg: dict, device: str) -> dict:
        """Options the scenario's runs on `device` need from racecheck.session (e.g. torch.cuda
        routing on sim), plus the synchronization sites cfg drops and the triaged races its
        runs set apart (`split_known`: the checker names none it can tell by site alone)."""
        opts = dict(self._session_options(cfg, device)) if self._session_options else {}
        if getattr(self, "known_findings", None):
            opts["known_races"] = self.known_findings
        drop = drop_sync_sites(cfg)
        if drop:
            opts["drop_sync"] = drop
        return opts

    def run_once(self, cfg: dict, ctx) -> dict:
        return self._runner(cfg, ctx)

    def to_json(self) -> dict:
        return {"name": self.name, "description": self.description,
                "knobs": [k.to_json() for k in self.knobs.values()],
                "switches": [s.to_json() for s in self.switch_info.values()],
                "variants": [v.to_json() for v in self.variants.values()]}


def _sites_value(value) -> str:
    parts = value if isinstance(value, (list, tuple)) else str(value).split(",")
    return ",".join(p.strip() for p in parts if str(p).strip())


DROP_SYNC = Knob("drop_sync", "", "str", "synchronization sites dropped for the run (comma-separated "
                 "site ids or patterns; `racecheck mutate SCENARIO --list` shows them)",
                 validator=_sites_value)


def drop_sync_sites(cfg: dict) -> tuple:
    return tuple(p for p in str(cfg.get(DROP_SYNC.name) or "").split(",") if p)


def _allows_auto(knob: Knob) -> bool:
    return knob.default == "auto"


def parse_sets(items) -> dict:
    """`["plan_stream=on", "topk=2"]` -> {"plan_stream": "on", "topk": "2"} (values stay strings)."""
    out = {}
    for item in items or ():
        key, sep, value = str(item).partition("=")
        key = key.strip()
        if not sep or not key:
            raise UsageError(f"--set {item!r}: expected KNOB=VALUE")
        out[key] = value.strip()
    return out


class RunContext:
    """What the pipeline runs against: a device module, a device string, and the session if any."""

    def __init__(self, dm, device: str, session=None, pin: bool = True, seed: int = 0):
        self.dm = dm
        self.device = device
        self.session = session
        self.pin = pin
        self.seed = seed

    def name_stream(self, stream, name: str) -> None:
        if self.session is not None:
            self.session.name_stream(stream, name)


_REFERENCE_CACHE: dict = {}
_REFERENCE_CACHE_SIZE = 64


def _reference_key(sc: Scenario, cfg: dict, seed: int) -> tuple:
    return (sc, json.dumps(sc.reference_config(cfg), sort_keys=True), seed)


def _remember_reference(sc: Scenario, cfg: dict, seed: int, out: dict) -> None:
    if len(_REFERENCE_CACHE) >= _REFERENCE_CACHE_SIZE:
        _REFERENCE_CACHE.pop(next(iter(_REFERENCE_CACHE)))
    _REFERENCE_CACHE[_reference_key(sc, cfg, seed)] = out


def reference_outputs(sc: Scenario, cfg: dict, seed: int) -> dict:
    """Outputs of the serialized run (one stream, no graphs, no overlap), outside any session."""
    hit = _REFERENCE_CACHE.get(_reference_key(sc, cfg, seed))
    if hit is not None:
        return hit
    from . import fresh
    if fresh.mode(sc, "sim"):
        out = fresh.start_for(sc, "sim", _serialized, sc, cfg, seed).result()
    else:
        out = _serialized(sc, cfg, seed)
    _remember_reference(sc, cfg, seed, out)
    return out


def _serialized(sc: Scenario, cfg: dict, seed: int) -> dict:
    from .serial import SerialDeviceModule
    return sc.run_once(sc.reference_config(cfg),
                       RunContext(SerialDeviceModule(), "cpu", None, pin=False, seed=seed))


def run(sc: Scenario, cfg: dict, device: str = "sim", seed: int = 0,
        session_options: dict | None = None, keep_known: bool = False,
        save_trace: str | None = None) -> RunResult:
    """Run `cfg` once under racecheck.session(device, **session_options); compare with the reference.

    Findings that match the scenario's triaged upstream races (`Scenario.known_findings`, a
    suppressions file whose every entry cites docs/FINDINGS.md) are set apart in `known`, so that
    runs, fuzzing and mutation analysis report what is new; `keep_known` reports them too.
    `save_trace`: write the instrumented run's trace there (JSON lines: `racecheck check`,
    `racecheck explain`), from the process that ran it."""
    from . import fresh

    check_device(device)
    cfg = sc.config(overrides=cfg)
    t0 = time.perf_counter()
    options = sc.session_options(cfg, device)
    options.update(session_options or {})
    if keep_known:
        options.pop("known_races", None)
    own_ref = device == "sim" and not session_options and _is_own_reference(sc, cfg)
    ref_pending = None
    own_process = fresh.mode(sc, device)
    if not own_ref and own_process and \
            _REFERENCE_CACHE.get(_reference_key(sc, cfg, seed)) is None:
        # the serialized run beside the instrumented one (on a GPU both are new interpreters:
        # this process may not fork once CUDA is initialized)
        ref_pending = fresh.start_for(sc, device, _serialized, sc, cfg, seed)
    try:
        if own_process:
            session = fresh.start_for(sc, device, _instrumented, sc, cfg, device, seed,
                                      options, save_trace).result()
            for value in options.values():            # the child's executor state, here
                if hasattr(value, "adopt"):
                    value.adopt(session.executor)
        else:
            session = _instrumented(sc, cfg, device, seed, options, save_trace)
    except BaseException:
        if ref_pending is not None:
            ref_pending.cancel()
        raise
    outputs = session.outputs
    findings, known = split_known(sc, session.findings)
    if keep_known:
        findings, known = findings + known, []
    seconds = time.perf_counter() - t0
    if own_ref:
        # sim's eager executor runs device work in host issue order: a run of the reference
        # configuration itself, nothing dropped, computes exactly the serialized run's values
        ref = outputs
        _remember_reference(sc, cfg, seed, outputs)
    elif ref_pending is not None:
        ref = ref_pending.result()
        _remember_reference(sc, cfg, seed, ref)
    else:
        ref = reference_outputs(sc, cfg, seed)
    diffs = compare_outputs(outputs, ref, sc.diff_fields)
    diff_ok = not diffs
    detail = "outputs equal the serialized run" if diff_ok else "; ".join(d[1] for d in diffs[:6])
    if len(diffs) > 6:
        detail += f"; ... {len(diffs) - 6} more"
    for fieldname, text in _first_per_field(diffs):
        findings.append(diff_finding(sc, fieldname, text))
    return RunResult(sc.name, cfg, device, seed, findings, outputs, ref, diff_ok, detail,
                     session.internal_errors, seconds, session.stats, session.sync_sites,
                     session.unmatched_drops, known)


@dataclass
class SessionResult:
    """What one instrumented run leaves behind, in a form that crosses a process boundary."""

    outputs: dict
    findings: list
    internal_errors: list
    stats: dict
    sync_sites: list
    unmatched_drops: list
    executor: dict | None = None         # the executor's state (see AdversarialExecutor.adopt)
    # how far the checker's C engine went (FastChecker.engine_path; empty for the Python Checker)
    engine: dict = field(default_factory=dict)


def _instrumented(sc: Scenario, cfg: dict, device: str, seed: int, options: dict,
                  save_trace: str | None = None) -> SessionResult:
    import racecheck
    torch_device = "cpu" if device == "sim" else device
    if save_trace:
        options = dict(options, record_trace=True)
    with racecheck.session(device=device, **options) as rc:
        ctx = RunContext(rc.device_module, torch_device, rc, pin=True, seed=seed)
        outputs = sc.run_once(cfg, ctx)
    if save_trace:
        rc.save_trace(save_trace)
    executor = options.get("executor")
    return SessionResult(outputs, list(rc.findings), list(rc.internal_errors),
                         {"events": rc.checker.events_processed}, rc.sync_sites.sites(),
                         rc.sync_sites.unmatched_drops(),
                         executor.export() if hasattr(executor, "export") else None,
                         rc.checker.engine_path() if hasattr(rc.checker, "engine_path") else {})


def unexecuted_drops(dropped, executed_ids) -> UsageError:
    """The usage error for --drop-sync entries that matched no synchronization site a run
    executed (a typo, a site of another release, or code the configuration never reaches)."""
    import difflib
    ids = sorted(set(executed_ids))
    parts = []
    for d in dropped:
        close = difflib.get_close_matches(d, ids, n=3, cutoff=0.6)
        parts.append(f"{d!r} (closest: {', '.join(close)})" if close else repr(d))
    return UsageError(f"--drop-sync {'; '.join(parts)}: no synchronization site the run executed "
                      "matches (`racecheck mutate SCENARIO --list` shows the sites)")


def split_known(sc: Scenario, findings: list) -> tuple:
    """(new findings, findings of the scenario's triaged upstream races)."""
    path = getattr(sc, "known_findings", None)
    if not path or not findings:
        return findings, []
    from racecheck.core.suppressions import filter_findings
    split = filter_findings(findings, suppressions=path)
    return split.kept, split.suppressed


def _is_own_reference(sc: Scenario, cfg: dict) -> bool:
    return not drop_sync_sites(cfg) and sc.reference_config(cfg) == dict(cfg, **{DROP_SYNC.name: ""})


def run_plain(sc: Scenario, cfg: dict, device: str = "cuda", seed: int = 0) -> dict:
    """The same pipeline with no racecheck at all, on the device's own module (overhead baseline)."""
    import torch

    cfg = sc.config(overrides=cfg)
    dm = torch.get_device_module(device)
    return sc.run_once(cfg, RunContext(dm, device, None, pin=device != "cpu", seed=seed))


def compare_outputs(got: dict, ref: dict, fields: dict | None = None) -> list:
    """[(field, message)] for every key (a request, unless the scenario's `diff_fields` names
    the field's keys otherwise, e.g. a KV slot) whose value differs from the reference. A field
    declared with `expect` is an invariant of the run itself: each of its keys whose value is not
    the expected one is reported, whatever the reference holds."""
    diffs = []
    for fieldname in dict.fromkeys([*ref, *got]):
        spec = (fields or {}).get(fieldname, {})
        noun = spec.get("key", "request")
        a = got.get(fieldname, {})
        if "expect" in spec:
            for rid in sorted(a, key=_rid_key):
                if a[rid] != spec["expect"]:
                    diffs.append((fieldname, f"{fieldname} of {noun} {rid}: "
                                             f"{spec.get('describe', 'unexpected')} ({a[rid]})"))
            continue
        if fieldname not in ref:
            continue
        b = ref[fieldname]
        for rid in sorted(set(a) | set(b), key=_rid_key):
            va, vb = a.get(rid), b.get(rid)
            if va != vb:
                diffs.append((fieldname, f"{fieldname} of {noun} {rid}: {_describe_diff(va, vb)}"))
    return diffs


def _describe_diff(got, ref) -> str:
    if isinstance(got, list) and isinstance(ref, list):
        i = next((k for k, (a, b) in enumerate(zip(got, ref)) if a != b), min(len(got), len(ref)))
        return (f"first difference at index {i}: {_short(got[i:i + 6], 6)} != serialized "
                f"{_short(ref[i:i + 6], 6)} (lengths {len(got)} and {len(ref)})")
    return f"{_short(got)} != serialized {_short(ref)}"


def _rid_key(rid):
    try:
        return (0, int(rid))
    except (TypeError, ValueError):
        return (1, str(rid))


def _short(v, n: int = 12) -> str:
    if isinstance(v, list) and len(v) > n:
        return "[" + ", ".join(map(str, v[:n])) + ", ...]"
    return str(v)


def _first_per_field(diffs):
    seen = {}
    for fieldname, text in diffs:
        seen.setdefault(fieldname, text)
    return list(seen.items())


def diff_finding(sc: Scenario, fieldname: str, text: str) -> Finding:
    """The differential mismatch as a Finding (rule DIFF) naming the engine tensor or output field."""
    info = sc.diff_fields.get(fieldname, {})
    producer = info.get("producer", "forward_batch_generation")
    consumer = info.get("consumer", "process_batch_result")
    cur = Access(op=consumer, stream=info.get("stream", "forward_stream"), kind="read",
                 location=info.get("location", ""), function=consumer)
    prev = Access(op=f"{producer} (serialized run)", stream="reference", kind="write",
                  location=info.get("producer_location", ""), function=producer)
    return Finding(rule="DIFF", tensor=fieldname, current=cur, previous=prev,
                   suggestion=info.get("suggestion", "find the unordered or lost value feeding "
                                                     f"`{fieldname}` (run with an adversarial executor)"),
                   detail=text, missing_edge=())
