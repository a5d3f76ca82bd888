"""`racecheck baseline FINDINGS.json -o BASELINE`: accept today's findings so the gate fails only on new ones."""
from __future__ import annotations

import json

from rich.console import Console


def add_arguments(p) -> None:
    p.add_argument("findings", metavar="FINDINGS.json", help="a findings file written by --report json=FILE")
    p.add_argument("-o", "--output", metavar="BASELINE", default="racecheck-baseline.json",
                   help="baseline file to write (default: racecheck-baseline.json)")
    p.add_argument("--suppressions", metavar="FILE", default=None,
                   help="leave findings these suppress out of the baseline")


def main(args) -> int:
    from racecheck.core.files import write_atomic
    from racecheck.reports.json_report import load_document
    from racecheck.core.suppressions import baseline_document, filter_findings, warn_stale

    findings, _ = load_document(args.findings)
    res = filter_findings(findings, args.suppressions)
    warn_stale(res.stale)
    doc = baseline_document(res.kept)
    write_atomic(args.output, json.dumps(doc, indent=2) + "\n")
    n = len(doc["fingerprints"])
    Console(highlight=False).print(f"wrote {n} fingerprint{'s' if n != 1 else ''} to {args.output}", markup=False)
    return 0
