"""`racecheck explain TRACE.jsonl [FINDING]`: why two accesses are ordered, or that nothing orders them.

    racecheck explain trace.jsonl                 # every finding of the trace
    racecheck explain trace.jsonl 2               # the second one (or a fingerprint prefix)
    racecheck explain trace.jsonl --between 12 40 # any two trace positions
    racecheck explain trace.jsonl 1 --graphml hb.graphml   # the finding's neighbourhood, for a viewer

Findings come from checking the trace again, or from `--findings FILE` (a JSON report of the same
run). Exit 0 when the explanation was printed, 2 on bad input.
"""
from __future__ import annotations

from racecheck.core.errors import UsageError


def add_arguments(p) -> None:
    p.add_argument("trace", metavar="TRACE", help="a trace saved as JSON lines (--save-trace)")
    p.add_argument("finding", nargs="?", default=None, metavar="FINDING",
                   help="which finding: its number in the report (1, 2, ...) or a fingerprint prefix "
                        "(default: all)")
    p.add_argument("--findings", metavar="FILE", default=None,
                   help="take the findings from this JSON report instead of re-checking the trace")
    p.add_argument("--between", nargs=2, type=int, metavar=("FROM", "TO"), default=None,
                   help="explain the order of two trace positions (Access.seq) instead of a finding")
    p.add_argument("--graphml", metavar="FILE", default=None,
                   help="write the happens-before neighbourhood of the (one) explained pair as GraphML")
    p.add_argument("--radius", type=int, default=3, metavar="N",
                   help="edges around each access kept in --graphml (default 3)")


def _pick(findings, which):
    if which is None:
        return list(findings)
    if which.isdigit():
        n = int(which)
        if not 1 <= n <= len(findings):
            raise UsageError(f"explain: no finding {n} (the trace has {len(findings)})")
        return [findings[n - 1]]
    hits = [f for f in findings if f.fingerprint().startswith(which)]
    if not hits:
        raise UsageError(f"explain: no finding with fingerprint {which!r}")
    return hits


def _explain_pair(g, a, b, out, prev_label="previous", cur_label="current") -> None:
    try:
        steps = g.path(a, b)
    except KeyError as exc:
        out.print(f"  cannot explain: {exc.args[0]}", markup=False)
        return
    if steps is not None:
        out.print(f"  ordered: {prev_label} happens before {cur_label}:", markup=False)
        for st in steps:
            out.print(f"    {st.text()}", markup=False)
        return
    out.print(f"  no happens-before path from {prev_label} to {cur_label}: nothing orders them", markup=False)
    tl = g.timeline_of(a)
    known = g.horizon(b, tl)
    name = g.timeline_name(tl)
    if known is None:
        out.print(f"  {cur_label} is ordered after nothing on {name}", markup=False)
    else:
        out.print(f"  the latest point of {name} ordered before {cur_label}: {known.what}"
                  + (f" at {known.where}" if known.where else "")
                  + f"; {prev_label} came after it", markup=False)


def main(args) -> int:
    import os

    from rich.console import Console

    from racecheck.core.hbgraph import HBGraph
    from racecheck.core.trace import TraceFormatError

    from racecheck.cli.commands.check_cmd import check_trace

    if args.radius < 0:
        raise UsageError("--radius must be >= 0")
    out = Console(highlight=False, soft_wrap=True)
    if args.between is None:
        if args.findings:
            from racecheck.reports.json_report import load_document
            findings, _ = load_document(args.findings)
        else:
            findings = check_trace(args.trace)
        chosen = _pick(findings, args.finding)
    else:
        check_trace(args.trace)          # the same one-line errors for a missing or bad file
        chosen = []
    try:
        g = HBGraph.from_file(args.trace)
    except (TraceFormatError, OSError) as exc:
        raise UsageError(f"malformed trace: {exc}") from None
    pairs = []
    if args.between is not None:
        a, b = args.between
        for n in (a, b):
            if n not in g.g:
                raise UsageError(f"explain: trace position {n} is not an op on a timeline "
                                 f"({os.path.basename(args.trace)} has {g.g.number_of_nodes()} such ops)")
        out.print(f"trace positions {a} -> {b}", markup=False)
        _explain_pair(g, a, b, out, f"#{a}", f"#{b}")
        pairs.append((a, b))
    elif not chosen:
        out.print("no findings to explain", markup=False)
    for f in chosen:
        out.print(f"{f.rule} {f.tensor} [{f.fingerprint()}]", markup=False)
        out.print(f"  previous: {f.previous.describe()} (#{f.previous.seq})", markup=False)
        out.print(f"  current:  {f.current.describe()} (#{f.current.seq})", markup=False)
        if f.previous.seq < 0 or f.current.seq < 0:
            out.print("  cannot explain: the finding has no trace positions", markup=False)
            continue
        _explain_pair(g, f.previous.seq, f.current.seq, out)
        pairs.append((f.previous.seq, f.current.seq))
    if args.graphml:
        if len(pairs) != 1:
            raise UsageError(f"--graphml needs exactly one pair to explain (pick a FINDING); got {len(pairs)}")
        marked = [n for n in pairs[0] if n in g.g]
        g.write_graphml(g.neighbourhood(marked, args.radius), args.graphml, marked=marked)
        out.print(f"wrote the happens-before neighbourhood to {args.graphml}", markup=False)
    return 0
