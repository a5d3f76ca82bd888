"""The checker, run by the C engine (racecheck/core/_engine.c) for as long as the trace is clean.

`FastChecker` has `Checker`'s public interface. Events go to the engine, which keeps the
checker's state (clocks, context windows, shadow memory, records, allocations, graphs) in C
structures and handles every event that cannot lead to a finding. At the first event that could
(a race, an RC005 hazard coming due, stale graph input that is not declared stale-tolerant or
is read as indices, an RC007 candidate) or that the engine does not model, it stops before
touching its state and exports that state into a Python `Checker`. Findings therefore always
come from the reference code; a clean run never leaves C.

Most of a real engine's trace comes after its first finding: sglang as shipped has triaged
start-up races, and its whole steady state would otherwise run in Python. So where the engine
stopped on an access that races (a kernel, copy or host access whose checks would note
something, or a replay with stale input or racing captured ops), the Python checker judges that
one event, and the engine then applies the event's update itself (the handlers' updates do not
depend on what they note) and goes on: a resume. The Python checker keeps its findings between
resumes, and its copy of the state is dropped; the engine keeps each storage's notes
(`StorageShadow.seen`) and passes a race noted there before. Stale indices the Python checker
holds open (`_stale_open`) stay with it: the engine stops at a Free of the memory they index
(where the Python settles them), and reading findings judges them on an export. The engine hands
over for good at anything else (an RC005 hazard come due, an event it does not model), and after
RESUMES resumes: a trace that races that often is cheaper in Python than exported again and
again. The count is of events, so the same trace hands over at the same place whatever the
timing.

An RC005 hazard (a free while another stream's access is unordered) is not a finding yet, and in
real engines most of them close (the allocation stream catches up before it reuses the block).
The engine keeps them: the Python checker's own `_rc005_hazards` builds each one, with its
finding text, on a checker given the engine's timelines at the free (`_open_hazards`), and the
engine hands over only when its allocation stream issues work before catching up. Findings read
while one is open are the reference's on an export (as if the trace ended there).

The state the engine exports is declared in racecheck.core.checker.state (FIELDS: each
attribute of a Checker, and whether the export rebuilds it): the handover makes a Checker
without those fields, lets the engine set them, and fails if one is missing.

`new_checker()` is the factory the recorder and `racecheck check` use: a FastChecker where the
engine was built and the C path is on (`racecheck.core.native.checker_engine()`), else the
Python Checker.
"""
from __future__ import annotations

import itertools

from racecheck.core import native, trace
from racecheck.core.checker import Checker, state
from racecheck.core.shadow import iv_add

__all__ = ["FastChecker", "new_checker"]


def _kit() -> dict:
    """The classes the engine reads events through and builds the Python state from."""
    kit = {name: cls for name, cls in vars(trace).items()
           if isinstance(cls, type) and issubclass(cls, trace.Event) and cls is not trace.Event}
    kit.update(state.CLASSES)
    kit.update(Footprint=trace.Footprint, CapturedOp=trace.CapturedOp, Checker=Checker,
               open_hazards=_open_hazards, iv_add=iv_add)
    return kit


def _open_hazards(view: Checker, namer, ev, seq, h_tid, blk, a_tid, items, names, site) -> list:
    """The RC005 hazards a free opens, made by the reference code on `view` (a Checker holding
    the engine's timelines at the free; `names` and `site`, the freed block's, or None)."""
    view.namer = namer
    if names is not None:
        view._names = {blk: names}
    if site is not None:
        view._sites = {blk: site}
    return view._rc005_hazards(ev, seq, h_tid, blk, a_tid, items)


def _passed_on(name: str) -> property:
    """A caller's setting of the Python checker (state.CONFIG): kept here while the engine runs,
    given to the Python checker at the handover, and to it directly after."""
    private = "_" + name

    def get(self):
        return getattr(self, private)

    def put(self, value) -> None:
        setattr(self, private, value)
        for checker in (self._py, self._judge):
            if checker is not None:
                setattr(checker, name, value)
    return property(get, put)


# Races the Python checker judges alone before it takes the trace over for good
RESUMES = 64


class FastChecker:
    """Checker's interface; the C engine until an event that could make a finding that the
    Python checker cannot judge alone (or RESUMES of them)."""

    def __init__(self, context_window: int = 64, engine=None):
        self.context_window = int(context_window)
        module = engine or native.checker_engine()
        self._engine = module.Engine(self.context_window, _kit())
        self._py: Checker | None = None
        self._judge: Checker | None = None      # judges the races the engine resumes after
        self._namer = None
        self._settled = None
        self.resumed = 0                # races the Python judged, the engine applying them
        self.resumed_on = None          # the first of them ("Kernel index_put_", ...)
        self.handed_over_at = None      # events the engine handled before the Python took over
        self.handed_over_on = None      # the event it stopped at ("Kernel add_", ...)

    namer = _passed_on("namer")
    settled = _passed_on("settled")

    @property
    def handed_over(self) -> bool:
        """The Python checker has taken over (a finding was possible at some event)."""
        return self._py is not None

    def python_checker(self) -> Checker:
        """The reference checker, with this state (hands over now if the engine still runs)."""
        return self._py if self._py is not None else self._handover()

    def _exported(self, storages=None) -> Checker:
        """A Python checker with the engine's state now (and the findings judged so far); with
        `storages`, the shadow memory of those only."""
        py = self._judge
        if py is None:
            py = Checker.awaiting_export(self.context_window)
            py.namer, py.settled = self._namer, self._settled
        self._engine.export(py, storages)
        missing = state.not_exported(py)
        if missing:
            raise RuntimeError(f"the checker's engine did not export {', '.join(missing)}")
        return py

    def _handover(self) -> Checker:
        self.handed_over_at = self._engine.events_processed
        self._py = self._exported()
        self._judge = self._engine = None
        return self._py

    def _resume(self, stop) -> bool:
        """The Python checker judges the race the engine stopped at, and the engine applies it:
        True. False (nothing done) where the engine cannot go on after `stop`."""
        if self._engine.raced is not stop or self.resumed >= RESUMES:
            return False
        py = self._judge = self._exported(_touched(stop))
        try:
            py.process(stop)
        except BaseException:
            # the reference raised (a namer's error, a bug): it takes the trace over from the
            # next event, this one counted and its update made, as where its handler got past
            # the update
            at = self._engine.events_processed
            try:
                self._engine.apply(stop, self._namer)
                self._engine.keep_seen(py)
            finally:
                self._handover()
                self.handed_over_at, self.handed_over_on = at, _named(stop)
            raise
        self._engine.apply(stop, self._namer)
        self._engine.keep_seen(py)
        self._engine.watch_frees([hz.into for hz in py._stale_open])
        self.resumed += 1
        _dormant(py)
        return True

    def process(self, event) -> None:
        self.process_all((event,))

    def process_all(self, events) -> "FastChecker":
        if self._py is not None:
            self._py.process_all(events)
            return self
        it = iter(events)
        while True:
            stop = self._engine.process_all(it, self._namer)
            if stop is None:
                return self
            if self._resume(stop):
                self.resumed_on = self.resumed_on or _named(stop)
                continue
            self.handed_over_on = _named(stop)
            self._handover().process_all(itertools.chain((stop,), it))
            return self

    @property
    def findings(self) -> list:
        """As the Python checker's: open RC005 hazards and stale indices are judged as if the
        trace ended here, by the reference code on an export; the engine goes on after."""
        if self._py is not None:
            return self._py.findings
        judge = self._judge
        if not self._engine.hazards_open() and (judge is None or not judge._stale_open):
            return judge.findings if judge is not None else []
        judge = self._judge = self._exported()
        try:
            return judge.findings
        finally:
            _dormant(judge)

    @property
    def events_processed(self) -> int:
        return self._py.events_processed if self._py is not None else self._engine.events_processed

    def timeline_name(self, tid) -> str:
        if self._py is not None:
            return self._py.timeline_name(tid)
        return self._engine.timeline_name(tid)

    def engine_path(self) -> dict:
        """How far the C engine went: races the Python checker judged alone, and where it took
        the trace over for good (None: it never did)."""
        return {"resumed": self.resumed, "handed_over_at": self.handed_over_at,
                "handed_over_on": self.handed_over_on}

    def stats(self) -> dict:
        if self._py is not None:
            return self._py.stats()
        out = self._engine.stats()
        if self._judge is not None:
            out["findings"] = len(self._judge.finding_set)
        return out


def _named(ev) -> str:
    op = getattr(ev, "op", None)
    return type(ev).__name__ + (f" {op}" if op else "")


def _touched(ev):
    """The storages whose shadow memory the Python handler of `ev` (an event the engine stopped
    at on a race) reads, or None for all of them (a replay reads its graph's and what its
    stale indices point into)."""
    t = type(ev)
    if t is trace.Kernel or t is trace.HostAccess:
        return {fp.storage for fp in ev.reads} | {fp.storage for fp in ev.writes}
    if t is trace.Copy:
        return {ev.src.storage, ev.dst.storage}
    if t is trace.Free:
        return {ev.block}
    return None


def _dormant(checker: Checker) -> None:
    """Drop `checker`'s copy of the engine's state (the engine goes on with its own), keeping
    its findings and the stale indices it holds open (RC005 hazards stay with the engine)."""
    for f in state.EXPORTED:
        delattr(checker, f.name)
    checker._frees_open = []


def _methods() -> dict:
    """Checker's methods as its classes resolve them now (its concerns are mixed in)."""
    found = {}
    for cls in reversed(Checker.__mro__):
        found.update((name, fn) for name, fn in vars(cls).items() if callable(fn))
    return found


# Checker's methods as this module found them: the engine ports these
_REFERENCE = _methods()


def _python_changed() -> bool:
    """A test or a plugin replaced one of Checker's methods (on Checker or on the class of one
    of its concerns): the engine no longer ports it."""
    return _methods() != _REFERENCE


def new_checker(context_window: int = 64):
    """The fastest checker built here: FastChecker, or the Python Checker without the engine
    (or with a method of it replaced, which the Python checker then runs)."""
    if native.checker_engine() is not None and not _python_changed():
        return FastChecker(context_window)
    return Checker(context_window)
