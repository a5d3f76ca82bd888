"""Findings as versioned JSON: the interchange file every other report can be rebuilt from.

`racecheck run --report json=F` writes it; `racecheck report F --format ...` and
`racecheck baseline F` read it back. The schema ships next to this module.
"""
from __future__ import annotations

import datetime as _dt
import json
import os
from importlib import resources

import jsonschema

from racecheck.core.errors import UsageError
from racecheck.core.findings import Finding, assign_groups

FORMAT = "racecheck-findings"
VERSION = 1
SCHEMA_FILE = "findings.schema.json"


def tool_info() -> dict:
    try:
        from importlib.metadata import version
        v = version("racecheck")
    except Exception:  # running from a source tree without metadata
        v = "0.0.0"
    return {"name": "racecheck", "version": v}


def to_document(findings, meta: dict | None = None) -> dict:
    meta = dict(meta or {})
    meta.setdefault("created", _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"))
    return {
        "format": FORMAT,
        "version": VERSION,
        "tool": tool_info(),
        "findings": [f.to_json() for f in assign_groups(findings)],
        "meta": _jsonable(meta),
    }


def _jsonable(x):
    """Meta may carry tuples, sets or paths; JSON gets lists and strings."""
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple, set, frozenset)):
        return [_jsonable(v) for v in x]
    if isinstance(x, (str, int, float, bool)) or x is None:
        return x
    return str(x)


def render(findings, meta: dict | None = None) -> str:
    return json.dumps(to_document(findings, meta), indent=2, sort_keys=False) + "\n"


def schema() -> dict:
    """The JSON Schema of the findings file (shipped as package data)."""
    text = resources.files(__package__).joinpath(SCHEMA_FILE).read_text(encoding="utf-8")
    return json.loads(text)


def parse_document(doc, source: str = "findings") -> tuple[list[Finding], dict]:
    """Check the envelope and decode findings; anything foreign or broken is a UsageError."""
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise UsageError(f"{source}: not a racecheck findings file (expected \"format\": \"{FORMAT}\")")
    version = doc.get("version")
    if version != VERSION:
        raise UsageError(f"{source}: unsupported findings version {version!r} (this racecheck reads {VERSION})")
    items = doc.get("findings")
    if not isinstance(items, list):
        raise UsageError(f"{source}: \"findings\" must be a list")
    try:
        jsonschema.validate(doc, schema())
    except jsonschema.ValidationError as exc:
        where = "/".join(str(p) for p in exc.absolute_path) or "document"
        msg = exc.message.splitlines()[0]
        raise UsageError(f"{source}: invalid findings file at {where}: {msg}") from None
    findings = []
    for i, d in enumerate(items):
        try:
            findings.append(Finding.from_json(d))
        except (KeyError, TypeError, ValueError) as exc:
            raise UsageError(f"{source}: finding {i} is malformed: {type(exc).__name__}: {exc}") from None
    meta = doc.get("meta") or {}
    return findings, meta if isinstance(meta, dict) else {}


def load_document(path) -> tuple[list[Finding], dict]:
    path = os.fspath(path)
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
        if not text.strip():
            raise UsageError(f"{path}: empty file, expected a findings JSON file")
        doc = json.loads(text)
    except FileNotFoundError:
        raise UsageError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise UsageError(f"{path}: is a directory, expected a findings JSON file") from None
    except OSError as exc:
        raise UsageError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        line = getattr(exc, "lineno", None)
        at = f" (line {line})" if line else ""
        raise UsageError(f"{path}: not valid JSON{at}") from None
    return parse_document(doc, source=path)


def load_findings(path) -> list[Finding]:
    """Findings of a file written by `--report json=FILE`; UsageError (one line) if it is not one."""
    return load_document(path)[0]
