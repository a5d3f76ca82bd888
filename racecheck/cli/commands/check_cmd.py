"""`racecheck check TRACE.jsonl`: run the happens-before checker over a saved trace, offline.

Exit 0 when the trace is clean, 1 when it has findings; a missing or malformed trace is a usage
error (exit 2, one line).
"""
from __future__ import annotations

import os
import sys

from racecheck.core.errors import UsageError


def add_arguments(parser) -> None:
    parser.add_argument("trace", metavar="TRACE", help="a trace saved as JSON lines (.jsonl)")
    parser.add_argument("--report", metavar="FORMAT=FILE", action="append", default=[],
                        help="also write a report (console, json, sarif, junit, html, perfetto); "
                             "repeatable")
    parser.add_argument("--context-window", type=int, default=64, metavar="N",
                        help="recent events kept per timeline for finding pictures (default 64)")


def check_trace(path, context_window: int = 64) -> list:
    """Findings of the trace at `path`; UsageError (one line) when it cannot be read."""
    from racecheck.core.fastchecker import new_checker
    from racecheck.core.trace import Trace, TraceFormatError

    if not os.path.exists(path):
        raise UsageError(f"trace file not found: {path}")
    if os.path.isdir(path):
        raise UsageError(f"trace path is a directory, not a .jsonl file: {path}")
    checker = new_checker(context_window=context_window)
    try:
        checker.process_all(Trace.iter_file(path))
    except TraceFormatError as exc:
        raise UsageError(f"malformed trace: {exc}") from None
    except UnicodeDecodeError:
        raise UsageError(f"malformed trace: {path} is not a text file") from None
    except OSError as exc:
        raise UsageError(f"cannot read trace {path}: {exc.strerror or exc}") from None
    if not Trace.is_complete(path):
        sys.stderr.write(f"racecheck: warning: {path} has no end line: the trace was cut short (or "
                         f"written by an older racecheck); findings cover only the events it has\n")
    return checker.findings


def _print(findings, title) -> None:
    try:
        from racecheck.reports.console import print_findings
    except ImportError:
        print_findings = None
    if print_findings is not None:
        print_findings(findings, title=title)
        return
    for f in findings:
        print(f.message())
        if f.suggestion:
            print(f"  fix: {f.suggestion}")
    print(f"{len(findings)} finding{'s' if len(findings) != 1 else ''}" if findings
          else "no races found")


def _write_reports(findings, specs, meta) -> None:
    if not specs:
        return
    try:
        from racecheck.reports import write_reports
    except ImportError:
        raise UsageError("--report needs racecheck.reports, which is not available") from None
    write_reports(findings, specs, meta)


def _validate_reports(specs) -> None:
    if not specs:
        return
    try:
        from racecheck.reports import parse_report_spec
    except ImportError:
        return
    for spec in specs:
        parse_report_spec(spec)


def main(args) -> int:
    path = args.trace
    specs = list(getattr(args, "report", None) or ())
    _validate_reports(specs)        # a typo in --report fails before the work, not after
    findings = check_trace(path, getattr(args, "context_window", 64) or 64)
    meta = {"title": f"racecheck check {os.path.basename(path)}", "trace": path,
            "command": "check"}
    _print(findings, meta["title"])
    _write_reports(findings, specs, meta)
    return 1 if findings else 0
