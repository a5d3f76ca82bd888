"""`racecheck mutate SCENARIO [--variant V] [--set K=V] [--list] [--quick] [--baseline FILE]`.

Sync mutation analysis (see racecheck.drivers.mutate): the scenario's clean run, then one run
per synchronization site with that site dropped; per site `necessary` (with the rule and tensor
it protects) or `silent`. `--list` only lists the sites. `--baseline FILE` (a previous `--json`
output; the scenario's own reviewed table by default, where it ships one) makes the command
fail when a site the baseline calls necessary is silent now or gone; `--quick` re-runs only those
sites. Exit 0, 1 when the clean run has findings or a necessary site regressed, 2, 3.
"""
from __future__ import annotations

import json
import os


def add_arguments(p) -> None:
    p.add_argument("scenario", help="scenario name (see `racecheck list`)")
    p.add_argument("--variant", default=None, metavar="V", help="start from a variant's settings")
    p.add_argument("--set", action="append", default=[], metavar="KNOB=VALUE", dest="sets",
                   help="override a knob (repeatable)")
    p.add_argument("--seed", default=0, type=int, help="request contents seed (default: 0)")
    p.add_argument("--list", action="store_true", help="only list the sites the clean run executed")
    p.add_argument("--quick", action="store_true",
                   help="re-run only the sites the baseline calls necessary")
    p.add_argument("--baseline", default=None, metavar="FILE",
                   help="a previous --json output to compare against (regressions exit 1)")
    p.add_argument("--json", default=None, metavar="FILE", help="write the table as JSON")
    p.add_argument("--sarif", default=None, metavar="FILE", help="write the table as SARIF 2.1.0")


def main(args) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    from rich.table import Table
    from rich.text import Text

    from racecheck.drivers import mutate

    from racecheck import scenarios
    from racecheck.core.errors import UsageError
    from racecheck.core.files import write_atomic

    console = Console(highlight=False)
    sc = scenarios.get(args.scenario)
    cfg = sc.config(variant=args.variant, overrides=scenarios.parse_sets(args.sets))
    previous = None
    baseline_path = args.baseline
    shipped = getattr(sc, "mutate_baseline", None)
    if baseline_path is None and shipped and os.path.exists(shipped):
        baseline_path = shipped
    if baseline_path:
        previous = mutate.load_previous(baseline_path)
    if args.quick and previous is None:
        raise UsageError("--quick re-runs the sites a baseline calls necessary: give --baseline FILE")

    if args.list:
        res = scenarios.run(sc, cfg, device="sim", seed=args.seed)
        table = Table(title=f"synchronization sites of {sc.name}")
        table.add_column("site (kind, where)", overflow="fold")
        table.add_column("calls", justify="right", no_wrap=True)
        for s in res.sync_sites:
            site = Text(s.id)
            site.append(f"\n{s.kind} at {s.location}", style="dim")
            table.add_row(site, str(s.calls))
        console.print(table)
        return 0

    only = None
    if args.quick:
        only = [s["id"] for s in previous["sites"] if s.get("verdict") == mutate.NECESSARY]

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=console, transient=True) as bar:
        class _Progress:
            task = None

            def start(self, total):
                self.task = bar.add_task("dropping sites", total=total)

            def advance(self, site):
                bar.update(self.task, advance=1, description=f"dropped {site.id.rsplit(':', 2)[-2]}")

        report = mutate.analyse(sc, cfg, seed=args.seed, only=only, progress=_Progress())

    table = Table(title=f"sync mutation analysis: {sc.name}"
                        + (f" (sglang {report.engine_version})" if report.engine_version else ""))
    table.add_column("site (kind, where)", overflow="fold", ratio=3)
    table.add_column("verdict", no_wrap=True, min_width=9)
    table.add_column("exposes", overflow="fold", ratio=2)
    for s in report.sites:
        exposes = _exposes(s)
        if s.diff and not exposes:
            exposes = "outputs change"
        site = Text(s.id)
        site.append(f"\n{s.kind} at {s.location}", style="dim")
        table.add_row(site, s.verdict, Text(exposes),
                      style="bold" if s.verdict == mutate.NECESSARY else "dim")
    console.print(table)
    console.print(f"{len(report.necessary())} necessary, "
                  f"{len(report.sites) - len(report.necessary())} silent of {len(report.sites)} sites",
                  markup=False)

    regressions = report.regressions(previous) if previous is not None else []
    if args.quick:      # sites not re-run are not regressions
        ran = {s.id for s in report.sites}
        regressions = [(i, w) for i, w in regressions if i in ran or "no longer" in w]
    for site_id, what in regressions:
        console.print(f"REGRESSION {site_id}: {what}", style="bold red", markup=False)
    if report.baseline_findings:
        console.print(f"the clean run has {len(report.baseline_findings)} finding(s): run "
                      f"`racecheck run {sc.name}` first", style="bold red", markup=False)

    if args.json:
        write_atomic(args.json, json.dumps(report.to_json(), indent=1, sort_keys=True) + "\n")
    if args.sarif:
        write_atomic(args.sarif, json.dumps(mutate.to_sarif(report, regressions), indent=1) + "\n")
    return 1 if (regressions or report.baseline_findings) else 0



def _exposes(site, shown: int = 2) -> str:
    """What dropping a site exposes, one entry per root cause: `RC001 x (+10)` (the JSON and
    SARIF outputs carry the group ids)."""
    parts = []
    for g in site.groups[:shown]:
        more = f" (+{len(g.tensors) - 1})" if len(g.tensors) > 1 else ""
        parts.append(f"{'+'.join(g.rules)} {g.tensors[0]}{more}")
    if len(site.groups) > shown:
        parts.append(f"+{len(site.groups) - shown} more races")
    return ", ".join(parts)
