"""Suppressions and baselines: what lets a CI gate fail only on new races.

Suppressions file (TSan-like, committed, reviewed), one entry per line:

    RULE TENSOR_GLOB [LOCATION_GLOB]  # reason (required)
    RC006 req_pool_indices  eagle_v2.py:*   # padding rows point at reserved slot 0 upstream

`*` is a wildcard in every field. LOCATION_GLOB matches either access's `file:line`, `file:line in fn`
or any frame of either stack; a relative glob also matches below any folder
(`eagle_v2.py:*` matches `racecheck/scenarios/eagle_v2.py:412`).

Baseline file (machine-written by `racecheck baseline`): the fingerprints of findings accepted as
they are today, with their root-cause group ids, so only findings added later fail the gate.

Both match root-cause groups (`racecheck.core.findings.group_findings`: the findings one
synchronization fixes): an entry that matches one finding of a group takes the whole group, so a
temporary that joins an accepted missing synchronization in a later run is accepted with it, and
a finding with no group peers is matched on its own, as before groups existed.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from fnmatch import fnmatchcase

from racecheck.core.errors import EXIT_CLEAN, EXIT_FINDINGS, UsageError
from racecheck.core.findings import assign_groups, group_findings

BASELINE_FORMAT = "racecheck-baseline"
BASELINE_VERSION = 1


@dataclass(frozen=True)
class Suppression:
    rule: str
    tensor: str
    location: str = "*"
    reason: str = ""
    source: str = ""          # "file:line" of the entry, for stale warnings

    @staticmethod
    def _locations(current, previous) -> list[str]:
        out = []
        for a in (current, previous):
            if a.location:
                out.append(a.location)
                if a.function:
                    out.append(f"{a.location} in {a.function}")
            out.extend(a.stack)
        return out

    @property
    def any_tensor(self) -> bool:
        """The entry takes every tensor: whether it matches needs only a race's rule and sites."""
        return set(self.tensor) == {"*"}

    def matches_site(self, rule: str, current, previous) -> bool:
        """Rule and location globs against a race's two accesses (`Access`)."""
        if not fnmatchcase(rule, self.rule):
            return False
        if self.location in ("*", ""):
            return True
        pats = [self.location]
        if not self.location.startswith(("/", "*")):  # relative globs match at any folder depth
            pats.append("*/" + self.location)
        return any(fnmatchcase(c, p) for c in self._locations(current, previous) for p in pats)

    def matches(self, f) -> bool:
        return fnmatchcase(f.tensor, self.tensor) and self.matches_site(f.rule, f.current,
                                                                        f.previous)

    def __str__(self) -> str:
        where = f" ({self.source})" if self.source else ""
        return f"{self.rule} {self.tensor} {self.location}  # {self.reason}{where}"


def parse_suppressions(text: str, source: str = "suppressions") -> list[Suppression]:
    out = []
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        body, hash_, reason = line.partition("#")
        reason = reason.strip()
        if not hash_ or not reason:
            raise UsageError(f"{source}:{n}: suppression needs a reason: `RULE TENSOR [LOCATION] # reason`")
        fields = body.split()
        if len(fields) not in (2, 3):
            raise UsageError(f"{source}:{n}: expected `RULE TENSOR_GLOB [LOCATION_GLOB] # reason`, got {body.strip()!r}")
        rule = fields[0]
        if not (rule == "*" or any(ch in rule for ch in "*?[") or rule == "DIFF" or
                (rule.startswith("RC") and rule[2:].isdigit())):
            raise UsageError(f"{source}:{n}: unknown rule {rule!r} (RC001..RC008, DIFF or a glob)")
        out.append(Suppression(rule=rule, tensor=fields[1], location=fields[2] if len(fields) == 3 else "*",
                               reason=reason, source=f"{source}:{n}"))
    return out


def load_suppressions(path) -> list[Suppression]:
    path = os.fspath(path)
    try:
        with open(path, encoding="utf-8") as fh:
            return parse_suppressions(fh.read(), source=path)
    except FileNotFoundError:
        raise UsageError(f"{path}: no such suppressions file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"{path}: cannot read suppressions: {getattr(exc, 'strerror', None) or exc}") from None


def settled_by(suppressions):
    """`settled(rule, current, previous)` for the checker (`Recorder.set_settled`): True where an
    entry that takes every tensor matches the race's rule and sites, so the race is set apart
    whatever its tensor is called, and naming it (a walk over the process's objects) would be
    paid for nothing. None where no entry is of that kind. The split itself is still
    `filter_findings`'."""
    sups = [s for s in _as_suppressions(suppressions) if s.any_tensor]
    if not sups:
        return None

    def settled(rule, current, previous) -> bool:
        return any(s.matches_site(rule, current, previous) for s in sups)
    return settled


# -- baseline -----------------------------------------------------------------------------------

def baseline_document(findings) -> dict:
    entries = {}
    for f in assign_groups(findings):
        cur, prev = f.current.location, f.previous.location
        entries[f.fingerprint()] = {"fingerprint": f.fingerprint(), "group": f.group_id(),
                                    "rule": f.rule, "tensor": f.tensor,
                                    "current": cur, "previous": prev}
    return {"format": BASELINE_FORMAT, "version": BASELINE_VERSION,
            "fingerprints": [entries[k] for k in sorted(entries)]}


def parse_baseline(doc, source: str = "baseline") -> set[str]:
    if not isinstance(doc, dict) or doc.get("format") != BASELINE_FORMAT:
        raise UsageError(f"{source}: not a racecheck baseline (expected \"format\": \"{BASELINE_FORMAT}\")")
    if doc.get("version") != BASELINE_VERSION:
        raise UsageError(f"{source}: unsupported baseline version {doc.get('version')!r}")
    items = doc.get("fingerprints")
    if not isinstance(items, list):
        raise UsageError(f"{source}: \"fingerprints\" must be a list")
    out = set()
    for i, e in enumerate(items):
        fp = e.get("fingerprint") if isinstance(e, dict) else e
        if not isinstance(fp, str) or not fp:
            raise UsageError(f"{source}: entry {i} has no fingerprint")
        out.add(fp)
        group = e.get("group") if isinstance(e, dict) else None
        if isinstance(group, str) and group:
            out.add(group)
    return out


def load_baseline(path) -> set[str]:
    path = os.fspath(path)
    try:
        with open(path, encoding="utf-8") as fh:
            doc = json.load(fh)
    except FileNotFoundError:
        raise UsageError(f"{path}: no such baseline file") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UsageError(f"{path}: not a readable baseline JSON file ({type(exc).__name__})") from None
    return parse_baseline(doc, source=path)


# -- the gate -----------------------------------------------------------------------------------

@dataclass
class GateResult:
    kept: list = field(default_factory=list)
    suppressed: list = field(default_factory=list)
    baselined: list = field(default_factory=list)
    stale: list = field(default_factory=list)        # Suppression entries that matched nothing

    def __iter__(self):  # unpacks as (kept, suppressed, baselined, stale)
        return iter((self.kept, self.suppressed, self.baselined, self.stale))

    @property
    def exit_code(self) -> int:
        return EXIT_FINDINGS if self.kept else EXIT_CLEAN


def _as_suppressions(s) -> list[Suppression]:
    if s is None:
        return []
    if isinstance(s, (str, os.PathLike)):
        return load_suppressions(s)
    return list(s)


def _as_baseline(b) -> set[str]:
    if b is None:
        return set()
    if isinstance(b, (str, os.PathLike)):
        return load_baseline(b)
    if isinstance(b, dict):
        return parse_baseline(b)
    return set(b)


def filter_findings(findings, suppressions=None, baseline=None) -> GateResult:
    """Split findings into (kept, suppressed, baselined, stale suppressions).

    `suppressions`: a path or Suppression list; `baseline`: a path, a baseline document or a set of
    fingerprints (and group ids). A suppression wins over the baseline; both take whole groups;
    only `kept` should fail a gate.
    """
    sups = _as_suppressions(suppressions)
    base = _as_baseline(baseline)
    used = set()
    res = GateResult()
    findings = assign_groups(findings)
    verdict = {}            # group id -> "suppressed" | "baselined" | "kept"
    for g in group_findings(findings):
        hits = {i for f in g.findings for i, s in enumerate(sups) if s.matches(f)}
        used |= hits
        if hits:
            verdict[g.id] = "suppressed"
        elif g.id in base or any(f.fingerprint() in base for f in g.findings):
            verdict[g.id] = "baselined"
        else:
            verdict[g.id] = "kept"
    for f in findings:
        getattr(res, verdict[f.group_id()]).append(f)
    res.stale = [s for i, s in enumerate(sups) if i not in used]
    return res


def gate_meta(res: GateResult, meta: dict | None = None) -> dict:
    """Report meta with the gate's counts and stale suppressions (for HTML/SARIF/console)."""
    m = dict(meta or {})
    m["suppressed"] = len(res.suppressed)
    m["baselined"] = len(res.baselined)
    if res.stale:
        m["stale_suppressions"] = [str(s) for s in res.stale]
    return m


def warn_stale(stale, console=None) -> None:
    if not stale:
        return
    from rich.console import Console
    console = console or Console(stderr=True, highlight=False)
    for s in stale:
        console.print(f"racecheck: warning: stale suppression (matched nothing): {s}", markup=False, soft_wrap=True)
