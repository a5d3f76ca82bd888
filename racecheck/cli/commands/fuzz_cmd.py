"""`racecheck fuzz SCENARIO`: Hypothesis over a scenario; every distinct failure shrunk and saved.

    racecheck fuzz eagle-v2 --variant no-futuremap_publish --budget 60s
    racecheck fuzz eagle-v2 --max-examples 10000 --db redis://ci-redis:6379/0 --workers 4

Exit 0 when nothing failed, 1 when at least one failure was found (each one is written as a repro
record under --findings-dir and its one-line reproduction command is printed), 2 on usage errors.

Known failures (a nightly job's documented races): with `--suppressions FILE` or `--baseline FILE`
(the formats `racecheck report` and the CI gate read), a distinct failure whose findings they all
accept is still shrunk, saved and listed, as known, but does not fail the run: exit 1 only for a
new one. Failures with no findings (CRASH, FAULT, INTERNAL) are never known. `--report json=`
keeps every failure's findings (to re-gate with the same files); other formats only the new ones.
"""
from __future__ import annotations


from racecheck.core.devices import DEVICES
from racecheck.core.errors import EXIT_CLEAN, EXIT_FINDINGS, EXIT_INTERNAL, UsageError

STATUS_EVERY_S = 30.0      # without a terminal (CI logs): one status line this often


def add_arguments(p) -> None:
    p.add_argument("scenario", help="scenario name (see `racecheck list`)")
    p.add_argument("--variant", default=None,
                   help="fuzz this variant (a fix switched off); default: all fixes on")
    lim = p.add_mutually_exclusive_group()
    lim.add_argument("--budget", default=None, metavar="DURATION",
                     help="wall-clock budget, e.g. 60s, 5m, 1h (default 60s; with --max-examples: no limit)")
    lim.add_argument("--max-examples", type=int, default=None, metavar="N",
                     help="stop after N examples instead of after a time budget")
    p.add_argument("--seed", type=int, default=None, help="seed the search (reproducible example choice)")
    p.add_argument("--db", default=None, metavar="PATH|redis://HOST:PORT/N",
                   help="example database shared between runs and runners (default .racecheck/examples; "
                        "`none` to disable)")
    p.add_argument("--workers", type=int, default=1, metavar="N",
                   help="processes fuzzing in parallel on one database (default 1)")
    p.add_argument("--device", default="sim", choices=DEVICES,
                   help="backend (default sim: adversarial executor on the CPU)")
    p.add_argument("--findings-dir", default="racecheck-findings", metavar="DIR",
                   help="where repro records are written (default racecheck-findings)")
    p.add_argument("--report", action="append", default=[], metavar="FORMAT=FILE",
                   help="also write the failures' findings as FORMAT (json, sarif, junit, html, perfetto)")
    p.add_argument("--draw-switches", action="store_true",
                   help="also draw the fix switches (each may be off): hunt for every fix-off race at once")
    p.add_argument("--first", action="store_true",
                   help="stop as soon as the first failure is shrunk and saved")
    p.add_argument("--every-variant", action="store_true",
                   help="a tour: fuzz the scenario as shipped (a third of the budget), then each fix-off "
                        "variant until its first failure; a table of what was found, with repro commands")
    p.add_argument("--set", action="append", default=[], metavar="KNOB=VALUE", dest="sets",
                   help="fix a knob in every example (repeatable), e.g. --set flavour=npu; the fuzzer "
                        "draws the others")
    p.add_argument("--drop-sync", action="append", default=[], metavar="SITE", dest="drop_sync",
                   help="drop a synchronization site in every example (repeatable; ids from "
                        "`racecheck mutate SCENARIO --list`)")
    p.add_argument("--suppressions", metavar="FILE", default=None,
                   help="known failures: one whose findings this suppressions file (`RULE TENSOR_GLOB "
                        "[LOCATION_GLOB] # reason`) accepts is saved and listed as known, and does not "
                        "fail the run")
    p.add_argument("--baseline", metavar="FILE", default=None,
                   help="known failures as a baseline written by `racecheck baseline`")
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def _validate(args):
    from racecheck.drivers.fuzz import parse_budget
    if args.max_examples is not None and args.max_examples < 1:
        raise UsageError("--max-examples must be >= 1")
    if args.workers < 1:
        raise UsageError("--workers must be >= 1")
    budget = parse_budget(args.budget) if args.budget is not None else None
    if budget is None and args.max_examples is None:
        budget = 60.0
    if args.report:
        from racecheck.reports import parse_report_specs
        parse_report_specs(args.report)
    # known failures are read now: a bad file fails before minutes of fuzzing
    from racecheck.core.suppressions import load_baseline, load_suppressions
    args.known = (load_suppressions(args.suppressions) if args.suppressions else [],
                  load_baseline(args.baseline) if args.baseline else set())
    if args.every_variant:
        for flag, bad in (("--variant", args.variant), ("--workers", args.workers > 1),
                          ("--draw-switches", args.draw_switches), ("--max-examples", args.max_examples),
                          ("--set", args.sets), ("--drop-sync", args.drop_sync),
                          ("--suppressions", args.suppressions), ("--baseline", args.baseline)):
            if bad:
                raise UsageError(f"--every-variant picks the variants and a time budget itself; drop {flag}")
    return budget


def main(args) -> int:
    from rich.console import Console
    from racecheck.drivers.fuzz import FuzzTarget, open_database
    budget = _validate(args)
    if args.every_variant:
        return _tour(args, budget)
    fixed = _fixed(args)
    target = FuzzTarget(args.scenario, args.variant, device=args.device, draw_switches=args.draw_switches,
                        fixed=fixed)
    db = open_database(args.db)          # fails early (one line) on a bad path or unreachable Redis
    out = Console(highlight=False, soft_wrap=True)
    err = Console(stderr=True, highlight=False)
    db_text = args.db or ".racecheck/examples"
    out.print(f"racecheck fuzz {target.label} on {args.device}: "
              + (f"budget {budget:g}s" if budget else f"{args.max_examples} examples")
              + f", database {db_text} (key {target.key.decode()})"
              + (f", {args.workers} workers" if args.workers > 1 else ""), markup=False)
    found = {}          # key -> (path, examples, seconds, wrong values)
    if args.workers > 1:
        status = _run_workers(args, target, budget, found, out, err)
        if status is not None:
            return status
        examples = sum(v for v in found.pop("__examples__", [0]))
        elapsed = found.pop("__elapsed__", 0.0)
        kinds = found.pop("__kinds__", {})
    else:
        report = _run_one(args, target, db, budget, found, out)
        examples, elapsed, kinds = report.examples, report.elapsed, report.kinds
        e = getattr(report, "engines", None)
        if e:          # one engine, many schedules (docs/FUZZING.md)
            out.print(f"engines: {e['engines_built']} built for {e['stretches']} examples run as "
                      f"stretches of open engines ({e['retired']} closed after a failure; "
                      f"failures confirmed on a fresh engine: {e['confirmations']['confirmed']}, "
                      f"not reproduced there: {e['confirmations']['not_reproduced']})",
                      markup=False)
    return _summary(args, target, found, examples, elapsed, out, kinds)


def _fixed(args) -> dict | None:
    """The knobs every example keeps: `--set KNOB=VALUE` and `--drop-sync SITE`."""
    from racecheck import scenarios
    fixed = scenarios.parse_sets(args.sets)
    if args.drop_sync:
        if "drop_sync" in fixed:
            raise UsageError("give the dropped sites either with --drop-sync or with --set drop_sync=, not both")
        fixed["drop_sync"] = ",".join(args.drop_sync)
    return fixed or None


def _progress_columns():
    from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
    return Progress(SpinnerColumn(), TextColumn("[bold]fuzz[/bold] {task.description}"), BarColumn(),
                    TextColumn("{task.fields[examples]} examples"),
                    TextColumn("{task.fields[distinct]} distinct failures"),
                    TextColumn("{task.fields[rate]:.1f}/s"), TimeElapsedColumn(), transient=True)


def _run_one(args, target, db, budget, found, out):
    from racecheck.drivers.fuzz import Fuzzer
    progress = None
    task = None
    if not args.quiet and out.is_terminal:
        progress = _progress_columns()
        total = budget if budget else args.max_examples
        task = progress.add_task(target.label, total=total, examples=0, distinct=0, rate=0.0)
        progress.start()

    last = [0.0]

    def on_progress(examples, distinct, elapsed):
        rate = examples / elapsed if elapsed else 0.0
        if progress is not None:
            progress.update(task, completed=min(elapsed, budget) if budget else examples,
                            examples=examples, distinct=distinct, rate=rate)
        elif not args.quiet and elapsed - last[0] >= STATUS_EVERY_S:   # logs: a line now and then
            last[0] = elapsed
            out.print(f"fuzz: {examples} examples, {distinct} distinct failures, {elapsed:.0f}s, "
                      f"{rate:.1f}/s", markup=False)

    def on_found(ff):
        found[ff.key] = (ff.path, ff.examples_to_find, ff.seconds_to_find, ff.outcome.wrong_values())
        from racecheck.drivers.fuzz import reproduce_command
        line = (f"found {ff.key} after {ff.examples_to_find} examples ({ff.seconds_to_find:.1f}s); "
                f"shrunk: {reproduce_command(ff.path) if ff.path else '(not saved)'}")
        if progress is not None:
            progress.console.print(line, markup=False)
        elif not args.quiet:
            out.print(line, markup=False)

    try:
        report = Fuzzer(target, database=db, findings_dir=args.findings_dir, budget_s=budget,
                        max_examples=args.max_examples, seed=args.seed, first_only=args.first,
                        on_progress=on_progress, on_found=on_found).run()
    finally:
        if progress is not None:
            progress.stop()
    report_findings = {k: v.outcome.findings for k, v in report.failures.items()}
    found["__findings__"] = report_findings
    return report


def _run_workers(args, target, budget, found, out, err):
    from racecheck.drivers.fuzz import WorkerSpec, reproduce_command, run_workers
    spec = WorkerSpec(scenario=target.scenario, variant=target.variant, device=args.device,
                      draw_switches=args.draw_switches, db=args.db, seed=args.seed,
                      findings_dir=args.findings_dir, budget_s=budget, fixed=tuple(sorted(target.fixed.items())),
                      max_examples=-(-args.max_examples // args.workers) if args.max_examples else None,
                      first_only=args.first)
    progress = None
    task = None
    if not args.quiet and out.is_terminal:
        progress = _progress_columns()
        task = progress.add_task(f"{target.label} x{args.workers}", total=None, examples=0, distinct=0, rate=0.0)
        progress.start()
    import time
    t0 = time.monotonic()

    last = [0.0]

    def on_progress(total, per):
        el = time.monotonic() - t0
        distinct = len([k for k in found if not k.startswith("__")])
        if progress is not None:
            progress.update(task, examples=total, distinct=distinct, rate=total / el if el else 0.0)
        elif not args.quiet and el - last[0] >= STATUS_EVERY_S:
            last[0] = el
            out.print(f"fuzz: {total} examples ({len(per)} workers), {distinct} distinct failures, "
                      f"{el:.0f}s, {total / el if el else 0.0:.1f}/s", markup=False)

    def on_found(msg):
        if msg.key not in found:
            found[msg.key] = (msg.path, msg.examples_to_find, msg.seconds_to_find, msg.wrong_values)
            line = (f"worker {msg.worker}: found {msg.key} after {msg.examples_to_find} examples "
                    f"({msg.seconds_to_find:.1f}s); shrunk: {reproduce_command(msg.path)}")
            (progress.console if progress is not None else out).print(line, markup=False)

    try:
        done, errors = run_workers(spec, args.workers, on_progress=on_progress, on_found=on_found)
    finally:
        if progress is not None:
            progress.stop()
    for e in errors:
        if e.usage:
            raise UsageError(e.error.split(": ", 1)[-1])
        err.print(f"racecheck: worker {e.worker} failed: {e.error}", markup=False)
        err.print(e.traceback, markup=False)
    if errors and not done:
        return EXIT_INTERNAL
    found["__examples__"] = [d.examples for d in done.values()]
    found["__elapsed__"] = max([d.elapsed for d in done.values()] or [0.0])
    kinds = {}
    for d in done.values():
        for k, n in d.kinds.items():
            kinds[k] = kinds.get(k, 0) + n
    found["__kinds__"] = kinds
    return None


def _summary(args, target, found, examples, elapsed, out, kinds=None):
    from racecheck.drivers.fuzz import reproduce_command
    unmatched = target.unmatched_drops()
    if unmatched:
        from racecheck.scenarios.registry import unexecuted_drops
        raise unexecuted_drops(unmatched, target.sites_seen)
    findings_by_key = found.pop("__findings__", None)
    keys = [k for k in found if not k.startswith("__")]
    example_findings = {key: _example_findings(key, found[key][0], findings_by_key) for key in keys}
    sups, base = getattr(args, "known", None) or ([], set())
    known = known_failures(example_findings, sups, base)
    rate = examples / elapsed if elapsed else 0.0
    out.print(f"{examples} examples in {elapsed:.1f}s ({rate:.1f}/s); {len(keys)} distinct failure(s)"
              + (f", {len(known)} known, {len(keys) - len(known)} new" if sups or base else ""), markup=False)
    if kinds is not None:
        k = dict(kinds)
        out.print(f"examples with detector findings: {k.get('finding', 0)}, differential mismatches: "
                  f"{k.get('differential', 0)}, faults: {k.get('fault', 0)}, crashes: {k.get('crash', 0)}, "
                  f"internal errors: {k.get('internal', 0)}", markup=False)
    all_findings, new_findings = [], []
    for key in keys:
        path, n, secs, wrong = found[key]
        out.print(f"  {key}: " + (f"known ({known[key]}); " if key in known else "")
                  + f"first seen after {n} examples ({secs:.1f}s); shrunk repro {path}", markup=False)
        if wrong:
            out.print(f"    wrong value: {wrong}", markup=False)
        out.print(f"    reproduce: {reproduce_command(path)}", markup=False)
        own = [f for f in example_findings[key] if _key_of(f) == key]
        all_findings.extend(own)
        if key not in known:
            new_findings.extend(own)
    if args.report:
        from racecheck.reports import parse_report_spec, write_reports
        from racecheck.core.suppressions import filter_findings, gate_meta
        meta = {"command": "fuzz", "scenario": target.scenario, "variant": target.variant}
        if sups or base:
            meta = gate_meta(filter_findings(all_findings, sups, base), meta)
        json_specs = [s for s in args.report if parse_report_spec(s)[0] == "json"]
        if json_specs:
            write_reports(all_findings, json_specs, meta)
        other = [s for s in args.report if parse_report_spec(s)[0] != "json"]
        if other:
            write_reports(new_findings, other, meta)
    return EXIT_FINDINGS if len(known) < len(keys) else EXIT_CLEAN


def _example_findings(key: str, path: str, findings_by_key) -> list:
    """Every finding of the example that showed failure `key` (its peers group with it)."""
    if findings_by_key is not None:
        return list(findings_by_key.get(key, ()))
    try:                       # workers: from the saved record
        from racecheck.core.findings import Finding
        from racecheck.drivers.fuzz import load_record
        return [Finding.from_json(d) for d in load_record(path).get("observed", {}).get("findings", ())]
    except Exception:
        return []


def known_failures(example_findings: dict, suppressions=(), baseline=()) -> dict:
    """{failure key: why it is known} for the failures whose findings the suppressions or the
    baseline all accept. `example_findings` maps each failure key to the findings of the example
    that showed it (all of them: an entry takes the root-cause group of every finding it
    matches). A failure with no finding of its own key (CRASH, FAULT, INTERNAL) is never known."""
    from racecheck.core.suppressions import filter_findings
    if not suppressions and not baseline:
        return {}
    out = {}
    for key, findings in example_findings.items():
        own = [f for f in findings if _key_of(f) == key]
        if not own:
            continue
        res = filter_findings(findings, list(suppressions), baseline)
        if any(_key_of(f) == key for f in res.kept):
            continue
        hit = next((s for s in suppressions for f in own if s.matches(f)), None)
        out[key] = f"suppressed: {hit.reason}" if hit is not None else (
            "suppressed" if any(_key_of(f) == key for f in res.suppressed) else "in the baseline")
    return out


def _key_of(f):
    from racecheck.drivers.fuzz import finding_key
    return finding_key(f)


def _tour(args, budget) -> int:
    """The shipped scenario fuzzed for a third of the budget, then every fix-off variant until its
    first failure (time a variant leaves unused goes to the next), as one table: what racecheck
    finds and how to replay each find."""
    import time

    from rich.console import Console

    from racecheck import scenarios
    from racecheck.drivers.fuzz import Fuzzer, FuzzTarget, open_database
    from racecheck.drivers.fuzz.keys import expected_key

    sc = scenarios.get(args.scenario)
    db = open_database(args.db)
    out = Console(highlight=False, soft_wrap=True)
    variants = list(sc.variants.values())
    out.print(f"racecheck fuzz {sc.name} --every-variant on {args.device}: the shipped pipeline for "
              f"{budget / 3:.0f}s, then {len(variants)} fix-off variants until each one's first failure "
              f"({budget:g}s in all)", markup=False)
    rows = []
    repros = []

    def fuzz(variant, seconds, first):
        target = FuzzTarget(sc.name, variant, device=args.device)
        progress = _progress_columns() if not args.quiet and out.is_terminal else None
        task = None
        if progress is not None:
            task = progress.add_task(target.label, total=seconds, examples=0, distinct=0, rate=0.0)
            progress.start()

        def on_progress(examples, distinct, elapsed):
            if progress is not None:
                progress.update(task, completed=min(elapsed, seconds), examples=examples, distinct=distinct,
                                rate=examples / elapsed if elapsed else 0.0)
        try:
            return Fuzzer(target, database=db, findings_dir=args.findings_dir, budget_s=seconds,
                          seed=args.seed, first_only=first, on_progress=on_progress).run()
        finally:
            if progress is not None:
                progress.stop()

    t0 = time.monotonic()
    shipped = fuzz(None, budget / 3, False)
    shipped_keys = sorted(shipped.failures)
    rows.append(("(all fixes on)", ", ".join(shipped_keys) or "clean",
                 "no: it should be clean" if shipped_keys else "yes",
                 f"{_n(shipped.examples, 'example')}, {shipped.elapsed:.0f}s"))
    repros += [(f"(all fixes on) {k}", f.command()) for k, f in sorted(shipped.failures.items())]
    reported = [x for k, f in sorted(shipped.failures.items()) for x in f.outcome.findings if _key_of(x) == k]
    missed = []
    for i, v in enumerate(variants):
        left = max(budget - (time.monotonic() - t0), 0.0)
        share = max(left / (len(variants) - i), 5.0)
        rep = fuzz(v.name, share, True)
        expected = [expected_key(rule, tensor) for rule, tensor in v.expected]
        hits = [k for k in rep.failures if k in expected] or sorted(rep.failures)
        if hits:
            f = rep.failures[hits[0]]
            found = hits[0]
            ok = "yes" if hits[0] in expected else f"no: expected {' or '.join(expected)}"
            when = f"{_n(f.examples_to_find, 'example')}, {f.seconds_to_find:.1f}s"
            repros.append((v.name, f.command()))
            reported += [x for x in f.outcome.findings if _key_of(x) == hits[0]]
        else:
            found, ok, when = "nothing", f"no: expected {' or '.join(expected)}", f"{share:.0f}s budget"
            missed.append(v.name)
        rows.append((v.name, found, ok, when))

    Console(highlight=False).print(tour_table(sc.name, rows))
    if repros:
        out.print("replay a shrunk failure deterministically (exit 1 while it reproduces):", markup=False)
        for name, cmd in repros:
            out.print(f"  {name}: {cmd}", markup=False)
    if args.report:
        from racecheck.reports import write_reports
        write_reports(reported, args.report, meta={"command": "fuzz", "scenario": sc.name, "variant": ""})
    if shipped_keys:
        out.print(f"the shipped pipeline failed: {', '.join(shipped_keys)}", markup=False)
    if missed:
        out.print(f"not found within the budget: {', '.join(missed)} (try --budget {2 * budget:g}s)", markup=False)
    return EXIT_FINDINGS if shipped_keys or missed else EXIT_CLEAN


def _n(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


def tour_table(name: str, rows):
    """The tour's table: (pipeline, found, ok?, after) rows; every cell folds, so it reads in 80
    columns."""
    from rich import box
    from rich.table import Table
    table = Table(title=f"{name}: what racecheck finds", title_justify="left", box=box.SIMPLE_HEAD)
    table.add_column("pipeline", style="bold", no_wrap=True)
    table.add_column("found", overflow="fold")
    table.add_column("ok?", min_width=3, overflow="fold")
    table.add_column("after", overflow="fold")
    for row in rows:
        table.add_row(*row)
    return table
