"""Synchronization: event records, stream waits, host syncs, and no-op waits (RC008)."""
from __future__ import annotations

from racecheck.core.checker.naming import _fmt_stack
from racecheck.core.checker.state import CLOCK, SEQ, TL, _Ctx, _ctx_seq, _new, _NoopWait, _Recorded
from racecheck.core.checker.timelines import _join_launch
from racecheck.core.clocks import join
from racecheck.core.findings import Access, Race, describe

NOOP_WAITS_KEPT = 64        # no-op waits remembered per timeline (for RC008)


class Sync:
    """The edges between timelines, and the waits that made none (remembered for RC008)."""

    def _on_record(self, ev, seq):
        s = self._launch(ev)
        self._records[ev.event] = _new(_Recorded, (s.tid, dict(s.vc), seq, ev.stack))
        s.ctx.append(_new(_Ctx, (seq, "record", f"record event #{ev.event}", None, -1)))

    def _remember_noop(self, tl, event, seq, stack, host):
        noop = tl.noop
        if noop is None:
            noop = tl.noop = {}
        noop.pop(event, None)
        noop[event] = _NoopWait(seq, stack, host)
        if len(noop) > NOOP_WAITS_KEPT:
            del noop[next(iter(noop))]

    def _on_wait_event(self, ev, seq):
        s = self._launch(ev)
        r = self._records.get(ev.event)
        if r is None:
            self._remember_noop(s, ev.event, seq, ev.stack, False)
            s.ctx.append(_new(_Ctx, (seq, "wait", f"wait_event #{ev.event} (no-op: never recorded)", None, -1)))
            return
        join(s.vc, r.vc)
        s.ctx.append(_new(_Ctx, (seq, "wait", f"wait_event #{ev.event}", r.tl, r.seq)))

    def _on_wait_stream(self, ev, seq):
        h = self._host(ev.thread)
        s = self._stream(ev.waiter)
        if s.jh is not h or s.jv != h.ver:
            _join_launch(s, h)
        t = self._stream(ev.waitee)
        if t is not s:
            join(s.vc, t.vc)
        edge = _ctx_seq(t.ctx[-1]) if t.ctx else -1
        s.ctx.append(_new(_Ctx, (seq, "wait", "wait_stream", t.tid, edge)))

    def _on_host_sync(self, ev, seq):
        h = self._host(ev.thread)
        kind, target = ev.sync_kind, ev.target
        if kind == "stream":
            s = self._tl.get(target)
            if s is not None and s is not h:
                join(h.vc, s.vc)
                h.ctx.append(_new(_Ctx, (seq, "sync", "stream synchronize", s.tid,
                                         _ctx_seq(s.ctx[-1]) if s.ctx else -1)))
        elif kind == "event":
            r = self._records.get(target)
            if r is None:
                self._remember_noop(h, target, seq, ev.stack, True)
                h.ctx.append(_new(_Ctx, (seq, "sync", f"event #{target} synchronize (no-op: "
                                         f"never recorded)", None, -1)))
            else:
                join(h.vc, r.vc)
                h.ctx.append(_new(_Ctx, (seq, "sync", f"event #{target} synchronize", r.tl, r.seq)))
        elif kind == "device":
            for s in self._streams:
                if target is None or s.device is None or s.device == target:
                    join(h.vc, s.vc)
            h.ctx.append(_new(_Ctx, (seq, "sync", "device synchronize", None, -1)))
        h.ver += 1

    def _check_rc008(self, prev, cur, race):
        """No-op waits on the racing current side that were meant to order the pair: on an event
        recorded only later (after the previous access), or on one never recorded at all (a
        fresh Event, a stale handle) waited on after the previous access was issued."""
        b = self._tl.get(cur[TL])
        if b is None or not b.noop:
            return
        a_tid = prev[TL]
        for event, (wseq, wstack, host) in list(b.noop.items()):    # _NoopWait
            r = self._records.get(event)
            if r is None:
                if wseq > prev[SEQ]:
                    self._report_rc008(prev, cur, race, event, wseq, wstack, host, None)
            elif r.tl == a_tid and r.vc.get(a_tid, 0) >= prev[CLOCK]:
                self._report_rc008(prev, cur, race, event, wseq, wstack, host, r)

    def _report_rc008(self, prev, cur, race, event, wseq, wstack, host, r):
        b_tid = cur[TL]
        wloc, wfn, wframes = _fmt_stack(wstack)
        wait = Access(op="event.synchronize" if host else "wait_event",
                      stream=self.timeline_name(b_tid), kind="wait", location=wloc, function=wfn,
                      stack=wframes, seq=wseq)
        ctx = self._context((prev[TL], b_tid), min(wseq, prev[SEQ]), cur[SEQ])
        if r is not None:
            rloc, rfn, rframes = _fmt_stack(r.stack)
            record = Access(op="record", stream=self.timeline_name(r.tl), kind="record",
                            location=rloc, function=rfn, stack=rframes, seq=r.seq)
            noop = Race("RC008", race.place, wait, record, context=ctx, event=event,
                        host_wait=host, related=race.rule)
        else:
            noop = Race("RC008", race.place, wait, race.previous, context=ctx, event=event,
                        host_wait=host, related=race.rule, never_recorded=True,
                        instead=self._recorded_instead(prev, wseq))
        self.finding_set.add(describe(noop))

    def _recorded_instead(self, prev, before):
        """The first event recorded on prev's stream after it (and before `before`), if any."""
        a_tid, clock = prev[TL], prev[CLOCK]
        best = None
        for event, r in self._records.items():
            if r.tl == a_tid and r.vc.get(a_tid, 0) >= clock and r.seq < before:
                if best is None or r.seq < best[1]:
                    best = (event, r.seq)
        return best[0] if best is not None else None
