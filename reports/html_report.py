"""Self-contained HTML report: a summary table, then per finding an inline-SVG stream timeline,
the findings of one root-cause group side by side (each carries its group id).

One file, no external assets (it is uploaded as a CI artifact and opened offline). In each picture
every stream is a lane, ops are boxes in issue order, record->wait edges are grey arrows, the two
racing accesses are highlighted (current: red, previous: orange) and the missing edge is dashed.
"""
from __future__ import annotations

import datetime as _dt
from html import escape

from racecheck.core.findings import Finding, group_findings

from ._common import case_name, rule_name
from .json_report import tool_info
from .timeline import Timeline, build

CURRENT_COLOR = "#e6194b"
PREVIOUS_COLOR = "#f58231"
EDGE_COLOR = "#5a6270"
LANE_H, BOX_W, BOX_H, GAP, LABEL_W, TOP = 62, 116, 34, 16, 140, 34

CSS = """
:root { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; color: #1d2330; }
body { margin: 24px auto; max-width: 1400px; padding: 0 16px; }
h1 { font-size: 22px; margin: 0 0 4px; } h2 { font-size: 18px; margin: 28px 0 6px; }
.meta, .muted { color: #667085; font-size: 13px; }
.status { font-size: 14px; margin: 10px 0; font-weight: 600; }
.clean { color: #0a7a36; } .dirty { color: #b42318; }
table.summary, table.acc { border-collapse: collapse; font-size: 13px; margin: 8px 0; }
table.summary th, table.summary td, table.acc th, table.acc td { border: 1px solid #d0d5dd; padding: 4px 8px; text-align: left; vertical-align: top; }
table.summary th, table.acc th { background: #f2f4f7; }
code, pre { font-family: ui-monospace, SFMono-Regular, Menlo, monospace; font-size: 12px; }
pre.stack { background: #f8f9fb; border: 1px solid #e4e7ec; padding: 8px; margin: 4px 0 10px; overflow-x: auto; }
section.finding { border-top: 2px solid #e4e7ec; padding-top: 4px; }
.rule { font-weight: 700; color: #b42318; }
.fix { background: #ecfdf3; border-left: 4px solid #12b76a; padding: 6px 10px; margin: 8px 0; font-size: 14px; }
.note { font-size: 13px; margin: 4px 0; }
.timeline { overflow-x: auto; border: 1px solid #e4e7ec; background: #fff; margin: 8px 0; }
svg text { font-family: ui-monospace, SFMono-Regular, Menlo, monospace; font-size: 11px; }
svg .lane-label { font-weight: 700; font-size: 12px; }
svg .op-label { pointer-events: none; }
svg .race-label { font-weight: 700; font-size: 10px; }
"""

JS = """
(function () {
  var lanes = document.querySelectorAll('svg.timeline-svg g.lane').length;
  var pairs = document.querySelectorAll('svg.timeline-svg rect.race').length / 2;
  var n = document.querySelectorAll('section.finding').length;
  var el = document.getElementById('render-status');
  if (el) { el.textContent = 'rendered ' + n + ' timeline(s), ' + lanes + ' lane(s), ' + pairs + ' racing pair(s)'; }
  document.documentElement.setAttribute('data-rendered', String(n));
  document.querySelectorAll('table.summary tr[data-target]').forEach(function (tr) {
    tr.style.cursor = 'pointer';
    tr.addEventListener('click', function () {
      var t = document.getElementById(tr.getAttribute('data-target'));
      if (t) { t.scrollIntoView({behavior: 'smooth'}); }
    });
  });
})();
"""


def _short(s: str, n: int) -> str:
    return s if len(s) <= n else s[: n - 1] + "…"


def _box_xy(tl: Timeline, seq: int, col: dict) -> tuple[float, float]:
    o = tl.op(seq)
    x = LABEL_W + GAP + col[seq] * (BOX_W + GAP)
    y = TOP + tl.lanes.index(o.lane) * LANE_H + (LANE_H - BOX_H) / 2
    return x, y


def _arrow(x1, y1, x2, y2, cls, color, dashed=False, marker="arrow", title=""):
    """A curved arrow; same-lane arrows bow upward so they don't cross boxes."""
    if abs(y1 - y2) < 1:
        mid = (x1 + x2) / 2
        d = f"M{x1:.1f},{y1:.1f} Q{mid:.1f},{y1 - 40:.1f} {x2:.1f},{y2:.1f}"
    else:
        dy = (y2 - y1) / 2
        d = f"M{x1:.1f},{y1:.1f} C{x1:.1f},{y1 + dy:.1f} {x2:.1f},{y2 - dy:.1f} {x2:.1f},{y2:.1f}"
    dash = ' stroke-dasharray="7 5"' if dashed else ""
    t = f"<title>{escape(title)}</title>" if title else ""
    return (f'<path class="{cls}" d="{d}" fill="none" stroke="{color}" stroke-width="{2.4 if dashed else 1.6}"'
            f'{dash} marker-end="url(#{marker})">{t}</path>')


def _ends(tl, col, a, b):
    """Attachment points: leave from the bottom/top edge toward the other lane, or the top on one lane."""
    ax, ay = _box_xy(tl, a, col)
    bx, by = _box_xy(tl, b, col)
    x1, x2 = ax + BOX_W / 2, bx + BOX_W / 2
    if ay < by:
        return x1, ay + BOX_H, x2 - BOX_W / 5, by
    if ay > by:
        return x1, ay, x2 - BOX_W / 5, by + BOX_H
    return x1 + BOX_W / 4, ay, x2 - BOX_W / 4, by


def timeline_svg(f: Finding, uid: str) -> str:
    """The inline SVG picture of one finding's stream timelines."""
    tl = build(f)
    col = tl.column()
    width = max(760, LABEL_W + GAP + len(tl.ops) * (BOX_W + GAP) + 20)  # room for the fix caption
    height = TOP + len(tl.lanes) * LANE_H + 58
    parts = [
        f'<svg class="timeline-svg" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" style="max-width:100%;height:auto" role="img" '
        f'aria-label="stream timelines for {escape(f.tensor)}">',
        "<defs>",
        f'<marker id="arrow-{uid}" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" '
        f'orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="{EDGE_COLOR}"/></marker>',
        f'<marker id="miss-{uid}" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="8" markerHeight="8" '
        f'orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="{CURRENT_COLOR}"/></marker>',
        "</defs>",
        f'<text x="{LABEL_W + GAP}" y="18" class="muted" fill="#667085">issue order →'
        + (f"  ({tl.hidden} more ops in the context not shown)" if tl.hidden else "") + "</text>",
    ]
    for i, lane in enumerate(tl.lanes):
        y = TOP + i * LANE_H
        fill = "#f7f8fa" if i % 2 == 0 else "#eef1f5"
        racing = lane in f.streams
        parts.append(
            f'<g class="lane" data-lane="{escape(lane)}">'
            f'<rect class="lane-bg" x="0" y="{y}" width="{width}" height="{LANE_H}" fill="{fill}"/>'
            f'<line x1="{LABEL_W}" y1="{y + LANE_H / 2}" x2="{width - 10}" y2="{y + LANE_H / 2}" stroke="#c9ced6" stroke-width="1"/>'
            f'<text class="lane-label" x="10" y="{y + LANE_H / 2 + 4}" fill="{"#1d2330" if racing else "#667085"}">'
            f'{escape(_short(lane, 19))}<title>{escape(lane)}</title></text></g>')
    for o in tl.ops:
        x, y = _box_xy(tl, o.seq, col)
        if o.role == "current":
            fill, stroke, cls, text_fill = CURRENT_COLOR, "#8a0f2b", "op race current", "#ffffff"
        elif o.role == "previous":
            fill, stroke, cls, text_fill = PREVIOUS_COLOR, "#9a4a0b", "op race previous", "#ffffff"
        elif o.kind in ("record", "wait", "sync"):
            fill, stroke, cls, text_fill = "#dde3ea", "#5a6270", f"op sync {o.kind}", "#1d2330"
        else:
            fill, stroke, cls, text_fill = "#ffffff", "#98a2b3", f"op {escape(o.kind)}", "#1d2330"
        tip = f"#{o.seq} {o.lane}: {o.kind} {o.label}" + (f" — {o.role} access" if o.role else "")
        parts.append(
            f'<g class="opg" data-seq="{o.seq}"><rect class="{cls}" x="{x:.1f}" y="{y:.1f}" width="{BOX_W}" '
            f'height="{BOX_H}" rx="5" fill="{fill}" stroke="{stroke}" stroke-width="{2 if o.role else 1}">'
            f'<title>{escape(tip)}</title></rect>'
            f'<text class="op-label" x="{x + 6:.1f}" y="{y + 21:.1f}" fill="{text_fill}">{escape(_short(o.label, 15))}</text>')
        if o.role:
            parts.append(f'<text class="race-label" x="{x + BOX_W:.1f}" y="{y - 3:.1f}" text-anchor="end" '
                         f'fill="{stroke}">{o.role}</text>')
        parts.append("</g>")
    for a, b in tl.edges:
        x1, y1, x2, y2 = _ends(tl, col, a, b)
        parts.append(_arrow(x1, y1, x2, y2, "sync-edge", EDGE_COLOR, marker=f"arrow-{uid}",
                            title=f"{tl.op(a).label} → {tl.op(b).label}"))
    for seq, peer, incoming in tl.stubs:
        x, y = _box_xy(tl, seq, col)
        py = TOP + tl.lanes.index(peer) * LANE_H + LANE_H / 2
        below = py > y
        by = y + BOX_H if below else y
        if incoming:  # from an earlier record on `peer`, off the left of the picture
            x1, y1, x2, y2 = x - GAP - 10, py, x + 12, by
        else:         # to a later wait on `peer`
            x1, y1, x2, y2 = x + BOX_W - 12, by, x + BOX_W + GAP + 10, py
        parts.append(_arrow(x1, y1, x2, y2, "sync-edge stub", EDGE_COLOR, marker=f"arrow-{uid}",
                            title=f"sync edge {'from' if incoming else 'to'} {peer} (other end not shown)"))
    prev_seq, cur_seq = tl.race
    if tl.missing:
        x1, y1, x2, y2 = _ends(tl, col, prev_seq, cur_seq)
        parts.append(_arrow(x1, y1, x2, y2, "missing-edge", CURRENT_COLOR, dashed=True, marker=f"miss-{uid}",
                            title=f"missing edge {tl.missing[0]} → {tl.missing[1]}: {f.suggestion}"))
    else:
        x1, y1, x2, y2 = _ends(tl, col, prev_seq, cur_seq)
        parts.append(_arrow(x1, y1, x2, y2, "race-pair", PREVIOUS_COLOR, dashed=True, marker=f"miss-{uid}",
                            title="the racing pair"))
    ty = TOP + len(tl.lanes) * LANE_H + 22
    caption = (f"missing edge {tl.missing[0]} → {tl.missing[1]}: " if tl.missing else "fix: ") + f.suggestion
    parts.append(f'<text class="fix-label" x="10" y="{ty}" fill="{CURRENT_COLOR}">'
                 f'{escape(_short(caption, max(40, int(width / 7))))}<title>{escape(caption)}</title></text>')
    parts.append("</svg>")
    return "".join(parts)


def _access_rows(f: Finding) -> str:
    rows = []
    for label, a, color in (("current", f.current, CURRENT_COLOR), ("previous", f.previous, PREVIOUS_COLOR)):
        rows.append(
            f'<tr><th><span style="color:{color}">■</span> {label}</th><td>{escape(a.kind)}</td>'
            f"<td><code>{escape(a.op)}</code></td><td>{escape(a.stream)}</td>"
            f"<td><code>{escape(a.location or '?')}</code></td><td><code>{escape(a.function)}</code></td></tr>")
    return ("<table class=\"acc\"><tr><th></th><th>kind</th><th>op</th><th>stream</th><th>location</th>"
            "<th>function</th></tr>" + "".join(rows) + "</table>")


def finding_section(f: Finding, i: int) -> str:
    stacks = "".join(
        f'<div class="muted">{label} stack ({escape(a.stream)})</div>'
        f'<pre class="stack">{escape(chr(10).join(a.stack) or a.location or "(no stack)")}</pre>'
        for label, a in (("current", f.current), ("previous", f.previous)))
    notes = "".join(f'<p class="note"><b>{k}:</b> {escape(v)}</p>'
                    for k, v in (("detail", f.detail), ("approx", f.approx)) if v)
    return (
        f'<section class="finding" id="finding-{i}" data-rule="{escape(f.rule)}" '
        f'data-fingerprint="{f.fingerprint()}" data-group="{f.group_id()}">'
        f'<h2>#{i} <span class="rule">{escape(f.rule)}</span> {escape(rule_name(f.rule))} on '
        f"<code>{escape(f.tensor)}</code></h2>"
        f'<div class="muted">{escape(f.title)} · fingerprint <code>{f.fingerprint()}</code>'
        f' · group <code>{f.group_id()}</code></div>'
        f'<div class="timeline">{timeline_svg(f, str(i))}</div>'
        f"{_access_rows(f)}{notes}"
        f'<div class="fix"><b>Fix:</b> {escape(f.suggestion)}</div>'
        f"{stacks}</section>")


def summary_table(findings) -> str:
    if not findings:
        return ""
    rows = "".join(
        f'<tr data-target="finding-{i}"><td><a href="#finding-{i}">#{i}</a></td><td class="rule">{escape(f.rule)}</td>'
        f"<td><code>{escape(f.tensor)}</code></td><td>{escape(f.current.stream)} ← {escape(f.previous.stream)}</td>"
        f"<td><code>{escape(f.current.location or '?')}</code></td><td><code>{escape(f.previous.location or '?')}</code></td>"
        f"<td><code>{f.fingerprint()}</code></td><td><code>{f.group_id()}</code></td></tr>"
        for i, f in enumerate(findings, 1))
    return ('<table class="summary"><tr><th>#</th><th>rule</th><th>tensor</th><th>streams (current ← previous)</th>'
            "<th>current</th><th>previous</th><th>fingerprint</th><th>group</th></tr>" + rows + "</table>")


def render(findings, meta: dict | None = None) -> str:
    groups = group_findings(findings)
    findings = [f for g in groups for f in g.findings]      # a group's findings side by side
    meta = dict(meta or {})
    title = meta.get("title") or (f"racecheck: {case_name(meta)}" if meta.get("scenario") else "racecheck report")
    n = len(findings)
    counts = []
    for key in ("suppressed", "baselined"):
        v = meta.get(key)
        if v:
            counts.append(f"{v if isinstance(v, int) else len(v)} {key}")
    races = f"{len(groups)} race{'s' if len(groups) != 1 else ''}, {n} finding{'s' if n != 1 else ''}"
    status_cls, status = ("dirty", races) if n else ("clean", "no races found")
    if counts:
        status += f" ({', '.join(counts)})"
    info = tool_info()
    meta_bits = [f"{k}: {escape(str(meta[k]))}" for k in ("scenario", "variant", "device", "seed") if meta.get(k) not in (None, "")]
    meta_bits.append(f"racecheck {escape(info['version'])}")
    meta_bits.append(escape(meta.get("created") or _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")))
    stale = meta.get("stale_suppressions") or ()
    stale_html = ("<p class=\"note\"><b>stale suppressions (matched nothing):</b></p><ul>" +
                  "".join(f"<li><code>{escape(str(s))}</code></li>" for s in stale) + "</ul>") if stale else ""
    body = "".join(finding_section(f, i) for i, f in enumerate(findings, 1))
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        f"<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\"><title>{escape(title)}</title>"
        f"<style>{CSS}</style></head><body>"
        f"<h1>{escape(title)}</h1><div class=\"meta\">{' · '.join(meta_bits)}</div>"
        f'<div class="status {status_cls}" id="summary-status">{escape(status)}</div>'
        f'<div class="muted" id="render-status"></div>'
        f"{summary_table(findings)}{stale_html}{body}"
        f"<script>{JS}</script></body></html>\n")
