"""Console report: one rich panel per finding, built from small renderables.

Why small pieces: the pytest plugin, `racecheck run` and `racecheck report` each compose these
(the plugin needs plain text for a test failure, the CLI a colored terminal).
"""
from __future__ import annotations

from typing import Iterable

from rich.console import Console, Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from racecheck import rules
from racecheck.findings import Access, Finding

STACK_DEPTH = 4  # frames per access: enough to see the caller chain, short enough to scan


def rule_heading(f: Finding) -> Text:
    """`RC001 read-after-write on mrope_positions`: short enough for a panel title."""
    short = rules.get(f.rule).name
    t = Text()
    t.append(f.rule, style="bold red")
    t.append(f" {short}", style="bold")
    t.append(" on ")
    t.append(f.tensor or "?", style="bold cyan")
    return t


def rule_title(f: Finding) -> Text:
    """The rule's full sentence, first line of the panel body."""
    return Text(f"{f.title} on `{f.tensor}`", style="italic")


def access_table(f: Finding) -> Table:
    """The two accesses side by side: what, where and on which stream."""
    table = Table(show_header=True, header_style="bold", box=None, pad_edge=False, expand=False)
    table.add_column("", style="dim", no_wrap=True)
    table.add_column("kind", no_wrap=True)
    table.add_column("op", overflow="fold")
    table.add_column("stream", style="magenta", overflow="fold")
    table.add_column("location", style="green", overflow="fold")
    for label, a in (("current", f.current), ("previous", f.previous)):
        where = a.location or "?"
        if a.function:
            where += f" in {a.function}"
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


def suggestion_text(f: Finding) -> Text:
    t = Text("fix: ", style="bold green")
    t.append(f.suggestion or "(no suggestion)")
    if f.missing_edge and len(f.missing_edge) == 2:
        t.append(f"\nmissing edge: {f.missing_edge[0]} → {f.missing_edge[1]}", style="dim")
    return t


def finding_panel(f: Finding, index: int | None = None) -> Panel:
    """Everything about one finding in one bordered block."""
    parts: list[RenderableType] = [rule_title(f), access_table(f)]
    notes = notes_text(f)
    if notes is not None:
        parts.append(notes)
    parts.append(stack_text("current", f.current))
    parts.append(stack_text("previous", f.previous))
    parts.append(suggestion_text(f))
    title = rule_heading(f)
    if index is not None:
        title = Text(f"#{index} ").append_text(title)
    return Panel(Group(*parts), title=title, title_align="left", border_style="red",
                 subtitle=Text(f.fingerprint(), style="dim"), subtitle_align="right")


def summary_line(n: int, suppressed: int = 0, baselined: int = 0) -> Text:
    if n == 0:
        t = Text("no races found", style="bold green")
    else:
        t = Text(f"{n} finding{'s' if n != 1 else ''}", style="bold red")
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
    parts: list[RenderableType] = []
    if title:
        parts.append(Text(title, style="bold"))
    parts.extend(finding_panel(f, i + 1 if len(findings) > 1 else None) for i, f in enumerate(findings))
    parts.append(summary_line(len(findings), suppressed, baselined))
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
    """Box-free text of the findings (JUnit failure bodies, logs that mangle box drawing)."""
    findings = list(findings)
    out = []
    for f in findings:
        out.append(f"{f.rule} {rules.get(f.rule).name} on `{f.tensor}` [{f.fingerprint()}]")
        out.append(f"  {f.title}")
        for label, a in (("current", f.current), ("previous", f.previous)):
            out.append(f"  {label}: {a.describe()}")
            for fr in list(a.stack)[:STACK_DEPTH]:
                out.append(f"      {fr}")
        if f.detail:
            out.append(f"  detail: {f.detail}")
        if f.approx:
            out.append(f"  approx: {f.approx}")
        out.append(f"  fix: {f.suggestion}")
        if f.missing_edge and len(f.missing_edge) == 2:
            out.append(f"  missing edge: {f.missing_edge[0]} -> {f.missing_edge[1]}")
        out.append("")
    n = len(findings)
    out.append(f"{n} finding{'s' if n != 1 else ''}" if n else "no races found")
    return "\n".join(out) + "\n"
