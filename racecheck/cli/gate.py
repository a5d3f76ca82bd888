"""The gate every findings-producing command ends with: filter, report, warn, pick the exit code.

`run`, `fuzz`, `exec`, `check` and `report` share it so `--report FORMAT=FILE`, `--suppressions` and
`--baseline` behave the same everywhere.
"""
from __future__ import annotations

from racecheck.core.devices import DEVICES
from racecheck.core.errors import EXIT_CLEAN, EXIT_FINDINGS
from racecheck.core.suppressions import GateResult, filter_findings, gate_meta, warn_stale


def add_gate_arguments(parser) -> None:
    """`--report FORMAT=FILE` (repeatable), `--suppressions FILE`, `--baseline FILE`."""
    parser.add_argument("--report", action="append", default=[], metavar="FORMAT=FILE",
                        help="also write a report (console, json, sarif, junit, html, perfetto); repeatable")
    parser.add_argument("--suppressions", metavar="FILE", default=None,
                        help="suppressions file: `RULE TENSOR_GLOB [LOCATION_GLOB] # reason` per line")
    parser.add_argument("--baseline", metavar="FILE", default=None,
                        help="baseline written by `racecheck baseline`: its findings do not fail")


def apply(findings, args=None, *, suppressions=None, baseline=None) -> GateResult:
    sup = suppressions if suppressions is not None else getattr(args, "suppressions", None)
    base = baseline if baseline is not None else getattr(args, "baseline", None)
    return filter_findings(list(findings), sup, base)


def finish(findings, args=None, meta: dict | None = None, *, console=None, print_console: bool = True,
           suppressions=None, baseline=None, report_specs=None) -> int:
    """Apply suppressions/baseline, print the console report, write `--report` files; return 0 or 1.

    Reports (console, HTML, SARIF, JUnit) show only what fails the gate, as code scanning needs;
    the JSON findings file keeps everything so `racecheck report`/`baseline` can re-gate it later.
    """
    from racecheck.reports import parse_report_spec, print_findings, write_reports

    findings = list(findings)
    res = apply(findings, args, suppressions=suppressions, baseline=baseline)
    meta = gate_meta(res, meta)
    specs = list(report_specs if report_specs is not None else getattr(args, "report", None) or [])
    for s in specs:            # validate all before any output
        parse_report_spec(s)
    warn_stale(res.stale)
    if print_console:
        print_findings(res.kept, console, title=meta.get("title"), suppressed=len(res.suppressed),
                       baselined=len(res.baselined))
    json_specs = [s for s in specs if parse_report_spec(s)[0] == "json"]
    other = [s for s in specs if parse_report_spec(s)[0] != "json"]
    if json_specs:
        write_reports(findings, json_specs, meta)
    if other:
        write_reports(res.kept, other, meta)
    return EXIT_FINDINGS if res.kept else EXIT_CLEAN


def report_session(session, report_specs, *, quiet=False) -> int:
    """Print and write a finished session's reports; the exit status racecheck wants (0, 1 or 3).

    What `racecheck exec` and the start-up hook end with (no suppressions: a program run is
    not a gate)."""
    import sys

    from racecheck.reports import print_findings, write_reports

    from racecheck.core.errors import EXIT_INTERNAL
    findings = session.findings
    if not quiet:
        print_findings(findings)
    specs = [s for s in (report_specs.split(",") if isinstance(report_specs, str) else report_specs) if s]
    if specs:
        write_reports(findings, specs, meta={"command": "exec"})
    if session.internal_errors:
        sys.stderr.write("racecheck: internal error: " + session.internal_errors[0].splitlines()[0] + "\n")
        return EXIT_INTERNAL
    return EXIT_FINDINGS if findings else EXIT_CLEAN


# -- the CI gate (ci/gate, `python -m racecheck.cli.gate`) ------------------------------------------

CI_USAGE = """What an engine repository's CI runs: the scenario suite and optionally its own tests under
`pytest --racecheck`, merged, filtered by suppressions and the baseline, written as SARIF (for code
scanning), JUnit XML, HTML and findings JSON. Exit 0 clean, 1 new findings (or failing tests),
2 usage or input error, 3 internal error."""


def _ci_parser():
    import argparse

    from racecheck.cli.cliparse import Parser
    p = Parser(prog="racecheck-gate", description=CI_USAGE)
    p.add_argument("--scenario-path", action="append", default=[], metavar="PATH",
                   help="load the scenarios of a Python file or package folder (repeatable)")
    p.add_argument("--scenario", action="append", default=[], metavar="NAME",
                   help="scenario to run (repeatable; default eagle-v2 unless --findings/--pytest only)")
    p.add_argument("--variant", action="append", default=[], metavar="V",
                   help="also run this variant of each scenario (repeatable); the default config always runs")
    p.add_argument("--set", action="append", default=[], metavar="KNOB=VALUE", help="passed to `racecheck run`")
    p.add_argument("--seed", default=None, help="passed to `racecheck run`")
    p.add_argument("--device", default="sim", choices=DEVICES)
    p.add_argument("--pytest", nargs=argparse.REMAINDER, default=None, metavar="ARGS",
                   help="run the repo's own tests under `pytest --racecheck ARGS` (must come last)")
    p.add_argument("--findings", action="append", default=[], metavar="FILE",
                   help="also gate a findings JSON written elsewhere (fuzz, exec); repeatable")
    p.add_argument("--out", default="racecheck-out", metavar="DIR",
                   help="where reports go (default racecheck-out/)")
    p.add_argument("--suppressions", default=None, metavar="FILE")
    p.add_argument("--baseline", default=None, metavar="FILE")
    p.add_argument("--category", default=None, help="SARIF automation category (default racecheck-DEVICE)")
    p.add_argument("--no-scenarios", action="store_true", help="run no scenario (only --pytest/--findings)")
    return p


def _run(cmd, env=None) -> int:
    import subprocess
    import sys
    sys.stdout.flush()
    return subprocess.run(cmd, env=env).returncode


def ci_entry() -> int:
    """The `racecheck-gate` program (console script, `python -m racecheck.cli.gate`)."""
    from racecheck.cli.cliparse import exit_now_after_engine
    status = ci_main()
    exit_now_after_engine(status)
    return status


def ci_main(argv=None) -> int:
    """Run the gate; returns the process exit code."""
    import sys

    from rich.console import Console

    from racecheck.core.errors import EXIT_INTERNAL, EXIT_USAGE, UsageError

    err = Console(stderr=True, highlight=False, soft_wrap=True)
    try:
        return _ci_main(sys.argv[1:] if argv is None else list(argv), err)
    except UsageError as exc:
        err.print(f"racecheck-gate: error: {exc}", markup=False)
        return EXIT_USAGE
    except SystemExit as exc:  # --help
        return int(exc.code or 0)
    except Exception as exc:
        import traceback
        traceback.print_exc()
        err.print(f"racecheck-gate: internal error: {type(exc).__name__}: {exc}", markup=False)
        return EXIT_INTERNAL


def _ci_main(argv, err) -> int:
    import os
    import sys

    import time

    from racecheck.reports import print_findings, write_reports
    from racecheck.reports._common import case_name
    from racecheck.reports.json_report import load_document

    from racecheck.core.errors import EXIT_INTERNAL, EXIT_USAGE
    from racecheck.core.suppressions import load_baseline, load_suppressions

    args = _ci_parser().parse_args(argv)
    if args.scenario_path:
        from racecheck import scenarios as registry
        for path in args.scenario_path:      # checked now; the runs below inherit it
            registry.add_path(path)
    # inputs first: a bad suppressions/baseline file must fail before minutes of scenario runs
    sups = load_suppressions(args.suppressions) if args.suppressions else []
    base = load_baseline(args.baseline) if args.baseline else set()
    out = os.path.abspath(args.out)
    raw = os.path.join(out, "raw")
    os.makedirs(raw, exist_ok=True)
    if args.no_scenarios:
        scenarios = []
    elif args.scenario:
        scenarios = args.scenario
    else:  # the default suite, unless the caller only gates tests or existing files
        scenarios = [] if (args.findings or args.pytest is not None) else ["eagle-v2"]
    py = [sys.executable, "-m", "racecheck"]
    worst = 0                      # 0 ok, 1 failing tests, 2 usage, 3 internal
    inputs = []                    # (case name or None, json path, time)
    notes = []

    for sc in scenarios:
        for variant in [None, *args.variant]:
            name = f"{sc}[{variant}]" if variant else sc
            path = os.path.join(raw, f"{name.replace('[', '.').replace(']', '')}.json")
            cmd = [*py, "run", sc, "--device", args.device, "--report", f"json={path}"]
            if variant:
                cmd += ["--variant", variant]
            for kv in args.set:
                cmd += ["--set", kv]
            if args.seed is not None:
                cmd += ["--seed", str(args.seed)]
            err.print(f"racecheck-gate: {' '.join(cmd[2:])}", markup=False)
            t0 = time.perf_counter()
            code = _run(cmd)
            if code in (0, 1) and os.path.exists(path):
                inputs.append((name, path, time.perf_counter() - t0))
            else:
                worst = max(worst, EXIT_USAGE if code == EXIT_USAGE else EXIT_INTERNAL)
                notes.append({"name": name, "error": f"`racecheck run` exited {code}"})

    if args.pytest is not None:
        path = os.path.join(raw, "pytest.json")
        cmd = [sys.executable, "-m", "pytest", "--racecheck", "--racecheck-device", args.device,
               f"--racecheck-report=json={path}", f"--junitxml={os.path.join(out, 'pytest-junit.xml')}",
               *args.pytest]
        err.print(f"racecheck-gate: pytest --racecheck {' '.join(args.pytest)}", markup=False)
        code = _run(cmd)
        if code == 1:
            worst = max(worst, 1)   # failing tests fail the gate; races among them are gated below
        elif code == 5:
            notes.append({"name": "pytest", "skipped": "no tests collected"})
        elif code != 0:
            worst = max(worst, EXIT_USAGE if code == 4 else EXIT_INTERNAL)
            notes.append({"name": "pytest", "error": f"pytest exited {code}"})
        if os.path.exists(path):
            inputs.append((None, path, 0.0))

    for path in args.findings:
        inputs.append((None, path, 0.0))

    everything, seen, cases, meta0 = [], set(), [], {}
    for name, path, seconds in inputs:
        findings, meta = load_document(path)
        meta0 = meta0 or meta
        for f in findings:
            if f.fingerprint() not in seen:
                seen.add(f.fingerprint())
                everything.append(f)
        if meta.get("cases"):       # pytest: one case per test
            cases += [{**c, "fingerprints": c.get("fingerprints", [])} for c in meta["cases"]]
            # cases only list the findings that failed each test; re-gate them all here
            listed = {fp for c in meta["cases"] for fp in c.get("fingerprints", ())}
            extra = [f.fingerprint() for f in findings if f.fingerprint() not in listed]
            if extra:
                cases.append({"name": f"{case_name(meta)} (other)", "fingerprints": extra})
        else:
            label = name or (case_name(meta) if meta.get("scenario") else os.path.basename(path))
            cases.append({"name": label,
                          "time": seconds, "fingerprints": [f.fingerprint() for f in findings],
                          "file": meta.get("source", "")})
    cases += notes

    res = filter_findings(everything, sups, base)
    meta = gate_meta(res, {"scenario": "racecheck gate", "device": args.device, "suite": "racecheck",
                           "category": args.category or f"racecheck-{args.device}", "cases": cases})
    meta["title"] = f"racecheck gate ({args.device})"
    warn_stale(res.stale, err)
    write_reports(everything, [f"json={os.path.join(out, 'findings.json')}"], meta)
    write_reports(res.kept, [f"sarif={os.path.join(out, 'racecheck.sarif')}",
                             f"junit={os.path.join(out, 'racecheck-junit.xml')}",
                             f"html={os.path.join(out, 'racecheck.html')}",
                             f"perfetto={os.path.join(out, 'racecheck.perfetto.json')}"], meta)
    print_findings(res.kept, title=meta["title"], suppressed=len(res.suppressed), baselined=len(res.baselined))
    summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if summary:
        with open(summary, "a", encoding="utf-8") as fh:
            fh.write(markdown_summary(res, meta))
    code = max(worst, EXIT_FINDINGS if res.kept else EXIT_CLEAN)
    if worst >= EXIT_USAGE:
        code = worst
    err.print(f"racecheck-gate: {len(res.kept)} new, {len(res.suppressed)} suppressed, {len(res.baselined)} "
              f"baselined; reports in {args.out}; exit {code}", markup=False)
    return code


def markdown_summary(res: GateResult, meta: dict) -> str:
    """A short table for $GITHUB_STEP_SUMMARY."""
    lines = [f"### {meta.get('title', 'racecheck')}", ""]
    if not res.kept:
        lines.append(f"No new races ({len(res.suppressed)} suppressed, {len(res.baselined)} baselined).")
    else:
        lines += ["| rule | tensor | streams | location | fix |", "| --- | --- | --- | --- | --- |"]
        for f in res.kept:
            fix = f.suggestion.replace("|", "\\|")
            lines.append(f"| {f.rule} | `{f.tensor}` | {f.current.stream} ← {f.previous.stream} | "
                         f"`{f.current.location or '?'}` | {fix} |")
    for s in res.stale:
        lines.append(f"\n> stale suppression (matched nothing): `{s}`")
    return "\n".join(lines) + "\n\n"


if __name__ == "__main__":
    import sys
    sys.exit(ci_entry())
