"""Repro records: a failing fuzz example as a self-describing, version-independent JSON file.

A record holds everything a run depends on in concrete terms, never Hypothesis' internal choice
sequence: the scenario and variant, every knob value (batch schedule included), the scenario's
seed, the executor plan (PCT priorities, change points, holds) and the failure it must show. It
replays on any racecheck version that still has the scenario and its knobs:

    {"format": "racecheck-repro", "format_version": 1, "racecheck_version": "0.1.0",
     "scenario": "eagle-v2", "variant": "no-draft_done_event", "device": "sim", "seed": 0,
     "config": {...}, "plan": {"priorities": {...}, "host": 0, "change_points": [], "holds": []},
     "failure": {"key": "RC001 draft_token", "kind": "finding", "rule": "RC001", "tensor": "draft_token",
                 "signature": [...], "fingerprint": "..."},
     "observed": {"findings": [...], "diff_ok": false, "diff_detail": "...", "faults": [...]},
     "search": {"examples": 12, "seconds": 1.4, "shrunk": true, "hypothesis": "6.170.15", "database_key": "..."}}

`plan: null` means the eager executor (issue order). Failure keys: see racecheck.drivers.fuzz.keys.
"""
from __future__ import annotations

import datetime
import json
import os

from racecheck.core.devices import DEVICES
from racecheck.core.errors import UsageError
from racecheck.core.files import write_atomic

from racecheck.drivers.fuzz.keys import failure_kind, finding_key

FORMAT = "racecheck-repro"
FORMAT_VERSION = 1
REQUIRED = ("scenario", "config", "failure")

__all__ = ["FORMAT", "FORMAT_VERSION", "make_record", "save_record", "load_record", "record_filename",
           "ReplayResult", "replay", "reproduce_command"]


def _slug(text: str, n: int = 48) -> str:
    out = "".join(c if c.isalnum() or c in "-_." else "-" for c in text)
    while "--" in out:
        out = out.replace("--", "-")
    return out.strip("-")[:n] or "failure"


def record_filename(scenario: str, variant, key: str, fixed: dict | None = None) -> str:
    """Stable file name for one distinct failure of one scenario/variant (workers agree on it);
    knobs the run fixed (`--set`, `--drop-sync`) make another target: `...-set-<hash>-...`."""
    import hashlib
    what = variant or "all-fixes"
    salt = ""
    if fixed:
        salt = json.dumps(fixed, sort_keys=True, default=str)
        what += "-set-" + hashlib.sha256(salt.encode()).hexdigest()[:6]
    h = hashlib.sha256(f"{scenario}|{variant or ''}|{key}{'|' + salt if salt else ''}".encode()).hexdigest()[:10]
    return f"{_slug(scenario)}-{_slug(what)}-{_slug(key, 40)}-{h}.json"


def make_record(*, scenario: str, variant, device: str, seed: int, config: dict, plan, key: str,
                findings=(), diff_ok: bool = True, diff_detail: str = "", faults=(), crash: str = "",
                search: dict | None = None) -> dict:
    from racecheck import __version__
    finding = None
    for f in findings:
        if finding_key(f) == key:
            finding = f
            break
    failure = {"key": key, "kind": failure_kind(key)}
    if finding is not None:
        failure.update(rule=finding.rule, tensor=finding.tensor, signature=list(finding.signature),
                       fingerprint=finding.fingerprint(), message=finding.message())
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "racecheck_version": __version__,
        "created": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "scenario": scenario,
        "variant": variant,
        "device": device,
        "seed": int(seed),
        "config": config,
        "plan": plan,
        "failure": failure,
        "observed": {"findings": [f.to_json() for f in findings], "diff_ok": bool(diff_ok),
                     "diff_detail": diff_detail, "faults": list(faults), "crash": crash},
        "search": dict(search or {}),
    }


def save_record(record: dict, directory: str, filename: str | None = None) -> str:
    """Write atomically (temp file + rename) under `directory`; returns the path."""
    name = filename or record_filename(record["scenario"], record.get("variant"), record["failure"]["key"])
    path = os.path.join(directory, name)
    write_atomic(path, json.dumps(record, indent=2, sort_keys=False) + "\n")
    return path


def load_record(path) -> dict:
    """Read and validate a repro record; anything else is a one-line UsageError."""
    path = os.fspath(path)
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except FileNotFoundError:
        raise UsageError(f"repro: no such file: {path}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"repro: cannot read {path}: {getattr(exc, 'strerror', None) or exc}") from None
    if not text.strip():
        raise UsageError(f"repro: {path} is empty, not a racecheck repro record")
    try:
        rec = json.loads(text)
    except ValueError as exc:
        raise UsageError(f"repro: {path} is not a racecheck repro record (not JSON: {exc.msg}, "
                         f"line {exc.lineno} column {exc.colno})") from None
    if not isinstance(rec, dict) or rec.get("format") != FORMAT:
        raise UsageError(f"repro: {path} is not a racecheck repro record (no \"format\": \"{FORMAT}\")")
    version = rec.get("format_version")
    if not isinstance(version, int) or isinstance(version, bool):
        raise UsageError(f"repro: {path}: bad format_version {version!r}")
    if version > FORMAT_VERSION:
        raise UsageError(f"repro: {path} has format_version {version}; this racecheck reads up to "
                         f"{FORMAT_VERSION} (upgrade racecheck)")
    missing = [k for k in REQUIRED if k not in rec]
    if missing:
        raise UsageError(f"repro: {path} is missing {', '.join(missing)}")
    if not isinstance(rec["scenario"], str) or not isinstance(rec["config"], dict):
        raise UsageError(f"repro: {path}: 'scenario' must be a name and 'config' an object")
    failure = rec["failure"]
    if not isinstance(failure, dict) or not isinstance(failure.get("key"), str) or not failure["key"].strip():
        raise UsageError(f"repro: {path}: 'failure' must be an object with a 'key'")
    if rec.get("device", "sim") not in DEVICES:
        raise UsageError(f"repro: {path}: unknown device {rec.get('device')!r}")
    seed = rec.get("seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise UsageError(f"repro: {path}: 'seed' must be an integer")
    plan = rec.get("plan")
    if plan is not None:
        from racecheck.instrumentation.adversarial import PlanError, normalize_plan
        try:
            rec["plan"] = normalize_plan(plan)
        except (PlanError, TypeError, ValueError) as exc:
            raise UsageError(f"repro: {path}: bad executor plan: {exc}") from None
    return rec


def reproduce_command(path: str) -> str:
    import shlex
    return f"racecheck repro {shlex.quote(os.fspath(path))}"


class ReplayResult:
    """One replay of a record: did its failure come back, and what was seen."""

    def __init__(self, record, outcome):
        self.record = record
        self.outcome = outcome
        self.key = record["failure"]["key"]

    @property
    def reproduced(self) -> bool:
        return self.key in self.outcome.keys

    @property
    def findings(self) -> list:
        return self.outcome.findings

    @property
    def finding(self):
        for f in self.outcome.findings:
            if finding_key(f) == self.key:
                return f
        return None


def replay(record: dict, *, device: str | None = None):
    """Run the record's example once, exactly (same config, seed and plan)."""
    from racecheck.drivers.fuzz.target import FuzzTarget
    target = FuzzTarget(record["scenario"], record.get("variant"), device=device or record.get("device", "sim"))
    example = {"config": record["config"], "seed": record.get("seed", 0), "plan": record.get("plan")}
    return ReplayResult(record, target.run(example))
