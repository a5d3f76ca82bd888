"""`racecheck report FINDINGS.json --format FMT [-o FILE]`: re-render and re-gate a findings file.

Exit 1 when findings remain after suppressions and the baseline, 0 otherwise, 2 on bad input.
"""
from __future__ import annotations

import sys

from racecheck.cli.gate import add_gate_arguments, apply
from racecheck.core.suppressions import gate_meta, warn_stale

FORMATS = ("console", "json", "sarif", "junit", "html", "perfetto")


def add_arguments(p) -> None:
    p.add_argument("findings", metavar="FINDINGS.json", help="a findings file written by --report json=FILE")
    p.add_argument("--format", "-f", default="console", choices=FORMATS, help="output format (default: console)")
    p.add_argument("-o", "--output", metavar="FILE", default=None, help="write here instead of stdout")
    p.add_argument("--title", default=None, help="report title (console, HTML)")
    p.add_argument("--include-suppressed", action="store_true",
                   help="json/sarif: keep suppressed and baselined findings (marked in SARIF); not for upload")
    add_gate_arguments(p)


def main(args) -> int:
    from racecheck.core.files import write_atomic
    from racecheck.reports import parse_report_specs, print_findings, render, write_reports
    from racecheck.reports.json_report import load_document

    findings, meta = load_document(args.findings)
    parse_report_specs(args.report)
    res = apply(findings, args)
    meta = gate_meta(res, meta)
    if args.title:
        meta["title"] = args.title
    warn_stale(res.stale)

    fmt = args.format
    if fmt == "console" and not args.output:
        print_findings(res.kept, title=meta.get("title"), suppressed=len(res.suppressed),
                       baselined=len(res.baselined))
    else:
        if args.include_suppressed and fmt == "sarif":
            import json
            from racecheck.reports.sarif import to_sarif
            text = json.dumps(to_sarif(res.kept, meta, suppressed=res.suppressed, baselined=res.baselined),
                              indent=2) + "\n"
        elif fmt == "json" and args.include_suppressed:
            text = render(fmt, findings, meta)
        else:
            text = render(fmt, res.kept, meta)
        if args.output and args.output != "-":
            write_atomic(args.output, text)
        else:
            sys.stdout.write(text)
    if args.report:  # as everywhere: the JSON file keeps everything, the others show what fails
        from racecheck.reports import parse_report_spec
        json_specs = [x for x in args.report if parse_report_spec(x)[0] == "json"]
        write_reports(findings, json_specs, meta)
        write_reports(res.kept, [x for x in args.report if x not in json_specs], meta)
    return res.exit_code
