"""Races noted during an event, flushed into findings once per event, with their accesses and
the context around them."""
from __future__ import annotations

from racecheck.core.checker.naming import MAX_STACK, _fmt_stack
from racecheck.core.checker.state import (EV, GRAPH, HOST, SEQ, SUB, TL, _Ctx, _ctx_entry, _ctx_seq,
                                          _new, _Noted)
from racecheck.core.findings import Access, ContextEvent, Race, describe
from racecheck.core.shadow import iv_normalize

CONTEXT_CAP = 40
CONTEXT_BEFORE = 3          # events per timeline shown before the earlier access


def _site(rec):
    """Cheap identity of the code that made an access (for quick dedup of repeated races)."""
    ev = rec[EV]
    sub = rec[SUB]
    first = ev.stack[0] if ev.stack else getattr(ev, "op", type(ev).__name__)
    if sub is None:
        return first
    return (first, sub.op, sub.stack[0] if sub.stack else None)


class Reporting:
    """Noting a race is cheap (a dedup key per segment); building its finding waits for the
    end of the event, when every segment it covers is known."""

    def _race(self, prev, cur, pw, cw, fp, sh, lo, hi):
        """An unordered conflicting pair on [lo, hi) of sh's storage: note it for this event."""
        if prev[HOST]:
            if cur[HOST]:
                return                      # host vs host: not our business
            rule = "RC004"
        elif cur[HOST]:
            rule = "RC004"
        elif not cw:
            rule = "RC001"
        elif pw:
            rule = "RC003"
        else:
            rule = "RC002"
        self._note(rule, (id(prev), sh.storage), prev, cur, pw, cw, fp, sh, lo, hi)

    def _note(self, rule, key, prev, cur, pw, cw, fp, sh, lo, hi):
        pend = self._pend
        ent = pend.get(key)
        if ent is not None and ent.rule != rule:
            # the same previous access already races with this op under another rule (an
            # in-place op reads then writes): report the first rule only
            return
        tl = self._tl.get(cur[TL])
        qk = (rule, lo, hi, _site(cur), _site(prev), len(self._names.get(sh.storage, ())),
              len(tl.noop) if tl is not None and tl.noop else 0)
        seen = sh.seen
        if seen is None:
            seen = sh.seen = set()
        new = qk not in seen
        if new:
            seen.add(qk)
        if ent is None:
            pend[key] = _new(_Noted, (rule, prev, cur, pw, cw, fp, [(lo, hi)] if new else [], sh))
        elif new:
            ent.segs.append((lo, hi))

    def _flush(self):
        pend = self._pend
        self._pend = {}
        made = []           # (entry, current Access, previous Access, ask the namer)
        settled = self.settled
        for e in pend.values():
            if not e.segs:
                continue
            if e.rule == "RC007":
                made.append((e, None, None, True))
                continue
            cur = self._access(e.cur, "write" if e.cw else "read")
            prev = self._access(e.prev, "write" if e.pw else "read")
            made.append((e, cur, prev, settled is None or not settled(e.rule, cur, prev)))
        prefetch = getattr(self.namer, "prefetch", None)
        if prefetch is not None and made:
            # the program's names for this event's unnamed storages, found in one pass
            need = [e.sh.storage for e, _c, _p, ask in made
                    if ask and not self._names.get(e.sh.storage)]
            if need:
                prefetch(need)
        for e, cur, prev, ask in made:
            # group the racing segments by tensor name (a pool storage can hold several)
            groups = {}
            for lo, hi in e.segs:
                nm = self._name_for(e.sh.storage, lo, hi)
                k = nm.order if nm is not None else None
                groups.setdefault(k, []).append((lo, hi))
            for ranges in groups.values():
                ranges = iv_normalize(ranges)
                if e.rule == "RC007":
                    self._report_rc007(e.prev, e.cur, e.fp, e.sh.storage, ranges)
                else:
                    self._report_race(e.rule, e.prev, e.cur, cur, prev, e.fp, e.sh.storage,
                                      ranges, ask)

    def _report_race(self, rule, prev, cur, cur_access, prev_access, fp, storage, ranges,
                     ask=True):
        place, _nm = self._describe(storage, ranges, ask)
        race = Race(rule, place, cur_access, prev_access,
                    context=self._context((prev[TL], cur[TL]), prev[SEQ], cur[SEQ]),
                    approx=fp.approx or self._approx(prev, storage) or "", host_current=cur[HOST])
        self.finding_set.add(describe(race))
        self._check_rc008(prev, cur, race)

    def _access(self, rec, kind) -> Access:
        ev = rec[EV]
        sub = rec[SUB]
        if sub is not None:
            op = f"{sub.op} (replay of graph {rec[GRAPH]})"
            outer, inner = tuple(ev.stack or ()), tuple(sub.stack or ())
            if len(outer) + len(inner) > MAX_STACK:      # keep some of both
                keep = min(len(inner), MAX_STACK // 2)
                outer, inner = outer[:MAX_STACK - keep], inner[:keep]
            stack = outer + inner
        else:
            op = getattr(ev, "op", "") or type(ev).kind
            stack = ev.stack or ()
        loc, fn, frames = _fmt_stack(stack)
        return Access(op=op, stream=self.timeline_name(rec[TL]), kind=kind, location=loc,
                      function=fn, stack=frames, seq=rec[SEQ])

    @staticmethod
    def _fp_approx_in(obj, storage):
        fps = []
        for f in ("reads", "writes"):
            fps.extend(getattr(obj, f, None) or ())
        for f in ("src", "dst"):
            v = getattr(obj, f, None)
            if v is not None:
                fps.append(v)
        for fp in fps:
            if fp.storage == storage and fp.approx:
                return fp.approx
        return None

    def _approx(self, rec, storage):
        sub = rec[SUB]
        return self._fp_approx_in(sub if sub is not None else rec[EV], storage)

    def _context(self, tids, start_seq, end_seq) -> tuple:
        """Recent events on the involved timelines (and sync edges into them), oldest first."""
        order = []
        for t in tids:
            if t not in order:
                order.append(t)
        tset = set(order)
        items = []          # (seq, raw context entry, timeline): entries made readable at the end
        for t in order:
            tl = self._tl.get(t)
            if tl is None:
                continue
            before = []
            for e in tl.ctx:
                s = _ctx_seq(e)
                if s > end_seq:
                    break
                if s < start_seq:
                    before.append((s, e, t))
                else:
                    items.append((s, e, t))
            items.extend(before[-CONTEXT_BEFORE:])
        for tl in self._tl.values():
            if tl.tid in tset:
                continue
            for e in tl.ctx:
                if type(e) is not _Ctx:
                    continue            # a kernel or a free: no peer
                if start_seq <= e.seq <= end_seq and e.peer in tset:
                    items.append((e.seq, e, tl.tid))
        items.sort(key=lambda x: x[0])
        if len(items) > CONTEXT_CAP:
            pre = [x for x in items if x[0] < start_seq]
            mid = [x for x in items if x[0] >= start_seq]
            room = CONTEXT_CAP - len(pre)
            if len(mid) > room:
                head = room // 3
                mid = mid[:head] + mid[len(mid) - (room - head):]
            items = pre + mid
        items = [(_ctx_entry(e), t) for _s, e, t in items]
        name = self.timeline_name
        return tuple(ContextEvent(seq=e.seq, timeline=name(t), kind=e.kind, label=e.label,
                                  peer=name(e.peer) if e.peer is not None else "", edge=e.edge)
                     for e, t in items)
