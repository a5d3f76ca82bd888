"""Timelines (host threads and streams), their vector clocks and the launch edge."""
from __future__ import annotations

from racecheck.core.checker.state import _Timeline
from racecheck.core.clocks import join


def _join_launch(s, h) -> None:
    """The launch edge: stream `s` joins host `h`'s clock (callers test that it changed)."""
    join(s.vc, h.vc)
    s.jh = h
    s.jv = h.ver


class Timelines:
    """A timeline per host thread and per stream, made on first sight (see the model in
    racecheck.core.checker)."""

    def _new_host(self, tid) -> _Timeline:
        main = self._main
        vc = dict(main.vc) if main is not None else {}
        vc.setdefault(tid, 0)
        tl = _Timeline(tid, True, vc, self.context_window)
        self._tl[tid] = tl
        if main is None:
            self._main = tl
        return tl

    def _new_stream(self, tid) -> _Timeline:
        tl = _Timeline(tid, False, {tid: 0}, self.context_window)
        self._tl[tid] = tl
        self._streams.append(tl)
        return tl

    def _host(self, tid) -> _Timeline:
        tl = self._tl.get(tid)
        return tl if tl is not None else self._new_host(tid)

    def _stream(self, tid) -> _Timeline:
        tl = self._tl.get(tid)
        return tl if tl is not None else self._new_stream(tid)

    def _launch(self, ev) -> _Timeline:
        """Host timeline of ev; ev.stream's timeline joined with it (the launch edge)."""
        tls = self._tl
        h = tls.get(ev.thread)
        if h is None:
            h = self._new_host(ev.thread)
        s = tls.get(ev.stream)
        if s is None:
            s = self._new_stream(ev.stream)
        if s.jh is not h or s.jv != h.ver:
            _join_launch(s, h)
        return s

    def timeline_name(self, tid) -> str:
        tl = self._tl.get(tid)
        if tl is not None:
            if tl.name:
                return tl.name
            return f"host {tid}" if tl.is_host else f"stream {tid}"
        return f"stream {tid}"
