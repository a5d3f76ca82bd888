"""`racecheck.session(...)`: instrumentation + trace + online checker for one block of code.

A session puts three parts together: a recorder (ids, ordered event queue, the checker behind it;
racecheck.core.recorder), a backend for the device kind (racecheck.instrumentation), and the dispatch
mode that turns ops into events. It never raises on a race: findings are collected, deduplicated
and read from `rc.findings` afterwards. A bug inside racecheck turns checking off and is kept in
`rc.internal_errors`; the program runs on unchanged.
"""
from __future__ import annotations

import threading

from racecheck.core.devices import DEVICES
from racecheck.core.errors import UsageError
from racecheck.core.recorder import Recorder
from racecheck.core.trace import NameTensor, NameTimeline, StaleTolerant

_active = None
_active_lock = threading.Lock()


def active_session():
    return _active


class Session:
    def __init__(self, device: str = "sim", *, executor=None, record_trace: bool = False,
                 before_launch=None, delay_plan=None, device_module=None, route_cuda=None,
                 check: bool = True, known_races=None, **backend_options):
        if device not in DEVICES:
            raise UsageError(f"unknown device {device!r} (choose from {', '.join(DEVICES)})")
        if route_cuda and device != "sim":
            raise UsageError("route_cuda=True stands in for torch.cuda on the sim backend only")
        self.device = device
        self.recorder = Recorder(record_trace=record_trace, check=check)
        if known_races:
            # the caller sets these races apart (`filter_findings` with the same entries):
            # those it can tell by rule and code site are made without the program's names
            from racecheck.core.suppressions import settled_by
            self.recorder.set_settled(settled_by(known_races))
        self._executor = executor
        self._before_launch = before_launch
        self.delay_plan = delay_plan
        self.route_cuda = bool(route_cuda)
        self._device_module_override = device_module
        self._backend_options = backend_options
        self._undo: list = []
        self.backend = None

    # -- results --------------------------------------------------------------------------------
    @property
    def checking(self) -> bool:
        return self.recorder.checking

    @property
    def checker(self):
        """The online checker, once every event emitted so far has reached it."""
        return self.recorder.checker

    @property
    def trace(self):
        """The recorded Trace (record_trace=True), else None."""
        return self.recorder.trace

    @property
    def internal_errors(self) -> list:
        return self.recorder.internal_errors

    @property
    def findings(self) -> list:
        return list(self.recorder.checker.findings)

    def internal_error(self, exc: BaseException, where: str = "") -> None:
        self.recorder.internal_error(exc, where)

    def timeline_name(self, tid: int) -> str:
        return self.recorder.timeline_name(tid)

    # -- instrumentation ------------------------------------------------------------------------
    @property
    def device_module(self):
        return self.backend.module

    @property
    def footprints(self):
        return self.backend.footprints

    @property
    def sync_sites(self):
        """The synchronization sites the program ran (instrumentation.sites.SyncSites)."""
        return self.backend.sites

    @property
    def coverage(self) -> dict:
        """Launches that ran unclassified (undeclared extension ops): see instrumentation.kernels."""
        return self.backend.kernels.coverage.to_json() if self.backend is not None else {}

    @property
    def before_launch(self):
        return self.backend.before_launch if self.backend is not None else self._before_launch

    # -- user API -------------------------------------------------------------------------------
    def name(self, t, name: str) -> None:
        import torch
        if not isinstance(t, torch.Tensor) or t.numel() == 0:
            return
        fp = self.backend.footprints.of(t)
        lo = min(r[0] for r in fp.ranges)
        hi = max(r[1] for r in fp.ranges)
        row_bytes = t.stride(0) * t.element_size() if t.dim() > 1 else t.element_size()
        r = self.recorder
        r.emit(NameTensor(r.thread_tid(), fp.storage, lo, hi, str(name), row_bytes,
                          t.element_size(), ()))

    def stale_tolerant(self, t) -> None:
        """Declare `t`'s bytes (a graph's per-replay input) stale-tolerant: see racecheck.stale_tolerant."""
        import torch
        if not isinstance(t, torch.Tensor) or t.numel() == 0:
            return
        fp = self.backend.footprints.of(t)
        r = self.recorder
        r.emit(StaleTolerant(r.thread_tid(), fp.storage, min(x[0] for x in fp.ranges),
                             max(x[1] for x in fp.ranges), ()))

    def name_stream(self, stream, name: str) -> None:
        tid = self.backend.stream_of(stream)
        if tid is None:
            raise UsageError(f"{stream!r} is not a stream of this racecheck session")
        r = self.recorder
        r.emit(NameTimeline(r.thread_tid(), tid, str(name), False, None))
        self.backend.executor.stream_named(tid, str(name))

    def save_trace(self, path) -> None:
        trace = self.trace
        if trace is None:
            raise UsageError("the session was not started with record_trace=True")
        trace.save(path)

    # -- lifetime -------------------------------------------------------------------------------
    def __enter__(self):
        global _active
        with _active_lock:
            if _active is not None:
                raise RuntimeError("a racecheck session is already active")
            _active = self
        try:
            from racecheck.instrumentation import make_backend
            b = self.backend = make_backend(self.recorder, self.device, executor=self._executor,
                                            device_module=self._device_module_override,
                                            **self._backend_options)
            b.before_launch = self._before_launch
            if self.delay_plan is not None:   # delays before chosen launches, on every backend
                from racecheck.instrumentation.delays import DelayPlan
                b.before_launch = DelayPlan.parse(self.delay_plan).hook(b, chain=b.before_launch)
            self.recorder.thread_tid()
            self._install()
        except BaseException:
            self._uninstall()
            with _active_lock:
                _active = None
            raise
        return self

    def __exit__(self, exc_type, exc, tb):
        global _active
        try:
            try:
                self.backend.finish()
                self.recorder.flush_pending(force=True)
            except Exception as e:
                self.recorder.internal_error(e, "while finishing queued work")
            self._uninstall()
            self.recorder.close()
        finally:
            with _active_lock:
                _active = None
        return False

    def _install(self) -> None:
        from racecheck.instrumentation import install_session
        self._undo = install_session(self.backend, route_cuda=self.route_cuda)

    def _uninstall(self) -> None:
        undo, self._undo = self._undo, []
        for step in reversed(undo):
            step()


def route_cuda_default(device: str) -> bool:
    """Whether programs run by `racecheck exec`, the start-up hook and `pytest --racecheck` get
    torch.cuda routing: on sim unless RACECHECK_ROUTE_CUDA is 0/off/false."""
    import os
    off = os.environ.get("RACECHECK_ROUTE_CUDA", "").strip().lower() in ("0", "off", "false", "no")
    return device == "sim" and not off


def session(device: str = "sim", **options) -> Session:
    """Context manager: `with racecheck.session(device="sim") as rc: ...; rc.findings`."""
    return Session(device, **options)
