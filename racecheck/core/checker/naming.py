"""Names: what the program calls a tensor or a timeline, and how a finding describes bytes
and stacks (asked only when a finding is made)."""
from __future__ import annotations

import os

from racecheck.core.checker.state import _Name
from racecheck.core.findings import Place
from racecheck.core.sourcenames import creation_name
from racecheck.core.trace import frame_info

MAX_STACK = 8               # frames shown per access


def _basename(path) -> str:
    return os.path.basename(str(path)) if path else "?"


def _fmt_stack(stack):
    """(location, function, frames) from a tuple of (filename, lineno, function) frames."""
    frames = []
    stack = tuple(frame_info(fr) if len(fr) == 2 else fr for fr in stack)
    for fr in stack[:MAX_STACK]:
        try:
            fn, line, func = fr[0], fr[1], fr[2]
        except (IndexError, TypeError, KeyError):
            frames.append(str(fr))
            continue
        frames.append(f"{_basename(fn)}:{line} in {func}")
    if not stack:
        return "", "", ()
    fr = stack[0]
    try:
        return f"{_basename(fr[0])}:{fr[1]}", str(fr[2]), tuple(frames)
    except (IndexError, TypeError, KeyError):
        return str(fr), "", tuple(frames)


def sourced(place: Place, frame) -> Place:
    """`place` (an unnamed storage's) named by the statement that created it, when `frame`'s
    source says; what `Names._describe` gives with the source read at once."""
    made = creation_name(frame) if frame is not None and not place.named else None
    if not made:
        return place
    return Place(made, place.storage, "bytes", place.byte_spans, place.byte_spans, True)


def _span_text(a: int, b: int) -> str:
    return f"{a}" if a == b else f"{a}..{b}"


class Names:
    """Named ranges and timelines, first-use sites of unnamed storages, and the `Place` of bytes."""

    def _on_name_tensor(self, ev, seq):
        self._host(ev.thread)
        lst = self._names.get(ev.storage)
        if lst is None:
            lst = self._names[ev.storage] = []
        self._name_order += 1
        entry = _Name(ev.lo, ev.hi, ev.name, ev.row_bytes or 0, ev.itemsize or 1, self._name_order)
        for i, e in enumerate(lst):
            if e.lo == ev.lo and e.hi == ev.hi:
                lst[i] = entry
                break
        else:
            lst.append(entry)

    def _on_name_timeline(self, ev, seq):
        self._host(ev.thread)
        tl = self._tl.get(ev.timeline)
        if tl is None:
            tl = self._new_host(ev.timeline) if ev.is_host else self._new_stream(ev.timeline)
        tl.name = ev.name
        if ev.device is not None:
            tl.device = ev.device

    def _assign_sites(self, event) -> None:
        """Unnamed storages are described by the first op that touched them (stable across runs)."""
        site = (event.op, event.stack[:1])  # formatted only if a finding needs it
        for b in self._unsited:
            self._sites[b] = site
        self._unsited.clear()

    def _name_for(self, storage, lo, hi):
        """The most specific (smallest, then latest) named range overlapping [lo, hi)."""
        best = None
        for e in self._names.get(storage, ()):
            if e.lo < hi and lo < e.hi:
                if best is None or (e.hi - e.lo, -e.order) < (best.hi - best.lo, -best.order):
                    best = e
        return best

    def _units(self, ranges, nm, storage) -> str:
        parts = []
        for lo, hi in ranges:
            if nm is not None:
                a, b = max(lo, nm.lo), min(hi, nm.hi)
                if a >= b:
                    a, b = lo, hi
                size = nm.row_bytes or nm.itemsize or 1
                parts.append(_span_text((a - nm.lo) // size, (b - 1 - nm.lo) // size))
            else:
                parts.append(_span_text(lo, hi - 1))
        return ", ".join(parts)

    def _site_frame(self, storage):
        """The innermost frame of the first op that touched an unnamed storage, or None."""
        site = self._sites.get(storage)
        return site[1][0] if site is not None and site[1] else None

    def _describe(self, storage, ranges, ask=True, source=True):
        """(Place of the ranges, name entry or None); `ask=False` looks for no name (neither the
        namer nor the creating statement's source: a finding its caller sets apart by rule and
        code site, whose name nobody reads); `source=False` leaves the creating statement's
        source unread (the caller reads it if the place ever reaches a finding:
        `_site_frame`, `sourced`)."""
        lo, hi = ranges[0][0], ranges[-1][1]
        nm = self._name_for(storage, lo, hi)
        byte_text = ", ".join(_span_text(a, b - 1) for a, b in ranges)
        if nm is None and ask and self.namer is not None:
            held = self.namer(storage, lo, hi)
            if held:
                return Place(held, storage, "bytes", byte_text, byte_text, True), None
        if nm is None:
            site = self._sites.get(storage)
            if site is not None:
                op, top = site
                loc = _fmt_stack(top)[0] if top else ""
                tensor = f"unnamed tensor (first used by {op}{' at ' + loc if loc else ''}; bytes {lo}..{hi - 1})"
            else:
                tensor = f"unnamed tensor (bytes {lo}..{hi - 1})"
            place = Place(tensor, storage, "bytes", byte_text, byte_text, False)
            return (sourced(place, self._site_frame(storage)) if ask and source else place), None
        unit = "rows" if nm.row_bytes else "elements"
        return Place(nm.name, storage, unit, self._units(ranges, nm, storage), byte_text, True), nm
