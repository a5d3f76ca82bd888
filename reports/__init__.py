"""Reports: render Findings as console text, JSON, SARIF, JUnit XML, HTML or a Perfetto trace.

Reports read only Finding objects (or their JSON form). Every command that produces findings
takes a repeatable `--report FORMAT=FILE`; `write_reports` is what they call with those specs.
"""
from __future__ import annotations

import importlib
import sys

from racecheck.core.errors import UsageError
from racecheck.core.files import write_atomic

from .console import print_findings, render_text

# format -> (module, default file suffix)
FORMATS = {
    "console": ("console", ".txt"),
    "json": ("json_report", ".json"),
    "sarif": ("sarif", ".sarif"),
    "junit": ("junit", ".xml"),
    "html": ("html_report", ".html"),
    "perfetto": ("perfetto", ".json"),
}

__all__ = ["FORMATS", "parse_report_spec", "parse_report_specs", "render", "write_reports",
           "print_findings", "render_text", "load_findings", "dump_findings"]


def parse_report_spec(spec: str) -> tuple[str, str]:
    """`FORMAT=FILE` -> (format, file). `-` as FILE (or `console` alone) means stdout."""
    if not isinstance(spec, str) or not spec.strip():
        raise UsageError("--report needs FORMAT=FILE, got an empty value")
    fmt, sep, path = spec.partition("=")
    fmt = fmt.strip().lower()
    if not sep:
        if fmt == "console":
            return "console", "-"
        raise UsageError(f"--report {spec!r}: expected FORMAT=FILE with FORMAT one of {', '.join(FORMATS)}")
    if fmt not in FORMATS:
        raise UsageError(f"--report {spec!r}: unknown format {fmt!r} (choose from {', '.join(FORMATS)})")
    path = path.strip()
    if not path:
        raise UsageError(f"--report {spec!r}: missing FILE after '='")
    return fmt, path


def parse_report_specs(specs) -> list[tuple[str, str]]:
    """Validate every `--report` value up front (a bad one fails before any work is done)."""
    if isinstance(specs, str):
        specs = [s for s in specs.split(",") if s.strip()]
    return [parse_report_spec(s) for s in (specs or ())]


def render(fmt: str, findings, meta: dict | None = None) -> str:
    """The report text of one format (what `write_reports` writes)."""
    if fmt not in FORMATS:
        raise UsageError(f"unknown report format {fmt!r} (choose from {', '.join(FORMATS)})")
    findings = list(findings)
    meta = dict(meta or {})
    if fmt == "console":
        return render_text(findings, title=meta.get("title"))
    mod = importlib.import_module(f"{__name__}.{FORMATS[fmt][0]}")
    return mod.render(findings, meta)


def write_reports(findings, specs, meta: dict | None = None) -> list[str]:
    """Write each `FORMAT=FILE` spec; returns the files written.

    All specs are parsed before anything is written, so a typo in the last one writes nothing.
    """
    parsed = parse_report_specs(specs)
    findings = list(findings)
    written = []
    for fmt, path in parsed:
        if fmt == "console" and path == "-":
            print_findings(findings, title=(meta or {}).get("title"))
            continue
        text = render(fmt, findings, meta)
        if path == "-":
            sys.stdout.write(text)
            sys.stdout.flush()
            continue
        write_atomic(path, text)
        written.append(path)
    return written


def load_findings(path):
    """Read a findings JSON file written by `racecheck ... --report json=FILE` (see json_report)."""
    from .json_report import load_findings as _load
    return _load(path)


def dump_findings(findings, meta: dict | None = None) -> dict:
    from .json_report import to_document
    return to_document(findings, meta)
