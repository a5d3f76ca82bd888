"""Console report: one rich panel per root-cause group, built from small renderables.

Findings one synchronization fixes (`racecheck.core.findings.group_findings`) share a panel: the rule,
both sites and stacks, the fix once, and the tensors it covers. Why small pieces: the pytest
plugin, `racecheck run` and `racecheck report` each compose these (the plugin needs plain text for
a test failure, the CLI a colored terminal). Every table folds its cells, so a panel reads in 80
columns.
"""
from __future__ import annotations

from typing import Iterable

from rich.console import Console, Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from racecheck.core import rules
from racecheck.core.findings import Access, Finding, FindingGroup, group_findings

STACK_DEPTH = 4  # frames per access: enough to see the caller chain, short enough to scan
TENSORS_SHOWN = 6  # tensors listed per group before "and N more"
TITLE_NAME = 40   # longest tensor name a panel title shows (80 columns, a 16-digit subtitle)


def rule_title(f: Finding) -> Text:
    """The rule's full sentence, first line of the panel body."""
    return Text(f"{f.title} on `{f.tensor}`", style="italic")


def access_table(f: Finding) -> Table:
    """The two accesses side by side: what, where and on which stream."""
    table = Table(show_header=True, header_style="bold", box=None, pad_edge=False, expand=False)
    table.add_column("", style="dim", no_wrap=True)
    table.add_column("kind", min_width=4, overflow="fold")
    table.add_column("op", overflow="fold")
    table.add_column("stream", style="magenta", overflow="fold")
    table.add_column("location", style="green", overflow="fold")
    for label, a in (("current", f.current), ("previous", f.previous)):
        where = a.location or "?"
        if a.function:
            where += f"\nin {a.function}"
        table.add_row(label, a.kind, a.op, a.stream, where)
    return table


def stack_text(label: str, a: Access, depth: int = STACK_DEPTH) -> Text:
    """A short stack, innermost first, elided past `depth` frames."""
    t = Text(f"{label} stack ({a.stream}):", style="dim")
    frames = list(a.stack) or ([a.location] if a.location else [])
    if not frames:
        t.append(" (no stack)", style="dim")
    for fr in frames[:depth]:
        t.append(f"\n  {fr}")
    if len(frames) > depth:
        t.append(f"\n  … {len(frames) - depth} more", style="dim")
    return t


def notes_text(f: Finding) -> Text | None:
    parts = []
    if f.detail:
        parts.append(("detail: ", f.detail))
    if f.approx:
        parts.append(("approx: ", f.approx))
    if not parts:
        return None
    t = Text()
    for i, (k, v) in enumerate(parts):
        if i:
            t.append("\n")
        t.append(k, style="bold")
        t.append(v)
    return t


def suggestion_text(f: Finding, fix: str | None = None) -> Text:
    t = Text("fix: ", style="bold green")
    t.append((fix if fix is not None else f.suggestion) or "(no suggestion)")
    if f.missing_edge and len(f.missing_edge) == 2:
        t.append(f"\nmissing edge: {f.missing_edge[0]} → {f.missing_edge[1]}", style="dim")
    return t


def group_heading(g: FindingGroup) -> Text:
    """`RC001 read-after-write on draft_token` or `RC001 read-after-write on 11 tensors`; a
    group of several ordering rules reads `RC001+RC002 unordered accesses on 5 tensors`."""
    t = Text()
    names = rules.get(g.rules[0]).name if len(g.rules) == 1 else "unordered accesses"
    t.append("+".join(g.rules), style="bold red")
    t.append(f" {names}", style="bold")
    t.append(" on ")
    tensors = g.tensors
    if len(tensors) > 1:
        t.append(f"{len(tensors)} tensors", style="bold cyan")
    elif len(tensors[0]) <= TITLE_NAME:
        t.append(tensors[0], style="bold cyan")
    else:           # a panel crops its title: the body's first line names it in full
        t.append("1 tensor", style="bold cyan")
    return t


def tensors_text(g: FindingGroup, shown: int = TENSORS_SHOWN) -> Text:
    """The tensors a group covers, with their bytes and, where a finding's sites differ from the
    first one's, its own lines."""
    first = g.first
    t = Text(f"tensors ({len(g.tensors)}):", style="bold")
    seen = []
    for f in g.findings:
        if f.tensor in seen:
            continue
        seen.append(f.tensor)
        if len(seen) > shown:
            continue
        t.append("\n  ")
        if f.where and f"`{f.tensor}`" in f.where:
            t.append(f.where)
        else:
            t.append(f.tensor, style="cyan")
            if f.where:
                t.append(f": {f.where}", style="dim")
        if (f.current.location, f.previous.location) != (first.current.location,
                                                        first.previous.location):
            t.append(f" ({f.current.location or '?'} after {f.previous.location or '?'})",
                     style="dim")
    if len(seen) > shown:
        t.append(f"\n  and {len(seen) - shown} more", style="dim")
    return t


def group_panel(g: FindingGroup, index: int | None = None) -> Panel:
    """Everything about one root cause in one bordered block: a lone finding reads as before, a
    group adds the tensors it covers and shows the first finding's accesses and stacks."""
    f = g.first
    parts: list[RenderableType] = [rule_title(f) if len(g.tensors) == 1 else
                                   Text(f"{f.title} on {len(g.tensors)} tensors", style="italic"),
                                   access_table(f)]
    notes = notes_text(f)
    if notes is not None:
        parts.append(notes)
    if len(g.findings) > 1:
        parts.append(tensors_text(g))
    parts.append(stack_text("current", f.current))
    parts.append(stack_text("previous", f.previous))
    parts.append(suggestion_text(f, g.suggestion))
    title = group_heading(g)
    if index is not None:
        title = Text(f"#{index} ").append_text(title)
    sub = f.fingerprint() if len(g.findings) == 1 else f"group {g.id}"
    return Panel(Group(*parts), title=title, title_align="left", border_style="red",
                 subtitle=Text(sub, style="dim"), subtitle_align="right")


def summary_line(n: int, suppressed: int = 0, baselined: int = 0, groups: int | None = None) -> Text:
    """"3 races, 16 findings": races are root-cause groups (one fix each)."""
    if n == 0:
        t = Text("no races found", style="bold green")
    else:
        g = n if groups is None else groups
        t = Text(f"{g} race{'s' if g != 1 else ''}, {n} finding{'s' if n != 1 else ''}",
                 style="bold red")
    extra = []
    if suppressed:
        extra.append(f"{suppressed} suppressed")
    if baselined:
        extra.append(f"{baselined} baselined")
    if extra:
        t.append(f" ({', '.join(extra)})", style="dim")
    return t


def findings_renderable(findings: Iterable[Finding], *, title: str | None = None,
                        suppressed: int = 0, baselined: int = 0) -> Group:
    findings = list(findings)
    groups = group_findings(findings)
    parts: list[RenderableType] = []
    if title:
        parts.append(Text(title, style="bold"))
    parts.extend(group_panel(g, i + 1 if len(groups) > 1 else None) for i, g in enumerate(groups))
    parts.append(summary_line(len(findings), suppressed, baselined, len(groups)))
    return Group(*parts)


def print_findings(findings, console: Console | None = None, *, title: str | None = None,
                   suppressed: int = 0, baselined: int = 0) -> None:
    """Print each finding as a panel, then "N findings" / "no races found"."""
    console = console or Console(highlight=False)
    console.print(findings_renderable(findings, title=title, suppressed=suppressed, baselined=baselined))


def render_text(findings, *, title: str | None = None, width: int = 110, color: bool = False) -> str:
    """The console report as a string (pytest failure text, the console report file)."""
    import io
    buf = io.StringIO()
    con = Console(file=buf, width=width, force_terminal=color, color_system="standard" if color else None,
                  highlight=False, soft_wrap=False)
    print_findings(findings, con, title=title)
    return buf.getvalue()


def plain_text(findings) -> str:
    """Box-free text of the findings, one block per root-cause group (JUnit failure bodies, logs
    that mangle box drawing)."""
    findings = list(findings)
    groups = group_findings(findings)
    out = []
    for g in groups:
        f = g.first
        tensors = g.tensors
        on = f"`{f.tensor}`" if len(tensors) == 1 else f"{len(tensors)} tensors"
        ident = f.fingerprint() if len(g.findings) == 1 else f"group {g.id}"
        out.append(f"{'+'.join(g.rules)} {'/'.join(rules.get(r).name for r in g.rules)} on {on} "
                   f"[{ident}]")
        out.append(f"  {f.title}")
        for label, a in (("current", f.current), ("previous", f.previous)):
            out.append(f"  {label}: {a.describe()}")
            for fr in list(a.stack)[:STACK_DEPTH]:
                out.append(f"      {fr}")
        if f.detail:
            out.append(f"  detail: {f.detail}")
        if f.approx:
            out.append(f"  approx: {f.approx}")
        if len(g.findings) > 1:
            out.append(f"  tensors ({len(tensors)}):")
            for x in g.findings:
                out.append(f"    {x.tensor}: {x.where or x.rule} [{x.fingerprint()}]")
        out.append(f"  fix: {g.suggestion}")
        if f.missing_edge and len(f.missing_edge) == 2:
            out.append(f"  missing edge: {f.missing_edge[0]} -> {f.missing_edge[1]}")
        out.append("")
    n = len(findings)
    out.append(summary_line(n, groups=len(groups)).plain)
    return "\n".join(out) + "\n"
