"""Captured graphs: capture, replay (per op or merged), stale inputs (RC006, stale-tolerant
bytes read as indices) and outputs overwritten by a later replay (RC007)."""
from __future__ import annotations

from bisect import bisect_left, bisect_right

from racecheck.core.checker.naming import _fmt_stack
from racecheck.core.checker.state import (CLOCK, GRAPH, SEQ, TL, _Ctx, _Graph, _GraphInput, _new,
                                          _Replay, _StaleIndex)
from racecheck.core.findings import Access, Race, describe
from racecheck.core.replay import RECIPES_KEPT, ReplayPlan, simulate, stable_form
from racecheck.core.shadow import iv_add, iv_intersect, iv_normalize, iv_subtract, iv_union


class Graphs:
    """A graph's captured ops and inputs; each replay is one epoch of its stream."""

    def _on_capture(self, ev, seq):
        h = self._host(ev.thread)
        g = ev.graph
        old = self._graphs.get(g)
        if old is not None:
            for st, inp in old.inputs.items():
                lst = self._readers.get(st)
                if lst:
                    lst[:] = [(g2, x) for g2, x in lst if x is not inp]
        gr = _Graph(g, list(ev.ops), seq)
        # Bytes an earlier captured op writes are the graph's own product in every replay, not
        # an input the host must refresh (a runner that stages its inputs inside the graph). A
        # covering write counts too: the bytes it may not write are then not checked.
        made: dict = {}
        for idx, op in enumerate(gr.ops):
            for fp in op.reads:
                if fp.approx:
                    # A covering footprint (e.g. a gather whose rows change per replay) does not
                    # say which elements a replay reads: it cannot show stale padding rows.
                    continue
                ranges = fp.ranges
                own = made.get(fp.storage)
                if own:
                    ranges = iv_subtract(ranges, own)
                    if not ranges:
                        continue
                inp = gr.inputs.get(fp.storage)
                if inp is None:
                    inp = gr.inputs[fp.storage] = _GraphInput(fp.storage)
                for lo, hi in ranges:
                    inp.read = iv_add(inp.read, lo, hi)
                if not inp.ops or inp.ops[-1] != idx:
                    inp.ops.append(idx)
            for fp in op.writes:
                own = made.get(fp.storage, [])
                for lo, hi in fp.ranges:
                    own = iv_add(own, lo, hi)
                made[fp.storage] = own
        for st, inp in gr.inputs.items():
            lst = self._readers.get(st)
            if lst is None:
                lst = self._readers[st] = []
            lst.append((g, inp))
            sh = self._shadow.get(st)
            if sh is not None:
                sh.readers = lst
        self._graphs[g] = gr
        h.ctx.append(_new(_Ctx, (seq, "capture", f"capture graph {g} ({len(gr.ops)} ops)", None, -1)))

    def _on_replay(self, ev, seq):
        s = self._launch(ev)
        if s.frees:
            self._settle_frees(s, ev)
        vc = s.vc
        tid = s.tid
        c = vc[tid] + 1
        vc[tid] = c
        g = ev.graph
        s.ctx.append(_new(_Ctx, (seq, "replay", f"replay graph {g}", None, -1)))
        gr = self._graphs.get(g)
        if gr is None:
            return
        if gr.inputs:
            self._check_rc006(gr, ev, seq, s)
        plan = gr.plan
        if plan is None:
            plan = gr.plan = ReplayPlan(gr.ops)
        if not (self.merge_replays and plan.accesses >= self.merge_min_accesses * plan.intervals
                and self._replay_merged(gr, plan, tid, c, seq, ev, vc)):
            self._replay_ops(gr.ops, tid, c, seq, ev, g, vc)
        gr.nreplays += 1
        if gr.first_replay is None:
            gr.first_replay = seq
        gr.last_replay = _new(_Replay, (seq, tid, ev))

    def _replay_ops(self, ops, tid, c, seq, ev, g, vc):
        """The per-op update of a replay: each captured op's accesses, in capture order."""
        for cop in ops:
            rec = (tid, c, seq, ev, cop, False, g)
            if cop.reads:
                self._read(cop.reads, rec, vc)
            if cop.writes:
                self._write(cop.writes, rec, vc, g)

    def _replay_merged(self, gr, plan, tid, c, seq, ev, vc) -> bool:
        """The replay merged into shadow memory in one step per interval of its footprint
        (racecheck.core.replay), when the per-op update could note nothing; False (nothing changed)
        when it could: the caller then runs the per-op update."""
        shadows = self._shadow
        vcget = vc.get
        graphs = self._graphs
        todo = []
        for sp in plan.storages:
            sh = shadows.get(sp.storage)
            if sh is None:
                bounds = states = ()
            else:
                bounds, states = sh.bounds, sh.states
            nst = len(states)
            born = sp.born
            if born is not None and sp.written and gr.first_replay is not None \
                    and seq >= born[0] and gr.first_replay < born[1]:
                return False         # a read of a view after the graph's own write: RC007 candidate
            for iv in sp.intervals:
                lo = iv.lo
                k0 = bisect_left(bounds, lo)
                st_ = iv.stable
                if st_ is not None and bounds[k0:k0 + len(st_[0])] == st_[0]:
                    # the structure the last replay left (segment for segment, in place)
                    pre = states[k0:k0 + len(st_[1])]
                    if None in pre:
                        st_ = None
                else:
                    st_ = None
                if st_ is None:
                    hi = iv.hi
                    k1 = bisect_right(bounds, hi)
                    pre = []
                    if k0 >= len(bounds) or bounds[k0] != lo:
                        pre.append(states[k0 - 1] if 0 < k0 <= nst else None)
                    for m in range(k0, k1):
                        if bounds[m] < hi:
                            pre.append(states[m] if m < nst else None)
                for st in pre:
                    if st is None:
                        continue
                    w = st[0]
                    if w is not None:
                        if w[CLOCK] > vcget(w[TL], 0):
                            return False
                        if born is not None and w[GRAPH] is not None and w[SEQ] >= born[0]:
                            g2 = graphs.get(w[GRAPH])
                            if g2 is not None and g2.first_replay is not None \
                                    and g2.first_replay < born[1]:
                                return False
                    if iv.has_write:
                        for r in st[1].values():
                            if r[CLOCK] > vcget(r[TL], 0):
                                return False
                if st_ is not None:
                    todo.append((iv, None, st_[1], pre))
                    continue
                key = (tuple(bounds[k0:k1]), tuple([st is None for st in pre]))
                recipe = iv.recipes.get(key)
                if recipe is None:
                    if len(iv.recipes) >= RECIPES_KEPT:
                        iv.recipes.clear()
                        iv.stables.clear()
                    recipe = iv.recipes[key] = simulate(iv, key[0], key[1])
                todo.append((iv, recipe, key, None))
        # nothing can be noted: apply
        g = gr.gid
        ops = gr.ops
        recs = [None] * plan.nops
        it = iter(todo)
        for sp in plan.storages:
            sh = shadows.get(sp.storage)
            if sh is None:
                sh = self._new_shadow(sp.storage)
            states = sh.states
            for _ in sp.intervals:
                iv, recipe, cells, pre = next(it)
                if recipe is None:
                    # in place, as the per-op update does it: each segment keeps its own reads
                    for st, (wk, wv, rp, rop) in zip(pre, cells):
                        if wk == 2:
                            w = recs[wv]
                            if w is None:
                                w = recs[wv] = (tid, c, seq, ev, ops[wv], False, g)
                            st[0] = w
                        d = st[1]
                        if rp < 0 and d:
                            d.clear()
                        if rop >= 0:
                            r = recs[rop]
                            if r is None:
                                r = recs[rop] = (tid, c, seq, ev, ops[rop], False, g)
                            d[tid] = r
                    continue
                key = cells
                inner, cells = recipe
                i, j = sh.span(iv.lo, iv.hi)
                pre = states[i:j]
                new = []
                for cell in cells:
                    if cell is None:
                        new.append(None)
                        continue
                    wk, wv, rp, rop = cell
                    if wk == 2:
                        w = recs[wv]
                        if w is None:
                            w = recs[wv] = (tid, c, seq, ev, ops[wv], False, g)
                    elif wk == 1:
                        w = pre[wv][0]
                    else:
                        w = None
                    d = dict(pre[rp][1]) if rp >= 0 else {}
                    if rop >= 0:
                        r = recs[rop]
                        if r is None:
                            r = recs[rop] = (tid, c, seq, ev, ops[rop], False, g)
                        d[tid] = r
                    new.append([w, d])
                sh.bounds[i + 1:j] = inner
                states[i:j] = new
                # the next replay finds this structure if nothing else touched these bytes
                stable = iv.stables.get(key, False)
                if stable is False:
                    stable = iv.stables[key] = stable_form(iv, recipe)
                iv.stable = stable
            rd = sh.readers
            if rd and sp.written:
                for g2, inp in rd:
                    if g2 != g:
                        for lo, hi in sp.written:
                            inp.fresh = iv_add(inp.fresh, lo, hi)
        return True

    def _check_rc006(self, gr, ev, seq, s):
        for st, inp in gr.inputs.items():
            if not inp.fresh:
                continue
            fresh = iv_intersect(inp.fresh, inp.read)
            if fresh and gr.nreplays > 0:
                stale = iv_subtract(iv_intersect(inp.read, inp.ever), fresh)
                tol = self._tolerant.get(st) if stale and self._tolerant else None
                if tol:
                    self._stale_indices(gr, inp, iv_intersect(stale, tol), fresh, ev, seq, s)
                    stale = iv_subtract(stale, tol)
                if stale:
                    self.finding_set.add(describe(self._report_rc006(gr, inp, stale, fresh, ev, seq, s)))
            inp.ever = iv_union(inp.ever, fresh)
            inp.fresh = []

    def _on_stale_tolerant(self, ev, seq):
        self._host(ev.thread)
        self._tolerant[ev.storage] = iv_add(self._tolerant.get(ev.storage, []), ev.lo, ev.hi)

    def _stale_indices(self, gr, inp, stale, fresh, ev, seq, s):
        """Stale declared-tolerant bytes are harmless data, unless a captured op reads them as
        indices into memory the run mutates: RC006 then, whether the write into that memory
        comes before this replay or after it (decided when findings are read)."""
        st = inp.storage
        for idx in inp.ops:
            for fp in gr.ops[idx].reads:
                into = fp.index_into
                if fp.storage != st or into is None:
                    continue
                used = iv_intersect(iv_normalize(fp.ranges), stale)
                if not used:
                    continue
                f = describe(self._report_rc006(
                    gr, inp, used, fresh, ev, seq, s, reader=gr.ops[idx],
                    index_use=(gr.ops[idx].op, self._storage_label(into))))
                hz = _StaleIndex(into, gr.captured, f)
                if self._mutated_since(into, gr.captured):
                    self.finding_set.add(f)
                elif f.signature not in self._stale_seen:
                    self._stale_seen.add(f.signature)
                    self._stale_open.append(hz)

    def _settle_stale_indices(self, blk):
        """`blk` dies: its write history goes, so stale indices into it are judged now."""
        keep = []
        for hz in self._stale_open:
            if hz.into != blk:
                keep.append(hz)
            elif self._mutated_since(blk, hz.captured):
                self.finding_set.add(hz.finding)
        self._stale_open = keep

    def _mutated_since(self, storage, seq) -> bool:
        sh = self._shadow.get(storage)
        if sh is None:
            return False
        for st in sh.states:
            if st is not None and st[0] is not None and st[0][SEQ] > seq:
                return True
        return False

    def _storage_label(self, storage) -> str:
        nm = self._name_for(storage, 0, 1 << 62)
        return f"`{nm.name}`" if nm is not None else f"storage #{storage}"

    def _report_rc006(self, gr, inp, stale, fresh, ev, seq, s, reader=None, index_use=()):
        g = gr.gid
        st = inp.storage
        # the captured op reading the stale bytes
        cop = reader or gr.ops[inp.ops[0]]
        for idx in (() if reader is not None else inp.ops):
            op = gr.ops[idx]
            if any(iv_intersect(iv_normalize([r for fp in op.reads if fp.storage == st
                                              for r in fp.ranges]), stale)):
                cop = op
                break
        cur = self._access((s.tid, 0, seq, ev, cop, False, g), "read")
        prev = None
        prev_tid = s.tid
        prev_seq = gr.last_replay.seq if gr.last_replay else seq
        sh = self._shadow.get(st)
        if sh is not None:
            k = sh.find(stale[0][0])
            if k >= 0 and sh.states[k] is not None:
                w = sh.states[k][0]
                if w is not None and w[GRAPH] != g:
                    prev = self._access(w, "write")
                    prev_tid, prev_seq = w[TL], w[SEQ]
        if prev is None and gr.last_replay is not None:
            lseq, ltid, lev = gr.last_replay      # a _Replay
            loc, fn, frames = _fmt_stack(lev.stack)
            prev = Access(op=f"replay of graph {g}", stream=self.timeline_name(ltid),
                          kind="replay", location=loc, function=fn, stack=frames, seq=lseq)
            prev_tid, prev_seq = ltid, lseq
        place, nm = self._describe(st, stale, self.settled is None
                                   or not self.settled("RC006", cur, prev))
        return Race("RC006", place, cur, prev, context=self._context((prev_tid, s.tid), prev_seq, seq),
                    approx=self._fp_approx_in(cop, st) or "", graph=g,
                    fresh=self._units(fresh, nm, st), index_use=index_use)

    def _check_rc007(self, w, cur, fp, sh, lo, hi):
        # born is the trace index the next event had when the view was created (the session's
        # position): a replay with seq >= born ran after the view was taken, one with seq < born
        # before it.
        born = fp.born
        if w[SEQ] < born:
            return
        gr = self._graphs.get(w[GRAPH])
        if gr is None or gr.first_replay is None or gr.first_replay >= born:
            return
        self._note("RC007", ("rc007", id(w), sh.storage), w, cur, True, False, fp, sh, lo, hi)

    def _report_rc007(self, w, cur, fp, storage, ranges):
        place, _nm = self._describe(storage, ranges)
        race = Race("RC007", place, self._access(cur, "read"), self._access(w, "write"),
                    context=self._context((w[TL], cur[TL]), w[SEQ], cur[SEQ]),
                    approx=fp.approx or "", graph=w[GRAPH], overwritten_at=w[SEQ], born=fp.born)
        self.finding_set.add(describe(race))
