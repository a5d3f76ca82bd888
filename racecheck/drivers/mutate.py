"""Sync mutation analysis: which synchronizations does a clean run actually depend on?

Run the scenario once as configured (it should be clean) and list every synchronization site it
executed; then run it again with each site dropped in turn. A site is

    necessary   dropping it makes racecheck report something new (the rule and tensor say what
                the synchronization protects), or changes the outputs;
    silent      nothing new: the synchronization is redundant here (another one covers it), or
                it guards something this run cannot exercise, or racecheck cannot see it.

A gate keeps the table of a reviewed run and re-checks the sites that were necessary: an engine
change that makes one silent (a wait made redundant by accident, a kernel racecheck stopped
seeing) or removes it is flagged even when the run itself is still clean.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field

from racecheck.core.errors import UsageError
from racecheck.core.findings import group_findings

from racecheck.scenarios.registry import DROP_SYNC, Scenario, run

NECESSARY, SILENT = "necessary", "silent"


@dataclass
class SiteResult:
    id: str
    kind: str
    location: str
    calls: int
    verdict: str = ""
    exposes: list = field(default_factory=list)     # [(rule, tensor)] new when dropped
    groups: list = field(default_factory=list)      # their root-cause groups (FindingGroup)
    diff: str = ""                                  # differential mismatch when dropped
    example: object = None                          # the first new Finding
    seconds: float = 0.0

    def to_json(self) -> dict:
        d = {"id": self.id, "kind": self.kind, "location": self.location, "calls": self.calls,
             "verdict": self.verdict, "exposes": [list(p) for p in self.exposes],
             "seconds": round(self.seconds, 3)}
        if self.groups:
            d["groups"] = [{"id": g.id, "rules": g.rules, "tensors": g.tensors,
                            "missing_edge": list(g.first.missing_edge),
                            "current": g.first.current.location,
                            "previous": g.first.previous.location} for g in self.groups]
        if self.diff:
            d["diff"] = self.diff
        if self.example is not None:
            d["example"] = self.example.to_json()
        return d


@dataclass
class MutationReport:
    scenario: str
    config: dict
    baseline_findings: list
    sites: list
    engine_version: str = ""

    def to_json(self) -> dict:
        return {"scenario": self.scenario, "engine_version": self.engine_version,
                "config": self.config,
                "baseline_findings": [f.to_json() for f in self.baseline_findings],
                "sites": [s.to_json() for s in self.sites]}

    def necessary(self) -> list:
        return [s for s in self.sites if s.verdict == NECESSARY]

    def regressions(self, previous: dict) -> list:
        """[(site id, what happened)] for sites `previous` (a to_json dict) called necessary
        that are silent now or were not executed at all."""
        now = {s.id: s for s in self.sites}
        out = []
        for old in previous.get("sites", ()):
            if old.get("verdict") != NECESSARY:
                continue
            cur = now.get(old["id"])
            if cur is None:
                out.append((old["id"], "no longer executed (the code moved or the wait was removed)"))
            elif cur.verdict == SILENT:
                out.append((old["id"], "now silent: dropping it exposes nothing"))
        return out


def load_previous(path) -> dict:
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except OSError as exc:
        raise UsageError(f"--baseline {path}: {exc.strerror}") from None
    except ValueError as exc:
        raise UsageError(f"--baseline {path}: not a racecheck mutate JSON file ({exc})") from None
    if not isinstance(data, dict) or not isinstance(data.get("sites"), list):
        raise UsageError(f"--baseline {path}: not a racecheck mutate JSON file (no 'sites')")
    return data


def _signature(findings) -> set:
    return {(f.rule, f.tensor) for f in findings}


def analyse(sc: Scenario, cfg: dict, *, seed: int = 0, only=None, progress=None) -> MutationReport:
    """The clean run, then one run per executed site (or per site in `only`) with it dropped."""
    if cfg.get(DROP_SYNC.name):
        raise UsageError("mutate drops each site itself: run it without --drop-sync")
    base = run(sc, cfg, device="sim", seed=seed)
    if base.internal_errors:
        from racecheck.core.errors import InternalError
        raise InternalError(base.internal_errors[0].splitlines()[0])
    before = _signature(base.findings)
    engine = getattr(sc, "engine_modules", None)     # the scenario's own harness syncs are not
    sites = [SiteResult(s.id, s.kind, s.location, s.calls) for s in base.sync_sites   # mutated
             if engine is None or s.id.startswith(tuple(engine))]
    if only is not None:
        wanted = set(only)
        sites = [s for s in sites if s.id in wanted]
    if progress is not None:
        progress.start(len(sites))
    for s in sites:
        res = run(sc, dict(cfg, **{DROP_SYNC.name: s.id}), device="sim", seed=seed)
        if res.internal_errors:
            from racecheck.core.errors import InternalError
            raise InternalError(f"with {s.id} dropped: " + res.internal_errors[0].splitlines()[0])
        new = [f for f in res.findings if (f.rule, f.tensor) not in before and f.rule != "DIFF"]
        s.exposes = sorted({(f.rule, f.tensor) for f in new})
        s.groups = group_findings(new)
        s.example = s.groups[0].first if new else None
        s.diff = "" if res.diff_ok else res.diff_detail
        s.verdict = NECESSARY if (s.exposes or s.diff) else SILENT
        s.seconds = res.seconds
        if progress is not None:
            progress.advance(s)
    version = ""
    engine = getattr(sc, "engine_version", None)
    if callable(engine):
        version = engine() or ""
    return MutationReport(sc.name, cfg, list(base.findings), sites, version)


def to_sarif(report: MutationReport, regressions=()) -> dict:
    """SARIF 2.1.0: one result per site (necessary: note, silent: warning, regression: error)."""
    from racecheck.reports.json_report import tool_info
    from racecheck.reports.sarif import SCHEMA_URI
    rules = [{"id": "RCM001", "name": "SyncSiteNecessary",
              "shortDescription": {"text": "synchronization site whose removal exposes a race"}},
             {"id": "RCM002", "name": "SyncSiteSilent",
              "shortDescription": {"text": "synchronization site whose removal exposes nothing"}},
             {"id": "RCM003", "name": "SyncSiteRegressed",
              "shortDescription": {"text": "a previously necessary synchronization site is silent "
                                           "or gone"}}]
    results = []
    regressed = dict(regressions)
    for s in report.sites:
        file, _, line = s.location.rpartition(":")
        loc = [{"physicalLocation": {"artifactLocation": {"uri": file},
                                     "region": {"startLine": int(line) if line.isdigit() else 1}}}]
        if s.id in regressed:
            rule, level, text = "RCM003", "error", f"{s.id}: {regressed.pop(s.id)}"
        elif s.verdict == NECESSARY:
            what = ", ".join(f"{r} on {t}" for r, t in s.exposes) or f"outputs change: {s.diff}"
            rule, level, text = "RCM001", "note", f"{s.id} is necessary: dropping it exposes {what}"
        else:
            rule, level, text = "RCM002", "warning", (f"{s.id} is silent: dropping it exposes "
                                                      "nothing (redundant here, or a blind spot)")
        res = {"ruleId": rule, "level": level, "message": {"text": text}, "locations": loc,
               "partialFingerprints": {"racecheckSite": s.id}}
        if s.groups:
            res["properties"] = {"groups": [g.id for g in s.groups]}
        results.append(res)
    for site_id, what in regressed.items():
        results.append({"ruleId": "RCM003", "level": "error",
                        "message": {"text": f"{site_id}: {what}"},
                        "partialFingerprints": {"racecheckSite": site_id}})
    version = tool_info()["version"]
    return {"$schema": SCHEMA_URI, "version": "2.1.0",
            "runs": [{"tool": {"driver": {"name": "racecheck-mutate", "version": version,
                                          "semanticVersion": version, "rules": rules}},
                      "results": results}]}
