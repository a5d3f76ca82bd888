"""The allocator: allocations, frees, record_stream, and RC005 hazards (a block freed while
another stream's access is unordered, judged when the block could first be reused)."""
from __future__ import annotations

from dataclasses import replace

from racecheck.core.checker.naming import _fmt_stack, sourced
from racecheck.core.checker.state import CLOCK, HOST, SEQ, TL, _CtxFree, _new, _OpenFree
from racecheck.core.findings import Access, Race, describe
from racecheck.core.shadow import iv_add


def _only_on(sh, tid) -> bool:
    """Every access in the shadow was made on timeline `tid` (a temporary that never left its
    allocation stream: freeing it cannot be RC005, no need for the full scan)."""
    for st in sh.states:
        if st is None:
            continue
        w = st[0]
        if w is not None and w[TL] != tid:
            return False
        for t in st[1]:
            if t != tid:
                return False
    return True


class Memory:
    """Blocks' lives: which stream allocated them, who used them, when they went back."""

    def _on_alloc(self, ev, seq):
        tls = self._tl
        if ev.thread not in tls:
            self._new_host(ev.thread)
        stream = ev.stream
        if stream is not None and stream not in tls:
            self._new_stream(stream)
        blk = ev.block
        self._allocs[blk] = (stream, bool(ev.host))
        self._unsited.append(blk)
        self._shadow.pop(blk, None)
        if self._recstreams:
            self._recstreams.pop(blk, None)

    def _on_record_stream(self, ev, seq):
        self._host(ev.thread)
        self._recstreams.setdefault(ev.block, set()).add(ev.stream)

    def _on_free(self, ev, seq):
        h = self._tl.get(ev.thread)
        if h is None:
            h = self._new_host(ev.thread)
        blk = ev.block
        h.ctx.append(_new(_CtxFree, (seq, blk)))
        stream, host = self._allocs.pop(blk, None) or (None, True)
        if self._stale_open:
            self._settle_stale_indices(blk)
        sh = self._shadow.pop(blk, None)
        rs = (self._recstreams.pop(blk, None) or ()) if self._recstreams else ()
        if sh is not None and not host and stream is not None and not _only_on(sh, stream):
            self._check_rc005(ev, seq, h, blk, stream, sh, rs)
        if self._names:
            self._names.pop(blk, None)
        if self._tolerant:
            self._tolerant.pop(blk, None)
        self._sites.pop(blk, None)
        if self._readers:
            for _g, inp in self._readers.get(blk, ()):
                inp.ever = []
                inp.fresh = []

    def _open_free(self, a, hazard):
        if a.frees is None:
            a.frees = []
        a.frees.append(hazard)
        self._frees_open.append((a, hazard))

    def _settle_frees(self, a, ev):
        """The allocation stream `a` issues work that may reuse its freed blocks: every hazard
        it is still unordered with becomes a finding; the others closed when `a` caught up."""
        vc = a.vc
        for hz in a.frees:
            if hz.clock > vc.get(hz.tid, 0):
                loc = _fmt_stack(ev.stack)[0] if ev.stack else ""
                what = getattr(ev, "op", None) or f"replay of graph {getattr(ev, 'graph', '?')}"
                self.finding_set.add(describe(replace(_due(hz), reuse=(what, loc))))
        a.frees = None
        self._frees_open = [(b, hz) for b, hz in self._frees_open if b is not a]

    def _still_open(self):
        """Findings of hazards open at the end of the trace so far (the next allocation on the
        stream would reuse the block), unless the stream or the freeing host caught up."""
        tls = self._tl
        for a, hz in self._frees_open:
            if hz.clock <= a.vc.get(hz.tid, 0):
                continue
            h = tls.get(hz.host)
            if h is not None and hz.clock <= h.vc.get(hz.tid, 0):
                continue
            yield describe(replace(_due(hz), trace_end=True))

    def _check_rc005(self, ev, seq, h, blk, a_tid, sh, rs):
        a = self._tl.get(a_tid)
        avc = a.vc if a is not None else {}
        hvc = h.vc
        tls = self._tl
        items = []      # (record, kind, lo, hi): accesses the free is unordered with, in shadow order
        for lo, hi, st in sh.segments():
            recs = [(st[0], "write")] if st[0] is not None else []
            recs.extend((r, "read") for r in st[1].values())
            for rec, kind in recs:
                t = rec[TL]
                if t == a_tid or rec[HOST] or t in rs:
                    continue
                tl = tls.get(t)
                if tl is None or tl.is_host:
                    continue
                c = rec[CLOCK]
                if c <= hvc.get(t, 0) or c <= avc.get(t, 0):
                    continue
                items.append((rec, kind, lo, hi))
        for hazard in self._rc005_hazards(ev, seq, h.tid, blk, a_tid, items):
            self._open_free(a, hazard)

    def _rc005_hazards(self, ev, seq, h_tid, blk, a_tid, items) -> list:
        """The hazards a free opens: per timeline, its latest unordered access and the bytes.
        (The C engine calls this too, on a checker holding its timelines, to keep going.)"""
        found = {}    # T -> (latest rec, kind, ranges)
        for rec, kind, lo, hi in items:
            t = rec[TL]
            ent = found.get(t)
            if ent is None:
                found[t] = (rec, kind, [(lo, hi)])
            else:
                latest, lkind, ranges = ent
                if rec[SEQ] > latest[SEQ]:
                    latest, lkind = rec, kind
                found[t] = (latest, lkind, iv_add(ranges, lo, hi))
        out = []
        for t, (rec, kind, ranges) in sorted(found.items(), key=lambda x: x[1][0][SEQ]):
            place, _nm = self._describe(blk, ranges, source=False)
            loc, fn, frames = _fmt_stack(ev.stack)
            free = Access(op="free", stream=self.timeline_name(a_tid), kind="free", location=loc,
                          function=fn, stack=frames, seq=seq)
            race = Race("RC005", place, free, self._access(rec, kind),
                        context=self._context((t, a_tid, h_tid), rec[SEQ], seq),
                        approx=self._approx(rec, blk) or "", freer=self.timeline_name(h_tid))
            out.append(_OpenFree(t, rec[CLOCK], h_tid, race,
                                 None if place.named else self._site_frame(blk)))
        return out


def _due(hz):
    """A hazard's race as a finding: most hazards close unreported, so the creating statement's
    source is read only here."""
    if hz.source is None:
        return hz.race
    return replace(hz.race, place=sourced(hz.race.place, hz.source))
