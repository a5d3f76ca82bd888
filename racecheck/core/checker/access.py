"""Device work and host accesses, and the hot path: shadow memory reads and writes
(RC001-RC004 are noted here, RC007 candidates handed to the graphs' check)."""
from __future__ import annotations

from bisect import bisect_left

from racecheck.core.checker.state import CLOCK, GRAPH, TL, _Ctx, _new
from racecheck.core.checker.timelines import _join_launch
from racecheck.core.clocks import join
from racecheck.core.shadow import StorageShadow, iv_add


class Accesses:
    """Kernels, copies and host accesses: an epoch of their timeline, then their footprints
    checked against and merged into per-storage shadow memory."""

    def _on_kernel(self, ev, seq):
        tls = self._tl
        h = tls.get(ev.thread)
        if h is None:
            h = self._new_host(ev.thread)
        s = tls.get(ev.stream)
        if s is None:
            s = self._new_stream(ev.stream)
        if s.jh is not h or s.jv != h.ver:
            _join_launch(s, h)
        vc = s.vc
        tid = s.tid
        c = vc[tid] + 1
        vc[tid] = c
        if s.frees:
            self._settle_frees(s, ev)
        rec = (tid, c, seq, ev, None, False, None)
        s.ctx.append(rec)      # a kernel's context entry is its record (see _ctx_entry)
        if ev.reads:
            self._read(ev.reads, rec, vc)
        if ev.writes:
            self._write(ev.writes, rec, vc, None)

    def _on_copy(self, ev, seq):
        s = self._launch(ev)
        if s.frees:
            self._settle_frees(s, ev)
        vc = s.vc
        tid = s.tid
        c = vc[tid] + 1
        vc[tid] = c
        src, dst = ev.src, ev.dst
        direction = ("H2H" if dst.host else "H2D") if src.host else ("D2H" if dst.host else "D2D")
        s.ctx.append(_new(_Ctx, (seq, "copy", f"{ev.op} {direction}", None, -1)))
        rec = (tid, c, seq, ev, None, False, None)
        self._read((src,), rec, vc)
        self._write((dst,), rec, vc, None)
        if not ev.non_blocking and (src.host or dst.host):
            h = self._tl[ev.thread]
            join(h.vc, vc)
            h.ver += 1
            h.ctx.append(_new(_Ctx, (seq, "sync", f"blocking {ev.op} {direction}", tid, seq)))

    def _on_host_access(self, ev, seq):
        h = self._host(ev.thread)
        vc = h.vc
        tid = h.tid
        c = vc.get(tid, 0) + 1
        vc[tid] = c
        h.ver += 1
        h.ctx.append(_new(_Ctx, (seq, "host", ev.op, None, -1)))
        rec = (tid, c, seq, ev, None, True, None)
        if ev.reads:
            self._read(ev.reads, rec, vc)
        if ev.writes:
            self._write(ev.writes, rec, vc, None)

    def _new_shadow(self, storage) -> StorageShadow:
        sh = StorageShadow(storage, self._readers.get(storage))
        self._shadow[storage] = sh
        return sh

    def _read(self, fps, rec, vc):
        shadows = self._shadow
        vcget = vc.get
        tid = rec[TL]
        for fp in fps:
            sh = shadows.get(fp.storage)
            if sh is None:
                sh = self._new_shadow(fp.storage)
            states = sh.states
            bounds = sh.bounds
            for lo, hi in fp.ranges:
                # fast path: exactly one existing segment (a whole tensor accessed again)
                i = bisect_left(bounds, lo)
                if i + 1 < len(bounds) and bounds[i] == lo and bounds[i + 1] == hi:
                    st = states[i]
                    if st is not None:
                        w = st[0]
                        if w is not None:
                            if w[CLOCK] > vcget(w[TL], 0):
                                self._race(w, rec, True, False, fp, sh, lo, hi)
                            if w[GRAPH] is not None and fp.born is not None:
                                self._check_rc007(w, rec, fp, sh, lo, hi)
                        st[1][tid] = rec
                        continue
                self._read_span(fp, sh, lo, hi, rec, vc)

    def _read_span(self, fp, sh, lo, hi, rec, vc):
        """A read of [lo, hi) that is not one existing segment (shared with the C path)."""
        if lo >= hi:
            return
        vcget = vc.get
        tid = rec[TL]
        states = sh.states
        bounds = sh.bounds
        i, j = sh.span(lo, hi)
        for k in range(i, j):
            st = states[k]
            if st is None:
                states[k] = [None, {tid: rec}]
                continue
            w = st[0]
            if w is not None:
                if w[CLOCK] > vcget(w[TL], 0):
                    self._race(w, rec, True, False, fp, sh, bounds[k], bounds[k + 1])
                if w[GRAPH] is not None and fp.born is not None:
                    self._check_rc007(w, rec, fp, sh, bounds[k], bounds[k + 1])
            st[1][tid] = rec

    def _write(self, fps, rec, vc, graph):
        shadows = self._shadow
        vcget = vc.get
        for fp in fps:
            sh = shadows.get(fp.storage)
            if sh is None:
                sh = self._new_shadow(fp.storage)
            states = sh.states
            bounds = sh.bounds
            rd = sh.readers
            for lo, hi in fp.ranges:
                if lo >= hi:
                    continue
                i = bisect_left(bounds, lo)
                if not bounds:      # a storage's first access (a new temporary)
                    bounds.append(lo)
                    bounds.append(hi)
                    states.append([rec, {}])
                elif i + 1 < len(bounds) and bounds[i] == lo and bounds[i + 1] == hi \
                        and states[i] is not None:
                    # fast path: exactly one existing segment
                    st = states[i]
                    w = st[0]
                    if w is not None and w[CLOCK] > vcget(w[TL], 0):
                        self._race(w, rec, True, True, fp, sh, lo, hi)
                    r = st[1]
                    if r:
                        for pr in r.values():
                            if pr[CLOCK] > vcget(pr[TL], 0):
                                self._race(pr, rec, False, True, fp, sh, lo, hi)
                        r.clear()
                    st[0] = rec
                else:
                    self._write_span(fp, sh, lo, hi, rec, vc)
                if rd:
                    self._fresh_readers(rd, lo, hi, graph)

    def _write_span(self, fp, sh, lo, hi, rec, vc):
        """A write of [lo, hi) (lo < hi) that is not one existing segment (shared with the C path)."""
        vcget = vc.get
        states = sh.states
        bounds = sh.bounds
        i, j = sh.span(lo, hi)
        for k in range(i, j):
            st = states[k]
            if st is None:
                continue
            w = st[0]
            if w is not None and w[CLOCK] > vcget(w[TL], 0):
                self._race(w, rec, True, True, fp, sh, bounds[k], bounds[k + 1])
            r = st[1]
            if r:
                for pr in r.values():
                    if pr[CLOCK] > vcget(pr[TL], 0):
                        self._race(pr, rec, False, True, fp, sh, bounds[k], bounds[k + 1])
        sh.collapse(i, j, [rec, {}])

    @staticmethod
    def _fresh_readers(rd, lo, hi, graph):
        """Bytes a graph reads were written outside it (its inputs' freshness, racecheck.core.replay)."""
        for g, inp in rd:
            if g != graph:
                inp.fresh = iv_add(inp.fresh, lo, hi)
