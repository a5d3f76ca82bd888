"""`racecheck repro FILE`: replay a repro record deterministically and show its failure.

Exit 1 when the failure reproduces, 0 when it no longer does (fixed, or the scenario changed),
2 when FILE is not a readable racecheck repro record.
"""
from __future__ import annotations

from racecheck.core.devices import DEVICES
from racecheck.core.errors import EXIT_CLEAN, EXIT_FINDINGS


def add_arguments(p) -> None:
    p.add_argument("file", metavar="FILE", help="a repro record written by `racecheck fuzz`")
    p.add_argument("--device", default=None, choices=DEVICES,
                   help="replay on another backend (default: the record's, normally sim)")
    p.add_argument("--repeat", type=int, default=1, metavar="N",
                   help="replay N times and report how often the failure came back")
    p.add_argument("--report", action="append", default=[], metavar="FORMAT=FILE",
                   help="also write the replay's findings as FORMAT (json, sarif, junit, html, perfetto)")
    p.add_argument("--all", action="store_true", help="show every finding of the replay, not only the record's")
    p.add_argument("--quiet", action="store_true", help="print only the verdict line")


def main(args) -> int:
    from rich.console import Console
    from racecheck.core.errors import UsageError
    from racecheck.drivers.fuzz import load_record, replay
    from racecheck.instrumentation.adversarial import plan_text
    if args.repeat < 1:
        raise UsageError("--repeat must be >= 1")
    if args.report:
        from racecheck.reports import parse_report_specs
        parse_report_specs(args.report)
    rec = load_record(args.file)
    out = Console(highlight=False, soft_wrap=True)      # one-line paths and commands stay copyable
    key = rec["failure"]["key"]
    hits = 0
    last = None
    for _ in range(args.repeat):
        last = replay(rec, device=args.device)
        hits += last.reproduced
    o = last.outcome
    where = rec["scenario"] + (f" --variant {rec['variant']}" if rec.get("variant") else "")
    plan = rec.get("plan")
    if not args.quiet:
        out.print(f"replaying {args.file}: {where} on {args.device or rec.get('device', 'sim')}, "
                  f"{'adversarial plan ' + plan_text(plan) if plan is not None else 'eager (issue order)'}",
                  markup=False)
        cfg = rec["config"]
        keys = [k for k in ("iterations", "schedule", "buckets", "steps", "topk", "draft_tokens") if k in cfg]
        if keys:
            out.print("  " + ", ".join(f"{k}={_fmt(cfg[k])}" for k in keys), markup=False)
        shown = o.findings if args.all else [f for f in o.findings if _key(f) == key]
        if shown:
            from racecheck.reports.console import print_findings
            print_findings(shown, Console(highlight=False))     # panels wrap their lines, never crop
        wrong = o.wrong_values()
        if wrong:
            out.print(f"wrong value (vs the serialized run): {wrong}", markup=False)
        for fl in o.faults[:3]:
            out.print(f"fault: {fl['op']} on {fl['stream']} failed when the plan ran it: {fl['error']}",
                      markup=False)
        if o.crash:
            out.print(f"the program crashed under this order: {o.crash}", markup=False)
    if args.report:
        from racecheck.reports import write_reports
        write_reports(o.findings, args.report, meta={"command": "repro", "record": args.file})
    rate = f" ({hits}/{args.repeat} replays)" if args.repeat > 1 else ""
    if hits:
        out.print(f"reproduced: {key}{rate}", markup=False)
        return EXIT_FINDINGS
    others = ", ".join(o.keys) if o.keys else "none"
    out.print(f"no longer reproduces: {key} did not show up{rate} (failures now: {others})", markup=False)
    return EXIT_CLEAN


def _key(f):
    from racecheck.drivers.fuzz import finding_key
    return finding_key(f)


def _fmt(v):
    if isinstance(v, list):
        return ",".join(map(str, v))
    return str(v)
