"""SARIF 2.1.0 for GitHub code scanning: one result per root-cause group.

GitHub code scanning keeps one alert per rule and partial fingerprint, and matches a new upload's
results to open alerts by that fingerprint. A result per finding would open one alert per tensor
for a single missing synchronization (eleven alerts, one fix), and a new temporary joining it
would open another; so a result is a group (`racecheck.core.findings.group_findings`): anchored at the
first finding's current access, every other site it covers among `relatedLocations`, the tensors
and member fingerprints in its properties, and the group id as its partial fingerprint, which
does not change as tensors join or leave the group.

GitHub ignores `result.suppressions`, so suppressed and baselined findings are left out of the
upload by the caller (the gate filters first); `to_sarif(..., suppressed=...)` can still emit them,
marked, for a full archival log.
"""
from __future__ import annotations

import functools
import json

from racecheck.core import rules
from racecheck.core.findings import Access, Finding, FindingGroup, group_findings
from racecheck.core.rules import RULES

from ._common import relative_uri, rule_name, split_frame, split_location
from .json_report import tool_info

SCHEMA_URI = "https://json.schemastore.org/sarif-2.1.0.json"
FINGERPRINT_KEY = "racecheck/group/v1"
MAX_FLOW_FRAMES = 20


@functools.lru_cache(maxsize=None)
def rule_descriptor(rule: str) -> dict:
    """The SARIF reportingDescriptor of a rule, built once from racecheck.core.rules (do not mutate)."""
    r = rules.get(rule)
    public = not r.internal
    return {
        "id": r.id,
        "name": r.name,
        "shortDescription": {"text": r.title[:1024]},
        "fullDescription": {"text": r.description[:1024]},
        "help": {"text": r.help, "markdown": f"**{r.id} {r.name}**: {r.description}\n\n**Fix:** {r.help}"},
        "defaultConfiguration": {"level": "error"},
        "properties": {
            "tags": ["concurrency", "gpu", "race"] if public else ["concurrency", "gpu", "differential"],
            "precision": "high" if public else "medium",
            "problem.severity": "error",
        },
    }


def _physical(loc: str, root, line_fallback=None):
    file, line, col = split_location(loc)
    if not file:
        return None
    region = {"startLine": line or line_fallback or 1}
    if col:
        region["startColumn"] = col
    return {"artifactLocation": {"uri": relative_uri(file, root)}, "region": region}


def _location(a: Access, root, message: str | None = None, id_: int | None = None):
    phys = _physical(a.location, root)
    if phys is None:
        frames = [fr for fr in a.stack if split_frame(fr)[1]]
        if frames:
            file, line, _ = split_frame(frames[0])
            phys = _physical(f"{file}:{line}", root)
    if phys is None:
        return None
    loc = {"physicalLocation": phys}
    if a.function:
        loc["logicalLocations"] = [{"name": a.function, "kind": "function"}]
    if message:
        loc["message"] = {"text": message}
    if id_ is not None:
        loc["id"] = id_
    return loc


def _thread_flow(a: Access, root) -> dict | None:
    """One stream's call stack, outermost first, as SARIF shows code flows."""
    frames = list(a.stack)[:MAX_FLOW_FRAMES] or ([a.location] if a.location else [])
    locs = []
    for depth, fr in enumerate(reversed(frames)):
        file, line, fn = split_frame(fr)
        if not line:
            continue
        loc = {"physicalLocation": _physical(f"{file}:{line}", root)}
        if fn:
            loc["message"] = {"text": fn}
        locs.append({"location": loc, "nestingLevel": depth})
    if not locs:
        return None
    locs[-1]["location"]["message"] = {"text": f"{a.kind} by {a.op} on {a.stream}"}
    return {"id": a.stream, "message": {"text": f"stream {a.stream}"}, "locations": locs}


def result(g, rule_index: dict, root=None, meta: dict | None = None, state: str | None = None) -> dict:
    """The result of a group (or of one Finding, as a group of one)."""
    if isinstance(g, Finding):
        g = FindingGroup(g.group_id(), [g])
    f = g.first
    meta = meta or {}
    cur, prev = f.current, f.previous
    pair = f"between {cur.stream} and {prev.stream}" if cur.stream != prev.stream else f"on {cur.stream}"
    tensors = g.tensors
    on = f"`{f.tensor}`" if len(tensors) == 1 else \
        f"{len(tensors)} tensors (" + ", ".join(f"`{t}`" for t in tensors) + ")"
    text = (f"{f.rule} {rule_name(f.rule)} race on {on} {pair}. "
            f"The {cur.kind} by {cur.op} on {cur.stream} is unordered with the {prev.kind} by {prev.op} "
            f"on {prev.stream}{' at ' + prev.location if prev.location else ''}. Fix: {g.suggestion}")
    res = {
        "ruleId": f.rule,
        "ruleIndex": rule_index[f.rule],
        "level": "error",
        "message": {"text": text},
        "partialFingerprints": {FINGERPRINT_KEY: g.id},
        "properties": {
            "tensor": f.tensor,
            "tensors": tensors,
            "group": g.id,
            "rules": g.rules,
            "fingerprints": [x.fingerprint() for x in g.findings],
            "streams": list(f.streams),
            "suggestion": g.suggestion,
            "signature": list(f.signature),
        },
    }
    primary = _location(cur, root, f"{cur.kind} by {cur.op} on {cur.stream}")
    related = [_location(prev, root, f"previous {prev.kind} by {prev.op} on {prev.stream}", id_=1)]
    seen = {cur.location, prev.location}
    for x in g.findings[1:]:
        for label, a in (("", x.current), ("previous ", x.previous)):
            if a.location and a.location not in seen:
                seen.add(a.location)
                related.append(_location(a, root, f"{label}{a.kind} by {a.op} on {a.stream} "
                                                  f"(`{x.tensor}`)", id_=len(related) + 1))
    related = [r for r in related if r is not None]
    if primary is None and related:  # the current side has no source: anchor at the previous one
        primary = related.pop(0)
        primary.pop("id", None)
    if primary is not None:
        res["locations"] = [primary]
    if related:
        res["relatedLocations"] = related
    flows = [t for t in (_thread_flow(cur, root), _thread_flow(prev, root)) if t]
    if flows:
        res["codeFlows"] = [{"message": {"text": f"the racing pair on `{f.tensor}`"}, "threadFlows": flows}]
    for key in ("detail", "approx"):
        if getattr(f, key):
            res["properties"][key] = getattr(f, key)
    if f.missing_edge:
        res["properties"]["missingEdge"] = list(f.missing_edge)
    for key in ("scenario", "variant", "device", "seed", "repro"):
        if meta.get(key) not in (None, ""):
            res["properties"][key] = meta[key]
    if state == "suppressed":
        res["suppressions"] = [{"kind": "external", "status": "accepted"}]
    elif state == "baselined":
        res["baselineState"] = "unchanged"
    return res


def to_sarif(findings, meta: dict | None = None, *, suppressed=(), baselined=(), root=None) -> dict:
    """A SARIF log with one run; `suppressed`/`baselined` are only for a full (non-upload) log."""
    meta = dict(meta or {})
    root = root or meta.get("root")
    ids = list(RULES)
    ids += sorted({f.rule for f in [*findings, *suppressed, *baselined]} - set(ids))
    rule_index = {r: i for i, r in enumerate(ids)}
    info = tool_info()
    results = [result(g, rule_index, root, meta) for g in group_findings(findings)]
    results += [result(g, rule_index, root, meta, "suppressed") for g in group_findings(suppressed)]
    results += [result(g, rule_index, root, meta, "baselined") for g in group_findings(baselined)]
    run = {
        "tool": {"driver": {
            "name": "racecheck",
            "semanticVersion": info["version"],
            "version": info["version"],
            "rules": [rule_descriptor(r) for r in ids],
        }},
        "results": results,
        "columnKind": "unicodeCodePoints",
    }
    notes = [{"level": "warning", "message": {"text": f"stale suppression (matched nothing): {s}"}}
             for s in meta.get("stale_suppressions", ())]
    run["invocations"] = [{"executionSuccessful": True, **({"toolExecutionNotifications": notes} if notes else {})}]
    category = meta.get("category")
    if category:
        run["automationDetails"] = {"id": f"{category}/"}
    props = {k: meta[k] for k in ("scenario", "variant", "device", "seed") if meta.get(k) not in (None, "")}
    if props:
        run["properties"] = props
    return {"$schema": SCHEMA_URI, "version": "2.1.0", "runs": [run]}


def render(findings, meta: dict | None = None) -> str:
    return json.dumps(to_sarif(list(findings), meta), indent=2) + "\n"
